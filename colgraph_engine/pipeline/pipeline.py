"""The query path: seven stages, each run once for a whole batch of queries.

    1 recall     top-Kd documents (text and/or image side, fused)           recall.py
    2 merge      G_m, the alias-merged view of those documents               graph_retrieval.py
    3 seeds      top-Kg entities and relations (and image-linked entities)   graph_retrieval.py
                 or entities named in the question (graph+chunks)            graph_adds.py
    4 expand     l hops with the relevance filter                            graph_retrieval.py
                 or graph support and the combined ranking (graph+chunks)    graph_adds.py
    5 visual     X_img(q) and its top-k E_k(q) by MaxSim of C_vis(q)          visual.py
    6 evidence   B(q), R(q), G_e(q), G*(q)                                   evidence.py
    7 context    ranked sections, budgets, prompt; optional generator        context.py

Encoding the queries is timed apart from the stages (``timings["encode"]``).
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from ..graph.kinds import NodeKind
from ..kg.index import KnowledgeIndex
from ..kg.vectors import Encoders, crop_to_box, image_text_view, open_image, region_text_view
from ..packed import pack
from .config import PipelineConfig, calibrated_threshold
from .citations import Citer, cite_evidence
from .context import Answer, Context, build_context, run_generator
from .cvis import VisualPhrases, extract_visual_phrases
from .evidence import Evidence, build_evidence, chunk_subgraph, expand_gstar, llm_records
from .graph_adds import NameSeeds, added_subgraph, focus_evidence, graph_support, name_seeds, rank_text_units, \
    rerank_visual, seeds_from_names
from .graph_retrieval import Seeds, Subgraph, TextScorer, expand_filtered, mkg_expand, retrieve_seeds, \
    subgraph_from_expansion
from .query import Query, as_query, load_image
from .recall import Recall, recall_documents
from .view import IndexView
from .visual import rank_visual, resolve_units, visual_candidates

STAGES = ("recall", "merge", "seeds", "expand", "visual", "evidence", "context")


@dataclass
class ImageHit:
    """A ranked image or region of E_k(q)."""
    node: int
    kind: str
    doc_id: str
    image: str | None
    name: str
    bbox: tuple | None
    score: float
    text: str
    pages: tuple[int, ...] = ()  # citation (pipeline.citations): the pages it is on
    box: tuple | None = None  # its box on the page (in the image when it is on no page)
    cite: str = ""  # the citation's label, e.g. "[report.pdf p.2 box (0.10, 0.20, 0.55, 0.60)]"

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Result:
    """Everything one query produced. ``timings`` are the batch's seconds per stage (and
    ``encode``); ``counts`` the candidates each stage handled for this query."""
    query: Query
    documents: list[tuple[str, float]]
    recall_sides: tuple[str, ...]
    seed_entities: list[str]
    seed_relations: list[tuple[str, str]]
    subgraph_nodes: np.ndarray
    subgraph_hops: np.ndarray
    images: list[ImageHit]
    image_units: str
    visual_phrases: VisualPhrases
    visual_used_question: bool
    evidence: Evidence
    context: Context
    answer: Answer | None
    timings: dict[str, float]
    counts: dict[str, dict]
    config: PipelineConfig
    notes: list[str] = field(default_factory=list)
    visual_text: str = ""  # what was token-encoded for the visual ranker: C_vis phrases (+ caption)

    def as_dict(self) -> dict:
        """A JSON-ready summary (arrays as lists)."""
        ev = self.evidence
        return {
            "question": self.query.question, "caption": self.query.caption, "has_image": self.query.image is not None,
            "documents": [{"doc_id": d, "score": s} for d, s in self.documents], "recall_sides": list(self.recall_sides),
            "seed_entities": self.seed_entities, "seed_relations": [list(r) for r in self.seed_relations],
            "subgraph": {"nodes": self.subgraph_nodes.tolist(), "hops": self.subgraph_hops.tolist()},
            "visual_phrases": list(self.visual_phrases.phrases), "visual_text": self.visual_text,
            "visual_used_question": self.visual_used_question,
            "image_units": self.image_units, "images": [h.as_dict() for h in self.images],
            "evidence": {"entities": ev.entities, "relations": [{k: v for k, v in r.items()} for r in ev.relations],
                         "sources": ev.sources, "records": [r.__dict__ for r in ev.records],
                         "ge_nodes": ev.ge_nodes.tolist(), "gstar_nodes": ev.gstar_nodes.tolist()},
            "context": self.context.render(),
            "answer": None if self.answer is None else {"text": self.answer.text, "error": self.answer.error},
            "timings": self.timings, "counts": self.counts, "notes": self.notes,
        }


class Pipeline:
    """mKG-RAG's dual-stage retrieval with ColGraphRAG's late-interaction visual ranking.

    Args:
        index: a :class:`~colgraph_engine.kg.KnowledgeIndex` (its stores and graph are read, never changed).
        encoders: the encoders for queries; must be the ones the index was built with (names
            and dimensions as the manifest records them). None: the index's own.
        config: a :class:`PipelineConfig` (None: the papers' defaults and ours).
        generator: None, or ``callable(prompt: str, images: list[PIL.Image]) -> str``, e.g.
            :class:`~colgraph_engine.pipeline.OpenAIGenerator`; used unless ``only_context``.
        record_extractor: None, or ``callable(question: str, evidence_text: str) -> str``, an LLM
            asked for relation records conditioned on the question (any dialect the KG parsers
            read); its records join R(q) with ``source="llm"`` (see ``evidence.llm_records``).
        num_threads: threads for graph calls (default: the engine's).
        device: where the vectors are scored (``"cuda"``: the Triton kernels; the graph stays on
            the CPU). The index's stores are copied there once per assembled graph.
    """

    def __init__(self, index: KnowledgeIndex, encoders: Encoders | None = None, config: PipelineConfig | None = None,
                 *, generator: Callable[[str, list], str] | None = None,
                 record_extractor: Callable[[str, str], str] | None = None, num_threads: int | None = None,
                 device: str | torch.device = "cpu"):
        if not isinstance(index, KnowledgeIndex):
            raise TypeError(f"index: expected a KnowledgeIndex, got {type(index).__name__}")
        encoders = index.encoders if encoders is None else encoders
        if not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders (the index has none; pass them), got {type(encoders).__name__}")
        if index.encoder_info and encoders.describe() != index.encoder_info:
            raise ValueError(f"encoders: the index was built with {index.encoder_info}, the pipeline was given "
                             f"{encoders.describe()}; queries must be encoded in the index's spaces")
        if encoders.tokens is None:
            raise ValueError("encoders: a token encoder is required (question tokens for recall and ranking)")
        config = PipelineConfig() if config is None else config
        if not isinstance(config, PipelineConfig):
            raise TypeError(f"config: expected a PipelineConfig or None, got {type(config).__name__}")
        if generator is not None and not callable(generator):
            raise TypeError(f"generator: expected None or a callable (prompt, images) -> str, got {type(generator).__name__}")
        if record_extractor is not None and not callable(record_extractor):
            raise TypeError(f"record_extractor: expected None or a callable (question, evidence_text) -> str, "
                            f"got {type(record_extractor).__name__}")
        self.index, self.encoders, self.config, self.generator = index, encoders, config, generator
        self.record_extractor = record_extractor
        self.num_threads = num_threads
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda', got {device!r} ({exc})") from None
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: 'cuda' was asked for, but torch sees no CUDA device here")
        self.image_units = "" if config.visual_ranker == "off" else resolve_units(encoders.describe(), config.visual_units)
        self._view: IndexView | None = None

    def threshold(self, config: PipelineConfig | None = None) -> float:
        """The filter threshold in force (see :class:`PipelineConfig`)."""
        cfg = config or self.config
        if cfg.threshold is not None:
            return cfg.threshold
        if cfg.filter == "mkg" or self.encoders.text is None:
            return 0.5
        return calibrated_threshold(self.encoders.text.name)

    def view(self) -> IndexView:
        if self._view is None or self._view.graph is not self.index.graph or self._view.version != self.index.version:
            self._view = IndexView(self.index, self.device)
        return self._view

    # -- public entry points ------------------------------------------------------------------
    def retrieve(self, query: Query | str) -> Result:
        """Runs the pipeline for one query (the same code path as a batch of one)."""
        return self.retrieve_batch([query])[0]

    def encode(self, queries: Sequence[Query | str]) -> dict:
        """The batch's query encodings, as :meth:`retrieve_batch` takes them back (``encoded=``)."""
        return self._encode(self._queries(queries))

    @staticmethod
    def _queries(queries) -> list[Query]:
        if isinstance(queries, (str, Query)) or not isinstance(queries, Sequence):
            raise TypeError("queries: expected a sequence of Query or question strings")
        if not queries:
            raise ValueError("queries: expected at least one query")
        return [as_query(q, f"queries[{i}]") for i, q in enumerate(queries)]

    def retrieve_batch(self, queries: Sequence[Query | str], *, encoded: dict | None = None,
                       recall: Recall | None = None) -> list[Result]:
        """Runs every stage once for all `queries`; results equal :meth:`retrieve` on each.

        `encoded` (from :meth:`encode` on the same queries) skips encoding; `recall` replaces
        stage 1 with its documents (numbers of this index) and scores: how a caller that ranked
        documents elsewhere (``colgraph_engine.distributed``) runs stages 2-7 here."""
        qs = self._queries(queries)
        if recall is not None and not (isinstance(recall, Recall) and len(recall.docs) == len(qs)):
            raise TypeError(f"recall: expected a Recall with one entry per query ({len(qs)})")
        cfg = self.config
        timings: dict[str, float] = {}
        counts: list[dict[str, dict]] = [{s: {} for s in STAGES} for _ in qs]

        @contextmanager
        def stage(name):
            t0 = time.perf_counter()
            yield
            timings[name] = time.perf_counter() - t0

        with stage("encode"):
            enc = self._encode(qs) if encoded is None else encoded
        view = self.view()
        with stage("recall"):
            if recall is None:
                recall = recall_documents(view, enc["text"], enc["image"], enc["has_image"], cfg)
        docs = recall.docs
        with stage("merge"):
            for i, d in enumerate(docs):  # G_m is the view restricted to these documents: count it
                counts[i]["merge"] = {"documents": int(d.size), "nodes": int(sum(
                    view.node_first[j + 1] - view.node_first[j] for j in np.searchsorted(view.numbers, d).tolist()))}
        scorer = TextScorer(view, enc["text_vectors"])
        threshold = self.threshold()
        seeds: Seeds | None = None
        ranked = None  # graph+chunks: per query the text units by the combined rule
        support = None
        with stage("seeds"):
            if cfg.retrieval == "graph" or (cfg.retrieval == "graph+chunks" and cfg.seeds_by == "descriptions"):
                seeds = retrieve_seeds(view, scorer, docs, cfg.kg, enc["image"], enc["has_image"], self.num_threads)
            named = None
            if cfg.retrieval != "chunks" and cfg.seeds_by != "descriptions":
                named = name_seeds(view, [q.text for q in qs], enc["text"], docs, cfg.kg, cfg.seeds_by,
                                   self.encoders.tokens)
                seeds = seeds_from_names(seeds, named, view, len(qs))
            elif cfg.retrieval == "graph+chunks":
                named = NameSeeds.of(seeds)
        with stage("expand"):
            if cfg.retrieval == "graph+chunks":
                support = graph_support(view, scorer, named, docs, cfg.hops, filter=cfg.filter, threshold=threshold,
                                        min_keep=cfg.min_keep, budget=cfg.expansion_budget)
                ranked = rank_text_units(view, enc["text"], docs, support, cfg.chunks_k, cfg.graph_weight)
                sub = added_subgraph(view, scorer, ranked, support, named, docs, cfg.chunks_k, cfg.kg)
            elif cfg.retrieval == "chunks":
                sub = chunk_subgraph(view, enc["text"], docs, cfg.chunks_k)
            elif cfg.filter == "mkg":
                sub = mkg_expand(view, scorer, seeds, docs, cfg.hops, threshold, cfg.min_keep)
            else:
                filtered = cfg.filter == "default"
                ex = expand_filtered(view, scorer, seeds.nodes, docs, cfg.hops, filtered=filtered, threshold=threshold,
                                     min_keep=cfg.min_keep, budget=cfg.expansion_budget, num_threads=self.num_threads)
                sub = subgraph_from_expansion(view, scorer, ex, seeds, filtered=filtered, threshold=threshold,
                                              min_keep=cfg.min_keep)
        with stage("visual"):
            if cfg.visual_ranker == "off":
                cands = [np.zeros(0, np.int64) for _ in qs]
            else:
                cands = visual_candidates(view, sub, docs, cfg.all_document_images, self.num_threads)
            visual = rank_visual(view, cands, enc["cvis"], enc["image"], enc["has_image"], self.image_units,
                                 cfg.visual_ranker, cfg.k if support is None else 1 << 30, cfg.rrf_k,
                                 enc["cvis_used_question"])
            if support is not None:  # graph+chunks: the images' own score combined with their support
                visual = rerank_visual(view, visual, support, cfg.k, cfg.graph_weight)
        with stage("evidence"):
            evidence = build_evidence(view, sub, visual, enc["text"], cfg.evidence_k, self.num_threads,
                                      ranked=None if ranked is None else [(u, sc) for u, sc, _, _ in ranked])
            if ranked is not None:
                focus_evidence(evidence, [q.text for q in qs])
            expand_gstar(view, scorer, evidence, docs, rounds=cfg.gstar_rounds, budget=cfg.gstar_budget,
                         filtered=cfg.filter != "off", threshold=threshold, min_keep=cfg.min_keep,
                         num_threads=self.num_threads)
            extractor_errors: list[str | None] = [None] * len(qs)
            if self.record_extractor is not None:
                for i, q in enumerate(qs):
                    extra, extractor_errors[i] = llm_records(self.record_extractor, q.question, evidence[i], view)
                    evidence[i].records.extend(extra)
            citer = Citer(self.index)  # document, pages and box of every row and record
            cite_evidence(citer, evidence)
        with stage("context"):
            hits = [[self._image_hit(view, v, s, citer) for v, s in zip(visual.nodes[i].tolist(),
                                                                         visual.scores[i].tolist())]
                    for i in range(len(qs))]
            contexts = [build_context(q.question, evidence[i], [self._image_row(h) for h in hits[i]], cfg,
                                      self.image_units) for i, q in enumerate(qs)]
        answers: list[Answer | None] = [None] * len(qs)
        if not cfg.only_context and self.generator is not None:
            t0 = time.perf_counter()
            for i, q in enumerate(qs):
                images = ([enc["images"][i]] if enc["images"][i] is not None else []) + self._hit_images(hits[i])
                answers[i] = run_generator(self.generator, contexts[i].render(), images)
            timings["generate"] = time.perf_counter() - t0
        results = []
        for i, q in enumerate(qs):
            c = counts[i]
            c["recall"] = {"units_scored": recall.units[i], "documents": int(docs[i].size),
                           "paths": dict(recall.paths[i])}  # per store: which ranker ran and why
            if i < len(recall.budget) and recall.budget[i]:  # stores searched with the adaptive budget
                c["recall"]["budget"] = dict(recall.budget[i])
            if seeds is not None:
                c["seeds"] = {**{k: v[i] for k, v in seeds.candidates.items()}, "entities": int(seeds.entities[i].size),
                              "relations": int(seeds.relations[i].size), "image_hits": int(seeds.image_hits[i].size),
                              "seed_nodes": int(seeds.nodes[i].size)}
            c["expand"] = {"judged": 0 if sub.judged is None else int(sub.judged[i]), "nodes": int(sub.nodes[i].size),
                           "relations": int(sub.relations[i].size), "edges": int(sub.edges[i].size)}
            c["visual"] = {"candidates": int(visual.candidates[i].size), "ranked": int(visual.nodes[i].size)}
            ev = evidence[i]
            c["evidence"] = {"entities": len(ev.entities), "relations": len(ev.relations), "sources": len(ev.sources),
                             "records": len(ev.records), "ge_nodes": int(ev.ge_nodes.size),
                             "gstar_nodes": int(ev.gstar_nodes.size)}
            c["context"] = dict(contexts[i].tokens)
            notes = []
            if cfg.recall_side == "image" and q.image is None:
                notes.append("recall_side='image' but the query has no image: the text side was used")
            if visual.used_question[i] and cfg.visual_ranker != "off":
                notes.append("the question has no visual cue: images were ranked by the question's tokens")
            if extractor_errors[i]:
                notes.append(f"record extractor failed: {extractor_errors[i]}")
            if self.image_units == "text_view":
                notes.append("images ranked by their text views (caption, OCR, region labels): no text-image model")
            for store in ("segment", "entity", "image_text"):
                if store not in view.stores or not view.stores[store].node.size:
                    notes.append(f"the index has no {store} vectors: the stages that read them are empty")
            results.append(Result(
                q, [(view.doc_id_of[int(d)], float(s)) for d, s in zip(docs[i], recall.scores[i])], recall.sides[i],
                [] if seeds is None else [self.index.describe_node(int(v))["name"] for v in seeds.entities[i]],
                [] if seeds is None else [(self.index.describe_node(int(view.edge_src[e]))["name"],
                                           self.index.describe_node(int(view.edge_dst[e]))["name"]) for e in seeds.relations[i]],
                sub.nodes[i], sub.hop[i], hits[i], self.image_units, enc["phrases"][i], visual.used_question[i],
                evidence[i], contexts[i], answers[i], dict(timings), c, cfg, notes, enc["visual_texts"][i]))
        return results

    # -- helpers ------------------------------------------------------------------------------
    def _encode(self, qs: list[Query]) -> dict:
        e = self.encoders
        texts = [q.text for q in qs]
        text = pack(e.tokens(texts), dtype=torch.float32)
        text_vectors = e.text(texts).float() if e.text is not None else None
        images = [None if q.image is None else load_image(q.image, f"queries[{i}].image") for i, q in enumerate(qs)]
        has_image = np.asarray([im is not None for im in images], bool)
        image = None
        if has_image.any() and e.patches is not None:
            got = e.patches([im for im in images if im is not None])
            it = iter(got)
            image = pack([next(it) if im is not None else torch.zeros((0, e.patches.dim)) for im in images],
                         dtype=torch.float32)
        elif has_image.any():
            has_image[:] = False  # no image encoder: the image side cannot run (stated in the notes)
        phrases = [extract_visual_phrases(q.question) for q in qs]
        visual_texts = [p.text() if not q.caption.strip() else
                        (f"{p.text()} ; {q.caption.strip()}" if p.has_visual_cue else q.caption.strip())
                        for p, q in zip(phrases, qs)]
        cvis = pack(e.tokens(visual_texts), dtype=torch.float32)
        return {"text": text, "text_vectors": text_vectors, "image": image, "has_image": has_image, "images": images,
                "phrases": phrases, "cvis": cvis, "visual_texts": visual_texts,
                "cvis_used_question": [not p.has_visual_cue and not q.caption.strip() for p, q in zip(phrases, qs)]}

    def _image_hit(self, view: IndexView, node: int, score: float, citer: Citer | None = None) -> ImageHit:
        d = self.index.describe_node(node)
        g = self.index.document(d["doc_id"])
        text = image_text_view(g, d["local"]) if d["kind"] == "image" else region_text_view(g, d["local"])
        c = (citer or Citer(self.index)).node(node)
        return ImageHit(node, d["kind"], d["doc_id"], d["image"], d["name"], d["bbox"], score, text, c.pages, c.box,
                        c.label())

    @staticmethod
    def _image_row(h: ImageHit) -> dict:
        return {"image": h.image, "kind": h.kind, "region": h.name if h.kind == "region" else None,
                "bbox": None if h.bbox is None else [round(x, 4) for x in h.bbox], "document": h.doc_id,
                "score": round(h.score, 4), "text_view": h.text, "cite": h.cite, "pages": list(h.pages),
                "box": None if h.box is None else [round(x, 4) for x in h.box]}

    def _hit_images(self, hits: list[ImageHit]) -> list:
        out = []
        for h in hits:
            g = self.index.document(h.doc_id)
            pix = g.pixels.get(h.image) if h.image else None
            if pix is None:
                continue
            try:
                im = open_image(pix)
                out.append(im if h.kind == "image" or h.bbox is None else crop_to_box(im, np.asarray(h.bbox)))
            except Exception:  # an image that cannot be read is left out of the generator call
                continue
        return out


__all__ = ["ImageHit", "Pipeline", "Result", "STAGES", "NodeKind", "Subgraph"]
