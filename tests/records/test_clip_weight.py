"""The float32 clip weight with a margin (issue 28): every record's clipped contribution has
float64 norm at most the bound, records inside ``b (1 - m)`` are untouched, and a clipped
record's weight is within the margin of the exact one; over adversarial records at and
around the bound, in the backend the routes are compiled with."""

from __future__ import annotations

import numpy as np
import pytensor.tensor as pt
import pytest

from pymc_dp.records.backend import compile_function
from pymc_dp.records.clipping import F32_MARGIN, clip_weights

_EPS32 = 2.0**-24


def _weights(float32_weight: bool):
    g = pt.dmatrix("g")
    b = pt.dscalar("b")
    sq = pt.sum(pt.sqr(g), axis=1)
    finite, w, n_clipped = clip_weights(sq, b, float32_weight=float32_weight)
    f = compile_function([g, b], [w, w[:, None] * g, n_clipped, sq], kind="route")
    return f


def _adversarial(b: float, rng) -> np.ndarray:
    """Records (rows of 3 coordinates) with norms at and around ``b`` and ``b (1 - m)``,
    one ulp at a time, at float32 rounding distances, far inside and far outside, huge
    and tiny, and non-finite."""
    ulp = np.finfo(np.float64).eps
    scales = [1.0 + k * ulp for k in range(-8, 9)]
    scales += [(1.0 - F32_MARGIN) * (1.0 + k * ulp) for k in range(-8, 9)]
    scales += [1.0 + k * _EPS32 for k in range(-40, 41)]
    scales += [(1.0 - F32_MARGIN) * (1.0 + k * _EPS32) for k in range(-40, 41)]
    scales += [1.0 / (1.0 - F32_MARGIN), 1.0 - 2 * F32_MARGIN, 1.0 + F32_MARGIN]
    scales += list(np.geomspace(1e-12, 1e-1, 12)) + list(np.geomspace(2.0, 1e25, 25))
    scales += list(rng.uniform(0.99, 1.01, 200))
    rows = []
    for s in scales:
        for _ in range(3):  # random directions: the rounding of the squared norm varies
            u = rng.normal(size=3)
            rows.append(u / np.linalg.norm(u) * (s * b))
        rows.append(np.array([s * b, 0.0, 0.0]))
    rows += [[np.inf, 0.0, 0.0], [np.nan, 1.0, 0.0], [1e200, 1e200, 0.0], [0.0, 0.0, 0.0]]
    return np.array(rows, dtype=np.float64)


@pytest.mark.parametrize("b", [1e-30, 1e-3, 0.7, 1.0, 3.7, 1e6, 1e30])
def test_float32_weight_keeps_every_contribution_within_the_bound(b):
    rng = np.random.default_rng(int(abs(np.log10(b)) * 10))
    g = _adversarial(b, rng)
    w, contrib, k, sq = _weights(True)(g, b)
    w_exact, _, k_exact, _ = _weights(False)(g, b)
    # the sensitivity: every contribution's float64 norm is at most b (a record with a
    # non-finite entry has weight 0: the routes mask its row, `mask_rows`)
    rows = np.all(np.isfinite(g), axis=1)
    assert (~rows).sum() == 2
    norms = np.sqrt(np.sum(contrib[rows] * contrib[rows], axis=1))
    assert np.all(np.isfinite(contrib[rows]))
    assert np.all(norms <= b), np.max(norms / b)
    # (the squared norms as the compiled function forms them; the threshold (b (1 - m))^2
    # may be formed with another rounding there: the records within 8 ulps of it are
    # left out of the "inside" check)
    eps = np.finfo(np.float64).eps
    with np.errstate(over="ignore", invalid="ignore"):
        inside = sq <= (b * (1.0 - F32_MARGIN)) ** 2 * (1.0 - 8 * eps)
        clipped = np.isfinite(sq) & (sq > (b * (1.0 - F32_MARGIN)) ** 2 * (1.0 + 8 * eps))
    # records inside b (1 - m) are untouched: weight exactly 1, contribution exactly g
    assert inside.sum() > 100
    np.testing.assert_array_equal(w[inside], 1.0)
    np.testing.assert_array_equal(contrib[inside], g[inside])
    # a clipped record's weight is the exact one shortened by at most the margin (float32
    # range: up to ||g|| ~ 1.8e19 b; beyond, 0)
    in_range = clipped & (np.sqrt(sq) < 1e18 * b)
    assert in_range.sum() > 100
    ratio = w[in_range] / w_exact[in_range]
    assert np.all(ratio <= 1.0 + 4 * _EPS32)
    assert np.all(ratio >= (1.0 - F32_MARGIN) * (1.0 - 4 * _EPS32))
    assert np.all(w[in_range] > 0)
    # non-finite records contribute 0; the count is the exact weight's
    np.testing.assert_array_equal(w[~np.isfinite(sq)], 0.0)
    assert k == k_exact == np.sum(~(sq <= b * b))
    assert 0 < k < len(g)


def test_blocks_route_uses_the_float32_weight_and_matches_the_reference():
    """The banana takes the blocks route with the float32 weight; its clipped sums agree
    with the exact per-record reference within the margin, clipping active or not."""
    import pymc as pm

    from pymc_dp.records import build_record_functions
    from pymc_dp.records.clipping import reference_clipped_sum

    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(0, 3, 500), rng.normal(1, 3, 500)
    with pm.Model() as model:
        t = pm.Normal("t", 0.0, 10.0, shape=2)
        pm.Normal("x1", t[0], 2.0, observed=x1)
        pm.Normal("x2", t[1] + 0.5 * t[0] ** 2, 2.0, observed=x2)
    fns, _ = build_record_functions(model, model.value_vars, model.initial_point())
    q = np.array([0.3, -0.2])
    grads = fns.per_record_grad(q)
    assert fns.gradient_route == "blocks"
    assert fns._c.grad_clipped["route"].weight_margin == F32_MARGIN
    lengths = np.sqrt(np.sum(grads * grads, axis=1))
    for b in (0.05, np.median(lengths), 1e3):
        g_ref, k_ref = reference_clipped_sum(grads, b)
        g, k = fns.clipped_grad_sum(q, b)
        assert k == k_ref
        slack = 2 * F32_MARGIN * np.sum(np.minimum(lengths, b))
        assert np.all(np.abs(g - g_ref) <= slack + 1e-12)
        if b == 1e3:  # clipping inactive: the same sum as without clipping
            np.testing.assert_allclose(g, grads.sum(axis=0), rtol=1e-12)


@pytest.mark.parametrize("b", [1e-3, 1.0, 3.7e4])
def test_blocks_route_clips_adversarial_records_exactly_in_both_orders(b):
    """The blocks route's compiled loop (the banana at ``t = 0``, where record ``i``'s
    gradient is exactly ``(x1_i, x2_i)``) on records whose norms sit at and around ``b`` and
    ``b (1 - m)`` (one ulp and one float32 rounding at a time), huge, tiny and with a squared
    norm that overflows:
    each record's contribution alone has float64 norm at most ``b``, and the route's sums
    and counts, in both orders of the records and chunked, are the per-record loop's."""
    import pymc as pm

    from pymc_dp.records import build_record_functions

    rng = np.random.default_rng(7)
    g = _adversarial(b, rng)[:, :2]
    # finite data only (pymc_dp refuses NaN and inf); squared norms that overflow instead
    g = np.concatenate([g[np.isfinite(g).all(axis=1)], [[1.5e308, 1.0], [-1e160, 1e160]]])
    for order in (slice(None), slice(None, None, -1)):
        x1, x2 = g[order, 0].copy(), g[order, 1].copy()
        with pm.Model() as model:
            t = pm.Normal("t", 0.0, 10.0, shape=2)
            pm.Normal("x1", t[0], 1.0, observed=x1)
            pm.Normal("x2", t[1] + 0.5 * t[0] ** 2, 1.0, observed=x2)
        q = np.zeros(2)
        for chunk_size in (None, 37):
            fns, _ = build_record_functions(
                model, model.value_vars, model.initial_point(), chunk_size=chunk_size
            )
            np.testing.assert_array_equal(fns.per_record_grad(q)[:3], np.c_[x1, x2][:3])
            assert fns.gradient_route == "blocks"
            route = fns._c.grad_clipped["route"]
            # the loop's weights (clip_weights with the float32 weight, in numpy)
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                sq = x1 * x1 + x2 * x2
                inner = b * (1.0 - F32_MARGIN)
                r = (sq * (1.0 / (inner * inner))).astype(np.float32)
                y = np.minimum(np.float32(1.0), np.float32(1.0) / np.sqrt(r)).astype(float)
                w = np.where(sq <= inner * inner, 1.0, y)
                w = np.where(w * w * sq <= b * b, w, 0.0)
            finite = np.isfinite(sq)
            ref = np.array([np.sum(w[finite] * x1[finite]), np.sum(w[finite] * x2[finite])])
            clipped = finite & (sq > inner * inner)
            slack = 4 * _EPS32 * np.sum(np.minimum(np.sqrt(sq[clipped]), b))
            total, k = fns.clipped_grad_sum(q, b)
            assert k == np.sum(~(sq <= b * b))
            np.testing.assert_allclose(total, ref, rtol=1e-9, atol=1e-12 * b + slack)
        # each record alone through the compiled route: norm at most b, 0 if not finite,
        # the record itself if inside b (1 - m)
        arrays = fns._records._arrays  # the records as the store keeps them
        for i in range(len(x1)):
            s, _ = route(q, b, [], [a[i : i + 1] for a in arrays])
            assert np.sqrt(np.sum(s * s)) <= b
            if not finite[i]:
                np.testing.assert_array_equal(s, 0.0)
            elif sq[i] <= inner * inner:
                np.testing.assert_array_equal(s, [x1[i], x2[i]])
