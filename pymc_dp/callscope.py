"""What one `pymc_dp.sample` call works out about its model once: the model's initial point
and whether the model guard (`pymc_dp.records.check_model_supported`) passed.

The automatic mode reads the initial point in several places (the warm start's start and
shapes, the recentring, the one-shot draws' dimension, the report) and checks the model at
its entry, again where it builds the per-record functions and again before ``pm.sample``.
Each ``model.initial_point()`` compiles a PyTensor function, and the guard walks the model's
graph; both are data-free and the same for the whole call. Inside `call_scope` they are
worked out once for the call's model; outside it (a step built by hand, `pymc_dp.auto.
auto_configure` called directly) every call works them out as before.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pymc as pm

__all__ = ["call_scope", "initial_point", "model_checked", "mark_model_checked"]


@dataclass
class _Scope:
    model: pm.Model
    point: dict | None = None
    #: the guard's ``data_free_potentials`` of a check that passed: False (no Potential
    #: allowed) covers True (Potentials allowed, each checked), not the other way round
    checked: set[bool] | None = None


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar(
    "pymc_dp_call_scope", default=None
)


@contextlib.contextmanager
def call_scope(model: pm.Model) -> Iterator[None]:
    """Within it, `initial_point` of ``model`` is computed once and the model guard's graph
    checks run once (`model_checked`). Nested scopes keep the outer one."""
    if _SCOPE.get() is not None:
        yield
        return
    token = _SCOPE.set(_Scope(model))
    try:
        yield
    finally:
        _SCOPE.reset(token)


def _scope_of(model: pm.Model) -> _Scope | None:
    scope = _SCOPE.get()
    return scope if scope is not None and scope.model is model else None


def initial_point(model: pm.Model) -> dict[str, np.ndarray]:
    """``model.initial_point()``, computed once per `call_scope` (a fresh dict of copies:
    a caller may change it). Data-free."""
    scope = _scope_of(model)
    if scope is None:
        return model.initial_point()
    if scope.point is None:
        scope.point = model.initial_point()
    return {k: np.array(v, copy=True) for k, v in scope.point.items()}


def model_checked(model: pm.Model, data_free_potentials: bool) -> bool:
    """Whether the model guard passed on ``model`` in this `call_scope` with the same or a
    stricter ``data_free_potentials`` (False is stricter: it refuses every Potential)."""
    scope = _scope_of(model)
    if scope is None or not scope.checked:
        return False
    return False in scope.checked or bool(data_free_potentials) in scope.checked


def mark_model_checked(model: pm.Model, data_free_potentials: bool) -> None:
    """Record that the model guard passed on ``model`` (a no-op outside a `call_scope`)."""
    scope = _scope_of(model)
    if scope is not None:
        scope.checked = (scope.checked or set()) | {bool(data_free_potentials)}
