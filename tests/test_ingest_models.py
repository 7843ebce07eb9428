"""Model hooks for ingest over real loopback HTTP: the real openai client talks to the chat
stand-in (tests/chat_standin.py), whose scripted replies make every case deterministic."""
from __future__ import annotations

import base64
import io
import json
import multiprocessing
import sys
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from chat_standin import Reply, chat_standin, last_user_text  # noqa: E402

from colgraph_engine.graph.kinds import EdgeKind, NodeKind  # noqa: E402
from colgraph_engine.ingest import prompts  # noqa: E402
from colgraph_engine.ingest.cache import ResponseCache, request_key  # noqa: E402
from colgraph_engine.ingest.chat import (  # noqa: E402
    ChatClient, ChatRequest, ModelCallError, encode_image, load_image,
)
from colgraph_engine.ingest.hooks import CaptionHook, LLMExtractor, VisionHook, strip_reasoning  # noqa: E402
from colgraph_engine.kg.document import DocumentInput, ImageInput, build_document_graph  # noqa: E402
from colgraph_engine.kg.parsers import parse_extraction, parse_region_mappings, parse_scene_graph  # noqa: E402
from colgraph_engine.kg.segment import Section, Segment  # noqa: E402

D = prompts.DELIMITER
FAST = dict(timeout=3.0, backoff=(0.01, 2.0, 0.04))  # tiny backoff keeps the file fast


def client(url: str, **kw) -> ChatClient:
    return ChatClient(url, "standin-model", **{**FAST, **kw})


def ent(name: str, type_: str = "organization", desc: str = "") -> str:
    return D.join(("entity", name, type_, desc or f"{name} as the passage describes it."))


def rel(a: str, b: str, kw: str = "link") -> str:
    return D.join(("relation", a, b, kw, f"{a} is linked to {b}."))


FIRST = "\n".join([ent("Velmora Harbour"), ent("Kestrel Dynamics"), rel("Velmora Harbour", "Kestrel Dynamics"),
                   prompts.COMPLETE])
GLEAN = "\n".join([ent("Orrin Bridge", "location"), rel("Kestrel Dynamics", "Orrin Bridge", "construction"),
                   prompts.COMPLETE])


def extraction_script(request: dict) -> str:
    """First answer, one gleaning answer with new records, then 'nothing missing'."""
    turns = len(request["messages"])
    return {2: FIRST, 4: GLEAN}.get(turns, prompts.COMPLETE)


# -- extraction -------------------------------------------------------------------------------------

def test_extraction_with_gleaning_parses_in_line_format_and_builds_a_graph():
    with chat_standin(extraction_script) as (url, server):
        extractor = LLMExtractor(client(url), gleaning=3, entity_types=("organization", "location"))
        outcome = extractor.extract("Kestrel Dynamics built the Orrin Bridge for Velmora Harbour.", where="doc seg 0")
        # Round 2 answered <|COMPLETE|> alone: the loop stopped there, not after 3 rounds.
        assert (outcome.calls, outcome.rounds, outcome.error, server.count) == (3, 2, None, 3)
        first, second, third = server.requests
        assert first["messages"][0]["role"] == "system" and "organization, location" in first["messages"][0]["content"]
        assert "Kestrel Dynamics built the Orrin Bridge" in first["messages"][1]["content"]
        # Gleaning continues the conversation: the previous answer, then our continuation prompt.
        assert second["messages"][2] == {"role": "assistant", "content": FIRST}
        assert second["messages"][3]["content"] == extractor.gleaning_prompt
        assert third["messages"][4] == {"role": "assistant", "content": GLEAN}
        assert first["temperature"] == 0.0

        result = parse_extraction(outcome.text)
        assert result.dialect == "lightrag" and result.complete and not result.errors
        assert [e.name for e in result.entities] == ["Velmora Harbour", "Kestrel Dynamics", "Orrin Bridge"]
        assert [(r.source, r.target) for r in result.relations] == [
            ("Velmora Harbour", "Kestrel Dynamics"), ("Kestrel Dynamics", "Orrin Bridge")]
        assert outcome.text.count(prompts.COMPLETE) == 1 and outcome.text.endswith(prompts.COMPLETE)

        # As the extractor of the document builder (one segment -> one conversation of 3 calls).
        graph = build_document_graph(DocumentInput("doc", sections=["Kestrel Dynamics built the bridge."]),
                                     extractor=extractor)
        names = {graph.node_name[i] for i in np.flatnonzero(graph.node_kind == NodeKind.ENTITY)}
        assert names == {"Velmora Harbour", "Kestrel Dynamics", "Orrin Bridge"}
        assert int((graph.edge_kind == EdgeKind.RELATION).sum()) == 2
        assert server.count == 6


def test_gleaning_stops_when_an_answer_adds_nothing_new_and_zero_rounds_make_one_call():
    with chat_standin(lambda req: FIRST) as (url, server):  # every round repeats the first answer
        outcome = LLMExtractor(client(url), gleaning=5).extract("some text")
        assert (outcome.calls, outcome.rounds, server.count) == (2, 1, 2)
        assert len(parse_extraction(outcome.text).entities) == 4  # repeats are kept; the builder merges them
    with chat_standin(lambda req: FIRST) as (url, server):
        outcome = LLMExtractor(client(url), gleaning=0).extract("some text")
        assert (outcome.calls, server.count, outcome.text) == (1, 1, FIRST)
    with chat_standin(lambda req: FIRST) as (url, server):  # blank text: no call, an empty answer
        assert LLMExtractor(client(url)).extract("  \n") .text == prompts.COMPLETE and server.count == 0


def test_reasoning_is_dropped_and_a_cut_off_answer_stays_incomplete():
    thinking = f"<think>maybe {ent('Decoy Corp')}\n{prompts.COMPLETE} no wait</think>\n{FIRST}"
    with chat_standin(lambda req: thinking if len(req["messages"]) == 2 else prompts.COMPLETE) as (url, _):
        result = parse_extraction(LLMExtractor(client(url)).extract("t").text)
        assert [e.name for e in result.entities] == ["Velmora Harbour", "Kestrel Dynamics"] and result.complete
    cut = "\n".join(FIRST.splitlines()[:2])  # max_tokens hit: no completion marker
    with chat_standin(lambda req: Reply(cut, finish_reason="length") if len(req["messages"]) == 2
                      else prompts.COMPLETE) as (url, _):
        outcome = LLMExtractor(client(url)).extract("t")
        result = parse_extraction(outcome.text)
        assert len(result.entities) == 2 and not result.complete
        assert any(i.reason == "no completion marker" for i in result.issues)
    assert strip_reasoning("a</think>b") == "b" and strip_reasoning("a<think>b") == "a"


# -- cache ------------------------------------------------------------------------------------------

def test_cache_makes_a_rerun_free_also_for_a_new_client_and_misses_on_a_changed_prompt(tmp_path):
    texts = ["Kestrel Dynamics built the bridge.", "Velmora Harbour hired them.", "A third passage."]
    with chat_standin(extraction_script) as (url, server):
        first = LLMExtractor(client(url, cache=ResponseCache(tmp_path / "cache")), gleaning=2).extract_many(texts)
        paid = server.count
        assert paid == 9 and all(o.cached == 0 for o in first)
        again_client = client(url, cache=ResponseCache(tmp_path / "cache"))  # a new process would look like this
        again = LLMExtractor(again_client, gleaning=2).extract_many(texts)
        assert server.count == paid  # 0 requests the second time
        assert [o.text for o in again] == [o.text for o in first]
        assert all(o.cached == o.calls == 3 for o in again)
        assert again_client.stats.cache_hits == 9 and again_client.stats.requests == 0
        assert len(ResponseCache(tmp_path / "cache")) == 9
        # Another prompt (entity types are in the system prompt) is another key.
        LLMExtractor(again_client, gleaning=0, entity_types=("person",)).extract(texts[0])
        assert server.count == paid + 1


def test_cache_ignores_and_reports_a_corrupted_entry_then_rewrites_it(tmp_path):
    cache = ResponseCache(tmp_path)
    messages = [{"role": "user", "content": "hello"}]
    with chat_standin(lambda req: "fresh answer") as (url, server):
        c = client(url, cache=cache)
        key = request_key(c.model, messages, c.params())
        cache.path_of(key).parent.mkdir(parents=True, exist_ok=True)
        cache.path_of(key).write_bytes(b'{"format": "colgraph-chat-cache", "vers')  # a torn write
        with pytest.warns(RuntimeWarning, match="corrupted entry"):
            reply = c.complete(messages)
        assert (reply.text, reply.cached, server.count) == ("fresh answer", False, 1)
        assert str(cache.path_of(key)) not in cache.corrupted  # the good reply replaced it
        assert c.complete(messages).cached and server.count == 1
    for bad in (b"[1, 2]", json.dumps({"format": "colgraph-chat-cache", "version": 1, "key": "0" * 64,
                                         "text": "x"}).encode(), b"\xff\xfe"):
        cache.path_of(key).write_bytes(bad)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert cache.get(key) is None
    assert len(cache.corrupted) == 1  # one path, its latest reason
    assert "holds key" in cache.corrupted[str(cache.path_of(key))] or "JSON" in cache.corrupted[str(cache.path_of(key))]


def _write_entries(folder: str, worker: int) -> None:
    cache = ResponseCache(folder)
    for i in range(60):
        key = request_key("m", [{"role": "user", "content": str(i % 20)}], {})
        cache.put(key, f"answer {i % 20}", model="m", purpose=f"w{worker}")


def test_cache_writes_are_atomic_across_threads_and_processes(tmp_path):
    threads = [threading.Thread(target=_write_entries, args=(str(tmp_path), w)) for w in range(4)]
    procs = [multiprocessing.get_context("fork").Process(target=_write_entries, args=(str(tmp_path), 10 + w))
             for w in range(2)]
    for t in threads + procs:
        t.start()
    for t in threads:
        t.join()
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    cache = ResponseCache(tmp_path)
    assert len(cache) == 20 and not list(tmp_path.rglob("*.tmp"))
    for i in range(20):
        hit = cache.get(request_key("m", [{"role": "user", "content": str(i)}], {}))
        assert hit is not None and hit.text == f"answer {i}"
    assert not cache.corrupted


# -- retries, timeouts, concurrency -----------------------------------------------------------------

def test_retries_with_backoff_on_429_and_5xx_honour_retry_after_then_succeed():
    script = iter([(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0.3"}),
                   (500, {"error": {"message": "internal"}}, {}),
                   (503, {"error": {"message": "overloaded"}}, {"retry-after-ms": "50"}),
                   "finally"])
    with chat_standin(lambda req: next(script)) as (url, server):
        c = client(url, max_retries=3)
        reply = c.complete([{"role": "user", "content": "hi"}], purpose="probe")
        assert (reply.text, reply.attempts, server.count) == ("finally", 4, 4)
        assert reply.seconds >= 0.3 + 0.05  # both server-requested waits were kept
        assert c.stats.retries == 3 and c.stats.requests == 4 and c.failures == []


def test_other_4xx_fail_at_once_and_exhausted_retries_are_recorded():
    with chat_standin(lambda req: (400, {"error": {"message": "bad request"}}, {})) as (url, server):
        c = client(url, max_retries=3)
        with pytest.raises(ModelCallError, match="BadRequestError") as info:
            c.complete([{"role": "user", "content": "x"}], purpose="probe", where="seg 1")
        assert server.count == 1 and info.value.failure.status == 400 and info.value.failure.attempts == 1
    with chat_standin(lambda req: (502, "bad gateway", {})) as (url, server):
        c = client(url, max_retries=2)
        with pytest.raises(ModelCallError):
            c.complete([{"role": "user", "content": "x"}], purpose="probe", where="seg 2")
        assert server.count == 3
        (failure,) = c.failures
        assert (failure.purpose, failure.where, failure.attempts, failure.status) == ("probe", "seg 2", 3, 502)


def test_timeout_becomes_a_recorded_failure():
    with chat_standin(lambda req: Reply("too late", delay=1.0)) as (url, server):
        c = client(url, timeout=0.2, max_retries=1)
        with pytest.raises(ModelCallError, match="Timeout"):
            c.complete([{"role": "user", "content": "x"}], purpose="extract", where="slow segment")
        (failure,) = c.failures
        assert failure.attempts == 2 and failure.where == "slow segment" and "APITimeoutError" in failure.error
        assert server.count == 2 and c.stats.failures == 1


def test_concurrency_limit_holds_for_batches_and_for_outside_threads():
    echo = lambda req: Reply("echo " + req["messages"][-1]["content"], delay=0.08)  # noqa: E731
    with chat_standin(echo) as (url, server):
        c = client(url, concurrency=3)
        results = c.complete_many([ChatRequest([{"role": "user", "content": str(i)}], where=f"r{i}") for i in range(12)])
        assert [r.text for r in results] == [f"echo {i}" for i in range(12)]  # order kept
        assert server.max_in_flight == 3
    with chat_standin(echo) as (url, server):
        c = client(url, concurrency=2)
        threads = [threading.Thread(target=c.complete, args=([{"role": "user", "content": str(i)}],))
                   for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.count == 8 and server.max_in_flight == 2


# -- failures inside batches ------------------------------------------------------------------------

def test_a_failed_call_is_recorded_while_the_rest_of_the_batch_succeeds():
    def script(req):
        if "POISON" in req["messages"][1]["content"]:
            return (400, {"error": {"message": "content rejected"}}, {})
        return FIRST
    with chat_standin(script) as (url, server):
        c = client(url)
        extractor = LLMExtractor(c, gleaning=0)
        outcomes = extractor.extract_many(["ok one", "POISON two", "ok three"], where=["a", "b", "c"])
        assert [o.error is None for o in outcomes] == [True, False, True]
        assert outcomes[1].text is None and "content rejected" in outcomes[1].error
        assert all(parse_extraction(outcomes[i].text).entities for i in (0, 2))
        (failure,) = c.failures
        assert (failure.where, failure.purpose, failure.status) == ("b", "extract", 400)
        # In the builder: the failing segment gives no records, the others are ingested.
        texts = ["Fine text about Velmora.", "POISON here.", "More fine text."]
        doc = DocumentInput("d", segments=[Segment(t, (), (i, i), 4) for i, t in enumerate(texts)])
        graph = build_document_graph(doc, extractor=extractor)
        assert int((graph.node_kind == NodeKind.SEGMENT).sum()) == 3
        assert {graph.node_name[i] for i in np.flatnonzero(graph.node_kind == NodeKind.ENTITY)} == {
            "Velmora Harbour", "Kestrel Dynamics"}
        assert any(i.issue.reason == "no records" for i in graph.issues)
        assert len(c.failures) == 2


def test_a_gleaning_failure_keeps_the_first_answer():
    with chat_standin(lambda req: FIRST if len(req["messages"]) == 2 else (500, "down", {})) as (url, server):
        outcome = LLMExtractor(client(url, max_retries=1), gleaning=2).extract("t", where="seg 9")
        assert outcome.text == FIRST and "500" in outcome.error and outcome.calls == 1
        assert server.count == 3


# -- vision -----------------------------------------------------------------------------------------

SCENE = ("Here is the scene graph:\n- <object_0>: harbour crane, (0.10, 0.05, 0.55, 1.01)\n"
         "<object-1>: ship, [0.5, 0.6, 0.95, 0.9]\n<object-2>: seagull\n"
         "<relation-0>: <object-0> loading <object-1>\n<relation-1>: <object-1> near <object-7>")
MATCH = ('("mapping"<|>"<image>"<|>Velmora Harbour<|>8)\n("mapping"<|>"<object_0>"<|>Kestrel Dynamics<|>9)\n'
         '("mapping"<|>"<relation-0>"<|>Kestrel Dynamics<|>Velmora Harbour<|>7)\n<|COMPLETE|>')


def _sent_image(request: dict):
    from PIL import Image
    (part,) = [p for p in request["messages"][-1]["content"] if p["type"] == "image_url"]
    head, data = part["image_url"]["url"].split(",", 1)
    assert head == "data:image/jpeg;base64"
    return Image.open(io.BytesIO(base64.b64decode(data)))


def test_scene_graph_is_normalised_into_our_dialect_and_matching_parses():
    def script(req):
        text = last_user_text(req)
        return MATCH if text.startswith("Link what") else SCENE
    image = np.zeros((1500, 3000, 3), np.uint8)
    with chat_standin(script) as (url, server):
        hook = VisionHook(client(url), max_side=256)
        sg = hook.scene_graph(image, where="fig 1")
        assert _sent_image(server.requests[0]).size == (256, 128)  # downscaled, aspect kept
        parsed = parse_scene_graph(sg, strict=True)
        assert [(o.index, o.category, o.bbox) for o in parsed.objects] == [
            (0, "harbour crane", (0.1, 0.05, 0.55, 1.0)), (1, "ship", (0.5, 0.6, 0.95, 0.9))]
        assert [(r.subject, r.predicate, r.object) for r in parsed.scene_relations] == [(0, "loading", 1)]
        assert sorted(i.reason for _, i in hook.dropped) == ["malformed object", "unknown object"]

        entities = [("Velmora Harbour", "location", "A harbour."), ("Kestrel Dynamics", "organization", "Builds cranes.")]
        answer = hook.match(image, sg, entities, [("Kestrel Dynamics", "Velmora Harbour", "Automated its cranes.")],
                            where="fig 1")
        prompt = last_user_text(server.requests[1])
        assert "- Velmora Harbour (location): A harbour." in prompt and "<object-0>: harbour crane" in prompt
        assert "Kestrel Dynamics -> Velmora Harbour" in prompt
        maps = parse_region_mappings(answer, strict=True).mappings
        assert [(m.kind, m.ref, m.entity or (m.source, m.target), m.score) for m in maps] == [
            ("image", None, "Velmora Harbour", 8.0), ("object", 0, "Kestrel Dynamics", 9.0),
            ("relation", 0, ("Kestrel Dynamics", "Velmora Harbour"), 7.0)]

        # Into a document: regions for both objects, matched to entities.
        doc = DocumentInput("d", sections=[Section("Velmora Harbour hired Kestrel Dynamics.", images=("fig",))],
                            images=[ImageInput("fig", scene_graph=sg, mappings=answer)],
                            extractions=[FIRST])
        graph = build_document_graph(doc, strict=True)
        assert int((graph.node_kind == NodeKind.REGION).sum()) >= 2
        assert int((graph.edge_kind == EdgeKind.DEPICTS).sum()) == 2  # the image and object 0


def test_scene_graph_boxes_in_pixels_or_per_mille_become_fractions():
    image = np.full((100, 200, 3), 128, np.uint8)
    with chat_standin(lambda req: "<object-0>: sign, (20, 10, 100, 50)\n<object-1>: pole, (100, 50, 120, 100)") as (url, server):
        sg = VisionHook(client(url), coordinates="pixels").scene_graph(image)
        assert "200 x 100" in last_user_text(server.requests[0])
        assert [o.bbox for o in parse_scene_graph(sg).objects] == [(0.1, 0.1, 0.5, 0.5), (0.5, 0.5, 0.6, 1.0)]
        sg = VisionHook(client(url), coordinates="per_mille").scene_graph(image)
        assert [o.bbox for o in parse_scene_graph(sg).objects] == [(0.02, 0.01, 0.1, 0.05), (0.1, 0.05, 0.12, 0.1)]


def test_captions_and_a_bad_image_in_a_batch_is_recorded(tmp_path):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    good = tmp_path / "good.png"
    from PIL import Image
    Image.fromarray(np.full((40, 60, 3), 200, np.uint8)).save(good)
    with chat_standin(lambda req: '  "A grey   square\n with nothing on it."  ') as (url, server):
        c = client(url)
        hook = CaptionHook(c, max_words=20)
        assert hook.caption(good) == "A grey square with nothing on it."
        assert "at most 20 words of English" in last_user_text(server.requests[0])
        out = hook.captions([good, empty, np.zeros((8, 8), np.uint8)], where=["p1", "p2", "p3"])
        assert out[0] == out[2] == "A grey square with nothing on it." and out[1] is None
        (failure,) = c.failures
        assert failure.where == "p2" and "empty.png" in failure.error and failure.attempts == 0
        assert server.count == 3
        with pytest.raises(ValueError, match="empty.png"):
            hook.caption(empty)  # a single call with a bad argument raises


def test_vision_call_failure_returns_none_and_is_recorded():
    with chat_standin(lambda req: (503, "busy", {})) as (url, server):
        c = client(url, max_retries=0)
        hook = VisionHook(c)
        image = np.zeros((20, 20, 3), np.uint8)
        assert hook.scene_graphs([image, image], where="img") == [None, None]
        assert hook.match(image, "", [("A", "t", "d")]) is None
        assert sorted(f.where for f in c.failures) == ["", "img 0", "img 1"]  # failures are in time order


# -- bad arguments ----------------------------------------------------------------------------------

def test_bad_arguments_raise_clear_errors_and_send_nothing(tmp_path):
    with chat_standin(lambda req: "x") as (url, server):
        c = client(url)
        cases = [
            (lambda: ChatClient(42, "m"), TypeError, "base_url"),
            (lambda: ChatClient("ftp://x", "m"), ValueError, "base_url"),
            (lambda: ChatClient(url, ""), ValueError, "model"),
            (lambda: ChatClient(url, "m", timeout=0), ValueError, "timeout"),
            (lambda: ChatClient(url, "m", max_retries=-1), ValueError, "max_retries"),
            (lambda: ChatClient(url, "m", backoff=(1.0, 0.5, 2.0)), ValueError, "backoff"),
            (lambda: ChatClient(url, "m", concurrency=0), ValueError, "concurrency"),
            (lambda: ChatClient(url, "m", cache=str(tmp_path)), TypeError, "cache"),
            (lambda: ChatClient(url, "m", temperature=float("nan")), ValueError, "temperature"),
            (lambda: c.complete("hello"), TypeError, "messages"),
            (lambda: c.complete([]), ValueError, "messages"),
            (lambda: c.complete([{"role": "robot", "content": "x"}]), ValueError, "role"),
            (lambda: c.complete([{"role": "user", "content": [{"type": "audio"}]}]), ValueError, "content"),
            (lambda: c.complete([{"role": "user", "content": "x"}], max_tokens=0), ValueError, "max_tokens"),
            (lambda: c.complete_many([("not", "a request")]), TypeError, "requests"),
            (lambda: c.complete_many([ChatRequest([])]), ValueError, r"requests\[0\]"),
            (lambda: LLMExtractor(None), TypeError, "client"),
            (lambda: LLMExtractor(c, gleaning=11), ValueError, "gleaning"),
            (lambda: LLMExtractor(c, entity_types="person"), ValueError, "entity_types"),
            (lambda: LLMExtractor(c, entity_types=("a<|#|>b",)), ValueError, "entity_types"),
            (lambda: LLMExtractor(c, max_records=0), ValueError, "max_records"),
            (lambda: LLMExtractor(c)(b"bytes"), TypeError, "text"),
            (lambda: LLMExtractor(c).extract_many(["a", "b"], where=["only one"]), ValueError, "where"),
            (lambda: VisionHook(c, coordinates="inches"), ValueError, "coordinates"),
            (lambda: VisionHook(c, max_side=4), ValueError, "max_side"),
            (lambda: VisionHook(c).match(np.zeros((4, 4, 3), np.uint8), "", []), ValueError, "entities"),
            (lambda: VisionHook(c).match(np.zeros((4, 4, 3), np.uint8), "", [("A", "t")]), TypeError, "entities"),
            (lambda: VisionHook(c).scene_graph(np.zeros((4, 4, 3), np.float32)), TypeError, "uint8"),
            (lambda: VisionHook(c).scene_graph(tmp_path / "missing.png"), ValueError, "missing.png"),
            (lambda: CaptionHook(c).caption(42), TypeError, "image"),
            (lambda: load_image(np.zeros((0, 4, 3), np.uint8)), ValueError, "non-empty"),
            (lambda: encode_image(np.zeros((4, 4, 5), np.uint8)), ValueError, "shape"),
            (lambda: ResponseCache(42), TypeError, "folder"),
            (lambda: ResponseCache(tmp_path / "f.txt"), ValueError, "not a directory"),
            (lambda: ResponseCache(tmp_path).get("xyz"), ValueError, "key"),
        ]
        (tmp_path / "f.txt").write_text("a file")
        for call, error, match in cases:
            with pytest.raises(error, match=match):
                call()
        assert server.count == 0 and c.failures == []


def test_missing_openai_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ImportError, match=r"pip install colgraph_engine\[llm\]"):
        ChatClient("http://127.0.0.1:9/v1", "m")


def test_the_pipeline_generator_talks_to_the_same_stand_in():
    from PIL import Image

    from colgraph_engine.pipeline import OpenAIGenerator

    with chat_standin(lambda req: "The answer is 42.") as (url, server):
        gen = OpenAIGenerator("standin-model", base_url=url, timeout=3.0, max_retries=0, send_images=True)
        assert gen("What is it?", [Image.new("RGB", (8, 6), "red")]) == "The answer is 42."
        (request,) = server.requests
        assert request["model"] == "standin-model" and request["messages"][0]["role"] == "system"
        kinds = [p["type"] for p in request["messages"][1]["content"]]
        assert kinds == ["text", "image_url"] and request["messages"][1]["content"][0]["text"] == "What is it?"
