"""The one-shot strategy bounded (issue 26, eleventh session): a data-free trust region on
its Newton steps, its result's variances capped by the prior's, never a non-finite draw."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.auto import auto_configure
from pymc_dp.auto.configure import AutoPlan, _bounded_by_prior, _Coordinates, prior_in_y
from pymc_dp.auto.oneshot import (
    LOST_PRIOR_SDS,
    LOST_WIDENING,
    PRIOR_WIDE_SDS,
    NewtonStep,
    NoiseAwareLaplace,
    centre_prior_wide,
    lost_coordinates,
    newton_step,
    noise_aware_laplace,
    prior_cap,
    trust_region,
    widen_to_prior,
)
from pymc_dp.kernels import warmstart
from pymc_dp.records import build_record_functions
from pymc_dp.step_methods.laplace import PriorBlock


# -- the trust region ----------------------------------------------------------------------
def test_trust_region_shortens_the_step_as_a_whole():
    """No coordinate moves further than its bound; the direction is kept; taken + cut is the
    step; a step within the region, or no region, is taken whole; a non-finite step is not
    taken and its cut is the region (0 where unbounded)."""
    step = np.array([3.5e6, -2.0, 0.5])
    bound = np.array([3.0, 3.0, np.inf])
    taken, cut = trust_region(step, bound)
    assert np.all(np.abs(taken) <= bound + 1e-12)
    assert np.abs(taken[0]) == pytest.approx(3.0)
    np.testing.assert_allclose(taken + cut, step)
    np.testing.assert_allclose(taken / np.linalg.norm(taken), step / np.linalg.norm(step))
    small = np.array([1.0, -2.0, 100.0])  # the unbounded coordinate never cuts
    t2, c2 = trust_region(small, bound)
    np.testing.assert_array_equal(t2, small)
    assert not np.any(c2)
    t3, c3 = trust_region(step, None)
    np.testing.assert_array_equal(t3, step)
    t4, c4 = trust_region(np.array([np.nan, 1.0, np.inf]), bound)
    np.testing.assert_array_equal(t4, 0.0)
    np.testing.assert_array_equal(c4, [3.0, 3.0, 0.0])


def _gaussian(d: int = 3, seed: int = 5):
    """Log-likelihood -(theta - m)^T F (theta - m) / 2, prior N(0, 10 I): the exact posterior
    is N((F + P0)^-1 F m, (F + P0)^-1)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    fisher = 50.0 * (a @ a.T + d * np.eye(d))
    m = rng.normal(size=d)
    prior_prec = 0.1 * np.eye(d)
    prec = fisher + prior_prec
    return rng, fisher, m, prior_prec, prec, np.linalg.solve(prec, fisher @ m)


def _step(anchor, noise, fisher, m, prior_prec, prec, max_move):
    basis = np.linalg.cholesky(prec)
    released = np.linalg.solve(basis, fisher @ (m - anchor)) + noise
    return newton_step(
        anchor=anchor, released_grad=released, prior_grad=-prior_prec @ anchor,
        precision=prec, damping=0.0, basis=basis, data=np.ones(anchor.size, dtype=bool),
        noise_std=0.4, prior_precision_floor=0.1, max_move=max_move,
    )  # fmt: skip


def test_an_absurd_released_gradient_is_cut_and_the_result_covers_the_mode():
    """A Gaussian model whose first released gradient is absurd (noise 1e7 release sds in
    one coordinate, as a release far off in the tails would be): without the trust region the
    first step ends 1e5 posterior sds away and the result's sds are 1e5-1e6 times the
    posterior's; with it (3 prior sds a coordinate) the step is cut there, the cut part is
    doubt, and after the prior cap the result covers the exact posterior mean within 2 of
    its sds in every coordinate, no sd above the prior's."""
    _, fisher, m, prior_prec, prec, exact = _gaussian()
    prior_sd = np.sqrt(10.0)
    move = 3.0 * prior_sd * np.ones(3)
    anchor = exact + 0.01
    absurd = np.array([1e7, 0.0, 0.0])
    for max_move in (None, move):
        first = _step(anchor, absurd, fisher, m, prior_prec, prec, max_move)
        second = _step(first.mean, np.zeros(3), fisher, m, prior_prec, prec, max_move)
        res = noise_aware_laplace(first, second, np.ones(3, dtype=bool), max_move=max_move)
        if max_move is None:  # the failure the trust region prevents
            assert np.max(np.abs(first.mean - exact)) > 1e3
            continue
        assert np.all(np.abs(first.step) <= move + 1e-9)
        np.testing.assert_allclose(first.step + first.cut, np.linalg.solve(prec, fisher @ (
            m - anchor) - prior_prec @ anchor + np.linalg.cholesky(prec) @ absurd))  # fmt: skip
        assert not res.converged  # a cut first step is a warm start that had not converged
        cap = prior_cap(res.mean, res.cov, np.zeros(3), prior_sd**2 * np.ones(3))
        sd = np.sqrt(np.diag(cap.cov))
        assert np.all(np.abs(cap.mean - exact) < 2.0 * sd), (cap.mean, exact, sd)
        # no wider than the prior's spread about the result's mean
        assert np.all(sd**2 <= (prior_sd**2 + cap.mean**2) * (1 + 1e-12))
        assert np.max(sd) < 10 * prior_sd


# -- the prior cap -------------------------------------------------------------------------
def test_prior_cap_never_exceeds_the_prior_spread():
    """Random covariances with coordinates 1e-3 to 1e12 times their prior's variance: after
    the cap no variance exceeds the prior's mean square about the result's mean
    (``prior_var + (mean - prior_mean)^2``: the prior's variance where the means agree), the
    covariance stays positive semi-definite, the means are kept, the coordinates within
    the bound untouched; a non-finite mean or covariance entry comes out finite (the prior's
    mean and variance); an improper prior (variance inf) caps nothing."""
    rng = np.random.default_rng(0)
    d = 6
    prior_mean, prior_var = rng.normal(size=d), rng.uniform(0.5, 4.0, size=d)
    for _ in range(200):
        a = rng.normal(size=(d, d)) * 10.0 ** rng.uniform(-2, 6, size=d)[:, None]
        cov = a @ a.T + 1e-6 * np.eye(d)
        mean = prior_mean + rng.normal(size=d) * 2.0 * np.sqrt(prior_var)
        bound = prior_var + (mean - prior_mean) ** 2
        cap = prior_cap(mean, cov, prior_mean, prior_var)
        assert np.all(np.diag(cap.cov) <= bound * (1 + 1e-12))
        assert np.linalg.eigvalsh(cap.cov).min() >= -1e-9 * np.abs(cap.cov).max()
        wide = np.diag(cov) > bound
        np.testing.assert_array_equal(cap.capped, wide)
        np.testing.assert_allclose(np.diag(cap.cov)[wide], bound[wide], rtol=1e-12)
        np.testing.assert_array_equal(cap.mean, mean)
        keep = np.ix_(~wide, ~wide)
        np.testing.assert_array_equal(cap.cov[keep], 0.5 * (cov[keep] + cov[keep].T))
    at_prior = prior_cap(prior_mean, 1e12 * np.eye(d), prior_mean, prior_var)
    np.testing.assert_allclose(np.diag(at_prior.cov), prior_var, rtol=1e-12)
    cov = np.eye(d)
    cov[1, 1], cov[2, 3], cov[3, 2] = np.inf, np.nan, np.nan
    mean = np.zeros(d)
    mean[4] = np.nan
    cap = prior_cap(mean, cov, prior_mean, prior_var)
    assert np.all(np.isfinite(cap.cov)) and np.all(np.isfinite(cap.mean))
    want = {1, 2, 3, 4} | {j for j in (0, 5) if prior_var[j] + prior_mean[j] ** 2 < 1.0}
    assert set(np.flatnonzero(cap.capped).tolist()) == want
    np.testing.assert_array_equal(cap.mean[[1, 2, 3, 4]], prior_mean[[1, 2, 3, 4]])
    np.testing.assert_allclose(np.diag(cap.cov)[[1, 2, 3, 4]], prior_var[[1, 2, 3, 4]], rtol=1e-12)
    improper = prior_cap(np.zeros(d), 1e9 * np.eye(d), prior_mean, np.full(d, np.inf))
    assert not improper.capped.any()
    np.testing.assert_array_equal(np.diag(improper.cov), 1e9)


def test_prior_in_y_matches_closed_forms():
    """The prior's moments in the model's transformed coordinates from its forward draws:
    Normal(1, 2) has mean 1 and variance 4; a HalfNormal(1)'s log, log|Z|, has mean
    -(gamma + log 2) / 2 and variance pi^2 / 8 (within 4 Monte Carlo standard errors of
    the draws); a Flat prior has none (inf), the others keep theirs."""
    with pm.Model() as model:
        pm.Normal("a", 1.0, 2.0)
        pm.HalfNormal("s", 1.0)
        pm.Flat("f")
    ip = model.initial_point()
    prior = prior_in_y(model, model.value_vars, ip, None)
    n = 4000
    # Monte Carlo standard errors from the known distributions (numpy draws, 1e6)
    z = np.random.default_rng(0).normal(size=1_000_000)
    ls = np.log(np.abs(z))
    se_mean = np.sqrt(np.array([4.0, np.var(ls)]) / n)
    se_var = np.sqrt(np.array([2 * 16.0, np.var((ls - ls.mean()) ** 2)]) / n)
    want_mean = np.array([1.0, -(np.euler_gamma + np.log(2.0)) / 2.0])
    want_var = np.array([4.0, np.pi**2 / 8.0])
    assert prior.names == ["a", "s", "f"]
    np.testing.assert_array_equal(prior.log_scale, [False, True, False])
    assert np.all(np.abs(prior.mean[:2] - want_mean) < 4 * se_mean)
    assert np.all(np.abs(prior.var[:2] - want_var) < 4 * se_var)
    assert prior.var[2] == np.inf and prior.scale[2] == np.inf


# -- never a non-finite result -------------------------------------------------------------
def _plan_and_coords(flat: bool = False):
    x = np.random.default_rng(1).normal(0.5, 1.0, size=40)
    with pm.Model() as model:
        mu = pm.Flat("mu") if flat else pm.Normal("mu", 0.0, 3.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("x", mu, sigma, observed=x)
    vars, ip = model.value_vars, model.initial_point()
    fns = build_record_functions(model, vars, ip)[0]
    coords = _Coordinates(fns, None, None, model, vars, ip)
    plan = AutoPlan(1.0, 1e-6, 40, 2, 4, 1.0, method="laplace")
    return plan, coords


class _Info:
    mean = np.array([0.3, 0.1])
    cov = np.eye(2) * 0.5


def test_a_non_finite_result_is_never_drawn():
    """A one-shot result with a NaN mean and an infinite variance: where the prior is proper
    the cap makes those coordinates prior-wide and names them: mu (on its own scale) gets
    the prior's mean and variance (0 and 9) widened to `PRIOR_WIDE_SDS` prior sds
    (`centre_prior_wide`), log sigma is drawn from the prior's own draws (the Gaussian
    carries their moments); where the prior is not proper (a Flat mu), the whole Gaussian
    falls back (the prior's draws where proper, the warm start's moments elsewhere) and the
    plan says so. A finite result within its prior is returned as it is."""
    bad = NoiseAwareLaplace(np.array([np.nan, 0.0]), np.diag([1.0, np.inf]), np.eye(2), 1.0)
    plan, coords = _plan_and_coords()
    mean, cov = _bounded_by_prior(plan, coords, bad, _Info())
    prior = coords.prior()
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))
    np.testing.assert_allclose(mean, prior.mean)
    np.testing.assert_allclose(cov, np.diag([PRIOR_WIDE_SDS**2, 1.0]) * prior.var)
    assert abs(prior.var[0] - 9.0) < 4 * 9.0 * np.sqrt(2 / 4000)
    assert plan.prior_wide == ["mu", "sigma"] and not plan.oneshot_fallback
    np.testing.assert_array_equal(plan.prior_block.free, [False, True])
    np.testing.assert_array_equal(plan.prior_block.pool, prior.draws[:, [1]])
    plan, coords = _plan_and_coords(flat=True)
    mean, cov = _bounded_by_prior(plan, coords, bad, _Info())
    prior = coords.prior()
    assert prior.var[0] == np.inf and np.isfinite(prior.var[1])
    assert np.all(np.isfinite(mean)) and np.all(np.isfinite(cov))
    np.testing.assert_allclose(mean, [_Info.mean[0], prior.mean[1]])
    np.testing.assert_allclose(np.diag(cov), [_Info.cov[0, 0], prior.var[1]])
    assert "not finite" in plan.oneshot_fallback
    np.testing.assert_array_equal(plan.prior_block.free, [False, True])
    plan2, coords = _plan_and_coords()
    good = NoiseAwareLaplace(np.array([0.5, 0.0]), np.diag([0.01, 0.02]), np.eye(2), 0.1)
    mean, cov = _bounded_by_prior(plan2, coords, good, _Info())
    np.testing.assert_array_equal(mean, good.mean)
    np.testing.assert_array_equal(cov, good.cov)
    assert not plan2.oneshot_fallback and plan2.prior_wide == [] and plan2.prior_block is None


@pytest.mark.parametrize("keeps_bound", [False, True])
def test_a_noise_dominated_run_is_no_wider_than_its_prior(keeps_bound, monkeypatch):
    """End to end: 30 records at epsilon 0.05 (the releases are mostly noise). The draws are
    finite; no parameter's sd in the model's transformed coordinates exceeds
    `PRIOR_WIDE_SDS` times the prior's spread about the draws' mean by more than their
    Monte Carlo error (a prior-wide coordinate on its own scale holds the prior's mean plus
    or minus ``2 PRIOR_WIDE_SDS`` prior sds, `centre_prior_wide`); the parameters that came
    out prior-wide are named in the warning, the attribute and ``dp_prior_close``; and
    sigma, a log scale in ``y``, is **on its own scale** no wider than its prior (drawn from
    the prior, `pymc_dp.step_methods.laplace.PriorBlock`). Before, its Gaussian in ``log
    sigma`` held the prior's mean plus or minus 4 prior sds: at this seed sigma's sd
    (``HalfNormal(2)``, prior sd 1.21) came out 560; now 1.23. With and without
    `EMPTY_HISTOGRAM_KEEPS_BOUND` (``keeps_bound``): with it every histogram of this run is
    noise only and keeps its bound, and the result came out confidently narrow (``mu``'s
    sd 3.9e-07, then 5.2e-09: the floored noise of each curvature whitened the next, to a
    precision of 2.5e39, and the damped noise-only curvature's floor was 1e-12 of it;
    `pymc_dp.kernels.warmstart.curvature_cap`, `newton_step`)."""
    monkeypatch.setattr(warmstart, "EMPTY_HISTOGRAM_KEEPS_BOUND", keeps_bound)
    x = np.random.default_rng(2).normal(0.5, 1.0, size=30)
    with pm.Model() as model:
        pm.Normal("mu", 0.0, 3.0)
        s = pm.HalfNormal("sigma", 2.0)
        pm.Normal("x", model["mu"], s, observed=x)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        idata = pymc_dp.sample(
            step=None, epsilon=0.05, delta=1e-6, random_seed=5, chains=2, model=model,
            auto_kwargs={"method": "laplace"}, progressbar=False,
        )  # fmt: skip
    post = idata.posterior
    mu, sigma = post["mu"].values.ravel(), post["sigma"].values.ravel()
    assert np.all(np.isfinite(mu)) and np.all(np.isfinite(sigma))
    k = mu.size
    # prior mean and sd: mu 0 and 3; log of a HalfNormal(2): log 2 - (gamma + log 2) / 2 and
    # pi / sqrt(8); the sample sd's error sd / sqrt(2k), the prior variance's sqrt(2 / 4000)
    log_mean = np.log(2.0) - (np.euler_gamma + np.log(2.0)) / 2.0
    for draws, pm_, psd in ((mu, 0.0, 3.0), (np.log(sigma), log_mean, np.pi / np.sqrt(8.0))):
        spread = np.sqrt(psd**2 * (1 + 4 * np.sqrt(2 / 4000)) + (np.mean(draws) - pm_) ** 2)
        spread *= PRIOR_WIDE_SDS
        assert np.std(draws) <= spread * (1 + 4 / np.sqrt(2 * k)), (np.std(draws), spread)
    # the releases are noise: before the cap, mu's sd came out 8 900 (prior 3) at DP seed 3;
    # with the warm start's steps bounded by the prior (`private_laplace` ``max_move``) that
    # seed's sd is 3.28 and nothing is capped; at seed 5 mu and sigma still are
    wide = idata.attrs["dp_oneshot_prior_wide"].split(", ")
    assert wide == ["mu", "sigma"]
    text = [str(x.message) for x in w if "could not be told from the noise" in str(x.message)]
    assert len(text) == 1 and all(name in text[0] for name in wide)
    assert idata.attrs["dp_prior_close"].split(", ") == wide
    assert any(issubclass(x.category, pymc_dp.PriorDominatedWarning) for x in w)
    # sigma on its own scale: the prior's sd 2 sqrt(1 - 2 / pi); the draws resample the
    # 4 000 prior draws of `prior_in_y`: the sd's error is that of 4 000 draws and of k
    # resampled ones, each ``sd sqrt((kurtosis - 1) / (4 m))`` (a HalfNormal's kurtosis 3.87)
    psd = 2.0 * np.sqrt(1 - 2 / np.pi)
    tol = 4 * np.sqrt((3.87 - 1) / 4 * (1 / 4000 + 1 / k))
    assert np.std(sigma) <= psd * (1 + tol), (np.std(sigma), psd)


def test_a_noise_only_curvature_never_narrows_the_step_below_the_prior():
    """The state the noise-dominated run with `EMPTY_HISTOGRAM_KEEPS_BOUND` reached (dev-only
    trace, 30 records at epsilon 0.05): a released curvature ``P`` of 1e26-1e28, noise only,
    its damping (two noise levels) above it in every direction. ``P_c = P - damping`` has
    no positive eigenvalue: the releases say nothing of the curvature, and ``P_c`` is the
    prior's floor, ``cov_c = I / floor``. Before, ``P_c`` was floored at 1e-12 of its largest
    eigenvalue *in absolute value*, 3.5e16 there: ``cov_c`` 2.8e-17, a result with sds of
    5e-9 and no prior-wide flag."""
    rng = np.random.default_rng(0)
    a = rng.normal(size=(2, 2))
    p = 1e26 * (a @ a.T + np.eye(2))
    damping = 2.0 * np.linalg.eigvalsh(p).max() * np.eye(2)
    floor = 1.0 / 9.0
    step = newton_step(
        anchor=np.zeros(2), released_grad=np.array([0.3, -1.2]), prior_grad=np.zeros(2),
        precision=p, damping=damping, basis=np.eye(2), data=np.ones(2, dtype=bool),
        noise_std=0.65, prior_precision_floor=floor,
    )  # fmt: skip
    np.testing.assert_allclose(step.cov_c, np.eye(2) / floor, rtol=1e-9, atol=1e-9)
    # a curvature the damping leaves positive in one direction keeps it (and the other at
    # the floor): ``P_c`` from the data where they tell it from 0
    p2 = np.diag([1e3, 1e28])
    step2 = newton_step(
        anchor=np.zeros(2), released_grad=np.zeros(2), prior_grad=np.zeros(2),
        precision=p2, damping=np.diag([10.0, 2e28]), basis=np.eye(2),
        data=np.ones(2, dtype=bool), noise_std=0.65, prior_precision_floor=floor,
    )  # fmt: skip
    np.testing.assert_allclose(np.diag(step2.cov_c), [1.0 / 990.0, 1.0 / floor], rtol=1e-9)


# -- a warm start lost far out: the coordinates the curvature's noise dominates -----------
def _floored_step(cov_c_diag, p_diag):
    d = len(p_diag)
    z = np.zeros(d)
    return NewtonStep(
        mean=z,
        step=z,
        noise_cov=np.eye(d),
        cov_c=np.diag(cov_c_diag),
        precision=np.diag(p_diag),
        curvature_cov=np.zeros((d, d)),
    )


def test_lost_coordinates_need_noise_domination_and_one_far_out():
    """A coordinate is lost where the floored curvature made its sd >= LOST_WIDENING times
    the released curvature's, once one such coordinate sits beyond LOST_PRIOR_SDS prior sds
    of the prior's mean; a coordinate the data determine, or an improper prior, never."""
    prior_mean, prior_var = np.zeros(4), np.array([4.0, 1.0, 1.0, np.inf])
    # coordinates 0, 1 and 3: sd 100 / 10.5 / 20 times the released curvature's; 2: 1x
    step = _floored_step([1e4, 110.25, 1.0, 400.0], [1.0, 1.0, 1.0, 1.0])
    far = np.array([2.0 * (LOST_PRIOR_SDS + 0.5), 1.0, 50.0, 1e6])  # coordinate 0: 4.5 sds
    lost = lost_coordinates(step, far, prior_mean, prior_var)
    np.testing.assert_array_equal(lost, [True, True, False, False])
    near = far.copy()
    near[0] = 2.0 * (LOST_PRIOR_SDS - 0.5)  # 3.5 prior sds: nothing is lost
    assert not lost_coordinates(step, near, prior_mean, prior_var).any()
    # the far coordinate not noise-dominated (coordinate 2, 50 prior sds out): nothing lost
    step_ok = _floored_step([1.0, 110.25, 1.0, 400.0], [1.0, 1.0, 1.0, 1.0])
    assert not lost_coordinates(step_ok, far, prior_mean, prior_var).any()
    # just below the widening threshold
    below = _floored_step([(0.99 * LOST_WIDENING) ** 2, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
    assert not lost_coordinates(below, far, prior_mean, prior_var).any()


def test_widen_to_prior_reaches_the_prior_spread_about_the_mean():
    """The widened variances are ``prior_var + (mean - prior_mean)^2``; the others and every
    correlation are kept; the result stays positive semi-definite."""
    rng = np.random.default_rng(4)
    a = rng.normal(size=(5, 5))
    cov = a @ a.T * 1e-3 + np.eye(5) * 1e-4
    mean = np.array([12.8, -3.6, 0.2, 66.0, 1.0])
    prior_mean, prior_var = np.zeros(5), np.array([4.0, 1.0, 1.0, 2.0, 9.0])
    which = np.array([True, True, False, True, False])
    out = widen_to_prior(mean, cov, prior_mean, prior_var, which)
    bound = prior_var + (mean - prior_mean) ** 2
    np.testing.assert_allclose(np.diag(out)[which], bound[which])
    np.testing.assert_allclose(np.diag(out)[~which], np.diag(cov)[~which])
    corr = lambda c: c / np.sqrt(np.outer(np.diag(c), np.diag(c)))  # noqa: E731
    np.testing.assert_allclose(corr(out), corr(cov), atol=1e-12)
    assert np.linalg.eigvalsh(out).min() > -1e-9 * np.abs(out).max()
    # a lost coordinate whose variance was 0 gets the bound, uncorrelated
    cov0 = cov.copy()
    cov0[0, :] = cov0[:, 0] = 0.0
    out0 = widen_to_prior(mean, cov0, prior_mean, prior_var, which)
    assert out0[0, 0] == pytest.approx(bound[0])
    assert not np.any(out0[0, 1:])
    np.testing.assert_array_equal(
        widen_to_prior(mean, cov, prior_mean, prior_var, ~np.ones(5, bool)), cov
    )


def test_a_lost_result_is_prior_wide_and_named():
    """`_bounded_by_prior` with the last step: a result whose curvature the noise dominates
    and whose mu sits 10 prior sds out is lost on every such coordinate: mu (its own scale)
    is widened to the prior's spread about its mean (then re-centred to hold the prior's own
    interval, `centre_prior_wide`), log sigma is drawn from the prior's own draws (the
    Gaussian carries their moments, uncorrelated); both are named. The same result with
    the data determining its curvature is returned as it is."""
    plan, coords = _plan_and_coords()
    prior = coords.prior()
    mean = prior.mean + np.array([10.0 * np.sqrt(prior.var[0]), 0.5 * np.sqrt(prior.var[1])])
    cov = np.diag([0.01, 0.02])
    lost = NoiseAwareLaplace(mean, cov, cov, 1e-4)
    floored = _floored_step([1e4, 1e4], [1.0, 1.0])
    out_mean, out_cov = _bounded_by_prior(plan, coords, lost, _Info(), floored)
    widened = np.diag(prior.var + (mean - prior.mean) ** 2)
    want_mean, want_cov = centre_prior_wide(mean, widened, prior.mean, prior.var, [True, False])
    # mu, 10 prior sds out, keeps its mean and the prior's spread about it
    assert out_mean[0] == pytest.approx(mean[0]) == pytest.approx(want_mean[0])
    assert out_cov[0, 0] == pytest.approx(widened[0, 0]) == pytest.approx(want_cov[0, 0])
    # sigma: the prior's draws
    assert out_mean[1] == prior.mean[1] and out_cov[1, 1] == prior.var[1] and out_cov[0, 1] == 0
    np.testing.assert_array_equal(plan.prior_block.free, [False, True])
    np.testing.assert_array_equal(plan.prior_block.pool, prior.draws[:, [1]])
    assert plan.prior_wide == ["mu", "sigma"]
    plan2, coords = _plan_and_coords()
    determined = _floored_step([1.0, 1.0], [1.0, 1.0])
    out_mean, out_cov = _bounded_by_prior(plan2, coords, lost, _Info(), determined)
    np.testing.assert_array_equal(out_cov, cov)
    assert plan2.prior_wide == [] and plan2.prior_block is None


def test_prior_block_replaces_its_coordinates_by_prior_draws_and_keeps_the_others():
    """`PriorBlock.draw`: the block's coordinates take one row of the pool (each row about
    equally often), the others are the Gaussian draw as it was."""
    pool = np.column_stack([np.arange(5.0), -np.arange(5.0)])
    block = PriorBlock(np.array([False, True, False, True]), pool)
    rng = np.random.default_rng(0)
    ys = rng.normal(size=(4000, 4))
    out = np.array([block.draw(y, rng) for y in ys])
    np.testing.assert_array_equal(out[:, [0, 2]], ys[:, [0, 2]])
    rows = out[:, 1].astype(int)
    np.testing.assert_array_equal(out[:, 3], -rows)
    counts = np.bincount(rows, minlength=5)
    # each row 1 / 5 of the draws: binomial sd sqrt(4000 0.2 0.8) = 25.3
    assert np.all(np.abs(counts - 800) < 4 * 25.3), counts
    with pytest.raises(ValueError, match="one column per coordinate"):
        PriorBlock(np.array([True, False]), pool)


def test_nothing_changes_where_no_coordinate_is_prior_wide():
    """A normal mean with known sd (n = 2 000, epsilon 3, prior N(0, 10)): nothing is
    prior-wide, no prior block, and the draws are the released Gaussian's, within 3 of
    their own sds of the closed-form posterior mean and at least as wide as its sd."""
    x = np.clip(np.random.default_rng(5).normal(0.7, 1.0, 2000), -5, 5)
    with pm.Model() as model:
        pm.Normal("x", pm.Normal("mu", 0.0, 10.0), 1.0, observed=x)
    post_prec = x.size + 1 / 100.0
    post_mean, post_sd = x.sum() / post_prec, post_prec**-0.5
    plan = auto_configure(
        model, epsilon=3.0, delta=1e-6, chains=2, draws=2000, tune=None,
        rng=np.random.default_rng(0), method="laplace",
    )  # fmt: skip
    assert plan.prior_wide == [] and plan.prior_block is None and plan.free_block is None
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        idata = pymc_dp.sample(
            2000, epsilon=3.0, delta=1e-6, chains=2, random_seed=0, progressbar=False
        )
    assert idata.attrs["dp_oneshot_prior_wide"] == "" and idata.attrs["dp_prior_close"] == ""
    draws = idata.posterior["mu"].values.ravel()
    m, s = float(np.mean(draws)), float(np.std(draws))
    want_m, want_s = idata.attrs["dp_auto_laplace_mean"][0], idata.attrs["dp_auto_laplace_sd"][0]
    # the draws are N(released mean, released sd): Monte Carlo errors of 4 000 draws
    assert abs(m - want_m) < 4 * want_s / np.sqrt(draws.size)
    assert abs(s / want_s - 1) < 4 / np.sqrt(2 * draws.size)
    assert abs(m - post_mean) < 3 * s and s >= post_sd
