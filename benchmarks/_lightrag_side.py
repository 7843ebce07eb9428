"""The LightRAG side of ``lightrag_peer.py``: runs in LightRAG's own virtual environment.

Only the standard library and numpy are imported at module level: the driver (our ``.venv``, no
LightRAG) imports :func:`custom_kg_of` and :func:`vdb_items` to precompute the vectors of the
texts LightRAG will embed, and :func:`serve_lines` and :func:`mem`, so both sides' workers speak
and measure alike. ``python _lightrag_side.py ingest ...`` turns each batch of corpus documents
(JSON lines: doc_id, segment texts, extraction records) into one ``custom_kg`` (chunks =
segments, every item's ``file_path`` = its document id) for one ``insert_custom_kg`` call and
prints the times and peak RSS; ``serve ...`` answers ``query`` and ``batch`` requests with
``aquery_llm`` (the context string and the structured data it was built from).

No LLM runs: the LLM function raises, keywords are given in ``QueryParam`` (no keyword
extraction), ``only_need_context=True``, ``enable_rerank=False``. The embedding function looks
vectors up by a 64-bit hash of the exact text LightRAG passes (a text with no vector raises).
``tiktoken`` would download its BPE file, so LightRAG gets :class:`WordTokenizer`.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib
import itertools
import json
import os
import re
import sys
import threading
import time

T_SCRIPT = time.perf_counter()  # after the interpreter started: "open" is measured from here

import numpy as np  # noqa: E402

SEP = "<|#|>"
_WORDS = re.compile(r"\w+|[^\w\s]")  # words and punctuation marks, as our count_tokens
DIM = 128
EMBEDDING_TIMEOUT_S = 3600
SECTIONS = (("entities", "entities"), ("relationships", "relations"), ("chunks", "chunks"))  # LightRAG's, ours


# ------------------------------------------------------------------------------------------
# What LightRAG gets and embeds, and what both sides' workers share (no LightRAG import)
# ------------------------------------------------------------------------------------------

def text_key(text: str) -> int:
    """64-bit key of a text (blake2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def custom_kg_of(docs: list[dict]) -> dict:
    """One ``custom_kg`` for documents ``{"doc_id", "segments": [text], "extractions": [records]}``
    (extraction i holds the records of segment i, in the ``<|#|>`` record format); a relation
    from a name to itself is left out, as our parser leaves it out."""
    chunks, entities, relations = [], [], []
    for d in docs:
        doc_id = d["doc_id"]
        for s, text in enumerate(d["segments"]):
            alias = f"{doc_id}#{s}"
            chunks.append({"content": text, "source_id": alias, "file_path": doc_id, "chunk_order_index": s})
            for line in d["extractions"][s].splitlines():
                f = line.split(SEP)
                if f[0] == "entity" and len(f) == 4:
                    entities.append({"entity_name": f[1], "entity_type": f[2], "description": f[3],
                                     "source_id": alias, "file_path": doc_id})
                elif f[0] == "relation" and len(f) == 5 and f[1] != f[2]:
                    # Both sides drop a relation whose two ends share a name: our parser skips it
                    # as a "self-loop" record and LightRAG's insert_custom_kg refuses the whole call
                    # (1.5.7: ValueError). The generator makes a few at 100k documents, where a
                    # document's own name can be drawn again from the shared pool.
                    relations.append({"src_id": f[1], "tgt_id": f[2], "keywords": f[3], "description": f[4],
                                      "weight": 1.0, "source_id": alias, "file_path": doc_id})
    return {"chunks": chunks, "entities": entities, "relationships": relations}


def vdb_items(kg: dict) -> list[tuple[str, str]]:
    """``(text LightRAG embeds, text our index embeds for the same item)`` for every chunk,
    entity and relation of `kg`: LightRAG's vector-store contents as ``insert_custom_kg``
    (1.5.7) forms them (chunk: the stripped content; entity: ``name\\ndescription``; relation:
    ``keywords\\tsrc\\ntgt\\ndescription`` with the endpoints sorted), and ours as
    ``colgraph_engine.kg.vectors.item_texts`` forms them (segment text; ``name: description``;
    ``src keywords tgt: description``). Names here need no normalisation (ASCII, no quotes);
    a text that LightRAG forms otherwise has no vector and fails the run loudly."""
    out = [(c["content"].strip(), c["content"]) for c in kg["chunks"]]
    out += [(f"{e['entity_name']}\n{e['description']}", f"{e['entity_name']}: {e['description']}")
            for e in kg["entities"]]
    for r in kg["relationships"]:
        s, t = sorted((r["src_id"], r["tgt_id"]))
        out.append((f"{r['keywords']}\t{s}\n{t}\n{r['description']}",
                    f"{r['src_id']} {r['keywords']} {r['tgt_id']}: {r['description']}"))
    return out


def query_texts(question: str, ll: list[str], hl: list[str]) -> list[str]:
    """What one query embeds: the question (chunk vector search) and the joined keyword lists."""
    return [t for t in (question, ", ".join(ll), ", ".join(hl)) if t]


def mem() -> dict:
    """VmRSS (and its anonymous / file-backed parts) and VmHWM of this process, bytes."""
    with open("/proc/self/status") as f:
        kib = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f) if v.strip().endswith(" kB")}
    return {"rss_bytes": kib.get("VmRSS", 0) * 1024, "rss_anon_bytes": kib.get("RssAnon", 0) * 1024,
            "rss_file_bytes": kib.get("RssFile", 0) * 1024, "hwm_bytes": kib.get("VmHWM", 0) * 1024}


def docs_of(by_section: dict[str, list[str]]) -> list[str]:
    """The documents of a context, all sections together."""
    return sorted(set().union(*by_section.values()))


def _answer(resp: dict) -> None:
    sys.stdout.write(json.dumps(resp, default=str) + "\n")
    sys.stdout.flush()


def serve_lines(ready: dict, ops: dict) -> None:
    """A worker's protocol: writes `ready` (with ``"ready": True`` and :func:`mem`), then answers
    each JSON-line request on stdin, one at a time: ``ops[op](request)``, ``mem``, or ``exit``
    (answered ``{"bye": True}``, then returns)."""
    _answer({"ready": True, **ready, **mem()})
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "exit":
            break
        if op == "mem":
            _answer(mem())
        elif op in ops:
            _answer(ops[op](req))
        else:
            _answer({"error": f"unknown op {op!r}"})
    _answer({"bye": True})


# ------------------------------------------------------------------------------------------
# LightRAG plumbing (worker processes only)
# ------------------------------------------------------------------------------------------

class WordTokenizer:
    """Lossless word tokenizer (each word or punctuation mark with its leading white space is
    one token; ids interned in a process-wide table). Thread-safe; ``deepcopy`` returns itself
    (LightRAG deep-copies its config on every query)."""
    _PIECE = re.compile(r"\s*\w+|\s*[^\w\s]|\s+")

    def __init__(self):
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []
        self._lock = threading.Lock()

    def encode(self, content: str, **_) -> list[int]:
        pieces = self._PIECE.findall(content)
        with self._lock:  # a new piece's id and its entry in _pieces are made together
            for p in pieces:
                if p not in self._ids:
                    self._ids[p] = len(self._pieces)
                    self._pieces.append(p)
            return [self._ids[p] for p in pieces]

    def decode(self, tokens: list[int]) -> str:
        return "".join(self._pieces[i] for i in tokens)

    def __deepcopy__(self, memo):
        return self


class VectorLookup:
    """Vectors by text: ``vectors.npy`` [M, d] float32 (memory-mapped) and ``keys.npy`` [M]
    uint64 sorted (row i of keys is the key of row i of vectors)."""

    def __init__(self, vectors: str, keys: str):
        self.vectors = np.load(vectors, mmap_mode="r")
        self.keys = np.load(keys)
        self.lookups = 0

    def __call__(self, texts: list[str]) -> np.ndarray:
        k = np.fromiter((text_key(t) for t in texts), np.uint64, len(texts))
        pos = np.minimum(np.searchsorted(self.keys, k), len(self.keys) - 1)
        bad = np.flatnonzero(self.keys[pos] != k)
        if bad.size:
            raise KeyError(f"no precomputed vector for {len(bad)} of {len(texts)} texts, e.g. {texts[bad[0]]!r}")
        self.lookups += len(texts)
        return np.ascontiguousarray(self.vectors[pos], dtype=np.float32)


def make_rag(args):
    """``(LightRAG 1.5.7 instance, its vector lookup, an event loop)``, storages initialised: its
    default storages (JSON KV, NanoVectorDB, NetworkX, JSON doc status), the lookup as the
    embedding function, a raising LLM and the word tokenizer."""
    import asyncio
    import logging

    from lightrag import LightRAG
    from lightrag.utils import EmbeddingFunc, Tokenizer, logger

    logger.setLevel(logging.WARNING)  # its INFO lines per query would be written to our stderr
    lookup = VectorLookup(args.vectors, args.keys)

    async def embed(texts, **_):
        return lookup(list(texts))

    async def no_llm(*_, **__):
        raise RuntimeError("no LLM in this benchmark: keywords are given and only the context is asked for")

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    # default_embedding_timeout (30 s) guards a remote embedding API: its health check (2x + 15 s,
    # 75 s) killed a flush of 10k documents' relations at 100k documents, the event loop busy
    # upserting while our lookup waited its turn; a local lookup gets an hour.
    rag = LightRAG(working_dir=args.workdir, embedding_func=EmbeddingFunc(embedding_dim=DIM, func=embed),
                   llm_model_func=no_llm, tokenizer=Tokenizer("words", WordTokenizer()),
                   default_embedding_timeout=EMBEDDING_TIMEOUT_S)
    loop.run_until_complete(rag.initialize_storages())
    return rag, lookup, loop


def _timed(fn, *args):
    """``(fn(*args), seconds it took)`` (our harness's ``timed``; this file cannot import it)."""
    t0 = time.perf_counter()
    value = fn(*args)
    return value, time.perf_counter() - t0


def _version() -> str:
    from importlib.metadata import version
    return version("lightrag-hku")


# ------------------------------------------------------------------------------------------
# Commands
# ------------------------------------------------------------------------------------------

def ingest(args) -> dict:
    """Times ``insert_custom_kg`` per batch (forming the custom_kg from the records included;
    reading the corpus file excluded, as generating the documents is on our side)."""
    importlib.import_module("lightrag")  # before the clock starts (as our side imports first)
    rss_imported = mem()["rss_bytes"]
    (rag, lookup, loop), init_s = _timed(make_rag, args)
    batches, read_s, n = [], 0.0, 0
    with open(args.corpus) as f:
        for lines in iter(lambda: list(itertools.islice(f, args.batch)), []):
            docs, seconds = _timed(lambda: [json.loads(line) for line in lines])
            read_s += seconds
            batches.append(_timed(lambda: loop.run_until_complete(rag.ainsert_custom_kg(custom_kg_of(docs))))[1])
            n += len(docs)
            print(json.dumps({"progress": n}), flush=True)
    finalize_s = _timed(loop.run_until_complete, rag.finalize_storages())[1]
    return {"documents": n, "batch": args.batch, "init_s": init_s, "batches_s": batches,
            "finalize_s": finalize_s, "ingest_s": init_s + sum(batches) + finalize_s, "read_corpus_s": read_s,
            "vectors_looked_up": lookup.lookups, "rss_after_import_bytes": rss_imported, **mem(),
            "lightrag": _version(), "numpy": np.__version__}


def _docs_by_section(raw: dict) -> dict[str, list[str]]:
    """Our section name -> the documents (``file_path``) of that section of LightRAG's context data."""
    data = raw.get("data") or {}
    out = {}
    for theirs, ours in SECTIONS:
        paths = (str(row.get("file_path", "")) for row in data.get(theirs) or [])
        out[ours] = sorted({p for path in paths for p in path.split("<SEP>") if p})
    return out


def serve(args) -> None:
    import asyncio

    from lightrag import QueryParam  # and with it what make_rag imports

    t_imported = time.perf_counter()
    rss_imported = mem()["rss_bytes"]
    rag, _, loop = make_rag(args)
    t_open = time.perf_counter()

    async def one(r):
        return await rag.aquery_llm(r["q"], QueryParam(
            mode=r["mode"], only_need_context=True, hl_keywords=list(r["hl"]), ll_keywords=list(r["ll"]),
            top_k=args.top_k, chunk_top_k=args.top_k, enable_rerank=False))

    def query(req) -> dict:
        raw, seconds = _timed(loop.run_until_complete, one(req))
        by = _docs_by_section(raw)
        ctx = (raw.get("llm_response") or {}).get("content") or ""
        return {"ms": 1e3 * seconds, "docs": docs_of(by), "docs_by": by, "status": raw.get("status"),
                "context_words": len(_WORDS.findall(ctx))}

    def batch(req) -> dict:
        raws, seconds = _timed(loop.run_until_complete, asyncio.gather(*[one(r) for r in req["queries"]]))
        return {"ms": 1e3 * seconds, "n": len(raws), "docs": [docs_of(_docs_by_section(r)) for r in raws]}

    serve_lines({"import_s": t_imported - T_SCRIPT, "open_s": t_open - t_imported,
                 "script_to_ready_s": t_open - T_SCRIPT, "rss_after_import_bytes": rss_imported,
                 "lightrag": _version()}, {"query": query, "batch": batch})
    loop.run_until_complete(rag.finalize_storages())


def main(argv=None) -> int:
    common = argparse.ArgumentParser(add_help=False)
    for flag in ("--workdir", "--vectors", "--keys"):
        common.add_argument(flag, required=True)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ingest", parents=[common])
    a.add_argument("--corpus", required=True)
    a.add_argument("--batch", type=int, default=1000)
    sub.add_parser("serve", parents=[common]).add_argument("--top-k", type=int, default=10)
    args = p.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    if args.cmd == "ingest":
        print(json.dumps({"result": ingest(args)}), flush=True)
    else:
        serve(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
