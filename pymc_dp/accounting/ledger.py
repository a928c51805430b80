"""A ledger that composes a heterogeneous list of privacy events.

Gaussian events are composed exactly through their privacy-loss parameters (the
``mu``'s add; Räisä et al., Theorem 2.4). Approximate-DP events are grouped by their
(epsilon, delta) and each group is composed with the optimal homogeneous composition
theorem of Kairouz, Oh & Viswanath. The Gaussian part and the groups are then combined
by sequential composition (epsilons add, deltas add; Dwork & Roth 2014, Theorem 3.16),
with the split of the total delta (or epsilon) between them optimised numerically.
Any split yields a valid guarantee, so an imperfect optimisation can only make the
reported value conservative.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
from scipy import optimize, special

from pymc_dp._validation import check_delta, check_nonnegative

from .approx import KOVCurve
from .events import ApproxDPEvent, GaussianEvent
from .gaussian import gaussian_delta, gaussian_epsilon

__all__ = ["PrivacyLedger"]

Event = GaussianEvent | ApproxDPEvent

_BIG = 1e300
# Allocated shares are shrunk by this factor so that rounding never makes them sum to
# more than the total being split.
_SAFETY = 1.0 - 2.0**-40


def _check_event(event: object) -> Event:
    if not isinstance(event, GaussianEvent | ApproxDPEvent):
        raise TypeError(
            "event must be a GaussianEvent or an ApproxDPEvent; got "
            f"{type(event).__name__}: {event!r}"
        )
    return event


def _minimize_over_simplex(fn: Callable[[np.ndarray], float], m: int) -> float:
    """Minimise ``fn(w)`` over weight vectors ``w`` on the (m-1)-simplex.

    Returns the smallest value of ``fn`` actually evaluated (so it is a value of ``fn``
    at a valid split, never an extrapolation).
    """
    if m == 1:
        return fn(np.ones(1))
    best = math.inf

    def clipped(v: float) -> float:
        return v if math.isfinite(v) else _BIG

    if m == 2:

        def f1(x: float) -> float:
            return clipped(fn(np.array([special.expit(x), special.expit(-x)])))

        grid = np.linspace(-36.0, 36.0, 73)
        vals = np.array([f1(x) for x in grid])
        i = int(np.argmin(vals))
        best = float(vals[i])
        lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
        res = optimize.minimize_scalar(
            f1, bounds=(lo, hi), method="bounded", options={"xatol": 1e-10}
        )
        best = min(best, float(res.fun))
    else:

        def fz(z: np.ndarray) -> float:
            return clipped(fn(special.softmax(np.append(z, 0.0))))

        best = fz(np.zeros(m - 1))
        res = optimize.minimize(
            fz,
            np.zeros(m - 1),
            method="Nelder-Mead",
            options={"maxiter": 400 * m, "xatol": 1e-8, "fatol": 1e-12},
        )
        best = min(best, float(res.fun))
    return best if best < _BIG else math.inf


class PrivacyLedger:
    """Composes a heterogeneous list of `GaussianEvent` and `ApproxDPEvent`.

    Parameters
    ----------
    events : iterable of GaussianEvent or ApproxDPEvent, optional
        Initial events. All are validated before any is recorded.

    Raises
    ------
    TypeError
        If an event is of an unknown type.

    Notes
    -----
    For a ledger of Gaussian events only, `epsilon` and `delta` are exact
    (tight) and `delta` is the inverse of `epsilon`. With approximate-DP
    events the result is a valid, optimised but not necessarily tight bound: the Gaussian
    part and each group of identical approximate-DP events are combined by sequential
    composition, which ignores that the privacy-loss distributions could be convolved.

    References
    ----------
    .. [1] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    .. [2] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential
       privacy", IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.3.
    .. [3] C. Dwork, A. Roth, "The algorithmic foundations of differential privacy",
       2014, Theorem 3.16 (basic sequential composition).

    Examples
    --------
    >>> ledger = PrivacyLedger([GaussianEvent(50.0, 1000), GaussianEvent(80.0, 11000)])
    >>> round(ledger.mu, 6)
    1.059375
    >>> round(ledger.epsilon(1e-5), 4)
    6.8027
    """

    def __init__(self, events: Iterable[Event] = ()) -> None:
        evs = [_check_event(e) for e in events]
        self._events: list[Event] = evs

    def add(self, event: Event) -> None:
        """Record one event.

        Parameters
        ----------
        event : GaussianEvent or ApproxDPEvent
            The event to record.

        Raises
        ------
        TypeError
            If ``event`` is of an unknown type; the ledger is then unchanged.
        """
        self._events.append(_check_event(event))

    @property
    def events(self) -> tuple[Event, ...]:
        """The recorded events, in order."""
        return tuple(self._events)

    @property
    def mu(self) -> float:
        """Total Gaussian privacy-loss parameter (sum of `GaussianEvent.mu`)."""
        return math.fsum(e.mu for e in self._events if isinstance(e, GaussianEvent))

    def _curves(self) -> list[KOVCurve]:
        counts: dict[tuple[float, float], int] = {}
        for e in self._events:
            if isinstance(e, ApproxDPEvent) and e.count > 0:
                key = (e.epsilon, e.delta)
                counts[key] = counts.get(key, 0) + e.count
        return [KOVCurve(eps, d, k) for (eps, d), k in counts.items() if eps > 0 or d > 0]

    def epsilon(self, delta: float) -> float:
        """Epsilon of the composition of all recorded events at total ``delta``.

        Parameters
        ----------
        delta : float
            Total delta in (0, 1).

        Returns
        -------
        float
            Epsilon (>= 0); ``math.inf`` if the approximate-DP events alone need more
            than ``delta``.

        Raises
        ------
        ValueError
            If ``delta`` is not in (0, 1).

        Notes
        -----
        Gaussian part: `gaussian_epsilon` on the total ``mu``
        (exact). Each group of approximate-DP events with the same (epsilon, delta) needs
        at least ``1 - (1 - delta_i)^k_i``; the remaining delta is split between the
        Gaussian part and the groups, and the split minimising the summed epsilon is
        searched (a grid plus bounded 1-D search over the logit of the fraction for two
        parts, Nelder-Mead over softmax weights for more).
        """
        d = check_delta(delta)
        mu = self.mu
        curves = self._curves()
        if not curves:
            return gaussian_epsilon(mu, d)
        floors = math.fsum(c.floor for c in curves)
        flex: list[Callable[[float], float]] = []
        if mu > 0.0:
            flex.append(lambda x: gaussian_epsilon(mu, x) if x > 0.0 else math.inf)
        for c in curves:
            if c.epsilon > 0.0:
                flex.append(lambda x, c=c: c.epsilon_for_delta(min(c.floor + x, 1.0 - 1e-16)))
        slack = d - floors
        if slack < 0.0:
            return math.inf
        if not flex:
            return 0.0
        if slack == 0.0:
            return math.inf if mu > 0.0 else math.fsum(c.max_epsilon for c in curves)
        slack *= _SAFETY

        def total(w: np.ndarray) -> float:
            return math.fsum(f(float(wi) * slack) for f, wi in zip(flex, w, strict=True))

        return _minimize_over_simplex(total, len(flex))

    def delta(self, epsilon: float) -> float:
        """Smallest total delta at which the composition is ``epsilon``-DP.

        Parameters
        ----------
        epsilon : float
            Total epsilon; finite and >= 0.

        Returns
        -------
        float
            Delta in [0, 1]. Exact (tight) for a ledger of Gaussian events only.

        Raises
        ------
        ValueError
            If ``epsilon`` is negative or not finite.

        Notes
        -----
        With approximate-DP events the total ``epsilon`` is split between the Gaussian
        part (delta from `gaussian_delta`) and each group of
        identical approximate-DP events (delta from the Kairouz-Oh-Viswanath curve), and
        the split minimising the summed delta is searched numerically. This optimises the
        same sequential-composition bound as `epsilon`, from the other side.
        """
        e = check_nonnegative(epsilon, "epsilon")
        mu = self.mu
        curves = self._curves()
        if not curves:
            return gaussian_delta(mu, e)
        fixed = math.fsum(c.floor for c in curves if c.epsilon == 0.0)
        flex: list[Callable[[float], float]] = []
        if mu > 0.0:
            flex.append(lambda x: gaussian_delta(mu, x))
        for c in curves:
            if c.epsilon > 0.0:
                flex.append(c.delta_total)
        if not flex:
            return min(fixed, 1.0)
        e_alloc = e * _SAFETY

        def total(w: np.ndarray) -> float:
            return math.fsum(f(float(wi) * e_alloc) for f, wi in zip(flex, w, strict=True))

        return min(fixed + _minimize_over_simplex(total, len(flex)), 1.0)

    def __len__(self) -> int:
        return len(self._events)

    def __repr__(self) -> str:
        return f"PrivacyLedger(events={self._events!r})"
