"""Per-document graph building: the paper's example, merge rules, images and regions, tables,
issues in strict and lenient mode, extractors, and input checks."""
from pathlib import Path

import numpy as np
import pytest

from colgraph_engine.graph import EdgeKind, NodeKind
from colgraph_engine.kg import (
    CooccurrenceExtractor, DocumentBuildError, DocumentInput, ImageInput, Section, TableInput, build_document_graph,
    parse_extraction,
)

FIXTURES = Path(__file__).parent / "fixtures" / "kg"
SEP = "<|#|>"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def fuji_document(**overrides) -> DocumentInput:
    """The paper's example: a passage about the Shinkansen passing Mount Fuji and a photo of it."""
    image = np.zeros((100, 200, 3), np.uint8)
    image[5:60, 20:180] = (200, 200, 220)   # the mountain
    image[55:95, 0:140] = (30, 90, 200)      # the train
    kwargs = dict(
        doc_id="fuji", title="A ride past Mount Fuji",
        sections=[Section("Leaving Tokyo on the Shinkansen, Mount Fuji fills the right-hand windows.",
                          images=("photo",)),
                  Section("South of the mountain lies Shizuoka.")],
        images=[ImageInput("photo", image, fixture("fuji_scene.txt"), fixture("fuji_mappings.txt"), "The view")],
        extractions=[fixture("fuji.txt"), fixture("fuji_legacy.txt")])
    kwargs.update(overrides)
    return DocumentInput(**kwargs)


def edges(g, kind):
    return {(g.node_name[g.edge_src[e]], g.node_name[g.edge_dst[e]]): e for e in g.edges_of(kind)}


def test_paper_example_builds_the_expected_graph():
    g = build_document_graph(fuji_document(), strict=True)
    assert g.counts == {"segments": 2, "entities": 4, "tables": 0, "images": 1, "regions": 3, "relations": 3,
                        "nodes": 11, "edges": 23, "errors": 0, "warnings": 0}
    ents = {g.node_name[v]: v for v in g.nodes_of(NodeKind.ENTITY)}
    assert set(ents) == {"Mount Fuji", "Shinkansen", "Tokyo", "Shizuoka"}
    assert [g.node_type[ents[n]] for n in ("Mount Fuji", "Shinkansen", "Tokyo")] == ["location", "technology", "location"]
    # both segments' records name all four entities: provenance spans both segments
    assert all(g.provenance(v).tolist() == [0, 1] for v in ents.values())
    rel = edges(g, EdgeKind.RELATION)
    assert set(rel) == {("Shinkansen", "Mount Fuji"), ("Shinkansen", "Tokyo"), ("Mount Fuji", "Shizuoka")}
    e = rel[("Shinkansen", "Mount Fuji")]
    # current format has no strength (1.0), the legacy copy says 8: merged weights add
    assert g.edge_weight[e] == pytest.approx(9.0)
    assert g.edge_keywords[e] == "view, scenery"
    # image-level match, object matches and the relation region
    dep = edges(g, EdgeKind.DEPICTS)
    assert g.edge_weight[dep[("photo", "Mount Fuji")]] == 8
    assert g.edge_weight[dep[("object-1", "Mount Fuji")]] == 9
    assert g.edge_weight[dep[("object-2", "Shinkansen")]] == 9
    regions = {g.node_name[v]: v for v in g.nodes_of(NodeKind.REGION)}
    r = regions["relation-1"]
    np.testing.assert_allclose(g.node_bbox[r], [0.0, 0.05, 0.9, 0.95])  # union of both objects' boxes
    np.testing.assert_allclose(g.node_bbox[regions["object-1"]], [0.10, 0.05, 0.90, 0.60])
    assert g.node_edge[r] == e  # the relation region points at the relation edge it shows
    assert set(edges(g, EdgeKind.DEPICTS_RELATION)) == {("relation-1", "Shinkansen"), ("relation-1", "Mount Fuji")}
    scene = edges(g, EdgeKind.SCENE)
    assert g.edge_keywords[scene[("object-2", "object-1")]] == "passing in front of"
    image = g.nodes_of(NodeKind.IMAGE)[0]
    assert all(g.node_image[v] == image for v in regions.values())
    contains = edges(g, EdgeKind.CONTAINS)
    assert ("segment-0", "photo") in contains and ("A ride past Mount Fuji", "segment-1") in contains


def test_entities_merge_within_a_document_with_majority_type_and_all_descriptions():
    seg0 = "\n".join([f"entity{SEP}Kyoto{SEP}city{SEP}Old capital.", f"entity{SEP}KYOTO{SEP}place{SEP}Old capital.",
                      f"entity{SEP}Nara{SEP}city{SEP}Older capital.", "<|COMPLETE|>"])
    seg1 = "\n".join([f"entity{SEP} kyoto {SEP}city{SEP}Has many temples.",
                      f"relation{SEP}Nara{SEP}Kyoto{SEP}capital, history{SEP}Both were capitals.",
                      f"relation{SEP}Kyoto{SEP}Nara{SEP}rail{SEP}A train links them.", "<|COMPLETE|>"])
    doc = DocumentInput("d", segments=None, sections=["one", "two"], extractions=[seg0, seg1])
    g = build_document_graph(doc, max_tokens=1)
    kyoto = g.entity("kyoto")
    assert g.node_name[kyoto] == "Kyoto"        # first spelling
    assert g.node_type[kyoto] == "city"         # 2 x city vs 1 x place
    assert g.node_text[kyoto] == "Old capital.\nHas many temples."
    assert g.provenance(kyoto).tolist() == [0, 1]
    assert g.node_weight[kyoto] == 5            # mentions: 2 + 1 in records, 2 as relation endpoint
    (e,) = g.edges_of(EdgeKind.RELATION)        # both directions merge into one edge
    assert (g.node_name[g.edge_src[e]], g.node_name[g.edge_dst[e]]) == ("Nara", "Kyoto")
    assert g.edge_weight[e] == 2.0
    assert g.edge_keywords[e] == "capital, history, rail"
    assert g.edge_text[e] == "Both were capitals.\nA train links them."
    assert g.edge_prov[g.edge_prov_offsets[e]:g.edge_prov_offsets[e + 1]].tolist() == [1]
    # a relation of the first segment keeps ordinal 0 in its provenance (0 is not "empty")
    first = build_document_graph(DocumentInput("f", sections=["one"], extractions=[seg1]))
    (e0,) = first.edges_of(EdgeKind.RELATION)
    assert first.edge_prov[first.edge_prov_offsets[e0]:first.edge_prov_offsets[e0 + 1]].tolist() == [0]
    mentions = {(g.node_name[g.edge_src[e]], g.node_name[g.edge_dst[e]]): g.edge_weight[e]
                for e in g.edges_of(EdgeKind.MENTIONS)}
    assert mentions == {("segment-0", "Kyoto"): 2, ("segment-0", "Nara"): 1, ("segment-1", "Kyoto"): 3,
                        ("segment-1", "Nara"): 2}


def test_relation_to_an_undeclared_entity_creates_it_with_a_warning():
    text = f"entity{SEP}Osaka{SEP}city{SEP}A city.\nrelation{SEP}Osaka{SEP}Kobe{SEP}near{SEP}Close by.\n<|COMPLETE|>"
    g = build_document_graph(DocumentInput("d", ["x"], extractions=[text]), strict=True)
    kobe = g.entity("Kobe")
    assert g.node_type[kobe] == "UNKNOWN" and g.node_text[kobe] == ""
    assert [i.issue.reason for i in g.issues] == ["undeclared entity"]
    assert g.issues[0].severity == "warning" and g.issues[0].where == "segment 0"


def test_mapping_to_an_unknown_entity_is_an_error_strict_raises_lenient_drops():
    mappings = fixture("fuji_mappings.txt").replace("SHINKANSEN|9", "BULLET TRAIN|9")
    doc = fuji_document(images=[ImageInput("photo", None, fixture("fuji_scene.txt"), mappings)])
    g = build_document_graph(doc)
    errors = [i for i in g.issues if i.severity == "error"]
    assert [i.issue.reason for i in errors] == ["unknown entity"]
    assert "bullet train" in errors[0].issue.detail.lower()
    assert ("object-2", "Shinkansen") not in edges(g, EdgeKind.DEPICTS)
    with pytest.raises(DocumentBuildError, match="unknown entity") as info:
        build_document_graph(doc, strict=True)
    assert len(info.value.issues) >= 1


def test_malformed_records_are_reported_with_position_and_mangled_delimiters_repaired():
    text = "\n".join([f"entity{SEP}Tokyo{SEP}city{SEP}Capital.",
                      "entity<|#>Osaka<|#|>city<|#|>Second city.",          # mangled delimiter: repaired
                      f"entity{SEP}Kyoto{SEP}city{SEP}Old capital.", f"entity{SEP}Nara{SEP}city{SEP}Older capital.",
                      f"entity{SEP}Kyoto{SEP}Nara{SEP}capital{SEP}Both old capitals.",  # relation labelled entity
                      f"relation{SEP}Tokyo{SEP}only three fields",            # malformed
                      "<|COMPLETE|>"])
    g = build_document_graph(DocumentInput("d", ["x"], extractions=[text]))
    assert {g.node_name[v] for v in g.nodes_of(NodeKind.ENTITY)} == {"Tokyo", "Osaka", "Kyoto", "Nara"}
    assert len(g.edges_of(EdgeKind.RELATION)) == 1
    errors = [i for i in g.issues if i.severity == "error"]
    assert len(errors) == 1 and errors[0].issue.position[0] == 6
    with pytest.raises(DocumentBuildError, match="segment 0"):
        build_document_graph(DocumentInput("d", ["x"], extractions=[text]), strict=True)


def test_dialect_is_detected_per_segment():
    json_text = '{"entities": [{"name": "Tokyo", "type": "city", "description": "Capital."}], "relationships": []}'
    g = build_document_graph(DocumentInput("d", ["a", "b", "c"], extractions=[fixture("fuji.txt"), json_text,
                                                                           fixture("fuji_legacy.txt")]),
                             max_tokens=1, strict=True)
    assert g.provenance(g.entity("Tokyo")).tolist() == [0, 1, 2]
    assert g.provenance(g.entity("Shizuoka")).tolist() == [0, 2]


def test_parsed_results_are_accepted_in_place_of_text():
    parsed = parse_extraction(fixture("fuji.txt"))
    a = build_document_graph(DocumentInput("d", ["x"], extractions=[parsed]))
    b = build_document_graph(DocumentInput("d", ["x"], extractions=[fixture("fuji.txt")]))
    assert a.node_name == b.node_name and np.array_equal(a.edge_src, b.edge_src)


def test_low_scoring_matches_are_skipped_and_reported():
    g = build_document_graph(fuji_document(), min_mapping_score=8.5, image_fallback="off")
    skipped = [i for i in g.issues if i.severity == "skip"]
    assert sorted(i.issue.reason for i in skipped) == ["low score", "low score"]  # score 8 (image) and 7 (relation)
    assert ("photo", "Mount Fuji") not in edges(g, EdgeKind.DEPICTS)
    assert "relation-1" not in {g.node_name[v] for v in g.nodes_of(NodeKind.REGION)}


def test_relation_mapping_without_a_text_relation_gives_each_object_its_entity_at_half_weight():
    # Shizuoka and Tokyo share no text relation: mKG-RAG's rule gives the relation's first object
    # the source entity and its second object the target entity, weight max(7 // 2, 1) = 3.
    mappings = '("mapping"|<relation-1>|SHIZUOKA|TOKYO|7)<|COMPLETE|>'
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, fixture("fuji_scene.txt"), mappings)]),
                             image_fallback="off")
    assert "relation-1" not in {g.node_name[v] for v in g.nodes_of(NodeKind.REGION)}
    dep = edges(g, EdgeKind.DEPICTS)
    # <relation-1>: <object-2> passing in front of <object-1>  -> object-2 is the subject
    assert g.edge_weight[dep[("object-2", "Shizuoka")]] == 3
    assert g.edge_weight[dep[("object-1", "Tokyo")]] == 3
    assert not g.edges_of(EdgeKind.DEPICTS_RELATION).size
    assert "no such relation" in [i.issue.reason for i in g.issues]
    # a score of 1 still gives weight 1 (the rule's floor)
    low = build_document_graph(fuji_document(images=[ImageInput(
        "photo", None, fixture("fuji_scene.txt"), '("mapping"|<relation-1>|SHIZUOKA|TOKYO|1)<|COMPLETE|>')]),
        image_fallback="off")
    assert low.edge_weight[edges(low, EdgeKind.DEPICTS)[("object-2", "Shizuoka")]] == 1


def test_relation_mapping_with_a_text_relation_keeps_the_relation_region_at_full_weight():
    g = build_document_graph(fuji_document())
    r = [v for v in g.nodes_of(NodeKind.REGION) if g.node_name[v] == "relation-1"][0]
    e = edges(g, EdgeKind.RELATION)[("Shinkansen", "Mount Fuji")]
    assert g.node_edge[r] == e
    assert {g.edge_weight[x] for x in g.edges_of(EdgeKind.DEPICTS_RELATION)} == {7.0}


def _fallback_edges(g):
    return {(g.node_name[g.edge_src[e]], g.node_name[g.edge_dst[e]]): float(g.edge_weight[e])
            for e in g.edges_of(EdgeKind.DEPICTS) if g.edge_keywords[e] == "fallback"}


def test_image_without_an_image_level_match_attaches_to_the_highest_degree_entity():
    # only object-level matches: they do not count (mKG-RAG), so the whole image falls back
    objects_only = '("mapping"|<object-2>|SHINKANSEN|9)<|COMPLETE|>'
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, fixture("fuji_scene.txt"), objects_only)]))
    # relations: Shinkansen-Mount Fuji, Shinkansen-Tokyo, Mount Fuji-Shizuoka -> Shinkansen and
    # Mount Fuji both have degree 2; the first declared wins
    first = min((v for v in g.nodes_of(NodeKind.ENTITY) if g.node_name[v] in ("Shinkansen", "Mount Fuji")))
    assert _fallback_edges(g) == {("photo", g.node_name[first]): 1.0}
    # an image-level match means no fallback
    assert _fallback_edges(build_document_graph(fuji_document())) == {}
    # an image with no matches at all falls back too; "off" leaves it on its segment only
    bare = fuji_document(images=[ImageInput("photo", None)])
    assert len(_fallback_edges(build_document_graph(bare))) == 1
    assert _fallback_edges(build_document_graph(bare, image_fallback="off")) == {}


def test_fallback_without_relations_uses_the_similarity_or_else_the_most_mentioned_entity():
    line = "entity<|#|>{0}<|#|>thing<|#|>about {0}\n"
    text = (line.format("Alpha") + line.format("Beta") + line.format("Beta") + "<|COMPLETE|>")
    doc = DocumentInput("d", [Section("alpha beta", images=("img",))], images=[ImageInput("img", "pixels")],
                        extractions=[text])
    # no relation, no similarity: Beta is mentioned twice in the image's segment
    assert _fallback_edges(build_document_graph(doc)) == {("img", "Beta"): 1.0}
    seen = []

    def similarity(pixels, descriptions):
        seen.append((pixels, list(descriptions)))
        return [0.9 if "Alpha" in d else 0.1 for d in descriptions]

    assert _fallback_edges(build_document_graph(doc, image_entity_scores=similarity)) == {("img", "Alpha"): 1.0}
    assert seen == [("pixels", ["about Alpha", "about Beta"])]
    assert _fallback_edges(build_document_graph(doc, image_fallback="similarity", image_entity_scores=similarity)) \
        == {("img", "Alpha"): 1.0}
    # a failing or malformed similarity is reported and the offline rule decides
    g = build_document_graph(doc, image_entity_scores=lambda p, d: [1.0])
    assert _fallback_edges(g) == {("img", "Beta"): 1.0} and "bad similarity" in [i.issue.reason for i in g.issues]

    def broken(pixels, descriptions):
        raise RuntimeError("model down")

    g = build_document_graph(doc, image_entity_scores=broken)
    assert _fallback_edges(g) == {("img", "Beta"): 1.0} and "similarity failed" in [i.issue.reason for i in g.issues]


def test_fallback_arguments_are_checked_and_documents_without_entities_keep_images_on_segments():
    doc = DocumentInput("d", [Section("no names here", images=("img",))], images=[ImageInput("img")],
                        extractions=["<|COMPLETE|>"])
    g = build_document_graph(doc)
    assert _fallback_edges(g) == {} and "no entity" in [i.issue.reason for i in g.issues if i.severity == "skip"]
    with pytest.raises(ValueError, match="image_fallback"):
        build_document_graph(doc, image_fallback="nearest")
    with pytest.raises(ValueError, match="image_entity_scores"):
        build_document_graph(doc, image_fallback="similarity")
    with pytest.raises(TypeError, match="image_entity_scores"):
        build_document_graph(doc, image_entity_scores="clip")


def test_scene_graph_problems_are_reported_with_the_image():
    scene = fixture("fuji_scene.txt") + "\n<object-3>: cloud, (0.5, 0.2, 1.7, 0.3)\n"
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, scene, None)]))
    (issue,) = [i for i in g.issues if i.severity == "error"]
    assert issue.where == "image 'photo' scene graph" and issue.issue.reason == "bad bbox"
    assert len(g.nodes_of(NodeKind.REGION)) == 2


def test_images_and_tables_attach_to_their_segments():
    doc = DocumentInput("d", [Section("intro text"), Section("fig text", images=("fig",)), Section("table text")],
                        images=[ImageInput("fig", None), ImageInput("loose", None)],
                        tables=[TableInput("a | b\n1 | 2", "Table 1", section=2), TableInput("x", section=9)],
                        extractions=None)
    g = build_document_graph(doc, max_tokens=2, extractor=lambda text: "<|COMPLETE|>")
    contains = edges(g, EdgeKind.CONTAINS)
    assert ("segment-1", "fig") in contains                 # the image's section is its own segment
    assert (g.node_name[0], "loose") in contains            # not in any section: the document holds it
    assert ("segment-2", "table-0") in contains
    assert (g.node_name[0], "table-1") in contains
    assert g.node_text[g.nodes_of(NodeKind.TABLE)[0]] == "Table 1\na | b\n1 | 2"
    reasons = sorted(i.issue.reason for i in g.issues if not i.where.startswith("segment"))
    # no entity to attach the two unmatched images to: reported as skips
    assert reasons == ["image not in any section", "no entity", "no entity", "unknown section"]


def test_default_extractor_is_deterministic_and_document_specific():
    text = ("The Shinkansen leaves Tokyo Station every ten minutes. Passengers see Mount Fuji above "
            "Shizuoka Prefecture. The Tokaido line opened in 1964.")
    a = build_document_graph(DocumentInput("d", [text]))
    b = build_document_graph(DocumentInput("d", [text]))
    names = {a.node_name[v] for v in a.nodes_of(NodeKind.ENTITY)}
    # the default is PhraseExtractor: noun phrases ("Tokaido line", "ten minutes"), no plural opener ("Passengers")
    assert names == {"Shinkansen", "Tokyo Station", "ten minutes", "Mount Fuji", "Shizuoka Prefecture", "Tokaido line",
                     "1964"}
    assert a.node_name == b.node_name and a.edge_keywords == b.edge_keywords
    rel = edges(a, EdgeKind.RELATION)
    assert a.edge_keywords[rel[("Shinkansen", "Tokyo Station")]] == "leaves"
    assert a.edge_keywords[rel[("Tokaido line", "1964")]] == "opened in"
    assert a.counts["errors"] == 0


def test_default_extractor_splits_names_at_punctuation_and_skips_sentence_openers():
    ext = CooccurrenceExtractor()
    assert ext.phrases("From the fields of Makinohara, Mount Fuji is visible.") == ["Makinohara", "Mount Fuji"]
    assert ext.phrases("The Bank of Japan opened in 1882 in Tokyo and Osaka.") == ["Bank of Japan", "1882", "Tokyo",
                                                                                   "Osaka"]
    assert ext.phrases("In Kyoto, JNR ran trains.") == ["Kyoto", "JNR"]


def test_custom_extractor_sees_each_segment_text():
    seen = []

    def extractor(text):
        seen.append(text)
        return f"entity{SEP}{text.split()[0]}{SEP}word{SEP}first word\n<|COMPLETE|>"

    g = build_document_graph(DocumentInput("d", ["alpha beta", "gamma delta"]), extractor=extractor, max_tokens=2)
    assert seen == ["alpha beta", "gamma delta"]
    assert {g.node_name[v] for v in g.nodes_of(NodeKind.ENTITY)} == {"alpha", "gamma"}
    assert CooccurrenceExtractor.name == "cooccurrence-v1"


@pytest.mark.parametrize("doc, kwargs, exc, match", [
    ("not a doc", {}, TypeError, "doc: expected a DocumentInput"),
    (DocumentInput(" "), {}, ValueError, "doc.doc_id"),
    (DocumentInput("d", ["a"], extractions=["x", "y"]), {}, ValueError, r"doc.extractions: expected one response per segment \(1\)"),
    (DocumentInput("d", ["a"], extractions="x"), {}, ValueError, "doc.extractions"),
    (DocumentInput("d", ["a"], images=[ImageInput("i"), ImageInput("i")]), {}, ValueError, "duplicate image ref"),
    (DocumentInput("d", ["a"], images=["i"]), {}, TypeError, r"doc.images\[0\]"),
    (DocumentInput("d", ["a"], tables=[TableInput("t", section=-1)]), {}, ValueError, r"doc.tables\[0\].section"),
    (DocumentInput("d", ["a"]), {"extractor": "nope"}, TypeError, "extractor"),
    (DocumentInput("d", ["a"]), {"strict": 1}, TypeError, "strict"),
    (DocumentInput("d", ["a"]), {"min_mapping_score": float("nan")}, ValueError, "min_mapping_score"),
    (DocumentInput("d", ["a"]), {"max_tokens": 0}, ValueError, "max_tokens"),
    (DocumentInput("d", ["a"], extractions=[3]), {}, TypeError, "extraction of segment 0"),
])
def test_bad_input_is_named(doc, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        build_document_graph(doc, **kwargs)


def test_whole_image_matched_to_a_relation_depicts_both_endpoints():
    # mKG-RAG's matching lets <image> stand for a relation: full score when the text has that
    # relation, max(score // 2, 1) per endpoint when it does not; either way no fallback
    with_rel = '("mapping"|<image>|SHINKANSEN|MOUNT FUJI|7)<|COMPLETE|>'
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, None, with_rel)]))
    dep = edges(g, EdgeKind.DEPICTS)
    assert g.edge_weight[dep[("photo", "Shinkansen")]] == 7 and g.edge_weight[dep[("photo", "Mount Fuji")]] == 7
    assert _fallback_edges(g) == {}
    without = '("mapping"|<image>|SHIZUOKA|TOKYO|7)<|COMPLETE|>'
    g = build_document_graph(fuji_document(images=[ImageInput("photo", None, None, without)]))
    dep = edges(g, EdgeKind.DEPICTS)
    assert g.edge_weight[dep[("photo", "Shizuoka")]] == 3 and g.edge_weight[dep[("photo", "Tokyo")]] == 3
    assert _fallback_edges(g) == {}


def test_fallback_is_scoped_to_the_images_segment_like_mkg_rags_chunks():
    rel = "relation<|#|>{0}<|#|>{1}<|#|>near<|#|>{0} is near {1}"
    ent = "entity<|#|>{0}<|#|>place<|#|>about {0}"
    seg0 = "\n".join([ent.format(n) for n in ("Hub", "A", "B", "C")] +
                     [rel.format("Hub", x) for x in ("A", "B", "C")] + ["<|COMPLETE|>"])
    seg1 = "\n".join([ent.format("Lake"), ent.format("Pier"), rel.format("Pier", "Lake"), ent.format("Pier"),
                      "<|COMPLETE|>"])
    doc = DocumentInput("d", [Section("first"), Section("second", images=("img",)), Section("third", images=("bare",))],
                        images=[ImageInput("img"), ImageInput("bare")], extractions=[seg0, seg1, "<|COMPLETE|>"])
    g = build_document_graph(doc, max_tokens=1)
    # Hub has the most relations in the document, but not in the image's segment: Lake and Pier
    # tie on degree there, and Lake was declared first
    assert _fallback_edges(g) == {("img", "Lake"): 1.0}
    # the third segment has no entity: its image is left on its segment, as mKG-RAG's empty chunk
    assert any(i.issue.reason == "no entity" and "bare" in i.where for i in g.issues)
