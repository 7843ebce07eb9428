"""A sharded index: a folder of shard index directories, its shard map, and one Ray actor per
shard holding that shard's stores and graph.

Layout::

    root/
      sharded.json     format, encoders (names, dims), vector dtype, shard count (written once)
      shards.json      the shard map (:mod:`.shard_map`): the commit point of every change
      shard-000/ ...   one KnowledgeIndex directory per shard (documents, graphs, vectors)

**Why one directory per shard** (rather than every shard reading a document subset of one
index): a shard then opens, maps and assembles only its own documents (memory per shard ~ 1/S
of the index, the point of sharding), shards write without one index-wide writer lock, and a
shard directory can sit on the local disk of the node its actor runs on. The cost: document
numbers are per shard, so the global order (and with it global node and edge ids) is kept by the
shard map instead of by one index, and a move between shards is a copy (add there, commit the
map, remove here) rather than a relabel.

**Changes.** The map is committed last for adds and moves, first for removals; a shard may
thus hold a document the map does not list for it (an interrupted add, move or removal), never
the reverse. Such leftovers are invisible to queries (the driver reads only the map's documents
of each shard) and are removed when the sharded index is opened (:meth:`ShardedIndex.open`
repairs). Writes and queries of one :class:`ShardedIndex` object are serialised by a lock.

**Ray.** Actors are started in whatever Ray instance the process is connected to. Tests and this
machine use a local one (``ray.init(num_cpus=2, include_dashboard=False)``). To use an existing
cluster, connect first, e.g. ``ray.init(address="auto")`` on a cluster node or
``ray.init(address="ray://<head>:10001")`` from outside, then ``ShardedIndex.open(root, ...)``:
every shard directory must be readable at the same path on the node its actor lands on (a shared
file system), or pin each shard to the node holding its directory with ``shard_options``, e.g.
``{i: {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False)}}``. A driver
that sees the shard directories at the same paths (same node, shared file system) reads the
gathered documents' graphs and rows from their part and vector files; one that does not gets
them through Ray (``ShardedPipeline(gather_from=...)``). Actors
reserve ``num_cpus=0`` by default (they are I/O-and-memory bound between queries; pass
``actor_options={"num_cpus": 1}`` to reserve a core each). Ray runs its workers at niceness 15
unless ``RAY_worker_niceness`` is set when the instance starts: on a machine shared with other
work the shards then yield the cores to it (their stage 1 and their start after a call slow
down, see ``benchmarks/results/ray_shards.md``); an instance this module starts itself sets 0.
"""
from __future__ import annotations

import copy
import json
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from .._atomic import fsync_dir, fsync_file
from ..kg.document import DocumentGraph, DocumentInput, build_document_graph
from ..kg.index import KnowledgeIndex, check_new_documents
from ..kg.vectors import Encoders, encode_document
from .channel import Channels, new_key
from .gather import item_vectors
from .shard import CHANNEL_METHODS, Shard
from .shard_map import Move, ShardMap

META_FILE = "sharded.json"
META_FORMAT = "colgraph-sharded-index"
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ShardUnavailableError(RuntimeError):
    """A shard's actor died or could not be reached; nothing partial was returned."""

    def __init__(self, shard: int, cause: BaseException):
        super().__init__(f"shard {shard}: its actor is unavailable ({type(cause).__name__}: {cause})")
        self.shard = shard


def _ray():
    try:
        import ray
    except ImportError:  # pragma: no cover - the extra is missing
        raise ImportError("colgraph_engine.distributed needs Ray: pip install 'colgraph_engine[distributed]'") from None
    if not ray.is_initialized():
        # Ray starts workers at niceness 15 (background work): shard actors serve queries, so the
        # local instance started here runs them at 0 unless RAY_worker_niceness says otherwise
        os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(include_dashboard=False)  # RAY_ADDRESS, when set, connects to that cluster instead
    return ray


def _dtype_name(dtype: torch.dtype) -> str:
    for k, v in _DTYPES.items():
        if v == dtype:
            return k
    raise TypeError(f"dtype: expected one of {list(_DTYPES)}, got {dtype}")


class ShardedIndex:
    """Documents spread over `n_shards` shard actors (see the module docstring).

    Use :meth:`create`, :meth:`open` or :meth:`from_index`; :meth:`close` stops the actors.

    ``direct`` (an option of all three, default True): the query path's calls to the shards
    (:meth:`scatter`) go over a direct connection to each actor (:mod:`.channel`: ~0.1 ms a round
    instead of ~1 ms for Ray's actor calls on this machine); a shard the driver cannot connect
    to gets Ray calls. The attribute can be switched at any time (benchmarks compare both).

    Cores: shards on one machine split its cores between their native kernels
    (:meth:`.shard.Shard.share_cores`; :attr:`shard_threads` lists the counts), unless the actors'
    runtime environment sets ``COLGRAPH_NUM_THREADS`` (``actor_options={"runtime_env":
    {"env_vars": {"COLGRAPH_NUM_THREADS": "8"}}}``).
    """

    def __init__(self, root: Path, encoders: Encoders, dtype: torch.dtype, dims: dict, smap: ShardMap,
                 actor_options: dict | None, shard_options: dict | None, torch_threads: int | None,
                 direct: bool = True):
        if not isinstance(direct, bool):
            raise TypeError(f"direct: expected a bool, got {type(direct).__name__}")
        self.direct = direct
        self._key = new_key()
        self.channels = Channels(lambda i: (self.get(i, self.actors[i].open_channel.remote(self._key)), self._key),
                                 ShardUnavailableError)
        self.root, self.encoders, self.dtype, self.dims, self.map = root, encoders, dtype, dims, smap
        self.actor_options = {"num_cpus": 0, **(actor_options or {})}
        self.shard_options = dict(shard_options or {})
        self.torch_threads = torch_threads
        self.lock = threading.RLock()
        self.actors: list = [None] * smap.n_shards
        self.restarts = [0] * smap.n_shards
        for i in range(smap.n_shards):
            self.actors[i] = self._start(i)
        self.call_all("ping")  # fail here, not in the first query, when actors cannot start
        self._share_cores()  # sets shard_threads

    # -- life cycle -----------------------------------------------------------------------------
    @classmethod
    def create(cls, root: str | os.PathLike, encoders: Encoders, n_shards: int, *, dtype: torch.dtype = torch.float32,
               actor_options: dict | None = None, shard_options: dict | None = None,
               torch_threads: int | None = 1, direct: bool = True) -> ShardedIndex:
        """An empty sharded index in `root` (a new or empty folder)."""
        if not isinstance(encoders, Encoders):
            raise TypeError(f"encoders: expected Encoders, got {type(encoders).__name__}")
        smap = ShardMap(n_shards)
        root = Path(root)
        if (root / META_FILE).exists():
            raise ValueError(f"root: {root} already holds a sharded index")
        root.mkdir(parents=True, exist_ok=True)
        dims = KnowledgeIndex(encoders, dtype=dtype).dims
        meta = {"format": META_FORMAT, "version": 1, "encoders": encoders.describe(), "dims": dims,
                "dtype": _dtype_name(dtype), "n_shards": n_shards}
        tmp = root / f".{META_FILE}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta))
        fsync_file(tmp)
        os.replace(tmp, root / META_FILE)
        smap.save(root)
        fsync_dir(root)
        return cls(root, encoders, dtype, dims, smap, actor_options, shard_options, torch_threads, direct)

    @classmethod
    def open(cls, root: str | os.PathLike, encoders: Encoders, *, actor_options: dict | None = None,
             shard_options: dict | None = None, torch_threads: int | None = 1, repair: bool = True,
             direct: bool = True) -> ShardedIndex:
        """Opens the sharded index in `root`; with `repair`, removes documents a shard holds that
        the map does not list for it (leftovers of an interrupted change)."""
        root = Path(root)
        try:
            meta = json.loads((root / META_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"root: {root / META_FILE} cannot be read ({exc})") from None
        if not isinstance(meta, dict) or meta.get("format") != META_FORMAT or meta.get("dtype") not in _DTYPES:
            raise ValueError(f"root: {root / META_FILE} is not a {META_FORMAT} file")
        if encoders.describe() != meta["encoders"]:
            raise ValueError(f"encoders: the sharded index was built with {meta['encoders']}, got {encoders.describe()}")
        smap = ShardMap.load(root)
        if smap.n_shards != meta.get("n_shards"):
            raise ValueError(f"{root / 'shards.json'}: {smap.n_shards} shards, {META_FILE} says {meta.get('n_shards')}")
        out = cls(root, encoders, _DTYPES[meta["dtype"]], meta["dims"], smap, actor_options, shard_options,
                  torch_threads, direct)
        held = out.call_all("documents")
        for i, docs in enumerate(held):
            listed = set(smap.documents_of(i))
            missing = listed - set(docs)
            if missing:
                out.close()
                raise ValueError(f"{out.shard_path(i)}: the shard map lists {sorted(missing)[:5]} there, the shard "
                                 f"does not hold them (damaged or replaced shard directory)")
            extra = [d for d in docs if d not in listed]
            if extra and repair:
                out.call(i, "remove", extra)
        return out

    @classmethod
    def from_index(cls, index: KnowledgeIndex, root: str | os.PathLike, n_shards: int, *,
                   encoders: Encoders | None = None, batch: int = 256, **options) -> ShardedIndex:
        """A sharded copy of `index` (its documents in its order, with their vectors as stored)."""
        encoders = index.encoders if encoders is None else encoders
        out = cls.create(root, encoders, n_shards, dtype=index.dtype, **options)
        ids = index.documents
        for a in range(0, len(ids), batch):
            stored = [index._stored(d) for d in ids[a:a + batch]]  # noqa: SLF001 - graph + vectors as stored
            out.add_documents([s.graph for s in stored], [s.vectors for s in stored], rebalance=False)
        return out

    def close(self) -> None:
        """Stops the shard actors (the directories stay)."""
        ray = _ray()
        self.channels.close()
        for a in self.actors:
            if a is not None:
                ray.kill(a)
        self.actors = [None] * len(self.actors)

    def shard_path(self, i: int) -> Path:
        return self.root / f"shard-{i:03d}"

    def _start(self, i: int):
        ray = _ray()
        remote = ray.remote(Shard).options(max_restarts=0, **self.actor_options, **self.shard_options.get(i, {}))
        create = {"dims": self.dims, "dtype": _dtype_name(self.dtype)}
        return remote.remote(str(self.shard_path(i)), create, self.torch_threads)

    def restart(self, i: int) -> None:
        """Replaces shard `i`'s actor by a new one over the same directory (after it died)."""
        ray = _ray()
        self.channels.drop(i)
        try:
            ray.kill(self.actors[i])
        except Exception:  # already gone
            pass
        self.actors[i] = self._start(i)
        self.restarts[i] += 1
        self.get(i, self.actors[i].ping.remote())
        self._nodes[i] = self.call(i, "node")
        self.shard_threads[i] = self.call(i, "share_cores", self._nodes.count(self._nodes[i]))

    def _share_cores(self) -> None:
        """Shards on one machine split its cores (:meth:`.shard.Shard.share_cores`); the counts
        in effect land in :attr:`shard_threads`. A restarted shard takes its share of the
        machine it lands on (the others keep theirs)."""
        self._nodes: list[str] = self.call_all("node")
        refs = [(i, self.actors[i].share_cores.remote(self._nodes.count(n))) for i, n in enumerate(self._nodes)]
        self.shard_threads: list[int] = [self.get(i, r) for i, r in refs]

    # -- calls --------------------------------------------------------------------------------------
    def get(self, shard: int, ref, timeout: float | None = None):
        """``ray.get`` of one shard's call; a dead or unreachable actor raises
        :class:`ShardUnavailableError` naming the shard."""
        ray = _ray()
        try:
            return ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
            raise ShardUnavailableError(shard, exc) from exc

    def call(self, shard: int, method: str, *args):
        return self.get(shard, getattr(self.actors[shard], method).remote(*args))

    def scatter(self, calls: dict[int, tuple[str, tuple]], timeout: float | None = None, *,
                small: bool = True) -> dict:
        """``{shard: result}`` of ``{shard: (method, args)}``, every call in flight together:
        over the direct connections while :attr:`direct` and `small` (methods in
        :data:`~.shard.CHANNEL_METHODS`), else as Ray actor calls (``small=False``: arguments
        or answers of megabytes, or object refs, which Ray resolves and moves uncopied). A shard
        that died, broke its connection or did not answer within `timeout` raises
        :class:`ShardUnavailableError` (after every other answer is in); an error a call raised
        is raised as itself. Holds :attr:`lock` (a connection carries one call at a time)."""
        with self.lock:
            direct = {s: c for s, c in calls.items()
                      if self.direct and small and c[0] in CHANNEL_METHODS and self.channels.has(s)}
            refs = {s: getattr(self.actors[s], m).remote(*a) for s, (m, a) in calls.items() if s not in direct}
            failure, out = None, {}
            if direct:
                try:
                    out = self.channels.call_many(direct, timeout)
                except Exception as exc:  # noqa: BLE001 - raised after the Ray calls are in too
                    failure = exc
            for s, r in refs.items():
                try:
                    out[s] = self.get(s, r, timeout)
                except Exception as exc:  # noqa: BLE001
                    failure = failure or exc
            if failure is not None:
                raise failure
            return {s: out[s] for s in calls}

    def call_all(self, method: str, *args, shards: Sequence[int] | None = None) -> list:
        """One call per shard (all in flight together); results in shard order."""
        shards = range(self.map.n_shards) if shards is None else shards
        refs = [(i, getattr(self.actors[i], method).remote(*args)) for i in shards]
        return [self.get(i, r) for i, r in refs]

    # -- reading ------------------------------------------------------------------------------------
    @property
    def documents(self) -> list[str]:
        """Document ids in global order."""
        return list(self.map.order()["ids"])

    def __len__(self) -> int:
        return len(self.map)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self.map

    # -- writes -------------------------------------------------------------------------------------
    def add_documents(self, docs: Sequence[DocumentInput | DocumentGraph], vectors: Sequence[dict] | None = None, *,
                      extractor: Callable[[str], str] | None = None, rebalance: bool = True,
                      **build_options) -> list[int]:
        """Builds (when given inputs), encodes (when `vectors` is None) and places documents on
        the least-loaded shards; one commit per shard that gets documents, then the map. Returns
        each document's shard. ValueError for an id already present or repeated."""
        if isinstance(docs, (DocumentInput, DocumentGraph)) or not isinstance(docs, Sequence):
            raise TypeError("docs: expected a sequence of DocumentInput or DocumentGraph")
        if vectors is not None and (not isinstance(vectors, Sequence) or len(vectors) != len(docs)):
            raise ValueError(f"vectors: expected one dict per document ({len(docs)})")
        with self.lock:
            check_new_documents(docs, self.map, "the sharded index")
            graphs = [d if isinstance(d, DocumentGraph) else build_document_graph(d, extractor=extractor,
                                                                                   **build_options) for d in docs]
            if vectors is None:
                vectors = [encode_document(g, self.encoders) for g in graphs]
            new_map = copy.deepcopy(self.map)
            shards = [new_map.place(g.doc_id, load=sum(int(v.values.shape[0]) for v in vec.values()),
                                    n_nodes=int(g.n_nodes), n_edges=int(g.n_edges)) for g, vec in zip(graphs, vectors)]
            per_shard: dict[int, list[int]] = {}
            for j, s in enumerate(shards):
                per_shard.setdefault(s, []).append(j)
            refs = [(s, self.actors[s].add.remote([graphs[j] for j in js], [vectors[j] for j in js]))
                    for s, js in per_shard.items()]
            errors = []
            for s, r in refs:
                try:
                    self.get(s, r)
                except Exception as exc:  # noqa: BLE001 - reported after the others are undone
                    errors.append(exc)
            if errors:
                for s, js in per_shard.items():  # undo what did commit (leftovers would be repaired on open)
                    try:
                        self.call(s, "remove", [graphs[j].doc_id for j in js])
                    except Exception:  # noqa: BLE001
                        pass
                raise errors[0]
            new_map.save(self.root)
            self.map = new_map
            if rebalance:
                self.rebalance()
            return [self.map.shard_of(g.doc_id) for g in graphs]

    def remove_document(self, doc_id: str, *, rebalance: bool = True) -> None:
        """Removes a document (the map is committed first; see the module docstring)."""
        if not isinstance(doc_id, str):
            raise TypeError(f"doc_id: expected str, got {type(doc_id).__name__}")
        with self.lock:
            new_map = copy.deepcopy(self.map)
            shard = new_map.remove(doc_id)
            new_map.save(self.root)
            self.map = new_map
            self.call(shard, "remove", [doc_id])
            if rebalance:
                self.rebalance()

    def enable_prefilter(self, stores: Sequence[str] | None = None, **options) -> list[dict[str, str]]:
        """Makes every shard's index carry centroid prefilters (:meth:`KnowledgeIndex.enable_prefilter`:
        `stores` None for its default stores; ``nbits``, ``min_tokens``, ``rebuild_drift``), each
        trained on that shard's own tokens and committed in its directory; later adds, removals
        and moves maintain them. Returns each shard's ``{store: what happened}``. Queries use
        them with ``PipelineConfig(recall_ranker="prefilter")`` (see
        :class:`~.retrieval.ShardedPipeline`); ValueError / TypeError as the index method gives."""
        if isinstance(stores, str):  # list("segment") would name its letters
            raise TypeError(f"stores: expected a list or tuple of store names or None, got the str {stores!r}")
        with self.lock:
            return self.call_all("enable_prefilter", None if stores is None else list(stores), dict(options))

    def rebalance(self, tolerance: float = 0.1) -> list[Move]:
        """Moves whole documents until the shard loads are within `tolerance` x the mean
        (:meth:`ShardMap.plan_rebalance`); each move: add on the target, commit the map, remove
        from the source. Returns the moves made."""
        with self.lock:
            moves = self.map.plan_rebalance(tolerance)
            for m in moves:
                (graph, vectors), = self.call(m.src, "stored_documents", [m.doc_id])
                self.call(m.dst, "add", [graph], [item_vectors(vectors, self.dtype)])
                new_map = copy.deepcopy(self.map)
                new_map.move(m.doc_id, m.dst)
                new_map.save(self.root)
                self.map = new_map
                self.call(m.src, "remove", [m.doc_id])
            return moves


__all__ = ["ShardUnavailableError", "ShardedIndex"]
