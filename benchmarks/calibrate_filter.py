"""Calibrates the pipeline's default relevance-filter threshold per text encoder.

The filter keeps an entity when the cosine of the question's text vector with the entity's
description vector (``"name: description"``) exceeds a threshold. The right value depends on
the encoder, so it is measured on generated data: a vocabulary of made-up entity names and
descriptions written from a fixed word list, and questions from templates that name one or two
of the entities. Pairs (question, entity named in it) are relevant; (question, any other entity)
are not. The threshold reported is the one that maximises balanced accuracy (mean of the true
positive and true negative rates) over all pairs; the report also gives the score quantiles.

    .venv/bin/python benchmarks/calibrate_filter.py [--encoders offline,minilm] [--entities 400]

Writes benchmarks/results/filter_calibration.md and .json (``--out`` changes the folder).
"""
from __future__ import annotations

import pathlib
import random
import sys

import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness as h  # noqa: E402

SYLLABLES = "ka ri to mo na shi ve lo ran tek bor quin dal ser vio mar gus hel".split()
WORDS = ("river mountain station company festival museum bridge village engineer painter rocket library harbour "
         "factory school temple island railway orchestra garden tower market bank theatre stadium").split()
VERBS = "founded built designed opened crossed painted launched managed visited restored".split()
TEMPLATES = [
    "Who is {a}?", "What did {a} do in {year}?", "How is {a} related to {b}?", "Where is {a} located?",
    "Which {w} is connected with {a}?", "When was {a} {v}?", "What does the photo of {a} show?",
]


def make_entities(n: int, rng: random.Random) -> list[tuple[str, str]]:
    """`n` ``(name, description)`` pairs, names of 1-2 made-up words, sorted by name."""
    names = set()
    while len(names) < n:
        words = [("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))).capitalize()
                 for _ in range(rng.randint(1, 2))]
        names.add(" ".join(words))
    out = []
    for name in sorted(names):
        w1, w2 = rng.sample(WORDS, 2)
        out.append((name, f"{name} is a {w1} that {rng.choice(VERBS)} the {w2} in {rng.randint(1850, 2020)}."))
    return out


def make_questions(entities, n: int, rng: random.Random) -> list[tuple[str, set[int]]]:
    """`n` ``(question, indices of the entities it names)`` from :data:`TEMPLATES`."""
    qs = []
    for _ in range(n):
        a, b = rng.sample(range(len(entities)), 2)
        t = rng.choice(TEMPLATES)
        q = t.format(a=entities[a][0], b=entities[b][0], year=rng.randint(1850, 2020), w=rng.choice(WORDS),
                     v=rng.choice(VERBS))
        qs.append((q, {a, b} if "{b}" in t else {a}))
    return qs


def encoder_sets(names):
    """``(name, text encoder)`` for each name that loads here (MiniLM needs its model package)."""
    from colgraph_engine.kg import Encoders
    for name in names:
        if name == "offline":
            yield name, Encoders.offline().text
        elif name == "minilm":
            try:
                from colgraph_engine.encoders import MiniLMEncoder
                yield name, MiniLMEncoder().text_encoder()
            except Exception as exc:  # model package not installed
                print(f"minilm skipped: {exc}")


def quantiles(x: np.ndarray) -> dict[int, float]:
    return {p: round(float(np.quantile(x, p / 100)), 4) for p in (1, 5, 50, 95, 99)}


def calibrate(text_encoder, entities, questions) -> dict:
    """The threshold of best balanced accuracy over all (question, entity) cosines, with its rates."""
    e = torch.nn.functional.normalize(text_encoder([f"{n}: {d}" for n, d in entities]).float(), dim=1)
    q = torch.nn.functional.normalize(text_encoder([t for t, _ in questions]).float(), dim=1)
    s = (q @ e.T).numpy()
    rel = np.zeros_like(s, bool)
    for i, (_, named) in enumerate(questions):
        rel[i, list(named)] = True
    pos, neg = s[rel], s[~rel]
    best_t, best_acc = 0.5, -1.0
    for t in np.unique(np.round(np.concatenate([pos, neg]), 3)):
        acc = 0.5 * ((pos > t).mean() + (neg <= t).mean())
        if acc > best_acc:
            best_t, best_acc = float(t), float(acc)
    return {"encoder": text_encoder.name, "threshold": round(best_t, 3), "balanced_accuracy": round(best_acc, 4),
            "tpr": round(float((pos > best_t).mean()), 4), "tnr": round(float((neg <= best_t).mean()), 4),
            "relevant_quantiles": quantiles(pos), "other_quantiles": quantiles(neg),
            "pairs": [int(pos.size), int(neg.size)]}


def main(argv=None) -> int:
    ap = h.parser(__doc__, quick=False)
    ap.add_argument("--encoders", default="offline,minilm")
    ap.add_argument("--entities", type=int, default=400)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    entities = make_entities(args.entities, rng)
    questions = make_questions(entities, args.questions, rng)
    rows = [calibrate(enc, entities, questions) for _, enc in encoder_sets(args.encoders.split(","))]
    meta = {"entities": len(entities), "questions": len(questions), "seed": args.seed}
    body = [f"{len(entities)} generated entities, {len(questions)} template questions, seed {args.seed}.", "",
            *h.table([("encoder", "encoder"), ("threshold:", "threshold"), ("balanced acc.:", "balanced_accuracy"),
                      ("TPR:", "tpr"), ("TNR:", "tnr"),
                      ("relevant p5 / p50:", lambda r: f"{r['relevant_quantiles'][5]} / {r['relevant_quantiles'][50]}"),
                      ("other p95 / p99:", lambda r: f"{r['other_quantiles'][95]} / {r['other_quantiles'][99]}")],
                     rows)]
    h.write("filter_calibration", "Relevance-filter threshold calibration", body, {"meta": meta, "rows": rows},
            args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
