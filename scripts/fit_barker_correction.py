"""Fit the Barker correction distribution V_corr as a Gaussian mixture (run once; deterministic).

The DP Barker test (Heikkilä, Jälkö, Dikmen, Honkela 2019; Räisä 2021, thesis Sec. 3.2,
Algorithm 2) accepts when ``lambda + s + c > 0`` with ``s ~ N(0, S2)`` Gaussian noise of total
variance ``S2 = 2`` (minibatch error plus added noise) and ``c ~ V_corr``, a correction variable
such that ``N(0, S2) + V_corr`` is standard logistic (Seita, Pan, Chen, Canny 2017). V_corr has
no closed form; as in Heikkilä et al. we approximate it by a Gaussian mixture

    V_corr ~ sum_k w_k N(m_k, s_k^2),  so that  N(0, S2) + V_corr ~ sum_k w_k N(m_k, s_k^2 + S2),

fitted by least squares of the CDF of the convolution against the logistic CDF on a grid,
symmetric about 0 (pairs +-m_k with equal weights). The fit is judged by the quantity that
matters for the test: the acceptance probability of the approximate test is
``F(lambda) = P(N(0, S2) + V_corr < lambda)`` instead of the exact Barker acceptance
``sigmoid(lambda)``, so the error of every single acceptance decision is at most

    err = sup_x |F(x) - sigmoid(x)|,

which this script measures on a fine grid (step 1e-3 on [-40, 40]; both CDFs are within 1e-17
of 0 or 1 outside) and stores with the mixture in ``pymc_dp/data/barker_correction.npz``.

Usage::

    python scripts/fit_barker_correction.py            # writes pymc_dp/data/barker_correction.npz
    python scripts/fit_barker_correction.py --check    # refits and compares with the stored file
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np
from scipy import optimize, special, stats

#: Total Gaussian variance of the DP Barker test (thesis Theorem 8 assumes sigma^2 = 2).
NOISE_VARIANCE = 2.0
#: Number of symmetric pairs of mixture components (plus one component at 0).
PAIRS = 4
OUT = pathlib.Path(__file__).resolve().parents[1] / "pymc_dp" / "data" / "barker_correction.npz"


def _unpack(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parameters -> (weights, means, sds) of the symmetric mixture (2 PAIRS + 1 components)."""
    logits = p[: PAIRS + 1]
    w = special.softmax(logits)
    m = np.exp(p[PAIRS + 1 : 2 * PAIRS + 1])
    s = np.exp(p[2 * PAIRS + 1 :])
    weights = np.concatenate([[w[0]], w[1:] / 2, w[1:] / 2])
    means = np.concatenate([[0.0], m, -m])
    sds = np.concatenate([s[:1], s[1:], s[1:]])
    return weights, means, sds


def convolved_cdf(x: np.ndarray, weights, means, sds, noise_variance=NOISE_VARIANCE) -> np.ndarray:
    """CDF of ``N(0, noise_variance) + V_corr`` at ``x``."""
    x = np.asarray(x, dtype=float)[..., None]
    sd = np.sqrt(np.asarray(sds) ** 2 + noise_variance)
    return np.sum(np.asarray(weights) * stats.norm.cdf((x - np.asarray(means)) / sd), axis=-1)


def sup_error(weights, means, sds) -> float:
    """``sup_x |P(N(0, 2) + V_corr < x) - sigmoid(x)|`` on a grid of step 1e-3 in [-40, 40]."""
    x = np.linspace(-40.0, 40.0, 80_001)
    return float(np.max(np.abs(convolved_cdf(x, weights, means, sds) - special.expit(x))))


def fit() -> dict[str, np.ndarray]:
    """Least-squares fit of the mixture, refined by a minimax (sup-norm) polish."""
    grid = np.linspace(-20.0, 20.0, 2001)
    target = special.expit(grid)

    def resid(p):
        return convolved_cdf(grid, *_unpack(p)) - target

    # Deterministic start: component sds ~ 0.5, means spread over [0.5, 3.5].
    p0 = np.concatenate(
        [np.zeros(PAIRS + 1), np.log(np.linspace(0.5, 3.5, PAIRS)), np.log(np.full(PAIRS + 1, 0.5))]
    )
    ls = optimize.least_squares(resid, p0, xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=20_000)
    p = ls.x
    # Minimax polish: minimise a smooth approximation of the sup norm (log-sum-exp, sharp).
    for k in (200.0, 2000.0, 20000.0):

        def smooth_sup(q, k=k):
            r = np.abs(resid(q))
            return special.logsumexp(k * r / max(r.max(), 1e-300)) / k * r.max()

        res = optimize.minimize(smooth_sup, p, method="Nelder-Mead", options={
            "maxiter": 20_000, "xatol": 1e-12, "fatol": 1e-16, "adaptive": True,
        })  # fmt: skip
        if sup_error(*_unpack(res.x)) < sup_error(*_unpack(p)):
            p = res.x
    weights, means, sds = _unpack(p)
    return {
        "weights": weights,
        "means": means,
        "sds": sds,
        "noise_variance": np.float64(NOISE_VARIANCE),
        "sup_cdf_error": np.float64(sup_error(weights, means, sds)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="refit and compare with the file")
    args = parser.parse_args(argv)
    res = fit()
    var = float(np.sum(res["weights"] * (res["sds"] ** 2 + res["means"] ** 2)))
    print(f"components: {res['weights'].size}")
    print(f"sup |CDF(N(0, 2) + V_corr) - sigmoid| = {float(res['sup_cdf_error']):.3e}")
    print(f"Var(V_corr) = {var:.6f} (exact: pi^2/3 - 2 = {np.pi**2 / 3 - 2:.6f})")
    if args.check:
        stored = np.load(OUT)
        for key in ("weights", "means", "sds"):
            if not np.allclose(stored[key], res[key], rtol=1e-6, atol=1e-9):
                print(f"stored {key} differ from the refit", file=sys.stderr)
                return 1
        print(f"{OUT} matches the refit")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez(OUT, **res)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
