import pytest

from mtx.train.schedule import rate


def test_rate_is_the_papers_formula():
    d, w = 512, 4000
    for step in (1, 10, 3999, 4000, 4001, 100_000):
        want = d**-0.5 * min(step**-0.5, step * w**-1.5)
        assert rate(step, d, w) == pytest.approx(want, rel=1e-12)
    assert rate(50, d, w, scale=2.0) == pytest.approx(2 * rate(50, d, w))


def test_rate_peaks_at_warmup():
    rates = [rate(s, 512, 4000) for s in range(1, 20000, 10)]
    peak = max(range(len(rates)), key=rates.__getitem__)
    assert abs((1 + 10 * peak) - 4000) <= 10
    assert rate(4000, 512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)
