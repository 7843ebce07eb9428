"""Pipeline latency report: ``Pipeline.retrieve`` / ``retrieve_batch`` on synthetic indexes of growing size.

Usage (from the repository root)::

    .venv/bin/python benchmarks/pipeline_report.py                         # 1k, 10k, 100k documents
    .venv/bin/python benchmarks/pipeline_report.py --sizes 1000,10000 --quick

Corpus (see "Corpus" below): per document 5 segments of 40-80 words from a fixed vocabulary,
10 entities (2 from a shared pool, so alias groups span about 40 documents) and 10 relations as
LightRAG records, one 32x32 image with a 2-3 object scene graph, a scene relation and region
matches. Graphs are built by ``build_document_graph`` and embedded by ``Encoders.offline()``
(hashing text encoder d=128, one token vector per word; 8x8 pixel patches, d=48) through
``KnowledgeIndex.add_documents``; built indexes are cached under ``benchmarks/.cache/`` with
``KnowledgeIndex.save`` and reopened with ``KnowledgeIndex.open`` on later runs. A size whose
index would not fit in memory (estimated from a sample: resident vectors x the peak factor of
building or opening) is replaced by the largest multiple of 5,000 documents that fits; the
report says so.

Questions (seeded): "What is the relation between A and B?" for a relation of a random
document, and "Which photo shows the <object> of <Entity>?" for a matched object of a random
document's image, alternating. Text only (no query images).

Timed path: query encoding is excluded. The pipeline encodes inside each call and times it as
``timings["encode"]``; end-to-end latency here is the call's wall time minus that (so it
includes the seven stages and the assembly of the Result objects, shown as ``results``). The
offline encoders are timed apart, once over all questions (row ``encode``).

Rows, per index size (default config: Kd 10, Kg 10, l 1, filter default, maxsim visual ranker):

* single: ``retrieve(q)`` one at a time over ``--queries`` questions after ``--warmup`` calls;
  p50 / p99 of per-query latency, QPS = queries / summed latency;
* batch B (16, 64): ``retrieve_batch`` over ``--batches`` batches of B questions; latency of a
  query in a batch = the batch's wall time (every query waits for its batch), QPS = queries /
  summed batch time; ratio = batched QPS / single QPS;
* per-stage: median seconds per stage per query (batch stage times / B).

Before timing, every batched result is checked against ``retrieve`` of the same question
(recalled document ids and ranked image nodes must be equal). Sweep at the smallest size:
Kd in {5, 10, 20, 40}, Kg in {5, 10, 20}, l in {0, 1, 2, 3} (one at a time from the
defaults), filter in {default, mkg, off}, visual ranker in {maxsim, pooled, off}; p50 of single
queries each. Memory: peak RSS growth (``VmHWM`` after resetting it through
``/proc/self/clear_refs``) of one batch of 64 vs one batch of 1 at the largest size.

Threads: torch's intra-op pool is set to ``--torch-threads`` (default 1: on a shared 2-core
machine a second OpenMP thread stalls every small torch op when the other core is busy), and
native kernels / graph calls use ``COLGRAPH_NUM_THREADS`` (default: all usable cores).

Writes ``results/pipeline_latency.md``, ``.json`` and ``.png`` beside this file (or ``--out``).
"""
from __future__ import annotations

import gc
import json
import os
import pathlib
import random
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _harness as h  # noqa: E402

if __name__ == "__main__":  # native kernels and graph calls: every usable core unless told otherwise
    os.environ.setdefault("COLGRAPH_NUM_THREADS", str(h.usable_cores()))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import colgraph_engine as cg  # noqa: E402
from colgraph_engine.kg import DocumentInput, Encoders, ImageInput, KnowledgeIndex, Segment  # noqa: E402
from colgraph_engine.pipeline import STAGES, Pipeline, PipelineConfig  # noqa: E402

CORPUS_VERSION = 1  # bump when the generator changes (invalidates the cache)
TIMED = STAGES + ("results",)   # what the end-to-end latency is made of
ROUND_TO = 5000                 # a size that does not fit is lowered to a multiple of this

# ------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------

SYLLABLES = ["ka", "to", "mi", "ra", "shi", "no", "be", "lu", "den", "vor", "an", "el", "sa", "qu", "ri", "zo",
             "mar", "tel", "os", "py", "gan", "dri", "hu", "fe"]
TYPES = ["person", "organization", "location", "event", "technology", "artifact"]
OBJECTS = ["mountain", "train", "bridge", "tower", "river", "car", "boat", "tree", "building", "statue", "flag",
           "dog", "cat", "bicycle", "lamp", "gate", "road", "ship", "plane", "horse", "clock", "bench", "sign",
           "helmet", "camera", "window", "door", "roof", "field", "cloud"]
PREDICATES = ["beside", "above", "below", "in front of", "behind", "near", "on"]
KEYWORDS = ["founded", "visited", "built", "crossed", "funded", "mapped", "joined", "opened", "studied", "owned",
            "led", "named after", "located in", "part of", "rival of"]
N_SEGMENTS = 5
N_ENTITIES = 10
N_RELATIONS = 10
N_SHARED_PER_DOC = 2
IMAGE_SIDE = 32


def _vocabulary(size: int = 2000, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    words = set()
    while len(words) < size:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


VOCAB = _vocabulary()


def _name(rng: random.Random) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
                    for _ in range(rng.randint(1, 2)))


def shared_names(n_docs: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"shared-{seed}")
    return [_name(rng) + " " + rng.choice(["Institute", "Station", "Company", "Museum", "Valley"])
            for _ in range(max(50, n_docs // 20))]


def _image_ref(j: int, n_images: int) -> str:
    return "photo" if n_images == 1 else f"photo-{j}"


def make_document(number: int, shared: list[str], seed: int = 0, *, n_images: int = 1, pixels: bool = True,
                  stream: str = "doc") -> DocumentInput:
    """Document ``doc-{number:06d}`` (see the module docstring). `n_images` images (one: named
    ``photo``; more: ``photo-<j>``, image j in segment j mod 5), with random pixels or none;
    `stream` names the random stream (another script draws another corpus from the same rules)."""
    rng = random.Random(f"{stream}-{seed}-{number}")
    names = rng.sample(shared, N_SHARED_PER_DOC)
    seen = {name.lower() for name in names}
    while len(names) < N_ENTITIES:
        name = _name(rng)
        if name.lower() not in seen:
            seen.add(name.lower())
            names.append(name)
    rng.shuffle(names)
    types = [rng.choice(TYPES) for _ in names]
    seg_of = [i % N_SEGMENTS for i in range(N_ENTITIES)]           # the segment that introduces entity i
    pairs = set()
    while len(pairs) < N_RELATIONS:
        a, b = rng.sample(range(N_ENTITIES), 2)
        if (b, a) not in pairs:
            pairs.add((a, b))
    relations = sorted(pairs)
    records = [[] for _ in range(N_SEGMENTS)]
    mentions = [[] for _ in range(N_SEGMENTS)]
    for i, name in enumerate(names):
        desc = f"{name} is a {types[i]} " + " ".join(rng.choices(VOCAB, k=8)) + "."
        records[seg_of[i]].append(f"entity<|#|>{name}<|#|>{types[i]}<|#|>{desc}")
        mentions[seg_of[i]].append(name)
    rel_kw = []
    for a, b in relations:
        s = max(seg_of[a], seg_of[b])
        kw = rng.choice(KEYWORDS)
        rel_kw.append(kw)
        desc = f"{names[a]} {kw} {names[b]} " + " ".join(rng.choices(VOCAB, k=6)) + "."
        records[s].append(f"relation<|#|>{names[a]}<|#|>{names[b]}<|#|>{kw}, {rng.choice(KEYWORDS)}<|#|>{desc}")
        mentions[s] += [names[a], names[b]]
    segments = []
    for s in range(N_SEGMENTS):
        target = rng.randint(40, 80)
        words: list[str] = []
        for name in dict.fromkeys(mentions[s]):
            words += [name] + rng.choices(VOCAB, k=rng.randint(3, 7))
        while sum(len(w.split()) for w in words) < target:
            words += rng.choices(VOCAB, k=rng.randint(4, 9)) + ["."]
        text = " ".join(words)
        refs = tuple(_image_ref(j, n_images) for j in range(n_images) if j % N_SEGMENTS == s)
        segments.append(Segment(text, refs, (s, s), len(text.split())))
    extractions = ["\n".join(r + ["<|COMPLETE|>"]) for r in records]
    images = []
    for j in range(n_images):
        # 2-3 objects, one scene relation, matches to entities 0..2 and the relation (0, 1) if any
        n_obj = rng.randint(2, 3)
        objs = rng.sample(OBJECTS, n_obj)
        boxes = []
        for _ in objs:
            x1, y1 = rng.uniform(0, 0.5), rng.uniform(0, 0.5)
            boxes.append((x1, y1, x1 + rng.uniform(0.2, 0.5), y1 + rng.uniform(0.2, 0.5)))
        scene = [f"<object-{k + 1}>: {o}, ({b[0]:.2f}, {b[1]:.2f}, {b[2]:.2f}, {b[3]:.2f})"
                 for k, (o, b) in enumerate(zip(objs, boxes))]
        scene.append(f"<relation-1>: <object-1> {rng.choice(PREDICATES)} <object-2>")
        a, b = rng.choice(relations)                                # the relation region depicts a relation
        depicted = [a, b] + rng.sample([e for e in range(N_ENTITIES) if e not in (a, b)], n_obj - 2)
        maps = [f'("mapping"|<image>|{names[depicted[0]].upper()}|8)']
        maps += [f'("mapping"|<object-{k + 1}>|{names[e].upper()}|9)' for k, e in enumerate(depicted)]
        maps.append(f'("mapping"|<relation-1>|{names[depicted[0]].upper()}|{names[depicted[1]].upper()}|7)')
        pix = None
        if pixels:
            pix_rng = np.random.default_rng(number * 7919 + seed + 104729 * j)
            pix = pix_rng.integers(0, 256, (IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
        caption = f"Photo of the {objs[0]} of {names[depicted[0]]} with a {objs[1]}"
        images.append(ImageInput(_image_ref(j, n_images), pix, "\n".join(scene), "##".join(maps) + "<|COMPLETE|>",
                                 caption=caption))
    return DocumentInput(f"doc-{number:06d}", segments=segments, title=f"Document {number}", images=images,
                         extractions=extractions)


def make_questions(n: int, n_docs: int, seed: int = 0, *, n_images: int = 1, stream: str = "") -> list[str]:
    """`n` questions naming entities (and objects) of random documents of a corpus of `n_docs`
    built by :func:`make_document` with `n_images` and random stream ``{stream}doc``."""
    rng = random.Random(f"{stream}questions-{seed}")
    shared = shared_names(n_docs, seed)
    out = []
    for i in range(n):
        doc = make_document(rng.randrange(n_docs), shared, seed, n_images=n_images, pixels=n_images == 1,
                            stream=f"{stream}doc")
        recs = [line.split("<|#|>") for text in doc.extractions for line in text.splitlines()]
        if i % 2 == 0 or not doc.images:
            rel = rng.choice([r for r in recs if r[0] == "relation"])
            out.append(f"What is the relation between {rel[1]} and {rel[2]}?")
        else:
            im = doc.images[0] if n_images == 1 else rng.choice(doc.images)
            objs = [line.split(": ", 1)[1].split(",")[0] for line in im.scene_graph.splitlines()
                    if line.startswith("<object-")]
            ents = [m.split("|")[2] for m in im.mappings.replace("<|COMPLETE|>", "").split("##")]
            k = rng.randrange(len(objs))
            entity = next(r[1] for r in recs if r[0] == "entity" and r[1].upper() == ents[k + 1])
            out.append(f"Which photo shows the {objs[k]} of {entity}?")
    return out


# ------------------------------------------------------------------------------------------
# Indexes
# ------------------------------------------------------------------------------------------

def vector_bytes(index: KnowledgeIndex) -> int:
    return sum(st.values.numel() * st.values.element_size() for st in index.stores.values())


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (8 GiB where it cannot be read)."""
    return h.proc_bytes("MemAvailable", "/proc/meminfo", 8 << 30)


def build_index(n_docs: int, encoders: Encoders, *, seed: int = 0, dtype=torch.float32, chunk: int = 5000,
                progress: bool = True) -> KnowledgeIndex:
    """An in-memory index of `n_docs` generated documents, built and encoded by the index
    (``add_documents`` with the index's encoders), `chunk` documents per call."""
    index = KnowledgeIndex(encoders, dtype=dtype)
    shared = shared_names(n_docs, seed)
    bar = tqdm(total=n_docs, desc=f"building {n_docs:,} documents", unit="doc", disable=not progress)
    for lo in range(0, n_docs, chunk):
        docs = [make_document(i, shared, seed) for i in range(lo, min(n_docs, lo + chunk))]
        index.add_documents(docs)
        bar.update(len(docs))
    bar.close()
    return index


def cache_path(cache: pathlib.Path, n_docs: int, seed: int, dtype) -> pathlib.Path:
    return cache / f"pipeline-n{n_docs}-seed{seed}-{str(dtype).replace('torch.', '')}-v{CORPUS_VERSION}"


def is_cached(cache: pathlib.Path | None, n_docs: int, seed: int, dtype) -> bool:
    return cache is not None and (cache_path(cache, n_docs, seed, dtype) / "manifest.json").exists()


def bytes_per_document(encoders: Encoders, dtype, seed: int) -> float:
    sample = build_index(200, encoders, seed=seed, dtype=dtype, progress=False)
    return vector_bytes(sample) / 200


# Peak memory, as a multiple of the resident vector bytes R, measured at 10,000 documents of this
# corpus on the report's machine (VmHWM): building with add_documents 1.85x (stores grow by
# doubling), KnowledgeIndex.save 3.15x (every document's vectors are copied out, then
# concatenated into the part, beside the stores), KnowledgeIndex.open 2.3x (the part is read,
# then concatenated, then copied into the stores). A little margin is added to each.
BUILD_PEAK, SAVE_PEAK, OPEN_PEAK = 2.0, 3.4, 2.5


def plan_size(n_docs: int, per_doc: float, budget: int, cached: bool) -> str | None:
    """How an index of `n_docs` can come to be within `budget` bytes: "open", "build+save",
    "build" (in memory, not cached), or None when it does not fit at all."""
    r = n_docs * per_doc
    if cached and r * OPEN_PEAK <= budget:
        return "open"
    if r * SAVE_PEAK <= budget:
        return "build+save"
    if r * BUILD_PEAK <= budget:
        return "build"
    return None


def choose_sizes(sizes: list[int], per_doc: float, budget: int, cache, args, dtype) -> tuple[dict, list[str]]:
    """``({documents: plan_size}, notes)``: each size that fits as asked, each that does not
    lowered to the largest multiple of ``ROUND_TO`` that does (with a note saying so)."""
    chosen, notes = {}, []
    for n in sizes:
        how = plan_size(n, per_doc, budget, is_cached(cache, n, args.seed, dtype))
        if how is not None:
            chosen[n] = how
            continue
        k = int(budget / (per_doc * BUILD_PEAK)) // ROUND_TO * ROUND_TO
        gib = n * per_doc / 2**30
        notes.append(f"{n:,} documents do not fit: {per_doc / 1024:.0f} KiB of vectors per document "
                     f"({args.dtype}) x {n:,} = {gib:.1f} GiB resident, at least {gib * BUILD_PEAK:.0f} GiB at "
                     f"the peak of building the index ({gib * SAVE_PEAK:.0f} GiB to save it, {gib * OPEN_PEAK:.0f} "
                     f"GiB to open it), with {budget / 2**30:.1f} GiB usable ({args.memory_fraction:.0%} of "
                     f"MemAvailable); ran {k:,} documents instead (the largest multiple of {ROUND_TO:,} that fits).")
        if k > 0:
            chosen.setdefault(k, plan_size(k, per_doc, budget, is_cached(cache, k, args.seed, dtype)))
    return chosen, notes


def load_or_build(n_docs: int, encoders: Encoders, cache: pathlib.Path | None, *, seed: int, dtype,
                  save: bool = True, progress: bool = True) -> tuple[KnowledgeIndex, dict]:
    """The index of `n_docs` documents, from the cache when it holds one; ``(index, how)``."""
    path = cache_path(cache, n_docs, seed, dtype) if cache is not None else None
    gc.collect()
    before = h.proc_bytes("VmRSS")
    t0 = time.perf_counter()
    if path is not None and (path / "manifest.json").exists():
        index = KnowledgeIndex.open(path, encoders, verify=False, progress=progress)
        how = "opened from cache"
    else:
        index = build_index(n_docs, encoders, seed=seed, dtype=dtype, progress=progress)
        how = "built (add_documents with the offline encoders)"
        if path is not None and save:
            index.save(path, overwrite=True)
            how += ", saved to cache"
        elif path is not None:
            how += ", not cached (saving would not fit in memory)"
    secs = time.perf_counter() - t0
    t1 = time.perf_counter()
    index.graph  # noqa: B018 - assemble the merged graph now, not in the first query
    assemble = time.perf_counter() - t1
    gc.collect()
    info = {"documents": n_docs, "how": how, "path": None if path is None else str(path), "load_s": secs,
            "assemble_s": assemble, "vector_bytes": vector_bytes(index),
            "rss_growth_bytes": h.proc_bytes("VmRSS") - before, "counts": index.counts}
    return index, info


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------

def time_batches(pipe: Pipeline, batches: list[list[str]], batched: bool = True) -> dict:
    """Latency summary over `batches`: one ``retrieve_batch`` per batch (or, with `batched`
    False, ``retrieve`` of each batch's one question). A query's latency is its batch's wall time
    minus the pipeline's encode (every query of a batch waits for the whole batch); QPS = queries
    / summed latency; stage and encode times are medians per query (batch times / B)."""
    lat, walls, encode, stages = [], [], [], {s: [] for s in TIMED}
    for b in batches:
        t0 = time.perf_counter()
        rs = pipe.retrieve_batch(b) if batched else [pipe.retrieve(b[0])]
        wall = time.perf_counter() - t0
        t = rs[0].timings
        e2e = wall - t["encode"]
        lat += [e2e] * len(b)
        walls.append(e2e)
        encode.append(t["encode"] / len(b))
        st = {s: t.get(s, 0.0) / len(b) for s in STAGES}
        st["results"] = e2e / len(b) - sum(st.values())
        for s in TIMED:
            stages[s].append(st[s])
    a = np.asarray(lat)
    return {"queries": len(lat), "batch_size": len(batches[0]), "batches": len(batches),
            "p50_ms": 1e3 * float(np.percentile(a, 50)), "p99_ms": 1e3 * float(np.percentile(a, 99)),
            "mean_ms": 1e3 * float(a.mean()), "qps": len(lat) / sum(walls),
            "amortised_ms_per_query_p50": 1e3 * statistics.median(w / len(b) for w, b in zip(walls, batches)),
            "stage_ms_per_query": {s: 1e3 * statistics.median(v) for s, v in stages.items()},
            "pipeline_encode_ms_per_query": 1e3 * statistics.median(encode)}


def time_single(pipe: Pipeline, questions: list[str]) -> dict:
    """``retrieve`` one question at a time (:func:`time_batches` of batches of one)."""
    return time_batches(pipe, [[q] for q in questions], batched=False)


def signature(r) -> tuple:
    """What batched and single results must agree on: recalled documents and ranked image nodes."""
    return tuple(d for d, _ in r.documents), tuple(int(h.node) for h in r.images)


def check_batched(pipe: Pipeline, questions: list[str], batch_size: int) -> int:
    """Raises if ``retrieve_batch`` disagrees with ``retrieve``; returns the questions checked."""
    single = [signature(pipe.retrieve(q)) for q in questions]
    for lo in range(0, len(questions), batch_size):
        for i, r in enumerate(pipe.retrieve_batch(questions[lo:lo + batch_size])):
            if signature(r) != single[lo + i]:
                raise h.CorrectnessError(f"batch of {batch_size}: question {lo + i} ({questions[lo + i]!r}) "
                                         f"differs from retrieve(): {signature(r)} vs {single[lo + i]}")
    return len(questions)


def time_encoders(encoders: Encoders, questions: list[str]) -> dict:
    """The offline encoders alone, once over every question (what the pipeline's encode does:
    question tokens, pooled question vector, C_vis tokens)."""
    from colgraph_engine.pipeline import extract_visual_phrases
    t0 = time.perf_counter()
    encoders.tokens(questions)
    encoders.text(questions)
    encoders.tokens([extract_visual_phrases(q).text() for q in questions])
    secs = time.perf_counter() - t0
    return {"queries": len(questions), "seconds": secs, "ms_per_query": 1e3 * secs / len(questions)}


def peak_growth(fn) -> int | None:
    """Peak RSS growth while `fn` runs: VmHWM reset through /proc/self/clear_refs (Linux)."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    base = h.proc_bytes("VmRSS")
    fn()
    return h.proc_bytes("VmHWM") - base


def measure_memory(pipe: Pipeline, questions: list[str], n_nodes: int) -> dict:
    """Peak RSS growth (best of 2, after a warm call) of one batch of 1 and one of 64."""
    out = {}
    for b in (1, 64):
        qs = (questions * (64 // len(questions) + 1))[:b]
        pipe.retrieve_batch(qs)  # warm (caches, allocator)
        growth = [peak_growth(lambda: pipe.retrieve_batch(qs)) for _ in range(2)]
        out[f"batch_{b}_peak_rss_growth_bytes"] = None if None in growth else min(growth)
    g1, g64 = out["batch_1_peak_rss_growth_bytes"], out["batch_64_peak_rss_growth_bytes"]
    out["dense_nodes_x_64_float32_bytes"] = n_nodes * 64 * 4
    out["growth_ratio_64_vs_1"] = None if not g1 or g64 is None else g64 / max(g1, 1)
    return out


def run_size(pipe: Pipeline, questions: list[str], n_single: int, batch_sizes: tuple[int, ...], n_batches: int,
             warmup: int, check: int, progress: bool = True) -> dict:
    """Single and batched timings of one index (the report's core; see the module docstring)."""
    need = max([n_single] + [b * n_batches for b in batch_sizes])
    qs = (questions * (need // len(questions) + 1))[:need]
    out = {"checked_batched_equal_single": check_batched(pipe, qs[:check], max(batch_sizes))}  # before timing
    for q in qs[:warmup]:
        pipe.retrieve(q)
    out["single"] = time_single(pipe, qs[:n_single])
    for b in tqdm(batch_sizes, desc="timing batches", leave=False, disable=not progress):
        pipe.retrieve_batch(qs[:b])  # warm-up batch
        res = time_batches(pipe, [qs[i * b:(i + 1) * b] for i in range(n_batches)])
        out[f"batch_{b}"] = {**res, "ratio_qps_vs_single": res["qps"] / out["single"]["qps"]}
    return out


SWEEP = {"kd": (5, 10, 20, 40), "kg": (5, 10, 20), "hops": (0, 1, 2, 3), "filter": ("default", "mkg", "off"),
         "visual_ranker": ("maxsim", "pooled", "off")}  # one setting at a time, from the defaults


def sweep(index: KnowledgeIndex, encoders: Encoders, base: PipelineConfig, questions: list[str], warmup: int,
          progress: bool = True) -> list[dict]:
    """p50 / p99 / QPS and per-stage ms of single queries for each setting of :data:`SWEEP`."""
    rows = []
    for name, value in tqdm([(k, v) for k, vs in SWEEP.items() for v in vs], desc="sweep", disable=not progress):
        pipe = Pipeline(index, encoders, base.replace(**{name: value}))
        for q in questions[:warmup]:
            pipe.retrieve(q)
        res = time_single(pipe, questions)
        rows.append({"setting": name, "value": value,
                     **{k: res[k] for k in ("p50_ms", "p99_ms", "qps", "stage_ms_per_query")}})
    return rows


def core(index: KnowledgeIndex, encoders: Encoders, questions: list[str], *, config: PipelineConfig | None = None,
         n_single: int = 30, batch_sizes: tuple[int, ...] = (16, 64), n_batches: int = 2, warmup: int = 3,
         check: int = 16, memory: bool = False, progress: bool = False) -> dict:
    """Measures one index: encoders apart, single and batched runs, optionally memory; a JSON-ready dict."""
    config = config or PipelineConfig()
    pipe = Pipeline(index, encoders, config)
    out = {"documents": len(index.documents), "nodes": int(index.counts["nodes"]), "config": config.as_dict(),
           "encode": time_encoders(encoders, questions)}
    out.update(run_size(pipe, questions, n_single, batch_sizes, n_batches, warmup, check, progress))
    if memory:
        out["memory"] = measure_memory(pipe, questions, int(index.counts["nodes"]))
    return out


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

def machine_info() -> dict:
    """``_harness.env()`` plus the native backend and its float32 instruction set."""
    return h.env(native=cg.backends().get("native"), cpu_isa_float32=cg.backends().get("cpu_isa_float32"))


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def dominant(st: dict) -> str:
    """The stage that costs most in ``stage_ms_per_query`` `st`."""
    return max(TIMED, key=lambda s: st[s])


def _dominant_share(st: dict) -> str:
    return f"{dominant(st)} ({100 * st[dominant(st)] / max(sum(st.values()), 1e-12):.0f}%)"


def _dominant_ms(st: dict) -> str:
    return f"{dominant(st)} ({_ms(st[dominant(st)])} ms)"


def _timed_cell(how):
    """A cell of the end-to-end table, left empty on the encoders' row."""
    return lambda x: "" if "encode_ms" in x else how(x)


def modes(size: dict) -> list[dict]:
    """One size's single and batch rows, each with ``n`` (documents) and ``mode`` ("single", "batch 16")."""
    names = ["single"] + [k for k in size["result"] if k.startswith("batch_")]
    return [dict(size["result"][m], n=size["index"]["documents"], mode=m.replace("_", " ")) for m in names]


def to_markdown(rep: dict) -> list[str]:
    """The report's body (``_harness.write`` adds title and environment header)."""
    lines = [
        f"Settings: {json.dumps(rep['settings'])}", "", f"Config: {json.dumps(rep['config'])}", "",
        "Corpus per document: 5 segments x 40-80 words, 10 entities (2 shared across ~40 documents), "
        "10 relations (LightRAG records), 1 image 32x32 with a 2-3 object scene graph and region matches; "
        "embedded by `Encoders.offline()` through `add_documents` (no precomputed vectors). "
        "Latency excludes query encoding (timed apart: row *encode*); it includes the seven stages and the "
        "assembly of the Result objects (*results*). Batched rows: a query's latency is its batch's wall time.", "",
        *[f"**Size note:** {n}" for n in rep.get("size_notes") or []], *([""] if rep.get("size_notes") else []),
        "## Indexes", "", *h.table(
            [("documents:", lambda i: f"{i['documents']:,}"), ("nodes:", lambda i: f"{i['counts']['nodes']:,}"),
             ("edges:", lambda i: f"{i['counts']['edges']:,}"),
             ("vector MiB:", lambda i: f"{i['vector_bytes'] / 2**20:,.0f}"), ("how", "how"),
             ("load s:", lambda i: f"{i['load_s']:.1f}"), ("assemble s:", lambda i: f"{i['assemble_s']:.2f}"),
             ("RSS growth MiB:", lambda i: f"{i['rss_growth_bytes'] / 2**20:,.0f}")],
            [r["index"] for r in rep["sizes"]])]
    e2e = []
    for size in rep["sizes"]:  # each size's modes, then its encoders' row
        e = size["result"]["encode"]
        e2e += modes(size) + [{"n": size["index"]["documents"], "mode": "encode (offline encoders, apart)",
                               "queries": e["queries"], "encode_ms": e["ms_per_query"]}]
    lines += ["", "## End to end (encoders excluded)", "", *h.table(
        [("documents:", lambda x: f"{x['n']:,}"), ("mode", "mode"), ("queries:", "queries"),
         ("p50 ms:", lambda x: f"{_ms(x['encode_ms'])} per query" if "encode_ms" in x else _ms(x["p50_ms"])),
         ("p99 ms:", _timed_cell(lambda x: _ms(x["p99_ms"]))),
         ("QPS:", _timed_cell(lambda x: f"{x['qps']:,.1f}")),
         ("QPS vs single:", _timed_cell(lambda x: f"{x.get('ratio_qps_vs_single', 1.0):.2f}x")),
         ("amortised ms/query:", _timed_cell(lambda x: _ms(x.get("amortised_ms_per_query_p50", x["p50_ms"]))))],
         e2e)]
    if rep.get("targets"):
        lines += ["", "Targets at the smallest size: " + "; ".join(
            f"{k}: {v['value']:.2f} ({'met' if v['met'] else 'NOT met'}, target {v['target']})"
            for k, v in rep["targets"].items())]
    lines += ["", "## Per stage (median ms per query)", "", *h.table(
        [("documents:", lambda x: f"{x['n']:,}"), ("mode", "mode")]
        + [(f"{s}:", lambda x, s=s: _ms(x["stage_ms_per_query"][s])) for s in TIMED]
        + [("dominant:", lambda x: _dominant_share(x["stage_ms_per_query"]))],
        [m for size in rep["sizes"] for m in modes(size)])]
    if rep.get("sweep"):
        lines += ["", f"## Sweep at {rep['sweep_documents']:,} documents (single queries, one setting changed from "
                  "the defaults)", "", *h.table(
                      [("setting", "setting"), ("value", "value"), ("p50 ms:", lambda x: _ms(x["p50_ms"])),
                       ("p99 ms:", lambda x: _ms(x["p99_ms"])), ("QPS:", lambda x: f"{x['qps']:,.1f}"),
                       ("dominant stage", lambda x: _dominant_ms(x["stage_ms_per_query"]))], rep["sweep"])]
    mem = rep.get("memory")
    if mem:
        g1, g64 = mem["batch_1_peak_rss_growth_bytes"], mem["batch_64_peak_rss_growth_bytes"]
        lines += ["", f"## Memory at {rep['memory_documents']:,} documents", "",
                  f"Peak RSS growth of one call (VmHWM reset before it, best of 2): batch of 1: "
                  f"{g1 / 2**20:.1f} MiB; batch of 64: {g64 / 2**20:.1f} MiB. A dense float32 [n_nodes x 64] "
                  f"matrix would be {mem['dense_nodes_x_64_float32_bytes'] / 2**20:.1f} MiB."
                  if g1 is not None and g64 is not None else "Peak RSS could not be measured here."]
    if rep.get("findings"):
        lines += ["", "## Findings", ""] + [f"* {f}" for f in rep["findings"]]
    return lines


def _stack(ax, xs, stage_ms: list[dict], colors: dict, width=0.8, labels: bool = True) -> np.ndarray:
    """Bars at `xs` stacked by stage (``TIMED``) from each entry's ms per stage; the bars' tops."""
    bottom = np.zeros(len(stage_ms))
    for s in TIMED:
        hs = np.array([st[s] for st in stage_ms])
        ax.bar(xs, hs, width, bottom=bottom, color=colors[s], label=s if labels else None, edgecolor="white",
               linewidth=0.3)
        bottom += hs
    return bottom


def plot(rep: dict, path: pathlib.Path) -> None:
    """Left: ms per query stacked by stage per index size and mode; right: the Kd, Kg, l sweeps."""
    plt, note = h.matplotlib_or_note()
    if plt is None:
        print(note)
        return
    colors = dict(zip(TIMED, plt.get_cmap("tab10").colors))
    fig, axes = plt.subplots(1, 4, figsize=(18, 4.6))
    ax, sizes = axes[0], rep["sizes"]
    names = ["single"] + [k for k in sizes[0]["result"] if k.startswith("batch_")]
    width = 0.8 / len(names)
    for j, mode in enumerate(names):
        xs = np.arange(len(sizes)) + (j - (len(names) - 1) / 2) * width
        tops = _stack(ax, xs, [r["result"][mode]["stage_ms_per_query"] for r in sizes], colors, width * 0.95, j == 0)
        for x, y in zip(xs, tops):
            ax.text(x, y, mode.replace("batch_", "B"), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(np.arange(len(sizes)), [f"{r['index']['documents']:,}" for r in sizes])
    ax.set_yscale("log")
    ax.set(xlabel="documents in the index", ylabel="ms per query (median per stage, stacked)",
           title="cost vs index size (single, B16, B64)")
    ax.legend(fontsize=7, loc="upper left")
    for ax, name, title in zip(axes[1:], ("kd", "kg", "hops"), ("Kd (documents recalled)", "Kg (seeds)", "l (hops)")):
        rows = [s for s in rep.get("sweep", []) if s["setting"] == name]
        ax.set_visible(bool(rows))
        if rows:
            xs = [str(s["value"]) for s in rows]
            _stack(ax, xs, [r["stage_ms_per_query"] for r in rows], colors)
            ax.plot(xs, [r["p50_ms"] for r in rows], "k.--", label="p50 end to end")
            ax.set(xlabel=title, ylabel="ms per query",
                   title=f"vs {title.split(' ')[0]} at {rep['sweep_documents']:,} documents")
            ax.legend(fontsize=6, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--sizes", default="1000,10000,100000", help="comma-separated document counts")
    p.add_argument("--queries", type=int, default=40, help="single queries timed per size (after warm-up)")
    p.add_argument("--batches", type=int, default=2, help="batches timed per batch size")
    p.add_argument("--batch-sizes", default="16,64")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--sweep-queries", type=int, default=30)
    p.add_argument("--sweep-size", type=int, default=None, help="index size of the sweep (default: the smallest)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--memory-fraction", type=float, default=0.85, help="of MemAvailable an index may need at peak")
    p.add_argument("--cache", type=pathlib.Path, default=HERE / ".cache")
    p.add_argument("--no-cache", action="store_true")
    args = p.parse_args(argv)
    if args.quick:  # 200 documents, few queries, no cache (< 60 s)
        args.sizes, args.queries, args.batches, args.sweep_queries, args.warmup = "200", 8, 1, 6, 1
        args.batch_sizes, args.no_cache = "4,16", True
    return args


def targets(small: dict, n: int, big_b: str) -> dict:
    """The smallest size against the issue's targets: p50 <= 50 ms, batched / single QPS >= 4."""
    p50, ratio = small["single"]["p50_ms"], small[big_b]["ratio_qps_vs_single"]
    return {f"p50 ms at {n:,} docs": {"value": p50, "target": "<= 50", "met": p50 <= 50},
            f"{big_b} QPS / single QPS at {n:,} docs": {"value": ratio, "target": ">= 4", "met": ratio >= 4}}


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    dtype = getattr(torch, args.dtype)
    batch_sizes = tuple(int(b) for b in args.batch_sizes.split(","))
    encoders = Encoders.offline(text_dim=128)
    cache = None if args.no_cache else args.cache
    info = machine_info()
    t_start = time.perf_counter()
    per_doc = bytes_per_document(encoders, dtype, args.seed)
    chosen, notes = choose_sizes(sorted({int(s) for s in args.sizes.split(",") if s.strip()}), per_doc,
                                 int(available_memory() * args.memory_fraction),
                                 cache, args, dtype)
    sizes = sorted(chosen)
    for line in notes:
        tqdm.write("NOTE: " + line)
    n_questions = max([args.queries] + [b * args.batches for b in batch_sizes])
    settings = {"sizes": sizes, "requested_sizes": args.sizes, "quick": args.quick, "queries": args.queries,
                "batches": args.batches, "batch_sizes": list(batch_sizes), "warmup": args.warmup,
                "sweep_queries": args.sweep_queries, "seed": args.seed, "dtype": args.dtype,
                "torch_threads": args.torch_threads, "vector_bytes_per_document": per_doc,
                "encoders": encoders.describe()}
    rep = {"machine": info, "settings": settings, "config": PipelineConfig().as_dict(), "size_notes": notes,
           "sizes": []}
    sweep_n = args.sweep_size if args.sweep_size in sizes else sizes[0]
    for n in sizes:
        index, iinfo = load_or_build(n, encoders, cache, seed=args.seed, dtype=dtype, save=chosen[n] != "build")
        questions = make_questions(n_questions, n, args.seed)
        largest = n == sizes[-1]
        res = core(index, encoders, questions, n_single=args.queries, batch_sizes=batch_sizes,
                   n_batches=args.batches, warmup=args.warmup, check=min(len(questions), max(batch_sizes)),
                   memory=largest, progress=True)
        rep["sizes"].append({"index": iinfo, "result": res})
        if largest:
            rep["memory"], rep["memory_documents"] = res["memory"], n
        if n == sweep_n:
            rep["sweep"] = sweep(index, encoders, PipelineConfig(),
                                 make_questions(args.sweep_queries, n, args.seed + 1), args.warmup)
            rep["sweep_documents"] = n
        tqdm.write(f"{n:,} documents: single p50 {res['single']['p50_ms']:.1f} ms, QPS {res['single']['qps']:.1f}; "
                   + ", ".join(f"{k} QPS {v['qps']:.1f} ({v['ratio_qps_vs_single']:.2f}x)"
                               for k, v in res.items() if k.startswith("batch_")))
        del index
        gc.collect()
    rep["targets"] = targets(rep["sizes"][0]["result"], sizes[0], f"batch_{max(batch_sizes)}")
    rep["findings"] = []
    for r in rep["sizes"]:
        st = r["result"]["single"]["stage_ms_per_query"]
        rep["findings"].append(f"{r['index']['documents']:,} documents, single query: {dominant(st)} dominates "
                               f"({_ms(st[dominant(st)])} of {_ms(sum(st.values()))} ms).")
    rep["total_s"] = time.perf_counter() - t_start
    stem = h.stem("pipeline_latency", args)
    if h.write(stem, "Pipeline latency: Pipeline.retrieve / retrieve_batch on synthetic indexes", to_markdown(rep),
               rep, args.out, e=info) is not None:
        plot(rep, args.out / f"{stem}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
