"""DP-HMC's last gradient pass with the two-point ratio release in it, and the route's
compiled functions called directly (issue 28, the banana): the same clipped sums and
counts as the separate passes and as a per-record numpy loop, with clipping active and
inactive, non-finite records, both record orders, one chunk (the direct calls) and
several; the count-free loop; DPHMC's draws unchanged."""

from __future__ import annotations

import numpy as np
import pytest
from banana_records import banana_data, banana_model, banana_records

import pymc_dp
from pymc_dp.records import build_record_functions
from pymc_dp.records.clipping import F32_MARGIN, reference_clipped_sum

N = 400
# records whose gradient or log-likelihood is not finite: 0, counted as clipped
BAD = ((0, 5, 1e300), (1, 17, -1e300))


def _data(order: str):
    return banana_data(N, 11, order, BAD)


_BUILT: dict = {}


def _fns(order: str, chunk_size):
    key = (order, chunk_size)
    if key not in _BUILT:
        x1, x2 = _data(order)
        m = banana_model(x1, x2)
        fns, _ = build_record_functions(m, m.value_vars, m.initial_point(), chunk_size=chunk_size)
        _BUILT[key] = (fns, x1, x2)
    return _BUILT[key]


@pytest.mark.parametrize("chunk_size", [None, 37])
@pytest.mark.parametrize("order", ["given", "reversed"])
def test_two_point_fused_pass_gives_the_sums_of_the_two_passes_and_of_a_numpy_loop(
    order, chunk_size
):
    fns, x1, x2 = _fns(order, chunk_size)
    fns._ensure_grad()
    assert fns.gradient_route == "blocks"
    q_old = np.array([0.3, 2.5])
    q_new = q_old + np.array([2e-3, -1e-2])
    ll_old, _ = banana_records(q_old, x1, x2)
    ll_new, grads = banana_records(q_new, x1, x2)
    with np.errstate(over="ignore", invalid="ignore"):
        sq = np.sum(grads * grads, axis=1)
    lengths = np.where(sq <= 1e300, np.sqrt(np.where(sq <= 1e300, sq, 0.0)), 0.0)
    for counts in (True, False):
        fns.counts = counts
        # b_g = 0.01: most records clipped; 100: none (the float32 weight is then 1)
        for b_g, b_l in ((0.01, 1e-4), (100.0, 10.0)):
            before = dict(fns.released)
            first = fns.clipped_grad_and_ratio_sum(q_new, b_g, q_old, b_l)
            again = fns.clipped_grad_and_ratio_sum(q_new, b_g, q_old, b_l)
            assert {k: fns.released[k] - before[k] for k in before} == {"grad": 2, "llr": 2}
            # the second call takes the direct path (one chunk): the same bits
            np.testing.assert_array_equal(first[0], again[0])
            assert first[1:] == again[1:]
            g, k, s, kl = first
            # the two passes it replaces
            g2, k2 = fns.clipped_grad_sum(q_new, b_g)
            s2, kl2 = fns.clipped_loglik_ratio_sum(q_new, q_old, b_l)
            # two compiled loops: the float32 clip weight of a clipped record may round
            # differently in each (by float32 ulps, both within the margin, clipping.py)
            f32 = 8 * 2.0**-24 * np.sum(np.minimum(lengths, b_g))
            np.testing.assert_allclose(g, g2, rtol=1e-12, atol=1e-14 * np.sum(lengths) + f32)
            assert abs(s - s2) <= 1e-12 * N * np.nanmax(np.abs(ll_new)[np.isfinite(ll_new)])
            assert (k, kl) == ((k2, kl2) if counts else (0, 0))
            # a per-record numpy loop: exact weights; the float32 weight shortens a
            # clipped contribution by at most a relative 2 F32_MARGIN (clipping.py)
            g_ref, k_ref = reference_clipped_sum(grads, b_g)
            slack = 2 * F32_MARGIN * np.sum(np.minimum(lengths, b_g))
            np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-13 + slack)
            if b_g > 1.0:  # clipping inactive: the exact sum
                np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-15)
            with np.errstate(invalid="ignore"):
                r = ll_new - ll_old
            nan = np.isnan(r)
            s_ref = np.sum(np.where(nan, 0.0, np.clip(r, -b_l, b_l)))
            kl_ref = int(np.sum(nan | (np.abs(r) > b_l)))
            # the per-record log-likelihoods (~|ll| each) are formed in other orders; the
            # two overflowing records contribute within [-b_l, b_l] (the package's NaN
            # handling, checked against the separate pass above)
            tol = 1e-13 * N * np.nanmax(np.abs(ll_new)[np.isfinite(ll_new)])
            assert abs(s - s_ref) <= tol + 2 * 2 * b_l
            finite = np.ones(N, bool)
            finite[[5, 17] if order == "given" else [N - 6, N - 18]] = False
            assert not np.any(nan[finite])
            if counts:
                assert k == k_ref and kl == kl_ref
                assert k_ref > (N // 2 if b_g < 1 else 1) and kl_ref >= 2
    # one chunk: the direct calls were set up (several chunks: `map_reduce`)
    assert bool(fns._direct_fused) == (chunk_size is None)
    fns.counts = True


def test_direct_calls_give_the_layered_calls_bits():
    fns2, x1, x2 = _fns("given", None)
    m = banana_model(x1, x2)
    off, _ = build_record_functions(m, m.value_vars, m.initial_point())
    off._direct_off = True  # PyTensor's call layers, as before issue 28's twelfth session
    for f in (fns2, off):
        f.counts = True
    for q in (np.array([0.1, 3.0]), np.array([-0.4, 1.0])):
        for b in (0.01, 100.0):
            for _ in range(2):  # the first call sets the direct call up, the second uses it
                g, k = fns2.clipped_grad_sum(q, b)
                g_off, k_off = off.clipped_grad_sum(q, b)
                np.testing.assert_array_equal(g, g_off)
                assert k == k_off
                lp, gp = fns2.prior_logp_and_grad(q)
                lp_off, gp_off = off.prior_logp_and_grad(q)
                assert lp == lp_off
                np.testing.assert_array_equal(gp, gp_off)
    assert off._direct is None and not off._direct_prior
    assert fns2._direct is not None


def _banana_steps(n: int = 300):
    x1, x2 = _data("given")
    x1, x2 = x1[:n].copy(), x2[:n].copy()
    x1[5] = x2[17] = 0.0
    m = banana_model(x1, x2)
    steps = []
    with m:
        for _ in range(2):
            steps.append(
                pymc_dp.DPHMC(
                    llr_clip_bound=1.0,
                    grad_clip_bound=1.0,
                    llr_noise_multiplier=1.0,
                    grad_noise_multiplier=1.0,
                    n_leapfrog=5,
                    step_size=0.01,
                    adapt_step_size=False,
                    adapt_mass_matrix=False,
                    rng=np.random.default_rng(3),
                )
            )
    return m, steps


def test_dphmc_on_the_banana_fuses_the_two_point_ratio_and_draws_the_same_chain():
    m, (fused, apart) = _banana_steps()
    assert fused._fused_kind() == "two-point" and fused.fuses_ratio_pass
    apart.fuse_ratio_pass = False
    assert apart._fused_kind() is None
    p1, p2 = m.initial_point(), m.initial_point()
    L = fused.n_leapfrog
    accepted = 0
    for _ in range(40):
        b1, b2 = dict(fused._fns.released), dict(apart._fns.released)
        p1, s1 = fused.step(p1)
        p2, s2 = apart.step(p2)
        for step, before in ((fused, b1), (apart, b2)):
            released = {k: step._fns.released[k] - before[k] for k in before}
            assert released == {"grad": L + 1, "llr": 1}
        # the same random draws in the same order; the ratio release differs only by
        # rounding (formed in one compiled loop instead of two), so the same decisions
        assert s1[0]["accepted"] == s2[0]["accepted"]
        np.testing.assert_allclose(p1["theta"], p2["theta"], rtol=1e-9, atol=1e-12)
        accepted += s1[0]["accepted"]
    assert fused._fused[1].calls == 40
    assert 0 < accepted < 40
