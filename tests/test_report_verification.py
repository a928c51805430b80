"""The report vouches only for what it can verify from the result (and the model).

Each test failed on main at 99d13ac (issue 29, items 3 and 4): a thinned or sliced result
was reported for the iterations left, ``private=True``; a result whose control variate's
release was not accounted was vouched for; without the model, and with the raw records in
the result, the report still said ``private=True``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
X = np.random.default_rng(2).normal(0.3, 1.0, size=100)


def _model():
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=X)
    return model


def _run(model, **kw):
    with model:
        return pymc_dp.sample(
            20,
            tune=5,
            chains=2,
            cores=1,
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=2.0,
            delta=1e-5,
            step_kwargs={"clip_bound": 3.0},
            random_seed=1,
            **kw,
            **SAMPLE,
        )


def _report(idata, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pymc_dp.privacy_report(idata, attach=False, **kw)


@pytest.fixture(scope="module")
def run():
    model = _model()
    return model, _run(model)


def test_the_whole_run_with_its_model_is_private(run):
    model, idata = run
    rep = _report(idata, model=model)
    assert rep.private and np.isfinite(rep.epsilon) and not rep.unverified_reasons


@pytest.mark.parametrize(
    "cut", [slice(None, None, 5), slice(10, None), slice(None, None, -1)], ids=str
)
def test_a_thinned_or_sliced_result_is_not_vouched_for(run, cut):
    model, idata = run
    edited = idata.isel(draw=cut)
    rep = _report(edited, model=model)
    assert not rep.private and rep.epsilon == np.inf
    assert "not the contiguous iterations" in "; ".join(rep.not_private_reasons)


def test_chains_cut_short_of_the_plan_are_unverified(run):
    model, idata = run
    rep = _report(idata.isel(draw=slice(None, 15)), model=model)
    assert not rep.private and not rep.not_private_reasons
    assert "fewer than the 25 per chain" in "; ".join(rep.unverified_reasons)
    assert rep.epsilon < _report(idata, model=model).epsilon  # what is left, not vouched for


def test_without_the_model_the_report_is_unverified_not_private(run):
    _, idata = run
    rep = _report(idata)  # no model, no model context
    full = _report(idata, model=run[0])
    assert not rep.private and not rep.not_private_reasons
    assert "no model was given" in "; ".join(rep.unverified_reasons)
    assert rep.epsilon == full.epsilon  # the spend is still reported
    assert str(rep).startswith("UNVERIFIED")
    assert rep.to_attrs()["dp_private"] == 0


def test_raw_data_groups_make_the_result_not_private():
    model = _model()
    with pytest.warns(UserWarning, match="still carries raw data"):
        idata = _run(model, keep_data=True)
    rep = _report(idata, model=model)
    assert not rep.private and "observed_data" in "; ".join(rep.not_private_reasons)
    assert str(rep).startswith("NOT DIFFERENTIALLY PRIVATE")
    # removable: the epsilon is that of the result without them
    assert np.isfinite(rep.epsilon) and rep.epsilon == rep.mechanism_epsilon


def test_a_compound_run_with_a_non_dp_step_outside_the_model_is_not_vouched_for():
    """The issue's case: a DP step and pm.Metropolis, a stored Deterministic reading the data,
    the report computed outside the model."""
    with pm.Model():
        t = pm.Normal("t", 0, 3)
        sd = pm.HalfNormal("sd", 1)
        pm.Deterministic("resid", (X - t).mean())
        pm.Normal("x", t, sd, observed=X)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            steps = [
                pymc_dp.DPPenaltyMetropolis([t], clip_bound=3.0, noise_multiplier=5.0),
                pm.Metropolis([sd]),
            ]
            idata = pm.sample(10, tune=0, chains=1, step=steps, random_seed=1, **SAMPLE)
    rep = _report(idata, delta=1e-5)
    assert not rep.private and "-DP" not in str(rep).splitlines()[0]


@pytest.mark.parametrize("method", ["chain", "laplace"])
def test_a_control_variate_without_its_account_is_refused(method):
    """The chain's control variate and the one-shot strategy's draws both come from
    releases made before the chains: without their account the report refuses."""
    model = _model()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", pymc_dp.ConvergenceWarning)
        idata = pymc_dp.sample(
            epsilon=2.0, delta=1e-5, chains=1, cores=1, random_seed=3,
            auto_kwargs={"max_iterations": 200, "method": method}, **SAMPLE,
        )  # fmt: skip
    assert idata.attrs["dp_method"] == method
    assert _report(idata, model=model).private
    for attrs in (idata.attrs, idata["posterior"].attrs):
        for k in [k for k in attrs if k.startswith("dp_")]:
            del attrs[k]
    rep = _report(idata, model=model)
    assert not rep.private and rep.epsilon == np.inf
    assert "dp_presample_mu" in "; ".join(rep.not_private_reasons)
