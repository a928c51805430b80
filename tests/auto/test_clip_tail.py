"""The one-shot strategy's clipped tail and its prior-wide coordinates (issue 26, problem
"never confidently wrong"): `pymc_dp.auto.oneshot.clip_tail`, `centre_prior_wide`, and an
end-to-end run on records whose per-record scores have a heavy tail."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.optimize

from pymc_dp.auto.oneshot import (
    ONESHOT_TAIL_LEVELS,
    PRIOR_WIDE_SDS,
    TAIL_POINTS,
    centre_prior_wide,
    clip_tail,
    prior_cap,
    tail_excess_grid,
)


def _excess(norms: np.ndarray, bound: float) -> np.ndarray:
    """The exact query of the excess release on per-record norms (`tail_excess_grid`)."""
    grid = tail_excess_grid(bound)
    counts = (norms[:, None] > grid[None, :]).sum(axis=0)
    return counts.reshape(ONESHOT_TAIL_LEVELS, TAIL_POINTS).mean(axis=1)


def test_excess_levels_are_the_clipped_excess_per_level():
    """``L_j X_j`` is the records' excess beyond ``L_j``, each capped at ``L_j`` (midpoint rule:
    to ``L_j / TAIL_POINTS`` a record), and ``sum_j L_j X_j`` the whole excess below
    ``2 L_{J-1}``; each record's share of a level is in [0, 1] (the release's sensitivity)."""
    rng = np.random.default_rng(0)
    b = 0.3
    norms = np.abs(rng.standard_cauchy(5000)) * 0.05
    x = _excess(norms, b)
    levels = b * 2.0 ** np.arange(ONESHOT_TAIL_LEVELS)
    exact = [np.sum(np.minimum(np.maximum(norms - lv, 0.0), lv)) / lv for lv in levels]
    np.testing.assert_allclose(x, exact, atol=np.sum(norms > b) / TAIL_POINTS)
    top = 2.0 * levels[-1]
    whole = np.sum(np.minimum(norms, top) - np.minimum(norms, b))
    assert np.sum(levels * x) == pytest.approx(whole, abs=np.sum(norms > b) * top / TAIL_POINTS)
    for one in (np.array([1e9]), np.array([1.5 * b]), np.array([0.0])):
        assert np.all((_excess(one, b) >= 0.0) & (_excess(one, b) <= 1.0))


def test_no_tail_keeps_the_bound_and_adds_no_bias():
    """Excess within its noise (no level beyond `ONESHOT_TAIL_SDS` sds): the bound stays,
    no bias is added, whatever the noise draws (seeded, 2000 draws at 1.5 noise sds)."""
    rng = np.random.default_rng(1)
    for _ in range(2000):
        noisy = rng.normal(size=ONESHOT_TAIL_LEVELS) * 1.5
        noisy = np.minimum(noisy, 2.4)
        t = clip_tail(0.2, noisy, 1.0, 2.5)
        assert t.bound == 0.2 and t.bias == 0.0 and not t.detected


def test_a_released_tail_moves_the_bound_and_bounds_the_bias_left():
    """Records with a heavy tail of per-record norms (1 % of 5 000 at 3-40 times the bound:
    the charity Tobit's shape), the excess released with noise: where the tail is detected
    the bound moves up, and the bias bound ``R`` at the chosen bound covers the records'
    true excess beyond it (the clipped sum's bias is at most that) in at least 97.5 % of
    400 seeded releases (the allowance is one noise sd a level, the beyond-top guess as
    much again: a miss needs the noise low on every level)."""
    rng = np.random.default_rng(2)
    b, z, std = 0.2, 2.8, 8.5
    norms = np.abs(rng.normal(size=5000)) * 0.04
    norms[:50] = b * rng.uniform(3.0, 40.0, 50) ** 0.6
    exact = _excess(norms, b)
    covered = detected = 0
    for _ in range(400):
        t = clip_tail(b, exact + rng.normal(size=exact.size) * std, std, z)
        if not t.detected:
            continue
        detected += 1
        assert t.bound > b
        truth = float(np.sum(np.maximum(norms - t.bound, 0.0)))
        covered += t.bias >= truth
    assert detected >= 380  # the tail is 4+ noise sds at the first level
    assert covered >= 0.975 * detected, (covered, detected)


def test_prior_wide_coordinates_hold_the_prior_interval():
    """`centre_prior_wide` on random prior-wide results: every re-centred interval
    ``mean +- 2 sd`` holds both the prior's ``m0 +- 2 k sqrt(v0)`` (``k`` =
    `PRIOR_WIDE_SDS`) and the capped result's, is
    never narrower than either, and the covariance stays positive semi-definite; the
    measured negative-binomial case (prior N(0, 1), result 0.24, posterior -1.90) is covered
    within 2 sds, which the capped result alone missed (2.08 sds)."""
    rng = np.random.default_rng(3)
    d = 5
    for _ in range(300):
        m0, v0 = rng.normal(size=d), rng.uniform(0.3, 4.0, size=d)
        mean = m0 + rng.normal(size=d) * 3.0 * np.sqrt(v0)
        a = rng.normal(size=(d, d)) * 10.0 ** rng.uniform(0, 4, size=d)[:, None]
        cap = prior_cap(mean, a @ a.T + 1e-6 * np.eye(d), m0, v0)
        new_mean, new_cov = centre_prior_wide(cap.mean, cap.cov, m0, v0, cap.capped)
        s1, s = np.sqrt(np.diag(cap.cov)), np.sqrt(np.diag(new_cov))
        w = cap.capped
        tol = 1e-9 * (1 + np.abs(new_mean))
        s0 = PRIOR_WIDE_SDS * np.sqrt(v0)
        assert np.all(new_mean[w] - 2 * s[w] <= (m0 - 2 * s0)[w] + tol[w])
        assert np.all(new_mean[w] + 2 * s[w] >= (m0 + 2 * s0)[w] - tol[w])
        assert np.all(new_mean[w] - 2 * s[w] <= (cap.mean - 2 * s1)[w] + tol[w])
        assert np.all(new_mean[w] + 2 * s[w] >= (cap.mean + 2 * s1)[w] - tol[w])
        np.testing.assert_array_equal(new_mean[~w], cap.mean[~w])
        np.testing.assert_allclose(s[~w], s1[~w])
        assert np.linalg.eigvalsh(new_cov).min() >= -1e-9 * np.abs(new_cov).max()
    cap = prior_cap(np.array([0.2391]), np.array([[4.0]]), np.zeros(1), np.ones(1))
    assert abs(cap.mean[0] + 1.9004) / np.sqrt(cap.cov[0, 0]) > 2.0  # the failure
    mean, cov = centre_prior_wide(cap.mean, cap.cov, np.zeros(1), np.ones(1), cap.capped)
    assert abs(mean[0] + 1.9004) / np.sqrt(cov[0, 0]) < 2.0
    # the Tobit's slope at epsilon 1: prior N(0, 2), capped result 0.72 (sd 2.35), posterior
    # 6.53 (3.3 prior sds out)
    mean, cov = centre_prior_wide(np.array([0.7249]), np.array([[2.35**2]]), 0, 4.0, [True])
    assert abs(mean[0] - 6.5327) / np.sqrt(cov[0, 0]) < 2.0


def _poisson_outliers(n: int = 5000):
    """A Poisson regression whose counts have 1 % outliers (20-60 added): the per-record
    scores ``(y - mu) x`` have a heavy tail that the clip histogram cannot see at epsilon 3."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    y = rng.poisson(np.exp(0.5 + 0.3 * x))
    y[: n // 100] += rng.integers(20, 60, n // 100)
    return x, y


@pytest.mark.slow
def test_heavy_tailed_scores_give_an_honest_one_shot_result():
    """End to end (`pymc_dp.sample`, method 'laplace', epsilon 3, DP seeds 0 and 1) on
    `_poisson_outliers`: the exact posterior's mean (its mode, by scipy: with 5 000 records
    the two agree to a small share of a posterior sd) lies within 2 of the result's sds in
    both coordinates. Before the tail's release the seed-0 run came out 12 of its own sds
    off in the intercept, no warning (the clipped outliers' pull). Where the clipped
    gradients' possible bias exceeds a posterior sd, the run says so
    (`NoiseDominatedWarning`, attribute ``dp_oneshot_clip_bias``)."""
    import pymc as pm

    import pymc_dp

    x, y = _poisson_outliers()

    def neg(theta):
        eta = theta[0] + theta[1] * x
        return -(np.sum(y * eta - np.exp(eta)) - 0.5 * np.sum(theta**2) / 4.0)

    mode = scipy.optimize.minimize(neg, np.zeros(2), method="BFGS").x
    for seed in (0, 1):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with pm.Model():
                a = pm.Normal("a", 0, 2)
                b = pm.Normal("b", 0, 2)
                pm.Poisson("y", pm.math.exp(a + b * x), observed=y)
                idata = pymc_dp.sample(
                    epsilon=3.0, delta=1e-6, random_seed=seed, chains=2, progressbar=False,
                    auto_kwargs={"method": "laplace"},
                )  # fmt: skip
        for j, v in enumerate(("a", "b")):
            draws = idata.posterior[v].values.ravel()
            assert abs(draws.mean() - mode[j]) < 2.0 * draws.std(), (seed, v, draws.mean())
        bias = float(idata.attrs["dp_oneshot_clip_bias"])
        assert bias > 0.0 and idata.attrs["dp_oneshot_clip_scale"] > 1.0
        said = [
            x for x in w if issubclass(x.category, pymc_dp.NoiseDominatedWarning)
            and "tail beyond the clip bound" in str(x.message)
        ]  # fmt: skip
        assert bool(said) == (bias > 1.0)


def test_declared_bounds_clip_no_record_inside_them_at_either_release(monkeypatch):
    """With ``derive_clips`` the one-shot releases are clipped at the declared bounds'
    gradient bound: each at the bound of its own point, so that no record inside the
    bounds is clipped (exact whitened per-record gradients of a normal model, computed in
    closed form: ``((y - mu) / s^2, (y - mu)^2 / s^2 - 1)`` in ``(mu, log s)``). Before, the
    second release (at the end of the Newton step) was clipped at the warm start's last
    iterate's bound: at this seed log s fell from 0.673 to 0.493, the bound stayed 0.0892
    where the records' largest norm was 0.102, and 2 records inside the bounds were clipped
    (a bias the result neither modelled nor said)."""
    import pymc as pm

    import pymc_dp.auto.configure as configure
    from pymc_dp.auto import auto_configure
    from pymc_dp.auto.bounds import DerivedBounds

    y = np.clip(np.random.default_rng(0).normal(0.5, 1.0, 300), -5, 5)
    y[:3] = [4.9, -4.9, 4.8]
    calls = []
    release = configure.release_gradient_sum

    def recorded(fns, q, b, transform, z, rng, size=None):
        calls.append((np.array(q), float(b), np.array(transform)))
        return release(fns, q, b, transform, z, rng, size)

    monkeypatch.setattr(configure, "release_gradient_sum", recorded)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 3)
        pm.Normal("y", mu, pm.HalfNormal("s", 2), observed=y)
    bounds = {"y": (-5.0, 5.0)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = auto_configure(
            model, epsilon=1.0, delta=1e-6, chains=2, draws=None, tune=None,
            rng=np.random.default_rng(2), method="laplace", data_bounds=bounds,
            derive_clips=True,
        )  # fmt: skip
    assert plan.clip_sources["warm-start gradient clip"] == "data_bounds"
    assert len(calls) == 2
    derived = DerivedBounds(model, model.value_vars, model.initial_point(), bounds)
    for q, b, m in calls:
        # the whitened bound: a bound of ||g_i|| times the whitening's spectral norm
        want = derived.gradient_bound(q) * np.linalg.norm(m, 2)
        assert b == pytest.approx(want, rel=1e-12)
        s2 = np.exp(2 * q[1])
        g = np.column_stack([(y - q[0]) / s2, (y - q[0]) ** 2 / s2 - 1.0])
        norms = np.linalg.norm(g @ m.T, axis=1)
        assert np.all(norms <= b), (q, b, norms.max(), int(np.sum(norms > b)))


def test_records_outside_the_declared_bounds_are_a_tail_the_result_says():
    """With ``derive_clips`` the one-shot strategy releases the excess beyond the declared
    bounds' clip bound as it does beyond the histogram's: 0 where the data respect the
    bounds, a tail where records lie outside them. A normal mean (sd 1, prior N(0, 10)),
    3 000 records, 30 of them at 25 with ``data_bounds`` [-5, 5], epsilon 3: the result
    covers the exact posterior mean within 2 of its sds and warns that records lie outside
    ``data_bounds`` (bound moved, ``dp_oneshot_clip_scale`` above 1). Before, DP seed 1 came
    out 0.5171 (sd 0.0478) against 0.7122, 4.09 of its own sds off, the clip unsaid; seed 0
    came out prior-wide (sd 9.75). The same records without the 30 outside: no tail read,
    the bound kept."""
    import pymc as pm

    import pymc_dp

    y = np.clip(np.random.default_rng(0).normal(0.5, 1.0, 3000), -5, 5)
    y_out = y.copy()
    y_out[:30] = 25.0
    for data, outside in ((y_out, True), (y, False)):
        post_prec = data.size + 1 / 100.0
        exact = data.sum() / post_prec
        with pm.Model() as model:
            pm.Normal("y", pm.Normal("mu", 0, 10), 1.0, observed=data)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(
                model=model, epsilon=3.0, delta=1e-6, random_seed=1, chains=2,
                progressbar=False, data_bounds={"y": (-5.0, 5.0)},
                auto_kwargs={"method": "laplace", "derive_clips": True},
            )  # fmt: skip
        draws = idata.posterior["mu"].values.ravel()
        assert abs(draws.mean() - exact) < 2 * draws.std(), (draws.mean(), draws.std(), exact)
        said = [str(x.message) for x in w if "outside data_bounds" in str(x.message)]
        assert bool(said) == outside
        assert (idata.attrs["dp_oneshot_clip_scale"] > 1) == outside


def _hierarchy_exact(y: np.ndarray, group: np.ndarray, groups: int) -> tuple:
    """The exact posterior means and sds of ``(mu, a_1..a_G, s)`` of `_hierarchy_model`, by
    quadrature over ``s`` (given ``s`` the model is conjugate in ``(mu, a)``; the group
    means are sufficient, ``ybar ~ N(0, 100 11^T + diag(s^2 + 1 / n_j))`` given ``s``)."""
    import scipy.stats as st

    nj = np.bincount(group, minlength=groups)
    yb = np.bincount(group, y, minlength=groups) / nj
    grid = np.linspace(1e-3, 5.0, 2000)
    logw, first, second = [], [], []
    for s in grid:
        cov = 100.0 * np.ones((groups, groups)) + np.diag(s**2 + 1.0 / nj)
        logw.append(
            st.multivariate_normal(np.zeros(groups), cov).logpdf(yb) + st.halfnorm.logpdf(s)
        )
        prec = np.diag(np.r_[0.01 + groups / s**2, 1.0 / s**2 + nj])
        prec[0, 1:] = prec[1:, 0] = -1.0 / s**2
        c = np.linalg.inv(prec)
        m = c @ np.r_[0.0, nj * yb]
        first.append(np.r_[m, s])
        second.append(np.r_[np.diag(c) + m**2, s**2])
    w = np.exp(np.array(logw) - max(logw))
    w /= w.sum()
    mean = w @ np.array(first)
    return mean, np.sqrt(w @ np.array(second) - mean**2)


@pytest.mark.slow
def test_the_chain_fallbacks_clipped_tail_is_said(monkeypatch):
    """The penalty chain's one-shot fallback after its control variate (`configure._one_shot`
    with ``first``) releases the excess beyond the control variate's bound: a normal model
    of 4 group means (scale ``HalfNormal(1)``, the automatic mode's chain), 3 000 records,
    30 of them at 25 (far beyond the clip bound), epsilon 3, the fallback forced where the
    run decides it (`configure._off_centre`'s prediction; the releases are the run's own).
    DP seeds 1 and 2: every coordinate within 2 of the result's sds of the exact posterior
    mean (`_hierarchy_exact`), the bound kept (both ends share it), the bias beyond it said
    (`NoiseDominatedWarning`, ``dp_oneshot_clip_bias`` above 1). Before, that path released
    no excess: the group means came out 3.9-5.4 of their own sds off, no warning."""
    import pymc as pm

    import pymc_dp
    import pymc_dp.auto.configure as configure
    from pymc_dp.auto.predict import Prediction

    real = configure._off_centre

    def off_centre(pred, best, step, centre):
        p, b, offset = real(pred, best, step, centre)
        stuck = [Prediction(x.proposal, x.iterations, x.noise_multiplier, 1e3, 0.0, -1.0)
                 for x in (p, b)]  # fmt: skip
        return stuck[0], stuck[1], offset

    monkeypatch.setattr(configure, "_off_centre", off_centre)
    monkeypatch.setattr(configure, "ONESHOT_FALLBACK_ESS", -0.5)  # only this path gives way
    n, groups = 3000, 4
    group = np.arange(n) % groups
    y = np.random.default_rng(0).normal(1.5 + 0.5 * (np.arange(groups) - 1.5)[group], 1.0)
    y[:30] = 25.0
    exact, _ = _hierarchy_exact(y, group, groups)
    for seed in (1, 2):
        with pm.Model():
            mu = pm.Normal("mu", 0, 10)
            a = pm.Normal("a", mu, pm.HalfNormal("s", 1.0), shape=groups)
            pm.Normal("y", a[group], 1.0, observed=y)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                idata = pymc_dp.sample(
                    epsilon=3.0, delta=1e-6, chains=2, cores=1, random_seed=seed,
                    progressbar=False, compute_convergence_checks=False,
                )  # fmt: skip
        assert "control variate's release as its first end" in idata.attrs["dp_auto_strategy"]
        post = idata.posterior
        draws = np.column_stack(
            [
                post["mu"].values.ravel(),
                post["a"].values.reshape(-1, groups),
                post["s"].values.ravel(),
            ]
        )
        off = np.abs(draws.mean(axis=0) - exact) / draws.std(axis=0)
        assert np.all(off < 2.0), (seed, off)
        assert idata.attrs["dp_oneshot_clip_scale"] == 1.0
        assert idata.attrs["dp_oneshot_clip_bias"] > 1.0
        said = [str(x.message) for x in w if "tail beyond the clip bound" in str(x.message)]
        assert said and "the bound was kept" in said[0]
