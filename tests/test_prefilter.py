"""The prefilter's build and search stages against the slow references (colgraph_engine.prefilter.reference),
and recall against exact search on clustered synthetic data."""
import pytest
import torch

from colgraph_engine.prefilter import PrefilterIndex, Settings, codec, kmeans, reference, rescore, stages
from colgraph_engine.prefilter import search as psearch
from colgraph_engine.store import PackedStore
from colgraph_engine.synthetic import clustered_corpus, queries_for


@pytest.fixture(scope="module")
def corpus():
    cents, topics, docs = clustered_corpus(60, (0, 30), 16, n_topics=48, topics_per_doc=4, seed=3)
    targets, queries = queries_for(cents, topics, 6, 5, seed=4)
    return docs, queries


@pytest.fixture(scope="module")
def index(corpus):
    return PrefilterIndex.build(corpus[0], nbits=2, n_centroids=32, seed=1)


def test_default_centroid_count_is_plaids_rule():
    assert kmeans.default_centroid_count(1) == 16
    assert kmeans.default_centroid_count(10_000) == 1024        # 16 * 100 = 1600 -> 2^10
    assert kmeans.default_centroid_count(10_240_000) == 32768   # 16 * 3200 = 51200 -> 2^15
    with pytest.raises(ValueError, match="n_tokens"):
        kmeans.default_centroid_count(0)


@pytest.mark.parametrize("nbits", [1, 2, 4])
def test_codec_round_trip_and_buckets(nbits):
    g = torch.Generator().manual_seed(nbits)
    r = torch.randn(500, 16, generator=g) * 0.1
    cutoffs, weights = codec.fit_buckets(r, nbits)
    assert cutoffs.shape == ((1 << nbits) - 1,) and weights.shape == (1 << nbits,)
    assert bool((cutoffs.diff() > 0).all()) and bool((weights.diff() > 0).all())
    packed = codec.encode_residuals(r, cutoffs, nbits)
    assert packed.dtype == torch.uint8 and packed.shape == (500, 16 * nbits // 8)
    decoded = codec.decode_residuals(packed, codec.byte_table(weights, nbits))
    # each component decodes to the weight of its bucket, computed independently here
    bucket = (r[..., None] >= cutoffs).sum(-1)
    assert torch.equal(decoded, weights[bucket])
    # more bits, smaller error (quantisation works)
    assert float((decoded - r).pow(2).mean()) < float(r.pow(2).mean())


def test_bucket_fit_subsamples_large_inputs(monkeypatch):
    r = torch.randn(1000, 7, generator=torch.Generator().manual_seed(0))   # 7,000 values > the limit below
    monkeypatch.setattr(codec, "QUANTILE_LIMIT", 1024)
    cutoffs, weights = codec.fit_buckets(r, 2)
    assert torch.allclose(cutoffs, torch.quantile(r.reshape(-1), torch.tensor([0.25, 0.5, 0.75])), atol=0.15)
    assert bool((weights.diff() > 0).all())


def test_build_layout(index, corpus):
    s = index.snapshot()
    docs = corpus[0]
    assert s.n_centroids == 32 and s.codes.dtype == torch.int16 and s.residuals.shape == (s.n_tokens, 4)
    assert s.n_tokens == sum(d.shape[0] for d in docs)
    assert torch.allclose(s.centroids.norm(dim=1), torch.ones(32))
    # codes are the nearest centroids; lists agree with codes in both directions
    values = torch.cat(docs)
    assert torch.equal(s.codes.long(), (values @ s.centroids.T).argmax(1))
    for p in range(0, s.n_slots, 7):
        lo, hi = int(s.offsets[p]), int(s.offsets[p + 1])
        cells = s.cells[int(s.cells_offsets[p]):int(s.cells_offsets[p + 1])].tolist()
        assert cells == sorted(set(s.codes[lo:hi].tolist()))
        for c in cells:
            assert p in s.ivf_docs[int(s.ivf_offsets[c]):int(s.ivf_offsets[c + 1])].tolist()
    assert s.ivf_docs.numel() == s.cells.numel()
    bpt = index.bytes_per_token()
    assert bpt["codes_and_residuals"] == 2 + 4   # int16 code + 16 dims * 2 bits


def test_bytes_per_token_at_d128_2bits():
    docs = [torch.nn.functional.normalize(torch.randn(50, 128, generator=torch.Generator().manual_seed(i)), dim=-1)
            for i in range(8)]
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=16)
    assert idx.bytes_per_token()["codes_and_residuals"] == 34.0   # <= 36 (issue 13)


def _stage_inputs(index, queries):
    s = index.snapshot()
    qv = torch.cat(queries)
    qo = torch.tensor([0] + [q.shape[0] for q in queries]).cumsum(0)
    return s, qv, qo, stages.centroid_scores(s, qv)


@pytest.mark.parametrize("ncells", [1, 3])
def test_candidates_match_reference(index, corpus, ncells):
    s, qv, qo, S = _stage_inputs(index, corpus[1])
    pq, pd = stages.candidates(s, S, qo, ncells)
    for q, query in enumerate(corpus[1]):
        assert set(pd[pq == q].tolist()) == reference.candidates(s, query, ncells)


def test_centroid_scores_match_reference(index, corpus):
    s, qv, qo, S = _stage_inputs(index, corpus[1])
    pq, pd = stages.candidates(s, S, qo, 4)
    for thr in (0.3, 0.6, 2.0):
        every = slice(None) if thr == 0.3 else slice(None, None, 5)   # the reference is slow: a sample  # 2.0 prunes every centroid: all -inf
        pruned = stages.pruned_scores(s, S, qo, pq, pd, thr)
        want = torch.tensor([reference.centroid_score(s, corpus[1][q], p, thr)
                             for q, p in zip(pq[every].tolist(), pd[every].tolist())])
        assert torch.allclose(pruned[every], want, atol=1e-5), thr
    full = stages.full_scores(s, S, qo, pq, pd)
    want = torch.tensor([reference.centroid_score(s, corpus[1][q], p, None) for q, p in zip(pq.tolist(), pd.tolist())])
    assert torch.allclose(full, want, atol=1e-5)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_exact_stage_matches_reference(index, corpus, backend):
    s, qv, qo, S = _stage_inputs(index, corpus[1])
    pq = torch.arange(len(corpus[1])).repeat_interleave(s.n_slots)
    pd = torch.arange(s.n_slots).repeat(len(corpus[1]))                       # every pair, empty docs included
    got = rescore.exact_scores(s, qv, qo, S, pq, pd, backend)
    want = torch.tensor([reference.exact_score(s, corpus[1][q], p) for q, p in zip(pq.tolist(), pd.tolist())])
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite) and bool((~finite).any())   # empty documents: -inf
    assert torch.allclose(got[finite], want[finite].float(), atol=1e-4)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_exact_stage_on_non_unit_inputs_scores_decoded_vectors_as_they_are(corpus, backend):
    docs = [d * 2.0 for d in corpus[0]]                                         # norm 2: no normalisation
    idx = PrefilterIndex.build(docs, nbits=2, n_centroids=16, seed=1)
    s, qv, qo, S = _stage_inputs(idx, corpus[1])
    assert not s.unit
    pq = torch.arange(len(corpus[1])).repeat_interleave(s.n_slots)
    pd = torch.arange(s.n_slots).repeat(len(corpus[1]))
    got = rescore.exact_scores(s, qv, qo, S, pq, pd, backend)
    want = torch.tensor([reference.exact_score(s, corpus[1][q], p) for q, p in zip(pq.tolist(), pd.tolist())])
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite].float(), atol=1e-4)
    # the same codes scored as unit vectors give other scores: the flag is honoured
    assert not torch.allclose(got[finite], rescore.exact_scores(s.with_(unit=True), qv, qo, S, pq, pd,
                                                                backend)[finite], atol=1e-3)


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_exact_stage_in_blocks(index, corpus, monkeypatch, backend):
    s, qv, qo, S = _stage_inputs(index, corpus[1])
    pq = torch.arange(3).repeat_interleave(s.n_slots)
    pd = torch.arange(s.n_slots).repeat(3)
    whole = rescore.exact_scores(s, qv, qo, S, pq, pd, backend)
    monkeypatch.setattr(rescore, "BLOCK_TOKENS", 7)   # documents split across blocks / chunks
    assert torch.equal(rescore.exact_scores(s, qv, qo, S, pq, pd, backend), whole)


@pytest.mark.parametrize("k,ndocs", [(3, 8), (5, 200)])
def test_search_matches_reference(index, corpus, k, ndocs):
    s = index.snapshot()
    res = index.search(corpus[1], k=k, ncells=2, centroid_score_threshold=0.4, ndocs=ndocs, backend="torch")
    st = Settings.for_k(k, 2, 0.4, ndocs)
    for q, query in enumerate(corpus[1]):
        want = reference.search(s, query, k, 2, 0.4, ndocs, st.n_exact(k))
        got = [(int(i), float(v)) for i, v in zip(res.ids[q], res.scores[q]) if int(i) >= 0]
        assert len(got) == len(want)
        assert torch.allclose(torch.tensor([v for _, v in got]), torch.tensor([v for _, v in want]).float(), atol=1e-4)
        ties = {round(v, 4) for i, (_, v) in enumerate(want) if any(abs(v - w) < 1e-4 for j, (_, w) in enumerate(want) if j != i)}
        for (gid, _), (p, v) in zip(got, want):
            if round(v, 4) not in ties:
                assert gid == int(s.ids[p])
    assert len(res.stats["candidates"]) == len(corpus[1])


def test_plaid_defaults_by_k():
    assert Settings.for_k(10) == Settings(1, 0.5, 256)
    assert Settings.for_k(11) == Settings(2, 0.45, 1024)
    assert Settings.for_k(100) == Settings(2, 0.45, 1024)
    assert Settings.for_k(101) == Settings(4, 0.4, 4096)
    assert Settings.for_k(2000) == Settings(4, 0.4, 8000)
    assert Settings.for_k(10).n_exact(10) == 64 and Settings.for_k(10, ndocs=8).n_exact(10) == 10


def test_recall_against_exact_on_clustered_data():
    cents, topics, docs = clustered_corpus(300, 32, 64, n_topics=128, topics_per_doc=8, seed=5)
    targets, queries = queries_for(cents, topics, 40, 16, seed=6)
    store = PackedStore(64)
    store.add(docs)
    _, exact = store.search(queries, k=10)
    idx = PrefilterIndex.from_store(store, nbits=4, seed=0)
    res = idx.search(queries, k=10)
    recall = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(res.ids, exact)) / exact.numel()
    hit1 = float((res.ids[:, 0] == targets).float().mean())
    assert recall >= 0.9, recall
    assert hit1 >= 0.95, hit1
    assert res.path == "prefilter" and res.stats["backend"] == "native"
    # the exact stage on the store's original vectors: the scores are the store's own
    on_store = idx.search(queries, k=10, store=store)
    assert on_store.stats["backend"] == "store"
    co = torch.arange(len(queries) + 1) * 10
    want = store.score_candidates(queries, None, co, on_store.ids.reshape(-1)).view(len(queries), 10)
    assert torch.allclose(on_store.scores, want)


def test_full_scores_cpu_path_equals_the_generic_gather_bit_for_bit(index, corpus):
    """Stage 4 on the CPU (per query: one column gather and a reduceat) gives the generic
    path's float32 scores exactly: several queries, an empty query (padding tokens score 0),
    every document including those without tokens (no centroids: -inf)."""
    s, qv, qo, S = _stage_inputs(index, corpus[1])
    nq = qo.numel() - 1
    pq = torch.arange(nq).repeat_interleave(s.n_slots)
    pd = torch.arange(s.n_slots).repeat(nq)
    got, want = stages.full_scores(s, S, qo, pq, pd), stages._full_scores_generic(s, S, qo, pq, pd)
    assert got.dtype == want.dtype and torch.equal(got, want)
    no_cells = (s.cells_offsets.diff() == 0).nonzero().squeeze(1)
    assert no_cells.numel() > 0  # the corpus has documents without tokens
    assert torch.isinf(got.view(nq, -1)[:, no_cells]).all()
    # an empty query among others, and a subset of pairs
    qo2 = torch.cat([qo[:2], qo[1:2], qo[2:]])  # query 1 of the new layout has no tokens
    pq2 = torch.arange(nq + 1).repeat_interleave(s.n_slots)[::3]
    pd2 = torch.arange(s.n_slots).repeat(nq + 1)[::3]
    S2 = stages.centroid_scores(s, qv)
    got2, want2 = stages.full_scores(s, S2, qo2, pq2, pd2), stages._full_scores_generic(s, S2, qo2, pq2, pd2)
    assert torch.equal(got2, want2)
    assert (got2[(pq2 == 1) & torch.isfinite(got2)] == 0).all()
