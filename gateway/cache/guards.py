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


_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[A-Za-z]+(?:['’][A-Za-z]+)?|[+\-*/^=%<>×÷]")
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
_OPERATORS = {"+": "+", "plus": "+", "add": "+", "sum": "+", "-": "-", "minus": "-", "subtract": "-",
              "*": "*", "×": "*", "times": "*", "multiplied": "*", "multiply": "*", "product": "*",
              "/": "/", "÷": "/", "divided": "/", "divide": "/", "over": "/", "^": "^", "power": "^",
              "squared": "^2", "cubed": "^3", "%": "%", "percent": "%", "<": "<", ">": ">"}  # fmt: skip
# Opposites and their common synonyms, folded onto one side each; both sides must agree.
_POLARITY = {
    "more": "more", "most": "more", "greater": "more", "larger": "big", "largest": "big", "biggest": "big",
    "bigger": "big", "less": "less", "least": "less", "fewer": "less", "fewest": "less", "smaller": "small",
    "smallest": "small", "tiniest": "small", "before": "before", "after": "after", "above": "above",
    "below": "below", "under": "below", "hot": "hot", "cold": "cold", "warm": "hot", "cool": "cold",
    "best": "best", "worst": "worst", "better": "best", "worse": "worst", "highest": "high", "higher": "high",
    "tallest": "high", "lowest": "low", "lower": "low", "longest": "long", "longer": "long", "shortest": "short",
    "shorter": "short", "oldest": "old", "older": "old", "youngest": "young", "younger": "young",
    "fastest": "fast", "faster": "fast", "slowest": "slow", "slower": "slow", "cheapest": "cheap",
    "cheaper": "cheap", "expensive": "dear", "increase": "up", "raise": "up", "decrease": "down", "reduce": "down",
    "north": "north", "south": "south", "east": "east", "west": "west", "left": "left",
    "right": "right", "min": "less", "minimum": "less", "max": "more", "maximum": "more", "true": "true",
    "false": "false", "always": "always", "sometimes": "sometimes", "rarely": "rarely", "often": "often",
    "start": "start", "begin": "start", "end": "end", "finish": "end", "buy": "buy", "sell": "sell",
    "hottest": "hot", "hotter": "hot", "warmest": "hot", "coldest": "cold", "colder": "cold", "coolest": "cold",
    "synonym": "synonym", "synonyms": "synonym", "antonym": "antonym", "antonyms": "antonym", "opposite": "antonym",
    "day": "d", "week": "wk", "month": "mo", "year": "yr", "hour": "h", "minute": "min",
    "celsius": "C", "fahrenheit": "F", "km": "km", "kilometers": "km", "kilometres": "km", "miles": "mi",
    "mile": "mi", "kg": "kg", "kilograms": "kg", "pounds": "lb", "lbs": "lb", "meters": "m", "metres": "m",
    "feet": "ft", "foot": "ft", "inches": "in", "cm": "cm", "centimeters": "cm", "hours": "h", "minutes": "min",
    "days": "d", "weeks": "wk", "years": "yr", "months": "mo", "dollars": "$", "euros": "€",
    "python": "Python", "javascript": "JavaScript", "java": "Java", "rust": "Rust",
}  # fmt: skip
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

    sequence: tuple[str, ...]  # numbers, operators and names, in order
    polarity: frozenset[str]  # polarity words, folded onto one side each ("warmest" -> hot)


_SENTENCE_END = frozenset(".!?")


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
    terms: list[str] = []
    polarity: set[str] = set()
    for match in _TOKEN.finditer(text):
        low = match.group(0).lower()
        if low[:1].isdigit():
            terms.append(low.replace(",", ""))
        elif low in _NUMBER_WORDS or low in _OPERATORS:
            terms.append(_NUMBER_WORDS.get(low) or _OPERATORS[low])
        elif low in _POLARITY:
            polarity.add(_POLARITY[low])
        elif (stem := low.split("'")[0].split("’")[0]) in named:
            terms.append("@" + stem)
    return KeyTerms(tuple(terms), frozenset(polarity))


def same_key_terms(query: str, candidate: str) -> bool:
    """True when the numbers, operators and names agree in order, and no polarity word of one is opposed by another
    polarity word of the other ("hottest" / "coldest"). A polarity word on one side only ("how to boost" / "how to
    increase") is left to the lexical check, which relates the two words or rejects them; so are negations."""
    named = names(query) | names(candidate)
    a, b = key_terms(query, named), key_terms(candidate, named)
    return a.sequence == b.sequence and not (a.polarity - b.polarity and b.polarity - a.polarity)
