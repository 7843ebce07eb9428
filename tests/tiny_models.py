"""Tiny randomly initialised colpali-engine models with processors built offline (no weights exist
here, so tests check shapes, masks, batching and dtypes, not quality)."""
from __future__ import annotations

from pathlib import Path

import torch

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>",
            "<|video_pad|>"]
WORDS = ["[UNK]", "user", "describe", "the", "image.", "query:", "mount", "fuji", "train", "seen", "from", "a",
         "window", "Describe"]


def _save(model_cls, config, processor, folder: Path, seed: int) -> Path:
    """Initialises `model_cls(config)` from `seed` and saves it with `processor` into `folder`."""
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder


def _qwen_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    # special tokens are split off by the added-token matcher; words by whitespace
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="<|endoftext|>",
                                  eos_token="<|im_end|>", bos_token="<|im_start|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    return vocab, tok


def tiny_qwen2(folder: Path, seed: int = 0, version: str = "2") -> Path:
    """A ColQwen2 (``version="2"``) or ColQwen2.5 (``"2.5"``) with 1 vision block and 1 text layer
    (hidden 32, dim 128) and its processor."""
    import colpali_engine.models as cm
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    vocab, tok = _qwen_tokenizer()
    model_cls, proc_cls, config_cls = {
        "2": (cm.ColQwen2, cm.ColQwen2Processor, Qwen2VLConfig),
        "2.5": (cm.ColQwen2_5, cm.ColQwen2_5_Processor, Qwen2_5_VLConfig)}[version]
    processor = proc_cls(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16),
                         tokenizer=tok, video_processor=Qwen2VLVideoProcessor())
    vision = dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, in_channels=3)
    if version == "2.5":
        vision.update(intermediate_size=64, out_hidden_size=32, window_size=56, fullatt_block_indexes=[0])
    config = config_cls(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]},
                         bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"]),
        vision_config=vision,
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], architectures=[model_cls.__name__])
    return _save(model_cls, config, processor, folder, seed)


def tiny_paligemma(folder: Path, seed: int = 0) -> Path:
    """A ColPali (PaliGemma: SigLIP vision, Gemma text; 1 layer each, hidden 32) and its processor
    with 28-pixel images (4 image tokens)."""
    from colpali_engine.models import ColPali, ColPaliProcessor
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PaliGemmaConfig, PreTrainedTokenizerFast, SiglipImageProcessor

    specials = ["<pad>", "<eos>", "<bos>", "<image>"]
    vocab = {w: i for i, w in enumerate(specials + ["[UNK]", "Describe", "the", "image.", "Question:", "mount",
                                                    "fuji", "train", "\n"])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="<pad>", eos_token="<eos>",
                                  bos_token="<bos>")
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = SiglipImageProcessor(size={"height": 28, "width": 28})
    image_processor.image_seq_length = 4
    processor = ColPaliProcessor(image_processor=image_processor, tokenizer=tok)
    config = PaliGemmaConfig(
        vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, image_size=28, patch_size=14, projection_dim=32),
        text_config=dict(model_type="gemma", vocab_size=len(vocab), hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16, pad_token_id=0),
        image_token_index=vocab["<image>"], projection_dim=32, architectures=["ColPali"])
    return _save(ColPali, config, processor, folder, seed)
