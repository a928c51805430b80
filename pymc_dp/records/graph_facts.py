"""Graph facts about a PyMC model, from its structure and static shapes only.

Which nodes hold the data, how many records there are, and whether a graph reads record
data. Nothing here reads a data value (a shared variable's *shape* is read, which is public
like ``n``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pymc as pm
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.compile.sharedvalue import SharedVariable
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.tensor.elemwise import Elemwise

from pymc_dp.records.errors import ModelNotSupportedError
from pymc_dp.records.store import node_shape

__all__ = [
    "costly_per_record_ops",
    "count_records",
    "data_nodes",
    "deterministics_reading_data",
    "imputed_variables",
    "observed_data",
    "reads_data",
    "record_data_read",
    "static_leading_length",
    "value_ancestors",
]


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
    if isinstance(var, SharedVariable | pt.TensorConstant):
        shape = node_shape(var)
        return int(shape[0]) if len(shape) >= 1 else None
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

    Like `pytensor.graph.traversal.ancestors`, but the inputs of ``Shape`` and
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

    With one record (``n = 1``) a one-dimensional constant of length 1 is not counted: it
    cannot be told by its shape from a parameter's shape or a broadcast scalar (PyMC makes
    the constants ``[3]``, ``[0]`` and ``[5]`` of ``pm.Normal("b", 0, 5, shape=3)``), and a
    record's value written into the model as such a constant is a number written into the
    model, which no shape rule detects at any ``n`` (see docs/privacy.md on aggregates).
    ``pm.Data`` containers and the observed data are still counted.
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
            if n == 1 and a.ndim == 1 and isinstance(a, pt.TensorConstant):
                hit = False
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


# Public names (the underscored ones are kept for the modules that used them).
observed_data = _observed_data
static_leading_length = _static_leading_length
value_ancestors = _value_ancestors
record_data_read = _record_data_read
reads_data = _reads_data
data_nodes = _data_nodes


#: Scalar ops a record's log-likelihood may apply per record and stay cheap: arithmetic,
#: comparisons, selections (a few cycles each, vectorised).
_CHEAP_SCALAR = (
    ps.Add, ps.Sub, ps.Mul, ps.Neg, ps.TrueDiv, ps.IntDiv, ps.Sqr, ps.Abs, ps.Sqrt, ps.Switch,
    ps.Maximum, ps.Minimum, ps.Identity, ps.Cast, ps.Second, ps.LogicalComparison, ps.AND,
    ps.OR, ps.XOR, ps.Invert, ps.IsNan, ps.IsInf,
)  # fmt: skip


def _cheap_scalar(op, node) -> bool:
    if isinstance(op, ps.Composite):
        return all(_cheap_scalar(n.op, n) for n in op.fgraph.apply_nodes)
    if isinstance(op, ps.Pow):  # x ** k with a small integer constant k: multiplications
        k = node.inputs[1]
        while k.owner is not None and not isinstance(k, Constant) and len(k.owner.inputs) == 1:
            k = k.owner.inputs[0]  # look through a DimShuffle / cast of the constant
        if isinstance(k, Constant):
            v = np.asarray(k.data)
            return v.size == 1 and float(v) == round(float(v)) and abs(float(v)) <= 4
        return False
    return isinstance(op, _CHEAP_SCALAR)


#: Non-elementwise ops that do work per record (a dot product over a record's row, a
#: batched linear-algebra op).
_COSTLY_OPS = {"Dot", "Dot22", "Dot22Scalar", "Gemv", "Gemm", "Blockwise", "Scan"}


def costly_per_record_ops(ll_batch, batch: list) -> list[str]:
    """Names of the ops of ``ll_batch`` applied per record (their output depends on the
    records ``batch``) that are not elementary arithmetic: transcendental functions
    (``log``, ``exp``, ``gammaln``, ...) and reductions over a record's row (a dot product).
    Gathers, reshapes and arithmetic are cheap. Structure only (data-free): decides whether
    keeping per-record log-likelihoods between releases (``n`` floats written and read per
    release) pays for the evaluation it saves (`pymc_dp.records.LoglikMemo`).
    """
    from pytensor.tensor.elemwise import CAReduce

    per_record = set(batch)
    costly = []
    for node in io_toposort(list(batch), [ll_batch]):
        if not any(i in per_record for i in node.inputs):
            continue
        per_record.update(node.outputs)
        op = node.op
        if isinstance(op, Elemwise):
            if not _cheap_scalar(op.scalar_op, node):
                costly.append(type(op.scalar_op).__name__)
        elif isinstance(op, CAReduce):  # a sum over a row; a check's all() is cheap
            if not isinstance(op.scalar_op, ps.AND | ps.OR):
                costly.append(type(op).__name__)
        elif type(op).__name__ in _COSTLY_OPS:
            costly.append(type(op).__name__)
        # else: gathers, reshapes, parameter checks (pass-through)
    return costly
