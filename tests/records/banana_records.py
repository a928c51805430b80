"""The banana of the DP-HMC paper's experiment (issue 28's benchmark model) for the record
tests: two observed columns, ``x1 ~ N(theta_0, V1)`` and ``x2 ~ N(theta_1 + A theta_0^2,
V2)``, its data and its per-record log-likelihoods and gradients by hand (numpy), shared by
`test_affine_blocks.py` and `test_fused_two_point.py`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pymc as pm

V1, V2, A = 2000.0, 2500.0, 20.0


def banana_data(
    n: int, seed: int, order: str = "given", bad: Sequence[tuple[int, int, float]] = ()
) -> tuple[np.ndarray, np.ndarray]:
    """``n`` records; ``bad`` sets entries ``(column, record, value)`` (e.g. 1e300: a record
    whose gradient or ratio is not finite, counted as clipped); ``order`` is ``"given"``,
    ``"reversed"`` or ``"shuffled"`` (a fixed permutation)."""
    rng = np.random.default_rng(seed)
    cols = [rng.normal(0.0, np.sqrt(V1), size=n), rng.normal(3.0, np.sqrt(V2), size=n)]
    for column, record, value in bad:
        cols[column][record] = value
    x1, x2 = cols
    if order == "reversed":
        x1, x2 = x1[::-1].copy(), x2[::-1].copy()
    elif order == "shuffled":
        p = np.random.default_rng(9).permutation(n)
        x1, x2 = x1[p], x2[p]
    return x1, x2


def banana_model(x1: np.ndarray, x2: np.ndarray) -> pm.Model:
    with pm.Model() as m:
        theta = pm.Normal("theta", 0.0, np.sqrt(1000.0), shape=2)
        pm.Normal("x1", theta[0], np.sqrt(V1), observed=x1)
        pm.Normal("x2", theta[1] + A * theta[0] ** 2, np.sqrt(V2), observed=x2)
    return m


def banana_records(q: np.ndarray, x1: np.ndarray, x2: np.ndarray):
    """Per-record log-likelihoods and gradients of the banana at ``q``, by hand."""
    with np.errstate(over="ignore", invalid="ignore"):
        e1, e2 = x1 - q[0], x2 - q[1] - A * q[0] ** 2
        ll = -0.5 * np.log(2 * np.pi * V1) - e1**2 / (2 * V1)
        ll = ll - 0.5 * np.log(2 * np.pi * V2) - e2**2 / (2 * V2)
        grads = np.stack([e1 / V1 + 2 * A * q[0] * e2 / V2, e2 / V2], axis=1)
    return ll, grads
