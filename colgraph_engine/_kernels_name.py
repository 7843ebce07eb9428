"""Keep the repository's top-level ``kernels/`` from hiding the installed ``kernels`` package.

Our Triton kernels live in ``kernels/`` at the top of the source tree (installed as
``colgraph_engine.kernels``). Hugging Face's ``kernels`` distribution, which recent transformers
releases import on every model load (``transformers.integrations.hub_kernels``), has the same
top-level name. When the source tree's root is on ``sys.path`` -- ``python -m pytest`` or
``python -m colgraph_engine`` run from the checkout put the working directory first -- ``import
kernels`` finds our directory, and every transformers model (MiniLM, ColPali) fails to load with
an ImportError. :func:`load_installed_kernels` imports the installed package under its own name
first, so later imports see it.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

_OURS = Path(__file__).resolve().parent.parent / "kernels"  # exists only in a source checkout


def _resolve(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except (OSError, RuntimeError):
        return None


def shadowed() -> bool:
    """True when ``import kernels`` would load this source tree's ``kernels/`` directory."""
    if "kernels" in sys.modules or not (_OURS / "__init__.py").is_file():
        return False
    spec = importlib.machinery.PathFinder.find_spec("kernels")
    return spec is not None and spec.origin is not None and Path(spec.origin).resolve().parent == _OURS.resolve()


def load_installed_kernels() -> bool:
    """Import the installed ``kernels`` package (the one ``sys.path`` would reach without the
    source tree's root) as ``kernels`` if our directory would otherwise shadow it. Returns True
    when it did; False when nothing was shadowed or no other ``kernels`` is installed (then
    transformers finds none and does without it)."""
    if not shadowed():
        return False
    root = _OURS.parent.resolve()
    path = [p for p in sys.path if _resolve(p) != root]
    spec = importlib.machinery.PathFinder.find_spec("kernels", path)
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules["kernels"] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop("kernels", None)
        raise
    return True
