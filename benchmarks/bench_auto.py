"""Automatic mode (``pymc_dp.sample(step=None)``) against non-private NUTS, on ordinary models.

For each model and budget: a non-private NUTS fit (the reference, 2 chains x 1000 draws) and
the automatic DP run (4 chains), side by side on the same data. Printed per row:

* ``max R-hat`` of the DP run (ArviZ rank-normalised split R-hat);
* ``max err``: max over parameters of |DP mean - NUTS mean| / NUTS sd;
* ``sd ratio``: the range of DP sd / NUTS sd over parameters;
* ``laplace err``: the same error for the private Laplace approximation alone (the warm
  start, a DP point estimate with a covariance, before any chain runs);
* the epsilon the privacy report gives, and the seconds of both fits.

Usage::

    python benchmarks/bench_auto.py                      # the issue's goal table
    python benchmarks/bench_auto.py --n 2000 --eps 1 3 10
    python benchmarks/bench_auto.py --quick              # tiny smoke run

Data are synthetic with public bounds (covariates in [-1, 1], responses clipped to a fixed
range), generated from a fixed seed; every model is written as a PyMC user would.
"""

from __future__ import annotations

import argparse
import time
import warnings

import arviz as az
import numpy as np
import pymc as pm

import pymc_dp


def logistic(n: int, rng: np.random.Generator) -> pm.Model:
    d = 10
    x = rng.uniform(-1, 1, (n, d))
    beta = rng.normal(0, 1, d)
    y = rng.binomial(1, 1 / (1 + np.exp(-x @ beta)))
    with pm.Model() as m:
        b = pm.Normal("b", 0, 2, shape=d)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    return m


def linear(n: int, rng: np.random.Generator) -> pm.Model:
    x = rng.uniform(-1, 1, (n, 3))
    y = np.clip(x @ np.array([1.0, -2.0, 0.5]) + 0.3 + rng.normal(0, 0.7, n), -5, 5)
    with pm.Model() as m:
        a = pm.Normal("a", 0, 5)
        b = pm.Normal("b", 0, 5, shape=3)
        s = pm.HalfNormal("sigma", 2)
        pm.Normal("y", a + pm.math.dot(x, b), s, observed=y)
    return m


def robust(n: int, rng: np.random.Generator) -> pm.Model:
    x = rng.uniform(-1, 1, (n, 3))
    y = np.clip(x @ np.array([1.0, -2.0, 0.5]) + 0.5 * rng.standard_t(3, n), -10, 10)
    with pm.Model() as m:
        b = pm.Normal("b", 0, 5, shape=3)
        s = pm.HalfNormal("sigma", 2)
        pm.StudentT("y", nu=4, mu=pm.math.dot(x, b), sigma=s, observed=y)
    return m


def hierarchical(n: int, rng: np.random.Generator) -> pm.Model:
    groups = 20
    g = rng.integers(groups, size=n)
    theta = rng.normal(1, 0.5, groups)
    y = np.clip(theta[g] + rng.normal(0, 1, n), -6, 8)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=groups)
        s = pm.HalfNormal("sigma", 2)
        pm.Normal("y", mu + tau * z[g], s, observed=y)
    return m


def glmm(n: int, rng: np.random.Generator) -> pm.Model:
    """Poisson GLM with a non-centred random intercept (10 groups)."""
    groups = 10
    g = rng.integers(groups, size=n)
    x = rng.normal(size=n)
    u = rng.normal(0, 0.4, groups)
    y = rng.poisson(np.exp(0.3 + 0.5 * x + u[g]))
    with pm.Model() as m:
        b0 = pm.Normal("b0", 0, 2)
        b1 = pm.Normal("b1", 0, 2)
        sd = pm.HalfNormal("sd", 1)
        z = pm.Normal("z", 0, 1, shape=groups)
        pm.Poisson("y", pm.math.exp(b0 + b1 * x + sd * z[g]), observed=y)
    return m


MODELS = {
    "logistic": logistic,
    "linear": linear,
    "robust": robust,
    "hierarchical": hierarchical,
    "glmm": glmm,
}


def _errors(dp, ref) -> tuple[float, float, float]:
    s = az.summary(dp, kind="stats", round_to="none")
    r = az.summary(ref, kind="stats", round_to="none")
    err = float((np.abs(s["mean"] - r["mean"]) / r["sd"]).max())
    ratio = s["sd"] / r["sd"]
    return err, float(ratio.min()), float(ratio.max())


def _laplace_error(model, laplace_mean, ref) -> float:
    """Error of the private Laplace approximation's mean, in NUTS sds (transformed space)."""
    from pymc.blocking import DictToArrayBijection

    names = [v.name for v in model.value_vars]
    if not all(n in ref.posterior for n in names):
        return float("nan")  # constrained parameters: compared in the transformed space only
    mean = DictToArrayBijection.map(
        {n: ref.posterior[n].mean(("chain", "draw")).values for n in names}
    ).data
    sd = DictToArrayBijection.map(
        {n: ref.posterior[n].std(("chain", "draw")).values for n in names}
    ).data
    return float(np.max(np.abs(np.asarray(laplace_mean) - mean) / sd))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--n", type=int, nargs="+", default=[20_000])
    ap.add_argument("--eps", type=float, nargs="+", default=[10.0])
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny smoke run")
    args = ap.parse_args()
    if args.quick:
        args.n, args.eps, args.models = [1000], [10.0], ["linear"]
    print(
        f"{'model':<13}{'n':>8}{'eps':>6} | {'max R-hat':>9}{'max err':>9}{'sd ratio':>13}"
        f"{'laplace err':>12}{'report eps':>11} | {'DP s':>7}{'NUTS s':>8}"
    )
    for name in args.models:
        for n in args.n:
            model = MODELS[name](n, np.random.default_rng(args.seed))
            with model, warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t = time.perf_counter()
                draws = 100 if args.quick else 1000
                ref = pm.sample(
                    draws, tune=draws, chains=2, progressbar=False, random_seed=1,
                    compute_convergence_checks=False,
                )  # fmt: skip
                t_ref = time.perf_counter() - t
                for eps in args.eps:
                    t = time.perf_counter()
                    idata = pymc_dp.sample(
                        epsilon=eps, delta=args.delta, chains=args.chains,
                        random_seed=args.seed + 1, progressbar=False,
                        compute_convergence_checks=False,
                        auto_kwargs={"max_iterations": 2000} if args.quick else None,
                    )  # fmt: skip
                    t_dp = time.perf_counter() - t
                    rh = az.rhat(idata)
                    rh = rh.to_dataset() if hasattr(rh, "to_dataset") else rh
                    rhat = max(float(v.max()) for v in rh.data_vars.values())
                    err, lo, hi = _errors(idata, ref)
                    lap = _laplace_error(model, idata.attrs["dp_auto_laplace_mean"], ref)
                    rep = pymc_dp.privacy_report(idata, attach=False)
                    print(
                        f"{name:<13}{n:>8}{eps:>6g} | {rhat:>9.3f}{err:>9.3f}"
                        f"{f'{lo:.2f}-{hi:.2f}':>13}{lap:>12.3f}{rep.epsilon:>11.4g} | "
                        f"{t_dp:>7.1f}{t_ref:>8.1f}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
