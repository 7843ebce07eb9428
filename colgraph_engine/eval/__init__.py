"""Retrieval and answer metrics, and loaders for evaluation datasets (local files only)."""
from .metrics import (  # noqa: F401  (re-exports)
    evaluate_rankings,
    exact_match,
    f1_score,
    hit_at_k,
    mmqa_em_f1,
    mrr_at_k,
    ndcg_at_k,
    normalize_answer,
    recall_at_k,
)
from .datasets import (  # noqa: F401  (re-exports)
    MMQA,
    BeirDataset,
    MMLongBench,
    MMQAQuestion,
    Question,
    load_beir,
    load_mmlongbench,
    load_mmqa,
)
from .pdf import Page, page_count, render_pdf  # noqa: F401
