"""C_vis(q): deterministic visual phrases extracted from a question.

ColGraphRAG ranks the images attached to the retrieved subgraph by late-interaction MaxSim of
the token vectors of *visual phrases* ``C_vis(q)`` against the images' units. The paper says
that these phrases come from deterministic templates over entity, temporal and visual cues;
it does not publish the templates, so every rule below is the engine's own choice. The
extraction is pure Python (no model, no network) and deterministic: the same question always
gives the same cues and phrases in the same order.

:func:`extract_visual_phrases` runs the steps below in this order. A character claimed by an
earlier step is never reused by a later one, so cues never overlap. Offsets (``start``) index
the question exactly as given; cue and phrase texts are whitespace-normalised (runs of
whitespace become one space).

1. **Quoted titles** (kind ``"entity"``): text between ``"..."``, ``“...”``, ``«...»``,
   ``'...'`` or ``‘...’`` on one line, at most 200 characters inside. A single (straight or
   curly) quote opens only when it is not preceded by a letter or digit, is followed by a
   non-space and is not directly before a decade (``'70s``); it closes only when preceded by
   a non-space and not followed by a letter or digit; an apostrophe between two letters or
   digits (``'Don't Look Back'``) does not close. The cue text is the inner text without the
   quotes and ``start`` is the offset of its first character. Where two quotes overlap the
   earlier-starting, then longer, one wins. Nothing inside a quote is read again.

2. **Temporal cues** (kind ``"temporal"``). Month names must be capitalised: the full names
   (January ... December) or the abbreviations Jan, Feb, Mar, Apr, Jun, Jul, Aug, Sep, Sept,
   Oct, Nov, Dec with an optional dot. A year is 1000-2099 written as four digits and not
   glued to other letters, digits, ``$#£€`` or a digit group (``1,976`` and ``1976.5`` are
   not years). A day is 1-31 with an optional st/nd/rd/th. Recognised forms:

   * ISO dates ``1976-03-03``; numeric dates ``03/03/1976`` or ``3/3/1976`` (both parts
     1-31, at least one of them at most 12; the day/month order is not decided);
   * ``March 3, 1976``, ``March 3rd 1976``, ``3 March 1976``, ``3rd of March, 1976``;
   * a month with a day but no year (``March 3``, ``3 March``) and a month with a year
     (``March 1976``, ``March of 1976``);
   * a full month name alone (``in June``), except ``May``, which is a temporal cue only
     with a day or a year (``May 1976``), since alone it is mostly the modal verb;
   * decades ``1970s`` and ``'70s``/``’70s``, optionally led by ``early``/``mid``/``late``
     (``mid-1970s``); a bare two-digit decade or a decade word only after "the"
     (``the 70s``, ``the seventies``; the cue text leaves out "the");
   * centuries with a digit or word ordinal: ``19th century``, ``the nineteenth century``,
     ``twenty-first century``, optionally led by ``early``/``mid``/``late``;
   * a season with a year: ``summer 1976``, ``fall of 1976`` (a season alone is not a cue);
   * any other year.

   Four-digit numbers 1000-2099 are always read as years, so "2000 people" gives the year
   2000, not a count (write "2,000 people" for a count). Where forms overlap the
   earlier-starting, then longer, match wins (``March 3, 1976`` is one cue, not three).

3. **Tokens.** The rest of the question is split into words (letters and digits, joined by
   inner apostrophes, hyphens or ``&``: ``Rocky's``, ``Coca-Cola``, ``AT&T``), dotted
   acronyms (``U.S.``), the abbreviations Mr. Mrs. Ms. Dr. St. Jr. Sr. Prof. Mt. Ft. with
   their dot, digit groups (``1,500``) and a lone ``&``. A trailing ``'s``/``’s`` is a
   possessive and is left out of every cue and phrase text (``Rocky's`` reads ``Rocky``).

4. **Entity cues** (kind ``"entity"``): runs of capitalised words. A word is capitalised
   when its first letter is upper case or, camel-case brands like ``iPhone``, when an upper
   case letter follows a lower-case first letter. A capitalised word in the stop list
   (question and function words such as What, Which, Who, How, Is, In, The, A, This, Name,
   Describe, According; see ``_STOP``) is never part of an entity, wherever it stands, so a
   sentence-initial question word is never taken. A run is one or more capitalised words
   separated by whitespace only, and may hold the connectors of, the, de, du, des, da, del,
   della, di, la, le, von, van, der, den, and, y, & (in any case) between two capitalised
   words, never at its ends (``Bank of America``, ``Lord of the Rings``); so "Rocky and
   Apollo Creed" is one entity (a comma separates: "Rocky, and Apollo Creed"). A possessive
   word ends its run. A run is kept only when it holds at least one capitalised word that is not
   a lexicon word (a colour, intensity, position, visual noun, kind noun or number word
   below): ``Red Bull`` and ``Statue of Liberty`` are entities, while a capitalised lexicon
   word alone (``Red cars ...`` at the start of a sentence) is read as that lexicon word. A
   run of a single one-letter word is dropped. All-caps words (``NASA``, ``U.S.``) are
   capitalised words that never count as lexicon words, except in a question without any
   lower-case letter, where every word is upper case and that exception is off. The
   engine has no dictionary, so a capitalised common word outside the stop list (a
   sentence-initial "Photosynthesis") is taken as an entity.

5. **Visual cues** (kind ``"visual"``), over the words not already claimed, in this order:

   * the position phrase ``in front of``;
   * counts: a number (digits or one of two ... twenty, thirty ... ninety, hundred, dozen;
     "one" is left out, being mostly a pronoun), then optional colour groups (as in the
     next item), then one word of letters (hyphens allowed) that is not part of an entity
     and is not a stop word, connector, position, colour, intensity or number word
     (``two people``, ``3 cars``, ``two red flags``); the whole span is one cue;
   * colours, from the fixed list ``_COLOURS`` (red, blue, green, yellow, black, white,
     orange, purple, pink, brown, grey, gray, gold, golden, silver, ...), including hyphen
     compounds (``blue-green``, ``black-and-white``); an intensity word (dark, light,
     bright, pale, deep) directly before a colour and ``and`` or ``&`` between two colours
     join the cue (``dark blue``, ``black and white``);
   * positions: left, right, top, bottom, center, centre, middle, background, foreground,
     upper, lower, behind, corner, and hyphen compounds of them (``bottom-left``);
     adjacent position words form one cue, which also takes a directly following side,
     hand, half or edge (``top left``, ``left side``). Because "left" and "right" are
     often verbs or adjectives, they count only after the, on, to, at, from, far or another
     position word, before side/hand/half/edge/corner, or inside a hyphen compound;
   * visual nouns, from the fixed list ``_VISUAL_NOUNS`` (poster, logo, jersey, chart, map,
     photo, ..., and vehicles such as car and bus), in singular or regular plural
     (-s, -es, -ies), or as the last part of a hyphen compound (``T-shirt``,
     ``movie-poster``).

6. **Visual noun phrases.** Each visual noun not directly followed by another visual noun
   is a head (``poster image`` is one phrase headed by ``image``). From the head the phrase
   extends leftwards over directly adjacent (whitespace only, or a possessive apostrophe
   and whitespace) modifiers: colour, position and count cues, other visual nouns, kind
   nouns (``_KIND_NOUNS``: film, movie, album, book, magazine, team, brand, ...), temporal
   cues and entity cues. ``the 1976 film poster`` gives ``1976 film poster``;
   ``Rocky's red jersey`` gives ``Rocky red jersey``. The phrase text joins the parts' texts
   with single spaces.

7. **Phrases**, in this order, each group in question order:

   1. the combined phrase: the visual noun phrases together with the entity and temporal
      phrases of 7.3 and 7.4, joined by spaces in question order; only made when there are
      at least two such pieces and they hold cues of at least two kinds (entity, temporal,
      visual noun; an entity or year inside a visual noun phrase counts). It comes first
      because it is the one phrase that carries the cues of every kind together;
   2. the visual noun phrases;
   3. the entity phrases, then 4. the temporal phrases: each entity or temporal cue that is
      not inside a visual noun phrase, extended by directly following kind nouns
      (``1976 film``, ``Beatles album``);
   5. the colour, count and position cues not inside a visual noun phrase, as written.

   Phrases are deduplicated case-insensitively (the first one stays) and cut to
   ``max_phrases``. Hence "What sport is associated with the 1976 film shown on this
   poster?" gives ``("1976 film poster", "poster", "1976 film")``.

Bad input raises ``TypeError`` (wrong type) or ``ValueError`` (right type, wrong value);
the message starts with the argument's name.
"""
from __future__ import annotations

import numbers
import re
from dataclasses import dataclass

__all__ = ["VisualCue", "VisualPhrases", "extract_visual_phrases"]

CUE_KINDS = ("entity", "temporal", "visual")

# ---------------------------------------------------------------------------------------------
# Lexicons (lower case). Kept disjoint except where noted, so a word has one lexical reading.

_STOP = frozenset("""
    what which who whom whose where when why how whatever whichever
    is are was were be been being am do does did done can could would should will shall may
    might must has have had having
    in on at by for from to of with without within into onto upon about above below over under
    between among amongst through during before after since until till across along around near
    than then the a an this that these those it its there here
    i me my mine we us our ours you your yours he him his she her hers they them their theirs
    and or but nor not no yes if as so also too very just only even please
    name list give tell identify describe explain find show count determine compare provide
    select choose consider considering given using based according look looking see seen let
    suppose assume imagine answer
    apart besides other another more most less least such same each every all any some many
    much few both either neither one ones thing things
    am pm
    don't doesn't didn't isn't aren't wasn't weren't can't cannot won't wouldn't couldn't shouldn't
    haven't hasn't hadn't
""".split())

_CONNECTORS = frozenset("of the de du des da del della di la le von van der den and y &".split())

_COLOURS = frozenset("""
    red blue green yellow black white orange purple pink brown grey gray gold golden silver
    beige maroon navy teal turquoise violet crimson cyan magenta bronze ivory indigo scarlet
    lavender khaki olive
""".split())

_INTENSITY = frozenset("dark light bright pale deep".split())

_POSITIONS = frozenset("""
    left right top bottom center centre middle background foreground upper lower behind corner
""".split())
_POSITION_TAILS = frozenset("side hand half edge".split())
_LEFT_RIGHT = frozenset(("left", "right"))
_LEFT_RIGHT_BEFORE = frozenset("the on to at from far".split())

_VISUAL_NOUNS = frozenset("""
    poster logo jersey chart map photo photograph picture image diagram figure graph table plot
    screenshot sign flag painting cover label icon banner uniform shirt building statue drawing
    illustration sketch portrait cartoon comic emblem badge symbol crest stamp coin banknote
    card ticket billboard mural sculpture monument tower bridge helmet hat cap dress costume
    mascot trophy medal sticker snapshot thumbnail infographic frame scene patch insignia suit tag cup mug
    car bus truck train airplane aircraft ship boat bicycle motorcycle
""".split())

_KIND_NOUNS = frozenset("""
    film movie album book magazine newspaper novel series show game video song single record
    band team club brand company product model edition issue event festival concert tour
    championship tournament olympics election campaign exhibition race war battle
""".split())

_NUMBER_WORDS = frozenset("""
    two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen
    seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred
    dozen
""".split())


# ---------------------------------------------------------------------------------------------
# Regular expressions.

_ALNUM = r"[^\W_]"  # a letter or digit (Unicode)

_QUOTE_PATTERNS = (
    re.compile(r'"([^"\n]{1,200})"'),
    re.compile(r"“([^”\n]{1,200})”"),
    re.compile(r"«([^»\n]{1,200})»"),
    re.compile(rf"(?<!{_ALNUM})'(?!\d0s(?!\w))(?=\S)((?:[^'\n]|(?<={_ALNUM})'(?={_ALNUM})){{1,200}}?)(?<=\S)'(?!{_ALNUM})"),
    re.compile(rf"(?<!{_ALNUM})‘(?!\d0s(?!\w))(?=\S)((?:[^’\n]|(?<={_ALNUM})’(?={_ALNUM})){{1,200}}?)(?<=\S)’(?!{_ALNUM})"),
)

_FULL_MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
_MONTH = rf"(?:(?:{_FULL_MONTHS})|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.?)(?!\w)"
_BARE_MONTH = r"\b(?:January|February|March|April|June|July|August|September|October|November|December)\b"
_YEAR_CORE = r"(?:1\d{3}|20\d{2})"
_YEAR = rf"(?<![\w$#£€])(?<!\d[.,]){_YEAR_CORE}(?!\w)(?![.,]\d)"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?(?!\w)"
_EML = r"(?:(?:early|mid|late|Early|Mid|Late)[-\s]+)"
_ORDINALS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
             "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
             "twentieth|twenty[-\\s]first")
_DECADE_WORDS = "twenties|thirties|forties|fifties|sixties|seventies|eighties|nineties"

# (pattern, needs numeric-date check). Where a pattern has a group named "t", that group is
# the cue; otherwise the whole match is.
_TEMPORAL_PATTERNS = (
    (re.compile(rf"(?<![\w-]){_YEAR_CORE}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\w-])"), False),
    (re.compile(rf"(?<![\w/])(?P<a>\d{{1,2}})/(?P<b>\d{{1,2}})/{_YEAR_CORE}(?![\w/])"), True),
    (re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}"), False),
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}"), False),
    (re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}"), False),
    (re.compile(rf"\b{_MONTH}\s+{_DAY}"), False),
    (re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}"), False),
    (re.compile(_BARE_MONTH), False),
    (re.compile(rf"\b(?:[Ss]pring|[Ss]ummer|[Aa]utumn|[Ff]all|[Ww]inter),?\s+(?:of\s+)?{_YEAR}"), False),
    (re.compile(rf"(?<![\w'’]){_EML}?(?:1\d|20)\d0s(?!\w)"), False),
    (re.compile(r"(?<!\w)['’]\d0s(?!\w)"), False),
    (re.compile(rf"\b[Tt]he\s+(?P<t>{_EML}?\d0s)(?!\w)"), False),
    (re.compile(rf"\b[Tt]he\s+(?P<t>{_EML}?(?:{_DECADE_WORDS}))\b"), False),
    (re.compile(rf"\b{_EML}?(?:\d{{1,2}}(?:st|nd|rd|th)|{_ORDINALS})[-\s]+century\b", re.IGNORECASE), False),
    (re.compile(_YEAR), False),
)

_TOKEN = re.compile(rf"""
    (?<!{_ALNUM})(?:Mrs|Mr|Ms|Dr|St|Jr|Sr|Prof|Mt|Ft)\.(?=\s|$)   # abbreviation with its dot
  | (?<!{_ALNUM})[A-Z](?:\.[A-Z])+\.?                            # dotted acronym: U.S., U.S.A.
  | (?<!{_ALNUM})\d{{1,3}}(?:,\d{{3}})+(?!\d)                     # digit groups: 1,500
  | {_ALNUM}+(?:['’&-]{_ALNUM}+)*                                 # words
  | &
""", re.VERBOSE)

_DIGITS = re.compile(r"\d{1,3}(?:,\d{3})+|\d+")
_ADJACENT_GAP = re.compile(r"(?:['’]s?)?\s+")  # whitespace, optionally after a possessive apostrophe

_MASK = "\x00"


# ---------------------------------------------------------------------------------------------
# Public data classes.

@dataclass(frozen=True)
class VisualCue:
    """One cue found in a question.

    ``kind`` is ``"entity"``, ``"temporal"`` or ``"visual"``; ``text`` is the span as it
    appears in the question, whitespace-normalised (a quoted title without its quotes, a
    word without a possessive ``'s``); ``start`` is the character offset of the span in
    the question.
    """

    kind: str
    text: str
    start: int

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str):
            raise TypeError(f"kind must be a str, one of {CUE_KINDS}, got {type(self.kind).__name__}")
        if self.kind not in CUE_KINDS:
            raise ValueError(f"kind must be one of {CUE_KINDS}, got {self.kind!r}")
        if not isinstance(self.text, str):
            raise TypeError(f"text must be a str, got {type(self.text).__name__}")
        if not self.text.strip():
            raise ValueError(f"text must contain non-whitespace text, got {self.text!r}")
        if isinstance(self.start, bool) or not isinstance(self.start, numbers.Integral):
            raise TypeError(f"start must be an int >= 0, got {type(self.start).__name__}")
        if self.start < 0:
            raise ValueError(f"start must be an int >= 0, got {self.start}")


@dataclass(frozen=True)
class VisualPhrases:
    """The visual phrases ``C_vis(q)`` of one question.

    ``question`` is the question exactly as given; ``cues`` are the cues in order of
    appearance (by ``start``); ``phrases`` are the composed phrases, deduplicated
    case-insensitively, most informative first (see the module docstring for the order).
    """

    question: str
    cues: tuple[VisualCue, ...]
    phrases: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.question, str):
            raise TypeError(f"question must be a str, got {type(self.question).__name__}")
        if not isinstance(self.cues, tuple) or not all(isinstance(c, VisualCue) for c in self.cues):
            raise TypeError("cues must be a tuple of VisualCue")
        if not isinstance(self.phrases, tuple) or not all(isinstance(p, str) for p in self.phrases):
            raise TypeError("phrases must be a tuple of str")

    @property
    def has_visual_cue(self) -> bool:
        """True when at least one cue of any kind (entity, temporal, visual) was found."""
        return bool(self.cues)

    def text(self) -> str:
        """The string to token-encode: the phrases joined with ``" ; "``, or, when no cue was
        found, the question itself, unchanged."""
        if not self.cues or not self.phrases:
            return self.question
        return " ; ".join(self.phrases)


# ---------------------------------------------------------------------------------------------
# Internals.

def _norm(s: str) -> str:
    return " ".join(s.split())


@dataclass
class _Unit:
    """A token, or a span claimed before tokenisation (quote, temporal) or an entity run."""

    kind: str            # "token" | "quote" | "temporal" | "entity"
    start: int
    end: int             # end of the raw span (possessive suffix included)
    text: str            # text used in cues and phrases
    possessive: bool = False
    # token fields
    lower: str = ""
    lex: str | None = None   # colour | intensity | position | vnoun | kind | number | None
    number: bool = False     # digits or a number word
    role: str = "low"        # cap | conn | low
    lexical_cap: bool = False
    cue: int | None = None   # index of the visual cue this token belongs to
    cue_role: str | None = None


def _singular_in(word: str, vocab: frozenset[str]) -> bool:
    if word in vocab:
        return True
    if word.endswith("ies") and word[:-3] + "y" in vocab:
        return True
    if word.endswith("es") and word[:-2] in vocab:
        return True
    return word.endswith("s") and word[:-1] in vocab


def _lexical(lower: str) -> str | None:
    parts = lower.split("-")
    if lower in _COLOURS or (len(parts) > 1 and all(p in _COLOURS or p == "and" for p in parts)
                             and any(p in _COLOURS for p in parts)):
        return "colour"
    if lower in _INTENSITY:
        return "intensity"
    if lower in _POSITIONS or (len(parts) > 1 and parts[0] in _POSITIONS
                               and all(p in _POSITIONS or p in _POSITION_TAILS for p in parts)):
        return "position"
    if _singular_in(lower, _VISUAL_NOUNS) or (len(parts) > 1 and _singular_in(parts[-1], _VISUAL_NOUNS)):
        return "vnoun"
    if _singular_in(lower, _KIND_NOUNS):
        return "kind"
    if lower in _NUMBER_WORDS:
        return "number"
    return None


def _is_capitalised(word: str) -> bool:
    letters = [c for c in word if c.isalpha()]
    if not letters:
        return False
    if letters[0].isupper():
        return True
    return any(c.isupper() for c in letters[1:])


def _is_acronym(word: str) -> bool:
    letters = [c for c in word if c.isalpha()]
    return len(letters) >= 2 and all(c.isupper() for c in letters)


def _pick(spans: list[tuple[int, int, int, str]]) -> list[tuple[int, int, str]]:
    """Greedy non-overlapping choice: earliest start, then longest, then pattern order."""
    out: list[tuple[int, int, str]] = []
    taken_until = -1
    for start, end, _order, text in sorted(spans, key=lambda s: (s[0], -(s[1] - s[0]), s[2])):
        if start >= taken_until:
            out.append((start, end, text))
            taken_until = end
    return out


def _quotes(q: str) -> list[tuple[int, int, int, str, int]]:
    """[(outer_start, outer_end, inner_start, inner_text, order)]"""
    found = []
    for order, pat in enumerate(_QUOTE_PATTERNS):
        for m in pat.finditer(q):
            inner = m.group(1)
            stripped = inner.strip()
            if not stripped:
                continue
            inner_start = m.start(1) + (len(inner) - len(inner.lstrip()))
            found.append((m.start(), m.end(), order, (inner_start, _norm(stripped))))
    chosen = []
    taken_until = -1
    for start, end, _order, payload in sorted(found, key=lambda s: (s[0], -(s[1] - s[0]), s[2])):
        if start >= taken_until:
            chosen.append((start, end, payload[0], payload[1]))
            taken_until = end
    return chosen


def _temporals(masked: str) -> list[tuple[int, int, str]]:
    spans = []
    for order, (pat, numeric) in enumerate(_TEMPORAL_PATTERNS):
        for m in pat.finditer(masked):
            if numeric:
                a, b = int(m.group("a")), int(m.group("b"))
                if not (1 <= a <= 31 and 1 <= b <= 31 and min(a, b) <= 12):
                    continue
            g = "t" if "t" in pat.groupindex else 0
            start, end = m.start(g), m.end(g)
            spans.append((start, end, order, _norm(masked[start:end])))
    return _pick(spans)


def _mask(s: str, spans) -> str:
    chars = list(s)
    for start, end in spans:
        chars[start:end] = _MASK * (end - start)
    return "".join(chars)


def _tokens(q: str, masked: str, all_caps: bool) -> list[_Unit]:
    out = []
    for m in _TOKEN.finditer(masked):
        text = m.group()
        start, end = m.start(), m.end()
        # "'s" left over after a masked span ("1976's"): a possessive of that span, not a word.
        if text == "s" and start >= 2 and q[start - 1] in "'’" and not q[start - 2].isspace():
            continue
        possessive = len(text) > 2 and text[-2:] in ("'s", "’s")
        base = text[:-2] if possessive else text
        lower = base.lower().replace("’", "'")
        u = _Unit("token", start, end, base, possessive=possessive, lower=lower)
        u.number = bool(_DIGITS.fullmatch(base)) or lower in _NUMBER_WORDS
        u.lex = _lexical(lower)
        acronym = not all_caps and _is_acronym(base)
        if lower in _CONNECTORS:
            u.role = "conn"
        elif _is_capitalised(base) and lower not in _STOP:
            u.role = "cap"
            u.lexical_cap = u.lex is not None and not acronym
        out.append(u)
    return out


def _adjacent(q: str, a: _Unit, b: _Unit) -> bool:
    return bool(_ADJACENT_GAP.fullmatch(q[a.end:b.start]))


def _entity_runs(q: str, toks: list[_Unit]) -> list[tuple[int, int]]:
    """Index ranges [i, j) of accepted entity runs in ``toks``."""
    runs = []
    i, n = 0, len(toks)
    while i < n:
        if toks[i].role != "cap":
            i += 1
            continue
        last = i  # index of the last capitalised word in the run
        while not toks[last].possessive:
            k = last + 1
            while k < n and toks[k].role == "conn" and q[toks[k - 1].end:toks[k].start].isspace():
                k += 1
            if k < n and toks[k].role == "cap" and q[toks[k - 1].end:toks[k].start].isspace():
                last = k
            else:
                break
        run = toks[i:last + 1]
        caps = [t for t in run if t.role == "cap"]
        single_letter = len(run) == 1 and sum(c.isalnum() for c in run[0].text) == 1
        if any(not t.lexical_cap for t in caps) and not single_letter:
            runs.append((i, last + 1))
        i = last + 1
    return runs


def _visual_cues(q: str, units: list[_Unit]) -> list[tuple[int, int, int]]:
    """Mark visual cues on the tokens; return [(first_unit, last_unit_exclusive, cue_id)]."""
    cues: list[tuple[int, int, int]] = []
    n = len(units)

    def free(k: int) -> bool:
        return 0 <= k < n and units[k].kind == "token" and units[k].cue is None

    def adj(k: int) -> bool:  # units[k] and units[k + 1] adjacent
        return k + 1 < n and _adjacent(q, units[k], units[k + 1])

    def claim(i: int, j: int, roles: list[str]) -> None:
        cid = len(cues)
        for k, role in zip(range(i, j), roles):
            units[k].cue, units[k].cue_role = cid, role
        cues.append((i, j, cid))

    # "in front of"
    for i in range(n - 2):
        if all(free(i + d) for d in range(3)) and [units[i + d].lower for d in range(3)] == ["in", "front", "of"] \
                and adj(i) and adj(i + 1):
            claim(i, i + 3, ["position"] * 3)

    def colour_span(i: int) -> int:
        """End (exclusive) of a colour group starting at i ((intensity) colour (and colour)*), or i."""
        k = i
        if free(k) and units[k].lex == "intensity" and adj(k) and free(k + 1) and units[k + 1].lex == "colour":
            k += 1
        if not (free(k) and units[k].lex == "colour"):
            return i
        k += 1
        while (free(k) and units[k].lower in ("and", "&") and adj(k - 1) and adj(k)
               and free(k + 1) and units[k + 1].lex == "colour"):
            k += 2
        return k

    # counts
    for i in range(n):
        u = units[i]
        if not (free(i) and u.number):
            continue
        k = i + 1
        while k < n and adj(k - 1):
            end = colour_span(k)
            if end == k:
                break
            k = end
        w = units[k] if k < n else None
        if (w is not None and free(k) and adj(k - 1) and not w.number
                and w.lower.replace("-", "").isalpha()
                and w.lower not in _STOP and w.lower not in _CONNECTORS
                and w.lex not in ("position", "colour", "intensity", "number")):
            roles = ["number"] + ["colour"] * (k - i - 1) + [w.lex or "noun"]
            claim(i, k + 1, roles)

    # colours
    i = 0
    while i < n:
        end = colour_span(i)
        if end > i:
            claim(i, end, ["colour"] * (end - i))
            i = end
        else:
            i += 1

    # positions
    def position_ok(k: int) -> bool:
        u = units[k]
        if not (free(k) and u.lex == "position"):
            return False
        if u.lower not in _LEFT_RIGHT:
            return True
        prev_ok = k > 0 and adj(k - 1) and units[k - 1].kind == "token" and (
            units[k - 1].lower in _LEFT_RIGHT_BEFORE or units[k - 1].lex == "position")
        next_ok = adj(k) and units[k + 1].kind == "token" and (
            units[k + 1].lower in _POSITION_TAILS or units[k + 1].lower == "corner")
        return prev_ok or next_ok

    i = 0
    while i < n:
        if not position_ok(i):
            i += 1
            continue
        k = i + 1
        while k < n and adj(k - 1) and free(k) and units[k].lex == "position":
            k += 1
        if k < n and adj(k - 1) and free(k) and units[k].lower in _POSITION_TAILS:
            k += 1
        claim(i, k, ["position"] * (k - i))
        i = k

    # visual nouns
    for i in range(n):
        if free(i) and units[i].lex == "vnoun":
            claim(i, i + 1, ["vnoun"])
    return cues


def _walk_role(u: _Unit) -> str | None:
    """What a unit can be inside a visual noun phrase, left of its head; None stops the walk."""
    if u.kind in ("entity", "quote"):
        return "entity"
    if u.kind == "temporal":
        return "temporal"
    if u.cue_role in ("colour", "position", "number", "vnoun"):
        return u.cue_role
    if u.cue_role is not None and u.lex == "vnoun":  # the noun of a count
        return "vnoun"
    if u.lex == "kind":
        return "kind"
    return None


def _is_vnoun(u: _Unit) -> bool:
    return u.kind == "token" and u.lex == "vnoun" and u.cue is not None


def _check_args(question, max_phrases) -> int:
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    if not question.strip():
        raise ValueError(f"question must contain non-whitespace text, got {question!r}")
    if isinstance(max_phrases, bool) or not isinstance(max_phrases, numbers.Integral):
        raise TypeError(f"max_phrases must be an int >= 1, got {type(max_phrases).__name__}")
    if max_phrases < 1:
        raise ValueError(f"max_phrases must be an int >= 1, got {max_phrases}")
    return int(max_phrases)


# ---------------------------------------------------------------------------------------------
# The public function.

def extract_visual_phrases(question: str, *, max_phrases: int = 8) -> VisualPhrases:
    """Extract the visual phrases ``C_vis(q)`` of ``question`` by fixed templates.

    Finds entity, temporal and visual cues and composes them into short phrases; the exact
    rules are in the module docstring. ``max_phrases`` (int >= 1) caps the number of phrases
    kept, dropping from the end of the priority order (combined phrase, visual noun phrases,
    entity phrases, temporal phrases, remaining visual cues). Deterministic: equal input
    gives equal output.

    Raises ``TypeError`` when ``question`` is not a str or ``max_phrases`` is not an int,
    ``ValueError`` when ``question`` is empty or whitespace only or ``max_phrases`` < 1.
    """
    max_phrases = _check_args(question, max_phrases)
    q = question

    # 1. quoted titles
    quotes = _quotes(q)
    masked = _mask(q, [(s, e) for s, e, _, _ in quotes])
    units: list[_Unit] = [_Unit("quote", s, e, text) for s, e, _, text in quotes]
    quote_starts = {s: inner for s, _, inner, _ in quotes}

    # 2. temporal cues
    temporals = _temporals(masked)
    units += [_Unit("temporal", s, e, text) for s, e, text in temporals]
    masked = _mask(masked, [(s, e) for s, e, _ in temporals])
    for u in units:  # a possessive right after a claimed span belongs to it ("1976's")
        if re.match(r"['’]s(?!\w)", q[u.end:u.end + 3]):
            u.possessive = True

    # 3-4. tokens and entity runs
    all_caps = not any(c.islower() for c in q)
    toks = _tokens(q, masked, all_caps)
    runs = _entity_runs(q, toks)
    in_run = set()
    for i, j in runs:
        first, last = toks[i], toks[j - 1]
        end_text = last.start + len(last.text)
        units.append(_Unit("entity", first.start, last.end, _norm(q[first.start:end_text]),
                           possessive=last.possessive))
        in_run.update(range(i, j))
    units += [t for k, t in enumerate(toks) if k not in in_run]
    units.sort(key=lambda u: u.start)

    # 5. visual cues
    vcues = _visual_cues(q, units)

    cues: list[VisualCue] = []
    for u in units:
        if u.kind == "quote":
            cues.append(VisualCue("entity", u.text, quote_starts[u.start]))
        elif u.kind == "entity":
            cues.append(VisualCue("entity", u.text, u.start))
        elif u.kind == "temporal":
            cues.append(VisualCue("temporal", u.text, u.start))
    vcue_spans = []  # (start, end, text) of each visual cue
    for i, j, _cid in vcues:
        text = _norm(" ".join(units[k].text for k in range(i, j)))
        cues.append(VisualCue("visual", text, units[i].start))
        vcue_spans.append((units[i].start, units[j - 1].end, text))
    cues.sort(key=lambda c: c.start)

    # 6. visual noun phrases
    n = len(units)
    vnps: list[tuple[int, int, str]] = []
    vnp_kinds: list[set[str]] = []  # cue kinds inside each visual noun phrase
    for h in range(n):
        if not _is_vnoun(units[h]):
            continue
        if h + 1 < n and _is_vnoun(units[h + 1]) and _adjacent(q, units[h], units[h + 1]):
            continue  # a modifier of the next visual noun
        i = h
        while i > 0 and _adjacent(q, units[i - 1], units[i]) and _walk_role(units[i - 1]) is not None:
            i -= 1
        vnps.append((units[i].start, units[h].end, _norm(" ".join(units[k].text for k in range(i, h + 1)))))
        vnp_kinds.append({"visual"} | {"temporal" if units[k].kind == "temporal" else "entity"
                                       for k in range(i, h) if units[k].kind in ("temporal", "entity", "quote")})

    def inside_vnp(start: int, end: int) -> bool:
        return any(s <= start and end <= e for s, e, _ in vnps)

    # 7. entity and temporal phrases (with following kind nouns)
    ent_phrases: list[tuple[int, str]] = []
    tmp_phrases: list[tuple[int, str]] = []
    for k, u in enumerate(units):
        if u.kind not in ("entity", "quote", "temporal") or inside_vnp(u.start, u.end):
            continue
        parts = [u.text]
        m = k
        while (m + 1 < n and _adjacent(q, units[m], units[m + 1]) and units[m + 1].kind == "token"
               and units[m + 1].lex == "kind"
               and not inside_vnp(units[m + 1].start, units[m + 1].end)):
            m += 1
            parts.append(units[m].text)
        target = tmp_phrases if u.kind == "temporal" else ent_phrases
        target.append((u.start, _norm(" ".join(parts))))

    pieces = sorted([(s, t) for s, _, t in vnps] + ent_phrases + tmp_phrases)
    kinds = set().union(*vnp_kinds) | {"entity" for _ in ent_phrases[:1]} | {"temporal" for _ in tmp_phrases[:1]}
    ordered: list[str] = []
    if len(pieces) >= 2 and len(kinds) >= 2:
        ordered.append(" ".join(t for _, t in pieces))
    ordered += [t for _, _, t in vnps]
    ordered += [t for _, t in ent_phrases]
    ordered += [t for _, t in tmp_phrases]
    ordered += [t for s, e, t in vcue_spans if not inside_vnp(s, e)]

    seen: set[str] = set()
    phrases: list[str] = []
    for p in ordered:
        key = p.casefold()
        if p and key not in seen:
            seen.add(key)
            phrases.append(p)
    return VisualPhrases(question=q, cues=tuple(cues), phrases=tuple(phrases[:max_phrases]))
