"""``draws`` and ``tune`` as a PyMC user means them (issue 27 item 1): warmup never freezes an
independence proposal, the automatic mode runs the draws asked for and says what it did with
``tune``, and a run length predicted unusable is warned about before the chains run."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import normal_mean_model

import pymc_dp
from pymc_dp.auto import auto_configure
from pymc_dp.auto.configure import RunLengthWarning
from pymc_dp.diagnostics import ConvergenceWarning

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


def _hierarchical(n: int, groups: int = 5, seed: int = 0) -> pm.Model:
    """Non-centred hierarchical normal model with a group index, sigma unknown."""
    rng = np.random.default_rng(seed)
    g = rng.integers(groups, size=n)
    y = 1.0 + rng.normal(0, 1, groups)[g] + rng.normal(0, 1, n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=groups)
        sigma = pm.HalfNormal("sigma", 2)
        pm.Normal("y", mu + tau * z[g], sigma, observed=y)
    return model


def test_independence_proposal_keeps_its_scale_through_warmup():
    """Driven toward 0.44 from a low acceptance, the scale of an independence proposal used
    to shrink without bound in warmup (to 3e-6 in 300 iterations) and the chain then froze.
    It is calibrated: warmup leaves it alone, and the chain still moves after warmup."""
    model, mean, sd = normal_mean_model(n=200, seed=2)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0,
            noise_multiplier=2.5,  # acceptance well under 0.44 from the noise alone
            proposal="independent",
            proposal_mean=mean,
            proposal_cov=np.diag((1.2 * sd) ** 2),
        )
        idata = pm.sample(
            100, tune=300, chains=2, cores=1, step=step, random_seed=1,
            initvals={"theta": mean}, discard_tuned_samples=False, **SAMPLE,
        )  # fmt: skip
    for group in ("warmup_sample_stats", "sample_stats"):
        np.testing.assert_array_equal(idata[group]["scaling"].values, 1.0)
    acc = idata["sample_stats"]["accepted"].mean("draw").values
    assert np.all(acc > 0.05) and np.all(acc < 0.44), acc


@pytest.mark.slow
def test_tune_does_not_freeze_the_automatic_mode_on_a_hierarchical_model():
    """The pm.sample habit ``tune=`` on the non-centred hierarchical model: acceptance 0 in
    every chain before (R-hat 3e7); now no warmup is run (it adapts nothing), the draws are the
    draws asked for, the attributes say so, and every chain moves."""
    model = _hierarchical(n=5000)
    with model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)  # 100 draws: ESS < 100
            idata = pymc_dp.sample(
                100, tune=100, epsilon=10.0, delta=1e-6, chains=2, random_seed=1, **SAMPLE
            )
    post = idata["posterior"]
    assert post.sizes["draw"] == 100 and post.sizes["chain"] == 2
    a = idata.attrs
    assert (a["dp_draws_requested"], a["dp_tune_requested"]) == (100, 100)
    assert (a["dp_draws_run"], a["dp_tune_run"]) == (100, 0)
    assert "tune=100 requested, no warmup run" in a["dp_auto_run_length"]
    acc = idata["sample_stats"]["accepted"].mean("draw").values
    assert np.all(acc > 0.1), acc
    np.testing.assert_allclose(np.asarray(a["dp_acceptance"]), acc)
    for name in ("sigma", "mu", "z"):  # every chain moves: many distinct values
        x = post[name].values.reshape(2, 100, -1)
        assert all(np.unique(x[c, :, 0]).size > 10 for c in range(2)), name
    assert float(a["dp_max_rhat"]) < 1.3
    report = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert report.tuning_iterations == 0 and report.draws == 100
    assert report.epsilon <= 10.0 + 1e-9


def test_a_run_length_predicted_unusable_is_warned_before_the_chains():
    """draws so many that each test's noise leaves almost nothing accepted: warned with the
    predicted acceptance and ESS and the planner's own length, by auto_configure (before the
    sampling phase reads the data); the planner's own length is not warned about."""
    rng = np.random.default_rng(4)
    x = rng.uniform(-1, 1, 3000)
    y = rng.random(3000) < 1 / (1 + np.exp(-(0.5 + x)))
    with pm.Model() as model:
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Bernoulli("y", logit_p=b[0] + b[1] * x, observed=y)
    kw = dict(epsilon=10.0, delta=1e-5, chains=2, tune=None, method="chain")
    with model:
        with pytest.warns(RunLengthWarning) as rec:
            plan = auto_configure(model, draws=1_000_000, rng=np.random.default_rng(0), **kw)
        text = str(rec[0].message)
        assert text.startswith("draws=1000000 per chain (2000000 iterations over 2 chains)")
        assert "is too large; the planner would run draws=" in text
        acc = float(text.split("acceptance ")[1].split(",")[0])
        assert acc < 0.01 and acc == pytest.approx(plan.prediction.accept, rel=1e-2)
        assert plan.draws == 1_000_000 and plan.draws_requested == 1_000_000
        with warnings.catch_warnings():
            warnings.simplefilter("error", RunLengthWarning)
            chosen = auto_configure(model, draws=None, rng=np.random.default_rng(0), **kw)
    assert issubclass(RunLengthWarning, ConvergenceWarning)
    assert chosen.prediction.accept > 0.1 and chosen.prediction.ess >= 100
    assert chosen.to_attrs()["dp_draws_requested"] == -1
    assert "chosen by the predicted effective sample size" in chosen.run_length_note


@pytest.mark.slow
def test_a_chain_that_cannot_move_gives_way_to_the_one_shot_strategy():
    """method='auto' gives a hierarchical model the penalty chain; where the chain's predicted
    effective sample size (from released values) is below ONESHOT_FALLBACK_ESS, the budget
    left goes to the one-shot strategy's last releases instead (measured on the GLMM of
    bench_auto at epsilon 3: the chain ran 50-170 draws at acceptance 0.03-0.04, R-hat
    1.6-3.3, up to 44 % of the parameters beyond 2 of their own sds). The same warm start
    (same seed) with method='chain' keeps the chain; both spend the whole budget."""
    from pymc_dp.accounting import GaussianEvent, compose_epsilon
    from pymc_dp.auto.configure import ONESHOT_FALLBACK_ESS

    model = _hierarchical(n=2000)
    kw = dict(epsilon=3.0, delta=1e-6, chains=2, draws=None, tune=None)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        chain = auto_configure(model, rng=np.random.default_rng(0), method="chain", **kw)
        auto = auto_configure(model, rng=np.random.default_rng(0), method="auto", **kw)
        fixed = auto_configure(
            model, rng=np.random.default_rng(0), method="auto", **{**kw, "draws": 3000}
        )
    assert chain.method == "chain" and chain.prediction.ess < ONESHOT_FALLBACK_ESS
    assert auto.method == "laplace" and fixed.method == "laplace"
    # the note cites the prediction made before the control variate's release (the chain's
    # own, after it, also counts its proposal's centre off the mode: `_off_centre`, lower)
    cited = float(auto.strategy_note.split("effective sample size of ")[1].split()[0])
    assert chain.prediction.ess <= cited + 0.5 and cited < ONESHOT_FALLBACK_ESS
    assert auto.to_attrs()["dp_auto_strategy"] == auto.strategy_note
    assert fixed.draws == 3000  # the draws asked for, now independent draws
    for plan in (chain, auto, fixed):
        spent = compose_epsilon(
            [GaussianEvent(p.noise_multiplier, p.releases) for p in plan.phases], 1e-6
        )
        assert 3.0 * (1 - 1e-6) < spent <= 3.0
    # the warm start is the same releases: the switch is post-processing of released values
    np.testing.assert_allclose(auto.clip_bounds, chain.clip_bounds)
    with model:
        idata = pymc_dp.sample(epsilon=3.0, delta=1e-6, chains=2, random_seed=0, **SAMPLE)
    assert idata.attrs["dp_method"] == "laplace" and "dp_auto_strategy" in idata.attrs
    report = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert report.epsilon <= 3.0 + 1e-9


def test_both_strategies_threshold_their_warm_start_histograms_at_bonferronis_level(monkeypatch):
    """At 3 noise sds a bin of noise alone passes in ~4 % of the warm start's histograms and
    that iteration's clip bound (its gradient noise with it) jumps: measured on the GLMM of
    bench_auto at epsilon 3, whose group effects then moved 60 posterior sds in one step and
    whose result came out 3e5 NUTS sds off (flagged). The chain's warm start (which may hand
    its budget to the one-shot strategy) uses Bonferroni's level over the bins, as the
    one-shot strategy's does, and moves its likelihood-free coordinates to their conditional
    prior mode (the prior given)."""
    import pymc_dp.auto.configure as configure
    from pymc_dp.auto.configure import NEWTON_STEPS
    from pymc_dp.auto.oneshot import bonferroni_sds

    seen = []
    real = configure.private_laplace

    def spy(**kw):
        seen.append((kw["hist_threshold_sds"], kw["grid"].size, kw["prior_logp_and_grad"]))
        return real(**kw)

    monkeypatch.setattr(configure, "private_laplace", spy)
    model = _hierarchical(n=500)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        for method in ("chain", "laplace"):
            auto_configure(
                model, epsilon=10.0, delta=1e-6, chains=2, draws=None, tune=None,
                rng=np.random.default_rng(0), method=method,
            )  # fmt: skip
    assert len(seen) == 2
    for sds, bins, prior in seen:
        # Bonferroni's level over every bin of every histogram of the warm start
        assert sds == pytest.approx(bonferroni_sds((bins + 1) * (NEWTON_STEPS + 1)))
        assert sds > 3.9
        assert prior is not None
