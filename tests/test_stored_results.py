"""Results stored by an earlier pymc_dp still give the privacy report they were published with.

The files in ``tests/data/stored_results/`` were made by main at commit e434abe
(``tests/data/make_stored_results.py``): one small run per step class and one compound run.
A stat name saved in results (``dp_mu``, ``dp_releases``, ...) is a file format: it may never
be renamed or change its meaning (add a new stat instead). These tests pin the names and
check that today's :func:`pymc_dp.privacy_report` reads the old files to the same epsilon.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

import pymc_dp

DATA = Path(__file__).parent / "data" / "stored_results"

#: The privacy stats every step saves (read by the report).
COMMON = {"dp_mu", "dp_releases", "dp_target_delta"}

#: dp_* stats added since e434abe (new names only, never a renamed one): the data-free
#: dimension a step covers and its planned chains (issue 14: the report checks coverage and
#: flags chains beyond the plan). Every step declares them; old files do not hold them.
ADDED_SINCE_E434ABE = {"dp_ndim", "dp_plan_chains"}

#: Added by issue 20: the number of data owners of the data-sharing scheme (0: central).
#: Declared by every step; none of the stored files holds it (the report reads 0 then).
ADDED_ISSUE_20 = {"dp_owners"}

#: Added by issue 29: every step's iteration counter and planned iterations per chain (the
#: report detects a thinned or sliced result) and whether it used a release made before the
#: chains. Old files do not hold them:
#: their report is unverified, its epsilon unchanged.
ADDED_ISSUE_29 = {"dp_iteration", "dp_needs_presample", "dp_plan_iterations"}

#: The dp_* stats each stored run saved, and the step classes that emit them.
STORED = {
    "penalty": (COMMON, ["DPPenaltyMetropolis"]),
    "hmc": (COMMON, ["DPHMC"]),
    "fastmh": (COMMON | {"dp_iter_epsilon", "dp_iter_delta"}, ["DPFastMH"]),
    "subsampled_penalty": (
        COMMON | {"dp_wor_sigma", "dp_wor_batch", "dp_wor_n"},
        ["DPSubsampledPenalty"],
    ),
    "barker": (COMMON | {"dp_barker_batch", "dp_barker_n"}, ["DPBarker"]),
    "sgld": (COMMON | {"dp_poisson_sigma", "dp_poisson_q"}, ["DPSGLD"]),
    "sgnht": (COMMON | {"dp_poisson_sigma", "dp_poisson_q"}, ["DPSGNHT"]),
    "compound_penalty_sgld": (
        COMMON | {"dp_poisson_sigma", "dp_poisson_q"},
        ["DPPenaltyMetropolis", "DPSGLD"],
    ),
    # made after the merge of issues 14, 15, 19 (the first main with this step)
    "expfam": (COMMON | ADDED_SINCE_E434ABE, ["DPExpFamilyPenalty"]),
}


def _load(name: str):
    path = str(DATA / f"{name}.nc")
    try:
        import arviz as az

        out = az.from_netcdf(path)
        if hasattr(out, "groups") or hasattr(out, "children"):
            return out
    except Exception:  # pragma: no cover - arviz 1.x (PyMC 6) reads DataTrees
        pass
    import xarray as xr  # pragma: no cover

    return xr.open_datatree(path)  # pragma: no cover


def _dataset(obj, group: str):
    g = obj[group]
    return g.to_dataset() if hasattr(g, "to_dataset") else g


def _stored_attrs(obj) -> dict:
    return dict(_dataset(obj, "posterior").attrs)


def test_every_step_class_is_covered():
    covered = {cls for _, classes in STORED.values() for cls in classes}
    public = {
        name
        for name in pymc_dp.__all__
        if isinstance(getattr(pymc_dp, name), type)
        and issubclass(getattr(pymc_dp, name), pymc_dp.DPStep)
        and getattr(pymc_dp, name) is not pymc_dp.DPStep
    }
    assert public <= covered, f"store a result for {sorted(public - covered)}"


@pytest.mark.parametrize("name", sorted(STORED))
def test_stored_stat_names_are_still_emitted(name):
    names, classes = STORED[name]
    stats = _dataset(_load(name), "sample_stats")
    saved = {v for v in stats.data_vars if str(v).startswith("dp_")}
    assert saved == names, f"{name}: the stored file holds {sorted(saved)}"
    declared = set()
    for cls in classes:
        declared |= {k for k in getattr(pymc_dp, cls).stats_dtypes_shapes if k.startswith("dp_")}
    assert declared == names | ADDED_SINCE_E434ABE | ADDED_ISSUE_20 | ADDED_ISSUE_29, (
        f"{classes} declare {sorted(declared)}: a saved stat name was renamed or dropped, or a "
        "new one is not listed in ADDED_SINCE_E434ABE, ADDED_ISSUE_20 or ADDED_ISSUE_29"
    )


@pytest.mark.parametrize("name", sorted(STORED))
def test_report_of_stored_result_is_unchanged(name):
    idata = _load(name)
    attrs = _stored_attrs(idata)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rep = pymc_dp.privacy_report(idata, attach=False)
    assert np.isfinite(attrs["dp_epsilon"]) and attrs["dp_epsilon"] > 0
    assert rep.epsilon == pytest.approx(float(attrs["dp_epsilon"]), rel=1e-9, abs=0)
    assert rep.delta == pytest.approx(float(attrs["dp_delta"]), rel=1e-12)
    assert rep.mu == pytest.approx(float(attrs["dp_mu"]), rel=1e-12, abs=1e-300)
    assert rep.releases == int(attrs["dp_releases"])
    assert rep.iterations == int(attrs["dp_iterations"])
    assert rep.tuning_iterations == int(attrs["dp_tuning_iterations"])
    assert rep.draws == int(attrs["dp_draws"])
    assert rep.chains == int(attrs["dp_chains"])
    assert int(rep.nonprivate_diagnostics) == int(attrs["dp_nonprivate_diagnostics"]) == 0
