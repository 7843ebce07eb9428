"""A rule-based English tokeniser, part-of-speech guesser and noun-phrase chunker (no model).

Used by :class:`~colgraph_engine.kg.extract.PhraseExtractor`. Why rules and not a packaged
model: see that module's docstring. Everything here is ours: the closed-class lexicon, the
verb list (base forms, inflected by rule), the suffix rules and the chunk grammar.

Tags (one per token): ``DET PRON PREP CONJ AUX NEG ADV VERB ADJ NOUN PROPN ACR NUM SYM PUNCT``.

* closed classes (determiners, pronouns, prepositions, conjunctions, auxiliaries) come from the
  lexicon whatever the case, so title-case headings ("Views On China") split at "On";
* a capitalised word is ``PROPN`` unless it opens a sentence (or a title-case line) and its
  lower-case form is a known word; an all-caps word of 2-5 letters, or with a digit, is ``ACR``
  (longer all-caps words are headings and are tagged by their lower-case form);
* lower-case words: known verbs and their inflections are ``VERB`` unless a determiner,
  adjective or preposition comes right before (then the noun reading: "the increase");
  ``-ly`` is ``ADV``, ``-ing``/``-ed`` ``VERB``, adjective suffixes and a list of common
  adjectives ``ADJ``, anything else ``NOUN``.

A noun phrase is a maximal run of ``ADJ``/``NOUN``/``PROPN``/``ACR`` tokens (hyphenated words
are one token), joined through "of"/"&" only between proper names ("Bank of Japan"), broken where
a capitalised word follows a lower-case one, stripped of leading quantifiers ("several", "other")
and trailing adjectives; it must end in a noun, a proper name or an acronym.
"""
from __future__ import annotations

import functools
import re

# -- lexicon ---------------------------------------------------------------------------------------

DET = frozenset("a an the this that these those each every any some no all both either neither another such "
                "its their his her my your our whose what which".split())
PRON = frozenset("i you he she it we they me him us them itself themselves himself herself ourselves yourself "
                 "yourselves who whom whoever something anything nothing everything someone anyone everyone "
                 "nobody there here one ones mine yours hers theirs ours others".split())
PREP = frozenset("of in on at by for with from to into onto over under about between through during before after "
                 "above below across along among amongst around against within without via per than upon toward "
                 "towards beyond despite throughout behind beside besides near since until till unlike like "
                 "including versus vs amid beneath inside outside off out up down".split())
CONJ = frozenset("and or but nor yet whereas while whilst although though because if unless whether as when where "
                 "whenever wherever once so then thus hence therefore however moreover furthermore meanwhile "
                 "otherwise instead also namely i.e. e.g. etc et al".split())
AUX = frozenset("is are was were be been being am has have had having do does did done can could will would may "
                "might must shall should cannot".split())
NEG = frozenset("not never n't no".split())
ADV = frozenset("very more most less least much many few only just even still already often always usually "
                "sometimes again further rather quite too well almost approximately nearly really respectively "
                "now first second third finally currently recently previously especially particularly typically "
                "generally instead together overall directly simply mainly largely mostly highly fully hardly "
                "else ever perhaps maybe yes how why afterward afterwards additionally later thereby".split())
# Words that open a noun phrase without belonging to its name.
QUANTIFIERS = frozenset("other several various same certain many few such own different additional following "
                        "given specific particular respective more most less least much some any all each every "
                        "both various numerous multiple further extra whole entire main major key "
                        # evaluative modifiers that make no name ("relevant information", "new price")
                        "relevant serious scant new general negative positive large small important significant "
                        "good bad great strong weak similar possible necessary available current recent "
                        "previous initial final overall big little enough demonstrated respective likely "
                        "appropriate potential actual typical common usual certain huge vast tiny".split())
COMMON_ADJ = frozenset("new old large small big little high low good bad great best better worse worst long short "
                       "early late recent full free open close easy hard real true false whole major minor key main "
                       "top hot cold warm wide deep strong weak young able likely unlikely similar simple complex "
                       "common rare clear fast slow next last past present own same other general specific public "
                       "private social human local global total final initial basic current previous average "
                       "relative positive negative important possible necessary available different various "
                       "sufficient efficient relevant significant powerful distinct empty due safe ready "
                       "higher lower larger smaller greater fewer newer older earlier later wider longer".split())
# Nouns that the adjective suffix rules would miss-tag.
NOUN_EXCEPTIONS = frozenset("material materials total totals signal signals individual individuals capital potential "
                            "interval intervals proposal proposals rival manual manuals journal journals animal "
                            "animals hospital hospitals arrival approval removal survival terminal terminals "
                            "chemical chemicals professional professionals official officials tutorial tutorials "
                            "initiative initiatives objective objectives executive executives representative "
                            "representatives alternative alternatives native natives relative relatives incentive "
                            "incentives perspective perspectives archive archives narrative narratives public "
                            "republic logic music topic topics traffic graphic graphics metric metrics clinic "
                            "fabric plastic plastics electronics economics statistics analytics physics ethics "
                            "mechanics basis thesis analysis crisis emphasis hypothesis diagnosis chassis "
                            "need needs thing things news series species means".split())
COMMON_NOUNS = frozenset("source sources note notes figure figures table tables chart charts page pages section "
                         "sections chapter appendix abstract introduction conclusion conclusions summary overview "
                         "results result method methods data example examples total question questions answer "
                         "answers background contents index reference references caution warning danger tip "
                         "step steps model models system systems people percent share".split())
GENERIC_NOUNS = frozenset("way ways thing things lot lots part parts kind kinds sort type types case cases fact "
                          "time times number numbers example examples end side order use uses point points place "
                          "item items aspect aspects manner form forms instance instances respect regard list lists "
                          "paper papers option options focus prospects team teams section sections share shares "
                          "category categories image images burden front far search searches version versions level "
                          "levels area areas group groups set sets step steps term terms value values idea ideas "
                          "issue issues problem problems change changes result results information detail details "
                          "page pages line lines note notes others other rest lack basis deal matter matters "
                          "question questions answer answers figure figures table tables termination".split())

_VERB_BASES = (
    "accept achieve act add address adopt affect aim allow analyse analyze answer appear apply argue arise ask "
    "assess assign assume attach attempt avoid base become begin believe belong bring build calculate call cause "
    "change check choose claim classify collect combine come compare complete compute concern conclude conduct "
    "consider consist contain continue contribute control convert create decide decline decrease define "
    "demonstrate depend derive describe design detect determine develop differ display drive drop enable encode "
    "encourage end enhance ensure enter establish estimate evaluate examine exceed exist expand expect explain "
    "explore express extend extract fail fall feel fill find focus follow form gain generate get give go grow "
    "guide happen help hold identify illustrate implement improve include increase indicate influence inform "
    "introduce involve keep know lack lead learn leave let lie limit link list live look lose maintain make "
    "manage mark match mean measure meet mention move need note observe obtain occur offer open operate "
    "outperform own participate pass perform place plan play point prefer prepare present prevent produce "
    "propose protect prove provide publish put rank reach read receive recognize reduce refer reflect regard "
    "relate release rely remain remove replace report represent require respond result retrieve return reveal "
    "run save say see seek seem select sell send serve set share show solve speak spend stand start state stay "
    "store suggest support suppose take talk tell tend test think train transform treat try turn understand use "
    "utilize validate vary verify view want work write yield "
    "accelerate access accommodate accompany accomplish account accumulate acknowledge acquire adapt adjust admit "
    "advance advise advocate afford agree alert align allocate alter amend amount announce anticipate appoint "
    "appreciate approach approve arrange arrive assemble assert assist associate attend attract authorize "
    "benefit bootstrap borrow break capture carry celebrate charge cite clarify clean close coach commit "
    "communicate compete comply comprise concentrate confirm connect consult consume cooperate coordinate "
    "correct correspond cost count cover cross deal declare deliver deny deploy deposit deserve destroy "
    "diagnose dismiss distinguish distribute divide donate double download earn edit educate elect eliminate "
    "emerge emphasize employ encounter endanger endorse engage enjoy enroll evolve exclude execute exercise "
    "exhibit experience experiment expire exploit expose facilitate feature finance finish fit fix forecast "
    "foster fund gather grant handle hate hire host hurt ignore impair impose impress incorporate incur "
    "install integrate intend interact interpret invest investigate invite issue join judge justify label "
    "launch license like load locate lower migrate minimize modify monitor motivate navigate negotiate "
    "nominate notify obey occupy order organize outline overcome oversee participate pay permit persuade "
    "pick possess post praise predict preserve press pretend print proceed process procure program "
    "promote prompt pursue qualify query raise realize recall recommend record recover recruit reform "
    "register regulate reinforce reject remind render renew repair repeat reply request rescue research "
    "reserve reside resolve restore restrict resume retain retire review revise reward rise schedule score "
    "search secure shape shift sign simulate sort specify spread stress strive submit succeed suffer supply "
    "surround survive suspend sustain switch target teach terminate thank track trade transfer translate "
    "travel undergo undertake update upgrade urge vote wait warn wear welcome win wish withdraw worry").split()
_IRREGULAR = frozenset("made done given taken shown seen known found built held led left met paid said sent set told "
                       "brought bought thought became began begun came went gone grown kept ran run written wrote "
                       "chosen chose drawn drew driven drove fell fallen got gotten spent won lost put cut read "
                       "gave took saw knew grew meant felt stood understood sold became rose risen undertaken undertook "
                       "overseen undergone withdrawn broke broken paid spread hurt".split())


def _inflections(base: str) -> set[str]:
    out = {base}
    if base.endswith("e"):
        out |= {base + "s", base + "d", base[:-1] + "ing"}
    elif base.endswith("y") and base[-2:-1] not in set("aeiou"):
        out |= {base[:-1] + "ies", base[:-1] + "ied", base + "ing"}
    elif base.endswith(("s", "sh", "ch", "x", "z")):
        out |= {base + "es", base + "ed", base + "ing"}
    else:
        out |= {base + "s", base + "ed", base + "ing"}
        if re.fullmatch(r"[^aeiou]*[aeiou][bdgmnprt]", base):  # stop -> stopped
            out |= {base + base[-1] + "ed", base + base[-1] + "ing"}
    return out


VERBS = frozenset(w for b in _VERB_BASES for w in _inflections(b)) | _IRREGULAR
CLOSED = {**{w: "DET" for w in DET}, **{w: "PRON" for w in PRON}, **{w: "PREP" for w in PREP},
          **{w: "CONJ" for w in CONJ}, **{w: "AUX" for w in AUX}, **{w: "NEG" for w in NEG}}
CLOSED["that"] = "CONJ"  # "shows that ..." is more common in documents than "that model"
CLOSED["no"] = "DET"
NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten eleven twelve twenty thirty forty fifty "
                         "hundred dozen half".split())
MONTHS = frozenset("january february march april may june july august september october november december "
                   "jan feb mar apr jun jul aug sep sept oct nov dec".split())
UNITS = frozenset("percent per cent percentage points point pp % $ € £ ¥ usd eur gbp million millions billion "
                  "billions thousand thousands trillion kg g mg km m cm mm nm µm um mi ft inch inches lb lbs oz "
                  "ml l liter liters litre litres kwh wh kw w mw gw v mv a ma mah hz khz mhz ghz gb mb kb tb "
                  "bit bits byte bytes ms s sec secs second seconds min mins minute minutes h hr hrs hour hours "
                  "day days week weeks month months year years x times °c °f c f degrees dpi px pixels k m bn "
                  "people respondents adults users students employees pages tokens".split())
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")
_ATTACHED_UNITS = UNITS - _LETTERS
_CITATION_YEAR = re.compile(r"(1[5-9]|20)\d\d[a-z]")
_DOMAIN = re.compile(r"\.(com|org|net|gov|edu|io|int)\b")
_ADJ_SUFFIX = ("al", "ive", "ous", "ful", "able", "ible", "ic", "less", "ary", "ish", "ian", "ical")

# -- tokens ------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(
    r"(?:https?://|www\.)[^\s<>\"]*[^\s<>\".,;:)]|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # URLs, e-mail addresses
    r"|[A-Za-z][\w-]*\.(?:com|org|net|gov|edu|io|int)\b(?:/[^\s<>\"]*[^\s<>\".,;:)])?"  # bare domains
    r"|(?<![\w.])[A-Za-z][a-z]{3,}(?=\d{1,2}\b)"          # a word with a footnote number: Navigation14
    r"|\d+(?:\.\d+)?[A-Za-z]+\b"                         # 3M, 4G, 10ml, 1500S
    r"|['’]s\b"                                       # possessive / contraction 's
    r"|(?:[A-Z]\.){2,}(?:-[A-Za-z]+)?"                   # U.S., E.U., U.S.-China
    r"|[$€£¥]"                                          # currency symbols
    r"|\d+(?:,\d{3})*(?:\.\d+)?(?:[-–]\d+(?:,\d{3})*(?:\.\d+)?)?%?"  # 2,952  37.2%  1-7  2018-2019
    r"|[A-Za-z\u00C0-\u024F](?:[A-Za-z0-9\u00C0-\u024F]|['’](?![sS]\b)(?=\w))*(?:[-/][A-Za-z0-9\u00C0-\u024F]+)*"  # words, GPT-4, in-context
    r"|\S")


class Token:
    """One token: its text, character span ``[start, end)`` in the sentence, tag, and the text
    in lower case (``lower``, computed once: the rules read it many times)."""
    __slots__ = ("text", "start", "end", "tag", "lower")

    def __init__(self, text: str, start: int, end: int, tag: str):
        self.text, self.start, self.end, self.tag, self.lower = text, start, end, tag, text.lower()

    def __repr__(self) -> str:
        return f"Token({self.text!r}, {self.start}, {self.end}, {self.tag!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Token) and (self.text, self.start, self.end, self.tag) == (
            other.text, other.start, other.end, other.tag)

    __hash__ = None


def tokenize(sentence: str) -> list[tuple[str, int, int]]:
    """``sentence -> [(text, start, end)]``, punctuation as one-character tokens."""
    return [(m.group(0), m.start(), m.end()) for m in _TOKEN_RE.finditer(sentence)]


@functools.lru_cache(maxsize=65536)
def _is_acronym(w: str) -> bool:
    letters = [c for c in w if c.isalpha()]
    if not letters:
        return False
    caps = sum(c.isupper() for c in letters)
    has_digit = any(c.isdigit() for c in w)
    if w.endswith("s") and caps == len(letters) - 1 and caps >= 2:  # LLMs, APIs
        return True
    if caps != len(letters):
        # mixed-case technical names with an inner capital or digit: InstructGPT, iPhone, GPT-4o
        return has_digit and caps >= 1 or (caps >= 2 and not w[0].isupper() and len(w) > 2)
    return len(letters) >= 2 and (len(letters) <= 5 or has_digit or "." in w)


@functools.lru_cache(maxsize=65536)
def _lower_tag(low: str) -> str | None:
    """The tag of a word known to the lexicon (any case), else None."""
    if low in CLOSED:
        return CLOSED[low]
    if low in ADV:
        return "ADV"
    if low in VERBS:
        return "VERB"
    if low in COMMON_ADJ:
        return "ADJ"
    return None


@functools.lru_cache(maxsize=65536)
def _open_tag(low: str) -> str:
    """The tag of a lower-case open-class word by suffix."""
    if low in NOUN_EXCEPTIONS:
        return "NOUN"
    if (low.endswith("ly") and len(low) > 4) or low.endswith(("ward", "wards")):
        return "ADV"
    if (low.endswith("ing") and len(low) > 5) or (low.endswith("ed") and len(low) > 4):
        return "VERB"
    if low.endswith(_ADJ_SUFFIX) and len(low) > 5:
        return "ADJ"
    return "NOUN"


def tag(sentence: str, title_case: bool | None = None, lower_words=frozenset(), names=frozenset()) -> list[Token]:
    """Tokens of one sentence with their tags (rules in the module docstring).

    Args:
        sentence: one sentence or line.
        title_case: treat capitalised words as ordinary words (a heading in title case); None
            decides by the sentence itself (at least 4 words, 80% of them capitalised).
        lower_words: words the whole text has in lower case; a capitalised opener among them is
            a common word ("Highlights", "Results").
        names: lower-cased words the text has capitalised inside a sentence; an opener among
            them is a proper name even when it looks like a plural noun.
    """
    raw = tokenize(sentence)
    words = [t for t, _, _ in raw if t[0].isalpha()]
    if title_case is None:
        caps = [w for w in words if w[0].isupper() and w.lower() not in CLOSED]
        content = [w for w in words if w.lower() not in CLOSED]
        title_case = len(content) >= 4 and len(caps) >= 0.8 * len(content)
    out: list[Token] = []
    first_word = True
    for k, (text, start, end) in enumerate(raw):
        low = text.lower()
        c = text[0]
        if _CITATION_YEAR.fullmatch(text):
            t = "NUM"  # a citation year: 2022a
        elif c.isdigit() and text[-1].isalpha():
            t = "NUM" if low.lstrip("0123456789.") in _ATTACHED_UNITS else "ACR"  # 10ml | 3M, 4G
        elif c.isdigit() or low in NUMBER_WORDS or low.split("-")[0] in NUMBER_WORDS:
            t = "NUM"
        elif "://" in text or text.startswith("www.") or "@" in text or _DOMAIN.search(low):
            t = "URL"
        elif low in ("'s", "’s"):
            t = "POS"
        elif c in "$€£¥%":
            t = "SYM"
        elif not c.isalpha():
            t = "PUNCT"
        elif text == "US":
            t = "ACR"  # the country, not the pronoun
        elif low in CLOSED:
            t = CLOSED[low]
        elif _is_acronym(text) and not (text.isupper() and title_case and _lower_tag(low)):
            t = "ACR"
        elif c.isupper():
            known = _lower_tag(low)
            if text.isupper() and len(text) > 1:
                # an all-caps word among all-caps words is a heading word; alone, a name (QACHECK)
                t = known or (_open_tag(low) if _caps_neighbour(raw, k) else "ACR")
            elif first_word or title_case:
                # an opener or a title word that the lexicon knows, or that has a verb/adverb form
                t = known or ("PROPN" if not first_word else _opener_tag(low, lower_words, names))
            else:
                t = "PROPN"
        else:
            t = _lower_tag(low) or _open_tag(low)
        if t == "VERB" and out and (out[-1].tag in ("DET", "ADJ", "POS") or out[-1].tag == "PREP"
                                    and out[-1].lower != "to") \
                and not text.endswith(("ing", "ed")) and low not in _IRREGULAR:
            t = "NOUN"  # "the increase", "in support"
        if (out and out[-1].tag == "VERB" and out[-1].text.endswith("ing") and out[-1].text[0].islower()
                and t in ("NOUN",) and c.islower() and len(out) > 1 and out[-2].tag in ("NOUN", "ADJ")):
            out[-1] = Token(out[-1].text, out[-1].start, out[-1].end, "NOUN")  # "in-context learning ability"
        if c.isalpha():
            first_word = False
        elif text in ":;\"“(" or text in "•·>":
            first_word = True
        out.append(Token(text, start, end, t))
    for k, t in enumerate(out):  # -ing forms inside a noun phrase: "the learning rate", "in-context learning"
        if t.tag == "VERB" and t.text.endswith("ing") and t.text[0].islower() and k > 0:
            nxt = out[k + 1].tag if k + 1 < len(out) else "END"
            prev = out[k - 1]
            if (prev.tag == "DET" and nxt == "NOUN") or (
                    (prev.tag == "ADJ" or prev.tag == "NOUN" and "-" in prev.text) and nxt not in ("DET", "PRON")):
                out[k] = Token(t.text, t.start, t.end, "NOUN")
    for k in range(len(out) - 1):  # "rights concerns are", "process uses": a verb form before these is a noun
        t = out[k]
        if t.tag == "VERB" and not t.text.endswith(("ing", "ed")) and t.lower not in _IRREGULAR and k > 0 \
                and out[k - 1].tag in ("NOUN", "PROPN", "ADJ") and (out[k + 1].tag == "AUX" or out[k + 1].tag == "VERB" and out[k + 1].text[0].islower()):
            out[k] = Token(t.text, t.start, t.end, "NOUN")
    return out


def _caps_neighbour(raw, k: int) -> bool:
    for q in (k - 1, k + 1):
        if 0 <= q < len(raw) and raw[q][0][0].isalpha() and raw[q][0].isupper() and len(raw[q][0]) > 1:
            return True
    return False


def _opener_tag(low: str, lower_words=frozenset(), names=frozenset()) -> str:
    """A capitalised first word unknown to the lexicon: a common word when the text also has it
    in lower case or the noun lexicon knows it; a name when the text also has it capitalised
    inside a sentence; else by shape: verb/adverb/adjective suffixes ("Using", "Derived"), a
    plural ("Quotations"), or a proper name."""
    if low in lower_words or low in COMMON_NOUNS:
        return _open_tag(low)
    if low in names:
        return "PROPN"
    t = _open_tag(low)
    if t in ("VERB", "ADV", "ADJ") or (low.endswith("s") and not low.endswith("ss") and len(low) > 4):
        return t
    return "PROPN"


# -- chunks ------------------------------------------------------------------------------------------

_NP_TAGS = frozenset({"ADJ", "NOUN", "PROPN", "ACR"})
_HEADS = frozenset({"NOUN", "PROPN", "ACR"})
_BREAKERS = COMMON_ADJ | VERBS
_NAME_JOINERS = frozenset({"of", "&", "de", "la", "von", "van", "der", "del", "du", "da"})


def noun_phrases(tokens: list[Token], max_words: int = 6) -> list[tuple[int, int]]:
    """Noun-phrase spans ``(i, j)`` (token indices, j exclusive) in order of appearance.

    Runs longer than `max_words` words are not phrases (lists and headings run together)."""
    spans: list[tuple[int, int]] = []
    i, n = 0, len(tokens)
    while i < n:
        if tokens[i].tag not in _NP_TAGS:
            i += 1
            continue
        j = i + 1
        while j < n:
            t, prev = tokens[j], tokens[j - 1]
            if t.tag in _NP_TAGS:
                if t.tag in ("PROPN", "ACR") and prev.tag in ("NOUN", "ADJ") and prev.text[0].islower():
                    break  # "rights Lack": a capitalised word after a lower-case one starts a new name
                if sentence_gap(tokens, j):
                    break
                if (t.tag == "PROPN" and prev.tag == "PROPN" and t.lower in _BREAKERS
                        and not t.text.isupper()):
                    break  # "Economy High growth": a known common word starts a new label
                j += 1
            elif (t.text == "." and len(prev.text) == 1 and prev.text.isupper() and j + 1 < n
                  and tokens[j + 1].tag == "PROPN" and tokens[j + 1].start == t.end + 1):
                j += 2  # an initial: "Adam N. Smith"
            elif (t.lower in _NAME_JOINERS and prev.tag in ("PROPN", "ACR") and j + 1 < n
                  and tokens[j + 1].tag in ("PROPN", "ACR")):
                j += 2
            else:
                break
        k0, k1 = i, j
        while k0 < k1 and (tokens[k0].lower in QUANTIFIERS or tokens[k0].tag == "ADJ" and k1 - k0 == 1):
            k0 += 1
        while k1 > k0 and tokens[k1 - 1].tag not in _HEADS:
            k1 -= 1
        if k1 > k0 and k1 - k0 <= max_words:
            spans.append((k0, k1))
        i = j
    return spans


def sentence_gap(tokens: list[Token], j: int) -> bool:
    """True when a wide gap (a tab or many spaces in a layout) separates token j from j-1."""
    return tokens[j].start - tokens[j - 1].end > 2


__all__ = ["Token", "tag", "tokenize", "noun_phrases", "VERBS", "CLOSED", "MONTHS", "UNITS", "GENERIC_NOUNS"]
