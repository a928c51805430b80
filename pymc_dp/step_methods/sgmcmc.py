r"""DP-SGLD and DP-SGNHT: stochastic-gradient MCMC with DP minibatch gradients as PyMC steps.

The DP-HMC paper's baselines (Räisä, Koskela & Honkela, Sec. 4): Poisson-subsampled clipped
gradients with Gaussian noise, a constant step size and **no accept/reject step**. They are
biased for every step size ``eta > 0`` (see `pymc_dp.kernels.sgmcmc`); use them as
baselines, or with step sizes small against the posterior's scale.

References
----------
.. [1] Welling, M. and Teh, Y. W. (2011). Bayesian learning via stochastic gradient Langevin
   dynamics. ICML, eq. 4.
.. [2] Wang, Y.-X., Fienberg, S. E. and Smola, A. (2015). Privacy for free: posterior sampling
   and stochastic gradient Monte Carlo. ICML, Sec. 4.
.. [3] Li, B., Chen, C., Liu, H. and Carin, L. (2019). On connecting stochastic gradient MCMC
   and differential privacy. AISTATS.
.. [4] Ding, N., Fang, Y., Babbush, R., Chen, C., Skeel, R. D. and Neven, H. (2014). Bayesian
   sampling using stochastic gradient thermostats. NeurIPS 27, Algorithm 1.
.. [5] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte Carlo,
   Sec. 4 and its experiment code (settings in docs/results.md). [DPHMC]
.. [6] Koskela, A., Jälkö, J. and Honkela, A. (2020). Computing tight differential privacy
   guarantees using FFT. AISTATS. (PLD accounting of the subsampled Gaussian mechanism)
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm

from pymc_dp._validation import check_positive
from pymc_dp.accounting import (
    PoissonSubsampledGaussian,
    calibrate_poisson_subsampled_noise,
    poisson_subsampled_gaussian_epsilon,
)
from pymc_dp.kernels.sgmcmc import (
    SGNHTState,
    added_noise_multiplier,
    noisy_gradient,
    poisson_subsample,
    sgld_intrinsic_noise_multiplier,
    sgld_update,
    sgnht_intrinsic_noise_multiplier,
    sgnht_update,
    total_noise_multiplier,
)
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    DPStep,
    n_records_of,
    noise_or_target,
    scalar_stats,
)
from pymc_dp.step_methods.parts import (
    LikelihoodSettings,
    PrivacySettings,
    require_clip_bound,
    resolve_parts,
)

__all__ = ["DPSGLD", "DPSGNHT", "sgld_runner", "sgnht_runner"]


def _check_rate(batch_size, sampling_rate, n: int) -> tuple[float, float]:
    """``(q, b)`` from exactly one of batch_size (expected batch size) and sampling_rate."""
    if (batch_size is None) == (sampling_rate is None):
        raise ValueError(
            "give exactly one of batch_size (the expected Poisson batch size b; q = b / n) and "
            "sampling_rate (q, the probability that a record is read in an iteration)"
        )
    if batch_size is not None:
        b = check_positive(batch_size, "batch_size", integer=True, coerce=True)
        if b > n:
            raise ValueError(
                f"batch_size must be at most the number of records n = {n}; got {batch_size!r}"
            )
        return b / n, float(b)
    try:
        q = float(sampling_rate)
    except (TypeError, ValueError):
        q = math.nan
    if not 0.0 < q <= 1.0:
        raise ValueError(f"sampling_rate must be in (0, 1]; got {sampling_rate!r}")
    return q, q * n


class _SGMCMCStep(DPStep):
    """Shared machinery of DPSGLD and DPSGNHT (validation, calibration, minibatch gradient)."""

    remote_records = True

    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        **scalar_stats("dp_poisson_sigma", "dp_poisson_q", "step_size", "grad_noise_std"),
        **scalar_stats("diverging", dtype=bool),
        **scalar_stats("grad_clip_fraction" + NONPRIVATE_SUFFIX),
    }

    def _build(
        self, vars, privacy, likelihood, deprecated, *, step_size, batch_size, sampling_rate,
        **pymc_args,
    ) -> None:  # fmt: skip
        """The construction of both steps: resolve the parts, validate (before the data is
        touched: shapes only), calibrate, then `DPStep._setup` (whose warnings point one
        frame further up, at the user's code) and the chain state."""
        privacy, likelihood, _ = resolve_parts(type(self), privacy, likelihood, deprecated)
        self.clip_bound = require_clip_bound(type(self), privacy.clip_bound)
        self.step_size = check_positive(step_size, "step_size", coerce=True)
        model = pm.modelcontext(pymc_args["model"])
        n = n_records_of(type(self), model, likelihood.records, privacy.nonprivate_diagnostics)
        self.sampling_rate, self.batch_size = _check_rate(batch_size, sampling_rate, n)
        z_int = self._intrinsic_noise_multiplier()

        def calibrate(run, eps: float, d: float):
            z = calibrate_poisson_subsampled_noise(eps, d, self.sampling_rate, run.iterations)
            if z_int > z:
                self._warn_underspent(eps, d, z, z_int, run)
            return z, added_noise_multiplier(z, z_int)

        noise_multiplier = privacy.noise_multiplier
        (z_target, sigma), plan, epsilon, delta = noise_or_target(
            privacy,
            noise_given=noise_multiplier is not None,
            message="give either noise_multiplier (the added DP noise; 0 relies on the sampler's "
            "own diffusion noise) or epsilon (with delta, draws, tune, chains: a target for a "
            "planned run), not both and not neither",
            noise=lambda: (
                None,
                check_positive(noise_multiplier, "noise_multiplier", allow_zero=True, coerce=True),
            ),
            calibrate=calibrate,
        )
        self.epsilon = epsilon
        #: Total noise multiplier the target calls for (None without a target).
        self.calibrated_noise_multiplier = z_target
        #: Multiplier of the DP noise added to the clipped minibatch sum (std sigma * C).
        self.noise_multiplier = float(sigma)
        #: Multiplier carried by the sampler's own diffusion noise (data-free constant).
        self.intrinsic_noise_multiplier = float(z_int)
        #: Noise multiplier of the released Poisson-subsampled Gaussian mechanism.
        self.total_noise_multiplier = total_noise_multiplier(sigma, z_int)
        self.grad_noise_std = self.noise_multiplier * self.clip_bound
        self._mu_per_iteration = 0.0
        self._releases_per_iteration = 1
        pymc_args["model"] = model
        self._setup(vars, privacy, likelihood, plan, delta, stacklevel=4, **pymc_args)
        self._reset_chain_state()

    def _intrinsic_noise_multiplier(self) -> float:  # pragma: no cover - abstract
        raise NotImplementedError

    def _min_step_size(self, z_target: float) -> float:  # pragma: no cover - abstract
        """Smallest step size whose own noise multiplier is at most ``z_target``."""
        raise NotImplementedError

    def _warn_underspent(
        self, epsilon: float, delta: float, z_target: float, z_int: float, plan
    ) -> None:
        """Warn that the step's own noise makes the planned run spend less than the target.

        The sampler's diffusion noise alone is a noise multiplier ``z_int`` larger than the
        ``z_target`` the budget calls for, so no noise is added and the run is more private
        than asked: the budget buys nothing. Says what it spends and what would use it.
        """
        spent = poisson_subsampled_gaussian_epsilon(
            [PoissonSubsampledGaussian(z_int, self.sampling_rate, plan.iterations)], delta
        )
        name = type(self).__name__
        warnings.warn(
            f"{name}: the target epsilon={epsilon:g} (delta={delta:g}) is under-spent: the "
            f"sampler's own diffusion noise alone (noise multiplier {z_int:.4g}, more than "
            f"the {z_target:.4g} the target calls for) makes the planned {plan.iterations} "
            f"iterations spend epsilon={spent:.4g}, so no DP noise is added and the rest of "
            "the budget buys nothing. To use the budget: run more iterations (draws, tune "
            f"or chains; the spend grows with them), or take a larger step size (at "
            f"step_size >= {self._min_step_size(z_target):.4g}, instead of "
            f"{self.step_size:.4g}, the own noise is below the target's and noise is added "
            "to meet the target exactly; a larger step also means more bias), or lower the "
            "target to what is spent.",
            UserWarning,
            stacklevel=4,
        )

    def _privacy_stats(self) -> dict[str, Any]:
        out = super()._privacy_stats()
        out["dp_poisson_sigma"] = self.total_noise_multiplier
        out["dp_poisson_q"] = self.sampling_rate
        return out

    def released_events(self) -> list:
        return [
            PoissonSubsampledGaussian(
                self.total_noise_multiplier, self.sampling_rate, self._releases()
            )
        ]

    def _noisy_gradient(self, q: np.ndarray) -> tuple[np.ndarray, float]:
        """One release: the DP minibatch gradient of the log posterior at ``q``.

        Returns the gradient and the non-private clipped fraction (``DPStep.astep`` blanks
        it unless ``nonprivate_diagnostics``).
        """
        fns = self._fns
        idx = poisson_subsample(fns.n_records, self.sampling_rate, self.rng)
        s, k = fns.clipped_grad_sum_subset(q, self.clip_bound, idx)
        _, g_prior = fns.prior_logp_and_grad(q)
        g = noisy_gradient(s, g_prior, self.sampling_rate, self.grad_noise_std, self.rng)
        frac = k / max(idx.size, 1)
        return g, frac

    def _common_stats(self, q_new: np.ndarray, frac: float) -> dict[str, Any]:
        return {
            "accepted": 1.0,  # no accept/reject step
            "step_size": self.step_size,
            "grad_noise_std": self.grad_noise_std,
            "diverging": bool(not np.all(np.isfinite(q_new))),
            "grad_clip_fraction" + NONPRIVATE_SUFFIX: frac,
        }


class DPSGLD(_SGMCMCStep):
    r"""Differentially private stochastic gradient Langevin dynamics (DP-SGLD).

    Each iteration draws a Poisson minibatch ``B`` (each record independently with
    probability ``q = b / n``) and moves (Welling & Teh 2011, eq. 4; Wang, Fienberg & Smola
    2015, Sec. 4; Li et al. 2019)

    $$
    \hat g = \nabla \log p(\theta) + \frac{1}{q}\Big(\sum_{i \in B}
    \mathrm{clip}_C(\nabla \log p(x_i \mid \theta)) + N(0, \sigma^2 C^2 I)\Big),
    \qquad \theta' = \theta + \frac{\eta}{2}\hat g + N(0, \eta I).
    $$

    The prior (and log-Jacobian) gradient is exact: neither clipped nor noised. There is no
    accept/reject step and ``eta`` is constant, so the chain is **biased for every
    eta > 0**: on a Gaussian target of precision ``P`` with exact gradients its stationary
    variance is ``1 / (P (1 - eta P / 4))`` instead of ``1 / P``, and the minibatch and DP
    noises inflate it further (`pymc_dp.kernels.sgmcmc.sgld_gaussian_variance`). The
    bias vanishes only as ``eta -> 0``.

    **Privacy** (replace-one neighbours). Given ``theta`` (an earlier release), ``theta'`` is
    a data-free function of ``theta`` plus ``(eta / (2q)) (S + noise)``, with ``S`` the clipped
    minibatch sum (each term of norm at most ``C``). Moving the diffusion noise onto ``S``
    makes every iteration a Poisson-subsampled Gaussian mechanism with noise multiplier
    ``z = sqrt(sigma^2 + z_int^2)``, ``z_int = 2 q / (C sqrt(eta))``
    (`sgld_intrinsic_noise_multiplier`). Every iteration records
    ``dp_poisson_sigma = z`` and ``dp_poisson_q = q``; `pymc_dp.privacy_report`
    composes all iterations of all chains (warmup included) with dp-accounting's PLD
    accountant.

    The DP-HMC paper's baseline code moves by ``eta_p / n`` times the gradient plus
    ``N(0, eta_p / n)`` noise (half of the Langevin variance, so it targets the posterior
    squared); its banana/Gaussian settings ``eta_p = 1 / 0.008`` correspond here to
    ``step_size = 2 eta_p / n`` with the correct Langevin noise.

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound`` (float): ``C``: each record's log-likelihood gradient (transformed space)
          is clipped to L2 norm ``C``. Choose it from knowledge of the model, not from the data (the
          DP-HMC paper tuned it so that under 20 % of the gradients are clipped).
        - ``noise_multiplier`` (float, optional): ``sigma >= 0``: noise ``N(0, (sigma C)^2 I)``
          added to the clipped minibatch sum. ``0`` relies on the diffusion noise alone (Wang et al.
          2015). Give this, or ``epsilon`` and ``delta`` with the planned ``draws``, ``tune`` and
          ``chains``.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included): the total noise multiplier ``z`` is calibrated with
          dp-accounting's PLD accountant for ``(draws + tune) * chains`` Poisson-subsampled Gaussian
          mechanisms (`pymc_dp.accounting.calibrate_poisson_subsampled_noise`), and ``sigma =
          sqrt(max(z^2 - z_int^2, 0))`` is added. When the diffusion noise alone suffices (``sigma =
          0``) the run spends less than the target.
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run. A chain asked to run
          more than ``draws + tune`` iterations stops with `BudgetExceededError` before it reads the
          data again.
        - ``nonprivate_diagnostics`` (bool): Also emit ``grad_clip_fraction_NONPRIVATE`` (fraction
          of the minibatch whose gradient was clipped), computed from the data WITHOUT noise. Not
          differentially private; the privacy report flags the run.
    step_size : float
        ``eta`` (constant; the bias grows with it).
    batch_size : int, optional
        Expected minibatch size ``b``; the sampling rate is ``q = b / n``. Each record is read
        independently with probability ``q`` (Poisson sampling), so the realised batch size
        varies; it is never published. Give this or ``sampling_rate``.
    sampling_rate : float, optional
        ``q`` in (0, 1] directly.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (the clip bound applies to the
          tempered gradients).
        - ``chunk_size`` (int, optional): Records per call of the compiled gradient function
          (bounded memory for large batches).
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): the minibatch indices are drawn here (the same
          random stream as in memory), each partition holding some of them evaluates only those rows
          and returns their sum, and the driver combines the partition sums in partition order and
          adds the noise.
    model : pymc.Model, optional
        As for PyMC's step methods.
    rng : numpy Generator or seed, optional
        As for PyMC's step methods.
    initial_point : dict, optional
        As for PyMC's step methods.
    compile_kwargs : dict, optional
        As for PyMC's step methods.
    blocked : bool
        As for PyMC's step methods.
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``: deprecated,
        kept for the 0.1 releases (docs/api.md).

    Notes
    -----
    Sampler stats: ``accepted`` (always 1), ``step_size``, ``grad_noise_std`` (``sigma C``),
    ``diverging`` (the new point is not finite), ``dp_poisson_sigma``, ``dp_poisson_q`` and the
    privacy stats of `DPStep` (``dp_mu`` is 0: the
    subsampled mechanism is accounted by its own stats).
    """

    name = "dp_sgld"

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        step_size: float,
        batch_size: int | None = None,
        sampling_rate: float | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        self._build(
            vars, privacy, likelihood, deprecated, step_size=step_size, batch_size=batch_size,
            sampling_rate=sampling_rate, model=model, rng=rng, initial_point=initial_point,
            compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip

    def _intrinsic_noise_multiplier(self) -> float:
        return sgld_intrinsic_noise_multiplier(self.step_size, self.sampling_rate, self.clip_bound)

    def _min_step_size(self, z_target: float) -> float:
        # z_int = 2 q / (C sqrt(eta)) <= z  <=>  eta >= (2 q / (C z))^2
        return (2.0 * self.sampling_rate / (self.clip_bound * z_target)) ** 2

    def _dp_astep(self, q0):
        q = q0.data
        with np.errstate(over="ignore", invalid="ignore"):
            g, frac = self._noisy_gradient(q)  # the one release of the iteration
            q_new = sgld_update(q, g, self.step_size, self.rng)
        return q_new, self._common_stats(q_new, frac)


class DPSGNHT(_SGMCMCStep):
    r"""Differentially private stochastic gradient Nosé-Hoover thermostat (DP-SGNHT).

    Ding et al. (2014), Algorithm 1, with the DP minibatch gradient ``g`` of
    `DPSGLD` (Poisson minibatch, clipped, noised, scaled by ``1 / q``; exact prior
    gradient): momentum ``p``, thermostat ``xi``, diffusion ``A``,

    $$
    \begin{aligned}
    p' &= p - \xi p\,\eta + \hat g\,\eta + \sqrt{2 A \eta}\,N(0, I), \\
    \theta' &= \theta + p'\,\eta, \qquad
    \xi' = \xi + \left(\tfrac{1}{d}\,p'^\top p' - 1\right)\eta .
    \end{aligned}
    $$

    Each chain starts from ``p ~ N(0, I)`` and ``xi = A`` (reset per chain). The thermostat
    absorbs the unknown variance of the minibatch and DP noise in continuous time; the
    discretisation is **biased for every eta > 0** (no accept/reject step, constant
    ``eta``): e.g. on a 1-d Gaussian target of precision ``P`` the stationary variance is
    ``(1 - E[xi (theta - m) p]) / P``, about ``(1 - xi_bar eta / 2) / P``.

    **Privacy** as for `DPSGLD`: given the state, ``p'`` is a data-free function of it
    plus ``(eta / q)(S + noise)``, and ``theta'``, ``xi'`` are functions of ``p'``. The injected
    noise gives ``z_int = q sqrt(2 A / eta) / C``
    (`sgnht_intrinsic_noise_multiplier`), the release is a
    Poisson-subsampled Gaussian with ``z = sqrt(sigma^2 + z_int^2)``. The thermostat is
    published as the ``thermostat`` stat: it is computed from the released positions
    (``p' = (theta' - theta) / eta``) and the data-free start, so it is post-processing.

    The DP-HMC paper's baseline code uses step ``eta_p / n`` (settings ``eta_p = 100`` with
    ``A = 50`` on the banana, ``0.2`` with ``A = 30`` on the Gaussian: ``step_size =
    eta_p / n``, ``diffusion = A`` here), and updates ``theta`` and ``xi`` with the *old*
    momentum; pymc_dp follows Ding et al.'s ordering.

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    privacy : PrivacySettings
        The noise and what it is calibrated to (`PrivacySettings`); the fields this
        step reads:

        - ``clip_bound`` (float): ``C``: each record's log-likelihood gradient (transformed space)
          is clipped to L2 norm ``C``. Choose it from knowledge of the model, not from the data (the
          DP-HMC paper tuned it so that under 20 % of the gradients are clipped).
        - ``noise_multiplier`` (float, optional): ``sigma >= 0``: noise ``N(0, (sigma C)^2 I)``
          added to the clipped minibatch sum. ``0`` relies on the diffusion noise alone (Wang et al.
          2015). Give this, or ``epsilon`` and ``delta`` with the planned ``draws``, ``tune`` and
          ``chains``.
        - ``epsilon``, ``delta`` (float, optional): Target privacy of the whole planned run (all
          chains, warmup included): the total noise multiplier ``z`` is calibrated with
          dp-accounting's PLD accountant for ``(draws + tune) * chains`` Poisson-subsampled Gaussian
          mechanisms (`pymc_dp.accounting.calibrate_poisson_subsampled_noise`), and ``sigma =
          sqrt(max(z^2 - z_int^2, 0))`` is added. When the diffusion noise alone suffices (``sigma =
          0``) the run spends less than the target.
        - ``draws``, ``tune``, ``chains`` (int, optional): The planned run. A chain asked to run
          more than ``draws + tune`` iterations stops with `BudgetExceededError` before it reads the
          data again.
        - ``nonprivate_diagnostics`` (bool): Also emit ``grad_clip_fraction_NONPRIVATE`` (fraction
          of the minibatch whose gradient was clipped), computed from the data WITHOUT noise. Not
          differentially private; the privacy report flags the run.
    step_size : float
        ``eta`` (constant; the bias grows with it).
    batch_size : int, optional
        Expected minibatch size ``b``; the sampling rate is ``q = b / n``. Each record is read
        independently with probability ``q`` (Poisson sampling), so the realised batch size
        varies; it is never published. Give this or ``sampling_rate``.
    sampling_rate : float, optional
        ``q`` in (0, 1] directly.
    likelihood : LikelihoodSettings, optional
        How the records are read (`LikelihoodSettings`); its fields:

        - ``tempering`` (float): Likelihood temperature ``T`` (the clip bound applies to the
          tempered gradients).
        - ``chunk_size`` (int, optional): Records per call of the compiled gradient function
          (bounded memory for large batches).
        - ``data_free_potentials`` (bool): Declare that every ``pm.Potential`` of the model is free
          of the data.
        - ``records`` (pymc_dp.distributed.DaskRecords, optional): The records on a Dask cluster
          (default: the model's data, in memory): the minibatch indices are drawn here (the same
          random stream as in memory), each partition holding some of them evaluates only those rows
          and returns their sum, and the driver combines the partition sums in partition order and
          adds the noise.
    model : pymc.Model, optional
        As for PyMC's step methods.
    rng : numpy Generator or seed, optional
        As for PyMC's step methods.
    initial_point : dict, optional
        As for PyMC's step methods.
    compile_kwargs : dict, optional
        As for PyMC's step methods.
    blocked : bool
        As for PyMC's step methods.
    diffusion : float
        ``A > 0``, the injected noise ``sqrt(2 A eta) N(0, I)`` and the thermostat's start.
    **deprecated
        The keywords above by their former names (``clip_bound=``, ``epsilon=``,
        ``tempering=``, ...), folded into ``privacy`` and ``likelihood``: deprecated,
        kept for the 0.1 releases (docs/api.md).

    Notes
    -----
    Sampler stats: those of `DPSGLD` and ``thermostat`` (``xi`` after the update).
    """

    name = "dp_sgnht"
    stats_dtypes_shapes = {**_SGMCMCStep.stats_dtypes_shapes, "thermostat": (np.float64, [])}

    def __init__(
        self,
        vars=None,
        *,
        privacy: PrivacySettings | None = None,
        step_size: float,
        diffusion: float = 1.0,
        batch_size: int | None = None,
        sampling_rate: float | None = None,
        likelihood: LikelihoodSettings | None = None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
        **deprecated: Any,
    ) -> None:
        self.diffusion = check_positive(diffusion, "diffusion", coerce=True)
        self._state: SGNHTState | None = None
        self._build(
            vars, privacy, likelihood, deprecated, step_size=step_size, batch_size=batch_size,
            sampling_rate=sampling_rate, model=model, rng=rng, initial_point=initial_point,
            compile_kwargs=compile_kwargs, blocked=blocked,
        )  # fmt: skip

    def _intrinsic_noise_multiplier(self) -> float:
        return sgnht_intrinsic_noise_multiplier(
            self.step_size, self.sampling_rate, self.clip_bound, self.diffusion
        )

    def _min_step_size(self, z_target: float) -> float:
        # z_int = q sqrt(2 A / eta) / C <= z  <=>  eta >= 2 A (q / (C z))^2
        return 2.0 * self.diffusion * (self.sampling_rate / (self.clip_bound * z_target)) ** 2

    def _reset_chain_state(self) -> None:
        # Called at the start of every chain after its rng is set (data-free draw), so the
        # draws do not depend on `cores`.
        self._state = SGNHTState.initial(self._fns.ndim, self.diffusion, self.rng)

    def _dp_astep(self, q0):
        q = q0.data
        with np.errstate(over="ignore", invalid="ignore"):
            g, frac = self._noisy_gradient(q)  # the one release of the iteration
            q_new, self._state = sgnht_update(
                q, self._state, g, self.step_size, self.diffusion, self.rng
            )
        stats = self._common_stats(q_new, frac)
        stats["thermostat"] = float(self._state.xi)
        return q_new, stats


# -- audit runners (one iteration from a fixed state on neighbouring datasets) -------------------


class _ScaledNormals:
    """An rng whose normal draws are scaled: builds the deliberately broken 'noise scaled'
    variants of the audit from the step's own kernels."""

    def __init__(self, rng: np.random.Generator, scale: float) -> None:
        self._rng, self._scale = rng, scale

    def normal(self, *args, **kwargs):
        return self._scale * self._rng.normal(*args, **kwargs)


def _minibatch_sums(fns_d, fns_d2, q, clip_bound: float, clip: bool):
    """Per-record clipped gradients at ``q`` of both datasets, as (n, d) arrays."""

    def clipped(fns):
        g = np.asarray(fns.per_record_grad(q), dtype=float)
        if not clip:
            return g
        norm = np.sqrt(np.sum(g * g, axis=1))
        scale = np.where(
            np.isfinite(norm), np.minimum(1.0, clip_bound / np.maximum(norm, 1e-300)), 0
        )
        return np.where(np.isfinite(g), g, 0.0) * scale[:, None]

    return {False: clipped(fns_d), True: clipped(fns_d2)}


def _runner(fns_d, fns_d2, q, *, clip_bound, sampling_rate, noise_multiplier, update, noise_scale,
            clip):  # fmt: skip
    q = np.asarray(q, dtype=float)
    per_record = _minibatch_sums(fns_d, fns_d2, q, clip_bound, clip)
    _, g_prior = fns_d.prior_logp_and_grad(q)
    noise_std = noise_multiplier * clip_bound

    def run(on_d2: bool, trials: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        g_i = per_record[on_d2]
        mask = rng.uniform(size=(trials, g_i.shape[0])) < sampling_rate  # Poisson sampling
        r = _ScaledNormals(rng, noise_scale) if noise_scale != 1.0 else rng
        g = noisy_gradient(mask @ g_i, g_prior, sampling_rate, noise_std, r)
        return update(np.broadcast_to(q, g.shape), g, r)

    return run


def sgld_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    *,
    clip_bound: float,
    step_size: float,
    sampling_rate: float,
    noise_multiplier: float = 0.0,
    noise_scale: float = 1.0,
    clip: bool = True,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPSGLD iteration from ``q`` on neighbouring datasets D and D' (for the audit).

    ``fns_d``, ``fns_d2`` are `pymc_dp.records.RecordFunctions` of the two datasets.
    Vectorised over trials: Poisson masks, the real clipped per-record gradients, the step's
    kernels (`noisy_gradient`,
    `sgld_update`). Published output: the new position
    (coordinate 0). The claim to audit is one Poisson-subsampled Gaussian with
    ``z = sqrt(noise_multiplier^2 + z_int^2)`` and ``q = sampling_rate``. ``noise_scale``
    (all Gaussian noise scaled, diffusion included) and ``clip=False`` build deliberately
    broken variants the audit must catch.
    """

    def update(theta, g, r):
        return {"theta0": sgld_update(theta, g, step_size, r)[:, 0]}

    return _runner(
        fns_d, fns_d2, q, clip_bound=clip_bound, sampling_rate=sampling_rate,
        noise_multiplier=noise_multiplier, update=update, noise_scale=noise_scale, clip=clip,
    )  # fmt: skip


def sgnht_runner(
    fns_d,
    fns_d2,
    q: np.ndarray,
    p: np.ndarray,
    *,
    clip_bound: float,
    step_size: float,
    diffusion: float,
    sampling_rate: float,
    noise_multiplier: float = 0.0,
    xi: float | None = None,
    noise_scale: float = 1.0,
    clip: bool = True,
) -> Callable[[bool, int, np.random.Generator], dict[str, np.ndarray]]:
    """One DPSGNHT iteration from ``(q, p, xi)`` on D and D' (for the audit).

    As `sgld_runner`, with `sgnht_update`; ``xi``
    defaults to ``diffusion`` (the chain's start). Published outputs: the new position
    (coordinate 0) and the thermostat.
    """
    xi0 = float(diffusion if xi is None else xi)

    def update(theta, g, r):
        state = SGNHTState(np.broadcast_to(p, g.shape), np.full(g.shape[0], xi0))
        theta_new, st = sgnht_update(theta, state, g, step_size, diffusion, r)
        return {"theta0": theta_new[:, 0], "thermostat": st.xi}

    return _runner(
        fns_d, fns_d2, q, clip_bound=clip_bound, sampling_rate=sampling_rate,
        noise_multiplier=noise_multiplier, update=update, noise_scale=noise_scale, clip=clip,
    )  # fmt: skip
