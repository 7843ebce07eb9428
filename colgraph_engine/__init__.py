"""colgraph_engine: exact late-interaction retrieval for multimodal GraphRAG.

Quick start::

    import torch, colgraph_engine as cg
    docs_v, docs_o = cg.pack([torch.randn(300, 128) for _ in range(100)])
    q_v, q_o = cg.pack([torch.randn(32, 128)])
    scores, idx = cg.maxsim_topk(q_v, q_o, docs_v, docs_o, k=5)

``cg.backends()`` tells which implementations can run here and why not.
"""
from .backend import report as backends
from .store import GraphedSearch
from .prefilter import AutoSearcher, PrefilterIndex
from .ops import maxsim, maxsim_candidates, maxsim_topk, pooled_scores
from .packed import pack, unpack
from .store import PackedStore, StoreFormatError

__version__ = "0.1.0"

__all__ = [
    "AutoSearcher",
    "GraphedSearch",
    "PackedStore",
    "PrefilterIndex",
    "StoreFormatError",
    "backends",
    "maxsim",
    "maxsim_candidates",
    "maxsim_topk",
    "pack",
    "pooled_scores",
    "unpack",
]
