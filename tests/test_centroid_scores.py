"""The adaptive search's centroid scores ``S = Q C^T`` in the native kernel
(csrc/query_centroid_scores.cpp): the same bits on every kernel and thread count, float32
products within rounding of a float64 reference and of torch's matmul (the fallback), the
blocked layout it reads, the same recalled documents either way, and clear errors for bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from colgraph_engine import _native
from colgraph_engine.prefilter import PrefilterIndex, adaptive
from tests.conftest import recall_benchmark

NATIVE = getattr(_native.core, "query_centroid_scores", None)
needs_native = pytest.mark.skipif(NATIVE is None, reason=f"native module without query_centroid_scores "
                                                          f"({_native.reason_unavailable})")


def _isas() -> list[str]:
    got = []
    for isa in ("auto", "avx512", "scalar"):
        try:
            NATIVE(np.zeros((1, 2), np.float32), np.zeros((1, 2, 16), np.float32), 1, isa=isa)
        except ValueError:  # this CPU lacks it
            continue
        got.append(isa)
    return got


def _reference(q: np.ndarray, c: np.ndarray) -> np.ndarray:
    return q.astype(np.float64) @ c.T.astype(np.float64)


@needs_native
@pytest.mark.parametrize("tokens, n_centroids, dim", [(1, 1, 1), (10, 16384, 128), (12, 17, 64), (13, 33, 64),
                                                      (25, 100, 384), (640, 300, 128), (0, 40, 8)])
def test_every_kernel_and_thread_count_gives_the_same_bits_within_float32_rounding(tokens, n_centroids, dim):
    rng = np.random.default_rng(tokens + n_centroids)
    q = rng.standard_normal((tokens, dim)).astype(np.float32)
    c = rng.standard_normal((n_centroids, dim)).astype(np.float32)
    blocks = adaptive.centroid_blocks(c)
    one = NATIVE(q, blocks, n_centroids, num_threads=1)
    assert one.shape == (tokens, n_centroids) and one.dtype == np.float32
    for isa in _isas():
        for threads in (1, 2, 5):
            assert np.array_equal(NATIVE(q, blocks, n_centroids, isa=isa, num_threads=threads), one), (isa, threads)
    # a float32 FMA chain over d terms: error within d * eps * sum |q_k c_k| of the exact dot
    bound = dim * np.finfo(np.float32).eps * (np.abs(q).astype(np.float64) @ np.abs(c).T.astype(np.float64))
    assert (np.abs(one - _reference(q, c)) <= bound + 1e-30).all()


def test_centroid_blocks_hold_sixteen_centroids_transposed_and_zero_past_the_end():
    c = np.arange(35 * 3, dtype=np.float32).reshape(35, 3)
    b = adaptive.centroid_blocks(c)
    assert b.shape == (3, 3, 16) and b.flags.c_contiguous
    for j in range(35):
        assert np.array_equal(b[j // 16, :, j % 16], c[j])
    assert not b[2, :, 3:].any()  # centroids 35 .. 47 do not exist


@needs_native
def test_centroid_scores_native_and_torch_fallback_agree():
    rng = np.random.default_rng(3)
    c = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((1000, 64)).astype(np.float32)), dim=1)
    q = torch.nn.functional.normalize(torch.from_numpy(rng.standard_normal((9, 64)).astype(np.float32)), dim=1)
    host = adaptive._Host.__new__(adaptive._Host)
    host.centroids, host.blocks = c, adaptive.centroid_blocks(c.numpy())
    native = adaptive.centroid_scores(host, q)
    host.blocks = None  # what a build without the kernel runs
    fallback = adaptive.centroid_scores(host, q)
    np.testing.assert_allclose(native, fallback, rtol=0, atol=1e-5)  # unit vectors: |S| <= 1


@needs_native
def test_search_recalls_the_same_documents_with_either_centroid_scores(monkeypatch):
    corpus = recall_benchmark().topic_corpus(400, n_topics=25, dim=64, unit_tokens=(12, 30), n_queries=16, seed=9)
    idx = PrefilterIndex.build(corpus.values, corpus.offsets, nbits=2)

    def rescore(qv, qo, pair_q, ids):
        from colgraph_engine import ops
        co = torch.zeros(qo.numel(), dtype=torch.int64)
        torch.cumsum(torch.bincount(pair_q, minlength=qo.numel() - 1), 0, out=co[1:])
        return ops.maxsim_candidates(qv, qo, corpus.values, corpus.offsets, co, ids, assume_finite=True)

    def top_docs(res):
        out = []
        for q in range(res.offsets.size - 1):
            ids, s = res.ids[res.offsets[q]:res.offsets[q + 1]], res.scores[res.offsets[q]:res.offsets[q + 1]]
            docs = corpus.unit_doc[ids]
            best = {}
            for d, v in zip(docs.tolist(), s.tolist()):
                best[d] = max(best.get(d, -np.inf), v)
            out.append(sorted(best, key=lambda d: (-best[d], d))[:10])
        return out

    native = idx.search_adaptive(corpus.queries, corpus.q_offsets, 10, groups=corpus.unit_doc, rescore=rescore)
    assert adaptive._host(idx._state).blocks is not None
    monkeypatch.setattr(adaptive, "_NATIVE_S", None)
    object.__delattr__(idx._state, "_adaptive_host")  # the host made again, without the native blocks
    fallback = idx.search_adaptive(corpus.queries, corpus.q_offsets, 10, groups=corpus.unit_doc, rescore=rescore)
    assert adaptive._host(idx._state).blocks is None  # torch's matmul ran
    assert top_docs(native) == top_docs(fallback)


@needs_native
def test_bad_input_is_refused_with_the_argument_named():
    q, blocks = np.zeros((2, 8), np.float32), np.zeros((2, 8, 16), np.float32)
    assert NATIVE(q, blocks, 17).shape == (2, 17)
    with pytest.raises(ValueError, match="n_centroids"):
        NATIVE(q, blocks, 33)           # 33 centroids need 3 blocks
    with pytest.raises(ValueError, match="n_centroids"):
        NATIVE(q, blocks, 16)           # 16 fill one block, not two
    with pytest.raises(ValueError, match="blocks"):
        NATIVE(q, np.zeros((2, 4, 16), np.float32), 17)   # the queries' dimension is 8
    with pytest.raises(ValueError, match="blocks"):
        NATIVE(q, np.zeros((2, 8, 8), np.float32), 17)
    with pytest.raises(ValueError, match="q"):
        NATIVE(np.zeros(8, np.float32), blocks, 17)
    with pytest.raises(ValueError, match="num_threads"):
        NATIVE(q, blocks, 17, num_threads=0)
    with pytest.raises(ValueError, match="isa"):
        NATIVE(q, blocks, 17, isa="sse")
