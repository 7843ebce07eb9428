"""Deterministic clustered multi-vector data for demos, benchmarks and tests.

Real late-interaction corpora are clustered: a document's token vectors come from a handful of
topics. Here each document mixes `topics_per_doc` of `n_topics` random unit centroids plus
noise, and each query draws its tokens from `query_topics` of its target document's topics, so
exact search has a right answer (the target), a prefilter's recall means something, and one
pooled vector per document (which averages all of its topics) is at a disadvantage, as in
real pages that mix many subjects.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _noisy_unit(centroids: torch.Tensor, pick: torch.Tensor, noise: float, g: torch.Generator) -> torch.Tensor:
    dim = centroids.shape[1]
    return F.normalize(centroids[pick] + noise / dim ** 0.5 * torch.randn(pick.numel(), dim, generator=g), dim=-1)


def clustered_corpus(n_docs: int, doc_tokens: tuple[int, int] | int, dim: int, *, n_topics: int = 4096,
                     topics_per_doc: int = 16, noise: float = 0.35, seed: int = 0):
    """Returns ``(centroids [n_topics, dim], doc_topics [n_docs, topics_per_doc], docs)`` where
    ``docs`` is a list of ``[L_i, dim]`` float32 unit-vector views; L_i is fixed (int) or
    uniform in ``[lo, hi]`` (tuple)."""
    g = torch.Generator().manual_seed(seed)
    centroids = F.normalize(torch.randn(n_topics, dim, generator=g), dim=-1)
    doc_topics = torch.randint(0, n_topics, (n_docs, topics_per_doc), generator=g)
    lo, hi = (doc_tokens, doc_tokens) if isinstance(doc_tokens, int) else doc_tokens
    lengths = torch.randint(lo, hi + 1, (n_docs,), generator=g)
    owner = torch.repeat_interleave(torch.arange(n_docs), lengths)
    pick = doc_topics[owner, torch.randint(0, topics_per_doc, (owner.numel(),), generator=g)]
    tokens = _noisy_unit(centroids, pick, noise, g)
    return centroids, doc_topics, list(torch.split(tokens, lengths.tolist()))


def queries_for(centroids: torch.Tensor, doc_topics: torch.Tensor, n_queries: int, query_tokens: int, *,
                query_topics: int = 3, noise: float = 0.5, seed: int = 1):
    """Returns ``(targets [n_queries] int64, queries: list of [query_tokens, dim] float32)``.
    Each query asks about `query_topics` of its target document's topics."""
    g = torch.Generator().manual_seed(seed)
    n_docs, tpd = doc_topics.shape
    targets = torch.randint(0, n_docs, (n_queries,), generator=g)
    chosen = torch.stack([torch.randperm(tpd, generator=g)[:query_topics] for _ in range(n_queries)])
    topics = doc_topics[targets[:, None], chosen]                    # [n_queries, query_topics]
    pick = topics.gather(1, torch.randint(0, query_topics, (n_queries, query_tokens), generator=g))
    tokens = _noisy_unit(centroids, pick.reshape(-1), noise, g)
    return targets, list(tokens.view(n_queries, query_tokens, -1))
