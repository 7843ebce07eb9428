"""The knowledge-graph demo runs end to end offline and leaves a loadable index behind."""
import re

from colgraph_engine.demos import kg_demo
from colgraph_engine.kg import KnowledgeIndex


def test_kg_demo_builds_lists_and_answers(tmp_path, capsys):
    assert kg_demo.main(["--out", str(tmp_path / "idx")]) == 0
    out = capsys.readouterr().out
    assert "fuji-ride      segments 2  entities  4  relations  3  images 1  regions 3" in out
    # index format 3: a part is one file (graphs and item tables), the vectors live in one mapped file per store
    assert "manifest.json" in out and re.search(r"p\d{6}-[0-9a-f]{8}\.part", out) and "vectors/" in out
    assert re.search(r"region\.[0-9a-f]+\.bin", out)
    # the question reaches the photo's regions through the alias-merged Mount Fuji
    assert "region 'relation-1' of fuji-ride bbox (0.0, 0.05, 0.9, 0.95)" in out
    index = KnowledgeIndex.open(tmp_path / "idx")
    assert index.documents == ["fuji-ride", "shizuoka-tea", "tokyo-station"]
    assert index.counts["region_vectors"] == 3


def test_colgraph_demo_runs_the_other_demos(tmp_path, capsys):
    """`colgraph demo kg|store [options]` runs the knowledge-graph and the store demos with their
    own options (the colgraph-kg-demo / colgraph-demo entry points are the same functions)."""
    from colgraph_engine.cli import main as colgraph

    assert colgraph(["demo", "kg", "--out", str(tmp_path / "kg")]) == 0
    out = capsys.readouterr().out
    assert "region 'relation-1' of fuji-ride bbox (0.0, 0.05, 0.9, 0.95)" in out
    assert KnowledgeIndex.open(tmp_path / "kg").documents == ["fuji-ride", "shizuoka-tea", "tokyo-station"]
    assert colgraph(["demo", "store", "--docs", "60", "--queries", "4", "--dim", "32"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"store: 60 documents, \d+ tokens, d=32", out) and "Hit@1" in out
