"""PLAID-style centroid prefilter over packed multi-vector documents.

Modules, one job each: :mod:`.kmeans` (centroids, PLAID's count), :mod:`.codec` (residual
buckets, packing), :mod:`.layout` (the immutable index state and its inverted lists),
:mod:`.build` (building and encoding), :mod:`.stages` (candidate generation, pruned and full
centroid scores), :mod:`.rescore` (exact scores from codes: Triton, native, torch),
:mod:`.search` (settings by k, the staged search, restricted search), :mod:`.prefilter_index`
(:class:`PrefilterIndex`: build, search, add, delete, drift, rebuild, save/load),
:mod:`.persist` (the checksummed directory), :mod:`.auto` (exact brute force or prefilter),
:mod:`.adaptive` (the per-query adaptive candidate budget the pipeline's recall uses),
:mod:`.reference` (slow references for the tests).
"""
from . import adaptive, codec, kmeans, reference, rescore, stages  # noqa: F401  (submodules)
from .auto import AutoSearcher
from .prefilter_index import PrefilterIndex
from .search import SearchResult, Settings

__all__ = ["AutoSearcher", "PrefilterIndex", "SearchResult", "Settings"]
