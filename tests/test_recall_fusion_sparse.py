"""Recall's fusion ranks only the documents a side scored: the same ranks, fused scores and top-Kd
as ranking all D documents with a stable descending sort (the dense rule it replaces), on scores
with unscored documents (-inf) and exact ties."""
import numpy as np
import torch

from colgraph_engine.pipeline import PipelineConfig
from colgraph_engine.pipeline.recall import finite_desc, fuse_sides


def dense_rrf(per_side, nq, d, rrf_k):
    fused = torch.zeros((nq, d), dtype=torch.float64)
    seen = torch.zeros((nq, d), dtype=torch.bool)
    for _, rows, s in per_side:
        finite = torch.isfinite(s)
        r = torch.from_numpy(rows)
        seen[r] |= finite
        order = torch.sort(s, dim=1, descending=True, stable=True).indices
        rank = torch.empty_like(order)
        rank.scatter_(1, order, torch.arange(1, d + 1).expand(rows.size, -1))
        fused[r] += torch.where(finite, 1.0 / (rrf_k + rank.double()), 0.0)
    return torch.where(seen, fused, -torch.inf)


def scores(rng, n, d, scored):
    s = torch.full((n, d), float("-inf"))
    for i in range(n):
        cols = rng.choice(d, size=scored, replace=False)
        s[i, cols] = torch.from_numpy(rng.integers(0, 4, scored).astype(np.float32))  # few values: many ties
    return s


def test_sparse_rrf_equals_the_dense_rule():
    rng = np.random.default_rng(7)
    nq, d = 6, 50
    text_rows, image_rows = np.arange(nq), np.array([1, 4])
    per_side = [("text", text_rows, scores(rng, nq, d, 12)), ("image", image_rows, scores(rng, 2, d, 9))]
    sides = [["text", "image"] if q in (1, 4) else ["text"] for q in range(nq)]
    cfg = PipelineConfig()
    got = fuse_sides(per_side, sides, nq, d, cfg)
    want = dense_rrf(per_side, nq, d, cfg.rrf_k)
    assert torch.equal(torch.isinf(got), torch.isinf(want))
    assert torch.equal(got[torch.isfinite(got)], want[torch.isfinite(want)])
    for i in range(nq):  # the top-Kd order: the dense stable sort's finite prefix
        dense = torch.sort(want[i], descending=True, stable=True).indices
        dense = dense[torch.isfinite(want[i, dense])]
        assert torch.equal(finite_desc(got[i]), dense)


def test_finite_desc_edge_cases():
    assert finite_desc(torch.full((4,), float("-inf"))).numel() == 0
    assert finite_desc(torch.zeros(0)).numel() == 0
    assert finite_desc(torch.tensor([1.0, 3.0, 1.0, float("-inf"), 3.0])).tolist() == [1, 4, 0, 2]
