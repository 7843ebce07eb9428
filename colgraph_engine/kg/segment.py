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

Memory: a section's words are read in pieces of about :data:`PIECE_CHARS` characters cut at
whitespace, and a section longer than ``max_tokens`` is split as its words stream by, so that
segmenting holds about one segment's words at a time however long the section (a 50 MB
one-line Markdown file is one section). Sections with images are kept whole, so their words are
all held (they are page- or paragraph-sized in practice).
"""
from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

PIECE_CHARS = 1 << 16  # characters of a section split into words at once (ours: bounds memory)


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


_SPACE = re.compile(r"\s")


def _iter_words(text: str) -> Iterator[str]:
    """The words of `text` (``str.split``) with :data:`_BREAK` between paragraphs (blank-line
    separated), lazily: paragraphs are found one at a time and split in pieces of about
    :data:`PIECE_CHARS` characters cut at whitespace, so no list of all words is built."""
    emitted = False
    start = 0
    bounds = itertools.chain(((m.start(), m.end()) for m in _PARAGRAPHS.finditer(text)), ((len(text), len(text)),))
    for end, next_start in bounds:
        first = True
        pos = start
        while pos < end:
            stop = min(pos + PIECE_CHARS, end)
            if stop < end:
                m = _SPACE.search(text, stop, end)  # never cut a word
                stop = m.start() if m else end
            ws = text[pos:stop].split()
            if ws:
                if first and emitted:
                    yield _BREAK
                first, emitted = False, True
                yield from ws
            pos = stop
        start = next_start


def _words(text: str) -> list[str]:
    """Words of `text` with :data:`_BREAK` between paragraphs (blank-line separated)."""
    return list(_iter_words(text))


def _split_stream(items: Iterator[tuple[str, int]], max_tokens: int, overlap: int) -> Iterator[list[tuple[str, int]]]:
    """:func:`_split_words` over a stream of ``(word, cost)``: yields the same ranges, as lists,
    while holding only the words of the current range (plus the one that did not fit)."""
    window: list[tuple[str, int]] = []  # words from the current range start on
    exhausted = False
    while True:
        b, total = 0, 0
        while True:
            if b == len(window):
                item = next(items, None)
                if item is None:
                    exhausted = True
                    break
                window.append(item)
            c = window[b][1]
            if total + c <= max_tokens or b == 0:
                total += c
                b += 1
            else:
                break
        if b == 0:
            return
        yield window[:b]
        if exhausted and b == len(window):
            return
        back, shared = b, 0  # as _split_words: step back over at most `overlap` tokens
        while back - 1 > 0 and shared + window[back - 1][1] <= overlap:
            back -= 1
            shared += window[back][1]
        window = window[back:]


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
        stream = ((w, 0 if w is _BREAK else int(cost(w))) for w in _iter_words(s.text))
        head, total = [], 0  # the section's words while it may still fit in max_tokens
        for item in stream:
            head.append(item)
            total += item[1]
            if total > max_tokens and not s.images:
                break  # a long section: split it as its words stream by
        words, costs = [w for w, _ in head], [c for _, c in head]
        if s.images:
            flush()
            out.append(Segment(_join(words), tuple(s.images), (i, i), total))
        elif not words:
            continue
        elif total > max_tokens:
            flush()
            del words, costs
            for part, piece in enumerate(_split_stream(itertools.chain(head, stream), max_tokens, overlap_tokens)):
                out.append(Segment(_join([w for w, _ in piece]), (), (i, i), sum(c for _, c in piece), part))
        else:
            if buf and sum(c for _, _, cs in buf for c in cs) + total > max_tokens:
                flush()
            buf.append((i, words, costs))
    flush()
    return out
