"""Step classes given to ``pymc_dp.sample`` without their hyperparameters (issue 27, item 2).

Configured by the automatic mode's private phases (`pymc_dp.auto.steps`), charged in the
report with the step on the budget left, or refused before any data is read.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp
import pymc_dp.records.store as store
from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto.configure import SAMPLING_PHASE, STEP_CLIP_PHASE, PresampleSpend
from pymc_dp.auto.steps import configure_step_class, wants_configuration

SAMPLE = dict(progressbar=False, compute_convergence_checks=False, cores=1)
SENTINEL = 7.123456789


def _model(sentinel: bool = False, n: int = 400):
    x = np.random.default_rng(0).normal(0.5, 1.0, n)
    if sentinel:
        x[17] = SENTINEL
    with pm.Model() as model:
        t = pm.Normal("t", 0, 3)
        pm.Normal("x", t, 1, observed=x)
    return model, x


def _no_read(*a, **k):  # pragma: no cover - must not be reached
    raise AssertionError("data read")


@pytest.mark.parametrize("cls", [pymc_dp.DPHMC, pymc_dp.DPPenaltyMetropolis])
def test_configured_class_runs_and_the_report_composes_every_phase_within_target(cls):
    """Nothing but the budget: the private phases and the chains together meet the target
    (the step's noise is fitted to the budget they leave), and the report counts them."""
    model, _ = _model()
    with model:
        idata = pymc_dp.sample(
            step=cls, epsilon=3.0, delta=1e-5, draws=40, chains=2, random_seed=1, **SAMPLE
        )
    rep = pymc_dp.privacy_report(idata, model=model)
    assert rep.private
    assert rep.epsilon <= 3.0
    # the budget is used: the composition is the target up to the fitting's margin
    assert rep.epsilon == pytest.approx(3.0, rel=1e-6)
    pre = idata.attrs["dp_presample_mu"]
    assert pre > 0 and "warm start" in idata.attrs["dp_phases"]
    # the report's mu is the pre-sampling phases' plus the chains'
    stats = idata["sample_stats"]
    chains_mu = float(stats["dp_mu"].sum())
    assert rep.mu == pytest.approx(pre + chains_mu, rel=1e-12)
    # and the whole run as one Gaussian mechanism at that mu is the report's epsilon
    assert compose_epsilon([GaussianEvent(np.sqrt(0.5 / rep.mu))], 1e-5) == pytest.approx(
        rep.epsilon, rel=1e-9
    )
    assert idata.attrs["dp_draws_run"] == 40 and cls.__name__ in idata.attrs["dp_method"]


def test_configured_dphmc_uses_the_private_warm_start():
    """Clip bounds from the DP quantile, mass matrix from the private Laplace covariance,
    starts from the approximation (the warm start's own accuracy is tested in tests/auto)."""
    model, x = _model(n=5000)
    with model:
        cfg = configure_step_class(
            pymc_dp.DPHMC, model, epsilon=10.0, delta=1e-5, draws=None, tune=None, chains=2,
            step_kwargs={}, rng=np.random.default_rng(0), spend=PresampleSpend(),
        )  # fmt: skip
    plan = cfg.plan
    # a conjugate normal's posterior variance 1 / (1/9 + n) (its release noise is small
    # against it at this n and epsilon: 5 % of it, over 10 iterations' averages)
    assert plan.laplace_cov[0, 0] == pytest.approx(1 / (1 / 9 + x.size), rel=0.2)
    kw = cfg.kwargs
    assert kw["mass_matrix"] == pytest.approx(1 / np.diag(plan.laplace_cov))
    assert kw["llr_clip_bound"] == kw["grad_clip_bound"] == plan.gradient_clip
    # |x_i - t| for x ~ N(0.5, 1): its 0.995 quantile is about 2.8; the grid's neighbours
    assert 1.0 < plan.gradient_clip < 10.0
    assert len(cfg.initvals) == 2 and cfg.tune == 0
    # no draws given: the run length the test's noise allows, at least MIN_DRAWS per chain
    assert cfg.draws >= 50 and cfg.kwargs["step_size"] == pytest.approx(2.0 / 3)
    names = [p.name for p in plan.phases]
    assert STEP_CLIP_PHASE in names and names[-1] == SAMPLING_PHASE


def test_explicit_step_kwargs_win():
    model, _ = _model()
    given = {"llr_clip_bound": 0.7, "n_leapfrog": 2, "step_size": 0.01, "adapt_mass_matrix": True}
    assert wants_configuration(pymc_dp.DPHMC, given)  # grad_clip_bound missing
    with model:
        cfg = configure_step_class(
            pymc_dp.DPHMC, model, epsilon=3.0, delta=1e-5, draws=20, tune=None, chains=2,
            step_kwargs=given, rng=np.random.default_rng(0), spend=PresampleSpend(),
        )  # fmt: skip
        for k, v in given.items():
            assert cfg.kwargs[k] == v
        idata = pymc_dp.sample(
            step=pymc_dp.DPHMC, epsilon=3.0, delta=1e-5, draws=20, chains=2, random_seed=1,
            step_kwargs=given, **SAMPLE,
        )  # fmt: skip
    assert np.all(idata["sample_stats"]["n_leapfrog"].values == 2)
    assert pymc_dp.privacy_report(idata, model=model).epsilon <= 3.0
    # every required hyperparameter given: configured by hand, as before (no phases)
    assert not wants_configuration(pymc_dp.DPHMC, {"llr_clip_bound": 1, "grad_clip_bound": 1})
    with model:
        with pytest.raises(TypeError, match=r"\['clip_bond'\]: DPHMC takes no such argument"):
            pymc_dp.sample(
                step=pymc_dp.DPHMC, epsilon=3.0, delta=1e-5, step_kwargs={"clip_bond": 1.0},
                **SAMPLE,
            )  # fmt: skip
        with pytest.raises(ValueError, match="pymc_dp.sample's own arguments"):
            pymc_dp.sample(
                step=pymc_dp.DPSGLD, epsilon=3.0, delta=1e-5, step_kwargs={"epsilon": 1.0},
                **SAMPLE,
            )  # fmt: skip
        with pytest.raises(ValueError, match="llr_noise_multiplier"):
            pymc_dp.sample(
                step=pymc_dp.DPHMC, epsilon=3.0, delta=1e-5,
                step_kwargs={"llr_noise_multiplier": 2.0}, **SAMPLE,
            )  # fmt: skip


@pytest.mark.parametrize(
    "cls, match",
    [
        (pymc_dp.DPFastMH, "random walk"),
        (pymc_dp.DPSubsampledPenalty, "random walk"),
        (pymc_dp.DPBarker, "tempered posterior"),
        (pymc_dp.DPExpFamilyPenalty, "configures itself privately only when asked"),
        (pymc_dp.DPHMC, "predicted to allow about"),
    ],
)
def test_unconfigurable_class_is_refused_before_any_data_read(cls, match, monkeypatch):
    model, _ = _model(n=2000)
    monkeypatch.setattr(store.InMemoryRecords, "chunks", _no_read)
    with model, pytest.raises(ValueError, match=match) as err:
        pymc_dp.sample(step=cls, epsilon=10.0, delta=1e-6, **SAMPLE)
    # the message names the step that suits
    assert "step=None" in str(err.value) and "DPPenaltyMetropolis" in str(err.value)


def test_configured_run_publishes_only_dp_outputs(caplog):
    """The warm start, the clip histogram and the chains publish nothing carrying the
    sentinel record (attrs, arrays, report, warnings, log records)."""
    model, _ = _model(sentinel=True, n=200)
    caplog.set_level(logging.DEBUG)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            step=pymc_dp.DPHMC, epsilon=2.0, delta=1e-5, draws=20, chains=2, random_seed=5,
            **SAMPLE,
        )  # fmt: skip
        report = pymc_dp.privacy_report(idata)
    text = "\n".join(
        [repr(idata), repr(dict(idata.attrs)), repr(dict(idata["posterior"].attrs)), str(report)]
        + [str(w.message) for w in caught]
        + [r.getMessage() for r in caplog.records]
    )
    for token in ("7.123456789", "7.12345", "7.1234"):
        assert token not in text
    for v in list(idata.attrs.values()) + [idata["posterior"]["t"].values]:
        a = np.asarray(v)
        if np.issubdtype(a.dtype, np.number):
            assert not np.any(np.isclose(a, SENTINEL, rtol=0, atol=1e-9))
    # arviz.InferenceData (PyMC 5) has groups(), xarray.DataTree (PyMC 6) children
    groups = idata.groups() if callable(getattr(idata, "groups", None)) else list(idata.children)
    for group in ("observed_data", "constant_data", "log_likelihood"):
        assert group not in {g.strip("/") for g in groups}


@pytest.mark.parametrize("cls", [pymc_dp.DPSGLD, pymc_dp.DPSGNHT])
def test_configured_sgmcmc_runs_within_target(cls):
    """DP-SGLD / DP-SGNHT (biased by design): configured, run, and the report's composition
    of the private phases (Gaussian) and the chains (Poisson-subsampled Gaussian, another
    accountant) at most the target."""
    model, _ = _model(n=400)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the diffusion noise may under-spend the budget
        idata = pymc_dp.sample(
            step=cls, epsilon=3.0, delta=1e-5, draws=30, chains=2, random_seed=1, **SAMPLE
        )
    rep = pymc_dp.privacy_report(idata, model=model)
    assert rep.private and rep.epsilon <= 3.0
    assert idata.attrs["dp_presample_mu"] > 0 and rep.mu >= idata.attrs["dp_presample_mu"]
    assert np.all(idata["sample_stats"]["dp_poisson_q"].values == 1.0)


def test_dphmc_prediction_lets_a_large_budget_run(monkeypatch):
    """The public prediction refuses DPHMC at epsilon 10 on 2000 records (above) and lets
    it run where the budget allows enough iterations, reading no data either way."""
    from pymc_dp.auto.steps import check_configurable

    model, _ = _model(n=2000)
    monkeypatch.setattr(store.InMemoryRecords, "chunks", _no_read)
    common = dict(model=model, delta=1e-6, chains=4)
    check_configurable(pymc_dp.DPHMC, {}, {}, epsilon=2000.0, **common)
    with pytest.raises(ValueError, match=r"needs about n >= \d+ at this epsilon"):
        check_configurable(pymc_dp.DPHMC, {}, {}, epsilon=10.0, **common)
    # with draws given the user chose the length: no refusal (a warning after the warm start)
    check_configurable(pymc_dp.DPHMC, {}, {}, epsilon=10.0, draws=100, **common)


def test_an_error_after_the_private_phases_carries_their_spend():
    """A step_kwargs value the constructor refuses (after the warm start ran): the error is
    charged for the pre-sampling releases (epsilon of their composition, under the target)."""
    model, _ = _model()
    with model, pytest.raises(ValueError, match="target_accept") as err:
        pymc_dp.sample(
            step=pymc_dp.DPHMC, epsilon=3.0, delta=1e-5, draws=20, chains=2,
            step_kwargs={"target_accept": 2.0}, **SAMPLE,
        )  # fmt: skip
    assert err.value.releases > 0 and 0 < err.value.epsilon < 3.0


def test_the_runs_data_bounds_reach_a_class_that_takes_them():
    """``pymc_dp.sample(step=DPExpFamilyPenalty, data_bounds=...)``: the class bounds its
    statistics from the run's declared bounds (before, it was refused: not configured, no
    covariate range); its own releases and the run stay within the target."""
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, 3000)
    y = np.clip(0.5 * x + rng.normal(0, 0.5, 3000), -3, 3)
    with pm.Model():
        xd = pm.Data("x", x)
        b = pm.Normal("b", 0, 3)
        s = pm.HalfNormal("s", 2)
        pm.Normal("y", b * xd, s, observed=y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                30, tune=0, chains=2, step=pymc_dp.DPExpFamilyPenalty, epsilon=10, delta=1e-6,
                data_bounds={"x": (-1, 1), "y": (-3, 3)}, random_seed=2, **SAMPLE,
            )  # fmt: skip
    assert idata.posterior["b"].shape == (2, 30)
    assert pymc_dp.privacy_report(idata).epsilon <= 10.0
