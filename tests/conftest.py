"""Shared fixtures and statistical helpers of the pymc_dp tests."""

from __future__ import annotations

import warnings

import arviz as az
import numpy as np
import pymc as pm
import pytest
from scipy import stats

warnings.filterwarnings("ignore", message=".*BLAS.*")


def posterior_array(idata, name: str) -> np.ndarray:
    """Draws of ``name`` as a numpy array of shape (chain, draw, ...)."""
    return np.asarray(idata["posterior"][name].values)


def assert_matches_distribution(draws: np.ndarray, dist, *, label: str = "") -> None:
    """Check (chain, draw) draws against a frozen scipy distribution.

    - the mean is within 4 Monte Carlo standard errors (MCSE = posterior sd / sqrt(ESS));
    - a KS test at alpha = 1e-3 on draws thinned to roughly independent ones
      (thinning interval = total draws / ESS).
    """
    draws = np.asarray(draws, dtype=float)
    assert draws.ndim == 2, draws.shape
    ess = float(az.ess(draws))
    assert ess > 100, f"{label}: effective sample size {ess:.0f} too small for the test"
    mcse = dist.std() / np.sqrt(ess)
    err = draws.mean() - dist.mean()
    assert abs(err) < 4 * mcse, (
        f"{label}: mean {draws.mean():.5f} vs {dist.mean():.5f}: error {err:.5f} is "
        f"{abs(err) / mcse:.1f} MCSE (ESS {ess:.0f})"
    )
    thin = max(1, int(np.ceil(draws.size / ess)))
    thinned = draws[:, ::thin].ravel()
    p = stats.kstest(thinned, dist.cdf).pvalue
    assert p > 1e-3, f"{label}: KS p-value {p:.2e} on {thinned.size} draws (thin {thin})"


def normal_mean_model(n: int = 50, d: int = 1, prior_sd: float = 10.0, seed: int = 0):
    """x_i ~ N(theta, I_d), theta ~ N(0, prior_sd^2 I). Returns (model, posterior mean, sd)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(loc=np.linspace(-1.0, 1.0, d), size=(n, d))
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, prior_sd, shape=d)
        pm.Normal("x", theta, 1.0, observed=x)
    prec = 1.0 / prior_sd**2 + n
    return model, x.sum(axis=0) / prec, np.full(d, 1.0 / np.sqrt(prec))


def exact_dphmc(**overrides):
    """A DPHMC whose clip bounds lie far above every record's (clipping inactive) with small
    noise: its draws follow the closed-form posterior of the small test models here.
    ``overrides`` replace any of the settings (e.g. a larger ``llr_noise_multiplier``)."""
    import pymc_dp

    settings = dict(
        llr_clip_bound=50.0,
        grad_clip_bound=50.0,
        llr_noise_multiplier=0.03,
        grad_noise_multiplier=0.05,
        n_leapfrog=5,
        nonprivate_diagnostics=True,
    )
    settings.update(overrides)
    return pymc_dp.DPHMC(**settings)


def check_no_clipping_and_noise_on(idata) -> None:
    """No record was clipped in any release, the noise was on, and DP-HMC moved."""
    ss = idata["sample_stats"]
    assert np.nanmax(ss["grad_clip_fraction_NONPRIVATE"].values) == 0.0
    assert np.nanmax(ss["llr_clip_fraction_NONPRIVATE"].values) == 0.0
    assert np.all(ss["grad_noise_std"].values > 0)
    assert np.nanmedian(ss["llr_noise_std"].values) > 0.05
    assert 0.3 < ss["accepted"].values.mean() < 0.95


def inverse_gamma_variance_model(n: int = 40, a: float = 3.0, b: float = 2.0, seed: int = 1):
    """x_i ~ N(0, s2), s2 ~ InvGamma(a, b): a transformed (log) variable with a closed form.

    Posterior: s2 | x ~ InvGamma(a + n / 2, b + sum x^2 / 2).
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(scale=1.3, size=n)
    with pm.Model() as model:
        s2 = pm.InverseGamma("s2", alpha=a, beta=b)
        pm.Normal("x", 0.0, pm.math.sqrt(s2), observed=x)
    post = stats.invgamma(a + n / 2, scale=b + (x**2).sum() / 2)
    return model, post


@pytest.fixture
def logistic_model():
    """Small logistic regression with an intercept (n = 200, d = 3)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 2))
    y = (rng.uniform(size=200) < 1 / (1 + np.exp(-(X @ [1.0, -0.5] + 0.3)))).astype(int)
    with pm.Model() as model:
        a = pm.Normal("a", 0, 2)
        w = pm.Normal("w", 0, 2, shape=2)
        pm.Bernoulli("y", logit_p=a + pm.math.dot(X, w), observed=y)
    return model, X, y


def laplace_draws(model, name: str, seed: int, epsilon: float = 10.0) -> np.ndarray:
    """The draws of ``name`` from the automatic mode's one-shot strategy (``method
    "laplace"``, delta 1e-6, 2 chains, the run's UserWarnings silenced), flattened."""
    idata = oneshot_call(model, epsilon=epsilon, seed=seed)
    return np.asarray(idata["posterior"][name].values).ravel()


def penalty_sample(**kw):
    """``pymc_dp.sample`` with a hand-configured penalty step, 5 draws, one chain, the
    budget (1, 1e-5): the message tests vary the model and one or two arguments."""
    import pymc_dp

    return pymc_dp.sample(
        step=pymc_dp.DPPenaltyMetropolis,
        epsilon=1.0,
        delta=1e-5,
        draws=5,
        tune=0,
        chains=1,
        step_kwargs={"clip_bound": 3.0},
        **kw,
    )


def glmm_model(n: int, groups: int = 10, seed: int = 0):
    """bench_auto's Poisson GLMM: a non-centred random intercept and one slope."""
    rng = np.random.default_rng(seed)
    g = rng.integers(groups, size=n)
    x = rng.normal(size=n)
    y = rng.poisson(np.exp(0.3 + 0.5 * x + rng.normal(0, 0.4, groups)[g]))
    with pm.Model() as m:
        b0 = pm.Normal("b0", 0, 2)
        b1 = pm.Normal("b1", 0, 2)
        sd = pm.HalfNormal("sd", 1)
        z = pm.Normal("z", 0, 1, shape=groups)
        pm.Poisson("y", pm.math.exp(b0 + b1 * x + sd * z[g]), observed=y)
    return m


def exact_laplace(model, n, *, z_hist=1e-12, seed=0, newton_steps=10, **kwargs):
    """`private_laplace` with clipping inactive (quantile 1) and the sums' noise 1e-12;
    ``z_hist`` the histograms' noise multiplier (per iteration, or one for all); ``kwargs``
    passed on (e.g. ``centred``)."""
    from pymc_dp.kernels.warmstart import clip_grid, private_laplace
    from pymc_dp.records import build_record_functions

    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip)
    q0 = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars])
    return private_laplace(
        q0=q0, n=n, prior_grad=lambda q: fns.prior_logp_and_grad(q)[1],
        clipped_moments=lambda q, b, b2, m, c=None: fns.clipped_grad_moments(
            q, b, m, outer_bound=b2, centre=c
        ),
        grad_counts_above=lambda q, g, m: fns.grad_norm_counts(q, g, m),
        grid=clip_grid(1e-3, 1e4, 40), quantile=1.0 - 1e-9, outer_quantile=1.0 - 1e-9,
        grad_noise_multiplier=1e-12, outer_noise_multiplier=1e-12,
        hist_noise_multiplier=z_hist, newton_steps=newton_steps,
        rng=np.random.default_rng(seed), **kwargs,
    )  # fmt: skip


#: the warnings by which a result says it may be wide or off
FLAGS = ("OneShotWarning", "NoiseDominatedWarning", "PriorDominatedWarning", "ConvergenceWarning")


def assert_not_confidently_wrong(idata, model, caught, draws, mean, sd) -> None:
    """A sweep cell's check (issue 26, "never confidently wrong"): the result's means
    ``draws.mean(0)`` within 2 of its own sds of the exact reference ``mean``, or the run
    warned (one of `FLAGS` in ``caught``); where it is beyond, its ``dp_converged`` is 0 and
    the privacy report's first line says so (`pymc_dp.report.UNUSABLE_PREFIXES`)."""
    import pymc_dp
    from pymc_dp.report import UNUSABLE_PREFIXES

    own = np.abs(draws.mean(0) - mean) / draws.std(0)
    flagged = any(type(w.message).__name__ in FLAGS for w in caught)
    assert flagged or np.max(own) <= 2.0, (np.round(own, 2), draws.mean(0) - mean, sd)
    if np.max(own) > 2.0:
        assert idata.attrs["dp_converged"] == 0
        first = str(pymc_dp.privacy_report(idata, model=model)).splitlines()[0]
        assert first.startswith(UNUSABLE_PREFIXES), first


def mode_and_laplace_sds(neg_log_post, start, keep: int, h: float = 1e-4):
    """A sweep cell's exact reference: the mode of ``neg_log_post`` (BFGS from ``start``) and
    the Laplace sds (central second differences of step ``h``), the first ``keep`` of each."""
    from scipy import optimize

    res = optimize.minimize(neg_log_post, start, method="BFGS", options={"gtol": 1e-9})
    th, d = res.x, len(res.x)
    hess = np.zeros((d, d))
    for i in range(d):
        for j in range(d):
            ei, ej = np.eye(d)[i] * h, np.eye(d)[j] * h
            hess[i, j] = (
                neg_log_post(th + ei + ej)
                - neg_log_post(th + ei - ej)
                - neg_log_post(th - ei + ej)
                + neg_log_post(th - ei - ej)
            ) / (4 * h * h)
    return th[:keep], np.sqrt(np.diag(np.linalg.inv(hess)))[:keep]


def oneshot_call(model, *, epsilon: float = 3.0, seed: int = 1):
    """One automatic call with the one-shot Laplace strategy forced (2 chains, warnings of
    the run's usability ignored): for tests that count what a call does."""
    import pymc_dp

    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        idata = pymc_dp.sample(
            epsilon=epsilon, delta=1e-6, chains=2, random_seed=seed, progressbar=False,
            auto_kwargs={"method": "laplace"},
        )  # fmt: skip
    assert idata.attrs["dp_method"] == "laplace"
    return idata
