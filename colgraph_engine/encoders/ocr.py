"""OCR bridge on ``rapidocr_onnxruntime`` (PP-OCR detection + recognition, ONNX on CPU).

``RapidOcr()(image)`` returns an :class:`OcrResult`: one :class:`OcrLine` per detected text box,
in reading order (rows top to bottom, boxes within a row left to right), and ``text``, the line
texts joined by ``"\\n"`` in that order, so ``text.split("\\n") == [l.text for l in lines]``
whenever there is at least one line; an image without text gives ``text == ""`` and
``lines == ()``.

``rapidocr_onnxruntime`` is optional: it is imported when a :class:`RapidOcr` is built, so this
module imports without it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class OcrLine:
    """One detected text box.

    ``bbox`` is the axis-aligned hull of the detected quadrilateral as ``(x1, y1, x2, y2)``,
    divided by the image width and height, so every coordinate is in [0, 1] and
    ``x1 <= x2``, ``y1 <= y2``. ``score`` is the recogniser's confidence in [0, 1].
    """

    text: str
    score: float
    bbox: tuple[float, float, float, float]


@dataclass(frozen=True)
class OcrResult:
    """``text``: the ``lines`` texts joined by ``"\\n"`` in reading order ("" when none)."""

    text: str
    lines: tuple[OcrLine, ...]


def _as_bgr(image) -> np.ndarray:
    """Contiguous uint8 ``[H, W, 3]`` BGR array from a PIL image or uint8 ``[H, W, 3]`` / ``[H, W]`` RGB array.

    rapidocr takes a 3-channel ndarray as BGR as it is (it only swaps channels for PIL input),
    so RGB input is flipped here once and the engine always gets the same layout.
    """
    if hasattr(image, "convert") and hasattr(image, "size"):  # PIL
        image = np.asarray(image.convert("RGB"))
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim not in (2, 3):
        got = type(image).__name__
        if isinstance(image, np.ndarray):
            got = f"ndarray of {image.dtype} with {image.ndim} dims"
        raise TypeError(f"image: expected a PIL image or a uint8 [H, W, 3] array, got {got}")
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.shape[2] != 3 or image.shape[0] < 1 or image.shape[1] < 1:
        raise ValueError(f"image: expected shape [H, W, 3] with H, W >= 1, got {list(image.shape)}")
    return np.ascontiguousarray(image[:, :, ::-1])


def _reading_order(boxes: list[tuple[float, float, float, float]], tolerance: float) -> list[int]:
    """Indices of ``boxes`` (x1, y1, x2, y2) in reading order.

    Boxes are taken by top edge; a box joins the current row when its vertical centre is within
    ``tolerance`` times the smaller of its height and the row's height from the row's centre,
    so boxes of one printed line whose tops differ by a few pixels stay together.
    """
    order = sorted(range(len(boxes)), key=lambda i: (boxes[i][1], boxes[i][0]))
    rows: list[list[int]] = []
    row_cy = row_h = 0.0
    for i in order:
        _, y1, _, y2 = boxes[i]
        cy, h = (y1 + y2) / 2, max(y2 - y1, 1e-9)
        if rows and abs(cy - row_cy) <= tolerance * min(h, row_h):
            rows[-1].append(i)
            n = len(rows[-1])
            row_cy += (cy - row_cy) / n  # running mean keeps the row anchored on all its boxes
            row_h += (h - row_h) / n
        else:
            rows.append([i])
            row_cy, row_h = cy, h
    return [i for row in rows for i in sorted(row, key=lambda j: boxes[j][0])]


class RapidOcr:
    """Callable OCR engine: ``ocr(image) -> OcrResult``.

    Args:
        min_score: boxes recognised with confidence below this (in [0, 1]) are dropped.
        line_tolerance: how far (as a fraction of box height) the vertical centres of two boxes
            may differ for them to count as one row when ordering; must be >= 0.

    Raises ImportError when ``rapidocr_onnxruntime`` is not installed. Building the engine loads
    three small ONNX models (about a second on CPU); reuse one instance.
    """

    def __init__(self, *, min_score: float = 0.5, line_tolerance: float = 0.5):
        if isinstance(min_score, bool) or not isinstance(min_score, (int, float)) or not 0.0 <= min_score <= 1.0:
            raise ValueError(f"min_score: expected a number in [0, 1], got {min_score!r}")
        if (isinstance(line_tolerance, bool) or not isinstance(line_tolerance, (int, float))
                or not math.isfinite(line_tolerance) or line_tolerance < 0):
            raise ValueError(f"line_tolerance: expected a finite number >= 0, got {line_tolerance!r}")
        try:
            from rapidocr_onnxruntime import RapidOCR
        except ImportError as e:
            raise ImportError(
                "RapidOcr needs the optional package rapidocr-onnxruntime: pip install rapidocr-onnxruntime"
            ) from e
        self.min_score = float(min_score)
        self.line_tolerance = float(line_tolerance)
        # rapidocr filters on its own threshold (default 0.5) before we see results; align it
        # with ours so a lower min_score really lets low-confidence boxes through.
        self._engine = RapidOCR(text_score=self.min_score)

    def __call__(self, image) -> OcrResult:
        """OCR one PIL image or uint8 ``[H, W, 3]`` RGB array (``[H, W]`` grey is accepted too)."""
        bgr = _as_bgr(image)
        h, w = bgr.shape[:2]
        result, _elapsed = self._engine(bgr)
        if not result:  # None when no text box is found
            return OcrResult("", ())
        found = []
        for quad, text, score in result:
            # One OcrLine per text line, so newlines inside a box would break the text/lines pairing.
            text = " ".join(str(text).split())
            score = float(score)
            if not text or score < self.min_score:
                continue
            pts = np.asarray(quad, dtype=np.float64).reshape(-1, 2)
            bbox = (
                float(np.clip(pts[:, 0].min() / w, 0.0, 1.0)),
                float(np.clip(pts[:, 1].min() / h, 0.0, 1.0)),
                float(np.clip(pts[:, 0].max() / w, 0.0, 1.0)),
                float(np.clip(pts[:, 1].max() / h, 0.0, 1.0)),
            )
            found.append(OcrLine(text, score, bbox))
        # Order on pixel coordinates: normalised heights would weigh rows differently on
        # non-square images.
        pixel_boxes = [(l.bbox[0] * w, l.bbox[1] * h, l.bbox[2] * w, l.bbox[3] * h) for l in found]
        lines = tuple(found[i] for i in _reading_order(pixel_boxes, self.line_tolerance))
        return OcrResult("\n".join(l.text for l in lines), lines)
