"""RapidOcr on rendered text images (runs the real ONNX models shipped with rapidocr-onnxruntime)."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from colgraph_engine.encoders.ocr import OcrLine, OcrResult, RapidOcr


def text_image(lines, size=(720, 260)):
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=48)
    for i, line in enumerate(lines):
        draw.text((30, 30 + 100 * i), line, fill="black", font=font)
    return image


@pytest.fixture(scope="module")
def ocr():
    return RapidOcr()  # rapidocr-onnxruntime is in the test extra; a missing package should fail here


def test_reads_rendered_text(ocr):
    result = ocr(text_image(["COLGRAPH 2026"]))
    assert isinstance(result, OcrResult)
    upper = result.text.upper()
    assert "COLGRAPH" in upper and "2026" in upper
    assert len(result.lines) >= 1 and all(isinstance(l, OcrLine) for l in result.lines)
    for line in result.lines:
        x1, y1, x2, y2 = line.bbox
        assert 0.0 <= x1 < x2 <= 1.0 and 0.0 <= y1 < y2 <= 1.0
        assert 0.5 <= line.score <= 1.0


def test_reading_order_and_array_input(ocr):
    image = text_image(["first line", "second line"])
    result = ocr(image)
    assert result.text.split("\n") == [l.text for l in result.lines]
    assert [l.text.lower() for l in result.lines] == ["first line", "second line"]
    assert result.lines[0].bbox[1] < result.lines[1].bbox[1]
    # a uint8 RGB array gives the same result as the PIL image
    assert ocr(np.asarray(image)).text == result.text


def test_blank_image_gives_empty_text(ocr):
    result = ocr(Image.new("RGB", (320, 200), "white"))
    assert result.text == "" and result.lines == ()


def test_bad_input(ocr):
    with pytest.raises(TypeError, match="image"):
        ocr("page.png")
    with pytest.raises(TypeError, match="image"):
        ocr(np.zeros((10, 10, 3), dtype=np.float32))
    with pytest.raises(ValueError, match="image"):
        ocr(np.zeros((10, 10, 4), dtype=np.uint8))


def test_bad_options():
    with pytest.raises(ValueError, match="min_score"):
        RapidOcr(min_score=1.5)
    with pytest.raises(ValueError, match="line_tolerance"):
        RapidOcr(line_tolerance=-1)


def test_missing_package_message(monkeypatch):
    monkeypatch.setitem(sys.modules, "rapidocr_onnxruntime", None)  # makes the import fail
    with pytest.raises(ImportError, match="pip install rapidocr-onnxruntime"):
        RapidOcr()


def test_reads_scikit_image_page_scan(ocr):
    # scikit-image's bundled scan of a printed page (uneven lighting, grey [H, W])
    skdata = pytest.importorskip("skimage.data")
    text = ocr(skdata.page()).text.lower()
    for word in ("segmentation", "markers", "coins", "background", "histogram"):
        assert word in text
    assert text.index("segmentation") < text.index("histogram")  # reading order
