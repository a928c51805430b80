"""PyMC step methods of pymc_dp (thin: a kernel wired to the per-record model functions)."""

from pymc_dp.step_methods.barker import DPBarker
from pymc_dp.step_methods.base import BudgetExceededError, DPStep
from pymc_dp.step_methods.expfam import CorrelatedNoise, DPExpFamilyPenalty, StatCentre
from pymc_dp.step_methods.fastmh import DPFastMH
from pymc_dp.step_methods.hmc import DPHMC
from pymc_dp.step_methods.parts import LikelihoodSettings, PrivacySettings
from pymc_dp.step_methods.penalty import DPPenaltyMetropolis
from pymc_dp.step_methods.proposals import (
    ControlVariate,
    Coordinates,
    CoordinateWalk,
    GuidedWalk,
    Independent,
    RandomWalk,
    TunaMHTest,
)
from pymc_dp.step_methods.sgmcmc import DPSGLD, DPSGNHT
from pymc_dp.step_methods.subsampled_penalty import DPSubsampledPenalty

__all__ = [
    "DPBarker",
    "DPExpFamilyPenalty",
    "DPSubsampledPenalty",
    "DPHMC",
    "DPSGLD",
    "DPSGNHT",
    "BudgetExceededError",
    "DPFastMH",
    "DPPenaltyMetropolis",
    "DPStep",
    "StatCentre",
    "CorrelatedNoise",
    "PrivacySettings",
    "LikelihoodSettings",
    "RandomWalk",
    "CoordinateWalk",
    "GuidedWalk",
    "Independent",
    "ControlVariate",
    "Coordinates",
    "TunaMHTest",
]
