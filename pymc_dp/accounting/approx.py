"""Optimal homogeneous composition of (epsilon, delta)-DP mechanisms.

Kairouz, Oh & Viswanath (2015, 2017) show that the ``k``-fold composition of an
(epsilon, delta)-DP mechanism is dominated by the ``k``-fold composition of the
"randomized response" mechanism with parameters (epsilon, delta), and that this is tight
(Theorem 3.3). The privacy-loss random variable of ``k``-fold randomized response
(without its delta part) is ``L = (k - 2 J) epsilon`` with ``J ~ Binomial(k, q)``,
``q = 1 / (1 + e^epsilon)``, so the whole tradeoff curve is

    delta_total(eps') = 1 - (1 - delta)^k (1 - delta_RR(eps')),
    delta_RR(eps')    = E[(1 - e^{eps' - L})_+],

computed here in O(k) in log space.

References
----------
.. [1] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential
   privacy", ICML 2015; IEEE Trans. Inf. Theory 63(6):4037-4049, 2017, Theorems 3.3, 3.4.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from pymc_dp._validation import check_count, check_delta, check_mechanism_delta, check_nonnegative

__all__ = ["compose_approx_dp"]

_NUDGE = 2.0**-50


class KOVCurve:
    """Privacy curve of the ``count``-fold composition of an (epsilon, delta)-DP mechanism.

    Internal helper (not re-exported): precomputes, for the dominating randomized
    response, the privacy losses ``L_j = (k - 2 j) eps > 0`` (``j = 0, 1, ...``, in
    decreasing order) and cumulative log-probabilities
    ``log S_P(i) = log sum_{j < i} P(J = j)`` and ``log S_Q(i) = log sum_{j < i} Q(J = j)``,
    where ``Q(J = j) = P(J = j) e^{-L_j}`` is the law of ``J`` under the neighbouring
    input (``Binomial(k, 1 - q)``). On ``eps' in [L_i, L_{i-1})``,
    ``delta_RR(eps') = S_P(i) - e^{eps'} S_Q(i)``.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon (>= 0), already validated.
    delta : float
        Per-mechanism delta in [0, 1), already validated.
    count : int
        Number of compositions (>= 0), already validated.
    """

    def __init__(self, epsilon: float, delta: float, count: int) -> None:
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self.count = int(count)
        k = self.count
        # log (1 - delta)^k, and the delta floor 1 - (1 - delta)^k.
        self.log_survive = k * math.log1p(-self.delta)
        self.floor = -math.expm1(self.log_survive)
        n = (k + 1) // 2 if self.epsilon > 0.0 else 0  # j < k/2  <=>  L_j > 0
        j = np.arange(n, dtype=float)
        self.losses = (k - 2.0 * j) * self.epsilon
        # log q = log(1 / (1 + e^eps)), log(1 - q) = log(e^eps / (1 + e^eps)): no underflow.
        log_q = -float(np.logaddexp(0.0, self.epsilon))
        log_1mq = -float(np.logaddexp(0.0, -self.epsilon))
        log_comb = (
            special.gammaln(k + 1.0) - special.gammaln(j + 1.0) - special.gammaln(k - j + 1.0)
        )
        # J ~ Binomial(k, q) under the first input and Binomial(k, 1 - q) under the other.
        self.log_p = log_comb + j * log_q + (k - j) * log_1mq
        self.log_q = log_comb + j * log_1mq + (k - j) * log_q
        if n:
            self.log_sp = np.logaddexp.accumulate(self.log_p)  # [i-1] -> S_P(i)
            self.log_sq = np.logaddexp.accumulate(self.log_q)
        else:
            self.log_sp = self.log_sq = np.empty(0)
        self._grid: np.ndarray | None = None

    @property
    def max_epsilon(self) -> float:
        """``k * epsilon``: the loss never exceeds it, so ``delta_RR(k eps) = 0``."""
        return self.count * self.epsilon

    def log_delta_rr(self, eps_prime: float) -> float:
        """``log E[(1 - e^{eps' - L})_+]`` evaluated directly (O(k), log space)."""
        mask = self.losses > eps_prime
        if not np.any(mask):
            return -math.inf
        with np.errstate(divide="ignore"):
            terms = self.log_p[mask] + np.log(-np.expm1(eps_prime - self.losses[mask]))
        top = float(np.max(terms))
        if top == -math.inf:
            return -math.inf
        return top + math.log(float(np.sum(np.exp(terms - top))))

    def delta_total(self, eps_prime: float) -> float:
        """``1 - (1 - delta)^k (1 - delta_RR(eps'))`` for ``eps' >= 0``."""
        log_rr = self.log_delta_rr(eps_prime)
        if log_rr == -math.inf:
            return self.floor
        log1m_rr = math.log1p(-math.exp(log_rr)) if log_rr < 0.0 else -math.inf
        return min(-math.expm1(self.log_survive + log1m_rr), 1.0)

    def _log_rr_at_grid(self) -> np.ndarray:
        """log delta_RR at ``E = [L_0, ..., L_{n-1}, 0]`` (increasing values)."""
        n = self.losses.size
        out = np.empty(n + 1)
        out[0] = -math.inf
        # at E_i (i = 1..n-1, E_i = L_i) and E_n = 0, the active set is j < i.
        e_pts = np.append(self.losses[1:], 0.0)
        lsp = self.log_sp
        lsq = self.log_sq
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = lsq + e_pts - lsp  # log(e^{E_i} S_Q(i) / S_P(i)) < 0 in exact arithmetic
            vals = lsp + np.log(-np.expm1(np.minimum(ratio, 0.0)))
        out[1:] = np.where(np.isnan(vals), -math.inf, vals)
        return out

    def epsilon_for_delta(self, target_delta: float) -> float:
        """Smallest ``eps' >= 0`` with ``delta_total(eps') <= target_delta`` (inf if none).

        Solves exactly on the piece of the piecewise-affine-in-``e^{eps'}`` curve where the
        crossing happens, then verifies the answer against `delta_total` and nudges
        it up if rounding made it unsafe. Returns ``min(result, k * epsilon)``.
        """
        t = float(target_delta)
        k = self.count
        if k == 0:
            return 0.0
        log_1mt = math.log1p(-t) if t < 1.0 else -math.inf
        t_rr = -math.expm1(log_1mt - self.log_survive)  # 1 - (1 - t) / (1 - delta)^k
        if t_rr < 0.0:
            # Infeasible by KOV, unless the basic bound (k eps, k delta) applies (rounding).
            return self.max_epsilon if t >= k * self.delta else math.inf
        if self.losses.size == 0:
            return 0.0
        log_t = math.log(t_rr) if t_rr > 0.0 else -math.inf
        if self._grid is None:
            self._grid = self._log_rr_at_grid()
        grid = self._grid
        n = self.losses.size
        if grid[n] <= log_t:
            return 0.0
        # smallest i with delta_RR(E_i) > t_rr; grid[0] = -inf <= log_t, so i >= 1.
        i = int(np.argmax(grid > log_t))
        e_hi = float(self.losses[i - 1])
        e_lo = float(self.losses[i]) if i < n else 0.0
        lsp = float(self.log_sp[i - 1])
        lsq = float(self.log_sq[i - 1])
        # solve S_P(i) - e^{eps'} S_Q(i) = t_rr
        log_num = lsp if t_rr == 0.0 else lsp + math.log(-math.expm1(log_t - lsp))
        eps_star = min(max(log_num - lsq, e_lo), e_hi)
        step = max(eps_star, 1e-300) * _NUDGE
        for _ in range(64):
            if eps_star >= self.max_epsilon:
                break
            if self.delta_total(eps_star) <= t:
                return eps_star
            eps_star += step
            step *= 2.0
        # delta_total(k eps) = 1 - (1 - delta)^k <= t because t_rr >= 0.
        return self.max_epsilon


def compose_approx_dp(epsilon: float, delta: float, count: int, target_delta: float) -> float:
    """Epsilon of the optimal ``count``-fold composition of an (epsilon, delta)-DP mechanism.

    Parameters
    ----------
    epsilon : float
        Per-mechanism epsilon; finite and >= 0.
    delta : float
        Per-mechanism delta in [0, 1) (0: pure epsilon-DP).
    count : int
        Number of (adaptive) compositions; >= 0.
    target_delta : float
        Total delta of the composition, in (0, 1).

    Returns
    -------
    float
        The smallest ``eps'`` such that the composition is (eps', target_delta)-DP for
        every (epsilon, delta)-DP mechanism, per Kairouz, Oh & Viswanath (Theorem 3.3);
        never more than the basic bound ``count * epsilon`` (which KOV attains at total
        delta ``1 - (1 - delta)^count``). ``math.inf`` if
        ``target_delta < 1 - (1 - delta)^count``; 0 for ``count = 0``.

    Raises
    ------
    ValueError
        If a parameter is outside the range given above.

    Notes
    -----
    With ``q = 1 / (1 + e^epsilon)``, ``L = (count - 2 J) epsilon``,
    ``J ~ Binomial(count, q)``, the composition is (eps', delta_total(eps'))-DP with
    ``delta_total(eps') = 1 - (1 - delta)^count (1 - E[(1 - e^{eps' - L})_+])``; at
    ``eps' = (count - 2 i) epsilon`` this is the theorem's
    ``1 - (1 - delta)^count (1 - delta_i)``,
    ``delta_i = sum_{l < i} C(count, l) (e^{(count - l) eps} - e^{(count - 2 i + l) eps})
    / (1 + e^eps)^count``, and between those points it is the exact hockey-stick
    divergence of the dominating randomized-response composition. The expectation is
    evaluated with binomial log-pmfs and cumulative log-sum-exp in O(count); on each
    piece ``[L_i, L_{i-1})`` it is affine in ``e^{eps'}``, so the crossing with the target
    is solved in closed form rather than by bisection, then checked and nudged upward if
    rounding made it unsafe. The binomial log-probabilities come from ``gammaln``; for
    ``count`` around 1e6 their absolute error is about 1e-9 (the same as
    ``scipy.stats.binom.logpmf``), i.e. a relative error of that order in delta.

    References
    ----------
    .. [1] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential
       privacy", ICML 2015; IEEE Trans. Inf. Theory 63(6):4037-4049, 2017, Theorem 3.3
       (and Theorem 3.4 for the heterogeneous bound it generalises to).
    .. [2] C. Dwork, G. N. Rothblum, S. Vadhan, "Boosting and differential privacy",
       FOCS 2010 (basic composition).
    """
    eps = check_nonnegative(epsilon, "epsilon")
    d = check_mechanism_delta(delta, "delta")
    k = check_count(count, "count")
    t = check_delta(target_delta, "target_delta")
    if k == 0:
        return 0.0
    return KOVCurve(eps, d, k).epsilon_for_delta(t)
