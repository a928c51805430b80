"""Per-iteration cost of DPFastMH against the full-batch DPPenaltyMetropolis.

Logistic regression, d = 10 features row-normalised to ||x_i|| = 1 (a per-record transform
that does not depend on other records), no intercept. Then
|log p(y_i | x_i, w') - log p(y_i | x_i, w)| <= ||x_i|| ||w' - w|| <= ||w' - w||, so c_i = 1 is
a valid, public bound and clipping is never active.

Both steps use the same proposal: a Gaussian random walk with the same per-coordinate scale
(no warmup adaptation). DPFastMH uses lam = 1000 and a step size with C M ~ sqrt(lam), which
keeps TunaMH's efficiency factor exp(-C^2 M^2 / lam) near 1/e (paper Theorem 4); the
full-batch branch threshold K is the default (full batch in <= 0.1 % of iterations).

Printed per n: DPFastMH seconds per iteration, mean batch size (records read per iteration,
full-batch iterations included), fraction of full-batch iterations and acceptance rate;
DPPenaltyMetropolis seconds per iteration and acceptance rate; the speed-up.

Per *iteration* is what is measured. With global bounds c_i = ||x_i||, TunaMH needs
lam ~ (C M)^2 for a good acceptance rate, so at steps of the posterior's scale
(M ~ 1/sqrt(n)) its batch would exceed n: the small batches here come with steps far below
the posterior scale (printed as "step / post. sd"), i.e. slow mixing per iteration.

Usage::

    python benchmarks/bench_fastmh.py [--quick] [--sizes 10000 100000 1000000]
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
import pymc as pm

import pymc_dp

warnings.filterwarnings("ignore", message=".*BLAS.*")

D = 10
LAM = 1000.0


def make_model(n: int, seed: int = 0) -> pm.Model:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # ||x_i|| = 1: c_i = 1 is a valid bound
    w_true = rng.normal(scale=3.0, size=D)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-X @ w_true))).astype(np.int8)
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, 10.0, shape=D)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, w), observed=y)
    return model


def time_step(step, model: pm.Model, iterations: int, warmup: int = 5) -> tuple[float, list]:
    """Seconds per ``step.step`` call (after ``warmup`` calls) and the stats of the timed calls."""
    if hasattr(pm.step_methods.arraystep.ArrayStepShared, "setup_chain"):  # PyMC 6
        step.setup_chain(np.random.default_rng(1), 0, warmup + iterations)
    else:  # PyMC 5
        step.set_rng(np.random.default_rng(1))
    step.tune = False
    point = model.initial_point()
    for _ in range(warmup):
        point, _ = step.step(point)
    stats = []
    t0 = time.perf_counter()
    for _ in range(iterations):
        point, st = step.step(point)
        stats.append(st[0])
    return (time.perf_counter() - t0) / iterations, stats


def bench(n: int, quick: bool) -> dict:
    model = make_model(n)
    # Proposal: per-coordinate std s, so M ~ s sqrt(D); C M ~ sqrt(LAM) with C = n.
    s = np.sqrt(LAM) / (n * np.sqrt(D))
    post_sd = np.sqrt(D / (0.2 * n))  # rough per-coordinate posterior sd (Fisher info n/(5D))
    with model:
        fast = pymc_dp.DPFastMH(
            clip_bound=1.0,
            max_step=3.0 * s * np.sqrt(D),
            lam=LAM,
            iter_epsilon=0.5,
            iter_delta=0.1 / n,
            proposal_scale=s,
        )
        pen = pymc_dp.DPPenaltyMetropolis(
            clip_bound=1.0, noise_multiplier=fast.noise_multiplier[1], proposal_scale=s
        )
    it_fast = 300 if quick else 3000
    it_pen = (3 if quick else 20) if n >= 1_000_000 else (10 if quick else 100)
    t_fast, st_fast = time_step(fast, model, it_fast)
    t_pen, st_pen = time_step(pen, model, it_pen)
    return {
        "n": n,
        "fast_s": t_fast,
        "batch": float(np.mean([st["batch_size"] for st in st_fast])),
        "full": float(np.mean([st["full_batch"] for st in st_fast])),
        "acc_fast": float(np.mean([st["accepted"] for st in st_fast])),
        "pen_s": t_pen,
        "acc_pen": float(np.mean([st["accepted"] for st in st_pen])),
        "K": fast.max_batch,
        "step_ratio": s / post_sd,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed iterations")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000], help="values of n"
    )
    args = parser.parse_args()
    import pytensor

    print(
        f"pymc {pm.__version__}, pytensor {pytensor.__version__}; logistic regression d = {D}, "
        f"c_i = 1, lam = {LAM:g}, per-iteration (0.5, 0.1/n)-DP"
    )
    header = (
        f"{'n':>9} | {'FastMH s/it':>11} {'mean batch':>10} {'full %':>6} {'acc':>5} | "
        f"{'Penalty s/it':>12} {'acc':>5} | {'speed-up':>8} | {'step / post. sd':>15}"
    )
    print(header)
    print("-" * len(header))
    for n in args.sizes:
        r = bench(n, args.quick)
        print(
            f"{r['n']:>9} | {r['fast_s']:>11.2e} {r['batch']:>10.1f} {100 * r['full']:>6.2f} "
            f"{r['acc_fast']:>5.2f} | {r['pen_s']:>12.2e} {r['acc_pen']:>5.2f} | "
            f"{r['pen_s'] / r['fast_s']:>7.1f}x | {r['step_ratio']:>15.2e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
