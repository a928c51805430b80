"""The *sorted* route: clipped gradient sums of group-indexed models over sorted records.

The indexed route (`pymc_dp.records.segment`) sums each record's clipped group gradient
into its group with an indexed store, ``S[g_i] += w_i e_i``, over the records in their
given (random) group order. That store stops LLVM from vectorising the loop: the square
root and the division of every record's clip weight run one record at a time. The clipped
sum does not depend on the order of the records, so this route sorts the records of a
chunk by their group index **once**, when the chunk is first used (the permutation and the
sorted copy are data-only arrays kept where the chunk lives, like the GLM route's row
norms: never returned, never published), and runs one compiled loop nest:

.. code-block:: text

    for each group j (a contiguous run of records):
        v = a[j]                          # the group's gathered values, hoisted
        for each record i of the run:     # no indexed store: vectorised
            e = grad of record i (its few non-zero coordinates)
            w = min(1, b / ||e||)   (0 and counted as clipped if ||e|| is not finite)
            acc += w * e_group;  shared += w * e_shared
        S[j] += acc

The per-record gradient is the one-record graph differentiated with respect to the shared
parameter entries and the gathered values (as in the indexed route), turned into one
PyTensor scalar ``Composite`` and compiled by PyTensor's Numba backend; the loop nest
around it is generated here and compiled with Numba (PyTensor's fastmath flags). Values
that depend on the parameters only (``exp(log_sigma)``, ...) are computed once per call,
outside the loop. The whole pass is one call of one compiled PyTensor function (a custom
`SortedSegmentSum` op between the parameter transform and the packing).

It applies when every gathered source is a vector of one entry per group (a contiguous
selection of ``q``), every data array the gradient reads has one number per record, every
shared parameter block the record reads is a single entry, and the per-record gradient is
elementwise in those (no dot product over a record's covariates: the Poisson GLM with a
random intercept keeps the indexed route). The records are sorted by the indices of all
gathers, lexicographically (the first gather's first): every gather's index is constant
over each run of records, so that crossed ``a[g] + c[h]`` runs over the ``(g, h)`` cells
and nested ``a[g] + c[state_of[g]]`` over the groups ``g``, each with its values hoisted and
its sums added once per run (many small cells make short runs, and the per-run work then
weighs). Indices follow numpy semantics (``-1`` is the last group); an index out of range
is an error, as in the other routes. Like every faster route, it is verified against the
generic route on data-free stand-in records before it is used.

Floating point: the sums are the same clipped sums in another summation order (per group,
then across groups, with reassociation allowed): they differ from the indexed route's in
the last bits (relative ~1e-15), so seeded chains drift apart from those of the indexed
route after some iterations; the clip weights, the counts and the mechanisms are the
same.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.graph.basic import Apply, Constant
from pytensor.graph.op import Op
from pytensor.graph.replace import vectorize_graph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors
from pytensor.tensor.elemwise import CAReduce, DimShuffle, Elemwise
from pytensor.tensor.subtensor import Subtensor

from pymc_dp.records.backend import compile_function
from pymc_dp.records.clipping import ClipRoute
from pymc_dp.records.gathers import unbatch_gathers
from pymc_dp.records.graphs import RecordGraphs
from pymc_dp.records.rewrite import UNSAFE_REWRITES

__all__ = ["SortedSegmentSum", "build_sorted_route"]

_HUGE = float(np.finfo(np.float64).max)
#: PyTensor's fastmath flags for its Numba backend (no ``nnan``/``ninf``: the finiteness
#: tests of the clip weight stay exact).
_FASTMATH = {"arcp", "contract", "afn", "reassoc", "nsz"}


# -- the per-record gradient as one scalar Composite ------------------------------------------
def _ones(v) -> bool:
    """Whether ``v`` has one element, statically."""
    return all(s == 1 for s in v.type.shape)


_PASS_OPS = ("ExpandDims", "Squeeze", "SpecifyShape", "Reshape", "TensorFromScalar")


class _NotScalar(Exception):
    """The per-record graph is not an elementwise function of scalars."""


class _Scalarizer:
    """Rewrite a one-record graph whose record-dependent values all have one element into
    PyTensor scalar operations of scalar inputs.

    ``leaves`` maps the record-dependent inputs (one row's values, the gathered values) to
    scalar variables. A value that does not depend on them (a function of the parameters)
    becomes a *hoisted* scalar input, computed once per call outside the loop.
    """

    def __init__(self, leaves: dict) -> None:
        self.memo: dict = dict(leaves)
        self.leaves = set(leaves)
        self.hoisted: list = []  # (tensor variable, scalar input)
        self._dep: dict = {}

    def depends(self, v) -> bool:
        if v not in self._dep:
            self._dep[v] = bool(self.leaves & set(ancestors([v])))
        return self._dep[v]

    def __call__(self, v):
        if v in self.memo:
            return self.memo[v]
        if not self.depends(v):
            if isinstance(v, Constant):
                data = np.asarray(v.data)
                if data.size != 1:
                    raise _NotScalar
                s = ps.constant(data.item(), dtype=str(data.dtype))
            else:
                if not _ones(v) or v.type.dtype != "float64":
                    raise _NotScalar
                s = ps.get_scalar_type("float64")()
                self.hoisted.append((v, s))
            self.memo[v] = s
            return s
        node = v.owner
        if node is None:
            raise _NotScalar
        op = node.op
        if isinstance(op, Elemwise):
            outs = op.scalar_op.make_node(*[self(i) for i in node.inputs]).outputs
            s = outs[node.outputs.index(v)]
        elif (
            isinstance(op, DimShuffle | CAReduce | Subtensor)
            or type(op).__name__ in (*_PASS_OPS, "Alloc", "ScalarFromTensor")
        ) and _ones(v):
            src = node.inputs[0]
            if not (src.type.ndim == 0 or _ones(src)) and type(op).__name__ != "Alloc":
                raise _NotScalar
            if isinstance(op, CAReduce) and type(op.scalar_op).__name__ not in (
                "Add",
                "Mul",
                "Maximum",
                "Minimum",
            ):
                raise _NotScalar
            if type(op).__name__ == "Alloc" and not _ones(src):
                raise _NotScalar
            s = self(src)
        else:
            raise _NotScalar
        self.memo[v] = s
        return s


# -- the loop nest --------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layout:
    """The structure of one sorted route (hashable; part of the op's identity).

    ``pieces``: output position of every shared entry; ``gathers``: per gather
    ``(pos0, groups, source_id)`` (its block is ``pos0 .. pos0 + groups - 1``; gathers of
    the same source share a ``source_id``); ``n_hoisted``, ``n_cols``: scalar inputs of the
    per-record function besides the gathered values; ``d``: length of the gradient.
    """

    d: int
    pieces: tuple
    gathers: tuple
    n_hoisted: int
    n_cols: int


def _driver_source(layout: _Layout, n_out: int) -> str:
    """Python source of the loop nest (compiled with Numba).

    Over each run ``j`` of records (``offs[j] .. offs[j + 1] - 1``) every gather's index is
    constant (``ri{k}[j]``): its value is loaded once, its clipped gradient accumulated in a
    scalar and added to its group's entry after the run.
    """
    g = layout.gathers
    K = len(g)
    args = ["hv", *[f"s{k}" for k in range(K)], "offs", *[f"ri{k}" for k in range(K)]]
    args += [f"c{k}" for k in range(layout.n_cols)]
    P = len(layout.pieces)
    e = [f"e{k}" for k in range(n_out)]
    call_args = [f"v{k}" for k in range(K)]
    call_args += [f"hv[{1 + k}]" for k in range(layout.n_hoisted)]
    call_args += [f"r{k}[i]" for k in range(layout.n_cols)]
    same = [(k, m) for k in range(K) for m in range(k) if g[k][2] == g[m][2]]
    lines = [
        f"def sorted_segment_sum({', '.join(args)}):",
        "    b = hv[0]",
        "    bb = b * b",
        f"    out = np.zeros({layout.d + 1})",
        *[f"    t{k} = 0.0" for k in range(P)],
        "    cnt = 0.0",
        "    for j in range(offs.shape[0] - 1):",
        *[f"        j{k} = ri{k}[j]" for k in range(K)],
        *[f"        v{k} = s{k}[j{k}]" for k in range(K)],
        *[f"        a{k} = 0.0" for k in range(K)],
        # two gathers of the same source: their entries coincide where their indices do
        *[f"        same{k}_{m} = 2.0 if j{k} == j{m} else 0.0" for k, m in same],
        "        lo = offs[j]",
        "        hi = offs[j + 1]",
        # views of the run, indexed from 0 (a loop counter known to be non-negative: no
        # wraparound of negative indices in the loads, which would keep LLVM from
        # vectorising)
        *[f"        r{k} = c{k}[lo:hi]" for k in range(layout.n_cols)],
        "        for i in range(hi - lo):",
        f"            {', '.join(e)} = f({', '.join(call_args)})  # one output: a scalar",
        f"            sq = {' + '.join(f'{x} * {x}' for x in e)}",
        *[f"            sq += same{k}_{m} * e{P + k} * e{P + m}" for k, m in same],
        "            fin = sq <= HUGE",
        "            w = min(1.0, b / np.sqrt(max(sq, 1e-300)))",
        "            w = w if fin else 0.0",
        "            cnt += 0.0 if sq <= bb else 1.0",
        # ``w * (e if fin else 0)``, not ``w * e if fin else 0``: LLVM folds the latter into
        # a conditional reduction, which it does not vectorise
        *[f"            t{k} += w * (e{k} if fin else 0.0)" for k in range(P)],
        *[f"            a{k} += w * (e{P + k} if fin else 0.0)" for k in range(K)],
        *[f"        out[{pos0} + j{k}] += a{k}" for k, (pos0, _gr, _sid) in enumerate(g)],
        *[f"    out[{p}] += t{k}" for k, p in enumerate(layout.pieces)],
        f"    out[{layout.d}] = cnt",
        "    return out",
        "",
    ]
    return "\n".join(lines)


_DRIVERS: dict = {}
#: Version of the generated loop nest, part of its disk-cache key: raise it whenever
#: `_driver_source` or `_compile_driver` changes what the compiled code does.
_DRIVER_VERSION = 1


def _composite_function(composite, node):
    """``(numba function of the composite, its PyTensor cache key or None)``."""
    try:
        from pytensor.link.numba.dispatch.basic import numba_funcify_and_cache_key
    except ImportError:  # pragma: no cover - a PyTensor without Numba cache keys
        from pytensor.link.numba.dispatch.basic import numba_funcify

        return numba_funcify(composite, node=node), None
    return numba_funcify_and_cache_key(composite, node=node)


def _compile_driver(composite, layout: _Layout):
    """``(driver, cache_key)``: the Numba loop nest of ``(composite, layout)`` (kept per
    process) and the key under which PyTensor's Numba backend caches it on disk.

    The key is a hash of everything the compiled code depends on: the composite's own
    PyTensor key (its scalar graph), the generated source (the layout), the constants and
    compilation flags it is built with, and `_DRIVER_VERSION`. ``None`` (no disk cache)
    when PyTensor gives the composite no key. Data-free: the layout and the composite are
    structure; no record value enters the key or the code.
    """
    key = (composite, layout)
    if key in _DRIVERS:
        return _DRIVERS[key]
    import numba

    node = composite.make_node(*[i.type() for i in composite.inputs])
    f, composite_key = _composite_function(composite, node)
    src = _driver_source(layout, len(composite.outputs))
    env = {"np": np, "f": f, "HUGE": _HUGE}
    exec(compile(src, "<pymc_dp sorted_segment_sum>", "exec"), env)  # noqa: S102 - generated
    fastmath = _FASTMATH if pytensor.config.numba__fastmath else False
    driver = numba.njit(fastmath=fastmath, error_model="numpy")(env["sorted_segment_sum"])
    cache_key = None
    if composite_key is not None:
        flags = (sorted(fastmath) if fastmath else False, "error_model=numpy", repr(_HUGE))
        what = ("pymc_dp.SortedSegmentSum", _DRIVER_VERSION, composite_key, src, flags)
        cache_key = hashlib.sha256(repr(what).encode()).hexdigest()
    _DRIVERS[key] = (driver, cache_key)
    return driver, cache_key


class SortedSegmentSum(Op):
    """``[sum_i clip_b(grad l_i), n_clipped]`` (length ``d + 1``) over records sorted by group.

    Inputs: ``hv`` (the bound, then the hoisted parameter values), the gathered sources,
    the run boundaries ``offs`` of the sort index, the other gathers' indices, the data
    columns (all in sorted order). The count is the last entry (exact in float64 below
    ``2^53`` records). Computed by a Numba loop nest (`_driver_source`), in every PyTensor
    mode (``perform`` calls it; the Numba backend calls it from its compiled function).
    """

    __props__ = ("composite", "layout")

    def __init__(self, composite, layout: _Layout) -> None:
        self.composite = composite
        self.layout = layout

    def make_node(self, *inputs):
        inputs = [pt.as_tensor_variable(i) for i in inputs]
        return Apply(self, inputs, [pt.tensor(dtype="float64", shape=(self.layout.d + 1,))])

    def driver(self):
        return _compile_driver(self.composite, self.layout)[0]

    def cache_key(self) -> str | None:
        """Key of the loop nest in PyTensor's Numba disk cache (see `_compile_driver`)."""
        return _compile_driver(self.composite, self.layout)[1]

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = self.driver()(*inputs)


def _register_numba() -> None:
    try:
        from pytensor.link.numba.dispatch.basic import register_funcify_and_cache_key
    except ImportError:  # pragma: no cover - PyTensor without a Numba backend
        return

    @register_funcify_and_cache_key(SortedSegmentSum)
    def _funcify(op, node=None, **kwargs):
        # cached on disk by PyTensor's Numba backend under a hash of everything the
        # generated code depends on (with numba__cache on; compiled again in each process
        # otherwise)
        return op.driver(), op.cache_key()


if importlib.util.find_spec("numba") is not None:
    _register_numba()


# -- the per-chunk sort (data-only arrays, kept where the chunk lives) --------------------------
@dataclass
class _SortChunk:
    """``prepare(*chunk)`` of the sorted route: ``[offs, *run_indices, *columns]``.

    The records are sorted (stably) by the indices of all gathers, lexicographically, the
    first gather's index first, so that every gather's index is constant over each run of
    records; ``offs`` are the run boundaries, ``run_indices[k][j]`` gather ``k``'s index on
    run ``j``, and each data column the gradient reads is permuted alike. Indices follow
    numpy semantics (``-J <= idx < J``); one out of range raises ``IndexError`` (as the
    gather of the other routes does).
    """

    f_idx: Any
    groups: tuple
    cols: tuple

    def __call__(self, *chunk):
        idx = [np.asarray(a).astype(np.int64, copy=False).ravel() for a in self.f_idx(*chunk)]
        for k, (i, groups) in enumerate(zip(idx, self.groups, strict=True)):
            if i.size and (int(i.min()) < -groups or int(i.max()) >= groups):
                raise IndexError("a group index of the records is out of range")
            idx[k] = np.where(i < 0, i + groups, i)
        order = np.lexsort(idx[::-1]) if len(idx) > 1 else np.argsort(idx[0], kind="stable")
        idx = [i[order] for i in idx]
        m = idx[0].size
        start = np.zeros(m, dtype=bool)
        start[:1] = True
        for i in idx:
            start[1:] |= i[1:] != i[:-1]
        first = np.flatnonzero(start)
        offs = np.append(first, m).astype(np.int64)
        runs = [np.ascontiguousarray(i[first]) for i in idx]
        cols = [np.ascontiguousarray(np.asarray(chunk[c]).ravel()[order]) for c in self.cols]
        return [offs, *runs, *cols]


def build_sorted_route(
    graphs: RecordGraphs, compile_kwargs: dict | None = None
) -> ClipRoute | None:
    """The sorted route of ``graphs``, or None when it does not apply (data-free).

    Parameters
    ----------
    graphs : RecordGraphs
        The per-record graphs of the step.
    compile_kwargs : dict, optional
        The user's compile options (a ``mode`` here compiles the parameter transform and the
        packing in that mode; the loop nest is Numba in every mode).

    Returns
    -------
    ClipRoute or None
        ``fast(q, b, offs, *run_indices, *columns, *chunk)`` (``masked`` is the same
        function: a non-finite record contributes 0 and counts as clipped inside the loop)
        and ``prepare(*chunk)`` giving the sorted arrays (`_SortChunk`).
    """
    if importlib.util.find_spec("numba") is None:
        return None
    from pymc_dp.records.segment import _selections, data_gathers

    x, rows, batch = graphs.x, graphs.rows, graphs.batch
    d = graphs.ndim
    found = data_gathers(graphs, vector_sources=True)
    if found is None:
        return None
    one, gathers, g_in, one2, clients = found
    if clients and not all(isinstance(n.op, Subtensor) for n in clients):
        return None
    pieces = [n.outputs[0] for n in clients]
    pos = _selections(x, d, [n.inputs[0] for n in gathers] + pieces)
    if pos is None:
        return None
    pos_g, pos_p = pos[: len(gathers)], pos[len(gathers) :]
    if any(p.size != 1 for p in pos_p):
        return None
    shared = np.concatenate([p.ravel() for p in pos_p]) if pos_p else np.zeros(0, np.int64)
    if np.unique(shared).size != shared.size:
        return None
    source_ids = []
    for k, pk in enumerate(pos_g):
        if not np.array_equal(pk, pk[0] + np.arange(pk.size)):
            return None  # a group block that is not a contiguous selection
        if np.intersect1d(pk, shared).size:
            return None
        sid = k
        for j, pj in enumerate(pos_g[:k]):
            if np.intersect1d(pk, pj).size:
                if not np.array_equal(pk, pj):
                    return None
                sid = source_ids[j]
                break
        source_ids.append(sid)

    # The per-record gradient (shared entries, then gathered values) as one Composite.
    grads = pytensor.grad(one2, wrt=[*pieces, *g_in], disconnected_inputs="ignore")
    grads = rewrite_graph(
        list(grads),
        include=("canonicalize", "stabilize", "specialize"),
        exclude=("fusion", *UNSAFE_REWRITES),
    )
    used_rows = [r for r in rows if r in set(ancestors(grads))]
    if any(not (r.type.ndim == 0 or _ones(r)) for r in used_rows):
        return None
    leaves = {v: ps.get_scalar_type(v.type.dtype)() for v in g_in}
    leaves.update({r: ps.get_scalar_type(r.type.dtype)() for r in used_rows})
    scal = _Scalarizer(leaves)
    try:
        outs = [scal(gr) for gr in grads]
        if any(not _ones(gr) for gr in grads):
            raise _NotScalar
    except _NotScalar:
        return None
    outs = [ps.cast(o, "float64") if o.type.dtype != "float64" else o for o in outs]
    ins = [leaves[v] for v in g_in] + [s for _, s in scal.hoisted] + [leaves[r] for r in used_rows]
    outs = [
        o if o not in ins and o.owner is not None else ps.add(o, ps.constant(0.0)) for o in outs
    ]
    composite = ps.Composite(ins, outs)

    groups = tuple(int(p.size) for p in pos_g)
    layout = _Layout(
        d=d,
        pieces=tuple(int(p.ravel()[0]) for p in pos_p),
        gathers=tuple(
            (int(p[0]), gr, int(sid)) for p, gr, sid in zip(pos_g, groups, source_ids, strict=True)
        ),
        n_hoisted=len(scal.hoisted),
        n_cols=len(used_rows),
    )
    op = SortedSegmentSum(composite, layout)

    # The compiled pass: parameter transform, the loop nest, the packing.
    bound = pt.dscalar("grad_clip_bound")
    hv = pt.stack([bound, *[pt.reshape(v, ()) for v, _ in scal.hoisted]])
    offs = pt.vector("offs", dtype="int64")
    run_idx = [pt.vector(f"run_idx{k}", dtype="int64") for k in range(len(gathers))]
    cols = [pt.vector(f"col{k}", dtype=r.type.dtype) for k, r in enumerate(used_rows)]
    srcs = [n.inputs[0] for n in gathers]
    res = op(hv, *srcs, offs, *run_idx, *cols)
    total, count = res[:d], pt.cast(res[d], "int64")
    ck = dict(compile_kwargs or {})
    kw = {"on_unused_input": "ignore", "kind": "route"}
    fast = compile_function([x, bound, offs, *run_idx, *cols, *batch], [total, count], ck, **kw)
    # The data-only per-chunk arrays: the indices of every gather (vectorised over the
    # records), the sort, the permuted columns.
    to_batch = dict(zip(rows, batch, strict=True))
    v_idx = unbatch_gathers(vectorize_graph([n.inputs[1] for n in gathers], to_batch))
    f_idx = compile_function(list(batch), [pt.flatten(i, ndim=1) for i in v_idx], ck, **kw)
    prepare = _SortChunk(f_idx=f_idx, groups=groups, cols=tuple(rows.index(r) for r in used_rows))
    graph = ([x, bound, offs, *run_idx, *cols, *batch], [total, count], ck, kw)
    return ClipRoute(name="sorted", fast=fast, masked=fast, prepare=prepare, graph=graph)
