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
import pytensor.scalar as ps
import pytensor.tensor as pt
from pymc.pytensorf import join_nonshared_inputs, make_shared_replacements
from pytensor.compile.builders import OpFromGraph
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.basic import Alloc
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import SpecifyShape

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
    """The data node (constant or shared variable) an observed variable is bound to.

    PyMC casts observed ``pm.Data`` to the variable's dtype (e.g. integer data of a
    ``Bernoulli`` become ``Cast{int64}(y)``); the cast is looked through to the data node.
    """
    value = model.rvs_to_values[rv]
    while (
        value.owner is not None
        and isinstance(value.owner.op, Elemwise)
        and isinstance(value.owner.op.scalar_op, ps.Cast)
    ):
        value = value.owner.inputs[0]
    return value


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


def _value_ancestors(graphs) -> list:
    """Ancestors of ``graphs`` whose *values* the graphs depend on.

    Like :func:`pytensor.graph.traversal.ancestors`, but the inputs of ``Shape`` and
    ``Shape_i`` nodes are not followed: a graph that reads only the shape of a data array
    (e.g. ``shape=X.shape[1]``) reads no data value (shapes are public, like ``n``).
    """
    from pytensor.tensor.shape import Shape, Shape_i

    seen: set = set()
    out: list = []
    stack = list(graphs)
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        out.append(v)
        if v.owner is not None and not isinstance(v.owner.op, Shape | Shape_i):
            stack.extend(v.owner.inputs)
    return out


def _record_data_read(graphs, model: pm.Model, n: int, exclude=frozenset()) -> list[str]:
    """Names of the record data a graph reads values of (empty when it reads none).

    Record data: the value of an observed variable, an observed variable itself (PyMC
    replaces it by its data when it evaluates a graph, e.g. a Deterministic), and any array
    (``pm.Data`` container or numpy constant) with one row per record (leading length ``n``).
    Only graph structure and static shapes are inspected, never data values. Variables in
    ``exclude`` (the shared stand-ins of parameters another step samples) are skipped.
    """
    observed = {_observed_data(model, rv) for rv in model.observed_RVs}
    observed_rvs = set(model.observed_RVs)
    names = []
    for a in _value_ancestors(graphs):
        if a in exclude:
            continue
        hit = a in observed or a in observed_rvs
        if not hit and (
            isinstance(a, pt.TensorConstant)
            or (isinstance(a, SharedVariable) and isinstance(a.type, pt.TensorType))
        ):
            hit = a.ndim >= 1 and _static_leading_length(a) == n
        if hit:
            names.append(a.name or f"an unnamed array of {n} rows")
    return sorted(set(names))


def _reads_data(var, model: pm.Model, n: int) -> bool:
    """Whether a graph reads data values: an observed value or variable, any ``pm.Data``
    array (conservative: a shared array of any length is treated as data), or any constant
    array with one row per record. Shape reads and scalar shared variables (e.g. the lengths
    of mutable dims) are not data reads.
    """
    if _record_data_read([var], model, n):
        return True
    return any(
        isinstance(a, SharedVariable) and isinstance(a.type, pt.TensorType) and a.ndim >= 1
        for a in _value_ancestors([var])
    )


def deterministics_reading_data(model: pm.Model) -> list:
    """The model's Deterministics whose graph reads the data (stored without noise by PyMC)."""
    n = count_records(model)
    return [det for det in model.deterministics if _reads_data(det, model, n)]


def imputed_variables(model: pm.Model) -> list[str]:
    """Observed variables whose data has missing values that PyMC imputes.

    For observed data with NaN (or a numpy masked array) PyMC creates ``{name}_observed``
    (the observed entries), a free ``{name}_unobserved`` and a Deterministic ``{name}`` that
    holds every observed value. Found from the variable names PyMC creates; no data value is
    read (the outcome says only whether such variables exist).
    """
    named = model.named_vars
    out = []
    for rv in model.observed_RVs:
        if rv.name and rv.name.endswith("_observed"):
            base = rv.name[: -len("_observed")]
            if f"{base}_unobserved" in named:
                out.append(base)
    return out


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
    imputed = imputed_variables(model)
    if imputed:
        raise ModelNotSupportedError(
            f"the observed data of {imputed} has missing values (NaN or masked entries): PyMC "
            "would impute them, storing every observed value in a Deterministic and revealing "
            "where the gaps are. pymc_dp needs complete data: drop or impute the incomplete "
            "records before building the model, by a rule that does not look at the other "
            "records (or model the missingness explicitly)"
        )
    n = count_records(model)
    if model.potentials and not data_free_potentials:
        names = ", ".join(repr(p.name) for p in model.potentials)
        raise ModelNotSupportedError(
            f"the model has pm.Potential terms ({names}); pymc_dp cannot tell whether a "
            "Potential reads the data, and one that does would bypass the privacy mechanism. "
            "If every Potential is a function of parameters only, pass data_free_potentials=True"
        )
    # Everything outside the per-record likelihood enters the acceptance tests exactly (no
    # noise): the prior and log-Jacobian of every free variable, data-free Potentials, and
    # the initial values. None of them may read record data.
    outside = [(f"the prior of {rv.name!r}", rv) for rv in model.free_RVs]
    if data_free_potentials:
        outside += [(f"pm.Potential declared data-free ({p.name!r})", p) for p in model.potentials]
    for label, var in outside:
        graph = model.logp(vars=[var], jacobian=True) if var in model.free_RVs else var
        read = _record_data_read([graph], model, n)
        if read:
            raise ModelNotSupportedError(
                f"{label} reads record data ({', '.join(read)}); it would enter every "
                "acceptance test without noise and bypass the privacy mechanism. Priors and "
                "Potentials must be functions of the parameters and of public constants only "
                "(not of the observed data, a pm.Data array with one row per record, or an "
                "aggregate of one such as its mean)"
            )
    for rv, init in model.rvs_to_initial_values.items():
        if isinstance(init, pytensor.graph.basic.Variable) and _record_data_read([init], model, n):
            raise ModelNotSupportedError(
                f"the initial value of {rv.name!r} is computed from record data; the chains "
                "would start at a data-dependent point outside the privacy mechanism. Use a "
                "public initial value (initvals=..., or the default)"
            )
    for v in vars:
        if v.dtype in pm.vartypes.discrete_types:
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

    def loglik_ratio_subset(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """``T * (l_i(q_new) - l_i(q_old))`` for the records ``idx`` only (repeats allowed).

        Reads only the rows ``idx`` of every data array (one fancy-indexing read per array), so
        the cost is ``O(len(idx))``, independent of ``n``: the minibatch of DP-Fast MH.
        """
        rows = [a[idx] for a in self._data]
        return np.asarray(self._c.ll_chunk(q_new, *rows)) - np.asarray(
            self._c.ll_chunk(q_old, *rows)
        )

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
        :meth:`clipped_loglik_ratio_sum`). A record whose gradient is not finite contributes
        0 (and counts as clipped). Models whose per-record gradient factorises as
        ``v_i(q) x_i`` per parameter block (GLMs) take a faster route with the same result
        (see :meth:`_Builder.compile_gradients`); its per-chunk row norms of the data are
        computed on first use and cached.
        """
        self._ensure_grad()
        fs = self._c.grad_clipped
        step = self.chunk_size or self.n_records
        cache = self.__dict__.setdefault("_grad_row_sq", {})
        total = np.zeros(self.ndim)
        count = 0
        for start, c in zip(range(0, self.n_records, step), self._chunks(), strict=True):
            row_sq = None
            if fs["fast"] is not None:
                key = (step, start)
                if key not in cache:
                    r = [np.asarray(a) for a in fs["row_sq"](*c)]
                    # a non-finite data row: the generic route zeroes that record's gradient
                    cache[key] = r if all(np.all(np.isfinite(a)) for a in r) else None
                row_sq = cache[key]
            if row_sq is None:
                g, k = fs["generic"](q, bound, *c)
            else:
                g, k = fs["fast"](q, bound, *row_sq, *c)
            total += g
            count += int(k)
        return total, count

    def clipped_grad_sum_subset(
        self, q: np.ndarray, bound: float, idx: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """``sum_{i in idx} clip_b(grad l_i(q))`` reading only the rows ``idx`` of the data.

        The minibatch gradient of DP-SGLD / DP-SGNHT. Returns the sum (shape ``(d,)``) and the
        number of clipped records (non-private, as in :meth:`clipped_grad_sum`). One
        fancy-indexing read per data array, in chunks of ``chunk_size``, through the generic
        clipped-gradient function (the fast route's cached row norms are per full chunk); an
        empty subsample reads nothing and gives 0.
        """
        total = np.zeros(self.ndim)
        count = 0
        idx = np.asarray(idx)
        if idx.size == 0:
            return total, count
        self._ensure_grad()
        f = self._c.grad_clipped["generic"]
        step = self.chunk_size or idx.size
        for start in range(0, idx.size, step):
            rows = [a[idx[start : start + step]] for a in self._data]
            g, k = f(q, bound, *rows)
            total += np.asarray(g)
            count += int(k)
        return total, count

    @property
    def gradient_route(self) -> str:
        """Route of :meth:`clipped_grad_sum`: ``"GLM fast"``, ``"generic"`` or ``"not compiled"``
        (the gradient functions are compiled on first use). Structural, not data-dependent:
        the fast route is chosen on data-free stand-in records."""
        fs = self._c.grad_clipped
        if fs is None:
            return "not compiled"
        return "GLM fast" if fs["fast"] is not None else "generic"

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
        """Per-record gradient and clipped-gradient-sum functions, compiled on first use.

        Returns ``(f_grad, f_clip)``. ``f_grad(q, *chunk)`` gives the ``(m, d)`` per-record
        gradients of a chunk of ``m`` records. ``f_clip`` is a dict of compiled functions
        read by :meth:`RecordFunctions.clipped_grad_sum`:

        ``"generic"``
            ``(q, b, *chunk) -> (sum_i clip_b(g_i), n_clipped)`` for every model: the
            ``m x d`` per-record gradients are formed, their norms taken, and the clipped
            rows summed.
        ``"fast"``, ``"row_sq"`` (both ``None`` when the model does not qualify)
            The same sum for models whose per-record gradient factorises, per parameter
            block, as ``g_i[block] = v_i(q) m_i`` with ``m_i`` the row of a matrix that
            depends on the data only (GLMs: ``m_i = x_i``). Then
            ``||g_i[block]||^2 = v_i^2 ||m_i||^2``, where ``||m_i||^2`` is computed once per
            chunk by ``row_sq(*chunk)`` and passed to ``fast(q, b, *row_sq, *chunk)``, and
            the clipped sum of the block is the matrix-vector product ``M^T (w v)``: the
            same passes over the data as the gradient of the summed log-likelihood, instead
            of forming and reducing the ``m x d`` per-record gradients. Blocks that do not
            factorise (e.g. an intercept or a scale parameter: one column) are handled like
            the generic route within the same function. The factorisation is verified on
            data-free stand-in records before it is used.

        Records whose gradient is not finite contribute 0 in both routes (their norm stays
        below ``b``, so the sensitivity stays ``2 b``; otherwise one NaN would be released
        without noise). Norms are formed from squared norms, never as ``sqrt(sqr(.))``:
        pytensor < 2.39 rewrites ``sqrt(sqr(x))`` to ``switch(x >= 0, x, nan)`` (pytensor
        PR #1952), which a one-parameter model triggers.
        """
        import pytensor.scalar as ps
        from pytensor.graph.traversal import io_toposort
        from pytensor.tensor.elemwise import Elemwise
        from pytensor.tensor.subtensor import Subtensor

        x, batch = self.x, self.batch
        ck = dict(self.compile_kwargs)
        to_batch = dict(zip(self.rows, batch, strict=True))
        bound = pt.dscalar("grad_clip_bound")
        huge = np.finfo(np.float64).max

        def clip_weights(sq_norms):
            finite = pt.le(sq_norms, huge)
            inv_norm = pt.minimum(1.0, bound / pt.sqrt(pt.maximum(sq_norms, 1e-300)))
            scale = pt.switch(finite, inv_norm, 0.0)
            return finite, scale, pt.sum(pt.invert(pt.le(sq_norms, bound * bound)))

        def masked_sum(block, finite, scale):
            return pt.sum(pt.switch(finite[:, None], block * scale[:, None], 0.0), axis=0)

        grads = vectorize_graph(pytensor.grad(self.one_record, x), to_batch)
        finite, scale, n_clipped = clip_weights(pt.sum(pt.sqr(grads), axis=1))
        f_grad = pm.pytensorf.compile([x, *batch], grads, **ck)
        f_generic = pm.pytensorf.compile(
            [x, bound, *batch], [masked_sum(grads, finite, scale), n_clipped], **ck
        )

        def factor(block):
            """``(M, v)`` with ``block = M * v[:, None]`` and M data-only, else None."""
            node = block.owner
            if (
                node is not None
                and isinstance(node.op, Elemwise)
                and isinstance(node.op.scalar_op, ps.TrueDiv)
                and node.inputs[1].type.broadcastable[1]
            ):  # (M * v) / u with u constant along the block: M * (v / u)
                f = factor(node.inputs[0])
                return None if f is None else (f[0], f[1] / node.inputs[1][:, 0])
            if not (
                node is not None
                and isinstance(node.op, Elemwise)
                and isinstance(node.op.scalar_op, ps.Mul)
                and block.ndim == 2
                and block.type.shape[1] not in (None, 1)
            ):
                return None
            full = [i for i in node.inputs if i.type.broadcastable == (False, False)]
            rest = [i for i in node.inputs if i.type.broadcastable[1]]
            if len(full) != 1 or len(full) + len(rest) != len(node.inputs):
                return None
            if x in ancestors([full[0]]):
                return None
            v = pt.mul(*rest) if rest else pt.ones((1, 1))
            return full[0], v[:, 0]

        def factorised():
            d = x.type.shape[0]
            if d is None:
                return None
            # Parameter blocks: the slices of q the one-record graph reads (one per value
            # variable), located by evaluating them at q = 0, 1, ..., d - 1 (no data).
            clients = [n for n in io_toposort([x], [self.one_record]) if x in n.inputs]
            pieces = [x]
            if clients and all(isinstance(n.op, Subtensor) for n in clients):
                pieces = [n.outputs[0] for n in clients]
            if any(p.ndim > 1 for p in pieces):
                return None
            where = pytensor.function([x], pieces, on_unused_input="ignore")(
                np.arange(d, dtype=x.dtype)
            )
            where = [np.atleast_1d(w).astype(int) for w in where]
            starts = [int(w[0]) if w.size else -1 for w in where]
            order = np.argsort(starts)
            if not np.array_equal(np.concatenate([where[i] for i in order]), np.arange(d)):
                return None
            wrt = [pieces[i] for i in order]
            gs = pytensor.grad(self.one_record, wrt=wrt, disconnected_inputs="ignore")
            blocks = vectorize_graph(list(gs), to_batch)
            blocks = [
                rewrite_graph(b, include=("canonicalize",), exclude=("constant_folding",))
                for b in blocks
            ]
            blocks = [b[:, None] if b.ndim == 1 else b for b in blocks]
            split = [factor(b) for b in blocks]
            if not any(split):
                return None
            row_sq_in, row_sq_out, sq_terms = [], [], []
            for b, f in zip(blocks, split, strict=True):
                if f is None:
                    sq_terms.append(pt.sum(pt.sqr(b), axis=1))
                else:
                    r = pt.vector(f"row_sq{len(row_sq_in)}", dtype="float64")
                    row_sq_in.append(r)
                    row_sq_out.append(pt.cast(pt.sum(pt.sqr(f[0]), axis=1), "float64"))
                    sq_terms.append(pt.sqr(f[1]) * r)
            finite, scale, n_clipped = clip_weights(pt.add(*sq_terms))
            parts = [
                masked_sum(b, finite, scale)
                if f is None
                else pt.dot(pt.switch(finite, scale * f[1], 0.0), f[0])
                for b, f in zip(blocks, split, strict=True)
            ]
            clipped = pt.concatenate(parts) if len(parts) > 1 else parts[0]
            kw = {"on_unused_input": "ignore", **ck}
            f_fast = pm.pytensorf.compile(
                [x, bound, *row_sq_in, *batch], [clipped, n_clipped], **kw
            )
            f_row_sq = pm.pytensorf.compile(list(batch), row_sq_out, **kw)
            # Verify on data-free stand-in records, at two points, with and without clipping.
            if any(None in b.type.shape[1:] for b in batch):
                return None
            fake = []
            for b in batch:
                shape = (5, *b.type.shape[1:])
                k = np.arange(int(np.prod(shape))).reshape(shape)
                if np.issubdtype(np.dtype(b.dtype), np.integer) or b.dtype == "bool":
                    fake.append((k % 2).astype(b.dtype))
                else:
                    fake.append((0.3 + 0.1 * ((7 * k) % 11)).astype(b.dtype))
            row_sq = f_row_sq(*fake)
            checked = False
            for q in (np.zeros(d), 0.1 + 0.05 * np.arange(d)):
                for b in (1e-3, 1e6):
                    g1, k1 = f_generic(q.astype(x.dtype), b, *fake)
                    g2, k2 = f_fast(q.astype(x.dtype), b, *row_sq, *fake)
                    if int(k1) != int(k2) or not np.allclose(g1, g2, rtol=1e-9, atol=1e-12):
                        return None
                    checked = checked or bool(np.all(np.isfinite(g1)) and np.any(g1 != 0))
            return {"fast": f_fast, "row_sq": f_row_sq} if checked else None

        try:
            fast = factorised()
        except Exception:  # noqa: BLE001 - any failure just means: use the generic route
            fast = None
        return f_grad, {"generic": f_generic, **(fast or {"fast": None, "row_sq": None})}


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


def _inline_op_from_graph(graph):
    """Expand ``OpFromGraph`` nodes (e.g. ``LogSumExp`` of PyTensor 3): their inner graphs are
    frozen with the static shapes of the full dataset and would pin them to ``n`` records."""
    for _ in range(10):  # nested OpFromGraphs: expand level by level
        nodes = [
            v.owner
            for v in ancestors([graph])
            if v.owner is not None and isinstance(v.owner.op, OpFromGraph)
        ]
        if not nodes:
            return graph
        replacements = {}
        for node in set(nodes):
            replacements.update(zip(node.outputs, _expand(node), strict=True))
        graph = clone_replace(graph, replace=replacements, rebuild_strict=False)
    return graph


def _expand(node) -> list:
    """The inner graph of an ``OpFromGraph`` node, bound to the node's inputs."""
    try:  # PyTensor >= 3: frozen inner graphs
        from pytensor.compile.rewriting import inline_ofg_node

        return list(inline_ofg_node(node))
    except ImportError:  # PyTensor 2.x
        return clone_replace(
            node.op.inner_outputs,
            replace=dict(zip(node.op.inner_inputs, node.inputs, strict=True)),
        )


def _drop_shape_pins(graph):
    """Remove the nodes that pin shapes to ``n`` records.

    PyMC fixes the observed variable's shape to ``n`` (``SpecifyShape``, and ``Alloc`` to the
    observed shape); once the data arrays are replaced by chunks or single rows those pins
    would fail, or silently broadcast one record to ``n``. ``SpecifyShape`` is dropped; an
    ``Alloc`` is dropped only when its input already has the output's static shape (it is a
    no-op). Any other broadcast stays, and the separability checks refuse the model.
    """
    replacements = {}
    for v in ancestors([graph]):
        if v.owner is None:
            continue
        op, inp = v.owner.op, v.owner.inputs[0]
        if isinstance(op, SpecifyShape):
            replacements[v] = inp
        elif (
            isinstance(op, Alloc)
            and inp.type.ndim == v.type.ndim
            and None not in v.type.shape
            and tuple(inp.type.shape) == tuple(v.type.shape)
        ):
            replacements[v] = inp
    if not replacements:
        return graph
    return clone_replace(graph, replace=replacements, rebuild_strict=False)


def _node_value(node) -> np.ndarray:
    if isinstance(node, SharedVariable):
        return np.asarray(node.get_value())
    return np.asarray(node.data)


def _fake_rows(arrays: list[np.ndarray], m: int) -> list[np.ndarray]:
    """Data-free stand-in records (same dtypes and trailing shapes) for structural checks.

    The rows are distinct, unsorted and asymmetric, so that no row equals an aggregate of the
    rows (their mean, median, maximum, ...) and no permutation of them is sorted: a likelihood
    that reads such an aggregate, or a neighbouring record, gives a record a different value
    within the group than alone. Float entries lie in (0.1, 0.95) (inside the support of the
    common positive and unit-interval likelihoods); integer and boolean entries are 0 or 1 in
    an asymmetric pattern (valid category and group indices for two or more levels).
    """
    # A fixed irrational-step (golden ratio) sequence: distinct, unsorted entries, none equal
    # to the mean, median or extreme of the rows (tests check this); no data is used.
    fake = []
    for j, a in enumerate(arrays):
        shape = (m, *a.shape[1:])
        k = np.arange(int(np.prod(shape)), dtype=float).reshape(shape) + 7.0 * j
        if np.issubdtype(a.dtype, np.integer) or a.dtype == bool:
            pattern = np.array([1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1])
            idx = (np.arange(int(np.prod(shape))) + 3 * j).reshape(shape) % pattern.size
            fake.append(pattern[idx].astype(a.dtype))
        else:
            frac = np.mod(0.3 + k * (np.sqrt(5.0) - 1.0) / 2.0 + 0.1 * np.sqrt(k + 2.0), 1.0)
            fake.append((0.1 + 0.85 * frac).astype(a.dtype))
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
    ll_vec = _drop_shape_pins(_inline_op_from_graph(ll_vec))
    ll_vec = rewrite_graph(ll_vec, include=("canonicalize",), exclude=("constant_folding",))
    ll_vec = _drop_shape_pins(ll_vec)
    if tempering != 1.0:
        ll_vec = ll_vec * tempering

    exclude = set(shared.values())
    data_nodes = _data_nodes(ll_vec, n, exclude)
    # Second line of defence after check_model_supported: the compiled prior (prior,
    # log-Jacobian and declared data-free Potentials, joined) reads no record data.
    prior_data = _record_data_read([prior], model, n, exclude)
    if prior_data:
        raise ModelNotSupportedError(
            "the prior (or a pm.Potential declared data-free) reads an array with one row per "
            "record; it would bypass the privacy mechanism"
        )
    batch = [
        pt.tensor(dtype=d.dtype, shape=(None, *d.type.shape[1:]), name=f"data{i}")
        for i, d in enumerate(data_nodes)
    ]
    rows = [
        pt.tensor(dtype=d.dtype, shape=d.type.shape[1:], name=f"row{i}")
        for i, d in enumerate(data_nodes)
    ]
    ll_batch = _drop_shape_pins(
        clone_replace(
            ll_vec, replace=dict(zip(data_nodes, batch, strict=True)), rebuild_strict=False
        )
    )
    one = clone_replace(
        ll_vec,
        replace={d: r[None] for d, r in zip(data_nodes, rows, strict=True)},
        rebuild_strict=False,
    )
    one = _drop_shape_pins(one).sum()
    one = rewrite_graph(one, include=("canonicalize",), exclude=("constant_folding",))

    x_new = x.type("q_new")
    bound = pt.dscalar("llr_clip_bound")
    r = clone_replace(ll_batch, replace={x: x_new}) - ll_batch
    # A record whose log-likelihood is -inf at both points gives NaN: it contributes 0 (any
    # value within the bounds keeps the sensitivity 2 * bound) instead of a NaN that would
    # decide the test without noise. +-inf are clipped like any large ratio.
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))

    f_prior = pm.pytensorf.compile([x], [prior, pytensor.grad(prior, x)], **compile_kwargs)
    f_ll = pm.pytensorf.compile([x, *batch], ll_batch, **compile_kwargs)
    f_llr = pm.pytensorf.compile([x_new, x, bound, *batch], [llr_sum, llr_count], **compile_kwargs)

    q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars]).astype(x.dtype)
    data = [_node_value(d) for d in data_nodes]
    _check_separable(f_ll, q0, data, n)
    observed = {_observed_data(model, rv) for rv in model.observed_RVs}
    for node, a in zip(data_nodes, data, strict=True):
        # Only arrays the user supplied (observed values, pm.Data): PyMC may also fold a
        # constant such as an all -inf bound into an array of n rows, which is not data.
        # The outcome of this check is one bit about the data, shown to the analyst who runs
        # the sampler (the trusted curator); no value, count or position is reported.
        if not (node in observed or isinstance(node, SharedVariable)):
            continue
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
    """Check on data-free stand-in records that the likelihood separates by record.

    Record ``i``'s log-likelihood must depend on row ``i`` of the data only. On ``m = 8``
    stand-in records (:func:`_fake_rows`) at three parameter points, the log-likelihoods of
    all records evaluated together are compared with (a) each record evaluated alone and
    (b) the records in reversed order. A likelihood reading an aggregate of the records (mean,
    sum, standard deviation, maximum, a sort, a cumulative sum) or another record (a
    difference of neighbours) fails (a) or (b). No data value is read.
    """
    if not data:
        raise ModelNotSupportedError(
            "could not find the data arrays with one row per record in the likelihood graph"
        )
    m = 8  # even: the median of the rows is not one of them
    fake = _fake_rows(data, m)
    rev = [a[::-1] for a in fake]
    # Three data-free points: the start point and two fixed perturbations of it (at the start
    # point a parameter may be zero and hide a dependence between records).
    offset = 0.05 * (1.0 + np.arange(q0.size)) / q0.size
    points = (q0, q0 + offset, q0 - 0.7 * offset[::-1])
    try:
        together = [np.asarray(f_ll(q.astype(q0.dtype), *fake)) for q in points]
        reversed_ = [np.asarray(f_ll(q.astype(q0.dtype), *rev)) for q in points]
        alone = [
            np.concatenate(
                [
                    np.asarray(f_ll(q.astype(q0.dtype), *[a[i : i + 1] for a in fake]))
                    for i in range(m)
                ]
            )
            for q in points
        ]
    except Exception as err:  # noqa: BLE001 - report as unsupported model structure
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record (its graph failed on a "
            f"subset of records: {type(err).__name__}); pymc_dp needs i.i.d.-style models whose "
            "data arrays all have the record axis first"
        ) from None
    ok = all(
        t.shape == (m,) and a.shape == (m,) and r.shape == (m,)
        for t, a, r in zip(together, alone, reversed_, strict=True)
    )
    ok = ok and all(
        np.allclose(t, a, rtol=1e-9, atol=1e-12, equal_nan=True)
        and np.allclose(t[::-1], r, rtol=1e-9, atol=1e-12, equal_nan=True)
        for t, a, r in zip(together, alone, reversed_, strict=True)
    )
    if not ok:
        raise ModelNotSupportedError(
            "the likelihood does not separate into one term per record; pymc_dp needs models "
            "where record i's log-likelihood depends only on row i of the data (not on an "
            "aggregate of the data such as its mean, nor on other records)"
        )
