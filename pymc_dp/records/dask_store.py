"""Records on a Dask cluster: a store with the operations of `InMemoryRecords`.

`DaskStore` holds row-partitioned, persisted dask arrays (one partition = one chunk of
records) and runs the runtime's per-chunk functions where the partitions live, a worker
returning only what the function returns for its partition -- a clipped sum and a count
(the count is 0 unless the step publishes non-private diagnostics), or one bit for the
start and finiteness checks. The driver combines the partition results in partition
order, so the sums are the same numbers as those of `InMemoryRecords` with
``chunk_size`` equal to the partition size.

*The per-iteration protocol* (issue 28): a released sum must not cost a scheduler round
trip (submitting a task per partition and gathering its result cost 11-43 ms however
small the partitions). On first use the store starts one Dask actor (`PartitionActor`) per
worker, holding the partitions that worker already has (a partition is moved only to
balance the partitions between the workers). An actor keeps, for the whole run, the
partitions, the compiled per-chunk functions (each sent to it once, as pickled bytes) and
the data-only per-partition arrays a route prepares (the GLM route's row norms, the
sorted route's order, the control variate's anchor gradients). A released sum is then one
message from the driver to every actor, straight to the worker (no scheduler), carrying
the function's token and the parameter vectors; every actor evaluates the function on
each of its partitions (in the worker's actor thread) and answers with the partition sums. The
minibatch releases send each actor only the indices of the rows its partitions hold.

*The other variables* (issue 28, twelfth session): in a ``CompoundStep`` a step reads the
free variables it does not sample from PyTensor shared variables, which PyMC sets on the
driver before every step. A function pickled to a worker carries its own copies of them,
frozen at their values when it was pickled; so the store pickles every function together
with the shared variables it follows (`DaskStore.follow`: the copies loaded on a worker are
the very variables the loaded function reads) and every call carries their current values,
which the actor sets before it evaluates (`PartitionActor.run`; the tasks of the
data-sharing mode likewise, `_own_copy`). Before, the workers evaluated the likelihood at
the values the other variables had when the function was shipped
(``tests/test_compound_shared.py``).

An actor that holds at most `_INLINE_RECORDS` records runs its calls in its worker's event
loop (Dask's ``separate_thread=False``) rather than in the worker's actor thread: two
thread switches less a released sum on each worker, each a wait for a core on a loaded host
(docs/benchmarks.md, section 7).

"Straight to the worker" is done here, not by Dask's `Actor` handle: an actor method
called from a client with Dask's default ``direct_to_workers=None`` goes through the
scheduler's ``proxy`` handler (two more messages a call; on a ``LocalCluster`` the
scheduler's event loop runs in the driver process), and each answer is awaited on its own.
`DaskStore._send` instead runs one coroutine on the client's event loop that sends every
actor its call over the client's connection pool (the worker's ``actor_execute``
handler, the same request an `Actor` handle sends when the client connects directly) and
gathers the answers (issue 28, measured on 2 local worker processes and tiny data, A/B on
one cluster: the driver's CPU a released sum 1.5-3.8 ms against 2.5-5.9 ms;
docs/benchmarks.md, section 7). A client made with ``direct_to_workers=False`` (workers it
cannot reach) keeps the scheduler's route.

*The channel* (issue 28, thirteenth session): even straight to the workers, a released sum
through Dask's comm cost about 1.2-1.4 ms of the driver's CPU and as much of the workers'
(cProfile of the driver's event-loop thread: msgpack and pickle framing, checks for frame
compression, ``sizeof``, metrics, asyncio callbacks; and the hand-over to and from the
client's event-loop thread), which is the whole clipped-ratio sum of a 10^6-record banana
on the PyMC 6 line (0.7 ms of CPU a 250 000-record partition, in a worker as in the
driver). So when the actors start, each opens a listening socket on its worker's host
(`PartitionActor.open_channel`), the driver connects and sends a random secret it gave the
actor through Dask (anything else is closed unanswered), and from then on a released sum is
a pickled request written to every actor's socket and the pickled answers read back, in the
driver's own thread (`DaskStore._send_channel`); on the worker a thread of the actor reads
it and calls `PartitionActor.run` (one call at a time with Dask's route: a lock). No event
loop, no Dask framing on either side. The same requests and the same answers (partition
results only; a failure is sent as the name of its type), so the same sums. TLS clusters
keep Dask's comm (the channel is not encrypted, and carries noise-free partition sums, as
Dask's plain TCP comm does); a channel that breaks is closed and its call sent again by
Dask's route (a sum is deterministic), and anything that interrupts an exchange (e.g.
``KeyboardInterrupt``) closes the channels it used, so that no answer left on a socket is
read as a later call's.

Per-record values kept between releases (DP-HMC's log-likelihoods at the current point,
`pymc_dp.records.LoglikMemo`) stay on the actors (`PartitionActor.kept`): the driver holds
only a name for them (`pymc_dp.records.runtime.KeptOnWorkers`), and an actor that does not
keep them (its first call, a new actor after a lost worker) computes them at the named
point within the release. So DP-HMC's ratio release runs in its last gradient pass on the
cluster too (`pymc_dp.records.FusedLastPass`): ``L`` messages to each worker an iteration.

In the *data-sharing* mode of Yildirim & Ermis (2019), Sec. 3.2.2, Algorithm 2, the
owners' noisy sums (`DaskStore.owner_sums`) still run as tasks (one task per partition and
one per owner, which adds its own noise where its partitions' sums are; the driver never
sees an owner's sum without that owner's noise): an actor answers the driver, so it could
not hand a partition sum to another owner's noise without showing it to the driver.

Per-record values never leave a worker: `chunks` and `take` refuse.

*The workers' allocator.* Dask's nanny starts every worker with
``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's adaptive mmap threshold: every
temporary array of 128 KiB or more that a per-record function allocates (PyTensor's Numba and
C backends allocate theirs with ``malloc``) is then a fresh ``mmap``, paid in page faults on
every call. Measured (issue 28, banana model, 250 000 records a partition, one worker, the
same compiled function): 2 994 page faults and 5.1-5.7 ms of CPU a call in such a worker, 0
faults and 2.1 ms in a worker started without the variable (PyMC 5 line; PyMC 6 line: 978
faults, 1.9-2.0 ms against 0 faults, 1.0 ms), about 1 microsecond of CPU a fault; the
compiled function, PyTensor's configuration, the BLAS threads and the thread were the same
(docs/benchmarks.md, section 7).
pymc_dp does not change the workers' environment: when the actors start, each reports the
settings of its process's initial environment that fix glibc's thresholds
(`PartitionActor.malloc_settings`) and the store warns once (`WorkerMallocWarning`), naming
the Dask setting that drops them (docs/scaling-out.md). Without such a setting glibc's
threshold adapts to the largest block freed so far, and a fresh worker process has not yet
freed a large one: the DPHMC gradient functions there still took 2 168 faults a call
(their temporaries trimmed from the top of the heap after every call). An actor therefore
starts by allocating and freeing one 30 MiB block (`_settle_malloc`, not touched, so no
page is faulted in): what freeing any large array does in a long-running numpy process,
and what the one-process run had done before its first sum. It changes no setting (with a
fixed threshold it is a no-op) and leaves glibc's adaptive threshold at 30 MiB, its heap
trimmed above 60 MiB of free memory at its top. Measured at ``n = 10^6`` (4 partitions on
2 workers, PyMC 5 line, workers without ``MALLOC_TRIM_THRESHOLD_``): DPHMC's actor CPU
181 to 95-98 ms an iteration, faults per partition call 2 168 to 0.

A worker lost during a run is handled by Dask: the partitions it held are recomputed from
their source (the graph of the persisted arrays); an actor lost with its worker is started
again, on a live worker, from the same partitions, and the sums it had not returned are
asked of the new actor (a sum is deterministic: asking again releases nothing more, and
the sums the other actors returned are kept, not asked again). When the partitions cannot
be recomputed (data scattered to the lost worker, or a task that failed too often), the run
stops with `RecordsLostError`; a function that fails on a worker stops it with a message
that names only the type of the error (its text could hold record values).
"""

from __future__ import annotations

import contextlib
import functools
import hmac
import os
import pickle
import socket
import struct
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError
from typing import Any

import numpy as np

from pymc_dp.records.store import parameter_values, split_rows, unique_rows

__all__ = ["DaskStore", "RecordsLostError", "RemoteRecordsError", "WorkerMallocWarning"]


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


class WorkerMallocWarning(UserWarning):
    """The Dask workers run with glibc malloc settings that make every released sum pay
    page faults (Dask's default ``MALLOC_TRIM_THRESHOLD_``; see `DaskStore`)."""


#: Environment variables that fix a glibc malloc threshold and so turn off its adaptive mmap
#: threshold (glibc sets ``no_dyn_threshold`` for each of them), and the equivalent tunables.
_MALLOC_VARS = (
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_MMAP_MAX_",
)
_MALLOC_TUNABLES = (
    "glibc.malloc.trim_threshold",
    "glibc.malloc.mmap_threshold",
    "glibc.malloc.top_pad",
    "glibc.malloc.mmap_max",
)


def _initial_environ() -> dict[str, str] | None:
    """The environment this process started with (``/proc/self/environ``: what glibc read
    when it set up its allocator, unlike ``os.environ``, which later code may change); None
    where it cannot be read."""
    try:
        with open("/proc/self/environ", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    items = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in items}


def _fixed_malloc_settings() -> list[str]:
    """The settings (``NAME=value``) of this process's initial environment that turn off
    glibc's adaptive mmap threshold; empty off Linux or when there are none.

    The environment is public configuration, not record data.
    """
    if not sys.platform.startswith("linux"):
        return []  # glibc's variables; other allocators ignore them
    env = _initial_environ()
    if env is None:
        env = dict(os.environ)
    found = [f"{k}={env[k]}" for k in _MALLOC_VARS if k in env]
    for item in env.get("GLIBC_TUNABLES", "").split(":"):
        if item.split("=", 1)[0] in _MALLOC_TUNABLES:
            found.append(f"GLIBC_TUNABLES {item}")
    return found


def _identity(x):
    return x


_THREAD = threading.local()


def _set_shared(copies: tuple, values: tuple | None) -> None:
    """Give a loaded function's copies of the unsampled variables (`DaskStore.follow`) the
    driver's current values, shipped with the call: the copies are those the function
    reads (unpickled with it), so it is evaluated where the chain is, not where it was when
    the function was pickled. Parameters only, never data."""
    if values is None:
        return
    for var, value in zip(copies, _aligned(list(values)), strict=True):
        var.set_value(value)


def _own_copy(shipped, values: tuple | None = None):
    """This thread's copy of a shipped function ``(token, pickled bytes)``, its copies of
    the unsampled variables set to ``values`` (`_set_shared`).

    A compiled PyTensor function keeps its inputs and outputs in storage of its own and must
    not be called by two threads at once (the threads of a worker, or in-process workers), so
    every thread loads its own copy, once per token: the function travels as bytes (copying
    bytes between workers compiles nothing) and is compiled when a thread first loads it.
    """
    token, blob = shipped
    cache = _THREAD.__dict__.setdefault("fns", {})
    if token not in cache:
        cache[token] = pickle.loads(blob)
    fn, copies = cache[token]
    _set_shared(copies, values)
    return fn


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


def _call(fn, values, args, *chunk):
    return _guarded(lambda: _own_copy(fn, values)(*_aligned(args), *_aligned(chunk)))


def _call_prepared(fn, values, args, prep, *chunk):
    # a list of arrays (a route's row norms) is aligned array by array, an array as one; an
    # object (the control variate's `_Coefficients`, numpy / scipy only) is used as it is
    if isinstance(prep, list | tuple):
        prep = _aligned(prep)
    elif isinstance(prep, np.ndarray):
        prep = _aligned([prep])[0]
    return _guarded(lambda: _own_copy(fn, values)(*_aligned(args), prep, *_aligned(chunk)))


def _all_finite(flags, *chunk) -> bool:
    for a, check in zip(chunk, flags, strict=True):
        a = np.asarray(a)
        if check and np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
            return False
    return True


def _any_nan(flags, *chunk) -> bool:
    for a, check in zip(chunk, flags, strict=True):
        a = np.asarray(a)
        if check and np.issubdtype(a.dtype, np.inexact) and np.isnan(a).any():
            return True
    return False


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


#: Bytes of the block an actor allocates and frees when it starts (`_settle_malloc`): below
#: the 32 MiB cap of glibc's adaptive mmap threshold (``DEFAULT_MMAP_THRESHOLD_MAX``).
_SETTLE_BYTES = 30 * 2**20


def _settle_malloc() -> None:
    """Let glibc's adaptive mmap threshold reach its working size in this process.

    glibc serves a block at or above its mmap threshold with a fresh ``mmap`` (page faults
    on first touch, returned to the system when freed); the threshold starts at 128 KiB and
    rises to the size of the largest mmapped block freed so far (at most 32 MiB, the heap's
    trim threshold to twice that). Allocating and freeing one 30 MiB block -- not touched,
    so no page is faulted in -- puts a fresh worker where a long-running numpy process
    already is, so the multi-megabyte temporary arrays of the per-record functions are
    reused from the heap instead of faulted in on every call. No setting is changed: with a
    fixed threshold (`_fixed_malloc_settings`) glibc ignores the block, and so does this.
    """
    if not sys.platform.startswith("linux") or _fixed_malloc_settings():
        return
    block = np.empty(_SETTLE_BYTES // 8)
    del block


#: Send the released sums over a socket of the store's own to each actor (`DaskStore._send`)
#: where the workers' addresses allow it (`_CHANNEL_SCHEMES`); False: Dask's comm only.
_CHANNEL = True
#: Address schemes whose workers get a channel: plain TCP (Dask's comm there is neither
#: encrypted nor authenticated; the channel is authenticated by a random secret) and
#: in-process workers (a loopback socket). A TLS cluster keeps Dask's route, which keeps
#: the noise-free partition sums encrypted on the wire.
_CHANNEL_SCHEMES = ("tcp", "inproc")
#: Seconds an actor waits for the driver's connection (and for its secret).
_CHANNEL_TIMEOUT = 30.0
#: Seconds the driver waits to connect a channel and for the actor's answer (a worker
#: behind a firewall that drops the connection costs this once, then Dask's route is used).
_CONNECT_TIMEOUT = 5.0
#: A channel message: one kind byte (``C`` call, ``R`` result, ``E`` error type, ``K``
#: ready), the payload's length, the payload.
_HEADER = struct.Struct("!cQ")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _nodelay(sock) -> None:
    with contextlib.suppress(OSError):  # not TCP (never here), or an old kernel
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _recv_exact(sock, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionResetError("the channel was closed")
        got += k
    return buf


def _send_msg(sock, kind: bytes, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def _recv_msg(sock) -> tuple[bytes, bytearray]:
    kind, n = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    return kind, _recv_exact(sock, n)


class PartitionActor:
    """Worker-side state of the per-iteration protocol: a Dask actor holding partitions.

    Started by `DaskStore` (``client.submit(PartitionActor, ..., actor=True)``) on the
    worker that holds its partitions; it lives as long as the store. Its `run` calls run one
    at a time, all in the worker's actor thread or, for an actor holding few records
    (`DaskStore._inline_records`), all in the worker's event loop, so every compiled
    function it loads is called by one thread only. Every method returns partition results
    only (what the runtime's per-chunk functions return: sums, counts, one bit), never a
    per-record value; a failure is re-raised as `RemoteTaskError` naming only its type.

    Parameters
    ----------
    index : sequence of int
        The numbers of the partitions it holds.
    n_arrays : int
        Arrays per partition.
    *flat : numpy.ndarray
        The partitions' arrays, partition after partition (Dask passes the persisted
        partitions' values, read where they live).
    """

    def __init__(self, index: Sequence[int], n_arrays: int, *flat) -> None:
        self._index = [int(j) for j in index]
        self._parts = {
            j: tuple(_aligned(list(flat[k * n_arrays : (k + 1) * n_arrays])))
            for k, j in enumerate(self._index)
        }
        #: ``{token: (function, its copies of the unsampled variables)}``
        self._fns: dict[str, tuple[Any, tuple]] = {}
        #: the values of the unsampled variables shipped with the current call, and the
        #: tokens whose copies have them
        self._values: tuple | None = None
        self._synced: set[str] = set()
        self._prepared: dict[str, dict[int, Any]] = {}
        #: per-record values kept between calls (`kept`): ``{key: {partition: array}}``
        self._kept: dict[str, dict[int, np.ndarray]] = {}
        #: one call at a time, whichever route it came by (`open_channel`, Dask's)
        self._lock = threading.Lock()
        _settle_malloc()

    def run(self, request: tuple):
        """``method(*args)`` of ``request = (method, args, values)``: every released sum is
        this one call (`DaskStore._on_actors`), its arguments one object (serialised once).

        ``values`` are the driver's current values of the free variables the step does not
        sample (`DaskStore.follow`; None: it samples them all): the functions read them from
        their own copies of those variables, which are set before they are called
        (`_load`).
        """
        method, args, values = request
        if method not in ("map", "rows", "kept"):
            raise ValueError(f"unknown method {method!r}")  # a protocol error: no data
        with self._lock:
            if values is not None:
                self._values, self._synced = tuple(values), set()
            return getattr(self, method)(*args)

    def open_channel(self, secret: bytes, host: str) -> tuple[str, int] | None:
        """Listen on ``host`` (this worker's host, an ephemeral port) for the driver's
        channel (`DaskStore._open_channel`) and serve its calls in a thread of this actor;
        ``(host, port)``, or None if no socket could be opened there.

        One connection is accepted (within `_CHANNEL_TIMEOUT` seconds), and served only if
        its first bytes are ``secret`` (random, sent by the driver through Dask's own
        connection to this worker); the listener is then closed. A request is `run`'s
        ``(method, args, values)``, pickled; the answer is what `run` returns (partition
        results only), pickled, or the name of the type of its error (never its text). The
        thread ends when the driver closes the connection (`DaskStore.close`, or a
        driver that is gone).
        """
        try:
            listener = socket.create_server((host, 0), family=_family(host))
            listener.settimeout(_CHANNEL_TIMEOUT)
            port = listener.getsockname()[1]
        except OSError:
            return None
        threading.Thread(
            target=self._serve, args=(listener, bytes(secret)), daemon=True,
            name="pymc_dp-channel",
        ).start()  # fmt: skip
        return host, int(port)

    def _serve(self, listener, secret: bytes) -> None:
        try:
            with listener:
                conn, _ = listener.accept()
        except OSError:  # nobody connected in time: the driver uses Dask's route
            return
        with conn:
            try:
                conn.settimeout(_CHANNEL_TIMEOUT)
                if not hmac.compare_digest(bytes(_recv_exact(conn, len(secret))), secret):
                    return
                conn.settimeout(None)
                _nodelay(conn)
                _send_msg(conn, b"K", b"")
                while True:
                    kind, payload = _recv_msg(conn)
                    if kind != b"C":
                        return
                    try:
                        reply = (b"R", pickle.dumps(self.run(pickle.loads(payload)), protocol=5))
                    except Exception as err:  # noqa: BLE001 - only the type leaves the worker
                        reply = (b"E", type(err).__name__.encode())
                    payload = None
                    _send_msg(conn, *reply)
            except (OSError, EOFError, struct.error):  # the driver closed the channel
                return

    def _load(self, shipped):
        """The function of ``shipped = (token, pickled bytes or None)``; the bytes come with
        the first call that uses the token (and are compiled then), later calls send None.
        Its copies of the unsampled variables hold the values of the last call that sent
        them (`run`)."""
        token, blob = shipped
        if token not in self._fns:
            if blob is None:
                raise KeyError("function not loaded")  # a protocol error: no data involved
            self._fns[token] = pickle.loads(blob)
        fn, copies = self._fns[token]
        if copies and token not in self._synced:
            _set_shared(copies, self._values)
            self._synced.add(token)
        return fn

    def _prepare(self, shipped, j: int, chunk):
        token = shipped[0]
        cache = self._prepared.setdefault(token, {})
        if j not in cache:
            cache[j] = self._load(shipped)(*chunk)
        return cache[j]

    def map(self, fn, args: tuple, prepare=None) -> list:
        """``[(j, fn(*args, [prepared_j,] *partition_j)) for every partition j held]``."""
        return _guarded(self._map, fn, args, prepare)

    def _map(self, fn, args, prepare):
        f, args, out = self._load(fn), _aligned(args), []
        for j in self._index:
            chunk = self._parts[j]
            if prepare is None:
                out.append((j, f(*args, *chunk)))
            else:
                out.append((j, f(*args, self._prepare(prepare, j, chunk), *chunk)))
        return out

    def kept(self, fn, args: tuple, prepare, fill, old: str, new: str) -> list:
        """``[(j, fn(*args, [prepared_j,] l_old_j, *partition_j)[:-1] + (None,))]``, the
        last element of each result (``l_new_j``, per-record values) kept on this actor.

        ``l_old_j`` are the per-record values this actor keeps under the key ``old`` (from
        an earlier call) or, when it keeps none under that key (its first call, or a new
        actor after a lost worker), ``ll(q_old, *partition_j)`` with ``fill = (ll,
        q_old)``: the same numbers either way (a deterministic function of the point and
        the records). Afterwards the actor keeps the values under ``old`` and ``new`` only
        (those at the chain's current point and at the proposal: `LoglikMemo` on the
        driver names which it needs next). The kept values never leave the worker.
        """
        return _guarded(self._kept_map, fn, args, prepare, fill, old, new)

    def _kept_map(self, fn, args, prepare, fill, old, new):
        f, args, out = self._load(fn), _aligned(args), []
        have = self._kept.get(old)
        ll, q_old = self._load(fill[0]), _aligned([fill[1]])[0]
        l_old, l_new = {}, {}
        for j in self._index:
            chunk = self._parts[j]
            lo = have[j] if have is not None else np.asarray(ll(q_old, *chunk))
            if prepare is None:
                res = f(*args, lo, *chunk)
            else:
                res = f(*args, self._prepare(prepare, j, chunk), lo, *chunk)
            l_old[j], l_new[j] = lo, res[-1]
            out.append((j, (*res[:-1], None)))
        self._kept = {new: l_new, old: l_old}  # ``old`` wins when the two keys are equal
        return out

    def rows(self, fn, args: tuple, requests: list) -> list:
        """``[(j, fn(*args, inverse, row_args, *rows)) for (j, local, row_args) in requests]``:
        the rows ``local`` of partition ``j`` (each distinct one read once)."""
        return _guarded(self._rows, fn, args, requests)

    def _rows(self, fn, args, requests):
        f, args, out = self._load(fn), _aligned(args), []
        for j, local, row_args in requests:
            uniq, inverse = unique_rows(np.asarray(local))
            rows = [np.asarray(a)[uniq] for a in self._parts[j]]
            out.append((j, f(*args, inverse, tuple(_aligned(row_args)), *rows)))
        return out

    def malloc_settings(self) -> list[str]:
        """The glibc malloc settings of this worker's initial environment that make the
        per-record functions' temporary arrays fresh ``mmap``s (`_fixed_malloc_settings`;
        public configuration, no data)."""
        return _fixed_malloc_settings()

    def forget(self, token: str) -> None:
        """Drop a function and its prepared per-partition arrays."""
        with self._lock:
            self._fns.pop(token, None)
            self._prepared.pop(token, None)


class _Held:
    """Driver-side handle of one `PartitionActor`: its partitions and the tokens it has."""

    __slots__ = ("actor", "channel", "future", "index", "inline", "tokens")

    def __init__(self, future, index: list[int], inline: bool = False) -> None:
        self.future = future
        self.actor = future.result()
        self.index = index
        self.tokens: set[str] = set()
        #: run its calls in the worker's event loop (`DaskStore._inline_records`)
        self.inline = bool(inline)
        #: the store's socket to the actor (`DaskStore._open_channel`), or None
        self.channel: socket.socket | None = None

    def drop_channel(self) -> None:
        """Close the channel (its calls go by Dask's route from now on)."""
        sock, self.channel = self.channel, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()


_LOST = ("CancelledError", "FutureCancelledError", "FuturesCancelledError", "KilledWorker")

#: Records an actor may hold and still run its calls in its worker's event loop
#: (`DaskStore._inline_records`): small data, where a released sum costs about what its two
#: thread switches cost and pauses the worker's event loop for about a millisecond or less.
#: Measured (issue 28, twelfth session, 2 worker processes, load 10-14): the workers' CPU a
#: released sum 1.05-1.38 ms in the event loop against 1.51-1.80 ms in the actor thread at 4
#: records; at 10^6 records DPHMC's wall time was higher in the event loop in three of three
#: A/B runs (workers' CPU lower), so larger actors keep the actor thread.
_INLINE_RECORDS = 2**16

#: Times a call is retried after its actor was lost with its worker (each time on a new actor).
_MAX_RESTARTS = 3


def _lost_error(kind: str) -> RecordsLostError:
    return RecordsLostError(
        f"a partition of the records was lost with a Dask worker and could not be "
        f"recomputed from its source ({kind}); the run stopped. Give DaskRecords "
        "arrays built from a recomputable source (dask.array.from_array, from_zarr, "
        "...) rather than data scattered to one worker"
    )


def _task_error(kind: str) -> RuntimeError:
    return RuntimeError(
        f"a task on a Dask worker failed ({kind}); its message is not shown because it "
        "could contain record values. Reproduce the failure on stand-in data"
    )


async def _execute_direct(rpc, targets: list) -> list:
    """Call ``PartitionActor.run(request)`` of every ``(address, key, request, inline)``
    target at once, straight to the worker at ``address`` (its ``actor_execute`` handler,
    the request pickled as one argument; ``inline``: in the worker's event loop, Dask's
    ``separate_thread=False``); every result or exception, in order."""
    import asyncio

    from distributed.protocol import to_serialize

    async def one(address, key, request, inline=False):
        kwargs = {"separate_thread": False} if inline else {}
        try:
            msg = await rpc(address).actor_execute(
                function="run", actor=key, args=[to_serialize(request)], kwargs=kwargs
            )
        except Exception as err:  # noqa: BLE001 - classified by the caller
            return err
        if msg.get("status") == "OK":
            return msg["result"]
        err = msg.get("exception")
        return err if isinstance(err, BaseException) else RuntimeError("actor call failed")

    return list(await asyncio.gather(*(one(*t) for t in targets)))


def _actor_alive(held: _Held) -> bool:
    """Whether the scheduler still has the actor (its worker was not lost)."""
    return getattr(held.future, "status", None) in ("finished", "pending")


def _actor_lost(err: BaseException) -> bool:
    """Whether an actor call failed because its worker is gone (not because of the data)."""
    if isinstance(err, OSError) or type(err).__name__ in _LOST:
        return True
    return isinstance(err, RuntimeError) and "Actor was lost" in str(err)


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
        self._blobs: dict[int, tuple[Any, str, bytes]] = {}
        #: the shared variables of the unsampled free variables (`follow`)
        self._shared: tuple = ()
        #: An actor holding at most this many records runs its calls in its worker's event
        #: loop (Dask's ``separate_thread=False``) instead of handing each to the worker's
        #: actor thread and back (two thread switches a call, each a wait for a core on a
        #: loaded host); the call then blocks that worker's event loop while it computes,
        #: which at this size is about a millisecond or less (`_INLINE_RECORDS`).
        self._inline_records = _INLINE_RECORDS
        self._actors: list[_Held] | None = None
        #: Call the actors straight on their workers (`_send`), unless the client was made
        #: with ``direct_to_workers=False`` or a direct call could not connect.
        self._direct = getattr(client, "direct_to_workers", None) is not False
        #: Open a channel to every actor (`_open_channel`) where the workers allow it.
        self._use_channel = _CHANNEL
        self._channel_lock = threading.Lock()

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
            shipped = self._pickled(fn)
            self._shipped[key] = (fn, self._client.submit(_identity, shipped, pure=False))
        return self._shipped[key][1]

    def _gather(self, futures):
        failure = None
        try:
            return self._client.gather(futures)
        except Exception as err:  # noqa: BLE001 - classified below, its text is not shown
            failure = err
        lost = isinstance(failure, CancelledError) or type(failure).__name__ in _LOST
        kind = type(failure).__name__
        failure = None  # drop the worker's exception (its text could hold record values)
        if lost:
            raise _lost_error(kind)
        raise _task_error(kind)

    # -- the actor protocol ------------------------------------------------------------------------
    def _pickled(self, fn) -> tuple[str, bytes]:
        """``(token, pickled bytes)`` of ``fn``, made once per object (kept alive here).

        The bytes hold ``(fn, shared)``, ``shared`` the variables `follow` names, pickled
        together so that the copies loaded on a worker are the very variables the loaded
        ``fn`` reads (pickle keeps shared references within one pickle): setting them there
        to the values shipped with each call (`_shared_values`) moves the worker's ``fn``
        with the chain."""
        key = id(fn)
        if key not in self._blobs:
            self._blobs[key] = (fn, uuid.uuid4().hex, pickle.dumps((fn, self._shared)))
        return self._blobs[key][1:]

    def follow(self, shared: Sequence[Any]) -> None:
        """Keep the workers' copies of the shared variables ``shared`` at their driver values.

        ``shared`` are the PyTensor shared variables that stand for the free variables a step
        does not sample (`pymc.pytensorf.make_shared_replacements`): in a ``CompoundStep``
        another step changes them between this step's releases (PyMC's
        ``ArrayStepShared`` sets them on the driver). A function pickled to a worker carries
        its own copies of them, frozen at their values when it was pickled; so every call
        ships their current values (`_shared_values`, a few parameters: no extra message)
        and the worker sets its copies before evaluating (`PartitionActor.run`,
        `_own_copy`). Call before any function is shipped (`build_record_functions` does).
        Parameters only: no data is read.
        """
        if self._blobs:
            raise RuntimeError("follow() must be called before any function is shipped")
        self._shared = tuple(shared)

    def _shared_values(self) -> tuple | None:
        """The driver's current values of the variables `follow` names (None: none)."""
        if not self._shared:
            return None
        return parameter_values(self._shared)

    def _start_actor(self, index: list[int], worker: str | None) -> _Held:
        """A `PartitionActor` holding the partitions ``index`` (on ``worker`` if it lives)."""
        flat = [f for j in index for f in self._parts[j]]
        failure = None
        try:
            fut = self._client.submit(
                PartitionActor,
                index,
                len(self._parts[0]),
                *flat,
                actor=True,
                pure=False,
                **({} if worker is None else {"workers": [worker], "allow_other_workers": True}),
            )
            records = sum(self.partition_sizes[j] for j in index)
            held = _Held(fut, index, inline=records <= self._inline_records)
        except Exception as err:  # noqa: BLE001 - classified below, its text is not shown
            failure = err
        if failure is not None:
            kind = type(failure).__name__
            lost = _actor_lost(failure)
            failure = None  # the text of a failed read of the partitions could hold values
            raise _lost_error(kind) if lost else _task_error(kind)
        if self._use_channel:
            self._open_channel(held)
        return held

    def _open_channel(self, held: _Held) -> None:
        """Connect the store's own socket to the actor (`PartitionActor.open_channel`):
        from then on its calls are pickled requests on that socket, written and read in
        this thread (`_send_channel`), without Dask's event loops, message framing,
        serialisation layers and thread hand-offs on either side. Measured (issue 28,
        thirteenth session, 2 worker processes, PyMC 6 line, 4 partitions of 1 record, A/B
        on one cluster): 0.29 ms of wall and 0.13 ms of driver CPU a released sum against
        1.8-3.9 ms and 1.2-1.4 ms by Dask's comm (docs/benchmarks.md, section 7). Only for
        workers on plain TCP or in this process (`_CHANNEL_SCHEMES`); the secret that
        authenticates the connection travels through Dask's connection. A channel that
        cannot be opened leaves the actor on Dask's route (same sums), and so does a
        request that the standard pickle cannot serialise."""
        from distributed.comm.addressing import parse_address, parse_host_port

        sock = None
        try:
            scheme, loc = parse_address(held.actor._address)
            if scheme not in _CHANNEL_SCHEMES:
                return
            host = parse_host_port(loc)[0] if scheme == "tcp" else "127.0.0.1"
            secret = os.urandom(32)
            where = held.actor.open_channel(secret, host).result()
            if where is None:
                return
            sock = socket.create_connection(tuple(where), timeout=_CONNECT_TIMEOUT)
            sock.sendall(secret)
            if _recv_msg(sock)[0] != b"K":
                raise ConnectionError("the actor refused the channel")
            sock.settimeout(None)
            _nodelay(sock)
            held.channel, sock = sock, None
        except Exception:  # noqa: BLE001 - no channel: Dask's route (a protocol fact, no data)
            return
        finally:
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()

    def _placement(self) -> list[tuple[str | None, list[int]]]:
        """Which partitions each actor holds: the partitions a worker has stay there, as
        evenly spread as their count allows (public: placement, not values)."""
        from distributed import wait

        failure = None
        try:
            wait([f for p in self._parts for f in p])
            who = self._client.who_has([p[0] for p in self._parts])
            workers = sorted(self._client.scheduler_info()["workers"])
        except Exception as err:  # noqa: BLE001 - classified below
            failure = err
        if failure is not None:
            kind = type(failure).__name__
            lost = _actor_lost(failure)
            failure = None
            raise _lost_error(kind) if lost else _task_error(kind)
        if not workers:
            return [(None, list(range(self.n_partitions)))]
        cap = -(-self.n_partitions // len(workers))
        mine: dict[str, list[int]] = {w: [] for w in workers}
        rest = []
        for j, p in enumerate(self._parts):
            holders = [w for w in who.get(p[0].key, ()) if w in mine and len(mine[w]) < cap]
            (mine[holders[0]] if holders else rest).append(j)
        for j in rest:
            min(mine.values(), key=len).append(j)
        return [(w, sorted(js)) for w, js in mine.items() if js]

    def _actor_pool(self) -> list[_Held]:
        if self._actors is None:
            self._actors = [self._start_actor(js, w) for w, js in self._placement()]
            self._check_malloc()
        return self._actors

    def _check_malloc(self) -> None:
        """Warn once if a worker runs with glibc settings that fix its malloc thresholds
        (advisory: the workers' environment is the user's, pymc_dp does not change it)."""
        found: set[str] = set()
        for held in self._actors or []:
            with contextlib.suppress(Exception):  # advisory only: a lost actor is restarted later
                found.update(held.actor.malloc_settings().result())
        if found:
            warnings.warn(
                f"the Dask workers run with {', '.join(sorted(found))}, which turns off glibc's "
                "adaptive mmap threshold: every temporary array of a per-record function is a "
                "fresh mmap, and each released sum pays its page faults (measured: about twice "
                "the CPU of the same sum in one process at 250 000 records a partition). Dask's "
                "nanny sets MALLOC_TRIM_THRESHOLD_=65536 by default; start the cluster with "
                "dask.config.set({'distributed.nanny.pre-spawn-environ': {...}}) without it "
                "to avoid this (docs/scaling-out.md, 'The workers' allocator'); pymc_dp does "
                "not change the workers' environment",
                WorkerMallocWarning,
                stacklevel=2,
            )

    def _restart(self, i: int) -> None:
        """Start actor ``i`` again (its worker was lost) on the live worker with the fewest
        actors; Dask recomputes the lost partitions from their source."""
        old = self._actors[i]
        old.drop_channel()
        try:
            workers = sorted(self._client.scheduler_info()["workers"])
        except Exception:  # noqa: BLE001 - the scheduler is unreachable: place anywhere
            workers = []
        used = [getattr(h.actor, "_address", None) for k, h in enumerate(self._actors) if k != i]
        worker = min(workers, key=used.count) if workers else None
        self._actors[i] = self._start_actor(old.index, worker)

    def _on_actors(self, method: str, make_args: Callable[[_Held, Callable], tuple | None]):
        """Call ``method`` of every actor at once (one message each, straight to its
        worker: `_send`) and return ``{partition: result}``.

        ``make_args(held, ship)`` gives the call's arguments for one actor (None: nothing
        for it to do); ``ship(fn)`` is ``fn``'s token, with its bytes if that actor has not
        loaded it yet. An actor lost with its worker is started again and asked again (at
        most `_MAX_RESTARTS` times); a function that fails on a worker stops the run.
        """
        self._check_client()
        pool = self._actor_pool()
        values = self._shared_values()
        results: dict[int, Any] = {}
        todo = list(range(len(pool)))
        for _attempt in range(_MAX_RESTARTS + 1):
            sent = []
            for i in todo:
                held, new = self._actors[i], set()

                def ship(fn, held=held, new=new):
                    token, blob = self._pickled(fn)
                    new.add(token)
                    return (token, None if token in held.tokens else blob)

                args = make_args(held, ship)
                if args is None:
                    continue
                sent.append((i, held, new, args))
            outs = self._send(method, [(held, args) for _, held, _, args in sent], values)
            failed = []
            for (i, held, new, _), out in zip(sent, outs, strict=True):
                if isinstance(out, BaseException):
                    lost, kind = _actor_lost(out), type(out).__name__
                    out = None  # its text could hold record values
                    if not lost:
                        raise _task_error(kind)
                    failed.append(i)
                    continue
                held.tokens |= new
                results.update(self._receive(out))
            if not failed:
                return results
            for i in failed:
                self._restart(i)
            todo = failed
        raise _lost_error("the worker holding an actor was lost repeatedly")

    def _send(self, method: str, calls: list[tuple[_Held, tuple]], values=None) -> list:
        """``PartitionActor.run((method, args, values))`` on every ``(held, args)`` at once
        (``values``: `_shared_values`); each call's result or its exception, in order.

        An actor with a channel (`_open_channel`, the default on TCP and in-process
        workers) gets its call on that socket, written and read in this thread
        (`_send_channel`). The others go by Dask's comm (`_send_dask`):

        Direct (the default there): one coroutine on the client's event loop sends every call
        straight to its actor's worker over the client's connection pool (Dask's
        ``actor_execute`` handler, what an `Actor` method does when the client connects to
        workers directly) and gathers the answers: one hand-over to the event loop per
        released sum. An ``Actor`` method call of a client with Dask's default
        ``direct_to_workers=None`` goes through the scheduler instead (its ``proxy``
        handler: two more messages a call, and on a ``LocalCluster`` the scheduler runs in
        the driver process), and each answer is waited for separately. Measured (issue 28,
        2 worker processes, tiny data, A/B on one cluster): 1.5-3.8 ms of driver CPU a
        released sum against 2.5-5.9 ms through the scheduler. A client created with
        ``direct_to_workers=False`` (workers it cannot reach) keeps the scheduler route, and
        so does a store whose direct call failed to connect while the scheduler still
        reached the actor.
        """
        if not calls:
            return []
        wired = [k for k, (held, _) in enumerate(calls) if held.channel is not None]
        if not wired:
            return self._send_dask(method, calls, values)
        outs: list = [None] * len(calls)
        got = self._send_channel(method, [calls[k] for k in wired], values)
        for k, out in zip(wired, got, strict=True):
            outs[k] = out
        rest = [k for k in range(len(calls)) if k not in set(wired)]
        later = self._send_dask(method, [calls[k] for k in rest], values)
        for k, out in zip(rest, later, strict=True):
            outs[k] = out
        return outs

    def _send_channel(self, method: str, calls: list[tuple[_Held, tuple]], values) -> list:
        """`_send` over the actors' channels (`_open_channel`): every request written, then
        every answer read, in this thread. A channel that fails is closed and its call sent
        again by Dask's route (a sum is deterministic: asking again releases nothing more)
        while the scheduler still has the actor; otherwise the error is returned (a lost
        worker: `_on_actors` restarts the actor). Anything else that interrupts the exchange
        (e.g. ``KeyboardInterrupt``) closes the channels it used, so that no answer can be
        read as that of a later call."""
        try:
            requests = [pickle.dumps((method, args, values), protocol=5) for _, args in calls]
        except Exception:  # noqa: BLE001 - not picklable here: Dask's serialisation
            return self._send_dask(method, calls, values)
        outs: list = [None] * len(calls)
        with self._channel_lock:
            try:
                for k, (held, _) in enumerate(calls):
                    try:
                        _send_msg(held.channel, b"C", requests[k])
                    except OSError as err:
                        outs[k] = err
                for k, (held, _) in enumerate(calls):
                    if outs[k] is not None:
                        continue
                    try:
                        kind, payload = _recv_msg(held.channel)
                    except OSError as err:
                        outs[k] = err
                        continue
                    if kind == b"R":
                        outs[k] = pickle.loads(payload)
                    else:  # the type of the worker's error only
                        kind = payload.decode(errors="replace")
                        outs[k] = RemoteTaskError(f"a pymc_dp task failed on a worker ({kind})")
            except BaseException:
                for held, _ in calls:
                    held.drop_channel()
                raise
        for k, out in enumerate(outs):
            if isinstance(out, OSError):
                held = calls[k][0]
                held.drop_channel()
                if _actor_alive(held):
                    outs[k] = self._send_dask(method, [calls[k]], values)[0]
        return outs

    def _send_dask(self, method: str, calls: list[tuple[_Held, tuple]], values=None) -> list:
        """`_send` by Dask's comm (straight to the workers, or through the scheduler)."""
        if not calls:
            return []
        if self._direct:
            targets = [
                (h.actor._address, h.actor.key, (method, args, values), h.inline)
                for h, args in calls
            ]
            try:
                outs = self._client.sync(_execute_direct, self._client.rpc, targets)
            except Exception as err:  # noqa: BLE001 - e.g. the client's loop is closing
                outs = [err] * len(calls)
            for k, out in enumerate(outs):
                if isinstance(out, OSError) and _actor_alive(calls[k][0]):
                    # not reachable directly, reachable through the scheduler: use that
                    retry = self._send_proxied(method, [calls[k]], values)[0]
                    if not isinstance(retry, BaseException):  # answered: keep that route
                        self._direct = False
                    outs[k] = retry
            return outs
        return self._send_proxied(method, calls, values)

    def _send_proxied(self, method: str, calls: list[tuple[_Held, tuple]], values=None) -> list:
        """`_send` through the `Actor` handles (the scheduler's proxy unless the client
        connects to workers directly)."""
        futs = []
        for held, args in calls:
            try:
                kw = {"separate_thread": False} if held.inline else {}
                futs.append(held.actor.run((method, args, values), **kw))
            except Exception as err:  # noqa: BLE001 - the actor's worker is gone
                futs.append(err)
        outs = []
        for fut in futs:
            try:
                outs.append(fut if isinstance(fut, BaseException) else fut.result())
            except Exception as err:  # noqa: BLE001 - classified by the caller
                outs.append(err)
        return outs

    def _receive(self, out: list) -> list:
        """The ``(partition, result)`` pairs an actor returned: partition results only."""
        return out

    def close(self) -> None:
        """Release the actors (and with them the functions and prepared arrays they hold).

        Optional: they are released too when the store is garbage-collected."""
        actors, self._actors = self._actors, None
        for held in actors or []:
            held.drop_channel()
        if actors and getattr(self._client, "status", None) == "running":
            self._client.cancel([h.future for h in actors])

    def _prepare_futures(self, prepare) -> list:
        key = id(prepare)
        if key not in self._prepared:
            f = self._ship(prepare)
            futs = [
                self._client.submit(_call, f, self._shared_values(), (), *p, pure=False)
                for p in self._parts
            ]
            self._prepared[key] = (prepare, futs)
        return self._prepared[key][1]

    def forget(self, prepare) -> None:
        """Drop the per-partition arrays of ``prepare`` from the cluster (if any)."""
        entry = self._prepared.pop(id(prepare), None)
        shipped = self._shipped.pop(id(prepare), None)
        blob = self._blobs.pop(id(prepare), None)
        futures = (entry[1] if entry is not None else []) + (
            [shipped[1]] if shipped is not None else []
        )
        running = getattr(self._client, "status", None) == "running"
        if futures and running:
            self._client.cancel(futures)
        if blob is not None and running:
            token = blob[1]
            for held in self._actors or []:
                if token in held.tokens:
                    held.tokens.discard(token)
                    with contextlib.suppress(Exception):  # a lost actor holds nothing
                        held.actor.forget(token)

    def _partition_futures(self, fn, args, prepare) -> list:
        self._check_client()
        f, values = self._ship(fn), self._shared_values()
        if prepare is None:
            return [
                self._client.submit(_call, f, values, tuple(args), *p, pure=False)
                for p in self._parts
            ]
        preps = self._prepare_futures(prepare)
        return [
            self._client.submit(_call_prepared, f, values, tuple(args), preps[j], *p, pure=False)
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
        args = tuple(args)
        if prepare is None:
            out = self._on_actors("map", lambda held, ship: (ship(fn), args))
        else:
            out = self._on_actors("map", lambda held, ship: (ship(fn), args, ship(prepare)))
        return functools.reduce(reduce, (out[j] for j in range(self.n_partitions)), init)

    def map_reduce_kept(
        self,
        fn: Callable[..., Any],
        reduce: Callable[[Any, Any], Any],
        init: Any,
        *,
        args: tuple = (),
        prepare: Callable[..., Any] | None = None,
        fill: tuple[Callable[..., Any], np.ndarray],
        old: str,
        new: str,
    ):
        """`map_reduce` with per-record values kept on the workers between calls.

        ``fn(*args, [prepared_j,] l_old_j, *partition_j)`` on every partition (on its
        worker), where ``l_old_j`` are the partition's values kept under the key ``old``
        by an earlier call, or ``fill[0](fill[1], *partition_j)`` where they are not kept
        (`PartitionActor.kept`); the last element of ``fn``'s result (``l_new_j``) stays on
        the worker under the key ``new`` and is returned as None. The counterpart of
        `InMemoryRecords.map_reduce` with ``per_chunk`` (`pymc_dp.records.LoglikMemo`): the
        same numbers, with the per-record values never leaving the workers.
        """
        args, fill = tuple(args), (fill[0], np.asarray(fill[1]))

        def make_args(held, ship):
            shipped = (ship(fill[0]), fill[1])
            return (ship(fn), args, None if prepare is None else ship(prepare), shipped, old, new)

        out = self._on_actors("kept", make_args)
        return functools.reduce(reduce, (out[j] for j in range(self.n_partitions)), init)

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
        if not split:
            return init
        args = tuple(args)
        wanted = {j: (j, local, ra) for j, local, ra in split}

        def make_args(held, ship):
            mine = [wanted[j] for j in held.index if j in wanted]
            return (ship(fn), args, mine) if mine else None

        out = self._on_actors("rows", make_args)
        return functools.reduce(reduce, (out[j] for j in sorted(wanted)), init)

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

    def any_nan(self, which: list[bool]) -> bool:
        """Whether a float array flagged in ``which`` holds a NaN (one bit per partition)."""
        return bool(self.map_reduce(_any_nan, lambda a, b: a or b, False, args=(list(which),)))
