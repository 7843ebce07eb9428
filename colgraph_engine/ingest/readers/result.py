"""What a reader returns: the document (or None), per-file statistics, and the issues met.

Readers never raise for a bad *file* (missing, empty, corrupt, encrypted, wrong format): the
problem becomes an ``error`` :class:`ReadIssue` naming the file and the result has no document.
They do raise ``TypeError`` / ``ValueError`` for bad *arguments*, before touching any file.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from ...kg.document import DocumentInput

ReadSeverity = Literal["error", "warning", "skip"]
KINDS = ("pdf", "image", "text", "records", "skipped")


@dataclass(frozen=True)
class ReadIssue:
    """A problem with one file.

    ``severity``: ``error`` (the file, or the part named in the message, was not read),
    ``warning`` (read, with a repair or a fallback worth knowing) or ``skip`` (deliberately not
    read: sidecar, hidden file, unknown suffix).
    """
    file: str
    message: str
    severity: ReadSeverity = "error"

    def __str__(self) -> str:
        return f"{self.file}: {self.severity}: {self.message}"


@dataclass
class ReadStats:
    """Counts and timings of one file.

    ``seconds`` maps a phase to wall seconds: ``open``, ``text`` (text layer or file decoding),
    ``fonts`` (PDF heading cues), ``ocr``, ``render`` (page images), ``images`` (embedded image
    extraction or image decoding), ``parse`` (records, sidecars). Phases not run are absent.
    """
    pages: int = 0
    text_layer_pages: int = 0
    ocr_pages: int = 0
    empty_pages: int = 0
    page_images: int = 0
    images: int = 0
    images_skipped: int = 0
    sections: int = 0
    headings: int = 0
    tables: int = 0
    segments: int = 0
    regions: int = 0
    sidecars: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    def timed(self, phase: str):
        """Adds the wall time of the ``with`` body to ``seconds[phase]``."""
        return timed_into(self.seconds, phase)


@contextmanager
def timed_into(seconds: dict[str, float], phase: str):
    """Adds the wall time of the ``with`` body to ``seconds[phase]`` (created at 0)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        seconds[phase] = seconds.get(phase, 0.0) + time.perf_counter() - t0


@dataclass
class ReadResult:
    """One file's outcome. ``document`` is None when the file could not be read (see ``issues``)
    or was skipped (``kind == "skipped"``)."""
    file: Path
    doc_id: str
    kind: str
    document: DocumentInput | None = None
    stats: ReadStats = field(default_factory=ReadStats)
    issues: list[ReadIssue] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.document is not None

    @property
    def errors(self) -> list[ReadIssue]:
        return [i for i in self.issues if i.severity == "error"]

    def issue(self, message: str, severity: ReadSeverity = "error") -> None:
        self.issues.append(ReadIssue(self.doc_id, message, severity))

    def fail(self, message: str) -> ReadResult:
        """Records an error, drops the document and returns self (for ``return result.fail(...)``)."""
        self.issue(message, "error")
        self.document = None
        return self


def check_file(result: ReadResult) -> bool:
    """Records why ``result.file`` cannot be read (missing, not a file, empty); True when readable."""
    path = result.file
    if not path.exists():
        result.fail(f"no such file: {path}")
        return False
    if not path.is_file():
        result.fail(f"not a regular file: {path}")
        return False
    try:
        size = path.stat().st_size
    except OSError as e:
        result.fail(f"cannot stat {path}: {e}")
        return False
    if size == 0:
        result.fail("empty file (0 bytes)")
        return False
    return True


def resolve(path, doc_id, what: str = "path") -> tuple[Path, str]:
    """``(Path, doc_id)``; TypeError / ValueError naming the argument when they are unusable."""
    import os

    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{what}: expected a str or path, got {type(path).__name__}")
    path = Path(path)
    if doc_id is None:
        doc_id = path.name
    if not isinstance(doc_id, str) or not doc_id.strip():
        raise ValueError(f"doc_id: expected a non-empty str or None, got {doc_id!r}")
    return path, doc_id
