"""Token-length distributions for prompts and outputs, each rounded to integers and clipped to [min, max].

Field names in errors are the TOML keys (`median`, `p99`, `min`, `max`, ...), so the workload spec can
prefix them with `input.` / `output.` and a user sees exactly which line of their file is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np

from slobench.errors import SpecError
from slobench.workload.ranges import MAX_TOKENS, check_count

__all__ = [
    "EmpiricalLength",
    "FixedLength",
    "LengthDist",
    "LogNormalLength",
    "ParetoLength",
    "UniformLength",
    "ZipfLength",
    "length_from_dict",
]

# z such that P(N(0,1) < z) = 0.99: links a lognormal's p99 to its sigma.
Z99 = 2.3263478740408408
# Without a `max`, samples are still capped at the longest prompt or output a run may ask for.
_HARD_MAX = MAX_TOKENS
# The Zipf sampler tabulates its support; beyond this it would cost more memory than a workload is worth.
_MAX_ZIPF_SUPPORT = 1 << 24


class LengthDist(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...

    def to_dict(self) -> dict[str, Any]: ...


def _is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def _check_positive(field: str, x: object, limit: float = math.inf) -> None:
    if not _is_number(x) or x <= 0:  # type: ignore[operator]
        raise SpecError(field, x, "must be a finite number > 0")
    if x > limit:  # type: ignore[operator]
        raise SpecError(field, x, f"must be at most {limit:,.0f} (tokens a run may ask for)")


def _check_clip(min_len: int, max_len: int | None) -> None:
    check_count("min", min_len, _HARD_MAX)
    if max_len is not None:
        if isinstance(max_len, bool) or not isinstance(max_len, int):
            raise SpecError("max", max_len, "must be an integer")
        if max_len < min_len:
            raise SpecError("max", max_len, f"must be >= min ({min_len})")
        if max_len > _HARD_MAX:
            raise SpecError("max", max_len, f"must be <= {_HARD_MAX}")


def _clip(x: np.ndarray, min_len: int, max_len: int | None) -> np.ndarray:
    hi = _HARD_MAX if max_len is None else max_len
    return np.clip(np.rint(x), min_len, hi).astype(np.int64)


def _clip_str(min_len: int, max_len: int | None) -> str:
    return f"[{min_len},{'inf' if max_len is None else max_len}]"


def _clip_dict(min_len: int, max_len: int | None) -> dict[str, Any]:
    return {"min": min_len} if max_len is None else {"min": min_len, "max": max_len}


@dataclass(frozen=True, slots=True)
class FixedLength:
    value: int

    dist: ClassVar[str] = "fixed"

    def __post_init__(self) -> None:
        check_count("value", self.value, _HARD_MAX)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": self.dist, "value": self.value}

    def __str__(self) -> str:
        return f"fixed({self.value})"


@dataclass(frozen=True, slots=True)
class UniformLength:
    """Uniform over the integers min..max, both included."""

    min_len: int
    max_len: int

    dist: ClassVar[str] = "uniform"

    def __post_init__(self) -> None:
        if self.max_len is None:
            raise SpecError("max", None, "uniform needs a max")
        _check_clip(self.min_len, self.max_len)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(self.min_len, self.max_len + 1, size=n, dtype=np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": self.dist, **_clip_dict(self.min_len, self.max_len)}

    def __str__(self) -> str:
        return f"uniform{_clip_str(self.min_len, self.max_len)}"


@dataclass(frozen=True, slots=True)
class LogNormalLength:
    """ln(tokens) ~ N(mu, sigma). Stored as median and p99 (what a reader of a trace knows)."""

    median: float
    p99: float
    min_len: int = 1
    max_len: int | None = None

    dist: ClassVar[str] = "lognormal"

    def __post_init__(self) -> None:
        _check_positive("median", self.median, _HARD_MAX)
        _check_positive("p99", self.p99, _HARD_MAX)
        if self.p99 < self.median:
            raise SpecError("p99", self.p99, f"must be >= median ({self.median})")
        _check_clip(self.min_len, self.max_len)

    @classmethod
    def from_mu_sigma(
        cls, mu: float, sigma: float, min_len: int = 1, max_len: int | None = None
    ) -> LogNormalLength:
        if not _is_number(mu):
            raise SpecError("mu", mu, "must be a finite number")
        if not _is_number(sigma) or sigma < 0:
            raise SpecError("sigma", sigma, "must be a finite number >= 0")
        top = math.log(_HARD_MAX)  # the median and p99 stay within the tokens a run may ask for
        if mu > top:
            raise SpecError("mu", mu, f"puts the median above {_HARD_MAX:,} tokens; at most {top:.4g}")
        if mu + Z99 * sigma > top:
            raise SpecError("sigma", sigma, f"puts the p99 above {_HARD_MAX:,} tokens; at most "
                            f"{(top - mu) / Z99:.4g} with mu = {mu:g}")
        return cls(math.exp(mu), math.exp(mu + Z99 * sigma), min_len, max_len)

    @property
    def mu(self) -> float:
        return math.log(self.median)

    @property
    def sigma(self) -> float:
        return (math.log(self.p99) - math.log(self.median)) / Z99

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return _clip(np.exp(self.mu + self.sigma * rng.standard_normal(n)), self.min_len, self.max_len)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dist": self.dist,
            "median": self.median,
            "p99": self.p99,
            **_clip_dict(self.min_len, self.max_len),
        }

    def __str__(self) -> str:
        return (
            f"lognormal(median={self.median:.4g}, p99={self.p99:.4g}, sigma={self.sigma:.3f})"
            f"{_clip_str(self.min_len, self.max_len)}"
        )


@dataclass(frozen=True, slots=True)
class ParetoLength:
    """Classical Pareto: P(X > x) = (scale / x)^alpha for x >= scale. alpha <= 2 has infinite variance."""

    alpha: float
    scale: float
    min_len: int = 1
    max_len: int | None = None

    dist: ClassVar[str] = "pareto"

    def __post_init__(self) -> None:
        _check_positive("alpha", self.alpha)
        _check_positive("scale", self.scale, _HARD_MAX)
        _check_clip(self.min_len, self.max_len)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        # Inverse CDF via an exponential: scale * U^(-1/alpha) = scale * exp(E / alpha).
        x = self.scale * np.exp(rng.standard_exponential(n) / self.alpha)
        return _clip(x, self.min_len, self.max_len)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dist": self.dist,
            "alpha": self.alpha,
            "scale": self.scale,
            **_clip_dict(self.min_len, self.max_len),
        }

    def __str__(self) -> str:
        return f"pareto(alpha={self.alpha:g}, scale={self.scale:g}){_clip_str(self.min_len, self.max_len)}"


@dataclass(frozen=True, slots=True)
class ZipfLength:
    """A discrete power law P(k) ∝ k^-s on the integers min..max (truncated there, not clipped).

    Truncation instead of clipping keeps a pile of mass from forming at `max` when s is near 1, and lets
    s be any positive number (numpy's unbounded zipf needs s > 1).
    """

    s: float
    min_len: int = 1
    max_len: int | None = None

    dist: ClassVar[str] = "zipf"

    def __post_init__(self) -> None:
        _check_positive("s", self.s)
        _check_clip(self.min_len, self.max_len)
        if self.max_len is None:
            raise SpecError("max", None, "zipf needs a max (its support is tabulated)")
        if self.max_len - self.min_len + 1 > _MAX_ZIPF_SUPPORT:
            raise SpecError("max", self.max_len, f"zipf support max-min+1 must be <= {_MAX_ZIPF_SUPPORT}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        assert self.max_len is not None
        k = np.arange(self.min_len, self.max_len + 1, dtype=np.float64)
        cdf = np.cumsum(k ** (-self.s))
        cdf /= cdf[-1]
        idx = np.searchsorted(cdf, rng.random(n), side="right")
        return (self.min_len + np.minimum(idx, len(k) - 1)).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"dist": self.dist, "s": self.s, **_clip_dict(self.min_len, self.max_len)}

    def __str__(self) -> str:
        return f"zipf(s={self.s:g}){_clip_str(self.min_len, self.max_len)}"


@dataclass(frozen=True, slots=True)
class EmpiricalLength:
    """Either an inverse CDF interpolated linearly through `quantiles` [(q, value), ...], or resampling
    (with replacement) of observed `samples`. Exactly one of the two is set.

    Missing ends of the quantile list are filled from the clip: (0, min) if q starts above 0, and
    (1, max) if it ends below 1 (which then needs a max).
    """

    quantiles: tuple[tuple[float, float], ...] = ()
    samples: tuple[int, ...] = ()
    min_len: int = 1
    max_len: int | None = None

    dist: ClassVar[str] = "empirical"

    def __post_init__(self) -> None:
        _check_clip(self.min_len, self.max_len)
        if bool(self.quantiles) == bool(self.samples):
            raise SpecError("quantiles", self.quantiles, "give exactly one of quantiles or samples")
        if self.samples:
            for x in self.samples:
                if isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= _HARD_MAX:
                    raise SpecError("samples", x, f"every sample must be an integer from 1 to {_HARD_MAX:,}")
            return
        qs = np.array([q for q, _ in self.quantiles], dtype=np.float64)
        vs = np.array([v for _, v in self.quantiles], dtype=np.float64)
        if np.any(np.diff(qs) <= 0):
            raise SpecError("quantiles", self.quantiles, "q must be strictly increasing")
        if qs[0] < 0 or qs[-1] > 1:
            raise SpecError("quantiles", self.quantiles, "q must lie in [0, 1]")
        if np.any(np.diff(vs) < 0):
            raise SpecError("quantiles", self.quantiles, "values must not decrease as q grows")
        if vs[-1] > _HARD_MAX:
            raise SpecError("quantiles", float(vs[-1]), f"values must be at most {_HARD_MAX:,} tokens")
        self._table()  # the filled ends may still need a max

    @classmethod
    def from_quantiles(
        cls, quantiles: Sequence[Sequence[float]], min_len: int = 1, max_len: int | None = None
    ) -> EmpiricalLength:
        table: list[tuple[float, float]] = []
        for pair in quantiles:
            if len(pair) != 2 or not all(_is_number(x) for x in pair):
                raise SpecError("quantiles", pair, "each entry must be a pair [q, value] of numbers")
            table.append((float(pair[0]), float(pair[1])))
        return cls(quantiles=tuple(table), min_len=min_len, max_len=max_len)

    @classmethod
    def from_samples(
        cls, samples: Sequence[int] | np.ndarray, min_len: int = 1, max_len: int | None = None
    ) -> EmpiricalLength:
        return cls(samples=tuple(int(x) for x in samples), min_len=min_len, max_len=max_len)

    def _table(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.quantiles:
            raise SpecError("quantiles", self.quantiles, "give exactly one of quantiles or samples")
        qs = [q for q, _ in self.quantiles]
        vs = [v for _, v in self.quantiles]
        if qs[0] > 0:
            qs.insert(0, 0.0)
            vs.insert(0, min(float(self.min_len), vs[0]))
        if qs[-1] < 1:
            if self.max_len is None:
                raise SpecError("max", None, "quantiles that stop below q=1 need a max to end on")
            qs.append(1.0)
            vs.append(max(float(self.max_len), vs[-1]))
        return np.asarray(qs, dtype=np.float64), np.asarray(vs, dtype=np.float64)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.samples:
            pool = np.asarray(self.samples, dtype=np.int64)
            return _clip(pool[rng.integers(0, len(pool), size=n)], self.min_len, self.max_len)
        qs, vs = self._table()
        return _clip(np.interp(rng.random(n), qs, vs), self.min_len, self.max_len)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"dist": self.dist}
        if self.quantiles:
            d["quantiles"] = [[q, v] for q, v in self.quantiles]
        else:
            d["samples"] = list(self.samples)
        return {**d, **_clip_dict(self.min_len, self.max_len)}

    def __str__(self) -> str:
        what = f"{len(self.quantiles)} quantiles" if self.quantiles else f"{len(self.samples)} samples"
        return f"empirical({what}){_clip_str(self.min_len, self.max_len)}"


# What each `dist` accepts besides `dist` itself (min/max are common to all but fixed).
_KEYS: dict[str, frozenset[str]] = {
    "fixed": frozenset({"value"}),
    "uniform": frozenset({"min", "max"}),
    "lognormal": frozenset({"median", "p99", "mu", "sigma", "min", "max"}),
    "pareto": frozenset({"alpha", "scale", "min", "max"}),
    "zipf": frozenset({"s", "min", "max"}),
    "empirical": frozenset({"quantiles", "samples", "min", "max"}),
}


def length_from_dict(d: Mapping[str, Any]) -> LengthDist:
    """Build a length distribution from a TOML-style table; unknown keys are errors so typos surface."""
    if "dist" not in d:
        raise SpecError("dist", None, f"missing; choose one of {sorted(_KEYS)}")
    dist = d["dist"]
    if dist not in _KEYS:
        raise SpecError("dist", dist, f"unknown length distribution; choose one of {sorted(_KEYS)}")
    for key in d:
        if key != "dist" and key not in _KEYS[dist]:
            raise SpecError(
                str(key), d[key], f"unknown key for dist {dist!r}; allowed: {sorted(_KEYS[dist])}"
            )
    lo = d.get("min", 1)
    hi = d.get("max")
    if dist == "fixed":
        if "value" not in d:
            raise SpecError("value", None, "fixed needs a value")
        return FixedLength(d["value"])
    if dist == "uniform":
        if hi is None:
            raise SpecError("max", None, "uniform needs a max")
        return UniformLength(lo, hi)
    if dist == "lognormal":
        by_quantile = "median" in d or "p99" in d
        by_moments = "mu" in d or "sigma" in d
        if by_quantile == by_moments:
            raise SpecError("median", d.get("median"), "give either median and p99, or mu and sigma")
        need = ("median", "p99") if by_quantile else ("mu", "sigma")
        for key in need:
            if key not in d:
                raise SpecError(key, None, f"lognormal needs {need[0]} and {need[1]} together")
        if by_quantile:
            return LogNormalLength(d["median"], d["p99"], lo, hi)
        return LogNormalLength.from_mu_sigma(d["mu"], d["sigma"], lo, hi)
    if dist == "pareto":
        for key in ("alpha", "scale"):
            if key not in d:
                raise SpecError(key, None, "pareto needs alpha and scale")
        return ParetoLength(d["alpha"], d["scale"], lo, hi)
    if dist == "zipf":
        if "s" not in d:
            raise SpecError("s", None, "zipf needs an exponent s")
        return ZipfLength(d["s"], lo, hi)
    # empirical
    if ("samples" in d) == ("quantiles" in d):
        raise SpecError("quantiles", d.get("quantiles"), "give exactly one of quantiles or samples")
    if "samples" in d:
        samples = d["samples"]
        if not isinstance(samples, list | tuple) or not samples:
            raise SpecError("samples", samples, "must be a non-empty list of integers")
        return EmpiricalLength(samples=tuple(samples), min_len=lo, max_len=hi)
    quantiles = d.get("quantiles")
    if not isinstance(quantiles, list | tuple) or not quantiles:
        raise SpecError("quantiles", quantiles, "must be a non-empty list of [q, value] pairs")
    return EmpiricalLength.from_quantiles(quantiles, lo, hi)
