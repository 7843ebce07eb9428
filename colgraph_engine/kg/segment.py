"""Segmentation of a document into retrieval units, by mKG-RAG's rule.

A document arrives as ordered sections (text, plus the images that sit in it). Sections without
images are merged with their image-free neighbours, or split, so that each segment holds at
most ``max_tokens`` tokens; a section with images is kept whole, however long, so that its text
and its images stay in the same segment. Merging never crosses a section with images.

Tokens are counted per whitespace-separated word by ``count_tokens`` (default: one token per
word; pass a model tokenizer's counter for exact budgets), so splits fall on word boundaries.
A segment's text is its words joined by single spaces, except that paragraph breaks (blank lines
inside a section, and the boundary between merged sections) stay as one blank line: a heading
such as "The Alps" must not run into the sentence after it.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    """One section of a source document, in reading order."""
    text: str
    images: tuple[str, ...] = ()  # ids or paths of the images in this section
    title: str | None = None
    page: int | None = None


@dataclass(frozen=True)
class Segment:
    """A retrieval unit. ``sections`` is the inclusive range of section indices it came from;
    ``part`` numbers the pieces of a split section (0 when not split)."""
    text: str
    images: tuple[str, ...]
    sections: tuple[int, int]
    n_tokens: int
    part: int = 0


def _check(sections, max_tokens, overlap_tokens) -> list[Section]:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected an int >= 1, got {max_tokens!r}")
    if isinstance(overlap_tokens, bool) or not isinstance(overlap_tokens, int) or not 0 <= overlap_tokens < max_tokens:
        raise ValueError(f"overlap_tokens: expected an int in [0, max_tokens), got {overlap_tokens!r}")
    if isinstance(sections, (str, bytes)) or not isinstance(sections, Sequence):
        raise TypeError(f"sections: expected a sequence of Section or str, got {type(sections).__name__}")
    out = []
    for i, s in enumerate(sections):
        if isinstance(s, str):
            s = Section(s)
        if not isinstance(s, Section) or not isinstance(s.text, str):
            raise TypeError(f"sections[{i}]: expected a Section or str, got {type(s).__name__}")
        out.append(s)
    return out


def _split_words(words: list[str], costs: list[int], max_tokens: int, overlap: int) -> list[tuple[int, int]]:
    """Word ranges ``[a, b)`` of at most `max_tokens` tokens, consecutive ranges sharing about
    `overlap` tokens. A single word costing more than the budget becomes its own range."""
    ranges, a, n = [], 0, len(words)
    while a < n:
        b, total = a, 0
        while b < n and (total + costs[b] <= max_tokens or b == a):
            total += costs[b]
            b += 1
        ranges.append((a, b))
        if b >= n:
            break
        back, shared = b, 0  # step back over at most `overlap` tokens, always moving forward
        while back - 1 > a and shared + costs[back - 1] <= overlap:
            back -= 1
            shared += costs[back]
        a = back
    return ranges


_BREAK = "\n\n"  # a paragraph break among the words (costs no token); compared by identity
_PARAGRAPHS = re.compile(r"\n[^\S\n]*\n\s*")


def _words(text: str) -> list[str]:
    """Words of `text` with :data:`_BREAK` between paragraphs (blank-line separated)."""
    out: list[str] = []
    for para in _PARAGRAPHS.split(text):
        ws = para.split()
        if ws:
            if out:
                out.append(_BREAK)
            out.extend(ws)
    return out


def _join(words: list[str]) -> str:
    text = " ".join(words).replace(f" {_BREAK} ", _BREAK)
    return text.strip()


def segment_sections(sections: Sequence[Section | str], *, max_tokens: int = 1200, overlap_tokens: int = 0,
                     count_tokens: Callable[[str], int] | None = None) -> list[Segment]:
    """Segments of `sections` by the rule above; empty image-free sections are dropped.

    Args:
        sections: the document's sections in order (a plain string is a section without images).
        max_tokens: token budget of a merged or split segment (image sections may exceed it).
        overlap_tokens: tokens repeated at the start of the next piece of a split section.
        count_tokens: tokens in one word (default 1).
    """
    secs = _check(sections, max_tokens, overlap_tokens)
    cost = (lambda w: 1) if count_tokens is None else count_tokens
    out: list[Segment] = []
    buf: list[tuple[int, list[str], list[int]]] = []  # image-free sections waiting to merge

    def flush():
        if buf:
            words = [w for k, (_, ws, _) in enumerate(buf) for w in ([_BREAK] if k else []) + ws]
            total = sum(c for _, _, cs in buf for c in cs)
            out.append(Segment(_join(words), (), (buf[0][0], buf[-1][0]), total))
            buf.clear()

    for i, s in enumerate(secs):
        words = _words(s.text)
        costs = [0 if w is _BREAK else int(cost(w)) for w in words]
        total = sum(costs)
        if s.images:
            flush()
            out.append(Segment(_join(words), tuple(s.images), (i, i), total))
        elif not words:
            continue
        elif total > max_tokens:
            flush()
            for part, (a, b) in enumerate(_split_words(words, costs, max_tokens, overlap_tokens)):
                out.append(Segment(_join(words[a:b]), (), (i, i), sum(costs[a:b]), part))
        else:
            if buf and sum(c for _, _, cs in buf for c in cs) + total > max_tokens:
                flush()
            buf.append((i, words, costs))
    flush()
    return out
