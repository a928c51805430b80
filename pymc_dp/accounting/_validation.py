"""Input validation shared by the accounting modules.

Every public function of `pymc_dp.accounting` checks its inputs with these helpers
before doing any work, and raises `ValueError` naming the offending parameter
and saying what a valid value looks like.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

__all__ = [
    "check_count",
    "check_delta",
    "check_mechanism_delta",
    "check_nonnegative",
    "check_positive",
    "check_positive_int",
    "check_real",
]


def check_real(value: Any, name: str) -> float:
    """Return ``value`` as a float, or raise ValueError if it is not a real number."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise ValueError(f"{name} must be a real number; got nan")
    return out


def check_positive(value: Any, name: str) -> float:
    """Return ``value`` as a float; require a finite number > 0."""
    out = check_real(value, name)
    if not (math.isfinite(out) and out > 0.0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return out


def check_nonnegative(value: Any, name: str) -> float:
    """Return ``value`` as a float; require a finite number >= 0."""
    out = check_real(value, name)
    if not (math.isfinite(out) and out >= 0.0):
        raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    return out


def check_delta(value: Any, name: str = "delta") -> float:
    """Return ``value`` as a float; require a target delta in the open interval (0, 1)."""
    out = check_real(value, name)
    if not 0.0 < out < 1.0:
        raise ValueError(f"{name} must be in (0, 1); got {value!r}")
    return out


def check_mechanism_delta(value: Any, name: str = "delta") -> float:
    """Return ``value`` as a float; require a mechanism delta in [0, 1) (0 = pure DP)."""
    out = check_real(value, name)
    if not 0.0 <= out < 1.0:
        raise ValueError(f"{name} must be in [0, 1); got {value!r}")
    return out


def check_count(value: Any, name: str = "count") -> int:
    """Return ``value`` as an int; require an integer >= 0."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    out = int(value)
    if out < 0:
        raise ValueError(f"{name} must be a non-negative integer; got {value!r}")
    return out


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int; require an integer >= 1."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    out = int(value)
    if out < 1:
        raise ValueError(f"{name} must be an integer >= 1; got {value!r}")
    return out
