"""The implementations compared by the CPU MaxSim benchmarks, and their correctness checks.

Shared by ``test_cpu_maxsim.py`` (pytest-benchmark) and ``cpu_report.py`` (plain script), so
both time exactly the same callables. Each builder returns a zero-argument function; for a
``cross`` case it returns scores ``[Nq, Nd]`` float32, for a ``topk`` case ``(scores [Nq, k],
indices [Nq, k])``. Input preparation (packing, fp32 copies) happens before timing.

Correctness follows the project's yardstick (DESIGN.md): compare against fp64 and allow
twice the error that plain torch makes doing the same computation in the input dtype.
"""
from __future__ import annotations

import functools
import os

# colpali-engine >= 0.3.18 routes MaxSim through COLPALI_SCORES_BACKEND (read per call). "auto"
# would first try late-interaction-kernels (a GPU Triton package); pinning "torch" makes the row
# deterministic and times colpali-engine's own CPU path. Older versions ignore the variable.
os.environ["COLPALI_SCORES_BACKEND"] = "torch"

import torch

import colgraph_engine as cg

from _data import Case, Data, pair_scores_fp64, scores_fp64
from _harness import CorrectnessError, env, version

CHUNK_DOCS = 64  # documents per step of the plain-torch baselines

BASELINE = "colpali-engine fp32"  # speedups are colpali_ms / impl_ms against this row


# ------------------------------------------------------------------------------------------
# Availability
# ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _colpali():
    """colpali-engine's processor class, or None when the package is missing."""
    from colgraph_engine._kernels_name import load_installed_kernels
    load_installed_kernels()  # this script put the checkout's root, and its kernels/, on sys.path
    try:
        from colpali_engine.utils.processing_utils import BaseVisualRetrieverProcessor
    except ImportError:
        return None
    return BaseVisualRetrieverProcessor


def impl_names(case: Case) -> list[str]:
    """Row names for `case`, in table order. Cheap: builds no data."""
    names = ["colgraph native", "colgraph torch-ref", BASELINE]
    if case.dtype != torch.float32:
        names.append("colpali-engine " + ("bf16" if case.dtype == torch.bfloat16 else case.dtype_name))
    names.append("torch gemm+amax")
    if case.kind == "cross":
        names.append("torch einsum")
    return names


def skip_reason(name: str) -> str | None:
    """Why row `name` cannot run here, or None."""
    if name.startswith("colgraph native") and not cg.backends()["native"]:
        return f"native backend unavailable: {cg.backends()['native_reason']}"
    if name.startswith("colpali-engine") and _colpali() is None:
        return "colpali-engine is not installed (pip install colpali-engine)"
    return None


# ------------------------------------------------------------------------------------------
# Scoring callables (each returns [Nq, Nd] float32 scores for the whole store)
# ------------------------------------------------------------------------------------------

def _gemm_amax(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``[Nq, Nd]``: one GEMM per chunk of 64 docs, ``[Nq*Lq, d] @ [d, 64*Ld]``, then amax/sum."""
    nq, lq, d = q.shape
    ld = x.shape[1]
    q2 = q.reshape(-1, d)
    parts = []
    for a in range(0, x.shape[0], CHUNK_DOCS):
        xc = x[a:a + CHUNK_DOCS]
        sim = (q2 @ xc.reshape(-1, d).T).view(nq, lq, xc.shape[0], ld)
        parts.append(sim.amax(-1).sum(1))
    return torch.cat(parts, 1).float()


def _einsum(q: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``[Nq, Nd]``: ``einsum("qid,njd->qnij")`` per chunk of 64 docs, then amax/sum."""
    parts = [torch.einsum("qid,njd->qnij", q, x[a:a + CHUNK_DOCS]).amax(-1).sum(-1)
             for a in range(0, x.shape[0], CHUNK_DOCS)]
    return torch.cat(parts, 1).float()


def _colpali_scores(q_list: list[torch.Tensor], x_list: list[torch.Tensor]) -> torch.Tensor:
    """``[Nq, Nd]`` float32 from colpali-engine's public scorer (default batch_size=128)."""
    return _colpali().score_multi_vector(q_list, x_list, device="cpu")


def _score_fn(name: str, data: Data):
    """Zero-argument callable returning ``[Nq, Nd]`` float32 scores for row `name`."""
    qv, qo, dv, do = data.qv, data.qo, data.dv, data.do
    if name == "colgraph native":
        return lambda: cg.maxsim(qv, qo, dv, do, backend="native")
    if name == "colgraph torch-ref":
        return lambda: cg.maxsim(qv, qo, dv, do, backend="torch")
    if name == BASELINE:
        # In a bf16 case this is colpali on an fp32 store holding the same (rounded) values;
        # the fp32 copy is made here, before timing, like a store that was saved in fp32.
        q_list, x_list = list(data.q_f32), list(data.x_f32)
        return lambda: _colpali_scores(q_list, x_list)
    if name.startswith("colpali-engine "):
        q_list, x_list = data.q_list, data.x_list
        return lambda: _colpali_scores(q_list, x_list)
    if name == "torch gemm+amax":
        return lambda: _gemm_amax(data.q, data.x)
    if name == "torch einsum":
        return lambda: _einsum(data.q, data.x)
    raise KeyError(name)


def build(name: str, data: Data):
    """Zero-argument callable for row `name` of ``data.case`` (see the module docstring)."""
    case = data.case
    if case.kind == "cross":
        return _score_fn(name, data)
    k = case.k
    if name == "colgraph native":
        return lambda: cg.maxsim_topk(data.qv, data.qo, data.dv, data.do, k=k, backend="native")
    if name == "colgraph torch-ref":
        return lambda: cg.maxsim_topk(data.qv, data.qo, data.dv, data.do, k=k, backend="torch")
    score = _score_fn(name, data)
    # The baselines have no streaming top-k: score everything ([Nq, Nd] is small), then topk.
    return lambda: tuple(torch.topk(score(), k, dim=1))


# ------------------------------------------------------------------------------------------
# Correctness
# ------------------------------------------------------------------------------------------

_ORACLES: dict = {}


def oracle(data: Data):
    """``(fp64 scores [Nq, n_check], tolerance)`` for documents ``[0, n_check)`` of the case.

    The tolerance is twice the max error of plain torch einsum in the case dtype on the same
    subset, floored at 1e-4 so fp32 rows are not failed for summation-order noise. Cached per
    case: the data of a case are deterministic, so a regenerated Data gives the same oracle.
    """
    case = data.case
    if case not in _ORACLES:
        x_sub = data.x[:case.n_check]
        ref = scores_fp64(data.q, x_sub)
        yard = (_einsum(data.q, x_sub).double() - ref).abs().max().item()
        _ORACLES[case] = (ref, max(2.0 * yard, 1e-4))
    return _ORACLES[case]


def tolerance(case: Case) -> float:
    """The tolerance :func:`oracle` set for `case` (it has run for every case with a checked row)."""
    return _ORACLES[case][1]


def check_cross(name: str, data: Data, scores: torch.Tensor) -> float:
    """Checks ``[Nq, Nd]`` scores on the fp64 subset; returns the max abs error there."""
    case = data.case
    if tuple(scores.shape) != (case.nq, case.nd):
        raise CorrectnessError(f"{name}: expected scores of shape [{case.nq}, {case.nd}], got {tuple(scores.shape)}")
    if not torch.isfinite(scores).all():
        raise CorrectnessError(f"{name}: non-finite scores")
    ref, tol = oracle(data)
    err = (scores[:, :case.n_check].double() - ref).abs().max().item()
    if err > tol:
        raise CorrectnessError(f"{name}: max abs error {err:.3g} on documents [0, {case.n_check}) exceeds {tol:.3g}")
    return err


def check_topk(name: str, data: Data, result) -> float:
    """Checks an exact top-k ``(scores [Nq, k], indices [Nq, k])``; returns the max score error.

    Up to ties: returned scores must match fp64 scores of the returned documents; no document of
    the fp64 subset outside the result may beat the weakest returned one by more than the
    tolerance; and each query's planted document (its clear winner) must be returned.
    """
    case = data.case
    scores, idx = result
    if tuple(idx.shape) != (case.nq, case.k) or tuple(scores.shape) != (case.nq, case.k):
        raise CorrectnessError(f"{name}: expected [{case.nq}, {case.k}] results, got {tuple(scores.shape)}, "
                               f"{tuple(idx.shape)}")
    ref_sub, tol = oracle(data)
    got64 = pair_scores_fp64(data.q, data.x, idx)
    err = (scores.double() - got64).abs().max().item()
    if err > tol:
        raise CorrectnessError(f"{name}: returned scores are off by {err:.3g} > {tol:.3g}")
    for i in range(case.nq):
        row = idx[i].tolist()
        if len(set(row)) != case.k:
            raise CorrectnessError(f"{name}: query {i}: duplicate indices {row}")
        if int(data.planted[i]) not in row:
            raise CorrectnessError(f"{name}: query {i}: planted document {int(data.planted[i])} missing from {row}")
        outside = torch.ones(case.n_check, dtype=torch.bool)
        outside[[j for j in row if j < case.n_check]] = False
        weakest = got64[i].min().item()
        beaten = ref_sub[i][outside] > weakest + tol
        if beaten.any():
            raise CorrectnessError(f"{name}: query {i}: {int(beaten.sum())} unreturned documents score above the k-th")
    return err


def check(name: str, data: Data, result) -> float:
    """Dispatches to :func:`check_cross` or :func:`check_topk`; returns the max abs error."""
    if data.case.kind == "cross":
        return check_cross(name, data, result)
    return check_topk(name, data, result)


def machine_info() -> dict:
    """``_harness.env()`` plus the colpali-engine version and scoring backend."""
    return env(colpali_engine=version("colpali-engine"),
               COLPALI_SCORES_BACKEND=os.environ.get("COLPALI_SCORES_BACKEND"))
