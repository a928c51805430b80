"""DPHMC: the noisy leapfrog kernel, exactness with clipping inactive, privacy accounting,
reproducibility, pickling and bad input."""

from __future__ import annotations

import pickle

import arviz as az
import cloudpickle
import numpy as np
import pymc as pm
import pytest
from conftest import (
    assert_matches_distribution,
    check_no_clipping_and_noise_on,
    exact_dphmc,
    inverse_gamma_variance_model,
    normal_mean_model,
    posterior_array,
)
from scipy import stats
from threadpoolctl import threadpool_limits

import pymc_dp
from pymc_dp.accounting import gaussian_epsilon, gaussian_mu_for_epsilon
from pymc_dp.kernels.hmc import (
    DiagonalMassAdaptation,
    DualAveraging,
    HaltonSequence,
    _halton_engine,
    gradient_noise_std,
    kinetic_energy,
    noisy_leapfrog,
    warmup_windows,
)
from pymc_dp.records import build_record_functions
from pymc_dp.step_methods.hmc import calibrate_dphmc_noise

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


@pytest.fixture(autouse=True, scope="module")
def _single_threaded_blas():
    """Multi-threaded OpenBLAS on tiny solves (MvNormal, 10 x 100) is up to 200x slower when
    the cores are busy; one thread keeps these tests fast and their timing stable."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# -- the pure kernel ------------------------------------------------------------------------------


def _gaussian_target(d: int = 5, seed: int = 0):
    """log pi(q) = -q^T A q / 2 with a fixed SPD A; returns (A, grad_fn, energy(q, p, inv_m))."""
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(d, d))
    A = B @ B.T / d + np.eye(d)

    def grad_fn(q):
        return -A @ q

    def energy(q, p, inv_mass):
        return 0.5 * q @ A @ q + kinetic_energy(p, inv_mass)

    return A, grad_fn, energy


def test_leapfrog_without_noise_is_reversible():
    _, grad_fn, _ = _gaussian_target()
    rng = np.random.default_rng(1)
    q, p = rng.normal(size=5), rng.normal(size=5)
    inv_mass = rng.uniform(0.5, 2.0, size=5)
    fwd = noisy_leapfrog(q, p, 0.13, 25, grad_fn, inv_mass, 0.0, None)
    back = noisy_leapfrog(fwd.q, -fwd.p, 0.13, 25, grad_fn, inv_mass, 0.0, None)
    assert fwd.n_grad == 26
    np.testing.assert_allclose(back.q, q, rtol=0, atol=1e-10)
    np.testing.assert_allclose(-back.p, p, rtol=0, atol=1e-10)
    assert np.linalg.norm(fwd.q - q) > 0.1  # it did move


def test_leapfrog_energy_error_is_second_order():
    _, grad_fn, energy = _gaussian_target()
    rng = np.random.default_rng(2)
    q, p = rng.normal(size=5), rng.normal(size=5)
    inv_mass = np.ones(5)
    etas = np.array([0.08, 0.04, 0.02, 0.01, 0.005])
    errors = []
    for eta in etas:
        steps = int(round(1.2 / eta))  # same integration time for every step size
        r = noisy_leapfrog(q, p, eta, steps, grad_fn, inv_mass, 0.0, None)
        errors.append(abs(energy(r.q, r.p, inv_mass) - energy(q, p, inv_mass)))
    errors = np.array(errors)
    slope = np.polyfit(np.log(etas), np.log(errors), 1)[0]
    assert 1.8 < slope < 2.2, (slope, errors)
    np.testing.assert_allclose(errors[:-1] / errors[1:], 4.0, rtol=0.15)


def test_leapfrog_adds_fresh_noise_at_each_of_the_l_plus_1_gradients():
    """With a zero gradient the trajectory is a known linear function of the L + 1 draws."""
    d, eta, sigma, L = 3, 0.3, 2.0, 4
    q, p = np.zeros(d), np.ones(d)
    inv_mass = np.array([1.0, 2.0, 0.5])
    r = noisy_leapfrog(
        q, p, eta, L, lambda x: np.zeros(d), inv_mass, sigma, np.random.default_rng(7)
    )
    xi = sigma * np.random.default_rng(7).standard_normal((L + 1, d))
    weights = np.r_[0.5, np.ones(L - 1), 0.5] * eta  # half, full, ..., full, half steps
    np.testing.assert_allclose(r.p, p + weights @ xi, rtol=1e-12)
    pos = q.copy()
    mom = p + 0.5 * eta * xi[0]
    for i in range(L):
        pos = pos + eta * inv_mass * mom
        if i < L - 1:
            mom = mom + eta * xi[i + 1]
    np.testing.assert_allclose(r.q, pos, rtol=1e-12)
    assert r.n_grad == L + 1
    assert gradient_noise_std(0.5, 3.0) == 3.0


def test_halton_sequence_is_seeded_uniform_and_picklable():
    a = HaltonSequence(np.random.default_rng(3))
    b = pickle.loads(pickle.dumps(HaltonSequence(np.random.default_rng(3))))
    xa = np.array([a.next() for _ in range(512)])
    xb = np.array([b.next() for _ in range(512)])
    np.testing.assert_array_equal(xa, xb)
    assert np.all((xa > 0) & (xa < 1))
    # low discrepancy: far more even than i.i.d. uniforms
    assert stats.kstest(xa, "uniform").statistic < 0.01
    other = np.array([HaltonSequence(np.random.default_rng(4)).next() for _ in range(3)])
    assert not np.array_equal(other, xa[:3])


def test_halton_sequence_in_blocks_is_the_sequence_drawn_one_at_a_time():
    """The engine is asked for a block of numbers at a time: the same numbers, in the same
    order, as one call per iteration (across block boundaries)."""
    seq = HaltonSequence(np.random.default_rng(3))
    engine = _halton_engine(int(np.random.default_rng(3).integers(2**63 - 1)))
    one_at_a_time = [max(float(engine.random(1)[0, 0]), 1e-12) for _ in range(200)]
    assert [seq.next() for _ in range(200)] == one_at_a_time


def test_dual_averaging_finds_the_target_step_size():
    da = DualAveraging(1.0, target=0.65)
    for _ in range(2000):
        da.update(np.exp(-da.current(True)))  # acceptance exp(-eps): target at -log(0.65)
    assert da.current(False) == pytest.approx(-np.log(0.65), rel=0.02)
    da.update(np.nan)  # a NaN statistic counts as a rejection, never crashes


def test_warmup_windows_follow_stan():
    assert warmup_windows(1000) == [(75, 100), (100, 150), (150, 250), (250, 450), (450, 950)]
    assert warmup_windows(100) == [(15, 90)]
    assert warmup_windows(10) == []
    assert warmup_windows(None)[:3] == [(75, 100), (100, 150), (150, 250)]


def test_mass_adaptation_estimates_variances_and_ignores_a_stuck_window():
    rng = np.random.default_rng(5)
    sd = np.array([0.01, 1.0, 30.0])
    ad = DiagonalMassAdaptation(np.ones(3), tune=1000)
    changed = [ad.update(rng.normal(size=3) * sd, True) for _ in range(950)]
    assert sum(changed) == 5
    np.testing.assert_allclose(ad.inv_mass, sd**2, rtol=0.2)
    assert [used for _, used in ad.history] == [True] * 5
    stuck = DiagonalMassAdaptation(np.ones(3), tune=1000)
    for _ in range(100):
        stuck.update(np.zeros(3), False)
    np.testing.assert_array_equal(stuck.inv_mass, np.ones(3))
    # a slowly random-walking chain (as under heavy DP noise) measures its own movement,
    # not the posterior: such windows are not used
    walk = DiagonalMassAdaptation(np.ones(3), tune=1000)
    path = np.cumsum(rng.normal(size=(950, 3)) * 1e-3, axis=0)
    for x in path:
        walk.update(x, True)
    np.testing.assert_array_equal(walk.inv_mass, np.ones(3))
    assert walk.history and not any(used for _, used in walk.history)


# -- per-record clipped gradient sums -------------------------------------------------------------


@pytest.mark.parametrize("d", [1, 3])
def test_clipped_grad_sum_matches_numpy(d):
    """Regression: with one parameter pytensor < 2.39 rewrote sqrt(sqr(g)) to NaN for g < 0."""
    model, *_ = normal_mean_model(n=40, d=d, seed=2)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q = np.linspace(-0.5, 0.7, d)
    g = fns.per_record_grad(q)
    for bound in (0.3, 1.0, 100.0):
        norms = np.linalg.norm(g, axis=1)
        expected = (g * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
        total, count = fns.clipped_grad_sum(q, bound)
        # the blocks route's float32 clip weight shortens a clipped record by at most a
        # relative 2^-16 (`clip_weights`); records inside the bound are exact
        m = fns._c.grad_clipped["route"].weight_margin
        slack = 2 * m * np.sum(np.minimum(norms, bound))
        np.testing.assert_allclose(total, expected, rtol=1e-12, atol=1e-12 + slack)
        assert count == int(np.sum(norms > bound))
    assert fns.gradient_route == "blocks" and m > 0


def test_glm_fast_route_matches_per_record_gradients_and_pickles(logistic_model):
    """Logistic regression with an intercept takes the factorised route (g_i = v_i x_i)."""
    model, X, y = logistic_model
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point(), chunk_size=64)
    q = np.array([0.3, -0.4, 0.8])
    assert fns.gradient_route == "not compiled"  # compiled on first use
    g = fns.per_record_grad(q)
    norms = np.linalg.norm(g, axis=1)
    for bound in (0.2, 0.8, 100.0):
        total, count = fns.clipped_grad_sum(q, bound)
        expected = (g * np.minimum(1.0, bound / norms)[:, None]).sum(axis=0)
        np.testing.assert_allclose(total, expected, rtol=1e-10, atol=1e-12)
        assert count == int(np.sum(norms > bound))
    assert fns.gradient_route == "GLM fast"
    clone = cloudpickle.loads(cloudpickle.dumps(fns))
    np.testing.assert_array_equal(
        clone.clipped_grad_sum(q, 0.8)[0], fns.clipped_grad_sum(q, 0.8)[0]
    )


def test_clipped_grad_sum_drops_non_finite_records():
    """A record with a non-finite gradient contributes 0 (its norm stays <= b)."""
    x = np.linspace(-1.0, 1.0, 10)
    x[3] = 1e200  # its squared gradient overflows
    with pm.Model() as model:
        pm.Normal("x", pm.Normal("t", 0.0, 1.0), 1.0, observed=x)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    total, count = fns.clipped_grad_sum(np.array([0.2]), 5.0)
    assert np.isfinite(total).all()
    np.testing.assert_allclose(total, np.delete(x, 3).sum() - 9 * 0.2, rtol=1e-12)
    assert count == 1


# -- exactness with clipping inactive (noise on) ---------------------------------------------------


@pytest.mark.slow
def test_exact_normal_mean_1d():
    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = exact_dphmc()
        step.reuse_loglik = True  # the kept log-likelihoods (automatic: not for a normal)
        step.fuse_ratio_pass = True  # one pass for the last gradient and the ratio (idem)
        idata = pm.sample(3000, tune=500, chains=4, cores=1, step=step, random_seed=11, **SAMPLE)
    check_no_clipping_and_noise_on(idata)
    # the draws come from the kept sums and log-likelihoods, and every trajectory's last
    # gradient and its ratio from one pass over the records (issue 28)
    assert step._grad_memo.reused > 10000 and step._ll_memo.reused > 10000
    assert step.fuses_ratio_pass and step._fused[1].calls == 4 * 3500
    # the gradient noise (std 5) is comparable to the gradient itself (n * |theta - mean| ~ 7)
    assert idata["sample_stats"]["grad_noise_std"].values.min() == pytest.approx(5.0)
    assert_matches_distribution(
        posterior_array(idata, "theta")[..., 0], stats.norm(mean[0], sd[0]), label="theta"
    )


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_exact_varying_intercepts_on_the_sorted_route(fused):
    """Issue 28: a group-indexed model takes the sorted route (records sorted by group once
    per chunk); with clipping inactive the draws follow the closed-form posterior of every
    group's intercept, ``y_i ~ N(a[g_i], 1)``, ``a_j ~ N(0, 10^2)`` (conjugate normal).
    ``fused``: the last gradient and the ratio from one pass (not the default on this
    route, forced here)."""
    rng = np.random.default_rng(4)
    groups, n = 3, 60
    g = rng.integers(0, groups, n)
    y = rng.normal(np.array([-1.0, 0.5, 2.0])[g], 1.0)
    with pm.Model():
        a = pm.Normal("a", 0.0, 10.0, shape=groups)
        pm.Normal("y", a[g], 1.0, observed=y)
        step = exact_dphmc()
        assert step._fns.clipped_grad_sum(np.zeros(groups), 1.0) is not None
        assert step._fns.gradient_route == "sorted"
        step.reuse_loglik = True  # the kept log-likelihoods (automatic: not for a normal)
        step.fuse_ratio_pass = fused
        idata = pm.sample(2500, tune=500, chains=4, cores=1, step=step, random_seed=5, **SAMPLE)
    check_no_clipping_and_noise_on(idata)
    assert step._grad_memo.reused > 10000 and step._ll_memo.reused > 10000  # kept values
    assert step.fuses_ratio_pass == fused
    assert (step._fused[1].calls if fused else 0) == (4 * 3000 if fused else 0)
    prec = np.bincount(g, minlength=groups) + 1.0 / 10.0**2
    mean = np.bincount(g, weights=y, minlength=groups) / prec
    draws = posterior_array(idata, "a")
    for j in range(groups):
        dist = stats.norm(mean[j], 1.0 / np.sqrt(prec[j]))
        assert_matches_distribution(draws[..., j], dist, label=f"a{j}")


def test_sorted_route_changes_dphmc_draws_by_rounding_only(monkeypatch):
    """The sorted route and the indexed route give the same clipped sums in another
    summation order: DPHMC's draws from the same seed agree to rounding over a short chain
    (the mechanisms, their noise draws and their order are unchanged)."""
    from pymc_dp.records import routes

    rng = np.random.default_rng(2)
    g, x = rng.integers(0, 4, 200), rng.uniform(-1, 1, 200)
    y = rng.normal(size=200)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 1, shape=4)
        b = pm.Normal("b", 0, 1, shape=4)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a[g] + b[g] * x, s, observed=y)
    kw = dict(
        llr_clip_bound=1.0,
        grad_clip_bound=2.0,  # some records clipped
        llr_noise_multiplier=1.0,
        grad_noise_multiplier=1.0,
        n_leapfrog=4,
        step_size=0.05,
    )
    chains = {}
    for tried in (
        routes.GRADIENT_ROUTES,
        tuple(r for r in routes.GRADIENT_ROUTES if r != "sorted"),
    ):
        monkeypatch.setattr(routes, "GRADIENT_ROUTES", tried)
        with model:
            step = pymc_dp.DPHMC(rng=np.random.default_rng(9), **kw)
        point, draws = model.initial_point(), []
        for _ in range(8):
            point, _ = step.step(point)
            draws.append(np.concatenate([np.ravel(point[k]) for k in sorted(point)]))
        chains[step._fns.gradient_route] = np.array(draws)
    assert set(chains) == {"sorted", "indexed"}
    np.testing.assert_allclose(chains["sorted"], chains["indexed"], rtol=1e-9, atol=1e-12)


def correlated_normal_model(n: int = 100, d: int = 10, prior_sd: float = 10.0, seed: int = 3):
    """x_i ~ MvNormal(theta, Sigma) with a fixed correlated Sigma, theta ~ N(0, prior_sd^2 I).

    Returns (model, posterior mean, posterior covariance).
    """
    rng = np.random.default_rng(seed)
    lag = np.abs(np.subtract.outer(np.arange(d), np.arange(d)))
    Sigma = 0.7**lag * np.outer(np.linspace(0.5, 1.5, d), np.linspace(0.5, 1.5, d))
    x = rng.multivariate_normal(np.linspace(-1.0, 1.0, d), Sigma, size=n)
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, prior_sd, shape=d)
        pm.MvNormal("x", mu=theta, cov=Sigma, observed=x)
    prec_lik = np.linalg.inv(Sigma)
    cov = np.linalg.inv(np.eye(d) / prior_sd**2 + n * prec_lik)
    return model, cov @ (prec_lik @ x.sum(axis=0)), cov


@pytest.mark.slow
def test_exact_correlated_normal_10d():
    model, mean, cov = correlated_normal_model()
    corr = cov / np.sqrt(np.outer(np.diag(cov), np.diag(cov)))
    assert np.max(np.abs(corr - np.eye(10))) > 0.6  # the posterior is really correlated
    with model:
        step = exact_dphmc(
            llr_clip_bound=100.0,
            grad_clip_bound=100.0,
            llr_noise_multiplier=0.01,
            grad_noise_multiplier=0.01,
            n_leapfrog=8,
        )
        idata = pm.sample(2500, tune=600, chains=4, cores=1, step=step, random_seed=3, **SAMPLE)
    check_no_clipping_and_noise_on(idata)
    draws = posterior_array(idata, "theta")
    sd = np.sqrt(np.diag(cov))
    for k in range(10):
        assert_matches_distribution(draws[..., k], stats.norm(mean[k], sd[k]), label=f"theta{k}")
    # the joint: whitened draws are independent standard normals, so their squared norm is
    # chi2(10) (its ESS reflects HMC's slowly mixing energy, unlike the marginals' ESS)
    white = np.linalg.solve(np.linalg.cholesky(cov), (draws - mean)[..., None])[..., 0]
    assert_matches_distribution((white**2).sum(axis=-1), stats.chi2(10), label="|white|^2")
    for k in range(10):
        mcse = 1.0 / np.sqrt(az.ess(white[..., k]))
        assert abs(white[..., k].mean()) < 4 * mcse, f"whitened mean {k}"


@pytest.mark.slow
def test_exact_transformed_variable():
    model, post = inverse_gamma_variance_model()
    with model:
        # A rare divergent leapfrog trajectory reaches log s2 ~ -6, where a record's gradient
        # is ~2500: a gradient bound of 400 was inactive only along some rounding paths. The
        # bound 10^4 keeps clipping inactive on every path, with the same noise (0.8).
        step = exact_dphmc(
            llr_clip_bound=400.0,
            grad_clip_bound=1e4,
            llr_noise_multiplier=0.002,
            grad_noise_multiplier=0.8e-4,
        )
        idata = pm.sample(3000, tune=500, chains=4, cores=1, step=step, random_seed=2, **SAMPLE)
    check_no_clipping_and_noise_on(idata)
    assert_matches_distribution(posterior_array(idata, "s2"), post, label="s2")


# -- privacy accounting ----------------------------------------------------------------------------


def test_report_equals_closed_form():
    model, *_ = normal_mean_model(n=30, d=2)
    z_l, z_g, L = 0.7, 1.3, 4
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=z_l,
            grad_noise_multiplier=z_g,
            n_leapfrog=L,
            step_size=0.1,
        )
        idata = pm.sample(20, tune=7, chains=3, cores=1, step=step, random_seed=4, **SAMPLE)
    rep = pymc_dp.privacy_report(idata, delta=1e-3)
    k = 3 * (20 + 7)
    mu = k / (2 * z_l**2) + k * (L + 1) / (2 * z_g**2)
    assert rep.mu == pytest.approx(mu, rel=1e-12)
    assert rep.releases == k * (L + 2)
    assert rep.epsilon == pytest.approx(gaussian_epsilon(mu, 1e-3), rel=1e-12)
    assert not rep.nonprivate_diagnostics
    ss = idata["sample_stats"]
    for name in ("grad_clip_fraction_NONPRIVATE", "llr_clip_fraction_NONPRIVATE"):
        assert np.all(np.isnan(ss[name].values))
    assert np.all(ss["n_leapfrog"].values == L)
    assert np.all(ss["dp_releases"].values == L + 2)


@pytest.mark.parametrize(
    ("epsilon", "delta", "iterations", "n_leapfrog", "fraction"),
    [
        (1.0, 1e-5, 4000, 10, 0.5),
        (0.1, 1e-6, 100, 1, 0.3),
        (8.0, 1e-6, 40_000, 25, 0.9),
        (15.0, 1e-3, 7, 3, 0.01),
        (2.0, 1e-8, 10**6, 12, 0.67),
    ],
)
def test_calibration_splits_the_budget_and_never_exceeds_the_target(
    epsilon, delta, iterations, n_leapfrog, fraction
):
    z_l, z_g = calibrate_dphmc_noise(epsilon, delta, iterations, n_leapfrog, fraction)
    mu_g = iterations * (n_leapfrog + 1) / (2 * z_g**2)
    mu_l = iterations / (2 * z_l**2)
    achieved = gaussian_epsilon(mu_l + mu_g, delta)
    assert achieved <= epsilon
    assert achieved == pytest.approx(epsilon, rel=1e-6)  # and wastes nothing
    assert mu_g / (mu_l + mu_g) == pytest.approx(fraction, rel=1e-9)
    assert mu_l + mu_g <= gaussian_mu_for_epsilon(epsilon, delta)


def test_calibrated_run_stays_within_target_and_guards_the_budget():
    model, *_ = normal_mean_model(n=30, d=1)
    kwargs = dict(llr_clip_bound=5.0, grad_clip_bound=5.0, n_leapfrog=3, step_size=0.1)
    with model:
        idata = pymc_dp.sample(
            step=pymc_dp.DPHMC,
            epsilon=2.0,
            delta=1e-5,
            draws=30,
            tune=10,
            chains=2,
            step_kwargs=kwargs,
            cores=1,
            random_seed=1,
            **SAMPLE,
        )
        rep = pymc_dp.privacy_report(idata)
        assert rep.epsilon <= 2.0
        assert rep.epsilon == pytest.approx(2.0, rel=1e-6)
        assert rep.releases == 2 * 40 * 5
        step = pymc_dp.DPHMC(epsilon=2.0, delta=1e-5, draws=30, tune=10, chains=2, **kwargs)
        z_l, z_g = calibrate_dphmc_noise(2.0, 1e-5, 80, 3, 0.5)
        assert (step.llr_noise_multiplier, step.grad_noise_multiplier) == (z_l, z_g)
        with pytest.raises(pymc_dp.BudgetExceededError, match="calibrated for 40 iterations"):
            pm.sample(31, tune=10, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)


# -- mechanics of one iteration --------------------------------------------------------------------


def test_each_iteration_releases_l_plus_1_fresh_gradients_and_one_ratio():
    """``L + 1`` gradient releases and one ratio release per iteration, as accounted
    (``dp_releases = L + 2``); ``L + 1`` sums computed in the first iteration, ``L`` in the
    next ones (the sum at the current state is the one kept from the last trajectory)."""
    model, *_ = normal_mean_model(n=20, d=2)
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=6,
            step_size=0.05,
        )
    step.reuse_loglik = True  # (automatic: not for a normal likelihood)
    step.fuse_ratio_pass = False  # two passes (the fused pass: the test after this one)
    fns = step._fns
    calls = []
    grad, kept, ll = fns.clipped_grad_sum, fns.clipped_loglik_ratio_sum_kept, fns.loglik_chunks
    fns.clipped_grad_sum = lambda q, b: calls.append(("grad", q.copy())) or grad(q, b)
    fns.clipped_loglik_ratio_sum_kept = lambda a, b, c: (
        calls.append(("llr", a.copy())) or kept(a, b, c)
    )
    fns.loglik_chunks = lambda q: calls.append(("ll", q.copy())) or ll(q)
    point = model.initial_point()
    accepted = []
    for i in range(6):
        start = np.concatenate([np.ravel(point[v.name]) for v in step.vars])
        calls.clear()
        before = dict(fns.released)
        point, stats_ = step.step(point)
        accepted.append(stats_[0]["accepted"])
        released = {k: fns.released[k] - before[k] for k in before}
        assert released == {"grad": 7, "llr": 1}
        assert sum(released.values()) == stats_[0]["dp_releases"] == 6 + 2
        if i == 0:  # nothing kept yet: the sum and the log-likelihoods at the current state
            assert [c[0] for c in calls] == ["grad"] * 7 + ["ll", "llr"]
            np.testing.assert_array_equal(calls[0][1], start)
            np.testing.assert_array_equal(calls[-2][1], start)
        else:  # kept from the last trajectory: nothing computed at the current state
            assert [c[0] for c in calls] == ["grad"] * 6 + ["llr"]
            assert not any(np.array_equal(q, start) for kind, q in calls)
        # the ratio release evaluates the log-likelihoods at the proposal only
        np.testing.assert_array_equal(calls[-1][1], calls[-2 if i else -3][1])
    assert step._grad_memo.reused == 5 and step._ll_memo.reused == 5
    assert 0 < sum(accepted) < 6  # both ends of a trajectory were reused


@pytest.mark.parametrize("model_kind", ["normal", "sorted", "indexed"])
def test_fused_pass_reads_the_records_l_times_per_iteration(model_kind):
    """Issue 28: the last gradient release of a trajectory and the ratio release share one
    pass over the records. A spy on the store counts the passes: ``L`` per iteration (the
    sum at the current point kept, the ratio computed with the last gradient), ``L + 2`` in
    the first one (nothing kept: the sum and the log-likelihoods at the start); the releases
    are those accounted (``L + 1`` gradients, one ratio, ``dp_releases = L + 2``)."""
    rng = np.random.default_rng(1)
    g = rng.integers(0, 4, 60)
    if model_kind == "normal":
        model, *_ = normal_mean_model(n=20, d=2)
    elif model_kind == "sorted":
        with pm.Model() as model:
            a = pm.Normal("a", 0.0, 3.0, shape=4)
            pm.Normal("y", a[g], 1.0, observed=rng.normal(g - 1.5, 1.0))
    else:  # a GLM with a random intercept and a pm.Data index: the indexed route
        x = rng.normal(size=(60, 2))
        with pm.Model() as model:
            beta = pm.Normal("beta", 0.0, 1.0, shape=2)
            sd_a = pm.HalfNormal("sd_a", 1.0)
            a = pm.Normal("a", 0.0, sd_a, shape=4)
            gi = pm.Data("g", g)
            mu = pm.math.exp(pm.math.dot(x, beta) + a[gi])
            pm.Poisson("y", mu, observed=rng.poisson(1.0, 60))
    L = 6
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=L,
            step_size=0.05,
            rng=np.random.default_rng(2),
        )
    # by default where the log-likelihood is costly (the Poisson's exp, the normal's row
    # reduction), not on the sorted route (it does not pay there); forced here
    assert step.fuses_ratio_pass == (model_kind != "sorted")
    route = step._fns.gradient_route
    assert route == {"normal": "blocks", "sorted": "sorted", "indexed": "indexed"}[model_kind]
    step.fuse_ratio_pass = True
    assert step.fuses_ratio_pass
    fns = step._fns
    store = fns.records
    passes = []
    real = store.map_reduce

    def spy(fn, *a, **kw):
        passes.append(type(fn).__name__)
        return real(fn, *a, **kw)

    store.map_reduce = spy
    # records in memory in one chunk: a gradient sum reads them through `whole` (the
    # route called directly), unless the route needs data-only arrays (then `map_reduce`)
    real_whole = store.whole

    def whole_spy():
        passes.append("whole")
        return real_whole()

    store.whole = whole_spy
    direct = fns._c.grad_clipped["route"].prepare is None
    grad = "whole" if direct else "_GradSumChunk"
    point, accepted = model.initial_point(), []
    for i in range(8):
        passes.clear()
        before = dict(fns.released)
        point, stats_ = step.step(point)
        accepted.append(stats_[0]["accepted"])
        released = {k: fns.released[k] - before[k] for k in before}
        assert released == {"grad": L + 1, "llr": 1}
        assert sum(released.values()) == stats_[0]["dp_releases"] == L + 2
        fused = ["_FusedChunk"]
        if i == 0:  # nothing kept: the sum and the log-likelihoods at the start computed
            assert passes[:L] == [grad] * L and passes[L + 1 :] == fused
            assert passes[L] in ("_TrustedCall", "_WithFallback")  # the log-likelihoods
        else:  # L passes: L - 1 gradient sums, then the last one with the ratio
            assert passes == [grad] * (L - 1) + fused
    assert step._fused[1].calls == 8
    assert step._grad_memo.reused == step._ll_memo.reused == 7
    assert 0 < sum(accepted) < 8  # both ends of a trajectory were kept and reused


def _two_variable_step(reuse: bool = True):
    rng = np.random.default_rng(5)
    x = rng.normal(0.3, 1.2, size=(25, 2))
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 3.0)
        s = pm.HalfNormal("s", 2.0)
        pm.Normal("x", a, s, observed=x)
        step = pymc_dp.DPHMC(
            [a],
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=3,
            step_size=0.05,
        )
    step.reuse_gradient_sums = step.reuse_loglik = step.fuse_ratio_pass = reuse
    return model, step


@pytest.mark.filterwarnings("ignore:DPHMC samples")
def test_kept_gradient_sum_is_not_used_when_the_state_changed_from_outside():
    """The kept sum is used only at exactly the same point, with the same values of the
    variables the step does not sample (another step of a CompoundStep may change them):
    a state set between iterations is computed again, and the value returned is always the
    one computed at the point."""
    model, step = _two_variable_step()
    step.fuse_ratio_pass = False  # every computed sum through clipped_grad_sum (the spy)
    fns = step._fns
    computed = []
    grad = fns.clipped_grad_sum
    (other,) = step.shared.values()  # the value of s, which the step does not sample

    def spy(q, b):
        computed.append((q.copy(), float(other.get_value())))
        return grad(q, b)

    fns.clipped_grad_sum = spy
    point = model.initial_point()
    point, _ = step.step(point)
    assert len(computed) == 4  # L + 1: nothing kept yet
    # the same state: the sum at the current point is reused
    computed.clear()
    point, _ = step.step(point)
    assert len(computed) == 3 and step._grad_memo.reused == 1
    # the other variable changed (as another step of a CompoundStep would): computed
    computed.clear()
    moved = dict(point, s_log__=point["s_log__"] + 0.1)
    out, _ = step.step(moved)
    assert len(computed) == 4 and step._grad_memo.reused == 1
    np.testing.assert_array_equal(computed[0][0], moved["a"].ravel())
    assert computed[0][1] == moved["s_log__"]
    # the sampled variable set from outside (a new initial point, a tuning restart): computed
    computed.clear()
    out, _ = step.step(dict(out, a=out["a"] + 1e-12))
    assert len(computed) == 4 and step._grad_memo.reused == 1
    # a new chain forgets the kept sums
    computed.clear()
    step._start_chain()  # what PyMC calls at the start of every chain (both lines)
    step.step(out)
    assert len(computed) == 4
    # kept and recomputed sums are the same numbers at the same point
    memo_value = step._grad_memo(out["a"].ravel(), step.grad_clip_bound)[0]
    np.testing.assert_array_equal(memo_value, grad(out["a"].ravel(), step.grad_clip_bound)[0])


@pytest.mark.filterwarnings("ignore:DPHMC samples", "ignore:DPPenaltyMetropolis samples")
def test_reuse_in_a_compound_step_leaves_the_draws_unchanged():
    """DPHMC on one variable, DPPenaltyMetropolis on the other (a CompoundStep): the other
    step moves the state between DPHMC's iterations; the chains are the same (to rounding)
    with reuse on and off, and reuse happens only when nothing moved."""

    def run(reuse: bool):
        model, step = _two_variable_step(reuse)
        with model:
            other = pymc_dp.DPPenaltyMetropolis([model["s"]], clip_bound=5.0, noise_multiplier=1.0)
            idata = pm.sample(
                40, tune=40, chains=1, cores=1, step=[step, other], random_seed=3, **SAMPLE
            )
        return idata, step

    (a, sa), (b, sb) = run(True), run(False)
    for name in ("a", "s"):
        # to rounding: the ratios formed from the kept log-likelihoods may differ from those
        # formed in one compiled function in the last bits, and the warmup adapts the step
        # size on the acceptance probability (bit-identical with the kept sums alone)
        np.testing.assert_allclose(
            posterior_array(a, name), posterior_array(b, name), rtol=1e-12, atol=1e-14
        )
    assert sa._fns.released == sb._fns.released
    assert 0 < sa._grad_memo.reused < 79 and sb._grad_memo.reused == 0
    assert 0 < sa._ll_memo.reused < 79 and sb._ll_memo.reused == 0


@pytest.mark.parametrize("kept", ["grad", "loglik", "both", "fused"])
def test_reusing_gradient_sums_leaves_the_draws_unchanged(kept):
    """Reusing the kept noise-free sum (and the kept per-record log-likelihoods) changes no
    draw: the same seed gives the same chains, stats and release counts with reuse on and
    off (the same random draws in the same order, the same noise-free sums; the ratios
    formed from two evaluations may differ from those formed in one compiled function by
    rounding, so the noisy energy change is compared to 1e-12), and the accountant's spend
    is the same. ``"fused"`` (issue 28): both kept, and the last gradient sum and the ratio
    sum of every trajectory from one pass (`pymc_dp.records.FusedLastPass`): the same
    releases and noise draws; the sums are the same functions of the records compiled
    into one function, whose graph rewrites may round differently (last bits), so the
    positions are compared to 1e-12 and the accept decisions exactly."""

    def run(reuse: bool):
        model, *_ = normal_mean_model(n=30, d=2)
        with model:
            step = pymc_dp.DPHMC(
                llr_clip_bound=20.0,
                grad_clip_bound=20.0,
                llr_noise_multiplier=0.2,
                grad_noise_multiplier=0.2,
                n_leapfrog=4,
            )
            step.reuse_gradient_sums = reuse and kept in ("grad", "both", "fused")
            step.reuse_loglik = reuse and kept in ("loglik", "both", "fused")
            step.fuse_ratio_pass = reuse and kept == "fused"
            # the affine bypass (a normal mean) forms a recomputed ratio sum from block
            # sums, rounding differently from the kept per-record log-likelihoods: off
            # here, where the reuse is compared bit for bit (the bypass's own sums:
            # tests/records/test_affine_blocks.py)
            step._fns._affine_off = True
            idata = pm.sample(30, tune=120, chains=2, cores=1, step=step, random_seed=7, **SAMPLE)
        return idata, step

    (a, sa), (b, sb) = run(True), run(False)
    assert sa.fuses_ratio_pass == (kept == "fused") and not sb.fuses_ratio_pass
    if kept == "fused":
        assert sa._fused[1].calls == 300
        np.testing.assert_allclose(
            posterior_array(a, "theta"), posterior_array(b, "theta"), rtol=1e-12, atol=1e-14
        )
    else:
        np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    for name in ("accepted", "dp_releases", "dp_mu") + (() if kept == "fused" else ("step_size",)):
        np.testing.assert_array_equal(
            a["sample_stats"][name].values, b["sample_stats"][name].values
        )
    # (fused: the warmup adapts the step size on the noisy acceptance probability, which
    # carries the rounding of the ratio sums)
    np.testing.assert_allclose(
        a["sample_stats"]["step_size"].values,
        b["sample_stats"]["step_size"].values,
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        a["sample_stats"]["energy_change"].values,
        b["sample_stats"]["energy_change"].values,
        rtol=1e-12,
        atol=1e-12,
    )
    assert sa._fns.released == sb._fns.released == {"llr": 300, "grad": 300 * 5}
    ra, rb = pymc_dp.privacy_report(a, delta=1e-5), pymc_dp.privacy_report(b, delta=1e-5)
    assert (ra.mu, ra.epsilon, ra.releases) == (rb.mu, rb.epsilon, rb.releases)
    assert sa._grad_memo.reused == (300 - 2 if kept != "loglik" else 0)
    assert sa._ll_memo.reused == (300 - 2 if kept != "grad" else 0)
    assert sb._grad_memo.reused == sb._ll_memo.reused == 0


@pytest.mark.filterwarnings("ignore:DPHMC.nonprivate_diagnostics")
def test_kept_loglik_gives_the_recomputed_ratio_sums_after_rejections():
    """With a seed, over iterations that accept and reject (some ratios clipped), every
    ratio release served from the kept per-record log-likelihoods (at the accepted or the
    rejected end of the last trajectory) is the clipped sum computed afresh at both points,
    and the log-likelihoods kept are those at the chain's state."""
    model, *_ = normal_mean_model(n=40, d=2)
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=0.5,  # some ratios clipped
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=3,
            step_size=0.2,
            nonprivate_diagnostics=True,  # the clipped counts, compared below
            rng=np.random.default_rng(3),
        )
    step.reuse_loglik = True  # (automatic: not for a normal likelihood)
    step.fuse_ratio_pass = False  # the ratio release on its own (fused: the next test)
    fns, memo = step._fns, step._ll_memo
    served, fresh = [], []
    call = type(memo).__call__

    def spy(self, q_new, q_old, bound):
        out = call(self, q_new, q_old, bound)
        served.append(out)
        before = dict(fns.released)
        fresh.append(fns.clipped_loglik_ratio_sum(q_new, q_old, bound))  # the check only
        fns.released.update(before)
        return out

    point, accepted = model.initial_point(), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(memo), "__call__", spy)
        for _ in range(25):
            point, stats_ = step.step(point)
            accepted.append(stats_[0]["accepted"])
            q = np.concatenate([np.ravel(point[v.name]) for v in step.vars])
            (kept,) = [v for _, v in memo._kept]
            np.testing.assert_allclose(np.concatenate(kept), fns.loglik(q), rtol=1e-13)
    assert 3 <= sum(accepted) <= 22  # both ends reused
    assert memo.reused == len(served) - 1 == 24
    np.testing.assert_allclose([s for s, _ in served], [s for s, _ in fresh], rtol=1e-12)
    assert [k for _, k in served] == [k for _, k in fresh]
    assert sum(k for _, k in served) > 0


@pytest.mark.filterwarnings("ignore:DPHMC.nonprivate_diagnostics")
@pytest.mark.parametrize("chunk_size", [None, 13])
def test_fused_pass_gives_the_recomputed_sums_after_rejections(chunk_size):
    """Issue 28: with a seed, over iterations that accept and reject (some gradients and
    some ratios clipped), every fused pass returns the clipped gradient sum and the clipped
    ratio sum computed afresh by the two separate functions (their counts exactly), and the
    log-likelihoods and the gradient sum kept are those at the chain's state."""
    model, *_ = normal_mean_model(n=40, d=2)
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=0.5,  # some ratios clipped
            grad_clip_bound=3.0,  # some gradients clipped
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=3,
            step_size=0.2,
            chunk_size=chunk_size,
            nonprivate_diagnostics=True,  # the clipped counts, compared below
            rng=np.random.default_rng(3),
        )
    step.fuse_ratio_pass = True  # (automatic: not for a normal likelihood)
    assert step.fuses_ratio_pass
    fns, memo = step._fns, step._ll_memo
    served, fresh = [], []
    from pymc_dp.records import FusedLastPass
    from pymc_dp.records.runtime import _bits

    call = FusedLastPass.__call__

    def spy(self, q_new, b_g, q_old, b_l):
        out = call(self, q_new, b_g, q_old, b_l)
        served.append(out)
        before = dict(fns.released)
        g, k = fns.clipped_grad_sum(q_new, b_g)  # the checks only
        s, kl = fns.clipped_loglik_ratio_sum(q_new, q_old, b_l)
        fresh.append((g, k, s, kl))
        fns.released.update(before)
        return out

    point, accepted = model.initial_point(), []
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FusedLastPass, "__call__", spy)
        for _ in range(25):
            point, stats_ = step.step(point)
            accepted.append(stats_[0]["accepted"])
            q = np.concatenate([np.ravel(point[v.name]) for v in step.vars])
            (kept,) = [v for _, v in memo._kept]
            np.testing.assert_allclose(np.concatenate(kept), fns.loglik(q), rtol=1e-13)
            (g_kept,) = [v for key, v in step._grad_memo._kept if key[0] == _bits(q)][:1]
            np.testing.assert_allclose(
                g_kept[0], fns.clipped_grad_sum(q, 3.0)[0], rtol=1e-12, atol=1e-12
            )
    assert 3 <= sum(accepted) <= 22  # both ends reused
    assert len(served) == 25 and memo.reused == 24
    for (g1, k1, s1, kl1), (g2, k2, s2, kl2) in zip(served, fresh, strict=True):
        np.testing.assert_allclose(g1, g2, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(s1, s2, rtol=1e-12, atol=1e-12)
        assert (k1, kl1) == (k2, kl2)
    assert sum(s[1] for s in served) > 0 and sum(s[3] for s in served) > 0


def test_fixed_step_size_and_mass_matrix_are_honoured():
    model, *_ = normal_mean_model(n=20, d=3)
    mass = np.array([1.0, 4.0, 0.25])
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=5.0,
            grad_clip_bound=5.0,
            llr_noise_multiplier=1.0,
            grad_noise_multiplier=1.0,
            n_leapfrog=3,
            step_size=0.07,
            mass_matrix=mass,
            adapt_step_size=False,
            adapt_mass_matrix=False,
        )
        idata = pm.sample(30, tune=200, chains=1, cores=1, step=step, random_seed=2, **SAMPLE)
    ss = idata["sample_stats"]
    assert np.all(ss["step_size_bar"].values == 0.07)
    assert np.all((ss["step_size"].values > 0) & (ss["step_size"].values < 0.07))
    np.testing.assert_array_equal(step._inv_mass, 1.0 / mass)


@pytest.mark.slow
def test_warmup_adapts_mass_matrix_and_step_size():
    rng = np.random.default_rng(0)
    scales = np.array([0.1, 1.0, 10.0])
    x = rng.normal(size=(200, 3)) * scales
    with pm.Model():
        theta = pm.Normal("theta", 0.0, 100.0, shape=3)
        pm.Normal("x", theta, scales, observed=x)
        step = pymc_dp.DPHMC(
            llr_clip_bound=200.0,
            grad_clip_bound=200.0,
            llr_noise_multiplier=1e-3,
            grad_noise_multiplier=1e-3,
            n_leapfrog=5,
        )
        idata = pm.sample(200, tune=600, chains=1, cores=1, step=step, random_seed=3, **SAMPLE)
    ratio = step._inv_mass / (scales**2 / 200)  # posterior variances spanning 1e4
    assert ratio.max() / ratio.min() < 3.0, ratio
    ss = idata["sample_stats"]
    assert 0.5 < ss["accepted"].values.mean() < 0.95
    assert ss["step_size_bar"].values[0, 0] > 0.5  # far above the unadapted 0.25 / 3**0.25


def _run(cores: int):
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=20.0,
            grad_clip_bound=20.0,
            llr_noise_multiplier=0.2,
            grad_noise_multiplier=0.2,
            n_leapfrog=4,
        )
        # 120 warmup iterations: the step size and the mass matrix both adapt
        return pm.sample(30, tune=120, chains=3, cores=cores, step=step, random_seed=7, **SAMPLE)


def test_same_draws_for_cores_1_and_2():
    a, b = _run(1), _run(2)
    np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    for name in ("accepted", "step_size", "energy_change"):
        np.testing.assert_array_equal(
            a["sample_stats"][name].values, b["sample_stats"][name].values
        )
    assert not np.array_equal(posterior_array(a, "theta")[0], posterior_array(a, "theta")[1])


@pytest.mark.parametrize("fused", [False, True])
def test_step_pickles_and_continues_identically(fused):
    """A pickled step continues the chain with the same draws. The copy carries no kept
    noise-free value (sums, log-likelihoods): it computes them again. With the fused pass
    the step's kept values came from the fused function, the copy's first ones from the
    separate functions, which may round differently (last bits): to 1e-12 there."""
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = pymc_dp.DPHMC(
            llr_clip_bound=20.0,
            grad_clip_bound=20.0,
            llr_noise_multiplier=0.2,
            grad_noise_multiplier=0.2,
            n_leapfrog=4,
        )
    step.fuse_ratio_pass = fused
    point = model.initial_point()
    for _ in range(5):
        point, _ = step.step(point)
    clone = cloudpickle.loads(cloudpickle.dumps(step))
    assert clone.grad_noise_multiplier == step.grad_noise_multiplier
    p1, p2 = dict(point), dict(point)
    for _ in range(5):
        p1, s1 = step.step(p1)
        p2, s2 = clone.step(p2)
        if fused:
            np.testing.assert_allclose(p1["theta"], p2["theta"], rtol=1e-12, atol=1e-14)
            assert s1[0]["accepted"] == s2[0]["accepted"]
            assert s1[0]["step_size"] == pytest.approx(s2[0]["step_size"], rel=1e-12)
        else:
            np.testing.assert_array_equal(p1["theta"], p2["theta"])
            assert s1[0]["step_size"] == s2[0]["step_size"]


# -- bad input: a clear error naming the parameter, before any data is read --------------------

_OK = dict(
    llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0, grad_noise_multiplier=1.0
)
_TARGET = dict(
    llr_clip_bound=1.0, grad_clip_bound=1.0, epsilon=1.0, delta=1e-5, draws=1, tune=0, chains=1
)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({**_OK, "llr_clip_bound": 0.0}, "llr_clip_bound"),
        ({**_OK, "llr_clip_bound": np.inf}, "llr_clip_bound"),
        ({**_OK, "grad_clip_bound": -1.0}, "grad_clip_bound"),
        ({**_OK, "grad_clip_bound": np.nan}, "grad_clip_bound"),
        ({**_OK, "llr_noise_multiplier": 0.0}, "llr_noise_multiplier"),
        ({**_OK, "grad_noise_multiplier": -2.0}, "grad_noise_multiplier"),
        ({**_OK, "grad_noise_multiplier": None}, "grad_noise_multiplier"),
        ({**_OK, "epsilon": 1.0}, "not both"),
        ({**_OK, "n_leapfrog": 0}, "n_leapfrog"),
        ({**_OK, "n_leapfrog": 2.5}, "n_leapfrog"),
        ({**_OK, "step_size": 0.0}, "step_size"),
        ({**_OK, "step_size": -0.1}, "step_size"),
        ({**_OK, "target_accept": 1.0}, "target_accept"),
        ({**_OK, "grad_budget_fraction": 0.0}, "grad_budget_fraction"),
        ({**_OK, "grad_budget_fraction": 1.0}, "grad_budget_fraction"),
        ({**_TARGET, "grad_budget_fraction": 1.5}, "grad_budget_fraction"),
        ({**_OK, "mass_matrix": [1.0, 2.0]}, "mass_matrix"),
        ({**_OK, "mass_matrix": 0.0}, "mass_matrix"),
        ({**_OK, "mass_matrix": np.eye(1)}, "mass_matrix"),
        ({**_OK, "mass_matrix": [np.nan]}, "mass_matrix"),
        ({**_OK, "mass_matrix": "heavy"}, "mass_matrix"),
        ({"llr_clip_bound": 1.0, "grad_clip_bound": 1.0}, "llr_noise_multiplier"),
        ({**_TARGET, "draws": None}, "draws"),
        ({**_TARGET, "epsilon": 0.0}, "epsilon"),
        ({**_TARGET, "delta": 1.5}, "delta"),
    ],
)
def test_bad_input_raises_before_reading_data(kwargs, match, monkeypatch):
    import pymc_dp.step_methods.base as base

    def fail(*a, **k):  # the data must not be touched
        raise AssertionError("record functions were built before the input was validated")

    monkeypatch.setattr(base, "build_record_functions", fail)
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.raises(ValueError, match=match):
        pymc_dp.DPHMC(**kwargs)


def test_log_likelihoods_are_kept_where_their_evaluation_is_costly():
    """By default (``reuse_loglik = None``) the per-record log-likelihoods are kept where a
    record's log-likelihood applies a transcendental function or a row reduction (a
    logistic or Poisson regression, a StudentT), not for arithmetic only (a normal, where
    reading and writing the kept values costs more than the evaluation); structural."""
    rng = np.random.default_rng(0)
    X, n = rng.normal(size=(30, 2)), 30
    kw = dict(
        llr_clip_bound=1.0, grad_clip_bound=1.0, llr_noise_multiplier=1.0,
        grad_noise_multiplier=1.0,
    )  # fmt: skip
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, b), observed=rng.integers(0, 2, n))
        logistic = pymc_dp.DPHMC(**kw)
    with pm.Model():
        b = pm.Normal("b", 0, 1, shape=2)
        pm.StudentT("y", nu=4, mu=0.0, sigma=pm.math.exp(b[0]), observed=rng.normal(size=n))
        student = pymc_dp.DPHMC(**kw)
    with pm.Model():
        a = pm.Normal("a", 0, 1, shape=3)
        s = pm.HalfNormal("s", 1)
        pm.Normal("y", a[rng.integers(0, 3, n)], s, observed=rng.normal(size=n))
        normal = pymc_dp.DPHMC(**kw)
    assert logistic.keeps_loglik and student.keeps_loglik and not normal.keeps_loglik
    normal.reuse_loglik, logistic.reuse_loglik = True, False
    assert normal.keeps_loglik and not logistic.keeps_loglik
