"""PyMC/PyTensor glue: per-record model functions, compiled once per step.

A *record* is index ``i`` along the leading axis of every observed variable (and of every
covariate array of the same leading length that the likelihood reads). The step methods of
pymc_dp need three things from a model, all in the transformed (unconstrained) space the
PyMC step methods work in, as functions of one flat parameter vector ``q``:

1. per-record log-likelihoods ``l_i(q)`` (length ``n``), from which the clipped
   log-likelihood ratios of the penalty test are formed;
2. the prior plus log-Jacobian ``log p(q)``, exact and un-noised (it does not read the
   data), and its gradient;
3. per-record gradients ``grad l_i(q)`` (an ``n x d`` matrix) and, on the hot path of
   DP-HMC, the sum of their clipped versions.

Per-record gradients are built without ``pytensor.gradient.jacobian`` (which needs ``n x n``
memory or a scan over records): the likelihood graph is rewritten to the graph of a single
record, differentiated, and vectorised over the data rows with ``vectorize_graph``. The data
arrays are explicit inputs of every compiled function, so chunking over records for bounded
memory is a slice of the arrays.

Models that cannot be mapped to records are refused with :class:`ModelNotSupportedError`
before any data value is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pymc as pm
import pytensor
import pytensor.tensor as pt
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors

__all__ = [
    "ModelNotSupportedError",
    "RecordFunctions",
    "build_record_functions",
    "count_records",
    "deterministics_reading_data",
]


class ModelNotSupportedError(ValueError):
    """A model that pymc_dp cannot map to records, or would publish data from."""


def _observed_data(model: pm.Model, rv) -> Any:
    """The data node (constant or shared variable) an observed variable is bound to."""
    return model.rvs_to_values[rv]


def _static_leading_length(var) -> int | None:
    """Leading length of a data node, from its static type or shared value (not its values)."""
    if isinstance(var, SharedVariable):
        value = var.get_value(borrow=True)
        return int(np.shape(value)[0]) if np.ndim(value) >= 1 else None
    if isinstance(var, pt.TensorConstant):
        return int(var.data.shape[0]) if var.data.ndim >= 1 else None
    shape = getattr(var.type, "shape", ())
    if len(shape) >= 1 and shape[0] is not None:
        return int(shape[0])
    return None


def count_records(model: pm.Model) -> int:
    """Number of records ``n`` of a model: the common leading length of its observed variables.

    Only shapes are inspected, never data values.

    Raises
    ------
    ModelNotSupportedError
        No observed variables; an observed variable without a leading axis; observed variables
        of different leading lengths; an empty dataset.
    """
    if not model.observed_RVs:
        raise ModelNotSupportedError(
            "the model has no observed variables, so there is no data to protect: "
            "pymc_dp samples posteriors p(theta | x); add the likelihood with observed=..."
        )
    lengths = {}
    for rv in model.observed_RVs:
        n = _static_leading_length(_observed_data(model, rv))
        if n is None:
            raise ModelNotSupportedError(
                f"observed variable {rv.name!r} has no leading record axis; pymc_dp needs every "
                "observed variable to have one row per record (shape (n, ...))"
            )
        lengths[rv.name] = n
    if len(set(lengths.values())) != 1:
        raise ModelNotSupportedError(
            "observed variables have different leading lengths "
            f"({', '.join(f'{k}: {v}' for k, v in lengths.items())}); pymc_dp maps record i to "
            "row i of every observed variable, so they must all have the same number of rows"
        )
    n = next(iter(lengths.values()))
    if n == 0:
        raise ModelNotSupportedError("the dataset is empty (0 records); there is nothing to fit")
    return n


def _reads_data(var, model: pm.Model, n: int) -> bool:
    """Whether a graph reads the data: an observed value, a pm.Data (shared) variable, or any
    constant array with one row per record (conservative: such a constant is treated as data).
    """
    observed = {model.rvs_to_values[rv] for rv in model.observed_RVs}
    for a in ancestors([var]):
        if a in observed:
            return True
        if isinstance(a, SharedVariable) and isinstance(a.type, pt.TensorType):
            return True
        if isinstance(a, pt.TensorConstant) and a.ndim >= 1 and a.data.shape[0] == n:
            return True
    return False


def deterministics_reading_data(model: pm.Model) -> list:
    """The model's Deterministics whose graph reads the data (stored without noise by PyMC)."""
    n = count_records(model)
    return [det for det in model.deterministics if _reads_data(det, model, n)]


def check_model_supported(
    model: pm.Model, vars: Sequence, *, data_free_potentials: bool = False
) -> None:
    """Refuse models that pymc_dp cannot sample privately; reads no data value.

    Parameters
    ----------
    model : pm.Model
    vars : sequence of value variables the step samples.
    data_free_potentials : bool
        The user declares that every ``pm.Potential`` in the model is free of the data.
    """
    count_records(model)
    if model.potentials and not data_free_potentials:
        names = ", ".join(repr(p.name) for p in model.potentials)
        raise ModelNotSupportedError(
            f"the model has pm.Potential terms ({names}); pymc_dp cannot tell whether a "
            "Potential reads the data, and one that does would bypass the privacy mechanism. "
            "If every Potential is a function of parameters only, pass data_free_potentials=True"
        )
    for v in vars:
        if v.dtype in pm.discrete_types:
            raise ModelNotSupportedError(
                f"free variable {v.name!r} is discrete; pymc_dp's step methods sample continuous "
                "parameters only (marginalise the discrete variable out of the model)"
            )


@dataclass
class _Compiled:
    """Compiled functions of one step (picklable)."""

    prior_and_grad: Any
    ll_chunk: Any
    llr_clipped: Any
    grad_chunk: Any | None = None
    grad_clipped: Any | None = None


class RecordFunctions:
    """Per-record functions of a PyMC model for the value variables one step samples.

    Built by :func:`build_record_functions`. All methods take flat parameter vectors in the
    order PyMC's :class:`~pymc.step_methods.arraystep.ArrayStepShared` uses.

    Attributes
    ----------
    n_records : int
        Number of records ``n`` (public under the replace-one neighbour relation).
    ndim : int
        Dimension ``d`` of the flat parameter vector.
    chunk_size : int or None
        Records per call of a compiled function (bounded memory); ``None`` for all at once.
    tempering : float
        Likelihood temperature ``T``: every per-record log-likelihood is multiplied by ``T``.
    """

    def __init__(
        self,
        *,
        compiled: _Compiled,
        data: list[np.ndarray],
        n_records: int,
        ndim: int,
        chunk_size: int | None,
        tempering: float,
        builder: Any,
    ) -> None:
        self._c = compiled
        self._data = data
        self.n_records = n_records
        self.ndim = ndim
        self.chunk_size = chunk_size
        self.tempering = tempering
        self._builder = builder

    # -- chunking -------------------------------------------------------------------------
    def _chunks(self):
        step = self.chunk_size or self.n_records
        for start in range(0, self.n_records, step):
            yield [a[start : start + step] for a in self._data]

    # -- data-free parts --------------------------------------------------------------------
    def prior_logp_and_grad(self, q: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior plus log-Jacobian at ``q`` and its gradient; never reads the data."""
        lp, g = self._c.prior_and_grad(q)
        return float(lp), np.asarray(g)

    def prior_logp(self, q: np.ndarray) -> float:
        """Log prior plus log-Jacobian at ``q``; never reads the data."""
        return self.prior_logp_and_grad(q)[0]

    # -- data reads (only call these from inside a privacy mechanism) ----------------------
    def loglik(self, q: np.ndarray) -> np.ndarray:
        """Per-record (tempered) log-likelihoods ``T * l_i(q)``, shape ``(n,)``."""
        return np.concatenate([self._c.ll_chunk(q, *c) for c in self._chunks()])

    def loglik_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> np.ndarray:
        """Per-record log-likelihood differences ``T * (l_i(q_new) - l_i(q_old))``."""
        return self.loglik(q_new) - self.loglik(q_old)

    def clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float
    ) -> tuple[float, int]:
        """Sum of per-record log-likelihood ratios clipped to ``[-bound, bound]``.

        Returns the clipped sum and the number of clipped records. The count is computed from
        the data without noise: it must never be published except behind an explicit,
        loudly labelled non-private option.
        """
        total, count = 0.0, 0
        for c in self._chunks():
            s, k = self._c.llr_clipped(q_new, q_old, bound, *c)
            total += float(s)
            count += int(k)
        return total, count

    def _ensure_grad(self) -> None:
        if self._c.grad_chunk is None:
            self._c.grad_chunk, self._c.grad_clipped = self._builder.compile_gradients()

    def per_record_grad(self, q: np.ndarray) -> np.ndarray:
        """Per-record gradients ``T * grad l_i(q)``, shape ``(n, d)``."""
        self._ensure_grad()
        return np.concatenate([self._c.grad_chunk(q, *c) for c in self._chunks()], axis=0)

    def clipped_grad_sum(self, q: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
        """``sum_i clip_b(grad l_i(q))`` with each record's gradient clipped to L2 norm ``b``.

        Returns the sum (shape ``(d,)``) and the number of clipped records (non-private: see
        :meth:`clipped_loglik_ratio_sum`).
        """
        self._ensure_grad()
        total = np.zeros(self.ndim)
        count = 0
        for c in self._chunks():
            g, k = self._c.grad_clipped(q, bound, *c)
            total += g
            count += int(k)
        return total, count

    def check_start(self, q: np.ndarray) -> None:
        """Refuse a start point where some record's log-likelihood is NaN or -inf.

        Reads the data once; the error names no record and no value.
        """
        for c in self._chunks():
            if not np.all(np.isfinite(self._c.ll_chunk(q, *c))):
                raise ValueError(
                    "the log-likelihood is NaN or infinite for at least one record at the start "
                    "point; choose initvals inside the support of every record's likelihood "
                    "(or check the data against the model)"
                )


class _Builder:
    """Symbolic pieces kept to compile the gradient functions lazily."""

    def __init__(self, x, one_record, rows, batch, compile_kwargs):
        self.x = x
        self.one_record = one_record
        self.rows = rows
        self.batch = batch
        self.compile_kwargs = compile_kwargs

    def compile_gradients(self):
        """Per-record gradient (n x d) and clipped-gradient-sum functions."""
        g_one = pytensor.grad(self.one_record, self.x)
        grads = vectorize_graph(g_one, dict(zip(self.rows, self.batch, strict=True)))
        bound = pt.dscalar("grad_clip_bound")
        norms = pt.sqrt(pt.sum(pt.sqr(grads), axis=1))
        scale = pt.minimum(1.0, bound / pt.maximum(norms, 1e-300))
        clipped = pt.sum(grads * scale[:, None], axis=0)
        n_clipped = pt.sum(pt.gt(norms, bound))
        f_grad = pm.pytensorf.compile([self.x, *self.batch], grads, **self.compile_kwargs)
        f_clip = pm.pytensorf.compile(
            [self.x, bound, *self.batch], [clipped, n_clipped], **self.compile_kwargs
        )
        return f_grad, f_clip


def _data_nodes(graph, n: int, exclude: set) -> list:
    """Data arrays the likelihood reads: constants and shared tensors of leading length n."""
    nodes = []
    for a in ancestors([graph]):
        if a in exclude or a in nodes:
            continue
        if isinstance(a, pt.TensorConstant) or (
            isinstance(a, SharedVariable) and isinstance(a.type, pt.TensorType)
        ):
            if a.ndim >= 1 and _static_leading_length(a) == n:
                nodes.append(a)
    return nodes


def _node_value(node) -> np.ndarray:
    if isinstance(node, SharedVariable):
        return np.asarray(node.get_value())
    return np.asarray(node.data)


def _fake_rows(arrays: list[np.ndarray], m: int) -> list[np.ndarray]:
    """Data-free stand-in records (same dtypes and trailing shapes) for structural checks."""
    fake = []
    for a in arrays:
        shape = (m, *a.shape[1:])
        if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
            fake.append(np.zeros(shape, dtype=a.dtype))
        else:
            base = 0.5 + 0.1 * np.arange(m).reshape((m,) + (1,) * (a.ndim - 1))
            fake.append(np.broadcast_to(base, shape).astype(a.dtype))
    return fake


def build_record_functions(
    model: pm.Model,
    vars: Sequence,
    initial_point: dict[str, np.ndarray],
    *,
    tempering: float = 1.0,
    chunk_size: int | None = None,
    data_free_potentials: bool = False,
    compile_kwargs: dict | None = None,
) -> tuple[RecordFunctions, dict]:
    """Compile the per-record functions of ``model`` for the value variables ``vars``.

    Parameters
    ----------
    model : pm.Model
    vars : sequence of value variables (transformed space) the step samples.
    initial_point : dict
        A point of the model (used for shapes and for the shared replacements of the free
        variables this step does not sample; never for data).
    tempering : float
        Likelihood temperature ``T > 0`` (thesis Sec. 3.1); the per-record log-likelihoods are
        ``T * log p(x_i | theta)``.
    chunk_size : int, optional
        Records per call; bounds the memory of per-record gradients to ``chunk_size x d``.
    data_free_potentials : bool
        Declare that every ``pm.Potential`` is a function of the parameters only.
    compile_kwargs : dict, optional
        Passed to :func:`pymc.pytensorf.compile`.

    Returns
    -------
    (RecordFunctions, dict)
        The functions and the shared replacements (for ``ArrayStepShared``).

    Raises
    ------
    ModelNotSupportedError
        For models that cannot be mapped to records (checked before any data value is read).
    """
    if not (np.isfinite(tempering) and tempering > 0):
        raise ValueError(f"tempering must be a finite number > 0; got {tempering!r}")
    if chunk_size is not None and (int(chunk_size) != chunk_size or chunk_size < 1):
        raise ValueError(f"chunk_size must be a positive integer or None; got {chunk_size!r}")
    check_model_supported(model, vars, data_free_potentials=data_free_potentials)
    n = count_records(model)
    compile_kwargs = dict(compile_kwargs or {})

    shared = make_shared_replacements(initial_point, vars, model)
    ll_terms = model.logp(vars=model.observed_RVs, sum=False)
    per_record = []
    for t in ll_terms:
        if t.ndim == 0:
            raise ModelNotSupportedError(
                "an observed variable's log-likelihood is a scalar; pymc_dp needs one term per "
                "record (a leading record axis)"
            )
        per_record.append(pt.sum(t, axis=tuple(range(1, t.ndim))) if t.ndim > 1 else t)
    ll_vec = per_record[0] if len(per_record) == 1 else pt.add(*per_record)
    prior_terms = list(model.free_RVs)
    if data_free_potentials:
        prior_terms += list(model.potentials)
    prior = model.logp(vars=prior_terms, jacobian=True)

    [ll_vec, prior], x = join_nonshared_inputs(initial_point, [ll_vec, prior], vars, shared)
    x.name = "q"
    ll_vec = rewrite_graph(ll_vec, include=("canonicalize",), exclude=("constant_folding",))
    if tempering != 1.0:
        ll_vec = ll_vec * tempering

    exclude = set(shared.values())
    data_nodes = _data_nodes(ll_vec, n, exclude)
    prior_data = _data_nodes(prior, n, exclude) if data_free_potentials else []
    if prior_data:
        raise ModelNotSupportedError(
            "a pm.Potential declared data-free reads an array with one row per record; "
            "it would bypass the privacy mechanism"
        )
    batch = [
        pt.tensor(dtype=d.dtype, shape=(None, *d.type.shape[1:]), name=f"data{i}")
        for i, d in enumerate(data_nodes)
    ]
    rows = [
        pt.tensor(dtype=d.dtype, shape=d.type.shape[1:], name=f"row{i}")
        for i, d in enumerate(data_nodes)
    ]
    ll_batch = clone_replace(
        ll_vec, replace=dict(zip(data_nodes, batch, strict=True)), rebuild_strict=False
    )
    one = clone_replace(
        ll_vec,
        replace={d: r[None] for d, r in zip(data_nodes, rows, strict=True)},
        rebuild_strict=False,
    ).sum()
    one = rewrite_graph(one, include=("canonicalize",), exclude=("constant_folding",))

    x_new = x.type("q_new")
    bound = pt.dscalar("llr_clip_bound")
    r = clone_replace(ll_batch, replace={x: x_new}) - ll_batch
    llr_sum = pt.sum(pt.clip(r, -bound, bound))
    llr_count = pt.sum(pt.gt(pt.abs(r), bound))

    f_prior = pm.pytensorf.compile([x], [prior, pytensor.grad(prior, x)], **compile_kwargs)
    f_ll = pm.pytensorf.compile([x, *batch], ll_batch, **compile_kwargs)
    f_llr = pm.pytensorf.compile([x_new, x, bound, *batch], [llr_sum, llr_count], **compile_kwargs)

    q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars]).astype(x.dtype)
    data = [_node_value(d) for d in data_nodes]
    _check_separable(f_ll, q0, data, n)
    for a in data:
        # Outcome of this check is one bit about the data, shown to the analyst who runs the
        # sampler (the trusted curator); no value, count or position is reported.
        if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            raise ValueError(
                "the observed data (or a covariate array with one row per record) contains NaN "
                "or infinite values; pymc_dp needs complete, finite data: drop or impute those "
                "records before sampling"
            )

    fns = RecordFunctions(
        compiled=_Compiled(prior_and_grad=f_prior, ll_chunk=f_ll, llr_clipped=f_llr),
        data=data,
        n_records=n,
        ndim=int(q0.size),
        chunk_size=int(chunk_size) if chunk_size else None,
        tempering=float(tempering),
        builder=_Builder(x, one, rows, batch, compile_kwargs),
    )
    return fns, shared


def _check_separable(f_ll, q0: np.ndarray, data: list[np.ndarray], n: int) -> None:
    """Check on data-free stand-in records that the likelihood separates by record."""
    if not data:
        raise ModelNotSupportedError(
            "could not find the data arrays with one row per record in the likelihood graph"
        )
    fake3 = _fake_rows(data, 3)
    # Two data-free points: the start point and a fixed perturbation of it (at the start
    # point a parameter may be zero and hide a dependence between records).
    offset = 0.05 * (1.0 + np.arange(q0.size)) / q0.size
    try:
        out3 = np.concatenate([np.asarray(f_ll(q, *fake3)) for q in (q0, q0 + offset)])
        out1 = np.concatenate(
            [np.asarray(f_ll(q, *[a[1:2] for a in fake3])) for q in (q0, q0 + offset)]
        )
    except Exception as err:  # noqa: BLE001 - report as unsupported model structure
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record (its graph failed on a "
            f"subset of records: {type(err).__name__}); pymc_dp needs i.i.d.-style models whose "
            "data arrays all have the record axis first"
        ) from None
    if (
        out3.shape != (6,)
        or out1.shape != (2,)
        or not np.allclose(out3[[1, 4]], out1, equal_nan=True)
    ):
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record; pymc_dp needs models "
            "where record i's log-likelihood depends only on row i of the data"
        )
