"""The sufficient-statistics strategy of the automatic mode: noise-aware linear regression.

Where the likelihood is ``y_i ~ N(a + x_i^T b, sigma)`` (found in the PyMC graph by
`pymc_dp.records.expfam.find_expfam_structure`, never from the data) and the response and
every covariate have declared bounds (``data_bounds``), the whole likelihood is a function of
``A = sum z_i z_i^T``, ``r = sum z_i y_i`` and ``c = sum y_i^2`` (``z_i = (1, x_i)``): the
sum of the records' statistics ``T`` (`pymc_dp.kernels.expfam.normal_linear_stats`, the
monomials of degree at most two). The strategy releases them once and conditions on the
release (Bernstein & Sheldon 2019):

1. `release_box_centre`: the DP mean of ``T``, each statistic scaled to its range in the
   declared box (`pymc_dp.kernels.expfam.normal_linear_stat_box`); whence, by
   post-processing, the `Standardisation`: the covariates standardised and the response
   replaced by its residual from the least-squares line of that mean, over its sd. The
   statistics of the standardised variables are an exact affine function of ``T``;
2. `pymc_dp.kernels.expfam.private_whitening` on the standardised statistics: four small
   releases (their spread and second moment, two DP quantiles) give a whitening ``W``, and
   one more (its own share, `STATS_CLIP_SHARE`) the DP quantile ``b`` of the whitened
   deviations, moved up past the bins next to it that hold records (`STATS_EXTEND_SDS`)
   and past runs of bins whose sum holds records (`STATS_SCAN_SDS`); then one more
   (`STATS_TAIL_SHARE`) of the excess of the whitened deviations beyond ``b``, ``2b`` and
   ``4b`` (`pymc_dp.kernels.expfam.private_tail_excess`): the bound moves up to the first
   of these levels where the records beyond it would bias the sum by at most
   `STATS_TAIL_KAPPA` posterior sds, else to the largest whitened deviation inside the
   declared box (`tail_clip_bound`, `pymc_dp.kernels.expfam.normal_linear_deviation_bound`);
3. `release_whitened_sum`: ``sum_i clip_b(W (T_i - c)) + N(0, (2 b z)^2 I)`` with the rest
   of the budget, whence the released standardised ``A~, r~, c~`` and the covariance of
   their noise;
4. the noise-aware posterior ``p(theta | A~, r~, c~)``
   (`pymc_dp.kernels.suffstats.noise_aware_linear_loglik`, the model's line written in the
   standardised variables, plus the model's own prior, in the model's transformed
   coordinates), summarised by its median and central intervals by importance sampling
   from its mode and curvature, or by these where the two agree within the sampler's
   Monte Carlo error (`fit_stats_posterior`, `importance_moments`): draws are
   independent from that Gaussian (`pymc_dp.step_methods.laplace.DPLaplaceDraws`).

No data are read after step 3. Standardising the response by its residual puts the
statistics that carry the slopes (``e v``) at unit spread whatever the share of ``y`` the
covariates explain: the release's noise is that of the residuals. The records clipped by
``b`` bias the statistics; the noise-aware likelihood does not model that bias. The tail's
excess bounds it where the release can see it (at epsilon 3 and below its noise is
several times its threshold: a thin tail may still be clipped there, and a tail of
records each beyond ``8b`` counts only one level's worth). At small epsilon the
noise-aware posterior is not Gaussian (its spread in the coefficients grows with them,
through the noise of the design's statistics, and
``sigma`` is bounded above by the released residual sum of squares): its mode and
curvature put the truth beyond 2 of their sds in 6-8 % of (seed, parameter) pairs on gpa2
at epsilon 1 (docs/auto.md), its median and central intervals in 1.2 % and 0 %.

References
----------
.. [1] G. Bernstein, D. Sheldon, "Differentially private Bayesian linear regression",
   NeurIPS 2019. [BernsteinSheldon2019]
.. [2] S. Yildirim, B. Ermis, "Exact MCMC with differentially private moves", Statistics and
   Computing 29(5), 2019, Sec. 3.3 (the clipped, centred statistics). [YildirimErmis2019]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pymc as pm

from pymc_dp.kernels.expfam import (
    negative_hessian,
    normal_linear_deviation_bound,
    normal_linear_stat_box,
    private_centre,
    private_tail_excess,
    quadratic_fit,
)
from pymc_dp.kernels.suffstats import (
    LinearStats,
    linear_stats_from_sum,
    noise_aware_linear_loglik,
)
from pymc_dp.records.errors import ModelNotSupportedError

__all__ = [
    "STATS_CENTRE_SHARE",
    "STATS_CLIP_SHARE",
    "STATS_EXTEND_SDS",
    "STATS_IS_DRAWS",
    "STATS_LOCATED_SHARE",
    "STATS_QUANTILE",
    "STATS_SCAN_SDS",
    "STATS_TAIL_KAPPA",
    "STATS_TAIL_LEVELS",
    "STATS_TAIL_SHARE",
    "STATS_WHITENING_SHARE",
    "Standardisation",
    "STATS_ERROR_SCALE",
    "STATS_COARSE_GRID_BINS",
    "STATS_GRID_BINS",
    "StatsPosterior",
    "CATEGORICAL_REASON",
    "box_whitening",
    "categorical_reason",
    "covariates_without_range",
    "fit_stats_posterior",
    "importance_moments",
    "linear_stats_model",
    "release_box_centre",
    "release_linear_stats",
    "release_whitened_sum",
    "standardisation",
    "stats_last_share",
    "stats_predicted_error",
    "tail_clip_bound",
    "whitening_grid_bins",
    "whitening_locates",
]

#: Shares of the budget (``mu``) of the release of the statistics' centre (whence the
#: standardisation) and of the four releases that whiten the standardised statistics
#: (`pymc_dp.kernels.expfam.private_whitening`); the last release takes the rest. Chosen
#: on ``linear3`` (n = 20 000) and wagepan (n = 4360) at epsilon 1, 3, 10 (5 seeds each;
#: median of the max error in NUTS sds): (0.10, 0.03, clip 0.05) gave 1.45 / 0.56 / 0.21
#: and 10.3 / 3.1 / 1.07 against 1.48 / 0.62 / 0.23 and 11.1 / 2.9 / 1.21 with (0.10,
#: 0.06, 0.08), 1.60 / 0.56 / 0.20 and 18.3 / 2.9 / 1.03 with (0.05, 0.05, 0.05): a
#: smaller centre share loses at epsilon 1 on the real data (docs/auto.md).
STATS_CENTRE_SHARE = 0.1
STATS_WHITENING_SHARE = 0.03
#: Share of the DP quantile that sets the last release's clip bound (its own: the records it
#: clips bias the statistics, `STATS_EXTEND_SDS`).
STATS_CLIP_SHARE = 0.05

#: The clip bound moves up past the bins next to it holding this many noise sds
#: (`pymc_dp.kernels.warmstart.histogram_quantile`'s ``extend_sds``), as the one-shot
#: strategy's last releases do.
STATS_EXTEND_SDS = 2.0

#: Where the clip bound's noisy histogram locates (in bins above its noise threshold) less
#: than this share of the records, the bound is the largest deviation inside the box
#: (`pymc_dp.kernels.expfam.private_clip_bound`): measured on a 400-record regression at
#: epsilon 0.5, the histogram was noise only, the quantile among its (empty) located bins
#: was the grid's smallest bound, nearly every record was clipped, and the released
#: statistics were the centre's noise with a noise model that did not include it.
STATS_LOCATED_SHARE = 0.8

#: Share of records left unclipped by the whitened statistics' clip bound (the DP quantile).
STATS_QUANTILE = 0.999

#: The clip bound then moves up, a bin at a time, while some run of bins above it holds a
#: noisy sum beyond what the quantile allows by this many sds of the run's noise
#: (`pymc_dp.kernels.expfam.scan_tail`). Measured on gpa2 at epsilon 1 (seeds 100-119, not
#: the benchmark's): the per-bin threshold left tails of 350-515 records spread thinly over
#: 15 bins unseen on 4 of 20 seeds, clipped them, and biased the released sum by 37-64
#: noise sds (its norm); with the scan at 3 sds the largest bias was 30 noise sds on one
#: seed, under 10 on the others, and the share of (seed, parameter) pairs beyond 2 own sds
#: 3.1 % -> 1.2 % (with `importance_moments`) at the same median error; at epsilon 3 and 10
#: the bounds did not move. At 2 sds the bias fell further but the bounds grew 1.3-1.8
#: times and the error with them.
STATS_SCAN_SDS = 3.0


#: Share of the release of the tail's excess beyond the clip bound (`tail_clip_bound`).
#: Measured on census 2000 (log weekly income, n = 29 501, random_seed 1-3 at epsilon 1, 3,
#: 10; docs/auto.md): with 0.05 and four levels the excess's noise (sd 4.8 at epsilon 10)
#: was as large as the first level's bar and 2 of 45 (seed, parameter) pairs stayed beyond
#: 2 own sds; with 0.1 and three levels 0 of 45 (10 of 45 without the release), 0 of 100
#: and 1 of 100 on seeds 10-29 at epsilon 10 and 3; on linear3b (no tail) the bound did
#: not move on the seeds checked.
STATS_TAIL_SHARE = 0.1
#: Its levels: the DP quantile's bound ``b`` times ``2^j``, ``j < STATS_TAIL_LEVELS``.
STATS_TAIL_LEVELS = 3
#: A level is the last release's bound where the released excess beyond it, in units of
#: the level, is at most this share of the noise-aware posterior's sd per whitened
#: statistic (``sqrt(n + (2 L z)^2)``: the sampling sd of a sum of ``n`` whitened
#: deviations and the release's noise at that bound).
STATS_TAIL_KAPPA = 0.5


#: Share of the records the plain DP quantiles of the whitening (its releases 2 and 4,
#: `pymc_dp.kernels.expfam.private_whitening`) must be expected to locate (in bins above
#: their noise threshold) for `whitening_locates`. Where none is located the quantile is
#: the grid's bottom and the whitening scales the deviations up ~1000 times
#: (docs/auto-measured.md, the 400-record normal model); at 0.5 ideal data were "not
#: located" on regressions of 1000 records (k = 2, uniform covariates, epsilon 3) whose
#: whitening worked on 3 of 3 seeds.
STATS_PLAIN_LOCATED_SHARE = 0.1

#: Data-free stand-in records of `whitening_locates` (standard normal response and
#: covariates, ``numpy.random.default_rng(0)``).
STATS_STAND_IN_RECORDS = 20_000


@functools.lru_cache(maxsize=8)
def _stand_in_norms(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Norms of the deviations of data-free stand-in records' statistics (standard normal
    ``e`` and ``v``, `pymc_dp.kernels.expfam.normal_linear_stats`) from their mean: as
    released 2 (standardised), 4 (over their mean absolute deviation) and 6 (whitened by
    their covariance) by `pymc_dp.kernels.expfam.private_whitening` on ideal data."""
    from pymc_dp.kernels.expfam import normal_linear_stats

    gen = np.random.default_rng(0)
    e = gen.normal(size=STATS_STAND_IN_RECORDS)
    v = gen.normal(size=(STATS_STAND_IN_RECORDS, int(k)))
    dev = normal_linear_stats(e, v)
    dev -= dev.mean(axis=0)
    lam, U = np.linalg.eigh(np.cov(dev.T).reshape(dev.shape[1], dev.shape[1]))
    W = (U * np.maximum(lam, 1e-12) ** -0.5) @ U.T
    return (
        np.linalg.norm(dev, axis=1),
        np.linalg.norm(dev / np.abs(dev).mean(axis=0), axis=1),
        np.linalg.norm(dev @ W.T, axis=1),
    )


def _best_located_share(norms: np.ndarray, n: int, bar: float, bins: int) -> float:
    """The largest share of ``n`` records distributed as ``norms`` that the quantiles' log
    grid (`pymc_dp.kernels.expfam.private_clip_bound`) holds in bins of at least ``bar``
    expected records, over eight alignments of the grid (data-free)."""
    from pymc_dp.kernels.expfam import CLIP_GRID_DECADES

    per_decade = (int(bins) - 1.0) / CLIP_GRID_DECADES
    best = 0.0
    for offset in np.arange(8) / 8.0:
        _, counts = np.unique(
            np.floor(np.log10(np.maximum(norms, 1e-300)) * per_decade + offset), return_counts=True
        )
        expected = counts * (float(n) / norms.size)
        best = max(best, float(expected[expected >= bar].sum()) / float(n))
    return best


def whitening_locates(
    n: int,
    k: int,
    whitening_noise_multiplier: float,
    clip_noise_multiplier: float,
    bins: int | None = None,
) -> bool:
    """Whether the whitening's noisy histograms can locate ``n`` records (data-free).

    Public facts only: ``n``, the covariates' count ``k`` and the releases' multipliers. The
    histograms of `pymc_dp.kernels.expfam.private_whitening` (releases 2, 4 and 6 of
    `release_linear_stats`) count the records' deviation norms in log bins of 1/16 decade
    with noise sd ``sqrt(2) z`` per bin; a bin counts where it passes its threshold (4.2
    sds for the plain quantiles, `pymc_dp.kernels.expfam.QUANTILE_FAMILY_WISE`, 3 for the
    clip bound's, `pymc_dp.kernels.warmstart.HISTOGRAM_THRESHOLD_SDS`). Ideal data
    (standard normal response and covariates, `_stand_in_norms`) spread over some 15-20
    bins; at small ``n`` each holds less than the threshold and, whatever the data, the
    clip bound's histogram then locates less than `STATS_LOCATED_SHARE` and its bound is
    the box's (`pymc_dp.kernels.expfam.private_clip_bound`), or the plain quantiles
    locate nothing and the whitening is noise. True where the expected histograms of ideal
    data (the best of eight grid alignments) locate at least `STATS_PLAIN_LOCATED_SHARE`
    (releases 2 and 4) and `STATS_LOCATED_SHARE` (release 6) of the records. (Records
    less spread than normal ones, e.g. uniform or indicator covariates, are located more
    easily: False may then forgo a whitening that would have worked.) Measured on
    400 records ``x ~ N(1, 2)`` (docs/auto-measured.md): False at epsilon 1 and 3, where
    the whitening fell back to the box on 4 and 5 of 5 seeds, True at epsilon 10, where
    it located on 4 of 5; on 1000 records True at epsilon 3 (located on 2 of 3 seeds),
    False at epsilon 1 (0 of 3).
    """
    from pymc_dp.kernels.expfam import CLIP_GRID_BINS, QUANTILE_FAMILY_WISE
    from pymc_dp.kernels.warmstart import (
        HISTOGRAM_SENSITIVITY,
        HISTOGRAM_THRESHOLD_SDS,
        bonferroni_sds,
    )

    bins = CLIP_GRID_BINS if bins is None else int(bins)
    r2, r4, r6 = _stand_in_norms(int(k))
    plain = bonferroni_sds(bins + 1, QUANTILE_FAMILY_WISE) * HISTOGRAM_SENSITIVITY
    plain *= float(whitening_noise_multiplier)
    clip = HISTOGRAM_THRESHOLD_SDS * HISTOGRAM_SENSITIVITY * float(clip_noise_multiplier)
    return (
        _best_located_share(r2, n, plain, bins) >= STATS_PLAIN_LOCATED_SHARE
        and _best_located_share(r4, n, plain, bins) >= STATS_PLAIN_LOCATED_SHARE
        and _best_located_share(r6, n, clip, bins) >= STATS_LOCATED_SHARE
    )


#: The whitening's quantile grids tried, finest first (`whitening_grid_bins`): 80 bounds
#: over five decades (1/16 decade a bin, `pymc_dp.kernels.expfam.CLIP_GRID_BINS`), then,
#: for a model without covariates only, coarser ones whose wider bins each hold more
#: records (`STATS_COARSE_GRID_BINS`).
STATS_GRID_BINS = (80,)
#: Measured on 400 records ``x ~ N(1, 2)`` at epsilon 3 (seeds 0-4): 40 bounds located on
#: every seed (sigma's sd 0.08-0.26 where the box's clip gave 0.45-1.2). On a regression
#: (1000 records, k = 2, epsilon 3, seeds 0-2) 40 bounds gave an intercept sd of 0.67 on
#: one seed where 80 gave 0.036, and 20 bounds at epsilon 1 were worse than the box's clip
#: (errors 13-30 against 9-13 OLS sds): not used with covariates.
STATS_COARSE_GRID_BINS = (40, 20)


def whitening_grid_bins(
    n: int, k: int, whitening_noise_multiplier: float, clip_noise_multiplier: float
) -> int | None:
    """The finest of `STATS_GRID_BINS` (and, without covariates, `STATS_COARSE_GRID_BINS`)
    on which the whitening's histograms locate ``n`` records (`whitening_locates`), or
    ``None`` (the box's clip; data-free).

    A coarser grid locates fewer records (wider bins, fewer of them to threshold) at the
    price of a coarser quantile (a bound up to one bin, a factor ``10^(5 / (bins - 1))``,
    too high). Measured on 400 records ``x ~ N(1, 2)`` at epsilon 3 (seeds 0-4,
    docs/auto-measured.md): 80 bins never located (the box's clip: sigma's posterior sd
    0.45-1.2, up to 12 NUTS sds off); 40 bins located on every seed, sigma's sd
    0.08-0.26."""
    grids = STATS_GRID_BINS + (STATS_COARSE_GRID_BINS if int(k) == 0 else ())
    for bins in grids:
        if whitening_locates(n, k, whitening_noise_multiplier, clip_noise_multiplier, bins):
            return int(bins)
    return None


def stats_last_share() -> float:
    """The last release's share of ``mu``: what the fixed shares leave."""
    return 1.0 - STATS_CENTRE_SHARE - STATS_WHITENING_SHARE - STATS_CLIP_SHARE - STATS_TAIL_SHARE


def tail_clip_bound(
    b: float, top: float, excess: np.ndarray, n: int, noise_multiplier: float
) -> float:
    """The last release's clip bound from the released excess beyond ``b 2^j``
    (post-processing; `pymc_dp.kernels.expfam.private_tail_excess`).

    The DP quantile ``b`` leaves about ``n (1 - q)`` records beyond it and cannot say how
    far: a tail spread thinly over many bins, each below the histogram's noise, is
    clipped whole (census 2000 at epsilon 10: 28 records clipped by up to 40 at ``b =
    18``, the sum of the squared response 14 noise sds short, docs/auto.md). The released
    excess ``X_j`` (each record's part beyond ``L_j = b 2^j``, capped at ``L_j``, in units
    of ``L_j``) measures it with the noise of a count. The bound is the first level whose
    excess, ``L_j X_j``, is at most ``STATS_TAIL_KAPPA`` times the noise-aware posterior's
    sd per whitened statistic, ``sqrt(n + (2 L_j z)^2)`` (``z`` the last release's
    multiplier); where none is, ``top`` (the largest whitened deviation inside the
    declared box: no record inside the box is clipped). Levels at or above ``top`` give
    ``top``.
    """
    levels = float(b) * 2.0 ** np.arange(np.size(excess))
    for level, x in zip(levels, np.ravel(excess), strict=True):
        if level >= top:
            break
        sd = np.sqrt(n + (2.0 * level * float(noise_multiplier)) ** 2)
        if level * float(x) <= STATS_TAIL_KAPPA * sd:
            return float(level)
    return float(top)


#: Predicted error of the worst posterior mean, in NUTS posterior sds, per unit of
#: ``D z / sqrt(n)`` (``D`` statistics, ``z`` the last release's noise multiplier; public
#: facts only): fitted on the benchmark's 5 seeds (docs/auto.md) of ``linear3b`` (n =
#: 20 000, k = 3, covariates filling their box), gpa2 and wagepan (n = 4137 and 4360, k = 6,
#: real covariates), epsilon 1, 3, 10: the median error over ``D z / sqrt(n)`` was 3.3-3.9
#: on ``linear3b``, 3.2-7.1 on the real data; 4.6 is the geometric middle of that range,
#: every one of the nine cells within 1.6 times. The noise of each whitened statistic is
#: ``2 b z`` with the clip bound ``b`` near ``sqrt(D)``, whence ``sqrt(D) z / sqrt(n)`` in
#: posterior sds; the second ``sqrt(D)`` is empirical (the worst of ``k + 2`` parameters,
#: the design's noise acting through ``k`` coefficients, and the heavier whitened tails
#: of the real data's rare indicators, which these three data sets cannot separate). Not
#: predictable from public facts: a response whose spread is a small part of its declared
#: range and heavy-tailed (nettfa: sd 0.03 of its range; 37-56 times this prediction); the
#: run's released predicted error (`StatsPosterior.predicted_error`) says so
#: (`pymc_dp.NoiseDominatedWarning`).
STATS_ERROR_SCALE = 4.6


def stats_predicted_error(n: int, k: int, noise_multiplier: float) -> float:
    """The planned error of the strategy before any data: ``STATS_ERROR_SCALE D z /
    sqrt(n)`` posterior sds, ``D = 2 + 2k + k(k+1)/2`` the statistics of ``k`` covariates
    (public facts only: the model's structure, ``n`` and the budget)."""
    dim = 2 + 2 * k + k * (k + 1) // 2
    return STATS_ERROR_SCALE * float(dim) * float(noise_multiplier) / float(np.sqrt(n))


def linear_stats_model(
    model: pm.Model, vars: list, initial_point: Mapping[str, Any], data_bounds: Mapping | None
):
    """The model's linear-Gaussian likelihood, compiled, and the range of its statistics.

    Data-free (the model's graph and the declared bounds). Returns ``(fm, (lo, hi))`` with
    ``fm`` a `pymc_dp.records.expfam.ExpFamilyModel` and ``lo``, ``hi`` the range of each
    statistic over the declared box (`pymc_dp.kernels.expfam.normal_linear_stat_box`), or
    ``(None, reason)`` where the strategy does not apply: another likelihood, or bounds
    missing for the response or a covariate.
    """
    from pymc_dp.records.expfam import find_expfam_structure

    try:
        structure = find_expfam_structure(model)
    except ModelNotSupportedError as err:
        return None, str(err)
    if structure.family.name != "normal_linear":
        return None, f"the likelihood is {structure.family.name}, not a linear regression"
    keys = set(data_bounds or {})
    y_name = getattr(structure._y_node, "name", None)
    response = structure.response_name
    if not keys & {"y", response, y_name}:
        return None, (
            f"data_bounds does not give the response's range: declare data_bounds="
            f"{{{response!r}: (lo, hi)}}"
        )
    indexing = structure.indexing_covariates()
    if indexing:
        return None, categorical_reason(indexing)
    why = covariates_without_range(structure, keys)
    if why:
        return None, why
    try:
        fm = structure.compile(vars, dict(initial_point), {})
    except ModelNotSupportedError as err:
        return None, str(err)
    try:
        y_box, x_box = fm.box_pairs(data_bounds)
    except ValueError as err:
        return None, str(err)
    if y_box is None:
        return None, (
            f"data_bounds does not give the response's range: declare data_bounds="
            f"{{{response!r}: (lo, hi)}}"
        )
    if x_box is None:
        x_box = (np.zeros(0), np.zeros(0))
    return fm, normal_linear_stat_box(y_box, x_box)


#: The start of `linear_stats_model`'s reason where the mean indexes a vector by a
#: categorical (the automatic mode warns with it, `pymc_dp.auto.configure._stats_hint`).
CATEGORICAL_REASON = "the mean indexes"


def categorical_reason(indexing: Mapping[str, tuple[str | None, int | None]]) -> str:
    """Why a linear regression with a categorical predictor written by indexing
    (``a[idx]``) is not taken, and the writing that is: its indicator columns in a
    ``pm.Data`` container, whose range (0, 1) is public by construction. Data-free (the
    names and lengths of the indexed vectors)."""
    (name, length), *_ = indexing.values()
    vec = name or "a"
    k = str(length) if length is not None else "K"
    which = ", ".join(sorted({repr(n) for n, _ in indexing.values() if n})) or "a vector"
    return (
        f"{CATEGORICAL_REASON} {which} by an integer array with one row per record (a "
        f"categorical predictor, {vec}[idx]), which the sufficient-statistics strategy does "
        f"not read: write it as indicator columns in a pm.Data container, "
        f"pm.math.dot(pm.Data('{vec}_onehot', np.eye({k})[idx]), {vec}), and declare their "
        f"range, data_bounds={{'{vec}_onehot': (0, 1)}} (an indicator's range is public)"
    )


def covariates_without_range(structure, keys) -> str:
    """The covariates of ``structure`` whose range ``keys`` (the declared names) leave
    undeclared, in the user's terms: ``pm.Data`` names to declare, or numpy arrays written
    into the model (no name to declare a range by) to put in a ``pm.Data`` container;
    ``""`` if none (data-free)."""
    if "X" in keys:
        return ""  # 'X' (a pm.Data container's name) gives every covariate's range
    unnamed = structure.unnamed_covariates()
    named = [
        c
        for c, x in zip(structure.covariate_names, structure._x_nodes, strict=True)
        if x.name and c not in keys
    ]
    parts = []
    if named:
        example = ", ".join(f"{c!r}: (lo, hi)" for c in named)
        parts.append(
            f"the range of the pm.Data covariates {named}: declare data_bounds={{{example}}}"
        )
    if unnamed:
        parts.append(
            f"a range for {len(unnamed)} numpy array(s) written into the model with one row "
            f"per record ({'; '.join(unnamed)}), which have no name to declare it by: wrap "
            "each in pm.Data('name', array) and declare data_bounds={'name': (lo, hi)}"
        )
    return ("data_bounds does not give " + "; nor ".join(parts)) if parts else ""


@dataclass(frozen=True)
class Standardisation:
    """The public affine map to standardised residual variables (DP outputs).

    From a released centre of the statistics: ``v = (x - m_x) / s_x`` and
    ``e = (y - m_y - (x - m_x)^T g) / s_e``, ``g`` the least-squares slopes and ``s_e`` the
    residual sd that the centre's moments give. Since the statistics are the monomials of
    degree at most two, those of ``(e, v)`` are an exact affine function of those of
    ``(y, x)``: ``T(e, v) = M T(y, x) + t0``. In ``(e, v)`` the coordinates that carry the
    slopes (``e v``) have unit spread and are nearly uncorrelated with the design's
    (``v v^T``), so one clip bound fits them all: the release's noise is that of the
    residuals, not of ``y`` (whose spread the design explains in part) nor of the box.
    """

    mean_y: float
    mean_x: np.ndarray
    sd_x: np.ndarray
    slopes: np.ndarray
    sd_e: float
    M: np.ndarray
    t0: np.ndarray

    def coefficients(self, w: np.ndarray, sigma: float) -> tuple[np.ndarray, float]:
        """``(a, b), sigma`` of ``y = a + x^T b + eps`` as the same line in ``(e, v)``."""
        a, b = float(w[0]), np.asarray(w[1:], dtype=float)
        alpha = (a + float(self.mean_x @ b) - self.mean_y) / self.sd_e
        gamma = self.sd_x * (b - self.slopes) / self.sd_e
        return np.concatenate([[alpha], gamma]), float(sigma) / self.sd_e

    def line(self, coef: np.ndarray, sigma: float) -> tuple[np.ndarray, float]:
        """The inverse of `coefficients`: ``(alpha, gamma), sigma'`` back to ``(a, b), sigma``."""
        b = self.slopes + np.asarray(coef[1:], dtype=float) * self.sd_e / self.sd_x
        a = self.mean_y + self.sd_e * float(coef[0]) - float(self.mean_x @ b)
        return np.concatenate([[a], b]), float(sigma) * self.sd_e


def standardisation(centre: np.ndarray, k: int, noise_sd=0.0) -> Standardisation:
    """The standardising map from a released mean of the statistics (post-processing).

    Means, covariances and the least-squares line are read off the centre (``E[y]``,
    ``E[y^2]``, ``E[x y]``, ``E[x]``, ``E[x x^T]``); a variance is floored at three times
    ``noise_sd`` (a number, or one per statistic), the sd of the centre's noise on the
    statistic that gives it (below that it is noise:
    the map stays exact, only less standardising), and so are the eigenvalues of the
    covariates' correlation matrix (relative to ``noise_sd``) before it is inverted. ``M``
    and ``t0`` are solved from data-free stand-in points (the relation is exact: least
    squares with a zero residual).
    """
    from pymc_dp.kernels.expfam import normal_linear_stats

    c = np.asarray(centre, dtype=float)
    j, jj = np.triu_indices(k)
    m_y, m_x = float(c[0]), c[2 + k : 2 + 2 * k].copy()
    exx = np.empty((k, k))
    exx[j, jj] = exx[jj, j] = c[2 + 2 * k :]
    floor = 3.0 * np.broadcast_to(np.asarray(noise_sd, dtype=float), c.shape)
    cov_x = exx - np.outer(m_x, m_x)
    floor_x = np.maximum(floor[2 + 2 * k + np.flatnonzero(j == jj)], 1e-12)
    s_x = np.sqrt(np.maximum(np.diag(cov_x), floor_x))
    var_y = max(float(c[1 + k]) - m_y**2, float(floor[1 + k]), 1e-12)
    cov_xy = c[1 : 1 + k] - m_x * m_y
    if k:
        corr = cov_x / np.outer(s_x, s_x)
        lam, U = np.linalg.eigh(0.5 * (corr + corr.T))
        lam = np.maximum(lam, max(float(np.max(floor_x / s_x**2)), 1e-3))
        g = (U / lam) @ U.T @ (cov_xy / s_x) / s_x  # slopes: Cov(x)^-1 Cov(x, y)
        var_e = var_y - float(g @ cov_xy)
    else:
        g, var_e = np.zeros(0), var_y
    s_e = float(np.sqrt(max(var_e, float(floor[1 + k]), 1e-3 * var_y)))
    dim = c.size
    gen = np.random.default_rng(0)  # data-free stand-in points
    e = gen.normal(size=4 * (dim + 1))
    v = gen.normal(size=(e.size, k))
    x = m_x + s_x * v
    y = m_y + (x - m_x) @ g + s_e * e
    design = np.column_stack([normal_linear_stats(y, x), np.ones(e.size)])
    coef = np.linalg.lstsq(design, normal_linear_stats(e, v), rcond=None)[0]
    return Standardisation(m_y, m_x, s_x, g, s_e, coef[:-1].T, coef[-1])


def release_box_centre(
    passes,
    box: tuple[np.ndarray, np.ndarray],
    n: int,
    noise_multiplier: float,
    rng: np.random.Generator,
    size: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The DP centre of the statistics from their ranges in the declared box (one release).

    Each statistic's deviation from the middle of its range, over its half-width: a record
    inside the box has a scaled deviation of norm at most ``C = sqrt(D)``; every record's is
    clipped to ``C`` (records outside the box too), so the sum has replace-one sensitivity
    ``2 C`` and ``N(0, (2 C z)^2 I)`` noise makes it one Gaussian mechanism. Returns the
    centre ``mid + (sum + noise) / (n w)`` (``size`` independent releases: shape
    ``(size, D)``) and the sd of its noise on each statistic.
    """
    lo, hi = (np.asarray(a, dtype=float) for a in box)
    mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    w = 1.0 / np.where(half > 0, half, 1.0)  # (a constant statistic deviates by 0 in the box)
    C = float(np.sqrt(mid.size))  # the largest scaled deviation inside the box
    scaled = private_centre(
        passes.centred_clip_sum(mid, C, scale=w), n, C, noise_multiplier, rng, size
    )
    return mid + scaled / w, float(noise_multiplier) * 2.0 * C / (n * w)


def release_whitened_sum(
    passes, whitening, noise_multiplier: float, rng: np.random.Generator, size: int | None = None
) -> np.ndarray:
    """``sum_i clip_b(W (T_i - c)) + N(0, (2 b z)^2 I)``: the strategy's last release.

    ``whitening`` (`pymc_dp.kernels.expfam.Whitening`: ``c``, ``W``, ``b``) is public (DP
    outputs of earlier releases); each record's whitened deviation is clipped to norm ``b``,
    so the sum has replace-one sensitivity ``2 b``. ``size``: that many independent
    releases (shape ``(size, D)``; the audit's trials).
    """
    S = passes.centred_clip_sum(whitening.centre, whitening.clip, scale=whitening.scale)
    shape = S.shape if size is None else (int(size), S.size)
    return S + float(noise_multiplier) * 2.0 * float(whitening.clip) * rng.normal(size=shape)


def release_linear_stats(
    fm,
    box: tuple[np.ndarray, np.ndarray],
    *,
    centre_noise_multiplier: float,
    whitening_noise_multiplier: float | None,
    clip_noise_multiplier: float | None,
    noise_multiplier: float,
    rng: np.random.Generator,
    tail_noise_multiplier: float | None = None,
    quantile: float | None = None,
    on_centre_release: Callable[[], None] | None = None,
    on_whitening_release: Callable[[], None] | None = None,
    on_clip_release: Callable[[], None] | None = None,
    on_tail_release: Callable[[], None] | None = None,
    on_release: Callable[[], None] | None = None,
    chunk_size: int | None = None,
    on_box_clip: Callable[[], None] | None = None,
    grid_bins: int | None = None,
) -> tuple[LinearStats, Standardisation]:
    """Steps 1 and 2 of the module docstring: the released statistics and their noise.

    ``box`` is the range of each statistic inside the declared box
    (`pymc_dp.kernels.expfam.normal_linear_stat_box`): the first release sums the deviations
    from its midpoint scaled by its half-widths (norm at most ``C = sqrt(D)`` inside the box,
    clipped to it outside; sensitivity ``2 C``).
    Three Gaussian releases: the DP centre of the statistics (`private_centre`), whence the
    standardisation; a DP ``quantile`` ``b`` of the standardised deviations
    ``||T(u_i, v_i) - c_u||`` (noisy histogram); the sum ``sum_i clip_b(T(u_i, v_i) - c_u)``
    (sensitivity ``2 b``). Returns the standardised statistics (noise covariance
    ``(2 b z)^2 I``) and the map. Every release is counted by its callback as soon as its
    exact input reached the driver. Where the box's own clip (`box_whitening`) gives the
    last release less noise than the whitened clip, it is used and ``on_box_clip`` called.
    ``whitening_noise_multiplier=None`` (planned from public facts where the whitening's
    histograms cannot locate the records, `whitening_locates`): releases 2-7 are not made
    and the last release takes the box's clip. ``grid_bins``: the whitening's quantile grids'
    bounds (public, `whitening_grid_bins`).
    """
    from pymc_dp.kernels.expfam import private_whitening

    n, k = fm.n_records, fm.n_covariates
    fm.structure.check_data_finite()  # one bit; refuses before any release
    passes = fm.passes(chunk_size or 100_000)
    # -- release 1: the DP centre of the statistics, each scaled to its range in the box -----
    c, centre_sd = release_box_centre(passes, box, n, centre_noise_multiplier, rng)
    if on_centre_release is not None:
        on_centre_release()
    lo, hi = (np.asarray(a, dtype=float) for a in box)
    C = float(np.sqrt(lo.size))
    st = standardisation(c, k, noise_sd=centre_sd)
    c_u = st.M @ c + st.t0
    std_passes = _StandardisedPasses(passes, st.M, c, c_u)
    made = 0

    def whitening_release() -> None:  # releases 2-5, then 6 (the clip bound's own phase)
        nonlocal made
        made += 1
        callback = on_whitening_release if made <= 4 else on_clip_release
        if callback is not None:
            callback()

    if whitening_noise_multiplier is None:
        # -- planned (data-free) without the whitening: release 1's box clip, then the sum --
        wh = box_whitening(st, box)
        return _last_release(std_passes, wh, n, k, noise_multiplier, rng, on_release), st
    reach = np.maximum(np.abs(lo - c), np.abs(hi - c))  # the largest deviations in the box
    top = float(np.linalg.norm(st.M, 2) * np.linalg.norm(reach))
    # -- releases 2-6: whitening and clip bound of the standardised statistics ----------------
    wh = private_whitening(
        std_passes,
        n=n,
        stat_clip_bound=C,
        quantile=STATS_QUANTILE if quantile is None else quantile,
        noise_multiplier=whitening_noise_multiplier,
        rng=rng,
        centre=c_u,
        on_release=whitening_release,
        top=top,
        clip_noise_multiplier=clip_noise_multiplier,
        clip_extend_sds=STATS_EXTEND_SDS,
        clip_located_share=STATS_LOCATED_SHARE,
        clip_scan_sds=STATS_SCAN_SDS,
        grid_bins=grid_bins,
    )
    if tail_noise_multiplier is not None:
        # -- release 7: the excess beyond b 2^j, whence the last bound ----------------------
        y_box = (lo[0], hi[0])
        x_box = (lo[2 + k : 2 + 2 * k], hi[2 + k : 2 + 2 * k])
        top_w = normal_linear_deviation_bound(
            wh.scale @ st.M, std_passes._centre(wh.centre), y_box, x_box
        )
        levels = wh.clip * 2.0 ** np.arange(STATS_TAIL_LEVELS)
        excess = private_tail_excess(
            std_passes, wh.centre, wh.scale, levels, tail_noise_multiplier, rng
        )
        if on_tail_release is not None:
            on_tail_release()
        clip = tail_clip_bound(wh.clip, max(top_w, wh.clip), excess, n, noise_multiplier)
        wh = replace(wh, clip=clip)
    # the box's own clip (release 1's query at the last release's multiplier) where its noise
    # is smaller than the whitened one's (post-processing of the releases' outputs)
    chosen = _smaller_noise(wh, box_whitening(st, box))
    if chosen is not wh and on_box_clip is not None:
        on_box_clip()
    return _last_release(std_passes, chosen, n, k, noise_multiplier, rng, on_release), st


def _last_release(std_passes, wh, n: int, k: int, noise_multiplier: float, rng, on_release):
    """Release 8: the clipped whitened standardised deviations' sum, as the released
    standardised statistics and their noise covariance."""
    noisy = release_whitened_sum(std_passes, wh, noise_multiplier, rng)
    if on_release is not None:
        on_release()
    std = float(noise_multiplier) * 2.0 * wh.clip
    W_inv = np.linalg.inv(wh.scale)
    S_u = W_inv @ noisy + n * wh.centre
    return linear_stats_from_sum(S_u, n, k, std * std * (W_inv @ W_inv.T))


def box_whitening(st: Standardisation, box: tuple[np.ndarray, np.ndarray]):
    """The first release's clip as a whitening of the standardised statistics (data-free).

    Each statistic's deviation from the middle of its range in the declared box, over its
    half-width (`release_box_centre`), written in the standardised coordinates ``T_u = M T +
    t0``: centre ``M mid + t0``, scale ``diag(1 / half) M^-1``, clip ``C = sqrt(D)``. No
    record inside the box is clipped (the sum is unbiased there).
    """
    from pymc_dp.kernels.expfam import Whitening

    lo, hi = (np.asarray(a, dtype=float) for a in box)
    mid, half = 0.5 * (lo + hi), 0.5 * (hi - lo)
    w = 1.0 / np.where(half > 0, half, 1.0)
    scale = w[:, None] * np.linalg.inv(st.M)
    return Whitening(st.M @ mid + st.t0, scale, float(np.sqrt(mid.size)), 0)


def _smaller_noise(wh, box_wh):
    """``box_wh`` (with ``wh``'s release count) where its noise is nowhere larger than
    ``wh``'s, else ``wh`` (post-processing of DP outputs).

    The last release's noise covariance in the standardised statistics is ``(2 b z)^2 W^-1
    W^-T``; the box's is at most ``wh``'s in every direction (Loewner order) iff ``b_box
    ||W W_box^-1||_2 <= b``. At small ``n`` the whitening's histograms can be noise only:
    measured on 400 records ``x ~ N(1, 2)`` at epsilon 3 (random_seed 2), the first quantile
    fell to its grid's bottom, the whitening scaled the deviations up some 1000 times, the
    clip bound's histogram located nothing and the bound went to the top of the whitened
    box: the last release's noise sds were 27 and 6.5 times the box clip's and the
    posterior was prior-wide. (A comparison of the noises' volumes took the box on
    regressions of 4000 and 20 000 records too, where the whitened noise was smaller for
    ``sigma``: ``dp_predicted_error`` 8.2 against 2.0, 6.0 against 1.5.)
    """
    try:
        ratio = float(np.linalg.norm(wh.scale @ np.linalg.inv(box_wh.scale), 2))
    except np.linalg.LinAlgError:
        return wh
    if np.isfinite(ratio) and float(box_wh.clip) * ratio <= float(wh.clip):
        return replace(box_wh, releases=wh.releases)
    return wh


@dataclass(frozen=True)
class _StandardisedPasses:
    """The passes of the standardised statistics ``T_u = M (T - c) + c_u`` (exact: a
    deviation ``W (T_u - c')`` is ``W M (T - c - M^-1 (c' - c_u))``)."""

    passes: Any
    M: np.ndarray
    c: np.ndarray
    c_u: np.ndarray

    def _centre(self, centre_u: np.ndarray) -> np.ndarray:
        return self.c + np.linalg.solve(self.M, np.asarray(centre_u, dtype=float) - self.c_u)

    def _scale(self, scale) -> np.ndarray:
        if scale is None:
            return self.M
        s = np.asarray(scale, dtype=float)
        return (s[:, None] * self.M) if s.ndim == 1 else s @ self.M

    def clipped_stat_sum(self, bound: float) -> np.ndarray:  # not used: the centre is given
        raise NotImplementedError("the standardised statistics' centre is derived, not released")

    def deviation_counts(self, centre, grid, scale) -> np.ndarray:
        return self.passes.deviation_counts(self._centre(centre), grid, self._scale(scale))

    def centred_clip_sum(self, centre, bound, *, scale=None, absolute=False, outer=False):
        return self.passes.centred_clip_sum(
            self._centre(centre), bound, scale=self._scale(scale), absolute=absolute, outer=outer
        )


#: Importance sampling of the noise-aware posterior (`fit_stats_posterior`): rounds of
#: ``STATS_IS_DRAWS`` draws from a Student-t proposal with ``STATS_IS_DF`` degrees of
#: freedom, the first around the mode with the curvature's covariance times
#: ``STATS_IS_INFLATE``, each later one around the weighted draws of the round before (their
#: covariance times the same factor). Where the last round's effective sample size is below
#: ``STATS_IS_MIN_ESS`` the Gaussian summary is the mode and curvature. One degree of
#: freedom (Cauchy): far out, the posterior's density in the ``p`` coefficients falls only
#: as ``|beta|^-(p+2)`` (`importance_moments`), radially ``r^-3``: heavier than a Student-t
#: with 4 degrees of freedom (``r^-5``), whose weights are then unbounded, lighter than the
#: Cauchy (``r^-2``). Measured on gpa2 at epsilon 1 (seeds 100-119): with 4 degrees of
#: freedom the effective sample size fell to 0 and 114 on 2 seeds (the first fell back to
#: the mode), with 1 it was 109-552.
STATS_IS_DRAWS = 4000
STATS_IS_ROUNDS = 3
STATS_IS_DF = 1.0
STATS_IS_INFLATE = 1.5
STATS_IS_MIN_ESS = 100.0


@dataclass
class StatsPosterior:
    """The noise-aware posterior's Gaussian summary in the model's coordinates (DP outputs)."""

    #: the posterior's Gaussian summary (`importance_moments`: its median, central
    #: intervals and the curvature's correlations; the mode and the curvature's inverse
    #: where the sampler's effective sample size is below ``STATS_IS_MIN_ESS``)
    mean: np.ndarray
    cov: np.ndarray
    #: the curvature without the release noise (the posterior the noise-free statistics
    #: would give, at the same mode): ``cov_mode - cov_sampling`` is the noise's part
    cov_sampling: np.ndarray
    #: largest ``sqrt((cov_mode - cov_sampling) / cov_sampling)`` over the diagonal: the
    #: release noise's effect on the posterior mean, in sds of the noise-free posterior
    #: (predicted error)
    predicted_error: float
    #: the mode and the inverse of the curvature there
    mode: np.ndarray
    cov_mode: np.ndarray
    #: the importance sampler's effective sample size (0: the mode and curvature are used)
    ess: float = 0.0


def _flat_prior(model: pm.Model, vars: list, initial_point: Mapping[str, Any]):
    """``q -> log p(q)`` of the free variables (their log-Jacobians included): data-free."""
    from pymc.pytensorf import join_nonshared_inputs

    logp = model.logp(vars=model.free_RVs, sum=True)
    [flat], x = join_nonshared_inputs(dict(initial_point), [logp], vars, {})
    fn = pm.pytensorf.compile([x], flat, on_unused_input="ignore")
    return lambda q: float(fn(np.asarray(q, dtype=x.dtype)))


def _weighted_quantiles(x: np.ndarray, w: np.ndarray, probs) -> np.ndarray:
    """Quantiles of the weighted sample ``x`` (weights ``w``, normalised; linear between
    the sorted draws' cumulative weights)."""
    order = np.argsort(x)
    cum = np.cumsum(w[order])
    cum = (cum - 0.5 * w[order]) / cum[-1]
    return np.interp(np.asarray(probs, dtype=float), cum, x[order])


#: The central interval whose half-width is the summary's sd (one normal sd each side).
_ONE_SD = (0.15865525393145707, 0.8413447460685429)


def importance_moments(
    target: Callable[[np.ndarray], float],
    mode: np.ndarray,
    cov: np.ndarray,
    rng: np.random.Generator,
    *,
    draws: int | None = None,
    rounds: int | None = None,
) -> tuple[np.ndarray, np.ndarray, float]:
    """A Gaussian summary of ``exp(target)`` by adaptive importance sampling: its median,
    the covariance whose sds are the half-widths of its central 68 % intervals and whose
    correlations are the curvature's (``cov``), and the effective sample size (data-free
    post-processing; constants ``STATS_IS_*``).

    Self-normalised importance sampling from multivariate Student-t proposals (Geweke 1989;
    the proposal refitted to the weighted draws each round, as in population Monte Carlo,
    Cappe et al. 2004). At small epsilon the noise-aware posterior is not Gaussian: its
    spread in the coefficients grows with their size (the noise of the design's statistics
    enters the residual's covariance through ``E beta``, so far out the residual and its
    sd grow alike and the density falls only as ``|beta|^-(p+2)``: its variance depends on
    the prior's tails), and ``sigma`` is bounded above by the released residual sum of
    squares. The median and the central intervals are those of its bulk; measured on gpa2
    at epsilon 1 and nettfa at epsilon 10 they lay nearer NUTS's mean than the mean and
    sds did, as honest (docs/auto.md).
    """
    from scipy.stats import multivariate_t

    draws = STATS_IS_DRAWS if draws is None else int(draws)
    rounds = STATS_IS_ROUNDS if rounds is None else int(rounds)
    loc = np.asarray(mode, dtype=float)
    cov = 0.5 * (np.asarray(cov, dtype=float) + np.asarray(cov, dtype=float).T)
    shape = STATS_IS_INFLATE * cov
    q = w = None
    ess = 0.0
    for _ in range(rounds):
        try:
            prop = multivariate_t(loc, shape, df=STATS_IS_DF, seed=rng)
        except (ValueError, np.linalg.LinAlgError):
            break
        x = np.atleast_2d(prop.rvs(draws)).reshape(draws, loc.size)
        lw = np.array([target(v) for v in x]) - prop.logpdf(x)
        ok = np.isfinite(lw)
        if not ok.any():
            break
        q, w = x, np.where(ok, np.exp(lw - np.max(lw[ok])), 0.0)
        w /= w.sum()
        ess = float(1.0 / np.sum(w**2))
        mean = w @ q
        dev = q - mean
        loc, shape = mean, STATS_IS_INFLATE * ((dev.T * w) @ dev)
    if q is None:
        return np.asarray(mode, dtype=float), cov, 0.0
    centre = np.array([_weighted_quantiles(q[:, j], w, 0.5) for j in range(q.shape[1])])
    sd = np.array(
        [np.diff(_weighted_quantiles(q[:, j], w, _ONE_SD))[0] / 2.0 for j in range(q.shape[1])]
    )
    s0 = np.sqrt(np.diag(cov))
    corr = cov / np.outer(s0, s0)
    return centre, corr * np.outer(sd, sd), ess


def fit_stats_posterior(
    fm,
    stats: LinearStats,
    model: pm.Model,
    vars: list,
    initial_point: Mapping[str, Any],
    standard: Standardisation | None = None,
    rng: np.random.Generator | None = None,
) -> StatsPosterior | None:
    """Step 3: the mean and covariance of ``log p(q) + noise_aware_linear_loglik``
    (post-processing).

    The mode and curvature (two searches) start an importance sampler
    (`importance_moments`) whose median and central intervals summarise the posterior
    where they differ from the mode and curvature beyond their Monte Carlo error: measured
    on gpa2 at epsilon 1 (seeds 100-119), its sds were 1.1-2.5 times the curvature's.
    ``rng`` drives the sampler (default: a fixed seed; its draws are post-processing of
    the release).
    Returns ``None`` when the search fails or the curvature is not positive definite.
    """
    from pymc.blocking import DictToArrayBijection

    prior = _flat_prior(model, vars, initial_point)
    Ap = stats.design_psd()
    q0 = DictToArrayBijection.map({v.name: initial_point[v.name] for v in vars}).data

    def target(q, noise: bool = True) -> float:
        with np.errstate(all="ignore"):
            try:
                par = fm.params(q)
                st = stats if noise else _without_noise(stats)
                w, sigma = par["w"], par["sigma"]
                if standard is not None:  # the same line in the standardised variables
                    w, sigma = standard.coefficients(w, sigma)
                return noise_aware_linear_loglik(st, w, sigma, Ap) + prior(q)
            except (ValueError, FloatingPointError, OverflowError, np.linalg.LinAlgError):
                return -np.inf

    # two searches: from the model's initial point and from the point whose line is the
    # least-squares line of the released statistics (far from the initial point, a search
    # may stop at a mode where the release noise explains large coefficients)
    fits = [quadratic_fit(target, q0.astype(float))]
    start = _least_squares_start(fm, stats, standard, q0)
    if start is not None:
        fits.append(quadratic_fit(target, start))
    fits = [f for f in fits if f is not None]
    if not fits:
        return None
    m, H = max(fits, key=lambda f: target(f[0]))
    cov = np.linalg.inv(H)
    cov = 0.5 * (cov + cov.T)
    # the curvature without the release noise, at the same point (steps of 1e-3 posterior
    # sds); not positive definite there: the statistics alone do not determine the posterior
    H0 = negative_hessian(lambda q: target(q, noise=False), m, 1e-3 * np.sqrt(np.diag(cov)))
    if H0 is None:
        cov0, predicted = cov, float("inf")
    else:
        cov0 = np.linalg.inv(H0)
        extra = np.maximum(np.diag(cov) - np.diag(cov0), 0.0) / np.diag(cov0)
        predicted = float(np.sqrt(np.max(extra)))
    rng = np.random.default_rng(0) if rng is None else rng
    mean, cov_is, ess = importance_moments(target, m, cov, rng)
    if ess < STATS_IS_MIN_ESS or not np.all(np.isfinite(cov_is)):
        return StatsPosterior(m, cov, cov0, predicted, m, cov, 0.0)
    try:
        np.linalg.cholesky(cov_is)
    except np.linalg.LinAlgError:
        return StatsPosterior(m, cov, cov0, predicted, m, cov, 0.0)
    # where the sampler's summary agrees with the mode and curvature within its Monte Carlo
    # error (the median 1.25 sd / sqrt(ESS), an sd about 1.1 / sqrt(ESS) relative; 3 of
    # them), the posterior is Gaussian to that precision: the mode and curvature, which
    # carry no Monte Carlo error, are its summary
    sd_is, sd_m = np.sqrt(np.diag(cov_is)), np.sqrt(np.diag(cov))
    if np.all(np.abs(mean - m) < 3.0 * 1.25 * sd_is / np.sqrt(ess)) and np.all(
        np.abs(sd_is / sd_m - 1.0) < 3.0 * 1.1 / np.sqrt(ess)
    ):
        return StatsPosterior(m, cov, cov0, predicted, m, cov, ess)
    return StatsPosterior(mean, cov_is, cov0, predicted, m, cov, ess)


def _least_squares_start(fm, stats: LinearStats, standard, q0: np.ndarray) -> np.ndarray | None:
    """The model's point nearest (in its line's coefficients and ``log sigma``) to the
    least-squares line of the released statistics (post-processing; data-free search)."""
    from scipy.optimize import minimize

    Ap = stats.design_psd()
    coef = np.linalg.solve(Ap, stats.r)
    rss = max(float(stats.c - coef @ stats.r), 1e-6 * max(float(stats.c), 1e-12))
    sigma = float(np.sqrt(rss / stats.n))
    if standard is not None:  # back from the standardised variables
        coef, sigma = standard.line(coef, sigma)
    goal = np.concatenate([coef, [np.log(sigma)]])

    def miss(q) -> float:
        with np.errstate(all="ignore"):
            try:
                par = fm.params(q)
            except (ValueError, FloatingPointError, OverflowError, np.linalg.LinAlgError):
                return 1e300
            v = np.concatenate([par["w"], [np.log(par["sigma"])]]) - goal
            out = float(v @ v)
            return out if np.isfinite(out) else 1e300

    res = minimize(miss, np.asarray(q0, dtype=float), method="BFGS")
    return np.asarray(res.x, dtype=float) if np.isfinite(res.fun) and res.fun < 1e300 else None


def _without_noise(stats: LinearStats) -> LinearStats:
    return LinearStats(stats.A, stats.r, stats.c, stats.n, np.zeros_like(stats.noise_cov))
