"""The Dask protocol's changes of issue 28 (sessions 2, 12 and 13), A/B in one cluster.

Alternating rounds on the same ``LocalCluster`` (2 worker processes x 1 thread, workers
without ``MALLOC_TRIM_THRESHOLD_``), so that both sides of each comparison see the same load:

* ``R``: one released sum over 4 partitions of 1 record, the actor calls sent over the
  store's own socket to each actor (channel, thirteenth session,
  `pymc_dp.records.dask_store.DaskStore._open_channel`), or by Dask's comm: straight to
  the workers from one coroutine (`pymc_dp.records.dask_store.DaskStore._send`) and run in
  the worker's event loop (``inline``, twelfth session) or handed to the worker's actor
  thread (second session), or sent through the `Actor` handles, i.e. the scheduler's proxy
  for a client with Dask's default ``direct_to_workers=None`` (old);
* DPHMC (banana, ``L = 5``) at ``n``: ratio release fused into the last gradient pass with
  the log-likelihoods kept on the workers (``L`` round trips), over the channels (the
  default), or straight by Dask's comm in the workers' event loops or their actor threads
  (the twelfth session's default at this size), old (through the scheduler, unfused, the
  ratio at both points: ``L + 1``); DPPenaltyMetropolis the same four; the one process
  (``chunk_size`` = partition size) alongside.
* the idle CPU of the driver process and of each worker (Dask's periodic callbacks),
  before and after.

Wall medians, and CPU per call or iteration of the driver and of both workers (means over
a round, medians over the rounds). Usage: ``python benchmarks/bench_dask_protocol.py
[n]`` (``ROUNDS`` in the environment: rounds per setting, default 4).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import warnings

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
import pymc  # noqa: E402
import pytensor  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import pymc_dp  # noqa: E402
from pymc_dp.distributed import DaskRecords  # noqa: E402
from pymc_dp.experiments.models import banana  # noqa: E402

ROUNDS = int(os.environ.get("ROUNDS", 4))


def _usage() -> float:
    return time.process_time()


def _measure(client, fn, n: int) -> tuple[float, float, float]:
    """Median wall, mean driver CPU and mean CPU of all workers per call of ``fn``."""
    w0, d0, ts = sum(client.run(_usage).values()), time.process_time(), []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    d1, w1 = time.process_time(), sum(client.run(_usage).values())
    return statistics.median(ts), (d1 - d0) / n, (w1 - w0) / n


def _local(fn, n: int) -> tuple[float, float, float]:
    c0, ts = time.process_time(), []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), (time.process_time() - c0) / n, 0.0


def _stepper(step, point):
    state = {"p": point}

    def f():
        state["p"], _ = step.step(state["p"])

    return f


def _show(label: str, res: list) -> tuple[float, float]:
    w = statistics.median(r[0] for r in res)
    d = statistics.median(r[1] for r in res)
    k = statistics.median(r[2] for r in res)
    print(
        f"  {label:34s} wall {w * 1e3:9.3f} ms  CPU driver {d * 1e3:8.3f} ms  "
        f"workers {k * 1e3:8.3f} ms  total {(d + k) * 1e3:8.3f} ms",
        flush=True,
    )
    return w, d + k


def _set_inline(store, inline: bool) -> None:
    """Run the store's actor calls in the workers' event loops (True) or actor threads."""
    for held in store._actor_pool():
        held.inline = inline


_CHANNELS: dict[int, object] = {}


def _set_channel(store, on: bool) -> None:
    """Send the store's calls over its channels (True, thirteenth session) or by Dask's comm
    (the channels stay open, unused)."""
    for held in store._actor_pool():
        if held.channel is not None:
            _CHANNELS[id(held)] = held.channel
        held.channel = _CHANNELS.get(id(held)) if on else None


def _idle(client) -> None:
    """CPU of the driver process and of each worker over 2 s of no work (Dask's periodic
    callbacks; on a LocalCluster the scheduler runs in the driver process)."""
    w0, d0 = client.run(_usage), time.process_time()
    time.sleep(2.0)
    d1, w1 = time.process_time(), client.run(_usage)
    per = ", ".join(f"{(w1[k] - w0[k]) / 2.0 * 1e3:.1f}" for k in sorted(w0))
    print(f"idle CPU: driver {(d1 - d0) / 2.0 * 1e3:.1f} ms/s, workers {per} ms/s", flush=True)


def _round_trip(client) -> None:
    small = banana(n=10, seed=0)
    recs = DaskRecords(client, {"x": da.from_array(np.zeros((4, 2)), chunks=(1, 2))})
    with small.model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, records=recs)
    fns, store = st._fns, st._fns.records
    q0, q1 = np.zeros(2), np.full(2, 0.01)
    for _ in range(20):
        fns.clipped_loglik_ratio_sum(q1, q0, 0.1)
    # (channel, direct, inline)
    variants = {
        "channel (new default)": (True, True, True),
        "straight, event loop": (False, True, True),
        "straight, actor thread": (False, True, False),
        "Actor handles / scheduler (old)": (False, False, False),
    }
    res: dict[str, list] = {k: [] for k in variants}
    for _ in range(ROUNDS * 2):
        for k, (channel, direct, inline) in variants.items():
            _set_channel(store, channel)
            store._direct = direct
            _set_inline(store, inline)
            res[k].append(_measure(client, lambda: fns.clipped_loglik_ratio_sum(q1, q0, 0.1), 100))
    print(
        f"R: one released sum, 4 partitions of 1 record, medians of {2 * ROUNDS} rounds x 100 "
        f"calls, load {os.getloadavg()[0]:.1f} (default: channel)"
    )
    for k in variants:
        _show(k, res[k])
    _set_inline(store, True)
    _set_channel(store, True)


def _steps(client, n: int) -> None:
    full = banana(n=n, seed=0)
    chunk = -(-n // 4)
    x = np.asarray(full.data)
    recs = DaskRecords(client, {"x": da.from_array(x, chunks=(chunk, 2))})
    kw = dict(
        llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0,
        grad_noise_multiplier=1.0, n_leapfrog=5, step_size=1e-3, adapt_mass_matrix=False,
    )  # fmt: skip
    pen = dict(clip_bound=1.0, noise_multiplier=1.0, scaling=1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with full.model:
            hl = pymc_dp.DPHMC(chunk_size=chunk, rng=np.random.default_rng(1), **kw)
            pl = pymc_dp.DPPenaltyMetropolis(chunk_size=chunk, rng=np.random.default_rng(2), **pen)
        with banana(n=10, seed=0).model as m:
            hr = pymc_dp.DPHMC(records=recs, rng=np.random.default_rng(1), **kw)
            pr = pymc_dp.DPPenaltyMetropolis(records=recs, rng=np.random.default_rng(2), **pen)
    store, pstore = hr._fns.records, pr._fns.records
    fl, fr = _stepper(hl, full.model.initial_point()), _stepper(hr, m.initial_point())
    gl, gr = _stepper(pl, full.model.initial_point()), _stepper(pr, m.initial_point())
    for f in (fl, fr, gl, gr):
        f()
        f()
    # (channel, direct, inline, fuse_ratio_pass, reuse_loglik)
    variants = {
        "1 process": None,
        "Dask channel, fused (new)": (True, True, False, True, None),
        "Dask direct, event loop, fused": (False, True, True, True, None),
        "Dask direct, actor thread, fused": (False, True, False, True, None),
        "Dask old (scheduler, unfused)": (False, False, False, False, False),
    }
    pvariants = {
        "1 process": None,
        "Dask channel (new)": (True, True, False),
        "Dask direct, event loop": (False, True, True),
        "Dask direct, actor thread": (False, True, False),
        "Dask old (scheduler)": (False, False, False),
    }
    out: dict[str, list] = {k: [] for k in variants}
    pout: dict[str, list] = {k: [] for k in pvariants}
    for _ in range(ROUNDS):
        for k, v in variants.items():
            if v is None:
                out[k].append(_local(fl, 5))
            else:
                channel, store._direct, inline, hr.fuse_ratio_pass, hr.reuse_loglik = v
                _set_channel(store, channel)
                _set_inline(store, inline)
                out[k].append(_measure(client, fr, 5))
        for k, v in pvariants.items():
            if v is None:
                pout[k].append(_local(gl, 10))
            else:
                channel, pstore._direct, inline = v
                _set_channel(pstore, channel)
                _set_inline(pstore, inline)
                pout[k].append(_measure(client, gr, 10))
    on = all(id(h) in _CHANNELS for h in store._actor_pool() + pstore._actor_pool())
    print(
        f"DPHMC (L = 5), banana n = {n:,}, 4 partitions, medians of {ROUNDS} rounds x 5 "
        f"iterations, per iteration, load {os.getloadavg()[0]:.1f} (default: "
        f"{'channel' if on else 'no channel opened!'})"
    )
    for table in (out, pout):
        base = _show("1 process", table["1 process"])
        for k in list(table)[1:]:
            w, c = _show(k, table[k])
            print(f"      Dask/1 proc: wall {w / base[0]:.2f}, CPU {c / base[1]:.2f}")
        if table is out:
            print(
                f"DPPenaltyMetropolis, n = {n:,}, medians of {ROUNDS} rounds x 10 iterations, "
                f"load {os.getloadavg()[0]:.1f}"
            )


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        print(f"pymc {pymc.__version__}, pytensor {pytensor.__version__}", flush=True)
        _idle(client)
        _round_trip(client)
        _steps(client, n)
        _idle(client)


if __name__ == "__main__":
    main()
