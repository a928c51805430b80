"""Blocks of records whose clipped gradient sum needs no per-record weight (issue 28).

Where a model's per-record gradient is an *affine* function of the record's values,
``g(q, r) = J(q) r + c(q)`` (the banana: ``x1 ~ N(t0, s1)``, ``x2 ~ N(t1 + a t0^2, s2)``,
whose gradient in ``(t0, t1)`` is linear in ``(x1, x2)`` with coefficients depending on
``q`` only), two facts make most records cheap:

* ``||g(q, r)||^2`` is a convex function of ``r``, so its maximum over a box of records
  ``lo <= r <= hi`` is attained at one of the box's ``2^k`` corners (``k`` values a
  record). If every corner's gradient lies inside the clip region, every record of the
  box does, and its clip weight is exactly 1 (no record of the box is clipped or
  counted).
* The sum of an affine function over ``n_B`` records is ``n_B g(q, rbar_B)``, with
  ``rbar_B`` the records' mean: the unclipped sum of a box inside the clip region is one
  evaluation of the per-record gradient at a stand-in record.

`AffineBlocks` sorts the records once (when first used, on the whole in-memory records)
into blocks with small bounding boxes (a k-d split at medians along the widest value) and
keeps each block's count, mean and box. A clipped gradient sum then checks the box of all
records, or else every block's box, at the current ``q`` (the per-record gradient function
evaluated at the corners and means: a few hundred stand-in records), takes the inside
blocks' sums from their means and runs the route's per-record loop only on the records of
the other blocks. The result is the route's clipped sum (up to the order of the additions)
and count.

When it applies (`affine_in_data`): every data value a record has is a floating-point
number, and the gradient graph of one record is a polynomial of degree at most 1 in
those values, established structurally from the graph (sums, differences, products,
divisions by data-free terms, constant integer powers, reshaping, indexing by data-free
indices, increments; any other operation on a data-dependent value refuses), never from
the data. Models with integer data (group indices, counts), or whose gradient is not
affine in the data (a GLM's ``x (y - x beta)``, a Poisson rate), keep the route as is:
the bypass applies to the banana and to normal-location models of the same kind
(a normal likelihood whose mean is any function of the parameters and whose scale is
data-free).

Exactness. A block is taken as inside when each corner's squared norm is at most
``(b (1 - m))^2 (1 - 2^-30)`` (``m`` the route's float32 weight margin, 0 for exact
weights): the route gives each of its records the weight 1 exactly, so the same sum;
``2^-30`` absorbs the rounding of the corner evaluation against the per-record one. A
block with a value that is not finite has a non-finite box and takes the per-record
loop. The sensitivity is unchanged (every record's contribution is its own gradient,
norm ``<= b``). The sort order is never published; as for any route, the time of a
call depends on the data (here: how many blocks lie inside).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.graph.basic import Constant
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.subtensor import IncSubtensor, Subtensor

__all__ = [
    "AffineBlocks",
    "affine_in_data",
    "data_degree",
    "limit_sq",
    "ratio_affine_in_data",
    "ratio_values_function",
]

#: Relative safety of the inside test (against the rounding of the corner evaluation).
INSIDE_SAFETY = 2.0**-30
#: Most values a record may have (``2^k`` corners a box).
MAX_VALUES = 6
#: Records a block (leaf of the k-d split).
LEAF_SIZE = 256

_LINEAR = (ps.Add, ps.Sub, ps.Neg, ps.Identity)
_SHAPE_OPS = (DimShuffle,)
#: Indexing and increments by name (their classes differ between PyTensor 2.x and 3.x).
_GATHERS = ("AdvancedSubtensor1", "AdvancedSubtensor")
_SCATTERS = ("AdvancedIncSubtensor1", "AdvancedIncSubtensor")


def _const_value(v) -> float | None:
    """The value of a data-free, parameter-free scalar-like constant ``v``, or None.

    Reading an all-equal array as its one value is safe here: data never reaches this
    function. It is called on the exponent of a power in `data_degree`, only when the
    exponent's degree in the data is 0, on the one-record graph, where every data array
    (any constant or shared tensor of ``n`` rows, covariates included) has already been
    replaced by the symbolic row ``graphs.rows`` (`pymc_dp.records.graphs.per_record_graphs`,
    which also keeps PyMC's and PyTensor's rewrites from specialising on the data's values
    before that: issue 26, helpers 245 and 247). What remains are the model's written-in
    constants (e.g. ``x ** 2``'s ``2``).
    """
    try:
        val = pt.get_underlying_scalar_constant_value(v)
    except Exception:  # noqa: BLE001 - not a constant
        if isinstance(v, Constant):
            a = np.asarray(v.data)
            return float(a.flat[0]) if a.size and np.all(a == a.flat[0]) else None
        return None
    return float(val)


def data_degree(outputs, data, max_degree: int = 2) -> int | None:
    """Polynomial degree of ``outputs`` in the variables ``data`` (None: not a polynomial
    of degree ``<= max_degree``, or an operation this analysis does not know).

    Structural and data-free: constants and every variable outside ``data`` have degree
    0; sums, differences and casts to floating point the largest degree of their terms;
    products the sum; divisions need a data-free divisor; an integer power ``p >= 0``
    given by a constant multiplies the degree by ``p``; reshaping, indexing with data-free
    indices, increments, sums over axes, ``Second`` (fill) and PyTensor's checks keep it.
    Any other operation on a data-dependent value gives None.
    """
    deg: dict[Any, float] = {v: 1 for v in data}
    outputs = list(outputs)
    for node in io_toposort(list(data), outputs):
        ins = [deg.get(i, 0) for i in node.inputs]
        if not any(ins):
            for o in node.outputs:
                deg[o] = 0
            continue
        op = node.op
        name = type(op).__name__
        d: int | None = None
        if isinstance(op, Elemwise):
            s = op.scalar_op
            if isinstance(s, _LINEAR):
                d = max(ins)
            elif isinstance(s, ps.Cast):  # a cast to an integer type is not affine
                d = ins[0] if node.outputs[0].dtype.startswith("float") else None
            elif isinstance(s, ps.Mul):
                d = sum(ins)
            elif isinstance(s, ps.TrueDiv):
                d = ins[0] if ins[1] == 0 else None
            elif isinstance(s, ps.Second):
                d = ins[1]
            elif isinstance(s, ps.Sqr):
                d = 2 * ins[0]
            elif isinstance(s, ps.Pow) and ins[1] == 0:
                p = _const_value(node.inputs[1])
                if p is not None and p >= 0 and float(p).is_integer():
                    d = ins[0] * int(p) if p else 0
            elif isinstance(s, ps.Switch) and ins[0] == 0:
                d = max(ins[1:])
        elif isinstance(op, _SHAPE_OPS) or name in ("Squeeze", "Reshape"):
            d = ins[0] if not any(ins[1:]) else None
        elif isinstance(op, Subtensor) or name in _GATHERS:
            d = ins[0] if not any(ins[1:]) else None
        elif isinstance(op, IncSubtensor) or name in _SCATTERS:
            d = max(ins[:2]) if not any(ins[2:]) else None
        elif isinstance(op, CAReduce) and isinstance(op.scalar_op, ps.Add):
            d = ins[0]
        elif name in ("CheckAndRaise", "Assert", "CheckParameterValue") and not any(ins[1:]):
            d = ins[0]
        elif name in ("MakeVector", "Join"):
            d = max(ins)
        # an unknown operation or a degree above the largest of interest: not a
        # polynomial the caller can use, unless it only reaches the outputs through a
        # shape (``Second``'s first input: the gradient's fill of the log-likelihood)
        for o in node.outputs:
            deg[o] = math.inf if d is None or d > max_degree else d
    out = max((deg.get(o, 0) for o in outputs), default=0)
    return None if out > max_degree else int(out)


def _few_float_values(graphs) -> list | None:
    """The record's data rows where they are floating point with static shapes and at most
    `MAX_VALUES` values in all (the bypass's box has ``2^k`` corners); None otherwise."""
    rows = list(graphs.rows)
    if not rows or any(not r.dtype.startswith("float") for r in rows):
        return None
    if any(None in r.type.shape for r in rows):
        return None
    k = sum(int(np.prod(r.type.shape, dtype=int)) for r in rows)
    return rows if 0 < k <= MAX_VALUES else None


def affine_in_data(graphs) -> bool:
    """Whether one record's gradient (`pymc_dp.records.graphs.RecordGraphs`) is affine in
    the record's values: floating-point data of at most `MAX_VALUES` values a record, and
    a gradient graph of degree at most 1 in them (`data_degree`). Data-free."""
    rows = _few_float_values(graphs)
    if rows is None:
        return False
    grad = pytensor.grad(graphs.one_record, graphs.x)
    if not any(r in ancestors([grad]) for r in rows):
        return False  # gradient not reading the data: nothing to gain here
    return data_degree([grad], rows, max_degree=1) is not None


def ratio_affine_in_data(graphs) -> bool:
    """Whether the log-likelihood ratio ``l(q', r) - l(q, r)`` of one record is affine in
    the record's values ``r``: floating-point data of at most `MAX_VALUES` values, a
    log-likelihood of degree at most 2 in them (`data_degree`) whose second derivatives
    in ``r`` do not depend on the parameters (their graphs, rewritten, do not read
    ``q``; the banana's are constants ``-1 / s^2``). Then the quadratic part cancels in
    the ratio. Data-free."""
    from pytensor.graph.rewriting.utils import rewrite_graph

    rows = _few_float_values(graphs)
    if rows is None:
        return False
    ll = graphs.one_record
    if data_degree([ll], rows, max_degree=2) is None:
        return False
    first = pytensor.grad(ll, rows, disconnected_inputs="ignore")
    for g, r in zip(first, rows, strict=True):
        size = int(np.prod(r.type.shape, dtype=int))  # a gradient has its row's shape
        for entry in [g] if g.ndim == 0 else [g.flatten()[j] for j in range(size)]:
            for h in pytensor.grad(entry, rows, disconnected_inputs="ignore"):
                h = rewrite_graph(h, include=("canonicalize", "stabilize", "specialize"))
                if graphs.x in ancestors([h]):
                    return False
    return True


def ratio_values_function(graphs, compile_kwargs: dict | None = None):
    """``f(q_new, q, *chunk) -> [r]`` with ``r`` the ``m x 1`` per-record log-likelihood
    ratios ``l_i(q_new) - l_i(q)`` (`pymc_dp.records.routes.compile_likelihood`'s ratio
    before clipping), compiled on first call; for stand-in records (`AffineBlocks`)."""
    from pytensor.graph.replace import clone_replace

    from pymc_dp.records.clipping import LazyFunction
    from pymc_dp.records.rewrite import lift_switches

    x, batch = graphs.x, graphs.batch
    ll = lift_switches(graphs.ll_batch)
    x_new = x.type("q_new")
    r = clone_replace(ll, replace={x: x_new}) - ll
    kw = {"kind": "loglik", "on_unused_input": "ignore"}
    return LazyFunction([x_new, x, *batch], [r[:, None]], compile_kwargs, **kw)


def _kd_order(z: np.ndarray, leaf: int) -> tuple[np.ndarray, np.ndarray]:
    """``(perm, sizes)``: an order of the rows of ``z`` (``n x k``) in blocks of at most
    ``leaf`` rows with small boxes (split at the median of the widest column), and the
    sizes of the blocks in that order. Rows with a non-finite value go to blocks of their
    own (whose box is then not finite)."""
    n = z.shape[0]
    ok = np.all(np.isfinite(z), axis=1)
    perm_parts, sizes = [], []
    stack = [np.flatnonzero(ok)]
    while stack:
        idx = stack.pop()
        if idx.size <= leaf:
            if idx.size:
                perm_parts.append(idx)
                sizes.append(idx.size)
            continue
        sub = z[idx]
        col = int(np.argmax(sub.max(axis=0) - sub.min(axis=0)))
        half = idx.size // 2
        part = np.argpartition(sub[:, col], half)
        # pushed high then low: the low half is taken first
        stack.append(idx[part[half:]])
        stack.append(idx[part[:half]])
    bad = np.flatnonzero(~ok)
    for s in range(0, bad.size, leaf):
        perm_parts.append(bad[s : s + leaf])
        sizes.append(min(leaf, bad.size - s))
    perm = np.concatenate(perm_parts) if perm_parts else np.zeros(0, dtype=np.int64)
    assert perm.size == n
    return perm.astype(np.int64), np.asarray(sizes, dtype=np.int64)


class AffineBlocks:
    """The records of one chunk sorted once into blocks with boxes, counts and means.

    Parameters
    ----------
    chunk : tuple of arrays
        The records' data arrays (record axis first, floating point), as the route takes
        them; kept by reference (read only).
    leaf : int
        Records a block (`LEAF_SIZE`).

    Built from the data (its order and block statistics are never published: only the
    clipped sums the route releases are, with their noise).
    """

    def __init__(self, chunk: tuple, leaf: int = LEAF_SIZE) -> None:
        self.chunk = chunk
        n = len(chunk[0])
        self.n = n
        self._shapes = [a.shape[1:] for a in chunk]
        self._dtypes = [a.dtype for a in chunk]
        z = np.concatenate([np.asarray(a, dtype=float).reshape(n, -1) for a in chunk], axis=1)
        self.k = z.shape[1]
        perm, sizes = _kd_order(z, leaf)
        self.perm = perm
        self.sizes = sizes
        self.starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        zs = z[perm]
        #: The records' arrays in block order (a copy: as much memory again as the data),
        #: from which the records of the blocks not inside are read (contiguous runs).
        self.sorted = tuple(np.ascontiguousarray(a[perm]) for a in chunk)
        with np.errstate(all="ignore"):
            self.lo = np.minimum.reduceat(zs, self.starts, axis=0)
            self.hi = np.maximum.reduceat(zs, self.starts, axis=0)
            self.mean = np.add.reduceat(zs, self.starts, axis=0) / sizes[:, None]
            lo_all, hi_all = z.min(axis=0), z.max(axis=0)
            mean_all = z.mean(axis=0)
        del zs
        self.counts = sizes.astype(float)
        nb = sizes.size
        # the stand-in records: every block's 2^k corners, then every block's mean; and
        # the whole box's corners and mean (one level above the blocks)
        sel = np.array(list(itertools.product((0, 1), repeat=self.k)), dtype=bool)  # 2^k x k
        self._nc = sel.shape[0]
        corners = np.where(sel[None, :, :], self.hi[:, None, :], self.lo[:, None, :])
        leaf_z = np.concatenate([corners.reshape(nb * self._nc, self.k), self.mean], axis=0)
        root_z = np.concatenate([np.where(sel, hi_all, lo_all), mean_all[None, :]], axis=0)
        self.leaf_records = self._as_chunk(leaf_z)
        self.root_records = self._as_chunk(root_z)
        self.nb = nb

    def _as_chunk(self, z: np.ndarray) -> tuple:
        """Stand-in records ``z`` (``m x k``) in the layout of the data arrays."""
        out, j = [], 0
        m = z.shape[0]
        for shape, dtype in zip(self._shapes, self._dtypes, strict=True):
            w = int(np.prod(shape, dtype=int))
            out.append(np.ascontiguousarray(z[:, j : j + w].reshape(m, *shape), dtype=dtype))
            j += w
        return tuple(out)

    def split(self, values, limit: float) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``(inside sum, indices of the other records)``.

        ``values(*records)`` gives a per-record value (``m x d``: a gradient at the
        current ``q``, or a log-likelihood ratio as ``m x 1``) affine in the record;
        ``limit`` is the largest squared norm a value may have to be left unchanged by the
        clipping. The inside sum is the exact (unclipped) sum of the values of the blocks
        whose boxes lie inside; the indices are the positions, in `sorted` (increasing),
        of the other blocks' records, ``None`` when there are none. ``(None, None)``: no
        block inside, or a non-finite inside sum (the caller takes the per-record loop
        over all records).
        """
        g = np.asarray(values(*self.root_records), dtype=float)
        nc = self._nc
        root = g.tolist()
        if all(_inside(row, limit) for row in root[:nc]) and all(map(math.isfinite, root[-1])):
            return self.n * g[-1], None
        g = np.ascontiguousarray(values(*self.leaf_records), dtype=float)
        total, n_inside, idx = _leaf_pass()(
            g, self.nb, nc, limit, self.counts, self.starts, self.sizes, self.perm
        )
        if n_inside == 0 or not all(map(math.isfinite, total.tolist())):
            return None, None
        return total, (idx if idx.size else None)


def _inside(row: list, limit: float) -> bool:
    """Whether a value's squared norm is at most ``limit`` (False if not finite)."""
    return sum(v * v for v in row) <= limit


def _leaf_pass_numpy(g, nb, nc, limit, counts, starts, sizes, perm):
    """``(inside sum, blocks inside, indices of the other records)`` from the values
    ``g`` at every block's corners then means (`AffineBlocks.split`). A block is inside
    when every corner's squared norm is at most ``limit`` (then its mean's value, a
    convex combination of the corners' by affinity, is finite and inside too)."""
    with np.errstate(all="ignore"):
        sq = np.einsum("ij,ij->i", g[: nb * nc], g[: nb * nc]).reshape(nb, nc)
        inside = np.all(sq <= limit, axis=1)
    total = counts[inside] @ g[nb * nc :][inside]
    out = ~inside
    lengths = sizes[out]
    offs = np.repeat(starts[out] - (np.cumsum(lengths) - lengths), lengths)
    idx = np.arange(int(lengths.sum()), dtype=np.int64) + offs
    return total, int(inside.sum()), idx


def _leaf_pass_loop(g, nb, nc, limit, counts, starts, sizes, perm):  # pragma: no cover
    """`_leaf_pass_numpy` as one loop (compiled by Numba where it imports)."""
    d = g.shape[1]
    total = np.zeros(d)
    inside = np.zeros(nb, dtype=np.bool_)
    n_in = 0
    n_out = 0
    for j in range(nb):
        ok = True
        for c in range(nc):
            row = j * nc + c
            s = 0.0
            for t in range(d):
                s += g[row, t] * g[row, t]
            if not s <= limit:
                ok = False
                break
        inside[j] = ok
        if ok:
            n_in += 1
            m = nb * nc + j
            for t in range(d):
                total[t] += counts[j] * g[m, t]
        else:
            n_out += sizes[j]
    idx = np.empty(n_out, dtype=np.int64)
    p = 0
    for j in range(nb):
        if not inside[j]:
            for i in range(starts[j], starts[j] + sizes[j]):
                idx[p] = i
                p += 1
    return total, n_in, idx


_LEAF_PASS: list = []


def _leaf_pass():
    """The leaf pass: `_leaf_pass_loop` compiled by Numba (on first use), else numpy."""
    if not _LEAF_PASS:
        try:
            import numba

            _LEAF_PASS.append(numba.njit(cache=False, nogil=True)(_leaf_pass_loop))
        except Exception:  # noqa: BLE001 - no Numba: the numpy version
            _LEAF_PASS.append(_leaf_pass_numpy)
    return _LEAF_PASS[0]


def limit_sq(bound: float, margin: float = 0.0) -> float:
    """The largest squared norm the inside test accepts for clip bound ``bound`` and a
    route's float32 weight margin ``margin`` (`AffineBlocks`; 0 for exact weights and for
    the ratios' ``clip(r, -b, b)``)."""
    inner = bound * (1.0 - margin)
    return inner * inner * (1.0 - INSIDE_SAFETY) if math.isfinite(inner) else -1.0
