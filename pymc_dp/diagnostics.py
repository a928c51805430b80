"""Convergence of a finished run, from its (DP) draws: loud when a chain did not mix.

The draws, and the accept decisions every pymc_dp step records (``accepted``), are outputs
of the privacy mechanism; R-hat, the bulk effective sample size and the acceptance rates
computed from them are post-processing, so they may be published with the result.
`pymc_dp.sample` runs `check_convergence` after every run; a run that fails a check raises a
`ConvergenceWarning` with the numbers and what would help, and its privacy report's first
line repeats it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "MAX_RHAT",
    "MIN_ACCEPT",
    "MIN_ESS",
    "PRIOR_CLOSE",
    "Convergence",
    "ConvergenceWarning",
    "PriorDominatedWarning",
    "check_convergence",
    "close_to_prior",
]

#: Largest rank-normalised split R-hat of a converged run (Vehtari et al. 2021 advise 1.01
#: for a final analysis; 1.1 is the looser, classical threshold: above it the chains have
#: certainly not converged).
MAX_RHAT = 1.1
#: Smallest bulk effective sample size of a usable run (over all chains).
MIN_ESS = 100.0
#: Acceptance rate below which a chain is called frozen.
MIN_ACCEPT = 0.01


class ConvergenceWarning(UserWarning):
    """The chains of a pymc_dp run did not converge (R-hat, ESS or acceptance)."""


class PriorDominatedWarning(UserWarning):
    """Parameters of a pymc_dp result are about as spread as their prior: the data, seen
    through the privacy noise, told little about them."""


#: A parameter whose posterior spread (half the 16-84 % inter-quantile range of its draws) is
#: at least this share of its prior's is called close to its prior (`close_to_prior`).
PRIOR_CLOSE = 0.8
#: Prior draws of `close_to_prior` (a fixed public seed: data-free, reproducible).
PRIOR_CLOSE_DRAWS = 4000
PRIOR_CLOSE_SEED = 20261128


@dataclass
class Convergence:
    """Convergence diagnostics of a run (all post-processing of DP outputs).

    Attributes
    ----------
    max_rhat : float
        Largest rank-normalised split R-hat over every scalar of the posterior (NaN with one
        chain: not computed).
    min_ess_bulk : float
        Smallest bulk effective sample size.
    acceptance : numpy.ndarray
        Per chain, the acceptance rate of its least-accepting step (the mean of the steps'
        ``accepted`` stat over the draws).
    worst_rhat, worst_ess : str
        The scalars with the largest R-hat and the smallest ESS (e.g. ``"sigma"``,
        ``"b[2]"``).
    problems : list of str
        What failed, in words (empty: converged).
    """

    max_rhat: float
    min_ess_bulk: float
    acceptance: np.ndarray
    worst_rhat: str = ""
    worst_ess: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def converged(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """One line: converged or not, with the numbers."""
        acc = ", ".join(f"{a:.3g}" for a in self.acceptance)
        rhat = (
            "not computed (one chain)"
            if not np.isfinite(self.max_rhat) and self.acceptance.size < 2
            else f"{self.max_rhat:.3g}" + (f" ({self.worst_rhat})" if self.worst_rhat else "")
        )
        numbers = (
            f"max R-hat {rhat}, min bulk ESS {self.min_ess_bulk:.0f}"
            + (f" ({self.worst_ess})" if self.worst_ess else "")
            + f", acceptance per chain {acc}"
        )
        if self.converged:
            return f"converged: {numbers}"
        return f"NOT CONVERGED ({'; '.join(self.problems)}): {numbers}"

    def to_attrs(self) -> dict:
        """Flat ``dp_*`` attributes (numbers, arrays and strings: they survive netCDF)."""
        return {
            "dp_max_rhat": float(self.max_rhat),
            "dp_min_ess_bulk": float(self.min_ess_bulk),
            "dp_acceptance": np.asarray(self.acceptance, dtype=float),
            "dp_converged": int(self.converged),
            "dp_convergence": self.summary(),
        }


def _group(idata, name: str):
    from pymc_dp.report import _get_group

    return _get_group(idata, name)


def _scalars(ds) -> tuple[np.ndarray, list[str]]:
    """Every scalar of ``ds`` as ``(chain, draw, k)`` with its names (``b[2]``)."""
    arrays, names = [], []
    for name, da in ds.data_vars.items():
        a = np.asarray(da.values, dtype=float)
        if a.ndim < 2:
            continue
        chains, draws = a.shape[:2]
        flat = a.reshape(chains, draws, -1)
        arrays.append(flat)
        if flat.shape[2] == 1 and a.ndim == 2:
            names.append(str(name))
        else:
            idx = np.ndindex(*a.shape[2:])
            names += [f"{name}[{','.join(str(i) for i in j)}]" for j in idx]
    if not arrays:
        return np.zeros((0, 0, 0)), []
    return np.concatenate(arrays, axis=2), names


def _rhat_ess(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rank-normalised split R-hat and bulk ESS of each scalar of ``x`` ``(chain, draw, k)``
    (ArviZ's, which follow Vehtari et al. 2021)."""
    import arviz as az
    import xarray as xr

    ds = xr.Dataset({"x": (("chain", "draw", "k"), x)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        rhat = np.asarray(az.rhat(ds)["x"].values, dtype=float)
        ess = np.asarray(az.ess(ds, method="bulk")["x"].values, dtype=float)
    return rhat, ess


def check_convergence(
    idata, *, warn: bool = True, hint: str | None = None, stacklevel: int = 2
) -> Convergence:
    """R-hat, bulk ESS and per-chain acceptance of a run; warn when it did not converge.

    A run has not converged when its largest R-hat exceeds `MAX_RHAT` (two chains or more),
    its smallest bulk ESS is below `MIN_ESS`, or a chain's acceptance rate is below
    `MIN_ACCEPT` (frozen). Scalars constant over every draw of every chain (e.g. a data-free
    Deterministic) are left out of R-hat and ESS; a chain that never moves is caught by its
    acceptance.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        A pymc_dp result (its ``posterior`` and ``sample_stats`` groups).
    warn : bool
        Raise a `ConvergenceWarning` when the run did not converge.
    hint : str, optional
        What would help, appended to the warning (default: more draws, a larger epsilon, or
        the automatic mode).
    stacklevel : int
        Of the warning (2: the caller of this function).

    Returns
    -------
    Convergence
    """
    posterior = _group(idata, "posterior")
    stats = _group(idata, "sample_stats")
    x, names = _scalars(posterior) if posterior is not None else (np.zeros((0, 0, 0)), [])
    chains = x.shape[0]
    max_rhat, min_ess, worst_rhat, worst_ess = float("nan"), float("nan"), "", ""
    problems = []
    still = False  # no scalar moved in any chain
    few = 0 < x.shape[1] < 4 if x.ndim == 3 else False  # too few draws for R-hat and ESS
    if few:
        min_ess = 0.0
        problems.append(f"{x.shape[1]} draws per chain: too few to diagnose (at least 4)")
    elif x.size:
        moving = np.ptp(x.reshape(-1, x.shape[2]), axis=0) > 0
        moving &= np.all(np.isfinite(x), axis=(0, 1))
        if moving.any():
            rhat, ess = _rhat_ess(x[:, :, moving])
            kept = [n for n, m in zip(names, moving, strict=True) if m]
            ess = np.where(np.isfinite(ess), ess, 0.0)
            j = int(np.argmin(ess))
            min_ess, worst_ess = float(ess[j]), kept[j]
            if chains > 1:
                # a non-finite R-hat (chains constant at different values) is the worst
                rhat = np.where(np.isfinite(rhat), rhat, np.inf)
                j = int(np.argmax(rhat))
                max_rhat, worst_rhat = float(rhat[j]), kept[j]
        else:
            min_ess, still = 0.0, True
    acceptance = np.full(max(chains, 0), np.nan)
    if stats is not None and "accepted" in stats:
        a = np.asarray(stats["accepted"].values, dtype=float)
        a = a.reshape(a.shape[0], a.shape[1], -1)  # (chain, draw, step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            acceptance = np.nanmin(np.nanmean(a, axis=1), axis=1)
    if still:
        problems.append("no draw differs from the first in any chain")
    elif chains > 1 and not few and not max_rhat <= MAX_RHAT:
        problems.append(f"R-hat {max_rhat:.3g} > {MAX_RHAT}")
    if not few and not min_ess >= MIN_ESS:
        problems.append(f"bulk ESS {min_ess:.0f} < {MIN_ESS:.0f}")
    frozen = np.flatnonzero(~(acceptance >= MIN_ACCEPT))
    if frozen.size:
        problems.append(
            f"chain{'s' if frozen.size > 1 else ''} {', '.join(str(int(c)) for c in frozen)} "
            f"accepted under {MIN_ACCEPT:.0%} of proposals"
        )
    conv = Convergence(max_rhat, min_ess, acceptance, worst_rhat, worst_ess, problems)
    if warn and problems:
        help_ = hint or (
            "more draws, a larger epsilon, or the automatic mode (pymc_dp.sample with "
            "step=None), which configures the step privately"
        )
        warnings.warn(
            f"pymc_dp: the chains have {conv.summary()}. Do not use these draws as posterior "
            f"draws; what would help: {help_}",
            ConvergenceWarning,
            stacklevel=stacklevel,
        )
    return conv


def close_to_prior(idata, model, *, ratio: float = PRIOR_CLOSE) -> list[str]:
    """The scalars of the posterior about as spread as their prior (post-processing).

    For each free variable of ``model`` in the result's posterior, the spread of its draws
    (half the 16-84 % inter-quantile range: robust to heavy tails) is compared with its
    prior's, from `PRIOR_CLOSE_DRAWS` forward draws of the prior (``pm.draw``, a fixed public
    seed). Entries whose spread is at least ``ratio`` times the prior's are returned (e.g.
    ``["mu", "b[1]"]``): the result learnt little about them beyond the prior. With one
    record, or where the privacy noise swamps the data, a result can be the prior itself
    and still look converged (found: an observed array of length 1, ``mu ~ N(0, 5)``, the
    result mean 0.36, sd 4.93, no warning). The draws are DP outputs and the prior is
    data-free, so the comparison may be published; where a prior reads the data (a
    ``pm.Data`` array or the records in its graph) nothing is drawn and nothing is returned.
    """
    import pymc as pm

    from pymc_dp.records.graph_facts import count_records, reads_data

    posterior = _group(idata, "posterior")
    if posterior is None:
        return []
    rvs = [rv for rv in model.free_RVs if rv.name in posterior.data_vars]
    if not rvs:
        return []
    try:
        n = count_records(model)
    except Exception:  # noqa: BLE001 (no record axis: no data-free check possible)
        return []
    if any(reads_data(rv, model, n) for rv in rvs):
        return []
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            prior = pm.draw(rvs, draws=PRIOR_CLOSE_DRAWS, random_seed=PRIOR_CLOSE_SEED)
    except Exception:  # noqa: BLE001 (a prior that cannot be drawn, e.g. Flat: no check)
        return []
    prior = prior if isinstance(prior, list | tuple) else [prior]
    close = []
    for rv, draws in zip(rvs, prior, strict=True):
        pr = np.reshape(np.asarray(draws, dtype=float), (PRIOR_CLOSE_DRAWS, -1))
        post = np.asarray(posterior[rv.name].values, dtype=float)
        post = post.reshape(post.shape[0] * post.shape[1], -1)
        if post.shape[1] != pr.shape[1] or not np.all(np.isfinite(pr)):
            continue
        lo, hi = np.quantile(pr, [0.16, 0.84], axis=0)
        plo, phi = np.quantile(post, [0.16, 0.84], axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            share = (phi - plo) / (hi - lo)
        hit = np.flatnonzero(np.isfinite(share) & (hi > lo) & (share >= ratio))
        shape = np.shape(np.asarray(posterior[rv.name].values))[2:]
        for j in hit:
            idx = np.unravel_index(int(j), shape) if shape else ()
            close.append(rv.name + (f"[{','.join(str(i) for i in idx)}]" if idx else ""))
    return close
