"""The error every refusal of the per-record glue raises."""

from __future__ import annotations

__all__ = ["ModelNotSupportedError", "RecordComputationError", "mark_data_free"]

#: Attribute set on an exception raised by data-free work (compiling a function), whose text
#: may leave a computation on the records as it is (`mark_data_free`).
DATA_FREE = "_pymc_dp_data_free"


def mark_data_free(err: BaseException) -> BaseException:
    """Mark ``err`` as raised by data-free work (e.g. compilation): its text holds no record
    value, so a computation on the records may re-raise it as it is."""
    try:
        setattr(err, DATA_FREE, True)
    except AttributeError:  # an exception type that takes no attributes: stays unmarked
        pass
    return err


class ModelNotSupportedError(ValueError):
    """A model that pymc_dp cannot map to records, or would publish data from."""


class RecordComputationError(RuntimeError):
    """A computation on the records failed; only the type of the error is reported (its
    message, e.g. PyTensor's, could hold record values)."""
