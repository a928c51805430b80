"""DPExpFamilyPenalty: noisy sufficient statistics + the penalty test (Yildirim & Ermis Sec. 3.3).

Exactness against closed-form posteriors with the noise on and clipping inactive, a check that
the sampler without the variance correction is detectably wrong (so the exactness tests have
power), the statistics and bounds of every family, refusals, and the privacy report.
"""

from __future__ import annotations

import re
import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp
from pymc_dp import DPExpFamilyPenalty, ModelNotSupportedError
from pymc_dp.kernels.expfam import (
    EXPFAM_FAMILIES,
    clip_stats,
    expfam_log_acceptance,
    normal_linear_natural,
    normal_linear_stat_bound,
    normal_linear_stats,
)
from pymc_dp.records.expfam import SUPPORTED_FORMS

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# -- kernel
def test_normal_linear_stats_and_natural_match_the_log_density():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    y = rng.normal(size=6)
    T = normal_linear_stats(y, X)
    for w, s in [(rng.normal(size=4), 0.7), (rng.normal(size=4), 1.9)]:
        eta, A = normal_linear_natural(w, s)
        ll = stats.norm.logpdf(y, w[0] + X @ w[1:], s)
        h = -0.5 * np.log(2 * np.pi)
        np.testing.assert_allclose(T @ eta - A + h, ll, rtol=1e-12)


def test_normal_linear_stat_bound_covers_the_box():
    rng = np.random.default_rng(1)
    X = rng.uniform(-2, 2, size=(2000, 3))
    X[0] = [2, -2, 2]
    y = rng.uniform(-3, 3, size=2000)
    y[0] = -3
    C = normal_linear_stat_bound(3.0, np.array([2.0, 2.0, 2.0]))
    norms = np.linalg.norm(normal_linear_stats(y, X), axis=1)
    assert norms.max() <= C + 1e-12
    assert norms.max() == pytest.approx(C)  # the corner attains it


def test_clip_stats_scales_rows_to_the_bound():
    T = np.array([[3.0, 4.0], [0.3, 0.4]])
    Tc, k = clip_stats(T, 1.0)
    np.testing.assert_allclose(Tc, [[0.6, 0.8], [0.3, 0.4]])
    assert k == 1


def test_log_acceptance_noise_variance_and_penalty_correction():
    """Noise variance sigma_S^2 ||d_eta||^2 (eq. 8); E[exp(log a - mean part)] = 1."""
    rng = np.random.default_rng(2)
    S, d_eta, sig = np.array([1.0, -2.0, 0.5]), np.array([0.3, -0.1, 0.2]), 1.5
    v = sig**2 * d_eta @ d_eta
    la = expfam_log_acceptance(S, d_eta, 0.4, 0.1, 0.0, sig, rng, size=400_000)
    base = S @ d_eta - 0.4 + 0.1
    assert np.var(la) == pytest.approx(v, rel=0.01)
    assert np.mean(la) == pytest.approx(base - 0.5 * v, abs=0.01)
    assert np.mean(np.exp(la - base)) == pytest.approx(1.0, abs=0.01)
    raw = expfam_log_acceptance(S, d_eta, 0.4, 0.1, 0.0, sig, rng, variance_correction=False)
    assert isinstance(raw, float)


# -- model recognition
RNG = np.random.default_rng(3)
N = 60
FAMILY_MODELS = {
    "normal": (
        lambda: pm.Normal(
            "y", pm.Normal("mu", 0, 5), pm.HalfNormal("s", 2), observed=RNG.normal(1, 2, N)
        ),
        {"data_bounds": {"y": (-10, 10)}},
        "normal_linear",
    ),
    "bernoulli": (
        lambda: pm.Bernoulli("y", pm.Beta("p", 1, 1), observed=RNG.integers(0, 2, N)),
        {},
        "bernoulli",
    ),
    "binomial": (
        lambda: pm.Binomial("y", 5, pm.Beta("p", 1, 1), observed=RNG.binomial(5, 0.4, N)),
        {},
        "binomial",
    ),
    "poisson": (
        lambda: pm.Poisson("y", pm.Gamma("l", 2, 1), observed=RNG.poisson(3, N)),
        {"data_bounds": {"y": (0, 20)}},
        "poisson",
    ),
    "exponential": (
        lambda: pm.Exponential("y", pm.Gamma("l", 2, 1), observed=RNG.exponential(0.5, N)),
        {"data_bounds": {"y": (0, 20)}},
        "exponential",
    ),
    "gamma": (
        lambda: pm.Gamma("y", 2.0, pm.Gamma("b", 2, 1), observed=RNG.gamma(2, 0.5, N)),
        {"data_bounds": {"y": (0, 20)}},
        "gamma",
    ),
    "categorical": (
        lambda: pm.Categorical(
            "y", p=pm.Dirichlet("p", np.ones(3)), observed=RNG.integers(0, 3, N)
        ),
        {},
        "categorical",
    ),
    "mvnormal": (
        lambda: pm.MvNormal(
            "y",
            mu=pm.Normal("mu", 0, 5, size=2),
            cov=np.array([[1.0, 0.3], [0.3, 1.0]]),
            observed=RNG.normal(1, 1, (N, 2)),
        ),
        {"data_bounds": {"y": (-6, 6)}},
        "mvnormal",
    ),
}


@pytest.mark.parametrize("name", list(FAMILY_MODELS))
def test_supported_families_are_recognised_and_sample(name):
    build, kw, family = FAMILY_MODELS[name]
    with pm.Model():
        build()
        step = DPExpFamilyPenalty(noise_multiplier=1.0, **kw)
        assert step.family == family
        idata = pm.sample(
            draws=30, tune=10, chains=1, step=step, progressbar=False, random_seed=1,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert np.all(np.isfinite(idata.sample_stats["noise_std"].values))


def test_regression_with_pm_data_covariates_and_named_bounds():
    X = RNG.uniform(-1, 1, size=(N, 2))
    x3 = RNG.uniform(0, 2, size=N)
    with pm.Model():
        Xd = pm.Data("Xd", X)
        x3d = pm.Data("x3", x3)
        b = pm.Normal("b", 0, 2, size=2)
        c = pm.Normal("c", 0, 2)
        pm.Normal("y", 1.0 + Xd @ b + c * x3d, 1.0, observed=RNG.normal(size=N))
        step = DPExpFamilyPenalty(
            noise_multiplier=1.0, data_bounds={"y": (-5, 5), "Xd": (-1, 1), "x3": (0, 2)}
        )
    assert step.family == "normal_linear"
    assert step._expfam.n_covariates == 3
    assert step.stat_clip_bound == pytest.approx(
        normal_linear_stat_bound(5.0, np.array([1.0, 1.0, 2.0]))
    )


def _model_logistic():
    X = RNG.normal(size=(N, 2))
    pm.Bernoulli(
        "y", logit_p=pm.math.dot(X, pm.Normal("b", size=2)), observed=RNG.integers(0, 2, N)
    )


def _model_student():
    pm.StudentT("y", nu=3, mu=pm.Normal("mu"), sigma=1, observed=RNG.normal(size=N))


def _model_heteroscedastic():
    x = RNG.normal(size=N)
    pm.Normal("y", pm.Normal("mu"), pm.math.exp(x * pm.Normal("g")), observed=RNG.normal(size=N))


def _model_nonlinear_mean():
    x = RNG.normal(size=N)
    pm.Normal("y", pm.math.exp(x * pm.Normal("g")), 1.0, observed=RNG.normal(size=N))


def _model_gamma_unknown_shape():
    pm.Gamma("y", pm.Gamma("a", 2, 1), pm.Gamma("b", 2, 1), observed=RNG.gamma(2, 1, N))


def _model_mvnormal_unknown_cov():
    pm.MvNormal(
        "y", mu=np.zeros(2), cov=np.eye(2) * pm.HalfNormal("s"), observed=RNG.normal(size=(N, 2))
    )


def _model_two_observed():
    mu = pm.Normal("mu")
    pm.Normal("y", mu, 1.0, observed=RNG.normal(size=N))
    pm.Normal("z", mu, 1.0, observed=RNG.normal(size=N))


@pytest.mark.parametrize(
    "build",
    [
        _model_logistic,
        _model_student,
        _model_heteroscedastic,
        _model_nonlinear_mean,
        _model_gamma_unknown_shape,
        _model_mvnormal_unknown_cov,
        _model_two_observed,
    ],
)
def test_unsupported_models_are_refused_naming_the_supported_forms(build):
    with pm.Model():
        build()
        with pytest.raises(ModelNotSupportedError) as err:
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (-9, 9), "X": (-9, 9)})
    assert SUPPORTED_FORMS in str(err.value)


def test_missing_bounds_and_bad_arguments_are_refused():
    with pm.Model():
        pm.Normal("y", pm.Normal("mu"), 1.0, observed=RNG.normal(size=N))
        with pytest.raises(ValueError, match="data_bounds must give the response range"):
            DPExpFamilyPenalty(noise_multiplier=1.0)
        with pytest.raises(ValueError, match="unknown keys"):
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (-1, 1), "w": (0, 1)})
        with pytest.raises(ValueError, match="not both"):
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (-1, 1)}, stat_clip_bound=2)
        with pytest.raises(ValueError, match="lo <= hi"):
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (1, -1)})
        with pytest.raises(ValueError, match="exactly one of noise_multiplier or epsilon"):
            DPExpFamilyPenalty(data_bounds={"y": (-1, 1)})
    X = RNG.normal(size=(N, 2))
    with pm.Model():
        pm.Normal("y", pm.math.dot(X, pm.Normal("b", size=2)), 1.0, observed=RNG.normal(size=N))
        with pytest.raises(ValueError, match="covariate range"):
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (-5, 5)})


@pytest.mark.parametrize("where", ["y", "X", "y_inf"])
def test_non_finite_data_is_refused_without_naming_values_or_positions(where):
    X = RNG.uniform(-1, 1, size=(N, 2))
    y = RNG.normal(size=N)
    if where == "X":
        X[17, 1] = np.nan
    elif where == "y_inf":
        y[23] = np.inf
    else:
        y[23] = np.nan
    with pm.Model(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyMC's ImputationWarning for NaN observations
        pm.Normal("y", pm.math.dot(X, pm.Normal("b", size=2)), 1.0, observed=y)
        with pytest.raises(ValueError) as err:
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (-5, 5), "X": (-1, 1)})
    msg = str(err.value)
    assert "finite" in msg or "missing" in msg
    assert not re.search(r"\d", msg), msg  # no count, position or value


# -- exactness
def _nig_problem(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 2))
    y = np.clip(0.5 + X @ np.array([1.0, -0.5]) + 0.8 * rng.normal(size=n), -4, 4)
    return X, y


def _nig_posterior(X, y, v0, a0, b0):
    """Closed-form Normal-Inverse-Gamma posterior: means and sds of (b0, b1, b2, sigma^2)."""
    Z = np.column_stack([np.ones(len(y)), X])
    Vn = np.linalg.inv(np.eye(Z.shape[1]) / v0 + Z.T @ Z)
    mn = Vn @ (Z.T @ y)
    an = a0 + len(y) / 2
    bn = b0 + 0.5 * (y @ y - mn @ np.linalg.solve(Vn, mn))
    s2_mean = bn / (an - 1)
    return np.r_[mn, s2_mean], np.r_[np.sqrt(np.diag(Vn) * s2_mean), s2_mean / np.sqrt(an - 2)]


def _run_nig(z, *, correction=True, draws=12_000, target_accept=None, seed=2):
    X, y = _nig_problem()
    v0, a0, b0 = 4.0, 3.0, 2.0
    with pm.Model():
        s2 = pm.InverseGamma("s2", a0, b0)
        b = pm.Normal("b", 0, pm.math.sqrt(s2 * v0), size=3)
        pm.Normal("y", b[0] + pm.math.dot(X, b[1:]), pm.math.sqrt(s2), observed=y)
        step = DPExpFamilyPenalty(
            data_bounds={"X": (-1, 1), "y": (-4, 4)},  # every record inside: clipping inactive
            noise_multiplier=z,
            target_accept=target_accept,
        )
        step._variance_correction = correction
        idata = pm.sample(
            draws=draws, tune=2000, chains=2, step=step, random_seed=seed, progressbar=False,
            cores=1, compute_convergence_checks=False,
        )  # fmt: skip
    post = np.column_stack(
        [idata.posterior["b"].values.reshape(-1, 3), idata.posterior["s2"].values.reshape(-1)]
    )
    ess = np.r_[
        az.ess(idata, var_names=["b"])["b"].values, float(az.ess(idata, var_names=["s2"])["s2"])
    ]
    true_mean, true_sd = _nig_posterior(X, y, v0, a0, b0)
    return post, ess, true_mean, true_sd, idata


@pytest.mark.slow
def test_linear_regression_unknown_sigma_is_exact_with_noise():
    post, ess, tm, ts, idata = _run_nig(0.08)
    assert float(idata.sample_stats["noise_std"].median()) > 0.5  # the noise is not negligible
    mcse = ts / np.sqrt(ess)
    np.testing.assert_array_less(np.abs(post.mean(0) - tm), 4 * mcse)
    np.testing.assert_array_less(np.abs(post.std(0) / ts - 1), 5 / np.sqrt(2 * ess))


@pytest.mark.slow
def test_without_the_variance_correction_the_chain_is_detectably_wrong():
    """Power check: the same sampler without -sigma^2/2 (eq. 8) at large noise is far off."""
    post, ess, tm, ts, idata = _run_nig(0.2, correction=False, draws=5000, target_accept=0.05)
    assert float(idata.sample_stats["noise_std"].median()) > 3
    # the posterior sds come out inflated far beyond Monte Carlo error ...
    assert np.all(post.std(0) / ts > 1 + 10 / np.sqrt(2 * ess))
    # ... and the noise variance mean of sigma^2 is off by many MCSEs
    assert abs(post[:, 3].mean() - tm[3]) > 6 * ts[3] / np.sqrt(ess[3])


@pytest.mark.slow
def test_bernoulli_is_exact_with_noise():
    rng = np.random.default_rng(4)
    n = 400
    y = (rng.uniform(size=n) < 0.3).astype(int)
    with pm.Model():
        p = pm.Beta("p", 2, 2)
        pm.Bernoulli("y", p, observed=y)
        step = DPExpFamilyPenalty(noise_multiplier=5.0)  # C = 1 from the support
        idata = pm.sample(
            draws=10_000, tune=2000, chains=2, step=step, random_seed=5, progressbar=False,
            cores=1, compute_convergence_checks=False,
        )  # fmt: skip
    assert step.stat_clip_bound == 1.0
    assert float(idata.sample_stats["noise_std"].median()) > 0.5
    draws = idata.posterior["p"].values.ravel()
    ess = float(az.ess(idata, var_names=["p"])["p"])
    ref = stats.beta(2 + y.sum(), 2 + n - y.sum())
    assert abs(draws.mean() - ref.mean()) < 4 * ref.std() / np.sqrt(ess)
    assert abs(draws.std() / ref.std() - 1) < 5 / np.sqrt(2 * ess)


def test_clipping_active_targets_the_clipped_statistics():
    """A record outside the bounds is clipped: S is the sum of clipped statistics."""
    y = np.array([0.0, 1.0, 100.0])
    with pm.Model():
        pm.Exponential("y", pm.Gamma("l", 2, 1), observed=y)
        step = DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds={"y": (0, 2)})
    assert step._stat_sum == pytest.approx([3.0])


# -- pymc_dp.sample and the privacy report
def test_sample_with_target_epsilon_composes_in_the_report():
    X, y = _nig_problem(n=200)
    with pm.Model():
        s = pm.HalfNormal("s", 2)
        b = pm.Normal("b", 0, 3, size=2)
        a = pm.Normal("a", 0, 3)
        pm.Normal("y", a + pm.math.dot(X, b), s, observed=y)
        idata = pymc_dp.sample(
            step=pymc_dp.DPExpFamilyPenalty,
            epsilon=2.0,
            delta=1e-5,
            draws=150,
            tune=100,
            chains=2,
            cores=1,
            step_kwargs={"data_bounds": {"X": (-1, 1), "y": (-4, 4)}},
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    rep = pymc_dp.privacy_report(idata)
    assert rep.epsilon <= 2.0
    assert rep.epsilon > 1.95  # the calibration spends the budget
    assert rep.releases == 2 * 250
    assert "observed_data" not in list(getattr(idata, "children", None) or idata.groups())
    stats_ = idata.sample_stats
    assert "clip_fraction_NONPRIVATE" in stats_
    assert np.all(np.isnan(stats_["clip_fraction_NONPRIVATE"].values))


def test_family_table_is_complete():
    assert set(EXPFAM_FAMILIES) == {
        "normal_linear", "bernoulli", "binomial", "poisson", "exponential", "gamma",
        "categorical", "mvnormal",
    }  # fmt: skip


# -- centred statistics (StatCentre): sensitivity, exactness, accounting
from pymc_dp import StatCentre  # noqa: E402
from pymc_dp.kernels.expfam import centred_clip_sum, deviation_counts_above  # noqa: E402


@pytest.mark.parametrize("whitening", ["none", "vector", "matrix"])
def test_centred_clip_sum_sensitivity_is_2b_by_brute_force(whitening):
    """Replace one record by adversarial values: the clipped centred sum moves by <= 2b, and
    the bound is attained (a record on one side of the centre replaced by one on the other)."""
    rng = np.random.default_rng(10)
    X = rng.uniform(-1, 1, size=(50, 2))
    y = rng.normal(size=50)
    T = normal_linear_stats(y, X)
    c = T.mean(0) + 0.1 * rng.normal(size=T.shape[1])
    d = T.shape[1]
    scale = {
        "none": None,
        "vector": rng.uniform(0.2, 3.0, size=d),
        "matrix": rng.normal(size=(d, d)) + 3 * np.eye(d),
    }[whitening]
    b = 1.5
    base, _ = centred_clip_sum(T, c, b, scale)
    worst = 0.0
    # adversarial replacements: huge values of either sign, the centre itself, random corners
    cands = [np.zeros(d)]
    for sgn in (1.0, -1.0):
        for mag in (1e-3, 1.0, 1e3, 1e8):
            cands.append(sgn * mag * np.ones(d))
            cands.append(sgn * mag * rng.normal(size=d))
    cands += [c, c + 1e6 * np.eye(d)[0], c - 1e6 * np.eye(d)[0]]
    for i in (0, 17, 49):
        for v in cands:
            T2 = T.copy()
            T2[i] = v
            s2, _ = centred_clip_sum(T2, c, b, scale)
            worst = max(worst, float(np.linalg.norm(s2 - base)))
    # a pair of neighbours that attains 2b: one record far out on each side of the centre
    u = (
        np.eye(d)[0]
        if scale is None
        else np.linalg.solve(
            np.atleast_2d(np.diag(scale) if np.ndim(scale) == 1 else scale), np.eye(d)[0]
        )
    )
    Tp, Tm = T.copy(), T.copy()
    Tp[0] = c + 1e6 * u
    Tm[0] = c - 1e6 * u
    gap = np.linalg.norm(
        centred_clip_sum(Tp, c, b, scale)[0] - centred_clip_sum(Tm, c, b, scale)[0]
    )
    assert worst <= 2 * b * (1 + 1e-12)
    assert gap == pytest.approx(2 * b, rel=1e-9)


def test_centred_sum_equals_the_uncentred_sum_when_no_deviation_is_clipped():
    rng = np.random.default_rng(11)
    T = normal_linear_stats(rng.normal(size=300), rng.uniform(-1, 1, size=(300, 3)))
    c = rng.normal(size=T.shape[1])
    W = rng.normal(size=(T.shape[1],) * 2) + 4 * np.eye(T.shape[1])
    S_w, k = centred_clip_sum(T, c, 1e9, W)
    assert k == 0
    np.testing.assert_allclose(np.linalg.solve(W, S_w) + len(T) * c, T.sum(0), rtol=1e-10)


def test_deviation_counts_above_counts_whitened_norms():
    T = np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0], [np.nan, 0.0]])
    c = np.zeros(2)
    np.testing.assert_array_equal(deviation_counts_above(T, c, [0.5, 2.0, 10.0]), [3, 2, 1])
    np.testing.assert_array_equal(
        deviation_counts_above(T, c, [0.05, 0.2, 10.0], np.array([0.1, 0.1])), [3, 2, 1]
    )


def _nig_model(X, y, v0=4.0, a0=3.0, b0=2.0):
    s2 = pm.InverseGamma("s2", a0, b0)
    b = pm.Normal("b", 0, pm.math.sqrt(s2 * v0), size=3)
    pm.Normal("y", b[0] + pm.math.dot(X, b[1:]), pm.math.sqrt(s2), observed=y)


def test_step_with_a_public_centre_and_inactive_clip_uses_the_exact_statistic():
    X, y = _nig_problem()
    T = normal_linear_stats(y, X)
    c = np.round(T.mean(0), 1)  # a public guess near the data
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(noise_multiplier=1.0, centre=StatCentre(c, clip=1e6))
    assert step.centre_mu == 0.0  # nothing released before the chains
    np.testing.assert_allclose(step._stat_sum, T.sum(0), rtol=1e-10)
    np.testing.assert_allclose(step.centre, c)


@pytest.mark.slow
def test_centred_step_is_exact_with_noise_against_the_closed_form():
    """Normal-Inverse-Gamma regression; public centre, clip above every deviation, the metric
    at the centre: the draws match the closed-form posterior (MCSE from the ESS)."""
    X, y = _nig_problem()
    c = np.round(normal_linear_stats(y, X).mean(0), 1)
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(noise_multiplier=0.3, centre=StatCentre(c, clip=50.0))
        idata = pm.sample(
            draws=8000, tune=1000, chains=2, step=step, random_seed=4, progressbar=False,
            cores=1, compute_convergence_checks=False,
        )  # fmt: skip
    noise = idata.sample_stats["noise_std"].values[:, 1:]  # the first iteration is the start
    assert float(np.median(noise)) > 0.5  # the noise is not negligible
    post = np.column_stack(
        [idata.posterior["b"].values.reshape(-1, 3), idata.posterior["s2"].values.reshape(-1)]
    )
    ess = np.r_[
        az.ess(idata, var_names=["b"])["b"].values, float(az.ess(idata, var_names=["s2"])["s2"])
    ]
    tm, ts = _nig_posterior(X, y, 4.0, 3.0, 2.0)
    mcse = ts / np.sqrt(ess)
    np.testing.assert_array_less(np.abs(post.mean(0) - tm), 4 * mcse)
    np.testing.assert_array_less(np.abs(post.std(0) / ts - 1), 5 / np.sqrt(2 * ess))


@pytest.mark.parametrize("eps", [3.0, 30.0])
def test_private_centre_is_charged_in_the_report(eps):
    X, y = _nig_problem(n=400)
    with pm.Model():
        s = pm.HalfNormal("s", 2)
        b = pm.Normal("b", 0, 3, size=2)
        a = pm.Normal("a", 0, 3)
        pm.Normal("y", a + pm.math.dot(X, b), s, observed=y)
        idata = pymc_dp.sample(
            step=pymc_dp.DPExpFamilyPenalty, epsilon=eps, delta=1e-5, draws=100, tune=50,
            chains=2, cores=1, step_kwargs={"data_bounds": {"X": (-1, 1), "y": (-4, 4)}},
            random_seed=3, progressbar=False, compute_convergence_checks=False,
        )  # fmt: skip
    rep = pymc_dp.privacy_report(idata)
    stats_ = idata.sample_stats
    cm = float(stats_["centre_mu"].values[0, 0])
    assert cm > 0
    # every draw charges the penalty test plus the centre's share; two chains of 150
    # iterations charge the centre's releases twice (once per chain)
    z_mu = float(stats_["dp_mu"].values[0, 0]) - cm
    assert rep.mu == pytest.approx(2 * 150 * (z_mu + cm), rel=1e-9)
    assert 2 * 150 * cm == pytest.approx(0.05 * rep.mu, rel=1e-6)  # the default budget share
    assert rep.epsilon <= eps  # never above the target (floating-point sums included)
    assert rep.epsilon > 0.98 * eps
    assert f"of which mu = {2 * 150 * cm:.4g}" in rep.mechanism and "StatCentre" in rep.mechanism


def test_centre_arguments_are_checked_before_the_data_is_read():
    X, y = _nig_problem(n=50)
    with pm.Model():
        _nig_model(X, y)
        bounds = {"X": (-1, 1), "y": (-4, 4)}
        with pytest.raises(ValueError, match="give draws, tune and chains"):
            DPExpFamilyPenalty(noise_multiplier=1.0, data_bounds=bounds, centre="private")
        with pytest.raises(ValueError, match="centre has length 3"):
            DPExpFamilyPenalty(noise_multiplier=1.0, centre=StatCentre(np.zeros(3), clip=1.0))
        with pytest.raises(ValueError, match="data_bounds must give"):
            DPExpFamilyPenalty(noise_multiplier=1.0, draws=10, tune=0, chains=1, centre="private")
    with pytest.raises(ValueError, match="centre must be one of"):
        StatCentre("mean")
    with pytest.raises(ValueError, match="quantile"):
        StatCentre(quantile=1.0)
    with pytest.raises(ValueError, match="clip"):
        StatCentre(clip=-1.0)
    with pytest.raises(ValueError, match="budget_share"):
        StatCentre(budget_share=0.9)


def test_private_centre_runs_are_reproducible_from_the_seed():
    X, y = _nig_problem(n=3000)
    out = []
    for _ in range(2):
        with pm.Model():
            _nig_model(X, y)
            idata = pymc_dp.sample(
                step=pymc_dp.DPExpFamilyPenalty, epsilon=30.0, delta=1e-5, draws=30, tune=10,
                chains=1, cores=1, step_kwargs={"data_bounds": {"X": (-1, 1), "y": (-4, 4)}},
                random_seed=7, progressbar=False, compute_convergence_checks=False,
            )  # fmt: skip
        out.append(idata.posterior["b"].values)
    assert np.unique(out[0]).size >= 3  # the released centre's start, and moves
    np.testing.assert_array_equal(out[0], out[1])


def test_data_bounds_centre_is_the_box_midpoint_statistic():
    X, y = _nig_problem(n=500)
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(
            epsilon=20.0, delta=1e-5, draws=20, tune=10, chains=1, centre="data_bounds",
            data_bounds={"X": (-1, 1), "y": (-2, 4)},
        )  # fmt: skip
        assert step._stat_sum is None  # nothing read before the chain starts
        idata = pm.sample(
            draws=20, tune=10, chains=1, step=step, random_seed=1, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    np.testing.assert_allclose(
        step.centre, normal_linear_stats(np.array([1.0]), np.zeros((1, 2)))[0]
    )
    assert step.centre_mu > 0 and step._centre_releases == StatCentre("data_bounds").releases
    assert np.all(np.isfinite(idata.posterior["b"].values))


# -- correlated releases (CorrelatedNoise): accounting, sensitivity, exactness
from pymc_dp import CorrelatedNoise  # noqa: E402
from pymc_dp.kernels.expfam import (  # noqa: E402
    correlated_log_acceptance,
    correlated_noise_schedule,
    correlated_release,
)


@pytest.mark.parametrize(
    ("z", "iterations", "refreshes"), [(82.3, 5500, 20), (0.5, 100, 20), (10.0, 7, 50), (1, 1, 3)]
)
def test_correlated_schedule_spends_what_the_penalty_test_spends(z, iterations, refreshes):
    """One first release (mu_0 = 1 / (2 z0^2)) and one release per planned iteration
    (mu_t = mu_0 (1 - r) / (1 + r)) compose to the penalty test's iterations / (2 z^2)."""
    z0, r = correlated_noise_schedule(z, iterations, refreshes)
    assert 0.0 <= r < 1.0
    mu0 = 1.0 / (2.0 * z0**2)
    assert mu0 + iterations * mu0 * (1.0 - r) / (1.0 + r) == pytest.approx(
        iterations / (2.0 * z**2), rel=1e-12
    )


@pytest.mark.parametrize("r", [0.0, 0.5, 0.993])
def test_correlated_release_sensitivity_is_1_minus_r_times_2b_by_brute_force(r):
    """Given the previous release (public) and the same noise draw, replacing one record by
    adversarial values moves the next release by at most (1 - r) 2b, and a pair of neighbours
    attains it; its noise given the previous release has std sigma sqrt(1 - r^2). So each
    release is a Gaussian mechanism with mu = ((1 - r) 2b)^2 / (2 sigma^2 (1 - r^2)) =
    mu_0 (1 - r) / (1 + r), the charge of `correlated_noise_schedule`."""
    rng = np.random.default_rng(12)
    X = rng.uniform(-1, 1, size=(50, 2))
    T = normal_linear_stats(rng.normal(size=50), X)
    d = T.shape[1]
    c = T.mean(0) + 0.1 * rng.normal(size=d)
    W = rng.normal(size=(d, d)) + 3 * np.eye(d)
    b, sigma = 1.5, 7.0
    previous = rng.normal(size=d) * 30.0  # any public previous release
    base = correlated_release(previous, centred_clip_sum(T, c, b, W)[0], r, sigma, _rng(7))
    cands = [np.zeros(d), c, c + 1e6 * np.eye(d)[0], c - 1e6 * np.eye(d)[0]]
    for sgn in (1.0, -1.0):
        for mag in (1e-3, 1.0, 1e3, 1e8):
            cands += [sgn * mag * np.ones(d), sgn * mag * rng.normal(size=d)]
    worst = 0.0
    for i in (0, 31, 49):
        for v in cands:
            T2 = T.copy()
            T2[i] = v
            s2 = centred_clip_sum(T2, c, b, W)[0]
            worst = max(
                worst, np.linalg.norm(correlated_release(previous, s2, r, sigma, _rng(7)) - base)
            )
    u = np.linalg.solve(W, np.eye(d)[0])
    Tp, Tm = T.copy(), T.copy()
    Tp[0], Tm[0] = c + 1e6 * u, c - 1e6 * u
    gap = np.linalg.norm(
        correlated_release(previous, centred_clip_sum(Tp, c, b, W)[0], r, sigma, _rng(3))
        - correlated_release(previous, centred_clip_sum(Tm, c, b, W)[0], r, sigma, _rng(3))
    )
    assert worst <= (1 - r) * 2 * b * (1 + 1e-9) + 1e-9
    assert gap == pytest.approx((1 - r) * 2 * b, rel=1e-6)
    # the noise given the previous release: N(0, sigma^2 (1 - r^2) I)
    S = centred_clip_sum(T, c, b, W)[0]
    gen = _rng(5)
    res = np.array([correlated_release(previous, S, r, sigma, gen) for _ in range(2000)])
    res = (res - r * previous - (1 - r) * S) / (sigma * np.sqrt(1 - r * r))
    m = res.size
    assert abs(res.mean()) < 5 / np.sqrt(m)
    assert abs(res.var() - 1) < 5 * np.sqrt(2 / m)
    mu = ((1 - r) * 2 * b) ** 2 / (2 * sigma**2 * (1 - r * r))
    assert mu == pytest.approx((2 * b) ** 2 / (2 * sigma**2) * (1 - r) / (1 + r), rel=1e-12)


def _rng(seed):
    return np.random.default_rng(seed)


def test_correlated_log_acceptance_is_the_estimators_log_ratio():
    """exp(psi . Y - sigma^2 |psi|^2 / 2) with Y = S + sigma u is unbiased for exp(psi . S)
    over u ~ N(0, I) (the pseudo-marginal estimator); the ratio is the difference of logs."""
    rng = _rng(13)
    S, psi, psi2 = rng.normal(size=4), 0.1 * rng.normal(size=4), 0.1 * rng.normal(size=4)
    sigma = 2.0
    Y, Y2 = S + sigma * rng.normal(size=4), S + sigma * rng.normal(size=4)
    want = (psi2 @ Y2 - sigma**2 * psi2 @ psi2 / 2) - (psi @ Y - sigma**2 * psi @ psi / 2) + 0.3
    assert correlated_log_acceptance(psi2, psi, Y2, Y, 0.3, sigma) == pytest.approx(want)
    u = rng.normal(size=(400_000, 4))
    est = np.exp((S + sigma * u) @ psi - sigma**2 * psi @ psi / 2)
    assert est.mean() == pytest.approx(np.exp(psi @ S), abs=5 * est.std() / np.sqrt(len(u)))


def _run_correlated_nig(*, correction=True, seed=4):
    X, y = _nig_problem()
    c = np.round(normal_linear_stats(y, X).mean(0), 1)
    draws, tune = 8000, 1000
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(
            noise_multiplier=0.3, centre=StatCentre(c, clip=50.0), draws=draws, tune=tune,
            chains=2, noise=CorrelatedNoise(refreshes=100),
        )  # fmt: skip
        step._variance_correction = correction
        idata = pm.sample(
            draws=draws, tune=tune, chains=2, step=step, random_seed=seed, progressbar=False,
            cores=1, compute_convergence_checks=False,
        )  # fmt: skip
    post = np.column_stack(
        [idata.posterior["b"].values.reshape(-1, 3), idata.posterior["s2"].values.reshape(-1)]
    )
    ess = np.r_[
        az.ess(idata, var_names=["b"])["b"].values, float(az.ess(idata, var_names=["s2"])["s2"])
    ]
    tm, ts = _nig_posterior(X, y, 4.0, 3.0, 2.0)
    return step, idata, post, ess, tm, ts


@pytest.mark.slow
def test_correlated_noise_is_exact_against_the_closed_form():
    """Normal-Inverse-Gamma regression, public centre, clip above every deviation: with the
    correlated releases the draws match the closed-form posterior (MCSE from the ESS)."""
    step, idata, post, ess, tm, ts = _run_correlated_nig()
    # the noise is not negligible: the noise move's log ratio psi . (Y' - Y) has std
    # sigma sqrt(1 - r^2) |psi| (psi = W^-T (eta - eta_0)) of the order of 1
    assert float(np.median(idata.sample_stats["noise_std"].values[:, 1:])) > 0.5
    mcse = ts / np.sqrt(ess)
    np.testing.assert_array_less(np.abs(post.mean(0) - tm), 4 * mcse)
    np.testing.assert_array_less(np.abs(post.std(0) / ts - 1), 5 / np.sqrt(2 * ess))


@pytest.mark.slow
def test_correlated_noise_without_the_normalisation_is_detectably_wrong():
    """Power check: the same chain without the estimator's -sigma^2 |psi|^2 / 2 (then
    exp(psi . Y) is not unbiased for exp(psi . S)) is off by many MCSEs."""
    _, _, post, ess, tm, ts = _run_correlated_nig(correction=False)
    err = np.abs(post.mean(0) - tm) / (ts / np.sqrt(ess))
    sd_err = np.abs(post.std(0) / ts - 1) * np.sqrt(2 * ess)
    assert max(err.max(), sd_err.max()) > 10


def test_correlated_noise_charges_one_release_plus_one_per_iteration():
    """The releases a run made (released_mu) are one first release per chain and one per
    iteration after the start, never above the calibrated total the draws carry (dp_mu)."""
    X, y = _nig_problem(n=200)
    c = np.round(normal_linear_stats(y, X).mean(0), 1)
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(
            noise_multiplier=2.0, centre=StatCentre(c, clip=50.0), draws=60, tune=20,
            chains=2, noise=CorrelatedNoise(refreshes=5),
        )  # fmt: skip
        idata = pm.sample(
            draws=60, tune=20, chains=2, step=step, random_seed=1, progressbar=False, cores=1,
            compute_convergence_checks=False,
        )  # fmt: skip
    # K is lowered from 5 when the predicted noise move is too noisy (noise_target); the
    # charge does not depend on K
    assert 1.0 <= step.refreshes <= 5.0
    z0, r = correlated_noise_schedule(2.0, 80, step.refreshes)
    assert (z0, r) == (step._corr_z0, step._corr_r)
    mu0 = 1 / (2 * z0**2)
    tests = 2 * (80 - 1)  # the first iteration of a chain is its start draw (no release)
    assert step.released_mu() == pytest.approx(2 * mu0 + tests * mu0 * (1 - r) / (1 + r))
    charged = float(idata.sample_stats["dp_mu"].sum()) + 2 * 20 / (2 * 2.0**2)  # + warmup
    assert charged == pytest.approx(2 * 80 / (2 * 2.0**2))
    assert step.released_mu() <= charged


def test_correlated_noise_arguments_are_checked():
    with pytest.raises(ValueError, match="refreshes"):
        CorrelatedNoise(refreshes=0)
    with pytest.raises(ValueError, match="theta_steps"):
        CorrelatedNoise(theta_steps=0)
    X, y = _nig_problem(n=50)
    with pm.Model():
        _nig_model(X, y)
        with pytest.raises(ValueError, match="noise must be"):
            DPExpFamilyPenalty(
                noise_multiplier=1.0, data_bounds={"X": (-1, 1), "y": (-4, 4)}, noise="x"
            )
        with pytest.raises(ValueError, match="planned iterations"):
            DPExpFamilyPenalty(
                noise_multiplier=1.0, data_bounds={"X": (-1, 1), "y": (-4, 4)},
                noise=CorrelatedNoise(),
            )  # fmt: skip


@pytest.mark.parametrize(("z", "target"), [(2.0, 0.7), (0.05, 0.7), (2.0, None)])
def test_correlated_refreshes_are_lowered_to_the_noise_target(z, target):
    """K is lowered from `refreshes` (data-free, given the releases) while the predicted std
    of the noise move's log ratio exceeds noise_target; the schedule in use is that K's."""
    X, y = _nig_problem(n=200)
    c = np.round(normal_linear_stats(y, X).mean(0), 1)
    with pm.Model():
        _nig_model(X, y)
        step = DPExpFamilyPenalty(
            noise_multiplier=z, centre=StatCentre(c, clip=50.0), draws=400, tune=100,
            chains=1, noise=CorrelatedNoise(refreshes=40, noise_target=target),
        )  # fmt: skip
    z0, r = correlated_noise_schedule(z, 500, step.refreshes)
    assert (z0, r) == (step._corr_z0, step._corr_r)
    if target is None:
        assert step.refreshes == 40
        return
    m, L = step._laplace
    gen = np.random.default_rng(1)
    eta_m = step._expfam.natural(m)[0]
    psi = np.sqrt(
        np.mean([np.sum((step._expfam.natural(m + L @ gen.normal(size=m.size))[0] - eta_m) ** 2)
                 for _ in range(400)])
    )  # fmt: skip
    pred = step.correlated_noise_std * np.sqrt(1 - r * r) * psi
    if step.refreshes < 40:  # lowered: the predicted noise is near the target or K = 1
        assert pred < 1.5 * target or step.refreshes == 1.0
    else:
        assert pred < 1.5 * target
    if z == 2.0:
        assert step.refreshes < 40  # this much noise needs fewer renewals
