"""PyMC step methods of pymc_dp (thin: a kernel wired to the per-record model functions)."""

from pymc_dp.step_methods.base import BudgetExceededError, DPStep
from pymc_dp.step_methods.fastmh import DPFastMH
from pymc_dp.step_methods.hmc import DPHMC
from pymc_dp.step_methods.penalty import DPPenaltyMetropolis

__all__ = ["DPHMC", "BudgetExceededError", "DPFastMH", "DPPenaltyMetropolis", "DPStep"]
