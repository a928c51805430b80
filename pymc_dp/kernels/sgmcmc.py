r"""Stochastic-gradient MCMC kernels with DP gradients: DP-SGLD and DP-SGNHT (pure numpy).

Both samplers read, in every iteration, a Poisson subsample of the records (each record
independently with probability ``q``), sum the per-record log-likelihood gradients clipped to
L2 norm ``C``, add Gaussian noise, and scale by ``1 / q`` (an unbiased estimate of the full
sum). There is no accept/reject step and the step size is constant, so the chains are
**biased** for every step size ``eta > 0``: their stationary distribution is not the
posterior (the bias vanishes only as ``eta -> 0``; Welling & Teh 2011, Teh, Thiery & Vollmer
2016). `sgld_gaussian_variance` gives the bias in closed form for a Gaussian target.

Privacy. With the state (``theta``, and for SGNHT the momentum and thermostat) fixed by the
earlier releases, each update adds ``(eta_g / q) S`` to a data-free quantity plus independent
Gaussian noise, where ``S`` is the clipped minibatch sum and ``eta_g`` the update's gradient
coefficient. All that noise (the explicitly added DP noise *and* the sampler's own diffusion
noise, which is what makes SGLD private "for free": Wang, Fienberg & Smola 2015, Sec. 4; Li,
Chen, Liu & Carin 2019) can be moved onto ``S``: the release is the Poisson-subsampled Gaussian
mechanism ``S + N(0, (z C)^2 I)`` with noise multiplier

$$
z = \sqrt{\sigma^2 + z_{\mathrm{int}}^2},
$$

``sigma`` the added noise multiplier and ``z_int`` that of the diffusion noise
(`sgld_intrinsic_noise_multiplier`, `sgnht_intrinsic_noise_multiplier`). Under
replace-one neighbours each record's clipped gradient has norm at most ``C``, so ``z`` is
exactly the ``noise_multiplier`` of `pymc_dp.accounting.PoissonSubsampledGaussian`.
Everything else the samplers compute is post-processing.

References
----------
.. [1] Welling, M. and Teh, Y. W. (2011). Bayesian learning via stochastic gradient Langevin
   dynamics. ICML. (the SGLD update, eq. 4)
.. [2] Wang, Y.-X., Fienberg, S. E. and Smola, A. (2015). Privacy for free: posterior sampling
   and stochastic gradient Monte Carlo. ICML, Sec. 4 (DP-SGLD).
.. [3] Li, B., Chen, C., Liu, H. and Carin, L. (2019). On connecting stochastic gradient MCMC
   and differential privacy. AISTATS. (DP-SGLD and DP-SGNHT; the diffusion noise as the
   privacy noise of a subsampled Gaussian mechanism)
.. [4] Ding, N., Fang, Y., Babbush, R., Chen, C., Skeel, R. D. and Neven, H. (2014). Bayesian
   sampling using stochastic gradient thermostats. NeurIPS 27, Algorithm 1 (SGNHT).
.. [5] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte Carlo,
   Sec. 4 (DP-SGLD and DP-SGNHT baselines, Poisson-subsampled Gaussian accounting).
   [DPHMC]
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "SGNHTState",
    "added_noise_multiplier",
    "noisy_gradient",
    "poisson_subsample",
    "sgld_gaussian_variance",
    "sgld_intrinsic_noise_multiplier",
    "sgld_update",
    "sgnht_intrinsic_noise_multiplier",
    "sgnht_update",
    "total_noise_multiplier",
]


#: Up to this many records the subsample is drawn as a Bernoulli mask, above it as a binomial
#: count and a uniform subset of that size (both are exact Poisson sampling; n is public).
_MASK_MAX_N = 10_000


def poisson_subsample(n: int, sampling_rate: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of a Poisson subsample: each of ``n`` records independently with prob. ``q``.

    Drawn as a Bernoulli mask (``n <= 10000``) or as a binomial count ``k ~ Bin(n, q)`` and a
    uniformly random ``k``-subset (the same distribution), without a Python loop over
    records. The batch size varies; it is part of the secret randomness of the mechanism
    (privacy amplification by subsampling assumes it is not published). Sorted indices.
    """
    if sampling_rate >= 1.0:
        return np.arange(n)
    if n <= _MASK_MAX_N:  # a Bernoulli mask is cheapest for small n
        return np.flatnonzero(rng.random(n) < sampling_rate)
    k = int(rng.binomial(n, sampling_rate))
    return np.sort(rng.choice(n, size=k, replace=False))


def sgld_intrinsic_noise_multiplier(step_size: float, sampling_rate: float, clip_bound: float):
    r"""Noise multiplier carried by SGLD's own diffusion noise.

    In `sgld_update` the clipped sum ``S`` enters ``theta`` as ``(eta / (2 q)) S`` next
    to the noise ``N(0, eta I)``; dividing the noise by ``eta / (2 q)`` gives std
    ``2 q / sqrt(eta)`` on ``S``, i.e. ``z_int = 2 q / (C sqrt(eta))``.
    """
    return 2.0 * sampling_rate / (clip_bound * math.sqrt(step_size))


def sgnht_intrinsic_noise_multiplier(
    step_size: float, sampling_rate: float, clip_bound: float, diffusion: float
) -> float:
    r"""Noise multiplier carried by SGNHT's injected noise ``sqrt(2 A eta) N(0, I)``.

    ``S`` enters the momentum as ``(eta / q) S``, so the std on ``S`` is
    ``sqrt(2 A eta) q / eta`` and ``z_int = q sqrt(2 A / eta) / C``.
    """
    return sampling_rate * math.sqrt(2.0 * diffusion / step_size) / clip_bound


def total_noise_multiplier(added: float, intrinsic: float) -> float:
    """``sqrt(added^2 + intrinsic^2)``: independent Gaussian noises add in variance."""
    return math.hypot(added, intrinsic)


def added_noise_multiplier(target: float, intrinsic: float) -> float:
    """Smallest added multiplier ``sigma >= 0`` with ``total_noise_multiplier >= target``.

    ``0`` when the intrinsic noise alone meets the target. The result is nudged up until the
    floating-point total is at least ``target`` (never below the calibrated noise).
    """
    if intrinsic >= target:
        return 0.0
    s = math.sqrt(target * target - intrinsic * intrinsic)
    while total_noise_multiplier(s, intrinsic) < target:
        s = math.nextafter(s, math.inf)
    return s


def noisy_gradient(
    clipped_sum: np.ndarray,
    prior_grad: np.ndarray,
    sampling_rate: float,
    noise_std: float,
    rng: np.random.Generator,
) -> np.ndarray:
    r"""DP estimate of the log-posterior gradient from a Poisson minibatch.

    $$
    \hat g = \nabla \log p(\theta) + \frac{1}{q}\Big(\sum_{i \in B}
    \mathrm{clip}_C(\nabla \log p(x_i|\theta)) + N(0, s^2 I)\Big)
    $$

    with ``s = noise_std`` (``sigma C``). The prior (and log-Jacobian) gradient is data-free:
    neither clipped nor noised. ``clipped_sum`` may have a leading batch axis (vectorised
    trials); the noise is then drawn for each row.
    """
    clipped_sum = np.asarray(clipped_sum, dtype=float)
    noise = rng.normal(size=clipped_sum.shape) * noise_std if noise_std > 0 else 0.0
    return prior_grad + (clipped_sum + noise) / sampling_rate


def sgld_update(
    theta: np.ndarray, grad: np.ndarray, step_size: float, rng: np.random.Generator
) -> np.ndarray:
    r"""One SGLD step (Welling & Teh 2011, eq. 4): ``theta + (eta/2) g + N(0, eta I)``."""
    theta = np.asarray(theta, dtype=float)
    return theta + 0.5 * step_size * grad + math.sqrt(step_size) * rng.normal(size=theta.shape)


class SGNHTState:
    """Momentum ``p`` and thermostat ``xi`` of an SGNHT chain (Ding et al. 2014).

    Ding et al. start from ``p ~ N(0, I)`` and ``xi = A``; so does `initial`.
    """

    __slots__ = ("p", "xi")

    def __init__(self, p: np.ndarray, xi: float | np.ndarray) -> None:
        self.p = np.asarray(p, dtype=float)
        self.xi = xi

    @classmethod
    def initial(cls, d: int, diffusion: float, rng: np.random.Generator) -> SGNHTState:
        return cls(rng.normal(size=d), float(diffusion))


def sgnht_update(
    theta: np.ndarray,
    state: SGNHTState,
    grad: np.ndarray,
    step_size: float,
    diffusion: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, SGNHTState]:
    r"""One SGNHT step, Ding et al. (2014) Algorithm 1, with ``grad`` the (noisy) gradient of
    the log posterior (``-\nabla \tilde U``):

    $$
    \begin{aligned}
    p' &= p - \xi p\,\eta + \hat g\,\eta + \sqrt{2 A \eta}\, N(0, I) \\
    \theta' &= \theta + p'\,\eta \\
    \xi' &= \xi + \left(\tfrac{1}{d} p'^\top p' - 1\right)\eta
    \end{aligned}
    $$

    ``theta`` and ``grad`` may carry a leading batch axis (vectorised trials, ``xi`` then an
    array). Ding et al. use the new momentum in the position and thermostat updates (the
    DP-HMC paper's baseline code uses the old one).
    """
    theta = np.asarray(theta, dtype=float)
    p, xi = state.p, state.xi
    xi_b = xi[..., None] if np.ndim(xi) else xi
    p_new = (
        p
        - xi_b * p * step_size
        + grad * step_size
        + math.sqrt(2.0 * diffusion * step_size) * rng.normal(size=theta.shape)
    )
    theta_new = theta + p_new * step_size
    d = theta.shape[-1]
    xi_new = xi + (np.sum(p_new * p_new, axis=-1) / d - 1.0) * step_size
    return theta_new, SGNHTState(p_new, xi_new)


def sgld_gaussian_variance(
    precision: float,
    step_size: float,
    grad_noise_var: float = 0.0,
    grad_noise_slope: float = 0.0,
) -> float:
    r"""Stationary variance of `sgld_update` on a 1-d Gaussian target.

    Target ``N(m, 1/P)``; the gradient estimate is ``-P (theta - m) + e`` with
    ``E[e | theta] = 0`` and ``Var[e | theta] = V_0 + V_1 (theta - m)^2`` (a Poisson minibatch
    of a normal-mean model: ``V_1 = n (1 - q) / q``; the DP noise adds ``(sigma C / q)^2`` to
    ``V_0``). With ``a = 1 - eta P / 2``, ``u = theta - m`` and ``v = E[u^2]`` (``E[u] = 0``),
    stationarity of ``u' = a u + (eta/2) e + sqrt(eta) Z`` gives
    ``v = a^2 v + (eta^2/4)(V_0 + V_1 v) + eta``, i.e.

    $$
    v = \frac{\eta + \eta^2 V_0 / 4}{\eta P (1 - \eta P / 4) - \eta^2 V_1 / 4},
    $$

    which reduces to ``1 / (P (1 - eta P / 4))`` for exact gradients: SGLD over-disperses by
    the factor ``1 / (1 - eta P / 4)`` at any ``eta > 0``.

    Raises
    ------
    ValueError
        When the second moment does not converge (the denominator is not positive).
    """
    den = step_size * precision * (1.0 - step_size * precision / 4.0)
    den -= step_size * step_size * grad_noise_slope / 4.0
    if den <= 0:
        raise ValueError(
            "step_size is too large: the SGLD chain's second moment diverges "
            f"(eta P (1 - eta P / 4) - eta^2 V1 / 4 = {den:.3g} <= 0)"
        )
    return (step_size + step_size * step_size * grad_noise_var / 4.0) / den
