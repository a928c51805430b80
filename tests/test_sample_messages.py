"""Messages and ordering of ``pymc_dp.sample``'s checks (what a new user trips over)."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import penalty_sample

import pymc_dp
import pymc_dp.step_methods.base as base

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
X = np.linspace(-1, 1, 20)


def _model(deterministic: bool = False):
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        if deterministic:
            pm.Deterministic("resid", X - t)
        pm.Normal("x", t, 1, observed=X)
    return model


@pytest.mark.parametrize("missing", ["epsilon", "delta", "both"])
def test_forgetting_the_budget_names_sample_and_both_arguments(missing):
    kw = {"epsilon": 1.0, "delta": 1e-5}
    for k in ("epsilon", "delta") if missing == "both" else (missing,):
        del kw[k]
    with _model(), pytest.raises(ValueError, match=r"pymc_dp.sample needs epsilon= and delta="):
        pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, draws=5, tune=0, chains=1, **kw)


@pytest.mark.parametrize(
    "kw, name",
    [
        ({"epsilon": "1", "delta": 1e-5}, "epsilon"),
        ({"epsilon": 1.0, "delta": "1e-5"}, "delta"),
        ({"epsilon": True, "delta": 1e-5}, "epsilon"),
    ],
)
def test_budget_given_as_a_string_or_bool_is_refused(kw, name):
    with _model(), pytest.raises(ValueError, match=rf"{name} must be a number"):
        pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            draws=5,
            tune=0,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
            **kw,
        )


def test_data_deterministic_is_refused_before_compiling_and_without_a_warning(monkeypatch):
    def no_compile(*args, **kwargs):
        raise AssertionError("the step compiled before the data-free refusal")

    monkeypatch.setattr(base, "build_record_functions", no_compile)
    with _model(deterministic=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(pymc_dp.ModelNotSupportedError, match="'resid' depends on the data"):
            penalty_sample()
    assert not [w for w in caught if "Deterministic" in str(w.message)]


def test_data_deterministic_excluded_by_var_names_is_not_warned_about():
    with _model(deterministic=True), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = penalty_sample(var_names=["t"], random_seed=1, **SAMPLE)
    assert "resid" not in idata["posterior"]
    assert not [w for w in caught if "Deterministic" in str(w.message)]


def test_sample_accepts_a_step_instance_with_declared_data_free_potentials():
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Potential("soft_bound", -(t**4))
        pm.Normal("x", t, 1, observed=X)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0,
            epsilon=1.0,
            delta=1e-5,
            draws=5,
            tune=0,
            chains=1,
            data_free_potentials=True,
        )
        idata = pymc_dp.sample(step=step, draws=5, tune=0, chains=1, random_seed=1, **SAMPLE)
    assert idata["posterior"]["t"].shape == (1, 5)


def test_ordinal_likelihoods_stored_probabilities_are_refused_with_compute_p_named(monkeypatch):
    """pm.OrderedLogistic adds the Deterministic 'y_probs' (compute_p=True by default): the
    refusal says where it came from and how not to add it, before anything compiles."""

    def no_compile(*args, **kwargs):
        raise AssertionError("the step compiled before the data-free refusal")

    monkeypatch.setattr(base, "build_record_functions", no_compile)
    y = np.array([0, 1, 2, 1, 0, 2, 1, 1])
    with pm.Model() as model:
        eta = pm.Normal("eta", 0, 1)
        c = pm.Normal(
            "c", 0, 5, shape=2, transform=pm.distributions.transforms.ordered, initval=[-1.0, 1.0]
        )
        pm.OrderedLogistic("y", eta=eta * np.linspace(-1, 1, y.size), cutpoints=c, observed=y)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError) as err:
        penalty_sample()
    assert "'y_probs' depends on the data" in str(err.value)
    assert "pass compute_p=False to 'y'" in str(err.value)


def test_a_users_own_probs_deterministic_gets_no_ordinal_hint():
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Deterministic("resid_probs", X - t)
        pm.Normal("x", t, 1, observed=X)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError) as err:
        penalty_sample()
    assert "'resid_probs' depends on the data" in str(err.value)
    assert "compute_p" not in str(err.value)


def _no_private_phase(monkeypatch):
    """Make the automatic mode's private phases (the first data reads) fail the test."""
    import pymc_dp.auto
    import pymc_dp.auto.steps

    def read(*args, **kwargs):
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(pymc_dp.auto, "auto_configure", read)
    monkeypatch.setattr(pymc_dp.auto.steps, "configure_step_class", read)


@pytest.mark.parametrize("sampler", ["numpyro", "nutpie", "blackjax"])
def test_an_external_nuts_sampler_is_refused_before_the_budget_is_spent(monkeypatch, sampler):
    """pm.sample refuses nuts_sampler with a DP step only after the automatic mode's releases
    (measured on the issue-26 sweep: 36 releases, epsilon 3 of 3 spent, then "Model can not be
    sampled with NUTS alone")."""
    _no_private_phase(monkeypatch)
    with _model(), pytest.raises(ValueError, match=f"nuts_sampler='{sampler}' runs an external"):
        pymc_dp.sample(epsilon=1.0, delta=1e-5, nuts_sampler=sampler, **SAMPLE)


def test_return_inferencedata_false_names_what_is_returned_and_why():
    with _model(), pytest.raises(TypeError, match="always returns an InferenceData") as err:
        pymc_dp.sample(epsilon=1.0, delta=1e-5, return_inferencedata=False, **SAMPLE)
    assert "privacy report" in str(err.value)


def test_return_inferencedata_true_is_accepted_as_what_is_returned():
    """``return_inferencedata=True`` (pm.sample's default, a PyMC habit) was refused with the
    False case's TypeError on the fifth real-data sweep of issue 26; it asks for what
    pymc_dp.sample returns anyway."""
    with _model():
        idata = penalty_sample(random_seed=1, return_inferencedata=True, **SAMPLE)
    assert "t" in idata["posterior"]
    assert idata.attrs["dp_epsilon"] <= 1.0 + 1e-9


def _ridge_model():
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Potential("ridge", -0.5 * t**2)
        pm.Normal("x", t, 1, observed=X)
    return model


@pytest.mark.parametrize(
    "how",
    [
        {},
        {"step": pymc_dp.DPPenaltyMetropolis, "step_kwargs": {"data_free_potentials": True}},
    ],
    ids=["auto", "configured-class"],
)
def test_a_potential_in_the_automatic_phases_names_the_runs_that_take_one(monkeypatch, how):
    """The automatic mode (and a class it configures) takes no Potential, declared or not: the
    refusal said "pass data_free_potentials=True", which neither accepts."""
    _no_private_phase(monkeypatch)
    with _ridge_model(), pytest.raises(pymc_dp.ModelNotSupportedError) as err:
        pymc_dp.sample(epsilon=1.0, delta=1e-5, **how, **SAMPLE)
    msg = str(err.value)
    assert "'ridge'" in msg and "does not take Potentials" in msg
    assert "step_kwargs={'data_free_potentials': True" in msg


def test_a_step_classs_potential_refusal_says_where_the_declaration_goes(monkeypatch):
    _no_private_phase(monkeypatch)
    with _ridge_model(), pytest.raises(pymc_dp.ModelNotSupportedError) as err:
        penalty_sample(**SAMPLE)
    assert "step_kwargs={'data_free_potentials': True}" in str(err.value)


def test_one_record_with_a_covariate_container_says_why_it_is_refused():
    """Found on the issue-26 review: with one record and a ``pm.Data`` covariate the message
    said only that the likelihood "does not separate"; it now says why (PyTensor broadcasts
    length-1 arrays) and what helps, before any data is read."""
    with pm.Model() as model:
        x = pm.Data("x", np.array([0.3]))
        b = pm.Normal("b", 0, 5, shape=2)
        pm.Normal("y", b[0] + b[1] * x, 1.0, observed=np.array([1.2]))
    with pytest.raises(pymc_dp.ModelNotSupportedError, match=r"one record \(n = 1\)"):
        pymc_dp.sample(
            model=model,
            epsilon=1.0,
            delta=1e-6,
            data_bounds={"x": (-1, 1), "y": (-10, 10)},
            random_seed=0,
            **SAMPLE,
        )
