"""How much of what upstream accepts our extraction parsers keep, on a folder of real responses.

For every response (one UTF-8 text file per model answer, any name ending in ``.txt``) the
script applies its own re-implementation of the upstream projects' record-splitting rules,
written from reading their code (nothing is imported from them), and then our
:func:`colgraph_engine.kg.parse_extraction` as a user would call it (dialect detected, lenient;
also strict, to count crashes). Per dialect it reports the entities and relations upstream's
rules accept, how many of those our parser keeps, the records only we keep, and crashes
(any exception in lenient mode; any exception but ``ExtractionFormatError`` in strict mode).

Upstream rules (as read; the exact clauses are in the functions below):

``tuple``  LightRAG before its line format (``_handle_single_entity_extraction`` /
           ``_handle_single_relationship_extraction``), nano-graphrag, GraphRAG's graph
           extractor and mKG-RAG (``rag/multimodal/build.py``): the answer is cut at the record
           delimiters (``##``; mKG-RAG's ``<|RECORD|>``) and the completion marker; in each
           piece the first ``(...)`` on one line (``re.search(r"\\((.*)\\)")``) is split at
           ``<|>``, fields stripped, empty ones dropped (``split_string_by_multi_markers``). An
           entity is a record whose first field is ``"entity"`` (quoted) with at least 4 fields
           and a non-empty name; a relationship has first field ``"relationship"`` and at least 5
           fields (mKG-RAG: at least 4), non-empty ends. The strength is the last field if it is
           a number, else 1.0 (so no record is lost for its strength).
``lightrag``  LightRAG's current ``_process_extraction_result``: lines (and the completion
           marker) separate records; a line holding several records joined by ``<|#|>entity<|#|>``
           or ``<|#|>relation<|#|>`` is cut there; mangled delimiters (``<|>``, ``<|#>``, ``<#|>``,
           ``<||>``...) are read as ``<|#|>``; an entity has exactly 4 fields, a non-empty name,
           a type without ``' ( ) < > | / \\`` and a non-empty description; a relation exactly 5
           fields and two different non-empty ends.
``lightrag_json``  JSON answers (LightRAG's JSON mode and its ``entity_name`` /
           ``source_entity`` prompt, fast-graphrag's ``entities`` / ``relationships`` /
           ``other_relationships``): an entity needs a non-empty name, a relation two non-empty
           ends (the pydantic/JSON loaders upstream).
``mkg_mapping``  mKG-RAG's ``_handle_single_mapping_extraction``: first field ``"mapping"`` and
           at least 4 fields.

Reasoning in ``<think>...</think>`` is removed before the upstream rules run (LightRAG's
``remove_think_tags`` does so for the leading block; we remove every block), so drafts written
while thinking do not count. A response's dialect is the format its records follow (:func:`classify`:
parenthesised ``<|>`` records, ``<|#|>`` lines, JSON keys); a response with none of them is
counted in the ``none`` row only.

Records are matched by key, not counted: an entity by its normalised name, a relation by its
unordered pair of normalised names (nano-graphrag sorts the pair); "kept" is the size of the
multiset intersection, so a record we read differently (an entity taken for a relation) is a
loss even if the totals agree.

    .venv/bin/python benchmarks/parser_coverage.py /tmp/parser_corpus/raw [--out benchmarks/results]

Writes ``parser_coverage.md`` and ``parser_coverage.json`` (counts only, no text from the corpus).
"""
from __future__ import annotations

import html
import json
import re
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _harness as h  # noqa: E402
from colgraph_engine.kg import ExtractionFormatError, normalize_name, parse_extraction  # noqa: E402
from colgraph_engine.kg.records import clean_field  # noqa: E402

DIALECTS = ("tuple", "lightrag", "lightrag_json", "mkg_mapping")

_THINK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.IGNORECASE | re.DOTALL)
_LEADING_THINK = re.compile(r"^.*?</think(?:ing)?>", re.IGNORECASE | re.DOTALL)
_FLOAT = re.compile(r"^[-+]?[0-9]*\.?[0-9]+$")  # LightRAG's / mKG-RAG's is_float_regex


def _key(name: str) -> str:
    return normalize_name(clean_field(html.unescape(name)))


def _pair(a: str, b: str) -> tuple[str, str]:
    x, y = _key(a), _key(b)
    return (x, y) if x <= y else (y, x)


def _split_markers(text: str, markers: list[str], ignorecase: bool = False) -> list[str]:
    """``split_string_by_multi_markers``: split at any marker, strip, drop empty pieces."""
    flags = re.IGNORECASE if ignorecase else 0
    pieces = re.split("|".join(re.escape(m) for m in markers), text, flags=flags)
    return [p.strip() for p in pieces if p.strip()]


def _without_think(text: str) -> str:
    text = _THINK.sub("", text)
    if re.search(r"</think(?:ing)?>", text, re.IGNORECASE) and not re.search(r"<think", text, re.IGNORECASE):
        text = _LEADING_THINK.sub("", text, count=1)
    return text


# --- upstream rules, re-implemented -------------------------------------------------------

def upstream_tuple(text: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """(entity keys, relation pairs, mapping refs) accepted by the tuple-dialect rules."""
    mkg = "<|RECORD|>".lower() in text.lower()
    entities, relations, mappings = [], [], []
    for record in _split_markers(text, ["##", "<|RECORD|>", "<|COMPLETE|>"], ignorecase=True):
        match = re.search(r"\((.*)\)", record)
        if match is None:
            continue
        attrs = _split_markers(match.group(1), ["<|>"])
        if not attrs:
            continue
        if attrs[0] == '"entity"' and len(attrs) >= 4:
            if _key(attrs[1]):
                entities.append(_key(attrs[1]))
        elif attrs[0] == '"relationship"' and len(attrs) >= (4 if mkg else 5):
            if _key(attrs[1]) and _key(attrs[2]) and _key(attrs[1]) != _key(attrs[2]):
                relations.append(_pair(attrs[1], attrs[2]))
        elif attrs[0] == '"mapping"' and len(attrs) >= 4:
            mappings.append(clean_field(attrs[1]).lower())
    return entities, relations, mappings


# LightRAG's fix_tuple_delimiter_corruption for the core "#", as a cascade of substitutions
# applied in this order (each one's pattern as we read it).
_REPAIRS = [re.compile(p) for p in (
    r"<\|#\|*?#\|>",           # <|##|>, <|#||#|>
    r"<\|\\#\|>",             # <|\#|>
    r"<\|+>",                  # <|>, <||>
    r"<.?\|#\|.?>",             # <X|#|>, <|#|Y>, <||#||>
    r"<\|?#\|?>",               # <#>, <#|>, <|#>
    r"<[^|]#\|>|<\|#[^|]>",     # <X#|>, <|#X>
    r"<\|#\|+(?!>)",             # <|#|  (closing bracket lost)
    r"<\|#:(?!>)",              # <|#:
)]


def _repair(record: str, delim: str = "<|#|>") -> str:
    for pattern in _REPAIRS:
        record = pattern.sub(delim, record)
    return record


def _lightrag_name(text: str) -> str:
    """The name after LightRAG's cleaning, as a key; "" where it drops the name (short digit
    strings, short strings of digits and dots)."""
    name = clean_field(html.unescape(text))
    if len(name) < 3 and name.isdigit():
        return ""
    if len(name) < 6 and "." in name and all(c.isdigit() or c == "." for c in name):
        return ""
    return _key(name)


def upstream_lightrag(text: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Entity keys and relation pairs accepted by LightRAG's current line-format rules."""
    delim = "<|#|>"
    entities, relations, quirks = [], [], []
    records = _split_markers(text, ["\n", "<|COMPLETE|>", "<|complete|>"])
    fixed = []
    for record in records:
        for entity_piece in _split_markers(record, [f"{delim}entity{delim}"]):
            if not entity_piece.startswith(("entity", "relation")):
                # Upstream prefixes "entity<|" (sic) to a line without a record kind; with 4
                # fields it then reads the line's SECOND field as the name (often the type).
                # Such records are counted apart (``quirks``), not as records to keep.
                entity_piece = f"entity<|{entity_piece}"
            for piece in _split_markers(entity_piece, [f"{delim}relationship{delim}", f"{delim}relation{delim}"]):
                if not piece.startswith(("entity", "relation")):
                    piece = f"relation{delim}{piece}"
                fixed.append(piece)
    for record in fixed:
        attrs = _split_markers(_repair(record), [delim])
        if len(attrs) == 4 and "entity" in attrs[0]:
            name, type_, desc = _lightrag_name(attrs[1]), clean_field(attrs[2]), clean_field(attrs[3])
            if name and type_ and desc and not any(c in type_ for c in "'()<>|/\\"):
                (quirks if attrs[0].startswith("entity<|") else entities).append(name)
        elif len(attrs) == 5 and "relation" in attrs[0]:
            a, b = _lightrag_name(attrs[1]), _lightrag_name(attrs[2])
            if a and b and a != b:
                relations.append(_pair(attrs[1], attrs[2]))
    upstream_lightrag.quirks += len(quirks)
    return entities, relations, []


upstream_lightrag.quirks = 0


def upstream_json(text: str) -> tuple[list[str], list[tuple[str, str]], list[str]]:
    """Entity keys and relation pairs from a JSON answer (first "{" to last "}")."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        return [], [], []
    try:
        data = json.loads(text[start:end + 1])
    except (ValueError, RecursionError):
        return [], [], []
    if not isinstance(data, dict):
        return [], [], []
    entities, relations = [], []
    for item in data.get("entities") or []:
        if isinstance(item, dict):
            name = item.get("name", item.get("entity_name"))
            if isinstance(name, str) and _key(name):
                entities.append(_key(name))
    for key in ("relationships", "relations", "other_relationships"):
        for item in data.get(key) or []:
            if isinstance(item, dict):
                a = item.get("source", item.get("source_entity"))
                b = item.get("target", item.get("target_entity"))
                if isinstance(a, str) and isinstance(b, str) and _key(a) and _key(b) and _key(a) != _key(b):
                    relations.append(_pair(a, b))
    return entities, relations, []


RULES = {"tuple": upstream_tuple, "lightrag": upstream_lightrag, "lightrag_json": upstream_json}


# --- measurement ----------------------------------------------------------------------------

_TUPLE_SIGN = re.compile(r"\(\s*[\"']?(?:entity|relationship|mapping)[\"']?\s*<\|>", re.IGNORECASE)
_LINE_SIGN = re.compile(r"^\s*(?:entity|relation|relationship)\s*<\|#\|>", re.IGNORECASE | re.MULTILINE)
_JSON_SIGN = re.compile(r"\"(?:entities|relationships)\"\s*:")


def classify(text: str) -> str | None:
    """The prompt format a response follows, from its own signature (the upstream rule set
    that applies to it): parenthesised ``<|>`` records, ``<|#|>`` lines, or JSON; the most
    frequent signature wins, and JSON wins whenever its keys are present."""
    if _JSON_SIGN.search(text):
        return "lightrag_json"
    tuples, lines = len(_TUPLE_SIGN.findall(text)), len(_LINE_SIGN.findall(text))
    if not (tuples or lines):
        return None
    return "tuple" if tuples >= lines else "lightrag"


def _kept(upstream: list, ours: list) -> int:
    return sum((Counter(upstream) & Counter(ours)).values())


def ours_crash(text: str) -> tuple[object, tuple[str, str] | None]:
    """``(lenient result or None, (mode, traceback) of a crash or None)``: a lenient call must
    not raise, a strict one may raise only ``ExtractionFormatError``."""
    try:
        ours = parse_extraction(text)
    except Exception:  # noqa: BLE001 - a crash is what is counted here
        return None, ("lenient", traceback.format_exc(limit=3))
    try:
        parse_extraction(text, strict=True)
    except ExtractionFormatError:
        pass
    except Exception:  # noqa: BLE001
        return ours, ("strict", traceback.format_exc(limit=3))
    return ours, None


def count(row: Counter, ours, ents: list, rels: list, maps: list) -> None:
    """Adds one response's upstream records, the ones we keep and the ones only we keep to `row`."""
    our_ents = [e.key for e in ours.entities]
    our_rels = [_pair(r.source, r.target) for r in ours.relations]
    our_maps = [f"<{m.kind}>" if m.ref is None else f"<{m.kind}_{m.ref}>" for m in ours.mappings]
    up_maps = [re.sub(r"[-_ ]", "_", m) for m in maps]
    for kind, up, got in (("entities", ents, our_ents), ("relations", rels, our_rels), ("mappings", up_maps, our_maps)):
        row[f"upstream_{kind}"] += len(up)
        row[f"kept_{kind}"] += _kept(up, got)
    row["only_ours_entities"] += len(our_ents) - _kept(ents, our_ents)
    row["only_ours_relations"] += len(our_rels) - _kept(rels, our_rels)
    row["our_errors"] += len(ours.errors)
    row["our_warnings"] += len(ours.warnings)


def measure(folder: Path) -> dict:
    """``{"rows": {dialect: counts}, "crashes": [(file, mode, trace)], "files": n}`` over `folder`."""
    files = sorted(folder.glob("*.txt"))
    if not files:
        raise ValueError(f"folder: no .txt responses in {folder}")
    rows = {d: Counter() for d in (*DIALECTS, "none")}
    crashes = []
    for path in tqdm(files, desc="responses", unit="resp"):
        text = path.read_text(encoding="utf-8", errors="replace")
        clean = _without_think(text)
        name = classify(clean)
        before = upstream_lightrag.quirks
        ents, rels, maps = RULES[name](clean) if name else ([], [], [])
        rows[name or "none"]["upstream_quirks"] += upstream_lightrag.quirks - before
        if maps and not ents and not rels:
            name = "mkg_mapping"
        if not (ents or rels or maps):
            name = "none"
        row = rows[name]
        row["responses"] += 1
        ours, crash = ours_crash(text)
        if crash:
            crashes.append((path.name, *crash))
            row["crashes"] += 1
        if ours is not None:
            count(row, ours, ents, rels, maps)
    return {"rows": {d: dict(c) for d, c in rows.items()}, "crashes": crashes, "files": len(files)}


def share(kind: str):
    """A table cell: the kept share of upstream's `kind` records."""
    def cell(row):
        kept, total = row.get(f"kept_{kind}", 0), row.get(f"upstream_{kind}", 0)
        return f"{100 * kept / total:.2f}%" if total else "n/a"
    return cell


COLUMNS = [("dialect", "dialect"), ("responses:", "responses"), ("upstream entities:", "upstream_entities"),
           ("kept:", "kept_entities"), ("share:", share("entities")), ("upstream relations:", "upstream_relations"),
           ("kept:", "kept_relations"), ("share:", share("relations")), ("upstream mappings:", "upstream_mappings"),
           ("kept:", "kept_mappings"),
           ("only ours (ent / rel):", lambda r: f"{r.get('only_ours_entities', 0)} / "
                                                f"{r.get('only_ours_relations', 0)}"),
           ("upstream quirks:", "upstream_quirks"), ("crashes:", "crashes")]


def main(argv: list[str] | None = None) -> int:
    parser = h.parser(__doc__, quick=False)
    parser.add_argument("folder", type=Path, help="folder of responses, one .txt file each")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        parser.error(f"folder: not a directory: {args.folder}")
    start = time.perf_counter()
    result = measure(args.folder)
    seconds = round(time.perf_counter() - start, 2)
    zeros = dict.fromkeys((c for _, c in COLUMNS if isinstance(c, str)), 0)  # a dialect no response used
    rows = [{**zeros, "dialect": d, **r} for d, r in result["rows"].items()]
    body = [f"{result['files']} responses ({seconds} s). Upstream = this script's re-implementation of each "
            "project's splitting rules (see its docstring); kept = records our `parse_extraction` (detected "
            "dialect, lenient) returns with the same key; only ours = records we keep that upstream's rules drop. "
            "Counts only; the corpus itself is not in the repository.", "", *h.table(COLUMNS, rows)]
    h.write("parser_coverage", "Parser coverage on real extraction responses", body,
            {"meta": {"seconds": seconds, "responses": result["files"]}, **result}, args.out)
    for name, mode, trace in result["crashes"][:5]:
        print(f"CRASH {name} ({mode}):\n{trace}", file=sys.stderr)
    return 1 if result["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
