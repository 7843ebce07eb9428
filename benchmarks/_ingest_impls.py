"""Inputs and the peer for the ingest benchmark.

Corpus: ``n_docs`` documents of ``segments_per_doc`` segments (given as segments: the
segmentation step is not part of ingest), each segment ``words`` words of
sentences that name the document's own entities (proper-noun names made of syllables; 30 per
document) and some shared across documents (10 per corpus), so that merges within a document
and aliases across documents both happen. Each document has one image with a 4-object scene
graph and region matches. Extraction records are produced beforehand (as an LLM run would) by
the offline co-occurrence extractor, in LightRAG's current format: ingest starts from the
model's text. Vectors are precomputed with the offline encoders: encoders are excluded.

Peer: the LightRAG way of merging extraction records into a NetworkX graph (upsert per record:
node data with descriptions joined by a separator and source ids, edge weights summed,
keywords unioned), from the same parsed records, optionally followed by a GraphML write (what
LightRAG persists after an insert).
"""
from __future__ import annotations

import random

import networkx as nx

from colgraph_engine.kg import CooccurrenceExtractor, DocumentInput, ImageInput, Segment, parse_extraction

SYLLABLES = ["ka", "to", "mi", "ra", "shi", "no", "be", "lu", "den", "vor", "an", "el", "sa", "qu", "ri", "zo"]
VERBS = ["visited", "built", "crossed", "described", "funded", "reached", "mapped", "joined", "opened", "studied"]
FILLER = ("the old line of a quiet road near river with many small stations and long bridges over green fields "
          "during early years after war for trade and travel").split()


def _name(rng: random.Random) -> str:
    words = [("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))).capitalize()
             for _ in range(rng.randint(1, 2))]
    return " ".join(words)


def corpus(n_docs: int, segments_per_doc: int, words: int = 100, seed: int = 0) -> list[DocumentInput]:
    rng = random.Random(seed)
    shared = [_name(rng) for _ in range(10)]
    extractor = CooccurrenceExtractor()
    docs = []
    for d in range(n_docs):
        own = [_name(rng) for _ in range(30)]
        sections, extractions = [], []
        for s in range(segments_per_doc):
            sentences, count = [], 0
            while count < words:
                a, b = rng.choice(own), rng.choice(own + shared)
                filler = " ".join(rng.sample(FILLER, 6))
                sentence = f"{a} {rng.choice(VERBS)} {b} on {filler}."
                sentences.append(sentence)
                count += len(sentence.split())
            text = " ".join(sentences)
            sections.append(Segment(text, ("fig",) if s == 0 else (), (s, s), len(text.split())))
            extractions.append(extractor(text))
        scene = "\n".join([f"<object-{i}>: thing{i}, (0.{i}, 0.1, 0.{i + 4}, 0.8)" for i in range(1, 5)]
                          + ["<relation-1>: <object-1> beside <object-2>", "<relation-2>: <object-3> above <object-4>"])
        # match the image's objects to entities of the first segment
        first = parse_extraction(extractions[0])
        names = [e.name for e in first.entities][:4]
        rel = first.relations[0] if first.relations else None
        lines = [f'("mapping"|<image>|{names[0]}|8)'] + [f'("mapping"|<object-{i + 1}>|{n}|9)' for i, n in enumerate(names)]
        if rel is not None:
            lines.append(f'("mapping"|<relation-1>|{rel.source}|{rel.target}|7)')
        docs.append(DocumentInput(f"doc-{d:05d}", segments=sections, title=f"Document {d}",
                                  images=[ImageInput("fig", None, scene, "##".join(lines) + "<|COMPLETE|>")],
                                  extractions=extractions))
    return docs


SEP = "<SEP>"


def networkx_upsert(docs: list[DocumentInput]) -> nx.Graph:
    """LightRAG-style merge of every segment's records into one NetworkX graph."""
    g = nx.Graph()
    for doc in docs:
        for s, text in enumerate(doc.extractions):
            source = f"{doc.doc_id}-chunk-{s}"
            parsed = parse_extraction(text)
            for e in parsed.entities:
                key = e.key
                if g.has_node(key):
                    data = g.nodes[key]
                    if e.description not in data["description"].split(SEP):
                        data["description"] += SEP + e.description
                    data["source_id"] += SEP + source
                    data["types"].append(e.type)
                else:
                    g.add_node(key, entity_name=e.name, description=e.description, source_id=source, types=[e.type])
            for r in parsed.relations:
                u, v = r.source_key, r.target_key
                for x, name in ((u, r.source), (v, r.target)):
                    if not g.has_node(x):
                        g.add_node(x, entity_name=name, description="", source_id=source, types=["UNKNOWN"])
                w = 1.0 if r.weight is None else r.weight
                if g.has_edge(u, v):
                    data = g.edges[u, v]
                    data["weight"] += w
                    data["keywords"] = ",".join(dict.fromkeys(data["keywords"].split(",") + r.keywords.split(",")))
                    if r.description not in data["description"].split(SEP):
                        data["description"] += SEP + r.description
                    data["source_id"] += SEP + source
                else:
                    g.add_edge(u, v, weight=w, keywords=r.keywords, description=r.description, source_id=source)
    for _, data in g.nodes(data=True):
        data["entity_type"] = max(set(data["types"]), key=data["types"].count)
        del data["types"]
    return g
