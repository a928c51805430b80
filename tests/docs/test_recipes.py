"""The recipes of docs/concepts.md, checked numerically.

- Clip bound of a Normal scale parameter over a declared region (sampled in log sigma, or a
  precision in log tau): the formula is a bound on PyMC's own per-record log-likelihood
  gradient over the region, attained at its corner, and bounds every log-likelihood ratio
  of two points of the region; below the declared smallest scale it fails (no global bound).
- DPSGLD's step size: ``eta = 4 r / ((1 + r) P)`` inflates the stationary variance by
  ``1 + r`` (closed form and simulation), and ``eta = (2 q / (C z))^2`` is where the chain's
  own noise multiplier equals the target's (DPSGNHT: ``2 A (q / (C z))^2``).
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
import pytest

from pymc_dp.kernels.sgmcmc import (
    sgld_gaussian_variance,
    sgld_intrinsic_noise_multiplier,
    sgld_update,
    sgnht_intrinsic_noise_multiplier,
)


def scale_clip_bound(data_bound: float, mu_bound: float, sigma_min: float) -> float:
    """docs/concepts.md: b for (mu, log sigma) of x ~ N(mu, sigma^2) over the region."""
    d = data_bound + mu_bound
    g_mu = d / sigma_min**2
    g_s = max(1.0, d * d / sigma_min**2 - 1.0)
    return math.hypot(g_mu, g_s)


def precision_clip_bounds(data_bound: float, mu_bound: float, tau_max: float):
    """docs/concepts.md: (|d/dmu|, |d/dlog tau|) bounds of x ~ N(mu, 1/tau)."""
    d = data_bound + mu_bound
    return tau_max * d, max(0.5, 0.5 * tau_max * d * d - 0.5)


def _normal_loglik(precision: bool = False):
    """Per-record log-likelihood of PyMC's Normal and its gradient in (mu, log scale)."""
    x, mu, s = pt.dscalar("x"), pt.dscalar("mu"), pt.dscalar("s")
    dist = pm.Normal.dist(mu, tau=pt.exp(s)) if precision else pm.Normal.dist(mu, pt.exp(s))
    ll = pm.logp(dist, x)
    f = pytensor.function([x, mu, s], [ll, *pt.grad(ll, [mu, s])])
    return lambda *args: tuple(float(v) for v in f(*args))


@pytest.fixture(scope="module")
def normal_ll():
    return np.vectorize(_normal_loglik(), otypes=[float, float, float])


@pytest.fixture(scope="module")
def normal_ll_tau():
    return np.vectorize(_normal_loglik(precision=True), otypes=[float, float, float])


@pytest.mark.parametrize(("B", "M", "smin"), [(5.0, 1.0, 0.5), (3.0, 0.0, 2.0), (1.0, 2.0, 0.1)])
def test_scale_clip_bound_bounds_pymc_gradients_and_ratios(normal_ll, B, M, smin):
    b = scale_clip_bound(B, M, smin)
    smax = 10.0 * smin + 5.0
    grid = np.meshgrid(
        np.linspace(-B, B, 21), np.linspace(-M, M, 11), np.linspace(np.log(smin), np.log(smax), 21)
    )
    x, mu, s = (g.ravel() for g in grid)
    _, g_mu, g_s = normal_ll(x, mu, s)
    norm = np.hypot(g_mu, g_s)
    assert norm.max() <= b * (1 + 1e-9)
    assert norm.max() == pytest.approx(b, rel=1e-9)  # attained at |x - mu| = D, sigma_min
    # ratios between two points of the region, for records in range: within b ||dtheta||
    rng = np.random.default_rng(0)
    k = 20_000
    xr = rng.uniform(-B, B, k)
    t1 = np.c_[rng.uniform(-M, M, k), rng.uniform(np.log(smin), np.log(smax), k)]
    t2 = np.c_[rng.uniform(-M, M, k), rng.uniform(np.log(smin), np.log(smax), k)]
    r = normal_ll(xr, t2[:, 0], t2[:, 1])[0] - normal_ll(xr, t1[:, 0], t1[:, 1])[0]
    assert np.all(np.abs(r) <= b * np.linalg.norm(t2 - t1, axis=1) * (1 + 1e-9))
    # below the declared smallest scale the gradient exceeds b: no global bound
    _, g_mu, g_s = normal_ll(B, -M, np.log(smin / 2))
    assert math.hypot(g_mu, g_s) > 3 * b


def test_scale_clip_bound_example_of_the_docs():
    assert scale_clip_bound(5.0, 1.0, 0.5) == pytest.approx(145.0)


def test_precision_clip_bound_bounds_pymc_gradients(normal_ll_tau):
    B, M, tau_max = 5.0, 1.0, 4.0
    b_mu, b_t = precision_clip_bounds(B, M, tau_max)
    grid = np.meshgrid(
        np.linspace(-B, B, 21),
        np.linspace(-M, M, 11),
        np.linspace(np.log(1e-3), np.log(tau_max), 21),
    )
    _, g_mu, g_t = normal_ll_tau(*(g.ravel() for g in grid))
    assert np.abs(g_mu).max() == pytest.approx(b_mu, rel=1e-9)
    assert np.abs(g_t).max() == pytest.approx(b_t, rel=1e-9)
    # the sigma recipe with sigma_min = tau_max^-1/2, the log coordinate halved
    assert b_t == pytest.approx(max(1.0, (B + M) ** 2 * tau_max - 1.0) / 2)


@pytest.mark.parametrize("r", [0.05, 0.1, 0.5])
def test_sgld_step_size_for_a_variance_inflation(r):
    P = 2500.0
    eta = 4 * r / ((1 + r) * P)
    assert sgld_gaussian_variance(P, eta) * P == pytest.approx(1 + r, rel=1e-12)
    # simulated: exact gradients, many independent chains, after burn-in
    rng = np.random.default_rng(1)
    theta = rng.normal(0.0, 1 / math.sqrt(P), size=40_000)
    for _ in range(int(20 / (eta * P))):
        theta = sgld_update(theta, -P * theta, eta, rng)
    assert theta.var() * P == pytest.approx(1 + r, rel=0.03)


@pytest.mark.parametrize(("q", "C", "z", "A"), [(0.01, 1.0, 1.5, 50.0), (0.001, 0.2, 0.8, 1.0)])
def test_step_size_at_which_the_own_noise_meets_the_target(q, C, z, A):
    eta = (2 * q / (C * z)) ** 2
    assert sgld_intrinsic_noise_multiplier(eta, q, C) == pytest.approx(z, rel=1e-12)
    assert sgld_intrinsic_noise_multiplier(eta * 1.1, q, C) < z  # larger steps: noise added
    eta_n = 2 * A * (q / (C * z)) ** 2
    assert sgnht_intrinsic_noise_multiplier(eta_n, q, C, A) == pytest.approx(z, rel=1e-12)
