"""Stage 7: the context a generator reads, and the optional generator.

Sections, in the manner LightRAG and mKG-RAG users know: **entities** (name, type, description,
rank = degree in the index graph), **relations** (source, target, keywords, description, weight,
rank = summed endpoint degrees), **sources** (text chunks) and **images** (name, document, box,
visual score, text view). Each section keeps its items in rank order until its token budget
is spent (the item that would pass the budget, and all after it, are left out).
``context_mode``: ``"graph"`` = entities, relations and images; ``"chunks"`` = sources and
images; ``"hybrid"`` = all four.

Every line opens with its citation, ``"cite"``: the document, its page numbers and, for images
and regions, the box (``"[report.pdf p.2]"``, ``"[report.pdf p.2 box (0.10, 0.20, 0.55, 0.60)]"``;
rules in :mod:`~colgraph_engine.pipeline.citations`), which replaces the line's ``"document"``
field in the rendered text (the rows keep it); the generator is asked to cite by them.

Tokens are counted by :func:`count_tokens` (words and punctuation marks; no model tokenizer is
assumed, so budgets are approximate for any given LLM: our choice).
"""
from __future__ import annotations

import base64
import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .evidence import by_score

_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """Words and punctuation marks in `text`."""
    if not isinstance(text, str):
        raise TypeError(f"text: expected a str, got {type(text).__name__}")
    return len(_TOKEN.findall(text))


@dataclass
class Context:
    """The ranked sections of one query's context, ready to render."""
    question: str
    entities: list[dict] = field(default_factory=list)
    relations: list[dict] = field(default_factory=list)
    sources: list[dict] = field(default_factory=list)
    images: list[dict] = field(default_factory=list)
    mode: str = "hybrid"
    image_units: str = ""
    tokens: dict = field(default_factory=dict)
    # section -> the evidence items behind its kept rows, in the same order (entity, relation and
    # source rows of the Evidence, image rows): their ``doc_id``/``document``, ``pages``, ``box``
    # and ``cite``; not rendered
    items: dict = field(default_factory=dict, repr=False, compare=False)

    def render(self) -> str:
        """Prompt text: one block per section, one JSON object per line."""
        parts = [f"Question: {self.question}"]
        for title, rows in (("Entities", self.entities), ("Relations", self.relations),
                            ("Sources", self.sources), ("Images", self.images)):
            if rows:
                parts.append(f"---- {title} ----")
                parts.extend(line_text(r) for r in rows)
        if self.images and self.image_units == "text_view":
            parts.append("(images ranked by their text views: caption, OCR text and region labels; "
                         "no text-image model was used)")
        return "\n".join(parts)


def line_text(row: dict) -> str:
    """One rendered context line: the row as JSON; a row with a ``cite`` label (which names the
    document) leaves out its ``document`` field, which stays in the row for programs."""
    if "cite" in row:
        row = {k: v for k, v in row.items() if k != "document"}
    return json.dumps(row, ensure_ascii=False)


def _fit(rows: list[dict], budget: int) -> tuple[list[dict], int]:
    kept, used = [], 0
    for r in rows:
        t = count_tokens(line_text(r))
        if used + t > budget:
            break
        kept.append(r)
        used += t
    return kept, used


def _cited(row: dict, item: dict) -> dict:
    """`row` with the item's citation label first (items that carry none: `row` unchanged)."""
    return {"cite": item["cite"], **row} if item.get("cite") else row


def build_context(question: str, evidence, visual_rows: list[dict], cfg, image_units: str) -> Context:
    ranked = sorted(evidence.entities, key=lambda e: (-by_score(e["score"]), e["node"]))
    ents = [_cited({"entity": e["name"], "type": e["type"], "description": e["description"], "rank": e["rank"],
                    "document": e["doc_id"]}, e) for e in ranked]
    rels = [_cited({"source": r["source"], "target": r["target"], "keywords": r["keywords"],
                    "description": r["description"], "weight": r["weight"], "rank": r["rank"], "document": r["doc_id"]},
                   r) for r in evidence.relations]
    srcs = [_cited({"id": s["node"], "document": s["doc_id"], "kind": s["kind"], "content": s["text"]}, s)
            for s in evidence.sources]
    # an image row's page citation is its "cite" label (its "bbox" is in the image)
    vis = [_cited({k: v for k, v in r.items() if k not in ("cite", "pages", "box")}, r) for r in visual_rows]
    ctx = Context(question, mode=cfg.context_mode, image_units=image_units)
    use_graph = cfg.context_mode in ("graph", "hybrid")
    use_chunks = cfg.context_mode in ("chunks", "hybrid")
    if use_graph:
        ctx.entities, ctx.tokens["entities"] = _fit(ents, cfg.budget_entities)
        ctx.relations, ctx.tokens["relations"] = _fit(rels, cfg.budget_relations)
    if use_chunks:
        ctx.sources, ctx.tokens["sources"] = _fit(srcs, cfg.budget_sources)
    ctx.images, ctx.tokens["images"] = _fit(vis, cfg.budget_images)
    ctx.items = {"entities": ranked[:len(ctx.entities)], "relations": list(evidence.relations[:len(ctx.relations)]),
                 "sources": list(evidence.sources[:len(ctx.sources)]), "images": list(visual_rows[:len(ctx.images)])}
    return ctx


@dataclass
class Answer:
    """What the generator returned, or why it did not."""
    text: str | None
    error: str | None = None
    seconds: float = 0.0


class OpenAIGenerator:
    """Calls an OpenAI-compatible chat-completions endpoint the user configures.

    Args:
        model: the model name the endpoint serves.
        base_url, api_key: the endpoint (None: the ``openai`` client's environment defaults).
        timeout: seconds per request; max_retries: the client's retries.
        send_images: attach the query image and the E_k images as image content.
        system: the system prompt (ours, written for this project).
    """

    SYSTEM = ("Answer the question using only the context: entities, relations, text sources and images "
              "retrieved from the user's documents. If the context does not hold the answer, say so. "
              "Cite the lines you use by their \"cite\" labels, e.g. [report.pdf p.2].")

    def __init__(self, model: str, *, base_url: str | None = None, api_key: str | None = None, timeout: float = 60.0,
                 max_retries: int = 2, send_images: bool = False, system: str | None = None):
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a non-empty model name, got {model!r}")
        for name, value in (("base_url", base_url), ("api_key", api_key), ("system", system)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name}: expected a str or None, got {type(value).__name__}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries: expected an int >= 0, got {max_retries!r}")
        if not isinstance(send_images, bool):
            raise TypeError(f"send_images: expected a bool, got {type(send_images).__name__}")
        self.model, self.base_url, self.api_key = model, base_url, api_key
        self.timeout, self.max_retries, self.send_images = float(timeout), max_retries, send_images
        self.system = self.SYSTEM if system is None else system

    def __call__(self, prompt: str, images: list) -> str:
        from openai import OpenAI  # optional dependency, imported when a generator is used

        client = OpenAI(base_url=self.base_url, api_key=self.api_key or "unused", timeout=self.timeout,
                        max_retries=self.max_retries)
        content: list[dict] = [{"type": "text", "text": prompt}]
        if self.send_images:
            for im in images:
                buf = io.BytesIO()
                im.save(buf, format="PNG")
                url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
                content.append({"type": "image_url", "image_url": {"url": url}})
        reply = client.chat.completions.create(model=self.model, messages=[
            {"role": "system", "content": self.system}, {"role": "user", "content": content}])
        return reply.choices[0].message.content or ""


def run_generator(generator: Callable[[str, list], str], prompt: str, images: list) -> Answer:
    """Calls `generator`; any failure is returned as the answer's error, never raised."""
    import time

    t0 = time.perf_counter()
    try:
        text = generator(prompt, images)
        if not isinstance(text, str):
            raise TypeError(f"generator returned {type(text).__name__}, expected str")
        return Answer(text, None, time.perf_counter() - t0)
    except Exception as exc:  # the context must survive a failing endpoint
        return Answer(None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
