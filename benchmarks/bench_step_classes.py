"""Step classes with nothing but the budget: ``pymc_dp.sample(step=C, epsilon=, delta=)``.

Issue 27, item 2: each pymc_dp step class given to `pymc_dp.sample` without its
hyperparameters is configured by the automatic mode's private phases
(`pymc_dp.auto.steps`) or refused before any data read. For each class and model (the
``logistic3`` and ``linear3`` generators of bench_auto.py), 4 chains against non-private
NUTS (2 chains x 1000 draws) on the same data. Printed per row: the class, the model,
``max err`` = max over parameters of |DP mean - NUTS mean| / NUTS sd, ``max R-hat``, the
draws per chain run, the acceptance rate, the report's epsilon, seconds; or the refusal.

Usage::

    python benchmarks/bench_step_classes.py                         # n = 20 000, epsilon 10
    python benchmarks/bench_step_classes.py --n 5000 --classes DPHMC --seeds 2
    python benchmarks/bench_step_classes.py --quick      # smoke run: n = 2000, 2 classes
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

import pymc_dp

sys.path.insert(0, str(Path(__file__).parent))
from bench_auto import linear3, logistic3  # noqa: E402

CLASSES = [
    "DPHMC",
    "DPPenaltyMetropolis",
    "DPFastMH",
    "DPBarker",
    "DPSubsampledPenalty",
    "DPSGLD",
    "DPSGNHT",
    "DPExpFamilyPenalty",
]
MODELS = {"logistic3": logistic3, "linear3": linear3}
#: the first refusal message of each class (printed after the table)
REFUSALS: dict[str, str] = {}


def _flat(idata) -> dict[str, np.ndarray]:
    post = idata["posterior"]
    out = {}
    for k in post.data_vars:
        v = np.asarray(post[k].values)
        v = v.reshape(v.shape[0] * v.shape[1], -1)
        for j in range(v.shape[1]):
            out[f"{k}[{j}]"] = v[:, j]
    return out


def run(cls_name: str, model_name: str, n: int, epsilon: float, delta: float, seed: int, ref):
    model = MODELS[model_name](n, np.random.default_rng(0))
    cls = getattr(pymc_dp, cls_name)
    t0 = time.time()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            idata = pymc_dp.sample(
                step=cls, epsilon=epsilon, delta=delta, random_seed=seed, progressbar=False
            )
        except ValueError as err:
            REFUSALS.setdefault(cls_name, str(err))
            return "refused before any data read (message below)"
    secs = time.time() - t0
    dp, nuts_m, nuts_s = _flat(idata), *ref
    err = max(abs(dp[k].mean() - nuts_m[k]) / nuts_s[k] for k in nuts_m)
    try:  # ArviZ 0.x (PyMC 5): a Dataset of R-hats
        rhat = float(np.nanmax(az.rhat(idata["posterior"]).to_array().values))
    except AttributeError:  # ArviZ 1.x (PyMC 6): the run's own check (pymc_dp.diagnostics)
        rhat = float(idata.attrs["dp_max_rhat"])
    acc = float(np.mean(idata["sample_stats"]["accepted"].values))
    rep = pymc_dp.privacy_report(idata, model=model)
    draws = idata["posterior"].sizes["draw"]
    return f"{err:8.3f} {rhat:8.3f} {draws:6d} {acc:6.3f} {rep.epsilon:7.4g} {secs:6.0f}"


def nuts(model_name: str, n: int, draws: int = 1000):
    model = MODELS[model_name](n, np.random.default_rng(0))
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(draws, tune=draws, chains=2, random_seed=1, progressbar=False)
    f = _flat(idata)
    return {k: v.mean() for k, v in f.items()}, {k: v.std() for k, v in f.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--eps", type=float, default=10.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--classes", nargs="+", default=CLASSES)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--quick", action="store_true", help="smoke run (n = 2000, 2 classes)")
    a = ap.parse_args()
    if a.quick:
        a.n, a.classes, a.models = 2000, ["DPSGLD", "DPHMC"], ["logistic3"]
    print(f"n = {a.n}, epsilon = {a.eps:g}, delta = {a.delta:g}, 4 chains, {a.seeds} seed(s)")
    print(f"{'class':20s} {'model':10s} {'seed':>4s} {'max err':>8s} {'max R-hat':>8s} "
          f"{'draws':>6s} {'acc':>6s} {'epsilon':>7s} {'s':>6s}")  # fmt: skip
    for m in a.models:
        ref = nuts(m, a.n, 300 if a.quick else 1000)
        for c in a.classes:
            for s in range(a.seeds):
                print(f"{c:20s} {m:10s} {s:4d} {run(c, m, a.n, a.eps, a.delta, s, ref)}",
                      flush=True)  # fmt: skip
    for c, text in REFUSALS.items():
        print(f"\n{c}: {text}")


if __name__ == "__main__":
    main()
