"""The lexical check: two questions may share an answer only if they say the same *content*.

A general rule, not a list of the pairs it was tried on. English words fall in two classes:

- closed-class words (pronouns, determiners, auxiliaries, wh-words, the words that frame a request:
  "can you tell me", "please", "explain") are a finite, enumerable set; rephrasing adds, drops and
  changes them freely, so they may differ;
- every other word carries content (nouns, verbs, adjectives, adverbs, numbers, names), and so do the
  closed-class words that change what is asked: negations, quantifiers, comparison and direction words,
  prepositions of relation. These must match.

The check passes when the two questions' content words are the same multiset after normalising
inflection (a light suffix stemmer: "spiders" = "spider", "boiling" = "boil"), contractions and
common chat spellings ("u" = "you"). `compare` tells apart the same words in the same order (SAME) from
the same words reordered (REORDERED: a reordered paraphrase or a role reversal, "convert X to Y" vs
"Y to X": only the engine verifier may accept it). Paraphrases that reword content (synonyms: "rain" vs
"raining" passes, "big" vs "large" does not) fail it: that costs hit rate, never a wrong answer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def _words(text: str) -> list[str]:
    return text.split()


_WORD = re.compile(r"\d+(?:[.,]\d+)*|[a-z]+(?:['’][a-z]+)?|[+\-*/^=%<>×÷&]")

# Closed-class words that frame a question without changing what it asks.
FUNCTION_WORDS = frozenset(
    _words(
        """a an the this that these those it its it's i me my mine myself you your yours yourself we us our they
    them their he him his she her one ones someone something anyone anything
    is are was were be been being am do does did done doing have has had having can could would should will
    shall may might must let lets let's
    what which who whom whose when where why how whats what's hows how's wheres where's whos who's whys why's
    and or but so if then than also just really actually basically quickly briefly simply exactly
    please pls plz kindly thanks thank hey hi hello ok okay um uh well yeah yes oh
    tell explain describe give show say help know wondering wonder curious need want like mean means
    to of for in on at by about as with from into
    there here some way ways kind sort type thing things bit little quick short brief"""
    )
)
# Closed-class words that change the question: never free to differ (kept as content).
MEANING_WORDS = frozenset(
    _words(
        """not no never none nothing nobody nowhere neither nor without cannot can't won't don't doesn't didn't
    isn't aren't wasn't weren't shouldn't wouldn't couldn't hasn't haven't hadn't
    all every each any most more less least fewer many much few several both either only
    before after during since until above below under over between against toward towards up down
    first last next previous"""
    )
)
_CHAT = {
    "u": "you", "ur": "your", "r": "are", "y": "why", "pls": "please", "plz": "please", "thx": "thanks",
    "wanna": "want", "gonna": "going", "gotta": "must", "kinda": "kind", "dunno": "know", "whats": "what",
    "hows": "how", "im": "i", "cuz": "because", "bc": "because", "tho": "though", "w/": "with", "abt": "about",
}  # fmt: skip
_NEGATED = re.compile(r"(\w+)n['’]t$")


def stem(word: str) -> str:
    """A light English suffix stemmer: plural, third person, -ing, -ed (inflection only)."""
    if len(word) <= 3 or not word.isalpha():
        return word
    for suffix, repl in (("ies", "y"), ("ied", "y"), ("sses", "ss"), ("xes", "x"), ("ches", "ch"), ("shes", "sh")):
        if word.endswith(suffix) and len(word) > len(suffix) + 2:
            return word[: -len(suffix)] + repl
    if word.endswith("ing") and len(word) > 5:
        base = word[:-3]
        return base[:-1] if len(base) > 2 and base[-1] == base[-2] and base[-1] not in "lsz" else base
    if word.endswith("ed") and len(word) > 4:
        base = word[:-2]
        return base[:-1] if len(base) > 2 and base[-1] == base[-2] and base[-1] not in "lsz" else base
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def _unify(word: str) -> str:
    """Strip a trailing 'e' after stemming so 'make'/'making', 'bake'/'baked' meet."""
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


@dataclass(frozen=True)
class Content:
    words: tuple[str, ...]  # content words, normalised, in order
    negations: int

    @property
    def bag(self) -> tuple[str, ...]:
        return tuple(sorted(self.words))


# Phrases that only frame a request (politeness, hedging, "walk me through"), removed before the words are read.
_FRAMES = re.compile(
    r"\b(?:walk (?:me|us) through|thanks? (?:you )?in advance|sorry to (?:ask|bother you)|excuse me|"
    r"i (?:have|had|got) a (?:quick )?question|quick question|i'?d (?:really )?(?:love|like) to (?:know|learn|ask)|"
    r"i'?d (?:really )?appreciate (?:it|your help|any help)?|i was (?:hoping|wondering)|i'?m (?:curious|wondering)|"
    r"do you (?:happen to )?know|would you mind|if you (?:could|can|don'?t mind)|can i ask|let me know|"
    r"could you (?:please )?(?:tell|show|teach) me|teach me|show me|remind me)\b"
)


def content(text: str) -> Content:
    out: list[str] = []
    negations = 0
    for raw in _WORD.findall(_FRAMES.sub(" ", text.lower().replace("’", "'"))):
        word = _CHAT.get(raw, raw)
        if word.endswith("n't") or word in ("not", "never", "no", "cannot", "without", "nor", "neither"):
            negations += 1
            continue
        if word.endswith("'s"):
            word = word[:-2]
        if word in MEANING_WORDS:
            out.append(word)
            continue
        if word in FUNCTION_WORDS:
            continue
        out.append(_unify(stem(word)))
    return Content(tuple(out), negations)


SAME, REORDERED, DIFFERENT = "same", "reordered", "different"


def compare(query: str, cached: str) -> str:
    """SAME: the same content words in the same order, as many negations; REORDERED: the same words in
    another order (a reordered paraphrase, or a role reversal: only a verifier can tell); DIFFERENT."""
    a, b = content(query), content(cached)
    if a.negations != b.negations or a.bag != b.bag:
        return DIFFERENT
    return SAME if a.words == b.words else REORDERED


def same_content(query: str, cached: str) -> bool:
    return compare(query, cached) == SAME
