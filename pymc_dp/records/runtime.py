"""The per-record functions the steps call at run time.

`RecordFunctions` maps the compiled routes over a record store, chunk by chunk, and
adds the chunk results. The steps depend only on the methods listed in
`RecordSource` (a Protocol), not on how the functions were built or where the records
live. The methods that read the data must only be called from inside a privacy mechanism.

Per-record numerics run with floating-point warnings off (``np.errstate``): a warning
printed for some records and not for others (a zero gradient, a log-likelihood of -inf at
both points) would publish a bit of the data without noise.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pymc_dp.records.affine import (
    AffineBlocks,
    affine_in_data,
    ratio_affine_in_data,
    ratio_values_function,
)
from pymc_dp.records.affine import limit_sq as affine_limit_sq
from pymc_dp.records.backend import direct_jit
from pymc_dp.records.clipping import LazyFunction
from pymc_dp.records.graphs import RecordGraphs
from pymc_dp.records.routes import (
    compile_fused_pass,
    compile_fused_two_point,
    compile_gradients,
    compile_kept_ratio,
)
from pymc_dp.records.store import InMemoryRecords, _private_call

__all__ = [
    "FusedLastPass",
    "GradSumMemo",
    "KeptOnWorkers",
    "LoglikMemo",
    "RecordFunctions",
    "RecordSource",
]


@runtime_checkable
class RecordSource(Protocol):
    """What a DP step needs from the model and its records (flat parameter vectors ``q``)."""

    n_records: int
    ndim: int
    #: Keep the (non-private) clipped counts in the chunk results.
    counts: bool
    #: Released sums that reached the driver, by kind.
    released: dict[str, int]

    @property
    def records(self) -> Any: ...

    @property
    def loglik_worth_keeping(self) -> bool: ...

    @property
    def can_keep(self) -> bool: ...

    def loglik_chunks(self, q: np.ndarray) -> list[np.ndarray] | KeptOnWorkers: ...

    def clipped_loglik_ratio_sum_kept(
        self, q_new: np.ndarray, l_old: list[np.ndarray] | KeptOnWorkers, bound: float
    ) -> tuple[float, int, list[np.ndarray] | KeptOnWorkers]: ...

    @property
    def fusable(self) -> bool: ...

    @property
    def fused_pays(self) -> bool: ...

    @property
    def fused_two_point_pays(self) -> bool: ...

    def clipped_grad_and_ratio_sum(
        self, q_new: np.ndarray, grad_bound: float, q_old: np.ndarray, llr_bound: float
    ) -> tuple[np.ndarray, int, float, int]: ...

    def clipped_grad_and_ratio_sum_kept(
        self,
        q_new: np.ndarray,
        grad_bound: float,
        l_old: list[np.ndarray] | KeptOnWorkers,
        llr_bound: float,
    ) -> tuple[np.ndarray, int, float, int, list[np.ndarray] | KeptOnWorkers]: ...

    def prior_logp_and_grad(self, q: np.ndarray) -> tuple[float, np.ndarray]: ...

    def prior_logp(self, q: np.ndarray) -> float: ...

    def loglik_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> np.ndarray: ...

    def loglik_ratio_subset(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray: ...

    def ratio_subset_terms(
        self,
        q_new: np.ndarray,
        q_old: np.ndarray,
        idx: np.ndarray,
        terms: Any,
        merge: Any = ...,
        *,
        row_args: tuple = (),
        params: tuple = (),
    ) -> tuple[tuple, tuple]: ...

    def clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float
    ) -> tuple[float, int]: ...

    def clipped_residual_ratio_sum(
        self,
        q_new: np.ndarray,
        q_old: np.ndarray,
        bound: float,
        anchor: np.ndarray,
        grad_bound: float,
        transform: np.ndarray | None = None,
        direction: np.ndarray | None = None,
    ) -> tuple[float, int]: ...

    def clipped_grad_moments(
        self,
        q: np.ndarray,
        bound: float,
        transform: np.ndarray | None = None,
        outer_bound: float | None = None,
        centre: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def clipped_hessian_sum(
        self,
        points: np.ndarray,
        transforms: np.ndarray,
        step: float,
        bound: float,
    ) -> np.ndarray: ...

    def grad_norm_counts(
        self, q: np.ndarray, grid: np.ndarray, transform: np.ndarray | None = None
    ) -> np.ndarray: ...

    def shared_clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float, noise_std: float
    ) -> float: ...

    def clipped_grad_sum(self, q: np.ndarray, bound: float) -> tuple[np.ndarray, int]: ...

    def clipped_grad_sum_subset(
        self, q: np.ndarray, bound: float, idx: np.ndarray
    ) -> tuple[np.ndarray, int]: ...

    def check_start(self, q: np.ndarray) -> None: ...


def _clip_rows(g, bound: float) -> np.ndarray:
    """Rows of ``g`` clipped to L2 norm ``bound``; a row that is not finite becomes 0.

    Silent whatever the rows (a zero row, an overflowing or non-finite one): a
    floating-point warning printed for some records and not others would publish a bit of
    the data.
    """
    g = np.asarray(g, dtype=float)
    with np.errstate(all="ignore"):
        sq = np.einsum("ij,ij->i", g, g)
        ok = np.isfinite(sq)
        big = ok & (sq > bound * bound)
        w = np.where(big, bound / np.sqrt(np.where(big, sq, 1.0)), 1.0)
        return np.where(ok[:, None], g * w[:, None], 0.0)


#: Bytes of per-record gradients (``rows x d`` float64) one block of a chunk may form: the
#: functions that need dense per-record gradients (the moments and norm counts of the warm
#: start, the control variate's anchor gradients) evaluate a chunk in row blocks of this
#: size, so that their temporaries stay bounded whatever the chunk size (``None``: all
#: ``n`` records in one chunk).
ROW_BLOCK_BYTES = 1 << 21
#: Fewest rows of a block (the per-call overhead of a compiled function).
MIN_BLOCK_ROWS = 256


def _row_blocks(chunk: tuple, d: int):
    """The rows of a chunk (its arrays sliced, not copied) in blocks of about
    `ROW_BLOCK_BYTES` of ``rows x d`` float64."""
    n = len(chunk[0]) if chunk else 0
    size = max(MIN_BLOCK_ROWS, ROW_BLOCK_BYTES // (8 * max(int(d), 1)))
    if n <= size:
        yield chunk
        return
    for start in range(0, n, size):
        yield tuple(a[start : start + size] for a in chunk)


class _Coefficients:
    """The control variate's rows ``c_i = w_i M g_i`` of one chunk, kept as the per-record
    gradients ``g_i`` (block by block, each block dense or, when at most half of its entries
    are non-zero, in compressed sparse rows: a record of a group-indexed model touches a few
    of the ``d`` coordinates, while ``M g_i`` is dense), their clip weights ``w_i`` and the
    public ``M``. Only ``c @ v = w * (g @ (M^T v))`` is needed; memory is that of the sparse
    ``g_i`` and ``n`` weights, never a dense ``n x d`` array for a sparse gradient."""

    def __init__(self, transform: np.ndarray | None) -> None:
        self.transform = transform
        self.blocks: list = []
        self.weights: list[np.ndarray] = []

    def add(self, g: np.ndarray, bound: float) -> None:
        """Append a block of per-record gradients ``g`` (rows), clipped after ``M``."""
        from scipy import sparse

        g = np.asarray(g, dtype=float)
        with np.errstate(all="ignore"):
            mg = _mapped(g, self.transform)
            sq = np.einsum("ij,ij->i", mg, mg)
            ok = np.isfinite(sq)
            big = ok & (sq > bound * bound)
            w = np.where(big, bound / np.sqrt(np.where(big, sq, 1.0)), 1.0)
            w = np.where(ok, w, 0.0)
            g = np.where(ok[:, None], g, 0.0)  # a non-finite row contributes 0
        del mg
        if g.size and np.count_nonzero(g) <= g.size // 2:
            g = sparse.csr_matrix(g)
        self.blocks.append(g)
        self.weights.append(w)

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=float)
        if self.transform is not None:
            v = self.transform.T @ v
        parts = [
            w * np.asarray(b @ v, dtype=float).ravel()
            for b, w in zip(self.blocks, self.weights, strict=True)
        ]
        return np.concatenate(parts) if parts else np.zeros(0)


@dataclass
class _Compiled:
    """Compiled functions of one step (picklable)."""

    prior_and_grad: Any
    ll_chunk: Any
    llr_clipped: Any
    grad_chunk: Any | None = None
    grad_clipped: Any | None = None
    llr_kept: Any | None = None


_F64 = np.dtype(np.float64)


def _compiled(f):
    """``f``, compiled now if it is a `LazyFunction` not compiled yet."""
    return f.compile() if isinstance(f, LazyFunction) else f


def _is_vector(q, shape: tuple) -> bool:
    """Whether ``q`` is a C-contiguous float64 array of ``shape`` (what a compiled
    function called directly takes, `pymc_dp.records.backend.direct_jit`)."""
    return type(q) is np.ndarray and q.dtype == _F64 and q.shape == shape and q.flags.c_contiguous


# -- what runs on one chunk of records, where the chunk lives ------------------------------------
# Each returns a sum over the chunk and a count; the count of clipped records is computed from
# the data without noise and is kept only when ``counts`` is set (non-private diagnostics).


def _add_pairs(acc: tuple, part: tuple) -> tuple:
    """Combine two ``(sum, count)`` pairs (the reduction of every released sum)."""
    return acc[0] + part[0], acc[1] + part[1]


def _all(acc: bool, part: bool) -> bool:
    return acc and part


@dataclass(frozen=True)
class _LLRSumChunk:
    """``(sum_i clip(r_i, -b, b), n_clipped)`` of one chunk (picklable)."""

    f: Any
    counts: bool

    def __call__(self, q_new, q_old, bound, *chunk) -> tuple[float, int]:
        s, k = self.f(q_new, q_old, bound, *chunk)
        return float(s), int(k) if self.counts else 0


@dataclass(frozen=True)
class _KeptLLRChunk:
    """``(sum_i clip(r_i, -b, b), n_clipped, l_new)`` of one chunk, the log-likelihoods at
    the old point given (``l_old``, kept in this process): one log-likelihood evaluation."""

    f: Any
    counts: bool

    def __call__(self, q_new, bound, l_old, *chunk) -> tuple[float, int, np.ndarray]:
        s, k, l_new = self.f(q_new, bound, l_old, *chunk)
        return float(s), int(k) if self.counts else 0, np.asarray(l_new)


def _add_kept(acc: tuple, part: tuple) -> tuple:
    """Add the sums and counts of `_KeptLLRChunk` results, collect their ``l_new``."""
    return acc[0] + part[0], acc[1] + part[1], [*acc[2], part[2]]


def _collect(acc: list, part) -> list:
    return [*acc, np.asarray(part)]


@dataclass(frozen=True)
class _GradSumChunk:
    """``(sum_i clip_b(grad l_i), n_clipped)`` of one chunk through the chosen route."""

    route: Any
    generic: Any
    counts: bool

    def __call__(self, q, bound, prep, *chunk) -> tuple[np.ndarray, int]:
        rows = list(chunk)
        if prep is None:
            g, k = self.generic(q, bound, [], rows)
        else:
            g, k = self.route(q, bound, prep, rows)
        return np.asarray(g, dtype=float), int(k) if self.counts else 0


@dataclass(frozen=True)
class _FusedChunk:
    """The last gradient pass of a DP-HMC trajectory and its ratio release on one chunk:
    ``(grad sum, n_clipped, ratio sum, n_llr_clipped, l_new)`` from one compiled call
    (`pymc_dp.records.routes.compile_fused_pass`); a non-finite gradient sum is computed
    again by the route's masked function, as in `_GradSumChunk`."""

    route: Any
    generic: Any
    fused: Any
    fused_generic: Any
    counts: bool

    def __call__(self, q, bound, llr_bound, prep, l_old, *chunk) -> tuple:
        rows = list(chunk)
        route, f = (self.generic, self.fused_generic) if prep is None else (self.route, self.fused)
        prep = [] if prep is None else prep
        with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf: handled below
            g, k, s, kl, l_new = f(q, bound, *prep, *rows, llr_bound, l_old)
        g = np.asarray(g)
        if not np.all(np.isfinite(g)):
            g, k = route.masked(q, bound, *prep, *rows)
        c = self.counts
        return (
            np.asarray(g, dtype=float), int(k) if c else 0,
            float(s), int(kl) if c else 0, np.asarray(l_new),
        )  # fmt: skip


@dataclass(frozen=True)
class _FusedTwoPointChunk:
    """The last gradient pass of a DP-HMC trajectory and a two-point ratio release on one
    chunk: ``(grad sum, n_clipped, ratio sum, n_llr_clipped)`` from one compiled call
    (`pymc_dp.records.routes.compile_fused_two_point`); a non-finite gradient sum is
    computed again by the route's masked function, as in `_GradSumChunk`."""

    route: Any
    generic: Any
    fused: Any
    fused_generic: Any
    counts: bool

    def __call__(self, q, bound, llr_bound, q_old, prep, *chunk) -> tuple:
        rows = list(chunk)
        route, f = (self.generic, self.fused_generic) if prep is None else (self.route, self.fused)
        prep = [] if prep is None else prep
        with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf: handled below
            g, k, s, kl = f(q, bound, *prep, *rows, llr_bound, q_old)
        g = np.asarray(g)
        if not np.all(np.isfinite(g)):
            g, k = route.masked(q, bound, *prep, *rows)
        c = self.counts
        return np.asarray(g, dtype=float), int(k) if c else 0, float(s), int(kl) if c else 0


def _add_fused4(acc: tuple, part: tuple) -> tuple:
    """Add the sums and counts of `_FusedTwoPointChunk` results."""
    return acc[0] + part[0], acc[1] + part[1], acc[2] + part[2], acc[3] + part[3]


def _add_fused(acc: tuple, part: tuple) -> tuple:
    """Add the sums and counts of `_FusedChunk` results, collect their ``l_new``."""
    return (
        acc[0] + part[0], acc[1] + part[1], acc[2] + part[2], acc[3] + part[3],
        [*acc[4], part[4]],
    )  # fmt: skip


@dataclass(frozen=True)
class _GradRowsChunk:
    """``(sum_{i in rows} clip_b(grad l_i), n_clipped)`` of the selected rows of one chunk
    (the route's data-only arrays computed for those rows)."""

    route: Any
    generic: Any
    counts: bool

    def __call__(self, q, bound, inverse, row_args, *rows) -> tuple[np.ndarray, int]:
        if inverse.size != len(rows[0]):  # repeated records count once per repeat
            rows = [a[inverse] for a in rows]
        prep = self.route.prepared(rows)
        if prep is None:
            g, k = self.generic(q, bound, [], rows)
        else:
            g, k = self.route(q, bound, prep, rows)
        return np.asarray(g, dtype=float), int(k) if self.counts else 0


@dataclass(frozen=True)
class _RatioRowsChunk:
    """``terms(r, *row_args, *params)`` of the selected rows of one chunk, with ``r`` their
    log-likelihood ratios (each distinct row evaluated once). ``terms`` is a pure function
    returning ``(sums, counts)``; the counts are non-private and dropped unless `counts`."""

    f: Any
    terms: Any
    counts: bool

    def __call__(self, q_new, q_old, params, inverse, row_args, *rows) -> tuple[tuple, tuple]:
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            r = np.asarray(self.f(q_new, *rows)) - np.asarray(self.f(q_old, *rows))
            sums, counts = self.terms(r[inverse], *row_args, *params)
        return tuple(sums), tuple(counts) if self.counts else tuple(0 for _ in counts)


def _add_tuples(a: tuple, b: tuple) -> tuple:
    return tuple(x + y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True)
class _MergeTerms:
    """Reduce ``(sums, counts)`` chunk results: ``merge`` the sums, add the counts."""

    merge: Any

    def __call__(self, acc, part):
        if acc is None:
            return part
        return self.merge(acc[0], part[0]), _add_tuples(acc[1], part[1])


def _mapped(g, m: np.ndarray | None) -> np.ndarray:
    """Rows of ``g`` mapped by ``m`` (``g @ m.T``); ``g`` itself when ``m`` is None."""
    g = np.asarray(g, dtype=float)
    return g if m is None else g @ m.T


@dataclass(frozen=True)
class _GradMomentsChunk:
    """``(sum_i c_i, sum_i e_i e_i^T)`` of one chunk, ``c_i = clip_b(M grad l_i(q))``,
    ``e_i = clip_{b'}(c_i - centre)`` (``centre`` public, default 0)."""

    f: Any

    def __call__(self, q, bound, m, outer_bound, centre, *chunk) -> tuple[np.ndarray, np.ndarray]:
        total, outer = None, None
        for rows in _row_blocks(chunk, np.size(q) if m is None else len(m)):
            g = _clip_rows(_mapped(self.f(q, *rows), m), bound)
            if centre is not None:
                e = _clip_rows(g - centre[None, :], bound if outer_bound is None else outer_bound)
            elif outer_bound is None or outer_bound >= bound:
                e = g
            else:
                e = _clip_rows(g, outer_bound)
            s1, s2 = g.sum(axis=0), e.T @ e
            total, outer = (s1, s2) if total is None else (total + s1, outer + s2)
        return total, outer


def _clip_frobenius(h: np.ndarray, bound: float) -> np.ndarray:
    """Matrices ``h[i]`` (shape ``(rows, d, d)``) clipped to Frobenius norm ``bound``; a
    matrix that is not finite becomes 0 (silent: no data-dependent warning)."""
    with np.errstate(all="ignore"):
        sq = np.einsum("ijk,ijk->i", h, h)
        ok = np.isfinite(sq)
        big = ok & (sq > bound * bound)
        w = np.where(big, bound / np.sqrt(np.where(big, sq, 1.0)), 1.0)
        return np.where(ok[:, None, None], h * w[:, None, None], 0.0)


@dataclass(frozen=True)
class _HessianSumChunk:
    """``sum_i clip_B(H_i)`` of one chunk: ``H_i`` minus record ``i``'s log-likelihood
    Hessian in whitened coordinates, by central differences of its own gradient
    (`RecordFunctions.clipped_hessian_sum`)."""

    f: Any

    def __call__(self, points, transforms, step, bound, *chunk) -> np.ndarray:
        k = len(points) // 2
        total = np.zeros((k, k))
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            for rows in _row_blocks(chunk, 2 * k * k):
                cols = [
                    _mapped(self.f(points[2 * j], *rows), transforms[2 * j])
                    - _mapped(self.f(points[2 * j + 1], *rows), transforms[2 * j + 1])
                    for j in range(k)
                ]
                # column j: minus the derivative of the gradient along direction j
                h = np.stack(cols, axis=2) / (-2.0 * step)
                h = 0.5 * (h + np.swapaxes(h, 1, 2))
                total += _clip_frobenius(h, bound).sum(axis=0)
        return total


@dataclass(frozen=True)
class _NormCountsChunk:
    """Records of one chunk whose ``||M grad l_i(q)||`` exceeds each grid bound (a
    non-finite gradient counts above every bound)."""

    f: Any

    def __call__(self, q, grid, m, *chunk) -> np.ndarray:
        counts = np.zeros(np.size(grid), dtype=np.int64)
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            for rows in _row_blocks(chunk, np.size(q) if m is None else len(m)):
                g = _mapped(self.f(q, *rows), m)
                sq = np.einsum("ij,ij->i", g, g)
                ok = np.isfinite(sq)
                norm = np.where(ok, np.sqrt(np.where(ok, sq, 0.0)), np.inf)
                counts += (norm[:, None] > np.asarray(grid)[None, :]).sum(axis=0)
        return counts


@dataclass(frozen=True, eq=False)
class _AnchorGrads:
    """Per-record clipped anchor gradients ``c_i = clip(M grad l_i(anchor))`` of one chunk
    (data-only arrays kept where the chunk lives, never returned): the control variate's
    coefficients. Computed in row blocks (`ROW_BLOCK_BYTES`) and kept as the per-record
    gradients (sparse where they are) and clip weights (`_Coefficients`): no dense ``n x d``
    array for sparse per-record gradients, kept or temporary."""

    f: Any
    anchor: np.ndarray
    grad_bound: float
    transform: np.ndarray | None = None

    def __call__(self, *chunk) -> _Coefficients:
        d = self.anchor.size if self.transform is None else len(self.transform)
        c = _Coefficients(self.transform)
        for rows in _row_blocks(chunk, d):
            c.add(self.f(self.anchor, *rows), self.grad_bound)
        return c


@dataclass(frozen=True)
class _ResidualChunk:
    """``(sum_i clip(r_i - c_i . dq, +-b), n_clipped)`` of one chunk (control variate)."""

    f: Any
    counts: bool

    def __call__(self, q_new, q_old, bound, dq, c, *chunk) -> tuple[float, int]:
        with np.errstate(all="ignore"):  # -inf - -inf: a non-finite residual, counted as 0
            r = np.asarray(self.f(q_new, *chunk)) - np.asarray(self.f(q_old, *chunk))
            res = r - c @ dq
            ok = np.isfinite(res)
            clipped = np.clip(np.where(ok, res, 0.0), -bound, bound)
            k = int(np.count_nonzero(~ok | (np.abs(res) > bound))) if self.counts else 0
            return float(clipped.sum()), k


def _add_moments(acc: tuple, part: tuple) -> tuple:
    return acc[0] + part[0], acc[1] + part[1]


def _add_counts(acc: np.ndarray, part: np.ndarray) -> np.ndarray:
    return acc + part


@dataclass(frozen=True)
class _Prepare:
    """The route's data-only per-chunk arrays (cached by the store, never returned)."""

    route: Any

    def __call__(self, *chunk):
        return self.route.prepared(list(chunk))


@dataclass(frozen=True)
class _StartCheck:
    """Whether every record's log-likelihood is finite at ``q`` (one bit per chunk)."""

    f: Any

    def __call__(self, q, *chunk) -> bool:
        return bool(np.all(np.isfinite(self.f(q, *chunk))))


def _take_rows(chunk: tuple, idx: np.ndarray) -> tuple:
    """The rows ``idx`` of every array of ``chunk`` (copies)."""
    return tuple(a[idx] for a in chunk)


class _StandIn:
    """A per-record function ``f(*qs, *records) -> [values]`` (a list-output
    ``LazyFunction``) on stand-in records (`AffineBlocks`), its Numba function called
    directly once known (`pymc_dp.records.backend.direct_jit`) while the parameter
    vectors are float64 vectors."""

    def __init__(self, f: LazyFunction, n_q: int) -> None:
        self._f = f
        self._n_q = n_q
        self._jit: Any = None

    def __call__(self, qs: tuple, records: tuple):
        jit = self._jit
        plain = all(type(a) is np.ndarray and a.dtype == _F64 and a.ndim == 1 for a in qs)
        if jit and plain:
            return jit(*qs, *records)[0]
        out = self._f(*qs, *records)[0]
        if jit is None and plain and self._f._f is not None:
            self._jit = direct_jit(self._f._f, [*qs, *records]) or False
        return out


class RecordFunctions:
    """Per-record functions of a PyMC model for the value variables one step samples.

    Built by `pymc_dp.records.build.build_record_functions`; the records live in a
    store (`pymc_dp.records.store.InMemoryRecords`). All methods take flat parameter
    vectors in the order PyMC's `ArrayStepShared` uses.

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
        records: InMemoryRecords,
        n_records: int,
        ndim: int,
        chunk_size: int | None,
        tempering: float,
        graphs: RecordGraphs,
        compile_kwargs: dict | None = None,
    ) -> None:
        self._c = compiled
        self._records = records
        self.n_records = n_records
        self.ndim = ndim
        self.chunk_size = chunk_size
        self.tempering = tempering
        self._graphs = graphs
        self._compile_kwargs = dict(compile_kwargs or {})
        #: Keep the clipped counts (non-private diagnostics) in the chunk results; a step
        #: that does not publish them switches this off, so they never leave a worker.
        self.counts = True
        #: Released sums that reached the driver, by kind (``"llr"``, ``"grad"``).
        self.released: dict[str, int] = {"llr": 0, "grad": 0}
        self._kernels: dict[str, Any] = {}
        self._loglik_costly: bool | None = None
        #: ``(jit, whole, shape of q)``: the gradient route's Numba function, called
        #: directly by `clipped_grad_sum` (`_direct_grad`); ``None`` until set or unusable.
        self._direct: tuple | None = None
        #: Do not call the route's Numba function directly (benchmarks: the layered call).
        self._direct_off = False
        #: ``(route, function)``: the route's function without the count (`_fast_fn`).
        self._nocount: tuple | None = None
        self._last_bound: tuple | None = None
        #: ``(jit, shape of q)`` of the prior's function (as `_direct`); False: unusable.
        self._direct_prior: tuple | bool | None = None
        #: ``(jit, whole, shape of q, counts)`` of the two-point fused pass (as `_direct`).
        self._direct_fused: tuple | bool | None = None
        #: ``(route, counts, function)``: the two-point fused pass on the whole records.
        self._fused2: tuple | None = None
        #: ``(AffineBlocks, gradient function, route)`` of the affine bypass
        #: (`_affine_grad_sum`); ``None`` until tried, False where it does not apply.
        self._affine: tuple | bool | None = None
        #: Do not take the affine bypass (benchmarks: the per-record loop on every record).
        self._affine_off = False
        #: ``(function, (jit, shape of q) or False or None)``: `_affine_rest`'s function.
        self._affine_fast: tuple | None = None

    # -- chunking -------------------------------------------------------------------------
    def _chunks(self):
        return self._records.chunks()

    @property
    def records(self):
        """The store holding the records (`InMemoryRecords` or a remote store)."""
        return self._records

    def _kernel(self, name: str):
        """The per-chunk function ``name``, built once per setting of `counts` (a stable
        object: a remote store ships it to the workers once)."""
        key = f"{name}:{int(self.counts)}"
        if key not in self._kernels:
            if name == "llr":
                # compiled before it is wrapped (a remote store ships it compiled, as
                # when `build_record_functions` compiled it up front)
                self._kernels[key] = _LLRSumChunk(_compiled(self._c.llr_clipped), self.counts)
            elif name == "grad":
                fs = self._c.grad_clipped
                self._kernels[key] = _GradSumChunk(fs["route"], fs["generic"], self.counts)
            elif name == "grad_rows":
                fs = self._c.grad_clipped
                self._kernels[key] = _GradRowsChunk(fs["route"], fs["generic"], self.counts)
            elif name == "residual":
                self._kernels[key] = _ResidualChunk(self._c.ll_chunk, self.counts)
            elif name == "moments":
                self._kernels[key] = _GradMomentsChunk(self._c.grad_chunk)
            elif name == "hessians":
                self._kernels[key] = _HessianSumChunk(self._c.grad_chunk)
            elif name == "norm_counts":
                self._kernels[key] = _NormCountsChunk(self._c.grad_chunk)
            elif name == "llr_kept":
                if self._c.llr_kept is None:
                    self._c.llr_kept = compile_kept_ratio(self._graphs, self._compile_kwargs)
                self._kernels[key] = _KeptLLRChunk(self._c.llr_kept, self.counts)
            elif name == "fused":
                self._ensure_grad()
                fs = self._c.grad_clipped
                self._kernels[key] = _FusedChunk(
                    fs["route"],
                    fs["generic"],
                    compile_fused_pass(fs["route"], self._graphs),
                    compile_fused_pass(fs["generic"], self._graphs),
                    self.counts,
                )
            elif name == "fused2":
                self._ensure_grad()
                fs = self._c.grad_clipped
                self._kernels[key] = _FusedTwoPointChunk(
                    fs["route"],
                    fs["generic"],
                    compile_fused_two_point(fs["route"], self._graphs),
                    compile_fused_two_point(fs["generic"], self._graphs),
                    self.counts,
                )
            elif name == "prepare":
                self._kernels[key] = _Prepare(self._c.grad_clipped["route"])
            else:  # "start"
                self._kernels[key] = _StartCheck(self._c.ll_chunk)
        return self._kernels[key]

    # -- data-free parts --------------------------------------------------------------------
    def prior_logp_and_grad(self, q: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior plus log-Jacobian at ``q`` and its gradient; never reads the data."""
        direct = self._direct_prior
        if direct and _is_vector(
            q, direct[1]
        ):  # its Numba function called directly: the same numbers (see `_direct_grad`)
            lp, g = direct[0](q)
            return float(lp), g
        lp, g = self._c.prior_and_grad(q)
        if direct is None and not self._direct_off:
            a = np.asarray(q)
            jit = direct_jit(self._c.prior_and_grad, [a]) if a.ndim == 1 else None
            self._direct_prior = (jit, a.shape) if jit is not None else False
        return float(lp), np.asarray(g)

    def prior_logp(self, q: np.ndarray) -> float:
        """Log prior plus log-Jacobian at ``q``; never reads the data."""
        return self.prior_logp_and_grad(q)[0]

    # -- data reads (only call these from inside a privacy mechanism) ----------------------
    def loglik(self, q: np.ndarray) -> np.ndarray:
        """Per-record (tempered) log-likelihoods ``T * l_i(q)``, shape ``(n,)``."""
        with np.errstate(all="ignore"):
            return np.concatenate([self._c.ll_chunk(q, *c) for c in self._chunks()])

    def loglik_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> np.ndarray:
        """Per-record log-likelihood differences ``T * (l_i(q_new) - l_i(q_old))``."""
        with np.errstate(all="ignore"):
            return self.loglik(q_new) - self.loglik(q_old)

    def loglik_ratio_subset(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """``T * (l_i(q_new) - l_i(q_old))`` for the records ``idx`` only (repeats allowed).

        Reads only the rows ``idx`` of every data array (one fancy-indexing read per array), so
        the cost is ``O(len(idx))``, independent of ``n``. Per-record values: in-memory
        records only (the steps use `ratio_subset_terms`, which returns sums).
        """
        rows = self._records.take(idx)
        with np.errstate(all="ignore"):
            return np.asarray(self._c.ll_chunk(q_new, *rows)) - np.asarray(
                self._c.ll_chunk(q_old, *rows)
            )

    def ratio_subset_terms(
        self,
        q_new: np.ndarray,
        q_old: np.ndarray,
        idx: np.ndarray,
        terms: Any,
        merge: Any = _add_tuples,
        *,
        row_args: tuple = (),
        params: tuple = (),
    ) -> tuple[tuple, tuple]:
        """A minibatch release: ``terms`` of the log-likelihood ratios of the records ``idx``.

        ``terms(r, *row_args, *params) -> (sums, counts)`` is a pure, picklable function of
        the ratios ``r = T (l_i(q_new) - l_i(q_old))`` of a part of the minibatch (e.g.
        `pymc_dp.kernels.subsampled_penalty.clipped_moments`); it must return sums over
        the part, never per-record values. ``row_args`` are per-index arrays (public, drawn
        on the driver), ``params`` scalars. The store evaluates ``terms`` where each chunk
        of records lives, on that chunk's selected rows only; the parts are combined in chunk
        order (``merge`` for the sums, added counts). The counts are computed from the data
        without noise (0 unless `counts`). Keep ``terms`` a module-level function (it is
        shipped to a remote store once).
        """
        idx = np.asarray(idx)
        if idx.size == 0:
            empty = np.empty(0)
            sums, counts = terms(empty, *(empty for _ in row_args), *params)
            return tuple(sums), tuple(0 for _ in counts)
        key = f"rows:{terms.__module__}.{terms.__qualname__}:{int(self.counts)}"
        if key not in self._kernels:
            self._kernels[key] = _RatioRowsChunk(self._c.ll_chunk, terms, self.counts)
        out = self._records.map_reduce_rows(
            self._kernels[key],
            _MergeTerms(merge),
            None,
            idx,
            args=(q_new, q_old, tuple(params)),
            row_args=tuple(row_args),
        )
        self.released["llr"] += 1
        return out

    def clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float
    ) -> tuple[float, int]:
        """Sum of per-record log-likelihood ratios clipped to ``[-bound, bound]``.

        Returns the clipped sum and the number of clipped records. The count is computed from
        the data without noise: it must never be published except behind an explicit,
        loudly labelled non-private option (with `counts` off it is 0). The chunk sums are
        added in chunk order, wherever the chunks live. Ratios affine in the records (the
        banana) take the affine bypass where it applies (`_affine_ratio_sum`).
        """
        if self._affine is not False and not self._affine_off:
            out = self._affine_ratio_sum(q_new, q_old, bound)
            if out is not None:
                return out
        total, count = self._records.map_reduce(
            self._kernel("llr"), _add_pairs, (0.0, 0), args=(q_new, q_old, bound)
        )
        self.released["llr"] += 1
        return float(total), int(count)

    @property
    def loglik_worth_keeping(self) -> bool:
        """Whether keeping per-record log-likelihoods between ratio releases
        (`LoglikMemo`) is expected to pay: the per-record log-likelihood applies a
        transcendental function or a reduction over a record's row per record
        (`pymc_dp.records.graph_facts.costly_per_record_ops`); for arithmetic only
        (a normal likelihood), reading and writing ``n`` kept floats costs more than the
        evaluation it saves (measured: docs/benchmarks.md, section 6). Structural, data-free.
        """
        if self._loglik_costly is None:
            from pymc_dp.records.graph_facts import costly_per_record_ops

            g = self._graphs
            self._loglik_costly = bool(costly_per_record_ops(g.ll_batch, g.batch))
        return self._loglik_costly

    @property
    def keeps_remotely(self) -> bool:
        """Whether the records live elsewhere and the per-record values a release keeps
        stay there (`pymc_dp.records.dask_store.DaskStore.map_reduce_kept`). Structural."""
        return not getattr(self._records, "local", False) and hasattr(
            self._records, "map_reduce_kept"
        )

    @property
    def can_keep(self) -> bool:
        """Whether per-record log-likelihoods can be kept between releases (`LoglikMemo`):
        in this process for in-memory records, on the workers for a remote store that keeps
        them (`keeps_remotely`). Structural, data-free."""
        return bool(getattr(self._records, "local", False)) or self.keeps_remotely

    def loglik_chunks(self, q: np.ndarray) -> list[np.ndarray] | KeptOnWorkers:
        """Per-record (tempered) log-likelihoods at ``q``, one array per chunk, to be kept
        for `clipped_loglik_ratio_sum_kept` (`can_keep`).

        In-memory records: computed now, kept in this process. A remote store
        (`keeps_remotely`): nothing is read now; a `KeptOnWorkers` handle is returned, and
        the workers compute the values within the release that first uses them and keep
        them there. Noise-free values of the data: never publish them; they may only enter
        a release (`LoglikMemo` keeps them for the next ratio release). Not a release itself.
        """
        if self.keeps_remotely:
            return KeptOnWorkers(q)
        if not getattr(self._records, "local", False):
            raise TypeError("per-record log-likelihoods are kept for in-memory records only")
        return self._records.map_reduce(self._c.ll_chunk, _collect, [], args=(q,))

    def _kept_remotely(self, kernel, reduce, init, l_old, q_new, **kw) -> tuple:
        """``map_reduce_kept`` of a remote store: the values ``l_old`` (a `KeptOnWorkers`
        handle) kept on the workers or computed there at its point, ``l_new`` kept there
        under a new handle (at ``q_new``), returned in place of the per-chunk list."""
        if not isinstance(l_old, KeptOnWorkers):
            raise TypeError("the kept log-likelihoods of a remote store are a KeptOnWorkers")
        l_new = KeptOnWorkers(q_new)
        out = self._records.map_reduce_kept(
            kernel, reduce, init, fill=(self._c.ll_chunk, l_old.q), old=l_old.key,
            new=l_new.key, **kw,
        )  # fmt: skip
        return (*out[:-1], l_new)

    def clipped_loglik_ratio_sum_kept(
        self, q_new: np.ndarray, l_old: list[np.ndarray], bound: float
    ) -> tuple[float, int, list[np.ndarray]]:
        """`clipped_loglik_ratio_sum` with the log-likelihoods at the old point given.

        ``l_old`` holds the per-record log-likelihoods at the old point, one array per chunk
        (`loglik_chunks`, or the ``l_new`` of an earlier call); only those at ``q_new`` are
        computed (one log-likelihood evaluation instead of two, `compile_kept_ratio`).
        Returns ``(clipped sum, n_clipped, l_new)``, ``l_new`` per chunk, to be kept (never
        published). One release, counted like `clipped_loglik_ratio_sum`; the sum and the
        count are the same numbers up to rounding (the ratios are formed from the two
        evaluations instead of within one compiled function). Records that `can_keep`: on
        a remote store ``l_old`` and ``l_new`` are `KeptOnWorkers` handles (the values stay
        on the workers, the same numbers).
        """
        if self.keeps_remotely:
            total, count, l_new = self._kept_remotely(
                self._kernel("llr_kept"), _add_kept, (0.0, 0, []), l_old, q_new,
                args=(q_new, bound),
            )  # fmt: skip
            self.released["llr"] += 1
            return float(total), int(count), l_new
        if not getattr(self._records, "local", False):
            raise TypeError("per-record log-likelihoods are kept for in-memory records only")
        total, count, l_new = self._records.map_reduce(
            self._kernel("llr_kept"), _add_kept, (0.0, 0, []), args=(q_new, bound),
            per_chunk=l_old,
        )  # fmt: skip
        self.released["llr"] += 1
        return float(total), int(count), l_new

    @property
    def fusable(self) -> bool:
        """Whether `clipped_grad_and_ratio_sum_kept` is available: records that `can_keep`
        (in memory, or a remote store keeping the values on its workers) and a gradient
        route with a fused pass (`pymc_dp.records.routes.compile_fused_pass`).
        Structural, data-free (compiles the gradient functions if needed)."""
        if not self.can_keep:
            return False
        self._ensure_grad()
        fs = self._c.grad_clipped
        return fs["route"].graph is not None and fs["generic"].graph is not None

    @property
    def fused_pays(self) -> bool:
        """Whether the fused pass (`clipped_grad_and_ratio_sum_kept`) is expected to be
        faster than the two passes it replaces: `fusable`, the per-record log-likelihood is
        costly (`loglik_worth_keeping`: a transcendental function or a row reduction, which
        the gradient shares, e.g. a GLM's ``X beta`` and ``exp``) and the route is not the
        sorted one (a generated loop nest the log-likelihood does not enter). Measured,
        n = 10^5, the fused pass against the two passes: Poisson, StudentT and logistic
        0.50-0.91x on both PyTensor lines; the arithmetic-only likelihoods mixed (banana on
        the blocks route 0.74x on 3.3, 1.36x on 2.38) and the sorted route 1.07-2.13x
        (docs/benchmarks.md, section 6). On a remote store (`keeps_remotely`) the fused
        pass also saves a round trip to the workers (a released sum each), and the pass it
        replaces evaluates the log-likelihoods at both points unless they are kept: it pays
        whatever the likelihood, off the sorted route (docs/benchmarks.md, section 7).
        Structural, data-free."""
        if not self.fusable or self._c.grad_clipped["route"].name == "sorted":
            return False
        return self.keeps_remotely or self.loglik_worth_keeping

    def clipped_grad_and_ratio_sum_kept(
        self, q_new: np.ndarray, grad_bound: float, l_old: list[np.ndarray], llr_bound: float
    ) -> tuple[np.ndarray, int, float, int, list[np.ndarray]]:
        """`clipped_grad_sum` at ``q_new`` and `clipped_loglik_ratio_sum_kept` from ``l_old``
        to ``q_new`` in one pass over the records (one compiled call per chunk).

        The last gradient release of a DP-HMC trajectory is at its end point ``q_new``,
        where its ratio release evaluates the log-likelihoods; with the kept
        log-likelihoods ``l_old`` at the start (``n`` floats, `LoglikMemo`) and the ratio
        bound known by then, both sums come from one pass (DP-HMC paper, Algorithm 1;
        issue 28): `pymc_dp.records.routes.compile_fused_pass`. Returns ``(grad sum,
        n_grad_clipped, ratio sum, n_llr_clipped, l_new)``, ``l_new`` per chunk (kept,
        never published). Two releases, counted as such (``released["grad"]`` and
        ``released["llr"]``); the counts are non-private (0 unless `counts`). Records with
        a fusable route only (`fusable`); on a remote store ``l_old`` and ``l_new`` are
        `KeptOnWorkers` handles (the values stay on the workers: one message to each
        worker for both releases).
        """
        if not self.fusable:
            raise TypeError(
                "the fused gradient and ratio pass needs records that keep per-record "
                "values (in memory, or DaskRecords) and a route with a fused pass"
            )
        route = self._c.grad_clipped["route"]
        kernel = self._kernel("fused")
        init = (np.zeros(self.ndim), 0, 0.0, 0, [])
        if route.prepare is None:  # no data-only arrays: the chunk function gets ``[]``
            kw: dict[str, Any] = {"args": (q_new, grad_bound, llr_bound, [])}
        else:
            kw = {"args": (q_new, grad_bound, llr_bound), "prepare": self._kernel("prepare")}
        if self.keeps_remotely:
            g, k, s, kl, l_new = self._kept_remotely(kernel, _add_fused, init, l_old, q_new, **kw)
        else:
            g, k, s, kl, l_new = self._records.map_reduce(
                kernel, _add_fused, init, per_chunk=l_old, **kw
            )
        self.released["grad"] += 1
        self.released["llr"] += 1
        return g, int(k), float(s), int(kl), l_new

    @property
    def fused_two_point_pays(self) -> bool:
        """Whether DP-HMC's last gradient pass should compute its two-point ratio release
        too (`clipped_grad_and_ratio_sum`): in-memory records, the *blocks* route (the
        banana: its log-likelihood a few arithmetic operations, the route's loop one
        vectorised pass) and a log-likelihood not worth keeping (`loglik_worth_keeping`,
        else `fused_pays` decides). Measured on the banana (n = 10^5): docs/benchmarks.md,
        "Issue 28, the banana, twelfth session". Structural, data-free."""
        if not getattr(self._records, "local", False) or self.loglik_worth_keeping:
            return False
        self._ensure_grad()
        fs = self._c.grad_clipped
        return fs["route"].name == "blocks" and fs["route"].graph is not None

    def clipped_grad_and_ratio_sum(
        self, q_new: np.ndarray, grad_bound: float, q_old: np.ndarray, llr_bound: float
    ) -> tuple[np.ndarray, int, float, int]:
        """`clipped_grad_sum` at ``q_new`` and `clipped_loglik_ratio_sum` from ``q_old`` to
        ``q_new`` in one pass over the records (one compiled call per chunk,
        `pymc_dp.records.routes.compile_fused_two_point`), for in-memory records.

        DP-HMC's last gradient release (at the trajectory's end ``q_new``) and its ratio
        release, whose bound is known by then (DP-HMC paper, Algorithm 1 [DPHMC]; issue
        28), without kept log-likelihoods (compare `clipped_grad_and_ratio_sum_kept`).
        Returns ``(grad sum, n_grad_clipped, ratio sum, n_llr_clipped)``: the same
        functions of the records as the two separate calls, two releases counted as such;
        the counts are non-private (0 unless `counts`).
        """
        if self._affine is not False and not self._affine_off:
            # the affine bypass (`_affine_grad_sum`): no pass over most records, so the two
            # releases are computed apart, each from block sums where it can
            out = self._affine_grad_sum(q_new, grad_bound)
            if out is not None:
                s, kl = self.clipped_loglik_ratio_sum(q_new, q_old, llr_bound)
                return out[0], out[1], s, kl
        c = self.counts
        direct = self._direct_fused
        if (
            direct  # the fused function's Numba function called directly (`_direct_grad`)
            and direct[3] == c
            and _is_vector(q_new, direct[2])
            and _is_vector(q_old, direct[2])
            and self._records.whole() is direct[1]
        ):
            out = _private_call(
                direct[0], q_new, self._bound_array(grad_bound), *direct[1],
                np.array(llr_bound, dtype=_F64), q_old,
            )  # fmt: skip
            if all(map(math.isfinite, out[0].tolist())):
                return self._fused_result(out, fresh=True)
        if not getattr(self._records, "local", False):
            raise TypeError("the two-point fused pass needs in-memory records")
        self._ensure_grad()
        route = self._c.grad_clipped["route"]
        whole = self._records.whole() if route.prepare is None else None
        if whole is not None and route.graph is not None and not self._direct_off:
            # one chunk, no data-only arrays: the fused function called without the
            # layers of `map_reduce` (as in `clipped_grad_sum`); a non-finite gradient
            # sum (the route's masked function needed) takes the path below
            kept = self._fused2
            if kept is None or kept[0] is not route or kept[1] != c:
                f = compile_fused_two_point(route, self._graphs, counts=c)
                kept = self._fused2 = (route, c, f)
            f = kept[2]
            with np.errstate(all="ignore"):  # no data-dependent floating-point warning
                out = _private_call(f, q_new, grad_bound, *whole, llr_bound, q_old)
            out = (np.asarray(out[0], dtype=float), *out[1:])
            a = np.asarray(q_new)
            if a.dtype == _F64 and a.ndim == 1 and (direct is None or (direct and direct[3] != c)):
                args = [a, np.array(grad_bound, dtype=_F64), *whole, np.array(0.0), a]
                jit = direct_jit(f._f, args)
                self._direct_fused = (jit, whole, a.shape, c) if jit is not None else False
            if all(map(math.isfinite, out[0].ravel().tolist())):
                return self._fused_result(out)
        kernel = self._kernel("fused2")
        init = (np.zeros(self.ndim), 0, 0.0, 0)
        if route.prepare is None:  # no data-only arrays: the chunk function gets ``[]``
            kw: dict[str, Any] = {"args": (q_new, grad_bound, llr_bound, q_old, [])}
        else:
            kw = {
                "args": (q_new, grad_bound, llr_bound, q_old),
                "prepare": self._kernel("prepare"),
            }
        g, k, s, kl = self._records.map_reduce(kernel, _add_fused4, init, **kw)
        self.released["grad"] += 1
        self.released["llr"] += 1
        return g, int(k), float(s), int(kl)

    def _fused_result(self, out, fresh: bool = False) -> tuple[np.ndarray, int, float, int]:
        """``(g, k, s, kl)`` from the outputs of a whole-records two-point fused call
        (``(g, k, s, kl)``, or ``(g, s)`` without counts); two releases counted. The sum
        is copied unless ``fresh`` (a Numba function's own output)."""
        self.released["grad"] += 1
        self.released["llr"] += 1
        g = out[0] if fresh else out[0] + 0.0
        if len(out) == 2:
            return g, 0, float(out[1]), 0
        c = self.counts
        return g, int(out[1]) if c else 0, float(out[2]), int(out[3]) if c else 0

    def shared_clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float, noise_std: float
    ) -> float:
        """The data-sharing release: the sum of every owner's noisy clipped ratio sum.

        Yildirim & Ermis (2019), Sec. 3.2.2, Algorithm 2, eq. (6): owner ``k`` releases
        ``sum_{i in owner k} clip(r_i, -b, b) + N(0, noise_std^2)``, its noise drawn where
        its records live; the driver adds the ``K`` noisy contributions (in owner order).
        Needs records with data owners (`pymc_dp.distributed.DaskRecords` with ``owners``).
        """
        parts = self._records.owner_sums(
            self._kernel("llr"), _add_pairs, (0.0, 0), noise_std, args=(q_new, q_old, bound)
        )
        self.released["llr"] += 1
        total = 0.0
        for p in parts:
            total += float(p)
        return total

    def shared_clipped_grad_sum(self, q: np.ndarray, bound: float, noise_std: float) -> np.ndarray:
        """The data-sharing gradient release: the sum of every owner's noisy clipped sum.

        Owner ``k`` releases ``sum_{i in owner k} clip_b(grad l_i(q)) + N(0, noise_std^2 I)``,
        its noise drawn where its records live (Yildirim & Ermis 2019, Algorithm 2, applied
        to the gradient releases of DP-HMC); the driver adds the ``K`` noisy contributions in
        owner order. Needs records with data owners.
        """
        self._ensure_grad()
        route = self._c.grad_clipped["route"]
        kernel = self._kernel("grad")
        init = (np.zeros(self.ndim), 0)
        if route.prepare is None:
            kw: dict[str, Any] = {"args": (q, bound, [])}
        else:
            kw = {"args": (q, bound), "prepare": self._kernel("prepare")}
        parts = self._records.owner_sums(kernel, _add_pairs, init, noise_std, **kw)
        self.released["grad"] += 1
        total = np.zeros(self.ndim)
        for p in parts:
            total = total + np.asarray(p, dtype=float)
        return total

    def _ensure_grad(self) -> None:
        if self._c.grad_chunk is None:
            self._c.grad_chunk, self._c.grad_clipped = compile_gradients(
                self._graphs, self._compile_kwargs
            )

    def _bound_array(self, bound: float) -> np.ndarray:
        """``bound`` as the 0-d float64 array a compiled function takes (the last one kept)."""
        last = self._last_bound
        if last is None or last[0] != bound:
            last = self._last_bound = (bound, np.array(bound, dtype=_F64))
        return last[1]

    def _fast_fn(self, route):
        """``route.fast``, or with `counts` off the same function without the count of
        clipped records (compiled once, on first use, from `ClipRoute.graph`: its sum
        output alone, so the compiled loop does not count; returns ``[sum]``). The count
        is a non-private diagnostic, 0 whenever `counts` is off (issue 28: a few
        instructions a record in the banana's loop)."""
        if self.counts or route.graph is None or self._direct_off:
            return route.fast
        kept = self._nocount
        if kept is None or kept[0] is not route:
            ins, outs, ck, kw = route.graph
            kept = self._nocount = (route, LazyFunction(ins, [outs[0]], ck, **kw))
        return kept[1]

    def _affine_state(self, whole: tuple | None = None, read: bool = True):
        """``(AffineBlocks, gradient values or None, ratio values or None, route)`` for
        the records as they are (built on first use), or None where the affine bypass
        does not apply (`pymc_dp.records.affine`): in-memory records in one chunk, and a
        per-record gradient (with a route needing no data-only arrays) or log-likelihood
        ratio affine in the record's values (structural, data-free; decided before the
        records are read). ``whole``: the records' arrays if already read; with ``read``
        False, the structural part only (the blocks not built, the records not read)."""
        if self._affine is False or self._affine_off:
            return None
        if self._affine is None:
            self._ensure_grad()
            route = self._c.grad_clipped["route"]
            grad = ratio = None
            if getattr(self._records, "local", False) and hasattr(self._records, "whole"):
                if route.prepare is None and affine_in_data(self._graphs):
                    inputs, outputs, ck, kw = self._c.grad_chunk._args
                    f = LazyFunction(inputs, [outputs], ck, **{**kw, "kind": "route"})
                    grad = _StandIn(f, 1)
                if ratio_affine_in_data(self._graphs):
                    ratio = _StandIn(ratio_values_function(self._graphs, self._compile_kwargs), 2)
            if grad is None and ratio is None:
                self._affine = False
                return None
            self._affine = (None, grad, ratio, route)
        if not read:
            return self._affine
        if whole is None:
            whole = self._records.whole()
        if whole is None:
            return None
        state = self._affine
        if state[0] is None or state[0].chunk is not whole:
            blocks = _private_call(AffineBlocks, whole)
            state = self._affine = (blocks, *state[1:])
        return state

    def _affine_grad_sum(
        self, q: np.ndarray, bound: float, whole: tuple | None = None
    ) -> tuple[np.ndarray, int] | None:
        """`clipped_grad_sum` through the affine bypass (`pymc_dp.records.affine`), or None
        where it does not apply or no block lies inside the clip region at ``q``.

        The records are sorted once into blocks (`AffineBlocks`); the blocks whose boxes
        lie inside the clip region at ``q`` give their exact unclipped sum from their
        means, the route's per-record loop runs on the records of the others. The same
        clipped sum as the route (to rounding) and the same count.
        """
        state = self._affine_state(whole)
        if state is None or state[1] is None:
            return None
        blocks, grad, _, route = state
        s, idx = _private_call(
            blocks.split,
            lambda *recs: grad((q,), recs),
            affine_limit_sq(bound, route.weight_margin),
        )
        if s is None:
            return None
        if idx is None:
            self.released["grad"] += 1
            return s, 0
        sub = _private_call(_take_rows, blocks.sorted, idx)
        g = self._affine_rest(route, q, bound, sub)
        if g is None:
            with np.errstate(all="ignore"):  # no data-dependent floating-point warning
                g, k = _private_call(route, q, bound, [], sub)
        else:
            g, k = g
        self.released["grad"] += 1
        return s + g, int(k) if self.counts else 0

    def _affine_rest(self, route, q, bound, sub) -> tuple[np.ndarray, int] | None:
        """The route's clipped sum of the records ``sub`` (those of the blocks not inside)
        by its (count-free where `counts` is off) function's Numba function called
        directly once known (`pymc_dp.records.backend.direct_jit`); None when that sum
        is not finite (the caller takes `ClipRoute`'s masked path)."""
        fast = self._fast_fn(route)
        kept = self._affine_fast
        if kept is None or kept[0] is not fast:
            kept = self._affine_fast = (fast, None)
        jit = kept[1]
        if jit and _is_vector(q, jit[1]):
            out = _private_call(jit[0], q, self._bound_array(bound), *sub)
        else:
            with np.errstate(all="ignore"):
                out = _private_call(fast, q, bound, *sub)
            a = np.asarray(q)
            if jit is None and a.dtype == _F64 and a.ndim == 1 and not self._direct_off:
                f = fast._f if isinstance(fast, LazyFunction) else fast
                j = direct_jit(f, [a, np.array(bound, dtype=_F64), *sub]) if f is not None else None
                self._affine_fast = (fast, (j, a.shape) if j is not None else False)
        g = np.asarray(out[0], dtype=float)
        if not all(map(math.isfinite, g.ravel().tolist())):
            return None
        return g, int(out[1]) if len(out) > 1 else 0

    def _affine_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float
    ) -> tuple[float, int] | None:
        """`clipped_loglik_ratio_sum` through the affine bypass (as `_affine_grad_sum`,
        the ratios ``l_i(q_new) - l_i(q_old)`` affine in the records: the banana), or
        None. A block inside ``|r| <= bound`` at every corner is summed from its mean;
        the ratio function runs on the records of the others."""
        state = self._affine_state()
        if state is None or state[2] is None:
            return None
        blocks, _, ratio, _ = state
        s, idx = _private_call(
            blocks.split, lambda *recs: ratio((q_new, q_old), recs), affine_limit_sq(bound)
        )
        if s is None:
            return None
        if idx is None:
            self.released["llr"] += 1
            return float(s[0]), 0
        sub = _private_call(_take_rows, blocks.sorted, idx)
        with np.errstate(all="ignore"):
            r, k = _private_call(self._c.llr_clipped, q_new, q_old, bound, *sub)
        self.released["llr"] += 1
        return float(s[0]) + float(r), int(k) if self.counts else 0

    def _direct_grad(self, fast, q, bound, whole) -> None:
        """Set `_direct` after a call of ``fast`` (`_fast_fn`) on the whole records: its
        Numba function (`pymc_dp.records.backend.direct_jit`) with the records' arrays,
        for the next calls of `clipped_grad_sum` with a parameter vector of the same type
        and the same setting of `counts`. The Numba function (PyTensor's Numba linker)
        takes the same arguments and returns the same arrays as the compiled function; it
        raises no NumPy floating-point warning."""
        if (self._direct is not None and self._direct[3] == self.counts) or self._direct_off:
            return
        args = [np.asarray(q), np.array(bound, dtype=_F64), *whole]
        if not (isinstance(args[0], np.ndarray) and args[0].dtype == _F64 and args[0].ndim == 1):
            return
        f = fast._f if isinstance(fast, LazyFunction) else fast
        jit = direct_jit(f, args) if f is not None else None
        self._direct = (jit, whole, args[0].shape, self.counts) if jit is not None else None

    def __getstate__(self) -> dict:
        # the ratio function is compiled on first use (`compile_likelihood`): a pickled
        # copy (a chain in another process) gets it compiled, as before issue 26
        _compiled(self._c.llr_clipped)
        # a compiled function's Numba dispatcher is not shipped: set again on first use
        state = dict(self.__dict__)
        for k in (
            "_direct",
            "_last_bound",
            "_direct_prior",
            "_direct_fused",
            "_nocount",
            "_fused2",
            "_affine",
            "_affine_fast",
        ):
            state[k] = None
        return state

    def per_record_grad(self, q: np.ndarray) -> np.ndarray:
        """Per-record gradients ``T * grad l_i(q)``, shape ``(n, d)``."""
        self._ensure_grad()
        with np.errstate(all="ignore"):
            return np.concatenate([self._c.grad_chunk(q, *c) for c in self._chunks()], axis=0)

    def clipped_grad_sum(self, q: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
        """``sum_i clip_b(grad l_i(q))`` with each record's gradient clipped to L2 norm ``b``.

        Returns the sum (shape ``(d,)``) and the number of clipped records (non-private: see
        `clipped_loglik_ratio_sum`). A record whose gradient is not finite contributes
        0 (and counts as clipped). The route (`gradient_route`: GLM, indexed or
        generic; see `pymc_dp.records.routes.compile_gradients`) is chosen on
        data-free stand-in records; the data-only per-chunk arrays a route needs (the GLM
        route's row norms of the design matrix) are computed on first use and cached.
        """
        known = None  # the records' arrays, read once per sum (`InMemoryRecords.whole`)
        if self._affine is not False and not self._affine_off:
            state = self._affine_state(read=False)  # structural: the records not read
            if state is not None and state[1] is not None:
                known = self._records.whole()
                out = self._affine_grad_sum(q, bound, known)
                if out is not None:
                    return out
        direct = self._direct
        if (
            direct is not None
            and direct[3] == self.counts
            and _is_vector(q, direct[2])
            and (known if known is not None else self._records.whole()) is direct[1]
        ):  # the records still in one chunk
            # the route's Numba function called directly (`_direct_grad`): the same call,
            # arguments and bits as below, without PyTensor's call layers (issue 28)
            g, *k = _private_call(direct[0], q, self._bound_array(bound), *direct[1])
            if all(map(math.isfinite, g.tolist())):
                self.released["grad"] += 1
                return g, int(k[0]) if self.counts else 0  # a fresh array (Numba's output)
        self._ensure_grad()
        route = self._c.grad_clipped["route"]
        whole = getattr(self._records, "whole", None)  # a remote store has none
        if known is not None:
            whole = known
        else:
            whole = whole() if whole is not None and route.prepare is None else None
        if whole is not None:
            # In memory, one chunk, no data-only arrays: the route's compiled function
            # called directly, without the per-call layers of `map_reduce`,
            # `_GradSumChunk` and `ClipRoute` (together ~1/4 of a DP-HMC iteration on
            # small data; issue 28). The same numbers as below; a non-finite sum (the
            # route's masked function needed) takes the path below.
            fast = self._fast_fn(route)
            with np.errstate(all="ignore"):  # no data-dependent floating-point warning
                g, *k = _private_call(fast, q, bound, *whole)
            k = k[0] if k else 0
            g = np.asarray(g, dtype=float)
            self._direct_grad(fast, q, bound, whole)
            if all(map(math.isfinite, g.ravel().tolist())):
                self.released["grad"] += 1
                return g + 0.0, int(k) if self.counts else 0  # a fresh array (as below)
        kernel = self._kernel("grad")
        init = (np.zeros(self.ndim), 0)
        if route.prepare is None:  # no data-only arrays: the chunk function gets ``[]``
            total, count = self._records.map_reduce(kernel, _add_pairs, init, args=(q, bound, []))
        else:
            total, count = self._records.map_reduce(
                kernel, _add_pairs, init, args=(q, bound), prepare=self._kernel("prepare")
            )
        self.released["grad"] += 1
        return total, int(count)

    def clipped_residual_ratio_sum(
        self,
        q_new: np.ndarray,
        q_old: np.ndarray,
        bound: float,
        anchor: np.ndarray,
        grad_bound: float,
        transform: np.ndarray | None = None,
        direction: np.ndarray | None = None,
    ) -> tuple[float, int]:
        """Clipped sum of the ratios' residuals after a first-order control variate.

        ``sum_i clip(r_i - c_i . dq, +-bound)`` with ``r_i = T (l_i(q_new) - l_i(q_old))``,
        ``c_i = clip_{grad_bound}(M T grad l_i(anchor))`` and ``dq = q_new - q_old``. Since
        ``sum_i r_i = sum_i (r_i - c_i . dq) + (sum_i c_i) . dq`` for any ``c_i`` and any
        ``dq``, a test that adds a *released* ``sum_i c_i`` (a DP output) back recovers the
        full ratio; the
        residuals are second order in the step and far smaller than the ``r_i``, so the same
        replace-one sensitivity ``2 bound`` buys a much smaller bound. The ``c_i`` are computed
        once per anchor where each chunk lives and kept there (never returned, never
        published); every call returns the chunks' clipped residual sums, added in chunk
        order. Returns the sum and the number of clipped records (non-private, as in
        `clipped_loglik_ratio_sum`; 0 unless `counts`).

        ``transform`` (``M``, public, ``(d, d)``) and ``direction`` (``dq``, public) linearise
        in other coordinates ``y = T(q)``: with ``M = J(anchor)^{-T}`` (``J`` the Jacobian of
        ``T``) the ``c_i`` are the per-record gradients in ``y`` and ``dq = T(q_new) -
        T(q_old)`` the step in ``y`` (`pymc_dp.auto.recentre`).
        """
        m = None if transform is None else np.asarray(transform, dtype=float)
        key = (
            tuple(np.round(np.asarray(anchor, dtype=float), 15)),
            float(grad_bound),
            None if m is None else tuple(np.round(m.ravel(), 15)),
        )
        cache = self.__dict__.setdefault("_anchor_grads", {})
        if key not in cache:
            self._ensure_grad()
            for old in cache.values():  # one anchor at a time: free the old coefficients
                self._records.forget(old)
            cache.clear()
            cache[key] = _AnchorGrads(
                self._c.grad_chunk, np.array(anchor, dtype=float), float(grad_bound), m
            )
        if direction is None:
            dq = np.asarray(q_new, dtype=float) - np.asarray(q_old, dtype=float)
        else:
            dq = np.asarray(direction, dtype=float)
        total, count = self._records.map_reduce(
            self._kernel("residual"),
            _add_pairs,
            (0.0, 0),
            args=(q_new, q_old, bound, dq),
            prepare=cache[key],
        )
        self.released["llr"] += 1
        return float(total), int(count)

    def clipped_grad_moments(
        self,
        q: np.ndarray,
        bound: float,
        transform: np.ndarray | None = None,
        outer_bound: float | None = None,
        centre: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(sum_i c_i, sum_i e_i e_i^T)`` with ``c_i = clip_b(M grad l_i(q))`` and
        ``e_i = clip_{b'}(c_i - centre)``, ``b'`` = ``outer_bound`` (default ``b``),
        ``centre`` a public vector (default 0: the uncentred outer products).

        The sufficient statistics of the private Fisher scoring of the automatic warm start
        (`pymc_dp.kernels.warmstart.private_laplace`). ``M`` (``transform``, public, default
        the identity) maps the gradients to other coordinates before clipping: the
        whitening of the warm start, and with ``M = J^{-T}`` the gradients in ``y = T(q)``
        (`pymc_dp.auto.recentre`). A record whose gradient is not finite contributes 0.
        Replace-one sensitivities: ``2 b`` for the sum, ``sqrt(2) b'^2`` (in Frobenius norm)
        for the outer-product sum, whatever ``M`` and ``centre`` (each ``e_i`` has norm at
        most ``b'``). Chunked: memory ``chunk_size x d``; each
        chunk returns its two sums (where it lives), added in chunk order.
        """
        self._ensure_grad()
        m = None if transform is None else np.asarray(transform, dtype=float)
        c = None if centre is None else np.asarray(centre, dtype=float).reshape(self.ndim)
        init = (np.zeros(self.ndim), np.zeros((self.ndim, self.ndim)))
        s1, s2 = self._records.map_reduce(
            self._kernel("moments"), _add_moments, init, args=(q, bound, m, outer_bound, c)
        )
        self.released["grad"] += 1
        return s1, s2

    def clipped_hessian_sum(
        self,
        points: np.ndarray,
        transforms: np.ndarray,
        step: float,
        bound: float,
    ) -> np.ndarray:
        """``sum_i clip_B(H_i)``: each record's curvature, clipped to Frobenius norm ``B``.

        ``H_i`` is minus the Hessian of record ``i``'s log-likelihood in the coordinates
        ``w`` of the caller, by central differences of the record's own gradient: column
        ``j`` is ``-(M_j+ grad l_i(q_j+) - M_j- grad l_i(q_j-)) / (2 h)``, ``q_j+-`` the
        points ``w +- h e_j`` mapped to the model's coordinates (``points[2 j]``,
        ``points[2 j + 1]``, public) and ``M_j+-`` (``transforms``, public) the maps of the
        model's gradients to ``w``'s there; symmetrised, then clipped. A record whose
        matrix is not finite contributes 0. Each record's matrix depends on that record
        alone, so under replace-one neighbours the sum moves by at most ``2 B`` in
        Frobenius norm (`pymc_dp.kernels.warmstart.HESSIAN_SENSITIVITY`), whatever the
        points, maps and step. Chunked as `clipped_grad_moments`; ``2 k`` gradient
        evaluations per record for ``k`` coordinates.
        """
        self._ensure_grad()
        pts = [np.asarray(p, dtype=float) for p in points]
        maps = [np.asarray(t, dtype=float) for t in transforms]
        k = len(pts) // 2
        out = self._records.map_reduce(
            self._kernel("hessians"),
            _add_counts,
            np.zeros((k, k)),
            args=(pts, maps, float(step), float(bound)),
        )
        self.released["grad"] += 1
        return out

    def grad_norm_counts(
        self, q: np.ndarray, grid: np.ndarray, transform: np.ndarray | None = None
    ) -> np.ndarray:
        """Records whose gradient norm ``||M grad l_i(q)||`` exceeds each bound of ``grid``.

        Exact counts (data, never published as they are): the input of a noisy histogram
        (`pymc_dp.kernels.warmstart.noisy_histogram_quantile`). A record whose gradient is
        not finite counts above every bound (it would be clipped, to 0). One pass over the
        records (one round trip on a cluster), whatever the grid's length; each chunk
        returns its counts.
        """
        self._ensure_grad()
        m = None if transform is None else np.asarray(transform, dtype=float)
        grid = np.asarray(grid, dtype=float)
        return self._records.map_reduce(
            self._kernel("norm_counts"),
            _add_counts,
            np.zeros(grid.size, dtype=np.int64),
            args=(q, grid, m),
        )

    def clipped_grad_sum_subset(
        self, q: np.ndarray, bound: float, idx: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """``sum_{i in idx} clip_b(grad l_i(q))`` reading only the rows ``idx`` of the data.

        The minibatch gradient of DP-SGLD / DP-SGNHT. Returns the sum (shape ``(d,)``) and the
        number of clipped records (non-private, as in `clipped_grad_sum`). The store reads,
        in every chunk holding some of the records ``idx`` (repeats allowed), only those rows
        (through the chosen route, its data-only arrays computed for the rows read), and
        returns their sum; the chunk sums are added in chunk order. An empty subsample reads
        nothing and gives 0.
        """
        total = np.zeros(self.ndim)
        idx = np.asarray(idx)
        if idx.size == 0:
            return total, 0
        self._ensure_grad()
        total, count = self._records.map_reduce_rows(
            self._kernel("grad_rows"), _add_pairs, (total, 0), idx, args=(q, bound)
        )
        self.released["grad"] += 1
        return total, int(count)

    @property
    def gradient_route(self) -> str:
        """Route of `clipped_grad_sum`: ``"GLM fast"``, ``"sorted"``, ``"indexed"``,
        ``"blocks"``, ``"generic"`` or
        ``"not compiled"`` (the gradient functions are compiled on first use). Structural,
        not data-dependent: a faster route is chosen on data-free stand-in records."""
        fs = self._c.grad_clipped
        if fs is None:
            return "not compiled"
        return fs["route"].name

    def check_start(self, q: np.ndarray) -> None:
        """Refuse a start point where some record's log-likelihood is NaN or -inf.

        Reads the data once (one bit per chunk); the error names no record and no value.
        """
        if not self._records.map_reduce(self._kernel("start"), _all, True, args=(q,)):
            raise ValueError(
                "the log-likelihood is NaN or infinite for at least one record at the start "
                "point; choose initvals inside the support of every record's likelihood "
                "(or check the data against the model)"
            )


class KeptOnWorkers:
    """Per-record log-likelihoods kept where the records live (a remote store), by name.

    What `RecordFunctions.loglik_chunks` and the kept releases return for a remote store
    (`RecordFunctions.keeps_remotely`) in place of the per-chunk arrays: a fresh ``key``
    under which the workers keep the values, and the point ``q`` they are the
    log-likelihoods at. A worker that does not keep the values under ``key`` (its first
    release, or a new actor after a lost worker) computes them at ``q`` within the release
    (`pymc_dp.records.dask_store.PartitionActor.kept`): the same numbers. No record value
    is held on the driver.
    """

    __slots__ = ("key", "q")

    def __init__(self, q: np.ndarray) -> None:
        self.key = uuid.uuid4().hex
        self.q = np.array(q, copy=True)


class GradSumMemo:
    r"""The noise-free clipped gradient sums at the two ends of the last trajectory, for reuse.

    A drop-in for `RecordFunctions.clipped_grad_sum` (``memo(q, bound) -> (sum, count)``)
    used by DP-HMC (`pymc_dp.step_methods.DPHMC`). Each DP-HMC iteration evaluates the
    clipped sum ``g(q) = sum_i clip_b(grad l_i(q))`` at its start ``q`` and at its end
    ``q'`` (DP-HMC paper, Algorithm 1 [DPHMC]); the next iteration starts at ``q'``
    (accepted) or ``q`` (rejected), where ``g`` is already known. ``g`` is a deterministic
    function of the point, of the other variables' values, of the bound and of the records,
    so computing it again gives the same value: the memo returns the kept value instead and
    the caller adds *fresh* noise to it, as to any other sum. The release is the same
    Gaussian mechanism with the same output distribution, and it is counted as one release
    (``released["grad"]``) like a computed one, so the accounting is unchanged: ``L + 1``
    gradient releases per iteration, ``L`` of them computed. Only the noise-free sum is
    reused, never a noisy one (reusing a noisy gradient would make the next iteration depend
    on this one's noise; paper, remark after Theorem 3.5).

    A kept value is used only when everything it depends on is exactly the same: the point
    (same dtype, shape and bits), the bound, the values of the free variables the step does
    not sample (another step of a ``CompoundStep`` may have changed them), the store and
    its chunking (the order of the additions), and whether clipped counts are kept.
    Anything else (a new chain, an initial point, a state set from outside) is computed.
    Kept values are noise-free sums of the data: they never leave this object except into
    a release that adds noise.

    Parameters
    ----------
    fns : RecordFunctions
        The functions whose ``clipped_grad_sum`` is memoised.
    others : callable, optional
        ``others()`` returns the current values of the free variables the step does not
        sample (parameters, never data), part of what a kept sum must match; ``None``: the
        step samples every free variable.
    """

    def __init__(self, fns: RecordFunctions, others: Any = None) -> None:
        self._fns = fns
        self._others = others
        self._kept: list[tuple[tuple, tuple[np.ndarray, int]]] = []
        #: the trajectory's sums: ``(context or None, (sum, count), None or (q, bound))``
        self._seen: list[tuple] = []
        #: Sums returned from the memo (for tests and benchmarks; data-free).
        self.reused = 0

    def _context(self, q: np.ndarray, bound: float) -> tuple:
        """Everything the sum depends on besides the records, as exact bits."""
        fns = self._fns
        shared = tuple(_bits(v) for v in self._others()) if self._others is not None else ()
        store = fns.records
        return (
            _bits(q),
            float(bound).hex(),
            shared,
            id(store),
            getattr(store, "chunk_size", None),
            bool(fns.counts),
        )

    def __call__(self, q: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
        """``(sum_i clip_b(grad l_i(q)), n_clipped)``: kept when the context is identical,
        computed otherwise; counted as one release either way (the caller adds the noise).
        Only the first sum of a trajectory (at its start) is looked up; the context of a
        later one is formed only if it is kept (the last, at `end_trajectory`: nothing it
        depends on changes within a trajectory), from a copy of its point."""
        if self._seen:
            g, k = self._fns.clipped_grad_sum(q, bound)
            value = (np.array(g, dtype=float, copy=True), int(k))
            self._seen.append((None, value, (np.array(q, copy=True), bound)))
            return np.asarray(g, dtype=float), value[1]
        key = self._context(q, bound)
        for entry in self._kept:
            if entry[0] == key:
                self._fns.released["grad"] += 1
                self.reused += 1
                self._seen.append((*entry, None))
                g, k = entry[1]
                return g.copy(), k
        g, k = self._fns.clipped_grad_sum(q, bound)
        value = (np.array(g, dtype=float, copy=True), int(k))
        self._seen.append((key, value, None))
        return np.asarray(g, dtype=float), value[1]

    def record(self, q: np.ndarray, bound: float, g: np.ndarray, k: int) -> None:
        """Note a sum of the trajectory computed elsewhere (`FusedLastPass`), as if it had
        been computed here: the next trajectory may start from it."""
        entry = (self._context(q, bound), (np.array(g, dtype=float, copy=True), int(k)), None)
        self._seen.append(entry)

    def begin_trajectory(self) -> None:
        """Start collecting the sums of a trajectory (drops a partial one)."""
        self._seen = []

    def _keyed(self, entry: tuple) -> tuple:
        """``(context, (sum, count))`` of a collected sum (its context formed now if late)."""
        key, value, late = entry
        return (self._context(*late) if key is None else key), value

    def end_trajectory(self) -> None:
        """Keep the first and the last sum of the trajectory (its start and its end point)."""
        seen = self._seen
        self._kept = [self._keyed(seen[0]), self._keyed(seen[-1])] if seen else []
        self._seen = []

    def clear(self) -> None:
        """Forget every kept sum (a new chain)."""
        self._kept, self._seen = [], []

    def __getstate__(self) -> dict:
        # a pickled step carries no noise-free sum: the copy computes its first one again
        return {**self.__dict__, "_kept": [], "_seen": []}


class LoglikMemo:
    r"""The per-record log-likelihoods at the current point of DP-HMC, kept for the next
    ratio release.

    A drop-in for `RecordFunctions.clipped_loglik_ratio_sum` (``memo(q_new, q_old, b) ->
    (sum, count)``) used by DP-HMC (`pymc_dp.step_methods.DPHMC`). The penalty test of
    each iteration releases ``sum_i clip(l_i(q') - l_i(q), +-b) + xi`` (DP-HMC paper,
    Algorithm 1 [DPHMC]); the next iteration starts at ``q'`` (accepted) or ``q``
    (rejected), whose per-record log-likelihoods were computed by this release. They are
    a deterministic function of the point, of the other variables' values and of the
    records, so the memo keeps them (``n`` floats, one array per chunk) and the next
    release computes the log-likelihoods at its proposal only: one per-record
    log-likelihood evaluation per iteration instead of two
    (`RecordFunctions.clipped_loglik_ratio_sum_kept`). The release is the same Gaussian
    mechanism on the same clipped sum (up to rounding: the ratios are formed from two
    evaluations instead of within one compiled function), counted as one release
    (``released["llr"]``), so the accounting is unchanged.

    A kept array is used only when everything it depends on is exactly the same: the point
    (same dtype, shape and bits), the values of the free variables the step does not sample,
    the store and its chunking. Otherwise the log-likelihoods at the old point are computed
    first (within the same release). Kept values are noise-free values of the data: they
    never leave this object except into a release that adds noise, and they are never
    pickled. Records that `RecordFunctions.can_keep`: for a remote store
    (`pymc_dp.distributed.DaskRecords`) the memo holds `KeptOnWorkers` handles and the
    values stay on the workers (the actors keep those at the two points of the last release).

    Parameters
    ----------
    fns : RecordFunctions
        The functions whose ratio release is served.
    others : callable, optional
        ``others()`` returns the current values of the free variables the step does not
        sample; ``None``: the step samples every free variable.
    """

    def __init__(self, fns: RecordFunctions, others: Any = None) -> None:
        self._fns = fns
        self._others = others
        self._kept: list[tuple[tuple, list[np.ndarray]]] = []
        #: Ratio releases that used kept log-likelihoods (for tests and benchmarks).
        self.reused = 0

    def _context(self, q: np.ndarray) -> tuple:
        """Everything the log-likelihoods depend on besides the records, as exact bits."""
        shared = tuple(_bits(v) for v in self._others()) if self._others is not None else ()
        store = self._fns.records
        return _bits(q), shared, id(store), getattr(store, "chunk_size", None)

    def _lookup(self, key: tuple) -> list[np.ndarray] | None:
        for k, values in self._kept:
            if k == key:
                return values
        return None

    def old(self, q_old: np.ndarray) -> tuple[tuple, list[np.ndarray]]:
        """``(key, l_old)``: the kept log-likelihoods at ``q_old``, computed if not kept."""
        key_old = self._context(q_old)
        l_old = self._lookup(key_old)
        if l_old is None:
            l_old = self._fns.loglik_chunks(q_old)
        else:
            self.reused += 1
        return key_old, l_old

    def store(self, key_old: tuple, l_old: list, q_new: np.ndarray, l_new: list) -> None:
        """Keep the log-likelihoods at both points of a ratio release."""
        self._kept = [(key_old, l_old), (self._context(q_new), l_new)]

    def __call__(self, q_new: np.ndarray, q_old: np.ndarray, bound: float) -> tuple[float, int]:
        """``(sum_i clip(l_i(q_new) - l_i(q_old), +-b), n_clipped)``, one release."""
        key_old, l_old = self.old(q_old)
        total, count, l_new = self._fns.clipped_loglik_ratio_sum_kept(q_new, l_old, bound)
        self.store(key_old, l_old, q_new, l_new)
        return total, count

    def keep(self, q: np.ndarray) -> None:
        """Keep only the log-likelihoods at ``q`` (the chain's next state), if known."""
        key = self._context(q)
        self._kept = [e for e in self._kept if e[0] == key][:1]

    def clear(self) -> None:
        """Forget every kept value (a new chain)."""
        self._kept = []

    def __getstate__(self) -> dict:
        # a pickled step carries no noise-free value: the copy computes them again
        return {**self.__dict__, "_kept": []}


class FusedLastPass:
    r"""The last gradient release of a DP-HMC trajectory and its ratio release, one pass.

    ``fused(q_new, b_g, q_old, b_l) -> (g, k, llr, k_llr)``, the ``clipped_grad_and_ratio``
    callable of `pymc_dp.kernels.hmc.dphmc_transition`: the noise-free clipped gradient
    sum ``sum_i clip_{b_g}(grad l_i(q_new))`` and the noise-free clipped ratio sum
    ``sum_i clip(l_i(q_new) - l_i(q_old), +-b_l)`` with their (non-private) counts,
    computed in one pass over the records
    (`RecordFunctions.clipped_grad_and_ratio_sum_kept`) from the per-record
    log-likelihoods kept at ``q_old`` (`LoglikMemo`; computed first if not kept, e.g. at
    the start of a chain). The ratio bound ``b_l = b ||q_new - q_old||`` is known when the
    last gradient of the trajectory (at its end ``q_new``) is evaluated (DP-HMC paper,
    Algorithm 1 [DPHMC]; issue 28), so the ratio release needs no second pass. The kernel
    adds the noise of each release as before (same mechanisms, same noise draws in the same
    order, the same accounting: each sum counted as one release). The log-likelihoods at
    ``q_new`` are kept in ``ll_memo``; the gradient sum is noted in ``grad_memo`` (when
    given) as the trajectory's last sum, so that the next trajectory may start from it.

    Parameters
    ----------
    fns : RecordFunctions
        Records with a fusable route (`RecordFunctions.fusable`): in memory, or on a Dask
        cluster (the log-likelihoods kept on the workers; one message to each worker for
        the two releases).
    ll_memo : LoglikMemo
        Keeps the log-likelihoods at the current point.
    grad_memo : GradSumMemo, optional
        Keeps the gradient sums at the ends of the trajectory.
    """

    def __init__(
        self, fns: RecordFunctions, ll_memo: LoglikMemo, grad_memo: GradSumMemo | None = None
    ) -> None:
        self._fns = fns
        self._ll = ll_memo
        self._grad = grad_memo
        #: Fused passes run (for tests and benchmarks; data-free).
        self.calls = 0

    def __call__(
        self, q_new: np.ndarray, grad_bound: float, q_old: np.ndarray, llr_bound: float
    ) -> tuple[np.ndarray, int, float, int]:
        key_old, l_old = self._ll.old(q_old)
        g, k, s, kl, l_new = self._fns.clipped_grad_and_ratio_sum_kept(
            q_new, grad_bound, l_old, llr_bound
        )
        self._ll.store(key_old, l_old, q_new, l_new)
        if self._grad is not None:
            self._grad.record(q_new, grad_bound, g, k)
        self.calls += 1
        return np.array(g, dtype=float, copy=True), k, s, kl


class FusedTwoPointPass:
    r"""The last gradient release of a DP-HMC trajectory and its ratio release, one pass,
    the log-likelihoods evaluated at both points (none kept).

    ``fused(q_new, b_g, q_old, b_l) -> (g, k, llr, k_llr)``, the
    ``clipped_grad_and_ratio_sum`` callable of `pymc_dp.kernels.hmc.dphmc_transition`,
    from `RecordFunctions.clipped_grad_and_ratio_sum` (in-memory records): `FusedLastPass`
    for a log-likelihood too cheap to keep (`RecordFunctions.fused_two_point_pays`). The
    same releases, noise, draws and accounting as the two passes it replaces; the gradient
    sum is noted in ``grad_memo`` (when given) as the trajectory's last sum.

    Parameters
    ----------
    fns : RecordFunctions
    grad_memo : GradSumMemo, optional
    """

    def __init__(self, fns: RecordFunctions, grad_memo: GradSumMemo | None = None) -> None:
        self._fns = fns
        self._grad = grad_memo
        #: Fused passes run (for tests and benchmarks; data-free).
        self.calls = 0

    def __call__(
        self, q_new: np.ndarray, grad_bound: float, q_old: np.ndarray, llr_bound: float
    ) -> tuple[np.ndarray, int, float, int]:
        g, k, s, kl = self._fns.clipped_grad_and_ratio_sum(q_new, grad_bound, q_old, llr_bound)
        if self._grad is not None:
            self._grad.record(q_new, grad_bound, g, k)
        self.calls += 1
        return g, k, s, kl


def _bits(a) -> tuple:
    """``(dtype, shape, bytes)`` of an array: equal only for the very same bits."""
    a = np.ascontiguousarray(a)
    return a.dtype.str, a.shape, a.tobytes()
