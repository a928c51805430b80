"""The penalty acceptance test with a noisy log-likelihood ratio (pure numpy).

References
----------
.. [1] Ceperley, D. M. and Dewing, M. (1999). The penalty method for random walks with
   uncertain energies. J. Chem. Phys. 110(20).
.. [2] Yildirim, S. and Ermis, B. (2019). Exact MCMC with differentially private moves.
   Statistics and Computing 29(5). [YildirimErmis2019]
.. [3] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte Carlo,
   Sec. 3, acceptance probability alpha_DP. [DPHMC]
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "penalty_noise_std",
    "penalty_log_acceptance",
    "shared_penalty_log_acceptance",
    "accept",
]


def penalty_noise_std(noise_multiplier: float, clip_bound: float, step_norm: float) -> float:
    """Noise std ``sigma = z * 2 b ||theta' - theta||`` of the DP penalty test.

    The clipped log-likelihood ratio ``sum_i clip(r_i, -b ||dtheta||, b ||dtheta||)`` has
    replace-one sensitivity ``2 b ||dtheta||``; noise ``z`` times that makes each release a
    Gaussian mechanism with privacy-loss parameter ``mu = 1 / (2 z^2)`` (thesis Theorem 7).
    """
    return noise_multiplier * 2.0 * clip_bound * step_norm


def penalty_log_acceptance(
    clipped_llr: float,
    log_prior_ratio: float,
    log_proposal_ratio: float,
    sigma: float,
    rng: np.random.Generator,
) -> float:
    """Noisy, penalty-corrected log acceptance ratio.

    ``lambda + xi + log q-ratio + log prior ratio - sigma^2 / 2`` with ``xi ~ N(0, sigma^2)``
    (Yildirim & Ermis 2019, eq. for alpha_pen; DP-HMC paper Sec. 3). With the ratio not
    clipped the chain is exact: ``E[exp(xi - sigma^2/2)] = 1`` (Ceperley & Dewing 1999).
    Works elementwise on arrays (vectorised audits draw many noise values at once); scalars in,
    scalar out.
    """
    shape = np.shape(clipped_llr)
    xi = rng.normal(size=shape) * sigma if shape else rng.normal() * sigma
    return clipped_llr + xi + log_prior_ratio + log_proposal_ratio - 0.5 * sigma * sigma


def shared_penalty_log_acceptance(
    noisy_llr: float,
    log_prior_ratio: float,
    log_proposal_ratio: float,
    sigma: float,
    owners: int,
) -> float:
    """Penalty-corrected log acceptance ratio of the data-sharing scheme.

    Yildirim & Ermis (2019), Sec. 3.2.2, Algorithm 2: each of the ``K = owners`` data
    owners adds its own ``N(0, sigma^2)`` noise to its clipped log-likelihood-ratio sum
    (eq. (6)); ``noisy_llr`` is the sum of the ``K`` noisy contributions, whose noise has
    variance ``K sigma^2``. The penalty correction is then ``K sigma^2 / 2``, which keeps the
    chain exact when no ratio is clipped (Ceperley & Dewing 1999), at ``K`` times the noise
    variance of the central scheme.
    """
    return noisy_llr + log_prior_ratio + log_proposal_ratio - 0.5 * owners * sigma * sigma


def accept(log_ratio, rng: np.random.Generator):
    """Metropolis decision ``log u < log_ratio`` (NaN rejects); elementwise on arrays."""
    shape = np.shape(log_ratio)
    if not shape:
        return bool(np.log(rng.uniform()) < log_ratio)
    return np.log(rng.uniform(size=shape)) < log_ratio
