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
from pymc_dp.kernels.penalty import (
    accept,
    penalty_log_acceptance,
    penalty_noise_std,
    shared_penalty_log_acceptance,
)
from pymc_dp.step_methods.base import NONPRIVATE_SUFFIX, DPStep, ScaleAdaptation, make_plan

__all__ = ["DPPenaltyMetropolis"]

_PROPOSALS = ("gaussian", "coordinate", "guided", "independent")
_TARGET_ACCEPT = {"gaussian": 0.234, "coordinate": 0.44, "guided": 0.44, "independent": 0.44}


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
    proposal : {"gaussian", "coordinate", "guided", "independent"}
        Full-vector Gaussian random walk (default), one coordinate at a time, the guided
        random walk (one coordinate, direction flipped after a rejection; Gustafson 1998,
        Yildirim & Ermis 2019), or an independence proposal
        $\theta' \sim N(m, s^2 \Sigma)$ with ``proposal_mean`` $m$ and ``proposal_cov``
        $\Sigma$ (e.g. a private Laplace approximation; the Hastings ratio
        $\log q(\theta)/q(\theta')$ enters the test, Yildirim & Ermis 2019 Sec. 3).
    proposal_scale : float or array
        Per-coordinate proposal std ``S`` (transformed space).
    proposal_cov : array, optional
        Proposal covariance ``(d, d)`` (transformed space), positive definite: the random
        walk ``gaussian`` then proposes $\theta + s L \xi$ with $L L^T = $ ``proposal_cov``
        (``proposal_scale`` must stay 1), and ``independent`` needs it. Choose it from public
        knowledge or from DP outputs (post-processing), never from the data.
    proposal_mean : array, optional
        Mean ``(d,)`` of the ``independent`` proposal.
    control_variate : tuple (anchor, grad_sum, grad_bound), optional
        A first-order control variate: the test uses
        $\sum_i \mathrm{clip}(r_i - c_i\cdot\Delta\theta) + \tilde G\cdot\Delta\theta$ with
        $c_i$ the per-record gradient at ``anchor`` clipped to ``grad_bound`` and
        $\tilde G$ = ``grad_sum``, which must be a *released* (noisy, accounted) value of
        $\sum_i c_i$, e.g. from the automatic warm start. The clipped residuals have the
        same sensitivity ``2 b ||dtheta||`` as the ratios but are second order in the step,
        so a far smaller ``clip_bound`` leaves them unclipped ([Bardenet2017],
        Sec. 6, Taylor proxies). The chain then targets the posterior tilted by the noise of
        ``grad_sum`` (exactly ``exp(xi . theta)`` with ``xi`` that noise).
    local_moves : float
        With ``proposal="independent"``: the probability that an iteration proposes a
        random-walk move ``theta + (2.38 / sqrt(d)) S xi`` (``S S^T`` = ``proposal_cov``)
        instead, chosen independently of the state (a mixture of two kernels with the same
        target, Tierney 1994): the chain still moves where the independence proposal fits its
        target poorly. Default 0.
    control_variate_basis : array, optional
        ``L`` ``(d, d)``, invertible, public (e.g. a whitening from DP outputs): the control
        variate's gradients are ``c_i = clip(L^{-1} g_i)`` and its step ``L^T dtheta``, so
        ``c_i . L^T dtheta = g_i . dtheta`` before clipping; ``grad_sum`` must be the released
        sum of those ``c_i``. Default the identity.
    reparametrization : object, optional
        A data-free bijection ``y = T(theta)`` (e.g. `pymc_dp.auto.recentre.Recentring`:
        methods ``forward_with_log_det``, ``inverse``, ``log_det_jacobian``,
        ``gradient_map``) in whose coordinates the proposal works: ``y' = y + ...`` for the
        walks, ``y' ~ N(m, s^2 Sigma)`` for ``independent`` (``proposal_mean`` and
        ``proposal_cov`` are then in ``y``), and ``theta' = T^{-1}(y')``. The Hastings ratio gains
        ``log |det J(theta)| - log |det J(theta')|`` (the proposal's density in ``theta``),
        so the chain still targets the posterior of ``theta``. With ``control_variate`` the
        linearisation is in ``y`` too: ``c_i`` are the per-record gradients in ``y`` at the
        anchor (``J^{-T}`` applied before clipping) and the step is ``T(theta') - T(theta)``;
        ``grad_sum`` must then be the released sum of those ``c_i``.
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
    records : pymc_dp.distributed.DaskRecords, optional
        The records on a Dask cluster (default: the model's data, in memory). With data
        owners (``DaskRecords(..., owners=...)``) the step runs the data-sharing scheme of
        Yildirim & Ermis (2019), Sec. 3.2.2, Algorithm 2: each of the ``K`` owners adds
        its own ``N(0, sigma^2)`` to its own clipped sum, the test's penalty correction is
        ``K sigma^2 / 2`` and ``noise_std`` is the total ``sqrt(K) sigma``; each owner's
        privacy against the curator and the other owners is that of the central scheme at
        the same ``z`` (``dp_owners`` records ``K``).
    """

    name = "dp_penalty_metropolis"
    remote_records = True
    data_sharing = True
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
        proposal_cov=None,
        proposal_mean=None,
        control_variate=None,
        control_variate_basis=None,
        local_moves: float = 0.0,
        reparametrization=None,
        scaling: float = 1.0,
        target_accept: float | None = None,
        tempering: float = 1.0,
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
        self.clip_bound = check_positive(clip_bound, "clip_bound", coerce=True)
        if proposal not in _PROPOSALS:
            raise ValueError(f"proposal must be one of {_PROPOSALS}; got {proposal!r}")
        self.proposal = proposal
        try:
            self.local_moves = float(local_moves)
        except (TypeError, ValueError):
            self.local_moves = float("nan")
        if not 0.0 <= self.local_moves < 1.0:
            raise ValueError(f"local_moves must be a probability in [0, 1); got {local_moves!r}")
        if self.local_moves and proposal != "independent":
            raise ValueError("local_moves goes with proposal='independent'")
        self._local = False
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
            records=records,
        )
        self.proposal_scale = check_positive_vector(
            proposal_scale, "proposal_scale", self._fns.ndim
        )
        self._chol, self.proposal_mean = _check_proposal_shape(
            proposal, proposal_cov, proposal_mean, self.proposal_scale, self._fns.ndim
        )
        self.control_variate = _check_control_variate(control_variate, self._fns.ndim)
        self.reparametrization = reparametrization
        self.local_scaling = 2.38 / np.sqrt(self._fns.ndim)
        self._cv_map, self._cv_dir = _control_variate_maps(
            self.control_variate, control_variate_basis, reparametrization, self._fns.ndim
        )
        self._reset_chain_state()

    def _reset_chain_state(self) -> None:
        d = self._fns.ndim
        self._direction = np.ones(d)
        self._reset_scaling()

    def _propose(self, q: np.ndarray) -> tuple[np.ndarray, int | None]:
        """A proposal in the sampler's coordinates (``y`` with a reparametrization)."""
        d = q.size
        if self.proposal == "independent":
            if self.local_moves and self.rng.uniform() < self.local_moves:
                # a random-walk move with the same covariance (a mixture of two kernels that
                # each keep the target, chosen independently of the state)
                self._local = True
                return q + self.local_scaling * (self._chol @ self.rng.normal(size=d)), None
            self._local = False
            return self.proposal_mean + self.scaling * (self._chol @ self.rng.normal(size=d)), None
        if self.proposal == "gaussian":
            if self._chol is not None:
                return q + self.scaling * (self._chol @ self.rng.normal(size=d)), None
            return q + self.scaling * self.proposal_scale * self.rng.normal(size=d), None
        j = int(self.rng.integers(d))
        step = self.scaling * self.proposal_scale[j] * self.rng.normal()
        if self.proposal == "guided":
            step = self._direction[j] * abs(step)
        q1 = q.copy()
        q1[j] += step
        return q1, j

    def _log_q_ratio(self, q: np.ndarray, q1: np.ndarray) -> float:
        """``log q(q | q1) - log q(q1 | q)`` in the proposal's coordinates: 0 for the
        symmetric walks (data-free)."""
        if self.proposal != "independent" or self._local:
            return 0.0
        w0 = np.linalg.solve(self._chol, q - self.proposal_mean) / self.scaling
        w1 = np.linalg.solve(self._chol, q1 - self.proposal_mean) / self.scaling
        return float(0.5 * (w1 @ w1 - w0 @ w0))

    def _dp_astep(self, q0):
        q = q0.data
        rp = self.reparametrization
        if rp is None:
            q1, j = self._propose(q)
            log_q = self._log_q_ratio(q, q1)
            dy = q1 - q
        else:
            # propose in y = T(q); the proposal's density in q carries |det J| (change of
            # variables), so the chain still targets the posterior of q
            y, log_det = rp.forward_with_log_det(q)
            y1, j = self._propose(y)
            q1 = rp.inverse(y1)
            log_q = self._log_q_ratio(y, y1) + log_det - rp.log_det_jacobian(q1)
            dy = y1 - y
        norm = float(np.linalg.norm(q1 - q))
        bound = self.clip_bound * norm
        lp0 = self._prior_logp(q)
        lp1 = self._fns.prior_logp(q1)
        sigma = penalty_noise_std(self.noise_multiplier, self.clip_bound, norm)
        # -- the one data access of the iteration: a Gaussian mechanism ------------------------
        if self._owners:  # data-sharing: every owner adds its own noise (Algorithm 2)
            noisy = self._fns.shared_clipped_loglik_ratio_sum(q1, q, bound, sigma)
            log_a = shared_penalty_log_acceptance(noisy, lp1 - lp0, log_q, sigma, self._owners)
            n_clipped, sigma = np.nan, float(np.sqrt(self._owners) * sigma)
        else:
            if self.control_variate is None:
                llr, n_clipped = self._fns.clipped_loglik_ratio_sum(q1, q, bound)
            else:
                anchor, grad_sum, grad_bound = self.control_variate
                dc = dy if self._cv_dir is None else self._cv_dir @ dy
                llr, n_clipped = self._fns.clipped_residual_ratio_sum(
                    q1, q, bound, anchor, grad_bound, self._cv_map, dc
                )
                llr += float(grad_sum @ dc)  # post-processing of a released sum
            log_a = penalty_log_acceptance(llr, lp1 - lp0, log_q, sigma, self.rng)
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


def _check_proposal_shape(proposal, cov, mean, scale, d):
    """Cholesky factor of ``proposal_cov`` and the independence mean, validated."""
    if cov is None:
        if proposal == "independent" or mean is not None:
            raise ValueError(
                "proposal='independent' needs proposal_cov=(d, d) and proposal_mean=(d,); "
                "proposal_mean goes only with proposal='independent'"
            )
        return None, None
    if proposal not in ("gaussian", "independent"):
        raise ValueError(
            f"proposal_cov goes with proposal='gaussian' or 'independent'; got {proposal!r}"
        )
    if np.any(scale != 1.0):
        raise ValueError("give proposal_cov or proposal_scale, not both")
    cov = np.asarray(cov, dtype=float)
    if cov.shape != (d, d) or not np.all(np.isfinite(cov)) or not np.allclose(cov, cov.T):
        raise ValueError(f"proposal_cov must be a finite symmetric ({d}, {d}) matrix")
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        raise ValueError("proposal_cov must be positive definite") from None
    if proposal == "gaussian":
        if mean is not None:
            raise ValueError("proposal_mean goes only with proposal='independent'")
        return chol, None
    mean = np.asarray(mean, dtype=float) if mean is not None else None
    if mean is None or mean.shape != (d,) or not np.all(np.isfinite(mean)):
        raise ValueError(f"proposal='independent' needs a finite proposal_mean of shape ({d},)")
    return chol, mean


def _control_variate_maps(cv, basis, rp, d):
    """``(M, D)``: the control variate's gradients ``M g_i`` and steps ``D dy`` (public)."""
    if basis is None:
        m = None if (rp is None or cv is None) else rp.gradient_map(cv[0])
        return m, None
    if cv is None:
        raise ValueError("control_variate_basis goes with control_variate")
    basis = np.asarray(basis, dtype=float)
    if basis.shape != (d, d) or not np.all(np.isfinite(basis)):
        raise ValueError(f"control_variate_basis must be a finite ({d}, {d}) matrix")
    try:
        m = np.linalg.inv(basis)
    except np.linalg.LinAlgError:
        raise ValueError("control_variate_basis must be invertible") from None
    if rp is not None:
        m = m @ rp.gradient_map(cv[0])
    return m, basis.T


def _check_control_variate(cv, d):
    """``(anchor, grad_sum, grad_bound)`` validated, or None."""
    if cv is None:
        return None
    try:
        anchor, grad_sum, grad_bound = cv
    except (TypeError, ValueError):
        raise ValueError("control_variate must be (anchor, grad_sum, grad_bound)") from None
    anchor = np.asarray(anchor, dtype=float)
    grad_sum = np.asarray(grad_sum, dtype=float)
    if anchor.shape != (d,) or grad_sum.shape != (d,):
        raise ValueError(f"control_variate: anchor and grad_sum must have shape ({d},)")
    if not (np.all(np.isfinite(anchor)) and np.all(np.isfinite(grad_sum))):
        raise ValueError("control_variate: anchor and grad_sum must be finite")
    return anchor, grad_sum, check_positive(grad_bound, "control_variate grad_bound", coerce=True)
