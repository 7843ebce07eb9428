"""Prefilter on a lent GPU: recall@10 against exact and QPS beside exact brute force (our store,
Triton) and fast-plaid (when importable), on the two corpora of ../shared/bench/peers_gpu.py.

Corpora (d = 128, bf16, clustered as there: 8,192 topics; 16 and 6 topics per document):
``10k x 1024`` (10,000 documents x 1,024 tokens) and ``100k x 128`` (100,000 x 128); 256 queries
of 32 tokens. Rows: exact brute force (``PackedStore.search``), our prefilter at PLAID's k = 10
defaults (exact stage: fused Triton decode-and-score kernel; and on the store's vectors), one
query at a time for latency, and fast-plaid 1.7 (``n_ivf_probe`` 8, ``n_full_scores`` 4096) when
``fast_plaid`` imports. Build time and bytes per token are recorded.

    python benchmarks/gpu_prefilter.py                # on the GPU machine; writes $OUT or results/
    python benchmarks/gpu_prefilter.py --quick        # CPU check: tiny corpora, same code path

Writes ``gpu_prefilter.{json,md}`` (``gpu_prefilter_quick.*`` with --quick) under ``$OUT`` when
set, else benchmarks/results/.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from colgraph_engine.index import PrefilterIndex  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402

FULL = [("10k x 1024", 10_000, 1024, 16), ("100k x 128", 100_000, 128, 6)]
QUICK = [("200 x 64", 200, 64, 16), ("1000 x 16", 1000, 16, 6)]


def make_corpus(nd, ld, d, tpd, device, n_topics=8192, noise=0.35, seed=0, chunk=2048):
    """``(topic centroids [n_topics, d], doc topics [nd, tpd], values [nd * ld, d] bf16)``."""
    g = torch.Generator(device=device).manual_seed(seed)
    cents = F.normalize(torch.randn(n_topics, d, device=device, generator=g), dim=-1)
    topics = torch.randint(0, n_topics, (nd, tpd), device=device, generator=g)
    out = torch.empty(nd * ld, d, device=device, dtype=torch.bfloat16)
    for a in range(0, nd, chunk):
        b = min(nd, a + chunk)
        pick = torch.gather(topics[a:b], 1, torch.randint(0, tpd, (b - a, ld), device=device, generator=g))
        x = cents[pick] + noise / d ** 0.5 * torch.randn(b - a, ld, d, device=device, generator=g)
        out[a * ld:b * ld] = F.normalize(x, dim=-1).reshape(-1, d).to(torch.bfloat16)
    return cents, topics, out


def make_queries(cents, topics, nq, lq, noise=0.5, seed=1):
    g = torch.Generator(device=cents.device).manual_seed(seed)
    nd, tpd = topics.shape
    target = torch.randint(0, nd, (nq,), device=cents.device, generator=g)
    pick = torch.gather(topics[target], 1, torch.randint(0, tpd, (nq, lq), device=cents.device, generator=g))
    q = F.normalize(cents[pick] + noise / cents.shape[1] ** 0.5 * torch.randn(nq, lq, cents.shape[1],
                                                                              device=cents.device, generator=g), dim=-1)
    return target, q.to(torch.bfloat16)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def clock(fn, device, repeats=3):
    fn()
    sync(device)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return best, out


def recall10(ids, exact):
    ids, exact = ids.cpu().tolist(), exact.cpu().tolist()
    return sum(len(set(a) & set(b)) for a, b in zip(ids, exact)) / (10 * len(exact))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nbits", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--queries", type=int, default=256)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    out_dir = pathlib.Path(os.environ.get("OUT") or HERE / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "gpu_prefilter_quick" if args.quick else "gpu_prefilter"
    rows = []

    def rec(**kw):
        rows.append(kw)
        print(json.dumps(kw), flush=True)
        (out_dir / f"{stem}.json").write_text(json.dumps({"device": str(device), "rows": rows}, indent=1) + "\n")

    nq = 16 if args.quick else args.queries
    for name, nd, ld, tpd in (QUICK if args.quick else FULL):
        cents, topics, values = make_corpus(nd, ld, 128, tpd, device, n_topics=512 if args.quick else 8192)
        offsets = torch.arange(nd + 1, device=device, dtype=torch.int64) * ld
        target, q = make_queries(cents, topics, nq, 32)
        qv, qo = q.reshape(-1, 128), torch.arange(nq + 1, dtype=torch.int64) * 32
        store = PackedStore(128, torch.bfloat16, device)
        store.add((values, offsets))
        store.warmup(query_lengths=(32,), n_queries=(1, nq), candidates_per_query=64)
        sec, (_, exact) = clock(lambda: store.search(qv, qo, k=10, assume_finite=True), device)
        one, _ = clock(lambda: store.search(qv[:32], qo[:2], k=10, assume_finite=True), device)
        rec(corpus=name, impl="exact brute force (store)", qps=nq / sec, ms_one_query=one * 1e3, recall10=1.0,
            hit1=float((exact[:, 0].cpu() == target.cpu()).float().mean()))
        for nbits in args.nbits:
            t = time.perf_counter()
            idx = PrefilterIndex.build(values, offsets, nbits=nbits, device=device)
            sync(device)
            build_s = time.perf_counter() - t
            bpt = idx.bytes_per_token()
            for where, extra in (("codes", {}), ("store", {"store": store})):
                sec, res = clock(lambda: idx.search(qv, qo, k=10, **extra), device)
                one, _ = clock(lambda: idx.search(qv[:32], qo[:2], k=10, **extra), device)
                rec(corpus=name, impl=f"prefilter nbits {nbits}, exact stage on {where} ({res.stats['backend']})",
                    qps=nq / sec, ms_one_query=one * 1e3, recall10=recall10(res.ids, exact),
                    hit1=float((res.ids[:, 0].cpu() == target.cpu()).float().mean()), build_s=build_s,
                    bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"],
                    centroids=idx.snapshot().n_centroids, stage_s=res.stats["seconds"])
            del idx
        try:
            from fast_plaid import search as fps
        except ImportError as exc:
            rec(corpus=name, impl="fast-plaid", skipped=f"not importable: {exc}")
        else:
            tmp = tempfile.mkdtemp()
            t = time.perf_counter()
            fp = fps.FastPlaid(index=tmp, device=str(device))
            fp.create(documents_embeddings=[values[i * ld:(i + 1) * ld].float() for i in range(nd)], nbits=4)
            build_s = time.perf_counter() - t
            qf = q.float()
            sec, res = clock(lambda: fp.search(queries_embeddings=qf, top_k=10, n_ivf_probe=8, n_full_scores=4096,
                                               show_progress=False), device, repeats=1)
            one, _ = clock(lambda: fp.search(queries_embeddings=qf[:1], top_k=10, n_ivf_probe=8, n_full_scores=4096,
                                             show_progress=False), device, repeats=1)
            got = torch.tensor([[p for p, _ in r][:10] + [-1] * (10 - len(r)) for r in res])
            rec(corpus=name, impl="fast-plaid nbits 4 (n_ivf_probe 8, n_full_scores 4096)", qps=nq / sec,
                ms_one_query=one * 1e3, recall10=recall10(got, exact), build_s=build_s,
                hit1=float((got[:, 0] == target.cpu()).float().mean()))
        del store, values
        if device.type == "cuda":
            torch.cuda.empty_cache()
    lines = [f"# Prefilter on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'the CPU (--quick check)'} "
             f"({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC)", "",
             f"{nq} queries of 32 tokens, d = 128, bf16 store. `x exact`: QPS over exact brute force's.", "",
             "| corpus | impl | recall@10 | hit@1 | QPS | x exact | 1-query ms | bytes/token | build s |",
             "|---|---|---|---|---|---|---|---|---|"]
    exact_qps = {r["corpus"]: r["qps"] for r in rows if r["impl"].startswith("exact")}
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['corpus']} | {r['impl']} | {r['skipped']} |||||||")
            continue
        lines.append(f"| {r['corpus']} | {r['impl']} | {r['recall10']:.3f} | {r['hit1']:.3f} | {r['qps']:.1f} | "
                     f"{r['qps'] / exact_qps[r['corpus']]:.2f} | {r['ms_one_query']:.2f} | "
                     f"{r.get('bytes_per_token', '')} | {r.get('build_s', 0):.1f} |")
    (out_dir / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
