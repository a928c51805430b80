"""The one calibrator (pymc_dp.accounting.calibration): golden values and never above target.

The golden values were computed by main at e434abe, before the five search loops of the
steps, kernels and accounting were replaced by :mod:`pymc_dp.accounting.calibration`: the
calibrated numbers must not change.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pymc_dp.accounting import (
    GaussianEvent,
    PoissonSubsampledGaussian,
    analytic_gaussian_sigma,
    calibrate_noise_multiplier,
    calibrate_poisson_subsampled_noise,
    calibrate_wor_subsampled_noise,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu_for_epsilon,
    poisson_subsampled_gaussian_epsilon,
)
from pymc_dp.accounting.barker import calibrate_barker_batch_size
from pymc_dp.accounting.calibration import Bisect, Nudge, calibrate, solve
from pymc_dp.kernels.fastmh import Multiplicity, calibrate_fastmh, minibatch_epsilon, minibatch_mu
from pymc_dp.kernels.hmc import calibrate_dphmc_noise
from pymc_dp.kernels.hmc import dphmc_mu_per_iteration as _mu_per_iteration

REL = 1e-12  # a few ulps: scipy's special functions may differ in the last bit across versions

# -- golden values (main at e434abe) -------------------------------------------------------------

GAUSSIAN = [  # (epsilon, delta, releases): z, mu*, analytic sigma (sensitivity 2.5)
    ((1.0, 1e-5, 100), 37.30631634815946, 0.035925702327418124, 9.326579087039866),
    ((0.3, 1e-6, 7), 34.374614077884274, 0.0029620499795356566, 32.48095723710773),
    ((8.0, 1e-3, 10000), 48.0013752480111, 2.170014540933339, 1.2000343812002776),
    ((2.0, 1e-5, 1), 1.9938124456435378, 0.1257770484544678, 4.984531114108844),
]

DPHMC = {  # (epsilon, delta, iterations, L, f): (z_l, z_g)
    (1.0, 1e-5, 100, 1, 0.3): (44.5895766309869, 96.32449466573762),
    (1.0, 1e-5, 100, 10, 0.5): (52.75909856871053, 174.98213422978944),
    (0.3, 1e-6, 7, 10, 0.3): (41.085522201712664, 208.14862507611528),
    (8.0, 1e-3, 10000, 1, 0.5): (67.8841959229894, 96.00275054508397),
    (2.0, 1e-5, 1, 10, 0.5): (2.819676602898343, 9.351809321957743),
}

FASTMH = {  # run target / per-iteration target -> (z_1, z_2, iter_epsilon, iter_delta)
    (("epsilon", 2.0), ("delta", 1e-5), ("iterations", 100), "independent"): (
        331.0106957992514, 85.49473292479301, 0.04696352165139217, 8.000031680168117e-08),
    (("epsilon", 0.5), ("delta", 1e-6), ("iterations", 1000), "paper"): (
        4545.710475656786, 1194.3774013788873, 0.003793654375659372, 5.000001248750416e-10),
    (("iter_epsilon", 0.3), ("iter_delta", 1e-6), "independent"): (
        50.35060464751035, 12.992382894843093, 0.3, 1e-06),
    (("noise_multiplier", (2.0, 3.0)), ("iter_delta", 1e-6), "paper"): (
        2.0, 3.0, 17.78160831808418, 1e-06),
}  # fmt: skip


@pytest.mark.parametrize("args, z, mu, sigma", GAUSSIAN)
def test_golden_gaussian_calibration(args, z, mu, sigma):
    eps, delta, k = args
    assert calibrate_noise_multiplier(eps, delta, k) == pytest.approx(z, rel=REL)
    assert gaussian_mu_for_epsilon(eps, delta) == pytest.approx(mu, rel=REL)
    assert analytic_gaussian_sigma(eps, delta, 2.5) == pytest.approx(sigma, rel=REL)


@pytest.mark.parametrize("args", sorted(DPHMC))
def test_golden_dphmc_calibration(args):
    assert calibrate_dphmc_noise(*args) == pytest.approx(DPHMC[args], rel=REL)


def test_golden_subsampled_calibration():
    assert calibrate_poisson_subsampled_noise(2.0, 1e-3, 0.25, 60) == pytest.approx(
        5.584566562467239, rel=1e-9
    )
    assert calibrate_poisson_subsampled_noise(0.5, 1e-6, 0.1, 100) == pytest.approx(
        16.130494369894677, rel=1e-9
    )
    assert calibrate_wor_subsampled_noise(4.0, 1e-4, 60, 12, 60) == pytest.approx(
        3.3727052668967867, rel=1e-9
    )


def test_golden_barker_batch_size():
    assert calibrate_barker_batch_size(6.0, 1e-5, 1000, 80) == 1000
    assert calibrate_barker_batch_size(2.0, 1e-5, 10000, 500) == 137
    assert calibrate_barker_batch_size(10.0, 1e-5, 500, 40) == 500


@pytest.mark.parametrize("key", list(FASTMH), ids=str)
def test_golden_fastmh_calibration(key):
    *kw, branching = key
    cal = calibrate_fastmh(
        C=120.0, c_max=3.0, lam=30.0, max_step=0.3, max_batch=60, branching=branching, **dict(kw)
    )
    got = (cal.z_minibatch, cal.z_fullbatch, cal.iter_epsilon, cal.iter_delta)
    assert got == pytest.approx(FASTMH[key], rel=1e-9)


def test_golden_fastmh_minibatch_searches():
    assert minibatch_mu(Multiplicity.poisson(0.5), 0.5, 1e-6) == pytest.approx(
        0.003510847838392149, rel=1e-9
    )
    assert minibatch_epsilon(Multiplicity.poisson(3.0), 0.02, 1e-6) == pytest.approx(
        8.450688381561122, rel=1e-9
    )


# -- never above the target ---------------------------------------------------------------------

targets = st.floats(0.05, 20.0)
deltas = st.floats(1e-10, 1e-2)


@settings(max_examples=60, deadline=None)
@given(eps=targets, delta=deltas, k=st.integers(1, 10**6))
def test_calibrated_noise_never_overshoots(eps, delta, k):
    z = calibrate_noise_multiplier(eps, delta, k)
    assert gaussian_epsilon(GaussianEvent(z, k).mu, delta) <= eps
    # ... and is tight: 1e-9 less noise would overshoot or tie
    assert gaussian_epsilon(GaussianEvent(z * (1 - 1e-9), k).mu, delta) >= eps * (1 - 1e-6)
    mu = gaussian_mu_for_epsilon(eps, delta)
    assert gaussian_delta(mu, eps) <= delta and gaussian_epsilon(mu, delta) <= eps


@settings(max_examples=40, deadline=None)
@given(
    eps=targets,
    delta=deltas,
    k=st.integers(1, 10**5),
    L=st.integers(1, 50),
    f=st.floats(0.05, 0.95),
)
def test_calibrated_dphmc_noise_never_overshoots(eps, delta, k, L, f):
    z_l, z_g = calibrate_dphmc_noise(eps, delta, k, L, f)
    assert gaussian_epsilon(k * _mu_per_iteration(z_l, z_g, L), delta) <= eps


@settings(max_examples=6, deadline=None)
@given(eps=st.floats(0.5, 8.0), q=st.floats(0.01, 0.5), k=st.integers(1, 200))
def test_calibrated_subsampled_noise_never_overshoots(eps, q, k):
    z = calibrate_poisson_subsampled_noise(eps, 1e-5, q, k)
    assert poisson_subsampled_gaussian_epsilon([PoissonSubsampledGaussian(z, q, k)], 1e-5) <= eps


@settings(max_examples=200, deadline=None)
@given(
    scale=st.floats(1e-3, 1e3),
    power=st.floats(0.25, 4.0),
    target=st.floats(1e-3, 1e3),
    start=st.floats(1e-3, 1e3),
)
def test_the_calibrator_never_overshoots_a_monotone_epsilon(scale, power, target, start):
    def epsilon_of(x):  # decreasing in the noise x
        return scale / x**power

    x = calibrate(epsilon_of, target, Nudge(start, 1.0 + 2.0**-50))
    assert epsilon_of(x) <= target
    exact = (scale / target) ** (1.0 / power)
    lo, hi = min(start, exact) / 2.0, max(start, exact) * 2.0
    lo = lo if epsilon_of(lo) > target else lo / 1e9
    y = calibrate(epsilon_of, target, Bisect(hi, lo, "geometric", stop=lambda h, lw: h / lw < 1.01))
    assert epsilon_of(y) <= target
    assert y <= max(exact, start) * 2.0 * 1.01


def test_solve_bisects_integers_to_the_feasible_end():
    assert solve(lambda b: b <= 37, Bisect(0, 1000, "integer", stop=lambda a, b: b - a <= 1)) == 37
    assert math.isclose(solve(lambda x: x <= 0.3, Bisect(0.0, 1.0, max_steps=60)), 0.3)
