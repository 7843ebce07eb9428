"""The query path over a :class:`~.corpus.ShardedIndex`: results identical to
:class:`~colgraph_engine.pipeline.Pipeline` on one index holding the same documents in the same
order (same documents and scores, seeds, subgraph, images, evidence, context; node and edge ids
of that single index).

Per batch:

1. **encode** on the driver (the index's encoders; :meth:`Pipeline.encode`);
2. **recall**: the packed queries go to every shard at once, over the direct connections to
   the actors (:mod:`.channel`; as one object-store copy through Ray calls when the batch's
   queries pass Ray's 100 KB inline size). When every query of the batch uses one recall side (text-only questions;
   ``protocol="top"``), each shard
   returns per query its best Kd documents (ties included) with its min / max score, and the
   driver merges those lists (:func:`.fusion.fuse_top`: exact global ranks, network and driver
   work O(shards x Kd)); otherwise (a query fusing text and image sides, a shard whose document
   list changed, or a weighted fusion the lists cannot decide) each shard returns every
   document's best-unit score per side and the driver fuses them in the global order
   (:func:`.fusion.fuse`, O(documents)). Either way the global top-Kd of every query is the
   single index's;
3. **gather**: the union of the batch's recalled documents is put in a gathered in-memory
   index, itself cached per document set (:mod:`.gather`). Documents come from a driver cache
   keyed by (doc id, sequence number) (a re-added document never matches), else from the
   shards as bundles (:mod:`.bundle`): with the top-Kd protocol on few shards (``prefetch``)
   each shard's stage-1 answer already carries its top lists' documents, a superset of the
   global top-Kd it holds, so there is no second round; otherwise one call per shard holding
   missing documents, in parallel. Where the driver sees the shards' files (``gather_from``:
   same node or a shared file system) a bundle names where each graph lies in its part file and
   where each store's rows lie in its vector file, and the driver reads them there (memory
   maps: no rows cross the wire); else graphs and rows travel as bytes, through Ray;
4. **stages 2-7** run on the driver over the gathered index (``Pipeline.retrieve_batch`` with
   ``encoded=`` and ``recall=``), and the results' ids are mapped to global ids.

Gathering to the driver keeps one code path for every placement of the Kd documents (one shard
or many) and makes cross-shard alias merging exact for free; its cost is reading the Kd
documents' graphs and vectors and building the gathered index (see
``benchmarks/results/ray_shards.md`` for bytes and times; ``last_spans`` for one batch).

**Failures.** A shard whose actor dies during a batch (killed, its node lost) makes the batch
fail with :class:`~.corpus.ShardUnavailableError` (naming the shard), never return results
computed without it. With ``retries > 0`` the dead shard's actor is restarted over its directory
(the data is on disk) and the whole batch runs again from stage 1.

**Prefilters** (``recall_ranker="prefilter"``): each shard scores its recall stores through its
own prefilters (:meth:`.corpus.ShardedIndex.enable_prefilter` makes every shard's index carry
them, trained on that shard's tokens; else each shard builds one over its view on first use),
with the config's ``prefilter_*`` settings, and the driver fuses the columns as above. The
recalled documents are then the best of the union of the shards' shortlists, scored as each
shard scores them (exactly on the stored vectors with ``prefilter_exact="store"``): the same
contract as one index's prefilter recall, but not the same documents as one index's, whose
centroids are trained on every token (so the identity above holds for ``"maxsim"`` and
``"pooled"``, and for stages 2-7 given the recall). ``Result.counts["recall"]["paths"]`` names
each shard's path per store. Why it matters: a shard's exact stage 1 scans all of its units
(``benchmarks/results/ray_shards.md``'s model: seconds per query at 100M pages); its prefilter
scans a shortlist.
"""
from __future__ import annotations

import pickle
import time
from collections import OrderedDict
from pathlib import Path
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..kg.index import KnowledgeIndex
from ..kg.parts import MappedPart
from ..pipeline.config import RECALL_RANKERS, PipelineConfig
from ..pipeline.pipeline import Pipeline, Result
from ..pipeline.query import Query
from ..pipeline.recall import Recall
from .corpus import ShardedIndex, ShardUnavailableError, _ray
from .fusion import SideTop, fuse, fuse_top, merge_top, side_rows
from .bundle import PartRef, own_bundle, unpack_documents
from .gather import FileRows, IdMap, RowFiles, gathered_index, to_global

RANKERS = RECALL_RANKERS  # every recall ranker runs on shards (prefilters: each shard's own)
SPANS = ("encode", "scatter", "submit", "dispatch_first", "dispatch", "shard_compute", "ship", "reply", "fuse", "fetch", "build", "view", "stages", "to_global")
PROTOCOLS = ("top", "full")
GATHER_FROM = ("auto", "files", "ray")
PREFETCH_DOCS = 64  # ours: stage 1 ships its top lists' documents while shards x queries x Kd is at most this
INLINE_BYTES = 100_000


class ShardedPipeline:
    """Retrieval over a sharded index.

    Args:
        sharded: the :class:`ShardedIndex`.
        config: a :class:`PipelineConfig` (``recall_ranker`` maxsim or pooled).
        retries: times a batch is run again after a shard's actor died (each time the dead
            actors are restarted first); 0: raise at once.
        doc_cache: gathered documents kept on the driver (graphs and vectors), 0 to disable.
        view_cache: gathered indexes kept per document set, 0 to disable.
        protocol: stage 1's answers: ``"top"`` (each shard sends its best Kd documents per
            query when every query uses one recall side, else every score) or ``"full"``
            (every document's score, always).
        timeout_s: None, or seconds a shard may take to answer a call; a shard that does not
            is treated as lost (:class:`ShardUnavailableError`, then the retries).
        on_stage: None, or ``callable(stage_name)`` called after ``"recall"`` and ``"gather"``.
        gather_from: where the gathered documents' vector rows come from: ``"files"`` (the
            driver reads them from the shards' vector files, which it must see at the path the
            shard does: same node or a shared file system; only graphs and row ranges travel),
            ``"ray"`` (the rows travel as bytes through Ray), or ``"auto"`` (files, and per shard
            bytes from the first time its files cannot be read here).
        prefetch: in the top-Kd protocol with rows read from files, each shard sends with its
            stage-1 answer the documents of its top lists (graphs and row ranges: about Kd per
            query, a superset of the global top-Kd it holds), so there is no gather round; only
            while ``shards x queries x Kd <= PREFETCH_DOCS`` (the shards ship that many documents
            where the driver needs about Kd per query: with more shards or a bigger batch, a
            second round moves fewer). False: always two rounds.
        generator, record_extractor, num_threads: as :class:`Pipeline`.

    After each batch, ``last_spans`` holds where its time went (seconds): ``encode``,
    ``scatter`` (stage-1 calls out until every answer is in), and inside it ``submit`` (the
    driver's ``.remote`` calls), ``dispatch_first`` / ``dispatch`` (calls out until the first /
    the last shard started), ``shard_compute`` (the slowest shard's own stage-1 time),
    ``ship`` (the slowest shard's packing of shipped documents) and ``reply`` (the last shard's
    end until every answer is in; these two from ``time.time()``, meaningful on one node), ``fuse``, ``fetch`` (the gather round: calls,
    answers, rows read), ``build`` (the gathered index), ``view`` (its pipeline, view and id
    map), ``stages`` (stages 2-7) and ``to_global``; 0 for a part the batch skipped (a cached view).
    """

    def __init__(self, sharded: ShardedIndex, config: PipelineConfig | None = None, *, retries: int = 1,
                 doc_cache: int = 1024, view_cache: int = 16, protocol: str = "top", timeout_s: float | None = None,
                 on_stage: Callable[[str], None] | None = None, gather_from: str = "auto", prefetch: bool = True,
                 generator=None, record_extractor=None, num_threads: int | None = None):
        if not isinstance(sharded, ShardedIndex):
            raise TypeError(f"sharded: expected a ShardedIndex, got {type(sharded).__name__}")
        config = PipelineConfig() if config is None else config
        if not isinstance(config, PipelineConfig):
            raise TypeError(f"config: expected a PipelineConfig or None, got {type(config).__name__}")
        for name, v in (("retries", retries), ("doc_cache", doc_cache), ("view_cache", view_cache)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {v!r}")
        if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float))
                                      or not timeout_s > 0):
            raise ValueError(f"timeout_s: expected None or seconds > 0, got {timeout_s!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol: expected one of {PROTOCOLS}, got {protocol!r}")
        if on_stage is not None and not callable(on_stage):
            raise TypeError(f"on_stage: expected None or a callable, got {type(on_stage).__name__}")
        if gather_from not in GATHER_FROM:
            raise ValueError(f"gather_from: expected one of {GATHER_FROM}, got {gather_from!r}")
        if not isinstance(prefetch, bool):
            raise TypeError(f"prefetch: expected a bool, got {type(prefetch).__name__}")
        self.sharded, self.config, self.retries = sharded, config, retries
        self.on_stage = on_stage
        self.options = dict(generator=generator, record_extractor=record_extractor, num_threads=num_threads)
        # encodes queries exactly as the single-process pipeline does (an empty index: nothing else is read)
        self._encoder = Pipeline(KnowledgeIndex(sharded.encoders, dtype=sharded.dtype), sharded.encoders, config,
                                 **self.options)
        self._docs: OrderedDict = OrderedDict()   # (doc_id, seq) -> (graph, {store: (local, rows, offsets)})
        self._files = RowFiles()
        self._part_files: OrderedDict = OrderedDict()  # part file path -> MappedPart
        self._files_ok: dict[int, bool] = {}      # shard -> whether its vector files read here (auto)
        self.gather_from, self.prefetch = gather_from, prefetch
        self.last_spans: dict[str, float] = {}
        self._views: OrderedDict = OrderedDict()  # (map version, seqs) -> (Pipeline, IdMap)
        self._known: dict[int, dict] = {}         # shard -> its last answer's version, doc ids, units
        self._columns: dict = {}                  # (shard, shard version, map version) -> (cols, positions, units)
        self.last_shard_seconds: list[float] = []  # each shard's stage-1 compute time in the last batch
        self.doc_cache, self.view_cache = doc_cache, view_cache
        self.protocol, self.timeout_s = protocol, timeout_s
        self.stats = {"batches": 0, "retries": 0, "documents_fetched": 0, "bytes_fetched": 0, "bytes_read": 0, "documents_shipped": 0,
                      "top_batches": 0, "top_undecided": 0}

    def retrieve(self, query: Query | str) -> Result:
        return self.retrieve_batch([query])[0]

    def retrieve_batch(self, queries: Sequence[Query | str]) -> list[Result]:
        """Results equal to ``Pipeline(single_index).retrieve_batch(queries)`` (ids included)."""
        attempt = 0
        while True:
            try:
                with self.sharded.lock:
                    return self._run(queries)
            except ShardUnavailableError as exc:
                if attempt >= self.retries:
                    raise
                attempt += 1
                self.stats["retries"] += 1
                self.sharded.restart(exc.shard)

    # -- one attempt ------------------------------------------------------------------------------
    def _run(self, queries) -> list[Result]:
        ray = _ray()
        cfg, sh = self.config, self.sharded
        spans = self.last_spans = dict.fromkeys(SPANS, 0.0)
        t0 = time.perf_counter()
        enc = self._encoder.encode(queries)
        qs = Pipeline._queries(queries)
        t_encode = spans["encode"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        rows = side_rows(cfg, enc["has_image"], enc["image"])
        payload = {side: tuple(t.numpy() for t in (enc["text"] if side == "text" else enc["image"])) + (r,)
                   for side, r in rows.items()}
        n = sh.map.n_shards
        size = sum(a.nbytes for v in payload.values() for a in v)
        # one object-store copy for all shards pays only for big batches: below Ray's inline limit
        # (100 KB) each call carries the payload itself, and a put costs ~2 ms here (benchmarks);
        # pickled once here, it is one bytes argument per call (Ray frames each array of a dict anew)
        arg = ray.put(payload) if n > 1 and size > INLINE_BYTES else pickle.dumps(payload, protocol=5)
        order = sh.map.order()
        n_docs = len(order["ids"])
        one_side = sum(r.size for r in rows.values()) == len(qs)  # no query row on two sides
        recall = None
        shipped: list[dict] = []
        if self.protocol == "top" and one_side and all(i in self._known for i in range(n)):
            ship = self.prefetch and self.gather_from != "ray" and n * len(qs) * cfg.kd <= PREFETCH_DOCS
            answers = self._scatter(arg, cfg, top=True, order=order, ship=ship)
            shipped = [pickle.loads(a["docs"]) if isinstance(a["docs"], bytes) else a["docs"]
                       for a in answers if "docs" in a]
            t1 = time.perf_counter()
            if all(a["mode"] == "top" for a in answers):
                recall = fuse_top(len(qs), self._merge_top(answers, rows, order), n_docs, cfg)
                self.stats["top_batches" if recall is not None else "top_undecided"] += 1
        if recall is None:
            answers = self._scatter(arg, cfg, top=False, order=order)
            t1 = time.perf_counter()
            placed = [self._columns_of(i, order) for i in range(n)]
            per_side = []
            for side, r in rows.items():
                scores = np.full((r.size, n_docs), -np.inf, np.float32)
                units = 0
                for a, (cols, pos, unit_sums, _) in zip(answers, placed):
                    scores[:, pos] = a[side][:, cols]
                    units += unit_sums[side]
                per_side.append((side, r, torch.from_numpy(scores), units))
            recall = fuse(len(qs), per_side, n_docs, cfg)
        if any("paths" in a for a in answers):
            recall.paths = _shard_paths(answers, rows, len(qs))
        t_recall = time.perf_counter() - t0
        spans["fuse"] += time.perf_counter() - t1
        if self.on_stage is not None:
            self.on_stage("recall")
        t0 = time.perf_counter()
        positions = np.unique(np.concatenate(recall.docs)) if recall.docs else np.zeros(0, np.int64)
        pipe, ids = self._gathered(positions.astype(np.int64), order, shipped)
        t_gather = time.perf_counter() - t0
        if self.on_stage is not None:
            self.on_stage("gather")
        local = Recall([np.searchsorted(positions, d).astype(np.int64) for d in recall.docs], recall.scores,
                       recall.sides, recall.units, recall.paths)
        t0 = time.perf_counter()
        results = pipe.retrieve_batch(qs, encoded=enc, recall=local)
        t1 = time.perf_counter()
        self.stats["batches"] += 1
        for res in results:
            to_global(res, ids)
            res.timings.update(encode=t_encode, recall=t_recall, gather=t_gather)
        spans["stages"], spans["to_global"] = t1 - t0, time.perf_counter() - t1
        return results

    def _scatter(self, arg, cfg: PipelineConfig, *, top: bool, order: dict, ship: bool = False) -> list[dict]:
        """Stage 1 on every shard at once; learns each shard's document list when it changed."""
        sh = self.sharded
        t0, sent = time.perf_counter(), time.time()
        calls = {}
        for i in range(sh.map.n_shards):
            known = self._known.get(i, {}).get("version")
            skip = self._columns_of(i, order)[3].tolist() if top else None
            ship_i = ship and (self.gather_from == "files" or self._files_ok.get(i, True))
            have = self._held_columns(i) if ship_i and self._docs else None
            calls[i] = ("recall_scores", (arg, cfg.recall_ranker, known, cfg.kd if top else None, skip, ship_i, have,
                                          cfg if cfg.recall_ranker in ("prefilter", "auto") else None))
        self.last_spans["submit"] += time.perf_counter() - t0
        answers = list(sh.scatter(calls, self.timeout_s, small=isinstance(arg, bytes)).values())
        spans, received = self.last_spans, time.time()
        spans["scatter"] += time.perf_counter() - t0
        # wall clocks of one node: the call's way out to the last shard to start, and back from the last to end
        spans["dispatch"] += max(a["clock"][0] for a in answers) - sent
        spans["dispatch_first"] += min(a["clock"][0] for a in answers) - sent
        spans["reply"] += received - max(a["clock"][1] for a in answers)
        spans["ship"] += max(a.get("ship_seconds", 0.0) for a in answers)
        for i, a in enumerate(answers):
            if "doc_ids" in a:
                self._known[i] = {"version": a["version"], "doc_ids": a["doc_ids"], "units": a["units"]}
        self.last_shard_seconds = [a["seconds"] for a in answers]
        self.last_spans["shard_compute"] += max(self.last_shard_seconds, default=0.0)
        return answers

    def _held_columns(self, shard: int) -> list[int]:
        """Columns (in the shard's known document list) of the documents the driver's cache
        holds: the shard does not ship them. A hint only: a document it then does not send is
        fetched in a second round."""
        known = self._known[shard]
        col_of = known.get("col_of")
        if col_of is None:
            col_of = known["col_of"] = {d: c for c, d in enumerate(known["doc_ids"])}
        return [c for d, _ in self._docs if (c := col_of.get(d)) is not None]

    def _merge_top(self, answers: list[dict], rows: dict, order: dict) -> list[SideTop]:
        """The shards' top lists per side and row, in global positions."""
        placed = [self._columns_of(i, order) for i in range(len(answers))]
        col2pos = [self._col2pos(pl) for pl in placed]
        return [merge_top(side, r, [a[side] for a in answers], col2pos, sum(pl[2][side] for pl in placed))
                for side, r in rows.items()]

    @staticmethod
    def _col2pos(placed: tuple) -> np.ndarray:
        cols, pos, _, skip = placed
        n = cols.size + skip.size
        col2pos = np.full(n, -1, np.int64)
        col2pos[cols] = pos
        return col2pos

    def _columns_of(self, shard: int, order: dict) -> tuple[np.ndarray, np.ndarray, dict, np.ndarray]:
        """For the shard's known document list: the columns the map lists on that shard, their
        global positions, those documents' summed units per side, and the other columns (left
        over by an interrupted change); cached per shard version and map version."""
        known = self._known[shard]
        key = (shard, known["version"], self.sharded.map.version)
        got = self._columns.get(key)
        if got is None:
            pos_of, smap, ids = order["position"], self.sharded.map.docs, known["doc_ids"]
            listed = np.asarray([d in smap and smap[d].shard == shard for d in ids], bool)
            cols = np.flatnonzero(listed).astype(np.int64)
            pos = np.asarray([pos_of[ids[c]] for c in cols.tolist()], np.int64)
            got = (cols, pos, {side: int(u[cols].sum()) for side, u in known["units"].items()},
                   np.flatnonzero(~listed).astype(np.int64))
            self._columns = {k: v for k, v in self._columns.items() if k[0] != shard}
            self._columns[key] = got
        return got

    def _gathered(self, positions: np.ndarray, order: dict, shipped: list[dict]) -> tuple[Pipeline, IdMap]:
        """The gathered index of the documents at global `positions` (cached per document
        set), its pipeline and id map; documents come from the driver's cache, then `shipped`
        (bundles sent with stage 1; only the documents needed are unpacked), then one fetch call
        per shard for the rest."""
        sh = self.sharded
        doc_ids = [order["ids"][p] for p in positions.tolist()]
        seqs = tuple(sh.map.docs[d].seq for d in doc_ids)
        key = (sh.map.version, seqs)
        if key in self._views:
            self._views.move_to_end(key)
            return self._views[key]
        spans = self.last_spans
        t0 = time.perf_counter()
        missing = [d for d in doc_ids if (d, sh.map.docs[d].seq) not in self._docs]
        where = {d: (b, i) for b, bundle in enumerate(shipped) for i, d in enumerate(bundle["ids"])}
        picks: dict[int, list[int]] = {}
        for d in missing:
            if d in where:
                picks.setdefault(where[d][0], []).append(where[d][1])
        for b, sel in picks.items():
            try:
                for graph, vectors in self._rows_of_many(self._unpack(shipped[b], sel)):
                    self._docs[(graph.doc_id, sh.map.docs[graph.doc_id].seq)] = graph, vectors
                    self.stats["documents_shipped"] += 1
            except (OSError, ValueError) as exc:  # the driver does not see that shard's files
                self._files_unreadable(sh.map.docs[shipped[b]["ids"][sel[0]]].shard, exc)
        want: dict[int, list[str]] = {}
        for d in missing:
            if (d, sh.map.docs[d].seq) not in self._docs:
                want.setdefault(sh.map.docs[d].shard, []).append(d)
        for d, got in self._fetch(want).items():
            self._docs[(d, sh.map.docs[d].seq)] = got
        items = []
        for d in doc_ids:
            k = (d, sh.map.docs[d].seq)
            self._docs.move_to_end(k)
            items.append(self._docs[k])
        while len(self._docs) > self.doc_cache:
            self._docs.popitem(last=False)
        t1 = time.perf_counter()
        index = gathered_index(sh.encoders, sh.dtype, items)
        t2 = time.perf_counter()
        pipe = Pipeline(index, sh.encoders, self.config, **self.options)
        pipe.view()
        got = (pipe, IdMap(index, positions, order["node_first"], order["edge_first"]))
        spans["fetch"], spans["build"], spans["view"] = t1 - t0, t2 - t1, time.perf_counter() - t2
        if self.view_cache:
            self._views[key] = got
            while len(self._views) > self.view_cache:
                self._views.popitem(last=False)
        return got

    def _fetch(self, want: dict[int, list[str]]) -> dict[str, tuple]:
        """``{doc_id: (graph, {store: (local, rows, offsets)})}`` of the documents `want` lists
        per shard: one call per shard, all in flight together; rows read from the shards' vector
        files (``gather_from``), else as bytes."""
        sh = self.sharded
        by_file = {s: self.gather_from == "files" or (self.gather_from == "auto" and self._files_ok.get(s, True))
                   for s in want}
        got = sh.scatter({s: ("gather_sendable", (ds, by_file[s])) for s, ds in want.items()}, self.timeout_s,
                         small=all(by_file.values()))  # rows as bytes: through Ray's object store
        answers = {s: self._unpack(a) for s, a in got.items()}
        out, again = {}, {}
        for s, ds in want.items():
            try:
                out.update(zip(ds, self._rows_of_many(answers[s])))
            except (OSError, ValueError) as exc:  # the driver does not see this shard's files
                self._files_unreadable(s, exc)
                again[s] = ds
        if again:
            out.update(self._fetch(again))
        self.stats["documents_fetched"] += sum(len(ds) for ds in want.values()) - sum(len(ds) for ds in again.values())
        return out

    def _unpack(self, bundle: dict | bytes, select: list[int] | None = None) -> list[tuple]:
        if isinstance(bundle, bytes):  # pickled by the shard (Shard.gather_sendable): arrays of its own
            return unpack_documents(pickle.loads(bundle), select)
        return unpack_documents(own_bundle(bundle) if self.doc_cache else bundle, select)

    def _part(self, ref: PartRef) -> MappedPart:
        """The part file `ref` names, opened once (parts are immutable under one name; the
        manifest's header sha256 confirms it is the shard's file), the 64 most recent kept."""
        part = self._part_files.get(ref.path)
        if part is None:
            sh = self.sharded
            part = MappedPart(Path(ref.path), sh.dims, sh.dtype, header_sha256=ref.header_sha256, verify=False)
            self._part_files[ref.path] = part
        self._part_files.move_to_end(ref.path)
        while len(self._part_files) > 64:
            self._part_files.popitem(last=False)
        return part

    def _files_unreadable(self, shard: int, exc: BaseException) -> None:
        if self.gather_from == "files":
            raise ValueError(f"gather_from='files': shard {shard}'s vector files cannot be read here ({exc}); "
                             "use 'auto' or 'ray'") from None
        self._files_ok[shard] = False

    def _rows_of_many(self, docs: list[tuple]) -> list[tuple]:
        """Fetched documents ``[(graph, vectors)]`` (one shard's bundle) with their graphs and
        rows in hand: a :class:`PartRef` cut out of its part file; :class:`FileRows` read from the
        vector files, every run of one file in one read (one copy, so the document cache holds
        no view of a mapping a removal could replace; without a cache the rows stay views of the
        mappings, and the gathered index's concatenation is their only copy)."""
        refs = [r for _, vectors in docs for _, r, _ in vectors.values() if isinstance(r, FileRows)]
        read = iter(self._files.rows_many(refs, self.sharded.dtype, copy=self.doc_cache > 0))
        out = []
        for graph, vectors in docs:
            if isinstance(graph, PartRef):
                graph = self._part(graph).document(graph.pos)
            got = {}
            for store, (local, rows, offsets) in vectors.items():
                if isinstance(rows, FileRows):
                    rows = next(read)
                    self.stats["bytes_read"] += rows.nbytes
                else:
                    self.stats["bytes_fetched"] += rows.nbytes
                got[store] = (local, rows, offsets)
            out.append((graph, got))
        return out


def _shard_paths(answers: list[dict], rows: dict, nq: int) -> list[dict[str, str]]:
    """Per query ``{store: "shard 0: <path (reason)>; shard 1: ..."}``: which path each shard's
    stage 1 took per recall store (``Recall.paths`` of one index, one entry per shard)."""
    out: list[dict[str, list[str]]] = [{} for _ in range(nq)]
    for i, a in enumerate(answers):
        for side, side_paths in a.get("paths", {}).items():
            for p in side_paths:
                store, _, what = p.partition(": ")
                for r in np.asarray(rows[side]).tolist():
                    out[r].setdefault(store, []).append(f"shard {i}: {what}")
    return [{store: "; ".join(v) for store, v in q.items()} for q in out]


__all__ = ["GATHER_FROM", "PROTOCOLS", "RANKERS", "ShardedPipeline"]
