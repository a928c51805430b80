"""DPHMC: differentially private Hamiltonian Monte Carlo as a PyMC step.

References
----------
.. [1] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte
   Carlo. Algorithm 1 (DP-HMC), Theorem 3.3 (invariant distribution), Theorem 3.4
   (ergodicity), Theorem 3.5 (privacy). [DPHMC]
.. [2] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Sec. 5.2 (DP-HMC and its PLD accounting). [Raisa2021]
.. [3] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves.
   Statistics and Computing 29(5). (the penalty test) [YildirimErmis2019]
.. [4] Sommer, D. M., Meiser, S. and Mohammadi, E. (2019). Privacy loss classes: the central
   limit theorem in differential privacy. PoPETs 2019(2), Lemma 12.
.. [5] Hoffman, M. D. and Gelman, A. (2014). The No-U-Turn sampler. JMLR 15, Sec. 3.2.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pymc as pm
from pymc.util import get_value_vars_from_user_vars

from pymc_dp import callscope
from pymc_dp._validation import (
    check_positive,
    check_positive_vector,
    check_unit_interval,
)
from pymc_dp.accounting import GaussianEvent
from pymc_dp.kernels.hmc import (
    DiagonalMassAdaptation,
    DualAveraging,
    HaltonSequence,
    calibrate_dphmc_noise,
    dphmc_transition,
    gradient_noise_std,
)
from pymc_dp.kernels.hmc import dphmc_mu_per_iteration as _mu_per_iteration
from pymc_dp.records import FusedLastPass, FusedTwoPointPass, GradSumMemo, LoglikMemo
from pymc_dp.step_methods.base import NONPRIVATE_SUFFIX, DPStep, noise_or_target, scalar_stats
from pymc_dp.step_methods.parts import (
    LikelihoodSettings,
    PrivacySettings,
    require_clip_bound,
    resolve_parts,
)

__all__ = ["DPHMC", "calibrate_dphmc_noise"]

#: DP-HMC's two release kinds: the penalty test's log-likelihood ratio and the gradients
_KINDS = ("llr", "grad")
_KINDS_GRAD = ("grad",)


def _check_fraction(value) -> float:
    return check_unit_interval(value, "grad_budget_fraction")


class DPHMC(DPStep):
    r"""Differentially private Hamiltonian Monte Carlo (DP-HMC, Räisä et al., Algorithm 1).

    Each iteration draws a momentum $p \sim N(0, M)$ (diagonal ``M``), runs ``L``
    leapfrog steps of size $\eta_i = \eta h_i$ ($h_i$ a randomised Halton number
    in (0, 1)) in which *every* momentum update uses the noisy clipped gradient

    $$
    g(\theta) + \xi, \quad g(\theta) = \sum_i \mathrm{clip}_{b_g}
    (\nabla \log p(x_i|\theta)) + \nabla \log p(\theta), \quad
    \xi \sim N(0, (2 z_g b_g)^2 I)
    $$

    (prior and log-Jacobian exact, neither clipped nor noised), and accepts
    $(\theta', p')$ by the penalty test

    $$
    \log u < \sum_i \mathrm{clip}(r_i) + \xi_l + \log\frac{p(\theta')}{p(\theta)}
    + K(p) - K(p') - \frac{\sigma_l^2}{2}, \quad
    \xi_l \sim N(0, \sigma_l^2),\ \sigma_l = 2 z_l b_l \|\theta' - \theta\|_2
    $$

    with per-record log-likelihood ratios $r_i$ clipped to
    $\pm b_l \|\theta' - \theta\|_2$. With the ratios not clipped the chain has the
    exact posterior as invariant distribution (paper Theorem 3.3; gradient clipping does not
    affect exactness) and is ergodic (Theorem 3.4).

    **Privacy** (Theorem 3.5): the gradient is released ``L + 1`` times per iteration (the
    first release of an iteration draws fresh noise, never reuses a noisy gradient; its
    noise-free clipped sum, computed at the start or end of the last trajectory, is kept
    and reused when the point is exactly the same, `pymc_dp.records.GradSumMemo`, so
    ``L`` sums are computed), the ratio once (the per-record log-likelihoods at the
    current point, computed by the last ratio release, are kept, ``n`` floats,
    `pymc_dp.records.LoglikMemo`, so each release evaluates them at its proposal only;
    in memory or on the workers of a Dask cluster, where that evaluation is costly:
    `reuse_loglik`; where it pays, the
    ratio sum is computed in the same pass over the records as the last gradient sum of the
    trajectory, whose end point is the ratio's proposal: `fuse_ratio_pass`,
    `pymc_dp.records.FusedLastPass`, ``L`` record passes per iteration, and on a Dask
    cluster ``L`` messages to each worker instead of ``L + 1``); each is a
    Gaussian mechanism under replace-one neighbours, so an iteration has privacy-loss
    parameter $\mu = 1/(2 z_l^2) + (L + 1)/(2 z_g^2)$ and ``k`` iterations over all
    chains (warmup included) compose to $k\mu$ by the tight Gaussian bound (Sommer et
    al. 2019). Every iteration records ``dp_mu`` and ``dp_releases = L + 2``; read the
    spend of a run with `pymc_dp.privacy_report`. Everything else the step emits or
    adapts on is post-processing of the released values.

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound["llr"]`` (float): ``b_l``: per-record log-likelihood ratios are clipped to
          ``+-b_l ||theta' - theta||`` (a Lipschitz bound of each record's log-likelihood makes the
          clipping inactive).
        - ``clip_bound["grad"]`` (float): ``b_g``: each record's log-likelihood gradient is clipped
          to L2 norm ``b_g``. Choose both bounds from knowledge of the model, not by looking at the
          data: tuning them on the private data costs privacy.
        - ``noise_multiplier["llr"]``, ``noise_multiplier["grad"]`` (float, optional): ``z_l`` and
          ``z_g`` (noise std over sensitivity). Give both, or give ``epsilon`` and ``delta`` with
          the planned ``draws``, ``tune`` and ``chains``.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included); ``z_l`` and ``z_g`` are calibrated so that the run's epsilon
          never exceeds the target (`calibrate_dphmc_noise`).
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run. A chain asked to run
          more than ``draws + tune`` iterations stops with `BudgetExceededError` before it reads the
          data again.
        - ``budget_split["grad"]`` (float): With a target epsilon: the fraction of the total
          privacy-loss parameter ``mu`` spent on the ``L + 1`` gradient releases per iteration; the
          rest goes to the penalty test. Default 0.5 (the paper's tuned settings spend 46 % and 68 %
          on gradients for its two models). More gradient budget gives straighter trajectories, more
          ratio budget a less noisy test; both noises lower the acceptance rate.
        - ``nonprivate_diagnostics`` (bool): Also emit ``grad_clip_fraction_NONPRIVATE`` and
          ``llr_clip_fraction_NONPRIVATE`` (fractions of clipped per-record gradients and ratios),
          computed from the data WITHOUT noise. Not differentially private; the privacy report flags
          the run.
    n_leapfrog : int
        ``L``, leapfrog steps per iteration (each costs one gradient release).
    step_size : float, optional
        ``eta``, the largest step size (the step of iteration ``i`` is ``eta h_i``); the
        starting value when adapted. Default ``0.25 / d**0.25`` (as PyMC's HMC).
    mass_matrix : float or array, optional
        Diagonal of the mass matrix ``M`` (momentum covariance; its inverse should
        approximate the posterior variances in the transformed space). Default identity;
        the starting value when adapted.
    adapt_step_size : bool
        Adapt ``eta`` during warmup by dual averaging (Hoffman & Gelman 2014) toward
        ``target_accept``, from the noisy acceptance probabilities (post-processing).
    adapt_mass_matrix : bool
        Adapt a diagonal ``M^{-1}`` during warmup from the chain's own draws (Stan-style
        doubling windows; the step size adaptation restarts after each update).
    target_accept : float
        Target of the step-size adaptation; default 0.65, the optimal acceptance rate of
        HMC with a fixed number of steps (Beskos et al. 2013) and PyMC's default for
        ``HamiltonianMC``. The noise of the test and of the gradients shrinks with the step
        size, so any target is reachable; lower targets give longer, noisier moves.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (thesis Sec. 3.2).
        - ``chunk_size`` (int, optional): Records per call of the compiled functions (bounded memory
          for large ``n``).
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): every clipped sum is computed where the partitions
          live and only the sums reach the driver, which adds the noise. With data owners
          (``DaskRecords(..., owners=...)``) the step runs the data-sharing scheme of Yildirim &
          Ermis (2019), Algorithm 2, on all its ``L + 2`` releases: each of the ``K`` owners adds
          its own noise (the central scheme's ``sigma_g`` to its gradient sums, ``sigma_l`` to its
          ratio sum) before its contribution leaves it; the total noise variance is ``K`` times the
          central one and the penalty correction is ``K sigma_l^2 / 2``. Each owner's privacy
          against the curator and the other owners is that of the central scheme at the same noise
          multipliers (``dp_owners`` records ``K``).
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``: deprecated,
        kept for the 0.1 releases (docs/api.md).

    Notes
    -----
    Sampler stats: ``accepted``, ``accept`` (the noisy acceptance probability),
    ``step_size`` (``eta h_i`` of the iteration), ``step_size_bar`` (dual-averaged ``eta``),
    ``n_leapfrog``, ``energy_change`` (the *noisy* energy change ``-(log acceptance ratio +
    sigma_l^2 / 2)``; the exact energy reads the data and is never published),
    ``diverging`` (noisy energy change above 1000 or not finite), ``step_norm``,
    ``llr_noise_std``, ``grad_noise_std`` and the privacy stats of
    `DPStep`.

    The Gaussian mechanism is implemented with floating-point Gaussian samples, which can
    leak through low-order bits (Mironov 2012); the penalty correction needs Gaussian noise,
    so the discrete Gaussian is no drop-in replacement (paper Sec. 5).
    """

    name = "dphmc"
    #: Reuse the noise-free clipped gradient sum at the current point, computed at the start
    #: or the end of the last trajectory (`pymc_dp.records.GradSumMemo`): ``L`` computed
    #: sums per iteration instead of ``L + 1``, the same releases. False computes all.
    reuse_gradient_sums = True
    #: Keep the per-record log-likelihoods at the current point (``n`` floats, computed by
    #: the last ratio release; `pymc_dp.records.LoglikMemo`): each ratio release evaluates
    #: the log-likelihoods at its proposal only. In memory, or on the workers of
    #: `DaskRecords` (they never leave them); central scheme. ``None``
    #: (default): where it pays (`RecordFunctions.loglik_worth_keeping`: a transcendental
    #: function or a row reduction per record); True: always; False: never.
    reuse_loglik: bool | None = None
    #: Compute the last gradient release of each trajectory and the ratio release in one
    #: pass over the records (`pymc_dp.records.FusedLastPass`: the per-record
    #: log-likelihoods at the end point in the same compiled call as the clipped gradient
    #: sum there, the ratios against those kept at the current point, ``n`` floats). The
    #: same releases, noise and accounting. ``None`` (default): where it pays
    #: (`RecordFunctions.fused_pays`: not on the sorted route, and a costly per-record
    #: log-likelihood in memory; on `DaskRecords` whatever the likelihood, as it also saves
    #: one round trip to the workers an iteration), and for a log-likelihood too cheap to
    #: keep on the blocks route (the banana) the log-likelihoods at both points in the
    #: same pass (`pymc_dp.records.FusedTwoPointPass`,
    #: `RecordFunctions.fused_two_point_pays`); True: the kept pass wherever available
    #: (in-memory records or `DaskRecords`, central scheme, a route with a fused pass);
    #: False: never.
    fuse_ratio_pass: bool | None = None
    remote_records = True
    data_sharing = True
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **scalar_stats("accept", "step_size", "step_size_bar"),
        **scalar_stats("n_leapfrog", dtype=np.int64),
        **scalar_stats("energy_change"),
        **scalar_stats("diverging", dtype=bool),
        **scalar_stats("step_norm", "llr_noise_std", "grad_noise_std"),
        **scalar_stats(
            "grad_clip_fraction" + NONPRIVATE_SUFFIX, "llr_clip_fraction" + NONPRIVATE_SUFFIX
        ),
    }

    _privacy_keywords = {
        "llr_clip_bound": ("clip_bound", "llr"),
        "grad_clip_bound": ("clip_bound", "grad"),
        "llr_noise_multiplier": ("noise_multiplier", "llr"),
        "grad_noise_multiplier": ("noise_multiplier", "grad"),
        "grad_budget_fraction": ("budget_split", "grad"),
    }

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        n_leapfrog: int = 10,
        step_size: float | None = None,
        mass_matrix=None,
        adapt_step_size: bool = True,
        adapt_mass_matrix: bool = True,
        target_accept: float = 0.65,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        # -- validate everything before the data is touched ------------------------------------
        privacy, likelihood, _ = resolve_parts(type(self), privacy, likelihood, deprecated)
        llr_clip_bound, grad_clip_bound = (privacy.of_kind("clip_bound", k, _KINDS) for k in _KINDS)
        llr_noise_multiplier, grad_noise_multiplier = (
            privacy.of_kind("noise_multiplier", k, _KINDS) for k in _KINDS
        )
        self.llr_clip_bound = require_clip_bound(type(self), llr_clip_bound, "llr_clip_bound")
        self.grad_clip_bound = require_clip_bound(type(self), grad_clip_bound, "grad_clip_bound")
        self.n_leapfrog = check_positive(n_leapfrog, "n_leapfrog", integer=True, coerce=True)
        self.grad_budget_fraction = _check_fraction(
            privacy.of_kind("budget_split", "grad", _KINDS_GRAD) if privacy.budget_split else 0.5
        )
        if step_size is not None:
            step_size = check_positive(step_size, "step_size", coerce=True)
        self.target_accept = check_unit_interval(target_accept, "target_accept")
        self.adapt_step_size = bool(adapt_step_size)
        self.adapt_mass_matrix = bool(adapt_mass_matrix)

        given = [v is not None for v in (llr_noise_multiplier, grad_noise_multiplier)]
        if privacy.epsilon is not None and any(given):
            raise ValueError(
                "give either llr_noise_multiplier and grad_noise_multiplier, or epsilon (with "
                "delta, draws, tune, chains), not both: the noise is set either directly or by "
                "a target for a planned run"
            )
        (z_l, z_g), plan, epsilon, delta = noise_or_target(
            privacy,
            noise_given=all(given),
            message="give both llr_noise_multiplier and grad_noise_multiplier, or epsilon (with "
            "delta, draws, tune, chains): the noise is set either directly or by a target "
            "for a planned run",
            noise=lambda: (
                check_positive(llr_noise_multiplier, "llr_noise_multiplier", coerce=True),
                check_positive(grad_noise_multiplier, "grad_noise_multiplier", coerce=True),
            ),
            calibrate=lambda run, eps, d: calibrate_dphmc_noise(
                eps, d, run.iterations, self.n_leapfrog, self.grad_budget_fraction
            ),
        )
        self.llr_noise_multiplier = float(z_l)
        self.grad_noise_multiplier = float(z_g)
        self.epsilon = epsilon
        self._mu_per_iteration = _mu_per_iteration(z_l, z_g, self.n_leapfrog)
        self._releases_per_iteration = self.n_leapfrog + 2
        self.grad_noise_std = gradient_noise_std(z_g, self.grad_clip_bound)

        # Dimension from the initial point only (shapes of the parameters, no data).
        model = pm.modelcontext(model)
        if initial_point is None:
            initial_point = callscope.initial_point(model)
        value_vars = (
            model.value_vars if vars is None else get_value_vars_from_user_vars(vars, model)
        )
        d = int(sum(np.size(initial_point[v.name]) for v in value_vars))
        self._initial_mass = _check_mass_matrix(mass_matrix, d)
        self._initial_step_size = float(step_size) if step_size is not None else 0.25 / d**0.25

        self._setup(
            vars, privacy, likelihood, plan, delta, model=model, rng=rng,
            initial_point=initial_point, compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip
        self._chain_tune: int | None = plan.tune if plan is not None else None
        others = self._other_values if self.shared else None
        self._grad_memo = GradSumMemo(self._fns, others)
        self._ll_memo = LoglikMemo(self._fns, others)
        self._reset_chain_state()

    # -- per-chain state -------------------------------------------------------------------------
    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """PyMC 6.x: remember the warmup length (for the mass-matrix windows), then reset."""
        self._chain_tune = int(tune)
        super().setup_chain(rng, tune, draws)

    def _reset_chain_state(self) -> None:
        # Called by the base at the start of every chain, after the chain's rng is set; the
        # Halton scrambling is drawn from that rng, so draws do not depend on `cores`.
        self._halton = HaltonSequence(self.rng)
        self._grad_memo.clear()
        self._ll_memo.clear()
        # A worker process of pm.sample never sets `tune` itself (it only calls stop_tuning).
        self.tune = True
        self.reset_tuning()

    def reset_tuning(self) -> None:
        """Restart the warmup adaptation (called by pm.sample per chain with cores=1) and
        switch tuning back on (`DPStep.reset_tuning`: a ``CompoundStep``'s later chains)."""
        self.tune = True
        self._dual = DualAveraging(self._initial_step_size, self.target_accept)
        self._mass = DiagonalMassAdaptation(1.0 / self._initial_mass, self._chain_tune)
        self._inv_mass = self._mass.inv_mass.copy()
        self._mass_diag = 1.0 / self._inv_mass

    def _other_values(self) -> list:
        """Current values of the free variables this step does not sample (set by PyMC
        before every iteration; another step may change them between iterations)."""
        return [v.get_value(borrow=True) for v in self.shared.values()]

    # -- one iteration -------------------------------------------------------------------------
    def _dp_astep(self, q0):
        # A trajectory that diverges (huge momenta or positions) is rejected; its overflows
        # need no warning.
        with np.errstate(over="ignore", invalid="ignore"):
            return self._iteration_body(q0)

    def _iteration_body(self, q0):
        fns = self._fns
        # The clipped counts feed only the *_NONPRIVATE stats, NaN unless the user asked
        # for them: without that, the compiled passes do not count (a few instructions a
        # record in the banana's loop; remote records: set by the base for the workers).
        if getattr(fns.records, "local", False) and fns.counts != self.nonprivate_diagnostics:
            fns.counts = self.nonprivate_diagnostics
        q = q0.data
        tune = bool(self.tune)
        eta = self._dual.current(tune) if self.adapt_step_size else self._initial_step_size
        h = eta * self._halton.next()
        # The noise-free clipped sum at q is the one at the start or the end of the last
        # trajectory: kept (`GradSumMemo`, exact match of everything it depends on), with
        # fresh noise added by the kernel like any other release; the central scheme only
        # (with data owners the noise is added where the records live).
        memo = self._grad_memo if self.reuse_gradient_sums and not self._owners else None
        if memo is not None:
            memo.begin_trajectory()
        # The per-record log-likelihoods at q were computed by the last ratio release: kept
        # (`LoglikMemo`, in-memory records, central scheme), the release computes those at
        # the proposal only; the same release, the same noise.
        fused, kept = self._fused_pass()
        ll_memo = self._ll_memo if kept or self.keeps_loglik else None
        # -- L + 1 gradient releases and one log-likelihood-ratio release (the kernel) ---------
        q_next, info = dphmc_transition(
            self.rng,
            q,
            step_size=h,
            n_leapfrog=self.n_leapfrog,
            mass_diag=self._mass_diag,
            inv_mass=self._inv_mass,
            grad_clip_bound=self.grad_clip_bound,
            grad_noise_std=self.grad_noise_std,
            llr_clip_bound=self.llr_clip_bound,
            llr_noise_multiplier=self.llr_noise_multiplier,
            clipped_grad_sum=fns.clipped_grad_sum if memo is None else memo,
            prior_logp_and_grad=fns.prior_logp_and_grad,
            clipped_loglik_ratio_sum=fns.clipped_loglik_ratio_sum if ll_memo is None else ll_memo,
            owners=self._owners,
            shared_grad_sum=fns.shared_clipped_grad_sum if self._owners else None,
            shared_llr_sum=fns.shared_clipped_loglik_ratio_sum if self._owners else None,
            clipped_grad_and_ratio_sum=fused,
        )
        if memo is not None:
            memo.end_trajectory()
        if ll_memo is not None:
            ll_memo.keep(q_next)
        # -- everything below is post-processing of the released values --------------------------
        if tune:
            self._adapt(q_next, info.accepted, info.accept_prob)
        n = fns.n_records
        stats = {
            "accepted": float(info.accepted),
            "accept": info.accept_prob,
            "step_size": h,
            "step_size_bar": self._dual.current(False) if self.adapt_step_size else eta,
            "n_leapfrog": self.n_leapfrog,
            "energy_change": info.energy_change,
            "diverging": info.diverging,
            "step_norm": info.step_norm,
            "llr_noise_std": info.llr_noise_std,
            # the total noise of a gradient release (K owners: sqrt(K) times the central)
            "grad_noise_std": self.grad_noise_std * float(np.sqrt(max(self._owners, 1))),
            "grad_clip_fraction" + NONPRIVATE_SUFFIX: info.n_grad_clipped / (info.n_grad * n),
            "llr_clip_fraction" + NONPRIVATE_SUFFIX: info.n_llr_clipped / n,
        }
        return q_next, stats

    @property
    def fuses_ratio_pass(self) -> bool:
        """Whether the last gradient release and the ratio release share one pass over the
        records (`fuse_ratio_pass`; in-memory records or `DaskRecords`, central scheme, a
        route with a fused pass: `pymc_dp.records.RecordFunctions.fusable`). Structural,
        data-free."""
        return self._fused_kind() is not None

    def _fused_kind(self) -> str | None:
        """``"kept"`` (`pymc_dp.records.FusedLastPass`, the log-likelihoods at the current
        point kept), ``"two-point"`` (`pymc_dp.records.FusedTwoPointPass`, evaluated at both
        points in the pass; by default where `RecordFunctions.fused_two_point_pays`) or
        None (two passes). Structural, data-free."""
        if self.fuse_ratio_pass is False or self._owners or not self._fns.can_keep:
            return None
        if self.fuse_ratio_pass is None:
            if self._fns.fused_pays:
                return "kept"
            if self.reuse_loglik is not True and self._fns.fused_two_point_pays:
                return "two-point"
            return None
        return "kept" if self._fns.fusable else None

    def _fused_pass(self) -> tuple[FusedLastPass | FusedTwoPointPass | None, bool]:
        """The fused last pass of this iteration (None: two passes) and whether it keeps
        the log-likelihoods (`_fused_kind`; decided once per setting of the attributes it
        depends on, the decision is structural)."""
        memo = self._grad_memo if self.reuse_gradient_sums else None
        key = (id(memo), self.fuse_ratio_pass, self.reuse_loglik, self._owners)
        if getattr(self, "_fused", None) is None or self._fused[0] != key:
            kind = self._fused_kind()
            if kind == "kept":
                fused = FusedLastPass(self._fns, self._ll_memo, memo)
            elif kind == "two-point":
                fused = FusedTwoPointPass(self._fns, memo)
            else:
                fused = None
            self._fused = (key, fused, kind == "kept")
        return self._fused[1], self._fused[2]

    @property
    def keeps_loglik(self) -> bool:
        """Whether the ratio releases use the kept per-record log-likelihoods
        (`reuse_loglik`; in-memory records or `DaskRecords`, whose workers keep them;
        central scheme). Structural, data-free."""
        if self._owners or not self._fns.can_keep:
            return False
        if self.reuse_loglik is None:
            return self._fns.loglik_worth_keeping
        return bool(self.reuse_loglik)

    def _mu_per_release(self) -> dict[str, float]:
        return {
            "llr": GaussianEvent(self.llr_noise_multiplier).mu,
            "grad": GaussianEvent(self.grad_noise_multiplier).mu,
        }

    def _adapt(self, q_next: np.ndarray, accepted: bool, accept_prob: float) -> None:
        """Warmup adaptation from DP outputs only (the accept probability and the draws)."""
        if self.adapt_step_size:
            self._dual.update(accept_prob)
        if self.adapt_mass_matrix and self._mass.update(q_next, accepted):
            self._inv_mass = self._mass.inv_mass.copy()
            self._mass_diag = 1.0 / self._inv_mass
            if self.adapt_step_size:
                self._dual.restart(self._dual.current(True))


def _check_mass_matrix(mass_matrix, d: int) -> np.ndarray:
    """Diagonal of M as a float vector of length d (ValueError naming the parameter)."""
    if mass_matrix is None:
        return np.ones(d)
    try:
        m = np.asarray(mass_matrix, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(
            f"mass_matrix must be a positive number or a vector of length {d}; got {mass_matrix!r}"
        ) from None
    if m.ndim > 1:
        raise ValueError(
            f"mass_matrix must be the diagonal of M (a number or a vector of length {d}); "
            f"got an array of shape {m.shape}: DPHMC supports diagonal mass matrices only"
        )
    if m.ndim == 1 and m.shape[0] != d:
        raise ValueError(
            f"mass_matrix has length {m.shape[0]}, but the step samples {d} parameters"
        )
    return check_positive_vector(m, "mass_matrix", d)
