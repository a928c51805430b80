"""The source papers' experiments: models, metrics, a runner, figures and a CLI.

``python -m pymc_dp.experiments.cli experiment banana --methods dphmc,penalty --out DIR``
reproduces the DP-HMC paper's protocol (Räisä, Koskela & Honkela, Sec. 4) with pymc_dp's
step methods; see ``docs/results.md``. Needs matplotlib (figures) and, for the
logistic-regression model, statsmodels.
"""

from pymc_dp.experiments.metrics import (
    convergence,
    mean_error,
    median_heuristic,
    mmd,
    mmd_paper_scale,
)
from pymc_dp.experiments.models import (
    MODELS,
    ExperimentModel,
    banana,
    correlated_gaussian,
    gaussian_mixture,
    logistic_regression,
    posterior_matrix,
)
from pymc_dp.experiments.runner import (
    METHODS,
    MethodSetting,
    MethodSpec,
    auto_iteration_budget,
    comparison_table,
    merge_results,
    paper_iterations_per_chain,
    register_method,
    run_experiment,
    run_one,
    summary_table,
)

__all__ = [
    "METHODS",
    "MODELS",
    "ExperimentModel",
    "MethodSetting",
    "MethodSpec",
    "auto_iteration_budget",
    "banana",
    "comparison_table",
    "convergence",
    "correlated_gaussian",
    "gaussian_mixture",
    "logistic_regression",
    "mean_error",
    "median_heuristic",
    "merge_results",
    "mmd",
    "mmd_paper_scale",
    "paper_iterations_per_chain",
    "posterior_matrix",
    "register_method",
    "run_experiment",
    "run_one",
    "summary_table",
]
