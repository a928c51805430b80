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
