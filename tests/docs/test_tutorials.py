"""The claims the tutorials (examples/banana.py, examples/constrained_parameter.py) rest on.

``tests/scripts/test_examples.py`` runs the scripts; these tests check the mathematics their prose
states: the banana prior written as two Normals is Ban(0, sigma0^2 I, a), the closed-form
posterior moments agree with exact draws, PyMC's log-Jacobian of the logit transform is
log p(1 - p), and the clip bound 1 of the Beta-Bernoulli tutorial bounds every per-record
log-likelihood ratio that pymc_dp computes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def examples_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


@pytest.fixture(scope="module")
def banana(examples_path):
    import banana

    return banana


@pytest.fixture(scope="module")
def constrained(examples_path):
    import constrained_parameter

    return constrained_parameter


def test_banana_prior_is_the_ban_density(banana):
    """theta1 ~ N(0, s0^2), theta2 | theta1 ~ N(-a theta1^2, s0^2) has density Ban(0, s0^2 I, a).

    Ban(0, S, a) is the law of (z1, z2 - a z1^2), z ~ N(0, S); the map has Jacobian 1, so its
    log-density is -(theta1^2 + (theta2 + a theta1^2)^2) / (2 s0^2) + const.
    """
    x1, x2 = np.zeros(3), np.zeros(3)  # the prior does not depend on the data
    model = banana.banana_model(x1, x2)
    prior = model.compile_fn(model.logp(vars=model.free_RVs), point_fn=True)
    rng = np.random.default_rng(0)
    pts = rng.normal(0.0, [0.5, 5.0], size=(20, 2))
    diffs = [
        prior({"theta1": t1, "theta2": t2})
        + (t1**2 + (t2 + banana.A * t1**2) ** 2) / (2 * banana.SIGMA0_SQ)
        for t1, t2 in pts
    ]
    assert np.ptp(diffs) < 1e-9, np.ptp(diffs)


def test_banana_closed_form_moments_match_exact_draws(banana):
    """banana_moments (printed as the exact posterior) agrees with draws of Ban(mu, Sigma, a)."""
    mu = np.array([0.07, 2.9])  # a posterior centre away from 0 exercises the mu1 terms
    z = np.random.default_rng(1).normal(mu, np.sqrt(banana.SIGMA), size=(400_000, 2))
    draws = np.column_stack([z[:, 0], z[:, 1] - banana.A * z[:, 0] ** 2])
    mean, sd = banana.banana_moments(mu)
    m = draws.shape[0]
    se_mean = draws.std(axis=0) / np.sqrt(m)
    assert np.all(np.abs(draws.mean(axis=0) - mean) < 4 * se_mean)
    c = draws - draws.mean(axis=0)
    var = (c**2).mean(axis=0)
    se_var = np.sqrt(((c**4).mean(axis=0) - var**2) / m)
    assert np.all(np.abs(var - sd**2) < 4 * se_var)


def test_banana_starting_points_are_data_free_and_seeded(banana):
    a = banana.starting_points(4, seed=3)
    assert a == banana.starting_points(4, seed=3)
    assert len(a) == 4 and all(set(p) == {"theta1", "theta2"} for p in a)


def test_logit_log_jacobian_is_log_p_one_minus_p(constrained):
    model = constrained.beta_bernoulli_model(np.array([0, 1, 1]))
    p = model["p"]
    value = model.rvs_to_values[p]
    assert value.name == "p_logodds__"
    with_jac = model.compile_fn(model.logp(vars=[p], jacobian=True), point_fn=True)
    without = model.compile_fn(model.logp(vars=[p], jacobian=False), point_fn=True)
    for eta in np.linspace(-4.0, 4.0, 9):
        s = 1.0 / (1.0 + np.exp(-eta))
        jac = with_jac({value.name: eta}) - without({value.name: eta})
        np.testing.assert_allclose(jac, np.log(s) + np.log1p(-s), rtol=1e-10, atol=1e-12)


def test_bernoulli_clip_bound_one_never_clips(constrained):
    """|l_i(eta') - l_i(eta)| <= |eta' - eta| for pymc_dp's per-record ratios, both answers."""
    from pymc_dp.records import build_record_functions

    model = constrained.beta_bernoulli_model(np.array([0, 1] * 5))
    vars_ = model.value_vars
    fns, _ = build_record_functions(model, vars_, model.initial_point())
    rng = np.random.default_rng(2)
    worst = 0.0
    for _ in range(200):
        q, q_new = rng.normal(0.0, 4.0, size=(2, 1))
        r = fns.loglik_ratio(q_new, q)
        worst = max(worst, float(np.max(np.abs(r)) / abs(q_new[0] - q[0])))
    assert worst <= constrained.LIPSCHITZ_BOUND
    # and the bound is tight: far from the data, |y - sigmoid(eta)| approaches 1
    r = fns.loglik_ratio(np.array([-20.0]), np.array([-19.0]))
    assert np.max(np.abs(r)) > 0.99
