"""Per-iteration wall time of each pymc_dp step against PyMC's own sampler of the same kind.

Pairs, each on the same model, in the same process, timed side by side:

* ``DPHMC`` vs ``pm.HamiltonianMC``: the same number of leapfrog steps ``L`` and the same
  (fixed, un-jittered in PyMC) step size. Both evaluate the gradient ``L + 1`` times per
  iteration; DPHMC also clips per-record gradients, draws the noise and evaluates the
  clipped log-likelihood ratio of the penalty test once (Räisä et al., Algorithm 1).
* ``DPPenaltyMetropolis`` vs ``pm.Metropolis``: random-walk Metropolis. DPPenaltyMetropolis
  makes one full-vector proposal per iteration and evaluates the clipped per-record
  log-likelihood ratio once (Yildirim & Ermis 2019). ``pm.Metropolis`` (PyMC 5.x and 6.x)
  updates a vector variable one coordinate at a time (``elemwise_update``): one iteration is
  a sweep of ``d`` proposals, each a full-data log-density difference. The table therefore
  also prints PyMC's proposals per iteration and the ratio per proposal.
* ``DPFastMH`` vs ``pm.Metropolis``: DPFastMH reads a Poisson minibatch of expected size
  ``lam + C M`` (Zhang & Zhang, Algorithm 2, the TunaMH estimator); settings as in
  ``benchmarks/bench_fastmh.py`` (``lam = 1000``, steps with ``C M ~ sqrt(lam)``).

Models:

* ``logistic``: Bayesian logistic regression, ``d`` coefficients, no intercept, features
  row-normalised to ``||x_i|| = 1`` so that every clip bound of 1 is a valid, public bound
  (log-likelihood Lipschitz constant and gradient norm at most ``||x_i||``). Its per-record
  gradient is ``v_i(beta) x_i``: DPHMC takes the GLM fast route of
  ``pymc_dp.records.RecordFunctions.clipped_grad_sum``.
* ``banana``: the DP-HMC paper's banana likelihood (Räisä et al., Sec. 4),
  ``x_i1 ~ N(theta_1, 2000)``, ``x_i2 ~ N(theta_2 + 20 theta_1^2, 2500)`` (variances),
  ``d = 2``, with a ``N(0, 1000 I)`` prior on ``theta`` instead of the paper's banana prior
  (the prior is data-free and does not change the cost). Its per-record gradient does not
  factorise: DPHMC takes the blocks route (one per-record array per parameter entry).

Timing: each step is constructed, started as in ``pm.sample`` (``set_rng`` on PyMC 5.x,
``setup_chain`` on PyMC 6.x), tuning is switched off, it is warmed up (lazy compilation),
then ``step.step(point)`` is called in a loop. The DP step and its PyMC counterpart are timed
in interleaved blocks and the median block is reported, so that load from other processes
affects both alike. BLAS is limited to the same number of threads for both (default 1).

Per *iteration* is what is measured, not per effective sample: the DP chains mix more
slowly per iteration (noise, clipping, penalty correction, DPFastMH's small steps).

Usage::

    python benchmarks/bench_vs_pymc.py            # n = 100 000
    python benchmarks/bench_vs_pymc.py --quick    # n = 10 000, shorter blocks (< 30 s)

This module also holds the model builders, step factories and timing helpers that
``bench_scaling.py``, ``bench_memory.py`` and ``bench_construct.py`` import.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

warnings.filterwarnings("ignore", message=".*BLAS.*")

import numpy as np  # noqa: E402
import pymc as pm  # noqa: E402
import pytensor  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import pymc_dp  # noqa: E402
import pymc_dp.records  # noqa: E402

#: Leapfrog steps and step size of the HMC pair (small: no divergence at n <= 1e6).
N_LEAPFROG = 10
STEP_SIZE = 1e-3
#: TunaMH's lambda for DPFastMH (as in bench_fastmh.py).
LAM = 1000.0
#: Banana likelihood constants (DP-HMC paper, Sec. 4): variances and curvature.
BANANA_VAR1, BANANA_VAR2, BANANA_A = 2000.0, 2500.0, 20.0

STEP_KINDS = ("DPHMC", "DPPenaltyMetropolis", "DPFastMH")
PYMC_NAME = {
    "DPHMC": "pm.HamiltonianMC",
    "DPPenaltyMetropolis": "pm.Metropolis",
    "DPFastMH": "pm.Metropolis",
}


# -- environment -------------------------------------------------------------------------------
def blas_threads() -> str:
    """BLAS libraries loaded and their thread counts (threadpoolctl)."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:  # pragma: no cover
        return "unknown (threadpoolctl not installed)"
    found = [
        f"{i['internal_api']}:{i['num_threads']}"
        for i in threadpool_info()
        if i["user_api"] == "blas"
    ]
    return ", ".join(found) or "none loaded"


def limit_blas(threads: int) -> None:
    """Limit every loaded BLAS to ``threads`` threads (same for the DP step and PyMC)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


def print_header(title: str) -> None:
    """Versions, machine and BLAS settings, printed at the top of every benchmark."""
    load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
    print(f"== {title} ==")
    print(
        f"python {platform.python_version()} | pymc {pm.__version__} | pytensor "
        f"{pytensor.__version__} | numpy {np.__version__} | pymc_dp {pymc_dp.__version__}"
    )
    print(
        f"machine: {platform.machine()} {platform.system()} {platform.release()} | "
        f"cpus {os.cpu_count()} | load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"BLAS threads {blas_threads()} | OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')} "
        f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')} | pytensor mode "
        f"{pytensor.config.mode}, linker {pytensor.config.linker}"
    )
    print(flush=True)


# -- models ----------------------------------------------------------------------------------
def logistic_model(n: int, d: int = 10, seed: int = 0) -> pm.Model:
    """``y_i ~ Bernoulli(sigmoid(x_i . beta))``, ``||x_i|| = 1``, ``beta ~ N(0, 10^2 I)``."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    X /= np.linalg.norm(X, axis=1, keepdims=True)  # per-record transform: c_i = 1 is valid
    beta = rng.normal(scale=3.0, size=d)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-X @ beta))).astype(np.int8)
    with pm.Model() as model:
        b = pm.Normal("beta", 0.0, 10.0, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, b), observed=y)
    return model


def banana_model(n: int, seed: int = 0) -> pm.Model:
    """The DP-HMC paper's banana likelihood (Sec. 4), ``theta_true = (0, 3)``, ``d = 2``."""
    rng = np.random.default_rng(seed)
    t1, t2 = 0.0, 3.0
    x1 = rng.normal(t1, np.sqrt(BANANA_VAR1), size=n)
    x2 = rng.normal(t2 + BANANA_A * t1**2, np.sqrt(BANANA_VAR2), size=n)
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, np.sqrt(1000.0), shape=2)
        pm.Normal("x1", theta[0], np.sqrt(BANANA_VAR1), observed=x1)
        pm.Normal("x2", theta[1] + BANANA_A * theta[0] ** 2, np.sqrt(BANANA_VAR2), observed=x2)
    return model


MODELS: dict[str, Callable[..., pm.Model]] = {"logistic": logistic_model, "banana": banana_model}

#: Public clip bounds per model. Logistic: 1 (= ||x_i||, valid). Banana: the paper's tuned
#: settings (DP-HMC: LLR 0.1, gradient 0.05; DP penalty: 0.15); clipping does not change the
#: cost of an iteration.
CLIP = {
    "logistic": {"llr": 1.0, "grad": 1.0, "penalty": 1.0, "fastmh": 1.0},
    "banana": {"llr": 0.1, "grad": 0.05, "penalty": 0.15, "fastmh": 0.15},
}


# -- steps -----------------------------------------------------------------------------------
@dataclass
class Pair:
    """A DP step and its PyMC counterpart on the same model."""

    kind: str
    model_name: str
    n: int
    d: int
    dp: object
    pymc: object
    info: dict = field(default_factory=dict)


def make_dp_step(
    kind: str, model: pm.Model, model_name: str, chunk_size: int | None = None, seed: int = 1
):
    """Construct the DP step ``kind`` on ``model`` with the benchmark's fixed settings."""
    n = pymc_dp.records.count_records(model)
    d = int(sum(np.size(v) for v in model.initial_point().values()))
    clip = CLIP[model_name]
    rng = np.random.default_rng(seed)
    with model:
        if kind == "DPHMC":
            return pymc_dp.DPHMC(
                llr_clip_bound=clip["llr"],
                grad_clip_bound=clip["grad"],
                llr_noise_multiplier=1.0,  # the noise level does not change the cost
                grad_noise_multiplier=1.0,
                n_leapfrog=N_LEAPFROG,
                step_size=STEP_SIZE,
                adapt_step_size=False,
                adapt_mass_matrix=False,
                chunk_size=chunk_size,
                rng=rng,
            )
        if kind == "DPPenaltyMetropolis":
            return pymc_dp.DPPenaltyMetropolis(
                clip_bound=clip["penalty"],
                noise_multiplier=1.0,
                proposal_scale=metropolis_scale(kind, model_name, n, d),
                chunk_size=chunk_size,
                rng=rng,
            )
        if kind == "DPFastMH":
            s = metropolis_scale(kind, model_name, n, d)
            return pymc_dp.DPFastMH(
                clip_bound=clip["fastmh"],
                max_step=3.0 * s * np.sqrt(d),
                lam=LAM,
                iter_epsilon=0.5,
                iter_delta=0.1 / n,
                proposal_scale=s,
                chunk_size=chunk_size,
                rng=rng,
            )
    raise ValueError(f"kind must be one of {STEP_KINDS}; got {kind!r}")


def metropolis_scale(kind: str, model_name: str, n: int, d: int) -> float:
    """Per-coordinate random-walk std (the same for the DP step and pm.Metropolis).

    DPFastMH: ``C M ~ sqrt(lam)`` with ``C = n c`` and ``M ~ s sqrt(d)`` (bench_fastmh.py),
    which keeps the expected minibatch near ``lam``. Penalty: a fixed small step (the cost of
    an iteration does not depend on it).
    """
    if kind == "DPFastMH":
        return float(np.sqrt(LAM) / (n * CLIP[model_name]["fastmh"] * np.sqrt(d)))
    return 1e-3


def make_pymc_step(kind: str, model: pm.Model, model_name: str, seed: int = 1):
    """PyMC's own sampler of the same kind as ``kind``, tuning off."""
    n = pymc_dp.records.count_records(model)
    d = int(sum(np.size(v) for v in model.initial_point().values()))
    rng = np.random.default_rng(seed)
    with model:
        if kind == "DPHMC":
            step = pm.HamiltonianMC(
                # PyMC takes int(path_length / step_size) steps: this gives exactly L.
                path_length=STEP_SIZE * N_LEAPFROG * (1.0 + 1e-9),
                step_scale=STEP_SIZE * d**0.25,  # PyMC's step size is step_scale / d**(1/4)
                adapt_step_size=False,
                step_rand=lambda s, rng=None: s,  # no jitter: the same L every iteration
                rng=rng,
            )
        else:
            step = pm.Metropolis(
                S=np.full(d, metropolis_scale(kind, model_name, n, d)),
                tune=False,
                blocked=True,
                rng=rng,
            )
    return step


def pymc_proposals_per_iteration(step) -> int:
    """Proposals (full-data log-density evaluations) per iteration of a PyMC step."""
    if isinstance(step, pm.Metropolis) and getattr(step, "elemwise_update", False):
        return len(step.enum_dims)
    return 1


def dphmc_route(step) -> str:
    """Which clipped-gradient route a DPHMC step took ("GLM fast", "blocks", ...)."""
    return step._fns.gradient_route


# -- timing ----------------------------------------------------------------------------------
def start_chain(step, seed: int = 1, iterations: int = 10**9) -> None:
    """Start a chain as pm.sample does (PyMC 6.x: setup_chain; 5.x: set_rng); tuning off."""
    rng = np.random.default_rng(seed)
    if hasattr(pm.step_methods.arraystep.ArrayStepShared, "setup_chain"):  # PyMC 6
        step.setup_chain(rng, 0, iterations)
    else:  # PyMC 5
        step.set_rng(rng)
    step.tune = False


class Runner:
    """Calls ``step.step`` in a loop from the model's initial point; keeps the chain going."""

    def __init__(self, step, model: pm.Model, seed: int = 1) -> None:
        start_chain(step, seed)
        self.step = step
        self.point = model.initial_point()
        self.stats: list[dict] = []

    def run(self, iters: int) -> float:
        """Seconds per iteration over ``iters`` iterations."""
        step, point, stats = self.step, self.point, self.stats
        t0 = time.perf_counter()
        for _ in range(iters):
            point, st = step.step(point)
            stats.append(st[0])
        t = (time.perf_counter() - t0) / iters
        self.point = point
        return t

    def calibrate(self, block_seconds: float, warmup: int = 3) -> int:
        """Warm up (lazy compilation), then the number of iterations of a ~block_seconds block."""
        self.run(warmup)
        t = self.run(max(1, warmup))
        return int(np.clip(round(block_seconds / max(t, 1e-9)), 2, 20_000))

    def mean_stat(self, key: str) -> float:
        vals = [float(s[key]) for s in self.stats if key in s]
        return float(np.mean(vals)) if vals else float("nan")


def time_interleaved(
    runners: dict[str, Runner], block_seconds: float, blocks: int
) -> dict[str, float]:
    """Median seconds per iteration of each runner, timed in interleaved blocks."""
    iters = {k: r.calibrate(block_seconds) for k, r in runners.items()}
    for r in runners.values():
        r.stats.clear()
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(blocks):
        for k, r in runners.items():
            times[k].append(r.run(iters[k]))
    return {k: float(np.median(v)) for k, v in times.items()}


def measure_pair(
    kind: str,
    model_name: str,
    n: int,
    d: int,
    block_seconds: float,
    blocks: int,
    chunk_size: int | None = None,
) -> dict:
    """Build the model, both steps, and time them side by side."""
    model = logistic_model(n, d) if model_name == "logistic" else banana_model(n)
    d = int(sum(np.size(v) for v in model.initial_point().values()))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        dp = make_dp_step(kind, model, model_name, chunk_size=chunk_size)
    ref = make_pymc_step(kind, model, model_name)
    runners = {"dp": Runner(dp, model), "pymc": Runner(ref, model)}
    t = time_interleaved(runners, block_seconds, blocks)
    props = pymc_proposals_per_iteration(ref)
    out = {
        "kind": kind,
        "pymc_name": PYMC_NAME[kind],
        "model": model_name,
        "n": n,
        "d": d,
        "dp_s": t["dp"],
        "pymc_s": t["pymc"],
        "ratio": t["dp"] / t["pymc"],
        "pymc_props": props,
        "ratio_per_proposal": t["dp"] / (t["pymc"] / props),
        "dp_accept": runners["dp"].mean_stat("accepted"),
        "pymc_accept": runners["pymc"].mean_stat("accepted"),
        "note": "",
    }
    if kind == "DPHMC":
        n_steps = runners["pymc"].mean_stat("n_steps")
        out["note"] = f"L={N_LEAPFROG}; PyMC n_steps {n_steps:g}; route {dphmc_route(dp)}"
    elif kind == "DPFastMH":
        out["note"] = (
            f"mean batch {runners['dp'].mean_stat('batch_size'):.0f}, "
            f"full-batch {100 * runners['dp'].mean_stat('full_batch'):.2f} %"
        )
    if any("exceeds the number of records" in str(w.message) for w in caught):
        out["note"] += "; step warned: expected minibatch > n"
    return out


TABLE_HEADER = (
    f"{'DP step':<20} {'PyMC step':<17} {'model':<8} {'n':>9} {'d':>3} | "
    f"{'DP ms/iter':>10} {'PyMC ms/iter':>12} {'ratio':>7} | {'PyMC prop/it':>12} "
    f"{'ratio/prop':>10} | {'acc DP':>6} {'acc PyMC':>8} | note"
)


def table_row(r: dict) -> str:
    """One printed row of the DP-vs-PyMC table."""
    return (
        f"{r['kind']:<20} {r['pymc_name']:<17} {r['model']:<8} {r['n']:>9,d} {r['d']:>3d} | "
        f"{r['dp_s'] * 1e3:>10.3f} {r['pymc_s'] * 1e3:>12.3f} {r['ratio']:>#7.3g} | "
        f"{r['pymc_props']:>12d} {r['ratio_per_proposal']:>#10.3g} | "
        f"{r['dp_accept']:>6.2f} {r['pymc_accept']:>8.2f} | {r['note']}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n = 10 000, short blocks (< 30 s)")
    ap.add_argument("--n", type=int, default=None, help="records (default 100 000)")
    ap.add_argument("--d", type=int, default=10, help="logistic regression coefficients")
    ap.add_argument("--blocks", type=int, default=None, help="interleaved timed blocks")
    ap.add_argument("--block-seconds", type=float, default=None, help="target block length")
    ap.add_argument("--blas-threads", type=int, default=1, help="BLAS threads for both sides")
    ap.add_argument(
        "--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="models"
    )
    ap.add_argument(
        "--steps", nargs="+", default=list(STEP_KINDS), choices=STEP_KINDS, help="DP steps"
    )
    ap.add_argument(
        "--chunk-size", type=int, default=None, help="chunk_size of the DP steps (default none)"
    )
    args = ap.parse_args(argv)
    limit_blas(args.blas_threads)
    n = args.n or (10_000 if args.quick else 100_000)
    blocks = args.blocks or (3 if args.quick else 7)
    block_s = args.block_seconds or (0.05 if args.quick else 0.4)
    print_header("bench_vs_pymc: per-iteration time, pymc_dp step vs PyMC's sampler")
    print(
        f"HMC pair: L = {N_LEAPFROG}, step size {STEP_SIZE:g} (fixed); DPFastMH lam = {LAM:g}; "
        f"medians of {blocks} interleaved blocks of ~{block_s:g} s; "
        f"{args.blas_threads} BLAS thread(s); DP chunk_size {args.chunk_size or 'none'}"
    )
    print(TABLE_HEADER)
    print("-" * len(TABLE_HEADER), flush=True)
    for model_name in args.models:
        for kind in args.steps:
            r = measure_pair(kind, model_name, n, args.d, block_s, blocks, args.chunk_size)
            print(table_row(r), flush=True)
    print()
    print(
        "ratio = DP ms/iter / PyMC ms/iter; ratio/prop = DP ms/iter / (PyMC ms/iter / PyMC "
        "proposals per iteration): pm.Metropolis sweeps the coordinates of a vector one at a "
        "time, the DP random-walk steps make one full-vector proposal per iteration."
    )


if __name__ == "__main__":
    main()
