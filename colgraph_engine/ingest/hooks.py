"""Model hooks for ingest: LLM extraction, vision scene graphs and vision-text matching, captions.

All three call a :class:`~colgraph_engine.ingest.chat.ChatClient` and are optional: without them
the offline extractor and sidecar files still build an index. Failures never escape a batch:
every failed call is in ``client.failures`` and the hook returns ``None`` (or an
:class:`ExtractionOutcome` with ``error`` set), so a document is ingested with what succeeded.
Bad arguments (wrong types, unreadable image files in single calls) raise TypeError/ValueError.

* :class:`LLMExtractor` writes LightRAG's current line format (``kg.parsers`` dialect
  ``lightrag``); it is a ``text -> str`` extractor for ``build_document_graph(extractor=...)``.
* :class:`VisionHook` returns scene graphs in the ``scene_graph`` dialect with boxes normalised
  to [0, 1], and region matches in the ``mkg_mapping`` dialect.
* :class:`CaptionHook` returns one caption per image.
"""
from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from ..kg.parsers import parse_extraction, parse_scene_graph
from ..kg.records import ParseIssue, clean_field, normalize_name
from . import prompts
from .chat import DEFAULT_MAX_SIDE, ChatClient, ModelCallError, _check_max_side, encode_image, run_parallel

_COMPLETE_MARK = re.compile(r"<\|?\s*COMPLETE\s*\|?>", re.IGNORECASE)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.IGNORECASE | re.DOTALL)
_THINK_OPEN = re.compile(r"<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_OBJECT_LINE = re.compile(r"^([^\S\n]*(?:[-*][^\S\n]+)?<[^\S\n]*object[-_ ]?\d+[^\S\n]*>[^\S\n]*:.*)([(\[])([^()\[\]\n]*)([)\]])([^\S\n]*\.?[^\S\n]*)$",
                          re.IGNORECASE | re.MULTILINE)
# Boxes this little outside [0, 1] (rounding, a box drawn to the edge) are clamped; further out
# they are left for the parser to reject. Our choice.
BOX_TOLERANCE = 0.02


def strip_reasoning(text: str) -> str:
    """The answer without reasoning-model thinking: ``<think>...</think>`` blocks are removed; a
    ``</think>`` without its opening tag (servers that strip it) drops everything before it; an
    unclosed ``<think>`` (cut off while thinking) drops everything after it."""
    text = _THINK_BLOCK.sub("", text)
    close = None
    for close in _THINK_CLOSE.finditer(text):
        pass
    if close is not None:
        text = text[close.end():]
    opened = _THINK_OPEN.search(text)
    if opened is not None:
        text = text[:opened.start()]
    return text


def _answer_body(answer: str) -> tuple[str, bool]:
    """``(records before the completion marker, whether the marker was there)``."""
    answer = strip_reasoning(answer)
    mark = _COMPLETE_MARK.search(answer)
    if mark is None:
        return answer.strip(), False
    return answer[:mark.start()].strip(), True


# -- text extraction ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ExtractionOutcome:
    """The result of extracting one text.

    ``text``: the records of every answer joined into one response in LightRAG's line format
    (``None`` when the first call failed); it ends with ``<|COMPLETE|>`` only if every answer
    did, so a cut-off answer shows as ``no completion marker`` when parsed. ``error``: the failure
    (``"<purpose> (<where>): ..."``) or None; with ``text`` set it means a gleaning round failed
    and the records of the earlier answers are kept. ``calls``: chat calls made (cache hits
    included), ``cached``: how many of them were cache hits, ``rounds``: gleaning rounds done.
    """
    text: str | None
    error: str | None
    calls: int
    cached: int = 0
    rounds: int = 0


class LLMExtractor:
    """Entity and relation extraction by a chat model, in LightRAG's current line format.

    Args:
        client: the :class:`ChatClient` (its cache makes re-extraction free).
        entity_types: the types the model may use (default :data:`prompts.DEFAULT_ENTITY_TYPES`,
            our choice).
        gleaning: extra rounds asking for records the previous answers missed (LightRAG's
            gleaning; 0 to 10). A round stops the loop early when its answer adds no entity name
            and no entity pair that earlier answers did not already have (this includes the
            answer ``<|COMPLETE|>`` alone, which the prompt asks for when nothing is missing).
            Older LightRAG versions, and mKG-RAG's copy of them (``rag/multimodal/build.py``),
            instead ask a separate yes/no question after each round, one more call per round;
            this rule is ours and costs no call.
        language: language of descriptions and keywords.
        max_records: asks the model for at most this many records per answer (None: no limit).
            The limit is an instruction in the prompt, not a cut applied to the answer.

    ``extractor(text) -> str`` is the combined response (empty string when the first call
    failed: the failure is in ``client.failures`` and the builder reports ``no records``);
    :meth:`extract_many` runs texts concurrently and returns :class:`ExtractionOutcome` s.
    """

    def __init__(self, client: ChatClient, *, entity_types: Sequence[str] = prompts.DEFAULT_ENTITY_TYPES,
                 gleaning: int = 1, language: str = "English", max_records: int | None = None):
        if not isinstance(client, ChatClient):
            raise TypeError(f"client: expected a ChatClient, got {type(client).__name__}")
        if isinstance(entity_types, str) or not isinstance(entity_types, Sequence) or not entity_types:
            raise ValueError(f"entity_types: expected a non-empty sequence of type names, got {entity_types!r}")
        for i, t in enumerate(entity_types):
            if not isinstance(t, str):
                raise TypeError(f"entity_types[{i}]: expected str, got {type(t).__name__}")
            if not t.strip() or "\n" in t or prompts.DELIMITER in t or "," in t:
                raise ValueError(f"entity_types[{i}]: expected a one-line name without ',' or "
                                 f"{prompts.DELIMITER!r}, got {t!r}")
        if isinstance(gleaning, bool) or not isinstance(gleaning, int) or not 0 <= gleaning <= 10:
            raise ValueError(f"gleaning: expected an int in [0, 10], got {gleaning!r}")
        if not isinstance(language, str) or not language.strip():
            raise ValueError(f"language: expected a non-empty language name, got {language!r}")
        if max_records is not None and (isinstance(max_records, bool) or not isinstance(max_records, int)
                                        or max_records < 1):
            raise ValueError(f"max_records: expected an int >= 1 or None, got {max_records!r}")
        self.client, self.gleaning, self.language, self.max_records = client, gleaning, language.strip(), max_records
        self.entity_types = tuple(t.strip() for t in entity_types)
        limit = f"\n- Write at most {max_records} records in one answer." if max_records else ""
        self.system_prompt = prompts.EXTRACTION_SYSTEM.format(
            entity_types=", ".join(self.entity_types), language=self.language, delimiter=prompts.DELIMITER,
            complete=prompts.COMPLETE, record_limit=limit)
        self.gleaning_prompt = prompts.GLEANING_USER.format(delimiter=prompts.DELIMITER, complete=prompts.COMPLETE)

    name = "llm-lightrag-lines-v1"

    def messages(self, text: str) -> list[dict]:
        """The first request's messages for `text` (system prompt, then the passage)."""
        return [{"role": "system", "content": self.system_prompt},
                {"role": "user", "content": prompts.EXTRACTION_USER.format(text=text, complete=prompts.COMPLETE)}]

    def __call__(self, text: str) -> str:
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        outcome = self.extract(text, where=f"text {text[:40]!r}")
        return outcome.text or ""

    def extract(self, text: str, *, where: str = "") -> ExtractionOutcome:
        """Extracts one text: first answer plus up to ``gleaning`` rounds; never raises for a
        failed call (see :class:`ExtractionOutcome`)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected str, got {type(text).__name__}")
        if not isinstance(where, str):
            raise TypeError(f"where: expected str, got {type(where).__name__}")
        if not text.strip():
            return ExtractionOutcome(prompts.COMPLETE, None, 0)
        messages = self.messages(text)
        bodies: list[str] = []
        complete, calls, cached, rounds, error = True, 0, 0, 0, None
        seen_entities: set[str] = set()
        seen_pairs: set[frozenset] = set()
        for round_ in range(self.gleaning + 1):
            purpose = "extract" if round_ == 0 else "extract-gleaning"
            try:
                reply = self.client.complete(messages, purpose=purpose,
                                             where=where if round_ == 0 else f"{where} round {round_}".strip())
            except ModelCallError as exc:
                error = str(exc)
                break
            calls, cached = calls + 1, cached + reply.cached
            rounds = round_
            body, marked = _answer_body(reply.text)
            complete = complete and marked
            if body:
                bodies.append(body)
            new = _new_keys(body, seen_entities, seen_pairs)
            if round_ > 0 and not new:
                break  # the model found nothing further
            messages = messages + [{"role": "assistant", "content": reply.text},
                                   {"role": "user", "content": self.gleaning_prompt}]
        if not calls:
            return ExtractionOutcome(None, error, 0)
        joined = "\n".join(bodies)
        if complete:
            joined = f"{joined}\n{prompts.COMPLETE}" if joined else prompts.COMPLETE
        return ExtractionOutcome(joined, error, calls, cached, rounds)

    def extract_many(self, texts: Sequence[str], where: Sequence[str] | str | None = None) -> list[ExtractionOutcome]:
        """Extracts `texts` on ``client.concurrency`` threads (one conversation per text, its
        rounds in order); results in input order. ``where`` labels each text in failure records:
        a sequence of labels, a prefix (``"<prefix> <i>"``), or None (``"text <i>"``)."""
        if isinstance(texts, str) or not isinstance(texts, Sequence):
            raise TypeError(f"texts: expected a sequence of str, got {type(texts).__name__}")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise TypeError(f"texts[{i}]: expected str, got {type(t).__name__}")
        labels = _labels(where, len(texts), "text")
        return run_parallel(lambda pair: self.extract(pair[0], where=pair[1]), list(zip(texts, labels)),
                            self.client.concurrency)


def _new_keys(body: str, seen_entities: set[str], seen_pairs: set[frozenset]) -> bool:
    """Adds the entity names and entity pairs of `body` to the seen sets; True if any was new."""
    if not body:
        return False
    result = parse_extraction(f"{body}\n{prompts.COMPLETE}")
    entities = {e.key for e in result.entities} - seen_entities
    pairs = {frozenset((r.source_key, r.target_key)) for r in result.relations} - seen_pairs
    seen_entities |= entities
    seen_pairs |= pairs
    return bool(entities or pairs)


def _labels(where: object, n: int, default: str) -> list[str]:
    if where is None:
        return [f"{default} {i}" for i in range(n)]
    if isinstance(where, str):
        return [f"{where} {i}".strip() for i in range(n)]
    if not isinstance(where, Sequence):
        raise TypeError(f"where: expected a sequence of str, a str prefix or None, got {type(where).__name__}")
    if len(where) != n:
        raise ValueError(f"where: expected {n} labels (one per item), got {len(where)}")
    for i, w in enumerate(where):
        if not isinstance(w, str):
            raise TypeError(f"where[{i}]: expected str, got {type(w).__name__}")
    return list(where)


# -- images -----------------------------------------------------------------------------------------

class _ImageHook:
    def __init__(self, client: ChatClient, max_side: int):
        if not isinstance(client, ChatClient):
            raise TypeError(f"client: expected a ChatClient, got {type(client).__name__}")
        _check_max_side(max_side)
        self.client, self.max_side = client, max_side

    def _call(self, image: object, text: str, purpose: str, where: str, max_tokens: int | None = None,
              encoded: tuple[str, tuple[int, int]] | None = None) -> str | None:
        url, _ = encoded or encode_image(image, self.max_side)
        messages = [{"role": "user", "content": [{"type": "text", "text": text},
                                                 {"type": "image_url", "image_url": {"url": url}}]}]
        try:
            return strip_reasoning(self.client.complete(messages, purpose=purpose, where=where,
                                                        max_tokens=max_tokens).text)
        except ModelCallError:
            return None  # recorded in client.failures

    def _batch(self, fn, items: list, labels: list[str], purpose: str) -> list:
        """Runs ``fn(item, where)``; an unreadable image becomes a recorded failure and None."""
        def one(pair):
            item, where = pair
            try:
                return fn(item, where)
            except (TypeError, ValueError) as exc:
                self.client.record_failure(purpose, where, f"{type(exc).__name__}: {exc}")
                return None
        return run_parallel(one, list(zip(items, labels)), self.client.concurrency)


class VisionHook(_ImageHook):
    """Scene graphs and vision-text matching by a vision-language chat model.

    Args:
        client: the :class:`ChatClient` (the endpoint must accept image content parts).
        max_side: images are downscaled to this longer side before sending (default 1024, ours).
        max_objects, max_relations: asked-for limits per scene graph (defaults 20 and 20, ours).
        coordinates: how the model is asked to write boxes: ``"fraction"`` (of width and height,
            in [0, 1]; the default), ``"pixels"`` (of the image as sent) or ``"per_mille"``
            (integers 0-1000, the convention of some grounding models). :meth:`scene_graph`
            converts all three to fractions.
    """

    COORDINATES = ("fraction", "pixels", "per_mille")

    def __init__(self, client: ChatClient, *, max_side: int = DEFAULT_MAX_SIDE, max_objects: int = 20,
                 max_relations: int = 20, coordinates: str = "fraction"):
        super().__init__(client, max_side)
        for name, value in (("max_objects", max_objects), ("max_relations", max_relations)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
        if coordinates not in self.COORDINATES:
            raise ValueError(f"coordinates: expected one of {self.COORDINATES}, got {coordinates!r}")
        self.max_objects, self.max_relations, self.coordinates = max_objects, max_relations, coordinates
        self._lock = threading.Lock()
        self._dropped: list[tuple[str, ParseIssue]] = []

    @property
    def dropped(self) -> list[tuple[str, ParseIssue]]:
        """``(where, issue)`` for every scene-graph line the parser rejected (a copy)."""
        with self._lock:
            return list(self._dropped)

    def scene_graph_prompt(self, size: tuple[int, int]) -> str:
        rule = prompts.BOX_RULES[self.coordinates].format(width=size[0], height=size[1])
        return prompts.SCENE_GRAPH_USER.format(max_objects=self.max_objects, max_relations=self.max_relations,
                                               box_rule=rule)

    def scene_graph(self, image: object, *, where: str = "") -> str | None:
        """The image's scene graph, rewritten in our ``scene_graph`` dialect:
        ``<object-i>: category, (x1, y1, x2, y2)`` with three-decimal fractions in [0, 1], then
        ``<relation-j>: <object-a> predicate <object-b>``; the model's own numbering is kept so
        that matching refers to the same objects. Lines the parser rejects are left out and
        listed in :attr:`dropped`; an answer without any valid object gives ``""``. None if the
        call failed (recorded in ``client.failures``)."""
        _check_where(where)
        encoded = encode_image(image, self.max_side)
        raw = self._call(image, self.scene_graph_prompt(encoded[1]), "scene-graph", where, encoded=encoded)
        if raw is None:
            return None
        if self.coordinates == "pixels":
            raw = _rescale_boxes(raw, *encoded[1])
        elif self.coordinates == "per_mille":
            raw = _rescale_boxes(raw, 1000.0, 1000.0)
        else:
            raw = _rescale_boxes(raw, 1.0, 1.0)
        result = parse_scene_graph(raw)
        rejected = [i for i in result.issues if i.severity in ("error", "skip")]
        if rejected:
            with self._lock:
                self._dropped.extend((where, i) for i in rejected)
        lines = [f"<object-{o.index}>: {_one_line(o.category)}, ({o.bbox[0]:.3f}, {o.bbox[1]:.3f}, "
                 f"{o.bbox[2]:.3f}, {o.bbox[3]:.3f})" for o in sorted(result.objects, key=lambda o: o.index)]
        lines += [f"<relation-{r.index}>: <object-{r.subject}> {_one_line(r.predicate)} <object-{r.object}>"
                  for r in sorted(result.scene_relations, key=lambda r: r.index)]
        return "\n".join(lines)

    def match_prompt(self, scene_graph: str, entities: Sequence[tuple[str, str, str]],
                     relations: Sequence[tuple[str, str, str]] = ()) -> str:
        ents = _check_triples("entities", entities, require=True)
        rels = _check_triples("relations", relations, require=False)
        if not isinstance(scene_graph, str):
            raise TypeError(f"scene_graph: expected str (scene_graph dialect), got {type(scene_graph).__name__}")
        entity_lines = "\n".join(f"- {_one_line(n)}{f' ({_one_line(t)})' if t.strip() else ''}: {_short(d)}"
                                 for n, t, d in ents)
        relation_lines = "\n".join(f"- {_one_line(s)} -> {_one_line(t)}: {_short(d)}" for s, t, d in rels) or "(none)"
        return prompts.MATCH_USER.format(entities=entity_lines, relations=relation_lines,
                                         scene_graph=scene_graph.strip() or "(no objects detected)",
                                         d=prompts.TUPLE_DELIMITER, complete=prompts.COMPLETE)

    def match(self, image: object, scene_graph: str, entities: Sequence[tuple[str, str, str]],
              relations: Sequence[tuple[str, str, str]] = (), *, where: str = "") -> str | None:
        """mKG-RAG's vision-text matching: which entities the image, its objects and its scene
        relations show.

        Args:
            image: PIL image, uint8 array or file path.
            scene_graph: the image's scene graph in our dialect (e.g. from :meth:`scene_graph`;
                ``""`` for image-level matching only).
            entities: ``(name, type, description)`` of the document's entities, at least one
                (mKG-RAG passes the entities extracted from the image's text chunk).
            relations: optional ``(source, target, description)`` between those entities.

        Returns:
            the model's answer in the ``mkg_mapping`` dialect (reasoning removed), one record a
            line: ``("mapping"<|>"<image>"<|>NAME<|>score)``,
            ``("mapping"<|>"<object-i>"<|>NAME<|>score)``,
            ``("mapping"<|>"<relation-j>"<|>SOURCE<|>TARGET<|>score)``, then ``<|COMPLETE|>``;
            None if the call failed (recorded in ``client.failures``).

        Scores: the prompt asks for integers from 0 to 10, the range mKG-RAG's matching prompt
        states. What mKG-RAG's code does with them (its ``rag/multimodal`` build and operate
        modules): a non-numeric score counts as 1.0; a relation match whose entity pair is not a
        relation of the chunk gives each named endpoint entity the region with
        ``max(score // 2, 1)``; weights of one region matched more than once add up at query
        time. The code read sets no threshold on the score.
        """
        _check_where(where)
        text = self.match_prompt(scene_graph, entities, relations)
        return self._call(image, text, "region-match", where)

    def scene_graphs(self, images: Sequence[object], where: Sequence[str] | str | None = None) -> list[str | None]:
        """:meth:`scene_graph` for many images, concurrently; a failed call or an unreadable image
        gives None (recorded in ``client.failures``)."""
        items = _check_items("images", images)
        return self._batch(lambda im, w: self.scene_graph(im, where=w), items, _labels(where, len(items), "image"),
                           "scene-graph")

    def matches(self, items: Sequence[tuple], where: Sequence[str] | str | None = None) -> list[str | None]:
        """:meth:`match` for many ``(image, scene_graph, entities[, relations])`` tuples,
        concurrently; failures give None (recorded in ``client.failures``)."""
        items = _check_items("items", items)
        for i, item in enumerate(items):
            if not isinstance(item, tuple) or len(item) not in (3, 4):
                raise TypeError(f"items[{i}]: expected (image, scene_graph, entities[, relations]), got {item!r:.80}")
        return self._batch(lambda it, w: self.match(*it, where=w), items, _labels(where, len(items), "image"),
                           "region-match")


class CaptionHook(_ImageHook):
    """Image captions for retrieval (the image's text view).

    Args: client, max_side (default 1024, ours), max_words (asked-for length, default 60, ours),
    language.
    """

    def __init__(self, client: ChatClient, *, max_side: int = DEFAULT_MAX_SIDE, max_words: int = 60,
                 language: str = "English"):
        super().__init__(client, max_side)
        if isinstance(max_words, bool) or not isinstance(max_words, int) or max_words < 5:
            raise ValueError(f"max_words: expected an int >= 5, got {max_words!r}")
        if not isinstance(language, str) or not language.strip():
            raise ValueError(f"language: expected a non-empty language name, got {language!r}")
        self.max_words, self.language = max_words, language.strip()
        self.prompt = prompts.CAPTION_USER.format(max_words=max_words, language=self.language)

    def caption(self, image: object, *, where: str = "") -> str | None:
        """One caption (whitespace collapsed, surrounding quotes removed); None if the call failed."""
        _check_where(where)
        text = self._call(image, self.prompt, "caption", where)
        return None if text is None else clean_field(" ".join(text.split()))

    def captions(self, images: Sequence[object], where: Sequence[str] | str | None = None) -> list[str | None]:
        """:meth:`caption` for many images, concurrently; failures give None (recorded)."""
        items = _check_items("images", images)
        return self._batch(lambda im, w: self.caption(im, where=w), items, _labels(where, len(items), "image"),
                           "caption")


# -- helpers ----------------------------------------------------------------------------------------

def _rescale_boxes(text: str, sx: float, sy: float) -> str:
    """Divides object-box coordinates by (sx, sy, sx, sy) and clamps values within
    :data:`BOX_TOLERANCE` of [0, 1]; lines it cannot read are left for the parser to report."""
    def fix(m: re.Match) -> str:
        try:
            values = [float(v) for v in m.group(3).split(",")]
        except ValueError:
            return m.group(0)
        if len(values) != 4:
            return m.group(0)
        scaled = [v / s for v, s in zip(values, (sx, sy, sx, sy))]
        scaled = [min(1.0, max(0.0, v)) if -BOX_TOLERANCE <= v <= 1 + BOX_TOLERANCE else v for v in scaled]
        return f"{m.group(1)}({', '.join(f'{v:.6g}' for v in scaled)}){m.group(5)}"
    return _OBJECT_LINE.sub(fix, text)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _short(text: str, limit: int = 240) -> str:
    text = _one_line(text)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_where(where: object) -> None:
    if not isinstance(where, str):
        raise TypeError(f"where: expected str, got {type(where).__name__}")


def _check_items(name: str, items: object) -> list:
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name}: expected a sequence, got {type(items).__name__}")
    return list(items)


def _check_triples(name: str, triples: object, require: bool) -> list[tuple[str, str, str]]:
    if isinstance(triples, (str, bytes)) or not isinstance(triples, Sequence):
        raise TypeError(f"{name}: expected a sequence of (str, str, str) tuples, got {type(triples).__name__}")
    if require and not triples:
        raise ValueError(f"{name}: expected at least one (name, type, description), got none")
    out = []
    for i, t in enumerate(triples):
        if not isinstance(t, (tuple, list)) or len(t) != 3 or not all(isinstance(x, str) for x in t):
            raise TypeError(f"{name}[{i}]: expected a (str, str, str) tuple, got {t!r:.80}")
        if not normalize_name(t[0]) or (name == "relations" and not normalize_name(t[1])):
            raise ValueError(f"{name}[{i}]: expected non-empty names, got {t!r:.80}")
        out.append(tuple(t))
    return out
