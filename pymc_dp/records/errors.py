"""The error every refusal of the per-record glue raises."""

from __future__ import annotations

__all__ = ["ModelNotSupportedError"]


class ModelNotSupportedError(ValueError):
    """A model that pymc_dp cannot map to records, or would publish data from."""
