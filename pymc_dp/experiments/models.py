"""The source papers' experiment models, each with an exact (or cached) reference sampler.

Every constructor returns an `ExperimentModel`: the PyMC model (data in ``pm.Data``,
one row per record), the true parameter, the data, and a function drawing reference
posterior samples. The reference samplers read the data WITHOUT privacy: they exist only to
score the private samplers and must never be published as a result.

References
----------
.. [1] Räisä, O., Koskela, A. and Honkela, A. Differentially Private Hamiltonian Monte
   Carlo. Sec. 4 (banana and 10-d Gaussian models). [DPHMC]
.. [2] Räisä, O. (2021). Differentially Private Markov Chain Monte Carlo. MSc thesis,
   Definition 8 and Theorem 5 (d-dimensional tempered banana posterior). [Raisa2021]
.. [3] Zhang, W. and Zhang, R. DP-Fast MH, ICML 2023, Sec. 6.1 (truncated Gaussian mixture).
   [ZhangZhang2023]
.. [4] Fair, R. C. (1978). A theory of extramarital affairs. J. Political Economy 86.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pymc as pm
import pytensor.tensor as pt

__all__ = [
    "ExperimentModel",
    "MODELS",
    "banana",
    "banana_reference",
    "correlated_gaussian",
    "gaussian_mixture",
    "logistic_regression",
    "posterior_matrix",
]


@dataclass
class ExperimentModel:
    """One experiment: a PyMC model, its data, the true parameter and a reference sampler.

    Attributes
    ----------
    name : str
        Registry name (``"banana"``, ``"gaussian"``, ``"mixture"``, ``"logistic"``).
    model : pymc.Model
        The model; the sampled parameters are ``var_names`` (flattened in that order).
    var_names : list of str
        Free variables, in the order of the flat parameter vector used by the metrics.
    true_theta : numpy.ndarray
        The parameter the data were generated from (flat), or the reference posterior mean
        when there is no true parameter (real data); chains start around it.
    data : numpy.ndarray or tuple
        The (private) data.
    reference : callable
        ``reference(m, rng)`` returns ``m`` posterior draws, shape ``(m, d)`` (NON-PRIVATE).
    n : int
        Number of records.
    info : dict
        Data-free settings of the model (for the output table).
    """

    name: str
    model: pm.Model
    var_names: list[str]
    true_theta: np.ndarray
    data: object
    reference: Callable[[int, np.random.Generator], np.ndarray]
    n: int
    info: dict = field(default_factory=dict)

    @property
    def dim(self) -> int:
        return int(np.size(self.true_theta))

    def reference_sd(self, m: int = 4000, seed: int = 12345) -> np.ndarray:
        """Componentwise posterior standard deviations from ``m`` reference draws."""
        return self.reference(m, np.random.default_rng(seed)).std(axis=0, ddof=1)


def posterior_matrix(idata, var_names: list[str]) -> np.ndarray:
    """Posterior draws as an array of shape ``(chain, draw, d)`` in ``var_names`` order."""
    parts = []
    for name in var_names:
        a = np.asarray(idata["posterior"][name].values, dtype=float)
        parts.append(a.reshape(a.shape[0], a.shape[1], -1))
    return np.concatenate(parts, axis=2)


def _check_int(name: str, value, minimum: int) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}") from None
    if v != value or v < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}; got {value!r}")
    return v


def _check_pos(name: str, value) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}") from None
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{name} must be a finite number > 0; got {value!r}")
    return v


# -- banana (DP-HMC paper Sec. 4; thesis Theorem 5) ---------------------------------------------


def banana_reference(
    xbar: np.ndarray,
    n: int,
    *,
    a: float,
    sigma_sq: np.ndarray,
    prior_var: float,
    tempering: float = 1.0,
) -> Callable[[int, np.random.Generator], np.ndarray]:
    r"""Exact sampler of the tempered banana posterior (thesis Theorem 5, with b = m = 0).

    The posterior is $\mathrm{Ban}(\mu, \Sigma, a)$: $\theta = g(Y)$,
    $Y \sim N(\mu, \Sigma)$, $g(y) = (y_1, y_2 - a y_1^2, y_3, \dots, y_d)$, with
    $\mu_i = T n \tau_i \bar x_i / (T n \tau_i + \tau_0)$ and
    $\Sigma = \mathrm{diag}(1 / (T n \tau_i + \tau_0))$, $\tau_i = 1/\sigma_i^2$,
    $\tau_0 = 1/\sigma_0^2$.

    Parameters
    ----------
    xbar : numpy.ndarray
        Column means of the data, length d.
    n : int
        Number of records.
    a : float
        Curvature of the banana.
    sigma_sq : numpy.ndarray
        Per-coordinate record variances, length d.
    prior_var : float
        Prior variance of every coordinate.
    tempering : float
        Likelihood temperature.

    Returns
    -------
    callable
        ``sample(m, rng) -> (m, d)`` array of exact posterior draws.
    """
    xbar = np.asarray(xbar, dtype=float)
    prec = tempering * n / np.asarray(sigma_sq, dtype=float) + 1.0 / prior_var
    mu = tempering * n / np.asarray(sigma_sq, dtype=float) * xbar / prec
    sd = 1.0 / np.sqrt(prec)

    def sample(m: int, rng: np.random.Generator) -> np.ndarray:
        y = mu + sd * rng.standard_normal((int(m), mu.size))
        y[:, 1] -= a * y[:, 0] ** 2
        return y

    return sample


def banana(
    n: int = 100_000,
    seed: int = 0,
    *,
    a: float = 20.0,
    sigma1_sq: float = 2000.0,
    sigma2_sq: float = 2500.0,
    prior_var: float = 1000.0,
    theta: tuple[float, ...] = (0.0, 3.0),
    dim: int = 2,
    tempering: float = 1.0,
    sigma_rest_sq: float = 1.0,
) -> ExperimentModel:
    r"""The banana model of the DP-HMC paper (Sec. 4), d-dimensional and tempered (thesis Thm 5).

    $$
    \theta \sim \mathrm{Ban}(0, \sigma_0^2 I, a), \quad
    x_{i1} \sim N(\theta_1, \sigma_1^2), \quad
    x_{i2} \sim N(\theta_2 + a\theta_1^2, \sigma_2^2), \quad
    x_{ij} \sim N(\theta_j, \sigma_j^2)\ (j \ge 3).
    $$

    The prior $\mathrm{Ban}(0, \sigma_0^2 I, a)$ is the law of
    $(y_1, y_2 - a y_1^2, y_3, \dots)$ with $y \sim N(0, \sigma_0^2 I)$; the map
    has unit Jacobian, so it is written as the plain densities
    $\theta_1 \sim N(0, \sigma_0^2)$, $\theta_2 \mid \theta_1 \sim
    N(-a\theta_1^2, \sigma_0^2)$ on the paper's parameters (the samplers move in the
    paper's $\theta$ space). The likelihood is tempered by ``tempering`` (the DP
    steps' ``tempering`` option must be given the same value; the reference uses it).

    Parameters
    ----------
    n : int
        Records (paper: 100 000).
    seed : int
        Seed of the simulated data.
    a : float
        Curvature of the banana (paper: 20).
    sigma1_sq : float
        Record variance of the first coordinate (paper: 2000).
    sigma2_sq : float
        Record variance of the second coordinate (paper: 2500).
    prior_var : float
        Prior variance (paper: 1000).
    theta : tuple of float
        True parameter of the first two coordinates (paper: (0, 3)); further coordinates 0.
    dim : int
        d >= 2 (thesis Theorem 5).
    tempering : float
        ``T`` of the reference posterior.
    sigma_rest_sq : float
        $\sigma_j^2$ of the coordinates ``j >= 3``.

    Returns
    -------
    ExperimentModel
    """
    n = _check_int("n", n, 2)
    dim = _check_int("dim", dim, 2)
    a = float(a)
    for name, v in (
        ("sigma1_sq", sigma1_sq),
        ("sigma2_sq", sigma2_sq),
        ("prior_var", prior_var),
        ("tempering", tempering),
        ("sigma_rest_sq", sigma_rest_sq),
    ):
        _check_pos(name, v)
    if len(theta) != 2:
        raise ValueError(f"theta must be the 2 leading coordinates (theta1, theta2); got {theta}")
    true = np.zeros(dim)
    true[:2] = theta
    sigma_sq = np.full(dim, float(sigma_rest_sq))
    sigma_sq[:2] = (sigma1_sq, sigma2_sq)
    rng = np.random.default_rng(seed)
    loc = true.copy()
    loc[1] = true[1] + a * true[0] ** 2
    x = loc + np.sqrt(sigma_sq) * rng.standard_normal((n, dim))
    s0 = float(np.sqrt(prior_var))
    with pm.Model() as model:
        theta1 = pm.Normal("theta1", 0.0, s0)
        theta2 = pm.Normal("theta2", -a * theta1**2, s0)
        parts = [theta1, theta2 + a * theta1**2]
        names = ["theta1", "theta2"]
        if dim > 2:
            rest = pm.Normal("theta_rest", 0.0, s0, shape=dim - 2)
            parts.append(rest)
            names.append("theta_rest")
            mu = pt.concatenate([pt.stack(parts[:2]), rest])
        else:
            mu = pt.stack(parts)
        pm.Normal("x", mu=mu, sigma=np.sqrt(sigma_sq), observed=pm.Data("x_obs", x))
    ref = banana_reference(
        x.mean(axis=0), n, a=a, sigma_sq=sigma_sq, prior_var=prior_var, tempering=tempering
    )
    return ExperimentModel(
        name="banana",
        model=model,
        var_names=names,
        true_theta=true,
        data=x,
        reference=ref,
        n=n,
        info={"a": a, "dim": dim, "tempering": tempering, "prior_var": prior_var},
    )


# -- 10-d correlated Gaussian (DP-HMC paper Sec. 4) ---------------------------------------------


def correlated_gaussian(n: int = 100_000, dim: int = 10, seed: int = 0) -> ExperimentModel:
    r"""The correlated Gaussian model of the DP-HMC paper (Sec. 4).

    $\theta \sim N(0, 100^2 I)$, $x_i \sim N(\theta, \Sigma)$,
    $\Sigma = Q\,\mathrm{diag}(\lambda)\,Q^T$, $\lambda_j \sim \mathrm{Gamma}(0.5,
    1)$, ``Q`` from the QR decomposition of a matrix of Uniform(0, 1) entries; true mean
    $(0, 3, 0, \dots, 0)$. ``Sigma`` is part of the (public) model.

    The likelihood is written on whitened records $z_i = L^{-1} x_i$
    ($\Sigma = L L^T$, a fixed public linear map of each record):
    $z_i \sim N(L^{-1}\theta, I)$. Each record's log-likelihood differs from
    $\log N(x_i | \theta, \Sigma)$ by a constant, so ratios, gradients and the posterior
    are the same, while the per-record functions avoid a Cholesky factorisation per record.

    The posterior is Gaussian (conjugate): precision $P = 10^{-4} I + n\Sigma^{-1}$,
    mean $P^{-1} n \Sigma^{-1} \bar x$.

    Parameters
    ----------
    n : int
        Records (paper: 100 000).
    dim : int
        Dimension (paper: 10).
    seed : int
        Seed of ``Sigma`` and of the data.

    Returns
    -------
    ExperimentModel
    """
    n = _check_int("n", n, 2)
    dim = _check_int("dim", dim, 2)
    rng = np.random.default_rng(seed)
    lam = rng.gamma(0.5, 1.0, size=dim)
    q, _ = np.linalg.qr(rng.uniform(size=(dim, dim)))
    cov = q @ np.diag(lam) @ q.T
    cov = 0.5 * (cov + cov.T)
    chol = np.linalg.cholesky(cov)
    true = np.zeros(dim)
    true[1] = 3.0
    x = true + rng.standard_normal((n, dim)) @ chol.T
    linv = np.linalg.inv(chol)
    z = x @ linv.T
    prior_sd = 100.0
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, prior_sd, shape=dim)
        pm.Normal("z", mu=pt.dot(linv, theta), sigma=1.0, observed=pm.Data("z_obs", z))
    cov_inv = np.linalg.inv(cov)
    post_prec = np.eye(dim) / prior_sd**2 + n * cov_inv
    post_cov = np.linalg.inv(post_prec)
    post_cov = 0.5 * (post_cov + post_cov.T)
    post_mean = post_cov @ (n * cov_inv @ x.mean(axis=0))
    post_chol = np.linalg.cholesky(post_cov)

    def reference(m: int, rng: np.random.Generator) -> np.ndarray:
        return post_mean + rng.standard_normal((int(m), dim)) @ post_chol.T

    return ExperimentModel(
        name="gaussian",
        model=model,
        var_names=["theta"],
        true_theta=true,
        data=x,
        reference=reference,
        n=n,
        info={
            "dim": dim,
            "eigenvalues": lam.tolist(),
            # the exact posterior (NON-PRIVATE; for checks only)
            "posterior_mean": post_mean,
            "posterior_cov": post_cov,
        },
    )


# -- truncated Gaussian mixture (DP-Fast MH paper Sec. 6.1) -------------------------------------

MIXTURE_SIGMA_SQ = 2.0
MIXTURE_TRUNCATION = 3.0
MIXTURE_PRIOR_SD = 5.0


def _grid_sampler(
    g1: np.ndarray, g2: np.ndarray, p: np.ndarray
) -> Callable[[int, np.random.Generator], np.ndarray]:
    """Draws from a 2-D midpoint-rule grid density: a cell by its mass, uniform within it."""
    w = (p / p.sum()).ravel()
    h1, h2 = g1[1] - g1[0], g2[1] - g2[0]
    i1, i2 = np.meshgrid(np.arange(g1.size), np.arange(g2.size), indexing="ij")
    c1, c2 = g1[i1.ravel()], g2[i2.ravel()]

    def sample(m: int, rng: np.random.Generator) -> np.ndarray:
        k = rng.choice(w.size, size=int(m), p=w)
        u = rng.uniform(-0.5, 0.5, size=(int(m), 2))
        return np.column_stack([c1[k] + h1 * u[:, 0], c2[k] + h2 * u[:, 1]])

    return sample


def _mixture_log_post(
    mid: np.ndarray, counts: np.ndarray, temperature: float, g1: np.ndarray, g2: np.ndarray
) -> np.ndarray:
    t1, t2 = np.meshgrid(g1, g2, indexing="ij")
    lp = -(t1**2 + t2**2) / (2 * MIXTURE_PRIOR_SD**2)
    s2 = 2 * MIXTURE_SIGMA_SQ
    for xi, k in zip(mid, counts, strict=True):
        lp += k / temperature * np.logaddexp(-((xi - t1) ** 2) / s2, -((xi - t1 - t2) ** 2) / s2)
    return lp


def mixture_grid_posterior(
    x: np.ndarray, temperature: float, *, n_grid: int = 251, n_bins: int = 1000
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unnormalised posterior of the mixture on a grid (exact up to the grid; NON-PRIVATE).

    The data are binned (``n_bins`` bins on the truncation interval; the binning error is far
    below the grid resolution) so the cost does not grow with ``n``. A coarse grid over
    ``[-3, 4] x [-5, 5]`` locates the mass (density above ``1e-12`` of its maximum); an
    ``n_grid x n_grid`` grid over that box (padded by two coarse cells) is returned.
    """
    t = MIXTURE_TRUNCATION
    counts, edges = np.histogram(x, bins=int(n_bins), range=(-t, t))
    mid = 0.5 * (edges[1:] + edges[:-1])
    keep = counts > 0
    mid, counts = mid[keep], counts[keep]
    c1, c2 = np.linspace(-3.0, 4.0, 141), np.linspace(-5.0, 5.0, 201)
    lp = _mixture_log_post(mid, counts, temperature, c1, c2)
    i1, i2 = np.nonzero(lp > lp.max() + np.log(1e-12))
    if i1.min() == 0 or i2.min() == 0 or i1.max() == c1.size - 1 or i2.max() == c2.size - 1:
        raise ValueError(
            "the mixture posterior reaches the edge of the reference grid [-3, 4] x [-5, 5]: "
            "the likelihood is too weak (n / temperature too small); raise n or lower "
            "temperature"
        )
    h1, h2 = c1[1] - c1[0], c2[1] - c2[0]
    g1 = np.linspace(c1[i1.min()] - 2 * h1, c1[i1.max()] + 2 * h1, int(n_grid))
    g2 = np.linspace(c2[i2.min()] - 2 * h2, c2[i2.max()] + 2 * h2, int(n_grid))
    lp = _mixture_log_post(mid, counts, temperature, g1, g2)
    return g1, g2, np.exp(lp - lp.max())


def gaussian_mixture(
    n: int = 50_000, seed: int = 0, *, temperature: float = 500.0
) -> ExperimentModel:
    r"""The truncated two-component Gaussian mixture of the DP-Fast MH paper (Sec. 6.1).

    $x_i \sim \tfrac12 N(\theta_1, 2) + \tfrac12 N(\theta_1 + \theta_2, 2)$ truncated
    to ``[-3, 3]``, $\theta = (0, 1)$, likelihood tempered by ``1 / temperature``
    (paper: 500; the steps must be given ``tempering = 1 / temperature``, see ``info``);
    prior $N(0, 5^2)$ per coordinate (the paper's flat prior gives an improper
    posterior). Reference: exact posterior on a grid (`mixture_grid_posterior`),
    sampled cell by mass with a uniform position within the cell (as
    ``examples/fastmh_mixture.py`` and ``tests/step_methods/test_fastmh.py``).

    Parameters
    ----------
    n : int
        Records (paper: 50 000).
    seed : int
    temperature : float

    Returns
    -------
    ExperimentModel
    """
    n = _check_int("n", n, 2)
    temperature = _check_pos("temperature", temperature)
    rng = np.random.default_rng(seed)
    x = np.empty(0)
    while x.size < n:
        comp = rng.integers(2, size=2 * n)
        draw = rng.normal(np.where(comp == 0, 0.0, 1.0), np.sqrt(MIXTURE_SIGMA_SQ))
        x = np.concatenate([x, draw[np.abs(draw) <= MIXTURE_TRUNCATION]])
    x = x[:n]
    with pm.Model() as model:
        theta = pm.Normal("theta", 0.0, MIXTURE_PRIOR_SD, shape=2)
        pm.NormalMixture(
            "x",
            w=[0.5, 0.5],
            mu=pt.stack([theta[0], theta[0] + theta[1]]),
            sigma=np.sqrt(MIXTURE_SIGMA_SQ),
            observed=pm.Data("x_obs", x),
        )
    g1, g2, p = mixture_grid_posterior(x, temperature)
    t = MIXTURE_TRUNCATION
    # Paper App. E.1: c_i = sqrt(((2|x_i| + 9) / s^2)^2 + ((|x_i| + 6) / s^2)^2) at the
    # public truncation bound |x| <= 3, times the temperature: data-free.
    c = float(np.hypot((2 * t + 9) / MIXTURE_SIGMA_SQ, (t + 6) / MIXTURE_SIGMA_SQ)) / temperature
    return ExperimentModel(
        name="mixture",
        model=model,
        var_names=["theta"],
        true_theta=np.array([0.0, 1.0]),
        data=x,
        reference=_grid_sampler(g1, g2, p),
        n=n,
        info={"tempering": 1.0 / temperature, "clip_bound": c},
    )


# -- logistic regression on the Fair affairs survey ---------------------------------------------

#: Answer scales of the questionnaire (fixed in advance; as examples/_data.py).
FAIR_RANGES = {
    "rate_marriage": (1.0, 5.0),
    "age": (17.5, 42.0),
    "yrs_married": (0.5, 23.0),
    "religious": (1.0, 4.0),
    "educ": (9.0, 20.0),
}
#: Lipschitz constant of each record's log-likelihood in (intercept, beta): ||(1, x_i)||.
FAIR_LIPSCHITZ = float(np.sqrt(1 + len(FAIR_RANGES)))


def load_fair() -> tuple[np.ndarray, np.ndarray]:
    """``(X, y)`` of Fair's affairs survey (statsmodels), features mapped to [-1, 1] by the
    questionnaire's fixed ranges (a per-record, data-free map; as ``examples/_data.py``)."""
    try:
        from statsmodels.datasets import fair
    except ImportError as err:  # pragma: no cover - statsmodels is a test/examples extra
        raise ImportError(
            "the logistic-regression experiment needs statsmodels (pip install statsmodels)"
        ) from err
    data = fair.load_pandas().data
    cols = []
    for f, (lo, hi) in FAIR_RANGES.items():
        v = np.clip(data[f].to_numpy(dtype=float), lo, hi)
        cols.append(2.0 * (v - lo) / (hi - lo) - 1.0)
    return np.column_stack(cols), (data["affairs"].to_numpy() > 0).astype(np.int64)


def _logistic_pymc_model(x: np.ndarray, y: np.ndarray) -> pm.Model:
    # numpy arrays as in examples/_data.py (a Bernoulli observed through pm.Data is wrapped
    # in a cast that hides its record axis from pymc_dp)
    with pm.Model() as model:
        intercept = pm.Normal("intercept", 0.0, 2.5)
        beta = pm.Normal("beta", 0.0, 2.5, shape=x.shape[1])
        pm.Bernoulli("y", logit_p=intercept + pm.math.dot(x, beta), observed=y)
    return model


def default_cache_dir() -> Path:
    """``$PYMC_DP_CACHE`` or ``~/.cache/pymc_dp``."""
    import os

    return Path(os.environ.get("PYMC_DP_CACHE", Path.home() / ".cache" / "pymc_dp"))


def logistic_regression(
    n: int | None = None,
    seed: int = 0,
    *,
    reference_draws: int = 2000,
    reference_tune: int = 1000,
    cache_dir: str | Path | None = None,
) -> ExperimentModel:
    """Bayesian logistic regression on Fair's affairs survey (6366 records, 5 features).

    Priors $N(0, 2.5^2)$ on the intercept and coefficients. Reference: PyMC NUTS
    (4 chains of ``reference_draws / 4`` draws after ``reference_tune`` tuning steps,
    NON-PRIVATE), cached
    as ``.npy`` under ``cache_dir`` keyed by a hash of the data and settings. ``true_theta``
    is the reference posterior mean (real data have no true parameter).

    Parameters
    ----------
    n : int, optional
        Use the first ``n`` records (default: all 6366).
    seed : int
        Seed of the reference NUTS run.
    reference_draws : int
        Total reference draws.
    reference_tune : int
        NUTS warmup per chain of the reference.
    cache_dir : path, optional
        Default `default_cache_dir`.

    Returns
    -------
    ExperimentModel
    """
    x, y = load_fair()
    if n is not None:
        n = _check_int("n", n, 2)
        x, y = x[:n], y[:n]
    reference_draws = _check_int("reference_draws", reference_draws, 4)
    reference_tune = _check_int("reference_tune", reference_tune, 0)
    model = _logistic_pymc_model(x, y)
    key = hashlib.sha256(
        x.tobytes() + y.tobytes() + json.dumps([seed, reference_draws, reference_tune]).encode()
    ).hexdigest()[:16]
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = cache / f"logistic_reference_{key}.npy"
    if path.exists():
        draws = np.load(path)
    else:
        with model:
            idata = pm.sample(
                draws=reference_draws // 4,
                tune=reference_tune,
                chains=4,
                cores=1,
                random_seed=seed,
                progressbar=False,
                compute_convergence_checks=False,
            )
        draws = posterior_matrix(idata, ["intercept", "beta"]).reshape(-1, x.shape[1] + 1)
        cache.mkdir(parents=True, exist_ok=True)
        np.save(path, draws)

    def reference(m: int, rng: np.random.Generator) -> np.ndarray:
        idx = rng.choice(draws.shape[0], size=int(m), replace=int(m) > draws.shape[0])
        return draws[idx]

    return ExperimentModel(
        name="logistic",
        model=model,
        var_names=["intercept", "beta"],
        true_theta=draws.mean(axis=0),
        data=(x, y),
        reference=reference,
        n=int(x.shape[0]),
        info={"clip_bound": FAIR_LIPSCHITZ},
    )


#: name -> constructor(n, seed) of the experiment models.
MODELS: dict[str, Callable[..., ExperimentModel]] = {
    "banana": banana,
    "gaussian": correlated_gaussian,
    "mixture": gaussian_mixture,
    "logistic": logistic_regression,
}
