"""Loads the native module ``colgraph_engine._core`` once and remembers why it is absent.

``COLGRAPH_DISABLE_NATIVE=1`` hides the module on purpose (to exercise the fallbacks).
"""
from __future__ import annotations

import importlib
import os

core = None
reason_unavailable: str | None = None

if os.environ.get("COLGRAPH_DISABLE_NATIVE", "").strip() not in ("", "0"):
    reason_unavailable = "disabled by COLGRAPH_DISABLE_NATIVE"
else:
    try:
        # The compiled extension, a sibling file of this module (not the package's __init__).
        core = importlib.import_module(f"{__package__}._core")
    except ImportError as exc:  # not built, or built against another Python / igraph
        core = None
        reason_unavailable = f"colgraph_engine._core failed to import: {exc}"


def available() -> bool:
    return core is not None
