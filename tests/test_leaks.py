"""Leak guards: nothing published contains a data value that was not privatized."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp

SENTINEL = 7.123456789
SAMPLE = dict(progressbar=False, compute_convergence_checks=False)

#: Every step class with settings for a small run (extended as step methods are added).
STEPS = {
    "DPPenaltyMetropolis": (pymc_dp.DPPenaltyMetropolis, {"clip_bound": 3.0}),
}
for _name, _kw in (
    ("DPHMC", {"grad_clip_bound": 3.0, "llr_clip_bound": 3.0, "n_leapfrog": 3, "step_size": 0.05}),
    ("DPFastMH", {"clip_bound": 3.0}),
):
    if hasattr(pymc_dp, _name):
        STEPS[_name] = (getattr(pymc_dp, _name), _kw)


def _sentinel_model():
    x = np.linspace(-1, 1, 40)
    x[17] = SENTINEL
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return model


def _strings(obj) -> list[str]:
    """Every string and number reachable from a result: repr of groups, attrs and values."""
    out = [repr(obj)]
    groups = obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)
    out.append(repr(dict(obj.attrs)))
    for g in groups:
        ds = obj[g.strip("/")]
        ds = ds.to_dataset() if hasattr(ds, "to_dataset") else ds
        out.append(repr(dict(ds.attrs)))
        for name in ds.variables:
            out.append(repr(dict(ds[name].attrs)))
    return out


def _arrays(obj) -> list[np.ndarray]:
    groups = obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)
    arrays = []
    for g in groups:
        ds = obj[g.strip("/")]
        ds = ds.to_dataset() if hasattr(ds, "to_dataset") else ds
        arrays += [np.asarray(ds[name].values) for name in ds.variables]
    return arrays


@pytest.mark.parametrize("name", sorted(STEPS))
def test_no_sentinel_in_anything_published(name, caplog):
    cls, kwargs = STEPS[name]
    model = _sentinel_model()
    caplog.set_level(logging.DEBUG)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            cls,
            epsilon=2.0,
            delta=1e-5,
            draws=30,
            tune=10,
            chains=2,
            step_kwargs=kwargs,
            cores=1,
            random_seed=5,
            **SAMPLE,
        )
        report = pymc_dp.privacy_report(idata)
        # an error after sampling (budget exhausted) must not carry data either
        step = cls(epsilon=2.0, delta=1e-5, draws=2, tune=0, chains=1, **kwargs)
        with pytest.raises(pymc_dp.BudgetExceededError) as err:
            pm.sample(3, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
    published = _strings(idata) + [str(report), str(err.value)]
    published += [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    text = "\n".join(published)
    for token in ("7.123456789", "7.12345", "7.1234"):
        assert token not in text, f"sentinel {token} published by {name}"
    for a in _arrays(idata):
        if np.issubdtype(a.dtype, np.number):
            assert not np.any(np.isclose(a, SENTINEL, rtol=0, atol=1e-9)), name
    for group in ("observed_data", "constant_data", "log_likelihood"):
        assert group not in {g.strip("/") for g in _group_names(idata)}


def _group_names(obj):
    return obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)


def test_step_warns_about_uncovered_free_variables(logistic_model):
    model, *_ = logistic_model
    with model, pytest.warns(UserWarning, match=r"\['w'\] must be sampled by pymc_dp steps"):
        pymc_dp.DPPenaltyMetropolis([model["a"]], clip_bound=3.0, noise_multiplier=2.0)


def test_step_warns_about_data_dependent_deterministic():
    x = np.linspace(-1, 1, 20)
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Deterministic("resid", x - t)
        pm.Normal("x", t, 1, observed=x)
    with model, pytest.warns(UserWarning, match=r"Deterministics \['resid'\] depend on the data"):
        pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
