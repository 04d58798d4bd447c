"""Clock sync (slobench.run.clocksync): a simulated remote clock, shifted and drifting by known amounts, seen
through round trips with random, asymmetric one-way delays, is recovered within the stated bound."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from slobench.errors import SpecError
from slobench.run.clocksync import ClockMap, OffsetEstimate, estimate_offset, measure_offset


class RemoteClock:
    """remote(t) = shift + (1 + drift) * t, t the driver's time."""

    def __init__(self, shift_s: float, drift: float) -> None:
        self.shift_s = shift_s
        self.drift = drift

    def at(self, driver_s: float) -> float:
        return self.shift_s + (1.0 + self.drift) * driver_s

    def offset_at(self, driver_s: float) -> float:
        return self.at(driver_s) - driver_s

    def round_trips(self, rng: np.random.Generator, start_s: float, n: int) -> list[tuple[float, float, float]]:
        out = []
        t = start_s
        for _ in range(n):
            # one-way delays: a floor plus heavy, independent queueing in each direction (asymmetric)
            out_s = 2e-4 + rng.exponential(1e-3) * rng.choice([1, 5])
            back_s = 2e-4 + rng.exponential(3e-3)
            out.append((t, self.at(t + out_s), t + out_s + back_s))
            t += out_s + back_s + rng.uniform(0, 1e-3)
        return out


@pytest.mark.parametrize("seed", range(20))
def test_offset_recovered_within_half_the_min_rtt(seed: int) -> None:
    rng = np.random.default_rng(seed)
    clock = RemoteClock(shift_s=rng.uniform(-5e3, 5e3), drift=rng.uniform(-1e-4, 1e-4))  # up to ±100 ppm
    samples = clock.round_trips(rng, start_s=rng.uniform(0, 1e5), n=24)
    est = estimate_offset(samples)
    assert est.num_samples == 24
    assert est.rtt_s == min(s[2] - s[0] for s in samples)
    assert est.uncertainty_s == est.rtt_s / 2
    err = est.offset_s - clock.offset_at(est.at_s)
    assert abs(err) <= est.uncertainty_s + 1e-9
    # and the bound is not vacuous: a few ms at most with these delays
    assert est.uncertainty_s < 5e-3


@pytest.mark.parametrize("seed", range(20))
def test_map_between_start_and_end_recovers_drift_and_times(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    drift = rng.uniform(-1e-4, 1e-4)
    clock = RemoteClock(shift_s=rng.uniform(-100, 100), drift=drift)
    t_start = rng.uniform(0, 1e4)
    run_s = 600.0
    start = estimate_offset(clock.round_trips(rng, t_start, 24))
    end = estimate_offset(clock.round_trips(rng, t_start + run_s, 24))
    cmap = ClockMap(start, end)
    # drift: within the two uncertainties over the span
    assert abs(cmap.drift - drift) <= (start.uncertainty_s + end.uncertainty_s) / (end.at_s - start.at_s) + 1e-12
    assert cmap.uncertainty_s == max(start.uncertainty_s, end.uncertainty_s)
    # any remote stamp during the run lands within the stated bound of its true driver time
    for true_driver_s in rng.uniform(start.at_s, end.at_s, 200):
        remote_s = clock.at(true_driver_s)
        mapped = cmap.to_driver(remote_s)
        assert abs(mapped - true_driver_s) <= cmap.bound_at(true_driver_s) + 1e-9
        assert abs(cmap.to_remote(mapped) - remote_s) < 1e-9  # the two directions invert each other
    # past the end, the bound grows and still holds
    for true_driver_s in (end.at_s + 60, end.at_s + 600, start.at_s - 60):
        assert cmap.bound_at(true_driver_s) > cmap.uncertainty_s
        assert abs(cmap.to_driver(clock.at(true_driver_s)) - true_driver_s) <= cmap.bound_at(true_driver_s) + 1e-9


def test_without_drift_correction_a_drifting_clock_would_be_off_by_far_more_than_the_bound() -> None:
    """What the end estimate buys: 50 ppm over 10 minutes is 30 ms, far outside a sub-ms bound."""
    rng = np.random.default_rng(7)
    clock = RemoteClock(shift_s=3.0, drift=50e-6)
    start = estimate_offset(clock.round_trips(rng, 0.0, 24))
    end = estimate_offset(clock.round_trips(rng, 600.0, 24))
    late = 599.0
    start_only = ClockMap(start)
    assert abs(start_only.to_driver(clock.at(late)) - late) > 0.025 > 10 * start_only.uncertainty_s
    both = ClockMap(start).with_end(end)
    assert abs(both.to_driver(clock.at(late)) - late) <= both.bound_at(late) < 0.005
    d = both.to_dict()
    assert d["drift_ppm"] == pytest.approx(50, abs=10) and d["end"]["num_samples"] == 24


def test_minimum_rtt_sample_is_chosen_and_bad_samples_refused() -> None:
    est = estimate_offset([(0.0, 10.010, 0.030), (1.0, 11.002, 1.004), (2.0, 12.0, 1.0)])  # last: t3 < t0
    assert est.rtt_s == pytest.approx(0.004) and est.offset_s == pytest.approx(10.0)
    assert est.num_samples == 2 and est.at_s == pytest.approx(1.002)
    with pytest.raises(SpecError, match="samples"):
        estimate_offset([])
    with pytest.raises(SpecError, match="uncertainty_s"):
        OffsetEstimate(0.0, -1.0, 0.0, 0.0, 1)


def test_measure_offset_with_a_fake_probe_and_clock() -> None:
    rng = np.random.default_rng(3)
    clock = RemoteClock(shift_s=-42.0, drift=20e-6)
    t = [1000.0]

    def now() -> float:
        return t[0]

    async def probe() -> float:
        t[0] += 1e-4 + rng.exponential(2e-3)
        stamp = clock.at(t[0])
        t[0] += 1e-4 + rng.exponential(2e-3)
        return stamp

    est = asyncio.run(measure_offset(probe, now, num_samples=16))
    assert est.num_samples == 16
    assert abs(est.offset_s - clock.offset_at(est.at_s)) <= est.uncertainty_s + 1e-9
    with pytest.raises(SpecError, match="num_samples"):
        asyncio.run(measure_offset(probe, now, num_samples=0))
