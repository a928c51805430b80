"""pymc_dp: differentially private MCMC step methods for PyMC.

Public API: the step methods, `sample`, `sample_posterior_predictive`, `privacy_report`
(also callable as ``pymc_dp.report(idata)``) and `check_convergence`.
Docstrings cite papers by key (``[DPHMC]``, ``[Raisa2021]``, ...): the keyed list with DOIs and
arXiv ids is docs/references.md.
"""

from importlib.metadata import PackageNotFoundError, version

from pymc_dp import step_methods
from pymc_dp.auto import plan
from pymc_dp.diagnostics import ConvergenceWarning, PriorDominatedWarning, check_convergence
from pymc_dp.predictive import sample_posterior_predictive
from pymc_dp.records import ModelNotSupportedError
from pymc_dp.report import PrivacyReport, privacy_report
from pymc_dp.sampling import NoiseDominatedWarning, OneShotWarning, sample
from pymc_dp.step_methods import *  # noqa: F403 (the step methods and their parts)

try:
    __version__ = version("pymc_dp")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

#: the step methods and their parts (`pymc_dp.step_methods`), then the rest of the public API
__all__ = [
    *step_methods.__all__,
    "ConvergenceWarning",
    "ModelNotSupportedError",
    "NoiseDominatedWarning",
    "OneShotWarning",
    "PriorDominatedWarning",
    "PrivacyReport",
    "__version__",
    "check_convergence",
    "plan",
    "privacy_report",
    "sample",
    "sample_posterior_predictive",
]
