"""DPPenaltyMetropolis: exactness with clipping inactive, reproducibility, pickling, errors."""

from __future__ import annotations

import multiprocessing

import cloudpickle
import numpy as np
import pymc as pm
import pytest
from conftest import (
    assert_matches_distribution,
    inverse_gamma_variance_model,
    normal_mean_model,
    posterior_array,
)
from scipy import stats

import pymc_dp
from pymc_dp.accounting import calibrate_noise_multiplier, gaussian_epsilon

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


def _no_clipping(idata) -> None:
    """The exactness tests need clipping inactive: check it (non-private diagnostic)."""
    assert np.nanmax(idata["sample_stats"]["clip_fraction_NONPRIVATE"].values) == 0.0


@pytest.mark.slow
def test_exact_normal_mean_1d():
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=50.0,
            noise_multiplier=0.03,
            proposal_scale=0.2,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(3000, tune=500, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    _no_clipping(idata)
    assert np.nanmax(idata["sample_stats"]["noise_std"].values) > 0.1  # noise is really on
    assert_matches_distribution(
        posterior_array(idata, "theta")[..., 0], stats.norm(mean[0], sd[0]), label="theta"
    )


@pytest.mark.slow
@pytest.mark.parametrize("proposal", ["gaussian", "coordinate", "guided"])
def test_exact_normal_mean_5d(proposal):
    model, mean, sd = normal_mean_model(n=40, d=5, seed=4)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=50.0,
            noise_multiplier=0.02,
            proposal=proposal,
            proposal_scale=0.15,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(4000, tune=1000, chains=4, cores=1, step=step, random_seed=5, **SAMPLE)
    _no_clipping(idata)
    draws = posterior_array(idata, "theta")
    for k in range(5):
        assert_matches_distribution(draws[..., k], stats.norm(mean[k], sd[k]), label=f"theta{k}")


@pytest.mark.slow
def test_exact_transformed_variable():
    model, post = inverse_gamma_variance_model()
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=400.0,
            noise_multiplier=0.002,
            proposal_scale=0.3,
            nonprivate_diagnostics=True,
        )
        idata = pm.sample(4000, tune=1000, chains=4, cores=1, step=step, random_seed=2, **SAMPLE)
    _no_clipping(idata)
    assert_matches_distribution(posterior_array(idata, "s2"), post, label="s2")


def test_clipping_is_active_with_small_bound():
    """The exactness checks would be vacuous if the diagnostic always said 0."""
    model, *_ = normal_mean_model(n=50, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=0.01, noise_multiplier=1.0, proposal_scale=0.2, nonprivate_diagnostics=True
        )
        idata = pm.sample(50, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
    assert np.nanmax(idata["sample_stats"]["clip_fraction_NONPRIVATE"].values) > 0.5


def _run(cores, mp_ctx=None, chains=4):
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=20.0, noise_multiplier=0.1)
        kw = {"mp_ctx": mp_ctx} if mp_ctx else {}
        return pm.sample(
            60, tune=20, chains=chains, cores=cores, step=step, random_seed=7, **kw, **SAMPLE
        )


def test_same_draws_for_cores_1_and_2():
    a, b = _run(1), _run(2)
    np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    np.testing.assert_array_equal(
        a["sample_stats"]["accepted"].values, b["sample_stats"]["accepted"].values
    )


def test_step_pickles_and_spawn_works():
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=20.0, noise_multiplier=0.1)
    # PyMC ships steps to worker processes with cloudpickle (its models do not pickle with the
    # standard library pickle, for PyMC's own steps neither).
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    assert clone.noise_multiplier == step.noise_multiplier
    if "spawn" in multiprocessing.get_all_start_methods():
        # two chains: one spawned worker each (every worker imports PyMC and unpickles the
        # step); the four-chain comparison of cores 1 and 2 is the test above
        a, b = _run(1, chains=2), _run(2, mp_ctx="spawn", chains=2)
        np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))


def test_calibrated_plan_and_budget_guard():
    model, *_ = normal_mean_model(n=30, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, epsilon=2.0, delta=1e-5, draws=30, tune=10, chains=2
        )
        assert step.noise_multiplier == pytest.approx(calibrate_noise_multiplier(2.0, 1e-5, 80))
        pm.sample(30, tune=10, chains=2, cores=1, step=step, random_seed=1, **SAMPLE)
        with pytest.raises(pymc_dp.BudgetExceededError, match="calibrated for 40 iterations"):
            pm.sample(31, tune=10, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)


def test_compound_step_report(logistic_model):
    model, *_ = logistic_model
    with model:
        s1 = pymc_dp.DPPenaltyMetropolis([model["a"]], clip_bound=3.0, noise_multiplier=2.0)
        s2 = pymc_dp.DPPenaltyMetropolis([model["w"]], clip_bound=3.0, noise_multiplier=4.0)
        idata = pm.sample(20, tune=5, chains=2, cores=1, step=[s1, s2], random_seed=3, **SAMPLE)
    rep = pymc_dp.privacy_report(idata, delta=1e-5)
    mu = 2 * 25 * (1 / (2 * 2.0**2) + 1 / (2 * 4.0**2))
    assert rep.mu == pytest.approx(mu)
    assert rep.releases == 2 * 25 * 2
    assert rep.epsilon == pytest.approx(gaussian_epsilon(mu, 1e-5))


# -- bad input: a clear error naming the parameter, before any data is read -----------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_bound": 0.0, "noise_multiplier": 1.0}, "clip_bound"),
        ({"clip_bound": np.inf, "noise_multiplier": 1.0}, "clip_bound"),
        ({"clip_bound": -1.0, "noise_multiplier": 1.0}, "clip_bound"),
        ({"clip_bound": 1.0, "noise_multiplier": 0.0}, "noise_multiplier"),
        ({"clip_bound": 1.0, "noise_multiplier": -2.0}, "noise_multiplier"),
        ({"clip_bound": 1.0}, "exactly one of noise_multiplier or epsilon"),
        ({"clip_bound": 1.0, "noise_multiplier": 1.0, "epsilon": 1.0}, "exactly one"),
        ({"clip_bound": 1.0, "epsilon": 1.0, "delta": 1e-5}, "draws, tune, chains"),
        (
            {"clip_bound": 1.0, "epsilon": 0.0, "delta": 1e-5, "draws": 1, "tune": 0, "chains": 1},
            "epsilon",
        ),
        (
            {
                "clip_bound": 1.0,
                "epsilon": np.nan,
                "delta": 1e-5,
                "draws": 1,
                "tune": 0,
                "chains": 1,
            },
            "epsilon",
        ),
        (
            {"clip_bound": 1.0, "epsilon": 1.0, "delta": 1.5, "draws": 1, "tune": 0, "chains": 1},
            "delta",
        ),
        (
            {"clip_bound": 1.0, "epsilon": 1.0, "delta": 0.0, "draws": 1, "tune": 0, "chains": 1},
            "delta",
        ),
        ({"clip_bound": 1.0, "noise_multiplier": 1.0, "proposal": "hmc"}, "proposal"),
        ({"clip_bound": 1.0, "noise_multiplier": 1.0, "scaling": 0}, "scaling"),
    ],
)
def test_bad_input_raises_before_reading_data(kwargs, match, monkeypatch):
    import pymc_dp.step_methods.base as base

    def fail(*a, **k):  # the data must not be touched
        raise AssertionError("record functions were built before the input was validated")

    monkeypatch.setattr(base, "build_record_functions", fail)
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.raises(ValueError, match=match):
        pymc_dp.DPPenaltyMetropolis(**kwargs)


def test_delta_above_one_over_n_warns():
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.warns(UserWarning, match=r"larger than 1/n = 0.1"):
        pymc_dp.DPPenaltyMetropolis(
            clip_bound=1.0, epsilon=1.0, delta=0.2, draws=10, tune=0, chains=1
        )


def test_independence_proposal_passes_its_hastings_term_to_the_test(monkeypatch):
    """``proposal="independent"``: every penalty test gets ``log q(theta) - log q(theta')``,
    ``q = N(m, s^2 Sigma)`` the proposal's density, and the exact log prior ratio (closed
    forms from scipy at the pair the ratio sum was taken at; spies at the step's calls)."""
    import pymc_dp.step_methods.penalty as penalty_step
    from pymc_dp.records.runtime import RecordFunctions

    pairs, tests = [], []
    real_sum = RecordFunctions.clipped_loglik_ratio_sum
    real_test = penalty_step.penalty_log_acceptance

    def spy_sum(self, q_new, q_old, bound):
        pairs.append((np.array(q_new), np.array(q_old)))
        return real_sum(self, q_new, q_old, bound)

    def spy_test(llr, log_prior_ratio, log_q_ratio, sigma, rng):
        tests.append((log_prior_ratio, log_q_ratio))
        return real_test(llr, log_prior_ratio, log_q_ratio, sigma, rng)

    monkeypatch.setattr(RecordFunctions, "clipped_loglik_ratio_sum", spy_sum)
    monkeypatch.setattr(penalty_step, "penalty_log_acceptance", spy_test)
    model, mean, sd = normal_mean_model(n=50, d=2)
    m = mean + np.array([0.05, -0.03])
    cov = np.array([[1.5, 0.4], [0.4, 2.0]]) * sd[0] ** 2
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0, noise_multiplier=0.5, proposal="independent",
            proposal_mean=m, proposal_cov=cov,
        )  # fmt: skip
        idata = pm.sample(40, tune=0, chains=1, cores=1, step=step, random_seed=5, **SAMPLE)
    (s,) = np.unique(idata.sample_stats["scaling"].values)
    proposal = stats.multivariate_normal(m, s**2 * cov)
    prior = stats.norm(0.0, 10.0)
    assert len(pairs) == len(tests) == 40
    for (q1, q0), (lp_ratio, lq_ratio) in zip(pairs, tests, strict=True):
        assert lq_ratio == pytest.approx(
            proposal.logpdf(q0) - proposal.logpdf(q1), rel=1e-9, abs=1e-12
        )
        assert lp_ratio == pytest.approx(
            np.sum(prior.logpdf(q1) - prior.logpdf(q0)), rel=1e-9, abs=1e-12
        )


def test_every_chain_of_a_sequential_compound_run_adapts_during_warmup():
    """With ``cores=1`` PyMC sets ``tune`` on a ``CompoundStep`` only, not on its methods: after
    chain 0's warmup ended (``stop_tuning``) the DP steps of the later chains did not adapt
    (the penalty step's scaling stayed at its start in chain 1's warmup). `reset_tuning`, which
    PyMC calls per chain, switches tuning back on, as PyMC's HMC steps do."""
    y = np.random.default_rng(0).normal(1.0, 2.0, size=200)
    with pm.Model():
        mu = pm.Normal("mu", 0.0, 5.0)
        s = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu, s, observed=y)
        steps = [
            pymc_dp.DPHMC(
                [mu], llr_clip_bound=5.0, grad_clip_bound=5.0, n_leapfrog=3,
                llr_noise_multiplier=0.01, grad_noise_multiplier=0.01,
            ),
            pymc_dp.DPPenaltyMetropolis([s], clip_bound=5.0, noise_multiplier=0.01),
        ]  # fmt: skip
        idata = pm.sample(
            draws=5, tune=30, chains=2, cores=1, step=steps, random_seed=1, progressbar=False,
            discard_tuned_samples=False, compute_convergence_checks=False,
        )  # fmt: skip
    warm, after = idata.warmup_sample_stats["scaling"].values, idata.sample_stats["scaling"].values
    for chain in range(2):
        assert len(np.unique(warm[chain])) > 10, (chain, warm[chain])
        assert len(np.unique(after[chain])) == 1  # tuning stops at iteration `tune`
