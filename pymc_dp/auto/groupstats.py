r"""Per-group sufficient statistics of a hierarchical normal model (noise-aware, NUTS).

Where the model's one likelihood is ``y_i ~ N(m_{g_i}(theta), sigma)``: the mean a vector of
group means indexed by an integer data array ``g`` (the group of each record), ``sigma`` a
scalar parameter (found in the PyMC graph by `find_group_structure`, never from the data),
the likelihood depends on the data only through the per-group counts and sums and the total
sum of squares,

$$ n_g = \#\{i: g_i = g\}, \qquad S_g = \sum_{g_i = g} y_i, \qquad Q = \sum_i y_i^2 $$

(``sum_g Q_g`` is all the likelihood reads of the per-group ``Q_g``: releasing their total
puts the noise of one statistic, not of ``G``, on ``sigma``). The strategy
(``auto_kwargs={"method": "groupstats"}``):

1. `release_centre`: the DP mean ``c`` of the response clipped to its declared box;
2. `release_clip_bound`: the DP quantile ``b`` of ``|y_i - c|``
   (`pymc_dp.kernels.expfam.private_clip_bound`, as the linear-regression strategy's
   whitened norms), then the released excess beyond ``b 2^j``
   (`pymc_dp.kernels.expfam.private_tail_excess`) moves it up where the clipped tail would
   bias the sums (`pymc_dp.auto.suffstats.tail_clip_bound`);
3. `release_group_stats`: with ``u_i = clip(y_i - c, -b, b)``, the sum over records of
   ``(w_0 e_{g_i}, w_1 u_i e_{g_i}, w_2 u_i^2)`` (``e_g`` the ``g``-th unit vector of
   ``R^G``) plus one Gaussian release of sd ``z Delta`` (`group_stats_sensitivity`);
4. the noise-aware posterior (Bernstein & Sheldon 2018): the model's own prior and, in place
   of its likelihood, the density of the released statistics given ``theta``
   (`noise_aware_group_loglik`), sampled with NUTS (`fit_group_posterior`). Its draws are the
   result (`pymc_dp.step_methods.laplace.DPPosteriorDraws`).

No data are read after step 3. The clipping is modelled: the released sums are those of a
clipped normal under the model's own likelihood (`clipped_normal_moments`), so a record
beyond ``b`` is not a bias where the model holds; the tail release keeps ``b`` above a tail
heavier than the model's (where clipping it would be).

References
----------
.. [1] G. Bernstein, D. Sheldon, "Differentially private Bayesian inference for exponential
   families", NeurIPS 2018 (noise-aware inference from released sufficient statistics, their
   sampling distribution by the central limit theorem). [BernsteinSheldon2018]
.. [2] G. Bernstein, D. Sheldon, "Differentially private Bayesian linear regression",
   NeurIPS 2019 (the first-order propagation of the noise of the released counts).
   [BernsteinSheldon2019]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pymc as pm
import pytensor.tensor as pt

from pymc_dp.diagnostics import MAX_RHAT
from pymc_dp.records.store import node_shape, node_value

__all__ = [
    "GROUPSTATS_CENTRE_SHARE",
    "GROUPSTATS_CLIP_SHARE",
    "GROUPSTATS_TAIL_SHARE",
    "GROUPSTATS_WEIGHTS",
    "GroupStats",
    "CentredSampling",
    "GroupStructure",
    "find_group_structure",
    "fit_group_posterior",
    "group_stats_of_records",
    "group_stats_predicted_error",
    "group_stats_sensitivity",
    "groupstats_last_share",
    "centred_sampling_model",
    "clipped_normal_moments",
    "noise_aware_group_loglik",
    "noise_aware_group_model",
    "release_centre",
    "release_clip_bound",
    "release_group_stats",
    "tail_bias_bounds",
]

#: Shares of the budget (``mu``) of the centre, the clip bound's histogram and the tail's
#: excess (the last release takes the rest); the linear-regression strategy's
#: (`pymc_dp.auto.suffstats`), whose whitening has no counterpart here.
GROUPSTATS_CENTRE_SHARE = 0.05
GROUPSTATS_CLIP_SHARE = 0.05
GROUPSTATS_TAIL_SHARE = 0.1
#: Weights of the count, the centred sum and the square in units of the clip bound
#: (``w_0 = W_0``, ``w_1 = W_1 / b``, ``w_2 = W_2 / b^2``). The sensitivity is 2 for any
#: ``W_1 = 1`` and ``2 W_0^2 + 1 + W_2^2 <= 4`` (a record staying in its group moves its sum
#: by ``2 W_1``: `group_stats_sensitivity`), so the square, whose noise is the worst
#: parameter's (``sigma``) error, takes 1.5 and the count, whose noise enters only through
#: ``e_1 = E[u]`` (a centred group mean, small), 0.5. Measured on bench_auto's hierarchy at
#: epsilon 3 (2 DP seeds): with (1, 1, 1) (and a looser sensitivity, sqrt 5) sigma was 0.66 and
#: 0.75 NUTS sds off, the group
#: effects at most 0.28.
GROUPSTATS_WEIGHTS = (0.5, 1.0, 1.5)
#: Share of records left unclipped by ``b`` (`release_clip_bound`).
GROUPSTATS_QUANTILE = 0.999
#: NUTS run of the noise-aware posterior (`fit_group_posterior`): post-processing only.
GROUPSTATS_NUTS_DRAWS = 1000
GROUPSTATS_NUTS_CHAINS = 4
#: Its tuning iterations per chain. In centred coordinates the posterior of ~50 statistics
#: is close to Gaussian: on bench_auto's hierarchy the trees had 17-23 leapfrog steps over
#: the first 250 tuning iterations and 7 (depth 3) from then on, so 500 adapt the step size
#: and diagonal mass matrix (R-hat and divergences are still checked, `_converged`).
GROUPSTATS_NUTS_TUNE = 500
#: Processes of the NUTS run (``None``: ``pm.sample``'s default, at most 4, half the CPUs
#: the system reports: 1 on a 2-CPU machine; was 1 always). The chains' draws do not depend
#: on it: each chain has its own seed.
GROUPSTATS_NUTS_CORES: int | None = None
#: R-hat above which the noise-aware posterior's NUTS run is reported unconverged (the
#: package's threshold, `pymc_dp.diagnostics.MAX_RHAT`).
GROUPSTATS_RHAT_WARN = MAX_RHAT


def groupstats_last_share() -> float:
    """The last release's share of ``mu``: what the fixed shares leave."""
    return 1.0 - GROUPSTATS_CENTRE_SHARE - GROUPSTATS_CLIP_SHARE - GROUPSTATS_TAIL_SHARE


# -- 1. structure (data-free) ------------------------------------------------------------------


@dataclass
class GroupStructure:
    """What `find_group_structure` found in the graph (data-free, except the two data
    handles, read only by the releases)."""

    #: the observed variable and its data (read by the releases only)
    observed: object
    y_data: object
    #: the group index (a constant or shared integer array of length ``n``)
    index: object
    #: the group means as a vector of length ``G`` and ``sigma`` as a scalar, in terms of
    #: the model's value variables (no data)
    group_mean: object
    sigma: object
    n: int
    groups: int

    def y(self) -> np.ndarray:
        """The response (exact: only the releases call this)."""
        return np.asarray(node_value(self.y_data), dtype=float).ravel()

    def g(self) -> np.ndarray:
        """The group index (exact: only the releases call this)."""
        return node_value(self.index).astype(np.int64).ravel()


def _data_leaves(graph, n: int, blockers=None) -> list:
    """Constants and shared variables of the graph with a dimension of length ``n``."""
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.basic import Constant
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor.type import TensorType

    out = []
    for v in ancestors([graph], blockers=blockers):
        if not isinstance(v.type, TensorType):  # random generators
            continue
        if isinstance(v, (Constant, SharedVariable)):
            shape = node_shape(v)
            if any(int(s) == n for s in shape):
                out.append(v)
    return out


def find_group_structure(model: pm.Model) -> GroupStructure | str:
    """``y_i ~ N(m_{g_i}(theta), sigma)`` in the model's graph, or why not (data-free).

    The model's one observed variable is a normal whose mean is built from vectors indexed by
    one integer data array (``z[g]``, ``a[g]``: `AdvancedSubtensor1`), every other part of
    the mean free of length-``n`` data (no covariates), and whose sd is a scalar free of
    data. The group means are the mean with each ``v[g]`` replaced by ``v`` (length ``G``).
    """
    from pytensor.graph.replace import clone_replace
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor import subtensor as _st
    from pytensor.tensor.random.basic import NormalRV

    indexing = tuple(
        op
        for op in (
            getattr(_st, "AdvancedSubtensor", None),
            getattr(_st, "AdvancedSubtensor1", None),
        )
        if op is not None
    )

    if len(model.observed_RVs) != 1:
        return f"{len(model.observed_RVs)} observed variables (one normal likelihood needed)"
    obs = model.observed_RVs[0]
    if not isinstance(obs.owner.op, NormalRV):
        return f"the likelihood is {type(obs.owner.op).__name__}, not a normal"
    mean, sigma = obs.owner.op.dist_params(obs.owner)
    # in terms of the value variables (leaves: kept when the mean is rebuilt)
    mean, sigma = model.replace_rvs_by_values([mean, sigma])
    y_data = model.rvs_to_values[obs]
    if not (hasattr(y_data, "data") or hasattr(y_data, "get_value")):
        return "the response is not a data array"
    n = int(np.prod(node_shape(y_data)))  # public: the number of records
    if n < 2 or len(node_shape(y_data)) != 1:
        return "the response is not a vector of records"
    # every v[g] in the mean
    index, swaps = None, {}
    for node in {a.owner for a in ancestors([mean]) if a.owner is not None}:
        if not isinstance(node.op, indexing):
            continue
        if len(node.inputs) != 2:
            return "the mean indexes a vector with more than one index"
        v, idx = node.inputs
        if not _data_leaves(idx, n) or idx.type.ndim != 1 or "int" not in str(idx.type.dtype):
            return "the mean indexes a vector with something other than an integer data array"
        if idx.owner is not None:
            return "the group index is computed, not a data array"
        if index is None:
            index = idx
        elif idx is not index and not (
            type(idx) is type(index) and np.array_equal(node_value(idx), node_value(index))
        ):
            return "the mean indexes vectors with two different index arrays"
        if v.type.ndim != 1:
            return "the indexed variable is not a vector"
        swaps[node.outputs[0]] = v
    if index is None:
        return "the mean is not indexed by a group index"
    if _data_leaves(mean, n, blockers=list(swaps)):
        return "the mean reads data other than the group index (covariates)"
    try:
        group_mean = clone_replace(mean, swaps, rebuild_strict=False)
    except ValueError as err:
        return f"the mean is not a function of the group means alone ({err})"
    if _data_leaves(group_mean, n):
        return "the mean reads data other than the group index (covariates)"
    if sigma.type.ndim > 0 and not all(sigma.type.broadcastable):
        return "sigma is not a scalar"
    if _data_leaves(sigma, n):
        return "sigma reads the data"
    groups = {int(v.type.shape[0]) for v in swaps.values() if v.type.shape[0] is not None}
    if len(groups) != 1:
        from pymc.pytensorf import constant_fold

        try:
            groups = {int(constant_fold([v.shape[0]])[0]) for v in swaps.values()}
        except Exception:
            return "the number of groups is not known from the graph"
        if len(groups) != 1:
            return "the indexed vectors differ in length"
    (G,) = groups
    if G >= n:
        return f"{G} groups for {n} records"
    group_mean = pt.broadcast_to(pt.as_tensor(group_mean), (G,))
    return GroupStructure(obs, y_data, index, group_mean, pt.squeeze(sigma), n, G)


# -- 2. releases ------------------------------------------------------------------------------


class _AbsDeviationPasses:
    """``|y_i - c|`` as `pymc_dp.kernels.expfam.StatPasses` (exact counts; never publish)."""

    def __init__(self, y: np.ndarray) -> None:
        self.y = y

    def deviation_counts(self, centre, grid, scale) -> np.ndarray:
        dev = np.sort(np.abs(self.y - float(np.ravel(centre)[0])))
        grid = np.asarray(grid, dtype=float)
        return (dev.size - np.searchsorted(dev, grid, side="right")).astype(np.int64)


def release_centre(
    y: np.ndarray, box: tuple[float, float], noise_multiplier: float, rng: np.random.Generator
) -> float:
    """The DP mean of ``y`` clipped to its declared box (one Gaussian release).

    Replace-one sensitivity of ``sum_i clip(y_i, lo, hi) - mid`` is ``hi - lo``.
    """
    lo, hi = (float(v) for v in box)
    mid = 0.5 * (lo + hi)
    s = float(np.sum(np.clip(y, lo, hi) - mid))
    s += float(noise_multiplier) * (hi - lo) * float(rng.normal())
    return float(np.clip(mid + s / y.size, lo, hi))


def release_clip_bound(
    y: np.ndarray,
    centre: float,
    box: tuple[float, float],
    clip_noise_multiplier: float,
    tail_noise_multiplier: float,
    last_noise_multiplier: float,
    rng: np.random.Generator,
    on_clip=None,
    on_tail=None,
) -> tuple[float, tuple[float, float]]:
    """The clip bound ``b`` of ``|y_i - c|`` and `tail_bias_bounds` (two Gaussian releases):
    the DP quantile `GROUPSTATS_QUANTILE` (`pymc_dp.kernels.expfam.private_clip_bound`),
    then moved up by the released excess beyond ``b 2^j``
    (`pymc_dp.auto.suffstats.tail_clip_bound`)."""
    from pymc_dp.auto.suffstats import (
        STATS_EXTEND_SDS,
        STATS_LOCATED_SHARE,
        STATS_SCAN_SDS,
        STATS_TAIL_LEVELS,
        tail_clip_bound,
    )
    from pymc_dp.kernels.expfam import private_clip_bound, private_tail_excess

    passes = _AbsDeviationPasses(y)
    top = max(float(box[1]) - centre, centre - float(box[0]))
    c = np.array([centre])
    b = private_clip_bound(
        passes, c, None, top, y.size, GROUPSTATS_QUANTILE, clip_noise_multiplier, rng,
        extend_sds=STATS_EXTEND_SDS, located_share=STATS_LOCATED_SHARE,
        scan_sds=STATS_SCAN_SDS,
    )  # fmt: skip
    if on_clip is not None:
        on_clip()
    levels = b * 2.0 ** np.arange(STATS_TAIL_LEVELS)
    excess = private_tail_excess(passes, c, None, levels, tail_noise_multiplier, rng)
    if on_tail is not None:
        on_tail()
    bound = float(tail_clip_bound(b, max(top, b), excess, y.size, last_noise_multiplier))
    return bound, tail_bias_bounds(bound, top, levels, excess, tail_noise_multiplier)


#: Noise sds of the released tail excess added to it for its upper bound (`tail_bias_bounds`).
GROUPSTATS_TAIL_SDS = 2.0


def tail_bias_bounds(bound, top, levels, excess, tail_noise_multiplier) -> tuple[float, float]:
    """Bounds on what clipping at ``bound`` could take off the sums and the square beyond what
    a normal would (post-processing of the released excess).

    A record beyond ``L`` adds ``x_i = min((|u_i| - L) / L, 1)`` to the released excess ``X``
    (`pymc_dp.kernels.expfam.tail_excess`, by a midpoint rule within 1/64 of it); clipping it
    takes ``|u_i| - L <= x_i max(L, top - L)`` off its sum and ``u_i^2 - L^2 <= x_i max(L (top +
    L), top^2 - L^2)`` off the square (``top`` the largest deviation in the box). With ``U`` the
    released ``X`` at ``L`` plus `GROUPSTATS_TAIL_SDS` of its noise sds (at least 0), the
    clipped records' bias is at most ``U max(L, top - L)`` on a sum and ``U max(L (top + L),
    top^2 - L^2)`` on the square; zero where ``bound >= top`` (nothing inside the box is
    clipped). A tail heavier than the model's normal (wagepan's log wage: 4 records at 0.999 of
    4360 moved its ``sigma`` 0.66
    posterior sds without noise) is then doubt, not a bias: `noise_aware_group_loglik` adds
    the half-bounds to the sds.
    """
    if bound >= top:
        return 0.0, 0.0
    levels = np.asarray(levels, dtype=float)
    j = int(np.argmin(np.abs(levels - bound)))
    L = float(levels[j])
    X = float(np.ravel(excess)[j])
    U = max(X + GROUPSTATS_TAIL_SDS * float(tail_noise_multiplier) * np.sqrt(levels.size), 0.0)
    return U * max(L, top - L), U * max(L * (top + L), top**2 - L**2)


def _weights(b: float) -> np.ndarray:
    w0, w1, w2 = GROUPSTATS_WEIGHTS
    return np.array([w0, w1 / b, w2 / b**2])


def group_stats_sensitivity(b: float, weights=None) -> float:
    """Replace-one L2 sensitivity of the sum of ``(w_0 e_g, w_1 u e_g, w_2 u^2)``, ``|u| <= b``.

    A record changing group moves two groups' count and sum and the square: ``2 w_0^2 +
    w_1^2 (p + q) + w_2^2 (p - q)^2`` with ``p = u^2``, ``q = u'^2`` in ``[0, b^2]``, convex,
    so largest at a corner: ``2 w_0^2 + 2 w_1^2 b^2`` or ``2 w_0^2 + w_1^2 b^2 + w_2^2 b^4``.
    A record staying in its group moves its sum and the square: with ``d = |u' - u|`` and
    ``s = |u' + u|`` (``d + s <= 2b``), ``d^2 (w_1^2 + w_2^2 s^2)``, largest at ``s = 2b -
    d``: ``h(d) = d^2 (w_1^2 + w_2^2 (2b - d)^2)`` on ``[0, 2b]``, whose interior stationary
    points solve ``d^2 - 3 b d + 2 b^2 + w_1^2 / (2 w_2^2) = 0``. The sensitivity is the
    largest of these (exact; checked by brute force in the tests). Default weights: 2,
    below ``sqrt(2)`` times the largest record's norm (``sqrt(6)``); that bound of the
    issue does not hold in general: a record staying in its group moves its sum by ``2 w_1
    b``, beyond it where the sum's weight dominates.
    """
    w0, w1, w2 = _weights(b) if weights is None else np.asarray(weights, dtype=float)
    b = float(b)
    move = max(2 * w0**2 + 2 * (w1 * b) ** 2, 2 * w0**2 + (w1 * b) ** 2 + (w2 * b**2) ** 2)
    cands = [2.0 * b]
    if w2 > 0:
        disc = b**2 - 2.0 * w1**2 / w2**2
        if disc >= 0:
            cands += [(3 * b - np.sqrt(disc)) / 2, (3 * b + np.sqrt(disc)) / 2]
    stay = max(d**2 * (w1**2 + w2**2 * (2 * b - d) ** 2) for d in cands if 0 <= d <= 2 * b)
    return float(np.sqrt(max(move, stay)))


def group_stats_of_records(
    y: np.ndarray, g: np.ndarray, groups: int, centre: float, b: float, weights=None
) -> np.ndarray:
    """The exact weighted sum ``(w_0 n_g, w_1 S_g, w_2 Q)`` of the centred clipped records
    (the query of `release_group_stats`; never publish it)."""
    w0, w1, w2 = _weights(b) if weights is None else np.asarray(weights, dtype=float)
    u = np.clip(np.asarray(y, dtype=float) - centre, -b, b)
    counts = np.bincount(g, minlength=groups).astype(float)
    sums = np.bincount(g, weights=u, minlength=groups)
    return np.concatenate([w0 * counts, w1 * sums, [w2 * float(u @ u)]])


@dataclass(frozen=True)
class GroupStats:
    """Released per-group statistics of the centred clipped response (DP outputs)."""

    counts: np.ndarray
    sums: np.ndarray
    squares: float
    centre: float
    bound: float
    #: the release noise's sds of a count, a sum and the square
    count_sd: float
    sum_sd: float
    square_sd: float
    #: `tail_bias_bounds`: what clipping could take off a sum and the square beyond the
    #: model's normal (0: nothing inside the box clipped)
    sum_tail: float = 0.0
    square_tail: float = 0.0


def release_group_stats(
    y: np.ndarray,
    g: np.ndarray,
    groups: int,
    centre: float,
    b: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    tail: tuple[float, float] = (0.0, 0.0),
) -> GroupStats:
    """One Gaussian release of `group_stats_of_records` with sd ``z Delta``
    (`group_stats_sensitivity`), unscaled by post-processing (``tail``: `tail_bias_bounds`,
    carried to the noise-aware likelihood)."""
    w = _weights(b)
    std = float(noise_multiplier) * group_stats_sensitivity(b)
    T = group_stats_of_records(y, g, groups, centre, b)
    T = T + std * rng.normal(size=T.shape)
    G = int(groups)
    return GroupStats(
        T[:G] / w[0], T[G : 2 * G] / w[1], float(T[-1] / w[2]), float(centre), float(b),
        std / w[0], std / w[1], std / w[2], float(tail[0]), float(tail[1]),
    )  # fmt: skip


# -- 3. the noise-aware posterior -------------------------------------------------------------


def clipped_normal_moments(mean, sd, bound, xp=pt):
    r"""``E[u^k]``, ``k = 1..4``, of ``u = clip(x, -bound, bound)``, ``x ~ N(mean, sd)``.

    With ``alpha = (-bound - mean) / sd``, ``beta = (bound - mean) / sd`` and ``M_j =
    int_alpha^beta t^j phi(t) dt`` (``M_0 = Phi(beta) - Phi(alpha)``, ``M_1 = phi(alpha) -
    phi(beta)``, ``M_j = (j - 1) M_{j-2} + alpha^{j-1} phi(alpha) - beta^{j-1} phi(beta)``),
    ``E[u^k] = (-bound)^k Phi(alpha) + bound^k (1 - Phi(beta)) + sum_j C(k, j) mean^{k-j}
    sd^j M_j``. ``xp``: ``pytensor.tensor`` (differentiable) or ``numpy``.
    """
    if xp is pt:
        erfc = pt.erfc
    else:
        from scipy.special import erfc
    alpha = (-bound - mean) / sd
    beta = (bound - mean) / sd
    cdf_a = 0.5 * erfc(-alpha / np.sqrt(2.0))
    sf_b = 0.5 * erfc(beta / np.sqrt(2.0))
    pdf_a = xp.exp(-0.5 * alpha**2) / np.sqrt(2.0 * np.pi)
    pdf_b = xp.exp(-0.5 * beta**2) / np.sqrt(2.0 * np.pi)
    M = [1.0 - cdf_a - sf_b, pdf_a - pdf_b]
    for j in range(2, 5):
        M.append((j - 1) * M[j - 2] + alpha ** (j - 1) * pdf_a - beta ** (j - 1) * pdf_b)
    binom = [[1], [1, 1], [1, 2, 1], [1, 3, 3, 1], [1, 4, 6, 4, 1]]
    out = []
    for k in range(1, 5):
        inner = sum(binom[k][j] * mean ** (k - j) * sd**j * M[j] for j in range(k + 1))
        out.append((-bound) ** k * cdf_a + bound**k * sf_b + inner)
    return out


def noise_aware_group_loglik(stats: GroupStats, group_mean, sigma):
    r"""``log p(S~, Q~ | theta)`` to first order in the count noise (pytensor).

    Each record's ``u = clip(y - c, -b, b)`` with ``y ~ N(m_g, sigma)`` has the moments
    ``e_k = E[u^k]`` of a clipped normal (`clipped_normal_moments`: the clipping is modelled
    under the model's own likelihood, not a bias). With the released counts ``n~_g`` in place
    of the true ones, the residuals ``r_g = S~_g - n~_g e_1`` and ``r_Q = Q~ - sum_g n~_g
    e_2`` are Gaussian (the central limit theorem, Bernstein & Sheldon 2018) with mean 0 and
    covariance the sampling part (``Var S_g = n_g (e_2 - e_1^2)``, ``Var Q = sum_g n_g (e_4 -
    e_2^2)``, ``Cov(S_g, Q) = n_g (e_3 - e_1 e_2)``) plus the release noise (``s_S^2``,
    ``s_Q^2``) plus the count noise ``e_g ~ N(0, s_n^2)`` carried through (``-e_g e_1`` and
    ``-sum_g e_g e_2``), plus half the bounds of the clipped tail's bias beyond the normal's
    as sds (`tail_bias_bounds`).
    """
    n_hat = np.maximum(stats.counts, 1.0)
    m = pt.as_tensor(group_mean) - stats.centre
    sd = pt.as_tensor(sigma)
    e1, e2, e3, e4 = clipped_normal_moments(m, sd, stats.bound)
    sn2, sS2, sQ2 = stats.count_sd**2, stats.sum_sd**2, stats.square_sd**2
    r_s = stats.sums - stats.counts * e1
    r_q = stats.squares - pt.sum(stats.counts * e2)
    # the tail's possible bias (`tail_bias_bounds`) as doubt: half its bound added as an sd
    var_s = n_hat * (e2 - e1**2) + sS2 + sn2 * e1**2 + (0.5 * stats.sum_tail) ** 2
    cov_sq = n_hat * (e3 - e1 * e2) + sn2 * e1 * e2
    var_q = (
        pt.sum(n_hat * (e4 - e2**2)) + sQ2 + sn2 * pt.sum(e2**2) + (0.5 * stats.square_tail) ** 2
    )
    # the Q residual given the S residuals (block Gaussian; the S block is diagonal)
    cond_mean = pt.sum(cov_sq / var_s * r_s)
    cond_var = var_q - pt.sum(cov_sq**2 / var_s)
    log2pi = np.log(2.0 * np.pi)
    ll_s = -0.5 * pt.sum(r_s**2 / var_s + pt.log(var_s) + log2pi)
    ll_q = -0.5 * ((r_q - cond_mean) ** 2 / cond_var + pt.log(cond_var) + log2pi)
    return ll_s + ll_q


def noise_aware_group_model(model: pm.Model, structure: GroupStructure, stats: GroupStats):
    """The model's prior (its graph without the observed variable) and the noise-aware
    likelihood of the released statistics as a ``pm.Potential`` (data-free post-processing)."""
    from pymc.model.fgraph import ModelObservedRV, fgraph_from_model, model_from_fgraph
    from pytensor.graph.replace import graph_replace

    fg, _ = fgraph_from_model(model)
    drop = [
        i
        for i, out in enumerate(fg.outputs)
        if out.owner is not None and isinstance(out.owner.op, ModelObservedRV)
    ]
    for i in sorted(drop, reverse=True):
        fg.remove_output(i)
    new = model_from_fgraph(fg, mutate_fgraph=True)
    swaps = {model.rvs_to_values[rv]: new.rvs_to_values[new[rv.name]] for rv in model.free_RVs}
    m = graph_replace(structure.group_mean, swaps, strict=False)
    s = graph_replace(structure.sigma, swaps, strict=False)
    with new:
        pm.Potential("dp_groupstats_loglik", noise_aware_group_loglik(stats, m, s))
    return new


@dataclass
class GroupPosterior:
    """NUTS draws of the noise-aware posterior in the model's flat value space (DP outputs)."""

    draws: np.ndarray
    rhat: float
    divergences: int
    #: the blocks NUTS sampled in centred coordinates (`centred_sampling_model`), e.g.
    #: ``["z -> mu + tau * z"]``; empty: the model's own coordinates
    recentred: tuple[str, ...] = ()


class CentredSampling:
    """The noise-aware model's log density in centred coordinates, as a model NUTS samples.

    With the blocks of `pymc_dp.auto.recentre.find_recentring` (``a = loc + scale * z`` in
    place of a non-centred ``z``; ``u = v - loc(w)`` for a shifted block), ``y = T(q)`` of
    the flat value vector ``q`` and the density ``p_y(y) = p_q(T^{-1}(y)) / |det dT/dq|``,
    ``log |det dT/dq| = sum_k J_k log scale_k``: the same posterior, which NUTS explores in
    ``y`` without the non-centred ridge (Betancourt & Girolami 2015; with many records per
    group a non-centred ``z_j = (a_j - loc) / scale`` moves with ``scale`` while ``a_j`` is
    pinned by the statistics). Data-free: the map is the model graph's.

    Attributes
    ----------
    model : pm.Model
        One flat variable ``dp_centred`` (length ``d``) and a ``pm.Potential`` of
        ``log p_y``.
    describe : tuple of str
        The blocks, as `pymc_dp.auto.recentre.RecentredBlock.describe`.

    ``order`` (value variables' names) is the order of the flat vectors ``q`` (default: the
    noise-aware model's).
    """

    def __init__(self, noise_aware: pm.Model, blocks, order=None) -> None:
        import pytensor
        from pymc.pytensorf import join_nonshared_inputs
        from pytensor.graph.replace import clone_replace, graph_replace

        blocks = [b for b in blocks if not b.centred]
        ip = noise_aware.initial_point()
        by_value = {v.name: v for v in noise_aware.value_vars}
        vars = [by_value[k] for k in order] if order is not None else noise_aware.value_vars
        names = [v.name for v in vars]
        sizes = [int(np.prod(np.shape(ip[k]), dtype=int)) for k in names]
        starts = dict(zip(names, np.cumsum([0, *sizes[:-1]]).tolist(), strict=True))
        by_name = {rv.name: rv for rv in noise_aware.free_RVs}
        exprs = []
        for b in blocks:
            if b.shift:  # the prior's location, a graph of other free variables
                rv = by_name[b.name]
                exprs += [pt.constant(1.0), rv.owner.op.dist_params(rv.owner)[0]]
            else:
                exprs += [by_name[b.scale], by_name[b.loc] if b.loc else pt.constant(0.0)]
        exprs = noise_aware.replace_rvs_by_values(exprs)
        outs, x = join_nonshared_inputs(dict(ip), [noise_aware.logp(), *exprs], list(vars))
        logp_q, scale_loc_q = outs[0], outs[1:]
        self.d = int(sum(sizes))
        # y from q (the chains' start) and q from y (the draws), as in `Recentring`; a block's
        # scale and loc read only coordinates the map leaves as they are
        yv = x.type()
        scale_loc = clone_replace(scale_loc_q, replace={x: yv})
        y_of_x, x_of_y = x.copy(), yv.copy()
        logdet = pt.constant(0.0)
        for k, b in enumerate(blocks):
            vn = noise_aware.rvs_to_values[by_name[b.name]].name
            sl = slice(starts[vn], starts[vn] + sizes[names.index(vn)])
            scale, loc = scale_loc[2 * k], scale_loc[2 * k + 1]
            if b.shift:
                y_of_x = pt.set_subtensor(y_of_x[sl], x[sl] - scale_loc_q[2 * k + 1])
                x_of_y = pt.set_subtensor(x_of_y[sl], yv[sl] + loc)
                continue
            y_of_x = pt.set_subtensor(
                y_of_x[sl], scale_loc_q[2 * k + 1] + scale_loc_q[2 * k] * x[sl]
            )
            x_of_y = pt.set_subtensor(x_of_y[sl], (yv[sl] - loc) / scale)
            logdet = logdet + (sl.stop - sl.start) * pt.log(scale)
        logp_y = clone_replace(logp_q, replace={x: x_of_y}) - logdet
        self._to_q = pytensor.function([yv], x_of_y, on_unused_input="ignore")
        to_y = pytensor.function([x], y_of_x, on_unused_input="ignore")
        q0 = np.concatenate([np.ravel(ip[k]) for k in names]).astype(float)
        self.describe = tuple(b.describe() for b in blocks)
        with pm.Model(model=None) as self.model:  # not a child of a model in context
            flat = pm.Flat("dp_centred", shape=self.d, initval=np.asarray(to_y(q0), float))
            pm.Potential("dp_centred_logp", graph_replace(logp_y, {yv: flat}, strict=False))

    def to_q(self, y: np.ndarray) -> np.ndarray:
        """Draws ``(..., d)`` in ``y`` to the model's flat value space ``q``."""
        y = np.asarray(y, dtype=float)
        flat = y.reshape(-1, self.d)
        out = np.stack([np.asarray(self._to_q(row), dtype=float) for row in flat])
        return out.reshape(y.shape)


def centred_sampling_model(model: pm.Model, noise_aware: pm.Model) -> CentredSampling | None:
    """`CentredSampling` of ``noise_aware`` for the non-centred (and shifted) blocks that
    `pymc_dp.auto.recentre.find_recentring` finds in ``model`` (its graph with the
    likelihood: structure only), or ``None`` where there is none (data-free)."""
    from pymc_dp.auto.recentre import find_recentring

    blocks = [b for b in find_recentring(model, model.value_vars) if not b.centred]
    if not blocks:
        return None
    return CentredSampling(noise_aware, blocks, [v.name for v in model.value_vars])


def fit_group_posterior(
    model: pm.Model,
    structure: GroupStructure,
    stats: GroupStats,
    rng: np.random.Generator,
    draws: int | None = None,
    chains: int | None = None,
    recentre: bool = True,
) -> GroupPosterior:
    """NUTS on `noise_aware_group_model` (post-processing of the release), in centred
    coordinates where the model has a non-centred block (`centred_sampling_model`;
    ``recentre=False``: the model's own coordinates).

    Where the centred run has not converged (a divergence or R-hat above
    `GROUPSTATS_RHAT_WARN`: the centred funnel, where some group's statistics say little,
    e.g. the 66-record industries of wagepan under the clipped tail's doubt), the model's
    own coordinates are run too and the better converged run is kept (post-processing: both
    read only the release).
    """
    new = noise_aware_group_model(model, structure, stats)
    centred = centred_sampling_model(model, new) if recentre else None
    draws = GROUPSTATS_NUTS_DRAWS if draws is None else int(draws)
    chains = GROUPSTATS_NUTS_CHAINS if chains is None else int(chains)
    post = _nuts(model, new, centred, draws, chains, rng)
    if centred is not None and not _converged(post):
        other = _nuts(model, new, None, draws, chains, rng)
        post = min(post, other, key=lambda p: (not _converged(p), p.divergences, p.rhat))
    return post


def _converged(post: GroupPosterior) -> bool:
    return post.rhat <= GROUPSTATS_RHAT_WARN and post.divergences == 0


def _nuts(model, new, centred, draws, chains, rng) -> GroupPosterior:
    """One NUTS run of the noise-aware posterior, in ``centred``'s coordinates or (``None``)
    the model's own; the draws in the model's flat value space."""
    import warnings

    from pymc.sampling.mcmc import init_nuts
    from pymc.util import get_random_generator

    from pymc_dp.diagnostics import _rhat_ess
    from pymc_dp.report import _get_group

    seed = int(rng.integers(2**31 - 1))
    tune = min(draws, GROUPSTATS_NUTS_TUNE)
    with centred.model if centred is not None else new, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # `pm.sample`'s own NUTS initialisation (jitter+adapt_diag, its per-chain seeds) with
        # the step given: `pm.sample` then skips `assign_step_methods`' symbolic gradient of
        # the whole log density, built only to find that NUTS applies (0.4-1.3 s)
        chain_seeds = [r.integers(2**30) for r in get_random_generator(seed).spawn(chains)]
        start, step = init_nuts(
            init="jitter+adapt_diag", chains=chains, random_seed=chain_seeds, progressbar=False,
            tune=tune, target_accept=0.9,
        )  # fmt: skip
        idata = pm.sample(
            draws, tune=tune, chains=chains, cores=GROUPSTATS_NUTS_CORES, step=step,
            initvals=start, progressbar=False, random_seed=seed,
            compute_convergence_checks=False, idata_kwargs={"include_transformed": True},
        )  # fmt: skip
    post = _get_group(idata, "posterior")
    rhat = 1.0
    if centred is not None:
        y = np.asarray(post["dp_centred"].values, dtype=float)
        x = centred.to_q(y)
        rhat = float(np.nanmax(_rhat_ess(y)[0]))  # where NUTS ran; and in q below
    else:
        cols = []
        for v in model.value_vars:
            a = np.asarray(post[v.name].values, dtype=float)
            cols.append(a.reshape(a.shape[0], a.shape[1], -1))
        x = np.concatenate(cols, axis=2)
    rhat = max(rhat, float(np.nanmax(_rhat_ess(x)[0])))
    flat = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
    div = int(np.sum(_get_group(idata, "sample_stats")["diverging"].values))
    return GroupPosterior(flat, rhat, div, centred.describe if centred is not None else ())


# -- 4. planning (data-free) ------------------------------------------------------------------


#: Predicted error of the worst posterior mean, in NUTS posterior sds, per unit of ``z /
#: sqrt(n)`` (``z`` the last release's multiplier; public facts only): the worst parameter is
#: ``sigma``, whose information is the square's, its release noise ``z Delta b^2 / W_2``
#: against its sampling sd ``sqrt(2 n) sigma^2``. Fitted on bench_auto's hierarchy (n =
#: 20 000, 20 groups): the median error over ``z / sqrt(n)`` was 46.2 / 36.8 / 38.9 at
#: epsilon 1 / 3 / 10 (3, 5, 3 DP seeds; docs/auto.md); 41.2 is their geometric middle.
#: Not predictable from public facts: a response whose tail is heavier than the model's
#: normal (wagepan's log wage by industry: 138 at epsilon 3, the clipped tail's doubt,
#: `tail_bias_bounds`).
GROUPSTATS_ERROR_SCALE = 41.2


def group_stats_predicted_error(n: int, noise_multiplier: float) -> float:
    """The planned error of the strategy before any data (public facts only)."""
    return GROUPSTATS_ERROR_SCALE * float(noise_multiplier) / float(np.sqrt(n))


def data_box(structure: GroupStructure, data_bounds: Mapping | None):
    """The response's declared box, or ``None``."""
    keys = dict(data_bounds or {})
    for k in (structure.observed.name, "y"):
        if k in keys:
            lo, hi = keys[k]
            return float(lo), float(hi)
    return None
