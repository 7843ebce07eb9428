"""One run on a lent GPU: colgraph_engine's MaxSim against its ceilings and its peers.

Sections, in order (each guarded: a failure is recorded and the next section runs; a global
time budget, ``GPU_BUDGET_S``, skips whatever would start after it is spent):

  env          GPU, SM count, torch / Triton / peer versions
  ceilings     device-to-device copy TB/s (read + write) and bf16 8192^3 matmul TFLOP/s
  correctness  ours (Triton) vs an fp64 reference on the first documents, candidates vs the
               cross scores gathered, top-k vs ``torch.topk`` of the cross scores (up to ties)
  store        1 query x 1,024 documents through ``PackedStore.search``: warm-up, a check that
               nothing synchronises (``torch.cuda.set_sync_debug_mode``), eager latency, host
               enqueue time, and the call replayed from a CUDA graph
  rerank       [Nq, Nd] cross scores: ours (public API and launcher) vs late-interaction-kernels,
               colpali-engine and torch GEMM + amax
  scan         exact top-10 over a large store: ``cg.maxsim_topk`` vs ``lik.retrieve``
  candidates   graph-restricted rerank, each query with its own 1,000 candidates: ours vs
               late-interaction-kernels (gathered, padded) vs fast-plaid ``subset=``

Before the first timed section the script records how many kernels were compiled (the budget
is ``MAX_COMPILES_BEFORE_TIMING``); each section's seconds are printed at the end.

Data is synthetic but clustered (``_harness.clustered_corpus``: documents mix a few of many topic
centroids plus noise; each query is drawn from one target document's topics), all bf16 on the GPU.

Output: a table on stdout, ``gpu_maxsim.jsonl`` (one JSON object per measurement) and
``gpu_maxsim.md`` in ``$GPU_OUT`` (default ``benchmarks/results/``). Exit status 1 when a
correctness check failed or could not run.

Run on the device machine with ``benchmarks/run_gpu.sh``. Check it here, without a GPU::

    TRITON_INTERPRET=1 SMOKE=1 .venv/bin/python benchmarks/gpu_maxsim.py     # or --smoke

``benchmarks/gpu_headline.py`` runs it as one phase of the one-run GPU check (``HEADLINE=1``, see
below; SECTIONS without ``scan``). Correctness covers the shapes of the sections that run.

Smoke mode shrinks every shape to a few tokens and runs our Triton kernels on the CPU under
the Triton interpreter; ceilings and GPU-only peers are skipped.
"""
from __future__ import annotations

import os
import sys

SMOKE = "--smoke" in sys.argv[1:] or os.environ.get("SMOKE", "").strip() not in ("", "0")
if SMOKE:
    # The interpreter must be chosen before torch / triton are imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("LIK_SUPPRESS_NORM_WARN", "1")  # our data is unit-norm already

import importlib  # noqa: E402
import inspect  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _harness beside us
import _harness as h  # noqa: E402
import colgraph_engine as cg  # noqa: E402
from colgraph_engine.ops import reference  # noqa: E402
from colgraph_engine.store.graphed_search import GraphedSearch  # noqa: E402

try:
    from colgraph_engine.kernels import maxsim as km
except ImportError as exc:  # a source checkout without the installed layout
    raise SystemExit(
        f"colgraph_engine.kernels is not importable ({exc}). The wheel maps the top-level kernels/ "
        "to colgraph_engine/kernels; from a plain checkout run benchmarks/run_gpu.sh, which builds "
        "that layout with symlinks.") from exc

T0 = time.time()
# HEADLINE=1 (set by gpu_headline.py, the one-run driver): the peers' slow or known-bad corners are
# left out so the whole phase fits its share of one device call: colpali-engine only where
# Nq x Nd <= 1,024 pairs (its einsum takes seconds at 32 x 8,192), no fast-plaid ``subset=`` (its
# 20 s index build; the prefilter phase measures fast-plaid), no late-interaction-kernels gather
# past 2^31 elements (known to fault the CUDA context). Correctness still covers every shape timed.
HEADLINE = os.environ.get("HEADLINE", "").strip() not in ("", "0")
CUDA = torch.cuda.is_available() and not SMOKE
DEV = torch.device("cuda" if CUDA else "cpu")
BUDGET_S = float(os.environ.get("GPU_BUDGET_S", "420"))  # the whole run must stay under 8 min
OUT_DIR = os.environ.get("GPU_OUT") or str(h.RESULTS)
DTYPE = torch.bfloat16
OURS = "triton"  # always name our backend: on CPU (smoke) the automatic choice would not be Triton


# Shapes. rerank: Nq x Nd cross scores of Ld tokens; scan: exact top-k over scan_nd documents,
# scan_chunk_docs per step (None: the library default); candidates: cand_nq queries with cand_k
# candidates each from a store of cand_store documents, the gathered late-interaction-kernels
# path tried at lik_cand_nq queries; check_docs documents compared against fp64; corpora of
# n_topics topics, topics_per_doc per document, generated corpus_chunk documents per step.
FULL = dict(d=128, lq=32, rerank_ld=1030, rerank_nq=(1, 32), rerank_nd=(1024, 8192),
              scan_nd=50_000, scan_ld=1024, scan_nq=(1, 32, 256), scan_chunk_docs=None, k=10,
              cand_store=10_000, cand_ld=1024, cand_nq=64, cand_k=1000, lik_cand_nq=(16, 64),
              check_docs=64, n_topics=8192, topics_per_doc=16, corpus_chunk=4096)
# Tiny shapes for the interpreter: odd lengths leave partial tiles, 3 queries leave a group
# partly empty, and a chunk of 3 documents makes maxsim_topk merge across chunks.
TINY = dict(d=32, lq=5, rerank_ld=37, rerank_nq=(1, 3), rerank_nd=(8,),
              scan_nd=8, scan_ld=37, scan_nq=(1, 3), scan_chunk_docs=3, k=3,
              cand_store=8, cand_ld=37, cand_nq=3, cand_k=5, lik_cand_nq=(2,),
              check_docs=4, n_topics=16, topics_per_doc=3, corpus_chunk=4)
S = SimpleNamespace(**(TINY if SMOKE else FULL))

R: h.RecordLog  # set in main(): every record, the failed checks, the time budget
WANTED: set = set()  # the sections this run times (main() sets it from SECTIONS)


def run_section(name: str, fn) -> None:
    """Runs one section unless the budget is spent; records its error instead of raising."""
    if R.left_s() <= 0:
        R.rec(section=name, skipped="time budget spent")
        return
    t = time.time()
    try:
        fn()
    except Exception as exc:  # one failing section must not stop the others
        R.error(name, name, exc)
        if name == "correctness":
            R.failed.append(f"correctness section raised {exc!r}"[:200])
    finally:
        R.rec(section=name, section_s=round(time.time() - t, 1))
        write_markdown()


# ------------------------------------------------------------------------------------------
# Timing, rates, data
# ------------------------------------------------------------------------------------------

def bench_ms(fn, rep_ms: int = 200) -> float:
    """Median milliseconds of `fn()`. GPU: triton.testing.do_bench (CUDA events, L2 flushed
    between calls). CPU (smoke): wall clock, one warm call and three timed; only proves the
    timing path runs, the figure means nothing."""
    if CUDA:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))
    return h.stats(h.time_calls(fn, 3))["ms_median"]


def host_ms(fn, calls: int = 50) -> dict:
    """Host milliseconds to enqueue one `fn()` (the device finishes untimed between calls):
    ``{"median", "min"}``."""
    sync()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
        sync()
    return dict(median=round(statistics.median(times), 4), min=round(min(times), 4))


def sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def rates(ms: float, bytes_read: int, flops: int) -> dict:
    """ms, TB/s of bytes read and TFLOP/s, rounded for the table."""
    s = ms * 1e-3
    return dict(ms=round(ms, 4), TBps=round(bytes_read / s / 1e12, 3), TFLOPs=round(flops / s / 1e12, 2))


def cross_cost(nq: int, lq: int, nd: int, ld: int, d: int) -> tuple[int, int]:
    """(bytes read, flops) of scoring every query against every document in bf16."""
    return 2 * (nd * ld * d + nq * lq * d), 2 * nq * lq * nd * ld * d


def max_rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b|, on b's device (peers such as colpali return CPU tensors)."""
    a = a.to(b.device, torch.float32)
    return round(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)), 7)


def hit_at_1(idx: torch.Tensor, target: torch.Tensor) -> float:
    """Fraction of queries whose best document is their target (``idx [Nq, k]``)."""
    return round(float((idx[:, 0].to(target.device) == target).float().mean()), 4)


def recall(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over rows of |set(a_i) & set(b_i)| / k, for ``[Nq, k]`` index tensors."""
    return round(sum(len(set(x) & set(y)) for x, y in zip(a.tolist(), b.tolist())) / max(1, a.numel()), 4)


@dataclass
class Corpus:
    """``docs [Nd, Ld, d]`` bf16 unit vectors; ``topics [n_topics, d]`` fp32 centroids;
    ``doc_topics [Nd, topics_per_doc]`` the topics each document mixes."""
    topics: torch.Tensor
    doc_topics: torch.Tensor
    docs: torch.Tensor

    def packed(self, first: int = 0, end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Documents [first, end) as ``(values [T, d], offsets [N+1] int64)``: a view, no copy."""
        sub = self.docs[first:end]
        n, ld, d = sub.shape
        return sub.reshape(n * ld, d), torch.arange(n + 1, device=sub.device, dtype=torch.int64) * ld

    def queries(self, nq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(target [Nq] int64, queries [Nq, Lq, d] bf16)``, each from one target document's topics."""
        return h.clustered_queries(self.topics, self.doc_topics, nq, S.lq, seed=seed, dtype=DTYPE)


def pack_queries(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[Nq, Lq, d]`` -> ``(values [Nq*Lq, d], offsets [Nq+1])``."""
    nq, lq, d = q.shape
    return q.reshape(nq * lq, d), torch.arange(nq + 1, device=q.device, dtype=torch.int64) * lq


def make_candidates(target: torch.Tensor, n_docs: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CSR candidate lists: for each query, `k` distinct sorted ids that include its target.
    Returns ``(cand_offsets [Nq+1], cand_ids [Nq*k])``, both int64 on the device."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for t in target.tolist():
        others = torch.randperm(n_docs - 1, generator=g)[:k - 1]
        others += (others >= t).long()  # skip the target so it appears exactly once
        rows.append(torch.sort(torch.cat([others, torch.tensor([t])])).values)
    ids = torch.stack(rows).reshape(-1).to(DEV)
    offsets = torch.arange(target.numel() + 1, dtype=torch.int64, device=DEV) * k
    return offsets, ids


_corpora: dict[str, Corpus] = {}
_CORPUS_SPECS = {  # name -> (Nd, Ld, seed); rerank stores are one per Nd
    **{f"rerank{nd}": (nd, S.rerank_ld, nd) for nd in S.rerank_nd},
    "scan": (S.scan_nd, S.scan_ld, 7),
    "candidates": (S.cand_store, S.cand_ld, 11),
}


def corpus(name: str) -> Corpus:
    """The named store, generated once and kept until :func:`drop_corpus`."""
    if name not in _corpora:
        nd, ld, seed = _CORPUS_SPECS[name]
        _corpora[name] = Corpus(*h.clustered_corpus(nd, ld, S.d, S.topics_per_doc, device=DEV, n_topics=S.n_topics,
                                                    seed=seed, chunk=S.corpus_chunk, dtype=DTYPE))
        sync()
    return _corpora[name]


def drop_corpus(name: str) -> None:
    _corpora.pop(name, None)
    if CUDA:
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------
# Peers (optional; each is skipped with a reason when it cannot run here)
# ------------------------------------------------------------------------------------------

_PEER_MODULES = {"lik": "late_interaction_kernels", "colpali": "colpali_engine.utils.processing_utils",
                 "fast_plaid": "fast_plaid.search"}
_PEER_DISTS = {"lik": "late-interaction-kernels", "colpali": "colpali-engine", "fast_plaid": "fast-plaid"}
_GPU_ONLY = {"lik", "fast_plaid"}  # their kernels need CUDA; colpali's torch path runs anywhere
# SMOKE_PEERS=1 tries them on the CPU anyway (Triton peers then run in the interpreter): it
# checks our calling code against the installed peer versions; their numbers mean nothing.
PEERS_ON_CPU = os.environ.get("SMOKE_PEERS", "").strip() not in ("", "0")


def peer(name: str, section: str):
    """The peer's module, or None after recording why it is skipped."""
    if name in _GPU_ONLY and not CUDA and not PEERS_ON_CPU:
        R.rec(section=section, impl=name, skipped="needs CUDA")
        return None
    from colgraph_engine._kernels_name import load_installed_kernels
    load_installed_kernels()  # the checkout's root is on sys.path: keep its kernels/ from hiding transformers'
    try:
        return importlib.import_module(_PEER_MODULES[name])
    except Exception as exc:  # not installed, or a missing dependency of it
        R.rec(section=section, impl=name, skipped=f"import failed: {exc!r}"[:300])
        return None


def varlen_caller(lik):
    """A ``f(qv, qo, dv, do) -> [Nq, Nd]`` over ``lik.maxsim_varlen``, or a reason it can't be built.

    Matches the installed signature by parameter names: two packed tensors, then cumulative
    offsets (``cu_seqlens_*``) for queries and documents, optional ``max_seqlen_*``."""
    fn = getattr(lik, "maxsim_varlen", None)
    if fn is None:
        return None, "late_interaction_kernels has no maxsim_varlen"
    names = list(inspect.signature(fn).parameters)
    cu = [n for n in names if "cu" in n.lower() or ("seqlen" in n.lower() and "max" not in n.lower())]
    mx = [n for n in names if "max" in n.lower()]
    data = [n for n in names if n not in cu and n not in mx][:2]
    if len(data) != 2 or len(cu) != 2:
        return None, f"unrecognised signature maxsim_varlen{inspect.signature(fn)}"
    cu_q = next((n for n in cu if n.lower().endswith("q")), cu[0])
    cu_d = cu[1] if cu_q == cu[0] else cu[0]
    max_q = next((n for n in mx if n.lower().endswith("q")), None)
    max_d = next((n for n in mx if n.lower().endswith("d")), None)

    def call(qv, qo, dv, do, lq, ld):
        kw = {data[0]: qv, data[1]: dv, cu_q: qo, cu_d: do}
        if max_q and max_d:
            kw.update({max_q: lq, max_d: ld})
        return fn(**kw)
    return call, str(inspect.signature(fn))


def timed_row(section: str, name: str, fn, shape: dict, cost: tuple[int, int], ref=None, *, per: int = 1,
              rep_ms: int = 200, **extra) -> float | None:
    """One measured row: `fn()` compared with `ref` first (``rel_diff_vs_ours``), then timed, with
    its rates at ``cost = (bytes read, flops)``. Returns ms per `per` queries, or None when it
    raised (recorded as its error). ``per > 1`` adds ``ms_per_query``."""
    try:
        diff = {} if ref is None else dict(rel_diff_vs_ours=max_rel_diff(fn(), ref))
        ms = bench_ms(fn, rep_ms)
    except Exception as exc:  # a peer that fails here leaves the other rows
        R.error(section, name, exc, **shape)
        return None
    per_q = dict(ms_per_query=round(ms / per, 4)) if per > 1 else {}
    R.rec(section=section, impl=name, **shape, **rates(ms, *cost), **per_q, **diff, **extra)
    return ms / per


def record_ratio(section: str, ms_by: dict, shape: dict) -> None:
    """Speed-up of each of our entries over the fastest peer (> 1: ours is faster)."""
    ms_by = {k: v for k, v in ms_by.items() if v is not None}  # failed rows were recorded as errors
    peers = {k: v for k, v in ms_by.items() if not k.startswith("ours")}
    if not peers:
        R.rec(section=section, what="ratio", note="no peer measured", **shape)
        return
    best = min(peers, key=peers.get)
    ratios = {f"speedup[{k}]": round(peers[best] / v, 3) for k, v in ms_by.items() if k.startswith("ours")}
    R.rec(section=section, what="ratio", best_peer=best, best_peer_ms=round(peers[best], 4), **shape, **ratios)


# ------------------------------------------------------------------------------------------
# Sections: env, ceilings, correctness
# ------------------------------------------------------------------------------------------

def section_env() -> None:
    """GPU, versions, and which of our backends can run."""
    info = dict(section="env", smoke=SMOKE, device=str(DEV), torch=torch.__version__,
                triton=triton.__version__, python=platform.python_version(),
                colgraph_engine=cg.__version__, colgraph_engine_from=os.path.dirname(cg.__file__),
                kernels_from=km.__file__, budget_s=BUDGET_S, headline=HEADLINE, backends=cg.backends())
    if CUDA:
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, mem_gib=round(p.total_memory / 2**30, 1),
                    cuda=torch.version.cuda)
    R.rec(**info, **{f"{key}_version": h.version(dist) for key, dist in _PEER_DISTS.items()})


def section_ceilings() -> None:
    """What the machine can do at best: copy bandwidth and bf16 matmul rate."""
    if not CUDA:
        R.rec(section="ceilings", skipped="needs CUDA")
        return
    n, m = 1 << 30, 8192  # 2 GiB of bf16 each way: far past L2
    ms = copy_ms(n)
    R.rec(section="ceilings", what="d2d_copy", TBps=round(2 * n * 2 / (ms * 1e-3) / 1e12, 3), ms=round(ms, 4))
    ms = matmul_ms(m)
    R.rec(section="ceilings", what="bf16_matmul_8192", TFLOPs=round(2 * m**3 / (ms * 1e-3) / 1e12, 1), ms=round(ms, 4))
    torch.cuda.empty_cache()


def copy_ms(n: int) -> float:
    """ms of one device-to-device copy of `n` bf16 values (its buffers freed on return)."""
    src = torch.empty(n, device=DEV, dtype=DTYPE).normal_()
    dst = torch.empty_like(src)
    return bench_ms(lambda: dst.copy_(src))


def matmul_ms(m: int) -> float:
    """ms of one bf16 ``[m, m] @ [m, m]``."""
    a = torch.randn(m, m, device=DEV, dtype=DTYPE)
    b = torch.randn(m, m, device=DEV, dtype=DTYPE)
    return bench_ms(lambda: a @ b, rep_ms=300)


def torch_in_dtype(q: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """The yardstick: MaxSim as plain torch computes it in the inputs' dtype.
    ``q [Nq, Lq, d]``, ``docs [N, Ld, d]`` -> ``[Nq, N]`` fp32 (similarities and maxima in
    bf16, the final sum in fp32, like the torch GEMM + amax peer)."""
    nq, lq, d = q.shape
    n, ld, _ = docs.shape
    sim = (q.reshape(nq * lq, d) @ docs.reshape(n * ld, d).T).view(nq, lq, n, ld)
    return sim.amax(-1).float().sum(1)


def check_cross(config: str, q: torch.Tensor, c: Corpus) -> torch.Tensor:
    """Ours vs fp64 on the first `S.check_docs` documents; returns ours on all documents
    ``[Nq, Nd]`` (computed first so the autotuner sees the full-size problem)."""
    qv, qo = pack_queries(q)
    full = cg.maxsim(qv, qo, *c.packed(), backend=OURS)
    n = min(S.check_docs, c.docs.shape[0])
    sv, so = c.packed(0, n)
    ours = cg.maxsim(qv, qo, sv, so, backend=OURS).double()
    exact = reference.maxsim_cross_reference(qv, qo, sv, so, acc_dtype=torch.float64)
    plain = torch_in_dtype(q, c.docs[:n]).double()
    scale = float(exact.abs().max().clamp_min(1e-30))
    err, err_torch = float((ours - exact).abs().max()), float((plain - exact).abs().max())
    # DESIGN.md's yardstick: at most ~2x the error of torch in the input dtype.
    same_sub = float((full[:, :n].double() - ours).abs().max())  # same kernel, same pairs: expect 0
    ok = (err <= 2 * err_torch + 1e-6 * scale and same_sub <= 1e-5 * scale
          and bool(torch.isfinite(full).all()))
    R.check(config, "cross_vs_fp64", ok, docs=n, max_abs_err=err, max_rel_err=err / scale,
            torch_bf16_max_rel_err=err_torch / scale, full_vs_subset_max_abs=same_sub)
    return full


def check_candidates(config: str, q: torch.Tensor, c: Corpus, full: torch.Tensor,
                     co: torch.Tensor, ci: torch.Tensor) -> None:
    """Ours per-pair scores vs the cross scores gathered at the same (query, doc) pairs, and on
    the first queries vs the fp64 candidates reference."""
    qv, qo = pack_queries(q)
    dv, do = c.packed()
    got = cg.maxsim_candidates(qv, qo, dv, do, co, ci, backend=OURS)
    want = full[torch.repeat_interleave(torch.arange(q.shape[0], device=DEV), co.diff()), ci]
    scale = float(want.abs().max().clamp_min(1e-30))
    diff = float((got - want).abs().max()) if got.numel() else 0.0
    nq_ref = min(2, q.shape[0])
    cut = int(co[nq_ref])
    exact = reference.maxsim_candidates_reference(qv[:int(qo[nq_ref])], qo[:nq_ref + 1], dv, do, co[:nq_ref + 1],
                                                  ci[:cut], acc_dtype=torch.float64)
    err = float((got[:cut].double() - exact).abs().max()) if cut else 0.0
    ok = diff <= 1e-5 * scale and err <= 1e-4 * scale and bool(torch.isfinite(got).all())
    R.check(config, "candidates_vs_cross_gathered", ok, pairs=int(ci.numel()), max_abs_diff=diff,
            bit_equal=diff == 0.0, fp64_queries=nq_ref, fp64_max_rel_err=err / scale)


def topk_agreement(scores: torch.Tensor, idx: torch.Tensor, full: torch.Tensor, k: int, tol: float) -> dict:
    """Whether ``(scores, idx) [Nq, k]`` is a top-k of ``full [Nq, Nd]`` up to ties.

    Every document strictly above torch.topk's k-th score (by more than `tol`) must be
    returned; every returned document must reach the k-th score (within `tol`); returned
    scores must equal the cross scores of the returned ids."""
    ref_s, ref_i = torch.topk(full, k, dim=1)
    kth = ref_s[:, -1:]
    returned = torch.zeros_like(full, dtype=torch.bool).scatter_(1, idx, True)
    missed = int(((full > kth + tol) & ~returned).sum())
    too_low = int((full.gather(1, idx) < kth - tol).sum())
    score_err = float((scores - full.gather(1, idx)).abs().max())
    dup = int(sum(len(set(r)) != len(r) for r in idx.tolist()))
    overlap = sum(len(set(a) & set(b)) for a, b in zip(idx.tolist(), ref_i.tolist())) / idx.numel()
    ok = missed == 0 and too_low == 0 and score_err <= tol and dup == 0
    return dict(ok=ok, missed=missed, below_kth=too_low, score_max_abs_err=score_err, duplicates=dup,
                raw_set_overlap=round(overlap, 4))


def check_topk(config: str, q: torch.Tensor, c: Corpus, full: torch.Tensor) -> None:
    k = min(S.k, c.docs.shape[0])
    scores, idx = cg.maxsim_topk(*pack_queries(q), *c.packed(), k, chunk_docs=S.scan_chunk_docs, backend=OURS)
    res = topk_agreement(scores, idx, full, k, tol=1e-5 * float(full.abs().max().clamp_min(1.0)))
    R.check(config, "topk_vs_torch_topk", res.pop("ok"), k=k, chunk_docs=S.scan_chunk_docs, **res)


def correctness_configs():
    """(label, store name, Nq), the largest problem of each autotune key first: the kernels'
    autotune key ignores the problem size, so the first call picks the config for all. The
    candidates run first: their 64 queries x 1,000 candidates fill every bucket (8, 4, 2, 1
    queries per item), where a 1-query list would tune buckets 8-2 on empty work lists."""
    if "candidates" in WANTED:
        yield f"candidates nq={S.cand_nq}", "candidates", S.cand_nq
    for nq in sorted(S.scan_nq, reverse=True) if "scan" in WANTED else ():
        yield f"scan nq={nq}", "scan", nq
    for nd in S.rerank_nd if WANTED & {"rerank", "store"} else ():
        for nq in S.rerank_nq:
            yield f"rerank nq={nq} nd={nd}", f"rerank{nd}", nq


def section_correctness() -> None:
    """Every benchmarked shape, checked on this device before anything is timed."""
    for label, store, nq in correctness_configs():
        if R.out_of_time("correctness", label, 20):
            continue
        c = corpus(store)
        nd = c.docs.shape[0]
        target, q = c.queries(nq, seed=1000 + nq)
        full = check_cross(label, q, c)
        co, ci = make_candidates(target, nd, min(S.cand_k if store == "candidates" else 100, nd), seed=nq)
        check_candidates(label, q, c, full, co, ci)
        check_topk(label, q, c, full)
        del full
    sync()


# ------------------------------------------------------------------------------------------
# Sections: store, rerank, scan
# ------------------------------------------------------------------------------------------

def compiled_kernels() -> dict:
    """Kernels compiled so far in this process (per Triton kernel), and autotuned keys."""
    out = {}
    for name, k in (("cross", km._cross_kernel), ("candidates", km._candidates_kernel)):
        caches = getattr(k.fn, "device_caches", None)  # absent under the interpreter
        out[name] = None if caches is None else sum(len(c[0]) for c in caches.values())
        out[f"{name}_tuned_keys"] = len(getattr(k, "cache", {}))
    out["total"] = sum(v for key, v in out.items() if not key.endswith("keys") and v is not None)
    return out


def host_waits(calls: dict) -> dict:
    """``{name: "none" | "synchronised: ..."}``: each call run once under
    ``torch.cuda.set_sync_debug_mode("error")``, which raises on a synchronising CUDA call."""
    waits = {}
    for name, fn in calls.items():
        torch.cuda.set_sync_debug_mode("error")
        try:
            fn()
            waits[name] = "none"
        except RuntimeError as exc:
            waits[name] = f"synchronised: {exc}"[:200]
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return waits


def section_store() -> None:
    """1 query x 1,024 documents through ``PackedStore.search`` (the target's public path):
    warm-up time, whether any call synchronises, eager latency, host time to enqueue one call,
    and the same search through :class:`GraphedSearch` (recorded once in a CUDA graph and
    replayed: possible only because nothing on the path waits for the device)."""
    nd = S.rerank_nd[0]
    c = corpus(f"rerank{nd}")
    dv, do = c.packed()
    store = cg.PackedStore(S.d, DTYPE, str(DEV))
    store.add((dv, do.to(DEV)))
    t = time.time()
    spent = store.warmup(query_lengths=(S.lq,), n_queries=(1,), candidates_per_query=min(64, nd), backend=OURS)
    sync()
    shape = dict(nq=1, nd=nd, lq=S.lq, ld=S.rerank_ld, d=S.d, k=S.k)
    R.rec(section="store", what="warmup", s=round(time.time() - t, 2), **{k: round(v, 2) for k, v in spent.items()})
    qv, qo = pack_queries(c.queries(1, seed=5000)[1])
    qo_host = qo.cpu()
    cand = (torch.tensor([0, min(64, nd)]), torch.arange(min(64, nd), dtype=torch.int64))

    def search():
        return store.search(qv, qo_host, k=S.k, backend=OURS, assume_finite=True)

    def candidates():
        return store.score_candidates(qv, qo_host, *cand, backend=OURS, assume_finite=True)
    search()
    candidates()
    sync()
    if CUDA:
        waits = host_waits({"search": search, "score_candidates": candidates})
        R.check("store", "no_host_waits", all(v == "none" for v in waits.values()), **waits)
    cost = cross_cost(1, S.lq, nd, S.rerank_ld, S.d)
    ms = timed_row("store", "ours PackedStore.search", search, shape, cost)
    R.rec(section="store", what="host_enqueue_ms", **host_ms(search), **shape)
    fast = GraphedSearch(store, n_queries=1, query_len=S.lq, k=S.k, backend=OURS)
    got, want = fast(qv), search()
    R.check("store", "graphed_search_equals_search", torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]),
            uses_graph=fast.uses_graph)
    graph_ms = bench_ms(lambda: fast(qv))
    R.rec(section="store", impl="ours GraphedSearch" + (" (CUDA graph replay)" if fast.uses_graph else " (eager)"),
          **shape, **rates(graph_ms, *cost), speedup_vs_eager=round(ms / graph_ms, 3) if ms else None)
    R.rec(section="store", what="host_enqueue_ms_graphed", **host_ms(lambda: fast(qv)), **shape)


def rerank_impls(q: torch.Tensor, c: Corpus):
    """(name, zero-argument callable) of every implementation that can run here.
    ``q [Nq, Lq, d]``; each callable returns the ``[Nq, Nd]`` scores."""
    qv, qo = pack_queries(q)
    dv, do = c.packed()
    nq, nd = q.shape[0], c.docs.shape[0]
    yield "ours cg.maxsim", lambda: cg.maxsim(qv, qo, dv, do, backend=OURS)
    lengths = [S.lq] * nq  # the launcher plans from host lengths, as the store passes them
    yield "ours km.maxsim_cross", lambda: km.maxsim_cross(qv, qo, dv, do, q_lengths=lengths)
    lik = peer("lik", "rerank")
    if lik is not None:
        yield "lik.maxsim", lambda: lik.maxsim(q, c.docs)
        call, sig = varlen_caller(lik)
        if call is None:
            R.rec(section="rerank", impl="lik.maxsim_varlen", skipped=sig)
        else:
            qo32, do32 = qo.to(torch.int32), do.to(torch.int32)  # its native offsets: no cast in the timing
            yield "lik.maxsim_varlen", lambda: call(qv, qo32, dv, do32, S.lq, S.rerank_ld)
    if nq * nd <= (1024 if HEADLINE else 32 * 8192):
        colpali = peer("colpali", "rerank")
        if colpali is not None:
            # Releases with a scores-backend switch read this; 0.3.18 has none (always torch einsum).
            os.environ["COLPALI_SCORES_BACKEND"] = "torch"
            P = colpali.BaseVisualRetrieverProcessor
            q_list, d_list = list(q), list(c.docs)
            yield "colpali score_multi_vector[torch]", lambda: P.score_multi_vector(q_list, d_list, device=DEV)
    yield "torch GEMM+amax", lambda: torch_in_dtype(q, c.docs)


def section_rerank() -> None:
    """[Nq, Nd] cross scores; speed ratio of ours against the fastest peer per shape."""
    for nd in S.rerank_nd:
        c = corpus(f"rerank{nd}")
        for nq in S.rerank_nq:
            if R.out_of_time("rerank", f"nq={nq} nd={nd}", 15):
                continue
            q = c.queries(nq, seed=2000 + nq)[1]
            shape = dict(nq=nq, nd=nd, lq=S.lq, ld=S.rerank_ld, d=S.d)
            ours_first = cg.maxsim(*pack_queries(q), *c.packed(), backend=OURS)
            ms_by = {}
            for name, fn in rerank_impls(q, c):
                if R.out_of_time("rerank", name, 5, **shape):
                    continue
                ms = timed_row("rerank", name, fn, shape, cross_cost(nq, S.lq, nd, S.rerank_ld, S.d), ours_first)
                if ms is not None:
                    ms_by[name] = ms
            record_ratio("rerank", ms_by, shape)
        drop_corpus(f"rerank{nd}")


def section_scan() -> None:
    """Exact top-k over the whole store: the brute-force bar a prefilter has to beat."""
    c = corpus("scan")
    dv, do = c.packed()
    nd = c.docs.shape[0]
    k = min(S.k, nd)
    lik = peer("lik", "scan")
    for nq in S.scan_nq:
        if R.out_of_time("scan", f"nq={nq}", 20):
            continue
        target, q = c.queries(nq, seed=3000 + nq)
        qv, qo = pack_queries(q)
        shape = dict(nq=nq, nd=nd, lq=S.lq, ld=S.scan_ld, d=S.d, k=k)
        cost = cross_cost(nq, S.lq, nd, S.scan_ld, S.d)

        def ours():
            return cg.maxsim_topk(qv, qo, dv, do, k, chunk_docs=S.scan_chunk_docs, backend=OURS)
        idx = ours()[1]
        ms_by = {"ours cg.maxsim_topk": timed_row("scan", "ours cg.maxsim_topk", ours, shape, cost, rep_ms=100,
                                                  hit1=hit_at_1(idx, target), chunk_docs=S.scan_chunk_docs)}
        if lik is not None:
            def theirs():
                return h.call_supported(lik.retrieve, q, c.docs, top_k=k, chunk=8192, normalize=False)
            res = R.guarded("scan", "lik.retrieve", theirs, **shape)
            if res is not None:
                ms_by["lik.retrieve"] = timed_row("scan", "lik.retrieve", theirs, shape, cost, rep_ms=100,
                                                  hit1=hit_at_1(res[1], target), recall_ours_vs_lik=recall(idx, res[1]))
        record_ratio("scan", ms_by, shape)
    drop_corpus("scan")


# ------------------------------------------------------------------------------------------
# Section: candidates
# ------------------------------------------------------------------------------------------

@dataclass
class Candidates:
    """The candidates workload: ``q [Nq, Lq, d]``, each query's `kc` candidates ``(co [Nq+1], ci
    [Nq*kc])`` in store `c`, ``ours [Nq*kc]`` our scores, and `shape` / `cost` for the records."""
    c: Corpus
    q: torch.Tensor
    target: torch.Tensor
    co: torch.Tensor
    ci: torch.Tensor
    kc: int
    ours: torch.Tensor
    shape: dict
    cost: tuple


def section_candidates() -> None:
    """Each query scores only its own candidates (the graph-linked images in ColGraphRAG)."""
    c = corpus("candidates")
    nd = c.docs.shape[0]
    nq, kc = S.cand_nq, min(S.cand_k, nd)
    target, q = c.queries(nq, seed=4000)
    co, ci = make_candidates(target, nd, kc, seed=4001)
    qv, qo = pack_queries(q)
    dv, do = c.packed()
    touched = int(torch.unique(ci).numel())
    shape = dict(nq=nq, cand_per_query=kc, store=nd, lq=S.lq, ld=S.cand_ld, d=S.d)
    cost = (2 * (touched * S.cand_ld * S.d + nq * S.lq * S.d),  # each touched document read once
            2 * ci.numel() * S.lq * S.cand_ld * S.d)
    w = Candidates(c, q, target, co, ci, kc, cg.maxsim_candidates(qv, qo, dv, do, co, ci, backend=OURS), shape, cost)
    best_local = w.ours.view(nq, kc).argmax(1)
    hit1 = round(float((ci.view(nq, kc).gather(1, best_local[:, None])[:, 0] == target).float().mean()), 4)
    ms_by = {}
    for name, fn in (("ours cg.maxsim_candidates", lambda: cg.maxsim_candidates(qv, qo, dv, do, co, ci, backend=OURS)),
                     ("ours km.maxsim_candidates", lambda: km.maxsim_candidates(
                         qv, qo, dv, do, co, ci, q_lengths=[S.lq] * nq, cand_counts=[kc] * nq))):
        ms_by[name] = timed_row("candidates", name, fn, shape, cost, per=nq, docs_touched=touched, hit1=hit1)
    lik = peer("lik", "candidates")
    later = []
    if lik is not None:
        ms_by["lik score_pairs_packed"] = R.guarded("candidates", "lik score_pairs_packed", lambda: lik_score_pairs(w))
        for n in S.lik_cand_nq:
            if n > nq:
                continue
            if n * kc * S.cand_ld * S.d >= 2**31:
                if HEADLINE:
                    R.rec(section="candidates", impl=f"lik gathered+maxsim ({n} q)",
                          skipped="HEADLINE: past 2^31 elements (faulted with an illegal memory access before)")
                else:
                    later.append(n)  # may fault the CUDA context: run after everything else
                continue
            ms_by[f"lik gathered+maxsim ({n} q)"] = lik_gathered(lik, w, n)
    if HEADLINE:
        R.rec(section="candidates", impl="fast_plaid.search(subset=)",
              skipped="HEADLINE: measured in the prefilter phase")
    else:
        ms_by["fast_plaid.search(subset=)"] = fast_plaid_subset(w)
    record_ratio("candidates", ms_by, dict(shape, unit="ms_per_query"))
    write_markdown()
    # Last of the whole run on purpose: a padded gather past 2^31 elements made
    # late-interaction-kernels fault with an illegal memory access, which leaves the CUDA
    # context unusable for anything after it.
    for n in later:
        lik_gathered(lik, w, n)


def lik_score_pairs(w: Candidates) -> float | None:
    """late-interaction-kernels' own pair-list kernel (packed inputs plus one (query, doc) index
    pair per score; the like-for-like peer of ``cg.maxsim_candidates``). Returns ms per query."""
    what = "lik score_pairs_packed"
    try:
        fn = importlib.import_module("late_interaction_kernels.score_pairs").score_pairs_packed
    except (ImportError, AttributeError) as exc:
        R.rec(section="candidates", impl=what, skipped=f"not in this version: {exc!r}"[:300])
        return None
    nq = w.q.shape[0]
    qv, qo = pack_queries(w.q)
    dv, do = w.c.packed()
    # Its native index types, converted outside the timing; exact max lengths avoid its D2H sync.
    qo32, do32 = qo.to(torch.int32), do.to(torch.int32)
    pair_q = torch.repeat_interleave(torch.arange(nq, device=DEV), w.co.diff()).to(torch.int32)
    pair_d = w.ci.to(torch.int32)

    def run():
        return h.call_supported(fn, qv, dv, qo32, do32, pair_q, pair_d, max_seqlen_q=S.lq, max_seqlen_d=S.cand_ld)
    return timed_row("candidates", what, run, w.shape, w.cost, w.ours, per=nq)


def lik_gathered(lik, w: Candidates, n: int) -> float | None:
    """late-interaction-kernels on candidates the way its API allows: gather the first `n`
    queries' candidates into a padded ``[n, K, Ld, d]`` tensor, then one KD-layout
    ``lik.maxsim(Q [n, Lq, d], D [n, K, Ld, d]) -> [n, K]``. Returns ms per query."""
    what = f"lik gathered+maxsim ({n} q)"
    ids = w.ci[:n * w.kc].view(n, w.kc)
    qn = w.q[:n].contiguous()
    ctx = dict(w.shape, nq=n, elements=n * w.kc * S.cand_ld * S.d)
    try:
        gathered = w.c.docs[ids]  # [n, K, Ld, d]
        scores = lik.maxsim(qn, gathered)
        sync()
        diff = max_rel_diff(scores.reshape(-1), w.ours[:n * w.kc])
        gather_ms = bench_ms(lambda: w.c.docs[ids])
        score_ms = bench_ms(lambda: lik.maxsim(qn, gathered))
    except Exception as exc:
        R.error("candidates", what, exc, **ctx)
        return None
    per_q = (gather_ms + score_ms) / n
    R.rec(section="candidates", impl=what, **ctx, gather_ms=round(gather_ms, 4), score_ms=round(score_ms, 4),
          ms_per_query=round(per_q, 4), rel_diff_vs_ours=diff)
    return per_q


def fast_plaid_subset(w: Candidates) -> float | None:
    """fast-plaid's ``search(..., subset=)``: a PLAID index (nbits=4) over the store, each query
    restricted to its candidate ids. Records ms per query, hit@1, recall@10 against our exact
    top-10 within the candidates, and whether candidates went unscored (dropped)."""
    what = "fast_plaid.search(subset=)"
    fp_mod = peer("fast_plaid", "candidates")
    if fp_mod is None or R.out_of_time("candidates", "fast_plaid", 60, **w.shape):
        return None
    nq, nd = w.q.shape[0], w.c.docs.shape[0]
    k = min(S.k, w.kc)
    subs = [row.tolist() for row in w.ci.view(nq, w.kc).cpu()]
    exact_ids = w.ci.view(nq, w.kc).gather(1, torch.topk(w.ours.view(nq, w.kc), k, dim=1).indices).cpu()
    qf = w.q.float()

    def search(queries, top_k, subset):
        return h.call_supported(index.search, queries_embeddings=queries, top_k=top_k, subset=subset,
                                show_progress=False)
    try:
        t = time.time()
        index = fp_mod.FastPlaid(index=tempfile.mkdtemp(prefix="fastplaid_"), device=str(DEV))
        h.call_supported(index.create, documents_embeddings=[w.c.docs[i].float() for i in range(nd)], nbits=4)
        sync()
        build_s = time.time() - t
        search(qf[:4], k, subs[:4])  # warm-up
        sync()
        t = time.time()
        res = search(qf, k, subs)
        sync()
        per_q = (time.time() - t) * 1e3 / nq
        got = torch.tensor([[int(p) for p, _ in r] + [-1] * (k - len(r)) for r in res])
    except Exception as exc:
        R.error("candidates", what, exc, **w.shape)
        return None
    R.rec(section="candidates", impl=what, **w.shape, nbits=4, build_s=round(build_s, 1), ms_per_query=round(per_q, 4),
          hit1=hit_at_1(got, w.target.cpu()), recall10_vs_exact=recall(got, exact_ids))
    R.guarded("candidates", "fast_plaid dropped-candidates probe", lambda: fast_plaid_dropped(search, qf, subs, w.kc),
              **w.shape)
    return per_q


def fast_plaid_dropped(search, qf: torch.Tensor, subs: list, kc: int) -> None:
    """Asks fast-plaid for all `kc` candidates of each query: fewer back means its IVF probe
    left some candidates unscored (dropped) before the subset filter."""
    full = search(qf, kc, subs)
    returned = [len(r) for r in full]
    outside = sum(len({int(p) for p, _ in r} - set(s)) for r, s in zip(full, subs))
    R.rec(section="candidates", what="fast_plaid_dropped", asked_per_query=kc, returned_min=min(returned),
          returned_mean=round(sum(returned) / len(returned), 1), dropped_candidates=kc * len(subs) - sum(returned),
          ids_outside_subset=outside)


# ------------------------------------------------------------------------------------------
# Markdown
# ------------------------------------------------------------------------------------------

_SHAPE_KEYS = ("nq", "nd", "store", "cand_per_query", "lq", "ld", "d", "k")
_SKIP_KEYS = {"section", "impl", "what", "check", "config", "tb", "t_s", "ms", "TBps", "TFLOPs", "ok", "unit",
              *_SHAPE_KEYS}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k}={_fmt(x)}" for k, x in v.items())
    return str(v).replace("|", "\\|").replace("\n", " ")


def _cell(key: str):
    """A :func:`_harness.table` column: ``row[key]`` as :func:`_fmt` writes it, blank when absent."""
    return lambda r: _fmt(r.get(key, ""))


def _shape(r: dict) -> str:
    return " ".join(f"{k}={r[k]}" for k in _SHAPE_KEYS if k in r)


def _extras(r: dict) -> str:
    return "; ".join(f"{k}={_fmt(v)}" for k, v in r.items() if k not in _SKIP_KEYS)


def render_markdown(rows: list[dict], head: list[str]) -> str:
    """Title, `head` (the harness's environment lines), the env record, correctness verdicts,
    timings, ratios, other measurements, then errors and skips."""
    env = next((r for r in rows if r.get("section") == "env" and "torch" in r), None)
    envs = [f"* {k}: {_fmt(v)}" for k, v in env.items() if k not in ("section", "t_s")] if env else []
    other = [r for r in rows if "what" in r and r["what"] != "ratio" and r.get("section") != "ceilings"]
    parts = [
        ("Ceilings", [("what", "what"), ("TB/s", _cell("TBps")), ("TFLOP/s", _cell("TFLOPs")), ("ms", _cell("ms"))],
         [r for r in rows if r.get("section") == "ceilings" and "what" in r]),
        ("Correctness", [("config", "config"), ("check", "check"), ("ok", lambda r: "PASS" if r["ok"] else "**FAIL**"),
                         ("details", _extras)], [r for r in rows if "check" in r]),
        ("Speed", [("section", "section"), ("impl", "impl"), ("shape", _shape), ("ms", _cell("ms")),
                   ("TB/s", _cell("TBps")), ("TFLOP/s", _cell("TFLOPs")), ("notes", _extras)],
         [r for r in rows if ("ms" in r or "ms_per_query" in r) and "impl" in r and "error" not in r]),
        ("Ours vs the fastest peer (speed-up > 1: ours faster)", [("section", "section"), ("shape", _shape),
                                                                   ("details", _extras)],
         [r for r in rows if r.get("what") == "ratio"]),
        ("Other measurements", [("section", "section"), ("what", "what"), ("details", _extras)], other),
        ("Errors and skips", [("section", "section"), ("what", lambda r: r.get("impl", r.get("what", ""))),
                              ("shape", _shape), ("reason", lambda r: _fmt(r.get("error", r.get("skipped"))))],
         [r for r in rows if "error" in r or "skipped" in r]),
    ]
    lines = ["# colgraph_engine MaxSim on a GPU" + (" (SMOKE: CPU interpreter, timings meaningless)" if SMOKE else ""),
             "", *head, ""]
    lines += ["## Environment", "", *envs, ""] if envs else []
    for title, columns, part in parts:
        lines += h.table_section(title, columns, part)
    return "\n".join(lines)


ENV: dict = {}  # the harness's environment (commit, load, threads), read once in main()


def write_markdown() -> str:
    """Rewrites ``gpu_maxsim.md`` whole (after every section: an abort late in the run leaves it)."""
    text = render_markdown(R.rows, h.header(ENV, h.command_line()))
    path = os.path.join(OUT_DIR, "gpu_maxsim.md")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return text


# ------------------------------------------------------------------------------------------

SECTIONS = (("env", section_env), ("ceilings", section_ceilings), ("correctness", section_correctness),
            ("store", section_store), ("rerank", section_rerank), ("scan", section_scan),
            ("candidates", section_candidates))
# The budget: at most this many kernels compiled before the first timed section.
MAX_COMPILES_BEFORE_TIMING = 12


def main() -> int:
    global R, WANTED, ENV
    R = h.RecordLog(os.path.join(OUT_DIR, "gpu_maxsim.jsonl"), BUDGET_S, t0=T0)
    commit = os.environ.get("COLGRAPH_COMMIT")  # the device's copy has no .git: the caller names it
    ENV = h.env(**({"commit": commit} if commit else {}))
    wanted = os.environ.get("SECTIONS", ",".join(n for n, _ in SECTIONS)).split(",")
    WANTED = set(wanted)
    torch.manual_seed(0)
    with torch.no_grad():  # not inference_mode: peers may update tensors in place later
        for name, fn in SECTIONS:
            if name not in wanted:
                continue
            if name == "store":  # the first section that times our kernels
                n = compiled_kernels()
                R.rec(section="compiles", what="compiled_before_timing", **n,
                      within_budget=n["total"] <= MAX_COMPILES_BEFORE_TIMING, budget=MAX_COMPILES_BEFORE_TIMING)
            run_section(name, fn)
    R.rec(section="compiles", what="compiled_at_end", **compiled_kernels())
    times = {r["section"]: r["section_s"] for r in R.rows if "section_s" in r}
    print("section seconds: " + ", ".join(f"{k}={v}" for k, v in times.items()), flush=True)
    if "correctness" in wanted and not any("check" in r for r in R.rows):
        R.failed.append("no correctness check ran")
    R.rec(section="done", total_s=round(time.time() - T0, 1), failed_checks=R.failed)
    print("\n" + write_markdown())
    print(f"wrote {R.path} and {os.path.join(OUT_DIR, 'gpu_maxsim.md')}")
    if R.failed:
        print("CORRECTNESS FAILED: " + "; ".join(R.failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
