"""Which tokenizer window pools each character range (MiniLM's span pooling): the vectorised
assignment equals the plain per-range rule on random layouts (the first window of the range's
text whose real pieces span it; a range no window holds whole reports its group)."""
import numpy as np
import pytest

from colgraph_engine.encoders.minilm import _assign_windows


def per_range(ranges, text_of, spans, special):
    """The rule written one range at a time (the implementation before it was vectorised)."""
    extent = np.zeros((len(spans), 2), dtype=np.int64)
    for w, (sp, mask) in enumerate(zip(spans, special)):
        real = sp[np.asarray(mask, dtype=bool) == 0]
        extent[w] = (real[0, 0], real[-1, 1]) if len(real) else (0, 0)
    window = np.full(len(ranges), -1, dtype=np.int64)
    for r, (_, t, start, end) in enumerate(ranges):
        mine = np.flatnonzero(text_of == t)
        fits = mine[(extent[mine, 0] <= start) & (end <= extent[mine, 1])]
        if fits.size:
            window[r] = fits[0]
    return [ranges[window == w] for w in range(len(spans))], np.unique(ranges[window < 0, 0])


def layout(rng):
    """Texts of 1-3 overlapping windows (the tokenizer's overflow), windows with [CLS]/[SEP]
    and now and then one of special pieces only, and ranges over them."""
    n_texts = int(rng.integers(1, 25))
    windows = rng.integers(1, 4, n_texts)
    text_of = np.repeat(np.arange(n_texts), windows)
    spans, special = [], []
    for t in range(n_texts):
        at = 0
        for _ in range(windows[t]):
            n = int(rng.integers(2, 20))
            sp = np.sort(at + np.cumsum(rng.integers(0, 6, 2 * n))).reshape(n, 2)
            mask = np.zeros(n, int)
            mask[[0, -1]] = 1
            if rng.random() < 0.1:
                mask[:] = 1
            spans.append(sp)
            special.append(mask.tolist())
            at = int(sp[n // 2, 0])  # the next window overlaps this one
    r = int(rng.integers(0, 60))
    start = rng.integers(0, 80, r)
    ranges = np.stack([rng.integers(0, 10, r), rng.integers(0, n_texts, r), start, start + rng.integers(1, 20, r)],
                      1).astype(np.int64).reshape(r, 4)
    return ranges, text_of, spans, special


@pytest.mark.parametrize("seed", range(4))
def test_vectorised_window_assignment_equals_the_per_range_rule(seed):
    rng = np.random.default_rng(seed)
    for _ in range(75):
        args = layout(rng)
        want, want_lost = per_range(*args)
        got, got_lost = _assign_windows(*args)
        assert len(got) == len(want) and np.array_equal(got_lost, want_lost)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_windows_out_of_text_order_are_refused():
    spans = [np.array([[0, 0], [0, 4], [4, 4]])] * 2
    special = [[1, 0, 1]] * 2
    with pytest.raises(ValueError, match="text_of"):
        _assign_windows(np.array([[0, 0, 0, 3]]), np.array([1, 0]), spans, special)
