"""The Triton kernels (interpreter in CI) on odd shapes, against an fp64 reference.

d = 8, 80, 200 (one column chunk, masked columns, BLOCK_K 256 on a GPU); queries of 1, 128,
129 and 200 tokens (129 and 200 run in pieces of 128); documents of 0, 1, 64, 65 and 1,029
tokens (empty, one row, exact tiles, one row past a tile, many tiles with a partial last one);
candidate lists with repeats (a document listed 10 and 7 times: items of 8, 4, 2, 1) and
empty lists. Plus the work-list builder on its own: every pair in exactly one item of exactly
G pairs of one document.
"""
import pytest
import torch

import colgraph_engine as cg
from colgraph_engine.kernels import maxsim as km
from colgraph_engine.ops import reference as ref

from .conftest import TRITON, TRITON_DEVICE, assert_scores_match, random_packed

Q_LENGTHS = [1, 128, 129, 200]
DOC_LENGTHS = [0, 1, 64, 65, 1029]
# (d, dtype, query lengths, document lengths): the interpreter's time grows with tiles x pieces,
# so the 1,029-token document runs at d = 8 only (CI stays within seconds).
SHAPES = [(8, torch.float32, Q_LENGTHS, DOC_LENGTHS), (80, torch.bfloat16, Q_LENGTHS, DOC_LENGTHS[:4]),
          (200, torch.float16, [1, 129, 7, 2], [0, 1, 65, 3])]
# Per query: repeats (document 4 ten times, 3 seven times over two queries), empty lists.
LISTS = [[4] * 10 + [0, 3, 3], [], [3] * 5 + [1, 2, 4, 0], []]


def _csr(lists, device):
    offsets = torch.tensor([0] + [len(x) for x in lists]).cumsum(0)
    ids = torch.tensor([i for x in lists for i in x], dtype=torch.int64)
    return offsets.to(device), ids.to(device)


@TRITON
@pytest.mark.parametrize("d,dtype,q_lengths,doc_lengths", SHAPES, ids=lambda v: str(v) if not isinstance(v, list) else "")
def test_cross_and_candidates_on_odd_shapes(d, dtype, q_lengths, doc_lengths):
    qv, qo = random_packed(q_lengths, d, dtype, seed=d, device=TRITON_DEVICE)
    xv, xo = random_packed(doc_lengths, d, dtype, seed=d + 1, device=TRITON_DEVICE)
    exact = ref.maxsim_cross_reference(qv.double().cpu(), qo.cpu(), xv.double().cpu(), xo.cpu(), torch.float64)
    same = ref.maxsim_cross_reference(qv.cpu(), qo.cpu(), xv.cpu(), xo.cpu(), dtype)
    out = torch.full((len(q_lengths), len(doc_lengths)), float("nan"), device=TRITON_DEVICE)  # unwritten shows
    got = km.maxsim_cross(qv, qo, xv, xo, out, q_lengths=q_lengths)
    assert_scores_match(got, exact, same, f"cross d={d}")
    assert bool(torch.isinf(got[:, 0].cpu()).all())  # the empty document

    lists = [[i % len(doc_lengths) for i in x] for x in LISTS]
    co, ci = _csr(lists, TRITON_DEVICE)
    owner = torch.repeat_interleave(torch.arange(len(lists)), co.cpu().diff())
    for counts in (None, co.cpu().diff()):  # owners found on the device, or given from the host
        cand = torch.full((ci.numel(),), float("nan"), device=TRITON_DEVICE)
        km.maxsim_candidates(qv, qo, xv, xo, co, ci, cand, q_lengths=q_lengths, cand_counts=counts)
        assert_scores_match(cand, exact[owner, ci.cpu()], same[owner, ci.cpu()], f"candidates d={d}")


@TRITON
def test_public_functions_agree_with_the_launchers_on_odd_shapes():
    qv, qo = random_packed([1, 129], 80, torch.float32, seed=5, device=TRITON_DEVICE)
    xv, xo = random_packed([65, 0, 1], 80, torch.float32, seed=6, device=TRITON_DEVICE)
    direct = km.maxsim_cross(qv, qo, xv, xo, q_lengths=[1, 129])
    assert torch.equal(cg.maxsim(qv, qo, xv, xo, backend="triton"), direct)
    scores, idx = cg.maxsim_topk(qv, qo, xv, xo, 2, chunk_docs=1, backend="triton")
    assert torch.equal(scores, torch.sort(direct, 1, descending=True).values[:, :2])


def test_work_items_hold_exactly_g_pairs_of_one_document():
    g = torch.Generator().manual_seed(7)
    nd = 9
    counts = [0, 1, 2, 3, 7, 8, 10, 15, 16]  # pairs per document: every bit pattern up to 16
    pair_doc = torch.cat([torch.full((c,), i) for i, c in enumerate(counts)])
    perm = torch.randperm(pair_doc.numel(), generator=g)
    pair_doc = pair_doc[perm]
    pair_query = torch.randint(0, 5, (pair_doc.numel(),), generator=g)
    slots = torch.arange(pair_doc.numel())
    sd, sq, ss, items = km.bucket_work(pair_doc, pair_query, slots, nd)
    assert torch.equal(sd, torch.sort(pair_doc, stable=True).values)
    assert torch.equal(pair_doc[ss], sd) and torch.equal(pair_query[ss], sq)  # pairs move together
    covered = torch.zeros(pair_doc.numel(), dtype=torch.int64)
    per_doc_items = {}
    for size, (starts, n_items) in items.items():
        n = int(n_items)
        for s in starts[:n].tolist():
            block = sd[s:s + size]
            assert block.numel() == size and bool((block == block[0]).all()), (size, s)
            covered[s:s + size] += 1
            per_doc_items.setdefault(int(block[0]), []).append(size)
    assert bool((covered == 1).all())  # every pair scored exactly once
    for doc, c in enumerate(counts):
        sizes = sorted(per_doc_items.get(doc, []), reverse=True)
        assert sizes == [8] * (c // 8) + [b for b in (4, 2, 1) if c % 8 & b], (doc, c, sizes)


def test_work_items_of_no_pairs():
    empty = torch.zeros(0, dtype=torch.int64)
    _, _, _, items = km.bucket_work(empty, empty, empty, 3)
    assert all(int(n) == 0 for _, n in items.values())


@pytest.mark.parametrize("max_len,n,d", [(1, 1, 8), (128, 4, 80), (129, 4, 200), (200, 1, 128), (32, 32, 128)])
def test_tile_plan_covers_every_token_in_tensor_core_tiles(max_len, n, d):
    g, lqp, pieces, block_k, num_k, even_k = km.tile_plan(max_len, n, d)
    assert lqp * pieces >= max_len and lqp <= km.MAX_LQP and g * lqp >= 16
    assert g * lqp <= max(km.CROSS_ROWS, 16) and block_k * num_k >= d and even_k == (d % block_k == 0)
