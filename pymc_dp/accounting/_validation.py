"""Input validation of the accounting modules: the checks of `pymc_dp._validation`.

Kept as an import path for the accounting modules; every check lives in
`pymc_dp._validation` (pure, never imports PyMC), shared with the step methods.
"""

from pymc_dp._validation import (
    check_count,
    check_delta,
    check_mechanism_delta,
    check_nonnegative,
    check_positive,
    check_positive_int,
    check_real,
)

__all__ = [
    "check_count",
    "check_delta",
    "check_mechanism_delta",
    "check_nonnegative",
    "check_positive",
    "check_positive_int",
    "check_real",
]
