"""Plain text and Markdown -> :class:`DocumentInput`.

Decoding: UTF-8 (a byte-order mark is dropped); bytes that are not UTF-8 are decoded as latin-1
with a warning (every byte is a latin-1 character, so nothing is lost, though accents may come
out wrong). UTF-16 with a byte-order mark is decoded as such. A file with NUL bytes in its first
8 KiB and no UTF-16 mark is binary: an error. Line ends are normalised to ``"\\n"``.

Plain text (``.txt``, ``.text``): one section per paragraph (blocks separated by blank lines),
without titles; segmentation merges them up to its token budget.

Markdown (``.md``, ``.markdown``): ATX headings (``# Title`` .. ``###### Title``, optional
closing ``#``) and Setext headings (a paragraph line underlined with ``===`` or ``---``) start a
section titled with the heading text; the heading line stays in the section text. Text before
the first heading is a section without title. Simple pipe tables (a header row with ``|``, a
delimiter row of ``-`` / ``:`` cells, then rows with ``|``) become :class:`TableInput` in the
section they appear in, and leave the section text. Fenced code blocks (``````` or ``~~~``)
are text; nothing inside them is a heading or table. The document title is the first level-1
heading, else the file stem.
"""
from __future__ import annotations

import os
import re

from ...kg.document import DocumentInput, TableInput
from ...kg.segment import Section
from .result import ReadResult, check_file, resolve

TEXT_SUFFIXES = (".txt", ".text")
MARKDOWN_SUFFIXES = (".md", ".markdown")

_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_TABLE_DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(?:\|\s*:?-+:?\s*)*\|?\s*$")


def decode_text(data: bytes) -> tuple[str | None, bool]:
    """``(text, decoded_as_latin1)``; ``(None, False)`` for binary data (see the module docstring)."""
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        try:
            return _newlines(data.decode("utf-16")), False
        except UnicodeDecodeError:
            return None, False
    if b"\x00" in data[:8192]:
        return None, False
    try:
        return _newlines(data.decode("utf-8-sig")), False
    except UnicodeDecodeError:
        return _newlines(data.decode("latin-1")), True


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def load_text(result: ReadResult, what: str) -> str | None:
    """The decoded text of ``result.file`` (timed as the ``text`` phase), or None after recording
    why not on `result` (missing, empty, unreadable, binary: "binary data, not <what>"); a
    latin-1 fallback is recorded as a warning."""
    if not check_file(result):
        return None
    with result.stats.timed("text"):
        try:
            data = result.file.read_bytes()
        except OSError as e:
            result.fail(f"cannot read the file ({e})")
            return None
        text, latin1 = decode_text(data)
    if text is None:
        result.fail(f"binary data, not {what}")
        return None
    if latin1:
        result.issue("not valid UTF-8; decoded as latin-1", "warning")
    return text


def read_text(path: str | os.PathLike, *, doc_id: str | None = None, markdown: bool | None = None) -> ReadResult:
    """Reads a plain-text or Markdown file (see the module docstring).

    Args:
        path: the file.
        doc_id: the document id (default: the file name).
        markdown: parse as Markdown; None decides by suffix (``.md`` / ``.markdown``).
    """
    if markdown is not None and not isinstance(markdown, bool):
        raise TypeError(f"markdown: expected bool or None, got {type(markdown).__name__}")
    path, doc_id = resolve(path, doc_id)
    result = ReadResult(path, doc_id, "text")
    text = load_text(result, "text (NUL bytes without a UTF-16 byte-order mark)")
    if text is None:
        return result
    if markdown is None:
        markdown = path.suffix.lower() in MARKDOWN_SUFFIXES
    with result.stats.timed("parse"):
        if markdown:
            sections, tables, title = markdown_sections(text)
        else:
            sections, tables, title = [Section(p) for p in paragraphs(text)], [], ""
    if not any(s.text.strip() for s in sections) and not tables:
        return result.fail("no text in the file (only whitespace)")
    result.stats.sections = len(sections)
    result.stats.headings = sum(s.title is not None for s in sections)
    result.stats.tables = len(tables)
    result.document = DocumentInput(doc_id, sections, title=title or path.stem, tables=tables)
    return result


def paragraphs(text: str) -> list[str]:
    """Blocks of ``text`` separated by blank lines, stripped, empty ones dropped."""
    return [p.strip() for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def markdown_sections(text: str) -> tuple[list[Section], list[TableInput], str]:
    """``(sections, tables, title)`` of a Markdown text (rules in the module docstring)."""
    lines = text.split("\n")
    sections: list[Section] = []
    tables: list[TableInput] = []
    title = ""
    cur_title: str | None = None
    body: list[str] = []
    fence: str | None = None

    def flush():
        if cur_title is not None or any(b.strip() for b in body) or (tables and tables[-1].section == len(sections)):
            sections.append(Section("\n".join(body).strip(), title=cur_title))

    i = 0
    while i < len(lines):
        line = lines[i]
        if fence is not None:
            body.append(line)
            if line.strip().startswith(fence):
                fence = None
            i += 1
            continue
        m = _FENCE.match(line)
        if m:
            fence = m.group(1)[:3]
            body.append(line)
            i += 1
            continue
        if ("|" in line and i + 1 < len(lines) and "|" in lines[i + 1] and "-" in lines[i + 1]
                and _TABLE_DELIMITER.match(lines[i + 1])):
            rows = [line.strip(), lines[i + 1].strip()]
            i += 2
            while i < len(lines) and "|" in lines[i] and lines[i].strip():
                rows.append(lines[i].strip())
                i += 1
            tables.append(TableInput("\n".join(rows), section=len(sections)))
            continue
        atx = _ATX.match(line)
        setext = _SETEXT.match(line) if body and body[-1].strip() and not _FENCE.match(body[-1]) else None
        if atx or setext:
            if atx:
                heading, level = (atx.group(2) or "").strip(), len(atx.group(1))
            else:
                heading, level = body.pop().strip(), 1 if setext.group(1)[0] == "=" else 2
            flush()
            cur_title, body = heading, [heading] if heading else []
            if level == 1 and not title and heading:
                title = heading
            i += 1
            continue
        body.append(line)
        i += 1
    flush()
    return sections, tables, title
