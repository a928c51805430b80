"""Empirical privacy audit: sound for the real mechanisms, and able to fail for broken ones."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_dp.audit import audit_mechanism, clopper_pearson, empirical_epsilon, standard_scenarios

DELTA = 1e-5


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


SCENARIOS = standard_scenarios()


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[f"{s.step}: {s.variant}" for s in SCENARIOS])
def test_audit_scenario(scenario):
    """Correct mechanisms stay below their claim; broken variants are caught above it."""
    res = audit_mechanism(scenario.make_runner(), scenario.delta, trials=scenario.trials, seed=3)
    print(
        f"{scenario.step} [{scenario.variant}]: claimed eps {scenario.claimed_epsilon:.3f}, "
        f"empirical lower bound {res.eps_lb:.3f} ({res.event})"
    )
    if scenario.must_hold:
        assert res.eps_lb <= scenario.claimed_epsilon
        assert res.eps_lb > 0.05, "the audit should find some leakage of a real mechanism"
    else:
        assert res.eps_lb > scenario.claimed_epsilon


def test_scenarios_cover_every_step_and_three_broken_variants():
    steps = {s.step for s in SCENARIOS}
    assert {"DPPenaltyMetropolis", "DPHMC", "DPFastMH", "DPExpFamilyPenalty"} <= steps
    broken = {s.variant for s in SCENARIOS if not s.must_hold}
    assert {"noise scale halved", "clipping removed", "paper's privacy for free"} <= broken
    for step in steps:
        assert any(s.must_hold for s in SCENARIOS if s.step == step)
