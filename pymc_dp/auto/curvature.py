"""The one-shot strategy's curvature: the warm start's last released curvatures, averaged.

The one-shot strategy's two last Newton steps (`pymc_dp.auto.oneshot`) use one curvature
``P``. The warm start (`pymc_dp.kernels.warmstart.private_laplace`) releases one per
iteration, each with a share of its budget; near the mode the log-likelihood's curvature
hardly moves over the few posterior sds between its last iterates (a GLM's Fisher
information changes by about one part in ``sqrt(n)`` per posterior sd), so the last few
releases are noisy measurements of one matrix. Their inverse-variance average, taken entry
by entry in the last iteration's whitened coordinates, has the noise of one release with
all their budgets (`averaged_curvature`), and the released curvature's error over a step
(`pymc_dp.auto.oneshot.curvature_step_cov`) shrinks with it. Its off-diagonal entries are
thresholded as one release's are, except in the rows whose entries are together beyond
their noise (`hub_rows`): a GLM's slope against every group intercept of a random
intercept. Measured on bench_auto's Poisson GLMM at epsilon 3 (DP seeds 1-5, max error in
NUTS sds): 1.051 / 1.153 / 1.475 / 0.834 / 0.265 with the last curvature alone, 1.224 /
0.970 / 1.006 / 0.100 / 0.518 with the average and its hubs (on seed 3 the second step's
predicted error from the curvature, `curvature_step_cov`, went from 0.44 to 0.17 posterior
sds in the slope). On the normal hierarchy of bench_auto forced onto the one-shot strategy
its ``sigma`` came out worse (0.675 / 0.299 / 0.252 before, 0.940 / 0.622 / 0.263 after,
seeds 1-3; not explained). Post-processing of released values only.
"""

from __future__ import annotations

import numpy as np
import scipy.stats

from pymc_dp.kernels.warmstart import LaplaceInfo, _Curvature

__all__ = [
    "CURVATURE_AVERAGE_LAST",
    "HUB_FAMILY_WISE",
    "averaged_curvature",
    "hub_rows",
    "transformed_entry_var",
]

#: The warm start's last released curvatures the one-shot strategy averages (its Polyak
#: window, `private_laplace`'s ``average_last``).
CURVATURE_AVERAGE_LAST = 4


def transformed_entry_var(t: np.ndarray) -> np.ndarray:
    """Per-entry variance of ``T E T^T`` for a symmetric ``E`` with independent unit-variance
    entries on and above its diagonal (`pymc_dp.kernels.warmstart._sym_noise`).

    ``Var((T E T^T)_ij) = |t_i|^2 |t_j|^2 + (t_i . t_j)^2 - sum_a T_ia^2 T_ja^2`` (``t_i`` the
    rows of ``T``; 1 everywhere for ``T = I``).
    """
    t = np.asarray(t, dtype=float)
    r2 = np.sum(t * t, axis=1)
    g = t @ t.T
    sq = t * t
    return np.outer(r2, r2) + g * g - sq @ sq.T


#: Chance that noise alone makes a row of the averaged curvature a hub anywhere (`hub_rows`).
HUB_FAMILY_WISE = 1e-2


def hub_rows(z: np.ndarray, family_wise: float = HUB_FAMILY_WISE) -> np.ndarray:
    """The rows of a released symmetric matrix (``z``: its entries in noise sds) whose
    off-diagonal entries are, together, beyond their noise: a hub.

    Row ``i``'s statistic is ``sum_j z_ij^2`` over the off-diagonal entries of the rows that
    are not hubs, chi-square with as many degrees of freedom where the row is noise alone;
    past its ``1 - family_wise / k`` quantile (Bonferroni's over the ``k`` rows) the row with
    the largest statistic is a hub, and the test is repeated without it (a hub's entries
    leave the other rows' statistics: a group intercept's row holds its entry against the
    slope) until no row passes. Entry by entry, a small correlation that
    many entries of one row share stays below `offdiag_threshold_sds`: a GLM's slope
    against each of ten group intercepts (measured, bench_auto's Poisson GLMM at epsilon 3:
    whitened entries 0.10-0.30, noise sds 0.03-0.05, every one zeroed; the Newton step from
    a point two posterior sds off in two group intercepts then moved the slope 1.16
    posterior sds the wrong way). Post-processing.
    """
    z = np.asarray(z, dtype=float)
    k = z.shape[0]
    z2 = z * z
    np.fill_diagonal(z2, 0.0)
    hub = np.zeros(k, dtype=bool)
    while True:
        rest = ~hub
        m = int(rest.sum()) - 1
        if m < 1:
            return hub
        stat = np.where(rest, z2[:, rest].sum(axis=1), -np.inf)
        i = int(np.argmax(stat))
        if not stat[i] > scipy.stats.chi2.ppf(1.0 - family_wise / k, m):
            return hub
        hub[i] = True


def averaged_curvature(
    info: LaplaceInfo, last: int = CURVATURE_AVERAGE_LAST, hubs: bool = True
) -> int:
    """Replace ``info``'s last curvature by the average of its last ``last`` released ones.

    Each iteration ``k`` released ``S_k + E_k`` (its outer-product sum in its whitened
    coordinates ``B_k``, ``E_k`` symmetric with independent entries of sd ``s_k``). In the
    last iteration's coordinates ``B`` it reads ``T_k (S_k + E_k) T_k^T``, ``T_k = B^-1
    B_k``, whose noise has the per-entry variance `transformed_entry_var` times ``s_k^2``.
    The entries are averaged with inverse-variance weights; the average's noise (its
    largest entry sd, conservatively) goes through the same thresholding, flooring and
    damping as one release (`pymc_dp.kernels.warmstart._Curvature`), and the secants' scale
    (``info.curvature_scale``) is applied as `private_laplace` applies it. With ``hubs``,
    the rows whose off-diagonal entries are together beyond their noise (`hub_rows`) keep
    all their entries: a slope correlated a little with each of many group intercepts is
    not cut off from them by the entry-by-entry threshold. Where the warm
    start went back from a rejected Newton step it reused that iterate's release (its
    outer products uncentred with the released mean): counted once. Centred and uncentred
    releases are averaged alike: they differ by ``n cbar cbar^T`` (``cbar`` the released
    mean gradient), about ``|g|^2 / n`` near the mode (measured on the GLMM of bench_auto:
    about 0.003 against entries about 1 and noise sds 0.03-0.05). ``info.precision``,
    ``damping``, ``curvature_entry_std`` and ``cov`` are replaced; returns how many
    releases were averaged (1: nothing changed). The average's eigenvalues are capped at the
    largest of the releases' caps (`pymc_dp.kernels.warmstart.curvature_cap`, ``c_k``) in
    the last release's coordinates, ``c_k ||T_k||_2^2``: what the records could contribute
    at any of the iterates. Post-processing of released values.
    """
    entries = list(info.curvatures)
    if len(entries) < 2 or last < 2:
        return 1
    used, seen = [], None
    kind = bool(getattr(entries[-1][1], "hessian", False))
    for q, curv, _centred in reversed(entries):
        if len(used) >= last or bool(getattr(curv, "hessian", False)) != kind:
            # one kind only: the outer products' sum (the empirical Fisher information) is
            # not the Hessians' where the model is misspecified (measured: a normal mean on
            # records of spread 3 sigma, the last outer-product release 8 times the
            # Hessians' in one average: the result's sd 0.53 of the posterior's)
            break
        if seen is not None and np.array_equal(q, seen):
            # the same iterate twice: the warm start went back from a rejected Newton step
            # and reused that iterate's release, uncentred (`private_laplace`): one release
            continue
        used.append(curv)
        seen = q
    if len(used) < 2:
        return 1
    ref = used[0]
    data = np.asarray(ref.data, dtype=bool)
    if not data.any():
        return 1
    b_inv = np.linalg.inv(ref.basis)
    dd = np.ix_(data, data)
    total = np.zeros((int(data.sum()),) * 2)
    weight = np.zeros_like(total)
    cap = 0.0  # the releases' largest cap in the last one's coordinates (`curvature_cap`)
    for curv in used:
        t = (b_inv @ curv.basis)[dd]
        cap = max(cap, float(getattr(curv, "cap", np.inf)) * float(np.linalg.norm(t, 2)) ** 2)
        s2 = np.nan_to_num(np.asarray(curv.s2, dtype=float), nan=0.0, posinf=0.0, neginf=0.0)
        moved = t @ s2[dd] @ t.T
        var = float(curv.outer_std) ** 2 * transformed_entry_var(t)
        if not (np.all(np.isfinite(moved)) and np.all(np.isfinite(var)) and np.all(var > 0)):
            continue
        total += moved / var
        weight += 1.0 / var
    if not np.all(weight > 0):
        return 1
    d = ref.s2.shape[0]
    s2 = np.zeros((d, d))
    s2[dd] = total / weight
    std = float(np.sqrt(np.max(1.0 / weight)))
    keep = None
    if hubs:
        keep = np.zeros((d, d), dtype=bool)
        hub = np.zeros(d, dtype=bool)
        hub[data] = hub_rows(s2[dd] / std, HUB_FAMILY_WISE)
        keep[hub, :] = keep[:, hub] = True
    curv = _Curvature(s2, std, data, ref.basis, ref.p_hess, keep=keep, cap=cap)
    scale = float(info.curvature_scale)
    info.precision = scale * curv.prec
    info.damping = scale * np.asarray(curv.damping, dtype=float)
    info.curvature_entry_std = scale * curv.entry_std
    info.curvature_basis = curv.basis
    info.cov = curv.cov / scale
    return len(used)
