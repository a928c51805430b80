"""Records on a Dask cluster (pymc_dp.distributed): same draws as in memory, bad input, the
data-sharing scheme (Yildirim & Ermis 2019, Algorithm 2) and lost workers.

The tests run on real ``dask.distributed`` ``LocalCluster``s: in-process workers
(``processes=False``) except for the fault tests, which kill a worker process.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pymc as pm
import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask[distributed] is not installed (pip install pymc_dp[distributed])"
)
da = pytest.importorskip("dask.array", reason="dask[array] is not installed")
import dask  # noqa: E402

import pymc_dp  # noqa: E402
from pymc_dp.accounting import GaussianEvent, compose_epsilon  # noqa: E402
from pymc_dp.distributed import DaskRecords, RecordsLostError, WorkerMallocWarning  # noqa: E402
from pymc_dp.records import dask_store  # noqa: E402
from pymc_dp.report import _get_group as _group  # noqa: E402

N, PART = 1200, 300
RUN = dict(draws=8, tune=4, chains=2, progressbar=False, compute_convergence_checks=False)
PLAN = {k: RUN[k] for k in ("draws", "tune", "chains")}  # the run a step is calibrated for


def _data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = np.clip(rng.normal(size=(n, 2)), -3, 3)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ [1.0, -0.5])))).astype("int64")
    return X, y


def _model(X, y):
    with pm.Model() as m:
        Xd = pm.Data("X", X)
        b = pm.Normal("b", 0.0, 3.0, shape=2)
        pm.Bernoulli("y", logit_p=Xd @ b, observed=y)
    return m


def _records(client, X, y, chunk=PART, **kw):
    return DaskRecords(
        client,
        {"X": da.from_array(X, chunks=(chunk, 2)), "y": da.from_array(y, chunks=chunk)},
        **kw,
    )


@contextlib.contextmanager
def _cluster(processes: bool):
    """A client of a 2-worker LocalCluster (one thread per worker)."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=processes, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def client():
    with _cluster(processes=False) as c:
        yield c


STEPS = [
    (pymc_dp.DPPenaltyMetropolis, {"clip_bound": 5.0}),
    (pymc_dp.DPHMC, {"llr_clip_bound": 5.0, "grad_clip_bound": 5.0, "n_leapfrog": 3}),
]


@pytest.mark.parametrize("step,kwargs", STEPS, ids=["penalty", "dphmc"])
def test_dask_draws_equal_the_in_memory_run_with_the_same_chunks(client, step, kwargs):
    X, y = _data()
    with _model(X, y):
        local = pymc_dp.sample(
            step=step,
            epsilon=5.0,
            delta=1e-5,
            step_kwargs={**kwargs, "chunk_size": PART},
            random_seed=7,
            **RUN,
        )
    # the model holds a 10-record stand-in; the records live on the cluster
    with _model(X[:10], y[:10]):
        remote = pymc_dp.sample(
            step=step,
            epsilon=5.0,
            delta=1e-5,
            step_kwargs=kwargs,
            records=_records(client, X, y),
            random_seed=7,
            **RUN,
        )
    np.testing.assert_array_equal(local.posterior["b"].values, remote.posterior["b"].values)
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    assert b.owners == 0 and b.noise_variance_factor == 1
    assert b.raw_data_groups == () and _group(remote, "observed_data") is None


def test_a_different_partitioning_gives_different_sums_only_by_rounding(client):
    """The partition sums are combined in partition order: a different chunking changes the
    sum by rounding only (the equality above is not an accident of one chunk)."""
    X, y = _data()
    with _model(X[:10], y[:10]) as m:
        s1 = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y, chunk=300)
        )
        s2 = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y, chunk=250)
        )
    with _model(X, y):
        s0 = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=1.0)
    q0, q1 = np.array([0.1, 0.2]), np.array([0.3, -0.1])
    r0 = s0._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    r1 = s1._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    r2 = s2._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0]
    assert r1 == pytest.approx(r0, rel=1e-12) and r2 == pytest.approx(r0, rel=1e-12)
    del m


def test_sorted_route_on_dask_gives_the_in_memory_sums(client):
    """Issue 28: each partition sorts its records by group where it lives (the sorted
    route's data-only arrays, kept there); the partition sums equal the in-memory run's with
    the same chunks to rounding."""
    rng = np.random.default_rng(3)
    g, y = rng.integers(0, 5, N), rng.normal(size=N)

    def model(gv, yv):
        with pm.Model() as m:
            gi = pm.Data("g", gv)
            a = pm.Normal("a", 0.0, 1.0, shape=5)
            s = pm.HalfNormal("s", 1.0)
            pm.Normal("y", a[gi], s, observed=yv)
        return m

    kw = dict(llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0)
    kw["grad_noise_multiplier"] = 1.0
    recs = DaskRecords(
        client, {"g": da.from_array(g, chunks=PART), "y": da.from_array(y, chunks=PART)}
    )
    with model(g[:10], y[:10]):
        on_dask = pymc_dp.DPHMC(records=recs, **kw)
    with model(g, y):
        in_memory = pymc_dp.DPHMC(chunk_size=PART, **kw)
    q = np.linspace(-0.5, 0.5, 6)
    want = in_memory._fns.clipped_grad_sum(q, 0.3)[0]
    got = on_dask._fns.clipped_grad_sum(q, 0.3)[0]
    assert on_dask._fns.gradient_route == in_memory._fns.gradient_route == "sorted"
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


# -- the per-iteration protocol (issue 28): actors, one message per worker per released sum ----


def _every_release(fns, idx):
    """Every sum the runtime releases (and the start check), at fixed public arguments; the
    residual sums at two anchors, so that the first anchor's arrays are forgotten."""
    from pymc_dp.kernels.subsampled_penalty import clipped_moments, merge_moments

    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    m = np.array([[1.5, 0.2], [0.0, 0.7]])
    fns.check_start(q0)
    out = {
        "llr": fns.clipped_loglik_ratio_sum(q1, q0, 0.3),
        "grad": fns.clipped_grad_sum(q1, 0.4),
        "residual": fns.clipped_residual_ratio_sum(q1, q0, 0.05, q0, 0.5),
        "residual2": fns.clipped_residual_ratio_sum(q0, q1, 0.05, q1, 0.5, transform=m),
        "moments": fns.clipped_grad_moments(q1, 0.4, transform=m, outer_bound=0.3, centre=q0),
        "norm_counts": fns.grad_norm_counts(q1, np.linspace(0.05, 2.0, 7)),
        "grad_rows": fns.clipped_grad_sum_subset(q1, 0.4, idx),
        "ratio_rows": fns.ratio_subset_terms(
            q1, q0, idx, clipped_moments, merge_moments, params=(0.05,)
        ),
    }
    return out


def _flatten(v):
    if isinstance(v, tuple | list):
        return [x for item in v for x in _flatten(item)]
    return [np.asarray(v, dtype=float)]


def _remote_and_in_memory_releases(client):
    """An in-memory DPHMC, a DPHMC on the records in ``client``'s partitions, every kind
    of release of the first at the same points (the same chunks), and those points."""
    X, y = _data()
    idx = np.random.default_rng(5).integers(0, N, size=450)  # repeats, every partition
    kw = dict(llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0)
    kw["grad_noise_multiplier"] = 1.0
    with _model(X, y):
        local = pymc_dp.DPHMC(chunk_size=PART, **kw)
    with _model(X[:10], y[:10]):
        remote = pymc_dp.DPHMC(records=_records(client, X, y), **kw)
    return local, remote, _every_release(local._fns, idx), idx


def test_actor_protocol_gives_the_in_memory_sums_of_every_release(client, monkeypatch):
    """Each released sum (every kind the steps and the automatic mode use) is the in-memory
    store's number with the same chunks, exactly: the same compiled functions, the same
    partitions, the partition sums added in partition order. After the first calls (actors
    started, functions sent), a released sum submits no task (no scheduler round trip) and
    sends one message to each actor."""
    from pymc_dp.records import dask_store

    local, remote, want, idx = _remote_and_in_memory_releases(client)
    _every_release(remote._fns, idx)  # warm-up: actors started, functions sent

    calls = {"submit": 0, "map": 0, "rows": 0}
    real_submit = client.submit

    def submit(*a, **k):
        calls["submit"] += 1
        return real_submit(*a, **k)

    for name in ("map", "rows"):
        real = getattr(dask_store.PartitionActor, name)

        def counted(self, *a, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *a)

        monkeypatch.setattr(dask_store.PartitionActor, name, counted)
    monkeypatch.setattr(client, "submit", submit)
    got = _every_release(remote._fns, idx)
    store = remote._fns.records
    n_actors = len(store._actors)
    assert n_actors == 2 and sorted(j for h in store._actors for j in h.index) == [0, 1, 2, 3]
    assert calls["submit"] == 0
    assert calls["map"] == 7 * n_actors and calls["rows"] == 2 * n_actors
    # the residual sums use prepared per-partition arrays (the anchor gradients, kept on the
    # actors, forgotten at the second anchor); the sorted route test below a route's own
    assert local._fns.gradient_route == remote._fns.gradient_route
    for key in want:
        if key in ("moments", "norm_counts"):  # no count of clipped records
            w, g = _flatten(want[key]), _flatten(got[key])
        else:  # (sums, count of clipped records): the count stays on the workers (0)
            w, g = _flatten(want[key][0]), _flatten(got[key][0])
            assert all(np.all(c == 0) for c in _flatten(got[key][1])), key
        assert len(w) == len(g)
        for a, b in zip(w, g, strict=True):
            np.testing.assert_array_equal(a, b, err_msg=key)
    assert want["norm_counts"].sum() > 0 and got["residual"][0] != got["residual2"][0]


def _fails_on_the_data(*chunk):
    """A per-chunk function that fails with record values in its message."""
    raise ValueError(f"secret record value {float(np.asarray(chunk[0]).ravel()[0])!r}")


def test_a_function_failing_on_a_worker_names_only_its_type(client):
    X, y = _data()
    recs = _records(client, X, y)
    store = recs.store_for(["X", "y"], [(np.dtype("float64"), (2,)), (np.dtype("int64"), ())])
    with pytest.raises(RuntimeError, match=r"failed \(RemoteTaskError\)") as info:
        store.map_reduce(_fails_on_the_data, lambda a, b: b, None)
    text = str(info.value) + repr(info.value.__cause__) + repr(info.value.__context__)
    assert "secret" not in text and repr(float(X[0, 0])) not in text
    store.close()


def _count_actor_calls(monkeypatch, *names):
    """Count the calls of `PartitionActor` methods (in-process workers: the same class)."""
    calls = dict.fromkeys(names, 0)
    for name in names:
        real = getattr(dask_store.PartitionActor, name)

        def counted(self, *a, _real=real, _name=name):
            calls[_name] += 1
            return _real(self, *a)

        monkeypatch.setattr(dask_store.PartitionActor, name, counted)
    return calls


def test_fused_pass_on_dask_gives_the_in_memory_sums_in_one_message_per_worker(client, monkeypatch):
    """Issue 28: DP-HMC's last gradient pass and its ratio release in one pass on the
    cluster. The per-record log-likelihoods stay on the workers (`KeptOnWorkers`), computed
    there at the old point when not kept; both releases are one message to each actor and
    give the in-memory fused pass's sums with the same chunks, exactly, whether the values
    were kept or computed (a fresh handle at the same point), and the kept-ratio release
    likewise."""
    from pymc_dp.records.runtime import KeptOnWorkers

    X, y = _data()
    kw = dict(llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0)
    kw.update(grad_noise_multiplier=1.0)
    with _model(X, y):
        local = pymc_dp.DPHMC(chunk_size=PART, **kw)
    with _model(X[:10], y[:10]):
        remote = pymc_dp.DPHMC(records=_records(client, X, y), **kw)
    local.fuse_ratio_pass = remote.fuse_ratio_pass = True
    assert remote.fuses_ratio_pass and remote._fns.keeps_remotely and remote._fns.fused_pays
    q0, q1, q2 = np.array([0.1, 0.2]), np.array([0.9, -0.8]), np.array([0.4, -0.1])

    def passes(fns):
        l0 = fns.loglik_chunks(q0)
        first = fns.clipped_grad_and_ratio_sum_kept(q1, 0.4, l0, 0.3)
        second = fns.clipped_grad_and_ratio_sum_kept(q2, 0.4, first[-1], 0.2)
        third = fns.clipped_loglik_ratio_sum_kept(q0, second[-1], 0.25)
        return [first[:-1], second[:-1], third[:-1]]

    want = passes(local._fns)
    remote._fns.check_start(q0)  # actors started
    calls = _count_actor_calls(monkeypatch, "map", "kept", "rows")
    got = passes(remote._fns)
    n_actors = len(remote._fns.records._actors)
    assert calls == {"map": 0, "kept": 3 * n_actors, "rows": 0}  # one message per release
    for w, g in zip(want, got, strict=True):
        for a, b in zip(_flatten(w), _flatten(g), strict=True):
            if a.ndim == 0 and b == 0 and a != 0:  # a count: it stays on the workers
                continue
            np.testing.assert_array_equal(a, b)
    # not kept (a new actor, or the first release of a chain): computed where the records
    # are, the same numbers
    fresh = remote._fns.clipped_grad_and_ratio_sum_kept(q2, 0.4, KeptOnWorkers(q1), 0.2)
    for a, b in zip(_flatten(want[1]), _flatten(fresh[:-1]), strict=True):
        if not (a.ndim == 0 and b == 0 and a != 0):
            np.testing.assert_array_equal(a, b)
    assert want[0][0].any() and want[0][2] != 0.0  # non-trivial sums


def test_dphmc_on_dask_fuses_the_ratio_pass_and_draws_equal_the_in_memory_run(client, monkeypatch):
    """Issue 28: a DP-HMC iteration on the cluster is ``L`` messages to each actor (the
    first gradient kept from the last trajectory, the ratio release fused into the last
    gradient pass), ``L + 1`` before; its draws and privacy account are those of the
    in-memory run with the same chunks and the fused pass, and of the unfused cluster run."""
    X, y = _data()
    L = 3
    kw = dict(llr_clip_bound=0.5, grad_clip_bound=0.5, n_leapfrog=L)

    def run(records=None, fuse=None, **extra):
        step_kwargs = {**kw, **extra}
        monkeypatch.setattr(pymc_dp.DPHMC, "fuse_ratio_pass", fuse)
        with _model(X[:10], y[:10]) if records is not None else _model(X, y):
            return pymc_dp.sample(
                step=pymc_dp.DPHMC, epsilon=5.0, delta=1e-5, step_kwargs=step_kwargs,
                records=records, random_seed=11, **RUN,
            )  # fmt: skip

    local = run(chunk_size=PART, fuse=True)
    recs = _records(client, X, y)
    calls = _count_actor_calls(monkeypatch, "map", "kept")
    remote = run(recs)
    iterations = RUN["chains"] * (RUN["draws"] + RUN["tune"])
    n_actors = 2  # one per worker (2 workers, 4 partitions)
    # per chain: the start gradient once, then L messages an iteration (L - 1 gradient
    # passes and the fused pass); the start checks are `map` calls too (a few per chain)
    assert calls["kept"] == iterations * n_actors
    per_iteration = (calls["map"] + calls["kept"]) / n_actors / iterations
    assert L <= per_iteration < L + 1
    unfused = run(_records(client, X, y), fuse=False)
    np.testing.assert_array_equal(local.posterior["b"].values, remote.posterior["b"].values)
    np.testing.assert_allclose(
        unfused.posterior["b"].values, remote.posterior["b"].values, rtol=1e-12, atol=1e-12
    )
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    assert b.releases == iterations * (L + 2)


def test_actor_calls_go_straight_to_the_workers_unless_the_client_says_otherwise(
    client, monkeypatch
):
    """A released sum is sent to every actor's worker directly, all at once
    (`dask_store._execute_direct`), not through the actors' `Actor` handles (which go
    through the scheduler's proxy when the client has Dask's default
    ``direct_to_workers=None``); a client made with ``direct_to_workers=False`` keeps the
    handles' route, with the same sums (Dask's comm: channels off)."""
    monkeypatch.setattr(dask_store, "_CHANNEL", False)
    used = {"direct": 0, "proxied": 0}
    real_direct, real_proxied = dask_store._execute_direct, dask_store.DaskStore._send_proxied

    async def direct(rpc, targets):
        used["direct"] += len(targets)
        return await real_direct(rpc, targets)

    def proxied(self, method, calls, *rest):
        used["proxied"] += len(calls)
        return real_proxied(self, method, calls, *rest)

    X, y = _data()
    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    with distributed.Client(client.scheduler.address, direct_to_workers=False) as other:
        sums = []
        for c in (client, other):
            with _model(X[:10], y[:10]):
                step = pymc_dp.DPPenaltyMetropolis(
                    clip_bound=5.0, noise_multiplier=1.0, records=_records(c, X, y)
                )
            step._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)  # actors started
            with monkeypatch.context() as mp:
                mp.setattr(dask_store, "_execute_direct", direct)
                mp.setattr(dask_store.DaskStore, "_send_proxied", proxied)
                used.update(direct=0, proxied=0)
                sums.append(step._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0])
            assert step._fns.records._direct is (c is client)
            want = {"direct": 2, "proxied": 0} if c is client else {"direct": 0, "proxied": 2}
            assert used == want  # one call per actor
            step._fns.records.close()
    assert sums[0] == sums[1] and sums[0] != 0.0


def test_small_actors_run_in_the_workers_event_loop_with_the_same_sums(client, monkeypatch):
    """An actor holding at most `_INLINE_RECORDS` records runs its calls in its worker's event
    loop (Dask's ``separate_thread=False``), a larger one in the worker's actor thread: the
    same sums either way (Dask's comm: channels off)."""
    monkeypatch.setattr(dask_store, "_CHANNEL", False)
    X, y = _data()
    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    sums = []
    for limit in (dask_store._INLINE_RECORDS, PART - 1):
        monkeypatch.setattr(dask_store, "_INLINE_RECORDS", limit)
        with _model(X[:10], y[:10]):
            step = pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y)
            )
        sums.append(step._fns.clipped_loglik_ratio_sum(q1, q0, 0.5)[0])
        actors = step._fns.records._actors
        assert [h.inline for h in actors] == [limit >= 2 * PART] * 2
        step._fns.records.close()
    assert sums[0] == sums[1] and sums[0] != 0.0


# -- the store's own channel to each actor (issue 28, thirteenth session) -------------------------


def _penalty_on(client, X, y):
    with _model(X[:10], y[:10]):
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y)
        )
    return step._fns


def test_channels_give_the_in_memory_and_the_dask_routes_sums_of_every_release(
    process_client, monkeypatch
):
    """On worker processes (TCP) every actor gets a channel, and every kind of release goes
    over it (Dask's comm carries none of them) with the in-memory store's numbers with the
    same chunks, exactly; the channels closed, Dask's comm gives the same numbers."""
    client = process_client
    local, remote, want, idx = _remote_and_in_memory_releases(client)
    store = remote._fns.records
    by_dask = []
    real = dask_store.DaskStore._send_dask

    def counted(self, method, calls, *rest):
        by_dask.extend(calls)
        return real(self, method, calls, *rest)

    monkeypatch.setattr(dask_store.DaskStore, "_send_dask", counted)
    got = [_every_release(remote._fns, idx)]
    assert len(store._actors) == 2
    assert all(h.channel is not None for h in store._actors) and by_dask == []
    for h in store._actors:
        h.drop_channel()
    got.append(_every_release(remote._fns, idx))
    assert len(by_dask) >= 2 * 8  # every release, to both actors
    for out in got:
        for key in want:
            if key in ("moments", "norm_counts"):
                w, g = _flatten(want[key]), _flatten(out[key])
            else:
                w, g = _flatten(want[key][0]), _flatten(out[key][0])
            assert len(w) == len(g)
            for a, b in zip(w, g, strict=True):
                np.testing.assert_array_equal(a, b, err_msg=key)
    store.close()


def test_a_channel_serves_nobody_without_the_secret(client):
    """An actor's channel answers only a connection that first sends the secret the driver
    gave it through Dask; any other is closed unanswered, and the listener then takes no
    other connection."""
    import socket

    X, y = _data()
    fns = _penalty_on(client, X, y)
    fns.clipped_loglik_ratio_sum(np.array([0.9, -0.8]), np.array([0.1, 0.2]), 0.5)
    held = fns.records._actors[0]
    host, port = held.actor.open_channel(b"s" * 32, "127.0.0.1").result()
    with socket.create_connection((host, port), timeout=10) as sock:
        sock.sendall(b"x" * 32)
        assert sock.recv(64) == b""  # closed: no "ready", no answer
    time.sleep(0.2)
    with pytest.raises(OSError), socket.create_connection((host, port), timeout=2):
        pass
    fns.records.close()


def test_an_interrupted_exchange_closes_the_channels_and_later_sums_are_right(client, monkeypatch):
    """An exception in the middle of a released sum (e.g. ``KeyboardInterrupt`` while the
    answers are read) closes the channels it used, so that no answer left on a socket is
    read as that of a later call; later sums go by Dask's comm, the same numbers."""
    import threading

    X, y = _data()
    fns = _penalty_on(client, X, y)
    q0, q1, q2 = np.array([0.1, 0.2]), np.array([0.9, -0.8]), np.array([-0.3, 0.4])
    first = fns.clipped_loglik_ratio_sum(q1, q0, 0.5)
    other = fns.clipped_loglik_ratio_sum(q2, q0, 0.5)
    assert all(h.channel is not None for h in fns.records._actors)
    real, hit = dask_store._recv_msg, []

    def interrupted(sock):
        if threading.current_thread() is threading.main_thread() and not hit:
            hit.append(1)
            raise KeyboardInterrupt
        return real(sock)

    monkeypatch.setattr(dask_store, "_recv_msg", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fns.clipped_loglik_ratio_sum(q2, q0, 0.5)
    assert all(h.channel is None for h in fns.records._actors)
    assert fns.clipped_loglik_ratio_sum(q1, q0, 0.5) == first
    assert fns.clipped_loglik_ratio_sum(q2, q0, 0.5) == other and first != other
    fns.records.close()


def test_a_broken_channel_falls_back_to_dask_with_the_same_sum(client):
    X, y = _data()
    fns = _penalty_on(client, X, y)
    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    first = fns.clipped_loglik_ratio_sum(q1, q0, 0.5)
    held = fns.records._actors[0]
    held.channel.close()  # the socket fails under the store
    assert fns.clipped_loglik_ratio_sum(q1, q0, 0.5) == first
    assert held.channel is None and fns.records._actors[1].channel is not None
    fns.records.close()


def _apply_arg(g, *chunk):
    """A per-chunk function with a callable argument (what a closure could be)."""
    return float(g(np.asarray(chunk[1], dtype=float).sum())), 0


def test_a_request_pickle_cannot_serialise_goes_by_dask_with_the_channels_kept(client):
    X, y = _data()
    recs = _records(client, X, y)
    store = recs.store_for(["X", "y"], [(np.dtype("float64"), (2,)), (np.dtype("int64"), ())])
    total = store.map_reduce(_apply_arg, lambda a, b: (a[0] + b[0], 0), (0.0, 0), args=(abs,))
    assert all(h.channel is not None for h in store._actors)
    double = store.map_reduce(
        _apply_arg, lambda a, b: (a[0] + b[0], 0), (0.0, 0), args=(lambda v: 2 * v,)
    )
    assert double[0] == 2 * total[0] == 2 * float(y.sum())
    assert all(h.channel is not None for h in store._actors)
    store.close()


def test_no_channel_for_tls_workers():
    """A TLS cluster keeps Dask's comm (encrypted): no channel is asked of its actors."""
    import types

    def refuse(*a):
        raise AssertionError("a channel was asked of a TLS worker")

    held = types.SimpleNamespace(
        actor=types.SimpleNamespace(_address="tls://127.0.0.1:8786", open_channel=refuse),
        channel=None,
    )
    dask_store.DaskStore._open_channel(None, held)
    assert held.channel is None


def test_closing_the_store_releases_its_actors(client):
    """One actor per worker, started by the first read of the records (the step's start
    checks); `DaskStore.close` releases them (other tests' actors may come and go on the
    shared cluster meanwhile: only this store's are counted)."""

    def held(dask_worker=None):
        return list(dask_worker.state.actors)

    X, y = _data()
    with _model(X[:10], y[:10]):
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y)
        )
    store = step._fns.records
    step._fns.clipped_loglik_ratio_sum(np.zeros(2), np.ones(2), 0.5)
    mine = {h.future.key for h in store._actors}
    where = {w: mine & set(keys) for w, keys in client.run(held).items()}
    assert len(mine) == 2 and all(len(k) == 1 for k in where.values())  # one per worker
    store.close()
    for _ in range(100):  # the scheduler releases the actors' keys asynchronously
        if not mine & {k for keys in client.run(held).values() for k in keys}:
            break
        time.sleep(0.05)
    assert not mine & {k for keys in client.run(held).values() for k in keys}


# -- the workers' allocator (issue 28) -----------------------------------------------------------


def _malloc_warnings(client) -> list:
    """The `WorkerMallocWarning`s of a step on the records (its start checks start the
    actors) and of two releases."""
    X, y = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _model(X[:10], y[:10]):
            step = pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y)
            )
        step._fns.clipped_loglik_ratio_sum(np.zeros(2), np.ones(2), 0.5)
        step._fns.clipped_loglik_ratio_sum(np.zeros(2), np.ones(2), 0.5)
    step._fns.records.close()
    return [w for w in caught if issubclass(w.category, WorkerMallocWarning)]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's variables")
@pytest.mark.parametrize("trim", [True, False], ids=["dask-default", "without"])
def test_workers_whose_malloc_threshold_is_fixed_are_warned_about_once(trim, monkeypatch):
    """Worker processes started with Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` (glibc's
    adaptive mmap threshold off: page faults on every released sum) give one warning that
    names the setting; workers started without it give none. The workers' environment is
    left as it is."""
    # Dask's nanny writes its pre-spawn variables into this process's os.environ (and
    # leaves them there, so later workers inherit them whatever the config): start clean,
    # and restore this process's environment afterwards
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    environ = {"OMP_NUM_THREADS": "1"}
    if trim:
        environ["MALLOC_TRIM_THRESHOLD_"] = "65536"
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        _cluster(processes=True) as c,
    ):
        caught = _malloc_warnings(c)
        seen = set(c.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values())
    if trim:
        assert len(caught) == 1
        assert "MALLOC_TRIM_THRESHOLD_=65536" in str(caught[0].message)
        assert "distributed.nanny.pre-spawn-environ" in str(caught[0].message)
        assert seen == {"65536"}  # not changed by pymc_dp
    else:
        assert caught == []
        assert seen == {None}


@pytest.mark.skipif(not os.path.isfile("/proc/self/environ"), reason="needs /proc")
def test_malloc_settings_are_read_from_the_initial_environment(monkeypatch):
    """glibc reads its malloc settings when the process starts: a variable set later in
    ``os.environ`` does not count, one in the initial environment or ``GLIBC_TUNABLES``
    does."""
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")  # too late for glibc
    assert "MALLOC_TRIM_THRESHOLD_" not in dask_store._initial_environ()
    assert not any("MALLOC_TRIM" in f for f in dask_store._fixed_malloc_settings())
    env = {
        "MALLOC_MMAP_THRESHOLD_": "131072",
        "GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.trim_threshold=4096",
    }
    monkeypatch.setattr(dask_store, "_initial_environ", lambda: env)
    assert dask_store._fixed_malloc_settings() == [
        "MALLOC_MMAP_THRESHOLD_=131072",
        "GLIBC_TUNABLES glibc.malloc.trim_threshold=4096",
    ]


_FAULTS = """
import resource, sys
import numpy as np
from pymc_dp.records.dask_store import _settle_malloc


def faults_per_round(rounds=20):
    def one():  # three touched 4 MB temporaries, like a per-record function's
        return sum(float(a[-1]) for a in [np.ones(500_000) for _ in range(3)])

    one()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        one()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / rounds


before = faults_per_round()
_settle_malloc()
print(before, faults_per_round())
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's allocator")
@pytest.mark.parametrize("trim", [False, True], ids=["glibc-default", "dask-default"])
def test_an_actor_settles_glibcs_adaptive_threshold_without_changing_a_setting(trim):
    """In a fresh process with glibc's defaults, temporaries of a few megabytes are faulted
    in again on every call (the heap is trimmed after each); after `_settle_malloc` (what an
    actor does when it starts) they are reused: no fault. With a fixed threshold
    (``MALLOC_TRIM_THRESHOLD_``, Dask's default) it is a no-op: the faults stay."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"
    }
    if trim:
        env["MALLOC_TRIM_THRESHOLD_"] = "65536"
    out = subprocess.run(
        [sys.executable, "-c", _FAULTS], env=env, capture_output=True, text=True, check=True
    )
    before, after = (float(x) for x in out.stdout.split()[-2:])
    assert before > 500  # 12 MB of temporaries a round: ~3000 pages when faulted in
    if trim:
        assert after > 500
    else:
        assert after == 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "zombie" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc to see the processes")
def test_the_cluster_shuts_down_cleanly_after_a_run_on_actors():
    """A run on worker processes, then the cluster closed: no worker or nanny process is
    left behind (the actors die with their workers)."""
    import multiprocessing

    X, y = _data()
    with _cluster(processes=True) as c:
        workers = list(c.run(os.getpid).values())
        nannies = [p.pid for p in multiprocessing.active_children()]
        with _model(X[:10], y[:10]):
            idata = pymc_dp.sample(
                step=pymc_dp.DPPenaltyMetropolis,
                epsilon=5.0,
                delta=1e-5,
                step_kwargs={"clip_bound": 5.0},
                records=_records(c, X, y),
                random_seed=2,
                **RUN,
            )
    assert idata.posterior["b"].shape == (2, 8, 2)
    assert len(workers) == 2 and nannies
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in workers + nannies) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in workers + nannies)
    assert not [p for p in multiprocessing.active_children() if p.pid in nannies]


# -- minibatch steps: indices drawn on the driver, only the selected rows' sums come back -------

MINIBATCH_STEPS = [  # (step, step_kwargs, epsilon of the run)
    (pymc_dp.DPSGLD, {"clip_bound": 5.0, "step_size": 2e-3, "batch_size": 150}, 5.0),
    (pymc_dp.DPSGNHT, {"clip_bound": 5.0, "step_size": 2e-3, "batch_size": 150}, 5.0),
    # lam + C * max_step = 20 + 6000 * 0.02: a minibatch of ~140 rows with repeats; with
    # max_batch = 140 some of the iterations take the full-batch branch
    (
        pymc_dp.DPFastMH,
        {"clip_bound": 5.0, "max_step": 0.02, "lam": 20.0, "max_batch": 140, "scaling": 0.3},
        20.0,
    ),
    (
        pymc_dp.DPFastMH,
        {
            "clip_bound": np.linspace(4.0, 6.0, N),
            "max_step": 0.02,
            "lam": 20.0,
            "max_batch": 140,
            "scaling": 0.3,
        },
        20.0,
    ),
    (pymc_dp.DPBarker, {"tempering": 0.02, "proposal_scale": 0.2}, 5.0),
    (
        pymc_dp.DPSubsampledPenalty,
        {"batch_size": 300, "clip_bound": 5.0, "proposal_scale": 0.02},
        5.0,
    ),
]
MINIBATCH_IDS = ["sgld", "sgnht", "fastmh", "fastmh-vector-c", "barker", "subsampled-penalty"]


@pytest.mark.parametrize("step,kwargs,epsilon", MINIBATCH_STEPS, ids=MINIBATCH_IDS)
def test_minibatch_step_on_dask_draws_equal_the_in_memory_run(client, step, kwargs, epsilon):
    X, y = _data()
    kw = dict(epsilon=epsilon, delta=1e-5, random_seed=11, **RUN)
    with _model(X, y):
        local = pymc_dp.sample(step=step, step_kwargs={**kwargs, "chunk_size": PART}, **kw)
    with _model(X[:10], y[:10]):
        remote = pymc_dp.sample(step=step, step_kwargs=kwargs, records=_records(client, X, y), **kw)
    b_local = local.posterior["b"].values
    assert np.unique(b_local).size > 4  # the chains moved: the equality below is not trivial
    np.testing.assert_array_equal(b_local, remote.posterior["b"].values)
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    assert a.releases == 2 * (8 + 4)  # one release per iteration, in both runs
    if step is pymc_dp.DPFastMH:  # both branches ran: minibatch rows and the full batch
        full = _group(remote, "sample_stats")["full_batch"].values
        assert full.any() and not full.all()


class _Spy:
    """Wraps `DaskStore._receive`: keeps every partition result that reached the driver from
    an actor."""

    def __init__(self, real):
        self.real, self.returned = real, []

    def __call__(self, store, pairs):
        out = self.real(store, pairs)
        self.returned.extend(r for _, r in out)
        return out


def test_minibatch_workers_return_sums_only_and_no_counts(client, monkeypatch):
    """Every partition returns fixed-size sums whatever its number of selected rows, and the
    non-private counts are 0 unless asked for; the sums add up to the in-memory ones."""
    from pymc_dp.kernels.subsampled_penalty import clipped_moments, merge_moments
    from pymc_dp.records import dask_store

    spy = _Spy(dask_store.DaskStore._receive)
    monkeypatch.setattr(dask_store.DaskStore, "_receive", lambda self, f: spy(self, f))
    X, y = _data()
    kw = {"batch_size": 200, "clip_bound": 5.0, "noise_multiplier": 1.0}
    with _model(X[:10], y[:10]):
        remote = pymc_dp.DPSubsampledPenalty(**kw, records=_records(client, X, y))
    with _model(X, y):
        local = pymc_dp.DPSubsampledPenalty(**kw, chunk_size=PART, nonprivate_diagnostics=True)
    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    idx = np.random.default_rng(0).choice(N, size=700, replace=False)
    spy.returned.clear()  # the start checks
    got = remote._fns.ratio_subset_terms(
        q1, q0, idx, clipped_moments, merge_moments, params=(0.05,)
    )
    want = local._fns.ratio_subset_terms(
        q1, q0, idx, clipped_moments, merge_moments, params=(0.05,)
    )
    assert len(spy.returned) == N // PART  # one call per partition holding selected rows
    for sums, counts in spy.returned:
        assert len(sums) == 3 and all(np.ndim(v) == 0 for v in sums) and counts == (0,)
    assert got[0] == want[0] and want[1][0] > 0 and got[1] == (0,)
    g_remote = pymc_dp.DPSGLD(
        clip_bound=0.1,
        step_size=1e-3,
        batch_size=100,
        noise_multiplier=1.0,
        model=_model(X[:10], y[:10]),
        records=_records(client, X, y),
    )
    spy.returned.clear()
    s, k = g_remote._fns.clipped_grad_sum_subset(q1, 0.1, idx[:5])
    assert len(spy.returned) <= 5 and k == 0
    for g, count in spy.returned:
        assert np.shape(g) == (2,) and count == 0
    assert s.shape == (2,)


def test_minibatch_indices_out_of_range_are_refused_before_any_data_is_read(client):
    X, y = _poison((N, 2), "float64"), _poison((N,), "int64")
    recs = DaskRecords(client, {"X": X, "y": y})
    store = recs.store_for(["X", "y"], [(np.dtype("float64"), (2,)), (np.dtype("int64"), ())])

    def fn(*args):  # never runs: the indices are refused first
        raise AssertionError("a minibatch function ran")

    for bad, match in (
        (np.array([0, N]), r"idx .* \[0, n\) with n = 1200"),
        (np.array([-1, 3]), r"idx .* \[0, n\)"),
        (np.array([0.5, 1.0]), "integers"),
        (np.zeros((2, 2), dtype=int), "1-d"),
    ):
        with pytest.raises(ValueError, match=match):
            store.map_reduce_rows(fn, lambda a, b: b, None, bad)
    with pytest.raises(ValueError, match=r"row_args\[0\]"):
        store.map_reduce_rows(fn, lambda a, b: b, None, np.array([1, 2]), row_args=(np.ones(3),))


def _poison(shape, dtype):
    """A dask array whose every read raises: errors must come before any data is read."""

    def boom(block_info=None):
        raise AssertionError("the records were read")

    return da.map_blocks(lambda x: boom(), da.zeros(shape, chunks=(PART,) + shape[1:]), dtype=dtype)


def test_bad_input_is_refused_before_any_data_is_read(client):
    X = _poison((N, 2), "float64")
    y = _poison((N,), "int64")
    with pytest.raises(ValueError, match="different numbers of rows"):
        DaskRecords(client, {"X": X, "y": _poison((N - 1,), "int64")})
    with pytest.raises(ValueError, match="partitions differently"):
        DaskRecords(client, {"X": X, "y": y.rechunk(400)})
    with pytest.raises(ValueError, match="rechunk"):
        DaskRecords(client, {"X": X.rechunk((PART, 1)), "y": y})
    with pytest.raises(TypeError, match="not a dask array"):
        DaskRecords(client, {"X": np.zeros((N, 2)), "y": y})
    with pytest.raises(TypeError, match="dict"):
        DaskRecords(client, [X, y])
    with pytest.raises(ValueError, match="owners"):
        DaskRecords(client, {"X": X, "y": y}, owners=[0, 1])
    Xs, ys = _data(10)
    with _model(Xs, ys):
        with pytest.raises(ValueError, match=r"\['Z'\] match no observed variable"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0,
                noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y, "Z": X}),
            )
        with pytest.raises(ValueError, match="no array for it"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0, noise_multiplier=1.0, records=DaskRecords(client, {"X": X})
            )
        with pytest.raises(ValueError, match="dtype"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=5.0,
                noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y.astype("float64")}),
            )
        with pytest.raises(ValueError, match="data-sharing"):
            pymc_dp.DPSGLD(
                clip_bound=1.0,
                step_size=1e-3,
                batch_size=10,
                noise_multiplier=1.0,
                records=DaskRecords(client, {"X": X, "y": y}, owners="partition"),
            )
        with pytest.raises(ValueError, match="cores=2"):
            pymc_dp.sample(
                step=pymc_dp.DPPenaltyMetropolis,
                epsilon=1.0,
                delta=1e-5,
                step_kwargs={"clip_bound": 1.0},
                records=DaskRecords(client, {"X": X, "y": y}),
                cores=2,
                **RUN,
            )
    closed = distributed.Client(client.cluster, set_as_default=False)
    closed.close()
    with pytest.raises(ValueError, match="not running"):
        DaskRecords(closed, {"X": X, "y": y})


# -- data-sharing (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2) ------------------------------


def test_each_owner_adds_its_own_noise_k_times_the_central_variance(client):
    """K = 4 owners each add N(0, sigma^2) to their clipped sum: the released total is the
    exact clipped sum plus noise of variance K sigma^2 (checked against Monte Carlo error)."""
    X, y = _data()
    recs = _records(client, X, y, owners="partition", owner_seeds=[11, 12, 13, 14])
    with _model(X[:10], y[:10]):
        shared = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=1.0, records=recs)
    with _model(X, y):
        central = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=1.0)
    q0, q1, bound, sigma = np.array([0.1, 0.2]), np.array([0.3, -0.1]), 0.05, 2.0
    exact = central._fns.clipped_loglik_ratio_sum(q1, q0, bound)[0]
    # m = 200: the K sigma^2 and sigma^2 variances are 7.5 standard errors apart (4 used)
    m, k = 200, recs.n_owners
    draws = np.array(
        [shared._fns.shared_clipped_loglik_ratio_sum(q1, q0, bound, sigma) for _ in range(m)]
    )
    var = k * sigma**2
    assert abs(draws.mean() - exact) < 4.0 * np.sqrt(var / m)
    assert abs(draws.var(ddof=1) - var) < 4.0 * var * np.sqrt(2.0 / (m - 1))
    # not the central variance: sigma^2 is 4 standard errors away from K sigma^2
    assert abs(draws.var(ddof=1) - sigma**2) > 4.0 * var * np.sqrt(2.0 / (m - 1))
    assert shared._fns.released["llr"] == m


def test_clipped_counts_do_not_leave_the_workers(client):
    """Without non-private diagnostics a worker returns the clipped sum and a count of 0."""
    X, y = _data()
    with _model(X[:10], y[:10]):
        remote = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, records=_records(client, X, y)
        )
    with _model(X, y):
        local = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=1.0)
    q0, q1 = np.array([0.1, 0.2]), np.array([0.9, -0.8])
    s_local, k_local = local._fns.clipped_loglik_ratio_sum(q1, q0, 0.01)
    s_remote, k_remote = remote._fns.clipped_loglik_ratio_sum(q1, q0, 0.01)
    assert k_local > 0 and k_remote == 0
    assert s_remote == pytest.approx(s_local, rel=1e-12)


def test_data_sharing_report_gives_each_owners_epsilon_and_the_noise_variance(client):
    X, y = _data()
    recs = _records(client, X, y, owners=[0, 0, 1, 2], owner_seeds=[1, 2, 3])
    kw = dict(epsilon=3.0, delta=1e-5, step_kwargs={"clip_bound": 5.0}, random_seed=3, **RUN)
    with _model(X[:10], y[:10]):
        idata = pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, records=recs, **kw)
    with _model(X, y):
        central = pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, **kw)
    rep, rep_c = pymc_dp.privacy_report(idata), pymc_dp.privacy_report(central)
    assert rep.owners == 3 and rep.noise_variance_factor == 3
    # every owner sees every release at the central scheme's noise multiplier
    assert rep.owner_epsilons == (rep.epsilon,) * 3
    assert rep.epsilon == pytest.approx(rep_c.epsilon, rel=1e-12) and rep.epsilon <= 3.0
    assert rep.releases == rep_c.releases == 2 * (8 + 4)
    st = _group(idata, "sample_stats")
    step_z = np.sqrt(1.0 / (2.0 * float(st["dp_mu"].values.flat[0])))
    expected_sd = np.sqrt(3) * step_z * 2 * 5.0 * st["step_norm"].values
    np.testing.assert_allclose(st["noise_std"].values, expected_sd, rtol=1e-12)
    w = _group(idata, "warmup_sample_stats")
    sds = st["noise_std"].values
    if w is not None:
        sds = np.concatenate([w["noise_std"].values, sds], axis=1)
    assert rep.total_noise_variance == pytest.approx(np.mean(sds**2), rel=1e-12)
    assert "Algorithm 2" in rep.mechanism and "3 owners" in str(rep)
    assert idata.attrs["dp_owners"] == 3
    assert idata.attrs["dp_owner_epsilons"].count(",") == 2
    assert np.all(np.isnan(st["clip_fraction_NONPRIVATE"].values))
    # data-sharing refuses non-private diagnostics (the counts would reach the curator)
    with _model(X[:10], y[:10]), pytest.raises(ValueError, match="nonprivate_diagnostics"):
        pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=1.0, nonprivate_diagnostics=True, records=recs
        )


HMC_KW = {"llr_clip_bound": 5.0, "grad_clip_bound": 5.0, "n_leapfrog": 3}


def test_dphmc_owners_add_their_own_gradient_noise_k_times_the_central_variance(client):
    """K = 4 owners each add N(0, sigma^2 I) to their clipped gradient sum: the released
    gradient is the exact clipped sum plus noise of variance K sigma^2 per coordinate."""
    X, y = _data()
    recs = _records(client, X, y, owners="partition", owner_seeds=[21, 22, 23, 24])
    z = dict(llr_noise_multiplier=1.0, grad_noise_multiplier=1.0)
    with _model(X[:10], y[:10]):
        shared = pymc_dp.DPHMC(**HMC_KW, **z, records=recs)
    with _model(X, y):
        central = pymc_dp.DPHMC(**HMC_KW, **z)
    q, bound, sigma = np.array([0.3, -0.1]), 0.5, 3.0
    exact = central._fns.clipped_grad_sum(q, bound)[0]
    # m = 200: the K sigma^2 and sigma^2 variances are 7.5 standard errors apart (4 used)
    m, k = 200, recs.n_owners
    draws = np.array([shared._fns.shared_clipped_grad_sum(q, bound, sigma) for _ in range(m)])
    var = k * sigma**2
    assert np.all(np.abs(draws.mean(axis=0) - exact) < 4.0 * np.sqrt(var / m))
    v = draws.var(axis=0, ddof=1)
    assert np.all(np.abs(v - var) < 4.0 * var * np.sqrt(2.0 / (m - 1)))
    assert np.all(np.abs(v - sigma**2) > 4.0 * var * np.sqrt(2.0 / (m - 1)))  # not central
    assert shared._fns.released["grad"] == m


def test_dphmc_data_sharing_report_gives_each_owners_epsilon_and_the_noise_variance(client):
    X, y = _data()
    recs = _records(client, X, y, owners=[0, 0, 1, 2], owner_seeds=[4, 5, 6])
    kw = dict(epsilon=3.0, delta=1e-5, step_kwargs=HMC_KW, random_seed=3, **RUN)
    with _model(X[:10], y[:10]):
        idata = pymc_dp.sample(step=pymc_dp.DPHMC, records=recs, **kw)
    with _model(X, y):
        central = pymc_dp.sample(step=pymc_dp.DPHMC, **kw)
    rep, rep_c = pymc_dp.privacy_report(idata), pymc_dp.privacy_report(central)
    assert rep.owners == 3 and rep.noise_variance_factor == 3
    assert rep.owner_epsilons == (rep.epsilon,) * 3
    assert rep.epsilon == pytest.approx(rep_c.epsilon, rel=1e-12) and rep.epsilon <= 3.0
    assert rep.releases == rep_c.releases == 2 * (8 + 4) * (3 + 2)
    assert "Algorithm 2" in rep.mechanism and "3 owners" in str(rep)
    st = _group(idata, "sample_stats")
    assert np.unique(idata.posterior["b"].values).size > 4  # the chains moved
    # the test's noise: sqrt(K) times the central sigma_l = z_l 2 b_l ||q' - q||
    w = _group(idata, "warmup_sample_stats")
    sds, norms = st["llr_noise_std"].values, st["step_norm"].values
    if w is not None:
        sds = np.concatenate([w["llr_noise_std"].values, sds], axis=1)
        norms = np.concatenate([w["step_norm"].values, norms], axis=1)
    step_z = pymc_dp.DPHMC(**HMC_KW, epsilon=3.0, delta=1e-5, **PLAN, model=_model(X, y))
    expected = np.sqrt(3) * step_z.llr_noise_multiplier * 2 * 5.0 * norms
    np.testing.assert_allclose(sds, expected, rtol=1e-12)
    assert rep.total_noise_variance == pytest.approx(np.mean(sds**2), rel=1e-12)
    assert np.all(np.isnan(st["llr_clip_fraction_NONPRIVATE"].values))


# -- a worker lost during a run ------------------------------------------------------------------


@pytest.fixture
def process_client():
    with _cluster(processes=True) as c:
        yield c


def _holder_of(client, store) -> str:
    """Address of a worker holding partition 0 of the first array (public: placement)."""
    who = client.who_has(store._parts[0][0])
    return next(iter(who.values()))[0]


def _kill(client, address: str) -> None:
    """Kill a worker process (its nanny starts a fresh one with a new address)."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)


def _killer(client, store, at: int, calls: list, everyone: bool = False):
    """A pm.sample callback that kills, after draw ``at``, the worker holding partition 0
    (or every worker: then no copy of any partition is left on the cluster)."""

    def callback(trace=None, draw=None):
        calls.append(1)
        if len(calls) == at:
            addrs = list(client.scheduler_info()["workers"]) if everyone else []
            for addr in addrs or [_holder_of(client, store)]:
                _kill(client, addr)
                calls.append(addr)

    return callback


def test_lost_worker_is_recovered_by_dask_and_the_run_is_unchanged(process_client):
    """The partitions of a killed worker are recomputed from their source (from_array): the
    draws equal those of a run without the fault, and every release is counted once."""
    client = process_client
    X, y = _data()
    kw = dict(random_seed=5, **RUN)
    draws, releases = [], []
    for kill in (False, True):
        with _model(X[:10], y[:10]):
            step = pymc_dp.DPHMC(
                llr_clip_bound=5.0,
                grad_clip_bound=5.0,
                n_leapfrog=2,
                epsilon=5.0,
                delta=1e-5,
                **PLAN,
                records=_records(client, X, y),
            )
            calls: list = []
            cb = _killer(client, step._fns.records, 6, calls) if kill else None
            idata = pymc_dp.sample(step=step, callback=cb, **kw)
        if kill:
            killed = calls[6]
            assert killed not in client.scheduler_info()["workers"]  # the worker was lost
        draws.append(idata.posterior["b"].values)
        rep = pymc_dp.privacy_report(idata)
        assert rep.releases == sum(step._fns.released.values())
        releases.append(rep.releases)
    np.testing.assert_array_equal(draws[0], draws[1])
    assert releases[0] == releases[1] == 2 * (8 + 4) * (2 + 2)


def _scattered_records(client, X, y):
    """Records scattered to the workers: not recomputable when their worker is lost."""
    xs, ys = [], []
    for j in range(0, N, PART):
        fx, fy = client.scatter([X[j : j + PART], y[j : j + PART]])
        xs.append(da.from_delayed(fx, (PART, 2), dtype=X.dtype))
        ys.append(da.from_delayed(fy, (PART,), dtype=y.dtype))
    return DaskRecords(client, {"X": da.concatenate(xs), "y": da.concatenate(ys)})


def test_lost_worker_that_cannot_be_recomputed_stops_the_run_and_counts_every_release(
    process_client,
):
    client = process_client
    X, y = _data()
    with _model(X[:10], y[:10]):
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0,
            epsilon=2.0,
            delta=1e-5,
            **PLAN,
            records=_scattered_records(client, X, y),
        )
        calls: list = []
        with pytest.raises(RecordsLostError, match="could not be recomputed") as info:
            pymc_dp.sample(
                step=step,
                callback=_killer(client, step._fns.records, 5, calls, everyone=True),
                random_seed=1,
                **RUN,
            )
    # 5 iterations released their sum before the kill; the 6th never reached the driver
    err = info.value
    assert err.releases == 5 == step._fns.released["llr"]
    mu = 5 * GaussianEvent(step.noise_multiplier).mu
    assert err.epsilon == pytest.approx(compose_epsilon([GaussianEvent(np.sqrt(0.5 / mu))], 1e-5))
    assert err.delta == 1e-5 and err.epsilon < 2.0


def test_a_stopped_minibatch_run_is_charged_for_the_releases_that_reached_the_driver(client):
    """The partial-run account of a minibatch step is its own mechanism (Poisson-subsampled
    Gaussian) composed over the releases made, not the (zero) Gaussian mu of the step."""
    from pymc_dp.accounting import PoissonSubsampledGaussian
    from pymc_dp.sampling import _account_partial_run

    X, y = _data()
    with _model(X[:10], y[:10]):
        step = pymc_dp.DPSGLD(
            clip_bound=5.0,
            step_size=1e-3,
            batch_size=100,
            noise_multiplier=2.0,
            records=_records(client, X, y),
        )
    q = np.array([0.1, 0.2])
    for _ in range(3):
        step._noisy_gradient(q)
    err = RecordsLostError("lost")
    _account_partial_run(err, [step], 1e-5)
    z = step.total_noise_multiplier  # the added noise and the sampler's own diffusion noise
    assert z >= 2.0
    want = compose_epsilon([PoissonSubsampledGaussian(z, 100 / N, 3)], 1e-5)
    assert err.releases == 3 and err.epsilon == pytest.approx(want, rel=1e-12) and want > 0


# -- DPExpFamilyPenalty: the clipped sufficient statistics, summed where the partitions live -----


def _regression(n=N, seed=2):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    x3 = rng.uniform(0, 2, size=n)
    y = 0.5 + X @ [1.0, -0.7] + 0.3 * x3 + rng.normal(size=n)
    return X, x3, y


def _regression_model(X, x3, y):
    with pm.Model() as m:
        Xd = pm.Data("Xd", X)
        x3d = pm.Data("x3", x3)
        b = pm.Normal("b", 0, 2, size=2)
        c = pm.Normal("c", 0, 2)
        yd = pm.Data("yd", y)  # a container: a constant would be folded into 1.0 - y
        pm.Normal("y", 1.0 + Xd @ b + c * x3d, 1.0, observed=yd)
    return m


def test_expfam_step_on_dask_draws_equal_the_in_memory_run(client):
    X, x3, y = _regression()
    kwargs = {"data_bounds": {"y": (-6, 6), "Xd": (-1, 1), "x3": (0, 2)}, "proposal_scale": 0.003}
    kw = dict(epsilon=3.0, delta=1e-5, random_seed=4, **RUN)
    with _regression_model(X, x3, y):
        local = pymc_dp.sample(
            step=pymc_dp.DPExpFamilyPenalty, step_kwargs={**kwargs, "chunk_size": PART}, **kw
        )
    recs = DaskRecords(
        client,
        {
            "yd": da.from_array(y, chunks=PART),
            "Xd": da.from_array(X, chunks=(PART, 2)),
            "x3": da.from_array(x3, chunks=PART),
        },
    )
    with _regression_model(X[:10], x3[:10], y[:10]) as m:
        remote = pymc_dp.sample(
            step=pymc_dp.DPExpFamilyPenalty, step_kwargs=kwargs, records=recs, **kw
        )
        # S itself (never published): the partition sums add up to the in-memory pass
        step = pymc_dp.DPExpFamilyPenalty(noise_multiplier=1.0, records=recs, **kwargs)
    with _regression_model(X, x3, y):
        here = pymc_dp.DPExpFamilyPenalty(noise_multiplier=1.0, chunk_size=PART, **kwargs)
    np.testing.assert_array_equal(step._stat_sum, here._stat_sum)
    assert step._expfam.n_records == N and step._fns.n_records == N
    for name in ("b", "c"):
        v = local.posterior[name].values
        assert np.unique(v).size > 4
        np.testing.assert_array_equal(v, remote.posterior[name].values)
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    del m


# -- the automatic mode (step=None): every phase reads the records through partition sums --------


@pytest.mark.parametrize("method", ["chain", "laplace"])
def test_automatic_mode_on_dask_equals_the_in_memory_run(client, method):
    """Both strategies. Warm start (clipped gradient moments, gradient-norm histograms); the
    chain's clip selection (the control variate's residual histogram), control variate
    release and penalty run, or the one-shot strategy's two last releases: with the same
    seed and chunks the Dask run is the in-memory run, draw for draw."""
    X, y = _data()
    kw = dict(epsilon=4.0, delta=1e-5, random_seed=9, draws=20, tune=0, chains=2)
    kw.update(progressbar=False, compute_convergence_checks=False)
    with _model(X, y):
        local = pymc_dp.sample(auto_kwargs={"chunk_size": PART, "method": method}, **kw)
    assert local.attrs["dp_method"] == method
    with _model(X[:10], y[:10]):
        remote = pymc_dp.sample(
            records=_records(client, X, y), auto_kwargs={"method": method}, **kw
        )
    v = local.posterior["b"].values
    assert np.unique(v).size > 4
    np.testing.assert_array_equal(v, remote.posterior["b"].values)
    a, b = pymc_dp.privacy_report(local), pymc_dp.privacy_report(remote)
    assert (a.epsilon, a.releases, a.iterations) == (b.epsilon, b.releases, b.iterations)
    assert b.epsilon <= 4.0
    for key in ("dp_auto_laplace_mean", "dp_auto_laplace_sd", "dp_phases"):  # DP outputs
        np.testing.assert_array_equal(local.attrs[key], remote.attrs[key])
    with (
        _model(X[:10], y[:10]),
        pytest.raises(ValueError, match="automatic mode .* data-sharing"),
    ):
        pymc_dp.sample(records=_records(client, X, y, owners="partition"), **kw)
