"""DPSubsampledPenalty (thesis Sec. 4.1, Lemma 1, Theorem 9): sensitivity, approximation,
exactness at b = n, subsampled RDP report, calibration, reproducibility, bad input, audit."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import assert_matches_distribution, normal_mean_model, posterior_array
from scipy import stats

import pymc_dp
from pymc_dp.accounting import (
    WORSubsampledGaussian,
    calibrate_wor_subsampled_noise,
    wor_subsampled_gaussian_epsilon,
)
from pymc_dp.audit import _normal_record_functions, audit_mechanism
from pymc_dp.records import build_record_functions
from pymc_dp.step_methods.subsampled_penalty import (
    DPSubsampledPenalty,
    minibatch_estimate,
    subsampled_penalty_runner,
    subsampled_penalty_sensitivity,
)

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


# -- kernel -------------------------------------------------------------------------------------


def test_full_batch_estimate_is_the_clipped_sum_with_zero_variance():
    rng = np.random.default_rng(0)
    r = rng.normal(size=30)
    r[3] = np.nan
    lam, var = minibatch_estimate(r, 30, 0.5)
    assert lam == pytest.approx(np.sum(np.clip(np.nan_to_num(r), -0.5, 0.5)))
    assert var == 0.0
    # b < n: the plug-in variance times the finite-population factor
    lam, var = minibatch_estimate(r[:10], 30, np.inf)
    rr = np.nan_to_num(r[:10])
    assert lam == pytest.approx(3.0 * rr.sum())
    assert var == pytest.approx((1 - 10 / 30) * 9.0 * np.sum((rr - rr.mean()) ** 2))


@pytest.mark.parametrize(("n", "b"), [(50, 2), (50, 7), (1000, 100), (40, 40)])
def test_sensitivity_bounds_every_neighbouring_batch(n, b):
    """Lemma 1 + Delta_lambda: |f(B) - f(B')| <= c for batches differing in one record.

    Random and adversarial batches (values at +-Lh, where the variance term is extreme).
    """
    rng = np.random.default_rng(b)
    L, h = 1.7, 0.3
    c = subsampled_penalty_sensitivity(n, b, L, h)
    a = L * h
    worst = 0.0
    for t in range(3000):
        if t % 3 == 0:
            batch = rng.uniform(-a, a, size=b)
        else:
            batch = rng.choice([-a, a], size=b) * (1 if t % 3 == 1 else rng.uniform(size=b))
        other = batch.copy()
        other[0] = rng.choice([-a, a, rng.uniform(-a, a), 50.0 * a])  # clipped to +-a
        f = [lam - v / 2 for lam, v in (minibatch_estimate(x, n, a) for x in (batch, other))]
        worst = max(worst, abs(f[0] - f[1]))
    assert worst <= c * (1 + 1e-12)
    assert worst > 0.25 * c  # the bound is not vacuous


@pytest.mark.parametrize("h", [0.3, 0.6])
def test_clt_penalty_approximation(h):
    """The stated approximation: E[exp(lambda_hat - lambda - sigma_b^2 / 2)] = 1.

    This is what makes the penalty test exact (Ceperley & Dewing); with the CLT and the
    plug-in variance it holds to within 2 % while sigma_b^2 <= 0.65 (docs/steps/
    subsampled-penalty.md). Monte Carlo over 20 000 minibatches of real model ratios
    (n = 2000, b = 200, T = 0.01); tolerance 2 % + 4 Monte Carlo standard errors.
    """
    rng = np.random.default_rng(0)
    n, b = 2000, 200
    x = np.clip(rng.normal(0.5, 1, size=n), -3, 3)
    with pm.Model() as m:
        t = pm.Normal("t", 0, 10)
        pm.Normal("x", t, 1, observed=x)
    fns = build_record_functions(m, m.value_vars, m.initial_point(), tempering=0.01)[0]
    r = fns.loglik_ratio(np.array([0.5 + h / 2]), np.array([0.5 - h / 2]))
    idx = np.argsort(rng.uniform(size=(20_000, n)), axis=1)[:, :b]
    lam, var = minibatch_estimate(r[idx], n, np.inf)
    assert var.mean() < 0.65
    w = np.exp(lam - r.sum() - var / 2)
    mcse = w.std() / np.sqrt(w.size)
    print(f"h={h}: mean sigma_b^2 {var.mean():.3f}, E[w] = {w.mean():.4f} +- {mcse:.4f}")
    assert abs(w.mean() - 1.0) < 0.02 + 4 * mcse


# -- statistical --------------------------------------------------------------------------------


@pytest.mark.slow
def test_exact_with_full_batch():
    """b = n: sigma_b^2 = 0, the exact penalty test: closed-form posterior within 4 MCSE."""
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = DPSubsampledPenalty(
            batch_size=50,
            clip_bound=50.0,
            noise_multiplier=0.03,
            proposal_scale=0.2,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(2000, tune=500, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    st = idata["sample_stats"]
    assert np.nanmax(st["clip_fraction_NONPRIVATE"].values) == 0.0
    assert np.nanmax(st["batch_var_NONPRIVATE"].values) == 0.0
    assert np.nanmax(st["noise_std"].values) > 0.1  # the noise is really on
    assert_matches_distribution(
        posterior_array(idata, "theta")[..., 0], stats.norm(mean[0], sd[0]), label="theta"
    )


@pytest.mark.slow
def test_minibatch_tempered_posterior():
    """b = n / 10 with tempering T = 0.01: the tempered conjugate posterior.

    The acceptance approximation is within 2 % per step here (sigma_b^2 <= 0.65, tested
    above; checked on the run's stats); tolerance 4 MCSE of the mean plus the KS test.
    """
    rng = np.random.default_rng(5)
    n, T = 2000, 0.01
    x = np.clip(rng.normal(0.5, 1, size=n), -3, 3)
    with pm.Model():
        t = pm.Normal("t", 0, 10)
        pm.Normal("x", t, 1, observed=x)
        step = DPSubsampledPenalty(
            batch_size=200,
            clip_bound=0.06,  # T |x - theta| <= 0.06 for |theta| <= 3: never clips
            noise_multiplier=0.05,
            proposal_scale=0.2,
            target_accept=0.6,  # short steps keep sigma_b^2 small
            tempering=T,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(2500, tune=500, chains=4, cores=1, step=step, random_seed=3, **SAMPLE)
    st = idata["sample_stats"]
    assert np.nanmax(st["clip_fraction_NONPRIVATE"].values) == 0.0
    assert np.nanmean(st["batch_var_NONPRIVATE"].values) < 0.65
    prec = 1 / 100 + n * T
    assert_matches_distribution(
        posterior_array(idata, "t"),
        stats.norm(T * x.sum() / prec, 1 / np.sqrt(prec)),
        label="t",
    )


# -- privacy report, calibration, budget --------------------------------------------------------


def test_report_is_the_wor_subsampled_closed_form():
    model, *_ = normal_mean_model(n=60, d=1)
    with model:
        step = DPSubsampledPenalty(batch_size=12, clip_bound=5.0, noise_multiplier=1.5)
        idata = pm.sample(20, tune=10, chains=2, cores=1, step=step, random_seed=1, **SAMPLE)
    rep = pymc_dp.privacy_report(idata, delta=1e-4, attach=False)
    expected = wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(1.5, 60, 12, 60)], 1e-4)
    assert rep.epsilon == pytest.approx(expected)
    assert rep.iterations == 60
    assert "without-replacement" in rep.mechanism


def test_calibrated_plan_meets_target_and_budget_guard():
    model, *_ = normal_mean_model(n=100, d=1)
    with model:
        step = DPSubsampledPenalty(
            batch_size=20, clip_bound=5.0, epsilon=3.0, delta=1e-3, draws=30, tune=10, chains=2
        )
        z = calibrate_wor_subsampled_noise(3.0, 1e-3, 100, 20, 80)
        assert step.noise_multiplier == pytest.approx(z)
        idata = pm.sample(30, tune=10, chains=2, cores=1, step=step, random_seed=1, **SAMPLE)
        rep = pymc_dp.privacy_report(idata, attach=False)
        assert rep.delta == 1e-3 and rep.epsilon <= 3.0 and rep.epsilon > 2.9
        with pytest.raises(pymc_dp.BudgetExceededError, match="calibrated for 40 iterations"):
            pm.sample(31, tune=10, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)


def _run(cores):
    model, *_ = normal_mean_model(n=40, d=2)
    with model:
        step = DPSubsampledPenalty(
            batch_size=10, clip_bound=5.0, noise_multiplier=0.1, proposal_scale=0.03
        )
        return pm.sample(40, tune=10, chains=2, cores=cores, step=step, random_seed=7, **SAMPLE)


def test_same_draws_for_cores_1_and_2():
    a, b = _run(1), _run(2)
    np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    assert 0 < a["sample_stats"]["accepted"].values.mean() < 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 5, "clip_bound": 0.0, "noise_multiplier": 1.0}, "clip_bound"),
        ({"batch_size": 0, "clip_bound": 1.0, "noise_multiplier": 1.0}, "batch_size"),
        ({"batch_size": 1, "clip_bound": 1.0, "noise_multiplier": 1.0}, "batch_size"),
        ({"batch_size": 11, "clip_bound": 1.0, "noise_multiplier": 1.0}, "batch_size"),
        ({"batch_size": 2.5, "clip_bound": 1.0, "noise_multiplier": 1.0}, "batch_size"),
        ({"batch_size": 5, "clip_bound": 1.0, "noise_multiplier": -1.0}, "noise_multiplier"),
        ({"batch_size": 5, "clip_bound": 1.0}, "exactly one"),
        ({"batch_size": 5, "clip_bound": 1.0, "epsilon": 1.0, "delta": 1e-5}, "draws"),
        (
            {"batch_size": 5, "clip_bound": 1.0, "noise_multiplier": 1.0, "tempering": 0},
            "tempering",
        ),
        (
            {"batch_size": 5, "clip_bound": 1.0, "noise_multiplier": 1.0, "target_accept": 1},
            "target_accept",
        ),
        (
            {
                "batch_size": 5,
                "clip_bound": 1.0,
                "epsilon": 1.0,
                "delta": 2.0,
                "draws": 1,
                "tune": 0,
                "chains": 1,
            },
            "delta",
        ),
    ],
)
def test_bad_input_raises_before_reading_data(kwargs, match, monkeypatch):
    import pymc_dp.step_methods.base as base

    def fail(*a, **k):
        raise AssertionError("record functions were built before the input was validated")

    monkeypatch.setattr(base, "build_record_functions", fail)
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.raises(ValueError, match=match):
        DPSubsampledPenalty(**kwargs)


# -- audit --------------------------------------------------------------------------------------


def _audit(**broken):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fns = _normal_record_functions(100.0), _normal_record_functions(-100.0)
    run = subsampled_penalty_runner(
        *fns, np.array([0.0]), np.array([0.3]), batch_size=5, clip_bound=2.0,
        noise_multiplier=1.0, **broken,
    )  # fmt: skip
    return audit_mechanism(run, 1e-5, trials=200_000, seed=3)


CLAIM = wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(1.0, 10, 5, 1)], 1e-5)


@pytest.mark.slow
def test_audit_as_shipped_holds():
    res = _audit()
    print(f"DPSubsampledPenalty as shipped: claimed {CLAIM:.3f}, empirical {res.eps_lb:.3f}")
    assert 0.05 < res.eps_lb <= CLAIM


@pytest.mark.slow
@pytest.mark.parametrize("broken", [{"noise_scale": 0.0}, {"noise_scale": 0.05}])
def test_audit_catches_broken_variants(broken):
    res = _audit(**broken)
    print(f"DPSubsampledPenalty {broken}: claimed {CLAIM:.3f}, empirical {res.eps_lb:.3f}")
    assert res.eps_lb > CLAIM
