"""PLAID-style centroid prefilter over packed multi-vector documents (see :mod:`.prefilter`)."""
from . import codec, kmeans, reference, rescore, stages  # noqa: F401  (submodules)
from .auto import AutoSearcher
from .prefilter import PrefilterIndex
from .search import SearchResult, Settings

__all__ = ["AutoSearcher", "PrefilterIndex", "SearchResult", "Settings"]
