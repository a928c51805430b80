"""Where the records live: the only place raw data values enter pymc_dp.

`InMemoryRecords` holds the data arrays (one row per record) in this process and
hands them out as chunks (bounded memory), as the rows of a minibatch, or mapped and
reduced over chunks. Everything above it (graphs, routes, compiled functions) is data-free;
a store of another kind (`pymc_dp.records.dask_store.DaskStore`: records on a Dask
cluster) offers the same operations. The runtime computes every sum the steps release
through `map_reduce` (a function applied to each chunk where the chunk lives, its
results combined in chunk order on the driver), so that the sums are the same numbers
whichever store holds the records. (In memory and in one chunk, the clipped gradient sum
calls its function on `InMemoryRecords.whole` directly: the same numbers, fewer layers.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from pytensor.compile.sharedvalue import SharedVariable

from pymc_dp.records.errors import DATA_FREE, ModelNotSupportedError, RecordComputationError

__all__ = ["InMemoryRecords", "node_shape", "node_value", "split_rows", "unique_rows"]


def _private_call(fn, *args):
    """``fn(*args)`` on records, with nothing data-dependent in what comes out but its result.

    A failure is re-raised as `RecordComputationError` naming only its type (its text, e.g.
    PyTensor's listing of input values, could hold record values; the original is not
    chained); pymc_dp's own refusals (`ModelNotSupportedError`) and errors of data-free work
    (compilation, `pymc_dp.records.errors.mark_data_free`) carry no data and pass.
    """
    kind = None
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - only the type leaves
        if isinstance(err, ModelNotSupportedError) or getattr(err, DATA_FREE, False):
            raise
        kind = type(err).__name__
    raise RecordComputationError(
        f"a computation on the records failed ({kind}); its message is not shown because it "
        "could contain record values. Reproduce the failure on stand-in data"
    )


def node_shape(node) -> tuple[int, ...]:
    """The shape of a data node's value (public, like ``n``); no value is read."""
    if isinstance(node, SharedVariable):
        return tuple(np.shape(node.get_value(borrow=True)))
    return tuple(node.data.shape)


def node_value(node) -> np.ndarray:
    """The value of a data node (a constant or a shared variable): reads the data."""
    if isinstance(node, SharedVariable):
        return np.asarray(node.get_value())
    return np.asarray(node.data)


def parameter_values(shared) -> tuple:
    """The current values of the shared variables that stand for the free variables a step
    does not sample (`pymc.pytensorf.make_shared_replacements`, set by PyMC before each
    step): parameters, not data. Kept here, beside the data's readers, so that every read of
    a shared variable's value in ``records/`` is in this module
    (`tests/records/test_records.py::test_raw_data_enters_only_in_the_store`)."""
    return tuple(np.asarray(v.get_value(borrow=True)) for v in shared)


def split_rows(
    idx, row_args: tuple, starts: np.ndarray, n_records: int
) -> list[tuple[int, np.ndarray, tuple]]:
    """Split record indices by chunk: ``[(chunk, local indices, row_args of those), ...]``.

    ``idx`` (repeats allowed, any order) is validated and sorted (stably, ``row_args`` --
    arrays with one entry per index -- permuted alike); chunk ``j`` starts at record
    ``starts[j]``. Only chunks with at least one index are listed, in chunk order. Data-free:
    the indices are drawn on the driver.

    Raises
    ------
    ValueError
        If ``idx`` is not a 1-d array of integers in ``[0, n_records)`` or a row argument
        does not have one entry per index; raised before any data is read.
    """
    idx = np.asarray(idx)
    if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(
            f"idx (the record indices of a minibatch) must be a 1-d array of integers; got "
            f"shape {idx.shape} and dtype {idx.dtype}. Draw them with rng.integers or "
            "rng.choice"
        )
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n_records):
        raise ValueError(
            f"idx (the record indices of a minibatch) must lie in [0, n) with n = "
            f"{n_records} records; got indices in [{int(idx.min())}, {int(idx.max())}]. Draw "
            "them from range(n) of the records the step reads"
        )
    for k, a in enumerate(row_args):
        if np.shape(a)[:1] != idx.shape:
            raise ValueError(
                f"row_args[{k}] must have one entry per index ({idx.size}); got shape {np.shape(a)}"
            )
    order = np.argsort(idx, kind="stable")
    idx = idx[order].astype(np.int64, copy=False)
    row_args = tuple(np.asarray(a)[order] for a in row_args)
    starts = np.asarray(starts, dtype=np.int64)
    cuts = np.searchsorted(idx, np.append(starts[1:], n_records), side="left")
    out = []
    lo = 0
    for j, hi in enumerate(cuts):
        if hi > lo:
            out.append((j, idx[lo:hi] - starts[j], tuple(a[lo:hi] for a in row_args)))
        lo = hi
    return out


def unique_rows(local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct sorted indices, inverse)`` of sorted indices ``local`` (repeats allowed)."""
    if local.size < 2 or np.all(local[1:] != local[:-1]):
        return local, np.arange(local.size)
    uniq, inverse = np.unique(local, return_inverse=True)
    return uniq, np.ravel(inverse)


class InMemoryRecords:
    """The data arrays of a model, in memory, with the record axis first.

    Parameters
    ----------
    arrays : list of numpy arrays
        The data arrays the likelihood reads, each with ``n_records`` rows.
    chunk_size : int or None
        Records per chunk; ``None`` for all at once.
    """

    #: The records live in this process: per-record values (`chunks`, `take`) are available.
    local = True

    def __init__(self, arrays: list[np.ndarray], chunk_size: int | None = None) -> None:
        self._arrays = list(arrays)
        self.n_records = int(self._arrays[0].shape[0]) if self._arrays else 0
        self.chunk_size = int(chunk_size) if chunk_size else None
        self._prepared: dict[int, tuple[Any, list]] = {}
        self._whole = tuple(self._arrays)

    def __getstate__(self) -> dict:
        # the per-chunk cache is keyed by object ids, which do not survive pickling
        return {**self.__dict__, "_prepared": {}}

    @classmethod
    def from_nodes(cls, nodes: list, chunk_size: int | None = None) -> InMemoryRecords:
        """Read the values of the model's data nodes (the one read of the raw data)."""
        return cls([node_value(d) for d in nodes], chunk_size)

    @property
    def dtypes_and_shapes(self) -> list[tuple[np.dtype, tuple[int, ...]]]:
        """Dtype and shape of every array (public: the model structure and ``n``)."""
        return [(a.dtype, a.shape) for a in self._arrays]

    def chunk_starts(self) -> range:
        """Start index of every chunk."""
        return range(0, self.n_records, self.chunk_size or max(self.n_records, 1))

    def chunks(self) -> Iterator[list[np.ndarray]]:
        """The records in chunks of ``chunk_size`` rows (one list of arrays per chunk)."""
        step = self.chunk_size or max(self.n_records, 1)
        for start in self.chunk_starts():
            yield [a[start : start + step] for a in self._arrays]

    def whole(self) -> tuple[np.ndarray, ...] | None:
        """The records as one chunk (the arrays themselves, the same values as the one
        chunk of `chunks`) when they are not split into chunks; else ``None``.

        For a caller that applies one function to all the records and needs no reduction
        (`pymc_dp.records.RecordFunctions.clipped_grad_sum`, once per leapfrog step in
        DP-HMC): the per-call generator and reduction of `map_reduce` cost about as much
        as the compiled call on small data (issue 28). Read only; reads no value.
        """
        if self.n_records and (self.chunk_size is None or self.chunk_size >= self.n_records):
            return self._whole
        return None  # no records (no chunk) or several chunks

    def take(self, idx: np.ndarray) -> list[np.ndarray]:
        """The rows ``idx`` of every array (one fancy-indexing read per array)."""
        return [a[idx] for a in self._arrays]

    def map_reduce(
        self,
        fn: Callable[..., Any],
        reduce: Callable[[Any, Any], Any],
        init: Any,
        *,
        args: tuple = (),
        prepare: Callable[..., Any] | None = None,
        per_chunk: list | None = None,
    ):
        """``reduce(...reduce(init, fn(*args, *chunk_1))..., fn(*args, *chunk_k))``, in order.

        With ``prepare``, ``fn(*args, prepare(*chunk), *chunk)``: ``prepare`` computes data-only
        per-chunk arrays (e.g. row norms of a design matrix) once per chunk; they are cached
        with the store (keyed by the ``prepare`` object, which must be kept alive by the
        caller) and never returned.

        With ``per_chunk`` (one value per chunk, in chunk order),
        ``fn(*args, per_chunk[j], *chunk_j)``: values kept in this process from an earlier
        pass over the same chunks (`pymc_dp.records.LoglikMemo`); with both,
        ``fn(*args, prepare(*chunk_j), per_chunk[j], *chunk_j)``. In-memory stores only.
        """
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            if prepare is not None:
                key = id(prepare)
                if key not in self._prepared:
                    preps = [_private_call(prepare, *c) for c in self.chunks()]
                    self._prepared[key] = (prepare, preps)
                preps = self._prepared[key][1]
                acc = init
                if per_chunk is not None:
                    for p, v, c in zip(preps, per_chunk, self.chunks(), strict=True):
                        acc = reduce(acc, _private_call(fn, *args, p, v, *c))
                    return acc
                for p, c in zip(preps, self.chunks(), strict=True):
                    acc = reduce(acc, _private_call(fn, *args, p, *c))
                return acc
            if per_chunk is not None:
                acc = init
                for v, c in zip(per_chunk, self.chunks(), strict=True):
                    acc = reduce(acc, _private_call(fn, *args, v, *c))
                return acc
            acc = init
            for c in self.chunks():
                acc = reduce(acc, _private_call(fn, *args, *c))
            return acc

    def map_reduce_rows(
        self,
        fn: Callable[..., Any],
        reduce: Callable[[Any, Any], Any],
        init: Any,
        idx: np.ndarray,
        *,
        args: tuple = (),
        row_args: tuple = (),
    ):
        """``fn(*args, inverse, row_args_j, *rows_j)`` on the chunks holding records ``idx``.

        The minibatch counterpart of `map_reduce`: ``idx`` (record indices, repeats
        allowed) is split by chunk (`split_rows`); ``rows_j`` are the chunk's selected
        records, each distinct one read once (one fancy-indexing read per array),
        ``inverse`` maps the chunk's sorted indices to them, ``row_args_j`` are the entries
        of the per-index arrays ``row_args`` for those indices. Only chunks with selected
        records are visited; their results are reduced in chunk order.
        """
        starts = np.asarray(self.chunk_starts())
        acc = init
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            for j, local, ra in split_rows(idx, tuple(row_args), starts, self.n_records):
                uniq, inverse = unique_rows(local)
                rows = [a[uniq + starts[j]] for a in self._arrays]
                acc = reduce(acc, _private_call(fn, *args, inverse, ra, *rows))
        return acc

    def forget(self, prepare) -> None:
        """Drop the cached per-chunk arrays of ``prepare`` (if any)."""
        self._prepared.pop(id(prepare), None)

    def all_finite(self, which: list[bool]) -> bool:
        """Whether every float array flagged in ``which`` is finite (one bit about the data)."""
        for a, check in zip(self._arrays, which, strict=True):
            if check and np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
                return False
        return True

    def any_nan(self, which: list[bool]) -> bool:
        """Whether a float array flagged in ``which`` holds a NaN (one bit about the data).

        For the arrays `all_finite` leaves out (numpy covariates folded into the graph as
        constants, where an infinite entry can be a legitimate bound such as a per-record
        censoring point, but a NaN is always a missing value).
        """
        for a, check in zip(self._arrays, which, strict=True):
            if check and np.issubdtype(a.dtype, np.inexact) and np.isnan(a).any():
                return True
        return False
