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

import json
import pathlib
import sys
import time

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
from colgraph_engine.prefilter import PrefilterIndex  # noqa: E402
from colgraph_engine.store import PackedStore  # noqa: E402
from prefilter_report import fast_plaid_index, load_fast_plaid, measure  # noqa: E402

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


def library_state(e: dict) -> str:
    """The commit this checkout's library runs from, and whether the engine's files differ from it."""
    changed = [line[3:] for line in e["engine_changes_uncommitted"].splitlines() if line.strip()]
    return f"commit {e['commit']}, " + (f"uncommitted changes to {', '.join(changed)}" if changed
                                        else "colgraph_engine/ as committed")


def sweep(args, pv, po, qv, qo, info, store, e: dict) -> int:
    """The ``--sweep`` run: :func:`_prefilter_sweep.run_sweep` on one built index, then the report
    (`e`: :func:`_harness.env` read before the run, while the modules imported are the ones on disk)."""
    import _prefilter_sweep as sw
    _, ex_i = store.search(qv, qo, k=10)
    idx, build_s = build_index(pv, po, args.nbits)
    rep = sw.run_sweep(idx, store, (pv, po), qv, qo, ex_i, log=lambda m: print(m, flush=True))
    rep["meta"] = {
        "date": e["timestamp"], "command": h.command_line(),
        "machine": f"{e['cpu_model']}, {e['cpus_usable']} usable cores, torch {e['torch']}, Python {e['python']}",
        "threads": args.threads, "build_s": build_s, "library": library_state(e), "questions": info["questions"],
        "info": info,
        "corpus": f"{info['documents']} documents with a text layer, {info['pages']:,} pages "
                  f"({pv.shape[0]:,} MiniLM tokens, d = {pv.shape[1]}), {info['questions']} questions "
                  f"({qv.shape[0]:,} tokens)."}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prefilter_pages_sweep.json").write_text(json.dumps({"env": e, **rep}, indent=1, default=str) + "\n")
    md = sw.to_markdown(rep)
    (args.out / "prefilter_pages_sweep.md").write_text(md)
    sw.plot(rep, args.out / "prefilter_pages_sweep.png")
    print(md)
    return 0


def fast_plaid_row(fp_search, version, pv, po, qo, queries, exact_ids, nbits) -> dict:
    """fast-plaid at its defaults; it takes a padded ``[Nq, L, d]`` batch: questions padded with zero
    vectors (a zero token adds 0 to every document's score, so the ranking is the same)."""
    padded = torch.zeros(len(queries), int(qo.diff().max()), pv.shape[1])
    for i, q in enumerate(queries):
        padded[i, :q.shape[0]] = q
    with fast_plaid_index(fp_search, list(torch.split(pv, po.diff().tolist())), nbits) as (fp, build_s, code_bytes):
        return measure(f"fast-plaid {version} (CPU), defaults",
                       lambda: fp.search(queries_embeddings=padded, top_k=10, show_progress=False),
                       lambda q: fp.search(queries_embeddings=q[None], top_k=10, show_progress=False),
                       lambda r: [[p for p, _ in q] for q in r], queries, exact_ids, repeats=1,
                       bytes_per_token=code_bytes / pv.shape[0], build_s=build_s)[0]


def main(argv=None) -> int:
    ap = h.parser(__doc__, quick=False)
    ap.add_argument("--data", type=pathlib.Path, default=HERE.parent.parent / "shared" / "data" / "mmlongbench-dev")
    ap.add_argument("--nbits", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fast-plaid", default=str(HERE.parent / ".peers" / "fastplaid"))
    ap.add_argument("--sweep", action="store_true", help="the settings sweep instead of the comparison table")
    args = ap.parse_args(argv)
    if not (args.data / "samples.json").is_file():
        print(f"MMLongBench-Doc data not found at {args.data}; nothing written.")
        return 2
    torch.set_num_threads(args.threads)
    e = h.env()
    (pv, po), (qv, qo), info = encode(args.data)
    d = pv.shape[1]
    queries = list(torch.split(qv, qo.diff().tolist()))
    store = PackedStore(d)
    store.add((pv, po))
    if args.sweep:
        return sweep(args, pv, po, qv, qo, info, store, e)
    exact, (_, ex_i) = measure("exact brute force (store, native)", lambda: store.search(qv, qo, k=10),
                               lambda q: store.search([q], k=10), lambda r: r[1].tolist(), queries, None, repeats=2,
                               bytes_per_token=4 * d)
    rows = [exact]
    idx, build_s = build_index(pv, po, args.nbits)
    bpt = idx.bytes_per_token()
    for label, extra in (("codes", {}), ("store", {"store": store})):
        rows.append(measure(f"ours: PLAID k<=10 defaults, exact stage on {label}",
                            lambda: idx.search(qv, qo, k=10, **extra), lambda q: idx.search([q], k=10, **extra),
                            lambda r: r.ids.tolist(), queries, ex_i, repeats=2,
                            bytes_per_token=bpt["codes_and_residuals"], index_bytes_per_token=bpt["total"],
                            build_s=build_s, centroids=idx.snapshot().n_centroids, unit=idx.snapshot().unit)[0])
    fp_search, fp_version, why = load_fast_plaid(args.fast_plaid)
    notes = [f"{info['documents']} documents with a text layer ({info['documents_without_text_layer']} without, left "
             f"out), {info['pages']} pages, {info['questions']} questions; MiniLM d = {d}; "
             f"{pv.shape[0]:,} page tokens, {qv.shape[0]:,} question tokens."]
    if fp_search is None:
        notes.append(f"fast-plaid not measured: {why}")
    else:
        rows.append(fast_plaid_row(fp_search, fp_version, pv, po, qo, queries, ex_i, args.nbits))
    body = [f"Torch threads {args.threads}; nbits {args.nbits}. recall@10 against exact brute force over all pages "
            "(cross-document); QPS: all questions in one call; latency: one question per call.", "",
            *h.table([("impl", "impl"), ("recall@10", lambda r: f"{r['recall10']:.3f}"),
                      ("QPS", lambda r: f"{r['qps']:.1f}"), ("x exact", lambda r: f"{r['qps'] / exact['qps']:.2f}"),
                      ("1-query ms", lambda r: f"{r['latency_ms']:.1f}"),
                      ("bytes/token (codes)", lambda r: f"{r['bytes_per_token']:.1f}"),
                      ("build s", lambda r: f"{r.get('build_s', 0):.1f}")], rows),
            "", *h.section("Notes", notes)]
    h.write("prefilter_pages", f"Prefilter on MiniLM page tokens, MMLongBench-Doc dev ({e['timestamp']})", body,
            {"meta": {"info": info, "nbits": args.nbits}, "rows": rows, "notes": notes}, args.out, e=e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
