"""A small reader for the WordNet database (the files `gateway/cache/wordnet_fetch.py` fetches).

What the lexical check asks of it, word against word: are these two inflections of one lemma (morphy: the
exception lists, then the detachment rules), do they share a sense (a synonym), is one the other's direct
hypernym, are they derivationally related ("improve" / "improvement"), or are they antonyms (directly, or through
an adjective cluster: "soggy" is similar to "wet", whose antonym is "dry")? Anything else (siblings under one
hypernym such as cat / dog or french / german, unrelated words) is *unexplained*, and the check rejects it.

The database format (wndb(5WN)): `index.POS` lines are `lemma pos synset_cnt p_cnt [ptr...] sense_cnt
tagsense_cnt offset...` with the offsets ordered by sense frequency; `data.POS` lines start at those byte offsets:
`offset lex_filenum ss_type w_cnt word lex_id ... p_cnt [symbol offset pos source/target]... | gloss`. The index
files are read into dicts once (about a second); synsets are parsed on demand from the data files, kept in memory
as bytes, and memoised.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

POS = ("noun", "verb", "adj", "adv")
_POS_CHAR = {"n": "noun", "v": "verb", "a": "adj", "s": "adj", "r": "adv"}
# morphy's detachment rules (wnintro(3WN) "morphy"), per part of speech
_RULES = {
    "noun": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"), ("men", "man"),
             ("ies", "y")),
    "verb": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""), ("ing", "e"), ("ing", "")),
    "adj": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "adv": (),
}  # fmt: skip
ANTONYM, HYPERNYM, INSTANCE_HYPERNYM, SIMILAR, DERIVED, PERTAINYM = "!", "@", "@i", "&", "+", "\\"


@dataclass(frozen=True)
class Synset:
    key: tuple[str, int]  # (pos, offset)
    lemmas: tuple[str, ...]
    # (symbol, target synset key, source word index, target word index); word indexes 0 = the whole synset
    pointers: tuple[tuple[str, tuple[str, int], int, int], ...]

    def targets(self, *symbols: str) -> list[tuple[str, int]]:
        return [target for sym, target, _, _ in self.pointers if sym in symbols]


class WordNet:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._index: dict[str, dict[str, tuple[int, ...]]] = {pos: {} for pos in POS}
        self._exceptions: dict[str, dict[str, tuple[str, ...]]] = {pos: {} for pos in POS}
        self._data: dict[str, bytes] = {}
        for pos in POS:
            self._data[pos] = (root / f"data.{pos}").read_bytes()
            index = self._index[pos]
            with open(root / f"index.{pos}", encoding="utf-8") as f:
                for line in f:
                    if line.startswith(" "):  # the license header
                        continue
                    fields = line.split()
                    count = int(fields[2])
                    index[fields[0]] = tuple(int(x) for x in fields[len(fields) - count :])
            exc = root / f"{pos}.exc"
            if exc.exists():
                for line in exc.read_text(encoding="utf-8").splitlines():
                    inflected, *bases = line.split()
                    self._exceptions[pos][inflected] = tuple(bases)

    def has(self, lemma: str, pos: str | None = None) -> bool:
        return any(lemma in self._index[p] for p in ((pos,) if pos else POS))

    @functools.lru_cache(maxsize=65536)  # noqa: B019 - one WordNet per process, lives as long as it
    def morphy(self, word: str, pos: str) -> tuple[str, ...]:
        """The lemmas of `pos` that `word` may be an inflection of (itself included), per WordNet's morphy."""
        index = self._index[pos]
        found = [word] if word in index else []
        found += [b for b in self._exceptions[pos].get(word, ()) if b in index and b not in found]
        for suffix, repl in _RULES[pos]:
            if word.endswith(suffix) and len(word) > len(suffix) + 1:
                base = word[: len(word) - len(suffix)] + repl
                if base in index and base not in found:
                    found.append(base)
        if not found and "_" in word:  # a collocation inflects its first word: "setting_up" -> "set_up"
            head, rest = word.split("_", 1)
            found = [f"{base}_{rest}" for base in self.morphy(head, pos) if f"{base}_{rest}" in index]
        return tuple(found)

    @functools.lru_cache(maxsize=65536)  # noqa: B019
    def lemmas(self, word: str) -> tuple[tuple[str, str], ...]:
        """(pos, lemma) for every part of speech `word` can be an inflection of."""
        return tuple((pos, lemma) for pos in POS for lemma in self.morphy(word, pos))

    def senses(self, lemma: str, pos: str) -> tuple[tuple[str, int], ...]:
        """The synset keys of `lemma` as `pos`, most frequent sense first."""
        return tuple((pos, off) for off in self._index[pos].get(lemma, ()))

    @functools.lru_cache(maxsize=200_000)  # noqa: B019
    def synset(self, key: tuple[str, int]) -> Synset:
        pos, offset = key
        data = self._data[pos]
        fields = data[offset : data.index(b"\n", offset)].split(b" | ", 1)[0].decode("utf-8").split()
        n_words = int(fields[3], 16)
        lemmas = tuple(w.lower().split("(", 1)[0] for w in fields[4 : 4 + 2 * n_words : 2])  # drop adj markers (a)
        at = 4 + 2 * n_words
        n_ptrs = int(fields[at])
        pointers = []
        for i in range(n_ptrs):
            sym, off, p, st = fields[at + 1 + 4 * i : at + 5 + 4 * i]
            pointers.append((sym, (_POS_CHAR[p], int(off)), int(st[:2], 16), int(st[2:], 16)))
        return Synset(key, lemmas, tuple(pointers))

    def is_verb_exception(self, word: str) -> bool:
        """`word` is an irregular verb form WordNet lists (verb.exc: "ran", "fed", "taught")."""
        return word in self._exceptions["verb"]

    def lexfile(self, key: tuple[str, int]) -> int:
        """The lexicographer file the synset belongs to (its second field): for nouns 5 animal, 6 artifact, 13
        food, 14 group, 18 person, 27 substance ...; 4 act, 7 attribute, 9 cognition ... (lexnames(5WN))."""
        pos, offset = key
        data = self._data[pos]
        return int(data[offset : data.index(b" ", data.index(b" ", offset) + 1)].split()[1])

    def is_satellite(self, key: tuple[str, int]) -> bool:
        """An adjective satellite (ss_type s): its sense hangs off a cluster head through a similar-to pointer."""
        pos, offset = key
        data = self._data[pos]
        return pos == "adj" and data[offset + 12 : offset + 13] == b"s"

    def lexical_targets(self, lemma: str, pos: str, *symbols: str) -> set[tuple[str, str]]:
        """(pos, lemma) of every word that `lemma` points to with one of `symbols`, sense by sense (lexical pointers
        name their source and target word; a semantic pointer (0/0) relates every word of the two synsets)."""
        out: set[tuple[str, str]] = set()
        for key in self.senses(lemma, pos):
            syn = self.synset(key)
            me = syn.lemmas.index(lemma) + 1 if lemma in syn.lemmas else -1
            for sym, target, src, dst in syn.pointers:
                if sym in symbols and src in (0, me):
                    tsyn = self.synset(target)
                    words = tsyn.lemmas if dst == 0 else tsyn.lemmas[dst - 1 : dst]
                    out.update((target[0], w) for w in words)
        return out


@functools.lru_cache(maxsize=4)
def load(root: Path) -> WordNet:
    return WordNet(root)
