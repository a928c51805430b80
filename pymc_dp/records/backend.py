"""The one place that compiles the per-record functions.

Every compiled function of the glue goes through `compile_function`, so the backend
(PyTensor's C, Numba or JAX linker, chosen with ``compile_kwargs={"mode": ...}``) is one
parameter for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pymc as pm

__all__ = ["compile_function"]


def compile_function(
    inputs: Sequence, outputs: Any, compile_kwargs: dict | None = None, **kwargs: Any
):
    """Compile ``outputs`` as a function of ``inputs`` with `pymc.pytensorf.compile`.

    Parameters
    ----------
    inputs : sequence of PyTensor variables
    outputs : variable or list of variables
    compile_kwargs : dict, optional
        The user's options (e.g. ``{"mode": "NUMBA"}``), as given to the step.
    **kwargs
        Options of this call (e.g. ``on_unused_input="ignore"``); the user's take precedence.
    """
    return pm.pytensorf.compile(list(inputs), outputs, **{**kwargs, **(compile_kwargs or {})})
