"""How a question is read for the lexical check (gateway/cache/reading.py): what is left out, what is kept, and what
introduces each content word. The questions are written here, for this test."""

from __future__ import annotations

import pytest

from gateway.cache import lexical
from gateway.cache.reading import Content, content, stem
from gateway.cache.wordnet_fetch import FILES, default_wordnet_path

ROOT = default_wordnet_path()
pytestmark = pytest.mark.skipif(
    not all((ROOT / f).exists() for f in FILES), reason="run `python -m gateway.cache.wordnet_fetch` first"
)


def _read(text: str) -> Content:
    lex = lexical.default_lexicon()
    assert lex
    return content(text, lex)


def _texts(c: Content) -> list[str]:
    return [w.text for w in c.words]


def test_courtesy_clauses_and_request_frames_are_left_out() -> None:
    plain = _read("how do i descale a kettle")
    for polite in (
        "hi! sorry to bug u, how do i descale a kettle? thx so much",
        "Good morning, could you kindly tell me how i descale a kettle? Many thanks.",
        "hey, quick q: how do i descale a kettle",
    ):
        read = _read(polite)
        assert _texts(read) == _texts(plain) and read.negations == 0, polite
    assert _texts(_read("list the seven continents")) == _texts(_read("what are the seven continents"))


@pytest.mark.parametrize(
    ("plain", "written"),
    [
        ("how do i right click on a trackpad", "how do i right-click on a trackpad"),  # a hyphen joins words
        ("can i return it without the box", "can i return it w/o the box"),
        ("how to make pancakes fluffy", "how 2 make pancakes fluffy lol"),  # chat spellings, fillers
        ("what is the difference between a modem and a router", "wat is the diff between a modem and a router"),
        ("what causes a sore throat every morning", "what causes a sore throat each morning"),
        ("what is 15 percent of 80", "what is 15% of 80"),
        ("how do i potty train a toddler", "give me some tips for potty training a toddler"),  # a request frame
        ("how do i fix a flat tire", "hi, hope you're having a good day! how do i fix a flat tire"),
    ],
)
def test_spellings_fillers_and_frames_read_as_the_plain_question(plain: str, written: str) -> None:
    assert [w.key for w in _read(written).words] == [w.key for w in _read(plain).words]


def test_a_clause_with_content_is_kept_whole() -> None:
    """Only a clause made of courtesies goes: "sorry, my cat is sick" keeps the cat."""
    assert _texts(_read("sorry, my cat is sick, what should i do")) == ["cat", "sick"]


def test_negations_are_counted_after_contractions_and_chat_spellings() -> None:
    assert _read("why won't my car start").negations == 1
    assert _read("why dont cats like water").negations == 1
    assert _read("if you don't mind: why do cats purr").negations == 0  # a courtesy clause


def test_tense_question_kind_and_persons() -> None:
    read = _read("when did i last renew my passport")
    assert read.tenses == {"past"} and read.asks == {"when"}
    assert {p for p, _ in read.persons} == {1}
    assert _read("how many legs does a spider have").asks == {"quantity"}
    deep = _read("how deep is the ocean")
    assert deep.asks == {"degree"} and deep.words[0].degree and deep.words[0].text == "deep"
    assert _read("how do i boil an egg").asks == {"manner"}
    assert _read("what is the capital of peru").asks == frozenset()  # "what" asks anything


def test_what_introduces_each_word() -> None:
    read = _read("send money from my bank to paypal")
    assert [(w.text, w.preposition) for w in read.words] == [("send", None), ("money", None), ("bank", "from"),
                                                               ("paypal", "to")]  # fmt: skip
    clause = _read("if my flight is cancelled do i get a refund")
    assert clause.words[0].text == "flight" and clause.words[0].attach == "clause"
    assert _read("when is the best time to visit").asks == {"when"}  # a question word, not a conjunction
    assert _read("how to find the area of a circle").words[0].attach == "wh"


def test_keyword_queries_and_pronoun_spellings() -> None:
    assert _read("vitamin d deficiency symptoms").keywords
    assert _read("order tracking how to").keywords  # a question word may end a keyword query
    assert not _read("symptoms of vitamin d deficiency").keywords
    assert not _read("my cat keeps attacking my dog").keywords  # pronouns: a sentence
    assert "us" in _texts(_read("can i ship a package from the us to canada"))  # "the us" names a country


def test_past_forms_brands_and_abbreviations() -> None:
    assert [w.past for w in _read("how long does cooked rice last").words] == [False, True, False, False]
    assert _texts(_read("how to send money with paypal"))[-1] == "paypal"  # not "papal": no word is corrected alone
    assert _read("what port does https use").words[1].fixed  # a vowel-less abbreviation is no plural of "http"


def test_the_stemmer_only_removes_inflection() -> None:
    assert stem("spiders") == "spider" and stem("churches") == "church" and stem("baking") == "bak"
    assert stem("glass") == "glass" and stem("bus") == "bus"
