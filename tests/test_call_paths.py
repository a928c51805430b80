"""Call paths a PyMC user writes, probed on real data in the eighteenth session (issue 26):
the ones that failed with a message naming the wrong cause."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.records import ModelNotSupportedError


def test_set_data_of_the_covariates_only_is_told_to_set_the_observed_values_too():
    """``pm.set_data({"X": new})`` with fewer rows while the observed values stay a numpy
    array of the old records: before, "the likelihood does not separate into one term per
    record (its graph failed on a subset of records: ValueError)" and nothing about why."""
    rng = np.random.default_rng(0)
    x, y = rng.uniform(-1, 1, (50, 2)), rng.normal(size=50)
    with pm.Model() as model:
        X = pm.Data("X", x)
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Normal("y", pm.math.dot(X, b), 1.0, observed=y)
        pm.set_data({"X": x[:30]})
    with model, pytest.raises(ModelNotSupportedError) as err:
        pymc_dp.sample(
            20, tune=20, chains=1, step=pymc_dp.DPPenaltyMetropolis, epsilon=3.0, delta=1e-6,
            step_kwargs={"clip_bound": 1.0}, progressbar=False,
        )  # fmt: skip
    text = str(err.value)
    assert "{'X': 30}" in text and "50 rows of the observed data" in text
    assert "pm.set_data" in text and "observed=pm.Data" in text


def test_a_group_level_data_container_of_another_length_is_not_blamed():
    """A pm.Data of group-level values (K rows, not n) is legitimate: a model that samples is
    not refused for it, and the explanation above names only a failing model's arrays."""
    rng = np.random.default_rng(1)
    g = rng.integers(0, 3, 40)
    y = rng.normal(size=40)
    with pm.Model():
        scale = pm.Data("group_scale", np.array([0.5, 1.0, 2.0]))
        mu = pm.Normal("mu", 0.0, 1.0)
        pm.Normal("y", mu * scale[g], 1.0, observed=y)
        idata = pymc_dp.sample(
            20, tune=20, chains=1, step=pymc_dp.DPPenaltyMetropolis, epsilon=3.0, delta=1e-6,
            step_kwargs={"clip_bound": 2.0}, progressbar=False, random_seed=1,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert idata.attrs["dp_private"] == 1
