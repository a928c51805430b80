"""The one-shot strategy's curvature release: the clipped sum of per-record Hessians (issue 26).

`pymc_dp.records.runtime.RecordFunctions.clipped_hessian_sum` (through the automatic mode's
`pymc_dp.auto.configure._Coordinates.hessians`) and its use in
`pymc_dp.kernels.warmstart.private_laplace` (``clipped_hessians``,
`pymc_dp.kernels.warmstart.HESSIAN_SENSITIVITY`).
"""

from __future__ import annotations

import numpy as np
import pymc as pm
from conftest import laplace_draws

from pymc_dp.auto.configure import _Coordinates
from pymc_dp.kernels.warmstart import HESSIAN_SENSITIVITY
from pymc_dp.records import build_record_functions


def _fns(model: pm.Model):
    return build_record_functions(model, model.value_vars, model.initial_point())[0]


def _student_t_model(x: np.ndarray) -> pm.Model:
    """A location and log scale, Student-t records (nu = 3): a record far out has a per-record
    Hessian that is not positive (the log-likelihood is not concave in the location there)."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.StudentT("x", nu=3.0, mu=mu, sigma=sigma, observed=x)
    return model


def test_hessian_release_sensitivity_is_2b_by_brute_force():
    """Replacing any one record moves the exact clipped Hessian sum by at most ``2 B`` in
    Frobenius norm (`HESSIAN_SENSITIVITY`), records that hit the clip included; swapping a
    central record (positive curvature, clipped) for a far one (negative curvature) moves it
    by more than sqrt(2) ``B``: the factor 2 is needed, not just the outer products'. The
    sums are the library's own chunk function on the records of D and D' (one compiled
    model holding every value), checked once against the whole call on D."""
    x = np.array([-0.1, 0.0, 0.05, 0.2, 1.0, -2.0, 4.0, 30.0, -60.0])
    new_values = np.array([-1e4, -5.0, 0.0, 0.3, 2.5, 9.0, 1e4])
    pool = np.concatenate([x, new_values])
    fns = _fns(_student_t_model(pool))
    coords = _Coordinates(fns, None)
    q = np.array([0.0, np.log(1.0)])  # (mu, log sigma)
    m = np.array([[1.3, 0.0], [0.4, 0.8]])  # a public whitening
    points, maps, h = coords.hessian_points(q, m)
    fns._ensure_grad()  # the gradient function compiled (as the whole call does)
    kernel = fns._kernel("hessians")
    (arrays,) = [list(c) for c in fns.records.chunks()]

    def exact_sum(idx, bound):
        return kernel(points, maps, h, bound, *[a[np.asarray(idx)] for a in arrays])

    bound = 0.5
    base_idx = list(range(x.size))
    # the bound is active: a central record's own matrix is larger than it
    assert np.linalg.norm(exact_sum([0, 1], 1e12) - exact_sum([1], 1e12)) > 2.0 * bound
    base = exact_sum(base_idx, bound)
    # the whole call (`clipped_hessian_sum` through the store) gives the same sum on D
    whole = _Coordinates(_fns(_student_t_model(x)), None).hessians(q, bound, m)
    np.testing.assert_allclose(whole, base, rtol=1e-10, atol=1e-12)
    worst = 0.0
    for i in (0, 4, 7):
        for k in range(new_values.size):
            idx = base_idx.copy()
            idx[i] = x.size + k
            moved = exact_sum(idx, bound)
            worst = max(worst, float(np.linalg.norm(moved - base)))
    assert worst <= HESSIAN_SENSITIVITY * bound * (1 + 1e-9)
    assert worst > np.sqrt(2.0) * bound


def test_hessian_sum_is_the_exact_hessian_of_a_logistic_regression():
    """Unclipped, the sum is ``M X^T W X M^T`` (``W = diag(p (1 - p))``, ``M`` the public
    whitening): the closed-form Hessian of the log-likelihood, to the central differences'
    error (``h^2`` relative, ``h = 1e-3``)."""
    rng = np.random.default_rng(3)
    n = 400
    x = rng.normal(size=(n, 3))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(x @ [1.0, -0.5, 0.2]))))
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=3)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    q = np.array([0.3, -0.2, 0.1])
    m = np.linalg.inv(np.linalg.cholesky(np.array([[90.0, 5, 0], [5, 80, 3], [0, 3, 70]])))
    released = _Coordinates(_fns(model), None).hessians(q, 1e12, m)
    p = 1.0 / (1.0 + np.exp(-(x @ q)))
    exact = m @ ((x * (p * (1 - p))[:, None]).T @ x) @ m.T
    np.testing.assert_allclose(released, exact, rtol=1e-5, atol=1e-8)
    # clipped: each record's matrix scaled to norm B at most, so the sum is below
    p_i = p * (1 - p)
    xm = x @ m.T
    norms = p_i * np.sum(xm * xm, axis=1)
    bound = float(np.quantile(norms, 0.5))
    clipped = _Coordinates(_fns(model), None).hessians(q, bound, m)
    w = np.minimum(1.0, bound / norms)
    np.testing.assert_allclose(clipped, (xm * (w * p_i)[:, None]).T @ xm, rtol=1e-5, atol=1e-8)


def test_one_shot_sd_is_the_hessians_on_a_misspecified_normal_mean():
    """A normal mean with known sigma 1 on records that spread 3 sigma (n = 2000): the
    posterior is ``N(sum x / (n + 0.01), 1 / (n + 0.01))`` whatever the spread (``H = n``),
    while the empirical Fisher information is ``J = 9 n``: a covariance ``J^-1`` would have a
    third of the posterior's sd. The one-shot result's sd must be the posterior's (at least
    it, and at most 1.5 times: the noise-aware part at epsilon 10) and its mean within 3 of
    its own sds, on each of 2 DP seeds."""
    x = 2.0 + 3.0 * np.random.default_rng(11).normal(size=2000)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.0, observed=x)
    post_prec = x.size + 1 / 100.0
    post_mean, post_sd = x.sum() / post_prec, post_prec**-0.5
    for seed in (0, 1):
        draws = laplace_draws(model, "mu", seed)
        m, s = draws.mean(), draws.std()
        info = (seed, (m - post_mean) / post_sd, s / post_sd)
        assert abs(m - post_mean) < 3 * s, info
        assert 0.95 * post_sd <= s <= 1.5 * post_sd, info
