"""The retrieval pipeline: mKG-RAG's dual-stage graph retrieval with ColGraphRAG's
late-interaction visual ranking, batched, every stage timed (see :mod:`.pipeline`)."""
from .config import PipelineConfig, calibrated_threshold
from .context import Answer, Context, OpenAIGenerator, count_tokens
from .cvis import VisualCue, VisualPhrases, extract_visual_phrases
from .evidence import Evidence, Record
from .pipeline import STAGES, ImageHit, Pipeline, Result
from .query import Query
from .visual import CrossSpaceError, encoder_space

__all__ = ["Answer", "Context", "CrossSpaceError", "Evidence", "ImageHit", "OpenAIGenerator", "Pipeline",
           "PipelineConfig", "Query", "Record", "Result", "STAGES", "VisualCue", "VisualPhrases", "calibrated_threshold",
           "count_tokens", "encoder_space", "extract_visual_phrases"]
