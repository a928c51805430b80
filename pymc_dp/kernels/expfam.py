r"""Exponential-family penalty test with noisy sufficient statistics (pure numpy).

For i.i.d. records whose likelihood is an exponential family,
$\log p(x_i \mid \theta) = \eta(\theta)^\top T(x_i) - A(\theta) + h(x_i)$, the
log-likelihood ratio of the whole dataset depends on the data only through the sufficient
statistic $S = \sum_i T(x_i)$:

$$
\lambda(\theta, \theta') = (\eta(\theta') - \eta(\theta))^\top S
- n\,(A(\theta') - A(\theta))
$$

(Yildirim & Ermis, Sec. 3.3, eq. 7). Each iteration releases a fresh
$\tilde S = S + \zeta$, $\zeta \sim N(0, \sigma_S^2 I)$; the noisy ratio then
has noise variance $\sigma_S^2 \|\eta(\theta') - \eta(\theta)\|^2$ (eq. 8), which the
penalty test subtracts half of (Algorithm 3). With every record's $T(x_i)$ clipped to
L2 norm $C$, $S$ has replace-one sensitivity $2C$ and one release with
$\sigma_S = z \cdot 2C$ is a Gaussian mechanism with $\mu = 1/(2z^2)$.

This module holds the statistics $T$, the natural parameters $\eta$, the
log-normalisers $A$ and the norm bounds of $T$ from a data box for each supported
family, and the noisy test. It never imports PyMC; randomness is passed in.

References
----------
.. [1] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves:
   revisiting the penalty algorithm in a data privacy framework. Statistics and Computing
   29(5), 947-963. doi:10.1007/s11222-018-9847-x. Preprint: arXiv:1604.07177, Sec. 3.3,
   eqs. (7)-(8), Algorithm 3, Corollary 1.
.. [2] Ceperley, D. M. and Dewing, M. (1999). The penalty method for random walks with
   uncertain energies. J. Chem. Phys. 110(20), 9812-9820.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from pymc_dp.kernels.warmstart import (
    HISTOGRAM_SENSITIVITY,
    HISTOGRAM_THRESHOLD_SDS,
    OUTER_SENSITIVITY,
    _sym_noise,
    bonferroni_sds,
    clip_grid,
    histogram_from_counts,
    histogram_quantile,
    noisy_histogram_quantile,
)

__all__ = [
    "EXPFAM_FAMILIES",
    "ExpFamily",
    "StatPasses",
    "Whitening",
    "centred_clip_sum",
    "clip_stats",
    "correlated_log_acceptance",
    "correlated_noise_schedule",
    "correlated_release",
    "deviation_counts_above",
    "expfam_log_acceptance",
    "expfam_noise_std",
    "normal_linear_natural",
    "normal_linear_stat_bound",
    "normal_linear_deviation_bound",
    "normal_linear_stat_box",
    "normal_linear_stats",
    "negative_hessian",
    "private_centre",
    "private_clip_bound",
    "private_tail_excess",
    "private_whitening",
    "quadratic_fit",
    "scan_tail",
    "tail_excess",
    "whiten",
]


# -- statistics, natural parameters and log-normalisers ------------------------------------------
def normal_linear_stats(y: np.ndarray, X: np.ndarray) -> np.ndarray:
    r"""Sufficient statistics of ``y_i ~ N(a + x_i^T b, sigma^2)``, one row per record.

    With $x_i \in R^k$ the row is
    $(y_i,\ y_i x_i,\ y_i^2,\ x_i,\ (x_{ij} x_{il})_{j \le l})$, of length
    ``2 + 2k + k(k+1)/2`` (the constant ``1`` of the intercept is the public ``n``).

    Parameters
    ----------
    y : array, shape (m,)
    X : array, shape (m, k); ``k`` may be 0.
    """
    y = np.asarray(y, dtype=float)
    X = np.asarray(X, dtype=float).reshape(y.shape[0], -1)
    j, jj = np.triu_indices(X.shape[1])
    return np.column_stack([y, y[:, None] * X, y * y, X, X[:, j] * X[:, jj]])


def normal_linear_natural(w: np.ndarray, sigma: float) -> tuple[np.ndarray, float]:
    r"""Natural parameters and per-record log-normaliser of the linear-Gaussian model.

    ``w = (a, b)`` (intercept and slopes), ``sigma`` the noise scale. Expanding
    $-(y - a - x^\top b)^2 / (2\sigma^2) - \log\sigma$ gives
    $\eta = (a, b, -1/2, -a b, -(b_j b_l)(2 - [j = l])/2) / \sigma^2$ matched with
    `normal_linear_stats`, and $A = \log\sigma + a^2/(2\sigma^2)$.
    """
    w = np.asarray(w, dtype=float).ravel()
    a, b = w[0], w[1:]
    s2 = float(sigma) ** 2
    j, jj = np.triu_indices(b.size)
    cross = -(b[j] * b[jj]) * np.where(j == jj, 0.5, 1.0)
    eta = np.concatenate([[a], b, [-0.5], -a * b, cross]) / s2
    return eta, float(np.log(sigma) + 0.5 * a * a / s2)


def normal_linear_stat_bound(y_max: float, x_max: np.ndarray) -> float:
    """L2 bound of `normal_linear_stats` rows for ``|y| <= y_max``, ``|x_j| <= x_max[j]``."""
    x = np.asarray(x_max, dtype=float).ravel()
    j, jj = np.triu_indices(x.size)
    sq = y_max**2 + y_max**2 * np.sum(x**2) + y_max**4 + np.sum(x**2) + np.sum((x[j] * x[jj]) ** 2)
    return float(np.sqrt(sq))


def normal_linear_stat_box(
    y_box: tuple[float, float], x_box: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate range ``(lo, hi)`` of `normal_linear_stats` rows over a data box.

    Interval arithmetic on each monomial (exact for products of two intervals and for
    squares): ``y`` in ``y_box``, covariate ``j`` in ``(x_box[0][j], x_box[1][j])``.
    """

    def prod(a, b):
        c = np.array([a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1]])
        return c.min(axis=0), c.max(axis=0)

    def square(a):
        lo = np.where((a[0] <= 0) & (a[1] >= 0), 0.0, np.minimum(a[0] ** 2, a[1] ** 2))
        return lo, np.maximum(a[0] ** 2, a[1] ** 2)

    y = (np.float64(y_box[0]), np.float64(y_box[1]))
    x = (np.asarray(x_box[0], dtype=float).ravel(), np.asarray(x_box[1], dtype=float).ravel())
    j, jj = np.triu_indices(x[0].size)
    yx = prod(y, x)
    yy = square(y)
    xx = prod((x[0][j], x[1][j]), (x[0][jj], x[1][jj]))
    sq = square((x[0][j], x[1][j]))
    xx = (np.where(j == jj, sq[0], xx[0]), np.where(j == jj, sq[1], xx[1]))
    lo = np.concatenate([[y[0]], yx[0], [yy[0]], x[0], xx[0]])
    hi = np.concatenate([[y[1]], yx[1], [yy[1]], x[1], xx[1]])
    return lo, hi


#: Random starts of `normal_linear_deviation_bound`'s search (besides the box's corners).
DEVIATION_BOUND_STARTS = 64
#: Largest number of the box's corners `normal_linear_deviation_bound` evaluates (beyond
#: ``2^12`` corners, that many drawn at random).
DEVIATION_BOUND_CORNERS = 4096
#: Polished from the best this many corners and starts.
DEVIATION_BOUND_POLISH = 16


def _linear_stats_jacobian(u: np.ndarray) -> np.ndarray:
    """``d T / d (y, x)`` of `normal_linear_stats` at one point ``u = (y, x)``."""
    y, x = float(u[0]), np.asarray(u[1:], dtype=float)
    k = x.size
    j, jj = np.triu_indices(k)
    J = np.zeros((2 + 2 * k + j.size, k + 1))
    J[0, 0] = 1.0
    J[1 + np.arange(k), 0] = x
    J[1 + np.arange(k), 1 + np.arange(k)] = y
    J[1 + k, 0] = 2.0 * y
    J[2 + k + np.arange(k), 1 + np.arange(k)] = 1.0
    r = 2 + 2 * k + np.arange(j.size)
    np.add.at(J, (r, 1 + j), x[jj])
    np.add.at(J, (r, 1 + jj), x[j])
    return J


def normal_linear_deviation_bound(
    scale: np.ndarray,
    centre: np.ndarray,
    y_box: tuple[float, float],
    x_box: tuple[np.ndarray, np.ndarray],
) -> float:
    r"""The largest ``||W (T(y, x) - c)||`` over the declared box (data-free).

    ``T`` is `normal_linear_stats`, ``W`` (``scale``) and ``c`` (``centre``) public (DP
    outputs of earlier releases). Used as the clip bound of a sum of whitened deviations it
    clips no record inside the box: the sum has no clipping bias, only the noise of its
    sensitivity ``2 b`` (`pymc_dp.auto.suffstats`). The squared norm is a quartic in
    ``(y, x)``; its maximum over the box is searched from every corner (up to
    ``DEVIATION_BOUND_CORNERS``, the rest drawn at random) and ``DEVIATION_BOUND_STARTS``
    random points (a fixed seed), the best ``DEVIATION_BOUND_POLISH`` polished by bounded
    L-BFGS-B with the exact gradient. A local search: it bounds the maximum from below,
    and a record between the value found and the true maximum would be clipped (no
    privacy cost either way: the bound is public).
    """
    import itertools

    from scipy.optimize import minimize

    S = np.asarray(scale, dtype=float)
    c = np.asarray(centre, dtype=float).ravel()
    lo = np.concatenate([[float(y_box[0])], np.asarray(x_box[0], dtype=float).ravel()])
    hi = np.concatenate([[float(y_box[1])], np.asarray(x_box[1], dtype=float).ravel()])
    d = lo.size
    gen = np.random.default_rng(0)  # data-free search points
    if 2**d <= DEVIATION_BOUND_CORNERS:
        corners = np.array(list(itertools.product([0.0, 1.0], repeat=d)))
    else:
        corners = gen.integers(0, 2, size=(DEVIATION_BOUND_CORNERS, d)).astype(float)
    pts = lo + (hi - lo) * np.vstack([corners, gen.uniform(size=(DEVIATION_BOUND_STARTS, d))])
    dev = (normal_linear_stats(pts[:, 0], pts[:, 1:]) - c) @ S.T
    val = np.einsum("ij,ij->i", dev, dev)

    def neg(u: np.ndarray) -> tuple[float, np.ndarray]:
        r = S @ (normal_linear_stats(u[:1], u[None, 1:])[0] - c)
        return -float(r @ r), -2.0 * (_linear_stats_jacobian(u).T @ (S.T @ r))

    best = float(np.max(val))
    for i in np.argsort(val)[::-1][:DEVIATION_BOUND_POLISH]:
        res = minimize(
            neg, pts[i], jac=True, method="L-BFGS-B", bounds=list(zip(lo, hi, strict=True))
        )
        if np.isfinite(res.fun):
            best = max(best, -float(res.fun))
    return float(np.sqrt(best))


def _logit(p: float) -> float:
    return float(np.log(p) - np.log1p(-p))


@dataclass(frozen=True)
class ExpFamily:
    """One supported likelihood: its statistics, natural parameters and norm bound.

    Attributes
    ----------
    name : str
    stats : callable ``(y, X, **constants) -> (m, dim)`` array
        Sufficient statistics of a chunk of records (``X`` is ``None`` without covariates).
    natural : callable ``(**params, **constants) -> (eta, A)``
        Natural parameters (shape ``(dim,)``) and log-normaliser of ONE record.
    stat_bound : callable ``(y_max, x_max, **constants) -> float`` or None
        L2 bound of a row of ``stats`` for data in a box (``y_max`` is the largest absolute
        value of the response, per coordinate for vector responses); ``None`` when it depends
        on the support only (see ``support_bound``).
    support_bound : callable ``(**constants) -> float`` or None
        L2 bound of a row of ``stats`` implied by the support of the distribution alone
        (Bernoulli, Binomial, Categorical), so no data box is needed.
    """

    name: str
    stats: Callable[..., np.ndarray]
    natural: Callable[..., tuple[np.ndarray, float]]
    stat_bound: Callable[..., float] | None = None
    support_bound: Callable[..., float] | None = None


def _scalar_stats(y, X=None, **_):
    return np.asarray(y, dtype=float).reshape(-1, 1)


def _onehot(y, X=None, *, n_categories: int, **_):
    y = np.asarray(y).reshape(-1).astype(np.int64)
    out = np.zeros((y.size, n_categories))
    ok = (y >= 0) & (y < n_categories)
    out[np.flatnonzero(ok), y[ok]] = 1.0
    return out


def _abs_max(y_max, x_max=None, **_):
    return float(np.sqrt(np.sum(np.square(np.asarray(y_max, dtype=float)))))


EXPFAM_FAMILIES: dict[str, ExpFamily] = {
    "normal_linear": ExpFamily(
        "normal_linear",
        stats=lambda y, X=None, **_: normal_linear_stats(
            y, np.zeros((np.shape(y)[0], 0)) if X is None else X
        ),
        natural=lambda w, sigma, **_: normal_linear_natural(w, sigma),
        stat_bound=lambda y_max, x_max=None, **_: normal_linear_stat_bound(
            float(np.max(y_max)), np.zeros(0) if x_max is None else x_max
        ),
    ),
    "bernoulli": ExpFamily(
        "bernoulli",
        stats=_scalar_stats,
        natural=lambda p, **_: (np.array([_logit(p)]), float(-np.log1p(-p))),
        support_bound=lambda **_: 1.0,
    ),
    "binomial": ExpFamily(
        "binomial",
        stats=_scalar_stats,
        natural=lambda p, trials, **_: (np.array([_logit(p)]), float(-trials * np.log1p(-p))),
        stat_bound=_abs_max,
        support_bound=lambda trials, **_: float(trials),
    ),
    "poisson": ExpFamily(
        "poisson",
        stats=_scalar_stats,
        natural=lambda mu, **_: (np.array([np.log(mu)]), float(mu)),
        stat_bound=_abs_max,
    ),
    "exponential": ExpFamily(
        "exponential",
        stats=_scalar_stats,
        natural=lambda scale, **_: (np.array([-1.0 / scale]), float(np.log(scale))),
        stat_bound=_abs_max,
    ),
    "gamma": ExpFamily(
        "gamma",
        stats=_scalar_stats,
        natural=lambda scale, shape, **_: (
            np.array([-1.0 / scale]),
            float(shape * np.log(scale)),
        ),
        stat_bound=_abs_max,
    ),
    "categorical": ExpFamily(
        "categorical",
        stats=_onehot,
        natural=lambda p, **_: (
            np.log(np.asarray(p, dtype=float) / np.sum(p)),
            0.0,
        ),
        support_bound=lambda **_: 1.0,
    ),
    "mvnormal": ExpFamily(
        "mvnormal",
        stats=lambda y, X=None, **_: np.asarray(y, dtype=float).reshape(np.shape(y)[0], -1),
        natural=lambda mu, precision, **_: (
            precision @ np.asarray(mu, dtype=float),
            float(0.5 * np.asarray(mu) @ precision @ np.asarray(mu)),
        ),
        stat_bound=_abs_max,
    ),
}


# -- clipping and the noisy penalty test -----------------------------------------------------------
def clip_stats(T: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Scale every row of ``T`` with L2 norm above ``bound`` down to norm ``bound``.

    Returns the clipped rows and the number of clipped rows (computed without noise: never
    publish it). Rows must be finite (the caller refuses non-finite data beforehand).
    """
    T = np.asarray(T, dtype=float)
    norms = np.sqrt(np.einsum("ij,ij->i", T, T))
    over = norms > bound
    scale = np.where(over, bound / np.where(over, norms, 1.0), 1.0)
    return T * scale[:, None], int(np.count_nonzero(over))


def centred_clip_sum(
    T: np.ndarray,
    centre: np.ndarray | None,
    bound: float,
    scale: np.ndarray | None = None,
    absolute: bool = False,
    outer: bool = False,
) -> tuple[np.ndarray, int]:
    r"""$\sum_i \mathrm{clip}_b(T(x_i) - c)$ and the number of clipped rows.

    The centred statistic of the exponential-family penalty: each record's deviation from the
    public centre ``c`` (a constant or a released, accounted value) is clipped to L2 norm
    ``b``. Replacing one record changes the sum by at most ``2 b`` in L2 norm (both clipped
    deviations have norm at most ``b``), whatever ``c``; adding the public ``n c`` afterwards
    gives the statistic the test uses, $\sum_i T(x_i)$ exactly when no deviation exceeds
    ``b``. ``centre=None`` is the uncentred clip (``c = 0``, Yildirim & Ermis Sec. 3.3).
    With ``scale`` (a public positive vector ``w``, or an invertible matrix ``W``) the
    deviations are whitened first, ``w * (T(x_i) - c)`` or ``W (T(x_i) - c)``, and clipped
    in that metric (the sensitivity is still ``2 b``, in the whitened coordinates);
    ``absolute`` sums their absolute values (the query of the per-coordinate spread);
    ``outer`` sums the outer products ``u_i u_i^T`` of the clipped whitened deviations
    (flattened; Frobenius sensitivity ``sqrt(2) b^2``, the query of their second moment).
    The count is computed without noise (never publish it).
    """
    T = np.asarray(T, dtype=float)
    D = whiten(T if centre is None else T - np.asarray(centre, dtype=float)[None, :], scale)
    if absolute:
        D = np.abs(D)
    Dc, k = clip_stats(D, bound)
    if outer:
        return (Dc.T @ Dc).ravel(), k
    return Dc.sum(axis=0), k


def whiten(D: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """Rows of ``D`` times the public whitening: elementwise (vector) or ``W d`` (matrix)."""
    if scale is None:
        return D
    w = np.asarray(scale, dtype=float)
    return D * w[None, :] if w.ndim == 1 else D @ w.T


def deviation_counts_above(
    T: np.ndarray, centre: np.ndarray, grid: np.ndarray, scale: np.ndarray | None = None
) -> np.ndarray:
    """Numbers of rows whose deviation ``||w * (T(x_i) - c)||`` exceeds each grid bound.

    The data-dependent query of the DP quantile of the deviations (before the histogram's
    noise, `pymc_dp.kernels.warmstart.noisy_histogram_quantile`); exact integers, never
    publish them. A non-finite deviation counts as above every bound.
    """
    D = whiten(np.asarray(T, dtype=float) - np.asarray(centre, dtype=float)[None, :], scale)
    norms = np.sqrt(np.einsum("ij,ij->i", D, D))
    norms = np.where(np.isfinite(norms), norms, np.inf)
    grid = np.asarray(grid, dtype=float)
    return np.count_nonzero(norms[:, None] > grid[None, :], axis=0).astype(np.int64)


def private_centre(
    clipped_sum: np.ndarray,
    n: int,
    stat_clip_bound: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    size: int | None = None,
) -> np.ndarray:
    r"""A DP estimate of the mean statistic: $(\sum_i \mathrm{clip}_C(T(x_i)) + \zeta) / n$.

    $\zeta \sim N(0, (z\,2C)^2 I)$: under replace-one neighbours the clipped sum has L2
    sensitivity ``2C``, so this is one Gaussian mechanism with ``mu = 1 / (2 z^2)``
    (Dwork & Roth 2014, Thm A.1); dividing by the public ``n`` is post-processing.
    ``size``: that many independent releases, shape ``(size, len(S))`` (an audit's trials).
    """
    S = np.asarray(clipped_sum, dtype=float)
    shape = S.shape if size is None else (int(size), S.size)
    noise = float(noise_multiplier) * 2.0 * float(stat_clip_bound) * rng.normal(size=shape)
    return (S + noise) / float(n)


def quadratic_fit(
    f: Callable[[np.ndarray], float], x0: np.ndarray, *, rel_step: float = 1e-4
) -> tuple[np.ndarray, np.ndarray] | None:
    r"""Mode and curvature of a smooth data-free function ``f`` (to maximise).

    Maximises ``f`` from ``x0`` (BFGS) and returns ``(mode, H)`` with ``H`` the negative
    Hessian at the mode by central differences, or ``None`` when the search fails or ``H``
    is not positive definite. With ``f(theta) = n (eta(theta)^T c - A(theta)) + log p(theta)``
    (the log posterior of ``n`` records whose mean statistic is the centre ``c``), ``H`` at
    the mode is the Fisher information of the exponential family at the centre plus the
    prior's curvature: the metric in which the natural parameters move (``H^{-1}`` is the
    proposal covariance of the centred step). Post-processing of ``c`` only.
    """
    from scipy.optimize import minimize

    x0 = np.asarray(x0, dtype=float)

    def neg(x):
        v = f(x)
        return -v if np.isfinite(v) else 1e300

    try:
        res = minimize(neg, x0, method="BFGS", options={"gtol": 1e-6, "maxiter": 2000})
    except (ValueError, FloatingPointError, np.linalg.LinAlgError):
        return None
    m = np.asarray(res.x, dtype=float)
    if not np.isfinite(neg(m)) or neg(m) >= 1e300:
        return None
    if res.hess_inv is not None and np.all(np.isfinite(res.hess_inv)):
        scales = np.sqrt(np.clip(np.diag(np.asarray(res.hess_inv)), 1e-300, None))
    else:
        scales = np.ones(m.size)
    H = negative_hessian(f, m, rel_step * np.maximum(scales, 1e-12) * 10.0)
    if H is None:
        return None
    return m, H


def negative_hessian(
    f: Callable[[np.ndarray], float], x: np.ndarray, h: np.ndarray
) -> np.ndarray | None:
    """Minus the Hessian of ``f`` at ``x`` by central differences with steps ``h``, or
    ``None`` where it is not finite or not positive definite."""

    def neg(v):
        out = f(v)
        return -out if np.isfinite(out) else 1e300

    x = np.asarray(x, dtype=float)
    d = x.size
    H = np.empty((d, d))
    for i in range(d):
        for j in range(i, d):
            ei = np.zeros(d)
            ej = np.zeros(d)
            ei[i], ej[j] = h[i], h[j]
            v = (neg(x + ei + ej) - neg(x + ei - ej) - neg(x - ei + ej) + neg(x - ei - ej)) / (
                4.0 * h[i] * h[j]
            )
            H[i, j] = H[j, i] = v
    H = 0.5 * (H + H.T)
    if not np.all(np.isfinite(H)) or np.max(np.abs(H)) >= 1e299:
        return None
    try:
        np.linalg.cholesky(H)
    except np.linalg.LinAlgError:
        return None
    return H


def expfam_noise_std(noise_multiplier: float, stat_clip_bound: float) -> float:
    """Std ``sigma_S = z * 2C`` of the noise on each coordinate of ``S`` (replace-one)."""
    return float(noise_multiplier) * 2.0 * float(stat_clip_bound)


def expfam_log_acceptance(
    stat_sum: np.ndarray,
    d_eta: np.ndarray,
    n_d_log_normalizer: float,
    log_prior_ratio: float,
    log_proposal_ratio: float,
    stat_noise_std: float,
    rng: np.random.Generator,
    *,
    size: int | None = None,
    variance_correction: bool = True,
) -> float | np.ndarray:
    r"""Noisy, penalty-corrected log acceptance ratio of the exponential-family test.

    Draws a fresh release $\tilde S = S + \zeta$, $\zeta \sim N(0, \sigma_S^2 I)$
    (``size`` independent releases when given, for vectorised audits) and returns

    $$
    \Delta\eta^\top \tilde S - n \Delta A + \log\frac{p(\theta')}{p(\theta)}
    + \log\frac{q(\theta|\theta')}{q(\theta'|\theta)}
    - \tfrac12 \sigma_S^2 \|\Delta\eta\|^2
    $$

    (Yildirim & Ermis, Algorithm 3; the last term is half the variance of eq. 8, the penalty
    correction that keeps the chain exact).

    Parameters
    ----------
    stat_sum : array, shape (dim,)
        The clipped sufficient statistic ``S`` (never published itself).
    d_eta : array, shape (dim,)
        ``eta(theta') - eta(theta)``.
    n_d_log_normalizer : float
        ``n (A(theta') - A(theta))``.
    log_prior_ratio, log_proposal_ratio : float
    stat_noise_std : float
        ``sigma_S`` (see `expfam_noise_std`).
    rng : numpy Generator
    size : int, optional
        Number of independent releases (returns an array); ``None`` for one (a float).
    variance_correction : bool
        Subtract half the noise variance (default). ``False`` only to demonstrate the bias
        of the uncorrected test; it is not a supported sampler.
    """
    d_eta = np.asarray(d_eta, dtype=float)
    shape = (d_eta.size,) if size is None else (int(size), d_eta.size)
    noisy = np.asarray(stat_sum, dtype=float) + stat_noise_std * rng.normal(size=shape)
    var = stat_noise_std**2 * float(d_eta @ d_eta)
    log_a = (
        noisy @ d_eta
        - n_d_log_normalizer
        + log_prior_ratio
        + log_proposal_ratio
        - (0.5 * var if variance_correction else 0.0)
    )
    return float(log_a) if size is None else log_a


def correlated_noise_schedule(
    noise_multiplier: float, iterations: int, refreshes: float
) -> tuple[float, float]:
    r"""Noise multiplier ``z0`` of a chain's first release and correlation ``r`` of the rest.

    A chain of ``iterations`` planned iterations of the penalty test with noise multiplier
    ``z`` releases ``mu_chain = iterations / (2 z^2)``. The correlated scheme
    (`correlated_release`) spends the same: one release of ``S`` with noise ``z0 * 2b``
    (``mu_0 = 1 / (2 z0^2)``) and at most ``iterations`` releases
    ``Y' = r Y + (1 - r) S + z0 2b sqrt(1 - r^2) xi``, each a Gaussian mechanism on ``S``
    with sensitivity ``(1 - r) 2b`` and noise ``z0 2b sqrt(1 - r^2)`` given the previous
    release, so ``mu_t = mu_0 g`` with ``g = (1 - r) / (1 + r)``. With
    ``K = iterations * g`` (``refreshes``: the number of autocorrelation times of the noise
    per chain), ``mu_chain = mu_0 (1 + K)``, hence ``z0 = z sqrt((1 + K) / iterations)`` and
    ``r = (1 - g) / (1 + g)``.

    Returns
    -------
    z0 : float
        Noise multiplier of the first release (its noise std is ``z0 * 2b``).
    r : float
        Correlation of consecutive noises (``0 <= r < 1``).
    """
    z = float(noise_multiplier)
    m = int(iterations)
    if m < 1 or not (np.isfinite(z) and z > 0):
        raise ValueError("iterations must be >= 1 and noise_multiplier > 0")
    k = min(float(refreshes), float(m))
    g = k / m
    return z * float(np.sqrt((1.0 + k) / m)), (1.0 - g) / (1.0 + g)


def correlated_release(
    previous: np.ndarray | None,
    stat_sum: np.ndarray,
    r: float,
    noise_std: float,
    rng: np.random.Generator,
    *,
    start: np.ndarray | None = None,
) -> np.ndarray:
    r"""One release of the correlated scheme (Deligiannidis, Doucet & Pitt 2018).

    ``Y = S + sigma u`` with ``u`` an auxiliary Gaussian: the first release of a chain is
    ``S + sigma (start + xi)`` (``start`` a public shift, default 0), every later one moves
    ``u`` by a Crank-Nicolson step, ``u' = r u + sqrt(1 - r^2) xi``, i.e.

    $$ Y' = r Y + (1 - r) S + \sigma \sqrt{1 - r^2}\,\xi, \qquad \xi \sim N(0, I), $$

    with ``Y`` the previous release (public once released). Given ``Y`` this is a Gaussian
    mechanism on ``S``: replace-one sensitivity ``(1 - r)`` times that of ``S``, noise std
    ``sigma sqrt(1 - r^2)`` (`correlated_noise_schedule`). The output is a release: never
    compute it without charging it.
    """
    S = np.asarray(stat_sum, dtype=float)
    xi = rng.normal(size=S.shape)
    if previous is None:
        shift = 0.0 if start is None else np.asarray(start, dtype=float)
        return S + float(noise_std) * (shift + xi)
    return (
        float(r) * np.asarray(previous, dtype=float)
        + (1.0 - float(r)) * S
        + float(noise_std) * float(np.sqrt(1.0 - float(r) ** 2)) * xi
    )


def correlated_log_acceptance(
    psi_new: np.ndarray,
    psi: np.ndarray,
    release_new: np.ndarray,
    release: np.ndarray,
    rest: float,
    noise_std: float,
) -> float:
    r"""Log acceptance ratio of the correlated pseudo-marginal exponential-family test.

    With ``psi(theta) = eta(theta) - eta_0`` (``eta_0`` public) and a release
    ``Y = S + sigma u``, $\hat L(\theta, u) = \exp(\psi^\top Y - \sigma^2\|\psi\|^2/2)$ is
    an unbiased estimator of $\exp(\psi(\theta)^\top S)$ over $u \sim N(0, I)$, so the chain
    on $(\theta, u)$ with target $p(\theta) e^{-nA(\theta)} \hat L(\theta, u) N(u; 0, I)$
    has the exact posterior as its $\theta$-marginal (the pseudo-marginal argument; with
    ``u`` moved by a Crank-Nicolson step its proposal ratio cancels with ``N(u; 0, I)``:
    Deligiannidis, Doucet & Pitt 2018, JRSS B 80(5), Sec. 2). Returns

    $$ \psi'^\top Y' - \psi^\top Y - \tfrac12\sigma^2(\|\psi'\|^2 - \|\psi\|^2) + \mathrm{rest} $$

    with ``rest`` the data-free part (``-n dA``, prior and proposal ratios).
    """
    psi_new = np.asarray(psi_new, dtype=float)
    psi = np.asarray(psi, dtype=float)
    s2 = float(noise_std) ** 2
    return float(
        psi_new @ np.asarray(release_new, dtype=float)
        - psi @ np.asarray(release, dtype=float)
        - 0.5 * s2 * (psi_new @ psi_new - psi @ psi)
        + float(rest)
    )


class StatPasses(Protocol):
    """The data passes `private_whitening` releases (each the input of one mechanism).

    `pymc_dp.records.expfam.ExpFamilyModel.passes` gives them for a model's records; the
    returned sums and counts are exact (never publish them).
    """

    def clipped_stat_sum(self, bound: float) -> np.ndarray: ...

    def deviation_counts(
        self, centre: np.ndarray, grid: np.ndarray, scale: np.ndarray | None
    ) -> np.ndarray: ...

    def centred_clip_sum(
        self,
        centre: np.ndarray,
        bound: float,
        *,
        scale: np.ndarray | None = None,
        absolute: bool = False,
        outer: bool = False,
    ) -> np.ndarray: ...


@dataclass(frozen=True)
class Whitening:
    """A released centre, whitening and clip bound of the statistics (DP outputs).

    The statistic a later release sums is ``sum_i clip_b(W (T(x_i) - c))`` (replace-one
    sensitivity ``2 b``); ``releases`` is the number of Gaussian releases that made these.
    """

    centre: np.ndarray
    scale: np.ndarray
    clip: float
    releases: int


def private_whitening(
    passes: StatPasses,
    *,
    n: int,
    stat_clip_bound: float,
    quantile: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    centre: np.ndarray | None = None,
    on_release: Callable[[], None] | None = None,
    relative_floor: float = 1e-3,
    top: float | None = None,
    clip_noise_multiplier: float | None = None,
    clip_extend_sds: float | None = None,
    clip_located_share: float | None = None,
    clip_scan_sds: float | None = None,
    grid_bins: int | None = None,
) -> Whitening:
    r"""Centre, whiten and bound the sufficient statistics privately (up to six releases).

    Every release is a Gaussian mechanism with noise multiplier ``z``
    (``noise_multiplier``) on a query of replace-one sensitivity given below; the returned
    values are post-processing of the releases:

    1. (``centre`` not given) the DP centre ``c = (sum_i clip_C(T(x_i)) + N(0, (2 C z)^2 I)) /
       n`` (`private_centre`; ``C`` is ``stat_clip_bound``, the box bound of ``T``);
    2. a DP ``quantile`` ``b1`` of ``||T(x_i) - c||`` (noisy histogram, sensitivity
       ``sqrt(2)``);
    3. the DP mean absolute deviation per coordinate, ``|T(x_i) - c|`` clipped to ``b1``
       (sensitivity ``2 b1``), whose inverse is the diagonal whitening ``w``;
    4. a DP quantile ``b2`` of ``||w (T(x_i) - c)||``;
    5. the DP second moment of the clipped ``w (T(x_i) - c)`` (Frobenius sensitivity
       ``sqrt(2) b2^2``), whose inverse square root (eigenvalues floored at the noise's
       spectral norm) gives ``W``;
    6. the DP quantile ``b`` of ``||W (T(x_i) - c)||``.

    A later sum ``sum_i clip_b(W (T(x_i) - c))`` then has sensitivity ``2 b`` with ``b``
    near the typical whitened deviation rather than the box's worst record: the noise it
    needs is that of the data's spread, not of the public box (Yildirim & Ermis 2019, Sec.
    3.3, centre the statistics; the whitening is this package's).

    ``on_release`` is called after each release (accounting of a run stopped part-way).
    ``relative_floor`` floors the second moment's eigenvalues at that share of the largest
    (besides the noise's spectral norm): ``1e-3`` keeps the whitening's condition number
    moderate; a smaller floor whitens directions of small spread too (the residual
    direction ``r - A beta`` of a linear regression, `pymc_dp.auto.suffstats`). ``top`` is
    the largest deviation ``||T(x_i) - c||`` inside the public box, the top of the quantiles'
    grids (default ``stat_clip_bound + ||c||``). ``clip_noise_multiplier``,
    ``clip_extend_sds``, ``clip_located_share`` and ``clip_scan_sds`` are release 6's own
    (`private_clip_bound`). ``grid_bins``: the quantiles' grids' bounds
    (`private_clip_bound`; default `CLIP_GRID_BINS`).
    """
    z = float(noise_multiplier)
    made = 0

    def released() -> None:
        nonlocal made
        made += 1
        if on_release is not None:
            on_release()

    def dp_quantile(
        c: np.ndarray, scale: np.ndarray | None, top: float, zq: float = z, extend=None
    ) -> float:
        located = clip_located_share if extend is not None else None
        scan = clip_scan_sds if extend is not None else None
        b = private_clip_bound(
            passes, c, scale, top, n, quantile, zq, rng, extend, located, scan, grid_bins
        )
        released()
        return b

    C = float(stat_clip_bound)
    if centre is None:
        # -- release 1: the DP centre -------------------------------------------------------
        centre = private_centre(passes.clipped_stat_sum(C), n, C, z, rng)
        released()
    c = np.asarray(centre, dtype=float)
    d = c.size
    if top is None:
        top = float(C + np.linalg.norm(c))  # the largest deviation inside the box
    # -- release 2: a DP quantile of the deviations ||T(x_i) - c|| ---------------------------
    b1 = dp_quantile(c, None, top)
    # -- release 3: the DP mean absolute deviation per coordinate (clipped to b1) ------------
    A = passes.centred_clip_sum(c, b1, absolute=True)
    mad = (A + z * 2.0 * b1 * rng.normal(size=A.shape)) / n
    del A
    released()
    floor = max(3.0 * z * 2.0 * b1 / n, 1e-3 * float(np.max(mad)), 1e-12)
    w = 1.0 / np.maximum(mad, floor)
    # -- release 4: a DP quantile of ||w (T(x_i) - c)|| ----------------------------------------
    b2 = dp_quantile(c, w, float(np.max(w)) * top)
    # -- release 5: the DP second moment of the clipped w (T(x_i) - c) -----------------------
    O2 = passes.centred_clip_sum(c, b2, scale=w, outer=True)
    std = z * OUTER_SENSITIVITY * b2**2
    M = (O2.reshape(d, d) + _sym_noise(d, std, rng)) / n
    del O2
    released()
    lam, U = np.linalg.eigh(0.5 * (M + M.T))
    # eigenvalues below the noise (spectral norm of the noise ~ 2 std sqrt(d) / n) or 1e-3 of
    # the largest are floored: whitening never amplifies noise directions
    floor = max(2.0 * std * np.sqrt(d) / n, relative_floor * float(np.max(lam)), 1e-12)
    lam = np.maximum(lam, floor)
    W = (U * lam**-0.5) @ U.T @ np.diag(w)
    # -- release 6: the DP quantile b of the whitened deviations ||W (T(x_i) - c)|| -----------
    zc = z if clip_noise_multiplier is None else float(clip_noise_multiplier)
    b = dp_quantile(c, W, float(np.linalg.norm(W, 2)) * top, zc, clip_extend_sds)
    return Whitening(centre=c, scale=W, clip=b, releases=made)


#: The log grid of `private_clip_bound`: ``CLIP_GRID_BINS`` bounds over ``CLIP_GRID_DECADES``
#: decades below the largest deviation inside the box.
CLIP_GRID_BINS = 80
CLIP_GRID_DECADES = 5

#: Family-wise chance that noise alone passes the threshold of some empty bin of a plain DP
#: quantile's histogram (`private_clip_bound` without ``extend_sds`` / ``located_share``).
QUANTILE_FAMILY_WISE = 1e-3


def private_clip_bound(
    passes: StatPasses,
    centre: np.ndarray,
    scale: np.ndarray | None,
    top: float,
    n: int,
    quantile: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    extend_sds: float | None = None,
    located_share: float | None = None,
    scan_sds: float | None = None,
    bins: int | None = None,
) -> float:
    """A DP ``quantile`` of ``||W (T(x_i) - c)||`` on a public grid below ``top`` (one release).

    The noisy histogram of `pymc_dp.kernels.warmstart.noisy_histogram_quantile` (sensitivity
    ``sqrt(2)``); ``extend_sds`` as in `pymc_dp.kernels.warmstart.histogram_quantile`.
    ``located_share``: where the bins above the noise threshold hold less than that share of
    the ``n`` records, the histogram has not located them (they are spread over bins each
    below the noise) and the bound is ``top``, the largest deviation inside the box: a bound
    chosen among the located bins alone would clip the records it cannot see, a bias no
    noise-aware posterior models (post-processing of the released histogram).
    ``scan_sds``: then the bound moves up a bin at a time while some run of bins above it
    holds more records than the quantile allows by that many noise sds of the run's sum
    (`scan_tail`): a tail spread thinly over many bins, each below the noise threshold,
    is located by its sum. ``bins``: the grid's bounds over its `CLIP_GRID_DECADES`
    decades (default `CLIP_GRID_BINS`; public).
    """
    bins = CLIP_GRID_BINS if bins is None else int(bins)
    grid = clip_grid(top * 10.0**-CLIP_GRID_DECADES, top, bins)
    hist = histogram_from_counts(n, passes.deviation_counts(centre, grid, scale))
    if extend_sds is None and located_share is None:
        # a bin counts as empty below Bonferroni's level over the grid's 81 bins (1e-3 that
        # noise passes anywhere): at 3 sds an empty bin far up passes in about one
        # histogram in ten and the bound jumps there (measured: a linear regression's
        # whitening quantile at 2.2e6 where every record lay below 128, its second moment
        # then released with noise ~ b^2: the whitening was noise)
        sds = bonferroni_sds(grid.size + 1, QUANTILE_FAMILY_WISE)
        b, _ = noisy_histogram_quantile(hist, grid, quantile, noise_multiplier, rng, sds)
        return float(b)
    std = noise_multiplier * HISTOGRAM_SENSITIVITY
    noisy = hist + rng.normal(size=hist.shape) * std
    if located_share is not None:
        located = float(np.sum(noisy[noisy >= HISTOGRAM_THRESHOLD_SDS * std]))
        if located < located_share * n:
            return float(top)
    b = float(histogram_quantile(noisy, grid, quantile, n, std, extend_sds=extend_sds))
    if scan_sds is not None:
        k = int(np.searchsorted(grid, b))
        b = float(grid[scan_tail(noisy, k, (1.0 - quantile) * n, scan_sds * std)])
    return b


#: Points of the midpoint rule of each level of `tail_excess`.
TAIL_EXCESS_POINTS = 32


def _tail_excess_grid(levels: np.ndarray) -> np.ndarray:
    levels = np.asarray(levels, dtype=float).ravel()
    mid = (np.arange(TAIL_EXCESS_POINTS) + 0.5) / TAIL_EXCESS_POINTS
    return (levels[:, None] * (1.0 + mid[None, :])).ravel()


def tail_excess(passes: StatPasses, centre, scale, levels) -> np.ndarray:
    r"""The clipped excess of the deviations beyond each level (exact: the query of
    `private_tail_excess`).

    For levels ``L_j``, ``X_j = sum_i min((||W (T(x_i) - c)|| - L_j)_+, L_j) / L_j`` by the
    midpoint rule on ``TAIL_EXCESS_POINTS`` points of ``(L_j, 2 L_j]``: a record's share
    of ``X_j`` is the fraction of those points its deviation exceeds, in ``[0, 1]``.
    ``L_j X_j`` is the part below ``2 L_j`` of the norm that a clip at ``L_j`` takes off
    the records beyond it (the clipped sum's bias is at most the whole of it).
    """
    levels = np.asarray(levels, dtype=float).ravel()
    counts = np.asarray(passes.deviation_counts(centre, _tail_excess_grid(levels), scale))
    return counts.reshape(levels.size, TAIL_EXCESS_POINTS).mean(axis=1)


def private_tail_excess(
    passes: StatPasses,
    centre,
    scale,
    levels,
    noise_multiplier: float,
    rng: np.random.Generator,
    size: int | None = None,
) -> np.ndarray:
    """`tail_excess` plus ``N(0, (sqrt(J) z)^2 I)`` (one Gaussian release).

    Replace-one sensitivity ``sqrt(J)`` for ``J`` levels: each record moves each ``X_j`` by
    at most 1 (its share is in ``[0, 1]``). ``size``: that many independent releases
    (shape ``(size, J)``; the audit's trials).
    """
    X = tail_excess(passes, centre, scale, levels)
    shape = X.shape if size is None else (int(size), X.size)
    return X + float(noise_multiplier) * float(np.sqrt(X.size)) * rng.normal(size=shape)


def scan_tail(noisy: np.ndarray, k: int, allowance: float, bar: float) -> int:
    """The first grid index from ``k`` up with no run of noisy bins above it that holds records.

    ``noisy`` are the ``len(grid) + 1`` noisy bins of a histogram on ``grid`` (bin ``m`` is
    ``(grid[m - 1], grid[m]]``). While some run of bins ``(grid[k], grid[m]]`` sums to more
    than ``allowance + bar sqrt(m - k)`` (``bar``: a number of sds of one bin's noise; the
    run's sum has ``sqrt(m - k)`` of them), ``k`` moves up one bin. A tail that the per-bin
    threshold of `pymc_dp.kernels.warmstart.histogram_quantile` cannot see, say 450
    records spread over 15 bins of 30 each against a threshold of 80 (gpa2 at epsilon 1,
    docs/auto.md), sums to many sds of the runs that hold it: the bound moves past most of
    it. One bin at a time, because a run that holds the tail and the empty bins above it
    passes too: moving to its end would overshoot into bins that hold nothing. Over bins of
    noise alone some run from ``grid[k]`` passes ``bar = 3`` sds with probability about
    1 % (simulated, 60 bins): the bound then moves up a bin, more noise, no bias.
    Post-processing of the released bins.
    """
    noisy = np.asarray(noisy, dtype=float)
    last = noisy.size - 1  # the open bin above the grid's top never moves the bound
    k = int(k)
    while k + 1 < last:
        runs = np.cumsum(noisy[k + 1 : last])
        if not np.any(runs > allowance + bar * np.sqrt(np.arange(1, runs.size + 1))):
            break
        k += 1
    return min(k, last - 1)
