"""Shared synthetic inputs and fp64 oracles for the CPU MaxSim benchmarks.

Every implementation in a case sees the *same* tensors: one packed store (values ``[T, d]``,
offsets ``[N+1]``) made with :func:`colgraph_engine.pack`, and zero-copy views of it in the
layouts the other libraries want (a dense ``[Nd, Ld, d]`` tensor, a list of ``[Ld, d]``
tensors). All documents in a case have the same length, so colpali-engine's zero padding never
adds a phantom token, and dense views exist without copying.

Data are "clustered-ish": a few hundred unit centroids, each document draws its tokens from a
handful of them (a page has a few topics), plus noise, then unit-normalised. Each query is a
noisy copy of tokens from one *planted* document, so the true top-1 is known and top-k has a
clear winner while the rest of the ranking is still decided by close scores.
"""
from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

import colgraph_engine as cg

SEED = 20240611
N_CENTROIDS = 256
TOPICS_PER_DOC = 4
DOC_NOISE = 0.6      # norm of the noise relative to the unit centroid
QUERY_NOISE = 0.3    # queries stay closer to their planted document than docs to centroids
GEN_CHUNK = 1024     # documents generated per step, bounds temporary memory


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark shape. ``kind`` is ``"cross"`` (all scores) or ``"topk"`` (exact top-k)."""

    name: str
    kind: str
    nq: int
    lq: int
    nd: int
    ld: int
    d: int
    dtype: torch.dtype
    k: int = 0
    n_check: int = 64      # documents [0, n_check) scored in fp64 for the correctness check

    @property
    def flops(self) -> float:
        """Multiply-adds of the similarity GEMM, counted as 2 flops (the max/sum are ignored)."""
        return 2.0 * self.nq * self.lq * self.nd * self.ld * self.d

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


CROSS_FP32 = Case("cross 8x32 vs 512x1030 fp32", "cross", 8, 32, 512, 1030, 128, torch.float32)
CROSS_BF16 = Case("cross 8x32 vs 512x1030 bf16", "cross", 8, 32, 512, 1030, 128, torch.bfloat16)
TOPK_FP32 = Case("top10 8x32 vs 20000x128 fp32", "topk", 8, 32, 20000, 128, 128, torch.float32, k=10, n_check=1024)
TOPK_BF16 = Case("top10 8x32 vs 20000x128 bf16", "topk", 8, 32, 20000, 128, 128, torch.bfloat16, k=10, n_check=1024)
CASES = (CROSS_FP32, CROSS_BF16, TOPK_FP32, TOPK_BF16)


@dataclasses.dataclass
class Data:
    """The inputs of one case, all views of one packed store where possible.

    Attributes:
        q: ``[Nq, Lq, d]`` queries in the case dtype (dense view of ``qv``).
        x: ``[Nd, Ld, d]`` documents in the case dtype (dense view of ``dv``).
        qv, qo: packed queries ``[Nq*Lq, d]`` and offsets ``[Nq+1]``.
        dv, do: packed documents ``[Nd*Ld, d]`` and offsets ``[Nd+1]``.
        planted: ``[Nq]`` int64, the document each query was copied from.
    """

    case: Case
    q: torch.Tensor
    x: torch.Tensor
    qv: torch.Tensor
    qo: torch.Tensor
    dv: torch.Tensor
    do: torch.Tensor
    planted: torch.Tensor

    @property
    def q_list(self) -> list[torch.Tensor]:
        """``Nq`` tensors ``[Lq, d]`` (views), the layout colpali-engine takes."""
        return list(self.q)

    @property
    def x_list(self) -> list[torch.Tensor]:
        """``Nd`` tensors ``[Ld, d]`` (views), the layout colpali-engine takes."""
        return list(self.x)

    @functools.cached_property
    def q_f32(self) -> torch.Tensor:
        """``[Nq, Lq, d]`` float32 copy of the (possibly bf16-rounded) queries."""
        return self.q.float()

    @functools.cached_property
    def x_f32(self) -> torch.Tensor:
        """``[Nd, Ld, d]`` float32 copy of the (possibly bf16-rounded) documents.

        Made once, outside any timing: it stands for a store kept in fp32 holding the same values.
        """
        return self.x.float()


def _unit_rows(t: torch.Tensor) -> torch.Tensor:
    return F.normalize(t, dim=-1)


def _clustered_docs(nd: int, ld: int, d: int, centroids: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """``[Nd, Ld, d]`` float32 unit vectors drawn around a few centroids per document."""
    out = torch.empty((nd, ld, d), dtype=torch.float32)
    sigma = DOC_NOISE / d ** 0.5  # per-component std so that the noise norm is about DOC_NOISE
    for a in range(0, nd, GEN_CHUNK):
        b = min(nd, a + GEN_CHUNK)
        topics = torch.randint(centroids.shape[0], (b - a, TOPICS_PER_DOC), generator=gen)
        pick = torch.randint(TOPICS_PER_DOC, (b - a, ld), generator=gen)
        tok = centroids[topics.gather(1, pick)]
        tok += sigma * torch.randn(tok.shape, generator=gen)
        out[a:b] = _unit_rows(tok)
    return out


def _planted_queries(docs: torch.Tensor, nq: int, lq: int, gen: torch.Generator):
    """``([Nq, Lq, d] float32, planted [Nq])``: query i is a noisy copy of tokens of one document."""
    nd, ld, d = docs.shape
    planted = torch.tensor([(2 * i + 1) * nd // (2 * nq) for i in range(nq)], dtype=torch.int64)
    tok_idx = torch.randint(ld, (nq, lq), generator=gen)
    q = docs[planted[:, None], tok_idx] + QUERY_NOISE / d ** 0.5 * torch.randn((nq, lq, d), generator=gen)
    return _unit_rows(q), planted


@functools.lru_cache(maxsize=2)
def _base(nq: int, lq: int, nd: int, ld: int, d: int):
    """fp32 ``(queries [Nq, Lq, d], docs [Nd, Ld, d], planted [Nq])`` for one shape, from SEED.

    Cached so the fp32 and bf16 cases of a shape share one draw (bf16 is the rounded fp32).
    """
    gen = torch.Generator().manual_seed(SEED)
    centroids = _unit_rows(torch.randn((N_CENTROIDS, d), generator=gen))
    docs = _clustered_docs(nd, ld, d, centroids, gen)
    q, planted = _planted_queries(docs, nq, lq, gen)
    return q, docs, planted


@functools.lru_cache(maxsize=2)
def make_data(case: Case) -> Data:
    """The inputs of `case` (cached; at most two cases are held at once to bound memory)."""
    q32, x32, planted = _base(case.nq, case.lq, case.nd, case.ld, case.d)
    qv, qo = cg.pack(list(q32.to(case.dtype)))
    dv, do = cg.pack(list(x32.to(case.dtype)))
    # Dense views over the packed buffers: every implementation reads the same memory.
    q = qv.view(case.nq, case.lq, case.d)
    x = dv.view(case.nd, case.ld, case.d)
    return Data(case, q, x, qv, qo, dv, do, planted)


def scores_fp64(q: torch.Tensor, x: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """The oracle: ``[Nq, n]`` float64 MaxSim of ``q [Nq, Lq, d]`` against ``x [n, Ld, d]``."""
    q64 = q.double()
    parts = [torch.einsum("qid,njd->qnij", q64, x[a:a + chunk].double()).amax(-1).sum(-1)
             for a in range(0, x.shape[0], chunk)]
    return torch.cat(parts, 1)


def pair_scores_fp64(q: torch.Tensor, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``[Nq, k]`` float64 MaxSim of query i against documents ``idx[i]`` (``idx [Nq, k]``)."""
    rows = [scores_fp64(q[i:i + 1], x[idx[i]])[0] for i in range(q.shape[0])]
    return torch.stack(rows)
