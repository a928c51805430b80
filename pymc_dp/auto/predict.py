"""Predicted efficiency of the DP penalty test: the numbers that choose the configuration.

Pure numpy/scipy; never reads data. The inputs are public (``n``, the budget, the run
length) or DP outputs (a private Laplace approximation, a DP clip bound), so every choice
made from these predictions is post-processing.

The penalty test adds noise ``sigma = z 2 b ||theta' - theta||`` to the clipped
log-likelihood ratio (Yildirim & Ermis 2019; thesis Theorem 7). With ``T`` iterations
sharing a privacy-loss budget ``m`` (loss ~ N(m, 2m)), ``z = sqrt(T / (2 m))``.

* Independence proposal from a good approximation of the posterior: the exact log ratio has
  small variance and the noisy test accepts with probability about
  ``E[min(1, exp(N(-sigma^2/2, sigma^2)))] = 2 Phi(-sigma / 2)``, so the effective sample
  size is about ``T 2 Phi(-sigma(T) / 2)``; it has an interior maximum in ``T``.
* Random walk in ``d`` whitened dimensions with noise proportional to the step
  (``sigma = kappa l``): optimal scaling gives efficiency ``~ 0.3 / (d (1 + kappa^2))`` per
  iteration ([Roberts1997] with the noise added to the log ratio's variance).

References
----------
.. [1] G. O. Roberts, A. Gelman, W. R. Gilks, "Weak convergence and optimal scaling of random
   walk Metropolis algorithms", Ann. Appl. Probab. 7(1), 1997. [Roberts1997]
.. [2] S. Yildirim, B. Ermis, "Exact MCMC with differentially private moves", Statistics and
   Computing 29(5), 2019. [YildirimErmis2019]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

__all__ = ["Prediction", "independent_ess", "best_independent_length", "random_walk_ess"]


@dataclass(frozen=True)
class Prediction:
    """Predicted behaviour of a sampling configuration."""

    proposal: str
    iterations: int
    noise_multiplier: float
    test_noise_std: float
    accept: float
    ess: float


def _z(iterations: int, mu_budget: float) -> float:
    return math.sqrt(iterations / (2.0 * mu_budget))


def independent_ess(iterations: int, mu_budget: float, llr_per_step: float) -> Prediction:
    """Predicted ESS of the independence penalty sampler.

    Parameters
    ----------
    iterations : int
        Total iterations over all chains.
    mu_budget : float
        Privacy-loss parameter left for sampling.
    llr_per_step : float
        ``2 b E||theta' - theta||``: the sensitivity of one test (clip bound times the
        typical distance between two draws of the proposal).
    """
    z = _z(iterations, mu_budget)
    sigma = z * llr_per_step
    acc = 2.0 * float(stats.norm.cdf(-sigma / 2.0))
    return Prediction("independent", int(iterations), z, sigma, acc, iterations * acc)


def best_independent_length(
    mu_budget: float, llr_per_step: float, *, minimum: int, maximum: int
) -> Prediction:
    """The run length in ``[minimum, maximum]`` with the largest `independent_ess`."""
    # ESS(T) = T 2 Phi(-a sqrt(T) / 2) with a = llr_per_step / sqrt(2 m): maximal where
    # s = a sqrt(T) / 2 solves Phi(-s) = s phi(s) / 2 ... found numerically on a grid.
    grid = np.unique(np.geomspace(minimum, maximum, 200).round().astype(int))
    preds = [independent_ess(int(t), mu_budget, llr_per_step) for t in grid]
    return max(preds, key=lambda p: p.ess)


def random_walk_ess(iterations: int, mu_budget: float, llr_per_unit: float, d: int) -> Prediction:
    """Predicted ESS of the random-walk penalty sampler in whitened coordinates.

    ``llr_per_unit`` is ``2 b`` times the posterior scale (the test's sensitivity per
    whitened unit of step length), so ``kappa = z * llr_per_unit``.
    """
    z = _z(iterations, mu_budget)
    kappa = z * llr_per_unit
    step = 2.38 / math.sqrt(1.0 + kappa * kappa)
    acc = 2.0 * float(stats.norm.cdf(-step * math.sqrt(1.0 + kappa * kappa) / 2.0))
    eff = 0.3 / (max(d, 1) * (1.0 + kappa * kappa))
    return Prediction("gaussian", int(iterations), z, kappa * step, acc, iterations * eff)
