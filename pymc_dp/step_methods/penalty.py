"""DPPenaltyMetropolis: the DP penalty algorithm as a PyMC step.

References
----------
.. [1] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves.
   Statistics and Computing 29(5), 947-963. [YildirimErmis2019]
.. [2] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Sec. 3.1, Theorems 6-7. [Raisa2021]
.. [3] Räisä, Koskela, Honkela. Differentially Private Hamiltonian Monte Carlo, Sec. 3.
"""

from __future__ import annotations

import numpy as np

from pymc_dp._validation import (
    check_positive,
    check_positive_vector,
    check_unit_interval,
    resolve_noise_or_target,
)
from pymc_dp.accounting import GaussianEvent, calibrate_noise_multiplier
from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std
from pymc_dp.step_methods.base import NONPRIVATE_SUFFIX, DPStep, ScaleAdaptation, make_plan

__all__ = ["DPPenaltyMetropolis"]

_PROPOSALS = ("gaussian", "coordinate", "guided")
_TARGET_ACCEPT = {"gaussian": 0.234, "coordinate": 0.44, "guided": 0.44}


class DPPenaltyMetropolis(ScaleAdaptation, DPStep):
    r"""Differentially private random-walk Metropolis with the penalty test.

    Each iteration proposes $\theta' = \theta + s\,S \odot \xi$ (full vector, one
    coordinate, or a guided one-coordinate walk), computes the per-record log-likelihood
    ratios $r_i = \log p(x_i|\theta') - \log p(x_i|\theta)$ clipped to
    $\pm b\|\theta'-\theta\|_2$, and accepts if

    $$
    \log u < \sum_i \mathrm{clip}(r_i) + \xi + \log\frac{p(\theta')}{p(\theta)}
    + \log\frac{q(\theta|\theta')}{q(\theta'|\theta)} - \frac{\sigma^2}{2},
    \quad \xi \sim N(0, \sigma^2),\ \sigma = z\,2b\,\|\theta'-\theta\|_2
    $$

    (Yildirim & Ermis 2019; thesis Sec. 3.1). Each iteration is one Gaussian mechanism with
    privacy-loss parameter $\mu = 1/(2z^2)$ under replace-one neighbours (thesis
    Theorem 7); a run of $k$ iterations over all chains composes to
    $\mu = k/(2z^2)$ (Sommer et al. 2019, Lemma 12). With clipping inactive the chain is
    exact (the penalty correction).

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    clip_bound : float
        ``b``: per-record log-likelihood ratios are clipped to ``+-b ||theta' - theta||``.
        Choose it from knowledge of the model (e.g. a Lipschitz bound of the log-likelihood),
        not by looking at the data: tuning it on the private data costs privacy.
    noise_multiplier : float, optional
        ``z`` (noise std over sensitivity). Give either this or ``epsilon``/``delta`` with the
        planned ``draws``, ``tune`` and ``chains``.
    epsilon, delta : float, optional
        Target privacy of the whole planned run (all chains, warmup included); ``z`` is
        calibrated so that the run's epsilon never exceeds the target.
    draws, tune, chains : int, optional
        The planned run. A chain asked to run more than ``draws + tune`` iterations stops with
        `BudgetExceededError` before it reads the data again.
    proposal : {"gaussian", "coordinate", "guided"}
        Full-vector Gaussian random walk (default), one coordinate at a time, or the guided
        random walk (one coordinate, direction flipped after a rejection; Gustafson 1998,
        Yildirim & Ermis 2019).
    proposal_scale : float or array
        Per-coordinate proposal std ``S`` (transformed space).
    scaling : float
        Initial global scale ``s``; adapted during warmup from the acceptance decisions only
        (post-processing of DP outputs) toward ``target_accept``.
    target_accept : float, optional
        Target acceptance rate of the warmup adaptation (default 0.234 for full-vector
        proposals, 0.44 for one-coordinate proposals).
    tempering : float
        Likelihood temperature ``T`` (thesis Sec. 3.2).
    chunk_size : int, optional
        Records per call of the compiled likelihood (bounded memory for large ``n``).
    data_free_potentials : bool
        Declare that every ``pm.Potential`` of the model is free of the data.
    nonprivate_diagnostics : bool
        Also emit ``clip_fraction_NONPRIVATE``, the fraction of clipped ratios, computed from
        the data WITHOUT noise. Not differentially private; the privacy report flags the run.
    """

    name = "dp_penalty_metropolis"
    stats_dtypes_shapes = {
        **DPStep.stats_dtypes_shapes,
        "accept": (np.float64, []),
        "scaling": (np.float64, []),
        "step_norm": (np.float64, []),
        "noise_std": (np.float64, []),
        "clip_fraction" + NONPRIVATE_SUFFIX: (np.float64, []),
    }

    def __init__(
        self,
        vars=None,
        *,
        clip_bound: float,
        noise_multiplier: float | None = None,
        epsilon: float | None = None,
        delta: float | None = None,
        draws: int | None = None,
        tune: int | None = None,
        chains: int | None = None,
        proposal: str = "gaussian",
        proposal_scale=1.0,
        scaling: float = 1.0,
        target_accept: float | None = None,
        tempering: float = 1.0,
        chunk_size: int | None = None,
        data_free_potentials: bool = False,
        nonprivate_diagnostics: bool = False,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
    ) -> None:
        # Validate everything before the data is touched.
        self.clip_bound = check_positive(clip_bound, "clip_bound", coerce=True)
        if proposal not in _PROPOSALS:
            raise ValueError(f"proposal must be one of {_PROPOSALS}; got {proposal!r}")
        self.proposal = proposal
        self.scaling = check_positive(scaling, "scaling", coerce=True)
        self.target_accept = check_unit_interval(
            _TARGET_ACCEPT[proposal] if target_accept is None else target_accept, "target_accept"
        )
        z, plan, epsilon, delta = resolve_noise_or_target(
            epsilon,
            delta,
            noise_given=noise_multiplier is not None,
            message="give exactly one of noise_multiplier or epsilon (with delta, draws, tune, "
            "chains): the noise is set either directly or by a target for a planned run",
            plan=lambda: make_plan(draws, tune, chains, epsilon=epsilon),
            noise=lambda: check_positive(noise_multiplier, "noise_multiplier", coerce=True),
            calibrate=lambda run, eps, d: calibrate_noise_multiplier(eps, d, run.iterations),
        )
        self.noise_multiplier = float(z)
        self.epsilon = epsilon
        self._mu_per_iteration = GaussianEvent(self.noise_multiplier).mu
        self._releases_per_iteration = 1
        self._reset_scaling()
        self._setup(
            vars,
            model=model,
            rng=rng,
            initial_point=initial_point,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            tempering=tempering,
            chunk_size=chunk_size,
            data_free_potentials=data_free_potentials,
            plan=plan,
            target_delta=delta,
            nonprivate_diagnostics=nonprivate_diagnostics,
        )
        self.proposal_scale = check_positive_vector(
            proposal_scale, "proposal_scale", self._fns.ndim
        )
        self._reset_chain_state()

    def _reset_chain_state(self) -> None:
        d = self._fns.ndim
        self._direction = np.ones(d)
        self._reset_scaling()

    def _propose(self, q: np.ndarray) -> tuple[np.ndarray, int | None]:
        d = q.size
        if self.proposal == "gaussian":
            return q + self.scaling * self.proposal_scale * self.rng.normal(size=d), None
        j = int(self.rng.integers(d))
        step = self.scaling * self.proposal_scale[j] * self.rng.normal()
        if self.proposal == "guided":
            step = self._direction[j] * abs(step)
        q1 = q.copy()
        q1[j] += step
        return q1, j

    def _dp_astep(self, q0):
        q = q0.data
        q1, j = self._propose(q)
        norm = float(np.linalg.norm(q1 - q))
        bound = self.clip_bound * norm
        lp0 = self._prior_logp(q)
        lp1 = self._fns.prior_logp(q1)
        # -- the one data access of the iteration: a Gaussian mechanism ------------------------
        llr, n_clipped = self._fns.clipped_loglik_ratio_sum(q1, q, bound)
        sigma = penalty_noise_std(self.noise_multiplier, self.clip_bound, norm)
        log_a = penalty_log_acceptance(llr, lp1 - lp0, 0.0, sigma, self.rng)
        # -- everything below is post-processing of the noisy ratio -----------------------------
        accepted = accept(log_a, self.rng)
        if self.proposal == "guided" and not accepted:
            self._direction[j] = -self._direction[j]
        self._remember_prior(q1 if accepted else q, lp1 if accepted else lp0)
        if self.tune:
            self._adapt_scaling(accepted)
        stats = {
            "accepted": float(accepted),
            "accept": float(np.exp(min(0.0, log_a))) if np.isfinite(log_a) else 0.0,
            "scaling": self.scaling,
            "step_norm": norm,
            "noise_std": sigma,
            "clip_fraction" + NONPRIVATE_SUFFIX: n_clipped / self._fns.n_records,
        }
        return (q1 if accepted else q), stats
