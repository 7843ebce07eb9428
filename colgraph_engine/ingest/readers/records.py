"""Pre-extracted records -> :class:`DocumentInput` with ``segments`` and ``extractions``, so the
graph builder uses the records instead of extracting again.

Two kinds of file:

**Response caches** (``*.json``), three shapes, each checked against caches that users committed:

* LightRAG, flattened keys (current): ``{"default:extract:<md5>": {"return": str,
  "cache_type": "extract", "chunk_id": "chunk-<md5>", "original_prompt": str, ...}, ...}``;
  the key is ``mode:cache_type:hash``.
* LightRAG, nested by mode (older): ``{"default": {"<md5>": {"return": str, "cache_type":
  "extract", "original_prompt": str, "embedding": ..., ...}}, "global": {...}}``.
* nano-graphrag: ``{"<md5>": {"return": str, "model": str}}`` (no prompt, no type: every
  response whose dialect is recognised is taken; others, e.g. community reports, are skipped).

Only extraction entries are read (``cache_type`` ``extract``, mode ``default``); query, keyword
and summary entries are counted in one ``skip`` issue. Entries become segments in file order;
responses of one chunk (first pass and gleaning rounds) are merged into one segment: grouped by
``chunk_id`` when present, else by the chunk text. The chunk text is recovered from
``original_prompt``: the text after the last ``<Input Text>`` marker (current prompt) or after
``Text:`` in the ``-Real Data-`` block (older prompt); a gleaning prompt is LightRAG's JSON
history followed by the continuation prompt, and its first user message is read instead.
When no chunk text can be recovered, the segment text is made of the records' own names and
descriptions (one warning per file says how many segments).

**Plain record files** (``*.records.txt`` or ``*.records``): one extraction response per
segment, segments separated by a line holding only :data:`SEGMENT_MARKER` (``<|SEGMENT|>``).
Inside a segment, an optional line holding only :data:`RECORDS_MARKER` (``<|RECORDS|>``)
separates the segment's source text (above) from the response (below); without it the block
is the response alone. Text before the first marker is the first segment. Example::

    Mount Fuji is the highest mountain in Japan.
    <|RECORDS|>
    entity<|#|>Mount Fuji<|#|>location<|#|>Highest mountain in Japan.
    <|COMPLETE|>
    <|SEGMENT|>
    entity<|#|>Tokyo<|#|>location<|#|>Capital of Japan.
    <|COMPLETE|>

Every response is parsed with :func:`colgraph_engine.kg.parsers.parse_extraction` (dialect
detected per response). A response in no recognisable dialect is an error naming the file and
the entry or segment, and is left out; a file with no usable response gives no document.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import replace

from ...kg.document import DocumentInput
from ...kg.parsers import detect_dialect, parse_extraction
from ...kg.records import ParseResult
from ...kg.segment import Segment
from .result import ReadResult, resolve
from .text import load_text

SEGMENT_MARKER = "<|SEGMENT|>"
RECORDS_MARKER = "<|RECORDS|>"
RECORD_FILE_ENDINGS = (".records.txt", ".records")
CACHE_SUFFIXES = (".json",)
_SEGMENT_SPLIT = re.compile(r"^[ \t]*" + re.escape(SEGMENT_MARKER) + r"[ \t]*$", re.MULTILINE)
_RECORDS_SPLIT = re.compile(r"^[ \t]*" + re.escape(RECORDS_MARKER) + r"[ \t]*$", re.MULTILINE)
_DIALECT_HELP = ("expected LightRAG line records (entity<|#|>...), JSON entities/relationships, "
                 "or parenthesised tuple records (\"entity\"<|>...)")


def is_record_file(name: str) -> bool:
    """True for names this reader handles by suffix (caches are any ``.json``)."""
    lower = name.lower()
    return lower.endswith(RECORD_FILE_ENDINGS) or lower.endswith(CACHE_SUFFIXES)


def read_records(path: str | os.PathLike, *, doc_id: str | None = None) -> ReadResult:
    """Reads a response cache (``.json``) or a plain record file (see the module docstring)."""
    path, doc_id = resolve(path, doc_id)
    result = ReadResult(path, doc_id, "records")
    text = load_text(result, "a record file")
    if text is None:
        return result
    with result.stats.timed("parse"):
        if path.name.lower().endswith(CACHE_SUFFIXES):
            chunks = _cache_chunks(text, result)
        else:
            chunks = _record_file_chunks(text, result)
        if chunks is None:
            return result
        segments, extractions, derived = [], [], 0
        for chunk_text, responses in chunks:
            parsed = _merge([parse_extraction(r) for r in responses])
            if chunk_text is None:
                chunk_text = _records_text(parsed)
                derived += 1
            segments.append(Segment(chunk_text, (), (len(segments), len(segments)), len(chunk_text.split())))
            extractions.append(parsed)
    if not segments:
        return result.fail(f"no extraction response in a recognisable dialect ({_DIALECT_HELP})")
    if derived:
        result.issue(f"{derived} of {len(segments)} segments have no source text in the file; their text is "
                     "made of their records' names and descriptions", "warning")
    result.stats.segments = len(segments)
    result.document = DocumentInput(doc_id, (), title=path.stem, extractions=extractions, segments=segments)
    return result


def _merge(results: list[ParseResult]) -> ParseResult:
    if len(results) == 1:
        return results[0]
    first = results[0]
    return replace(first, entities=sum((r.entities for r in results), ()),
                   relations=sum((r.relations for r in results), ()),
                   issues=sum((r.issues for r in results), ()),
                   complete=all(r.complete for r in results),
                   skipped=sum(r.skipped for r in results), ignored=sum(r.ignored for r in results))


def _records_text(parsed: ParseResult) -> str:
    lines = [f"{e.name}: {e.description}" if e.description else e.name for e in parsed.entities]
    lines += [f"{r.source} - {r.target}: {r.description}" for r in parsed.relations]
    return "\n".join(lines)


# -- plain record files -------------------------------------------------------------------------

def _record_file_chunks(text: str, result: ReadResult) -> list[tuple[str | None, list[str]]] | None:
    blocks = _SEGMENT_SPLIT.split(text)
    chunks = []
    for k, block in enumerate(blocks):
        if not block.strip():
            if k > 0:
                result.issue(f"segment {k + 1} is empty; left out", "warning")
            continue
        parts = _RECORDS_SPLIT.split(block, maxsplit=1)
        source, response = (" ".join(parts[0].split()), parts[1]) if len(parts) == 2 else (None, parts[0])
        if detect_dialect(response) is None:
            result.issue(f"segment {k + 1}: no recognisable extraction dialect ({_DIALECT_HELP}); left out")
            continue
        chunks.append((source or None, [response]))
    return chunks


# -- response caches ------------------------------------------------------------------------------

def _cache_chunks(text: str, result: ReadResult) -> list[tuple[str | None, list[str]]] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        result.fail(f"invalid JSON ({e}); expected a LightRAG or nano-graphrag response cache")
        return None
    if not isinstance(data, dict) or not data:
        result.fail("expected a non-empty JSON object (a LightRAG or nano-graphrag response cache)")
        return None
    entries = _cache_entries(data)
    if entries is None:
        result.fail("not a response cache: expected {key: {\"return\": ...}} (LightRAG flattened or "
                     "nano-graphrag) or {mode: {hash: {\"return\": ...}}} (LightRAG nested)")
        return None
    kind, entries = entries
    other = 0
    groups: dict[str, tuple[str | None, list[str]]] = {}
    unknown = []
    for key, entry in entries:
        cache_type = entry.get("cache_type")
        if kind == "flat" and cache_type is None and key.count(":") >= 2:
            cache_type = key.split(":", 2)[1]
        if cache_type not in (None, "extract") or (kind == "nested" and key.split("/", 1)[0] != "default"):
            other += 1
            continue
        response = entry.get("return")
        if not isinstance(response, str):
            result.issue(f"entry {key}: \"return\" is not a string; left out")
            continue
        if detect_dialect(response) is None:
            unknown.append(key)
            continue
        prompt = entry.get("original_prompt")
        chunk_text = _chunk_text(prompt) if isinstance(prompt, str) else None
        chunk_id = entry.get("chunk_id")
        group = chunk_id if isinstance(chunk_id, str) and chunk_id else (chunk_text or f"entry:{key}")
        groups.setdefault(group, (chunk_text, []))
        if groups[group][0] is None and chunk_text is not None:
            groups[group] = (chunk_text, groups[group][1])
        groups[group][1].append(response)
    if other:
        result.issue(f"{other} entries are not extraction responses (query, keywords, summary or other modes); "
                     "not read", "skip")
    if unknown:
        if kind == "nano":  # nano-graphrag caches mix extraction with community reports
            result.issue(f"{len(unknown)} responses are in no extraction dialect (e.g. community reports); "
                         "not read", "skip")
        else:
            shown = ", ".join(unknown[:3]) + (f" and {len(unknown) - 3} more" if len(unknown) > 3 else "")
            result.issue(f"{len(unknown)} extraction responses in no recognisable dialect ({_DIALECT_HELP}): "
                         f"{shown}; left out")
    return list(groups.values())


def _cache_entries(data: dict) -> tuple[str, list[tuple[str, dict]]] | None:
    """``(kind, [(key, entry)])`` with kind ``flat`` (LightRAG flattened), ``nano`` or ``nested``."""
    values = list(data.values())
    if all(isinstance(v, dict) and "return" in v for v in values):
        flattened = any(":" in k or "cache_type" in v for k, v in data.items())
        return ("flat" if flattened else "nano"), list(data.items())
    if all(isinstance(v, dict) and all(isinstance(e, dict) and "return" in e for e in v.values()) for v in values):
        return "nested", [(f"{mode}/{h}", e) for mode, inner in data.items() for h, e in inner.items()]
    return None


def _chunk_text(prompt: str) -> str | None:
    """The chunk text inside a LightRAG extraction prompt, or None (see the module docstring)."""
    stripped = prompt.lstrip()
    if stripped.startswith("["):  # gleaning: JSON history, then the continuation prompt
        try:
            history, _ = json.JSONDecoder().raw_decode(stripped)
        except json.JSONDecodeError:
            history = None
        if isinstance(history, list):
            first = next((m.get("content") for m in history if isinstance(m, dict) and m.get("role") == "user"), None)
            if isinstance(first, str):
                prompt = first
    at = prompt.rfind("<Input Text>")
    if at >= 0:
        return _unfenced(prompt[at + len("<Input Text>"):], stop=("<Output>",))
    at = prompt.rfind("-Real Data-")
    if at >= 0:
        text_at = prompt.find("Text:", at)
        if text_at >= 0:
            return _unfenced(prompt[text_at + len("Text:"):], stop=("\n######", "\nOutput:"))
    return None


def _unfenced(text: str, stop: tuple[str, ...]) -> str | None:
    text = text.lstrip(" \t\n")
    if text.startswith("```"):
        body = text[text.find("\n") + 1:] if "\n" in text else ""
        end = body.find("\n```")
        if end < 0 and body.startswith("```"):
            end = 0
        text = body[:end] if end >= 0 else body
    else:
        cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
        text = text[:cut]
    text = text.strip()
    return text or None
