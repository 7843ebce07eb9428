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

Questions: every answerable dev question (at least one valid evidence page), asked against two
corpora, per-document and open. How evidence pages, R@k, the stages S1-S6, the corpora and
context efficiency are measured: :data:`DEFINITIONS`, which every report prints.

Variants (same vectors, one run; ``VARIANTS``): (a) plain page MaxSim, question tokens vs page
segment tokens; (b) the default, ``retrieval="graph+chunks"`` (the graph adds to the chunk
ranking: :mod:`colgraph_engine.pipeline.graph_adds`); (c) ``retrieval="chunks"``; (d)
``retrieval="graph"`` as mKG-RAG states it, (f) with ``hops=0, filter="off"``, (m) with name
seeds; the default's hops 0 and 2 (g, h), filters off and mkg (i, j), lexical-only and
description seeds (k, l), graph weight 0.25 and 1 (n, o), and the pooled visual ranker (e).
``--variants gk`` runs a, b, c and the named letters only.

The built index is cached in ``benchmarks/.cache/pipeline_quality/`` (gitignored) with
``KnowledgeIndex.save`` / ``open``. Writes ``results/pipeline_quality.md``, ``.json`` and ``.png``.
"""
from __future__ import annotations

import json
import pathlib
import random
import re
import sys
import time
from collections import Counter, defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import _harness as h  # noqa: E402
from quality_report import DEFAULT_DATA, SOURCES, open_mmlongbench  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
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
    "n: graph+chunks beta=0.5": {"graph_weight": 0.5},
    "o: graph+chunks beta=2": {"graph_weight": 2.0},
    POOLED: {"visual_ranker": "pooled"},
}
GROUPS = ("all", "image-bearing", "cross-page", "text-only")
BUDGETS = (1000, 2000)
DEFINITIONS = [
    "**Evidence pages** of a pipeline result: evidence sources (segment -> page) and E_k images (`page-<n>`), "
    "interleaved by rank (source 1, image 1, source 2, ...), repeats dropped; plain MaxSim ranks pages directly. "
    "R@k = fraction of a question's gold pages among the first k evidence pages, averaged; *any* = some gold "
    "page anywhere in the evidence (≤ 10 sources + ≤ 10 images). Stages: S1 gold document recalled (Kd = 10); "
    "S4 the retrieved subgraph touches a gold page (segment/image nodes, entity provenance; chunk nodes for "
    "`chunks`); S5 a gold page in E_k; S6 a gold page among the sources.",
    "",
    "**Corpora**: *per-document*: every question is asked against an index of its own document only (as "
    "quality_report.py ranks pages within the question's PDF), so stage 1 recall is 1 by construction; "
    "*open*: one index over all kept documents, stage 1 must find the document.",
    "",
    "**Context efficiency** (ctx@1000, ctx@2000): the share of questions with a short gold answer (Int, "
    "Float or Str of at most 5 tokens, a single digit left out; normalised: lower case, thousands "
    "separators and trailing .0 dropped) whose answer token sequence occurs in the first 1,000 / 2,000 "
    "tokens of the rendered context (`Context.render()`: entities, relations, sources, images; plain page "
    "MaxSim: the ranked pages' texts). **Cross-page**: questions with two or more gold pages.",
]

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
    for hit in result.images:
        p = page_of_image(hit.image if hit.image is not None else hit.name)
        if p is not None:
            img.append((hit.doc_id, p))
    src, img = list(dict.fromkeys(src)), list(dict.fromkeys(img))
    merged = []
    for i in range(max(len(src), len(img))):
        merged += src[i:i + 1] + img[i:i + 1]
    return list(dict.fromkeys(merged)), src, img


# --------------------------------------------------------------------------- build

def parse_args(argv=None):
    ap = h.parser(__doc__, quick=False, out=HERE / "results")
    ap.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    ap.add_argument("--max-pages", type=int, default=10, help="pages kept per document (0: all)")
    ap.add_argument("--max-docs", type=int, default=24, help="first documents of samples.json (0: all)")
    ap.add_argument("--no-ocr", action="store_true", help="no OCR: documents without a text layer are left out")
    ap.add_argument("--image-scale", type=float, default=0.75)
    ap.add_argument("--patch-grid", type=int, default=7, choices=(7, 14))
    ap.add_argument("--text-length", type=int, default=32, help="MiniLM pieces for the text (entity/relation) role")
    ap.add_argument("--text-items", default="spans", choices=("direct", "spans"),
                    help="how entity/relation vectors are made (kg.vectors item rules; spans: the models set's default)")
    ap.add_argument("--token-windows", default=None, choices=("on", "off"),
                    help="MiniLM tokens of a long page from every window (on) or its first 254 pieces (off); "
                         "default: what a new models index gets (encoders.sets.DEFAULT_WINDOWS: off)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rebuild", action="store_true", help="ignore the cached index")
    ap.add_argument("--name", default="pipeline_quality")
    ap.add_argument("--variants", default="", help="letters of the variants to run (a, b, c always run; default: all)")
    args = ap.parse_args(argv)
    if args.token_windows is None:
        from colgraph_engine.encoders.sets import DEFAULT_WINDOWS
        args.token_windows = "on" if DEFAULT_WINDOWS else "off"
    return args


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

    for name in ("items", "minilm"):  # the item rule and its model (kg.vectors reads them)
        if hasattr(enc.fn, name):
            setattr(fn, name, getattr(enc.fn, name))
    return Encoder(fn, enc.name, enc.dim, enc.role)


def make_encoders(args):
    from colgraph_engine.encoders.efficientnet import EfficientNetPatchEncoder
    from colgraph_engine.encoders.minilm import MiniLMEncoder
    from colgraph_engine.kg import Encoders

    tokens = MiniLMEncoder(batch_size=16, windows=args.token_windows == "on").token_encoder()
    text = MiniLMEncoder(max_length=args.text_length, batch_size=64).text_encoder(args.text_items)
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
    """The cached index's folder: one per build setting, the documents' compute precision included
    (``compute="auto"`` encodes them in bfloat16 on a CPU that has it)."""
    from colgraph_engine.encoders import precision
    low = precision.document_dtype() == torch.bfloat16
    key = (f"p{args.max_pages}-d{args.max_docs or 'all'}-s{args.seed}-{'noocr' if args.no_ocr else 'ocr'}"
           f"-x{args.image_scale}-g{args.patch_grid}-t{args.text_length}"
           + ("-spans" if args.text_items == "spans" else "") + ("-bf16" if low else "")
           + ("-windows" if args.token_windows == "on" else ""))
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
    meta = {"pages": {}, "excluded_no_text_layer": [], "text_sources": defaultdict(int),
            "timings_s": defaultdict(float), "graph_counts": defaultdict(int)}
    t_all = time.perf_counter()
    for i, doc in enumerate(docs):
        keep = select_pages(ds, doc, args.max_pages, rng)
        if ocr is None:
            layer = render_pdf(ds.pdf_path(doc), pages=keep, with_images=False)
            if sum(p.text_source == "layer" for p in layer) * 2 < len(layer):
                meta["excluded_no_text_layer"].append(doc)
                continue
        pages, t = h.timed(render_pdf, ds.pdf_path(doc), scale=args.image_scale, pages=keep, ocr=ocr, ocr_scale=2.0)
        meta["timings_s"]["render + OCR"] += t
        for p in pages:
            meta["text_sources"][p.text_source] += 1
        graph, t = h.timed(build_document_graph, page_document(doc, pages))
        meta["timings_s"]["graph build (offline extractor)"] += t
        vectors, t = h.timed(encode_document, graph, encoders)
        meta["timings_s"]["encode (all stores)"] += t
        index.add_document(graph, vectors)
        meta["pages"][doc] = [p.number for p in pages]
        for k, v in graph.counts.items():
            meta["graph_counts"][k] += v
        print(f"[{i + 1}/{len(docs)}] {doc}: {len(pages)} pages, {graph.counts['entities']} entities, "
              f"{graph.counts['relations']} relations, {time.perf_counter() - t_all:.0f} s so far", flush=True)
    meta["timings_s"]["total build"] = time.perf_counter() - t_all
    where.mkdir(parents=True, exist_ok=True)
    _, meta["timings_s"]["save"] = h.timed(index.save, where / "index", overwrite=True)
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
    results, elapsed = h.timed(pipe.retrieve_batch, [q.question for q in questions])
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


def plain_run(ranked, texts) -> dict:
    """Plain page MaxSim's results in :func:`run_pipeline`'s shape: its pages are its sources."""
    return {qid: {"merged": r, "sources": r, "images": [], "docs": None, "subgraph_pages": None,
                  "context": pages_context(r, texts)} for qid, r in ranked.items()}


def open_runs(index, encoders, questions, qv, qo, variants, texts) -> tuple[dict, dict]:
    """``(runs, timing)`` per variant over the open corpus: one index, one batch per variant."""
    node_pages = NodePages(index)
    runs, timing = {}, {}
    for name, changes in variants.items():
        if changes is None:
            ranked, t = h.timed(maxsim_rankings, index, questions, qv, qo, "open")
            runs[name], timing[name] = plain_run(ranked, texts), {"total_s": t}
        else:
            runs[name], t, stages = run_pipeline(index, encoders, questions, changes, node_pages)
            timing[name] = {"total_s": t, "stages_s": stages}
        print(f"open corpus, {name}: {t:.1f} s", flush=True)
    return runs, timing


def per_document_runs(index, encoders, questions, qv, qo, variants, texts) -> tuple[dict, dict]:
    """``(runs, timing)`` per variant, each question against an index of its own document."""
    runs = {PLAIN: plain_run(maxsim_rankings(index, questions, qv, qo, "per-document"), texts)}
    pipelines = {name: changes for name, changes in variants.items() if changes is not None}
    runs |= {name: {} for name in pipelines}
    timing = {name: {"total_s": 0.0} for name in pipelines}
    for doc in dict.fromkeys(q.doc_id for q in questions):
        qs = [q for q in questions if q.doc_id == doc]
        one = document_index(index, doc, encoders)
        node_pages = NodePages(one)
        for name, changes in pipelines.items():
            per_q, elapsed, _ = run_pipeline(one, encoders, qs, changes, node_pages)
            runs[name].update(per_q)
            timing[name]["total_s"] += elapsed
    return runs, timing


def main(argv=None) -> int:
    args = parse_args(argv)
    ds = open_mmlongbench(args.data)
    if ds is None:
        return 2
    from colgraph_engine.packed import pack

    variants = {k: v for k, v in VARIANTS.items() if not args.variants or k[0] in "abc" + args.variants}
    e = h.env()
    t_start = time.perf_counter()
    encoders = make_encoders(args)
    index, meta = build_or_open(args, ds, encoders)
    questions = [q for d in meta["pages"] for q in ds.questions_for(d) if q.answerable]
    gold = {q.qid: {(q.doc_id, p) for p in q.evidence_pages} for q in questions}
    kept = {(d, p) for d in meta["pages"] for p in meta["pages"][d]}
    if any(g - kept for g in gold.values()):
        raise RuntimeError("a gold page is missing from the kept pages (select_pages keeps them all)")
    qv, qo = pack(encoders.tokens([q.question for q in questions]), dtype=torch.float32)
    texts = page_texts(index, NodePages(index))
    open_run, open_timing = open_runs(index, encoders, questions, qv, qo, variants, texts)
    (doc_run, doc_timing), t = h.timed(per_document_runs, index, encoders, questions, qv, qo, variants, texts)
    print(f"per-document variants: {t:.1f} s", flush=True)
    runs, timing = {"per-document": doc_run, "open": open_run}, {"per-document": doc_timing, "open": open_timing}
    report = summarise(args, ds, meta, index, questions, gold, runs, timing, variants)
    report["run_s"] = time.perf_counter() - t_start
    out = h.write(args.name, "Pipeline retrieval quality on MMLongBench-Doc (dev subset): evidence pages",
                  render_markdown(report, args), report, args.out, e=e)
    plot(report, out / f"{args.name}.png" if out else None)
    return 0


def _mean(xs):
    return float(np.mean(xs)) if len(xs) else float("nan")


METRICS = ("R@1", "R@5", "R@10", "any", "src R@5", "img R@5", "S1 doc", "S4 subgraph", "S5 E_k", "S6 sources")
PAIRS = ((GRAPH, CHUNKS), (GRAPH, PLAIN), (GRAPH, H0), (GRAPH, MKG), (GRAPH, POOLED))  # where the graph helps


def score_run(name, per_q, gold, short) -> dict:
    """Question id -> its figures in one run (NaN where the variant has no such stage: plain
    page MaxSim has no images, documents or subgraph)."""
    nan, plain = float("nan"), name == PLAIN
    scored = {}
    for qid, r in per_q.items():
        g = gold[qid]
        s = score_question(r["merged"], g)
        s["src R@5"] = recall(r["sources"], g, 5)
        s["img R@5"] = nan if plain else recall(r["images"], g, 5)
        s["S1 doc"] = nan if plain else float(next(iter(g))[0] in r["docs"])
        s["S4 subgraph"] = nan if plain else float(bool(r["subgraph_pages"] & g))
        s["S5 E_k"] = nan if plain else float(bool(set(r["images"]) & g))
        s["S6 sources"] = float(bool(set(r["sources"]) & g))
        for b in BUDGETS:
            s[f"ctx@{b}"] = float(answer_within(r["context"], short[qid], b)) if short[qid] else nan
        if name in (GRAPH, CHUNKS):  # kept for the examples
            s["top5"] = [list(x) for x in r["merged"][:5]]
            s["seeds"] = r.get("seeds", [])
        scored[qid] = s
    return scored


def group_rows(scored, groups, short) -> dict:
    """Group name -> n and the mean of every figure; context efficiency over the group's
    questions with a short answer only."""
    rows = {}
    for gname, qids in groups.items():
        with_short = [qid for qid in qids if short[qid]]
        rows[gname] = {"n": len(qids), **{k: _mean([scored[qid][k] for qid in qids]) for k in METRICS},
                       **{f"ctx@{b}": _mean([scored[qid][f"ctx@{b}"] for qid in with_short]) for b in BUDGETS},
                       "n short": len(with_short)}
    return rows


def comparisons(per_question, questions) -> dict:
    """Per corpus and pair of :data:`PAIRS`: questions whose Recall@5 is higher (better) or lower
    (worse) with the first variant, counted under ``all`` and each of their evidence sources."""
    out = {}
    for corpus, pq in per_question.items():
        for a, b in PAIRS:
            if a not in pq or b not in pq:
                continue
            better, worse = Counter(), Counter()
            for q in questions:
                d = pq[a][q.qid]["R@5"] - pq[b][q.qid]["R@5"]
                if d:
                    sources = [SOURCES.get(s, s) for s in q.evidence_sources or ("(none)",)]
                    (better if d > 0 else worse).update(sources + ["all"])
            out[f"{corpus}: {a} vs {b}"] = {"better": dict(better), "worse": dict(worse)}
    return out


def r5_by(per_question, subsets: dict) -> dict:
    """Per corpus and subset of questions (``{label: qids}``): n and each variant's mean Recall@5."""
    out = {}
    for corpus, pq in per_question.items():
        out[corpus] = {}
        for label, qids in subsets.items():
            means = {name: _mean([pq[name][qid]["R@5"] for qid in qids]) for name in pq}
            out[corpus][label] = {"n": len(qids), **means}
    return out


def stage_counts(runs) -> dict:
    """Per corpus and pipeline variant: mean candidates per question at each stage."""
    from colgraph_engine.pipeline import PipelineConfig

    budget = PipelineConfig().expansion_budget
    out = {}
    for corpus, by_variant in runs.items():
        out[corpus] = {}
        for name, per_q in by_variant.items():
            if name == PLAIN:
                continue
            c = [r["counts"] for r in per_q.values()]
            out[corpus][name] = {
                "recalled documents": _mean([x["recall"]["documents"] for x in c]),
                "subgraph nodes": _mean([x["expand"]["nodes"] for x in c]),
                "visual candidates": _mean([x["visual"]["candidates"] for x in c]),
                "E_k": _mean([x["visual"]["ranked"] for x in c]),
                "sources": _mean([x["evidence"]["sources"] for x in c]),
                "subgraph pages": _mean([len(r["subgraph_pages"]) for r in per_q.values()]),
                "at expansion budget": _mean([x["expand"]["nodes"] >= budget for x in c]),
            }
    return out


def examples(per_question, questions) -> dict:
    """Up to 6 open-corpus questions where graph+chunks beats chunks on Recall@5 (wins) and 6
    where it loses, largest difference first."""
    out = {"wins": [], "losses": []}
    pq = per_question.get("open", {})
    if GRAPH not in pq or CHUNKS not in pq:
        return out
    deltas = sorted(((pq[GRAPH][q.qid]["R@5"] - pq[CHUNKS][q.qid]["R@5"], q) for q in questions),
                    key=lambda t: (-abs(t[0]), t[1].qid))
    for d, q in deltas:
        kind = "wins" if d > 0 else "losses" if d < 0 else None
        if kind and len(out[kind]) < 6:
            out[kind].append({"qid": q.qid, "delta": d, "question": q.question, "answer": q.answer,
                              "gold": sorted(q.evidence_pages), "seeds": pq[GRAPH][q.qid].get("seeds", []),
                              "graph_top5": pq[GRAPH][q.qid]["top5"], "chunks_top5": pq[CHUNKS][q.qid]["top5"]})
    return out


def summarise(args, ds, meta, index, questions, gold, runs, timing, variants) -> dict:
    """The report's data: per corpus and variant the group table, and everything the Markdown shows."""
    from colgraph_engine.pipeline import PipelineConfig

    image_q = {q.qid for q in questions if set(q.evidence_sources) & set(IMAGE_SOURCES)}
    groups = {"all": [q.qid for q in questions], "image-bearing": [q.qid for q in questions if q.qid in image_q],
              "cross-page": [q.qid for q in questions if len(gold[q.qid]) > 1],
              "text-only": [q.qid for q in questions if q.qid not in image_q]}
    short = {q.qid: short_answer(q) for q in questions}
    per_question = {c: {name: score_run(name, per_q, gold, short) for name, per_q in by_variant.items()}
                    for c, by_variant in runs.items()}
    table = {c: {name: group_rows(scored, groups, short) for name, scored in by_variant.items()}
             for c, by_variant in per_question.items()}
    sources = sorted({s for q in questions for s in q.evidence_sources})
    docs = sorted({q.doc_id for q in questions})
    notes = sorted({n for by_variant in runs.values() for per_q in by_variant.values() for r in per_q.values()
                    for n in r.get("notes", [])})
    return {
        "examples": examples(per_question, questions),
        "by_document_R@5": r5_by(per_question, {d: [q.qid for q in questions if q.doc_id == d] for d in docs}),
        "settings": {"max_pages": args.max_pages, "max_docs": args.max_docs, "ocr": not args.no_ocr,
                     "image_scale": args.image_scale, "patch_grid": args.patch_grid, "text_length": args.text_length, "text_items": args.text_items,
                     "seed": args.seed, "pipeline_defaults": PipelineConfig().as_dict(), "variants": variants,
                     "encoders": index.encoder_info,
                     "document_compute": "bfloat16" if "bf16" in cache_dir(args).name.split("-") else "float32"},
        "counts": {"documents": len(meta["pages"]), "documents_in_dataset": len(ds.doc_ids),
                   "pages": sum(len(v) for v in meta["pages"].values()),
                   "pages_in_dataset": sum(ds.page_counts.values()), "questions": len(questions),
                   "image_bearing_questions": len(groups["image-bearing"]),
                   "questions_in_dataset": len(ds.questions),
                   "unanswerable_questions_skipped": sum(not q.answerable for q in ds.questions
                                                         if q.doc_id in meta["pages"]),
                   "excluded_no_text_layer": meta["excluded_no_text_layer"],
                   "page_text_sources": meta["text_sources"], "skipped_labels": ds.skipped,
                   "index": index.counts},
        "build": {"cached": meta.get("cached"), "timings_s": meta["timings_s"], "load_s": meta.get("load_s")},
        "table": table,
        "by_source_R@5": r5_by(per_question, {s: [q.qid for q in questions if s in q.evidence_sources]
                                              for s in sources}),
        "comparisons": comparisons(per_question, questions), "stage_counts": stage_counts(runs),
        "timing": timing, "notes": notes, "per_question": per_question,
    }


def counted(d: dict) -> str:
    """``all 3, Chart 1, ...`` (``all`` first), or 0."""
    return ", ".join(f"{s} {n}" for s, n in sorted(d.items(), key=lambda kv: (kv[0] != "all", kv[0]))) or "0"


MAIN_COLUMNS = [("variant", "variant"), ("questions", "questions"), ("n:", "n"),
                *[(f"{title}:", h.cell(key)) for title, key in (
                    ("R@1", "R@1"), ("R@5", "R@5"), ("R@10", "R@10"), ("any", "any"), ("sources R@5", "src R@5"),
                    ("E_k R@5", "img R@5"), ("S1 doc", "S1 doc"), ("S4 subgraph", "S4 subgraph"),
                    ("S6 sources", "S6 sources"))],
                ("n short:", "n short"), ("ctx@1000:", h.cell("ctx@1000")), ("ctx@2000:", h.cell("ctx@2000"))]
STAGE_COLUMNS = [("variant", "variant"),
                 *[(f"{title}:", h.cell(key, ".2f" if key == "at expansion budget" else ".1f")) for title, key in (
                     ("recalled documents", "recalled documents"), ("subgraph nodes", "subgraph nodes"),
                     ("pages the subgraph touches", "subgraph pages"),
                     ("share at the expansion budget", "at expansion budget"),
                     ("visual candidates", "visual candidates"), ("E_k", "E_k"), ("sources", "sources"),
                     ("seconds", "seconds"))]]


def corpus_lines(r, corpus: str) -> list[str]:
    """The corpus's section: the group table, Recall@5 by evidence source, candidates per stage."""
    names = list(r["table"][corpus])
    rows = [{"variant": name, "questions": g, **row} for name, by_group in r["table"][corpus].items()
            for g, row in by_group.items()]
    stages = [{"variant": name, **row, "seconds": r["timing"][corpus][name]["total_s"]}
              for name, row in r["stage_counts"][corpus].items()]
    return [f"## {corpus} corpus", "", *h.table(MAIN_COLUMNS, rows), "",
            "Recall@5 by evidence source (a question counts under each of its sources):", "",
            *h.table([("source", "source"), ("n:", "n"), *[(f"{n}:", h.cell(n)) for n in names]],
                     [{"source": src, **row} for src, row in r["by_source_R@5"][corpus].items()]), "",
            "Mean candidates per question:", "", *h.table(STAGE_COLUMNS, stages), ""]


def by_document_lines(r, corpus: str) -> list[str]:
    """Recall@5 per document of the main variants, naming the documents where graph+chunks is below chunks."""
    rows = r["by_document_R@5"][corpus]
    show = [n for n in (PLAIN, GRAPH, CHUNKS, MKG) if n in r["table"]["open"]]
    below = [d for d, row in rows.items() if row[GRAPH] < row[CHUNKS] - 1e-9]
    return [f"Recall@5 per document ({corpus} corpus; each document's own questions): {GRAPH} is below "
            f"{CHUNKS} on {len(below)} of {len(rows)} documents" + (f" ({', '.join(below)})" if below else "") + ".",
            "", *h.table([("document", "document"), ("questions:", "n"), *[(f"{n}:", h.cell(n)) for n in show]],
                         [{"document": d, **row} for d, row in rows.items()]), ""]


def example_lines(r) -> list[str]:
    out = ["## Examples (open corpus): graph+chunks vs chunks", ""]
    for kind in ("wins", "losses"):
        out += [f"**{kind}** (Recall@5 of {GRAPH} minus {CHUNKS}, largest first):", ""]
        out += [f"* `{e['qid']}` ({e['delta']:+.2f}) {e['question']!r}; gold {e['gold']}; seeds {e['seeds'][:6]}; "
                f"graph+chunks top 5 {e['graph_top5']}; chunks top 5 {e['chunks_top5']}" for e in r["examples"][kind]]
        out.append("")
    return out


def render_markdown(r, args) -> list[str]:
    """The report's body (its title and environment header come from the harness)."""
    c, s, b = r["counts"], r["settings"], r["build"]
    n = c["index"]
    lines = [
        f"Run {r['run_s'] / 60:.1f} min "
        + (f"(index from the cache; building it took {b['timings_s']['total build'] / 60:.1f} min)." if b["cached"]
           else "(index built in this run)."), "",
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
        f"**Index**: {n.get('segments', 0)} segments (one per page), {n.get('entities', 0)} entities, "
        f"{n.get('relations', 0)} relations (the default offline extractor, no LLM), {n.get('images', 0)} page images. "
        f"Encoders: tokens `{s['encoders']['tokens']['name']}` (as quality_report.py), text "
        f"`{s['encoders']['text']['name']}`, patches `{s['encoders']['patches']['name']}` (pages rendered at scale "
        f"{s['image_scale']}; documents encoded in {s.get('document_compute', 'float32')}). MiniLM and EfficientNet share no embedding space, so E_k is ranked on the images' "
        "*text views* (here: the page text); the patches only serve queries with an image (none here).",
        "",
        *DEFINITIONS, "", *targets(r), ""]
    for corpus in ("per-document", "open"):
        lines += corpus_lines(r, corpus)
    for corpus in ("per-document", "open"):
        lines += by_document_lines(r, corpus)
    lines += ["Questions whose Recall@5 is higher (better) or lower (worse) with the first variant, by evidence "
              "source:", "",
              *h.table([("comparison", "comparison"), ("better", lambda x: counted(x["better"])),
                        ("worse", lambda x: counted(x["worse"]))],
                       [{"comparison": k, **v} for k, v in r["comparisons"].items()]), "", *example_lines(r)]
    lines += ["", "Build: " + ", ".join(f"{k} {v:.0f} s" for k, v in b["timings_s"].items())
              + (f"; this run opened the cached index in {b['load_s']:.0f} s" if b["cached"] else "")
              + ". Pipeline notes seen: " + "; ".join(r["notes"]) + "."]
    return lines


def targets(r) -> list[str]:
    """The issue's targets (graph = the default graph+chunks), each with the measured values."""
    o, p = r["table"]["open"], r["table"]["per-document"]
    out = ["**Targets** (issue 24 item 6; open corpus unless said):", "",
           "| target | measured | met |", "|---|---|---|"]

    def row(text, lhs, rhs, margin):
        met = "yes" if lhs >= rhs + margin - 1e-9 else "no"
        out.append(f"| {text} | {lhs:.3f} vs {rhs:.3f} + {margin:.2f} | {met} |")

    row("graph R@5 >= chunks + 0.03 (all)", o[GRAPH]["all"]["R@5"], o[CHUNKS]["all"]["R@5"], 0.03)
    row("graph R@5 >= chunks + 0.05 (cross-page)", o[GRAPH]["cross-page"]["R@5"], o[CHUNKS]["cross-page"]["R@5"], 0.05)
    if H0 in o:
        h1, h0 = o[GRAPH]["cross-page"]["R@5"], o[H0]["cross-page"]["R@5"]
        out.append(f"| hops=1 better than hops=0 (cross-page R@5) | {h1:.3f} vs {h0:.3f} | "
                   f"{'yes' if h1 > h0 else 'no'} |")
    g, c = p[GRAPH]["all"]["R@5"], p[CHUNKS]["all"]["R@5"]
    out.append(f"| per-document corpus: graph not below chunks (R@5, all) | {g:.3f} vs {c:.3f} | "
               f"{'yes' if g >= c else 'no'} |")
    for corpus in ("per-document", "open"):
        rows = r["by_document_R@5"][corpus]
        below = sum(1 for row in rows.values() if row[GRAPH] < row[CHUNKS] - 1e-9)
        out.append(f"| {corpus} corpus: graph never below chunks on any document (R@5) | below on {below} of "
                   f"{len(rows)} documents | {'yes' if not below else 'no'} |")
    row("context efficiency at 2,000 tokens >= chunks + 0.05", o[GRAPH]["all"]["ctx@2000"],
        o[CHUNKS]["all"]["ctx@2000"], 0.05)
    return out


def plot(r, path) -> str | None:
    """Recall@5 (all, image-bearing, cross-page) and ctx@2000 of every variant, one panel per corpus."""
    panels = {}
    for corpus in ("per-document", "open"):
        t = r["table"][corpus]
        labels = {n: n.split(": ", 1)[1].replace(" ", "\n", 1) for n in t}
        series = {f"R@5 {g} (n={next(iter(t.values()))[g]['n']})": {labels[n]: t[n][g]["R@5"] for n in t}
                  for g in ("all", "image-bearing", "cross-page")}
        series["ctx@2000"] = {labels[n]: t[n]["all"]["ctx@2000"] for n in t}
        panels[f"{corpus} corpus"] = (list(labels.values()), series)
    c = r["counts"]
    return h.bar_panels(path, panels, ylabel="Recall@5 of evidence pages / context efficiency", labels=None,
                        rotation=60, title=f"MMLongBench-Doc dev: pipeline variants, {c['documents']} documents, "
                        f"{c['pages']} pages, {c['questions']} questions")


if __name__ == "__main__":
    raise SystemExit(main())
