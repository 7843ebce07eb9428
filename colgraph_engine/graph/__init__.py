"""Typed multimodal knowledge graph and batched, relevance-filtered BFS expansion."""
from .expansion import Expansion, QueryExpansion
from .kinds import EdgeKind, NodeKind, kind_mask
from .knowledge_graph import Csr, KnowledgeGraph, SparseScores, normalize_name

__all__ = ["Csr", "EdgeKind", "Expansion", "KnowledgeGraph", "NodeKind", "QueryExpansion", "SparseScores", "kind_mask",
           "normalize_name"]
