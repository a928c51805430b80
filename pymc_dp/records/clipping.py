"""The clipping layout shared by every clipped-gradient route, and the route object.

Every route reduces a chunk of ``m`` records to ``(sum_i clip_b(g_i), n_clipped)`` the same
way: the squared norms of the per-record gradients give one 1-D vector of clip weights
``w_i = min(1, b / ||g_i||)`` (0 for a record whose gradient is not finite), and the clipped
sum is a matrix-vector product ``G^T w`` (or a segment sum for group-indexed blocks). A
non-finite entry of ``G`` makes that product non-finite even where ``w_i = 0`` (``0 * nan``);
then, and only then, the *masked* version of the same function (every non-finite record's
gradient replaced by 0 before the product) is called. Both versions give the same result:
a record whose gradient is not finite contributes 0 and counts as clipped.

Norms are formed from squared norms, never as ``sqrt(sqr(.))``: pytensor < 2.39 rewrites
``sqrt(sqr(x))`` to ``switch(x >= 0, x, nan)`` (pytensor PR #1952).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytensor.scalar as ps
import pytensor.tensor as pt
from pytensor.graph.traversal import ancestors
from pytensor.tensor.elemwise import Elemwise

from pymc_dp.records.backend import compile_function
from pymc_dp.records.errors import mark_data_free

__all__ = [
    "F32_MARGIN",
    "ClipRoute",
    "LazyFunction",
    "clip_weights",
    "factor_rows",
    "mask_rows",
    "reference_clipped_sum",
    "squared_row_norms",
    "verify_route",
    "weighted_sum",
]

_HUGE = np.finfo(np.float64).max


#: Relative margin of the float32 clip weight (`clip_weights` with ``float32_weight``):
#: ``2^-16``, 64 times the worst relative error of the weight's float32 arithmetic (four
#: correctly rounded operations, ``4 * 2^-24``), with room for the approximations that
#: fast-math allows.
F32_MARGIN = 2.0**-16


def clip_weights(sq_norms, bound, *, float32_weight: bool = False):
    """``(finite, w, n_clipped)`` from the per-record squared norms (1-D).

    ``finite`` flags records whose squared norm is finite, ``w`` are the clip weights
    ``min(1, b / ||g_i||)`` (0 where not finite) and ``n_clipped`` counts the records with
    ``||g_i|| > b`` or a non-finite norm.

    With ``float32_weight`` the square root and the division of the weight run in float32
    (vectorised twice as wide; the weight is most of a cheap route's time on PyTensor 3.x),
    with a margin that keeps every record's clipped gradient within ``b`` (issue 28):

    * ``w_i = 1`` exactly when ``||g_i||^2 <= (b (1 - m))^2`` (float64 comparison), so a
      record far enough inside the bound is never changed (exactness with clipping
      inactive is untouched);
    * otherwise ``w_i = min(1, 1 / sqrt(r_i))`` with ``r_i = ||g_i||^2 / (b (1 - m))^2``
      formed in float64 and the square root and the division in float32, which is within
      a relative ``4 * 2^-24`` of ``b (1 - m) / ||g_i||``, so ``||w_i g_i|| < b``; it is
      at most 1 and, for ``||g_i|| > b``, the exact weight shortened by a factor in
      ``[(1 - m)(1 - 4 * 2^-24), 1]``;
    * and, checked in float64, ``w_i^2 ||g_i||^2 <= b^2``; a weight that fails the check
      (none can, with margin ``m = 2^-16`` far above the float32 error, but for a
      float32 overflow of ``r_i``: ``||g_i|| > ~1.8e19 b``) is replaced by 0.

    Every record's contribution has norm at most ``b`` (sensitivity ``2 b`` unchanged) and
    is a deterministic function of the record; a clipped record's contribution is shorter
    than with the exact weight by a factor in ``[1 - m - 4 * 2^-24, 1]`` (relative
    ``1.5e-5``), and a record with ``b (1 - m) < ||g_i|| <= b`` is shrunk by at most
    ``1 - m`` (it is not counted as clipped).
    """
    finite = pt.le(sq_norms, _HUGE)
    n_clipped = pt.sum(pt.invert(pt.le(sq_norms, bound * bound)))
    if not float32_weight:
        inv_norm = pt.minimum(1.0, bound / pt.sqrt(pt.maximum(sq_norms, 1e-300)))
        w = pt.switch(finite, inv_norm, 0.0)
        return finite, w, n_clipped
    inner = bound * (1.0 - F32_MARGIN)
    # the squared norm over (b (1 - m))^2 (float64, relative error ~2^-52), so that
    # float32's range is used around 1 whatever the scale of b
    r32 = pt.cast(sq_norms * (1.0 / (inner * inner)), "float32")
    # 1 / sqrt(r) in float32, capped at 1 by a comparison and a select (one packed
    # minimum; `pt.minimum` adds NaN handling that the check below makes unnecessary):
    # the compiled loop stays vectorised with fewer instructions a record (issue 28)
    y = pt.cast(np.float32(1.0) / pt.sqrt(r32), "float64")
    y = pt.switch(pt.lt(y, 1.0), y, 1.0)
    w = pt.switch(pt.le(sq_norms, inner * inner), 1.0, y)
    # the float64 check; it also gives 0 where the squared norm is NaN or inf (a NaN
    # comparison is false; inf gives w = 0 and 0 * inf = NaN)
    w = pt.switch(pt.le(w * w * sq_norms, bound * bound), w, 0.0)
    return finite, w, n_clipped


def weighted_sum(w, block):
    """``block^T w`` (shape ``(k,)``) for a per-record block ``m x k``.

    A one-column block is summed as ``sum(w * b)``, which PyTensor fuses with the
    elementwise work that makes ``w`` and ``b`` (one pass over the records, no ``m``-long
    temporaries); a wider block is a matrix-vector product. (The summation order of
    ``sum`` differs from a BLAS ``dot``: results may differ in the last bits.)
    """
    if block.type.shape[1] == 1:
        return pt.sum(w * block[:, 0], keepdims=True)
    return pt.dot(w, block)


def mask_rows(block, finite):
    """``block`` with the rows of non-finite records set to 0 (the masked version)."""
    cond = finite if block.ndim == 1 else pt.shape_padright(finite, block.ndim - 1)
    return pt.switch(cond, block, 0.0)


def factor_rows(block, x):
    """``(M, v)`` with ``block = M * v[:, None]`` and ``M`` data-only (not reading ``x``), else
    None: the GLM factorisation of a per-record gradient block (``m x k``)."""
    node = block.owner
    if (
        node is not None
        and isinstance(node.op, Elemwise)
        and isinstance(node.op.scalar_op, ps.TrueDiv)
        and node.inputs[1].type.broadcastable[1]
    ):  # (M * v) / u with u constant along the block: M * (v / u)
        f = factor_rows(node.inputs[0], x)
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


def squared_row_norms(blocks, split):
    """Per-record squared norms of gradient blocks, the factorised ones from prepared norms.

    ``split[j]`` is `factor_rows` of ``blocks[j]``: None (the norm is ``sum(b^2, axis=1)``)
    or ``(M, v)`` (the norm is ``v^2 ||m_i||^2``, with ``||m_i||^2`` a vector input
    ``row_sqK`` computed from the data-only ``M`` once per chunk). Returns ``(terms,
    row_sq_in, row_sq_out)``: a squared-norm term per block, the inputs ``row_sqK`` and the
    graphs that prepare them.
    """
    terms, row_sq_in, row_sq_out = [], [], []
    for b, f in zip(blocks, split, strict=True):
        if f is None:
            terms.append(pt.sum(pt.sqr(b), axis=1))
        else:
            r = pt.vector(f"row_sq{len(row_sq_in)}", dtype="float64")
            row_sq_in.append(r)
            row_sq_out.append(pt.cast(pt.sum(pt.sqr(f[0]), axis=1), "float64"))
            terms.append(pt.sqr(f[1]) * r)
    return terms, row_sq_in, row_sq_out


class LazyFunction:
    """A compiled function that is compiled on its first call (picklable either way)."""

    def __init__(self, inputs, outputs, compile_kwargs: dict | None = None, **kwargs) -> None:
        self._args = (list(inputs), outputs, dict(compile_kwargs or {}), kwargs)
        self._f = None

    def compile(self) -> LazyFunction:
        """Compile now (if not yet); returns ``self``."""
        if self._f is None:
            inputs, outputs, ck, kw = self._args
            try:
                self._f = compile_function(inputs, outputs, ck, **kw)
            except Exception as err:  # compiling reads no data: its error may be shown
                mark_data_free(err)
                raise
        return self

    def __call__(self, *args):
        if self._f is None:
            self.compile()
        return self._f(*args)


@dataclass
class ClipRoute:
    """A clipped-gradient-sum route (picklable).

    ``fast(q, b, *prep, *chunk)`` and ``masked(...)`` return ``(sum, n_clipped)``; ``masked``
    (every non-finite record's gradient set to 0 before the product) is called only when
    ``fast`` gives a non-finite sum, and is compiled on that first need. ``prepare(*chunk)``
    (or ``None``) gives data-only per-chunk arrays ``prep`` (e.g. row norms of the design
    matrix), cached by the runtime; see `prepared`.
    """

    name: str
    fast: Any
    masked: Any
    prepare: Any | None = None
    #: ``(inputs, outputs, compile_kwargs, kwargs)`` of ``fast`` (symbolic, data-free), from
    #: which `pymc_dp.records.routes.compile_fused_pass` builds the fused last pass of
    #: DP-HMC; ``None``: no fused pass. Not pickled (the fused pass is in-memory only).
    graph: Any | None = None
    #: Relative shortening a clipped record's contribution may have against the exact
    #: weight (`F32_MARGIN` for a float32 clip weight, `clip_weights`; 0: exact weights).
    weight_margin: float = 0.0

    def __getstate__(self) -> dict:
        return {**self.__dict__, "graph": None}

    def prepared(self, chunk) -> list | None:
        """The per-chunk data-only arrays (``[]`` when the route needs none); ``None`` when
        they are not finite (then the generic route serves the chunk)."""
        if self.prepare is None:
            return []
        r = [np.asarray(a) for a in self.prepare(*chunk)]
        return r if all(np.all(np.isfinite(a)) for a in r) else None

    def __call__(self, q, bound, prep, chunk) -> tuple[np.ndarray, int]:
        with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf: handled below
            s, k = self.fast(q, bound, *prep, *chunk)
        s = np.asarray(s)
        # the sum has ``d`` entries: checked in Python (a NumPy reduction right after the
        # compiled loop costs a few microseconds, once per leapfrog step in DP-HMC)
        if not all(map(math.isfinite, s.ravel().tolist())):
            s, k = self.masked(q, bound, *prep, *chunk)
            s = np.asarray(s)
        return s, int(k)


def reference_clipped_sum(grads: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """The clipped sum and count of per-record gradients ``grads`` (``m x d``), in numpy.

    The definition every route must reproduce: a record whose gradient is not finite
    contributes 0 and counts as clipped.
    """
    grads = np.asarray(grads, dtype=float)
    with np.errstate(invalid="ignore", over="ignore"):
        sq = np.sum(grads * grads, axis=1)
        finite = sq <= _HUGE
        w = np.where(finite, np.minimum(1.0, bound / np.sqrt(np.maximum(sq, 1e-300))), 0.0)
        total = (np.where(finite[:, None], grads, 0.0) * w[:, None]).sum(axis=0)
    return total, int(np.sum(~(sq <= bound * bound)))


def verify_route(route: ClipRoute, f_grad_ref, batch, d: int, dtype) -> bool:
    """Whether ``route`` reproduces `reference_clipped_sum` on stand-in records.

    ``f_grad_ref(q, *chunk)`` gives the generic route's per-record gradients. Data-free:
    8 stand-in records with the dtypes and trailing shapes of the data
    (`pymc_dp.records.fakes.fake_rows`; integer entries 0 or 1, valid group indices
    for two or more groups), at two parameter points, with and without clipping. The check
    must see a finite, nonzero sum at least once.
    """
    from pymc_dp.records.fakes import fake_rows

    if any(None in b.type.shape[1:] for b in batch):
        return False
    templates = [np.zeros((1, *b.type.shape[1:]), dtype=b.dtype) for b in batch]
    fake = fake_rows(templates, 8)
    prep = route.prepared(fake)
    if prep is None:
        return False
    checked = False
    for q in (np.zeros(d), 0.1 + 0.05 * np.arange(d)):
        grads = np.asarray(f_grad_ref(q.astype(dtype), *fake))
        for b in (1e-3, 1e6):
            g1, k1 = reference_clipped_sum(grads, b)
            g2, k2 = route(q.astype(dtype), b, prep, fake)
            if k1 != k2 or g1.shape != g2.shape:
                return False
            # a float32 clip weight shortens each clipped contribution (norm <= b) by at
            # most a relative 2 * weight_margin
            with np.errstate(invalid="ignore", over="ignore"):
                lengths = np.minimum(np.sqrt(np.sum(grads * grads, axis=1)), b)
            slack = 2.0 * route.weight_margin * float(np.nansum(lengths))
            if not np.allclose(g1, g2, rtol=1e-9, atol=1e-12 + slack, equal_nan=True):
                return False
            checked = checked or bool(np.all(np.isfinite(g1)) and np.any(g1 != 0))
    return checked
