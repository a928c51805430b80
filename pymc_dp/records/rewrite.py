"""Graph -> graph rewrites that turn the model's likelihood into per-record graphs.

PyMC pins shapes to the ``n`` records of the dataset and PyTensor 3 freezes static shapes
inside ``OpFromGraph`` nodes; both would fail (or silently broadcast) once the data arrays
are replaced by chunks or single rows.

`lift_switches` is a speed rewrite of the log-likelihood functions: a log-density written
as ``switch(y, f(a), f(b))`` (PyMC's Bernoulli, ``log(sigmoid(eta))`` or ``log(1 -
sigmoid(eta))`` by the observed value, stabilised to two ``softplus``) evaluates ``f``
twice per record; ``f(switch(y, a, b))`` evaluates it once and gives the same numbers.
"""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
from pytensor.compile.builders import OpFromGraph
from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors
from pytensor.scalar import Switch
from pytensor.tensor.basic import Alloc
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.shape import SpecifyShape
from pytensor.tensor.subtensor import AdvancedSubtensor
from pytensor.tensor.variable import TensorConstant

__all__ = [
    "UNSAFE_REWRITES",
    "canonicalize",
    "canonicalize_records",
    "drop_shape_pins",
    "inline_op_from_graph",
    "lift_switches",
    "record_position_indices",
]

#: Rewrites left out wherever pymc_dp rewrites a per-record graph: ``local_greedy_distributor``
#: (distributing products over sums) did not finish in minutes on the gradient of a
#: negative binomial log-likelihood with respect to its mean on PyTensor 2.38 (166 nodes;
#: PyTensor 3.3 rewrites it in 0.06 s): ``pymc_dp.sample`` on such a model hung in the
#: GLM route's and the declared bounds' rewrites (found on a real-data sweep, issue 26).
#: Without it the same graph is rewritten in 0.08 s.
UNSAFE_REWRITES = ("local_greedy_distributor",)


def canonicalize(graph):
    """PyTensor's ``canonicalize`` rewrites, without constant folding (no data is folded)
    and without `UNSAFE_REWRITES`."""
    return rewrite_graph(
        graph, include=("canonicalize",), exclude=("constant_folding", *UNSAFE_REWRITES)
    )


def canonicalize_records(graph, n: int):
    """`canonicalize` with every constant array of ``n`` rows (a numpy observed array or
    covariate: record data) held as an opaque input, so that no rewrite specialises on its
    values.

    PyTensor's rewrites read a constant whose entries are all equal as that one scalar
    (``get_underlying_scalar_constant_value``) and simplify by it: an all-zero observed
    ``y`` turns ``y - mu`` into ``-mu``, ``y * log(lam)`` into 0, a Bernoulli's
    ``switch(y, ., .)`` into one branch; the record axis then survives only in a
    broadcast (or not at all) and the one-record graph no longer reads its record. The
    per-record graphs, the routes built on them, and whether ``pymc_dp`` ran or failed
    (``AxisError`` in the gradient routes, issue 26) then depended on whether every
    record had the same value. With the record arrays held as inputs of their static type
    (``n`` and the trailing shape are public) the rewritten graph is the same for any
    data values; the constants are put back afterwards, so the data nodes are found
    as before.
    """
    if n <= 1:
        # one record: every length-1 constant (a broadcast parameter too) has "n" rows, and
        # held with its static length 1 it pins the graph to one record (the separability
        # check on 8 stand-in records then failed: CI, test_a_one_record_result_is_the_prior_
        # and_says_so); a length-1 array is "all equal" whatever its value, so nothing is hidden
        return canonicalize(graph)
    hidden = {}
    for v in ancestors([graph]):
        if (
            isinstance(v, TensorConstant)
            and v.type.ndim >= 1
            and v.type.shape[0] == n
            and v not in hidden
        ):
            hidden[v] = v.type(name=f"record_array{len(hidden)}")
    if not hidden:
        return canonicalize(graph)
    opaque = clone_replace(graph, replace=hidden, rebuild_strict=False)
    out = canonicalize(opaque)
    return clone_replace(out, replace={h: c for c, h in hidden.items()}, rebuild_strict=False)


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
    ``Alloc`` is dropped when its input already has the output's static shape (it is a
    no-op), and an ``Alloc`` of a scalar constant becomes that constant, broadcastable to any
    shape: PyTensor 3 folds a support check that holds for every record of a numpy observed
    array (e.g. a Binomial's ``value == n`` mask that is all False) into ``Alloc(False, n)``,
    which holds for every chunk of those records as well. Any other broadcast stays, and the
    separability checks refuse the model.
    """
    nodes = [v.owner for v in ancestors([graph]) if v.owner is not None]
    clients: dict = {}
    for node in nodes:
        for x in node.inputs:
            clients.setdefault(x, []).append(node)
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
        elif (
            isinstance(op, Alloc)
            and isinstance(inp, TensorConstant)
            and inp.type.ndim == 0
            and all(isinstance(c.op, Elemwise) for c in clients.get(v, []))
        ):
            # broadcastable only where every use broadcasts (elementwise); a Join does not:
            # pt.concatenate([pt.zeros((k, 1)), B], axis=1) (a multinomial logit's reference
            # column, issue-26 sweep) failed here with PyTensor's bare ValueError
            replacements[v] = pt.shape_padleft(inp, v.type.ndim)
    if not replacements:
        return graph
    return clone_replace(graph, replace=replacements, rebuild_strict=False)


def _is_record_position(a, n: int) -> bool:
    """Whether ``a`` is an integer constant ``i`` on row ``i`` of ``n`` rows (``arange(n)``,
    its trailing axes of length 1)."""
    if not (isinstance(a, TensorConstant) and a.dtype.startswith(("int", "uint"))):
        return False
    v = a.data
    if v.ndim < 1 or v.shape[0] != n or any(k != 1 for k in v.shape[1:]):
        return False
    return bool((v.reshape(n) == np.arange(n)).all())


def _reads_record_array(x, n: int, idx) -> bool:
    """Whether ``x`` reads an array of ``n`` rows (a constant or shared tensor: record data,
    the stand-in of an observed value) other than ``idx``. Structural."""
    from pytensor.compile.sharedvalue import SharedVariable

    from pymc_dp.records.store import node_shape  # shapes only (public, like n)

    for a in ancestors([x]):
        if a is idx or a.owner is not None:
            continue
        if isinstance(a, TensorConstant | SharedVariable) and getattr(a.type, "ndim", 0) >= 1:
            if node_shape(a)[0] == n:
                return True
    return False


def record_position_indices(graph, n: int):
    """Turn a constant ``arange(n)`` that selects each record's own row into the position
    in the batch the graph is evaluated on.

    PyMC 6's ``OrderedLogistic`` / ``Categorical`` log-probability picks each record's
    probability as ``p[arange(n)[:, None], value[:, None]]``, and PyTensor 3 folds the
    ``arange`` of the static length ``n`` into a constant of ``n`` rows: a chunk or a single
    record would then be indexed by the rows of all ``n`` (and the separability check refuses
    the model, or a data-only pass takes the constant for data). Where such a constant is
    the first index of an advanced subtensor whose indexed tensor has the record axis first
    (its leading length ``n`` or unknown), it becomes ``arange(x.shape[0])`` of that tensor,
    reshaped alike: the same rows for the whole data, and each record's own row in any
    batch. Structural: record ``i``'s index is ``i`` whatever the data (a data column equal
    to ``0 .. n-1`` used that way selects the same rows)."""
    replacements = {}
    for v in ancestors([graph]):
        node = v.owner
        if node is None or not isinstance(node.op, AdvancedSubtensor) or len(node.inputs) < 2:
            continue
        x, idx = node.inputs[0], node.inputs[1]
        idx_list = getattr(node.op, "idx_list", None)
        if idx_list is not None and (not idx_list or idx_list[0] != 0):
            continue  # PyTensor 3: the first index input does not index axis 0
        lead = x.type.shape[0] if x.type.ndim else 0
        if lead not in (n, None) or not _is_record_position(idx, n):
            continue
        if not _reads_record_array(x, n, idx):
            # ``x`` is not per-record (a parameter vector of length ``n``, ``a[g]``): the
            # index is then a data column (a group index) that happens to be ``0 .. n-1``;
            # rewriting it would make the graph depend on the data's values (a permuted
            # column is data, ``0 .. n-1`` was refused as not separable: helper 247)
            continue
        pos = pt.arange(x.shape[0], dtype=idx.dtype).reshape((-1,) + (1,) * (idx.ndim - 1))
        new = node.op.make_node(x, pos, *node.inputs[2:]).outputs[node.outputs.index(v)]
        replacements[v] = new
    if not replacements:
        return graph
    return clone_replace(graph, replace=replacements, rebuild_strict=False)


inline_op_from_graph = _inline_op_from_graph
drop_shape_pins = _drop_shape_pins


def _only_client(fgraph, var, node) -> bool:
    """Whether ``node`` is the one client of ``var`` (so rewriting ``node`` frees ``var``)."""
    clients = fgraph.clients.get(var, [])
    return len(clients) == 1 and clients[0][0] is node


@node_rewriter([Elemwise])
def _lift_switch(fgraph, node):
    """``switch(c, f(a1, ...), f(b1, ...)) -> f(switch(c, a1, b1), ...)``.

    Applies when both branches are outputs of the same single-output elementwise op with
    inputs of the same types, and this switch is their only client (the rewrite then
    evaluates ``f`` once per element instead of twice). Exact: element ``i`` of both sides is
    ``f`` of the same arguments. An input shared by both branches needs no switch.
    """
    if not isinstance(node.op.scalar_op, Switch):
        return None
    cond, left, right = node.inputs
    lo, ro = left.owner, right.owner
    if lo is None or ro is None or lo is ro:
        return None
    if not (isinstance(lo.op, Elemwise) and lo.op == ro.op and len(lo.outputs) == 1):
        return None
    if isinstance(lo.op.scalar_op, Switch) or len(lo.inputs) != len(ro.inputs):
        return None
    if any(a.type != b.type for a, b in zip(lo.inputs, ro.inputs, strict=True)):
        return None
    if not (_only_client(fgraph, left, node) and _only_client(fgraph, right, node)):
        return None
    pairs = zip(lo.inputs, ro.inputs, strict=True)
    args = [a if a is b else pt.switch(cond, a, b) for a, b in pairs]
    out = lo.op(*args)
    if out.type != node.outputs[0].type:
        try:
            out = node.outputs[0].type.filter_variable(out)
        except (TypeError, ValueError):
            return None
    return [out]


def lift_switches(graph):
    """``graph`` after PyTensor's ``canonicalize`` and ``stabilize`` rewrites (no constant
    folding: no data value is folded) with every ``switch(c, f(a), f(b))`` whose branches
    serve only it lifted to ``f(switch(c, a, b))``, repeatedly (``-softplus(-x)`` and
    ``-softplus(x)``: one ``softplus``). The same values, fewer evaluations of ``f``."""
    stable = rewrite_graph(
        graph,
        include=("canonicalize", "stabilize", "specialize"),
        exclude=("constant_folding", *UNSAFE_REWRITES),
    )
    return rewrite_graph(stable, include=(), custom_rewrite=in2out(_lift_switch), clone=False)
