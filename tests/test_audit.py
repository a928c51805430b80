"""Empirical privacy audit: sound for the real mechanisms, and able to fail for broken ones."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

from pymc_dp.accounting import gaussian_epsilon
from pymc_dp.audit import audit_mechanism, clopper_pearson, empirical_epsilon, penalty_runner
from pymc_dp.model import build_record_functions

DELTA = 1e-5
TRIALS = 400_000


def test_clopper_pearson_covers():
    lo, hi = clopper_pearson(np.array([0, 5, 100]), 100, 0.05)
    assert lo[0] == 0.0 and hi[2] == 1.0
    assert 0.016 < lo[1] < 0.017 and 0.11 < hi[1] < 0.12  # textbook values for 5/100


def test_empirical_epsilon_of_identical_outputs_is_zero():
    rng = np.random.default_rng(0)
    a = rng.normal(size=50_000)
    res = empirical_epsilon({"x": a}, {"x": rng.normal(size=50_000)}, DELTA)
    assert res.eps_lb < 0.2


def test_empirical_epsilon_detects_randomized_response():
    """Randomised response with eps = 1: the audit gets close to 1, never above it."""
    rng = np.random.default_rng(1)
    p = np.e / (1 + np.e)
    n = 400_000
    res = empirical_epsilon(
        {"bit": rng.uniform(size=n) < p}, {"bit": rng.uniform(size=n) < 1 - p}, 0.0
    )
    assert 0.9 < res.eps_lb <= 1.0


def _normal_fns(first_record: float):
    """A 1-parameter normal model on 10 records; record 0 is the one that differs."""
    x = np.linspace(-1, 1, 10)
    x[0] = first_record
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return build_record_functions(model, model.value_vars, model.initial_point())[0]


@pytest.fixture(scope="module")
def neighbours():
    # Record 0 far above in D and far below in D': its clipped ratio sits at +bound in D and
    # at -bound in D' (the worst case for a proposal that moves t upward).
    return _normal_fns(100.0), _normal_fns(-100.0)


Z = 1.0
CLIP = 2.0
CLAIM = gaussian_epsilon(1 / (2 * Z**2), DELTA)


def _penalty_audit(neighbours, **broken):
    fns_d, fns_d2 = neighbours
    q, q_new = np.array([0.0]), np.array([0.3])
    run = penalty_runner(fns_d, fns_d2, q, q_new, clip_bound=CLIP, noise_multiplier=Z, **broken)
    return audit_mechanism(run, DELTA, trials=TRIALS, seed=4)


def test_penalty_audit_is_below_claim(neighbours):
    res = _penalty_audit(neighbours)
    print(f"DPPenaltyMetropolis: claimed eps {CLAIM:.3f}, empirical lower bound {res.eps_lb:.3f}")
    assert 0.5 < res.eps_lb <= CLAIM


def test_penalty_audit_catches_halved_noise(neighbours):
    res = _penalty_audit(neighbours, noise_scale=0.5)
    print(f"noise halved: claimed eps {CLAIM:.3f}, empirical lower bound {res.eps_lb:.3f}")
    assert res.eps_lb > CLAIM


def test_penalty_audit_catches_removed_clipping(neighbours):
    res = _penalty_audit(neighbours, clip=False)
    print(f"clipping removed: claimed eps {CLAIM:.3f}, empirical lower bound {res.eps_lb:.3f}")
    assert res.eps_lb > CLAIM


# -- DPHMC: one iteration = L + 1 gradient releases and one ratio release ---------------------

HMC = dict(step_size=0.05, n_leapfrog=1, grad_clip_bound=2.0, llr_clip_bound=2.0)
Z_HMC = 2.0
HMC_CLAIM = gaussian_epsilon(1 / (2 * Z_HMC**2) + (1 + 1) / (2 * Z_HMC**2), DELTA)
HMC_TRIALS = 20_000  # trajectories are a Python loop (each trial's path differs)


def _hmc_audit(neighbours, **broken):
    from pymc_dp.audit import hmc_runner

    fns_d, fns_d2 = neighbours
    run = hmc_runner(
        fns_d,
        fns_d2,
        np.array([0.0]),
        np.array([0.5]),
        grad_noise_multiplier=Z_HMC,
        llr_noise_multiplier=Z_HMC,
        **HMC,
        **broken,
    )
    return audit_mechanism(run, DELTA, trials=HMC_TRIALS, seed=6)


@pytest.mark.slow
def test_hmc_audit_is_below_claim(neighbours):
    res = _hmc_audit(neighbours)
    print(f"DPHMC: claimed eps {HMC_CLAIM:.3f}, empirical lower bound {res.eps_lb:.3f}")
    assert 0.5 < res.eps_lb <= HMC_CLAIM


@pytest.mark.slow
def test_hmc_audit_catches_removed_clipping(neighbours):
    res = _hmc_audit(neighbours, clip=False)
    print(f"DPHMC clipping removed: claimed {HMC_CLAIM:.3f}, empirical {res.eps_lb:.3f}")
    assert res.eps_lb > HMC_CLAIM


# -- DPFastMH: per-iteration (epsilon, delta) claims, and the paper's "privacy for free" -------

FM_EPS, FM_DELTA = 1.0, 1e-5
FM_TRIALS = 50_000


def _fastmh_steps(**kwargs):
    import warnings

    import pymc_dp

    steps = []
    for first in (-100.0, 100.0):
        # the other records sit around the proposal's midpoint, so that record 0 decides
        x = np.linspace(-1.0, 1.1, 10)
        x[0] = first
        with pm.Model(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t = pm.Normal("t", 0, 3)
            pm.Normal("x", t, 1, observed=x)
            steps.append(
                pymc_dp.DPFastMH(
                    clip_bound=3.0, iter_epsilon=FM_EPS, iter_delta=FM_DELTA, max_step=0.1, **kwargs
                )
            )
    return steps


def _fastmh_audit(**kwargs):
    from pymc_dp.audit import fastmh_runner

    d, d2 = _fastmh_steps(**kwargs)
    run = fastmh_runner(d, d2, np.array([0.0]), np.array([0.1]))
    return d, audit_mechanism(run, FM_DELTA, trials=FM_TRIALS, seed=2)


@pytest.mark.slow
@pytest.mark.parametrize("branch", ["full batch", "minibatch"])
def test_fastmh_audit_is_below_claim(branch):
    kwargs = {"max_batch": 1} if branch == "full batch" else {}
    step, res = _fastmh_audit(**kwargs)
    assert step.iter_epsilon == FM_EPS and step.iter_delta == FM_DELTA
    print(f"DPFastMH {branch}: claimed eps {FM_EPS}, empirical lower bound {res.eps_lb:.3f}")
    assert res.eps_lb <= FM_EPS


@pytest.mark.slow
def test_fastmh_audit_catches_privacy_for_free():
    """The paper's noise-free rule claims (eps, delta) per iteration; the reject bit breaks it."""
    step, res = _fastmh_audit(max_batch=1, privacy_for_free=True)
    print(
        f"DPFastMH privacy_for_free: paper's claim ({FM_EPS}, {FM_DELTA}), empirical lower "
        f"bound {res.eps_lb:.3f} at delta {FM_DELTA}; pymc_dp charges delta {step.iter_delta:.3f}"
    )
    assert res.eps_lb > FM_EPS
    assert step.iter_delta > 0.1  # the honest charge
