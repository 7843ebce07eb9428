"""RowParts: several tensors read as one packed [T, d] (a prefilter rebuild reads the store's
rows and a commit's added rows in place), and builds over parts equal builds over the join."""
import numpy as np
import pytest
import torch

from colgraph_engine.prefilter import PrefilterIndex
from colgraph_engine.prefilter.row_parts import RowParts, rows, take


@pytest.fixture
def parts():
    g = torch.Generator().manual_seed(3)
    return [torch.randn(n, 16, generator=g).half() for n in (700, 0, 1, 333)]


def test_rows_and_take_read_what_the_join_holds(parts):
    whole = torch.cat(parts)
    rp = RowParts(parts)
    assert rp.shape == whole.shape and len(rp) == 1034 and rp.dtype == torch.float16
    for a, b in ((0, 1034), (0, 700), (650, 760), (700, 701), (701, 1034), (1000, 5000), (1034, 1040), (-3, 2)):
        assert torch.equal(rp.rows(a, b), whole[max(a, 0):b]), (a, b)
        assert torch.equal(rows(rp, a, b), rows(whole, max(a, 0), b))
    idx = torch.tensor([1033, 0, 700, 699, 701, 5, 700], dtype=torch.int64)  # any order, repeats
    assert torch.equal(rp.take(idx), whole[idx]) and torch.equal(take(whole, idx), whole[idx])
    assert rp.take(torch.zeros(0, dtype=torch.int64)).shape == (0, 16)


def test_bad_parts_are_refused_with_the_argument_named(parts):
    with pytest.raises(TypeError, match="parts"):
        RowParts(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="parts"):
        RowParts([])
    with pytest.raises(TypeError, match=r"parts\[1\]"):
        RowParts([torch.zeros(2, 4), torch.zeros(4)])
    with pytest.raises(ValueError, match=r"parts\[1\]: expected width 4"):
        RowParts([torch.zeros(2, 4), torch.zeros(2, 5)])
    with pytest.raises(ValueError, match=r"parts\[1\]"):
        RowParts([torch.zeros(2, 4), torch.zeros(2, 4, dtype=torch.float16)])
    bad = [p.clone() for p in parts]
    bad[3][7, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf in row 708"):
        RowParts(bad).check_finite("values")
    with pytest.raises(ValueError, match="documents"):
        PrefilterIndex.build(RowParts(bad), torch.tensor([0, 500, 1034]))


@pytest.mark.parametrize("max_points", [None, 256])   # the whole corpus sampled / a sample
def test_build_over_parts_equals_build_over_the_join(parts, max_points):
    whole = torch.cat(parts)
    offsets = torch.tensor([0, 10, 300, 699, 702, 900, 1034])
    ids = torch.arange(6) * 7
    a = PrefilterIndex.build(RowParts(parts), offsets, ids, n_centroids=32, max_points=max_points).snapshot()
    b = PrefilterIndex.build(whole, offsets, ids, n_centroids=32, max_points=max_points).snapshot()
    for name in ("centroids", "cutoffs", "weights", "codes", "residuals", "cells", "ivf_docs", "ids"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.build_mse == b.build_mse


def test_a_carried_rebuild_reads_the_store_and_the_added_rows_as_parts(tmp_path):
    """An index whose segment prefilter is built by a commit (store rows + added rows) holds
    the same prefilter as one built over the joined rows."""
    from colgraph_engine.kg.index import prefilters as pf
    from colgraph_engine.store import PackedStore
    g = torch.Generator().manual_seed(5)
    docs = [torch.nn.functional.normalize(torch.randn(int(n), 16, generator=g), dim=1).half()
            for n in torch.randint(5, 40, (60,), generator=g)]
    store = PackedStore(dim=16, dtype=torch.float16)
    store.add(docs[:40], ids=torch.arange(40))
    added_vals = torch.cat(docs[40:])
    lens = torch.tensor([d.shape[0] for d in docs[40:]])
    added = (added_vals, torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]), torch.arange(40, 60))
    values, offsets, uids = pf.contents_after(store, added, None)
    assert isinstance(values, RowParts) and len(values.parts) == 2
    settings = pf.PrefilterSettings.checked(("segment",), 2, 64, None, {"segment": 16})
    got = pf.build(settings, values, offsets, uids).snapshot()
    want = PrefilterIndex.build(torch.cat(docs), offsets, uids, nbits=2).snapshot()
    for name in ("centroids", "codes", "residuals", "ivf_docs", "ids"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert np.isclose(got.build_mse, want.build_mse, rtol=0, atol=0)
