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

import argparse
import datetime
import json
import multiprocessing as mp
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
CACHE = HERE / ".cache" / "vector_dtype"
TEXT_DIM = 128
KD = 10


def mem() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[k] = int(v.split()[0]) * 1024
    return out


def folder_bytes(path: pathlib.Path, sub: str | None = None) -> int:
    total = 0
    for dirpath, _, names in os.walk(path if sub is None else path / sub):
        for n in names:
            total += os.lstat(os.path.join(dirpath, n)).st_size
    return total


def _torch_dtype(name: str):
    import torch
    return getattr(torch, name)


# ------------------------------------------------------------------------------------------
# Build
# ------------------------------------------------------------------------------------------

def build(n_docs: int, dtypes: list[str], folder: pathlib.Path, prefilter: bool, chunk: int = 1000) -> dict:
    """One directory index per dtype, the same documents and vectors; the fp32 one's prefilter
    given to the others. Returns build times and counts."""
    import lightrag_peer as lp
    from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document

    enc = Encoders.offline(text_dim=TEXT_DIM)
    out = {"dtypes": {}}
    indexes = {}
    for dt in dtypes:
        indexes[dt] = KnowledgeIndex.create(folder / dt, enc, overwrite=True, dtype=_torch_dtype(dt))
        out["dtypes"][dt] = {"commit_s": 0.0}
    graph_s = embed_s = 0.0
    for lo in range(0, n_docs, chunk):
        t = time.perf_counter()
        graphs = [build_document_graph(d) for d in lp.documents(n_docs, 0, lo, lo + chunk)]
        graph_s += time.perf_counter() - t
        t = time.perf_counter()
        vecs = [encode_document(g, enc) for g in graphs]
        embed_s += time.perf_counter() - t
        for dt, index in indexes.items():
            t = time.perf_counter()
            index.add_documents(graphs, vecs)
            out["dtypes"][dt]["commit_s"] += time.perf_counter() - t
        del graphs, vecs
        print(f"built {min(n_docs, lo + chunk):,} / {n_docs:,}", flush=True)
    out.update(graph_s=graph_s, embed_s=embed_s, hwm=mem()["VmHWM"])
    if prefilter:
        src = indexes[dtypes[0]]
        t = time.perf_counter()
        out["prefilter_events"] = carry(src)
        out["prefilter_s"] = time.perf_counter() - t
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


# ------------------------------------------------------------------------------------------
# Workers
# ------------------------------------------------------------------------------------------

def worker(conn, index_path: str, config: dict, threads: int) -> None:
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
    while True:
        req = conn.recv()
        if req is None:
            conn.send({"mem": mem()})
            return
        t = time.perf_counter()
        r = pipe.retrieve(req)
        ms = 1e3 * (time.perf_counter() - t - r.timings["encode"])
        conn.send({"ms": ms, "docs": [d for d, _ in r.documents],
                   "stages": {k: 1e3 * v for k, v in r.timings.items()},
                   "paths": r.counts["recall"]["paths"]})


def serve_rows(rows: dict[str, tuple[str, dict]], questions: list[str], warmup: int, threads: int) -> dict:
    ctx = mp.get_context("spawn")
    procs = {}
    for name, (path, cfg) in rows.items():
        a, b = ctx.Pipe()
        p = ctx.Process(target=worker, args=(b, path, cfg, threads), daemon=True)
        p.start()
        procs[name] = (p, a)
    res = {name: {"open": a.recv(), "ms": [], "docs": [], "stages": [], "paths": None} for name, (p, a) in procs.items()}
    names = list(procs)
    for i, q in enumerate(questions[:warmup] + questions):
        for name in names[i % len(names):] + names[:i % len(names)]:  # the order rotates
            a = procs[name][1]
            a.send(q)
            r = a.recv()
            if i >= warmup:
                res[name]["ms"].append(r["ms"])
                res[name]["docs"].append(r["docs"])
                res[name]["stages"].append(r["stages"])
                res[name]["paths"] = r["paths"]
    for name, (p, a) in procs.items():
        a.send(None)
        res[name]["after"] = a.recv()["mem"]
        p.join(30)
    return res


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))] if xs else float("nan")


def summarise(res: dict, ref: list[list[str]]) -> dict:
    out = {}
    for name, r in res.items():
        rec = [len(set(got) & set(want)) / max(1, len(want)) for got, want in zip(r["docs"], ref)]
        stages = {k: statistics.median(s.get(k, 0.0) for s in r["stages"]) for k in r["stages"][0]}
        out[name] = {"p50_ms": statistics.median(r["ms"]), "p90_ms": _pct(r["ms"], 0.9), "recall": statistics.mean(rec),
                     "recall_min": min(rec), "stages_ms": stages, "open_s": r["open"]["open_s"],
                     "mem_open": r["open"]["mem"], "mem_after": r["after"], "paths": r["paths"]}
    return out


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

def to_markdown(rep: dict) -> str:
    m = rep["machine"]
    L = [f"# Token vectors by dtype: bytes, recall, latency, RSS ({rep['date']})", "",
         f"Command: `{rep['command']}` ({rep['total_s'] / 60:.1f} min). Machine: {m['cpus']} shared CPUs, "
         f"{m['memory_gib']:.0f} GiB, python {m['python']}, torch {m['torch']}, torch threads {rep['threads']}, "
         f"COLGRAPH_NUM_THREADS {m['colgraph_threads']}; commit {m['commit']} (work tree modified: "
         f"{m['dirty']}); load average {m['load_start']} at start, {m['load_end']} at end.", "",
         f"Corpus: {rep['documents']:,} documents (lightrag_peer's corpus, no images), "
         f"{rep['segment_tokens']:,} segment tokens (d = 128), {rep['segments']:,} segments. "
         f"{rep['queries']} questions, each row a worker process, called alternately. Recall = share of "
         f"float32-exact's top-{KD} documents in the row's top-{KD}.", ""]
    b = rep["build"]
    if "note" in b:
        L += [f"Build: {b['note']}.", ""]
    else:
        L += [f"Build: graphs {b['graph_s']:.1f} s, encoding {b['embed_s']:.1f} s (once, shared), commits per index: " +
              ", ".join(f"{dt} {v['commit_s']:.1f} s" for dt, v in b["dtypes"].items()) +
              (f"; prefilter (one k-means, given to every index) {b['prefilter_s']:.0f} s: {b['prefilter_events']}"
               if "prefilter_s" in b else "; no prefilter") + f"; build process peak RSS {b['hwm'] / 2**30:.2f} GiB.", ""]
    L += ["## Bytes", "", "| dtype | segment bytes / token | segment vector file MB | index folder MB | of which prefilter MB |",
          "|---|---:|---:|---:|---:|"]
    for dt, d in rep["disk"].items():
        L.append(f"| {dt} | {d['segment_bytes_per_token']:.1f} | {d['segment_file'] / 1e6:,.0f} | "
                 f"{d['folder'] / 1e6:,.0f} | {d['prefilter'] / 1e6:,.0f} |")
    L += ["", "## Rows", "",
          "| row | recall@10 | min | p50 ms | p90 ms | x float32 p50 | RSS open MB | RSS after MB | anon MB | file MB | "
          "open s | recall ms | seeds ms | evidence ms |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    base = rep["rows"].get(rep["base_row"], {}).get("p50_ms")
    for name, r in rep["rows"].items():
        st = r["stages_ms"]
        L.append(f"| {name} | {r['recall']:.4f} | {r['recall_min']:.1f} | {r['p50_ms']:.1f} | {r['p90_ms']:.1f} | "
                 f"{base / r['p50_ms']:.2f} | {r['mem_open']['VmRSS'] / 1e6:,.0f} | {r['mem_after']['VmRSS'] / 1e6:,.0f} | "
                 f"{r['mem_after']['RssAnon'] / 1e6:,.0f} | {r['mem_after']['RssFile'] / 1e6:,.0f} | {r['open_s']:.2f} | "
                 f"{st.get('recall', 0):.2f} | {st.get('seeds', 0):.2f} | {st.get('evidence', 0):.2f} |")
    L += ["", "Per-stage medians (ms):", "", "| row | " + " | ".join(rep["stage_names"]) + " |",
          "|---|" + "---:|" * len(rep["stage_names"])]
    for name, r in rep["rows"].items():
        L.append(f"| {name} | " + " | ".join(f"{r['stages_ms'].get(s, 0):.2f}" for s in rep["stage_names"]) + " |")
    L += ["", "Recall paths (last question): " + "; ".join(f"{k}: {v}" for k, v in
                                                         next(iter(rep["rows"].values()))["paths"].items()), ""]
    L += ["## Reading", ""] + [f"* {x}" for x in rep.get("findings", [])]
    return "\n".join(L) + "\n"


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
        out.append(f"codes (exact stage on the decoded 2-bit codes): recall {c['recall']:.4f}, p50 {c['p50_ms']:.1f} ms; "
                   f"a codes-only index would keep {rep['disk']['codes']['segment_bytes_per_token']:.1f} bytes per "
                   f"segment token (the prefilter's files) instead of the vectors; that storage mode is not built "
                   f"(the store's rows stay on disk here, untouched by this row: see its file RSS).")
    return out


def plot(rep: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = rep["rows"]
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.8))
    names = list(rows)
    ax[0].bar(names, [rows[n]["recall"] for n in names])
    ax[0].set_ylim(min(0.9, min(rows[n]["recall"] for n in names) - 0.01), 1.001)
    ax[0].set_title(f"recall of float32-exact top-{KD}")
    ax[1].bar(names, [rows[n]["p50_ms"] for n in names])
    ax[1].set_title("p50 ms per query")
    ax[1].set_yscale("log")
    d = rep["disk"]
    ax[2].bar(list(d), [d[k]["segment_bytes_per_token"] for k in d])
    ax[2].set_title("disk bytes per segment token")
    for a in ax:
        a.tick_params(axis="x", rotation=45)
    fig.suptitle(f"{rep['documents']:,} documents, {rep['segment_tokens']:,} segment tokens, d = 128")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def machine() -> dict:
    import torch

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=HERE.parent, capture_output=True, text=True, timeout=20).stdout.strip()
        except OSError:
            return ""
    with open("/proc/meminfo") as f:
        total = int(f.readline().split()[1]) * 1024
    return {"cpus": len(os.sched_getaffinity(0)), "memory_gib": total / 2**30, "python": platform.python_version(),
            "torch": torch.__version__, "colgraph_threads": os.environ.get("COLGRAPH_NUM_THREADS", "(torch's)"),
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": ", ".join(x.split()[-1] for x in git("status", "--short", "colgraph_engine").splitlines()) or "no",
            "load_start": [round(x, 2) for x in os.getloadavg()]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    p.add_argument("--quick", action="store_true")
    p.add_argument("--stem", default=None)
    p.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    a = p.parse_args(argv)
    if a.quick:
        a.docs, a.queries = 600, 12
    dtypes = a.dtypes.split(",")
    stem = a.stem or ("vector_dtype_quick" if a.quick else "vector_dtype")
    t0 = time.perf_counter()
    import lightrag_peer as lp
    from colgraph_engine.pipeline import STAGES
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
           "command": "python benchmarks/vector_dtype.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "documents": a.docs, "threads": a.threads, "stage_names": list(STAGES)}
    folder = CACHE / f"n{a.docs}"
    if a.reuse and all((folder / dt / "manifest.json").exists() for dt in dtypes):
        rep["build"] = json.loads((folder / "build.json").read_text()) if (folder / "build.json").exists() else {
            "note": "reused indexes whose build was not recorded (an earlier run stopped in its prefilter build)"}
    else:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        rep["build"] = build(a.docs, dtypes, folder, not a.no_prefilter)
        (folder / "build.json").write_text(json.dumps(rep["build"], default=str))
    m = json.loads((folder / dtypes[0] / "manifest.json").read_text())
    rep["segment_tokens"] = m["vectors"]["segment"]["rows"]
    rep["segments"] = m["totals"]["segments"]
    rep["disk"] = {}
    for dt in dtypes:
        mf = json.loads((folder / dt / "manifest.json").read_text())
        seg = os.path.getsize(folder / dt / "vectors" / mf["vectors"]["segment"]["file"])
        rep["disk"][dt] = {"segment_file": seg, "segment_bytes_per_token": seg / max(1, rep["segment_tokens"]),
                           "folder": folder_bytes(folder / dt), "prefilter": folder_bytes(folder / dt, "prefilter")
                           if (folder / dt / "prefilter").exists() else 0}
    if not a.no_prefilter:
        src = rep["disk"][dtypes[0]]
        rep["disk"]["codes"] = {"segment_file": 0, "segment_bytes_per_token": src["prefilter"] / rep["segment_tokens"],
                                "folder": src["folder"] - src["segment_file"], "prefilter": src["prefilter"]}
    qs = [q["q"] for q in lp.questions(a.queries, a.docs, 0)]
    rep["queries"] = len(qs)
    base_cfg = {"recall_ranker": "prefilter"} if a.force_prefilter else {}
    rows = {dt: (str(folder / dt), dict(base_cfg)) for dt in dtypes}
    if not a.no_prefilter and "float16" in dtypes:
        rows["codes"] = (str(folder / "float16"), {**base_cfg, "prefilter_exact": "codes"})
    rep["row_config"] = base_cfg
    res = serve_rows(rows, qs, a.warmup, a.threads)
    exact = {}
    if not a.no_exact:
        exact = serve_rows({f"{dt}-exact": (str(folder / dt), {"recall_ranker": "maxsim"}) for dt in dtypes}, qs,
                           a.warmup, a.threads)
    res.update(exact)
    ref_row = f"{dtypes[0]}-exact" if exact else dtypes[0]
    rep["reference_row"] = ref_row
    rep["base_row"] = dtypes[0]
    rep["rows"] = summarise(res, res[ref_row]["docs"])
    rep["machine"]["load_end"] = [round(x, 2) for x in os.getloadavg()]
    rep["total_s"] = time.perf_counter() - t0
    rep["findings"] = findings(rep)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{stem}.json").write_text(json.dumps(rep, indent=1, default=str))
    (a.out / f"{stem}.md").write_text(to_markdown(rep))
    try:
        plot(rep, a.out / f"{stem}.png")
    except ImportError as exc:
        print(f"no plot: {exc}")
    print(to_markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
