"""LightRAG side by side: our pipeline and LightRAG 1.5.7 on one corpus, one set of vectors.

Usage (from the repository root)::

    .venv/bin/python benchmarks/lightrag_peer.py                     # 1k and 10k documents
    .venv/bin/python benchmarks/lightrag_peer.py --docs 1000 10000 100000
    .venv/bin/python benchmarks/lightrag_peer.py --quick             # 200 documents, 20 queries

LightRAG runs in its own virtual environment, made on first use under
``benchmarks/.cache/lightrag_peer/venv`` (git-ignored): ``python3 -m venv`` then
``pip install lightrag-hku==1.5.7 numpy==2.4.6`` (no torch). Everything built (corpus, vectors,
both indexes, logs) lies under ``benchmarks/.cache/lightrag_peer/``.

Corpus: ``pipeline_report.py``'s generator with images stripped (``n_images=0``): per document
5 segments of 40-80 words, 10 entities (2 from a pool shared by about 20 documents each) and
10 relations as LightRAG records. Questions: its seeded "What is the relation between A and B?"
for a relation of a random document, that document being the question's *source document*.

Vectors: ``Encoders.offline(text_dim=128)``. Our index stores its token vectors in ``--dtype``
(default float16, what ``colgraph index build`` makes; float32 before). Our index embeds as it always does (token vectors
for segments, single vectors for entities and relations). LightRAG gets the *same single
vectors*: its chunks, entities and relations are given the vectors our text encoder gives the
same items (an entity: ``encoders.text("name: description")``, the text our index embeds for
it; a chunk: ``encoders.text(segment)``), and a question the vector our pipeline uses for it.
LightRAG's ``embedding_func`` looks them up by the exact text it passes (a text it forms
otherwise fails the run). No LLM on either side (LightRAG: keywords given, its LLM a stub that
raises, ``only_need_context=True``, ``enable_rerank=False``, ``top_k=chunk_top_k=10``).

Protocol: the driver generates corpus and vectors, then builds each index in a process of its
own (peak RSS = that process's VmHWM; disk = the folder's bytes), then starts one long-lived
worker per index (ours in ``.venv``, LightRAG in its venv) speaking JSON lines on stdin/stdout
and calls them alternately, one call at a time, with the same questions (the order of the
sides rotates from question to question); then batches of 64 (ours ``retrieve_batch``;
LightRAG ``asyncio.gather`` of 64 ``aquery_llm``), again alternately. Latency is measured in
the worker around the call (ours minus ``timings["encode"]``, the query encoding, as
``pipeline_report.py`` does; LightRAG's query vectors are a lookup). Open time: from starting
the process to its "ready" line, minus the time the same interpreter takes to start and exit
(``python -c pass``); it includes importing the library. Source-document hit: the source
document is among the documents of the returned context (ours: the ``document`` of every
context entity, relation and source row; LightRAG: the ``file_path`` of every entity,
relationship and chunk of the structured data its context string is built from, each item's
``file_path`` being its document id).

Sizes: ``--docs 1000 10000`` takes about 20 minutes on 2 shared cores, 8 of them building the
prefilter of the 10k copy (k-means; ``--no-prefilter`` leaves those rows out). ``--docs 100000``
is possible but long: our side is checked against memory first (peak RSS growth per document of
the largest size measured in the run, or of a 1,000-document probe; "did not fit" is reported
instead of running), LightRAG's ingest rewrites its JSON stores on every ``insert_custom_kg``
call (its last call at 10k took about 17 s, growing with the stores: use ``--lightrag-batch
10000``), and an ingest that passes ``--max-ingest-minutes`` (30) is stopped and reported as too
slow.

Writes ``results/lightrag_peer.md``, ``.json`` and ``.png``; ``--quick`` writes
``lightrag_peer_quick.*`` under ``benchmarks/.cache/lightrag_peer/results`` (not committed).
``--from-json results/lightrag_peer.json`` writes the .md and .png again without measuring.
"""
from __future__ import annotations

import time

T_SCRIPT = time.perf_counter()  # the worker roles measure their open time from here

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import random  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

CACHE = HERE / ".cache" / "lightrag_peer"
LIGHTRAG_PINS = ("lightrag-hku==1.5.7", "numpy==2.4.6")
SIDE = HERE / "_lightrag_side.py"
CORPUS_VERSION = 1
TEXT_DIM = 128
PROBE_DOCS = 1000  # a size measured first when no smaller one was (memory estimate for large sizes)

# LightRAG rows: (name, mode, keywords). "question": the whole question as both keyword lists
# (no LLM to extract them); "names": what its keyword LLM would be expected to give, the two
# entity names as low-level keywords and "relation" as the high-level one.
LIGHTRAG_ROWS = (("lightrag-local", "local", "question"), ("lightrag-hybrid", "hybrid", "question"),
                 ("lightrag-mix", "mix", "question"), ("lightrag-hybrid-names", "hybrid", "names"))
# Our rows: (name, index: "plain" or "prefilter" (a copy carrying enable_prefilter()), config changes).
# "ours-default-pf" (PipelineConfig() over the prefilter-carrying copy) joins only when the
# default recall ranker is not the exact "maxsim" (it would repeat "ours" otherwise).
OUR_ROWS = (("ours", "plain", {}), ("ours-prefilter", "prefilter", {"recall_ranker": "prefilter"}),
            ("ours-default-pf", "prefilter", {}))
REFERENCE = "lightrag-local"   # the row the speed ratios and targets are taken against
HIT_REFERENCE = "lightrag-hybrid"


# ------------------------------------------------------------------------------------------
# Small helpers (every role)
# ------------------------------------------------------------------------------------------

def mem() -> dict:
    """This process's RSS figures (``_lightrag_side.mem``: both sides measure alike)."""
    import _lightrag_side as side
    return side.mem()


def available_memory() -> int:
    return _pr().available_memory()


def folder_bytes(path: pathlib.Path) -> dict:
    """Apparent bytes (file sizes) and allocated bytes (blocks) of every file under `path`."""
    size = blocks = files = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            st = os.lstat(os.path.join(dirpath, n))
            size += st.st_size
            blocks += st.st_blocks * 512
            files += 1
    return {"bytes": size, "allocated_bytes": blocks, "files": files}


# ------------------------------------------------------------------------------------------
# Corpus, questions, vectors
# ------------------------------------------------------------------------------------------

def _pr():
    import pipeline_report
    return pipeline_report


def documents(n_docs: int, seed: int, lo: int = 0, hi: int | None = None):
    """Documents lo..hi of the corpus of `n_docs` (pipeline_report's generator, no images)."""
    pr = _pr()
    shared = pr.shared_names(n_docs, seed)
    for i in range(lo, n_docs if hi is None else min(hi, n_docs)):
        yield pr.make_document(i, shared, seed, n_images=0, pixels=False)


def as_row(doc) -> dict:
    return {"doc_id": doc.doc_id, "segments": [s.text for s in doc.segments], "extractions": list(doc.extractions)}


def questions(n: int, n_docs: int, seed: int) -> list[dict]:
    """``pipeline_report.make_questions(n, n_docs, seed, n_images=0)`` with each question's
    source document and the two entity names it asks about (same random draws)."""
    pr = _pr()
    rng = random.Random(f"questions-{seed}")
    shared = pr.shared_names(n_docs, seed)
    out = []
    for _ in range(n):
        doc = pr.make_document(rng.randrange(n_docs), shared, seed, n_images=0, pixels=False, stream="doc")
        recs = [line.split("<|#|>") for text in doc.extractions for line in text.splitlines()]
        rel = rng.choice([r for r in recs if r[0] == "relation"])
        out.append({"q": f"What is the relation between {rel[1]} and {rel[2]}?", "source": doc.doc_id,
                    "a": rel[1], "b": rel[2]})
    return out


def keywords(q: dict, kind: str) -> tuple[list[str], list[str]]:
    """``(ll_keywords, hl_keywords)`` of a LightRAG row."""
    if kind == "question":
        return [q["q"]], [q["q"]]
    return [q["a"], q["b"]], ["relation"]


def prepare(n_docs: int, n_questions: int, seed: int, folder: pathlib.Path, encoders, progress: bool) -> dict:
    """Writes the corpus (JSON lines), LightRAG's vectors (``lr_vectors.npy`` + ``lr_keys.npy``)
    and the questions; returns what it did and how long it took."""
    import numpy as np
    from tqdm import tqdm

    import _lightrag_side as side

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    qs = questions(n_questions, n_docs, seed)
    check = _pr().make_questions(min(n_questions, 50), n_docs, seed, n_images=0)
    if [q["q"] for q in qs[:len(check)]] != check:
        raise AssertionError("questions() drifted from pipeline_report.make_questions")
    texts: dict[int, str] = {}   # key of the text LightRAG embeds -> the text our encoder embeds
    mismatch = []
    first = True
    with open(folder / "corpus.jsonl", "w") as f:
        for doc in tqdm(documents(n_docs, seed), total=n_docs, desc=f"corpus {n_docs:,}", unit="doc",
                        disable=not progress, leave=False):
            row = as_row(doc)
            f.write(json.dumps(row) + "\n")
            items = side.vdb_items(side.custom_kg_of([row]))
            if first:  # our texts for these items are exactly those our index embeds
                mismatch = _check_our_texts(doc, [o for _, o in items])
                first = False
            for lr, ours in items:
                texts[side.text_key(lr)] = ours
    for q in qs:
        for kind in {k for _, _, k in LIGHTRAG_ROWS}:
            ll, hl = keywords(q, kind)
            for t in side.query_texts(q["q"], ll, hl):
                texts[side.text_key(t)] = t
    keys = np.fromiter(sorted(texts), np.uint64, len(texts))
    vec = np.lib.format.open_memmap(folder / "lr_vectors.npy", mode="w+", dtype=np.float32,
                                    shape=(len(keys), TEXT_DIM))
    step = 20000
    for lo in tqdm(range(0, len(keys), step), desc="LightRAG's vectors", disable=not progress, leave=False):
        chunk = [texts[int(k)] for k in keys[lo:lo + step]]
        vec[lo:lo + len(chunk)] = encoders.text(chunk).float().numpy()
    vec.flush()
    del vec
    np.save(folder / "lr_keys.npy", keys)
    (folder / "questions.json").write_text(json.dumps(qs))
    return {"documents": n_docs, "questions": len(qs), "vectors": int(len(keys)), "seconds": time.perf_counter() - t0,
            "our_text_mismatches": mismatch}


def _check_our_texts(doc, ours: list[str]) -> list[str]:
    from colgraph_engine.kg import build_document_graph
    from colgraph_engine.kg.vectors import item_texts

    g = build_document_graph(doc)
    have = set()
    for store in ("segment", "entity", "relation"):
        have |= set(item_texts(g, store)[1])
    missing = [t for t in ours if t not in have]
    if missing:
        raise AssertionError(f"{len(missing)} of LightRAG's items have no equal text in our index, e.g. {missing[0]!r}")
    return missing


# ------------------------------------------------------------------------------------------
# Our side: ingest, prefilter, serve (run as `lightrag_peer.py _ours-... ARGS` in .venv)
# ------------------------------------------------------------------------------------------

def _torch_threads(n: int) -> None:
    import torch
    torch.set_num_threads(n)


def ours_ingest(argv) -> dict:
    """Builds our directory index of `--docs` documents, `--chunk` per ``add_documents`` call
    (each a commit). Timed: graphs (``build_document_graph``: record parsing, merges) and the
    commits; the offline encoders' time is reported apart (LightRAG's vectors are precomputed)."""
    p = argparse.ArgumentParser()
    p.add_argument("--docs", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--chunk", type=int, default=1000)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    a = p.parse_args(argv)
    import torch

    from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document
    _torch_threads(a.torch_threads)
    enc = Encoders.offline(text_dim=TEXT_DIM)
    rss_imported = mem()["rss_bytes"]
    t = time.perf_counter()
    index = KnowledgeIndex.create(a.out, enc, overwrite=True, dtype=getattr(torch, a.dtype))
    create_s = time.perf_counter() - t
    graph_s = embed_s = commit_s = gen_s = 0.0
    for lo in range(0, a.docs, a.chunk):
        t = time.perf_counter()
        docs = list(documents(a.docs, a.seed, lo, lo + a.chunk))
        gen_s += time.perf_counter() - t
        t = time.perf_counter()
        graphs = [build_document_graph(d) for d in docs]
        graph_s += time.perf_counter() - t
        t = time.perf_counter()
        vecs = [encode_document(g, enc) for g in graphs]
        embed_s += time.perf_counter() - t
        t = time.perf_counter()
        index.add_documents(graphs, vecs)
        commit_s += time.perf_counter() - t
        del docs, graphs, vecs
        print(json.dumps({"progress": min(a.docs, lo + a.chunk)}), flush=True)
    return {"documents": len(index), "chunk": a.chunk, "create_s": create_s, "graph_s": graph_s, "commit_s": commit_s,
            "ingest_s": create_s + graph_s + commit_s, "embed_s": embed_s, "generate_s": gen_s,
            "counts": dict(index.counts), "rss_after_import_bytes": rss_imported, **mem()}


def ours_prefilter(argv) -> dict:
    """Copies our index to `--out` and makes it carry a prefilter (``enable_prefilter()`` with
    its defaults: the segment store, 2 bits), committed in the directory."""
    p = argparse.ArgumentParser()
    p.add_argument("--src", type=pathlib.Path, required=True)
    p.add_argument("--out", type=pathlib.Path, required=True)
    p.add_argument("--torch-threads", type=int, default=1)
    a = p.parse_args(argv)
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    _torch_threads(a.torch_threads)
    if a.out.exists():
        shutil.rmtree(a.out)
    shutil.copytree(a.src, a.out)
    rss_imported = mem()["rss_bytes"]
    t = time.perf_counter()
    index = KnowledgeIndex.open(a.out, Encoders.offline(text_dim=TEXT_DIM), verify=False)
    open_s = time.perf_counter() - t
    t = time.perf_counter()
    events = index.enable_prefilter()
    return {"open_s": open_s, "prefilter_s": time.perf_counter() - t, "events": events,
            "info": index.prefilter_info(), "rss_after_import_bytes": rss_imported, **mem()}


def ours_serve(argv) -> None:
    """JSON-line worker over our index (ops: query, batch, mem, exit)."""
    p = argparse.ArgumentParser()
    p.add_argument("--index", type=pathlib.Path, required=True)
    p.add_argument("--config", default="{}", help="PipelineConfig changes, JSON")
    p.add_argument("--torch-threads", type=int, default=1)
    a = p.parse_args(argv)
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.pipeline import Pipeline, PipelineConfig, count_tokens
    _torch_threads(a.torch_threads)
    t_imported = time.perf_counter()
    rss_imported = mem()["rss_bytes"]
    enc = Encoders.offline(text_dim=TEXT_DIM)
    config = PipelineConfig().replace(**json.loads(a.config))
    index = KnowledgeIndex.open(a.index, enc, verify=False)  # as the service opens it
    pipe = Pipeline(index, enc, config)
    pipe.view()  # assemble the merged graph and the query view now, not in the first query
    t_open = time.perf_counter()

    def docs_by(r) -> dict[str, list[str]]:
        c = r.context
        return {name: sorted({row["document"] for row in rows if row.get("document")})
                for name, rows in (("entities", c.entities), ("relations", c.relations), ("chunks", c.sources))}

    def docs_of(r) -> list[str]:
        return sorted(set().union(*docs_by(r).values()))

    out = sys.stdout
    out.write(json.dumps({"ready": True, "import_s": t_imported - T_SCRIPT, "open_s": t_open - t_imported,
                          "script_to_ready_s": t_open - T_SCRIPT, "rss_after_import_bytes": rss_imported,
                          "config": config.as_dict(),
                          "prefilter": index.prefilter_info() is not None, **mem()}) + "\n")
    out.flush()
    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        if op == "query":
            t = time.perf_counter()
            r = pipe.retrieve(req["q"])
            ms = 1e3 * (time.perf_counter() - t - r.timings["encode"])
            resp = {"ms": ms, "encode_ms": 1e3 * r.timings["encode"], "docs": docs_of(r), "docs_by": docs_by(r),
                    "recall_docs": [d for d, _ in r.documents], "paths": r.counts["recall"]["paths"],
                    "context_words": count_tokens(r.context.render()),
                    "stages_ms": {k: 1e3 * v for k, v in r.timings.items()}}
        elif op == "batch":
            t = time.perf_counter()
            rs = pipe.retrieve_batch(req["queries"])
            ms = 1e3 * (time.perf_counter() - t - rs[0].timings["encode"])
            resp = {"ms": ms, "n": len(rs), "docs": [docs_of(r) for r in rs]}
        elif op == "mem":
            resp = mem()
        elif op == "exit":
            out.write(json.dumps({"bye": True}) + "\n")
            out.flush()
            return
        else:
            resp = {"error": f"unknown op {op!r}"}
        out.write(json.dumps(resp, default=str) + "\n")
        out.flush()


ROLES = {"_ours-ingest": ours_ingest, "_ours-prefilter": ours_prefilter}


# ------------------------------------------------------------------------------------------
# Driver: processes
# ------------------------------------------------------------------------------------------

class WorkerError(RuntimeError):
    pass


def _tail(path: pathlib.Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


class Worker:
    """A long-lived side process speaking JSON lines (one request, one answer)."""

    def __init__(self, name: str, argv: list[str], cwd: pathlib.Path, log: pathlib.Path, env: dict | None = None):
        self.name, self.log = name, log
        t0 = time.perf_counter()
        self._err = open(log, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     cwd=cwd, env=env, bufsize=1)
        self.ready = self._read()
        self.start_to_ready_s = time.perf_counter() - t0

    def _read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                rc = self.proc.wait()
                raise WorkerError(f"{self.name} exited (status {rc}); its log {self.log} ends:\n{_tail(self.log)}")
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                self._err.write(f"[stdout, not JSON] {line}")

    def call(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.call({"op": "exit"})
                self.proc.wait(60)
            except (WorkerError, OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._err.close()


def run_job(name: str, argv: list[str], cwd: pathlib.Path, log: pathlib.Path, total: int | None, progress: bool,
            env: dict | None = None, timeout_s: float | None = None) -> dict:
    """Runs a one-shot process that prints progress lines and a final ``{"result": ...}`` line;
    returns the result, or raises WorkerError with its log's end (killed after `timeout_s`)."""
    import threading

    from tqdm import tqdm

    bar = tqdm(total=total, desc=name, unit="doc", disable=not progress or total is None, leave=False)
    result = None
    timed_out = threading.Event()
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=cwd, env=env, bufsize=1)

        def kill():
            timed_out.set()
            proc.kill()
        timer = threading.Timer(timeout_s, kill) if timeout_s else None
        if timer:
            timer.daemon = True
            timer.start()
        for line in proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "progress" in msg:
                bar.n = msg["progress"]
                bar.refresh()
            elif "result" in msg:
                result = msg["result"]
        rc = proc.wait()
        if timer:
            timer.cancel()
    bar.close()
    if timed_out.is_set():
        raise WorkerError(f"{name}: too slow, stopped after {timeout_s / 60:.0f} min (at {bar.n:,} of {total} documents)")
    if rc != 0 or result is None:
        why = "killed (SIGKILL: out of memory?)" if rc == -9 else f"exit status {rc}"
        raise WorkerError(f"{name}: {why}; its log {log} ends:\n{_tail(log)}")
    return result


def _role_main(role: str, argv: list[str]) -> int:
    if role == "_ours-serve":
        ours_serve(argv)
    else:
        print(json.dumps({"result": ROLES[role](argv)}, default=str), flush=True)
    return 0


def ensure_lightrag_venv(venv: pathlib.Path, progress: bool = True) -> pathlib.Path:
    """LightRAG's virtual environment (made on first use); returns its python."""
    py = venv / "bin" / "python"
    ok = py.exists() and subprocess.run([str(py), "-c", "import lightrag, numpy"], capture_output=True).returncode == 0
    if not ok:
        if progress:
            print(f"making LightRAG's virtual environment in {venv} ({', '.join(LIGHTRAG_PINS)}) ...", flush=True)
        venv.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3", "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *LIGHTRAG_PINS], check=True)
    return py


def interpreter_start_s(py: str, repeat: int = 5) -> float:
    """Median seconds for `py` to start and exit (``-c pass``): subtracted from open times."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        subprocess.run([py, "-c", "pass"], check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def package_versions(py: str, names: list[str]) -> dict:
    code = ("import json, importlib.metadata as m\nout = {}\nfor n in %r:\n    try: out[n] = m.version(n)\n"
            "    except Exception: out[n] = None\nprint(json.dumps(out))") % (names,)
    try:
        return json.loads(subprocess.run([py, "-c", code], capture_output=True, text=True, check=True).stdout)
    except (subprocess.SubprocessError, json.JSONDecodeError):
        return {}


# ------------------------------------------------------------------------------------------
# Driver: measuring
# ------------------------------------------------------------------------------------------

def _pct(xs: list[float], p: float) -> float:
    import numpy as np
    return float(np.percentile(np.asarray(xs), p))


def fits_ours(n_docs: int, measured: list[dict], budget: int) -> tuple[bool, str]:
    """Whether our ingest of `n_docs` should fit in `budget` bytes: peak RSS growth per document
    of the largest size measured so far (this run), times `n_docs`, times 1.25."""
    if not measured:
        return True, "no smaller size measured: tried"
    m = max(measured, key=lambda r: r["documents"])
    per_doc = max(m["hwm_bytes"] - m["rss_after_import_bytes"], 1) / m["documents"]
    need = per_doc * n_docs * 1.25
    note = (f"estimated ingest peak {need / 2**30:.1f} GiB ({per_doc / 1024:.0f} KiB per document at "
            f"{m['documents']:,} documents, x1.25) vs {budget / 2**30:.1f} GiB usable")
    return need <= budget, note


class Side:
    """A row of the comparison: a worker and how to ask it (`extra` joins each query request)."""

    def __init__(self, name: str, worker: Worker, kind: str, mode: str | None = None, keywords: str | None = None):
        self.name, self.worker, self.kind, self.mode, self.keywords = name, worker, kind, mode, keywords
        self.lat: list[float] = []
        self.hits: list[bool] = []
        self.recall_hits: list[bool] = []
        self.section_hits: dict[str, list[bool]] = {}
        self.ndocs: list[int] = []
        self.words: list[int] = []
        self.paths: dict[str, int] = {}
        self.batch_ms: list[float] = []
        self.batch_n = 0

    def request(self, q: dict) -> dict:
        if self.kind == "ours":
            return {"op": "query", "q": q["q"]}
        ll, hl = keywords(q, self.keywords)
        return {"op": "query", "q": q["q"], "mode": self.mode, "ll": ll, "hl": hl}

    def batch_request(self, qs: list[dict]) -> dict:
        if self.kind == "ours":
            return {"op": "batch", "queries": [q["q"] for q in qs]}
        return {"op": "batch", "queries": [self.request(q) for q in qs]}

    def record(self, q: dict, r: dict) -> None:
        self.lat.append(r["ms"])
        self.hits.append(q["source"] in r["docs"])
        self.ndocs.append(len(r["docs"]))
        self.words.append(r.get("context_words", 0))
        for section, docs in (r.get("docs_by") or {}).items():
            self.section_hits.setdefault(section, []).append(q["source"] in docs)
        if "recall_docs" in r:
            self.recall_hits.append(q["source"] in r["recall_docs"])
            for store, how in (r.get("paths") or {}).items():
                key = f"{store}: {how}"
                self.paths[key] = self.paths.get(key, 0) + 1

    def summary(self) -> dict:
        out = {"queries": len(self.lat), "p50_ms": _pct(self.lat, 50), "p99_ms": _pct(self.lat, 99),
               "mean_ms": statistics.fmean(self.lat), "hit_rate": statistics.fmean(self.hits),
               "context_documents_mean": statistics.fmean(self.ndocs), "context_words_mean": statistics.fmean(self.words)}
        out["hit_rate_by_section"] = {k: statistics.fmean(v) for k, v in self.section_hits.items()}
        if self.recall_hits:
            out["recall_hit_rate"] = statistics.fmean(self.recall_hits)
            out["recall_paths"] = self.paths
        if self.batch_ms:
            out["batch_size"] = self.batch_n
            out["batches"] = len(self.batch_ms)
            out["batch_p50_ms"] = _pct(self.batch_ms, 50)
            out["batch_qps"] = self.batch_n * len(self.batch_ms) / (sum(self.batch_ms) / 1e3)
        return out


def run_size(n: int, args, encoders, lr_py: pathlib.Path, base: dict, measured_ours: list[dict]) -> dict:
    from tqdm import tqdm

    progress = not args.no_progress
    folder = CACHE / (f"quick-n{n}" if args.quick else f"n{n}-seed{args.seed}-v{CORPUS_VERSION}")
    logs = folder / "logs"
    if folder.exists():
        shutil.rmtree(folder)
    logs.mkdir(parents=True)
    out: dict = {"documents": n, "folder": str(folder)}
    n_q = max(args.queries + args.warmup, args.batch_size * args.batches)
    tqdm.write(f"== {n:,} documents: corpus and LightRAG's vectors")
    out["prepare"] = prepare(n, n_q, args.seed, folder, encoders, progress)
    qs = json.loads((folder / "questions.json").read_text())
    py = sys.executable
    me = str(pathlib.Path(__file__).resolve())
    env = dict(os.environ)
    env.setdefault("COLGRAPH_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    tt = ["--torch-threads", str(args.torch_threads)]

    # -- ingest, one side after the other ---------------------------------------------------
    ours: dict = {}
    if not measured_ours and n > PROBE_DOCS * 5:  # nothing smaller measured in this run: measure a probe
        probe = run_job(f"ours ingest probe {PROBE_DOCS:,}", [py, me, "_ours-ingest", "--docs", str(PROBE_DOCS), "--seed",
                                                               str(args.seed), "--out", str(folder / "probe"), *tt],
                        ROOT, logs / "ours_probe.log", PROBE_DOCS, progress, env)
        measured_ours.append({"documents": PROBE_DOCS, **probe})
        shutil.rmtree(folder / "probe")
    ok, note = fits_ours(n, measured_ours, int(available_memory() * args.memory_fraction))
    ours["fit_check"] = note
    if not ok:
        ours["status"] = f"did not fit: {note}"
    else:
        try:
            tqdm.write(f"== {n:,} documents: our ingest")
            ours["ingest"] = run_job(f"ours ingest {n:,}", [py, me, "_ours-ingest", "--docs", str(n), "--seed",
                                                               str(args.seed), "--out", str(folder / "ours"), "--chunk",
                                                               str(args.chunk), "--dtype", args.dtype, *tt],
                                     ROOT, logs / "ours_ingest.log", n, progress, env,
                                     timeout_s=60 * args.max_ingest_minutes if args.max_ingest_minutes else None)
            ours["disk"] = folder_bytes(folder / "ours")
            measured_ours.append({"documents": n, **ours["ingest"]})
            ours["status"] = "ok"
        except WorkerError as exc:
            ours["status"] = ("did not fit: " if "SIGKILL" in str(exc) else "failed at ingest: ") + str(exc)
    if ours.get("status") == "ok" and not args.no_prefilter:
        try:
            tqdm.write(f"== {n:,} documents: our prefilter (copy + enable_prefilter)")
            ours["prefilter"] = run_job(f"ours prefilter {n:,}", [py, me, "_ours-prefilter", "--src", str(folder / "ours"),
                                                                   "--out", str(folder / "ours_prefilter"), *tt],
                                        ROOT, logs / "ours_prefilter.log", None, progress, env,
                                        timeout_s=60 * args.max_ingest_minutes if args.max_ingest_minutes else None)
            ours["prefilter_disk"] = folder_bytes(folder / "ours_prefilter")
        except WorkerError as exc:
            ours["prefilter_status"] = f"failed: {exc}"
    out["ours"] = ours
    lr: dict = {}
    try:
        tqdm.write(f"== {n:,} documents: LightRAG ingest (insert_custom_kg per {args.lightrag_batch:,} documents)")
        lr["ingest"] = run_job(f"LightRAG ingest {n:,}", [str(lr_py), str(SIDE), "ingest", "--workdir",
                                                           str(folder / "lightrag"), "--corpus",
                                                           str(folder / "corpus.jsonl"), "--vectors",
                                                           str(folder / "lr_vectors.npy"), "--keys",
                                                           str(folder / "lr_keys.npy"), "--batch",
                                                           str(args.lightrag_batch)],
                               folder, logs / "lightrag_ingest.log", n, progress,
                               timeout_s=60 * args.max_ingest_minutes if args.max_ingest_minutes else None)
        lr["disk"] = folder_bytes(folder / "lightrag")
        lr["status"] = "ok"
    except WorkerError as exc:
        lr["status"] = f"failed at ingest: {exc}"
    out["lightrag"] = lr

    # -- serve: one worker per index, called alternately ---------------------------------
    workers: dict[str, Worker] = {}
    sides: list[Side] = []
    try:
        if ours.get("status") == "ok":
            for name, which, changes in our_rows():
                if which == "prefilter" and "prefilter" not in ours:
                    continue
                index = folder / ("ours" if which == "plain" else "ours_prefilter")
                workers[name] = Worker(name, [py, me, "_ours-serve", "--index", str(index), "--config",
                                              json.dumps(changes), *tt], ROOT, logs / f"{name}_serve.log", env)
                sides.append(Side(name, workers[name], "ours"))
        if lr.get("status") == "ok":
            workers["lightrag"] = Worker("lightrag", [str(lr_py), str(SIDE), "serve", "--workdir",
                                                      str(folder / "lightrag"), "--vectors",
                                                      str(folder / "lr_vectors.npy"), "--keys",
                                                      str(folder / "lr_keys.npy"), "--top-k", "10"],
                                         folder, logs / "lightrag_serve.log")
            sides += [Side(name, workers["lightrag"], "lightrag", mode, kw) for name, mode, kw in LIGHTRAG_ROWS]
        serving = {}
        for name, w in workers.items():
            base_s = base["ours_interpreter_s"] if name.startswith("ours") else base["lightrag_interpreter_s"]
            serving[name] = {"start_to_ready_s": w.start_to_ready_s, "open_s": w.start_to_ready_s - base_s,
                             "ready": w.ready, "after_open": w.call({"op": "mem"})}
        warm, timed = qs[:args.warmup], qs[args.warmup:args.warmup + args.queries]
        for i, q in enumerate(warm):
            for s in sides:
                s.worker.call(s.request(q))
        for i, q in enumerate(tqdm(timed, desc=f"single queries, {len(sides)} rows alternately", disable=not progress,
                                   leave=False)):
            k = i % max(len(sides), 1)
            for s in sides[k:] + sides[:k]:
                r = s.worker.call(s.request(q))
                if "error" in r:
                    raise WorkerError(f"{s.name}: {r['error']}")
                s.record(q, r)
        batches = [qs[b * args.batch_size:(b + 1) * args.batch_size] for b in range(args.batches)]
        for s in sides:  # a warm-up batch each (allocators, caches)
            s.worker.call(s.batch_request(batches[0][:16]))
        for b, batch in enumerate(tqdm(batches, desc=f"batches of {args.batch_size}", disable=not progress,
                                       leave=False)):
            k = b % max(len(sides), 1)
            for s in sides[k:] + sides[:k]:
                r = s.worker.call(s.batch_request(batch))
                s.batch_ms.append(r["ms"])
                s.batch_n = len(batch)
        for name, w in workers.items():
            serving[name]["after_queries"] = w.call({"op": "mem"})
        out["serving"] = serving
        out["rows"] = {s.name: s.summary() for s in sides}
    except WorkerError as exc:
        out["serve_error"] = str(exc)
        tqdm.write(f"serving failed: {exc}")
    finally:
        for w in workers.values():
            w.close()
    out["ratios"] = ratios(out)
    if not args.keep:
        for sub in ("ours", "ours_prefilter", "lightrag", "lr_vectors.npy", "corpus.jsonl"):
            p = folder / sub
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    return out


def our_rows() -> list[tuple[str, str, dict]]:
    from colgraph_engine.pipeline import PipelineConfig
    default = PipelineConfig().recall_ranker
    return [r for r in OUR_ROWS if r[0] != "ours-default-pf" or default != "maxsim"]


def _index_of(row: str) -> str:
    return next((w for name, w, _ in OUR_ROWS if name == row), "plain")


def ratios(r: dict) -> dict:
    """LightRAG / ours for times, bytes and RSS (above 1: ours is faster or smaller), ours /
    LightRAG for QPS (above 1: ours serves more), per our row, against the reference row."""
    rows, serving = r.get("rows") or {}, r.get("serving") or {}
    lr_ref = rows.get(REFERENCE)
    out = {}
    for ours_row in [k for k in rows if k.startswith("ours")]:
        o = rows.get(ours_row)
        pf = _index_of(ours_row) == "prefilter"
        if o is None or lr_ref is None:
            continue
        x = {"p50_speedup_vs_lightrag_local": lr_ref["p50_ms"] / o["p50_ms"],
             "p99_speedup_vs_lightrag_local": lr_ref["p99_ms"] / o["p99_ms"],
             "p50_speedup_vs_lightrag_hybrid": rows[HIT_REFERENCE]["p50_ms"] / o["p50_ms"],
             "batched_qps_ours_over_lightrag_local": o["batch_qps"] / lr_ref["batch_qps"],
             "hit_rate_ours": o["hit_rate"], "hit_rate_lightrag_hybrid": rows[HIT_REFERENCE]["hit_rate"],
             "hit_rate_lightrag_local": lr_ref["hit_rate"]}
        lr_ing, o_ing = r["lightrag"]["ingest"], r["ours"]["ingest"]
        o_ingest_s = o_ing["ingest_s"] + (r["ours"]["prefilter"]["prefilter_s"] if pf else 0)
        x["ingest_time_lightrag_over_ours"] = lr_ing["ingest_s"] / o_ingest_s
        x["ingest_peak_rss_lightrag_over_ours"] = lr_ing["hwm_bytes"] / max(
            o_ing["hwm_bytes"], r["ours"]["prefilter"]["hwm_bytes"] if pf else 0)
        disk = r["ours"]["prefilter_disk"] if pf else r["ours"]["disk"]
        x["disk_lightrag_over_ours"] = r["lightrag"]["disk"]["bytes"] / disk["bytes"]
        so, sl = serving[ours_row], serving["lightrag"]
        x["open_time_lightrag_over_ours"] = sl["open_s"] / so["open_s"]
        x["rss_after_open_lightrag_over_ours"] = sl["after_open"]["rss_bytes"] / so["after_open"]["rss_bytes"]
        x["rss_after_queries_lightrag_over_ours"] = sl["after_queries"]["rss_bytes"] / so["after_queries"]["rss_bytes"]
        x["anon_rss_after_queries_lightrag_over_ours"] = (sl["after_queries"]["rss_anon_bytes"]
                                                          / so["after_queries"]["rss_anon_bytes"])
        out[ours_row] = x
    return out


# ------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------

HANDICAPS_LIGHTRAG = [
    "Single vectors only: its chunks, entities, relations and questions get our hashing text encoder's "
    "single vectors (d=128); it has no token-level (late-interaction) scoring, which our recall uses over "
    "every segment.",
    "No LLM: in the rows marked *question* the whole question is both keyword list (LightRAG's keyword "
    "LLM would have given entity names and themes); the row *hybrid, names* gives the two entity names as "
    "low-level keywords and \"relation\" as the high-level one, about what that LLM would extract.",
    "`insert_custom_kg` keeps the last declaration of an entity name: the 2 names per document drawn from "
    "the shared pool keep one description and one source chunk (their edges from every document stay); our "
    "index keeps each document's entity and merges aliases at query time.",
    "Defaults as a user gets them: JSON KV + NanoVectorDB (flat cosine search in numpy) + NetworkX, cosine "
    "threshold 0.2 (items below it are dropped; with the hashing encoder a question's cosine with the entities "
    "it names is about 0.5, with others about 0.16 in the median, so it drops little), `top_k` and "
    "`chunk_top_k` 10, no reranker; every insert call rewrites its JSON stores whole.",
    "A word tokenizer instead of tiktoken (which would download its BPE file): budgets count words and "
    "punctuation marks; tiktoken would split these made-up words into more tokens, so its budgets (6,000 "
    "entity, 8,000 relation, 30,000 total tokens) would cut sooner than here.",
    "Batches are 64 `aquery_llm` coroutines gathered on one asyncio loop: one Python thread (numpy's BLAS "
    "may use both cores inside a matrix product).",
    "Its logger is set to WARNING (its INFO lines per query would be written out).",
]
HANDICAPS_OURS = [
    "Our pipeline does more per query: late interaction of the question's token vectors with the segments' "
    "tokens for recall (exact MaxSim over every segment in the `ours` row when the index carries no "
    "prefilter; a prefilter shortlist scored exactly in the prefilter rows), seeds, one filtered hop, G* "
    "expansion, evidence ranking by MaxSim and a four-section context; LightRAG does up to three flat "
    "single-vector searches and graph look-ups.",
    "Our latency excludes query encoding (the hashing encoder, about 0.2 ms) as pipeline_report.py does; "
    "LightRAG's query vectors are a dictionary look-up inside its call.",
    "Our ingest builds document graphs from the record strings (LightRAG parses the same strings into its "
    "custom_kg inside its timed call too) and commits each call atomically (checksummed part, manifest "
    "replace); the encoders' time is reported apart, as LightRAG's vectors are precomputed.",
    "Our worker runs torch with 1 intra-op thread (as pipeline_report.py, on this shared 2-core machine) and "
    "native kernels with COLGRAPH_NUM_THREADS (all usable cores); LightRAG's numpy uses its default threads.",
    "Our open time includes importing torch; we open with `verify=False`, as the service does.",
]


def _f(x, nd=2):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    return f"{x:,.{nd}f}"


def _mib(b):
    return "-" if b is None else f"{b / 2**20:,.0f}"


def to_markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [
        "# LightRAG side by side: our pipeline vs LightRAG 1.5.7 (same corpus, same vectors, no LLM)", "",
        f"{rep['date']} · commit {m['git_commit_short']}"
        + (" (engine files modified in the work tree: "
           + ", ".join(f"`{line.split(maxsplit=1)[-1]}`" for line in m["engine_changes_uncommitted"].splitlines()) + ")"
           if m.get("engine_changes_uncommitted") else "")
        + f" · {m['cpu_model']} · {m['cpus_usable']} usable CPUs (shared with other jobs) · "
        f"{m['memory_total_bytes'] / 2**30:.0f} GiB · python {m['python']} · ours: torch {m['torch']} · LightRAG venv: "
        + ", ".join(f"{k} {v}" for k, v in m["lightrag_venv"].items())
        + f" · load average at start {m['loadavg_start'][0]:.2f}, end {rep['loadavg_end'][0]:.2f}", "",
        f"Command: `{rep['command']}` ({rep['total_s'] / 60:.1f} min). Settings: {json.dumps(rep['settings'])}", "",
        f"Our rows: `ours` = `PipelineConfig()` (recall_ranker = `{rep['our_config'].get('recall_ranker')}`), "
        "`ours-prefilter` = the same with `recall_ranker=\"prefilter\"` on a copy of the index that carries a "
        "prefilter (`KnowledgeIndex.enable_prefilter()`; its build time is added to that row's ingest)"
        + (", `ours-default-pf` = `PipelineConfig()` on that copy" if any(
            "ours-default-pf" in (s.get("rows") or {}) for s in rep["sizes"]) else "") + ". "
        f"Speed ratios are taken against `{REFERENCE}`, the hit rate against `{HIT_REFERENCE}` too.", "",
        "See the docstring of `benchmarks/lightrag_peer.py` for the protocol (corpus, vectors, alternating "
        "workers, what is timed).", "",
    ]
    sizes = rep["sizes"]
    lines += ["## Ratios", "",
              "Above 1 favours ours everywhere: LightRAG / ours for latency, time, bytes and RSS; ours / LightRAG "
              "for QPS.", ""]
    keys = [("p50_speedup_vs_lightrag_local", "one query p50: LightRAG local / ours"),
            ("p99_speedup_vs_lightrag_local", "one query p99: LightRAG local / ours"),
            ("p50_speedup_vs_lightrag_hybrid", "one query p50: LightRAG hybrid / ours"),
            ("batched_qps_ours_over_lightrag_local", "batched QPS (64): ours / LightRAG local"),
            ("ingest_time_lightrag_over_ours", "ingest time: LightRAG / ours"),
            ("ingest_peak_rss_lightrag_over_ours", "ingest peak RSS: LightRAG / ours"),
            ("open_time_lightrag_over_ours", "open time: LightRAG / ours"),
            ("disk_lightrag_over_ours", "disk: LightRAG / ours"),
            ("rss_after_open_lightrag_over_ours", "RSS after open: LightRAG / ours"),
            ("rss_after_queries_lightrag_over_ours", "RSS after queries: LightRAG / ours"),
            ("anon_rss_after_queries_lightrag_over_ours", "anonymous RSS after queries: LightRAG / ours"),
            ("hit_rate_ours", "source-document hit rate: ours"),
            ("hit_rate_lightrag_hybrid", "source-document hit rate: LightRAG hybrid"),
            ("hit_rate_lightrag_local", "source-document hit rate: LightRAG local")]
    names = [name for name, _, _ in OUR_ROWS if any(name in (s.get("rows") or {}) for s in sizes)] or ["ours"]
    cols = [(s, row) for s in sizes for row in names]
    lines.append("| measure | " + " | ".join(f"{s['documents']:,} {row}" for s, row in cols) + " |")
    lines.append("|---|" + "---:|" * len(cols))
    for k, label in keys:
        cells = []
        for s, row in cols:
            x = (s.get("ratios") or {}).get(row, {}).get(k)
            if x is None:
                cells.append(_why_missing(s, row))
            else:
                cells.append(f"{x:.2f}" if k.startswith("hit") else f"{x:.2f}x")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    t = rep.get("targets") or []
    if t:
        names = list(t[0]["values"])
        lines += ["", "### Targets (for later work; measured here only)", "",
                  "| target | documents | " + " | ".join(names) + " |", "|---|---:|" + "---|" * len(names)]
        for x in t:
            cells = []
            for row in names:
                v = x["values"][row]
                cells.append(v["verdict"] if v["value"] is None else f"{v['value']:.2f}{v.get('unit', '')} "
                             f"({v['verdict']})")
            lines.append(f"| {x['what']} | {x['documents']:,} | " + " | ".join(cells) + " |")
    lines += ["", "## Per row", "",
              "| documents | row | queries | p50 ms | p99 ms | batch 64 p50 ms | batched QPS | hit rate | "
              "recall hit rate | docs in context | context words |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sizes:
        for name, x in (s.get("rows") or {}).items():
            lines.append(f"| {s['documents']:,} | {name} | {x['queries']} | {_f(x['p50_ms'])} | {_f(x['p99_ms'])} | "
                         f"{_f(x.get('batch_p50_ms'), 0)} | {_f(x.get('batch_qps'), 1)} | {x['hit_rate']:.2f} | "
                         f"{_f(x.get('recall_hit_rate'))} | {x['context_documents_mean']:.1f} | "
                         f"{x['context_words_mean']:,.0f} |")
        if s.get("serve_error"):
            lines.append(f"| {s['documents']:,} | serving failed | {s['serve_error'].splitlines()[0]} |")
    lines += ["", "Source-document hit rate by context section (the source among the documents of that section "
              "alone; ours: entities, relations, sources; LightRAG: entities, relationships, chunks):", "",
              "| documents | row | any section | entities | relations | chunks / sources |", "|---:|---|---:|---:|---:|---:|"]
    for s in sizes:
        for name, x in (s.get("rows") or {}).items():
            h = x.get("hit_rate_by_section") or {}
            lines.append(f"| {s['documents']:,} | {name} | {x['hit_rate']:.2f} | {_f(h.get('entities'))} | "
                         f"{_f(h.get('relations'))} | {_f(h.get('chunks'))} |")
    lines += ["", "## Indexes and processes", "",
              "| documents | side | ingest s | of which | embed s (apart) | ingest peak RSS MiB | disk MiB | files | "
              "open s | RSS after open MiB (beyond imports) | RSS after queries MiB (anon + file) |",
              "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sizes:
        n = s["documents"]
        o, lr, sv = s.get("ours") or {}, s.get("lightrag") or {}, s.get("serving") or {}
        if "ingest" in o:
            i = o["ingest"]
            lines.append(_index_row(n, "ours", i["ingest_s"], f"graphs {i['graph_s']:.1f}, commits {i['commit_s']:.1f}",
                                    i["embed_s"], i["hwm_bytes"], o["disk"], sv.get("ours")))
        else:
            lines.append(f"| {n:,} | ours | {o.get('status', '-').splitlines()[0]} |")
        if "prefilter" in o:
            pf = o["prefilter"]
            for name in [k for k in sv if k.startswith("ours") and _index_of(k) == "prefilter"] or ["ours-prefilter"]:
                lines.append(_index_row(n, name, o["ingest"]["ingest_s"] + pf["prefilter_s"],
                                        f"+ prefilter build {pf['prefilter_s']:.1f}", None, pf["hwm_bytes"],
                                        o["prefilter_disk"], sv.get(name)))
        if "ingest" in lr:
            i = lr["ingest"]
            lines.append(_index_row(n, "lightrag", i["ingest_s"],
                                    f"{len(i['batches_s'])} insert_custom_kg calls, last {i['batches_s'][-1]:.1f}",
                                    None, i["hwm_bytes"], lr["disk"], sv.get("lightrag")))
        else:
            lines.append(f"| {n:,} | lightrag | {lr.get('status', '-').splitlines()[0]} |")
    lines.append("")
    for s in sizes:
        o, lr = s.get("ours") or {}, s.get("lightrag") or {}
        if o.get("fit_check"):
            lines.append(f"* {s['documents']:,} documents, our memory check: {o['fit_check']}.")
        for what, msg in (("ours", o.get("status")), ("ours-prefilter", o.get("prefilter_status")),
                          ("LightRAG", lr.get("status")), ("serving", s.get("serve_error"))):
            if msg and msg != "ok":
                lines.append(f"* {s['documents']:,} documents, {what}: {msg.splitlines()[0]}")
        for name, x in (s.get("rows") or {}).items():
            if x.get("recall_paths"):
                lines.append(f"* {s['documents']:,} documents, {name}: recall path per store (queries): "
                             + "; ".join(f"{k} ({v})" for k, v in _grouped_paths(x["recall_paths"]).items()))
        o, lr = (s.get("ours") or {}).get("ingest"), (s.get("lightrag") or {}).get("ingest")
        if o and lr:
            lines.append(f"* {s['documents']:,} documents: our index holds {o['counts'].get('entities', 0):,} entity "
                         f"and {o['counts'].get('relations', 0):,} relation items; LightRAG looked up "
                         f"{lr['vectors_looked_up']:,} vectors at ingest (chunks + entities after its per-call "
                         "de-duplication + relations).")
    lines += ["", "Ingest peak RSS is the ingest process's VmHWM (ours includes torch, about "
              f"{_mib(rep.get('ours_import_rss'))} MiB after imports; LightRAG's includes its imports, about "
              f"{_mib(rep.get('lightrag_import_rss'))} MiB, and its memory-mapped lookup table). Our vectors are "
              "memory-mapped after open: file-backed pages count in RSS once touched and are page cache the "
              "kernel can drop; the anonymous part cannot be.", ""]
    lines += ["## Handicaps", "", "LightRAG:", ""] + [f"* {h}" for h in HANDICAPS_LIGHTRAG]
    lines += ["", "Ours:", ""] + [f"* {h}" for h in HANDICAPS_OURS]
    found = findings(rep)
    if found:
        lines += ["", "## Findings (computed)", ""] + [f"* {x}" for x in found]
    notes = rep.get("notes") or []
    if notes:
        lines += ["", "## Notes", ""] + [f"* {x}" for x in notes]
    lines += ["", f"Plot: `{rep['plot']}` (p50 of one query vs documents, log-log; source-document hit rate beside it)."]
    return "\n".join(lines) + "\n"


def _grouped_paths(paths: dict[str, int]) -> dict[str, int]:
    """Recall paths with the per-query part of an adaptive budget left out (items scored,
    centroids probed), so that queries taking the same path count together."""
    import re
    out: dict[str, int] = {}
    for k, v in paths.items():
        k = re.sub(r"adaptive budget: [^;]*", "adaptive budget", k)
        out[k] = out.get(k, 0) + v
    return out


def findings(rep: dict) -> list[str]:
    """Sentences computed from the measurements (nothing here is written by hand)."""
    out = []
    for s in rep["sizes"]:
        n, rows = s["documents"], s.get("rows") or {}
        lr = rows.get(REFERENCE)
        for name in [k for k in rows if k.startswith("ours")]:
            x = rows[name]
            single_qps = 1e3 / x["mean_ms"]
            if x.get("batch_qps"):
                out.append(f"{n:,} documents, {name}: batches of {x['batch_size']} serve {x['batch_qps']:.1f} QPS, "
                           f"{x['batch_qps'] / single_qps:.2f}x its one-at-a-time rate ({single_qps:.1f} QPS from the "
                           f"mean latency {x['mean_ms']:.0f} ms)" + (f"; LightRAG local: {lr['batch_qps']:.1f} vs "
                                                                     f"{1e3 / lr['mean_ms']:.1f}." if lr else "."))
        ours, hy = rows.get("ours"), rows.get(HIT_REFERENCE)
        if ours and hy and lr:
            out.append(f"{n:,} documents: a context of ours names {ours['context_documents_mean']:.1f} documents on "
                       f"average, LightRAG's {lr['context_documents_mean']:.1f} (local) to "
                       f"{max(v['context_documents_mean'] for k, v in rows.items() if k.startswith('lightrag')):.1f}; "
                       f"its hit rate is drawn from a wider net. Counting its chunks alone, LightRAG hybrid finds the "
                       f"source {hy.get('hit_rate_by_section', {}).get('chunks', float('nan')):.2f} of the time, "
                       f"ours (sources alone) {ours.get('hit_rate_by_section', {}).get('chunks', float('nan')):.2f}.")
    return out


def _why_missing(s: dict, row: str) -> str:
    o = s.get("ours") or {}
    if o.get("status", "ok") != "ok":
        return "did not fit" if "did not fit" in o["status"] else "failed"
    if _index_of(row) == "prefilter" and "prefilter" not in o:
        return "prefilter build failed" if o.get("prefilter_status") else "no prefilter row"
    if (s.get("lightrag") or {}).get("status", "ok") != "ok":
        return "LightRAG failed"
    return "-"


def _index_row(n, side, ingest_s, parts, embed_s, hwm, disk, serving) -> str:
    sv = serving or {}
    aq = sv.get("after_queries") or {}
    ao = sv.get("after_open") or {}
    imported = (sv.get("ready") or {}).get("rss_after_import_bytes")
    grown = None if imported is None or not ao else ao["rss_bytes"] - imported
    return (f"| {n:,} | {side} | {ingest_s:.1f} | {parts} | {_f(embed_s, 1)} | {_mib(hwm)} | {_mib(disk['bytes'])} | "
            f"{disk['files']} | {_f(sv.get('open_s'))} | {_mib(ao.get('rss_bytes'))} ({_mib(grown)}) | "
            f"{_mib(aq.get('rss_bytes'))} ({_mib(aq.get('rss_anon_bytes'))} + {_mib(aq.get('rss_file_bytes'))}) |")


def targets(rep: dict) -> list[dict]:
    """The issue's targets (for later work; measured here only), per size and our row:
    one query p50 >= 3x faster than LightRAG local (10k and 100k), batched QPS >= 10x
    LightRAG local's (10k), disk and serving RSS (after queries) <= LightRAG's (every size)."""
    checks = [("one query p50 >= 3x faster than LightRAG local", "p50_speedup_vs_lightrag_local", 3.0, "x",
               lambda n: n >= 10000),
              ("batched QPS >= 10x LightRAG local's", "batched_qps_ours_over_lightrag_local", 10.0, "x",
               lambda n: n == 10000),
              ("disk <= LightRAG's (LightRAG / ours)", "disk_lightrag_over_ours", 1.0, "", lambda n: True),
              ("serving RSS <= LightRAG's (LightRAG / ours, after queries)", "rss_after_queries_lightrag_over_ours", 1.0,
               "", lambda n: True)]
    rows = [name for name, _, _ in OUR_ROWS if any(name in (s.get("rows") or {}) for s in rep["sizes"])] or ["ours"]
    out = []
    for what, key, need, unit, applies in checks:
        for s in rep["sizes"]:
            n = s["documents"]
            if not applies(n):
                continue
            values = {}
            for row in rows:
                x = (s.get("ratios") or {}).get(row)
                if not x:
                    values[row] = {"value": None, "verdict": _why_missing(s, row)}
                else:
                    v = x[key]
                    values[row] = {"value": v, "verdict": "met" if v >= need else "NOT met", "unit": unit}
            out.append({"what": what, "documents": n, "values": values})
    return out


def plot(rep: dict, path: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    for s in rep["sizes"]:
        for k in s.get("rows") or {}:
            if k not in names:
                names.append(k)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    styles = {"ours": ("C0", "o-"), "ours-prefilter": ("C0", "s--"), "ours-default-pf": ("C9", "D-.")}
    for j, name in enumerate(names):
        xs = [s["documents"] for s in rep["sizes"] if name in (s.get("rows") or {})]
        ys = [s["rows"][name]["p50_ms"] for s in rep["sizes"] if name in (s.get("rows") or {})]
        hs = [s["rows"][name]["hit_rate"] for s in rep["sizes"] if name in (s.get("rows") or {})]
        color, style = styles.get(name, (f"C{j + 1}", "^-" if "local" in name else "v:"))
        ax.plot(xs, ys, style, color=color, label=name)
        bx.plot(xs, hs, style, color=color, label=name)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents")
    ax.set_ylabel("p50 ms, one query at a time")
    ax.set_title("latency vs index size")
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    bx.set_xscale("log")
    bx.set_ylim(0, 1.02)
    bx.set_xlabel("documents")
    bx.set_ylabel("source document in the context")
    bx.set_title("source-document hit rate")
    bx.legend(fontsize=8)
    bx.grid(True, alpha=0.3)
    fig.suptitle(f"ours vs LightRAG 1.5.7, same corpus and vectors, no LLM ({rep['machine']['cpu_model']}, "
                 f"{rep['machine']['cpus_usable']} CPUs, shared)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def machine_info(lr_py: pathlib.Path) -> dict:
    import numpy
    import torch

    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu_model": cpu, "cpu_count": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "memory_total_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
            "loadavg_start": os.getloadavg(), "python": platform.python_version(), "torch": torch.__version__,
            "numpy": numpy.__version__, "COLGRAPH_NUM_THREADS": os.environ.get("COLGRAPH_NUM_THREADS"),
            "git_commit": git("rev-parse", "HEAD"), "git_commit_short": git("rev-parse", "--short", "HEAD"),
            "engine_changes_uncommitted": git("status", "--porcelain", "--", "colgraph_engine", "csrc") or "",
            "lightrag_venv": package_versions(str(lr_py), ["lightrag-hku", "numpy", "nano-vectordb", "networkx"])}


# ------------------------------------------------------------------------------------------
# Main
# ------------------------------------------------------------------------------------------

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, nargs="+", default=[1000, 10000], help="index sizes (documents)")
    p.add_argument("--quick", action="store_true", help="200 documents, 20 queries, 1 batch (a smoke check)")
    p.add_argument("--queries", type=int, default=120, help="single queries timed per row and size")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--batches", type=int, default=2, help="batches timed per row and size")
    p.add_argument("--chunk", type=int, default=1000, help="documents per add_documents call (ours)")
    p.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"),
                   help="our index's vector dtype (KnowledgeIndex.create(dtype=...); colgraph index build's default)")
    p.add_argument("--lightrag-batch", type=int, default=1000, help="documents per insert_custom_kg call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--memory-fraction", type=float, default=0.8, help="of MemAvailable our ingest may use")
    p.add_argument("--no-prefilter", action="store_true", help="leave out the rows over a prefilter-carrying copy")
    p.add_argument("--max-ingest-minutes", type=float, default=30,
                   help="stop an ingest (either side) that runs longer, and report it as too slow (0: no limit)")
    p.add_argument("--keep", action="store_true", help="keep the built indexes under benchmarks/.cache/lightrag_peer")
    p.add_argument("--venv", type=pathlib.Path, default=CACHE / "venv", help="LightRAG's virtual environment")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="default: benchmarks/results (--quick: benchmarks/.cache/lightrag_peer/results, not committed)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--from-json", type=pathlib.Path, default=None,
                   help="write the .md and .png again from a saved .json (no measuring)")
    a = p.parse_args(argv)
    if a.quick:
        a.docs, a.queries, a.batches, a.batch_size, a.warmup = [200], 20, 1, 16, 2
    if a.out is None:
        a.out = CACHE / "results" if a.quick else HERE / "results"
    return a


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("_ours-serve", *ROLES):
        return _role_main(argv[0], argv[1:])
    args = parse_args(argv)
    if args.from_json is not None:
        rep = json.loads(args.from_json.read_text())
        rep["notes"] = [x for x in rep.get("notes", []) if x not in EXTRA_NOTES] + EXTRA_NOTES
        args.from_json.write_text(json.dumps(rep, indent=1, default=str))
        stem = args.from_json.with_suffix("")
        plot(rep, stem.with_suffix(".png"))
        stem.with_suffix(".md").write_text(to_markdown(rep))
        print(f"wrote {stem}.md and .png from {args.from_json}")
        return 0
    os.environ.setdefault("COLGRAPH_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    from colgraph_engine.kg import Encoders
    from colgraph_engine.pipeline import PipelineConfig

    t_start = time.perf_counter()
    lr_py = ensure_lightrag_venv(args.venv, not args.no_progress)
    encoders = Encoders.offline(text_dim=TEXT_DIM)
    base = {"ours_interpreter_s": interpreter_start_s(sys.executable),
            "lightrag_interpreter_s": interpreter_start_s(str(lr_py))}
    rep = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine_info(lr_py), "command": " ".join([".venv/bin/python", "benchmarks/lightrag_peer.py"] + argv),
           "settings": {k: (str(v) if isinstance(v, pathlib.Path) else v) for k, v in vars(args).items()
                        if k not in ("out", "venv", "no_progress")},
           "interpreter_start_s": base, "our_config": PipelineConfig().as_dict(), "lightrag_rows": LIGHTRAG_ROWS,
           "sizes": [], "notes": []}
    measured: list[dict] = []
    for n in sorted(set(args.docs)):
        rep["sizes"].append(run_size(n, args, encoders, lr_py, base, measured))
    ing = [s["ours"]["ingest"] for s in rep["sizes"] if "ingest" in (s.get("ours") or {})]
    lig = [s["lightrag"]["ingest"] for s in rep["sizes"] if "ingest" in (s.get("lightrag") or {})]
    rep["ours_import_rss"] = ing[0]["rss_after_import_bytes"] if ing else None
    rep["lightrag_import_rss"] = lig[0]["rss_after_import_bytes"] if lig else None
    rep["targets"] = targets(rep)
    rep["loadavg_end"] = os.getloadavg()
    rep["total_s"] = time.perf_counter() - t_start
    stem = "lightrag_peer_quick" if args.quick else "lightrag_peer"
    args.out.mkdir(parents=True, exist_ok=True)
    rep["plot"] = f"benchmarks/results/{stem}.png" if args.out == HERE / "results" else str(args.out / f"{stem}.png")
    rep["notes"] += EXTRA_NOTES
    (args.out / f"{stem}.json").write_text(json.dumps(rep, indent=1, default=str))
    try:
        plot(rep, args.out / f"{stem}.png")
    except ImportError as exc:
        rep["notes"].append(f"no plot: {exc}")
    md = to_markdown(rep)
    (args.out / f"{stem}.md").write_text(md)
    print(md)
    print(f"total {rep['total_s']:.0f} s; wrote {args.out / stem}.{{md,json,png}}")
    return 0


EXTRA_NOTES: list[str] = []


if __name__ == "__main__":
    raise SystemExit(main())
