"""The lexical check: two questions may share an answer only if they say the same *content*.

A general rule, not a list of the pairs it was tried on. Both questions are read by gateway/cache/reading.py
(content words; negations, tense, question kind and persons; what introduces each word). Every content word of one
question must have a partner in the other: the same word after normalising inflection, contractions and chat
spellings, its misspelling (one edit inside a word no dictionary knows: "replacment" / "replacement"), or, with
the WordNet lexicon (gateway/cache/lexicon.py), a synonym, an inflection WordNet knows ("ran" / "run"), a
derivation or a similar adjective; never an antonym, a word behind a negating prefix or
a sibling. The negations, the tense, the kind of question and the persons' places must agree.
`compare` then reads the roles:

- each content word carries the preposition (or the clause conjunction, or the question word) right before it.
  The same order is SAME. One phrase that moved with the preposition, conjunction or question word that heads it
  ("in october, is it rainy in bali" / "is it rainy in bali in october"; "if my flight is cancelled, do i get a
  refund" / "do i get a refund if my flight is cancelled") keeps the roles: REORDERED. A bare noun that moves
  across its verb changes them ("my friend owes me" / "i owe my friend"), and so do words that cross or change
  preposition ("convert X to Y" / "Y to X"): SWAPPED, left to the engine verifier; when the same prepositions
  stayed and their objects swapped ("from X to Y" / "from Y to X") it is a role reversal: DIFFERENT;
- a keyword query (no pronoun, article, auxiliary or preposition: "vitamin d deficiency symptoms", "order tracking
  how to") names a thing by a compound whose head comes last; the question that spells it out puts the head first,
  with "of", "for", "in", "on", "at", "with" or "about" before the modifiers ("symptoms of a deficiency in vitamin
  d"), or moves the object after the verb ("how do i track my order"). Such a reordering, or one group of words
  moved between two keyword queries ("drywall anchor weight limit" / "weight limit drywall anchor"), is REORDERED
  unless two words that stand side by side in one are side by side the other way round in the other ("milk
  chocolate" / "chocolate milk": a compound's head changed).

When the only difference is one pair of content words that WordNet neither relates nor opposes ("safe" / "ok",
"cat" / "dog", which it does not list as siblings), the verdict is SUBSTITUTED: only the engine verifier can tell a
synonym WordNet lacks from another question. Any other rewording WordNet cannot relate fails the check: that
costs hit rate, not a wrong answer.
"""

from __future__ import annotations

import functools
import gc
import itertools

from gateway.cache.lexicon import Lexicon
from gateway.cache.reading import COMPOUND_RELATIONS, RELATIONS, Content, Word, content
from gateway.cache.wordnet import load
from gateway.cache.wordnet_fetch import default_wordnet_path


def _places(persons: frozenset[tuple[int, int]], place: dict[int, int], swap: bool) -> tuple[dict[int, int], dict[int, int]]:
    """Each person's first and last place (`place`: a content word's index -> its position), "i" and "you" swapped
    when `swap` (a generic "you")."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for p, k in persons:
        p = {1: 2, 2: 1}.get(p, p) if swap else p
        first[p], last[p] = min(first.get(p, place[k]), place[k]), max(last.get(p, place[k]), place[k])
    return first, last


def _same_parts(a: Content, b: Content, order: list[int]) -> bool:
    """Where both questions name persons, they name the same kinds (i, you, someone else), and every two persons
    both name come in the same order, each placed by the content word it stands before, where it is first named and
    where it is last ("i rear end someone" / "someone rear ends me": no). "you" stands for "i" (a generic "how do
    you...") when one question has only "i" and the other only "you"."""
    kinds_a, kinds_b = {p for p, _ in a.persons}, {p for p, _ in b.persons}
    # a generic "you" asks how one does something ("how do you boil an egg"), never about the assistant: not with
    # "are you" / "is your", nor in a question with one content word and no condition ("where do you live", "who
    # made you"; "how do you know if you are pregnant" is generic)
    generic = (
        not ({1, 2} <= kinds_a or {1, 2} <= kinds_b) and {1, 2} <= kinds_a | kinds_b
        and not (a.addressed or b.addressed)
        and all(len(c.words) >= 2 or any(w.attach == "clause" for w in c.words) for c in (a, b))
    )
    first_a, last_a = _places(a.persons, {i: j for j, i in enumerate(order)} | {len(order): len(order)}, generic)
    first_b, last_b = _places(b.persons, {j: j for j in range(len(order) + 1)}, False)
    if first_a and first_b and first_a.keys() != first_b.keys():
        return False  # someone else named in one only: "how do i block my number" / "... someone's number"
    common = sorted(first_a.keys() & first_b.keys())
    # first and last places both: a person named in a context clause first ("i'm type o negative, can i give blood
    # to someone" / "..., can someone give blood to me") still shows the roles swapped in its last place
    return all(
        (x[p] - x[q]) * (y[p] - y[q]) >= 0
        for x, y in ((first_a, first_b), (last_a, last_b))
        for n, p in enumerate(common)
        for q in common[n + 1 :]
    )


# A lookup compares its question with up to eight candidates, and a cached question meets many lookups: each is read
# once (a Content is immutable), not once per comparison
_read = functools.lru_cache(maxsize=8192)(content)

# A semantic hit is for a question, not a document: past this many content words the check does not compare (it
# would cost more than generating; the embedder reads 256 word pieces at most anyway)
MAX_CONTENT_WORDS = 48

SAME, REORDERED, SWAPPED, SUBSTITUTED, DIFFERENT = "same", "reordered", "swapped", "substituted", "different"


def _align(a: Content, b: Content, lex: Lexicon | None, substitute: bool = False) -> list[int] | None:
    """For each of b's words, the index of the word of a that stands for it (equal, or explained by the lexicon:
    synonym, inflection, derivation, similar adjective); None when some content word of either
    has no partner. With `substitute`, one pair of words the lexicon cannot relate may stand for each other too, if
    it does not oppose them (no antonym, negating prefix or sibling): a SUBSTITUTED question."""
    if len(a.words) != len(b.words):
        return None
    partner: list[int | None] = [None] * len(b.words)
    free = set(range(len(a.words)))
    seen: dict[str, int] = {}
    for j, w in enumerate(b.words):
        same = [i for i, x in enumerate(a.words) if x.key == w.key]
        rank = seen.get(w.key, 0)
        seen[w.key] = rank + 1
        if rank < len(same):  # a repeated word pairs by its rank: the first "key" with the first "key"
            partner[j] = same[rank]
            free.discard(same[rank])
    rest = [j for j, p in enumerate(partner) if p is None]
    if rest and lex is None:
        return None

    def fits(i: int, j: int) -> bool:
        x, y = a.words[i], b.words[j]
        if x.fixed or y.fixed or lex is None:
            return False
        if x.degree or y.degree:
            return lex.one_sense(x.text, y.text)
        return lex.explains(x.text, y.text) or lex.misspelt(x.text, y.text)

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

    unmatched = [j for j in rest if not augment(j, set())]
    if unmatched:
        if not substitute or len(unmatched) != 1 or lex is None:
            return None
        (j,), (i,) = unmatched, free
        x, y = a.words[i], b.words[j]
        if x.fixed or y.fixed or x.degree or y.degree or x.past != y.past or not lex.replaceable(x.text, y.text):
            return None
        partner[j] = i
    return [p for p in partner if p is not None]


def _dropped(x: str | None, y: str | None) -> bool:
    """A preposition one question drops where the other has it ("sql table" / "table in sql", "remove limescale
    shower head" / "remove limescale from a shower head"), but not "for", which names a purpose or a goal: "leave
    for school" / "leave school", "run for council" / "run council"."""
    return None in (x, y) and (x or y) != "for"


def _owner_inverted(a: Content, b: Content) -> bool:
    """A possessor in `a` whose partner in `b` (the words in the same order) is followed by an "of" phrase: "my
    mother's sister" owns the sister, "the mother of my sister" the mother."""
    return any(
        w.owner and not b.words[i].owner and i + 1 < len(b.words) and b.words[i + 1].attach == "of"
        for i, w in enumerate(a.words)
    )


# Verbs after which "to do" and "doing" say different things ("stop to eat" / "stop eating"), by their keys
_TURNING = frozenset(("stop", "forget", "forgot", "forgotten", "remember", "regret", "try", "quit"))


def _infinitive_for_gerund(x: Word, y: Word, before: Word | None) -> bool:
    """A verb after "to" in one question and its "-ing" form in the other, right after a verb for which the two
    differ ("stop", "forget", "remember", "regret", "try", "quit"): "should i stop to eat" / "... stop eating".
    Elsewhere they say the same ("is it worth it to learn latin" / "is it worth learning latin")."""
    return before is not None and before.key in _TURNING and any(
        u.preposition == "to" and v.preposition is None and v.text.endswith("ing") and not u.text.endswith("ing")
        for u, v in ((x, y), (y, x))
    )


def _did(a: Content, b: Content, a_past: bool) -> bool:
    """The base form after "did" stands for the past form: "what did people eat" / "what people ate"."""
    base, past = (b, a) if a_past else (a, b)
    return "past" in base.tenses and not past.tenses


def _untangled(b: Content, order: list[int]) -> list[int]:
    """A repeated word pairs by rank (the first "key" with the first "key"), unless pairing its occurrences another
    way leaves the words in order, or with one block moved: "if my flight gets cancelled, do i get a refund" / "do
    i get a refund if my flight gets cancelled" moved a clause, whichever "get" is which."""
    groups: dict[str, list[int]] = {}
    for j, w in enumerate(b.words):
        groups.setdefault(w.key, []).append(j)
    repeated = [js for js in groups.values() if len(js) > 1]
    if not repeated or order == sorted(order) or _moved_blocks(order):
        return order
    choices = [list(itertools.permutations([order[j] for j in js])) for js in repeated]
    for combo in itertools.islice(itertools.product(*choices), 120):  # a few repeated words: a few orders
        trial = list(order)
        for js, indices in zip(repeated, combo, strict=True):
            for j, i in zip(js, indices, strict=True):
                trial[j] = i
        if trial == sorted(trial) or _moved_blocks(trial):
            return trial
    return order


def _moved_blocks(order: list[int]) -> list[tuple[int, int]]:
    """The ways `order` is 0..n-1 with one contiguous block moved elsewhere: (first, end) of the moved block's
    values ("a phrase moved to the front or the end"); empty when no single move gives it. The words that moved lie
    between the first and the last position out of place, and there they must be two runs swapped: [k, q] then
    [p, k) (either run may be the one that moved)."""
    out_of_place = [i for i, v in enumerate(order) if v != i]
    if not out_of_place:
        return []
    p, q = out_of_place[0], out_of_place[-1]
    k = order[p]
    if not p < k <= q or order[p : q + 1] != [*range(k, q + 1), *range(p, k)]:
        return []
    return [(k, q + 1), (p, k)]


def _phrase_moved(a: Content, b: Content, order: list[int]) -> bool:
    """One phrase moved, and it keeps its role: it is headed by a preposition (its first word is a preposition's
    object, or is one), or it went from one end of the question to the other ("javascript remove item from array"
    / "remove item from array javascript"), in a question that names no person and asks with no question word.
    A bare noun moved across its verb does not ("my friend owes me" / "i owe my friend")."""
    n = len(order)
    bare = not (a.persons or b.persons or a.asks or b.asks)
    for first, end in _moved_blocks(order):
        if a.words[first].attach is not None or a.words[first].text in RELATIONS:
            return True
        if bare and (first, end) in ((0, 1), (n - 1, n)) and order[0] != 0 and order[-1] != n - 1:
            return True  # in a question with no person and no question word, a word from the front to the back
    return False


def _route_changed(a: Content, b: Content, order: list[int]) -> bool:
    """The phrases introduced by "to" stand in another order: "from boston to new york to philadelphia" / "from
    boston to philadelphia to new york" are two routes, however the rest moved."""
    position = {i: j for j, i in enumerate(order)}
    stops = [position[i] for i, w in enumerate(a.words) if w.preposition == "to"]
    return stops != sorted(stops)


def _traded(order: list[int]) -> bool:
    """Exactly two words traded places, with other content words between them, everything else in place: each took
    the other's role ("dog chasing cat" / "cat chasing dog"). Two words side by side that trade places are a
    coordination reordered ("a fruit or a vegetable" / "a vegetable or a fruit"), left to the verifier."""
    moved = [i for i, v in enumerate(order) if v != i]
    return len(moved) == 2 and order[moved[0]] == moved[1] and moved[1] - moved[0] > 1


def _compound_inverted(a: Content, b: Content, order: list[int]) -> bool:
    """Two words side by side in one question stand side by side the other way round in the other, with nothing
    between them in either (no preposition, no article or pronoun): a compound's head changed ("milk chocolate" /
    "chocolate milk"). "track my order" / "order tracking" is a verb and its object, not a compound."""
    position = {i: j for j, i in enumerate(order)}  # a's word i stands at b's position j
    for i in range(len(a.words) - 1):
        j = position[i]
        x, y = a.words[i + 1], b.words[j]
        if position[i + 1] == j - 1 and x.attach is None and y.attach is None and not (x.gap or y.gap):
            return True
    return False


def _compound_spelled_out(a: Content, b: Content, order: list[int]) -> bool:
    """One side is a keyword query and the other spells it out: with compound prepositions ("vitamin d deficiency
    symptoms" / "symptoms of a deficiency in vitamin d"), or in plain grammar with one phrase moved ("how do i track
    my order" / "order tracking how to"); or both are keyword queries and one group of words moved. In every case
    no compound inverted."""
    if a.keywords and b.keywords:  # two keyword queries: one group of words moved ("drywall anchor weight limit" /
        return bool(_moved_blocks(order)) and not _compound_inverted(a, b, order)  # "weight limit drywall anchor")
    if a.keywords == b.keywords:
        return False
    attached = [w.preposition for w in a.words + b.words if w.preposition is not None]
    if any(r not in COMPOUND_RELATIONS for r in attached):
        return False
    if not attached and not _moved_blocks(order):
        return False
    return not _compound_inverted(a, b, order)


_RANK = {SAME: 0, REORDERED: 1, SUBSTITUTED: 2, SWAPPED: 3, DIFFERENT: 4}


def _clause_moved(a: Content, b: Content, order: list[int]) -> bool:
    """A subordinate clause moved to the other end of the question, its conjunction on the same word in both, and a
    noun phrase that went with it or stayed behind as a pronoun: "when you heat a metal rod, why does it get longer"
    / "why does a metal rod get longer when you heat it". The question word then reaches another first word; every
    preposition stays. "if my flight is cancelled, do i get a refund" / "if i get a refund, is my flight cancelled"
    puts the conjunction on other words: not this."""
    clauses = [(i, j) for j, i in enumerate(order) if a.words[i].attach == "clause" or b.words[j].attach == "clause"]
    if len(clauses) != 1 or not _moved_blocks(order) or _compound_inverted(a, b, order):
        return False
    (i, j) = clauses[0]  # the conjunction's word, in a and in b: the same word, at one end of b
    if a.words[i].attach != b.words[j].attach or j not in (0, len(order) - 1):
        return False
    return all(
        x.attach == y.attach or {x.attach, y.attach} <= {"wh", None}
        for x, y in ((a.words[k], w) for k, w in zip(order, b.words, strict=True))
    )


def _search_query_spelled_out(a: Content, b: Content, order: list[int]) -> bool:
    """A search-box query and the question that spells it out, one phrase moved: "python sort dictionary by value"
    / "how can i sort a dictionary by its values in python", "android phone stuck in boot loop fix" / "how do i fix
    an android phone stuck in a boot loop". The query's bare words take a compound preposition ("in python") or the
    question word ("how do i fix") in the question; every word with a preposition in both keeps it ("convert
    celsius to fahrenheit" / "how do i convert fahrenheit to celsius" does not), and no compound inverted."""
    if a.telegraphic == b.telegraphic or not _moved_blocks(order):
        return False
    for i, w in zip(order, b.words, strict=True):
        x, y = (a.words[i], w) if a.telegraphic else (w, a.words[i])  # the query's word, the question's
        if x.attach == y.attach:
            continue
        if x.attach is not None or (y.attach != "wh" and y.attach not in COMPOUND_RELATIONS):
            return False
    return not _compound_inverted(a, b, order)


def compare(query: str, cached: str, lex: Lexicon | None = None) -> str:
    """`_compare` both ways, the stricter verdict: which question is the cached one does not change whether they
    ask the same (persons and moved words are placed by one side's words, and one side can hide what the other
    shows)."""
    return max(_compare(query, cached, lex), _compare(cached, query, lex), key=_RANK.__getitem__)


def _compare(query: str, cached: str, lex: Lexicon | None = None) -> str:
    """SAME: every content word has a partner (the same word, or with a lexicon a synonym, inflection, derivation,
    similar adjective), in the same order, with as many negations, the same tense and the same
    kind of question; REORDERED: the same, but one phrase moved with its preposition ("in october, is it rainy in
    bali" / "is it rainy in bali in october"), or a keyword query spelled out ("vitamin d deficiency symptoms" /
    "symptoms of vitamin d deficiency"); SWAPPED: the words cross or change preposition, as a role reversal does
    ("convert X to Y" / "Y to X"; a reordered paraphrase may too: only a verifier can tell); DIFFERENT: a content
    word unexplained, added or dropped, or the negations, the tense, a past form or the kind of question differ."""
    if max(len(query.split()), len(cached.split())) > 4 * MAX_CONTENT_WORDS:
        return DIFFERENT  # not even read
    lex = default_lexicon() if lex is None else lex
    a, b = _read(query, lex or None), _read(cached, lex or None)
    if max(len(a.words), len(b.words)) > MAX_CONTENT_WORDS or not (a.words and b.words):
        return DIFFERENT  # too long to compare, or nothing to compare ("what should i say when someone thanks me")
    if a.negations != b.negations:
        return DIFFERENT
    if a.tenses and b.tenses and a.tenses != b.tenses:
        return DIFFERENT
    if (a.choice and not b.choice and b.joined) or (b.choice and not a.choice and a.joined):
        return DIFFERENT  # "should i pay off debt or invest" / "... pay off debt and invest"
    if a.modals and b.modals and a.modals != b.modals and "manner" not in a.asks | b.asks:
        return DIFFERENT  # "can i retire at 55" / "should i retire at 55"; "how can i" = "how should i"
    if a.asks and b.asks and a.asks != b.asks:
        return DIFFERENT
    order = _align(a, b, lex or None)
    substituted = order is None
    if order is None:
        order = _align(a, b, lex or None, substitute=True)
        if order is None:
            return DIFFERENT
    order = _untangled(b, order)
    if any(a.words[i].grade != w.grade for i, w in zip(order, b.words, strict=True)):
        return DIFFERENT  # "the best credit score" / "a good credit score"
    if any(a.words[i].past != w.past and not _did(a, b, a.words[i].past) for i, w in zip(order, b.words, strict=True)):
        return DIFFERENT
    if not _same_parts(a, b, order):
        return SWAPPED
    if order == sorted(order) and all(
        a.words[i].preposition == w.preposition or _dropped(a.words[i].preposition, w.preposition)
        for i, w in zip(order, b.words, strict=True)
    ):
        # here order is the identity: a's j-th word is b's j-th word's partner
        if _owner_inverted(a, b) or _owner_inverted(b, a):
            return DIFFERENT  # "my mother's sister" / "the mother of my sister"
        if any(_infinitive_for_gerund(x, y, b.words[j - 1] if j else None)
               for j, (x, y) in enumerate(zip(a.words, b.words, strict=True))):  # fmt: skip
            return DIFFERENT  # "should i stop to eat" / "should i stop eating"
        return SUBSTITUTED if substituted else SAME
    if order == sorted(order) and not a.keywords and not b.keywords:
        return DIFFERENT  # nothing moved, a relation changed: "flights to paris" / "flights from paris"
    if substituted:
        return DIFFERENT  # one word the lexicon cannot relate, and moved words: too far for the verifier
    if _route_changed(a, b, order):
        return SWAPPED  # "from boston to new york to philadelphia" / "... to philadelphia to new york"
    if _compound_spelled_out(a, b, order):
        return REORDERED
    if _search_query_spelled_out(a, b, order) or _clause_moved(a, b, order):
        return REORDERED
    roles_kept = all(a.words[i].attach == w.attach for i, w in zip(order, b.words, strict=True))
    if roles_kept and _phrase_moved(a, b, order) and not _compound_inverted(a, b, order):
        return REORDERED
    if any(a.words[i].lead != w.lead for i, w in zip(order, b.words, strict=True)):
        return DIFFERENT  # the question word asks for the subject in one and the object in the other: "what eats a
        # fox" / "what does a fox eat"
    if _traded(order):
        return DIFFERENT  # two words traded places across others: "encrypt with the public key and decrypt with
        # the private key" / "... private ... public"
    pairs = list(zip(order, b.words, strict=True))
    relations_a = sorted(a.words[i].attach or "" for i, _ in pairs)
    if relations_a == sorted(w.attach or "" for _, w in pairs) and any(
        a.words[i].attach != w.attach and a.words[i].attach and w.attach for i, w in pairs
    ):
        return DIFFERENT  # the same prepositions stayed, their objects swapped: "from X to Y" / "from Y to X"
    return SWAPPED


_DEFAULT: list[Lexicon | None] = []


def default_lexicon() -> Lexicon | None:
    """The lexicon over the fetched WordNet (`python -m gateway.cache.wordnet_fetch`), loaded once; None when the
    database is missing (then only equal words stand for each other: fewer hits, never more)."""
    if not _DEFAULT:
        root = default_wordnet_path()
        _DEFAULT.append(Lexicon(load(root)) if (root / "index.noun").exists() else None)
        gc.collect()  # untracks the index's ~200k tuples now, not in a collection during some request
    return _DEFAULT[0]
