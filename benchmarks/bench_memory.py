"""Peak memory of each pymc_dp step vs PyMC's sampler at n = 10^6, with and without chunking.

Bayesian logistic regression, ``d = 10``, ``n = 10^6`` (``bench_vs_pymc.logistic_model``;
the data, ``X`` in float64 and ``y`` in int8, take 77 MB; DPHMC takes its GLM route, which
never forms the ``n x d`` per-record gradients), or with ``--model banana`` the DP-HMC
paper's banana (``d = 2``, 15 MB; DPHMC's generic route forms ``n x d`` per-record gradients
and their norms). Every configuration runs in a
fresh Python process (so that the process's peak RSS is that of the run alone): build the
model, construct the step, run 2 warm-up iterations (DPHMC compiles its gradients lazily),
then the measured iterations. Printed per configuration:

* ``iter peak MB``: the largest extra allocation while iterating, traced with
  ``tracemalloc`` (numpy and PyTensor output buffers are traced): the temporaries of an
  iteration, which ``chunk_size`` bounds;
* ``RSS iter MB``: the process's peak resident set during the measured iterations (VmHWM,
  reset just before them through ``/proc/self/clear_refs``; "n/a" where the kernel does not
  allow it);
* ``max RSS MB``: the process's peak resident set over the whole run (``ru_maxrss``):
  interpreter, PyMC and PyTensor, the data, the model's graph and compiled functions, and
  the iterations.

``chunk_size``: the pymc_dp steps evaluate the per-record functions (log-likelihoods,
clipped log-likelihood ratios, per-record gradients) on ``chunk_size`` records per call of
the compiled function and add up the results, so an iteration's temporaries are of size
``chunk_size`` (``chunk_size x d`` for per-record gradients) instead of ``n`` (``n x d``).
The data are sliced, not copied; the sums, and so the released values, are the same up to
floating-point summation order. It costs one compiled-function call per chunk (Python
overhead, small for chunks of 10^4 and more). DPFastMH's minibatch iterations read only
the sampled rows and do not depend on it; its rare full-batch iterations (at most 0.1 % by
default) do. PyMC's samplers have no such option: ``pm.HamiltonianMC`` and
``pm.Metropolis`` evaluate the summed log-density, whose fused elementwise graph keeps
``O(n)`` temporaries.

Usage::

    python benchmarks/bench_memory.py                  # n = 10^6, chunk_size = n / 16
    python benchmarks/bench_memory.py --quick          # n = 10^5, all in one process
    python benchmarks/bench_memory.py --chunk-size 10000
    python benchmarks/bench_memory.py --model banana   # DPHMC's generic route (n x d grads)
    python benchmarks/bench_memory.py --auto --n 300000  # automatic mode vs NUTS, 50 groups
    python benchmarks/bench_memory.py --auto --auto-model logistic5  # logistic, d = 5

With ``--auto``: the automatic mode (``pymc_dp.sample`` with a target epsilon and no step;
2 chains, ``max_iterations`` 400) against ``pm.sample`` with NUTS (1 chain, 100 tuning
iterations and 100 draws) on a 50-group hierarchical normal model (``d = 53``: each record's
gradient has 4 non-zero coordinates; ``--auto-model hier50``, the default) or a logistic
regression with ``d = 5`` (``--auto-model logistic5``, `bench_vs_pymc.logistic_model`),
each in a fresh process; printed: the process's peak RSS (``ru_maxrss``), the RSS once the
model is built, and the seconds of the run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tracemalloc
import warnings

import numpy as np
import pymc as pm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_vs_pymc import (  # noqa: E402
    MODELS,
    Runner,
    limit_blas,
    make_dp_step,
    make_pymc_step,
    print_header,
)

D = 10

#: (label, step kind, chunked): chunked is True/False for a pymc_dp step, None for the
#: PyMC counterpart of that kind (no chunking option).
CONFIGS = [
    ("DPHMC", "DPHMC", False),
    ("DPHMC", "DPHMC", True),
    ("pm.HamiltonianMC", "DPHMC", None),
    ("DPPenaltyMetropolis", "DPPenaltyMetropolis", False),
    ("DPPenaltyMetropolis", "DPPenaltyMetropolis", True),
    ("pm.Metropolis", "DPPenaltyMetropolis", None),
    ("DPFastMH", "DPFastMH", False),
]


def _status_kb(field: str) -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process; False if not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def build(model_name: str, n: int):
    """The benchmark model with ``n`` records (logistic: d = 10)."""
    return MODELS[model_name](n, D) if model_name == "logistic" else MODELS[model_name](n)


def data_mb(model_name: str, n: int) -> float:
    """Size of the data arrays: logistic X float64 (n x 10) and y int8; banana 2 float64."""
    return (n * D * 8 + n) / 2**20 if model_name == "logistic" else n * 2 * 8 / 2**20


def measure(
    label: str,
    kind: str,
    chunked: bool | None,
    n: int,
    chunk: int,
    iters: int,
    model_name: str = "logistic",
) -> dict:
    """Memory of one configuration in this process (see the module docstring)."""
    model = build(model_name, n)
    rss_model = _status_kb("VmRSS") / 1024
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        if chunked is None:
            step = make_pymc_step(kind, model, model_name)
        else:
            step = make_dp_step(kind, model, model_name, chunk_size=chunk if chunked else None)
    runner = Runner(step, model)
    runner.run(2)  # warm-up: lazily compiled functions, cached row norms, first buffers
    reset = _reset_peak_rss()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    t = runner.run(iters)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_iter = _status_kb("VmHWM") / 1024 if reset else float("nan")
    return {
        "label": label,
        "chunk_size": (chunk if chunked else None) if chunked is not None else None,
        "chunkable": chunked is not None,
        "n": n,
        "iter_peak_mb": (peak - base) / 2**20,
        "rss_model_mb": rss_model,
        "rss_iter_mb": rss_iter,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "ms_per_iter": t * 1e3,
        "iters": iters,
    }


AUTO_CONFIGS = ["pymc_dp.sample auto", "pm.sample NUTS"]


def hier50(n: int) -> pm.Model:
    """``y_i ~ N(mu + tau z[g_i], sigma)``, 50 groups (non-centred), ``d = 53``."""
    rng = np.random.default_rng(0)
    groups = 50
    g = rng.integers(groups, size=n)
    y = np.clip(rng.normal(1, 0.5, groups)[g] + rng.normal(0, 1, n), -6, 8)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=groups)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", mu + tau * z[g], sigma, observed=y)
    return model


#: ``--auto-model``: name -> (description, model builder of ``n``).
AUTO_MODELS = {
    "hier50": ("hierarchical normal, 50 groups (d = 53)", hier50),
    "logistic5": ("logistic regression (d = 5)", lambda n: MODELS["logistic"](n, 5)),
}


def measure_auto(which: int, n: int, model_name: str = "hier50") -> dict:
    """Peak RSS of the automatic mode (0) or of NUTS (1) on an `AUTO_MODELS` model in this
    process."""
    import time

    import pymc_dp

    model = AUTO_MODELS[model_name][1](n)
    rss_model = _status_kb("VmRSS") / 1024
    t = time.perf_counter()
    with warnings.catch_warnings(), model:
        warnings.simplefilter("ignore")
        if which == 0:
            pymc_dp.sample(
                epsilon=1.0, delta=0.1 / n, chains=2, random_seed=1, progressbar=False,
                compute_convergence_checks=False, auto_kwargs={"max_iterations": 400},
            )  # fmt: skip
        else:
            pm.sample(
                100, tune=100, chains=1, cores=1, random_seed=1, progressbar=False,
                compute_convergence_checks=False,
            )  # fmt: skip
    return {
        "label": AUTO_CONFIGS[which],
        "n": n,
        "rss_model_mb": rss_model,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "seconds": time.perf_counter() - t,
    }


def main_auto(n: int, model_name: str = "hier50") -> None:
    """The automatic mode against NUTS, each in a fresh process (``--auto``)."""
    print_header("bench_memory --auto: peak memory of the automatic mode vs pm.sample (NUTS)")
    print(f"{AUTO_MODELS[model_name][0]}, n = {n:,d}; each run in a fresh process")
    header = f"{'run':<22} | {'max RSS MB':>10} {'RSS after data MB':>17} | {'seconds':>8}"
    print(header)
    print("-" * len(header), flush=True)
    rows = []
    for i in range(len(AUTO_CONFIGS)):
        cmd = [sys.executable, os.path.abspath(__file__), "--auto-child", str(i), "--n", str(n)]
        cmd += ["--auto-model", model_name]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.strip().splitlines()[-1])
        rows.append(r)
        print(
            f"{r['label']:<22} | {r['max_rss_mb']:>10.0f} {r['rss_model_mb']:>17.0f} | "
            f"{r['seconds']:>8.1f}",
            flush=True,
        )
    print(f"\nauto / NUTS peak RSS: {rows[0]['max_rss_mb'] / rows[1]['max_rss_mb']:.2f}")


def _iters(kind: str, quick: bool) -> int:
    if kind == "DPFastMH":
        return 50 if quick else 200
    return 2 if quick else 3


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 10^5, all in one process")
    ap.add_argument("--n", type=int, default=None, help="records (default 10^6)")
    ap.add_argument("--chunk-size", type=int, default=None, help="default n / 16")
    ap.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for both sides")
    ap.add_argument(
        "--model",
        default="logistic",
        choices=list(MODELS),
        help="logistic (d = 10, GLM route of DPHMC) or banana (d = 2, generic route)",
    )
    ap.add_argument("--auto", action="store_true", help="automatic mode vs NUTS")
    ap.add_argument(
        "--auto-model", default="hier50", choices=list(AUTO_MODELS), help="the --auto model"
    )
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--auto-child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    limit_blas(args.blas_threads)
    n = args.n or (100_000 if args.quick else 1_000_000)
    if args.auto_child is not None:
        print(json.dumps(measure_auto(args.auto_child, n, args.auto_model)))
        return
    if args.auto:
        main_auto(n, args.auto_model)
        return
    chunk = args.chunk_size or max(n // 16, 1)

    if args.child is not None:  # one configuration, in a fresh process
        label, kind, chunked = CONFIGS[args.child]
        r = measure(label, kind, chunked, n, chunk, _iters(kind, False), args.model)
        print(json.dumps(r))
        return

    print_header("bench_memory: peak memory while iterating, pymc_dp step vs PyMC")
    what = f"logistic regression, d = {D}" if args.model == "logistic" else "banana, d = 2"
    print(
        f"{what}, n = {n:,d}; data {data_mb(args.model, n):.0f} MB; chunked runs use "
        f"chunk_size = {chunk:,d}; "
        + (
            "--quick: all configurations in this one process (max RSS is cumulative)"
            if args.quick
            else "each configuration in a fresh process"
        )
    )
    header = (
        f"{'step':<20} {'chunk_size':>10} | {'iter peak MB':>12} {'RSS iter MB':>11} "
        f"{'max RSS MB':>10} {'RSS after data MB':>17} | {'ms/iter':>8} {'iters':>5}"
    )
    print(header)
    print("-" * len(header), flush=True)
    for i, (label, kind, chunked) in enumerate(CONFIGS):
        if args.quick:
            r = measure(label, kind, chunked, n, chunk, _iters(kind, True), args.model)
        else:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", str(i), "--n", str(n)]
            cmd += ["--model", args.model]
            cmd += ["--chunk-size", str(chunk), "--blas-threads", str(args.blas_threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
        cs = f"{r['chunk_size']:,d}" if r["chunk_size"] else ("none" if r["chunkable"] else "-")
        print(
            f"{r['label']:<20} {cs:>10} | {r['iter_peak_mb']:>12.1f} {r['rss_iter_mb']:>11.0f} "
            f"{r['max_rss_mb']:>10.0f} {r['rss_model_mb']:>17.0f} | {r['ms_per_iter']:>8.1f} "
            f"{r['iters']:>5d}",
            flush=True,
        )
    print()
    print(
        "iter peak MB = largest extra allocation while iterating (tracemalloc); RSS iter MB = "
        "peak RSS during the measured iterations; max RSS MB = peak RSS of the whole process; "
        "RSS after data MB = RSS once the model (with its data) is built; chunk_size '-' = "
        "PyMC sampler (no chunking option)."
    )


if __name__ == "__main__":
    main()
