"""Calibrates the pipeline's default relevance-filter threshold per text encoder.

The filter keeps an entity when the cosine of the question's text vector with the entity's
description vector (``"name: description"``) exceeds a threshold. The right value depends on
the encoder, so it is measured on generated data: a vocabulary of made-up entity names and
descriptions written from a fixed word list, and questions from templates that name one or two
of the entities. Pairs (question, entity named in it) are relevant; (question, any other entity)
are not. The threshold reported is the one that maximises balanced accuracy (mean of the true
positive and true negative rates) over all pairs; the report also gives the score quantiles.

    .venv/bin/python benchmarks/calibrate_filter.py [--encoders offline,minilm] [--entities 400]

Writes benchmarks/results/filter_calibration.md and .json.
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import time
from pathlib import Path

import numpy as np
import torch

RESULTS = Path(__file__).parent / "results"
SYLLABLES = "ka ri to mo na shi ve lo ran tek bor quin dal ser vio mar gus hel".split()
WORDS = ("river mountain station company festival museum bridge village engineer painter rocket library harbour "
         "factory school temple island railway orchestra garden tower market bank theatre stadium").split()
VERBS = "founded built designed opened crossed painted launched managed visited restored".split()
TEMPLATES = [
    "Who is {a}?", "What did {a} do in {year}?", "How is {a} related to {b}?", "Where is {a} located?",
    "Which {w} is connected with {a}?", "When was {a} {v}?", "What does the photo of {a} show?",
]


def make_entities(n: int, rng: random.Random) -> list[tuple[str, str]]:
    names = set()
    while len(names) < n:
        words = [("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3)))).capitalize()
                 for _ in range(rng.randint(1, 2))]
        names.add(" ".join(words))
    out = []
    for name in sorted(names):
        w1, w2 = rng.sample(WORDS, 2)
        desc = f"{name} is a {w1} that {rng.choice(VERBS)} the {w2} in {rng.randint(1850, 2020)}."
        out.append((name, desc))
    return out


def make_questions(entities, n: int, rng: random.Random) -> list[tuple[str, set[int]]]:
    qs = []
    for _ in range(n):
        a, b = rng.sample(range(len(entities)), 2)
        t = rng.choice(TEMPLATES)
        q = t.format(a=entities[a][0], b=entities[b][0], year=rng.randint(1850, 2020), w=rng.choice(WORDS),
                     v=rng.choice(VERBS))
        qs.append((q, {a, b} if "{b}" in t else {a}))
    return qs


def encoder_sets(names):
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


def calibrate(text_encoder, entities, questions) -> dict:
    e = torch.nn.functional.normalize(text_encoder([f"{n}: {d}" for n, d in entities]).float(), dim=1)
    q = torch.nn.functional.normalize(text_encoder([t for t, _ in questions]).float(), dim=1)
    s = (q @ e.T).numpy()
    rel = np.zeros_like(s, bool)
    for i, (_, named) in enumerate(questions):
        rel[i, list(named)] = True
    pos, neg = s[rel], s[~rel]
    grid = np.unique(np.round(np.concatenate([pos, neg]), 3))
    best_t, best_acc = 0.5, -1.0
    for t in grid:
        acc = 0.5 * ((pos > t).mean() + (neg <= t).mean())
        if acc > best_acc:
            best_t, best_acc = float(t), float(acc)
    q_ = lambda x: {p: round(float(np.quantile(x, p / 100)), 4) for p in (1, 5, 50, 95, 99)}  # noqa: E731
    return {"encoder": text_encoder.name, "threshold": round(best_t, 3), "balanced_accuracy": round(best_acc, 4),
            "tpr": round(float((pos > best_t).mean()), 4), "tnr": round(float((neg <= best_t).mean()), 4),
            "relevant_quantiles": q_(pos), "other_quantiles": q_(neg), "pairs": [int(pos.size), int(neg.size)]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--encoders", default="offline,minilm")
    ap.add_argument("--entities", type=int, default=400)
    ap.add_argument("--questions", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    entities = make_entities(args.entities, rng)
    questions = make_questions(entities, args.questions, rng)
    rows = [calibrate(enc, entities, questions) for _, enc in encoder_sets(args.encoders.split(","))]
    meta = {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.processor() or platform.machine(),
            "entities": len(entities), "questions": len(questions), "seed": args.seed}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "filter_calibration.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = ["# Relevance-filter threshold calibration", "",
             f"{meta['date']}; {len(entities)} generated entities, {len(questions)} template questions, seed "
             f"{args.seed}; `benchmarks/calibrate_filter.py`.", "",
             "| encoder | threshold | balanced acc. | TPR | TNR | relevant p5 / p50 | other p95 / p99 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['encoder']} | {r['threshold']} | {r['balanced_accuracy']} | {r['tpr']} | {r['tnr']} | "
                     f"{r['relevant_quantiles'][5]} / {r['relevant_quantiles'][50]} | "
                     f"{r['other_quantiles'][95]} / {r['other_quantiles'][99]} |")
    (RESULTS / "filter_calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
