"""From raw files to the knowledge index: readers (PDF, images, text, record files) that produce
:class:`~colgraph_engine.kg.DocumentInput`, optional model hooks (LLM extraction, vision scene
graphs and region matching, captions) and the folder ingest that drives them."""
from .cache import ResponseCache
from .chat import ChatClient, ChatReply, ChatRequest, FailedCall, ModelCallError
from .folder import DocumentReport, IngestReport, ingest
from .hooks import CaptionHook, ExtractionOutcome, LLMExtractor, VisionHook
from .readers import ReadIssue, ReadResult, iter_folder, read_path

__all__ = ["CaptionHook", "ChatClient", "ChatReply", "ChatRequest", "DocumentReport", "ExtractionOutcome",
           "FailedCall", "IngestReport", "LLMExtractor", "ModelCallError", "ReadIssue", "ReadResult", "ResponseCache",
           "VisionHook", "ingest", "iter_folder", "read_path"]
