import numpy as np
import pytest
from scipy import stats

from slobench.errors import SpecError
from slobench.workload import ConstantArrivals, GammaArrivals, PoissonArrivals, make_arrivals


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def gaps_of(times: np.ndarray) -> np.ndarray:
    # The first arrival is at the first gap, so prepending 0 recovers every gap.
    return np.diff(times, prepend=0.0)


def test_poisson_gaps_are_exponential_by_kolmogorov_smirnov():
    rate = 4.0
    t = PoissonArrivals(rate).schedule(rng(1), num_requests=5000)
    result = stats.kstest(gaps_of(t), stats.expon(scale=1 / rate).cdf)
    assert result.pvalue > 0.01


def test_ks_rejects_gamma_gaps_as_exponential():
    # The same test has power: bursty gaps at the same mean are told apart from Poisson.
    t = GammaArrivals(4.0, 2.0).schedule(rng(1), num_requests=5000)
    assert stats.kstest(gaps_of(t), stats.expon(scale=1 / 4.0).cdf).pvalue < 1e-6


@pytest.mark.parametrize("cv", [0.5, 2.0, 4.0])
def test_gamma_cv_and_rate_within_tolerance(cv):
    rate = 5.0
    t = GammaArrivals(rate, cv).schedule(rng(7), num_requests=20_000)
    g = gaps_of(t)
    assert np.all(g >= 0)  # very bursty gaps can be below float resolution of t
    measured_cv = g.std() / g.mean()
    assert measured_cv == pytest.approx(cv, rel=0.10)
    assert len(t) / t[-1] == pytest.approx(rate, rel=0.10)


def test_gamma_with_cv_one_matches_exponential():
    t = GammaArrivals(3.0, 1.0).schedule(rng(2), num_requests=5000)
    assert stats.kstest(gaps_of(t), stats.expon(scale=1 / 3.0).cdf).pvalue > 0.01


def test_poisson_mean_rate_within_tolerance():
    t = PoissonArrivals(10.0).schedule(rng(3), num_requests=20_000)
    assert len(t) / t[-1] == pytest.approx(10.0, rel=0.03)


def test_constant_is_exact():
    t = ConstantArrivals(4.0).schedule(rng(0), num_requests=9)
    assert t.dtype == np.float64
    assert np.array_equal(t, np.arange(1, 10) / 4.0)


def test_constant_duration_bound_is_exact():
    t = ConstantArrivals(2.0).schedule(rng(0), duration_s=3.0)
    assert t.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]


@pytest.mark.parametrize("proc", [PoissonArrivals(2.0), GammaArrivals(2.0, 3.0)])
def test_same_seed_same_schedule_different_seed_different(proc):
    a = proc.schedule(rng(11), num_requests=1000)
    b = proc.schedule(rng(11), num_requests=1000)
    c = proc.schedule(rng(12), num_requests=1000)
    assert np.array_equal(a, b)
    assert not np.allclose(a, c)


def test_schedule_is_ascending_float64_from_first_gap():
    t = PoissonArrivals(2.0).schedule(rng(5), num_requests=1000)
    assert t.dtype == np.float64 and t.shape == (1000,)
    assert t[0] > 0
    assert np.all(np.diff(t) >= 0)


def test_duration_bound_cuts_at_duration_and_count_matches_rate():
    t = PoissonArrivals(50.0).schedule(rng(4), duration_s=200.0)
    assert t.max() < 200.0
    # Poisson count: mean 10,000, sd 100.
    assert abs(len(t) - 10_000) < 500


def test_duration_schedule_is_prefix_of_count_schedule():
    by_time = GammaArrivals(20.0, 2.0).schedule(rng(9), duration_s=30.0)
    by_count = GammaArrivals(20.0, 2.0).schedule(rng(9), num_requests=len(by_time) + 50)
    np.testing.assert_allclose(by_time, by_count[: len(by_time)], rtol=1e-12)
    assert by_count[len(by_time)] >= 30.0


def test_both_bounds_stop_at_whichever_comes_first():
    proc = PoissonArrivals(10.0)
    assert len(proc.schedule(rng(0), num_requests=5, duration_s=1000.0)) == 5
    t = proc.schedule(rng(0), num_requests=100_000, duration_s=2.0)
    assert 0 < len(t) < 100 and t.max() < 2.0


def test_changing_the_rate_scales_the_same_schedule():
    slow = GammaArrivals(1.0, 2.0).schedule(rng(8), num_requests=500)
    fast = GammaArrivals(4.0, 2.0).schedule(rng(8), num_requests=500)
    np.testing.assert_allclose(fast * 4.0, slow, rtol=1e-12)


def test_with_rate_keeps_the_shape():
    g = GammaArrivals(1.0, 2.5).with_rate(7.0)
    assert g == GammaArrivals(7.0, 2.5)


def test_processes_print_themselves():
    assert str(PoissonArrivals(2.0)) == "poisson@2.00rps"
    assert str(GammaArrivals(5.0, 2.0)) == "gamma(cv=2.0)@5.00rps"
    assert str(GammaArrivals(5.0, 0.25)) == "gamma(cv=0.25)@5.00rps"
    assert str(ConstantArrivals(0.5)) == "constant@0.50rps"


def test_vllm_burstiness_is_inverse_square_cv():
    g = GammaArrivals.from_burstiness(3.0, 0.25)
    assert g.cv == pytest.approx(2.0)
    assert g.burstiness == pytest.approx(0.25)


def test_make_arrivals_by_name():
    assert make_arrivals("poisson", 2.0) == PoissonArrivals(2.0)
    assert make_arrivals("gamma", 2.0, 3.0) == GammaArrivals(2.0, 3.0)
    assert make_arrivals("constant", 2.0) == ConstantArrivals(2.0)
    assert GammaArrivals(2.0, 3.0).to_dict() == {"process": "gamma", "rate_rps": 2.0, "cv": 3.0}


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: PoissonArrivals(-1.0), "rate_rps"),
        (lambda: PoissonArrivals(0.0), "rate_rps"),
        (lambda: ConstantArrivals(float("inf")), "rate_rps"),
        (lambda: GammaArrivals(1.0, 0.0), "cv"),
        (lambda: GammaArrivals(1.0, -2.0), "cv"),
        (lambda: make_arrivals("poison", 1.0), "process"),
        (lambda: make_arrivals("poisson", 1.0, 2.0), "cv"),
        (lambda: PoissonArrivals(1.0).schedule(rng()), "num_requests"),
        (lambda: PoissonArrivals(1.0).schedule(rng(), num_requests=-3), "num_requests"),
        (lambda: PoissonArrivals(1.0).schedule(rng(), duration_s=-1.0), "duration_s"),
    ],
)
def test_bad_values_raise_spec_error_naming_the_field(build, field):
    with pytest.raises(SpecError) as e:
        build()
    assert e.value.field == field
