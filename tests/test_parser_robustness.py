"""Parsers under hostile input (issue 12): linear time, and no exception but ExtractionFormatError.

The timing reproducers run together in one subprocess (one interpreter start) under a generous
timeout, so a regression back to super-linear matching fails here instead of hanging the suite;
each test then checks that its own case finished. Speed targets are in
benchmarks/results/reliability_parsers.md, not here: the bound below is a hang detector.
"""
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from colgraph_engine.kg import ExtractionFormatError, detect_dialect, parse_extraction, parse_region_mappings, \
    parse_scene_graph
from colgraph_engine.kg.parsers import DIALECTS
from colgraph_engine.kg.parsers import _LIGHTRAG_LINE, _SCENE_LINE, _TUPLE_RECORD
from colgraph_engine.kg.parsers._common import _DELIM
from colgraph_engine.kg.parsers.scene import _split_object, _split_relation
from colgraph_engine.kg.records import QUOTES, clean_field

MB = 1_000_000
HANG_S = 20.0  # per case; each takes well under a second on a laptop core

# name -> statement; every input is about 1 MB.
TIMED = {
    "scene_object_spaces": "parse_scene_graph('<object-1>: ' + ' ' * MB + 'x')",
    "scene_object_spaces_box": "parse_scene_graph('<object-1>: ' + ' ' * MB + ', (0, 0, 1, 1)')",
    "scene_relation_spaces": "parse_scene_graph('<relation-1>: <object-1> ' + ' ' * MB + 'x')",
    "blank_lines_detect": "detect_dialect('\\n' * MB)",
    "blank_lines_parse": "parse_extraction('\\n' * MB)",
    "entity_lt_spaces": "parse_extraction('entity<' + ' ' * MB)",
    "entity_lt_spaces_lightrag": "parse_extraction('entity<' + ' ' * MB, dialect='lightrag')",
    "clean_field_quote_space": "clean_field('\" ' * (MB // 2))",
    "scene_object_bullets": "parse_scene_graph('- <object-1>: (' * (MB // 16))",
    "scene_relation_lts": "parse_scene_graph('<relation-1>: <object-1> ' + ' <' * (MB // 2))",
    "delims_of_all_shapes": "parse_extraction('<<||##||>> <| # |> ' * (MB // 20))",
    "json_dense_malformed": "parse_extraction('{\"entities\": [' + ','.join(['1'] * (MB // 2)) + ']}')",
}


@pytest.fixture(scope="module")
def timed_runs():
    """Runs every TIMED case in one subprocess; returns {name: seconds} for those that finished."""
    lines = [
        "import time",
        "from colgraph_engine.kg.parsers import detect_dialect, parse_extraction, parse_scene_graph",
        "from colgraph_engine.kg.records import clean_field",
        f"MB = {MB}",
    ]
    for name, statement in TIMED.items():
        lines += ["t = time.perf_counter()", statement, f"print({name!r}, time.perf_counter() - t, flush=True)"]
    proc = subprocess.Popen([sys.executable, "-c", "\n".join(lines)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    try:
        out, err = proc.communicate(timeout=HANG_S * 2 + 10)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    done = {}
    for line in out.splitlines():
        name, seconds = line.split()
        done[name] = float(seconds)
    done["_stderr"] = err[-2000:]
    return done


@pytest.mark.parametrize("name", list(TIMED))
def test_one_mb_input_finishes(timed_runs, name):
    assert name in timed_runs, f"{TIMED[name]} did not finish (a super-linear pattern?): {timed_runs['_stderr']}"
    assert timed_runs[name] < HANG_S, f"{TIMED[name]} took {timed_runs[name]:.1f} s"


# --- same results as the patterns they replace, on short inputs where those are fast ----------

OLD_DELIM = re.compile(
    r"<{1,2}\s*\|{0,2}\s*#{1,2}\s*\|{0,2}\s*>{1,2}|<{1,2}\s*\|{1,2}\s*>{1,2}|<\|#\||\|#\|>")
OLD_LIGHTRAG_LINE = re.compile(
    r"^\s*(?:[-*]\s+)?[\"']?(?:entity|relation|relationship)[\"']?\s*(?:" + OLD_DELIM.pattern + ")",
    re.IGNORECASE | re.MULTILINE)
OLD_SCENE_LINE = re.compile(r"^\s*(?:[-*]\s+)?<\s*(?:object|relation)[-_ ]?\d+\s*>\s*:", re.IGNORECASE | re.MULTILINE)
OLD_TUPLE_RECORD = re.compile(
    r"\(\s*[\"']?(?:entity|relationship|relation|content_keywords|mapping)[\"']?\s*(?:"
    + OLD_DELIM.pattern + r"|\|)", re.IGNORECASE)
OLD_OBJ = r"<\s*object[-_ ]?(\d+)\s*>"
OLD_SCENE_OBJECT = re.compile(
    r"^<\s*object[-_ ]?(\d+)\s*>\s*:\s*(.*?)\s*,?\s*[(\[]([^()\[\]]*)[)\]]\s*\.?$", re.IGNORECASE)
OLD_SCENE_RELATION = re.compile(
    r"^<\s*relation[-_ ]?(\d+)\s*>\s*:\s*" + OLD_OBJ + r"\s+(.+?)\s+" + OLD_OBJ + r"\s*\.?$", re.IGNORECASE)

PIECES = ["<", ">", "|", "#", "<|#|>", "<|>", "<<|#|>>", "(", ")", "[", "]", ":", ",", ".", " ", "  ", "\t", "\n",
          "\r", "\x0b", "\u3000", "\u2028", "\xa0", '"', "'", "`", "\u201c", "\u2019", "-", "*", "- ", "0.5", "1",
          "12", "\u0661", "entity", "Relation", "relationship", "mapping", "<object-1>", "<OBJECT_2>", "<object 3>",
          "<relation-1>", "car", "x y", "<|COMPLETE|>", "##"]


def _random_strings(seed, count, heads=("",), tails=("",)):
    rng = random.Random(seed)
    for _ in range(count):
        yield rng.choice(heads) + "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 14))) + rng.choice(tails)


def _old_clean_field(text):
    previous = None
    while previous != text:
        previous = text
        text = text.strip().strip(QUOTES)
    return text


def test_clean_field_equals_the_repeated_strip():
    for s in _random_strings(1, 3000):
        assert clean_field(s) == _old_clean_field(s), s
    every_space = "".join(c for c in map(chr, range(sys.maxunicode + 1)) if c.isspace())
    assert clean_field(every_space + '"x"' + every_space) == "x"


def test_delimiter_and_detection_patterns_equal_the_old_ones():
    for s in _random_strings(2, 4000):
        assert _DELIM.split(s) == OLD_DELIM.split(s), s
        assert [m.span() for m in _DELIM.finditer(s)] == [m.span() for m in OLD_DELIM.finditer(s)], s
        assert len(_LIGHTRAG_LINE.findall(s)) == len(OLD_LIGHTRAG_LINE.findall(s)), s
        assert len(_SCENE_LINE.findall(s)) == len(OLD_SCENE_LINE.findall(s)), s
        assert len(_TUPLE_RECORD.findall(s)) == len(OLD_TUPLE_RECORD.findall(s)), s


def test_scene_line_splitting_equals_the_old_patterns():
    heads = ("<object-1>: ", "<object_12>:", "< Object 3 > :", "<relation-1>: <object-1> ", "<relation_2>:<object_3>")
    tails = ("", " <object-2>", "  <OBJECT_3> .", "(0, 0, 1, 1)", " , [0.1, 0.2, 0.3, 0.4] .", "(1, 2)]")
    checked = objects = 0
    for s in _random_strings(3, 8000, heads, tails):
        s = _strip_like_the_parser(s)
        if not s:
            continue
        old = OLD_SCENE_OBJECT.match(s)
        assert _split_object(s) == (old and old.groups()), s
        objects += old is not None
        old = OLD_SCENE_RELATION.match(s)
        new = _split_relation(s)
        assert (new is None) == (old is None), s
        if old is not None:
            assert new == (old.group(1), old.group(2), " ".join(old.group(3).split()), old.group(4)), s
            checked += 1
    assert checked > 300 and objects > 300


def _strip_like_the_parser(s):
    # the parser hands each line stripped, without a leading bullet, and never with a line break
    lines = s.splitlines()
    return re.sub(r"^\s*(?:[-*]\s+)?", "", lines[0].strip(), count=1) if lines else ""


# --- lenient mode raises nothing, strict mode only ExtractionFormatError -----------------------

BIG = "1" * 4301  # one digit past Python's int() limit


def test_huge_index_in_mapping_is_an_issue_not_an_exception():
    text = f'("mapping"|<object-{BIG}>|MOUNT FUJI|8)##("mapping"|<object-1>|TOKYO|9)<|COMPLETE|>'
    r = parse_region_mappings(text)
    assert [(m.ref, m.entity) for m in r.mappings] == [(1, "TOKYO")]
    assert [(i.reason, i.severity) for i in r.issues] == [("index too large", "error")] and r.skipped == 1
    with pytest.raises(ExtractionFormatError, match="index too large"):
        parse_region_mappings(text, strict=True)
    relation = f'("mapping"<|>"<relation_{BIG}>"<|>"A"<|>"B"<|>7)<|COMPLETE|>'
    assert [i.reason for i in parse_extraction(relation).errors] == ["index too large"]


@pytest.mark.parametrize("text", [
    f"<object-{BIG}>: car, (0, 0, 1, 1)",
    f"<object-1>: car, (0, 0, 1, 1)\n<relation-{BIG}>: <object-1> near <object-1>",
    f"<object-1>: car, (0, 0, 1, 1)\n<relation-1>: <object-{BIG}> near <object-1>",
    f"<object-1>: car, (0, 0, 1, 1)\n<relation-1>: <object-1> near <object-{BIG}>",
])
def test_huge_index_in_scene_graph_is_an_issue_not_an_exception(text):
    r = parse_scene_graph(text)
    assert [i.reason for i in r.errors] == ["index too large"] and r.skipped == 1
    with pytest.raises(ExtractionFormatError, match="index too large"):
        parse_scene_graph(text, strict=True)


def test_largest_index_python_converts_is_still_read():
    r = parse_scene_graph(f"<object-{'7' * 4300}>: car, (0, 0, 1, 1)")
    assert r.issues == () and r.objects[0].index == int("7" * 4300)


def test_deeply_nested_json_is_invalid_json_not_recursion_error():
    text = '{"entities": ' + "[" * 100_000 + "]" * 100_000 + "}"
    r = parse_extraction(text)
    assert r.dialect == "lightrag_json" and not r.complete
    assert [(i.reason, i.detail) for i in r.errors] == [("invalid JSON", "nested too deeply")]
    with pytest.raises(ExtractionFormatError, match="invalid JSON"):
        parse_extraction(text, strict=True)


def test_huge_json_integer_is_judged_by_the_record_checks():
    huge = "9" * 5000
    text = ('{"entities": [{"name": "A", "type": "t", "description": "d", "rank": ' + huge + '}], '
            '"relationships": [{"source": "A", "target": "B", "description": "d", "weight": ' + huge + '}, '
            '{"source": "A", "target": "C", "description": "d", "weight": 3}]}')
    r = parse_extraction(text)
    assert [e.name for e in r.entities] == ["A"]  # an unused huge field does not sink the record
    assert [(x.target, x.weight) for x in r.relations] == [("C", 3.0)]
    assert [i.reason for i in r.errors] == ["invalid weight"]
    with pytest.raises(ExtractionFormatError, match="invalid weight"):
        parse_extraction(text, strict=True)


def test_json_integers_below_the_limit_are_unchanged():
    text = '{"entities": [], "relationships": [{"source": "A", "target": "B", "description": "d", "weight": 12}]}'
    assert parse_extraction(text).relations[0].weight == 12.0


def test_fuzz_lenient_never_raises_strict_raises_only_format_errors():
    rng = random.Random(4)
    deep = ["[" * 5000, "{" * 3000, '{"a":' * 3000, BIG, "-" + BIG, "1e999"]
    for _ in range(400):
        text = "".join(rng.choice(PIECES + deep[:1] if rng.random() < 0.02 else PIECES) for _ in range(rng.randint(0, 60)))
        if rng.random() < 0.3:
            text = '{"entities": [{"name": ' + text + "}]}"
        if rng.random() < 0.1:
            text += rng.choice(deep)
        calls = [lambda s: parse_extraction(text, strict=s), lambda s: parse_scene_graph(text, strict=s),
                 lambda s: parse_region_mappings(text, strict=s)]
        calls += [lambda s, d=d: parse_extraction(text, strict=s, dialect=d) for d in DIALECTS]
        detect_dialect(text)
        clean_field(text)
        for call in calls:
            call(False)
            try:
                call(True)
            except ExtractionFormatError:
                pass


def test_timing_cases_are_the_issue_reproducers():
    # Keep the scaled-up inputs honest: each issue reproducer, at its own size, is covered above.
    assert parse_scene_graph("<object-1>: " + " " * 400 + "x").errors[0].reason == "malformed object"
    assert detect_dialect("\n" * 16_000) is None
    assert parse_extraction("entity<" + " " * 65_536).dialect is None
    assert clean_field("\" " * 1000 + "x" + " \"" * 1000) == "x"


def test_issues_past_the_listing_cap_are_counted_in_one_summary():
    from colgraph_engine.kg.parsers._common import MAX_LISTED_ISSUES
    from colgraph_engine.kg.records import ExtractionFormatError

    n = MAX_LISTED_ISSUES + 2_345
    text = '{"entities": [' + ",".join(["1"] * n) + "]}"
    r = parse_extraction(text)
    assert r.skipped == n and len(r.issues) == MAX_LISTED_ISSUES + 1
    assert all(i.reason == "wrong JSON shape" for i in r.issues[:-1])
    last = r.issues[-1]
    assert (last.reason, last.severity) == ("more issues", "error") and "2345 more not listed" in last.detail
    with pytest.raises(ExtractionFormatError):
        parse_extraction(text, strict=True)
    few = parse_extraction('{"entities": [1, 2]}')  # below the cap nothing changes
    assert [i.reason for i in few.issues] == ["wrong JSON shape"] * 2
