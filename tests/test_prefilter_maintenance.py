"""Prefilter maintenance and contracts: add/delete consistency, save/load, drift and rebuild,
restricted search, auto mode, bad input (a failed call changes nothing)."""
import json

import pytest
import torch

from colgraph_engine.prefilter import AutoSearcher, PrefilterIndex, reference
from colgraph_engine.prefilter.persist import FormatError
from colgraph_engine.store import PackedStore
from colgraph_engine.synthetic import clustered_corpus, queries_for


@pytest.fixture(scope="module")
def data():
    cents, topics, docs = clustered_corpus(80, (4, 24), 32, n_topics=64, topics_per_doc=4, seed=11)
    targets, queries = queries_for(cents, topics, 8, 6, seed=12)
    return cents, topics, docs, targets, queries


def _index(docs, **kw):
    return PrefilterIndex.build(docs, ids=torch.arange(len(docs)) * 10 + 5, nbits=2, n_centroids=32, seed=0, **kw)


def _same(a, b):
    assert torch.equal(a.ids, b.ids)
    assert torch.equal(a.scores, b.scores)


def test_add_then_delete_restores_results(data):
    _, _, docs, _, queries = data
    idx = _index(docs[:60])
    before = idx.search(queries, k=5)
    new = idx.add(docs[60:], rebuild_drift=None)
    assert new.tolist() == list(range(80 * 0 + 5 + 59 * 10 + 1, 5 + 59 * 10 + 1 + 20))   # next free ids
    assert len(idx) == 80
    mid = idx.search(queries, k=5)
    assert idx.delete(new) == 20
    _same(idx.search(queries, k=5), before)
    # the added documents were searchable while present: one query per added doc finds it
    assert set(mid.ids.reshape(-1).tolist()) - set(before.ids.reshape(-1).tolist()) <= set(new.tolist())


def test_added_copy_scores_like_the_original(data):
    _, _, docs, _, queries = data
    idx = _index(docs[:40])
    (copy_id,) = idx.add([docs[3]], ids=[1000], rebuild_drift=None).tolist()
    res = idx.search([queries[0]], k=40, exact_allowed=True, allowed=[[15 + 10 * 0 + 20, copy_id]])
    s = dict(zip(res.ids[0].tolist(), res.scores[0].tolist()))
    assert s[copy_id] == pytest.approx(s[35], abs=1e-5)   # id 35 is position 3


def test_delete_keeps_ids_and_positions(data):
    _, _, docs, _, queries = data
    idx = _index(docs)
    full = idx.search(queries, k=10)
    gone = full.ids[:, 0].unique()
    idx.delete(gone)
    after = idx.search(queries, k=10)
    assert not set(after.ids.reshape(-1).tolist()) & set(gone.tolist())
    s = idx.snapshot()
    assert s.n_slots == 80 and torch.equal(s.ids, torch.arange(80) * 10 + 5)   # nothing renumbered
    with pytest.raises(ValueError, match="ids: id .* was deleted"):
        idx.delete(gone[:1])
    with pytest.raises(ValueError, match="not in the prefilter index"):
        idx.delete([7])
    with pytest.raises(ValueError, match="each id once"):
        idx.delete([15, 15])


def test_failed_add_leaves_index_unchanged(data):
    _, _, docs, _, _ = data
    idx = _index(docs[:20])
    before = idx.snapshot()
    bad = [docs[30].clone()]
    bad[0][0, 0] = float("nan")
    with pytest.raises(ValueError, match="documents"):
        idx.add(bad)
    with pytest.raises(ValueError, match="dimension d=32"):
        idx.add([torch.randn(3, 16)])
    with pytest.raises(ValueError, match="already in the index"):
        idx.add(docs[20:22], ids=[999, 15])
    with pytest.raises(ValueError, match="one per document"):
        idx.add(docs[20:22], ids=[999])
    assert idx.snapshot() is before


def test_save_load_identical_results(data, tmp_path):
    _, _, docs, _, queries = data
    idx = _index(docs)
    idx.add([docs[0] * -1.0], rebuild_drift=None)
    idx.delete([25])
    path = idx.save(tmp_path / "pf")
    back = PrefilterIndex.load(path)
    _same(back.search(queries, k=10), idx.search(queries, k=10))
    a, b = idx.snapshot(), back.snapshot()
    for name in ("centroids", "codes", "residuals", "offsets", "ids", "alive", "cells", "ivf_docs", "ivf_offsets"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert back.drift() == pytest.approx(idx.drift()) and back.snapshot().next_id == a.next_id
    # saving again over the same folder replaces it; a tampered file is refused
    idx.save(path)
    with open(path / "codes.bin", "r+b") as f:
        f.seek(0)
        f.write(b"\x7f\x7f")
    with pytest.raises(FormatError, match="checksum"):
        PrefilterIndex.load(path)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "keep.txt").write_text("x")
    with pytest.raises(ValueError, match="refusing to replace"):
        idx.save(tmp_path / "other")
    m = json.loads((path / "manifest.json").read_text())
    m["nbits"] = 3
    (path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="nbits"):
        PrefilterIndex.load(path)


def test_drift_measure_and_rebuild(data):
    queries = data[4]
    _, _, docs = clustered_corpus(80, (4, 24), 32, n_topics=16, topics_per_doc=4, seed=11)  # topics all seen by 60 docs
    idx = _index(docs[:60])
    assert idx.drift() == 1.0
    idx.add(docs[60:], rebuild_drift=None)     # same distribution
    same = idx.drift()
    assert 0.5 < same < 1.3, same
    g = torch.Generator().manual_seed(5)
    other = [torch.nn.functional.normalize(torch.randn(20, 32, generator=g), dim=-1) for _ in range(10)]
    before = idx.snapshot()
    idx.add(other, rebuild_drift=None)
    assert idx.drift() > 1.5 and idx.snapshot().centroids is before.centroids
    drifted = idx.drift()
    ids = idx.add(other[:2], rebuild_drift=1.2)   # passes the limit: centroids retrained over everything
    s = idx.snapshot()
    assert s.centroids is not before.centroids and s.added_tokens == 0 and idx.drift() == 1.0
    assert len(idx) == 92 and set(ids.tolist()) <= set(s.ids.tolist())
    assert drifted > same
    res = idx.search(queries, k=5)
    assert bool((res.ids >= 0).all())


def test_restricted_search(data):
    _, _, docs, targets, queries = data
    idx = _index(docs)
    s = idx.snapshot()
    g = torch.Generator().manual_seed(1)
    allowed = [sorted(set((torch.randperm(80, generator=g)[:30] * 10 + 5).tolist()) | {int(t) * 10 + 5})
               for t in targets]
    res = idx.search(queries, k=5, allowed=allowed, exact_allowed=False, ndocs=8)
    for q in range(len(queries)):
        got = [i for i in res.ids[q].tolist() if i >= 0]
        assert set(got) <= set(allowed[q])
        assert res.stats["allowed"][q] == len(allowed[q])
        assert res.stats["scored_exactly"][q] <= res.stats["shortlist"][q] <= res.stats["candidates"][q] <= 30 + 1
    # every allowed document scored exactly: equals the reference over the allowed set
    full = idx.search(queries, k=5, allowed=allowed, exact_allowed=True)
    for q, query in enumerate(queries):
        want = sorted((reference.exact_score(s, query, (i - 5) // 10), i) for i in allowed[q])[::-1][:5]
        assert torch.allclose(full.scores[q], torch.tensor([w for w, _ in want]).float(), atol=1e-4)
        assert full.stats["scored_exactly"][q] == len(allowed[q]) and full.stats["exact_all_allowed"][q]
    # default: a query allowing no more than the exact stage scores gets all of them exactly
    small = [[int(t) * 10 + 5, 15] for t in targets]
    res = idx.search(queries, k=2, allowed=small)
    assert res.stats["scored_exactly"] == [2] * len(queries)
    assert all(set(r) == set(a) for r, a in zip(res.ids.tolist(), small))
    with pytest.raises(ValueError, match=r"allowed\[0\]: id 6 is not in the prefilter index"):
        idx.search(queries, k=2, allowed=[[6]] + [[5]] * (len(queries) - 1))
    with pytest.raises(ValueError, match="one per query"):
        idx.search(queries, k=2, allowed=[[5]])


def test_bad_input():
    with pytest.raises(ValueError, match="empty"):
        PrefilterIndex.build([torch.zeros(0, 8), torch.zeros(0, 8)])
    with pytest.raises(ValueError, match="nbits"):
        PrefilterIndex.build([torch.randn(4, 8)], nbits=3)
    with pytest.raises(TypeError, match="nbits"):
        PrefilterIndex.build([torch.randn(4, 8)], nbits=2.0)
    with pytest.raises(ValueError, match="multiple of 4"):
        PrefilterIndex.build([torch.randn(4, 6)], nbits=2)
    idx = PrefilterIndex.build([torch.randn(4, 8), torch.randn(3, 8)], n_centroids=2)
    with pytest.raises(ValueError, match="k: expected at most the 2 live documents"):
        idx.search([torch.randn(2, 8)], k=3)
    with pytest.raises(ValueError, match="queries: expected dimension d=8"):
        idx.search([torch.randn(2, 16)], k=1)
    with pytest.raises(ValueError, match="ndocs"):
        idx.search([torch.randn(2, 8)], k=1, ndocs=0)
    with pytest.raises(ValueError, match="backend"):
        idx.search([torch.randn(2, 8)], k=1, backend="cuda")


def test_auto_mode_reports_the_path(data):
    _, _, docs, _, queries = data
    store = PackedStore(32)
    store.add(docs)
    idx = PrefilterIndex.from_store(store, nbits=2, n_centroids=32)
    auto = AutoSearcher(store, idx)
    res = auto.search(queries, k=5)                   # tiny corpus: brute force is less work
    assert res.path == "exact" and "exact work" in res.reason and "<=" in res.reason
    exact = store.search(queries, k=5)
    assert torch.equal(res.ids, exact[1])
    forced = auto.search(queries, k=5, mode="prefilter")
    assert forced.path == "prefilter" and forced.reason == "prefilter requested"
    est = auto.estimate(5, ndocs=4)
    assert est["prefilter"] < est["exact"] * 10
    # a store too large for brute force relative to the prefilter's work: the prefilter runs
    assert auto.choose(5, ndocs=4)[0] in ("exact", "prefilter")
    big = AutoSearcher(store, idx)
    big.estimate = lambda k, **kw: {"exact": 1e12, "prefilter": 1e6}
    assert big.search(queries, k=5).path == "prefilter"
    with pytest.raises(ValueError, match="mode"):
        auto.search(queries, k=5, mode="fast")
    restricted = auto.search(queries[:2], k=3, mode="exact", allowed=[[0, 1, 2, 3], [4, 5, 6]])
    assert restricted.stats["scored_exactly"] == [4, 3] and set(restricted.ids[1].tolist()) == {4, 5, 6}
