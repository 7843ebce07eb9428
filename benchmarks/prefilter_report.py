"""Prefilter report (CPU): recall@10 against exact and QPS, side by side with exact brute force
(our store), fast-plaid's CPU path and colsearch's CPU lanes, on clustered synthetic corpora.

Usage (from the repository root)::

    .venv/bin/python benchmarks/prefilter_report.py [--quick] [--fast-plaid PATH] [--colsearch PATH]
        [--colsearch-lanes fp16,rroq158] [--only long|short]

Corpora (scaled to a 2-core machine from the GPU corpora of ../shared/bench/peers_gpu.py,
10,000 x 1,024 and 100,000 x 128 tokens, d = 128): ``long`` 1,000 documents x 256 tokens and
``short`` 8,000 documents x 32 tokens (256,000 tokens each), topics as there (16 and 6 of
2,048 per document), 64 queries of 32 tokens drawn from a target document's topics.
``--quick``: 150 x 64 and 1,000 x 16, 16 queries (a smoke run: seconds). ``--tenth``: the GPU
corpora's document shapes at a tenth of their document counts, ``long1024`` 1,000 x 1,024 and
``short128`` 10,000 x 128 tokens (the full corpora, 10-13M tokens, need 32,768 centroids: about
25 minutes of our token assignment on 2 cores and over an hour of fast-plaid's k-means, so they
are measured on a GPU, ``gpu_prefilter.py``).

Rows per corpus: exact brute force (``PackedStore.search``, native C++ backend, float32), our
prefilter at PLAID's defaults for k = 10, at the k <= 100 defaults and a wide setting (8 cells
per query token, as fast-plaid's default 8 probes), each with the exact stage
on the decoded codes (default) and on the store's original vectors (``store=``), and
fast-plaid (``FastPlaid(device="cpu")``) at its default probes and a wider setting, and
colsearch 0.1.7 (``colsearch.Index(engine="shard", device="cpu")`` through
``benchmarks/_colsearch.py``, whose docstring states its settings) in each lane of
``--colsearch-lanes``: ``fp16`` (fp16 rows, its README and BEIR-benchmark setting) and
``rroq158`` (its default 1.58-bit codec). Both
indexes use the same nbits (``--nbits``, default 2) and k-means over at most 65,536 sampled
tokens for ours (fast-plaid samples by its own rule). QPS: all queries in one call (after one
warmup call), median of ``--repeats`` (fast-plaid: one timed call, it is slow here); latency: one query per call, mean over 16 queries.
colsearch is timed as the others (``search_batch`` over all queries, ``--repeats``); its build
(router training, codec training) is reported in ``build s``.
recall@10: mean overlap of the top-10 ids with exact brute force's top-10.

Writes results/prefilter.{md,json,png} (``prefilter_quick.*`` with --quick; ``_nbits4`` appended
for ``--nbits 4``, ``_<corpus>`` for ``--only <corpus>``).
"""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
from colgraph_engine.prefilter import PrefilterIndex  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402
from colgraph_engine.synthetic import clustered_corpus, queries_for  # noqa: E402

CORPORA = {"long": dict(n_docs=1000, tokens=256, topics_per_doc=16),
           "short": dict(n_docs=8000, tokens=32, topics_per_doc=6)}
# the GPU corpora's document shapes (1,024 and 128 tokens per document) at a tenth of their document
# counts: 1.0M and 1.3M tokens, about the most a 2-core build of fast-plaid finishes in minutes
TENTH = {"long1024": dict(n_docs=1000, tokens=1024, topics_per_doc=16),
         "short128": dict(n_docs=10000, tokens=128, topics_per_doc=6)}
QUICK = {"long": dict(n_docs=150, tokens=64, topics_per_doc=16),
         "short": dict(n_docs=1000, tokens=16, topics_per_doc=6)}


def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--tenth", action="store_true",
                   help="the GPU corpora's document shapes at a tenth of their document counts (TENTH)")
    p.add_argument("--fp-probes", default="8,32",
                   help="fast-plaid n_ivf_probe values, comma-separated (each one row)")
    p.add_argument("--latency-queries", type=int, default=16, help="queries timed one per call for 1-query ms")
    p.add_argument("--nbits", type=int, default=2)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--fast-plaid", default=str(ROOT / ".peers" / "fastplaid"),
                   help="a folder holding fast_plaid and its dependencies (pip install --target)")
    p.add_argument("--colsearch", default=str(ROOT / ".peers" / "colsearch"),
                   help="a folder holding colsearch and its dependencies (pip install --no-deps --target)")
    p.add_argument("--colsearch-lanes", default="fp16,rroq158",
                   help="comma-separated lanes of benchmarks/_colsearch.py LANES; empty: skip colsearch")
    p.add_argument("--only", default="", help="run only the corpus of this name")
    p.add_argument("--note", action="append", default=[], help="a line added to the report's notes (repeatable)")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md and .png from the .json of the same options (adding --note lines)")
    return p.parse_args(argv)


LATENCY_QUERIES = 16  # set from --latency-queries


def timed(fn, repeats):
    """``(median seconds of `repeats` calls after a warmup, the result)``."""
    res = fn()
    return statistics.median(h.time_calls(fn, repeats, warmup=0)), res


def recall_at_10(got_ids: list[list[int]], exact_ids: torch.Tensor) -> float:
    return sum(len(set(g[:10]) & set(e.tolist())) for g, e in zip(got_ids, exact_ids)) / exact_ids.numel()


def latency_ms(fn_one, queries, n=16):
    n = min(n, LATENCY_QUERIES)
    fn_one(queries[0])
    t = time.perf_counter()
    for q in queries[:n]:
        fn_one(q)
    return (time.perf_counter() - t) * 1e3 / min(n, len(queries))


def load_fast_plaid(path: str):
    if path and os.path.isdir(path) and path not in sys.path:
        sys.path.insert(0, path)
    try:
        from fast_plaid import search
        import fast_plaid
        version = getattr(fast_plaid, "__version__", None)
        if version is None:
            from importlib.metadata import version as v
            version = v("fast-plaid")
        return search, version, None
    except Exception as exc:  # noqa: BLE001 - report why the peer is absent
        return None, None, f"{type(exc).__name__}: {exc}"


def run_colsearch(name, base, docs, queries, targets, ex_i, args, cs_mod, rows, notes):
    """Rows for colsearch's CPU lanes (``benchmarks/_colsearch.py``) on one corpus."""
    import _colsearch
    values = torch.cat(docs)
    offsets = torch.tensor([0] + [d.shape[0] for d in docs]).cumsum(0)
    qt = torch.stack(queries)
    nq = len(queries)
    for lane in [x for x in args.colsearch_lanes.split(",") if x]:
        tmp = tempfile.mkdtemp(prefix="colsearch_")
        handle = None
        try:
            print(f"colsearch {lane}: building on {name} ...", flush=True)
            handle = _colsearch.build(values, offsets, "cpu", os.path.join(tmp, "index"), lane=lane, module=cs_mod)
            sec, got = timed(lambda: _colsearch.search(handle, qt, 10), args.repeats)
            rows.append(dict(base, impl=f"colsearch (CPU): {lane}, " + ", ".join(
                                 f"{a} {v}" for a, v in handle.settings.items() if a not in ("compression", "device")),
                             qps=nq / sec, recall10=recall_at_10(got.tolist(), ex_i),
                             hit1=float((got[:, 0] == targets).float().mean()),
                             latency_ms=latency_ms(lambda q: _colsearch.search(handle, q[None], 10), queries),
                             bytes_per_token=handle.bytes_per_token, build_s=handle.build_s, lane=lane,
                             settings=handle.settings))
            print(json.dumps(rows[-1], default=str), flush=True)
        except Exception as exc:  # noqa: BLE001 - keep the rest of the report
            notes.append(f"colsearch {lane} failed on {name}: {type(exc).__name__}: {exc}"[:400])
            print(notes[-1], flush=True)
        finally:
            if handle is not None:
                _colsearch.close(handle)
            shutil.rmtree(tmp, ignore_errors=True)


def run_corpus(name, spec, args, fp_search, rows, notes, cs_mod=None):
    d, nq = 128, (16 if args.quick else args.queries)
    cents, topics, docs = clustered_corpus(spec["n_docs"], spec["tokens"], d, n_topics=2048,
                                           topics_per_doc=spec["topics_per_doc"], seed=11)
    targets, queries = queries_for(cents, topics, nq, 32, seed=12)
    n_tokens = spec["n_docs"] * spec["tokens"]
    base = dict(corpus=name, n_docs=spec["n_docs"], doc_tokens=spec["tokens"], tokens=n_tokens, queries=nq)
    store = PackedStore(d)
    store.add(docs)
    sec, (ex_s, ex_i) = timed(lambda: store.search(queries, k=10), args.repeats)
    rows.append(dict(base, impl="exact brute force (store, native)", qps=nq / sec, recall10=1.0,
                     hit1=float((ex_i[:, 0] == targets).float().mean()),
                     latency_ms=latency_ms(lambda q: store.search([q], k=10), queries),
                     bytes_per_token=d * 4))
    print(json.dumps(rows[-1]), flush=True)

    t = time.perf_counter()
    idx = PrefilterIndex.build(docs, nbits=args.nbits, max_points=1 << 16, progress=True)
    build_s = time.perf_counter() - t
    bpt = idx.bytes_per_token()
    settings = [("PLAID k<=10 defaults (ncells 1, 0.5, ndocs 256)", {}),
                ("PLAID k<=100 defaults (ncells 2, 0.45, ndocs 1024)",
                 dict(ncells=2, centroid_score_threshold=0.45, ndocs=1024)),
                ("wide (ncells 8, 0.4, ndocs 1024)", dict(ncells=8, centroid_score_threshold=0.4, ndocs=1024))]
    for label, kw in settings:
        for rescore, extra in (("codes", {}), ("store", dict(store=store))):
            sec, res = timed(lambda: idx.search(queries, k=10, **kw, **extra), args.repeats)
            rows.append(dict(base, impl=f"ours: {label}, exact stage on {rescore}", qps=nq / sec,
                             recall10=recall_at_10(res.ids.tolist(), ex_i),
                             hit1=float((res.ids[:, 0] == targets).float().mean()),
                             latency_ms=latency_ms(lambda q: idx.search([q], k=10, **kw, **extra), queries),
                             bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"],
                             build_s=build_s, n_centroids=idx.snapshot().n_centroids, nbits=args.nbits,
                             candidates=statistics.mean(res.stats["candidates"]),
                             scored_exactly=statistics.mean(res.stats["scored_exactly"]),
                             stage_seconds={k: round(v, 4) for k, v in res.stats["seconds"].items()}))
            print(json.dumps(rows[-1]), flush=True)

    if cs_mod is not None:
        run_colsearch(name, base, docs, queries, targets, ex_i, args, cs_mod, rows, notes)
    if fp_search is None:
        return
    tmp = tempfile.mkdtemp(prefix="fastplaid_")
    try:
        t = time.perf_counter()
        fp = fp_search.FastPlaid(index=tmp, device="cpu")
        fp.create(documents_embeddings=docs, nbits=args.nbits)
        fp_build = time.perf_counter() - t
        files = {f: os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)}
        code_bytes = sum(v for f, v in files.items() if f.startswith(("merged_codes", "merged_residuals")) and f.endswith(".npy"))
        qt = torch.stack(queries)
        for probe, full in ((int(x), 4096) for x in args.fp_probes.split(",") if x):
            def go(q=qt):
                return fp.search(queries_embeddings=q, top_k=10, n_ivf_probe=probe, n_full_scores=full,
                                 show_progress=False)
            sec, res = timed(go, 1)  # slow on the CPU: one timed call after the warmup
            got = [[p for p, _ in r] for r in res]
            rows.append(dict(base, impl=f"fast-plaid (CPU): n_ivf_probe {probe}, n_full_scores {full}", qps=nq / sec,
                             recall10=recall_at_10(got, ex_i),
                             hit1=sum(int(g[0] == int(tt)) for g, tt in zip(got, targets.tolist())) / nq,
                             latency_ms=latency_ms(lambda q: go(q[None]), queries),
                             bytes_per_token=code_bytes / n_tokens if code_bytes else None, build_s=fp_build,
                             nbits=args.nbits))
            print(json.dumps(rows[-1]), flush=True)
    except Exception as exc:  # noqa: BLE001 - keep the rest of the report
        notes.append(f"fast-plaid failed on {name}: {type(exc).__name__}: {exc}"[:400])
        print(notes[-1], flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # its index: up to a few hundred MB


def report_stem(args) -> str:
    return (("prefilter_quick" if args.quick else "prefilter_tenth" if args.tenth else "prefilter")
            + ("" if args.nbits == 2 else f"_nbits{args.nbits}") + (f"_{args.only}" if args.only else ""))


def write(rows, notes, args, meta):
    stem = report_stem(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows, "notes": notes}, indent=1) + "\n")
    lines = [f"# Prefilter on the CPU: recall@10 against exact, QPS ({meta['date']})", "",
             *(h.header(meta["env"], meta["command"]) if "env" in meta else
               [f"Command: `{meta['command']}`. Machine: {meta['machine']}."]), "",
             f"torch threads {args.threads}; fast-plaid {meta['fast_plaid'] or 'absent'}; colsearch {meta['colsearch'] or 'not measured'}; nbits {args.nbits}. QPS: {rows[0]['queries'] if rows else 0} "
             "queries of 32 tokens in one call; latency: one query per call. `x exact`: QPS over exact brute force's; "
             "`x fast-plaid` / `x colsearch`: over that peer's row at the nearest recall (its first row on a tie).", ""]
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        rs = [r for r in rows if r["corpus"] == corpus]
        ex = rs[0]
        fps = [r for r in rs if r["impl"].startswith("fast-plaid")]
        css = [r for r in rs if r["impl"].startswith("colsearch")]
        lines += [f"## {corpus}: {ex['n_docs']:,} documents x {ex['doc_tokens']} tokens (d = 128, {ex['tokens']:,} tokens)", "",
                  "| impl | recall@10 | hit@1 | QPS | x exact | x fast-plaid | x colsearch | 1-query ms | "
                  "bytes/token (codes) | build s |",
                  "|---|---|---|---|---|---|---|---|---|---|"]

        def versus(r, peers, prefix):
            if not peers or r["impl"].startswith(prefix):
                return ""
            ref = min(peers, key=lambda f: abs(f["recall10"] - r["recall10"]))
            return f"{r['qps'] / ref['qps']:.2f}"
        for r in rs:
            b = r.get("bytes_per_token")
            lines.append(f"| {r['impl']} | {r['recall10']:.3f} | {r['hit1']:.3f} | {r['qps']:.1f} | "
                         f"{r['qps'] / ex['qps']:.2f} | {versus(r, fps, 'fast-plaid')} | "
                         f"{versus(r, css, 'colsearch')} | {r['latency_ms']:.1f} | "
                         f"{'' if b is None else f'{b:.1f}'} | {r.get('build_s', 0) or 0:.1f} |")
        ours = [r for r in rs if r["impl"].startswith("ours")]
        if ours:
            o = ours[0]
            lines += ["", f"Ours: {o['n_centroids']:,} centroids; index bytes per token with lists, ids and centroids "
                      f"{o['index_bytes_per_token']:.1f}; default setting: {o['candidates']:.0f} candidates and "
                      f"{o['scored_exactly']:.0f} documents scored exactly per query; stage seconds (all queries) "
                      f"{o['stage_seconds']}.", ""]
    lines += ["## Notes", ""] + [f"* {n}" for n in notes]
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        corpora = list(dict.fromkeys(r["corpus"] for r in rows))
        fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4.5), squeeze=False)
        for ax, corpus in zip(axes[0], corpora):
            for r in (r for r in rows if r["corpus"] == corpus):
                kind = ("o" if r["impl"].startswith("ours") else "s" if r["impl"].startswith("fast")
                        else "^" if r["impl"].startswith("colsearch") else "*")
                ax.scatter(r["qps"], r["recall10"], marker=kind, s=60)
                ax.annotate(r["impl"].split(":")[0] + (":" + r["impl"].split("exact stage on ")[-1]
                                                       if "exact stage" in r["impl"] else
                                                       ":" + r["lane"] if "lane" in r else ""),
                            (r["qps"], r["recall10"]), fontsize=7)
            ax.set_xscale("log")
            ax.set_xlabel("QPS (log)")
            ax.set_ylabel("recall@10 vs exact")
            ax.set_title(corpus)
        fig.tight_layout()
        fig.savefig(args.out / f"{stem}.png", dpi=110)
    except Exception as exc:  # noqa: BLE001
        notes.append(f"plot failed: {exc}")


def headline(quick: bool = True) -> h.Headline:
    """Our prefilter at PLAID's k <= 10 defaults, exact stage on the store (the knowledge index's
    default, ``prefilter_exact="store"``), vs exact brute force over the same store, interleaved, on
    the ``short`` corpus (8,000 x 32 tokens); its recall@10 against exact must reach 0.95 before it is
    timed (headline suite)."""
    spec = CORPORA["short"]
    cents, topics, docs = clustered_corpus(spec["n_docs"], spec["tokens"], 128, n_topics=2048,
                                           topics_per_doc=spec["topics_per_doc"], seed=11)
    _, queries = queries_for(cents, topics, 16 if quick else 64, 32, seed=12)
    store = PackedStore(128)
    store.add(docs)
    idx = PrefilterIndex.build(docs, nbits=2, max_points=1 << 16)
    fns = {"exact": lambda: store.search(queries, k=10), "prefilter": lambda: idx.search(queries, k=10, store=store)}
    recall = recall_at_10(fns["prefilter"]().ids.tolist(), fns["exact"]()[1])
    if recall < 0.95:
        raise h.CorrectnessError(f"prefilter recall@10 {recall:.3f} against exact is under 0.95")
    t = {k: statistics.median(v) for k, v in h.paired(fns, 5).items()}
    return h.Headline(f"prefilter vs exact, {spec['n_docs']:,} x {spec['tokens']} tokens, {len(queries)} queries",
                      f"{t['prefilter'] * 1e3:.1f} ms (recall@10 {recall:.2f})", f"exact {t['exact'] * 1e3:.1f} ms",
                      t["exact"] / t["prefilter"], "exact ms / prefilter ms")


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    fp_search, fp_version, why = load_fast_plaid(args.fast_plaid)
    notes = []
    if fp_search is None:
        notes.append(f"fast-plaid not measured: {why}")
    else:
        notes.append(f"fast-plaid {fp_version} installed with `pip install --no-deps --target .peers/fastplaid "
                     "fast-plaid==1.7.0.290 fastkmeans==0.5.0 usearch numkong` (the build for torch 2.9; this "
                     f"environment has torch {torch.__version__}); it runs on the CPU (no CUDA needed).")
    if args.report_only:
        saved = json.loads((args.out / f"{report_stem(args)}.json").read_text())
        write(saved["rows"], saved["notes"] + [n for n in args.note if n not in saved["notes"]], args, saved["meta"])
        return 0
    notes += args.note
    cs_mod, cs_version = None, None
    if not args.colsearch_lanes:
        notes.append("colsearch not run (`--colsearch-lanes` empty): see `prefilter_long.md` for its CPU lanes.")
    if args.colsearch_lanes:
        import _colsearch
        cs_mod, cs_version, cs_why = _colsearch.load(args.colsearch)
        if cs_mod is None:
            notes.append(f"colsearch not measured: {cs_why}")
        else:
            notes.append(f"colsearch {cs_version} installed with `pip install --no-deps --target .peers/colsearch "
                         "colsearch==0.1.7 h5py bm25s PyStemmer faiss-cpu safetensors latence-shard-engine`; "
                         "CPU lanes through `benchmarks/_colsearch.py` (settings in its docstring and the rows). "
                         "`bytes/token` for colsearch: its shards' fp16 rows (fp16) or rroq158 code tensors "
                         "(the rroq158 shards also keep an fp16 copy of every row, not counted); its build trains "
                         "the LEMUR router MLP twice (10 epochs each) and, for rroq158, k-means with K = 8,192.")
    e = h.env(fast_plaid=fp_version, colsearch=cs_version)
    meta = {"date": e["timestamp"], "command": h.command_line(), "env": e, "fast_plaid": fp_version,
            "colsearch": cs_version}
    rows: list[dict] = []
    global LATENCY_QUERIES
    LATENCY_QUERIES = args.latency_queries
    for name, spec in (QUICK if args.quick else TENTH if args.tenth else CORPORA).items():
        if args.only and name != args.only:
            continue
        run_corpus(name, spec, args, fp_search, rows, notes, cs_mod)
        write(rows, notes, args, meta)
    write(rows, notes, args, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
