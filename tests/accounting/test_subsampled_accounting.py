"""Accounting of subsampled Gaussian mechanisms and its use by the privacy report."""

from __future__ import annotations

import inspect

import arviz as az
import numpy as np
import pytest

import pymc_dp
from pymc_dp.accounting import (
    PoissonSubsampledGaussian,
    WORSubsampledGaussian,
    calibrate_poisson_subsampled_noise,
    calibrate_wor_subsampled_noise,
    gaussian_epsilon,
    poisson_subsampled_gaussian_epsilon,
    wor_subsampled_gaussian_epsilon,
)

pytest.importorskip("dp_accounting")


@pytest.mark.parametrize(("sigma", "count"), [(2.0, 3), (4.0, 10), (8.0, 50)])
def test_poisson_q1_is_the_tight_gaussian_composition(sigma, count):
    # q = 1, contributions bounded by C = 1 (replace-one distance 2): a Gaussian mechanism with
    # GDP parameter 2 / sigma, i.e. pymc_dp's mu = (2 / sigma)^2 / 2 per release.
    eps = poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(sigma, 1.0, count)], 1e-6)
    exact = gaussian_epsilon(count * 0.5 * (2.0 / sigma) ** 2, 1e-6)
    assert eps == pytest.approx(exact, rel=2e-3)
    assert eps >= exact * (1 - 1e-6)  # pessimistic discretisation never under-reports


def test_subsampling_amplifies_and_noise_helps():
    e = lambda s, q: poisson_subsampled_gaussian_epsilon(  # noqa: E731
        [PoissonSubsampledGaussian(s, q, 1000)], 1e-5
    )
    assert e(1.0, 0.01) < e(1.0, 0.1) < e(1.0, 1.0)
    assert e(2.0, 0.01) < e(1.0, 0.01)
    w = lambda b: wor_subsampled_gaussian_epsilon(  # noqa: E731
        [WORSubsampledGaussian(2.0, 10_000, b, 1000)], 1e-5
    )
    assert w(100) < w(1000) < w(10_000)


def test_wor_full_batch_is_no_better_than_the_tight_gaussian():
    # b = n: a plain Gaussian mechanism with sensitivity-normalised noise sigma, GDP 1/sigma.
    sigma, count = 3.0, 20
    eps = wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(sigma, 100, 100, count)], 1e-6)
    tight = gaussian_epsilon(count * 0.5 / sigma**2, 1e-6)
    assert tight <= eps < 1.5 * tight  # RDP conversion: valid, somewhat looser


def test_composition_of_groups_equals_one_group():
    a = poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(1.5, 0.02, 300)], 1e-6)
    b = poisson_subsampled_gaussian_epsilon(
        [PoissonSubsampledGaussian(1.5, 0.02, 100), PoissonSubsampledGaussian(1.5, 0.02, 200)],
        1e-6,
    )
    assert a == pytest.approx(b, rel=2e-3)


@pytest.mark.parametrize("target", [0.5, 4.0])
def test_calibration_meets_target_from_below(target):
    z = calibrate_poisson_subsampled_noise(target, 1e-6, 0.02, 500)
    got = poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(z, 0.02, 500)], 1e-6)
    assert got <= target
    looser = poisson_subsampled_gaussian_epsilon(
        [PoissonSubsampledGaussian(z / 1.01, 0.02, 500)], 1e-6
    )
    assert looser > target  # and not much more noise than needed
    zw = calibrate_wor_subsampled_noise(target, 1e-6, 10_000, 100, 500)
    assert wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(zw, 10_000, 100, 500)], 1e-6) <= (
        target
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(noise_multiplier=0.0, sampling_rate=0.1, count=1), "noise_multiplier"),
        (dict(noise_multiplier=1.0, sampling_rate=1.5, count=1), "sampling_rate"),
        (dict(noise_multiplier=1.0, sampling_rate=0.1, count=0), "count"),
    ],
)
def test_poisson_event_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PoissonSubsampledGaussian(**kwargs)


def test_wor_event_validation():
    with pytest.raises(ValueError, match="batch_size"):
        WORSubsampledGaussian(1.0, n=10, batch_size=11, count=1)
    with pytest.raises(ValueError, match="delta"):
        wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(1.0, 10, 5, 1)], 1.5)


# --- the privacy report reads the per-iteration stats of minibatch steps -----------------------


def _fake_result(chains, tune, draws, stats: dict, *, keep_warmup: bool):
    """A result shaped like pm.sample's, with constant per-iteration stats."""

    def block(length):
        out = {"dp_mu": np.zeros((chains, length)), "dp_releases": np.ones((chains, length))}
        out["dp_target_delta"] = np.full((chains, length), 1e-6)
        for k, v in stats.items():
            out[k] = np.full((chains, length), float(v))
        return out

    groups = {
        "posterior": {"x": np.zeros((chains, draws))},
        "sample_stats": block(draws),
    }
    if keep_warmup:
        groups["warmup_posterior"] = {"x": np.zeros((chains, tune))}
        groups["warmup_sample_stats"] = block(tune)
    if "data" in inspect.signature(az.from_dict).parameters:  # ArviZ 1.x (PyMC 6)
        idata = az.from_dict(groups, save_warmup=keep_warmup)
    else:  # ArviZ 0.x (PyMC 5)
        idata = az.from_dict(**groups, save_warmup=keep_warmup)
    if not keep_warmup:
        idata["posterior"].attrs["tuning_steps"] = tune
    return idata


@pytest.mark.parametrize("keep_warmup", [True, False])
def test_report_composes_poisson_subsampled_iterations(keep_warmup):
    chains, tune, draws = 2, 30, 70
    idata = _fake_result(
        chains,
        tune,
        draws,
        {"dp_poisson_sigma": 1.2, "dp_poisson_q": 0.01},
        keep_warmup=keep_warmup,
    )
    rep = pymc_dp.privacy_report(idata)
    k = chains * (tune + draws)
    expected = poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(1.2, 0.01, k)], 1e-6)
    assert rep.epsilon == pytest.approx(expected, rel=1e-9)
    assert "Poisson-subsampled" in rep.mechanism and str(k) in rep.mechanism


def test_report_combines_gaussian_and_wor_parts_conservatively():
    chains, tune, draws = 1, 10, 40
    idata = _fake_result(
        chains,
        tune,
        draws,
        {"dp_wor_sigma": 2.0, "dp_wor_batch": 100, "dp_wor_n": 10_000},
        keep_warmup=True,
    )
    k = chains * (tune + draws)
    wor_only = pymc_dp.privacy_report(idata, attach=False).epsilon
    assert wor_only == pytest.approx(
        wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(2.0, 10_000, 100, k)], 1e-6)
    )
    # add a Gaussian part (as a compound step with a full-data step would)
    for g in ("sample_stats", "warmup_sample_stats"):
        ds = idata[g]
        ds["dp_mu"] = ds["dp_mu"] + 0.01
    both = pymc_dp.privacy_report(idata, attach=False)
    gauss_only = gaussian_epsilon(0.01 * k, 1e-6)
    # sequential composition at half the delta each: more than either part alone
    assert both.epsilon > wor_only and both.epsilon > gauss_only
    assert both.epsilon == pytest.approx(
        gaussian_epsilon(0.01 * k, 5e-7)
        + wor_subsampled_gaussian_epsilon([WORSubsampledGaussian(2.0, 10_000, 100, k)], 5e-7),
        rel=1e-6,
    )
    assert "delta split equally" in both.mechanism
