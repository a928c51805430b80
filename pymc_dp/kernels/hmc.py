"""Pure-numpy pieces of DP-HMC: one transition, the noisy clipped leapfrog, warmup adaptation.

Never imports PyMC; every random draw comes from a ``numpy.random.Generator`` passed in.

The sign convention is that of a *log density*: ``grad_fn(q)`` returns the gradient of the
log target ``log pi(q) = -U(q)``, so a momentum half step is ``p <- p + (h/2) (g(q) + xi)``
(the paper writes ``p - s grad U``; DP-HMC paper Sec. 2.2 and eq. (1)).

References
----------
.. [1] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte
   Carlo. Algorithm 1 and Theorem 3.5; Sec. 3, eq. (1). [DPHMC]
.. [2] Neal, R. M. (2011). MCMC using Hamiltonian dynamics. Handbook of MCMC, ch. 5.
.. [3] Hoffman, M. D. and Gelman, A. (2014). The No-U-Turn sampler. JMLR 15,
   Sec. 3.2 (dual averaging of the step size).
.. [4] Owen, A. B. (2017). A randomized Halton algorithm in R. arXiv:1706.02808;
   Hoffman, Radul and Sountsov (2021), ChEES-HMC (Halton step-size jitter).
.. [5] Stan Reference Manual, "HMC algorithm parameters": windowed warmup adaptation of a
   diagonal metric.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from scipy.stats import qmc

from pymc_dp._validation import check_positive, check_target, check_unit_interval
from pymc_dp.accounting import GaussianEvent, gaussian_epsilon, gaussian_mu_for_epsilon
from pymc_dp.accounting.calibration import Nudge, calibrate
from pymc_dp.kernels.penalty import (
    accept,
    penalty_log_acceptance,
    penalty_noise_std,
    shared_penalty_log_acceptance,
)

__all__ = [
    "DPHMCInfo",
    "DiagonalMassAdaptation",
    "MAX_ENERGY_CHANGE",
    "calibrate_dphmc_noise",
    "dphmc_mu_per_iteration",
    "dphmc_transition",
    "DualAveraging",
    "HaltonSequence",
    "LeapfrogResult",
    "gradient_noise_std",
    "kinetic_energy",
    "noisy_leapfrog",
    "sample_momentum",
    "warmup_windows",
]


# -- Hamiltonian pieces -------------------------------------------------------------------------
def _norm(v: np.ndarray) -> float:
    """``||v||_2`` of a 1-D float array: `numpy.linalg.norm`'s own computation for one
    (``sqrt(v . v)``, the same bits) without its generic layers (issue 28)."""
    return math.sqrt(float(v.dot(v)))


def kinetic_energy(p: np.ndarray, inv_mass: np.ndarray) -> float:
    """Kinetic energy ``K(p) = p^T M^{-1} p / 2`` for a diagonal mass matrix.

    Parameters
    ----------
    p : ndarray, shape (d,)
        Momentum.
    inv_mass : ndarray, shape (d,)
        Diagonal of ``M^{-1}``.
    """
    return 0.5 * float(np.dot(p * inv_mass, p))


def sample_momentum(mass: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Draw ``p ~ N(0, M)`` for a diagonal mass matrix ``M = diag(mass)``."""
    return rng.standard_normal(mass.shape[0]) * np.sqrt(mass)


def gradient_noise_std(noise_multiplier: float, clip_bound: float) -> float:
    """Per-coordinate std ``sigma_g = z_g * 2 b_g`` of the gradient noise.

    ``sum_i clip_{b_g}(grad l_i)`` has L2 sensitivity ``2 b_g`` under replace-one neighbours,
    so each noisy gradient is a Gaussian mechanism with privacy-loss parameter
    ``mu = 1 / (2 z_g^2)`` (DP-HMC paper, Algorithm 1 and Theorem 3.5).
    """
    return noise_multiplier * 2.0 * clip_bound


@dataclass(frozen=True)
class LeapfrogResult:
    """End point of a (noisy) leapfrog trajectory.

    Attributes
    ----------
    q, p : ndarray
        Position and momentum after ``n_steps`` steps (momentum *not* negated: the kinetic
        energy is symmetric, so the negation of the paper's proposal changes nothing here).
    n_grad : int
        Number of gradient evaluations (``n_steps + 1``), each one a release when noisy.
    """

    q: np.ndarray
    p: np.ndarray
    n_grad: int


def noisy_leapfrog(
    q: np.ndarray,
    p: np.ndarray,
    step_size: float,
    n_steps: int,
    grad_fn: Callable[[np.ndarray], np.ndarray],
    inv_mass: np.ndarray,
    noise_std: float,
    rng: np.random.Generator | None,
) -> LeapfrogResult:
    r"""Leapfrog integration with a noisy gradient at every momentum update.

    Implements the noisy clipped leapfrog of DP-HMC (paper eq. (1); Algorithm 1, inner
    loop)

    $$
    l = l_{p_{\eta/2}} \circ l_\theta \circ l_{p_\eta} \circ \cdots \circ
    l_{p_\eta} \circ l_\theta \circ l_{p_{\eta/2}}, \quad
    l_{p_s}(\theta, p) = (\theta, p + s\,(g(\theta) + \xi)), \quad
    l_\theta(\theta, p) = (\theta + \eta M^{-1} p, p)
    $$

    with a fresh $\xi \sim N(0, \sigma_g^2 I)$ at each of the ``n_steps + 1``
    gradient evaluations. The first noisy gradient of a trajectory is always drawn here,
    never taken from a previous trajectory (paper, remark after Theorem 3.5: reusing it
    would make the next iteration depend on this iteration's noise); ``grad_fn`` itself may
    return a noise-free value it kept (a deterministic function of the point, e.g.
    `pymc_dp.records.GradSumMemo`), to which the fresh noise is added as to any other.

    Parameters
    ----------
    q, p : ndarray, shape (d,)
        Start position and momentum (not modified).
    step_size : float
        ``eta`` (> 0).
    n_steps : int
        Number of leapfrog steps ``L`` (>= 1).
    grad_fn : callable
        ``grad_fn(q)`` returns the gradient of the log target at ``q`` (for DP-HMC the
        clipped per-record sum plus the exact prior gradient).
    inv_mass : ndarray, shape (d,)
        Diagonal of ``M^{-1}``.
    noise_std : float
        ``sigma_g >= 0``; with 0 no noise is drawn and the integrator is the ordinary,
        deterministic, reversible leapfrog.
    rng : numpy.random.Generator
        Source of the gradient noise (may be ``None`` only when ``noise_std == 0``).

    Returns
    -------
    LeapfrogResult
    """
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1; got {n_steps!r}")
    d = q.shape[0]
    # the n_steps + 1 noise vectors in one draw: the same numbers as one draw of d per
    # gradient, in the same order (a Generator's normal draws are sequential and nothing
    # else draws from ``rng`` during the trajectory), in one call instead of n_steps + 1
    noise = noise_std * rng.standard_normal((n_steps + 1, d)) if noise_std > 0.0 else None

    def grad(x: np.ndarray, i: int) -> np.ndarray:
        g = grad_fn(x)
        return g if noise is None else g + noise[i]

    half = 0.5 * step_size
    q = q.copy()
    p = p + half * grad(q, 0)
    for i in range(n_steps):
        q = q + step_size * (inv_mass * p)
        if i < n_steps - 1:
            p = p + step_size * grad(q, i + 1)
    p = p + half * grad(q, n_steps)
    return LeapfrogResult(q=q, p=p, n_grad=n_steps + 1)


# -- step-size jitter ---------------------------------------------------------------------------
# -- calibration of the two noise multipliers for a run target -----------------------------------
#: Relative safety margin of the calibration against rounding in the report's sum of the
#: per-iteration mu over (up to ~1e6) iterations.
_MU_MARGIN = 1e-9
_MAX_NUDGES = 200


def calibrate_dphmc_noise(
    epsilon: float,
    delta: float,
    iterations: int,
    n_leapfrog: int,
    grad_budget_fraction: float = 0.5,
) -> tuple[float, float]:
    r"""Noise multipliers ``(z_l, z_g)`` of DP-HMC for a target (epsilon, delta).

    A run of ``k`` iterations (all chains, warmup included) with ``L`` leapfrog steps has
    total privacy-loss parameter (DP-HMC paper Theorem 3.5 [DPHMC])

    $$
    \mu = \frac{k}{2 z_l^2} + \frac{k (L + 1)}{2 z_g^2}.
    $$

    The largest $\mu^*$ with $\epsilon(\mu^*, \delta) \le \epsilon$ (tight
    Gaussian bound, `gaussian_mu_for_epsilon`) is split: a
    fraction ``f = grad_budget_fraction`` goes to the ``k (L + 1)`` gradient releases and
    ``1 - f`` to the ``k`` log-likelihood-ratio releases, i.e.
    $z_g = \sqrt{k (L + 1) / (2 f \mu^*)}$, $z_l = \sqrt{k / (2 (1 - f) \mu^*)}$.
    Both are then nudged up until the run's epsilon (with a ``1e-9`` relative margin on
    ``mu`` for rounding in the report's sum) is at most the target.

    Parameters
    ----------
    epsilon, delta : float
        Target of the whole run.
    iterations : int
        ``k``: iterations over all chains, warmup included.
    n_leapfrog : int
        ``L``.
    grad_budget_fraction : float
        ``f`` in (0, 1).

    Returns
    -------
    (float, float)
        ``(z_l, z_g)``.
    """
    eps, d = check_target(epsilon, delta)
    k = check_positive(iterations, "iterations", integer=True, coerce=True)
    n_grad = check_positive(n_leapfrog, "n_leapfrog", integer=True, coerce=True) + 1
    f = check_unit_interval(grad_budget_fraction, "grad_budget_fraction")
    mu_star = gaussian_mu_for_epsilon(eps, d)
    z_l = math.sqrt(k / (2.0 * (1.0 - f) * mu_star))
    z_g = math.sqrt(k * n_grad / (2.0 * f * mu_star))

    def run_epsilon(zs: tuple[float, float]) -> float:
        mu = k * dphmc_mu_per_iteration(zs[0], zs[1], n_grad - 1)
        return gaussian_epsilon(mu * (1.0 + _MU_MARGIN), d)

    return calibrate(
        run_epsilon, eps, Nudge((z_l, z_g), 1.0 + 1e-12, _MAX_NUDGES, "calibrate_dphmc_noise")
    )


def dphmc_mu_per_iteration(z_l: float, z_g: float, n_leapfrog: int) -> float:
    """``1 / (2 z_l^2) + (L + 1) / (2 z_g^2)`` (DP-HMC paper Theorem 3.5, one iteration)."""
    return GaussianEvent(z_l).mu + GaussianEvent(z_g, n_leapfrog + 1).mu


#: Noisy energy change beyond which an iteration is flagged as diverging (as PyMC's Emax).
MAX_ENERGY_CHANGE = 1000.0


class DPHMCInfo(NamedTuple):
    """Outcome of one DP-HMC iteration (`dphmc_transition`).

    ``n_grad_clipped`` and ``n_llr_clipped`` are counted from the data without noise: never
    publish them (the step emits them only behind ``nonprivate_diagnostics``). Everything
    else is data-free or a post-processing of the noisy releases.
    """

    accepted: bool
    #: Noisy log acceptance ratio (penalty-corrected).
    log_accept: float
    #: ``min(1, exp(log_accept))`` (0 when not finite).
    accept_prob: float
    #: Noisy energy change ``-(log_accept + sigma_l^2 / 2)`` (inf when not finite).
    energy_change: float
    diverging: bool
    #: ``||q' - q||_2`` of the proposal.
    step_norm: float
    #: Noise std ``sigma_l`` of the log-likelihood-ratio release.
    llr_noise_std: float
    #: Gradient releases of the trajectory (``L + 1``).
    n_grad: int
    n_grad_clipped: int
    n_llr_clipped: int


def dphmc_transition(
    rng: np.random.Generator,
    q: np.ndarray,
    *,
    step_size: float,
    n_leapfrog: int,
    mass_diag: np.ndarray,
    inv_mass: np.ndarray,
    grad_clip_bound: float,
    grad_noise_std: float,
    llr_clip_bound: float,
    llr_noise_multiplier: float,
    clipped_grad_sum: Callable[[np.ndarray, float], tuple[np.ndarray, int]],
    prior_logp_and_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    clipped_loglik_ratio_sum: Callable[[np.ndarray, np.ndarray, float], tuple[float, int]],
    owners: int = 0,
    shared_grad_sum: Callable[[np.ndarray, float, float], np.ndarray] | None = None,
    shared_llr_sum: Callable[[np.ndarray, np.ndarray, float, float], float] | None = None,
    clipped_grad_and_ratio_sum: Callable[
        [np.ndarray, float, np.ndarray, float], tuple[np.ndarray, int, float, int]
    ]
    | None = None,
) -> tuple[np.ndarray, DPHMCInfo]:
    r"""One DP-HMC iteration (DP-HMC paper, Algorithm 1 [DPHMC]): ``(q_next, info)``.

    Draws ``p ~ N(0, M)``, runs ``L`` noisy leapfrog steps of size ``step_size`` (``L + 1``
    gradient releases: the clipped per-record sum ``clipped_grad_sum(x, b_g)`` plus the
    exact, data-free ``prior_logp_and_grad``, with noise ``N(0, grad_noise_std^2 I)``), then
    one release of the clipped log-likelihood ratio (bound ``b_l ||q' - q||``) in the penalty
    test [YildirimErmis2019]. A proposal outside the prior's support is rejected without
    reading the data. Random draws, in this order: momentum, leapfrog noise, ratio noise,
    accept uniform.

    Parameters
    ----------
    rng : numpy.random.Generator
    q : ndarray
        Current position.
    step_size : float
        ``eta h_i`` of this iteration.
    n_leapfrog : int
    mass_diag, inv_mass : ndarray
        Diagonals of ``M`` and ``M^{-1}``.
    grad_clip_bound, grad_noise_std : float
        ``b_g`` and ``sigma_g = 2 z_g b_g``.
    llr_clip_bound, llr_noise_multiplier : float
        ``b_l`` and ``z_l``.
    clipped_grad_sum, prior_logp_and_grad, clipped_loglik_ratio_sum : callable
        The model's per-record functions (`pymc_dp.records.RecordFunctions`).
    owners : int
        ``K > 0``: the data-sharing scheme (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2):
        every release is the sum of the ``K`` owners' contributions, each with the owner's
        own noise, so no noise is added here and the penalty correction is
        ``K sigma_l^2 / 2``; ``info.llr_noise_std`` is the total ``sqrt(K) sigma_l``. A
        proposal outside the prior's support is rejected without a release. 0 (default):
        the central scheme.
    shared_grad_sum, shared_llr_sum : callable, optional
        With ``owners > 0``: ``shared_grad_sum(x, b_g, sigma_g)`` and
        ``shared_llr_sum(q', q, b_l ||q' - q||, sigma_l)``, the owners' noisy sums.
    clipped_grad_and_ratio_sum : callable, optional
        The fused last pass (central scheme): ``f(q', b_g, q, b_l ||q' - q||) -> (g, k,
        llr, k_llr)``, the noise-free clipped gradient sum at the trajectory's end ``q'``
        and the noise-free clipped ratio sum of the penalty test, computed together (one
        pass over the records, e.g. `pymc_dp.records.FusedLastPass`). Used for the last
        gradient release when ``q'`` is inside the prior's support (the prior is data-free
        and evaluated first), in place of ``clipped_grad_sum`` there and of
        ``clipped_loglik_ratio_sum``; the releases, their noise and the order of the
        random draws are unchanged. ``None``: two passes.
    """
    shared = owners > 0
    if shared and (shared_grad_sum is None or shared_llr_sum is None):
        raise TypeError("owners > 0 needs shared_grad_sum and shared_llr_sum")
    p = sample_momentum(mass_diag, rng)
    n_grad_clipped = 0
    prior_lp: list[float] = []
    fused = None if shared else clipped_grad_and_ratio_sum
    fused_llr: tuple[float, int] | None = None

    def grad_fn(x: np.ndarray) -> np.ndarray:
        # One gradient release (noisy_leapfrog adds the noise): clipped per-record sum of
        # log-likelihood gradients plus the exact, data-free prior/log-Jacobian gradient.
        nonlocal n_grad_clipped, fused_llr
        last = len(prior_lp) == n_leapfrog  # the (L + 1)-th evaluation: at the end point
        if shared:  # the owners' noisy contributions, summed (their noise included)
            g = shared_grad_sum(x, grad_clip_bound, grad_noise_std)
            lp, g_prior = prior_logp_and_grad(x)
        else:
            lp, g_prior = prior_logp_and_grad(x)  # data-free: first (the support decides)
            if last and fused is not None and np.isfinite(lp) and np.all(np.isfinite(x)):
                # the ratio release's bound is known now: one pass for both releases
                b_l = llr_clip_bound * _norm(x - q)
                g, k, llr_fused, k_llr = fused(x, grad_clip_bound, q, b_l)
                fused_llr = (llr_fused, k_llr)
            else:
                g, k = clipped_grad_sum(x, grad_clip_bound)
            n_grad_clipped += k
        prior_lp.append(lp)
        return g + g_prior

    # -- L + 1 gradient releases ---------------------------------------------------------------
    leapfrog_noise = 0.0 if shared else grad_noise_std
    traj = noisy_leapfrog(q, p, step_size, n_leapfrog, grad_fn, inv_mass, leapfrog_noise, rng)
    q1, p1 = traj.q, traj.p
    norm = _norm(q1 - q)
    # The first gradient is evaluated at q, the last at q1 (data-free prior terms).
    lp0 = prior_lp[0]
    lp1 = prior_lp[-1] if np.all(np.isfinite(q1)) else -np.inf
    lp1 = lp1 if np.isfinite(lp1) else -np.inf
    # -- one log-likelihood-ratio release (the penalty test) -----------------------------------
    sigma_l = penalty_noise_std(llr_noise_multiplier, llr_clip_bound, norm)
    d_kinetic = kinetic_energy(p, inv_mass) - kinetic_energy(p1, inv_mass)
    n_llr_clipped = 0
    if shared:
        if np.isfinite(lp1):
            noisy = shared_llr_sum(q1, q, llr_clip_bound * norm, sigma_l)
            log_a = shared_penalty_log_acceptance(noisy, lp1 - lp0, d_kinetic, sigma_l, owners)
        else:  # outside the prior's support: rejected whatever the data say (no release)
            log_a = -np.inf
        sigma_l = float(np.sqrt(owners)) * sigma_l  # the total noise of the release
    else:
        if np.isfinite(lp1) and fused_llr is not None:  # computed by the last gradient pass
            llr, n_llr_clipped = fused_llr
        elif np.isfinite(lp1):
            llr, n_llr_clipped = clipped_loglik_ratio_sum(q1, q, llr_clip_bound * norm)
        else:  # outside the prior's support: rejected whatever the data say (no data access)
            llr = 0.0
        log_a = penalty_log_acceptance(llr, lp1 - lp0, d_kinetic, sigma_l, rng)
    # -- everything below is post-processing of the released values ----------------------------
    accepted = accept(log_a, rng)
    accept_prob = float(np.exp(min(0.0, log_a))) if np.isfinite(log_a) else 0.0
    energy_change = -(log_a + 0.5 * sigma_l * sigma_l) if np.isfinite(log_a) else np.inf
    info = DPHMCInfo(
        accepted=bool(accepted),
        log_accept=float(log_a),
        accept_prob=accept_prob,
        energy_change=float(energy_change),
        diverging=bool(not np.isfinite(log_a) or energy_change > MAX_ENERGY_CHANGE),
        step_norm=norm,
        llr_noise_std=sigma_l,
        n_grad=traj.n_grad,
        n_grad_clipped=n_grad_clipped,
        n_llr_clipped=n_llr_clipped,
    )
    return (q1 if accepted else q), info


def _halton_engine(seed: int) -> qmc.Halton:
    params = inspect.signature(qmc.Halton).parameters
    key = "rng" if "rng" in params else "seed"  # scipy >= 1.15 renamed seed to rng
    return qmc.Halton(d=1, scramble=True, **{key: np.random.default_rng(seed)})


class HaltonSequence:
    """Randomised (scrambled) base-2 Halton numbers in (0, 1), one per iteration.

    The DP-HMC paper multiplies the step size of iteration ``i`` by such a number
    (Sec. 3, after Theorem 3.4, following Hoffman et al.'s ChEES-HMC and Owen 2017): the
    step size is constant within a trajectory, so the invariant distribution is unchanged,
    and the low-discrepancy sequence spreads the step sizes evenly over ``(0, eta)``.

    Parameters
    ----------
    rng : numpy.random.Generator
        The scrambling is seeded from one draw of this generator.
    """

    _TINY = 1e-12
    #: Numbers drawn from the engine at a time (the same numbers as one at a time; one
    #: call of the engine costs ~5 us, once per DP-HMC iteration otherwise)
    _BLOCK = 64

    def __init__(self, rng: np.random.Generator) -> None:
        self._engine = _halton_engine(int(rng.integers(2**63 - 1)))
        self._ahead: list[float] = []  # the next numbers, last first

    def next(self) -> float:
        """The next number of the sequence, clipped away from 0."""
        if not self._ahead:
            self._ahead = self._engine.random(self._BLOCK)[::-1, 0].tolist()
        return max(self._ahead.pop(), self._TINY)


# -- dual averaging -----------------------------------------------------------------------------
class DualAveraging:
    r"""Dual-averaging step-size adaptation (Hoffman & Gelman 2014, Sec. 3.2, eq. (6)).

    After the ``t``-th update with acceptance statistic $\alpha_t$,

    $$
    \bar H_t = (1 - \tfrac{1}{t + t_0}) \bar H_{t-1}
    + \tfrac{1}{t + t_0} (\delta - \alpha_t), \quad
    \log\eta_t = \mu - \tfrac{\sqrt t}{\gamma} \bar H_t, \quad
    \log\bar\eta_t = t^{-\kappa}\log\eta_t + (1 - t^{-\kappa})\log\bar\eta_{t-1}
    $$

    with $\mu = \log(10\,\eta_0)$; the same constants as PyMC's and Stan's. During
    warmup the sampler uses $\eta_t$, afterwards $\bar\eta_t$.

    Parameters
    ----------
    initial_step : float
    target : float
        Target acceptance statistic ``delta`` in (0, 1).
    gamma : float
        Shrinkage.
    k : float
        Averaging exponent ``kappa``.
    t0 : float
        Stabilisation offset.
    """

    def __init__(
        self, initial_step: float, target: float, gamma: float = 0.05, k: float = 0.75, t0=10.0
    ) -> None:
        self.target = float(target)
        self.gamma = float(gamma)
        self.k = float(k)
        self.t0 = float(t0)
        self.restart(initial_step)

    def restart(self, initial_step: float) -> None:
        """Start over from ``initial_step`` (e.g. after the mass matrix changed)."""
        self.log_step = float(np.log(initial_step))
        self.log_bar = self.log_step
        self.mu = float(np.log(10.0 * initial_step))
        self.hbar = 0.0
        self.count = 0

    def current(self, tune: bool) -> float:
        """Step size to use: the iterate during warmup, the average afterwards."""
        return float(np.exp(self.log_step if tune else self.log_bar))

    def update(self, accept_stat: float) -> None:
        """One adaptation step from an acceptance statistic in [0, 1] (NaN counts as 0)."""
        a = float(accept_stat)
        a = 0.0 if not np.isfinite(a) else min(max(a, 0.0), 1.0)
        self.count += 1
        t = self.count
        w = 1.0 / (t + self.t0)
        self.hbar = (1.0 - w) * self.hbar + w * (self.target - a)
        self.log_step = self.mu - self.hbar * np.sqrt(t) / self.gamma
        mk = t ** (-self.k)
        self.log_bar = mk * self.log_step + (1.0 - mk) * self.log_bar


# -- diagonal mass matrix -----------------------------------------------------------------------
def warmup_windows(
    tune: int | None,
    *,
    init_buffer: int = 75,
    term_buffer: int = 50,
    base_window: int = 25,
    max_iterations: int = 10**9,
) -> list[tuple[int, int]]:
    """Slow windows ``(start, end)`` of a windowed metric adaptation (warmup iterations).

    A window collects the draws of warmup iterations ``start < i <= end`` (1-based) and
    updates the metric at iteration ``end``. Stan's schedule: a fast initial buffer (step
    size only), slow windows of doubling length ``base_window, 2 base_window, ...``, the last
    one stretched to end ``term_buffer`` iterations before the end of warmup, and a terminal
    buffer in which only the step size adapts. Short warmups shrink the buffers to 15 % /
    10 % of ``tune``; fewer than 20 warmup iterations adapt no metric.

    With ``tune=None`` (the warmup length is not known in advance) the doubling windows
    continue without a terminal buffer, up to ``max_iterations``.
    """
    if tune is None:
        windows, start, w = [], init_buffer, base_window
        while start + w <= max_iterations:
            windows.append((start, start + w))
            start, w = start + w, 2 * w
        return windows
    tune = int(tune)
    if tune < 20:
        return []
    if init_buffer + base_window + term_buffer > tune:
        init_buffer = int(0.15 * tune)
        term_buffer = int(0.1 * tune)
        base_window = tune - init_buffer - term_buffer
    end_slow = tune - term_buffer
    windows, start, w = [], init_buffer, base_window
    while start < end_slow:
        end = start + w
        if end + 2 * w > end_slow:
            end = end_slow
        windows.append((start, end))
        start, w = end, 2 * w
    return windows


class DiagonalMassAdaptation:
    """Windowed estimate of a diagonal inverse mass matrix from the chain's own draws.

    Draws of each slow window (see `warmup_windows`) are accumulated with Welford's
    algorithm; at the window's end the inverse mass becomes their regularised variance
    ``(n var + 5e-3 m_old) / (n + 5)`` per coordinate, with ``m_old`` the previous inverse
    mass (Stan's shrinkage, made scale-free: Stan shrinks toward the absolute 1e-3, which
    dominates the posteriors of large datasets, often far narrower than that).

    A coordinate's estimate may *lower* its inverse mass only if the chain mixed in that
    coordinate within the window; otherwise it can only raise it. Under DP noise the chain
    often moves slowly during warmup (the penalty test's noise grows with the step length),
    and the variance of a random-walking chain measures how far it moved, a lower bound of
    the posterior variance: adapting to it anyway shrinks the metric of the coordinates that
    happened to move least, which then move even less, until they freeze. Mixing is judged
    by a lag-one estimate of the coordinate's effective sample size in the window,
    ``n msd / (2 var)`` with ``msd`` the mean squared change between successive draws
    (within a factor of 2 of the truth for an AR(1) chain; about 3 for a random walk
    whatever the window's length, less for a drift), which must reach ``min_ess``. A window
    in which the chain moved fewer than ``min_moves`` times is not used at all (a stuck
    chain has zero sample variance).

    The draws are the chain's own (differentially private) states, so the adaptation is
    post-processing.

    Parameters
    ----------
    inv_mass : ndarray, shape (d,)
        Initial diagonal of ``M^{-1}``.
    tune : int or None
        Number of warmup iterations (``None``: unknown, open-ended schedule).
    min_moves : int
        Minimum number of accepted moves in a window for its estimate to be used.
    min_ess : float
        Mixing threshold described above.
    """

    def __init__(
        self,
        inv_mass: np.ndarray,
        tune: int | None,
        *,
        min_moves: int = 5,
        min_ess: float = 20.0,
    ) -> None:
        self.inv_mass = np.array(inv_mass, dtype=float)
        self.windows = warmup_windows(tune)
        self.min_moves = int(min_moves)
        self.min_ess = float(min_ess)
        self.iteration = 0
        #: (window end, used) for every completed window
        self.history: list[tuple[int, bool]] = []
        self._window = 0
        self._reset_window()

    def _reset_window(self) -> None:
        d = self.inv_mass.shape[0]
        self._n = 0
        self._mean = np.zeros(d)
        self._m2 = np.zeros(d)
        self._sq_steps = np.zeros(d)
        self._last = None
        self._moves = 0

    def update(self, q: np.ndarray, moved: bool) -> bool:
        """Record one warmup draw; return True when the metric changed at this iteration."""
        self.iteration += 1
        if self._window >= len(self.windows):
            return False
        start, end = self.windows[self._window]
        if self.iteration > start:
            self._n += 1
            delta = q - self._mean
            self._mean += delta / self._n
            self._m2 += delta * (q - self._mean)
            if self._last is not None:
                self._sq_steps += (q - self._last) ** 2
            self._last = np.array(q, dtype=float)
            self._moves += int(moved)
        if self.iteration < end:
            return False
        changed = False
        if self._n >= 4 and self._moves >= self.min_moves:
            n, old = self._n, self.inv_mass
            var = self._m2 / (n - 1)
            with np.errstate(divide="ignore", invalid="ignore"):
                mixed = n * (self._sq_steps / (n - 1)) / (2.0 * var) >= self.min_ess
            estimate = (n * var + 5e-3 * old) / (n + 5.0)
            new = np.where(mixed, estimate, np.maximum(old, estimate))
            new = np.where(np.isfinite(var) & (var > 0), new, old)
            changed = bool(np.any(new != old))
            self.inv_mass = new
        self.history.append((end, changed))
        self._window += 1
        self._reset_window()
        return changed
