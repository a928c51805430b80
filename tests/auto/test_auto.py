"""Automatic mode (issue 17): the pre-sampling mechanisms, their privacy, exactness, plan."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import exact_laplace
from scipy import stats

import pymc_dp
from pymc_dp.accounting import GaussianEvent, compose_epsilon, gaussian_mu_for_epsilon
from pymc_dp.auto import BudgetSplit, auto_configure, check_data_bounds, plan
from pymc_dp.auto.configure import presample_phases
from pymc_dp.kernels.warmstart import (
    HISTOGRAM_SENSITIVITY,
    OUTER_SENSITIVITY,
    clip_grid,
    histogram_from_counts,
    histogram_quantile,
    noisy_histogram_quantile,
    private_laplace,
)
from pymc_dp.records import build_record_functions


# -- the noisy-histogram quantile ------------------------------------------------------------
def _counts_above(values, grid):
    v = np.asarray(values, dtype=float)
    return np.array([np.count_nonzero(~np.isfinite(v) | (v > b)) for b in grid])


def test_histogram_from_counts_bins_every_record_once():
    rng = np.random.default_rng(0)
    v = np.abs(rng.standard_cauchy(1000))
    v[:3] = np.nan  # non-finite: above every bound
    grid = clip_grid(0.01, 100.0, 9)
    hist = histogram_from_counts(v.size, _counts_above(v, grid))
    assert hist.sum() == v.size and np.all(hist >= 0)
    assert hist[-1] == np.count_nonzero(~np.isfinite(v) | (v > grid[-1]))
    assert hist[0] == np.count_nonzero(v <= grid[0])
    k = 4
    assert hist[k + 1] == np.count_nonzero((v > grid[k]) & (v <= grid[k + 1]))


def test_histogram_sensitivity_is_sqrt2_under_replace_one():
    """Brute force: replacing any one record moves the histogram by at most sqrt(2) in L2."""
    rng = np.random.default_rng(1)
    grid = clip_grid(0.1, 10.0, 7)
    v = rng.uniform(0, 12, 50)
    h = histogram_from_counts(v.size, _counts_above(v, grid))
    worst = 0.0
    for i in range(v.size):
        for new in (0.0, 0.5, 3.0, 11.0, np.inf):
            w = v.copy()
            w[i] = new
            h2 = histogram_from_counts(w.size, _counts_above(w, grid))
            worst = max(worst, float(np.linalg.norm(h - h2)))
    assert worst == pytest.approx(HISTOGRAM_SENSITIVITY)


def test_noisy_quantile_without_noise_is_the_grid_quantile():
    v = np.arange(1, 101, dtype=float) / 10.0  # 0.1 ... 10
    grid = clip_grid(0.1, 10.0, 41)
    hist = histogram_from_counts(v.size, _counts_above(v, grid))
    b, _ = noisy_histogram_quantile(hist, grid, 0.9, 1e-12, np.random.default_rng(0))
    assert np.mean(v <= b) >= 0.9
    below = grid[grid < b]
    assert below.size == 0 or np.mean(v <= below[-1]) < 0.9  # the smallest such grid value


def test_a_noise_spike_in_an_empty_bin_passes_3_sds_but_not_the_bonferroni_threshold():
    """The anchor's quantile (0.9999) is set by the top records: 3 sds let one empty bin's
    noise through (4 % of the runs on 29 bins), the threshold ``threshold_sds`` does not."""
    grid = clip_grid(0.1, 10.0, 9)
    noisy = np.zeros(10)
    noisy[2] = 1000.0  # every record below grid[2]
    noisy[8] = 3.5  # noise of sd 1 in an empty bin, above 3 sds
    assert histogram_quantile(noisy, grid, 0.9999, 1000, 1.0) == grid[8]
    assert histogram_quantile(noisy, grid, 0.9999, 1000, 1.0, threshold_sds=4.0) == grid[2]


def test_the_bound_extends_past_adjacent_bins_that_hold_records_below_the_threshold():
    """With ``extend_sds`` the bound moves up past the bins next to it that hold at least
    that many noise sds (records the high threshold hid), one bin at a time, and stops at
    the first bin below: a far bin passing the lower bar does not move it."""
    grid = clip_grid(0.1, 10.0, 9)
    noisy = np.zeros(10)
    noisy[2] = 1000.0
    noisy[3] = 3.0  # 3 sds: hidden by a 4-sd threshold, kept at 2
    noisy[4] = 2.5
    noisy[5] = 1.0  # below 2 sds: the extension stops here
    noisy[7] = 3.5  # far from the kept bins: no effect on the extension
    assert histogram_quantile(noisy, grid, 0.9999, 1000, 1.0, threshold_sds=4.0) == grid[2]
    extended = histogram_quantile(noisy, grid, 0.9999, 1000, 1.0, 4.0, extend_sds=2.0)
    assert extended == grid[4]
    noisy[3] = 1.9  # the bin next to the bound below the bar: nothing moves
    assert histogram_quantile(noisy, grid, 0.9999, 1000, 1.0, 4.0, extend_sds=2.0) == grid[2]


def test_outer_product_sensitivity_bound():
    """||c c^T - c' c'^T||_F <= sqrt(2) b^2 for ||c||, ||c'|| <= b, attained at c orthogonal c'."""
    rng = np.random.default_rng(2)
    b = 1.7
    worst = 0.0
    for _ in range(2000):
        c, c2 = rng.normal(size=(2, 4))
        c *= b * rng.uniform() ** 0.1 / np.linalg.norm(c)
        c2 *= b / np.linalg.norm(c2)
        worst = max(worst, float(np.linalg.norm(np.outer(c, c) - np.outer(c2, c2))))
    assert worst <= OUTER_SENSITIVITY * b * b + 1e-12
    e1, e2 = np.eye(4)[:2] * b
    attained = np.linalg.norm(np.outer(e1, e1) - np.outer(e2, e2))
    assert attained == pytest.approx(OUTER_SENSITIVITY * b * b)


# -- the private Laplace approximation -----------------------------------------------------------
def _normal_model(n=400, seed=0, prior_sd=10.0):
    rng = np.random.default_rng(seed)
    x = rng.normal(1.5, 1.0, n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, prior_sd)
        pm.Normal("x", mu, 1.0, observed=x)
    return model, x


def test_private_laplace_without_noise_is_the_exact_posterior_of_a_conjugate_model():
    """Normal mean, known sd: the posterior is N(m, v) in closed form; with clipping inactive
    (quantile 1) and no noise the Fisher-scoring approximation must equal it."""
    model, x = _normal_model()
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    grid = clip_grid(1e-3, 1e4, 40)
    info = private_laplace(
        q0=np.zeros(1),
        n=x.size,
        prior_grad=lambda q: fns.prior_logp_and_grad(q)[1],
        clipped_moments=lambda q, b, b2, m, c=None: fns.clipped_grad_moments(
            q, b, m, outer_bound=b2, centre=c
        ),
        grad_counts_above=lambda q, g, m: fns.grad_norm_counts(q, g, m),
        grid=grid,
        quantile=1.0 - 1e-9,
        outer_quantile=1.0 - 1e-9,
        grad_noise_multiplier=1e-12,
        outer_noise_multiplier=1e-12,
        hist_noise_multiplier=1e-12,
        newton_steps=10,
        rng=np.random.default_rng(0),
    )
    v = 1.0 / (x.size + 1.0 / 100.0)
    m = v * x.sum()
    assert info.mean[0] == pytest.approx(m, abs=1e-6)
    # the empirical Fisher information at the mode is sum_i (x_i - m)^2, not n: the
    # approximation's variance is 1 / (sum (x_i - m)^2 + 1/100), within sampling error of v
    assert info.cov[0, 0] == pytest.approx(1.0 / (np.sum((x - m) ** 2) + 0.01), rel=1e-6)
    assert info.cov[0, 0] == pytest.approx(v, rel=4 * np.sqrt(2.0 / x.size))
    assert info.anchor is not None and info.grad_releases == 2 * 11
    assert info.anchor_bound >= info.clip_bounds[-1]


def test_centred_newton_steps_reach_a_far_posterior_of_a_quadratic_log_likelihood():
    """Normal mean, known sd, data 40 record sds from the start (800 posterior sds): the
    log-likelihood is quadratic, the centred outer products are its curvature wherever the
    iterate is, and the steps (trust region 200 sds) reach the closed-form posterior mean
    exactly. The uncentred ones (mean part ``n cbar cbar^T`` in the curvature) move about
    1/40 record sd per step and stay far: what kept the automatic mode off the DP-HMC
    paper's 10-d Gaussian."""
    rng = np.random.default_rng(3)
    x = rng.normal(40.0, 1.0, 400)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 100.0)
        pm.Normal("x", mu, 1.0, observed=x)
    v = 1.0 / (x.size + 1e-4)
    post_mean, post_sd = v * x.sum(), np.sqrt(v)
    info = exact_laplace(model, x.size, centred=True)
    assert info.mean[0] == pytest.approx(post_mean, abs=1e-6)
    slow = exact_laplace(model, x.size, centred=False)
    assert abs(slow.mean[0] - post_mean) > 100 * post_sd


def test_a_newton_step_that_raises_the_released_gradient_is_undone():
    """Normal with unknown sd started 16 times too wide: far from the mode the records'
    gradients are small against the Hessian, the centred curvature is too low and the
    first Newton step overshoots; the released gradient at the new point (in the old
    precision's metric) is larger than at the old one, so the step is undone and the
    iterations go on from the old point with the uncentred, damped steps: the path is the
    uncentred iteration's, one iteration later."""
    x = np.random.default_rng(0).normal(0.5, 0.3, 400)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        s = pm.HalfNormal("s", 5.0)
        pm.Normal("x", mu, s, observed=x)
    newton = exact_laplace(model, x.size, centred=True)
    damped = exact_laplace(model, x.size, centred=False)
    assert newton.newton_rejected == 1 and damped.newton_rejected is None
    assert len(newton.path) == len(damped.path) - 1
    np.testing.assert_allclose(newton.path, damped.path[:-1], atol=1e-6)


def test_the_warm_starts_steps_are_bounded_by_the_prior_scaled_region():
    """A logistic intercept, 195 ones in 200 records, prior N(0, 10): from 0 the centred
    curvature is ~0 (every record's score the same), the first Newton step is capped only
    by its Mahalanobis region (200 sds of the prior-sized approximation), the iterate
    saturates and the uncentred steps after the rejected one leave: noise-free, the warm
    start ends 7e4 away on PyMC 5, 1.1e3 on PyMC 6 (the catholic regression's failure at
    epsilon 3, 1 680 NUTS sds).
    With ``max_move`` (3 prior sds, data-free) no step moves further and the warm start
    stays within the prior's region of the exact mode."""
    n, ones, prior_sd = 200, 195, 10.0
    y = np.zeros(n)
    y[:ones] = 1.0
    with pm.Model() as model:
        X = pm.Data("X", np.ones((n, 1)))
        a = pm.Normal("a", 0.0, prior_sd, shape=1)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, a), observed=y)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())

    def run(max_move):
        return private_laplace(
            q0=np.zeros(1), n=n, prior_grad=lambda q: fns.prior_logp_and_grad(q)[1],
            clipped_moments=lambda q, b, b2, m, c=None: fns.clipped_grad_moments(
                q, b, m, outer_bound=b2, centre=c
            ),
            grad_counts_above=lambda q, g, m: fns.grad_norm_counts(q, g, m),
            grid=clip_grid(1e-3, 1e4, 40), quantile=1.0 - 1e-9, outer_quantile=1.0 - 1e-9,
            grad_noise_multiplier=1e-12, outer_noise_multiplier=1e-12,
            hist_noise_multiplier=1e-12, newton_steps=10,
            rng=np.random.default_rng(0), max_move=max_move,
        )  # fmt: skip

    # the exact mode: ones / n = sigmoid(a) + a / (n prior_sd^2) (Newton, exact here)
    mode = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-mode))
        mode += (ones - n * p - mode / prior_sd**2) / (n * p * (1 - p) + 1 / prior_sd**2)
    bound = 3.0 * prior_sd
    free = run(None)
    assert abs(free.mean[0] - mode) > 10 * bound  # the failure the bound is for
    info = run(np.array([bound]))
    path = np.concatenate([[0.0], np.ravel(info.path)])
    assert np.all(np.abs(np.diff(path)) <= bound * (1 + 1e-9)), path
    assert info.move_cuts > 0
    assert abs(info.mean[0] - mode) < bound


@pytest.mark.parametrize("seed", [0, 1])
def test_a_saturating_logistic_intercept_is_not_confidently_wrong(seed):
    """End to end, the same intercept on 2 000 records (1 950 ones), epsilon 1: before the
    warm start's steps were bounded by the prior (`private_laplace` ``max_move``) the
    result was 11.9 and 7.9 of its own sds off the exact mode (DP seeds 0, 1; PyMC 5; on
    PyMC 6 seed 0 failed likewise), its sd the posterior's, no warning; now within 2 of its
    own sds (flagged, prior-wide)."""
    n, ones = 2000, 1950
    y = np.zeros(n)
    y[:ones] = 1.0
    with pm.Model() as model:
        X = pm.Data("X", np.ones((n, 1)))
        a = pm.Normal("a", 0.0, 10.0, shape=1)
        pm.Bernoulli("y", logit_p=pm.math.dot(X, a), observed=y)
    mode = 0.0
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-mode))
        mode += (ones - n * p - mode / 100.0) / (n * p * (1 - p) + 0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with model:
            idata = pymc_dp.sample(
                step=None, epsilon=1.0, delta=1e-6, chains=4, random_seed=seed,
                data_bounds={"X": (0.0, 1.0), "y": (0.0, 1.0)}, progressbar=False,
            )  # fmt: skip
    draws = np.asarray(idata.posterior["a"], dtype=float).ravel()
    # the mean of 4 000 Gaussian draws is within 0.05 of its own sds of the result's mean
    assert abs(draws.mean() - mode) < 2.0 * draws.std()


def test_clipped_grad_moments_against_a_per_record_loop():
    model, x = _normal_model(n=50)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q = np.array([0.3])
    b = 1.0
    g = (x - 0.3)[:, None]
    c = g * np.minimum(1.0, b / np.abs(g))
    s1, s2 = fns.clipped_grad_moments(q, b)
    np.testing.assert_allclose(s1, c.sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(s2, c.T @ c, rtol=1e-10)


def test_residual_ratio_sum_plus_control_variate_is_the_exact_ratio_sum():
    """sum_i r_i = sum_i (r_i - c_i . dq) + (sum_i c_i) . dq for any c_i: with the bound
    inactive the control-variate test sees exactly the log-likelihood ratio."""
    model, x = _normal_model(n=80)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    anchor, q0, q1 = np.array([1.4]), np.array([1.45]), np.array([1.6])
    for grad_bound in (0.5, 100.0):  # clipped or not, the identity holds
        res, k = fns.clipped_residual_ratio_sum(q1, q0, 1e6, anchor, grad_bound)
        g = (x - anchor[0])[:, None]
        c = g * np.minimum(1.0, grad_bound / np.abs(g))
        exact = fns.loglik_ratio(q1, q0).sum()
        assert k == 0
        assert res + float(c.sum(axis=0) @ (q1 - q0)) == pytest.approx(exact, rel=1e-9)
    # a tight bound clips: the count says so, the sum is within the bounds
    res, k = fns.clipped_residual_ratio_sum(q1, q0, 1e-4, anchor, 0.5)
    assert k > 0 and abs(res) <= 1e-4 * x.size + 1e-12


# -- exactness of the configured sampler with clipping inactive ----------------------------------
@pytest.mark.slow
def test_independence_penalty_with_control_variate_is_exact():
    """DPPenaltyMetropolis(proposal='independent', control_variate=exact sum) with a clip bound
    that never binds samples the conjugate posterior N(m, v): mean and variance within 4 MCSE."""
    model, x = _normal_model(n=200, seed=3)
    v = 1.0 / (x.size + 0.01)
    m = v * x.sum()
    anchor = np.array([m + 0.05])
    g_sum = np.array([np.sum(x - anchor[0])])  # exact (no clipping at bound 100)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=5.0,
            noise_multiplier=0.15,
            proposal="independent",
            proposal_mean=np.array([m - 0.02]),
            proposal_cov=np.array([[1.5 * v]]),
            control_variate=(anchor, g_sum, 100.0),
        )
        idata = pm.sample(
            draws=6000, tune=0, chains=2, step=step, progressbar=False, random_seed=11,
            compute_convergence_checks=False, initvals={"mu": m},
        )  # fmt: skip
    draws = idata.posterior["mu"].values.ravel()
    import arviz as az

    ess = float(az.ess(idata, var_names=["mu"])["mu"])
    mcse_mean = np.sqrt(v / ess)
    assert abs(draws.mean() - m) < 4 * mcse_mean
    mcse_var = v * np.sqrt(2.0 / ess)
    assert abs(draws.var() - v) < 4 * mcse_var
    assert (
        stats.kstest((draws[:: max(1, int(draws.size / ess))] - m) / np.sqrt(v), "norm").pvalue
        > 1e-3
    )


# -- budget and report -----------------------------------------------------------------------------
def test_presample_phases_take_their_shares_of_mu():
    mu = gaussian_mu_for_epsilon(3.0, 1e-6)
    split = BudgetSplit()
    phases = presample_phases(mu, split)
    total = sum(p.mu for p in phases)
    share = split.warm_start + split.histograms + split.clip_selection
    assert total == pytest.approx(share * mu, rel=1e-12)
    with pytest.raises(ValueError, match="leave at least 20 %"):
        BudgetSplit(warm_start=0.7, histograms=0.1)


def test_growing_warm_start_phases_compose_to_their_shares():
    """With ``growth`` each warm-start phase lists one multiplier per iteration, growing
    shares of the phase; the releases at those multipliers compose (Gaussian mus add) to
    exactly the phase's mu, the one its single ``noise_multiplier`` is accounted at; the
    phases' total is the same as with equal shares."""
    from pymc_dp.kernels.warmstart import growing_schedule

    mu = gaussian_mu_for_epsilon(3.0, 1e-6)
    split = BudgetSplit()
    equal = presample_phases(mu, split, newton_steps=4)
    grown = presample_phases(mu, split, newton_steps=4, growth=1.3)
    assert all(p.schedule is None for p in equal)
    assert [p.name for p in grown] == [p.name for p in equal]
    w = growing_schedule(5, 1.3)
    for p, q in zip(grown, equal, strict=True):
        assert p.noise_multiplier == pytest.approx(q.noise_multiplier, rel=1e-12)
        if p.releases == 1:  # the clip selection: one release, no schedule
            assert p.schedule is None
            continue
        z = np.array(p.schedule)
        assert z.size == p.releases == 5 and np.all(np.diff(z) < 0)  # less noise later
        assert np.sum(0.5 / z**2) == pytest.approx(p.mu, rel=1e-12)
        np.testing.assert_allclose((1 / z**2) / np.sum(1 / z**2), w, rtol=1e-12)


def test_anchor_share_minimises_the_predicted_error():
    """choose_anchor_share against a brute-force grid of the same prediction."""
    from pymc_dp.auto.configure import choose_anchor_share, tilt_sd
    from pymc_dp.auto.predict import best_independent_length

    cov = np.diag([0.01, 0.04])

    def ess_of(mu_s):
        return best_independent_length(mu_s, 0.05, minimum=200, maximum=20_000)

    mu_a, pred, err = choose_anchor_share(1.0, cov, 3.0, ess_of)
    assert 0 < mu_a < 1.0
    for frac in (0.1, 0.3, 0.5, 0.7, 0.9):
        other = np.sqrt(np.max(tilt_sd(cov, 3.0, frac) ** 2) + 1.0 / ess_of(1.0 - frac).ess)
        assert err <= other + 1e-12
    # tilt: the mean shift of N(m, cov) tilted by exp(xi . theta) is cov xi (closed form)
    rng = np.random.default_rng(0)
    xi = rng.normal(size=(200_000, 2)) * 2 * 3.0 * np.sqrt(1 / (2 * 0.5))
    shift_sd = (xi @ cov).std(axis=0) / np.sqrt(np.diag(cov))
    np.testing.assert_allclose(shift_sd, tilt_sd(cov, 3.0, 0.5), rtol=0.01)


@pytest.mark.slow
def test_auto_mode_end_to_end_reports_every_phase_within_the_target():
    model, x = _normal_model(n=3000, seed=5)
    with model:
        idata = pymc_dp.sample(
            epsilon=3.0, delta=1e-5, chains=2, random_seed=1, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    rep = pymc_dp.privacy_report(idata, model=model, attach=False)
    assert rep.private and rep.epsilon <= 3.0
    assert rep.epsilon > 2.9  # the budget is spent, not wasted
    assert "phases: warm start" in rep.mechanism
    # closed form: the pre-sampling phases' mu plus the chains' mu, composed exactly
    pre = float(idata.attrs["dp_presample_mu"])
    chains_mu = float(idata.sample_stats["dp_mu"].sum())
    groups = list(idata.children) if hasattr(idata, "children") else idata.groups()
    if "warmup_sample_stats" in groups:
        chains_mu += float(idata.warmup_sample_stats["dp_mu"].sum())
    z = np.sqrt(1.0 / (2.0 * (pre + chains_mu)))
    assert rep.epsilon == pytest.approx(compose_epsilon([GaussianEvent(z)], 1e-5), rel=1e-9)
    # the draws are posterior draws: within 1 posterior sd of the exact mean
    v = 1.0 / (x.size + 0.01)
    assert abs(float(idata.posterior["mu"].mean()) - v * x.sum()) < np.sqrt(v)
    for g in ("observed_data", "constant_data"):
        assert g not in groups


# -- API -------------------------------------------------------------------------------------------
def test_sample_takes_draws_first_and_step_as_keyword():
    model, _ = _normal_model(n=100)
    with model:
        with pytest.raises(TypeError, match="first parameter is draws"):
            pymc_dp.sample(pymc_dp.DPPenaltyMetropolis, epsilon=1.0, delta=1e-5)
        with pytest.raises(ValueError, match="needs epsilon= and delta="):
            pymc_dp.sample(100)
        with pytest.raises(ValueError, match="auto_kwargs"):
            pymc_dp.sample(
                10, step=pymc_dp.DPPenaltyMetropolis, epsilon=1.0, delta=1e-5,
                auto_kwargs={"clip_quantile": 0.9},
            )  # fmt: skip


def test_data_bounds_are_checked_against_names_before_any_data_is_read(monkeypatch):
    model, _ = _normal_model(n=100)
    assert check_data_bounds(model, {"x": (-5, 5)}) == {"x": (-5.0, 5.0)}
    import pymc_dp.records.store as store

    def no_read(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("data read")

    monkeypatch.setattr(store.InMemoryRecords, "chunks", no_read)
    with model:
        with pytest.raises(ValueError, match="neither an observed variable"):
            pymc_dp.sample(epsilon=1.0, delta=1e-5, data_bounds={"y": (0, 1)})
        with pytest.raises(ValueError, match="low < high"):
            pymc_dp.sample(epsilon=1.0, delta=1e-5, data_bounds={"x": (1, 0)})
        with pytest.raises(ValueError, match="pair"):
            pymc_dp.sample(epsilon=1.0, delta=1e-5, data_bounds={"x": 3})


def test_plan_reads_no_data_and_warns_with_numbers(monkeypatch, capsys):
    import pymc_dp.records.store as store

    def no_read(*a, **k):  # pragma: no cover - must not be reached
        raise AssertionError("data read")

    monkeypatch.setattr(store.InMemoryRecords, "chunks", no_read)
    model, _ = _normal_model(n=200)
    with model:
        small = plan(epsilon=0.05, delta=1e-5)
        big = plan(epsilon=10.0, delta=1e-5, verbose=False)
    printed = capsys.readouterr().out
    assert "pymc_dp plan: n = 200 records, d = 1 parameters" in printed
    assert small.warnings and "at n = 200 and epsilon = 0.05 expect" in small.warnings[0]
    assert "needs epsilon >=" in small.warnings[0]
    assert small.predicted_error > big.predicted_error
    assert not big.warnings
    # the epsilon the warning names does reach the usable error
    eps_needed = float(small.warnings[0].split("needs epsilon >= ")[1].split()[0])
    with model:
        ok = plan(epsilon=eps_needed * 1.01, delta=1e-5, verbose=False)
    assert ok.predicted_error <= 0.5 and not ok.warnings


def test_plan_predicts_the_benchmarks_statistic_and_lists_the_candidates():
    """The prediction is of the worst of d posterior means, median over runs (what
    benchmarks/bench_auto.py measures): worst_of(d) against a Monte Carlo median of the
    largest of d |N(0, 1)| (sd of a sample median over 20 000 runs: about 0.01)."""
    from pymc_dp.auto.plan import worst_of

    rng = np.random.default_rng(3)
    for d in (1, 3, 23):
        mc = np.median(np.abs(rng.normal(size=(20_000, d))).max(axis=1))
        assert abs(worst_of(d) - mc) < 0.04, (d, worst_of(d), mc)
    model, _ = _normal_model(n=200)
    with model:
        p = plan(epsilon=3.0, delta=1e-5, verbose=False)
    assert p.method == "laplace"
    assert set(p.candidates) == {"laplace", "stats", "groupstats", "chain"}
    assert isinstance(p.candidates["groupstats"], str)  # not a hierarchy: not a candidate
    assert "data_bounds" in p.candidates["stats"]  # not a candidate without declared bounds
    assert p.candidates["laplace"] == p.predicted_error < p.candidates["chain"]
    assert "laplace: " in str(p) and "<- chosen" in str(p)


def test_auto_configure_spends_exactly_the_budget():
    model, _ = _normal_model(n=500)
    with model:
        cfg = auto_configure(
            model, epsilon=2.0, delta=1e-5, chains=2, draws=None, tune=None,
            rng=np.random.default_rng(0), method="chain",
        )  # fmt: skip
    events = [GaussianEvent(p.noise_multiplier, p.releases) for p in cfg.phases]
    eps = compose_epsilon(events, 1e-5)
    assert eps <= 2.0 and eps == pytest.approx(2.0, rel=1e-6)
    assert cfg.phases[-1].releases == 2 * (cfg.draws + cfg.tune)
    assert "warm start" in cfg.describe()


@pytest.mark.slow
def test_control_variate_release_carries_its_calibrated_noise(monkeypatch):
    """The released gradient sum at the anchor differs from the exact clipped sum by
    N(0, (2 b z)^2) per coordinate (whitened coordinates), z the phase's noise multiplier:
    standardised over 25
    seeds x 3 coordinates its sd is 1 within sampling error (a dropped or halved noise fails)."""
    import copy

    import pymc_dp.records

    rng = np.random.default_rng(7)
    x = rng.uniform(-1, 1, (300, 2))
    y = x @ np.array([0.5, -1.0]) + 0.2 + rng.normal(0, 0.5, 300)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=2)
        pm.Normal("y", a + pm.math.dot(x, b), 0.5, observed=y)
    fns, extra = build_record_functions(model, model.value_vars, model.initial_point())

    def compiled_once(m, vars, ip, **kw):
        # the 25 configurations read one model: its record functions (noise-free, no rng)
        # are compiled once; each configuration gets a copy with its own release counts
        assert m is model and kw == {"chunk_size": None, "records": None}, kw
        c = copy.copy(fns)
        c.released = {"llr": 0, "grad": 0}
        return c, extra

    monkeypatch.setattr(pymc_dp.records, "build_record_functions", compiled_once)
    z = []
    for seed in range(25):
        cfg = auto_configure(
            model, epsilon=4.0, delta=1e-5, chains=2, draws=None, tune=None,
            rng=np.random.default_rng(seed), max_iterations=200, method="chain",
        )  # fmt: skip
        anchor, released, bound = cfg.step_kwargs["control_variate"].as_tuple()
        # the release is of the whitened gradients L^-1 g_i, L the control variate's basis
        m = np.linalg.inv(cfg.step_kwargs["control_variate"].basis)
        exact, _ = fns.clipped_grad_moments(anchor, bound, m)
        (phase,) = [p for p in cfg.phases if p.name.startswith("control variate")]
        z.append((released - exact) / (2.0 * bound * phase.noise_multiplier))
    z = np.ravel(z)
    # sd of a normal sample of size 75: 95 % of estimates within 1 +- 0.16
    assert 0.75 < z.std() < 1.3, z.std()
    assert abs(z.mean()) < 4 / np.sqrt(z.size)
