"""The one-shot strategy of the automatic mode: a noise-aware private Laplace approximation.

Where the posterior is close to Gaussian (a regression with no hierarchical block: the
Bernstein-von Mises regime of n records and a few parameters), a chain adds little to a
private Laplace approximation, and its intervals ignore the noise of the releases it
conditions on (the control variate tilts its target). Here, after the warm start
(`pymc_dp.kernels.warmstart.private_laplace`: a few private Newton steps on a fifth of the
budget) and a fresh DP histogram there for their clip bound
(`pymc_dp.auto.configure.ONESHOT_CLIP_SHARE`), the budget left goes to **two** last
releases, half each: the clipped gradient sum at the last iterate ``a``, in that
iteration's whitened coordinates, and the same at the end ``m1`` of the Newton step it
gives (`newton_step`):

    m1 = a + P^-1 (L g~(a) + grad log prior(a)),    g~ = sum_i clip_b(L^-1 g_i) + N(0, s^2 I),
    m2 = m1 + P^-1 (L g~(m1) + grad log prior(m1)), s = 2 b z,

``P`` the warm start's last released curvature (floored). Where the log-likelihood is
quadratic between them, ``m1`` and ``m2`` are the mode plus the effect of their own
release's noise, ``N_j = s^2 P^-1 L D L^T P^-1`` (``D`` the coordinates the likelihood
reads), independent; their inverse-variance combination carries the noise of one release
with both halves of the budget, and the result is ``N(m, P_c^-1 + N)``, ``P_c`` the
curvature less its release noise's norm (a conservative precision; `newton_step`). Where ``m2 -
m1`` is beyond its noise (a chi-square test), the warm start had not converged: the
result is ``m2``, widened along the last step (`noise_aware_laplace`), and flagged. This is
the private Newton method of the one-shot baselines (a few steps, most of the budget on
the last gradients) with the noise-aware output of Bernstein & Sheldon (2018, Sec. 4: the
posterior given the *released* statistic, whose noise adds to the sampling variance) in its
Gaussian approximation. Draws are independent
(`pymc_dp.step_methods.laplace.DPLaplaceDraws`); the run reads no data after the releases.
Every Newton step is held within a data-free trust region (`trust_region`: a few prior sds
a coordinate), the part cut off widening the result, and the result's variances are capped
by the prior's spread about its mean (`prior_cap`, the law of total variance), the
coordinates it caps re-centred to hold the prior's interval (`centre_prior_wide`) where they
are a parameter on the model's own scale and drawn from the prior itself elsewhere (a log
scale: `pymc_dp.step_methods.laplace.PriorBlock`): a release far in its noise's tail gives a
prior-wide answer, never a NaN or a 1e27-wide one.
Where some coordinates are read by no record (a recentred hierarchy's loc and log scale),
the draws take them from their exact conditional prior given the others
(`pymc_dp.step_methods.laplace.FreeBlock`): the Gaussian stands only where the data
determine the coordinates.

References
----------
.. [1] G. Bernstein, D. Sheldon, "Differentially private Bayesian inference for exponential
   families", NeurIPS 2018. [BernsteinSheldon2018]
.. [2] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte Carlo",
   Algorithm 1 / Theorem 3.5 (the clipped gradient sum's sensitivity ``2 b``). [DPHMC]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats

from pymc_dp.kernels.warmstart import bonferroni_sds

__all__ = [
    "METHODS",
    "ONESHOT_NEWTON_STEPS",
    "CURVATURE_WIDENING_WARN",
    "NewtonStep",
    "NoiseAwareLaplace",
    "PriorCap",
    "TRUST_PRIOR_SDS",
    "TRUST_LOG_SCALE",
    "LOST_PRIOR_SDS",
    "LOST_WIDENING",
    "DRIFT_Z",
    "DRIFT_WINDOW",
    "warm_start_drift",
    "lost_coordinates",
    "widen_to_prior",
    "centre_prior_wide",
    "PRIOR_WIDE_SDS",
    "newton_step",
    "prior_cap",
    "trust_region",
    "bonferroni_sds",
    "ClipTail",
    "CLIP_BIAS_WARN",
    "ONESHOT_TAIL_LEVELS",
    "ONESHOT_TAIL_SDS",
    "clip_tail",
    "tail_excess_grid",
    "choose_method",
    "curvature_step_cov",
    "zeroed_damping",
    "zeroed_entries",
    "zeroed_in_doubt",
    "zeroed_step_widening",
    "noise_aware_laplace",
    "release_gradient_sum",
    "release_tail_excess",
]

#: The strategies of the automatic mode (``auto_kwargs={"method": ...}``).
METHODS = ("auto", "laplace", "stats", "groupstats", "chain")

#: Private Newton steps of the one-shot strategy's warm start (public).
ONESHOT_NEWTON_STEPS = 10

#: Noise sds of the upper bound of the steps' contraction (`noise_aware_laplace`).
CONTRACTION_UPPER_SDS = 2.0

#: `NoiseAwareLaplace.curvature_widening` above which the result warns that the released
#: curvature's noise dominates its intervals (`pymc_dp.NoiseDominatedWarning`).
CURVATURE_WIDENING_WARN = 2.0

#: Trust region of every one-shot Newton step (`trust_region`): no coordinate of ``y`` moves
#: further than this many of its prior sds in one step (data-free). Measured (docs/auto.md,
#: "Eleventh session"): a varying-slopes model on 4 360 real records whose first step moved
#: ``log tau_b`` by -3.5e6 (a NaN result), a negative binomial whose ``alpha`` came out with
#: moments of 1e21.
TRUST_PRIOR_SDS = 3.0

#: The most a log-scale coordinate (a positive parameter's log transform) moves in one step,
#: whatever its prior: ``log(1e3)``.
TRUST_LOG_SCALE = float(np.log(1e3))


#: The warm start's last iterates (its Polyak window) whose drift `warm_start_drift` tests
#: the first one-shot step against.
DRIFT_WINDOW = 4
#: One-sided noise sds beyond which the first one-shot step is read as continuing the warm
#: start's drift (`warm_start_drift`): a crawl, not a landing.
DRIFT_Z = 3.0


def choose_method(
    method: str,
    hierarchical: bool,
    linear_stats: bool = False,
    why_not_stats: str = "",
    group_stats: bool = False,
) -> str:
    """The strategy of an automatic run, from public structure only (before any data read).

    ``"auto"``: the noise-aware posterior of released per-group statistics where the model
    is a normal model of group means whose response has a declared range (``group_stats``,
    `pymc_dp.auto.groupstats`); else the penalty chain where the model has a hierarchical or
    shifted block (`pymc_dp.auto.recentre`), whose posterior (a scale parameter's, a
    banana's) is far from Gaussian; else the noise-aware posterior of released sufficient
    statistics where the model is a linear regression whose response and covariates have
    declared bounds (``linear_stats``, `pymc_dp.auto.suffstats`); else the one-shot
    noise-aware Laplace approximation. ``"stats"`` asked for where it does not apply is
    refused, with ``why_not_stats``.

    The per-group statistics come first wherever they apply, as the sufficient statistics
    do for a linear regression: the likelihood reads the data only through them, so their
    noise-aware posterior is the whole answer (no warm start whose failure sends the chain
    to the one-shot fallback), and its planned error bounded its measured maximum within a
    factor 2 on bench_auto's hierarchy (maxima 1.93 / 0.6267 / 0.2782 NUTS sds against
    1.376 / 0.503 / 0.176 planned at epsilon 1 / 3 / 10), where the chain's planned error did
    not bound the run that replaced it (the one-shot fallback: maxima 165.7 and 1.332, 163
    and 3.6 times the plan, at epsilon 1 and 3). At epsilon 10, where the chain runs, it was
    a little better (max 0.247); on a response with a tail heavier than the normal the plan
    is optimistic and the result wide (wagepan by industry; docs/auto.md).
    """
    if method not in METHODS:
        raise ValueError(
            f"auto_kwargs['method'] must be one of {METHODS}; got {method!r}. 'laplace' is the "
            "one-shot noise-aware private Laplace approximation, 'stats' the noise-aware "
            "posterior of released sufficient statistics (a linear regression with "
            "data_bounds), 'groupstats' that of released per-group statistics (a "
            "hierarchical normal model with data_bounds), 'chain' the private penalty chain, "
            "'auto' chooses by the model's structure"
        )
    if method == "stats" and not linear_stats:
        raise ValueError(
            "auto_kwargs={'method': 'stats'} needs a linear regression y ~ Normal(a + X @ b, "
            "sigma) whose response and covariates have declared bounds (data_bounds={'y': "
            "(lo, hi), 'X': (lo, hi)}, the covariates in pm.Data containers); here: "
            f"{why_not_stats or 'not checked'}"
        )
    if method != "auto":
        return method
    if group_stats:
        return "groupstats"
    if hierarchical:
        return "chain"
    return "stats" if linear_stats else "laplace"


@dataclass
class NewtonStep:
    """One Newton step with a released gradient (DP outputs, coordinates ``y``)."""

    #: where the step ends: ``a + P^-1 (L g~ + grad log prior(a))``
    mean: np.ndarray
    #: the step itself
    step: np.ndarray
    #: the release noise's effect on ``mean``: ``s^2 P^-1 L D L^T P^-1``
    noise_cov: np.ndarray
    #: the conservative posterior covariance ``P_c^-1``
    cov_c: np.ndarray
    #: the curvature ``P`` of the step
    precision: np.ndarray
    #: the released curvature's error's effect on ``mean`` (first order; `curvature_step_cov`;
    #: zeros where the curvature's error was not given)
    curvature_cov: np.ndarray
    #: the part of the step the trust region held back (`trust_region`; zeros where none):
    #: doubt, which the result's covariance covers
    cut: np.ndarray | None = None
    #: ``P_c^-1`` with the released curvature's thresholded entries' possible truth taken
    #: off ``P`` as well (`zeroed_damping`; ``None`` where none was thresholded)
    cov_zeroed: np.ndarray | None = None
    #: the part of ``curvature_cov`` from the thresholded entries alone (`curvature_step_cov`
    #: with their sds, the kept entries' set to 0; ``None`` where none was thresholded):
    #: `zeroed_step_widening`
    zeroed_cov: np.ndarray | None = None


@dataclass
class NoiseAwareLaplace:
    """The one-shot result (DP outputs, in the approximation's coordinates ``y``)."""

    mean: np.ndarray
    cov: np.ndarray
    #: the part of ``cov`` due to the releases' noise
    noise_cov: np.ndarray
    #: predicted error of the mean from the release noise, in posterior sds (worst coordinate)
    predicted_error: float
    #: the second step's correction of the first, on the chi-square scale of their noise
    #: (chi-square with ``k`` degrees of freedom where the log-likelihood is quadratic)
    step_chi2: float = float("nan")
    #: whether that is within the chi-square's 0.99 quantile (else the steps disagree beyond
    #: their noise: the warm start had not converged and the intervals were widened)
    converged: bool = True
    #: the ratio of the second step's length to the first's (``P`` metric)
    contraction: float = float("nan")
    #: how much wider the conservative curvature ``P_c`` makes the worst coordinate's sd
    #: than the released curvature ``P`` alone (``max_j sqrt((P_c^-1)_jj / (P^-1)_jj)``):
    #: above `CURVATURE_WIDENING_WARN` the curvature's noise dominates the intervals
    curvature_widening: float = 1.0
    #: whether the trust region (`trust_region`) cut a step or the extrapolation: the warm
    #: start had not converged (``converged`` is then false), the cut part widens ``cov``
    cut: bool = False
    #: the first step along the warm start's last drift, in its noise sds
    #: (`warm_start_drift`; ``nan`` without the warm start's path)
    drift: float = float("nan")
    #: whether that drift said the warm start was crawling (the first step beyond its noise
    #: and the drift beyond `DRIFT_Z`): ``converged`` is then false and the result widened by
    #: the whole path
    crawling: bool = False
    #: the possible bias of the clipped gradient sums (`clip_tail`), in posterior sds of the
    #: worst coordinate (``max_j sqrt(B_jj / (P_c^-1)_jj)``, ``B`` its part of ``cov``; 0
    #: where no tail beyond the clip bound was released or none was detected)
    clip_bias: float = 0.0
    #: the last releases' clip bound over the histogram's (`clip_tail`: 1, 2, 4 or 8)
    clip_scale: float = 1.0
    #: ``curvature_widening`` with the thresholded entries' possible truth in the damping
    #: (`zeroed_damping`, ``NewtonStep.cov_zeroed``): above `CURVATURE_WIDENING_WARN` the
    #: released curvature cannot bound how far it overstates the Hessian; the result is in
    #: doubt where ``zeroed_step_widening`` says the steps still moved far (`zeroed_in_doubt`)
    zeroed_widening: float = 1.0
    #: how much the thresholded entries' first-order error over the two steps widens the
    #: result beyond its other parts (`zeroed_step_widening`; 1 where none was thresholded):
    #: with it and ``zeroed_widening`` above `CURVATURE_WIDENING_WARN` (and
    #: ``curvature_widening`` not), the result is in doubt (`zeroed_in_doubt`)
    zeroed_step_widening: float = 1.0


def trust_region(step: np.ndarray, max_move: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A step shortened as a whole so that no coordinate moves further than ``max_move``.

    Returns ``(taken, cut)`` with ``taken + cut`` the step: ``taken = step / r``, ``r =
    max(1, max_j |step_j| / max_move_j)`` (the direction kept). ``max_move`` comes from the
    prior (`TRUST_PRIOR_SDS` prior sds, `TRUST_LOG_SCALE` for a log scale: data-free);
    ``inf`` where there is no bound (an improper prior). A step that is not finite is not
    taken; its cut is then ``max_move`` (``0`` where that is unbounded): the doubt of a
    step that could have gone anywhere within the region. Post-processing of released
    values.
    """
    step = np.asarray(step, dtype=float)
    if max_move is None:
        return step, np.zeros_like(step)
    bound = np.broadcast_to(np.asarray(max_move, dtype=float), step.shape)
    if not np.all(np.isfinite(step)):
        return np.zeros_like(step), np.where(np.isfinite(bound), bound, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = np.where(np.isfinite(bound), np.abs(step) / bound, 0.0)
    r = float(np.max(over, initial=0.0))
    if not r > 1.0:
        return step, np.zeros_like(step)
    taken = step / r
    return taken, step - taken


@dataclass
class PriorCap:
    """The one-shot result bounded by the prior's variance (`prior_cap`; coordinates ``y``)."""

    mean: np.ndarray
    cov: np.ndarray
    #: the coordinates that came out wider than their prior (about the result's mean): their
    #: variance is the prior's mean square about the mean (the data could not be told from
    #: the noise there)
    capped: np.ndarray


#: Per-coordinate widening by the released curvature's noise (`curvature_widening`, one
#: coordinate) from which `lost_coordinates` treats a coordinate as told by nothing but noise
LOST_WIDENING = 10.0
#: ... and the distance from the prior's mean, in prior sds, beyond which its location is
#: then not trusted
LOST_PRIOR_SDS = 4.0


def lost_coordinates(
    second: NewtonStep, mean: np.ndarray, prior_mean: np.ndarray, prior_var: np.ndarray
) -> np.ndarray:
    """The coordinates whose location nothing released supports (post-processing).

    A coordinate is *lost* where the released curvature's noise dominates its interval,
    ``sqrt((P_c^-1)_jj / (P^-1)_jj) >= LOST_WIDENING`` (the eigenvalue floor of
    `newton_step` set its sd, not the data), where the prior is proper and where one such
    coordinate's mean lies beyond `LOST_PRIOR_SDS` prior sds of the prior's mean. Where the
    curvature's noise dominates, the steps are as small as they are uninformative: a warm
    start lost far out (measured: a zero-inflated Poisson regression on 2 725 real records
    at epsilon 1, every eigenvalue floored, `curvature_widening` 1e6, the steps agreeing
    within their noise, the intercept 6.4 prior sds out and 90 of its own sds off, ``logit
    psi`` at 66, ``psi`` drawn as exactly 1) passes every check on the steps. Such a
    coordinate's sd is widened to the prior's spread about its mean (the bound of
    `prior_cap`, `widen_to_prior`), and it is then prior-wide as a capped one
    (`pymc_dp.auto.configure._bounded_by_prior`: `centre_prior_wide` on the model's own
    scale, drawn from the prior elsewhere).
    """
    p_inv = np.diag(np.linalg.pinv(second.precision, hermitian=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        widening = np.sqrt(np.diag(second.cov_c) / p_inv)
        far = np.abs(np.asarray(mean) - prior_mean) > LOST_PRIOR_SDS * np.sqrt(prior_var)
    proper = np.isfinite(prior_var) & (prior_var > 0) & np.isfinite(prior_mean)
    noisy = proper & ~(widening < LOST_WIDENING)
    # one such coordinate far out means the warm start got lost: none of the coordinates
    # the curvature's noise dominates can be trusted to be near the mode (measured, the same
    # run: the slopes 1.6-3.6 prior sds out, 11-23 of their own sds off)
    return noisy if (noisy & far).any() else np.zeros_like(noisy)


def widen_to_prior(
    mean: np.ndarray, cov: np.ndarray, prior_mean: np.ndarray, prior_var: np.ndarray, which
) -> np.ndarray:
    """``cov`` with the variance of the coordinates ``which`` raised to ``prior_var + (mean -
    prior_mean)^2`` (`prior_cap`'s bound), rescaled as ``D S D`` (correlations kept)."""
    cov = np.array(cov, dtype=float)
    which = np.asarray(which, dtype=bool)
    if not which.any():
        return cov
    diag = np.diag(cov)
    bound = prior_var + (np.asarray(mean) - prior_mean) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(which & (diag > 0), np.sqrt(bound / diag), 1.0)
    out = cov * np.outer(ratio, ratio)
    zero = which & ~(diag > 0)
    out[zero, :] = 0.0
    out[:, zero] = 0.0
    out[zero, zero] = bound[zero]
    return out


#: A prior-wide coordinate's interval holds the prior's mean plus or minus this many prior sds
#: times 2 (`centre_prior_wide`): its sd is at least this many prior sds.
PRIOR_WIDE_SDS = 2.0


def centre_prior_wide(
    mean: np.ndarray, cov: np.ndarray, prior_mean: np.ndarray, prior_var: np.ndarray, which
) -> tuple[np.ndarray, np.ndarray]:
    """Prior-wide coordinates re-centred so that their intervals hold the prior's as well.

    Where the noise dominates a coordinate (`prior_cap`, `lost_coordinates`: ``which``), its
    spread is the prior's about the result's mean, ``s1^2 = v0 + (mean - m0)^2``; the mean is
    then mostly release noise, and its interval ``mean +- 2 s1`` may leave out the side of
    the prior the data point to. Measured: a negative binomial on 680 real records at
    epsilon 1 (docs/auto.md, "Thirteenth session"), a coefficient whose prior is N(0, 1)
    came out 0.24 (sd 1.01) where the posterior is at -1.90: 2.12 of its own sds off,
    beyond 2 in 2 of 36 pairs of the cell; the charity Tobit at epsilon 1, a slope whose
    prior is N(0, 2) at 0.72 (sd 2.35) where the posterior is at 6.53, 3.3 prior sds out (the
    prior is the user's: the data can put the posterior far beyond its bulk, and where the
    release tells nothing the result cannot say where). Each such coordinate's mean and sd
    become those of the smallest interval holding both ``m0 +- 2 k sqrt(v0)`` (``k`` =
    `PRIOR_WIDE_SDS`: the prior's, widened so that a posterior up to ``2 k`` prior sds out
    stays within 2 of the result's sds) and ``mean +- 2 s1`` (the result's as capped): its
    midpoint and a quarter of its length, the covariance rescaled ``D S D`` (the
    correlations kept). Never narrower than either; data-free post-processing of released
    values. Coordinates with a non-finite or non-positive ``prior_var`` are left as they are.
    Applied where ``y`` is the parameter's own scale: on a log scale an interval 4 prior sds
    wide in ``log phi`` draws ``phi`` far wider than its prior (a Gamma GLM's ``phi ~
    HalfNormal(1)``: sd 52.6 against 0.60), and such coordinates are drawn from the prior
    itself (`pymc_dp.auto.configure._bounded_by_prior`).
    """
    mean = np.array(mean, dtype=float)
    cov = np.array(cov, dtype=float)
    m0 = np.asarray(prior_mean, dtype=float)
    v0 = np.asarray(prior_var, dtype=float)
    which = np.asarray(which, dtype=bool) & np.isfinite(v0) & (v0 > 0) & np.isfinite(m0)
    diag = np.diag(cov)
    which &= np.isfinite(mean) & np.isfinite(diag) & (diag > 0)
    if not which.any():
        return mean, cov
    s0 = PRIOR_WIDE_SDS * np.sqrt(np.where(which, v0, 1.0))
    s1 = np.sqrt(np.where(which, diag, 1.0))
    lo = np.minimum(m0 - 2.0 * s0, mean - 2.0 * s1)
    hi = np.maximum(m0 + 2.0 * s0, mean + 2.0 * s1)
    scale = np.where(which, (hi - lo) / 4.0 / s1, 1.0)
    mean = np.where(which, 0.5 * (lo + hi), mean)
    cov = scale[:, None] * cov * scale[None, :]
    return mean, 0.5 * (cov + cov.T)


def prior_cap(
    mean: np.ndarray, cov: np.ndarray, prior_mean: np.ndarray, prior_var: np.ndarray
) -> PriorCap:
    """Bound a Gaussian result's marginal variances by the prior's spread (data-free).

    By the law of total variance, ``Var(theta) = E[Var(theta | D)] + Var(E[theta | D])``: in
    expectation over the data the posterior variance of every function of the parameters
    is at most its prior variance. A noise-aware result wider than that in a coordinate has
    learnt nothing there that can be told from the release noise: its variance falls back
    to the prior's mean square about the result's mean, ``prior_var + (mean -
    prior_mean)^2`` (the prior's spread, measured from where the result is), whenever it
    exceeds it, the mean kept. Keeping the mean and the prior's spread about it covers the
    truth both where the result's mean is noise and the truth is where the prior puts it
    (within one sd) and where the prior is far from the data (a coefficient 3.3 prior sds
    out: measured on a logistic GLMM, 9 275 real records, at epsilon 1, where the prior's
    own mean and variance put it 3.2 sds off). The covariance is rescaled, ``D S D`` with
    ``D_jj`` the ratio of the sds there (``1`` elsewhere): positive semi-definite, the
    correlations kept. Coordinates with a non-finite ``prior_var`` (an improper or
    heavy-tailed prior) are not capped. A coordinate whose mean or variance is not finite
    gets the prior's mean and variance, its covariances with the others set to 0.
    Post-processing.

    The bound holds in every coordinate system; it is applied in the approximation's
    coordinates ``y``, where the draws are Gaussian. Where ``y`` is not the parameter's
    own scale (a log scale), a Gaussian in ``y`` as wide as the prior there is still far
    wider than the prior on the parameter's scale (a log-normal's tail): the caller draws
    the coordinates it caps there from the prior itself
    (`pymc_dp.auto.configure._bounded_by_prior`, `pymc_dp.step_methods.laplace.PriorBlock`).
    """
    mean = np.array(mean, dtype=float)
    cov = np.array(cov, dtype=float)
    prior_mean = np.asarray(prior_mean, dtype=float)
    prior_var = np.asarray(prior_var, dtype=float)
    proper = np.isfinite(prior_var) & np.isfinite(prior_mean) & (prior_var > 0)
    diag = np.diag(cov).copy()
    bad = ~(np.isfinite(mean) & np.all(np.isfinite(cov), axis=1) & np.isfinite(diag))
    bad &= proper
    mean[bad] = prior_mean[bad]
    with np.errstate(invalid="ignore", over="ignore"):
        bound = np.where(proper, prior_var + (mean - prior_mean) ** 2, np.inf)
    capped = proper & (bad | ~(diag <= bound))
    if not capped.any():
        return PriorCap(mean, cov, capped)
    cov[bad, :] = 0.0
    cov[:, bad] = 0.0
    diag = np.where(bad, 1.0, diag)
    cov[np.diag_indices_from(cov)] = diag
    scale = np.ones_like(diag)
    scale[capped] = np.sqrt(bound[capped] / diag[capped])
    cov = scale[:, None] * cov * scale[None, :]
    return PriorCap(mean, 0.5 * (cov + cov.T), capped)


#: Levels of the release of the whitened gradient norms' excess beyond the last releases'
#: clip bound ``b`` (`clip_tail`): ``b 2^j``, ``j < ONESHOT_TAIL_LEVELS``. One level would
#: have ``sqrt 3`` less noise (sensitivity ``sqrt J``): it detected the charity Tobit's
#: tail on all six DP seeds at epsilon 3 (three levels: four of six) and on three of six at
#: epsilon 10 (three levels: one; 6-8 records beyond ``b``; two runs still 2.6-2.9 own sds
#: off, unwarned), but its bias bound (``2 b`` taken as the top) covered none of 400
#: releases of a tail at 2-9 ``b`` that three levels cover in all
#: (`test_a_released_tail_moves_the_bound_and_bounds_the_bias_left`): kept at 3.
ONESHOT_TAIL_LEVELS = 3
#: A level's released excess beyond this many of its noise sds says the gradients have a
#: tail beyond it (`clip_tail`). At 2.5 a tail-free run reads a tail with probability about
#: ``3 x 0.6 %``; the charity Tobit's tail (epsilon 3, 10 % share) is 4 sds at ``b``.
ONESHOT_TAIL_SDS = 2.5
#: `NoiseAwareLaplace.clip_bias` above which the result warns that the clipped gradients'
#: possible bias widens its intervals (`pymc_dp.NoiseDominatedWarning`).
CLIP_BIAS_WARN = 1.0
#: Midpoints of each level ``(L, 2 L]`` (the midpoint rule of the excess, as
#: `pymc_dp.kernels.expfam.tail_excess`).
TAIL_POINTS = 32


def tail_excess_grid(bound: float) -> np.ndarray:
    """The public grid of the excess release: `TAIL_POINTS` midpoints of ``(L_j, 2 L_j]``
    for each level ``L_j = bound 2^j`` (`ONESHOT_TAIL_LEVELS` levels), increasing.

    With ``C_m`` the records whose whitened gradient norm exceeds the grid's ``m``-th point,
    ``X_j`` (the mean of level ``j``'s counts) is ``sum_i min((||g_i|| - L_j)_+, L_j) / L_j``
    by the midpoint rule: each record's share in ``[0, 1]`` per level, so that the release of
    the ``J`` levels has replace-one L2 sensitivity ``sqrt(J)`` (`pymc_dp.kernels.expfam.
    private_tail_excess`, the same query on the sufficient statistics)."""
    levels = float(bound) * 2.0 ** np.arange(ONESHOT_TAIL_LEVELS)
    mid = (np.arange(TAIL_POINTS) + 0.5) / TAIL_POINTS
    return (levels[:, None] * (1.0 + mid[None, :])).ravel()


@dataclass
class ClipTail:
    """The last releases' clip bound and the possible bias left there (`clip_tail`)."""

    #: the clip bound of the last releases
    bound: float
    #: ``R``: the bound on the norm of the clipped sum's bias there (whitened units; 0 where
    #: no tail was detected)
    bias: float
    #: whether some level's released excess was beyond `ONESHOT_TAIL_SDS` of its noise
    detected: bool


def clip_tail(
    bound: float,
    excess: np.ndarray,
    excess_std: float,
    noise_multiplier: float,
    releases: int = 2,
    level: int | None = None,
) -> ClipTail:
    """The last releases' clip bound and their possible bias, from the released excess.

    The histogram's quantile ``b`` cannot see a tail spread thinly over bins each below its
    noise, and the gradients clipped there pull the released sums: a bias the noise-aware
    posterior does not model (measured: the Tobit on 4 268 charity records at epsilon 3, 37
    records clipped at ``b``, their exact pull 5.5 of the result's sds on ``sigma`` and 2.2
    on a skewed covariate's slope, both toward 0: the result 2.61 and 2.15 of its own sds
    off, unwarned; docs/auto.md). A record's gradient clipped at ``L`` moves the sum by its
    norm's excess beyond ``L`` at most, so the bias of a clipped sum (whitened) has norm at
    most ``R(L) = sum_i (||g_i|| - L)_+``, which the released levels ``X_j`` (`tail_excess_grid`,
    noise sd ``excess_std``) measure up to ``2 L_{J-1}``: ``R(L_j) = sum_{k >= j} L_k X_k`` and
    beyond the top level at least ``L_{J-1} X_{J-1}`` more (each record there counts 1 in
    ``X_{J-1}``; taken as that much again: a tail no lighter than geometric).

    Where no level's excess is beyond `ONESHOT_TAIL_SDS` of its noise, the bound stays ``b``
    and ``R = 0`` (a tail-free run pays only the release's share). A tail of a handful of
    records is below this release's power at `ONESHOT_TAIL_SHARE`: the charity Tobit at
    epsilon 10 (6-8 records beyond ``b``, exact first-level excess 1.8 noise sds) can come
    out 3 of its own sds off in ``sigma`` with no warning. Taking instead the excess's
    upper confidence bound (one-sided 1.645 sds of ``sum_j w_j X_j``, the weights of ``R``)
    as the bias wherever it exceeds the result's sd was measured and not kept: it flagged
    those runs, but on 24 tail-free runs (a Gamma GLM and a probit on real records,
    bench_auto's logistic3 and linear3; epsilon 3 and 10, DP seeds 0-2) it was 0.17-24 of
    the result's own sds, beyond 1 on 21: it would widen them 1.6-24 times
    (docs/auto-measured.md, sixteenth session). Where some is, the tail
    exists and its size is known up to the release's noise: every level's excess is taken
    at its point estimate (clamped at 0) plus one noise sd, and the bound moves to the level
    ``L`` of ``b, 2 b, 4 b, 8 b`` that minimises the result's variance per whitened
    direction, ``(2 L z)^2 / releases + R(L)^2`` (the last releases' noise at ``L``,
    combined, and the bias as a variance: ``R`` is the worst coordinate's bias in whitened
    units, posterior sds where the curvature is right). The caller adds ``R^2 K K^T`` to the
    result's covariance (``K = P^-1 L D``, `newton_step`: a bias of norm ``R`` moves each
    coordinate by at most ``R`` times its row of ``K``). Post-processing of released values.

    ``level`` (``j``): the bound is fixed at ``L_j = 2^j b`` and ``R(L_j)`` returned there
    (where the tail is detected), not the level of least variance: the penalty chain's
    one-shot fallback, whose first end (the control variate's release) is already clipped at
    ``b``, keeps both ends at ``b`` (``level=0``; `pymc_dp.auto.configure._one_shot`).
    """
    excess = np.asarray(excess, dtype=float).ravel()
    levels = float(bound) * 2.0 ** np.arange(excess.size + 1)
    detected = bool(np.any(excess > ONESHOT_TAIL_SDS * float(excess_std)))
    if not detected or not np.all(np.isfinite(excess)):
        return ClipTail(float(bound), 0.0, False)
    x = np.maximum(excess, 0.0) + float(excess_std)
    part = levels[:-1] * x  # each level's part of the excess
    beyond = part[-1]  # the part beyond the top level: as much again
    rest = np.concatenate([np.cumsum(part[::-1])[::-1], [0.0]]) + beyond
    var = (2.0 * levels * float(noise_multiplier)) ** 2 / max(int(releases), 1) + rest**2
    j = int(np.argmin(var)) if level is None else int(level)
    return ClipTail(float(levels[j]), float(rest[j]), True)


def release_tail_excess(
    fns,
    q: np.ndarray,
    bound: float,
    transform: np.ndarray | None,
    noise_multiplier: float,
    rng: np.random.Generator,
    size: int | None = None,
) -> np.ndarray:
    """The release of the excess beyond ``bound``, ``2 bound``, ``4 bound`` (`clip_tail`).

    ``X_j`` (`tail_excess_grid`: the records' counts beyond each midpoint of ``(L_j, 2
    L_j]``, averaged) plus ``N(0, (sqrt(J) z)^2 I)``: a Gaussian mechanism with replace-one L2
    sensitivity ``sqrt(J)`` (each record's share of each level is in ``[0, 1]``; a record
    whose gradient is not finite counts 1 in each) and privacy-loss parameter ``1 / (2
    z^2)``. ``fns`` are the records' functions, ``transform`` the public whitening (as
    `release_gradient_sum`); ``size``: that many independent releases (rows; the audit's
    trials).
    """
    grid = tail_excess_grid(bound)
    counts = np.asarray(fns.grad_norm_counts(q, grid, transform), dtype=float)
    exact = counts.reshape(ONESHOT_TAIL_LEVELS, TAIL_POINTS).mean(axis=1)
    shape = exact.shape if size is None else (int(size), exact.size)
    std = float(noise_multiplier) * float(np.sqrt(exact.size))
    return exact + rng.normal(size=shape) * std


def release_gradient_sum(
    fns,
    q: np.ndarray,
    bound: float,
    transform: np.ndarray | None,
    noise_multiplier: float,
    rng: np.random.Generator,
    size: int | None = None,
) -> np.ndarray:
    """The one-shot strategy's last release: ``sum_i clip_b(M grad l_i(q)) + N(0, (2 b z)^2 I)``.

    A Gaussian mechanism with L2 sensitivity ``2 b`` under replace-one neighbours (DP-HMC
    paper, Theorem 3.5) and privacy-loss parameter ``1 / (2 z^2)``. ``fns`` are the records'
    functions (`pymc_dp.records.build_record_functions`), ``M`` the public whitening.
    ``size``: that many independent releases (rows; the audit's trials).
    """
    exact, _ = fns.clipped_grad_moments(q, bound, transform)
    exact = np.asarray(exact, dtype=float)
    shape = exact.shape if size is None else (int(size), *exact.shape)
    return exact + rng.normal(size=shape) * noise_multiplier * 2.0 * bound


def newton_step(
    *,
    anchor: np.ndarray,
    released_grad: np.ndarray,
    prior_grad: np.ndarray,
    precision: np.ndarray,
    damping: np.ndarray | float,
    basis: np.ndarray,
    data: np.ndarray,
    noise_std: float,
    prior_precision_floor: float,
    curvature_entry_std: np.ndarray | None = None,
    curvature_basis: np.ndarray | None = None,
    max_move: np.ndarray | None = None,
) -> NewtonStep:
    """One Newton step with a released gradient, and the effect of its noise (post-processing).

    Parameters
    ----------
    anchor : array (d,)
        Where the gradient was released (a DP output).
    released_grad : array (d,)
        The released clipped gradient sum there, in whitened coordinates (noise added), zero
        on the coordinates the likelihood does not read.
    prior_grad : array (d,)
        Gradient of the log prior (+ log-Jacobian) at ``anchor`` (data-free).
    precision : array (d, d)
        The warm start's last released curvature, floored (``P``).
    damping : array (d, d) or float
        Its noise level's damping (`pymc_dp.kernels.warmstart.LaplaceInfo.damping`: two
        noise levels on the data block, about the spectral norm of the released
        curvature's noise); all of it is taken off ``P`` for ``P_c``. The release's
        eigenvalues were floored at one noise level, so where the data determine a
        direction less well than the noise does, ``P`` sits above the Hessian there by up
        to the noise's norm: ``P_c`` stays below it (measured: a logistic regression on
        9 822 real records at epsilon 1, eight coefficients, ``P`` 1.3-70 times the
        Hessian in seven of eight directions; with one level taken off, 5 of 8 posterior
        means beyond 2 of their sds, the worst 13.8; with both, none beyond 0.4).
    basis : array (d, d)
        ``L``: the release was of ``L^-1 g_i`` (public).
    data : array of bool (d,)
        The coordinates the likelihood reads (public).
    noise_std : float
        ``s = 2 b z``: the sd of the release's noise per coordinate.
    prior_precision_floor : float
        The smallest eigenvalue ``P_c`` may have (the prior's curvature, data-free).
    curvature_entry_std, curvature_basis : arrays (d, d), optional
        The error sd of each entry of the released curvature's data block and the whitening
        of its release (`pymc_dp.kernels.warmstart.LaplaceInfo.curvature_entry_std`): with
        them, the step's error from the curvature's (`curvature_step_cov`) is in
        ``curvature_cov``, and where entries were thresholded, ``cov_zeroed`` is ``P_c^-1``
        with their possible truth taken off as well (`zeroed_damping`).
    max_move : array (d,), optional
        The trust region (`trust_region`, data-free): the step is shortened as a whole so
        that no coordinate moves further; the part held back is ``cut``.
    """
    p = 0.5 * (precision + precision.T)
    cov_p = np.linalg.inv(p)
    with np.errstate(all="ignore"):
        full = cov_p @ (basis @ released_grad + prior_grad)
    step, cut = trust_region(full, max_move)
    damping = np.asarray(damping, dtype=float)
    cov_c = _floored_inverse(p - damping, prior_precision_floor)
    cov_z = zeroed_cov = None
    k = cov_p @ (basis * data[None, :].astype(float))
    curv = np.zeros_like(p)
    if curvature_entry_std is not None and curvature_basis is not None:
        curv = curvature_step_cov(step, cov_p, curvature_basis, curvature_entry_std)
        zeroed = zeroed_damping(curvature_entry_std, curvature_basis)
        if np.any(zeroed != 0.0):
            # the thresholded entries' own part of ``curv`` (`zeroed_step_widening`)
            entry_std = np.asarray(curvature_entry_std, dtype=float)
            only = np.where(zeroed_entries(entry_std), entry_std, 0.0)
            zeroed_cov = curvature_step_cov(step, cov_p, curvature_basis, only)
            # for the warning only (`NoiseAwareLaplace.zeroed_widening`). Taken off ``P_c``
            # as well (the result widened, not only flagged), it made every one-shot cell of
            # the sixth sweep that had a zeroed entry prior-wide: the switching regression
            # at epsilon 10, DP seed 1, right (0.65 NUTS sds, sds 1.46-1.73 times NUTS's),
            # came out 16 NUTS sds off with sds 14-50 times NUTS's, flagged
            cov_z = _floored_inverse(p - damping - zeroed, prior_precision_floor)
    return NewtonStep(
        anchor + step,
        step,
        noise_std**2 * (k @ k.T),
        cov_c,
        p,
        curv,
        cut=cut,
        cov_zeroed=cov_z,
        zeroed_cov=zeroed_cov,
    )


def _floored_inverse(pc: np.ndarray, floor: float) -> np.ndarray:
    """``pc^-1`` with its eigenvalues floored at ``floor`` (the prior's curvature) and, for
    conditioning, at 1e-12 of the largest *positive* eigenvalue: where the damping takes
    every direction below 0 the released curvature is noise only and ``pc`` is the floor.
    Before, 1e-12 of the largest in absolute value: a noise-only curvature of 1e28 (the warm
    start's floors fed back into its whitening, `pymc_dp.kernels.warmstart.curvature_cap`),
    all of it damped below 0, gave ``P_c`` 3.5e16 and a result with sds of 5e-9 (30 records
    at epsilon 0.05)."""
    w, v = np.linalg.eigh(0.5 * (pc + pc.T))
    w = np.maximum(w, max(floor, 1e-12 * float(np.max(w, initial=0.0))))
    return (v / w) @ v.T


#: Where an entry of the released curvature's error sd is more than this many times the
#: geometric mean of its row's and column's diagonal ones, the entry was thresholded to 0
#: (`pymc_dp.kernels.warmstart._Curvature`: its sd is ``thr / sqrt 3 >= sqrt 3`` times a kept
#: entry's, ``thr >= 3`` noise sds; kept entries and the diagonal have the noise's sd)
ZEROED_RATIO = 1.5


def zeroed_in_doubt(zeroed_widening: float, zeroed_step_widening: float = float("inf")) -> bool:
    """Whether the released curvature's thresholded entries put a one-shot result in doubt.

    Their possible truth would widen it beyond `CURVATURE_WIDENING_WARN` (``zeroed_widening``:
    the released curvature cannot bound how far the Hessian is below it), *and* their
    first-order error over the two steps widens the result beyond the same factor
    (``zeroed_step_widening``, `zeroed_step_widening`: the steps still moved far where the
    curvature may be wrong; where they landed, the error a wrong curvature causes is small
    beside the result's other parts). ``zeroed_step_widening`` left out: the first condition
    alone (before helper 240). A result already warned as noise-dominated by its curvature
    (``curvature_widening`` above the same factor) is not exempt (before the eighteenth
    session it was): the seventh sweep's Gamma GLM at epsilon 1, seeds 0 and 1, came out 2.38
    and 4.6 of its own sds off with only the noise-dominated warning ("wide, not off"), its
    step widening 5.16 and 4.27. DP outputs.
    """
    return (
        zeroed_widening > CURVATURE_WIDENING_WARN and zeroed_step_widening > CURVATURE_WIDENING_WARN
    )


def zeroed_entries(entry_std: np.ndarray) -> np.ndarray:
    """Which entries of the released curvature were thresholded to 0 (boolean ``(d, d)``):
    those whose error sd is more than `ZEROED_RATIO` times the geometric mean of their row's
    and column's diagonal ones (`pymc_dp.kernels.warmstart._Curvature`). Public given the
    released curvature's error sds."""
    t = np.asarray(entry_std, dtype=float)
    d = t.shape[0]
    diag = np.sqrt(np.abs(np.outer(np.diag(t), np.diag(t))))
    return ~np.eye(d, dtype=bool) & (t > ZEROED_RATIO * diag)


def zeroed_step_widening(first: NewtonStep, second: NewtonStep, weights, cov: np.ndarray) -> float:
    """How much the thresholded curvature entries' error over the two steps widens a one-shot
    result beyond its other parts, in its worst coordinate (post-processing of DP outputs).

    A Newton step ``s = P^-1 g`` with the released curvature ``P = H + B E B^T`` ends
    ``-H^-1 B E B^T s`` from where the Hessian ``H`` would take it: the error is the step
    times the curvature's error. `curvature_step_cov` counts it to first order (``P^-1``
    for ``H^-1``; ``NewtonStep.zeroed_cov`` is the thresholded entries' part, with their
    uniform sds), and the result's covariance holds it. How far ``H^-1`` can exceed
    ``P^-1`` the released curvature cannot say where ``zeroed_widening`` is large (their
    possible truth takes ``P`` to the floor). Where the steps still had far to go along the
    directions the zeroed entries couple, that first-order part is long (it grows with the
    step) and the result's width is mostly made of it: a Hessian a few times below ``P``
    then puts the mean beyond its intervals (measured: a log-linear regression at epsilon 1,
    the curvature 7.7 times the Hessian along one direction, this widening 4.24, the result
    4.67 own sds off). Where the steps landed (short beside the release noise), it is a
    small part and the result has room for it to be several times larger (the sixth and
    seventh sweeps' runs at epsilon 10 that the zeroed check flagged: 1.05-1.42, all within
    0.92 own sds). Returns ``max_j sqrt((R_jj + Z_jj) / R_jj)``, ``Z`` the thresholded
    entries' part of the result's covariance and ``R`` the covariance less its whole
    curvature part (the conservative curvature's inverse, the releases' noise, the
    widening along the steps). ``weights``: ``(w1, w2)``, the ends' weights in the result's
    mean, the parts bounded by ``2 (w1 Z1 w1^T + w2 Z2 w2^T)`` (the same curvature moves both
    ends) as `noise_aware_laplace` bounds the curvature's; ``None``: the result is the
    second end moved, ``2 (Z1 + Z2)``. 1 where no entry was thresholded.
    """
    z1, z2 = first.zeroed_cov, second.zeroed_cov
    if z1 is None or z2 is None:
        return 1.0

    def part(c1, c2):
        if weights is None:
            return np.diag(2.0 * (c1 + c2))
        w1, w2 = weights
        return np.diag(2.0 * (w1 @ c1 @ w1.T + w2 @ c2 @ w2.T))

    zeroed = part(z1, z2)
    rest = np.diag(cov) - part(first.curvature_cov, second.curvature_cov)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.sqrt((rest + zeroed) / rest)
    ratio = np.where(np.isfinite(ratio), ratio, np.inf)
    return float(np.max(ratio, initial=1.0))


def zeroed_damping(entry_std: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """The damping for the released curvature's thresholded entries' possible truth.

    The steps' curvature sets its off-diagonal entries below `offdiag_threshold_sds` noise
    sds to 0 (`pymc_dp.kernels.warmstart._Curvature`); their true values, anywhere within
    the threshold, are part of the curvature's error that the Levenberg-Marquardt damping
    (two noise levels of the *kept* entries) does not count. Where the data determine a
    direction less well than the noise does, entries of 2-3 noise sds carry the coupling
    that makes it so, and zeroed, the released curvature overstates the Hessian there
    (measured, a log-linear regression on 20 190 real records at epsilon 1: eleven
    coordinates, every off-diagonal entry zeroed, the released curvature 7.7 times the
    Hessian along the intercept plus one slope; each Newton step went a seventh of the way
    and the result was 4.7 of its own sds off, unwarned). Per row ``i`` of the whitened
    curvature, ``r_i = sqrt(sum_j T_ij^2)`` over its zeroed entries (``T`` their error sd
    ``entry_std``: uniform within the threshold); returns ``B diag(r) B^T`` (``B`` the
    release's whitening ``basis``), to be taken off ``P`` on top of its damping. Data-free
    given the released curvature's error sds (public constants and DP outputs).
    """
    t = np.asarray(entry_std, dtype=float)
    zeroed = zeroed_entries(t)
    r = np.sqrt(np.sum(np.where(zeroed, t * t, 0.0), axis=1))
    return basis @ np.diag(r) @ basis.T


def curvature_step_cov(
    step: np.ndarray, cov_p: np.ndarray, basis: np.ndarray, entry_std: np.ndarray
) -> np.ndarray:
    """The covariance of a Newton step's end from the error of the curvature it used.

    With ``P = P_true + B E B^T`` (``B`` the whitening of the curvature's release, ``E``
    symmetric with independent entries of sd ``entry_std``), the step ``P^-1 g`` ends, to
    first order, ``-P^-1 B E B^T s`` from where the true curvature would take it (``s``
    the step, ``g = P_true s`` at first order). With ``t = B^T s``, ``Cov(E t)`` is
    ``sum_j T_ij^2 t_j^2`` on the diagonal and ``T_ik^2 t_i t_k`` off it (``T`` the entry
    sds: ``E_ik`` reaches rows ``i`` and ``k``); whence ``P^-1 B Cov(E t) B^T P^-1``. The
    release's noise of the curvature is known; its effect grows with the step: a warm start
    that left its last iterate far from the mode, with a noisy curvature, ends off by the
    curvature's relative error times that distance. Measured: a logistic regression of
    wives' labour-force participation on 5 634 real records (seven covariates, two rare
    indicators) at epsilon 1, the curvature 0.45-4.4 times the Hessian, the first step
    18.8 posterior sds long: without this term the mean came out 2.9 of its own sds off.
    """
    t = basis.T @ np.asarray(step, dtype=float)
    t2 = np.asarray(entry_std, dtype=float) ** 2
    m = t2 * np.outer(t, t)
    m[np.diag_indices_from(m)] = t2 @ (t * t)
    k = cov_p @ basis
    out = k @ m @ k.T
    return 0.5 * (out + out.T)


def warm_start_drift(first: NewtonStep, path: np.ndarray | None) -> float:
    """Whether the first one-shot step continues the warm start's drift, in noise sds.

    ``t = a - mean(x_{-4}, x_{-3}, x_{-2})`` is how the warm start's last iterate ``a`` (the
    anchor of the first step) moved from the three before it (DP outputs); the statistic is
    the first step ``s1`` along ``P t`` over its release noise there: ``s1^T P t /
    sqrt(t^T P N1 P t)``. Where the warm start had converged its iterates are the mode plus
    noise, ``t`` is noise, and ``s1`` takes the anchor's noise back: the statistic is
    negative in expectation. Where the warm start was still crawling towards the mode (a
    curvature far above the Hessian along some direction, every step there a fraction of
    the distance left) ``s1`` goes on the same way: positive, beyond its noise. Then the
    second step's agreement with the first within their noise does not locate the mode:
    along the directions where the curvature overstates the Hessian both steps are short
    and their noise hides the rest (measured: a StudentT regression on 526 real wages at
    epsilon 10, the released curvature 15-19 times the Hessian at the anchor in two
    directions, the steps 1/16 of the distance there, the intercept 9.4 posterior sds off
    and 4.7 of its own sds, the check's chi-square 13.2 against 18.5). On the benchmarks'
    logistic and linear regressions (n = 20 000, epsilon 1, 3, 10, 3 DP seeds each) the
    statistic was -18.5 to -0.92; on the StudentT regression 6.51. Simulated with the
    curvature exact and a converged warm start whose iterates' noise is ten times the last
    releases', it passes 3 in 7.6 % of the runs with one coordinate, 1.5 % with three (a
    false alarm widens a result that was right, and flags it). ``nan`` without a path of at
    least `DRIFT_WINDOW` iterates. Post-processing of released values.
    """
    if path is None:
        return float("nan")
    path = np.asarray(path, dtype=float).reshape(-1, first.step.size)
    if len(path) < DRIFT_WINDOW:
        return float("nan")
    anchor = first.mean - first.step
    t = anchor - np.mean(path[-DRIFT_WINDOW:-1], axis=0)
    pt = first.precision @ t
    var = float(pt @ first.noise_cov @ pt)
    if not (np.isfinite(var) and var > 0):
        return float("nan")
    return float(first.step @ pt) / float(np.sqrt(var))


def noise_aware_laplace(
    first: NewtonStep,
    second: NewtonStep,
    data: np.ndarray,
    path: np.ndarray | None = None,
    prior_cov: np.ndarray | None = None,
    max_move: np.ndarray | None = None,
) -> NoiseAwareLaplace:
    """Combine two Newton steps, the second from where the first ended (module docstring).

    Where the log-likelihood is quadratic between them (and the curvature exact), both ends
    are the mode plus their own release's noise, independent: their difference is
    ``N(0, N1 + N2)`` and their inverse-variance combination carries the noise of one
    release with both budgets. With a noisy released curvature each end is also off by the
    curvature's error over its own step (``C_j``, `curvature_step_cov`), to first order
    independently of the other end's: the check of their agreement is on the chi-square
    scale of ``N1 + C1 + N2 + C2``. Where the difference is beyond that (its chi-square
    past the 0.99 quantile) but the first step is within its own noise (the anchor at the
    mode as far as the last releases can tell), the combination stands, widened by the
    difference and the first step. Where the first step is beyond its noise as well, the
    warm start had not converged: the mean is the second end
    moved by Aitken's extrapolation of the steps (below), and the covariance is widened
    along the second step by its length over ``1 - r`` (the rest of a series of steps
    contracting by ``r``, the ratio of the second step's length to the first's; ten times
    the step when they do not contract) and along the first step by its length (how far
    from the mode the warm start had left the anchor), and by as much on every coordinate
    alone: honestly wide rather than confidently wrong.

    ``path`` (optional, ``(k, d)``): the warm start's iterates from its public start (DP
    outputs). Where the steps do not contract (``r >= 0.9``), the series gives no bound on
    the distance left to the mode: far from it the clipped gradients' curvature can be far
    above the Hessian's, the steps tiny and the released curvature large (measured: a
    Poisson regression at epsilon 1, 2 725 records, came out 343 NUTS sds off on one
    coefficient, 14 of its own sds). The result is then widened by each iterate's distance
    from the mean as well: the warm start has only located the mode to within where it has
    been. Where they contract, by the spread of the last four iterates (the Polyak window of
    `pymc_dp.kernels.warmstart.private_laplace`): its noise.

    The steps' contraction ``a`` (the signed ratio above, ``1 - a`` the secant ratio
    ``s^T H s / s^T P s`` of `pymc_dp.kernels.warmstart.secant_ratio`) is itself noisy:
    its upper bound at two noise sds, ``a+``, bounds the rest of the series by ``|m2 - m1|
    a+ / (1 - a+)``, which widens the result where it is longer than the above. Where
    ``a+ >= 1`` the releases cannot tell the warm start from one that crawls: a curvature
    far above the Hessian makes every step tiny, the path short and the distance left
    unbounded (measured: a Gamma GLM with a log link on 9 275 real incomes, the empirical
    Fisher information 1e2-3e5 times the Hessian at the warm start's start, the anchor 125
    posterior sds off after ten steps, the result 57 of its own sds off). ``prior_cov``
    (data-free: the inverse of the prior's curvature at the mean) is then added: the
    releases have not located the mode, and the result says so.

    ``max_move`` (optional, the trust region of the steps, `trust_region`): the
    extrapolation moves no coordinate further than that. What the trust region held back, of
    either step or of the extrapolation, is doubt (the mode may lie where the cut step
    pointed): the covariance is widened along it as along the steps, and a cut first step
    counts as a warm start that had not converged.

    Where the first step is beyond its noise and goes on the way the warm start's last
    iterates went (`warm_start_drift` beyond `DRIFT_Z`), the warm start was crawling: the
    steps' agreement within their noise does not locate the mode (the curvature may
    overstate the Hessian along directions the steps hardly move in). The result is then
    treated as not converged, and widened by the whole path as where the steps do not
    contract.
    """
    n1, n2 = first.noise_cov, second.noise_cov
    c1, c2 = first.curvature_cov, second.curvature_cov
    # each end's error: its release's noise and the released curvature's error over its
    # step (`curvature_step_cov`); to first order in the curvature's error the two are
    # uncorrelated (``m1 - mode = P^-1 (D s1 + e1)``, ``m2 - mode = P^-1 (D (m1 - mode) +
    # e2)``: their cross moment is odd in ``D`` or holds ``E[e1] = 0``). The check of the
    # ends' agreement counts both: with the release noise alone, ends a noisy curvature set
    # apart read as a warm start that had not converged (measured: bench_auto's Poisson
    # GLMM at epsilon 3, 3 of 5 DP seeds flagged, chi-square 33-45 against a 0.99 quantile of
    # 24.7, 9-15 with the curvature's error; the widening then put the group effects' sds 3-9 times
    # NUTS's and ``z = a / sd`` up to 1.66 NUTS sds off through the widened scale)
    v1, v2 = n1 + c1, n2 + c2
    diff = second.mean - first.mean
    joint = np.linalg.pinv(v1 + v2, hermitian=True)
    k = max(int(np.count_nonzero(data)), 1)
    chi2 = float(diff @ joint @ diff)
    limit = float(scipy.stats.chi2.ppf(0.99, k))
    p = first.precision
    r = float(np.sqrt((diff @ p @ diff) / max(float(first.step @ p @ first.step), 1e-300)))
    doubt = np.zeros((2, diff.size))
    unbounded = False
    # the first step on the chi-square scale of its own release's noise: within it, the
    # anchor was at the mode as far as the last releases can tell
    cuts = [c for c in (first.cut, second.cut) if c is not None and np.any(c != 0.0)]
    moving = bool(cuts) or (
        float(first.step @ np.linalg.pinv(n1, hermitian=True) @ first.step) > limit
    )
    # the first step beyond its noise and going on the way the warm start went: a crawl,
    # whose end the two steps' agreement does not locate (`warm_start_drift`)
    drift = warm_start_drift(first, path)
    crawling = moving and drift > DRIFT_Z
    # the steps' contraction ``a`` (the signed ratio of the second step to the first along
    # the first, in the ``P`` metric) and its noise sd: the noise of ``diff`` (both
    # releases) along the first step
    ps1 = p @ first.step
    s1_len = max(float(first.step @ ps1), 1e-300)
    a = float(diff @ ps1) / s1_len
    a_sd = float(np.sqrt(max(ps1 @ (n1 + n2) @ ps1, 0.0))) / s1_len
    a_hi = a + CONTRACTION_UPPER_SDS * a_sd
    # a contraction the releases cannot tell from 0 (a Newton step that reached the mode)
    # nor from 1 (a crawl): no series of steps is established to extrapolate, and nothing
    # established says the steps crawl (the drift test did not find it): the ends
    # disagree, and their disagreement and the first step are the doubt, as for ends that
    # disagree at the mode. Measured (bench_auto's logistic3, epsilon 1, DP seed 2): ends
    # 1.1-2.4 NUTS sds apart, a = 0.64 +- 0.35, drift 1.5 sds; read as a possible crawl,
    # Aitken's extrapolation put b[1] 5.7 NUTS sds off and the prior's covariance made the
    # result the prior (31-61 NUTS sds off, sds 300-345 times NUTS's)
    undetermined = a - CONTRACTION_UPPER_SDS * a_sd <= 0.0 and a_hi >= 1.0 and not cuts
    weights = None  # the ends' weights in the mean (`zeroed_step_widening`; None: the second end's)
    if (chi2 <= limit or not moving or undetermined) and not crawling:
        # the combination by the release noise (weighting by the whole errors ``V_j``
        # instead was measured: bench_auto's GLMM at epsilon 3 median 1.05 -> 0.74, but its
        # hierarchical model's 0.27 -> 0.47 in sigma, 5 DP seeds: not kept)
        nj = np.linalg.pinv(n1 + n2, hermitian=True)
        mean = first.mean + n1 @ nj @ diff
        w2 = n1 @ nj
        w1 = np.eye(diff.size) - w2
        weights = (w1, w2)
        # the curvature's error moves both ends (correlated: the same curvature); the
        # combination's covariance from it is bounded by twice the sum of the parts'
        noise = n1 - n1 @ nj @ n1 + 2.0 * (w1 @ c1 @ w1.T + w2 @ c2 @ w2.T)
        if chi2 > limit:
            # the ends disagree beyond their noise though the anchor was at the mode
            # within it (no series of steps to extrapolate: their ratio ``r`` is a ratio
            # of noises): the disagreement itself is the doubt. Measured (logistic3 of
            # bench_auto, epsilon 10, DP seed 19): the first step 0.26 posterior sds,
            # chi-square 11.7 against 11.3; extrapolated and widened by the whole path as a
            # far-off anchor would be, the sds came out 25-90 times NUTS's and the mean 1.37
            # NUTS sds off, where both ends were within 0.26 of the mode
            doubt[0], doubt[1] = diff, first.step
    else:
        # Aitken's extrapolation of the series of steps along the last one: where the Newton
        # map is linear with a scalar rate ``a`` (a curvature ``P`` off the Hessian by a
        # constant factor: ``a = 1 - H / P``, negative where ``P`` understates it and the
        # steps overshoot), its fixed point is ``m2 + a / (1 - a) (m2 - m1)``; ``a`` is the
        # signed ratio of the steps in the ``P`` metric, kept in [-3, 0.75] (at most three
        # times the last step; measured on a linear regression's real data, gpa2 at epsilon
        # 10: 3-485 NUTS sds off before, 2.2-80 after). The widening below covers the rest.
        # (``a``, its upper bound ``a_hi`` above)
        a = min(max(a, -3.0), 0.75)
        jump, cut = trust_region(a / (1.0 - a) * diff, max_move)
        if np.any(cut != 0.0):
            cuts.append(cut)
        mean, noise = second.mean + jump, n2 + 2.0 * (c1 + c2)
        # the rest of the series of steps, and the first step itself: how far from the
        # mode the warm start had left the anchor (its ratio r is itself a noisy estimate)
        doubt[0] = diff / (1.0 - r) if r < 0.9 else 10.0 * diff
        doubt[1] = first.step
        if a_hi < 1.0:
            rest = diff * max(a_hi, 0.0) / (1.0 - a_hi)
            if float(rest @ p @ rest) > float(doubt[0] @ p @ doubt[0]):
                doubt[0] = rest
        else:
            unbounded = True
        if path is not None and len(path):
            path = np.asarray(path, dtype=float).reshape(-1, diff.size)
            # a crawl's steps do not contract along the directions it crawls: as where
            # they do not contract at all, the whole path
            where = path if r >= 0.9 or crawling else path[-4:]
            doubt = np.vstack([doubt, where - mean])
    if cuts:  # where the trust region held a step back, the mode may lie along the rest
        doubt = np.vstack([doubt, *cuts])
    noise = 0.5 * (noise + noise.T)
    # the doubt along the steps, and as much on every coordinate alone: the error of an
    # unconverged warm start need not lie along the steps (measured: a linear regression's
    # log sigma off while the steps moved the coefficients)
    cov = second.cov_c + noise + doubt.T @ doubt + np.diag(np.sum(doubt * doubt, axis=0))
    if unbounded and prior_cov is not None:
        cov = cov + np.asarray(prior_cov, dtype=float)
    err = float(np.max(np.sqrt(np.diag(noise) / np.diag(second.cov_c))))
    released = np.diag(np.linalg.pinv(second.precision, hermitian=True))
    with np.errstate(divide="ignore", invalid="ignore"):
        widening = np.sqrt(np.diag(second.cov_c) / released)
    widening = float(np.max(np.where(np.isfinite(widening), widening, np.inf)))
    zeroed = widening
    if second.cov_zeroed is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.sqrt(np.diag(second.cov_zeroed) / released)
        zeroed = max(widening, float(np.max(np.where(np.isfinite(z), z, np.inf))))
    cov = 0.5 * (cov + cov.T)
    return NoiseAwareLaplace(
        mean,
        cov,
        noise,
        err,
        chi2,
        bool(chi2 <= limit) and not cuts and not crawling,
        r,
        widening,
        bool(cuts),
        drift,
        crawling,
        zeroed_widening=zeroed,
        zeroed_step_widening=zeroed_step_widening(first, second, weights, cov),
    )
