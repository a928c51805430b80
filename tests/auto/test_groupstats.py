"""The per-group statistics strategy (issue 26, item 2): detection from the graph, the
release's sensitivity (brute force over neighbouring datasets), the clipped normal's moments
against Monte Carlo, the noise-aware posterior against a closed form, the accounting and
the result end to end."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto import auto_configure
from pymc_dp.auto import groupstats as gs_mod
from pymc_dp.auto.groupstats import (
    GroupStats,
    clipped_normal_moments,
    find_group_structure,
    fit_group_posterior,
    group_stats_of_records,
    group_stats_sensitivity,
    release_group_stats,
)


def _hier(n=600, groups=4, seed=0, centred=False, covariate=False):
    rng = np.random.default_rng(seed)
    g = rng.integers(groups, size=n)
    theta = rng.normal(1.0, 0.5, groups)
    x = rng.normal(size=n)
    y = np.clip(theta[g] + rng.normal(0, 1, n) + (0.3 * x if covariate else 0.0), -6, 8)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        if centred:
            loc = pm.Normal("a", mu, tau, shape=groups)[g]
        else:
            loc = mu + tau * pm.Normal("z", 0, 1, shape=groups)[g]
        if covariate:
            loc = loc + pm.Normal("b", 0, 1) * x
        pm.Normal("y", loc, pm.HalfNormal("sigma", 2), observed=y)
    return m


# -- detection (data-free) ------------------------------------------------------------------------
def test_structure_is_found_in_centred_and_non_centred_hierarchies():
    for centred in (False, True):
        st = find_group_structure(_hier(centred=centred))
        assert not isinstance(st, str), st
        assert (st.n, st.groups) == (600, 4)


def test_structure_is_refused_with_covariates_another_likelihood_or_no_groups():
    assert "covariates" in find_group_structure(_hier(covariate=True))
    y = np.random.default_rng(0).poisson(2.0, 50)
    g = np.arange(50) % 5
    with pm.Model() as pois:
        pm.Poisson("y", pm.math.exp(pm.Normal("a", 0, 1, shape=5))[g], observed=y)
    assert "not a normal" in find_group_structure(pois)
    with pm.Model() as flat:
        pm.Normal("y", pm.Normal("m", 0, 1), 1.0, observed=y.astype(float))
    assert "group index" in find_group_structure(flat)
    with pm.Model() as vec_sigma:
        a = pm.Normal("a", 0, 1, shape=5)
        pm.Normal("y", a[g], pm.HalfNormal("s", 1, shape=5)[g], observed=y.astype(float))
    assert isinstance(find_group_structure(vec_sigma), str)


# -- the release ----------------------------------------------------------------------------------
@pytest.mark.parametrize("weights", [None, (1.0, 0.3, 0.05), (0.2, 1.0, 0.1)])
def test_group_stats_sensitivity_by_brute_force(weights):
    """Every replace-one neighbour of small datasets (each record changed to every (group,
    value) on a grid reaching beyond the clip bound, a change of group included): the
    statistics move by at most the claimed sensitivity, and some neighbour attains it to
    within the grid's resolution."""
    b, groups = 1.5, 3
    w = None if weights is None else np.array(weights) * np.array([1.0, 1 / b, 1 / b**2])
    sens = group_stats_sensitivity(b, w)
    values = np.linspace(-2.5, 2.5, 21)  # includes 0, +-1.5 and values clipped
    base = [(0, -2.5), (1, 0.0), (2, 1.5), (1, 0.7)]
    worst = 0.0
    for data in (base, [(0, 0.0)] * 4):
        gg = np.array([r[0] for r in data])
        yy = np.array([r[1] for r in data], dtype=float)
        t0 = group_stats_of_records(yy, gg, groups, 0.0, b, w)
        for i, (g_new, y_new) in itertools.product(
            range(len(data)), itertools.product(range(groups), values)
        ):
            g2, y2 = gg.copy(), yy.copy()
            g2[i], y2[i] = g_new, y_new
            d = np.linalg.norm(group_stats_of_records(y2, g2, groups, 0.0, b, w) - t0)
            assert d <= sens * (1 + 1e-12)
            worst = max(worst, d)
    assert worst >= 0.99 * sens
    # the sqrt(2) times the largest record's norm holds for the default weights
    # (2 against sqrt(6)); not in general: a record staying in its group moves its sum by
    # 2 w_1 b, more than sqrt(2) times the norm where the sum's weight dominates
    ww = gs_mod._weights(b) if w is None else w
    bound = np.sqrt(2.0) * np.sqrt(ww[0] ** 2 + (ww[1] * b) ** 2 + (ww[2] * b**2) ** 2)
    if weights is None:
        assert sens <= bound
    if weights == (0.2, 1.0, 0.1):
        assert sens > bound


def test_release_noise_is_the_multiplier_times_the_sensitivity():
    rng = np.random.default_rng(0)
    y = rng.normal(size=200)
    g = rng.integers(3, size=200)
    b, z = 2.0, 1.7
    exact = group_stats_of_records(y, g, 3, 0.1, b)
    w = gs_mod._weights(b)
    draws = np.array(
        [
            np.concatenate([r.counts * w[0], r.sums * w[1], [r.squares * w[2]]])
            for r in (release_group_stats(y, g, 3, 0.1, b, z, rng) for _ in range(4000))
        ]
    )
    sd = draws.std(axis=0)
    target = z * group_stats_sensitivity(b)
    # the sd of 4000 Gaussian draws: relative Monte Carlo sd 1 / sqrt(2 * 4000)
    np.testing.assert_allclose(sd, target, rtol=4 / np.sqrt(8000))
    np.testing.assert_allclose(draws.mean(axis=0), exact, atol=4 * target / np.sqrt(4000))


def test_clipped_normal_moments_match_monte_carlo():
    rng = np.random.default_rng(1)
    for mean, sd, b in [(0.3, 1.0, 2.0), (-1.5, 0.7, 1.0), (0.2, 1.0, 40.0)]:
        x = np.clip(rng.normal(mean, sd, 400_000), -b, b)
        got = clipped_normal_moments(mean, sd, b, xp=np)
        for k, e in enumerate(got, start=1):
            mc = x**k
            assert abs(mc.mean() - e) < 4 * mc.std() / np.sqrt(x.size), (mean, sd, b, k)
        if b > 10:  # no clipping: the normal's moments
            np.testing.assert_allclose(
                got, [mean, mean**2 + sd**2, mean**3 + 3 * mean * sd**2,
                      mean**4 + 6 * mean**2 * sd**2 + 3 * sd**4], rtol=1e-10
            )  # fmt: skip


# -- the noise-aware posterior ----------------------------------------------------------------
def test_noise_aware_posterior_matches_the_conjugate_closed_form(monkeypatch):
    """sigma known, group means with N(0, 10^2) priors, counts exact, the square made
    uninformative by a huge noise, no clipping: then ``S~_g | m_g ~ N(n_g (m_g - c), n_g
    sigma^2 + s_S^2)`` and each group mean's posterior is normal in closed form. The NUTS
    draws' means and sds must match it within their Monte Carlo error; the noise-unaware
    sds (``s_S`` left out) are less than half as wide, so leaving the noise out fails."""
    rng = np.random.default_rng(2)
    n, groups, sigma, c, s_S = 400, 3, 1.0, 0.4, 40.0
    g = np.arange(n) % groups
    y = np.array([0.0, 1.0, -0.5])[g] + rng.normal(0, sigma, n)
    with pm.Model() as model:
        m = pm.Normal("m", 0, 10, shape=groups)
        pm.Normal("y", m[g], sigma, observed=y)
    st = find_group_structure(model)
    assert not isinstance(st, str), st
    counts = np.bincount(g).astype(float)
    sums = np.bincount(g, weights=y - c) + s_S * rng.normal(size=groups)
    stats = GroupStats(counts, sums, float(np.sum((y - c) ** 2)), c, 1e6, 0.0, s_S, 1e9)
    post = fit_group_posterior(model, st, stats, np.random.default_rng(3), draws=1000, chains=4)
    var_lik = (counts * sigma**2 + s_S**2) / counts**2
    prec = 1 / 100.0 + 1 / var_lik
    mean = (c + sums / counts) / var_lik / prec
    sd = np.sqrt(1 / prec)
    draws = post.draws
    assert post.rhat < 1.01 and post.divergences == 0
    import arviz as az

    ess = np.array([az.ess(draws[:, j].reshape(4, -1)) for j in range(groups)], dtype=float).ravel()
    assert np.all(np.abs(draws.mean(0) - mean) < 4 * sd / np.sqrt(ess))
    assert np.all(np.abs(draws.std(0) / sd - 1) < 4 / np.sqrt(2 * ess))
    unaware = np.sqrt(1 / (1 / 100.0 + counts / sigma**2))
    assert np.all(unaware < 0.5 * sd)


# -- accounting and the result ------------------------------------------------------------------
def test_groupstats_spends_exactly_the_budget_and_counts_every_release(monkeypatch):
    from pymc_dp.auto.configure import PresampleSpend

    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_DRAWS", 100)
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_CHAINS", 2)
    spend = PresampleSpend()
    cfg = auto_configure(
        _hier(), epsilon=3.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), data_bounds={"y": (-6.0, 8.0)}, spend=spend,
        method="groupstats",
    )  # fmt: skip
    assert cfg.method == "groupstats"
    eps = compose_epsilon([GaussianEvent(p.noise_multiplier, p.releases) for p in cfg.phases], 1e-5)
    assert eps <= 3.0 and eps == pytest.approx(3.0, rel=1e-6)
    assert [p.releases for p in cfg.phases] == [1, 1, 1, 1]
    assert spend.made == {p.name: p.releases for p in cfg.phases}
    assert cfg.posterior_draws.shape[1] == 1 + 1 + 4 + 1
    attrs = cfg.to_attrs()
    assert attrs["dp_method"] == "groupstats" and "dp_groupstats_rhat" in attrs


def test_groupstats_is_refused_where_it_does_not_apply():
    with _hier(covariate=True), pytest.raises(ValueError, match="covariates"):
        pymc_dp.sample(
            epsilon=3.0, delta=1e-6, data_bounds={"y": (-6.0, 8.0)}, progressbar=False,
            auto_kwargs={"method": "groupstats"},
        )  # fmt: skip
    with _hier(), pytest.raises(ValueError, match="data_bounds"):
        pymc_dp.sample(
            epsilon=3.0, delta=1e-6, progressbar=False, auto_kwargs={"method": "groupstats"}
        )


def test_sample_groupstats_result_and_report(monkeypatch):
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_DRAWS", 300)
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_CHAINS", 2)
    model = _hier(n=3000, seed=4)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pymc_dp.sample(
            200, epsilon=3.0, delta=1e-6, chains=2, random_seed=5, progressbar=False,
            data_bounds={"y": (-6.0, 8.0)}, auto_kwargs={"method": "groupstats"},
        )  # fmt: skip
    assert idata.attrs["dp_method"] == "groupstats"
    assert idata["posterior"]["z"].shape[-1] == 4
    report = pymc_dp.privacy_report(idata, model=model)
    assert report.private and report.epsilon <= 3.0
    assert "per-group statistics" in str(report)


def test_tail_bias_bounds_cover_what_clipping_takes_off():
    """With the exact excess (no noise; the continuous ``sum_i min((|u_i| - L) / L, 1)``,
    which the released midpoint rule approximates to 1/64 a record), what clipping at ``L``
    takes off the sum of ``|u|`` and off the square, over heavy-tailed records inside the
    box, is at most the bounds; and nothing is bounded where the bound reaches the box."""

    def tail_excess(passes, centre, scale, levels):
        d = np.abs(passes.y)
        return np.array([np.sum(np.clip((d - L) / L, 0.0, 1.0)) for L in levels])

    rng = np.random.default_rng(7)
    top = 6.0
    for b in (1.0, 2.0, 3.5):
        u = np.clip(rng.standard_t(2, 3000), -top, top)
        levels = b * 2.0 ** np.arange(3)
        X = tail_excess(gs_mod._AbsDeviationPasses(u), np.array([0.0]), None, levels)
        for L in levels[levels < top]:
            sums, square = gs_mod.tail_bias_bounds(L, top, levels, X, 0.0)
            lost_sum = np.sum(np.abs(u) - np.minimum(np.abs(u), L))
            lost_square = np.sum(u**2 - np.minimum(np.abs(u), L) ** 2)
            assert lost_sum <= sums * (1 + 1e-9) and lost_square <= square * (1 + 1e-9)
            assert lost_square > 0.05 * square  # not vacuous
    assert gs_mod.tail_bias_bounds(top, top, levels, X, 1.0) == (0.0, 0.0)


def test_centred_noise_aware_posterior_matches_quadrature():
    """The noise-aware posterior of a non-centred hierarchy (``mu + tau z[g]``), sampled in
    centred coordinates (``a = mu + tau z``, `centred_sampling_model`), against its exact
    moments: sigma known, counts exact, no clipping, the square uninformative, so
    ``S~_g | mu, tau ~ N(n_g (mu - c), n_g^2 tau^2 + n_g sigma^2 + s_S^2)`` and, given
    ``(mu, tau)``, each ``a_g`` is normal in closed form; ``(mu, tau)`` by quadrature on a
    grid. Many records a group: the non-centred ridge the centring removes. The draws'
    means must match within 4 of their Monte Carlo sds (measured: within 1.8; leaving out
    the map's Jacobian ``tau^G`` put them up to 107 Monte Carlo sds off)."""
    from scipy.stats import norm

    rng = np.random.default_rng(11)
    n, groups, sigma, c, s_S = 10_000, 5, 1.0, 0.3, 30.0
    g = np.arange(n) % groups
    y = np.array([0.5, 1.0, 1.5, 0.8, 1.2])[g] + rng.normal(0, sigma, n)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, shape=groups)
        pm.Normal("y", mu + tau * z[g], sigma, observed=y)
    st = find_group_structure(model)
    assert not isinstance(st, str), st
    counts = np.bincount(g).astype(float)
    sums = np.bincount(g, weights=y - c) + s_S * rng.normal(size=groups)
    stats = GroupStats(counts, sums, float(np.sum((y - c) ** 2)), c, 1e6, 0.0, s_S, 1e9)
    post = fit_group_posterior(model, st, stats, np.random.default_rng(3), draws=500, chains=4)
    assert post.recentred == ("z -> mu + tau * z",)
    assert post.rhat < 1.01 and post.divergences == 0
    # exact: quadrature over (mu, tau); a_g | mu, tau conjugate
    V = counts * sigma**2 + s_S**2
    obs, obs_var = sums / counts + c, V / counts**2  # a_g observed with this variance
    mus = np.linspace(-2.5, 3.5, 601)[:, None, None]
    taus = np.linspace(1e-3, 3.0, 600)[None, :, None]
    logp = (
        norm.logpdf(mus[..., 0], 0, 1)
        + norm.logpdf(taus[..., 0], 0, 1)
        + np.sum(norm.logpdf(obs, mus, np.sqrt(taus**2 + obs_var)), axis=-1)
    )
    w = np.exp(logp - logp.max())
    w /= w.sum()
    prec = 1 / taus**2 + 1 / obs_var
    a_mean = (mus / taus**2 + obs / obs_var) / prec
    exact = np.concatenate(
        [
            [np.sum(w * mus[..., 0]), np.sum(w * np.log(taus[..., 0]))],
            np.sum(w[..., None] * (a_mean - mus) / taus, axis=(0, 1)),
        ]
    )
    exact_sd = np.sqrt(
        np.concatenate(
            [
                [
                    np.sum(w * mus[..., 0] ** 2) - exact[0] ** 2,
                    np.sum(w * np.log(taus[..., 0]) ** 2) - exact[1] ** 2,
                ],
                np.sum(w[..., None] * (((a_mean - mus) / taus) ** 2 + 1 / (prec * taus**2)), (0, 1))
                - exact[2:] ** 2,
            ]
        )
    )
    import arviz as az

    # the flat value order of the model: mu, log tau, z
    names = [v.name for v in model.value_vars]
    assert names == ["mu", "tau_log__", "z"]
    draws = post.draws
    ess = np.array([az.ess(draws[:, j].reshape(4, -1)) for j in range(draws.shape[1])], dtype=float)
    assert np.all(np.abs(draws.mean(0) - exact) < 4 * exact_sd / np.sqrt(ess.ravel()))


def test_automatic_mode_chooses_groupstats_where_it_applies():
    """``method="auto"``: the per-group statistics for a normal hierarchy whose response's
    range is declared (the plan and the run agree), the chain without that range, and never
    for a logistic model (data-free choice)."""
    with _hier():
        p = pymc_dp.plan(epsilon=3.0, delta=1e-6, data_bounds={"y": (-6.0, 8.0)}, verbose=False)
        assert p.method == "groupstats" and isinstance(p.candidates["groupstats"], float)
        assert p.predicted_error == p.candidates["groupstats"]
        assert pymc_dp.plan(epsilon=3.0, delta=1e-6, verbose=False).method == "chain"
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (500, 2))
    with pm.Model():
        b = pm.Normal("b", 0, 2, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=rng.integers(0, 2, 500))
        p = pymc_dp.plan(epsilon=3.0, delta=1e-6, data_bounds={"y": (0, 1)}, verbose=False)
        assert p.method != "groupstats" and isinstance(p.candidates["groupstats"], str)


def test_automatic_run_uses_groupstats_and_says_why(monkeypatch):
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_DRAWS", 100)
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_CHAINS", 2)
    cfg = auto_configure(
        _hier(), epsilon=3.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), data_bounds={"y": (-6.0, 8.0)},
    )  # fmt: skip
    attrs = cfg.to_attrs()
    assert attrs["dp_method"] == "groupstats"
    assert "per-group statistics" in attrs["dp_auto_strategy"]
    assert "z -> mu + tau * z" in attrs["dp_auto_recentred"]


def test_an_unconverged_centred_run_falls_back_to_the_model_coordinates(monkeypatch):
    """The centred NUTS run with a divergence: the model's own coordinates are run too and
    the better converged run is kept; a converged centred run is kept as it is."""
    runs = []

    def fake(model, new, centred, draws, chains, rng):
        runs.append(centred is not None)
        if centred is not None:
            return gs_mod.GroupPosterior(np.zeros((4, 7)), 1.002, divergent, centred.describe)
        return gs_mod.GroupPosterior(np.ones((4, 7)), 1.004, 0, ())

    monkeypatch.setattr(gs_mod, "_nuts", fake)
    model = _hier()
    st = find_group_structure(model)
    stats = GroupStats(np.full(4, 150.0), np.zeros(4), 600.0, 1.0, 5.0, 1.0, 1.0, 1.0)
    divergent = 3
    post = fit_group_posterior(model, st, stats, np.random.default_rng(0))
    assert runs == [True, False] and post.recentred == () and post.divergences == 0
    runs.clear()
    divergent = 0
    post = fit_group_posterior(model, st, stats, np.random.default_rng(0))
    assert runs == [True] and post.recentred == ("z -> mu + tau * z",)


def test_the_noise_aware_nuts_run_is_pm_samples_own(monkeypatch):
    """`_nuts` initialises NUTS itself (`init_nuts`, so that `pm.sample` skips its symbolic
    gradient for the step assignment): its draws are those of ``pm.sample(target_accept=0.9)``
    with the same seed and tuning, bitwise, in the model's own coordinates (transformed
    ``tau`` and ``sigma``: the initial point goes back through the transform) and in the
    centred ones."""
    monkeypatch.setattr(gs_mod, "GROUPSTATS_NUTS_CORES", 1)
    model = _hier()
    st = find_group_structure(model)
    stats = GroupStats(np.full(4, 150.0), np.full(4, 20.0), 700.0, 1.0, 5.0, 1.0, 1.0, 1.0)
    new = gs_mod.noise_aware_group_model(model, st, stats)
    for centred in (None, gs_mod.centred_sampling_model(model, new)):
        post = gs_mod._nuts(model, new, centred, 60, 2, np.random.default_rng(3))
        seed = int(np.random.default_rng(3).integers(2**31 - 1))
        with centred.model if centred is not None else new, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            idata = pm.sample(
                60, tune=min(60, gs_mod.GROUPSTATS_NUTS_TUNE), chains=2, cores=1,
                random_seed=seed, progressbar=False, compute_convergence_checks=False,
                target_accept=0.9, idata_kwargs={"include_transformed": True},
            )  # fmt: skip
        p = idata["posterior"]
        if centred is not None:
            y = np.asarray(p["dp_centred"].values, dtype=float)
            want = centred.to_q(y).reshape(-1, y.shape[-1])
        else:
            want = np.concatenate(
                [np.asarray(p[v.name].values, float).reshape(120, -1) for v in model.value_vars],
                axis=1,
            )
        assert post.draws.shape == want.shape
        np.testing.assert_array_equal(post.draws, want)
