"""From privacy events to epsilon: one dispatch table (event type -> accountant).

Every event class of `pymc_dp.accounting.events` is registered here with the function
that composes a list of its events into an epsilon at a given delta. Event types that share
an accountant (Gaussian and approximate-DP events, both composed by
`PrivacyLedger`) form one *part*; the parts of a run are combined
by sequential composition with the delta split equally between them (Dwork & Roth 2014,
Theorem 3.16 [DworkRoth2014]: valid, if not the tightest split).

Adding a mechanism: an event class in `.events`, its accountant, one `register`
line below. Unsupported events raise before anything is computed.

This is the one module that knows every accountant: the events are plain data (they import
no accountant), the calibrator (`.calibration`) imports no accounting module, and an
accountant imports the events and the calibrator, never this registry. The accounting
modules' imports form no circle (checked by the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pymc_dp._validation import check_delta

from .barker import dp_barker_epsilon
from .events import (
    ApproxDPEvent,
    DataSharingGaussianEvent,
    DPBarkerEvent,
    GaussianEvent,
    PoissonSubsampledGaussian,
    WORSubsampledGaussian,
)
from .ledger import PrivacyLedger
from .subsampled import poisson_subsampled_gaussian_epsilon, wor_subsampled_gaussian_epsilon

__all__ = ["EpsilonFunction", "accountant_for", "compose_epsilon", "events_epsilon", "register"]

#: ``f(events, delta) -> epsilon`` of a list of events of the types registered with it.
EpsilonFunction = Callable[[Sequence[object], float], float]

_ACCOUNTANTS: dict[type, EpsilonFunction] = {}


def register(event_type: type, accountant: EpsilonFunction) -> None:
    """Register the accountant of an event type (one per type; re-registering replaces it)."""
    _ACCOUNTANTS[event_type] = accountant


def accountant_for(event: object) -> EpsilonFunction:
    """The accountant of ``event``; TypeError naming the event when none is registered."""
    try:
        return _ACCOUNTANTS[type(event)]
    except KeyError:
        raise TypeError(
            f"no accountant is registered for {type(event).__name__} ({event!r}); register "
            "one with pymc_dp.accounting.registry.register"
        ) from None


def compose_epsilon(events: Iterable[object], delta: float) -> float:
    """Epsilon at ``delta`` of all ``events`` of a run, whatever their types.

    Events are grouped by accountant (in registration order); with ``k`` groups each gets
    ``delta / k`` and the epsilons add. No events: 0.
    """
    d = check_delta(delta)
    groups: dict[EpsilonFunction, list[object]] = {}
    for ev in events:
        groups.setdefault(accountant_for(ev), []).append(ev)
    if not groups:
        return 0.0
    order = list(dict.fromkeys(_ACCOUNTANTS.values()))
    share = d / len(groups)
    total = 0.0
    for fn in sorted(groups, key=order.index):
        total += float(fn(groups[fn], share))
    return total


def events_epsilon(
    events_of: Callable[[Any], Iterable[object]], delta: float
) -> Callable[[Any], float]:
    """``x -> epsilon at delta of the events events_of(x)`` (any registered event types).

    The ``epsilon_of`` of `pymc_dp.accounting.calibration.calibrate` for a mechanism
    described by its events: ``calibrate(events_epsilon(events_of, delta), epsilon, search)``.
    """
    return lambda x: compose_epsilon(events_of(x), delta)


def _ledger_epsilon(events: Sequence[object], delta: float) -> float:
    """Gaussian and approximate-DP events, composed together by the ledger (a data-sharing
    event as the Gaussian event each owner is exposed to: each owner's epsilon)."""
    events = [e.owner_event() if hasattr(e, "owner_event") else e for e in events]
    return float(PrivacyLedger(events).epsilon(delta))  # type: ignore[arg-type]


register(GaussianEvent, _ledger_epsilon)
register(ApproxDPEvent, _ledger_epsilon)
register(PoissonSubsampledGaussian, poisson_subsampled_gaussian_epsilon)
register(WORSubsampledGaussian, wor_subsampled_gaussian_epsilon)
register(DPBarkerEvent, dp_barker_epsilon)
register(DataSharingGaussianEvent, _ledger_epsilon)
