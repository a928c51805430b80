"""Graph rewrites for group-indexed models (``theta[g_i]``): gathers stay one vectorised op.

A *gather* is ``src[idx]``: an advanced index with one integer vector on the leading axis
(``AdvancedSubtensor1`` on PyTensor 2.x, ``AdvancedSubtensor{idx_list=(0,)}`` on 3.x).

* `lift_gathers` pushes a gather below elementwise operations,
  ``(mu + sd * z)[g] -> mu + sd * z[g]`` (inputs broadcast along the leading axis stay
  whole), so that the gathered source becomes a plain selection of the parameter vector.
* `unbatch_gathers` undoes what ``vectorize_graph`` makes of a gather whose source is
  not batched: ``Blockwise{AdvancedSubtensor}(src, idx)`` (one Python ``perform`` per
  record) becomes the batched advanced index ``src[idx]`` (one vectorised op).
"""

from __future__ import annotations

from pytensor.graph.replace import clone_replace
from pytensor.graph.rewriting.basic import in2out, node_rewriter
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.tensor.blockwise import Blockwise
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.subtensor import AdvancedSubtensor

try:  # PyTensor 2.x
    from pytensor.tensor.subtensor import AdvancedSubtensor1
except ImportError:  # PyTensor 3.x: one AdvancedSubtensor op
    AdvancedSubtensor1 = AdvancedSubtensor

__all__ = ["gather_parts", "lift_gathers", "unbatch_gathers"]


def _is_gather_op(op, inputs) -> bool:
    if not isinstance(op, (AdvancedSubtensor, AdvancedSubtensor1)) or len(inputs) != 2:
        return False
    if tuple(getattr(op, "idx_list", (0,))) not in ((0,),):
        return False
    idx = inputs[1]
    return getattr(idx.type, "dtype", "").startswith(("int", "uint")) and idx.type.ndim >= 1


def gather_parts(node):
    """``(src, idx)`` when ``node`` is a gather ``src[idx]`` on the leading axis, else None."""
    if node is None or not _is_gather_op(node.op, node.inputs):
        return None
    return node.inputs[0], node.inputs[1]


def _retype(new, old):
    try:
        return [old.type.filter_variable(new)]
    except (TypeError, ValueError):
        return None


@node_rewriter(None)
def _lift_gather(fgraph, node):
    parts = gather_parts(node)
    if parts is None or parts[1].type.ndim != 1:
        return None
    src, idx = parts
    owner = src.owner
    if owner is None or not isinstance(owner.op, Elemwise) or len(owner.outputs) != 1:
        return None
    ins = owner.inputs
    if all(i.type.broadcastable[0] for i in ins):
        return None
    new = [i if i.type.broadcastable[0] else i[idx] for i in ins]
    return _retype(owner.op(*new), node.outputs[0])


@node_rewriter([Blockwise])
def _unbatch_gather(fgraph, node):
    core = node.op.core_op
    if not _is_gather_op(core, node.inputs):
        return None
    src, idx = node.inputs
    nb = node.op.batch_ndim(node)
    if nb < 1 or src.type.ndim < nb or not all(src.type.broadcastable[:nb]):
        return None  # a batched source: leave it
    src_core = src.squeeze(axis=tuple(range(nb))) if nb else src
    return _retype(src_core[idx], node.outputs[0])


def lift_gathers(var):
    """``var`` with every gather pushed below the elementwise operations of its source."""
    fresh = clone_replace(var, replace={})  # new inner nodes, the same inputs
    return rewrite_graph(fresh, include=(), custom_rewrite=in2out(_lift_gather), clone=False)


def unbatch_gathers(vars):
    """``vars`` with every ``Blockwise`` gather of an unbatched source as a batched index."""
    single = not isinstance(vars, list | tuple)
    fresh = clone_replace([vars] if single else list(vars), replace={})
    out = rewrite_graph(
        fresh,
        include=(),
        custom_rewrite=in2out(_unbatch_gather),
        clone=False,
    )
    return out[0] if single else list(out)
