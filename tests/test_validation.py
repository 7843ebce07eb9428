"""Bad input raises TypeError/ValueError naming the argument; nothing is mutated."""
import numpy as np
import pytest
import torch

import colgraph_engine as cg

from .conftest import random_packed

QV, QO = random_packed([3, 2], 8, seed=1)
XV, XO = random_packed([4, 1, 5], 8, seed=2)


def _call(op, **over):
    args = dict(queries_values=QV, queries_offsets=QO, docs_values=XV, docs_offsets=XO)
    args.update(over)
    if op == "maxsim":
        return cg.maxsim(**args)
    if op == "topk":
        return cg.maxsim_topk(**args, k=over.pop("k", 2) if "k" in over else 2)
    return cg.maxsim_candidates(**args, cand_offsets=torch.tensor([0, 1, 2]), cand_ids=torch.tensor([0, 2]))


BAD = [
    ("queries_values", QV.numpy(), TypeError, "queries_values"),
    ("queries_values", QV.to(torch.int32), TypeError, "queries_values"),
    ("queries_values", QV.double(), TypeError, "queries_values"),
    ("queries_values", QV[:, :4].contiguous(), ValueError, "dimension"),
    ("queries_values", QV.reshape(-1), ValueError, "queries_values"),
    ("docs_values", XV.bfloat16(), TypeError, "dtype"),
    ("queries_offsets", QO.int(), TypeError, "queries_offsets"),
    ("queries_offsets", [0, 3, 5], TypeError, "queries_offsets"),
    ("queries_offsets", torch.tensor([0, 4, 3, 5]), ValueError, "non-decreasing"),
    ("queries_offsets", torch.tensor([1, 3, 5]), ValueError, r"offsets\[0\] == 0"),
    ("queries_offsets", torch.tensor([0, 3, 6]), ValueError, r"offsets\[-1\] == 5"),
    ("docs_offsets", torch.tensor([0, 4, 5, 11]), ValueError, "docs_offsets"),
    ("docs_offsets", XO.to("meta"), ValueError, "device"),
    ("docs_values", XV.to("meta"), ValueError, "device"),
]


@pytest.mark.parametrize("op", ["maxsim", "topk", "candidates"])
@pytest.mark.parametrize("arg,value,exc,needle", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_packed_input_names_the_argument(op, arg, value, exc, needle):
    with pytest.raises(exc, match=needle):
        _call(op, **{arg: value})


@pytest.mark.parametrize("k,exc", [(0, ValueError), (-3, ValueError), (2.0, TypeError), (True, TypeError), ("5", TypeError)])
def test_topk_rejects_bad_k(k, exc):
    with pytest.raises(exc, match="k"):
        cg.maxsim_topk(QV, QO, XV, XO, k)


@pytest.mark.parametrize("co,ci,exc,needle", [
    (torch.tensor([0, 1, 2]), torch.tensor([0, 3]), ValueError, r"cand_ids.*\[0, 3\)"),
    (torch.tensor([0, 1, 2]), torch.tensor([-1, 0]), ValueError, "cand_ids"),
    (torch.tensor([0, 2]), torch.tensor([0, 1]), ValueError, "n_queries"),
    (torch.tensor([0, 2, 1]), torch.tensor([0, 1]), ValueError, "cand_offsets"),
    (torch.tensor([0, 1, 2]), torch.tensor([0, 1], dtype=torch.int32), TypeError, "cand_ids"),
    (torch.tensor([0, 1, 2]), np.array([0, 1]), TypeError, "cand_ids"),
    (torch.tensor([0, 1, 3]), torch.tensor([0, 1]), ValueError, "cand_offsets"),
])
def test_bad_candidates(co, ci, exc, needle):
    with pytest.raises(exc, match=needle):
        cg.maxsim_candidates(QV, QO, XV, XO, co, ci)


def test_bad_flags_and_backend_names():
    with pytest.raises(TypeError, match="normalize"):
        cg.maxsim(QV, QO, XV, XO, normalize=1)
    with pytest.raises(ValueError, match="backend"):
        cg.maxsim(QV, QO, XV, XO, backend="cuda")
    with pytest.raises(ValueError, match="alive"):
        cg.maxsim_topk(QV, QO, XV, XO, 2, alive=torch.ones(2, dtype=torch.bool))
    with pytest.raises(TypeError, match="alive"):
        cg.maxsim_topk(QV, QO, XV, XO, 2, alive=torch.ones(3))
    with pytest.raises(ValueError, match="chunk_docs"):
        cg.maxsim_topk(QV, QO, XV, XO, 2, chunk_docs=0)


def test_inputs_are_not_modified():
    before = [t.clone() for t in (QV, QO, XV, XO)]
    cg.maxsim(QV, QO, XV, XO, normalize=True)
    cg.maxsim_topk(QV, QO, XV, XO, 2, normalize=True)
    for a, b in zip(before, (QV, QO, XV, XO)):
        assert torch.equal(a, b)


def test_pack_rejects_mixed_items():
    with pytest.raises(ValueError, match=r"items\[1\]"):
        cg.pack([torch.zeros(2, 4), torch.zeros(2, 5)])
    with pytest.raises(TypeError, match=r"items\[1\]"):
        cg.pack([torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.float16)])
    with pytest.raises(TypeError, match=r"items\[0\]"):
        cg.pack([np.zeros((2, 4))])
    with pytest.raises(ValueError, match="items"):
        cg.pack([])
