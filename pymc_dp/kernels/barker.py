r"""The DP Barker test and its subsampled RDP accounting (pure numpy; dp-accounting conversion).

Heikkilä, Jälkö, Dikmen, Honkela (2019), *Differentially private Markov chain Monte Carlo*,
NeurIPS; Räisä (2021), MSc thesis, Sec. 3.2, Algorithm 2, Theorem 8 [Raisa2021].

The Barker test accepts when $\lambda + V_{log} > 0$, $V_{log} \sim$ Logistic(0, 1),
i.e. with probability $\mathrm{sigmoid}(\lambda)$ (Barker 1965). DP Barker replaces
$\lambda$ by a minibatch estimate, adds Gaussian noise so that estimate plus noise has
total variance 2, and a correction $V_{corr}$ such that $N(0, 2) + V_{corr}$ is
logistic (Seita et al. 2017). $V_{corr}$ has no closed form: it is approximated by a
Gaussian mixture fitted once by ``scripts/fit_barker_correction.py`` and shipped as
``pymc_dp/data/barker_correction.npz``, with the measured error
$\sup_x |P(N(0,2) + \hat V_{corr} < x) - \mathrm{sigmoid}(x)|$, which bounds the error
of every acceptance probability.
"""

from __future__ import annotations

import functools
import importlib.resources
import math

import numpy as np

# The accounting moved to pymc_dp.accounting.barker; these names stay importable from here.
from pymc_dp.accounting.barker import (
    DPBarkerEvent,
    barker_base_rdp,
    barker_rdp,
    calibrate_barker_batch_size,
    dp_barker_epsilon,
    wbk_subsampled_rdp,
)

__all__ = [
    "BARKER_NOISE_VARIANCE",
    "DPBarkerEvent",
    "barker_base_rdp",
    "barker_clip_bound",
    "barker_correction",
    "barker_log_test",
    "barker_rdp",
    "calibrate_barker_batch_size",
    "dp_barker_epsilon",
    "sample_correction",
    "wbk_subsampled_rdp",
]

#: Total Gaussian variance of the test (minibatch error + added noise); Theorem 8 assumes it.
BARKER_NOISE_VARIANCE = 2.0


@functools.cache
def barker_correction() -> dict[str, np.ndarray | float]:
    """The shipped Gaussian-mixture approximation of V_corr (weights, means, sds, error)."""
    ref = importlib.resources.files("pymc_dp") / "data" / "barker_correction.npz"
    with importlib.resources.as_file(ref) as path, np.load(path) as d:
        out = {k: np.array(d[k]) for k in ("weights", "means", "sds")}
        out["noise_variance"] = float(d["noise_variance"])
        out["sup_cdf_error"] = float(d["sup_cdf_error"])
    if out["noise_variance"] != BARKER_NOISE_VARIANCE:  # pragma: no cover - shipped file
        raise RuntimeError("barker_correction.npz was fitted for another noise variance")
    return out


def sample_correction(rng: np.random.Generator, size=None):
    """Draws of the approximate correction variable $\\hat V_{corr}$ (mixture)."""
    c = barker_correction()
    k = rng.choice(c["weights"].size, size=size, p=c["weights"])
    z = rng.normal(size=size)
    return c["means"][k] + c["sds"][k] * z


def barker_clip_bound(n: int, batch_size: int) -> float:
    r"""Per-record bound $|T r_j| \le \sqrt{b}/n$ of thesis Theorem 8 (tempered ratios)."""
    return math.sqrt(batch_size) / n


def barker_log_test(lam, batch_var, log_prior_ratio: float, rng: np.random.Generator):
    r"""Algorithm 2's decision: $\hat\lambda + \log\frac{p(\theta')}{p(\theta)} + s + c > 0$.

    $s \sim N(0, 2 - \sigma_b^2)$ and $c \sim \hat V_{corr}$. Clipping to
    `barker_clip_bound` guarantees $\sigma_b^2 \le 1$ (so the variance is at least 1
    whatever the data: no data-dependent failure). Returns the accept decision(s);
    elementwise on arrays.
    """
    lam = np.asarray(lam, dtype=float)
    var = np.asarray(batch_var, dtype=float)
    s = rng.normal(size=lam.shape) * np.sqrt(np.maximum(BARKER_NOISE_VARIANCE - var, 0.0))
    c = sample_correction(rng, size=lam.shape if lam.shape else None)
    out = lam + log_prior_ratio + s + c > 0
    return out if np.shape(out) else bool(out)
