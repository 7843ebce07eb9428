"""Prefilter on real token vectors: MMLongBench-Doc dev pages encoded by the offline MiniLM token
encoder, the dataset's questions as queries; recall@10 against exact brute force and QPS,
beside fast-plaid's CPU path when it imports.

    .venv/bin/python benchmarks/prefilter_pages.py [--data ../shared/data/mmlongbench-dev] [--nbits 2] [--sweep]

Pages: every page of every PDF whose text layer covers at least half of its pages (documents
without one would need OCR, 0.6 pages/s here: left out, and counted in the report). Questions:
all of the dataset's questions on those documents (answerable or not: they are queries here).
MiniLM (all-MiniLM-L6-v2, d = 384, 256 word pieces per page). The encoded vectors are cached
in ``benchmarks/.cache/prefilter_pages/`` (gitignored). Writes results/prefilter_pages.{md,json}.

``--sweep`` instead searches one built index over a grid of PLAID's settings and diagnoses where
the exact top-10 pages are lost (:mod:`_prefilter_sweep`); writes
results/prefilter_pages_sweep.{md,json,png} (about 12 minutes here).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from colgraph_engine.prefilter import PrefilterIndex  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402
from prefilter_report import latency_ms, load_fast_plaid, recall_at_10, timed  # noqa: E402

CACHE = HERE / ".cache" / "prefilter_pages"


def encode(data: pathlib.Path):
    """``(pages (values, offsets), queries (values, offsets), info)`` (cached)."""
    f = CACHE / "vectors.pt"
    if f.is_file():
        return torch.load(f)
    from colgraph_engine.encoders.minilm import MiniLMEncoder
    from colgraph_engine.eval.datasets import load_mmlongbench
    ds = load_mmlongbench(data)
    texts, kept, left = [], [], []
    for doc in ds.doc_ids:
        pages = ds.pages(doc)
        if sum(p.text_source == "layer" for p in pages) * 2 < len(pages):
            left.append(doc)
            continue
        kept.append(doc)
        texts += [p.text for p in pages]
    questions = [q.question for d in kept for q in ds.questions_for(d)]
    enc = MiniLMEncoder(batch_size=16)
    pv, po, _ = enc.encode_with_pooled(texts, progress=True)
    qv, qo, _ = enc.encode_with_pooled(questions)
    info = {"documents": len(kept), "documents_without_text_layer": len(left), "pages": len(texts),
            "questions": len(questions)}
    CACHE.mkdir(parents=True, exist_ok=True)
    out = ((pv.float(), po), (qv.float(), qo), info)
    torch.save(out, f)
    return out


def build_index(pv: torch.Tensor, po: torch.Tensor, nbits: int) -> tuple[PrefilterIndex, float]:
    """``(index, build seconds)``: the index both runs measure."""
    t = time.perf_counter()
    idx = PrefilterIndex.build(pv, po, nbits=nbits, max_points=1 << 16, progress=True)
    return idx, time.perf_counter() - t


def library_state() -> str:
    """The commit this checkout's library runs from, and whether ``colgraph_engine/`` differs from it."""
    git = ["git", "-C", str(HERE.parent)]
    try:
        head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "colgraph_engine"], capture_output=True,
                               text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"commit {head}, " + (f"uncommitted changes to {', '.join(changed)}" if changed
                                 else "colgraph_engine/ as committed")


def sweep(args, pv, po, qv, qo, info, store) -> int:
    """The ``--sweep`` run: :func:`_prefilter_sweep.run_sweep` on one built index, then the report."""
    import platform

    import _prefilter_sweep as sw
    from _impls import cpu_model
    library = library_state()  # before the run: the modules imported are the ones on disk now
    _, ex_i = store.search(qv, qo, k=10)
    idx, build_s = build_index(pv, po, args.nbits)
    rep = sw.run_sweep(idx, store, (pv, po), qv, qo, ex_i, log=lambda m: print(m, flush=True))
    rep["meta"] = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": f"python benchmarks/prefilter_pages.py --sweep --nbits {args.nbits}",
        "machine": f"{cpu_model()}, {len(os.sched_getaffinity(0))} usable cores, torch {torch.__version__}, "
                   f"Python {platform.python_version()}",
        "threads": args.threads, "build_s": build_s, "library": library, "questions": info["questions"],
        "info": info,
        "corpus": f"{info['documents']} documents with a text layer, {info['pages']:,} pages "
                  f"({pv.shape[0]:,} MiniLM tokens, d = {pv.shape[1]}), {info['questions']} questions "
                  f"({qv.shape[0]:,} tokens)."}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefilter_pages_sweep.json").write_text(json.dumps(rep, indent=1) + "\n")
    md = sw.to_markdown(rep)
    (args.out / "prefilter_pages_sweep.md").write_text(md)
    sw.plot(rep, args.out / "prefilter_pages_sweep.png")
    print(md)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=HERE.parent.parent / "shared" / "data" / "mmlongbench-dev")
    ap.add_argument("--nbits", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fast-plaid", default=str(HERE.parent / ".peers" / "fastplaid"))
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--sweep", action="store_true", help="the settings sweep instead of the comparison table")
    args = ap.parse_args(argv)
    if not (args.data / "samples.json").is_file():
        print(f"MMLongBench-Doc data not found at {args.data}; nothing written.")
        return 2
    torch.set_num_threads(args.threads)
    (pv, po), (qv, qo), info = encode(args.data)
    nq, d = qo.numel() - 1, pv.shape[1]
    queries = list(torch.split(qv, qo.diff().tolist()))
    store = PackedStore(d)
    store.add((pv, po))
    if args.sweep:
        return sweep(args, pv, po, qv, qo, info, store)
    rows = []
    sec, (_, ex_i) = timed(lambda: store.search(qv, qo, k=10), 2)
    rows.append(dict(impl="exact brute force (store, native)", qps=nq / sec, recall10=1.0,
                     latency_ms=latency_ms(lambda q: store.search([q], k=10), queries), bytes_per_token=4 * d))
    print(json.dumps(rows[-1]), flush=True)
    idx, build_s = build_index(pv, po, args.nbits)
    bpt = idx.bytes_per_token()
    for label, extra in (("codes", {}), ("store", {"store": store})):
        sec, res = timed(lambda: idx.search(qv, qo, k=10, **extra), 2)
        rows.append(dict(impl=f"ours: PLAID k<=10 defaults, exact stage on {label}", qps=nq / sec,
                         recall10=recall_at_10(res.ids.tolist(), ex_i),
                         latency_ms=latency_ms(lambda q: idx.search([q], k=10, **extra), queries),
                         bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"], build_s=build_s,
                         centroids=idx.snapshot().n_centroids, unit=idx.snapshot().unit))
        print(json.dumps(rows[-1]), flush=True)
    fp_search, fp_version, why = load_fast_plaid(args.fast_plaid)
    notes = [f"{info['documents']} documents with a text layer ({info['documents_without_text_layer']} without, left "
             f"out), {info['pages']} pages, {info['questions']} questions; MiniLM d = {d}; "
             f"{pv.shape[0]:,} page tokens, {qv.shape[0]:,} question tokens."]
    if fp_search is None:
        notes.append(f"fast-plaid not measured: {why}")
    else:
        tmp = tempfile.mkdtemp(prefix="fastplaid_pages_")
        t = time.perf_counter()
        fp = fp_search.FastPlaid(index=tmp, device="cpu")
        fp.create(documents_embeddings=list(torch.split(pv, po.diff().tolist())), nbits=args.nbits)
        fp_build = time.perf_counter() - t
        # fast-plaid takes a padded [Nq, L, d] batch: questions padded with zero vectors (a zero
        # token adds 0 to every document's score, so the ranking is the same)
        lmax = int(qo.diff().max())
        padded = torch.zeros(nq, lmax, d)
        for i, q in enumerate(queries):
            padded[i, :q.shape[0]] = q
        sec, res = timed(lambda: fp.search(queries_embeddings=padded, top_k=10, show_progress=False), 1)
        got = [[p for p, _ in r] for r in res]
        files = {f: os.path.getsize(os.path.join(tmp, f)) for f in os.listdir(tmp)}
        code_bytes = sum(v for f, v in files.items() if f.startswith(("merged_codes", "merged_residuals")) and f.endswith(".npy"))
        rows.append(dict(impl=f"fast-plaid {fp_version} (CPU), defaults", qps=nq / sec, recall10=recall_at_10(got, ex_i),
                         latency_ms=latency_ms(lambda q: fp.search(queries_embeddings=q[None], top_k=10,
                                                                   show_progress=False), queries),
                         bytes_per_token=code_bytes / pv.shape[0], build_s=fp_build))
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(tmp, ignore_errors=True)  # its index: hundreds of MB
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": f"python benchmarks/prefilter_pages.py --nbits {args.nbits}", "info": info}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefilter_pages.json").write_text(json.dumps({"meta": meta, "rows": rows, "notes": notes}, indent=1) + "\n")
    ex = rows[0]["qps"]
    lines = [f"# Prefilter on MiniLM page tokens, MMLongBench-Doc dev ({meta['date']})", "",
             f"Command: `{meta['command']}`; 2 shared CPU cores, torch threads {args.threads}; nbits {args.nbits}. "
             "recall@10 against exact brute force over all pages (cross-document); QPS: all questions in one call; "
             "latency: one question per call.", "",
             "| impl | recall@10 | QPS | x exact | 1-query ms | bytes/token (codes) | build s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['recall10']:.3f} | {r['qps']:.1f} | {r['qps'] / ex:.2f} | "
                     f"{r['latency_ms']:.1f} | {r['bytes_per_token']:.1f} | {r.get('build_s', 0):.1f} |")
    lines += ["", "## Notes", ""] + [f"* {n}" for n in notes]
    (args.out / "prefilter_pages.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
