"""Command line of the experiments: ``pymc-dp experiment ...`` and ``pymc-dp plot ...``.

Examples
--------
The DP-HMC paper's banana experiment (Sec. 4) with its defaults::

    python -m pymc_dp.experiments.cli experiment banana --methods dphmc,penalty \\
        --epsilons 2,4,6,8,10,12,15 --repeats 10 --n 100000 --out results/banana

A smoke test (seconds)::

    python -m pymc_dp.experiments.cli experiment banana --quick --out /tmp/smoke

Figures again from results CSVs (merged; e.g. repeats run in separate processes with
``--first-repeat``), and the Markdown summary table of ``docs/results.md``::

    python -m pymc_dp.experiments.cli plot results/banana/results.csv --out results/banana
    python -m pymc_dp.experiments.cli table results/banana*/results.csv
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from pymc_dp.experiments.models import MODELS
from pymc_dp.experiments.plots import make_figures
from pymc_dp.experiments.runner import (
    METHODS,
    comparison_table,
    merge_results,
    read_results,
    run_experiment,
    summary_table,
)

__all__ = ["main", "QUICK", "DEFAULT_METHODS"]

#: Methods run by default on each model (the papers' comparisons).
DEFAULT_METHODS = {
    "banana": "dphmc,penalty",
    "gaussian": "dphmc,penalty",
    "mixture": "fastmh",
    "logistic": "penalty,dphmc,fastmh",
}

#: ``--quick`` sizes (CI smoke tests, seconds per run): records, epsilons, repeats.
QUICK = {
    "banana": {"n": 2000, "epsilons": "15", "repeats": 1},
    "gaussian": {"n": 5000, "epsilons": "15", "repeats": 1},
    "mixture": {
        "n": 2000,
        "epsilons": "15",
        "repeats": 1,
        "draws": 60,
        "tune": 20,
        # 100 effective records as in the paper (50 000 / 500), with 2000 records
        "model_kwargs": {"temperature": 20.0},
    },
    "logistic": {
        "n": 1000,
        "epsilons": "15",
        "repeats": 1,
        "draws": 60,
        "tune": 20,
        "model_kwargs": {"reference_draws": 400, "reference_tune": 300},
    },
}


def _floats(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers such as 2,4,8; got {text!r}"
        ) from None
    if not vals or any(not v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"epsilons must be positive numbers; got {text!r}")
    return vals


def _stop_time(text: str | None) -> float | None:
    """``HH:MM`` (UTC, today) -> a ``time.time()`` value."""
    if text is None:
        return None
    import datetime as dt

    try:
        hh, mm = (int(v) for v in text.split(":"))
        now = dt.datetime.now(dt.UTC)
        return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    except ValueError:
        raise SystemExit(f"--stop-at must be a UTC time HH:MM; got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="pymc-dp", description="pymc_dp experiments")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("experiment", help="run the papers' protocol and write CSV + figures")
    e.add_argument("model", choices=sorted(MODELS))
    e.add_argument(
        "--methods",
        default=None,
        help=f"comma-separated, from {sorted(METHODS)} (default: the "
        "paper's comparison for the model)",
    )
    e.add_argument("--epsilons", type=_floats, default=None, help="default 2,4,6,8,10,12,15")
    e.add_argument("--repeats", type=int, default=None, help="default 10 (paper)")
    e.add_argument(
        "--first-repeat",
        type=int,
        default=0,
        help="number of the first repeat (default 0); seeds depend on the repeat number, so "
        "a reproduction can be split over processes and the CSVs merged",
    )
    e.add_argument("--n", type=int, default=None, help="records (default: the paper's)")
    e.add_argument("--delta", type=float, default=1e-6, help="default 1e-6 = 0.1/n (paper)")
    e.add_argument("--chains", type=int, default=4, help="chains sharing the budget (paper: 4)")
    e.add_argument(
        "--protocol",
        choices=("paper", "calibrated"),
        default="paper",
        help="paper: the paper's noise, iterations from the budget; calibrated: fixed run "
        "length, noise calibrated by pymc_dp.sample (methods without the paper's noise level "
        "always run calibrated)",
    )
    e.add_argument("--draws", type=int, default=None, help="calibrated protocol: draws")
    e.add_argument("--tune", type=int, default=None, help="calibrated protocol: warmup")
    e.add_argument("--seed", type=int, default=0, help="seed of the data and of the runs")
    e.add_argument(
        "--plot-epsilon",
        type=float,
        default=None,
        help="epsilon of the posterior figure (default: the largest)",
    )
    e.add_argument("--out", required=True, help="output directory")
    e.add_argument("--quick", action="store_true", help="tiny sizes for smoke tests")
    e.add_argument(
        "--stop-at",
        default=None,
        help="UTC wall-clock time HH:MM (today) after which no new run is started",
    )
    pl = sub.add_parser("plot", help="re-make the figures from results CSVs of one model")
    pl.add_argument("csv", nargs="+", help="results.csv files (merged)")
    pl.add_argument("--out", default=None, help="output directory (default: the CSV's)")
    pl.add_argument("--epsilon", type=float, default=None)
    tb = sub.add_parser(
        "table", help="print the Markdown summary table of results CSVs of one model"
    )
    tb.add_argument("csv", nargs="+", help="results.csv files (merged)")
    cp = sub.add_parser(
        "compare",
        help="print a Markdown table of one method against others on both MMD scales "
        "(results CSVs of one model, merged)",
    )
    cp.add_argument("csv", nargs="+", help="results.csv files (merged)")
    cp.add_argument("--method", default="auto", help="the method compared (default auto)")
    cp.add_argument(
        "--against", default="dphmc,penalty", help="comma-separated (default dphmc,penalty)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pymc-dp`` / ``python -m pymc_dp.experiments.cli``."""
    args = _parser().parse_args(argv)
    if args.command == "plot":
        from pathlib import Path

        out = args.out if args.out is not None else Path(args.csv[0]).parent
        for f in make_figures(args.csv, out, args.epsilon):
            print(f)
        return 0
    if args.command == "table":
        print(summary_table(merge_results(args.csv)), end="")
        return 0
    if args.command == "compare":
        rows = merge_results(args.csv)
        print(comparison_table(rows, args.method, args.against.split(",")), end="")
        return 0
    quick = QUICK[args.model] if args.quick else {}
    methods = (args.methods or DEFAULT_METHODS[args.model]).split(",")
    epsilons = args.epsilons or _floats(quick.get("epsilons", "2,4,6,8,10,12,15"))
    repeats = args.repeats if args.repeats is not None else quick.get("repeats", 10)
    n = args.n if args.n is not None else quick.get("n")
    draws = args.draws if args.draws is not None else quick.get("draws")
    tune = args.tune if args.tune is not None else quick.get("tune")
    path = run_experiment(
        args.model,
        methods,
        epsilons,
        repeats=repeats,
        first_repeat=args.first_repeat,
        n=n,
        out=args.out,
        delta=args.delta,
        chains=args.chains,
        protocol=args.protocol,
        seed=args.seed,
        draws=draws,
        tune=tune,
        model_kwargs=quick.get("model_kwargs"),
        stop_at=_stop_time(args.stop_at),
    )
    print(path)
    if not read_results(path):
        print("no run finished: no figures", file=sys.stderr)
        return 0
    for f in make_figures(path, args.out, args.plot_epsilon):
        print(f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
