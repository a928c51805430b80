"""Graph rewrites that did not finish: a negative binomial regression (issue 26's sweep).

On PyTensor 2.38 ``local_greedy_distributor`` (in the GLM route's and the sufficient
statistics' ``canonicalize``) and the rewrites of the declared bounds' Hessian did not
finish in minutes on a negative binomial regression's per-record graphs
(`pymc_dp.records.rewrite.UNSAFE_REWRITES`). The run is made in a subprocess with a time
limit, so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

CODE = textwrap.dedent(
    """
    import warnings
    import numpy as np, pymc as pm
    import pymc_dp
    rng = np.random.default_rng(0)
    X = rng.uniform(-1, 1, size=(400, 4))
    y = rng.negative_binomial(5, 5 / (5 + np.exp(0.5 + X @ [0.3, -0.2, 0.1, 0.0])))
    with pm.Model() as m:
        Xd = pm.Data("X", X)
        a = pm.Normal("a", 0, 3)
        b = pm.Normal("b", 0, 3, shape=4)
        alpha = pm.HalfNormal("alpha", 10)
        pm.NegativeBinomial("y", mu=pm.math.exp(a + Xd @ b), alpha=alpha, observed=y)
    warnings.simplefilter("ignore")
    with m:
        idata = pymc_dp.sample(
            draws=50, epsilon=10, delta=1e-6, chains=1, random_seed=1, progressbar=False,
            compute_convergence_checks=False, data_bounds={"X": (-1, 1), "y": (0, 60)},
        )
    print(idata.attrs["dp_method"])
    """
)


@pytest.mark.slow
def test_a_negative_binomial_regression_is_built_in_minutes_not_hours():
    out = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, timeout=240, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] in ("laplace", "chain", "stats")
