"""Steps on an indexed model run in worker processes started by spawn and forkserver.

PyMC ships the step to each worker with cloudpickle (the start methods of macOS, Windows
and, from Python 3.14, of every platform): the step, with its compiled indexed gradient
route, must survive the round trip and give the same released sums (issue 29, item 7).
"""

from __future__ import annotations

import warnings

import cloudpickle
import numpy as np
import pymc as pm
import pytest

import pymc_dp

SAMPLE = dict(progressbar=False, compute_convergence_checks=False)
RNG = np.random.default_rng(0)
G, N = 4, 120
GROUP = RNG.integers(0, G, N)
X = RNG.normal(size=N)
Y = RNG.normal(0.3 + 0.5 * X, 1.0)


def _indexed_model():
    with pm.Model() as model:
        b = pm.Normal("b", 0, 1)
        a = pm.Normal("a", 0, 1, shape=G)
        pm.Normal("y", a[GROUP] + b * X, 1, observed=Y)
    return model


HMC = {"grad_clip_bound": 3.0, "llr_clip_bound": 3.0, "n_leapfrog": 2, "step_size": 0.05}


def test_a_step_with_its_indexed_route_compiled_survives_cloudpickle():
    with _indexed_model():
        step = pymc_dp.DPHMC(grad_noise_multiplier=2.0, llr_noise_multiplier=2.0, **HMC)
    q = np.linspace(-0.5, 0.5, step._fns.ndim)
    want = step._fns.clipped_grad_sum(q, 1.0)[0]
    assert step._fns.gradient_route == "sorted"
    back = cloudpickle.loads(cloudpickle.dumps(step))
    np.testing.assert_array_equal(back._fns.clipped_grad_sum(q, 1.0)[0], want)


@pytest.mark.slow
@pytest.mark.parametrize("mp_ctx", ["spawn", "forkserver"])
def test_parallel_chains_with_spawn_and_forkserver_on_an_indexed_model(mp_ctx):
    with _indexed_model(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Only .* samples per chain")
        idata = pymc_dp.sample(
            4, tune=0, chains=2, cores=2, mp_ctx=mp_ctx, step=pymc_dp.DPHMC, epsilon=2.0,
            delta=1e-5, step_kwargs=HMC, random_seed=1, **SAMPLE,
        )  # fmt: skip
    assert idata["posterior"]["a"].shape[:2] == (2, 4)
    rep = pymc_dp.privacy_report(idata, model=_indexed_model(), attach=False)
    assert rep.chains == 2 and rep.epsilon <= 2.0 * (1 + 1e-9)
