"""Whether the Triton kernels can run, and why not.

Triton runs on CUDA devices, or on the CPU when ``TRITON_INTERPRET=1`` was set before import
(the interpreter: exact but slow, used by the tests).
"""
from __future__ import annotations

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"

try:
    import triton  # noqa: F401

    _import_error: str | None = None
except ImportError as exc:  # torch without its Triton wheel
    _import_error = f"triton failed to import: {exc}"


def importable() -> bool:
    return _import_error is None


def why_not(device: torch.device) -> str | None:
    """Reason the Triton kernels cannot run on `device`, or None when they can."""
    if _import_error is not None:
        return _import_error
    if device.type == "cuda":
        return None
    if INTERPRET and device.type == "cpu":
        return None
    return f"Triton kernels need a CUDA tensor (or TRITON_INTERPRET=1 for CPU tensors); got device {device}"
