"""The dialect slips real extraction responses show (issue 11, item 3), each on an invented example.

Every case is checked lenient and strict: a repair keeps the record and leaves a warning (strict
mode accepts it), a loss is an error (strict mode raises).
"""
import pytest

from colgraph_engine.kg import ExtractionFormatError, detect_dialect, parse_extraction, parse_region_mappings


def reasons(result, severity=None):
    return [i.reason for i in result.issues if severity is None or i.severity == severity]


def both(text, **kw):
    """Lenient and strict results; asserts they agree (strict raises only on errors)."""
    lenient = parse_extraction(text, **kw)
    assert lenient.errors == ()
    strict = parse_extraction(text, strict=True, **kw)
    assert strict == lenient
    return lenient


# --- extra trailing fields -------------------------------------------------------------------

def test_entity_with_an_extra_quote_field_is_kept():
    text = ('("entity"<|>"Harbour Lighthouse"<|>"building"<|>"A white tower on the pier"<|>"the lamp was lit in 1871")##\n'
            '("entity"<|>"Pier"<|>"location"<|>"Stone pier"<|>"built of granite")<|COMPLETE|>')
    r = both(text)
    assert [(e.name, e.type, e.description) for e in r.entities] == [
        ("Harbour Lighthouse", "building", "A white tower on the pier"), ("Pier", "location", "Stone pier")]
    assert reasons(r) == ["extra fields ignored", "extra fields ignored"]


def test_relationship_with_extra_fields_keeps_its_strength():
    text = ('("relationship"<|>"Keeper"<|>"Lighthouse"<|>"tends the lamp"<|>"duty, care"<|>8<|>"quote: every night")##\n'
            '("relationship"<|>"Pier"<|>"Lighthouse"<|>"carries the tower"<|>6<|>"quote: on its end")<|COMPLETE|>')
    r = both(text)
    assert [(x.source, x.target, x.keywords, x.weight) for x in r.relations] == [
        ("Keeper", "Lighthouse", "duty, care", 8.0), ("Pier", "Lighthouse", "", 6.0)]
    assert reasons(r) == ["extra fields ignored", "extra fields ignored"]


def test_extra_fields_in_the_line_format_are_still_an_error():
    # LightRAG's current parser wants exactly 4 / 5 fields there; an extra one usually means a
    # delimiter inside a description, which no rule can undo.
    r = parse_extraction("entity<|#|>Pier<|#|>location<|#|>Stone<|#|>pier\n<|COMPLETE|>")
    assert r.entities == () and reasons(r) == ["wrong field count"]


# --- strengths -------------------------------------------------------------------------------

@pytest.mark.parametrize("strength", ["N/A", "n/a", "none", "unknown", "nan", "-"])
def test_placeholder_strength_is_weight_one(strength):
    r = both(f'("relationship"<|>"Tide"<|>"Harbour"<|>"floods it twice a day"<|>{strength})<|COMPLETE|>')
    assert [(x.keywords, x.weight) for x in r.relations] == [("", 1.0)]
    assert reasons(r) == ["default weight"]


def test_missing_strength_is_weight_one():
    # GraphRAG / mKG-RAG layout without its strength, and LightRAG legacy without its strength
    r = both('("relationship"<|>"Tide"<|>"Harbour"<|>"floods it")##\n'
             '("relationship"<|>"Moon"<|>"Tide"<|>"pulls it"<|>"gravity, cycle")<|COMPLETE|>')
    assert [(x.source, x.keywords, x.weight) for x in r.relations] == [("Tide", "", 1.0), ("Moon", "gravity, cycle", 1.0)]
    assert reasons(r) == ["default weight", "default weight"]


def test_text_strength_after_keywords_is_weight_one():
    r = both('("relationship"<|>"Moon"<|>"Tide"<|>"pulls it"<|>"gravity"<|>"strong")<|COMPLETE|>')
    assert [(x.keywords, x.weight) for x in r.relations] == [("gravity", 1.0)]
    assert reasons(r) == ["default weight"] and "strong" in r.issues[0].detail


def test_negative_strength_is_still_an_error():
    text = '("relationship"<|>"Moon"<|>"Tide"<|>"pulls it"<|>-3)<|COMPLETE|>'
    assert reasons(parse_extraction(text)) == ["invalid weight"]
    with pytest.raises(ExtractionFormatError, match="invalid weight"):
        parse_extraction(text, strict=True)


def test_json_text_weight_is_one_and_number_is_read():
    r = both('{"entities": [], "relationships": [{"source": "Moon", "target": "Tide", "description": "pulls",'
             ' "weight": "high"}, {"source": "Sun", "target": "Tide", "description": "pulls less", "weight": 3}]}')
    assert [x.weight for x in r.relations] == [1.0, 3.0] and reasons(r) == ["default weight"]


# --- dangling delimiter ----------------------------------------------------------------------

def test_dangling_delimiter_before_the_parenthesis():
    text = ('("entity"<|>"Ferry"<|>"vehicle"<|>"Crosses the bay hourly"<|>)##\n'
            '("relationship"<|>"Ferry"<|>"Pier"<|>"docks at the pier"<|>"docking"<|>7<|>)<|COMPLETE|>')
    r = both(text)
    assert [(e.name, e.description) for e in r.entities] == [("Ferry", "Crosses the bay hourly")]
    assert [(x.keywords, x.weight) for x in r.relations] == [("docking", 7.0)]
    assert reasons(r) == ["dangling delimiter", "dangling delimiter"]


def test_dangling_delimiter_at_the_end_of_a_line_record():
    r = both("entity<|#|>Ferry<|#|>vehicle<|#|>Crosses the bay<|#|>\n<|COMPLETE|>")
    assert [e.name for e in r.entities] == ["Ferry"] and reasons(r) == ["dangling delimiter"]


# --- reasoning models ------------------------------------------------------------------------

def test_think_block_is_not_parsed_and_its_marker_does_not_end_the_answer():
    text = ('<think>The user wants records. Draft:\n("entity"<|>"Draft Only"<|>"thing"<|>"not final")##\n'
            'Then I write <|COMPLETE|> at the end.</think>\n'
            '("entity"<|>"Ferry"<|>"vehicle"<|>"Crosses the bay")##\n'
            '("entity"<|>"Pier"<|>"location"<|>"Stone pier")<|COMPLETE|>')
    r = both(text)
    assert [e.name for e in r.entities] == ["Ferry", "Pier"] and r.complete
    assert reasons(r) == ["reasoning removed"] and r.issues[0].position == (1, 0)


def test_think_block_before_line_format_and_json():
    line = "<think>entity<|#|>Draft<|#|>x<|#|>y</think>\nentity<|#|>Ferry<|#|>vehicle<|#|>Crosses the bay\n<|COMPLETE|>"
    assert detect_dialect(line) == "lightrag"
    assert [e.name for e in both(line).entities] == ["Ferry"]
    js = '<think>{"entities": [{"name": "Draft"}]}</think>{"entities": [{"name": "Ferry", "type": "v", "description": "d"}]}'
    assert [e.name for e in both(js).entities] == ["Ferry"]


def test_orphan_closing_think_tag_drops_what_precedes_it():
    # some APIs strip the opening tag and send only the end of the reasoning
    text = 'so the answer lists the ferry.</think>("entity"<|>"Ferry"<|>"vehicle"<|>"Crosses")<|COMPLETE|>'
    r = both(text)
    assert [e.name for e in r.entities] == ["Ferry"] and reasons(r) == ["reasoning removed"]


def test_unclosed_think_is_reported_and_the_rest_read():
    r = parse_extraction('<think>("entity"<|>"Ferry"<|>"vehicle"<|>"Crosses")<|COMPLETE|>')
    assert [e.name for e in r.entities] == ["Ferry"] and reasons(r) == ["unclosed reasoning"]


def test_only_reasoning_is_no_records():
    r = parse_extraction("<think>Nothing to extract here.</think>")
    assert r.dialect is None and reasons(r, "error") == ["no records"]


# --- entity or relation: the tuple parser checks the target, like the line format ------------

def test_entity_with_numeric_last_field_and_undeclared_target_stays_an_entity():
    text = ('("entity"<|>"Publisher"<|>"organization"<|>"Prints the harbour guide"<|>5)##\n'
            '("entity"<|>"Harbour Guide"<|>"book"<|>"A guide"<|>"importance"<|>7)<|COMPLETE|>')
    r = both(text)
    assert [(e.name, e.type) for e in r.entities] == [("Publisher", "organization"), ("Harbour Guide", "book")]
    assert r.relations == () and reasons(r) == ["extra fields ignored", "extra fields ignored"]


def test_entity_shaped_relation_to_a_declared_entity_is_reclassified():
    text = ('("entity"<|>"Publisher"<|>"organization"<|>"Prints guides")##\n'
            '("entity"<|>"Harbour Guide"<|>"book"<|>"A guide")##\n'
            '("entity"<|>"Publisher"<|>"Harbour Guide"<|>"prints it"<|>6)<|COMPLETE|>')
    r = both(text)
    assert [e.name for e in r.entities] == ["Publisher", "Harbour Guide"]
    assert [(x.source, x.target, x.weight) for x in r.relations] == [("Publisher", "Harbour Guide", 6.0)]
    assert reasons(r) == ["reclassified entity as relation"]


# --- well-formed empty answers ---------------------------------------------------------------

@pytest.mark.parametrize("text", ["<|COMPLETE|>", "  \n<|COMPLETE|>\n", "```\n<|COMPLETE|>\n```",
                                  "<think>no entities in this chunk</think>\n<|COMPLETE|>"])
def test_completion_marker_alone_is_a_valid_empty_answer(text):
    r = parse_extraction(text, strict=True)
    assert r.complete and r.errors == () and r.entities == () and r.relations == ()


@pytest.mark.parametrize("dialect", ["lightrag", "tuple"])
def test_completion_marker_alone_in_a_forced_dialect(dialect):
    r = parse_extraction("<|COMPLETE|>", strict=True, dialect=dialect)
    assert r.complete and r.issues == () and r.dialect == dialect


@pytest.mark.parametrize("text", ['{"entities": [], "relationships": []}', '```json\n{"entities": []}\n```',
                                  '{"entities": [], "relations": []}'])
def test_empty_json_lists_are_a_valid_empty_answer(text):
    r = parse_extraction(text, strict=True)
    assert r.dialect == "lightrag_json" and r.complete and r.issues == ()


def test_prose_with_a_marker_is_still_no_records():
    r = parse_extraction("I found no entities.\n<|COMPLETE|>")
    assert reasons(r, "error") == ["no records"]
    with pytest.raises(ExtractionFormatError, match="no records"):
        parse_extraction("I found no entities.\n<|COMPLETE|>", strict=True)


# --- JSON key spellings ----------------------------------------------------------------------

def test_json_keys_of_lightrags_json_prompt():
    text = ('{"entities": [{"entity_name": "Ferry", "entity_type": "vehicle", "entity_description": "Crosses"}],'
            ' "relationships": [{"source_entity": "Ferry", "target_entity": "Pier", "relationship_description": "docks",'
            ' "relationship_keywords": "docking", "relationship_strength": 7}]}')
    r = both(text)
    assert [(e.name, e.type, e.description) for e in r.entities] == [("Ferry", "vehicle", "Crosses")]
    assert [(x.source, x.target, x.description, x.keywords, x.weight) for x in r.relations] == [
        ("Ferry", "Pier", "docks", "docking", 7.0)]


def test_json_keys_of_fast_graphrag():
    text = ('{"entities": [{"name": "FERRY", "type": "VEHICLE", "desc": "Crosses the bay"}],'
            ' "relationships": [{"source": "FERRY", "target": "PIER", "desc": "docks", "keywords": ["dock"]}],'
            ' "other_relationships": [{"source": "FERRY", "target": "BAY", "desc": "crosses", "keywords": []}]}')
    r = both(text)
    assert [(e.name, e.description) for e in r.entities] == [("FERRY", "Crosses the bay")]
    assert [(x.target, x.description, x.keywords, x.position[0]) for x in r.relations] == [
        ("PIER", "docks", "dock", 0), ("BAY", "crosses", "", 1)]


def test_json_entity_without_description_is_kept_with_a_warning():
    r = both('{"entities": [{"name": "Ferry", "type": "vehicle"}]}')
    assert [e.name for e in r.entities] == ["Ferry"] and reasons(r) == ["empty description"]


# --- mKG-RAG's record delimiter and region matching ------------------------------------------

def test_record_delimiter_of_mkg_rag():
    text = ('("entity"<|>"FERRY"<|>"vehicle"<|>"Crosses the bay")<|RECORD|>("entity"<|>"PIER"<|>"place"<|>"Stone")'
            '<|RECORD|>("relationship"<|>"FERRY"<|>"PIER"<|>"docks at"<|>7)<|COMPLETE|>')
    r = both(text)
    assert [e.name for e in r.entities] == ["FERRY", "PIER"]
    assert [(x.source, x.target, x.weight) for x in r.relations] == [("FERRY", "PIER", 7.0)]


def test_matching_records_are_read_like_mapping_records():
    text = ('("matching"|<image>|FERRY|8)##\n("matching"<|>"<object_2>"<|>"PIER"<|>9)##\n'
            '("matching"|<relation-1>|FERRY|PIER|7)<|COMPLETE|>')
    r = parse_region_mappings(text, strict=True)
    assert [(m.kind, m.ref, m.entity, m.source, m.target, m.score) for m in r.mappings] == [
        ("image", None, "FERRY", None, None, 8.0), ("object", 2, "PIER", None, None, 9.0),
        ("relation", 1, None, "FERRY", "PIER", 7.0)]
    assert r.issues == () and detect_dialect(text) == "tuple"


def test_figure_style_output_records_separated_by_spaces_without_marker():
    # As in the paper's figure: one line, records separated by spaces, no "##", no marker.
    text = ('("matching"|<image>|FERRY|8) ("matching"|<object-1>|FERRY|9) ("matching"|<object-2>|PIER|6) '
            '("matching"|<relation-1>|FERRY|PIER|7)')
    r = parse_region_mappings(text, strict=True)
    assert [(m.kind, m.ref) for m in r.mappings] == [("image", None), ("object", 1), ("object", 2), ("relation", 1)]
    assert reasons(r) == ["no completion marker"] and r.issues[0].severity == "warning" and not r.complete


def test_cut_off_mappings_without_marker_are_an_error():
    text = '("matching"|<image>|FERRY|8) ("matching"|<object-1>|FER'
    r = parse_region_mappings(text)
    assert [m.kind for m in r.mappings] == ["image"]
    assert reasons(r, "error") == ["unclosed record", "no completion marker"]
    with pytest.raises(ExtractionFormatError):
        parse_region_mappings(text, strict=True)


def test_parentheses_inside_a_description_do_not_split_records():
    text = '("entity"<|>"Ferry"<|>"vehicle"<|>"Crosses (twice) (daily) the bay") ("entity"<|>"Pier"<|>"place"<|>"Stone")'
    r = both(text + "<|COMPLETE|>")
    assert [(e.name, e.description) for e in r.entities] == [("Ferry", "Crosses (twice) (daily) the bay"), ("Pier", "Stone")]


def test_bare_region_references_are_accepted():
    r = parse_region_mappings('("mapping"|image|FERRY|8)##("mapping"|object_4|PIER|9)<|COMPLETE|>', strict=True)
    assert [(m.kind, m.ref) for m in r.mappings] == [("image", None), ("object", 4)]


# --- line format: records joined on one line -------------------------------------------------

def test_line_records_joined_by_the_delimiter_are_cut_apart():
    text = ("entity<|#|>Ferry<|#|>vehicle<|#|>Crosses<|#|>entity<|#|>Pier<|#|>place<|#|>Stone"
            "<|#|>relation<|#|>Ferry<|#|>Pier<|#|>docking<|#|>Docks at the pier\n<|COMPLETE|>")
    r = both(text)
    assert [e.name for e in r.entities] == ["Ferry", "Pier"] and [x.target for x in r.relations] == ["Pier"]
    assert reasons(r) == ["records joined on one line"]


def test_entity_typed_relation_is_not_cut():
    r = both("entity<|#|>Kinship<|#|>relation<|#|>A family tie\n<|COMPLETE|>")
    assert [(e.name, e.type) for e in r.entities] == [("Kinship", "relation")] and r.issues == ()
