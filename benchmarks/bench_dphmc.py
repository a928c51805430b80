"""Benchmark: DPHMC against PyMC's own HamiltonianMC on logistic regression.

Times, in one process, one iteration of ``pymc_dp.DPHMC`` and of ``pm.HamiltonianMC`` with
the same number of leapfrog steps ``L`` and the same (fixed) step size, on a logistic
regression with ``n`` records and ``d = 10`` coefficients, and prints the per-iteration time
of each and their ratio (goal: DPHMC at most 1.5x PyMC's HMC). Both samplers evaluate the
gradient ``L + 1`` times per iteration; DPHMC also computes per-record gradients, clips
them, draws the noise and evaluates the log-likelihood ratio of the penalty test once.
Then it prints DPHMC's per-iteration time at several ``n`` (expected linear in ``n``) and
its peak memory at the largest ``n`` with and without chunking (each in a fresh
subprocess, so that peak RSS is that of the run alone).

The two samplers are timed in interleaved blocks and the medians reported, so that load
from other processes affects both alike.

Usage::

    python benchmarks/bench_dphmc.py            # n = 100 000 comparison; 1e4, 1e5, 1e6 scaling
    python benchmarks/bench_dphmc.py --quick    # n = 10 000 comparison; 1e3, 1e4, 1e5 scaling
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import warnings

warnings.filterwarnings("ignore", message=".*BLAS.*")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pymc_dp  # noqa: E402

D = 10


def logistic_model(n: int, seed: int = 0) -> pm.Model:
    """y_i ~ Bernoulli(sigmoid(x_i . beta)), x_i ~ N(0, I_10), beta ~ N(0, 1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    beta = rng.normal(scale=0.5, size=D)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-X @ beta))).astype("int64")
    with pm.Model() as model:
        b = pm.Normal("beta", 0.0, 1.0, shape=D)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, b), observed=y)
    return model


def _dphmc(model, n_leapfrog: int, step_size: float, chunk_size: int | None):
    # |d/dbeta log p(y_i | x_i, beta)| <= ||x_i|| and the log-likelihood is ||x_i||-Lipschitz,
    # so with ||x_i|| mostly below 5 the clipping is nearly inactive. The noise level does not
    # change the cost.
    with model:
        return pymc_dp.DPHMC(
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=n_leapfrog,
            step_size=step_size,
            adapt_step_size=False,
            adapt_mass_matrix=False,
            chunk_size=chunk_size,
            rng=np.random.default_rng(1),
        )


def _pymc_hmc(model, n_leapfrog: int, step_size: float):
    with model:
        step = pm.HamiltonianMC(
            # PyMC takes int(path_length / step_size) steps: this gives exactly n_leapfrog.
            path_length=step_size * n_leapfrog * (1.0 + 1e-9),
            step_scale=step_size * D**0.25,  # PyMC's step size is step_scale / d**(1/4)
            adapt_step_size=False,
            step_rand=lambda s, rng=None: s,  # no jitter: the same L every iteration
            rng=np.random.default_rng(1),
        )
    step.tune = False
    return step


def _time_steps(step, point, iters: int) -> tuple[float, dict]:
    t = time.perf_counter()
    for _ in range(iters):
        point, stats = step.step(point)
    return (time.perf_counter() - t) / iters, point


def compare(n: int, n_leapfrog: int, step_size: float, iters: int, blocks: int) -> dict:
    """Per-iteration time of DPHMC and pm.HamiltonianMC, interleaved blocks, medians."""
    model = logistic_model(n)
    dp = _dphmc(model, n_leapfrog, step_size, None)
    hmc = _pymc_hmc(model, n_leapfrog, step_size)
    start = model.initial_point()
    p_dp, p_hmc = dict(start), dict(start)
    _, p_dp = _time_steps(dp, p_dp, 2)  # warm up (first calls, lazy gradient compilation)
    _, p_hmc = _time_steps(hmc, p_hmc, 2)
    _, stats = hmc.step(dict(start))
    n_steps = int(stats[0]["n_steps"])
    assert n_steps == n_leapfrog, (n_steps, n_leapfrog)
    t_dp, t_hmc = [], []
    for _ in range(blocks):
        t, p_dp = _time_steps(dp, p_dp, iters)
        t_dp.append(t)
        t, p_hmc = _time_steps(hmc, p_hmc, iters)
        t_hmc.append(t)
    a, b = float(np.median(t_dp)), float(np.median(t_hmc))
    return {"n": n, "dphmc_s": a, "pymc_hmc_s": b, "ratio": a / b, "pymc_n_steps": n_steps}


def dphmc_time(n: int, n_leapfrog: int, step_size: float, iters: int, chunk) -> float:
    model = logistic_model(n)
    dp = _dphmc(model, n_leapfrog, step_size, chunk)
    point = model.initial_point()
    _, point = _time_steps(dp, point, 2)
    times = []
    for _ in range(3):
        t, point = _time_steps(dp, point, iters)
        times.append(t)
    return float(np.median(times))


def _peak_memory_child(n: int, n_leapfrog: int, step_size: float, chunk: int | None) -> None:
    """Run in a fresh process: print JSON with the memory of a few DPHMC iterations.

    ``peak_rss_mb`` is the whole process (imports, data, PyMC's model, compiled functions);
    ``iteration_peak_mb`` is the largest extra allocation (numpy/PyTensor buffers, traced
    with tracemalloc) while iterating, i.e. what chunking bounds.
    """
    import tracemalloc

    model = logistic_model(n)
    dp = _dphmc(model, n_leapfrog, step_size, chunk)
    point = model.initial_point()
    _, point = _time_steps(dp, point, 1)  # compile lazily built functions first
    tracemalloc.start()
    t, _ = _time_steps(dp, point, 3)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(
        json.dumps(
            {
                "n": n,
                "chunk_size": chunk,
                "peak_rss_mb": peak / 1024,
                "iteration_peak_mb": traced_peak / 2**20,
                "data_mb": n * (D + 1) * 8 / 2**20,
                "seconds_per_iteration": t,
            }
        )
    )


def peak_memory(
    n: int, n_leapfrog: int, step_size: float, chunk: int | None, blas_threads: int | None
) -> dict:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--memory-child",
        str(n),
        "--n-leapfrog",
        str(n_leapfrog),
        "--step-size",
        str(step_size),
        "--chunk-size",
        str(chunk or 0),
    ]
    if blas_threads:
        cmd += ["--blas-threads", str(blas_threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _blas_threads() -> str:
    try:
        from threadpoolctl import threadpool_info

        return ", ".join(
            f"{i['internal_api']}:{i['num_threads']}"
            for i in threadpool_info()
            if i["user_api"] == "blas"
        )
    except ImportError:  # pragma: no cover
        return "unknown (threadpoolctl not installed)"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller n (about 10x faster)")
    ap.add_argument("--n-leapfrog", type=int, default=10)
    ap.add_argument("--step-size", type=float, default=1e-3)
    ap.add_argument("--iters", type=int, default=None, help="iterations per timed block")
    ap.add_argument("--blocks", type=int, default=7, help="interleaved timed blocks")
    ap.add_argument("--chunk-size", type=int, default=None, help="chunk size for the 1e6 run")
    ap.add_argument(
        "--blas-threads",
        type=int,
        default=None,
        help="BLAS threads (threadpoolctl) for every timing; default: compare both as "
        "configured and with 1 thread, scale with 1 thread",
    )
    ap.add_argument("--memory-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.blas_threads:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=args.blas_threads, user_api="blas")
        if args.memory_child is None:
            print(f"BLAS threads limited to {args.blas_threads}")

    if args.memory_child is not None:
        _peak_memory_child(
            args.memory_child, args.n_leapfrog, args.step_size, args.chunk_size or None
        )
        return

    n_main = 10_000 if args.quick else 100_000
    sizes = [1_000, 10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    iters = args.iters or (20 if args.quick else 10)
    chunk = args.chunk_size or max(sizes[-1] // 16, 1)
    L, eta = args.n_leapfrog, args.step_size

    print(
        f"python {platform.python_version()} | pymc {pm.__version__} | pytensor "
        f"{pytensor.__version__} | mode {pytensor.config.mode} | linker "
        f"{pytensor.config.linker} | blas__ldflags {pytensor.config.blas__ldflags!r} | "
        f"BLAS threads {_blas_threads()} | cpus {os.cpu_count()}"
    )
    print(f"logistic regression, d = {D}, L = {L} leapfrog steps, step size {eta:g}")
    print()
    from threadpoolctl import threadpool_limits

    settings = [("BLAS threads as configured", None)]
    if args.blas_threads is None:
        settings.append(("1 BLAS thread", 1))
    for label, threads in settings:
        with threadpool_limits(limits=threads, user_api="blas"):
            r = compare(n_main, L, eta, iters, args.blocks)
        print(
            f"n = {n_main:,d}, {label}: per iteration (median of {args.blocks} interleaved "
            f"blocks x {iters})"
        )
        print(f"  DPHMC            {r['dphmc_s'] * 1e3:9.2f} ms")
        print(f"  pm.HamiltonianMC {r['pymc_hmc_s'] * 1e3:9.2f} ms  ({r['pymc_n_steps']} steps)")
        print(f"  ratio DPHMC / PyMC HMC = {r['ratio']:.2f}  (goal <= 1.5)")
        print()
    # The rest with one BLAS thread: OpenBLAS threads on these small matrix-vector products
    # contend with any other load on the machine and make single timings erratic.
    threadpool_limits(limits=args.blas_threads or 1, user_api="blas")
    threads = args.blas_threads or 1
    print(f"DPHMC per iteration vs n (no chunking, {threads} BLAS thread(s)):")
    base = None
    for n in sizes:
        t = dphmc_time(n, L, eta, max(3, iters * sizes[0] // n), None)
        base = base or t / n
        print(
            f"  n = {n:>9,d}: {t * 1e3:10.2f} ms  ({t / n * 1e9:7.1f} ns per record; "
            f"{t / n / base:.2f} x that of n = {sizes[0]:,d})"
        )
    print()
    print(f"peak memory at n = {sizes[-1]:,d} (fresh process each, 3 iterations):")
    for c in (chunk, None):
        m = peak_memory(sizes[-1], L, eta, c, threads)
        label = f"chunk_size = {c:,d}" if c else "no chunking"
        print(
            f"  {label:>20}: {m['iteration_peak_mb']:8.1f} MB allocated at most while "
            f"iterating; process peak RSS {m['peak_rss_mb']:.0f} MB (data "
            f"{m['data_mb']:.0f} MB); {m['seconds_per_iteration'] * 1e3:.1f} ms per iteration"
        )


if __name__ == "__main__":
    main()
