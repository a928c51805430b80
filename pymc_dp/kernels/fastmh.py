r"""DP-Fast MH: the TunaMH minibatch test with Gaussian noise, and its privacy (pure numpy).

This module implements the pieces of Zhang & Zhang's DP-Fast MH ([ZhangZhang2023],
Algorithm 2) that do not know about PyMC: Poisson batch sizes, index sampling with
probabilities $c_i/C$, the TunaMH thinning and the artanh estimator (Algorithm 1), the
noisy penalty-corrected acceptance test, and the data-free privacy bounds of one iteration.
Randomness is always an explicit `numpy.random.Generator`.

Notation (paper Sec. 3-4; ``r_i`` below is a log-likelihood *difference*, so
$U_i(\theta) - U_i(\theta') = r_i$):

- $r_i = \log p(x_i|\theta') - \log p(x_i|\theta)$, clipped to
  $[-c_i M, c_i M]$ so that Assumption 1 holds by construction;
- $M = \|\theta' - \theta\|_2 \le A$ (Assumption 2; the proposal is truncated);
- $C = \sum_i c_i$; the $c_i$ are public, data-free constants;
- $\Lambda = \lambda + C M$, the Poisson rate of the batch size.

Exactness (Theorem 3, corrected)
--------------------------------
Draw $B \sim \mathrm{Poisson}(\Lambda)$ indices with probabilities $c_i/C$ and
keep index $i$ with probability
$p_i = (\lambda c_i + \tfrac{C}{2}(c_i M - r_i)) / (c_i \Lambda)$ (Algorithm 1). By
Poisson thinning the kept counts $s_i$ are independent
$\mathrm{Poisson}(\phi_i)$, $\phi_i = \lambda c_i/C + c_i M/2 - r_i/2$, and the
TunaMH ratio $2\sum_{\text{kept}}\operatorname{artanh}(C r_i / (c_i(2\lambda + CM)))$
is exactly $\log \prod_i (\phi_i(\theta',\theta)/\phi_i(\theta,\theta'))^{s_i}$, which
makes the test reversible for every kept multiset (Zhang, Cooper & De Sa 2020). The dropped
counts, however, are $\mathrm{Poisson}(c_i M/2 + r_i/2)$: *not* symmetric in
$(\theta, \theta')$. Algorithm 2 switches to the full batch when the *same* $B$
reaches $K$, so the switch depends on the dropped draws, hence on the data given the
kept ones, and the chain is reversible only up to a defect of order
$P(\mathrm{Poisson}(\Lambda) \ge K)$ in the acceptance probability (the paper's proof
of Theorem 3 uses only the marginal symmetry of $P(B < K)$, which is not enough).
``branching="independent"`` (the default) removes the defect: the branch is chosen by an
*independent* draw $B_0 \sim \mathrm{Poisson}(\Lambda)$ ($B_0 \ge K$: full batch),
which has the same marginal probability and is symmetric, and the minibatch branch draws its
own untruncated $B$; each branch is then reversible on its own. ``branching="paper"``
reproduces Algorithm 2 verbatim (one $B$ for both), with the defect above.

The Gaussian noise $\xi \sim N(0, \sigma^2)$ enters as
$\log a = \ell + \xi - \sigma^2/2 + \log\frac{p(\theta')}{p(\theta)} +
\log\frac{q(\theta|\theta')}{q(\theta'|\theta)}$ (the penalty method, Ceperley & Dewing 1999),
which keeps reversibility because $\sigma$ depends on $M$ only (symmetric).

Privacy of one iteration (Lemma 1, Theorem 2, corrected)
--------------------------------------------------------
Replace-one neighbours $D, D'$ differ in record $j$; everything that is not the
data (proposal, $M$, $B$, $B_0$, the branch, the sampled indices and the
thinning uniforms) has the same law under both and is *coupled* (the same draws are used).

*Full batch.* $\ell_2 = \sum_i \mathrm{clip}(r_i)$ changes by at most
$2 c_j M \le \Delta(\ell_2) = 2 \max_i c_i M$ (Lemma 1, eq. 2). Noise of std
$z_2 \Delta(\ell_2)$ makes it a Gaussian mechanism with privacy-loss parameter
$\mu_2 = 1/(2 z_2^2)$, independent of $M$.

*Minibatch, one draw.* Each drawn copy contributes
$X_b = 1[u_b < p_{i_b}]\, 2\operatorname{artanh}(\cdot) \in [-L, L]$,
$L = \log(1 + CM/\lambda)$, kept or not: 0 lies in the interval and the artanh term
is bounded by $L$ because $|r_i| \le c_i M$ (Lemma 1's proof). With the uniform
$u_b$ coupled, a copy of $j$ can be kept under $D$ and dropped under
$D'$ (or the reverse), and still $|X_b - X'_b| \le 2L = \Delta(\ell_1)$ (Lemma 1,
eq. 1). A sampled multiset that contains $j$ exactly $k$ times therefore moves
$\ell_1$ by at most $k \Delta(\ell_1)$: conditionally on it, noise of std
$z_1 \Delta(\ell_1)$ is a Gaussian mechanism with $\mu = k^2 \mu_1$,
$\mu_1 = 1/(2 z_1^2)$.

*Minibatch, amplification.* The multiplicity $k$ of record $j$ is data-free:
$\mathrm{Poisson}(\Lambda c_j / C)$ for an untruncated Poisson batch
(``branching="independent"``), $\mathrm{Binomial}(B, c_j/C)$ for a given $B < K$
(``branching="paper"``). Both are stochastically largest at $M = A$, $B = K-1$,
$c_j = \max_i c_i$; these worst cases make the bound a data-free constant. Writing the
output law as $P = (1-\eta) P_0 + \eta P_1$ under $D$ and
$Q = (1-\eta) P_0 + \eta Q_1$ under $D'$ ($\eta = P(k \ge 1)$,
$P_0$ the common law given $k = 0$), the advanced joint convexity of the
hockey-stick divergence (Balle, Barthe & Gaboardi 2018, Theorem 2) gives, for every
$\varepsilon_0 \ge 0$, that the branch is $(\varepsilon', \delta')$-DP with

$$
\varepsilon' = \log(1 + \eta(e^{\varepsilon_0} - 1)), \qquad
\delta' = \sum_{k \ge 1} P(k)\, \delta_{\mathcal N}(k^2 \mu_1; \varepsilon_0),
$$

where $\delta_{\mathcal N}(\mu; \varepsilon)$ is the exact (epsilon, delta) curve of a
Gaussian mechanism (Balle & Wang 2018, Theorem 8): both $P_1$ vs $P_0$ (replace
the copies of $j$ by fresh draws of other records) and $P_1$ vs $Q_1$ are
couplings at distance $k$. This replaces the paper's factor-$6K\max c_i/C$
argument and its classical noise formula (only valid for epsilon < 1). The Poisson tail beyond
the largest $k$ summed is added to $\delta'$ (rigorous).

*One iteration.* The branch is chosen from data-free draws, so the iteration is a data-free
mixture of the two branches and satisfies $(\varepsilon, \max(\delta'_{\rm mini},
\delta_{\mathcal N}(\mu_2; \varepsilon)))$-DP (joint convexity). Iterations compose
adaptively with the optimal homogeneous composition theorem for (epsilon, delta)-DP
mechanisms (Kairouz, Oh & Viswanath 2017, Theorem 3.3). Charging a constant
(epsilon, delta) per iteration keeps that theorem applicable (its parameters must not be
chosen adaptively); the minibatch branch is not a Gaussian mechanism, so a tight Gaussian
(mu) composition would not apply to it.

*"Privacy for free".* Without noise, the accept/reject bit has
$P(\text{reject}|D) - P(\text{reject}|D') \le 1 - e^{-s}$ when the log-ratio moves by
$s$: the bit is only $(\varepsilon, 1 - e^{-s})$-DP
for every $\varepsilon \ge 0$, not $(\varepsilon, 0)$ as the paper claims. For the
minibatch the same coupling gives $\delta = \sum_k P(k)(1 - e^{-k s})$.

Floating point: the noise is an IEEE double, not an exact Gaussian; Mironov (2012) shows how
low-order bits can leak. The guarantees above are for exact real arithmetic.

References
----------
.. [1] W. Zhang, R. Zhang, "DP-Fast MH: Private, Fast, and Accurate Metropolis-Hastings for
   Large-Scale Bayesian Inference", ICML 2023, Algorithms 1-2, Lemma 1, Theorems 2-3.
   [ZhangZhang2023]
.. [2] R. Zhang, A. F. Cooper, C. De Sa, "Asymptotically optimal exact minibatch
   Metropolis-Hastings", NeurIPS 2020 (TunaMH).
.. [3] B. Balle, G. Barthe, M. Gaboardi, "Privacy amplification by subsampling: tight
   analyses via couplings and divergences", NeurIPS 2018, Theorem 2.
.. [4] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential privacy:
   analytical calibration and optimal denoising", ICML 2018, Theorem 8.
.. [5] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential privacy",
   IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.3.
.. [6] D. M. Ceperley, M. Dewing, "The penalty method for random walks with uncertain
   energies", J. Chem. Phys. 110(20), 1999.
.. [7] I. Mironov, "On significance of the least significant bits for differential privacy",
   CCS 2012.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import special, stats

from pymc_dp.accounting import (
    ApproxDPEvent,
    PrivacyLedger,
    analytic_gaussian_sigma,
    gaussian_delta,
    gaussian_epsilon,
)
from pymc_dp.accounting.calibration import Bisect, calibrate, expand, solve

__all__ = [
    "FastMHCalibration",
    "FastMHInfo",
    "FastMHSettings",
    "IndexSampler",
    "Multiplicity",
    "calibrate_fastmh",
    "clipped_sum_terms",
    "default_max_batch",
    "fastmh_transition",
    "fullbatch_sensitivity",
    "keep_probability",
    "minibatch_delta",
    "minibatch_epsilon",
    "minibatch_mu",
    "minibatch_sensitivity",
    "noise_free_delta",
    "truncate_step",
    "tuna_log_ratio",
    "tuna_terms",
]

Branching = Literal["independent", "paper"]


# -- Lemma 1: sensitivities ----------------------------------------------------------------
def minibatch_sensitivity(C: float, lam: float, step_norm: float) -> float:
    r"""Per-copy sensitivity $\Delta(\ell_1) = 2\log(1 + CM/\lambda)$ (Lemma 1, eq. 1).

    One drawn copy of a record contributes a value in $[-L, L]$,
    $L = \log(1 + CM/\lambda)$, whether it is kept (artanh term) or dropped (0), so
    replacing the record moves the copy's contribution by at most $2L$.
    """
    return 2.0 * math.log1p(C * step_norm / lam)


def fullbatch_sensitivity(c_max: float, step_norm: float) -> float:
    r"""$\Delta(\ell_2) = 2 \max_i c_i M$ (Lemma 1, eq. 2; replace-one neighbours)."""
    return 2.0 * c_max * step_norm


# -- Algorithm 1: TunaMH ---------------------------------------------------------------------
def keep_probability(r, c, C: float, lam: float, step_norm: float):
    r"""TunaMH's probability of keeping a drawn index (Algorithm 1, ``Batch``).

    $(\lambda c_i + \frac{C}{2}(c_i M - r_i)) / (c_i(\lambda + CM))$ with
    $r_i = U_i(\theta) - U_i(\theta')$ the clipped log-likelihood difference; in
    $[\lambda/(\lambda + CM), 1]$ when $|r_i| \le c_i M$.
    """
    return (lam * c + 0.5 * C * (c * step_norm - r)) / (c * (lam + C * step_norm))


def clipped_sum_terms(r, bound) -> tuple[tuple[float], tuple[int]]:
    r"""``((sum_i clip(r_i, -b_i, b_i),), (n_clipped,))`` of a part of the records.

    The full-batch sum with per-record bounds ``b_i`` (parts add). A record whose
    log-likelihood is -inf at both points gives NaN: it contributes 0 (within the bounds, so
    the sensitivity is unchanged) and counts as clipped, instead of a NaN that would decide
    the test without noise. ``n_clipped`` is computed without noise: never publish it.
    """
    r = np.asarray(r, dtype=float)
    b = np.broadcast_to(np.asarray(bound, dtype=float), r.shape)
    nan = np.isnan(r)
    clipped = np.where(nan, 0.0, np.clip(r, -b, b))
    return (float(np.sum(clipped)),), (int(np.count_nonzero(nan | (np.abs(r) > b))),)


def tuna_terms(
    r, c, u, C: float, lam: float, step_norm: float
) -> tuple[tuple[float], tuple[int, int]]:
    r"""TunaMH's minibatch sum over a part of the drawn indices: ``((ell,), (kept, n_clipped))``.

    ``r`` are the unclipped log-likelihood differences of the drawn indices (with repeats),
    ``c`` their public bounds and ``u`` their keep uniforms (drawn on the driver). Clips
    ``r`` to ``+-c M``, keeps index ``i`` when ``u_i <`` `keep_probability`, and returns
    the part's `tuna_log_ratio` (a sum over the part: parts add). ``kept`` and
    ``n_clipped`` are computed from the data without noise: never publish them.
    """
    r = np.asarray(r, dtype=float)
    c = np.broadcast_to(np.asarray(c, dtype=float), r.shape)
    bound = c * step_norm
    n_clipped = int(np.count_nonzero(np.abs(r) > bound))
    r = np.clip(r, -bound, bound)
    keep = np.asarray(u) < keep_probability(r, c, C, lam, step_norm)
    ell = tuna_log_ratio(r[keep], c[keep], C, lam, step_norm)
    return (ell,), (int(np.count_nonzero(keep)), n_clipped)


def tuna_log_ratio(r_kept, c_kept, C: float, lam: float, step_norm: float) -> float:
    r"""$\ell_1 = 2 \sum_{i \in I} \operatorname{artanh}(C r_i / (c_i(2\lambda + CM)))$.

    Algorithm 1, ``MHRatio``; ``r_kept`` are the clipped differences of the kept indices
    (with repeats). Each term lies in $[-\log(1 + CM/\lambda), \log(1 + CM/\lambda)]$.
    """
    if np.size(r_kept) == 0:
        return 0.0
    arg = C * np.asarray(r_kept, dtype=float) / (c_kept * (2.0 * lam + C * step_norm))
    return float(2.0 * np.sum(np.arctanh(arg)))


class IndexSampler:
    """Draws record indices with probabilities ``c_i / C`` in O(batch) time.

    Parameters
    ----------
    c : float or array of shape (n,)
        Public per-record bounds; a scalar (or a constant array) means uniform sampling.
    n : int
        Number of records.

    Notes
    -----
    The cumulative sums are computed once (O(n)); every draw is then a binary search
    (``searchsorted``), O(B log n) for B indices. Uniform weights use ``rng.integers``.
    """

    def __init__(self, c, n: int) -> None:
        self.n = int(n)
        c_arr = np.asarray(c, dtype=float)
        if c_arr.ndim == 0 or np.all(c_arr == c_arr.flat[0]):
            self._cdf = None
        else:
            cdf = np.cumsum(c_arr)
            self._cdf = cdf / cdf[-1]

    def __call__(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if self._cdf is None:
            return rng.integers(0, self.n, size=size)
        idx = np.searchsorted(self._cdf, rng.random(size), side="right")
        return np.minimum(idx, self.n - 1, out=idx)


def truncate_step(step: np.ndarray, max_step: float) -> np.ndarray:
    r"""Radial truncation $\Delta \mapsto \Delta \min(1, A/\|\Delta\|_2)$.

    Enforces $M \le A$ (Assumption 2). The map commutes with $\Delta \mapsto
    -\Delta$, so a symmetric step law stays symmetric: $q(\theta'|\theta) =
    q(\theta|\theta')$ and the log proposal ratio is 0.
    """
    norm = float(np.linalg.norm(step))
    if norm > max_step:
        return step * (max_step / norm)
    return step


# -- one iteration ---------------------------------------------------------------------------
@dataclass(frozen=True)
class FastMHSettings:
    """Data-free constants of one DP-Fast MH step.

    Attributes
    ----------
    c : float or numpy.ndarray
        Public per-record bounds ``c_i`` (scalar: the same for every record).
    C, c_max : float
        ``sum_i c_i`` and ``max_i c_i``.
    lam : float
        ``lambda`` of the Poisson batch size ``B ~ Poisson(lambda + C M)``.
    max_batch : int
        ``K``: the full-batch branch is taken when the branch draw is ``>= K``.
    branching : {"independent", "paper"}
        See the module docstring ("Exactness").
    z_minibatch, z_fullbatch : float
        Noise multipliers: noise std ``z_1 Delta(l_1)`` / ``z_2 Delta(l_2)``; 0 disables noise
        (only for tests of the kernel; the step never allows it).
    free_minibatch, free_fullbatch : float
        "Privacy for free" thresholds (paper's rule): no noise when the branch's sensitivity is
        ``<=`` the threshold. ``-inf`` (default) never skips the noise.
    """

    c: float | np.ndarray
    C: float
    c_max: float
    lam: float
    max_batch: int
    branching: Branching
    z_minibatch: float
    z_fullbatch: float
    free_minibatch: float = -math.inf
    free_fullbatch: float = -math.inf


@dataclass(frozen=True)
class FastMHInfo:
    """Outcome of one iteration.

    ``kept`` and ``n_clipped`` are computed from the data without noise: never publish them
    (the step emits them only behind ``nonprivate_diagnostics``). ``log_accept`` is a
    post-processing of the noisy release, except in noise-free iterations.
    """

    accepted: bool
    log_accept: float
    full_batch: bool
    batch_size: int
    kept: int
    n_clipped: int
    noise_std: float
    noise_free: bool


def fastmh_transition(
    rng: np.random.Generator,
    settings: FastMHSettings,
    sampler: IndexSampler,
    *,
    step_norm: float,
    log_prior_ratio: float,
    log_proposal_ratio: float,
    minibatch_ratios: Callable[[np.ndarray], np.ndarray] | None = None,
    minibatch_terms: Callable[[np.ndarray, np.ndarray, np.ndarray, float], tuple] | None = None,
    fullbatch_clipped_sum: Callable[[float], tuple[float, int]],
    n_records: int,
) -> FastMHInfo:
    r"""One accept/reject decision of DP-Fast MH (Algorithm 2).

    Parameters
    ----------
    rng : numpy.random.Generator
    settings : FastMHSettings
    sampler : IndexSampler
    step_norm : float
        $M = \|\theta' - \theta\|_2$ (already truncated to ``<= A``).
    log_prior_ratio, log_proposal_ratio : float
        $\log p(\theta')/p(\theta)$ (data-free, exact) and
        $\log q(\theta|\theta')/q(\theta'|\theta)$.
    minibatch_ratios : callable
        ``idx -> r[idx]``: unclipped log-likelihood differences of the records ``idx`` only
        (the only data access of the minibatch branch).
    minibatch_terms : callable
        Instead of ``minibatch_ratios``: ``(idx, c[idx], u, M) -> ((ell,), (kept,
        n_clipped))``, the `tuna_terms` of the records ``idx`` summed over the places the
        records live (they never leave them). Give exactly one of the two.
    fullbatch_clipped_sum : callable
        ``M -> (sum_i clip(r_i, -c_i M, c_i M), number clipped)`` over all records.
    n_records : int

    Returns
    -------
    FastMHInfo
    """
    if (minibatch_ratios is None) == (minibatch_terms is None):
        raise TypeError("give exactly one of minibatch_ratios and minibatch_terms")
    s = settings
    M = float(step_norm)
    rate = s.lam + s.C * M
    if s.branching == "paper":
        B = int(rng.poisson(rate))
        full = B >= s.max_batch
    else:
        full = int(rng.poisson(rate)) >= s.max_batch
        B = 0 if full else int(rng.poisson(rate))
    if full:
        sens = fullbatch_sensitivity(s.c_max, M)
        # -- data access: all records (a Gaussian mechanism unless noise-free) ---------------
        ell, n_clipped = fullbatch_clipped_sum(M)
        kept = n_records
        noise_free = sens <= s.free_fullbatch
        sigma = 0.0 if noise_free else s.z_fullbatch * sens
        batch = n_records
    else:
        sens = minibatch_sensitivity(s.C, s.lam, M)
        idx = sampler(rng, B)
        u = rng.random(B)
        if B > 0:
            # -- data access: the B sampled rows only ------------------------------------------
            c = np.full(B, float(s.c)) if np.ndim(s.c) == 0 else s.c[idx]
            if minibatch_terms is not None:
                (ell,), (kept, n_clipped) = minibatch_terms(idx, c, u, M)
            else:
                r = np.asarray(minibatch_ratios(idx), dtype=float)
                (ell,), (kept, n_clipped) = tuna_terms(r, c, u, s.C, s.lam, M)
        else:
            ell, kept, n_clipped = 0.0, 0, 0
        noise_free = sens <= s.free_minibatch
        sigma = 0.0 if noise_free else s.z_minibatch * sens
        batch = B
    xi = rng.normal() * sigma if sigma > 0.0 else 0.0
    log_a = ell + xi - 0.5 * sigma * sigma + log_prior_ratio + log_proposal_ratio
    # -- post-processing of the (noisy) release -------------------------------------------------
    accepted = bool(np.log(rng.random()) < log_a)
    return FastMHInfo(
        accepted=accepted,
        log_accept=float(log_a),
        full_batch=bool(full),
        batch_size=int(batch),
        kept=int(kept),
        n_clipped=int(n_clipped),
        noise_std=float(sigma),
        noise_free=bool(noise_free),
    )


def default_max_batch(rate: float, full_batch_probability: float = 1e-3) -> int:
    """Smallest ``K`` with ``P(Poisson(rate) >= K) <= full_batch_probability`` (data-free)."""
    return int(stats.poisson.isf(full_batch_probability, rate)) + 1


# -- privacy of one iteration ------------------------------------------------------------------
def _gaussian_delta_many(mu: np.ndarray, epsilon: float) -> np.ndarray:
    """Tight delta(epsilon) of Gaussian mechanisms with parameters ``mu`` (vectorised in mu).

    The same stable formula as `pymc_dp.accounting.gaussian_delta` (Balle & Wang 2018,
    Theorem 8; written with ``erfcx`` so that nothing overflows), for many ``mu`` at once.
    """
    mu = np.asarray(mu, dtype=float)
    out = np.zeros_like(mu)
    pos = mu > 0.0
    m = mu[pos]
    s = 2.0 * np.sqrt(m)
    a = (epsilon - m) / s
    b = (epsilon + m) / s
    with np.errstate(over="ignore", under="ignore"):
        g = np.exp(-(a * a))
        val = np.where(
            a >= 0.0,
            0.5 * g * (special.erfcx(np.maximum(a, 0.0)) - special.erfcx(b)),
            0.5 * (special.erfc(a) - g * special.erfcx(b)),
        )
    out[pos] = np.clip(val, 0.0, 1.0)
    return out


@dataclass(frozen=True)
class Multiplicity:
    """Data-free law of the number ``k >= 1`` of copies of one record in a minibatch.

    Attributes
    ----------
    pmf : numpy.ndarray
        ``P(k)`` for ``k = k0, ..., k0 + len(pmf) - 1``, with ``P(1 <= k < k0)`` added to the
        first entry (charged as ``k0`` copies: every delta here grows with ``k``, so this
        never undershoots).
    tail : float
        ``P(k >= k0 + len(pmf))`` (the last ``k`` is 12 standard deviations plus 40 above the
        mean, so the tail is below 1e-30); charged in full as delta.
    k0 : int
        The first number of copies of ``pmf``: 1, or 12 standard deviations plus 40 below
        a large mean, so that the law takes memory proportional to its standard deviation,
        not to its mean.
    """

    pmf: np.ndarray
    tail: float
    k0: int = 1

    @property
    def eta(self) -> float:
        """``P(k >= 1)``: the probability that the record is drawn at all."""
        return float(np.sum(self.pmf) + self.tail)

    @property
    def copies(self) -> np.ndarray:
        """The numbers of copies ``k`` of the entries of ``pmf`` (float)."""
        return np.arange(self.k0, self.k0 + self.pmf.size, dtype=float)

    @classmethod
    def poisson(cls, mean: float) -> Multiplicity:
        """``k ~ Poisson(mean)``: an untruncated Poisson batch (``branching="independent"``)."""
        sd = math.sqrt(mean)
        return cls._window(
            mean, sd, lambda k: stats.poisson.pmf(k, mean), lambda k: stats.poisson.cdf(k, mean),
            lambda k: stats.poisson.sf(k, mean), None,
        )  # fmt: skip

    @classmethod
    def binomial(cls, trials: int, p: float) -> Multiplicity:
        """``k ~ Binomial(trials, p)``: ``trials`` draws given (``branching="paper"``)."""
        if trials <= 0:
            return cls(np.zeros(1), 0.0)
        m = trials * p
        return cls._window(
            m, math.sqrt(m * (1.0 - p)), lambda k: stats.binom.pmf(k, trials, p),
            lambda k: stats.binom.cdf(k, trials, p), lambda k: stats.binom.sf(k, trials, p),
            trials,
        )  # fmt: skip

    @classmethod
    def _window(cls, mean, sd, pmf, cdf, sf, last) -> Multiplicity:
        """The law on ``mean -+ (12 sd + 40)``, the mass below folded into its first entry."""
        kmax = int(mean + 12.0 * sd + 40.0)
        if last is not None:
            kmax = int(min(last, kmax))
        k0 = max(1, int(mean - 12.0 * sd - 40.0))
        if kmax - k0 + 1 > MAX_MULTIPLICITY_ENTRIES:
            raise ValueError(
                f"DPFastMH: the number of copies of one record in a minibatch has mean "
                f"{mean:.4g} and sd {sd:.4g}, too wide a law to account for "
                f"({kmax - k0 + 1:.3g} entries); choose a smaller clip_bound, lam or max_step"
            )
        k = np.arange(k0, kmax + 1)
        w = np.asarray(pmf(k), dtype=float)
        if k0 > 1:  # P(1 <= k < k0), charged as k0 copies
            w[0] += float(cdf(k0 - 1) - pmf(0))
        tail = float(sf(kmax)) if last is None or kmax < last else 0.0
        return cls(w, tail, k0)


#: Largest number of entries of a `Multiplicity` law (memory ~ 8 bytes each): checked
#: before it is allocated (at calibration, before any data is read).
MAX_MULTIPLICITY_ENTRIES = 5_000_000


def minibatch_delta(law: Multiplicity, mu: float, epsilon: float) -> float:
    r"""Delta of the noisy minibatch branch at ``epsilon`` (advanced joint convexity).

    $\sum_{k \ge 1} P(k) \delta_{\mathcal N}(k^2 \mu; \varepsilon_0)$ + tail, with
    $\varepsilon_0 = \log(1 + (e^{\varepsilon} - 1)/\eta)$ (module docstring; Balle,
    Barthe & Gaboardi 2018, Theorem 2; Balle & Wang 2018, Theorem 8).

    Parameters
    ----------
    law : Multiplicity
    mu : float
        Per-copy privacy-loss parameter ``1 / (2 z_1^2)``.
    epsilon : float
        Epsilon of the branch, >= 0.
    """
    eta = law.eta
    if eta <= 0.0:
        return 0.0
    eps0 = math.log1p(math.expm1(epsilon) / eta)
    k = law.copies
    total = law.tail + float(np.sum(law.pmf * _gaussian_delta_many(k * k * mu, eps0)))
    return min(total, 1.0)


def minibatch_mu(law: Multiplicity, epsilon: float, delta: float) -> float:
    """Largest per-copy ``mu`` with `minibatch_delta` ``<= delta`` (never overshoots).

    Raises
    ------
    ValueError
        If the multiplicity tail alone exceeds ``delta``.
    """
    if minibatch_delta(law, 1e-300, epsilon) > delta:
        raise ValueError(
            "the minibatch branch cannot meet this per-iteration delta (the multiplicity tail "
            "alone exceeds it); increase delta"
        )

    def ok(log_mu: float) -> bool:
        return minibatch_delta(law, math.exp(log_mu), epsilon) <= delta

    _, lo = expand(ok, math.log(1e-12), lambda x: x - 5.0, while_ok=False)
    # no record can be drawn beyond log mu = 600 (e.g. K = 1 with the paper's rule)
    prev, hi = expand(ok, math.log(1.0), lambda x: x + 5.0, while_ok=True, last=lambda x: x > 600)
    if hi is None:
        return math.exp(prev)
    if prev is not None:
        lo = prev
    search = Bisect(lo, hi, "arithmetic", stop=lambda a, b: b - a < 1e-12, max_steps=100)
    return math.exp(solve(ok, search))


def minibatch_epsilon(law: Multiplicity, mu: float, delta: float) -> float:
    """Smallest epsilon at which the noisy minibatch branch is (epsilon, delta)-DP.

    ``math.inf`` if no epsilon works (the tail exceeds ``delta``). Never undershoots.
    """
    if minibatch_delta(law, mu, 0.0) <= delta:
        return 0.0

    def ok(eps: float) -> bool:
        return minibatch_delta(law, mu, eps) <= delta

    def too_large(eps: float) -> None:
        if eps > 1e4:
            raise _NoEpsilon

    try:
        _, hi = expand(ok, 1.0, lambda e: 2.0 * e, while_ok=False, limit=too_large)
    except _NoEpsilon:
        return math.inf
    search = Bisect(hi, 0.0, "arithmetic", stop=lambda h, lo: h - lo <= 1e-13 * h, max_steps=200)
    return solve(ok, search)


class _NoEpsilon(Exception):
    """No finite epsilon meets the delta (raised inside `minibatch_epsilon`)."""


def noise_free_delta(law: Multiplicity | None, shift: float) -> float:
    r"""Delta of a noise-free accept/reject bit whose log-ratio moves by ``<= shift`` per copy.

    ``law=None`` (full batch): $1 - e^{-s}$. Minibatch:
    $\sum_k P(k)(1 - e^{-k s})$ + tail. Valid at every epsilon >= 0.
    """
    if law is None:
        return -math.expm1(-shift)
    k = law.copies
    return min(float(np.sum(law.pmf * -np.expm1(-k * shift))) + law.tail, 1.0)


@dataclass(frozen=True)
class FastMHCalibration:
    """Noise multipliers and the per-iteration privacy charge of a DP-Fast MH step.

    Attributes
    ----------
    z_minibatch, z_fullbatch : float
        Noise multipliers ``z_1``, ``z_2`` (std = z times the branch's per-copy sensitivity).
    iter_epsilon, iter_delta : float
        Every iteration is (iter_epsilon, iter_delta)-DP: the constant charged per iteration
        (``iter_delta`` includes the honest delta of noise-free iterations, if any).
    noisy_delta : float
        Delta of the noisy branches at ``iter_epsilon`` (without the noise-free part).
    free_minibatch, free_fullbatch : float
        "Privacy for free" thresholds (``-inf`` when off).
    law : Multiplicity
        Worst-case multiplicity of one record in a minibatch.
    """

    z_minibatch: float
    z_fullbatch: float
    iter_epsilon: float
    iter_delta: float
    noisy_delta: float
    free_minibatch: float
    free_fullbatch: float
    law: Multiplicity


def _multiplicity(
    branching: Branching, p: float, lam: float, C: float, max_step: float, max_batch: int
) -> Multiplicity:
    if branching == "paper":
        return Multiplicity.binomial(max_batch - 1, p)
    return Multiplicity.poisson(p * (lam + C * max_step))


def _per_iteration_noise(law: Multiplicity, epsilon: float, delta: float) -> tuple[float, float]:
    mu1 = minibatch_mu(law, epsilon, delta)
    return 1.0 / math.sqrt(2.0 * mu1), analytic_gaussian_sigma(epsilon, delta)


def _run_epsilon(eps_it: float, delta_it: float, count: int, delta: float) -> float:
    # Exactly what pymc_dp.privacy_report computes for a constant per-iteration charge.
    return PrivacyLedger([ApproxDPEvent(eps_it, delta_it, count)]).epsilon(delta)


def calibrate_fastmh(
    *,
    C: float,
    c_max: float,
    lam: float,
    max_step: float,
    max_batch: int,
    branching: Branching,
    privacy_for_free: bool = False,
    iter_epsilon: float | None = None,
    iter_delta: float | None = None,
    noise_multiplier: tuple[float, float] | None = None,
    epsilon: float | None = None,
    delta: float | None = None,
    iterations: int | None = None,
) -> FastMHCalibration:
    r"""Noise multipliers and per-iteration charge of DP-Fast MH, from one of three inputs.

    Exactly one of:

    - ``iter_epsilon, iter_delta``: the paper's per-iteration target (Theorem 2): both
      branches are calibrated to be (iter_epsilon, iter_delta)-DP.
    - ``noise_multiplier=(z_1, z_2), iter_delta``: the noise is given; ``iter_epsilon`` is the
      smallest epsilon both branches meet at ``iter_delta``.
    - ``epsilon, delta, iterations``: a run target. ``iterations`` iterations (all chains,
      warmup included) of a constant (eps_it, delta_it) charge, composed by the
      Kairouz-Oh-Viswanath theorem, meet (epsilon, delta). ``delta_it`` takes a fraction
      ``f`` of ``delta`` (``1 - (1 - delta_it)^T = f delta``), ``eps_it`` is the largest value
      that then meets ``epsilon``; ``f`` is chosen on a grid to minimise ``z_1`` (the
      minibatch noise, the binding one in practice).

    Raises
    ------
    ValueError
        If the target cannot be met (e.g. ``privacy_for_free`` with a run target, whose
        noise-free iterations need a large delta).
    """
    p = c_max / C
    law = _multiplicity(branching, p, lam, C, max_step, max_batch)
    if iter_epsilon is not None:
        eps_it, d_it = float(iter_epsilon), float(iter_delta)
        z1, z2 = _per_iteration_noise(law, eps_it, d_it)
    elif noise_multiplier is not None:
        z1, z2 = (float(z) for z in noise_multiplier)
        d_it = float(iter_delta)
        eps_it = max(
            gaussian_epsilon(1.0 / (2.0 * z2 * z2), d_it),
            minibatch_epsilon(law, 1.0 / (2.0 * z1 * z1), d_it),
        )
        if not math.isfinite(eps_it):
            raise ValueError(
                f"noise_multiplier {noise_multiplier} gives no finite per-iteration epsilon at "
                f"iter_delta={d_it}; increase iter_delta or the noise"
            )
    else:
        T = int(iterations)
        best = None
        for frac in (0.05, 0.2, 0.5, 0.8, 0.95):
            d_try = -math.expm1(math.log1p(-frac * delta) / T)

            def run_eps(eps_it: float, d_try: float = d_try) -> float:
                return _run_epsilon(eps_it, d_try, T, delta)

            def ok(eps_it: float, run_eps=run_eps) -> bool:
                return run_eps(eps_it) <= epsilon

            # eps_it = 0 meets any target; double up from the run's epsilon while feasible
            prev, hi = expand(ok, float(epsilon), lambda e: 2.0 * e, while_ok=True)
            lo = 0.0 if prev is None else prev
            # relative precision 2^-48 of eps_it
            lo = calibrate(run_eps, epsilon, Bisect(lo, hi, "arithmetic", max_steps=48))
            if lo <= 0.0:
                continue
            try:
                z_try = _per_iteration_noise(law, lo, d_try)
            except ValueError:
                continue
            if best is None or z_try[0] < best[2][0]:
                best = (lo, d_try, z_try)
        if best is None:
            raise ValueError(
                f"no per-iteration noise meets the run target (epsilon={epsilon}, "
                f"delta={delta}) over {T} iterations"
            )
        eps_it, d_it, (z1, z2) = best
    noisy = max(
        minibatch_delta(law, 1.0 / (2.0 * z1 * z1), eps_it),
        gaussian_delta(1.0 / (2.0 * z2 * z2), eps_it),
    )
    d_charge = max(d_it, noisy)
    free_mini = free_full = -math.inf
    if privacy_for_free:
        # The paper's rule (Algorithm 2): no noise when the sensitivity is below the
        # per-iteration epsilon (scaled by C / (6 K max c_i) for the minibatch).
        free_full = eps_it
        free_mini = eps_it * C / (6.0 * max_batch * c_max)
        s_full = min(fullbatch_sensitivity(c_max, max_step), free_full)
        s_mini = min(minibatch_sensitivity(C, lam, max_step), free_mini)
        d_charge = max(d_charge, noise_free_delta(None, s_full), noise_free_delta(law, s_mini))
    if epsilon is not None and _run_epsilon(eps_it, d_charge, int(iterations), delta) > epsilon:
        raise ValueError(
            f"the run target (epsilon={epsilon}, delta={delta}) cannot be met: each iteration "
            f"is only ({eps_it:.4g}, {d_charge:.3g})-DP"
            + (
                " because the noise-free iterations of privacy_for_free=True release an "
                "accept/reject bit that is only (eps, 1 - e^-Delta)-DP"
                if privacy_for_free
                else ""
            )
            + (
                f"; over {int(iterations)} iterations the smallest delta with a finite epsilon "
                f"is {1.0 - (1.0 - d_charge) ** int(iterations):.3g}"
            )
        )
    return FastMHCalibration(
        z_minibatch=float(z1),
        z_fullbatch=float(z2),
        iter_epsilon=float(eps_it),
        iter_delta=float(d_charge),
        noisy_delta=float(noisy),
        free_minibatch=float(free_mini),
        free_fullbatch=float(free_full),
        law=law,
    )
