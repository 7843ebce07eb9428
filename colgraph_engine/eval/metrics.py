"""Retrieval metrics (hit, recall, MRR, nDCG at a cut-off k) and SQuAD-style answer metrics (EM, F1).

Retrieval: a query's ``ranked`` list holds document ids, best first, without duplicates. Rank ``i``
is 1-based and "top-k" means ``ranked[:k]`` (the whole list when it is shorter than ``k``). Every
function scores one query; :func:`evaluate_rankings` scores many and averages them (a plain
mean over queries, i.e. macro-averaged).

Answers: strings are compared after :func:`normalize_answer`; :func:`exact_match` and
:func:`f1_score` accept one gold string or a list of alternative golds and keep the best score.

Bad input raises ``TypeError`` (wrong type) or ``ValueError`` (right type, wrong value); the
message starts with the argument's name.
"""
from __future__ import annotations

import itertools
import math
import numbers
import re
import string
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

Gold = str | Sequence[str]


# ---------------------------------------------------------------------------------------------
# Argument checks. `name` is what the caller called the argument, so that errors raised inside
# evaluate_rankings point at e.g. rankings['q7'] rather than at an internal parameter.

def _check_ranked(ranked: Any, name: str = "ranked") -> list[Hashable]:
    # Strings are sequences too, but a string where a list of ids belongs is always a mistake.
    if isinstance(ranked, np.ndarray):
        if ranked.ndim != 1:
            raise ValueError(f"{name} must be a 1-D sequence of ids, got an array of shape {ranked.shape}")
        ranked = ranked.tolist()
    elif isinstance(ranked, (str, bytes)) or not isinstance(ranked, Sequence):
        raise TypeError(f"{name} must be a sequence of ids (list, tuple or 1-D array), got {type(ranked).__name__}")
    try:
        unique = set(ranked)
    except TypeError:
        raise TypeError(f"{name} must hold hashable ids") from None
    if len(unique) != len(ranked):
        dup = next(x for x, c in Counter(ranked).items() if c > 1)
        raise ValueError(f"{name} must not repeat ids (a ranking lists each document once), {dup!r} is repeated")
    return list(ranked)


def _check_k(k: Any, name: str = "k") -> int:
    # bool is an int subclass; k=True is a bug, not "1".
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(f"{name} must be an int >= 1, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"{name} must be an int >= 1, got {k}")
    return int(k)


def _check_relevant(relevant: Any, name: str = "relevant") -> set[Hashable]:
    # A mapping is refused because iterating it yields every judged id, grade 0 included.
    if isinstance(relevant, (str, bytes, Mapping)) or not isinstance(relevant, Iterable):
        raise TypeError(f"{name} must be a collection of relevant ids (e.g. a set), got {type(relevant).__name__}")
    try:
        return set(relevant)
    except TypeError:
        raise TypeError(f"{name} must hold hashable ids") from None


def _check_gains(gains: Any, name: str = "gains") -> dict[Hashable, float]:
    if not isinstance(gains, Mapping):
        raise TypeError(f"{name} must be a mapping id -> graded relevance, got {type(gains).__name__}")
    out = {}
    for doc, g in gains.items():
        if isinstance(g, bool) or not isinstance(g, numbers.Real):
            raise TypeError(f"{name}[{doc!r}] must be a real number >= 0, got {type(g).__name__}")
        g = float(g)
        if not math.isfinite(g) or g < 0:
            raise ValueError(f"{name}[{doc!r}] must be a finite number >= 0, got {g}")
        out[doc] = g
    return out


# ---------------------------------------------------------------------------------------------
# Single-query retrieval metrics. The private cores take checked input already cut to the top k;
# the public functions and evaluate_rankings share them, so each formula exists once.

def _hit(top: list[Hashable], relevant: set[Hashable]) -> float:
    return float(any(doc in relevant for doc in top))


def _recall(top: list[Hashable], relevant: set[Hashable]) -> float:
    return sum(doc in relevant for doc in top) / len(relevant)


def _rr(top: list[Hashable], relevant: set[Hashable]) -> float:
    return next((1.0 / i for i, doc in enumerate(top, start=1) if doc in relevant), 0.0)


GAIN_CONVENTIONS = ("linear", "exponential")


def _check_gain(gain: Any, name: str = "gain") -> str:
    if not isinstance(gain, str):
        raise TypeError(f"{name} must be one of {GAIN_CONVENTIONS}, got {type(gain).__name__}")
    if gain not in GAIN_CONVENTIONS:
        raise ValueError(f"{name} must be one of {GAIN_CONVENTIONS}, got {gain!r}")
    return gain


def _dcg(grades: Iterable[float], gain: str) -> float:
    # grades in rank order, already cut to k; gain checked by the caller
    if gain == "linear":
        return math.fsum(g / math.log2(i + 1) for i, g in enumerate(grades, start=1))
    return math.fsum((2.0 ** g - 1.0) / math.log2(i + 1) for i, g in enumerate(grades, start=1))


def _idcg(gains: dict[Hashable, float], k: int, gain: str) -> float:
    return _dcg(sorted(gains.values(), reverse=True)[:k], gain)


def _ndcg(top: list[Hashable], gains: dict[Hashable, float], idcg: float, gain: str) -> float:
    return _dcg((gains.get(doc, 0.0) for doc in top), gain) / idcg


def hit_at_k(ranked: Sequence[Hashable], relevant: Iterable[Hashable], k: int) -> float:
    """1.0 if any of ``ranked[:k]`` is in ``relevant``, else 0.0 (so 0.0 when ``relevant`` is empty)."""
    ranked, relevant, k = _check_ranked(ranked), _check_relevant(relevant), _check_k(k)
    return _hit(ranked[:k], relevant)


def recall_at_k(ranked: Sequence[Hashable], relevant: Iterable[Hashable], k: int) -> float:
    """``|ranked[:k] ∩ relevant| / |relevant|``.

    The denominator is the full number of relevant ids even when it exceeds ``k``, so recall@k
    can stay below 1 for a perfect ranking. Empty ``relevant`` raises ``ValueError`` (0/0).
    """
    ranked, relevant, k = _check_ranked(ranked), _check_relevant(relevant), _check_k(k)
    if not relevant:
        raise ValueError("relevant must hold at least one id: recall is undefined (0/0) without relevant documents")
    return _recall(ranked[:k], relevant)


def mrr_at_k(ranked: Sequence[Hashable], relevant: Iterable[Hashable], k: int) -> float:
    """Reciprocal rank ``1 / i`` of the first ``ranked[i - 1]`` in ``relevant`` with ``i <= k``, else 0.0
    (so 0.0 when ``relevant`` is empty). Averaged over queries by :func:`evaluate_rankings` this is MRR@k.
    """
    ranked, relevant, k = _check_ranked(ranked), _check_relevant(relevant), _check_k(k)
    return _rr(ranked[:k], relevant)


def ndcg_at_k(ranked: Sequence[Hashable], gains: Mapping[Hashable, float], k: int, *,
              gain: str = "linear") -> float:
    """Normalised discounted cumulative gain at ``k``::

        DCG@k  = sum_{i=1..min(k, n)} G(g_i) / log2(i + 1)
        nDCG@k = DCG@k / IDCG@k

        G(g) = g            gain="linear" (default)
        G(g) = 2^g - 1      gain="exponential"

    where ``n = len(ranked)``, ``g_i = gains.get(ranked[i - 1], 0)`` (ids absent from ``gains``
    count as grade 0) and IDCG@k is DCG@k of the ideal ranking: all of ``gains``' grades sorted
    in decreasing order. Grades must be finite and >= 0. IDCG@k = 0 (no grade above 0) raises
    ``ValueError``. With grades 0/1 only, the two conventions give the same value.

    Which convention published figures use:

    * ``"linear"`` is trec_eval's ``ndcg`` / ``ndcg_cut``: their measure descriptions say the gain
      values are the relevance values of the qrels, and the code (trec_eval 9.0.8, the version
      pytrec_eval 0.5 builds) adds ``rel / log2(rank + 1)`` for ranks 1, 2, ...; the ideal DCG is
      built from the judged relevance levels in decreasing order. pytrec_eval wraps that code, and
      BEIR (``beir/retrieval/evaluation.py``, measure ``ndcg_cut.k``) and ViDoRe (vidore-benchmark,
      through colpali-engine's evaluator on mteb's pytrec_eval-based retrieval evaluator) report
      it; use it to compare with their nDCG@k.
    * ``"exponential"`` is the ``2^rel - 1`` gain of Burges et al. (ICML 2005), common in
      learning-to-rank code; it weighs the highest grades more. trec_eval reaches it only through
      explicit per-level gains (``ndcg_p.1=1,2=3,3=7``: its description says the gains default to
      the relevance levels and may be overridden as ``rel_level=gain``); ``ndcg_cut`` takes none.
    """
    ranked, gains, k, gain = _check_ranked(ranked), _check_gains(gains), _check_k(k), _check_gain(gain)
    idcg = _idcg(gains, k, gain)
    if idcg == 0.0:
        raise ValueError("gains must hold at least one grade > 0: nDCG is undefined when IDCG is 0")
    return _ndcg(ranked[:k], gains, idcg, gain)


def evaluate_rankings(
    rankings: Mapping[Hashable, Sequence[Hashable]],
    qrels: Mapping[Hashable, Mapping[Hashable, float]],
    ks: Iterable[int] = (1, 5, 10),
    *,
    gain: str = "linear",
) -> dict[str, float]:
    """Mean hit@k, recall@k, MRR@k and nDCG@k over the queries of ``qrels``, for every k in ``ks``.

    ``rankings`` maps query id -> ranked doc ids; ``qrels`` maps query id -> {doc id: grade}.
    For hit/recall/MRR a document is relevant when its grade is > 0; nDCG uses the grades with
    the ``gain`` convention of :func:`ndcg_at_k` (default ``"linear"``, trec_eval's).

    * The queries are those of ``qrels``; ranked queries that ``qrels`` lacks are ignored
      (nothing to score them against).
    * A query of ``qrels`` missing from ``rankings`` counts as an empty ranking (scores 0), so
      a system cannot raise its mean by not answering.
    * A query whose grades are all 0 (or that has none) is skipped: recall and nDCG would be 0/0.

    Returns ``{"hit@k": mean, "recall@k": ..., "mrr@k": ..., "ndcg@k": ...}`` for each k (keys
    grouped by metric, ks in the given order, repeats dropped) plus ``"n_queries"`` (scored
    queries, the denominator of every mean) and ``"n_skipped"``. Raises ``ValueError`` when no
    query can be scored.
    """
    if not isinstance(rankings, Mapping):
        raise TypeError(f"rankings must be a mapping query id -> ranked ids, got {type(rankings).__name__}")
    if not isinstance(qrels, Mapping):
        raise TypeError(f"qrels must be a mapping query id -> {{doc id: grade}}, got {type(qrels).__name__}")
    if isinstance(ks, (str, bytes)) or not isinstance(ks, Iterable):
        raise TypeError(f"ks must be a sequence of ints >= 1, got {type(ks).__name__}")
    gain = _check_gain(gain)
    ks = list(dict.fromkeys(_check_k(k, "ks") for k in ks))  # dedupe, keep order
    if not ks:
        raise ValueError("ks must hold at least one cut-off")

    per_query: dict[str, list[float]] = {f"{m}@{k}": [] for m in ("hit", "recall", "mrr", "ndcg") for k in ks}
    n_skipped = 0
    for qid, grades in qrels.items():
        grades = _check_gains(grades, f"qrels[{qid!r}]")
        relevant = {doc for doc, g in grades.items() if g > 0}
        if not relevant:
            n_skipped += 1
            continue
        ranked = _check_ranked(rankings.get(qid, []), f"rankings[{qid!r}]")
        for k in ks:
            top = ranked[:k]
            per_query[f"hit@{k}"].append(_hit(top, relevant))
            per_query[f"recall@{k}"].append(_recall(top, relevant))
            per_query[f"mrr@{k}"].append(_rr(top, relevant))
            per_query[f"ndcg@{k}"].append(_ndcg(top, grades, _idcg(grades, k, gain), gain))  # IDCG > 0: a grade is > 0

    n = len(qrels) - n_skipped
    if n == 0:
        raise ValueError("qrels must contain at least one query with a grade > 0; no query could be scored")
    result: dict[str, float] = {key: math.fsum(values) / n for key, values in per_query.items()}
    result["n_queries"] = n
    result["n_skipped"] = n_skipped
    return result


# ---------------------------------------------------------------------------------------------
# Answer metrics.

_ARTICLES = re.compile(r"\b(?:a|an|the)\b")
_DROP_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(s: str) -> str:
    """Lower-cases, deletes ASCII punctuation (``string.punctuation``), deletes the whole words
    "a", "an", "the", and collapses runs of whitespace to single spaces (stripping both ends).

    The steps run in that order, so "the-end" -> "theend" (the hyphen goes first, leaving no
    standalone article) and "A.B." -> "ab". Non-ASCII punctuation such as "’" is kept.
    """
    if not isinstance(s, str):
        raise TypeError(f"s must be a str, got {type(s).__name__}")
    s = _ARTICLES.sub(" ", s.lower().translate(_DROP_PUNCTUATION))
    return " ".join(s.split())


def _golds(gold: Any) -> list[str]:
    if isinstance(gold, str):
        return [gold]
    if not isinstance(gold, Sequence) or not all(isinstance(g, str) for g in gold):
        raise TypeError("gold must be a str or a sequence of str (alternative acceptable answers)")
    if not gold:
        raise ValueError("gold must hold at least one acceptable answer")
    return list(gold)


def _check_prediction(prediction: Any) -> str:
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a str, got {type(prediction).__name__}")
    return prediction


def exact_match(prediction: str, gold: Gold) -> float:
    """1.0 if ``normalize_answer(prediction)`` equals ``normalize_answer(g)`` for some gold ``g``, else 0.0.

    ``gold`` is one string or a list of *alternative* answers (any one suffices). Note that a
    MultimodalQA question's ``answers`` list is different: all its items together form the one
    answer (list questions), so it must not be passed here as alternatives.

    Scope: this is the SQuAD v1.1 procedure (normalise, compare, max over golds). MultimodalQA's
    official script (allenai/multimodalqa, ``baselines/evaluate.py``) also takes the max over
    reference answers, but it uses DROP's normalisation (tokens split on spaces and hyphens,
    numbers and number words canonicalised, numbers keep their punctuation) and scores answer
    lists: EM compares the sets of normalised answers, F1 aligns answers one-to-one, uses token
    sets rather than bags and rounds to 2 decimals: that is :func:`mmqa_em_f1`.
    """
    pred = normalize_answer(_check_prediction(prediction))
    return float(any(pred == normalize_answer(g) for g in _golds(gold)))


def f1_score(prediction: str, gold: Gold) -> float:
    """Token-level F1 on normalised, whitespace-split tokens, maximised over golds::

        overlap = sum over tokens t of min(count_pred(t), count_gold(t))   (bag of tokens)
        P = overlap / |pred tokens|,  R = overlap / |gold tokens|,  F1 = 2 P R / (P + R)

    F1 = 0 when overlap = 0. When a side normalises to no tokens at all (e.g. "the"), F1 is 1.0
    if both sides are empty and 0.0 otherwise, which agrees with :func:`exact_match` (SQuAD
    v2.0 convention; v1.1 gave 0.0 for two empty answers). ``gold`` and the relation to
    MultimodalQA's official scores: as for :func:`exact_match`.
    """
    pred_tokens = normalize_answer(_check_prediction(prediction)).split()
    return max(_token_f1(pred_tokens, normalize_answer(g).split()) for g in _golds(gold))


def _token_f1(pred: list[str], gold: list[str]) -> float:
    if not pred or not gold:
        return float(pred == gold)
    # Counter & Counter keeps the minimum count per token: a token repeated in the prediction
    # only earns credit as often as it occurs in the gold.
    overlap = sum((Counter(pred) & Counter(gold)).values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred), overlap / len(gold)
    return 2 * precision * recall / (precision + recall)


# -- MultimodalQA answer lists (DROP-style) ----------------------------------------------------
#
# What MultimodalQA's official evaluation (allenai/multimodalqa, baselines/evaluate.py, which pins
# word2number==1.1) does to one answer item, written here from its behaviour:
#   split on every single space and every hyphen; for each piece: lower-case; unless the piece
#   parses as a Python float, delete ASCII punctuation; then, if it parses as a float, write it as
#   str(float(piece)); else if word2number reads it as number words, write that value the same
#   way; then replace the whole words a/an/the by spaces and collapse whitespace; drop empty
#   pieces; join with single spaces.
# So "$5", "5%", "(1995)" and "1,000" become "5.0", "5.0", "1995.0", "1000.0" (punctuation goes
# first, then the digits are a number); "thirty", "hundred", "million" are numbers; "1,000.5"
# loses its comma AND its point ("10005.0"), exactly as the official script does.

# word2number 1.1's vocabulary ("point" separates the decimal digits)
_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
          "fifteen sixteen seventeen eighteen nineteen").split()
_WORD_VALUES = {w: i for i, w in enumerate(_UNITS)}
_WORD_VALUES.update({w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), 2)})
_WORD_VALUES.update({"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000})
_DECIMAL_WORDS = {w: str(i) for i, w in enumerate(_UNITS[:10])}
_SCALES = ("billion", "million", "thousand")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _word_group(words: list[str]) -> int | None:
    """word2number 1.1's value of the number words between two scale words. It looks at the
    count only: four words read as a*b + c + d, three as a*b + c, two as a*b when one of them is
    "hundred" and a + b otherwise, one or five and more as the first word alone. An empty group
    (e.g. "thousand one": nothing before "thousand") makes word2number fail with an IndexError
    that the official script does not catch; here it means "not a number" (None)."""
    v = [_WORD_VALUES[w] for w in words]
    if not v:
        return None
    if len(v) == 4:
        return v[0] * v[1] + v[2] + v[3]
    if len(v) == 3:
        return v[0] * v[1] + v[2]
    if len(v) == 2:
        return v[0] * v[1] if 100 in v else v[0] + v[1]
    return v[0]


def _word_number(text: str) -> float | None:
    """``text`` read as number words with word2number 1.1's rules, or None where it refuses.

    Hyphens count as spaces and case is ignored; an all-digit string is read as an int. Words
    outside the vocabulary (zero..nineteen, the tens twenty..ninety, hundred, thousand, million,
    billion, point) are ignored; with none left, or with thousand/million/billion/point more than
    once, or thousand before million or billion, or million before billion, it refuses. Digits
    after "point" are read as decimals (0 as a whole when any of them is not zero..nine); before
    it, the groups ending at billion, million and thousand are multiplied by their scale and
    added, followed by the last group (see :func:`_word_group`, including its quirks: "two
    million three thousand" reads as 2,004,003, as the library gives). A single word stands for
    its own value ("point" alone is 0).
    """
    text = text.replace("-", " ").lower()
    if text.isdigit():
        try:
            return float(int(text))
        except ValueError:  # digit-like characters such as superscripts that int() refuses
            return None
    words = [w for w in text.split() if w in _WORD_VALUES or w == "point"]
    if not words or any(words.count(w) > 1 for w in (*_SCALES, "point")):
        return None
    decimals: list[str] = []
    if "point" in words:
        at = words.index("point")
        words, decimals = words[:at], words[at + 1:]
    pos = {w: words.index(w) if w in words else -1 for w in _SCALES}
    b, m, t = pos["billion"], pos["million"], pos["thousand"]
    if (t > -1 and (t < m or t < b)) or (m > -1 and m < b):
        return None
    total = 0
    if len(words) == 1:
        total = _WORD_VALUES[words[0]]
    elif words:
        last = len(words) - 1
        parts = []  # (start, end, scale) of each multiplied group, then the trailing group
        if b > -1:
            parts.append((0, b, 1_000_000_000))
        if m > -1:
            parts.append((b + 1 if b > -1 else 0, m, 1_000_000))
        if t > -1:
            parts.append((m + 1 if m > -1 else (b + 1 if b > -1 else 0), t, 1_000))
        # the trailing group starts after the first scale word (thousand, then million, then
        # billion) that is not the last word; it may hold later scale words (library behaviour)
        tail = next((i + 1 for i in (t, m, b) if -1 < i != last), None)
        if tail is not None:
            parts.append((tail, len(words), 1))
        elif b == m == t == -1:
            parts.append((0, len(words), 1))
        for lo, hi, scale in parts:
            value = _word_group(words[lo:hi])
            if value is None:
                return None
            total += value * scale
    if decimals:
        digits = [_DECIMAL_WORDS.get(w) for w in decimals]
        total += float("0." + "".join(digits)) if None not in digits else 0
    return float(total)


def _mmqa_piece(piece: str) -> str:
    piece = piece.lower()
    if _float(piece) is None:
        piece = piece.translate(_DROP_PUNCTUATION)
    value = _float(piece)
    if value is None:
        value = _word_number(piece)
    if value is not None:
        piece = str(value)
    return " ".join(_ARTICLES.sub(" ", piece).split())


def _mmqa_normalize(text: str) -> str:
    """One answer item as MultimodalQA's official evaluation normalises it (rules above)."""
    return " ".join(p for p in map(_mmqa_piece, re.split(r"[ \-]", text)) if p.strip())


def _bag_f1(predicted: set[str], gold: set[str]) -> float:
    overlap = len(predicted & gold)
    if not predicted and not gold:
        return 1.0
    if overlap == 0:
        return 0.0
    p, r = overlap / len(predicted), overlap / len(gold)
    return 2 * p * r / (p + r)


def _numbers_agree(predicted: set[str], gold: set[str]) -> bool:
    """If the gold item holds numbers (words that parse as floats), the prediction must hold at
    least one of them."""
    gold_numbers = {t for t in gold if _float(t) is not None}
    return not gold_numbers or bool(gold_numbers & predicted)


def _best_alignment(scores: list[list[float]]) -> list[float]:
    """A one-to-one matching of the rows (gold items) and columns (predicted items) of a small
    score matrix with the largest sum; returns each row's matched score (0.0 when unmatched).
    Exhaustive over the smaller side's assignments (answer lists have a handful of items); the
    first best assignment found wins ties, which changes only which rows carry the equal sum."""
    rows, cols = len(scores), len(scores[0]) if scores else 0
    transposed = rows > cols
    if transposed:
        scores = [list(c) for c in zip(*scores)]
        rows, cols = cols, rows
    if rows > 8:
        raise ValueError(f"prediction/gold: at most 8 items on the smaller side, got {rows}")
    best, best_sum = (), -1.0
    for perm in itertools.permutations(range(cols), rows):
        total = sum(scores[i][j] for i, j in enumerate(perm))
        if total > best_sum:
            best, best_sum = perm, total
    n_gold = cols if transposed else rows
    per_gold = [0.0] * n_gold
    for i, j in enumerate(best):
        per_gold[j if transposed else i] = scores[i][j]
    return per_gold


def mmqa_em_f1(prediction: str | Sequence[str], gold: str | Sequence[str]) -> tuple[float, float]:
    """MultimodalQA's EM and F1 for one question whose answer may be a list of items, as its
    official evaluation (allenai/multimodalqa ``baselines/evaluate.py``: ``list_em``, ``list_f1``)
    scores a prediction against one reference answer.

    Items are normalised as in ``_mmqa_normalize``: split on spaces and hyphens, lower-cased,
    punctuation dropped unless the piece is a number, numbers and number words (word2number's
    vocabulary: zero..nineteen, the tens, hundred, thousand, million, billion, point) written
    canonically as floats, articles dropped; so ``"$5"`` and ``"5"`` both become ``"5.0"``.
    EM is 1.0 when the sets of normalised predicted and gold items are equal and the lists have
    equal length. F1 aligns gold and predicted items one-to-one to maximise the summed
    token-set F1 (an item pair whose gold holds a number the prediction lacks scores 0), averages
    the gold items' matched scores over the longer list's length, and rounds to 2 decimals with
    numpy's rounding, as the official script does. An empty prediction list scores (0.0, 0.0);
    ``gold`` must hold at least one item. Alternative reference answers are the caller's to
    max over (the official script's ``metric_max_over_ground_truths``).
    """
    def items(x, name, allow_empty):
        if isinstance(x, str):
            return [x]
        if not isinstance(x, Sequence) or not all(isinstance(s, str) for s in x) or not (x or allow_empty):
            raise TypeError(f"{name} must be a str or a {'' if allow_empty else 'non-empty '}sequence of str")
        return list(x)

    pred_items = [_mmqa_normalize(s) for s in items(prediction, "prediction", True)]
    gold_items = [_mmqa_normalize(s) for s in items(gold, "gold", False)]
    em = 1.0 if set(pred_items) == set(gold_items) and len(pred_items) == len(gold_items) else 0.0
    pred_bags = [set(s.split()) for s in pred_items]
    gold_bags = [set(s.split()) for s in gold_items]
    scores = [[_bag_f1(p, g) if _numbers_agree(p, g) else 0.0 for p in pred_bags] for g in gold_bags]
    per_gold = _best_alignment(scores) if pred_bags else [0.0] * len(gold_bags)
    per_gold += [0.0] * (max(len(pred_bags), len(gold_bags)) - len(per_gold))
    f1 = float(np.round(np.mean(np.asarray(per_gold, dtype=np.float64)), 2))
    return em, f1
