"""Time to construct each pymc_dp step (PyTensor graph rewriting and compilation) vs PyMC's.

For each model (``logistic``: Bayesian logistic regression, ``d = 10``; ``banana``: the DP-HMC
paper's banana likelihood, ``d = 2``; both defined in ``bench_vs_pymc.py``) and each pair
(DPHMC / pm.HamiltonianMC, DPPenaltyMetropolis / pm.Metropolis, DPFastMH / pm.Metropolis),
prints the wall time of

* ``construct``: the step's constructor inside the model context. For the pymc_dp steps this
  is the per-record graph rewrite, compiling the per-record log-likelihood and prior
  functions (``pymc_dp.records.build_record_functions``), the start-point check and the noise
  calibration; for PyMC's steps, compiling the model's log-density (and its gradient for HMC);
* ``1st iter``: the first ``step.step`` call. DPHMC compiles its per-record gradient
  functions lazily here (and verifies the GLM factorisation on data-free stand-in records);
  steady-state iterations cost what ``bench_vs_pymc.py`` prints.

Rounds are interleaved (DP step, PyMC step, next pair, ...) and the median over rounds is
printed. A first, unreported round on a 100-record model of every step loads PyTensor's
compiled C modules from its on-disk cache, so every reported number is with a warm cache
(as in any session after the first: the first-ever compilation of a graph's C code on a
machine takes longer and is cached in ``pytensor.config.compiledir``).

Usage::

    python benchmarks/bench_construct.py            # n = 100 000, 3 rounds
    python benchmarks/bench_construct.py --quick    # n = 10 000, 1 round, no warm-up round
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
from bench_vs_pymc import (  # noqa: E402
    MODELS,
    PYMC_NAME,
    STEP_KINDS,
    limit_blas,
    make_dp_step,
    make_pymc_step,
    print_header,
    start_chain,
)


def construct_and_first_step(factory, model) -> tuple[float, float]:
    """Seconds to construct the step and seconds of its first iteration."""
    t0 = time.perf_counter()
    step = factory()
    t1 = time.perf_counter()
    start_chain(step)
    point = model.initial_point()
    t2 = time.perf_counter()
    step.step(point)
    t3 = time.perf_counter()
    return t1 - t0, t3 - t2


def build(model_name: str, n: int):
    return MODELS[model_name](n)


def run(model_names, kinds, n: int, rounds: int, warmup: bool = True) -> list[dict]:
    """Interleaved rounds; returns one dict per (model, kind) with median times."""
    models = {m: build(m, n) for m in model_names}
    # Warm-up round on tiny models: load cached C modules, import lazily imported code.
    for m in model_names if warmup else ():
        tiny = build(m, 100)
        for kind in kinds:
            with warnings.catch_warnings():  # DPFastMH: batch > n on 100 records
                warnings.simplefilter("ignore", UserWarning)
                construct_and_first_step(lambda k=kind, t=tiny, m=m: make_dp_step(k, t, m), tiny)
            construct_and_first_step(lambda k=kind, t=tiny, m=m: make_pymc_step(k, t, m), tiny)
    times: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for _ in range(rounds):
        for m in model_names:
            model = models[m]
            for kind in kinds:
                for side, make in (("dp", make_dp_step), ("pymc", make_pymc_step)):
                    times.setdefault((m, kind, side), []).append(
                        construct_and_first_step(
                            lambda k=kind, mod=model, m=m, f=make: f(k, mod, m), model
                        )
                    )
    out = []
    for m in model_names:
        for kind in kinds:
            dp = np.median(np.array(times[(m, kind, "dp")]), axis=0)
            ref = np.median(np.array(times[(m, kind, "pymc")]), axis=0)
            out.append(
                {
                    "model": m,
                    "kind": kind,
                    "pymc_name": PYMC_NAME[kind],
                    "n": n,
                    "dp_construct": float(dp[0]),
                    "dp_first": float(dp[1]),
                    "pymc_construct": float(ref[0]),
                    "pymc_first": float(ref[1]),
                }
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 10 000, 1 round (< 30 s)")
    ap.add_argument("--n", type=int, default=None, help="records (default 100 000)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 3)")
    ap.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for both sides")
    ap.add_argument(
        "--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models"
    )
    ap.add_argument(
        "--steps", nargs="+", default=list(STEP_KINDS), choices=STEP_KINDS, help="DP steps"
    )
    args = ap.parse_args(argv)
    limit_blas(args.blas_threads)
    n = args.n or (10_000 if args.quick else 100_000)
    rounds = args.rounds or (1 if args.quick else 3)
    print_header("bench_construct: time to construct each step (compilation), DP vs PyMC")
    warm = not args.quick
    print(
        f"n = {n:,d}; median of {rounds} interleaved round(s); "
        + (
            "after an unreported warm-up round (warm PyTensor C cache)"
            if warm
            else "--quick: no warm-up round, so the first pair also pays loading the C cache"
        )
    )
    header = (
        f"{'DP step':<20} {'PyMC step':<17} {'model':<8} | {'DP construct s':>14} "
        f"{'DP 1st iter s':>13} | {'PyMC construct s':>16} {'PyMC 1st iter s':>15} | "
        f"{'ratio construct':>15} {'ratio constr.+1st':>17}"
    )
    print(header)
    print("-" * len(header), flush=True)
    for r in run(args.models, args.steps, n, rounds, warmup=warm):
        dp_total = r["dp_construct"] + r["dp_first"]
        ref_total = r["pymc_construct"] + r["pymc_first"]
        print(
            f"{r['kind']:<20} {r['pymc_name']:<17} {r['model']:<8} | "
            f"{r['dp_construct']:>14.2f} {r['dp_first']:>13.2f} | "
            f"{r['pymc_construct']:>16.2f} {r['pymc_first']:>15.2f} | "
            f"{r['dp_construct'] / r['pymc_construct']:>15.2f} "
            f"{dp_total / ref_total:>17.2f}",
            flush=True,
        )
    print()
    print(
        "ratio construct = DP construct / PyMC construct; ratio constr.+1st = (construct + "
        "first iteration) DP / PyMC (DPHMC compiles its per-record gradients on the first "
        "iteration)."
    )


if __name__ == "__main__":
    main()
