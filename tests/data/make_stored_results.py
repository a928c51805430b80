"""Make the stored results of ``tests/test_stored_results.py`` (run once, from the repo root).

The files in ``tests/data/stored_results/`` were made by main at commit e434abe (PyMC 5.x,
ArviZ InferenceData, netCDF) with this script: one small run per step class (tiny ``n``, few
draws), some with the warmup stats kept and some without (the report then charges the warmup
from PyMC's ``tuning_steps`` attribute), one compound run. Their attrs carry the privacy report
of that time (``dp_epsilon``, ``dp_mu``, ...). The test reads them with today's code: the stat
names the steps save (``dp_mu``, ``dp_releases``, ...) and their meaning must never change
(add new stats, never rename one), so ``privacy_report`` must give the same epsilon.

    git archive e434abe pymc_dp | tar -x -C /tmp/base     # the code that made them
    PYTHONPATH=/tmp/base python tests/data/make_stored_results.py e434abe

A step class added later gets its file from the first main that has it, made by naming it:
``python tests/data/make_stored_results.py COMMIT expfam`` (``expfam`` was made after the
merge of issues 14, 15 and 19, with the stats ``dp_ndim`` and ``dp_plan_chains`` of issue 14).
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pymc as pm

import pymc_dp

OUT = Path(__file__).parent / "stored_results"
SAMPLE = dict(progressbar=False, compute_convergence_checks=False, cores=1)


def _model(n: int, *, bounded: bool = False, two: bool = False):
    rng = np.random.default_rng(0)
    x = rng.normal(0.5, 1.0, size=n)
    if bounded:
        x = np.clip(x, -2.0, 2.0)
    with pm.Model() as model:
        t = pm.Normal("t", 0.0, 3.0)
        if two:
            s = pm.HalfNormal("s", 2.0)
            pm.Normal("x", t, s, observed=x)
        else:
            pm.Normal("x", t, 1.0, observed=x)
    return model


def _run(name: str, model, step, *, keep_warmup: bool, **kw) -> None:
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pymc_dp.sample(
            step=step,
            draws=20,
            tune=10,
            chains=2,
            random_seed=11,
            discard_tuned_samples=not keep_warmup,
            **kw,
            **SAMPLE,
        )
    commit = sys.argv[1] if len(sys.argv) > 1 else "unknown commit"
    idata.attrs["stored_result_made_by"] = f"tests/data/make_stored_results.py, pymc_dp {commit}"
    path = OUT / f"{name}.nc"
    idata.to_netcdf(str(path))
    print(name, idata.attrs["dp_epsilon"], idata.attrs["dp_mechanism"])


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    eps, delta = 2.0, 1e-3
    only = set(sys.argv[2:])
    if only:
        if "expfam" in only:
            _run(
                "expfam",
                _model(40, bounded=True),
                pymc_dp.DPExpFamilyPenalty,
                keep_warmup=True,
                epsilon=eps,
                delta=delta,
                step_kwargs={"data_bounds": {"x": (-2.0, 2.0)}},
            )
        return
    _run(
        "penalty",
        _model(40),
        pymc_dp.DPPenaltyMetropolis,
        keep_warmup=True,
        epsilon=eps,
        delta=delta,
        step_kwargs={"clip_bound": 3.0},
    )
    _run(
        "hmc",
        _model(40),
        pymc_dp.DPHMC,
        keep_warmup=False,
        epsilon=eps,
        delta=delta,
        step_kwargs={"llr_clip_bound": 3.0, "grad_clip_bound": 3.0, "n_leapfrog": 3},
    )
    _run(
        "fastmh",
        _model(40),
        pymc_dp.DPFastMH,
        keep_warmup=True,
        epsilon=eps,
        delta=delta,
        step_kwargs={"clip_bound": 3.0, "max_step": 0.3, "lam": 30.0, "max_batch": 60},
    )
    model = _model(60)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sub = pymc_dp.DPSubsampledPenalty(
            batch_size=12, clip_bound=3.0, noise_multiplier=1.5, delta=delta
        )
    _run("subsampled_penalty", model, sub, keep_warmup=False)
    model = _model(200, bounded=True)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bar = pymc_dp.DPBarker(batch_size=50, tempering=0.01, delta=delta)
    _run("barker", model, bar, keep_warmup=True)
    _run(
        "sgld",
        _model(40),
        pymc_dp.DPSGLD,
        keep_warmup=True,
        epsilon=eps,
        delta=delta,
        step_kwargs={"clip_bound": 3.0, "step_size": 1e-3, "batch_size": 10},
    )
    _run(
        "sgnht",
        _model(40),
        pymc_dp.DPSGNHT,
        keep_warmup=False,
        epsilon=eps,
        delta=delta,
        step_kwargs={"clip_bound": 3.0, "step_size": 1e-3, "batch_size": 10, "diffusion": 2.0},
    )
    # A compound run: a Gaussian-mechanism step and a Poisson-subsampled step together.
    model = _model(40, two=True)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = dict(draws=20, tune=10, chains=2)
        s1 = pymc_dp.DPPenaltyMetropolis(
            [model["t"]], clip_bound=3.0, epsilon=1.0, delta=delta, **plan
        )
        s2 = pymc_dp.DPSGLD(
            [model["s"]], clip_bound=3.0, step_size=1e-3, batch_size=10, epsilon=1.0,
            delta=delta, **plan,
        )  # fmt: skip
    _run("compound_penalty_sgld", model, [s1, s2], keep_warmup=True)


if __name__ == "__main__":
    main()
