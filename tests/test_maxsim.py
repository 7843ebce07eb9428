"""MaxSim cross scores, candidate scores, top-k and the pooled baseline, on every backend,
against an fp64 reference with yardstick tolerances."""
import pytest
import torch

import colgraph_engine as cg
from colgraph_engine.ops import reference as ref

from .conftest import DTYPES, NATIVE, TRITON, TRITON_DEVICE, assert_scores_match, random_packed

BACKENDS = [
    pytest.param("native", "cpu", marks=NATIVE, id="native"),
    pytest.param("torch", "cpu", id="torch"),
    pytest.param("triton", TRITON_DEVICE, marks=TRITON, id="triton"),
]

# (query lengths, document lengths, d): odd shapes on purpose — 1-token items, empty items,
# d = 96, counts that are not multiples of any block size, a query longer than one tile.
CASES = {
    "odd": ([1, 5, 32, 33], [1, 0, 13, 30, 100, 7, 1], 96),
    "single": ([1], [1], 16),
    "long_query": ([150, 2], [3, 40], 32),
    "many_docs": ([7, 3, 12], [int(n) for n in torch.randint(0, 50, (67,), generator=torch.Generator().manual_seed(3))], 24),
    "wide_d": ([4, 9], [5, 17, 2], 300),
}


def oracle(qv, qo, xv, xo):
    return ref.maxsim_cross_reference(qv.double().cpu(), qo.cpu(), xv.double().cpu(), xo.cpu(), torch.float64)


def same_dtype_torch(qv, qo, xv, xo):
    """The yardstick computation: torch, in the input dtype throughout."""
    return ref.maxsim_cross_reference(qv.cpu(), qo.cpu(), xv.cpu(), xo.cpu(), qv.dtype)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_cross_scores_match_fp64(backend, device, dtype, case):
    ql, dl, d = CASES[case]
    if backend == "triton" and case == "wide_d" and dtype != torch.float32:
        pass  # covered: tiles loop over d in chunks
    qv, qo = random_packed(ql, d, dtype, seed=1, device=device)
    xv, xo = random_packed(dl, d, dtype, seed=2, device=device)
    got = cg.maxsim(qv, qo, xv, xo, backend=backend)
    assert got.shape == (len(ql), len(dl)) and got.dtype == torch.float32 and got.device.type == device
    assert_scores_match(got, oracle(qv, qo, xv, xo), same_dtype_torch(qv, qo, xv, xo), f"{backend}/{dtype}/{case}")


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_empty_document_scores_minus_inf_and_empty_query_zero(backend, device):
    qv, qo = random_packed([3, 0], 16, seed=1, device=device)
    xv, xo = random_packed([0, 4, 0], 16, seed=2, device=device)
    got = cg.maxsim(qv, qo, xv, xo, backend=backend).cpu()
    assert got[0, 0] == float("-inf") and got[0, 2] == float("-inf") and torch.isfinite(got[0, 1])
    assert torch.equal(got[1], torch.zeros(3))


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_normalize_gives_cosine_maxsim(backend, device):
    qv, qo = random_packed([3, 5], 8, seed=4, device=device)
    xv, xo = random_packed([2, 6, 1], 8, seed=5, device=device)
    got = cg.maxsim(qv * 7.0, qo, xv * 0.01, xo, normalize=True, backend=backend)
    unit = lambda v: torch.nn.functional.normalize(v.double(), dim=-1)
    want = ref.maxsim_cross_reference(unit(qv).cpu(), qo.cpu(), unit(xv).cpu(), xo.cpu(), torch.float64)
    torch.testing.assert_close(got.double().cpu(), want, rtol=0, atol=1e-5)
    assert bool((got <= 5 + 1e-5).all())  # a sum of 5 cosines at most


def _csr(lists):
    offsets = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    ids = torch.tensor([i for x in lists for i in x], dtype=torch.int64)
    return offsets, ids


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_candidate_scores_equal_cross_scores_gathered(backend, device, dtype):
    qv, qo = random_packed([5, 1, 40, 3, 150], 32, dtype, seed=6, device=device)
    xv, xo = random_packed([9, 0, 1, 20, 33, 4, 17], 32, dtype, seed=7, device=device)
    # repeats, an empty list, a document listed by every query, out-of-order ids
    lists = [[6, 0, 3, 3], [], [1, 2, 3, 4, 5, 6, 0], [3], [5, 3, 0]]
    co, ci = _csr(lists)
    got = cg.maxsim_candidates(qv, qo, xv, xo, co.to(device), ci.to(device), backend=backend)
    cross64 = oracle(qv, qo, xv, xo)
    q_of = torch.repeat_interleave(torch.arange(len(lists)), co.diff())
    want = cross64[q_of, ci]
    same = same_dtype_torch(qv, qo, xv, xo)[q_of, ci]
    assert got.shape == (ci.numel(),)
    assert_scores_match(got, want, same, f"candidates/{backend}/{dtype}")


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_candidates_with_no_pairs_at_all(backend, device):
    qv, qo = random_packed([2, 3], 8, device=device)
    xv, xo = random_packed([4], 8, device=device)
    co, ci = torch.zeros(3, dtype=torch.int64), torch.zeros(0, dtype=torch.int64)
    got = cg.maxsim_candidates(qv, qo, xv, xo, co.to(device), ci.to(device), backend=backend)
    assert got.shape == (0,)


def _check_topk(scores, idx, full, k):
    """Exact top-k up to ties: the returned scores are the k largest, sorted, and each index's
    score equals the reported score."""
    kk = min(k, full.shape[1])
    want = torch.sort(full, dim=1, descending=True).values[:, :kk]
    torch.testing.assert_close(scores, want, rtol=0, atol=0)
    torch.testing.assert_close(full.gather(1, idx), scores, rtol=0, atol=0)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_topk_is_exact_across_chunks(backend, device, dtype):
    qv, qo = random_packed([4, 9, 1], 16, dtype, seed=8, device=device)
    xv, xo = random_packed([int(n) for n in torch.randint(0, 12, (45,), generator=torch.Generator().manual_seed(9))],
                           16, dtype, seed=10, device=device)
    full = cg.maxsim(qv, qo, xv, xo, backend=backend)
    for k, chunk in [(1, 7), (5, 7), (10, 45), (60, 8)]:
        scores, idx = cg.maxsim_topk(qv, qo, xv, xo, k, chunk_docs=chunk, backend=backend)
        assert scores.shape == idx.shape == (3, min(k, 45))
        _check_topk(scores, idx, full, k)


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_topk_breaks_ties_by_lower_index_and_skips_dead(backend, device):
    one = torch.randn(3, 8, generator=torch.Generator().manual_seed(0))
    xv, xo = cg.pack([one, torch.zeros(2, 8), one, one, one])  # documents 0, 2, 3, 4 tie
    xv, xo = xv.to(device), xo.to(device)
    qv, qo = one[:2].contiguous().to(device), torch.tensor([0, 2], device=device)
    alive = torch.tensor([True, True, True, False, True], device=device)
    for chunk in (1, 2, 5):
        _, idx = cg.maxsim_topk(qv, qo, xv, xo, 4, alive=alive, chunk_docs=chunk, backend=backend)
        assert idx.cpu().tolist() == [[0, 2, 4, 1]]


def test_pooled_scores_are_cosines_of_mean_unit_vectors():
    qv, qo = random_packed([3, 0], 8, seed=11)
    xv, xo = random_packed([2, 5], 8, seed=12)
    got = cg.pooled_scores(qv, qo, xv, xo)
    unit = torch.nn.functional.normalize(xv.double(), dim=-1)
    pooled = torch.nn.functional.normalize(unit[2:7].mean(0), dim=0)
    qpool = torch.nn.functional.normalize(torch.nn.functional.normalize(qv.double(), dim=-1).mean(0), dim=0)
    assert abs(got[0, 1].item() - float(qpool @ pooled)) < 1e-5
    assert torch.equal(got[1], torch.zeros(2))  # an empty query pools to zero


@NATIVE
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_native_writes_every_output_element(dtype):
    from colgraph_engine.ops import _native_impl
    qv, qo = random_packed([3, 17, 1], 40, dtype, seed=13)
    xv, xo = random_packed([5, 0, 29], 40, dtype, seed=14)
    out = torch.full((3, 3), float("nan"))
    _native_impl.maxsim_cross(qv, qo, xv, xo, out)
    assert not torch.isnan(out).any()
    co, ci = _csr([[2, 1], [], [0, 2, 2]])
    cand = torch.full((5,), float("nan"))
    _native_impl.maxsim_candidates(qv, qo, xv, xo, co, ci, cand)
    assert not torch.isnan(cand).any()


@TRITON
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_triton_writes_every_output_element(dtype):
    from colgraph_engine.kernels import maxsim as km
    qv, qo = random_packed([3, 17, 1, 140], 40, dtype, seed=13, device=TRITON_DEVICE)
    xv, xo = random_packed([5, 0, 29], 40, dtype, seed=14, device=TRITON_DEVICE)
    out = torch.full((4, 3), float("nan"), device=TRITON_DEVICE)
    km.maxsim_cross(qv, qo, xv, xo, out, q_lengths=[3, 17, 1, 140])
    assert not torch.isnan(out).any()
    co, ci = _csr([[2, 1], [], [0, 2, 2], [1]])
    cand = torch.full((6,), float("nan"), device=TRITON_DEVICE)
    km.maxsim_candidates(qv, qo, xv, xo, co.to(TRITON_DEVICE), ci.to(TRITON_DEVICE), cand, q_lengths=[3, 17, 1, 140])
    assert not torch.isnan(cand).any()


@NATIVE
def test_native_is_deterministic_across_thread_counts(monkeypatch):
    qv, qo = random_packed([32] * 3, 64, seed=15)
    xv, xo = random_packed([100] * 37, 64, seed=16)
    # 96 x 3,700 x 64 = 22.7M multiply-adds a call: above the 4M a thread needs before a second
    # one starts (csrc/parallel.hpp), so the second thread does run
    co, ci = _csr([list(range(0, 37, 2)), list(range(37)), list(range(36, 0, -3))])
    monkeypatch.setenv("COLGRAPH_NUM_THREADS", "1")
    one = cg.maxsim(qv, qo, xv, xo, backend="native")
    one_c = cg.maxsim_candidates(qv, qo, xv, xo, co, ci, backend="native")
    monkeypatch.setenv("COLGRAPH_NUM_THREADS", "2")
    two = cg.maxsim(qv, qo, xv, xo, backend="native")
    two_c = cg.maxsim_candidates(qv, qo, xv, xo, co, ci, backend="native")
    assert torch.equal(one, two) and torch.equal(one_c, two_c)
    assert torch.equal(one_c, torch.cat([one[q, ci[co[q]:co[q + 1]]] for q in range(3)]))


@NATIVE
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_native_batch_packs_queries_yet_scores_equal_one_query_at_a_time(dtype):
    """A batch packs every query's tokens into shared 16-lane blocks; each query's score must be
    bit-identical to scoring it alone (queries of 0, 1, 5, 8, 9, 12, 16, 17, 33 and 70 tokens, empty
    docs; alone, a query of at most 8 tokens runs the 8-lane kernel)."""
    lengths = [12, 0, 1, 5, 8, 9, 16, 17, 33, 70, 12]
    qv, qo = random_packed(lengths, 48, dtype, seed=21)
    xv, xo = random_packed([5, 0, 29, 1, 64, 0, 12], 48, dtype, seed=22)
    batch = cg.maxsim(qv, qo, xv, xo, backend="native")
    bounds = qo.tolist()
    alone = torch.cat([cg.maxsim(qv[a:b], torch.tensor([0, b - a]), xv, xo, backend="native")
                       for a, b in zip(bounds, bounds[1:])])
    assert torch.equal(batch, alone)
    assert_scores_match(batch, oracle(qv, qo, xv, xo), same_dtype_torch(qv, qo, xv, xo), "packed batch")


@NATIVE
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", [16, 48, 128])
def test_candidate_lane_kernel_scores_equal_the_row_tiles(monkeypatch, dtype, d):
    """Candidate scoring picks, per document, the row tiles (query tokens in the lanes) or the
    lane kernel (document rows in the lanes, csrc/maxsim_cpu.cpp); both must give the same bits
    for queries of 0-40 tokens, documents of 0-100 rows and several queries per document (d = 48
    is not a multiple of 16: the row tiles run whatever is asked; on a CPU without AVX-512 the
    row tiles always run, and the three calls agree trivially)."""
    lengths = [1, 0, 4, 8, 9, 12, 15, 16, 17, 24, 31, 32, 33, 40]
    qv, qo = random_packed(lengths, d, dtype, seed=31)
    xv, xo = random_packed([0, 1, 5, 15, 16, 17, 31, 33, 64, 100], d, dtype, seed=32)
    rng = torch.Generator().manual_seed(33)
    co, ci = _csr([torch.randint(0, 10, (int(torch.randint(0, 12, (1,), generator=rng)),), generator=rng).tolist()
                   for _ in lengths])
    got = {}
    for kernel in ("rows", "lanes", "auto"):
        monkeypatch.setenv("COLGRAPH_CANDIDATE_KERNEL", kernel)
        got[kernel] = cg.maxsim_candidates(qv, qo, xv, xo, co, ci, backend="native")
    assert torch.equal(got["rows"], got["lanes"]) and torch.equal(got["rows"], got["auto"])
    cross = cg.maxsim(qv, qo, xv, xo, backend="native")
    assert torch.equal(got["auto"], torch.cat([cross[q, ci[co[q]:co[q + 1]]] for q in range(len(lengths))]))
