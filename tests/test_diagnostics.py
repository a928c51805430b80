"""Convergence diagnostics after every pymc_dp run (pymc_dp.diagnostics): loud when a chain
is frozen or the chains disagree, quiet when they mix."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from conftest import normal_mean_model

import pymc_dp
from pymc_dp.diagnostics import ConvergenceWarning, check_convergence

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


def _tree(posterior: dict, accepted: np.ndarray) -> xr.DataTree:
    """A minimal result: ``posterior`` ``{name: (chain, draw, ...)}`` and the accept stat."""
    post = xr.Dataset(
        {
            k: (("chain", "draw", *[f"{k}_{i}" for i in range(v.ndim - 2)]), v)
            for k, v in posterior.items()
        }
    )
    stats = xr.Dataset({"accepted": (("chain", "draw", "s")[: accepted.ndim], accepted)})
    return xr.DataTree.from_dict({"posterior": post, "sample_stats": stats})


def test_rhat_ess_and_acceptance_flag_what_failed():
    rng = np.random.default_rng(0)
    mixed = rng.normal(size=(4, 500, 2))
    ok = _tree({"a": mixed, "c": np.full((4, 500), 2.0)}, np.full((4, 500), 0.3))
    conv = check_convergence(ok, warn=False)
    # a constant (data-free) Deterministic is left out; the mixed chains pass
    assert conv.converged and conv.max_rhat < 1.02 and conv.min_ess_bulk > 1000
    assert conv.summary().startswith("converged: max R-hat")
    # chains stuck at different places: R-hat (with the scalar's name)
    apart = mixed + np.arange(4)[:, None, None]
    conv = check_convergence(_tree({"a": apart}, np.full((4, 500), 0.3)), warn=False)
    assert not conv.converged and conv.max_rhat > 1.5 and conv.worst_rhat.startswith("a[")
    # one chain frozen (acceptance 0) in one step of a compound step
    acc = np.full((4, 500, 2), 0.3)
    acc[2, :, 1] = 0.0
    conv = check_convergence(_tree({"a": mixed}, acc), warn=False)
    assert conv.problems == ["chain 2 accepted under 1% of proposals"]
    np.testing.assert_allclose(conv.acceptance, [0.3, 0.3, 0.0, 0.3])
    # a single chain: no R-hat (NaN), ESS and acceptance only
    one = np.cumsum(rng.normal(size=(1, 500)), axis=1)  # a random walk: tiny ESS
    conv = check_convergence(_tree({"a": one}, np.full((1, 500), 0.3)), warn=False)
    assert np.isnan(conv.max_rhat) and conv.problems == [f"bulk ESS {conv.min_ess_bulk:.0f} < 100"]
    assert "not computed (one chain)" in conv.summary()
    with pytest.warns(ConvergenceWarning, match="NOT CONVERGED .*what would help: more draws"):
        check_convergence(_tree({"a": one}, np.full((1, 500), 0.3)))
    # fewer than 4 draws: said so, no R-hat or ESS computed
    conv = check_convergence(_tree({"a": mixed[:, :3]}, np.full((4, 3), 0.3)), warn=False)
    assert conv.problems == ["3 draws per chain: too few to diagnose (at least 4)"]


def test_a_frozen_hand_configured_chain_is_loud_in_the_warning_attrs_and_report():
    """DPPenaltyMetropolis whose noise makes every test fail: acceptance 0, said three times."""
    model, _, _ = normal_mean_model(n=200, seed=3)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=50.0, delta=1e-5)
        with pytest.warns(
            ConvergenceWarning, match=r"NOT CONVERGED.*accepted under 1%.*larger epsilon"
        ):
            idata = pymc_dp.sample(60, tune=0, step=step, chains=2, random_seed=1, **SAMPLE)
    assert idata.attrs["dp_converged"] == 0
    assert np.all(np.asarray(idata.attrs["dp_acceptance"]) < 0.01)
    assert idata["posterior"].attrs["dp_converged"] == 0  # also on the group
    assert idata.attrs["dp_min_ess_bulk"] < 100
    report = pymc_dp.privacy_report(idata, model=model, attach=False)
    top = [line for line in str(report).splitlines() if not line.startswith(" ")]
    assert top[0].startswith("NOT CONVERGED") and top[1].startswith("(epsilon, delta) = (")


def test_a_well_mixing_run_is_quiet():
    """Small noise, a good random walk: R-hat ~1, ESS in the hundreds, no warning."""
    model, _, _ = normal_mean_model(n=50, seed=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=50.0, noise_multiplier=0.03, proposal_scale=0.25, delta=1e-5
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(800, tune=200, step=step, chains=2, random_seed=2, **SAMPLE)
    assert not [w for w in caught if issubclass(w.category, ConvergenceWarning)]
    assert idata.attrs["dp_converged"] == 1
    assert idata.attrs["dp_max_rhat"] < 1.05 and idata.attrs["dp_min_ess_bulk"] > 100
    assert np.all(np.asarray(idata.attrs["dp_acceptance"]) > 0.1)
    lines = str(pymc_dp.privacy_report(idata, model=model, attach=False)).splitlines()
    assert lines[0].startswith("(epsilon, delta) = (")
    assert lines[1].startswith("  converged: max R-hat")


def test_check_convergence_is_public():
    assert pymc_dp.check_convergence is check_convergence
    assert issubclass(pymc_dp.ConvergenceWarning, UserWarning)


def _posterior_tree(**posterior) -> xr.DataTree:
    post = xr.Dataset(
        {
            k: (("chain", "draw", *[f"{k}_{i}" for i in range(v.ndim - 2)]), v)
            for k, v in posterior.items()
        }
    )
    return xr.DataTree.from_dict({"posterior": post})


def _prior_model(n: int = 10):
    import pymc as pm

    with pm.Model() as m:
        mu = pm.Normal("mu", 0.0, 5.0)
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        pm.Normal("y", mu + b.sum(), 1.0, observed=np.linspace(-1.0, 1.0, n))
    return m


def test_close_to_prior_names_the_entries_drawn_about_as_wide_as_their_prior():
    from pymc_dp.diagnostics import close_to_prior

    rng = np.random.default_rng(1)
    b = rng.normal(0.0, 0.1, size=(4, 500, 3))
    b[..., 1] = rng.normal(0.0, 1.0, size=(4, 500))  # its prior's spread
    # mu drawn from its prior about another mean: the spread, not the location, counts
    tree = _posterior_tree(mu=rng.normal(3.0, 5.0, size=(4, 500)), b=b)
    assert close_to_prior(tree, _prior_model()) == ["mu", "b[1]"]
    # spreads at 0.6 of the prior's: not close (the threshold is 0.8)
    narrow = _posterior_tree(mu=rng.normal(0.0, 3.0, size=(4, 500)), b=0.6 * b)
    assert close_to_prior(narrow, _prior_model()) == []


def test_close_to_prior_draws_no_prior_that_reads_the_data():
    import pymc as pm

    from pymc_dp.diagnostics import close_to_prior

    with pm.Model() as m:
        x = pm.Data("x", np.linspace(0.0, 1.0, 10))
        mu = pm.Normal("mu", 0.0, 5.0 * x.std())  # a prior scaled by the data
        pm.Normal("y", mu * x, 1.0, observed=np.linspace(-1.0, 1.0, 10))
    tree = _posterior_tree(mu=np.random.default_rng(2).normal(0.0, 100.0, size=(4, 500)))
    assert close_to_prior(tree, m) == []


def test_a_one_record_result_is_the_prior_and_says_so():
    """Found by the issue-26 review: an observed array of length 1 gave a result that was its
    prior (mean 0.36, sd 4.93 for mu ~ N(0, 5)) with no warning; it now warns and says so in
    ``dp_prior_close``. With 2 000 records the same model learns mu: no such warning."""
    import pymc as pm

    for n, expect in ((1, "mu"), (2000, "")):
        with pm.Model() as m:
            mu = pm.Normal("mu", 0.0, 5.0)
            pm.Normal("y", mu, 1.0, observed=np.random.default_rng(3).normal(1.0, 1.0, n))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(
                model=m,
                epsilon=3.0,
                delta=1e-6,
                data_bounds={"y": (-5.0, 5.0)},
                random_seed=4,
                **SAMPLE,
            )
        warned = [w for w in caught if issubclass(w.category, pymc_dp.PriorDominatedWarning)]
        assert idata.attrs["dp_prior_close"] == expect
        assert bool(warned) == bool(expect)
        if expect:
            assert "mu" in str(warned[0].message) and warned[0].filename == __file__
    # the module pymc_dp.report is the report function too
    rep = pymc_dp.report(idata, 1e-6, attach=False, model=m)
    same = pymc_dp.privacy_report(idata, 1e-6, attach=False, model=m)
    assert rep.to_attrs().keys() == same.to_attrs().keys()
    assert str(rep) == str(same) and rep.epsilon == same.epsilon > 0
