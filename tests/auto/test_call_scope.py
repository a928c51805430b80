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


def _normal(potential: bool, x=None):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        if potential:
            pm.Potential("soft", -(mu**2))
        pm.Normal("x", mu, 1.0, observed=np.zeros(20) if x is None else x)
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


def _step_class_call(model, **step_kwargs):
    import pymc_dp

    with model:
        return pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=3.0,
            delta=1e-6,
            draws=20,
            tune=20,
            chains=1,
            step_kwargs={"clip_bound": 1.0, **step_kwargs},
            random_seed=1,
            progressbar=False,
            compute_convergence_checks=False,
        )


def test_one_step_class_call_checks_the_model_and_builds_its_initial_point_once(monkeypatch):
    """`pymc_dp.sample(step=<a class>)` is one call as the automatic mode is (issue 26,
    eighteenth session): before, 3 model checks (`_check_class_run`, the step's constructor,
    `check_run_is_private`) and 2 initial points; 4 and 3 for a class configured privately."""
    model = _normal(potential=False, x=np.linspace(-1.0, 1.0, 20))
    walks = _counting(monkeypatch, guards, "_refuse_folded_aggregates")
    points = _counting(monkeypatch, pm.Model, "initial_point")
    idata = _step_class_call(model)
    assert len(walks) == 1  # before: 3
    assert len(points) == 1  # before: 2
    assert idata.attrs["dp_epsilon"] <= 3.0 + 1e-9
    # a second call checks again (a scope lasts one call)
    _step_class_call(model)
    assert len(walks) == 2


def test_a_step_class_call_declaring_potentials_checks_them_once(monkeypatch):
    """With ``data_free_potentials=True`` every check of the call is the looser one: one walk;
    without it the model is still refused."""
    model = _normal(potential=True, x=np.linspace(-1.0, 1.0, 20))
    walks = _counting(monkeypatch, guards, "_refuse_folded_aggregates")
    _step_class_call(model, data_free_potentials=True)
    assert len(walks) == 1
    with pytest.raises(ModelNotSupportedError, match="pm.Potential"):
        _step_class_call(model)
