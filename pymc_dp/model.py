"""Compatibility module: the per-record glue now lives in `pymc_dp.records`.

``from pymc_dp.model import build_record_functions`` (and the other names below) keeps
working; new code imports from `pymc_dp.records`.
"""

from __future__ import annotations

from pymc_dp.records import (
    ModelNotSupportedError,
    RecordFunctions,
    build_record_functions,
    check_model_supported,
    count_records,
    deterministics_reading_data,
    imputed_variables,
)

__all__ = [
    "ModelNotSupportedError",
    "RecordFunctions",
    "build_record_functions",
    "check_model_supported",
    "count_records",
    "deterministics_reading_data",
    "imputed_variables",
]
