"""Pure-numpy kernels of the DP samplers; never imports PyMC. Randomness is always passed in."""

from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std

__all__ = ["accept", "penalty_log_acceptance", "penalty_noise_std"]
