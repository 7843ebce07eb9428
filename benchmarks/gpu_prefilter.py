"""Prefilter on a lent GPU, in one run: correctness against references, then recall@10 against
exact and QPS beside exact brute force and fast-plaid, on the corpora of ../shared/bench/peers_gpu.py.

Corpora (d = 128, bf16, built by the same generator and seeds as peers_gpu.py's fast-plaid
section: 8,192 topics, 16 and 6 topics per document; 256 queries of 32 tokens):
``100k x 128`` (100,000 documents x 128 tokens) and ``10k x 1024`` (10,000 x 1,024).

Sections (each one's failure is recorded and the run goes on):

* ``check``: fresh random inputs, poisoned outputs: the fused decode-and-score kernel against the
  float64 reference decode (every nbits, unit and raw); ``PackedStore.search`` against a float64
  brute force; relative errors and id agreement.
* ``copy``: host-to-device copy rate from pinned memory (the rate an exact scan over a corpus that
  no longer fits on the device is bounded by).
* per corpus (colsearch's fp16 GPU lane too with ``--colsearch DIR``): ground truth = exact MaxSim
  top-10 (late-interaction-kernels ``retrieve`` when it imports, as peers_gpu.py; else our store);
  rows: exact brute force (ours, and
  late-interaction-kernels), our prefilter at PLAID's k = 10 defaults for nbits 2 and 4 (exact
  stage on the codes, fused Triton kernel; and on the store's bf16 vectors), fast-plaid 1.7 nbits 4
  (``n_ivf_probe`` 8, ``n_full_scores`` 4096: peers_gpu.py's first setting). 256 queries in one
  call for QPS (median of 3 after a warm-up); one query at a time for latency (median over 16
  different queries, each synchronised). Build seconds, bytes per token, stage seconds.

    python benchmarks/gpu_prefilter.py                 # on the GPU machine
    python benchmarks/gpu_prefilter.py --quick         # CPU check: tiny corpora, same code path

Writes ``gpu_prefilter.{json,md}`` (``gpu_prefilter_quick.*`` with --quick) under ``--out``
(default $OUT when set, else benchmarks/results/), after every row. Environment: GPU_BUDGET_S
(default 480) skips what is left once spent, and says so.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import traceback

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
try:  # run_gpu.sh puts the installed layout (with colgraph_engine.kernels) on the path first
    importlib.import_module("colgraph_engine.kernels")
except ImportError:
    sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
from colgraph_engine.prefilter import PrefilterIndex, reference  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402

# (name, documents, tokens each, topics per document, corpus seed, query seed): peers_gpu.py's values
FULL = [("100k x 128", 100_000, 128, 6, 11, 12), ("10k x 1024", 10_000, 1024, 16, 11, 12)]
QUICK = [("1000 x 16", 1000, 16, 6, 11, 12), ("200 x 64", 200, 64, 16, 11, 12)]
T0 = time.perf_counter()
TENSOR_FIELDS = ("centroids", "cutoffs", "weights", "codes", "residuals", "offsets", "ids", "alive", "cells_offsets",
                 "cells", "ivf_offsets", "ivf_docs")
STAGES = ("centroids", "candidates", "pruned", "full", "exact")


def recall10(ids, exact):
    ids, exact = ids.cpu().tolist(), exact.cpu().tolist()
    return sum(len(set(a) & set(b)) for a, b in zip(ids, exact)) / (10 * len(exact))


def rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp_min(1e-30))


class Run:
    """The checks, rows and notes so far, written whole to ``--out`` after each one; the time budget."""

    def __init__(self, device, args):
        self.device, self.out, self.colsearch = device, args.out, args.colsearch
        self.stem = h.stem("gpu_prefilter", args)
        self.budget_s = float(os.environ.get("GPU_BUDGET_S", "480"))
        self.rows, self.checks, self.notes = [], [], []
        self.sync = h.synchronizer(device)
        self.env = h.env(device=torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu")

    def left(self):
        return self.budget_s - (time.perf_counter() - T0)

    def save(self, echo=False):
        data = {"elapsed_s": round(time.perf_counter() - T0, 1), "checks": self.checks, "rows": self.rows,
                "notes": self.notes}
        head = self.env["device"] if self.device.type == "cuda" else "the CPU (--quick check of the code path)"
        h.write_whole(self.stem, f"Prefilter on {head}", report_body(self), data, self.out, e=self.env, echo=echo)

    def row(self, **kw):
        self.rows.append({**kw, "t_s": round(time.perf_counter() - T0, 1)})
        print(json.dumps(self.rows[-1]), flush=True)
        self.save()

    def check(self, **kw):
        self.checks.append(kw)
        print("CHECK", json.dumps(kw), flush=True)
        self.save()

    def guard(self, what, fn, *a, **kw):
        """Runs one section; a failure is recorded with its traceback's tail and the run goes on."""
        if self.left() <= 0:
            self.notes.append(f"{what}: skipped, time budget spent")
            print("SKIP", what, flush=True)
            self.save()
            return None
        try:
            return fn(*a, **kw)
        except Exception as exc:  # noqa: BLE001 - a benchmark section must not end the run
            tb = traceback.format_exc()
            self.notes.append(f"{what}: FAILED {type(exc).__name__}: {exc}\n{tb[-1500:]}")
            print("FAILED", what, tb, flush=True)
            self.save()
            return None
        finally:
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def time_all(self, fn, repeats=3):
        """``(median seconds of `repeats` synchronised calls of fn(), the output of a first, untimed call)``."""
        out = fn()
        return statistics.median(h.time_each(lambda _: fn(), range(repeats), sync=self.sync)[1]), out

    def one_query_ms(self, fn, n):
        """Median milliseconds of ``fn(i)`` for i in 0..n-1 (different queries), each synchronised, after a warm-up."""
        fn(0)
        return statistics.median(h.time_each(fn, range(n), sync=self.sync)[1]) * 1e3

    def timed_row(self, corpus, impl, search_all, search_one, n_one, exact, target, *, repeats=3,
                  ids=lambda out: out[1], **extra):
        """Records a row: QPS of `search_all()` (all queries in one call), 1-query ms of
        `search_one(i)`, recall@10 of ``ids(search_all())`` [nq, 10] against `exact` (None: they are
        the exact ones) and hit@1 against `target`. Returns those ids."""
        sec, out = self.time_all(search_all, repeats)
        got = ids(out)
        one = self.one_query_ms(search_one, n_one)
        self.row(corpus=corpus, impl=impl, qps=got.shape[0] / sec, ms_one_query=one,
                 recall10=recall10(got, got if exact is None else exact),
                 hit1=float((got[:, 0].cpu() == target.cpu()).float().mean()), **extra)
        return got


# ------------------------------------------------------------------------------------------
# Sections
# ------------------------------------------------------------------------------------------

def section_check(run: Run, quick: bool = False):
    """Fused decode-and-score kernel vs the float64 reference decode; the store vs float64 MaxSim.
    `quick` (the CPU check, Triton interpreted): the same checks on a tenth of the tokens."""
    dev = run.device
    from colgraph_engine.kernels import prefilter as kp
    g = torch.Generator().manual_seed(int(time.time()) % 100000)  # fresh inputs each run
    n_docs, max_len, q_lens = (12, 30, (1, 5, 9, 17)) if quick else (40, 300, (1, 32, 33, 70))
    for nbits in (1, 2, 4):
        for unit in (True, False):
            lengths = torch.randint(0, max_len, (n_docs,), generator=g).tolist()
            docs = [F.normalize(torch.randn(n, 128, generator=g), dim=-1) for n in lengths]
            s = PrefilterIndex.build(docs, nbits=nbits, n_centroids=16 if quick else 64, device=dev,
                                     normalize_decoded=unit).snapshot()
            queries = [F.normalize(torch.randn(n, 128, generator=g), dim=-1) for n in q_lens]
            qv = torch.cat(queries).to(dev)
            qo = torch.tensor([0] + [q.shape[0] for q in queries]).cumsum(0).to(dev)
            pq = torch.arange(4).repeat_interleave(n_docs).to(dev)
            pd = torch.arange(n_docs).repeat(4).to(dev)
            out = kp.score_pairs(qv, qo, s.centroids, s.weights.to(dev), s.codes, s.residuals, s.offsets, pq, pd,
                                 nbits, unit=s.unit).cpu()
            ref_state = s.with_(**{f: getattr(s, f).cpu() for f in TENSOR_FIELDS})
            want = torch.tensor([reference.exact_score(ref_state, queries[q].double(), p)
                                 for q, p in zip(pq.tolist(), pd.tolist())], dtype=torch.float64)
            fin = torch.isfinite(want)
            ok_inf = bool(torch.equal(torch.isfinite(out), fin))
            err = rel_err(out[fin], want[fin])
            run.check(what="prefilter kernel vs float64 reference", nbits=nbits, unit=unit, pairs=int(pq.numel()),
                      rel_err=err, empty_docs_match=ok_inf, passed=ok_inf and err < 5e-3)
    # the store's exact top-10 against a float64 brute force
    nd, ld = (300, 16) if quick else (3000, 64)
    vals = F.normalize(torch.randn(nd * ld, 128, generator=g), dim=-1).to(torch.bfloat16)
    q = F.normalize(torch.randn(8 * 32, 128, generator=g), dim=-1).to(torch.bfloat16)
    store = PackedStore(128, torch.bfloat16, dev)
    store.add((vals.to(dev), torch.arange(nd + 1, dtype=torch.int64, device=dev) * ld))
    sc, ids = store.search(q, torch.arange(9, dtype=torch.int64) * 32, k=10)
    ref = torch.stack([(q[i * 32:(i + 1) * 32].double() @ vals.double().T).view(32, nd, ld).amax(2).sum(0)
                       for i in range(8)])
    rs, ri = torch.topk(ref, 10, dim=1)
    gap = float((rs - torch.gather(ref, 1, ids.cpu())).abs().max())
    run.check(what="store.search top-10 vs float64 brute force", docs=nd, queries=8,
              rel_err_scores=rel_err(sc.cpu(), rs), id_overlap=recall10(ids, ri), max_true_score_gap=gap,
              passed=gap < 0.05)


def section_copy(run: Run):
    dev = run.device
    if dev.type != "cuda":
        return
    host = torch.empty(1 << 30, dtype=torch.uint8).pin_memory()  # 1 GiB
    host.fill_(7)
    gpu = torch.empty_like(host, device=dev)
    sec, _ = run.time_all(lambda: gpu.copy_(host, non_blocking=True), repeats=5)
    run.row(corpus="-", impl="host-to-device copy, pinned, 1 GiB", gb_per_s=(1 << 30) / sec / 1e9)


def section_corpus(run: Run, name, nd, ld, tpd, cseed, qseed, nq, nbits_list, quick):
    dev = run.device
    # peers_gpu.py's generator: the same draws in the same order, so the same corpus per seed and device
    cents, topics, docs = h.clustered_corpus(nd, ld, 128, tpd, device=dev, n_topics=512 if quick else 8192, seed=cseed)
    values = docs.reshape(-1, 128)  # [nd * ld, d] bf16
    target, q = h.clustered_queries(cents, topics, nq, 32, seed=qseed)
    del cents, topics
    qv = q.reshape(-1, 128)
    qo = torch.arange(nq + 1, dtype=torch.int64) * 32
    n_one, exact, lik = min(16, nq), None, None
    try:
        import late_interaction_kernels as lik
    except ImportError as exc:
        run.notes.append(f"late-interaction-kernels not importable: {exc}")
    if lik is not None and dev.type == "cuda":
        D = values.view(nd, ld, 128)

        def lik_search(qq):
            return lik.retrieve(qq, D, top_k=10, chunk=8192, normalize=False)

        exact = run.timed_row(name, "exact brute force (late-interaction-kernels 0.4.5 retrieve)",
                              lambda: lik_search(q), lambda i: lik_search(q[i:i + 1]), n_one, None, target)
    store = PackedStore(128, torch.bfloat16, dev)
    store.add((values, torch.arange(nd + 1, dtype=torch.int64, device=dev) * ld))
    _, warm_s = h.timed(store.warmup, query_lengths=(32,), n_queries=(1, nq), candidates_per_query=64)
    ours = run.timed_row(name, "exact brute force (ours: PackedStore.search, Triton)",
                         lambda: store.search(qv, qo, k=10, assume_finite=True),
                         lambda i: store.search(qv[32 * i:32 * (i + 1)], qo[:2], k=10, assume_finite=True), n_one,
                         exact, target, warmup_s=warm_s)
    exact = ours if exact is None else exact
    for nbits in nbits_list:
        run.guard(f"{name} prefilter nbits {nbits}", prefilter_rows, run, name, values, nd, ld, qv, qo, nq, n_one,
                  nbits, store, exact, target)
    run.guard(f"{name} fast-plaid", fast_plaid_rows, run, name, values, nd, ld, q, n_one, exact, target)
    if run.colsearch:
        run.guard(f"{name} colsearch", colsearch_rows, run, name, values, nd, ld, q, n_one, exact, target)


def prefilter_rows(run, name, values, nd, ld, qv, qo, nq, n_one, nbits, store, exact, target):
    """Our prefilter at `nbits`: the exact stage on the codes and on the store (and, at 2 bits,
    PLAID's k <= 100 settings); all queries in one call (also with query blocks of 128), one
    query dense and sparse (their ids compared), the stages' seconds and counts."""
    from colgraph_engine.prefilter import search as _s
    dev = run.device
    offsets = torch.arange(nd + 1, device=dev, dtype=torch.int64) * ld
    t = time.perf_counter()
    idx = PrefilterIndex.build(values, offsets, nbits=nbits, device=dev)
    run.sync()
    build_s = time.perf_counter() - t
    bpt = idx.bytes_per_token()
    variants = [("codes", {}), ("store", {"store": store})]
    if nbits == 2:  # PLAID's k <= 100 settings: do more candidates lift recall from 2-bit codes?
        variants.append(("codes", {"ncells": 2, "centroid_score_threshold": 0.45, "ndocs": 1024}))
    for where, extra in variants:
        extra = dict(extra, assume_finite=True)

        def one(i, dense):
            return idx.search(qv[32 * i:32 * (i + 1)], qo[:2], k=10, dense=dense, **extra)

        sec, res = run.time_all(lambda: idx.search(qv, qo, k=10, **extra))
        block, _s.QUERY_BLOCK_GPU = _s.QUERY_BLOCK_GPU, 128  # a larger block, same run
        try:
            sec128, _ = run.time_all(lambda: idx.search(qv, qo, k=10, **extra))
        finally:
            _s.QUERY_BLOCK_GPU = block
        ms_dense = run.one_query_ms(lambda i: one(i, True), n_one)
        ms_sparse = run.one_query_ms(lambda i: one(i, False), n_one)
        r1 = one(0, True)
        same = [torch.equal(one(i, True).ids, one(i, False).ids) for i in range(n_one)]
        knobs = "" if "ndocs" not in extra else ", ncells 2, threshold 0.45, ndocs 1024"
        st = res.stats
        run.row(corpus=name, impl=f"prefilter nbits {nbits}{knobs}, exact stage on the {where} ({st['backend']})",
                ms_one_query_dense=ms_dense, one_query_dense=bool(r1.stats.get("dense")), qps_block128=nq / sec128,
                dense_ids_equal_sparse=f"{sum(same)}/{len(same)}", qps=nq / sec, ms_one_query=ms_sparse,
                recall10=recall10(res.ids, exact), hit1=float((res.ids[:, 0].cpu() == target.cpu()).float().mean()),
                build_s=build_s, bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"],
                centroids=idx.snapshot().n_centroids, stage_s=dict(st["seconds"]),
                one_query_stage_ms={k: v * 1e3 for k, v in r1.stats["seconds"].items()},
                one_query_stage_ms_sparse={k: v * 1e3 for k, v in one(0, False).stats["seconds"].items()},
                mean_candidates=statistics.mean(st["candidates"]), mean_shortlist=statistics.mean(st["shortlist"]),
                mean_scored_exactly=statistics.mean(st["scored_exactly"]))


def fast_plaid_rows(run, name, values, nd, ld, q, n_one, exact, target):
    try:
        from fast_plaid import search as fps
    except ImportError as exc:
        run.row(corpus=name, impl="fast-plaid", skipped=f"not importable: {exc}")
        return
    t = time.perf_counter()
    fp = fps.FastPlaid(index=tempfile.mkdtemp(), device=str(run.device))
    fp.create(documents_embeddings=[values[i * ld:(i + 1) * ld].float() for i in range(nd)], nbits=4)
    run.sync()
    build_s = time.perf_counter() - t
    qf = q.float()

    def go(qq):
        return fp.search(queries_embeddings=qq, top_k=10, n_ivf_probe=8, n_full_scores=4096, show_progress=False)

    run.timed_row(name, "fast-plaid 1.7 nbits 4 (n_ivf_probe 8, n_full_scores 4096)", lambda: go(qf),
                  lambda i: go(qf[i:i + 1]), n_one, exact, target, repeats=1, build_s=build_s,
                  ids=lambda res: torch.tensor([[p for p, _ in r][:10] + [-1] * (10 - len(r)) for r in res]))


def colsearch_rows(run, name, values, nd, ld, q, n_one, exact, target):
    """colsearch 0.1.7's GPU lane (fp16; ``benchmarks/_colsearch.py`` states the settings), when
    ``--colsearch DIR`` names a folder holding it (its builds train a router: minutes at 100k
    documents, so it is opt-in). On a GPU machine without a registry: carry the cp312 wheels
    colsearch 0.1.7, safetensors 0.8.0, latence_shard_engine 0.1.6 and threadpoolctl 3.8.0 (2.5 MB;
    faiss, h5py, bm25s are not needed by this lane) and unpack them into DIR with
    ``pip install --no-index --no-deps --target DIR``."""
    import _colsearch
    mod, version, why = _colsearch.load(run.colsearch)
    if mod is None:
        run.row(corpus=name, impl="colsearch", skipped=f"not importable: {why}")
        return
    dev = run.device
    hd, build_s = h.timed(_colsearch.build, values, torch.arange(nd + 1, dtype=torch.int64) * ld, str(dev),
                          tempfile.mkdtemp(), lane="fp16")
    run.timed_row(name, f"colsearch {version} fp16 ({'GPU' if dev.type == 'cuda' else 'CPU'} lane, n_shards 32)",
                  lambda: _colsearch.search(hd, q, 10), lambda i: _colsearch.search(hd, q[i:i + 1], 10), n_one,
                  exact, target, repeats=1, build_s=build_s, ids=lambda got: got)
    _colsearch.close(hd)


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

def _ms_list(d: dict, keys) -> str:
    return "/".join(f"{d.get(k, 0):.2f}" for k in keys)


def report_body(run: Run) -> list[str]:
    """The checks, the recall and throughput table (ratios to our exact brute force and to
    fast-plaid, same corpus, same run), the copy rate, the stage table and the notes."""
    exact_qps = {r["corpus"]: r["qps"] for r in run.rows if r["impl"].startswith("exact brute force (ours")}
    fp_qps = {r["corpus"]: r["qps"] for r in run.rows if r["impl"].startswith("fast-plaid") and "qps" in r}

    def over(qps: dict):
        return lambda r: f"{r['qps'] / qps[r['corpus']]:.2f}" if "qps" in r and r["corpus"] in qps else "-"

    def timed(fn):  # a skipped row leaves its cell empty
        return lambda r: "" if "skipped" in r else fn(r)

    checks = [("check", "what"),
              ("detail", lambda c: ", ".join(f"{k} {v:.2e}" if isinstance(v, float) else f"{k} {v}"
                                             for k, v in c.items() if k not in ("what", "passed"))),
              ("result", lambda c: "pass" if c["passed"] else "FAIL")]
    rows = [r for r in run.rows if "gb_per_s" not in r]
    recall = [("corpus", "corpus"), ("impl", "impl"),
              ("recall@10", lambda r: r["skipped"] if "skipped" in r else f"{r['recall10']:.3f}"),
              ("hit@1", timed(lambda r: f"{r.get('hit1', float('nan')):.3f}")),
              ("QPS", timed(lambda r: f"{r['qps']:.1f}")),
              ("x exact", timed(over(exact_qps))), ("x fast-plaid", timed(over(fp_qps))),
              ("1-query ms", timed(lambda r: f"{r['ms_one_query']:.2f}")),
              ("bytes/token", lambda r: str(r.get("bytes_per_token", "")) if "build_s" in r else ""),
              ("build s", lambda r: f"{r['build_s']:.1f}" if "build_s" in r else "")]
    lines = ["256 queries of 32 tokens (16 with --quick), d = 128, bf16 vectors, k = 10 at PLAID's defaults "
             "(ncells 1, threshold 0.5, ndocs 256). QPS: one call with all queries (median of 3); 1-query ms: "
             "median of 16 different queries, each synchronised. `x exact`: QPS over our exact brute force's; "
             "`x fast-plaid`: over fast-plaid's, same corpus, same run.", "", "## Correctness checks", "",
             *h.table(checks, run.checks), "", "## Recall and throughput", "", *h.table(recall, rows)]
    for r in run.rows:
        if "gb_per_s" in r:
            lines += ["", f"Host-to-device copy from pinned memory: {r['gb_per_s']:.1f} GB/s."]
    stage_rows = [r for r in run.rows if "stage_s" in r]
    if stage_rows:
        stages = [("corpus", "corpus"), ("impl", "impl"),
                  *[(k, lambda r, k=k: f"{r['stage_s'][k]:.4f}") for k in STAGES],
                  ("1 query sparse: c/cand/pruned/full/exact ms",
                   lambda r: _ms_list(r["one_query_stage_ms_sparse"], STAGES)),
                  ("1 query dense: c/dense/exact ms",
                   lambda r: _ms_list(r["one_query_stage_ms"], ("centroids", "dense", "exact"))),
                  ("1-query ms dense / sparse (median of 16)",
                   lambda r: f"{r['ms_one_query_dense']:.2f} / {r['ms_one_query']:.2f}"),
                  ("candidates / shortlist / scored per query",
                   lambda r: f"{r['mean_candidates']:.0f} / {r['mean_shortlist']:.0f} / "
                             f"{r['mean_scored_exactly']:.0f}")]
        lines += ["", "## Stage seconds (all queries, one call) and one query (ms)", "", *h.table(stages, stage_rows)]
    if run.notes:
        lines += ["", "## Notes", ""] + [f"* {n.splitlines()[0]}" for n in run.notes]
    return lines


def main(argv=None) -> int:
    ap = h.parser(__doc__, out=os.environ.get("OUT") or h.RESULTS)
    ap.add_argument("--nbits", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--only", choices=[c[0] for c in FULL + QUICK], default=None)
    ap.add_argument("--sections", default="check,copy,corpora")
    ap.add_argument("--colsearch", default="", help="a folder holding colsearch 0.1.7 and its dependencies "
                    "(benchmarks/_colsearch.py lists the wheels); empty: colsearch is not measured")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    run = Run(device, args)
    todo = args.sections.split(",")
    if "check" in todo:
        run.guard("check", section_check, run, args.quick)
    if "copy" in todo:
        run.guard("copy", section_copy, run)
    if "corpora" in todo:
        for spec in (QUICK if args.quick else FULL):
            if not args.only or spec[0] == args.only:
                run.guard(spec[0], section_corpus, run, *spec, 16 if args.quick else args.queries, args.nbits,
                          args.quick)
    run.save(echo=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
