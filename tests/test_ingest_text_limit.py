"""``max_text_mb``: a text file larger than the limit is read from its head only, cut where no
word or character is split, with a warning; smaller files are read whole; bad values are
refused before anything is read."""
import pytest

from colgraph_engine.ingest.readers import read_path
from colgraph_engine.ingest.readers.dispatch import text_head

MiB = 1 << 20


def test_text_head_cuts_at_whitespace_or_a_character_boundary():
    assert text_head(b"alpha beta gamma", 100) == b"alpha beta gamma"
    assert text_head(b"alpha beta gamma", 12) == b"alpha beta "
    word = "é" * 3000  # 6000 bytes of two-byte characters, no whitespace in the last 4 KiB
    cut = text_head(word.encode(), 5001)
    assert cut.decode("utf-8") == "é" * 2500
    utf16 = "\ufeffab cd".encode("utf-16-le")
    assert len(text_head(b"\xff\xfe" + "abcdef".encode("utf-16-le"), 7)) % 2 == 0
    assert text_head(utf16, 100) == utf16


def test_a_large_text_file_is_read_from_its_head_with_a_warning(tmp_path):
    words = " ".join(f"word{i}" for i in range(400_000))  # ~3.8 MB on one line
    path = tmp_path / "long.md"
    path.write_text(words, encoding="utf-8")
    limited = read_path(path, max_text_mb=1)
    assert limited.document is not None and limited.file == path
    text = " ".join(s.text if hasattr(s, "text") else s for s in limited.document.sections)
    assert 0.9 * MiB < len(text.encode()) <= MiB and words.startswith(text.strip())
    assert not text.strip().endswith("word")  # the last word is whole
    assert any("max_text_mb" in i.message and i.severity == "warning" for i in limited.issues)
    whole = read_path(path, max_text_mb=10)
    assert not any("max_text_mb" in i.message for i in whole.issues)
    assert whole.document.sections == read_path(path).document.sections


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), True, "4"])
def test_bad_limits_are_refused_naming_the_option(tmp_path, bad):
    (tmp_path / "a.txt").write_text("hello world")
    with pytest.raises(ValueError, match="max_text_mb"):
        read_path(tmp_path / "a.txt", max_text_mb=bad)


def test_a_pdf_stops_at_the_page_whose_text_passes_the_limit(tmp_path):
    from .test_eval_datasets import write_text_pdf

    texts = [f"Page {i} " + "lorem ipsum dolor sit amet " * 20 for i in range(1, 11)]  # ~550 chars a page
    path = write_text_pdf(tmp_path / "many.pdf", texts, size=(4000, 200))
    limited = read_path(path, render_pages=False, max_text_mb=1200 / MiB)  # ~1,200 characters
    assert [s.page for s in limited.document.sections] == [1, 2, 3]
    assert any("read only the first 3 of 10 pages" in i.message and i.severity == "warning" for i in limited.issues)
    whole = read_path(path, render_pages=False, max_text_mb=1)
    assert [s.page for s in whole.document.sections] == list(range(1, 11))
    assert not any("max_text" in i.message for i in whole.issues)
