"""Ordered transforms bounded by their prior (issue 26, fourteenth session).

An ordered transform (``y_0 = x_0``, ``y_i = log(x_i - x_{i-1})``) has no value at a prior
draw out of order. The prior's moments in ``y`` (`prior_in_y`) were taken from every draw,
so every log-gap coordinate came out without moments: no trust region, no prior cap, and
the one-shot result's log gaps were as wide as the noise made them (measured: an
ordered-cutpoint model on 1 260 real records, the log gaps' sd 9.8, draws of 1e87). The
model's prior is its distribution restricted to the transform's image: the draws out of
order are rejected.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_dp
from pymc_dp.auto.configure import PRIOR_DRAWS, prior_in_y
from pymc_dp.auto.oneshot import PRIOR_WIDE_SDS

ORDERED = pm.distributions.transforms.ordered


def _reference(mu: np.ndarray, draws: int = 1_000_000, seed: int = 0) -> np.ndarray:
    """Draws in ``y`` of ``N(mu, I)`` restricted to ``x_0 < x_1 < ...`` (numpy rejection)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(draws, mu.size)) + mu
    x = x[np.all(np.diff(x, axis=1) > 0, axis=1)]
    return np.column_stack([x[:, 0], np.log(np.diff(x, axis=1))])


@pytest.mark.parametrize("mu", [(0.0, 0.0), (0.0, 1.0), (-1.0, 0.0, 1.0)])
def test_prior_in_y_of_an_ordered_variable_is_its_restricted_prior(mu):
    """The moments of an ordered ``Normal(mu, 1)`` in ``y`` match those of its law restricted
    to the ordered values (numpy rejection, 1e6 draws) within 4 Monte Carlo standard errors
    of `PRIOR_DRAWS` draws; every coordinate has finite moments, and the log gaps are marked
    as log scales. For ``mu = (0, 0)`` the restricted law is that of the order statistics:
    the minimum of two standard normals (mean ``-1 / sqrt(pi)``) and ``log |N(0, 2)|`` (mean
    ``log(2) / 2 - (gamma + log 2) / 2``, variance ``pi^2 / 8``). For ``mu = (0, 1)`` sorting
    the draws instead would put the log gap's mean 0.19 lower (12 standard errors)."""
    mu = np.asarray(mu)
    with pm.Model() as model:
        pm.Normal(
            "c", mu=mu, sigma=1.0, shape=mu.size, transform=ORDERED, initval=mu + np.arange(mu.size)
        )
        pm.Normal("a", 0.0, 2.0)
    prior = prior_in_y(model, model.value_vars, model.initial_point(), None)
    ref = _reference(mu)
    want_mean, want_var = ref.mean(axis=0), ref.var(axis=0)
    if mu.size == 2 and mu[1] == 0.0:  # the closed forms, as a check of the reference
        closed = [-1 / np.sqrt(np.pi), np.log(2.0) / 2 - (np.euler_gamma + np.log(2.0)) / 2]
        np.testing.assert_allclose(want_mean, closed, atol=5e-3)
        np.testing.assert_allclose(want_var, [1 - 1 / np.pi, np.pi**2 / 8], rtol=1e-2)
    k = mu.size
    got_mean, got_var = prior.mean[:k], prior.var[:k]
    assert np.all(np.isfinite(prior.var)) and np.all(np.isfinite(prior.scale))
    se_mean = np.sqrt(want_var / PRIOR_DRAWS)
    se_var = np.sqrt(np.var((ref - want_mean) ** 2, axis=0) / PRIOR_DRAWS)
    assert np.all(np.abs(got_mean - want_mean) < 4 * se_mean), (got_mean, want_mean, se_mean)
    assert np.all(np.abs(got_var - want_var) < 4 * se_var), (got_var, want_var, se_var)
    np.testing.assert_array_equal(prior.log_scale, [False] + [True] * (k - 1) + [False])
    # the other variable keeps its moments: N(0, 2)
    assert abs(prior.mean[k]) < 4 * 2.0 / np.sqrt(PRIOR_DRAWS)


def test_many_overlapping_cutpoints_fall_back_to_their_order_statistics():
    """Twelve exchangeable cutpoints: 1 draw in 12! is in order, so rejection keeps none in
    `PRIOR_MAX_DRAWS`; their order statistics (the restricted law, the prior being
    exchangeable) give every coordinate finite moments."""
    with pm.Model() as model:
        pm.Normal("c", 0.0, 1.0, shape=12, transform=ORDERED, initval=np.linspace(-2, 2, 12))
    prior = prior_in_y(model, model.value_vars, model.initial_point(), None)
    assert np.all(np.isfinite(prior.var)) and np.all(prior.var > 0)
    z = np.sort(np.random.default_rng(0).normal(size=(200_000, 12)), axis=1)
    ref = np.column_stack([z[:, 0], np.log(np.diff(z, axis=1))])
    se = np.sqrt(ref.var(axis=0) / PRIOR_DRAWS)
    assert np.all(np.abs(prior.mean - ref.mean(axis=0)) < 4 * se)


def _ordinal_data(n: int, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 2))
    eta = x @ np.array([1.0, -0.5])
    cuts = np.array([-2.5, -0.5, 0.5, 2.5])
    p_le = 1 / (1 + np.exp(-(cuts[None, :] - eta[:, None])))
    u = rng.uniform(size=(n, 1))
    return x, (u > p_le).sum(axis=1)


def test_a_noise_dominated_ordinal_run_is_finite_and_no_wider_than_its_prior():
    """End to end: an ordered-logistic regression (four cutpoints, two rare end categories) on
    200 records at epsilon 0.1, the one-shot strategy. Every draw is finite, and no
    coordinate of the ordered transform (the first cutpoint, the log gaps) has a spread
    beyond `PRIOR_WIDE_SDS` times its prior's spread about the draws' mean (a prior-wide
    coordinate's interval holds the prior's mean +- 2 `PRIOR_WIDE_SDS` prior sds,
    `pymc_dp.auto.oneshot.centre_prior_wide`; the restricted prior's moments from
    1e6 numpy draws; the sample sd's error ``sd / sqrt(2 k)`` and the prior variance's
    ``sqrt(2 / PRIOR_DRAWS)`` allowed). Before the fix the log gaps had no prior moments:
    the same run drew cutpoints of 1e17, the first cutpoint's sd 23.6 against its prior's
    0.93, and the last two gaps overflowed (0 in floating point)."""
    x, y = _ordinal_data(200)
    mu = np.array([-3.0, -1.0, 1.0, 3.0])
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 2.0, shape=2)
        cut = pm.Normal("cut", mu=mu, sigma=1.0, shape=4, transform=ORDERED, initval=mu)
        pm.OrderedLogistic("y", eta=pm.math.dot(x, b), cutpoints=cut, observed=y, compute_p=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pymc_dp.sample(
            step=None, epsilon=0.1, delta=1e-6, random_seed=2, chains=2, model=model,
            data_bounds={"y": (0, 4)}, auto_kwargs={"method": "laplace"},
            progressbar=False,
        )  # fmt: skip
    c = idata.posterior["cut"].values.reshape(-1, 4)
    assert np.all(np.isfinite(c)) and np.all(np.isfinite(idata.posterior["b"].values))
    assert np.all(np.diff(c, axis=1) > 0)
    ys = np.column_stack([c[:, 0], np.log(np.diff(c, axis=1))])
    ref = _reference(mu)
    pmean, psd = ref.mean(axis=0), ref.std(axis=0)
    k = ys.shape[0]
    spread = np.sqrt(psd**2 * (1 + 4 * np.sqrt(2 / PRIOR_DRAWS)) + (ys.mean(axis=0) - pmean) ** 2)
    bound = PRIOR_WIDE_SDS * spread * (1 + 4 / np.sqrt(2 * k))
    assert np.all(ys.std(axis=0) <= bound), (ys.std(axis=0), spread)


def test_draws_at_a_transforms_edge_leave_the_others_their_moments():
    """A ``Beta(0.1, 0.1)``'s logit and a ``Dirichlet(0.05)``'s simplex coordinates are
    infinite at the draws that round to 0 or 1 (1.1 % and 8.4 % of the draws): those draws
    are rejected, and every coordinate gets finite moments (before, each such coordinate had
    none: no trust region and no cap). The other variables keep theirs: ``Normal(1, 2)``'s
    mean and variance within 4 Monte Carlo standard errors."""
    with pm.Model() as model:
        pm.Beta("p", 0.1, 0.1)
        pm.Dirichlet("w", a=np.full(3, 0.05))
        pm.Normal("a", 1.0, 2.0)
    prior = prior_in_y(model, model.value_vars, model.initial_point(), None)
    assert np.all(np.isfinite(prior.var)) and np.all(prior.var > 0)
    assert np.all(np.isfinite(prior.scale))
    n = PRIOR_DRAWS
    assert abs(prior.mean[-1] - 1.0) < 4 * 2.0 / np.sqrt(n)
    assert abs(prior.var[-1] - 4.0) < 4 * 4.0 * np.sqrt(2.0 / n)
