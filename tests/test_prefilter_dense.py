"""The dense execution of stages 2-4 (index/dense.py) returns what the sparse stages return:
same ids, scores and per-query counts, on clustered data where shortlists are full, on tiny
corpora where every candidate survives, with deletions, ties and a query that probes nothing
alive; and it is never used for restricted search."""
import pytest
import torch
import torch.nn.functional as F

from colgraph_engine.prefilter import PrefilterIndex
from colgraph_engine.prefilter import dense as dense_mod


def _clustered(n_docs, length, d=32, topics=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    cents = F.normalize(torch.randn(topics, d, generator=g), dim=-1)
    docs, mix = [], torch.randint(0, topics, (n_docs, 3), generator=g)
    for i in range(n_docs):
        n = int(torch.randint(1, length + 1, (1,), generator=g))
        pick = mix[i][torch.randint(0, 3, (n,), generator=g)]
        docs.append(F.normalize(cents[pick] + 0.2 * torch.randn(n, d, generator=g), dim=-1))
    qs = [F.normalize(cents[mix[j % n_docs]][torch.randint(0, 3, (l,), generator=g)] + 0.3 * torch.randn(l, d, generator=g),
                      dim=-1) for j, l in enumerate([1, 7, 16, 5])]
    return docs, qs


def _same(a, b):
    assert torch.equal(a.ids, b.ids)
    assert torch.equal(a.scores, b.scores)
    for key in ("candidates", "shortlist", "scored_exactly"):
        assert a.stats[key] == b.stats[key], key


@pytest.mark.parametrize("nbits", [2, 4])
@pytest.mark.parametrize("k,ndocs", [(10, 256), (5, 16), (3, 4)])
def test_dense_equals_sparse(nbits, k, ndocs):
    docs, qs = _clustered(300, 24, seed=nbits + k)
    idx = PrefilterIndex.build(docs, nbits=nbits, n_centroids=32)
    for threshold in (0.5, 0.2, 0.95):  # 0.95: most candidates hold no kept centroid (-inf pruned scores)
        sparse = idx.search(qs, k=k, ndocs=ndocs, centroid_score_threshold=threshold, dense=False)
        dense = idx.search(qs, k=k, ndocs=ndocs, centroid_score_threshold=threshold, dense=True)
        assert dense.stats.get("dense") and not sparse.stats.get("dense")
        _same(dense, sparse)


def test_dense_equals_sparse_after_deletes_and_with_ties():
    docs, qs = _clustered(120, 10, seed=5)
    docs = docs + [docs[3].clone(), docs[3].clone()]            # exact duplicates: tied scores everywhere
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=16)
    idx.delete([7, 8, 9, 121])
    qs = qs[:2] + [torch.zeros(0, 32)] + qs[2:]                 # an empty query: nothing probed, padded row
    for ncells in (1, 3):
        _same(idx.search(qs, k=6, ncells=ncells, ndocs=8, dense=True),
              idx.search(qs, k=6, ncells=ncells, ndocs=8, dense=False))


def test_dense_pads_like_sparse_when_few_documents_reach_the_exact_stage():
    docs, qs = _clustered(12, 4, seed=2)
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=12)
    a = idx.search(qs, k=12, ncells=1, dense=True)
    b = idx.search(qs, k=12, ncells=1, dense=False)
    _same(a, b)
    assert (a.ids == -1).any()          # some query reached fewer than k documents: padded, not invented


def test_dense_is_chosen_only_for_few_queries_on_an_accelerator_and_never_for_restricted_search():
    docs, qs = _clustered(50, 8, seed=1)
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=8)
    s = idx.snapshot()
    assert not dense_mod.use_dense(s, 1, 32, torch.device("cpu"))
    assert dense_mod.use_dense(s, 1, 32, torch.device("cuda"))
    assert not dense_mod.use_dense(s, dense_mod.MAX_QUERIES + 1, 32, torch.device("cuda"))
    allowed = [list(range(0, 50, 2))] * len(qs)
    r = idx.search(qs, k=3, allowed=allowed, dense=True)
    assert not r.stats.get("dense")     # restricted search always runs the sparse stages
    with pytest.raises(TypeError, match="dense"):
        idx.search(qs, k=3, dense="yes")
    with pytest.raises(TypeError, match="assume_finite"):
        idx.search(qs, k=3, assume_finite=1)


from .conftest import TRITON, TRITON_DEVICE  # noqa: E402


@TRITON
def test_interaction_kernel_matches_the_torch_path():
    """The Triton centroid-interaction kernel (interpreter in CI) against the torch gather/scatter
    path: pruned and full scores to float rounding, hits exactly; documents without cells
    (empty, deleted-and-rebuilt) score -inf."""
    docs, qs = _clustered(40, 12, seed=3)
    docs = docs + [torch.zeros(0, 32)]
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=16, device=TRITON_DEVICE)
    s = idx.snapshot()
    q = qs[2].to(TRITON_DEVICE)
    S = q @ s.centroids.T                                                          # [L, C]
    for L in (q.shape[0], 20):                                                     # 20: padded zero rows
        st = torch.cat([S, S.new_zeros(L - S.shape[0], S.shape[1])]).T.contiguous()
        kept = S.max(0).values >= 0.6
        probed = torch.zeros(S.shape[1], dtype=torch.bool, device=S.device)
        probed[torch.topk(S, 1, dim=1).indices.reshape(-1)] = True
        a = dense_mod.interaction(s, st, kept, probed, kernel=True)
        b = dense_mod.interaction(s, st, kept, probed, kernel=False)
        for x, y in zip(a[:2], b[:2]):
            fin = torch.isfinite(y)
            assert torch.equal(torch.isfinite(x), fin)
            assert torch.allclose(x[fin], y[fin], atol=1e-5)
        assert torch.equal(a[2].bool(), b[2] > 0)
        assert not torch.isfinite(a[1][-1])                                        # the empty document


@TRITON
def test_search_with_the_interaction_kernel_equals_sparse():
    docs, qs = _clustered(200, 16, seed=4)
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=32, device=TRITON_DEVICE)
    a = idx.search(qs, k=5, ndocs=16, backend="triton", dense=True)
    b = idx.search(qs, k=5, ndocs=16, backend="triton", dense=False)
    assert a.stats.get("dense")
    assert torch.equal(a.ids.cpu(), b.ids.cpu())
    assert torch.allclose(a.scores.cpu(), b.scores.cpu(), atol=1e-5)
