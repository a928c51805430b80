"""The one place that compiles the per-record functions, and the choice of backend.

Every compiled function of the glue goes through `compile_function`, so the backend
(PyTensor's C, Numba or JAX linker) is one parameter for all of them. The user chooses it
with ``compile_kwargs={"mode": ...}`` (given to the step); without a ``mode`` pymc_dp
chooses per kind of function, from measurements (``benchmarks/bench_models.py``,
``docs/benchmarks.md``):

===================  ============================================  ========================
PyTensor line        log-likelihoods; GLM, indexed, blocks routes  generic route, prior
                     (``"loglik"``, ``"route"``)                   (``"other"``)
===================  ============================================  ========================
2.x (C default)      Numba when ``numba`` imports                  PyTensor's default (C)
3.x (Numba default)  PyTensor's default (Numba)                    PyTensor's default
===================  ============================================  ========================

On PyTensor 2.38 Numba computes the clipped log-likelihood-ratio sums 2.5-7x faster than C
(0.23 ms against 0.71 ms on a 50-group hierarchical model, n = 10^5) and, since the
one-column blocks are summed inside the fused elementwise loop
(`pymc_dp.records.clipping.weighted_sum`), the routes' clipped gradient sums 1.0-2.8x
faster (banana on the blocks route 0.25 against 0.70 ms, 50-group model 1.5 against
2.3 ms, Poisson with a random intercept 3.0 against 4.1 ms; varying slopes equal); Numba's
``Dot`` of an ``m``-vector is what made it slower than C before. The generic route (which
assembles an ``m x d`` matrix) stays on C there. If a Numba compilation (or its first
call) fails, the function is compiled again with PyTensor's default: the automatic choice
never makes a model fail that PyTensor's default compiles.
JAX is never chosen automatically (not a dependency; ``mode="JAX"`` works where it
compiles).

Every compiled function is called through `_TrustedCall`: when the arguments already have
the types of the inputs (numpy arrays of the input's dtype, number of dimensions and static
shape; a Python number for a 0-d floating-point input), PyTensor's per-call input filter
is skipped (``trust_input``), as PyMC does for its own logp-and-gradient function. That
filter cost 27 us per call of a five-input function on PyTensor 3.3 (3.6 us with
``trust_input``), one tenth of a clipped gradient sum at ``n = 10^5``. Any other argument
goes through the filter as before (same conversions, same errors).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
import pytensor

__all__ = ["auto_mode", "compile_function", "direct_jit"]

_PYTENSOR_MAJOR = int(pytensor.__version__.split(".")[0])


def auto_mode(kind: str) -> str | None:
    """The backend pymc_dp picks for a function of ``kind`` when the user gives none.

    ``None`` means PyTensor's default mode.
    """
    if kind in ("loglik", "route") and _PYTENSOR_MAJOR < 3 and importlib.util.find_spec("numba"):
        return "NUMBA"
    return None


class _WithFallback:
    """A function compiled in an automatically chosen mode, recompiled with PyTensor's
    default mode if that compilation or its first call fails (picklable)."""

    def __init__(self, f, args) -> None:
        self._f = f
        self._args = args
        self._tried = False

    def __call__(self, *a):
        if self._tried:
            return self._f(*a)
        try:
            out = self._f(*a)
        except Exception:  # noqa: BLE001 - a backend failure: fall back to the default
            inputs, outputs, kw = self._args
            self._f = _compile(inputs, outputs, **kw)
            out = self._f(*a)
        self._tried = True
        return out

    def __getattr__(self, name):  # ``maker``, ``profile``, ... of the compiled function
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._f, name)


class _TrustedCall:
    """A compiled function that skips PyTensor's input filter for arguments that already
    have the input types (picklable); any other call is filtered as usual."""

    def __init__(self, f) -> None:
        self._f = f
        self._spec = []
        for i in f.maker.inputs:
            t = i.variable.type
            shape = tuple(t.shape)
            # the static shape to compare with: all of it, none of it, or per axis (rare)
            check = shape if None not in shape else (None if set(shape) == {None} else False)
            self._spec.append((np.dtype(t.dtype), t.ndim, check, shape))
        self._n = len(self._spec)

    def _exact(self, args) -> list | None:
        """``args`` (a Python number made a 0-d array of a float input's dtype) when each
        has its input's dtype, dimensions and static shape; else None."""
        if len(args) != self._n:
            return None
        out = []
        for a, (dtype, ndim, check, shape) in zip(args, self._spec):  # noqa: B905 - checked
            if type(a) is not np.ndarray:
                if ndim or dtype.kind != "f" or type(a) not in (float, int):
                    return None
                a = np.asarray(a, dtype=dtype)
            elif a.dtype != dtype or a.ndim != ndim or not a.flags.aligned:
                return None
            elif check is not None and a.shape != check:
                if check is not False or any(
                    s is not None and s != t for s, t in zip(shape, a.shape, strict=True)
                ):
                    return None
            out.append(a)
        return out

    def __call__(self, *args):
        f = self._f
        exact = self._exact(args)
        if exact is None:
            f.trust_input = False
            return f(*args)
        f.trust_input = True
        return f(*exact)

    def __getattr__(self, name):  # ``maker``, ``profile``, ... of the compiled function
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._f, name)


def direct_jit(f, args: Sequence) -> Any | None:
    """The JIT-compiled function under ``f`` (a function of `compile_function`), to be
    called as ``jit(*args)`` in place of ``f(*args)``, or ``None``.

    PyTensor's Numba linker (the default on PyTensor 3.x, the routes' backend on 2.x)
    compiles a function's whole graph to one Numba function; a call of the PyTensor
    ``Function`` with trusted inputs stores the arguments, calls it and returns its
    outputs. Called directly with the same arguments it returns the same arrays, without
    the ~4-8 us of the layers around it (`_TrustedCall`'s check, ``Function.__call__``,
    the thunk): a tenth of a clipped gradient sum of the banana at ``n = 10^5`` on
    PyTensor 3.3 (issue 28). ``None`` unless ``f`` is compiled by the Numba linker (and,
    if in an automatically chosen mode, called once already), has no implicit inputs
    (shared variables), no updates and no profiling, returns a list, and ``args`` (the
    arguments the caller will keep passing, 0-d arrays for scalars) have exactly its
    input types (`_TrustedCall`'s check). The caller passes arguments of the same types.
    """
    if isinstance(f, _WithFallback):
        if not f._tried:
            return None
        f = f._f
    if not isinstance(f, _TrustedCall) or f._exact(list(args)) is None:
        return None
    fn = f._f
    maker = getattr(fn, "maker", None)
    jit = getattr(getattr(fn, "vm", None), "jit_fn", None)
    if maker is None or jit is None or getattr(fn, "profile", None):
        return None
    if len(maker.fgraph.inputs) != len(maker.inputs) or any(
        getattr(i, "update", None) is not None or getattr(i, "implicit", False)
        for i in maker.inputs
    ):
        return None
    if getattr(fn, "unpack_single", False) or getattr(fn, "return_none", False):
        return None
    if len(maker.fgraph.outputs) != len(fn.output_storage):
        return None
    return jit


def _compile(inputs, outputs, **kw):
    """`pymc.pytensorf.compile`, called through `_TrustedCall`."""
    return _TrustedCall(pm.pytensorf.compile(inputs, outputs, **kw))


def _is_pure_c(mode) -> bool:
    """Whether ``mode`` is PyTensor's ``"C"`` mode (the C linker without Python fallbacks)."""
    if isinstance(mode, str):
        return mode.upper() == "C"
    linker = getattr(mode, "linker", None)
    return type(linker).__name__ == "CLinker"


def compile_function(
    inputs: Sequence,
    outputs: Any,
    compile_kwargs: dict | None = None,
    *,
    kind: str = "other",
    **kwargs: Any,
):
    """Compile ``outputs`` as a function of ``inputs`` with `pymc.pytensorf.compile`.

    Parameters
    ----------
    inputs : sequence of PyTensor variables
    outputs : variable or list of variables
    compile_kwargs : dict, optional
        The user's options (e.g. ``{"mode": "NUMBA"}``), as given to the step. A ``mode``
        here overrides the automatic choice.
    kind : str
        ``"loglik"`` for the per-record log-likelihood functions, ``"route"`` for the GLM,
        indexed and blocks routes, else ``"other"``: selects the automatic backend
        (`auto_mode`).
    **kwargs
        Options of this call (e.g. ``on_unused_input="ignore"``); the user's take precedence.
    """
    kw = {**kwargs, **(compile_kwargs or {})}
    inputs = list(inputs)
    mode = None if "mode" in kw else auto_mode(kind)
    if mode is None:
        try:
            return _compile(inputs, outputs, **kw)
        except NotImplementedError as err:
            if _is_pure_c(kw.get("mode")):
                raise NotImplementedError(
                    f"compile_kwargs mode {kw['mode']!r} is PyTensor's pure C linker, which "
                    "needs C code for every operation; PyTensor "
                    f"{pytensor.__version__} has none for an operation of this model's "
                    "per-record functions (e.g. the indexed increment of the segment sums). "
                    'Use mode="CVM" (C with Python fallbacks), "NUMBA", or no mode '
                    "(automatic choice)."
                ) from err
            raise
    try:
        f = _compile(inputs, outputs, **{**kw, "mode": mode})
    except Exception:  # noqa: BLE001 - a backend failure: fall back to the default
        return _compile(inputs, outputs, **kw)
    return _WithFallback(f, (inputs, outputs, kw))
