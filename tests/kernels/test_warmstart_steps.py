"""The warm start's steps (`pymc_dp.kernels.warmstart.private_laplace`): a histogram that says
nothing keeps the last clip bound, and the check of the steps after a rejected Newton step
once the warm start has landed (`step_merit_check`, off by default: `CHECK_AFTER_REJECTION`).
Issue 26, sixteenth session."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import exact_laplace

from pymc_dp.kernels import warmstart
from pymc_dp.kernels.warmstart import (
    _Curvature,
    step_merit_check,
)


def _normal_mean(seed: int = 3, n: int = 400):
    """Normal mean, known sd 1, prior N(0, 100^2), data 40 record sds from the start: the
    posterior is ``N(v sum x, v)``, ``v = 1 / (n + 1e-4)`` (conjugate)."""
    x = np.random.default_rng(seed).normal(40.0, 1.0, n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 100.0)
        pm.Normal("x", mu, 1.0, observed=x)
    v = 1.0 / (x.size + 1e-4)
    return model, x, v * x.sum(), np.sqrt(v)


def test_a_histogram_that_says_nothing_keeps_the_last_clip_bound(monkeypatch):
    """The last of eleven histograms is noise only (multiplier 1e6: no bin passes its
    threshold). Its quantile was the grid's smallest bound, which clips every record's
    gradient to ~0: the last curvature, the approximation's precision, is then the clip
    bound squared times ``n`` (measured on a Lognormal regression of real wages at epsilon
    3, at the eighth iteration: every Hessian clipped to 0, the next step to the prior's
    move bound, the result 51 NUTS sds off). Keeping the last bound, the approximation is
    the conjugate posterior: its mean, and the empirical Fisher information's variance
    ``1 / (sum (x_i - m)^2 + 1e-4)``."""
    model, x, post_mean, post_sd = _normal_mean()
    z = np.full(11, 1e-12)
    z[10] = 1e6
    # the rule is off by default (a noise-dominated run's result came out confidently
    # narrow with it: `EMPTY_HISTOGRAM_KEEPS_BOUND`); its mechanism, switched on
    monkeypatch.setattr(warmstart, "EMPTY_HISTOGRAM_KEEPS_BOUND", True)
    info = exact_laplace(model, x.size, z_hist=z)
    assert info.empty_histograms == 1  # the seeded noise passed no threshold
    assert info.clip_bounds[10] == info.clip_bounds[9]
    assert abs(info.mean[0] - post_mean) < 1e-3 * post_sd
    var = 1.0 / (np.sum((x - post_mean) ** 2) + 1e-4)
    assert info.cov[0, 0] == pytest.approx(var, rel=1e-3)
    # the same releases, the grid's smallest bound taken: the failure the rule is for
    monkeypatch.setattr(warmstart, "EMPTY_HISTOGRAM_KEEPS_BOUND", False)
    old = exact_laplace(model, x.size, z_hist=z)
    assert old.clip_bounds[10] < 1e-2 * old.clip_bounds[9]
    assert old.cov[0, 0] > 100 * var


def _prev(g, prec, sd, basis):
    d = g.size
    curv = _Curvature(
        np.asarray(prec, dtype=float), 1e-12, np.ones(d, dtype=bool), np.eye(d), np.zeros((d, d))
    )
    return {"g": np.asarray(g, dtype=float), "curv": curv, "grad_sd": sd, "basis": basis}


@pytest.mark.parametrize("seed", range(3))
def test_the_step_check_keeps_noise_and_undoes_a_swing(seed):
    """Near the mode of a quadratic log-likelihood (precision ``P``) a released gradient is
    ``N(0, s^2 B B^T)``: a step between two such points is kept in at least 99 % of 2 000
    draws (its merit's rise is noise; without the noise allowance about half would be
    undone), and a step whose gradient is 10 noise sds along the stiffest direction, from
    a point at the mode, is undone in every draw."""
    rng = np.random.default_rng(seed)
    d, s = 4, 3.0
    a = rng.normal(size=(d, d))
    prec = a @ a.T + d * np.eye(d)
    basis = np.linalg.cholesky(prec)  # the release's whitening: noise N(0, s^2 B B^T)
    kept = undone = 0
    for _ in range(2000):
        g0 = basis @ rng.normal(size=d) * s
        g1 = basis @ rng.normal(size=d) * s
        kept += step_merit_check(_prev(g0, prec, s, basis), g1, s, basis)
        swing = basis @ (rng.normal(size=d) * s + 10.0 * s * np.sqrt(d) * np.eye(d)[0])
        undone += not step_merit_check(_prev(g0, prec, s, basis), swing, s, basis)
    assert kept >= 0.99 * 2000
    assert undone == 2000


def test_the_noise_free_damped_path_far_from_the_mode_is_not_checked(monkeypatch):
    """Normal with unknown sd started 16 times too wide, noise-free: the damped steps after
    the rejected Newton step raise the merit on their way (never within the noise: the warm
    start has not landed) and converge; checked from the start, 6 of 9 were undone and the
    warm start stopped 0.25 off in mu. Not checked: the exact mode."""
    x = np.random.default_rng(0).normal(0.5, 0.3, 400)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("x", mu, s, observed=x)
    monkeypatch.setattr(warmstart, "CHECK_AFTER_REJECTION", True)  # off by default
    info = exact_laplace(model, x.size, z_hist=1e-12)
    assert info.newton_rejected == 1 and info.steps_undone == 0
    assert abs(info.path[-1][0] - x.mean()) < 0.1 * x.std() / np.sqrt(x.size)
