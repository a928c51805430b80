"""CPU time per iteration of DPHMC on the banana against ``pm.HamiltonianMC`` (issue 28).

Three steps timed in interleaved blocks, CPU time of this thread (``time.thread_time``:
less sensitive than the wall clock to other jobs on a shared machine): ``new`` (DPHMC as
shipped: the affine bypass, `pymc_dp.records.affine`), ``base`` (the same step with the
bypass off: the route's per-record loop on every record, the fused last pass) and
``pymc`` (``pm.HamiltonianMC``, the same ``L`` and step size). Medians of ``--blocks``
blocks of ``--iters`` iterations; prints the load average first::

    OMP_NUM_THREADS=1 python benchmarks/bench_banana_cpu.py --repeats 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

import bench_models as bm  # noqa: E402
from bench_vs_pymc import Runner  # noqa: E402


def cpu_per_iter(r: Runner, iters: int) -> float:
    t = time.thread_time()
    r.run(iters)
    return (time.thread_time() - t) / iters


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--blocks", type=int, default=7)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    model, _ = bm.banana(a.n, np.random.default_rng(0))
    new = bm.make_dp("DPHMC", model, None)
    base = bm.make_dp("DPHMC", model, None)
    base._fns._affine_off = True
    pymc_step = bm.make_pymc_step("DPHMC", model, "logistic")
    runners = {
        "new": Runner(new, model),
        "base": Runner(base, model),
        "pymc": Runner(pymc_step, model),
    }
    for r in runners.values():
        r.run(20)
    for _ in range(a.repeats):
        print("load", os.getloadavg(), flush=True)
        times = {k: [] for k in runners}
        for _ in range(a.blocks):
            for k, r in runners.items():
                times[k].append(cpu_per_iter(r, a.iters))
        m = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
        print(
            f"CPU ms/it new {m['new']:.4f} base {m['base']:.4f} pymc {m['pymc']:.4f} | "
            f"ratios new/pymc {m['new'] / m['pymc']:.2f} base/pymc {m['base'] / m['pymc']:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
