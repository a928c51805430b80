"""Records on a Dask cluster: a store with the operations of `InMemoryRecords`.

`DaskStore` holds row-partitioned, persisted dask arrays (one partition = one chunk of
records) and runs the runtime's per-chunk functions where the partitions live: each
function is shipped to the cluster once (pickled, as the result of a task, so a lost copy
is recomputed like any other key; every worker thread compiles its own copy on first use),
every call sends only the parameter vectors,
and a worker returns only what the function returns for its partition -- a clipped sum and
a count (the count is 0 unless the step publishes non-private diagnostics), or one bit for
the start and finiteness checks. The driver combines the partition results in partition
order, so the sums are the same numbers as those of `InMemoryRecords` with
``chunk_size`` equal to the partition size.

In the *data-sharing* mode of Yildirim & Ermis (2019), Sec. 3.2.2, Algorithm 2, each
data owner (a group of partitions) adds its own Gaussian noise to its own contribution
before it leaves the owner (`DaskStore.owner_sums`): the driver never sees an owner's
sum without that owner's noise.

Per-record values never leave a worker: `chunks` and `take` refuse.

A worker lost during a run is handled by Dask: the partitions it held are recomputed from
their source (the graph of the persisted arrays). When that is impossible (data scattered
to the lost worker, or a task that failed too often), the run stops with
`RecordsLostError`; a task that fails on a worker stops it with a message that names only
the type of the error (its text could hold record values).
"""

from __future__ import annotations

import pickle
import threading
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from typing import Any

import numpy as np

from pymc_dp.records.store import split_rows, unique_rows

__all__ = ["DaskStore", "RecordsLostError", "RemoteRecordsError"]


class RecordsLostError(RuntimeError):
    """A partition of the records was lost with a worker and could not be recomputed.

    Attributes
    ----------
    releases : int or None
        Released sums that reached the driver before the loss (set by `pymc_dp.sample`).
    epsilon, delta : float or None
        The privacy spent by those releases (set by `pymc_dp.sample`).
    """

    releases: int | None = None
    epsilon: float | None = None
    delta: float | None = None


class RemoteRecordsError(TypeError):
    """An operation that needs per-record values on the driver, asked of remote records."""


def _identity(x):
    return x


_THREAD = threading.local()


def _own_copy(shipped):
    """This thread's copy of a shipped function ``(token, pickled bytes)``.

    A compiled PyTensor function keeps its inputs and outputs in storage of its own and must
    not be called by two threads at once (the threads of a worker, or in-process workers), so
    every thread loads its own copy, once per token: the function travels as bytes (copying
    bytes between workers compiles nothing) and is compiled when a thread first loads it.
    """
    token, blob = shipped
    cache = _THREAD.__dict__.setdefault("fns", {})
    if token not in cache:
        cache[token] = pickle.loads(blob)
    return cache[token]


class RemoteTaskError(RuntimeError):
    """A pymc_dp task failed on a worker; only the type of the error is reported."""


def _aligned(chunk) -> list:
    # An array received from another process (a partition from another worker, a parameter
    # vector from the driver) can be an unaligned view of the message buffer, which
    # PyTensor's C code refuses: copy such an array (aligned ones are used as they are).
    return [
        a if not isinstance(a, np.ndarray) or a.flags.aligned else np.require(a, requirements="A")
        for a in chunk
    ]


def _guarded(fn, *args):
    """Run ``fn`` on a worker; a failure is re-raised as `RemoteTaskError` naming only its
    type (Dask logs and returns a task's exception, whose text could hold record values).
    Floating-point warnings are off: whether one is printed depends on the records."""
    kind = None
    try:
        with np.errstate(all="ignore"):  # no data-dependent floating-point warning
            return fn(*args)
    except Exception as err:  # noqa: BLE001 - only the type leaves the worker
        kind = type(err).__name__
    raise RemoteTaskError(f"a pymc_dp task failed on a worker ({kind})")


def _call(fn, args, *chunk):
    return _guarded(lambda: _own_copy(fn)(*_aligned(args), *_aligned(chunk)))


def _call_prepared(fn, args, prep, *chunk):
    # a list of arrays (a route's row norms) is aligned array by array, an array as one; an
    # object (the control variate's `_Coefficients`, numpy / scipy only) is used as it is
    if isinstance(prep, list | tuple):
        prep = _aligned(prep)
    elif isinstance(prep, np.ndarray):
        prep = _aligned([prep])[0]
    return _guarded(lambda: _own_copy(fn)(*_aligned(args), prep, *_aligned(chunk)))


def _call_rows(fn, args, local, row_args, *chunk):
    def run():
        uniq, inverse = unique_rows(np.asarray(local))
        rows = [np.asarray(a)[uniq] for a in chunk]
        return _own_copy(fn)(*_aligned(args), inverse, tuple(_aligned(row_args)), *rows)

    return _guarded(run)


def _all_finite(flags, *chunk) -> bool:
    for a, check in zip(chunk, flags, strict=True):
        a = np.asarray(a)
        if check and np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            return False
    return True


def _owner_release(reduce, init, noise_std: float, seed, *parts):
    return _guarded(_owner_sum, reduce, init, noise_std, seed, *parts)


def _owner_sum(reduce, init, noise_std: float, seed, *parts):
    """One owner's noisy contribution (Algorithm 2): its partitions' sum plus its own noise.

    Runs on the cluster; only the noisy sum leaves it (the count of clipped records is
    dropped). ``seed`` is None (fresh OS entropy: nobody else knows the noise) or a
    test-only seed.
    """
    acc = init
    for p in parts:
        acc = reduce(acc, p)
    total = acc[0]
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=np.shape(total)) * noise_std
    return total + (noise if np.ndim(total) else float(noise))


class DaskStore:
    """Persisted row partitions of the data arrays on a Dask cluster (see module docstring).

    Built by `pymc_dp.distributed.DaskRecords` (which validates the arrays and the client);
    the arrays are in the order of the model's data nodes.

    Parameters
    ----------
    client : distributed.Client
    parts : list of lists of futures
        ``parts[j][a]``: partition ``j`` of array ``a`` (persisted).
    partition_sizes : sequence of int
        Records per partition (public, like ``n``).
    dtypes_and_shapes : list of (dtype, shape)
        Of every full array (public: the model structure and ``n``).
    owners : sequence of int, optional
        Owner of every partition (data-sharing mode); None for the central scheme.
    owner_seeds : sequence of int, optional
        Test-only seeds of the owners' noise (whoever knows them can remove the noise).
    """

    #: Per-record values stay on the workers: `chunks` and `take` refuse.
    local = False

    def __init__(
        self,
        client,
        parts: list[list[Any]],
        partition_sizes: Sequence[int],
        dtypes_and_shapes: list[tuple[np.dtype, tuple[int, ...]]],
        *,
        owners: Sequence[int] | None = None,
        owner_seeds: Sequence[int] | None = None,
    ) -> None:
        self._client = client
        self._parts = parts
        self.partition_sizes = tuple(int(s) for s in partition_sizes)
        self.n_records = int(sum(self.partition_sizes))
        sizes = set(self.partition_sizes[:-1])
        self.chunk_size = self.partition_sizes[0] if len(sizes) <= 1 else None
        self._dtypes_and_shapes = list(dtypes_and_shapes)
        self.owners = tuple(int(o) for o in owners) if owners is not None else None
        self.n_owners = 0 if self.owners is None else max(self.owners) + 1
        self._owner_seeds = list(owner_seeds) if owner_seeds is not None else None
        self._shipped: dict[int, tuple[Any, Any]] = {}
        self._prepared: dict[int, tuple[Any, list]] = {}
        self._owner_calls = 0

    def __getstate__(self):
        raise RemoteRecordsError(
            "records on a Dask cluster cannot be pickled into another process: run the chains "
            "in this process (pm.sample(cores=1); pymc_dp.sample does this for DaskRecords) -- "
            "the cluster does the parallel work"
        )

    # -- public facts -------------------------------------------------------------------------
    @property
    def dtypes_and_shapes(self) -> list[tuple[np.dtype, tuple[int, ...]]]:
        """Dtype and shape of every array (public: the model structure and ``n``)."""
        return list(self._dtypes_and_shapes)

    @property
    def n_partitions(self) -> int:
        return len(self._parts)

    # -- per-record values never leave the workers -----------------------------------------------
    def chunks(self):
        """Refused: per-record values never leave the workers."""
        raise RemoteRecordsError(
            "per-record values of records on a Dask cluster never leave the workers; this "
            "operation needs them on the driver (the steps use sums only); use in-memory "
            "records for it"
        )

    def take(self, idx):
        """Refused: per-record values never leave the workers."""
        self.chunks()

    # -- running functions where the partitions live ----------------------------------------------
    def _check_client(self) -> None:
        status = getattr(self._client, "status", None)
        if status != "running":
            raise RuntimeError(
                f"the Dask client of the records is not running (status {status!r}); the run "
                "cannot read the records. Keep the client open for the whole run"
            )

    def _ship(self, fn):
        """The cluster's copy of ``fn``: ``(token, pickled bytes)``, shipped once per object
        (a task whose result it is, so a lost copy is recomputed like any other key)."""
        key = id(fn)
        if key not in self._shipped:
            shipped = (uuid.uuid4().hex, pickle.dumps(fn))
            self._shipped[key] = (fn, self._client.submit(_identity, shipped, pure=False))
        return self._shipped[key][1]

    def _gather(self, futures):
        failure = None
        try:
            return self._client.gather(futures)
        except Exception as err:  # noqa: BLE001 - classified below, its text is not shown
            failure = err
        lost = isinstance(failure, CancelledError) or type(failure).__name__ == "KilledWorker"
        kind = type(failure).__name__
        failure = None  # drop the worker's exception (its text could hold record values)
        if lost:
            raise RecordsLostError(
                f"a partition of the records was lost with a Dask worker and could not be "
                f"recomputed from its source ({kind}); the run stopped. Give DaskRecords "
                "arrays built from a recomputable source (dask.array.from_array, from_zarr, "
                "...) rather than data scattered to one worker"
            )
        raise RuntimeError(
            f"a task on a Dask worker failed ({kind}); its message is not shown because it "
            "could contain record values. Reproduce the failure on stand-in data"
        )

    def _prepare_futures(self, prepare) -> list:
        key = id(prepare)
        if key not in self._prepared:
            f = self._ship(prepare)
            futs = [
                self._client.submit(_call, f, (), *p, pure=False) for j, p in enumerate(self._parts)
            ]
            self._prepared[key] = (prepare, futs)
        return self._prepared[key][1]

    def forget(self, prepare) -> None:
        """Drop the per-partition arrays of ``prepare`` from the cluster (if any)."""
        entry = self._prepared.pop(id(prepare), None)
        shipped = self._shipped.pop(id(prepare), None)
        futures = (entry[1] if entry is not None else []) + (
            [shipped[1]] if shipped is not None else []
        )
        if futures and getattr(self._client, "status", None) == "running":
            self._client.cancel(futures)

    def _partition_futures(self, fn, args, prepare) -> list:
        self._check_client()
        f = self._ship(fn)
        if prepare is None:
            return [
                self._client.submit(_call, f, tuple(args), *p, pure=False)
                for j, p in enumerate(self._parts)
            ]
        preps = self._prepare_futures(prepare)
        return [
            self._client.submit(_call_prepared, f, tuple(args), preps[j], *p, pure=False)
            for j, p in enumerate(self._parts)
        ]

    def map_reduce(
        self,
        fn: Callable[..., Any],
        reduce: Callable[[Any, Any], Any],
        init: Any,
        *,
        args: tuple = (),
        prepare: Callable[..., Any] | None = None,
    ):
        """``fn(*args, *partition)`` on every partition (on its worker), reduced in order.

        Like `InMemoryRecords.map_reduce`; ``fn`` and ``prepare`` are shipped to the cluster
        once per object (keep them alive), the ``prepare`` results stay on the workers.
        """
        results = self._gather(self._partition_futures(fn, args, prepare))
        acc = init
        for r in results:
            acc = reduce(acc, r)
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
        """``fn(*args, inverse, row_args_j, *rows_j)`` on the partitions holding ``idx``.

        Like `InMemoryRecords.map_reduce_rows`: the driver splits the indices (drawn on the
        driver) by partition, sends each partition that holds some of them only its local
        indices and per-index arguments, the worker reads those rows (each distinct one
        once), evaluates ``fn`` on them and returns what ``fn`` returns (a sum); the results
        are reduced in partition order.
        """
        starts = np.concatenate([[0], np.cumsum(self.partition_sizes)[:-1]])
        split = split_rows(idx, tuple(row_args), starts, self.n_records)
        self._check_client()
        f = self._ship(fn)
        futs = [
            self._client.submit(_call_rows, f, tuple(args), local, ra, *self._parts[j], pure=False)
            for j, local, ra in split
        ]
        results = self._gather(futs) if futs else []
        acc = init
        for r in results:
            acc = reduce(acc, r)
        return acc

    def owner_sums(
        self,
        fn: Callable[..., Any],
        reduce: Callable[[Any, Any], Any],
        init: Any,
        noise_std: float,
        *,
        args: tuple = (),
        prepare: Callable[..., Any] | None = None,
    ) -> list:
        """Every owner's noisy contribution, in owner order (Algorithm 2 of Yildirim & Ermis).

        Owner ``k`` reduces its partitions' ``(sum, count)`` results in partition order and
        adds its own ``N(0, noise_std^2)`` noise (per coordinate) on its worker; only the
        noisy sum reaches the driver.
        """
        if self.owners is None:
            raise ValueError(
                "these records have no data owners (owners=None); data-sharing needs "
                "DaskRecords(..., owners=...)"
            )
        parts = self._partition_futures(fn, args, prepare)
        self._owner_calls += 1
        futs = []
        for k in range(self.n_owners):
            mine = [p for j, p in enumerate(parts) if self.owners[j] == k]
            seed = None
            if self._owner_seeds is not None:
                seed = [int(self._owner_seeds[k]), k, self._owner_calls]
            futs.append(
                self._client.submit(
                    _owner_release, reduce, init, float(noise_std), seed, *mine, pure=False
                )
            )
        return list(self._gather(futs))

    def all_finite(self, which: list[bool]) -> bool:
        """Whether every float array flagged in ``which`` is finite (one bit per partition)."""
        return bool(self.map_reduce(_all_finite, lambda a, b: a and b, True, args=(list(which),)))
