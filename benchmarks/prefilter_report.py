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
prefilter at PLAID's defaults for k = 10, at the k <= 100 defaults and a wide setting (8 cells per
query token, as fast-plaid's default 8 probes), each with the exact stage on the decoded codes
(default) and on the store's original vectors (``store=``), and fast-plaid
(``FastPlaid(device="cpu")``) at its default probes and a wider setting, and colsearch 0.1.7
(``colsearch.Index(engine="shard", device="cpu")`` through ``benchmarks/_colsearch.py``, whose
docstring states its settings) in each lane of ``--colsearch-lanes``: ``fp16`` (fp16 rows, its
README and BEIR-benchmark setting) and ``rroq158`` (its default 1.58-bit codec). Both indexes use
the same nbits (``--nbits``, default 2) and k-means over at most 65,536 sampled tokens for ours
(fast-plaid samples by its own rule). QPS: all queries in one call (after one warmup call), median
of ``--repeats`` (fast-plaid: one timed call, it is slow here); latency: one query per call, mean
over 16 queries (``--latency-queries``). colsearch is timed as the others (``search_batch`` over all
queries, ``--repeats``); its build (router training, codec training) is reported in ``build s``.
recall@10: mean overlap of the top-10 ids with exact brute force's top-10.

Writes results/prefilter.{md,json,png} (``prefilter_quick.*`` with --quick; ``_nbits4`` appended
for ``--nbits 4``, ``_<corpus>`` for ``--only <corpus>``).
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
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
SETTINGS = {"PLAID k<=10 defaults (ncells 1, 0.5, ndocs 256)": {},
            "PLAID k<=100 defaults (ncells 2, 0.45, ndocs 1024)": dict(ncells=2, centroid_score_threshold=0.45,
                                                                     ndocs=1024),
            "wide (ncells 8, 0.4, ndocs 1024)": dict(ncells=8, centroid_score_threshold=0.4, ndocs=1024)}
FAST_PLAID_NOTE = ("fast-plaid {} installed with `pip install --no-deps --target .peers/fastplaid "
                   "fast-plaid==1.7.0.290 fastkmeans==0.5.0 usearch numkong` (the build for torch 2.9; this "
                   "environment has torch {}); it runs on the CPU (no CUDA needed).")
COLSEARCH_NOTE = ("colsearch {} installed with `pip install --no-deps --target .peers/colsearch "
                  "colsearch==0.1.7 h5py bm25s PyStemmer faiss-cpu safetensors latence-shard-engine`; "
                  "CPU lanes through `benchmarks/_colsearch.py` (settings in its docstring and the rows). "
                  "`bytes/token` for colsearch: its shards' fp16 rows (fp16) or rroq158 code tensors "
                  "(the rroq158 shards also keep an fp16 copy of every row, not counted); its build trains "
                  "the LEMUR router MLP twice (10 epochs each) and, for rroq158, k-means with K = 8,192.")


def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--tenth", action="store_true",
                   help="the GPU corpora's document shapes at a tenth of their document counts (TENTH)")
    p.add_argument("--fp-probes", default="8,32", help="fast-plaid n_ivf_probe values, comma-separated (each one row)")
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


def recall_at_10(got_ids: list[list[int]], exact_ids: torch.Tensor) -> float:
    """Mean overlap of each query's first 10 ``got_ids`` with its row of ``exact_ids [Nq, 10]``."""
    return sum(len(set(g[:10]) & set(e.tolist())) for g, e in zip(got_ids, exact_ids)) / exact_ids.numel()


def latency_ms(fn_one, queries, n=16):
    """Mean ms of ``fn_one(q)`` over the first `n` queries, after one warmup call."""
    fn_one(queries[0])
    t = time.perf_counter()
    for q in queries[:n]:
        fn_one(q)
    return (time.perf_counter() - t) * 1e3 / min(n, len(queries))


def measure(impl, search_all, search_one, ids, queries, exact_ids, *, repeats, n_latency=16, targets=None, **extra):
    """``(report row, result)``: QPS of ``search_all()`` (median of `repeats` after a warmup),
    recall@10 of ``ids(result)`` (``[Nq][k]`` ids) against `exact_ids` (None: this row is exact),
    hit@1 against `targets` ``[Nq]`` (when given) and the mean ms of ``search_one(q)`` over the
    first `n_latency` queries; `extra` is added as it is."""
    res = search_all()  # also the warmup
    sec = statistics.median(h.time_calls(search_all, repeats, warmup=0))
    got = ids(res)
    row = dict(impl=impl, qps=len(queries) / sec, recall10=1.0 if exact_ids is None else recall_at_10(got, exact_ids),
               latency_ms=latency_ms(search_one, queries, n_latency), **extra)
    if targets is not None:
        row["hit1"] = sum(int(g[0] == t) for g, t in zip(got, targets.tolist())) / len(queries)
    print(json.dumps(row, default=str), flush=True)
    return row, res


def load_fast_plaid(path: str):
    """``(fast_plaid.search, version, None)``, or ``(None, None, why)`` when it does not import."""
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


@contextlib.contextmanager
def fast_plaid_index(fp_search, docs: list[torch.Tensor], nbits: int):
    """``(FastPlaid on the CPU over `docs`, build seconds, bytes of its codes and residuals)``;
    its index folder (up to a few hundred MB) is removed after."""
    with tempfile.TemporaryDirectory(prefix="fastplaid_", ignore_cleanup_errors=True) as tmp:
        t = time.perf_counter()
        fp = fp_search.FastPlaid(index=tmp, device="cpu")
        fp.create(documents_embeddings=docs, nbits=nbits)
        build_s = time.perf_counter() - t
        code_bytes = sum(os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)
                         if f.startswith(("merged_codes", "merged_residuals")) and f.endswith(".npy"))
        yield fp, build_s, code_bytes


@contextlib.contextmanager
def colsearch_index(docs: list[torch.Tensor], lane: str, cs_mod):
    """``(the _colsearch module, a colsearch CPU index of `docs` in `lane`)``; closed and removed after."""
    import _colsearch
    print(f"colsearch {lane}: building ...", flush=True)
    offsets = torch.tensor([0] + [d.shape[0] for d in docs]).cumsum(0)
    with tempfile.TemporaryDirectory(prefix="colsearch_", ignore_cleanup_errors=True) as tmp:
        handle = _colsearch.build(torch.cat(docs), offsets, "cpu", os.path.join(tmp, "index"), lane=lane, module=cs_mod)
        try:
            yield _colsearch, handle
        finally:
            _colsearch.close(handle)


def make_corpus(spec: dict, nq: int):
    """``(docs [n_docs] x [tokens, 128], targets [nq], queries [nq] x [32, 128])`` of one corpus spec."""
    cents, topics, docs = clustered_corpus(spec["n_docs"], spec["tokens"], 128, n_topics=2048,
                                           topics_per_doc=spec["topics_per_doc"], seed=11)
    targets, queries = queries_for(cents, topics, nq, 32, seed=12)
    return docs, targets, queries


def run_corpus(name, spec, args, fp_search, notes, cs_mod=None) -> list[dict]:
    """Every row of one corpus, exact brute force first (the reference of recall@10)."""
    nq = 16 if args.quick else args.queries
    docs, targets, queries = make_corpus(spec, nq)
    n_tokens = spec["n_docs"] * spec["tokens"]
    base = dict(corpus=name, n_docs=spec["n_docs"], doc_tokens=spec["tokens"], tokens=n_tokens, queries=nq)
    qt = torch.stack(queries)
    store = PackedStore(128)
    store.add(docs)
    rows: list[dict] = []
    exact_ids = None  # recall@10 is against the first row's ids

    def row(impl, search_all, search_one, ids, repeats=args.repeats, **extra):
        r, res = measure(impl, search_all, search_one, ids, queries, exact_ids, repeats=repeats,
                         n_latency=args.latency_queries, targets=targets, **extra)
        rows.append({**base, **r})
        return res

    _, exact_ids = row("exact brute force (store, native)", lambda: store.search(queries, k=10),
                       lambda q: store.search([q], k=10), lambda r: r[1].tolist(), bytes_per_token=128 * 4)
    idx, build_s = h.timed(PrefilterIndex.build, docs, nbits=args.nbits, max_points=1 << 16, progress=True)
    bpt = idx.bytes_per_token()
    for label, kw in SETTINGS.items():
        for rescore, extra in (("codes", {}), ("store", dict(store=store))):
            res = row(f"ours: {label}, exact stage on {rescore}", lambda: idx.search(queries, k=10, **kw, **extra),
                      lambda q: idx.search([q], k=10, **kw, **extra), lambda r: r.ids.tolist(),
                      bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"],
                      build_s=build_s, n_centroids=idx.snapshot().n_centroids, nbits=args.nbits)
            rows[-1].update(candidates=statistics.mean(res.stats["candidates"]),
                            scored_exactly=statistics.mean(res.stats["scored_exactly"]),
                            stage_seconds={k: round(v, 4) for k, v in res.stats["seconds"].items()})
    for lane in [x for x in args.colsearch_lanes.split(",") if x] if cs_mod is not None else []:
        with h.noted(notes, f"colsearch {lane} failed on {name}"), colsearch_index(docs, lane, cs_mod) as (cs, handle):
            shown = ", ".join(f"{a} {v}" for a, v in handle.settings.items() if a not in ("compression", "device"))
            row(f"colsearch (CPU): {lane}, {shown}", lambda: cs.search(handle, qt, 10),
                lambda q: cs.search(handle, q[None], 10), lambda r: r.tolist(), bytes_per_token=handle.bytes_per_token,
                build_s=handle.build_s, lane=lane, settings=handle.settings)
    if fp_search is None:
        return rows
    with h.noted(notes, f"fast-plaid failed on {name}"), \
            fast_plaid_index(fp_search, docs, args.nbits) as (fp, build_s, code_bytes):
        for probe, full in ((int(x), 4096) for x in args.fp_probes.split(",") if x):
            def go(q=qt, probe=probe, full=full):
                return fp.search(queries_embeddings=q, top_k=10, n_ivf_probe=probe, n_full_scores=full,
                                 show_progress=False)
            row(f"fast-plaid (CPU): n_ivf_probe {probe}, n_full_scores {full}", go, lambda q: go(q[None]),
                lambda r: [[p for p, _ in q] for q in r], repeats=1,  # slow on the CPU: one timed call
                bytes_per_token=code_bytes / n_tokens if code_bytes else None, build_s=build_s, nbits=args.nbits)
    return rows


def report_stem(args) -> str:
    return (("prefilter_quick" if args.quick else "prefilter_tenth" if args.tenth else "prefilter")
            + ("" if args.nbits == 2 else f"_nbits{args.nbits}") + (f"_{args.only}" if args.only else ""))


def versus(r: dict, peers: list[dict], prefix: str) -> str:
    """`r`'s QPS over the QPS of the row of `peers` nearest in recall ("" for the peer's own rows)."""
    if not peers or r["impl"].startswith(prefix):
        return ""
    ref = min(peers, key=lambda f: abs(f["recall10"] - r["recall10"]))
    return f"{r['qps'] / ref['qps']:.2f}"


def corpus_section(rs: list[dict]) -> list[str]:
    """The Markdown section of one corpus's rows (exact brute force first)."""
    ex = rs[0]
    fps = [r for r in rs if r["impl"].startswith("fast-plaid")]
    css = [r for r in rs if r["impl"].startswith("colsearch")]
    lines = [f"## {ex['corpus']}: {ex['n_docs']:,} documents x {ex['doc_tokens']} tokens (d = 128, "
             f"{ex['tokens']:,} tokens)", "",
             *h.table([("impl", "impl"), ("recall@10", lambda r: f"{r['recall10']:.3f}"),
                       ("hit@1", lambda r: f"{r['hit1']:.3f}"), ("QPS", lambda r: f"{r['qps']:.1f}"),
                       ("x exact", lambda r: f"{r['qps'] / ex['qps']:.2f}"),
                       ("x fast-plaid", lambda r: versus(r, fps, "fast-plaid")),
                       ("x colsearch", lambda r: versus(r, css, "colsearch")),
                       ("1-query ms", lambda r: f"{r['latency_ms']:.1f}"),
                       ("bytes/token (codes)", lambda r: h.fmt(r.get("bytes_per_token"), ".1f", "")),
                       ("build s", lambda r: f"{r.get('build_s', 0) or 0:.1f}")], rs)]
    o = next((r for r in rs if r["impl"].startswith("ours")), None)
    if o:
        lines += ["", f"Ours: {o['n_centroids']:,} centroids; index bytes per token with lists, ids and centroids "
                  f"{o['index_bytes_per_token']:.1f}; default setting: {o['candidates']:.0f} candidates and "
                  f"{o['scored_exactly']:.0f} documents scored exactly per query; stage seconds (all queries) "
                  f"{o['stage_seconds']}.", ""]
    return lines


def plot(rows: list[dict], path: pathlib.Path) -> str | None:
    """recall@10 against QPS (log), one panel per corpus; returns a note when skipped."""
    plt, note = h.matplotlib_or_note()
    if plt is None:
        return note
    corpora = list(dict.fromkeys(r["corpus"] for r in rows))
    fig, axes = plt.subplots(1, len(corpora), figsize=(6 * len(corpora), 4.5), squeeze=False)
    for ax, corpus in zip(axes[0], corpora):
        for r in (r for r in rows if r["corpus"] == corpus):
            peer = r["impl"].split(":")[0]
            marker = {"ours": "o", "fast-plaid (CPU)": "s", "colsearch (CPU)": "^"}.get(peer, "*")
            label = (":" + r["impl"].split("exact stage on ")[-1] if "exact stage" in r["impl"]
                     else ":" + r["lane"] if "lane" in r else "")
            ax.scatter(r["qps"], r["recall10"], marker=marker, s=60)
            ax.annotate(peer + label, (r["qps"], r["recall10"]), fontsize=7)
        ax.set(xscale="log", xlabel="QPS (log)", ylabel="recall@10 vs exact", title=corpus)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def write(rows, notes, args, meta) -> None:
    """``<stem>.{md,json,png}``: one section per corpus, then the notes. `meta`: the peers' versions,
    ``env`` and ``command`` (a JSON written before the harness has ``machine`` instead of ``env``)."""
    body = [f"torch threads {args.threads}; fast-plaid {meta.get('fast_plaid') or 'absent'}; colsearch "
            f"{meta.get('colsearch') or 'not measured'}; nbits {args.nbits}. QPS: {rows[0]['queries'] if rows else 0} "
            "queries of 32 tokens in one call; latency: one query per call. `x exact`: QPS over exact brute force's; "
            "`x fast-plaid` / `x colsearch`: over that peer's row at the nearest recall (its first row on a tie).", ""]
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        body += corpus_section([r for r in rows if r["corpus"] == corpus])
    stem = report_stem(args)
    old = None if "env" in meta else [f"Command: `{meta['command']}`. Machine: {meta['machine']}."]
    data = {"meta": {k: v for k, v in meta.items() if k not in ("env", "command")}, "rows": rows, "notes": notes}
    out = h.write(stem, f"Prefilter on the CPU: recall@10 against exact, QPS ({meta['date']})",
                  body + h.section("Notes", notes), data, args.out, e=meta.get("env", {}), command=meta["command"],
                  echo=False, head=old)
    if out is not None and rows:
        plot(rows, out / f"{stem}.png")


def headline(quick: bool = True) -> h.Headline:
    """Our prefilter at PLAID's k <= 10 defaults, exact stage on the store (the knowledge index's
    default, ``prefilter_exact="store"``), vs exact brute force over the same store, interleaved, on
    the ``short`` corpus (8,000 x 32 tokens); its recall@10 against exact must reach 0.95 before it is
    timed (headline suite)."""
    spec = CORPORA["short"]
    docs, _, queries = make_corpus(spec, 16 if quick else 64)
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


def peers(args) -> tuple:
    """``(fast-plaid search module or None, colsearch module or None, meta, notes)``: who is measured."""
    fp_search, fp_version, why = load_fast_plaid(args.fast_plaid)
    notes = [f"fast-plaid not measured: {why}" if fp_search is None
             else FAST_PLAID_NOTE.format(fp_version, torch.__version__)]
    cs_mod = cs_version = None
    if not args.colsearch_lanes:
        notes.append("colsearch not run (`--colsearch-lanes` empty): see `prefilter_long.md` for its CPU lanes.")
    else:
        import _colsearch
        cs_mod, cs_version, cs_why = _colsearch.load(args.colsearch)
        notes.append(f"colsearch not measured: {cs_why}" if cs_mod is None else COLSEARCH_NOTE.format(cs_version))
    return fp_search, cs_mod, {"fast_plaid": fp_version, "colsearch": cs_version}, notes


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.report_only:
        saved = json.loads((args.out / f"{report_stem(args)}.json").read_text())
        meta = {**saved["meta"], **{k: saved[k] for k in ("env", "command") if k in saved}}
        write(saved["rows"], saved["notes"] + [n for n in args.note if n not in saved["notes"]], args, meta)
        return 0
    fp_search, cs_mod, versions, notes = peers(args)
    notes += args.note
    e = h.env(**versions)
    meta = {"date": e["timestamp"], "command": h.command_line(), "env": e, **versions}
    rows: list[dict] = []
    for name, spec in (QUICK if args.quick else TENTH if args.tenth else CORPORA).items():
        if not args.only or name == args.only:
            rows += run_corpus(name, spec, args, fp_search, notes, cs_mod)
            write(rows, notes, args, meta)  # a report after every corpus: long runs keep what they measured
    write(rows, notes, args, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
