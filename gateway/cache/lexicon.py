"""Word against word: may two different content words stand for each other in a question?

`explains(a, b)` is True when WordNet says they are one word inflected or derived ("repotting" / "repot",
"fluently" / "fluent"), synonyms (they share a sense among the first `SENSES` senses of each: a rare sense
shared by two common words, "dog" / "frank", does not count), or one is the other's direct hypernym ("boost" /
"increase"). It is False, whatever else holds, when they differ by a negating or opposing prefix ("lock" /
"unlock", "overwatered" / "underwatered") or are antonyms, directly or through an adjective cluster ("soggy" is
similar to "wet", whose antonym is "dry"). Siblings under one hypernym (cat / dog, french / german, python /
java) and unrelated words are not explained: the lexical check rejects them.
"""

from __future__ import annotations

import functools

from gateway.cache.wordnet import ANTONYM, DERIVED, HYPERNYM, INSTANCE_HYPERNYM, PERTAINYM, SIMILAR, WordNet

SENSES = 3  # a synonym or hypernym must be among a word's most frequent senses (index order)
# Prefixes that negate or reverse a stem: "un"+"lock", "dis"+"assemble"; and pairs that oppose each other.
NEGATING = ("un", "in", "im", "il", "ir", "non", "dis", "de", "anti", "mis", "counter", "non-", "un-", "anti-")
OPPOSING = (("over", "under"), ("pre", "post"), ("in", "out"), ("up", "down"), ("in", "de"), ("inter", "intra"),
            ("im", "ex"), ("hyper", "hypo"), ("super", "sub"), ("max", "min"), ("en", "dis"))  # fmt: skip
_MIN_STEM = 3


def prefixed(a: str, b: str) -> bool:
    """One word is the other behind a negating prefix, or they share a stem behind opposing prefixes."""
    for x, y in ((a, b), (b, a)):
        for p in NEGATING:
            if x == p + y and len(y) >= _MIN_STEM:
                return True
    for p, q in OPPOSING:
        for x, y in ((a, b), (b, a)):
            if x.startswith(p) and y.startswith(q) and x[len(p) :] == y[len(q) :] and len(x) - len(p) >= _MIN_STEM:
                return True
    return False


class Lexicon:
    def __init__(self, wordnet: WordNet) -> None:
        self.wn = wordnet

    def known(self, word: str) -> bool:
        return bool(self.wn.lemmas(word))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one lexicon per process
    def _antonyms(self, pos: str, lemma: str) -> frozenset[tuple[str, str]]:
        """The words WordNet marks as antonyms of `lemma`, sense by sense."""
        return frozenset(self.wn.lexical_targets(lemma, pos, ANTONYM))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _heads(self, lemma: str) -> frozenset[tuple[str, int]]:
        """An adjective's cluster heads: its own head synsets, and the heads its satellite senses are similar to
        ("soggy" -> "wet")."""
        heads = set()
        for key in self.wn.senses(lemma, "adj"):
            similar = self.wn.synset(key).targets(SIMILAR)
            heads.update(similar if self.wn.is_satellite(key) else [key])
        return frozenset(heads)

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _opposite_heads(self, lemma: str) -> frozenset[tuple[str, int]]:
        """The cluster heads opposed to an adjective's heads (the antonym pointers between cluster heads)."""
        return frozenset(t for head in self._heads(lemma) for t in self.wn.synset(head).targets(ANTONYM))

    def _opposed(self, la: set[tuple[str, str]], lb: set[tuple[str, str]]) -> bool:
        for pos, lemma in la:
            if self._antonyms(pos, lemma) & lb:
                return True
            if pos == "adj" and any(p == "adj" and self._opposite_heads(lemma) & self._heads(w) for p, w in lb):
                return True
        return False

    def _top(self, pos: str, lemma: str) -> tuple[tuple[str, int], ...]:
        return self.wn.senses(lemma, pos)[:SENSES]

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def relation(self, a: str, b: str) -> str:
        """same | derived | synonym | hypernym (the word pair is explained) or prefix | antonym | unrelated."""
        if a == b:
            return "same"
        if prefixed(a, b):
            return "prefix"
        la, lb = set(self.wn.lemmas(a)), set(self.wn.lemmas(b))
        if la & lb:
            return "same"
        if self._opposed(la, lb) or self._opposed(lb, la):
            return "antonym"
        if any(prefixed(x, y) for _, x in la for _, y in lb):
            return "prefix"
        for pos, lemma in la:
            if self.wn.lexical_targets(lemma, pos, DERIVED, PERTAINYM) & lb:
                return "derived"
        for pos, lemma in lb:
            if self.wn.lexical_targets(lemma, pos, DERIVED, PERTAINYM) & la:
                return "derived"
        tops_a = {k for pos, lemma in la for k in self._top(pos, lemma)}
        tops_b = {k for pos, lemma in lb for k in self._top(pos, lemma)}
        if tops_a & tops_b:
            return "synonym"
        if "_" in a or "_" in b:  # "smoked_salmon" is a kind of "salmon": a modifier added, not a synonym
            return "unrelated"
        for mine, other in ((tops_a, tops_b), (tops_b, tops_a)):
            for key in mine:
                if set(self.wn.synset(key).targets(HYPERNYM, INSTANCE_HYPERNYM)) & other:
                    return "hypernym"
        return "unrelated"

    def explains(self, a: str, b: str) -> bool:
        return self.relation(a, b) in ("same", "derived", "synonym", "hypernym")
