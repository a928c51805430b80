r"""Noise-aware linear regression from released sufficient statistics (pure numpy).

For ``y_i = z_i^T beta + e_i``, ``e_i ~ N(0, sigma^2)``, ``z_i = (1, x_i)`` (``p = k + 1``
coefficients, intercept first), the likelihood depends on the data only through

$$ A = \sum_i z_i z_i^\top, \qquad r = \sum_i z_i y_i, \qquad c = \sum_i y_i^2, $$

read off the sum of `pymc_dp.kernels.expfam.normal_linear_stats` rows (``A``'s first entry
is the public ``n``). A Gaussian mechanism releases that sum with noise of a known
covariance ``N`` (in the statistics' coordinates): ``A~ = A + E``, ``r~ = r + e_r``,
``c~ = c + e_c``. The *noise-aware* posterior conditions on the released values, not on the
true ones (Bernstein & Sheldon 2019): with the design fixed,

* ``r = A beta + Z^T e`` is ``N(A beta, sigma^2 A)``;
* ``c = beta^T A beta + 2 beta^T Z^T e + e^T e`` has mean ``beta^T A beta + n sigma^2``,
  variance ``4 sigma^2 beta^T A beta + 2 n sigma^4`` and covariance ``2 sigma^2 A beta`` with
  ``r`` (the chi-square of ``e^T e`` by its normal approximation, ``n`` in the thousands);

and writing ``A = A~ - E``, the residual vector

$$ v(\beta, \sigma) = (r~ - A~\beta,\; c~ - \beta^\top A~ \beta - n \sigma^2) $$

is, to first order in the noise ``E`` of the design's statistics, Gaussian with mean 0 and
covariance ``V = V_s(beta, sigma) + G(beta) N G(beta)^T``: the sampling part ``V_s`` above
(``A`` replaced by the released ``A~`` projected on the positive definite matrices) and the
release noise carried through the linear map ``G`` of the statistics' noise onto ``v``
(``e_r - E beta`` and ``e_c - beta^T E beta``). `noise_aware_linear_loglik` is
``log N(v; 0, V)``: added to the log prior it is the noise-aware posterior of
``(beta, sigma)``, whose intervals carry the release's noise. With ``N = 0`` and the
sampling part exact it is the likelihood of the (unreleased) statistics given the design.

References
----------
.. [1] G. Bernstein, D. Sheldon, "Differentially private Bayesian linear regression",
   NeurIPS 2019 (noise-aware inference from the released ``X^T X``, ``X^T y``, ``y^T y``;
   their Sec. 4 models the statistics by the central limit theorem, as here).
   [BernsteinSheldon2019]
.. [2] G. Bernstein, D. Sheldon, "Differentially private Bayesian inference for exponential
   families", NeurIPS 2018. [BernsteinSheldon2018]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "LinearStats",
    "linear_stats_from_sum",
    "noise_aware_linear_loglik",
    "noise_aware_linear_moments",
]


def _layout(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where the design's entries sit in a `normal_linear_stats` row (public structure).

    Returns ``(rows, cols, where)``: the upper-triangle entry ``(rows[t], cols[t])`` of ``A``
    (intercept first) is statistic ``where[t]``; ``A[0, 0] = n`` is not a statistic.
    """
    j, jj = np.triu_indices(k)
    rows = np.concatenate([np.zeros(k, dtype=int), j + 1])
    cols = np.concatenate([np.arange(1, k + 1), jj + 1])
    where = np.concatenate([2 + k + np.arange(k), 2 + 2 * k + np.arange(j.size)])
    return rows, cols, where


@dataclass(frozen=True)
class LinearStats:
    """Released statistics of a linear regression (DP outputs) and their noise.

    Attributes
    ----------
    A : array, shape (p, p)
        ``sum_i z_i z_i^T`` released (symmetric; ``A[0, 0] = n`` exact).
    r : array, shape (p,)
        ``sum_i z_i y_i`` released.
    c : float
        ``sum_i y_i^2`` released.
    n : int
    noise_cov : array, shape (D, D)
        Covariance of the release noise in the statistics' coordinates (``D =
        2 + 2k + k(k+1)/2``, the order of `pymc_dp.kernels.expfam.normal_linear_stats`).
    """

    A: np.ndarray
    r: np.ndarray
    c: float
    n: int
    noise_cov: np.ndarray

    @property
    def p(self) -> int:
        return int(self.r.size)

    def design_psd(self, floor: float = 1e-6) -> np.ndarray:
        """``A~`` with its eigenvalues floored at ``floor * n`` (for the sampling variance)."""
        w, U = np.linalg.eigh(0.5 * (self.A + self.A.T))
        return (U * np.maximum(w, floor * self.n)) @ U.T


def linear_stats_from_sum(S: np.ndarray, n: int, k: int, noise_cov: np.ndarray) -> LinearStats:
    """Unpack a released sum of `normal_linear_stats` rows (``k`` covariates)."""
    S = np.asarray(S, dtype=float).ravel()
    dim = 2 + 2 * k + k * (k + 1) // 2
    if S.size != dim or np.shape(noise_cov) != (dim, dim):
        raise ValueError(
            f"a linear regression with {k} covariates has {dim} statistics; got a sum of "
            f"{S.size} and a noise covariance of shape {np.shape(noise_cov)}"
        )
    rows, cols, where = _layout(k)
    A = np.zeros((k + 1, k + 1))
    A[0, 0] = float(n)
    A[rows, cols] = S[where]
    A[cols, rows] = S[where]
    r = np.concatenate([S[:1], S[1 : 1 + k]])
    return LinearStats(A, r, float(S[1 + k]), int(n), np.asarray(noise_cov, dtype=float))


def _noise_map(beta: np.ndarray, k: int, dim: int) -> np.ndarray:
    """``G(beta)``: the release noise of the statistics onto the residual ``v`` (first order)."""
    p = k + 1
    G = np.zeros((p + 1, dim))
    G[0, 0] = 1.0  # e_r: sum y
    G[np.arange(1, p), 1 + np.arange(k)] = 1.0  # e_r: sum y x
    G[p, 1 + k] = 1.0  # e_c: sum y^2
    rows, cols, where = _layout(k)
    # - E beta: entry (i, l) of E moves row i by beta_l and, off the diagonal, row l by beta_i
    np.subtract.at(G, (rows, where), beta[cols])
    off = rows != cols
    np.subtract.at(G, (cols[off], where[off]), beta[rows[off]])
    # - beta^T E beta: entry (i, l) counts twice off the diagonal
    G[p, where] -= beta[rows] * beta[cols] * np.where(off, 2.0, 1.0)
    return G


def noise_aware_linear_moments(
    stats: LinearStats,
    beta: np.ndarray,
    sigma: float,
    design_psd: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The residual ``v(beta, sigma)`` and its covariance ``V`` (module docstring).

    ``design_psd`` stands for ``A`` in the sampling part ``V_s`` (default: the released
    ``A~`` projected on the positive definite matrices, `LinearStats.design_psd`).
    """
    beta = np.asarray(beta, dtype=float).ravel()
    p = stats.p
    if beta.size != p:
        raise ValueError(f"beta must have {p} entries (intercept first); got {beta.size}")
    n = stats.n
    Ap = stats.design_psd() if design_psd is None else design_psd
    s2 = float(sigma) ** 2
    Ab = Ap @ beta
    V = np.empty((p + 1, p + 1))
    V[:p, :p] = s2 * Ap
    V[:p, p] = V[p, :p] = 2.0 * s2 * Ab
    V[p, p] = 4.0 * s2 * float(beta @ Ab) + 2.0 * n * s2 * s2
    G = _noise_map(beta, p - 1, stats.noise_cov.shape[0])
    V += G @ stats.noise_cov @ G.T
    v = np.concatenate([stats.r - stats.A @ beta, [stats.c - beta @ stats.A @ beta - n * s2]])
    return v, V


def noise_aware_linear_loglik(
    stats: LinearStats,
    beta: np.ndarray,
    sigma: float,
    design_psd: np.ndarray | None = None,
) -> float:
    r"""``log N(v(beta, sigma); 0, V)``: the noise-aware log-likelihood (module docstring).

    Parameters
    ----------
    stats : LinearStats
    beta : array, shape (p,)
        Intercept and slopes.
    sigma : float
        The noise sd (> 0).
    design_psd : array, optional
        ``stats.design_psd()``, computed once by the caller.

    Returns ``-inf`` where ``V`` is not positive definite or ``sigma`` not positive.
    """
    beta = np.asarray(beta, dtype=float).ravel()
    if not (np.isfinite(sigma) and 0 < sigma < 1e100 and np.all(np.isfinite(beta))):
        return -np.inf
    v, V = noise_aware_linear_moments(stats, beta, sigma, design_psd)
    try:
        L = np.linalg.cholesky(V)
    except np.linalg.LinAlgError:
        return -np.inf
    u = np.linalg.solve(L, v)
    return float(-0.5 * u @ u - np.log(np.diag(L)).sum() - 0.5 * v.size * np.log(2 * np.pi))
