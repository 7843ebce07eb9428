"""Chat-client benchmark: LLM extraction of N passages against the loopback chat stand-in.

Usage (from the repository root)::

    .venv/bin/python benchmarks/chat_client_report.py              # 48 passages, 50 ms per reply
    .venv/bin/python benchmarks/chat_client_report.py --texts 16 --delay 0.02

Every reply of the stand-in (tests/chat_standin.py, a real HTTP server on 127.0.0.1) waits
``--delay`` seconds, standing in for model latency; each passage is one conversation of two
calls (the first answer, then one gleaning round that answers ``<|COMPLETE|>`` alone). Rows:

* peer: the same 2N requests made one by one with the plain ``openai`` client (no cache, no
  retries, no bookkeeping): the baseline every ratio is against;
* ``LLMExtractor`` on a ``ChatClient`` with concurrency 1 (our per-call overhead), 4 and 8;
* concurrency 4 with a cold ``ResponseCache`` (every reply written: temp file, fsync, rename),
  then a warm rerun with a new client on the same cache folder (0 requests expected).

Checked before reporting: every row's combined outputs are equal, the server saw the expected
number of requests and never more in flight than the row's concurrency. Reported: wall seconds
(median of ``--repeats``), requests sent, passages/s and speed ratio vs the peer.
Writes ``results/chat_client.md`` and ``.json`` beside this file (or under ``--out``).
"""
from __future__ import annotations

import pathlib
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

import _harness as h  # noqa: E402
from chat_standin import Reply, chat_standin  # noqa: E402

from colgraph_engine.ingest import prompts  # noqa: E402
from colgraph_engine.ingest.cache import ResponseCache  # noqa: E402
from colgraph_engine.ingest.chat import ChatClient  # noqa: E402
from colgraph_engine.ingest.hooks import LLMExtractor  # noqa: E402

D = prompts.DELIMITER


def answer_for(request: dict, delay: float) -> Reply:
    if len(request["messages"]) > 2:
        return Reply(prompts.COMPLETE, delay)
    passage = request["messages"][1]["content"].split("<<<\n", 1)[1].split("\n>>>", 1)[0]
    n = passage.split()[-1]
    return Reply(f"entity{D}Site {n}{D}location{D}Passage {n}.\nentity{D}Team {n}{D}organization{D}Works at site {n}.\n"
                 f"relation{D}Team {n}{D}Site {n}{D}work{D}Team {n} works at Site {n}.\n{prompts.COMPLETE}", delay)


def run_peer(url: str, extractor: LLMExtractor, texts: list[str]) -> list[str]:
    """The same conversations with the plain openai client, one request at a time."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=30.0)
    out = []
    for text in texts:
        messages = extractor.messages(text)
        first = client.chat.completions.create(model="m", messages=messages, temperature=0.0).choices[0].message.content
        messages = messages + [{"role": "assistant", "content": first},
                               {"role": "user", "content": extractor.gleaning_prompt}]
        client.chat.completions.create(model="m", messages=messages, temperature=0.0)
        out.append(first.replace(f"\n{prompts.COMPLETE}", "") + f"\n{prompts.COMPLETE}")
    return out


def main(argv=None) -> int:
    ap = h.parser(__doc__)
    ap.add_argument("--texts", type=int, default=48)
    ap.add_argument("--delay", type=float, default=0.05)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    if args.quick:
        args.texts, args.repeats = 8, 1
    texts = [f"Passage about a team working at site {i}" for i in range(args.texts)]
    n_requests = 2 * args.texts
    rows = []
    with chat_standin(lambda req: answer_for(req, args.delay)) as (url, server):
        probe = LLMExtractor(ChatClient(url, "m"), gleaning=1)
        expected = None

        def timed(name: str, concurrency: int, fn, want_requests: int):
            nonlocal expected
            seconds = []
            for _ in range(args.repeats):
                before = server.count
                server.max_in_flight = 0
                t0 = time.perf_counter()
                outputs, extra = fn()
                seconds.append(time.perf_counter() - t0)  # every call checked (outputs, requests) below
                sent = server.count - before
                if sent != want_requests:
                    raise SystemExit(f"{name}: expected {want_requests} requests, the server saw {sent}")
                if server.max_in_flight > concurrency:
                    raise SystemExit(f"{name}: {server.max_in_flight} requests in flight, limit {concurrency}")
                if expected is None:
                    expected = outputs
                elif outputs != expected:
                    raise SystemExit(f"{name}: outputs differ from the peer's")
            rows.append({"row": name, "concurrency": concurrency, "seconds": statistics.median(seconds),
                         "requests": want_requests, "max_in_flight": server.max_in_flight, **extra})

        timed("peer: plain openai client, sequential", 1, lambda: (run_peer(url, probe, texts), {}), n_requests)
        for conc in (1, 4, 8):
            def ours(conc=conc):
                ex = LLMExtractor(ChatClient(url, "m", concurrency=conc), gleaning=1)
                return [o.text for o in ex.extract_many(texts)], {}
            timed(f"ours: ChatClient + LLMExtractor, concurrency {conc}", conc, ours, n_requests)
        with tempfile.TemporaryDirectory() as tmp:
            state = {"i": 0}

            def cold():
                state["i"] += 1
                cache = ResponseCache(pathlib.Path(tmp) / f"c{state['i']}")
                ex = LLMExtractor(ChatClient(url, "m", concurrency=4, cache=cache), gleaning=1)
                return [o.text for o in ex.extract_many(texts)], {"cache_entries": len(cache)}
            timed("ours: concurrency 4, cold cache (writes)", 4, cold, n_requests)

            def warm():
                client = ChatClient(url, "m", concurrency=4, cache=ResponseCache(pathlib.Path(tmp) / "c1"))
                outs = [o.text for o in LLMExtractor(client, gleaning=1).extract_many(texts)]
                return outs, {"cache_hits": client.stats.cache_hits}
            timed("ours: rerun on a warm cache, new client", 4, warm, 0)
    for r in rows:
        r["impl"], r["group"], r["passages_per_s"] = r["row"], 0, args.texts / r["seconds"]
    h.add_ratios(rows, rows[0]["row"], key="seconds", field="ratio_vs_peer", group="group")
    body = [f"Median of {args.repeats}; every run's outputs equal the peer's, its requests and in-flight count checked.", "",
            *h.table([("row", "row"), ("wall s:", lambda r: f"{r['seconds']:.3f}"), ("requests:", "requests"),
                      ("max in flight:", "max_in_flight"), ("passages/s:", lambda r: f"{r['passages_per_s']:.1f}"),
                      ("speed vs peer:", lambda r: f"{r['ratio_vs_peer']:.2f}x")], rows)]
    meta = {"texts": args.texts, "delay_s": args.delay, "repeats": args.repeats, "requests_per_text": 2}
    h.write(h.stem("chat_client", args), f"Chat client: {args.texts} passages x 2 calls, {args.delay * 1000:.0f} ms "
            "per reply (loopback stand-in)", body, {"meta": meta, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
