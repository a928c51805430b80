"""The transition kernels are pure functions of (rng, state, model functions) -> info record."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
from scipy import stats

import pymc_dp.kernels as K
from pymc_dp.kernels.hmc import DPHMCInfo, dphmc_transition
from pymc_dp.kernels.penalty import accept
from pymc_dp.kernels.subsampled_penalty import (
    SubsampledPenaltyInfo,
    minibatch_estimate,
    subsampled_penalty_log_acceptance,
    subsampled_penalty_sensitivity,
    subsampled_penalty_transition,
)


def test_kernels_never_import_pymc():
    root = pathlib.Path(K.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            for name in names:
                assert name.split(".")[0] not in {"pymc", "pytensor"}, (path.name, name)
                assert not name.startswith(("pymc_dp.records", "pymc_dp.step_methods")), name


# -- DP-HMC ---------------------------------------------------------------------------------------

X = np.linspace(-1.0, 1.0, 30)


def _gaussian_fns(calls: list):
    """x_i ~ N(theta, 1), flat prior: per-record functions as RecordFunctions provides them."""

    def clipped_grad_sum(q, b):
        calls.append("grad")
        g = X[:, None] - q[None, :]
        norm = np.linalg.norm(g, axis=1)
        scale = np.minimum(1.0, b / np.maximum(norm, 1e-300))
        return (g * scale[:, None]).sum(axis=0), int(np.sum(norm > b))

    def prior_logp_and_grad(q):
        return 0.0, np.zeros_like(q)

    def clipped_loglik_ratio_sum(q1, q, bound):
        calls.append("llr")
        r = -0.5 * (X - q1[0]) ** 2 + 0.5 * (X - q[0]) ** 2
        return float(np.sum(np.clip(r, -bound, bound))), int(np.sum(np.abs(r) > bound))

    return {
        "clipped_grad_sum": clipped_grad_sum,
        "prior_logp_and_grad": prior_logp_and_grad,
        "clipped_loglik_ratio_sum": clipped_loglik_ratio_sum,
    }


def _dphmc(rng, q, calls, **kw):
    args = dict(
        step_size=0.05,
        n_leapfrog=4,
        mass_diag=np.ones(1),
        inv_mass=np.ones(1),
        grad_clip_bound=1e6,
        grad_noise_std=0.0,
        llr_clip_bound=1e6,
        llr_noise_multiplier=1e-9,
    )
    args.update(kw)
    return dphmc_transition(rng, q, **args, **_gaussian_fns(calls))


def test_dphmc_transition_returns_an_info_record_and_reads_the_data_l_plus_2_times():
    calls: list = []
    q_next, info = _dphmc(np.random.default_rng(0), np.array([0.3]), calls)
    assert isinstance(info, DPHMCInfo)
    assert calls == ["grad"] * 5 + ["llr"]  # L + 1 gradient releases, one ratio release
    assert info.n_grad == 5 and info.n_grad_clipped == 0 and info.n_llr_clipped == 0
    # no clipping, (almost) no noise, a small step: exact HMC, energy nearly conserved
    assert info.accept_prob > 0.99 and not info.diverging
    assert info.accepted == (q_next[0] != 0.3)


def test_dphmc_transition_is_reproducible_from_its_generator():
    a = _dphmc(np.random.default_rng(5), np.array([0.1]), [], grad_noise_std=3.0)
    b = _dphmc(np.random.default_rng(5), np.array([0.1]), [], grad_noise_std=3.0)
    assert np.array_equal(a[0], b[0]) and a[1] == b[1]


def test_dphmc_transition_rejects_outside_the_prior_without_reading_the_data():
    calls: list = []
    fns = _gaussian_fns(calls)
    prior_calls: list = []

    def prior(x):  # finite at the start only: the end point is outside the support
        prior_calls.append(1)
        return (0.0 if len(prior_calls) == 1 else -np.inf), np.zeros(1)

    fns["prior_logp_and_grad"] = prior
    q = np.array([0.3])
    q_next, info = dphmc_transition(
        np.random.default_rng(1),
        q,
        step_size=0.5,
        n_leapfrog=2,
        mass_diag=np.ones(1),
        inv_mass=np.ones(1),
        grad_clip_bound=1e6,
        grad_noise_std=0.0,
        llr_clip_bound=1.0,
        llr_noise_multiplier=1.0,
        **fns,
    )
    assert "llr" not in calls and calls == ["grad"] * 3
    assert not info.accepted and q_next is q and info.accept_prob == 0.0


# -- subsampled penalty -----------------------------------------------------------------------


def test_subsampled_penalty_transition_draws_as_the_step_did():
    """Same draws, same order: batch, noise, accept uniform (the step's former inline code)."""
    r_all = np.random.default_rng(3).normal(scale=0.01, size=50)
    n, b, L, z, h, lpr = 50, 12, 1.0, 1.5, 0.2, -0.1
    info = subsampled_penalty_transition(
        np.random.default_rng(9),
        n_records=n,
        batch_size=b,
        clip_bound=L,
        noise_multiplier=z,
        step_norm=h,
        log_prior_ratio=lpr,
        minibatch_ratios=lambda idx: r_all[idx],
    )
    assert isinstance(info, SubsampledPenaltyInfo)
    rng = np.random.default_rng(9)
    sigma = z * subsampled_penalty_sensitivity(n, b, L, h)
    idx = np.sort(rng.choice(n, size=b, replace=False))
    lam, var = minibatch_estimate(r_all[idx], n, L * h)
    log_a = subsampled_penalty_log_acceptance(lam, var, lpr, sigma, rng)
    assert info.log_accept == pytest.approx(log_a, rel=0, abs=0)
    assert info.accepted == bool(accept(log_a, rng))
    assert info.noise_std == sigma and info.batch_var == float(var)


def test_minibatch_moments_merged_over_parts_give_the_minibatch_estimate():
    """Parts of a minibatch travel as (m, sum, M2); merged in order they give the estimate
    of `minibatch_estimate` on the whole batch (NaN, +-inf and clipping included)."""
    from pymc_dp.kernels.subsampled_penalty import (
        clipped_moments,
        merge_moments,
        moments_estimate,
    )

    rng = np.random.default_rng(4)
    r = rng.normal(3.0, 0.5, size=97)
    r[[3, 40]] = np.nan
    r[7], r[8] = np.inf, -np.inf
    n, bound = 500, 3.2
    cuts = np.sort(rng.choice(np.arange(1, r.size), size=5, replace=False))
    parts = [clipped_moments(p, bound) for p in np.split(r, cuts)]
    moments, clipped = parts[0]
    for m, k in parts[1:]:
        moments, clipped = merge_moments(moments, m), (clipped[0] + k[0],)
    lam, var = moments_estimate(moments, n)
    lam0, var0 = minibatch_estimate(r, n, bound)
    assert moments[0] == r.size
    assert lam == pytest.approx(lam0, rel=1e-12) and var == pytest.approx(var0, rel=1e-9)
    assert clipped[0] == np.count_nonzero(~(np.abs(r) <= bound))
    empty = clipped_moments(np.empty(0), bound)[0]
    assert merge_moments(empty, moments) == moments == merge_moments(moments, empty)


def test_tuna_terms_add_over_parts():
    """TunaMH's minibatch sum is a sum over the drawn indices: parts add up to the whole."""
    from pymc_dp.kernels.fastmh import keep_probability, tuna_log_ratio, tuna_terms

    rng = np.random.default_rng(5)
    C, lam, M = 50.0, 20.0, 0.1
    r = rng.normal(0.0, 0.2, size=60)
    c = rng.uniform(0.5, 1.5, size=60)
    u = rng.uniform(size=60)
    (ell,), (kept, n_clipped) = tuna_terms(r, c, u, C, lam, M)
    rc = np.clip(r, -c * M, c * M)
    keep = u < keep_probability(rc, c, C, lam, M)
    assert ell == pytest.approx(tuna_log_ratio(rc[keep], c[keep], C, lam, M), rel=1e-12)
    assert (kept, n_clipped) == (keep.sum(), np.count_nonzero(np.abs(r) > c * M)) != (60, 0)
    halves = [tuna_terms(r[s], c[s], u[s], C, lam, M) for s in (slice(0, 25), slice(25, 60))]
    assert halves[0][0][0] + halves[1][0][0] == pytest.approx(ell, rel=1e-12)


def test_conditional_prior_mode_is_the_gaussian_conditional_mode():
    """The free block goes to ``mu_f + S_fd S_dd^-1 (x_d - mu_d)`` under a correlated
    Gaussian prior (closed form); the other coordinates stay; a point where the prior is not
    finite, or a free block already at its mode, comes back unchanged."""
    from pymc_dp.kernels.warmstart import conditional_prior_mode

    rng = np.random.default_rng(3)
    a = rng.normal(size=(4, 4))
    cov = a @ a.T + 4 * np.eye(4)
    prec, mu = np.linalg.inv(cov), np.array([0.5, -1.0, 2.0, 0.0])

    def logp(x):
        r = x - mu
        return -0.5 * float(r @ prec @ r), -(prec @ r)

    free = np.array([False, True, False, True])
    x = np.array([1.3, 7.0, -0.4, -9.0])
    out = conditional_prior_mode(x, free, logp)
    d, f = ~free, free
    want = mu[f] + cov[np.ix_(f, d)] @ np.linalg.solve(cov[np.ix_(d, d)], x[d] - mu[d])
    np.testing.assert_allclose(out[f], want, rtol=1e-6, atol=1e-8)
    np.testing.assert_array_equal(out[d], x[d])
    np.testing.assert_allclose(conditional_prior_mode(out, free, logp), out, atol=1e-8)

    def not_finite(x):
        return -np.inf, np.zeros_like(x)

    np.testing.assert_array_equal(conditional_prior_mode(x, free, not_finite), x)


def test_offdiagonal_threshold_lets_noise_through_at_most_at_bonferronis_rate():
    """A released curvature's off-diagonal entries are kept only past
    `offdiag_threshold_sds` noise sds: over pure-noise symmetric matrices (the release's
    noise, `_sym_noise`) the share with any entry kept must be at most the family-wise rate
    (binomial 1 - 1e-6 quantile over 4000 matrices of 30 coordinates, 435 entries each); a
    fixed 3 sds keeps one in ~70 % of them."""
    from pymc_dp.kernels.warmstart import (
        OFFDIAG_FAMILY_WISE,
        _sym_noise,
        offdiag_threshold_sds,
    )

    d, runs = 30, 4000
    rng = np.random.default_rng(11)
    sds = offdiag_threshold_sds(d)
    off = ~np.eye(d, dtype=bool)
    kept = fixed = 0
    for _ in range(runs):
        e = _sym_noise(d, 1.0, rng)
        kept += bool(np.any(np.abs(e[off]) >= sds))
        fixed += bool(np.any(np.abs(e[off]) >= 3.0))
    assert kept <= stats.binom.ppf(1.0 - 1e-6, runs, OFFDIAG_FAMILY_WISE), kept
    assert fixed > 0.5 * runs  # the old fixed level: the test can tell them apart
    assert offdiag_threshold_sds(2) == 3.0  # never below 3 sds
    assert offdiag_threshold_sds(50) > offdiag_threshold_sds(30) > 3.0


def test_growing_schedule_shares_and_per_iteration_multipliers():
    """`growing_schedule`: shares growing by the factor, summing to 1 (equal at 1); bad
    growth refused. `private_laplace` takes one multiplier per iteration or one for all,
    and refuses a schedule of the wrong length before any data call."""
    from pymc_dp.kernels.warmstart import clip_grid, growing_schedule, private_laplace

    w = growing_schedule(5, 1.3)
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(w[1:] / w[:-1], 1.3, rtol=1e-12)
    np.testing.assert_allclose(growing_schedule(4, 1.0), 0.25, rtol=1e-12)
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="growth"):
            growing_schedule(3, bad)

    calls = []

    def moments(*args, **kwargs):
        calls.append(args)
        raise AssertionError("no data may be read")

    with pytest.raises(ValueError, match="grad_noise_multiplier.*newton_steps"):
        private_laplace(
            q0=np.zeros(2), n=100, prior_grad=lambda q: -q, clipped_moments=moments,
            grad_counts_above=moments, grid=clip_grid(1e-3, 1e4, 29), quantile=0.99,
            grad_noise_multiplier=[1.0, 1.0], outer_noise_multiplier=1.0,
            hist_noise_multiplier=1.0, newton_steps=2, rng=np.random.default_rng(0),
        )  # fmt: skip
    assert not calls


def test_secant_ratio_is_the_hessian_over_the_curvature_along_the_step():
    """On a quadratic log posterior (Hessian ``H``) with a curvature ``P = 50 H + E``: the
    noise-free ratio is ``s^T H s / s^T P s`` to rounding; with the released gradients'
    noise (``N(0, sd^2 B B^T)`` each, two whitenings) the ratios of 4000 draws average it
    (5 Monte Carlo sds) and their sd is the one returned (within 5 %)."""
    from pymc_dp.kernels.warmstart import secant_ratio

    rng = np.random.default_rng(21)
    d = 4
    a = rng.normal(size=(d, d))
    hess = a @ a.T + d * np.eye(d)
    e = rng.normal(size=(d, d))
    prec = 50.0 * hess + e @ e.T
    mode = rng.normal(size=d)
    y0 = mode + rng.normal(size=d) * 3.0
    step = np.linalg.solve(prec, -hess @ (y0 - mode))
    g0, g1 = -hess @ (y0 - mode), -hess @ (y0 + step - mode)
    want = float(step @ hess @ step) / float(step @ prec @ step)
    b0, b1 = np.linalg.cholesky(prec), np.linalg.cholesky(hess)
    sds = (0.05, 0.08)
    rho, rho_sd = secant_ratio(step, g0, g1, prec, (0.0, 0.0), (b0, b1))
    assert rho == pytest.approx(want, rel=1e-10) and rho_sd == 0.0
    assert want == pytest.approx(0.02, rel=0.1)
    k = 4000
    got = np.array([
        secant_ratio(
            step, g0 + b0 @ rng.normal(size=d) * sds[0], g1 + b1 @ rng.normal(size=d) * sds[1],
            prec, sds, (b0, b1),
        )
        for _ in range(k)
    ])  # fmt: skip
    assert np.allclose(got[:, 1], got[0, 1])
    assert abs(got[:, 0].mean() - want) < 5 * got[0, 1] / np.sqrt(k)
    assert got[:, 0].std() == pytest.approx(got[0, 1], rel=0.05)
