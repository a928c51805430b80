"""Tests with the power to catch a wrong penalty kernel.

The exactness tests elsewhere run at small noise, where dropping the penalty correction
``-sigma^2/2`` inflates the posterior sd by only 3-10 % (below a KS test's power there).
Here: the penalty acceptance against its closed form and detailed balance, and every
penalty-type step at large noise (sigma around 3) with a second-moment check within its
Monte Carlo standard error. ``dev/mutants.py`` shows that each mutant of the kernels is
caught by these tests.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import exact_dphmc, normal_mean_model, posterior_array
from scipy import stats

import pymc_dp
from pymc_dp.kernels.penalty import penalty_log_acceptance

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


def penalty_acceptance_closed_form(lam: float, sigma: float) -> float:
    """``E[min(1, exp(lam + xi - sigma^2/2))]``, ``xi ~ N(0, sigma^2)``.

    With ``Y = lam - sigma^2/2 + xi``: ``P(Y > 0) + E[e^Y; Y <= 0]
    = Phi((lam - sigma^2/2) / sigma) + e^lam Phi((-lam - sigma^2/2) / sigma)``.
    """
    s = sigma
    return stats.norm.cdf((lam - s * s / 2) / s) + np.exp(lam) * stats.norm.cdf(
        (-lam - s * s / 2) / s
    )


@pytest.mark.parametrize("sigma", [0.5, 3.0])
@pytest.mark.parametrize("lam", [-2.0, -0.3, 0.0, 0.7, 1.5])
def test_penalty_acceptance_matches_closed_form(lam, sigma):
    rng = np.random.default_rng(17)
    m = 400_000
    log_a = penalty_log_acceptance(np.full(m, lam), 0.0, 0.0, sigma, rng)
    a = np.minimum(1.0, np.exp(log_a))
    se = a.std() / np.sqrt(m)
    assert abs(a.mean() - penalty_acceptance_closed_form(lam, sigma)) < 5 * se


@pytest.mark.parametrize("sigma", [0.5, 3.0])
@pytest.mark.parametrize("lam", [0.4, 1.5])
def test_penalty_acceptance_detailed_balance(lam, sigma):
    """``alpha(lam) / alpha(-lam) = e^lam`` (Ceperley & Dewing 1999), estimated by Monte Carlo."""
    rng = np.random.default_rng(5)
    m = 1_000_000
    a_fwd = np.minimum(1.0, np.exp(penalty_log_acceptance(np.full(m, lam), 0.0, 0.0, sigma, rng)))
    a_bwd = np.minimum(1.0, np.exp(penalty_log_acceptance(np.full(m, -lam), 0.0, 0.0, sigma, rng)))
    ratio = a_fwd.mean() / a_bwd.mean()
    # delta method: relative variance of a ratio of independent means
    rel_se = np.sqrt((a_fwd.var() / m) / a_fwd.mean() ** 2 + (a_bwd.var() / m) / a_bwd.mean() ** 2)
    assert abs(np.log(ratio) - lam) < 5 * rel_se
    # the closed form satisfies it exactly
    assert penalty_acceptance_closed_form(lam, sigma) / penalty_acceptance_closed_form(
        -lam, sigma
    ) == pytest.approx(np.exp(lam), rel=1e-12)


def assert_first_two_moments(draws: np.ndarray, mean: float, sd: float, label: str) -> None:
    """Mean and second central moment within 4 Monte Carlo standard errors.

    MCSE of the mean: ``sd / sqrt(ESS)``; of ``E[(x - mean)^2]``: the sd of the squared
    deviations over the square root of their own ESS.
    """
    draws = np.asarray(draws, dtype=float)
    ess = float(az.ess(draws))
    dev = (draws - mean) ** 2
    ess2 = float(az.ess(dev))
    assert ess > 150 and ess2 > 150, f"{label}: ESS {ess:.0f} / {ess2:.0f} too small"
    z1 = (draws.mean() - mean) / (sd / np.sqrt(ess))
    z2 = (dev.mean() - sd**2) / (dev.std() / np.sqrt(ess2))
    assert abs(z1) < 4, f"{label}: mean off by {z1:.1f} MCSE (ESS {ess:.0f})"
    assert abs(z2) < 4, (
        f"{label}: second moment {dev.mean():.5f} vs {sd**2:.5f}, off by {z2:.1f} MCSE "
        f"(ESS {ess2:.0f})"
    )


def _noise(idata, name: str) -> float:
    return float(np.nanmedian(idata["sample_stats"][name].values))


@pytest.mark.slow
def test_penalty_metropolis_exact_at_large_noise():
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=50.0,
            noise_multiplier=0.22,
            proposal_scale=0.2,
            nonprivate_diagnostics=True,
        )
        # no warmup: the adaptation would shrink the steps and with them the noise
        idata = pm.sample(10_000, tune=0, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    assert np.nanmax(idata["sample_stats"]["clip_fraction_NONPRIVATE"].values) == 0.0
    assert 2.5 < _noise(idata, "noise_std") < 3.5  # sigma around 3
    assert_first_two_moments(posterior_array(idata, "theta")[..., 0], mean[0], sd[0], "theta")


@pytest.mark.slow
def test_subsampled_penalty_full_batch_exact_at_large_noise():
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPSubsampledPenalty(
            batch_size=50,
            clip_bound=50.0,
            noise_multiplier=0.22,
            proposal_scale=0.2,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(10_000, tune=0, chains=4, cores=1, step=step, random_seed=12, **SAMPLE)
    assert np.nanmax(idata["sample_stats"]["clip_fraction_NONPRIVATE"].values) == 0.0
    assert 2.0 < _noise(idata, "noise_std") < 4.0
    assert_first_two_moments(posterior_array(idata, "theta")[..., 0], mean[0], sd[0], "theta")


@pytest.mark.slow
def test_dphmc_exact_at_large_noise():
    """DP-HMC with penalty noise sigma_l around 2.3 (median): HMC mixes slowly at this noise
    (acceptance ~0.35, ESS ~0.3 % of the draws), hence the long run."""
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = exact_dphmc(
            llr_noise_multiplier=0.45, grad_noise_multiplier=0.01, n_leapfrog=2, step_size=0.1
        )
        idata = pm.sample(15_000, tune=0, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    ss = idata["sample_stats"]
    assert np.nanmax(ss["llr_clip_fraction_NONPRIVATE"].values) == 0.0
    assert np.nanmax(ss["grad_clip_fraction_NONPRIVATE"].values) == 0.0
    assert 2.0 < _noise(idata, "llr_noise_std") < 3.5
    assert_first_two_moments(posterior_array(idata, "theta")[..., 0], mean[0], sd[0], "theta")


def test_penalty_noise_std_is_z_times_the_sensitivity():
    """The released noise std is ``z * 2 b ||theta' - theta||`` at every iteration."""
    model, *_ = normal_mean_model(n=20, d=2)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=4.0, noise_multiplier=0.7)
        idata = pm.sample(30, tune=0, chains=1, step=step, random_seed=2, **SAMPLE)
    ss = idata["sample_stats"]
    expected = 0.7 * 2 * 4.0 * ss["step_norm"].values
    np.testing.assert_allclose(ss["noise_std"].values, expected, rtol=1e-12)
