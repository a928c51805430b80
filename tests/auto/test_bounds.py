"""Clip bounds derived from declared data bounds (issue 17): valid, free, recorded, refused."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest

import pymc_dp
from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto import auto_configure
from pymc_dp.auto.bounds import DerivedBounds, clip_plan
from pymc_dp.auto.intervals import interval_eval, interval_eval_split
from pymc_dp.records import build_record_functions

P = 2  # covariates


def _corner_data(p: int, ys: tuple, reps: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Every corner of [-1, 1]^p with every y in ``ys``: the adversarial records."""
    corners = np.array(list(itertools.product((-1.0, 1.0), repeat=p)))
    X = np.repeat(corners, len(ys), axis=0)
    y = np.tile(np.asarray(ys, dtype=float), len(corners))
    return np.tile(X, (reps, 1)), np.tile(y, reps)


def _glm(kind: str, X: np.ndarray, y: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        Xd = pm.Data("X", X)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=X.shape[1])
        eta = a + pt.dot(Xd, b)
        if kind == "logistic":
            pm.Bernoulli("y", logit_p=eta, observed=y.astype(np.int64))
        elif kind == "linear":
            pm.Normal("y", eta, pm.HalfNormal("sigma", 2), observed=y)
        elif kind == "studentt":
            pm.StudentT("y", nu=4, mu=eta, sigma=pm.HalfNormal("sigma", 2), observed=y)
    return model


BOUNDS = {
    "logistic": ({"X": (-1, 1), "y": (0, 1)}, (0.0, 1.0)),
    "linear": ({"X": (-1, 1), "y": (-3, 3)}, (-3.0, 0.0, 3.0)),
    "studentt": ({"X": (-1, 1), "y": (-3, 3)}, (-3.0, 0.0, 3.0)),
}


def _data_inside(kind: str, rng: np.random.Generator, n: int = 200):
    """Random interior records plus every corner record."""
    bounds, ys = BOUNDS[kind]
    Xc, yc = _corner_data(P, ys)
    Xr = rng.uniform(-1, 1, (n, P))
    lo, hi = bounds["y"]
    yr = rng.integers(0, 2, n).astype(float) if kind == "logistic" else rng.uniform(lo, hi, n)
    return np.vstack([Xc, Xr]), np.concatenate([yc, yr])


# -- interval arithmetic -------------------------------------------------------------------------
def test_interval_eval_encloses_every_value_of_a_graph():
    """Random points of the box: every value of a GLM-like graph lies in the enclosure."""
    x = pt.dvector("x")
    t = pt.dscalar("t")
    y = pt.dscalar("y")
    eta = t + pt.sum(x)
    out = pt.switch(pt.ge(y, 0.5), 1 - pt.sigmoid(eta), -pt.sigmoid(eta)) * x**2 / (1 + t**2)
    out = out + pt.exp(-pt.abs(eta)) - pt.softplus(eta) * pt.sqrt(y + 1)
    boxes = {x: (np.array([-1.0, -0.5]), np.array([1.0, 2.0])), t: (-0.3, 0.7), y: (0.0, 1.0)}
    (lo, hi), (slo, shi) = (
        interval_eval([out], boxes)[0],
        interval_eval_split([out], boxes, eta, 16)[0],
    )
    f = out.eval
    rng = np.random.default_rng(0)
    for _ in range(300):
        xv = rng.uniform(boxes[x][0], boxes[x][1])
        tv, yv = rng.uniform(-0.3, 0.7), float(rng.integers(0, 2))
        v = f({x: xv, t: tv, y: yv})
        assert np.all(v >= lo - 1e-12) and np.all(v <= hi + 1e-12)
        assert np.all(v >= slo - 1e-12) and np.all(v <= shi + 1e-12)
    # subdivision tightens: the split enclosure is inside the plain one
    assert np.all(slo >= lo - 1e-12) and np.all(shi <= hi + 1e-12)


# -- the derived bounds really bound ---------------------------------------------------------
@pytest.mark.parametrize("kind", ["logistic", "linear", "studentt"])
def test_derived_gradient_bound_bounds_every_record_inside_the_bounds(kind):
    """Corner records and random interior records, at random parameter points: no
    per-record gradient norm exceeds the derived bound; for the logistic GLM the bound is
    within 25 % of the largest corner norm (interval arithmetic is nearly exact there)."""
    rng = np.random.default_rng(1)
    X, y = _data_inside(kind, rng)
    model = _glm(kind, X, y)
    bounds = BOUNDS[kind][0]
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), bounds)
    assert derived.gradient_ok and derived.hessian_ok, derived.reason
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    for _ in range(5):
        q = rng.normal(0, 0.7, fns.ndim)
        norms = np.linalg.norm(fns.per_record_grad(q), axis=1)
        bound = derived.gradient_bound(q)
        assert norms.max() <= bound
        if kind == "logistic":
            assert bound <= 1.25 * norms.max()


@pytest.mark.parametrize("kind", ["logistic", "linear"])
def test_derived_residual_bound_bounds_every_pair_in_the_box(kind):
    """|l_i(q1) - l_i(q0) - g_i(a).(q1 - q0)| / |q1 - q0| <= the bound, for pairs in the box,
    corner and interior records."""
    rng = np.random.default_rng(2)
    X, y = _data_inside(kind, rng, n=100)
    model = _glm(kind, X, y)
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), BOUNDS[kind][0])
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    a = rng.normal(0, 0.5, fns.ndim)
    lo, hi = a - 0.2, a + 0.3
    bound = derived.residual_bound(lo, hi, a)
    g = fns.per_record_grad(a)
    worst = 0.0
    for _ in range(200):
        q0, q1 = rng.uniform(lo, hi), rng.uniform(lo, hi)
        r = fns.loglik_ratio(q1, q0) - g @ (q1 - q0)
        worst = max(worst, float(np.abs(r).max() / np.linalg.norm(q1 - q0)))
    assert 0 < worst <= bound
    with pytest.raises(ValueError, match="contain the anchor"):
        derived.residual_bound(lo, hi, hi + 1.0)


def test_undeclared_or_unnamed_data_fall_back_to_the_dp_histograms():
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (50, 2))
    y = rng.integers(0, 2, 50)
    with pm.Model() as model:  # X is a numpy constant: it has no name to declare bounds by
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Bernoulli("y", logit_p=pt.dot(X, b), observed=y)
    ip = model.initial_point()
    derived, sources = clip_plan(model, model.value_vars, ip, {"y": (0, 1)}, np.zeros(2))
    assert not derived.gradient_ok
    assert "unnamed array" in derived.reason and "pm.Data" in derived.reason
    assert all(v.startswith("DP histogram") for v in sources.values())
    # declared for y only, X a pm.Data container without bounds: its name is given
    model2 = _glm("logistic", X, y.astype(float))
    ip2 = model2.initial_point()
    derived2, _ = clip_plan(model2, model2.value_vars, ip2, {"y": (0, 1)}, np.zeros(3))
    assert not derived2.gradient_ok and "X" in derived2.reason


def test_the_hessian_is_not_formed_where_the_gradient_has_no_bound(monkeypatch):
    """Without a gradient enclosure there is no Hessian bound: the ``d`` symbolic gradients
    of the per-record Hessian (62 s of a 468 s call at d = 467, issue 26) are not formed, and
    ``hessian_ok``/``reason`` are those the Hessian formed would have given (the gradient's
    reason). Declared bounds: formed and checked, as before."""
    import pytensor

    calls = []
    grad = pytensor.grad

    def counting(*args, **kwargs):
        calls.append(1)
        return grad(*args, **kwargs)

    monkeypatch.setattr(pytensor, "grad", counting)
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (50, 3))
    y = rng.integers(0, 2, 50)
    with pm.Model() as model:  # X a numpy constant: no gradient bound
        b = pm.Normal("b", 0, 3, shape=3)
        pm.Bernoulli("y", logit_p=pt.dot(X, b), observed=y)
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), {"y": (0, 1)})
    assert not derived.gradient_ok and not derived.hessian_ok
    assert "unnamed array" in derived.reason and "Hessian" not in derived.reason
    assert len(calls) == 1  # the gradient only
    calls.clear()
    model2 = _glm("logistic", X, y.astype(float))
    bounds = {"y": (0, 1), "X": (-1.0, 1.0)}
    derived2 = DerivedBounds(model2, model2.value_vars, model2.initial_point(), bounds)
    assert derived2.gradient_ok and derived2.hessian_ok, derived2.reason
    assert len(calls) == 1 + derived2.ndim  # the gradient, then one per Hessian row


def test_a_hessian_pytensor_cannot_form_falls_back_to_the_dp_histograms():
    # A hurdle negative binomial's truncation goes through betainc, whose gradient is a
    # ScalarLoop without a gradient: the per-record Hessian cannot be formed. The automatic
    # mode with data_bounds crashed in clip_plan with PyTensor's MethodNotDefined (third
    # sweep, smoke's cigarettes a day); NUTS samples the model.
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, (40, 1))
    y = rng.integers(0, 5, 40)
    with pm.Model() as model:
        a = pm.Normal("a", 1, 1)
        b = pm.Normal("b", 0, 1, shape=1)
        alpha = pm.Gamma("alpha", 2, 1)  # betainc's gradient in alpha: a ScalarLoop
        pm.HurdleNegativeBinomial(
            "y", psi=0.6, mu=pm.math.exp(a + pt.dot(X, b)), alpha=alpha, observed=y
        )
    ip = model.initial_point()
    derived, sources = clip_plan(model, model.value_vars, ip, {"y": (0, 80)}, np.zeros(3))
    assert not derived.hessian_ok and derived.reason
    # the residual clip needs the Hessian: it comes from a DP histogram
    assert sources["penalty-test clip"].startswith("DP histogram")


# -- the budget ---------------------------------------------------------------------------------
def _phase_names(cfg) -> list[str]:
    return [p.name for p in cfg.phases]


@pytest.mark.parametrize("residual", [False, True])
def test_bounds_drop_the_histogram_phases_and_the_budget_is_still_spent(residual):
    rng = np.random.default_rng(4)
    X, y = _data_inside("logistic", rng, n=400)
    model = _glm("logistic", X, y)
    cfg = auto_configure(
        model, epsilon=3.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), max_iterations=400,
        data_bounds=BOUNDS["logistic"][0], derive_clips=True, derive_residual_clip=residual,
        method="chain",
    )  # fmt: skip
    names = _phase_names(cfg)
    assert "warm start: noisy gradient-norm histograms" not in names
    assert ("clip selection: noisy ratio-residual histogram" in names) is not residual
    events = [GaussianEvent(p.noise_multiplier, p.releases) for p in cfg.phases]
    assert compose_epsilon(events, 1e-5) == pytest.approx(3.0, rel=1e-6)
    assert cfg.clip_sources["warm-start gradient clip"] == "data_bounds"
    assert cfg.clip_sources["control-variate clip"] == "data_bounds"
    assert cfg.clip_sources["penalty-test clip"].startswith(
        "data_bounds" if residual else "DP histogram"
    )
    attrs = cfg.to_attrs()
    assert "warm-start gradient clip from data_bounds" in attrs["dp_auto_clip_sources"]
    assert "clip bounds: " in attrs["dp_phases"]
    # the warm-start clip bounds are the derived bounds at the released iterates: data-free
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), BOUNDS["logistic"][0])
    q0 = np.zeros(3)
    assert cfg.clip_bounds[0] == pytest.approx(derived.gradient_bound(q0), rel=1e-12)


def test_by_default_the_bounds_are_checked_and_the_histograms_kept():
    rng = np.random.default_rng(8)
    X, y = _data_inside("logistic", rng, n=300)
    model = _glm("logistic", X, y)
    cfg = auto_configure(
        model, epsilon=3.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), max_iterations=400, data_bounds=BOUNDS["logistic"][0],
    )  # fmt: skip
    assert "warm start: noisy gradient-norm histograms" in _phase_names(cfg)
    assert set(cfg.clip_sources.values()) == {
        "DP histogram (derive_clips=False)",
    }


@pytest.mark.slow
def test_data_outside_the_declared_bounds_are_clipped_and_the_run_stays_private():
    """Declared bounds the data break (|x| up to 3, declared 1): the clip bound at the start
    is the same as for data inside (it never looks at the data), records outside are
    clipped, and the run reports exactly its target."""
    rng = np.random.default_rng(5)
    n = 1500
    X = rng.uniform(-3, 3, (n, P))
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(X @ [1.0, -1.0])))).astype(float)
    model = _glm("logistic", X, y)
    bounds = BOUNDS["logistic"][0]
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), bounds)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q0 = np.zeros(3)
    b0 = derived.gradient_bound(q0)
    assert b0 == pytest.approx(np.sqrt(1 + P) * 0.5, rel=1e-5)  # |y - 1/2| ||(1, x)||
    assert fns.clipped_grad_sum(q0, b0)[1] > 0  # records outside are clipped
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pymc_dp.sample(
            epsilon=2.0, delta=1e-5, chains=2, data_bounds=bounds, random_seed=3,
            progressbar=False, compute_convergence_checks=False,
            auto_kwargs={"max_iterations": 400, "derive_clips": True},
        )  # fmt: skip
    rep = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert rep.private and rep.epsilon == pytest.approx(2.0, rel=1e-6) and rep.epsilon <= 2.0
    assert "warm-start gradient clip from data_bounds" in idata.attrs["dp_auto_clip_sources"]
    assert "noisy gradient-norm histograms" not in idata.attrs["dp_phases"]


# -- refusals -------------------------------------------------------------------------------
def test_unusable_bounds_are_refused_before_any_data_is_read(monkeypatch):
    import pymc_dp.records.store as store

    def no_read(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("data read")

    rng = np.random.default_rng(6)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        obs = pm.Data("obs", rng.lognormal(0, 1, 100))  # named: its log is not folded
        pm.LogNormal("y", mu, 1.0, observed=obs)
    monkeypatch.setattr(store.InMemoryRecords, "chunks", no_read)
    monkeypatch.setattr(store.InMemoryRecords, "all_finite", no_read)
    with model:
        # log(0): no finite gradient bound at the initial point
        with pytest.raises(ValueError, match="outside the support of the likelihood"):
            pymc_dp.sample(epsilon=1.0, delta=1e-5, data_bounds={"y": (0.0, 5.0)})
    X = rng.uniform(-1, 1, (30, 1))
    yb = rng.integers(0, 2, 30).astype(float)
    model2 = _glm("logistic", X, yb)
    with model2:
        with pytest.raises(ValueError, match="contain no integer"):
            pymc_dp.sample(epsilon=1.0, delta=1e-5, data_bounds={"X": (-1, 1), "y": (0.2, 0.8)})


def test_plan_lists_the_clip_sources_and_drops_the_histogram_phase(monkeypatch, capsys):
    import pymc_dp.records.store as store

    def no_read(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("data read")

    rng = np.random.default_rng(7)
    X, y = _data_inside("logistic", rng, n=100)
    model = _glm("logistic", X, y)
    monkeypatch.setattr(store.InMemoryRecords, "chunks", no_read)
    with model:
        with_bounds = pymc_dp.plan(
            epsilon=3.0, delta=1e-5, data_bounds=BOUNDS["logistic"][0], derive_clips=True
        )
        off = pymc_dp.plan(
            epsilon=3.0, delta=1e-5, data_bounds=BOUNDS["logistic"][0], verbose=False
        )
        without = pymc_dp.plan(epsilon=3.0, delta=1e-5, verbose=False)
    printed = capsys.readouterr().out
    assert "warm-start gradient clip: from data_bounds" in printed
    names = [p.name for p in with_bounds.phases]
    assert "warm start: noisy gradient-norm histograms" not in names
    assert "warm start: noisy gradient-norm histograms" in [p.name for p in without.phases]
    assert with_bounds._sampling_share() > without._sampling_share()
    # the default: bounds checked, clips from the DP histograms (derive_clips=False)
    assert [p.name for p in off.phases] == [p.name for p in without.phases]
    assert off.clip_sources["warm-start gradient clip"] == "DP histogram (derive_clips=False)"
