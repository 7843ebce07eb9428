"""Deprecated alias of :mod:`colgraph_engine.prefilter` (the PLAID-style centroid prefilter).

The package was called ``colgraph_engine.index`` until 0.1; its new name says what it holds (the
knowledge index is :class:`colgraph_engine.kg.KnowledgeIndex`). Importing this module warns once;
``colgraph_engine.index.<submodule>`` keeps resolving to ``colgraph_engine.prefilter.<submodule>``
(and ``colgraph_engine.index.prefilter`` to ``colgraph_engine.prefilter.prefilter_index``).
"""
from __future__ import annotations

import importlib
import sys
import warnings

from .prefilter import *  # noqa: F401,F403  (the public names)
from .prefilter import __all__  # noqa: F401

warnings.warn("colgraph_engine.index is deprecated: import colgraph_engine.prefilter", DeprecationWarning, stacklevel=2)

_RENAMED = {"prefilter": "prefilter_index"}
for _name in ("adaptive", "auto", "build", "codec", "dense", "kmeans", "layout", "persist", "prefilter",
              "reference", "rescore", "search", "stages"):
    _module = importlib.import_module(f"{__package__}.prefilter.{_RENAMED.get(_name, _name)}")
    sys.modules[f"{__name__}.{_name}"] = _module
    globals()[_name] = _module
del _name, _module
