"""Images parked on disk while a document is read and built, so memory stays bounded.

A reader writes each page render or embedded image once, as a lossless PNG, into an
:class:`ImageSpool` (one temporary folder per document); the document carries
:class:`SpooledImage` paths and its graph :class:`SpooledPixels`, which load the pixels only when
an encoder asks for them. ``ImageSpool.cleanup()`` (or the spool's finaliser) removes the folder.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import weakref
from pathlib import Path

import numpy as np


class ImageSpool:
    """A temporary folder of lossless PNG files holding the images a reader decoded (PDF page
    renders, embedded images), so that a document of any page count holds none of them in memory.

    Where: ``<dir>/colgraph-images-XXXXXXXX/`` (``dir``: default the system temporary folder, i.e.
    ``$TMPDIR`` or ``/tmp``). The folder is created with the spool; :meth:`add` writes one file.

    When it is deleted: by :meth:`cleanup` (explicit), or else as soon as nothing refers to the
    spool any more, i.e. when the last :class:`SpooledImage` / :class:`SpooledPixels` of it is
    garbage (the document's ``ImageInput``s, and the built graph's ``pixels`` until ingest drops
    them after encoding), or at interpreter exit. Only a killed process leaves it behind.

    Pickling (or copying) a spool moves the ownership of its folder to the copy: the original
    no longer deletes it. This lets a worker process hand a read document to its parent.
    """

    PREFIX = "colgraph-images-"

    def __init__(self, dir: str | os.PathLike | None = None):
        if dir is not None and not isinstance(dir, (str, os.PathLike)):
            raise TypeError(f"dir: expected a folder path or None, got {type(dir).__name__}")
        self.path = Path(tempfile.mkdtemp(prefix=self.PREFIX, dir=dir))
        self._own()

    def _own(self) -> None:
        self._counter = itertools.count()
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.path), True)

    def add(self, image) -> SpooledImage:
        """Writes a PIL image (converted to RGB) as PNG: lossless, it loads back pixel for pixel."""
        if self.closed:
            raise ValueError(f"image spool {self.path} was cleaned up")
        if image.mode != "RGB":
            image = image.convert("RGB")
        file = self.path / f"{next(self._counter):06d}.png"
        # level 1 (ours): ~4 ms for a blank letter page at 72 dpi (8 KB), ~15 ms for a noisy one
        # (307 KB); level 6, PIL's default, took 15-30% longer here for 2% less on the noisy page
        image.save(file, format="PNG", compress_level=1)
        return SpooledImage(file, tuple(image.size), self)

    def cleanup(self) -> None:
        """Deletes the folder and its files now (its images can no longer be loaded)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __reduce__(self):
        self._finalizer.detach()  # the unpickled copy owns the folder from now on
        return _unpickle_spool, (str(self.path),)

    def __repr__(self) -> str:
        return f"ImageSpool({str(self.path)!r}{', closed' if self.closed else ''})"


def _unpickle_spool(path: str) -> ImageSpool:
    spool = ImageSpool.__new__(ImageSpool)
    spool.path = Path(path)
    spool._own()
    return spool


class SpooledImage(os.PathLike):
    """One image of an :class:`ImageSpool`: a path (``os.fspath`` gives the PNG file, so it goes
    wherever an image file path goes: encoders, model hooks, ``PIL.Image.open``) that also keeps
    the spool, and so the file, alive. ``size`` is ``(width, height)`` in pixels and ``mode``
    ``"RGB"``, as for the PIL image it stands for; ``convert(mode)`` and ``np.asarray(image)``
    decode it (a PIL image, a uint8 ``[H, W, 3]`` array), so code written for PIL images works."""

    __slots__ = ("path", "size", "spool")
    mode = "RGB"

    def __init__(self, path: Path, size: tuple[int, int], spool: ImageSpool):
        self.path, self.size, self.spool = Path(path), size, spool

    def __fspath__(self) -> str:
        return str(self.path)

    def convert(self, mode: str = "RGB"):
        im = self.load()
        return im if mode == "RGB" else im.convert(mode)

    def __array__(self, dtype=None, copy=None):
        out = np.asarray(self.load())
        return out if dtype is None else out.astype(dtype)

    def load(self):
        """The image as a PIL RGB image (decoded now; nothing is cached)."""
        from PIL import Image

        if self.spool.closed:
            raise FileNotFoundError(f"pixels: {self.path} was deleted with its image spool (cleaned up)")
        with Image.open(self.path) as im:
            return im.convert("RGB")

    def __repr__(self) -> str:
        return f"SpooledImage({str(self.path)!r}, size={self.size})"


class SpooledPixels:
    """What a built graph's ``pixels`` holds for a :class:`SpooledImage`: the same file, loaded on
    demand (:meth:`load`, or ``convert`` like a PIL image), but deliberately *not* a path. Ingest
    keeps file paths in the index's graphs and drops decoded pixels after encoding; a spooled
    image is decoded pixels parked on disk, so it is dropped too, which lets its spool go."""

    __slots__ = ("image",)
    mode = "RGB"

    def __init__(self, image: SpooledImage):
        if not isinstance(image, SpooledImage):
            raise TypeError(f"image: expected a SpooledImage, got {type(image).__name__}")
        self.image = image

    @property
    def size(self) -> tuple[int, int]:
        return self.image.size

    def load(self):
        return self.image.load()

    def convert(self, mode: str = "RGB"):
        return self.image.convert(mode)

    def __array__(self, dtype=None, copy=None):
        return self.image.__array__(dtype)

    def __repr__(self) -> str:
        return f"SpooledPixels({str(self.image.path)!r}, size={self.size})"
