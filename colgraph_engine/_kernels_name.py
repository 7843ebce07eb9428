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



def _resolve(entry: str) -> Path | None:
    try:
        return Path(entry or ".").resolve()
    except (OSError, RuntimeError):
        return None


def _checkout_root() -> Path | None:
    """The source checkout whose ``kernels/`` ``import kernels`` would load, or None (the name is
    imported already, or it resolves to something else). Any checkout of this project counts,
    not only the one this module came from: a script run from a second clone puts that clone's
    root on the path while the installed package may be another."""
    if "kernels" in sys.modules:
        return None
    spec = importlib.machinery.PathFinder.find_spec("kernels")
    if spec is None or spec.origin is None:
        return None
    here = Path(spec.origin).resolve().parent
    root = here.parent
    ours = here.name == "kernels" and (here / "maxsim.py").is_file() and (root / "colgraph_engine" / "__init__.py").is_file()
    return root if ours else None


def shadowed() -> bool:
    """True when ``import kernels`` would load a source checkout's ``kernels/`` directory."""
    return _checkout_root() is not None


def load_installed_kernels() -> bool:
    """Import the installed ``kernels`` package (the one ``sys.path`` would reach without the
    checkout's root) as ``kernels`` if our directory would otherwise shadow it. Returns True
    when it did; False when nothing was shadowed or no other ``kernels`` is installed (then
    transformers finds none and does without it)."""
    root = _checkout_root()
    if root is None:
        return False
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
