"""Subsampled Gaussian mechanisms under replace-one neighbours, via Google's dp-accounting.

Minibatch samplers read a random subset of the records in each iteration. Two sampling
schemes appear in the papers, and each has its own accountant:

* **Poisson sampling** (each record independently with probability ``q``): DP-SGLD and
  DP-SGNHT (Wang, Fienberg, Smola 2015; Li et al. 2019), accounted as in the DP-HMC paper's
  baselines. Composed with the privacy-loss-distribution (PLD) accountant of dp-accounting
  (Koskela, Jälkö, Honkela 2020; Doroshenko et al. 2022), which is tight up to its
  discretisation and always errs on the safe side (``pessimistic_estimate``).
* **Sampling without replacement** (a uniformly random subset of fixed size ``b``): DP Barker
  and the subsampled penalty test (thesis Sec. 3.2 and 4.1, Theorems 8-9), accounted with the
  subsampled Rényi-DP bound of Wang, Balle, Kasiviswanathan (2019, Theorem 27) and the RDP to
  (epsilon, delta) conversion of dp-accounting's RDP accountant.

Conventions (both under the replace-one relation, ``n`` public):

* Poisson: ``noise_multiplier = noise std / C`` where ``C`` bounds the norm of each record's
  contribution, so the sum changes by at most ``2 C`` when one record is replaced
  (dp-accounting's ``REPLACE_ONE`` Gaussian PLD compares ``(1-q) N(0, s^2) + q N(-C, s^2)`` with
  ``(1-q) N(0, s^2) + q N(C, s^2)``). With ``q = 1`` this is a Gaussian mechanism with
  privacy-loss parameter ``mu = 2 / noise_multiplier``.
* Without replacement: ``noise_multiplier = noise std / Delta`` where ``Delta`` is the
  replace-one L2 sensitivity of the minibatch statistic (``2 C`` for contributions bounded by
  ``C``), as in Wang et al. (2019) and dp-accounting.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from pymc_dp._validation import check_delta, check_positive

from .calibration import Bisect, expand, solve
from .events import PoissonSubsampledGaussian, WORSubsampledGaussian
from .gaussian import gaussian_epsilon

__all__ = [
    "PoissonSubsampledGaussian",
    "WORSubsampledGaussian",
    "poisson_subsampled_gaussian_epsilon",
    "wor_subsampled_gaussian_epsilon",
    "calibrate_poisson_subsampled_noise",
    "calibrate_wor_subsampled_noise",
    "to_dp_event",
]

# PLD discretisation: smaller is tighter and slower; the estimate is pessimistic either way.
_PLD_DISCRETISATION = 1e-3
# Renyi orders for the WBK bound: fewer than dp-accounting's default (its integer-order
# computation is slow); any set of orders gives a valid bound.
_RDP_ORDERS = (1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48)
_RDP_ORDERS = _RDP_ORDERS + (56, 64, 128, 256)
# Below this noise multiplier the Poisson accountant uses the un-subsampled Gaussian bound.
_PLD_MIN_NOISE = 0.1


def _dp_accounting():
    try:
        import dp_accounting
    except ImportError as exc:  # pragma: no cover - dp-accounting is a dependency
        raise ImportError(
            "accounting of subsampled mechanisms needs Google's dp-accounting package: "
            "pip install dp-accounting"
        ) from exc
    return dp_accounting


def to_dp_event(event: PoissonSubsampledGaussian | WORSubsampledGaussian):
    """A subsampled-Gaussian event of `.events` in dp-accounting's terms."""
    dpa = _dp_accounting()
    gaussian = dpa.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, PoissonSubsampledGaussian):
        sampled = dpa.PoissonSampledDpEvent(event.sampling_rate, gaussian)
    else:
        sampled = dpa.SampledWithoutReplacementDpEvent(event.n, event.batch_size, gaussian)
    return dpa.SelfComposedDpEvent(sampled, event.count)


def _compose(
    acc, events: Iterable[PoissonSubsampledGaussian | WORSubsampledGaussian], delta: float
) -> float:
    """Epsilon at ``delta`` of ``events`` composed by the dp-accounting accountant ``acc``."""
    any_event = False
    for ev in events:
        acc.compose(to_dp_event(ev))
        any_event = True
    if not any_event:
        return 0.0
    return float(acc.get_epsilon(delta))


def poisson_subsampled_gaussian_epsilon(
    events: Iterable[PoissonSubsampledGaussian], delta: float
) -> float:
    """Epsilon at ``delta`` of the composition of Poisson-subsampled Gaussian mechanisms.

    PLD accountant of dp-accounting, replace-one neighbours, pessimistic discretisation.
    """
    delta = check_delta(delta)
    events = list(events)
    if any(ev.noise_multiplier < _PLD_MIN_NOISE for ev in events):
        # Almost no noise: the PLD grid would need ~1/sigma^2 memory. Subsampling can only
        # help, so the un-subsampled Gaussian bound (GDP 2/sigma per iteration) is valid.
        mu = sum(ev.count * 2.0 / ev.noise_multiplier**2 for ev in events)
        return float(gaussian_epsilon(mu, delta))
    dpa = _dp_accounting()
    acc = dpa.pld.PLDAccountant(
        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE,
        value_discretization_interval=_PLD_DISCRETISATION,
    )
    return _compose(acc, events, delta)


def wor_subsampled_gaussian_epsilon(events: Iterable[WORSubsampledGaussian], delta: float) -> float:
    """Epsilon at ``delta`` of the composition of without-replacement subsampled Gaussians.

    RDP accountant of dp-accounting (Wang, Balle, Kasiviswanathan 2019, Theorem 27, for each
    event; RDP adds over the composition; converted to (epsilon, delta) by dp-accounting).
    """
    delta = check_delta(delta)
    dpa = _dp_accounting()
    acc = dpa.rdp.RdpAccountant(
        orders=_RDP_ORDERS, neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE
    )
    return _compose(acc, events, delta)


#: Smallest noise multiplier the calibration considers. Below it the PLD discretisation of
#: the privacy loss becomes huge (memory grows like 1 / sigma^2); such targets (very large
#: epsilon) get this much noise, which still meets them.
_MIN_NOISE_MULTIPLIER = 0.2


def _calibrate(events_of, accountant, delta: float, epsilon: float) -> float:
    """Smallest noise multiplier (to 0.1 % relative) whose epsilon does not exceed ``epsilon``.

    The returned multiplier always satisfies the target (bisection keeps the feasible end).
    It is never below ``_MIN_NOISE_MULTIPLIER``. ``events_of(sigma)``: the run's events, of
    one type, composed by ``accountant(events, delta)`` (the registry's accountant of that
    type).
    """

    def ok(sigma: float) -> bool:
        return accountant(events_of(sigma), delta) <= epsilon

    def too_much(sigma: float) -> None:
        if sigma > 1e6:
            raise ValueError(f"epsilon={epsilon!r} cannot be met with any noise level")

    # Bracket on powers of two: up from 1 while infeasible, then down while feasible.
    _, hi = expand(ok, 1.0, lambda s: 2.0 * s, while_ok=False, limit=too_much)
    prev, lo = expand(
        ok,
        hi / 2.0,
        lambda s: max(s / 2.0, _MIN_NOISE_MULTIPLIER),
        while_ok=True,
        last=lambda s: s <= _MIN_NOISE_MULTIPLIER,
    )
    if lo is None:
        return _MIN_NOISE_MULTIPLIER
    if prev is not None:
        hi = prev
    return solve(ok, Bisect(hi, lo, "geometric", stop=lambda h, low: h / low <= 1.001))


@functools.lru_cache(maxsize=256)
def calibrate_poisson_subsampled_noise(
    epsilon: float, delta: float, sampling_rate: float, count: int
) -> float:
    """Noise multiplier so that ``count`` Poisson-subsampled Gaussians are (epsilon, delta)-DP.

    Never overshoots: the returned multiplier's epsilon (by
    `poisson_subsampled_gaussian_epsilon`) is at most ``epsilon``.
    """
    epsilon = check_positive(epsilon, "epsilon")
    delta = check_delta(delta)
    return _calibrate(
        lambda s: [PoissonSubsampledGaussian(s, sampling_rate, count)],
        poisson_subsampled_gaussian_epsilon,
        delta,
        epsilon,
    )


@functools.lru_cache(maxsize=256)
def calibrate_wor_subsampled_noise(
    epsilon: float, delta: float, n: int, batch_size: int, count: int
) -> float:
    """Noise multiplier so that ``count`` WOR-subsampled Gaussians are (epsilon, delta)-DP."""
    epsilon = check_positive(epsilon, "epsilon")
    delta = check_delta(delta)
    return _calibrate(
        lambda s: [WORSubsampledGaussian(s, n, batch_size, count)],
        wor_subsampled_gaussian_epsilon,
        delta,
        epsilon,
    )
