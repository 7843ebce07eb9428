"""An index never takes over or deletes files it did not write: creating or saving into a
non-empty folder that holds no index is refused (the folder untouched), and the cleanup after a
commit removes only the index's own stale parts, vector files and prefilter folders."""
import pytest

from colgraph_engine.kg import KnowledgeIndex

from .test_kg_index import ENC, small_docs
from .test_kg_index_growth import city_doc


def user_folder(path):
    (path / "parts").mkdir(parents=True)
    (path / "vectors").mkdir()
    (path / "parts" / "chapter1.txt").write_text("my chapter")
    (path / "vectors" / "emb.bin").write_bytes(b"\x00" * 64)
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def contents(path):
    return {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("how", ["create", "save"])
def test_a_non_empty_folder_without_an_index_is_refused_and_left_as_it_was(tmp_path, how):
    before = user_folder(tmp_path / "mine")
    with pytest.raises(ValueError, match=r"path: .*mine is a non-empty folder that holds no knowledge index "
                                         r"\(parts, vectors\)"):
        if how == "create":
            KnowledgeIndex.create(tmp_path / "mine", ENC)
        else:
            idx = KnowledgeIndex(ENC)
            idx.add_documents(small_docs()[:1])
            idx.save(tmp_path / "mine")
    assert contents(tmp_path / "mine") == before
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == ["parts", "vectors"]


def test_a_file_path_is_refused_and_an_empty_folder_is_used(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="path: .*file exists and is not a folder"):
        KnowledgeIndex.create(tmp_path / "file", ENC)
    assert (tmp_path / "file").read_text() == "x"
    (tmp_path / "empty").mkdir()
    idx = KnowledgeIndex.create(tmp_path / "empty", ENC)
    idx.add_documents(small_docs())
    assert KnowledgeIndex.open(tmp_path / "empty", ENC).documents == idx.documents


def test_commits_remove_only_what_the_index_wrote(tmp_path):
    path = tmp_path / "idx"
    idx = KnowledgeIndex.create(path, ENC)
    idx.add_documents([city_doc(i) for i in range(12)])
    idx.enable_prefilter(min_tokens=50, rebuild_drift=None)
    strays = {path / "parts" / "chapter1.txt": b"mine", path / "vectors" / "emb.bin": b"\x01" * 8,
              path / "vectors" / "segment.bin": b"not ours either", path / "prefilter" / "notes.txt": b"n"}
    (path / "parts" / "drafts").mkdir()
    strays[path / "parts" / "drafts" / "a.md"] = b"draft"
    for p, data in strays.items():
        p.write_bytes(data)
    own_before = {p.name for p in (path / "parts").iterdir()} - {"chapter1.txt", "drafts"}
    idx.remove_document("d0")
    idx.add_documents([city_doc(30)])   # rewrites parts, vector files and the prefilter
    idx.remove_document("d5")
    for p, data in strays.items():
        assert p.read_bytes() == data, p
    own_after = {p.name for p in (path / "parts").iterdir()} - {"chapter1.txt", "drafts"}
    listed = set(idx._parts)
    assert own_after == listed and own_before - listed  # stale parts of our own were removed
    reopened = KnowledgeIndex.open(path, ENC)
    assert reopened.documents == idx.documents
