"""The privacy report and pymc_dp.sample: counts, composition, attributes, refusals."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest
from conftest import normal_mean_model, penalty_sample

import pymc_dp
from pymc_dp.accounting import gaussian_epsilon

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


def _groups(idata):
    g = idata.groups() if callable(getattr(idata, "groups", None)) else idata.children
    return {x.strip("/") for x in g}


@pytest.mark.parametrize("discard", [True, False])
def test_report_counts_every_chain_and_warmup(discard):
    model, *_ = normal_mean_model(n=20, d=1)
    z = 3.0
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=z)
        idata = pm.sample(
            25,
            tune=15,
            chains=3,
            cores=1,
            step=step,
            random_seed=1,
            discard_tuned_samples=discard,
            **SAMPLE,
        )
    rep = pymc_dp.privacy_report(idata, delta=1e-6)
    k = 3 * (25 + 15)
    assert rep.iterations == k and rep.chains == 3
    assert rep.tuning_iterations == 15 and rep.draws == 25
    assert rep.releases == k
    assert rep.mu == pytest.approx(k / (2 * z**2))
    assert rep.epsilon == pytest.approx(gaussian_epsilon(k / (2 * z**2), 1e-6))
    assert idata.attrs["dp_epsilon"] == rep.epsilon
    assert idata["posterior"].attrs["dp_iterations"] == k


def test_report_of_a_pm_sample_result_says_whether_the_chains_converged():
    """``pm.sample(step=pymc_dp....)`` writes no convergence attribute; the report computes
    it from the draws (post-processing) and says NOT CONVERGED first where the chains
    disagree (before: no convergence line, R-hat 2.98 on the sixth sweep)."""
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=3.0)
        idata = pm.sample(200, tune=0, chains=2, cores=1, step=step, random_seed=1, **SAMPLE)
    name = next(iter(idata["posterior"].data_vars))
    sd = float(idata["posterior"][name].std())
    rep = pymc_dp.privacy_report(idata, delta=1e-6)
    assert rep.convergence and "R-hat" in rep.convergence
    # chain 0 moved 50 posterior sds away: the chains disagree
    shifted = idata["posterior"][name].values.copy()
    shifted[0] += 50.0 * sd
    idata["posterior"][name] = (idata["posterior"][name].dims, shifted)
    rep = pymc_dp.privacy_report(idata, delta=1e-6)
    assert rep.convergence.startswith("NOT CONVERGED") and "R-hat" in rep.convergence
    # (after the lines that the result holds the observed data, which pm.sample keeps)
    head = [line.strip() for line in str(rep).splitlines()[:3]]
    assert head[0].startswith("NOT DIFFERENTIALLY PRIVATE") and head[2].startswith("NOT CONVERGED")


@pytest.mark.parametrize(
    "line",
    [
        "NOT USABLE (the chain gave way)",
        "IN DOUBT (the one-shot approximation's released curvature had off-diagonal entries "
        "below their noise threshold set to 0)",
    ],
)
def test_report_puts_an_unusable_or_doubtful_result_first(line):
    """``pymc_dp.sample`` writes ``NOT USABLE`` (the one-shot fallback) and ``IN DOUBT``
    (the zeroed curvature entries, `pymc_dp.auto.oneshot.zeroed_damping`) convergence lines;
    the report's first line repeats them as it does NOT CONVERGED (before: only NOT
    CONVERGED came first, the others sat below the guarantee)."""
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=1.0, delta=1e-5, step_kwargs={"clip_bound": 3.0},
            draws=20, tune=10, chains=1, cores=1, random_seed=2, **SAMPLE,
        )  # fmt: skip
    idata.attrs["dp_convergence"] = line
    head = str(pymc_dp.privacy_report(idata, delta=1e-5, model=model)).splitlines()
    assert head[0].strip().startswith(line.split(" (")[0]), head[:2]
    assert any(h.strip().startswith("(epsilon, delta) = (") for h in head[1:4]), head[:4]


def test_report_survives_netcdf_round_trip(tmp_path):
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=1.0,
            delta=1e-5,
            draws=20,
            tune=10,
            chains=2,
            step_kwargs={"clip_bound": 3.0},
            cores=1,
            random_seed=2,
            **SAMPLE,
        )
    path = tmp_path / "run.nc"
    idata.to_netcdf(str(path))
    try:
        import arviz as az

        back = az.from_netcdf(str(path))
    except Exception:  # PyMC 6 / arviz 1.x returns a DataTree
        import xarray as xr

        back = xr.open_datatree(str(path))
    attrs = dict(back["posterior"].attrs)
    assert attrs["dp_epsilon"] == pytest.approx(idata.attrs["dp_epsilon"])
    assert attrs["dp_epsilon"] <= 1.0
    assert attrs["dp_iterations"] == 60
    assert attrs["dp_delta"] == pytest.approx(idata.attrs["dp_delta"])
    rep = pymc_dp.privacy_report(back)
    assert rep.epsilon == pytest.approx(idata.attrs["dp_epsilon"])
    assert rep.iterations == 60 and rep.chains == 2


def test_netcdf_backend_is_a_runtime_dependency():
    """Saving a result works on a plain ``pip install pymc_dp`` on both lines: arviz 1.x
    (PyMC 6.x) and xarray declare no netCDF backend, and h5netcdf >= 1.8 declares h5py only
    as an extra, so both must be runtime dependencies, not test extras."""
    import pathlib
    import re
    import tomllib

    root = pathlib.Path(__file__).parents[1]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[\s\[<>=!~;]", d, maxsplit=1)[0].lower() for d in project["dependencies"]}
    assert {"h5netcdf", "h5py"} <= names, sorted(names)


def test_sample_calibrates_removes_data_and_meets_target():
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=0.5,
            delta=1e-5,
            draws=30,
            tune=20,
            chains=2,
            step_kwargs={"clip_bound": 3.0},
            cores=1,
            random_seed=3,
            **SAMPLE,
        )
    assert not _groups(idata) & {"observed_data", "constant_data", "log_likelihood"}
    rep = pymc_dp.privacy_report(idata)
    assert rep.epsilon <= 0.5 and rep.epsilon == pytest.approx(0.5, rel=1e-4)
    assert rep.delta == 1e-5 and rep.iterations == 100 and not rep.raw_data_groups


def test_sample_keep_data_warns_in_report():
    model, *_ = normal_mean_model(n=20, d=1)
    with model, pytest.warns(UserWarning, match="raw data"):
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=1.0,
            delta=1e-5,
            draws=10,
            tune=0,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
            keep_data=True,
            random_seed=3,
            **SAMPLE,
        )
    assert "observed_data" in _groups(idata)


def test_nonprivate_diagnostics_flagged():
    model, *_ = normal_mean_model(n=20, d=1)
    with model, pytest.warns(UserWarning, match="NOT"):
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0, noise_multiplier=2.0, nonprivate_diagnostics=True
        )
        idata = pm.sample(10, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
        rep = pymc_dp.privacy_report(idata, delta=1e-5)
    assert rep.nonprivate_diagnostics and idata.attrs["dp_nonprivate_diagnostics"] == 1


def test_report_refuses_non_dp_result():
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        idata = pm.sample(10, tune=0, chains=1, step=pm.Metropolis(), random_seed=1, **SAMPLE)
    with pytest.raises(ValueError, match="not sampled with a pymc_dp step"):
        pymc_dp.privacy_report(idata, delta=1e-5)


def test_report_on_a_multitrace_names_the_conversion():
    """return_inferencedata=False gives a MultiTrace whose stats hold the dp_* values: the
    report refuses it naming the conversion (it had said "not sampled with a pymc_dp
    step"), and the converted result counts every chain and warmup iteration."""
    model, *_ = normal_mean_model(n=20, d=1)
    z = 3.0
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=z)
        trace = pm.sample(
            25, tune=15, chains=2, cores=1, step=step, random_seed=1,
            return_inferencedata=False, **SAMPLE,
        )  # fmt: skip
    if callable(getattr(trace, "groups", None)) or hasattr(trace, "children"):
        pytest.skip("this PyMC returns a result object for return_inferencedata=False")
    with pytest.raises(TypeError, match=r"not a MultiTrace.*pm\.to_inference_data"):
        pymc_dp.privacy_report(trace, delta=1e-6)
    rep = pymc_dp.privacy_report(pm.to_inference_data(trace, model=model), delta=1e-6)
    assert rep.iterations == 2 * (25 + 15) and rep.tuning_iterations == 15
    assert rep.mu == pytest.approx(2 * (25 + 15) / (2 * z**2))
    with pytest.raises(TypeError, match="not a dict"):
        pymc_dp.privacy_report({"posterior": None}, delta=1e-6)


def test_report_on_a_predictive_result_says_it_is_not_a_dp_output():
    """pm.sample_posterior_predictive on a DP result returns draws at the records' data and
    observed_data: the report had said only "not sampled with a pymc_dp step"."""
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=5.0, noise_multiplier=3.0)
        idata = pm.sample(10, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
        pp = pm.sample_posterior_predictive(idata, random_seed=1, progressbar=False)
    with pytest.raises(ValueError, match="predictive result.*not a DP output.*raw data"):
        pymc_dp.privacy_report(pp, delta=1e-6)


def test_report_needs_delta_when_not_calibrated():
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
        idata = pm.sample(10, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
    with pytest.raises(ValueError, match="pass delta"):
        pymc_dp.privacy_report(idata)


# -- refusals of pymc_dp.sample ---------------------------------------------------------------


def test_sample_refuses_uncovered_free_variables(logistic_model):
    model, *_ = logistic_model
    with model:
        step = pymc_dp.DPPenaltyMetropolis([model["a"]], clip_bound=3.0, noise_multiplier=2.0)
        with pytest.raises(pymc_dp.ModelNotSupportedError, match=r"\['w'\].*non-private"):
            pymc_dp.sample(step=step, draws=5, tune=0, chains=1, delta=1e-5)


def test_sample_refuses_data_dependent_deterministic():
    x = np.linspace(-1, 1, 20)
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Deterministic("resid", x - t)
        pm.Deterministic("t2", t**2)
        pm.Normal("x", t, 1, observed=x)
    kw = dict(
        epsilon=1.0,
        delta=1e-5,
        draws=5,
        tune=0,
        chains=1,
        step_kwargs={"clip_bound": 3.0},
        random_seed=1,
        **SAMPLE,
    )
    with model:
        with pytest.raises(pymc_dp.ModelNotSupportedError, match="'resid' depends on the data"):
            pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, **kw)
        idata = pymc_dp.sample(step=pymc_dp.DPPenaltyMetropolis, var_names=["t", "t2"], **kw)
    assert "resid" not in idata["posterior"]


def test_sample_refuses_log_likelihood():
    model, *_ = normal_mean_model(n=20, d=1)
    with model, pytest.raises(pymc_dp.ModelNotSupportedError, match="log_likelihood"):
        penalty_sample(idata_kwargs={"log_likelihood": True})


def test_sample_refuses_non_dp_step():
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        with pytest.raises(pymc_dp.ModelNotSupportedError, match="not a pymc_dp step"):
            pymc_dp.sample(step=pm.Metropolis(), draws=5, tune=0, chains=1)


def test_sample_refuses_step_calibrated_for_smaller_run():
    model, *_ = normal_mean_model(n=20, d=1)
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=3.0, epsilon=1.0, delta=1e-5, draws=10, tune=0, chains=1
        )
        with pytest.raises(ValueError, match="calibrated for"):
            pymc_dp.sample(step=step, draws=10, tune=0, chains=2)


def _drop(idata, group):
    if callable(getattr(idata, "groups", None)):
        delattr(idata, group)
        idata._groups = [g for g in idata._groups if g != group]
    else:
        del idata[group]


@pytest.mark.parametrize("covariate", [True, False])
def test_posterior_predictive_at_the_records_covariates_is_not_private(covariate):
    """y_rep_i ~ p(y | theta, x_i) reads x_i without noise (averaged over draws: a + x_i b);
    without covariates the predictive draws are a function of the DP draws alone. Found on the
    issue-26 sweep: extend_inferencedata=True, observed_data removed, reported private."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, 30)
    y = 0.5 * x + rng.normal(0, 0.5, 30)
    with pm.Model():
        a = pm.Normal("a", 0, 1)
        mu = a + pm.Normal("b", 0, 1) * x if covariate else a
        pm.Normal("y", mu, 0.5, observed=y)
        idata = pymc_dp.sample(
            step=pymc_dp.DPPenaltyMetropolis,
            epsilon=1.0,
            delta=1e-5,
            draws=10,
            tune=0,
            chains=1,
            step_kwargs={"clip_bound": 3.0},
            random_seed=1,
            **SAMPLE,
        )
        assert pymc_dp.privacy_report(idata).private
        pm.sample_posterior_predictive(
            idata, extend_inferencedata=True, random_seed=1, progressbar=False
        )
        _drop(idata, "observed_data")
        if covariate:
            with pytest.warns(UserWarning, match="posterior_predictive"):
                rep = pymc_dp.privacy_report(idata)
            assert not rep.private and rep.epsilon == np.inf
            assert any(
                "posterior_predictive group holds draws of ['y']" in r
                for r in rep.not_private_reasons
            )
        else:
            rep = pymc_dp.privacy_report(idata)
            assert rep.private, rep.not_private_reasons
