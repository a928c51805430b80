"""Interval arithmetic over a PyTensor graph: sound enclosures of a function over a box.

`interval_eval` walks a graph in topological order and gives every variable an interval
``[lo, hi]`` (elementwise numpy arrays) that contains every value the variable takes when the
inputs range over their boxes: the natural interval extension of the graph (Moore, Kearfott &
Cloud 2009, Ch. 5, the fundamental theorem of interval arithmetic: an enclosure of every
operation gives an enclosure of the composition). It is a true enclosure, possibly wider than
the range (an input read twice is treated as two independent inputs). Used by
`pymc_dp.auto.bounds` to bound per-record gradients and Hessians over declared data bounds
and a public parameter box: it reads no data.

Operations without a rule raise `IntervalUnsupported` (the caller falls back to a DP
selection). Floating-point rounding is not directed; the caller adds a relative margin.

References
----------
.. [1] R. E. Moore, R. B. Kearfott, M. J. Cloud, Introduction to Interval Analysis, SIAM
   (2009), Ch. 5 (natural interval extensions, Theorem 5.1). [Moore2009]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from pytensor.graph.basic import Constant, Variable
from pytensor.graph.traversal import io_toposort
from pytensor.scalar import basic as ps
from pytensor.scalar import math as psm
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise

__all__ = ["IntervalUnsupported", "interval_eval", "interval_eval_split", "split_candidates"]

Interval = tuple[np.ndarray, np.ndarray]


class IntervalUnsupported(Exception):
    """The graph has an operation (or an input) that `interval_eval` has no rule for."""


def _hull(*vals: np.ndarray) -> Interval:
    stack = np.broadcast_arrays(*vals)
    with np.errstate(invalid="ignore"):
        return np.minimum.reduce(stack), np.maximum.reduce(stack)


def _mul(a: Interval, b: Interval) -> Interval:
    with np.errstate(invalid="ignore", over="ignore"):
        prods = [a[i] * b[j] for i in (0, 1) for j in (0, 1)]
    # 0 * inf = 0 (the convention of extended interval multiplication)
    prods = [np.where(np.isnan(p), 0.0, p) for p in prods]
    return _hull(*prods)


def _recip(b: Interval) -> Interval:
    lo, hi = b
    pos = lo > 0
    neg = hi < 0
    with np.errstate(divide="ignore"):
        rlo = np.where(pos | neg, 1.0 / np.where(hi == 0, np.inf, hi), -np.inf)
        rhi = np.where(pos | neg, 1.0 / np.where(lo == 0, -np.inf, lo), np.inf)
    return rlo, rhi


def _increasing(f: Callable) -> Callable[[Interval], Interval]:
    def rule(a: Interval) -> Interval:
        with np.errstate(all="ignore"):
            return f(a[0]), f(a[1])

    return rule


def _sqr(a: Interval) -> Interval:
    lo, hi = a
    m = np.maximum(lo * lo, hi * hi)
    low = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(lo * lo, hi * hi))
    return low, m


def _abs(a: Interval) -> Interval:
    lo, hi = a
    m = np.maximum(np.abs(lo), np.abs(hi))
    low = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    return low, m


def _pow(a: Interval, e: Interval) -> Interval:
    if not np.all(e[0] == e[1]):
        # x ** e = exp(e log x) for x > 0
        if np.any(a[0] <= 0):
            raise IntervalUnsupported("pow with an interval exponent and a base not > 0")
        return _increasing(np.exp)(_mul(e, _increasing(np.log)(a)))
    ex = e[0]
    lo, hi = np.broadcast_arrays(a[0], a[1])
    ex = np.broadcast_to(ex, lo.shape)
    with np.errstate(all="ignore"):
        cands = [lo**ex, hi**ex]
        integer = ex == np.round(ex)
        straddles = (lo < 0) & (hi > 0)
        cands.append(np.where(straddles & (ex > 0), 0.0, cands[0]))
        # a negative exponent over an interval with 0: unbounded
        blow = straddles & (ex < 0) | ((lo == 0) | (hi == 0)) & (ex < 0)
        bad = (lo < 0) & ~integer
    if np.any(bad):
        raise IntervalUnsupported("pow of a possibly negative base to a non-integer exponent")
    out_lo, out_hi = _hull(*cands)
    out_lo = np.where(blow, -np.inf, out_lo)
    out_hi = np.where(blow, np.inf, out_hi)
    return out_lo, out_hi


def _switch(c: Interval, a: Interval, b: Interval) -> Interval:
    # a condition is true where it is non-zero
    sure_true = (c[0] > 0) | (c[1] < 0)
    sure_false = (c[0] == 0) & (c[1] == 0)
    hlo, hhi = _hull(a[0], b[0]), _hull(a[1], b[1])
    lo = np.where(sure_true, a[0], np.where(sure_false, b[0], hlo[0]))
    hi = np.where(sure_true, a[1], np.where(sure_false, b[1], hhi[1]))
    return lo, hi


def _cmp(sure: Callable, possible: Callable) -> Callable:
    def rule(a: Interval, b: Interval) -> Interval:
        return sure(a, b).astype(float), possible(a, b).astype(float)

    return rule


#: Elementwise rules by scalar-op class.
_ELEMWISE: dict[type, Callable[..., Interval]] = {
    ps.Add: lambda *xs: (sum(x[0] for x in xs), sum(x[1] for x in xs)),
    ps.Sub: lambda a, b: (a[0] - b[1], a[1] - b[0]),
    ps.Neg: lambda a: (-a[1], -a[0]),
    ps.TrueDiv: lambda a, b: _mul(a, _recip(b)),
    ps.Reciprocal: _recip,
    ps.Exp: _increasing(np.exp),
    ps.Log: _increasing(np.log),
    ps.Log1p: _increasing(np.log1p),
    ps.Expm1: _increasing(np.expm1),
    ps.Sqrt: _increasing(np.sqrt),
    ps.Tanh: _increasing(np.tanh),
    ps.ArcTan: _increasing(np.arctan),
    psm.Sigmoid: _increasing(lambda x: 0.5 * (1.0 + np.tanh(0.5 * x))),
    psm.Softplus: _increasing(lambda x: np.logaddexp(0.0, x)),
    ps.Sqr: _sqr,
    ps.Abs: _abs,
    ps.Pow: _pow,
    ps.Sign: _increasing(np.sign),
    ps.Maximum: lambda a, b: (np.maximum(a[0], b[0]), np.maximum(a[1], b[1])),
    ps.Minimum: lambda a, b: (np.minimum(a[0], b[0]), np.minimum(a[1], b[1])),
    ps.Switch: _switch,
    ps.Second: lambda a, b: tuple(
        np.broadcast_to(v, np.broadcast_shapes(a[0].shape, v.shape)) for v in b
    ),
    ps.Identity: lambda a: a,
    ps.Cast: lambda a: a,
    ps.GE: _cmp(lambda a, b: a[0] >= b[1], lambda a, b: a[1] >= b[0]),
    ps.GT: _cmp(lambda a, b: a[0] > b[1], lambda a, b: a[1] > b[0]),
    ps.LE: _cmp(lambda a, b: a[1] <= b[0], lambda a, b: a[0] <= b[1]),
    ps.LT: _cmp(lambda a, b: a[1] < b[0], lambda a, b: a[0] < b[1]),
    ps.EQ: _cmp(
        lambda a, b: (a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0]),
        lambda a, b: (a[0] <= b[1]) & (b[0] <= a[1]),
    ),
    ps.NEQ: _cmp(
        lambda a, b: (a[1] < b[0]) | (b[1] < a[0]),
        lambda a, b: ~((a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0])),
    ),
    ps.AND: lambda *xs: (
        np.minimum.reduce([x[0] for x in xs]),
        np.minimum.reduce([x[1] for x in xs]),
    ),
    ps.OR: lambda *xs: (
        np.maximum.reduce([x[0] for x in xs]),
        np.maximum.reduce([x[1] for x in xs]),
    ),
    ps.Invert: lambda a: (1.0 - a[1], 1.0 - a[0]),
}


def _mul_n(*xs: Interval) -> Interval:
    out = xs[0]
    for x in xs[1:]:
        out = _mul(out, x)
    return out


_ELEMWISE[ps.Mul] = _mul_n


def _composite(scalar_op, *ins: Interval) -> Interval:
    """A fused scalar graph (``Composite``): its inner operations, one after the other."""
    fg = scalar_op.fgraph
    env = dict(zip(fg.inputs, ins, strict=True))

    def get(v):
        if v in env:
            return env[v]
        if isinstance(v, Constant):
            return (np.asarray(v.data, dtype=float), np.asarray(v.data, dtype=float))
        raise IntervalUnsupported(f"Composite input {v} unknown")

    for node in fg.toposort():
        lo, hi = _rule_for(node.op)(*[get(v) for v in node.inputs])
        env[node.outputs[0]] = (np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))
    if len(fg.outputs) != 1:
        raise IntervalUnsupported("Composite with several outputs")
    return get(fg.outputs[0])


def _rule_for(scalar_op) -> Callable[..., Interval]:
    if isinstance(scalar_op, ps.Composite):
        return lambda *ins: _composite(scalar_op, *ins)
    for cls in type(scalar_op).__mro__:
        if cls in _ELEMWISE:
            return _ELEMWISE[cls]
    raise IntervalUnsupported(f"no interval rule for {type(scalar_op).__name__}")


def _dot(a: Interval, b: Interval) -> Interval:
    al, ah = a
    bl, bh = b
    if al.ndim == 0 or bl.ndim == 0:
        return _mul(a, b)
    a2 = (np.atleast_2d(al), np.atleast_2d(ah))
    b2 = (bl.reshape(bl.shape[0], -1), bh.reshape(bh.shape[0], -1))
    prods = _mul((a2[0][:, :, None], a2[1][:, :, None]), (b2[0][None], b2[1][None]))
    lo, hi = prods[0].sum(axis=1), prods[1].sum(axis=1)
    shape = al.shape[:-1] + bl.shape[1:]
    return lo.reshape(shape), hi.reshape(shape)


def _perform(node, args: list) -> list:
    store = [[None] for _ in node.outputs]
    node.op.perform(node, args, store)
    return [s[0] for s in store]


def _cast(a, var: Variable, value: bool) -> np.ndarray:
    """An input for ``perform``: a bound as float (value inputs) or the input's dtype."""
    return np.asarray(a, dtype=float if value and var.dtype != "bool" else var.dtype)


def _is_point(iv: Interval) -> bool:
    return bool(np.all(np.asarray(iv[0]) == np.asarray(iv[1])))


#: Ops that only move, copy or add entries (monotone in each value input, the other inputs
#: being shapes or indices): the bounds go through ``perform`` separately.
_STRUCTURAL = (
    "DimShuffle",
    "Subtensor",
    "AdvancedSubtensor",
    "AdvancedSubtensor1",
    "IncSubtensor",
    "AdvancedIncSubtensor",
    "AdvancedIncSubtensor1",
    "Alloc",
    "Join",
    "MakeVector",
    "Reshape",
    "SpecifyShape",
    "ScalarFromTensor",
    "TensorFromScalar",
    "Split",
)
#: Ops whose output depends only on shapes (or on point inputs): evaluated once.
_SHAPE_ONLY = ("Shape", "Shape_i", "Eye", "ARange")


def interval_eval(
    outputs: Sequence[Variable], boxes: dict[Variable, tuple[np.ndarray, np.ndarray]]
) -> list[Interval]:
    """Enclosures ``[lo, hi]`` of ``outputs`` when every input of ``boxes`` ranges over its box.

    Parameters
    ----------
    outputs : sequence of Variable
        Graph outputs.
    boxes : dict
        ``{input variable: (lo, hi)}``: arrays of the input's shape (or broadcastable).
        Constants of the graph are points; any other root raises `IntervalUnsupported`.

    Returns
    -------
    list of (lo, hi)
        Elementwise bounds of each output, as float arrays (booleans as 0/1).

    Raises
    ------
    IntervalUnsupported
        An operation without a rule, an interval where an index must be a point, or a root
        that is neither a constant nor in ``boxes``.
    """
    env: dict[Variable, Interval] = {}
    for var, (lo, hi) in boxes.items():
        env[var] = (np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))

    def get(v: Variable) -> Interval:
        if v in env:
            return env[v]
        if isinstance(v, Constant):
            val = np.asarray(v.data)
            env[v] = (val, val)
            return env[v]
        raise IntervalUnsupported(f"graph input {v} has no declared box")

    for node in io_toposort(list(boxes), list(outputs)):
        op = node.op
        name = type(op).__name__
        ins = [get(v) for v in node.inputs]
        if isinstance(op, Elemwise):
            rule = _rule_for(op.scalar_op)
            lo, hi = rule(*[(np.asarray(a), np.asarray(b)) for a, b in ins])
            out = [(np.asarray(lo, dtype=float), np.asarray(hi, dtype=float))]
            if not isinstance(op.scalar_op, ps.Second | ps.Switch):
                shape = np.broadcast_shapes(*[np.shape(i[0]) for i in ins])
                out = [tuple(np.broadcast_to(v, shape) for v in out[0])]
        elif isinstance(op, CAReduce):
            axis = op.axis
            lo, hi = ins[0]
            if isinstance(op.scalar_op, ps.Add):
                out = [(np.sum(lo, axis=axis), np.sum(hi, axis=axis))]
            elif isinstance(op.scalar_op, ps.ScalarMaximum):
                out = [(np.max(lo, axis=axis), np.max(hi, axis=axis))]
            elif isinstance(op.scalar_op, ps.ScalarMinimum):
                out = [(np.min(lo, axis=axis), np.min(hi, axis=axis))]
            else:
                raise IntervalUnsupported(f"no interval rule for reduction {op}")
        elif name == "Dot":
            out = [_dot(*ins)]
        elif name in ("CheckParameterValue", "Assert"):
            out = [ins[0]]  # the value passes through (the checks raise, they do not change it)
        elif name in _SHAPE_ONLY or all(_is_point(i) for i in ins):
            pairs = zip(ins, node.inputs, strict=True)
            vals = _perform(node, [_cast(i[0], v, False) for i, v in pairs])
            out = [(np.asarray(v), np.asarray(v)) for v in vals]
        elif name in _STRUCTURAL or isinstance(op, DimShuffle):
            # value inputs may be intervals; every other input (index, shape) must be a point
            value_pos = {0, 1} if "IncSubtensor" in name else {0}
            if name == "MakeVector":
                value_pos = set(range(len(ins)))
            elif name == "Join":  # the axis is a scalar input in older PyTensor, an attribute later
                value_pos = {k for k, v in enumerate(node.inputs) if v.type.ndim > 0}
            for k, iv in enumerate(ins):
                if k not in value_pos and not _is_point(iv):
                    raise IntervalUnsupported(
                        "indexing by a data array (e.g. a group index, z[g]): the entry each "
                        "record reads is not bounded by a box"
                        if "Subtensor" in name
                        else f"a shape read from the data ({name})"
                    )
            pairs = list(enumerate(zip(ins, node.inputs, strict=True)))
            los = _perform(node, [_cast(i[0], v, k in value_pos) for k, (i, v) in pairs])
            his = _perform(node, [_cast(i[1], v, k in value_pos) for k, (i, v) in pairs])
            out = list(zip(los, his, strict=True))
        else:
            raise IntervalUnsupported(f"no interval rule for {name}")
        for v, iv in zip(node.outputs, out, strict=True):
            env[v] = (np.asarray(iv[0], dtype=float), np.asarray(iv[1], dtype=float))
    return [get(o) for o in outputs]


#: Scalar operations after which a wide input interval loses tightness (their outputs are
#: reused: the dependency problem of interval arithmetic).
_NONLINEAR = (
    ps.Exp,
    ps.Log,
    ps.Log1p,
    ps.Expm1,
    psm.Sigmoid,
    psm.Softplus,
    ps.Tanh,
    ps.Pow,
    ps.Sqr,
    ps.TrueDiv,
    ps.Reciprocal,
)


def split_candidates(outputs: Sequence[Variable], inputs: Sequence[Variable], limit: int = 3):
    """Scalar variables that feed a nonlinear elementwise operation (topological order).

    Splitting one of them into pieces (`interval_eval_split`) tightens the enclosure of a
    graph like ``(y - sigmoid(eta)) x`` written with ``sigmoid(eta)`` used several times.
    """
    out: list[Variable] = []
    for node in io_toposort(list(inputs), list(outputs)):
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, _NONLINEAR):
            for v in node.inputs:
                if (
                    not isinstance(v, Constant)
                    and v.owner is not None
                    and all(s in (1, None) for s in (v.type.shape or ()))
                    and v not in out
                ):
                    out.append(v)
        if len(out) >= limit:
            break
    return out


def interval_eval_split(
    outputs: Sequence[Variable],
    boxes: dict[Variable, tuple[np.ndarray, np.ndarray]],
    split: Variable,
    pieces: int,
    per_piece: bool = False,
) -> list[Interval] | list[list[Interval]]:
    """`interval_eval` with the enclosure of ``split`` cut into ``pieces`` parts.

    ``per_piece``: the list of every part's enclosures instead of their union.

    Every value the graph takes has ``split`` in one of the parts, so the union of the
    enclosures computed with ``split`` set to each part (the rest of the graph over the full
    boxes) encloses the range (Moore et al. 2009, Sec. 6.1: subdivision).
    """
    slo, shi = interval_eval([split], boxes)[0]
    if not (np.all(np.isfinite(slo)) and np.all(np.isfinite(shi))) or _is_point((slo, shi)):
        whole = interval_eval(outputs, boxes)
        return [whole] if per_piece else whole
    edges = np.linspace(0.0, 1.0, pieces + 1)
    if per_piece:
        return [
            interval_eval(outputs, {**boxes, split: (slo + a * (shi - slo), slo + b * (shi - slo))})
            for a, b in zip(edges[:-1], edges[1:], strict=True)
        ]
    acc: list[Interval] | None = None
    for a, b in zip(edges[:-1], edges[1:], strict=True):
        part = {**boxes, split: (slo + a * (shi - slo), slo + b * (shi - slo))}
        res = interval_eval(outputs, part)
        if acc is None:
            acc = res
        else:
            acc = [
                (np.minimum(p[0], r[0]), np.maximum(p[1], r[1]))
                for p, r in zip(acc, res, strict=True)
            ]
    return acc
