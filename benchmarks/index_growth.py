"""Index growth report: adding one document to a 10,000-document index, in place vs today's full
re-assembly, and the memory an opened index holds.

Usage (from the repository root)::

    .venv/bin/python benchmarks/index_growth.py            # 10,000 documents (about 3-5 minutes)
    .venv/bin/python benchmarks/index_growth.py --quick    # 200 documents, a smoke test (seconds)

Corpus: ``pipeline_report.make_document`` (5 segments, 10 entities with a shared pool so alias
groups span documents, 10 relations, one 32x32 image with objects and region matches), graphs
built by ``build_document_graph`` and embedded by ``Encoders.offline()`` (fp32).

Add one document (each timed call adds a different, pre-built and pre-encoded document, so
building and encoding are excluded; the merged graph is assembled before every call, as a
serving index has it):

* ``in place``: ``add_documents([graph], [vectors])``: checks, store append, and the merged
  graph, uids and alias groups grown in place (this change);
* ``re-assembly``: the same call with the graph not grown (what the index did before this
  change) followed by ``KnowledgeIndex._reassemble()``, the full assembly the next query needed
  (concatenated columns, ``from_arrays``, aliases from every entity name).

Both run on an in-memory index (``memory``) and on a directory-backed one (``directory``, index
format 3: the call also appends the rows to the vector files, writes one part file (absorbing the
small parts at the end of the list) and replaces the manifest, which lists parts, not documents;
the new files, the parts folder and the manifest are fsync'ed in one concurrent round). Ratio =
re-assembly median / in-place median. The fsyncs of each directory add are
counted (``os.fsync`` wrapped).

Open: in a fresh subprocess, ``VmRSS`` before and after ``KnowledgeIndex.open`` (verify off and
on) and after assembling the merged graph, against the graph's own bytes: the parts folder
(graph columns, strings and item tables as stored; the vectors live in ``vectors/``), and the
native graph's ``memory_bytes()``. Mapped pages count in ``VmRSS`` once touched (part columns
the open validates, names the aliases read).

Writes ``results/index_growth.md``, ``.json`` and ``.png`` beside this file (``--quick``: into
``--out`` only when given).
"""
from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import sys
import tempfile
from unittest import mock

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import _harness as h  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document  # noqa: E402
from pipeline_report import make_document, shared_names  # noqa: E402

# In a fresh process: VmRSS before and after KnowledgeIndex.open(argv[1], verify=argv[2]) and after
# assembling the merged graph.
_OPEN_CHILD = """
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
from colgraph_engine.kg import KnowledgeIndex
import colgraph_engine.kg.parts, tqdm.auto  # noqa: F401 - imports are not what is measured
before = rss()
t0 = time.perf_counter()
idx = KnowledgeIndex.open(sys.argv[1], verify=sys.argv[2] == "1")
t1 = time.perf_counter()
opened = rss()
g = idx.graph
t2 = time.perf_counter()
vec = sum(st.values.numel() * st.values.element_size() for st in idx.stores.values())
print(json.dumps({"open_s": t1 - t0, "assemble_s": t2 - t1, "rss_open": opened - before,
                  "rss_assembled": rss() - before, "vector_bytes": vec, "graph_native_bytes": g.memory_bytes(),
                  "nodes": g.n_nodes, "edges": g.n_edges}))
"""


def prepared(numbers, shared, enc):
    """Pre-built graphs and vectors of documents `numbers` (outside every timing)."""
    graphs = [build_document_graph(make_document(i, shared)) for i in numbers]
    return [(g, encode_document(g, enc)) for g in graphs]


def add(idx: KnowledgeIndex, g, v, *, in_place: bool = True) -> None:
    """One add; ``in_place=False`` re-enacts the add before this change."""
    if not in_place:
        idx._assembly = None  # the old add: no graph kept up to date ...
    idx.add_documents([g], [v])
    if not in_place:
        idx._assembly = idx._reassemble()  # ... so the next use re-assembled everything


def time_adds(idx: KnowledgeIndex, docs, *, in_place: bool) -> list[float]:
    """Seconds of one add per document of `docs`, the merged graph assembled before each call (as a
    serving index has it)."""
    times = []
    for g, v in docs:
        idx.graph  # noqa: B018 - assembled, untimed
        times.append(h.timed(add, idx, g, v, in_place=in_place)[1])
    return times


def summary(times: list[float]) -> dict:
    return {"median_ms": 1e3 * statistics.median(times), "p90_ms": 1e3 * h.percentile(times, 90), "n": len(times)}


def to_markdown(rep: dict) -> list[str]:
    lines = [f"Index: {rep['counts']['nodes']:,} nodes, {rep['counts']['edges']:,} edges, "
             f"{rep['vector_bytes'] / 2**20:,.0f} MiB of vectors (fp32).", "",
             "| index | in place median (p90) | re-assembly median (p90) | ratio |", "|---|---|---|---|"]
    for kind in ("memory", "directory"):
        a, b = rep["add"][kind]["in_place"], rep["add"][kind]["reassembly"]
        lines.append(f"| {kind} | {a['median_ms']:.2f} ms ({a['p90_ms']:.2f}) | {b['median_ms']:.1f} ms "
                     f"({b['p90_ms']:.1f}) | {b['median_ms'] / a['median_ms']:.1f}x |")
    d = rep["add"]["directory"]["commit_parts_ms"]
    lines += ["", f"Directory adds: of the in-place call, the commit (vector appends, one part file, the parts "
                  f"folder and a manifest of {rep['manifest_bytes'] / 1024:,.1f} KiB fsync'ed in one concurrent round, "
                  f"then the index folder after the rename) takes {d:.2f} ms (median); "
                  f"{rep['add']['directory']['fsyncs_per_add']:.0f} fsyncs per add (os.fsync calls counted). "
                  "Re-assembly "
                  f"concatenates the documents' columns: a mapped part (directory) gives them in one slice each, a "
                  f"document held in memory gives its own arrays.", "",
              "| open (fresh process) | open s | RSS after open | RSS after assembling the graph | "
              "graph bytes: parts / native | RSS after assembling / (parts + native) |", "|---|---|---|---|---|---|"]
    for key, o in rep["open"].items():
        own = rep["parts_bytes"] + o["graph_native_bytes"]
        lines.append(f"| verify={key} | {o['open_s']:.1f} | {o['rss_open'] / 2**20:,.0f} MiB | "
                     f"{o['rss_assembled'] / 2**20:,.0f} MiB | {rep['parts_bytes'] / 2**20:,.0f} / "
                     f"{o['graph_native_bytes'] / 2**20:,.0f} MiB | {o['rss_assembled'] / own:.2f}x |")
    lines += ["", f"Vectors ({rep['vector_bytes'] / 2**20:,.0f} MiB) are memory-mapped: reading them whole, as "
                  f"format 1 did, would add at least that much."]
    return lines


def measure(n: int, adds: int, tmp: pathlib.Path) -> dict:
    """The report's figures for a `n`-document index, `adds` timed adds per kind and index."""
    enc = Encoders.offline()
    shared = shared_names(n)
    idx = KnowledgeIndex(enc)
    for lo in tqdm(range(0, n, 1000), desc=f"building {n:,} documents"):
        idx.add_documents([make_document(i, shared) for i in range(lo, min(n, lo + 1000))])
    extra = prepared(range(n, n + 4 * adds), shared, enc)
    batches = [extra[k * adds:(k + 1) * adds] for k in range(4)]
    rep = {"documents": n, "counts": idx.counts, "add": {},
           "vector_bytes": sum(st.values.numel() * st.values.element_size() for st in idx.stores.values())}
    rep["add"]["memory"] = {"in_place": summary(time_adds(idx, batches[0], in_place=True)),
                            "reassembly": summary(time_adds(idx, batches[1], in_place=False))}
    path = tmp / "index"
    idx.save(path)
    del idx
    rep["parts_bytes"] = sum(f.stat().st_size for f in (path / "parts").rglob("*") if f.is_file())
    rep["open"] = {key: h.run_json([sys.executable, "-c", _OPEN_CHILD, str(path), flag], timeout=900)
                   for key, flag in (("off", "0"), ("on", "1"))}
    opened = KnowledgeIndex.open(path, enc, verify=False)
    with mock.patch.object(os, "fsync", wraps=os.fsync) as fsync:  # counted, the real call runs
        in_place = time_adds(opened, batches[2], in_place=True)
    commit = []
    for g, v in batches[3][: max(1, adds // 2)]:  # the commit alone (no graph work at all)
        opened._assembly = None
        commit.append(h.timed(opened.add_documents, [g], [v])[1])
    rep["add"]["directory"] = {"in_place": summary(in_place),
                               "reassembly": summary(time_adds(opened, batches[3][len(commit):] or batches[3],
                                                               in_place=False)),
                               "commit_parts_ms": 1e3 * statistics.median(commit),
                               "fsyncs_per_add": fsync.call_count / len(in_place)}
    rep["manifest_bytes"] = (path / "manifest.json").stat().st_size
    return rep


def main(argv=None) -> int:
    ap = h.parser(__doc__, out=None)  # --quick: 200 documents, 5 adds
    ap.add_argument("--documents", type=int, default=10_000)
    ap.add_argument("--adds", type=int, default=20, help="timed adds per kind")
    args = ap.parse_args(argv)
    n, adds = (200, 5) if args.quick else (args.documents, args.adds)
    torch.set_num_threads(1)
    e = h.env()
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="index-growth-"))
    try:
        rep = measure(n, adds, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stem = h.stem("index_growth", args)
    out = h.write(stem, f"Index growth: add one document to a {n:,}-document index", to_markdown(rep), rep,
                  args.out or (None if args.quick else HERE / "results"), e=e)
    if out is not None:
        kinds = ["memory", "directory"]
        series = {label: {k: rep["add"][k][key]["median_ms"] for k in kinds}
                  for label, key in (("in place", "in_place"), ("re-assembly", "reassembly"))}
        h.bar_plot(out / f"{stem}.png", kinds, series, ylabel="add one document, median ms",
                   title=f"{n:,} documents, {e['cpu_model']}", labels="{:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
