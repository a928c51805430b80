"""Pure-numpy kernels of the DP samplers; never imports PyMC. Randomness is always passed in."""

from pymc_dp.kernels.fastmh import (
    FastMHInfo,
    FastMHSettings,
    IndexSampler,
    calibrate_fastmh,
    fastmh_transition,
    keep_probability,
    minibatch_sensitivity,
    tuna_log_ratio,
)
from pymc_dp.kernels.hmc import (
    DiagonalMassAdaptation,
    DualAveraging,
    HaltonSequence,
    LeapfrogResult,
    gradient_noise_std,
    kinetic_energy,
    noisy_leapfrog,
    sample_momentum,
    warmup_windows,
)
from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std

__all__ = [
    "DiagonalMassAdaptation",
    "DualAveraging",
    "FastMHInfo",
    "FastMHSettings",
    "HaltonSequence",
    "IndexSampler",
    "LeapfrogResult",
    "accept",
    "calibrate_fastmh",
    "fastmh_transition",
    "gradient_noise_std",
    "keep_probability",
    "kinetic_energy",
    "minibatch_sensitivity",
    "noisy_leapfrog",
    "penalty_log_acceptance",
    "penalty_noise_std",
    "sample_momentum",
    "tuna_log_ratio",
    "warmup_windows",
]
