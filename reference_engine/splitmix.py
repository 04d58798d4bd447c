"""splitmix64 (Steele, Lea & Flood): the golden-ratio increment, then a finaliser that is a bijection on
64-bit integers and scatters nearby inputs. Every deterministic draw of the project goes through it: the
modeled executor's tokens, the simulator's vectorised copy of them, and trace replay's prompt ids. The
scalar and the numpy forms give the same values (numpy's uint64 arithmetic wraps as the mask does)."""

from __future__ import annotations

import numpy as np

GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment: 2**64 over the golden ratio, odd
_MASK64 = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_GAMMA_U64, _M1_U64, _M2_U64 = np.uint64(GAMMA), np.uint64(_M1), np.uint64(_M2)
_S27, _S30, _S31 = np.uint64(27), np.uint64(30), np.uint64(31)


def splitmix64(x: int) -> int:
    """splitmix64's output for state `x` (a Python int in 0..2**64-1)."""
    x = (x + GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def mix64_array(x: np.ndarray) -> np.ndarray:
    """The finaliser alone, on a uint64 array: `splitmix64(s)` is `mix64_array(s + GAMMA)`."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> _S30)) * _M1_U64
        x = (x ^ (x >> _S27)) * _M2_U64
    return x ^ (x >> _S31)


def splitmix64_array(x: np.ndarray) -> np.ndarray:
    """`splitmix64` of each element of a uint64 array."""
    with np.errstate(over="ignore"):
        return mix64_array(x + _GAMMA_U64)
