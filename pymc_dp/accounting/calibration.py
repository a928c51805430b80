"""One calibrator: the parameter of a mechanism that meets a privacy target, never above it.

Every calibration in pymc_dp (noise multipliers, the DP-HMC pair, the DP Barker batch size,
the DP-Fast MH per-iteration charge) is a search for a parameter ``x`` with
``epsilon_of(x) <= epsilon`` (or, more generally, a monotone predicate ``ok(x)``), as close
to the boundary as the search resolves, and *on the safe side of it*: the value returned has
been checked with ``ok`` (or lies at the end of a bracket that was), so a calibrated run
never spends more than its target (the rule of dp-accounting's ``calibrate_dp_mechanism``
and Opacus' ``get_noise_multiplier``, with pymc_dp's "never above the target" check).

Two searches, `solve` runs either:

* `Nudge` -- from an analytic (closed-form) guess, step toward the safe side by a
  factor whose excess over 1 doubles each time until ``ok`` holds (guards rounding);
* `Bisect` -- bisection of a bracket ``[feasible, infeasible]`` (arithmetic, geometric
  or integer midpoints); the feasible end is returned.

`expand` finds brackets; `calibrate` is `solve` for ``epsilon_of(x) <=
epsilon``. The searches know no accountant (this module imports no other accounting
module): ``epsilon_of`` is the caller's, an accountant of one event type or, for events of
any registered types, `pymc_dp.accounting.registry.events_epsilon`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "Bisect",
    "Nudge",
    "calibrate",
    "expand",
    "solve",
]

Predicate = Callable[[Any], bool]


@dataclass(frozen=True)
class Nudge:
    """Start at ``start`` and multiply by ``factor`` until ``ok`` holds.

    ``factor > 1`` moves up (more noise), ``factor < 1`` down; after each step the excess
    ``factor - 1`` doubles. ``start`` may be a tuple of numbers, scaled together.
    """

    start: Any
    factor: float
    max_steps: int = 200
    what: str = "the calibration"


@dataclass(frozen=True)
class Bisect:
    """Bisect ``[feasible, infeasible]`` (``ok(feasible)`` is known to hold, the other not).

    ``midpoint``: ``"arithmetic"`` ``(a + b) / 2``, ``"geometric"`` ``sqrt(a b)``, or
    ``"integer"`` ``(a + b) // 2``. Stops before a step when ``stop(feasible, infeasible)``
    is true, or after ``max_steps`` steps.
    """

    feasible: float
    infeasible: float
    midpoint: Literal["arithmetic", "geometric", "integer"] = "arithmetic"
    stop: Callable[[float, float], bool] | None = None
    max_steps: int | None = None


def _scale(x: Any, factor: float) -> Any:
    if isinstance(x, tuple):
        return tuple(v * factor for v in x)
    return x * factor


_MIDPOINTS: dict[str, Callable[[Any, Any], Any]] = {
    "arithmetic": lambda a, b: 0.5 * (a + b),
    "geometric": lambda a, b: math.sqrt(a * b),
    "integer": lambda a, b: (a + b) // 2,
}


def solve(ok: Predicate, search: Nudge | Bisect) -> Any:
    """The parameter ``search`` finds on the safe side of the monotone predicate ``ok``."""
    if isinstance(search, Nudge):
        x, factor = search.start, search.factor
        for _ in range(search.max_steps):
            if ok(x):
                return x
            x = _scale(x, factor)
            factor = 1.0 + 2.0 * (factor - 1.0)
        raise RuntimeError(  # pragma: no cover - the factor's excess doubles: 2^200
            f"{search.what} failed to find a value that meets the target; please report this"
        )
    good, bad = search.feasible, search.infeasible
    mid = _MIDPOINTS[search.midpoint]
    steps = 0
    while search.max_steps is None or steps < search.max_steps:
        if search.stop is not None and search.stop(good, bad):
            break
        m = mid(good, bad)
        if ok(m):
            good = m
        else:
            bad = m
        steps += 1
    return good


def expand(
    ok: Predicate,
    x: Any,
    step: Callable[[Any], Any],
    *,
    while_ok: bool,
    last: Callable[[Any], bool] | None = None,
    limit: Callable[[Any], None] | None = None,
) -> tuple[Any, Any]:
    """Walk ``x, step(x), step(step(x)), ...`` while ``ok(x) == while_ok``.

    Returns ``(previous, first)``: ``first`` is the first point where ``ok`` changed and
    ``previous`` the point before it (None if ``x`` itself). ``last(x)`` true at a point
    where ``ok`` has not changed ends the walk there: ``(x, None)``. ``limit(x)`` is called
    on every new point and may raise (a bracket that cannot exist).
    """
    prev = None
    while ok(x) == while_ok:
        if last is not None and last(x):
            return x, None
        prev, x = x, step(x)
        if limit is not None:
            limit(x)
    return prev, x


def calibrate(epsilon_of: Callable[[Any], float], epsilon: float, search: Nudge | Bisect) -> Any:
    """The parameter whose ``epsilon_of`` is at most ``epsilon`` (never above it)."""
    return solve(lambda x: epsilon_of(x) <= epsilon, search)
