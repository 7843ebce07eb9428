"""``colgraph query --llm-url URL --llm-model NAME`` (issue 25, item 4): the answer with its
citations, the ``--json`` schema (README, "Answers from the command line"), and a model server
that is down, slow, erroring or answering garbage: one line on stderr naming the URL, the context
still printed, exit 3. The model server is the loopback stand-in of tests/chat_standin.py."""
from __future__ import annotations

import json
import socket

import pytest

from colgraph_engine.cli import main
from colgraph_engine.ingest.readers import read_pdf
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.pipeline import OpenAIGenerator
from tests.chat_standin import Reply, chat_standin, last_user_text
from tests.test_citations import PAGES, QUESTION, write_pdf


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("answer")
    enc = Encoders.offline()  # a set the command reopens by its recorded name
    KnowledgeIndex.create(root / "index", enc).add_documents([read_pdf(write_pdf(root / "harbour.pdf", PAGES)).document])
    return str(root / "index")


def cites_first(request: dict) -> str:
    """The stand-in model: answers with the citation label of the best text source (a context
    line with "content") of the context it was sent."""
    sources = [json.loads(x) for x in last_user_text(request).splitlines() if x.startswith("{") and '"content"' in x]
    return f"Kestrel Dynamics builds them {sources[0]['cite']}."


def test_the_answer_is_printed_with_its_citations(capsys, index_dir):
    with chat_standin(cites_first) as (url, server):
        assert main(["query", index_dir, QUESTION, "--llm-url", url, "--llm-model", "standin", "--kd", "1"]) == 0
        (request,) = server.requests
    out = capsys.readouterr().out
    assert request["model"] == "standin" and request["messages"][0]["content"] == OpenAIGenerator.SYSTEM
    assert '"cite": "[harbour.pdf p.2]"' in last_user_text(request)  # the model read cited lines
    assert "Kestrel Dynamics builds them [harbour.pdf p.2]." in out
    lines = out.splitlines()
    first = lines.index(next(x for x in lines if x.startswith("citations (")))
    listed = [x.split()[1:3] for x in lines[first + 1:lines.index(next(x for x in lines if x.startswith("context (")))]]
    assert ["[harbour.pdf", "p.2]"] in listed and ["[harbour.pdf", "p.1]"] in listed
    assert lines[first + 1].split()[0] == "1." and "source segment-" in out


# the --json schema, version 1, as the README writes it down: field -> type (None: may be null)
CITATION = {"n": int, "label": str, "doc_id": str, "pages": list, "box": (list, None), "image": (str, None)}
LINE = {"section": str, "citation": int, "doc_id": str, "pages": list, "box": (list, None), "name": str, "text": str,
        "score": (float, None)}
ANSWER = {"text": (str, None), "error": (str, None), "model": str, "url": str, "seconds": float}
TOP = {"schema_version": int, "question": str, "caption": str, "has_image": bool, "answer": (dict, None),
       "documents": list, "citations": list, "context": dict, "timings": dict, "notes": list, "detail": dict}


def check(obj: dict, schema: dict, where: str) -> None:
    assert set(obj) >= set(schema), f"{where}: missing {set(schema) - set(obj)}"
    for key, want in schema.items():
        types = want if isinstance(want, tuple) else (want,)
        ok = any(obj[key] is None if t is None else isinstance(obj[key], t) and not (t is int and isinstance(obj[key], bool))
                 for t in types)
        assert ok, f"{where}.{key}: {obj[key]!r} is not {want}"


def check_schema(data: dict) -> None:
    check(data, TOP, "top")
    assert data["schema_version"] == 1
    for d in data["documents"]:
        check(d, {"doc_id": str, "score": float}, "documents[]")
    for c in data["citations"]:
        check(c, CITATION, "citations[]")
        assert all(isinstance(p, int) for p in c["pages"])
        assert c["box"] is None or (len(c["box"]) == 4 and all(isinstance(x, float) for x in c["box"]))
    assert [c["n"] for c in data["citations"]] == list(range(1, len(data["citations"]) + 1))
    check(data["context"], {"text": str, "tokens": int, "lines": list}, "context")
    for line in data["context"]["lines"]:
        check(line, LINE, "context.lines[]")
        assert line["section"] in ("entities", "relations", "sources", "images")
        assert 1 <= line["citation"] <= len(data["citations"])
        assert data["citations"][line["citation"] - 1]["pages"] == line["pages"]
    assert all(isinstance(v, float) for v in data["timings"].values())
    if data["answer"] is not None:
        check(data["answer"], ANSWER, "answer")
        assert (data["answer"]["text"] is None) != (data["answer"]["error"] is None)


def test_json_has_every_documented_field_with_its_type(capsys, index_dir):
    with chat_standin(cites_first) as (url, _):
        assert main(["query", index_dir, QUESTION, "--llm-url", url, "--llm-model", "standin", "--kd", "1",
                     "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check_schema(data)
    assert data["answer"]["text"] == "Kestrel Dynamics builds them [harbour.pdf p.2]." and data["answer"]["url"] == url
    page2 = next(c for c in data["citations"] if c["label"] == "[harbour.pdf p.2]")
    assert page2["pages"] == [2] and page2["doc_id"] == "harbour.pdf" and page2["box"] is None
    top_source = next(x for x in data["context"]["lines"] if x["section"] == "sources")
    assert top_source["pages"] == [2] and top_source["text"].startswith("Kestrel Dynamics")
    page_image = next(x for x in data["context"]["lines"] if x["section"] == "images" and x["name"] == "page-2")
    assert page_image["box"] == [0.0, 0.0, 1.0, 1.0]
    # without a model: the same schema, answer null
    assert main(["query", index_dir, QUESTION, "--kd", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    check_schema(data)
    assert data["answer"] is None and data["documents"][0]["doc_id"] == "harbour.pdf"


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}/v1"


FAILURES = {
    "slow": (lambda req: Reply("too late", delay=3.0), "did not answer within 0.5 s"),
    "http error": (lambda req: (503, {"error": {"message": "model is loading"}}, {}), "answered HTTP 503"),
    "garbage": (lambda req: (200, "<html>not json</html>", {}), "not a chat completion"),
    "wrong shape": (lambda req: (200, {"result": "hello"}, {}), "not a chat completion"),
    "empty": (lambda req: "   ", "an empty message"),
}


@pytest.mark.parametrize("case", ["down", *FAILURES])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_failing_model_server_gets_one_line_and_the_context_is_still_printed(capsys, index_dir, case, as_json):
    args = ["--llm-model", "standin", "--timeout", "0.5", "--kd", "1"] + (["--json"] if as_json else [])
    if case == "down":
        url, phrase = closed_port_url(), "cannot be reached"
        code = main(["query", index_dir, QUESTION, "--llm-url", url, *args])
    else:
        reply, phrase = FAILURES[case]
        with chat_standin(reply) as (url, _):
            code = main(["query", index_dir, QUESTION, "--llm-url", url, *args])
    got = capsys.readouterr()
    assert code == 3
    (line,) = got.err.strip().splitlines()
    assert line.startswith(f"colgraph query: the model server at {url} ") and phrase in line, line
    assert "the context is printed without an answer" in line
    if as_json:
        data = json.loads(got.out)
        check_schema(data)
        assert data["answer"]["text"] is None and phrase in data["answer"]["error"]
        assert "[harbour.pdf p.2]" in data["context"]["text"]
    else:
        assert "A: none (the model server at" in got.out and '"cite": "[harbour.pdf p.2]"' in got.out


def test_bad_model_options_exit_2_before_anything_loads(capsys, index_dir):
    assert main(["query", index_dir, QUESTION, "--llm-model", "m"]) == 2
    assert "--llm-url" in capsys.readouterr().err
    assert main(["query", index_dir, QUESTION, "--llm-url", "http://127.0.0.1:1/v1"]) == 2
    assert "--llm-model" in capsys.readouterr().err
    assert main(["query", index_dir, QUESTION, "--llm-url", "localhost:8000", "--llm-model", "m"]) == 2
    assert "http://" in capsys.readouterr().err
    assert main(["query", index_dir, QUESTION, "--llm-url", "http://x/v1", "--llm-model", "m", "--timeout", "0"]) == 2
    assert "--timeout" in capsys.readouterr().err
