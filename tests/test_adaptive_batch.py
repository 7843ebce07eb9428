"""The adaptive budget over a batch: queries advance in lockstep and share exact-stage calls,
yet each query's result is bit-identical to searching it alone; the native full centroid
scores give the numpy fallback's bits, and refuse out-of-range input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from colgraph_engine import _native, ops
from colgraph_engine.prefilter import PrefilterIndex, adaptive
from tests.conftest import recall_benchmark

NATIVE = getattr(_native.core, "full_centroid_scores", None)


@pytest.fixture(scope="module")
def corpus():
    c = recall_benchmark().topic_corpus(500, n_topics=30, dim=64, unit_tokens=(12, 30), n_queries=24, seed=5)
    return c, PrefilterIndex.build(c.values, c.offsets, nbits=2)


def _store_rescore(c, calls: list):
    def rescore(qv, qo, pair_q, ids):  # exact MaxSim on the corpus's own vectors, pairs sorted by query
        calls.append(int(ids.numel()))
        co = torch.zeros(qo.numel(), dtype=torch.int64)
        torch.cumsum(torch.bincount(pair_q, minlength=qo.numel() - 1), 0, out=co[1:])
        return ops.maxsim_candidates(qv, qo, c.values, c.offsets, co, ids, assume_finite=True)
    return rescore


@pytest.mark.parametrize("exhaustive", [False, True])
def test_a_batch_scores_what_each_query_scores_alone_in_fewer_exact_calls(corpus, exhaustive, monkeypatch):
    c, idx = corpus
    monkeypatch.setattr(adaptive, "PARALLEL_MIN_QUERIES", 10**9)  # one lockstep group (the call count below)
    k = 10 if not exhaustive else 501  # more groups than there are: every query scores every item
    batch_calls, single_calls = [], []
    batch = idx.search_adaptive(c.queries, c.q_offsets, k, groups=c.unit_doc, rescore=_store_rescore(c, batch_calls))
    nq = c.q_offsets.numel() - 1
    for q in range(nq):
        a, b = int(c.q_offsets[q]), int(c.q_offsets[q + 1])
        one = idx.search_adaptive(c.queries[a:b], torch.tensor([0, b - a]), k, groups=c.unit_doc,
                                  rescore=_store_rescore(c, single_calls))
        lo, hi = batch.offsets[q], batch.offsets[q + 1]
        assert np.array_equal(batch.ids[lo:hi], one.ids) and np.array_equal(batch.scores[lo:hi], one.scores)
        for key in ("candidates", "scored_exactly", "ncells", "rounds", "stop", "exhaustive"):
            assert batch.stats[key][q] == one.stats[key][0], key
    assert all(batch.stats["exhaustive"]) == exhaustive
    assert sum(batch_calls) == sum(single_calls)          # the same pairs scored
    assert len(batch_calls) <= max(batch.stats["rounds"]) + 2 < len(single_calls)


def test_a_batch_splits_its_exact_calls_at_the_pair_limit(corpus, monkeypatch):
    c, idx = corpus
    want = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    monkeypatch.setattr(adaptive, "PAIRS_PER_CALL", 50)
    calls: list[int] = []
    got = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, calls))
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)
    # whole queries per call: a call holds more than the limit only when one query asks for more alone
    assert max(calls) > 50 and len(calls) > max(got.stats["rounds"]) + 2


def _isas() -> list[str]:
    """The kernels of full_centroid_scores this CPU can run (each must give numpy's bits)."""
    if NATIVE is None:
        return []
    got = []
    for isa in ("auto", "avx512", "avx2", "scalar"):
        try:
            NATIVE(np.zeros((1, 1), np.float32), np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64),
                   isa=isa)
        except ValueError:  # this CPU lacks it
            continue
        got.append(isa)
    return got


@pytest.mark.skipif(NATIVE is None, reason=f"native module without full_centroid_scores ({_native.reason_unavailable})")
@pytest.mark.parametrize("cell_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("tokens", [0, 1, 7, 8, 9, 14, 16, 17, 32, 33, 48, 63, 64, 65, 127, 128, 129, 300])
def test_native_full_centroid_scores_give_numpy_s_bits(tokens, cell_dtype):
    rng = np.random.default_rng(tokens)
    n_cells, n_items = 300, 800
    lens = rng.integers(0, 12, n_items)  # some items without cells: -inf
    cells_offsets = np.zeros(n_items + 1, np.int64)
    np.cumsum(lens, out=cells_offsets[1:])
    host = adaptive._Host.__new__(adaptive._Host)
    host.cells_offsets, host.cells = cells_offsets, rng.integers(0, n_cells, int(cells_offsets[-1])).astype(cell_dtype)
    st = rng.standard_normal((n_cells, tokens)).astype(np.float32)
    pos = rng.permutation(n_items)[:500].astype(np.int64)
    want = adaptive.full_scores_numpy(host, st, pos)
    got = adaptive.full_scores(host, st, pos)
    assert got.dtype == np.float32 and np.array_equal(got, want)  # -inf where an item has no cells
    assert np.isneginf(got[lens[pos] == 0]).all()
    for isa in _isas():  # every kernel the CPU has (AVX-512, AVX2, scalar) gives the same bits
        assert np.array_equal(NATIVE(st, cells_offsets, host.cells, pos, isa=isa), want), isa


@pytest.mark.skipif(NATIVE is None, reason="native module without full_centroid_scores")
@pytest.mark.parametrize("threads", [2, 3, 8])
def test_native_full_centroid_scores_same_bits_on_any_thread_count(threads):
    rng = np.random.default_rng(threads)
    n_cells, n_items, tokens = 500, 5000, 11           # several 1,024-item tasks per thread
    lens = rng.integers(0, 40, n_items)
    lens[-1] = 5                                       # the item the bad cell goes to has cells
    cells_offsets = np.zeros(n_items + 1, np.int64)
    np.cumsum(lens, out=cells_offsets[1:])
    cells = rng.integers(0, n_cells, int(cells_offsets[-1])).astype(np.int32)
    st = rng.standard_normal((n_cells, tokens)).astype(np.float32)
    pos = np.r_[rng.permutation(n_items - 1), n_items - 1].astype(np.int64)
    one = NATIVE(st, cells_offsets, cells, pos, num_threads=1)
    assert np.array_equal(NATIVE(st, cells_offsets, cells, pos, num_threads=threads), one)
    # a bad cell in the last task is still found, whichever thread reaches it
    bad = cells.copy()
    bad[cells_offsets[pos[-1]]:cells_offsets[pos[-1] + 1]] = n_cells
    with pytest.raises(ValueError, match="cells: centroid out of range"):
        NATIVE(st, cells_offsets, bad, pos, num_threads=threads)
    with pytest.raises(ValueError, match="num_threads"):
        NATIVE(st, cells_offsets, cells, pos, num_threads=0)


@pytest.mark.skipif(NATIVE is None, reason="native module without full_centroid_scores")
def test_native_full_centroid_scores_refuse_out_of_range_input():
    st = np.zeros((4, 3), np.float32)
    offsets, cells = np.array([0, 2, 3], np.int64), np.array([0, 3, 1], np.int64)
    with pytest.raises(ValueError, match="positions"):
        NATIVE(st, offsets, cells, np.array([2], np.int64))
    with pytest.raises(ValueError, match="cells"):
        NATIVE(st, offsets, np.array([0, 4, 1], np.int64), np.array([0], np.int64))
    with pytest.raises(ValueError, match="cells_offsets"):
        NATIVE(st, np.array([0, 5, 3], np.int64), cells, np.array([0], np.int64))
    with pytest.raises(ValueError, match="st"):
        NATIVE(np.zeros(4, np.float32), offsets, cells, np.array([0], np.int64))
    assert NATIVE(st, offsets, cells, np.zeros(0, np.int64)).shape == (0,)
    for isa in _isas():  # the vector kernels check each cell before they read its row
        with pytest.raises(ValueError, match="cells"):
            NATIVE(st, offsets, np.array([0, 4, 1], np.int32), np.array([0], np.int64), isa=isa)
        with pytest.raises(ValueError, match="cells"):
            NATIVE(st, offsets, np.array([0, -1, 1], np.int32), np.array([0], np.int64), isa=isa)
    with pytest.raises(ValueError, match="isa"):
        NATIVE(st, offsets, cells, np.array([0], np.int64), isa="sse9")


def test_the_unreached_bound_holds_for_every_item_the_probes_miss(corpus):
    """The deepening stops only when U_n = Σ_i S[i, order[i, n]] is below s_k - m: check U_n
    really bounds F of each item none of whose centroids is among any token's n best."""
    c, idx = corpus
    h = adaptive._host(idx._state)
    for q in range(c.q_offsets.numel() - 1):
        a, b = int(c.q_offsets[q]), int(c.q_offsets[q + 1])
        s = (c.queries[a:b].float() @ h.centroids.T).numpy()
        order = np.argsort(-s, axis=1, kind="stable")
        st = np.ascontiguousarray(s.T)
        F = adaptive.full_scores_numpy(h, st, h.live)
        checked = 0
        for n in (1, 2, 4, 8, 16):
            reached = np.zeros(s.shape[1], bool)
            reached[order[:, :n].reshape(-1)] = True
            hit = np.array([reached[h.cells[h.cells_offsets[p]:h.cells_offsets[p + 1]]].any() for p in h.live])
            bound = adaptive._unreached_bound(s, order, n)
            if (~hit).any():
                assert F[~hit].max() <= bound + 1e-5
                checked += 1
            # and never above what an item matching every token's best centroid would score
            assert bound <= float(s.max(1).sum()) + 1e-5
        assert checked  # some items stay unreached at the shallow depths
    assert adaptive._unreached_bound(s, order, s.shape[1]) == float("-inf")


def test_the_probed_bound_holds_for_any_probed_set_and_is_tighter_than_uniform(corpus):
    """The stop check counts each token from its first centroid not probed by any token: check
    it bounds F of every item with no probed centroid, on random probed sets, and never exceeds
    the uniform-depth bound it refines."""
    c, idx = corpus
    h = adaptive._host(idx._state)
    rng = np.random.default_rng(3)
    for q in range(0, c.q_offsets.numel() - 1, 4):
        a, b = int(c.q_offsets[q]), int(c.q_offsets[q + 1])
        s = (c.queries[a:b].float() @ h.centroids.T).numpy()
        order = np.argsort(-s, axis=1, kind="stable")
        F = adaptive.full_scores_numpy(h, np.ascontiguousarray(s.T), h.live)
        for n in (1, 3, 6):
            probed = np.zeros(s.shape[1], bool)
            probed[order[:, :n].reshape(-1)] = True
            probed[rng.choice(s.shape[1], 8, replace=False)] = True  # cells other tokens probed
            hit = np.array([probed[h.cells[h.cells_offsets[p]:h.cells_offsets[p + 1]]].any() for p in h.live])
            bound = adaptive._probed_bound(s, order, probed)
            assert bound <= adaptive._unreached_bound(s, order, n) + 1e-6
            if (~hit).any():
                assert F[~hit].max() <= bound + 1e-5
    assert adaptive._probed_bound(s, order, np.ones(s.shape[1], bool)) == float("-inf")


def test_the_next_depth_is_the_first_whose_bound_is_below_the_target(corpus):
    c, idx = corpus
    h = adaptive._host(idx._state)
    a, b = int(c.q_offsets[0]), int(c.q_offsets[1])
    s = (c.queries[a:b].float() @ h.centroids.T).numpy()
    order = np.argsort(-s, axis=1, kind="stable")
    u = [adaptive._unreached_bound(s, order, n) for n in range(65)]
    for n in (1, 2, 5):
        for target in (u[n] - 1e-3, u[n + 3] + 1e-6, u[40] + 1e-6, float("-inf")):
            got = adaptive._next_depth(s, order, n, target, 64)
            if got:
                assert n < got <= 64 and u[got] < target and all(u[j] >= target for j in range(n + 1, got))
            else:  # no depth meets the target: the caller doubles
                assert all(u[j] >= target for j in range(n + 1, 65))
        assert adaptive._next_depth(s, order, n, float("-inf"), 64) == 0
    assert adaptive._next_depth(s, order, 64, 0.0, 64) == 64


@pytest.mark.parametrize("share", [0.0, 1.0])  # 0: every union by the byte mask; 1: every union by the sort
def test_list_unions_by_mask_and_by_sort_agree(corpus, monkeypatch, share):
    """The inverted-list union marks a byte per position above MASK_MIN_SHARE and sorts below it:
    both give the live positions ascending, less the excluded positions, and so the same search."""
    c, idx = corpus
    h = adaptive._Host(idx.snapshot())  # a host of its own (the search's is cached per state)
    rng = np.random.default_rng(0)
    h.alive[rng.choice(h.alive.size, h.alive.size // 10, replace=False)] = False  # some dead positions
    exclude = rng.random(h.alive.size) < 0.3
    monkeypatch.setattr(adaptive, "MASK_MIN_SHARE", share)
    n_cells = int(h.ivf_offsets.size - 1)
    for cells in (np.arange(0), np.arange(min(3, n_cells)), rng.choice(n_cells, n_cells // 2, replace=False)):
        rows, _ = adaptive._csr_rows(h.ivf_offsets, np.sort(cells))
        want = np.unique(h.ivf_docs[rows])
        want = want[h.alive[want]]
        got = adaptive._listed(h, np.sort(cells))
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert np.array_equal(adaptive._listed(h, np.sort(cells), exclude=np.flatnonzero(exclude)), want[~exclude[want]])


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_the_search_is_the_same_whichever_way_lists_are_joined(corpus, monkeypatch, share):
    c, idx = corpus
    want = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    monkeypatch.setattr(adaptive, "MASK_MIN_SHARE", share)
    got = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    assert np.array_equal(got.ids, want.ids) and np.array_equal(got.scores, want.scores)
    assert got.stats["candidates"] == want.stats["candidates"]


@pytest.mark.parametrize("n", [1, 40, 4095, 4096, 5000, 27000])
@pytest.mark.parametrize("first", [1, 32, 850, 10 ** 6])
def test_first_and_sample_select_the_ranks_of_the_stable_descending_sort(n, first):
    rng = np.random.default_rng(n + first)
    F = rng.standard_normal(n).astype(np.float32)
    F[: n // 3] = np.round(F[: n // 3], 1)  # many ties: broken by position
    F[: max(1, n // 50)] = -np.inf          # items without cells
    if n > 10:
        F[5], F[6] = -0.0, 0.0              # equal, as in the sort
    by_f = np.argsort(-F, kind="stable")
    rest = by_f[first:]
    want = rest[np.unique(np.linspace(0, rest.size - 1, min(32, rest.size)).astype(np.int64))] if rest.size else rest
    best, spread = adaptive.first_and_sample(F, first, 32)
    assert np.array_equal(best, by_f[:first]) and np.array_equal(spread, want)


@pytest.mark.parametrize("n", [0, 1, 5, 600, 5000])
def test_kth_group_is_the_kth_best_of_each_groups_best_score(n):
    rng = np.random.default_rng(n)
    for _ in range(10):
        groups = rng.integers(0, max(1, n // 3), n).astype(np.int64)
        scores = rng.standard_normal(n).astype(np.float32)
        scores[: n // 10] = -np.inf
        best = {}
        for g, s in zip(groups.tolist(), scores.tolist()):
            best[g] = max(best.get(g, -np.inf), s)
        ranked = sorted(best.values(), reverse=True)
        for k in (1, 10, 10 ** 6):
            want = (float(ranked[k - 1]) if len(ranked) >= k else float("-inf"), len(ranked))
            assert adaptive._kth_group(groups, scores, k) == want


def test_a_batch_too_large_for_one_group_of_centroid_scores_is_searched_in_groups(corpus, monkeypatch):
    c, idx = corpus
    want = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    n_centroids = int(idx._state.centroids.shape[0])
    monkeypatch.setattr(adaptive, "MAX_S_BYTES", 4 * n_centroids * 40)  # ~40 tokens a group: several groups
    groups_seen = []
    inner = adaptive.search_group
    monkeypatch.setattr(adaptive, "search_group", lambda *a, **kw: groups_seen.append(1) or inner(*a, **kw))
    got = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    assert len(groups_seen) > 2
    assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.scores, want.scores)
    for key in ("candidates", "scored_exactly", "ncells", "rounds", "stop", "exhaustive"):
        assert got.stats[key] == want.stats[key], key


def test_a_batch_searched_as_two_groups_on_two_threads_gives_the_same_results(corpus, monkeypatch):
    """From PARALLEL_MIN_QUERIES queries and two native threads a batch is split in halves searched
    on two threads, each capped at one native thread: every query's items, scores and counts
    are those of one lockstep group, and the exact stage sees each half's pairs."""
    c, idx = corpus
    monkeypatch.setenv("COLGRAPH_NUM_THREADS", "2")
    monkeypatch.setattr(adaptive, "PARALLEL_MIN_QUERIES", 10**9)
    want = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=_store_rescore(c, []))
    monkeypatch.setattr(adaptive, "PARALLEL_MIN_QUERIES", 8)
    import threading
    from colgraph_engine.ops import _native_impl
    seen = set()  # (thread, native threads) of every exact call
    inner = _store_rescore(c, [])

    def rescore(*a):
        seen.add((threading.get_ident(), _native_impl.num_threads()))
        return inner(*a)
    got = idx.search_adaptive(c.queries, c.q_offsets, 10, groups=c.unit_doc, rescore=rescore)
    # the halves ran on the pool's threads (one or two of them: a pool may reuse a thread that is
    # already idle), each exact call under the cap of one native thread
    assert threading.get_ident() not in {t for t, _ in seen} and {n for _, n in seen} == {1}
    assert _native_impl.num_threads() == 2  # the cap ends with the search
    assert np.array_equal(got.offsets, want.offsets) and np.array_equal(got.ids, want.ids)
    assert np.array_equal(got.scores, want.scores)
    for key in ("candidates", "scored_exactly", "ncells", "rounds", "stop", "exhaustive"):
        assert got.stats[key] == want.stats[key], key
