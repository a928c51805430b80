"""Private auto-configuration of a DP run (``pymc_dp.sample(step=None)``) and ``plan``.

* `auto_configure` — the private warm start, clip selection and budget split
  (`pymc_dp.auto.configure`);
* `plan` — the configuration and its predicted signal-to-noise before any data is read
  (`pymc_dp.auto.plan`);
* `check_data_bounds` — public bounds of the data declared by the user
  (`pymc_dp.auto.bounds`).
"""

from pymc_dp.auto.bounds import check_data_bounds
from pymc_dp.auto.configure import AutoPlan, BudgetSplit, Phase, auto_configure
from pymc_dp.auto.plan import plan

__all__ = ["AutoPlan", "BudgetSplit", "Phase", "auto_configure", "check_data_bounds", "plan"]
