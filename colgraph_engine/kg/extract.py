"""Entity and relation extraction without a model: the default, offline extractor.

An extractor is any callable ``text -> str`` that returns records in one of the dialects of
:mod:`colgraph_engine.kg.parsers` (an LLM call with LightRAG's prompt is the usual one). The
default, :class:`CooccurrenceExtractor`, is deterministic and needs no model:

* entities are proper-noun phrases (maximal runs of capitalised, all-caps or alphanumeric
  words, joined through name connectors such as "of" or "de"), acronyms, and years (alone); a phrase whose
  only word opens the sentence and is a common word ("The", "In") is not one;
* relations link entities that occur in the same sentence, each to its next ``window``
  entities, with the sentence as the description and the content words between them as keywords.

It writes LightRAG's current line format, so its output goes through the same parser, checks
and merge rules as a model's.
"""
from __future__ import annotations

import re

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
