"""Context-efficiency helpers of benchmarks/pipeline_quality.py (no shared data needed)."""
from __future__ import annotations

import importlib.util
import pathlib
from types import SimpleNamespace

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pq():
    spec = importlib.util.spec_from_file_location("pipeline_quality_ctx", ROOT / "benchmarks" / "pipeline_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def q(answer, fmt):
    return SimpleNamespace(answer=answer, answer_format=fmt)


def test_short_answers_are_normalised_and_single_digits_left_out(pq):
    assert pq.short_answer(q("18.29%", "Float")) == ["18.29"]
    assert pq.short_answer(q("$1,234.0", "Float")) == ["1234"]
    assert pq.short_answer(q("Poor Financial Condition", "Str")) == ["poor", "financial", "condition"]
    assert pq.short_answer(q("8", "Int")) is None                     # a single digit measures nothing
    assert pq.short_answer(q("12", "Int")) == ["12"]
    assert pq.short_answer(q("['White', '10%']", "List")) is None
    assert pq.short_answer(q("Not answerable", "None")) is None
    assert pq.short_answer(q("one two three four five six", "Str")) is None


def test_answer_within_counts_the_budget_in_context_tokens(pq):
    ctx = "Question: x\n" + " ".join(f"w{i}" for i in range(100)) + ' {"content": "revenue of 1,234 dollars"}'
    ans = pq.short_answer(q("1234", "Int"))
    assert pq.answer_within(ctx, ans, 200)
    assert not pq.answer_within(ctx, ans, 100)  # 3 tokens of "Question: x" + 100 words: the answer lies after
    assert not pq.answer_within("revenue of 123 dollars", ans, 100)
    assert pq.answer_within("Poor  financial, condition.", ["poor", "financial", "condition"], 10)
