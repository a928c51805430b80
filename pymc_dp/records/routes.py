"""Routes from per-record graphs to compiled functions.

The runtime needs, per chunk of records: the per-record log-likelihoods, the clipped sum of
their ratios (the penalty tests), and the clipped sum of their gradients (DP-HMC, DP-SGLD).
The *generic* route builds each from the one-record graph vectorised over the records and
works for every model that separates by record. Faster routes apply to special structure
(the *GLM* route: per-record gradients that factorise as ``v_i(q) x_i``); each is verified
against the generic route on data-free stand-in records before it is used, and
`GRADIENT_ROUTES` lists them in the order they are tried (the first that applies wins).
Room for more: a segment-sum route for indexed (hierarchical) models, a sufficient-statistic
route for exponential families.
"""

from __future__ import annotations

import numpy as np
import pytensor
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import ancestors, io_toposort
from pytensor.tensor.elemwise import Elemwise
from pytensor.tensor.subtensor import Subtensor

from pymc_dp.records.backend import compile_function
from pymc_dp.records.graphs import RecordGraphs

__all__ = ["GRADIENT_ROUTES", "compile_gradients", "compile_likelihood", "compile_prior"]

#: Faster clipped-gradient routes, tried in order after the generic one is built.
GRADIENT_ROUTES = ("GLM fast",)


def compile_prior(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """``q -> (log prior + log-Jacobian, its gradient)``; data-free."""
    x, prior = graphs.x, graphs.prior
    return compile_function([x], [prior, pytensor.grad(prior, x)], compile_kwargs)


def compile_likelihood(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """``(f_ll, f_llr)``: per-record log-likelihoods of a chunk, and the clipped ratio sum.

    ``f_ll(q, *chunk)`` gives the ``m`` (tempered) log-likelihoods of a chunk of ``m``
    records; ``f_llr(q_new, q, b, *chunk)`` gives ``(sum_i clip(r_i, -b, b), n_clipped)``
    with ``r_i = l_i(q_new) - l_i(q)``. A record whose log-likelihood is -inf at both points
    gives NaN: it contributes 0 (any value within the bounds keeps the sensitivity
    ``2 b``) and counts as clipped, instead of a NaN that would decide the test without
    noise; +-inf are clipped like any large ratio.
    """
    x, batch, ll_batch = graphs.x, graphs.batch, graphs.ll_batch
    x_new = x.type("q_new")
    bound = pt.dscalar("llr_clip_bound")
    r = clone_replace(ll_batch, replace={x: x_new}) - ll_batch
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))
    f_ll = compile_function([x, *batch], ll_batch, compile_kwargs)
    f_llr = compile_function([x_new, x, bound, *batch], [llr_sum, llr_count], compile_kwargs)
    return f_ll, f_llr


def compile_gradients(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """Per-record gradient and clipped-gradient-sum functions (the generic and GLM routes).

    Returns ``(f_grad, f_clip)``. ``f_grad(q, *chunk)`` gives the ``(m, d)`` per-record
    gradients of a chunk of ``m`` records. ``f_clip`` is a dict of compiled functions
    read by `RecordFunctions.clipped_grad_sum`:

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
    x, batch = graphs.x, graphs.batch
    ck = dict(compile_kwargs or {})
    to_batch = dict(zip(graphs.rows, batch, strict=True))
    bound = pt.dscalar("grad_clip_bound")
    huge = np.finfo(np.float64).max

    def clip_weights(sq_norms):
        finite = pt.le(sq_norms, huge)
        inv_norm = pt.minimum(1.0, bound / pt.sqrt(pt.maximum(sq_norms, 1e-300)))
        scale = pt.switch(finite, inv_norm, 0.0)
        return finite, scale, pt.sum(pt.invert(pt.le(sq_norms, bound * bound)))

    def masked_sum(block, finite, scale):
        return pt.sum(pt.switch(finite[:, None], block * scale[:, None], 0.0), axis=0)

    grads = vectorize_graph(pytensor.grad(graphs.one_record, x), to_batch)
    finite, scale, n_clipped = clip_weights(pt.sum(pt.sqr(grads), axis=1))
    f_grad = compile_function([x, *batch], grads, **ck)
    f_generic = compile_function(
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
        clients = [n for n in io_toposort([x], [graphs.one_record]) if x in n.inputs]
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
        gs = pytensor.grad(graphs.one_record, wrt=wrt, disconnected_inputs="ignore")
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
        f_fast = compile_function([x, bound, *row_sq_in, *batch], [clipped, n_clipped], **kw)
        f_row_sq = compile_function(list(batch), row_sq_out, **kw)
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
