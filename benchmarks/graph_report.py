"""Graph expansion report: our batched BFS vs scipy CSR, python-igraph and NetworkX, same inputs.

Usage (from the repository root)::

    .venv/bin/python benchmarks/graph_report.py                    # 1M nodes / 5M edges, 64 queries
    .venv/bin/python benchmarks/graph_report.py --nodes 200000 --edges 1000000 --skip-networkx

Graph: ``--nodes`` nodes, ``--edges`` directed edges whose endpoints are drawn with probability
``∝ (rank + 1) ** -alpha`` (hubs; see ``_graph_impls.power_law_graph``), node kinds 0..5 and
documents 0..999 uniform. Queries: ``--queries`` x ``--seeds`` distinct uniform seeds, scores
``[Nq, n]`` float32 uniform in [0, 1), threshold 0.7 (30% of nodes pass), ``min_keep = 0`` so
every implementation applies the same rule (see ``_graph_impls``).

Rows, for each depth l in ``--hops``:

* filtered: scipy CSR frontier expansion (the baseline), ours native batched (all queries in
  one call, default threads), ours native one query per call, ours numpy reference backend,
  NetworkX Python BFS (on the first ``--slow-queries`` queries);
* unfiltered: scipy CSR (baseline), ours native batched with ``scores=None``, python-igraph
  ``Graph.neighborhood(seeds, order=l, mode='all')`` (which cannot filter per hop).

Before anything is timed, the reached node set of every query is checked: ours native equals
scipy (filtered) and python-igraph (unfiltered); every other row equals ours. A mismatch prints
the difference and exits with status 1. Each row is then timed ``--repeats`` times (fewer when
one call exceeds ``--max-row-s``); the median per query is reported, speedup = scipy ms / row
ms. Note ours also returns hop, seed, parent, parent edge, score and the induced edges, which no
peer computes.

``--quick``: 100,000 nodes / 500,000 edges, 16 queries, 2 calls, no NetworkX (``graph_expand_quick.*``).
Writes ``results/graph_expand.md``, ``.json`` and ``.png`` beside this file (or under ``--out``).
"""
from __future__ import annotations

import functools
import gc
import importlib
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # _graph_impls beside us

import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

import _graph_impls as gi  # noqa: E402
import _harness as h  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
BASELINE = "scipy CSR frontier"
NO_EDGES = "ours native batched, with_edges=False"
NO_EDGES_1T = "ours native batched, with_edges=False, 1 thread"
ALL_COPIED = "ours native batched, with_edges=False, every list copied"
ALL_COPIED_GRAPH = "ours native, every list copied (set_copy_budget(10))"
FLOOR_1T = "score reads alone, 1 thread (floor)"
FLOOR = "score reads alone, 2 threads (floor)"
FILTERED_ROWS = (BASELINE, FLOOR_1T, FLOOR, "ours native batched", NO_EDGES, NO_EDGES_1T, ALL_COPIED,
                 "ours native 1 query/call",
                 "ours reference (numpy)", "NetworkX Python BFS")
FLOOR_ROWS = (FLOOR_1T, FLOOR)  # not expansions: they read the judged scores and count passes
UNFILTERED_ROWS = (BASELINE, "ours native batched", NO_EDGES, "python-igraph neighborhood")


def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=5_000_000)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--seeds", type=int, default=10, help="seeds per query")
    p.add_argument("--alpha", type=float, default=0.8, help="power-law exponent of endpoint choice")
    p.add_argument("--hops", default="1,2,3", help="comma-separated BFS depths l")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per row (median reported)")
    p.add_argument("--max-row-s", type=float, default=20.0, help="stop repeating a row once a call took this long")
    p.add_argument("--slow-queries", type=int, default=8, help="queries run by the NetworkX row")
    p.add_argument("--skip-networkx", action="store_true", help="skip the NetworkX build and row")
    p.add_argument("--skip-reference", action="store_true", help="skip the numpy reference backend row")
    args = p.parse_args(argv)
    if args.quick:
        args.nodes, args.edges, args.queries, args.repeats, args.skip_networkx = 100_000, 500_000, 16, 2, True
    return args


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------

def release_free_memory() -> None:
    """GC, then glibc ``malloc_trim(0)`` so freed heap pages leave the RSS (no-op elsewhere).
    Python's small-object arenas are not trimmed: RSS deltas of structures built from Python
    ints (python-igraph's edge list, NetworkX) keep some of that overhead."""
    gc.collect()
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def measured_build(fn):
    """``(obj, seconds, rss_delta_bytes)`` of ``obj = fn()``, freed temporaries released on
    both sides (:func:`release_free_memory`) so only what the structure keeps is counted."""
    release_free_memory()
    before = h.proc_bytes("VmRSS")
    obj, secs = h.timed(fn)
    release_free_memory()
    return obj, secs, h.proc_bytes("VmRSS") - before


def machine_info() -> dict:
    """``_harness.env()`` plus the peers' versions and the thread count our batched call uses."""
    import colgraph_engine as cg
    from colgraph_engine.ops._native_impl import num_threads
    return h.env(scipy=h.version("scipy"), **{"python-igraph": h.version("igraph")}, networkx=h.version("networkx"),
                 igraph_c_in_colgraph=cg.backends().get("igraph_version"), colgraph_num_threads=num_threads())


# ------------------------------------------------------------------------------------------
# Build
# ------------------------------------------------------------------------------------------

def build_all(g: gi.GraphArrays, skip_reference: bool, skip_networkx: bool) -> tuple[dict, list[dict]]:
    """Builds every structure from the same arrays; ``(structures, build rows)``."""
    for module in ("igraph", "scipy.sparse") + (() if skip_networkx else ("networkx",)):
        importlib.import_module(module)  # up front, so that module code is not counted as graph memory
    built, rows = {}, []
    steps = [("ours native", lambda: gi.ours_graph(g, "native")),
             (ALL_COPIED_GRAPH, lambda: gi.ours_graph(g, "native", copy_budget=10.0)),
             ("scipy CSR (symmetric)", lambda: gi.symmetric_csr(g)),
             ("python-igraph Graph(n, edges)", lambda: gi.igraph_graph(g))]
    if not skip_reference:
        steps.append(("ours reference (numpy)", lambda: gi.ours_graph(g, "reference")))
    for name, fn in tqdm(steps, desc="build", unit="graph"):
        obj, secs, delta = measured_build(fn)
        built[name] = obj
        row = {"structure": name, "build_s": secs, "rss_delta_bytes": delta, "rss_bytes_per_edge": delta / g.m}
        if name.startswith("ours native"):
            row["memory_bytes"] = obj.memory_bytes()
            row["bytes_per_edge"] = obj.memory_bytes() / g.m
        elif name.startswith("scipy"):
            row["bytes_per_edge"] = gi.csr_nbytes(obj) / g.m
            row["nnz"] = int(obj.nnz)
        rows.append(row)
    return built, rows


# ------------------------------------------------------------------------------------------
# Rows
# ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _pool(threads: int):
    """A thread pool started once, so the floor rows do not time thread start-up."""
    from concurrent.futures import ThreadPoolExecutor
    return ThreadPoolExecutor(threads)


def row_fns(built: dict, q: gi.Queries, hops: int, skip_reference: bool) -> dict:
    """``{(mode, row name): fn}``: the timed calls. Each returns its native result (our
    Expansion, or a list of them; the peers' per-query ``[R]`` arrays) so that a row pays only
    for its own work; :func:`reached_sets` turns it into sets for the check."""
    kg, sc = built["ours native"], gi.ScipyExpander(built["scipy CSR (symmetric)"])
    ig_graph = built["python-igraph Graph(n, edges)"]
    fns = {
        ("filtered", BASELINE): lambda: sc.expand(q, hops),
        ("filtered", "ours native batched"): lambda: gi.ours_batched(kg, q, hops),
        ("filtered", "ours native 1 query/call"): lambda: gi.ours_per_query(kg, q, hops),
        ("unfiltered", BASELINE): lambda: sc.expand(q, hops, filtered=False),
        ("unfiltered", "ours native batched"): lambda: gi.ours_batched(kg, q, hops, filtered=False),
        ("unfiltered", "python-igraph neighborhood"): lambda: gi.igraph_expand(ig_graph, q, hops),
        # the node set alone, like the peers return
        ("filtered", NO_EDGES): lambda: gi.ours_batched(kg, q, hops, with_edges=False),
        ("filtered", NO_EDGES_1T): lambda: gi.ours_batched(kg, q, hops, with_edges=False, num_threads=1),
        ("filtered", ALL_COPIED): lambda: gi.ours_batched(built[ALL_COPIED_GRAPH], q, hops, with_edges=False),
        ("unfiltered", NO_EDGES): lambda: gi.ours_batched(kg, q, hops, filtered=False, with_edges=False),
    }
    judged = gi.judged_nodes(sc, q, hops)  # found once, outside the timing
    fns[("filtered", FLOOR_1T)] = lambda: gi.read_scores(q, judged)
    fns[("filtered", FLOOR)] = lambda: gi.read_scores(q, judged, pool=_pool(2))
    if not skip_reference:
        ref = built["ours reference (numpy)"]
        fns[("filtered", "ours reference (numpy)")] = lambda: gi.ours_batched(ref, q, hops)
    return fns


def reached_sets(raw) -> list[np.ndarray]:
    """Per query ``[R]`` reached ids from a row's result (Expansion, list of Expansion, list of arrays)."""
    if hasattr(raw, "node_offsets"):
        return gi.expansion_sets(raw)
    if raw and hasattr(raw[0], "node_offsets"):
        return [gi.expansion_sets(e)[0] for e in raw]
    return raw


# Which row each row is checked against (the two anchors are checked against the peers, as the brief asks).
CHECK_AGAINST = {
    ("filtered", "ours native batched"): ("filtered", BASELINE),
    ("filtered", "ours native 1 query/call"): ("filtered", "ours native batched"),
    ("filtered", "ours reference (numpy)"): ("filtered", "ours native batched"),
    ("unfiltered", "ours native batched"): ("unfiltered", "python-igraph neighborhood"),
    ("unfiltered", BASELINE): ("unfiltered", "ours native batched"),
    ("filtered", NO_EDGES): ("filtered", "ours native batched"),
    ("filtered", NO_EDGES_1T): ("filtered", "ours native batched"),
    ("filtered", ALL_COPIED): ("filtered", "ours native batched"),
    ("unfiltered", NO_EDGES): ("unfiltered", "ours native batched"),
}


def check_depth(fns: dict, hops: int, q: gi.Queries) -> dict:
    """Runs every row once (also its warmup) and checks the reached sets; raises
    ``_graph_impls.CorrectnessError`` on a mismatch. The reference Expansion must also equal native
    array for array (order, parents, scores, induced edges). Returns ``{(mode, row): raw result}``."""
    raw = {key: fn() for key, fn in tqdm(fns.items(), desc=f"l={hops} check", unit="row", leave=False)}
    for key, want in CHECK_AGAINST.items():
        if key in raw and want in raw:
            gi.check_same_sets(f"l={hops}: {key[1]} ({key[0]})", reached_sets(raw[key]), reached_sets(raw[want]),
                               f"{want[1]} ({want[0]})")
    ref = raw.get(("filtered", "ours reference (numpy)"))
    if ref is not None and not ref.equals(raw[("filtered", "ours native batched")]):
        raise gi.CorrectnessError(f"l={hops}: reference Expansion differs from native")
    # the floor rows must have read exactly the scores that decide the expansion: as many pass
    # as nodes were reached beyond the seeds
    beyond_seeds = sum(len(s) for s in reached_sets(raw[("filtered", BASELINE)])) - sum(
        len(np.unique(s)) for s in q.seeds)
    for name in FLOOR_ROWS:
        if ("filtered", name) in raw and raw[("filtered", name)] != beyond_seeds:
            raise gi.CorrectnessError(f"l={hops}: {name} counted {raw[('filtered', name)]} passing scores, "
                                      f"expected {beyond_seeds}")
    return raw


def run_depth(built: dict, q: gi.Queries, hops: int, args) -> list[dict]:
    """Checks then times every row at depth `hops`, interleaved (``_harness.paired``)."""
    fns = row_fns(built, q, hops, args.skip_reference)
    raw = check_depth(fns, hops, q)  # also every row's warmup call
    induced = {mode: float(np.diff(raw[(mode, "ours native batched")].edge_offsets).mean())
               for mode in ("filtered", "unfiltered")}
    secs = h.paired(fns, args.repeats, warmup=0, max_s=args.max_row_s)
    rows = []
    for (mode, name), s_all in secs.items():
        reached = [len(s) for s in reached_sets(raw[(mode, BASELINE if name in FLOOR_ROWS else name)])]
        rows.append(row(mode, name, hops, q.nq, s_all, reached, induced_edges_mean_ours=induced[mode]))
    del raw
    return rows


def row(mode, name, hops, nq, s_all, reached, **extra) -> dict:
    t = h.stats(s_all)
    return {"mode": mode, "impl": name, "hops": hops, "queries": nq, "rounds": len(s_all), "s_all": s_all,
            "ms_per_query": t["ms_median"] / nq, "ms_per_query_min": t["ms_min"] / nq,
            "reached_mean": float(np.mean(reached)), "reached_max": int(np.max(reached)), **extra}


def run_networkx(g: gi.GraphArrays, q: gi.Queries, built: dict, hops_list: list[int], args) -> tuple[dict, list[dict]]:
    """Builds the nx.Graph (build time, RSS bytes/edge), then checks and times the filtered
    Python BFS on the first ``--slow-queries`` queries; frees the graph after."""
    G, secs, delta = measured_build(lambda: gi.networkx_graph(g))
    build_row = {"structure": "NetworkX nx.Graph", "build_s": secs, "rss_delta_bytes": delta,
                 "rss_bytes_per_edge": delta / g.m}
    k = min(args.slow_queries, q.nq)
    seeds, scores = gi.networkx_inputs(q, k)
    sc = gi.ScipyExpander(built["scipy CSR (symmetric)"])
    rows = []
    for hops in tqdm(hops_list, desc="NetworkX", unit="depth"):
        fn = functools.partial(gi.networkx_expand, G, seeds, scores, hops, q.threshold)
        got, first = h.timed(fn)  # the check pass is one timed round too: slow rows get few
        gi.check_same_sets(f"l={hops}: NetworkX (filtered)", got, sc.expand(q, hops, nq=k), f"{BASELINE} (filtered)")
        more = h.time_calls(fn, args.repeats - 1, warmup=0, max_s=args.max_row_s) if first < args.max_row_s else []
        rows.append(row("filtered", "NetworkX Python BFS", hops, k, [first, *more], [len(x) for x in got]))
    del G, fn
    gc.collect()
    return build_row, rows


# ------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------

def _fmt_ms(ms: float) -> str:
    return f"{ms:.3f}" if ms < 1 else f"{ms:.2f}" if ms < 100 else f"{ms:.0f}"


def timing_table(rows: list[dict], hops_list: list[int]) -> list[str]:
    """Wide table: one line per (mode, implementation), ``ms/query (speedup)`` per depth."""
    by = {(r["mode"], r["impl"], r["hops"]): r for r in rows}
    lines = [{"mode": mode, "impl": name, "cells": cells, "nq": next(c["queries"] for c in cells if c)}
             for mode, names in (("filtered", FILTERED_ROWS), ("unfiltered", UNFILTERED_ROWS)) for name in names
             for cells in [[by.get((mode, name, x)) for x in hops_list]] if any(cells)]
    cell = lambda c: f"{_fmt_ms(c['ms_per_query'])} ({c['speedup_vs_scipy']:.2f}×)" if c else "—"  # noqa: E731
    return h.table([("mode", "mode"), ("implementation", "impl"), ("queries timed:", "nq")]
                   + [(f"l={x} ms/query (× scipy):", lambda r, i=i: cell(r["cells"][i]))
                      for i, x in enumerate(hops_list)],
                   lines)


def reach_table(rows: list[dict], hops_list: list[int]) -> list[str]:
    """Mean reached nodes (and our induced edges) per query, per mode and depth."""
    by = {(r["mode"], r["hops"]): r for r in rows if r["impl"] == "ours native batched"}
    def cell(r):
        return f"{r['reached_mean']:,.0f} ({r['reached_max']:,}) / {r['induced_edges_mean_ours']:,.0f}"
    return h.table([("mode", "mode")] + [(f"l={x} nodes (max) / induced edges:",
                                          lambda m, x=x: cell(by[(m["mode"], x)]))
                                         for x in hops_list], [{"mode": "filtered"}, {"mode": "unfiltered"}])


def build_table(build_rows: list[dict]) -> list[str]:
    return h.table([("structure", "structure"), ("build s:", lambda b: f"{b['build_s']:.2f}"),
                    ("bytes/edge (arrays):", lambda b: h.fmt(b.get("bytes_per_edge"))),
                    ("bytes/edge (RSS delta):", lambda b: f"{b['rss_bytes_per_edge']:.1f}")], build_rows)


def to_markdown(res: dict) -> list[str]:
    """The report's body (the harness adds title and environment header)."""
    info, cfg, hops_list = res["machine"], res["config"], res["config"]["hops"]
    deg = res["degree"]
    lines = [
        f"- peers: scipy {info['scipy']}, python-igraph {info['python-igraph']}, networkx {info['networkx']}; "
        f"igraph C {info['igraph_c_in_colgraph']} in colgraph_engine, {info['colgraph_num_threads']} threads",
        f"- graph: {cfg['nodes']:,} nodes, {cfg['edges']:,} directed edges, endpoints ∝ (rank+1)^-{cfg['alpha']}; "
        f"undirected degree max {deg['max']:,}, mean {deg['mean']:.1f}, median {deg['median']:.0f}, "
        f"p99 {deg['p99']:.0f}, isolated {deg['isolated_share']:.1%}",
        f"- queries: {cfg['queries']} × {cfg['seeds']} seeds; scores uniform [0, 1) float32, keep score > "
        f"{cfg['threshold']} (30% pass), min_keep = 0, direction both",
        f"- total runtime {res['total_s']:.0f} s", "",
        "## Expansion time", "",
        "Median of up to "
        f"{cfg['repeats']} interleaved calls after a checked warmup call; ms per query = call time / queries. "
        "Speedup = scipy ms / row ms in the same mode and depth (> 1: faster than scipy). "
        "Batched = all queries in one call; 1 query/call = a Python loop of single-query calls. "
        "Ours returns per node hop, seed, parent, parent edge and score plus (by default) the "
        "induced edges; the peers return only the node set (`with_edges=False` skips our edges). "
        "python-igraph cannot filter per hop, so it is "
        "compared unfiltered. Every row's node sets were checked equal before timing. "
        "The two *floor* rows are not expansions: given each query's judged nodes (the frontier's "
        "new neighbours at every hop, found beforehand), they only read those nodes' scores with a "
        "numpy gather and count the passes (checked equal to the nodes reached beyond the seeds). "
        "Every implementation of the filtered rule must make these reads, at random places of a "
        "4 MB score row per query, so they bound from below what any row can reach on this machine.", "",
        *timing_table(res["rows"], hops_list), "",
        "## Reached per query (mean, max over queries)", "",
        *reach_table(res["rows"], hops_list), "",
        "## Build and memory", "",
        "Build from the int64 edge arrays already in memory (python-igraph's time includes the "
        "`.tolist()` it needs). bytes/edge (arrays): ours `memory_bytes()` / m; scipy "
        "data + indices + indptr (float32 data, int32 indices, both directions, multi-edges merged) / m. "
        "RSS delta: process resident memory after − before the build (GC'd) / m, m = "
        f"{cfg['edges']:,}.", "",
        *build_table(res["builds"]),
    ]
    return lines


def run(args) -> dict:
    """Generates the graph and queries, builds every structure, checks and times every row."""
    t_start = time.perf_counter()
    hops_list = [int(x) for x in args.hops.split(",")]
    info = machine_info()
    print(f"generating {args.nodes:,} nodes / {args.edges:,} edges ...", flush=True)
    g = gi.power_law_graph(args.nodes, args.edges, args.alpha)
    q = gi.make_queries(g.n, args.queries, args.seeds)
    degree = gi.degree_stats(g)
    built, builds = build_all(g, args.skip_reference, args.skip_networkx)
    rows = []
    for hops in tqdm(hops_list, desc="depths", unit="l"):
        rows += run_depth(built, q, hops, args)
    if not args.skip_networkx:
        nx_build, nx_rows = run_networkx(g, q, built, hops_list, args)
        builds.append(nx_build)
        rows += nx_rows
    for r in rows:
        r["case"] = f"{r['mode']} l={r['hops']}"
    h.add_ratios(rows, BASELINE, key="ms_per_query", field="speedup_vs_scipy", group="case")
    cfg = {"nodes": g.n, "edges": g.m, "alpha": args.alpha, "queries": q.nq, "seeds": args.seeds,
           "threshold": float(q.threshold), "hops": hops_list, "repeats": args.repeats,
           "slow_queries": args.slow_queries}
    return {"machine": info, "config": cfg, "degree": degree, "builds": builds, "rows": rows,
            "total_s": time.perf_counter() - t_start}


def headline(quick: bool = True) -> h.Headline:
    """Filtered BFS, l = 2, all queries in one call vs scipy's CSR frontier (headline suite)."""
    args = parse_args(["--quick", "--hops", "2", "--skip-reference"] if quick else
                      ["--nodes", "300000", "--edges", "1500000", "--queries", "32", "--hops", "2",
                       "--skip-reference", "--skip-networkx"])
    res = run(args)
    by = {(r["mode"], r["impl"]): r for r in res["rows"] if r["hops"] == 2}
    # the node sets alone, as scipy returns them (with the induced edges: the detail column)
    ours, peer, full = by[("filtered", NO_EDGES)], by[("filtered", BASELINE)], by[("filtered", "ours native batched")]
    return h.Headline(f"BFS l=2 filtered, {args.nodes:,} nodes / {args.edges:,} edges, {args.queries} queries batched",
                      f"{ours['ms_per_query']:.2f} ms/query", f"scipy CSR {peer['ms_per_query']:.2f} ms/query",
                      ours["speedup_vs_scipy"], f"scipy ms / ours ms, node sets only ({ours['impl']}); with the "
                      f"induced edges and per-node hop/parent/score: {full['speedup_vs_scipy']:.2f}×")


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        res = run(args)
    except gi.CorrectnessError as exc:  # a row is wrong: nothing is reported
        print(f"CORRECTNESS FAILURE: {exc}", file=sys.stderr)
        return 1
    stem = h.stem("graph_expand", args)
    out = h.write(stem, "Graph expansion benchmark", to_markdown(res), res, args.out, e=res["machine"])
    if out is not None:
        _, series = h.ms_series(res["rows"], key="ms_per_query", group="case")
        groups = [f"{m} l={x}" for m in ("filtered", "unfiltered") for x in res["config"]["hops"]]
        cfg = res["config"]
        h.bar_plot(out / f"{stem}.png", groups, series, ylabel="ms per query (log)", labels="{:.3g}",
                   title=f"Graph expansion, {cfg['nodes']:,} nodes / {cfg['edges']:,} edges, {cfg['queries']} "
                         f"queries × {cfg['seeds']} seeds — {res['machine']['cpu_model']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
