"""Privacy guards around the steps: data that must never reach a test or a result unnoised.

Each test here failed on main at e434abe (issue 14 of the tracker): a prior reading the data,
aggregates slipping through the separability check, PyMC's imputation of missing values, a
report vouching for a result that holds non-private values, chains beyond the plan, and two
DP-Fast MH defects.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_dp
from pymc_dp.records import build_record_functions
from pymc_dp.records.fakes import fake_rows as _fake_rows
from pymc_dp.step_methods.base import BudgetExceededError

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
ROOT = Path(__file__).resolve().parents[2]
X = np.random.default_rng(0).normal(size=40)


def _build(model):
    with model:
        return build_record_functions(model, model.value_vars, model.initial_point())


# -- 1. nothing outside the per-record likelihood may read record data ------------------------


def _prior_reads_data():
    with pm.Model() as model:
        xd = pm.Data("xd", X)
        t = pm.Normal("t", mu=xd.mean(), sigma=1)
        pm.Normal("y", t, 1, observed=xd)
    return model


def test_prior_reading_data_is_refused_everywhere():
    model = _prior_reads_data()
    with pytest.raises(pymc_dp.ModelNotSupportedError, match=r"prior of 't' reads record data"):
        _build(model)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError, match="prior of 't'"):
        pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError, match="prior of 't'"):
        pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=2.0,
            delta=1e-4,
            draws=10,
            tune=0,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
        )


def test_prior_reading_a_covariate_container_is_refused():
    # a prior scale computed from a pm.Data covariate (one row per record), not the observed
    with pm.Model() as model:
        zd = pm.Data("z", np.abs(X) + 1.0)
        s = pm.HalfNormal("s", sigma=zd.std())
        pm.Normal("y", 0.0, s * zd, observed=X)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="prior of 's'.*z"):
        _build(model)


def test_initial_value_from_data_is_refused():
    with pm.Model() as model:
        xd = pm.Data("xd", X)
        t = pm.Normal("t", 0, 1, initval=xd.mean())
        pm.Normal("y", t, 1, observed=xd)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="initial value of 't'"):
        _build(model)


def test_prior_reading_only_a_shape_is_accepted():
    rng = np.random.default_rng(1)
    with pm.Model() as model:
        Xd = pm.Data("X", rng.normal(size=(40, 3)))
        b = pm.Normal("b", 0, 1, shape=Xd.shape[1])
        pm.Normal("y", Xd @ b, 1, observed=X)
    fns, _ = _build(model)
    assert fns.n_records == 40


# -- 2. the separability check sees aggregates and other records ------------------------------


AGGREGATES = {
    "mean": lambda v: v.mean(),
    "sum": lambda v: v.sum(),
    "std": lambda v: v.std(),
    "max": lambda v: v.max(),
    "median-by-sort": lambda v: pt.sort(v)[v.shape[0] // 2],
    "sort": lambda v: pt.sort(v),
    "cumsum": lambda v: pt.cumsum(v),
    "neighbour difference": lambda v: pt.concatenate([v[:1] * 0, v[1:] - v[:-1]]),
}


@pytest.mark.parametrize("name", sorted(AGGREGATES))
def test_likelihood_reading_an_aggregate_of_pm_data_is_refused(name):
    with pm.Model() as model:
        xd = pm.Data("xd", X)
        t = pm.Normal("t", 0, 1)
        pm.Normal("y", t + 0.1 * AGGREGATES[name](xd), 1, observed=xd)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="does not separate"):
        _build(model)


@pytest.mark.parametrize("name", sorted(AGGREGATES))
def test_likelihood_reading_an_aggregate_of_a_numpy_constant_in_the_graph_is_refused(name):
    """The same aggregates of a numpy array written into the graph (``pt.as_tensor(X)``):
    PyMC's log-probability folds them into constants, which the per-record check then took
    for public numbers or per-record data. Before the guard on the observed variables' own
    graphs, ``mean`` was built and sampled (its gradient sums used the data's mean without
    noise)."""
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Normal("y", t + 0.1 * AGGREGATES[name](pt.as_tensor(X)), 1, observed=X)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="aggregate of a numpy array"):
        _build(model)


ROW_WISE = {  # (the graph's mean, the same in numpy)
    "log": lambda c, g, b: b[0] * np.log(c + 10.0),
    "two columns": lambda c, g, b: (
        pt.dot(pt.stack([c, c**2], axis=1), b)
        if isinstance(c, pt.TensorVariable)
        else np.column_stack([c, c**2]) @ b
    ),
    "square": lambda c, g, b: b[0] * c**2 + b[1],
    "group gather": lambda c, g, b: (
        b[0]
        + (
            pt.as_tensor(np.array([0.0, 1.0, 2.0]))[g]
            if isinstance(g, pt.TensorVariable)
            else np.array([0.0, 1.0, 2.0])[g]
        )
    ),
}


@pytest.mark.parametrize("name", sorted(ROW_WISE))
def test_row_wise_numpy_constants_in_the_graph_are_accepted(name):
    """Row-wise functions of numpy arrays in the graph (PyMC folds them too) keep record i on
    row i: accepted, and each record's log-likelihood is its own."""
    groups = np.arange(40) % 3
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1, shape=2)
        mu = ROW_WISE[name](pt.as_tensor(X), pt.as_tensor(groups), b)  # numpy ufuncs act on it
        pm.Normal("y", mu, 1, observed=X)
    fns, _ = _build(model)
    q = np.array([0.3, -0.2])
    mu = ROW_WISE[name](X, groups, q)
    expected = -0.5 * (X - mu) ** 2 - 0.5 * np.log(2 * np.pi)
    np.testing.assert_allclose(fns.loglik(q), expected, rtol=1e-10)


def test_likelihood_reading_the_mean_of_integer_data_is_refused():
    y = (np.arange(40) % 3 == 0).astype("int64")
    with pm.Model() as model:
        yd = pm.Data("yd", y)
        a = pm.Normal("a", 0, 1)
        pm.Bernoulli("y", logit_p=a + yd.mean(), observed=yd)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="does not separate"):
        _build(model)


def test_likelihood_reading_the_mean_of_a_covariate_is_refused():
    rng = np.random.default_rng(2)
    with pm.Model() as model:
        Xd = pm.Data("X", rng.normal(size=(40, 2)))
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Normal("y", (Xd - Xd.mean(axis=0)) @ b, 1, observed=X)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="does not separate"):
        _build(model)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "bool"])
@pytest.mark.parametrize("trailing", [(), (3,), (2, 2)])
def test_stand_in_rows_equal_no_aggregate_of_the_rows(dtype, trailing):
    (fake,) = _fake_rows([np.zeros((5, *trailing), dtype=dtype)], 8)
    rows = fake.reshape(8, -1).astype(float)
    if dtype.startswith("float"):
        assert len({r.tobytes() for r in rows}) == 8  # distinct
        assert not np.array_equal(np.sort(rows, axis=0), rows)  # not sorted
        assert np.all((rows > 0.1) & (rows < 0.95))
        for agg in (rows.mean(0), np.median(rows, 0), rows.std(0), rows.sum(0)):
            assert not np.any(np.isclose(rows, agg)), agg  # no entry equals an aggregate
        for agg in (rows.max(0), rows.min(0)):
            assert np.sum(np.isclose(rows, agg)) == rows.shape[1]  # one row per column
    else:  # 0/1 entries: the mean equals no entry, and every column holds both values
        assert set(np.unique(rows)) == {0.0, 1.0}
        assert not np.any(np.isclose(rows, rows.mean(0)))
        assert np.all(rows.min(0) == 0) and np.all(rows.max(0) == 1)


# -- 3. missing values: PyMC would publish every observed value -----------------------------


def _with_nan():
    x = X.copy()
    x[[3, 17]] = np.nan
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyMC's ImputationWarning
            pm.Normal("y", t, 1, observed=x)
    return model


def test_missing_values_are_refused_at_construction_and_in_sample():
    model = _with_nan()
    with model, pytest.raises(pymc_dp.ModelNotSupportedError, match="missing values") as e1:
        pymc_dp.DPPenaltyMetropolis([model["t"]], clip_bound=3.0, noise_multiplier=2.0)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError, match="missing values") as e2:
        pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=1.0,
            delta=1e-6,
            draws=10,
            tune=0,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
        )
    for e in (e1, e2):  # no count and no position
        assert not re.search(r"\d", str(e.value)), str(e.value)


def test_masked_array_observed_is_refused():
    x = np.ma.masked_array(X, mask=np.arange(40) == 5)
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pm.Normal("y", t, 1, observed=x)
    with pytest.raises(pymc_dp.ModelNotSupportedError, match="missing values"):
        _build(model)


# -- 4. the report does not vouch for what it cannot vouch for -------------------------------


def _two_parameter_model(deterministic: bool):
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        s = pm.HalfNormal("s", 1)
        if deterministic:
            pm.Deterministic("resid_mean", pt.as_tensor(X).mean() - mu)
        pm.Normal("x", mu, s, observed=X)
    return model


def test_report_flags_a_non_dp_step_in_a_compound_step():
    model = _two_parameter_model(deterministic=False)
    with model:
        step = [
            pymc_dp.DPPenaltyMetropolis([model["mu"]], clip_bound=3.0, noise_multiplier=2.0),
            pm.Metropolis([model["s"]]),
        ]
        idata = pm.sample(10, tune=2, chains=1, step=step, random_seed=1, **SAMPLE)
        with pytest.warns(UserWarning, match="NOT differentially private"):
            rep = pymc_dp.privacy_report(idata, delta=1e-5)
    assert not rep.private and rep.epsilon == np.inf and np.isfinite(rep.mechanism_epsilon)
    assert "1 of the model's 2 free parameters" in rep.not_private_reasons[0]
    first = str(rep).splitlines()[0]
    assert first.startswith("NOT DIFFERENTIALLY PRIVATE")
    assert idata.attrs["dp_private"] == 0 and idata.attrs["dp_epsilon"] == np.inf


def test_report_takes_the_model_explicitly_and_flags_a_data_deterministic():
    model = _two_parameter_model(deterministic=True)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
        idata = pm.sample(10, tune=2, chains=1, step=step, random_seed=1, **SAMPLE)
    with pytest.warns(UserWarning, match="NOT differentially private"):
        rep = pymc_dp.privacy_report(idata, delta=1e-5, model=model)
    assert not rep.private
    assert any("resid_mean" in r for r in rep.not_private_reasons)
    assert str(rep).startswith("NOT DIFFERENTIALLY PRIVATE")


def test_report_flags_stats_of_a_non_dp_step_without_the_model():
    model = _two_parameter_model(deterministic=False)
    with model:
        step = pymc_dp.DPPenaltyMetropolis([model["mu"]], clip_bound=3.0, noise_multiplier=2.0)
        # PyMC assigns NUTS to s: it reads the data freely
        idata = pm.sample(10, tune=2, chains=1, step=step, random_seed=1, **SAMPLE)
    with pytest.warns(UserWarning, match="NOT differentially private"):
        rep = pymc_dp.privacy_report(idata, delta=1e-5)  # no model context here
    assert not rep.private and not rep.model_checked
    assert any("not a pymc_dp step" in r for r in rep.not_private_reasons)


def test_report_of_a_private_run_is_private_and_checked():
    model = _two_parameter_model(deterministic=False)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=2.0,
            delta=1e-4,
            draws=10,
            tune=2,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
            random_seed=1,
            **SAMPLE,
        )
    rep = pymc_dp.privacy_report(idata, model=model)
    assert rep.private and rep.model_checked and rep.epsilon == rep.mechanism_epsilon <= 2.0
    # (10 draws: the first lines say NOT CONVERGED, then the guarantee)
    top = [line for line in str(rep).splitlines() if not line.startswith(" ")]
    assert top[0].startswith("NOT CONVERGED") and top[1].startswith("(epsilon, delta) = (")
    assert idata.attrs["dp_private"] == 1


# -- 5. chains beyond the plan -------------------------------------------------------------


def test_sequential_chain_beyond_the_plan_is_refused_before_it_reads_data():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=X)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0, epsilon=1.0, delta=1e-5, draws=10, tune=2, chains=1
        )
        calls = {"n": 0}
        llr = step._fns.clipped_loglik_ratio_sum

        def counting(*a, **k):
            calls["n"] += 1
            return llr(*a, **k)

        step._fns.clipped_loglik_ratio_sum = counting
        with pytest.raises(BudgetExceededError, match=r"and 1 chain\(s\).*this would be chain 2"):
            pm.sample(10, tune=2, chains=3, cores=1, step=step, random_seed=1, **SAMPLE)
    assert calls["n"] == 12  # the first chain only


def test_parallel_chain_overrun_is_flagged_by_the_report():
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=X)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0, epsilon=1.0, delta=1e-5, draws=10, tune=2, chains=1
        )
        idata = pm.sample(10, tune=2, chains=2, cores=2, step=step, random_seed=1, **SAMPLE)
        with pytest.warns(UserWarning, match="more than its steps were calibrated for"):
            rep = pymc_dp.privacy_report(idata)
    assert rep.plan_exceeded and rep.epsilon > 1.0
    assert "more chains than its steps were calibrated for" in str(rep)


# -- 6. DP-Fast MH ----------------------------------------------------------------------------


def test_fastmh_full_batch_with_per_record_bounds_treats_nan_as_clipped():
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=X)
        step = pymc_dp.DPFastMH(
            clip_bound=np.full(40, 0.5),
            max_step=0.2,
            lam=50.0,
            iter_epsilon=1.0,
            iter_delta=1e-6,
        )
    r = np.linspace(-0.05, 0.05, 40)
    r[7] = np.nan  # log-likelihood -inf at both points

    def terms_of_r(q1, q, idx, terms, merge=None, *, row_args=(), params=()):
        # the records' ratios are r: the per-part function sees them (all in one part)
        return terms(r[idx], *row_args, *params)

    step._fns.ratio_subset_terms = terms_of_r
    total, count = step._fullbatch_clipped_sum(np.ones(1), np.zeros(1), 0.2)
    assert np.isfinite(total) and count == 1
    assert total == pytest.approx(np.nansum(np.clip(r, -0.1, 0.1)))


def test_fastmh_caps_the_batch_at_n_before_allocating():
    x = np.random.default_rng(4).normal(size=20_000)
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=x)
        with pytest.warns(UserWarning, match="capped at n"):
            step = pymc_dp.DPFastMH(clip_bound=5.0, iter_epsilon=1.0, iter_delta=1e-6)
    assert step.max_batch <= 20_000


# -- 7. what cannot be detected is said plainly ---------------------------------------------


@pytest.mark.parametrize("page", ["README.md", "docs/privacy.md"])
def test_docs_say_aggregates_of_numpy_constants_void_the_guarantee(page):
    text = (ROOT / page).read_text()
    assert "xc - xc.mean()" in text
    assert re.search(r"stated epsilon is void", text)


def test_the_documented_numpy_aggregate_example_breaks_the_sensitivity():
    """The measurement quoted in README and docs/privacy.md, recomputed."""
    rng = np.random.default_rng(0)
    xc = np.clip(rng.normal(size=1000), -5, 5)

    def clipped_sum(x):
        with pm.Model() as model:
            mu = pm.Normal("mu", 0, 10)
            pm.Normal("x", mu, 1, observed=x - x.mean())
        fns, _ = _build(model)
        return fns.clipped_loglik_ratio_sum(np.array([0.25]), np.array([0.0]), 1.0 * 0.25)[0]

    moved = 0.0
    for j, value in ((int(np.argmin(xc)), 5.0), (int(np.argmax(xc)), -5.0)):
        x2 = xc.copy()
        x2[j] = value  # replace one record, inside the public range
        moved = max(moved, abs(clipped_sum(xc) - clipped_sum(x2)))
    claimed = 2 * 1.0 * 0.25
    assert moved > 2 * claimed
    assert round(moved, 2) == 1.03


def test_fastmh_refuses_an_explicit_batch_that_cannot_fit_in_memory():
    x = np.random.default_rng(4).normal(size=20_000)
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=x)
        with pytest.raises(ValueError, match=r"more than fit in memory.*lam or max_step"):
            pymc_dp.DPFastMH(clip_bound=5.0, max_batch=10**12, iter_epsilon=1.0, iter_delta=1e-6)
