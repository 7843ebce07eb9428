"""The retrieval pipeline on a GPU: ``Pipeline(index, device="cuda")`` latency and throughput.

Target (the issue's): GPU, 10k documents (100k images x 1,030 patches resident): p50 <= 10 ms,
>= 1,000 QPS in batches of 64.

Usage (from the repository root; on a lent GPU machine through ``benchmarks/run_gpu.sh --pipeline``)::

    python3 benchmarks/gpu_pipeline.py                         # 10,000 documents, 10 images each, 1,030 patches
    .venv/bin/python benchmarks/gpu_pipeline.py --quick --device cpu   # 40 documents, 2 images, 64 patches (< 60 s)

Index (synthetic, built in a few minutes, nothing encoded but text): per document 5 segments of
40-80 words (~60 tokens), 10 entities (2 from a shared pool, so alias groups span documents) and
10 relations as LightRAG records, and ``--images-per-doc`` images (default 10), each with a
2-3 object scene graph, one scene relation and region mappings to entities (so every image has
2-3 object regions and one relation region in the graph). Graphs come from
``build_document_graph``; vectors are precomputed and given to ``add_documents(graphs,
vectors=...)`` in chunks of ``--chunk`` documents:

* text side (segment tokens, entity and relation vectors, image and region text views): the
  hashing encoder's real vectors of the generated text (the same encoder the questions use, so
  recall and the seeds are meaningful); built and encoded in forked worker processes (``--workers``,
  default usable CPUs - 2) while the main process adds the previous chunk. Chosen over random
  vectors because it is cheap: about 2.5 ms of CPU per document for the graph and 2.5 ms for the
  text vectors (measured on 1,000 documents), i.e. seconds for 10k documents in 14 workers;
* image patches: ``--patches`` random unit vectors of d = 128 per image, bf16, drawn with torch
  from a seeded generator (on the GPU when ``--device cuda``, then copied to the host);
* region patches: the image's patches on the grid cells its bbox covers (a ``g x g`` grid,
  ``g = floor(sqrt(patches))``: 32 x 32 of the 1,030 ColPali-style patches; the 6 extra ones
  stand for special tokens and belong to no region).

Encoders: text = hashing (d = 128); tokens = ``"synthetic-li:queries"``, the hashing token
encoder under a late-interaction model's query name; patches = ``"synthetic-li:images"`` (d = 128;
never called: patches are precomputed and the questions carry no image). The names share the
space ``"synthetic-li"``, so stage 5 ranks images and regions by MaxSim of C_vis(q) tokens
against their patches (``image_units == "patches"``), the ColGraphRAG setting; the scores mean
nothing (random patches), only their cost does. Index dtype bfloat16.

Questions (seeded, text only): "What is the relation between A and B?" for a relation of a
random document and "Which photo shows the <object> of <Entity>?" for a mapped object of one of
its images, alternating.

Run, in order (one function per phase below, :func:`measure` calls them):

1. build the index (timed: document generation + graph building + text encoding in workers,
   patch generation, ``add_documents``; graph assembly apart);
2. ``Pipeline(index, encoders, PipelineConfig(), device=--device)`` and a CPU pipeline over the
   same index; warm-up (Triton compile and autotune) of batches of 1, 16 and 64;
3. correctness (:func:`check`): ``--check-queries`` (16) questions through both pipelines one at a
   time, results equal up to ties; the device pipeline's batches of 16 equal its singles. When one
   CPU query on the full index takes longer than ``--cpu-check-limit-s``, on a ``--check-docs``
   (500) document index built the same way instead (and the report says so);
4. timing on the device pipeline: ``--queries`` (200) single queries (p50 / p99 / QPS), then
   ``--batches`` batches of 16 and of 64 (QPS; a query's latency in a batch is the batch's
   wall time), per-stage medians (``Result.timings``), peak GPU memory
   (``torch.cuda.max_memory_allocated``: resident stores, and its growth over what was allocated
   before the batches of one size); ``torch.cuda.synchronize()`` around every timed call;
5. the same on the CPU pipeline for ``--cpu-queries`` (8) single queries and one batch of 16:
   the side-by-side ratio.

Latency excludes query encoding (the pipeline times it as ``timings["encode"]``; it is reported
apart), as ``pipeline_report.py`` does; it includes the seven stages and the Result assembly.

Writes ``gpu_pipeline.md`` and ``gpu_pipeline.json`` to ``--out`` (default ``benchmarks/results``;
``--quick`` writes ``gpu_pipeline_quick.*``), rewritten after every phase so a run cut short keeps
what it measured, and prints the report. ``--budget-s`` (480) bounds the run: single queries stop
after a third of what is left, the CPU side-by-side runs shrink to fit. Exit status 1 when the
correctness check failed; an exception is recorded in the report (``errors``, ``traceback``) and
raised.
"""
from __future__ import annotations

import gc
import json
import math
import multiprocessing as mp
import os
import pathlib
import statistics
import sys
import time
import traceback

HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
import _harness as h  # noqa: E402

if __name__ == "__main__":  # native kernels and graph calls: every usable core unless told otherwise
    os.environ.setdefault("COLGRAPH_NUM_THREADS", str(h.usable_cores()))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

import colgraph_engine as cg  # noqa: E402
from colgraph_engine.encoders import Encoder, HashingTextEncoder  # noqa: E402
from colgraph_engine.graph.kinds import NodeKind  # noqa: E402
from colgraph_engine.kg import DocumentInput, Encoders, KnowledgeIndex  # noqa: E402
from colgraph_engine.kg.document import build_document_graph  # noqa: E402
from colgraph_engine.kg.vectors import ItemVectors, encode_document  # noqa: E402
from colgraph_engine.pipeline import STAGES, Pipeline, PipelineConfig  # noqa: E402
from colgraph_engine.pipeline.query import as_query  # noqa: E402
from pipeline_report import shared_names  # noqa: E402
from pipeline_report import make_document as _cpu_document  # noqa: E402
from pipeline_report import make_questions as _cpu_questions  # noqa: E402

TIMED = STAGES + ("results",)
SPACE = "synthetic-li"
DIM = 128
TARGET_P50_MS, TARGET_QPS_64 = 10.0, 1000.0

# ------------------------------------------------------------------------------------------
# Encoders and corpus
# ------------------------------------------------------------------------------------------


def _patches_not_available(batch):
    raise RuntimeError("synthetic-li:images is a stand-in: image patches are precomputed and queries carry no image")


def make_encoders() -> tuple[Encoders, Encoders]:
    """``(index encoders, text-only encoders)``: the first names the roles as one late-interaction
    model (tokens ``synthetic-li:queries``, patches ``synthetic-li:images``) so images are ranked by
    patches; the second embeds the generated text (entity, relation, segment, text views)."""
    hashing = HashingTextEncoder(DIM)
    text, tok = hashing.text_encoder(), hashing.token_encoder()
    tokens = Encoder(tok.fn, f"{SPACE}:queries", DIM, "tokens")
    patches = Encoder(_patches_not_available, f"{SPACE}:images", DIM, "patches")
    return Encoders(text, tokens, patches), Encoders(text, tokens, None)


def make_document(number: int, shared: list[str], n_images: int, seed: int = 0) -> DocumentInput:
    """Document ``doc-{number:06d}``: pipeline_report's rules with `n_images` images without pixels
    (their patches are precomputed), from a random stream of its own."""
    return _cpu_document(number, shared, seed, n_images=n_images, pixels=False, stream="gpu-doc")


def make_questions(n: int, n_docs: int, n_images: int, seed: int = 0) -> list[str]:
    """`n` questions naming entities (and objects) of random documents of this corpus."""
    return _cpu_questions(n, n_docs, seed, n_images=n_images, stream="gpu-")


# --- workers: document generation, graph building and text encoding -------------------------

_W: dict = {}


def _worker_init() -> None:
    torch.set_num_threads(1)
    _W["text"] = make_encoders()[1]


def _build_one(task: tuple[int, int, int, int]):
    """``(graph, text-side vectors, seconds building, seconds encoding)`` of document `number`
    of a corpus of `n_docs` (task = ``(number, n_docs, n_images, seed)``)."""
    number, n_docs, n_images, seed = task
    if _W.get("key") != (n_docs, seed):
        _W.update(key=(n_docs, seed), shared=shared_names(n_docs, seed))
    if "text" not in _W:
        _W["text"] = make_encoders()[1]
    g, build_s = h.timed(lambda: build_document_graph(make_document(number, _W["shared"], n_images, seed)))
    v, encode_s = h.timed(encode_document, g, _W["text"])
    # numpy, not tensors: torch would pass each tensor between processes as a file descriptor
    v = {k: (x.local, x.values.to(torch.bfloat16).view(torch.int16).numpy(), x.offsets.numpy()) for k, x in v.items()}
    return g, v, build_s, encode_s


def _text_vectors(v: dict) -> dict[str, ItemVectors]:
    """What :func:`_build_one` returned for the text stores, as ItemVectors (bf16, no copy)."""
    return {k: ItemVectors(local, torch.from_numpy(values).view(torch.bfloat16), torch.from_numpy(offsets))
            for k, (local, values, offsets) in v.items()}


class GraphBuilder:
    """Builds documents' graphs and text vectors in `workers` processes (or in this one when
    `workers` <= 1). Start it before the main process does heavy threaded work or touches CUDA:
    the workers are forked."""

    def __init__(self, workers: int):
        self.workers, self.pool = workers, None
        if workers > 1:
            try:
                self.pool = mp.get_context("fork").Pool(workers, _worker_init)
            except (OSError, ValueError):  # no fork here: build in this process
                self.workers = 1

    def submit(self, numbers: list[int], n_docs: int, n_images: int, seed: int):
        """Starts building documents `numbers`; ``.get()`` returns their list (at once without workers)."""
        tasks = [(n, n_docs, n_images, seed) for n in numbers]
        if self.pool is None:
            done = [_build_one(t) for t in tasks]
            return type("Done", (), {"get": lambda self: done})()
        return self.pool.map_async(_build_one, tasks, chunksize=max(1, len(tasks) // (4 * self.workers)))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool, self.workers = None, 1


# --- patches: drawn per image, sliced per region ----------------------------------------------

def region_rows(boxes: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray]:
    """For regions with ``boxes [K, 4]`` (x1, y1, x2, y2 in [0, 1]; NaN: the whole image):
    ``(counts [K], rows [sum(counts)])``, the row-major indices of the ``grid x grid`` cells each
    box covers, concatenated (vectorised: no Python loop per region)."""
    k = boxes.shape[0]
    if k == 0 or grid < 1:
        return np.zeros(k, np.int64), np.zeros(0, np.int64)
    b = np.where(np.isfinite(boxes), np.clip(boxes, 0.0, 1.0), np.array([0.0, 0.0, 1.0, 1.0]))
    c0 = np.minimum(np.floor(b[:, 0] * grid).astype(np.int64), grid - 1)
    r0 = np.minimum(np.floor(b[:, 1] * grid).astype(np.int64), grid - 1)
    c1 = np.minimum(np.maximum(np.ceil(b[:, 2] * grid).astype(np.int64), c0 + 1), grid)
    r1 = np.minimum(np.maximum(np.ceil(b[:, 3] * grid).astype(np.int64), r0 + 1), grid)
    w, hgt = c1 - c0, r1 - r0
    counts = w * hgt
    owner = np.repeat(np.arange(k), counts)
    t = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    rows = (r0[owner] + t // w[owner]) * grid + c0[owner] + t % w[owner]
    return counts, rows


class Buffers:
    """Host buffers reused from chunk to chunk (``add_documents`` copies what it is given, so a
    chunk's patches can be overwritten once it returns): fresh multi-GiB allocations would
    page-fault every chunk again."""

    def __init__(self):
        self._b: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        b = self._b.get(name)
        if b is None or b.shape[0] < rows or b.dtype != dtype or b.device.type != torch.device(device).type:
            b = self._b[name] = None  # release the old one first
            b = self._b[name] = torch.empty((max(rows, 1), DIM), dtype=dtype, device=device)
        return b[:rows]


def draw_patches(n_images: int, n_patches: int, generator: torch.Generator, device: torch.device,
                 buffers: Buffers) -> torch.Tensor:
    """``[n_images * n_patches, DIM]`` random unit vectors, bf16 on the host, drawn on `device`
    (a view into `buffers`)."""
    vals = buffers.get("image", n_images * n_patches, torch.bfloat16)
    step = max(1, (1 << 26) // (n_patches * DIM))  # images drawn per call: ~256 MiB of float32 at a time
    for a in range(0, n_images, step):
        b = min(n_images, a + step)
        x = buffers.get("draw", (b - a) * n_patches, torch.float32, device)
        torch.randn(x.shape, generator=generator, device=device, out=x)
        x /= torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_(min=1e-12)
        vals[a * n_patches:b * n_patches].copy_(x)  # bf16 on the host (from the GPU: one D2H copy)
    return vals


def patch_vectors(graphs: list, n_patches: int, generator: torch.Generator, device: torch.device,
                  buffers: Buffers | None = None) -> tuple[list, dict]:
    """Per document ``{"image": ItemVectors, "region": ItemVectors}``: random unit patches per
    image (bf16, drawn on `device`, kept on the host) and each region's slice of them (the
    image's patches on the grid cells its bbox covers, gathered with one index for all). The
    values are views into `buffers` (valid until the next call with the same buffers)."""
    buffers = buffers or Buffers()
    images = [g.nodes_of(NodeKind.IMAGE) for g in graphs]
    first = np.cumsum([0] + [im.size for im in images])  # each document's first image in `vals`
    vals, gen_s = h.timed(draw_patches, int(first[-1]), n_patches, generator, device, buffers)
    t1 = time.perf_counter()
    regions, owners, boxes = [], [], []  # per document: its regions' local ids, their images' rows, their bboxes
    for g, im, f in zip(graphs, images, first):
        pos = np.full(g.n_nodes, -1, np.int64)
        pos[im] = f + np.arange(im.size)
        regs = g.nodes_of(NodeKind.REGION)
        regs = regs[(g.node_image[regs] >= 0)]
        regs = regs[pos[g.node_image[regs]] >= 0]
        regions.append(regs.astype(np.int64))
        owners.append(pos[g.node_image[regs]])
        boxes.append(g.node_bbox[regs])
    counts, rows = region_rows(np.concatenate(boxes) if boxes else np.zeros((0, 4)), int(math.isqrt(n_patches)))
    rows = np.repeat(np.concatenate(owners) * n_patches if owners else np.zeros(0, np.int64), counts) + rows
    reg_vals = buffers.get("region", rows.size, torch.bfloat16)
    if rows.size:
        torch.index_select(vals, 0, torch.from_numpy(rows), out=reg_vals)
    reg_off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)  # per region, into reg_vals
    reg_first = np.cumsum([0] + [r.size for r in regions])  # per document, into the regions
    out = []
    for i, (im, regs) in enumerate(zip(images, regions)):
        entry, k, f = {}, im.size, int(first[i])
        if k:
            entry["image"] = ItemVectors(im.astype(np.int64), vals[f * n_patches:(f + k) * n_patches],  # a view
                                         torch.arange(k + 1, dtype=torch.int64) * n_patches)
        a, b = int(reg_first[i]), int(reg_first[i + 1])
        if b > a:
            lo, hi = int(reg_off[a]), int(reg_off[b])
            entry["region"] = ItemVectors(regs, reg_vals[lo:hi], torch.from_numpy(reg_off[a:b + 1] - lo))
        out.append(entry)
    return out, {"generate_s": gen_s, "regions_s": time.perf_counter() - t1,
                 "image_tokens": int(first[-1]) * n_patches, "region_tokens": int(rows.size)}


def build_index(n_docs: int, n_images: int, n_patches: int, encoders: Encoders, *, seed: int, chunk: int,
                builder: GraphBuilder, gen_device: torch.device, progress: bool = True,
                desc: str = "building") -> tuple:
    """``(index, info)``: an in-memory bf16 index of `n_docs` generated documents with
    precomputed vectors, added `chunk` documents per ``add_documents`` call (the workers build
    the next chunk while this process adds one)."""
    t_all = time.perf_counter()
    index = KnowledgeIndex(encoders, dtype=torch.bfloat16)
    gen = torch.Generator(device=gen_device).manual_seed(seed + 12345)
    buffers = Buffers()
    times = dict.fromkeys(["graphs_and_text_s", "graph_build_cpu_s", "text_encode_cpu_s", "patches_generate_s",
                           "regions_slice_s", "add_documents_s"], 0.0)
    tokens = {"image": 0, "region": 0}
    chunks = [list(range(lo, min(n_docs, lo + chunk))) for lo in range(0, n_docs, chunk)]
    pending = builder.submit(chunks[0], n_docs, n_images, seed) if chunks else None
    for j, numbers in enumerate(tqdm(chunks, desc=f"{desc} {n_docs:,} documents ({builder.workers} workers)",
                                     unit="chunk", disable=not progress)):
        built, wait_s = h.timed(pending.get)
        times["graphs_and_text_s"] += wait_s  # waiting for the workers
        if j + 1 < len(chunks):
            pending = builder.submit(chunks[j + 1], n_docs, n_images, seed)
        times["graph_build_cpu_s"] += sum(b[2] for b in built)
        times["text_encode_cpu_s"] += sum(b[3] for b in built)
        graphs = [b[0] for b in built]
        pv, pinfo = patch_vectors(graphs, n_patches, gen, gen_device, buffers)
        times["patches_generate_s"] += pinfo["generate_s"]
        times["regions_slice_s"] += pinfo["regions_s"]
        tokens["image"] += pinfo["image_tokens"]
        tokens["region"] += pinfo["region_tokens"]
        vectors = [{**_text_vectors(b[1]), **p} for b, p in zip(built, pv)]
        times["add_documents_s"] += h.timed(index.add_documents, graphs, vectors=vectors)[1]
        del built, graphs, pv, vectors
    del buffers
    times["build_total_s"] = time.perf_counter() - t_all
    times["graph_assemble_s"] = h.timed(lambda: index.graph)[1]  # the merged graph now, not in the first query
    counts = index.counts
    vb = {s: st.values.numel() * st.values.element_size() for s, st in index.stores.items()}
    info = {"documents": n_docs, "images_per_doc": n_images, "patches": n_patches, "workers": builder.workers,
            "patch_device": str(gen_device), "counts": counts, "vector_bytes": vb,
            "vector_bytes_total": sum(vb.values()), "patch_tokens": tokens,
            "mean_region_patches": tokens["region"] / max(1, counts.get("regions", 0)),
            "graph_backend": index.graph.backend, **{k: round(v, 3) for k, v in times.items()},
            "host_rss_bytes": h.proc_bytes("VmRSS"), "host_peak_rss_bytes": h.proc_bytes("VmHWM")}
    return index, info


# ------------------------------------------------------------------------------------------
# Measuring
# ------------------------------------------------------------------------------------------

def reset_gpu_peak(peaks: list[int]) -> int:
    """Notes the CUDA allocation peak so far in `peaks` (the whole run's peak outlives the reset),
    resets it, and returns the bytes allocated now."""
    torch.cuda.synchronize()
    peaks.append(torch.cuda.max_memory_allocated())
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def time_runs(fn, inputs: list, sync, max_s: float | None = None) -> dict:
    """Latency and throughput of one synchronised call ``fn(x) -> [Result]`` per input `x` (a
    question, or a batch: each of its queries waits for the whole batch), stopping once `max_s`
    seconds are spent (after at least 2 calls). The latency is the wall time minus the pipeline's
    encode time; per stage: ``Result.timings`` per query, ``results`` the rest of the latency."""
    outs, walls = h.time_each(fn, inputs, sync=sync, max_s=max_s)
    lat, encode, stages = [], [], {s: [] for s in TIMED}
    for rs, wall in zip(outs, walls):
        k, e2e = len(rs), wall - rs[0].timings["encode"]
        lat += [e2e] * k
        encode.append(1e3 * rs[0].timings["encode"] / k)
        st = {s: 1e3 * rs[0].timings.get(s, 0.0) / k for s in STAGES}
        st["results"] = 1e3 * e2e / k - sum(st.values())
        for s in TIMED:
            stages[s].append(st[s])
    a = np.asarray(lat) * 1e3
    per_call = [wall - rs[0].timings["encode"] for rs, wall in zip(outs, walls)]
    return {"queries": len(lat), "asked": len(inputs), "p50_ms": float(np.percentile(a, 50)),
            "p90_ms": float(np.percentile(a, 90)), "p99_ms": float(np.percentile(a, 99)), "mean_ms": float(a.mean()),
            "max_ms": float(a.max()), "qps": len(lat) / sum(per_call), "qps_with_encode": len(lat) / sum(walls),
            "stage_ms_per_query": {s: statistics.median(v) for s, v in stages.items()},
            "encode_ms_per_query": statistics.median(encode), "batch_size": len(outs[0]), "batches": len(outs),
            "ms_per_batch_p50": 1e3 * statistics.median(per_call)}


def time_batches(pipe: Pipeline, batches: list[list[str]], sync, peaks: list[int] | None = None) -> dict:
    """:func:`time_runs` of ``retrieve_batch``; with `peaks` (CUDA) also ``gpu_peak_growth_bytes``,
    the allocation peak during the batches over what was allocated before them."""
    base = reset_gpu_peak(peaks) if peaks is not None else None
    out = time_runs(pipe.retrieve_batch, batches, sync)
    if base is not None:
        out["gpu_peak_growth_bytes"] = torch.cuda.max_memory_allocated() - base
    return out


# ------------------------------------------------------------------------------------------
# Correctness: device pipeline vs CPU pipeline
# ------------------------------------------------------------------------------------------

def tol_of(score: float, rel: float) -> float:
    return rel * max(1.0, abs(score))


def doc_text_scores(pipe: Pipeline, question: str, doc_ids: list[str]) -> dict[str, float]:
    """Each document's text-side recall score recomputed in float64: max over its segments and
    tables of MaxSim(question tokens rounded to the store dtype, stored vectors)."""
    view = pipe.view()
    qv, qo = pipe._encode([as_query(question, "question")])["text"]
    out = {}
    for d in doc_ids:
        number = np.asarray([pipe.index.doc_number(d)], np.int64)
        best = -math.inf
        for name in ("segment", "table"):
            if name not in view.stores:
                continue
            st = pipe.index.stores[name]
            for slot in view.stores[name].slots_of(number).tolist():
                x = st.values[int(st.offsets[slot]):int(st.offsets[slot + 1])].double()
                q = qv[int(qo[0]):int(qo[1])].to(st.dtype).double()
                if x.shape[0] and q.shape[0]:
                    best = max(best, float((q @ x.T).amax(1).sum()))
        out[d] = best
    return out


def compare_docs(a, b, ref: dict[str, float] | None, rel: float) -> tuple[bool, str, float]:
    """Recalled documents of the CPU result `a` and the device result `b` equal up to ties."""
    ida, idb = [d for d, _ in a], [d for d, _ in b]
    diff = max([abs(x - y) for (_, x), (_, y) in zip(a, b)] or [0.0])
    if len(ida) != len(idb):
        return False, f"{len(ida)} vs {len(idb)} documents", diff
    if ida == idb:
        ok = all(abs(x - y) <= tol_of(x, rel) for (_, x), (_, y) in zip(a, b))
        return ok, "" if ok else f"document scores differ by {diff:.3g}", diff
    if ref is None:
        return False, "document order differs (no reference scores)", diff
    for i, (x, y) in enumerate(zip(ida, idb)):
        if x != y and abs(ref[x] - ref[y]) > tol_of(ref[x], rel):
            return False, f"rank {i}: {x} ({ref[x]:.5f}) vs {y} ({ref[y]:.5f}) do not tie", diff
    return True, "order differs only among tied documents", diff


def compare_images(a, b, rel: float) -> tuple[bool, str, float]:
    """E_k of the CPU result `a` and the device result `b` (``[(node, score)]``) equal up to ties."""
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} images", math.inf
    if not a:
        return True, "", 0.0
    diff = max([abs(x[1] - y[1]) for x, y in zip(a, b)] or [0.0])
    for (_, x), (_, y) in zip(a, b):
        if abs(x - y) > tol_of(x, rel):
            return False, f"scores by position differ: {x:.5f} vs {y:.5f}", diff
    sa, sb = dict(a), dict(b)
    for node in set(sa) & set(sb):
        if abs(sa[node] - sb[node]) > tol_of(sa[node], rel):
            return False, f"node {node}: {sa[node]:.5f} vs {sb[node]:.5f}", diff
    for mine, other, last, where in ((sa, sb, b[-1][1], "the CPU"), (sb, sa, a[-1][1], "the device")):
        for node, s in mine.items():
            if node not in other and abs(s - last) > tol_of(s, rel):
                return False, f"node {node} ({s:.5f}) only on {where} and does not tie the last", diff
    same = [x for x, _ in a] == [x for x, _ in b]
    return True, "" if same else "order differs only among tied images", diff


def compare_results(ref_pipe: Pipeline, q: str, ra, rb, rel: float) -> dict:
    """Results `ra` and `rb` of question `q` (recalled documents, then E_k) equal up to ties;
    `ref_pipe` recomputes document scores when the recalled order differs."""
    ids_a, ids_b = [d for d, _ in ra.documents], [d for d, _ in rb.documents]
    ref = None if ids_a == ids_b else doc_text_scores(ref_pipe, q, sorted(set(ids_a) | set(ids_b)))
    ok_d, why_d, dd = compare_docs(ra.documents, rb.documents, ref, rel)
    a = [(int(x.node), float(x.score)) for x in ra.images]
    b = [(int(x.node), float(x.score)) for x in rb.images]
    if ids_a != ids_b:  # tied documents swapped: the graphs differ downstream, images are not comparable
        ok_i, why_i, di = True, "not compared (documents tied and swapped)", 0.0
    else:
        ok_i, why_i, di = compare_images(a, b, rel)
        if not ok_i and not np.array_equal(ra.subgraph_nodes, rb.subgraph_nodes):
            why_i += (f" (the expanded subgraphs already differ: {ra.subgraph_nodes.size} vs {rb.subgraph_nodes.size} "
                      f"nodes; seeds {ra.seed_entities[:3]}... vs {rb.seed_entities[:3]}...)")
    ok_u = ra.image_units == rb.image_units
    return {"question": q, "ok": ok_d and ok_i and ok_u, "documents_ok": ok_d, "documents_note": why_d,
            "images_ok": ok_i, "images_note": why_i, "images": len(b), "image_units": rb.image_units,
            "units_ok": ok_u, "doc_score_diff": dd, "image_score_diff": di if math.isfinite(di) else None}


def check(cpu: Pipeline, dev: Pipeline, questions: list[str], rel: float, batch: int) -> dict:
    """Single results of both pipelines compared per question, and the device pipeline's batches
    compared with its singles the same way (:func:`compare_results`): recalled documents equal up
    to ties (ids by position; where they differ, the documents' text-side MaxSim recomputed in
    float64 from the stored bf16 vectors must tie), document scores within tolerance, E_k image
    nodes equal up to ties (scores within tolerance by position, a node in one list only must tie
    the other list's last score)."""
    rows, failures, dev_single = [], [], []
    for i, q in enumerate(questions):
        rc, rd = cpu.retrieve(q), dev.retrieve(q)
        dev_single.append(rd)
        rows.append(compare_results(cpu, q, rc, rd, rel))
        if not rows[-1]["ok"]:
            failures.append(f"question {i} ({q!r}): documents: {rows[-1]['documents_note'] or 'ok'}; images: "
                            f"{rows[-1]['images_note'] or 'ok'}; units {rc.image_units!r} vs {rd.image_units!r}")
    batched_ok, batched_identical = True, True
    for lo in range(0, len(questions), batch):
        for j, r in enumerate(dev.retrieve_batch(questions[lo:lo + batch])):
            row = compare_results(cpu, questions[lo + j], dev_single[lo + j], r, rel)
            batched_identical &= row["documents_note"] == "" and row["images_note"] == ""
            if not row["ok"]:
                batched_ok = False
                failures.append(f"question {lo + j}: the device batch of {batch} differs from its retrieve(): "
                                f"documents: {row['documents_note'] or 'ok'}; images: {row['images_note'] or 'ok'}")
    return {"questions": len(questions), "passed": not failures, "failures": failures[:10],
            "documents_equal_up_to_ties": sum(r["documents_ok"] for r in rows),
            "images_equal_up_to_ties": sum(r["images_ok"] for r in rows),
            "documents_identical": sum(r["documents_note"] == "" for r in rows),
            "images_identical": sum(r["images_note"] == "" for r in rows),
            "images_ranked_total": sum(r["images"] for r in rows),
            "image_units": sorted({r["image_units"] for r in rows}), "batched_equals_single": batched_ok,
            "batched_identical_to_single": batched_identical,
            "max_doc_score_diff": max((r["doc_score_diff"] for r in rows), default=0.0),
            "max_image_score_diff": max((r["image_score_diff"] for r in rows if r["image_score_diff"] is not None),
                                        default=0.0), "tolerance_rel": rel, "rows": rows}


def failed_check(questions: int, rel: float, exc: Exception) -> dict:
    """What :func:`check` returns, for a check that raised `exc`."""
    zeros = dict.fromkeys(["documents_equal_up_to_ties", "images_equal_up_to_ties", "documents_identical",
                           "images_identical", "images_ranked_total"], 0)
    return {**zeros, "questions": questions, "passed": False, "failures": [f"check raised {exc!r}"[:300]],
            "traceback": traceback.format_exc()[-2000:], "image_units": [], "batched_equals_single": False,
            "max_doc_score_diff": math.nan, "max_image_score_diff": math.nan, "tolerance_rel": rel}


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

def device_info(device: torch.device) -> dict:
    """What :func:`_harness.env`'s header does not name: the accelerator (model, memory, SMs, CUDA)
    and the engine's backends."""
    if device.type != "cuda":
        return {"gpu": None, "backends": cg.backends()}
    p = torch.cuda.get_device_properties(device)
    return {"gpu": torch.cuda.get_device_name(device), "gpu_memory_bytes": p.total_memory,
            "gpu_sms": p.multi_processor_count, "cuda": torch.version.cuda, "backends": cg.backends()}


def _ms(x: float) -> str:
    return f"{x:,.1f}" if x >= 10 else f"{x:.2f}"


def _gib(x: float) -> str:
    return f"{x / 2**30:,.2f}"


def title_of(rep: dict) -> str:
    s, ix = rep["settings"], rep.get("index", {})
    images = ix.get("counts", {}).get("images", s["docs"] * s["images_per_doc"])
    return (f"Retrieval pipeline on {'a GPU' if s['device'].startswith('cuda') else 'the CPU'}: {s['docs']:,} "
            f"documents, {images:,} images x {s['patches']:,} patches"
            + (" (QUICK: tiny, timings meaningless)" if s["quick"] else ""))


def index_lines(ix: dict) -> list[str]:
    c = ix["counts"]
    return ["## Index", "",
            f"* {c['documents']:,} documents, {c['nodes']:,} nodes, {c['edges']:,} edges; {c.get('segments', 0):,} "
            f"segments, {c.get('entities', 0):,} entities, {c.get('relations', 0):,} relations, "
            f"{c.get('images', 0):,} images, {c.get('regions', 0):,} regions "
            f"(mean {ix['mean_region_patches']:.0f} patches each)",
            f"* vectors resident (bf16): {_gib(ix['vector_bytes_total'])} GiB ("
            + ", ".join(f"{k} {_gib(v)}" for k, v in ix["vector_bytes"].items() if v) + ")",
            f"* build {ix['build_total_s']:.1f} s with {ix['workers']} workers: graphs + text vectors "
            f"{ix['graphs_and_text_s']:.1f} s waiting for the workers ({ix['graph_build_cpu_s']:.1f} s CPU building "
            f"graphs, {ix['text_encode_cpu_s']:.1f} s CPU encoding text), patches {ix['patches_generate_s']:.1f} s "
            f"(on {ix['patch_device']}), region slices {ix['regions_slice_s']:.1f} s, add_documents "
            f"{ix['add_documents_s']:.1f} s; graph assembly {ix['graph_assemble_s']:.1f} s; host RSS "
            f"{_gib(ix['host_rss_bytes'])} GiB (peak {_gib(ix['host_peak_rss_bytes'])} GiB)", ""]


def pipeline_line(p: dict, dev: str) -> list[str]:
    mem = ""
    if p.get("gpu_resident_bytes") is not None:
        mem = f"; GPU memory: stores resident {_gib(p['gpu_resident_bytes'])} GiB"
        if p.get("gpu_peak_bytes") is not None:
            growth = ", ".join(f"{k.replace('_', ' ')} +{_gib(v)} GiB"
                               for k, v in (p.get("gpu_peak_growth_batch_bytes") or {}).items() if v is not None)
            mem += f", peak {_gib(p['gpu_peak_bytes'])} GiB (peak growth during a {growth})"
    return [f"Device pipeline: view (store copy to {dev}) {p['view_s']:.1f} s"
            + (f", warm-up {p['warmup_s']:.1f} s" if "warmup_s" in p else "") + mem
            + f"; image units {p.get('image_units')!r}", ""]


def check_lines(ck: dict) -> list[str]:
    n = ck["questions"]
    return ["## Correctness (device vs CPU pipeline)", "",
            f"**{'PASS' if ck['passed'] else 'FAIL'}** on {ck['check_index']}: {n} questions; documents equal up to "
            f"ties {ck['documents_equal_up_to_ties']}/{n} (identical {ck['documents_identical']}), E_k equal up to "
            f"ties {ck['images_equal_up_to_ties']}/{n} (identical {ck['images_identical']}; "
            f"{ck['images_ranked_total']} images ranked, units {ck['image_units']}); device batch of 16 equals its "
            f"singles up to ties: {ck['batched_equals_single']} (identical: {ck.get('batched_identical_to_single')}); "
            f"max score difference: documents {ck['max_doc_score_diff']:.3g}, images {ck['max_image_score_diff']:.3g} "
            f"(tolerance {ck['tolerance_rel']:g} relative)", *[f"* {f}" for f in ck["failures"]], ""]


def runs_lines(runs: dict, dev: str) -> list[str]:
    """The latency table and the per-stage table, one row per run (``device:single``, ``cpu:batch_16``...)."""
    rows = []
    for name, r in runs.items():
        where, mode = name.split(":", 1)
        st = r["stage_ms_per_query"]
        dom = max(TIMED, key=lambda k: st[k])
        rows.append({**r, "where": dev if where == "device" else "cpu (side by side)", "mode": mode.replace("_", " "),
                     "dominant": f"{dom} ({100 * st[dom] / max(sum(st.values()), 1e-12):.0f}%)"})
    lead = [("device", "where"), ("mode", "mode")]
    latency = [("queries:", "queries"), ("p50 ms:", lambda r: _ms(r["p50_ms"])),
               ("p99 ms:", lambda r: _ms(r["p99_ms"])), ("QPS:", lambda r: f"{r['qps']:,.1f}"),
               ("QPS incl. encode:", lambda r: f"{r['qps_with_encode']:,.1f}"),
               ("encode ms/query:", lambda r: _ms(r["encode_ms_per_query"]))]
    stages = [(f"{s}:", lambda r, s=s: _ms(r["stage_ms_per_query"][s])) for s in TIMED] + [("dominant:", "dominant")]
    return ["## Latency and throughput (query encoding excluded)", "", *h.table(lead + latency, rows), "",
            "## Per stage (median ms per query; batches: batch time / batch size)", "",
            *h.table(lead + stages, rows), ""]


def report_body(rep: dict) -> list[str]:
    """The Markdown under the title and the environment header: what the phases done so far measured."""
    s, m, ix = rep["settings"], rep["machine"], rep.get("index")
    lines = [f"- device: {m.get('gpu') or 'no GPU'}; graph backend {ix['graph_backend'] if ix else '—'}; "
             f"native {m['backends'].get('native')}", "",
             f"Settings: {json.dumps({k: v for k, v in s.items() if k != 'config'})}", "",
             f"Config: {json.dumps(s['config'])}", ""]
    lines += index_lines(ix) if ix else []
    lines += pipeline_line(rep["pipeline"], s["device"]) if rep.get("pipeline") else []
    lines += check_lines(rep["check"]) if rep.get("check") else []
    lines += runs_lines(rep["runs"], s["device"]) if rep.get("runs") else []
    if rep.get("ratios"):
        lines += ["## Device vs CPU", ""] + [f"* {k}: {v:.2f}x" for k, v in rep["ratios"].items()] + [""]
    if rep.get("targets"):
        lines += ["## Targets", ""] + [f"* {k}: {v['value']:.2f} (target {v['target']}: "
                                       f"{'met' if v['met'] else 'NOT met'})" for k, v in rep["targets"].items()] + [""]
    if rep.get("errors"):
        lines += ["## Errors and skips", ""] + [f"* {e}" for e in rep["errors"]] + [""]
    return lines + [f"Total {rep.get('total_s', 0):.0f} s (last phase done: {rep.get('phase_done')})."]


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = h.parser(__doc__)
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--images-per-doc", type=int, default=10)
    p.add_argument("--patches", type=int, default=1030)
    p.add_argument("--device", default="cuda")
    p.add_argument("--queries", type=int, default=200, help="single queries timed on the device pipeline")
    p.add_argument("--batches", type=int, default=6, help="batches timed per batch size")
    p.add_argument("--batch-sizes", default="16,64")
    p.add_argument("--warmup", type=int, default=2, help="warm-up rounds of each batch size (1 and the batch sizes)")
    p.add_argument("--check-queries", type=int, default=16)
    p.add_argument("--check-docs", type=int, default=500,
                   help="size of the separate check index when the full one is too slow on the CPU")
    p.add_argument("--cpu-check-limit-s", type=float, default=3.0,
                   help="one CPU query slower than this: check on --check-docs")
    p.add_argument("--cpu-queries", type=int, default=8, help="single queries timed on the CPU pipeline (0: none)")
    p.add_argument("--cpu-batch", type=int, default=16,
                   help="one batch of this size timed on the CPU pipeline (0: none)")
    p.add_argument("--tolerance", type=float, default=2e-3, help="relative score tolerance (bf16 stores)")
    p.add_argument("--chunk", type=int, default=1000, help="documents per add_documents call")
    p.add_argument("--workers", type=int, default=None,
                   help="processes building graphs and text vectors (default: usable CPUs - 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget-s", type=float, default=480.0,
                   help="seconds the whole run may take; the later timings shrink to fit "
                        "(the device allows 600 per command)")
    args = p.parse_args(argv)
    if args.quick:  # 40 documents, 2 images, 64 patches, few queries (< 60 s on CPU); overrides the sizes and counts
        args.docs, args.images_per_doc, args.patches = 40, 2, 64
        args.queries, args.batches, args.batch_sizes, args.warmup = 8, 1, "4,16", 1
        args.check_queries, args.check_docs, args.cpu_queries, args.cpu_batch, args.chunk = 6, 20, 2, 4, 16
        if args.workers is None:
            args.workers = 1
    return args


class Run:
    """One run's state: its options (`args`), device, encoders, config and graph builder, the
    report being filled (`rep`, written whole to --out after every phase: a run stopped by a time
    limit still leaves what it measured) and the time budget."""

    def __init__(self, args, builder: GraphBuilder):
        self.args, self.builder, self.t0 = args, builder, time.perf_counter()
        self.device = torch.device(args.device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise SystemExit("gpu_pipeline.py: --device cuda but torch sees no CUDA device "
                             "(use --device cpu to check the script)")
        self.sync = h.synchronizer(self.device)
        self.peaks = [] if self.device.type == "cuda" else None  # CUDA allocation peaks (see reset_gpu_peak)
        self.encoders, self.config = make_encoders()[0], PipelineConfig()
        self.batch_sizes = tuple(int(b) for b in args.batch_sizes.split(",") if b.strip())
        self.stem, self.env = h.stem("gpu_pipeline", args), h.env()
        settings = {k: getattr(args, k) for k in ("docs", "images_per_doc", "patches", "device", "quick", "queries",
                                                  "batches", "batch_sizes", "warmup", "check_queries", "cpu_queries",
                                                  "cpu_batch", "tolerance", "chunk", "workers", "seed", "budget_s")}
        settings.update(device=str(self.device), batch_sizes=list(self.batch_sizes), workers=builder.workers,
                        dtype="bfloat16", d=DIM, encoders=self.encoders.describe(),
                        text_vectors="hashing encoder of the generated text",
                        patch_vectors="random unit vectors (torch, seeded), regions = bbox grid cells of the image",
                        latency="wall time minus the pipeline's encode time; batches: every query waits for its batch",
                        config=self.config.as_dict())
        self.rep = {"date": self.env["timestamp"], "machine": device_info(self.device), "settings": settings,
                    "errors": []}

    def left(self) -> float:
        return self.args.budget_s - (time.perf_counter() - self.t0)

    def build(self, n_docs: int, **kw) -> tuple:
        """:func:`build_index` of `n_docs` documents at this run's sizes."""
        a = self.args
        return build_index(n_docs, a.images_per_doc, a.patches, self.encoders, seed=a.seed, chunk=a.chunk,
                           builder=self.builder, gen_device=self.device, **kw)

    def save(self, phase: str, echo: bool = False) -> None:
        self.rep.update(phase_done=phase, total_s=time.perf_counter() - self.t0)
        h.write_whole(self.stem, title_of(self.rep), report_body(self.rep), self.rep, self.args.out, e=self.env,
                      echo=echo)


def main(argv=None) -> int:
    args = parse_args(argv)
    builder = GraphBuilder(args.workers or max(1, h.usable_cores() - 2))  # leave the main process its cores
    try:  # forked first: before CUDA and torch's thread pools start here
        run = Run(args, builder)
        try:
            return measure(run)
        except Exception as exc:  # keep what was measured, say where it broke
            run.rep["errors"].append(f"stopped after phase {run.rep.get('phase_done')!r}: {exc!r}"[:1000])
            run.rep["traceback"] = traceback.format_exc()[-4000:]
            run.save(f"failed after {run.rep.get('phase_done')}", echo=True)
            raise
    finally:
        builder.close()


def warm_up(run: Run, index, warm_qs: list[str]) -> tuple:
    """Phase 2: ``(device pipeline, CPU pipeline)``, the device one's stores copied and its kernels
    compiled (batches of 1 and of each batch size, ``--warmup`` rounds)."""
    base_mem = reset_gpu_peak(run.peaks) if run.peaks is not None else 0
    t0 = time.perf_counter()
    dev = Pipeline(index, run.encoders, run.config, device=run.device)
    dev.view()  # the stores' copy to the device
    run.sync()
    pinfo = run.rep["pipeline"] = {"view_s": time.perf_counter() - t0, "image_units": dev.image_units}
    if run.peaks is not None:
        pinfo["gpu_resident_bytes"] = torch.cuda.memory_allocated() - base_mem
    cpu = Pipeline(index, run.encoders, run.config, device="cpu")
    sizes = [b for _ in range(run.args.warmup) for b in (1,) + run.batch_sizes]
    pinfo["warmup_s"] = sum(h.time_each(lambda b: dev.retrieve_batch(warm_qs[:b]), sizes, sync=run.sync)[1])
    tqdm.write(f"device pipeline: view {pinfo['view_s']:.1f} s, warm-up {pinfo['warmup_s']:.1f} s, "
               f"image units {dev.image_units!r}")
    return dev, cpu


def correctness(run: Run, cpu: Pipeline, dev: Pipeline, questions: list[str], one_cpu: float) -> dict:
    """Phase 3: :func:`check` on the benchmark index, or on a ``--check-docs`` one built the same
    way when one CPU query took longer than ``--cpu-check-limit-s``."""
    a = run.args
    check_q, pipes = questions[:a.check_queries], (cpu, dev)
    where = f"the benchmark index ({a.docs:,} documents)"
    if one_cpu > a.cpu_check_limit_s and a.check_docs < a.docs:
        small, _ = run.build(a.check_docs, desc="check index:")
        pipes = tuple(Pipeline(small, run.encoders, run.config, device=d) for d in ("cpu", run.device))
        check_q = make_questions(a.check_queries, a.check_docs, a.images_per_doc, a.seed + 7)
        where = (f"a {a.check_docs:,}-document index built the same way (one CPU query on the full index "
                 f"took {one_cpu:.1f} s > {a.cpu_check_limit_s:g} s)")
    t0 = time.perf_counter()
    try:
        ck = check(*pipes, check_q, a.tolerance, 16)
    except Exception as exc:
        ck = failed_check(len(check_q), a.tolerance, exc)
    ck.update(check_index=where, one_cpu_query_s=one_cpu, check_s=time.perf_counter() - t0)
    del pipes
    gc.collect()
    if run.device.type == "cuda":
        torch.cuda.empty_cache()
    tqdm.write(f"correctness: {'PASS' if ck['passed'] else 'FAIL'} on {where} in {ck['check_s']:.1f} s"
               + ("" if ck["passed"] else ": " + "; ".join(ck["failures"][:3])))
    return ck


def device_timings(run: Run, dev: Pipeline, questions: list[str]) -> dict:
    """Phase 4: single queries (up to a third of the time left: the batches and the CPU runs
    follow), then ``--batches`` batches of each size; the targets. Returns the singles' figures."""
    a, runs = run.args, run.rep["runs"]
    single = runs["device:single"] = time_runs(lambda q: [dev.retrieve(q)], questions[:a.queries], run.sync,
                                               max_s=max(10.0, run.left() / 3))
    tqdm.write(f"device single: p50 {single['p50_ms']:.2f} ms, p99 {single['p99_ms']:.2f} ms over "
               f"{single['queries']} queries")
    for b in run.batch_sizes:
        batches = [questions[i * b:(i + 1) * b] for i in range(a.batches)]
        r = runs[f"device:batch_{b}"] = time_batches(dev, batches, run.sync, run.peaks)
        r["ratio_qps_vs_single"] = r["qps"] / single["qps"]
        tqdm.write(f"device batch {b}: {r['qps']:,.1f} QPS ({r['ms_per_batch_p50']:.1f} ms per batch)")
    if run.peaks is not None:
        torch.cuda.synchronize()
        run.peaks.append(torch.cuda.max_memory_allocated())
        pinfo = run.rep["pipeline"]
        pinfo["gpu_peak_bytes"] = max(run.peaks)  # whole run: store copies, warm-up, check, timings
        pinfo["gpu_peak_growth_batch_bytes"] = {f"batch_{b}": runs[f"device:batch_{b}"].get("gpu_peak_growth_bytes")
                                                for b in run.batch_sizes}
    big = max(run.batch_sizes)
    qps = runs[f"device:batch_{big}"]["qps"]
    run.rep["targets"] = {
        f"single p50 ms at {a.docs:,} docs": {"value": single["p50_ms"], "target": f"<= {TARGET_P50_MS:g}",
                                              "met": single["p50_ms"] <= TARGET_P50_MS},
        f"batch {big} QPS at {a.docs:,} docs": {"value": qps, "target": f">= {TARGET_QPS_64:g}",
                                                "met": qps >= TARGET_QPS_64}}
    return single


def cpu_timings(run: Run, cpu: Pipeline, questions: list[str], one_cpu: float, single: dict) -> None:
    """Phase 5: the CPU pipeline side by side, as much of it as the budget allows."""
    runs, ratios, errors, cpu_sync = run.rep["runs"], run.rep["ratios"], run.rep["errors"], h.synchronizer("cpu")
    n_cpu, b = run.args.cpu_queries, run.args.cpu_batch
    if n_cpu and run.left() < 1.5 * one_cpu * (n_cpu + b):
        n_cpu = max(2, int(run.left() / (3 * max(one_cpu, 1e-3))))
        errors.append(f"CPU side by side shortened to {n_cpu} single queries (time budget)")
    if n_cpu:
        runs["cpu:single"] = time_runs(lambda q: [cpu.retrieve(q)], questions[:n_cpu], cpu_sync,
                                       max_s=max(5.0, run.left() / 3))
        ratios["single p50: CPU / device"] = runs["cpu:single"]["p50_ms"] / single["p50_ms"]
        run.save("cpu single")
    if b and run.left() > 1.5 * one_cpu * b:
        runs[f"cpu:batch_{b}"] = time_batches(cpu, [questions[:b]], cpu_sync)
        if f"device:batch_{b}" in runs:
            ratios[f"batch {b} QPS: device / CPU"] = runs[f"device:batch_{b}"]["qps"] / runs[f"cpu:batch_{b}"]["qps"]
    elif b:
        errors.append(f"CPU batch of {b} skipped (time budget: {run.left():.0f} s left, one CPU query took "
                      f"{one_cpu:.2f} s)")


def measure(run: Run) -> int:
    """Phases 1-5 (see the module docstring); the report is saved after each."""
    a = run.args
    index, info = run.build(a.docs)
    run.rep["index"] = info
    tqdm.write("\n".join(index_lines(info)))
    run.save("index")
    big = max(run.batch_sizes)
    n_questions = max([a.queries, a.check_queries, a.cpu_queries, a.cpu_batch]
                      + [b * a.batches for b in run.batch_sizes])
    questions = make_questions(n_questions + big, a.docs, a.images_per_doc, a.seed)
    warm_qs, questions = questions[-big:], questions[:n_questions]
    dev, cpu = warm_up(run, index, warm_qs)
    run.save("warm-up")

    cpu.retrieve(warm_qs[0])  # one-time costs (item norms, degrees) out of the estimate
    one_cpu = h.timed(cpu.retrieve, warm_qs[-1])[1]
    ck = run.rep["check"] = correctness(run, cpu, dev, questions, one_cpu)
    run.builder.close()  # no more building: the workers would only sit beside the timings
    run.save("check")

    run.rep["runs"], run.rep["ratios"] = {}, {}
    single = device_timings(run, dev, questions)
    run.save("device timings")
    cpu_timings(run, cpu, questions, one_cpu, single)
    run.save("done", echo=True)
    print(f"wrote {a.out}/{run.stem}.{{md,json}}")
    if not ck["passed"]:
        print("CORRECTNESS FAILED: " + "; ".join(ck["failures"][:5]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
