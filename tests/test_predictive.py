"""pymc_dp.sample_posterior_predictive: predictive draws of a DP result without the raw data."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
RAW = ("observed_data", "constant_data", "log_likelihood", "predictions_constant_data")


def _groups(idata) -> list[str]:
    if hasattr(idata, "children"):  # xarray.DataTree (PyMC 6.x)
        return list(idata.children)
    return list(idata.groups())


def _dp_run(covariate: str | None, seed: int = 1):
    """A regression y ~ N(a + b x, 0.5) (or y ~ N(a, 0.5)) sampled privately."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, 30)
    y = 0.5 * x + rng.normal(0, 0.5, 30)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1)
        if covariate is None:
            pm.Normal("y", a, 0.5, observed=y)
        else:
            xd = pm.Data("x", x) if covariate == "data" else x
            yd = pm.Data("yobs", y) if covariate == "data" else y
            shape = xd.shape[0] if covariate == "data" else None
            pm.Normal("y", a + pm.Normal("b", 0, 1) * xd, 0.5, observed=yd, shape=shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                step=pymc_dp.DPPenaltyMetropolis,
                epsilon=1.0,
                delta=1e-5,
                draws=20,
                tune=0,
                chains=1,
                step_kwargs={"clip_bound": 3.0},
                random_seed=seed,
                **SAMPLE,
            )
        pymc_dp.privacy_report(idata)
    return model, idata


def _dp_attrs(idata) -> dict:
    return {k: v for k, v in idata.attrs.items() if k.startswith("dp_")}


@pytest.mark.parametrize("extend", [False, True])
def test_no_covariates_draws_without_raw_groups_and_with_the_privacy_attrs(extend):
    """PyMC's call adds observed_data (the raw data); pymc_dp's does not, keeps the dp_*
    attributes, and with extend_inferencedata=True the DP result stays private."""
    model, idata = _dp_run(None)
    with model:
        plain = pm.sample_posterior_predictive(idata.copy(), random_seed=1, progressbar=False)
        assert "observed_data" in _groups(plain)  # what pymc_dp's call removes
        pp = pymc_dp.sample_posterior_predictive(
            idata, random_seed=1, progressbar=False, extend_inferencedata=extend
        )
    assert "posterior_predictive" in _groups(pp)
    assert not set(RAW) & set(_groups(pp))
    attrs = _dp_attrs(idata)
    assert attrs["dp_private"] == 1
    got = _dp_attrs(pp)
    assert set(got) >= set(attrs)
    assert got["dp_epsilon"] == attrs["dp_epsilon"] and got["dp_private"] == 1
    assert pp["posterior_predictive"]["y"].shape[-1] == 30
    assert ("posterior_predictive" in _groups(idata)) == extend
    assert not set(RAW) & set(_groups(idata))
    with model:
        rep = pymc_dp.privacy_report(idata)
    assert rep.private, rep.not_private_reasons
    assert rep.epsilon == pytest.approx(attrs["dp_epsilon"])


@pytest.mark.parametrize("covariate", ["numpy", "data"])
def test_draws_at_the_records_covariates_are_refused(covariate):
    """Draw i at x_i reveals x_i (its mean over draws is a + b x_i): refused, and the DP
    result is not extended."""
    model, idata = _dp_run(covariate)
    before = _groups(idata)
    with model, pytest.raises(ValueError, match=r"draws of \['y'\] read record data"):
        pymc_dp.sample_posterior_predictive(
            idata, random_seed=1, progressbar=False, extend_inferencedata=True
        )
    assert _groups(idata) == before


def test_draws_at_public_covariates():
    """With public_data the draws are at the public grid, the group records the containers
    set, and privacy_report accepts the extended DP result (it refuses draws at the records'
    covariates: test_report.py::test_posterior_predictive_at_the_records_covariates...)."""
    model, idata = _dp_run("data")
    grid = np.linspace(-1, 1, 5)
    with model:
        pp = pymc_dp.sample_posterior_predictive(
            idata,
            public_data={"x": grid, "yobs": np.zeros(5)},
            random_seed=2,
            progressbar=False,
            extend_inferencedata=True,
        )
    assert not set(RAW) & set(_groups(pp)) and not set(RAW) & set(_groups(idata))
    draws = np.asarray(pp["posterior_predictive"]["y"].values)
    assert draws.shape == (1, 20, 5)
    assert pp["posterior_predictive"].attrs["dp_public_data"] == "x,yobs"
    # y_rep = a + b g + e, e ~ N(0, 0.5^2): the residual's mean over 20 draws has sd 0.5/sqrt(20)
    post = idata["posterior"]
    mean = np.asarray(post["a"].values)[..., None] + np.asarray(post["b"].values)[..., None] * grid
    resid = (draws - mean).mean(axis=(0, 1))
    assert np.all(np.abs(resid) < 4.5 * 0.5 / np.sqrt(20)), resid
    with model:
        rep = pymc_dp.privacy_report(idata)
    assert rep.private, rep.not_private_reasons


def test_public_data_must_name_data_containers_and_cover_every_read():
    model, idata = _dp_run("data")
    with model:
        with pytest.raises(ValueError, match=r"pm.Data containers of the model: \['a', 'z'\]"):
            pymc_dp.sample_posterior_predictive(idata, public_data={"z": 1, "a": 1})
        # the observed container replaced but not the covariate: still refused
        with pytest.raises(ValueError, match=r"read record data \['x'\]"):
            pymc_dp.sample_posterior_predictive(
                idata, public_data={"yobs": np.zeros(30)}, random_seed=1, progressbar=False
            )


def test_refuses_a_result_without_dp_stats():
    model, _ = _dp_run(None)
    with model:
        idata = pm.sample(10, tune=0, chains=1, step=pm.Metropolis(), random_seed=1, **SAMPLE)
        with pytest.raises(ValueError, match="takes a pymc_dp result"):
            pymc_dp.sample_posterior_predictive(idata)


def test_predictions_group_at_public_covariates_without_its_constant_data():
    """predictions=True: PyMC adds predictions_constant_data (the containers' values, the
    records' observed container among them unless replaced); it is removed."""
    model, idata = _dp_run("data")
    grid = np.linspace(-1, 1, 4)
    with model:
        plain = pm.sample_posterior_predictive(
            idata.copy(), predictions=True, random_seed=1, progressbar=False
        )
        assert "predictions_constant_data" in _groups(plain)  # what pymc_dp's call removes
        with pytest.raises(ValueError, match=r"read record data \['x'\]"):
            pymc_dp.sample_posterior_predictive(
                idata, predictions=True, random_seed=1, progressbar=False
            )
        pp = pymc_dp.sample_posterior_predictive(
            idata,
            public_data={"x": grid, "yobs": np.zeros(4)},
            predictions=True,
            random_seed=1,
            progressbar=False,
        )
    assert "predictions" in _groups(pp) and not set(RAW) & set(_groups(pp))
    assert pp["predictions"]["y"].shape == (1, 20, 4)
    assert pp.attrs["dp_private"] == 1


def test_report_judges_a_predictions_group_made_by_pymc():
    """PyMC's predictions=True, extend_inferencedata=True without pm.set_data put draws at the
    records' covariates and the containers' values (predictions_constant_data) into the DP
    result: the report had called it private."""
    model, idata = _dp_run("data")
    with model:
        pm.sample_posterior_predictive(
            idata, predictions=True, extend_inferencedata=True, random_seed=1, progressbar=False
        )
        with pytest.warns(UserWarning):
            rep = pymc_dp.privacy_report(idata)
    assert not rep.private
    reasons = " ".join(rep.not_private_reasons)
    assert "predictions group holds draws of ['y']" in reasons
    assert "predictions_constant_data" in reasons
