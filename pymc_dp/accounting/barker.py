r"""Privacy of the DP Barker test: subsampled RDP of thesis Theorem 8 (pure numpy/scipy).

Räisä (2021), MSc thesis, Sec. 3.2, Theorem 8 [Raisa2021]; Heikkilä, Jälkö, Dikmen, Honkela
(2019) [Heikkila2019]; the subsampling bound of Wang, Balle, Kasiviswanathan (2019, Theorem 9)
[Wang2019]. The RDP to (epsilon, delta) conversion is dp-accounting's (imported lazily). The
test itself lives in `pymc_dp.kernels.barker`. Keys: docs/references.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
from scipy import special

from .calibration import Bisect, calibrate
from .events import DPBarkerEvent

__all__ = [
    "DPBarkerEvent",
    "barker_base_rdp",
    "barker_rdp",
    "calibrate_barker_batch_size",
    "dp_barker_epsilon",
    "wbk_subsampled_rdp",
]

#: Largest RDP order used (orders 2 .. min(256, ceil(b / 5) - 1)).
_MAX_ORDER = 256


def barker_base_rdp(alpha: int, batch_size: int) -> float:
    r"""RDP $\epsilon'(\alpha)$ of one DP Barker test on its minibatch (thesis Theorem 8).

    $$
    \epsilon'(\alpha) = \frac{5}{2b} + \frac{1}{2(\alpha-1)}\ln\frac{2b}{b-5\alpha}
    + \frac{2\alpha}{b-5\alpha}, \qquad \alpha < b/5.
    $$

    The released value is $\hat\lambda + N(0, 2 - \sigma_b^2)$: a Gaussian whose mean and
    variance both depend on the batch; with tempered ratios clipped to $\sqrt b/n$ the
    mean moves by at most $2/\sqrt b$, the variance lies in [1, 2] and moves by at most
    $5/b$ (Heikkilä et al. 2019), and the Rényi divergence of two such Gaussians is the
    bound above. It is *not* a Gaussian mechanism with a fixed noise multiplier, which is why
    it is accounted here and not by dp-accounting's subsampled-Gaussian event.
    """
    b = batch_size
    if not (2 <= alpha and 5 * alpha < b):
        return math.inf
    return (
        5.0 / (2.0 * b)
        + math.log(2.0 * b / (b - 5.0 * alpha)) / (2.0 * (alpha - 1))
        + 2.0 * alpha / (b - 5.0 * alpha)
    )


def wbk_subsampled_rdp(base_rdp, q: float, alpha: int) -> float:
    r"""RDP at integer order ``alpha`` of a mechanism run on a WOR-subsampled batch.

    Wang, Balle, Kasiviswanathan (2019), Theorem 9 (as stated in the thesis, Theorem 8/9):

    $$
    \frac{1}{\alpha-1}\ln\Bigl(1 + q^2\binom{\alpha}{2}\min\{4(e^{\epsilon'(2)}-1),
    2e^{\epsilon'(2)}\} + \sum_{j=3}^{\alpha} q^j\binom{\alpha}{j}
    2e^{(j-1)\epsilon'(j)}\Bigr)
    $$

    for replace-one neighbours and a batch of fixed size drawn without replacement
    (``q = b / n``). ``base_rdp(j)`` is the RDP of the mechanism on the batch.
    """
    e2 = base_rdp(2)
    log_terms = [0.0]
    log_c2 = min(math.log(4.0) + math.log(math.expm1(e2)), math.log(2.0) + e2)
    log_terms.append(2 * math.log(q) + math.log(alpha * (alpha - 1) / 2) + log_c2)
    for j in range(3, alpha + 1):
        lc = special.gammaln(alpha + 1) - special.gammaln(j + 1) - special.gammaln(alpha - j + 1)
        log_terms.append(math.log(2.0) + j * math.log(q) + lc + (j - 1) * base_rdp(j))
    return float(special.logsumexp(log_terms)) / (alpha - 1)


def _orders(batch_size: int) -> list[int]:
    top = min(_MAX_ORDER, math.ceil(batch_size / 5) - 1)
    return list(range(2, top + 1))


def barker_rdp(n: int, batch_size: int, orders: Iterable[int]) -> np.ndarray:
    """Per-iteration RDP of DP Barker at ``orders``: amplified (Theorem 8), or base if b = n.

    Both bounds are valid (neighbouring datasets give identical or neighbouring batches); the
    smaller is taken.
    """
    q = batch_size / n

    def base(a):
        return barker_base_rdp(a, batch_size)

    out = []
    for a in orders:
        e = base(a)
        if q < 1.0 and math.isfinite(e):
            e = min(e, wbk_subsampled_rdp(base, q, a))
        out.append(e)
    return np.asarray(out)


def dp_barker_epsilon(events: Iterable[DPBarkerEvent], delta: float) -> float:
    """Epsilon at ``delta`` of composed DP Barker runs: RDP adds, then dp-accounting converts.

    Orders 2 .. min(256, ceil(b_min / 5) - 1); the (epsilon, delta) conversion is
    dp-accounting's ``compute_epsilon`` (Canonne, Kamath, Steinke 2020, Prop. 12 / Asoodeh et
    al. 2020), the same as for every other RDP number in pymc_dp.
    """
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    if not (0.0 < float(delta) < 1.0):
        raise ValueError(f"delta must be in (0, 1); got {delta!r}")
    events = list(events)
    if not events:
        return 0.0
    orders = _orders(min(ev.batch_size for ev in events))
    total = np.zeros(len(orders))
    for ev in events:
        total += ev.count * barker_rdp(ev.n, ev.batch_size, orders)
    return float(compute_epsilon(orders, total, float(delta))[0])


def calibrate_barker_batch_size(epsilon: float, delta: float, n: int, count: int) -> int:
    """Largest batch size whose ``count`` iterations meet (epsilon, delta); never overshoots.

    DP Barker's noise is fixed by Theorem 8; its privacy is set by the batch size (sampling
    rate and bound). A larger batch loosens the per-record bound ``sqrt(b) / n`` (less
    clipping), so the largest feasible batch is chosen. Raises ValueError naming the smallest
    epsilon reachable when the target cannot be met.
    """

    def eps(b):
        return dp_barker_epsilon([DPBarkerEvent(n, b, count)], delta)

    if n < 11:
        raise ValueError(f"DP Barker needs n >= 11 records (batch_size >= 11); got n={n}")
    # epsilon(b) is not monotone for small b (few RDP orders below b/5): scan a geometric
    # grid, then bisect between the largest feasible grid point and the next one.
    grid = sorted({int(round(v)) for v in np.geomspace(11, n, 40)} | {11, int(n)})
    values = {b: eps(b) for b in grid}
    feasible = [b for b in grid if values[b] <= epsilon]
    if not feasible:
        best = min(values.values())
        raise ValueError(
            f"epsilon={epsilon!r} cannot be met by {count} DP Barker iterations on n={n} "
            f"records: the best batch size gives epsilon={best:.4g}; raise epsilon or run "
            "fewer iterations"
        )
    lo = max(feasible)
    above = [b for b in grid if b > lo]
    if not above:
        return lo
    # eps(lo) <= epsilon < eps(above[0])
    return calibrate(eps, epsilon, Bisect(lo, above[0], "integer", stop=lambda a, b: b - a <= 1))
