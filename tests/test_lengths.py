import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slobench.errors import SpecError
from slobench.workload import (
    EmpiricalLength,
    FixedLength,
    LogNormalLength,
    ParetoLength,
    UniformLength,
    ZipfLength,
    length_from_dict,
)

N = 50_000


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def test_lognormal_by_median_and_p99_reproduces_both():
    x = LogNormalLength(1020, 4142, 1, 100_000).sample(N, rng(1))
    assert x.dtype == np.int64
    assert np.median(x) == pytest.approx(1020, rel=0.05)
    assert np.quantile(x, 0.99) == pytest.approx(4142, rel=0.05)


def test_lognormal_by_mu_sigma_matches_its_median_and_p99():
    d = LogNormalLength.from_mu_sigma(5.0, 0.8, 1, 1_000_000)
    assert d.mu == pytest.approx(5.0) and d.sigma == pytest.approx(0.8)
    x = d.sample(N, rng(2))
    assert np.median(x) == pytest.approx(math.exp(5.0), rel=0.05)
    assert np.quantile(x, 0.99) == pytest.approx(math.exp(5.0 + 2.3263 * 0.8), rel=0.05)
    assert np.log(x).std() == pytest.approx(0.8, rel=0.05)


def test_lognormal_clipping_piles_the_tail_at_max():
    d = LogNormalLength(100, 1000, min_len=50, max_len=300)
    x = d.sample(N, rng(3))
    assert x.min() == 50 and x.max() == 300
    # P(X > 300) for median 100, sigma = ln(10)/2.326: 1 - Phi(ln 3 / sigma) ≈ 0.133
    assert np.mean(x == 300) == pytest.approx(0.133, abs=0.01)
    assert np.mean(x == 50) == pytest.approx(0.242, abs=0.01)  # 1 - Phi(ln 2 / sigma)


def test_fixed():
    assert FixedLength(17).sample(5, rng()).tolist() == [17] * 5


def test_uniform_covers_both_ends_inclusive():
    x = UniformLength(3, 7).sample(N, rng(4))
    assert set(x.tolist()) == {3, 4, 5, 6, 7}
    assert x.mean() == pytest.approx(5.0, abs=0.05)


def test_pareto_tail():
    d = ParetoLength(alpha=1.5, scale=100, min_len=1, max_len=10**7)
    x = d.sample(N, rng(5))
    assert x.min() >= 100
    # P(X > 400) = (100/400)^1.5 = 0.125
    assert np.mean(x > 400) == pytest.approx(0.125, abs=0.01)
    capped = ParetoLength(1.5, 100, 1, 500).sample(N, rng(5))
    assert capped.max() == 500


def test_zipf_power_law_on_its_support():
    d = ZipfLength(s=1.5, min_len=1, max_len=1000)
    x = d.sample(N, rng(6))
    assert x.min() >= 1 and x.max() <= 1000
    ones, twos = np.sum(x == 1), np.sum(x == 2)
    assert ones / twos == pytest.approx(2**1.5, rel=0.08)


def test_zipf_exponent_below_one_is_allowed_because_support_is_finite():
    x = ZipfLength(s=0.5, min_len=10, max_len=20).sample(N, rng(7))
    assert set(x.tolist()) <= set(range(10, 21)) and x.min() == 10 and x.max() == 20


def test_empirical_quantiles_are_interpolated():
    d = EmpiricalLength.from_quantiles([(0.0, 10), (0.5, 100), (0.9, 200), (1.0, 1000)])
    x = d.sample(N, rng(8))
    assert x.min() >= 10 and x.max() <= 1000
    assert np.median(x) == pytest.approx(100, rel=0.03)
    assert np.quantile(x, 0.9) == pytest.approx(200, rel=0.03)
    assert np.quantile(x, 0.25) == pytest.approx(55, rel=0.05)  # halfway between 10 and 100


def test_empirical_quantiles_fill_missing_ends_from_min_and_max():
    d = EmpiricalLength.from_quantiles([(0.5, 100)], min_len=20, max_len=180)
    x = d.sample(N, rng(9))
    assert x.min() >= 20 and x.max() <= 180
    assert np.quantile(x, 0.25) == pytest.approx(60, rel=0.05)
    assert np.quantile(x, 0.75) == pytest.approx(140, rel=0.05)


def test_empirical_from_samples_only_returns_observed_values():
    d = EmpiricalLength.from_samples([5, 7, 7, 1000], max_len=500)
    x = d.sample(N, rng(10))
    assert set(x.tolist()) == {5, 7, 500}
    assert np.mean(x == 7) == pytest.approx(0.5, abs=0.02)


@pytest.mark.parametrize(
    "dist",
    [
        FixedLength(9),
        UniformLength(2, 9),
        LogNormalLength(1020, 4142, 1, 8192),
        LogNormalLength(13, 251),
        ParetoLength(1.2, 50, 2, 4096),
        ZipfLength(1.1, 1, 512),
        EmpiricalLength.from_quantiles([(0.1, 5), (0.5, 30), (1.0, 90)], 1, 100),
        EmpiricalLength.from_samples([3, 4, 5]),
    ],
)
def test_round_trip_through_dict(dist):
    again = length_from_dict(dist.to_dict())
    assert again == dist
    assert np.array_equal(again.sample(100, rng(1)), dist.sample(100, rng(1)))


def test_from_dict_lognormal_by_mu_sigma():
    d = length_from_dict({"dist": "lognormal", "mu": 4.0, "sigma": 0.5, "max": 1000})
    assert isinstance(d, LogNormalLength) and d.mu == pytest.approx(4.0) and d.max_len == 1000


def test_each_prints_itself():
    assert str(FixedLength(9)) == "fixed(9)"
    assert str(UniformLength(2, 9)) == "uniform[2,9]"
    assert (
        str(LogNormalLength(1020, 4142, 1, 8192)) == "lognormal(median=1020, p99=4142, sigma=0.602)[1,8192]"
    )
    assert str(ParetoLength(1.2, 50, 2, 4096)) == "pareto(alpha=1.2, scale=50)[2,4096]"
    assert str(ZipfLength(1.1, 1, 512)) == "zipf(s=1.1)[1,512]"
    assert str(EmpiricalLength.from_quantiles([(0.5, 30), (1.0, 90)])) == "empirical(2 quantiles)[1,inf]"


@pytest.mark.parametrize(
    ("d", "field"),
    [
        ({"dist": "lognormal", "median": 100, "p99": 50}, "p99"),
        ({"dist": "lognormal", "median": -1, "p99": 50}, "median"),
        ({"dist": "lognormal", "median": 100}, "p99"),
        ({"dist": "lognormal", "median": 100, "p99": 200, "sigma": 1.0}, "median"),
        ({"dist": "lognormal", "mu": 3.0, "sigma": -1.0}, "sigma"),
        ({"dist": "lognormal", "median": 100, "p99": 200, "min": 0}, "min"),
        ({"dist": "lognormal", "median": 100, "p99": 200, "min": 10, "max": 5}, "max"),
        ({"dist": "lognormal", "median": 100, "p99": 200, "meadian": 5}, "meadian"),
        ({"dist": "lognormal", "median": "100", "p99": 200}, "median"),
        ({"dist": "gaussian", "mean": 5}, "dist"),
        ({"median": 5}, "dist"),
        ({"dist": "fixed"}, "value"),
        ({"dist": "fixed", "value": 0}, "value"),
        ({"dist": "uniform", "min": 5}, "max"),
        ({"dist": "zipf", "s": 1.2}, "max"),
        ({"dist": "pareto", "alpha": 0, "scale": 1}, "alpha"),
        ({"dist": "empirical", "quantiles": [[0.5, 10], [0.4, 20]]}, "quantiles"),
        ({"dist": "empirical", "quantiles": [[0.1, 30], [0.5, 20]]}, "quantiles"),
        ({"dist": "empirical", "quantiles": [[0.0, 3], [0.5, 20]]}, "max"),
        ({"dist": "empirical", "samples": [3, 0]}, "samples"),
        ({"dist": "empirical", "samples": [3], "quantiles": [[1.0, 4]]}, "quantiles"),
    ],
)
def test_bad_values_raise_spec_error_naming_the_field(d, field):
    with pytest.raises(SpecError) as e:
        length_from_dict(d)
    assert e.value.field == field


@settings(max_examples=60, deadline=None)
@given(
    median=st.floats(1.0, 1e5),
    spread=st.floats(1.0, 100.0),
    lo=st.integers(1, 1000),
    width=st.integers(0, 10_000),
)
def test_lognormal_samples_always_within_clip(median, spread, lo, width):
    x = LogNormalLength(median, median * spread, lo, lo + width).sample(200, rng(0))
    assert x.dtype == np.int64
    assert x.min() >= lo and x.max() <= lo + width
