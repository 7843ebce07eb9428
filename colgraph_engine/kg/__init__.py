"""Per-document multimodal knowledge graphs: extraction records and their parsers, segmentation,
graph building, embedding, and the index directory that holds it all.

Pipeline: :class:`DocumentInput` -> :func:`build_document_graph` (segments, extraction through a
pluggable extractor, merges, images and regions) -> :func:`encode_document` (pluggable
:class:`Encoders`) -> :class:`KnowledgeIndex` (stores, merged graph, atomic directory).
"""
from .document import (
    DocumentBuildError, DocumentGraph, DocumentInput, DocumentIssue, ImageInput, TableInput, build_document_graph,
)
from .extract import CooccurrenceExtractor, PhraseExtractor
from .index import (
    INDEX_FORMAT, INDEX_VERSION, IndexConflictError, IndexFormatError, KnowledgeIndex, make_uid, read_documents,
)
from .parsers import DIALECTS, detect_dialect, parse_extraction, parse_region_mappings, parse_scene_graph
from .records import (
    EntityRecord, ExtractionFormatError, MappingRecord, ParseIssue, ParseResult, RelationRecord, SceneObject,
    SceneRelation, normalize_name,
)
from .segment import Section, Segment, segment_sections
from .strings import StringColumn
from .vectors import STORES, Encoders, ItemVectors, encode_document

__all__ = [
    "DIALECTS", "INDEX_FORMAT", "INDEX_VERSION", "STORES", "CooccurrenceExtractor", "DocumentBuildError", "PhraseExtractor",
    "DocumentGraph", "DocumentInput", "DocumentIssue", "Encoders", "EntityRecord", "ExtractionFormatError",
    "ImageInput", "IndexConflictError", "IndexFormatError", "ItemVectors", "KnowledgeIndex", "MappingRecord", "ParseIssue", "ParseResult",
    "RelationRecord", "SceneObject", "SceneRelation", "Section", "Segment", "StringColumn", "TableInput",
    "build_document_graph", "detect_dialect", "encode_document", "make_uid", "normalize_name", "parse_extraction",
    "parse_region_mappings", "parse_scene_graph", "read_documents", "segment_sections",
]
