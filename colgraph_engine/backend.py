"""One place that decides which implementation runs an operation.

Backends:
  ``triton``  fused Triton kernels (CUDA; CPU only under ``TRITON_INTERPRET=1``)
  ``native``  C++ kernels in ``colgraph_engine._core`` (CPU, AVX-512 where present)
  ``torch``   the pure-torch reference (any device); the oracle and the last fallback

The caller's ``backend=`` argument wins, then ``COLGRAPH_BACKEND``, then the automatic choice
(CUDA -> triton, CPU -> native, else torch). An automatic choice that cannot run falls back to
``torch`` and logs the reason once; a backend named explicitly runs or raises ``ValueError``
with the reason.
"""
from __future__ import annotations

import logging
import os

import torch

from . import _native, _triton

BACKENDS = ("triton", "native", "torch")
log = logging.getLogger("colgraph_engine")
_logged: set[str] = set()


def _why_not(backend: str, device: torch.device) -> str | None:
    if backend == "torch":
        return None
    if backend == "triton":
        return _triton.why_not(device)
    if backend == "native":
        if not _native.available():
            return _native.reason_unavailable
        if device.type != "cpu":
            return f"the native backend runs on CPU tensors; got device {device}"
        return None
    raise AssertionError(backend)


def requested_backend(backend: str | None) -> str | None:
    """The explicitly requested backend (argument, else environment), validated; None = auto."""
    name = backend if backend is not None else os.environ.get("COLGRAPH_BACKEND", "").strip() or None
    if name is None or name == "auto":
        return None
    if not isinstance(name, str) or name not in BACKENDS:
        source = "backend" if backend is not None else "COLGRAPH_BACKEND"
        raise ValueError(f"{source}: expected one of {BACKENDS + ('auto',)}, got {name!r}")
    return name


def resolve(op: str, device: torch.device, backend: str | None = None) -> str:
    """Returns the backend that will run `op` on tensors living on `device`."""
    wanted = requested_backend(backend)
    if wanted is not None:
        reason = _why_not(wanted, device)
        if reason is not None:
            raise ValueError(f"backend {wanted!r} cannot run {op}: {reason}")
        return wanted
    preferred = "triton" if device.type == "cuda" else "native"
    reason = _why_not(preferred, device)
    if reason is None:
        return preferred
    key = f"{op}:{preferred}:{device.type}"
    if key not in _logged:
        _logged.add(key)
        log.warning("colgraph_engine: %s falls back to the torch reference (%s)", op, reason)
    return "torch"


def report() -> dict[str, object]:
    """What can run here and why not: the answer to 'is my install complete?'."""
    cuda = torch.cuda.is_available()
    info: dict[str, object] = {
        "native": _native.available(),
        "native_reason": _native.reason_unavailable,
        "triton_importable": _triton.importable(),
        "triton_cuda": cuda and _triton.importable(),
        "triton_interpreter": _triton.INTERPRET,
        "triton_reason": _triton.why_not(torch.device("cuda" if cuda else "cpu")),
        "cuda_device": torch.cuda.get_device_name(0) if cuda else None,
    }
    if _native.core is not None:
        info["igraph_version"] = _native.core.igraph_version()
        info["cpu_isa_float32"] = _native.core.cpu_kernel_isa("float32")
        info["cpu_isa_bfloat16"] = _native.core.cpu_kernel_isa("bfloat16")
    return info
