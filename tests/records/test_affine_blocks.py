"""The affine bypass (issue 28, the banana): records sorted once into blocks; a block whose
box lies inside the clip region at the current point is summed from its mean, the others
take the route's per-record loop. The same clipped sums and counts as the per-record loop
with the bypass off and as a per-record numpy loop: every block inside, some straddling,
none inside; non-finite records; both record orders; the ratio release too. The
structural condition (`affine_in_data`, `data_degree`) accepts the banana and refuses
what is not affine in the data."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytensor
import pytest
from banana_records import banana_data, banana_model, banana_records

from pymc_dp.records import build_record_functions
from pymc_dp.records.affine import (
    AffineBlocks,
    affine_in_data,
    data_degree,
    limit_sq,
    ratio_affine_in_data,
)
from pymc_dp.records.clipping import F32_MARGIN, reference_clipped_sum

N = 3000
# records whose gradient or ratio is not finite: 0, counted as clipped
BAD = ((0, 5, 1e300), (1, 17, -1e300), (0, 40, -1e300))


def _data(order: str, bad: bool):
    return banana_data(N, 5, order, BAD if bad else ())


_BUILT: dict = {}


def _fns(order: str, bad: bool):
    key = (order, bad)
    if key not in _BUILT:
        x1, x2 = _data(order, bad)
        m = banana_model(x1, x2)
        fns, _ = build_record_functions(m, m.value_vars, m.initial_point())
        off, _ = build_record_functions(m, m.value_vars, m.initial_point())
        off._affine_off = True  # the route's per-record loop on every record
        _BUILT[key] = (fns, off, x1, x2)
    return _BUILT[key]


def test_the_banana_is_affine_in_its_data_and_other_models_are_not():
    x1, x2 = _data("given", False)
    m = banana_model(x1, x2)
    fns, _ = build_record_functions(m, m.value_vars, m.initial_point())
    g = fns._graphs
    assert affine_in_data(g) and ratio_affine_in_data(g)
    grad = pytensor.grad(g.one_record, g.x)
    assert data_degree([grad], g.rows) == 1
    assert data_degree([g.one_record], g.rows) == 2
    rng = np.random.default_rng(0)
    y = rng.normal(size=50)
    # a normal scale parameter: the gradient in log(sigma) is quadratic in y
    with pm.Model() as scale:
        s = pm.HalfNormal("s", 1.0)
        pm.Normal("y", 0.0, s, observed=y)
    # a Poisson rate and a logistic regression: not polynomial in the data
    with pm.Model() as pois:
        lam = pm.Normal("lam", 0.0, 1.0)
        pm.Poisson("y", pm.math.exp(lam * y), observed=rng.poisson(1.0, size=50))
    with pm.Model() as logit:
        b = pm.Normal("b", 0.0, 1.0)
        pm.Bernoulli("y", logit_p=b * y, observed=(y > 0).astype("int8"))
    for m in (scale, pois, logit):
        f, _ = build_record_functions(m, m.value_vars, m.initial_point())
        assert not affine_in_data(f._graphs)
    f, _ = build_record_functions(scale, scale.value_vars, scale.initial_point())
    assert not ratio_affine_in_data(f._graphs)  # the ratio's y^2 term does not cancel


def _case(blocks: AffineBlocks, fns, q, b) -> str:
    """Which of the bypass's cases ``q, b`` is: every block inside, some, none."""
    _, grad, _, route = fns._affine
    s, idx = blocks.split(lambda *r: grad((q,), r), limit_sq(b, route.weight_margin))
    return "none" if s is None else ("all" if idx is None else "some")


@pytest.mark.parametrize("bad", [False, True])
@pytest.mark.parametrize("order", ["given", "reversed", "shuffled"])
def test_bypass_gives_the_clipped_sums_of_the_per_record_loops(order, bad):
    fns, off, x1, x2 = _fns(order, bad)
    seen = set()
    for q, q_old in (
        (np.array([0.02, 2.9]), np.array([0.021, 2.91])),
        (np.array([0.3, 1.0]), np.array([0.29, 1.2])),
        (np.array([1.0, -3.0]), np.array([1.01, -3.0])),
    ):
        ll_new, grads = banana_records(q, x1, x2)
        ll_old, _ = banana_records(q_old, x1, x2)
        with np.errstate(over="ignore", invalid="ignore"):
            sq = np.sum(grads * grads, axis=1)
            r = ll_new - ll_old
        ok = sq <= 1e300
        lengths = np.where(ok, np.sqrt(np.where(ok, sq, 0.0)), 0.0)
        scale = np.sum(lengths)
        for counts in (True, False):
            fns.counts = off.counts = counts
            for b in (100.0, 1.0, 0.05, 1e-4):
                g, k = fns.clipped_grad_sum(q, b)
                seen.add(_case(fns._affine[0], fns, q, b))
                g_off, k_off = off.clipped_grad_sum(q, b)
                # the route's own sum, in another order; a clipped record's float32
                # weight may round differently by float32 ulps where the compiled loop
                # meets it in another position (a vector lane or the scalar tail), both
                # within the margin (clipping.py; as in test_fused_two_point.py)
                f32 = 8 * 2.0**-24 * np.sum(np.minimum(lengths, b))
                np.testing.assert_allclose(g, g_off, rtol=1e-12, atol=1e-13 * scale + f32)
                assert k == k_off
                # a per-record numpy loop: exact weights (the float32 weight shortens a
                # clipped contribution by at most a relative 2 F32_MARGIN, clipping.py)
                g_ref, k_ref = reference_clipped_sum(grads, b)
                slack = 2 * F32_MARGIN * np.sum(np.minimum(lengths, b))
                np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-13 * scale + slack)
                if counts:
                    assert k == k_ref
                else:
                    assert k == 0
                # the ratio release: exact clipping, NaN ratios 0 and counted
                b_l = b / 100.0
                s, kl = fns.clipped_loglik_ratio_sum(q, q_old, b_l)
                s_off, kl_off = off.clipped_loglik_ratio_sum(q, q_old, b_l)
                nan = np.isnan(r)
                s_ref = np.sum(np.where(nan, 0.0, np.clip(r, -b_l, b_l)))
                kl_ref = int(np.sum(nan | (np.abs(r) > b_l)))
                fin = np.isfinite(ll_new) & np.isfinite(ll_old)
                tol = 1e-13 * N * max(np.max(np.abs(ll_new[fin])), 1.0)
                assert abs(s - s_off) <= tol
                # the overflowing records (NaN here) contribute within [-b_l, b_l] in the
                # package's arithmetic (as in test_fused_two_point.py)
                assert abs(s - s_ref) <= tol + (2 * 3 * b_l if bad else 0.0)
                assert kl == (kl_ref if counts else 0) and kl_off == kl
                # the last pass of DP-HMC: the two releases, two counted
                before = dict(fns.released)
                g2, k2, s2, kl2 = fns.clipped_grad_and_ratio_sum(q, b, q_old, b_l)
                assert {k_: fns.released[k_] - before[k_] for k_ in before} == {
                    "grad": 1,
                    "llr": 1,
                }
                np.testing.assert_allclose(g2, g_off, rtol=1e-12, atol=1e-13 * scale + f32)
                assert abs(s2 - s_off) <= tol and (k2, kl2) == (k_off, kl_off)
    fns.counts = off.counts = True
    # every case of the bypass was met: all blocks inside, some straddling, none inside
    # (a block holding an overflowing record is never inside: not all, then)
    assert seen == ({"some", "none"} if bad else {"all", "some", "none"})


def test_blocks_cover_every_record_once_with_boxes_and_means():
    x1, x2 = _data("given", True)
    blocks = AffineBlocks((x1, x2), leaf=64)
    assert np.array_equal(np.sort(blocks.perm), np.arange(N))
    assert blocks.sizes.sum() == N and blocks.sizes.max() <= 64
    z = np.stack([x1, x2], axis=1)[blocks.perm]
    for j, (s, m) in enumerate(zip(blocks.starts, blocks.sizes, strict=True)):
        part = z[s : s + m]
        np.testing.assert_array_equal(blocks.lo[j], part.min(axis=0))
        np.testing.assert_array_equal(blocks.hi[j], part.max(axis=0))
        if np.all(np.isfinite(part)):
            np.testing.assert_allclose(blocks.mean[j], part.mean(axis=0), rtol=1e-13)


def test_data_degree_refuses_what_is_not_a_polynomial_in_the_data():
    import pytensor.tensor as pt

    x, r = pt.dscalar("x"), pt.dscalar("r")
    assert data_degree([r * pt.exp(x) + x**2], [r]) == 1
    assert data_degree([(r - x) / pt.exp(x)], [r]) == 1
    assert data_degree([(r - x) ** 2], [r]) == 2
    assert data_degree([(r - x) ** 2], [r], max_degree=1) is None
    assert data_degree([x / r], [r]) is None  # a division by the data
    assert data_degree([pt.floor(r)], [r]) is None  # zero gradient, not affine
    assert data_degree([pt.cast(r, "int64") * x], [r]) is None
    assert data_degree([pt.abs(r)], [r]) is None
    assert data_degree([pt.switch(pt.gt(r, 0.0), r, 0.0)], [r]) is None
    assert data_degree([pt.switch(pt.gt(x, 0.0), r, 2.0 * r)], [r]) == 1


@pytest.mark.slow
def test_dphmc_draws_are_exact_with_clipping_inactive_through_the_bypass():
    """A normal mean (gradient and ratio affine in the data): with the default settings
    every gradient sum and the two-point ratio of each trajectory's last pass come from
    the bypass (blocks inside at every point), and with clipping inactive the draws follow
    the closed-form posterior (noise on)."""
    from conftest import (
        assert_matches_distribution,
        check_no_clipping_and_noise_on,
        exact_dphmc,
        normal_mean_model,
        posterior_array,
    )
    from scipy import stats

    model, mean, sd = normal_mean_model(n=50, d=1)
    with model:
        step = exact_dphmc()
        fns = step._fns
        served = {"grad": 0, "llr": 0}
        real_grad, real_llr = fns._affine_grad_sum, fns._affine_ratio_sum

        def grad_spy(*a, **kw):
            out = real_grad(*a, **kw)
            served["grad"] += out is not None
            return out

        def llr_spy(*a, **kw):
            out = real_llr(*a, **kw)
            served["llr"] += out is not None
            return out

        fns._affine_grad_sum, fns._affine_ratio_sum = grad_spy, llr_spy
        sample = dict(progressbar=False, compute_convergence_checks=False)
        idata = pm.sample(3000, tune=500, chains=4, cores=1, step=step, random_seed=11, **sample)
    blocks, grad, ratio, _ = fns._affine
    assert grad is not None and ratio is not None and blocks.n == 50
    # the sums through the bypass: all but a few in the warmup (early trajectories reach
    # points where records are clipped; L sums computed a trajectory, the one at the
    # current point kept)
    assert served["grad"] >= 0.95 * fns.released["grad"] * 5 / 6
    assert served["llr"] >= 0.95 * fns.released["llr"]
    check_no_clipping_and_noise_on(idata)
    assert_matches_distribution(
        posterior_array(idata, "theta")[..., 0], stats.norm(mean[0], sd[0]), label="theta"
    )
