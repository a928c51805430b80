r"""The DP penalty test on a minibatch drawn without replacement (pure numpy).

Räisä (2021), MSc thesis, Sec. 4.1, Lemma 1 and Theorem 9 [Raisa2021]; the penalty method
of Ceperley & Dewing (1999) [CeperleyDewing1999] and Yildirim & Ermis (2019)
[YildirimErmis2019]. Never imports PyMC; every random draw comes from the generator passed
in. Keys: docs/references.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_dp.kernels.penalty import accept

__all__ = [
    "SubsampledPenaltyInfo",
    "clipped_moments",
    "merge_moments",
    "minibatch_estimate",
    "moments_estimate",
    "subsampled_penalty_log_acceptance",
    "subsampled_penalty_sensitivity",
    "subsampled_penalty_transition",
]


def minibatch_estimate(r, n: int, bound: float) -> tuple[np.ndarray, np.ndarray]:
    r"""Minibatch estimate of the log-likelihood ratio and its batch variance.

    For per-record (tempered) ratios ``r`` of a batch of ``b`` records drawn without
    replacement from ``n``, clipped to ``[-bound, bound]`` (NaN counts as 0, as in the
    full-data steps):

    $$
    \hat\lambda = \frac{n}{b}\sum_{j\in B} r_j, \qquad
    \sigma_b^2 = \Bigl(1 - \frac{b}{n}\Bigr)\Bigl(\frac{n}{b}\Bigr)^2
    \sum_{j\in B}(r_j - \bar r)^2 .
    $$

    $\sigma_b^2$ is the thesis' estimate (Sec. 4.1; Heikkilä et al. 2019) times the
    finite-population correction $1 - b/n$ of sampling without replacement, which makes
    it vanish at ``b = n`` (the full-data test, exact) and only shrinks every sensitivity bound
    by the same factor (so Lemma 1 and Theorem 8 hold as stated). ``r`` may have a leading
    trials axis: shape ``(..., b)``.
    """
    r = np.asarray(r, dtype=float)
    r = np.clip(np.where(np.isnan(r), 0.0, r), -bound, bound)
    b = r.shape[-1]
    scale = n / b
    lam = scale * r.sum(axis=-1)
    ss = np.sum((r - r.mean(axis=-1, keepdims=True)) ** 2, axis=-1)
    var = (1.0 - b / n) * scale * scale * ss
    return lam, var


def clipped_moments(r, bound: float) -> tuple[tuple[int, float, float], tuple[int]]:
    r"""Moments of a part of a minibatch: ``((m, sum, M2), (n_clipped,))``.

    ``r`` are per-record (tempered) ratios, clipped as in `minibatch_estimate` (NaN counts
    as 0); ``m`` is their number, ``sum`` their clipped sum and ``M2`` the sum of squared
    deviations from their mean. Parts are combined by `merge_moments` and turned into the
    estimate by `moments_estimate`, so that the moments travel as sums (where the records
    live) instead of per-record values. ``n_clipped`` (records outside ``[-bound, bound]``
    or NaN) is computed from the data without noise: never publish it.
    """
    r = np.asarray(r, dtype=float)
    n_clipped = int(np.count_nonzero(~(np.abs(r) <= bound)))
    r = np.clip(np.where(np.isnan(r), 0.0, r), -bound, bound)
    if r.size == 0:
        return (0, 0.0, 0.0), (n_clipped,)
    total = float(r.sum())
    m2 = float(np.sum((r - total / r.size) ** 2))
    return (int(r.size), total, m2), (n_clipped,)


def merge_moments(a: tuple[int, float, float], b: tuple[int, float, float]):
    r"""Combine the moments ``(m, sum, M2)`` of two disjoint parts (Chan, Golub & LeVeque
    1979): ``M2 = M2_a + M2_b + (mean_b - mean_a)^2 m_a m_b / (m_a + m_b)``."""
    ma, sa, qa = a
    mb, sb, qb = b
    if ma == 0:
        return b
    if mb == 0:
        return a
    m = ma + mb
    delta = sb / mb - sa / ma
    return m, sa + sb, qa + qb + delta * delta * ma * mb / m


def moments_estimate(moments: tuple[int, float, float], n: int) -> tuple[float, float]:
    r"""`minibatch_estimate` from the merged moments ``(b, sum, M2)`` of the whole batch:
    $\hat\lambda = (n/b)\,\mathrm{sum}$ and $\sigma_b^2 = (1 - b/n)(n/b)^2 M_2$."""
    b, total, m2 = moments
    scale = n / b
    return scale * total, (1.0 - b / n) * scale * scale * m2


def subsampled_penalty_sensitivity(n: int, b: int, clip_bound: float, step_norm: float) -> float:
    r"""Replace-one sensitivity ``c = Delta_lambda + Delta_sigma`` of ``lambda - sigma_b^2 / 2``.

    Thesis Theorem 9 with Lemma 1, for tempered ratios clipped to $\pm L h$
    ($h = \|\theta'-\theta\|_2$, tempering already inside the ratios):

    $$
    \Delta_\lambda = \frac{2 n L h}{b}, \qquad
    \Delta_\sigma = \kappa \Bigl(\frac{n}{b}\Bigr)^2 L^2 h^2
    \Bigl[\Bigl|1 - \frac1b\Bigr| + \frac{2(b-1)}{b}\Bigr],
    $$

    with $\kappa = 1 - b/n$ the finite-population factor of `minibatch_estimate`
    (Lemma 1 bounds half the sensitivity of the variance estimate without it; its first term
    is twice what the proof needs, which keeps it a valid upper bound).
    """
    lh = clip_bound * step_norm
    kappa = 1.0 - b / n
    d_lam = 2.0 * n * lh / b
    d_sig = kappa * (n / b) ** 2 * lh * lh * (abs(1.0 - 1.0 / b) + 2.0 * (b - 1) / b)
    return d_lam + d_sig


def subsampled_penalty_log_acceptance(
    lam, batch_var, log_prior_ratio: float, sigma: float, rng: np.random.Generator
):
    r"""Noisy, penalty-corrected log acceptance of the subsampled test (thesis Sec. 4.1).

    $$
    \hat\lambda - \tfrac12\sigma_b^2 + \xi + \log\frac{p(\theta')}{p(\theta)}
    - \tfrac12\sigma^2, \qquad \xi\sim N(0, \sigma^2).
    $$

    The released quantity is $\hat\lambda - \sigma_b^2/2 + \xi$: a Gaussian mechanism on
    the minibatch with sensitivity ``c`` (`subsampled_penalty_sensitivity`) and noise
    ``sigma = z c``. If $\hat\lambda \sim N(\lambda, \sigma_b^2)$ (CLT) with the
    variance known, $E[\exp(\hat\lambda - \lambda - \sigma_b^2/2 + \xi - \sigma^2/2)] = 1$
    and the test is the exact penalty test (Ceperley & Dewing 1999); both the normality and
    the plug-in variance are approximations (exact at ``b = n``). Elementwise on arrays.
    """
    lam = np.asarray(lam, dtype=float)
    xi = rng.normal(size=lam.shape) * sigma
    out = lam - 0.5 * np.asarray(batch_var) + xi + log_prior_ratio - 0.5 * sigma * sigma
    return out if out.shape else float(out)


class SubsampledPenaltyInfo(NamedTuple):
    """Outcome of one subsampled penalty test (`subsampled_penalty_transition`).

    ``clip_fraction`` and ``batch_var`` are computed from the data without noise: never
    publish them (the step emits them only behind ``nonprivate_diagnostics``).
    """

    accepted: bool
    #: Noisy, penalty-corrected log acceptance ratio.
    log_accept: float
    #: ``sigma = z c`` of the release.
    noise_std: float
    clip_fraction: float
    batch_var: float


def subsampled_penalty_transition(
    rng: np.random.Generator,
    *,
    n_records: int,
    batch_size: int,
    clip_bound: float,
    noise_multiplier: float,
    step_norm: float,
    log_prior_ratio: float,
    minibatch_ratios: Callable[[np.ndarray], np.ndarray] | None = None,
    minibatch_moments: Callable[[np.ndarray, float], tuple] | None = None,
) -> SubsampledPenaltyInfo:
    r"""One accept/reject decision of the subsampled penalty test (thesis Sec. 4.1).

    Draws ``batch_size`` of ``n_records`` indices without replacement, reads their tempered
    log-likelihood ratios ``minibatch_ratios(idx)`` (the one data access), clips them to
    $\pm L h$ (``h = step_norm``), and releases
    $\hat\lambda - \sigma_b^2/2 + \xi$, $\xi \sim N(0, (z c)^2)$,
    ``c`` from `subsampled_penalty_sensitivity`. Random draws, in this order: the
    batch, the noise, the accept uniform.

    Give exactly one data access: ``minibatch_ratios`` (``idx -> r[idx]``) or
    ``minibatch_moments`` (``(idx, bound) -> ((b, sum, M2), (n_clipped,))``, the merged
    `clipped_moments` of the rows ``idx``: the access of records that never leave where
    they live).
    """
    if (minibatch_ratios is None) == (minibatch_moments is None):
        raise TypeError("give exactly one of minibatch_ratios and minibatch_moments")
    n, b = n_records, batch_size
    bound = clip_bound * step_norm
    sigma = noise_multiplier * subsampled_penalty_sensitivity(n, b, clip_bound, step_norm)
    # -- the one data access: a Gaussian mechanism on a minibatch drawn w/o replacement -------
    idx = np.sort(rng.choice(n, size=b, replace=False))
    if minibatch_moments is not None:
        moments, (n_clipped,) = minibatch_moments(idx, bound)
        lam, var = moments_estimate(moments, n)
        clip_fraction = n_clipped / b
    else:
        r = minibatch_ratios(idx)
        lam, var = minibatch_estimate(r, n, bound)
        clip_fraction = float(np.mean(~(np.abs(r) <= bound)))
    log_a = subsampled_penalty_log_acceptance(lam, var, log_prior_ratio, sigma, rng)
    # -- post-processing of the noisy release -------------------------------------------------
    return SubsampledPenaltyInfo(
        accepted=bool(accept(log_a, rng)),
        log_accept=float(log_a),
        noise_std=sigma,
        clip_fraction=float(clip_fraction),
        batch_var=float(var),
    )
