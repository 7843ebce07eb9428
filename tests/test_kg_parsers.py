"""Parsing of knowledge-graph extraction responses (colgraph_engine.kg.parsers)."""
from pathlib import Path

import pytest

from colgraph_engine.kg import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseResult, RelationRecord, SceneObject,
    SceneRelation, detect_dialect, normalize_name, parse_extraction, parse_region_mappings,
    parse_scene_graph,
)

FIXTURES = Path(__file__).parent / "fixtures" / "kg"

FUJI_ENTITIES = [
    ("Mount Fuji", "location"), ("Shinkansen", "technology"), ("Tokyo", "location"), ("Shizuoka", "location"),
]
FUJI_RELATIONS = [  # source, target, keywords, weight in the legacy twin
    ("Shinkansen", "Mount Fuji", "view, scenery", 8.0),
    ("Shinkansen", "Tokyo", "departs from, terminus", 7.0),
    ("Mount Fuji", "Shizuoka", "located in, border", 9.0),
]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def reasons(result: ParseResult, severity: str | None = None) -> list[str]:
    return [i.reason for i in result.issues if severity is None or i.severity == severity]


# --- the Fuji scenario, exact graph -----------------------------------------------------------

def test_fuji_lightrag_current_exact_graph():
    r = parse_extraction(fixture("fuji.txt"))
    assert r.dialect == "lightrag" and r.complete
    assert r.issues == () and r.skipped == 0 and r.ignored == 0
    assert [(e.name, e.type) for e in r.entities] == FUJI_ENTITIES
    assert [(x.source, x.target, x.keywords, x.weight) for x in r.relations] == [
        (s, t, k, None) for s, t, k, _ in FUJI_RELATIONS]
    assert r.entities[0].description.startswith("Mount Fuji is the snow-capped volcano")
    assert r.relations[0].description.startswith("The train passes the mountain")
    assert [e.position[0] for e in r.entities] == [1, 2, 3, 4]
    assert r.relations[0].position[0] == 5
    assert r.counts == {"entities": 4, "relations": 3, "mappings": 0, "objects": 0, "scene_relations": 0,
                        "issues": 0, "errors": 0, "warnings": 0, "skipped": 0, "ignored": 0}


def test_fuji_legacy_twin_matches_current():
    current = parse_extraction(fixture("fuji.txt"))
    r = parse_extraction(fixture("fuji_legacy.txt"))
    assert r.dialect == "tuple" and r.complete and r.issues == ()
    assert r.ignored == 1  # the content_keywords record
    assert [(e.name, e.type, e.description) for e in r.entities] == [
        (e.name, e.type, e.description) for e in current.entities]
    assert [(x.source, x.target, x.keywords, x.weight) for x in r.relations] == FUJI_RELATIONS
    assert [x.description for x in r.relations] == [x.description for x in current.relations]
    assert all(isinstance(x.weight, float) for x in r.relations)


def test_fuji_scene_graph_exact():
    r = parse_scene_graph(fixture("fuji_scene.txt"))
    assert r.dialect == "scene_graph" and r.issues == ()
    assert [(o.index, o.category, o.bbox) for o in r.objects] == [
        (1, "mountain", (0.10, 0.05, 0.90, 0.60)), (2, "train", (0.00, 0.55, 0.70, 0.95))]
    assert r.scene_relations == (SceneRelation(1, 2, "passing in front of", 1, (3, 91)),)
    assert parse_extraction(fixture("fuji_scene.txt")) == r  # auto-detected the same


def test_fuji_region_mappings_exact():
    r = parse_region_mappings(fixture("fuji_mappings.txt"))
    assert r.dialect == "mkg_mapping" and r.complete and r.issues == ()
    got = [(m.kind, m.ref, m.entity, m.source, m.target, m.score) for m in r.mappings]
    assert got == [
        ("image", None, "MOUNT FUJI", None, None, 8.0),
        ("object", 1, "MOUNT FUJI", None, None, 9.0),
        ("object", 2, "SHINKANSEN", None, None, 9.0),
        ("relation", 1, None, "SHINKANSEN", "MOUNT FUJI", 7.0),
    ]
    # Mapping names meet entity names through the normalised key.
    entities = {e.key for e in parse_extraction(fixture("fuji.txt")).entities}
    assert {normalize_name(m.entity or m.source) for m in r.mappings} <= entities
    assert parse_extraction(fixture("fuji_mappings.txt")).dialect == "mkg_mapping"


# --- every dialect ----------------------------------------------------------------------------

def test_graphrag_five_field_relationship_and_newline_separated_records():
    text = ('("entity"<|>"TOKYO"<|>"GEO"<|>"Capital of Japan")\n'
            '("relationship"<|>"TOKYO"<|>"MOUNT FUJI"<|>"Fuji is visible from Tokyo on clear days"<|>6)\n'
            '<|COMPLETE|>')
    r = parse_extraction(text)
    assert r.dialect == "tuple" and r.issues == ()
    assert r.relations == (RelationRecord("TOKYO", "MOUNT FUJI", "", "Fuji is visible from Tokyo on clear days", 6.0,
                                          (2, text.index('("relationship"'))),)


def test_mkg_combined_output_with_real_delimiters():
    # mKG-RAG's combined prompt: quoted region ids, "<|>" delimiters, entities and mappings mixed.
    text = ('("entity"<|>"MOUNT FUJI"<|>"location"<|>"A volcano")##\n'
            '("mapping"<|>"<image>"<|>"MOUNT FUJI"<|>8)##\n'
            '("mapping"<|>"<object_3>"<|>"MOUNT FUJI"<|>9)<|COMPLETE|>')
    r = parse_extraction(text)
    assert r.dialect == "tuple" and r.issues == ()
    assert len(r.entities) == 1
    assert [(m.kind, m.ref) for m in r.mappings] == [("image", None), ("object", 3)]


def test_mkg_scene_graph_underscore_bullets_and_fence():
    text = "Scene Graph:\n```\n- <object_0>: traffic light, (0.1, 0.2, 0.3, 0.4)\n- <object_1>: car, (0, 0, 1, 1)\n" \
           "- <relation_0>: <object_1> parked_near <object_0>\n```\n"
    r = parse_scene_graph(text)
    assert [(o.index, o.category) for o in r.objects] == [(0, "traffic light"), (1, "car")]
    assert [(s.subject, s.predicate, s.object) for s in r.scene_relations] == [(1, "parked_near", 0)]
    assert reasons(r) == ["text outside records"] and r.errors == ()


@pytest.mark.parametrize("wrap", [
    "{}",
    "```json\n{}\n```",
    "Sure! Here is the extraction:\n```json\n{}\n```\nLet me know if you need more.",
    "Here you go: {} -- done.",
])
def test_lightrag_json_mode(wrap):
    body = ('{"entities": [{"name": "Mount Fuji", "type": "location", "description": "Volcano"},'
            ' {"name": "Tokyo", "type": "location", "description": "Capital"}],'
            ' "relationships": [{"source": "Tokyo", "target": "Mount Fuji", "keywords": ["view", "day trip"],'
            ' "description": "Visible from Tokyo"}]}')
    r = parse_extraction(wrap.replace("{}", body))
    assert r.dialect == "lightrag_json" and r.complete and r.issues == ()
    assert [(e.name, e.type, e.position[0]) for e in r.entities] == [("Mount Fuji", "location", 0), ("Tokyo", "location", 1)]
    assert r.relations[0].keywords == "view, day trip" and r.relations[0].weight is None


def test_json_bad_item_and_invalid_json():
    r = parse_extraction('{"entities": [{"name": "A", "type": 3, "description": "x"}, "oops"], "relationships": []}')
    assert reasons(r) == ["wrong JSON shape", "wrong JSON shape"] and r.skipped == 2 and r.entities == ()
    r = parse_extraction('```json\n{"entities": [{"name": "A",\n```')
    assert r.dialect == "lightrag_json" and not r.complete and reasons(r) == ["invalid JSON"]
    with pytest.raises(ExtractionFormatError, match="invalid JSON"):
        parse_extraction('{"entities": [', strict=True)


def test_explicit_dialect_and_detection():
    assert detect_dialect(fixture("fuji.txt")) == "lightrag"
    assert detect_dialect(fixture("fuji_legacy.txt")) == "tuple"
    assert detect_dialect("nothing here") is None
    r = parse_extraction(fixture("fuji.txt"), dialect="tuple")  # wrong dialect forced: reported, not guessed
    assert r.entities == () and r.errors
    with pytest.raises(ValueError, match="dialect"):
        parse_extraction("x", dialect="graphml")
    with pytest.raises(TypeError, match="dialect"):
        parse_extraction("x", dialect=3)


# --- robustness -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["<|#>", "<||>", "<#|>", "<|>", "<|##|>"])
def test_mangled_delimiter_is_repaired_with_warning(bad):
    text = f"entity<|#|>Tokyo{bad}location<|#|>Capital\n<|COMPLETE|>"
    r = parse_extraction(text)
    assert r.dialect == "lightrag"
    assert r.entities == (EntityRecord("Tokyo", "location", "Capital", (1, 0)),)
    assert reasons(r) == ["repaired delimiter"] and r.issues[0].severity == "warning"
    assert bad in r.issues[0].detail
    assert parse_extraction(text, strict=True).entities == r.entities  # repairs do not raise


def test_mangled_delimiter_in_tuple_dialect():
    r = parse_extraction('("entity"<||>"Tokyo"<|>"location"<|>"Capital")<|COMPLETE|>')
    assert [e.name for e in r.entities] == ["Tokyo"] and reasons(r) == ["repaired delimiter"]


def test_unrecoverable_delimiter_is_an_error():
    text = "entity<|#|>A<|#|>person<|#|>x\nentity: Tokyo, location\n<|COMPLETE|>"
    r = parse_extraction(text)
    assert [e.name for e in r.entities] == ["A"]
    assert reasons(r) == ["missing delimiter"] and r.skipped == 1 and r.issues[0].position == (2, text.index("entity: "))


def test_relation_mislabelled_as_entity_current():
    text = ("entity<|#|>Tokyo<|#|>location<|#|>Capital\n"
            "entity<|#|>Shinkansen<|#|>technology<|#|>Fast train\n"
            "entity<|#|>Shinkansen<|#|>Tokyo<|#|>departs from<|#|>Departs from Tokyo Station\n"
            "<|COMPLETE|>")
    r = parse_extraction(text)
    assert len(r.entities) == 2
    assert r.relations == (RelationRecord("Shinkansen", "Tokyo", "departs from", "Departs from Tokyo Station", None,
                                          (3, text.index("entity<|#|>Shinkansen<|#|>Tokyo"))),)
    assert reasons(r) == ["reclassified entity as relation"] and r.issues[0].severity == "warning"


def test_five_field_entity_not_shaped_like_relation_is_an_error():
    r = parse_extraction("entity<|#|>Tokyo<|#|>location<|#|>Capital<|#|>of Japan\n<|COMPLETE|>")
    assert r.entities == () and reasons(r) == ["wrong field count"]


def test_relation_mislabelled_as_entity_tuple():
    # Reclassified only because B is declared by an entity record (as the line-format parser does).
    text = ('("entity"<|>"B"<|>"person"<|>"Someone")##\n'
            '("entity"<|>"A"<|>"B"<|>"A knows B"<|>"acquaintance"<|>5)<|COMPLETE|>')
    r = parse_extraction(text)
    assert [(x.source, x.target, x.keywords, x.weight) for x in r.relations] == [("A", "B", "acquaintance", 5.0)]
    assert [e.name for e in r.entities] == ["B"]
    assert reasons(r) == ["reclassified entity as relation"]
    # Without the declaration it is an entity of type B with extra fields (upstream's reading).
    r = parse_extraction('("entity"<|>"A"<|>"B"<|>"A knows B"<|>"acquaintance"<|>5)<|COMPLETE|>')
    assert [(e.name, e.type, e.description) for e in r.entities] == [("A", "B", "A knows B")] and r.relations == ()
    assert reasons(r) == ["extra fields ignored"]


def test_self_loop_skipped_in_both_modes():
    text = ("entity<|#|>Tokyo<|#|>location<|#|>Capital\n"
            "relation<|#|>Tokyo<|#|> \"tokyo \"<|#|>self<|#|>Tokyo is Tokyo\n<|COMPLETE|>")
    for strict in (False, True):
        r = parse_extraction(text, strict=strict)
        assert r.relations == () and reasons(r) == ["self-loop"]
        assert r.issues[0].severity == "skip" and r.skipped == 1
    r = parse_region_mappings('("mapping"|<relation-1>|Tokyo|TOKYO|5)<|COMPLETE|>')
    assert r.mappings == () and reasons(r) == ["self-loop"]
    r = parse_scene_graph("<object-1>: dog, (0, 0, 1, 1)\n<relation-1>: <object-1> chasing <object-1>")
    assert r.scene_relations == () and reasons(r) == ["self-loop"]


def test_empty_names():
    text = ('entity<|#|>""<|#|>location<|#|>Nameless\n'
            "relation<|#|>Tokyo<|#|>  <|#|>kw<|#|>desc\n<|COMPLETE|>")
    r = parse_extraction(text)
    assert r.entities == () and r.relations == ()
    assert reasons(r) == ["empty name", "empty name"] and r.skipped == 2
    with pytest.raises(ExtractionFormatError, match="empty name") as info:
        parse_extraction(text, strict=True)
    assert isinstance(info.value, ValueError) and len(info.value.issues) == 2
    assert info.value.first.position == (1, 0)
    assert reasons(parse_region_mappings('("mapping"|<image>| |8)<|COMPLETE|>')) == ["empty name"]


def test_fields_stripped_and_names_normalised():
    r = parse_extraction(' entity<|#|>  "Mount   Fuji" <|#|> \'location\' <|#|> “A volcano” \n<|COMPLETE|>')
    (e,) = r.entities
    assert (e.name, e.type, e.description) == ("Mount   Fuji", "location", "A volcano")
    assert e.key == "mount fuji" == normalize_name("MOUNT FUJI")
    assert e.position == (1, 1)


@pytest.mark.parametrize("raw,expected", [("8", 8.0), ("8.0", 8.0), (" 0.9 ", 0.9), ('"7"', 7.0)])
def test_weight_parsing_tolerant(raw, expected):
    r = parse_extraction(f'("relationship"<|>"A"<|>"B"<|>"desc"<|>{raw})<|COMPLETE|>')
    assert r.relations[0].weight == expected and r.issues == ()


@pytest.mark.parametrize("raw", ["-1", "1e999", "-0.5"])
def test_weight_numeric_but_invalid_is_an_issue(raw):
    r = parse_extraction(f'("relationship"<|>"A"<|>"B"<|>"desc"<|>{raw})<|COMPLETE|>')
    assert r.relations == () and r.skipped == 1
    assert r.issues[0].reason == "invalid weight"


@pytest.mark.parametrize("raw", ["N/A", "nan", "none", '"n/a"'])
def test_weight_placeholder_is_one_with_a_warning(raw):
    r = parse_extraction(f'("relationship"<|>"A"<|>"B"<|>"desc"<|>{raw})<|COMPLETE|>', strict=True)
    assert [(x.source, x.target, x.keywords, x.weight) for x in r.relations] == [("A", "B", "", 1.0)]
    assert reasons(r) == ["default weight"] and r.issues[0].severity == "warning"
    # an empty last field is a dangling delimiter, then an absent weight
    r = parse_extraction('("relationship"<|>"A"<|>"B"<|>"desc"<|>)<|COMPLETE|>', strict=True)
    assert r.relations[0].weight == 1.0 and reasons(r) == ["dangling delimiter", "default weight"]


def test_missing_completion_marker():
    # Whole records without the marker: kept, a warning, strict mode accepts them.
    text = fixture("fuji.txt").replace("<|COMPLETE|>", "")
    r = parse_extraction(text)
    assert not r.complete and reasons(r) == ["no completion marker"] and r.issues[0].severity == "warning"
    assert len(r.entities) == 4 and len(r.relations) == 3 and r.skipped == 0  # records kept
    assert parse_extraction(text, strict=True).entities == r.entities
    r = parse_extraction(fixture("fuji_legacy.txt").replace("<|COMPLETE|>", ""))
    assert not r.complete and len(r.relations) == 3 and r.errors == ()
    # A last record cut in the middle: the answer was cut off, an error.
    cut = fixture("fuji.txt").replace("<|COMPLETE|>", "")
    cut = cut[:cut.rindex("<|#|>")]
    r = parse_extraction(cut)
    assert [i.reason for i in r.errors] == ["wrong field count", "no completion marker"]
    with pytest.raises(ExtractionFormatError, match="wrong field count"):
        parse_extraction(cut, strict=True)
    cut = fixture("fuji_legacy.txt").split("<|COMPLETE|>")[0][:-40]
    r = parse_extraction(cut)
    assert [i.reason for i in r.errors] == ["unclosed record", "no completion marker"]


def test_text_after_completion_marker_is_reported():
    r = parse_extraction(fixture("fuji.txt") + "Hope this helps!\n")
    assert r.complete and reasons(r) == ["text after completion marker"] and len(r.entities) == 4


def test_strict_versus_lenient():
    text = ("entity<|#|>Tokyo<|#|>location<|#|>Capital\n"
            "relation<|#|>Tokyo<|#|>Osaka<|#|>kw\n"  # 4 fields: malformed
            "entity<|#|>Osaka<|#|>location<|#|>City\n<|COMPLETE|>")
    r = parse_extraction(text)
    assert [e.name for e in r.entities] == ["Tokyo", "Osaka"] and r.relations == ()
    assert reasons(r) == ["wrong field count"] and r.skipped == 1 and r.issues[0].position == (2, text.index("relation"))
    with pytest.raises(ExtractionFormatError) as info:
        parse_extraction(text, strict=True)
    assert "wrong field count" in str(info.value) and "line 2" in str(info.value)


@pytest.mark.parametrize("line,detail", [
    ("<object-3>: kite, (0.2, 0.1, 1.2, 0.3)", "[0, 1]"),
    ("<object-3>: kite, (0.5, 0.1, 0.2, 0.3)", "x1 <= x2"),
    ("<object-3>: kite, (0.1, 0.4, 0.2, 0.3)", "y1 <= y2"),
    ("<object-3>: kite, (0.1, 0.2, 0.3)", "4 coordinates"),
    ("<object-3>: kite, (0.1, a, 0.2, 0.3)", "non-numeric"),
])
def test_bad_bbox(line, detail):
    r = parse_scene_graph(fixture("fuji_scene.txt") + line + "\n")
    assert len(r.objects) == 2 and reasons(r) == ["bad bbox"] and detail in r.issues[0].detail
    assert r.issues[0].position[0] == 4
    with pytest.raises(ExtractionFormatError, match="bad bbox"):
        parse_scene_graph(fixture("fuji_scene.txt") + line, strict=True)


def test_scene_relation_to_unknown_object_and_malformed_lines():
    text = fixture("fuji_scene.txt") + "<relation-2>: <object-2> near <object-9>\n<relation-3>: <object-1>\n"
    r = parse_scene_graph(text)
    assert len(r.scene_relations) == 1 and reasons(r) == ["malformed relation", "unknown object"]


def test_bad_region_reference_and_field_count():
    r = parse_region_mappings('("mapping"|<region-1>|A|3)##("mapping"|<object-1>|A|B|3)<|COMPLETE|>')
    assert r.mappings == () and reasons(r) == ["bad region reference", "wrong field count"]


@pytest.mark.parametrize("text", ["", "   \n", "I could not find any entities in this text.", "<html>oops</html>"])
def test_garbage_gives_empty_result_with_issue(text):
    r = parse_extraction(text)
    assert r.dialect is None and not r.complete
    assert r.counts["entities"] == r.counts["relations"] == r.counts["mappings"] == 0
    assert reasons(r) == ["no records"]
    with pytest.raises(ExtractionFormatError, match="no records"):
        parse_extraction(text, strict=True)


def test_prose_around_tuple_records_is_a_warning_not_a_loss():
    text = "Here are the results:\n" + fixture("fuji_legacy.txt")
    r = parse_extraction(text, strict=True)
    assert len(r.entities) == 4 and reasons(r) == ["text outside records"]


def test_type_errors():
    for call in (parse_extraction, parse_scene_graph, parse_region_mappings, detect_dialect):
        with pytest.raises(TypeError, match="text"):
            call(b"entity<|#|>A")
    with pytest.raises(TypeError, match="strict"):
        parse_extraction("x", strict="yes")


def test_records_are_frozen():
    r = parse_extraction(fixture("fuji.txt"))
    with pytest.raises(AttributeError):
        r.entities[0].name = "Fuji"  # type: ignore[misc]
    assert isinstance(r.entities, tuple) and isinstance(SceneObject(1, "x", (0, 0, 1, 1), (1, 0)), SceneObject)
    assert MappingRecord("image", None, "A", None, None, 1.0, (1, 0)).ref is None


def test_image_mapping_may_name_a_relation():
    from colgraph_engine.kg import parse_region_mappings

    r = parse_region_mappings('("mapping"|<image>|SHINKANSEN|MOUNT FUJI|7)##("mapping"|<image>|TOKYO|9)<|COMPLETE|>')
    assert [(m.kind, m.entity, m.source, m.target, m.score) for m in r.mappings] == [
        ("image", None, "SHINKANSEN", "MOUNT FUJI", 7.0), ("image", "TOKYO", None, None, 9.0)]
    bad = parse_region_mappings('("mapping"|<image>|A|B|C|7)<|COMPLETE|>')
    assert not bad.mappings and bad.issues[0].reason == "wrong field count" and "4 or 5" in bad.issues[0].detail
    loop = parse_region_mappings('("mapping"|<image>|A|a|7)<|COMPLETE|>')
    assert not loop.mappings and loop.issues[0].reason == "self-loop"
