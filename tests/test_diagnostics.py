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
