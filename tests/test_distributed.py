"""Sharded retrieval on a local Ray instance against the single-process pipeline on the same
documents: identical results (documents, scores, seeds, subgraph, images, evidence, context,
node and edge ids) across configurations, after adds, removals and rebalancing moves, after
reopening; a shard actor killed mid-query gives a clear error or a retried identical answer;
leftovers of an interrupted change are invisible and repaired on open; bad input is named."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from colgraph_engine.demos.corpus import DEMO_QUESTIONS, _photo, demo_documents  # noqa: E402
from colgraph_engine.distributed import ShardedIndex, ShardedPipeline, ShardMap, ShardUnavailableError  # noqa: E402
from colgraph_engine.graph import NodeKind  # noqa: E402
from colgraph_engine.kg import Encoders, KnowledgeIndex, build_document_graph, encode_document, normalize_name  # noqa: E402
from colgraph_engine.demos import kg_data as kg_demo  # noqa: E402
from colgraph_engine.pipeline import Pipeline, PipelineConfig, Query  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from pipeline_report import make_document, make_questions, shared_names  # noqa: E402

ENC = Encoders.offline()
N_GENERATED = 24
CONFIGS = [  # the exact rankers: a sharded recall equals the single-process one (paths included)
    PipelineConfig(recall_ranker="maxsim"),
    PipelineConfig(kd=3, fusion="weighted", text_weight=0.3, recall_ranker="maxsim"),
    PipelineConfig(kd=4, filter="off", hops=2, all_document_images=True, context_mode="chunks",
                   recall_ranker="maxsim"),
    PipelineConfig(kd=5, retrieval="chunks", recall_ranker="maxsim"),
    PipelineConfig(kd=6, recall_ranker="pooled", visual_ranker="pooled", recall_side="text"),
    PipelineConfig(kd=2, recall_side="image", recall_ranker="maxsim"),
    PipelineConfig(kd=7, fusion="weighted", recall_side="text", recall_ranker="maxsim"),
]


def corpus():
    shared = shared_names(N_GENERATED)[:12]  # few shared names: alias groups span documents and shards
    return demo_documents() + kg_demo.demo_documents() + [make_document(i, shared) for i in range(N_GENERATED)]


def questions():
    cat = _photo("chelsea")[30:270, 60:400]
    return (list(DEMO_QUESTIONS) + make_questions(6, N_GENERATED)
            + [Query("Where does this animal live?", image=cat, caption="cat"), Query("Which photo shows it?", image=cat)])


def summary(r) -> str:
    d = r.as_dict()
    d.pop("timings")
    return json.dumps(d, sort_keys=True, default=str)  # NaN (unjudged scores) compares equal as text


def assert_identical(single, got, what=""):
    assert len(single) == len(got)
    for i, (a, b) in enumerate(zip(single, got)):
        assert summary(a) == summary(b), f"{what} query {i}: sharded result differs from the single-process one"


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def docs():
    return corpus()


@pytest.fixture(scope="module")
def single(docs):
    import torch
    idx = KnowledgeIndex(ENC, dtype=torch.bfloat16)  # bfloat16 rows travel as int16 bits: that path too
    idx.add_documents(docs)                          # (the grown index below is float32)
    return idx


@pytest.fixture(scope="module")
def sharded(ray_session, single, tmp_path_factory):
    sh = ShardedIndex.from_index(single, tmp_path_factory.mktemp("sharded") / "idx", 3)
    yield sh
    sh.close()


# -- the shard map (no Ray) ---------------------------------------------------------------------

def test_shard_map_places_by_least_load_and_rebalances_whole_documents(tmp_path):
    m = ShardMap(3)
    assert [m.place(f"d{i}", load=load, n_nodes=i + 1, n_edges=i) for i, load in enumerate([5, 3, 4, 1, 1])] \
        == [0, 1, 2, 1, 1]
    assert m.loads() == [5, 5, 4]
    o = m.order()
    assert o["ids"] == ["d0", "d1", "d2", "d3", "d4"]
    assert o["node_first"].tolist() == [0, 1, 3, 6, 10, 15] and o["edge_first"].tolist() == [0, 0, 1, 3, 6, 10]
    m.remove("d0")
    m.remove("d2")   # loads [0, 5, 0]: d1 (3), d3 (1), d4 (1) on shard 1
    moves = m.plan_rebalance(0.1)
    assert [(mv.doc_id, mv.src, mv.dst) for mv in moves] == [("d1", 1, 0), ("d3", 1, 2)]
    for mv in moves:
        m.move(mv.doc_id, mv.dst)
    assert m.loads() == [3, 1, 1] and m.plan_rebalance(0.1) == []
    assert m.order()["ids"] == ["d1", "d3", "d4"]  # moves keep the global order
    m.save(tmp_path)
    back = ShardMap.load(tmp_path)
    assert back.as_json() == m.as_json()
    bad = m.as_json()
    bad["documents"][0][2] = 7  # a shard that does not exist
    with pytest.raises(ValueError, match=r"documents\[0\]"):
        ShardMap.from_json(bad)
    with pytest.raises(ValueError, match="n_shards"):
        ShardMap(0)
    with pytest.raises(ValueError, match="already"):
        m.place("d1", load=1, n_nodes=1, n_edges=0)


# -- identity with the single-process pipeline ----------------------------------------------------

def test_sharded_results_equal_the_single_process_pipeline(sharded, single):
    qs = questions()
    smap = sharded.map
    # the case worth testing is present: recalled documents on several shards, alias groups across shards
    names = {}
    for d in single.documents:
        g = single.document(d)
        for v in np.flatnonzero(g.node_kind == NodeKind.ENTITY).tolist():
            names.setdefault(normalize_name(g.node_name[v]), set()).add(smap.shard_of(d))
    assert any(len(s) > 1 for s in names.values()), "no alias group spans shards"
    spans = top = 0
    text_only = [q for q in qs if not isinstance(q, Query) or q.image is None]
    for cfg in CONFIGS:
        ref = Pipeline(single, ENC, cfg).retrieve_batch(qs)
        # on its own batch: weighted fusion weighs a side by text_weight only when the batch uses two
        ref_text = Pipeline(single, ENC, cfg).retrieve_batch(text_only)
        for protocol in ("full", "top"):
            pipe = ShardedPipeline(sharded, cfg, protocol=protocol)
            got = pipe.retrieve_batch(qs)
            assert_identical(ref, got, f"{cfg!r} {protocol}")
            # text-only batches take the top-Kd lists (when the shards' document lists are known)
            got = pipe.retrieve_batch(text_only)
            assert_identical(ref_text, got, f"{cfg!r} {protocol} text only")
            top += pipe.stats["top_batches"]
            assert protocol == "top" or pipe.stats["top_batches"] == 0
        spans += sum(len({smap.shard_of(d) for d, _ in r.documents}) > 1 for r in got)
        assert any(r.images for r in got) or cfg.recall_side == "image"
    assert spans > 0, "no query's documents spanned shards"
    assert top == len(CONFIGS), "the top-Kd protocol was not used (or left a batch undecided)"
    exact = PipelineConfig(recall_ranker="maxsim")
    one = ShardedPipeline(sharded, exact).retrieve(qs[0])  # a batch of one, and the view cache's second use
    assert summary(one) == summary(Pipeline(single, ENC, exact).retrieve(qs[0]))
    # the default ranker ("auto": exact on stores this small) recalls the same; its paths name each shard
    default = ShardedPipeline(sharded).retrieve(qs[0])
    assert default.documents == Pipeline(single, ENC).retrieve(qs[0]).documents
    assert default.counts["recall"]["paths"]["segment"].startswith("shard 0: exact (auto: ")


def test_adds_removals_rebalancing_leftovers_and_reopen_keep_results_identical(ray_session, docs, tmp_path):
    single = KnowledgeIndex(ENC)
    sh = ShardedIndex.create(tmp_path / "grown", ENC, 2)
    try:
        assert_identical(Pipeline(single, ENC).retrieve_batch(questions()[:2]),
                         ShardedPipeline(sh).retrieve_batch(questions()[:2]), "empty")
        for a in range(0, len(docs), 11):  # DocumentInputs: built and encoded on the driver
            batch = docs[a:a + 11]
            single.add_documents(batch)
            sh.add_documents(batch)
        assert sh.documents == single.documents
        on0, on1 = sh.map.documents_of(0), set(sh.map.documents_of(1))
        for d in on0[: len(on0) // 2 + 2]:  # empties shard 0 enough that documents must move
            single.remove_document(d)
            sh.remove_document(d)
        assert set(sh.map.documents_of(0)) & on1, "rebalancing moved nothing to the emptied shard"
        loads = sh.map.loads()
        assert max(loads) - min(loads) <= max(0.1 * sum(loads) / 2, max(p.load for p in sh.map.docs.values()))
        assert sorted(sum(sh.call_all("documents"), [])) == sorted(single.documents)  # each document once
        extra = build_document_graph(make_document(900, shared_names(N_GENERATED)[:12]))
        single.add_documents([extra])
        sh.add_documents([extra])
        assert sh.documents == single.documents
        qs = questions()
        cfg = PipelineConfig(kd=6, recall_ranker="maxsim")
        ref = Pipeline(single, ENC, cfg).retrieve_batch(qs)
        assert_identical(ref, ShardedPipeline(sh, cfg).retrieve_batch(qs), "grown")
        # an add that committed on a shard but not in the map (the driver died in between):
        # invisible to queries, removed when the sharded index is opened
        left = build_document_graph(make_document(777, shared_names(N_GENERATED)[:12]))
        sh.call(0, "add", [left], [encode_document(left, ENC)])
        assert left.doc_id in sh.call(0, "documents") and left.doc_id not in sh
        assert_identical(ref, ShardedPipeline(sh, cfg).retrieve_batch(qs), "with a leftover")
        sh.close()
        sh = ShardedIndex.open(tmp_path / "grown", ENC)
        assert left.doc_id not in sh.call(0, "documents")
        assert sh.documents == single.documents
        assert_identical(ref, ShardedPipeline(sh, cfg).retrieve_batch(qs), "reopened")
        with pytest.raises(ValueError, match="already in the sharded index"):
            sh.add_documents([extra])
    finally:
        sh.close()


# -- failures --------------------------------------------------------------------------------------

def test_a_shard_killed_mid_query_raises_or_retries_never_partial(sharded, single):
    qs = questions()[:4]
    cfg = PipelineConfig(kd=8, recall_ranker="maxsim")
    ref = Pipeline(single, ENC, cfg).retrieve_batch(qs)
    victim = sharded.map.shard_of(ref[0].documents[0][0])  # a shard the gather must read
    killed = []

    def kill_once(stage):
        if stage == "recall" and not killed:
            killed.append(victim)
            actor = sharded.actors[victim]
            pid = ray.get(actor.ping.remote())
            ray.kill(actor)
            # ray.kill is asynchronous: wait until the actor's process is gone (Ray may call the
            # actor dead a moment before its process exits, and the direct connection reaches
            # the process), so the query's next call to it is the one that meets a dead actor
            for _ in range(200):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the killed actor's process is still running")
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.ping.remote(), timeout=5)

    no_retry = ShardedPipeline(sharded, cfg, retries=0, doc_cache=0, view_cache=0, on_stage=kill_once)
    with pytest.raises(ShardUnavailableError, match=f"shard {victim}") as err:
        no_retry.retrieve_batch(qs)
    assert err.value.shard == victim and killed == [victim]
    with pytest.raises(ShardUnavailableError):  # still dead: the next batch fails at stage 1
        ShardedPipeline(sharded, cfg, retries=0).retrieve_batch(qs)
    before = sharded.restarts[victim]
    retried = ShardedPipeline(sharded, cfg, retries=1, doc_cache=0, view_cache=0)
    assert_identical(ref, retried.retrieve_batch(qs), "after restart")
    assert sharded.restarts[victim] == before + 1 and retried.stats["retries"] == 1

    killed.clear()
    again = ShardedPipeline(sharded, cfg, retries=1, doc_cache=0, view_cache=0, on_stage=kill_once)
    assert_identical(ref, again.retrieve_batch(qs), "killed mid-query, retried")
    assert again.stats["retries"] == 1 and killed == [victim]

    # a shard that does not answer in time counts as lost (no retries: the error, no results)
    with pytest.raises(ShardUnavailableError, match="TimeoutError"):
        ShardedPipeline(sharded, cfg, retries=0, timeout_s=1e-6).retrieve_batch(qs)
    # the late answers of that call are never read as the next call's (its connections were dropped)
    assert_identical(ref, ShardedPipeline(sharded, cfg, retries=0, doc_cache=0).retrieve_batch(qs), "after a timeout")


def test_bad_input_is_named(sharded, tmp_path):
    with pytest.raises(TypeError, match="sharded"):
        ShardedPipeline("not an index")
    with pytest.raises(ValueError, match="retries"):
        ShardedPipeline(sharded, retries=-1)
    with pytest.raises(ValueError, match="timeout_s"):
        ShardedPipeline(sharded, timeout_s=0)
    with pytest.raises(ValueError, match="protocol"):
        ShardedPipeline(sharded, protocol="partial")
    with pytest.raises(ValueError, match="gather_from"):
        ShardedPipeline(sharded, gather_from="disk")
    with pytest.raises(TypeError, match="prefetch"):
        ShardedPipeline(sharded, prefetch="yes")
    with pytest.raises(TypeError, match="direct"):
        ShardedIndex.open(sharded.root, ENC, direct="yes")
    with pytest.raises(ValueError, match="encoders"):
        ShardedIndex.open(sharded.root, Encoders.offline(text_dim=64))
    with pytest.raises(ValueError, match="sharded index"):
        ShardedIndex.create(sharded.root, ENC, 2)
    with pytest.raises(ValueError, match="cannot be read"):
        ShardedIndex.open(tmp_path / "nothing", ENC)
    with pytest.raises(TypeError, match="queries"):
        ShardedPipeline(sharded).retrieve_batch("a question, not a list")


# -- the top-Kd protocol's exactness (no Ray) -----------------------------------------------------

@pytest.mark.parametrize("fusion", ["rrf", "weighted"])
def test_top_lists_merge_to_the_full_fusion_or_say_undecided(fusion):
    from colgraph_engine.distributed.fusion import fuse, fuse_top, merge_top
    from colgraph_engine.distributed.shard import _top_lists
    import torch
    gen = torch.Generator().manual_seed(7)
    decided = 0
    for trial in range(60):
        n_docs, nq, kd = 40, 5, [1, 3, 10, 50][trial % 4]
        s = torch.randn(nq, n_docs, generator=gen)
        if trial % 3 == 0:
            s = (s * 4).round() / 4          # many exact ties
        if trial % 5 == 0:
            s = 1.0 + 1e-7 * torch.randn(nq, n_docs, generator=gen)  # float32 ties after min-max
        s[torch.rand(nq, n_docs, generator=gen) < 0.2] = -torch.inf   # documents without units
        shard_of = torch.randint(0, 3, (n_docs,), generator=gen).numpy()
        rows = np.arange(nq)
        cfg = PipelineConfig(kd=kd, fusion=fusion, recall_ranker="maxsim")
        full = fuse(nq, [("text", rows, s, 11)], n_docs, cfg)
        tops, col2pos = [], []
        for j in range(3):
            cols = np.flatnonzero(shard_of == j)
            cols = cols[torch.randperm(cols.size, generator=gen).numpy()]  # a shard's order is not the global one
            tops.append(_top_lists(s[:, torch.from_numpy(cols)], kd))
            col2pos.append(cols)
        got = fuse_top(nq, [merge_top("text", rows, tops, col2pos, 11)], n_docs, cfg)
        if got is None:
            assert fusion == "weighted"
            continue
        decided += 1
        for a, b in zip(full.docs, got.docs):
            assert a.tolist() == b.tolist()
        for a, b in zip(full.scores, got.scores):
            assert a.tobytes() == b.tobytes()
        assert full.units == got.units and full.sides == got.sides
    assert decided >= 40


# -- the gather: bundles, rows read from the shards' files, documents shipped with stage 1 ---------

def _assert_same_graph(a, b):
    import dataclasses
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y, equal_nan=True), f.name
        else:
            assert list(x) == list(y) if f.name.endswith(("name", "type", "text", "source", "keywords")) else x == y, f.name


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_bundles_carry_every_document_exactly(docs, tmp_path, dtype_name):
    """No Ray: a shard in this process packs documents (rows as bytes, or where they lie in its
    vector files); unpacking gives every graph field, item id, offset and row back unchanged."""
    import torch
    from colgraph_engine.distributed.bundle import pack_documents, unpack_documents
    from colgraph_engine.distributed.gather import FileRows, RowFiles
    from colgraph_engine.distributed.shard import Shard
    from colgraph_engine.distributed.bundle import PartRef
    from colgraph_engine.kg.parts import MappedPart
    dtype = getattr(torch, dtype_name)
    KnowledgeIndex.create(tmp_path / "one", ENC, dtype=dtype).add_documents(docs[:9])
    shard = Shard(tmp_path / "one")  # its documents are read from the part file (mapped)
    held = build_document_graph(docs[9])
    shard.add([held], [encode_document(held, ENC)])  # this one is held in memory: it travels whole
    ids = [held.doc_id] + shard.documents()[::-1][:6]  # any order
    files = RowFiles()
    for by_file in (False, True):
        got = unpack_documents(shard.gather_documents(ids, by_file))
        assert [g.doc_id for g, _ in got] == ids
        for d, (graph, vectors) in zip(ids, got):
            assert isinstance(graph, PartRef) == (by_file and d != held.doc_id)
            if isinstance(graph, PartRef):  # the same file the shard reads (header sha256 checked)
                graph = MappedPart(Path(graph.path), shard.index.dims, dtype, header_sha256=graph.header_sha256
                                   ).document(graph.pos)
            _assert_same_graph(shard.index.document(d), graph)
            want = shard.stored_documents([d])[0][1]
            assert sorted(vectors) == sorted(want)
            for store, (local, rows, offsets) in vectors.items():
                assert isinstance(rows, FileRows) == by_file
                if by_file:
                    rows = files.rows(rows, dtype)
                w_local, w_values, w_offsets = want[store]
                assert np.array_equal(local, w_local) and np.array_equal(offsets, w_offsets)
                assert rows.dtype == w_values.dtype and np.array_equal(rows, w_values)
        bundle = shard.gather_documents(ids, by_file)
        some = unpack_documents(bundle, [3, 0])  # only these documents, in this order
        for (a, va), (b, vb) in zip(some, [unpack_documents(bundle)[i] for i in (3, 0)]):
            assert a.doc_id == b.doc_id and sorted(va) == sorted(vb)
    # graphs holding plain lists (built in this process) pack the same way
    built = [build_document_graph(d) for d in docs[:3]]
    for a, (b, _) in zip(built, unpack_documents(pack_documents(built, {}))):
        _assert_same_graph(a, b)


def test_row_files_name_what_they_cannot_read(tmp_path):
    from colgraph_engine.distributed.gather import FileRows, RowFiles
    import torch
    path = tmp_path / "entity.0123456789abcdef.bin"
    np.arange(12, dtype=np.float32).tofile(path)  # 3 rows of 4
    files = RowFiles()
    assert files.rows(FileRows(str(path), 1, 3, 4), torch.float32).tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]]
    with pytest.raises(ValueError, match="holds 3 rows"):
        files.rows(FileRows(str(path), 2, 5, 4), torch.float32)
    with pytest.raises(OSError):
        files.rows(FileRows(str(tmp_path / "gone.bin"), 0, 1, 4), torch.float32)
    (tmp_path / "region.0123456789abcdef.bin").touch()  # an empty store's file: no rows to map
    assert files.rows(FileRows(str(tmp_path / "region.0123456789abcdef.bin"), 0, 0, 4), torch.float32).shape == (0, 4)
    # many runs, two files, any order: one read per file, each run its own rows, none a view of a mapping
    other = tmp_path / "segment.0123456789abcdef.bin"
    np.arange(100, 116, dtype=np.float32).tofile(other)  # 2 rows of 8
    refs = [FileRows(str(path), 2, 3, 4), FileRows(str(other), 0, 2, 8), FileRows(str(path), 0, 0, 4),
            FileRows(str(path), 0, 2, 4)]
    got = files.rows_many(refs, torch.float32)
    assert [g.tolist() for g in got] == [files.rows(r, torch.float32).tolist() for r in refs]
    assert all(not isinstance(g, np.memmap) and (g.base is None or not isinstance(g.base, np.memmap)) for g in got)
    with pytest.raises(OSError):
        files.rows_many([FileRows(str(tmp_path / "gone.bin"), 0, 1, 4)], torch.float32)


def test_gather_paths_and_shipping_give_identical_results(sharded, single):
    qs = [q for q in questions() if not isinstance(q, Query) or q.image is None]
    cfg = PipelineConfig(kd=5, recall_ranker="maxsim")
    ref = Pipeline(single, ENC, cfg).retrieve_batch(qs)
    for gather_from in ("files", "ray", "auto"):
        for prefetch in (True, False):
            pipe = ShardedPipeline(sharded, cfg, gather_from=gather_from, prefetch=prefetch, doc_cache=0, view_cache=0)
            for _ in range(2):  # the first batch learns the shards' documents (every score), the second takes top lists
                assert_identical(ref, pipe.retrieve_batch(qs), f"{gather_from} prefetch={prefetch}")
            one = [pipe.retrieve(q) for q in qs[:3]]  # single queries: documents shipped with stage 1
            assert_identical(ref[:3], one, f"{gather_from} prefetch={prefetch}, one at a time")
            st = pipe.stats
            assert (st["bytes_read"] > 0) == (gather_from != "ray") and (st["bytes_fetched"] > 0) == (gather_from == "ray")
            assert (st["documents_shipped"] > 0) == (prefetch and gather_from != "ray"), st
            assert set(pipe.last_spans) >= {"scatter", "fetch", "build", "stages"}
            assert all(v >= 0 for v in pipe.last_spans.values())
            if prefetch and gather_from != "ray":
                assert pipe.last_spans["fetch"] < pipe.last_spans["scatter"]
    with pytest.raises(ValueError, match="gather_from"):
        ShardedPipeline(sharded, gather_from="disk")


def test_ray_calls_and_direct_connections_give_identical_results(sharded, single):
    """The query path's calls as Ray actor calls (``direct=False``) and over the direct
    connections (the default) give the same results; the connections serve only the query path."""
    qs = [q for q in questions() if not isinstance(q, Query) or q.image is None]
    ref = Pipeline(single, ENC, PipelineConfig(kd=5, recall_ranker="maxsim")).retrieve_batch(qs)
    assert sharded.direct is True
    try:
        for direct in (False, True):
            sharded.direct = direct
            pipe = ShardedPipeline(sharded, PipelineConfig(kd=5, recall_ranker="maxsim"), doc_cache=0, view_cache=0,
                                   prefetch=False)
            for _ in range(2):
                assert_identical(ref, pipe.retrieve_batch(qs), f"direct={direct}")
            assert_identical(ref[:2], [pipe.retrieve(q) for q in qs[:2]], f"direct={direct}, one at a time")
        assert all(sharded.channels.has(i) for i in range(sharded.map.n_shards))
        with pytest.raises(ValueError, match="'add' is not served"):
            sharded.channels.call_many({0: ("add", ([], []))})
    finally:
        sharded.direct = True


def test_a_driver_that_cannot_see_the_shard_files_falls_back_to_bytes(ray_session, single, tmp_path):
    """The shards keep serving from their open (mapped) directory after it moved away: the
    paths they name do not exist on the driver, as on a driver without the shards' file system."""
    sh = ShardedIndex.from_index(single, tmp_path / "here", 2)
    try:
        qs = questions()[:4]
        cfg = PipelineConfig(kd=6, recall_ranker="maxsim")
        ref = Pipeline(single, ENC, cfg).retrieve_batch(qs)
        shipped = ShardedPipeline(sh, cfg, gather_from="ray", doc_cache=0, view_cache=0)
        shipped.retrieve_batch(qs)  # learns the shards' document lists (rows as bytes: no file mapped yet)
        (tmp_path / "here").rename(tmp_path / "elsewhere")
        with pytest.raises(ValueError, match="gather_from='files'"):
            ShardedPipeline(sh, cfg, gather_from="files").retrieve_batch(qs)
        auto = ShardedPipeline(sh, cfg)
        assert_identical(ref, auto.retrieve_batch(qs), "auto, files unreadable")
        assert auto.stats["bytes_fetched"] > 0 and auto.stats["bytes_read"] == 0
        assert auto._files_ok == {0: False, 1: False}
        shipped.gather_from = "auto"  # now stage 1 ships row ranges the driver cannot read: fetched as bytes
        text = [q for q in qs if isinstance(q, str)][0]
        assert summary(shipped.retrieve(text)) == summary(Pipeline(single, ENC, cfg).retrieve(text))
        assert shipped.stats["documents_shipped"] == 0 and shipped._files_ok == {0: False, 1: False}
    finally:
        sh.close()


def test_row_files_keep_one_mapping_per_store_of_a_shard(tmp_path):
    """A removal writes a store's rows to a new file: mapping it drops the old file's mapping
    (its disk space is freed once nothing else holds it), other stores and shards keep theirs."""
    from colgraph_engine.distributed.gather import FileRows, RowFiles
    import torch
    for name in ("a/vectors/entity.01.bin", "a/vectors/entity.02.bin", "a/vectors/segment.03.bin",
                 "b/vectors/entity.04.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        np.ones(8, np.float32).tofile(tmp_path / name)
    files = RowFiles()
    first = files.rows(FileRows(str(tmp_path / "a/vectors/entity.01.bin"), 0, 2, 4), torch.float32)
    for name in ("a/vectors/segment.03.bin", "b/vectors/entity.04.bin", "a/vectors/entity.02.bin"):
        files.rows(FileRows(str(tmp_path / name), 0, 1, 4), torch.float32)
    assert sorted(Path(p).relative_to(tmp_path).as_posix() for p in files._maps) == [
        "a/vectors/entity.02.bin", "a/vectors/segment.03.bin", "b/vectors/entity.04.bin"]
    assert first.tolist() == [[1.0] * 4] * 2  # a slice handed out stays readable


def test_stage_one_does_not_ship_what_the_driver_caches(sharded, single):
    text = [q for q in questions() if isinstance(q, str)][:3]
    cfg = PipelineConfig(kd=4, recall_ranker="maxsim")
    pipe = ShardedPipeline(sharded, cfg, view_cache=0)
    pipe.retrieve_batch(text)  # learns the shards' document lists (and caches the documents)
    for q in text:  # the same queries again: every recalled document is cached, none shipped or fetched
        before = dict(pipe.stats)
        assert summary(pipe.retrieve(q)) == summary(Pipeline(single, ENC, cfg).retrieve(q))
        assert pipe.stats["documents_shipped"] == before["documents_shipped"]
        assert pipe.stats["documents_fetched"] == before["documents_fetched"]
    cols = pipe._held_columns(0)
    assert cols and all(pipe._known[0]["doc_ids"][c] in {d for d, _ in pipe._docs} for c in cols)
    # the shard leaves the held columns out of what it ships
    import pickle
    e = pipe._encoder.encode([text[0]])
    payload = {"text": (e["text"][0].numpy(), e["text"][1].numpy(), np.arange(1))}
    known = pipe._known[0]["version"]
    ids = pickle.loads(sharded.call(0, "recall_scores", payload, cfg.recall_ranker, known, cfg.kd, [], True)["docs"])["ids"]
    col_of = {d: c for c, d in enumerate(pipe._known[0]["doc_ids"])}
    fewer = sharded.call(0, "recall_scores", payload, cfg.recall_ranker, known, cfg.kd, [], True, [col_of[ids[0]]])
    assert ids and pickle.loads(fewer["docs"])["ids"] == ids[1:]


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_the_gathered_index_equals_one_built_by_add_documents(docs, tmp_path, dtype_name):
    """No Ray: the per-query gathered index (stores adopted without checks, aliases through the
    cached key) holds what ``add_documents`` builds from the same documents in the same order:
    every store snapshot (values, offsets, ids, alive, id lookup), the merged graph's arrays,
    aliases and node names, node uids and the view's per-store arrays."""
    import torch
    from colgraph_engine.distributed.bundle import unpack_documents
    from colgraph_engine.distributed.gather import RowFiles, gathered_index
    from colgraph_engine.distributed.shard import Shard
    from colgraph_engine.kg.parts import MappedPart
    from colgraph_engine.pipeline.view import IndexView
    dtype = getattr(torch, dtype_name)
    KnowledgeIndex.create(tmp_path / "one", ENC, dtype=dtype).add_documents(docs)
    shard = Shard(tmp_path / "one")
    ids = shard.documents()[3::2]  # a subset with gaps, in the shard's order
    files, items = RowFiles(), []
    for graph, vectors in unpack_documents(shard.gather_documents(ids, by_file=True)):
        graph = MappedPart(Path(graph.path), shard.index.dims, dtype, header_sha256=graph.header_sha256).document(graph.pos)
        items.append((graph, {s: (local, np.array(files.rows(rows, dtype)), off) for s, (local, rows, off) in vectors.items()}))
    got = gathered_index(ENC, dtype, items)
    want = KnowledgeIndex(ENC, dtype=dtype)
    want.add_documents([g for g, _ in items], [_item_vectors(shard, g.doc_id, dtype) for g, _ in items])
    assert list(got.stores) == list(want.stores) and got.documents == want.documents
    for name in want.stores:
        a, b = got.stores[name].snapshot(), want.stores[name].snapshot()
        for field in ("values", "offsets", "ids", "alive"):
            assert torch.equal(getattr(a, field), getattr(b, field)), (name, field)
        assert (a.next_id, a.n_live) == (b.next_id, b.n_live)
        assert all(torch.equal(x, y) for x, y in zip(a.lookup(), b.lookup())), name
    ga, gb = got.graph, want.graph
    assert np.array_equal(ga.node_kind, gb.node_kind) and np.array_equal(ga.node_doc, gb.node_doc)
    assert all(np.array_equal(x, y) for x, y in zip(ga.edges(), gb.edges()))
    assert np.array_equal(ga.alias_of, gb.alias_of) and (ga.alias_of >= 0).any()  # groups exist and match
    assert list(ga.node_names) == list(gb.node_names)
    assert np.array_equal(got.node_uid(), want.node_uid()) and np.array_equal(got.edge_uid(), want.edge_uid())
    # the gathered view takes each store's slots from the fill (store_layout), the other derives them
    assert all(got.store_layout(n) is not None for n in got.stores) and want.store_layout("entity") is None
    va, vb = IndexView(got), IndexView(want)
    for name in vb.stores:
        for field in ("doc", "local", "node", "numbers", "first_slot"):
            x, y = getattr(va.stores[name], field), getattr(vb.stores[name], field)
            assert np.array_equal(x, y) and x.dtype == y.dtype, (name, field)


def _item_vectors(shard, doc_id, dtype):
    from colgraph_engine.distributed.gather import item_vectors
    return item_vectors(shard.stored_documents([doc_id])[0][1], dtype)


def test_string_columns_and_node_names_take_positions():
    from colgraph_engine.graph.knowledge_graph import NodeNames
    from colgraph_engine.kg.strings import StringColumn
    words = ["Fuji", "", "Mont Blanc", "Ærø", "k2", "Lhotse"]
    col = StringColumn.from_strings(words)
    assert col.take([4, 0, 3]) == ["k2", "Fuji", "Ærø"] and col.take([]) == []
    assert col[2:5].take([0, 2]) == ["Mont Blanc", "k2"]  # a slice shares the blob: offsets need not start at 0
    with pytest.raises(IndexError):
        col.take([6])
    names = NodeNames()
    names.extend(col[:2])
    names.extend(["x", "y"])  # a plain list chunk
    names.extend(col[3:])
    assert names.take([0, 1, 2, 3, 4, 6]) == ["Fuji", "", "x", "y", "Ærø", "Lhotse"]
    assert names.take(np.arange(len(names))) == list(names)
    with pytest.raises(IndexError):
        names.take([len(names)])


def test_sharded_prefilter_recall_is_the_fusion_of_every_shards_own_prefilter(ray_session, docs, tmp_path):
    """``recall_ranker="prefilter"`` on shards: each shard scores its recall stores through the
    prefilter its own index carries (trained on its tokens), the driver fuses the columns. The
    reference opens each shard directory in this process and runs the single-index recall
    scoring (``_side_scores``) with the same config: documents and fused scores equal; every
    shard names its path; stages 2-7 run as for any recall (the rest of the result is the
    gathered index's, as for the exact rankers)."""
    import torch
    from colgraph_engine.distributed.fusion import fuse, side_rows
    from colgraph_engine.pipeline.recall import TEXT_STORES, _side_scores
    from colgraph_engine.pipeline.view import IndexView
    single = KnowledgeIndex(ENC)
    single.add_documents(docs)
    sh = ShardedIndex.from_index(single, tmp_path / "pf", 2)
    try:
        info = sh.enable_prefilter(["segment"], nbits=2, min_tokens=64)
        assert [i["segment"].startswith("built") for i in info] == [True, True]
        cfg = PipelineConfig(kd=5, recall_ranker="prefilter", prefilter_mode="prefilter", prefilter_units=16)
        qs = [q for q in questions() if not isinstance(q, Query) or q.image is None]
        got = ShardedPipeline(sh, cfg, doc_cache=0, view_cache=0).retrieve_batch(qs)
        # the reference: the same scoring per shard directory, fused in the global order
        enc = Pipeline(KnowledgeIndex(ENC), ENC, cfg).encode(qs)
        order = sh.map.order()
        rows = side_rows(cfg, enc["has_image"], enc["image"])["text"]
        scores = torch.full((rows.size, len(order["ids"])), -torch.inf)
        paths = []
        for i in range(sh.map.n_shards):
            view = IndexView(KnowledgeIndex.open(sh.shard_path(i), None))
            assert view.index.prefilter("segment") is not None
            best, units = _side_scores(view, TEXT_STORES, *enc["text"], "prefilter", rows, cfg, paths)
            listed = [c for c, d in enumerate(view.doc_ids) if sh.map.shard_of(d) == i]
            scores[:, [order["position"][view.doc_ids[c]] for c in listed]] = best[:, listed]
        want = fuse(len(qs), [("text", rows, scores, 0)], len(order["ids"]), cfg)
        assert any(p.startswith("segment: prefilter") for p in paths)
        for r, d, s in zip(got, want.docs, want.scores):
            assert [x for x, _ in r.documents] == [order["ids"][p] for p in d.tolist()]
            assert np.allclose([y for _, y in r.documents], s)
            seg = r.counts["recall"]["paths"]["segment"]
            assert seg.count("shard ") == 2 and "prefilter" in seg, seg
        # the exact ranker on the same shards still equals the single-process pipeline
        exact = PipelineConfig(kd=5, recall_ranker="maxsim")
        assert_identical(Pipeline(single, ENC, exact).retrieve_batch(qs),
                         ShardedPipeline(sh, exact, doc_cache=0, view_cache=0).retrieve_batch(qs), "exact after enabling")
        with pytest.raises(ValueError, match="nbits"):
            sh.enable_prefilter(["segment"], nbits=3)
        with pytest.raises(TypeError, match="stores"):
            sh.enable_prefilter("segment")
        assert all(i["stores"]["segment"]["state"] == "built" and i["nbits"] == 2  # nothing changed by the refusals
                   for i in (KnowledgeIndex.open(sh.shard_path(j), None).prefilter_info() for j in range(2)))
    finally:
        sh.close()


def test_shards_on_one_machine_split_its_cores_unless_told(ray_session, single, tmp_path):
    """Every shard of the local Ray instance is on this machine: each gets cores // shards native
    threads; a thread count in the actors' environment is kept; a restarted shard takes its share."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    # the local Ray workers inherit this process's environment: a suite run with
    # COLGRAPH_NUM_THREADS set has told every shard its count already
    told_here = os.environ.get("COLGRAPH_NUM_THREADS")
    share, alone = (int(told_here),) * 2 if told_here else (max(1, cores // 2), cores)
    sh = ShardedIndex.from_index(single, tmp_path / "split", 2)
    try:
        assert sh.shard_threads == [share] * 2
        sh.restart(1)
        assert sh.shard_threads == [share] * 2
        assert sh.call(0, "share_cores", 1) == alone  # alone on the machine: every core, unless told
        with pytest.raises(ValueError, match="shards_here"):
            sh.call(0, "share_cores", 0)
    finally:
        sh.close()
    told = ShardedIndex.open(tmp_path / "split", ENC, actor_options={
        "runtime_env": {"env_vars": {"COLGRAPH_NUM_THREADS": "3"}}})
    try:
        assert told.shard_threads == [3, 3]
    finally:
        told.close()
