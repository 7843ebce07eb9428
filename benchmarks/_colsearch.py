"""colsearch (formerly voyager-index) as a measured peer: build an index from packed float
vectors and search it with batched multi-vector queries, top-k, on the CPU or one GPU.

colsearch is optional: this module imports only the standard library at import time; numpy,
torch and colsearch are imported inside the functions.

API used (colsearch 0.1.7, its public facade ``colsearch.Index``)::

    idx = Index(path, dim=128, engine="shard", device=..., **settings)
    idx.add([doc_i as float32 [L_i, 128] numpy], ids=[0..N-1])   # the first add builds the index
    idx.search_batch([q_j as float32 [L_q, 128] numpy], k=k)     # -> per query [SearchResult(doc_id, score)]

The shard engine's query path (read from its source, ``_manager/search.py``): a LEMUR router
(an MLP trained at build time on MaxSim targets, then a FAISS flat inner-product search over
per-document weight vectors) proposes ``k_candidates`` documents; a document-mean proxy score
keeps ``n_full_scores`` of them; exact MaxSim on at most ``max_docs_exact`` documents gives the
top k. On the CPU the exact stage is its Rust kernel (``latence_shard_engine``: fp16 fused
MaxSim, or popcount MaxSim on the 1.58-bit ``rroq158`` codes); on CUDA it is Triton.

Settings (``LANES``; every value not listed is colsearch's own ``ShardEngineConfig`` default:
``k_candidates`` 2,000, ``max_docs_exact`` 10,000, ``n_full_scores`` 4,096, LEMUR
``lemur_epochs`` 10 over at most 8,192 training documents and 100,000 learn tokens, FAISS flat IP,
``n_shards`` 256, ``layout`` proxy_grouped):

* ``fp16`` -- ``compression="fp16"``, as in colsearch's README quick start and its BEIR
  benchmark's ``OPTIMAL_CPU``/``OPTIMAL_GPU`` settings (``benchmarks/beir_benchmark.py``), with
  ``n_shards=32`` as there. This is the lane colsearch reports at 3.12x fast-plaid's QPS on
  BEIR-8 (H100).
* ``rroq158`` -- colsearch's default codec (``Compression.RROQ158``, 1.58-bit ternary residuals
  on K = 8,192 spherical k-means centroids; README: "~40 B per token"). Through ``Index`` its
  default group size is 32 (``ShardEngineConfig.rroq158_group_size``; the README's 40 B/token
  figure is for group size 128, which we pass so the bytes match the README's claim).
  Otherwise as ``fp16``.

Why builds are slow on a small CPU (read from its source, timed with cProfile on 300 x 32
tokens: 31 s, of which LEMUR 19 s, rroq158 k-means 9 s): the first ``add`` trains the LEMUR
router twice (once for a token-balanced shard layout, once more for the proxy-grouped layout),
each time 10 epochs of an MLP 128 -> 512 -> 2,048 -> n_train_docs (at most 8,192) on up to
100,000 tokens with MaxSim targets against every training document, plus an OLS solve through an
SVD of a 16,384 x 2,048 feature matrix (about 3.5 s per call here). The ``rroq158`` codec adds
spherical k-means with K = 8,192 (clamped to the token count) whose default backend is a pure
NumPy k-means++ (one pass over the sample per centre); colsearch's own BEIR reproduction command
sets ``RROQ158_KMEANS_BACKEND=fast`` (its docstring: "~30-50x faster on K=8192, N=100k"), and so
do we for that lane unless the variable is already set. No fsync loop or compile step matters;
the Triton MaxSim warm-up is a no-op without CUDA. With ``device="cpu"`` everything runs on the
CPU. On CUDA we pass ``router_device="cuda"`` so the router trains on the GPU (colsearch's BEIR
benchmark does the same: ``LemurConfig(device=device)``) and the fp16 corpus is preloaded on the
GPU (its "GPU corpus" mode).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PATH = os.path.join(os.path.dirname(HERE), ".peers", "colsearch")

LANES = {
    "fp16": dict(compression="fp16", n_shards=32),
    "rroq158": dict(compression="rroq158", n_shards=32, rroq158_group_size=128),
}
"""Per-lane keyword arguments for ``colsearch.Index`` (the rest are colsearch's defaults)."""


@dataclasses.dataclass
class Handle:
    """A built colsearch index. ``n_docs``: documents added (ids 0..n_docs-1); ``build_s``: wall
    seconds of the building ``add``; ``bytes_per_token``: document-vector bytes on disk (codes or
    fp16 rows; router, ids and centroids excluded) over the token count; ``settings``: the
    ``Index`` keyword arguments."""
    index: object
    n_docs: int
    device: str
    lane: str
    settings: dict
    build_s: float
    bytes_per_token: float | None
    path: str


def load(path: str | None = DEFAULT_PATH):
    """Import colsearch. ``path``: a folder that holds it (``pip install --target``), put on
    ``sys.path`` first; None or missing: the environment only. Returns ``(module, version,
    why_not)``: ``(colsearch, "0.1.7", None)`` or ``(None, None, "<Exception>: message")``."""
    if path and os.path.isdir(path) and path not in sys.path:
        sys.path.insert(0, path)
    try:
        mod = importlib.import_module("colsearch")
        version = getattr(mod, "__version__", None)
        if version in (None, "0+local"):
            from importlib.metadata import version as dist_version
            version = dist_version("colsearch")
        # the shard engine lives behind optional extras; importing it here reports a missing
        # dependency (faiss, safetensors, latence_shard_engine) now rather than in build()
        importlib.import_module("colsearch._internal.inference.shard_engine.manager")
        return mod, version, None
    except Exception as exc:  # noqa: BLE001 - report why the peer is absent
        return None, None, f"{type(exc).__name__}: {exc}"


def _check_packed(values, offsets):
    import torch
    if not isinstance(values, torch.Tensor) or values.ndim != 2 or not values.is_floating_point():
        raise TypeError(f"values: expected a float tensor [T, d], got {type(values).__name__} "
                        f"{getattr(values, 'shape', '')}")
    if not isinstance(offsets, torch.Tensor) or offsets.ndim != 1 or offsets.numel() < 2:
        raise TypeError("offsets: expected an int64 tensor [N+1] with N >= 1")
    off = offsets.to(torch.int64)
    if int(off[0]) != 0 or int(off[-1]) != values.shape[0] or bool((off[1:] <= off[:-1]).any()):
        raise ValueError(f"offsets: expected strictly increasing from 0 to T={values.shape[0]} "
                         "(no empty documents: colsearch cannot index one)")
    return off


def build(values, offsets, device: str = "cpu", tmpdir: str | None = None, *, lane: str = "fp16",
          module=None, **overrides) -> Handle:
    """Builds a colsearch shard index of ``N`` documents.

    ``values``: float tensor ``[T, d]`` (any float dtype; passed as float32); ``offsets``: int64
    ``[N+1]``, document ``i`` owns rows ``offsets[i]:offsets[i+1]`` and gets id ``i``;
    ``device``: ``"cpu"`` or ``"cuda"``/``"cuda:N"``; ``tmpdir``: an empty or absent folder
    for the index (a new temporary one when None); ``lane``: a key of ``LANES``;
    ``overrides``: further ``colsearch.Index`` keyword arguments (they win over the lane's).
    """
    import torch

    if lane not in LANES:
        raise ValueError(f"lane: expected one of {sorted(LANES)}, got {lane!r}")
    if not (device == "cpu" or str(device).startswith("cuda")):
        raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {device!r}")
    off = _check_packed(values, offsets)
    if module is None:
        module, _, why = load()
        if module is None:
            raise RuntimeError(f"colsearch is not importable: {why}")
    if tmpdir is None:
        import tempfile
        tmpdir = tempfile.mkdtemp(prefix="colsearch_")
    elif os.path.exists(tmpdir) and os.listdir(tmpdir):
        raise ValueError(f"tmpdir: expected an empty or absent folder, {tmpdir!r} holds files")

    if lane == "rroq158":
        os.environ.setdefault("RROQ158_KMEANS_BACKEND", "fast")
    settings = dict(LANES[lane], device=str(device))
    if str(device).startswith("cuda"):
        settings["router_device"] = str(device)
    settings.update(overrides)
    arr = values.detach().to("cpu", torch.float32).numpy()
    bounds = off.tolist()
    docs = [arr[bounds[i]:bounds[i + 1]] for i in range(len(bounds) - 1)]

    # Index() forwards only some keywords to ShardEngineConfig (not rroq158_group_size), so the
    # config is made here and passed whole; the device goes to the manager.
    from colsearch._internal.inference.shard_engine.manager import ShardEngineConfig
    config = ShardEngineConfig(dim=arr.shape[1], **{a: v for a, v in settings.items() if a != "device"})
    idx = module.Index(tmpdir, dim=arr.shape[1], engine="shard", device=settings["device"],
                       shard_config=config)
    t = time.perf_counter()
    idx.add(docs, ids=list(range(len(docs))))
    build_s = time.perf_counter() - t
    return Handle(index=idx, n_docs=len(docs), device=str(device), lane=lane, settings=settings,
                  build_s=build_s, bytes_per_token=_vector_bytes(tmpdir, lane) / max(1, arr.shape[0]),
                  path=tmpdir)


_DTYPE_BYTES = {"F16": 2, "BF16": 2, "F32": 4, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1}


def _vector_bytes(root: str, lane: str) -> int:
    """Bytes of the stored document vectors, read from the shard files' safetensors headers
    (8-byte little-endian length, then a JSON map name -> dtype, shape): the ``embeddings``
    fp16 rows for ``fp16``; for ``rroq158`` the ``rroq158_*`` code tensors only (its shards also
    carry an fp16 ``embeddings`` side copy, which we leave out, as the README's 40 B/token does)."""
    total = 0
    for folder, _, files in os.walk(root):
        for f in files:
            if not f.endswith(".safetensors"):
                continue
            with open(os.path.join(folder, f), "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
            for name, meta in header.items():  # "__metadata__" is neither kind
                if name.startswith("rroq158_") if lane == "rroq158" else name == "embeddings":
                    total += _DTYPE_BYTES[meta["dtype"]] * math.prod(meta["shape"])
    return total


def search(handle: Handle, queries, k: int = 10):
    """Top-``k`` document positions per query: ``queries`` a float tensor ``[Nq, Lq, d]`` (or a
    list of ``[L_j, d]`` tensors). Returns an int64 tensor ``[Nq, k]`` of ids ``0..N-1``, best
    first; ``-1`` pads a row when colsearch returns fewer than ``k`` documents."""
    import numpy as np
    import torch

    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k: expected a positive int, got {k!r}")
    if isinstance(queries, torch.Tensor):
        if queries.ndim != 3:
            raise TypeError(f"queries: expected [Nq, Lq, d], got shape {tuple(queries.shape)}")
        qs = list(queries.detach().to("cpu", torch.float32).numpy())
    else:
        qs = [q.detach().to("cpu", torch.float32).numpy() for q in queries]
    out = torch.full((len(qs), k), -1, dtype=torch.int64)
    results = handle.index.search_batch([np.ascontiguousarray(q) for q in qs], k=k)
    for row, res in enumerate(results):
        ids = [r.doc_id for r in res[:k]]
        if ids:
            out[row, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
    return out


def close(handle: Handle) -> None:
    """Closes the index (its file lock and WAL); the folder stays for the caller to remove."""
    handle.index.close()
