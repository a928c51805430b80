"""One-shot private baselines run side by side with the automatic mode (`bench_auto.py --peers`).

Not part of the package: these are the peers a user could run instead, written as their
descriptions say (``/work/shared/notes/one-shot-peers.md``), so that the automatic mode is
compared with them on the same data, the same NUTS reference, the same DP seeds and the same
error statistic.

``private_newton_logistic``: four private Newton steps for a logistic regression whose
covariates lie in a public box with ``||x||^2 <= x_sq_bound`` (no clipping happens: the
sensitivities come from the box). Each step releases the gradient sum (L2 sensitivity
``2 sqrt(x_sq_bound)``, ``|y - p| <= 1``) and the Hessian sum (Frobenius sensitivity
``sqrt(2) x_sq_bound / 4``: one record's ``p (1 - p) x x^T`` is positive semi-definite with
largest eigenvalue at most ``x_sq_bound / 4``, and two such matrices differ by at most
``sqrt 2`` times that in Frobenius norm), with Gaussian noise; the shares of ``mu^2``
(mu-GDP, Dong, Roth & Su 2022) are 0.04 / 0.06 / 0.10 / 0.65 for the gradients and 0.04 x 3
and 0.03 for the Hessians: most of the budget on the last gradient. Output: the noise-aware
Gaussian ``N(theta_4, H^-1 + s_g^2 H^-2)`` (the last gradient's noise pushed through the
last Newton step). The accounting is the package's (`pymc_dp.accounting`): the composition
of Gaussian mechanisms is ``mu``-GDP with ``mu^2`` the sum of the parts' (the tight bound
the package also uses), so the peer spends exactly the ``(epsilon, delta)`` it is given.
"""

from __future__ import annotations

import math

import numpy as np

from pymc_dp.accounting import gaussian_mu_for_epsilon

#: mu^2 shares of the peer's releases (one-shot-peers.md).
GRADIENT_SHARES = (0.04, 0.06, 0.10, 0.65)
HESSIAN_SHARES = (0.04, 0.04, 0.04, 0.03)


def private_newton_logistic(
    x: np.ndarray,
    y: np.ndarray,
    epsilon: float,
    delta: float,
    rng: np.random.Generator,
    *,
    prior_sd: float = 5.0,
    x_sq_bound: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The private Newton peer: the noise-aware Gaussian (mean, covariance) of the
    coefficients of ``y ~ Bernoulli(logit^-1(x b))``, ``b ~ N(0, prior_sd^2 I)``.

    ``x_sq_bound``: the public bound on ``||x_i||^2`` (default: the number of columns, for
    covariates in ``[-1, 1]``).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, d = x.shape
    bound = float(d if x_sq_bound is None else x_sq_bound)
    if np.any(np.einsum("ij,ij->i", x, x) > bound * (1 + 1e-12)):
        raise ValueError("x_sq_bound must bound every record's ||x||^2 (the peer does not clip)")
    mu_gdp = math.sqrt(2.0 * gaussian_mu_for_epsilon(epsilon, delta))  # loss N(mu, 2 mu)
    grad_sens = 2.0 * math.sqrt(bound)
    hess_sens = math.sqrt(2.0) * bound / 4.0
    upper = np.triu_indices(d)
    theta = np.zeros(d)
    prior_prec = np.eye(d) / prior_sd**2
    for g_share, h_share in zip(GRADIENT_SHARES, HESSIAN_SHARES, strict=True):
        p = 1.0 / (1.0 + np.exp(-x @ theta))
        s_g = grad_sens / (mu_gdp * math.sqrt(g_share))
        s_h = hess_sens / (mu_gdp * math.sqrt(h_share))
        grad = x.T @ (y - p) + rng.normal(size=d) * s_g - prior_prec @ theta
        noise = np.zeros((d, d))
        noise[upper] = rng.normal(size=upper[0].size) * s_h
        noise = np.triu(noise) + np.triu(noise, 1).T
        hess = (x * (p * (1 - p))[:, None]).T @ x + noise + prior_prec
        w, v = np.linalg.eigh(0.5 * (hess + hess.T))
        hess = (v * np.maximum(w, 1.0 / prior_sd**2)) @ v.T  # post-processing floor
        theta = theta + np.linalg.solve(hess, grad)
    h_inv = np.linalg.inv(hess)
    return theta, h_inv + s_g**2 * h_inv @ h_inv
