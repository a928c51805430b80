r"""DPExpFamilyPenalty: the penalty algorithm with noisy sufficient statistics.

References
----------
.. [1] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves:
   revisiting the penalty algorithm in a data privacy framework. Statistics and Computing
   29(5), 947-963. doi:10.1007/s11222-018-9847-x. Preprint: arXiv:1604.07177 ("On the use
   of penalty MCMC for differential privacy"), Sec. 3.3, eqs. (7)-(8), Algorithm 3,
   Corollary 1.
.. [2] Sommer, Meiser, Mohammadi (2019). Privacy loss classes: the central limit theorem in
   differential privacy. PoPETS (Lemma 12: composition of Gaussian mechanisms).
.. [3] Deligiannidis, G., Doucet, A. and Pitt, M. K. (2018). The correlated pseudo-marginal
   method. Journal of the Royal Statistical Society B 80(5), 839-870 (`CorrelatedNoise`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pymc as pm

from pymc_dp import callscope
from pymc_dp.accounting import GaussianEvent, calibrate_noise_multiplier
from pymc_dp.kernels.expfam import (
    correlated_log_acceptance,
    correlated_noise_schedule,
    correlated_release,
    expfam_log_acceptance,
    expfam_noise_std,
    private_centre,
    private_whitening,
    quadratic_fit,
)
from pymc_dp.kernels.penalty import accept
from pymc_dp.records.expfam import ExpFamilyModel, find_expfam_structure
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    WALK_STATS,
    DPStep,
    ScaleAdaptation,
    check_positive,
    check_target,
    make_plan,
    n_records_of,
    scalar_stats,
)
from pymc_dp.step_methods.parts import LikelihoodSettings, PrivacySettings, resolve_parts
from pymc_dp.step_methods.proposals import (
    WALK_KEYWORDS,
    CoordinateWalk,
    RandomWalk,
    walk_from_keywords,
    walk_parts,
)

__all__ = ["CorrelatedNoise", "DPExpFamilyPenalty", "StatCentre"]

_PROPOSALS = ("gaussian", "coordinate", "guided")
_TARGET_ACCEPT = {"gaussian": 0.234, "coordinate": 0.44, "guided": 0.44}
_CENTRES = ("private", "data_bounds")


@dataclass(frozen=True)
class StatCentre:
    r"""How `DPExpFamilyPenalty` centres and clips the sufficient statistics.

    The step releases $S_c = \sum_i \mathrm{clip}_b(T(x_i) - c) + n c$ (``n`` is public
    under replace-one neighbours) instead of $\sum_i \mathrm{clip}_C(T(x_i))$: the
    sensitivity is ``2 b`` whatever the public centre ``c``, so the noise follows the spread
    of the statistics around ``c`` instead of their magnitude (for a linear regression
    with ``y`` in ``[-10, 10]`` the magnitude bound ``C`` is about 102, from ``y^2``; the
    deviations are of the order of the data's scale). With ``b`` above every deviation
    $S_c = \sum_i T(x_i)$ exactly and the chain targets the exact posterior (Yildirim &
    Ermis, Sec. 3.3, eq. 7, Algorithm 3: the test only needs an unbiased Gaussian release of
    the statistic of eq. 7).

    Parameters
    ----------
    value : {"private", "data_bounds"} or array
        The centre ``c``. ``"private"`` (default): a DP estimate of the mean statistic, one
        Gaussian release of $\sum_i \mathrm{clip}_C(T(x_i))$ with ``C`` the magnitude
        bound from ``data_bounds`` (or ``stat_clip_bound``, or the support) divided by the
        public ``n`` (`pymc_dp.kernels.expfam.private_centre`). ``"data_bounds"``: the
        statistic of the midpoint of the public box (no privacy cost; far from the data's
        mean when the box is wide). An array of length ``len(T)``: a public centre (from
        knowledge of the data source, never from the data).
    clip : float, optional
        ``b`` given directly (public; no whitening). Default: five releases choose the
        whitening ``W`` and ``b``: a DP quantile ``b1`` of ``||T(x_i) - c||`` (a noisy
        histogram on a public log grid up to the largest deviation the box allows,
        `pymc_dp.kernels.warmstart.noisy_histogram_quantile`), the DP mean absolute
        deviation per coordinate (clipped to ``b1``; its inverse ``w`` whitens the
        coordinates), a DP quantile ``b2`` of ``||w (T(x_i) - c)||``, the DP second moment
        of the clipped ``w (T(x_i) - c)`` (``W`` is its inverse square root, eigenvalues
        floored at its noise, times ``diag(w)``), and ``b``, the DP quantile of
        ``||W (T(x_i) - c)||``.
    quantile : float
        Share of records whose deviation the DP clips leave unclipped (default 0.999;
        0.99 and 0.995 biased the noise scale of a linear regression by 2 and 1.3 posterior
        sds at n = 1e5).
    budget_share : float
        With a target ``epsilon``: the share of the run's privacy-loss parameter ``mu`` the
        releases before the chains are charged (default 0.05), split equally among them.
    noise_multiplier : float, optional
        With ``noise_multiplier`` given to the step instead of a target: the noise
        multiplier of each of those releases (default: the step's).
    metric : bool
        Move in the metric of the natural parameters (default True): the proposal
        covariance is the inverse curvature, at its mode, of
        ``n (eta(theta)^T c' - A(theta)) + log p(theta)`` (the Fisher information of the
        family at the centre plus the prior's curvature; data-free given ``c'``,
        `pymc_dp.kernels.expfam.quadratic_fit`), and every chain starts from a draw of the
        Gaussian with that mode and covariance. ``c'`` is ``c`` refined by one more release,
        ``c + W^-1 (S_W + noise) / n`` at the clip ``b``, when any release is made before the
        chains (not with ``"data_bounds"``).

    Notes
    -----
    **Accounting.** The centre and the quantile are released once, at construction. The
    step charges their privacy-loss parameter to every chain, spread over the chain's planned
    iterations (each draw's ``dp_mu`` includes it, stat ``centre_mu``): a run of ``k``
    chains is charged ``k`` times the releases' ``mu`` (an over-count for more than one
    chain, never an under-count: a chain cut short leaves the report unverified). A centre
    or clip that needs a release therefore needs the planned run (``draws``, ``tune``,
    ``chains``).
    """

    value: Any = "private"
    clip: float | None = None
    quantile: float = 0.999
    budget_share: float = 0.05
    noise_multiplier: float | None = None
    metric: bool = True

    def __post_init__(self) -> None:
        v = self.value
        if isinstance(v, str):
            if v not in _CENTRES:
                raise ValueError(f"centre must be one of {_CENTRES} or an array; got {v!r}")
        else:
            try:
                a = np.asarray(v, dtype=float)
            except (TypeError, ValueError):
                raise ValueError(
                    f"centre must be one of {_CENTRES} or an array of numbers; got {v!r}"
                ) from None
            if a.ndim != 1 or not np.all(np.isfinite(a)):
                raise ValueError("centre must be a finite 1-d array of the length of T(x_i)")
            object.__setattr__(self, "value", a)
        if self.clip is not None and not (np.isfinite(self.clip) and self.clip > 0):
            raise ValueError(f"StatCentre clip must be a finite number > 0; got {self.clip!r}")
        if not 0.0 < float(self.quantile) < 1.0:
            raise ValueError(f"StatCentre quantile must be in (0, 1); got {self.quantile!r}")
        if not 0.0 < float(self.budget_share) <= 0.5:
            raise ValueError(
                f"StatCentre budget_share must be in (0, 0.5]; got {self.budget_share!r}"
            )
        z = self.noise_multiplier
        if z is not None and not (np.isfinite(z) and z > 0):
            raise ValueError(f"StatCentre noise_multiplier must be > 0; got {z!r}")

    @property
    def is_private(self) -> bool:
        """Whether the centre is a DP release."""
        return isinstance(self.value, str) and self.value == "private"

    @property
    def releases(self) -> int:
        """Gaussian releases made at construction: the centre (private), the two quantiles
        and the spread (DP clip), the refined centre of the metric (when any other is made)."""
        k = int(self.is_private) + 5 * int(self.clip is None)
        return k + int(self.metric and k > 0)


@dataclass(frozen=True)
class CorrelatedNoise:
    r"""Correlated releases of the statistic: a pseudo-marginal test instead of the penalty.

    The penalty test (Yildirim & Ermis, Algorithm 3) releases ``S`` afresh at every
    iteration, and its noise on the log ratio, $z\,2b\,\|W^{-T}\Delta\eta\|$, grows with
    the step: at a fixed budget the noise multiplier ``z`` grows as the square root of the
    run's length, so the steps a chain can afford shrink with it and its effective sample
    size is set by the budget, not by ``draws`` (at n = 1e5, epsilon 10: a bulk ESS of
    13-50 over 4 chains of 5500 iterations, R-hat 1.23). This scheme spends the same
    budget per chain on one release $Y_0 = S + \sigma u_0$ and then, at every iteration,
    one release $Y' = S + \sigma u'$ whose noise moves by a Crank-Nicolson step,
    $u' = r u + \sqrt{1 - r^2}\,\xi$ (`pymc_dp.kernels.expfam.correlated_release`).
    With $\psi(\theta) = W^{-T}(\eta(\theta) - \eta_0)$ ($\eta_0$ public: the natural
    parameter at the mode of the metric), $\hat L(\theta, Y) =
    \exp(\psi^\top Y - \sigma^2\|\psi\|^2/2)$ is an unbiased estimator of
    $\exp(\psi^\top S)$ over $u \sim N(0, I)$, and each iteration is a Metropolis-within-Gibbs
    sweep of the chain on $(\theta, u)$ whose $\theta$-marginal is the exact posterior (with
    clipping inactive), whatever ``sigma`` and ``r`` (the correlated pseudo-marginal method,
    Deligiannidis, Doucet & Pitt 2018, JRSS B 80(5)):

    1. the noise move: the new release ``Y'`` is kept with probability
       $\min(1, \exp(\psi(\theta)^\top (Y' - Y)))$ (the Crank-Nicolson proposal is
       reversible for $N(0, I)$);
    2. ``theta_steps`` random-walk moves of $\theta$ given the kept ``Y``
       (post-processing), each accepted if

       $$
       \log u < \psi'^\top Y - \psi^\top Y - \tfrac12\sigma^2(\|\psi'\|^2 - \|\psi\|^2)
       - n\Delta A + n\Delta\eta^\top c + \log\frac{p(\theta')}{p(\theta)}
       $$

       (`pymc_dp.kernels.expfam.correlated_log_acceptance`).

    **Privacy.** Given the release of the current state (public), each later release is a
    Gaussian mechanism on ``S`` with sensitivity ``(1 - r) 2b`` and noise
    ``sigma sqrt(1 - r^2)``: ``mu_t = mu_0 (1 - r) / (1 + r)`` with ``mu_0 = 2 b^2 /
    sigma^2`` the first release's. ``sigma`` and ``r`` are set so that one release plus one
    per planned iteration spend exactly what the penalty test would over the chain,
    ``iterations / (2 z^2)`` (`pymc_dp.kernels.expfam.correlated_noise_schedule`): the run's
    calibration, its per-draw ``dp_mu`` (the chain's spend spread evenly over its planned
    iterations, like the centre's) and its report are those of the penalty test.

    Parameters
    ----------
    refreshes : float
        ``K``, the number of times per chain the noise ``u`` is renewed (its autocorrelation
        time is about ``iterations / K`` iterations), at most. Larger: ``sigma`` grows as
        ``sqrt(1 + K)`` and the noise move's log ratio, about
        ``sigma sqrt(2 K / iterations) |psi|``, with it (fewer of its moves are accepted);
        smaller: the chain sees fewer independent noises and its draws carry more of one
        release's error. Default 20.
    noise_target : float, optional
        With the metric of the natural parameters (`StatCentre`, ``metric=True``), ``K`` is
        lowered (not below 1) until the predicted std of the noise move's log ratio, over
        the metric's Gaussian, is at most this (default 0.7; data-free given the releases
        before the chains). None: ``K = refreshes``.
    theta_steps : int
        Moves of ``theta`` per iteration, given the current release (post-processing;
        default 5).
    """

    refreshes: float = 20.0
    noise_target: float | None = 0.7
    theta_steps: int = 5

    def __post_init__(self) -> None:
        t = self.theta_steps
        if not (isinstance(t, (int, np.integer)) and t >= 1):
            raise ValueError(f"CorrelatedNoise theta_steps must be an integer >= 1; got {t!r}")
        k = self.refreshes
        if not (isinstance(k, (int, float, np.integer, np.floating)) and np.isfinite(k) and k > 0):
            raise ValueError(f"CorrelatedNoise refreshes must be a number > 0; got {k!r}")
        v = self.noise_target
        if v is not None and not (np.isfinite(v) and v > 0):
            raise ValueError(f"CorrelatedNoise noise_target must be > 0 or None; got {v!r}")


class DPExpFamilyPenalty(ScaleAdaptation, DPStep):
    r"""Differentially private penalty MCMC for exponential-family likelihoods, O(1) in n.

    When $\log p(x_i|\theta) = \eta(\theta)^\top T(x_i) - A(\theta) + h(x_i)$, the
    log-likelihood ratio depends on the data only through $S = \sum_i T(x_i)$
    (Yildirim & Ermis, Sec. 3.3, eq. 7). $S$ is computed once, in one chunked pass over
    the records, with every $T(x_i)$ clipped to L2 norm $C$; each iteration then
    releases a fresh $\tilde S = S + N(0, \sigma_S^2 I)$, $\sigma_S = z\,2C$, and
    accepts the random-walk proposal $\theta'$ if

    $$
    \log u < (\eta(\theta') - \eta(\theta))^\top \tilde S
    - n (A(\theta') - A(\theta)) + \log\frac{p(\theta')}{p(\theta)}
    - \tfrac12 \sigma_S^2 \|\eta(\theta') - \eta(\theta)\|^2
    $$

    (Algorithm 3; the last term is half the noise variance of eq. 8, the penalty correction).
    The cost of an iteration does not depend on ``n``.

    **Centred statistics** (`StatCentre`; the default with a target ``epsilon``). The clip
    ``C`` on $\|T(x_i)\|$ follows the magnitude of the statistics (about 102 for a
    regression with ``y`` in ``[-10, 10]``, from $y^2$), and the test's noise with it. With
    ``centre=`` the step releases instead
    $S = W^{-1}\sum_i \mathrm{clip}_b(W(T(x_i) - c)) + n c$: ``c`` a public or DP centre,
    ``W`` a whitening (the inverse square root of a DP estimate of the deviations' second
    moment) and ``b`` a DP quantile of the whitened deviations $\|W(T(x_i) - c)\|$, so that
    the noise follows the spread of the data around ``c``. Its replace-one sensitivity in
    the whitened coordinates is ``2 b`` (``n`` is public), each release adds
    $N(0, \sigma_S^2 I)$ there, $\sigma_S = z\,2b$, and the test above holds with
    $\Delta\eta^\top \tilde S = (W^{-T}\Delta\eta)^\top(S_W + \zeta) + n\Delta\eta^\top c$
    (noise variance $\sigma_S^2\|W^{-T}\Delta\eta\|^2$). With ``b`` above every deviation
    $S = \sum_i T(x_i)$ exactly and the chain targets the exact posterior. The random walk
    moves in the metric of the natural parameters at the centre (the proposal covariance is
    the inverse curvature of $n(\eta(\theta)^\top c - A(\theta)) + \log p(\theta)$,
    data-free given ``c``), and every chain starts from a draw of that Gaussian.

    **Privacy.** Under replace-one neighbours $S$ has L2 sensitivity $2C$, so one
    release is a Gaussian mechanism with $\mu = (2C)^2 / (2\sigma_S^2) = 1/(2z^2)$;
    a run of $k$ iterations over all chains composes to $\mu = k/(2z^2)$
    (Corollary 1 with the tight Gaussian composition). The prior ratio and
    $\eta, A$ are data-free.

    **Exactness.** With clipping inactive (every record inside the public bounds, so
    $\|T(x_i)\| \le C$) the chain targets the exact posterior. Records whose
    $T(x_i)$ is clipped are down-weighted: the chain then targets the posterior of the
    clipped statistics.

    The likelihood's form is found from the PyMC model (see
    `pymc_dp.records.expfam.SUPPORTED_FORMS`): a Normal likelihood whose mean is affine in
    covariates (with a scale that may be unknown), or, without covariates, Normal, Bernoulli,
    Binomial (known trials), Poisson, Exponential, Gamma (known shape), Categorical, MvNormal
    (known covariance). Other models are refused with
    `ModelNotSupportedError`.

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``data_bounds`` (dict, optional): Public bounds of one record, ``{"y": (lo, hi), "X": (lo,
          hi)}`` (``"y"`` or the observed variable's name; ``"X"`` or a covariate's ``pm.Data``
          name; bounds may be arrays matching a row). The clip bound ``C`` on ``||T(x_i)||`` is
          derived from this box (no privacy cost). Bernoulli, Binomial and Categorical need no box.
        - ``clip_bound`` (float, optional): ``C`` given directly (instead of ``data_bounds``).
        - ``noise_multiplier`` (float, optional): ``z`` (noise std over sensitivity). Give either
          this or ``epsilon``/``delta`` with the planned ``draws``, ``tune`` and ``chains``.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included).
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run; a chain may not run
          longer (it stops before reading the data again).
        - ``nonprivate_diagnostics`` (bool): Also emit ``clip_fraction_NONPRIVATE``, the fraction of
          records whose ``T(x_i)`` was clipped, computed WITHOUT noise. Not differentially private.
    centre : StatCentre, {"private", "data_bounds"} or array, optional
        Centre and clip the statistics (`StatCentre`; a string or array is
        ``StatCentre(value)``). Default: ``StatCentre()`` (private centre, DP whitening and
        clip quantile, charged ``budget_share = 0.05`` of the run's ``mu``) when ``epsilon``
        is given and ``stat_clip_bound`` is not; otherwise the uncentred clip at ``C``.
    noise : CorrelatedNoise or "fresh", optional
        How the statistic is released at each iteration. `CorrelatedNoise` (the default with
        ``epsilon``; needs ``draws``, ``tune``, ``chains``): one release per chain whose noise
        then moves by Crank-Nicolson steps, one release each, with ``theta`` moved given the
        current release (a correlated pseudo-marginal chain, exact, same privacy charge per
        chain as the penalty test). ``"fresh"`` (the default with ``noise_multiplier``): the
        penalty test above, a fresh release per iteration (`log_acceptance` is always this
        test).
    proposal : RandomWalk, CoordinateWalk or GuidedWalk, optional
        The random walk (`pymc_dp.RandomWalk`, the default; `pymc_dp.CoordinateWalk`, one
        coordinate at a time; `pymc_dp.GuidedWalk`, direction flipped after a rejection),
        its fields:

        - ``scale`` (float or array): Per-coordinate proposal std (transformed space).
        - ``scaling`` (float): Initial global scale, adapted during warmup from the DP accept
          decisions.
        - ``target_accept`` (float, optional): Target acceptance rate of the warmup adaptation.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``chunk_size`` (int, optional): Records per chunk of the pass that computes ``S`` (default
          100 000).
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory), keyed by the names of the observed variable and
          the covariate ``pm.Data`` containers: each partition computes its clipped statistic sum
          where it lives, and only the sums reach the driver (their sum is ``S``; the partitions are
          the chunks).
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``, and the walk's
        (``proposal_scale``, ``scaling``, ``target_accept``): deprecated,
        kept for the 0.1 releases (docs/api.md).
    """

    name = "dp_expfam_penalty"
    remote_records = True
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **WALK_STATS,
        # the part of dp_mu charged for the releases of the centre and of the clip quantile
        # (StatCentre; data-free)
        **scalar_stats("centre_mu", "clip_fraction" + NONPRIVATE_SUFFIX),
    }

    _privacy_keywords = {
        "stat_clip_bound": ("clip_bound", None),
        "data_bounds": ("data_bounds", None),
        "noise_multiplier": ("noise_multiplier", None),
    }

    _parts_from_keywords = staticmethod(partial(walk_parts, kinds=_PROPOSALS))

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        centre: StatCentre | str | np.ndarray | None = None,
        noise: CorrelatedNoise | str | None = None,
        proposal: RandomWalk | CoordinateWalk | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        # Validate everything before the data is touched.
        privacy, likelihood, old = resolve_parts(
            type(self), privacy, likelihood, deprecated, extra=WALK_KEYWORDS
        )
        walk = walk_from_keywords(type(self).__name__, proposal, old, _PROPOSALS)
        proposal, proposal_scale, scaling = walk.kind, walk.scale, walk.scaling
        target_accept = walk.target_accept
        epsilon, delta, noise_multiplier = privacy.epsilon, privacy.delta, privacy.noise_multiplier
        stat_clip_bound, data_bounds = privacy.clip_bound, privacy.data_bounds
        if likelihood.tempering != 1.0:
            raise ValueError(
                "DPExpFamilyPenalty does not temper the likelihood (LikelihoodSettings "
                f"tempering must be 1); got {likelihood.tempering!r}"
            )
        self.proposal, self._kind = walk, proposal
        self.scaling = check_positive("scaling", scaling)
        self.target_accept = (
            _TARGET_ACCEPT[proposal] if target_accept is None else float(target_accept)
        )
        if not 0 < self.target_accept < 1:
            raise ValueError(f"target_accept must be in (0, 1); got {target_accept!r}")
        if stat_clip_bound is not None and data_bounds is not None:
            raise ValueError(
                "give data_bounds (C is derived from them) or stat_clip_bound, not both"
            )
        if stat_clip_bound is not None:
            stat_clip_bound = check_positive("stat_clip_bound", stat_clip_bound)
        if data_bounds is not None and not isinstance(data_bounds, Mapping):
            raise ValueError('data_bounds must be a dict like {"y": (lo, hi), "X": (lo, hi)}')
        if likelihood.chunk_size is not None:
            chunk_size = check_positive("chunk_size", likelihood.chunk_size, integer=True)
            likelihood = replace(likelihood, chunk_size=chunk_size)
        if (noise_multiplier is None) == (epsilon is None):
            raise ValueError(
                "give exactly one of noise_multiplier or epsilon (with delta, draws, tune, "
                "chains): the noise is set either directly or by a target for a planned run"
            )
        if centre is None or isinstance(centre, StatCentre):
            centring = centre
        else:
            centring = StatCentre(centre)
        if centring is None and stat_clip_bound is None and epsilon is not None:
            centring = StatCentre()  # a target run: private centre, DP clip of the deviations
        plan = make_plan(*privacy.plan(), epsilon=epsilon)
        if noise is None:
            noise = CorrelatedNoise() if epsilon is not None else "fresh"
        if isinstance(noise, str) and noise == "fresh":
            noise = None
        elif not isinstance(noise, CorrelatedNoise):
            raise ValueError(f"noise must be 'fresh' or a CorrelatedNoise; got {noise!r}")
        if noise is not None and plan is None:
            raise ValueError(
                "noise=CorrelatedNoise(): the releases are calibrated to the chain's planned "
                "iterations; give draws, tune and chains (pymc_dp.sample passes them), or "
                "noise='fresh'"
            )
        pre = centring is not None and centring.releases > 0
        if pre and plan is None:
            raise ValueError(
                "centre: a private centre or a DP clip of the deviations is released once and "
                "charged to every chain over its planned iterations; give draws, tune and "
                "chains (pymc_dp.sample passes them), or a public centre with "
                "StatCentre(value=array, clip=b)"
            )
        pre_mu = 0.0
        if epsilon is not None:
            epsilon, delta = check_target(epsilon, delta)
            z = calibrate_noise_multiplier(epsilon, delta, plan.iterations)
            if pre:
                # the releases before the chains take budget_share of the run's mu (charged
                # once per chain); the penalty tests the rest
                # (1 - 1e-9): the per-draw charges summed in floating point stay below the
                # calibrated total
                mu_total = GaussianEvent(z, plan.iterations).mu * (1.0 - 1e-9)
                pre_mu = centring.budget_share * mu_total / plan.chains
                z = z / np.sqrt((1.0 - centring.budget_share) * (1.0 - 1e-9))
        else:
            z = check_positive("noise_multiplier", noise_multiplier)
            if delta is not None:
                _, delta = check_target(1.0, delta)
            if pre:
                z_pre = centring.noise_multiplier or z
                pre_mu = centring.releases * GaussianEvent(z_pre).mu
        self.noise_multiplier = float(z)
        self.correlated = noise
        if noise is not None:
            # one release plus one per planned iteration spend what the penalty test would
            self._set_schedule(z, plan.iterations_per_chain, noise.refreshes)
            self.refreshes = float(min(noise.refreshes, plan.iterations_per_chain))
        self._corr_mu_released = 0.0
        self.epsilon = epsilon
        self.centring = centring
        #: the privacy-loss parameter of the releases made at construction (each chain is
        #: charged it, spread over its planned iterations)
        self.centre_mu = float(pre_mu)
        self._centre_mu_per_iteration = self.centre_mu / plan.iterations_per_chain if pre else 0.0
        self._centre_noise_multiplier = (
            float(np.sqrt(centring.releases / (2.0 * pre_mu))) if pre else float("nan")
        )
        self._mu_per_iteration = (
            GaussianEvent(self.noise_multiplier).mu + self._centre_mu_per_iteration
        )
        self._releases_per_iteration = 1
        self._variance_correction = True
        self._reset_scaling()

        model = pm.modelcontext(model)
        structure = find_expfam_structure(model)  # data-free; refuses unsupported models
        if likelihood.records is not None:
            # the model holds a stand-in; the records' finiteness is checked by _setup
            structure.n_records = n_records_of(
                type(self), model, likelihood.records, privacy.nonprivate_diagnostics
            )
        else:
            structure.check_data_finite()
        if initial_point is None:
            initial_point = callscope.initial_point(model)
        self._setup(
            vars, privacy, likelihood, plan, delta, model=model, rng=rng,
            initial_point=initial_point, compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip
        records, chunk_size = likelihood.records, likelihood.chunk_size
        shared = {v: self.shared[v.name] for v in model.value_vars if v.name in self.shared}
        self._expfam: ExpFamilyModel = structure.compile(
            self.vars, initial_point, shared, compile_kwargs
        )
        store = None
        if records is not None:  # the response and covariates, in the order of the pass
            keys = records.check_names(self._expfam.record_names())
            store = records.store_for(keys, self._expfam.record_templates())
        counts = self.nonprivate_diagnostics or records is None
        self.centre: np.ndarray | None = None
        self._laplace: tuple[np.ndarray, np.ndarray] | None = None
        if centring is None:
            if stat_clip_bound is None:
                stat_clip_bound = self._expfam.stat_bound_from_box(data_bounds)
            self.stat_clip_bound = float(stat_clip_bound)
            # -- the one pass over the data: S = sum_i clip_C(T(x_i)) (input of every release)
            self._stat_sum, n_clipped = self._expfam.clipped_stat_sum(
                self.stat_clip_bound, chunk_size or 100_000, store=store, counts=counts
            )
        self._centring_job = None
        self._centre_releases = 0
        if centring is not None:
            C, c0 = self._check_centring(centring, data_bounds, stat_clip_bound)
            q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in self.vars])
            self._centring_job = (centring, C, c0, chunk_size or 100_000, store, counts, q0)
            self._stat_sum, n_clipped = None, 0
            self.stat_clip_bound = float("nan")
        self.stat_noise_std = expfam_noise_std(self.noise_multiplier, self.stat_clip_bound)
        self._releases_made = 0
        self._clip_fraction = (
            n_clipped / self._expfam.n_records if self.nonprivate_diagnostics else np.nan
        )
        if centring is not None and centring.releases == 0:
            self._finish_centring()  # a public centre and clip: nothing to release
        d = self._fns.ndim
        s = np.broadcast_to(np.asarray(proposal_scale, dtype=float), (d,)).copy()
        if not np.all(np.isfinite(s) & (s > 0)):
            raise ValueError("proposal_scale must be finite and > 0 in every coordinate")
        self.proposal_scale = s
        self._reset_chain_state()

    def _check_centring(self, centring, data_bounds, stat_clip_bound):
        """``(C, c)``: the magnitude bound and the public centre (None: private), data-free;
        refuses a missing box or a centre of the wrong length before the data is read."""
        fm = self._expfam
        value = centring.value
        C = None
        if stat_clip_bound is not None:
            C = float(stat_clip_bound)
        elif centring.is_private or centring.clip is None or isinstance(value, str):
            C = fm.stat_bound_from_box(data_bounds)  # refuses a missing box, before any read
        if isinstance(value, str) and value == "data_bounds":
            return C, fm.box_midpoint_stats(data_bounds)
        if isinstance(value, str):
            return C, None
        c = np.asarray(value, dtype=float)
        if c.shape != (fm.stat_dim,):
            raise ValueError(
                f"centre has length {c.size}; T(x_i) of the {fm.family.name} likelihood has "
                f"length {fm.stat_dim}"
            )
        return C, c

    def _finish_centring(self) -> None:
        """Make the releases before the chains (with the step's current generator: the first
        chain's, seeded by ``pm.sample``) and the pass that computes the chains' statistic."""
        centring, C, c0, chunk_size, store, counts, q0 = self._centring_job
        self._centring_job = None
        self._stat_sum, n_clipped = self._centred_statistic(
            centring, C, c0, chunk_size, store, counts, q0
        )
        self.stat_noise_std = expfam_noise_std(self.noise_multiplier, self.stat_clip_bound)
        if self.nonprivate_diagnostics:
            self._clip_fraction = n_clipped / self._expfam.n_records
        if self.correlated is not None and self._laplace is not None:
            self._choose_refreshes()

    def _choose_refreshes(self) -> None:
        """Lower ``K`` (`CorrelatedNoise.noise_target`) from public quantities only: the
        metric's Gaussian, ``W`` and ``b``. The privacy charge does not depend on ``K``."""
        target = self.correlated.noise_target
        if target is None:
            return
        m, L = self._laplace
        gen = np.random.default_rng(20261126)  # data-free Monte Carlo over the metric
        with np.errstate(all="ignore"):
            eta_m = self._expfam.natural(m)[0]
            psi2 = []
            for _ in range(32):
                d = self._expfam.natural(m + L @ gen.normal(size=m.size))[0] - eta_m
                d = self._scale_inv_t @ d if self.centre is not None else d
                psi2.append(float(d @ d))
        psi = float(np.sqrt(np.nanmean(psi2)))
        if not np.isfinite(psi):
            return
        iterations = self.plan.iterations_per_chain
        k = float(self.correlated.refreshes)
        while True:
            z0, r = correlated_noise_schedule(self.noise_multiplier, iterations, k)
            pred = z0 * 2.0 * self.stat_clip_bound * np.sqrt(1.0 - r * r) * psi
            if pred <= target or k <= 1.0:
                break
            k = max(1.0, k / 1.25)
        self._set_schedule(self.noise_multiplier, iterations, k)
        #: the K in use (public)
        self.refreshes = k

    def _set_schedule(self, z: float, iterations: int, refreshes: float) -> None:
        """The correlated releases' ``z0`` and ``r`` (`correlated_noise_schedule`) and the
        privacy-loss parameter of a chain's first release and of each one after it."""
        z0, r = correlated_noise_schedule(z, iterations, refreshes)
        self._corr_z0, self._corr_r = z0, r
        self._corr_mu_first = GaussianEvent(z0).mu
        self._corr_mu_next = self._corr_mu_first * (1.0 - r) / (1.0 + r)

    def _start_chain(self, iterations: int | None = None) -> None:
        super()._start_chain(iterations)
        if self._centring_job is not None:
            # the releases before the chains are made once the chain's seeded generator is
            # set (every worker process makes its own: each chain is charged them)
            self._finish_centring()
            self._start_pending = self._laplace is not None

    def _centred_statistic(self, centring, C, c, chunk_size, store, counts, q0):
        """The centre, the whitening, the clip ``b`` and the whitened sum (`StatCentre`).

        Up to five accounted Gaussian releases (each with the noise multiplier of the
        centre's budget), then the sum the chains release: (1) the DP centre ``c``; (2) a DP
        quantile ``b1`` of ``||T(x_i) - c||``; (3) the DP mean of ``|T(x_i) - c|`` (clipped
        to ``b1``), whose inverse is the whitening ``w``; (4) the DP quantile ``b`` of
        ``||w (T(x_i) - c)||``; (5) the DP refined centre ``c + (S_w + noise) / (n w)`` the
        metric is computed at. Returns ``S = S_w / w + n c`` (exact; for the audit) and the
        number of clipped records (never published).
        """
        fm = self._expfam
        value = centring.value
        z = self._centre_noise_multiplier
        n = fm.n_records
        self._centre_releases = 0

        def count() -> None:
            self._centre_releases += 1

        passes = fm.passes(chunk_size, store)
        W = np.eye(fm.stat_dim)
        b = centring.clip
        if b is None:
            # releases 1 (unless c is given) to 6: the DP centre, whitening and clip bound
            wh = private_whitening(
                passes,
                n=n,
                stat_clip_bound=C,
                quantile=centring.quantile,
                noise_multiplier=z,
                rng=self.rng,
                centre=c,
                on_release=count,
            )
            c, W, b = wh.centre, wh.scale, wh.clip
        elif c is None:
            # -- release 1 only: the DP centre, (sum_i clip_C(T(x_i)) + N(0, (z 2C)^2 I)) / n --
            c = private_centre(passes.clipped_stat_sum(C), n, C, z, self.rng)
            count()
        c = np.asarray(c, dtype=float)
        self.centre = c
        self.stat_scale = W
        self._scale_inv_t = np.linalg.inv(W).T
        self.stat_clip_bound = float(b)
        # -- the sum the chains release: S_w = sum_i clip_b(W (T(x_i) - c)) -------------------
        S_w, n_clipped = fm.centred_clip_sum(
            c, self.stat_clip_bound, chunk_size, scale=W, store=store, counts=counts
        )
        self._stat_sum_w = S_w
        self.metric_centre = c
        if centring.metric and self._centre_releases:
            # -- release 7: the refined centre c + W^-1 (S_w + N(0, (z 2b)^2 I)) / n ----------
            noisy = S_w + z * 2.0 * self.stat_clip_bound * self.rng.normal(size=S_w.shape)
            self.metric_centre = c + np.linalg.solve(W, noisy) / n
            self._centre_releases += 1
        midpoint = isinstance(value, str) and value == "data_bounds"
        if centring.metric and (not midpoint or self._centre_releases):
            # (the box's midpoint is no centre for the metric; its refinement is)
            self._laplace = self._metric_at_centre(q0)
            if self._laplace is not None:
                lam, U = np.linalg.eigh(self._laplace[1] @ self._laplace[1].T)
                self._axes = U * np.sqrt(np.maximum(lam, 0.0))
        return np.linalg.solve(W, S_w) + n * c, n_clipped

    def _metric_at_centre(self, q0: np.ndarray):
        """Mode and Cholesky factor of the inverse curvature of
        ``n (eta(q)^T c - A(q)) + log p(q)`` (data-free given the public centre ``c``)."""
        n, c = self._expfam.n_records, self.metric_centre

        def f(q):
            with np.errstate(all="ignore"):
                try:
                    eta, A = self._expfam.natural(q)
                except (ValueError, FloatingPointError, np.linalg.LinAlgError):
                    return -np.inf
                return float(n * (eta @ c - A) + self._fns.prior_logp(q))

        fit = quadratic_fit(f, q0)
        if fit is None:
            warnings.warn(
                "DPExpFamilyPenalty: the curvature at the centre is not positive definite; "
                "the random walk uses proposal_scale (the centre's statistic may not be "
                "attainable by the model)",
                UserWarning,
                stacklevel=4,
            )
            return None
        m, H = fit
        return m, np.linalg.cholesky(np.linalg.inv(H))

    def released_mu(self) -> float:
        """Privacy-loss parameter of the releases made so far: the centre and clip quantile
        (`StatCentre`, at construction) and the releases of ``S`` (all chains): the data are
        read for the chains once, at construction; every iteration releases ``S`` afresh."""
        made = self.centre_mu if getattr(self, "_centre_releases", 0) else 0.0
        if self.correlated is not None:
            return float(self._corr_mu_released + made)
        return float(GaussianEvent(self.noise_multiplier).mu * self._releases_made + made)

    @property
    def family(self) -> str:
        """Name of the recognised likelihood family (e.g. ``"normal_linear"``)."""
        return self._expfam.family.name

    def _reset_chain_state(self) -> None:
        # the correlated scheme's release of the current state and its reference eta_0
        self._release = None
        self._eta_ref = None
        self._direction = np.ones(self._fns.ndim)
        self._cache = None
        self._reset_scaling()
        self._start_pending = getattr(self, "_laplace", None) is not None

    def _propose(self, q: np.ndarray) -> tuple[np.ndarray, int | None]:
        d = q.size
        if self._laplace is None:  # the walk's own scales: the proposal draws
            if self._kind == "gaussian":
                return self.proposal.propose(self.rng, q, self.scaling), None
            direction = self._direction if self._kind == "guided" else None
            return self.proposal.propose(self.rng, q, self.scaling, direction)
        if self._kind == "gaussian":  # the metric of the natural parameters at c
            xi = self.rng.normal(size=d)
            return q + self.scaling * (2.38 / np.sqrt(d)) * (self._laplace[1] @ xi), None
        # one principal axis of the metric at the centre (columns of U diag(sqrt(lam)))
        j = int(self.rng.integers(d))
        step = self.scaling * self.rng.normal()
        if self._kind == "guided":
            step = self._direction[j] * abs(step)
        return q + step * self._axes[:, j], j

    def _point(self, q: np.ndarray) -> tuple[np.ndarray, float, float]:
        """``(eta, A, log prior)`` at ``q``; data-free. Cached for the current state when no
        other step can change the shared (unsampled) variables."""
        c = self._cache
        if c is not None and np.array_equal(c[0], q):
            return c[1]
        with np.errstate(all="ignore"):
            eta, A = self._expfam.natural(q)
        out = (eta, A, self._fns.prior_logp(q))
        if not self.shared:
            self._cache = (q.copy(), out)
        return out

    def log_acceptance(self, q_new: np.ndarray, q: np.ndarray, *, size: int | None = None):
        """Noisy log acceptance ratio of ``q -> q_new`` (draws ``size`` fresh releases of S).

        Every call is one (or ``size``) Gaussian-mechanism releases; the step calls it once
        per iteration. Also returns the std of the noise on the log ratio (data-free).
        """
        eta0, A0, lp0 = self._point(q)
        eta1, A1, lp1 = self._point(q_new)
        d_eta = eta1 - eta0
        n = self._expfam.n_records
        d_A = n * (A1 - A0)
        stat_sum, sigma = self._stat_sum, self.stat_noise_std
        if self.centre is not None:
            # S = W^-1 S_w + n c, released as W^-1 (S_w + N(0, sigma_S^2 I)) + n c:
            # d_eta . S~ = (W^-T d_eta) . (S_w + noise) + n d_eta . c
            d_A = d_A - n * float(d_eta @ self.centre)
            d_eta = self._scale_inv_t @ d_eta
            stat_sum = self._stat_sum_w
        noise_std = sigma * float(np.sqrt(d_eta @ d_eta))
        with np.errstate(all="ignore"):
            log_a = expfam_log_acceptance(
                stat_sum,
                d_eta,
                d_A,
                lp1 - lp0,
                0.0,
                sigma,
                self.rng,
                size=size,
                variance_correction=self._variance_correction,
            )
        return log_a, noise_std

    @property
    def correlated_noise_std(self) -> float:
        """``sigma = z0 * 2b``: the noise std of the correlated scheme's first release."""
        return float(self._corr_z0 * 2.0 * self.stat_clip_bound)

    def _whitened_stats(self) -> tuple[np.ndarray, np.ndarray | None]:
        """``(S_w, W^-T)`` of the chains' releases (uncentred: ``(S, None)``; never publish)."""
        if self.centre is not None:
            return self._stat_sum_w, self._scale_inv_t
        return self._stat_sum, None

    def _psi(self, eta: np.ndarray) -> np.ndarray:
        """``psi = W^-T (eta - eta_0)`` (``W = I`` uncentred); data-free."""
        d = eta - self._eta_ref
        return d if self.centre is None else self._scale_inv_t @ d

    def _correlated_iteration(self, q: np.ndarray) -> tuple[np.ndarray, dict]:
        """One iteration under `CorrelatedNoise`: the noise move (one correlated release,
        charged; two at the chain's first iteration) then ``theta_steps`` moves of ``theta``
        given the current release (post-processing)."""
        n = self._expfam.n_records
        if self._eta_ref is None:
            # eta_0 (public): at the mode of the metric, or at the chain's first state
            ref = self._laplace[0] if self._laplace is not None else q
            with np.errstate(all="ignore"):
                self._eta_ref = self._expfam.natural(ref)[0]
        S_w, _ = self._whitened_stats()
        sigma, r = self.correlated_noise_std, self._corr_r
        eta0, A0, lp0 = self._point(q)
        p0 = self._psi(eta0)
        # -- the data access of the iteration -------------------------------------------------
        if self._release is None:
            # the chain's first release, Y = S_w + sigma u, u ~ N(sigma psi(q), I): the
            # stationary law of u given q (the shift is public)
            self._release = correlated_release(None, S_w, r, sigma, self.rng, start=sigma * p0)
            self._corr_mu_released += self._corr_mu_first
        release = correlated_release(self._release, S_w, r, sigma, self.rng)
        self._corr_mu_released += self._corr_mu_next
        # -- everything below is post-processing of the releases --------------------------------
        # the noise move (Crank-Nicolson on u, theta fixed): log ratio psi . (Y' - Y)
        log_u = float(p0 @ (release - self._release))
        noise_std = sigma * float(np.sqrt(1.0 - r * r)) * float(np.sqrt(p0 @ p0))
        if np.isfinite(log_u) and accept(log_u, self.rng):
            self._release = release
        Y = self._release
        # theta moves given Y (the pseudo-marginal target with u fixed)
        accepted, acc_prob, step_norm = 0.0, 0.0, 0.0
        steps = self.correlated.theta_steps
        for _ in range(steps):
            q1, j = self._propose(q)
            eta1, A1, lp1 = self._point(q1)
            p1 = self._psi(eta1)
            rest = -n * (A1 - A0) + lp1 - lp0
            if self.centre is not None:
                rest += n * float((eta1 - eta0) @ self.centre)
            with np.errstate(all="ignore"):
                # (without the -sigma^2 |psi|^2 / 2 normalisation only to show its bias)
                s_norm = sigma if self._variance_correction else 0.0
                log_a = correlated_log_acceptance(p1, p0, Y, Y, rest, s_norm)
            if not np.isfinite(log_a):
                log_a = -np.inf
            ok = accept(log_a, self.rng)
            if self._kind == "guided" and not ok:
                self._direction[j] = -self._direction[j]
            if self.tune:
                self._adapt_scaling(ok)
            accepted += float(ok) / steps
            acc_prob += float(np.exp(min(0.0, log_a))) / steps
            if ok:
                step_norm = float(np.linalg.norm(q1 - q))
                q, eta0, A0, lp0, p0 = q1, eta1, A1, lp1, p1
        return q, {
            "accepted": accepted,
            "accept": acc_prob,
            "scaling": self.scaling,
            "step_norm": step_norm,
            "noise_std": noise_std,
            "centre_mu": self._centre_mu_per_iteration,
            "clip_fraction" + NONPRIVATE_SUFFIX: self._clip_fraction,
        }

    def _dp_astep(self, q0):
        q = q0.data
        if self._centring_job is not None:  # stepped without a chain start (set_rng)
            self._finish_centring()
            self._start_pending = self._laplace is not None
        if self._start_pending:
            # the chain's first iteration: start from a draw of N(mode, H^-1) at the public
            # centre (post-processing; no release, the iteration is charged all the same)
            self._start_pending = False
            m, L = self._laplace
            q1 = m + L @ self.rng.normal(size=m.size)
            return q1, {
                "accepted": 1.0,
                "accept": 1.0,
                "scaling": self.scaling,
                "step_norm": float(np.linalg.norm(q1 - q)),
                "noise_std": 0.0,
                "centre_mu": self._centre_mu_per_iteration,
                "clip_fraction" + NONPRIVATE_SUFFIX: self._clip_fraction,
            }
        if self.correlated is not None:
            self._releases_made += 1
            return self._correlated_iteration(q)
        q1, j = self._propose(q)
        # -- the one data access of the iteration: a fresh Gaussian release of S ----------------
        log_a, noise_std = self.log_acceptance(q1, q)
        self._releases_made += 1
        # -- everything below is post-processing of the noisy ratio -----------------------------
        if not np.isfinite(log_a):
            log_a = -np.inf  # NaN (proposal outside the support): reject
        accepted = accept(log_a, self.rng)
        if self._kind == "guided" and not accepted:
            self._direction[j] = -self._direction[j]
        if self.tune:
            self._adapt_scaling(accepted)
        stats = {
            "accepted": float(accepted),
            "accept": float(np.exp(min(0.0, log_a))),
            "scaling": self.scaling,
            "step_norm": float(np.linalg.norm(q1 - q)),
            "noise_std": noise_std,
            "centre_mu": self._centre_mu_per_iteration,
            "clip_fraction" + NONPRIVATE_SUFFIX: self._clip_fraction,
        }
        return (q1 if accepted else q), stats
