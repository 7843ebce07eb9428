"""Recall of the pipeline's default document recall (``recall_ranker="auto"``) through a carried
prefilter with the adaptive budget, on clustered corpora with realistic near-ties and on real
page tokens, and its speed against exact MaxSim in the same run.

Usage (from the repository root)::

    .venv/bin/python benchmarks/recall_default.py            # every shape, the size sweep, pages
    .venv/bin/python benchmarks/recall_default.py --quick    # tiny corpora, a smoke run (< 2 min)

**Corpora** (:func:`topic_corpus`): a shared pool of topics, each a unit centre with
``words_per_topic`` word vectors spread around it; a document takes 1-3 topics (Zipf popularity,
so popular topics are shared by many documents) and 1-4 units (the pipeline's segments), each
unit's tokens drawn from its document's topics' words (Zipf over words) or, with probability
``background``, from a pool of background words every document shares (stop words), plus
noise. A query takes 1-2 topics of a random document and draws its 8-32 tokens the same way. So
a query's exact top-10 documents are ranked by how many of its words they hold, among the many
documents sharing its topics: near-ties, not one cluster per document. Shapes vary tokens per
unit (16-256), units per document, d (64 / 128), topics (50-2000) and the spread of words.

**What is measured**: the exact top-Kd documents (Kd = 10, ``PipelineConfig.kd``; a document's
score is its best unit's MaxSim, as the recall stage ranks them) against what the prefilter
finds, through :meth:`colgraph_engine.prefilter.PrefilterIndex.search_adaptive` with the recall
stage's arguments (items grouped by document, the exact stage on the original vectors, the
default :class:`~colgraph_engine.prefilter.adaptive.Budget`), over a prefilter built as the index
builds a carried one (``PrefilterIndex.build`` defaults, nbits 2). Beside it, the budget the
pipeline used before (PLAID's settings for ``max(prefilter_units, kd)`` = 64 units, the exact
stage on the store). Speed: exact MaxSim over every unit (the pipeline's exact path, ``ops.maxsim``)
against the adaptive search, timed alternately (3 repeats each, medians), for all queries in
one call and for single queries (the first 16, one call each); ``x exact`` = exact time / ours.
The size sweep (one shape at 1.5k-10k documents) places ``PipelineConfig.prefilter_min_tokens``.

**Pages**: MiniLM token vectors of the MMLongBench-Doc dev pages (``benchmarks/prefilter_pages.py``
encodes and caches them; read from ``../shared/data/mmlongbench-dev`` when present, skipped
and said so otherwise), each page a document, the dataset's questions as queries.

Built prefilters are cached under ``benchmarks/.cache/recall_default/`` (keyed by the shape).
Writes ``results/recall_default.md`` and ``.json`` (``recall_default_quick.*`` with ``--quick``).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import statistics
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
CACHE = HERE / ".cache" / "recall_default"
KD = 10

import _harness as h  # noqa: E402


@dataclasses.dataclass
class TopicCorpus:
    """Packed unit vectors ``values [T, d]`` / ``offsets [U+1]``, the document of each unit
    ``unit_doc [U]`` (ascending), and packed queries."""
    values: torch.Tensor
    offsets: torch.Tensor
    unit_doc: np.ndarray
    n_docs: int
    queries: torch.Tensor
    q_offsets: torch.Tensor


def _zipf(n: int, a: float, rng, shuffle: bool = False) -> np.ndarray:
    p = 1.0 / np.arange(1, n + 1) ** a
    p /= p.sum()
    if shuffle:
        rng.shuffle(p)
    return p


def topic_corpus(n_docs: int, *, dim: int = 128, n_topics: int = 200, unit_tokens=(16, 64), units_per_doc=(1, 4),
                 topics_per_doc=(1, 3), words_per_topic: int = 48, word_spread: float = 0.9,
                 token_noise: float = 0.35, background: float = 0.15, n_background: int = 64,
                 topic_zipf: float = 0.8, word_zipf: float = 1.0, n_queries: int = 64, query_tokens=(8, 32),
                 query_topics=(1, 2), seed: int = 0) -> TopicCorpus:
    """A clustered corpus with topics shared across documents (see the module docstring).
    Word vectors are ``normalize(centre + word_spread * g / sqrt(d))``, tokens
    ``normalize(word + token_noise * g / sqrt(d))`` (g standard normal); deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    mu = F.normalize(torch.randn(n_topics, dim, generator=g), dim=-1)
    spread = word_spread / dim ** 0.5 * torch.randn(n_topics, words_per_topic, dim, generator=g)
    words = F.normalize(mu[:, None] + spread, dim=-1)
    bg = F.normalize(torch.randn(n_background, dim, generator=g), dim=-1)
    pt = _zipf(n_topics, topic_zipf, rng, True)
    pw, pb = _zipf(words_per_topic, word_zipf, rng), _zipf(n_background, word_zipf, rng)
    kmax = topics_per_doc[1]
    doc_topics = rng.choice(n_topics, (n_docs, kmax), p=pt)
    doc_k = rng.integers(topics_per_doc[0], kmax + 1, n_docs)
    n_units = rng.integers(units_per_doc[0], units_per_doc[1] + 1, n_docs)
    unit_doc = np.repeat(np.arange(n_docs), n_units)
    lengths = rng.integers(unit_tokens[0], unit_tokens[1] + 1, unit_doc.size)
    tok_doc = np.repeat(unit_doc, lengths)

    def tokens(topic_rows, k_rows, owner):
        n = owner.size
        t = topic_rows[owner, (rng.random(n) * k_rows[owner]).astype(np.int64)]
        w = rng.choice(words_per_topic, n, p=pw)
        b = rng.choice(n_background, n, p=pb)
        is_bg = torch.from_numpy(rng.random(n) < background)[:, None]
        base = torch.where(is_bg, bg[torch.from_numpy(b)], words[torch.from_numpy(t), torch.from_numpy(w)])
        return F.normalize(base + token_noise / dim ** 0.5 * torch.randn(n, dim, generator=g), dim=-1)

    values = torch.cat([tokens(doc_topics, doc_k, tok_doc[a:a + 1 << 20]) for a in range(0, tok_doc.size, 1 << 20)])
    offsets = torch.zeros(unit_doc.size + 1, dtype=torch.int64)
    offsets[1:] = torch.from_numpy(np.cumsum(lengths))
    target = rng.integers(0, n_docs, n_queries)
    qk = np.minimum(rng.integers(query_topics[0], query_topics[1] + 1, n_queries), doc_k[target])
    qt = np.stack([doc_topics[d][rng.permutation(doc_k[d])].tolist() + [0] * (kmax - doc_k[d]) for d in target])
    qlen = rng.integers(query_tokens[0], query_tokens[1] + 1, n_queries)
    queries = tokens(qt, qk, np.repeat(np.arange(n_queries), qlen))
    qo = torch.zeros(n_queries + 1, dtype=torch.int64)
    qo[1:] = torch.from_numpy(np.cumsum(qlen))
    return TopicCorpus(values, offsets, unit_doc, n_docs, queries, qo)


# name -> topic_corpus arguments. Recall shapes hold about 120k-250k tokens (a few thousand
# documents: k-means there takes a minute or two here); the speed shapes 10,000 documents.
SHAPES = {
    "topics-50": dict(n_docs=3000, n_topics=50, unit_tokens=(16, 48)),
    "topics-1000": dict(n_docs=1500, n_topics=1000, unit_tokens=(16, 48)),
    "topics-2000-d64": dict(n_docs=3000, n_topics=2000, dim=64, unit_tokens=(16, 48)),
    "long-units": dict(n_docs=1000, n_topics=200, unit_tokens=(128, 256), units_per_doc=(1, 1)),
    "one-unit-tight": dict(n_docs=4000, n_topics=500, unit_tokens=(16, 64), units_per_doc=(1, 1), word_spread=0.6),
}
SWEEP = {  # the size sweep of one shape (topics-1000), for the prefilter_min_tokens threshold
    "topics-1000-2.5k": dict(n_docs=2500, n_topics=1000, unit_tokens=(16, 48)),
    "topics-1000-5k": dict(n_docs=5000, n_topics=1000, unit_tokens=(16, 48)),
    "topics-1000-10k": dict(n_docs=10000, n_topics=1000, unit_tokens=(16, 48)),
}
SPEED = {"topics-200-d64-10k": dict(n_docs=10000, n_topics=200, dim=64, unit_tokens=(16, 64), units_per_doc=(1, 3))}
QUICK = {
    "quick-topics-100": dict(n_docs=400, n_topics=100, unit_tokens=(16, 32), n_queries=24),
    "quick-long-d64": dict(n_docs=200, n_topics=40, dim=64, unit_tokens=(64, 128), units_per_doc=(1, 1), n_queries=24),
}


def shape_key(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


def prefilter_for(name: str, params: dict, corpus: TopicCorpus, cache: bool = True):
    """``(PrefilterIndex built with the defaults a carried prefilter uses, build seconds or None when cached)``."""
    from colgraph_engine.prefilter import PrefilterIndex
    f = CACHE / f"{name}-{shape_key(params)}.pt"
    if cache and f.is_file():
        return PrefilterIndex(torch.load(f, weights_only=False)), None
    idx, took = h.timed(PrefilterIndex.build, corpus.values, corpus.offsets, nbits=2)
    if cache:
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.save(idx.snapshot(), f)
    return idx, took


def exact_top(values, offsets, unit_doc, n_docs, queries, q_offsets, k=KD):
    """``(doc ids [Nq, k], doc scores [Nq, k])`` of exact MaxSim, a document's best unit."""
    from colgraph_engine import ops
    ex = ops.maxsim(queries, q_offsets, values, offsets, assume_finite=True)
    nq = q_offsets.numel() - 1
    col = torch.from_numpy(unit_doc)
    best = torch.full((nq, n_docs), float("-inf")).scatter_reduce(1, col.expand(nq, -1), ex, "amax")
    top = torch.topk(best, min(k, n_docs), dim=1)
    return top.indices, top.values


def _recall(found: list[set], want: torch.Tensor) -> list[float]:
    return [len(f & set(w.tolist())) / w.numel() for f, w in zip(found, want)]


def speed_against_exact(exact_fn, ours_fn, nq: int, repeats: int) -> dict:
    """Exact against ours, interleaved (``_harness.paired``, medians of `repeats`): all queries in one
    call (ms per query) and the first 16 queries one call each. ``exact_fn(a, b)`` / ``ours_fn(a, b)``
    search queries ``[a, b)``."""
    batch = h.paired({"exact": lambda: exact_fn(0, nq), "ours": lambda: ours_fn(0, nq)}, repeats, warmup=0)
    single: dict[str, list[float]] = {"exact": [], "ours": []}
    for q in range(min(16, nq)):
        for name, secs in h.paired({"exact": lambda: exact_fn(q, q + 1), "ours": lambda: ours_fn(q, q + 1)},
                                   repeats, warmup=0).items():
            single[name] += secs
    me, mp = statistics.median(batch["exact"]), statistics.median(batch["ours"])
    se, sp = statistics.median(single["exact"]), statistics.median(single["ours"])
    return dict(batch_ms_exact=me / nq * 1e3, batch_ms_ours=mp / nq * 1e3, batch_x=me / mp,
                single_ms_exact=se * 1e3, single_ms_ours=sp * 1e3, single_x=se / sp)


def measure(name: str, params: dict | None, corpus: TopicCorpus, idx, *, speed: bool = True, repeats: int = 3,
            plaid: bool = True, groups: np.ndarray | None = None) -> dict:
    """Recall of the exact top-Kd documents and (with `speed`) the time against exact, one corpus."""
    from colgraph_engine import ops
    xv, xo, qv, qo = corpus.values, corpus.offsets, corpus.queries, corpus.q_offsets
    nq = qo.numel() - 1
    unit_doc = corpus.unit_doc if groups is None else groups
    col = torch.from_numpy(unit_doc)
    want, want_s = exact_top(xv, xo, unit_doc, corpus.n_docs, qv, qo)

    def rescore(bv, bq, pq, ids):
        co = torch.zeros(bq.numel(), dtype=torch.int64)
        torch.cumsum(torch.bincount(pq, minlength=bq.numel() - 1), 0, out=co[1:])
        return ops.maxsim_candidates(bv, bq, xv, xo, co, ids, assume_finite=True)

    def ours(a=0, b=nq):
        return idx.search_adaptive(qv[int(qo[a]):int(qo[b])], qo[a:b + 1] - qo[a], KD, groups=unit_doc,
                                   rescore=rescore, assume_finite=True)

    def exact(a, b):
        return exact_top(xv, xo, unit_doc, corpus.n_docs, qv[int(qo[a]):int(qo[b])], qo[a:b + 1] - qo[a])

    res = ours()
    found = []
    for q in range(nq):
        ids = torch.from_numpy(res.ids[res.offsets[q]:res.offsets[q + 1]])
        sc = torch.from_numpy(res.scores[res.offsets[q]:res.offsets[q + 1]])
        best = torch.full((corpus.n_docs,), float("-inf")).scatter_reduce(0, col[ids], sc, "amax")
        found.append(set(torch.topk(best, min(KD, corpus.n_docs)).indices.tolist()))
    rec = _recall(found, want)
    st = res.stats
    out = {"name": name, "params": params, "documents": corpus.n_docs, "units": int(xo.numel() - 1),
           "tokens": int(xv.shape[0]), "dim": int(xv.shape[1]), "queries": nq, "centroids": idx.snapshot().n_centroids,
           "build_mse": round(idx.snapshot().build_mse, 4), "recall": float(np.mean(rec)),
           "recall_min": float(min(rec)),
           "queries_below_1": int(sum(r < 1 for r in rec)),
           "candidates": float(np.mean(st["candidates"])), "scored_exactly": float(np.mean(st["scored_exactly"])),
           "scored_share": float(np.mean(st["scored_exactly"])) / max(1, int(xo.numel() - 1)),
           "ncells_mean": float(np.mean(st["ncells"])), "ncells_max": int(max(st["ncells"])),
           "stops": {k: int(v) for k, v in zip(*np.unique(st["stop"], return_counts=True))},
           "exhaustive": int(sum(st["exhaustive"])), "kth_gap_median": float((want_s[:, 0] - want_s[:, -1]).median())}
    if plaid:  # the pipeline's budget before the adaptive one: PLAID's settings for 64 units
        r = idx.search(qv, qo, min(64, int(xo.numel() - 1)), rescore=rescore, assume_finite=True)
        ids, sc = r.ids, torch.where(r.ids >= 0, r.scores, float("-inf"))
        best = torch.full((nq, corpus.n_docs), float("-inf")).scatter_reduce(1, col[ids.clamp(min=0)], sc, "amax")
        top = torch.topk(best, min(KD, corpus.n_docs), dim=1).indices
        out["recall_plaid64"] = float(np.mean(_recall([set(x.tolist()) for x in top], want)))
    if speed:
        out.update(speed_against_exact(exact, ours, nq, repeats))
    return out


def pages_corpus(data: pathlib.Path) -> TopicCorpus | None:
    """The MMLongBench-Doc dev pages as a corpus (each page a document), or None when absent."""
    if not (data / "samples.json").is_file() and not (HERE / ".cache" / "prefilter_pages" / "vectors.pt").is_file():
        return None
    import prefilter_pages
    (pv, po), (qv, qo), info = prefilter_pages.encode(data)
    n = po.numel() - 1
    return TopicCorpus(pv.float(), po, np.arange(n), n, qv.float(), qo)


SECTIONS = {"shapes": "Corpus shapes (recall at the defaults)",
            "sweep": "Size sweep (topics-1000) and 10k-document shapes", "pages": "Real page tokens"}
COLUMNS = [("corpus", "name"), ("docs:", lambda r: f"{r['documents']:,}"), ("units:", lambda r: f"{r['units']:,}"),
           ("tokens:", lambda r: f"{r['tokens']:,}"), ("d:", "dim"), ("centroids:", lambda r: f"{r['centroids']:,}"),
           ("recall@10:", lambda r: f"{r['recall']:.4f}"), ("min:", lambda r: f"{r['recall_min']:.1f}"),
           ("plaid-64:", lambda r: f"{r.get('recall_plaid64', float('nan')):.4f}"),
           ("scored exactly:", lambda r: f"{r['scored_exactly']:.0f}"),
           ("share:", lambda r: f"{r['scored_share']:.3f}"),
           ("ncells (mean / max)", lambda r: f"{r['ncells_mean']:.1f} / {r['ncells_max']}"),
           ("batch ms/q exact:", lambda r: h.fmt(r.get("batch_ms_exact"), ".2f", "")),
           ("ours:", lambda r: h.fmt(r.get("batch_ms_ours"), ".2f", "")),
           ("x exact:", lambda r: h.fmt(r.get("batch_x"), ".2f", "")),
           ("single ms exact:", lambda r: h.fmt(r.get("single_ms_exact"), ".2f", "")),
           ("ours:", lambda r: h.fmt(r.get("single_ms_ours"), ".2f", "")),
           ("x exact:", lambda r: h.fmt(r.get("single_x"), ".2f", ""))]


def to_markdown(rep: dict) -> list[str]:
    """The report's body (the harness adds title and environment header)."""
    L = ["Every number below comes from this one run.", "",
         "Recall: share of each query's exact top-10 documents (best-unit MaxSim) that the prefilter finds, "
         "through `PrefilterIndex.search_adaptive` as the recall stage calls it (items grouped by document, exact "
         "stage on the original vectors, the default `adaptive.Budget`), over a prefilter built with the defaults "
         "of a carried one (nbits 2). *plaid-64*: the budget the pipeline used before (PLAID's k <= 100 "
         "settings for 64 units). Speed: exact MaxSim over every unit vs ours, alternated, medians of 3; "
         "batch = all queries in one call, single = 16 one-query calls.", ""]
    for key, title in SECTIONS.items():
        if rep[key]:
            L += [f"## {title}", "", *h.table(COLUMNS, rep[key]), ""]
    return L + h.section("Reading", reading(rep)) + h.section("Notes", rep["notes"])


def reading(rep: dict) -> list[str]:
    """What the tables say (computed from them)."""
    rows = rep["shapes"] + rep["sweep"] + rep["pages"]
    if not rows:
        return []
    lo = min(rows, key=lambda r: r["recall"])
    out = [f"Recall of the exact top-{KD} documents at the defaults: {lo['recall']:.4f} at the lowest "
           f"({lo['name']}), >= 0.98 on {sum(r['recall'] >= 0.98 for r in rows)} of {len(rows)} corpora; the former "
           f"budget (plaid-64) {min(r.get('recall_plaid64', 1.0) for r in rows):.4f} at its lowest. Queries below "
           f"recall 1: {sum(r['queries_below_1'] for r in rows)} of {sum(r['queries'] for r in rows)}; a query's "
           f"lowest recall is a flat tail (a few strong documents, then many near-equal weak ones)."]
    big = [r for r in rows if r["documents"] >= 10_000 and "batch_x" in r]
    if big:
        out.append("At 10,000 documents: " + "; ".join(
            f"{r['name']} {r['batch_x']:.2f}x exact for a batch of {r['queries']}, {r['single_x']:.2f}x one query at a "
            f"time, {r['scored_share']:.1%} of the units scored exactly" for r in big) + ".")
    sweep = sorted((r for r in rep["sweep"] if r["dim"] == 128 and "batch_x" in r), key=lambda r: r["tokens"])
    small = [r for r in rep["shapes"] if r["dim"] == 128 and "batch_x" in r]
    if sweep:
        pts = sorted(small + sweep, key=lambda r: r["tokens"])
        out.append("Exact vs ours by size (d = 128): " + ", ".join(
            f"{r['tokens'] / 1000:.0f}k tokens batch {r['batch_x']:.2f}x / single {r['single_x']:.2f}x" for r in pts)
            + ". One query at a time the prefilter wins from the smallest sizes here; in batches exact MaxSim "
              "amortises each document token over the queries and wins up to about 200k-250k tokens: "
              "`PipelineConfig.prefilter_min_tokens` = 2^18 (262,144) sits there (a query's path may not depend "
              "on its batch).")
    out.append("The budget's rule and constants: `colgraph_engine/prefilter/adaptive.py` (module docstring); the "
               "recall stage calls it through `PrefilterIndex.search_adaptive` with the items grouped by document.")
    return out


def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--data", default=str(HERE.parent.parent / "shared" / "data" / "mmlongbench-dev"))
    p.add_argument("--no-cache", action="store_true", help="build every prefilter (do not read or write the cache)")
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--render", metavar="JSON", help="only re-render the markdown of a run's JSON")
    return p.parse_args(argv)


def plan(quick: bool) -> list[tuple[str, str, dict | None]]:
    """``(section, corpus name, topic_corpus arguments or None for the pages)`` of one run."""
    out = [("shapes", n, p) for n, p in (QUICK if quick else SHAPES).items()]
    if not quick:
        out += [("sweep", n, p) for n, p in {**SWEEP, **SPEED}.items()] + [("pages", "mmlongbench-dev pages", None)]
    return out


def write(rep: dict, out, stem: str, e: dict, command: str) -> None:
    title = f"Default document recall: recall of the exact top-{KD} and speed against exact ({e['timestamp']})"
    h.write(stem, title, to_markdown(rep), rep, out, e=e, command=command)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.render:  # the markdown again from a run's JSON
        path = pathlib.Path(args.render)
        rep = json.loads(path.read_text())
        e, command = rep.pop("env"), rep.pop("command")
        write(rep, path.parent, path.stem, e, command)
        return 0
    torch.set_num_threads(args.torch_threads)
    e = h.env()
    rep = {"shapes": [], "sweep": [], "pages": [], "notes": []}
    for section, name, params in tqdm(plan(args.quick), desc="corpora", unit="corpus"):
        if params is None:
            corpus = pages_corpus(pathlib.Path(args.data))
            if corpus is None:
                rep["notes"].append(f"pages: {args.data} absent (and no cached vectors): not measured")
                continue
            cache_params = {"pages": str(args.data), "tokens": int(corpus.values.shape[0])}
        else:
            corpus, cache_params = topic_corpus(**params), params
        idx, took = prefilter_for(name.replace(" ", "_"), cache_params, corpus, cache=not args.no_cache)
        row = measure(name, params, corpus, idx)
        row["build_s"] = took
        rep[section].append(row)
        tqdm.write(f"{name}: recall {row['recall']:.4f} (plaid-64 {row.get('recall_plaid64', float('nan')):.4f}), "
                   f"batch x{row.get('batch_x', float('nan')):.2f}, single x{row.get('single_x', float('nan')):.2f}")
    write(rep, args.out, h.stem("recall_default", args), e, h.command_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
