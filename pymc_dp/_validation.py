"""Argument checks of pymc_dp, in one place (pure Python and numpy; never imports PyMC).

Every public function of pymc_dp checks its arguments before it reads any data, and raises
`ValueError` naming the parameter and saying what a valid value looks like. All
checks take ``(value, name)`` in that order and return the value converted (``float`` or
``int``). `pymc_dp.accounting` (pure math) and the step methods both use this module.

Two ways of reading a number:

* strict (the default, used by the accounting): the value must already be a real number
  (``int``, ``float``, numpy scalars; not ``bool``, not a string);
* ``coerce=True`` (used by the steps' keyword arguments, as PyMC's steps do): anything
  ``float()`` accepts, e.g. a 0-d array.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "check_count",
    "check_delta",
    "check_mechanism_delta",
    "check_nonnegative",
    "check_positive",
    "check_positive_int",
    "check_positive_vector",
    "check_real",
    "check_target",
    "check_unit_interval",
    "resolve_noise_or_target",
]

T = TypeVar("T")
P = TypeVar("P")


def check_real(value: Any, name: str) -> float:
    """Return ``value`` as a float, or raise ValueError if it is not a real number."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number; got {value!r}")
    out = float(value)
    if math.isnan(out):
        raise ValueError(f"{name} must be a real number; got nan")
    return out


def _as_float(value: Any, name: str, *, coerce: bool) -> float:
    if not coerce:
        return check_real(value, name)
    # ``coerce`` accepts what float() converts (numpy scalars, 0-d arrays) except strings
    # and booleans: ``epsilon="1"`` is a mistake to report, not to guess.
    if isinstance(value, str | bytes | bool | np.bool_):
        raise ValueError(f"{name} must be a number, not {type(value).__name__}; got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number; got {value!r}") from None


def check_positive(
    value: Any,
    name: str,
    *,
    integer: bool = False,
    allow_zero: bool = False,
    coerce: bool = False,
) -> float | int:
    """Return ``value`` as a float (an int with ``integer=True``); require a finite number > 0.

    ``allow_zero=True`` accepts 0; ``integer=True`` requires an integral value (``3.0`` is
    accepted as 3 when ``coerce=True``).
    """
    v = _as_float(value, name, coerce=coerce)
    ok = math.isfinite(v) and (v >= 0 if allow_zero else v > 0)
    if integer:
        ok = ok and float(int(v)) == v
    if not ok:
        kind = "integer" if integer else "finite number"
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a {kind} {bound}; got {value!r}")
    return int(v) if integer else v


def check_nonnegative(value: Any, name: str) -> float:
    """Return ``value`` as a float; require a finite number >= 0."""
    return check_positive(value, name, allow_zero=True)


def check_delta(value: Any, name: str = "delta", *, coerce: bool = False) -> float:
    """Return ``value`` as a float; require a target delta in the open interval (0, 1)."""
    if coerce:
        if isinstance(value, str | bytes | bool | np.bool_):
            raise ValueError(
                f"{name} must be a number in (0, 1), not {type(value).__name__}; got {value!r}"
            )
        return check_unit_interval(value, name, hint=", typically below 1/n")
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


def _check_integer(value: Any, name: str, lowest: int, what: str) -> int:
    """Return ``value`` as an int; require an integer (not a bool) >= ``lowest``."""
    if (
        isinstance(value, bool | np.bool_)
        or not isinstance(value, numbers.Integral)
        or int(value) < lowest
    ):
        raise ValueError(f"{name} must be {what}; got {value!r}")
    return int(value)


def check_count(value: Any, name: str = "count") -> int:
    """Return ``value`` as an int; require an integer >= 0."""
    return _check_integer(value, name, 0, "a non-negative integer")


def check_positive_int(value: Any, name: str) -> int:
    """Return ``value`` as an int; require an integer >= 1."""
    return _check_integer(value, name, 1, "an integer >= 1")


def check_positive_vector(value: Any, name: str, size: int) -> np.ndarray:
    """``value`` (a number or an array) broadcast to a float vector of ``size`` entries, each
    finite and > 0 (per-coordinate scales such as ``proposal_scale``)."""
    out = np.broadcast_to(np.asarray(value, dtype=float), (size,)).copy()
    if not np.all(np.isfinite(out) & (out > 0)):
        raise ValueError(f"{name} must be finite and > 0 in every coordinate")
    return out


def check_unit_interval(value: Any, name: str, *, hint: str = "") -> float:
    """Return ``value`` as a float in the open interval (0, 1) (``target_accept``, fractions);
    ``hint`` follows the range in the message of an out-of-range value."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number in (0, 1); got {value!r}") from None
    if not 0.0 < out < 1.0:
        raise ValueError(f"{name} must be in (0, 1){hint}; got {value!r}")
    return out


def check_target(epsilon: Any, delta: Any) -> tuple[float, float]:
    """Validate a privacy target of a step (epsilon > 0 finite, 0 < delta < 1)."""
    eps = check_positive(epsilon, "epsilon", coerce=True)
    return eps, check_delta(delta, coerce=True)


def resolve_noise_or_target(
    epsilon: Any,
    delta: Any,
    *,
    noise_given: bool,
    message: str,
    plan: Callable[[], P],
    noise: Callable[[], T],
    calibrate: Callable[[P, float, float], T],
) -> tuple[T, P, float | None, float | None]:
    """The noise of a step: given directly, or calibrated for a target (epsilon, delta).

    Exactly one of the two (``noise_given`` or ``epsilon``) must be given, else
    ``ValueError(message)``. Then, in this order: ``plan()`` (the planned run, which
    validates draws/tune/chains); with a target, the target is checked and
    ``calibrate(plan, epsilon, delta)`` gives the noise; without one, ``noise()`` checks the
    given noise and a ``delta``, if given (the delta the report uses), is checked.

    Returns
    -------
    (noise, plan, epsilon, delta)
        ``epsilon`` is None without a target; ``delta`` None when none was given.
    """
    if noise_given == (epsilon is not None):
        raise ValueError(message)
    run = plan()
    if epsilon is not None:
        eps, d = check_target(epsilon, delta)
        return calibrate(run, eps, d), run, eps, d
    value = noise()
    if delta is not None:
        _, delta = check_target(1.0, delta)
    return value, run, None, delta
