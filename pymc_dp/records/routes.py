"""Routes from per-record graphs to compiled functions.

The runtime needs, per chunk of records: the per-record log-likelihoods, the clipped sum of
their ratios (the penalty tests), and the clipped sum of their gradients (DP-HMC, DP-SGLD).
The *generic* route builds each from the one-record graph vectorised over the records and
works for every model that separates by record. Faster routes apply to special structure
(the *GLM* route: per-record gradients that factorise as ``v_i(q) x_i``); each is verified
against the generic route on data-free stand-in records before it is used, and
`GRADIENT_ROUTES` lists them in the order they are tried (the first that applies wins).
The *indexed* route (`pymc_dp.records.segment`) handles group-indexed (hierarchical)
models with segment sums. Room for more: a sufficient-statistic route for exponential
families.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytensor
import pytensor.tensor as pt
from pytensor.graph.replace import clone_replace, vectorize_graph
from pytensor.graph.rewriting.utils import rewrite_graph
from pytensor.graph.traversal import io_toposort
from pytensor.tensor.subtensor import Subtensor

from pymc_dp.records.backend import compile_function
from pymc_dp.records.clipping import (
    F32_MARGIN,
    ClipRoute,
    LazyFunction,
    clip_weights,
    factor_rows,
    mask_rows,
    squared_row_norms,
    verify_route,
    weighted_sum,
)
from pymc_dp.records.gathers import unbatch_gathers
from pymc_dp.records.graphs import RecordGraphs
from pymc_dp.records.rewrite import UNSAFE_REWRITES, lift_switches
from pymc_dp.records.segment import build_segment_route
from pymc_dp.records.sorted_segments import build_sorted_route

__all__ = [
    "GRADIENT_ROUTES",
    "GradientRoutes",
    "build_blocks_route",
    "build_glm_route",
    "compile_fused_pass",
    "compile_fused_two_point",
    "compile_gradients",
    "compile_kept_ratio",
    "compile_likelihood",
    "compile_prior",
]

#: Faster clipped-gradient routes, tried in order after the generic one is built.
GRADIENT_ROUTES = ("GLM fast", "sorted", "indexed", "blocks")


def compile_prior(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """``q -> (log prior + log-Jacobian, its gradient)``; data-free."""
    x, prior = graphs.x, graphs.prior
    return compile_function([x], [prior, pytensor.grad(prior, x)], compile_kwargs)


def compile_likelihood(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """``(f_ll, f_llr)``: per-record log-likelihoods of a chunk, and the clipped ratio sum.

    ``f_ll(q, *chunk)`` gives the ``m`` (tempered) log-likelihoods of a chunk of ``m``
    records; ``f_llr(q_new, q, b, *chunk)`` gives ``(sum_i clip(r_i, -b, b), n_clipped)``
    with ``r_i = l_i(q_new) - l_i(q)`` (a `LazyFunction`: compiled on its first call, since
    only the penalty tests use it). A record whose log-likelihood is -inf at both points
    gives NaN: it contributes 0 (any value within the bounds keeps the sensitivity
    ``2 b``) and counts as clipped, instead of a NaN that would decide the test without
    noise; +-inf are clipped like any large ratio.

    Both are compiled from the per-record log-likelihoods with `lift_switches` applied
    (one evaluation of ``f`` where the log-density is ``switch(y, f(a), f(b))``: the same
    values).
    """
    x, batch = graphs.x, graphs.batch
    ll_batch = lift_switches(graphs.ll_batch)
    x_new = x.type("q_new")
    bound = pt.dscalar("llr_clip_bound")
    r = clone_replace(ll_batch, replace={x: x_new}) - ll_batch
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))
    ck = compile_kwargs
    # the rewrites may drop a data array that no longer matters (a check folded away)
    kw = {"kind": "loglik", "on_unused_input": "ignore"}
    f_ll = compile_function([x, *batch], ll_batch, ck, **kw)
    # compiled on its first call: only the penalty tests use it (not the one-shot
    # strategies nor the gradient-only chains; issue 26)
    f_llr = LazyFunction([x_new, x, bound, *batch], [llr_sum, llr_count], ck, **kw)
    return f_ll, f_llr


def compile_kept_ratio(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """``f(q_new, b, l_old, *chunk) -> (sum_i clip(r_i, -b, b), n_clipped, l_new)``.

    The clipped ratio sum of `compile_likelihood`'s ``f_llr`` with the log-likelihoods at
    the old point given (``l_old``, kept from an earlier pass, e.g. by
    `pymc_dp.records.LoglikMemo`) instead of computed: one evaluation of the per-record
    log-likelihoods (at ``q_new``) per call instead of two. ``r_i = l_new_i - l_old_i``
    with the same handling of NaN (0, counted as clipped); ``l_new`` (the chunk's
    log-likelihoods at ``q_new``) is returned to be kept in turn.
    """
    x, batch = graphs.x, graphs.batch
    ll_batch = lift_switches(graphs.ll_batch)
    x_new = x.type("q_new")
    bound = pt.dscalar("llr_clip_bound")
    l_old = pt.vector("l_old", dtype=ll_batch.dtype)
    l_new = clone_replace(ll_batch, replace={x: x_new})
    r = l_new - l_old
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))
    kw = {"kind": "loglik", "on_unused_input": "ignore"}
    return compile_function(
        [x_new, bound, l_old, *batch], [llr_sum, llr_count, l_new], compile_kwargs, **kw
    )


def compile_fused_pass(route: ClipRoute, graphs: RecordGraphs):
    """The last gradient pass of a DP-HMC trajectory fused with its ratio release, or None.

    ``f(q, b, *prep, *chunk, b_l, l_old) -> (sum_i clip_b(g_i), n_clipped,
    sum_i clip(r_i, -b_l, b_l), n_llr_clipped, l_new)``: the clipped gradient sum of
    ``route`` (its ``fast`` function's graph, `ClipRoute.graph`) at ``q`` and, in the same
    compiled function (one call per chunk, one pass over the records; subexpressions
    shared by the gradient and the log-likelihood, such as a GLM's ``X beta``, computed
    once), the per-record log-likelihoods ``l_new`` at ``q`` and the clipped sum of the
    ratios ``r_i = l_new_i - l_old_i`` against the log-likelihoods ``l_old`` kept at the
    previous point, with `compile_kept_ratio`'s handling of NaN (0, counted as clipped).
    The ratio bound ``b_l = b ||q' - q||`` of DP-HMC's penalty test is known when the last
    gradient of the trajectory is evaluated (at ``q'``), so the two releases read the
    records once (DP-HMC paper, Algorithm 1 [DPHMC]; issue 28). Both are still released
    as before: the sums are the same functions of the records, only computed together.
    Compiled on first call (`LazyFunction`), in the backend of the route's kind.
    """
    if route.graph is None:
        return None
    ins, outs, ck, kw = route.graph
    ll_batch = lift_switches(graphs.ll_batch)
    bound = pt.dscalar("llr_clip_bound")
    l_old = pt.vector("l_old", dtype=ll_batch.dtype)
    r = ll_batch - l_old
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))
    kw = {**kw, "on_unused_input": "ignore"}
    return LazyFunction([*ins, bound, l_old], [*outs, llr_sum, llr_count, ll_batch], ck, **kw)


def compile_fused_two_point(route: ClipRoute, graphs: RecordGraphs, counts: bool = True):
    """The last gradient pass of a DP-HMC trajectory fused with a two-point ratio release.

    ``f(q, b, *prep, *chunk, b_l, q_old) -> (sum_i clip_b(g_i), n_clipped,
    sum_i clip(r_i, -b_l, b_l), n_llr_clipped)`` with ``r_i = l_i(q) - l_i(q_old)``: the
    clipped gradient sum of ``route`` at ``q`` and `compile_likelihood`'s clipped ratio
    sum (the same expression, the same handling of NaN: 0, counted as clipped) in one
    compiled function, one pass over the records. `compile_fused_pass` without kept
    log-likelihoods: where a record's log-likelihood is a few arithmetic operations (the
    banana), evaluating it at both points within the gradient's pass costs less than
    reading and writing ``n`` kept values, and far less than a second pass (issue 28).
    Compiled on first call (`LazyFunction`), in the backend of the route's kind; None when
    the route has no graph. With ``counts=False`` the function returns ``(sum, ratio
    sum)`` only (no counting in the compiled loop).
    """
    if route.graph is None:
        return None
    ins, outs, ck, kw = route.graph
    x, ll_batch = graphs.x, lift_switches(graphs.ll_batch)
    x_old = x.type("q_old")
    bound = pt.dscalar("llr_clip_bound")
    r = ll_batch - clone_replace(ll_batch, replace={x: x_old})
    nan = pt.isnan(r)
    llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))
    llr_count = pt.sum(pt.or_(nan, pt.gt(pt.abs(r), bound)))
    kw = {**kw, "on_unused_input": "ignore"}
    out = [*outs, llr_sum, llr_count] if counts else [outs[0], llr_sum]
    return LazyFunction([*ins, bound, x_old], out, ck, **kw)


def compile_gradients(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """Per-record gradient function and the clipped-gradient-sum routes.

    Returns ``(f_grad, routes)``. ``f_grad(q, *chunk)`` gives the ``(m, d)`` per-record
    gradients of a chunk of ``m`` records. ``routes`` is a dict with the ``"generic"``
    `ClipRoute` (every model that separates by record) and
    the ``"route"`` used by `RecordFunctions.clipped_grad_sum`: the first of
    `GRADIENT_ROUTES` that applies and gives the generic route's clipped sums and
    counts on data-free stand-in records (`verify_route`),
    else the generic route itself. Each route returns ``(sum_i clip_b(g_i), n_clipped)`` in
    the layout of `pymc_dp.records.clipping`:

    ``"generic"``
        The ``m x d`` per-record gradients are formed (one-record gradient vectorised over
        the records, gathers kept as one batched index), their squared row norms give the
        clip weights ``w`` and the sum is ``G^T w``.
    ``"GLM fast"``
        Per-record gradients that factorise, per parameter block, as ``g_i[block] = v_i(q)
        m_i`` with ``m_i`` a row of a data-only matrix (GLMs: ``m_i = x_i``). Then
        ``||g_i[block]||^2 = v_i^2 ||m_i||^2``, where ``||m_i||^2`` is computed once per chunk
        (``prepare``) and cached, and the clipped sum of the block is ``M^T (w v)``: the same
        passes over the data as the gradient of the summed log-likelihood. Blocks that do not
        factorise (an intercept, a scale) are handled like the generic route.
    ``"sorted"``
        Group-indexed models whose per-record gradient is elementwise in one number per
        record and per group: the records of each chunk sorted by group once, one
        vectorised loop per group (`pymc_dp.records.sorted_segments`).
    ``"indexed"``
        Group-indexed models (``theta[g_i]``): `pymc_dp.records.segment`.
    ``"blocks"``
        Every other model whose one-record graph reads ``q`` through slices or entries
        (one per value variable): the GLM route's layout with no factorising block. Each
        block's per-record gradient stays its own array, so no ``m x d`` matrix is
        assembled (the generic route builds it with one indexed write per entry); a
        one-column block's clipped sum fuses with the elementwise work
        (`pymc_dp.records.clipping.weighted_sum`). Tried after ``"indexed"``: a gathered
        block would be dense here.

    Records whose gradient is not finite contribute 0 in every route and count as clipped.
    """
    x, batch = graphs.x, graphs.batch
    ck = dict(compile_kwargs or {})
    to_batch = dict(zip(graphs.rows, batch, strict=True))
    bound = pt.dscalar("grad_clip_bound")

    grads = unbatch_gathers(vectorize_graph(pytensor.grad(graphs.one_record, x), to_batch))
    finite, w, n_clipped = clip_weights(pt.sum(pt.sqr(grads), axis=1), bound)
    f_grad = LazyFunction([x, *batch], grads, ck)
    ins = [x, bound, *batch]
    generic_out = [pt.dot(w, grads), n_clipped]
    generic = ClipRoute(
        name="generic",
        fast=LazyFunction(ins, generic_out, ck),
        masked=LazyFunction(ins, [pt.dot(w, mask_rows(grads, finite)), n_clipped], ck),
        graph=(ins, generic_out, ck, {}),
    )
    # the reference of the checks: the generic per-record gradients, compiled cheaply
    f_ref = LazyFunction([x, *batch], grads, {"mode": "FAST_COMPILE"})
    return f_grad, GradientRoutes(generic, graphs, ck, f_ref)


def _choose_route(generic: ClipRoute, graphs: RecordGraphs, ck: dict, f_ref) -> ClipRoute:
    """The first of `GRADIENT_ROUTES` that applies and passes `verify_route`, else
    ``generic`` (`compile_gradients`)."""
    d = graphs.ndim
    if not d:
        return generic
    for name in GRADIENT_ROUTES:
        try:
            route = _BUILDERS[name](graphs, ck)
            ok = route is not None and verify_route(route, f_ref, graphs.batch, d, graphs.x.dtype)
        except Exception:  # noqa: BLE001 - any failure just means: try the next route
            ok = False
        if ok:
            return route
    return generic


class GradientRoutes(Mapping):
    """``{"generic": ClipRoute, "route": ClipRoute}`` of `compile_gradients`, the faster
    route chosen on the first read of ``"route"`` (picklable).

    Choosing builds, compiles and checks (`verify_route`, data-free) up to
    `GRADIENT_ROUTES` candidates: a few compiled functions that only the clipped-gradient
    releases use (DP-HMC, DP-SGLD, a gradient release). Callers that need the per-record
    gradients alone (the gradient-norm counts, the Hessian sums and moments of the one-shot
    strategies) no longer pay for them (issue 26: 4 of the 19 compiled functions of a
    one-shot call on a GLM). Pickling chooses first, so a copy shipped to another process
    carries the compiled route, as before.
    """

    def __init__(self, generic: ClipRoute, graphs: RecordGraphs, ck: dict, f_ref) -> None:
        self._generic = generic
        self._route: ClipRoute | None = None
        self._pending: tuple | None = (graphs, ck, f_ref)

    def _chosen(self) -> ClipRoute:
        if self._route is None:
            graphs, ck, f_ref = self._pending
            self._route = _choose_route(self._generic, graphs, ck, f_ref)
            self._pending = None
        return self._route

    @property
    def chosen(self) -> bool:
        """Whether the route has been chosen (its functions built)."""
        return self._route is not None

    def __getitem__(self, key: str) -> ClipRoute:
        if key == "generic":
            return self._generic
        if key == "route":
            return self._chosen()
        raise KeyError(key)

    def __iter__(self):
        return iter(("generic", "route"))

    def __len__(self) -> int:
        return 2

    def __getstate__(self) -> dict:
        self._chosen()
        return {"_generic": self._generic, "_route": self._route, "_pending": None}


def build_glm_route(
    graphs: RecordGraphs, compile_kwargs: dict | None = None, name: str = "GLM fast"
):
    """The GLM route of ``graphs`` (a `ClipRoute`), or None when it does not apply.

    With ``name="blocks"`` the same route without the need for a factorising block: the
    per-record gradient of each parameter block the one-record graph reads is its own
    ``m x k`` array (no ``m x d`` matrix assembled from them), squared norms and clipped
    sums per block (`pymc_dp.records.clipping.weighted_sum`).
    """
    x, batch = graphs.x, graphs.batch
    d = graphs.ndim
    to_batch = dict(zip(graphs.rows, batch, strict=True))
    # Parameter blocks: the slices of q the one-record graph reads (one per value
    # variable), located by evaluating them at q = 0, 1, ..., d - 1 (no data).
    clients = [n for n in io_toposort([x], [graphs.one_record]) if x in n.inputs]
    pieces = [x]
    if clients and all(isinstance(n.op, Subtensor) for n in clients):
        pieces = [n.outputs[0] for n in clients]
    if any(p.ndim > 1 for p in pieces):
        return None
    where = pytensor.function([x], pieces, on_unused_input="ignore", mode="FAST_COMPILE")(
        np.arange(d, dtype=x.dtype)
    )
    where = [np.atleast_1d(w).astype(int) for w in where]
    starts = [int(w[0]) if w.size else -1 for w in where]
    order = np.argsort(starts)
    if not np.array_equal(np.concatenate([where[i] for i in order]), np.arange(d)):
        return None
    wrt = [pieces[i] for i in order]
    gs = pytensor.grad(graphs.one_record, wrt=wrt, disconnected_inputs="ignore")
    blocks = unbatch_gathers(vectorize_graph(list(gs), to_batch))
    blocks = [
        rewrite_graph(b, include=("canonicalize",), exclude=("constant_folding", *UNSAFE_REWRITES))
        for b in blocks
    ]
    blocks = [b[:, None] if b.ndim == 1 else b for b in blocks]
    split = [factor_rows(b, x) for b in blocks]
    if not any(split) and name == "GLM fast":
        return None
    bound = pt.dscalar("grad_clip_bound")
    sq_terms, row_sq_in, row_sq_out = squared_row_norms(blocks, split)
    # the blocks route (cheap per-record gradients, e.g. the banana): the clip weight is
    # most of its time; its square root and division in float32, with a margin
    f32 = name == "blocks"
    finite, w, n_clipped = clip_weights(pt.add(*sq_terms), bound, float32_weight=f32)

    def clipped(masked):
        parts = []
        for b, f in zip(blocks, split, strict=True):
            if f is None:
                parts.append(weighted_sum(w, mask_rows(b, finite) if masked else b))
            else:  # the data-only factor is finite (prepare checks it)
                v = w * (mask_rows(f[1], finite) if masked else f[1])
                parts.append(pt.dot(v, f[0]))
        return pt.concatenate(parts) if len(parts) > 1 else parts[0]

    ck = dict(compile_kwargs or {})
    ins = [x, bound, *row_sq_in, *batch]
    kw = {"on_unused_input": "ignore", "kind": "route"}  # backend choice: see backend.py
    fast_out = [clipped(False), n_clipped]
    return ClipRoute(
        name=name,
        fast=compile_function(ins, fast_out, ck, **kw),
        masked=LazyFunction(ins, [clipped(True), n_clipped], ck, **kw),
        prepare=compile_function(list(batch), row_sq_out, ck, **kw) if row_sq_out else None,
        graph=(ins, fast_out, ck, kw),
        weight_margin=F32_MARGIN if f32 else 0.0,
    )


def build_blocks_route(graphs: RecordGraphs, compile_kwargs: dict | None = None):
    """The *blocks* route of ``graphs`` (`build_glm_route` with ``name="blocks"``)."""
    return build_glm_route(graphs, compile_kwargs, name="blocks")


_BUILDERS = {
    "GLM fast": build_glm_route,
    "sorted": build_sorted_route,
    "indexed": build_segment_route,
    "blocks": build_blocks_route,
}
