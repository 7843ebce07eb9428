"""CPU graph expansion: ours (native, batched) vs a scipy CSR frontier expansion, same inputs.

Run::

    .venv/bin/python -m pytest benchmarks/test_cpu_graph.py --benchmark-only -q

Graph: 200k nodes, 1M directed power-law edges (``_graph_impls.power_law_graph``); 64 queries
x 10 seeds, scores ``[64, 200k]`` uniform, keep ``score > 0.7`` (30% pass), ``min_keep = 0``,
l = 2 (filtered) and l = 2 unfiltered. One benchmark group per mode, so pytest-benchmark's
table shows each row relative to the fastest of its group. Before a row is timed its reached
node sets are checked against scipy, so a wrong expansion fails instead of being timed. The
full-size comparison with igraph and NetworkX is ``graph_report.py``.
"""
import functools

import pytest

import _graph_impls as gi

N_NODES, N_EDGES, N_QUERIES, HOPS = 200_000, 1_000_000, 64, 2
ROUNDS = 5  # one round is tens of ms to a few hundred; the module stays well under 2 minutes


@functools.lru_cache(maxsize=1)
def _inputs():
    """``(queries, ours KnowledgeGraph, ScipyExpander)`` built once per session."""
    g = gi.power_law_graph(N_NODES, N_EDGES)
    q = gi.make_queries(g.n, N_QUERIES)
    return q, gi.ours_graph(g, "native"), gi.ScipyExpander(gi.symmetric_csr(g))


def _impls(filtered: bool):
    """``{row name: (fn, to_sets)}``: the timed call and how to read its per-query node sets."""
    q, kg, sc = _inputs()
    return {
        "scipy CSR frontier": (lambda: sc.expand(q, HOPS, filtered=filtered), lambda r: r),
        "ours native batched": (lambda: gi.ours_batched(kg, q, HOPS, filtered=filtered), gi.expansion_sets),
        # the peers list nodes only; this row does the same work (no induced edges)
        "ours native batched nodes only": (
            lambda: gi.ours_batched(kg, q, HOPS, filtered=filtered, with_edges=False), gi.expansion_sets),
    }


def _params():
    for mode in ("filtered", "unfiltered"):
        for name in ("scipy CSR frontier", "ours native batched", "ours native batched nodes only"):
            yield pytest.param(mode, name, id=f"{mode}-{name.replace(' ', '_')}",
                               marks=pytest.mark.benchmark(group=f"l={HOPS} {mode}, {N_NODES:,} nodes / {N_EDGES:,} edges, {N_QUERIES} queries"))


@pytest.mark.parametrize(("mode", "name"), list(_params()))
def test_graph_expand_cpu(benchmark, mode, name):
    if not gi.native_available():
        pytest.skip("native module unavailable")
    filtered = mode == "filtered"
    impls = _impls(filtered)
    fn, to_sets = impls[name]
    want_fn, want_sets = impls["scipy CSR frontier"]
    got = to_sets(fn())  # doubles as warmup
    gi.check_same_sets(name, got, want_sets(want_fn()), "scipy CSR frontier")  # raises before timing
    benchmark.extra_info.update(reached_mean=sum(map(len, got)) / len(got), queries=N_QUERIES, hops=HOPS)
    benchmark.pedantic(fn, rounds=ROUNDS, iterations=1, warmup_rounds=0)
