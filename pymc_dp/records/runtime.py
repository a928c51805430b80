"""The per-record functions the steps call at run time.

`RecordFunctions` maps the compiled routes over a record store, chunk by chunk, and
adds the chunk results. The steps depend only on the methods listed in
`RecordSource` (a Protocol), not on how the functions were built or where the records
live. The methods that read the data must only be called from inside a privacy mechanism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from pymc_dp.records.graphs import RecordGraphs
from pymc_dp.records.routes import compile_gradients
from pymc_dp.records.store import InMemoryRecords

__all__ = ["RecordFunctions", "RecordSource"]


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

    def prior_logp_and_grad(self, q: np.ndarray) -> tuple[float, np.ndarray]: ...

    def prior_logp(self, q: np.ndarray) -> float: ...

    def loglik_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> np.ndarray: ...

    def loglik_ratio_subset(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray: ...

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
    ) -> tuple[np.ndarray, np.ndarray]: ...

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
    """Rows of ``g`` clipped to L2 norm ``bound``; a row that is not finite becomes 0."""
    g = np.asarray(g, dtype=float)
    sq = np.einsum("ij,ij->i", g, g)
    ok = np.isfinite(sq)
    w = np.where(ok & (sq > bound * bound), bound / np.sqrt(np.where(ok, sq, 1.0)), 1.0)
    return np.where(ok[:, None], g * w[:, None], 0.0)


def _mapped(g, m: np.ndarray | None) -> np.ndarray:
    """Rows of ``g`` mapped by ``m`` (``g @ m.T``); ``g`` itself when ``m`` is None."""
    g = np.asarray(g, dtype=float)
    return g if m is None else g @ m.T


@dataclass
class _Compiled:
    """Compiled functions of one step (picklable)."""

    prior_and_grad: Any
    ll_chunk: Any
    llr_clipped: Any
    grad_chunk: Any | None = None
    grad_clipped: Any | None = None


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
                self._kernels[key] = _LLRSumChunk(self._c.llr_clipped, self.counts)
            elif name == "grad":
                fs = self._c.grad_clipped
                self._kernels[key] = _GradSumChunk(fs["route"], fs["generic"], self.counts)
            elif name == "prepare":
                self._kernels[key] = _Prepare(self._c.grad_clipped["route"])
            else:  # "start"
                self._kernels[key] = _StartCheck(self._c.ll_chunk)
        return self._kernels[key]

    # -- data-free parts --------------------------------------------------------------------
    def prior_logp_and_grad(self, q: np.ndarray) -> tuple[float, np.ndarray]:
        """Log prior plus log-Jacobian at ``q`` and its gradient; never reads the data."""
        lp, g = self._c.prior_and_grad(q)
        return float(lp), np.asarray(g)

    def prior_logp(self, q: np.ndarray) -> float:
        """Log prior plus log-Jacobian at ``q``; never reads the data."""
        return self.prior_logp_and_grad(q)[0]

    # -- data reads (only call these from inside a privacy mechanism) ----------------------
    def loglik(self, q: np.ndarray) -> np.ndarray:
        """Per-record (tempered) log-likelihoods ``T * l_i(q)``, shape ``(n,)``."""
        return np.concatenate([self._c.ll_chunk(q, *c) for c in self._chunks()])

    def loglik_ratio(self, q_new: np.ndarray, q_old: np.ndarray) -> np.ndarray:
        """Per-record log-likelihood differences ``T * (l_i(q_new) - l_i(q_old))``."""
        return self.loglik(q_new) - self.loglik(q_old)

    def loglik_ratio_subset(
        self, q_new: np.ndarray, q_old: np.ndarray, idx: np.ndarray
    ) -> np.ndarray:
        """``T * (l_i(q_new) - l_i(q_old))`` for the records ``idx`` only (repeats allowed).

        Reads only the rows ``idx`` of every data array (one fancy-indexing read per array), so
        the cost is ``O(len(idx))``, independent of ``n``: the minibatch of DP-Fast MH.
        """
        rows = self._records.take(idx)
        return np.asarray(self._c.ll_chunk(q_new, *rows)) - np.asarray(
            self._c.ll_chunk(q_old, *rows)
        )

    def clipped_loglik_ratio_sum(
        self, q_new: np.ndarray, q_old: np.ndarray, bound: float
    ) -> tuple[float, int]:
        """Sum of per-record log-likelihood ratios clipped to ``[-bound, bound]``.

        Returns the clipped sum and the number of clipped records. The count is computed from
        the data without noise: it must never be published except behind an explicit,
        loudly labelled non-private option (with `counts` off it is 0). The chunk sums are
        added in chunk order, wherever the chunks live.
        """
        total, count = self._records.map_reduce(
            self._kernel("llr"), _add_pairs, (0.0, 0), args=(q_new, q_old, bound)
        )
        self.released["llr"] += 1
        return float(total), int(count)

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

    def _ensure_grad(self) -> None:
        if self._c.grad_chunk is None:
            self._c.grad_chunk, self._c.grad_clipped = compile_gradients(
                self._graphs, self._compile_kwargs
            )

    def per_record_grad(self, q: np.ndarray) -> np.ndarray:
        """Per-record gradients ``T * grad l_i(q)``, shape ``(n, d)``."""
        self._ensure_grad()
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
        self._ensure_grad()
        route = self._c.grad_clipped["route"]
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
        full ratio; the residuals are second order in the step and far smaller than the
        ``r_i``, so the same replace-one sensitivity ``2 bound`` buys a much smaller bound.
        The ``c_i`` are computed once per anchor and kept in memory (never published).
        Returns the sum and the number of clipped records (non-private, as in
        `clipped_loglik_ratio_sum`).

        ``transform`` (``M``, public, ``(d, d)``) and ``direction`` (``dq``, public) linearise
        in other coordinates ``y = T(q)``: with ``M = J(anchor)^{-T}`` (``J`` the Jacobian of
        ``T``) the ``c_i`` are the per-record gradients in ``y`` and ``dq = T(q_new) -
        T(q_old)`` the step in ``y`` (`pymc_dp.auto.recentre`).
        """
        self._require_local("the control variate (automatic mode)")
        m = None if transform is None else np.asarray(transform, dtype=float)
        key = (
            tuple(np.round(np.asarray(anchor, dtype=float), 15)),
            float(grad_bound),
            None if m is None else tuple(np.round(m.ravel(), 15)),
        )
        cache = self.__dict__.setdefault("_anchor_grads", {})
        if key not in cache:
            self._ensure_grad()
            cache.clear()
            cache[key] = [
                _clip_rows(_mapped(self._c.grad_chunk(anchor, *c), m), grad_bound)
                for c in self._chunks()
            ]
        if direction is None:
            dq = np.asarray(q_new, dtype=float) - np.asarray(q_old, dtype=float)
        else:
            dq = np.asarray(direction, dtype=float)
        total, count = 0.0, 0
        for c, g in zip(self._chunks(), cache[key], strict=True):
            r = np.asarray(self._c.ll_chunk(q_new, *c)) - np.asarray(self._c.ll_chunk(q_old, *c))
            res = r - g @ dq
            ok = np.isfinite(res)
            clipped = np.clip(np.where(ok, res, 0.0), -bound, bound)
            total += float(clipped.sum())
            count += int(np.count_nonzero(~ok | (np.abs(res) > bound)))
        self.released["llr"] += 1
        return total, count

    def _require_local(self, what: str) -> None:
        if not getattr(self._records, "local", True):
            raise NotImplementedError(
                f"{what} needs the records in this process; records on a Dask cluster are "
                "not supported there yet"
            )

    def clipped_grad_moments(
        self,
        q: np.ndarray,
        bound: float,
        transform: np.ndarray | None = None,
        outer_bound: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(sum_i c_i, sum_i e_i e_i^T)`` with ``c_i = clip_b(M grad l_i(q))`` and
        ``e_i = clip_{b'}(c_i)``, ``b'`` = ``outer_bound`` (default ``b``).

        The sufficient statistics of the private Fisher scoring of the automatic warm start
        (`pymc_dp.kernels.warmstart.private_laplace`). ``M`` (``transform``, public, default
        the identity) maps the gradients to other coordinates before clipping: with
        ``M = J^{-T}`` the ``c_i`` are the gradients in ``y = T(q)`` (`pymc_dp.auto.recentre`).
        A record whose gradient is not finite contributes 0. Replace-one sensitivities:
        ``2 b`` for the sum, ``sqrt(2) b'^2`` (in Frobenius norm) for the outer-product sum,
        whatever ``M``. Chunked: memory ``chunk_size x d``.
        """
        self._require_local("the automatic warm start")
        self._ensure_grad()
        m = None if transform is None else np.asarray(transform, dtype=float)
        s1 = np.zeros(self.ndim)
        s2 = np.zeros((self.ndim, self.ndim))
        for c in self._chunks():
            g = _clip_rows(_mapped(self._c.grad_chunk(q, *c), m), bound)
            s1 += g.sum(axis=0)
            e = g if outer_bound is None or outer_bound >= bound else _clip_rows(g, outer_bound)
            s2 += e.T @ e
        return s1, s2

    def grad_norm_counts(
        self, q: np.ndarray, grid: np.ndarray, transform: np.ndarray | None = None
    ) -> np.ndarray:
        """Records whose gradient norm ``||M grad l_i(q)||`` exceeds each bound of ``grid``.

        Exact counts (data, never published as they are): the input of a noisy histogram
        (`pymc_dp.kernels.warmstart.noisy_histogram_quantile`). A record whose gradient is
        not finite counts above every bound (it would be clipped, to 0). One pass over the
        records, whatever the grid's length.
        """
        self._require_local("the automatic warm start")
        self._ensure_grad()
        m = None if transform is None else np.asarray(transform, dtype=float)
        grid = np.asarray(grid, dtype=float)
        counts = np.zeros(grid.size, dtype=np.int64)
        for c in self._chunks():
            g = _mapped(self._c.grad_chunk(q, *c), m)
            sq = np.einsum("ij,ij->i", g, g)
            norm = np.where(np.isfinite(sq), np.sqrt(np.where(np.isfinite(sq), sq, 0.0)), np.inf)
            counts += (norm[:, None] > grid[None, :]).sum(axis=0)
        return counts

    def clipped_grad_sum_subset(
        self, q: np.ndarray, bound: float, idx: np.ndarray
    ) -> tuple[np.ndarray, int]:
        """``sum_{i in idx} clip_b(grad l_i(q))`` reading only the rows ``idx`` of the data.

        The minibatch gradient of DP-SGLD / DP-SGNHT. Returns the sum (shape ``(d,)``) and the
        number of clipped records (non-private, as in `clipped_grad_sum`). One
        fancy-indexing read per data array, in chunks of ``chunk_size``, through the chosen
        route (its data-only per-chunk arrays computed for the rows read); an empty subsample
        reads nothing and gives 0.
        """
        total = np.zeros(self.ndim)
        count = 0
        idx = np.asarray(idx)
        if idx.size == 0:
            return total, count
        self._ensure_grad()
        route = self._c.grad_clipped["route"]
        generic = self._c.grad_clipped["generic"]
        step = self.chunk_size or idx.size
        for start in range(0, idx.size, step):
            rows = self._records.take(idx[start : start + step])
            prep = route.prepared(rows)
            g, k = generic(q, bound, [], rows) if prep is None else route(q, bound, prep, rows)
            total += g
            count += k
        return total, count

    @property
    def gradient_route(self) -> str:
        """Route of `clipped_grad_sum`: ``"GLM fast"``, ``"indexed"``, ``"generic"`` or
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
