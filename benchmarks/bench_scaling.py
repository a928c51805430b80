"""Per-iteration time vs n and vs d: each pymc_dp step and its PyMC counterpart, side by side.

Bayesian logistic regression (row-normalised features, ``bench_vs_pymc.logistic_model``):

* vs ``n`` in {10^4, 10^5, 10^6} at ``d = 10``;
* vs ``d`` in {2, 10, 50} at ``n = 10^5``.

For each point, the DP step and PyMC's sampler of the same kind (DPHMC / pm.HamiltonianMC,
DPPenaltyMetropolis / pm.Metropolis, DPFastMH / pm.Metropolis; settings in
``bench_vs_pymc.py``) are timed in interleaved blocks in one process (medians), with the
same number of BLAS threads. Printed: ms per iteration of each, their ratio, the ratio per
PyMC proposal (``pm.Metropolis`` sweeps the ``d`` coordinates one at a time), and the DP
step's time per record relative to the first row of the table (1.00 = linear in ``n``).

Expected: full-data steps (DPHMC, DPPenaltyMetropolis and PyMC's samplers) are linear in
``n``; DPFastMH's iteration reads a minibatch of expected size ``lam + C M`` (about
``lam = 1000`` here, because its step shrinks like ``1/n``), so its time per iteration is
nearly constant in ``n`` and its time per record falls like ``1/n``. Per iteration is not
per effective sample: the DP chains mix more slowly per iteration.

Usage::

    python benchmarks/bench_scaling.py            # n = 1e4, 1e5, 1e6; d = 2, 10, 50
    python benchmarks/bench_scaling.py --quick    # n = 1e3, 1e4; d = 2, 10 at n = 1e4
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_vs_pymc import (  # noqa: E402
    STEP_KINDS,
    limit_blas,
    measure_pair,
    print_header,
)

HEADER = (
    f"{'DP step':<20} {'PyMC step':<17} {'n':>9} {'d':>3} | {'DP ms/iter':>10} "
    f"{'PyMC ms/iter':>12} {'ratio':>7} {'ratio/prop':>10} | {'DP ns/record':>12} "
    f"{'rel. 1st':>10} | note"
)


def row(r: dict, first: dict, per_record_rel: bool) -> str:
    per_record = r["dp_s"] / r["n"]
    if per_record_rel:  # n sweep: 1.00 = linear in n
        rel = per_record / (first["dp_s"] / first["n"])
    else:  # d sweep (same n): per-iteration time relative to the first row
        rel = r["dp_s"] / first["dp_s"]
    return (
        f"{r['kind']:<20} {r['pymc_name']:<17} {r['n']:>9,d} {r['d']:>3d} | "
        f"{r['dp_s'] * 1e3:>10.3f} {r['pymc_s'] * 1e3:>12.3f} {r['ratio']:>#7.3g} "
        f"{r['ratio_per_proposal']:>#10.3g} | {per_record * 1e9:>12.1f} {rel:>#10.3g} | "
        f"{r['note']}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (< 30 s)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="values of n (d = 10)")
    ap.add_argument("--dims", type=int, nargs="+", default=None, help="values of d")
    ap.add_argument("--n-for-dims", type=int, default=None, help="n of the d sweep")
    ap.add_argument("--blocks", type=int, default=None, help="interleaved timed blocks")
    ap.add_argument("--block-seconds", type=float, default=None, help="target block length")
    ap.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for both sides")
    ap.add_argument(
        "--steps", nargs="+", default=list(STEP_KINDS), choices=STEP_KINDS, help="DP steps"
    )
    args = ap.parse_args(argv)
    limit_blas(args.blas_threads)
    sizes = args.sizes or ([1_000, 10_000] if args.quick else [10_000, 100_000, 1_000_000])
    dims = args.dims or ([2, 10] if args.quick else [2, 10, 50])
    n_dims = args.n_for_dims or (10_000 if args.quick else 100_000)
    blocks = args.blocks or (2 if args.quick else 5)
    block_s = args.block_seconds or (0.03 if args.quick else 0.4)

    print_header("bench_scaling: per-iteration time vs n and d, pymc_dp step vs PyMC")
    print(
        f"logistic regression (||x_i|| = 1); medians of {blocks} interleaved blocks of "
        f"~{block_s:g} s; {args.blas_threads} BLAS thread(s)"
    )
    done: dict[tuple[str, int, int], dict] = {}

    def get(kind: str, n: int, d: int) -> dict:
        if (kind, n, d) not in done:
            done[(kind, n, d)] = measure_pair(kind, "logistic", n, d, block_s, blocks)
        return done[(kind, n, d)]

    print()
    print("-- vs n (d = 10) --")
    print(HEADER)
    print("-" * len(HEADER), flush=True)
    for kind in args.steps:
        first = None
        for n in sizes:
            r = get(kind, n, 10)
            first = first or r
            print(row(r, first, True), flush=True)
    print()
    print(f"-- vs d (n = {n_dims:,d}) --")
    print(HEADER)
    print("-" * len(HEADER), flush=True)
    for kind in args.steps:
        first = None
        for d in dims:
            r = get(kind, n_dims, d)
            first = first or r
            print(row(r, first, False), flush=True)
    print()
    print(
        "ratio = DP / PyMC per iteration; ratio/prop = DP ms/iter / (PyMC ms/iter / PyMC "
        "proposals per iteration); DP ns/record = DP time per iteration / n; rel. 1st = vs n: "
        "that per-record time relative to the block's first row (1.00 = linear in n); vs d: "
        "the DP time per iteration relative to the block's first row."
    )


if __name__ == "__main__":
    main()
