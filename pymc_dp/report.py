"""The privacy report of a finished run, computed from nothing but what ``pm.sample`` returned.

Every pymc_dp step records, in every iteration, the privacy it spent as data-free sampler
stats: ``dp_mu`` (privacy-loss parameter of the Gaussian mechanisms of the iteration),
``dp_releases`` (how many releases), and, for steps with non-Gaussian parts,
``dp_iter_epsilon``/``dp_iter_delta`` (an (epsilon, delta)-DP mechanism). The report counts
every chain and every iteration, warmup included (from the ``warmup_sample_stats`` group, or
from the ``tuning_steps`` attribute PyMC writes when tuned draws were discarded), composes
them with `pymc_dp.accounting.PrivacyLedger`, and writes flat attributes into the
result (strings and numbers only, so they survive a netCDF round trip).
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pymc_dp import callscope
from pymc_dp.accounting import (
    ApproxDPEvent,
    DataSharingGaussianEvent,
    DPBarkerEvent,
    GaussianEvent,
    NeighbourRelation,
    PoissonSubsampledGaussian,
    PrivacyLedger,
    WORSubsampledGaussian,
    compose_epsilon,
)

__all__ = ["PrivacyReport", "privacy_report", "RAW_DATA_GROUPS"]

#: Groups of a PyMC result that hold the raw data (``predictions_constant_data``: the data
#: containers' values that ``pm.sample_posterior_predictive(..., predictions=True)`` stores,
#: the records' own unless every container was replaced).
RAW_DATA_GROUPS = ("observed_data", "constant_data", "log_likelihood", "predictions_constant_data")

NEIGHBOUR_RELATION = NeighbourRelation.REPLACE_ONE.description


@dataclass(frozen=True)
class PrivacyReport:
    """Privacy spend of a run.

    Attributes
    ----------
    epsilon, delta : float
        The run is (epsilon, delta)-DP with respect to any single record.
    mu : float
        Total privacy-loss parameter of the Gaussian mechanisms (loss ~ N(mu, 2 mu)).
    mechanism : str
        What was composed and by which theorem.
    releases : int
        Number of Gaussian-mechanism releases over the whole run.
    chains : int
    iterations : int
        Total iterations over all chains, warmup included.
    tuning_iterations : int
        Warmup iterations per chain (included in ``iterations``).
    draws : int
        Kept draws per chain.
    neighbour_relation : str
    nonprivate_diagnostics : bool
        True when the run emitted stats computed from the data without noise: then the
        result is NOT differentially private as a whole.
    raw_data_groups : tuple of str
        Groups holding raw data still present in the result (publish none of them).
    owners : int
        Data-sharing scheme (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2): the number
        ``K`` of data owners who each added their own noise to every release; 0 for the
        central scheme.
    owner_epsilons : tuple of float
        Each owner's epsilon at ``delta`` against the curator and the other owners
        (neighbours: replace one record of that owner); every owner sees every release, so
        they are equal, and equal to ``epsilon``.
    noise_variance_factor : int
        Variance of the total noise in each release over that of the central scheme at the
        same noise multiplier (``K``; 1 for the central scheme).
    total_noise_variance : float
        Mean over the run's iterations of the variance of the total noise added to the
        released log-likelihood-ratio sum (from the ``noise_std`` stat; NaN when the step
        does not record it).
    convergence : str
        The run's convergence diagnostics in one line (`pymc_dp.diagnostics`; written by
        `pymc_dp.sample` as the ``dp_convergence`` attribute), or empty when not computed.
        Printed as the report's first line when the chains did not converge (after the
        NOT DIFFERENTIALLY PRIVATE lines, if any).
    method : str
        The automatic mode's strategy (``dp_method``: ``"laplace"``, the one-shot
        noise-aware private Laplace approximation, or ``"chain"``); empty for a run with a
        step given by the user. On the guarantee's line.
    private : bool
        True only when the report could verify, from the result (and the model), that it
        holds nothing but the mechanisms' outputs and that ``epsilon`` counts every
        iteration they ran: False when it is not private (``not_private_reasons``; then
        ``epsilon`` is infinite, except for raw-data groups alone, which can be removed:
        ``epsilon`` is then that of the result without them) and when it could not be
        verified (``unverified_reasons``, e.g. no model given; ``epsilon`` is then what the
        mechanisms spent, not vouched for).
    not_private_reasons, unverified_reasons : tuple of str
    """

    epsilon: float
    delta: float
    mu: float
    mechanism: str
    releases: int
    chains: int
    iterations: int
    tuning_iterations: int
    draws: int
    neighbour_relation: str = NEIGHBOUR_RELATION
    nonprivate_diagnostics: bool = False
    raw_data_groups: tuple[str, ...] = ()
    private: bool = True
    not_private_reasons: tuple[str, ...] = ()
    mechanism_epsilon: float = float("nan")
    model_checked: bool = False
    plan_exceeded: bool = False
    owners: int = 0
    owner_epsilons: tuple[float, ...] = ()
    noise_variance_factor: int = 1
    total_noise_variance: float = float("nan")
    convergence: str = ""
    method: str = ""
    unverified_reasons: tuple[str, ...] = ()

    def to_attrs(self) -> dict[str, Any]:
        """Flat ``dp_*`` attributes (str, int, float only)."""
        out = {}
        for k, v in asdict(self).items():
            if isinstance(v, bool):
                v = int(v)
            elif isinstance(v, tuple):
                sep = "; " if k in ("not_private_reasons", "unverified_reasons") else ","
                v = sep.join(str(x) for x in v)
            out[f"dp_{k}"] = v
        return out

    def __str__(self) -> str:
        # first line: NOT DIFFERENTIALLY PRIVATE, else NOT CONVERGED / NOT USABLE / IN
        # DOUBT (`pymc_dp.sampling`'s ``dp_convergence``), else the guarantee
        unconverged = self.convergence.startswith(UNUSABLE_PREFIXES)
        lines = []
        if self.not_private_reasons:
            lines += [
                "NOT DIFFERENTIALLY PRIVATE: this result holds values computed from the data "
                "outside the privacy mechanism: " + "; ".join(self.not_private_reasons),
                f"  (the pymc_dp mechanisms alone spent epsilon = {self.mechanism_epsilon:.4g} "
                f"at delta = {self.delta:.3g}; that is NOT a guarantee for this result)",
            ]
        elif self.unverified_reasons:
            lines.append(
                f"UNVERIFIED: the mechanisms spent (epsilon, delta) = ({self.epsilon:.4g}, "
                f"{self.delta:.3g}); this report does not vouch for the result: "
                + "; ".join(self.unverified_reasons)
            )
        else:
            lines += _wrap_parts(self.convergence, first="") if unconverged else []
            lines.append(
                f"(epsilon, delta) = ({self.epsilon:.4g}, {self.delta:.3g})-DP"
                + (
                    f"; automatic mode: {_METHODS[self.method]}"
                    if self.method in _METHODS
                    # a step class configured privately (`pymc_dp.auto.steps`)
                    else (f"; {self.method}" if self.method else "")
                )
            )
        if self.convergence and not (unconverged and self.private):
            lines += _wrap_parts(self.convergence)
        lines += [
            f"  neighbours: {self.neighbour_relation}",
            f"  {self.chains} chains x {self.iterations // max(self.chains, 1)} iterations "
            f"({self.tuning_iterations} warmup + {self.draws} draws), {self.releases} releases, "
            f"mu = {self.mu:.6g}",
            *_wrap_parts(self.mechanism),
        ]
        if self.owners:
            lines.append(
                f"  data-sharing: {self.owners} owners each added their own noise; each owner's "
                f"(epsilon, delta) against the curator and the other owners = "
                f"({self.owner_epsilons[0]:.4g}, {self.delta:.3g}) (neighbours: replace one "
                f"record of that owner); total noise variance {self.noise_variance_factor} x "
                f"the central scheme's (mean {self.total_noise_variance:.4g} per release)"
            )
        if self.plan_exceeded:
            lines.append(
                "  WARNING: the run made more chains than its steps were calibrated for; the "
                "epsilon above counts every chain and exceeds the calibration target"
            )
        if not self.model_checked:
            lines += _wrap_parts(
                "NOTE: no model was given: that every free variable was sampled by a pymc_dp "
                "step and that no stored Deterministic reads the data was not checked "
                "(pass model=... or call inside the model context)"
            )
        if self.nonprivate_diagnostics:
            lines.append("  WARNING: non-private diagnostics were emitted: NOT DP as a whole")
        if self.raw_data_groups:
            lines.append(f"  WARNING: raw data groups present: {', '.join(self.raw_data_groups)}")
        return "\n".join(lines)


#: The automatic mode's strategies, as the report names them.
_METHODS = {
    "laplace": "one-shot noise-aware private Laplace approximation (method='laplace')",
    "stats": "noise-aware posterior of released sufficient statistics (method='stats')",
    "groupstats": "noise-aware posterior of released per-group statistics, sampled with "
    "NUTS (method='groupstats')",
    "chain": "penalty chain (method='chain')",
}

#: Width of the printed report's lines.
REPORT_WIDTH = 100


def _wrap_parts(text: str, width: int = REPORT_WIDTH, first: str = "  ") -> list[str]:
    """``text``'s parts (separated by ``"; "`` outside parentheses), one wrapped block each,
    indented by ``first`` (continuation lines by four more spaces): the printed report stays
    a short block of short lines."""
    import textwrap

    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text.startswith("; ", i):
            parts.append(text[start:i])
            start = i + 2
    parts.append(text[start:])
    return [
        line
        for p in parts
        if p
        for line in textwrap.wrap(
            p,
            width,
            initial_indent=first,
            subsequent_indent=first + "    ",
            break_on_hyphens=False,
            break_long_words=False,
        )
    ]


def _groups(idata) -> list[str]:
    if hasattr(idata, "groups") and callable(idata.groups):
        return [g.strip("/") for g in idata.groups()]
    return [k for k in getattr(idata, "children", {})]


def _check_is_a_result(idata) -> None:
    """Refuse, naming the fix, an object that is not an InferenceData or a DataTree.

    ``pm.sample(step=..., return_inferencedata=False)`` returns a ``MultiTrace``; the report
    had taken it for a result without pymc_dp stats ("it was not sampled with a pymc_dp
    step"), although its stats hold every ``dp_*`` value (found on the issue-26 sweep).
    """
    if callable(getattr(idata, "groups", None)) or hasattr(idata, "children"):
        return
    kind = type(idata).__name__
    if hasattr(idata, "stat_names") and hasattr(idata, "nchains"):
        raise TypeError(
            f"privacy_report takes an InferenceData (PyMC 5.x) or a DataTree (PyMC 6.x), not "
            f"a {kind} (what pm.sample(..., return_inferencedata=False) returns): convert it "
            "with pm.to_inference_data(trace, model=model) (its sample_stats keep the dp_* "
            "stats; the warmup is counted from its tuning_steps), or sample with "
            "return_inferencedata=True; drop observed_data before publishing"
        )
    raise TypeError(
        f"privacy_report takes an InferenceData (PyMC 5.x) or a DataTree (PyMC 6.x), not a {kind}"
    )


def _get_group(idata, name: str):
    """A group as an xarray Dataset, for InferenceData and DataTree."""
    if name not in _groups(idata):
        return None
    g = idata[name]
    return g.to_dataset() if hasattr(g, "to_dataset") else g


def _per_iteration(ds, name: str) -> np.ndarray | None:
    """Stat ``name`` as (chain, draw), summed over the sampler axis of compound steps."""
    if ds is None or name not in ds:
        return None
    a = np.asarray(ds[name].values, dtype=float)
    a = np.where(np.isnan(a), 0.0, a)
    while a.ndim > 2:
        a = a.sum(axis=-1)
    return a


def _presample(idata, posterior) -> tuple[float, int, str]:
    """``(mu, releases, phases)`` of the Gaussian mechanisms run before the chains."""
    for src in (getattr(idata, "attrs", {}), posterior.attrs):
        if "dp_presample_mu" in src:
            mu = float(src["dp_presample_mu"])
            if not (np.isfinite(mu) and mu >= 0):
                raise ValueError("dp_presample_mu must be a finite number >= 0")
            return mu, int(src.get("dp_presample_releases", 0)), str(src.get("dp_phases", ""))
    return 0.0, 0, ""


def _has_presample(idata, posterior) -> bool:
    """Whether the result carries the account of the releases made before the chains."""
    return any("dp_presample_mu" in src for src in (getattr(idata, "attrs", {}), posterior.attrs))


def _iteration_checks(stats, warm, n_tune: int) -> tuple[list[str], list[str]]:
    """``(not_private, unverified)`` reasons from the steps' iteration counter.

    Every pymc_dp step records ``dp_iteration`` (1, 2, ... per chain, warmup included): the
    result must hold every iteration from the first, in order, or its epsilon (which counts
    the iterations present) is less than the run spent. A result without the counter (made
    before it existed) cannot be checked. Iterations cut from the end of every chain are
    told apart from a shorter run only by the steps' plan (``dp_plan_iterations``): chains
    shorter than it leave the result unverified.
    """
    it = _per_mechanism(stats, "dp_iteration")
    if it is None:
        return [], [
            "the result has no iteration counter (dp_iteration): that it holds every "
            "iteration the steps ran (not thinned or sliced) was not checked"
        ]
    start = 1
    w = _per_mechanism(warm, "dp_iteration") if warm is not None else None
    if w is not None:
        it = np.concatenate([w, it], axis=1)
    else:
        start = n_tune + 1
    expected = start + np.arange(it.shape[1])[None, :]
    plan = _per_mechanism(stats, "dp_plan_iterations")
    unverified = []
    for k in range(it.shape[2]):
        col = it[:, :, k]
        if not np.any(col > 0):
            continue  # not a pymc_dp step's column
        if not np.array_equal(col, np.broadcast_to(expected, col.shape)):
            return [
                "its draws are not the contiguous iterations the steps counted (dp_iteration): "
                "the result was thinned, sliced or reordered, and its epsilon would count only "
                "the iterations left, not what the run spent"
            ], []
        planned = 0 if plan is None or plan.shape[2] <= k else int(plan[:, :, k].max())
        length = start - 1 + it.shape[1]
        if 0 < length < planned and not unverified:
            unverified.append(
                f"its chains hold {length} iterations, fewer than the {planned} per chain the "
                "steps were calibrated for: iterations cut from the end of the chains cannot be "
                "told apart from a shorter run (epsilon counts the iterations present)"
            )
    return [], unverified


def _tuning_steps(idata, posterior) -> int:
    for src in (posterior.attrs, getattr(idata, "attrs", {})):
        if "tuning_steps" in src:
            return int(src["tuning_steps"])
    raise ValueError(
        "cannot find how many warmup iterations the run made (no 'warmup_sample_stats' group "
        "and no 'tuning_steps' attribute); pass tuning_steps= to privacy_report"
    )


@dataclass(frozen=True)
class StatEvents:
    """How saved per-iteration stats become privacy events (one mechanism family).

    Each iteration whose first stat is positive ran one mechanism with the parameters in
    ``stats``; ``event(values, count)`` is the event of ``count`` such iterations.
    """

    stats: tuple[str, ...]
    event: Callable[[np.ndarray, int], object]
    label: str


#: Per-iteration stats of the minibatch mechanisms, by sampling scheme: the whole mapping
#: from saved stat names to events (their epsilon: `pymc_dp.accounting.registry`).
EVENT_STATS = {
    "poisson": StatEvents(
        ("dp_poisson_sigma", "dp_poisson_q"),
        lambda u, c: PoissonSubsampledGaussian(float(u[0]), float(u[1]), c),
        "{count} Poisson-subsampled Gaussian mechanisms (replace-one) composed by the PLD "
        "accountant of dp-accounting",
    ),
    "wor": StatEvents(
        ("dp_wor_sigma", "dp_wor_batch", "dp_wor_n"),
        lambda u, c: WORSubsampledGaussian(float(u[0]), int(u[2]), int(u[1]), c),
        "{count} without-replacement subsampled Gaussian mechanisms (replace-one) composed by "
        "subsampled RDP (Wang, Balle, Kasiviswanathan 2019, Thm 27; dp-accounting)",
    ),
    "barker": StatEvents(
        ("dp_barker_batch", "dp_barker_n"),
        lambda u, c: DPBarkerEvent(int(u[1]), int(u[0]), c),
        "{count} DP Barker tests (replace-one) composed by subsampled RDP (thesis Theorem 8; "
        "Wang, Balle, Kasiviswanathan 2019, Thm 9)",
    ),
}

#: Stat names of `EVENT_STATS`, by scheme.
SUBSAMPLED_STATS = {scheme: family.stats for scheme, family in EVENT_STATS.items()}


def _per_mechanism(ds, name: str) -> np.ndarray | None:
    """Stat ``name`` as (chain, draw, sampler): one column per step of a compound step."""
    if ds is None or name not in ds:
        return None
    a = np.asarray(ds[name].values, dtype=float)
    a = np.where(np.isnan(a), 0.0, a)
    return a.reshape(a.shape[0], a.shape[1], -1)


def _stat_columns(stats, warm, n_tune: int, names: tuple[str, ...]) -> np.ndarray | None:
    """Per-iteration values of ``names`` over all chains and iterations, as rows.

    With the warmup stats discarded, each chain's warmup is charged like its kept draws (the
    steps record constant parameters per chain; checked).
    """
    cols = []
    for name in names:
        d = _per_mechanism(stats, name)
        if d is None:
            return None
        if warm is not None:
            w = _per_mechanism(warm, name)
            a = np.concatenate([w, d], axis=1) if w is not None else d
        else:
            if not np.allclose(d, d[:, :1]):
                raise ValueError(f"stat {name} varies within a chain; keep the warmup draws")
            a = np.concatenate([np.repeat(d[:, :1], n_tune, axis=1), d], axis=1)
        cols.append(a.ravel())
    return np.stack(cols, axis=1)


def _subsampled_families(stats, warm, n_tune: int) -> list[tuple[str, str, list]]:
    """The subsampled events of a run, grouped by scheme and parameters."""
    out = []
    for scheme, family in EVENT_STATS.items():
        rows = _stat_columns(stats, warm, n_tune, family.stats)
        if rows is None:
            continue
        rows = rows[rows[:, 0] > 0]
        if rows.size == 0:
            continue
        uniq, counts = np.unique(rows, axis=0, return_counts=True)
        events = [family.event(u, int(c)) for u, c in zip(uniq, counts, strict=True)]
        out.append((scheme, family.label.format(count=int(counts.sum())), events))
    return out


def _combined_epsilon(ledger: PrivacyLedger, families: list, delta: float) -> float:
    """Epsilon of the ledger's events and the subsampled families (see ``compose_epsilon``)."""
    events = [*ledger.events, *(ev for _, _, evs in families for ev in evs)]
    return compose_epsilon(events, delta)


def _known_stat_names() -> set[str]:
    """Every sampler stat a pymc_dp step declares (from the step classes themselves)."""
    from pymc_dp.step_methods.base import DPStep

    names: set[str] = set()
    todo = [DPStep]
    while todo:
        cls = todo.pop()
        names.update(getattr(cls, "stats_dtypes_shapes", {}))
        todo.extend(cls.__subclasses__())
    return names


def _model_reasons(idata, stats, model, posterior) -> list[str]:
    """Why a result holds more than the DP mechanisms released, judged with its model."""
    from pymc_dp.records import deterministics_reading_data

    reasons = []
    total = int(sum(np.size(v) for v in callscope.initial_point(model).values()))
    ndim = _per_iteration(stats, "dp_ndim")
    if ndim is not None:
        covered = int(ndim.min()) if ndim.size else 0
        if covered < total:
            reasons.append(
                f"pymc_dp steps sampled {covered} of the model's {total} free parameters; the "
                "rest were sampled by a non-private step that reads the data without noise"
            )
    stored = set(posterior.data_vars)
    leaky = [d.name for d in deterministics_reading_data(model) if d.name in stored]
    if leaky:
        reasons.append(f"Deterministics {leaky} are computed from the data and stored")
    reasons += _predictive_reasons(idata, model)
    return reasons


#: Groups of draws PyMC adds after sampling (``pm.sample_posterior_predictive(...,
#: extend_inferencedata=True)``, ``pm.sample_prior_predictive``): draws of the observed
#: variables at the model's current data (``predictions``: with ``predictions=True``; judged
#: like the others, since without ``pm.set_data`` its draws are at the records' covariates).
PREDICTIVE_GROUPS = ("posterior_predictive", "prior_predictive", "predictions")


def _predictive_reasons(idata, model) -> list[str]:
    """Predictive draws in the result that are per-record functions of the data.

    A posterior predictive draw of record ``i``, ``y_rep_i ~ p(y | theta, x_i)``, reads the
    record's covariates ``x_i`` without noise: averaged over the draws it gives
    ``E[y | theta, x_i]`` record by record (for a linear regression, ``a + x_i b``, from which
    ``x_i`` follows). Draws of a variable whose distribution reads no record data (no
    covariates: a function of the DP draws alone) are post-processing and pass. Judged from
    the model's graph (data-free). Found on the issue-26 sweep: after
    ``extend_inferencedata=True`` and removing ``observed_data`` the report called such a
    result private. Containers named in the group's ``dp_public_data`` attribute (set by
    `pymc_dp.sample_posterior_predictive` for the ``pm.Data`` it set to public values before
    the draws) are not counted as record data.
    """
    from pymc_dp.records import deterministics_reading_data
    from pymc_dp.records.graph_facts import count_records, record_data_read

    n = count_records(model)
    data_dets = {d.name for d in deterministics_reading_data(model)}
    reasons = []
    for group in PREDICTIVE_GROUPS:
        ds = _get_group(idata, group)
        if ds is None:
            continue
        # containers pymc_dp.sample_posterior_predictive set to public values for the draws
        tag = str(ds.attrs.get("dp_public_data", ""))
        public = frozenset(model[k] for k in tag.split(",") if k in model.named_vars)
        read = set()
        for name in ds.data_vars:
            var = model.named_vars.get(name)
            if var is None:
                continue
            if public and var not in model.observed_RVs:
                if record_data_read([var], model, n, exclude=public):
                    read.add(name)
            elif name in data_dets:
                read.add(name)
            elif var in model.observed_RVs and record_data_read(
                var.owner.inputs, model, n, exclude=public
            ):
                read.add(name)
        if read:
            reasons.append(
                f"the {group} group holds draws of {sorted(read)} at the records' own data "
                "(covariates): per-record functions of the data without noise; remove the "
                "group before publishing (for draws at public covariates: "
                "pymc_dp.sample_posterior_predictive(idata, public_data={...}))"
            )
    return reasons


def privacy_report(
    idata,
    delta: float | None = None,
    *,
    tuning_steps: int | None = None,
    attach: bool = True,
    model=None,
) -> PrivacyReport:
    """Compose the privacy spend of a pymc_dp run and attach it to the result.

    Parameters
    ----------
    idata : arviz.InferenceData or xarray.DataTree
        What ``pm.sample`` returned (PyMC 5.x or 6.x).
    delta : float, optional
        Delta at which to report epsilon. Default: the target delta the steps were calibrated
        for (recorded in the ``dp_target_delta`` stat).
    tuning_steps : int, optional
        Warmup iterations per chain, when the result carries neither the warmup stats nor
        PyMC's ``tuning_steps`` attribute.
    attach : bool
        Write the flat ``dp_*`` attributes into ``idata.attrs`` and the posterior's attrs.
    model : pm.Model, optional
        The model that was sampled (default: the model of the enclosing ``with`` context,
        if any). With it the report also checks that pymc_dp steps sampled every free
        variable and that no stored Deterministic reads the data; a result that fails a
        check is reported as NOT private (``report.private`` is False, ``epsilon`` is
        infinite, and ``str(report)`` says why in its first line). Without it the result is
        unverified: ``report.private`` is False, ``epsilon`` what the mechanisms spent.
        Whatever the model, the report also checks from the result that its draws are the
        contiguous iterations the steps counted (``dp_iteration``: not thinned or sliced),
        that a step that used a pre-sampling release has its account
        (``dp_needs_presample``, ``dp_presample_mu``) and that no raw-data group is left.

    Returns
    -------
    PrivacyReport

    References
    ----------
    Sommer, Meiser, Mohammadi (2019), Lemma 12 (tight composition of Gaussian mechanisms);
    DP-HMC paper Theorem 2.4 / 3.5; Kairouz, Oh, Viswanath (2015) for (epsilon, delta) parts.
    """
    _check_is_a_result(idata)
    stats = _get_group(idata, "sample_stats")
    posterior = _get_group(idata, "posterior")
    if stats is None and any(_get_group(idata, g) is not None for g in PREDICTIVE_GROUPS):
        raise ValueError(
            "this is a predictive result (what pm.sample_posterior_predictive returns): it has "
            "no pymc_dp privacy stats and is not a DP output: its draws are at the records' "
            "own data and its observed_data/constant_data groups are the raw data; for "
            "draws at public covariates without the raw data use "
            "pymc_dp.sample_posterior_predictive(idata, public_data={...})"
        )
    if stats is None or posterior is None or "dp_mu" not in stats:
        raise ValueError(
            "this result has no pymc_dp privacy stats (sample_stats.dp_mu): it was not sampled "
            "with a pymc_dp step, so no privacy guarantee can be reported"
        )
    warm = _get_group(idata, "warmup_sample_stats")
    mu_draws = _per_iteration(stats, "dp_mu")
    chains, draws = mu_draws.shape
    if warm is not None and "dp_mu" in warm:
        mu_warm = _per_iteration(warm, "dp_mu")
        n_tune = mu_warm.shape[1]
    else:
        n_tune = tuning_steps if tuning_steps is not None else _tuning_steps(idata, posterior)
        mu_warm = None

    def total(name: str) -> float:
        d = _per_iteration(stats, name)
        if d is None:
            return 0.0
        w = _per_iteration(warm, name) if mu_warm is not None else None
        if w is not None:
            return float(d.sum() + w.sum())
        # Warmup draws were discarded: every step charges a constant per iteration.
        per_iter = d.max(axis=1)
        if not np.allclose(d, per_iter[:, None]):
            raise ValueError(f"stat {name} varies within a chain; keep the warmup draws")
        return float(d.sum() + n_tune * per_iter.sum())

    mu = total("dp_mu")
    releases = int(round(total("dp_releases")))
    # Gaussian mechanisms run before the chains (pymc_dp.sample's automatic mode: warm start,
    # clip selection), recorded as data-free attributes of the result
    pre_mu, pre_releases, phases = _presample(idata, posterior)
    mu += pre_mu
    releases += pre_releases
    ledger = PrivacyLedger()
    parts = []
    if delta is None:
        td = np.asarray(stats["dp_target_delta"].values, dtype=float)
        td = td[np.isfinite(td) & (td > 0)]
        if td.size == 0:
            raise ValueError(
                "no target delta was recorded (the steps were given noise multipliers): pass "
                "delta=..., e.g. well below 1/n"
            )
        delta = float(td.min())
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1); got {delta!r}")
    owners_stat = _per_iteration(stats, "dp_owners")
    owners = int(owners_stat.max()) if owners_stat is not None and owners_stat.size else 0
    if mu > 0 and owners:
        # Every owner sees every release: each owner's loss is that of the Gaussian releases
        # with the same total mu (DataSharingGaussianEvent.owner_event).
        ledger.add(DataSharingGaussianEvent(float(np.sqrt(1.0 / (2.0 * mu))), owners).owner_event())
        parts.append(
            f"{releases} releases of the data-sharing scheme with {owners} owners, each adding "
            "its own Gaussian noise (Yildirim & Ermis 2019, Algorithm 2); each owner's loss "
            "composed by the tight Gaussian bound (Sommer et al. 2019 Lemma 12)"
        )
    elif mu > 0:
        # A single event with the same total mu: noise multiplier sqrt(1 / (2 mu)).
        ledger.add(GaussianEvent(float(np.sqrt(1.0 / (2.0 * mu)))))
        parts.append(
            f"{releases} Gaussian-mechanism releases composed by the tight bound (privacy loss "
            "N(mu, 2mu); Sommer et al. 2019 Lemma 12, DP-HMC paper Thm 2.4)"
        )
        if phases:
            parts.append(f"phases: {phases}")
        centre_mu = total("centre_mu") if "centre_mu" in stats else 0.0
        if centre_mu > 0:
            # DPExpFamilyPenalty's releases before the chains (StatCentre), in dp_mu
            parts.append(
                f"of which mu = {centre_mu:.4g} for the exponential-family centre and clip "
                "quantiles released before the chains (StatCentre), charged once per chain"
            )
    it_eps = _per_iteration(stats, "dp_iter_epsilon")
    if it_eps is not None and np.any(it_eps > 0):
        it_del = _per_iteration(stats, "dp_iter_delta")
        if mu_warm is not None:
            it_eps = np.concatenate([_per_iteration(warm, "dp_iter_epsilon"), it_eps], axis=1)
            it_del = np.concatenate([_per_iteration(warm, "dp_iter_delta"), it_del], axis=1)
            extra = 0
        else:
            extra = n_tune
        # Homogeneous composition with the worst per-iteration charge (conservative).
        e_max, d_max = float(it_eps.max()), float(it_del.max())
        count = int(it_eps.size + extra * chains)
        ledger.add(ApproxDPEvent(e_max, d_max, count))
        parts.append(
            f"{count} (epsilon={e_max:.4g}, delta={d_max:.3g})-DP iterations composed by the "
            "optimal homogeneous composition theorem (Kairouz, Oh, Viswanath 2015)"
        )
        min_delta = 1.0 - (1.0 - d_max) ** count
        if min_delta >= delta:
            parts.append(
                f"no finite epsilon at delta={delta:.3g}: these iterations alone compose to "
                f"delta >= {min_delta:.3g}"
            )
    sub_families = _subsampled_families(stats, warm if mu_warm is not None else None, n_tune)
    for _, label, _ in sub_families:
        parts.append(label)
    mechanism = "; ".join(parts) if parts else "no data access recorded"
    epsilon = _combined_epsilon(ledger, sub_families, delta)
    if sub_families and len(ledger):
        parts.append("parts combined by sequential composition, delta split equally")
        mechanism = "; ".join(parts)
    nonprivate = any(
        name.endswith("_NONPRIVATE") and np.any(np.isfinite(np.asarray(stats[name].values)))
        for name in stats.data_vars
    )
    raw = tuple(g for g in RAW_DATA_GROUPS if g in _groups(idata))
    reasons, unverified = _iteration_checks(stats, warm if mu_warm is not None else None, n_tune)
    needs = _per_iteration(stats, "dp_needs_presample")
    if needs is not None and np.any(needs > 0) and not _has_presample(idata, posterior):
        reasons.append(
            "a step used a release made before the chains (a control variate's noisy gradient "
            "sum, or the one-shot strategy's releases its draws come from) whose account (the "
            "dp_presample_mu attribute) is not in the result"
        )
    if nonprivate:
        reasons.append("non-private diagnostics (stats ending in _NONPRIVATE) were emitted")
    foreign = sorted(set(stats.data_vars) - _known_stat_names())
    if foreign:
        reasons.append(
            f"sampler stats {foreign} come from a step that is not a pymc_dp step (it read "
            "the data without a privacy mechanism)"
        )
    if model is None:
        import pymc as pm

        try:
            model = pm.modelcontext(None)
        except TypeError:
            model = None
    if model is not None:
        reasons += _model_reasons(idata, stats, model, posterior)
    else:
        unverified.append(
            "no model was given: that every free variable was sampled by a pymc_dp step and "
            "that no stored Deterministic reads the data was not checked"
        )
    # the raw records in the result: NOT private as it is, but removable, so the epsilon of
    # the mechanisms (that of the result without those groups) is still reported
    removable = [f"raw data groups {list(raw)} are in the result"] if raw else []
    planned = _per_iteration(stats, "dp_plan_chains")
    plan_exceeded = bool(
        planned is not None and np.any(planned > 0) and chains > int(planned[planned > 0].min())
    )
    total_var = float("nan")
    if owners:
        # the noise of the test's release: "noise_std" (penalty), "llr_noise_std" (DP-HMC)
        name = "noise_std" if _per_iteration(stats, "noise_std") is not None else "llr_noise_std"
        sd = _per_iteration(stats, name)
        if sd is not None:
            w = _per_iteration(warm, name) if mu_warm is not None else None
            both = sd if w is None else np.concatenate([w, sd], axis=1)
            total_var = float(np.mean(both**2))
    report = PrivacyReport(
        method=str(idata.attrs.get("dp_method", posterior.attrs.get("dp_method", ""))),
        convergence=_convergence_line(idata, posterior, stats),
        owners=owners,
        owner_epsilons=tuple([float(epsilon) if not reasons else float("inf")] * owners),
        noise_variance_factor=max(owners, 1),
        total_noise_variance=total_var,
        epsilon=epsilon if not reasons else float("inf"),
        delta=float(delta),
        mu=mu,
        mechanism=mechanism,
        releases=releases,
        chains=int(chains),
        iterations=int(chains * (draws + n_tune)),
        tuning_iterations=int(n_tune),
        draws=int(draws),
        nonprivate_diagnostics=bool(nonprivate),
        raw_data_groups=raw,
        private=not reasons and not removable and not unverified,
        not_private_reasons=tuple(reasons + removable),
        unverified_reasons=tuple(unverified) if not (reasons or removable) else (),
        mechanism_epsilon=epsilon,
        model_checked=model is not None,
        plan_exceeded=plan_exceeded,
    )
    if reasons:
        warnings.warn(
            "this result is NOT differentially private: " + "; ".join(reasons),
            UserWarning,
            stacklevel=2,
        )
    if plan_exceeded:
        warnings.warn(
            f"the run made {chains} chains, more than its steps were calibrated for: the "
            f"reported epsilon ({epsilon:.4g}) counts every chain and exceeds the target",
            UserWarning,
            stacklevel=2,
        )
    if raw:
        warnings.warn(
            f"this result still carries raw data ({', '.join(raw)}); remove those groups before "
            "publishing it (pymc_dp.sample removes them unless keep_data=True)",
            UserWarning,
            stacklevel=2,
        )
    if attach:
        attrs = report.to_attrs()
        idata.attrs.update(attrs)
        idata["posterior"].attrs.update(attrs)
    return report


class _CallableModule(types.ModuleType):
    """This module, callable: ``pymc_dp.report(idata, ...)`` is `privacy_report` (found on
    the issue-26 sweep: a user reading "the privacy report" wrote ``pymc_dp.report(idata)``
    and got ``TypeError: 'module' object is not callable``)."""

    def __call__(self, *args: Any, **kwargs: Any) -> PrivacyReport:
        return privacy_report(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


#: the convergence lines the report's first line repeats: the chains did not converge, the
#: one-shot strategy gave way, or its released curvature may hide a shortfall
UNUSABLE_PREFIXES = ("NOT CONVERGED", "NOT USABLE", "IN DOUBT")


def _convergence_line(idata, posterior, stats) -> str:
    """The run's convergence line: ``pymc_dp.sample``'s ``dp_convergence`` attribute, or,
    for a result of ``pm.sample(step=pymc_dp....)`` (which writes none), the same diagnostics
    computed here from its draws and its steps' ``accepted`` stat
    (`pymc_dp.diagnostics.check_convergence`: post-processing of the DP outputs). Empty
    where the result has no ``accepted`` stat to judge a frozen chain by."""
    line = idata.attrs.get("dp_convergence", posterior.attrs.get("dp_convergence", None))
    if line is not None:
        return str(line)
    if stats is None or "accepted" not in stats:
        return ""
    from pymc_dp.diagnostics import check_convergence

    return check_convergence(idata, warn=False).summary()
