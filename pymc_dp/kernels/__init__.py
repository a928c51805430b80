"""Pure-numpy kernels of the DP samplers; never imports PyMC. Randomness is always passed in."""

from pymc_dp.kernels import sgmcmc
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
    DPHMCInfo,
    DualAveraging,
    HaltonSequence,
    LeapfrogResult,
    calibrate_dphmc_noise,
    dphmc_transition,
    gradient_noise_std,
    kinetic_energy,
    noisy_leapfrog,
    sample_momentum,
    warmup_windows,
)
from pymc_dp.kernels.penalty import accept, penalty_log_acceptance, penalty_noise_std
from pymc_dp.kernels.sgmcmc import *  # noqa: F403 (the stochastic-gradient kernels)
from pymc_dp.kernels.subsampled_penalty import (
    SubsampledPenaltyInfo,
    minibatch_estimate,
    subsampled_penalty_log_acceptance,
    subsampled_penalty_sensitivity,
    subsampled_penalty_transition,
)

__all__ = [
    *sgmcmc.__all__,
    "DPHMCInfo",
    "DiagonalMassAdaptation",
    "DualAveraging",
    "FastMHInfo",
    "FastMHSettings",
    "HaltonSequence",
    "IndexSampler",
    "LeapfrogResult",
    "SubsampledPenaltyInfo",
    "accept",
    "calibrate_dphmc_noise",
    "calibrate_fastmh",
    "dphmc_transition",
    "fastmh_transition",
    "gradient_noise_std",
    "keep_probability",
    "kinetic_energy",
    "minibatch_estimate",
    "minibatch_sensitivity",
    "noisy_leapfrog",
    "penalty_log_acceptance",
    "penalty_noise_std",
    "sample_momentum",
    "subsampled_penalty_log_acceptance",
    "subsampled_penalty_sensitivity",
    "subsampled_penalty_transition",
    "tuna_log_ratio",
    "warmup_windows",
]
