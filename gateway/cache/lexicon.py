"""Word against word: may two different content words stand for each other in a question?

`explains(a, b)` is True when WordNet says they are one word inflected or derived ("repotting" / "repot",
"fluently" / "fluent"), synonyms (they share a sense among the first `SENSES` senses of each, or any sense when
neither is a noun sibling of the other), or similar adjectives. A verb and its direct hypernym ("sprint" / "run",
"bake" / "cook", but also "delete" / "remove") are related, not explained: the manner a troponym adds often
changes the answer, so only the engine verifier may accept them. It is False, whatever else holds, when they
differ by a negating or opposing prefix ("lock" / "unlock", "overwatered" / "underwatered") or are antonyms,
directly or through an adjective cluster ("soggy" is similar to "wet", whose antonym is "dry"). Siblings under one
hypernym (cat / dog, french / german, python / java) and unrelated words are not explained: the lexical check
rejects them.
"""

from __future__ import annotations

import functools

from gateway.cache.wordnet import ANTONYM, DERIVED, HYPERNYM, INSTANCE_HYPERNYM, PERTAINYM, SIMILAR, WordNet

EXPLAINED = frozenset(("same", "derived", "synonym", "similar"))
SENSES = 3  # a synonym must be among a word's most frequent senses (index order), or a verb's hypernym
# Prefixes that negate or reverse a stem: "un"+"lock", "dis"+"assemble"; and pairs that oppose each other.
NEGATING = ("un", "in", "im", "il", "ir", "non", "dis", "de", "anti", "mis", "counter", "non-", "un-", "anti-")
OPPOSING = (("over", "under"), ("pre", "post"), ("in", "out"), ("up", "down"), ("in", "de"), ("inter", "intra"),
            ("im", "ex"), ("hyper", "hypo"), ("super", "sub"), ("max", "min"), ("en", "dis"))  # fmt: skip
_MIN_STEM = 3
_THINGS = frozenset((5, 6, 8, 13, 14, 15, 17, 18, 20, 27))  # noun.animal artifact body food group location object
# person plant substance
_IRREGULAR_GRADES = {"best": "superlative", "worst": "superlative", "most": "superlative", "least": "superlative",
                     "better": "comparative", "worse": "comparative", "more": "comparative", "less": "comparative"}  # fmt: skip


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

    def _similar(self, a: str, b: str) -> bool:
        """One adjective's sense is a satellite of the other's cluster head. Two satellites of one head are not
        similar to each other: "daily" and "weekly" are both "periodic", and answer different questions."""
        senses_a, senses_b = set(self.wn.senses(a, "adj")), set(self.wn.senses(b, "adj"))
        return any(set(self.wn.synset(k).targets(SIMILAR)) & other for mine, other in ((senses_a, senses_b),
                   (senses_b, senses_a)) for k in mine)  # fmt: skip

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
    def _first_senses(self, word: str) -> frozenset[tuple[str, int]]:
        return frozenset(key for pos, lemma in self.wn.lemmas(word) for key in self.wn.senses(lemma, pos)[:1])

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _first_parents(self, word: str) -> frozenset[tuple[str, int]]:
        """The direct hypernyms of the first (most frequent) sense of each of `word`'s noun lemmas."""
        firsts = [key for key in self._first_senses(word) if key[0] == "noun"]
        return frozenset(p for key in firsts for p in self.wn.synset(key).targets(HYPERNYM, INSTANCE_HYPERNYM))

    def _thing(self, key: tuple[str, int]) -> bool:
        """A noun sense that names a concrete thing: an animal, artifact, body part, food, group, place, object,
        person, plant or substance (WordNet's lexicographer files)."""
        return key[0] == "noun" and self.wn.lexfile(key) in _THINGS

    def _nouns_share_a_first_sense(self, la: set[tuple[str, str]], lb: set[tuple[str, str]]) -> bool:
        for x in (lemma for pos, lemma in la if pos == "noun"):
            for y in (lemma for pos, lemma in lb if pos == "noun"):
                sx, sy = self.wn.senses(x, "noun"), self.wn.senses(y, "noun")
                if (sx[:1] and sx[0] in sy[:2]) or (sy[:1] and sy[0] in sx[:2]):
                    return True
        return False

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def grade(self, word: str) -> str:
        """"superlative" ("biggest", "best"), "comparative" ("bigger", "better") or "" (the base form, or no
        adjective): "the best credit score" asks for the top, "a good credit score" for a threshold."""
        if word in _IRREGULAR_GRADES:
            return _IRREGULAR_GRADES[word]
        if any(lemma == word for _, lemma in self.wn.lemmas(word) if _ != "adj"):
            return ""  # "forest", "number", "later" as a noun: not graded forms
        for suffix, name in (("est", "superlative"), ("er", "comparative")):
            if not word.endswith(suffix):
                continue
            for pos, lemma in self.wn.lemmas(word):
                if pos == "adj" and lemma != word and word in (
                    lemma + suffix, lemma + suffix[1:], lemma[:-1] + "i" + suffix, lemma + lemma[-1] + suffix
                ):
                    return name
        return ""

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def modifier_only(self, word: str) -> bool:
        """An adjective or adverb and nothing else ("often", "far"; not "long", also a verb)."""
        kinds = {pos for pos, _ in self.wn.lemmas(word)}
        return bool(kinds) and kinds <= {"adj", "adv"}

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def is_past(self, word: str) -> bool:
        """A verb's past form or participle that is no verb itself: "cooked", "ran", "fed" (not "need", "read")."""
        if word.endswith("ing") or self.wn.has(word, "verb"):
            return False  # verb.exc lists doubled "-ing" forms too ("repotting")
        if not (word.endswith("ed") or self.wn.is_verb_exception(word)):
            return False
        return any(lemma != word for lemma in self.wn.morphy(word, "verb"))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def relation(self, a: str, b: str) -> str:
        """same | derived | synonym | similar (the word pair is explained) or hypernym (a verb's: related, for the
        verifier) | prefix | part | antonym | sibling | unrelated."""
        if a == b:
            return "same"
        if prefixed(a, b):
            return "prefix"
        if ("_" in a) != ("_" in b) and (a in b.split("_") or b in a.split("_")):
            return "part"  # a collocation and one of its words: a particle or a modifier added ("check" / "check_out")
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
        for adverb, other in ((a, b), (b, a)):  # an adverb means what its adjective does ("quickly" / "fast")
            for adjective in self._adjectives_of(adverb) - {a, b}:
                if (related := self.relation(adjective, other)) in ("same", "derived", "synonym", "similar", "antonym"):
                    return "derived" if related == "same" else related
        if self._first_senses(a) & self._first_senses(b):
            return "synonym"  # one meaning in their most frequent senses ("repair" / "fix", "car" / "automobile")
        if self._first_parents(a) & self._first_parents(b):
            # nouns that are siblings in their most frequent senses ("ocean" / "sea", "cat" / "dog"): whatever
            # rarer sense they share ("a sea of troubles" = "an ocean of troubles"), they name two different things
            return "sibling"
        # Words that share a sense say the same in most questions ("merge" / "combine", "slow" / "sluggish",
        # "purpose" / "function"), but a noun's rarer sense often names another *thing* ("house" is also a family,
        # "stock" a broth, "coach" a bus): a sense that names a concrete thing must be the first sense of one noun
        # and one of the first two of the other ("biscuits" / "cookies")
        tops_a = {k for pos, lemma in la for k in self._top(pos, lemma) if not self._thing(k)}
        tops_b = {k for pos, lemma in lb for k in self._top(pos, lemma) if not self._thing(k)}
        if tops_a & tops_b or self._nouns_share_a_first_sense(la, lb):
            return "synonym"
        if "_" in a or "_" in b:  # "smoked_salmon" is a kind of "salmon": a modifier added, not a synonym
            return "unrelated"
        if {k for pos, lemma in la for k in self.wn.senses(lemma, pos) if not self._thing(k)} & {
            k for pos, lemma in lb for k in self.wn.senses(lemma, pos) if not self._thing(k)
        }:
            return "synonym"
        if any(p == "adj" and self._similar(x, y) for p, x in la for q, y in lb if q == "adj"):
            return "similar"  # a satellite and its own cluster head ("poisonous" / "toxic")
        if any(p == "adj" and self._heads(x) & self._heads(y) for p, x in la for q, y in lb if q == "adj"):
            return "sibling"  # two satellites of one head: two kinds of it ("daily" / "weekly" are "periodic")
        verbs_a = {k for pos, lemma in la if pos == "verb" for k in self._top(pos, lemma)}
        verbs_b = {k for pos, lemma in lb if pos == "verb" for k in self._top(pos, lemma)}
        for mine, theirs in ((verbs_a, verbs_b), (verbs_b, verbs_a)):  # "sprint" is a way to "run": related, not
            for key in mine:  # the same question; a noun's hypernym names a wider class ("salmon" / "fish")
                if set(self.wn.synset(key).targets(HYPERNYM)) & theirs:
                    return "hypernym"
        return "unrelated"

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _adjectives_of(self, word: str) -> frozenset[str]:
        """The adjectives an adverb is derived from (WordNet's pertainym pointer: "quickly" -> "quick")."""
        return frozenset(w for p, lemma in self.wn.lemmas(word) if p == "adv"
                         for q, w in self.wn.lexical_targets(lemma, p, PERTAINYM) if q == "adj")  # fmt: skip

    def one_sense(self, a: str, b: str) -> bool:
        """The same word, or words whose most frequent senses are one meaning ("often" / "frequently", "big" /
        "large"): the strict relation for the property a question asks about ("how heavy" is not "how big")."""
        return self.relation(a, b) in ("same", "derived") or bool(self._first_senses(a) & self._first_senses(b))

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def _inner_edits(self, word: str) -> frozenset[str]:
        """Every string one edit away inside `word` (a letter dropped, added, changed, or two swapped), the first
        and last letters kept: those are the ones people get right, and an added or dropped end letter makes
        another word as often as a typo ("https" / "http")."""
        letters = "abcdefghijklmnopqrstuvwxyz"
        splits = [(word[:k], word[k:]) for k in range(1, len(word))]
        edits = {head + tail[1:] for head, tail in splits if len(tail) > 1}
        edits |= {head + tail[1] + tail[0] + tail[2:] for head, tail in splits if len(tail) > 2}
        edits |= {head + c + tail[1:] for head, tail in splits if len(tail) > 1 for c in letters}
        edits |= {head + c + tail for head, tail in splits for c in letters}
        edits.discard(word)
        return frozenset(edits)

    def misspelt(self, a: str, b: str) -> bool:
        """One of the two is a word of six letters or more that the dictionary does not know, one edit inside it
        from the other, which it knows ("replacment" / "replacement", "controler" / "controller"). Only ever asked
        of a word and its would-be partner in the other question: a brand the dictionary lacks ("paypal") is never
        read as the word it resembles ("papal") unless the other question has that word."""
        return any(
            len(typo) >= 6 and typo.isalpha() and not self.known(typo) and self.known(word)
            and word in self._inner_edits(typo)
            for typo, word in ((a, b), (b, a))
        )  # fmt: skip

    def replaceable(self, a: str, b: str) -> bool:
        """Nothing in WordNet opposes the two words (no antonym, negating prefix or sibling), and both are words
        it knows: a synonym it does not list ("safe" / "ok", "pack" / "bring") is possible, and only the engine
        verifier can tell it from a different question."""
        if not (self.known(a) and self.known(b)):
            return False
        opposed = ("antonym", "prefix", "sibling", "part")
        # collocations compare word by word too: "warm_up" / "cool_down" oppose, as "warm" / "cool" do
        return self.relation(a, b) not in opposed and not any(
            self.relation(x, y) in opposed for x in a.split("_") for y in b.split("_") if x != y
        )

    def explains(self, a: str, b: str) -> bool:
        return self.relation(a, b) in EXPLAINED
