"""What a user asks: a question, an optional query image and an optional caption of it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import MAX_QUESTION_CHARS


@dataclass(frozen=True)
class Query:
    """One question.

    Args:
        question: the question text (1 to 4,096 characters after stripping).
        image: an optional query image: a file path, a PIL image or a uint8 ``[H, W, 3]`` array.
        caption: an optional caption of the query image; it joins the question on the text side.
    """
    question: str
    image: object = None
    caption: str = ""

    def __post_init__(self):
        if not isinstance(self.question, str):
            raise TypeError(f"question: expected a str, got {type(self.question).__name__}")
        q = self.question.strip()
        if not q:
            raise ValueError("question: expected a non-empty question, got an empty or blank string")
        if len(q) > MAX_QUESTION_CHARS:
            raise ValueError(f"question: expected at most {MAX_QUESTION_CHARS} characters, got {len(q)}")
        if not isinstance(self.caption, str):
            raise TypeError(f"caption: expected a str, got {type(self.caption).__name__}")
        if len(self.caption) > MAX_QUESTION_CHARS:
            raise ValueError(f"caption: expected at most {MAX_QUESTION_CHARS} characters, got {len(self.caption)}")
        if self.image is not None and not (isinstance(self.image, (str, os.PathLike, np.ndarray))
                                           or hasattr(self.image, "convert")):
            raise TypeError(f"image: expected None, a path, a PIL image or a uint8 [H, W, 3] array, "
                            f"got {type(self.image).__name__}")

    @property
    def text(self) -> str:
        """The text side: the question, then the caption when there is one."""
        q = self.question.strip()
        return f"{q}\n{self.caption.strip()}" if self.caption.strip() else q


def as_query(q, name: str = "query") -> Query:
    if isinstance(q, Query):
        return q
    if isinstance(q, str):
        return Query(q)
    raise TypeError(f"{name}: expected a Query or a question str, got {type(q).__name__}")


def load_image(image, name: str = "image"):
    """The query image as an RGB PIL image; ValueError naming `name` when it cannot be read."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(image, (str, os.PathLike)):
        path = Path(image)
        if not path.is_file():
            raise ValueError(f"{name}: no image file at {path}")
        try:
            with Image.open(path) as im:
                return im.convert("RGB")
        except (UnidentifiedImageError, OSError) as exc:
            raise ValueError(f"{name}: cannot read {path} as an image ({exc})") from None
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] != 3) \
                or min(image.shape[:2]) < 1:
            raise ValueError(f"{name}: expected a uint8 [H, W, 3] or [H, W] array, got {image.dtype} {image.shape}")
        return Image.fromarray(image if image.ndim == 3 else np.repeat(image[:, :, None], 3, axis=2))
    try:
        return image.convert("RGB")
    except Exception as exc:  # a PIL-like object that fails to convert
        raise ValueError(f"{name}: cannot convert the image to RGB ({exc})") from None
