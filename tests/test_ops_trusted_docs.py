"""``ops.maxsim_candidates(..., trusted_docs=True)``: the same scores as the fully validated call,
without the pass over the documents' offsets; what it still validates; and the pipeline's
candidate scoring (pipeline/scoring.py) going through it with identical results."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import colgraph_engine as cg
from colgraph_engine import packed
from colgraph_engine.ops import scoring as ops_scoring
from colgraph_engine.pipeline import scoring
from colgraph_engine.pipeline.view import Vectors

from .conftest import random_packed

QV, QO = random_packed([3, 2, 4], 16, seed=11)
XV, XO = random_packed([4, 1, 5, 0, 7, 3], 16, seed=12)
CO = torch.tensor([0, 3, 3, 7])  # the second query lists nothing
CI = torch.tensor([0, 2, 2, 5, 3, 1, 4])  # a repeat, and the empty document 3


def _backends():
    names = ["torch"]
    if cg.backends()["native"]:
        names.append("native")
    return names


@pytest.mark.parametrize("backend", _backends())
def test_trusted_docs_gives_the_same_scores(backend):
    want = cg.maxsim_candidates(QV, QO, XV, XO, CO, CI, backend=backend)
    got = cg.maxsim_candidates(QV, QO, XV, XO, CO, CI, backend=backend, trusted_docs=True)
    assert torch.equal(got, want)
    assert got.shape == (7,) and got[4].item() == float("-inf")  # CI[4]: the empty document
    ref = cg.maxsim(QV, QO, XV, XO, backend="torch")  # [3, 6]: the same pairs gathered
    owner = torch.repeat_interleave(torch.arange(3), CO.diff())
    assert torch.allclose(got, ref[owner, CI], rtol=1e-5, atol=1e-5)


def test_trusted_docs_skips_only_the_offsets_values(monkeypatch):
    seen = []
    real = packed.check_offsets

    def spy(offsets, n_rows, device, name):
        seen.append(name)
        return real(offsets, n_rows, device, name)
    monkeypatch.setattr(packed, "check_offsets", spy)  # check_packed's
    monkeypatch.setattr(ops_scoring, "check_offsets", spy)  # check_candidates'
    cg.maxsim_candidates(QV, QO, XV, XO, CO, CI, backend="torch")
    assert seen == ["queries_offsets", "docs_offsets", "cand_offsets"]
    seen.clear()
    cg.maxsim_candidates(QV, QO, XV, XO, CO, CI, backend="torch", trusted_docs=True)
    assert seen == ["queries_offsets", "cand_offsets"]  # queries and candidates still in full


def test_trusted_docs_does_not_read_the_offsets_values():
    # offsets[0] != 0 is refused by the full check; trusted, the documents are rows 1:5 and 5:8
    xo = torch.tensor([1, 5, 8])
    with pytest.raises(ValueError, match=r"docs_offsets: expected offsets\[0\] == 0"):
        cg.maxsim_candidates(QV, QO, XV[:8], xo, torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1]))
    got = cg.maxsim_candidates(QV, QO, XV[:8], xo, torch.tensor([0, 1, 1, 2]), torch.tensor([0, 1]),
                               backend="torch", trusted_docs=True)
    want = cg.maxsim(QV, QO, XV[1:8], torch.tensor([0, 4, 7]), backend="torch")
    assert torch.allclose(got, torch.stack([want[0, 0], want[2, 1]]))


@pytest.mark.parametrize("over, exc, match", [
    (dict(trusted_docs=1), TypeError, "trusted_docs: expected a bool"),
    (dict(trusted_docs="yes"), TypeError, "trusted_docs"),
    (dict(docs_offsets=XO.int()), TypeError, "docs_offsets: expected dtype torch.int64"),
    (dict(docs_offsets=XO.tolist()), TypeError, "docs_offsets: expected a torch.int64 tensor"),
    (dict(docs_offsets=XO[None]), ValueError, r"docs_offsets: expected shape \[N\+1\]"),
    (dict(docs_offsets=torch.zeros(0, dtype=torch.int64)), ValueError, "docs_offsets"),
    (dict(docs_offsets=XO.to("meta")), ValueError, "docs_offsets: expected device cpu"),
    (dict(docs_values=XV.reshape(-1)), ValueError, r"docs_values: expected shape \[T, d\]"),
    (dict(docs_values=XV.double()), TypeError, "docs_values: expected dtype"),
    (dict(docs_values=XV.bfloat16()), TypeError, "queries_values: expected the documents' dtype"),
    (dict(queries_offsets=torch.tensor([0, 4, 3, 9])), ValueError, "queries_offsets: expected non-decreasing"),
    (dict(cand_ids=torch.tensor([0, 2, 2, 6, 3, 1, 4])), ValueError, r"cand_ids: expected ids in \[0, 6\)"),
    (dict(cand_offsets=torch.tensor([0, 3, 7])), ValueError, "cand_offsets: expected length"),
])
def test_trusted_docs_still_validates(over, exc, match):
    args = dict(queries_values=QV, queries_offsets=QO, docs_values=XV, docs_offsets=XO, cand_offsets=CO,
                cand_ids=CI, trusted_docs=True)
    args.update(over)
    with pytest.raises(exc, match=match):
        cg.maxsim_candidates(**args)


def _vectors(values: torch.Tensor, offsets: torch.Tensor) -> Vectors:
    n = offsets.numel() - 1
    return Vectors(values, offsets, torch.arange(n, dtype=torch.int64) * 3 + 7, torch.ones(n, dtype=torch.bool))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_pipeline_score_pairs_equals_the_validated_op(dtype):
    store = _vectors(XV.to(dtype), XO)
    co, cs = CO.numpy(), CI.numpy()
    got = scoring.score_pairs(store, QV, QO, co, cs, "maxsim")  # queries cast to the store's dtype
    want = cg.maxsim_candidates(QV.to(dtype), QO, store.values, store.offsets, CO, CI).numpy()
    assert got.dtype == np.float32 and np.array_equal(got, want)
    # the private entry point stage_scaling.py swaps out is still the one the stages call
    assert np.array_equal(scoring._candidates_trusted(store, QV, QO, CO, CI).numpy(), want)


def test_pipeline_candidates_bad_input_names_the_argument():
    store = _vectors(XV, XO)
    with pytest.raises(ValueError, match=r"cand_ids: expected ids in \[0, 6\)"):
        scoring.score_pairs(store, QV, QO, CO.numpy(), np.array([0, 2, 2, 6, 3, 1, 4]), "maxsim")
    with pytest.raises(ValueError, match="queries_values: expected dimension d=16"):
        scoring.score_pairs(store, QV[:, :8].contiguous(), QO, CO.numpy(), CI.numpy(), "maxsim")


@pytest.mark.skipif(not cg.backends()["native"], reason="native module not built")
def test_the_native_entry_point_checks_the_offsets_of_the_documents_it_reads():
    """The native call checks each listed document's offsets (in range, non-decreasing), not the
    whole store's: a damaged entry elsewhere is never read, one it would read is refused."""
    from colgraph_engine._native import core
    q, qo = QV[:3].contiguous().numpy(), np.array([0, 3], np.int64)
    x, xo = XV.contiguous().numpy(), XO.numpy().copy()
    ci = np.array([0, 2], np.int64)
    want = np.empty(2, np.float32)
    core.maxsim_candidates(q, qo, x, xo, np.array([0, 2]), ci, want, "float32", 1)
    damaged = xo.copy()
    damaged[5] = damaged[4] - 1  # documents 4 and 5 (offsets 4..6) are not listed
    got = np.empty(2, np.float32)
    core.maxsim_candidates(q, qo, x, damaged, np.array([0, 2]), ci, got, "float32", 1)
    assert np.array_equal(got, want)
    with pytest.raises(ValueError, match="documents offsets: must be non-decreasing"):
        core.maxsim_candidates(q, qo, x, damaged, np.array([0, 1]), np.array([4], np.int64), np.empty(1, np.float32),
                               "float32", 1)
    beyond = xo.copy()
    beyond[3] = xo[-1] + 100  # document 2 would end past the last row
    with pytest.raises(ValueError, match="documents offsets"):
        core.maxsim_candidates(q, qo, x, beyond, np.array([0, 1]), np.array([2], np.int64), np.empty(1, np.float32),
                               "float32", 1)
