"""`colgraph index build` makes a new index carry the recall stores' prefilters, deferred until
a store is large enough for the default recall ranker to use one; `--no-prefilter` opts out."""
from colgraph_engine.cli import main
from colgraph_engine.kg import KnowledgeIndex
from colgraph_engine.pipeline import Pipeline


def test_a_new_index_carries_deferred_prefilters_and_queries_stay_exact(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text("# Rivers\n\nThe Rhine flows past Basel and Cologne.\n")
    (docs / "b.txt").write_text("Mount Fuji is visible from Tokyo on clear days.\n")
    assert main(["index", "build", "--encoders", "hashing", str(docs), "--out", str(tmp_path / "ix"), "--no-isolate"]) == 0
    index = KnowledgeIndex.open(tmp_path / "ix")
    info = index.prefilter_info()
    assert info is not None and set(info["stores"]) == {"segment", "table", "image"} & set(index.dims)
    widest = max(index.dims[s] for s in info["stores"])
    assert info["min_tokens"] == max(4096, (1 << 18) * 128 // widest)
    assert all(s["state"] == "deferred" for s in info["stores"].values())  # a small index pays no k-means
    from colgraph_engine.cli import ENCODER_SETS
    r = Pipeline(KnowledgeIndex.open(tmp_path / "ix", ENCODER_SETS["hashing"]()), ENCODER_SETS["hashing"]()).retrieve(
        "Which river flows past Basel?")
    assert r.documents[0][0] == "a.md" and all(p.startswith("exact") for p in r.counts["recall"]["paths"].values())
    assert main(["index", "build", "--encoders", "hashing", str(docs), "--out", str(tmp_path / "plain"), "--no-isolate", "--no-prefilter"]) == 0
    assert KnowledgeIndex.open(tmp_path / "plain").prefilter_info() is None
