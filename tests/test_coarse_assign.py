"""Two-level centroid assignment (prefilter/coarse.py) against exact assignment (kmeans.assign)."""
import pytest
import torch
import torch.nn.functional as F

from colgraph_engine.prefilter import build, coarse, kmeans


def _clustered(n_points: int, n_centres: int, d: int, noise: float, seed: int):
    """Unit points around unit centres that share directions (topics), so centroids have near
    neighbours and nearest-centroid ties are close, as for real token vectors."""
    g = torch.Generator().manual_seed(seed)
    topics = F.normalize(torch.randn(n_centres // 16, d, generator=g), dim=1)
    centres = F.normalize(topics.repeat_interleave(16, 0) + 0.6 * torch.randn(n_centres, d, generator=g), dim=1)
    pick = torch.randint(0, n_centres, (n_points,), generator=g)
    return F.normalize(centres[pick] + noise * torch.randn(n_points, d, generator=g), dim=1), centres


@pytest.fixture(scope="module")
def corpus():
    """Tight clusters: two-level assignment agrees with exact at a small list count."""
    points, centres = _clustered(16384, 2048, 32, 0.05, 0)
    centroids = kmeans.kmeans(points, 2048, seed=0, two_level=False)
    return points, centroids


@pytest.fixture(scope="module")
def noisy():
    """Noise as large as the centres' spread: no list count within the work cap agrees enough."""
    points, centres = _clustered(16384, 2048, 32, 0.25, 0)
    centroids = kmeans.kmeans(points, 2048, seed=0, two_level=False)
    return points, centroids


def test_group_counts_follow_the_square_root():
    assert [coarse.default_group_count(c) for c in (1, 3, 2048, 8192, 16384, 65536)] == [1, 2, 64, 128, 128, 256]


def test_lists_hold_every_centroid_in_its_nearest_groups(corpus):
    _, cent = corpus
    g = coarse.group_centroids(cent, listed_in=4)
    assert g.n_groups == 64 and g.starts[0] == 0 and int(g.starts[-1]) == 4 * cent.shape[0]
    counts = torch.bincount(g.listed, minlength=cent.shape[0])
    assert bool((counts == 4).all())
    near = (cent @ g.means.T).topk(4, dim=1).indices
    for gi in (0, 17, 63):
        lst = g.listed[g.starts[gi]:g.starts[gi + 1]]
        assert bool((lst[1:] > lst[:-1]).all())                      # ascending, no repeats
        assert set(lst.tolist()) == set(torch.nonzero((near == gi).any(1)).squeeze(1).tolist())


def test_fitted_groups_agree_with_exact_on_clustered_points(corpus):
    points, cent = corpus
    best, score = kmeans.assign(points, cent)
    groups = coarse.fit_groups(cent, points)
    assert groups is not None
    assert coarse.work_per_point(groups) <= coarse.MAX_WORK_SHARE * cent.shape[0]
    got, got_score = coarse.assign_grouped(points, groups)
    agree = float((got == best).float().mean())
    exact_sq = float((points - cent[best]).pow(2).sum(1).mean())
    got_sq = float((points - cent[got]).pow(2).sum(1).mean())
    # the check sample is a quarter of these points: the whole set lands near the target too
    assert agree >= coarse.TARGET_AGREEMENT - 0.005, agree
    # up to 1.5% of points may take a runner-up centroid: their squared error grows, the mean by ~1%
    assert got_sq <= 1.02 * exact_sq, (got_sq, exact_sq)
    # its score is the chosen centroid's inner product (fp32 products: tolerance for the summation order)
    torch.testing.assert_close(got_score, (points * cent[got]).sum(1), atol=1e-5, rtol=0)
    assert bool((got_score <= score + 1e-5).all())                   # never better than the exact best


def test_fit_stays_exact_where_groups_disagree(noisy):
    points, cent = noisy
    # eight lists a centroid disagree on many points here, so fitting must refuse rather than use them
    got, _ = coarse.assign_grouped(points, coarse.group_centroids(cent, listed_in=8))
    assert float((got == kmeans.assign(points, cent)[0]).float().mean()) < 0.9
    assert coarse.fit_groups(cent, points) is None
    codes, _, _ = build.encode(points, cent, torch.tensor([-0.05, 0.0, 0.05]), 2)
    assert torch.equal(codes.long(), kmeans.assign(points, cent)[0])


def test_every_centroid_in_every_list_is_exact(corpus):
    points, cent = corpus
    best, score = kmeans.assign(points[:4000], cent)
    g = coarse.group_centroids(cent, n_groups=8, listed_in=8)
    got, got_score = coarse.assign_grouped(points[:4000], g)
    second = (points[:4000] @ cent.T).topk(2, dim=1).values
    clear = (second[:, 0] - second[:, 1]) > 1e-5                     # no near tie the summation order could flip
    assert bool((got[clear] == best[clear]).all())
    torch.testing.assert_close(got_score, score, atol=1e-5, rtol=0)


def test_a_group_no_centroid_lists_falls_back_to_exact(corpus):
    points, cent = corpus
    g = coarse.group_centroids(cent, n_groups=4, listed_in=1)
    # empty group 0's list: its points must still get their exact centroid
    cut = int(g.starts[1])
    emptied = coarse.CentroidGroups(g.centroids, g.means, g.listed[cut:],
                                    torch.cat([torch.zeros(2, dtype=torch.int64), g.starts[2:] - cut]))
    x = points[:3000]
    nearest = (x @ g.means.T).argmax(1)
    got, _ = coarse.assign_grouped(x, emptied)
    best, _ = kmeans.assign(x, cent)
    in_zero = nearest == 0
    assert int(in_zero.sum()) > 0
    assert bool((got[in_zero] == best[in_zero]).all())


def test_worthwhile_only_with_many_centroids_and_points():
    cent = torch.zeros(2048, 8)
    assert coarse.worthwhile(4 * 2048, cent)
    assert not coarse.worthwhile(4 * 2048 - 1, cent)
    assert not coarse.worthwhile(10**6, torch.zeros(2047, 8))


def test_encode_uses_fitted_groups_above_the_switch(corpus):
    points, cent = corpus
    cutoffs = torch.tensor([-0.05, 0.0, 0.05])
    codes, packed, sq = build.encode(points, cent, cutoffs, 2)
    want, _ = coarse.assign_grouped(points, coarse.fit_groups(cent, points))
    assert torch.equal(codes.long(), want)
    assert sq == pytest.approx(float((points - cent[want]).pow(2).sum()), rel=1e-4)
    # below the switch (fewer than 4 points a centroid) the assignment is exact
    few = points[:1000]
    codes_few, _, _ = build.encode(few, cent, cutoffs, 2)
    assert torch.equal(codes_few.long(), kmeans.assign(few, cent)[0])


def test_build_is_deterministic_with_grouped_kmeans():
    points, _ = _clustered(12000, 4096, 16, 0.3, 1)
    offsets = torch.arange(0, 12001, 40)
    ids = torch.arange(offsets.numel() - 1)
    a = build.build_state(points, offsets, ids, n_centroids=2048, max_points=12000)
    b = build.build_state(points, offsets, ids, n_centroids=2048, max_points=12000)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.codes, b.codes)
    # grouped training loses little against exact training: mean squared residual within 5 %
    exact_cent = kmeans.kmeans(points, 2048, two_level=False)
    exact_sq = float((points - exact_cent[kmeans.assign(points, exact_cent)[0]]).pow(2).sum(1).mean())
    assert a.build_mse <= 1.05 * exact_sq, (a.build_mse, exact_sq)


@pytest.mark.parametrize("kwargs, field", [({"n_groups": 0}, "n_groups"), ({"n_groups": 5000}, "n_groups"),
                                           ({"n_groups": True}, "n_groups"), ({"listed_in": 0}, "listed_in"),
                                           ({"listed_in": 2.0}, "listed_in")])
def test_bad_group_settings_name_the_argument(corpus, kwargs, field):
    with pytest.raises(ValueError, match=field):
        coarse.group_centroids(corpus[1], **kwargs)
