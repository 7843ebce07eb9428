"""Image file -> :class:`DocumentInput`: one document, one section (the caption) holding the image.

Formats: JPEG, PNG and WebP, decoded in full with Pillow when read, so a truncated or corrupt
file is reported here rather than when the index encodes it. ``ImageInput.pixels`` is the file
path (the encoder opens it again; nothing is held in memory per document).

Decompression-bomb guard (ours): an image of more than ``max_pixels`` pixels (default
:data:`MAX_IMAGE_PIXELS`, 64 M; Pillow warns from about 89 M) is refused from its header, before
any pixel is decoded.

Optional sidecar files next to ``<stem>.<ext>`` (same folder, same stem):

``<stem>.caption.txt`` or ``<stem>.txt``
    the caption (the ``.caption.txt`` one wins); it is the section text and ``ImageInput.caption``.
``<stem>.scene.txt``
    a scene graph in mKG-RAG's text dialect (``<object-i>: category, (x1, y1, x2, y2)`` and
    ``<relation-j>: <object-a> predicate <object-b>``), parsed by
    :func:`colgraph_engine.kg.parsers.parse_scene_graph`.
``<stem>.scene.json``
    an EGTR-style scene graph: ``{"objects": [{"id", "category", "bbox"}], "relations":
    [{"subject", "object", "predicate"}]}`` (see :func:`scene_json_to_text`); used instead of
    ``.scene.txt`` when both exist (with a warning).
``<stem>.matches.txt``
    region matches in mKG-RAG's mapping dialect (``("mapping"|<object-3>|ENTITY|9)`` ...),
    parsed by :func:`colgraph_engine.kg.parsers.parse_region_mappings`.

A sidecar that cannot be read or parsed is reported (naming the sidecar) and left out; the image
itself is still read. Records a sidecar's parser drops are reported as warnings.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from ...kg.document import DocumentInput, ImageInput
from ...kg.parsers import parse_region_mappings, parse_scene_graph
from ...kg.segment import Section
from .result import ReadResult, check_file, resolve
from .text import decode_text

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp")
IMAGE_FORMATS = ("JPEG", "PNG", "WEBP")
MAX_IMAGE_PIXELS = 64_000_000
# Sidecar name endings, longest first so that ".caption.txt" is not taken for ".txt".
SIDECAR_ENDINGS = (".caption.txt", ".scene.json", ".scene.txt", ".matches.txt", ".txt")


def sidecars_of(path: Path) -> dict[str, Path]:
    """The sidecars that exist next to image ``path``: ``{"caption" | "scene_txt" | "scene_json" |
    "matches": Path}`` (``caption`` is ``<stem>.caption.txt``, else ``<stem>.txt``)."""
    base = path.with_suffix("")
    found = {}
    for key, endings in (("caption", (".caption.txt", ".txt")), ("scene_txt", (".scene.txt",)),
                         ("scene_json", (".scene.json",)), ("matches", (".matches.txt",))):
        for ending in endings:
            candidate = Path(str(base) + ending)
            if candidate.is_file():
                found[key] = candidate
                break
    return found


def read_image(path: str | os.PathLike, *, doc_id: str | None = None, max_pixels: int = MAX_IMAGE_PIXELS,
               sidecars: bool = True) -> ReadResult:
    """Reads one image and its sidecars (see the module docstring).

    Args:
        path: the image file.
        doc_id: the document id (default: the file name).
        max_pixels: refuse images with more pixels than this (> 0).
        sidecars: read the sidecar files next to the image.

    Returns a :class:`ReadResult`; an empty, corrupt, unsupported or oversized image gives an
    error issue and no document.
    """
    if isinstance(max_pixels, bool) or not isinstance(max_pixels, int) or max_pixels < 1:
        raise ValueError(f"max_pixels: expected an int >= 1, got {max_pixels!r}")
    if not isinstance(sidecars, bool):
        raise TypeError(f"sidecars: expected bool, got {type(sidecars).__name__}")
    path, doc_id = resolve(path, doc_id)
    result = ReadResult(path, doc_id, "image")
    if not check_file(result):
        return result
    with result.stats.timed("images"):
        size = _check_image(path, max_pixels, result)
    if size is None:
        return result
    caption, scene, mappings = "", None, None
    if sidecars:
        with result.stats.timed("parse"):
            caption, scene, mappings = _read_sidecars(path, size, result)
    ref = path.name
    result.stats.images = 1
    result.stats.sections = 1
    result.stats.regions = len(scene.objects) if scene is not None else 0
    # An absolute path: the encoder opens the file later, perhaps from another working directory.
    image = ImageInput(ref, pixels=path.absolute(), scene_graph=scene, mappings=mappings, caption=caption)
    result.document = DocumentInput(doc_id, [Section(caption, images=(ref,))], title=path.stem, images=[image])
    return result


def _check_image(path: Path, max_pixels: int, result: ReadResult) -> tuple[int, int] | None:
    """``(width, height)`` after a full decode, or None with an error recorded."""
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)  # our own limit applies
            with Image.open(path) as im:
                fmt, (w, h) = im.format, im.size
                if fmt not in IMAGE_FORMATS:
                    result.fail(f"unsupported image format {fmt} (expected one of {', '.join(IMAGE_FORMATS)})")
                    return None
                if w < 1 or h < 1:
                    result.fail(f"image has no pixels ({w}x{h})")
                    return None
                if w * h > max_pixels:
                    result.fail(f"image is {w}x{h} = {w * h:,} pixels, above max_pixels = {max_pixels:,} "
                                "(decompression-bomb guard); not decoded")
                    return None
                im.load()
    except Image.DecompressionBombError as e:
        result.fail(f"image is larger than Pillow's hard limit (decompression-bomb guard; {e}); not decoded")
        return None
    except UnidentifiedImageError:
        result.fail("not a readable image (Pillow cannot identify it; expected JPEG, PNG or WebP)")
        return None
    except (OSError, SyntaxError, ValueError) as e:  # truncated data, bad chunks, bad headers
        result.fail(f"corrupt or truncated image ({type(e).__name__}: {e})")
        return None
    return w, h


def _read_sidecars(path: Path, size: tuple[int, int], result: ReadResult):
    found = sidecars_of(path)
    caption, scene, mappings = "", None, None
    if "caption" in found:
        text = _sidecar_text(found["caption"], result)
        if text is not None:
            caption = " ".join(text.split())
            result.stats.sidecars.append(found["caption"].name)
    if "scene_json" in found:
        if "scene_txt" in found:
            result.issue(f"both {found['scene_json'].name} and {found['scene_txt'].name} exist; "
                         f"using {found['scene_json'].name}", "warning")
        text = _sidecar_text(found["scene_json"], result)
        if text is not None:
            converted = scene_json_to_text(text, size, found["scene_json"].name, result)
            if converted is not None:
                scene = _parsed(parse_scene_graph(converted), found["scene_json"].name, result)
                result.stats.sidecars.append(found["scene_json"].name)
    elif "scene_txt" in found:
        text = _sidecar_text(found["scene_txt"], result)
        if text is not None:
            scene = _parsed(parse_scene_graph(text), found["scene_txt"].name, result)
            result.stats.sidecars.append(found["scene_txt"].name)
    if "matches" in found:
        text = _sidecar_text(found["matches"], result)
        if text is not None:
            mappings = _parsed(parse_region_mappings(text), found["matches"].name, result)
            result.stats.sidecars.append(found["matches"].name)
    return caption, scene, mappings


def _sidecar_text(path: Path, result: ReadResult) -> str | None:
    try:
        data = path.read_bytes()
    except OSError as e:
        result.issue(f"sidecar {path.name} cannot be read ({e}); left out")
        return None
    text, latin1 = decode_text(data)
    if text is None:
        result.issue(f"sidecar {path.name} is binary, not text; left out")
    elif latin1:
        result.issue(f"sidecar {path.name} is not UTF-8; decoded as latin-1", "warning")
    return text


def _parsed(parsed, name: str, result: ReadResult):
    for issue in parsed.issues:
        if issue.severity in ("error", "skip"):
            result.issue(f"sidecar {name}: {issue}", "warning")
    return parsed


def scene_json_to_text(text: str, size: tuple[int, int], name: str, result: ReadResult) -> str | None:
    """An EGTR-style scene graph (JSON) as mKG-RAG scene-graph text, or None when unusable.

    Shape: ``{"objects": [{"id": int, "category": str, "bbox": [x1, y1, x2, y2]}, ...],
    "relations": [{"subject": id, "object": id, "predicate": str}, ...]}`` (``relations``
    optional; an ``id`` may be a digit string). The object ``id`` becomes the object index
    (``<object-id>``), so region matches refer to objects by their JSON ids.

    Boxes (our rule): a file in which more than half of the boxes have a coordinate above 1 holds
    pixel boxes, each accepted when its coordinates lie within the image (0 <= x <= width,
    0 <= y <= height) and divided by the image size (warning); otherwise the file holds
    normalised boxes, each accepted when its coordinates lie in [0, 1]. A box
    outside these, with x2 < x1 or y2 < y1, or with non-numeric values, is an error naming the
    sidecar and the object, and the object is dropped; so is a relation naming an unknown (or
    dropped) object id. Malformed JSON or a missing ``objects`` list drops the whole scene graph.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        result.issue(f"sidecar {name}: invalid JSON ({e}); scene graph left out")
        return None
    if not isinstance(data, dict) or not isinstance(data.get("objects"), list):
        result.issue(f"sidecar {name}: expected an object with an \"objects\" list; scene graph left out")
        return None
    relations = data.get("relations", [])
    if not isinstance(relations, list):
        result.issue(f"sidecar {name}: \"relations\" must be a list; relations left out")
        relations = []
    width, height = size
    objects = []  # (id, category, box)
    for i, obj in enumerate(data["objects"]):
        oid = _object_id(obj.get("id") if isinstance(obj, dict) else None)
        category = obj.get("category") if isinstance(obj, dict) else None
        box = obj.get("bbox") if isinstance(obj, dict) else None
        if oid is None:
            result.issue(f"sidecar {name}: objects[{i}] has no integer id >= 0; dropped")
        elif not isinstance(category, str) or not category.strip():
            result.issue(f"sidecar {name}: object id {oid} has no category; dropped")
        elif (not isinstance(box, list) or len(box) != 4
              or not all(isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) for c in box)):
            result.issue(f"sidecar {name}: object id {oid} bbox must be 4 finite numbers, got {box!r}; dropped")
        elif any(o[0] == oid for o in objects):
            result.issue(f"sidecar {name}: duplicate object id {oid}; dropped")
        else:
            objects.append((oid, " ".join(category.split()), [float(c) for c in box]))
    pixel = 2 * sum(max(box) > 1.0 for _, _, box in objects) > len(objects)
    if pixel:
        result.issue(f"sidecar {name}: boxes read as pixel coordinates of the {width}x{height} image "
                     "(most boxes have a coordinate above 1) and normalised", "warning")
    lines, kept = [], set()
    for oid, category, (x1, y1, x2, y2) in objects:
        if pixel:
            inside = 0 <= x1 <= width and 0 <= x2 <= width and 0 <= y1 <= height and 0 <= y2 <= height
            expected = f"pixel coordinates within the {width}x{height} image"
            if inside:
                x1, x2, y1, y2 = x1 / width, x2 / width, y1 / height, y2 / height
        else:
            inside = all(0.0 <= c <= 1.0 for c in (x1, y1, x2, y2))
            expected = "coordinates in [0, 1]"
        if not inside:
            result.issue(f"sidecar {name}: object id {oid} bbox {[x1, y1, x2, y2]} is outside the image "
                         f"(expected {expected}); dropped")
        elif x2 < x1 or y2 < y1:
            result.issue(f"sidecar {name}: object id {oid} bbox {[x1, y1, x2, y2]} has x2 < x1 or y2 < y1; dropped")
        else:
            kept.add(oid)
            lines.append(f"<object-{oid}>: {category}, ({x1:.6g}, {y1:.6g}, {x2:.6g}, {y2:.6g})")
    j = 0
    for i, rel in enumerate(relations):
        if not isinstance(rel, dict):
            result.issue(f"sidecar {name}: relations[{i}] is not an object; dropped")
            continue
        s, o, predicate = _object_id(rel.get("subject")), _object_id(rel.get("object")), rel.get("predicate")
        unknown = [repr(rel.get(k)) for k, v in (("subject", s), ("object", o)) if v is None or v not in kept]
        if unknown:
            result.issue(f"sidecar {name}: relations[{i}] names unknown object id {', '.join(unknown)}; dropped")
        elif not isinstance(predicate, str) or not predicate.strip():
            result.issue(f"sidecar {name}: relations[{i}] has no predicate; dropped")
        else:
            lines.append(f"<relation-{j}>: <object-{s}> {' '.join(predicate.split())} <object-{o}>")
            j += 1
    return "\n".join(lines)


def _object_id(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.strip().isdigit() and len(value.strip()) <= 9:
        return int(value.strip())
    return None
