"""DP-Fast MH takes memory bounded before sampling, whatever its batch's mean.

Both tests failed on main at 99d13ac (issue 29, item 6): the law of a record's copies in a
minibatch was tabulated from 1 to 12 sds above its mean, so a large clip bound (a Poisson
GLM, n = 4 000, ``clip_bound=50``) raised ``MemoryError: Unable to allocate 2.09 GiB`` while
calibrating.
"""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_dp
from pymc_dp.kernels import fastmh as K


def _full_law(mean: float) -> K.Multiplicity:
    """The law tabulated from k = 1 (what main did), for a mean small enough to fit."""
    kmax = int(mean + 12.0 * math.sqrt(mean) + 40.0)
    k = np.arange(1, kmax + 1)
    return K.Multiplicity(stats.poisson.pmf(k, mean), float(stats.poisson.sf(kmax, mean)))


@pytest.mark.parametrize("mean", [2e4, 3e5])
def test_a_large_mean_law_is_a_window_that_never_undershoots(mean):
    law = K.Multiplicity.poisson(mean)
    full = _full_law(mean)
    assert law.k0 > 1 and law.pmf.size < 30 * math.sqrt(mean) + 100
    assert law.eta == pytest.approx(full.eta, rel=1e-12)
    for c, eps in ((0.01, 0.5), (0.5, 1.0)):
        mu = c / mean**2  # k^2 mu of order c: deltas neither 0 nor 1
        want = K.minibatch_delta(full, mu, eps)
        got = K.minibatch_delta(law, mu, eps)
        assert 1e-12 < want < 0.5
        assert got == pytest.approx(want, rel=1e-9) and got >= want * (1 - 1e-12)
    shift = 1e-6
    assert K.noise_free_delta(law, shift) >= K.noise_free_delta(full, shift) * (1 - 1e-12)


def test_a_huge_mean_is_tabulated_in_memory_of_its_sd():
    law = K.Multiplicity.poisson(2.8e8)  # the law: 2.09 GiB on main
    assert law.pmf.size < 500_000 and law.eta == pytest.approx(1.0)


def test_a_law_too_wide_to_account_is_refused_before_the_data_is_read():
    x = np.random.default_rng(4).normal(size=20_000)
    with pm.Model():
        mu = pm.Normal("mu", 0, 1)
        pm.Normal("x", mu, 1, observed=x)
        with (
            pytest.raises(ValueError, match=r"too wide a law.*clip_bound, lam or max_step"),
            pytest.warns(UserWarning, match="capped at n"),
        ):
            pymc_dp.DPFastMH(clip_bound=5000.0, iter_epsilon=1.0, iter_delta=1e-6)
