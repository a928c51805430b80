"""Records on a Dask cluster: per-iteration time against one process, and a scaling model.

On a ``LocalCluster`` with 2 worker processes (one thread each) this script measures, for the
banana model of the DP-HMC paper (d = 2, generic route):

* the per-iteration time of DPHMC (``L`` leapfrog steps: ``L + 1`` gradient sums and a
  ratio sum released, ``L`` of them computed in ``L`` passes over the records and ``L``
  messages to each worker: the gradient at the start kept from the last trajectory,
  `pymc_dp.records.GradSumMemo`, and the ratio sum computed in the last gradient pass,
  `pymc_dp.records.FusedLastPass`, the log-likelihoods at the current point kept on the
  workers) and of
  DPPenaltyMetropolis (1 released sum) at each ``n``, in one process (``chunk_size`` = the
  partition size) and with ``DaskRecords`` (the same partitions on the 2 workers);
* the per-iteration time of DPSGLD with a Poisson minibatch of expected size ``B`` (1
  released sum; the indices are drawn on the driver and only the partitions holding some
  of them read those rows), in one process and with ``DaskRecords``;
* the fixed cost ``R`` of one round trip: one released sum over records of 1 row per
  partition (the per-call overhead: one message to every worker's actor holding its
  partitions, and their partition sums back; `pymc_dp.records.dask_store`);

and fits the model ``T(W, n) = c n / W + k R`` of an iteration on ``W`` workers, with ``c``
the single-process compute time per record and iteration (from the largest ``n``) and ``k``
the round trips per iteration (``L`` for DPHMC, 1 for the penalty step); for the
minibatch step ``T(W, B) = c_B B / W + R`` with ``c_B`` its single-process time per
minibatch record (independent of ``n``). Printed: the
measurements, the model's prediction for ``W = 2`` next to the measured Dask time (how well
the model fits here), and its prediction for ``n = 10^9`` on ``W = 100`` workers.

``ratio`` is one process / Dask (below 1: the cluster run is slower), ``Dask/1 proc`` its
inverse (issue 28's goal: at most 2 at ``n = 10^6`` on 2 workers). ``CPU s/iter`` is the
CPU time per iteration (mean over the timed iterations) of the one process, and of the
driver plus every worker process for Dask: on a host whose cores are busy with other work
the wall times mostly measure how much CPU the processes were given, the CPU times what
the work cost. ``faults/iter`` counts the minor page faults per iteration of the one
process, and of every worker process for Dask. Dask starts its workers with
``MALLOC_TRIM_THRESHOLD_=65536``, which also turns off glibc's adaptive mmap threshold:
every large temporary array of a per-record function is then a fresh ``mmap``, about 3 000
page faults per 250 000-record partition and released sum, about 1 microsecond of CPU each
(docs/scaling-out.md, "The workers' allocator"). ``--malloc`` chooses the workers'
environment: ``dask`` (Dask's default), ``glibc`` (started without the variable) or
``both`` (the default: one table each, ``glibc`` first).

Timings are medians of ``--iterations`` iterations after two warm-up iterations. The host's
cores are shared by the driver and the workers (and by anything else running): on a
2-core machine two workers cannot both run at full speed while the driver waits, so the
measured speed-up is a lower bound of what separate machines give.

Usage::

    python benchmarks/bench_distributed.py                  # n = 1e6, 1e7
    python benchmarks/bench_distributed.py --quick          # n = 2000: a smoke run
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
import warnings

_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
for _var in _THREADS:
    os.environ.setdefault(_var, "1")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import numpy as np  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import pymc_dp  # noqa: E402
from pymc_dp.distributed import DaskRecords  # noqa: E402
from pymc_dp.experiments.models import banana  # noqa: E402

L = 5  # leapfrog steps of DPHMC: L round trips per iteration (kept start gradient, fused ratio)
B = 1000  # expected minibatch of DPSGLD (1 released sum per iteration)
PARTITIONS = 4  # partitions of the records (2 per worker)


def _steps(model, records, chunk):
    kw = {} if records is not None else {"chunk_size": chunk}
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmc = pymc_dp.DPHMC(
            llr_clip_bound=1.0,
            grad_clip_bound=1.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=L,
            step_size=1e-3,
            adapt_mass_matrix=False,
            records=records,
            rng=np.random.default_rng(1),
            **kw,
        )
        pen = pymc_dp.DPPenaltyMetropolis(
            clip_bound=1.0,
            noise_multiplier=1.0,
            scaling=1e-3,
            records=records,
            rng=np.random.default_rng(2),
            **kw,
        )
        sgld = pymc_dp.DPSGLD(
            clip_bound=1.0,
            step_size=1e-6,
            batch_size=B,
            noise_multiplier=1.0,
            records=records,
            rng=np.random.default_rng(3),
            **kw,
        )
    return {"DPHMC": hmc, "DPPenaltyMetropolis": pen, f"DPSGLD (B={B})": sgld}


def _per_iteration(step, model, iterations: int, client=None) -> tuple[float, float, float]:
    """Median wall time, mean CPU time and mean page faults per iteration (the one process;
    or the driver plus every worker for CPU, every worker for the faults)."""
    point = model.initial_point()
    for _ in range(2):  # warm-up: compilation on the workers, first shipping
        point, _ = step.step(point)
    times = []
    workers, faults = _workers_usage(client)
    own = time.process_time()
    own_faults = _minor_faults()
    for _ in range(iterations):
        t = time.perf_counter()
        point, _ = step.step(point)
        times.append(time.perf_counter() - t)
    own = time.process_time() - own
    own_faults = _minor_faults() - own_faults
    cpu, flt = _workers_usage(client)
    faults = (flt - faults) if client is not None else own_faults
    return statistics.median(times), (own + cpu - workers) / iterations, faults / iterations


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _usage() -> tuple[float, int]:
    return time.process_time(), _minor_faults()


def _workers_usage(client) -> tuple[float, int]:
    """CPU seconds and minor page faults so far of every worker process (0 without one)."""
    if client is None:
        return 0.0, 0
    used = client.run(_usage).values()
    return sum(u[0] for u in used), sum(u[1] for u in used)


def _round_trip(client, model_small, iterations: int) -> float:
    """One released sum over records of one row per partition: the fixed cost of a call."""
    x = np.zeros((PARTITIONS, 2))
    recs = DaskRecords(client, {"x": da.from_array(x, chunks=(1, 2))})
    with model_small, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, records=recs)
    fns = step._fns
    q0, q1 = np.zeros(2), np.full(2, 0.01)
    fns.clipped_loglik_ratio_sum(q1, q0, 0.1)
    times = []
    for _ in range(max(20, 10 * iterations)):
        t = time.perf_counter()
        fns.clipped_loglik_ratio_sum(q1, q0, 0.1)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _measure(args, malloc: str) -> tuple[list, float, str]:
    """The rows and ``R`` on a fresh cluster whose workers have the environment ``malloc``."""
    environ = dict(dask.config.get("distributed.nanny.pre-spawn-environ"))
    if malloc == "glibc":
        # Dask's nanny writes its pre-spawn variables into this process's os.environ (and
        # leaves them there): drop the variable from both, or the workers inherit it
        environ.pop("MALLOC_TRIM_THRESHOLD_", None)
        os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    small = banana(n=10, seed=0)
    rows = []
    with (
        dask.config.set({"distributed.nanny.pre-spawn-environ": environ}),
        LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        seen = set(client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values())
        rt = _round_trip(client, small.model, args.iterations)
        for n in args.sizes:
            full = banana(n=n, seed=0)
            chunk = -(-n // PARTITIONS)
            x = np.asarray(full.data)
            recs = DaskRecords(client, {"x": da.from_array(x, chunks=(chunk, x.shape[1]))})
            local = _steps(full.model, None, chunk)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # WorkerMallocWarning: the table says it
                remote = _steps(banana(n=10, seed=0).model, recs, chunk)
            for name in local:
                t1, cpu1, f1 = _per_iteration(local[name], full.model, args.iterations)
                tw, cpuw, fw = _per_iteration(remote[name], small.model, args.iterations, client)
                rows.append((name, n, t1, tw, cpu1, cpuw, f1, fw))
            del local, remote, recs, full, x
    trim = ", ".join(sorted(str(v) if v is not None else "unset (glibc default)" for v in seen))
    return rows, rt, trim


def _report(args, rows, rt: float, trim: str) -> None:
    print(
        f"LocalCluster: {args.workers} worker processes x 1 thread; {PARTITIONS} partitions; "
        f"host: {os.cpu_count()} cores, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}; workers' MALLOC_TRIM_THRESHOLD_: "
        f"{trim}"
    )
    print(
        f"round trip R (one released sum, {PARTITIONS} partitions of 1 record): {rt * 1e3:.2f} ms"
    )
    print()
    head = (
        f"{'step':<20} {'n':>11} | {'1 process s/iter':>16} {'Dask s/iter':>12} "
        f"{'ratio':>7} | {'model W=2':>10} | {'Dask/1 proc':>11} | "
        f"{'CPU s/iter: 1 proc':>18} {'Dask':>9} | {'faults/iter: 1 proc':>19} {'Dask':>8}"
    )
    print(head)
    print("-" * len(head))
    k = {"DPHMC": L, "DPPenaltyMetropolis": 1}
    n_max = max(args.sizes)
    c = {name: t1 / n for name, n, t1, *_ in rows if n == n_max}
    mb = f"DPSGLD (B={B})"  # minibatch: the work is B rows, whatever n
    c[mb] = min(t1 for name, _, t1, *_ in rows if name == mb) / B
    for name, n, t1, tw, cpu1, cpuw, f1, fw in rows:
        if name == mb:
            model_w = c[name] * B / args.workers + rt
        else:
            model_w = c[name] * n / args.workers + k[name] * rt
        print(
            f"{name:<20} {n:>11,d} | {t1:>16.4g} {tw:>12.4g} {t1 / tw:>#7.3g} | "
            f"{model_w:>10.4g} | {tw / t1:>11.3g} | {cpu1:>18.4g} {cpuw:>9.4g} | "
            f"{f1:>19.0f} {fw:>8.0f}"
        )
    print()
    print("model T(W, n) = c n / W + k R  (c from the single-process run at the largest n)")
    for name in k:
        pred = c[name] * 1e9 / 100 + k[name] * rt
        print(
            f"  {name:<20} c = {c[name] * 1e9:.4g} ns/record, k = {k[name]} round trips: "
            f"predicted n = 1e9 on W = 100: {pred:.4g} s/iter "
            f"(compute {c[name] * 1e9 / 100:.4g} s + round trips {k[name] * rt:.4g} s)"
        )
    print(
        f"  {mb:<20} c_B = {c[mb] * 1e9:.4g} ns/minibatch record (the fastest single-process "
        f"n), 1 round trip: T(W, B) = c_B B / W + R, independent of n: "
        f"{c[mb] * B / 100 + rt:.4g} s/iter on W = 100"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 2000, one timed iteration")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="values of n")
    ap.add_argument("--iterations", type=int, default=None, help="timed iterations per point")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument(
        "--malloc",
        choices=("dask", "glibc", "both"),
        default=None,
        help="the workers' allocator settings: Dask's default MALLOC_TRIM_THRESHOLD_=65536 "
        "(dask), glibc's defaults as in the one process (glibc), or one table each (both; "
        "the default, dask with --quick)",
    )
    ap.add_argument("--glibc-malloc", action="store_true", help="the same as --malloc glibc")
    args = ap.parse_args(argv)
    args.sizes = args.sizes or ([2_000] if args.quick else [1_000_000, 10_000_000])
    args.iterations = args.iterations or (1 if args.quick else 3)
    malloc = "glibc" if args.glibc_malloc else args.malloc or ("dask" if args.quick else "both")
    # glibc first: Dask's nanny leaves MALLOC_TRIM_THRESHOLD_ in this process's environment
    for setting in ("glibc", "dask") if malloc == "both" else (malloc,):
        _report(args, *_measure(args, setting))
        print()


if __name__ == "__main__":
    main()
