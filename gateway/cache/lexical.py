"""The lexical check: two questions may share an answer only if they say the same *content*.

A general rule, not a list of the pairs it was tried on. English words fall in two classes:

- closed-class words (pronouns, determiners, auxiliaries, wh-words, the words that frame a request:
  "can you tell me", "please", "explain") are a finite, enumerable set; rephrasing adds, drops and
  changes them freely, so they may differ;
- every other word carries content (nouns, verbs, adjectives, adverbs, numbers, names), and so do the
  closed-class words that change what is asked: negations, quantifiers, comparison and direction words,
  prepositions of relation. These must match.

The check passes when every content word of one question has a partner in the other: the same word after
normalising inflection (a light suffix stemmer: "spiders" = "spider"), contractions and chat spellings ("u" =
"you"), or, with the WordNet lexicon (gateway/cache/lexicon.py), a synonym, an inflection WordNet knows ("ran" /
"run"), a derivation or a direct hypernym; never an antonym, a word behind a negating prefix or a sibling.
`compare` then reads the roles: each content word carries the preposition right before it. The same order
(SAME), or one phrase moved with its preposition (REORDERED), keeps the roles; words that crossed or changed
preposition (SWAPPED: a role reversal, "convert X to Y" vs "Y to X", or a reordered paraphrase) are left to the
engine verifier. A rewording WordNet cannot relate fails the check: that costs hit rate, not a wrong answer.
"""

from __future__ import annotations

import gc
import re
from dataclasses import dataclass

from gateway.cache.lexicon import Lexicon
from gateway.cache.wordnet import load
from gateway.cache.wordnet_fetch import default_wordnet_path


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
    and or but so if then than also just really actually basically briefly simply exactly
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


# Phrases that only frame a request (politeness, hedging, "walk me through"), removed before the words are read.
_FRAMES = re.compile(
    r"\b(?:walk (?:me|us) through|thanks? (?:you )?in advance|sorry to (?:ask|bother you)|excuse me|"
    r"i (?:have|had|got) a (?:quick )?question|quick question|i'?d (?:really )?(?:love|like) to (?:know|learn|ask)|"
    r"i'?d (?:really )?appreciate (?:it|your help|any help)?|i was (?:hoping|wondering)|i'?m (?:curious|wondering)|"
    r"do you (?:happen to )?know|would you mind|(?:may|can|could) i ask|if you (?:could|can|don'?t mind)|can i ask|let me know|"
    r"could you (?:please )?(?:tell|show|teach) me|teach me|show me|remind me)\b"
)


# Prepositions mark a content word's role ("from X to Y"): a phrase that moves takes its preposition along, a role
# reversal leaves the prepositions where they were and swaps the words. Variants of one relation share a name.
_RELATIONS = {"to": "to", "into": "to", "onto": "on", "toward": "to", "towards": "to", "of": "of", "for": "for",
              "in": "in", "inside": "in", "within": "in", "on": "on", "upon": "on", "at": "at", "by": "by",
              "about": "about", "as": "as", "with": "with", "from": "from", "than": "than", "vs": "vs",
              "versus": "vs", "via": "via", "per": "per", "through": "through", "before": "before", "after": "after",
              "during": "during", "since": "since", "until": "until", "above": "above", "below": "below",
              "under": "under", "over": "over", "between": "between", "against": "against"}  # fmt: skip
# Words between a preposition and its noun that keep the attachment ("in my old car", "of the")
_DETERMINERS = frozenset(_words("a an the my your our their his her its this that these those"))
NEGATIONS = frozenset(("not", "never", "no", "cannot", "without", "nor", "neither"))


@dataclass(frozen=True)
class Word:
    text: str  # lower case, a WordNet collocation joined by "_" ("get_rid_of")
    key: str  # what equal words share: the normalised stem (inflection aside)
    attach: str | None  # the preposition that introduces it, None after a verb, a wh-word...
    fixed: bool  # a number or a closed-class word that changes the question: only the same word stands for it


@dataclass(frozen=True)
class Content:
    words: tuple[Word, ...]  # content words in order
    negations: int

    @property
    def bag(self) -> tuple[str, ...]:
        return tuple(sorted(w.key for w in self.words))


def _tokens(text: str) -> list[str]:
    return [_CHAT.get(raw, raw) for raw in _WORD.findall(_FRAMES.sub(" ", text.lower().replace("’", "'")))]


def content(text: str, lex: Lexicon | None = None) -> Content:
    """The content words of a question, each with the preposition that introduces it, and its negation count."""
    tokens = _tokens(text)
    out: list[Word] = []
    negations = 0
    attach: str | None = None
    i = 0
    while i < len(tokens):
        word = tokens[i]
        i += 1
        if word.endswith("n't") or word in NEGATIONS:
            negations += 1
            continue
        if word.endswith("'s"):
            word = word[:-2]
        if word in _RELATIONS:
            attach = _RELATIONS[word]
            if word not in MEANING_WORDS:
                continue
        if word in MEANING_WORDS or word[:1].isdigit() or not word.isalpha():
            out.append(Word(word, word, attach if word not in _RELATIONS else None, True))
            if word not in _RELATIONS:
                attach = None
            continue
        if word in FUNCTION_WORDS:
            if word not in _DETERMINERS:
                attach = None
            continue
        if lex is not None:  # the longest WordNet collocation starting here ("get rid of", "jet lag", "new york")
            for n in (3, 2):
                if i - 1 + n <= len(tokens) and lex.known("_".join(tokens[i - 1 : i - 1 + n])):
                    word = "_".join(tokens[i - 1 : i - 1 + n])
                    i += n - 1
                    break
        out.append(Word(word, _unify(stem(word)), attach, False))
        attach = None  # only the word right after a preposition (determiners aside) is its object
    return Content(tuple(out), negations)


SAME, REORDERED, SWAPPED, DIFFERENT = "same", "reordered", "swapped", "different"


def _align(a: Content, b: Content, lex: Lexicon | None) -> list[int] | None:
    """For each of b's words, the index of the word of a that stands for it (equal, or explained by the lexicon:
    synonym, inflection, derivation, direct hypernym); None when some content word of either has no partner."""
    if len(a.words) != len(b.words):
        return None
    partner: list[int | None] = [None] * len(b.words)
    free = set(range(len(a.words)))
    for j, w in enumerate(b.words):
        i = next((i for i in sorted(free) if a.words[i].key == w.key), None)
        if i is not None:
            partner[j] = i
            free.discard(i)
    rest = [j for j, p in enumerate(partner) if p is None]
    if rest and lex is None:
        return None

    def fits(i: int, j: int) -> bool:
        x, y = a.words[i], b.words[j]
        return not (x.fixed or y.fixed) and lex is not None and lex.explains(x.text, y.text)

    def augment(j: int, seen: set[int]) -> bool:  # bipartite matching, Kuhn's augmenting paths (a few words)
        for i in range(len(a.words)):
            if i in seen or not fits(i, j):
                continue
            seen.add(i)
            holder = next((k for k in rest if partner[k] == i), None)
            if i in free or (holder is not None and augment(holder, seen)):
                free.discard(i)
                partner[j] = i
                return True
        return False

    for j in rest:
        if not augment(j, set()):
            return None
    return [p for p in partner if p is not None]


def _one_block_moved(order: list[int]) -> bool:
    """`order` is 0..n-1 with one contiguous block moved elsewhere (a phrase moved to the front or the end)."""
    n = len(order)
    ident = list(range(n))
    for i in range(n):
        for j in range(i + 1, n):
            for k in range(j + 1, n + 1):
                if ident[:i] + ident[j:k] + ident[i:j] + ident[k:] == order:
                    return True
    return False


def compare(query: str, cached: str, lex: Lexicon | None = None) -> str:
    """SAME: every content word has a partner (the same word, or with a lexicon a synonym, inflection, derivation or
    direct hypernym), in the same order, with as many negations; REORDERED: the same, but one phrase moved with its
    preposition ("in october, is it rainy in bali" / "is it rainy in bali in october"); SWAPPED: the words cross
    or change preposition, as a role reversal does ("convert X to Y" / "Y to X"; a reordered paraphrase may too:
    only a verifier can tell); DIFFERENT: a content word unexplained, added or dropped, or the negations differ."""
    lex = default_lexicon() if lex is None else lex
    a, b = content(query, lex or None), content(cached, lex or None)
    if a.negations != b.negations:
        return DIFFERENT
    order = _align(a, b, lex or None)
    if order is None:
        return DIFFERENT
    roles_kept = all(
        a.words[i].attach == w.attach or (order == sorted(order) and None in (a.words[i].attach, w.attach))
        for i, w in zip(order, b.words, strict=True)
    )
    if not roles_kept:
        return SWAPPED
    if order == sorted(order):
        return SAME
    return REORDERED if _one_block_moved(order) else SWAPPED


def same_content(query: str, cached: str) -> bool:
    return compare(query, cached) == SAME


_DEFAULT: list[Lexicon | bool] = []


def default_lexicon() -> Lexicon | bool:
    """The lexicon over the fetched WordNet (`python -m gateway.cache.wordnet_fetch`), loaded once; False when the
    database is missing (then only equal words stand for each other: fewer hits, never more)."""
    if not _DEFAULT:
        root = default_wordnet_path()
        _DEFAULT.append(Lexicon(load(root)) if (root / "index.noun").exists() else False)
        gc.collect()  # untracks the index's ~200k tuples now, not in a collection during some request
    return _DEFAULT[0]
