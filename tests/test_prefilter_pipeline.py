"""recall_ranker="prefilter": the pipeline's document recall through the centroid prefilter over
the index's recall stores; the path that ran is reported per query and store."""
import numpy as np
import pytest
import torch

from colgraph_engine.demos.corpus import DEMO_QUESTIONS, demo_documents
from colgraph_engine.kg import Encoders, KnowledgeIndex
from colgraph_engine.pipeline import Pipeline, PipelineConfig
from colgraph_engine.pipeline import recall as recall_mod
from colgraph_engine.pipeline.view import IndexView

ENC = Encoders.offline()


@pytest.fixture(scope="module")
def index():
    idx = KnowledgeIndex(ENC)
    idx.add_documents(demo_documents())
    return idx


def _recall(index, **changes):
    cfg = PipelineConfig(recall_side="text").replace(**changes)
    view = IndexView(index)
    q = ENC.tokens([DEMO_QUESTIONS[1]])
    qv, qo = torch.cat(q), torch.tensor([0, q[0].shape[0]])
    return recall_mod.recall_documents(view, (qv, qo), None, np.zeros(1, bool), cfg), view


def test_forced_prefilter_path_finds_the_same_top_document(index):
    exact, _ = _recall(index, kd=3, recall_ranker="maxsim")
    pre, view = _recall(index, kd=3, recall_ranker="prefilter", prefilter_mode="prefilter", prefilter_units=1000,
                        prefilter_budget="plaid")
    assert pre.paths[0]["segment"] == "prefilter (prefilter requested; exact stage on the store)"
    assert exact.paths[0] == {}
    # every unit kept (prefilter_units >= units) and small stores: the same documents as exact MaxSim
    assert list(pre.docs[0]) == list(exact.docs[0])
    assert recall_mod._PREFILTERS[view]   # built once per view and kept


def test_auto_mode_picks_exact_on_a_small_index_and_says_why(index):
    exact, _ = _recall(index, kd=3, recall_ranker="maxsim")
    auto, _ = _recall(index, kd=3, recall_ranker="prefilter")
    why = auto.paths[0]["segment"]
    assert why.startswith("exact (auto:") and "multiply-adds" in why
    assert list(auto.docs[0]) == list(exact.docs[0]) and np.allclose(auto.scores[0], exact.scores[0])


def test_pipeline_runs_with_the_prefilter_ranker(index):
    cfg = PipelineConfig(kd=2, recall_ranker="prefilter", prefilter_mode="prefilter")
    r = Pipeline(index, ENC, cfg).retrieve(DEMO_QUESTIONS[1])
    assert r.documents and r.config.recall_ranker == "prefilter"


def test_exact_stage_on_the_store_scores_units_exactly_and_on_codes_approximately(index):
    """prefilter_exact="store": the shortlisted units' scores are exact MaxSim over the view's
    vectors; "codes": the decoded vectors' scores; the path says which."""
    from colgraph_engine import ops
    _, view = _recall(index, kd=3, recall_ranker="maxsim")
    vec = view.vectors["segment"]
    idx = recall_mod._prefilter_for(view, "segment", 2)
    q = ENC.tokens([DEMO_QUESTIONS[1]])[0]
    qo = torch.tensor([0, q.shape[0]])
    on_store = idx.search(q.float(), qo, 5, rescore=recall_mod._on_vectors(vec, by_uid=False))
    on_codes = idx.search(q.float(), qo, 5)
    want = ops.maxsim(q.to(vec.dtype), qo, vec.values, vec.offsets)[0]
    assert on_store.stats["backend"] == "rescore"
    assert torch.allclose(on_store.scores[0], want[on_store.ids[0]], atol=1e-5)
    # the demo store is tiny (about one centroid per token), so its codes decode nearly exactly too
    assert torch.allclose(on_codes.scores[0], want[on_codes.ids[0]], atol=0.5)
    codes, _ = _recall(index, kd=3, recall_ranker="prefilter", prefilter_mode="prefilter", prefilter_exact="codes")
    assert codes.paths[0]["segment"].endswith("exact stage on the codes)")


@pytest.mark.parametrize("bad,err", [(dict(prefilter_mode="sometimes"), ValueError),
                                     (dict(prefilter_exact="decoded"), ValueError),
                                     (dict(prefilter_nbits=3), ValueError), (dict(prefilter_units=0), ValueError)])
def test_config_validates_the_prefilter_settings(bad, err):
    with pytest.raises(err, match=next(iter(bad))):
        PipelineConfig(**bad)
