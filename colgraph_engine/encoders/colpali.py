"""ColPali-family models through colpali-engine, loaded from a local folder only.

A model folder must hold ``config.json``, the weights (``model.safetensors``, a sharded
``*.safetensors.index.json`` with every shard, or ``pytorch_model.bin``) and the processor
(``preprocessor_config.json`` or ``processor_config.json``, and a tokenizer). Anything missing
raises FileNotFoundError naming it before transformers is called, and loading passes
``local_files_only=True``: nothing is ever downloaded. An adapter-only folder (LoRA) is refused
with the reason, because resolving its base model would mean a download.

What scores (the masks applied before packing):
* documents (images): every position the model attends to (``attention_mask == 1``), as in
  ColPali; ``image_tokens_only=True`` keeps only the image-patch positions;
* queries: attended positions minus the tokenizer's special tokens (BOS, EOS, role markers),
  except the query-augmentation token the model was trained to use as a buffer; padding never
  scores in either case.
Vectors come out L2-normalised by the model (``dim`` is usually 128). PaliGemma-based ColPali
attends over its whole prefix, so a query's vectors shift slightly with the padding of its batch
(a property of the model; batch queries of similar length, or use ``batch_size=1`` for
bit-stable vectors).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ._batching import batches, check_common, check_images, check_texts, pack_list
from .base import Encoder
from .._kernels_name import load_installed_kernels

# family -> (model class, processor class) in colpali_engine.models
FAMILIES: dict[str, tuple[str, str]] = {
    "colpali": ("ColPali", "ColPaliProcessor"),
    "colqwen2": ("ColQwen2", "ColQwen2Processor"),
    "colqwen2_5": ("ColQwen2_5", "ColQwen2_5_Processor"),
    "colqwen3": ("ColQwen3", "ColQwen3Processor"),
    "colidefics3": ("ColIdefics3", "ColIdefics3Processor"),
    "colmodernvbert": ("ColModernVBert", "ColModernVBertProcessor"),
    "colgemma3": ("ColGemma3", "ColGemmaProcessor3"),
}
# config.json model_type -> family, when "architectures" does not name a colpali class
_MODEL_TYPES = {"paligemma": "colpali", "qwen2_vl": "colqwen2", "qwen2_5_vl": "colqwen2_5", "qwen3_vl": "colqwen3",
                "idefics3": "colidefics3", "modernvbert": "colmodernvbert", "gemma3": "colgemma3"}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def check_model_dir(path: str | os.PathLike) -> Path:
    """Checks that `path` holds a complete model and processor; returns it as a Path."""
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"path: {path} is not a folder (colpali models load from a local folder only)")
    names = {p.name for p in path.iterdir()}
    if "config.json" not in names:
        if "adapter_config.json" in names:
            raise FileNotFoundError(f"path: {path} holds only an adapter (adapter_config.json); merge it into its "
                                    "base model and pass the merged folder (loading the base would need a download)")
        raise FileNotFoundError(f"path: {path} has no config.json")
    try:
        json.loads((path / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"path: {path / 'config.json'} is not valid JSON ({exc})") from None
    index = [n for n in names if n.endswith(".safetensors.index.json") or n == "pytorch_model.bin.index.json"]
    if index:
        shards = set(json.loads((path / index[0]).read_text()).get("weight_map", {}).values())
        missing = sorted(s for s in shards if s not in names)
        if missing or not shards:
            raise FileNotFoundError(f"path: {path} lacks weight shards {missing or '(index lists none)'}")
    elif not ({"model.safetensors", "pytorch_model.bin"} & names):
        raise FileNotFoundError(f"path: {path} has no weights (model.safetensors, a sharded index, or pytorch_model.bin)")
    if not set(_PROCESSOR_FILES) & names:
        raise FileNotFoundError(f"path: {path} has no processor config ({' or '.join(_PROCESSOR_FILES)})")
    if not set(_TOKENIZER_FILES) & names:
        raise FileNotFoundError(f"path: {path} has no tokenizer ({', '.join(_TOKENIZER_FILES)})")
    return path


def detect_family(path: Path) -> str:
    config = json.loads((path / "config.json").read_text())
    for arch in config.get("architectures") or []:
        if arch.lower() in FAMILIES:
            return arch.lower()
        for family, (model_cls, _) in FAMILIES.items():
            if arch == model_cls:
                return family
    family = _MODEL_TYPES.get(config.get("model_type", ""))
    if family is None:
        raise ValueError(f"family: cannot tell the colpali family of {path} (architectures "
                         f"{config.get('architectures')}, model_type {config.get('model_type')!r}); pass one of "
                         f"{sorted(FAMILIES)}")
    return family


def _tie_unloaded_heads(model: torch.nn.Module, path: Path) -> None:
    """Ties a language-model head left on the meta device to the input embeddings, then
    refuses any other parameter the folder did not provide.

    Checkpoints with tied embeddings omit ``lm_head.weight``; with colpali-engine's key mapping
    under transformers 5 the head then stays unloaded, and moving the model fails. Retrieval
    never calls the head, and tying restores what the checkpoint meant.
    """
    for module in model.modules():
        head = getattr(module, "lm_head", None)
        if isinstance(head, torch.nn.Linear) and head.weight.is_meta and hasattr(module, "get_input_embeddings"):
            head.weight = module.get_input_embeddings().weight
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ValueError(f"path: {path} does not provide weights for {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


class ColPaliEncoder:
    """Query token vectors and image patch vectors from a ColPali-family model.

    Args:
        path: local model folder (see the module docstring).
        family: one of ``FAMILIES`` (default: read from ``config.json``).
        device: where the model runs. model_dtype: its weights' dtype (default float32 on CPU,
            bfloat16 on CUDA). dtype: dtype of returned vectors.
        batch_size: items per forward pass.
        image_tokens_only: documents keep only image-patch positions.
    """

    def __init__(self, path: str | os.PathLike, *, family: str | None = None, device: str | torch.device = "cpu",
                 model_dtype: torch.dtype | None = None, dtype: torch.dtype = torch.float32, batch_size: int = 4,
                 image_tokens_only: bool = False):
        self.device, self.dtype, self.batch_size = check_common(device, dtype, batch_size)
        path = check_model_dir(path)
        if family is None:
            family = detect_family(path)
        elif family not in FAMILIES:
            raise ValueError(f"family: expected one of {sorted(FAMILIES)}, got {family!r}")
        if model_dtype is None:
            model_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        load_installed_kernels()  # before transformers: a source checkout's kernels/ may hide it
        try:
            import colpali_engine.models as cm
        except ImportError:
            raise ImportError("colpali-engine is not installed: `pip install colpali-engine`") from None
        model_cls, proc_cls = (getattr(cm, name) for name in FAMILIES[family])
        model = model_cls.from_pretrained(path, local_files_only=True, dtype=model_dtype)
        _tie_unloaded_heads(model, path)
        self.model = model.to(self.device).eval()
        self.processor = proc_cls.from_pretrained(path, local_files_only=True)
        self.family, self.path, self.image_tokens_only = family, path, image_tokens_only
        self.dim = int(getattr(self.model, "dim", 128))
        tok = self.processor.tokenizer
        augment = getattr(self.processor, "query_augmentation_token", None)
        augment_ids = set(tok.convert_tokens_to_ids([augment])) if augment else set()
        self._dropped_query_ids = torch.tensor(sorted(set(tok.all_special_ids) - augment_ids), dtype=torch.int64)
        self._image_token_id = getattr(self.model.config, "image_token_id", None)
        if self._image_token_id is None:
            self._image_token_id = getattr(self.model.config, "image_token_index", None)
        self.name = f"{family}:{path.name}"

    @torch.inference_mode()
    def _run(self, batch) -> tuple[torch.Tensor, dict]:
        batch = {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        return self.model(**batch).float().cpu(), {k: v.cpu() for k, v in batch.items() if isinstance(v, torch.Tensor)}

    def query_vectors(self, texts, *, progress: bool = False) -> list[torch.Tensor]:
        """``[L_i, dim]`` per query (padding and special tokens other than augmentation removed)."""
        texts = check_texts(texts)
        out = []
        for chunk in batches(texts, self.batch_size, progress, f"{self.family} queries"):
            emb, batch = self._run(self.processor.process_queries(list(chunk)))
            keep = batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], self._dropped_query_ids)
            out.extend(emb[i][keep[i]].to(self.dtype) for i in range(len(chunk)))
        return out

    def image_vectors(self, images, *, progress: bool = False) -> list[torch.Tensor]:
        """``[P_i, dim]`` per image (attended positions, or image-patch positions only)."""
        images = check_images(images)
        out = []
        for chunk in batches(images, self.batch_size, progress, f"{self.family} images"):
            emb, batch = self._run(self.processor.process_images(list(chunk)))
            keep = batch["attention_mask"].bool()
            if self.image_tokens_only:
                if self._image_token_id is None:
                    raise ValueError("image_tokens_only: the model config names no image token id")
                keep &= batch["input_ids"] == self._image_token_id
            out.extend(emb[i][keep[i]].to(self.dtype) for i in range(len(chunk)))
        return out

    def encode_queries(self, texts, *, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Packed ``(values [T, dim], offsets [N+1])``."""
        return pack_list(self.query_vectors(texts, progress=progress), self.dim, self.dtype)

    def encode_images(self, images, *, progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        return pack_list(self.image_vectors(images, progress=progress), self.dim, self.dtype)

    @staticmethod
    def pool(vectors: list[torch.Tensor]) -> torch.Tensor:
        """``[N, dim]``: the normalised mean of each item's vectors (the pooled baseline)."""
        if not vectors:
            return torch.zeros((0, 0))
        return torch.stack([torch.nn.functional.normalize(v.float().mean(0), dim=0) for v in vectors])

    @property
    def source(self) -> tuple[tuple[str, str], ...]:
        """Where the model came from, as index manifests record it: the family and the folder's
        absolute path (see ``colgraph_engine.encoders.sets``, which reopens an index with it)."""
        return (("family", self.family), ("path", str(self.path.resolve())))

    def token_encoder(self) -> Encoder:
        """The ``tokens`` role: query token vectors ``[L, dim]``, named ``<family>:<folder>:queries``
        (one embedding space with :meth:`patch_encoder`, so the pipeline ranks images by patches)."""
        return Encoder(lambda texts: [t.float() for t in self.query_vectors(texts)], f"{self.name}:queries",
                       self.dim, "tokens", self.source)

    def patch_encoder(self) -> Encoder:
        """The ``patches`` role: image patch vectors ``[P, dim]``, named ``<family>:<folder>:images``."""
        return Encoder(lambda images: [t.float() for t in self.image_vectors(images)], f"{self.name}:images",
                       self.dim, "patches", self.source)
