"""Guards against the classic semantic-cache false hits.

Sentence embeddings put "capital of France" next to "capital of Germany", "2+3" next to
"2+4" and "is X safe" next to "is X not safe". A semantic hit therefore also requires that
the query and the cached question agree exactly, in order, on their *key terms*: numbers
(digits and number words), operators, named entities (capitalised words that are not common
sentence words, acronyms, and well-known lowercase place names), and polarity words
(negations, comparatives, directions). Paraphrases keep these; near misses rarely do.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


def _words(text: str) -> list[str]:
    return text.split()


# A number (an ordinal's suffix kept: "3rd"), a word, or an operator symbol; a hyphen or slash between letters
# joins words ("wi-fi", "right-click", "w/o"), it is no operator
_TOKEN = re.compile(
    r"\d+(?:[.,]\d+)*(?:st|nd|rd|th)?\b|\d+(?:[.,]\d+)*|[A-Za-z]+(?:['’][A-Za-z]+)?|[+*^=%<>×÷]"
    r"|(?<![A-Za-z])[-/]|[-/](?![A-Za-z])"
)
_ORDINAL = re.compile(r"(\d+)(?:st|nd|rd|th)")
_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(
        _words(
            "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
            "seventeen eighteen nineteen twenty"
        )
    )
}
_NUMBER_WORDS |= {"thirty": "30", "forty": "40", "fifty": "50", "sixty": "60", "seventy": "70", "eighty": "80",
                  "ninety": "90", "hundred": "100", "thousand": "1000", "million": "1e6", "billion": "1e9",
                  "half": "0.5", "twice": "x2", "double": "x2", "triple": "x3", "first": "#1", "second": "#2",
                  "third": "#3", "fourth": "#4", "fifth": "#5", "last": "#-1", "dozen": "12"}  # fmt: skip
del _NUMBER_WORDS["one"]  # mostly a pronoun ("a good one", "quick one"); "one cup" / "two cups" still differ (2)
# Operator words only count next to a number ("10 divided by 2", "add 5 and 3"): "add speaker notes", "get over
# jet lag" and "power on" name no operation
_OPERATOR_REACH = 2
_OPERATORS = {"+": "+", "plus": "+", "add": "+", "sum": "+", "-": "-", "minus": "-", "subtract": "-",
              "*": "*", "×": "*", "times": "*", "multiplied": "*", "multiply": "*", "product": "*",
              "/": "/", "÷": "/", "divided": "/", "divide": "/", "over": "/", "^": "^", "power": "^",
              "squared": "^2", "cubed": "^3", "%": "%", "percent": "%", "<": "<", ">": ">"}  # fmt: skip
# Words with opposites, each folded onto (scale, pole): two questions with different poles of one scale ask
# opposite things ("hottest" / "coldest", "miles" / "kilometers"); words on different scales ("best" / "longest
# battery life") are left to the lexical check.
_SCALES = {
    "amount": {"more": "more most greater max maximum", "less": "less least fewer fewest min minimum"},
    "size": {"big": "larger largest biggest bigger", "small": "smaller smallest tiniest"},
    "order": {"before": "before", "after": "after"},
    "place": {"above": "above", "below": "below under"},
    "warmth": {"hot": "hot warm hottest hotter warmest", "cold": "cold cool coldest colder coolest"},
    "quality": {"best": "best better", "worst": "worst worse"},
    "height": {"high": "highest higher tallest", "low": "lowest lower"},
    "length": {"long": "longest longer", "short": "shortest shorter"},
    "age": {"old": "oldest older", "young": "youngest younger"},
    "speed": {"fast": "fastest faster", "slow": "slowest slower"},
    "price": {"cheap": "cheapest cheaper", "dear": "expensive"},
    "direction": {"up": "increase raise", "down": "decrease reduce"},
    "compass": {"north": "north", "south": "south", "east": "east", "west": "west"},
    "side": {"left": "left", "right": "right"},
    "truth": {"true": "true", "false": "false"},
    "frequency": {"always": "always", "sometimes": "sometimes", "rarely": "rarely", "often": "often"},
    "phase": {"start": "start begin", "end": "end finish"},
    "trade": {"buy": "buy", "sell": "sell"},
    "word": {"synonym": "synonym synonyms", "antonym": "antonym antonyms opposite"},
    "time": {"d": "day days", "wk": "week weeks", "mo": "month months", "yr": "year years", "h": "hour hours",
             "min": "minute minutes"},
    "temperature": {"C": "celsius", "F": "fahrenheit"},
    "length unit": {"km": "km kilometers kilometres", "mi": "miles mile", "m": "meters metres", "ft": "feet foot",
                    "in": "inches", "cm": "cm centimeters"},
    "mass": {"kg": "kg kilograms", "lb": "pounds lbs"},
    "currency": {"$": "dollars", "€": "euros"},
    "language": {"Python": "python", "JavaScript": "javascript", "Java": "java", "Rust": "rust"},
}  # fmt: skip
_POLARITY = {w: (scale, pole) for scale, poles in _SCALES.items() for pole, ws in poles.items() for w in _words(ws)}
# Capitalised words that start sentences or questions and name nothing.
_COMMON = set(
    _words("""a an the i i'm i'd i've me my you your we our they their it its he she his her this that these those
    what what's who who's whom whose which when where why how is are was were be been am do does did can could
    would should will shall may might must please tell give explain describe list name show write define
    summarize summarise translate find help let let's make compare calculate compute convert suggest recommend
    provide generate create in on at of for to from with by about as and or but if so then there here hey hi
    hello thanks thank ok okay yes any some all every each one quick briefly simply also just now today
    whats hows wheres whos good top why's outline solve sort check identify state rewrite fix implement prove
    estimate predict plan draft spell pronounce rank classify analyze analyse discuss elaborate clarify detail
    teach remind summarize recap say need want know understand use using get go see look""")
)
_PLACES = set(
    _words("""france paris germany berlin italy rome spain madrid japan tokyo china beijing india delhi russia moscow
    canada ottawa brazil mexico egypt cairo australia sydney london england britain uk usa america europe asia
    africa texas california florida york chicago boston seattle ireland dublin portugal lisbon greece athens
    sweden norway denmark finland poland austria vienna switzerland netherlands amsterdam belgium turkey korea
    seoul vietnam thailand argentina chile peru kenya nigeria mars venus jupiter saturn mercury neptune uranus
    pluto earth moon sun""")
)


@dataclass(frozen=True)
class KeyTerms:
    """The parts of a question a paraphrase keeps and a different question changes."""

    sequence: tuple[str, ...]  # numbers and operators, in order ("10 / 2" is not "2 / 10")
    named: tuple[str, ...]  # the names, sorted: their roles are the lexical check's ("England's first king")
    polarity: frozenset[tuple[str, str]]  # (scale, pole) of each polarity word ("warmest" -> warmth, hot)


_SENTENCE_END = frozenset(".!?")
# After "last", these words show it is the verb ("does a cold last for a week"), not the ordinal ("last commit")
_NOT_A_NOUN = frozenset(_words("for in on at after before if when once without with and or longer long than so"))


def names(text: str) -> frozenset[str]:
    """Words that name something: a place on the list, or a capitalised word that is no common sentence word and
    does not start a sentence (where every word is capitalised)."""
    found = set()
    start = True
    for match in _TOKEN.finditer(text):
        word = match.group(0)
        stem = word.lower().split("'")[0].split("’")[0]
        if stem in _PLACES or (word[:1].isupper() and not start and stem not in _COMMON):
            found.add(stem)
        rest = text[match.end() : match.end() + 2].strip()
        start = bool(rest) and rest[0] in _SENTENCE_END
    return frozenset(found)


def key_terms(text: str, named: frozenset[str] = frozenset()) -> KeyTerms:
    """`named`: the words that name something in either question (`names`), however this one capitalises them."""
    tokens = [m.group(0).lower() for m in _TOKEN.finditer(text)]
    numeric = [t[:1].isdigit() or (t in _NUMBER_WORDS and t not in ("first", "second", "last")) for t in tokens]
    terms: list[str] = []
    names_found: list[str] = []
    polarity: set[tuple[str, str]] = set()
    for k, low in enumerate(tokens):
        following = tokens[k + 1] if k + 1 < len(tokens) else ""
        if low == "2" and k and tokens[k - 1] == "how":
            continue  # chat spelling: "how 2 make pancakes"
        if low[:1].isdigit():
            ordinal = _ORDINAL.fullmatch(low)
            terms.append("#" + ordinal.group(1) if ordinal else low.replace(",", ""))
        elif low == "last" and (not following or following in _NOT_A_NOUN):
            continue  # the verb: "how long does a cold last", "last for"
        elif low in _NUMBER_WORDS:
            terms.append(_NUMBER_WORDS[low])
        elif low in _OPERATORS:
            near = numeric[max(k - _OPERATOR_REACH, 0) : k + _OPERATOR_REACH + 1]
            if not low.isalpha() or any(near):
                terms.append(_OPERATORS[low])
        elif low in _POLARITY:
            polarity.add(_POLARITY[low])
        elif (stem := low.split("'")[0].split("’")[0]) in named or (stem[-1:] == "s" and stem[:-1] in named):
            names_found.append(stem if stem in named else stem[:-1])  # "newtons" without its apostrophe
    return KeyTerms(tuple(terms), tuple(sorted(names_found)), frozenset(polarity))


def same_key_terms(query: str, candidate: str) -> bool:
    """True when the numbers, operators and names agree in order, and no polarity word of one is opposed by another
    polarity word of the other ("hottest" / "coldest"). A polarity word on one side only ("how to boost" / "how to
    increase") is left to the lexical check, which relates the two words or rejects them; so are negations."""
    named = names(query) | names(candidate)
    a, b = key_terms(query, named), key_terms(candidate, named)
    opposed = any(s == t and p != q for s, p in a.polarity for t, q in b.polarity if (s, p) not in b.polarity)
    return a.sequence == b.sequence and a.named == b.named and not opposed
