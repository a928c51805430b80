"""Recentring of non-centred hierarchical blocks (pymc_dp.auto.recentre) and the whitened,
reparametrised pieces of the automatic mode that use it."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor.tensor as pt
import pytest
from pymc.blocking import DictToArrayBijection, RaveledVars
from scipy import sparse

import pymc_dp
from pymc_dp.auto.configure import _Coordinates, tilt_sd
from pymc_dp.auto.recentre import Recentring, find_recentring
from pymc_dp.kernels.warmstart import prior_curvature_fd
from pymc_dp.records import build_record_functions


def _hier(n=200, groups=5, seed=0, sigma_is_tau=False):
    rng = np.random.default_rng(seed)
    g = rng.integers(groups, size=n)
    y = rng.normal(1.0, 1.0, n)
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 5)
        tau = pm.HalfNormal("tau", 2)
        z = pm.Normal("z", 0, 1, shape=groups)
        s = tau if sigma_is_tau else pm.HalfNormal("sigma", 2)
        pm.Normal("y", mu + tau * z[g], s, observed=y)
    return m


def _within_4_mcse(checks: dict) -> None:
    """Each ``name: (draws, exact value)``: the chain's mean within 4 Monte Carlo standard
    errors of the closed form."""
    import arviz as az

    for name, (x, truth) in checks.items():
        mcse = float(az.mcse(x.to_dataset(name="x"))["x"])
        assert abs(float(x.mean()) - truth) < 4 * mcse, (name, float(x.mean()), truth, mcse)


def _prior_moments_within_4_mcse(model, block, second, seed, noise_on, **step_kwargs):
    """Sample a prior-only model (mu ~ N(0, 1), tau ~ HalfNormal(1), a 2-vector ``block``)
    with an independence proposal in y = (mu, log tau, a_1, a_2) that is not the prior pushed
    to y, clipping inactive (checked), the noise on when ``noise_on`` (checked); E[mu],
    E[tau], E[tau^2], E[block_0] = 0 and E[block_0^2] = ``second`` within 4 MCSE."""
    mean = np.array([0.2, -0.5, 0.1, -0.1])
    cov = np.diag([1.5, 0.8, 1.2, 1.2]) ** 2
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            proposal="independent", proposal_mean=mean, proposal_cov=cov,
            nonprivate_diagnostics=True, **step_kwargs,
        )  # fmt: skip
        idata = pm.sample(
            draws=6000, tune=0, chains=4, step=step, random_seed=seed, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert np.nanmax(idata.sample_stats["clip_fraction_NONPRIVATE"].values) == 0.0
    if noise_on:  # the noise is really on
        assert float(np.median(idata.sample_stats["noise_std"].values)) > 0.5
    post = idata.posterior
    first = post[block].sel({f"{block}_dim_0": 0})
    _within_4_mcse(
        {
            "mu": (post["mu"], 0.0),
            "tau": (post["tau"], np.sqrt(2 / np.pi)),
            "tau^2": (post["tau"] ** 2, 1.0),
            f"{block}0": (first, 0.0),
            f"{block}0^2": (first**2, second),
        }
    )


def _flat(model, point=None):
    point = point or model.initial_point()
    return DictToArrayBijection.map({v.name: point[v.name] for v in model.value_vars}).data


def test_finds_the_common_non_centred_patterns_by_structure():
    rng = np.random.default_rng(0)
    n, groups = 100, 4
    g = rng.integers(groups, size=n)
    x = rng.normal(size=n)
    assert [b.describe() for b in find_recentring(_hier())] == ["z -> mu + tau * z"]
    assert find_recentring(_hier())[0].exclusive == ("tau", "mu")
    # a scale read elsewhere in the likelihood is not exclusive (the likelihood depends on it)
    assert find_recentring(_hier(sigma_is_tau=True))[0].exclusive == ("mu",)
    # random intercept inside a GLM's linear predictor: scale only (the Add's other side
    # reads data); a Deterministic in between
    with pm.Model() as glm:
        b0 = pm.Normal("b0", 0, 5)
        b1 = pm.Normal("b1")
        sd = pm.HalfNormal("sd", 1)
        zz = pm.Normal("zz", 0, 1, shape=groups)
        a = pm.Deterministic("a", sd * zz)
        pm.Poisson("y", pm.math.exp(b0 + b1 * x + a[g]), observed=rng.poisson(1, n))
    assert [b.describe() for b in find_recentring(glm)] == ["zz -> sd * zz"]
    # varying intercepts and slopes: two blocks, z on either side of the product
    with pm.Model() as slopes:
        ma, sa = pm.Normal("ma"), pm.HalfNormal("sa")
        za = pm.Normal("za", 0, 1, shape=groups)
        mb, sb = pm.Normal("mb"), pm.Exponential("sb", 1)
        zb = pm.Normal("zb", 0, 1, shape=groups)
        bb = mb + zb * sb
        pm.Normal("y", (ma + sa * za)[g] + bb[g] * x, 1, observed=x)
    assert sorted(b.describe() for b in find_recentring(slopes)) == [
        "za -> ma + sa * za",
        "zb -> mb + sb * zb",
    ]


def test_a_shared_intercept_among_other_terms_is_the_blocks_loc():
    """``b0 + b1 x + sd * z[g]`` (a GLMM's intercept and its random intercepts): ``b0`` is the
    block's ``loc`` and the likelihood does not read it in the centred coordinates (the
    direction ``b0`` up, every ``a_j`` down no record's gradient has: the one-shot strategy's
    Newton steps converged linearly along it). Not where the sum is read elsewhere too (it
    would read ``b0`` there), and ``b0`` not exclusive where the likelihood reads it again."""
    rng = np.random.default_rng(2)
    n, groups = 60, 4
    g, x, y = rng.integers(groups, size=n), rng.normal(size=n), rng.normal(size=n)

    def model(kind: str) -> pm.Model:
        with pm.Model() as m:
            b0, b1 = pm.Normal("b0"), pm.Normal("b1")
            sd = pm.HalfNormal("sd")
            z = pm.Normal("z", 0, 1, shape=groups)
            eta = b0 + b1 * x
            sigma = {"plain": 1.0, "sum": pm.math.exp(eta), "b0": pm.math.exp(b0)}[kind]
            pm.Normal("y", eta + sd * z[g], sigma, observed=y)
        return m

    (plain,) = find_recentring(model("plain"))
    assert (plain.describe(), plain.exclusive) == ("z -> b0 + sd * z", ("sd", "b0"))
    (block,) = find_recentring(model("sum"))
    assert (block.describe(), block.exclusive) == ("z -> sd * z", ("sd",))
    (block,) = find_recentring(model("b0"))
    assert (block.describe(), block.exclusive) == ("z -> b0 + sd * z", ("sd",))
    # the likelihood in the centred coordinates: b0 moves no record's log-likelihood
    m = model("plain")
    rp = Recentring(m, [plain], m.value_vars, m.initial_point())
    ll = m.compile_fn(m.observedlogp)
    ip = m.initial_point()
    q = DictToArrayBijection.map({v.name: ip[v.name] for v in m.value_vars}).data
    q = q + rng.normal(size=q.size)
    y0 = rp.forward(q)
    moved = y0.copy()
    moved[rp.likelihood_free] += 0.7
    assert rp.likelihood_free.sum() == 2  # b0 and log sd
    unravel = DictToArrayBijection.map({v.name: ip[v.name] for v in m.value_vars}).point_map_info

    def at(qq):
        return float(ll(DictToArrayBijection.rmap(RaveledVars(qq, unravel))))

    assert at(rp.inverse(moved)) == pytest.approx(at(rp.inverse(y0)), rel=1e-10)


def test_refuses_what_is_not_the_pattern():
    rng = np.random.default_rng(1)
    g = rng.integers(3, size=50)
    y = rng.normal(size=50)
    with pm.Model() as centred:
        mu, tau = pm.Normal("mu"), pm.HalfNormal("tau")
        a = pm.Normal("a", mu, tau, shape=3)
        pm.Normal("y", a[g], 1, observed=y)
    with pm.Model() as other_use:  # z also read without the scale
        mu, tau = pm.Normal("mu"), pm.HalfNormal("tau")
        z = pm.Normal("z", 0, 1, shape=3)
        pm.Normal("y", mu + tau * z[g] + z[g], 1, observed=y)
    with pm.Model() as signed_scale:  # a scale that can be negative: T not a bijection
        mu, s = pm.Normal("mu"), pm.Normal("s")
        z = pm.Normal("z", 0, 1, shape=3)
        pm.Normal("y", mu + s * z[g], 1, observed=y)
    with pm.Model() as not_standard:  # z ~ N(0, 2) is not the non-centred pattern
        mu, tau = pm.Normal("mu"), pm.HalfNormal("tau")
        z = pm.Normal("z", 0, 2, shape=3)
        pm.Normal("y", mu + tau * z[g], 1, observed=y)
    for m in (other_use, signed_scale, not_standard):
        assert find_recentring(m) == []
    # the centred model is not recentred: it is found as a centred block, left as it is
    assert [b.centred for b in find_recentring(centred)] == [True]


def test_centred_blocks_are_found_and_left_as_they_are():
    """``a ~ N(loc, scale)`` is a centred block (identity map); its ``loc`` and ``scale`` are
    likelihood-free when the likelihood reads neither (structure only)."""
    rng = np.random.default_rng(2)
    g = rng.integers(4, size=60)
    y = rng.normal(size=60)

    def model(loc="mu", scale="tau", mu_in_likelihood=False):
        with pm.Model() as m:
            mu = pm.Normal("mu")
            tau = pm.HalfNormal("tau") if scale == "tau" else pm.Normal("tau")
            loc_ = {"mu": mu, "zero": 0.0, "three": 3.0}[loc]
            a = pm.Normal("a", loc_, tau if scale != "const" else 2.0, shape=4)
            pm.Normal("y", a[g] + (mu if mu_in_likelihood else 0.0), 1, observed=y)
        return m

    (b,) = find_recentring(model())
    assert b.centred and b.describe() == "a ~ N(mu, tau) (centred: as is)"
    assert b.exclusive == ("tau", "mu")
    assert find_recentring(model(mu_in_likelihood=True))[0].exclusive == ("tau",)
    (b,) = find_recentring(model(loc="zero"))
    assert b.loc is None and b.exclusive == ("tau",)
    # a constant scale, a signed scale, a constant non-zero loc: not the pattern
    for m in (model(scale="const"), model(scale="signed"), model(loc="three")):
        assert find_recentring(m) == []
    m = model()
    rp = Recentring(m, find_recentring(m), m.value_vars, m.initial_point())
    q = rng.normal(size=6)  # mu, log tau, a (4)
    y1, log_det = rp.forward_with_log_det(q)
    np.testing.assert_array_equal(y1, q)
    assert log_det == 0.0
    np.testing.assert_array_equal(rp.inverse(q), q)
    np.testing.assert_array_equal(rp.jacobian(q), np.eye(6))
    np.testing.assert_array_equal(rp.likelihood_free, [True, True, False, False, False, False])


@pytest.mark.slow
def test_free_moves_on_a_centred_block_are_exact():
    """The automatic mode's sampler on a centred block (identity map): independence
    proposals of the a's given (mu, log tau), data-free moves of those two, the step's
    length on the a's only, a noise of sd ~1 on the test; the posterior is the prior
    (likelihood sd 1e4): mu ~ N(0, 1), tau ~ HalfNormal(1), a_j | mu, tau ~ N(mu, tau^2),
    so E[a_0] = 0, E[a_0^2] = 1 + E[tau^2] = 2, within 4 MCSE."""

    rng = np.random.default_rng(6)
    g = np.arange(20) % 2
    with pm.Model() as model:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        a = pm.Normal("a", mu, tau, shape=2)
        pm.Normal("y", a[g], 1e4, observed=rng.normal(size=20))
    rp = Recentring(model, find_recentring(model), model.value_vars, model.initial_point())
    _prior_moments_within_4_mcse(
        model, "a", 2.0, 8, True, clip_bound=1e-3, noise_multiplier=300.0,
        reparametrization=rp, clip_metric=_A_ONLY, free_moves=3,
    )  # fmt: skip


def test_the_map_its_inverse_jacobian_and_log_determinant():
    model = _hier()
    rp = Recentring(model, find_recentring(model), model.value_vars, model.initial_point())
    rng = np.random.default_rng(2)
    q = _flat(model) + rng.normal(size=8)
    y = rp.forward(q)
    np.testing.assert_allclose(rp.inverse(y), q, rtol=0, atol=1e-12)
    # a = mu + tau * z in place of z, the rest unchanged (value order: mu, tau_log__, z, sigma)
    np.testing.assert_allclose(y[2:7], q[0] + np.exp(q[1]) * q[2:7], rtol=1e-12)
    np.testing.assert_array_equal(y[[0, 1, 7]], q[[0, 1, 7]])
    h = 1e-6
    num = np.stack(
        [(rp.forward(q + h * e) - rp.forward(q - h * e)) / (2 * h) for e in np.eye(8)], axis=1
    )
    np.testing.assert_allclose(rp.jacobian(q), num, atol=1e-7)
    assert rp.log_det_jacobian(q) == pytest.approx(np.linalg.slogdet(rp.jacobian(q))[1])
    assert rp.log_det_jacobian(q) == pytest.approx(5 * q[1])
    np.testing.assert_allclose(rp.likelihood_free, [1, 1, 0, 0, 0, 0, 0, 0])


def test_prior_gradient_and_curvature_in_the_centred_coordinates():
    """The prior of y is the prior of q over |det J|; its gradient is exact (finite
    differences) and the curvature used by the warm start is positive definite at the
    funnel's neck (all a_j at loc), where the exact one is singular in log tau."""
    model = _hier()
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip)
    rp = Recentring(model, find_recentring(model), model.value_vars, ip)
    coords = _Coordinates(fns, rp)
    rng = np.random.default_rng(3)
    y = rp.forward(_flat(model) + 0.3 * rng.normal(size=8))

    def logp_y(v):
        q = rp.inverse(v)
        return fns.prior_logp_and_grad(q)[0] - rp.log_det_jacobian(q)

    h = 1e-6
    num = np.array([(logp_y(y + h * e) - logp_y(y - h * e)) / (2 * h) for e in np.eye(8)])
    np.testing.assert_allclose(coords.prior_grad(y), num, rtol=1e-6, atol=1e-6)
    y0 = rp.forward(_flat(model))  # z = 0: every a_j at mu
    exact = prior_curvature_fd(coords.prior_grad, y0)
    # only tau~HalfNormal(2)'s prior: -exp(2t) / 8 + t in t = log tau
    assert exact[1, 1] == pytest.approx(np.exp(2 * y0[1]) / 2, rel=1e-3)
    used = coords.prior_curvature(y0)
    assert used[1, 1] == pytest.approx(exact[1, 1] + 2 * 5, rel=1e-3)  # + 2 J, J = 5 groups
    assert np.linalg.eigvalsh(used).min() > 0


@pytest.mark.parametrize("block_rows", [None, 9], ids=["one-block", "row-blocks"])
def test_record_functions_with_a_transform_and_direction_match_a_per_record_loop(
    block_rows, monkeypatch
):
    """The warm start's moments and counts and the control variate's residuals against a
    per-record loop; also evaluated in row blocks inside each chunk (9 rows: a partial last
    block), the control variate's per-record gradients kept sparse (4 of 8 coordinates)."""
    import pymc_dp.records.runtime as runtime

    if block_rows is not None:
        monkeypatch.setattr(runtime, "MIN_BLOCK_ROWS", 1)
        monkeypatch.setattr(runtime, "ROW_BLOCK_BYTES", 8 * 8 * block_rows)
    model = _hier(n=300)
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip, chunk_size=70)
    rng = np.random.default_rng(4)
    q = _flat(model) + 0.5 * rng.normal(size=8)
    g = fns.per_record_grad(q)
    m = rng.normal(size=(8, 8))
    gm = g @ m.T
    norms = np.linalg.norm(gm, axis=1)
    grid = np.geomspace(1e-2, 1e2, 17)
    np.testing.assert_array_equal(
        fns.grad_norm_counts(q, grid, m), (norms[:, None] > grid[None, :]).sum(axis=0)
    )
    b, b2 = float(np.quantile(norms, 0.8)), float(np.quantile(norms, 0.4))
    c = gm * np.minimum(1.0, b / norms)[:, None]
    e = c * np.minimum(1.0, b2 / np.linalg.norm(c, axis=1))[:, None]
    s1, s2 = fns.clipped_grad_moments(q, b, m, outer_bound=b2)
    np.testing.assert_allclose(s1, c.sum(axis=0), rtol=1e-10)
    np.testing.assert_allclose(s2, e.T @ e, rtol=1e-10)
    # centred outer products: e_i = clip_{b2}(c_i - centre), the sum unchanged
    centre = c.mean(axis=0) + 0.1 * rng.normal(size=8)
    ec = c - centre
    ec *= np.minimum(1.0, b2 / np.linalg.norm(ec, axis=1))[:, None]
    s1c, s2c = fns.clipped_grad_moments(q, b, m, outer_bound=b2, centre=centre)
    np.testing.assert_allclose(s1c, s1, rtol=1e-12)
    np.testing.assert_allclose(s2c, ec.T @ ec, rtol=1e-10)
    # residuals after the control variate in other coordinates, any direction
    q1, q0 = q + 0.1 * rng.normal(size=8), q
    direction = rng.normal(size=8)
    r = fns.loglik(q1) - fns.loglik(q0)
    res = r - c @ direction
    bound = float(np.quantile(np.abs(res), 0.7))
    total, count = fns.clipped_residual_ratio_sum(q1, q0, bound, q, b, m, direction)
    assert total == pytest.approx(np.clip(res, -bound, bound).sum(), rel=1e-10)
    assert count == int(np.count_nonzero(np.abs(res) > bound))
    # unclipped, it plus the control variate is the exact ratio sum, whatever the direction
    total, _ = fns.clipped_residual_ratio_sum(q1, q0, 1e9, q, b, m, direction)
    assert total + c.sum(axis=0) @ direction == pytest.approx(r.sum(), rel=1e-10)
    # the kept coefficients: the sparse per-record gradients and n weights, not n x d floats
    (kept,) = fns._anchor_grads.values()
    coefficients = fns.records._prepared[id(kept)][1]
    blocks = [b for c_ in coefficients for b in c_.blocks]
    # 4 chunks of 70 records (8 blocks of 9 rows or fewer) and one of 20 (3 blocks)
    assert len(blocks) == (4 * 8 + 3 if block_rows == 9 else 5)
    assert all(sparse.issparse(b) and b.nnz <= 4 * b.shape[0] for b in blocks)
    # no transform: the residuals with the clipped gradients themselves
    c0 = g * np.minimum(1.0, b / np.linalg.norm(g, axis=1))[:, None]
    res0 = r - c0 @ (q1 - q0)
    total, _ = fns.clipped_residual_ratio_sum(q1, q0, bound, q, b)
    assert total == pytest.approx(np.clip(res0, -bound, bound).sum(), rel=1e-10)


def test_tilt_of_a_whitened_release_by_simulation():
    """Noise xi on whitened sums tilts theta by L xi; drop the noise on likelihood-free
    coordinates and they are tilted only through their correlations."""
    rng = np.random.default_rng(5)
    a = rng.normal(size=(3, 3))
    cov = a @ a.T + np.eye(3)
    basis = rng.normal(size=(3, 3)) + 2 * np.eye(3)  # any public invertible basis
    noisy = np.array([True, True, False])
    s = 2 * 0.7 * np.sqrt(1 / (2 * 0.4))
    xi = rng.normal(size=(200_000, 3)) * s * noisy
    shift = xi @ basis.T @ cov  # cov (L xi), row-wise
    np.testing.assert_allclose(
        shift.std(axis=0) / np.sqrt(np.diag(cov)),
        tilt_sd(cov, 0.7, 0.4, noisy, basis),
        rtol=0.01,
    )


def _prior_only_model():
    """A likelihood too weak to matter (sd 1e4 on 20 records): the posterior is the prior,
    known in closed form, mu ~ N(0, 1), tau ~ HalfNormal(1), z ~ N(0, 1)."""
    rng = np.random.default_rng(6)
    g = np.arange(20) % 2
    with pm.Model() as m:
        mu = pm.Normal("mu", 0, 1)
        tau = pm.HalfNormal("tau", 1)
        z = pm.Normal("z", 0, 1, shape=2)
        pm.Normal("y", mu + tau * z[g], 1e4, observed=rng.normal(size=20))
    return m


# the step's length of the last case: the a-coordinates only (mu and log tau are not read
# by the likelihood once recentred), with a noise that is really on (sigma = z 2 b s ~ 1)
_A_ONLY = np.diag([0.0, 0.0, 1.0, 1.0])


@pytest.mark.slow
@pytest.mark.parametrize(
    "local_moves, clip_metric, clip_bound, z, free_moves",
    [
        (0.0, None, 1e6, 1e-12, 0),
        (0.5, None, 1e6, 1e-12, 0),
        (0.0, _A_ONLY, 1e-3, 300.0, 0),
        (0.0, _A_ONLY, 1e-3, 300.0, 2),
    ],
)
def test_independence_proposal_in_centred_coordinates_is_exact(
    local_moves, clip_metric, clip_bound, z, free_moves
):
    """Proposing in y = T(q) targets the posterior of q only with the Jacobian in the
    Hastings ratio: on a model whose posterior is its prior, the chain's means and second
    moments match the closed form within 4 Monte Carlo standard errors (dropping the
    log-determinant terms moves E[tau] by many MCSEs: checked by hand); the same with half
    the iterations random-walk moves in y (a mixture of two kernels); and with the step's
    length ``||M dy||`` of a public ``clip_metric`` and a noise of sd ~1 on the test (the
    penalty correction keeps the chain exact for any length symmetric in the two points;
    clipping stays inactive: the ratios are ~1e-8); and with data-free moves of mu and
    log tau (which the likelihood does not read in y) between independence proposals of
    the a's conditioned on them."""

    model = _prior_only_model()
    ip = model.initial_point()
    rp = Recentring(model, find_recentring(model), model.value_vars, ip)
    _prior_moments_within_4_mcse(
        model, "z", 1.0, 7, clip_metric is not None, clip_bound=clip_bound,
        noise_multiplier=z, reparametrization=rp, local_moves=local_moves,
        clip_metric=clip_metric, free_moves=free_moves,
    )  # fmt: skip


def test_clip_metric_sets_the_steps_length_and_the_tests_noise():
    """With ``clip_metric`` M the released test's noise is z 2 b ||M dy||, dy the step in the
    proposal's coordinates (here y = T(q)): checked on every accepted move, where the step
    is the difference of consecutive draws; a move of the coordinates M leaves out has
    length 0."""
    model = _prior_only_model()
    ip = model.initial_point()
    rp = Recentring(model, find_recentring(model), model.value_vars, ip)
    metric = np.array([[0.0, 0.0, 2.0, 1.0], [0.0, 0.0, 0.0, 3.0]])
    z, b = 0.7, 0.05
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=b, noise_multiplier=z, proposal="gaussian", proposal_scale=0.3,
            reparametrization=rp, clip_metric=metric,
        )  # fmt: skip
        idata = pm.sample(
            draws=300, tune=0, chains=1, step=step, random_seed=3, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    post, st = idata.posterior, idata.sample_stats
    q = np.column_stack(
        [
            post["mu"].values[0],
            np.log(post["tau"].values[0]),
            post["z"].values[0],
        ]
    )
    y = np.array([rp.forward_with_log_det(row)[0] for row in q])
    moved = np.flatnonzero(np.any(np.diff(q, axis=0) != 0, axis=1)) + 1
    assert moved.size > 20
    s = np.linalg.norm((y[moved] - y[moved - 1]) @ metric.T, axis=1)
    np.testing.assert_allclose(st["step_norm"].values[0][moved], s, rtol=1e-9)
    np.testing.assert_allclose(st["noise_std"].values[0][moved], z * 2 * b * s, rtol=1e-9)
    # a step of mu alone changes nothing M sees
    with model:
        step = pymc_dp.DPPenaltyMetropolis(
            clip_bound=b, noise_multiplier=z, reparametrization=rp, clip_metric=metric
        )
    y0 = rp.forward_with_log_det(np.array([0.0, 0.0, 0.3, -0.2]))[0]
    assert np.linalg.norm(step.clip_metric @ (y0 + [1.0, 0, 0, 0] - y0)) == 0.0


def test_bad_local_moves_and_basis_are_refused_before_any_data_is_read():
    model = _prior_only_model()
    cov, mean = np.eye(4), np.zeros(4)
    with model:
        for bad in (np.eye(3), np.zeros((2, 4)), np.full((1, 4), np.nan), "x"):
            with pytest.raises(ValueError, match="clip_metric must"):
                pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, clip_metric=bad)
        for bad in (-1, 1.5, True):
            with pytest.raises(ValueError, match="free_moves must be a non-negative integer"):
                pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, free_moves=bad)
        with pytest.raises(ValueError, match="free_moves needs a reparametrization"):
            pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, free_moves=2)
        with pytest.raises(ValueError, match="local_moves must be a probability"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=1.0, noise_multiplier=1.0, proposal="independent",
                proposal_mean=mean, proposal_cov=cov, local_moves=1.5,
            )  # fmt: skip
        with pytest.raises(ValueError, match="local_moves goes with proposal='independent'"):
            pymc_dp.DPPenaltyMetropolis(clip_bound=1.0, noise_multiplier=1.0, local_moves=0.5)
        with pytest.raises(ValueError, match="control_variate_basis goes with control_variate"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=1.0, noise_multiplier=1.0, control_variate_basis=np.eye(4)
            )
        with pytest.raises(ValueError, match="must be invertible"):
            pymc_dp.DPPenaltyMetropolis(
                clip_bound=1.0, noise_multiplier=1.0,
                control_variate=(np.zeros(4), np.zeros(4), 1.0),
                control_variate_basis=np.zeros((4, 4)),
            )  # fmt: skip


# -- shifted blocks: v ~ N(loc(w), s) read by the likelihood only as v - loc(w), sampled as
# u = v - loc(w) (the DP-HMC paper's banana, written as a user would) ----------------------

_A = 2.0  # the banana's curvature
_S1, _S2 = 1.0, 1.5  # the records' sds
_P1, _P2 = 2.0, 3.0  # the prior sds of theta1 and of theta2 given theta1


def _banana(n=50, reads="shift", loc_reads_data=False, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 2)) * [_S1, _S2] + [0.3, 0.8]
    with pm.Model() as m:
        t1 = pm.Normal("theta1", 0.0, _P1)
        loc = -_A * t1**2
        if loc_reads_data:
            loc = loc * pm.Data("c", 1.0)
        t2 = pm.Normal("theta2", loc, _P2)
        second = {"shift": t2 + _A * t1**2, "direct": t2, "other": t2 + 2 * _A * t1**2}[reads]
        pm.Normal("x", mu=pt.stack([t1, second]), sigma=[_S1, _S2], observed=x)
    return m, x


def test_a_shifted_block_is_found_by_structure_and_checked_numerically():
    m, _ = _banana()
    (b,) = find_recentring(m)
    assert b.shift and b.describe() == "theta2 -> theta2 - loc(theta1)"
    # the likelihood reads theta2 itself, or theta2 + t with t != -loc, or loc reads data
    for other in (
        _banana(reads="direct")[0],
        _banana(reads="other")[0],
        _banana(loc_reads_data=True)[0],
    ):
        assert find_recentring(other) == []
    # a location that multiplies a numpy array with one row per record reads data: refused
    # (the check evaluates the graph, and its outcome is published in the result's attrs)
    n = 30
    w = np.random.default_rng(1).uniform(0.5, 1.5, n)
    with pm.Model() as m:
        t1 = pm.Normal("theta1", 0.0, _P1)
        v = pm.Normal("v", -_A * t1**2 * w, _P2, shape=n)
        pm.Normal("y", v + _A * t1**2 * w, 1.0, observed=np.zeros(n))
    assert find_recentring(m) == []


def test_the_shift_map_its_inverse_jacobian_and_log_determinant():
    m, _ = _banana()
    rp = Recentring(m, find_recentring(m), m.value_vars, m.initial_point())
    rng = np.random.default_rng(1)
    for _ in range(3):
        q = rng.normal(size=2)  # (theta1, theta2)
        y, log_det = rp.forward_with_log_det(q)
        np.testing.assert_allclose(y, [q[0], q[1] + _A * q[0] ** 2], rtol=1e-12)
        assert log_det == 0.0
        np.testing.assert_allclose(rp.inverse(y), q, rtol=0, atol=1e-12)
        np.testing.assert_allclose(rp.jacobian(q), [[1.0, 0.0], [2 * _A * q[0], 1.0]], rtol=1e-12)
    np.testing.assert_array_equal(rp.likelihood_free, [False, False])
    # no funnel: the prior's curvature needs no correction
    np.testing.assert_array_equal(rp.curvature_correction(y), np.zeros((2, 2)))


def _closed_form(x):
    """The posterior in (theta1, u = theta2 + A theta1^2): two independent normals."""
    n = x.shape[0]
    v1 = 1.0 / (n / _S1**2 + 1.0 / _P1**2)
    v2 = 1.0 / (n / _S2**2 + 1.0 / _P2**2)
    return v1 * x[:, 0].sum() / _S1**2, v1, v2 * x[:, 1].sum() / _S2**2, v2


@pytest.mark.slow
def test_independence_proposal_in_the_shifted_coordinates_is_exact():
    """Proposing in y = (theta1, theta2 + A theta1^2) targets the banana posterior of
    (theta1, theta2): its means E[theta1] = m1, E[theta2] = m2 - A (m1^2 + v1) and
    E[theta2^2] in closed form, within 4 Monte Carlo standard errors (clipping inactive;
    the proposal is not the posterior)."""
    m, x = _banana()
    m1, v1, m2, v2 = _closed_form(x)
    rp = Recentring(m, find_recentring(m), m.value_vars, m.initial_point())
    with m:
        step = pymc_dp.DPPenaltyMetropolis(
            proposal="independent", reparametrization=rp,
            proposal_mean=np.array([m1 + 0.3 * np.sqrt(v1), m2 - 0.2 * np.sqrt(v2)]),
            proposal_cov=np.diag([1.3**2 * v1, 1.2**2 * v2]),
            clip_bound=1e6, noise_multiplier=1e-12, nonprivate_diagnostics=True,
        )  # fmt: skip
        idata = pm.sample(
            draws=4000, tune=0, chains=4, step=step, random_seed=3, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert np.nanmax(idata.sample_stats["clip_fraction_NONPRIVATE"].values) == 0.0
    post = idata.posterior
    e_t1sq = m1**2 + v1
    e_t2 = m2 - _A * e_t1sq
    # theta2 = u - _A t1^2: Var = v2 + _A^2 Var(t1^2), Var(t1^2) = 4 m1^2 v1 + 2 v1^2
    e_t2sq = e_t2**2 + v2 + _A**2 * (4 * m1**2 * v1 + 2 * v1**2)
    _within_4_mcse(
        {
            "theta1": (post["theta1"], m1),
            "theta2": (post["theta2"], e_t2),
            "theta2^2": (post["theta2"] ** 2, e_t2sq),
        }
    )


@pytest.mark.slow
def test_the_automatic_mode_samples_a_banana_in_the_shifted_coordinates():
    """End to end: the report names the shifted block, the budget is the target, and the
    chains sit on the posterior (epsilon 10, n = 5000: every mean within 1 posterior sd)."""
    m, x = _banana(n=5000)
    m1, v1, m2, v2 = _closed_form(x)
    with m:
        idata = pymc_dp.sample(
            epsilon=10.0, delta=1e-6, chains=2, random_seed=4, progressbar=False,
            compute_convergence_checks=False,
        )  # fmt: skip
    assert "theta2 -> theta2 - loc(theta1)" in str(idata.attrs["dp_auto_recentred"])
    assert pymc_dp.privacy_report(idata, attach=False).epsilon <= 10.0 + 1e-9
    post = idata.posterior
    e_t2 = m2 - _A * (m1**2 + v1)
    sd_t2 = np.sqrt(v2 + _A**2 * (4 * m1**2 * v1 + 2 * v1**2))
    assert abs(float(post["theta1"].mean()) - m1) < np.sqrt(v1)
    assert abs(float(post["theta2"].mean()) - e_t2) < sd_t2


def _old_prior_grad(rp, fns, q):
    """The prior's gradient in y as `_Coordinates` computed it before `Recentring.pull_back`:
    ``inv(J)^T (g - grad log |det J|)``, the Jacobian from a Scan over its rows."""
    _, g = fns.prior_logp_and_grad(q)
    return np.linalg.inv(rp.jacobian(q)).T @ (g - rp.grad_log_det_jacobian(q))


def _groups_model(groups: int, centred_too: bool = False) -> pm.Model:
    rng = np.random.default_rng(5)
    n = 4 * groups
    g, x, y = rng.integers(groups, size=n), rng.normal(size=n), rng.normal(size=n)
    with pm.Model() as m:
        b0, b1 = pm.Normal("b0", 1, 2), pm.Normal("b1")
        sd = pm.HalfNormal("sd")
        z = pm.Normal("z", 0, 1, shape=groups)
        eta = b0 + b1 * x + sd * z[g]
        if centred_too:
            tau = pm.HalfNormal("tau")
            eta = eta + pm.Normal("c", 0, tau, shape=groups)[g]
        pm.Normal("y", eta, pm.HalfNormal("sigma", 2), observed=y)
    return m


@pytest.mark.parametrize("kind", ["hier", "groups40", "centred", "banana"])
def test_pull_back_is_the_inverse_jacobian_transpose_product(kind):
    """`Recentring.pull_back` (a vector-Jacobian product of the inverse map, O(d)) gives the
    prior's gradient in y that ``gradient_map(q) @ (g - grad log |det J|)`` gave (an inverse
    of the d x d Jacobian, O(d^3): 25 ms at d = 467, 6 900 times in one call, issue 26), to
    rounding; and the vectorised Jacobian is the closed form (``tau`` on the block's
    diagonal, 1 in ``loc``, ``tau z_j`` in ``log tau``) to rounding."""
    model = {
        "hier": lambda: _hier(),
        "groups40": lambda: _groups_model(40),
        "centred": lambda: _groups_model(6, centred_too=True),
        "banana": lambda: _banana()[0],
    }[kind]()
    ip = model.initial_point()
    fns, _ = build_record_functions(model, model.value_vars, ip)
    rp = Recentring(model, find_recentring(model, point=ip), model.value_vars, ip)
    coords = _Coordinates(fns, rp)
    rng = np.random.default_rng(7)
    d = _flat(model).size
    for _ in range(3):
        q = _flat(model) + rng.normal(size=d)
        y = rp.forward(q)
        old = _old_prior_grad(rp, fns, q)
        new = coords.prior_grad(y)
        np.testing.assert_allclose(new, old, rtol=1e-12, atol=1e-12 * np.abs(old).max())
        v = rng.normal(size=d) * 10
        want = rp.gradient_map(q) @ (v - rp.grad_log_det_jacobian(q))
        np.testing.assert_allclose(rp.pull_back(q, y, v), want, rtol=1e-12, atol=1e-12 * 10)
    if kind == "groups40":  # value order: b0, b1, sd_log__, z (40), sigma_log__
        jac = rp.jacobian(q)
        tau, z = np.exp(q[2]), q[3:43]
        want = np.eye(d)
        want[3:43, 3:43] = tau * np.eye(40)
        want[3:43, 0] = 1.0
        want[3:43, 2] = tau * z
        np.testing.assert_allclose(jac, want, rtol=1e-14, atol=0)
