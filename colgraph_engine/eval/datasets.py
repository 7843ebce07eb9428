"""Loaders for retrieval evaluation sets: MMLongBench-Doc, MultimodalQA and BEIR-style folders.

Each loader reads files only (no network), validates what it reads, and reports problems as
FileNotFoundError (with the path) or ValueError (with the file, entry or line and field).

* :func:`load_mmlongbench` -- ``root/samples.json``, ``root/documents/*.pdf``, optional
  ``root/page_counts.json``; questions with 1-based gold evidence pages, pages rendered lazily.
* :func:`load_mmqa` -- ``MMQA_dev.jsonl.gz`` (and optionally ``MMQA_images.jsonl.gz``).
* :func:`load_beir` -- ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``.
"""
from __future__ import annotations

import ast
import gzip
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .pdf import Page, check_render_args, page_count, render_pdf

# Reasons an MMLongBench evidence label is dropped; keys of MMLongBench.skipped.
SKIP_REASONS = ("page_zero", "past_last_page", "duplicate")


# --------------------------------------------------------------------------- shared helpers

def _as_path(path, name: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"{name}: expected a str or path, got {type(path).__name__}")
    return Path(path)


def _require_file(path: Path, what: str) -> None:
    if not path.is_file():
        raise FileNotFoundError(f"{what}: no such file: {path}")


def _open_text(path: Path):
    """Text handle on ``path``; gzip is detected from the magic bytes, not the suffix."""
    with open(path, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    return gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(1-based line number, object)`` per non-blank line; ValueError on bad JSON or non-objects."""
    with _open_text(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: invalid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _scalar_str(value, where: str) -> str:
    """str for str / int / float values (integral floats without ".0"); ValueError otherwise."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where}: expected a string or number, got {type(value).__name__}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _str_list(value, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{where}: expected a list of strings, got {value!r}")
    return tuple(value)


# --------------------------------------------------------------------------- MMLongBench-Doc

@dataclass(frozen=True)
class Question:
    """One MMLongBench-Doc question.

    * ``qid``: ``f"{doc_id}#{index}"`` with ``index`` the entry's 0-based position in samples.json.
    * ``evidence_pages``: valid 1-based gold pages, in file order, deduplicated; labels 0 and past
      the document's last page are dropped (counted in :attr:`MMLongBench.skipped`).
    * ``evidence_sources``: e.g. ``("Chart", "Table")``; may be empty.
    * ``answerable``: True iff ``evidence_pages`` is non-empty, i.e. the question can be scored
      for page retrieval. The dataset's "Not answerable" answers usually come with no evidence
      page, but the two are recorded independently: check ``answer`` for the dataset's verdict.
    """

    qid: str
    doc_id: str
    question: str
    answer: str
    evidence_pages: tuple[int, ...]
    evidence_sources: tuple[str, ...]
    answer_format: str
    answerable: bool
    doc_type: str = ""


@dataclass
class MMLongBench:
    """Questions of an MMLongBench-Doc folder and lazy access to its pages.

    ``page_counts`` maps each selected doc_id to its page count; ``skipped`` counts the evidence
    labels dropped per reason in :data:`SKIP_REASONS`. The remaining fields are the rendering
    settings :meth:`pages` uses.
    """

    root: Path
    questions: tuple[Question, ...]
    page_counts: dict[str, int]
    skipped: dict[str, int]
    render: bool = False
    scale: float = 1.0
    ocr: Callable | None = None
    ocr_scale: float | None = None
    progress: bool = False
    _by_doc: dict[str, tuple[Question, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        groups: dict[str, list[Question]] = {d: [] for d in self.page_counts}
        for q in self.questions:
            groups.setdefault(q.doc_id, []).append(q)
        self._by_doc = {d: tuple(qs) for d, qs in groups.items()}

    def __len__(self) -> int:
        return len(self.questions)

    @property
    def doc_ids(self) -> tuple[str, ...]:
        """Selected documents, in order of first appearance in samples.json."""
        return tuple(self._by_doc)

    def _check_doc(self, doc_id: str) -> None:
        if doc_id not in self._by_doc:
            raise KeyError(f"doc_id: {doc_id!r} is not among the loaded documents")

    def pdf_path(self, doc_id: str) -> Path:
        self._check_doc(doc_id)
        return self.root / "documents" / doc_id

    def questions_for(self, doc_id: str) -> tuple[Question, ...]:
        self._check_doc(doc_id)
        return self._by_doc[doc_id]

    def pages(self, doc_id: str, *, pages: Iterable[int] | None = None) -> list[Page]:
        """All (or the given 1-based) pages of one document via :func:`render_pdf`.

        Rendered on each call and not cached, so memory holds one document at a time. Images are
        kept only when the set was loaded with ``render=True``; the OCR fallback applies either way.
        """
        return render_pdf(self.pdf_path(doc_id), scale=self.scale, pages=pages, with_images=self.render,
                          ocr=self.ocr, ocr_scale=self.ocr_scale, progress=self.progress)


def _literal_list(value, where: str) -> list:
    """A list from a list or from its string form, JSON (``"[3, 4]"``) or Python (``"['a']"``)."""
    if isinstance(value, list):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a list or its string form, got {type(value).__name__}")
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        try:
            parsed = ast.literal_eval(value)  # literals only: never evaluates code
        except (ValueError, SyntaxError):
            raise ValueError(f"{where}: cannot parse {value!r} as a list") from None
    if not isinstance(parsed, list):
        raise ValueError(f"{where}: expected a list, got {value!r}")
    return parsed


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: invalid JSON ({e.msg})") from None


def _read_page_counts(path: Path) -> dict[str, int]:
    data = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected an object mapping PDF names to page counts")
    for k, v in data.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ValueError(f"{path}: {k!r}: expected a page count >= 0, got {v!r}")
    return data


def _parse_sample(i: int, entry, doc_filter: set[str] | None):
    """``(doc_id, fields)`` of samples.json entry ``i`` or None when filtered out."""
    if not isinstance(entry, dict):
        raise ValueError(f"samples.json: entry {i}: expected an object, got {type(entry).__name__}")
    for key in ("doc_id", "question", "answer", "evidence_pages"):
        if key not in entry:
            raise ValueError(f"samples.json: entry {i}: missing field {key!r}")
    doc_id = entry["doc_id"]
    if not isinstance(doc_id, str) or not doc_id or Path(doc_id).name != doc_id:
        raise ValueError(f"samples.json: entry {i}: field 'doc_id': expected a PDF file name, got {doc_id!r}")
    if doc_filter is not None and doc_id not in doc_filter:
        return None
    where = f"samples.json: entry {i}: field"
    if not isinstance(entry["question"], str):
        raise ValueError(f"{where} 'question': expected a string, got {type(entry['question']).__name__}")
    labels = _literal_list(entry["evidence_pages"], f"{where} 'evidence_pages'")
    for p in labels:
        if isinstance(p, bool) or not isinstance(p, int) or p < 0:
            raise ValueError(f"{where} 'evidence_pages': expected page numbers >= 0, got {p!r}")
    sources = entry.get("evidence_sources")
    sources = [] if sources in (None, "") else _literal_list(sources, f"{where} 'evidence_sources'")
    if not all(isinstance(s, str) for s in sources):
        raise ValueError(f"{where} 'evidence_sources': expected strings, got {sources!r}")
    fields = {
        "question": entry["question"],
        "answer": _scalar_str(entry["answer"], f"{where} 'answer'"),
        "labels": labels,
        "evidence_sources": tuple(sources),
        "answer_format": _scalar_str(entry.get("answer_format", ""), f"{where} 'answer_format'"),
        "doc_type": _scalar_str(entry.get("doc_type", ""), f"{where} 'doc_type'"),
    }
    return doc_id, fields


def load_mmlongbench(
    root: str | os.PathLike,
    *,
    doc_ids: Iterable[str] | None = None,
    render: bool = False,
    scale: float = 1.0,
    ocr: Callable | None = None,
    ocr_scale: float | None = None,
    progress: bool = False,
) -> MMLongBench:
    """Load an MMLongBench-Doc folder (``samples.json``, ``documents/``, optional ``page_counts.json``).

    Args:
        root: the folder.
        doc_ids: keep only questions on these PDF names (each must occur in samples.json).
        render, scale, ocr, ocr_scale, progress: settings for :meth:`MMLongBench.pages`
            (``render`` keeps page images); nothing is rendered at load.

    Page counts come from page_counts.json when it lists the document, else from the PDF. Every
    selected document's PDF must exist. Raises FileNotFoundError for missing files (with the
    path) and ValueError naming the entry index and field for malformed samples.
    """
    root = _as_path(root, "root")
    check_render_args(scale=scale, ocr=ocr, ocr_scale=ocr_scale)
    if not root.is_dir():
        raise FileNotFoundError(f"root: no such directory: {root}")
    samples_path = root / "samples.json"
    _require_file(samples_path, "root")
    doc_filter = None
    if doc_ids is not None:
        if isinstance(doc_ids, str) or not isinstance(doc_ids, Iterable):
            raise TypeError(f"doc_ids: expected an iterable of PDF names or None, got {type(doc_ids).__name__}")
        doc_filter = set(doc_ids)
        if not all(isinstance(d, str) for d in doc_filter):
            raise TypeError("doc_ids: expected str PDF names")
    samples = _read_json(samples_path)
    if not isinstance(samples, list):
        raise ValueError(f"{samples_path}: expected a JSON list of samples, got {type(samples).__name__}")

    parsed = []  # (index, doc_id, fields), everything validated before any PDF is opened
    for i, entry in enumerate(samples):
        item = _parse_sample(i, entry, doc_filter)
        if item is not None:
            parsed.append((i, *item))
    seen_docs = list(dict.fromkeys(doc_id for _, doc_id, _ in parsed))
    if doc_filter is not None:
        unknown = sorted(doc_filter - set(seen_docs))
        if unknown:
            raise ValueError(f"doc_ids: not in {samples_path}: {unknown}")

    counts_path = root / "page_counts.json"
    listed = _read_page_counts(counts_path) if counts_path.is_file() else {}
    page_counts: dict[str, int] = {}
    for doc_id in seen_docs:
        pdf = root / "documents" / doc_id
        _require_file(pdf, "doc_id")
        page_counts[doc_id] = listed[doc_id] if doc_id in listed else page_count(pdf)

    skipped = dict.fromkeys(SKIP_REASONS, 0)
    questions = []
    for i, doc_id, f in parsed:
        n = page_counts[doc_id]
        pages: list[int] = []
        for p in f["labels"]:
            reason = "page_zero" if p == 0 else "past_last_page" if p > n else "duplicate" if p in pages else None
            if reason is None:
                pages.append(p)
            else:
                skipped[reason] += 1
        questions.append(Question(
            qid=f"{doc_id}#{i}", doc_id=doc_id, question=f["question"], answer=f["answer"],
            evidence_pages=tuple(pages), evidence_sources=f["evidence_sources"],
            answer_format=f["answer_format"], answerable=bool(pages), doc_type=f["doc_type"],
        ))
    return MMLongBench(root=root, questions=tuple(questions), page_counts=page_counts, skipped=skipped,
                       render=render, scale=scale, ocr=ocr, ocr_scale=ocr_scale, progress=progress)


# --------------------------------------------------------------------------- MultimodalQA

@dataclass(frozen=True)
class MMQAQuestion:
    """One MultimodalQA question.

    * ``answers``: gold answer strings (numbers are rendered with str; 300.0 becomes "300").
    * ``supporting``: ``(doc_id, part)`` pairs, part one of "text", "table", "image".
    * ``image_doc_ids`` / ``text_doc_ids`` / ``table_id``: the question's candidate documents
      (``table_id`` None when absent).
    * ``modalities``: from ``metadata.modalities``, else the distinct supporting parts.
    * ``qtype``: ``metadata.type``, e.g. "TableQ", "Compose(ImageQ,TextQ)"; "" when absent.
    """

    qid: str
    question: str
    answers: tuple[str, ...]
    supporting: tuple[tuple[str, str], ...]
    image_doc_ids: tuple[str, ...]
    text_doc_ids: tuple[str, ...]
    table_id: str | None
    modalities: tuple[str, ...]
    qtype: str = ""


@dataclass(frozen=True)
class MMQA:
    """``questions`` in file order; ``images`` maps image id -> (title, path), {} when not loaded."""

    questions: tuple[MMQAQuestion, ...]
    images: dict[str, tuple[str, str]]

    def __len__(self) -> int:
        return len(self.questions)


def _mmqa_question(path: Path, lineno: int, obj: dict) -> MMQAQuestion:
    at = f"{path}: line {lineno}"
    for key in ("qid", "question"):
        if not isinstance(obj.get(key), str):
            raise ValueError(f"{at}: missing or non-string required field {key!r}")
    answers = []
    for a in obj.get("answers") or []:
        if not isinstance(a, dict) or "answer" not in a:
            raise ValueError(f"{at}: field 'answers': expected objects with an 'answer' key, got {a!r}")
        answers.append(_scalar_str(a["answer"], f"{at}: field 'answers'"))
    supporting = []
    for c in obj.get("supporting_context") or []:
        if not isinstance(c, dict) or not isinstance(c.get("doc_id"), str):
            raise ValueError(f"{at}: field 'supporting_context': expected objects with a 'doc_id', got {c!r}")
        supporting.append((c["doc_id"], str(c.get("doc_part", ""))))
    meta = obj.get("metadata") or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{at}: field 'metadata': expected an object")
    table_id = meta.get("table_id")
    if table_id is not None and not isinstance(table_id, str):
        raise ValueError(f"{at}: field 'metadata.table_id': expected a string, got {table_id!r}")
    modalities = meta.get("modalities")
    if modalities is None:
        modalities = list(dict.fromkeys(part for _, part in supporting if part))
    return MMQAQuestion(
        qid=obj["qid"], question=obj["question"], answers=tuple(answers), supporting=tuple(supporting),
        image_doc_ids=_str_list(meta.get("image_doc_ids"), f"{at}: field 'metadata.image_doc_ids'"),
        text_doc_ids=_str_list(meta.get("text_doc_ids"), f"{at}: field 'metadata.text_doc_ids'"),
        table_id=table_id or None,
        modalities=_str_list(modalities, f"{at}: field 'metadata.modalities'"),
        qtype=_scalar_str(meta.get("type", ""), f"{at}: field 'metadata.type'"),
    )


def load_mmqa(questions_path: str | os.PathLike, images_path: str | os.PathLike | None = None) -> MMQA:
    """Load MultimodalQA questions (``MMQA_dev.jsonl.gz``; plain .jsonl works too).

    With ``images_path`` (``MMQA_images.jsonl.gz``: lines with ``id``, ``title``, ``path``) the
    image table is loaded as well. Optional keys may be missing; a line without a string
    ``qid`` / ``question`` (or an image line without ``id``) raises ValueError naming the file and
    line. Duplicate ids raise ValueError too.
    """
    qpath = _as_path(questions_path, "questions_path")
    _require_file(qpath, "questions_path")
    questions, seen = [], set()
    for lineno, obj in _jsonl(qpath):
        q = _mmqa_question(qpath, lineno, obj)
        if q.qid in seen:
            raise ValueError(f"{qpath}: line {lineno}: duplicate qid {q.qid!r}")
        seen.add(q.qid)
        questions.append(q)

    images: dict[str, tuple[str, str]] = {}
    if images_path is not None:
        ipath = _as_path(images_path, "images_path")
        _require_file(ipath, "images_path")
        for lineno, obj in _jsonl(ipath):
            image_id = obj.get("id")
            if not isinstance(image_id, str):
                raise ValueError(f"{ipath}: line {lineno}: missing or non-string required field 'id'")
            if image_id in images:
                raise ValueError(f"{ipath}: line {lineno}: duplicate id {image_id!r}")
            images[image_id] = (str(obj.get("title", "")), str(obj.get("path", "")))
    return MMQA(tuple(questions), images)


# --------------------------------------------------------------------------- BEIR / ViDoRe

@dataclass(frozen=True)
class BeirDataset:
    """A BEIR-style retrieval set.

    * ``corpus``: id -> the corpus line without ``_id`` (``title``, ``text``, ...); a relative
      ``image`` path is resolved against the folder (``str(folder / image)``).
    * ``queries``: id -> query text.
    * ``qrels``: query id -> {corpus id: graded relevance} for the split (scores kept as given,
      0 included); only queries with at least one qrels line appear.
    """

    corpus: dict[str, dict]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    folder: Path
    split: str


def _beir_id(value, at: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(f"{at}: missing or invalid '_id' ({value!r})")
    return str(value)


def _unique_id_lines(path: Path, seen: dict):
    """``(where, _id, object)`` per JSON line of `path`; an ``_id`` already in `seen` is an error."""
    for lineno, obj in _jsonl(path):
        at = f"{path}: line {lineno}"
        item_id = _beir_id(obj.get("_id"), at)
        if item_id in seen:
            raise ValueError(f"{at}: duplicate _id {item_id!r}")
        yield at, item_id, obj


def _read_qrels(path: Path, corpus: dict, queries: dict) -> dict[str, dict[str, int]]:
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\r\n").split("\t")
            if lineno == 1 and cols[0].strip().lower() in ("query-id", "query_id", "qid"):
                continue  # header
            at = f"{path}: line {lineno}"
            if len(cols) != 3:
                raise ValueError(f"{at}: expected 3 tab-separated columns (query-id, corpus-id, score), got {len(cols)}")
            qid, did, score_s = (c.strip() for c in cols)
            try:
                score_f = float(score_s)
            except ValueError:
                raise ValueError(f"{at}: score {score_s!r} is not a number") from None
            if not score_f.is_integer():
                raise ValueError(f"{at}: score {score_s!r} is not an integer")
            if qid not in queries:
                raise ValueError(f"{at}: unknown query id {qid!r}")
            if did not in corpus:
                raise ValueError(f"{at}: unknown corpus id {did!r}")
            qrels.setdefault(qid, {})[did] = int(score_f)
    return qrels


def load_beir(folder: str | os.PathLike, *, split: str = "test") -> BeirDataset:
    """Load ``folder/corpus.jsonl``, ``folder/queries.jsonl`` and ``folder/qrels/<split>.tsv``.

    Raises FileNotFoundError for a missing file (with its path) and ValueError naming the file
    and line for malformed lines, duplicate ids and qrels that reference unknown ids.
    """
    folder = _as_path(folder, "folder")
    if not isinstance(split, str) or not split or Path(split).name != split:
        raise ValueError(f"split: expected a split name such as 'test', got {split!r}")
    paths = {"corpus": folder / "corpus.jsonl", "queries": folder / "queries.jsonl",
             "qrels": folder / "qrels" / f"{split}.tsv"}
    for name, p in paths.items():
        _require_file(p, name)

    corpus: dict[str, dict] = {}
    for at, doc_id, obj in _unique_id_lines(paths["corpus"], corpus):
        entry = {k: v for k, v in obj.items() if k != "_id"}
        image = entry.get("image")
        if image is not None:
            if not isinstance(image, str):
                raise ValueError(f"{at}: field 'image': expected a path string, got {type(image).__name__}")
            entry["image"] = str(folder / image)  # an absolute image path stays as it is
        corpus[doc_id] = entry

    queries: dict[str, str] = {}
    for at, qid, obj in _unique_id_lines(paths["queries"], queries):
        if not isinstance(obj.get("text"), str):
            raise ValueError(f"{at}: missing or non-string field 'text'")
        queries[qid] = obj["text"]

    qrels = _read_qrels(paths["qrels"], corpus, queries)
    return BeirDataset(corpus=corpus, queries=queries, qrels=qrels, folder=folder, split=split)
