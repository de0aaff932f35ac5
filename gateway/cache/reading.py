"""Reading a question: its content words, each with what introduces it, and the grammar that changes what it asks.

The lexical check (gateway/cache/lexical.py) compares two questions as `content` reads them. English words fall in
two classes:

- closed-class words (pronouns, determiners, auxiliaries, the words that frame a request: "can you tell me",
  "please", "explain", an opening "list") are a finite, enumerable set; rephrasing adds, drops and changes them
  freely, so they are left out; so are whole clauses made of nothing else (greetings, thanks, apologies: "hi,
  sorry to bother you", "thanks in advance", "if you don't mind");
- every other word carries content (nouns, verbs, adjectives, adverbs, numbers, names), and so do the closed-class
  words that change what is asked: negations, quantifiers, comparison and direction words, prepositions of
  relation. So does the grammar that changes what is asked: the tense of the auxiliaries ("did you need" / "do you
  need"), a verb's past form ("cooked" / "cook"), the kind of question (why, when, where, who, how many, how; "what"
  and "which" ask anything), the property a "how" asks about ("how big"), and who takes part, by person.

Each content word keeps what introduces it: a preposition ("convert X *to* Y"), a clause conjunction ("*if* my
flight is cancelled") or a question word ("*how to* find the area"); a phrase that moves takes it along.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from gateway.cache.lexicon import Lexicon


def _words(text: str) -> list[str]:
    return text.split()


_VOWEL = re.compile(r"[aeiouy]")
# A hyphen or slash between letters joins two words ("right-click", "and/or"), it is no operator
_WORD = re.compile(r"\d+(?:[.,]\d+)*|[a-z]+(?:'[a-z]+)?|[+*^=%<>×÷&]|(?<![a-z])[-/]|[-/](?![a-z])")
# Chat spellings spelled out before the words are read: "w/o" is one token for "without", "how 2" means "how to"
_SPELLINGS = ((re.compile(r"\bw/o\b"), "without"), (re.compile(r"\bw/(?![a-z])"), "with"),
              (re.compile(r"\bhow 2\b"), "how to"))  # fmt: skip
# Nouns after which "between" names what is compared, not a range ("the difference between sleet and hail")
_COMPARED = frozenset(_words("difference differences distinction similarity similarities"))
# Closed-class words that say the same ("each morning" / "every morning")
_ONE_MEANING = {"each": "every"}
# Clause boundaries: punctuation, but not a decimal point or a thousands separator.
_CLAUSE = re.compile(r"[!?;:]+|(?<!\d)[.,]+|[.,]+(?!\d)|\bbut\b")

# Closed-class words that frame a question without changing what it asks.
FUNCTION_WORDS = frozenset(
    _words(
        """a an the this that these those it its i me my mine myself you your yours yourself we us our they
    them their he him his she her one ones someone something anyone anything
    is are was were be been being am do does did done doing have has had having can could would should will
    shall may might must let
    what which who whom whose when where why how
    and or but so if then than also just really actually basically briefly simply exactly
    please kindly thanks thank hey hi hello um uh well yeah yes oh lol lmao haha omg tbh ngl imo fr rn
    tell explain describe give show say help know wondering wonder curious need want like mean means whether
    tells says knows explains describes
    recommend suggest
    to of for in on at by about as with from into
    there here some way ways kind sort type thing things bit"""
    )
)
# Closed-class words that change the question: never free to differ (kept as content).
MEANING_WORDS = frozenset(
    _words(
        """not no never none nothing nobody nowhere neither nor without
    all every each any most more less least fewer many much few several both either only
    before after during since until above below under over between against toward towards up down
    first last next previous"""
    )
)
# A clause made only of these (and closed-class words), with at least one MARKER, greets, thanks, apologises or
# hedges ("hi there", "sorry to bother you", "if you don't mind", "thanks so much", "hope you're well"): dropped.
_DISCOURSE_MARKERS = frozenset(
    _words(
        """hi hello hey hiya heya howdy greetings thanks thank thx ty tysm cheers sorry apologies apologise apologize
    pardon excuse please kindly appreciate appreciated grateful advance hope mind trouble bother bug question
    asking ask q morning evening afternoon"""
    )
)
_DISCOURSE_HEDGES = frozenset(
    _words(
        """quick dumb silly stupid random much lot lots bunch very so well good great fine doing all um uh hmm lol
    btw anyway guys everyone really too bit dear not no ok okay many friend friends folks basic newbie noob
    obvious awkward earlier again time ton having day advice helpful always being"""
    )
)
_CHAT = {
    "ur": "your", "pls": "please", "plz": "please", "thx": "thanks",
    "wanna": "want", "gonna": "going", "gotta": "must", "kinda": "kind", "dunno": "know", "whats": "what is",
    "hows": "how is", "wheres": "where is", "whos": "who is", "thats": "that is", "im": "i am", "ive": "i have",
    "youre": "you are", "theyre": "they are", "cuz": "because", "bc": "because", "tho": "though", "abt": "about",
    "dont": "do not", "doesnt": "does not", "didnt": "did not", "cant": "can not", "cannot": "can not",
    "wont": "will not", "isnt": "is not", "arent": "are not", "wasnt": "was not", "werent": "were not",
    "shouldnt": "should not", "wouldnt": "would not", "couldnt": "could not", "havent": "have not",
    "hasnt": "has not", "hadnt": "had not", "idk": "i do not know", "wat": "what", "wats": "what is",
    "shud": "should", "wud": "would", "cud": "could", "diff": "difference", "b4": "before", "thru": "through",
    "ppl": "people", "pic": "picture", "pics": "pictures", "%": "percent", "&": "and",
    "yr": "year", "yrs": "years", "hr": "hour", "hrs": "hours",
}  # fmt: skip
# Single letters that chat spells words with, read as those words only where grammar says so ("how r u", "can u",
# "y is my wifi slow"); elsewhere a letter names something ("plot it in r", "the y intercept", "best y level"). "u" is
# nearly always "you": only what names a letter ("the u", "what is u") keeps it.
_LETTERS = {"u": "you", "r": "are", "y": "why"}
_IRREGULAR_NOT = {"won't": "will not", "can't": "can not", "shan't": "shall not", "ain't": "is not"}
_CONTRACTED = {"'re": "are", "'ve": "have", "'ll": "will", "'m": "am", "'d": "would"}
# Periphrases read as the word they stand for: "have got" is "have" ("i've got small hands"), "you guys" is "you"
# ("do you guys deliver"), and "anyway" closes a wh-question without adding to it ("so how do tides work anyway";
# "should i send it anyway" asks whether despite something)
_PERIPHRASES = ((re.compile(r"\b(have|has)( not)? got\b"), r"\1\2"), (re.compile(r"\b(you) guys\b"), r"\1"),
                (re.compile(r"^((?:so |well )?(?:how|what|why|when|where|which|who)\b.*) anyways?$"), r"\1"))  # fmt: skip
_IS_CONTRACTED = frozenset(_words("what that it there here he she who where how when why"))

# A gerund, perhaps after one word that is no determiner: "packing light", "potty training" (not "the bar exam"; a
# noun that ends in "-ing", "spring", passes too: only a parser could tell)
_DOING = r" (?!(?:a|an|the|my|your|our|their|his|her|its|this|that|these|those)\b)(?:[a-z]+ )?[a-z]+ing\b"
# Phrases that only frame a request (politeness, hedging, "walk me through"), removed before the words are read.
_FRAMES = re.compile(
    r"\b(?:walk (?:me|us) (?:through|thru)|thanks? (?:you )?in advance|sorry to (?:ask|bother you|bug you)|excuse me|"
    r"i (?:have|had|got) a (?:quick )?question|quick question|i would (?:really )?(?:love|like) to (?:know|learn|ask)|"
    r"i would (?:really |very much )?appreciate (?:it|your help|any help)?|i was (?:hoping|wondering)|"
    r"i am (?:curious|wondering)|(?:do|would|did) you (?:happen to )?know|would you mind(?: telling| explaining| showing)?|"
    r"(?:may|can|could) i ask|if you (?:could|can|do not mind)|can i ask|let me know|"
    r"(?:i would|i will) be (?:very |really |so )?grateful if you (?:could|would)|"
    r"(?<!how )(?:could|can|would|will) you (?:please |kindly )?(?:tell|show|teach|explain|advise|share)(?: to)?(?: me)?"
    r"(?: on)?|"
    r"(?:would|will) you be able to|teach me|show me|remind me|"
    # an imperative that asks a question: "tell me how to gift a subscription" asks "how to gift a subscription"
    # (not where "you" follows: "tell me how old you are" asks about the assistant, not "how old am i")
    r"(?:tell (?:me|us)|explain(?: to (?:me|us))?|describe)(?= (?:how|what|why|when|where|which|who)\b)"
    r"(?!.*\byou(?:r|rs|rself)?\b)|"
    r"(?:(?:could|can|would|will) you (?:please |kindly )?)?help (?:me|us)(?: to)?"
    r"(?: figure out| understand| work out| find out| learn| know)?(?= (?:how|what|why|when|where|which|who)\b)"
    r"(?!.*\byou(?:r|rs|rself)?\b)|"
    # advice on doing something asks how to do it ("give me some tips for packing light" / "how do i pack light"),
    # advice on a thing does not ("give me some tips for the bar exam" / "what is the bar exam"); a request for
    # advice that ends its clause only frames the question after it
    r"give (?:me|us) (?:some |a few |any |a couple of )?(?:tips|advice|instructions|pointers|suggestions|(?:the )?steps)"
    r"(?: to(?= [a-z]+)| (?:for|on|about)(?=" + _DOING + r")|$))\b"
)

# Prepositions mark a content word's role ("from X to Y"): a phrase that moves takes its preposition along, a role
# reversal leaves the prepositions where they were and swaps the words. Variants of one relation share a name.
RELATIONS = {"to": "to", "into": "to", "onto": "on", "toward": "to", "towards": "to", "of": "of", "for": "for",
              "in": "in", "inside": "in", "within": "in", "on": "on", "upon": "on", "at": "at", "by": "by",
              "about": "about", "as": "as", "with": "with", "from": "from", "than": "than", "vs": "vs",
              "versus": "vs", "via": "via", "per": "per", "through": "through", "before": "before", "after": "after",
              "during": "during", "since": "since", "until": "until", "above": "above", "below": "below",
              "under": "under", "over": "over", "between": "between", "against": "against", "using": "with"}  # fmt: skip
# The prepositions that spell out a compound's modifier ("deficiency symptoms" / "symptoms of a deficiency"), and
# none that gives a direction or a comparison ("to", "from", "than").
COMPOUND_RELATIONS = frozenset(("of", "for", "in", "on", "at", "with", "about"))
POSSESSIVE = "'s"  # the token a possessive leaves after its owner ("my mother's" -> "my", "mother", "'s")
# Words between a preposition and its noun that keep the attachment ("in my old car", "of the")
_DETERMINERS = frozenset(_words("a an the my your our their his her its this that these those"))
# Adverbs that focus a preposition's object and keep the attachment ("with just my eyes", "for only a week")
_FOCUS = frozenset(_words("just only even almost nearly roughly"))
# A "you" right after these is asked about ("how old are you", "what is your name"), not generic
_BE = frozenset(_words("is are was were am"))
NEGATIONS = frozenset(("not", "never", "no", "without", "nor", "neither"))
# The tense an auxiliary gives the question ("did you need" / "do you need")
_TENSE = {"did": "past", "was": "past", "were": "past", "do": "present", "does": "present", "is": "present",
          "are": "present", "am": "present", "will": "future"}  # fmt: skip
# What a modal asks: whether one may or can, whether one should, whether one must ("how much can i borrow" / "how
# much should i borrow")
_MODALS = {"can": "may", "could": "may", "may": "may", "might": "may", "should": "should", "ought": "should",
           "must": "must"}  # fmt: skip
# What one asks the assistant to do ("could you suggest")
_REQUESTS = frozenset(_words("tell explain describe give show say help recommend suggest let list name provide share "
                             "advise teach remind write"))
# What a question word asks; "what" and "which" ask for anything ("what causes" = "why"), so they are not kinds.
_WH = frozenset(_words("what which who whom whose when where why how"))
_ASKS = {"why": "why", "when": "when", "where": "where", "who": "who", "whom": "who", "whose": "who"}
_HOW_QUANTITY = frozenset(("many", "much"))
# Conjunctions that open a clause: "if my flight is cancelled, do i get a refund" = "do i get a refund if my flight
# is cancelled"; "when" only where no auxiliary follows ("when my baby is teething", not "when is the best time")
_AUXILIARIES = frozenset(_words("do does did can could should would will shall may might must is are was were am has have had"))
# what a keyword query leaves out: pronouns, articles, auxiliaries and prepositions ("to" only after a question
# word, "how to": an infinitive)
_GRAMMAR = (FUNCTION_WORDS | frozenset(RELATIONS)) - frozenset(_words("what which who whom whose when where why how to"))
_SUBORDINATORS = frozenset(_words("if when whenever while because since unless although though once"))
# A request verb that opens an imperative asks what "what are" asks ("list the seven continents", "name the planets")
_REQUEST_VERBS = frozenset(_words("list name enumerate"))
# Who takes part, by person: "i rear end someone" / "someone rear ends me" swap roles with the same words
_PERSONS = {w: 1 for w in _words("i me my mine myself we us our ours ourselves")} | {
    w: 2 for w in _words("you your yours yourself yourselves")
} | {w: 3 for w in _words("he him his himself she her hers herself they them their theirs someone somebody anyone "
                          "anybody everyone everybody")}  # fmt: skip
# what only a sentence has: articles and other determiners, pronouns, auxiliaries, question words
_SENTENCE = _DETERMINERS | frozenset(_PERSONS) | _AUXILIARIES | _WH | frozenset(("it",))
# Right after "how", these words ask for a manner or a means ("how do i", "how to", "how can"), not a degree
_HOW_MANNER = frozenset(_words("do does did can could should would will to is are was were am i you we they it"))


@dataclass(frozen=True)
class Word:
    text: str  # lower case, a WordNet collocation joined by "_" ("get_rid_of")
    key: str  # what equal words share: the normalised stem (inflection aside)
    attach: str | None  # the preposition that introduces it, None after a verb, a wh-word...
    fixed: bool  # a number or a closed-class word that changes the question: only the same word stands for it
    past: bool = False  # a verb's past form or participle ("cooked", "ran"): a present form does not stand for it
    degree: bool = False  # the property a "how" question asks about ("how deep"): only one sense stands for it
    gap: bool = False  # a closed-class word stands between it and the content word before ("track *my* order")
    lead: bool = False  # right after the question word, its subject ("what *eats* a fox", not "what does a fox eat")
    grade: str = ""  # an adjective's or adverb's comparative ("comparative") or superlative ("superlative") form
    owner: bool = False  # a possessor: "mother" in "my mother's sister" (the sister is hers)

    @property
    def preposition(self) -> str | None:
        """`attach` if a preposition introduces the word; None after a question word or a clause's conjunction."""
        return None if self.attach in ("wh", "clause") else self.attach


@dataclass(frozen=True)
class Content:
    words: tuple[Word, ...]  # content words in order
    negations: int
    tenses: frozenset[str] = frozenset()  # of the auxiliaries
    modals: frozenset[str] = frozenset()  # what the modals ask: may, should, must
    asks: frozenset[str] = frozenset()  # the kinds of question words: why, when, where, who, quantity, manner
    keywords: bool = False  # no preposition, no question word: a keyword query ("lawn brown patches")
    # the persons taking part, each with the content word it stands before (len(words): at the end): "i rear end
    # someone" = {(1, 0), (3, 1)}, "someone rear ends me" = {(3, 0), (1, 1)}
    persons: frozenset[tuple[int, int]] = frozenset()
    # no article, pronoun, auxiliary or question word, prepositions allowed: a search-box query ("python sort
    # dictionary by value", "android phone stuck in boot loop fix")
    telegraphic: bool = False
    # "or" (or "vs") offers a choice; "and" joins: "can i take tylenol and advil" / "tylenol or advil"
    choice: bool = False
    joined: bool = False
    # "you", "your" or "yours" right after a form of "be" ("how old are you", "what is your name"): the assistant,
    # never a generic "you"
    addressed: bool = False


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


def _letter(raws: list[str], k: int) -> str:
    """raws[k] as the chat word a single letter spells, where its neighbours make it one; else as it is."""
    word = raws[k]
    if word not in _LETTERS:
        return word
    before, after = raws[k - 1] if k else "", raws[k + 1] if k + 1 < len(raws) else ""
    if word == "y":  # "y is my wifi so slow", "y cant i sleep": a clause's first word, then a verb
        spelled = not before and (after in _AUXILIARIES or after.endswith("nt") or after in _CHAT)
    elif word == "r":  # "how r u", "what r the best", "r there any": after a question word, before a subject
        spelled = before in _WH or after in _LETTERS or after in _PERSONS or after in ("there", "the", "these", "those")
    else:  # "can u", "sorry to bother u", "how long u cook": you, unless something names the letter ("the u", "is u")
        spelled = before not in _DETERMINERS and before not in ("is", "was", "letter", "variable", "vector", "matrix")
    return _LETTERS[word] if spelled else word


def _expand(raw: str) -> list[str]:
    """One token in its full form: contractions and chat spellings spelled out ("don't" -> "do not")."""
    if raw in _CHAT:
        return _CHAT[raw].split()
    if raw in _IRREGULAR_NOT:
        return _IRREGULAR_NOT[raw].split()
    if raw.endswith("n't"):
        return [raw[:-3], "not"]
    for suffix, full in _CONTRACTED.items():
        if raw.endswith(suffix):
            return [raw[: -len(suffix)], full]
    if raw.endswith("'s"):
        head = raw[:-2]
        return [head, "us"] if head == "let" else [head, "is"] if head in _IS_CONTRACTED else [head, POSSESSIVE]
    return [raw]


def _discourse(clause: list[str]) -> bool:
    """A clause that only greets, thanks, apologises or hedges ("hope everyone's doing well")."""
    return any(w in _DISCOURSE_MARKERS for w in clause) and all(
        w in _DISCOURSE_MARKERS or w in _DISCOURSE_HEDGES or w in FUNCTION_WORDS or w == POSSESSIVE for w in clause
    )


def _tokens(text: str) -> list[str]:
    """The words of a question in their full forms, request frames, discourse clauses and an opening request verb
    ("list the planets" = "what are the planets") left out."""
    clauses = []
    text = text.lower().replace("’", "'")
    for pattern, full in _SPELLINGS:
        text = pattern.sub(full, text)
    for part in _CLAUSE.split(text):
        raws = _WORD.findall(part)
        expanded = " ".join(w for k in range(len(raws)) for w in _expand(_letter(raws, k)))
        for pattern, full in _PERIPHRASES:
            expanded = pattern.sub(full, expanded)
        words = _FRAMES.sub(" ", expanded).split()
        if words:  # a courtesy clause is one before or after its frames go ("i would appreciate your advice")
            clauses.append((words, _discourse(words) or _discourse(expanded.split())))
    kept = [c for c, courtesy in clauses if not courtesy] or [c for c, _ in clauses]
    words = [w for c in kept for w in c]
    if len(words) > 2 and words[0] in _REQUEST_VERBS and words[1] not in RELATIONS:
        words = words[1:]
    if _COMPARED & set(words):  # "ionic vs covalent bond difference" names what "the difference between ionic and
        words = ["and" if w in ("vs", "versus") else w for w in words]  # covalent bonds" compares
    return words


def _asks_you(tokens: list[str], i: int) -> bool:
    """The modal before tokens[i] asks the assistant for something ("could you please suggest", "can you let me
    know"): a request, not a question about whether one may or should."""
    rest = [t for t in tokens[i : i + 4] if t not in ("please", "kindly", "just")]
    # (a request frame already removed leaves "could you please" before the question: "... when i should switch")
    return rest[:1] == ["you"] and (len(rest) == 1 or rest[1] in _REQUESTS or rest[1] in _WH)


def _addressed(tokens: list[str], i: int) -> bool:
    """tokens[i - 1] is the assistant or the asker inside a request to the assistant ("could *you* please help
    *me*", "would *you* be so kind as to tell *me*"): no person the question is about."""
    word, before = tokens[i - 1], tokens[i - 2] if i >= 2 else ""
    if word == "you":
        return before in _MODALS or before in ("would", "will")
    return word in ("me", "us") and before in _REQUESTS and not _helps_someone(tokens, i - 1)


def _helps_someone(tokens: list[str], i: int) -> bool:
    """tokens[i - 1] is "help" said of someone other than the assistant: "how to help my mom", "how can my mom help
    me" (a content word: who helps whom is the question), not "can you help me", "help me find" or "pls help" (a
    request)."""
    return tokens[i - 1] == "help" and i > 1 and "you" not in tokens[max(0, i - 4) : i - 1] and tokens[i - 2] != "please"


def _past(word: str, lex: Lexicon | None) -> bool:
    """A verb's past form or participle: "-ed" on a verb stem, or an irregular past WordNet lists ("ran")."""
    if lex is None:
        return word.endswith("ed") and len(word) > 4
    return lex.is_past(word)


def content(text: str, lex: Lexicon | None = None) -> Content:
    """The content words of a question, each with the preposition that introduces it, and the grammar that changes
    what it asks: negations, the auxiliaries' tense and the kinds of question words."""
    tokens = _tokens(text)
    out: list[Word] = []
    negations = 0
    tenses: set[str] = set()
    modals: set[str] = set()
    asks: set[str] = set()
    persons: set[tuple[int, int]] = set()
    attach: str | None = None
    gap = False  # a closed-class word was skipped since the last content word
    asker: int | None = None  # where an infinitive after a question word ("how to") implies the asker
    read_to = 0  # the token index just past the last content word read
    i = 0
    while i < len(tokens):
        word = tokens[i]
        i += 1
        if word in NEGATIONS:
            negations += 1
            continue
        if word == POSSESSIVE:  # "my mother's sister" is not "the mother of my sister": the owner is marked
            if out and read_to == i - 1:  # the word right before it is the owner ("someone's number" marks nothing)
                out[-1] = replace(out[-1], owner=True)
            continue
        # after an article a pronoun's spelling names a thing ("the us"): a content word
        thing = word in _PERSONS and i >= 2 and tokens[i - 2] in ("the", "a", "an")
        if word in _PERSONS and not thing and not _addressed(tokens, i):
            persons.add((_PERSONS[word], len(out)))
        if word in _TENSE:
            tenses.add(_TENSE[word])
        if word in _MODALS and not _asks_you(tokens, i):
            modals.add(_MODALS[word])
        follower = tokens[i] if i < len(tokens) else ""
        if word in _SUBORDINATORS and (word != "when" or (follower not in _AUXILIARIES and follower != "to")):
            attach = "clause"  # "if my flight is cancelled, ...": the clause moves with its conjunction
            continue
        if word in _ASKS:
            asks.add(_ASKS[word])
        if word in _WH:
            attach = "wh"  # the question phrase moves as one ("how to find the area" / "area ... how to find")
        if word == "how" and i < len(tokens):
            follower, then = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
            # "how long does", "how long an nba game lasts" (a determiner or a person next), "how often adults get"
            # (an adverb or adjective with no other reading): a degree; "how people live": a manner
            degree = follower.isalpha() and follower not in _HOW_QUANTITY | _HOW_MANNER | _SUBORDINATORS and (
                then in _HOW_MANNER or not then or then in _DETERMINERS or then in _PERSONS
                or (lex is not None and lex.modifier_only(follower))
            )  # fmt: skip
            asks.add("quantity" if follower in _HOW_QUANTITY else "degree" if degree else "manner")
            if degree:  # "how deep" / "how big": the property asked about
                out.append(Word(follower, _unify(stem(follower)), None, False, degree=True))
                i += 1
                continue
        if word == "to" and i >= 2 and tokens[i - 2] in ("how", "way", "ways", "what", "where", "when", "who"):
            asker = len(out)  # "how to gift it to someone" asks what "how do i gift it to someone" does
            tenses.add("present")  # and not what "how did i get home" asks
            continue  # "how to fix": an infinitive, not a preposition
        if word == "between" and i >= 2 and tokens[i - 2] in _COMPARED:
            continue  # "the difference between x and y" = "x and y difference": no range, a comparison
        if word in RELATIONS:
            attach = RELATIONS[word]
            if word not in MEANING_WORDS:
                continue
        if word in MEANING_WORDS or word[:1].isdigit() or not word.isalpha() or not _VOWEL.search(word):
            # numbers, symbols and vowel-less abbreviations ("https", "sql"): no inflection, only themselves
            out.append(Word(word, _ONE_MEANING.get(word, word), attach if word not in RELATIONS else None, True))
            read_to = i
            if word not in RELATIONS:
                attach = None
            continue
        if word in FUNCTION_WORDS and not thing and not _helps_someone(tokens, i):
            gap = True
            if word not in _DETERMINERS and word not in _FOCUS and attach not in ("clause", "wh"):
                attach = None  # (a clause's or question's mark reaches its first content word: "if i do not have")
            continue
        lead = attach == "wh" and i >= 2 and tokens[i - 2] in _WH
        if lex is not None and i + 1 < len(tokens) and tokens[i] == POSSESSIVE:  # "ohm's law", "avogadro's number"
            for name in (f"{word}'s_{tokens[i + 1]}", f"{word}_{tokens[i + 1]}"):
                if lex.known(name):
                    word = name
                    i += 2
                    break
        if lex is not None and "_" not in word:  # the longest WordNet collocation here ("get rid of", "jet lag")
            for n in (3, 2):
                if n == 2 and i + 1 < len(tokens) and tokens[i] in RELATIONS and tokens[i + 1] not in RELATIONS:
                    continue  # the preposition heads what follows ("go in the winter"), no particle ("check in at")
                if i - 1 + n <= len(tokens) and lex.known("_".join(tokens[i - 1 : i - 1 + n])):
                    word = "_".join(tokens[i - 1 : i - 1 + n])
                    i += n - 1
                    break
        grade = lex.grade(word) if lex is not None else ""
        out.append(Word(word, _unify(stem(word)), attach, False, _past(word, lex), gap=gap, lead=lead, grade=grade))
        read_to = i
        attach, gap = None, False  # only the word right after a preposition (determiners aside) is its object
    if asker is not None and persons and not {p for p, _ in persons} & {1, 2}:
        persons.add((1, asker))  # only someone else named: the asker is the infinitive's subject
    # a keyword query: content words, perhaps a question word ("order tracking how to"), no other grammar
    keywords = bool(out) and all(t not in _GRAMMAR for t in tokens) and all(w.preposition is None for w in out)
    telegraphic = bool(out) and not any(t in _SENTENCE for t in tokens)
    choice, joined = any(t in ("or", "vs", "versus") for t in tokens), "and" in tokens
    addressed = any(t in ("you", "your", "yours") and k and tokens[k - 1] in _BE for k, t in enumerate(tokens))
    return Content(tuple(out), negations, frozenset(tenses), frozenset(modals), frozenset(asks), keywords,
                   frozenset(persons), telegraphic, choice, joined, addressed)
