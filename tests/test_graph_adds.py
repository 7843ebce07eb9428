"""retrieval="graph+chunks" (the default) on a small real index with hand-written records and the
offline hashing encoders: the seeds by entity names, the combined ranking against an oracle
computed here from the documented formula, the hop path, and the "never narrows" property."""
from __future__ import annotations

import math

import numpy as np
import pytest

from colgraph_engine.graph import NodeKind
from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex
from colgraph_engine.kg.segment import Segment
from colgraph_engine.pipeline import Pipeline, PipelineConfig
from colgraph_engine.pipeline.graph_adds import GAMMA, STOP_WORDS, terms

ENC = Encoders.offline()


def records(entities, relations=()):
    lines = [f"entity<|#|>{n}<|#|>{t}<|#|>{d}" for n, t, d in entities]
    lines += [f"relation<|#|>{a}<|#|>{b}<|#|>{k}<|#|>{d}" for a, b, k, d in relations]
    return "\n".join(lines) + "\n<|COMPLETE|>"


ACME = [
    ("Acme Robotics was founded in Tallinn in 2009 and builds warehouse robots.",
     records([("Acme Robotics", "organization", "A maker of warehouse robots."),
              ("Tallinn", "location", "The capital of Estonia.")],
             [("Acme Robotics", "Tallinn", "founded in", "Acme Robotics was founded in Tallinn.")])),
    ("Quarterly figures: revenue grew twelve percent while costs stayed flat.", records([])),
    ("Vornik Systems supplies the electric motors for every robot the company ships.",
     records([("Vornik Systems", "organization", "A supplier of electric motors."),
              ("Acme Robotics", "organization", "A customer of motor suppliers.")],
             [("Vornik Systems", "Acme Robotics", "supplies", "Vornik Systems supplies motors to Acme Robotics.")])),
]
VORNIK = [
    ("Vornik Systems reported 340 employees at the end of 2021.",
     records([("Vornik Systems", "organization", "A motor maker with 340 employees.")])),
    ("A weather report for the coast: rain in the morning, sun later.", records([])),
]
OTHER = [
    ("Using the new wing, the museum opens at nine every morning.",
     records([("Using", "concept", "An opener the extractor took for a name."),
              ("The Museum", "location", "The city museum.")])),
    ("Gardens and fountains surround the building.", records([("Gardens", "location", "The gardens.")])),
]


def doc(doc_id, pages):
    """One segment per page (given, so no merging of short pages), with its records."""
    segs = [Segment(t, (), (i, i), len(t.split())) for i, (t, _) in enumerate(pages)]
    return DocumentInput(doc_id, segments=segs, extractions=[r for _, r in pages])


@pytest.fixture(scope="module")
def index():
    idx = KnowledgeIndex(ENC)
    idx.add_documents([doc("acme", ACME), doc("vornik", VORNIK), doc("other", OTHER)])
    return idx


def run(index, question, **changes):
    return Pipeline(index, ENC, PipelineConfig(kd=3).replace(**changes)).retrieve(question)


def segments(index):
    """``{node: text}`` of every segment of the index."""
    g = index.graph
    return {int(v): index.describe_node(int(v))["text"] for v in np.flatnonzero(g.node_kind == NodeKind.SEGMENT)}


def maxsim(question, text):
    q, x = ENC.tokens([question])[0], ENC.tokens([text])[0]
    return float((q @ x.T).max(1).values.sum())


def oracle_lexical(index, question, kg):
    """σ of the documented lexical rule over every entity of the index (kd = 3 recalls all three
    documents; the index has segments and no tables): ``{name terms: (σ, entity nodes)}`` of the
    top-kg name groups."""
    g = index.graph
    ents = {}
    for v in np.flatnonzero(g.node_kind == NodeKind.ENTITY).tolist():
        t = terms(index.describe_node(v)["name"])
        if t:
            ents.setdefault(t, []).append(v)
    # rarity over the text units (here the seven segments) of the recalled documents
    units = [set(terms(t)) for t in segments(index).values()]
    vocab = {w for t in ents for w in t}
    idf2 = {w: math.log(1 + len(units) / max(1, sum(w in u for u in units))) ** 2 for w in vocab}
    qt = set(terms(question))
    qn = math.sqrt(sum(idf2[w] for w in qt if w in idf2))
    sig = {}
    for t, nodes in ents.items():
        hit = sum(idf2[w] for w in t if w in qt)
        if hit:
            sig[t] = (hit / (math.sqrt(sum(idf2[w] for w in t)) * qn), nodes)
    return dict(sorted(sig.items(), key=lambda kv: -kv[1][0])[:kg])


def test_terms_drop_stop_words_openers_and_plurals():
    assert terms("Using the data, we derived THE totals of 2021 Robotics") == ("data", "total", "2021", "robotic")
    assert {"using", "the", "we", "highlights", "derived"} <= STOP_WORDS
    assert terms("The") == () and terms("Using") == ()


def test_no_seed_from_a_stop_word_or_an_opener(index):
    r = run(index, "Using the museum guide, when does The Museum open?")
    assert "Using" not in r.seed_entities
    assert r.seed_entities[0] == "The Museum"
    # a question of stop words only has no seed at all, and the sources are the chunk ranking
    r = run(index, "What is it that they were using?")
    assert r.seed_entities == []
    chunks = run(index, "What is it that they were using?", retrieval="chunks")
    assert [s["node"] for s in r.evidence.sources] == [s["node"] for s in chunks.evidence.sources]


@pytest.mark.parametrize("question", ["How many employees did Vornik Systems report?",
                                      "Where was Acme Robotics founded, and who supplies its motors?"])
def test_sources_follow_the_documented_rule(index, question):
    cfg = dict(hops=0, seed_match="lexical", evidence_k=6, chunks_k=3, graph_weight=0.75)
    r = run(index, question, **cfg)
    sig = oracle_lexical(index, question, 10)
    assert r.seed_entities and {tuple(terms(n)) for n in r.seed_entities} == set(sig)
    segs = segments(index)
    mass = sum(s for s, _ in sig.values())
    support = {}
    for s, nodes in sig.values():  # d_G(u) = 0 for every page a member of G is found on
        pages = set()
        for v in nodes:
            d = index.describe_node(v)
            first = min(u for u, _ in segs.items() if index.describe_node(u)["doc_id"] == d["doc_id"])
            pages |= {first + o for o in d["segments"]}
        for u in pages:
            support[u] = support.get(u, 0.0) + s
    m = {u: maxsim(question, t) for u, t in segs.items()}
    ranked = sorted(m.values(), reverse=True)
    top, kth = ranked[0], ranked[cfg["chunks_k"] - 1]
    want = {u: (m[u] - kth) / (top - kth) + cfg["graph_weight"] * support.get(u, 0.0) / mass for u in segs}
    order = sorted(want, key=lambda u: (-want[u], u))[:cfg["evidence_k"]]
    got = [s["node"] for s in r.evidence.sources]
    assert got == order
    assert [s["score"] for s in r.evidence.sources] == pytest.approx([want[u] for u in order], abs=1e-4)


def test_graph_adds_never_narrows(index):
    """With β = 0 the sources are the chunk ranking; with β > 0 every unit without support keeps
    its MaxSim order, and only supported units move up."""
    q = "How many employees did Vornik Systems report?"
    chunks = run(index, q, retrieval="chunks", chunks_k=5, evidence_k=5)
    flat = run(index, q, graph_weight=0.0, chunks_k=5, evidence_k=5)
    assert [s["node"] for s in flat.evidence.sources] == [s["node"] for s in chunks.evidence.sources]
    full = run(index, q, hops=0, chunks_k=5, evidence_k=7)  # hops=0: support only where Vornik is named
    m = {u: maxsim(q, t) for u, t in segments(index).items()}
    src = full.evidence.sources
    unsupported = [s["node"] for s in src if "Vornik" not in s["text"]]
    assert unsupported == sorted(unsupported, key=lambda u: (-m[u], u))
    # both pages naming Vornik Systems (two documents, one alias group) lead the sources
    assert {s["doc_id"] for s in src[:2]} == {"acme", "vornik"}
    assert all("Vornik Systems" in s["text"] for s in src[:2])


def test_one_hop_reaches_the_page_of_a_related_entity(index):
    """Acme Robotics --supplies-- Vornik Systems, --founded in-- Tallinn: at hops=1 the Vornik page
    (no mention of Acme) mentions one of the seed's two neighbour groups, so a = γ · 1/2 of the
    only seed group; at hops=0 it gets nothing."""
    q = "In which year was Acme Robotics founded?"
    h0 = run(index, q, hops=0, filter="off", evidence_k=10)
    h1 = run(index, q, hops=1, filter="off", evidence_k=10)
    assert h0.seed_entities == h1.seed_entities == ["Acme Robotics"]
    page = next(u for u, t in segments(index).items() if t.startswith("Vornik Systems reported"))
    s0 = {s["node"]: s["score"] for s in h0.evidence.sources}[page]
    s1 = {s["node"]: s["score"] for s in h1.evidence.sources}[page]
    assert s1 - s0 == pytest.approx(PipelineConfig().graph_weight * GAMMA * 1 / 2, abs=1e-6)  # β · a
    # hop-1 entities join the subgraph at hop 1; the seeds at hop 0
    kinds = index.graph.node_kind[h1.subgraph_nodes]
    at_hop1 = h1.subgraph_nodes[(h1.subgraph_hops == 1) & (kinds == NodeKind.ENTITY)]
    hop1 = {index.describe_node(int(v))["name"] for v in at_hop1}
    assert {"Vornik Systems", "Tallinn"} <= hop1


def test_papers_behaviour_stays_reachable(index):
    q = "How many employees did Vornik Systems report?"
    mkg = run(index, q, retrieval="graph")
    named = run(index, q, retrieval="graph", seed_match="names")
    assert mkg.config.seeds_by == "descriptions" and named.config.seeds_by == "names"
    assert PipelineConfig().retrieval == "graph+chunks" and PipelineConfig().seeds_by == "lexical"
    assert named.seed_entities[0] == "Vornik Systems"


def test_batch_equals_single(index):
    qs = ["How many employees did Vornik Systems report?", "In which year was Acme Robotics founded?",
          "Using the museum guide, when does The Museum open?"]
    for changes in ({}, {"hops": 2, "filter": "off"}, {"seed_match": "lexical"}, {"seed_match": "descriptions"}):
        pipe = Pipeline(index, ENC, PipelineConfig(kd=2).replace(**changes))
        batch = pipe.retrieve_batch(qs)
        for b, q in zip(batch, qs):
            s = pipe.retrieve(q)
            db, ds = b.as_dict(), s.as_dict()
            db.pop("timings"), ds.pop("timings")
            assert db == ds


@pytest.mark.parametrize("changes,exc,match", [
    ({"seed_match": "fuzzy"}, ValueError, "seed_match"),
    ({"seed_match": 3}, TypeError, "seed_match"),
    ({"graph_weight": -0.1}, ValueError, "graph_weight"),
    ({"graph_weight": "high"}, TypeError, "graph_weight"),
    ({"retrieval": "graph-chunks"}, ValueError, "retrieval"),
])
def test_bad_settings(changes, exc, match):
    with pytest.raises(exc, match=match):
        PipelineConfig(**changes)


def test_rarity_counts_the_pages_not_the_names():
    """"report" is on every page but the name of one entity; "turbine" is on one page only. Counted
    over names both would be as rare (one name each), and the one-word name "Report" would match the
    question best (cosine of idf-weighted term sets); counted over the text units, the common word
    weighs ln(1 + 5/5) against ln(1 + 5/1), and the seed is the turbine."""
    pages = [("The annual report covers the Zephyr turbine and its output.",
              records([("Zephyr turbine", "product", "A wind turbine.")])),
             ("This report was reviewed by the board.", records([("Report", "concept", "The report.")])),
             ("Sales in the report grew.", records([])),
             ("The report lists the staff.", records([])),
             ("A closing note of the report.", records([]))]
    idx = KnowledgeIndex(ENC)
    idx.add_documents([doc("zephyr", pages)])
    r = Pipeline(idx, ENC, PipelineConfig(kd=1, seed_match="lexical")).retrieve(
        "What does the report say about the turbine?")
    assert r.seed_entities[0] == "Zephyr turbine"
    assert r.seed_entities.index("Report") > 0


def test_name_tables_keep_a_bounded_number_of_documents(index):
    """The per-view name table drops the least recently recalled document beyond its cap and
    rebuilds it, unchanged, when a query recalls it again."""
    from colgraph_engine.pipeline.graph_adds import NameTable
    from colgraph_engine.pipeline.view import IndexView

    table = NameTable(IndexView(index), max_docs=2)
    numbers = [int(n) for n in table.view.numbers]
    first = table.doc(numbers[0])
    table.doc(numbers[1])
    table.doc(numbers[0])  # now the most recent
    table.doc(numbers[2])  # evicts numbers[1]
    assert list(table.docs) == [numbers[0], numbers[2]]
    assert table.doc(numbers[0]) is first  # kept, and the most recent again
    again = table.doc(numbers[1])  # evicts numbers[2]
    assert list(table.docs) == [numbers[0], numbers[1]]
    assert again.terms == NameTable(IndexView(index)).doc(numbers[1]).terms


def test_name_tables_bound_their_entries_too(index):
    """A cap on cached entries (names and distinct unit terms) evicts like the document cap, and
    keeps at least the most recent document whatever its size."""
    from colgraph_engine.pipeline.graph_adds import NameTable
    from colgraph_engine.pipeline.view import IndexView

    view = IndexView(index)
    numbers = [int(n) for n in view.numbers]
    sizes = []
    for n in numbers:
        probe = NameTable(view)
        probe.unit_frequencies(n)
        sizes.append(probe.entries)
    table = NameTable(view, max_entries=sizes[0] + sizes[1])
    for n in numbers[:2]:
        table.unit_frequencies(n)
    assert list(table.docs) == numbers[:2] and table.entries == sizes[0] + sizes[1]
    table.unit_frequencies(numbers[2])  # over the cap: the oldest goes
    assert numbers[0] not in table.docs and table.entries == sum(table.docs[n].weight for n in table.docs)
    assert table.entries <= sizes[0] + sizes[1] or list(table.docs) == [numbers[2]]
    tiny = NameTable(view, max_entries=1)
    tiny.unit_frequencies(numbers[0])
    assert list(tiny.docs) == [numbers[0]]  # the most recent stays


def test_unit_counts_for_asked_terms_equal_the_full_count(index):
    """Counting only the asked terms (units filtered by substring first) gives the counts of
    splitting every unit: for words present, absent, present only inside longer words, and
    plural-stripped forms; asking again adds nothing."""
    from colgraph_engine.pipeline.graph_adds import NameTable, terms
    from colgraph_engine.pipeline.view import IndexView

    view = IndexView(index)
    checked = 0
    for n in [int(x) for x in view.numbers]:
        full, n_units = NameTable(view).unit_frequencies(n)
        words = sorted(full)
        inner = {w[:-1] for w in words if len(w) > 4} - set(full)  # substrings of words, not terms
        vocab = set(words[::3]) | set(list(inner)[:5]) | {"zzzqx", "1999"}
        table = NameTable(view)
        got, got_n = table.unit_frequencies(n, vocab)
        assert got_n == n_units
        for w in vocab:
            assert got[w] == full.get(w, 0), w
        checked += sum(1 for w in vocab if full.get(w, 0) > 0)
        before = table.entries
        table.unit_frequencies(n, vocab)
        assert table.entries == before
        # the full count after a partial one is the full count
        assert table.unit_frequencies(n)[0] == full
    assert checked
    assert terms("Glasses and cats") == ("glasse", "cat")  # the stripped forms the substring test must find


def test_alias_members_inside_documents_equal_the_filtered_group():
    """A name in every document is one alias group across the corpus; a query reads only its
    members inside D(q), by node ranges, and gets exactly the group filtered by document."""
    from colgraph_engine.pipeline.view import IndexView

    pages = [(f"Vornik Systems opened office {i} in Tallinn.",
              records([("Vornik Systems", "organization", f"Office {i}."), ("Tallinn", "location", "A city.")]))
             for i in range(3)]
    idx = KnowledgeIndex(ENC)
    idx.add_documents([doc(f"d{n}", pages[: 1 + n % 3]) for n in range(12)])
    view = IndexView(idx)
    offsets, members = view.alias_members
    assert (np.diff(offsets) >= 12).any()  # a group spans every document
    rng = np.random.default_rng(0)
    subsets = [view.numbers[:0], view.numbers, view.numbers[::-1][:3], np.append(view.numbers[5:8], 10_000)]
    subsets += [rng.choice(view.numbers, 4, replace=False) for _ in range(5)]
    for docs in subsets:
        starts, ends = view.document_node_ranges(docs)
        known = np.intersect1d(docs, view.numbers)
        assert starts.size == known.size  # unknown numbers are left out
        for a, b, d in zip(starts.tolist(), ends.tolist(), known.tolist()):
            assert (view.node_doc[a:b] == d).all() and (a == 0 or view.node_doc[a - 1] != d)
            assert b == view.node_doc.size or view.node_doc[b] != d
        for g in range(offsets.size - 1):
            group = members[offsets[g]:offsets[g + 1]]
            want = group[np.isin(view.node_doc[group], docs)]
            got = view.alias_members_in(g, (starts, ends))
            assert np.array_equal(got, want) and np.all(np.diff(got) > 0)
