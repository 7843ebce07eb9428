"""The retrieval pipeline on a small hand-checked index (the demo corpus plus the KG demo's
documents, offline encoders): each stage against an oracle computed independently, each switch
changing only its stage, batch = single, determinism, filter settings, space refusal, bad input."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from colgraph_engine.demos.corpus import DEMO_QUESTIONS, _photo, demo_documents
from colgraph_engine.encoders import Encoder
from colgraph_engine.graph import KnowledgeGraph, NodeKind
from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex, Section
from colgraph_engine.demos import kg_data as kg_demo
from colgraph_engine.kg.vectors import image_text_view, region_text_view
from colgraph_engine.pipeline import CrossSpaceError, OpenAIGenerator, Pipeline, PipelineConfig, Query, count_tokens
from colgraph_engine.pipeline.graph_retrieval import WALK_KINDS

ENC = Encoders.offline()


@pytest.fixture(scope="module")
def index():
    idx = KnowledgeIndex(ENC)
    idx.add_documents(demo_documents() + kg_demo.demo_documents())
    return idx


def run(index, question, **changes):
    # these tests check mKG-RAG's stages as it states them: retrieval="graph" (graph+chunks, the
    # default, has its own tests in test_graph_adds.py)
    return Pipeline(index, ENC, PipelineConfig(retrieval="graph").replace(**changes)).retrieve(question)


def summary(r):
    d = r.as_dict()
    d.pop("timings")
    return d


# -- stage 1 ------------------------------------------------------------------------------------

def best_unit_scores(index, question):
    """Oracle: each document's best MaxSim over its segments and tables, one unit at a time."""
    q = ENC.tokens([question])[0]
    out = {}
    for doc_id in index.documents:
        g = index.document(doc_id)
        texts = [g.node_text[v] for v in g.nodes_of(NodeKind.SEGMENT)] + [g.node_text[v] for v in g.nodes_of(NodeKind.TABLE)]
        best = -np.inf
        for t in texts:
            x = ENC.tokens([t])[0]
            if x.shape[0]:
                best = max(best, float((q @ x.T).max(1).values.sum()))
        out[doc_id] = best
    return out


@pytest.mark.parametrize("fusion", ["rrf", "weighted"])
def test_recall_ranks_documents_by_their_best_unit(index, fusion):
    question = DEMO_QUESTIONS[1]
    oracle = best_unit_scores(index, question)
    want = sorted(oracle, key=lambda d: (-oracle[d], index.doc_number(d)))
    r = run(index, question, kd=4, recall_side="text", fusion=fusion)
    assert [d for d, _ in r.documents] == want[:4]
    assert r.documents[0][0] == "shuttle-commander"
    assert r.recall_sides == ("text",)


def test_recall_image_side_finds_the_document_of_the_query_image(index):
    cat = _photo("chelsea")[30:270, 60:400]
    r = run(index, "Where does this animal live?", kd=1, recall_side="image", fusion="weighted")
    assert r.recall_sides == ("text",) and any("no image" in n for n in r.notes)  # no image: text side
    r = Pipeline(index, ENC, PipelineConfig(kd=1, recall_side="image")).retrieve(Query("Where does it live?", image=cat))
    assert r.documents[0][0] == "harbour-cafe" and r.recall_sides == ("image",)


def test_pooled_recall_ranker_uses_pooled_cosine(index):
    question = DEMO_QUESTIONS[2]
    q = ENC.tokens([question])[0]
    qp = torch.nn.functional.normalize(torch.nn.functional.normalize(q, dim=1).mean(0), dim=0)
    oracle = {}
    for doc_id in index.documents:
        g = index.document(doc_id)
        best = -np.inf
        for v in list(g.nodes_of(NodeKind.SEGMENT)) + list(g.nodes_of(NodeKind.TABLE)):
            x = ENC.tokens([g.node_text[v]])[0]
            if x.shape[0]:
                xp = torch.nn.functional.normalize(torch.nn.functional.normalize(x, dim=1).mean(0), dim=0)
                best = max(best, float(qp @ xp))
        oracle[doc_id] = best
    want = sorted(oracle, key=lambda d: (-oracle[d], index.doc_number(d)))
    r = run(index, question, kd=3, recall_side="text", recall_ranker="pooled")
    assert [d for d, _ in r.documents] == want[:3]


# -- stages 2-4 ----------------------------------------------------------------------------------

def test_seeds_are_the_top_entities_by_cosine_inside_the_recalled_documents(index):
    question = DEMO_QUESTIONS[1]
    r = run(index, question, kd=2, kg=3)
    docs = {d for d, _ in r.documents}
    qv = torch.nn.functional.normalize(ENC.text([question])[0], dim=0)
    scored = []
    for doc_id in docs:
        g = index.document(doc_id)
        for v in g.nodes_of(NodeKind.ENTITY):
            ev = ENC.text([f"{g.node_name[v]}: {g.node_text[v]}"])[0]
            scored.append((float(qv @ ev / ev.norm()), g.node_name[v]))
    scored.sort(key=lambda t: -t[0])
    want, seen = [], set()
    for s, name in scored:  # one hit per alias group (normalised name)
        if name.lower() not in seen:
            seen.add(name.lower())
            want.append(name)
    assert r.seed_entities == want[:3]
    assert all(index.describe_node(int(v))["doc_id"] in docs for v in r.subgraph_nodes)


def test_relation_hits_seed_both_endpoints(index):
    r = run(index, "Who commanded STS-93?", kd=1, kg=1, hops=0)
    (a, b), = r.seed_relations
    names = {index.describe_node(int(v))["name"] for v in r.subgraph_nodes}
    assert {a, b} <= names


def brute_force_neighbours(index, seeds, docs):
    """Oracle: every node of a walkable kind adjacent to a seed (either direction) inside `docs`,
    alias members of reached entities included."""
    g = index.graph
    src, dst = g.edges()
    kinds, node_doc, alias = g.node_kind, g.node_doc, g.alias_of
    allowed = {index.doc_number(d) for d in docs}
    seeds = set(int(s) for s in seeds)
    group = {}
    for v in np.flatnonzero(alias >= 0).tolist():
        if node_doc[v] in allowed:
            group.setdefault(int(alias[v]), set()).add(v)
    for s in list(seeds):
        if alias[s] >= 0:
            seeds |= group.get(int(alias[s]), set())
    out = set(seeds)
    for u, v in zip(src.tolist(), dst.tolist()):
        for a, b in ((u, v), (v, u)):
            if a in seeds and kinds[b] in WALK_KINDS and node_doc[b] in allowed:
                out.add(b)
                if alias[b] >= 0:
                    out |= group.get(int(alias[b]), set())
    return out


def test_unfiltered_expansion_reaches_every_walkable_neighbour(index):
    r = run(index, DEMO_QUESTIONS[1], kd=2, kg=2, hops=1, filter="off", expansion_budget=10_000)
    seeds = r.subgraph_nodes[r.subgraph_hops == 0]
    want = brute_force_neighbours(index, seeds, [d for d, _ in r.documents])
    assert set(r.subgraph_nodes.tolist()) == want
    assert all(index.graph.node_kind[v] in WALK_KINDS for v in r.subgraph_nodes)


def test_default_filter_keeps_the_entities_above_threshold(index):
    settings = dict(kd=7, kg=2, hops=2, min_keep=1, expansion_budget=10_000)
    pipe = Pipeline(index, ENC, PipelineConfig(retrieval="graph", filter="default", **settings))
    r = pipe.retrieve(DEMO_QUESTIONS[1])
    off = run(index, DEMO_QUESTIONS[1], filter="off", **settings)
    t = pipe.threshold()
    assert t == 0.30  # the calibrated value for the offline hashing encoder

    def hop1_entities(res):
        kinds = index.graph.node_kind[res.subgraph_nodes]
        return set(res.subgraph_nodes[(res.subgraph_hops == 1) & (kinds == NodeKind.ENTITY)].tolist())

    qv = torch.nn.functional.normalize(ENC.text([DEMO_QUESTIONS[1]])[0], dim=0)

    def cosine(v):
        d = index.describe_node(v)
        ev = ENC.text([f"{d['name']}: {d['text']}"])[0]
        return float(qv @ ev / ev.norm())

    reached = hop1_entities(off)
    passing = {v for v in reached if cosine(v) > t}
    assert 0 < len(passing) < len(reached)          # the filter has something to drop here
    assert hop1_entities(r) == passing               # at least min_keep = 1 passes, so no top-up
    assert set(r.subgraph_nodes.tolist()) < set(off.subgraph_nodes.tolist())


def test_filter_settings_differ_and_mkg_walks_entities_only(index):
    q = DEMO_QUESTIONS[1]
    res = {f: run(index, q, kd=7, kg=2, hops=2, filter=f, expansion_budget=10_000) for f in ("off", "mkg", "default")}
    sets = {f: set(r.subgraph_nodes.tolist()) for f, r in res.items()}
    assert sets["default"] < sets["off"]
    assert all(index.graph.node_kind[v] == NodeKind.ENTITY for v in sets["mkg"])
    assert len({frozenset(s) for s in sets.values()}) == 3
    mkg = res["mkg"]
    # mKG-RAG's rule judges the seed lists too: of Kg = 2 seed entities, those above 0.5 or the best min_keep (3)
    assert 1 <= int((mkg.subgraph_hops == 0).sum()) <= 2


def test_expansion_never_builds_a_dense_score_matrix(index, monkeypatch):
    seen = []
    real = KnowledgeGraph.expand

    def spy(self, seeds, hops=1, **kw):
        seen.append(kw.get("scores"))
        return real(self, seeds, hops, **kw)

    monkeypatch.setattr(KnowledgeGraph, "expand", spy)
    run(index, DEMO_QUESTIONS[1], hops=2)
    assert seen and not any(isinstance(s, np.ndarray) or torch.is_tensor(s) for s in seen)
    assert any(s is not None for s in seen)


# -- stage 5 ------------------------------------------------------------------------------------

def test_visual_candidates_include_depicting_regions_and_contained_images(index):
    r = run(index, DEMO_QUESTIONS[0], kd=2, k=50)
    names = {(h.image, h.name) for h in r.images}
    assert ("collins-portrait", "collins-portrait") in names
    assert ("collins-portrait", "object-3") in names  # the mission patch region depicts STS-93


def test_visual_scores_are_maxsim_of_cvis_tokens_against_text_views(index):
    r = run(index, DEMO_QUESTIONS[0], kd=3, k=50)
    q = ENC.tokens([r.visual_phrases.text()])[0]
    assert r.image_units == "text_view"
    for h in r.images:
        g = index.document(h.doc_id)
        view = image_text_view(g, index.describe_node(h.node)["local"]) if h.kind == "image" else \
            region_text_view(g, index.describe_node(h.node)["local"])
        x = ENC.tokens([view])[0]
        assert h.score == pytest.approx(float((q @ x.T).max(1).values.sum()), abs=1e-4)
    assert [h.score for h in r.images] == sorted((h.score for h in r.images), reverse=True)


def test_maxsim_picks_the_portrait_where_pooled_picks_the_rocket(index):
    same = dict(kd=7, k=50, all_document_images=True)  # identical candidates for both rankers
    m = [h.image for h in run(index, DEMO_QUESTIONS[0], **same).images if h.kind == "image"]
    p = [h.image for h in run(index, DEMO_QUESTIONS[0], visual_ranker="pooled", **same).images if h.kind == "image"]
    assert m[0] == "collins-portrait" and p[0] == "falcon-pad"


def test_question_without_visual_cue_ranks_by_the_question(index):
    r = run(index, "how does photosynthesis work")
    assert r.visual_used_question and any("no visual cue" in n for n in r.notes)


def test_cross_space_pairs_are_refused():
    with pytest.raises(CrossSpaceError, match="different embedding spaces"):
        Pipeline(KnowledgeIndex(ENC), ENC, PipelineConfig(visual_units="patches"))
    # one late-interaction model for both roles: patches are allowed and chosen by "auto"
    d = 8
    tok = Encoder(lambda texts: [torch.ones(2, d) for _ in texts], "tiny-li:queries", d, "tokens")
    pat = Encoder(lambda ims: [torch.ones(4, d) for _ in ims], "tiny-li:images", d, "patches")
    enc = Encoders(ENC.text, tok, pat)
    assert Pipeline(KnowledgeIndex(enc), enc).image_units == "patches"
    assert Pipeline(KnowledgeIndex(ENC), ENC).image_units == "text_view"


# -- stage 6-7 ----------------------------------------------------------------------------------

def test_records_carry_provenance(index):
    r = run(index, DEMO_QUESTIONS[0], kd=2)
    rels = [x for x in r.evidence.records if x.source == "relation"]
    imgs = [x for x in r.evidence.records if x.source == "image"]
    assert rels and imgs
    commanded = [x for x in rels if {x.subject, x.object} == {"Eileen Collins", "STS-93"}]
    assert commanded and commanded[0].segments == (0,) and commanded[0].doc_id == "shuttle-commander"
    patch = [x for x in imgs if x.subject == "mission patch"]
    assert patch and patch[0].object == "STS-93" and patch[0].image == "collins-portrait"
    assert patch[0].bbox == pytest.approx((0.26, 0.67, 0.41, 0.83), abs=1e-6)
    assert set(r.evidence.ge_nodes.tolist()) <= set(r.evidence.gstar_nodes.tolist())


def test_context_modes_and_budgets(index):
    full = run(index, DEMO_QUESTIONS[1], context_mode="hybrid")
    assert full.context.entities and full.context.relations and full.context.sources
    graph = run(index, DEMO_QUESTIONS[1], context_mode="graph")
    assert graph.context.entities and not graph.context.sources
    chunks = run(index, DEMO_QUESTIONS[1], context_mode="chunks")
    assert chunks.context.sources and not chunks.context.entities
    tight = run(index, DEMO_QUESTIONS[1], budget_entities=120)
    assert 0 < len(tight.context.entities) < len(full.context.entities)
    assert tight.context.tokens["entities"] <= 120
    text = full.context.render()
    assert text.startswith("Question: ") and "---- Entities ----" in text and "text views" in text
    assert count_tokens("Eileen Collins, NASA.") == 5


def test_generator_answers_and_failures_keep_the_context(index):
    got = {}

    def gen(prompt, images):
        got["prompt"], got["images"] = prompt, images
        return "Eileen Collins"

    pipe = Pipeline(index, ENC, PipelineConfig(only_context=False), generator=gen)
    r = pipe.retrieve(DEMO_QUESTIONS[1])
    assert r.answer.text == "Eileen Collins" and r.answer.error is None
    assert got["prompt"] == r.context.render() and all(hasattr(im, "size") for im in got["images"])

    def broken(prompt, images):
        raise TimeoutError("endpoint did not answer")

    r = Pipeline(index, ENC, PipelineConfig(only_context=False), generator=broken).retrieve(DEMO_QUESTIONS[1])
    assert r.answer.text is None and "TimeoutError" in r.answer.error and r.context.entities


def test_chunks_retrieval_skips_the_graph_stages(index):
    r = run(index, DEMO_QUESTIONS[2], retrieval="chunks", chunks_k=2)
    assert r.seed_entities == [] and not r.evidence.entities
    kinds = index.graph.node_kind[r.subgraph_nodes]
    assert (kinds == NodeKind.SEGMENT).all() and 1 <= r.subgraph_nodes.size <= 2


# -- switches, batching, determinism ---------------------------------------------------------------

def stage_outputs(r):
    return {"recall": r.documents, "seeds": (r.seed_entities, r.seed_relations),
            "expand": (r.subgraph_nodes.tolist(), r.subgraph_hops.tolist()),
            "visual": [(h.node, round(h.score, 5)) for h in r.images]}


@pytest.mark.parametrize("change,first_changed", [
    ({"visual_ranker": "pooled"}, "visual"),
    ({"hops": 2}, "expand"),
    ({"filter": "off"}, "expand"),
    ({"kg": 2}, "seeds"),
    ({"kd": 1}, "recall"),
])
def test_each_switch_changes_its_stage_and_nothing_before_it(index, change, first_changed):
    base, changed = stage_outputs(run(index, DEMO_QUESTIONS[0])), stage_outputs(run(index, DEMO_QUESTIONS[0], **change))
    order = ["recall", "seeds", "expand", "visual"]
    i = order.index(first_changed)
    for s in order[:i]:
        assert base[s] == changed[s], s
    assert base[first_changed] != changed[first_changed]


@pytest.mark.parametrize("changes", [{}, {"filter": "mkg"}, {"filter": "off"}, {"fusion": "weighted"},
                                     {"filter": "mkg", "fusion": "weighted", "kd": 2}, {"retrieval": "graph"},
                                     {"retrieval": "graph", "filter": "mkg"}, {"retrieval": "graph", "filter": "off"},
                                     {"retrieval": "graph", "seed_match": "names"}])
def test_batch_equals_single_and_runs_are_deterministic(index, changes):
    cat = _photo("chelsea")[30:270, 60:400]
    queries = [Query(q) for q in DEMO_QUESTIONS] + [Query("Where does this animal live?", image=cat, caption="cat")]
    pipe = Pipeline(index, ENC, PipelineConfig(hops=2).replace(**changes))
    batch = pipe.retrieve_batch(queries)
    single = [pipe.retrieve(q) for q in queries]
    again = pipe.retrieve_batch(queries)
    for b, s, a in zip(batch, single, again):
        assert summary(b) == summary(s) == summary(a)
    assert set(batch[0].timings) >= {"encode", "recall", "merge", "seeds", "expand", "visual", "evidence", "context"}


# -- bad input -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make,exc,match", [
    (lambda: Query(""), ValueError, "question"),
    (lambda: Query("   "), ValueError, "question"),
    (lambda: Query("x" * 5000), ValueError, "question"),
    (lambda: Query(42), TypeError, "question"),
    (lambda: Query("q", image=3.5), TypeError, "image"),
    (lambda: PipelineConfig(kd=0), ValueError, "kd"),
    (lambda: PipelineConfig(hops=4), ValueError, "hops"),
    (lambda: PipelineConfig(kg=-1), ValueError, "kg"),
    (lambda: PipelineConfig(k=1.5), TypeError, "k"),
    (lambda: PipelineConfig(filter="strict"), ValueError, "filter"),
    (lambda: PipelineConfig().replace(colour="red"), ValueError, "unknown"),
    (lambda: OpenAIGenerator(""), ValueError, "model"),
    (lambda: OpenAIGenerator("m", timeout=0), ValueError, "timeout"),
    (lambda: OpenAIGenerator("m", max_retries=-1), ValueError, "max_retries"),
    (lambda: OpenAIGenerator("m", send_images="yes"), TypeError, "send_images"),
    (lambda: OpenAIGenerator("m", base_url=5), TypeError, "base_url"),
    (lambda: count_tokens(None), TypeError, "text"),
    (lambda: KnowledgeIndex(ENC).describe_edge(0), ValueError, "edge"),
    (lambda: Pipeline(KnowledgeIndex(ENC), ENC, device="no-such-device"), ValueError, "device"),
    (lambda: Pipeline(KnowledgeIndex(ENC), ENC, generator=42), TypeError, "generator"),
    (lambda: Pipeline(KnowledgeIndex(ENC), ENC, record_extractor="x"), TypeError, "record_extractor"),
])
def test_bad_arguments_are_named(make, exc, match):
    with pytest.raises(exc, match=match):
        make()


def test_bad_query_image_and_queries(index, tmp_path):
    pipe = Pipeline(index, ENC)
    (tmp_path / "broken.png").write_bytes(b"not an image")
    with pytest.raises(ValueError, match=r"queries\[0\].image"):
        pipe.retrieve(Query("what is this?", image=tmp_path / "broken.png"))
    with pytest.raises(ValueError, match="image"):
        pipe.retrieve(Query("what is this?", image=tmp_path / "missing.png"))
    with pytest.raises(ValueError, match="queries"):
        pipe.retrieve_batch([])
    with pytest.raises(TypeError, match="queries"):
        pipe.retrieve_batch("one question")


def test_encoders_that_differ_from_the_index_are_refused(index):
    other = Encoders.offline(text_dim=64)
    with pytest.raises(ValueError, match="built with"):
        Pipeline(index, other)
    with pytest.raises(TypeError, match="index"):
        Pipeline("index", ENC)


def test_an_index_without_images_gives_an_empty_visual_stage():
    idx = KnowledgeIndex(ENC)
    idx.add_documents([DocumentInput("t", [Section("Tokyo Station opened in 1914 in Marunouchi.")])])
    r = Pipeline(idx, ENC).retrieve("When did Tokyo Station open?")
    assert r.images == [] and r.documents[0][0] == "t"
    assert r.counts["visual"]["candidates"] == 0


def test_record_extractor_adds_llm_records_and_survives_failures(index):
    seen = {}

    def extractor(question, evidence_text):
        seen["q"], seen["text"] = question, evidence_text
        return ("relation<|#|>Eileen Collins<|#|>STS-93<|#|>commander of<|#|>She commanded it in 1999.\n"
                "<|COMPLETE|>")

    # mKG-RAG's query-conditioned extraction over its graph evidence (retrieval="graph")
    r = Pipeline(index, ENC, PipelineConfig(retrieval="graph"), record_extractor=extractor).retrieve(DEMO_QUESTIONS[1])
    llm = [x for x in r.evidence.records if x.source == "llm"]
    assert seen["q"] == DEMO_QUESTIONS[1] and "STS-93" in seen["text"]
    assert len(llm) == 1 and (llm[0].subject, llm[0].predicate, llm[0].object) == ("Eileen Collins", "commander of",
                                                                                  "STS-93")
    assert llm[0].doc_id == "shuttle-commander" and len(llm[0].nodes) == 2

    def broken(question, evidence_text):
        raise ConnectionError("no endpoint")

    r = Pipeline(index, ENC, record_extractor=broken).retrieve(DEMO_QUESTIONS[1])
    assert not [x for x in r.evidence.records if x.source == "llm"] and r.evidence.records
    assert any("ConnectionError" in n for n in r.notes)


def test_recall_in_unit_slices_equals_one_pass(index, monkeypatch):
    from colgraph_engine.pipeline import recall
    whole = run(index, DEMO_QUESTIONS[1], kd=7, recall_ranker="maxsim")
    pooled = run(index, DEMO_QUESTIONS[1], kd=7, recall_ranker="pooled")
    monkeypatch.setattr(recall, "UNIT_CHUNK", 2)
    assert run(index, DEMO_QUESTIONS[1], kd=7).documents == whole.documents
    assert run(index, DEMO_QUESTIONS[1], kd=7, recall_ranker="pooled").documents == pooled.documents


def test_an_empty_index_gives_empty_stages_and_says_so():
    r = Pipeline(KnowledgeIndex(ENC), ENC).retrieve_batch(["anything at all?", Query("a cat?", image=_photo("chelsea"))])
    for x in r:
        assert x.documents == [] and x.images == [] and x.evidence.records == []
        assert any("no segment vectors" in n for n in x.notes)


def test_query_image_and_caption_drive_the_visual_ranking(index):
    cat = _photo("chelsea")[30:270, 60:400]
    with_caption = Pipeline(index, ENC, PipelineConfig(kd=7, k=5)).retrieve(
        Query("Where does this animal live?", image=cat, caption="a tabby cat on a sill"))
    assert with_caption.visual_text == "a tabby cat on a sill" and not with_caption.visual_used_question
    assert with_caption.images[0].image == "chelsea"
    alone = Pipeline(index, ENC, PipelineConfig(kd=7, k=5)).retrieve(Query("Where does this animal live?", image=cat))
    assert alone.visual_used_question and alone.images[0].image == "chelsea"  # the query image ranks alone
