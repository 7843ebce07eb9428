"""The precision a model-backed encoder computes in (``compute=``), apart from the dtype of the
vectors it returns (always float32 here, then cast to the encoder's ``dtype``).

* ``"float32"``: the model as it ships.
* ``"bfloat16"``: matrix products and convolutions under ``torch.autocast`` in bfloat16 (8 bits of
  mantissa), accumulating in float32; norms, softmax and the outputs stay float32.
* ``"auto"`` (the default): bfloat16 for **document encoding** (inside :func:`bulk`, which
  :func:`~colgraph_engine.kg.vectors.encode_document` opens) where the hardware computes it
  natively (a CUDA device that supports it; a CPU with AVX-512 BF16 or AMX tiles), float32
  everywhere else. Questions are encoded in float32 whatever the machine: bfloat16 rounding
  depends on the batch a text is padded into (~1e-3, against ~1e-6 in float32), and a question's
  results must not depend on the batch it was asked in; a document is encoded once, so its
  vectors may. A machine without native bfloat16 never runs the slow emulated path.

Measured on 87 real dev pages (``benchmarks/results/ingest_speed.md``, which reports it per run):
MiniLM vectors in bfloat16 keep a cosine of at least 0.9998 with float32, EfficientNet-Lite0 patch
vectors 0.997 on average (lowest 0.947), and on an AVX-512 BF16 CPU MiniLM took 0.44x and
EfficientNet 0.62x of their float32 CPU time. The
two precisions give vectors in one space (an index built in one is queried in the other), so the
encoder's name does not record it: ours, as for thread counts, which change float rounding too.
"""
from __future__ import annotations

import contextlib
import functools
from contextvars import ContextVar

import torch

COMPUTES = ("auto", "float32", "bfloat16")
_BULK: ContextVar[bool] = ContextVar("colgraph_bulk_encoding", default=False)


@contextlib.contextmanager
def bulk():
    """Marks the encoder calls inside as document encoding (``compute="auto"`` may use bfloat16)."""
    token = _BULK.set(True)
    try:
        yield
    finally:
        _BULK.reset(token)


def native_bfloat16(device: torch.device) -> bool:
    """Whether `device` computes bfloat16 products natively (probed once per device)."""
    return _native(device.type, device.index)


@functools.lru_cache(maxsize=None)
def _native(kind: str, index) -> bool:
    if kind == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if kind != "cpu":
        return False
    cpu = getattr(torch._C, "_cpu", None)  # private probes; absent in some builds: then fp32
    try:
        return bool(cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported())
    except AttributeError:
        return False


def check_compute(compute) -> str:
    """`compute` when it is one of :data:`COMPUTES` (ValueError naming ``compute`` otherwise)."""
    if not isinstance(compute, str) or compute not in COMPUTES:
        raise ValueError(f"compute: expected one of {COMPUTES}, got {compute!r}")
    return compute


def forward_dtype(compute: str, device: torch.device) -> torch.dtype:
    """The dtype a forward pass computes in now, for setting `compute` on `device`."""
    if compute == "auto":
        return torch.bfloat16 if _BULK.get() and native_bfloat16(device) else torch.float32
    return torch.bfloat16 if compute == "bfloat16" else torch.float32


def document_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype ``compute="auto"`` encodes documents in on `device` (what a report should name)."""
    with bulk():
        return forward_dtype("auto", torch.device(device))


def autocast(compute: str, device: torch.device):
    """The context a forward pass runs in (see :func:`forward_dtype`)."""
    dtype = forward_dtype(compute, device)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)
