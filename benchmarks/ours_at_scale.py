"""Our pipeline at 100k documents on this machine: ingest growth, default vs exact recall, memory.

``.venv/bin/python benchmarks/ours_at_scale.py [--docs 100000] [--quick]``

The corpus, questions and vectors are ``lightrag_peer.py``'s (its ``_ours-ingest`` role builds
the index in a child process, ``--chunk`` documents per commit, float16 token vectors, the
prefilters carried and maintained by the commits); the report takes its per-commit lines (commit
seconds, anonymous RSS, peak RSS) for the ingest table and plot. Then one process opens the
index as the service does (``verify=False``) and times, alternately per question
(``_harness.paired``), ``PipelineConfig()`` (recall_ranker ``auto``: the carried prefilter with
the adaptive budget) and ``recall_ranker="maxsim"`` (exhaustive exact MaxSim), single queries,
then one batch of 64 each; recall of the exact top-Kd documents is the share of the exact row's
recalled documents the default row recalls, per question.

LightRAG is not run here: at 100k documents its ``insert_custom_kg`` rewrites its JSON stores on
every call (see ``lightrag_peer.py``), more time than one session's run allows on 2 cores; the
side by side at 1k and 10k is ``results/lightrag_peer.md``.

Writes ``results/ours_at_scale_<N>k.md``, ``.json`` and ``.png`` (``--quick``: 2,000 documents, 10
questions, under ``benchmarks/.cache/ours_at_scale``). The index stays under
``benchmarks/.cache/ours_at_scale/`` with ``--keep``.
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
import _lightrag_side as side  # noqa: E402

CACHE = HERE / ".cache" / "ours_at_scale"


def read_role_lines(lines, bar=None) -> tuple[dict | None, list[dict]]:
    """``(result or None, per-commit lines)`` of the ``_ours-ingest`` role's stdout lines."""
    commits, result = [], None
    for line in lines:
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "progress" in msg:
            commits.append(msg)
            if bar is not None:
                bar.n = msg["progress"]
                bar.refresh()
        elif "result" in msg:
            result = msg["result"]
    return result, commits


def ingest(args, folder: pathlib.Path) -> tuple[dict, list[dict]]:
    """Runs lightrag_peer's ``_ours-ingest`` role; ``(its result, its per-commit lines)``."""
    from tqdm import tqdm
    cmd = [sys.executable, str(HERE / "lightrag_peer.py"), "_ours-ingest", "--docs", str(args.docs), "--seed",
           str(args.seed), "--out", str(folder), "--chunk", str(args.chunk), "--dtype", "float16"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc, \
            tqdm(total=args.docs, desc="ingest", unit="doc", disable=args.no_progress) as bar:
        result, commits = read_role_lines(proc.stdout, bar)
    if proc.returncode or result is None:
        raise SystemExit(f"ingest failed (exit status {proc.returncode})")
    return result, commits


def serve(args, folder: pathlib.Path) -> dict:
    """Opens the index and times the default and the exact rows alternately."""
    import lightrag_peer as lp
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.pipeline import Pipeline, PipelineConfig
    rss_imported = side.mem()["rss_bytes"]
    enc = Encoders.offline(text_dim=lp.TEXT_DIM)
    index, open_s = h.timed(KnowledgeIndex.open, folder, enc, verify=False)
    pipes = {"ours": Pipeline(index, enc, PipelineConfig()),
             "ours-exact": Pipeline(index, enc, PipelineConfig(recall_ranker="maxsim"))}
    for p in pipes.values():
        p.view()
    after_open = side.mem()
    qs = lp.questions(args.queries + 1, args.docs, args.seed)  # the first one warms both rows up
    it = {name: iter(qs) for name in pipes}
    got: dict[str, list] = {name: [] for name in pipes}
    stage_ms: dict[str, dict[str, list[float]]] = {name: {} for name in pipes}

    def ask(name):
        def call():
            q = next(it[name])
            r = pipes[name].retrieve(q["q"])
            return q, r
        return call

    def keep(name, qr):
        q, r = qr
        got[name].append((q, r))
        for k, v in r.timings.items():
            stage_ms[name].setdefault(k, []).append(1e3 * v)

    secs = h.paired({n: ask(n) for n in pipes}, len(qs) - 1, warmup=1, after=keep)
    # per-call seconds less the query encoding (as lightrag_peer and pipeline_report report)
    lat = {n: [1e3 * s - r.timings["encode"] * 1e3 for s, (_, r) in zip(secs[n], got[n])] for n in pipes}
    recall = []
    for (qa, ra), (qb, rb) in zip(got["ours"], got["ours-exact"]):
        assert qa is qb
        want = {d for d, _ in rb.documents}
        recall.append(len(want & {d for d, _ in ra.documents}) / max(1, len(want)))
    batch = [q["q"] for q in qs[:args.batch_size]]
    batch_ms = {}
    for n, p in pipes.items():
        rs, s = h.timed(p.retrieve_batch, batch)
        batch_ms[n] = 1e3 * (s - rs[0].timings["encode"])
    paths = sorted({f"{store}: {why}" for _, r in got["ours"] for store, why in _paths(r.counts["recall"]["paths"])})
    return {"open_s": open_s, "rss_after_import_bytes": rss_imported, "after_open": after_open,
            "after_queries": side.mem(), "queries": len(lat["ours"]), "recall_paths": paths,
            "rows": {n: {"p50_ms": statistics.median(v), "p99_ms": h.percentile(v, 99), "all_ms": v,
                         "stage_p50_ms": {k: statistics.median(x) for k, x in stage_ms[n].items()},
                         "batch_ms": batch_ms[n], "batch_qps": len(batch) / (batch_ms[n] / 1e3)}
                     for n, v in lat.items()},
            "recall_of_exact_topkd": {"mean": statistics.fmean(recall), "min": min(recall),
                                      "all_equal_share": sum(x == 1 for x in recall) / len(recall)}}


def _paths(paths) -> list[tuple[str, str]]:
    """``(store, path and reason)`` pairs of a result's ``counts["recall"]["paths"]`` (store -> text)."""
    return [(str(k), str(v)) for k, v in dict(paths).items()]


def render(rep: dict) -> list[str]:
    ing, s = rep["ingest"], rep["serve"]
    gib = 2 ** 30
    rows = s["rows"]
    body = [f"{rep['docs']:,} documents ({ing['counts']['segment_vectors']:,} segments, "
            f"{ing['counts']['entities']:,} entities, {ing['counts']['relations']:,} relations), "
            f"commits of {rep['chunk']:,}; {rep['minutes']:.1f} min in all.", "",
            "## Ingest", "",
            f"ingest {ing['ingest_s']:.0f} s (graphs {ing['graph_s']:.0f} s, commits {ing['commit_s']:.0f} s; encoders "
            f"{ing['embed_s']:.0f} s apart); peak RSS {ing['hwm_bytes'] / gib:.2f} GiB, anonymous RSS at the end "
            f"{ing['rss_anon_bytes'] / gib:.2f} GiB; disk {rep['disk_bytes'] / gib:.2f} GiB "
            f"({rep['disk_bytes'] / max(1, rep['segment_tokens']):.0f} B per segment token, all files).", "",
            "Commits slower than twice the median (prefilter builds and rebuilds):", "",
            "| documents after | commit s | anonymous RSS GiB | peak RSS GiB |", "|---:|---:|---:|---:|"]
    med = statistics.median(x["commit_s"] for x in rep["commits"])
    for x in rep["commits"]:
        if x["commit_s"] > 2 * med:
            body.append(f"| {x['progress']:,} | {x['commit_s']:.1f} | {x['rss_anon_bytes'] / gib:.2f} | "
                        f"{x['hwm_bytes'] / gib:.2f} |")
    body += ["", f"Median commit {med:.1f} s.", "", "## Queries (alternated per question)", "",
             f"| row | p50 ms | p99 ms | batch of {rep['batch_size']} ms | batched QPS |", "|---|---:|---:|---:|---:|"]
    for n, r in rows.items():
        body.append(f"| {n} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['batch_ms']:.0f} | {r['batch_qps']:.1f} |")
    st = ["recall", "seeds", "expand", "visual", "evidence", "context"]
    body += ["", "Per-stage p50 ms (single queries):", "", "| row | " + " | ".join(st) + " |",
             "|---|" + "---:|" * len(st)]
    for n, r in rows.items():
        body.append(f"| {n} | " + " | ".join(f"{r['stage_p50_ms'].get(k, float('nan')):.2f}" for k in st) + " |")
    rc = s["recall_of_exact_topkd"]
    ratio = rows["ours-exact"]["p50_ms"] / rows["ours"]["p50_ms"]
    body += ["", "## Reading", "",
             f"* Recall of the exact top-Kd documents by the default path: {rc['mean']:.3f} on average over "
             f"{s['queries']} questions, {rc['min']:.2f} at worst, the same set for {rc['all_equal_share']:.0%}.",
             f"* One query p50: default {rows['ours']['p50_ms']:.1f} ms, exact {rows['ours-exact']['p50_ms']:.1f} ms "
             f"({ratio:.1f}x, same run).",
             f"* Open {s['open_s']:.2f} s; RSS after open {s['after_open']['rss_bytes'] / gib:.2f} GiB, after the "
             f"queries {s['after_queries']['rss_bytes'] / gib:.2f} GiB (anonymous "
             f"{s['after_queries']['rss_anon_bytes'] / gib:.2f}, file-backed "
             f"{s['after_queries']['rss_file_bytes'] / gib:.2f}: memory-mapped vectors the kernel can drop).",
             "* Recall paths: " + "; ".join(s["recall_paths"]),
             "* LightRAG not run at this size (module docstring); `results/lightrag_peer.md` has 1k and 10k."]
    return body


def plot(rep: dict, path) -> str | None:
    xs = [x["progress"] for x in rep["commits"]]
    gib = 2 ** 30
    return h.line_panels(path, xs, {
        "commit time": {"ylabel": "s per commit", "series": {"commit": [x["commit_s"] for x in rep["commits"]]}},
        "memory": {"ylabel": "GiB", "series": {"anonymous RSS": [x["rss_anon_bytes"] / gib for x in rep["commits"]],
                                                "peak RSS": [x["hwm_bytes"] / gib for x in rep["commits"]]}}},
        xlabel="documents ingested", log_x=False)


def main(argv=None) -> None:
    p = h.parser(__doc__)
    p.add_argument("--docs", type=int, default=100_000)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--queries", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--index", type=pathlib.Path, default=None,
                   help="an index `lightrag_peer.py _ours-ingest` built with these --docs/--seed/--chunk (skips "
                        "the ingest); needs --ingest-log")
    p.add_argument("--ingest-log", type=pathlib.Path, default=None, help="that role's stdout, saved")
    p.add_argument("--keep", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.docs, args.queries, args.batch_size = 2000, 10, 8
        args.out = CACHE / "results"
    t0 = time.perf_counter()
    import torch
    torch.set_num_threads(args.torch_threads)  # as lightrag_peer's worker: torch 1, native kernels all cores
    os.environ.setdefault("COLGRAPH_NUM_THREADS", str(h.usable_cores()))
    e = h.env()
    folder = args.index or CACHE / f"index_{args.docs}"
    if args.index is None:
        shutil.rmtree(folder, ignore_errors=True)
        result, commits = ingest(args, folder)
    else:
        if args.ingest_log is None:
            p.error("--index needs --ingest-log (the _ours-ingest role's stdout)")
        result, commits = read_role_lines(args.ingest_log.read_text().splitlines())
        if result is None or result["documents"] != args.docs:
            p.error(f"--ingest-log: expected the finished ingest of {args.docs} documents")
    disk = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    served = serve(args, folder)
    rep = {"docs": args.docs, "chunk": args.chunk, "batch_size": args.batch_size, "ingest": result, "commits": commits, "disk_bytes": disk,
           "segment_tokens": None, "serve": served, "minutes": (time.perf_counter() - t0) / 60}
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    import lightrag_peer as lp
    rep["segment_tokens"] = KnowledgeIndex.open(folder, Encoders.offline(text_dim=lp.TEXT_DIM),
                                                verify=False).prefilter_info()["stores"]["segment"]["tokens"]
    name = h.stem(f"ours_at_scale_{args.docs // 1000}k" if args.docs % 1000 == 0 else f"ours_at_scale_{args.docs}", args)
    out = h.write(name, f"Our pipeline at {args.docs:,} documents (default vs exact recall, one run)", render(rep),
                  rep, args.out, e=e)
    if out is not None:
        note = plot(rep, pathlib.Path(out) / f"{name}.png")
        if note:
            print(note)
    if not args.keep and args.index is None:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
