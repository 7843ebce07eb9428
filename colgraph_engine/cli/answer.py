"""``colgraph query``'s answers and citations: the model options, the answer call, the printed
answer with its citations, and the ``--json`` object (schema version :data:`SCHEMA_VERSION`,
written down field by field in the README, "Answers from the command line").

    colgraph query INDEX QUESTION --llm-url URL --llm-model NAME [--api-key-env VAR] [--timeout S]

The generator is :class:`~colgraph_engine.pipeline.OpenAIGenerator`, the one ``colgraph serve
--generator-model`` uses, asked once (no retries, so ``--timeout`` bounds the wait) with the
rendered context as the prompt. Exit codes: 0 answered (or no ``--llm-url``: the context alone),
2 bad arguments, 3 the model server failed (down, slower than ``--timeout``, an HTTP error or a
reply that is no chat completion): one line on stderr names the URL and what went wrong, and the
context and its citations are still printed (in ``--json``: ``answer.text`` null and
``answer.error`` the reason). A distinct code, not 0 with a warning, so that a script can tell an
answer from a context without reading stderr (our choice).
"""
from __future__ import annotations

import json
import os
import sys
import time

SCHEMA_VERSION = 1
EXIT_NO_ANSWER = 3
SECTIONS = ("entities", "relations", "sources", "images")
_ONE = {"entities": "entity", "relations": "relation", "sources": "source", "images": "image"}


def add_answer_options(p) -> None:
    """``--llm-url``, ``--llm-model``, ``--api-key-env``, ``--timeout`` of ``colgraph query``."""
    p.add_argument("--llm-url", dest="llm_url", default=None,
                   help="OpenAI-compatible endpoint that answers from the context, e.g. http://localhost:8000/v1")
    p.add_argument("--llm-model", dest="llm_model", default=None, help="the model it serves")
    p.add_argument("--api-key-env", dest="api_key_env", default="OPENAI_API_KEY",
                   help="environment variable holding the endpoint's API key (default OPENAI_API_KEY)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the answer (default 60)")


def answer_generator(args):
    """The generator the options name (None without ``--llm-url``); ValueError for a bad
    combination, ImportError when the ``llm`` extra is missing."""
    url, model = args.llm_url, args.llm_model
    if model and not url:
        raise ValueError("--llm-model: name the endpoint too (--llm-url URL)")
    if not url:
        return None
    if not model:
        raise ValueError("--llm-url: name the model too (--llm-model NAME)")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--llm-url: expected an http:// or https:// URL, got {url!r}")
    if isinstance(args.timeout, bool) or not args.timeout > 0:
        raise ValueError(f"--timeout: expected seconds > 0, got {args.timeout!r}")
    import importlib.util
    if importlib.util.find_spec("openai") is None:  # the llm extra
        raise ImportError("--llm-url needs the llm extra (pip install 'colgraph_engine[llm]'): no module openai")
    from ..pipeline import OpenAIGenerator
    return OpenAIGenerator(model, base_url=url, api_key=os.environ.get(args.api_key_env) or None,
                           timeout=args.timeout, max_retries=0)


def why_failed(exc: BaseException, url: str, timeout: float) -> str:
    """One line: what went wrong asking the model server at `url`."""
    import openai

    if isinstance(exc, openai.APITimeoutError):
        what = f"did not answer within {timeout:g} s (--timeout)"
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        what = f"cannot be reached ({cause or exc})"
    elif isinstance(exc, openai.APIStatusError):
        message = str(exc.message).removeprefix(f"Error code: {exc.status_code} - ")
        what = f"answered HTTP {exc.status_code} ({_short(message)})"
    elif isinstance(exc, _EmptyAnswer):
        what = "answered an empty message"
    elif isinstance(exc, (AttributeError, TypeError, KeyError, IndexError, ValueError)):
        # a 200 whose body is no chat completion (HTML, plain text, JSON of another shape): the
        # client fails reading choices[0].message from it
        what = "answered something that is not a chat completion (no choices[0].message in the reply)"
    else:
        what = f"failed ({type(exc).__name__}: {_short(str(exc))})"
    return f"the model server at {url} {what}"


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 3] + "..."


class _EmptyAnswer(ValueError):
    pass


def ask(generator, r):
    """Asks `generator` to answer from `r`'s context; sets ``r.answer`` (an Answer whose error is
    one line naming the URL) and returns the error line or None."""
    from ..pipeline.context import Answer

    t0 = time.perf_counter()
    try:
        text = generator(r.context.render(), [])
        if not isinstance(text, str) or not text.strip():
            raise _EmptyAnswer("empty answer")
        r.answer = Answer(text.strip(), None, time.perf_counter() - t0)
        return None
    except Exception as exc:  # the context is printed whatever the endpoint did
        msg = why_failed(exc, generator.base_url, generator.timeout)
        r.answer = Answer(None, msg, time.perf_counter() - t0)
        return msg


def citations_of(ctx) -> tuple[list[dict], list[dict]]:
    """``(citations, lines)`` of a context (see the README's schema): the distinct citation labels
    of its rendered lines in order of first appearance (``n`` = 1, 2, ...; ``box`` null for text
    and whole pages, ``image`` the image of the first line with that label when it is an image
    line), and one entry per line."""
    cites: dict[str, dict] = {}
    lines = []
    for section in SECTIONS:
        for item in (ctx.items or {}).get(section, []):
            label = item.get("cite") or f"[{item.get('doc_id', item.get('document', ''))}]"
            doc = item.get("doc_id", item.get("document", ""))
            pages, box = list(item.get("pages") or []), item.get("box")
            if label not in cites:  # one entry per label: a whole page image cites its page, as text does
                image = item.get("image") if section == "images" else None
                whole = box is not None and pages and [float(x) for x in box] == [0.0, 0.0, 1.0, 1.0]
                cites[label] = {"n": len(cites) + 1, "label": label, "doc_id": doc, "pages": pages,
                                "box": None if box is None or whole else [float(x) for x in box], "image": image}
            name, text, score = _line_fields(section, item)
            lines.append({"section": section, "citation": cites[label]["n"], "doc_id": doc, "pages": pages,
                          "box": None if box is None else [float(x) for x in box], "name": name, "text": text,
                          "score": None if score is None else float(score)})
    return list(cites.values()), lines


def _line_fields(section: str, item: dict) -> tuple[str, str, float | None]:
    if section == "entities":
        return item["name"], item["description"], item.get("score")
    if section == "relations":
        return f"{item['source']} -> {item['target']}", item["description"], item.get("score")
    if section == "sources":
        return item["name"], item["text"], item.get("score")
    name = item["image"] if item.get("region") is None else f"{item['image']} / {item['region']}"
    return str(name), item.get("text_view", ""), item.get("score")


def query_json(r, generator=None) -> dict:
    """The ``--json`` object of schema version :data:`SCHEMA_VERSION` (README)."""
    citations, lines = citations_of(r.context)
    answer = None
    if generator is not None:
        a = r.answer
        answer = {"text": a.text, "error": a.error, "model": generator.model, "url": generator.base_url,
                  "seconds": round(float(a.seconds), 4)}
    return {
        "schema_version": SCHEMA_VERSION,
        "question": r.query.question, "caption": r.query.caption, "has_image": r.query.image is not None,
        "answer": answer,
        "documents": [{"doc_id": d, "score": float(s)} for d, s in r.documents],
        "citations": citations,
        "context": {"text": r.context.render(), "tokens": int(sum(r.context.tokens.values())), "lines": lines},
        "timings": {k: float(v) for k, v in r.timings.items()},
        "notes": list(r.notes),
        "detail": r.as_dict(),  # every stage's output; its inner shape is not part of the schema
    }


def print_answer(r, generator, out=None, *, context_chars: int = 4000) -> None:
    """The answer (or why there is none), its citations, then the context it was given."""
    out = sys.stdout if out is None else out
    w = lambda s="": print(s, file=out)  # noqa: E731
    citations, lines = citations_of(r.context)
    a = r.answer
    w(f"Q: {r.query.question}")
    if a is not None and a.text is not None:
        w(f"A ({generator.model}, {a.seconds:.1f} s):")
        for line in a.text.splitlines():
            w(f"  {line}")
    else:
        w(f"A: none ({a.error if a is not None else 'no model asked'})")
    w(f"citations ({len(citations)}):")
    for c in citations:
        used = [ln for ln in lines if ln["citation"] == c["n"]]
        what = "; ".join(f"{_ONE[ln['section']]} {ln['name']}" for ln in used[:3]) + (" ..." if len(used) > 3 else "")
        w(f"  {c['n']:>2}. {c['label']}  {_short(what, 100)}")
    text = r.context.render()
    w(f"context ({sum(r.context.tokens.values())} tokens):")
    for line in (text[:context_chars] + (" ..." if len(text) > context_chars else "")).splitlines():
        w(f"  {line}")


def finish_query(r, args, generator, json_default) -> int:
    """Asks the model (when one is named), prints the result as text or ``--json``; the exit code."""

    error = ask(generator, r) if generator is not None else None
    if error:
        print(f"colgraph query: {error}; the context is printed without an answer (exit {EXIT_NO_ANSWER})",
              file=sys.stderr)
    if args.json:
        print(json.dumps(query_json(r, generator), indent=1, default=json_default))
    elif generator is not None:
        print_answer(r, generator)
    else:
        print_result(r)
    return EXIT_NO_ANSWER if error else 0


__all__ = ["EXIT_NO_ANSWER", "SCHEMA_VERSION", "add_answer_options", "answer_generator", "ask", "citations_of",
           "finish_query", "print_answer", "query_json", "why_failed"]


def _fmt_box(b):
    return "-" if b is None else "(" + ", ".join(f"{x:.2f}" for x in b) + ")"


def print_result(r, out=None, *, context_chars: int = 1200) -> None:
    """Every stage of one result, with the citation (``[doc p.N]``, ``[doc p.N box (...)]``) of each
    image, source and record."""
    from ..pipeline.citations import record_citation
    from ..pipeline.evidence import by_score
    out = sys.stdout if out is None else out
    w = lambda s="": print(s, file=out)  # noqa: E731
    q = r.query
    w(f"Q: {q.question}" + (f"   [query image; caption: {q.caption!r}]" if q.image is not None else ""))
    w(f"  1 recall ({'+'.join(r.recall_sides)}): " + ", ".join(f"{d} {s:.4f}" for d, s in r.documents[:5]))
    w(f"  3 seeds: entities {r.seed_entities[:6]}  relations {[f'{a} - {b}' for a, b in r.seed_relations[:3]]}")
    c = r.counts
    w(f"  4 expansion: {c['expand']['nodes']} nodes, {c['expand']['relations']} relations kept "
      f"({r.config.filter} filter, l = {r.config.hops})")
    label = {"text_view": "text views: caption, OCR, region labels; no text-image model",
             "patches": "image patches"}.get(r.image_units, "off")
    why = "question tokens (no visual cue)" if r.visual_used_question else f"C_vis {list(r.visual_phrases.phrases)}"
    if q.caption.strip():
        why = (f"{why} + " if r.visual_phrases.has_visual_cue else "") + f"the caption {q.caption.strip()!r}"
    if q.image is not None and r.visual_used_question:
        why = "the query image's patches alone (no visual cue, no caption)"
    w(f"  5 images by {r.config.visual_ranker} of {why} vs {label}:")
    for h in r.images[:5]:
        what = h.image if h.kind == "image" else f"{h.image} / {h.name}"
        w(f"      {h.score:7.3f}  {h.kind:<6} {what:<32} box {_fmt_box(h.bbox)}  {h.cite or '[' + h.doc_id + ']'}")
    w("  6 records:")
    for rec in sorted(r.evidence.records, key=lambda x: -by_score(x.score))[:5]:
        where = f"{rec.image} {_fmt_box(rec.bbox)}" if rec.image else f"segments {list(rec.segments)}"
        w(f"      ({rec.subject} | {rec.predicate} | {rec.object})  {record_citation(rec).label()} {where}")
    w("    sources:")
    for s in r.evidence.sources[:5]:
        w(f"      {s['score']:7.3f}  {s['name']:<12} {s.get('cite', '[' + s['doc_id'] + ']')}")
    w(f"     G_e {r.evidence.ge_nodes.size} nodes -> G* {r.evidence.gstar_nodes.size} nodes")
    text = r.context.render()
    w(f"  7 context ({sum(r.context.tokens.values())} tokens):")
    for line in (text[:context_chars] + (" ..." if len(text) > context_chars else "")).splitlines():
        w(f"      {line}")
    if r.answer is not None:
        w(f"  answer: {r.answer.text!r}" + (f" (error: {r.answer.error})" if r.answer.error else ""))
    w("  ms per stage (batch): " + "  ".join(f"{k} {v * 1e3:.1f}" for k, v in r.timings.items()))
    for n in r.notes:
        w(f"  note: {n}")
