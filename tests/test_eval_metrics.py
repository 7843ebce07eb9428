"""Retrieval and answer metrics against values worked out by hand (arithmetic in the comments).

log2(3) = 1.5849625007, used throughout: 1/log2(3) = 0.6309297536, 3/log2(3) = 1.8927892607,
7/log2(3) = 4.4165082750; log2(2) = 1 and log2(4) = 2.
"""
import math

import numpy as np
import pytest

from colgraph_engine.eval import (
    evaluate_rankings,
    exact_match,
    f1_score,
    hit_at_k,
    mrr_at_k,
    ndcg_at_k,
    normalize_answer,
    recall_at_k,
)

# ------------------------------------------------------------------------------------------------
# hit / recall / MRR


@pytest.mark.parametrize("k,expected", [(1, 0.0), (2, 0.0), (3, 1.0), (4, 1.0), (50, 1.0)])
def test_hit_at_k(k, expected):
    # the only relevant id sits at rank 3
    assert hit_at_k(["d1", "d2", "d3", "d4"], {"d3"}, k) == expected


@pytest.mark.parametrize("k,expected", [
    (1, 0 / 3),   # top-1 = [a]: no relevant
    (2, 1 / 3),   # [a, b]: b
    (3, 1 / 3),   # [a, b, c]: b
    (4, 2 / 3),   # [a, b, c, d]: b, d
    (10, 2 / 3),  # k > len(ranked): the whole list; x is never retrieved, so recall stays 2/3
])
def test_recall_at_k(k, expected):
    assert recall_at_k(["a", "b", "c", "d", "e"], {"b", "d", "x"}, k) == pytest.approx(expected)


@pytest.mark.parametrize("relevant,k,expected", [
    ({"b", "c"}, 1, 0.0),    # rank 1 is a: nothing within k
    ({"b", "c"}, 2, 1 / 2),  # first relevant is b at rank 2
    ({"b", "c"}, 3, 1 / 2),  # still b at rank 2, c at rank 3 does not count
    ({"c"}, 2, 0.0),         # c is at rank 3, outside k
    ({"c"}, 3, 1 / 3),
    ({"c"}, 99, 1 / 3),      # k > len(ranked)
    ({"z"}, 3, 0.0),         # relevant id never retrieved
])
def test_mrr_at_k(relevant, k, expected):
    assert mrr_at_k(["a", "b", "c"], relevant, k) == pytest.approx(expected)


def test_no_relevant_in_top_k_scores_zero_everywhere():
    ranked, relevant = ["a", "b", "c", "d"], {"d"}
    assert hit_at_k(ranked, relevant, 3) == 0.0
    assert recall_at_k(ranked, relevant, 3) == 0.0
    assert mrr_at_k(ranked, relevant, 3) == 0.0
    assert ndcg_at_k(ranked, {"d": 1}, 3) == 0.0


def test_empty_ranking_scores_zero():
    assert hit_at_k([], {"a"}, 5) == 0.0
    assert recall_at_k([], {"a"}, 5) == 0.0
    assert mrr_at_k([], {"a"}, 5) == 0.0
    assert ndcg_at_k([], {"a": 2}, 5) == 0.0


def test_hit_and_mrr_with_empty_relevant_are_zero():
    # Documented: well defined (no id can be relevant), unlike recall which is 0/0.
    assert hit_at_k(["a"], set(), 1) == 0.0
    assert mrr_at_k(["a"], [], 1) == 0.0


def test_ranked_accepts_tuple_and_1d_array_and_relevant_any_collection():
    assert recall_at_k(("a", "b"), ["b", "c"], 2) == pytest.approx(1 / 2)
    assert mrr_at_k(np.array([7, 3, 5]), frozenset({5}), 3) == pytest.approx(1 / 3)
    assert hit_at_k(["a", "b"], {"b": 1}.keys(), 1) == 0.0


# ------------------------------------------------------------------------------------------------
# nDCG


def test_ndcg_hand_computed_k3_exponential():
    # gains {a:3, b:2, c:0}, ranking [c, a, b], k = 3, gain = 2^g - 1
    # DCG  = (2^0-1)/log2(2) + (2^3-1)/log2(3) + (2^2-1)/log2(4) = 0 + 4.4165082750 + 1.5 = 5.9165082750
    # IDCG = ideal [a, b, c]: 7/1 + 3/log2(3) + 0 = 7 + 1.8927892607 = 8.8927892607
    # nDCG = 5.9165082750 / 8.8927892607 = 0.6653152460
    assert ndcg_at_k(["c", "a", "b"], {"a": 3, "b": 2, "c": 0}, 3, gain="exponential") == pytest.approx(0.6653152460)


@pytest.mark.parametrize("gains", [{"a": 3, "b": 2, "c": 0}, {"c": 0, "b": 2, "a": 3}], ids=["desc", "asc"])
def test_ndcg_hand_computed_k2_uses_ideal_cut_at_k_exponential(gains):
    # same gains and ranking, k = 2, exponential: DCG = 0 + 7/log2(3) = 4.4165082750
    # IDCG@2 = 7 + 3/log2(3) = 8.8927892607 (the two best grades, whatever the mapping's order)
    # nDCG = 4.4165082750 / 8.8927892607 = 0.4966392597
    assert ndcg_at_k(["c", "a", "b"], gains, 2, gain="exponential") == pytest.approx(0.4966392597)


def test_ndcg_k1_zero_grade_at_top():
    # top-1 is c (grade 0): DCG = 2^0 - 1 = 0
    assert ndcg_at_k(["c", "a", "b"], {"a": 3, "b": 2, "c": 0}, 1) == 0.0


def test_ndcg_ideal_ranking_is_one():
    assert ndcg_at_k(["a", "b", "c"], {"a": 3, "b": 2, "c": 0}, 3) == pytest.approx(1.0)


def test_ndcg_unjudged_ids_count_as_grade_zero():
    # [z, a], gains {a:1}: DCG = 0/1 + (2^1-1)/log2(3) = 0.6309297536; IDCG@2 = 1/1 = 1
    assert ndcg_at_k(["z", "a"], {"a": 1}, 2) == pytest.approx(0.6309297536)


def test_ndcg_k_larger_than_ranking_keeps_full_ideal_exponential():
    # ranked [b] only, k = 5, exponential: DCG = (2^2-1)/1 = 3
    # IDCG@5 uses every judged grade: 7/1 + 3/log2(3) = 8.8927892607 -> 3 / 8.8927892607 = 0.3373519727
    assert ndcg_at_k(["b"], {"a": 3, "b": 2}, 5, gain="exponential") == pytest.approx(0.3373519727)


def test_ndcg_fractional_grade():
    # gains {a: 0.5}, ranking [a]: DCG = IDCG = 2^0.5 - 1 -> 1.0; ranking [x, a]: (2^0.5-1)/log2(3) / (2^0.5-1)
    assert ndcg_at_k(["a"], {"a": 0.5}, 1) == pytest.approx(1.0)
    assert ndcg_at_k(["x", "a"], {"a": 0.5}, 2) == pytest.approx(0.6309297536)


# Linear gain (the default): trec_eval's ndcg_cut, as pytrec_eval, BEIR and ViDoRe report it.
# 2/log2(3) = 1.2618595071, 3/log2(3) = 1.8927892607. The values below also equal pytrec_eval's
# ndcg_cut for the same qrels and run (checked once by hand; pytrec_eval is not a dependency).


def test_ndcg_default_is_linear_gain_hand_computed():
    # gains {a:3, b:2, c:0}, ranking [c, a, b], gain = g
    # k = 3: DCG  = 0/1 + 3/log2(3) + 2/log2(4) = 1.8927892607 + 1 = 2.8927892607
    #        IDCG = 3/1 + 2/log2(3) + 0 = 4.2618595071 -> nDCG = 0.6787622295
    # k = 2: DCG  = 1.8927892607, IDCG@2 = 4.2618595071 -> 0.4441228664
    # k = 1: DCG  = 0 -> 0
    gains = {"a": 3, "b": 2, "c": 0}
    assert ndcg_at_k(["c", "a", "b"], gains, 3) == pytest.approx(0.6787622295)
    assert ndcg_at_k(["c", "a", "b"], gains, 3, gain="linear") == pytest.approx(0.6787622295)
    assert ndcg_at_k(["c", "a", "b"], gains, 2) == pytest.approx(0.4441228664)
    assert ndcg_at_k(["c", "a", "b"], gains, 1) == 0.0


def test_ndcg_linear_k_larger_than_ranking_keeps_full_ideal():
    # ranked [b], k = 5: DCG = 2/1 = 2; IDCG@5 = 3 + 2/log2(3) = 4.2618595071 -> 0.4692787260
    assert ndcg_at_k(["b"], {"a": 3, "b": 2}, 5) == pytest.approx(0.4692787260)


def test_ndcg_linear_and_exponential_differ_only_for_grades_above_one():
    # the same ranking: linear 0.6787622295 vs exponential 0.6653152460 (hand computed above)
    gains = {"a": 3, "b": 2, "c": 0}
    assert ndcg_at_k(["c", "a", "b"], gains, 3, gain="linear") != pytest.approx(
        ndcg_at_k(["c", "a", "b"], gains, 3, gain="exponential"))
    # grades 0/1: 2^1 - 1 = 1 and 2^0 - 1 = 0, so both conventions agree
    binary = {"a": 1, "b": 0, "c": 1}
    for k in (1, 2, 3):
        assert ndcg_at_k(["b", "a", "c"], binary, k, gain="linear") == ndcg_at_k(
            ["b", "a", "c"], binary, k, gain="exponential")


@pytest.mark.parametrize("gain,exc", [("log", ValueError), ("Linear", ValueError), (None, TypeError),
                                      (2, TypeError)])
def test_ndcg_bad_gain_convention(gain, exc):
    with pytest.raises(exc, match="^gain must be one of"):
        ndcg_at_k(["a"], {"a": 1}, 1, gain=gain)
    with pytest.raises(exc, match="^gain must be one of"):
        evaluate_rankings({"q": ["a"]}, {"q": {"a": 1}}, ks=(1,), gain=gain)


# ------------------------------------------------------------------------------------------------
# evaluate_rankings

QRELS = {
    "q1": {"a": 1, "b": 0},   # relevant {a}
    "q2": {"c": 2, "d": 1},   # relevant {c, d}
    "q3": {"e": 0},           # no relevant doc -> skipped
    "q4": {"f": 1},           # absent from RANKINGS -> empty ranking, all zeros
}
RANKINGS = {
    "q1": ["b", "a", "c"],
    "q2": ["d", "x", "c"],
    "q3": ["e"],
    "q9": ["a"],              # not in QRELS: ignored
}


def test_evaluate_rankings_averages_and_skips():
    got = evaluate_rankings(RANKINGS, QRELS, ks=(1, 3), gain="exponential")
    # per query (q1, q2, q4), k = 1 and k = 3 (nDCG with gain 2^g - 1):
    #   q1 [b, a, c], rel {a}:    hit 0, 1   recall 0, 1     rr 0, 1/2
    #     ndcg@1: DCG 0 -> 0;  ndcg@3: (2^1-1)/log2(3) / 1 = 0.6309297536
    #   q2 [d, x, c], rel {c, d}: hit 1, 1   recall 1/2, 1   rr 1, 1
    #     ndcg@1: (2^1-1) / (2^2-1) = 1/3
    #     ndcg@3: DCG = 1/1 + 0 + 3/log2(4) = 2.5; IDCG = 3/1 + 1/log2(3) = 3.6309297536 -> 0.6885288809
    #   q4 [], rel {f}:           all 0
    third = 1 / 3
    expected = {
        "hit@1": (0 + 1 + 0) * third, "hit@3": (1 + 1 + 0) * third,
        "recall@1": (0 + 0.5 + 0) * third, "recall@3": (1 + 1 + 0) * third,
        "mrr@1": (0 + 1 + 0) * third, "mrr@3": (0.5 + 1 + 0) * third,
        "ndcg@1": (0 + third + 0) * third,                        # 1/9
        "ndcg@3": (0.6309297536 + 0.6885288809 + 0) * third,      # 0.4398195448
    }
    assert set(got) == set(expected) | {"n_queries", "n_skipped"}
    for key, value in expected.items():
        assert got[key] == pytest.approx(value), key
    assert got["ndcg@3"] == pytest.approx(0.4398195448)
    assert got["n_queries"] == 3
    assert got["n_skipped"] == 1


def test_evaluate_rankings_linear_gain_by_default():
    got = evaluate_rankings(RANKINGS, QRELS, ks=(1, 3))
    # as in the exponential test above, but q2's grades {c:2, d:1} enter as 2 and 1:
    #   q2 [d, x, c]: ndcg@1 = 1 / 2;  ndcg@3: DCG = 1/1 + 0 + 2/log2(4) = 2,
    #                 IDCG = 2/1 + 1/log2(3) = 2.6309297536 -> 0.7601875335
    #   q1 (grade 1 only) and q4 (empty) as before: 0 and 0.6309297536; 0 and 0
    assert got["ndcg@1"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert got["ndcg@3"] == pytest.approx((0.6309297536 + 0.7601875335 + 0) / 3)
    assert got == evaluate_rankings(RANKINGS, QRELS, ks=(1, 3), gain="linear")
    # the binary metrics do not depend on the gain convention
    expo = evaluate_rankings(RANKINGS, QRELS, ks=(1, 3), gain="exponential")
    assert {k: v for k, v in got.items() if not k.startswith("ndcg")} == {
        k: v for k, v in expo.items() if not k.startswith("ndcg")}


def test_evaluate_rankings_agrees_with_single_query_functions():
    got = evaluate_rankings({"q": ["x", "b", "a"]}, {"q": {"a": 2, "b": 1, "c": 1}}, ks=(2,), gain="exponential")
    assert got["hit@2"] == hit_at_k(["x", "b", "a"], {"a", "b", "c"}, 2) == 1.0
    assert got["recall@2"] == pytest.approx(recall_at_k(["x", "b", "a"], {"a", "b", "c"}, 2)) == pytest.approx(1 / 3)
    assert got["mrr@2"] == pytest.approx(mrr_at_k(["x", "b", "a"], {"a", "b", "c"}, 2)) == pytest.approx(1 / 2)
    # DCG@2 = 0 + 1/log2(3) = 0.6309297536; IDCG@2 = 3/1 + 1/log2(3) = 3.6309297536 -> 0.1737665
    assert got["ndcg@2"] == pytest.approx(ndcg_at_k(["x", "b", "a"], {"a": 2, "b": 1, "c": 1}, 2, gain="exponential"))
    assert got["ndcg@2"] == pytest.approx(0.6309297536 / 3.6309297536)


def test_evaluate_rankings_default_ks_keys():
    got = evaluate_rankings({"q": ["a"]}, {"q": {"a": 1}})
    assert set(got) == {f"{m}@{k}" for m in ("hit", "recall", "mrr", "ndcg") for k in (1, 5, 10)} | {
        "n_queries", "n_skipped"}
    assert got["mrr@10"] == 1.0 and got["ndcg@5"] == pytest.approx(1.0)
    assert (got["n_queries"], got["n_skipped"]) == (1, 0)


def test_evaluate_rankings_missing_query_lowers_the_mean():
    # q2 is judged but not ranked: it counts as 0, so hit@1 = (1 + 0) / 2
    got = evaluate_rankings({"q1": ["a"]}, {"q1": {"a": 1}, "q2": {"b": 1}}, ks=(1,))
    assert got["hit@1"] == pytest.approx(0.5)
    assert got["n_queries"] == 2


def test_evaluate_rankings_all_skipped_raises():
    with pytest.raises(ValueError, match="qrels"):
        evaluate_rankings({"q": ["a"]}, {"q": {"a": 0}, "r": {}})


# ------------------------------------------------------------------------------------------------
# Answer metrics


@pytest.mark.parametrize("raw,expected", [
    ("The  Quick, brown FOX!", "quick brown fox"),
    ("An apple a day", "apple day"),
    ("theater", "theater"),              # articles only as whole words
    ("A.B.C.", "abc"),                   # punctuation goes before articles: no standalone "a" is left
    ("the-end", "theend"),
    ("  \tParis\n ", "paris"),
    ("", ""),
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_exact_match():
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("Eiffel", "Eiffel Tower") == 0.0
    assert exact_match("NYC", ["New York City", "nyc."]) == 1.0   # any gold suffices
    assert exact_match("New York", ["New York City", "NYC"]) == 0.0
    assert exact_match("the", "a") == 1.0                          # both normalise to ""


def test_f1_partial_overlap():
    # pred -> [quick, brown, fox], gold -> [quick, fox, jumps]; overlap 2
    # P = 2/3, R = 2/3, F1 = 2 * (2/3)(2/3) / (4/3) = 2/3
    assert f1_score("The quick brown fox", "a quick fox jumps") == pytest.approx(2 / 3)


def test_f1_counts_repeated_tokens_once_per_gold_occurrence():
    # pred [yes, yes, yes], gold [yes, no]: overlap = min(3, 1) = 1
    # P = 1/3, R = 1/2, F1 = 2 * (1/6) / (5/6) = 0.4   (a set-based overlap would give 2/3)
    assert f1_score("yes yes yes", "yes no") == pytest.approx(0.4)


def test_f1_max_over_golds():
    # gold 1 "obama": overlap 1, P = 1/2, R = 1 -> F1 = 2/3
    # gold 2 "president barack obama": overlap 2, P = 1, R = 2/3 -> F1 = 0.8; max = 0.8
    assert f1_score("Barack Obama", ["obama", "President Barack Obama"]) == pytest.approx(0.8)
    assert f1_score("Barack Obama", ["obama"]) == pytest.approx(2 / 3)


def test_f1_edge_cases():
    assert f1_score("London", "Paris") == 0.0
    assert f1_score("Paris, France.", "paris france") == 1.0
    assert f1_score("the", "A!") == 1.0       # both empty after normalisation, agrees with EM
    assert f1_score("", "Paris") == 0.0
    assert f1_score("Paris", "the") == 0.0


# ------------------------------------------------------------------------------------------------
# Bad input: the error names the argument ("<name> must ...").

NOT_SEQUENCES = ["abc", b"ab", {"a", "b"}, 5, None, iter(["a"])]


@pytest.mark.parametrize("fn", [hit_at_k, recall_at_k, mrr_at_k])
@pytest.mark.parametrize("ranked", NOT_SEQUENCES, ids=lambda v: type(v).__name__)
def test_ranked_must_be_a_sequence(fn, ranked):
    with pytest.raises(TypeError, match="^ranked must be a sequence"):
        fn(ranked, {"a"}, 1)


def test_ndcg_ranked_must_be_a_sequence():
    with pytest.raises(TypeError, match="^ranked must be a sequence"):
        ndcg_at_k("ab", {"a": 1}, 1)


@pytest.mark.parametrize("fn,third", [(hit_at_k, {"a"}), (recall_at_k, {"a"}), (mrr_at_k, {"a"}), (ndcg_at_k, {"a": 1})])
def test_ranked_duplicates_and_shape(fn, third):
    with pytest.raises(ValueError, match="^ranked must not repeat ids.*'a'"):
        fn(["a", "b", "a"], third, 3)
    with pytest.raises(ValueError, match="^ranked must be a 1-D"):
        fn(np.array([[1, 2]]), third, 1)
    with pytest.raises(TypeError, match="^ranked must hold hashable"):
        fn([["a"], ["b"]], third, 1)


@pytest.mark.parametrize("fn,third", [(hit_at_k, {"a"}), (recall_at_k, {"a"}), (mrr_at_k, {"a"}), (ndcg_at_k, {"a": 1})])
@pytest.mark.parametrize("k,exc", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError),
                                   ("3", TypeError), (None, TypeError)])
def test_bad_k(fn, third, k, exc):
    with pytest.raises(exc, match="^k must be an int >= 1"):
        fn(["a", "b"], third, k)


def test_numpy_int_k_is_accepted():
    assert hit_at_k(["x", "a"], {"a"}, np.int64(2)) == 1.0


@pytest.mark.parametrize("fn", [hit_at_k, recall_at_k, mrr_at_k])
@pytest.mark.parametrize("relevant", ["a", {"a": 1}, 3], ids=["str", "mapping", "int"])
def test_relevant_must_be_a_collection_of_ids(fn, relevant):
    with pytest.raises(TypeError, match="^relevant must be a collection"):
        fn(["a"], relevant, 1)


def test_recall_empty_relevant_raises():
    with pytest.raises(ValueError, match="^relevant must hold at least one id"):
        recall_at_k(["a"], set(), 1)


@pytest.mark.parametrize("gains,exc,needle", [
    ({"a": -1}, ValueError, r"^gains\['a'\] must be a finite number >= 0"),
    ({"a": math.nan}, ValueError, r"^gains\['a'\] must be a finite number >= 0"),
    ({"a": np.float32("nan")}, ValueError, r"^gains\['a'\] must be a finite"),
    ({"a": math.inf}, ValueError, r"^gains\['a'\] must be a finite"),
    ({"a": "3"}, TypeError, r"^gains\['a'\] must be a real number"),
    ({"a": True}, TypeError, r"^gains\['a'\] must be a real number"),
    ([("a", 1)], TypeError, "^gains must be a mapping"),
    ({"a": 0, "b": 0}, ValueError, "^gains must hold at least one grade > 0"),
    ({}, ValueError, "^gains must hold at least one grade > 0"),
])
def test_bad_gains(gains, exc, needle):
    with pytest.raises(exc, match=needle):
        ndcg_at_k(["a"], gains, 1)


@pytest.mark.parametrize("kwargs,exc,needle", [
    ({"rankings": [["a"]]}, TypeError, "^rankings must be a mapping"),
    ({"qrels": [{"a": 1}]}, TypeError, "^qrels must be a mapping"),
    ({"qrels": {"q": {"a": -1}}}, ValueError, r"^qrels\['q'\]\['a'\] must be a finite"),
    ({"qrels": {"q": {"a": math.nan}}}, ValueError, r"^qrels\['q'\]\['a'\] must be a finite"),
    ({"qrels": {"q": ["a"]}}, TypeError, r"^qrels\['q'\] must be a mapping"),
    ({"rankings": {"q": ["a", "a"]}}, ValueError, r"^rankings\['q'\] must not repeat ids"),
    ({"rankings": {"q": "ab"}}, TypeError, r"^rankings\['q'\] must be a sequence"),
    ({"ks": ()}, ValueError, "^ks must hold at least one"),
    ({"ks": 5}, TypeError, "^ks must be a sequence of ints"),
    ({"ks": (1, 0)}, ValueError, "^ks must be an int >= 1"),
    ({"ks": (1.5,)}, TypeError, "^ks must be an int >= 1"),
])
def test_evaluate_rankings_bad_input(kwargs, exc, needle):
    args = {"rankings": {"q": ["a"]}, "qrels": {"q": {"a": 1}}, "ks": (1,)}
    args.update(kwargs)
    with pytest.raises(exc, match=needle):
        evaluate_rankings(**args)


@pytest.mark.parametrize("call,exc,needle", [
    (lambda: normalize_answer(None), TypeError, "^s must be a str"),
    (lambda: normalize_answer(["a"]), TypeError, "^s must be a str"),
    (lambda: exact_match(3, "3"), TypeError, "^prediction must be a str"),
    (lambda: f1_score(None, "x"), TypeError, "^prediction must be a str"),
    (lambda: exact_match("x", []), ValueError, "^gold must hold at least one"),
    (lambda: f1_score("x", ()), ValueError, "^gold must hold at least one"),
    (lambda: exact_match("x", ["x", 3]), TypeError, "^gold must be a str or a sequence of str"),
    (lambda: f1_score("x", None), TypeError, "^gold must be a str or a sequence of str"),
    (lambda: f1_score("x", {"x"}), TypeError, "^gold must be a str or a sequence of str"),
])
def test_answer_metrics_bad_input(call, exc, needle):
    with pytest.raises(exc, match=needle):
        call()


# -- MultimodalQA answer lists -------------------------------------------------------------------

from colgraph_engine.eval import mmqa_em_f1  # noqa: E402


@pytest.mark.parametrize("prediction, gold, expected", [
    ("The Eiffel Tower", "eiffel tower", (1.0, 1.0)),           # articles and case
    ("Jean-Paul Sartre", "jean paul sartre", (1.0, 1.0)),       # hyphens split tokens
    (["Paris", "London"], ["london", "paris"], (1.0, 1.0)),     # list answers compare as sets
    (["Paris"], ["Paris", "Rome"], (0.0, 0.5)),                 # one of two aligned: 1.0 / max(1, 2)
    ("New York City", "New York", (0.0, 0.8)),                  # p = 2/3, r = 1 -> 2pr/(p+r) = 0.8
    ("four apples", "4 apples", (1.0, 1.0)),                    # number words and digits meet as 4.0
    ("3 apples", "4 apples", (0.0, 0.0)),                       # gold number missing: the pair scores 0
    ("1,000 people", "1000 people", (1.0, 1.0)),
    (["a", "b", "c"], ["c", "x"], (0.0, round(1 / 3, 2))),      # best matching c-c = 1, others 0; / 3
])
def test_mmqa_em_f1_hand_computed(prediction, gold, expected):
    assert mmqa_em_f1(prediction, gold) == expected


def test_mmqa_em_f1_bad_input():
    with pytest.raises(TypeError, match="prediction"):
        mmqa_em_f1(3, "x")
    with pytest.raises(TypeError, match="gold"):
        mmqa_em_f1("x", [])


# Issue 12 reproducers and MultimodalQA's official normalisation (allenai/multimodalqa,
# baselines/evaluate.py with word2number 1.1). Expected values were worked out from its rules:
# punctuation goes first unless the piece is already a float, then floats and number words are
# written as str(float(...)); a differential run against the official script on 14,738 random
# answer pairs found no difference (not part of the suite: the script is not a dependency).
@pytest.mark.parametrize("prediction, gold, expected", [
    ("$5", "5", (1.0, 1.0)),                 # "$5" -> "5" -> "5.0"   (was (0, 0))
    ("1995", "(1995)", (1.0, 1.0)),          # "(1995)" -> "1995" -> "1995.0"   (was (0, 0))
    ("5%", "5", (1.0, 1.0)),
    ("thirty", "30", (1.0, 1.0)),            # number words beyond twenty: the tens
    ("ninety-nine", "90 9", (1.0, 1.0)),     # hyphen splits first: "90.0 9.0"
    ("hundred", "100", (1.0, 1.0)),
    ("million", "1000000", (1.0, 1.0)),
    ("billion", "1e9", (1.0, 1.0)),          # "1e9" is a float: "1000000000.0"
    ("one hundred", "100", (0.0, 0.67)),     # pieces "1.0 100.0" vs "100.0": p 1/2, r 1 -> 2/3
    ("1,000.5", "10005", (1.0, 1.0)),        # the comma AND the point go (official behaviour)
    ("1,000", "1000", (1.0, 1.0)),
    ("+7", "7", (1.0, 1.0)),                 # a float keeps its sign character until str(float)
    (".5", "0.5", (1.0, 1.0)),
    ("point", "0", (1.0, 1.0)),              # word2number reads "point" alone as 0
    ("first", "1", (0.0, 0.0)),              # ordinals are not number words
    ("the 5", "5", (1.0, 1.0)),
    ("4 apples", "$4 apples", (1.0, 1.0)),
    ("5 apples", "$4 apples", (0.0, 0.0)),   # gold number 4.0 missing from the prediction
])
def test_mmqa_em_f1_official_normalisation(prediction, gold, expected):
    assert mmqa_em_f1(prediction, gold) == expected


def test_mmqa_number_words_follow_word2number():
    from colgraph_engine.eval.metrics import _mmqa_normalize, _word_number
    # whole phrases, as word2number 1.1 reads them (pieces never hold spaces, but may hold tabs)
    assert _word_number("two million three hundred") == 2_000_300.0
    assert _word_number("twenty one") == 21.0
    assert _word_number("five point two five") == 5.25
    assert _word_number("five point twenty") == 5.0          # non-digit decimal words count 0
    assert _word_number("two million three thousand") == 2_004_003.0   # the library's own quirk
    assert _word_number("thousand million") is None         # thousand before million: refused
    assert _word_number("point point") is None
    assert _word_number("thousand one") is None             # library IndexError: not a number here
    assert _word_number("apple") is None
    assert _mmqa_normalize("five\tpoint\tfive") == "5.5"
    assert _mmqa_normalize("The-$5  answer") == "5.0 answer"


def test_mmqa_alignment_and_empty_prediction():
    # gold [paris, rome], prediction [rome]: rome-rome = 1, paris unmatched 0 -> mean over 2 = 0.5
    assert mmqa_em_f1(["Rome"], ["Paris", "Rome"]) == (0.0, 0.5)
    # prediction longer than gold: divided by the longer list (3): 1/3 -> 0.33
    assert mmqa_em_f1(["x", "Rome", "y"], ["Rome"]) == (0.0, 0.33)
    # an empty prediction list scores 0 (the official script does the same)
    assert mmqa_em_f1([], ["Rome"]) == (0.0, 0.0)
