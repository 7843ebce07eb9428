"""benchmarks/lightrag_peer.py without LightRAG: the corpus and questions it shares with
pipeline_report.py, the texts it gives LightRAG (equal to what our index embeds), the word
tokenizer, and our side's worker protocol (ingest, then query / batch / mem / exit) on a tiny
corpus. The LightRAG side runs only where its virtual environment already exists (the
benchmark makes it; tests never install it)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"


def _load(name: str):
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peer():
    return _load("lightrag_peer")


@pytest.fixture(scope="module")
def side():
    return _load("_lightrag_side")


def test_questions_match_pipeline_report_and_name_their_source(peer):
    pr = _load("pipeline_report")
    qs = peer.questions(12, 40, 0)
    assert [q["q"] for q in qs] == pr.make_questions(12, 40, 0, n_images=0)
    docs = {d.doc_id: d for d in peer.documents(40, 0)}
    for q in qs:
        records = "\n".join(docs[q["source"]].extractions)
        assert f"relation<|#|>{q['a']}<|#|>{q['b']}<|#|>" in records


def test_lightrag_items_have_our_texts(peer, side):
    doc = next(peer.documents(30, 0, 5, 6))
    kg = side.custom_kg_of([peer.as_row(doc)])
    assert len(kg["chunks"]) == 5 and len(kg["entities"]) == 10 and len(kg["relationships"]) == 10
    assert {c["file_path"] for c in kg["chunks"] + kg["entities"] + kg["relationships"]} == {doc.doc_id}
    items = side.vdb_items(kg)
    assert peer._check_our_texts(doc, [o for _, o in items]) == []
    assert len({side.text_key(lr) for lr, _ in items}) == len(items)


def test_relation_from_a_name_to_itself_is_left_out_as_our_parser_does(side):
    from colgraph_engine.kg.parsers import parse_extraction
    records = ("entity<|#|>Denlu Company<|#|>organization<|#|>a firm\n"
               "relation<|#|>Denlu Company<|#|>Denlu Company<|#|>owns<|#|>itself\n"
               "relation<|#|>Denlu Company<|#|>Kato Mira<|#|>hires<|#|>a clerk")
    kg = side.custom_kg_of([{"doc_id": "d0", "segments": ["text"], "extractions": [records]}])
    assert [(r["src_id"], r["tgt_id"]) for r in kg["relationships"]] == [("Denlu Company", "Kato Mira")]
    ours = parse_extraction(records)
    assert [(r.source, r.target) for r in ours.relations] == [("Denlu Company", "Kato Mira")]


def test_word_tokenizer_round_trips(side):
    import copy
    tok = side.WordTokenizer()
    for text in ("What is the relation between Kato Mira and Lu-Den?\n  x", "", " . ,  a"):
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("Kato Mira founded Lu, twice.")) == 7
    assert copy.deepcopy(tok) is tok


def test_vector_lookup(side, tmp_path):
    texts = ["a", "b c", "d\ne"]
    keys = np.asarray([side.text_key(t) for t in texts], np.uint64)
    order = np.argsort(keys)
    vec = np.arange(3 * side.DIM, dtype=np.float32).reshape(3, side.DIM)
    np.save(tmp_path / "v.npy", vec[order])
    np.save(tmp_path / "k.npy", keys[order])
    look = side.VectorLookup(str(tmp_path / "v.npy"), str(tmp_path / "k.npy"))
    np.testing.assert_array_equal(look(["d\ne", "a"]), vec[[2, 0]])
    with pytest.raises(KeyError, match="no precomputed vector"):
        look(["a", "unknown"])


def test_our_worker_protocol(peer, tmp_path):
    me = str(BENCH / "lightrag_peer.py")
    res = peer.run_job("ingest", [sys.executable, me, "_ours-ingest", "--docs", "30", "--out", str(tmp_path / "ours"),
                                  "--chunk", "20"], ROOT, tmp_path / "ingest.log", None, False)
    assert res["documents"] == 30 and res["counts"]["entities"] == 300 and res["ingest_s"] > 0
    assert res["hwm_bytes"] >= res["rss_bytes"] > 0
    qs = peer.questions(4, 30, 0)
    w = peer.Worker("ours", [sys.executable, me, "_ours-serve", "--index", str(tmp_path / "ours")], ROOT,
                    tmp_path / "serve.log")
    try:
        from colgraph_engine.pipeline import PipelineConfig
        assert w.ready["ready"] and w.ready["config"] == PipelineConfig().as_dict() and w.ready["open_s"] > 0
        side = peer.Side("ours", w, "ours")
        for q in qs:
            r = w.call(side.request(q))
            assert r["ms"] > 0 and r["docs"] and all(d.startswith("doc-") for d in r["docs"])
            side.record(q, r)
        b = w.call(side.batch_request(qs))
        assert b["n"] == 4 and len(b["docs"]) == 4
        m = w.call({"op": "mem"})
        assert m["rss_bytes"] > 0
        s = side.summary()
        assert s["queries"] == 4 and 0 <= s["hit_rate"] <= 1 and s["p99_ms"] >= s["p50_ms"] > 0
        assert s["recall_hit_rate"] >= 0.5  # 30 documents, Kd = 10: the source is usually recalled
    finally:
        w.close()
    assert w.proc.returncode == 0


def test_lightrag_side_if_installed(peer, side, tmp_path):
    py = peer.CACHE / "venv" / "bin" / "python"
    if not py.exists() or subprocess.run([str(py), "-c", "import lightrag"], capture_output=True).returncode:
        pytest.skip(f"LightRAG's virtual environment is absent ({py}); benchmarks/lightrag_peer.py makes it")
    from colgraph_engine.kg import Encoders
    prep = peer.prepare(20, 4, 0, tmp_path, Encoders.offline(text_dim=128), False)
    assert prep["our_text_mismatches"] == []
    res = peer.run_job("lr ingest", [str(py), str(peer.SIDE), "ingest", "--workdir", str(tmp_path / "lr"), "--corpus",
                                     str(tmp_path / "corpus.jsonl"), "--vectors", str(tmp_path / "lr_vectors.npy"),
                                     "--keys", str(tmp_path / "lr_keys.npy"), "--batch", "10"],
                       tmp_path, tmp_path / "lr_ingest.log", None, False)
    assert res["documents"] == 20 and len(res["batches_s"]) == 2
    w = peer.Worker("lightrag", [str(py), str(peer.SIDE), "serve", "--workdir", str(tmp_path / "lr"), "--vectors",
                                 str(tmp_path / "lr_vectors.npy"), "--keys", str(tmp_path / "lr_keys.npy")],
                    tmp_path, tmp_path / "lr_serve.log")
    try:
        qs = json.loads((tmp_path / "questions.json").read_text())
        for name, mode, kw in peer.LIGHTRAG_ROWS:
            s = peer.Side(name, w, "lightrag", mode, kw)
            r = w.call(s.request(qs[0]))
            assert r["status"] == "success" and r["docs"], (name, r)
        b = w.call(peer.Side("x", w, "lightrag", "local", "question").batch_request(qs))
        assert b["n"] == 4
    finally:
        w.close()


def test_memory_check_fits_growth_between_two_sizes(peer):
    """With two sizes measured, the estimate is the larger one's peak plus the growth per
    document between them (x1.25), not the per-document average of the fixed part."""
    gib = 2 ** 30
    one = {"documents": 1000, "hwm_bytes": int(1.6 * gib), "rss_after_import_bytes": int(0.6 * gib)}
    ten = {"documents": 10000, "hwm_bytes": int(2.7 * gib), "rss_after_import_bytes": int(0.6 * gib)}
    ok, note = peer.fits_ours(100_000, [one, ten], 18 * gib)
    assert ok and "per further document" in note  # 2.1 + 1.1 GiB / 9k x 90k x 1.25 = 15.9 GiB
    ok, _ = peer.fits_ours(100_000, [one, ten], 15 * gib)
    assert not ok
    ok, note = peer.fits_ours(100_000, [one], 18 * gib)  # one size: per document, 1.0 GiB / 1k x 100k
    assert not ok and "KiB per document at 1,000" in note
    assert peer.fits_ours(5, [], 1) == (True, "no smaller size measured: tried")


def test_the_exact_row_is_left_out_above_its_limit(peer):
    import argparse
    a = argparse.Namespace(exact_max_docs=10_000)
    assert [r[0] for r in peer.our_rows(10_000, a)] == ["ours", "ours-exact"]
    assert [r[0] for r in peer.our_rows(100_000, a)] == ["ours"]
    assert [r[0] for r in peer.our_rows(100_000, argparse.Namespace(exact_max_docs=0))] == ["ours", "ours-exact"]
