"""Deterministic offline text encoders by feature hashing (no model, no download).

A word ``w`` (lower-cased ``\\w+`` run) maps to the signed sum of hashed features: the word
itself and its character trigrams of ``"<w>"``, each feature f adding ``sign(f) * e_{h(f) mod d}``;
the sum is L2-normalised. Words that share spelling share dimensions, so "Shinkansen" and
"shinkansen's" land close while unrelated words are near-orthogonal for d >= 64. It is a lexical
baseline, not a semantic model: it makes the pipeline run end to end offline and gives the tests
real, reproducible vectors. ``crc32`` keeps it identical across processes (``hash()`` is salted).
"""
from __future__ import annotations

import re
import zlib
from functools import lru_cache

import numpy as np
import torch

from .base import Encoder

_WORD = re.compile(r"\w+")


class HashingTextEncoder:
    """Token and pooled text vectors by feature hashing.

    Args:
        dim: output dimension d.
        max_tokens: words kept per text for token multi-vectors (the first ones).
    """

    def __init__(self, dim: int = 128, max_tokens: int = 512):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 8:
            raise ValueError(f"dim: expected an int >= 8, got {dim!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
        self.dim, self.max_tokens = dim, max_tokens
        self.name = f"hashing-trigram-d{dim}"
        self._word_vector = lru_cache(maxsize=1 << 18)(self._compute_word_vector)

    def _compute_word_vector(self, word: str) -> np.ndarray:
        padded = f"<{word}>"
        features = [word] + [padded[i:i + 3] for i in range(len(padded) - 2)]
        v = np.zeros(self.dim, np.float32)
        for f in features:
            h = zlib.crc32(f.encode("utf-8"))
            v[h % self.dim] += 1.0 if (h >> 31) & 1 else -1.0
        norm = float(np.linalg.norm(v))
        return v / norm if norm > 0 else v

    def words(self, text: str) -> list[str]:
        if not isinstance(text, str):
            raise TypeError(f"texts: expected str items, got {type(text).__name__}")
        return _WORD.findall(text.lower())

    def token_vectors(self, texts: list[str]) -> list[torch.Tensor]:
        """``[L_i, d]`` per text, one row per word (at most ``max_tokens``)."""
        out = []
        for text in texts:
            words = self.words(text)[: self.max_tokens]
            rows = [self._word_vector(w) for w in words]
            out.append(torch.from_numpy(np.stack(rows)) if rows else torch.zeros((0, self.dim)))
        return out

    def text_vectors(self, texts: list[str]) -> torch.Tensor:
        """``[k, d]``: the normalised mean of each text's word vectors (zeros for a text with no word)."""
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, text in enumerate(texts):
            words = self.words(text)
            if words:
                v = np.sum([self._word_vector(w) for w in words], axis=0)
                norm = float(np.linalg.norm(v))
                out[i] = v / norm if norm > 0 else v
        return torch.from_numpy(out)

    def text_encoder(self) -> Encoder:
        return Encoder(self.text_vectors, self.name, self.dim, "text")

    def token_encoder(self) -> Encoder:
        return Encoder(self.token_vectors, f"{self.name}-tokens{self.max_tokens}", self.dim, "tokens")
