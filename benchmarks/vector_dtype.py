"""Token vectors on disk and in memory: fp32 / fp16 / bf16 / codes, one run, one corpus.

Usage (from the repository root)::

    .venv/bin/python benchmarks/vector_dtype.py                       # 10,000 documents
    .venv/bin/python benchmarks/vector_dtype.py --docs 100000 --dtypes float16 --no-prefilter --queries 16
    .venv/bin/python benchmarks/vector_dtype.py --quick                # 600 documents, a smoke run

Corpus and questions: ``benchmarks/lightrag_peer.py``'s (``pipeline_report.py``'s generator with
images stripped: 5 segments of 40-80 words, 10 entities, 10 relations per document), encoded
once with ``Encoders.offline(text_dim=128)`` and added (``add_documents``, 1,000 documents per
commit) to one directory index per dtype (``KnowledgeIndex.create(dtype=...)``), so every index
holds the same documents, numbers and vectors up to the cast.

Prefilter: the float32 index is made to carry the recall stores' prefilters
(``enable_prefilter`` with the minimum ``colgraph index build`` gives, one k-means); the other
indexes are given *that same prefilter* (same uids, same token counts; committed through the
index's own prefilter commit), so the dtype is the only difference between rows (an fp16 index's
own build would encode the fp16-rounded vectors; they differ from the fp32 ones far below the
2-bit residual step). ``--no-prefilter`` leaves it out (every row then runs exact MaxSim).

Rows, each a worker process of its own (its RSS is its own), called alternately one query at a
time: ``<dtype>`` = ``PipelineConfig()`` (auto recall: the carried prefilter's adaptive budget,
exact stage on the store's rows of the shortlist only); ``codes`` = the float16 index with
``prefilter_exact="codes"`` (the exact stage on the decoded residual codes: the store's token
rows are never read, as a codes-only index would serve); ``<dtype>-exact`` =
``recall_ranker="maxsim"`` (exact MaxSim over every token; float32-exact is the reference).

Measured: recall@Kd = share of float32-exact's top-10 documents in the row's top-10 (mean over
questions); p50 / p90 of ``retrieve`` minus query encoding; median per-stage times; disk bytes per
segment token (vector file / tokens; for codes: the prefilter's files / tokens); the index folder's
bytes; RSS (VmRSS, RssAnon, RssFile) after open and after the queries; the build time.

Writes ``results/vector_dtype.md`` / ``.json`` / ``.png`` (``--out`` elsewhere; ``--stem`` the
name).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import pathlib
import shutil
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
CACHE = HERE / ".cache" / "vector_dtype"
TEXT_DIM = 128
KD = 10
MEM_KEYS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")

import _harness as h  # noqa: E402


def mem() -> dict:
    """Bytes of this process's ``MEM_KEYS`` lines of /proc/self/status."""
    return {k: h.proc_bytes(k) for k in MEM_KEYS}


def folder_bytes(path: pathlib.Path) -> int:
    """Bytes of every file under `path` (0 when it does not exist)."""
    return sum(os.lstat(os.path.join(d, n)).st_size for d, _, names in os.walk(path) for n in names)


def build(n_docs: int, dtypes: list[str], folder: pathlib.Path, prefilter: bool, chunk: int = 1000) -> dict:
    """One directory index per dtype, the same documents and vectors; the fp32 one's prefilter
    given to the others. Returns build times and counts."""
    import torch

    import lightrag_peer as lp
    from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document
    enc = Encoders.offline(text_dim=TEXT_DIM)
    indexes = {dt: KnowledgeIndex.create(folder / dt, enc, overwrite=True, dtype=getattr(torch, dt)) for dt in dtypes}
    out = {"dtypes": {dt: {"commit_s": 0.0} for dt in dtypes}, "graph_s": 0.0, "embed_s": 0.0}
    for lo in range(0, n_docs, chunk):
        graphs, s = h.timed(lambda: [build_document_graph(d) for d in lp.documents(n_docs, 0, lo, lo + chunk)])
        out["graph_s"] += s
        vecs, s = h.timed(lambda gs: [encode_document(g, enc) for g in gs], graphs)
        out["embed_s"] += s
        for dt, index in indexes.items():
            out["dtypes"][dt]["commit_s"] += h.timed(index.add_documents, graphs, vecs)[1]
        del graphs, vecs
        print(f"built {min(n_docs, lo + chunk):,} / {n_docs:,}", flush=True)
    out["hwm"] = mem()["VmHWM"]
    if prefilter:
        src = indexes[dtypes[0]]
        out["prefilter_events"], out["prefilter_s"] = h.timed(carry, src)
        settings = src._pf_settings
        for dt, index in list(indexes.items())[1:]:
            plan = {s: (src.prefilter(s), "built (given the first dtype's prefilter)") for s in settings.stores}
            with index._writer():
                index._commit_prefilters(plan, settings=settings, replace=True)
    return out


def carry(index) -> dict:
    """``colgraph index build``'s prefilters, built now (its min_tokens, which defers a small
    store, is kept as the settings; the build is forced by enabling with min_tokens 1 first)."""
    from colgraph_engine.pipeline.recall import carry_default_prefilters as carry_prefilters
    events = carry_prefilters(index)
    if all(not v.startswith("built") for v in events.values()):
        events = index.enable_prefilter(min_tokens=1, progress=True)
    return events


def worker(conn, index_path: str, config: dict, threads: int) -> None:
    """One row: opens the index as the service does, then answers each question sent with its ms
    (retrieve minus query encoding), documents, stage ms and recall paths; None ends it."""
    import torch
    torch.set_num_threads(threads)
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.pipeline import Pipeline, PipelineConfig
    enc = Encoders.offline(text_dim=TEXT_DIM)
    t = time.perf_counter()
    index = KnowledgeIndex.open(index_path, enc, verify=False)  # as the service opens it
    pipe = Pipeline(index, enc, PipelineConfig().replace(**config))
    pipe.view()
    conn.send({"open_s": time.perf_counter() - t, "mem": mem()})
    while (req := conn.recv()) is not None:
        r, s = h.timed(pipe.retrieve, req)
        conn.send({"ms": 1e3 * (s - r.timings["encode"]), "docs": [d for d, _ in r.documents],
                   "stages": {k: 1e3 * v for k, v in r.timings.items()}, "paths": r.counts["recall"]["paths"]})
    conn.send({"mem": mem()})


def asker(conn, questions: list[str], warmup: int, out: dict):
    """A zero-argument call for ``_harness.paired``: sends the worker on `conn` the next question of
    ``questions[:warmup] + questions`` and keeps its answer in `out` once past the warm-up."""
    pending = iter(questions[:warmup] + questions)
    asked = [0]

    def ask():
        conn.send(next(pending))
        r = conn.recv()
        asked[0] += 1
        if asked[0] > warmup:
            for k in ("ms", "docs", "stages"):
                out[k].append(r[k])
            out["paths"] = r["paths"]
    return ask


def serve_rows(rows: dict[str, tuple[str, dict]], questions: list[str], warmup: int, threads: int) -> dict:
    """``{row: answers}``: each row ``(index folder, PipelineConfig changes)`` a worker process of its
    own, every question asked of every row in turn, the order rotating (``_harness.paired``)."""
    ctx = mp.get_context("spawn")
    procs, res = {}, {}
    for name, (path, cfg) in rows.items():
        a, b = ctx.Pipe()
        procs[name] = (ctx.Process(target=worker, args=(b, path, cfg, threads), daemon=True), a)
        procs[name][0].start()
    for name, (p, a) in procs.items():
        res[name] = {"open": a.recv(), "ms": [], "docs": [], "stages": [], "paths": None}
    h.paired({name: asker(a, questions, warmup, res[name]) for name, (p, a) in procs.items()}, len(questions),
             warmup=warmup)
    for name, (p, a) in procs.items():
        a.send(None)
        res[name]["after"] = a.recv()["mem"]
        p.join(30)
    return res


def summarise(res: dict, ref: list[list[str]]) -> dict:
    """Per row: recall against `ref` (per question the reference row's documents), p50 / p90 ms,
    median stage ms, open time and memory."""
    out = {}
    for name, r in res.items():
        rec = [len(set(got) & set(want)) / max(1, len(want)) for got, want in zip(r["docs"], ref)]
        stages = {k: statistics.median(s.get(k, 0.0) for s in r["stages"]) for k in r["stages"][0]}
        out[name] = {"p50_ms": statistics.median(r["ms"]), "p90_ms": h.percentile(r["ms"], 90),
                     "recall": statistics.mean(rec), "recall_min": min(rec), "stages_ms": stages,
                     "open_s": r["open"]["open_s"], "mem_open": r["open"]["mem"], "mem_after": r["after"],
                     "paths": r["paths"]}
    return out


def mb(x: float) -> str:
    return f"{x / 1e6:,.0f}"


def to_markdown(rep: dict) -> list[str]:
    """The report's body (the harness adds title and environment header)."""
    b, rows = rep["build"], rep["rows"]
    base = rows.get(rep["base_row"], {}).get("p50_ms")
    L = [f"Total run time {rep['total_s'] / 60:.1f} min; torch threads per worker {rep['threads']}.", "",
         f"Corpus: {rep['documents']:,} documents (lightrag_peer's corpus, no images), "
         f"{rep['segment_tokens']:,} segment tokens (d = 128), {rep['segments']:,} segments. "
         f"{rep['queries']} questions, each row a worker process, called alternately. Recall = share of "
         f"float32-exact's top-{KD} documents in the row's top-{KD}.", ""]
    if "note" in b:
        L += [f"Build: {b['note']}.", ""]
    else:
        L += [f"Build: graphs {b['graph_s']:.1f} s, encoding {b['embed_s']:.1f} s (once, shared), commits per index: " +
              ", ".join(f"{dt} {v['commit_s']:.1f} s" for dt, v in b["dtypes"].items()) +
              (f"; prefilter (one k-means, given to every index) {b['prefilter_s']:.0f} s: {b['prefilter_events']}"
               if "prefilter_s" in b else "; no prefilter")
              + f"; build process peak RSS {b['hwm'] / 2**30:.2f} GiB.", ""]
    disk = [{"dtype": dt, **d} for dt, d in rep["disk"].items()]
    L += ["## Bytes", "", *h.table([("dtype", "dtype"),
                                    ("segment bytes / token:", lambda d: f"{d['segment_bytes_per_token']:.1f}"),
                                    ("segment vector file MB:", lambda d: mb(d["segment_file"])),
                                    ("index folder MB:", lambda d: mb(d["folder"])),
                                    ("of which prefilter MB:", lambda d: mb(d["prefilter"]))], disk)]
    table = [{"row": n, **r} for n, r in rows.items()]
    L += ["", "## Rows", "", *h.table(
        [("row", "row"), ("recall@10:", lambda r: f"{r['recall']:.4f}"), ("min:", lambda r: f"{r['recall_min']:.1f}"),
         ("p50 ms:", lambda r: f"{r['p50_ms']:.1f}"), ("p90 ms:", lambda r: f"{r['p90_ms']:.1f}"),
         ("x float32 p50:", lambda r: f"{base / r['p50_ms']:.2f}"),
         ("RSS open MB:", lambda r: mb(r["mem_open"]["VmRSS"])),
         ("RSS after MB:", lambda r: mb(r["mem_after"]["VmRSS"])),
         ("anon MB:", lambda r: mb(r["mem_after"]["RssAnon"])), ("file MB:", lambda r: mb(r["mem_after"]["RssFile"])),
         ("open s:", lambda r: f"{r['open_s']:.2f}")]
        + [(f"{s} ms:", lambda r, s=s: f"{r['stages_ms'].get(s, 0):.2f}") for s in ("recall", "seeds", "evidence")],
        table)]
    L += ["", "Per-stage medians (ms):", "", *h.table(
        [("row", "row")] + [(f"{s}:", lambda r, s=s: f"{r['stages_ms'].get(s, 0):.2f}") for s in rep["stage_names"]],
        table)]
    L += ["", "Recall paths (last question): " + "; ".join(f"{k}: {v}" for k, v in table[0]["paths"].items()), ""]
    return L + h.section("Reading", rep.get("findings", []))
def findings(rep: dict) -> list[str]:
    rows, out = rep["rows"], []
    if "float32" in rows:
        for dt in ("float16", "bfloat16"):
            if dt in rows:
                a, b = rows["float32"], rows[dt]
                out.append(f"{dt} vs float32 (default config): recall {b['recall']:.4f} vs {a['recall']:.4f}, p50 "
                           f"{a['p50_ms'] / b['p50_ms']:.2f}x float32's, RSS after queries "
                           f"{b['mem_after']['VmRSS'] / a['mem_after']['VmRSS']:.2f}x, segment bytes per token "
                           f"{rep['disk'][dt]['segment_bytes_per_token']:.0f} vs "
                           f"{rep['disk']['float32']['segment_bytes_per_token']:.0f}.")
    for dt in ("float32", "float16", "bfloat16"):
        if f"{dt}-exact" in rows and dt in rows:
            out.append(f"{dt}: exact MaxSim p50 {rows[dt + '-exact']['p50_ms']:.1f} ms vs the default path "
                       f"{rows[dt]['p50_ms']:.1f} ms ({rows[dt + '-exact']['p50_ms'] / rows[dt]['p50_ms']:.1f}x).")
    if "codes" in rows:
        c = rows["codes"]
        out.append(f"codes (exact stage on the decoded 2-bit codes): recall {c['recall']:.4f}, "
                   f"p50 {c['p50_ms']:.1f} ms; "
                   f"a codes-only index would keep {rep['disk']['codes']['segment_bytes_per_token']:.1f} bytes per "
                   f"segment token (the prefilter's files) instead of the vectors; that storage mode is not built "
                   f"(the store's rows stay on disk here, untouched by this row: see its file RSS).")
    return out


def plot(rep: dict, path: pathlib.Path) -> str | None:
    """Recall, p50 and disk bytes per token as three bar panels; returns a note when skipped."""
    plt, note = h.matplotlib_or_note()
    if plt is None:
        return note
    rows, d = rep["rows"], rep["disk"]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    ax[0].bar(list(rows), [r["recall"] for r in rows.values()])
    ax[0].set(ylim=(min(0.9, min(r["recall"] for r in rows.values()) - 0.01), 1.001),
              title=f"recall of float32-exact top-{KD}")
    ax[1].bar(list(rows), [r["p50_ms"] for r in rows.values()])
    ax[1].set(title="p50 ms per query", yscale="log")
    ax[2].bar(list(d), [v["segment_bytes_per_token"] for v in d.values()])
    ax[2].set(title="disk bytes per segment token")
    for a in ax:
        a.tick_params(axis="x", rotation=45)
    fig.suptitle(f"{rep['documents']:,} documents, {rep['segment_tokens']:,} segment tokens, d = 128")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def indexes(a, dtypes: list[str], folder: pathlib.Path) -> dict:
    """The build record: reused (``--reuse``, same documents) or made now."""
    if a.reuse and all((folder / dt / "manifest.json").exists() for dt in dtypes):
        f = folder / "build.json"
        return json.loads(f.read_text()) if f.exists() else {
            "note": "reused indexes whose build was not recorded (an earlier run stopped in its prefilter build)"}
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    out = build(a.docs, dtypes, folder, not a.no_prefilter)
    (folder / "build.json").write_text(json.dumps(out, default=str))
    return out


def disk(dtypes: list[str], folder: pathlib.Path, tokens: int, prefilter: bool) -> dict:
    """Per dtype: the segment vector file's bytes (and per token), the folder's, its prefilter's;
    ``codes``: what a codes-only index would keep (the prefilter's files instead of the vectors)."""
    out = {}
    for dt in dtypes:
        mf = json.loads((folder / dt / "manifest.json").read_text())
        seg = os.path.getsize(folder / dt / "vectors" / mf["vectors"]["segment"]["file"])
        out[dt] = {"segment_file": seg, "segment_bytes_per_token": seg / max(1, tokens),
                   "folder": folder_bytes(folder / dt), "prefilter": folder_bytes(folder / dt / "prefilter")}
    if prefilter:
        src = out[dtypes[0]]
        out["codes"] = {"segment_file": 0, "segment_bytes_per_token": src["prefilter"] / tokens,
                        "folder": src["folder"] - src["segment_file"], "prefilter": src["prefilter"]}
    return out


def main(argv=None) -> int:
    p = h.parser(__doc__)
    p.add_argument("--docs", type=int, default=10000)
    p.add_argument("--dtypes", default="float32,float16,bfloat16")
    p.add_argument("--queries", type=int, default=48)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--no-prefilter", action="store_true")
    p.add_argument("--no-exact", action="store_true", help="leave out the exact rows (recall then vs the first dtype)")
    p.add_argument("--reuse", action="store_true", help="reuse the indexes a previous run built (same --docs)")
    p.add_argument("--force-prefilter", action="store_true",
                   help='rows use recall_ranker="prefilter" (the carried prefilter at any size; auto uses it from '
                        '2^18 tokens)')
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--stem", default=None)
    a = p.parse_args(argv)
    if a.quick:
        a.docs, a.queries = 600, 12
    dtypes = a.dtypes.split(",")
    e = h.env()
    t0 = time.perf_counter()
    import lightrag_peer as lp
    from colgraph_engine.pipeline import STAGES
    folder = CACHE / f"n{a.docs}"
    rep = {"documents": a.docs, "threads": a.threads, "stage_names": list(STAGES), "build": indexes(a, dtypes, folder)}
    m = json.loads((folder / dtypes[0] / "manifest.json").read_text())
    rep.update(segment_tokens=m["vectors"]["segment"]["rows"], segments=m["totals"]["segments"])
    rep["disk"] = disk(dtypes, folder, rep["segment_tokens"], not a.no_prefilter)
    qs = [q["q"] for q in lp.questions(a.queries, a.docs, 0)]
    base_cfg = {"recall_ranker": "prefilter"} if a.force_prefilter else {}
    rows = {dt: (str(folder / dt), dict(base_cfg)) for dt in dtypes}
    if not a.no_prefilter and "float16" in dtypes:
        rows["codes"] = (str(folder / "float16"), {**base_cfg, "prefilter_exact": "codes"})
    res = serve_rows(rows, qs, a.warmup, a.threads)
    if not a.no_exact:  # float32-exact: the reference
        res.update(serve_rows({f"{dt}-exact": (str(folder / dt), {"recall_ranker": "maxsim"}) for dt in dtypes}, qs,
                              a.warmup, a.threads))
    ref_row = dtypes[0] if a.no_exact else f"{dtypes[0]}-exact"
    rep.update(queries=len(qs), row_config=base_cfg, reference_row=ref_row, base_row=dtypes[0],
               rows=summarise(res, res[ref_row]["docs"]), total_s=time.perf_counter() - t0)
    rep["findings"] = findings(rep)
    stem = a.stem or h.stem("vector_dtype", a)
    title = f"Token vectors by dtype: bytes, recall, latency, RSS ({e['timestamp']})"
    out = h.write(stem, title, to_markdown(rep), rep, a.out, e=e)
    if out is not None:
        plot(rep, out / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
