"""Privacy events as frozen data, and the one dispatch from event type to epsilon."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from pymc_dp.accounting import (
    ApproxDPEvent,
    DataSharingGaussianEvent,
    DPBarkerEvent,
    GaussianEvent,
    NeighbourRelation,
    PoissonSubsampledGaussian,
    PrivacyLedger,
    WORSubsampledGaussian,
    compose_epsilon,
    dp_barker_epsilon,
    gaussian_epsilon,
    poisson_subsampled_gaussian_epsilon,
    wor_subsampled_gaussian_epsilon,
)
from pymc_dp.accounting import events as ev_mod
from pymc_dp.accounting.registry import accountant_for, events_epsilon
from pymc_dp.report import NEIGHBOUR_RELATION, PrivacyReport

EXAMPLES = [
    GaussianEvent(2.0, 10),
    ApproxDPEvent(0.1, 1e-7, 10),
    PoissonSubsampledGaussian(1.5, 0.1, 20),
    WORSubsampledGaussian(1.5, 100, 10, 20),
    DPBarkerEvent(200, 50, 20),
    DataSharingGaussianEvent(2.0, 4, 10),
]


def test_every_event_class_is_frozen_data_with_an_accountant():
    classes = [
        obj
        for name in ev_mod.__all__
        if inspect.isclass(obj := getattr(ev_mod, name)) and dataclasses.is_dataclass(obj)
    ]
    assert {type(e) for e in EXAMPLES} == set(classes)
    for e in EXAMPLES:
        assert callable(accountant_for(e))
        field = dataclasses.fields(e)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(e, field, 1)


def test_unsupported_event_raises_before_any_work():
    with pytest.raises(TypeError, match="no accountant is registered for object"):
        compose_epsilon([GaussianEvent(1.0), object()], 1e-5)


@pytest.mark.parametrize(
    "event, fn",
    [
        (EXAMPLES[0], lambda evs, d: PrivacyLedger(evs).epsilon(d)),
        (EXAMPLES[2], poisson_subsampled_gaussian_epsilon),
        (EXAMPLES[3], wor_subsampled_gaussian_epsilon),
        (EXAMPLES[4], dp_barker_epsilon),
    ],
)
def test_one_family_is_its_accountant(event, fn):
    assert compose_epsilon([event], 1e-5) == fn([event], 1e-5)


def test_parts_compose_sequentially_with_delta_split_equally():
    g, a, p = EXAMPLES[0], EXAMPLES[1], EXAMPLES[2]
    expected = PrivacyLedger([g, a]).epsilon(0.5e-5) + poisson_subsampled_gaussian_epsilon(
        [p], 0.5e-5
    )
    assert compose_epsilon([p, g, a], 1e-5) == expected
    assert compose_epsilon([], 1e-5) == 0.0


def test_events_epsilon_composes_through_the_registry():
    fn = events_epsilon(lambda z: [GaussianEvent(z, 10)], 1e-5)
    assert fn(3.0) == gaussian_epsilon(GaussianEvent(3.0, 10).mu, 1e-5)
    mixed = events_epsilon(
        lambda z: [GaussianEvent(z, 10), PoissonSubsampledGaussian(z, 0.1, 20)], 1e-5
    )
    # two parts (ledger, PLD), each at delta / 2
    assert mixed(3.0) == gaussian_epsilon(
        GaussianEvent(3.0, 10).mu, 0.5e-5
    ) + poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(3.0, 0.1, 20)], 0.5e-5)


def test_events_keep_their_repr_and_validation():
    assert repr(DPBarkerEvent(200, 50, 60)) == "DPBarkerEvent(n=200, batch_size=50, count=60)"
    with pytest.raises(ValueError, match="11 <= batch_size <= n"):
        DPBarkerEvent(200, 5, 1)
    with pytest.raises(ValueError, match="sampling_rate"):
        PoissonSubsampledGaussian(1.0, 1.5, 1)


def test_neighbour_relation_is_an_enum_the_report_names():
    assert NeighbourRelation("replace-one") is NeighbourRelation.REPLACE_ONE
    assert NEIGHBOUR_RELATION == NeighbourRelation.REPLACE_ONE.description
    assert PrivacyReport.__dataclass_fields__["neighbour_relation"].default == NEIGHBOUR_RELATION
    assert NEIGHBOUR_RELATION.startswith("replace-one (substitute)")


def test_data_sharing_event_gives_each_owner_the_central_epsilon():
    """Yildirim & Ermis 2019, Sec. 3.2.2: each owner's contribution has the sensitivity of the
    central scheme's sum and its own noise, so each owner's epsilon (neighbours: replace one of
    its records) is the Gaussian mechanism's at the same noise multiplier; the total noise
    variance is K times the central one."""
    shared = DataSharingGaussianEvent(2.0, 4, 10)
    central = GaussianEvent(2.0, 10)
    assert shared.owner_event() == central and shared.mu == central.mu
    assert compose_epsilon([shared], 1e-5) == compose_epsilon([central], 1e-5)
    # composed tightly with Gaussian events (one part, no delta split)
    assert compose_epsilon([shared, central], 1e-5) == compose_epsilon(
        [GaussianEvent(2.0, 20)], 1e-5
    )
    assert shared.noise_variance_factor == 4
    with pytest.raises(ValueError, match="owners"):
        DataSharingGaussianEvent(2.0, 0, 10)
    with pytest.raises(ValueError, match="noise_multiplier"):
        DataSharingGaussianEvent(-1.0, 2, 10)
