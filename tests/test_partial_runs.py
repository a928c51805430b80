"""A run that stops after a release carries what it spent, pre-sampling phases included.

Each test failed on main at 99d13ac (issue 29, item 1): only `RecordsLostError` from the
chains was charged, and for the sampling step's releases alone; an error in the automatic
mode's warm start, in a callback of ``pm.sample`` or a `BudgetExceededError` carried
nothing.
"""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.accounting import GaussianEvent, compose_epsilon, gaussian_mu_for_epsilon
from pymc_dp.auto.configure import BudgetSplit, presample_phases
from pymc_dp.distributed import RecordsLostError
from pymc_dp.records.runtime import RecordFunctions

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
AUTO = dict(
    epsilon=2.0, delta=1e-5, chains=1, cores=1,
    auto_kwargs={"max_iterations": 200, "method": "chain"},
)  # fmt: skip


def _model():
    x = np.random.default_rng(3).normal(0.5, 1.0, size=200)
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return model


class _Stop(RuntimeError):
    pass


def _stop_after(k: int):
    calls = []

    def callback(trace=None, draw=None):
        calls.append(1)
        if len(calls) == k:
            raise _Stop("stopped by the test")

    return callback


def test_an_error_in_the_chains_of_the_automatic_mode_carries_the_pre_sampling_spend():
    with _model():
        idata = pymc_dp.sample(random_seed=4, **AUTO, **SAMPLE)
    pre_mu = float(idata.attrs["dp_presample_mu"])
    pre_releases = int(idata.attrs["dp_presample_releases"])
    mu_it = float(np.asarray(idata["sample_stats"]["dp_mu"]).ravel()[0])
    assert pre_mu > 0 and pre_releases > 0 and mu_it > 0
    with _model(), pytest.raises(_Stop) as info:  # the same seed: the same configuration
        pymc_dp.sample(random_seed=4, callback=_stop_after(3), **AUTO, **SAMPLE)
    err = info.value
    want = compose_epsilon([GaussianEvent(np.sqrt(0.5 / (pre_mu + 3 * mu_it)))], 1e-5)
    assert err.releases == pre_releases + 3
    assert err.epsilon == pytest.approx(want, rel=1e-9) and err.delta == 1e-5
    assert err.epsilon > compose_epsilon([GaussianEvent(np.sqrt(0.5 / pre_mu))], 1e-5)
    assert any("released sums reached the driver" in n for n in err.__notes__)


def test_records_lost_during_the_warm_start_carry_the_releases_made(monkeypatch):
    """Records lost at the 4th gradient-norm histogram: three warm-start iterations (a
    histogram, a gradient sum and an outer-product sum each) were released."""
    counts = RecordFunctions.grad_norm_counts
    calls = []

    def failing(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise RecordsLostError("a partition could not be recomputed (test)")
        return counts(self, *args, **kwargs)

    monkeypatch.setattr(RecordFunctions, "grad_norm_counts", failing)
    with _model(), pytest.raises(RecordsLostError) as info:
        pymc_dp.sample(random_seed=4, **AUTO, **SAMPLE)
    err = info.value
    phases = presample_phases(gaussian_mu_for_epsilon(2.0, 1e-5), BudgetSplit())
    warm = [p for p in phases if p.name.startswith("warm start")]
    assert len(warm) == 3
    mu = sum(GaussianEvent(p.noise_multiplier, 3).mu for p in warm)
    want = compose_epsilon([GaussianEvent(np.sqrt(0.5 / mu))], 1e-5)
    assert err.releases == 9
    assert err.epsilon == pytest.approx(want, rel=1e-9) and 0 < err.epsilon < 2.0


def test_budget_exceeded_carries_the_spend_of_the_step():
    with _model():
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0, epsilon=1.0, delta=1e-5, draws=5, tune=0, chains=1
        )
        pymc_dp.sample(5, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
        with pytest.raises(pymc_dp.BudgetExceededError) as info:
            pymc_dp.sample(5, tune=0, chains=1, step=step, random_seed=2, **SAMPLE)
    err = info.value
    mu = 5 * GaussianEvent(step.noise_multiplier).mu
    assert err.releases == 5
    assert err.epsilon == pytest.approx(compose_epsilon([GaussianEvent(np.sqrt(0.5 / mu))], 1e-5))
    assert err.epsilon <= 1.0 * (1 + 1e-9)
