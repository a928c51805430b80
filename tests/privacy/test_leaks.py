"""Leak guards: nothing published contains a data value that was not privatized."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pymc as pm
import pytest
from pymc.blocking import DictToArrayBijection

import pymc_dp

SENTINEL = 7.123456789
SAMPLE = dict(progressbar=False, compute_convergence_checks=False)

#: Settings of a small run for every step class; a new DPStep subclass is discovered below and
#: fails the leak test until it has an entry here. Optional "epsilon": the run's target.
SETTINGS = {
    "DPPenaltyMetropolis": {"clip_bound": 3.0},
    "DPHMC": {"grad_clip_bound": 3.0, "llr_clip_bound": 3.0, "n_leapfrog": 3, "step_size": 0.05},
    "DPFastMH": {"clip_bound": 3.0},
    "DPSubsampledPenalty": {"batch_size": 10, "clip_bound": 3.0},
    "DPBarker": {"tempering": 0.05, "epsilon": 60.0},  # n = 40: no smaller target is feasible
    "DPSGLD": {"clip_bound": 3.0, "step_size": 1e-3, "batch_size": 10},
    "DPSGNHT": {"clip_bound": 3.0, "step_size": 1e-3, "batch_size": 10, "diffusion": 2.0},
    "DPExpFamilyPenalty": {"data_bounds": {"x": (-8.0, 8.0)}},
}


def _step_classes(cls=pymc_dp.DPStep) -> dict[str, type]:
    """Every concrete DPStep subclass, found recursively (private bases skipped)."""
    out = {}
    for sub in cls.__subclasses__():
        # (DPLaplaceDraws and its DPPosteriorDraws are built by the automatic mode only:
        # leak-tested with it below)
        if sub.__name__ in ("DPLaplaceDraws", "DPPosteriorDraws"):
            continue
        if not sub.__name__.startswith("_"):
            out[sub.__name__] = sub
        out.update(_step_classes(sub))
    return out


STEPS = {name: (cls, SETTINGS.get(name)) for name, cls in _step_classes().items()}


def test_every_step_class_is_leak_tested():
    assert len(STEPS) >= 7, sorted(STEPS)
    missing = sorted(name for name, (_, kw) in STEPS.items() if kw is None)
    assert not missing, f"add leak-test settings for {missing} to SETTINGS"


def _sentinel_model():
    x = np.linspace(-1, 1, 40)
    x[17] = SENTINEL
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return model


def _strings(obj) -> list[str]:
    """Every string and number reachable from a result: repr of groups, attrs and values."""
    out = [repr(obj)]
    groups = obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)
    out.append(repr(dict(obj.attrs)))
    for g in groups:
        ds = obj[g.strip("/")]
        ds = ds.to_dataset() if hasattr(ds, "to_dataset") else ds
        out.append(repr(dict(ds.attrs)))
        for name in ds.variables:
            out.append(repr(dict(ds[name].attrs)))
    return out


def _arrays(obj) -> list[np.ndarray]:
    groups = obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)
    arrays = []
    for g in groups:
        ds = obj[g.strip("/")]
        ds = ds.to_dataset() if hasattr(ds, "to_dataset") else ds
        arrays += [np.asarray(ds[name].values) for name in ds.variables]
    return arrays


@pytest.mark.parametrize("name", sorted(STEPS))
def test_no_sentinel_in_anything_published(name, caplog):
    cls, kwargs = STEPS[name]
    assert kwargs is not None, f"add leak-test settings for {name} to SETTINGS"
    kwargs = dict(kwargs)
    epsilon = kwargs.pop("epsilon", 2.0)
    model = _sentinel_model()
    caplog.set_level(logging.DEBUG)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            step=cls,
            epsilon=epsilon,
            delta=1e-5,
            draws=30,
            tune=10,
            chains=2,
            step_kwargs=kwargs,
            cores=1,
            random_seed=5,
            **SAMPLE,
        )
        report = pymc_dp.privacy_report(idata)
        # an error after sampling (budget exhausted) must not carry data either
        step = cls(epsilon=epsilon, delta=1e-5, draws=2, tune=0, chains=1, **kwargs)
        with pytest.raises(pymc_dp.BudgetExceededError) as err:
            pm.sample(3, tune=0, chains=1, step=step, random_seed=1, **SAMPLE)
    published = _strings(idata) + [str(report), str(err.value)]
    published += [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    text = "\n".join(published)
    for token in ("7.123456789", "7.12345", "7.1234"):
        assert token not in text, f"sentinel {token} published by {name}"
    for a in _arrays(idata):
        if np.issubdtype(a.dtype, np.number):
            assert not np.any(np.isclose(a, SENTINEL, rtol=0, atol=1e-9)), name
    for group in ("observed_data", "constant_data", "log_likelihood"):
        assert group not in {g.strip("/") for g in _group_names(idata)}


def _group_names(obj):
    return obj.groups() if callable(getattr(obj, "groups", None)) else list(obj.children)


def test_step_warns_about_uncovered_free_variables(logistic_model):
    model, *_ = logistic_model
    with model, pytest.warns(UserWarning, match=r"\['w'\] must be sampled by pymc_dp steps"):
        pymc_dp.DPPenaltyMetropolis([model["a"]], clip_bound=3.0, noise_multiplier=2.0)


def test_step_warns_about_data_dependent_deterministic():
    x = np.linspace(-1, 1, 20)
    with pm.Model() as model:
        t = pm.Normal("t", 0, 1)
        pm.Deterministic("resid", x - t)
        pm.Normal("x", t, 1, observed=x)
    with model, pytest.warns(UserWarning, match=r"Deterministics \['resid'\] depend on the data"):
        pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)


def test_astep_blanks_every_nonprivate_stat():
    """DPStep.astep is the one place *_NONPRIVATE stats are blanked (whatever the step)."""
    with _sentinel_model() as model:
        quiet = pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
        with pytest.warns(UserWarning, match="NOT differentially private"):
            loud = pymc_dp.DPPenaltyMetropolis(
                clip_bound=3.0, noise_multiplier=2.0, nonprivate_diagnostics=True
            )
    for step in (quiet, loud):
        inner = step._dp_astep

        def with_extra(q0, inner=inner):
            q, stats = inner(q0)
            stats["new_stat_NONPRIVATE"] = SENTINEL
            return q, stats

        step._dp_astep = with_extra
        try:  # PyMC 6.x starts a chain with setup_chain, PyMC 5.x with set_rng
            step.setup_chain(np.random.default_rng(0), 0, 1)
        except AttributeError:
            step.set_rng(np.random.default_rng(0))
        start = model.initial_point()
        q0 = DictToArrayBijection.map({v.name: start[v.name] for v in step.vars})
        _, (stats,) = step.astep(q0)
        nonprivate = {k: v for k, v in stats.items() if k.endswith("_NONPRIVATE")}
        assert set(nonprivate) == {"clip_fraction_NONPRIVATE", "new_stat_NONPRIVATE"}
        if step is quiet:
            assert all(np.isnan(v) for v in nonprivate.values())
        else:
            assert stats["new_stat_NONPRIVATE"] == SENTINEL


@pytest.mark.parametrize("method", ["chain", "laplace"])
def test_no_sentinel_published_by_the_automatic_mode(method, caplog):
    """``pymc_dp.sample(step=None)``: the warm start, the clip selection, the control variate
    and the chains (or the one-shot strategy's releases and draws) publish nothing that
    carries the sentinel record (attrs, arrays, report, warnings, log records)."""
    model = _sentinel_model()
    caplog.set_level(logging.DEBUG)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            epsilon=2.0, delta=1e-5, chains=2, cores=1, random_seed=5,
            auto_kwargs={"max_iterations": 400, "method": method}, **SAMPLE,
        )  # fmt: skip
        report = pymc_dp.privacy_report(idata)
    assert idata.attrs["dp_method"] == method
    assert "warm start" in idata.attrs["dp_phases"]
    _assert_no_sentinel(idata, report, caught, caplog)


def _assert_no_sentinel(idata, report, caught, caplog) -> None:
    """Nothing the automatic mode published carries the sentinel record: attrs, arrays,
    report, warnings, log records; no raw-data group."""
    published = _strings(idata) + [str(report)]
    published += [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    text = "\n".join(published)
    for token in ("7.123456789", "7.12345", "7.1234"):
        assert token not in text, f"sentinel {token} published by the automatic mode"
    for a in _arrays(idata) + [np.asarray(v) for v in idata.attrs.values()]:
        if np.issubdtype(np.asarray(a).dtype, np.number):
            assert not np.any(np.isclose(a, SENTINEL, rtol=0, atol=1e-9))
    for group in ("observed_data", "constant_data", "log_likelihood"):
        assert group not in {g.strip("/") for g in _group_names(idata)}


def test_no_sentinel_published_by_the_group_statistics_strategy(caplog):
    """``auto_kwargs={"method": "groupstats"}`` (its releases, the noise-aware NUTS run and the
    resampled draws of `DPPosteriorDraws`): the sentinel record, inside the declared box,
    appears nowhere in the result."""
    x = np.linspace(-1, 1, 40)
    x[17] = SENTINEL
    g = np.arange(40) % 4
    caplog.set_level(logging.DEBUG)
    with pm.Model(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        z = pm.Normal("z", 0, 1, shape=4)
        loc = pm.Normal("mu", 0, 3) + pm.HalfNormal("tau", 1) * z[g]
        pm.Normal("x", loc, pm.HalfNormal("sigma", 2), observed=x)
        idata = pymc_dp.sample(
            epsilon=2.0, delta=1e-5, chains=2, cores=1, random_seed=5,
            data_bounds={"x": (-10.0, 10.0)}, auto_kwargs={"method": "groupstats"}, **SAMPLE,
        )  # fmt: skip
        report = pymc_dp.privacy_report(idata)
    assert idata.attrs["dp_method"] == "groupstats"
    _assert_no_sentinel(idata, report, caught, caplog)
