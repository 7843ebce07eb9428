"""colpali-engine adapter on tiny random ColQwen2, ColQwen2.5 and ColPali (PaliGemma) models saved to disk:
local loading, masks, batching, dtypes, and clear errors for missing or partial model folders."""
import json
import shutil

import numpy as np
import pytest
import torch

pytest.importorskip("colpali_engine")

from colgraph_engine.encoders.colpali import ColPaliEncoder, check_model_dir, detect_family  # noqa: E402

from .tiny_models import tiny_paligemma, tiny_qwen2  # noqa: E402

BUILDERS = {"colqwen2": tiny_qwen2, "colqwen2_5": lambda d: tiny_qwen2(d, version="2.5"), "colpali": tiny_paligemma}


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def model_dir(request, tmp_path_factory):
    return BUILDERS[request.param](tmp_path_factory.mktemp("models") / f"tiny-{request.param}")


@pytest.fixture(scope="module")
def encoder(model_dir):
    return ColPaliEncoder(model_dir, batch_size=2)


def images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 255, (64, 80, 3), dtype=np.uint8), rng.integers(0, 255, (100, 60, 3), dtype=np.uint8),
            rng.integers(0, 255, (56, 56, 3), dtype=np.uint8)]


def test_family_is_read_from_the_config(model_dir, encoder):
    family = model_dir.name.removeprefix("tiny-")
    assert detect_family(model_dir) == family
    assert encoder.family == family and encoder.dim == 128


def test_image_vectors_keep_exactly_the_attended_positions(encoder):
    proc = encoder.processor.process_images([__import__("PIL.Image").Image.fromarray(a) for a in images()])
    attended = proc["attention_mask"].sum(1).tolist()
    vecs = encoder.image_vectors(images())
    assert [v.shape[0] for v in vecs] == attended
    assert all(v.shape[1] == 128 for v in vecs)
    # the model normalises every vector; padding rows (zeros) must not be among them
    norms = torch.cat(vecs).norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_image_tokens_only_keeps_the_patch_positions(model_dir):
    enc = ColPaliEncoder(model_dir, image_tokens_only=True)
    proc = enc.processor.process_images([__import__("PIL.Image").Image.fromarray(a) for a in images()])
    n_image = (proc["input_ids"] == enc._image_token_id).sum(1).tolist()
    assert [v.shape[0] for v in enc.image_vectors(images())] == n_image
    assert n_image[0] < proc["attention_mask"][0].sum()


def test_query_vectors_drop_special_tokens_but_keep_augmentation(encoder):
    (v,) = encoder.query_vectors(["mount fuji"])
    batch = encoder.processor.process_queries(["mount fuji"])
    ids = batch["input_ids"][0][batch["attention_mask"][0].bool()].tolist()
    tok = encoder.processor.tokenizer
    augment = tok.convert_tokens_to_ids(encoder.processor.query_augmentation_token)
    expected = sum(1 for i in ids if i not in tok.all_special_ids or i == augment)
    assert v.shape == (expected, 128)
    assert ids.count(augment) == 10 and expected >= 12  # "mount", "fuji" + 10 augmentation tokens


def test_batching_does_not_change_vectors(model_dir):
    one = ColPaliEncoder(model_dir, batch_size=1)
    three = ColPaliEncoder(model_dir, batch_size=3)
    for a, b in zip(one.image_vectors(images()), three.image_vectors(images())):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4)
    # queries of equal length: PaliGemma's prefix attention lets padding shift query vectors
    # slightly (a property of the model, not of the masking checked here)
    for a, b in zip(one.query_vectors(["mount fuji", "the train"]), three.query_vectors(["mount fuji", "the train"])):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4)


def test_packed_output_and_dtype(model_dir):
    enc = ColPaliEncoder(model_dir, dtype=torch.bfloat16)
    values, offsets = enc.encode_images(images())
    assert values.dtype == torch.bfloat16 and offsets.tolist()[0] == 0 and offsets[-1] == values.shape[0]
    qv, qo = enc.encode_queries(["mount fuji"])
    import colgraph_engine as cg
    scores = cg.maxsim(qv, qo, values, offsets)
    assert scores.shape == (1, 3) and torch.isfinite(scores).all()
    pooled = ColPaliEncoder.pool(enc.image_vectors(images()))
    assert pooled.shape == (3, 128)


def test_roles_for_the_knowledge_graph(encoder):
    tokens = encoder.token_encoder()
    patches = encoder.patch_encoder()
    assert tokens.role == "tokens" and patches.role == "patches" and tokens.dim == 128
    out = patches(images()[:1])
    assert out[0].shape[1] == 128


@pytest.mark.parametrize("damage, match", [
    (lambda d: (d / "model.safetensors").unlink(), "has no weights"),
    (lambda d: (d / "config.json").unlink(), "has no config.json"),
    (lambda d: (d / "tokenizer.json").unlink(), "has no tokenizer"),
    (lambda d: (d / "processor_config.json").unlink() if (d / "processor_config.json").exists()
        else (d / "preprocessor_config.json").unlink(), "has no processor config"),
    (lambda d: (d / "config.json").write_text("{oops"), "not valid JSON"),
])
def test_partial_model_folder_is_refused_before_loading(model_dir, tmp_path, damage, match):
    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    damage(broken)
    with pytest.raises((FileNotFoundError, ValueError), match=match):
        ColPaliEncoder(broken)


def test_missing_shard_and_adapter_only_and_missing_folder(model_dir, tmp_path):
    sharded = tmp_path / "sharded"
    shutil.copytree(model_dir, sharded)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    (sharded / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="lacks weight shards"):
        check_model_dir(sharded)
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="holds only an adapter"):
        ColPaliEncoder(adapter)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        ColPaliEncoder(tmp_path / "vidore-colqwen2-v1.0")  # a hub name is never fetched
    with pytest.raises(ValueError, match="family"):
        ColPaliEncoder(model_dir, family="colbert")


def test_bad_inputs_are_named(encoder):
    with pytest.raises(TypeError, match="texts"):
        encoder.query_vectors("mount fuji")
    with pytest.raises(TypeError, match=r"images\[0\]"):
        encoder.image_vectors(["not an image"])
    with pytest.raises(ValueError, match=r"images\[0\]"):
        encoder.image_vectors([np.zeros((4, 4, 3), np.float32)])
