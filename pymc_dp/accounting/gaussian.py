"""Tight accounting for compositions of Gaussian mechanisms.

A Gaussian mechanism with L2 sensitivity ``Delta`` and noise standard deviation
``sigma`` has privacy-loss random variable N(m, 2 m), ``m = Delta^2 / (2 sigma^2)``;
composing Gaussian mechanisms adds the ``m``'s (Sommer et al. 2019). A composition with
total parameter ``mu`` is (epsilon, delta(epsilon))-DP with

    delta(eps) = 1/2 [erfc((eps - mu) / (2 sqrt(mu))) - e^eps erfc((eps + mu) / (2 sqrt(mu)))],

and this ``delta`` is the smallest possible (Räisä et al., Theorem 2.4; Balle & Wang
2018, Theorem 8). This module evaluates that curve stably, inverts it, calibrates noise
to a target (epsilon, delta), and provides the looser zCDP and RDP conversions for
comparison.

All functions are pure numpy/scipy. ``mu`` here is the *total* privacy-loss parameter of
the composition; ``mu`` equals the zCDP parameter ``rho`` of the composition.

References
----------
.. [1] D. M. Sommer, S. Meiser, E. Mohammadi, "Privacy loss classes: the central limit
   theorem in differential privacy", PoPETs 2019(2).
.. [2] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
   Carlo", Theorem 2.4.
.. [3] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential privacy:
   analytical calibration and optimal denoising", ICML 2018.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal, overload

import numpy as np
from scipy import optimize, special

from pymc_dp._validation import check_delta, check_nonnegative, check_positive, check_positive_int

from .calibration import Nudge, calibrate, solve
from .events import GaussianEvent

__all__ = [
    "analytic_gaussian_sigma",
    "calibrate_noise_multiplier",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu_for_epsilon",
    "rdp_epsilon",
    "zcdp_epsilon",
]

_LOG_HALF = math.log(0.5)
# Multiplicative steps used to nudge a numerical solution to the safe side.
_NUDGE = 2.0**-50
_MAX_NUDGES = 200


def _delta_scalar(mu: float, eps: float) -> float:
    """delta(eps) for mu > 0, eps >= 0, without overflow (see `gaussian_delta`)."""
    s = 2.0 * math.sqrt(mu)
    a = (eps - mu) / s
    b = (eps + mu) / s
    # e^eps erfc(b) = e^{-a^2} erfcx(b), since eps - b^2 = -a^2.
    if a >= 0.0:
        out = 0.5 * math.exp(-a * a) * (float(special.erfcx(a)) - float(special.erfcx(b)))
    else:
        out = 0.5 * (math.erfc(a) - math.exp(-a * a) * float(special.erfcx(b)))
    return min(max(out, 0.0), 1.0)


def _log_delta_scalar(mu: float, eps: float) -> float:
    """log delta(eps) for mu > 0, eps >= 0 (``-inf`` where delta underflows to 0)."""
    s = 2.0 * math.sqrt(mu)
    a = (eps - mu) / s
    b = (eps + mu) / s
    if a >= 0.0:
        diff = float(special.erfcx(a)) - float(special.erfcx(b))
        if diff <= 0.0:
            return -math.inf
        return _LOG_HALF - a * a + math.log(diff)
    val = 0.5 * (math.erfc(a) - math.exp(-a * a) * float(special.erfcx(b)))
    if val <= 0.0:
        return -math.inf
    return math.log(min(val, 1.0))


def _check_mu(mu: float) -> float:
    return check_nonnegative(mu, "mu")


@overload
def gaussian_delta(mu: float, epsilon: float) -> float: ...
@overload
def gaussian_delta(mu: float, epsilon: np.ndarray) -> np.ndarray: ...
def gaussian_delta(mu: float, epsilon: float | np.ndarray) -> float | np.ndarray:
    """Tight delta(epsilon) of a Gaussian composition with total parameter ``mu``.

    Parameters
    ----------
    mu : float
        Total privacy-loss parameter, ``sum_i Delta_i^2 / (2 sigma_i^2)``; finite, >= 0.
    epsilon : float or numpy.ndarray
        Epsilon value(s) at which to evaluate delta; finite and >= 0.

    Returns
    -------
    float or numpy.ndarray
        ``delta(epsilon)``, in [0, 1]; a float for scalar ``epsilon``, else an array of
        the same shape. ``mu = 0`` gives 0.

    Raises
    ------
    ValueError
        If ``mu`` is negative or not finite, or any ``epsilon`` is negative or not finite.

    Notes
    -----
    Evaluates (Räisä et al., Theorem 2.4; Sommer et al. 2019)

    ``delta(eps) = 1/2 [erfc(a) - e^eps erfc(b)]``, ``a = (eps - mu) / (2 sqrt(mu))``,
    ``b = (eps + mu) / (2 sqrt(mu))``.

    Because ``eps - b^2 = -a^2``, the second term equals ``e^{-a^2} erfcx(b)`` with the
    scaled complementary error function ``erfcx(x) = e^{x^2} erfc(x)``; for ``a >= 0`` the
    whole expression is ``1/2 e^{-a^2} [erfcx(a) - erfcx(b)]``, a difference of two
    moderate positive numbers (``erfcx`` is decreasing and ``b > a``). Nothing overflows
    for any ``eps``; the result is clipped to [0, 1] against rounding.

    References
    ----------
    .. [1] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    .. [2] D. M. Sommer, S. Meiser, E. Mohammadi, "Privacy loss classes: the central
       limit theorem in differential privacy", PoPETs 2019(2).
    .. [3] B. Balle, Y.-X. Wang, ICML 2018, Theorem 8.
    """
    m = _check_mu(mu)
    scalar = np.ndim(epsilon) == 0
    try:
        eps = np.asarray(epsilon, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"epsilon must be finite real number(s) >= 0; got {epsilon!r}") from None
    if not (np.all(np.isfinite(eps)) and np.all(eps >= 0.0)):
        raise ValueError(f"epsilon must be finite real number(s) >= 0; got {epsilon!r}")
    if m == 0.0:
        out = np.zeros_like(eps)
    else:
        s = 2.0 * math.sqrt(m)
        a = (eps - m) / s
        b = (eps + m) / s
        pos = a >= 0.0
        with np.errstate(over="ignore", under="ignore"):
            gauss = np.exp(-(a * a))
            out = np.where(
                pos,
                0.5 * gauss * (special.erfcx(np.where(pos, a, 0.0)) - special.erfcx(b)),
                0.5 * (special.erfc(a) - gauss * special.erfcx(b)),
            )
        out = np.clip(out, 0.0, 1.0)
    if scalar:
        return float(out)
    return out


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest epsilon >= 0 at which a Gaussian composition with parameter ``mu`` is DP.

    Parameters
    ----------
    mu : float
        Total privacy-loss parameter (see `gaussian_delta`); finite, >= 0.
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    float
        The smallest ``eps >= 0`` with ``gaussian_delta(mu, eps) <= delta``, up to a
        relative error of a few ulps; the returned value always satisfies the inequality
        (it is nudged upward after root finding if needed).

    Raises
    ------
    ValueError
        If ``mu`` is negative or not finite, or ``delta`` is not in (0, 1).

    Notes
    -----
    ``delta(eps)`` is strictly decreasing in ``eps`` (its derivative is
    ``-e^eps Phi(-eps/sqrt(2 mu) - sqrt(mu/2)) < 0``). The root of
    ``log delta(eps) = log delta`` is bracketed by ``[0, mu + 2 sqrt(mu) erfcinv(2 delta)]``
    (at the upper end already the first term of ``delta(eps)`` is ``<= delta``) and found
    with Brent's method in log space, which is robust from ``mu = 1e-8`` to ``mu = 1e4``
    and beyond.

    References
    ----------
    .. [1] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    .. [2] D. M. Sommer, S. Meiser, E. Mohammadi, PoPETs 2019(2).
    """
    m = _check_mu(mu)
    d = check_delta(delta)
    if m == 0.0 or _delta_scalar(m, 0.0) <= d:
        return 0.0
    log_d = math.log(d)
    hi = max(m + 2.0 * math.sqrt(m) * float(special.erfcinv(2.0 * d)), 0.0)
    if hi == 0.0:  # pragma: no cover - delta(0) <= d was handled above
        return 0.0
    for _ in range(_MAX_NUDGES):
        if _log_delta_scalar(m, hi) <= log_d:
            break
        hi = hi * (1.0 + 1e-3) + 1e-300
    root = optimize.brentq(
        lambda e: _log_delta_scalar(m, e) - log_d,
        0.0,
        hi,
        xtol=max(hi * 1e-16, 1e-300),
        rtol=4.0 * np.finfo(float).eps,
        maxiter=500,
    )
    step = max(abs(root), 1e-300) * _NUDGE
    for _ in range(_MAX_NUDGES):
        if _delta_scalar(m, root) <= d:
            return float(root)
        root += step
        step *= 2.0
    return float(hi)  # pragma: no cover - hi satisfies the inequality by construction


def gaussian_mu_for_epsilon(epsilon: float, delta: float) -> float:
    """Largest total ``mu`` whose Gaussian composition is (epsilon, delta)-DP.

    Parameters
    ----------
    epsilon : float
        Target epsilon; finite and > 0.
    delta : float
        Target delta in (0, 1).

    Returns
    -------
    float
        ``mu`` with ``gaussian_delta(mu, epsilon) <= delta`` and
        ``gaussian_epsilon(mu, delta) <= epsilon``, within a few ulps (relative) of the
        largest such value. The result never overshoots: it is checked after root
        finding and nudged down if needed.

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0 or ``delta`` is not in (0, 1).

    Notes
    -----
    For fixed ``eps``, ``delta(eps)`` is increasing in ``mu`` (Gaussian mechanisms with
    larger ``mu`` are less private). The zCDP bound ``eps <= mu + 2 sqrt(mu ln(1/delta))``
    (Bun & Steinke 2016, Prop. 1.3, with ``rho = mu``) gives a valid lower bracket
    ``mu_0 = (sqrt(ln(1/delta) + eps) - sqrt(ln(1/delta)))^2``; the upper bracket is found
    by doubling, and the root is located in ``log mu`` with Brent's method.

    References
    ----------
    .. [1] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    .. [2] M. Bun, T. Steinke, "Concentrated differential privacy: simplifications,
       extensions, and lower bounds", TCC 2016, Proposition 1.3.
    """
    eps = check_positive(epsilon, "epsilon")
    d = check_delta(delta)
    log_d = math.log(d)
    ln_inv = -log_d
    lo = (math.sqrt(ln_inv + eps) - math.sqrt(ln_inv)) ** 2
    lo = max(lo, 1e-300)

    def h(log_mu: float) -> float:
        return _log_delta_scalar(math.exp(log_mu), eps) - log_d

    log_lo = math.log(lo)
    while h(log_lo) > 0.0:  # pragma: no cover - lo is a valid bound; guard rounding
        log_lo -= 1.0
    log_hi = log_lo + 1.0
    while h(log_hi) <= 0.0:
        log_lo = log_hi
        log_hi += 1.0
    root = optimize.brentq(h, log_lo, log_hi, xtol=1e-15, rtol=4.0 * np.finfo(float).eps)
    return solve(
        lambda m: _delta_scalar(m, eps) <= d and gaussian_epsilon(m, d) <= eps,
        Nudge(math.exp(root), 1.0 - _NUDGE, _MAX_NUDGES, "gaussian_mu_for_epsilon"),
    )


def calibrate_noise_multiplier(epsilon: float, delta: float, releases: int) -> float:
    """Smallest noise multiplier for ``releases`` Gaussian releases to meet (epsilon, delta).

    Parameters
    ----------
    epsilon : float
        Target epsilon of the whole composition; finite and > 0.
    delta : float
        Target delta in (0, 1).
    releases : int
        Number of self-composed releases, >= 1.

    Returns
    -------
    float
        Noise multiplier ``z`` (noise std / L2 sensitivity) such that
        ``GaussianEvent(z, releases)`` is (epsilon, delta)-DP by the tight Gaussian
        accountant, and within a few ulps of the smallest such ``z``. The achieved epsilon
        never exceeds the target.

    Raises
    ------
    ValueError
        If ``epsilon`` is not a finite number > 0, ``delta`` is not in (0, 1) or
        ``releases`` is not an integer >= 1.

    Notes
    -----
    ``z = sqrt(releases / (2 mu*))`` with ``mu* = gaussian_mu_for_epsilon(epsilon,
    delta)``; the result is verified with `gaussian_epsilon` on
    ``GaussianEvent(z, releases).mu`` and nudged up if rounding made it overshoot.

    References
    ----------
    .. [1] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    .. [2] B. Balle, Y.-X. Wang, ICML 2018, Theorem 8 and Algorithm 1.
    """
    eps = check_positive(epsilon, "epsilon")
    d = check_delta(delta)
    k = check_positive_int(releases, "releases")
    m = gaussian_mu_for_epsilon(eps, d)
    return calibrate(
        lambda z: gaussian_epsilon(GaussianEvent(z, k).mu, d),
        eps,
        Nudge(math.sqrt(k / (2.0 * m)), 1.0 + _NUDGE, _MAX_NUDGES, "calibrate_noise_multiplier"),
    )


def analytic_gaussian_sigma(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest noise std making one Gaussian release (epsilon, delta)-DP.

    This is the analytic Gaussian mechanism of Balle & Wang (2018, Algorithm 1), valid for
    every ``epsilon > 0``, unlike the classical ``sqrt(2 ln(1.25/delta)) / epsilon``
    (Dwork & Roth 2014, Theorem A.1), which is only valid for ``epsilon < 1`` and is
    larger than necessary there.

    Parameters
    ----------
    epsilon : float
        Target epsilon; finite and > 0.
    delta : float
        Target delta in (0, 1).
    sensitivity : float, default 1.0
        L2 sensitivity of the released query; finite and > 0.

    Returns
    -------
    float
        ``sigma = sensitivity / sqrt(2 mu*)`` with
        ``mu* = gaussian_mu_for_epsilon(epsilon, delta)``. Since ``mu*`` never overshoots,
        ``sigma`` is never below the exact threshold.

    Raises
    ------
    ValueError
        If a parameter is outside the range given above.

    Notes
    -----
    Balle & Wang's Theorem 8 characterises (epsilon, delta)-DP of the Gaussian mechanism by
    ``Phi(Delta/(2 sigma) - eps sigma/Delta) - e^eps Phi(-Delta/(2 sigma) - eps sigma/Delta)
    <= delta``, which with ``mu = Delta^2 / (2 sigma^2)`` is exactly
    ``gaussian_delta(mu, eps) <= delta``; Algorithm 1 solves it for ``sigma``. Inverting
    `gaussian_delta` in ``mu`` is therefore the same computation.

    References
    ----------
    .. [1] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential
       privacy: analytical calibration and optimal denoising", ICML 2018, Theorem 8 and
       Algorithm 1.
    .. [2] C. Dwork, A. Roth, "The algorithmic foundations of differential privacy",
       2014, Theorem A.1.
    """
    eps = check_positive(epsilon, "epsilon")
    d = check_delta(delta)
    sens = check_positive(sensitivity, "sensitivity")
    m = gaussian_mu_for_epsilon(eps, d)
    # Guard the last rounding of the division / sqrt: sigma must not drop below threshold.
    return solve(
        lambda sigma: _delta_scalar(sens**2 / (2.0 * sigma**2), eps) <= d,
        Nudge(sens / math.sqrt(2.0 * m), 1.0 + _NUDGE, _MAX_NUDGES, "analytic_gaussian_sigma"),
    )


# --------------------------------------------------------------------------------------
# zCDP and RDP conversions (looser than the tight accountant above; for comparison)
# --------------------------------------------------------------------------------------

Conversion = Literal["cks2020", "classical"]

# alpha - 1 on a geometric grid: covers mu from ~1e-14 to ~1e6 at about 100 points per decade.
_DEFAULT_ALPHA_MINUS_ONE = np.geomspace(1e-4, 1e8, 1201)


def _rdp_to_dp(rdp: np.ndarray, alpha: np.ndarray, log_delta: float, conversion: str) -> float:
    """Convert RDP curve ``rdp(alpha)`` to epsilon at ``delta``, minimised over ``alpha``."""
    am1 = alpha - 1.0
    if conversion == "classical":
        # Mironov 2017, Proposition 3.
        eps = rdp - log_delta / am1
    else:
        # Canonne, Kamath & Steinke 2020, Proposition 12 (= Balle et al. 2020, Thm 21).
        eps = rdp + np.log1p(-1.0 / alpha) - (log_delta + np.log(alpha)) / am1
    eps = eps[np.isfinite(eps)]
    if eps.size == 0:  # pragma: no cover - the grids always contain a finite point
        return math.inf
    return max(float(np.min(eps)), 0.0)


def _check_conversion(conversion: str) -> str:
    if conversion not in ("cks2020", "classical"):
        raise ValueError(f"conversion must be 'cks2020' or 'classical'; got {conversion!r}")
    return conversion


def zcdp_epsilon(rho: float, delta: float, *, conversion: Conversion = "cks2020") -> float:
    """Epsilon at ``delta`` implied by rho-zCDP.

    A Gaussian mechanism with sensitivity ``Delta`` and noise std ``sigma`` is
    ``Delta^2 / (2 sigma^2)``-zCDP (Bun & Steinke 2016, Prop. 1.6), so a Gaussian
    composition with total privacy-loss parameter ``mu`` is ``rho = mu``-zCDP. For
    Gaussian compositions `gaussian_epsilon` is tight and always smaller.

    Parameters
    ----------
    rho : float
        zCDP parameter; finite and >= 0.
    delta : float
        Target delta in (0, 1).
    conversion : {"cks2020", "classical"}, keyword-only, default "cks2020"
        ``"cks2020"``: Canonne, Kamath & Steinke (2020), Corollary 13,
        ``eps = inf_{alpha > 1} alpha rho + [ln(1/delta) + (alpha - 1) ln(1 - 1/alpha)
        - ln(alpha)] / (alpha - 1)``, minimised numerically over ``alpha``.
        ``"classical"``: Bun & Steinke (2016), Proposition 1.3,
        ``eps = rho + 2 sqrt(rho ln(1/delta))``.

    Returns
    -------
    float
        Epsilon (>= 0). Any ``alpha`` gives a valid bound, so an imperfect minimisation
        can only make the answer conservative.

    Raises
    ------
    ValueError
        If ``rho`` is negative or not finite, ``delta`` is not in (0, 1), or
        ``conversion`` is unknown.

    References
    ----------
    .. [1] C. L. Canonne, G. Kamath, T. Steinke, "The discrete Gaussian for differential
       privacy", NeurIPS 2020 (arXiv:2004.00010v3), Corollary 13.
    .. [2] M. Bun, T. Steinke, "Concentrated differential privacy: simplifications,
       extensions, and lower bounds", TCC 2016, Propositions 1.3 and 1.6.
    """
    r = check_nonnegative(rho, "rho")
    d = check_delta(delta)
    conv = _check_conversion(conversion)
    if r == 0.0:
        return 0.0
    log_d = math.log(d)
    if conv == "classical":
        return r + 2.0 * math.sqrt(r * -log_d)

    def f(log_am1: float) -> float:
        am1 = math.exp(log_am1)
        alpha = 1.0 + am1
        return alpha * r + math.log1p(-1.0 / alpha) - (log_d + math.log(alpha)) / am1

    grid = np.log(_DEFAULT_ALPHA_MINUS_ONE)
    vals = np.array([f(x) for x in grid])
    i = int(np.argmin(vals))
    best = float(vals[i])
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]
    if hi > lo:
        res = optimize.minimize_scalar(
            f, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12}
        )
        if res.success and math.isfinite(res.fun):
            best = min(best, float(res.fun))
    return max(best, 0.0)


def rdp_epsilon(
    mu: float,
    delta: float,
    orders: Iterable[float] | np.ndarray | None = None,
    *,
    conversion: Conversion = "cks2020",
) -> float:
    """Epsilon at ``delta`` of a Gaussian composition via Rényi DP.

    A Gaussian composition with total privacy-loss parameter ``mu`` is
    ``(alpha, alpha mu)``-RDP for every order ``alpha > 1`` (Mironov 2017, Cor. 3 and
    Prop. 1). The RDP guarantee is converted to (epsilon, delta)-DP at each order and the
    smallest epsilon is returned. Looser than `gaussian_epsilon`; provided for
    comparison with RDP-based accountants.

    Parameters
    ----------
    mu : float
        Total privacy-loss parameter; finite and >= 0.
    delta : float
        Target delta in (0, 1).
    orders : iterable of float, optional
        RDP orders ``alpha > 1`` (finite). Default: 1201 orders with ``alpha - 1``
        geometrically spaced on [1e-4, 1e8], dense enough to be within ~1e-4 relative of
        the continuous optimum for ``mu`` between about 1e-14 and 1e6.
    conversion : {"cks2020", "classical"}, keyword-only, default "cks2020"
        ``"cks2020"``: ``eps = rdp + ln(1 - 1/alpha) - (ln delta + ln alpha) / (alpha - 1)``
        (Canonne, Kamath & Steinke 2020, Proposition 12; Balle et al. 2020, Theorem 21;
        the conversion used by ``dp_accounting.rdp.RdpAccountant``).
        ``"classical"``: ``eps = rdp + ln(1/delta) / (alpha - 1)`` (Mironov 2017, Prop. 3).

    Returns
    -------
    float
        Epsilon (>= 0).

    Raises
    ------
    ValueError
        If ``mu`` is negative or not finite, ``delta`` is not in (0, 1), an order is not a
        finite number > 1, or ``conversion`` is unknown.

    References
    ----------
    .. [1] I. Mironov, "Rényi differential privacy", CSF 2017, Proposition 3, Corollary 3.
    .. [2] C. L. Canonne, G. Kamath, T. Steinke, "The discrete Gaussian for differential
       privacy", NeurIPS 2020 (arXiv:2004.00010v3), Proposition 12.
    .. [3] B. Balle, G. Barthe, M. Gaboardi, J. Hsu, T. Sato, "Hypothesis testing
       interpretations and Rényi differential privacy", AISTATS 2020, Theorem 21.
    """
    m = _check_mu(mu)
    d = check_delta(delta)
    conv = _check_conversion(conversion)
    if orders is None:
        alpha = 1.0 + _DEFAULT_ALPHA_MINUS_ONE
    else:
        try:
            alpha = np.atleast_1d(np.asarray(list(orders), dtype=float))
        except (TypeError, ValueError):
            raise ValueError(f"orders must be finite numbers > 1; got {orders!r}") from None
        if alpha.size == 0 or not (np.all(np.isfinite(alpha)) and np.all(alpha > 1.0)):
            raise ValueError(
                f"orders must be a non-empty list of finite numbers > 1; got {orders!r}"
            )
    if m == 0.0:
        return 0.0
    return _rdp_to_dp(alpha * m, alpha, math.log(d), conv)
