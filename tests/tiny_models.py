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


def tiny_qwen2(folder: Path, seed: int = 0) -> Path:
    """A ColQwen2 with 1 vision block and 1 text layer (hidden 32, dim 128) and its processor."""
    from colpali_engine.models import ColQwen2, ColQwen2Processor
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen2VLConfig
    from transformers.models.qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    # special tokens are split off by the added-token matcher; words by whitespace
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]", pad_token="<|endoftext|>",
                                  eos_token="<|im_end|>", bos_token="<|im_start|>")
    tok.add_special_tokens({"additional_special_tokens": SPECIALS})
    processor = ColQwen2Processor(image_processor=Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16),
                                  tokenizer=tok, video_processor=Qwen2VLVideoProcessor())
    config = Qwen2VLConfig(
        text_config=dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         rope_scaling={"type": "mrope", "mrope_section": [2, 2, 4]},
                         bos_token_id=vocab["<|im_start|>"], eos_token_id=vocab["<|im_end|>"]),
        vision_config=dict(depth=1, embed_dim=32, hidden_size=32, num_heads=2, mlp_ratio=2, patch_size=14,
                           spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
        image_token_id=vocab["<|image_pad|>"], video_token_id=vocab["<|video_pad|>"],
        vision_start_token_id=vocab["<|vision_start|>"], architectures=["ColQwen2"])
    return _save(ColQwen2, config, processor, folder, seed)


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
