"""KnowledgeGraph: native (igraph) expansion equals the numpy reference, and both match
independent hand checks of multi-source BFS, the relevance rule, masks, budgets and aliases."""
import threading
from collections import deque

import numpy as np
import pytest

from colgraph_engine.graph import Csr, KnowledgeGraph, NodeKind, SparseScores, normalize_name
from colgraph_engine._arraydir import FormatError

from .conftest import NATIVE

BACKENDS = [pytest.param("native", marks=NATIVE), "reference"]


def random_graph(seed, n=200, m=900, n_docs=4, backend=None):
    """Power-law-ish graph with hubs, self-loops, parallel edges and isolated nodes."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n + 1) ** 0.8
    weights[-10:] = 0  # isolated nodes
    p = weights / weights.sum()
    src = rng.choice(n, m, p=p)
    dst = rng.choice(n, m, p=p)
    src = np.concatenate([src, [5, 5, 7, 7]])  # explicit self-loops and parallel edges
    dst = np.concatenate([dst, [5, 9, 7, 9]])
    return (rng.integers(0, 6, n), rng.integers(0, n_docs, n), src, dst, rng.integers(0, 4, src.size))


def both(seed, **kw):
    kind, doc, src, dst, ek = random_graph(seed, **kw)
    return [KnowledgeGraph.from_arrays(kind, doc, src, dst, edge_kind=ek, backend=b)
            for b in ("native", "reference")]


OPTION_SETS = [
    dict(),
    dict(scores="dense", threshold=0.6, min_keep=3),
    dict(scores="dense", threshold=0.95, min_keep=5, node_kinds=[1, 2, 3]),
    dict(scores="sparse", threshold=0.2, min_keep=0, edge_kinds=[0, 2]),
    dict(scores="dicts", threshold=0.5, min_keep=3, docs="two", budget=25),
    dict(direction="out", docs="two"),
    dict(direction="in", scores="dense", threshold=0.3, budget=12),
    dict(scores="dense", threshold=0.5, min_keep=3, aliases=True),
    dict(scores="dense", threshold=0.4, min_keep=2, aliases=True, docs="two", node_kinds=[0, 2, 4]),
    dict(aliases=True, merge_aliases=False),
    # scores for part of the nodes and a min_keep the scored ones often cannot fill: the top-up
    # must stop at the scored candidates
    dict(scores="sparse", threshold=0.7, min_keep=6),
    dict(scores="sparse", threshold=0.6, min_keep=4, aliases=True, budget=30),
    dict(scores="dense_inf", threshold=0.8, min_keep=5, docs="two"),
]


def make_args(opts, n, nq, rng):
    kw = {k: v for k, v in opts.items() if k not in ("scores", "docs", "aliases")}
    scores = opts.get("scores")
    dense = rng.random((nq, n)).astype(np.float32)
    if scores == "dense":
        kw["scores"] = dense
    elif scores == "sparse":
        listed = [np.sort(rng.choice(n, n // 3, replace=False)) for _ in range(nq)]
        offsets = np.concatenate([[0], np.cumsum([x.size for x in listed])])
        nodes = np.concatenate(listed)
        kw["scores"] = SparseScores(offsets, nodes, rng.random(nodes.size).astype(np.float32))
    elif scores == "dense_inf":  # about half of each row unscored
        kw["scores"] = np.where(rng.random((nq, n)) < 0.5, -np.inf, dense).astype(np.float32)
    elif scores == "dicts":
        kw["scores"] = [{int(v): float(dense[q, v]) for v in rng.choice(n, n // 2, replace=False)} for q in range(nq)]
    if opts.get("docs") == "two":
        kw["docs"] = [list(rng.choice(4, 2, replace=False)) for _ in range(nq)]
    return kw


@NATIVE
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("hops", [0, 1, 2, 3])
@pytest.mark.parametrize("opts", OPTION_SETS, ids=[str(i) for i in range(len(OPTION_SETS))])
def test_native_equals_reference(seed, hops, opts):
    native, ref = both(seed)
    rng = np.random.default_rng(100 + seed)
    n, nq = native.n_nodes, 6
    if opts.get("aliases"):
        groups = np.where(rng.random(n) < 0.3, rng.integers(0, 15, n), -1)
        native.set_aliases(groups)
        ref.set_aliases(groups)
    seeds = [list(rng.integers(0, n, rng.integers(1, 6))) for _ in range(nq)]
    seeds[1] = seeds[0]  # the same seeds in two queries
    seeds[2] = [n - 1, n - 2]  # isolated seeds
    seeds[3] = seeds[3] + seeds[3][:1]  # a repeated seed
    kw = make_args(opts, n, nq, rng)
    a, b = native.expand(seeds, hops, **kw), ref.expand(seeds, hops, **kw)
    assert a.equals(b)
    if "scores" in kw and not opts.get("aliases"):  # (alias members ride with their unit)
        assert (a.score[a.hop > 0] > -np.inf).all()  # no unscored node past the seeds
    assert a.node_offsets[-1] >= sum(len(set(s)) for s in seeds) or "aliases" in opts or kw.get("budget")


def plain_bfs(n, src, dst, seeds, hops):
    """Independent oracle: undirected multi-source BFS distances, no filters."""
    adj = [[] for _ in range(n)]
    for s, d in zip(src, dst):
        adj[s].append(d)
        adj[d].append(s)
    dist = {s: 0 for s in seeds}
    queue = deque(seeds)
    while queue:
        u = queue.popleft()
        if dist[u] == hops:
            continue
        for v in adj[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    return dist


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hops", [0, 1, 2, 3])
def test_unfiltered_expansion_is_true_multi_source_bfs(backend, hops):
    kind, doc, src, dst, _ = random_graph(3)
    g = KnowledgeGraph.from_arrays(kind, doc, src, dst, backend=backend)
    seeds = [[0, 50, 199], [17]]
    ex = g.expand(seeds, hops)
    for q, s in enumerate(seeds):
        want = plain_bfs(g.n_nodes, src, dst, s, hops)
        r = ex[q]
        assert dict(zip(r.nodes.tolist(), r.hop.tolist())) == want
        # every non-seed came through a real edge from a node one hop closer, from the same seed
        at = dict(zip(r.nodes.tolist(), range(len(r.nodes))))
        for i in np.nonzero(r.hop > 0)[0]:
            e, p = r.parent_edge[i], r.parent[i]
            assert {src[e], dst[e]} == {p, r.nodes[i]} or (src[e] == dst[e] == p)
            assert r.hop[at[p]] == r.hop[i] - 1 and r.seed[at[p]] == r.seed[i]
        # induced edges: exactly the edges with both ends reached
        inside = set(r.nodes.tolist())
        assert r.edges.tolist() == [e for e in range(len(src)) if src[e] in inside and dst[e] in inside]


def star():
    """Node 0 linked to 1..6 (entities), 7 an image behind 1; documents 0 and 1."""
    kind = [NodeKind.ENTITY] * 7 + [NodeKind.IMAGE]
    doc = [0, 0, 0, 0, 1, 1, 1, 0]
    src = [0, 0, 0, 0, 0, 0, 1]
    dst = [1, 2, 3, 4, 5, 6, 7]
    return kind, doc, src, dst


@pytest.mark.parametrize("backend", BACKENDS)
def test_relevance_rule_threshold_then_min_keep(backend):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    s = np.array([[1.0, 0.9, 0.2, 0.7, 0.1, 0.6, 0.3, 0.8]], np.float32)
    ex = g.expand([[0]], 1, scores=s, threshold=0.5, min_keep=3)
    assert ex[0].nodes.tolist() == [0, 1, 3, 5]  # three pass (listed in discovery order)
    ex = g.expand([[0]], 1, scores=s, threshold=0.8, min_keep=3)
    assert ex[0].nodes.tolist() == [0, 1, 3, 5]  # one passes; the best three are kept
    ex = g.expand([[0]], 1, scores=s, threshold=0.8, min_keep=0)
    assert ex[0].nodes.tolist() == [0, 1]
    ex = g.expand([[0]], 2, scores=s, threshold=0.8, min_keep=0)
    assert ex[0].nodes.tolist() == [0, 1] and ex[0].edges.tolist() == [0]  # 7 is 0.8, not > 0.8
    np.testing.assert_array_equal(ex[0].score, np.array([1.0, 0.9], np.float32))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("form", ["sparse", "dicts"])
def test_min_keep_top_up_never_admits_unlisted_sparse_nodes(backend, form):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    listed = {2: 0.3, 5: 0.9}  # of 0's neighbours 1..6, only 2 and 5 have a score
    scores = (SparseScores(np.array([0, 2]), np.array(list(listed)), np.array(list(listed.values()), np.float32))
              if form == "sparse" else [listed])
    r = g.expand([[0]], 2, scores=scores, threshold=0.5, min_keep=4)[0]
    assert r.nodes.tolist() == [0, 2, 5]  # 5 passes, 2 tops up; 1, 3, 4, 6 (and 7 behind 1) stay out
    assert r.hop.tolist() == [0, 1, 1] and r.parent.tolist() == [-1, 0, 0] and r.parent_edge.tolist() == [-1, 1, 4]
    np.testing.assert_array_equal(r.score, np.array([-np.inf, 0.3, 0.9], np.float32))
    assert r.edges.tolist() == [1, 4]
    assert g.expand([[0]], 1, scores=[{}], threshold=0.5, min_keep=3)[0].nodes.tolist() == [0]  # nothing scored
    assert g.expand([[0]], 1, scores=[{3: -np.inf, 6: 0.1}], min_keep=3)[0].nodes.tolist() == [0, 6]  # listed as -inf
    assert g.expand([[0]], 1, scores=None, min_keep=3)[0].nodes.tolist() == [0, 1, 2, 3, 4, 5, 6]  # no filter
    # an alias unit is scored by its best member: 4 (unlisted) rides in on 7's score, 7 with it
    g.set_aliases([-1, -1, -1, -1, 0, -1, -1, 0])
    scores = [{2: 0.3, 5: 0.9, 7: 0.1}]
    r = g.expand([[0]], 1, scores=scores, threshold=0.5, min_keep=4)[0]
    assert r.nodes.tolist() == [0, 2, 4, 7, 5] and r.parent.tolist() == [-1, 0, 0, 4, 0]
    np.testing.assert_array_equal(r.score, np.array([-np.inf, 0.3, -np.inf, 0.1, 0.9], np.float32))
    scores = [{2: 0.3, 5: 0.9}]  # the unit {4, 7} unscored: it stays out
    assert g.expand([[0]], 1, scores=scores, threshold=0.5, min_keep=4)[0].nodes.tolist() == [0, 2, 5]


@pytest.mark.parametrize("backend", BACKENDS)
def test_min_keep_top_up_never_admits_minus_inf_in_a_dense_matrix(backend):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    inf = np.inf
    s = np.array([[1.0, -inf, 0.2, -inf, -inf, 0.6, -inf, 0.8],
                  [-inf] * 8,
                  [1.0, 0.4, 0.2, -inf, 0.4, 0.6, -inf, 0.8]], np.float32)
    ex = g.expand([[0], [0], [0]], 2, scores=s, threshold=0.5, min_keep=4)
    assert ex[0].nodes.tolist() == [0, 2, 5]  # 5 passes, 2 tops up; the -inf ones stay out
    np.testing.assert_array_equal(ex[0].score, np.array([1.0, 0.2, 0.6], np.float32))
    assert ex[1].nodes.tolist() == [0]
    # three scored below the threshold fill the three places; 7 passes at hop 2
    assert ex[2].nodes.tolist() == [0, 1, 2, 4, 5, 7] and ex[2].hop.tolist() == [0, 1, 1, 1, 1, 2]
    # one place: 1 and 4 tie at 0.4, the lower id wins
    assert g.expand([[0]], 1, scores=s[2:], threshold=0.5, min_keep=2)[0].nodes.tolist() == [0, 1, 5]
    assert g.expand([[0]], 1, scores=s[:1], threshold=-inf, min_keep=6)[0].nodes.tolist() == [0, 2, 5]
    budget = g.expand([[0]], 1, scores=s[:1], threshold=0.5, min_keep=4, budget=2)[0]
    assert budget.nodes.tolist() == [0, 5]  # the budget takes the best of the kept


@pytest.mark.parametrize("backend", BACKENDS)
def test_kind_document_masks_and_budget(backend):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    assert g.expand([[0]], 2, node_kinds=[NodeKind.ENTITY])[0].nodes.tolist() == [0, 1, 2, 3, 4, 5, 6]
    assert g.expand([[0]], 2, docs=[[0]])[0].nodes.tolist() == [0, 1, 2, 3, 7]
    assert g.expand([[0]], 2, edge_kinds=[1])[0].nodes.tolist() == [0]  # every edge has kind 0
    assert g.expand([[0]], 2, budget=3)[0].nodes.tolist() == [0, 1, 2]
    assert g.expand([[1]], 1, direction="out")[0].nodes.tolist() == [1, 7]
    assert g.expand([[1]], 1, direction="in")[0].nodes.tolist() == [1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_alias_groups_merge_only_inside_the_allowed_documents(backend):
    # document 0: fuji -- shinkansen; document 1: fuji' -- lake; document 2: fuji'' -- temple
    names = ["Mount Fuji", "Shinkansen", "mount  fuji", "Lake Kawaguchi", "MOUNT FUJI.", "Temple"]
    g = KnowledgeGraph.from_arrays([NodeKind.ENTITY] * 6, [0, 0, 1, 1, 2, 2], [0, 2, 4], [1, 3, 5],
                                   node_names=names, backend=backend)
    assert g.set_aliases_from_names() == 1
    assert g.alias_of.tolist() == [0, -1, 0, -1, 0, -1]
    r = g.expand([[1]], 2, docs=[[0, 1]])[0]
    assert r.nodes.tolist() == [1, 0, 2, 3]  # fuji and fuji' act as one node; document 2 stays out
    assert r.parent.tolist() == [-1, 1, 0, 2] and r.parent_edge.tolist() == [-1, 0, -1, 1]
    assert r.hop.tolist() == [0, 1, 1, 2]
    r = g.expand([[1]], 2, docs=[[0, 1]], merge_aliases=False)[0]
    assert r.nodes.tolist() == [1, 0]
    assert normalize_name("  “Mount   FUJI”! ") == "mount fuji"


@NATIVE
def test_threads_and_concurrent_callers_agree():
    native, _ = both(4, n=2000, m=12000)
    rng = np.random.default_rng(5)
    seeds = [list(rng.integers(0, 2000, 10)) for _ in range(32)]
    scores = rng.random((32, 2000)).astype(np.float32)
    one = native.expand(seeds, 2, scores=scores, num_threads=1)
    many = native.expand(seeds, 2, scores=scores, num_threads=4)
    assert one.equals(many)
    results = []
    threads = [threading.Thread(target=lambda: results.append(native.expand(seeds, 2, scores=scores, num_threads=2)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(r.equals(one) for r in results)


@pytest.mark.parametrize("backend", BACKENDS)
def test_csr_inputs_and_incremental_growth(backend):
    g = KnowledgeGraph(backend=backend)
    assert g.add_nodes([2, 2, 3], [0, 0, 0]).tolist() == [0, 1, 2]
    assert g.add_edges([0], [1], kind=[4]).tolist() == [0]
    assert g.add_nodes([2], [1]).tolist() == [3]
    assert g.add_edges([1, 3], [3, 2]).tolist() == [1, 2]
    assert g.n_nodes == 4 and g.n_edges == 3 and g.edge_kind.tolist() == [4, 0, 0]
    ex = g.expand(Csr(np.array([0, 1, 2]), np.array([0, 2])), 3)
    assert ex[0].nodes.tolist() == [0, 1, 3, 2] and ex[1].nodes.tolist() == [2, 3, 1, 0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad,exc,needle", [
    (lambda g: g.add_edges([0], [99]), ValueError, "dst"),
    (lambda g: g.add_edges([-1], [0]), ValueError, "src"),
    (lambda g: g.add_edges([0, 1], [1]), ValueError, "dst"),
    (lambda g: g.add_edges([0.5], [1]), TypeError, "src"),
    (lambda g: g.add_edges([0], [1], kind=[64]), ValueError, "kind"),
    (lambda g: g.add_edges([0], [1], weight=[float("nan")]), ValueError, "weight"),
    (lambda g: g.add_nodes([2], [-1]), ValueError, "doc"),
    (lambda g: g.add_nodes([2, 2], [0]), ValueError, "kind"),
    (lambda g: g.expand([[99]], 1), ValueError, "seeds"),
    (lambda g: g.expand([[0]], -1), ValueError, "hops"),
    (lambda g: g.expand([[0]], 1, min_keep=-2), ValueError, "min_keep"),
    (lambda g: g.expand([[0]], 1, scores=np.zeros((2, 8), np.float32)), ValueError, "scores"),
    (lambda g: g.expand([[0]], 1, scores=np.full((1, 8), np.nan, np.float32)), ValueError, "NaN"),
    (lambda g: g.expand([[0]], 1, scores=[{1: float("nan")}]), ValueError, "NaN"),
    (lambda g: g.expand([[0]], 1, scores=[{99: 1.0}]), ValueError, "scores"),
    (lambda g: g.expand([[0]], 1, docs=[[0], [1]]), ValueError, "docs"),
    (lambda g: g.expand([[0]], 1, direction="up"), ValueError, "direction"),
    (lambda g: g.expand([[0]], 1, node_kinds=[70]), ValueError, "kinds"),
    (lambda g: g.expand("0", 1), TypeError, "seeds"),
    (lambda g: g.set_aliases([0] * 3), ValueError, "group_of"),
])
def test_bad_input_is_rejected_and_graph_unchanged(backend, bad, exc, needle):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    before = (g.edges(), g.node_kind, g.node_doc, g.edge_kind, g.alias_of)
    with pytest.raises(exc, match=needle):
        bad(g)
    after = (g.edges(), g.node_kind, g.node_doc, g.edge_kind, g.alias_of)
    for x, y in zip(before, after):
        if isinstance(x, tuple):
            assert all(np.array_equal(a, b) for a, b in zip(x, y))
        else:
            assert np.array_equal(x, y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_save_load_round_trip(tmp_path, backend):
    kind, doc, src, dst, ek = random_graph(6)
    names = [f"node {i}" for i in range(len(kind))]
    g = KnowledgeGraph.from_arrays(kind, doc, src, dst, edge_kind=ek, node_names=names,
                                   edge_weight=np.linspace(0, 1, len(src)), backend=backend)
    g.set_aliases(np.where(np.arange(len(kind)) % 7 == 0, np.arange(len(kind)) % 3, -1))
    g.save(tmp_path / "g")
    h = KnowledgeGraph.load(tmp_path / "g", backend=backend)
    for attr in ("node_kind", "node_doc", "node_weight", "edge_kind", "edge_weight", "alias_of"):
        assert np.array_equal(getattr(g, attr), getattr(h, attr)), attr
    assert all(np.array_equal(a, b) for a, b in zip(g.edges(), h.edges())) and h.node_names == names
    seeds = [[0, 3], [10]]
    assert g.expand(seeds, 2).equals(h.expand(seeds, 2))


@pytest.mark.parametrize("damage,needle", [("truncate", "truncated"), ("flip", "checksum"), ("manifest", "JSON"),
                                           ("out_of_range", "inconsistent")])
def test_damaged_graph_directory_fails_clearly(tmp_path, damage, needle):
    g = KnowledgeGraph.from_arrays(*star(), backend="reference")
    g.save(tmp_path / "g")
    f = tmp_path / "g" / "dst.bin"
    if damage == "truncate":
        f.write_bytes(f.read_bytes()[:-3])
    elif damage == "flip":
        data = bytearray(f.read_bytes())
        data[0] ^= 1
        f.write_bytes(bytes(data))
    elif damage == "manifest":
        (tmp_path / "g" / "manifest.json").write_text("{")
    else:  # a self-consistent file with an edge to a missing node
        import json
        from colgraph_engine import _atomic
        arr = np.fromfile(f, np.int64)
        arr[0] = 1000
        arr.tofile(f)
        m = json.loads((tmp_path / "g" / "manifest.json").read_text())
        m["files"]["dst.bin"]["sha256"] = _atomic.sha256_file(f)
        (tmp_path / "g" / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match=needle):
        KnowledgeGraph.load(tmp_path / "g")


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_igraph_round_trip(backend):
    ig = pytest.importorskip("igraph")
    kind, doc, src, dst, ek = random_graph(7)
    g = KnowledgeGraph.from_arrays(kind, doc, src, dst, edge_kind=ek, backend=backend)
    h = g.to_igraph()
    assert isinstance(h, ig.Graph) and h.is_directed() and h.vcount() == g.n_nodes and h.ecount() == g.n_edges
    back = KnowledgeGraph.from_igraph(h, backend=backend)
    assert all(np.array_equal(a, b) for a, b in zip(g.edges(), back.edges()))
    assert np.array_equal(back.node_kind, g.node_kind) and np.array_equal(back.edge_kind, g.edge_kind)
    # python-igraph's own neighbourhood agrees with an unfiltered expansion
    seeds = [3]
    want = set(h.neighborhood(seeds[0], order=2, mode="all"))
    assert set(g.expand([seeds], 2)[0].nodes.tolist()) == want


@NATIVE
def test_memory_per_edge_is_small():
    """igraph's indexed edge list is 32 bytes per edge (from, to, oi, ii: 64-bit), the edge kind
    1, the sequential copies of the longest adjacency lists at most 2 (their index included);
    weights cost nothing while all are 1. Node columns (os, is, kind, document, alias) are 25
    bytes per node."""
    kind, doc, src, dst, ek = random_graph(8, n=20000, m=100000)
    g = KnowledgeGraph.from_arrays(kind, doc, src, dst, edge_kind=ek, backend="native")
    copies = g._impl.adjacency_copies()
    assert 0 < copies["bytes"] <= 2 * g.n_edges
    assert 0 < copies["lists"] < g.n_nodes
    per_edge = (g.memory_bytes() - 25 * g.n_nodes - 64) / g.n_edges
    assert per_edge <= 35.0, per_edge


@NATIVE
@pytest.mark.parametrize("seed", [3, 4])
def test_copied_and_uncopied_lists_and_incremental_growth_equal_reference(seed):
    """A graph grown in three add_edges calls (igraph's own insertion path, which re-sorts its
    index) holds hubs whose lists are copied and nodes whose lists are not; with edge-kind
    masks (the parent edge is the lowest allowed id of a parallel run) and both directions the
    expansion still equals the reference."""
    kind, doc, src, dst, ek = random_graph(seed, n=400, m=3000)
    src = np.concatenate([src, src[:300]])  # many parallel edges, appended later with other ids
    dst = np.concatenate([dst, dst[:300]])
    ek = np.concatenate([ek, (ek[:300] + 1) % 4])
    native, ref = KnowledgeGraph(backend="native"), KnowledgeGraph(backend="reference")
    for g in (native, ref):
        g.add_nodes(kind, doc)
        for part in np.array_split(np.arange(src.size), 3):
            g.add_edges(src[part], dst[part], ek[part])
    copies = native._impl.adjacency_copies()
    assert 0 < copies["lists"] < native.n_nodes
    rng = np.random.default_rng(seed)
    seeds = [list(rng.integers(0, native.n_nodes, 4)) for _ in range(5)]
    scores = rng.random((5, native.n_nodes)).astype(np.float32)
    for kw in (dict(), dict(edge_kinds=[1, 3]), dict(direction="in", edge_kinds=[0, 2]), dict(direction="out")):
        for hops in (1, 2):
            a = native.expand(seeds, hops, scores=scores, threshold=0.5, min_keep=2, **kw)
            b = ref.expand(seeds, hops, scores=scores, threshold=0.5, min_keep=2, **kw)
            assert a.equals(b), (kw, hops)


@NATIVE
@pytest.mark.parametrize("budget", [0.0, 12.0])
def test_copy_budget_changes_memory_not_results(budget):
    """No copies, or a copy of every list of 8+ neighbours: memory moves, results do not, and
    the budget holds through later growth."""
    kind, doc, src, dst, ek = random_graph(5, n=400, m=3000)
    native = KnowledgeGraph.from_arrays(kind, doc, src[:2500], dst[:2500], edge_kind=ek[:2500], backend="native")
    ref = KnowledgeGraph.from_arrays(kind, doc, src[:2500], dst[:2500], edge_kind=ek[:2500], backend="reference")
    native.set_copy_budget(budget)
    ref.set_copy_budget(budget)
    for g in (native, ref):
        g.add_edges(src[2500:], dst[2500:], ek[2500:])
    copies = native._impl.adjacency_copies()
    degree = np.bincount(src, minlength=400) + np.bincount(dst, minlength=400)
    if budget == 0:
        assert copies["lists"] == 0 and copies["ids"] == 0
    else:
        assert copies["lists"] == int((degree >= 8).sum()) and copies["ids"] == int(degree[degree >= 8].sum())
    assert copies["budget_bytes_per_edge"] == budget
    rng = np.random.default_rng(1)
    seeds = [list(rng.integers(0, 400, 3)) for _ in range(4)]
    scores = rng.random((4, 400)).astype(np.float32)
    for kw in (dict(), dict(edge_kinds=[0, 1], node_kinds=[1, 2, 3, 4]), dict(direction="out")):
        for hops in (1, 2, 3):
            a = native.expand(seeds, hops, scores=scores, threshold=0.4, min_keep=2, **kw)
            assert a.equals(ref.expand(seeds, hops, scores=scores, threshold=0.4, min_keep=2, **kw)), (kw, hops)
    with_budget = native.memory_bytes()
    native.set_copy_budget(2.0)
    assert (with_budget < native.memory_bytes()) if budget == 0 else (with_budget > native.memory_bytes())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad,exc", [(-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                     ("2", TypeError), (True, TypeError)])
def test_copy_budget_rejects_bad_values(backend, bad, exc):
    g = KnowledgeGraph.from_arrays(*star(), backend=backend)
    before = g.memory_bytes()
    with pytest.raises(exc, match="bytes_per_edge"):
        g.set_copy_budget(bad)
    assert g.memory_bytes() == before


@pytest.mark.parametrize("backend", BACKENDS)
def test_plain_edge_list_round_trip(backend):
    g = KnowledgeGraph.from_arrays(*star(), edge_kind=[0, 1, 2, 3, 0, 1, 2], edge_weight=[0.5] * 7, backend=backend)
    rows = g.to_edge_list()
    assert rows[0] == (0, 1, 0, 0.5) and len(rows) == 7
    back = KnowledgeGraph.from_edge_list(rows, g.n_nodes, node_kind=g.node_kind, node_doc=g.node_doc, backend=backend)
    assert back.to_edge_list() == rows and np.array_equal(back.node_doc, g.node_doc)
    assert KnowledgeGraph.from_edge_list([(0, 3), (3, 1)], backend=backend).n_nodes == 4
    with pytest.raises(ValueError, match="edges"):
        KnowledgeGraph.from_edge_list([(0, 1), (1, 2, 3)], backend=backend)


@NATIVE
@pytest.mark.parametrize("incremental", [False, True])
def test_igraph_functions_work_on_the_stored_graph(incremental):
    """The bulk loader writes igraph's indexed edge list directly; igraph's own neighbour query
    must see exactly the edges given (and the same after incremental igraph_add_edges)."""
    kind, doc, src, dst, ek = random_graph(9)
    g = KnowledgeGraph(backend="native")
    g.add_nodes(kind, doc)
    if incremental:
        g.add_edges(src[:100], dst[:100])
        g.add_edges(src[100:], dst[100:])
    else:
        g.add_edges(src, dst)
    core = g._impl
    for v in range(0, g.n_nodes, 7):
        assert core.igraph_neighbors(v, 1).tolist() == sorted(dst[src == v].tolist())
        assert core.igraph_neighbors(v, 2).tolist() == sorted(src[dst == v].tolist())
        assert core.igraph_neighbors(v, 0).tolist() == sorted(dst[src == v].tolist() + src[dst == v].tolist())


@pytest.mark.parametrize("backend", BACKENDS)
def test_induced_edges_of_a_hub_and_with_edges_off(backend):
    leaves = 1000
    src = [0] * leaves + [0, 0, 5]  # hub 0 -> every leaf, two more parallel edges 0 -> 1, and 5 -> 0
    dst = list(range(1, leaves + 1)) + [1, 1, 0]
    g = KnowledgeGraph.from_arrays([2] * (leaves + 1), [0] * (leaves + 1), src, dst, backend=backend)
    r = g.expand([[0, 1, 5]], 0)[0]
    assert r.edges.tolist() == [0, 4, leaves, leaves + 1, leaves + 2]
    assert g.expand([[0, 1, 5]], 0, with_edges=False)[0].edges.size == 0


def test_plain_kind_namespaces_hold_every_kind_as_an_exact_int():
    from colgraph_engine.graph.kinds import EDGE, NODE, EdgeKind, NodeKind
    for plain, enum_type in ((NODE, NodeKind), (EDGE, EdgeKind)):
        assert vars(plain) == {m.name: m.value for m in enum_type}
        assert all(type(v) is int for v in vars(plain).values())  # exact ints: numpy's fast comparison path
    kinds = np.array([0, 2, 2, 5], np.int8)
    assert np.array_equal(kinds == NODE.ENTITY, kinds == NodeKind.ENTITY)
    with pytest.raises(AttributeError, match="constants"):
        NODE.ENTITY = 7
