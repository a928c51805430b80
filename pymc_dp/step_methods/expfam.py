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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pymc as pm

from pymc_dp.accounting import GaussianEvent, calibrate_noise_multiplier
from pymc_dp.expfam import ExpFamilyModel, find_expfam_structure
from pymc_dp.kernels.expfam import expfam_log_acceptance, expfam_noise_std
from pymc_dp.kernels.penalty import accept
from pymc_dp.step_methods.base import (
    NONPRIVATE_SUFFIX,
    DPStep,
    ScaleAdaptation,
    check_positive,
    check_target,
    make_plan,
    n_records_of,
)

__all__ = ["DPExpFamilyPenalty"]

_PROPOSALS = ("gaussian", "coordinate", "guided")
_TARGET_ACCEPT = {"gaussian": 0.234, "coordinate": 0.44, "guided": 0.44}


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
    `pymc_dp.expfam.SUPPORTED_FORMS`): a Normal likelihood whose mean is affine in
    covariates (with a scale that may be unknown), or, without covariates, Normal, Bernoulli,
    Binomial (known trials), Poisson, Exponential, Gamma (known shape), Categorical, MvNormal
    (known covariance). Other models are refused with
    `ModelNotSupportedError`.

    Parameters
    ----------
    vars : list, optional
        Value variables to sample (default: all free variables of the model).
    data_bounds : dict, optional
        Public bounds of one record, ``{"y": (lo, hi), "X": (lo, hi)}`` (``"y"`` or the
        observed variable's name; ``"X"`` or a covariate's ``pm.Data`` name; bounds may be
        arrays matching a row). The clip bound ``C`` on ``||T(x_i)||`` is derived from this
        box (no privacy cost). Bernoulli, Binomial and Categorical need no box.
    stat_clip_bound : float, optional
        ``C`` given directly (instead of ``data_bounds``).
    noise_multiplier : float, optional
        ``z`` (noise std over sensitivity). Give either this or ``epsilon``/``delta`` with the
        planned ``draws``, ``tune`` and ``chains``.
    epsilon, delta : float, optional
        Target privacy of the whole planned run (all chains, warmup included).
    draws, tune, chains : int, optional
        The planned run; a chain may not run longer (it stops before reading the data again).
    proposal : {"gaussian", "coordinate", "guided"}
        As in `DPPenaltyMetropolis`.
    proposal_scale : float or array
        Per-coordinate proposal std (transformed space).
    scaling : float
        Initial global scale, adapted during warmup from the DP accept decisions.
    target_accept : float, optional
        Target acceptance rate of the warmup adaptation.
    chunk_size : int, optional
        Records per chunk of the pass that computes ``S`` (default 100 000).
    data_free_potentials : bool
        Declare that every ``pm.Potential`` of the model is free of the data.
    nonprivate_diagnostics : bool
        Also emit ``clip_fraction_NONPRIVATE``, the fraction of records whose ``T(x_i)`` was
        clipped, computed WITHOUT noise. Not differentially private.
    records : pymc_dp.distributed.DaskRecords, optional
        The records on a Dask cluster (default: the model's data, in memory), keyed by the
        names of the observed variable and the covariate ``pm.Data`` containers: each
        partition computes its clipped statistic sum where it lives, and only the sums reach
        the driver (their sum is ``S``; the partitions are the chunks).
    """

    name = "dp_expfam_penalty"
    remote_records = True
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
        data_bounds: Mapping[str, Any] | None = None,
        stat_clip_bound: float | None = None,
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
        chunk_size: int | None = None,
        data_free_potentials: bool = False,
        nonprivate_diagnostics: bool = False,
        records=None,
        model=None,
        rng=None,
        initial_point=None,
        compile_kwargs=None,
        blocked: bool = True,
    ) -> None:
        # Validate everything before the data is touched.
        if proposal not in _PROPOSALS:
            raise ValueError(f"proposal must be one of {_PROPOSALS}; got {proposal!r}")
        self.proposal = proposal
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
        if chunk_size is not None:
            chunk_size = check_positive("chunk_size", chunk_size, integer=True)
        if (noise_multiplier is None) == (epsilon is None):
            raise ValueError(
                "give exactly one of noise_multiplier or epsilon (with delta, draws, tune, "
                "chains): the noise is set either directly or by a target for a planned run"
            )
        plan = make_plan(draws, tune, chains, epsilon=epsilon)
        if epsilon is not None:
            epsilon, delta = check_target(epsilon, delta)
            z = calibrate_noise_multiplier(epsilon, delta, plan.iterations)
        else:
            z = check_positive("noise_multiplier", noise_multiplier)
            if delta is not None:
                _, delta = check_target(1.0, delta)
        self.noise_multiplier = float(z)
        self.epsilon = epsilon
        self._mu_per_iteration = GaussianEvent(self.noise_multiplier).mu
        self._releases_per_iteration = 1
        self._variance_correction = True
        self._reset_scaling()

        model = pm.modelcontext(model)
        structure = find_expfam_structure(model)  # data-free; refuses unsupported models
        if records is not None:
            # the model holds a stand-in; the records' finiteness is checked by _setup
            structure.n_records = n_records_of(type(self), model, records, nonprivate_diagnostics)
        else:
            structure.check_data_finite()
        if initial_point is None:
            initial_point = model.initial_point()
        self._setup(
            vars,
            model=model,
            rng=rng,
            initial_point=initial_point,
            compile_kwargs=compile_kwargs,
            blocked=blocked,
            tempering=1.0,
            chunk_size=chunk_size,
            data_free_potentials=data_free_potentials,
            plan=plan,
            target_delta=delta,
            nonprivate_diagnostics=nonprivate_diagnostics,
            records=records,
        )
        shared = {v: self.shared[v.name] for v in model.value_vars if v.name in self.shared}
        self._expfam: ExpFamilyModel = structure.compile(
            self.vars, initial_point, shared, compile_kwargs
        )
        if stat_clip_bound is None:
            stat_clip_bound = self._expfam.stat_bound_from_box(data_bounds)
        self.stat_clip_bound = float(stat_clip_bound)
        self.stat_noise_std = expfam_noise_std(self.noise_multiplier, self.stat_clip_bound)
        # -- the one pass over the data: S = sum_i clip_C(T(x_i)) (input of every release) --
        store = None
        if records is not None:  # the response and covariates, in the order of the pass
            keys = records.check_names(self._expfam.record_names())
            store = records.store_for(keys, self._expfam.record_templates())
        self._stat_sum, n_clipped = self._expfam.clipped_stat_sum(
            self.stat_clip_bound,
            chunk_size or 100_000,
            store=store,
            counts=self.nonprivate_diagnostics or records is None,
        )
        self._releases_made = 0
        self._clip_fraction = (
            n_clipped / self._expfam.n_records if self.nonprivate_diagnostics else np.nan
        )
        d = self._fns.ndim
        s = np.broadcast_to(np.asarray(proposal_scale, dtype=float), (d,)).copy()
        if not np.all(np.isfinite(s) & (s > 0)):
            raise ValueError("proposal_scale must be finite and > 0 in every coordinate")
        self.proposal_scale = s
        self._reset_chain_state()

    def released_mu(self) -> float:
        """Privacy-loss parameter of the releases of ``S`` made so far (all chains): the
        data are read once, at construction; every iteration releases ``S`` afresh."""
        return float(self._mu_per_iteration * self._releases_made)

    @property
    def family(self) -> str:
        """Name of the recognised likelihood family (e.g. ``"normal_linear"``)."""
        return self._expfam.family.name

    def _reset_chain_state(self) -> None:
        self._direction = np.ones(self._fns.ndim)
        self._cache = None
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
        noise_std = self.stat_noise_std * float(np.sqrt(d_eta @ d_eta))
        with np.errstate(all="ignore"):
            log_a = expfam_log_acceptance(
                self._stat_sum,
                d_eta,
                self._expfam.n_records * (A1 - A0),
                lp1 - lp0,
                0.0,
                self.stat_noise_std,
                self.rng,
                size=size,
                variance_correction=self._variance_correction,
            )
        return log_a, noise_std

    def _dp_astep(self, q0):
        q = q0.data
        q1, j = self._propose(q)
        # -- the one data access of the iteration: a fresh Gaussian release of S ----------------
        log_a, noise_std = self.log_acceptance(q1, q)
        self._releases_made += 1
        # -- everything below is post-processing of the noisy ratio -----------------------------
        if not np.isfinite(log_a):
            log_a = -np.inf  # NaN (proposal outside the support): reject
        accepted = accept(log_a, self.rng)
        if self.proposal == "guided" and not accepted:
            self._direction[j] = -self._direction[j]
        if self.tune:
            self._adapt_scaling(accepted)
        stats = {
            "accepted": float(accepted),
            "accept": float(np.exp(min(0.0, log_a))),
            "scaling": self.scaling,
            "step_norm": float(np.linalg.norm(q1 - q)),
            "noise_std": noise_std,
            "clip_fraction" + NONPRIVATE_SUFFIX: self._clip_fraction,
        }
        return (q1 if accepted else q), stats
