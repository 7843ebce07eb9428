"""Readers: one file -> :class:`~colgraph_engine.kg.DocumentInput`, with per-file statistics and
issues (:class:`ReadResult`). One module per reader (``pdf``, ``image``, ``text``, ``records``);
``dispatch`` picks the reader for a file and walks folders."""
from .dispatch import READERS, check_options, iter_folder, kind_by_content, kind_by_name, read_folder, read_path
from .image import MAX_IMAGE_PIXELS, read_image, scene_json_to_text, sidecars_of
from .pdf import SECTION_MODES, page_image_ref, read_pdf
from .records import RECORDS_MARKER, SEGMENT_MARKER, read_records
from .result import ReadIssue, ReadResult, ReadStats
from .text import decode_text, markdown_sections, read_text

__all__ = [
    "MAX_IMAGE_PIXELS", "READERS", "RECORDS_MARKER", "SECTION_MODES", "SEGMENT_MARKER", "ReadIssue", "ReadResult",
    "ReadStats", "check_options", "decode_text", "iter_folder", "kind_by_content", "kind_by_name", "markdown_sections",
    "page_image_ref", "read_folder", "read_image", "read_path", "read_pdf", "read_records", "read_text",
    "scene_json_to_text", "sidecars_of",
]
