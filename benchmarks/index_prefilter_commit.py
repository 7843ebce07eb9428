"""Per-add commit time and bytes written by a directory index with a carried prefilter, against
index size: appended pieces (the default) vs the whole prefilter folder written per commit (the
layout before pieces) vs no prefilter, in the same process on the same documents.

Usage (from the repository root)::

    .venv/bin/python benchmarks/index_prefilter_commit.py            # 500, 1,000, 2,000, 4,000 documents, 30 adds (about 40 s)
    .venv/bin/python benchmarks/index_prefilter_commit.py --quick    # 200, 400 documents, 6 adds

Corpus: ``tests.test_kg_index_growth.city_doc`` (the offline city documents of the index tests,
offline encoders: one 22-token segment each, so the segment store holds 22 tokens per document;
the pipeline report's corpus builds a 4,000-document prefilter in minutes on two cores, this one
in seconds). Per size, one directory index is built, ``enable_prefilter()`` (defaults: segment
and table stores, nbits 2) is committed, and the directory is copied, so the two prefilter lanes
start from the same base; the third lane is the same documents without a prefilter. Then
``--adds`` rounds each add one new document to every lane in turn (``add_document``, one
commit); a lane's figure is the median over its rounds.

* ``pieces``: the default: each commit appends one piece file (merged as a binary counter;
  compacted once the pieces hold more items than the base), see ``kg/index/prefilters.py``.
* ``whole``: ``index._pf_append = False``: each commit writes the store's prefilter folder whole.
* ``none``: no carried prefilter.

Bytes written per commit are counted from the files: a file that is new (or replaced: another
inode under the same name, as the manifest) counts whole, a file that grew counts its growth
(vector files are appended to). ``prefilter`` bytes are those under ``prefilter/``.

Writes ``results/index_prefilter_commit.{md,json,png}`` (``--quick``: only with ``--out``).
"""
from __future__ import annotations

import pathlib
import shutil
import statistics
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from tqdm import tqdm  # noqa: E402

import _harness as h  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex  # noqa: E402
from tests.test_kg_index_growth import city_doc  # noqa: E402

LANES = ("none", "pieces", "whole")
STYLES = {"none": ("o:", "tab:gray"), "pieces": ("o-", "tab:blue"), "whole": ("s--", "tab:orange")}


def file_table(path: pathlib.Path) -> dict[pathlib.Path, tuple[int, int]]:
    """``{file: (inode, size)}`` of every file under `path`."""
    out = {}
    for p in path.rglob("*"):
        if p.is_file():
            st = p.stat()
            out[p] = (st.st_ino, st.st_size)
    return out


def written_bytes(before: dict, after: dict, under: pathlib.Path | None = None) -> int:
    """Bytes the change between two :func:`file_table` snapshots wrote (new or replaced files
    whole, grown files their growth), optionally only below `under`."""
    total = 0
    for p, (ino, size) in after.items():
        if under is not None and under not in p.parents:
            continue
        old = before.get(p)
        total += size if old is None or old[0] != ino else max(0, size - old[1])
    return total


def prefilter_files(path: pathlib.Path) -> int:
    return sum(1 for p in (path / "prefilter").rglob("*") if p.is_file())


def run_size(n: int, adds: int, enc: Encoders, tmp: pathlib.Path) -> dict:
    """The three lanes of a `n`-document index, `adds` one-document commits each, the lanes in turn."""
    paths = {lane: tmp / f"n{n}-{lane}" for lane in LANES}
    plain = KnowledgeIndex.create(paths["none"], enc)
    build_s = h.timed(plain.add_documents, [city_doc(i) for i in range(n)])[1]
    shutil.copytree(paths["none"], paths["pieces"], ignore=shutil.ignore_patterns(".lock"))
    carried = KnowledgeIndex.open(paths["pieces"], enc)
    prefilter_build_s = h.timed(carried.enable_prefilter)[1]
    shutil.copytree(paths["pieces"], paths["whole"], ignore=shutil.ignore_patterns(".lock"))
    index = {"none": plain, "pieces": carried, "whole": KnowledgeIndex.open(paths["whole"], enc)}
    index["whole"]._pf_append = False
    snap = carried.prefilter("segment").snapshot()
    base_bytes = sum(p.stat().st_size for p in (paths["pieces"] / "prefilter").rglob("*") if p.is_file())
    rows = {lane: {"seconds": [], "bytes": [], "prefilter_bytes": []} for lane in LANES}
    for r in tqdm(range(adds), desc=f"{n:,} documents", unit="round", leave=False):
        doc = city_doc(n + r)
        for lane, row in rows.items():
            before = file_table(paths[lane])
            row["seconds"].append(h.timed(index[lane].add_document, doc)[1])
            after = file_table(paths[lane])
            row["bytes"].append(written_bytes(before, after))
            row["prefilter_bytes"].append(written_bytes(before, after, paths[lane] / "prefilter"))
    for lane in ("pieces", "whole"):  # both lanes hold the same prefilter (tests check array equality)
        rows[lane]["last_change"] = index[lane].prefilter_info()["stores"]["segment"]["last_change"]
        rows[lane]["prefilter_files_after"] = prefilter_files(paths[lane])
    open_s = {lane: h.timed(KnowledgeIndex.open, paths[lane], enc)[1] for lane in ("pieces", "whole")}
    for lane, row in rows.items():
        row["median_ms"] = 1000 * statistics.median(row["seconds"])
        row["median_bytes"] = statistics.median(row["bytes"])
        row["median_prefilter_bytes"] = statistics.median(row["prefilter_bytes"])
        row["mean_prefilter_bytes"] = statistics.mean(row["prefilter_bytes"])  # merges included
        shutil.rmtree(paths[lane])
    return {"documents": n, "segment_tokens": snap.n_tokens, "centroids": snap.n_centroids,
            "build_s": build_s, "prefilter_build_s": prefilter_build_s, "base_bytes": base_bytes,
            "open_s": open_s, "lanes": rows}


def to_markdown(rep: dict) -> list[str]:
    lines = [f"Corpus: the tests' offline city documents (one 22-token segment each); "
             f"`enable_prefilter()` defaults (segment store, nbits 2). {rep['adds']} adds per lane and size, "
             "the lanes in turn; medians. Bytes are counted from the files each commit wrote (new or replaced "
             "files whole, appended files their growth).", "",
             "| documents | segment tokens | prefilter base | none ms | pieces ms | whole ms | whole / pieces "
             "| pieces / none | bytes none | bytes pieces | bytes whole | prefilter bytes pieces (median / mean) | "
             "prefilter bytes whole | whole / pieces (mean bytes) | prefilter files after (pieces) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in rep["sizes"]:
        ln = s["lanes"]
        lines.append(
            f"| {s['documents']:,} | {s['segment_tokens']:,} | {s['base_bytes'] / 1e6:.2f} MB "
            f"| {ln['none']['median_ms']:.1f} | {ln['pieces']['median_ms']:.1f} | {ln['whole']['median_ms']:.1f} "
            f"| {ln['whole']['median_ms'] / ln['pieces']['median_ms']:.2f}x "
            f"| {ln['pieces']['median_ms'] / ln['none']['median_ms']:.2f}x "
            f"| {ln['none']['median_bytes']:,.0f} | {ln['pieces']['median_bytes']:,.0f} "
            f"| {ln['whole']['median_bytes']:,.0f} | {ln['pieces']['median_prefilter_bytes']:,.0f} / "
            f"{ln['pieces']['mean_prefilter_bytes']:,.0f} | {ln['whole']['median_prefilter_bytes']:,.0f} "
            f"| {ln['whole']['mean_prefilter_bytes'] / ln['pieces']['mean_prefilter_bytes']:,.0f}x "
            f"| {ln['pieces']['prefilter_files_after']} |")
    last = rep["sizes"][-1]
    ln = last["lanes"]
    lines += ["", f"At {last['documents']:,} documents an add commits in {ln['pieces']['median_ms']:.1f} ms with "
              f"appended pieces against {ln['whole']['median_ms']:.1f} ms writing the prefilter folder whole "
              f"({ln['whole']['median_ms'] / ln['pieces']['median_ms']:.2f}x) and {ln['none']['median_ms']:.1f} ms "
              f"without a prefilter; the prefilter bytes per add are "
              f"{ln['pieces']['mean_prefilter_bytes']:,.0f} on average over the {rep['adds']} adds (one piece: "
              "the added tokens' codes and residuals, a length and a uid per item; now and then the merged "
              f"earlier pieces again) against {ln['whole']['mean_prefilter_bytes']:,.0f} (the whole store's). "
              "Pieces' bytes per add do not grow with the store; the whole folder's grow linearly. What still "
              "grows with the store in the pieces lane is in memory: PrefilterIndex.add concatenates the codes "
              "and derives the inverted lists over every token. Open after the adds: "
              + ", ".join(f"{s['documents']:,} documents {s['open_s']['pieces'] * 1000:.0f} ms with pieces vs "
                          f"{s['open_s']['whole'] * 1000:.0f} ms whole" for s in rep["sizes"]) + "."]
    return lines


def plot(rep: dict, path: pathlib.Path) -> None:
    """Commit time and prefilter bytes per add against the index size, one line per lane."""
    def series(key: str, lanes) -> dict:
        return {lane: [s["lanes"][lane][key] for s in rep["sizes"]] for lane in lanes}
    h.line_panels(path, [s["documents"] for s in rep["sizes"]], {
        "commit time": {"ylabel": "median ms per add (one commit)", "series": series("median_ms", LANES)},
        "prefilter bytes per commit": {"ylabel": "prefilter bytes written per add (mean)", "log_y": True,
                                       "series": series("mean_prefilter_bytes", LANES[1:])}},
        xlabel="documents in the index", styles=STYLES)


def main(argv=None) -> int:
    ap = h.parser(__doc__, out=None)
    ap.add_argument("--sizes", default="500,1000,2000,4000")
    ap.add_argument("--adds", type=int, default=30)
    args = ap.parse_args(argv)
    sizes, adds = ([200, 400], 6) if args.quick else ([int(x) for x in args.sizes.split(",")], args.adds)
    enc = Encoders.offline()
    e = h.env()
    tmp = pathlib.Path(tempfile.mkdtemp())
    try:
        results, total_s = h.timed(lambda: [run_size(n, adds, enc, tmp)
                                            for n in tqdm(sizes, desc="sizes", unit="size")])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rep = {"adds": adds, "sizes": results, "total_s": total_s}
    out = h.write("index_prefilter_commit", "Commit cost of a carried prefilter: appended pieces vs the whole folder",
                  to_markdown(rep), rep, args.out or (None if args.quick else HERE / "results"), e=e)
    if out is not None:
        plot(rep, out / "index_prefilter_commit.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
