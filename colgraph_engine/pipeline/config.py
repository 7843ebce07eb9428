"""Pipeline settings, validated once, and the papers' ablations as switches.

Defaults from mKG-RAG (as the project's design notes state them): the top Kd = 10 documents,
the top Kg = 10 entities and relations, l = 1 hop; its code's filter keeps items with cosine
> 0.5 and at least 3 per list. k = 10 visual candidates is the default the project's issue gives
for ColGraphRAG; we have not checked it against that paper's text. Every other default here is
the engine's own choice and says so.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from ..kg.index.prefilters import AUTO_MIN_TOKENS

RECALL_SIDES = ("text", "image", "fused")
RECALL_RANKERS = ("auto", "maxsim", "pooled", "prefilter")
PREFILTER_MODES = ("auto", "prefilter")
PREFILTER_EXACT = ("store", "codes")
PREFILTER_NBITS = (1, 2, 4)
PREFILTER_BUDGETS = ("adaptive", "plaid")
FUSIONS = ("rrf", "weighted")
RETRIEVALS = ("graph+chunks", "graph", "chunks")
SEED_MATCHES = ("auto", "names", "lexical", "descriptions")
FILTERS = ("off", "mkg", "default")
VISUAL_RANKERS = ("maxsim", "pooled", "off")
VISUAL_UNITS = ("auto", "patches", "text_view")
CONTEXT_MODES = ("graph", "chunks", "hybrid")

MAX_QUESTION_CHARS = 4096

# Filter thresholds calibrated per text encoder (cosine of the question's pooled vector with an
# entity's "name: description" vector), measured by benchmarks/calibrate_filter.py on generated
# data: 400 made-up entities, 300 template questions naming one or two of them; the threshold
# maximises balanced accuracy over (question, entity) pairs. Results (2026-11-30,
# benchmarks/results/filter_calibration.md): hashing 0.298 (balanced accuracy 0.935), MiniLM
# 0.379 (0.975). mKG-RAG's 0.5 stays for `filter="mkg"` and for encoders not listed here.
CALIBRATED_THRESHOLDS = {
    "hashing": 0.30,
    "minilm": 0.38,
}


def calibrated_threshold(encoder_name: str) -> float:
    """The default filter threshold for a text encoder (by name prefix); 0.5 when unknown."""
    for prefix, t in CALIBRATED_THRESHOLDS.items():
        if encoder_name.startswith(prefix):
            return t
    return 0.5


@dataclass(frozen=True)
class PipelineConfig:
    """Every setting of :class:`~colgraph_engine.pipeline.Pipeline`; each switch changes only its stage.

    Stage 1, document recall:
        kd: documents recalled per query (mKG-RAG: 10).
        recall_side: ``"text"`` (question + caption tokens vs segment and table tokens),
            ``"image"`` (query-image patches vs image patches) or ``"fused"`` (both; a query
            without an image uses the text side alone). mKG-RAG's text-only, vision-only and
            fused variants.
        recall_ranker: ``"auto"`` (the default: sublinear where it pays, exact elsewhere),
            ``"maxsim"`` (exact late interaction over every unit, bit-identical to the engine
            before ``"auto"`` existed), ``"pooled"`` (cosine of mean vectors, the single-vector
            baseline) or ``"prefilter"`` (a PLAID-style centroid prefilter,
            :mod:`colgraph_engine.prefilter`, over every recall store: the one the index carries,
            else one built over the view on first use). ``"auto"``, per recall store (text and
            image side): a store with fewer than `prefilter_min_tokens` live tokens is scored
            exactly (no prefilter is built or read: exact MaxSim is faster there), with results
            identical to ``"maxsim"``; a larger one is searched through the prefilter the index
            carries (:meth:`~colgraph_engine.kg.KnowledgeIndex.enable_prefilter`, maintained by
            its commits) with the `prefilter_budget`; a larger store without one (or whose
            carried prefilter disagrees with it) is scored exactly, with a warning logged once
            per index and store saying how to make it carry one. It never builds a prefilter on
            the query path: a build is a k-means over the store (minutes at a few million
            tokens) and a view lives only until the index changes, so a service would pay it
            again after every write; an explicit ``"prefilter"`` keeps that behaviour.
            ``Recall.paths`` (and each result's ``counts["recall"]["paths"]``) says per store
            which path ran and why. Why a new ranker rather than a new default for
            ``"prefilter"``: ``"prefilter"`` means "use a prefilter" (and build one); ``"auto"``
            means "the fastest exact-enough path", and may well be exact.
        prefilter_mode: with ``recall_ranker="prefilter"``: ``"auto"`` (per store, exact MaxSim
            when its estimated work is at most the prefilter's; see
            :class:`~colgraph_engine.prefilter.AutoSearcher`) or ``"prefilter"`` (always). Ours: auto.
        prefilter_min_tokens: with ``recall_ranker="auto"``: stores with fewer live tokens are
            scored exactly, counted in tokens of d = 128 (a store of dimension d compares
            ``tokens x d / 128``: exact MaxSim's work grows with ``tokens x d``, the prefilter's
            hardly with d). Ours: 262,144 = 2^18, from ``benchmarks/results/recall_default.md``
            (2 shared CPU cores, d = 128, clustered corpora): one query at a time the adaptive
            prefilter beat exact MaxSim from about 120k tokens (2.3x there, 3.5-4x at 200k-400k,
            10.5x at 800k); 64 queries in one call, where exact amortises each document token
            over the batch, exact won up to about 200k-250k tokens (0.96x at 198k, 1.18x at
            403k, 2.6x at 800k). 2^18 sits at the batch crossover; it cannot depend on the batch,
            since a query's results must not depend on the batch it comes in. 0: every store
            with a carried prefilter uses it.
        prefilter_budget: how many items each query scores per store through a prefilter:
            ``"adaptive"`` (ours, the default: set per query from the corpus's centroid scores
            and the query's own score distribution; every item it returns is scored exactly;
            :mod:`colgraph_engine.prefilter.adaptive`) or ``"plaid"`` (PLAID's fixed settings for
            k = ``max(prefilter_units, kd)`` items, the budget before ``"adaptive"``).
        prefilter_nbits: residual bits per dimension of the prefilters ``"prefilter"`` builds (1, 2 or 4; ours: 2).
        prefilter_units: with ``prefilter_budget="plaid"``: store items each query keeps per
            store from the prefilter (their documents' best unit scores enter the fusion; ours:
            64, at least `kd`).
        prefilter_exact: the prefilter's exact stage: ``"store"`` scores its shortlist on the
            store's own vectors (the view holds them anyway), ``"codes"`` on the vectors decoded
            from its compressed codes (PLAID's). Ours: store; on an H200 it lifted recall@10
            against exact from 0.891 / 0.918 (2-bit codes) to 0.986 / 1.000 on the two
            synthetic corpora of benchmarks/results/gpu_prefilter.md.
        fusion: ``"rrf"``, reciprocal-rank fusion ``Σ_side 1 / (rrf_k + rank)`` (rrf_k = 60, the
            constant of Cormack et al., 2009), or ``"weighted"``: ``Σ_side w_side · minmax(score)``.
        text_weight: w of the text side for ``"weighted"`` (the image side gets 1 - w). Ours: 0.5.
    Stages 2-4, graph retrieval:
        retrieval: ``"graph+chunks"`` (the default, ours: the graph adds to the chunk ranking and
            re-ranks it, never narrows it; the rule is in :mod:`.graph_adds`), ``"graph"``
            (mKG-RAG as it states it: stages 2-4, sources only where the subgraph is) or
            ``"chunks"`` (the top `chunks_k` segments of the Kd documents by question + caption
            tokens; mKG-RAG's ablation).
        seed_match: how stage 3 finds seed entities: ``"descriptions"`` (mKG-RAG: cosine of the
            question's text vector with "name: description" vectors), ``"names"`` (idf-weighted
            lexical match with entity names plus MaxSim over name tokens, :mod:`.graph_adds`),
            ``"lexical"`` (the lexical part alone) or ``"auto"`` (the default: ``"lexical"`` with
            ``"graph+chunks"``, ``"descriptions"`` with ``"graph"``). Ours: auto picks
            ``"lexical"`` because ``"names"`` token-encodes every entity name of the recalled
            documents on the query path (the index stores no name tokens yet), which with MiniLM
            costs seconds on a document's first query; on the dev set the lexical match alone
            scored as well (``benchmarks/results/pipeline_quality.md``).
        graph_weight: β of ``"graph+chunks"``, the weight of graph support against the unit's
            normalised MaxSim (ours: 1, equal weight; see :mod:`.graph_adds`).
        kg: entities and relations retrieved per query (mKG-RAG: 10 each).
        hops: expansion depth l in [0, 3] (mKG-RAG: 1).
        filter: ``"off"`` (mKG-RAG's released configuration), ``"mkg"`` (its code's rule) or
            ``"default"`` (the engine's rule; see :mod:`.expand`).
        threshold: the filter threshold; None takes :func:`calibrated_threshold` of the text
            encoder for ``"default"`` and 0.5 for ``"mkg"``.
        min_keep: items kept per judged list when fewer pass (mKG-RAG: 3).
        expansion_budget: most nodes one query's expansion may reach (ours: 256).
    Stage 5, visual ranking:
        visual_ranker: ``"maxsim"`` (ColGraphRAG), ``"pooled"`` or ``"off"`` (no images).
        visual_units: ``"patches"`` (C_vis tokens vs image patches; needs one late-interaction
            model for both roles), ``"text_view"`` (vs the images' text views, the offline
            surrogate) or ``"auto"`` (patches when the index's encoders share a space).
        k: images and regions kept, E_k(q) (10; see the module docstring on its source).
        all_document_images: also rank every image of the Kd documents, not only those attached
            to the expanded subgraph.
    Stage 6, evidence:
        evidence_k: text evidence items (segments and tables) kept in B(q) (ours: 10).
        gstar_rounds, gstar_budget: G*(q)'s iterative expansion: at most this many filtered
            hops, and at most this many nodes (ours: 3 and 64).
    Stage 7, context:
        context_mode: ``"graph"`` (entities, relations, images), ``"chunks"`` (sources) or
            ``"hybrid"`` (both; default, as LightRAG's hybrid mode).
        budget_entities, budget_relations, budget_sources, budget_images: token budgets per
            section (ours: 1,500, 1,500, 3,000 and 500 tokens; tokens as :func:`count_tokens`).
        only_context: return the context without calling a generator.
    """
    kd: int = 10
    recall_side: str = "fused"
    recall_ranker: str = "auto"
    prefilter_mode: str = "auto"
    prefilter_min_tokens: int = AUTO_MIN_TOKENS
    prefilter_budget: str = "adaptive"
    prefilter_nbits: int = 2
    prefilter_units: int = 64
    prefilter_exact: str = "store"
    fusion: str = "rrf"
    rrf_k: int = 60
    text_weight: float = 0.5
    retrieval: str = "graph+chunks"
    seed_match: str = "auto"
    graph_weight: float = 1.0
    chunks_k: int = 10
    kg: int = 10
    hops: int = 1
    filter: str = "default"
    threshold: float | None = None
    min_keep: int = 3
    expansion_budget: int = 256
    visual_ranker: str = "maxsim"
    visual_units: str = "auto"
    k: int = 10
    all_document_images: bool = False
    evidence_k: int = 10
    gstar_rounds: int = 3
    gstar_budget: int = 64
    context_mode: str = "hybrid"
    budget_entities: int = 1500
    budget_relations: int = 1500
    budget_sources: int = 3000
    budget_images: int = 500
    only_context: bool = True

    def __post_init__(self):
        _int(self.kd, "kd", 1, 10_000)
        _choice(self.recall_side, "recall_side", RECALL_SIDES)
        _choice(self.recall_ranker, "recall_ranker", RECALL_RANKERS)
        _choice(self.prefilter_mode, "prefilter_mode", PREFILTER_MODES)
        _int(self.prefilter_min_tokens, "prefilter_min_tokens", 0, 1 << 48)
        _choice(self.prefilter_budget, "prefilter_budget", PREFILTER_BUDGETS)
        _choice(self.prefilter_exact, "prefilter_exact", PREFILTER_EXACT)
        _int(self.prefilter_nbits, "prefilter_nbits", 1, 4)
        if self.prefilter_nbits not in PREFILTER_NBITS:
            raise ValueError(f"prefilter_nbits: expected one of {PREFILTER_NBITS}, got {self.prefilter_nbits}")
        _int(self.prefilter_units, "prefilter_units", 1, 100_000)
        _choice(self.fusion, "fusion", FUSIONS)
        _int(self.rrf_k, "rrf_k", 0, 1_000_000)
        _float(self.text_weight, "text_weight", 0.0, 1.0)
        _choice(self.retrieval, "retrieval", RETRIEVALS)
        _choice(self.seed_match, "seed_match", SEED_MATCHES)
        _float(self.graph_weight, "graph_weight", 0.0, 100.0)
        _int(self.chunks_k, "chunks_k", 1, 10_000)
        _int(self.kg, "kg", 1, 10_000)
        _int(self.hops, "hops", 0, 3)
        _choice(self.filter, "filter", FILTERS)
        if self.threshold is not None:
            _float(self.threshold, "threshold", -1.0, 1.0)
        _int(self.min_keep, "min_keep", 0, 10_000)
        _int(self.expansion_budget, "expansion_budget", 1, 10_000_000)
        _choice(self.visual_ranker, "visual_ranker", VISUAL_RANKERS)
        _choice(self.visual_units, "visual_units", VISUAL_UNITS)
        _int(self.k, "k", 1, 10_000)
        _bool(self.all_document_images, "all_document_images")
        _int(self.evidence_k, "evidence_k", 1, 10_000)
        _int(self.gstar_rounds, "gstar_rounds", 0, 16)
        _int(self.gstar_budget, "gstar_budget", 1, 1_000_000)
        _choice(self.context_mode, "context_mode", CONTEXT_MODES)
        for name in ("budget_entities", "budget_relations", "budget_sources", "budget_images"):
            _int(getattr(self, name), name, 0, 10_000_000)
        _bool(self.only_context, "only_context")

    @property
    def seeds_by(self) -> str:
        """The seed match in force (``seed_match`` with ``"auto"`` resolved)."""
        if self.seed_match != "auto":
            return self.seed_match
        return "lexical" if self.retrieval == "graph+chunks" else "descriptions"

    def replace(self, **changes) -> PipelineConfig:
        """A copy with `changes` applied (validated; unknown names raise ValueError)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise ValueError(f"config: unknown setting(s) {unknown}; known: {sorted(known)}")
        return replace(self, **changes)

    def as_dict(self) -> dict:
        return asdict(self)


def _int(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name}: expected an int in [{low}, {high}], got {value}")


def _float(value, name, low, high):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__}")
    if not math.isfinite(value) or not low <= value <= high:
        raise ValueError(f"{name}: expected a number in [{low}, {high}], got {value}")


def _bool(value, name):
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}")


def _choice(value, name, options):
    if not isinstance(value, str):
        raise TypeError(f"{name}: expected one of {options}, got {type(value).__name__}")
    if value not in options:
        raise ValueError(f"{name}: expected one of {options}, got {value!r}")
