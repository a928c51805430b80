"""Records on a Dask cluster: `DaskRecords`.

Install with ``pip install "pymc_dp[distributed]"``. The records are row-chunked dask arrays
keyed by the names of the model's observed variables and ``pm.Data`` containers, persisted
on the workers; the model is the same PyMC model (its data containers may hold a small
stand-in of the same dtype and trailing shape). Give the records to a step
(``records=``) or to `pymc_dp.sample`::

    from dask.distributed import Client
    import dask.array as da

    client = Client(cluster)
    records = pymc_dp.distributed.DaskRecords(
        client, {"y": da.from_zarr(...), "X": da.from_zarr(...)}
    )
    idata = pymc_dp.sample(step=pymc_dp.DPHMC, records=records, ...)

Every full-data read then runs where the partitions live: the per-record functions are
compiled once on the driver and sent once to a long-lived Dask actor on every worker
(`pymc_dp.records.dask_store.PartitionActor`), which holds that worker's partitions for the
whole run; a released sum is one message to each actor (no scheduler round trip), which
evaluates the function on its partitions and returns only partition sums (the clipped
gradient sum, the clipped log-likelihood-ratio sum); the driver adds the noise. With the
same seed, draws equal those of a single-process run with ``chunk_size`` equal to the
partition size.

The workers' allocator matters: Dask's nanny starts each worker with
``MALLOC_TRIM_THRESHOLD_=65536``, which makes every temporary array of a per-record function a
fresh ``mmap`` (page faults on every released sum: about twice the CPU of the same sum in one
process, issue 28). pymc_dp leaves the workers' environment as it is and warns once
(`WorkerMallocWarning`) when the actors start; drop the variable with the Dask setting
``distributed.nanny.pre-spawn-environ`` (docs/scaling-out.md, "The workers' allocator").

**Data-sharing** (``owners=...``; Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2): each data
owner (a group of partitions) adds its own Gaussian noise to its own clipped
log-likelihood-ratio sum on the cluster, so each owner is protected against the curator and
against the other owners with the (epsilon, delta) of the central scheme at the same noise
multiplier (neighbours: replace one record of that owner), as far as they see only what the run
releases: a curator who uses the Dask client (which holds futures to every owner's raw
partitions and to the exact per-partition sums) or controls the cluster can read the records
(docs/scaling-out.md, "Which curator this protects against"). The price: with ``K`` owners the
log acceptance ratio carries ``K`` times the noise variance of the central scheme, which lowers
the acceptance rate. Supported by `pymc_dp.DPPenaltyMetropolis` and `pymc_dp.DPHMC` (every
owner noises its own gradient sums too).

Every step takes ``records=``: the full-data steps as above, the minibatch steps (DPSGLD,
DPSGNHT, DPFastMH, DPBarker, DPSubsampledPenalty) draw their minibatch indices on the driver
and each partition holding some of them returns only those rows' sums; so does the
automatic mode, ``pymc_dp.sample(step=None, records=...)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

try:
    import dask.array as da
    from distributed import futures_of
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'pymc_dp.distributed needs dask[distributed]: pip install "pymc_dp[distributed]"'
    ) from err

from pymc_dp.records.dask_store import (
    DaskStore,
    RecordsLostError,
    RemoteRecordsError,
    WorkerMallocWarning,
)

__all__ = ["DaskRecords", "RecordsLostError", "RemoteRecordsError", "WorkerMallocWarning"]


def _check_client(client) -> None:
    status = getattr(client, "status", None)
    if not hasattr(client, "submit") or status is None:
        raise TypeError(
            f"client must be a dask.distributed.Client; got {type(client).__name__}. Create "
            "one with distributed.Client(cluster)"
        )
    if status != "running":
        raise ValueError(
            f"client is not running (status {status!r}); pass an open dask.distributed.Client "
            "(a closed client cannot reach the records)"
        )


def _check_arrays(arrays) -> dict[str, Any]:
    if not isinstance(arrays, Mapping) or not arrays:
        raise TypeError(
            "arrays must be a non-empty dict {name: dask array} keyed by the names of the "
            f"model's observed variables and pm.Data containers; got {type(arrays).__name__}"
        )
    out = {}
    for name, a in arrays.items():
        if not isinstance(name, str):
            raise TypeError(f"arrays keys must be variable names (str); got {name!r}")
        if not isinstance(a, da.Array):
            raise TypeError(
                f"arrays[{name!r}] is a {type(a).__name__}, not a dask array; wrap it, e.g. "
                f"dask.array.from_array(x, chunks=(100_000,) + x.shape[1:])"
            )
        if a.ndim < 1:
            raise ValueError(f"arrays[{name!r}] is a scalar; records need a leading record axis")
        if any(np.isnan(c) for c in a.chunks[0]):
            raise ValueError(
                f"arrays[{name!r}] has unknown chunk sizes; call .compute_chunk_sizes() first"
            )
        for axis in range(1, a.ndim):
            if len(a.chunks[axis]) > 1:
                raise ValueError(
                    f"arrays[{name!r}] splits each record across {len(a.chunks[axis])} chunks "
                    f"along axis {axis}; a record must lie in one partition: rechunk with "
                    f"arrays[{name!r}].rechunk({{{axis}: -1}})"
                )
        out[name] = a
    lengths = {k: int(a.shape[0]) for k, a in out.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(
            f"arrays have different numbers of rows ({lengths}); record i is row i of every "
            "array, so they must all have the same length"
        )
    if next(iter(lengths.values())) == 0:
        raise ValueError("arrays have 0 rows; there are no records to fit")
    splits = {k: tuple(int(c) for c in a.chunks[0]) for k, a in out.items()}
    if len(set(splits.values())) != 1:
        first = next(iter(out))
        raise ValueError(
            f"arrays split the records into partitions differently ({splits}); every partition "
            "must hold the same records of every array: rechunk all to the same row chunks, "
            f"e.g. a.rechunk({{0: arrays[{first!r}].chunks[0]}})"
        )
    return out


def _check_owners(owners, n_partitions: int) -> tuple[int, ...] | None:
    if owners is None:
        return None
    if isinstance(owners, str):
        if owners != "partition":
            raise ValueError(
                f"owners must be None, 'partition' or one owner index per partition; got {owners!r}"
            )
        return tuple(range(n_partitions))
    try:
        o = [int(v) for v in owners]
    except (TypeError, ValueError):
        raise ValueError(
            f"owners must be None, 'partition' or one owner index per partition; got {owners!r}"
        ) from None
    if len(o) != n_partitions:
        raise ValueError(
            f"owners has {len(o)} entries but the arrays have {n_partitions} partitions; give "
            "one owner index per partition"
        )
    if sorted(set(o)) != list(range(max(o) + 1)):
        raise ValueError(
            f"owners must number the owners 0, 1, ..., K-1 (each used at least once); got {o}"
        )
    return tuple(o)


class DaskRecords:
    """The records of a model as row-chunked dask arrays on a Dask cluster.

    Parameters
    ----------
    client : distributed.Client
        A running client of the cluster that holds (or can load) the records.
    arrays : dict of str to dask.array.Array
        One array per observed variable and per ``pm.Data`` container of the model that has
        one row per record, keyed by the variable's (or container's) name. All arrays have
        the same number of rows ``n`` and the same row chunks (a partition holds the same
        records of every array); other axes are not chunked. Build them from a recomputable
        source (``da.from_array``, ``da.from_zarr``, ...): a partition lost with a worker is
        then recomputed by Dask.
    owners : None, "partition" or sequence of int, optional
        Data-sharing mode (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2): the owner of
        every partition (``"partition"``: each partition its own owner). Each owner adds its
        own Gaussian noise to its own contribution, on the cluster: it protects the owners
        against a curator who sees only what the run releases, not against one who uses this
        client (which holds futures to every owner's partitions) or controls the cluster
        (docs/scaling-out.md). None (default): the central scheme, the driver adds the noise.
    owner_seeds : sequence of int, optional
        For reproducible tests only: seeds of the owners' noise. Whoever knows them can
        remove the noise; by default every owner draws fresh OS entropy on its worker.

    Raises
    ------
    TypeError, ValueError
        Before any data is read: a client that is not running, arrays that are not dask
        arrays, different lengths, different row chunks, a record split across chunks,
        unknown chunk sizes, malformed owners. Names that match nothing in the model are
        refused when a step is built from the records, also before any data is read.
    """

    def __init__(
        self,
        client,
        arrays: Mapping[str, Any],
        *,
        owners: str | Sequence[int] | None = None,
        owner_seeds: Sequence[int] | None = None,
    ) -> None:
        _check_client(client)
        self._client = client
        self._arrays = _check_arrays(arrays)
        first = next(iter(self._arrays.values()))
        self.partition_sizes = tuple(int(c) for c in first.chunks[0])
        self.n_records = int(first.shape[0])
        self.owners = _check_owners(owners, len(self.partition_sizes))
        self.n_owners = 0 if self.owners is None else max(self.owners) + 1
        if owner_seeds is not None:
            if self.owners is None:
                raise ValueError("owner_seeds needs owners=...")
            owner_seeds = [int(s) for s in owner_seeds]
            if len(owner_seeds) != self.n_owners:
                raise ValueError(
                    f"owner_seeds has {len(owner_seeds)} entries for {self.n_owners} owners"
                )
        self._owner_seeds = owner_seeds
        self._persisted: dict[str, Any] | None = None

    @property
    def names(self) -> list[str]:
        """The names the arrays are keyed by."""
        return list(self._arrays)

    @property
    def n_partitions(self) -> int:
        return len(self.partition_sizes)

    def check_names(self, names_of_nodes: Sequence[Sequence[str]]) -> list[str]:
        """Match the model's data nodes to the arrays; reads no data.

        Parameters
        ----------
        names_of_nodes : sequence of sequences of str
            For every data array of the model's likelihood (in the order of the runtime),
            the names it is known by (the observed variable, the ``pm.Data`` container).

        Returns
        -------
        list of str
            The key of the array for every data node.
        """
        chosen = []
        for names in names_of_nodes:
            hits = [n for n in names if n in self._arrays]
            if not hits:
                raise ValueError(
                    f"the model's likelihood reads the data {list(names)}, but DaskRecords has "
                    f"no array for it (keys: {self.names}); add it under one of those names"
                )
            if len(hits) > 1:
                raise ValueError(
                    f"DaskRecords has several arrays ({hits}) for the same data of the model; "
                    "give it once"
                )
            chosen.append(hits[0])
        unused = [k for k in self._arrays if k not in chosen]
        if unused:
            raise ValueError(
                f"DaskRecords arrays {unused} match no observed variable or pm.Data container "
                f"the model's likelihood reads (it reads {[list(n) for n in names_of_nodes]}); "
                "remove them or fix their names"
            )
        return chosen

    def _cast_integers(self, key: str, dtype: np.dtype) -> None:
        """Cast ``arrays[key]`` to the integer ``dtype``, values outside its range clipped to
        it: a per-record transform fixed in advance (like declared data bounds), decided
        without reading the data (a check of the values would tell the driver one bit about
        them, outside any privacy mechanism)."""
        info = np.iinfo(dtype)
        a = self._arrays[key]
        self._arrays[key] = a.clip(max(info.min, np.iinfo(a.dtype).min), info.max).astype(dtype)
        self._persisted = None  # (re)persisted with the cast array

    def store_for(
        self, keys: Sequence[str], templates: Sequence[tuple[np.dtype, tuple[int, ...]]]
    ) -> DaskStore:
        """The store of the arrays ``keys`` (checked against the model's ``templates``:
        dtype and trailing shape of every data node); persists the arrays on first use.

        An integer array whose dtype is not the model's integer dtype (PyMC stores an int64
        ``pm.Data`` array as int32) is cast to it, values outside the model's dtype's range
        clipped to that range (`_cast_integers`: no data is read to decide).
        """
        _check_client(self._client)
        for k, (dtype, trailing) in zip(keys, templates, strict=True):
            a = self._arrays[k]
            if (
                tuple(a.shape[1:]) == tuple(trailing)
                and np.dtype(a.dtype) != np.dtype(dtype)
                and np.dtype(a.dtype).kind in "iu"
                and np.dtype(dtype).kind in "iu"
            ):
                self._cast_integers(k, np.dtype(dtype))
                continue
            if np.dtype(a.dtype) != np.dtype(dtype) or tuple(a.shape[1:]) != tuple(trailing):
                raise ValueError(
                    f"arrays[{k!r}] has dtype {a.dtype} and rows of shape {tuple(a.shape[1:])}, "
                    f"but the model's data has dtype {np.dtype(dtype)} and rows of shape "
                    f"{tuple(trailing)}; the model's stand-in must have the dtype and trailing "
                    "shape of the records (cast or reshape one of them)"
                )
        if self._persisted is None:
            persisted = self._client.persist(list(self._arrays.values()))
            self._persisted = dict(zip(self._arrays, persisted, strict=True))
        futures = {}
        for k in keys:
            a = self._persisted[k]
            by_key = {f.key: f for f in futures_of(a)}
            futures[k] = [
                by_key[(a.name, j) + (0,) * (a.ndim - 1)] for j in range(self.n_partitions)
            ]
        parts = [[futures[k][j] for k in keys] for j in range(self.n_partitions)]
        return DaskStore(
            self._client,
            parts,
            self.partition_sizes,
            [(self._arrays[k].dtype, tuple(self._arrays[k].shape)) for k in keys],
            owners=self.owners,
            owner_seeds=self._owner_seeds,
        )
