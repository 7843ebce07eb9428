"""The LightRAG side of ``lightrag_peer.py``: runs in LightRAG's own virtual environment.

Only the standard library and numpy are imported at module level, so the driver (our
``.venv``, which has no LightRAG) can import :func:`custom_kg_of` and :func:`vdb_items` to
know which texts LightRAG will embed and precompute their vectors. LightRAG itself is imported
inside :func:`make_rag`, in the worker processes.

Two commands (``python _lightrag_side.py ingest|serve ...``):

* ``ingest``: reads the corpus (JSON lines: doc_id, segment texts, extraction records), turns
  each batch of documents into one ``custom_kg`` (chunks = segments, entities and relations
  from the records, every item's ``file_path`` = its document id) and calls
  ``insert_custom_kg`` once per batch; prints one JSON line with the times and peak RSS.
* ``serve``: opens the working directory and answers JSON-line requests on stdin (``query``,
  ``batch``, ``mem``, ``exit``), one at a time, with ``aquery_llm`` (what ``aquery`` calls:
  it returns the context string and the structured data the context was built from).

No LLM runs: the LLM function raises if called, the keywords are given in ``QueryParam``
(which skips LightRAG's keyword-extraction call), ``only_need_context=True`` and
``enable_rerank=False``. The embedding function looks vectors up by a 64-bit hash of the
exact text LightRAG passes (``vectors.npy`` + sorted ``keys.npy``; a text with no vector
raises). ``tiktoken`` would download its BPE file, so LightRAG gets :class:`WordTokenizer`
(words and punctuation marks, each with its leading white space; lossless).
"""
from __future__ import annotations

import argparse
import hashlib
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


# ------------------------------------------------------------------------------------------
# What LightRAG gets and embeds (shared with the driver; no LightRAG import)
# ------------------------------------------------------------------------------------------

def text_key(text: str) -> int:
    """64-bit key of a text (blake2b)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def custom_kg_of(docs: list[dict]) -> dict:
    """One ``custom_kg`` for documents ``{"doc_id", "segments": [text], "extractions": [records]}``
    (extraction i holds the records of segment i, in the ``<|#|>`` record format)."""
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
                elif f[0] == "relation" and len(f) == 5:
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
        ids = self._ids
        out = []
        for p in self._PIECE.findall(content):
            i = ids.get(p)
            if i is None:
                with self._lock:
                    i = ids.get(p)
                    if i is None:
                        i = len(self._pieces)
                        self._pieces.append(p)
                        ids[p] = i
            out.append(i)
        return out

    def decode(self, tokens: list[int]) -> str:
        pieces = self._pieces
        return "".join(pieces[i] for i in tokens)

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
        pos = np.searchsorted(self.keys, k)
        pos = np.minimum(pos, len(self.keys) - 1)
        bad = np.flatnonzero(self.keys[pos] != k)
        if bad.size:
            raise KeyError(f"no precomputed vector for {len(bad)} of {len(texts)} texts, e.g. {texts[bad[0]]!r}")
        self.lookups += len(texts)
        return np.ascontiguousarray(self.vectors[pos], dtype=np.float32)


def make_rag(workdir: str, lookup: VectorLookup):
    """A LightRAG 1.5.7 instance with its default storages (JSON KV, NanoVectorDB, NetworkX,
    JSON doc status), our lookup as the embedding function, a raising LLM and the word
    tokenizer."""
    import logging

    from lightrag import LightRAG
    from lightrag.utils import EmbeddingFunc, Tokenizer, logger

    logger.setLevel(logging.WARNING)  # its INFO lines per query would be written to our stderr

    async def embed(texts, **_):
        return lookup(list(texts))

    async def no_llm(*_, **__):
        raise RuntimeError("no LLM in this benchmark: keywords are given and only the context is asked for")

    return LightRAG(working_dir=workdir, embedding_func=EmbeddingFunc(embedding_dim=DIM, func=embed),
                    llm_model_func=no_llm, tokenizer=Tokenizer("words", WordTokenizer()))


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def mem() -> dict:
    """VmRSS (and its anonymous / file-backed parts) and VmHWM of this process, bytes."""
    return {"rss_bytes": _status("VmRSS"), "rss_anon_bytes": _status("RssAnon"),
            "rss_file_bytes": _status("RssFile"), "hwm_bytes": _status("VmHWM")}


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("lightrag-hku")
    except Exception:  # noqa: BLE001 - informational
        return "?"


# ------------------------------------------------------------------------------------------
# Commands
# ------------------------------------------------------------------------------------------

def _batches(path: str, size: int):
    with open(path) as f:
        batch = []
        for line in f:
            batch.append(line)
            if len(batch) == size:
                yield batch
                batch = []
        if batch:
            yield batch


def ingest(args) -> dict:
    """Times ``insert_custom_kg`` per batch (forming the custom_kg from the records included;
    reading the corpus file excluded, as generating the documents is on our side)."""
    import asyncio

    from lightrag import LightRAG  # noqa: F401 - imported before the clock starts (as our side imports first)

    lookup = VectorLookup(args.vectors, args.keys)
    rss_imported = mem()["rss_bytes"]
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    t0 = time.perf_counter()
    rag = make_rag(args.workdir, lookup)
    loop.run_until_complete(rag.initialize_storages())
    init_s = time.perf_counter() - t0
    batches, read_s, n = [], 0.0, 0
    for lines in _batches(args.corpus, args.batch):
        t = time.perf_counter()
        docs = [json.loads(line) for line in lines]
        read_s += time.perf_counter() - t
        t = time.perf_counter()
        loop.run_until_complete(rag.ainsert_custom_kg(custom_kg_of(docs)))
        batches.append(time.perf_counter() - t)
        n += len(docs)
        print(json.dumps({"progress": n}), flush=True)
    t = time.perf_counter()
    loop.run_until_complete(rag.finalize_storages())
    finalize_s = time.perf_counter() - t
    return {"documents": n, "batch": args.batch, "init_s": init_s, "batches_s": batches,
            "finalize_s": finalize_s, "ingest_s": init_s + sum(batches) + finalize_s, "read_corpus_s": read_s,
            "vectors_looked_up": lookup.lookups, "rss_after_import_bytes": rss_imported, **mem(),
            "lightrag": _version(), "numpy": np.__version__}


def serve(args) -> None:
    import asyncio

    from lightrag import QueryParam

    from lightrag import LightRAG  # noqa: F401 - what make_rag imports

    t_imported = time.perf_counter()
    rss_imported = mem()["rss_bytes"]
    lookup = VectorLookup(args.vectors, args.keys)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    rag = make_rag(args.workdir, lookup)
    loop.run_until_complete(rag.initialize_storages())
    t_open = time.perf_counter()

    def param(mode, ll, hl):
        return QueryParam(mode=mode, only_need_context=True, hl_keywords=list(hl), ll_keywords=list(ll),
                          top_k=args.top_k, chunk_top_k=args.top_k, enable_rerank=False)

    def docs_by_section(raw: dict) -> dict[str, list[str]]:
        data = raw.get("data") or {}
        out = {}
        for section, name in (("entities", "entities"), ("relationships", "relations"), ("chunks", "chunks")):
            docs = set()
            for row in data.get(section) or []:
                docs.update(p for p in str(row.get("file_path", "")).split("<SEP>") if p)
            out[name] = sorted(docs)
        return out

    def docs_of(raw: dict) -> list[str]:
        return sorted(set().union(*docs_by_section(raw).values()))

    def counts_of(raw: dict) -> dict:
        data = raw.get("data") or {}
        return {s: len(data.get(s) or []) for s in ("entities", "relationships", "chunks")}

    async def one(r):
        return await rag.aquery_llm(r["q"], param(r["mode"], r["ll"], r["hl"]))

    out = sys.stdout
    out.write(json.dumps({"ready": True, "import_s": t_imported - T_SCRIPT, "open_s": t_open - t_imported,
                          "script_to_ready_s": t_open - T_SCRIPT, "rss_after_import_bytes": rss_imported,
                          "lightrag": _version(), **mem()}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "query":
            t = time.perf_counter()
            raw = loop.run_until_complete(one(req))
            ms = 1e3 * (time.perf_counter() - t)
            ctx = (raw.get("llm_response") or {}).get("content") or ""
            resp = {"ms": ms, "docs": docs_of(raw), "docs_by": docs_by_section(raw), "counts": counts_of(raw),
                    "status": raw.get("status"),
                    "context_words": len(_WORDS.findall(ctx))}
        elif op == "batch":
            reqs = req["queries"]
            t = time.perf_counter()
            raws = loop.run_until_complete(asyncio.gather(*[one(r) for r in reqs]))
            ms = 1e3 * (time.perf_counter() - t)
            resp = {"ms": ms, "n": len(reqs), "docs": [docs_of(r) for r in raws]}
        elif op == "mem":
            resp = mem()
        elif op == "exit":
            loop.run_until_complete(rag.finalize_storages())
            out.write(json.dumps({"bye": True}) + "\n")
            out.flush()
            return
        else:
            resp = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(resp) + "\n")
        out.flush()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("ingest")
    a.add_argument("--workdir", required=True)
    a.add_argument("--corpus", required=True)
    a.add_argument("--vectors", required=True)
    a.add_argument("--keys", required=True)
    a.add_argument("--batch", type=int, default=1000)
    s = sub.add_parser("serve")
    s.add_argument("--workdir", required=True)
    s.add_argument("--vectors", required=True)
    s.add_argument("--keys", required=True)
    s.add_argument("--top-k", type=int, default=10)
    args = p.parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    if args.cmd == "ingest":
        print(json.dumps({"result": ingest(args)}), flush=True)
    else:
        serve(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
