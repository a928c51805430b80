"""Seeded draws of every public step, recorded and compared bit for bit (issue 30).

``python dev/step_draws.py record OUT.npz`` samples every case below with a fixed seed and
stores the draws and the data-free sampler stats; ``python dev/step_draws.py compare
OUT.npz`` samples them again (each case built with the old keywords and, where the parts API
exists, from parts) and fails unless every array is bit-identical. Run ``record`` on the
commit before a refactoring of the constructors and ``compare`` after it, on each venv (the
draws of one PyMC line are compared with the same line's).
"""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pymc as pm

import pymc_dp

N = 40
SEED = 20261127
STATS = ("accepted", "dp_mu", "dp_releases", "dp_iteration", "noise_std", "scaling")


def _normal_model():
    y = np.random.default_rng(0).normal(0.5, 1.0, size=N)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 2.0)
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", mu, s, observed=y)
    return m


def _expfam_model():
    y = np.random.default_rng(1).normal(0.3, 1.0, size=N)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 2.0)
        pm.Normal("y", mu, 1.0, observed=y)
    return m


def _centred_model():
    rng = np.random.default_rng(6)
    g = np.arange(N) % 2
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        a = pm.Normal("a", mu, tau, shape=2)
        pm.Normal("y", a[g], 3.0, observed=rng.normal(size=N))
    return m


def _recentring(model):
    from pymc_dp.auto.recentre import Recentring, find_recentring

    return Recentring(model, find_recentring(model), model.value_vars, model.initial_point())


PLAN = {"draws": 15, "tune": 10, "chains": 1}
TARGET = {"epsilon": 5.0, "delta": 1e-3, **PLAN}
COV2 = np.array([[0.05, 0.01], [0.01, 0.04]])
COV4 = np.diag([0.3, 0.2, 0.2, 0.2])
A_ONLY = np.array([[0, 0, 1.0, 0], [0, 0, 0, 1.0]])


def cases():
    """``name -> (model builder, step class name, old keywords (model -> dict))``."""
    return {
        "penalty_gaussian": (
            _normal_model,
            "DPPenaltyMetropolis",
            lambda m: {"clip_bound": 1.0, "noise_multiplier": 1.0, "proposal_scale": 0.2},
        ),
        "penalty_target": (
            _normal_model,
            "DPPenaltyMetropolis",
            lambda m: {"clip_bound": 1.0, **TARGET, "proposal": "coordinate"},
        ),
        "penalty_guided": (
            _normal_model,
            "DPPenaltyMetropolis",
            lambda m: {"clip_bound": 1.0, "noise_multiplier": 1.0, "proposal": "guided"},
        ),
        "penalty_cov": (
            _normal_model,
            "DPPenaltyMetropolis",
            lambda m: {"clip_bound": 1.0, "noise_multiplier": 1.0, "proposal_cov": COV2},
        ),
        "penalty_independent_cv": (
            _normal_model,
            "DPPenaltyMetropolis",
            lambda m: {
                "clip_bound": 0.5,
                "noise_multiplier": 1.0,
                "proposal": "independent",
                "proposal_cov": COV2,
                "proposal_mean": np.array([0.5, 0.0]),
                "local_moves": 0.3,
                "control_variate": (np.array([0.5, 0.0]), np.array([1.0, -2.0]), 3.0),
                "control_variate_basis": np.array([[1.0, 0.0], [0.2, 1.0]]),
                "clip_metric": np.array([[1.0, 0.5]]),
            },
        ),
        "penalty_free_moves": (
            _centred_model,
            "DPPenaltyMetropolis",
            lambda m: {
                "clip_bound": 0.5,
                "noise_multiplier": 1.0,
                "proposal": "independent",
                "proposal_cov": COV4,
                "proposal_mean": np.zeros(4),
                "reparametrization": _recentring(m),
                "clip_metric": A_ONLY,
                "free_moves": 2,
            },
        ),
        "fastmh": (
            _normal_model,
            "DPFastMH",
            lambda m: {
                "clip_bound": 3.0,
                "max_step": 0.2,
                "lam": 20.0,
                "max_batch": 10**6,
                "iter_epsilon": 1.0,
                "iter_delta": 1e-5,
                "proposal_scale": 0.1,
                **PLAN,
            },
        ),
        "fastmh_target": (
            _normal_model,
            "DPFastMH",
            lambda m: {
                "clip_bound": 3.0,
                "max_step": 0.2,
                "lam": 20.0,
                "max_batch": 10**6,
                **TARGET,
                "branching": "independent",
            },
        ),
        "hmc": (
            _normal_model,
            "DPHMC",
            lambda m: {
                "llr_clip_bound": 1.0,
                "grad_clip_bound": 1.0,
                "llr_noise_multiplier": 1.0,
                "grad_noise_multiplier": 1.0,
                "n_leapfrog": 3,
                "step_size": 0.05,
            },
        ),
        "hmc_target": (
            _normal_model,
            "DPHMC",
            lambda m: {
                "llr_clip_bound": 1.0,
                "grad_clip_bound": 1.0,
                **TARGET,
                "grad_budget_fraction": 0.3,
                "n_leapfrog": 3,
            },
        ),
        "barker": (
            _normal_model,
            "DPBarker",
            lambda m: {**TARGET, "epsilon": 40.0, "proposal_scale": 0.1},
        ),
        "subsampled": (
            _normal_model,
            "DPSubsampledPenalty",
            lambda m: {"batch_size": 20, "clip_bound": 1.0, "noise_multiplier": 1.0},
        ),
        "subsampled_target": (
            _normal_model,
            "DPSubsampledPenalty",
            lambda m: {"batch_size": 20, "clip_bound": 1.0, **TARGET},
        ),
        "sgld": (
            _normal_model,
            "DPSGLD",
            lambda m: {"clip_bound": 2.0, "step_size": 1e-3, "batch_size": 10, **TARGET},
        ),
        "sgnht": (
            _normal_model,
            "DPSGNHT",
            lambda m: {
                "clip_bound": 2.0,
                "step_size": 1e-3,
                "sampling_rate": 0.3,
                "noise_multiplier": 2.0,
            },
        ),
        "expfam": (
            _expfam_model,
            "DPExpFamilyPenalty",
            lambda m: {"data_bounds": {"y": (-5, 5)}, "noise_multiplier": 1.0},
        ),
        "expfam_target": (
            _expfam_model,
            "DPExpFamilyPenalty",
            lambda m: {"stat_clip_bound": 5.0, **TARGET, "proposal": "coordinate"},
        ),
    }


def _draws(build, cls_name, kwargs_of, parts: bool) -> dict[str, np.ndarray]:
    model = build()
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kwargs = kwargs_of(model)
        if parts:
            from pymc_dp.step_methods.parts import from_keywords

            kwargs = from_keywords(getattr(pymc_dp, cls_name), kwargs)
        step = getattr(pymc_dp, cls_name)(rng=np.random.default_rng(SEED), **kwargs)
        idata = pm.sample(
            draws=PLAN["draws"],
            tune=PLAN["tune"],
            chains=1,
            cores=1,
            step=step,
            random_seed=SEED,
            progressbar=False,
            compute_convergence_checks=False,
            discard_tuned_samples=False,
        )
    out = {}
    for group in ("posterior", "warmup_posterior", "sample_stats", "warmup_sample_stats"):
        groups = idata.groups() if callable(idata.groups) else idata.groups
        if group not in {g.strip("/") for g in groups}:
            continue
        ds = idata[group]
        for name in sorted(ds.data_vars):
            if group.endswith("sample_stats") and name not in STATS:
                continue
            out[f"{group}/{name}"] = np.asarray(ds[name].values)
    return out


def main(argv: list[str]) -> int:
    mode, path = argv[1], argv[2]
    only = argv[3:]
    runs = {}
    for name, (build, cls_name, kwargs_of) in cases().items():
        if only and name not in only:
            continue
        if mode == "record":
            runs[name] = _draws(build, cls_name, kwargs_of, parts=False)
            continue
        stored = np.load(path)
        variants = [False]
        if hasattr(pymc_dp, "PrivacySettings"):
            variants.append(True)
        for parts in variants:
            now = _draws(build, cls_name, kwargs_of, parts=parts)
            keys = sorted(k[len(name) + 2 :] for k in stored.files if k.startswith(name + "::"))
            same = sorted(now) == keys and all(
                np.array_equal(now[k], stored[f"{name}::{k}"], equal_nan=True) for k in keys
            )
            label = "parts" if parts else "old keywords"
            print(f"{name:24s} {label:12s} {'bit-identical' if same else 'DIFFERENT'}")
            if not same:
                return 1
    if mode == "record":
        np.savez(path, **{f"{n}::{k}": v for n, d in runs.items() for k, v in d.items()})
        print(f"recorded {len(runs)} cases to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
