"""DP-SGLD and DP-SGNHT: kernels, the known bias on a conjugate posterior, Poisson-subsampled
accounting, calibration, budget guard, reproducibility, the audit, and bad input."""

from __future__ import annotations

import functools
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from conftest import normal_mean_model, posterior_array
from scipy import stats
from threadpoolctl import threadpool_limits

import pymc_dp
from pymc_dp.accounting import (
    PoissonSubsampledGaussian,
    poisson_subsampled_gaussian_epsilon,
)
from pymc_dp.audit import audit_mechanism
from pymc_dp.kernels.sgmcmc import (
    SGNHTState,
    added_noise_multiplier,
    noisy_gradient,
    poisson_subsample,
    sgld_gaussian_variance,
    sgld_intrinsic_noise_multiplier,
    sgld_update,
    sgnht_intrinsic_noise_multiplier,
    sgnht_update,
    total_noise_multiplier,
)
from pymc_dp.records import build_record_functions
from pymc_dp.records.clipping import F32_MARGIN
from pymc_dp.step_methods.sgmcmc import (
    DPSGLD,
    DPSGNHT,
    sgld_runner,
    sgnht_runner,
)

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)


@pytest.fixture(autouse=True, scope="module")
def _single_threaded_blas():
    with threadpool_limits(limits=1, user_api="blas"):
        yield


# -- the pure kernels ------------------------------------------------------------------------------


def test_poisson_subsample_reads_each_record_independently_with_probability_q():
    rng = np.random.default_rng(0)
    for n, q in ((40, 0.25), (20_000, 0.01)):  # the mask route and the binomial route
        trials = 4000 if n == 40 else 400
        counts = np.zeros(n)
        sizes = np.empty(trials)
        for t in range(trials):
            idx = poisson_subsample(n, q, rng)
            assert np.all(np.diff(idx) > 0)  # sorted, no repeats
            counts[idx] += 1
            sizes[t] = idx.size
        # batch size ~ Bin(n, q): mean and variance within 4 standard errors
        se_mean = np.sqrt(n * q * (1 - q) / trials)
        assert abs(sizes.mean() - n * q) < 4 * se_mean
        assert abs(sizes.var() / (n * q * (1 - q)) - 1) < 4 * np.sqrt(2 / trials)
        # each record's inclusion count ~ Bin(trials, q): no record is off (Bonferroni over
        # the n records at level 1e-3), and the dispersion across records is binomial
        binom = stats.binom(trials, q)
        p_two = 2 * np.minimum(binom.cdf(counts), binom.sf(counts - 1))
        assert p_two.min() * n > 1e-3
        z2 = (counts - trials * q) ** 2 / (trials * q * (1 - q))
        assert abs(z2.mean() - 1) < 4 * np.sqrt(3 / n)  # ~ chi2(n) / n (+ kurtosis)
    np.testing.assert_array_equal(poisson_subsample(7, 1.0, rng), np.arange(7))


def test_noisy_gradient_is_unbiased_with_the_stated_noise():
    rng = np.random.default_rng(1)
    s, prior, q, std = np.array([3.0, -1.0]), np.array([0.5, 0.25]), 0.2, 2.0
    g = noisy_gradient(np.tile(s, (200_000, 1)), prior, q, std, rng)
    np.testing.assert_allclose(g.mean(axis=0), prior + s / q, atol=4 * std / q / np.sqrt(2e5))
    np.testing.assert_allclose(g.std(axis=0), std / q, rtol=4 * np.sqrt(0.5 / 2e5))
    np.testing.assert_array_equal(noisy_gradient(s, prior, q, 0.0, rng), prior + s / q)


def test_sgld_update_is_welling_teh():
    theta, g, eta = np.array([0.3, -2.0]), np.array([1.5, 4.0]), 0.04
    z = np.random.default_rng(5).normal(size=2)
    out = sgld_update(theta, g, eta, np.random.default_rng(5))
    np.testing.assert_allclose(out, theta + 0.5 * eta * g + np.sqrt(eta) * z, rtol=1e-15)


def test_sgnht_update_is_ding_et_al_algorithm_1_and_vectorises():
    theta, p, xi, g = np.array([0.3, -2.0, 1.0]), np.array([1.0, 0.5, -0.2]), 1.7, np.ones(3)
    eta, A = 0.05, 2.0
    z = np.random.default_rng(2).normal(size=3)
    th1, st = sgnht_update(theta, SGNHTState(p, xi), g, eta, A, np.random.default_rng(2))
    p1 = p - xi * p * eta + g * eta + np.sqrt(2 * A * eta) * z
    np.testing.assert_allclose(st.p, p1, rtol=1e-15)
    np.testing.assert_allclose(th1, theta + p1 * eta, rtol=1e-15)  # the new momentum moves
    assert st.xi == pytest.approx(xi + (p1 @ p1 / 3 - 1) * eta, rel=1e-15)
    # a batch of trials (leading axis) gives row-by-row the same as one at a time
    rng_a, rng_b = np.random.default_rng(3), np.random.default_rng(3)
    thetas, ps, xis = np.stack([theta, -theta]), np.stack([p, 2 * p]), np.array([1.0, 3.0])
    tb, sb = sgnht_update(thetas, SGNHTState(ps, xis), np.stack([g, -g]), eta, A, rng_a)
    for i, sign in enumerate((1, -1)):
        ti, si = sgnht_update(thetas[i], SGNHTState(ps[i], xis[i]), sign * g, eta, A, rng_b)
        np.testing.assert_allclose(tb[i], ti, rtol=1e-15)
        assert sb.xi[i] == pytest.approx(si.xi, rel=1e-15)


@pytest.mark.parametrize("method", ["sgld", "sgnht"])
def test_intrinsic_noise_multiplier_is_the_diffusion_noise_over_the_sum_coefficient(method):
    """The stated z_int equals (noise std of the update) / (coefficient of S) / C, measured
    on the kernel itself: so the accountant sees exactly the noise the update adds."""
    eta, q, C, A = 0.02, 0.1, 3.0, 4.0
    theta, p = np.zeros((100_000, 1)), np.zeros((100_000, 1))

    def release(s, seed):
        g = noisy_gradient(np.full((100_000, 1), s), 0.0, q, 0.0, None)
        rng = np.random.default_rng(seed)
        if method == "sgld":
            return sgld_update(theta, g, eta, rng)[:, 0]
        return sgnht_update(theta, SGNHTState(p, np.zeros(100_000)), g, eta, A, rng)[1].p[:, 0]

    coef = (release(1.0, 7) - release(0.0, 7)).mean()  # same noise: exact difference
    std = release(0.0, 8).std()
    z = (
        sgld_intrinsic_noise_multiplier(eta, q, C)
        if method == "sgld"
        else sgnht_intrinsic_noise_multiplier(eta, q, C, A)
    )
    assert std / coef / C == pytest.approx(z, rel=4 * np.sqrt(0.5 / 1e5))


def test_added_noise_tops_up_the_intrinsic_noise_to_the_target():
    assert added_noise_multiplier(1.0, 2.0) == 0.0
    for target, intrinsic in ((3.0, 1.0), (1.0, 0.999999), (5.0, 0.0), (0.7, 0.3)):
        s = added_noise_multiplier(target, intrinsic)
        assert total_noise_multiplier(s, intrinsic) >= target
        assert total_noise_multiplier(s, intrinsic) == pytest.approx(target, rel=1e-12)


def test_sgld_gaussian_variance_closed_form():
    P, eta = 50.0, 0.01
    assert sgld_gaussian_variance(P, eta) == pytest.approx(1 / (P * (1 - eta * P / 4)))
    assert sgld_gaussian_variance(P, 1e-9) == pytest.approx(1 / P, rel=1e-7)
    with pytest.raises(ValueError, match="step_size is too large"):
        sgld_gaussian_variance(P, 4.0 / P)


# -- minibatch access of the data -----------------------------------------------------------------


def test_clipped_grad_sum_subset_reads_the_rows_and_clips_like_numpy():
    model, *_ = normal_mean_model(n=40, d=2)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q = np.array([0.4, -0.3])
    per = fns.per_record_grad(q)
    idx = np.array([0, 3, 4, 17, 39])
    for b in (0.5, 1.0, 100.0):
        norms = np.linalg.norm(per[idx], axis=1)
        want = (per[idx] * np.minimum(1.0, b / norms)[:, None]).sum(axis=0)
        got, k = fns.clipped_grad_sum_subset(q, b, idx)
        # a clipped record's weight may be the float32 one, at most F32_MARGIN short of b /
        # ||g|| (`pymc_dp.records.clipping.clip_weights`); unclipped records are exact
        clipped = bool(np.any(norms > b))
        np.testing.assert_allclose(got, want, rtol=2 * F32_MARGIN if clipped else 1e-10)
        assert k == int(np.sum(norms > b))
    full = fns.clipped_grad_sum_subset(q, 1.0, np.arange(40))[0]
    np.testing.assert_allclose(full, fns.clipped_grad_sum(q, 1.0)[0], rtol=2 * F32_MARGIN)
    fns.chunk_size = 2  # chunked reads give the same sum
    np.testing.assert_allclose(fns.clipped_grad_sum_subset(q, 1.0, np.arange(40))[0], full)
    got, k = fns.clipped_grad_sum_subset(q, 1.0, np.array([], dtype=int))
    np.testing.assert_array_equal(got, 0.0)
    assert k == 0


# -- the known bias on a conjugate posterior -------------------------------------------------------

N, Q_RATE, CLIP, SIGMA = 50, 0.2, 10.0, 0.2


def _normal_setup():
    """x_i ~ N(theta, 1), theta ~ N(0, 10^2), n = 50: posterior N(m, 1/P), P = n + 0.01."""
    model, m, sd = normal_mean_model(n=N, d=1)
    data = np.asarray(model.rvs_to_values[model["x"]].data)[:, 0]
    return model, float(m[0]), 1.0 / float(sd[0]) ** 2, data


def _mcse_of_mean(series: np.ndarray) -> float:
    """Monte Carlo standard error of the mean of a (chain, draw) series (ArviZ ESS)."""
    ess = float(az.ess(series))
    assert ess > 300, f"effective sample size {ess:.0f} too small for the test"
    return float(series.std() / np.sqrt(ess))


@pytest.mark.slow
def test_sgld_matches_its_known_biased_stationary_law():
    """Clipping inactive (|x_i - theta| << C), Poisson minibatch q = 0.2 and DP noise
    sigma = 0.2. Stationary mean: the posterior mean m. Stationary variance: the closed form
    of :func:`sgld_gaussian_variance` with the minibatch variance
    V(theta) = ((1 - q)/q) sum_i (x_i - theta)^2 = V0' + V1 (theta - m)^2 and the DP noise
    (sigma C / q)^2. Both checked within 4 MCSE; the unbiased 1/P lies many MCSE away."""
    model, m, P, x = _normal_setup()
    eta = 0.01
    with model:
        step = DPSGLD(clip_bound=CLIP, step_size=eta, sampling_rate=Q_RATE, noise_multiplier=SIGMA)
        idata = pm.sample(3000, tune=300, chains=2, cores=1, step=step, random_seed=3, **SAMPLE)
    th = posterior_array(idata, "theta")[..., 0]
    c = m - x.mean()
    s_xx = float(np.sum((x - x.mean()) ** 2))
    v0 = (1 - Q_RATE) / Q_RATE * (s_xx + N * c**2) + (SIGMA * CLIP / Q_RATE) ** 2
    v1 = N * (1 - Q_RATE) / Q_RATE
    v = sgld_gaussian_variance(P, eta, v0, v1)
    assert abs(th.mean() - m) < 4 * _mcse_of_mean(th), (th.mean(), m)
    dev2 = (th - m) ** 2
    mcse_v = _mcse_of_mean(dev2)
    print(f"SGLD: var {dev2.mean():.5f}, closed form {v:.5f}, 1/P {1 / P:.5f}, MCSE {mcse_v:.5f}")
    assert abs(dev2.mean() - v) < 4 * mcse_v
    assert abs(dev2.mean() - 1 / P) > 8 * mcse_v  # the bias is real and the test sees it
    assert not idata["sample_stats"]["diverging"].values.any()


@pytest.mark.slow
def test_sgnht_matches_its_stationary_identity():
    """Ding et al.'s discretisation on a 1-d Gaussian target N(m, 1/P): in stationarity
    E[p^2] = 1 (thermostat), and u = theta - m satisfies exactly P E[u^2] = 1 - E[xi u p]
    (p_t = (theta_t - theta_{t-1}) / eta, xi_t the published thermostat; see the docs page):
    the variance is biased by about -xi_bar eta / (2P). Checked within 4 MCSE, with the mean
    against the posterior mean; the clipping is inactive and q = 0.2, sigma = 0.2."""
    model, m, P, _ = _normal_setup()
    eta, A = 0.04, 3.0
    with model:
        step = DPSGNHT(
            clip_bound=CLIP, step_size=eta, diffusion=A, sampling_rate=Q_RATE,
            noise_multiplier=SIGMA,
        )  # fmt: skip
        idata = pm.sample(4000, tune=300, chains=2, cores=1, step=step, random_seed=4, **SAMPLE)
    th = posterior_array(idata, "theta")[..., 0]
    xi = idata["sample_stats"]["thermostat"].values
    u, p = th[:, 1:] - m, np.diff(th, axis=1) / eta
    assert abs(th.mean() - m) < 4 * _mcse_of_mean(th), (th.mean(), m)
    assert abs(np.mean(p**2) - 1) < 4 * _mcse_of_mean(p**2)
    w = P * u**2 + xi[:, 1:] * u * p - 1.0
    mcse_w = _mcse_of_mean(w)
    print(
        f"SGNHT: P var {P * np.mean(u**2):.4f}, 1 - E[xi u p] {1 - np.mean(xi[:, 1:] * u * p):.4f}"
        f", xi_bar {xi.mean():.3f}, MCSE {mcse_w:.4f}"
    )
    assert abs(w.mean()) < 4 * mcse_w
    assert abs(P * np.mean(u**2) - 1) > 4 * mcse_w  # the discretisation bias is visible


# -- privacy accounting ---------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [DPSGLD, DPSGNHT])
def test_report_equals_the_poisson_subsampled_closed_form(cls):
    model, *_ = normal_mean_model(n=40, d=2)
    with model:
        step = cls(clip_bound=2.0, step_size=1e-3, batch_size=8, noise_multiplier=0.7)
        idata = pm.sample(25, tune=5, chains=3, cores=1, step=step, random_seed=4, **SAMPLE)
    q = 8 / 40
    z_int = (
        sgld_intrinsic_noise_multiplier(1e-3, q, 2.0)
        if cls is DPSGLD
        else sgnht_intrinsic_noise_multiplier(1e-3, q, 2.0, 1.0)
    )
    z = float(np.hypot(0.7, z_int))
    assert step.total_noise_multiplier == pytest.approx(z, rel=1e-14)
    rep = pymc_dp.privacy_report(idata, delta=1e-4)
    k = 3 * (25 + 5)
    want = poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(z, q, k)], 1e-4)
    assert rep.epsilon == pytest.approx(want, rel=1e-12)
    assert rep.mu == 0.0 and rep.releases == k and rep.iterations == k
    assert "Poisson-subsampled" in rep.mechanism
    ss = idata["sample_stats"]
    assert np.all(ss["dp_poisson_q"].values == q)
    assert np.all(ss["dp_poisson_sigma"].values == z)
    assert np.all(np.isnan(ss["grad_clip_fraction_NONPRIVATE"].values))
    assert not rep.nonprivate_diagnostics
    # nothing data-dependent is published: only data-free constants and post-processing
    assert set(ss.data_vars) >= {"dp_poisson_sigma", "dp_poisson_q", "step_size", "diverging"}
    assert "batch_size" not in ss.data_vars


def test_report_of_two_steps_counts_each_steps_releases():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    with pm.Model():
        a = pm.Normal("a", 0, 10)
        b = pm.Normal("b", 0, 10)
        pm.Normal("x", pm.math.stack([a, b]), 1, observed=x)
        kw = dict(clip_bound=2.0, step_size=1e-3, batch_size=8, noise_multiplier=0.7)
        s1, s2 = DPSGLD([a], **kw), DPSGLD([b], **kw)
        idata = pm.sample(10, tune=5, chains=1, cores=1, step=[s1, s2], random_seed=1, **SAMPLE)
    rep = pymc_dp.privacy_report(idata, delta=1e-4)
    event = PoissonSubsampledGaussian(s1.total_noise_multiplier, 0.2, 2 * 15)
    assert rep.epsilon == pytest.approx(poisson_subsampled_gaussian_epsilon([event], 1e-4))


def test_calibration_meets_the_target_from_below_and_guards_the_budget():
    model, *_ = normal_mean_model(n=40, d=1)
    kw = dict(clip_bound=2.0, step_size=0.01, batch_size=10, diffusion=1.0)
    with model:
        idata = pymc_dp.sample(
            step=DPSGNHT, epsilon=1.0, delta=1e-3, draws=30, tune=10, chains=2, step_kwargs=kw,
            cores=1, random_seed=1, **SAMPLE,
        )  # fmt: skip
        rep = pymc_dp.privacy_report(idata)
        assert rep.epsilon <= 1.0
        assert rep.epsilon == pytest.approx(1.0, rel=2e-3)  # the calibration's tolerance
        z_run = idata["sample_stats"]["dp_poisson_sigma"].values
        assert np.all(z_run == z_run.flat[0])
        assert z_run.flat[0] > sgnht_intrinsic_noise_multiplier(0.01, 0.25, 2.0, 1.0)  # added
        step = DPSGNHT(noise_multiplier=1.0, draws=30, tune=10, chains=2, **kw)
        with pytest.raises(pymc_dp.BudgetExceededError, match="calibrated for 40 iterations"):
            pm.sample(31, tune=10, chains=1, cores=1, step=step, random_seed=1, **SAMPLE)


def test_diffusion_noise_alone_can_meet_the_target():
    """With a small step size and clip bound SGLD's own noise exceeds the calibrated
    multiplier: nothing is added (the run then spends less than the target)."""
    model, *_ = normal_mean_model(n=40, d=1)
    with model, pytest.warns(UserWarning, match="under-spent"):
        step = DPSGLD(
            clip_bound=0.5, step_size=1e-4, batch_size=10, epsilon=1.0, delta=1e-3, draws=10,
            tune=0, chains=1,
        )  # fmt: skip
    assert step.noise_multiplier == 0.0 and step.grad_noise_std == 0.0
    assert step.total_noise_multiplier == step.intrinsic_noise_multiplier
    assert step.intrinsic_noise_multiplier == pytest.approx(2 * 0.25 / (0.5 * 1e-2), rel=1e-14)
    z = step.calibrated_noise_multiplier
    assert z < step.total_noise_multiplier
    assert poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(z, 0.25, 10)], 1e-3) <= 1


@pytest.mark.parametrize("cls", [DPSGLD, DPSGNHT])
def test_an_underspent_target_is_said_at_construction_with_the_numbers(cls):
    """A target the step's own noise under-spends (issue 18: target 10, spent 0.72) is
    warned about when the step is built, with the spend and what would use the budget; the
    step size the warning names makes the step add noise and meet the target."""
    import re
    import warnings

    model, *_ = normal_mean_model(n=200, d=1)
    kw = dict(clip_bound=1.0, batch_size=20, epsilon=10.0, delta=1e-5, draws=50, tune=0,
              chains=2)  # fmt: skip
    with model, pytest.warns(UserWarning) as rec:
        step = cls(step_size=1e-5, **kw)
    msgs = [str(w.message) for w in rec if "under-spent" in str(w.message)]
    assert len(msgs) == 1, [str(w.message) for w in rec]
    msg = msgs[0]
    spent = poisson_subsampled_gaussian_epsilon(
        [PoissonSubsampledGaussian(step.intrinsic_noise_multiplier, 0.1, 100)], 1e-5
    )
    assert spent < 10.0 and step.noise_multiplier == 0.0
    assert "epsilon=10" in msg and f"spend epsilon={spent:.4g}" in msg
    assert "more iterations" in msg and "larger step size" in msg
    eta_min = float(re.search(r"step_size >= ([0-9.e+-]+)", msg).group(1))
    assert eta_min > 1e-5
    # at that step size (a hair above, for the printed rounding) noise is added: no warning
    with model, warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.filterwarnings("ignore", message="(?!.*under-spent)")
        step2 = cls(step_size=eta_min * 1.01, **kw)
    assert step2.noise_multiplier > 0.0
    assert step2.intrinsic_noise_multiplier <= step2.calibrated_noise_multiplier
    # just below it, the own noise still exceeds the target's: warned
    with model, pytest.warns(UserWarning, match="under-spent"):
        cls(step_size=eta_min * 0.95, **kw)


def _run(cls, cores: int):
    model, *_ = normal_mean_model(n=30, d=2)
    with model:
        step = cls(clip_bound=5.0, step_size=0.01, batch_size=6, noise_multiplier=0.5)
        return pm.sample(20, tune=10, chains=2, cores=cores, step=step, random_seed=7, **SAMPLE)


@pytest.mark.parametrize("cls", [DPSGNHT])  # the step with per-chain state (DPSGLD has none)
def test_same_draws_for_cores_1_and_2(cls):
    a, b = _run(cls, 1), _run(cls, 2)
    np.testing.assert_array_equal(posterior_array(a, "theta"), posterior_array(b, "theta"))
    if cls is DPSGNHT:  # per-chain momentum and thermostat are reset and seeded per chain
        np.testing.assert_array_equal(
            a["sample_stats"]["thermostat"].values, b["sample_stats"]["thermostat"].values
        )
    assert not np.array_equal(posterior_array(a, "theta")[0], posterior_array(a, "theta")[1])


# -- the audit ------------------------------------------------------------------------------------

AUDIT_DELTA = 1e-5


@functools.lru_cache(maxsize=1)
def _audit_neighbours():
    """Ten records; record 0 is +100 in D and -100 in D', the others sit at theta = 0 (zero
    gradient there, so the audit sees only the differing record)."""
    out = []
    for first in (100.0, -100.0):
        x = np.zeros(10)
        x[0] = first
        with pm.Model() as model:
            t = pm.Normal("t", 0, 3)
            pm.Normal("x", t, 1, observed=x)
        out.append(build_record_functions(model, model.value_vars, model.initial_point())[0])
    return out


_AUDIT = dict(clip_bound=2.0, sampling_rate=0.5, noise_multiplier=0.5)
_SGLD = dict(step_size=0.04)
_SGNHT = dict(step_size=0.04, diffusion=2.0)


def _claim(method: str) -> float:
    c, q = _AUDIT["clip_bound"], _AUDIT["sampling_rate"]
    z_int = (
        sgld_intrinsic_noise_multiplier(_SGLD["step_size"], q, c)
        if method == "sgld"
        else sgnht_intrinsic_noise_multiplier(_SGNHT["step_size"], q, c, _SGNHT["diffusion"])
    )
    z = total_noise_multiplier(_AUDIT["noise_multiplier"], z_int)
    return poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(z, q, 1)], AUDIT_DELTA)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "variant", "broken", "must_hold"),
    [
        ("sgld", "as shipped", {}, True),
        ("sgld", "noise scale halved", {"noise_scale": 0.5}, False),
        ("sgld", "clipping removed", {"clip": False}, False),
        ("sgnht", "as shipped", {}, True),
        ("sgnht", "noise scale halved", {"noise_scale": 0.5}, False),
        ("sgnht", "clipping removed", {"clip": False}, False),
    ],
)
def test_audit(method, variant, broken, must_hold):
    """One iteration from theta = 0 on D and D': the empirical lower bound stays below the
    accountant's claim for the shipped mechanism and exceeds it for the broken variants."""
    d, d2 = _audit_neighbours()
    q0 = np.array([0.0])
    if method == "sgld":
        run = sgld_runner(d, d2, q0, **_AUDIT, **_SGLD, **broken)
    else:
        run = sgnht_runner(d, d2, q0, np.array([0.0]), **_AUDIT, **_SGNHT, **broken)
    claim = _claim(method)
    res = audit_mechanism(run, AUDIT_DELTA, trials=200_000, seed=3)
    print(
        f"DP-{method.upper()} [{variant}]: claimed eps {claim:.3f}, empirical lower bound "
        f"{res.eps_lb:.3f} ({res.event})"
    )
    if must_hold:
        assert res.eps_lb <= claim
        assert res.eps_lb > 0.05, "the audit should find some leakage of a real mechanism"
    else:
        assert res.eps_lb > claim


# -- bad input: a clear error naming the parameter, before any data is read ------------------------

_OK = dict(clip_bound=1.0, step_size=0.01, batch_size=5, noise_multiplier=1.0)
_TARGET = dict(clip_bound=1.0, step_size=0.01, batch_size=5, epsilon=1.0, delta=1e-5, draws=1,
               tune=0, chains=1)  # fmt: skip


@pytest.mark.parametrize("cls", [DPSGLD, DPSGNHT])
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({**_OK, "clip_bound": 0.0}, "clip_bound"),
        ({**_OK, "clip_bound": np.inf}, "clip_bound"),
        ({**_OK, "step_size": 0.0}, "step_size"),
        ({**_OK, "step_size": -1.0}, "step_size"),
        ({**_OK, "step_size": np.nan}, "step_size"),
        ({**_OK, "batch_size": 11}, "batch_size must be at most"),
        ({**_OK, "batch_size": 0}, "batch_size"),
        ({**_OK, "batch_size": 2.5}, "batch_size"),
        ({**_OK, "batch_size": None}, "exactly one of batch_size"),
        ({**_OK, "sampling_rate": 0.5}, "exactly one of batch_size"),
        ({**_OK, "batch_size": None, "sampling_rate": 1.5}, "sampling_rate"),
        ({**_OK, "batch_size": None, "sampling_rate": 0.0}, "sampling_rate"),
        ({**_OK, "noise_multiplier": -0.1}, "noise_multiplier"),
        ({**_OK, "noise_multiplier": None}, "noise_multiplier"),
        ({**_OK, "epsilon": 1.0}, "not both"),
        ({**_TARGET, "draws": None}, "draws"),
        ({**_TARGET, "epsilon": -1.0}, "epsilon"),
        ({**_TARGET, "delta": 0.0}, "delta"),
    ],
)
def test_bad_input_raises_before_reading_data(cls, kwargs, match, monkeypatch):
    import pymc_dp.step_methods.base as base

    def fail(*a, **k):  # the data must not be touched
        raise AssertionError("record functions were built before the input was validated")

    monkeypatch.setattr(base, "build_record_functions", fail)
    model, *_ = normal_mean_model(n=10, d=1)
    with model, pytest.raises(ValueError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cls(**kwargs)


def test_sgnht_diffusion_must_be_positive(monkeypatch):
    import pymc_dp.step_methods.base as base

    monkeypatch.setattr(base, "build_record_functions", lambda *a, **k: 1 / 0)
    model, *_ = normal_mean_model(n=10, d=1)
    for bad in (0.0, -1.0, np.nan):
        with model, pytest.raises(ValueError, match="diffusion"):
            DPSGNHT(**_OK, diffusion=bad)
