"""The retrieval pipeline's quality on real documents: MMLongBench-Doc dev, evidence pages.

Usage (from the repository root; reads ../shared/data/mmlongbench-dev, never copies it)::

    .venv/bin/python benchmarks/pipeline_quality.py                  # 24 documents, <= 10 pages each
    .venv/bin/python benchmarks/pipeline_quality.py --no-ocr         # skip OCR: scanned documents left out
    .venv/bin/python benchmarks/pipeline_quality.py --max-docs 0 --max-pages 0   # everything (hours on 2 cores)

Ingest: every PDF becomes one :class:`~colgraph_engine.kg.DocumentInput`; each kept page is one
``Section`` (its text layer; RapidOCR at scale 2 for pages whose layer has under 20 characters,
unless ``--no-ocr``) holding one image, the page rendered at ``--image-scale``, named
``page-<n>`` and captioned with the page text (so the page's *text view* is its text). A section
with an image is never merged or split, so segment ``s`` of a document is exactly one page.
Entities and relations come from the default offline extractor
(:class:`~colgraph_engine.kg.CooccurrenceExtractor`, no LLM).

Encoders (the quality report's vectors where it has them): tokens = MiniLM all-MiniLM-L6-v2 token
vectors, 256 pieces (``MiniLMEncoder().token_encoder()``, as ``quality_report.py``); text =
the same model's pooled vector over ``--text-length`` pieces (32: an entity's name and a
relation's endpoints and keywords lead their texts, and the text role is the dominant cost:
about 50 entities and relations per page); patches = EfficientNet-Lite0, ``--patch-grid``
(7: 49 patches per page). MiniLM and EfficientNet share no space, so the pipeline ranks images
by their text views (``visual_units="auto"`` resolves to ``text_view``); the patches serve only
queries with an image, and these questions have none.

Scale: all 55 documents (2,526 pages) take hours to extract and embed on 2 shared CPU cores, so
by default the run takes the first ``--max-docs`` (24) documents of samples.json and keeps at
most ``--max-pages`` (10) pages per document: every gold evidence page of its questions plus
seeded random distractor pages up to the cap (more when the gold pages alone exceed it). Every
variant, including plain MaxSim, ranks the same kept pages, so the haystack is smaller than the
real one and absolute recalls are higher than on whole documents; the comparison is the point.

Questions: every answerable dev question (at least one valid evidence page). Two corpora:
* per-document: each question is asked against an index of its own document only (as the
  quality report ranks pages within the question's PDF), so stage 1 recall is 1 by construction;
* open: one index over all documents; stage 1 must find the question's document.

Variants (same vectors, one run; ``VARIANTS``): (a) plain page MaxSim, question tokens vs page
segment tokens; (b) the default, ``retrieval="graph+chunks"`` (the graph adds to the chunk
ranking: :mod:`colgraph_engine.pipeline.graph_adds`); (c) ``retrieval="chunks"``; (d)
``retrieval="graph"`` as mKG-RAG states it, (f) with ``hops=0, filter="off"``, (m) with name
seeds; the default's hops 0 and 2 (g, h), filters off and mkg (i, j), lexical-only and
description seeds (k, l), graph weight 0.25 and 1 (n, o), and the pooled visual ranker (e).
``--variants gk`` runs a, b, c and the named letters only.

Context efficiency: the share of questions with a short gold answer (``short_answer``) whose
normalised answer occurs within the first 1,000 and 2,000 tokens of the rendered context.
Cross-page questions: two or more gold pages.

Retrieved evidence pages of a pipeline result: the evidence sources (segments -> their page) and
E_k (``page-<n>`` images), interleaved by rank (source 1, image 1, source 2, ...), repeats
dropped. Per-stage: S1 the gold document among the recalled documents; S4 a gold page touched
by the retrieved subgraph (segment and image nodes, and the provenance pages of entity nodes;
chunk nodes for ``"chunks"``); S5 a gold page image in E_k; S6 a gold page among the sources.

The built index is cached in ``benchmarks/.cache/pipeline_quality/`` (gitignored) with
``KnowledgeIndex.save`` / ``open``. Writes ``results/pipeline_quality.md``, ``.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import random
import re
import sys
import time
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_DATA = HERE.parent.parent / "shared" / "data" / "mmlongbench-dev"
CACHE = HERE / ".cache" / "pipeline_quality"
IMAGE_SOURCES = ("Chart", "Figure", "Image")
KS = (1, 5, 10)
GRAPH, CHUNKS, MKG, PLAIN = "b: graph+chunks", "c: chunks", "d: graph (mKG-RAG)", "a: page MaxSim"
H0, H2, POOLED = "g: graph+chunks hops=0", "h: graph+chunks hops=2", "e: graph+chunks, pooled visual"
VARIANTS = {  # name -> PipelineConfig changes (None: plain page MaxSim); b is the default config
    PLAIN: None,
    GRAPH: {},
    CHUNKS: {"retrieval": "chunks"},
    MKG: {"retrieval": "graph"},
    "f: graph (mKG-RAG) hops=0 filter=off": {"retrieval": "graph", "hops": 0, "filter": "off"},
    "m: graph (mKG-RAG), name seeds": {"retrieval": "graph", "seed_match": "names"},
    H0: {"hops": 0},
    H2: {"hops": 2},
    "i: graph+chunks filter=off": {"filter": "off"},
    "j: graph+chunks filter=mkg": {"filter": "mkg"},
    "k: graph+chunks name-token seeds": {"seed_match": "names"},
    "l: graph+chunks description seeds": {"seed_match": "descriptions"},
    "n: graph+chunks beta=0.25": {"graph_weight": 0.25},
    "o: graph+chunks beta=1": {"graph_weight": 1.0},
    POOLED: {"visual_ranker": "pooled"},
}
GROUPS = ("all", "image-bearing", "cross-page", "text-only")
BUDGETS = (1000, 2000)

# --------------------------------------------------------------------------- page mapping helpers

_PAGE_NAME = re.compile(r"^page-([1-9][0-9]*)$")


def page_image_name(number: int) -> str:
    """The image ref of a page: ``page-<n>`` (1-based)."""
    return f"page-{number}"


def page_of_image(name) -> int | None:
    """The page number in an image ref ``page-<n>``; None for any other name."""
    m = _PAGE_NAME.match(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


def page_document(doc_id: str, pages) -> object:
    """One :class:`DocumentInput` from rendered pages (``colgraph_engine.eval.Page``): one section
    per page with the page image ``page-<n>`` captioned with the page text."""
    from colgraph_engine.kg import DocumentInput, ImageInput, Section

    sections, images = [], []
    for p in pages:
        text = " ".join(p.text.split())  # the segment text is whitespace-joined; the caption equals it
        name = page_image_name(p.number)
        sections.append(Section(text, images=(name,), page=p.number))
        images.append(ImageInput(name, pixels=p.image, caption=text))
    return DocumentInput(doc_id, sections, images=images)


def segment_pages(graph) -> dict[int, int]:
    """``segment ordinal -> page number`` of a document graph built by :func:`page_document`
    (read from the segment's CONTAINS edge to its ``page-<n>`` image)."""
    from colgraph_engine.graph.kinds import EdgeKind, NodeKind

    first_segment = int(graph.nodes_of(NodeKind.SEGMENT)[0]) if graph.nodes_of(NodeKind.SEGMENT).size else 1
    out = {}
    for e in graph.edges_of(EdgeKind.CONTAINS).tolist():
        u, v = int(graph.edge_src[e]), int(graph.edge_dst[e])
        if graph.node_kind[u] == NodeKind.SEGMENT and graph.node_kind[v] == NodeKind.IMAGE:
            page = page_of_image(graph.node_name[v])
            if page is not None:
                out[u - first_segment] = page
    return out


class NodePages:
    """Pages ``{(doc_id, page)}`` a graph node stands for in one index: a segment its page, an
    image its ``page-<n>``, an entity (or table, region) the pages of its provenance segments."""

    def __init__(self, index):
        self.index = index
        self._seg: dict[str, dict[int, int]] = {}
        self._memo: dict[int, frozenset] = {}

    def segment_page(self, doc_id: str, ordinal: int) -> int | None:
        if doc_id not in self._seg:
            self._seg[doc_id] = segment_pages(self.index.document(doc_id))
        return self._seg[doc_id].get(int(ordinal))

    def __call__(self, node: int) -> frozenset:
        node = int(node)
        if node not in self._memo:
            d = self.index.describe_node(node)
            if d["kind"] == "image":
                p = page_of_image(d["name"])
                pages = [] if p is None else [p]
            elif d["kind"] == "document":
                pages = []
            else:
                pages = [self.segment_page(d["doc_id"], s) for s in d["segments"]]
            self._memo[node] = frozenset((d["doc_id"], p) for p in pages if p is not None)
        return self._memo[node]


def evidence_pages(result, node_pages: NodePages) -> tuple[list, list, list]:
    """``(interleaved, from sources, from images)`` ranked ``(doc_id, page)`` lists of a result:
    sources (segments) and E_k images (``page-<n>``) in rank order, interleaved source 1,
    image 1, source 2, ..., repeats dropped."""
    src = []
    for s in result.evidence.sources:
        src.extend(sorted(node_pages(s["node"])) if s["kind"] == "segment" else [])
    img = []
    for h in result.images:
        p = page_of_image(h.image if h.image is not None else h.name)
        if p is not None:
            img.append((h.doc_id, p))
    src, img = list(dict.fromkeys(src)), list(dict.fromkeys(img))
    merged = []
    for i in range(max(len(src), len(img))):
        merged += src[i:i + 1] + img[i:i + 1]
    return list(dict.fromkeys(merged)), src, img


# --------------------------------------------------------------------------- build

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    ap.add_argument("--max-pages", type=int, default=10, help="pages kept per document (0: all)")
    ap.add_argument("--max-docs", type=int, default=24, help="first documents of samples.json (0: all)")
    ap.add_argument("--no-ocr", action="store_true", help="no OCR: documents without a text layer are left out")
    ap.add_argument("--image-scale", type=float, default=0.75)
    ap.add_argument("--patch-grid", type=int, default=7, choices=(7, 14))
    ap.add_argument("--text-length", type=int, default=32, help="MiniLM pieces for the text (entity/relation) role")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    ap.add_argument("--name", default="pipeline_quality")
    ap.add_argument("--variants", default="", help="letters of the variants to run (a, b, c always run; default: all)")
    return ap.parse_args(argv)


def memoised(enc):
    """The same encoder with a per-text cache (pages' text views equal their segment texts, and
    every variant re-encodes the same questions)."""
    from colgraph_engine.encoders import Encoder

    cache: dict[str, object] = {}

    def fn(batch):
        missing = [t for t in dict.fromkeys(batch) if t not in cache]
        missing.sort(key=len)  # similar lengths share a batch: less padding, the same vectors
        if missing:
            got = enc(missing)
            cache.update(zip(missing, list(got)))
        out = [cache[t] for t in batch]
        return torch.stack(out) if enc.role == "text" else out

    return Encoder(fn, enc.name, enc.dim, enc.role)


def make_encoders(args):
    from colgraph_engine.encoders.efficientnet import EfficientNetPatchEncoder
    from colgraph_engine.encoders.minilm import MiniLMEncoder
    from colgraph_engine.kg import Encoders

    tokens = MiniLMEncoder(batch_size=16).token_encoder()
    text = MiniLMEncoder(max_length=args.text_length, batch_size=64).text_encoder()
    patches = EfficientNetPatchEncoder(grid=args.patch_grid).patch_encoder()
    return Encoders(text=memoised(text), tokens=memoised(tokens), patches=patches)


def select_pages(ds, doc: str, cap: int, rng: random.Random) -> list[int]:
    n = ds.page_counts[doc]
    if cap <= 0 or n <= cap:
        return list(range(1, n + 1))
    gold = {p for q in ds.questions_for(doc) if q.answerable for p in q.evidence_pages}
    rest = [p for p in range(1, n + 1) if p not in gold]
    return sorted(gold | set(rng.sample(rest, max(0, min(len(rest), cap - len(gold))))))


def cache_dir(args) -> pathlib.Path:
    key = (f"p{args.max_pages}-d{args.max_docs or 'all'}-s{args.seed}-{'noocr' if args.no_ocr else 'ocr'}"
           f"-x{args.image_scale}-g{args.patch_grid}-t{args.text_length}")
    return CACHE / key


def build_or_open(args, ds, encoders):
    """``(index, meta)``: the cached index when present, else built and saved."""
    from colgraph_engine.eval.pdf import render_pdf
    from colgraph_engine.kg import KnowledgeIndex, build_document_graph, encode_document

    where = cache_dir(args)
    meta_path = where / "meta.json"
    if meta_path.is_file() and (where / "index").is_dir() and not args.rebuild:
        t0 = time.perf_counter()
        index = KnowledgeIndex.open(where / "index", encoders)
        meta = json.loads(meta_path.read_text())
        meta["load_s"] = time.perf_counter() - t0
        meta["cached"] = True
        print(f"opened cached index {where} in {meta['load_s']:.1f} s")
        return index, meta
    ocr = None
    if not args.no_ocr:
        from colgraph_engine.encoders.ocr import RapidOcr
        ocr = RapidOcr()
    rng = random.Random(args.seed)
    docs = ds.doc_ids[: args.max_docs] if args.max_docs else ds.doc_ids
    index = KnowledgeIndex(encoders)
    meta = {"pages": {}, "excluded_no_text_layer": [], "ocr_pages": 0, "text_sources": defaultdict(int),
            "timings_s": defaultdict(float), "graph_counts": defaultdict(int)}
    t_all = time.perf_counter()
    for i, doc in enumerate(docs):
        keep = select_pages(ds, doc, args.max_pages, rng)
        t0 = time.perf_counter()
        if ocr is None:
            layer = render_pdf(ds.pdf_path(doc), pages=keep, with_images=False)
            if sum(p.text_source == "layer" for p in layer) * 2 < len(layer):
                meta["excluded_no_text_layer"].append(doc)
                continue
        pages = render_pdf(ds.pdf_path(doc), scale=args.image_scale, pages=keep, ocr=ocr, ocr_scale=2.0)
        meta["timings_s"]["render + OCR"] += time.perf_counter() - t0
        for p in pages:
            meta["text_sources"][p.text_source] += 1
        t0 = time.perf_counter()
        graph = build_document_graph(page_document(doc, pages))
        meta["timings_s"]["graph build (offline extractor)"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        vectors = encode_document(graph, encoders)
        meta["timings_s"]["encode (all stores)"] += time.perf_counter() - t0
        index.add_document(graph, vectors)
        meta["pages"][doc] = [p.number for p in pages]
        for k, v in graph.counts.items():
            meta["graph_counts"][k] += v
        print(f"[{i + 1}/{len(docs)}] {doc}: {len(pages)} pages, {graph.counts['entities']} entities, "
              f"{graph.counts['relations']} relations, {time.perf_counter() - t_all:.0f} s so far", flush=True)
    meta["timings_s"]["total build"] = time.perf_counter() - t_all
    t0 = time.perf_counter()
    where.mkdir(parents=True, exist_ok=True)
    index.save(where / "index", overwrite=True)
    meta["timings_s"]["save"] = time.perf_counter() - t0
    meta_path.write_text(json.dumps(meta, indent=1))
    meta["cached"] = False
    return index, json.loads(json.dumps(meta))


def document_index(full, doc_id: str, encoders):
    """An in-memory index of one document, from the full index's graph and stored vectors."""
    from colgraph_engine.kg import KnowledgeIndex

    stored = full._stored(doc_id)  # the index's own export of one document (graph + vectors)
    one = KnowledgeIndex(encoders)
    one.add_document(stored.graph, stored.vectors)
    return one


# --------------------------------------------------------------------------- evaluate

def recall(ranked, gold, k):
    return len(set(ranked[:k]) & gold) / len(gold)


def score_question(ranked, gold) -> dict:
    out = {f"R@{k}": recall(ranked, gold, k) for k in KS}
    out["any"] = float(bool(set(ranked) & gold))
    return out


# --------------------------------------------------------------------------- context efficiency

_WORD = re.compile(r"\w+|[^\w\s]")
_NORM = re.compile(r"[0-9]+(?:\.[0-9]+)?|[a-z]+")


def norm_tokens(text: str) -> list[str]:
    """Lower-cased words and numbers; thousands separators dropped ("1,234" -> "1234") and a
    trailing ".0" dropped ("12.0" -> "12"), so "$1,234.0" and "1234" read alike."""
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.lower())
    return [re.sub(r"\.0+$", "", t) for t in _NORM.findall(text)]


def short_answer(q) -> list[str] | None:
    """The normalised gold answer when it is short (Int, Float or Str with at most 5 tokens;
    numbers, names, dates), else None. A single digit 0-9 is left out: it occurs by chance in
    almost any context of 1,000 tokens (page numbers, list markers), so it measures nothing."""
    if q.answer_format not in ("Int", "Float", "Str"):
        return None
    toks = norm_tokens(q.answer)
    if not toks or len(toks) > 5 or (len(toks) == 1 and toks[0].isdigit() and len(toks[0]) == 1):
        return None
    return toks


def answer_within(context: str, answer: list[str], budget: int) -> bool:
    """Whether the answer's token sequence occurs in the first `budget` tokens of `context`
    (tokens as :func:`colgraph_engine.pipeline.count_tokens` counts them)."""
    end = len(context)
    for n, m in enumerate(_WORD.finditer(context)):
        if n == budget:  # the context as written up to the end of its budget-th token
            end = m.start()
            break
    toks = norm_tokens(context[:end])
    n = len(answer)
    return any(toks[i:i + n] == answer for i in range(len(toks) - n + 1))


def maxsim_rankings(index, questions, qv, qo, corpus: str) -> dict[str, list]:
    """Plain page MaxSim: question tokens vs every kept page's segment tokens (per document or
    over all documents), ranked (doc_id, page) lists of length 10."""
    import colgraph_engine as cg
    from colgraph_engine.packed import pack

    store = index.stores["segment"]
    alive = store.alive.cpu().numpy().astype(bool)
    pv, po = store.values.float(), store.offsets
    nodes = index.nodes_of_uids(store.ids.cpu().numpy()[alive])
    np_ = NodePages(index)
    page_of_slot = [next(iter(np_(v))) for v in nodes.tolist()]  # each segment is one page
    if not alive.all():  # deleted slots: keep the live ones (a freshly built index has none)
        keep = np.flatnonzero(alive)
        pv, po = pack([pv[int(po[i]):int(po[i + 1])] for i in keep], dtype=torch.float32)
    scores = cg.maxsim(qv, qo, pv, po)  # [Nq, pages]
    doc_of_slot = np.asarray([d for d, _ in page_of_slot])
    out = {}
    for n, q in enumerate(questions):
        s = scores[n].clone()
        if corpus == "per-document":
            s[torch.from_numpy(doc_of_slot != q.doc_id)] = float("-inf")
        order = torch.sort(s, descending=True, stable=True).indices[:10].tolist()
        out[q.qid] = [page_of_slot[i] for i in order if torch.isfinite(s[i])]
    return out


def page_texts(index, node_pages) -> dict:
    """``{(doc_id, page): text}`` of every kept page (its one segment)."""
    store = index.stores["segment"]
    nodes = index.nodes_of_uids(store.ids.cpu().numpy()[store.alive.cpu().numpy().astype(bool)])
    return {next(iter(node_pages(v))): index.describe_node(int(v))["text"] for v in nodes.tolist()}


def pages_context(ranked, texts) -> str:
    """Plain page MaxSim's context: the ranked pages' texts, best first, one per line (the
    sources section of a pipeline context without its JSON framing)."""
    return "\n".join(texts[p] for p in ranked)


def run_pipeline(index, encoders, questions, changes, node_pages):
    from colgraph_engine.pipeline import Pipeline, PipelineConfig

    pipe = Pipeline(index, encoders, PipelineConfig().replace(**changes))
    t0 = time.perf_counter()
    results = pipe.retrieve_batch([q.question for q in questions])
    elapsed = time.perf_counter() - t0
    per_q = {}
    for q, r in zip(questions, results):
        merged, src, img = evidence_pages(r, node_pages)
        sub_pages = set()
        for v in r.subgraph_nodes.tolist():
            sub_pages |= node_pages(v)
        per_q[q.qid] = {"merged": merged, "sources": src, "images": img,
                        "docs": [d for d, _ in r.documents], "subgraph_pages": sub_pages,
                        "counts": r.counts, "notes": r.notes, "context": r.context.render(),
                        "seeds": list(r.seed_entities)}
    stages = {k: v for k, v in results[0].timings.items()} if results else {}
    return per_q, elapsed, stages


def main(argv=None) -> int:
    args = parse_args(argv)
    if not (args.data / "samples.json").is_file():
        print(f"MMLongBench-Doc data not found at {args.data} (expected samples.json and documents/); "
              "this benchmark needs it and writes nothing without it.")
        return 2
    import _impls
    from colgraph_engine.eval.datasets import load_mmlongbench
    from colgraph_engine.packed import pack

    global VARIANTS
    if args.variants:
        VARIANTS = {k: v for k, v in VARIANTS.items() if k[0] in "abc" + args.variants}
    t_start = time.perf_counter()
    ds = load_mmlongbench(args.data)
    encoders = make_encoders(args)
    index, meta = build_or_open(args, ds, encoders)
    docs = list(meta["pages"])
    questions = [q for d in docs for q in ds.questions_for(d) if q.answerable]
    gold = {q.qid: {(q.doc_id, p) for p in q.evidence_pages} for q in questions}
    kept = {(d, p) for d in meta["pages"] for p in meta["pages"][d]}
    if any(g - kept for g in gold.values()):
        raise RuntimeError("a gold page is missing from the kept pages (select_pages keeps them all)")
    image_q = {q.qid for q in questions if set(q.evidence_sources) & set(IMAGE_SOURCES)}

    qv, qo = pack(encoders.tokens([q.question for q in questions]), dtype=torch.float32)
    runs: dict[str, dict[str, dict]] = {"per-document": {}, "open": {}}
    timing: dict[str, dict] = {"per-document": {}, "open": {}}
    # open corpus: one index, one batch per variant
    node_pages = NodePages(index)
    texts = page_texts(index, node_pages)
    for name, changes in VARIANTS.items():
        t0 = time.perf_counter()
        if changes is None:
            ranked = maxsim_rankings(index, questions, qv, qo, "open")
            runs["open"][name] = {qid: {"merged": r, "sources": r, "images": [], "docs": None, "subgraph_pages": None,
                                        "context": pages_context(r, texts)} for qid, r in ranked.items()}
            timing["open"][name] = {"total_s": time.perf_counter() - t0}
        else:
            per_q, elapsed, stages = run_pipeline(index, encoders, questions, changes, node_pages)
            runs["open"][name] = per_q
            timing["open"][name] = {"total_s": elapsed, "stages_s": stages}
        print(f"open corpus, {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    # per document: each question against an index of its own document
    ranked = maxsim_rankings(index, questions, qv, qo, "per-document")
    runs["per-document"][PLAIN] = {qid: {"merged": r, "sources": r, "images": [], "docs": None,
                                         "subgraph_pages": None, "context": pages_context(r, texts)}
                                   for qid, r in ranked.items()}
    for name in VARIANTS:
        if VARIANTS[name] is not None:
            runs["per-document"][name] = {}
            timing["per-document"][name] = {"total_s": 0.0}
    t0 = time.perf_counter()
    for doc in docs:
        qs = [q for q in questions if q.doc_id == doc]
        if not qs:
            continue
        one = document_index(index, doc, encoders)
        np_one = NodePages(one)
        for name, changes in VARIANTS.items():
            if changes is None:
                continue
            per_q, elapsed, _ = run_pipeline(one, encoders, qs, changes, np_one)
            runs["per-document"][name].update(per_q)
            timing["per-document"][name]["total_s"] += elapsed
    print(f"per-document variants: {time.perf_counter() - t0:.1f} s", flush=True)

    report = summarise(args, ds, meta, index, questions, gold, image_q, runs, timing)
    report["run_s"] = time.perf_counter() - t_start
    info = _impls.machine_info()
    info.pop("colgraph_backends", None)
    report["machine"] = info
    report["engine_source"] = engine_source()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1, default=str))
    lines = render_markdown(report, args)
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    plot(report, args.out / f"{args.name}.png")
    print("\n".join(lines))
    return 0


def engine_source() -> str:
    """The commit the engine ran from, and whether colgraph_engine/ had uncommitted changes."""
    import subprocess

    root = HERE.parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "colgraph_engine", "csrc"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.split("\n")
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def _mean(xs):
    return float(np.mean(xs)) if len(xs) else float("nan")


def summarise(args, ds, meta, index, questions, gold, image_q, runs, timing) -> dict:
    groups = {"all": [q.qid for q in questions], "image-bearing": [q.qid for q in questions if q.qid in image_q],
              "cross-page": [q.qid for q in questions if len(gold[q.qid]) > 1],
              "text-only": [q.qid for q in questions if q.qid not in image_q]}
    short = {q.qid: short_answer(q) for q in questions}
    sources_of = {q.qid: q.evidence_sources for q in questions}
    table = {}
    per_question = {}
    for corpus, by_variant in runs.items():
        table[corpus] = {}
        for name, per_q in by_variant.items():
            rows = {}
            scored = {}
            for qid, r in per_q.items():
                g = gold[qid]
                s = score_question(r["merged"], g)
                s["src R@5"] = recall(r["sources"], g, 5)
                s["img R@5"] = recall(r["images"], g, 5) if VARIANTS[name] is not None else float("nan")
                s["S1 doc"] = float(next(iter(g))[0] in r["docs"]) if r["docs"] is not None else float("nan")
                s["S4 subgraph"] = float(bool(r["subgraph_pages"] & g)) if r["subgraph_pages"] is not None \
                    else float("nan")
                s["S5 E_k"] = float(bool(set(r["images"]) & g)) if VARIANTS[name] is not None else float("nan")
                s["S6 sources"] = float(bool(set(r["sources"]) & g))
                for b in BUDGETS:
                    s[f"ctx@{b}"] = float(answer_within(r["context"], short[qid], b)) if short[qid] else float("nan")
                if name in (GRAPH, CHUNKS):
                    s["top5"] = [list(x) for x in r["merged"][:5]]
                    s["seeds"] = r.get("seeds", [])
                scored[qid] = s
            for gname, qids in groups.items():
                rows[gname] = {"n": len(qids)}
                for key in ("R@1", "R@5", "R@10", "any", "src R@5", "img R@5", "S1 doc", "S4 subgraph", "S5 E_k",
                            "S6 sources"):
                    rows[gname][key] = _mean([scored[qid][key] for qid in qids])
                for b in BUDGETS:  # context efficiency: over the group's questions with a short answer
                    rows[gname][f"ctx@{b}"] = _mean([scored[qid][f"ctx@{b}"] for qid in qids if short[qid]])
                rows[gname]["n short"] = sum(1 for qid in qids if short[qid])
            table[corpus][name] = rows
            per_question.setdefault(corpus, {})[name] = scored
    # where the graph helps / hurts: questions whose Recall@5 differs between two variants
    comparisons = {}
    for corpus in runs:
        pq = per_question[corpus]
        for a, b in ((GRAPH, CHUNKS), (GRAPH, PLAIN), (GRAPH, H0), (GRAPH, MKG), (GRAPH, POOLED)):
            if a not in pq or b not in pq:
                continue
            better, worse = defaultdict(int), defaultdict(int)
            for q in questions:
                d = pq[a][q.qid]["R@5"] - pq[b][q.qid]["R@5"]
                for src in (sources_of[q.qid] or ("(none)",)):
                    src = {"Pure-text (Plain-text)": "Pure-text", "Generalized-text (Layout)": "Layout"}.get(src, src)
                    if d > 0:
                        better[src] += 1
                    elif d < 0:
                        worse[src] += 1
                if d > 0:
                    better["all"] += 1
                elif d < 0:
                    worse["all"] += 1
            comparisons[f"{corpus}: {a} vs {b}"] = {"better": dict(better), "worse": dict(worse)}
    by_source = {}
    for corpus in runs:
        by_source[corpus] = {}
        srcs = sorted({s for q in questions for s in q.evidence_sources})
        for src in srcs:
            qids = [q.qid for q in questions if src in q.evidence_sources]
            by_source[corpus][src] = {"n": len(qids), **{
                name: _mean([per_question[corpus][name][qid]["R@5"] for qid in qids]) for name in runs[corpus]}}
    counts = index.counts
    notes = sorted({n for corpus in runs for name, per_q in runs[corpus].items() for r in per_q.values()
                    for n in r.get("notes", [])})
    stage_counts = {}
    budget = __import__("colgraph_engine.pipeline", fromlist=["x"]).PipelineConfig().expansion_budget
    for corpus in runs:
        stage_counts[corpus] = {}
        for name, per_q in runs[corpus].items():
            if VARIANTS[name] is None:
                continue
            c = [r["counts"] for r in per_q.values()]
            stage_counts[corpus][name] = {
                "recalled documents": _mean([x["recall"]["documents"] for x in c]),
                "subgraph nodes": _mean([x["expand"]["nodes"] for x in c]),
                "visual candidates": _mean([x["visual"]["candidates"] for x in c]),
                "E_k": _mean([x["visual"]["ranked"] for x in c]),
                "sources": _mean([x["evidence"]["sources"] for x in c]),
                "subgraph pages": _mean([len(r["subgraph_pages"]) for r in per_q.values()]),
                "at expansion budget": _mean([x["expand"]["nodes"] >= budget for x in c]),
            }
    by_doc = {}  # per corpus: each document's mean Recall@5 (its own questions) per variant
    for corpus in runs:
        by_doc[corpus] = {}
        for d in sorted({q.doc_id for q in questions}):
            qids = [q.qid for q in questions if q.doc_id == d]
            by_doc[corpus][d] = {"n": len(qids), **{name: _mean([per_question[corpus][name][qid]["R@5"] for qid in qids])
                                                    for name in runs[corpus]}}
    examples = {"wins": [], "losses": []}
    pq = per_question.get("open", {})
    if GRAPH in pq and CHUNKS in pq:
        deltas = sorted(((pq[GRAPH][q.qid]["R@5"] - pq[CHUNKS][q.qid]["R@5"], q) for q in questions),
                        key=lambda t: (-abs(t[0]), t[1].qid))
        for d, q in deltas:
            kind = "wins" if d > 0 else "losses" if d < 0 else None
            if kind and len(examples[kind]) < 6:
                examples[kind].append({"qid": q.qid, "delta": d, "question": q.question, "answer": q.answer,
                                       "gold": sorted(q.evidence_pages), "seeds": pq[GRAPH][q.qid].get("seeds", []),
                                       "graph_top5": pq[GRAPH][q.qid]["top5"], "chunks_top5": pq[CHUNKS][q.qid]["top5"]})
    return {
        "examples": examples, "by_document_R@5": by_doc,
        "date": str(datetime.date.today()),
        "settings": {"max_pages": args.max_pages, "max_docs": args.max_docs, "ocr": not args.no_ocr,
                     "image_scale": args.image_scale, "patch_grid": args.patch_grid, "text_length": args.text_length,
                     "seed": args.seed, "pipeline_defaults": __import__("colgraph_engine.pipeline", fromlist=["x"])
                     .PipelineConfig().as_dict(), "variants": VARIANTS,
                     "encoders": index.encoder_info},
        "counts": {"documents": len(meta["pages"]), "documents_in_dataset": len(ds.doc_ids),
                   "pages": sum(len(v) for v in meta["pages"].values()),
                   "pages_in_dataset": sum(ds.page_counts.values()), "questions": len(questions),
                   "image_bearing_questions": len(groups["image-bearing"]),
                   "questions_in_dataset": len(ds.questions),
                   "unanswerable_questions_skipped": sum(not q.answerable for q in ds.questions
                                                         if q.doc_id in meta["pages"]),
                   "excluded_no_text_layer": meta["excluded_no_text_layer"],
                   "page_text_sources": meta["text_sources"], "skipped_labels": ds.skipped,
                   "index": counts},
        "build": {"cached": meta.get("cached"), "timings_s": meta["timings_s"], "load_s": meta.get("load_s")},
        "table": table, "by_source_R@5": by_source, "comparisons": comparisons, "stage_counts": stage_counts,
        "timing": timing, "notes": notes,
        "per_question": {c: {n: {qid: {k: v for k, v in s.items()} for qid, s in d.items()}
                             for n, d in per_question[c].items()} for c in per_question},
    }


def _f(x):
    return "—" if x != x else f"{x:.3f}"


def render_markdown(r, args) -> list[str]:
    c, s, m = r["counts"], r["settings"], r["machine"]
    b = r["build"]
    lines = [
        "# Pipeline retrieval quality on MMLongBench-Doc (dev subset): evidence pages", "",
        f"{r['date']} · {m['cpu_model']} · {m['cpus_usable']} usable CPUs · torch {m['torch']} · "
        f"engine at {r['engine_source']} · "
        f"`benchmarks/pipeline_quality.py{' --no-ocr' if args.no_ocr else ''}` · run {r['run_s'] / 60:.1f} min "
        + (f"(index from the cache; building it took {b['timings_s']['total build'] / 60:.1f} min)" if b["cached"]
           else "(index built in this run)"), "",
        f"**Corpus**: {c['documents']} of {c['documents_in_dataset']} documents (the first "
        f"{s['max_docs'] or 'all'} of samples.json), {c['pages']} of "
        f"{c['pages_in_dataset']} pages (at most {s['max_pages']} per document: every gold evidence page plus "
        f"seeded random distractors; more when a document's gold pages exceed the cap), "
        f"{c['questions']} answerable questions ({c['image_bearing_questions']} image-bearing: evidence sources "
        f"include Chart or Figure); {c['unanswerable_questions_skipped']} questions without a valid evidence page "
        f"skipped. Page text: {dict(c['page_text_sources'])} (layer = PDF text layer, ocr = RapidOCR at scale 2 "
        f"for pages with under 20 characters in the layer"
        + (f"; OCR off: {len(c['excluded_no_text_layer'])} documents without a text layer left out" if args.no_ocr
           else "") + ").",
        "",
        f"**Index**: {c['index'].get('segments', 0)} segments (one per page), {c['index'].get('entities', 0)} entities, "
        f"{c['index'].get('relations', 0)} relations (the default offline extractor, no LLM), {c['index'].get('images', 0)} page "
        f"images. Encoders: tokens `{s['encoders']['tokens']['name']}` (as quality_report.py), text "
        f"`{s['encoders']['text']['name']}`, patches `{s['encoders']['patches']['name']}` (pages rendered at scale "
        f"{s['image_scale']}). MiniLM and EfficientNet share no embedding space, so E_k is ranked on the images' "
        "*text views* (here: the page text); the patches only serve queries with an image (none here).",
        "",
        "**Evidence pages** of a pipeline result: evidence sources (segment -> page) and E_k images (`page-<n>`), "
        "interleaved by rank (source 1, image 1, source 2, ...), repeats dropped; plain MaxSim ranks pages directly. "
        "R@k = fraction of a question's gold pages among the first k evidence pages, averaged; *any* = some gold "
        "page anywhere in the evidence (≤ 10 sources + ≤ 10 images). Stages: S1 gold document recalled (Kd = 10); "
        "S4 the retrieved subgraph touches a gold page (segment/image nodes, entity provenance); S5 a gold page in "
        "E_k; S6 a gold page among the sources.",
        "",
        "**Corpora**: *per-document*: every question is asked against an index of its own document only (as "
        "quality_report.py ranks pages within the question's PDF), so stage 1 recall is 1 by construction; "
        f"*open*: one index over all {c['documents']} documents, stage 1 must find the document.",
        "",
    ]
    lines += ["**Context efficiency** (ctx@1000, ctx@2000): the share of questions with a short gold answer (Int, "
              "Float or Str of at most 5 tokens, a single digit left out; normalised: lower case, thousands "
              "separators and trailing .0 dropped) whose answer token sequence occurs in the first 1,000 / 2,000 "
              "tokens of the rendered context (`Context.render()`: entities, relations, sources, images; plain page "
              "MaxSim: the ranked pages' texts). **Cross-page**: questions with two or more gold pages.", ""]
    lines += targets(r) + [""]
    for corpus in ("per-document", "open"):
        lines += [f"## {corpus} corpus", "",
                  "| variant | questions | n | R@1 | R@5 | R@10 | any | sources R@5 | E_k R@5 | S1 doc | S4 subgraph "
                  "| S6 sources | n short | ctx@1000 | ctx@2000 |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, rows in r["table"][corpus].items():
            for g in GROUPS:
                row = rows[g]
                lines.append(f"| {name} | {g} | {row['n']} | " + " | ".join(
                    _f(row[k]) for k in ("R@1", "R@5", "R@10", "any", "src R@5", "img R@5", "S1 doc", "S4 subgraph",
                                         "S6 sources")) + f" | {row['n short']} | {_f(row['ctx@1000'])} | "
                    f"{_f(row['ctx@2000'])} |")
        lines.append("")
        names = list(r["table"][corpus])
        lines += ["Recall@5 by evidence source (a question counts under each of its sources):", "",
                  "| source | n | " + " | ".join(names) + " |", "|---|---:|" + "---:|" * len(names)]
        for src, row in r["by_source_R@5"][corpus].items():
            lines.append(f"| {src} | {row['n']} | " + " | ".join(_f(row[v]) for v in names) + " |")
        lines.append("")
        sc = r["stage_counts"][corpus]
        lines += ["Mean candidates per question:", "",
                  "| variant | recalled documents | subgraph nodes | pages the subgraph touches | share at the expansion "
                  "budget | visual candidates | E_k | sources | seconds |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in sc.items():
            lines.append(f"| {name} | {row['recalled documents']:.1f} | {row['subgraph nodes']:.1f} | "
                         f"{row['subgraph pages']:.1f} | {row['at expansion budget']:.2f} | "
                         f"{row['visual candidates']:.1f} | {row['E_k']:.1f} | {row['sources']:.1f} | "
                         f"{r['timing'][corpus][name]['total_s']:.1f} |")
        lines.append("")
    show = [n for n in (PLAIN, GRAPH, CHUNKS, MKG) if n in r["table"]["open"]]
    for corpus in ("per-document", "open"):
        rows = r["by_document_R@5"][corpus]
        below = [d for d, row in rows.items() if row[GRAPH] < row[CHUNKS] - 1e-9]
        lines += [f"Recall@5 per document ({corpus} corpus; each document's own questions): {GRAPH} is below "
                  f"{CHUNKS} on {len(below)} of {len(rows)} documents" + (f" ({', '.join(below)})" if below else "")
                  + ".", "", "| document | questions | " + " | ".join(show) + " |", "|---|---:|" + "---:|" * len(show)]
        for d, row in rows.items():
            lines.append(f"| {d} | {row['n']} | " + " | ".join(_f(row[n]) for n in show) + " |")
        lines.append("")
    lines += ["Questions whose Recall@5 is higher (better) or lower (worse) with the first variant, by evidence "
              "source:", "", "| comparison | better | worse |", "|---|---|---|"]
    for k, v in r["comparisons"].items():
        fmt = lambda d: ", ".join(f"{s} {n}" for s, n in sorted(d.items(), key=lambda kv: (kv[0] != "all", kv[0]))) or "0"
        lines.append(f"| {k} | {fmt(v['better'])} | {fmt(v['worse'])} |")
    lines += ["", "## Examples (open corpus): graph+chunks vs chunks", ""]
    for kind in ("wins", "losses"):
        lines.append(f"**{kind}** (Recall@5 of {GRAPH} minus {CHUNKS}, largest first):")
        lines.append("")
        for e in r["examples"][kind]:
            lines.append(f"* `{e['qid']}` ({e['delta']:+.2f}) {e['question']!r}; gold {e['gold']}; seeds "
                         f"{e['seeds'][:6]}; graph+chunks top 5 {e['graph_top5']}; chunks top 5 {e['chunks_top5']}")
        lines.append("")
    lines += ["", "Build: " + ", ".join(f"{k} {v:.0f} s" for k, v in r["build"]["timings_s"].items())
              + (f"; this run opened the cached index in {r['build']['load_s']:.0f} s" if r["build"]["cached"] else "")
              + ". Pipeline notes seen: " + "; ".join(r["notes"]) + "."]
    return lines


def targets(r) -> list[str]:
    """The issue's targets (graph = the default graph+chunks), each with the measured values."""
    o, p = r["table"]["open"], r["table"]["per-document"]
    out = ["**Targets** (issue 24 item 6; open corpus unless said):", "",
           "| target | measured | met |", "|---|---|---|"]

    def row(text, lhs, rhs, margin):
        out.append(f"| {text} | {lhs:.3f} vs {rhs:.3f} + {margin:.2f} | {'yes' if lhs >= rhs + margin - 1e-9 else 'no'} |")

    row("graph R@5 >= chunks + 0.03 (all)", o[GRAPH]["all"]["R@5"], o[CHUNKS]["all"]["R@5"], 0.03)
    row("graph R@5 >= chunks + 0.05 (cross-page)", o[GRAPH]["cross-page"]["R@5"], o[CHUNKS]["cross-page"]["R@5"], 0.05)
    if H0 in o:
        h1, h0 = o[GRAPH]["cross-page"]["R@5"], o[H0]["cross-page"]["R@5"]
        out.append(f"| hops=1 better than hops=0 (cross-page R@5) | {h1:.3f} vs {h0:.3f} | {'yes' if h1 > h0 else 'no'} |")
    g, c = p[GRAPH]["all"]["R@5"], p[CHUNKS]["all"]["R@5"]
    out.append(f"| per-document corpus: graph not below chunks (R@5, all) | {g:.3f} vs {c:.3f} | "
               f"{'yes' if g >= c else 'no'} |")
    for corpus in ("per-document", "open"):
        rows = r["by_document_R@5"][corpus]
        below = sum(1 for row in rows.values() if row[GRAPH] < row[CHUNKS] - 1e-9)
        out.append(f"| {corpus} corpus: graph never below chunks on any document (R@5) | below on {below} of "
                   f"{len(rows)} documents | {'yes' if not below else 'no'} |")
    row("context efficiency at 2,000 tokens >= chunks + 0.05", o[GRAPH]["all"]["ctx@2000"], o[CHUNKS]["all"]["ctx@2000"],
        0.05)
    return out


def plot(r, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(15, 4.5), sharey=True)
    names = list(r["table"]["open"])
    x = np.arange(len(names))
    for ax, corpus in zip(axes, ("per-document", "open")):
        t = r["table"][corpus]
        for off, g, color in ((-0.3, "all", "#1f77b4"), (-0.1, "image-bearing", "#ff7f0e"),
                              (0.1, "cross-page", "#2ca02c")):
            vals = [t[n][g]["R@5"] for n in names]
            ax.bar(x + off, vals, 0.2, label=f"R@5 {g} (n={t[names[0]][g]['n']})", color=color)
        vals = [t[n]["all"]["ctx@2000"] for n in names]
        ax.bar(x + 0.3, vals, 0.2, label="ctx@2000", color="#9467bd")
        ax.set_xticks(x, [n.split(": ", 1)[1].replace(" ", "\n", 1) for n in names], fontsize=6, rotation=60)
        ax.set_title(f"{corpus} corpus", fontsize=10)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("Recall@5 of evidence pages / context efficiency")
    fig.suptitle(f"MMLongBench-Doc dev: pipeline variants, {r['counts']['documents']} documents, "
                 f"{r['counts']['pages']} pages, {r['counts']['questions']} questions", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
