"""Public operations. Each validates its inputs, resolves a backend and runs it."""
from .scoring import maxsim, maxsim_candidates, maxsim_topk, pooled_scores

__all__ = ["maxsim", "maxsim_candidates", "maxsim_topk", "pooled_scores"]
