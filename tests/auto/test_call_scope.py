"""One automatic call works out its model's initial point and checks the model once
(`pymc_dp.callscope`; issue 26, seventeenth session).

Before, a one-shot call built ``model.initial_point()`` (a compiled PyTensor function each
time) 4 times and walked the model guard's graph checks 3 times (at the call's entry, where
the per-record functions are built, before ``pm.sample``)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import oneshot_call

import pymc_dp.records.guards as guards
from pymc_dp.callscope import call_scope, initial_point
from pymc_dp.records import ModelNotSupportedError, check_model_supported


def _counting(monkeypatch, owner, name: str) -> list:
    calls: list = []
    orig = getattr(owner, name)

    def counted(*a, **k):
        calls.append(1)
        return orig(*a, **k)

    monkeypatch.setattr(owner, name, counted)
    return calls


def test_one_automatic_call_checks_the_model_and_builds_its_initial_point_once(
    logistic_model, monkeypatch
):
    model, *_ = logistic_model
    # the guard's last graph check, run once per check of the model
    walks = _counting(monkeypatch, guards, "_refuse_folded_aggregates")
    points = _counting(monkeypatch, pm.Model, "initial_point")
    oneshot_call(model)
    assert len(walks) == 1  # before: 3
    assert len(points) == 1  # before: 4 (pm.sample builds its own initial-point function)
    # outside a call the guard checks every time, as before
    check_model_supported(model, [])
    check_model_supported(model, [])
    assert len(walks) == 3


def _normal(potential: bool):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        if potential:
            pm.Potential("soft", -(mu**2))
        pm.Normal("x", mu, 1.0, observed=np.zeros(20))
    return model


def test_a_looser_check_does_not_cover_a_stricter_one():
    """In one call, a check that allowed data-free Potentials does not stand for one that
    refuses them; the stricter one covers the looser one."""
    model = _normal(potential=True)
    with call_scope(model):
        check_model_supported(model, [], data_free_potentials=True)
        with pytest.raises(ModelNotSupportedError, match="pm.Potential"):
            check_model_supported(model, [], data_free_potentials=False)
    plain = _normal(potential=False)
    with call_scope(plain):
        check_model_supported(plain, [], data_free_potentials=False)
        check_model_supported(plain, [], data_free_potentials=True)  # covered


def test_the_discrete_check_runs_on_every_call_of_the_guard():
    """The model's graph checks run once, the sampled variables' check every time."""
    with pm.Model() as model:
        k = pm.Poisson("k", 3.0)
        pm.Normal("x", k, 1.0, observed=np.zeros(20))
    with call_scope(model):
        check_model_supported(model, [])
        with pytest.raises(ModelNotSupportedError, match="discrete"):
            check_model_supported(model, model.value_vars)


def test_the_scope_hands_out_copies_of_one_point():
    with pm.Model() as model:
        pm.Normal("mu", 1.5, 1.0, shape=3)
    with call_scope(model):
        a = initial_point(model)
        a["mu"][:] = 99.0
        b = initial_point(model)
    np.testing.assert_array_equal(b["mu"], model.initial_point()["mu"])
