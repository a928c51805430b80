"""The one-shot strategy of the automatic mode (issue 26): its release, its noise-aware
posterior against a closed form, its choice and its accounting."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import laplace_draws
from scipy import stats

import pymc_dp
from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto import auto_configure
from pymc_dp.auto.oneshot import (
    NewtonStep,
    choose_method,
    curvature_step_cov,
    newton_step,
    noise_aware_laplace,
    release_gradient_sum,
    zeroed_damping,
)
from pymc_dp.auto.recentre import find_recentring
from pymc_dp.records import build_record_functions


def _normal_mean_model(x: np.ndarray, prior_sd: float = 10.0) -> pm.Model:
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("x", mu, 1.0, observed=x)
    return model


def _fns(x):
    model = _normal_mean_model(x)
    return build_record_functions(model, model.value_vars, model.initial_point())[0]


# -- the release: sensitivity (brute force) and noise -------------------------------------------
def test_release_sensitivity_is_2b_by_brute_force():
    """Replacing any one record moves the exact clipped gradient sum by at most 2 b (L2), and
    the worst replacement reaches it."""
    x = np.linspace(-2.0, 2.0, 12)
    q, b = np.array([0.4]), 1.5
    base = release_gradient_sum(_fns(x), q, b, None, 0.0, np.random.default_rng(0))
    worst = 0.0
    for i in (0, 5, 11):  # the extremes and a middle record
        for new in (-50.0, 0.4, 3.0, 50.0):
            w = x.copy()
            w[i] = new
            moved = release_gradient_sum(_fns(w), q, b, None, 0.0, np.random.default_rng(0))
            worst = max(worst, float(np.linalg.norm(moved - base)))
    assert worst <= 2 * b + 1e-12
    assert worst == pytest.approx(2 * b)


def test_release_adds_noise_of_z_times_2b():
    """Released minus exact, over 4000 seeded releases, has sd 2 b z within its sampling error
    (the sd of a sample sd is sd / sqrt(2 (k - 1))): a halved or dropped noise fails."""
    fns = _fns(np.linspace(-2.0, 2.0, 12))
    q, b, z, k = np.array([0.4]), 1.5, 0.7, 4000
    exact = release_gradient_sum(fns, q, b, None, 0.0, np.random.default_rng(0))
    released = release_gradient_sum(fns, q, b, None, z, np.random.default_rng(1), size=k)
    sd = float(np.std(released[:, 0] - exact[0], ddof=1))
    want = 2 * b * z
    assert abs(sd - want) < 4 * want / np.sqrt(2 * (k - 1))


# -- the noise-aware posterior against a closed form -------------------------------------------
def _quadratic(seed: int = 3, d: int = 3):
    """Log-likelihood -(theta - m)^T F (theta - m) / 2, prior N(0, 10 I): the exact posterior
    is N((F + P0)^-1 F m, (F + P0)^-1)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(d, d))
    fisher = a @ a.T + d * np.eye(d)
    m = rng.normal(size=d)
    prior_prec = 0.1 * np.eye(d)
    prec = fisher + prior_prec
    return rng, fisher, m, prior_prec, prec, np.linalg.solve(prec, fisher @ m)


def _step(anchor, noise, fisher, m, prior_prec, curvature, basis, std=0.4, **kw):
    """One Newton step of `newton_step` with the exact gradient at ``anchor`` plus ``noise``
    (whitened coordinates) and the curvature ``curvature``."""
    released = np.linalg.solve(basis, fisher @ (m - anchor)) + noise
    return newton_step(
        anchor=anchor, released_grad=released, prior_grad=-prior_prec @ anchor,
        precision=curvature, damping=0.0, basis=basis, data=np.ones(anchor.size, dtype=bool),
        noise_std=std, prior_precision_floor=0.1, **kw,
    )  # fmt: skip


def test_noise_aware_laplace_is_exact_for_a_quadratic_log_likelihood():
    """With the exact curvature a Newton step ends at the exact posterior mean from any
    anchor. With noise, the two steps' combination errs by N(0, noise_cov) (chi-square of
    2000 draws), the checks pass in about 99 % of the draws, and the covariance is never
    narrower than the exact posterior's plus noise_cov."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic()
    basis = np.linalg.cholesky(prec)  # the releases are of L^-1 g_i
    anchor = exact_mean + rng.normal(size=3) * 3.0
    exact = _step(anchor, np.zeros(3), fisher, m, prior_prec, prec, basis)
    np.testing.assert_allclose(exact.mean, exact_mean, rtol=1e-10, atol=1e-12)
    errs, passed = [], 0
    for _ in range(2000):
        first = _step(anchor, rng.normal(size=3) * 0.4, fisher, m, prior_prec, prec, basis)
        second = _step(first.mean, rng.normal(size=3) * 0.4, fisher, m, prior_prec, prec, basis)
        res = noise_aware_laplace(first, second, np.ones(3, dtype=bool))
        passed += res.converged
        errs.append(np.linalg.solve(np.linalg.cholesky(res.noise_cov), res.mean - exact_mean))
    total, dof = float(np.sum(np.square(errs))), 3 * len(errs)
    assert stats.chi2.sf(total, dof) > 1e-3 and stats.chi2.cdf(total, dof) > 1e-3
    # the check's false alarms: 1 % expected; binomial sd 0.22 % of 2000
    assert abs(passed / 2000 - 0.99) < 0.01
    # both halves of the budget: the combined noise is half of one release's
    np.testing.assert_allclose(res.noise_cov, first.noise_cov / 2, rtol=1e-10)
    gap = res.cov - np.linalg.inv(prec) - res.noise_cov
    assert np.linalg.eigvalsh(gap).min() > -1e-12


def test_unconverged_steps_are_flagged_and_widened_to_cover_the_mode():
    """A curvature 5 times the true one (far from the mode the empirical Fisher information
    can overstate the Hessian so) makes every step a fifth of the way: the two steps
    disagree far beyond their noise, the result is flagged, and the mode lies within 2 of
    its sds in every coordinate."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic(seed=4)
    basis = np.linalg.cholesky(5 * prec)
    anchor = exact_mean + np.array([40.0, -25.0, 30.0])
    first = _step(anchor, rng.normal(size=3) * 0.4, fisher, m, prior_prec, 5 * prec, basis)
    second = _step(first.mean, rng.normal(size=3) * 0.4, fisher, m, prior_prec, 5 * prec, basis)
    res = noise_aware_laplace(first, second, np.ones(3, dtype=bool))
    assert not res.converged and res.step_chi2 > 1e3
    assert 0.7 < res.contraction < 0.9  # the steps contract by 1 - 1/5
    z = np.abs(res.mean - exact_mean) / np.sqrt(np.diag(res.cov))
    assert np.all(z < 2), z
    # the Newton map is linear with the scalar rate 0.8 here: Aitken's extrapolation lands
    # near the mode (0.75 at most: 3 steps of the 4 left), far nearer than the second end
    left = np.linalg.norm(second.mean - exact_mean)
    assert np.linalg.norm(res.mean - exact_mean) < 0.3 * left


def test_steps_that_do_not_contract_are_widened_by_the_warm_start_path():
    """A curvature 200 times the true one (far from the mode of a Poisson regression the
    clipped gradients' curvature was measured so far above the Hessian) makes the steps a
    two-hundredth of the way: they do not contract (r about 1) and the series bounds
    nothing. The warm start's path from its public start (the mode between them, as when a
    run overshoots) widens the result: the mode within 2 of its sds in every coordinate.
    Without the path the result is confidently wrong (the same steps, no path: z > 2)."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic(seed=5)
    basis = np.linalg.cholesky(200 * prec)
    anchor = exact_mean + np.array([40.0, -25.0, 30.0])
    start = exact_mean - 0.5 * (anchor - exact_mean)
    path = np.linspace(start, anchor, 6)
    first = _step(anchor, rng.normal(size=3) * 0.01, fisher, m, prior_prec, 200 * prec, basis)
    second = _step(first.mean, rng.normal(size=3) * 0.01, fisher, m, prior_prec, 200 * prec, basis)
    data = np.ones(3, dtype=bool)
    res = noise_aware_laplace(first, second, data, path=path)
    assert not res.converged and res.contraction > 0.9
    z = np.abs(res.mean - exact_mean) / np.sqrt(np.diag(res.cov))
    assert np.all(z < 2), z
    bare = noise_aware_laplace(first, second, data)
    assert np.max(np.abs(bare.mean - exact_mean) / np.sqrt(np.diag(bare.cov))) > 2


def _crawl_setup(seed: int, d: int, ratio: float, left: float):
    """A quadratic posterior whose released curvature is ``ratio`` times the Hessian along one
    direction ``u`` (exact elsewhere), and a warm start crawling along ``u`` as such steps
    do: its iterates ``mode + left / rho^j u`` (``rho = 1 - 1 / ratio``, ``u`` of unit
    posterior sd), the last ``left`` posterior sds off, plus noise of 0.1 posterior sds."""
    rng, fisher, m, prior_prec, prec, mode = _quadratic(seed=seed, d=d)
    u = rng.normal(size=d)
    u /= np.sqrt(u @ prec @ u)
    pu = prec @ u
    curvature = prec + (ratio - 1.0) * np.outer(pu, pu)
    rho = 1.0 - 1.0 / ratio
    chol = np.linalg.cholesky(np.linalg.inv(prec))
    path = np.array([mode + left / rho**j * u for j in range(10, -1, -1)])
    path += rng.normal(size=path.shape) @ chol.T * 0.1
    return rng, fisher, m, prior_prec, prec, mode, curvature, path


def test_a_warm_start_crawling_where_the_curvature_overstates_the_hessian_is_flagged():
    """The released curvature 16 times the Hessian along one direction (measured: 15-19
    times at the anchor of a StudentT regression on 526 real wages, epsilon 10): the warm
    start crawls a sixteenth of the way a step and stops 9.5 posterior sds off; the two
    one-shot steps do the same (each about 6 noise sds along the direction), and with 12
    coordinates their ends agree within the chi-square check's 0.99 quantile in half the
    draws: the failure this test is about. The first step goes on the way the warm start
    went, beyond its noise (`warm_start_drift`, median 5.9 sds): flagged, widened by the
    path, the mode within 2 of the result's sds. 400 release seeds; measured 93 % of the
    draws the check passes in (140 of 150 in 300 draws), asserted 85 % (binomial sd about
    2 %); without the drift test none is flagged and none honest (tens of sds off)."""
    d = 12
    data = np.ones(d, dtype=bool)
    rng, fisher, m, prior_prec, prec, mode, curvature, path = _crawl_setup(11, d, 16.0, 9.5)
    basis = np.linalg.cholesky(curvature)
    passed = honest = 0
    limit = stats.chi2.ppf(0.99, d)
    for _ in range(400):
        first = _step(path[-1], rng.normal(size=d) * 0.4, fisher, m, prior_prec, curvature, basis)
        second = _step(
            first.mean, rng.normal(size=d) * 0.4, fisher, m, prior_prec, curvature, basis
        )
        res = noise_aware_laplace(first, second, data, path=path)
        if res.step_chi2 > limit:
            continue
        passed += 1
        z = np.abs(res.mean - mode) / np.sqrt(np.diag(res.cov))
        honest += bool(np.all(z < 2)) and not res.converged and res.crawling
    assert passed >= 120
    assert honest >= 0.85 * passed, (honest, passed)


def test_a_converged_warm_start_is_not_read_as_crawling():
    """The curvature exact and the warm start's iterates the mode plus noise three times the
    last releases' (a converged warm start): the first step takes the anchor's noise back,
    against the drift, and the drift test flags almost none (expected about 0.2 % here:
    the statistic is negative in expectation and its noise part a unit normal, 3 sds the
    threshold; 1000 draws, binomial sd 0.14 %); the result is the two ends' combination,
    unchanged."""
    rng, fisher, m, prior_prec, prec, mode = _quadratic(seed=9)
    chol = np.linalg.cholesky(prec)
    data = np.ones(3, dtype=bool)
    crawled = 0
    for _ in range(1000):
        path = mode + np.linalg.solve(chol.T, rng.normal(size=(3, 11)) * 1.2).T
        first = _step(path[-1], rng.normal(size=3) * 0.4, fisher, m, prior_prec, prec, chol)
        second = _step(first.mean, rng.normal(size=3) * 0.4, fisher, m, prior_prec, prec, chol)
        res = noise_aware_laplace(first, second, data, path=path)
        crawled += res.crawling
        assert np.isfinite(res.drift)
    assert crawled <= 10


# -- the choice ----------------------------------------------------------------------------------
def test_method_choice_is_structural_and_overridable():
    x = np.zeros(10)
    assert choose_method("auto", hierarchical=False) == "laplace"
    assert choose_method("auto", hierarchical=True) == "chain"
    assert choose_method("chain", hierarchical=False) == "chain"
    with pytest.raises(ValueError, match="method"):
        choose_method("newton", hierarchical=False)
    g = np.arange(10) % 2
    with pm.Model() as hier:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, shape=2)
        pm.Normal("x", mu + tau * z[g], 1.0, observed=x)
    assert find_recentring(hier, hier.value_vars)
    flat = _normal_mean_model(x)
    assert not find_recentring(flat, flat.value_vars)


# -- end to end ------------------------------------------------------------------------------------
def test_one_shot_spends_exactly_the_budget():
    x = np.random.default_rng(0).normal(1.0, 1.0, 500)
    cfg = auto_configure(
        _normal_mean_model(x), epsilon=2.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), method="laplace",
    )  # fmt: skip
    assert cfg.method == "laplace"
    events = [GaussianEvent(p.noise_multiplier, p.releases) for p in cfg.phases]
    eps = compose_epsilon(events, 1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, rel=1e-6)
    assert cfg.phases[-1].name == "one-shot: noisy clipped gradient sums"
    assert cfg.phases[-1].releases == 2
    # most of the budget on the last release: what the warm start, the clip histogram and
    # the tail's excess leave (61 %)
    from pymc_dp.auto.configure import ONESHOT_CLIP_SHARE, ONESHOT_SPLIT, ONESHOT_TAIL_SHARE

    left = 1.0 - ONESHOT_SPLIT.warm_start - ONESHOT_SPLIT.histograms - ONESHOT_CLIP_SHARE
    left -= ONESHOT_TAIL_SHARE
    assert left > 0.6
    share = cfg.phases[-1].mu / sum(p.mu for p in cfg.phases)
    assert share == pytest.approx(left, rel=1e-6)
    assert cfg.to_attrs()["dp_method"] == "laplace"


def test_sample_one_shot_is_private_honest_and_fast_to_a_closed_form():
    """``pymc_dp.sample`` on a normal-mean model (n = 2000, epsilon 3): the one-shot strategy
    is chosen, the result carries its spend and method, and its mean lies within 3 of its own
    sds of the exact posterior mean over 6 seeds (never confidently wrong) while its sd is
    within [1, 3] of the exact posterior sd, except on a run whose convergence check fired
    (``dp_oneshot_converged`` 0: widened, and said so). That check is a chi-square test at
    0.99, so it fires on about 1 % of converged runs by design (measured on this model over
    40 seeds: mean chi-square 1.48, 1 of 40 past the limit): at most one of the 6 may."""
    x = np.clip(np.random.default_rng(5).normal(0.7, 1.0, 2000), -5, 5)
    model = _normal_mean_model(x)
    post_prec = x.size + 1 / 100.0
    post_mean, post_sd = x.sum() / post_prec, post_prec**-0.5
    flagged = 0
    for seed in range(6):
        with model, warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            idata = pymc_dp.sample(
                300, epsilon=3.0, delta=1e-6, chains=2, random_seed=seed, progressbar=False
            )
        assert idata.attrs["dp_method"] == "laplace"
        assert idata.attrs["dp_epsilon"] <= 3.0
        draws = np.asarray(idata["posterior"]["mu"].values)
        assert draws.shape == (2, 300)
        m, s = draws.mean(), draws.std()
        assert abs(m - post_mean) < 3 * s, (seed, m, s, post_mean)
        assert post_sd <= s * 1.1
        if idata.attrs["dp_oneshot_converged"]:
            assert s < 3 * post_sd, (seed, s, post_sd)
        else:
            flagged += 1
            assert "NOT CONVERGED" in idata.attrs["dp_convergence"]
        report = pymc_dp.privacy_report(idata, model=model)
        assert report.private and report.epsilon <= 3.0
        # the (epsilon, delta) line names the method; a flagged run's report says so first
        lines = str(report).splitlines()
        converged = bool(idata.attrs["dp_oneshot_converged"])
        assert ("NOT CONVERGED" in lines[0]) == (not converged)
        spend = next(line for line in lines if line.startswith("(epsilon, delta)"))
        assert "one-shot noise-aware private Laplace" in spend
    assert flagged <= 1, flagged
    # without the pre-sampling phases' accounting the report cannot vouch for the draws
    for attrs in (idata.attrs, idata["posterior"].attrs):
        attrs.pop("dp_presample_mu")
    with pytest.warns(UserWarning, match="NOT differentially private"):
        stripped = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert not stripped.private
    assert any("one-shot strategy's releases" in r for r in stripped.not_private_reasons)


def test_a_small_hierarchy_at_a_small_budget_is_flagged_not_crashed():
    """A non-centred 4-group hierarchy on 400 records at epsilon 3 (DP seed 2) stopped with
    numpy's "Matrix is not positive definite" (the warm start's covariance, conditioned past
    1e16) and then "Eigenvalues did not converge" (the prior's curvature at a far iterate).
    It must now run to its end and say that it has not converged."""
    rng = np.random.default_rng(0)
    g = rng.integers(4, size=400)
    y = rng.normal(1 + rng.normal(0, 0.5, 4)[g], 1.0)
    with pm.Model():
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=4)
        pm.Normal("y", mu + tau * z[g], pm.HalfNormal("sigma", 2), observed=y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pymc_dp.sample(
                epsilon=3, delta=1e-6, chains=2, random_seed=2, progressbar=False
            )
    assert "NOT CONVERGED" in idata.attrs["dp_convergence"]
    assert idata.attrs["dp_epsilon"] <= 3.0


def test_conservative_curvature_stays_below_the_hessian_when_the_noise_lifts_it():
    """The released curvature is the Hessian plus symmetric noise whose spectral norm is at
    most the damping ``newton_step`` is told (two noise levels). ``P_c`` must never exceed
    the Hessian (Loewner order): its covariance is then never narrower than the exact
    one. 400 random noises at the largest norm, in random directions; taking half the
    damping off (the code before) fails where the noise points up."""
    rng = np.random.default_rng(11)
    d = 4
    a = rng.normal(size=(d, d))
    hessian = a @ a.T + 4.0 * np.eye(d)
    level = 1.5  # the damping: the noise's spectral norm bound
    worst = []
    for _ in range(400):
        e = rng.normal(size=(d, d))
        e = 0.5 * (e + e.T)
        e *= level / np.max(np.abs(np.linalg.eigvalsh(e)))
        step = newton_step(
            anchor=np.zeros(d), released_grad=np.zeros(d), prior_grad=np.zeros(d),
            precision=hessian + e, damping=level * np.eye(d), basis=np.eye(d),
            data=np.ones(d, dtype=bool), noise_std=0.1, prior_precision_floor=1e-3,
        )  # fmt: skip
        worst.append(np.linalg.eigvalsh(hessian - np.linalg.inv(step.cov_c)).min())
    assert min(worst) >= -1e-9
    # and not needlessly wide: with noise of that norm the bound is attained in some draws
    assert min(worst) < 0.5 * level


def test_a_curvature_dominated_by_its_noise_is_reported_as_wide():
    """``curvature_widening`` is the worst coordinate's ``sqrt((P_c^-1)_jj / (P^-1)_jj)``: a
    damping of 4/5 of a diagonal curvature widens that coordinate's sd sqrt(5) times; with
    none it is 1."""
    d = 3
    p = np.diag([10.0, 5.0, 2.0])

    def steps(damping):
        kw = dict(
            released_grad=np.zeros(d), prior_grad=np.zeros(d), precision=p, damping=damping,
            basis=np.eye(d), data=np.ones(d, dtype=bool), noise_std=0.01,
            prior_precision_floor=1e-6,
        )  # fmt: skip
        first = newton_step(anchor=np.zeros(d), **kw)
        return first, newton_step(anchor=first.mean, **kw)

    assert noise_aware_laplace(*steps(0.0), np.ones(d, dtype=bool)).curvature_widening == (
        pytest.approx(1.0)
    )
    res = noise_aware_laplace(*steps(np.diag([0.0, 0.0, 1.6])), np.ones(d, dtype=bool))
    assert res.curvature_widening == pytest.approx(np.sqrt(5.0), rel=1e-9)


# -- the released curvature's noise, pushed through the Newton steps -------------------------------
def _sym(rng, entry_std):
    """A symmetric matrix with independent entries of sd ``entry_std`` (upper triangle)."""
    e = np.triu(rng.normal(size=entry_std.shape) * entry_std)
    return e + np.triu(e, 1).T


def test_curvature_step_cov_is_the_covariance_of_the_curvature_noise_effect():
    """``curvature_step_cov`` against the sample covariance of ``P^-1 B E B^T s`` over
    20 000 symmetric noises ``E`` (entry sds mixed: kept entries and thresholded ones);
    tolerance 5 Monte Carlo sds per entry."""
    rng = np.random.default_rng(11)
    d = 4
    a = rng.normal(size=(d, d))
    prec = a @ a.T + d * np.eye(d)
    basis = np.linalg.cholesky(prec)
    cov_p = np.linalg.inv(prec)
    entry_std = np.full((d, d), 0.3)
    entry_std[0, 2] = entry_std[2, 0] = 0.9
    entry_std[1, 3] = entry_std[3, 1] = 0.0
    step = rng.normal(size=d) * 3.0
    want = curvature_step_cov(step, cov_p, basis, entry_std)
    k = 20_000
    draws = np.array([cov_p @ basis @ _sym(rng, entry_std) @ basis.T @ step for _ in range(k)])
    got = np.cov(draws.T)
    mc_sd = np.sqrt((np.outer(np.diag(want), np.diag(want)) + want**2) / k)
    assert np.all(np.abs(got - want) < 5 * mc_sd), (got - want) / mc_sd


def test_a_noisy_curvature_far_from_the_mode_is_covered_where_the_check_passes():
    """An anchor 20 posterior sds from the mode and a released curvature with noise (entry
    sd 0.3 in its whitened coordinates; gradient noise sd 3): the steps' ends are off by
    the curvature's relative error times the distance. About half the runs are flagged by
    the steps' check (and widened); among those that pass it, which a user trusts, the mode
    lies beyond 2 of the result's sds in at most 5 % of (run, coordinate) pairs (plus 2
    binomial sds) with the curvature's noise in the result (`curvature_step_cov`), and in
    over 7 % without it (measured 10 %)."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic(seed=6)
    d = 3
    basis = np.linalg.cholesky(prec)
    entry_std = np.full((d, d), 0.3)
    data = np.ones(d, dtype=bool)
    kw = dict(curvature_entry_std=entry_std, curvature_basis=basis)
    beyond, bare_beyond, passed = 0, 0, 0
    for _ in range(600):
        u = rng.normal(size=d)
        anchor = exact_mean + np.linalg.solve(basis.T, 20.0 * u / np.linalg.norm(u))
        curvature = prec + basis @ _sym(rng, entry_std) @ basis.T
        noise1, noise2 = rng.normal(size=d) * 3.0, rng.normal(size=d) * 3.0
        out = []
        for extra in (kw, {}):
            first = _step(anchor, noise1, fisher, m, prior_prec, curvature, basis, 3.0, **extra)
            second = _step(
                first.mean, noise2, fisher, m, prior_prec, curvature, basis, 3.0, **extra
            )
            res = noise_aware_laplace(first, second, data)
            out.append((res.converged, np.abs(res.mean - exact_mean) / np.sqrt(np.diag(res.cov))))
        if not out[0][0]:
            continue
        passed += 1
        beyond += int(np.sum(out[0][1] > 2))
        bare_beyond += int(np.sum(out[1][1] > 2))
    pairs = passed * d
    assert pairs > 600, passed
    assert beyond / pairs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / pairs), beyond / pairs
    assert bare_beyond / pairs > 0.07, bare_beyond / pairs


def test_zeroed_damping_is_the_row_norm_of_the_thresholded_entries_sds():
    """Closed form: per row the root sum of squares of its thresholded entries' sds (those
    ``thr / sqrt 3`` times the noise's), none from the kept entries or the diagonal, mapped
    by the release's whitening ``B diag(r) B^T``."""
    sd = 0.35
    t = np.full((3, 3), sd)
    t[0, 1] = t[1, 0] = t[0, 2] = t[2, 0] = 3.0 / np.sqrt(3.0) * sd  # zeroed
    basis = np.array([[2.0, 0.0, 0.0], [0.5, 1.0, 0.0], [0.1, -0.3, 1.5]])
    r = np.array([np.sqrt(2.0), 1.0, 1.0]) * np.sqrt(3.0) * sd
    assert np.allclose(zeroed_damping(t, basis), basis @ np.diag(r) @ basis.T, atol=1e-12)
    assert np.all(zeroed_damping(np.full((3, 3), sd), basis) == 0.0)


def _two_coordinate_zeroed_run(distance, entry_std=None, curvature=None):
    """Helper 234's closed form (the sixth sweep's log-linear cell in two coordinates): the
    Hessian ``H = [[1, -0.9], [-0.9, 1]]`` (whitened; eigenvalue 0.1 along ``(1, 1)``), its
    release with entry noise sd 0.35: the off-diagonal -0.9 is below the 3-sd threshold
    (1.05), zeroed, and the released ``P = I`` is 10 times ``H`` along ``(1, 1)``. Two steps
    with exact gradients from an anchor ``distance`` out along it (the mode at 0): each goes
    a tenth of the way (``m1 = 0.9 a``, ``m2 = 0.81 a``)."""
    sd, floor = 0.35, 1e-3
    hessian = np.array([[1.0, -0.9], [-0.9, 1.0]])
    anchor = -distance * np.ones(2) / np.sqrt(2.0)
    data = np.ones(2, dtype=bool)
    if entry_std is None:
        entry_std = np.full((2, 2), sd)
        entry_std[0, 1] = entry_std[1, 0] = 3.0 / np.sqrt(3.0) * sd
    kw = dict(
        prior_grad=np.zeros(2), precision=np.eye(2) if curvature is None else curvature,
        damping=2.0 * sd * np.eye(2), basis=np.eye(2), data=data, noise_std=2.0,
        prior_precision_floor=floor, curvature_entry_std=entry_std, curvature_basis=np.eye(2),
    )  # fmt: skip
    first = newton_step(anchor=anchor, released_grad=-hessian @ anchor, **kw)
    second = newton_step(anchor=first.mean, released_grad=-hessian @ first.mean, **kw)
    assert np.allclose(first.mean, (0.9 if curvature is None else 0.0) * anchor)
    return first, second, noise_aware_laplace(first, second, data), anchor, floor


def test_a_thresholded_curvature_that_overstates_the_hessian_is_flagged():
    """Closed form (`_two_coordinate_zeroed_run`, 100 units out). The two ends agree within
    their noise and the result is off by ``0.855 a``, beyond 2 of its sds in both
    coordinates, with ``curvature_widening`` below `CURVATURE_WIDENING_WARN` (unwarned
    before helper 234). With the zeroed entry's possible truth in the damping
    (`zeroed_damping`, sd ``sqrt 3 * 0.35`` per row) ``P_c`` falls to the floor (``1 - 0.7 -
    0.606 < 0``): ``zeroed_widening`` is ``sqrt(1 / 1e-3)`` (``cov_zeroed`` 300 times
    ``cov_c``, which does not cover either end's shortfall). The steps are long (10 and 9
    units, the result's sds 5.2; the first step's chi-square 25 on 2): the zeroed entry's
    first-order error over them widens the result 2.03 times beyond its other parts
    (`zeroed_step_widening`), and `zeroed_in_doubt` flags it.
    The same Hessian released with the entry kept: nothing zeroed, ``zeroed_widening`` equals
    ``curvature_widening``, no flag, and the result covers the mode."""
    from pymc_dp.auto.oneshot import CURVATURE_WIDENING_WARN, zeroed_in_doubt

    first, second, res, anchor, floor = _two_coordinate_zeroed_run(100.0)
    assert np.allclose(second.mean, 0.81 * anchor)
    assert res.converged
    assert np.all(np.abs(res.mean) > 2.0 * np.sqrt(np.diag(res.cov)))  # confidently off
    assert res.curvature_widening < CURVATURE_WIDENING_WARN
    assert res.zeroed_widening == pytest.approx(np.sqrt(1.0 / floor), rel=1e-9)
    assert res.zeroed_step_widening > CURVATURE_WIDENING_WARN
    assert zeroed_in_doubt(res.zeroed_widening, res.zeroed_step_widening)
    for end in (first, second):
        assert np.all(np.abs(end.mean) > 2.0 * np.sqrt(np.diag(end.cov_c)))
        assert np.all(np.diag(end.cov_zeroed) > 100.0 * np.diag(end.cov_c))
    hessian = np.array([[1.0, -0.9], [-0.9, 1.0]])
    _, kept_second, kept, _, _ = _two_coordinate_zeroed_run(
        100.0, entry_std=np.full((2, 2), 0.35), curvature=hessian
    )
    assert kept_second.cov_zeroed is None and kept_second.zeroed_cov is None
    assert kept.zeroed_widening == kept.curvature_widening
    assert kept.zeroed_step_widening == 1.0
    assert not zeroed_in_doubt(kept.zeroed_widening, kept.zeroed_step_widening)
    assert np.all(np.abs(kept.mean) < 2.0 * np.sqrt(np.diag(kept.cov)))


def test_a_landed_step_with_thresholded_entries_is_not_flagged():
    """Helper 240: the same released curvature (``zeroed_widening`` ``sqrt(1 / 1e-3)``, the
    old check's flag) with the anchor 1 unit from the mode: the steps are 0.1 and 0.09 units
    (a twentieth of the result's sds), the zeroed entry's first-order error over them is
    3e-4 of the rest of the result's variance, the result is 0.26 of its sds from the mode, and
    `zeroed_in_doubt` does not flag it (the sweeps' epsilon-10 runs that landed: own sds
    0.41-0.92, flagged before). With the new condition left out (``zeroed_step_widening``
    not given) the old check flags it."""
    from pymc_dp.auto.oneshot import CURVATURE_WIDENING_WARN, zeroed_in_doubt

    _, _, res, _, floor = _two_coordinate_zeroed_run(1.0)
    assert res.converged
    assert np.all(np.abs(res.mean) < 2.0 * np.sqrt(np.diag(res.cov)))
    assert res.zeroed_widening == pytest.approx(np.sqrt(1.0 / floor), rel=1e-9)
    assert res.curvature_widening < CURVATURE_WIDENING_WARN
    assert 1.0 < res.zeroed_step_widening < 1.001
    assert not zeroed_in_doubt(res.zeroed_widening, res.zeroed_step_widening)
    assert zeroed_in_doubt(res.zeroed_widening)  # the old check


@pytest.mark.xfail(strict=True, reason="a blind spot of zeroed_step_widening (helper 240)")
def test_a_noise_sized_step_far_from_the_mode_is_flagged():
    """The blind spot of `zeroed_step_widening` (helper 240), kept as a strict xfail: the same
    case 30 units out. The steps (3 and 2.7 units) are within their release noise (sd 2 a
    coordinate: the first step's chi-square 2.25 on 2), so nothing released tells them from
    a landing's, and the first-order error over them widens the result 1.13 times; but the
    curvature is 10 times the Hessian along them and the result is 6.7 of its sds off.
    Flagged by the old check (``zeroed_widening`` alone), not by the new one; in this case
    the new one flags from about 100 units out, where the steps are beyond their noise."""
    from pymc_dp.auto.oneshot import zeroed_in_doubt

    _, _, res, _, _ = _two_coordinate_zeroed_run(30.0)
    assert np.all(np.abs(res.mean) > 2.0 * np.sqrt(np.diag(res.cov)))
    assert zeroed_in_doubt(res.zeroed_widening, res.zeroed_step_widening)


def test_zeroed_step_widening_is_the_zeroed_part_over_the_rest():
    """Closed form: ``sqrt((R + Z) / R)`` per coordinate, its maximum, ``Z`` the thresholded
    entries' part of the result's covariance (``2 (w1 Z1 w1^T + w2 Z2 w2^T)``, or ``2 (Z1 +
    Z2)`` without weights) and ``R`` the covariance less its whole curvature part (the same
    with ``curvature_cov``); 1 where nothing was thresholded."""
    from pymc_dp.auto.oneshot import NewtonStep, zeroed_step_widening

    def step(z, c):
        zero = np.zeros((2, 2))
        return NewtonStep(
            zero[0], zero[0], zero, zero, np.eye(2), np.diag(c), zeroed_cov=np.diag(z)
        )

    first, second = step([1.0, 0.5], [2.0, 1.0]), step([0.5, 0.25], [1.0, 0.5])
    cov = np.diag([10.0, 4.0])
    rest = np.array([10.0 - 2.0 * 3.0, 4.0 - 2.0 * 1.5])
    want = np.max(np.sqrt((rest + 2.0 * np.array([1.5, 0.75])) / rest))
    assert zeroed_step_widening(first, second, None, cov) == pytest.approx(want, rel=1e-12)
    half = 0.5 * np.eye(2)
    rest_w = np.array([10.0 - 0.5 * 3.0, 4.0 - 0.5 * 1.5])
    want_w = np.max(np.sqrt((rest_w + 0.5 * np.array([1.5, 0.75])) / rest_w))
    got = zeroed_step_widening(first, second, (half, half), cov)
    assert got == pytest.approx(want_w, rel=1e-12)
    first.zeroed_cov = None
    assert zeroed_step_widening(first, second, None, cov) == 1.0


def test_the_check_counts_the_curvature_error_of_each_end():
    """Two ends of the mode with independent errors ``N(0, n_j + c_j)`` (release noise and
    the released curvature's error over each step, `newton_step`'s ``noise_cov`` and
    ``curvature_cov``), the first end's curvature error nine times its noise (a first step
    from far off), the anchor beyond its noise (the check decides): the steps' check passes
    in 99 % of 4000 runs (3 binomial sds), as where the ends differ by their release noise
    alone. With the release noise alone in the check (the earlier version) the pass rate
    here is 44 % (a chi-square of 3 below 2.06): ends a noisy curvature set apart were read
    as a warm start that had not converged, and widened."""
    rng = np.random.default_rng(11)
    d = 3
    eye = np.eye(d)
    n1 = n2 = eye
    c1, c2 = 9.0 * eye, np.zeros((d, d))
    mode = np.array([0.5, -1.0, 2.0])
    runs, passed = 4000, 0
    for _ in range(runs):
        m1 = mode + rng.multivariate_normal(np.zeros(d), n1 + c1)
        m2 = mode + rng.multivariate_normal(np.zeros(d), n2 + c2)
        first = NewtonStep(m1, np.full(d, 10.0), n1, eye, eye, c1)
        second = NewtonStep(m2, m2 - m1, n2, eye, eye, c2)
        res = noise_aware_laplace(first, second, np.ones(d, dtype=bool))
        passed += res.converged
    sd = np.sqrt(0.99 * 0.01 / runs)
    assert abs(passed / runs - 0.99) < 3 * sd, passed / runs


def test_ends_disagreeing_at_the_mode_are_widened_by_their_difference_not_the_path():
    """The anchor at the mode and the curvature exact: where the two ends disagree beyond
    their noise by chance (about 1 % of the runs), the first step is within its noise and
    no series of steps is there to extrapolate. The result is flagged, its mean the
    combination of the two ends, its sds widened by their difference only, not by the warm
    start's path from a far start (which an unconverged run's would be: 25-90 times NUTS's
    sds measured on bench_auto's logistic3, epsilon 10, DP seed 19)."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic(seed=7)
    d = 3
    basis = np.linalg.cholesky(prec)
    data = np.ones(d, dtype=bool)
    path = exact_mean + np.linspace(40.0, 0.5, 8)[:, None] * np.ones(d)
    limit = stats.chi2.ppf(0.99, d)
    for _ in range(5000):
        anchor = exact_mean + rng.normal(size=d) * 0.01
        first = _step(anchor, rng.normal(size=d) * 0.4, fisher, m, prior_prec, prec, basis)
        second = _step(first.mean, rng.normal(size=d) * 0.4, fisher, m, prior_prec, prec, basis)
        res = noise_aware_laplace(first, second, data, path=path)
        if res.step_chi2 > limit:
            break
    else:
        pytest.fail("no chance disagreement in 5000 draws")
    assert not res.converged
    np.testing.assert_allclose(
        res.mean, first.mean + first.noise_cov @ np.linalg.pinv(
            first.noise_cov + second.noise_cov) @ (second.mean - first.mean), rtol=1e-10
    )  # fmt: skip
    narrow = np.sqrt(np.diag(second.cov_c + res.noise_cov))
    assert np.all(np.sqrt(np.diag(res.cov)) < 3 * narrow)
    assert np.all(np.abs(res.mean - exact_mean) < 2 * np.sqrt(np.diag(res.cov)))


# -- the penalty chain's proposal off the target's mode (`configure._off_centre`) ------------


def _stationary_acceptance(delta: np.ndarray, sigma: float, rng, iterations: int) -> float:
    """Acceptance of an independence penalty chain on ``N(0, I)`` with proposal
    ``N(delta, I)``, the test's log ratio plus ``N(-sigma^2 / 2, sigma^2)`` (the penalty
    test of Yildirim & Ermis 2019), started in stationarity."""
    d = delta.size
    x = rng.normal(size=d)

    def logw(v):  # log target - log proposal
        return -0.5 * v @ v + 0.5 * (v - delta) @ (v - delta)

    accepted = 0
    for _ in range(iterations):
        y = delta + rng.normal(size=d)
        noisy = logw(y) - logw(x) + sigma * rng.normal() - 0.5 * sigma**2
        if np.log(rng.uniform()) < noisy:
            x, accepted = y, accepted + 1
    return accepted / iterations


@pytest.mark.parametrize("held, curvature_var, sigma", [(1.2, 0.0, 0.8), (0.0, 0.5, 1.5)])
def test_off_centre_acceptance_matches_an_independence_chain_off_its_target(
    held, curvature_var, sigma
):
    """`_off_centre`'s acceptance ``2 Phi(-sqrt(sigma^2 + 2 delta^2) / 2)`` against a
    simulated independence penalty chain whose proposal sits off the target's mode: by the
    damping's held-back part ``h``, or by the curvature's error (``C = c I``: an offset of
    squared length ``tr(P C)``, its expectation, as the formula takes it). Tolerance from the
    simulation's binomial standard error (4 sds); the formula without the offset is outside
    it."""
    from pymc_dp.auto.configure import _off_centre
    from pymc_dp.auto.oneshot import NewtonStep
    from pymc_dp.auto.predict import Prediction

    d, rng = 3, np.random.default_rng(11)
    precision = np.eye(d)
    centre = np.zeros(d)
    mean = np.array([held, 0.0, 0.0])
    step = NewtonStep(mean, mean, np.zeros((d, d)), np.eye(d), precision, curvature_var * np.eye(d))
    base = Prediction("independent", 1000, 1.0, sigma, 2 * stats.norm.cdf(-sigma / 2), 0.0)
    pred, _, offset = _off_centre(base, base, step, centre)
    delta = mean - centre + np.sqrt(curvature_var) * np.ones(d)
    n = 40_000
    measured = _stationary_acceptance(delta, sigma, rng, n)
    se = np.sqrt(pred.accept * (1 - pred.accept) / n)
    assert offset == pytest.approx(np.sqrt(held**2 + d * curvature_var))
    assert abs(measured - pred.accept) < 4 * se, (measured, pred.accept, se)
    assert abs(measured - base.accept) > 4 * se  # without the offset: predicted wrong
    assert pred.ess == pytest.approx(pred.iterations * pred.accept)


# -- the free block: a recentred hierarchy's loc and log scale from their exact conditional ----
_GROUP_EFFECTS = np.array([0.2, 1.4, 0.9, 1.1, 0.5, 1.8])


def _hierarchy_log_prior(y: np.ndarray) -> float:
    """Log prior of ``y = (loc, log scale, a_1..a_6)``: loc ~ N(0, 5^2), scale ~ HalfNormal(2)
    (with its log's Jacobian), a_g ~ N(loc, scale^2)."""
    loc, log_s, a = y[0], y[1], y[2:]
    s = np.exp(log_s)
    return float(
        -0.5 * (loc / 5.0) ** 2
        - 0.5 * (s / 2.0) ** 2
        + log_s
        - a.size * log_s
        - 0.5 * np.sum(((a - loc) / s) ** 2)
    )


def test_free_block_draws_the_exact_conditional_where_the_gaussian_is_off():
    """Given six group effects, the conditional of a hierarchy's (loc, log scale) is skewed: a
    Gaussian at its mode with its curvature puts the mean of the scale at 0.79 of the exact
    one (quadrature on a fine grid) and the mean of ``z_1 = (a_1 - loc) / scale`` 1.2 times
    it. `FreeBlock` starts each draw at that Gaussian and moves the free block by Metropolis
    steps on the exact conditional: its means must agree with the quadrature within Monte
    Carlo error (4 sds), where the Gaussian's are off by more than 10."""
    from scipy import optimize

    from pymc_dp.step_methods.laplace import FreeBlock

    a = _GROUP_EFFECTS
    loc, log_s = np.meshgrid(np.linspace(-3, 5, 801), np.linspace(-4, 2.5, 801), indexing="ij")
    s = np.exp(log_s)
    lp = -0.5 * (loc / 5) ** 2 - 0.5 * (s / 2) ** 2 + log_s - a.size * log_s
    lp = lp - 0.5 * sum(((ai - loc) / s) ** 2 for ai in a)
    w = np.exp(lp - lp.max())
    w /= w.sum()
    exact = np.array([np.sum(w * s), np.sum(w * (a[0] - loc) / s)])

    def neg(x):
        return -_hierarchy_log_prior(np.r_[x, a])

    mode = optimize.minimize(neg, [1.0, -0.5]).x
    h, e = np.zeros((2, 2)), 1e-4
    for i in range(2):
        for j in range(2):
            di, dj = np.eye(2)[i] * e, np.eye(2)[j] * e
            h[i, j] = (
                neg(mode + di + dj) - neg(mode + di - dj) - neg(mode - di + dj)
                + neg(mode - di - dj)
            ) / (4 * e * e)  # fmt: skip
    d = 2 + a.size
    mean, cov = np.r_[mode, a], np.eye(d) * 1e-12
    cov[:2, :2] = np.linalg.inv(h)
    free = np.r_[True, True, np.zeros(a.size, dtype=bool)]
    block = FreeBlock(free, _hierarchy_log_prior, cov)
    rng = np.random.default_rng(3)
    draws = 2000
    gauss = mean + (np.linalg.cholesky(cov) @ rng.normal(size=(d, draws))).T
    cond = np.array([block.draw(y, rng) for y in gauss])

    def summary(ys):
        s, z = np.exp(ys[:, 1]), (a[0] - ys[:, 0]) / np.exp(ys[:, 1])
        vals = np.column_stack([s, z])
        return vals.mean(axis=0), vals.std(axis=0) / np.sqrt(draws)

    m_c, se_c = summary(cond)
    m_g, se_g = summary(gauss)
    assert np.all(np.abs(m_c - exact) < 4 * se_c), (m_c, exact, se_c)
    assert np.all(np.abs(m_g - exact) > 10 * se_g), (m_g, exact, se_g)
    assert np.all(cond[:, 2:] == gauss[:, 2:])  # the data's coordinates are left as drawn


def test_one_shot_on_a_recentred_hierarchy_draws_its_free_block_from_the_prior():
    """The one-shot strategy on a non-centred hierarchy hands the draws the coordinates no
    record reads (loc and log scale), with the log prior in its coordinates; a regression
    has none."""
    rng = np.random.default_rng(0)
    g = rng.integers(4, size=2000)
    y = rng.normal(1 + rng.normal(0, 0.5, 4)[g], 1.0)
    with pm.Model() as hier:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=4)
        pm.Normal("y", mu + tau * z[g], pm.HalfNormal("sigma", 2), observed=y)
    plan = auto_configure(
        hier,
        epsilon=10,
        delta=1e-6,
        chains=2,
        draws=None,
        tune=None,
        rng=np.random.default_rng(1),
        method="laplace",
    )
    block = plan.free_block
    assert block is not None and block.free.sum() == 2 and block.free.size == 7
    point = plan.draws_mean
    # the log prior is the model's in the recentred coordinates: moving a free coordinate
    # changes it, while the record functions are never asked (data-free)
    moved = point.copy()
    moved[np.flatnonzero(block.free)[0]] += 0.1
    assert np.isfinite(block.log_prior(point)) and block.log_prior(moved) != block.log_prior(point)
    flat = _normal_mean_model(np.random.default_rng(2).normal(size=200))
    plan = auto_configure(
        flat, epsilon=10, delta=1e-6, chains=2, draws=None, tune=None, rng=np.random.default_rng(1)
    )
    assert plan.free_block is None


def test_a_widened_one_shot_result_keeps_its_scale_gaussian():
    """Where the one-shot result was widened (its ends disagree, or the released curvature's
    noise dominates its intervals) the group effects' draws are wider than their posterior,
    and the conditional prior would read their spread as a large scale: no free block then
    (measured on a real-data GLMM: the scale 2.05 of its own sds above the NUTS mean with
    it). The same model at epsilon 10 gets one (the test above). At this budget the warm
    start's steps stop early on two of the three seeds (every histogram noise only): the
    last iterate is then the anchor (the run failed on a missing anchor before)."""
    rng = np.random.default_rng(0)
    g = rng.integers(4, size=300)
    y = rng.normal(1 + rng.normal(0, 0.5, 4)[g], 1.0)
    with pm.Model() as hier:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=4)
        pm.Normal("y", mu + tau * z[g], pm.HalfNormal("sigma", 2), observed=y)
    seen = []
    for seed in range(3):
        plan = auto_configure(
            hier, epsilon=0.5, delta=1e-6, chains=2, draws=None, tune=None,
            rng=np.random.default_rng(seed), method="laplace",
        )  # fmt: skip
        widened = (not plan.oneshot.converged) or plan.oneshot.curvature_widening > 2.0
        seen.append(widened)
        assert (plan.free_block is None) == widened
    assert any(seen)  # the budget is low enough that the result is widened


def test_a_curvature_far_above_the_hessian_is_scaled_by_the_secants():
    """A normal mean whose records spread 10 times the model's sigma (n = 2000, known sigma
    1, data sd 10, mean 3: the exact posterior N(sum x / (n + 0.01), 1 / (n + 0.01))). The
    warm start's curvature, the records' empirical Fisher information, is 100 times the
    Hessian: without the secants' scale (`pymc_dp.kernels.warmstart.secant_ratio`) ten
    steps from 0 crawled 1 % of the way each and the one-shot result came out 124-128
    posterior sds off with sds 59-63 times the posterior's (4 DP seeds, epsilon 10, own
    error 1.97-2.17). With it the mean lies within 3 of its own sds (the honesty the result
    claims; a Gaussian's 0.3 % per seed) and its sd within 3 posterior sds (measured:
    1.1-1.7 posterior sds off, sds 1.1-1.6 times the posterior's)."""
    x = 3.0 + 10.0 * np.random.default_rng(5).normal(size=2000)
    model = _normal_mean_model(x)
    post_prec = x.size + 1 / 100.0
    post_mean, post_sd = x.sum() / post_prec, post_prec**-0.5
    for seed in (0, 3):
        draws = laplace_draws(model, "mu", seed)
        m, s = draws.mean(), draws.std()
        assert abs(m - post_mean) < 3 * s, (seed, (m - post_mean) / post_sd, s / post_sd)
        assert s < 3 * post_sd, (seed, (m - post_mean) / post_sd, s / post_sd)


def test_steps_that_barely_contract_are_widened_by_the_prior_where_they_cannot_bound_it():
    """A released curvature 1000 times the Hessian (every direction: each Newton step goes
    0.1 % of the way) and anchors 1 unit (3-8 posterior sds, 0.3 prior sds) from the mode.
    The steps disagree beyond their noise (flagged), but their contraction's upper bound
    ``a+`` is 1 or more: nothing released bounds the distance left (`noise_aware_laplace`).
    With the prior's covariance the mode lies beyond 2 of the result's sds in at most 5 %
    of the (run, coordinate) pairs (plus 2 binomial sds); without it (the widening by ten
    last steps alone, as before) in over half of them (measured 97 %)."""
    rng, fisher, m, prior_prec, prec, exact_mean = _quadratic(seed=8)
    d = 3
    curvature = 1000.0 * prec
    basis = np.linalg.cholesky(curvature)
    data = np.ones(d, dtype=bool)
    prior_cov = np.linalg.inv(prior_prec)
    for std in (1e-3, 1e-2):
        beyond, bare, pairs, flagged = 0, 0, 0, 0
        for _ in range(300):
            u = rng.normal(size=d)
            anchor = exact_mean + u / np.linalg.norm(u)
            kw = dict(fisher=fisher, m=m, prior_prec=prior_prec, curvature=curvature)
            first = _step(anchor, rng.normal(size=d) * std, basis=basis, std=std, **kw)
            second = _step(first.mean, rng.normal(size=d) * std, basis=basis, std=std, **kw)
            res = noise_aware_laplace(first, second, data, prior_cov=prior_cov)
            flagged += int(not res.converged)
            beyond += int(np.sum(np.abs(res.mean - exact_mean) > 2 * np.sqrt(np.diag(res.cov))))
            res = noise_aware_laplace(first, second, data)
            bare += int(np.sum(np.abs(res.mean - exact_mean) > 2 * np.sqrt(np.diag(res.cov))))
            pairs += d
        assert flagged > 290, (std, flagged)
        assert beyond / pairs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / pairs), (std, beyond / pairs)
        assert bare / pairs > 0.5, (std, bare / pairs)


def test_ends_whose_contraction_is_undetermined_are_widened_by_their_difference_not_the_prior():
    """Where the first step is beyond its noise and the ends disagree beyond theirs, but the
    steps' contraction ``a`` is within 2 noise sds of both 0 (a Newton step that reached
    the mode) and 1 (a crawl), and the drift test finds no crawl, the result is the ends'
    combination widened by their difference and the first step, not the prior (measured:
    bench_auto's logistic3 at epsilon 1, DP seed 2, 31-61 NUTS sds off with sds 300-345
    times NUTS's before). Curvatures 1, 2 and 4 times the Hessian (contractions 0, 0.5,
    0.75), anchors 1, 2 and 4 posterior sds off, 3000 release seeds each: among the runs
    of that kind (measured 19), the mode within 2 of the result's sds in at least 95 % of
    the pairs less 2 binomial sds (measured 2 of 57 beyond), and no sd more than 5 times
    the posterior's (measured at most 2.83; before, with the prior's covariance added,
    18-27 in the five widest)."""
    rng, fisher, m, prior_prec, prec, mode = _quadratic(seed=3)
    data = np.ones(3, dtype=bool)
    prior_cov = np.linalg.inv(prior_prec)
    post_sd = np.sqrt(np.diag(np.linalg.inv(prec)))
    limit = stats.chi2.ppf(0.99, 3)
    runs = beyond = 0
    ratios = []
    root = np.linalg.cholesky(prec).T
    for c in (1.0, 2.0, 4.0):
        curvature = c * prec
        chol = np.linalg.cholesky(curvature)
        for off in (1.0, 2.0, 4.0):
            for _ in range(3000):
                u = rng.normal(size=3)
                anchor = mode + np.linalg.solve(root, u) * off / np.linalg.norm(u)
                kw = dict(fisher=fisher, m=m, prior_prec=prior_prec, curvature=curvature)
                first = _step(anchor, rng.normal(size=3) * 0.4, basis=chol, **kw)
                second = _step(first.mean, rng.normal(size=3) * 0.4, basis=chol, **kw)
                ps1 = first.precision @ first.step
                length = float(first.step @ ps1)
                a = float((second.mean - first.mean) @ ps1) / length
                a_sd = float(np.sqrt(ps1 @ (first.noise_cov + second.noise_cov) @ ps1)) / length
                moving = first.step @ np.linalg.solve(first.noise_cov, first.step) > limit
                res = noise_aware_laplace(first, second, data, prior_cov=prior_cov)
                if res.converged or not moving or not (a - 2 * a_sd <= 0 <= a + 2 * a_sd - 1):
                    continue
                runs += 1
                sd = np.sqrt(np.diag(res.cov))
                beyond += int(np.sum(np.abs(res.mean - mode) > 2 * sd))
                ratios.append(float(np.max(sd / post_sd)))
    pairs = 3 * runs
    assert runs >= 10, runs
    assert beyond / pairs <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / pairs), (beyond, pairs)
    assert max(ratios) < 5.0, sorted(ratios)[-5:]
