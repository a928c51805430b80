"""``pymc_dp.plan``: the automatic configuration and its predicted accuracy, before any data.

Everything here is computed from public facts: the budget, the number of records ``n`` and
parameters ``d`` (shapes only), and the budget split. The accuracy prediction rests on one
stated assumption (see `plan`), so it is a guide, not a guarantee.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
import scipy.stats
from scipy import optimize

from pymc_dp._validation import check_positive, check_target
from pymc_dp.accounting import gaussian_mu_for_epsilon
from pymc_dp.auto.bounds import check_data_bounds, clip_plan
from pymc_dp.auto.configure import (
    ONESHOT_CLIP_PHASE,
    ONESHOT_CLIP_SHARE,
    ONESHOT_FALLBACK_ESS,
    ONESHOT_SPLIT,
    WARM_START_GROWTH,
    BudgetSplit,
    Phase,
    presample_phases,
    stats_phases,
)
from pymc_dp.auto.oneshot import ONESHOT_NEWTON_STEPS, choose_method
from pymc_dp.auto.suffstats import STATS_ERROR_SCALE

__all__ = ["Plan", "plan", "predicted_mean_error", "worst_of"]

#: Assumed per-record Fisher information along one parameter, in units of the squared clip
#: bound of the per-record gradient, times ``d``: ``I_j = FISHER_SHARE b^2 / d``. Measured on
#: a logistic regression with features in [-1, 1]^10 (0.066 per coordinate at b = 2.5).
FISHER_SHARE = 0.1

#: Predicted error (posterior sds) above which `plan` warns that the run is not usable.
USABLE_ERROR = 0.5

#: Nominal share of ``mu`` of the control variate's release (the run chooses it after the
#: warm start, `pymc_dp.auto.configure.choose_anchor_share`; measured 0.3-0.6).
NOMINAL_ANCHOR_SHARE = 0.4


def predicted_mean_error(n: int, d: int, anchor_noise_multiplier: float) -> float:
    """Predicted error of a posterior mean in posterior sds, per coordinate.

    The automatic run samples the posterior tilted by the noise ``xi`` of the control
    variate's gradient release (std ``2 z b`` per coordinate), which shifts the mean by
    ``Sigma xi``: with ``Sigma ~ 1 / (n I)`` and ``I = FISHER_SHARE b^2 / d`` this is
    ``2 z / sqrt(n FISHER_SHARE / d)`` posterior sds.
    """
    return 2.0 * anchor_noise_multiplier / math.sqrt(n * FISHER_SHARE / d)


def worst_of(d: int) -> float:
    """The median of the largest of ``d`` independent ``|N(0, 1)|``: what a per-coordinate
    error of one posterior sd gives on the worst of ``d`` posterior means, median over runs
    (the statistic of benchmarks/bench_auto.py: ``max_j |DP mean - NUTS mean| / NUTS sd``)."""
    return float(scipy.stats.norm.ppf(0.5 * (1.0 + 0.5 ** (1.0 / max(int(d), 1)))))


@dataclass
class Plan:
    """The configuration `plan` predicts, with its phases and warnings."""

    n: int
    d: int
    epsilon: float
    delta: float
    chains: int
    mu_total: float
    phases: list[Phase]
    predicted_error: float
    data_bounds: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    #: where each clip bound will come from (declared bounds or a DP histogram)
    clip_sources: dict = field(default_factory=dict)
    #: the strategy the automatic mode will choose (`pymc_dp.auto.oneshot.choose_method`)
    method: str = "chain"
    #: each candidate strategy's predicted error (same statistic as ``predicted_error``);
    #: a strategy that is not a candidate for this model maps to the reason in words
    candidates: dict = field(default_factory=dict)
    #: why the chosen strategy is not the one of the smallest prediction, where it is not
    choice_note: str = ""

    def __str__(self) -> str:
        lines = [
            f"pymc_dp plan: n = {self.n} records, d = {self.d} parameters, "
            f"(epsilon, delta) = ({self.epsilon:g}, {self.delta:g}), {self.chains} chains",
            f"  privacy-loss parameter mu = {self.mu_total:.4g} (loss ~ N(mu, 2 mu)), split:",
        ]
        for p in self.phases:
            lines.append(
                f"    {p.name}: {p.releases} releases, {p.multiplier_text()}"
                f" ({100 * p.mu / self.mu_total:.1f}% of mu)"
            )
        if self.method == "stats":
            lines.append(
                f"    sufficient statistics: one noisy clipped whitened sum, the rest "
                f"({100 * self._sampling_share():.1f}% of mu); independent draws from the "
                "noise-aware posterior of the released statistics"
            )
            basis = (
                f"{STATS_ERROR_SCALE:g} D z / sqrt(n), measured on linear regressions (a "
                "heavy-tailed response does worse: the run warns from its released values)"
            )
        elif self.method == "laplace":
            lines.append(
                f"    one-shot: two noisy clipped gradient sums, the rest "
                f"({100 * self._sampling_share():.1f}% of mu), half each; independent draws "
                "from the noise-aware Laplace approximation they give"
            )
            basis = "all of the rest for the two last releases"
        else:
            lines.append(
                f"    control variate and sampling (penalty tests): the rest "
                f"({100 * self._sampling_share():.1f}% of mu), split after the warm start to "
                "minimise the predicted error; run length chosen by the predicted effective "
                "sample size"
            )
            basis = f"{NOMINAL_ANCHOR_SHARE:.0%} of mu for the control variate"
            lines.append(
                "    (with method='auto', where the chain's effective sample size predicted "
                f"after the warm start is below {ONESHOT_FALLBACK_ESS:.0f}, the rest goes to "
                "the one-shot strategy's two last releases instead)"
            )
        lines.insert(1, f"  strategy: {self.method} ({_METHOD_TEXT[self.method]})")
        lines.append(
            f"  predicted error of the worst of the {self.d} posterior means (median over "
            f"runs): about {self.predicted_error:.2g} posterior sds ("
            + (
                f"assumes {basis}"
                if self.method == "stats"
                else f"assumes per-record Fisher information {FISHER_SHARE} b^2 / d and {basis}"
            )
            + ")"
        )
        if self.candidates:
            lines.append("  candidate strategies (predicted error, the same statistic):")
            for name, err in self.candidates.items():
                what = f"{err:.2g}" if isinstance(err, float) else f"not a candidate: {err}"
                lines.append(f"    {name}: {what}" + ("  <- chosen" if name == self.method else ""))
            if self.choice_note:
                lines.append(f"    ({self.choice_note})")
        if self.data_bounds:
            lines.append(f"  declared data bounds: {self.data_bounds}")
            for k, v in self.clip_sources.items():
                lines.append(f"    {k}: from {v}")
        lines += [f"  WARNING: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _sampling_share(self) -> float:  # what the fixed-share phases leave
        return 1.0 - sum(p.mu for p in self.phases) / self.mu_total


_METHOD_TEXT = {
    "laplace": "one-shot noise-aware private Laplace approximation: the model has no "
    "hierarchical block",
    "chain": "the penalty chain: the model has a hierarchical or shifted block",
    "stats": "the noise-aware posterior of released sufficient statistics: a linear "
    "regression with declared bounds",
}


def _nominal_anchor_z(mu_total: float) -> float:
    return math.sqrt(1.0 / (2.0 * NOMINAL_ANCHOR_SHARE * mu_total))


def _oneshot_z(mu_total: float) -> float:
    """The noise multiplier of one release with the two last releases' budget together
    (their combination's noise, `pymc_dp.auto.oneshot.noise_aware_laplace`), after their
    clip bound's histogram (`ONESHOT_CLIP_SHARE`)."""
    share = 1.0 - ONESHOT_SPLIT.warm_start - ONESHOT_SPLIT.histograms - ONESHOT_CLIP_SHARE
    return math.sqrt(1.0 / (2.0 * share * mu_total))


def _epsilon_needed(delta: float, error_at) -> float:
    """The smallest epsilon whose predicted error ``error_at(mu)`` is usable (inf: none)."""

    def err(log_eps: float) -> float:
        return error_at(gaussian_mu_for_epsilon(math.exp(log_eps), delta)) - USABLE_ERROR

    if err(math.log(1e4)) > 0:
        return float("inf")
    return math.exp(optimize.brentq(err, math.log(1e-4), math.log(1e4), xtol=1e-6))


def _largest_usable_d(n: int, d: int, z: float) -> int:
    """The most parameters with a usable predicted error at this ``n`` and noise (0: none)."""
    k = d
    while k >= 1 and predicted_mean_error(n, k, z) * worst_of(k) > USABLE_ERROR:
        k -= 1
    return k


def plan(
    *,
    epsilon: float,
    delta: float,
    chains: int = 4,
    data_bounds: dict | None = None,
    model: pm.Model | None = None,
    split: BudgetSplit | None = None,
    verbose: bool = True,
    derive_clips: bool = False,
) -> Plan:
    """The automatic configuration of ``pymc_dp.sample(step=None)`` and its prediction.

    Reads no data: only the model's shapes (``n``, ``d``) and the arguments. Prints the plan
    (``verbose``) and warns, with numbers, when the predicted error of the posterior means
    exceeds half a posterior sd, naming what would help (more records, a larger epsilon,
    fewer parameters).

    Parameters
    ----------
    epsilon, delta : float
        The budget of the whole run.
    chains : int
    data_bounds : dict, optional
        Public bounds (validated against the model's names; see `check_data_bounds`). The
        clip bounds they give (`pymc_dp.auto.bounds.clip_plan`, data-free) are listed, and
        the histogram phases they replace are left out of the split.
    model : pm.Model, optional
        Default: the model of the enclosing ``with`` block.
    split : BudgetSplit, optional
    verbose : bool
        Print the plan.
    derive_clips : bool
        As in `pymc_dp.auto.auto_configure` (``auto_kwargs={"derive_clips": True}`` of
        ``pymc_dp.sample``): clip bounds from ``data_bounds``.

    Returns
    -------
    Plan
    """
    from pymc_dp.records import count_records

    model = pm.modelcontext(model)
    epsilon, delta = check_target(epsilon, delta)
    chains = check_positive(chains, "chains", integer=True, coerce=True)
    bounds = check_data_bounds(model, data_bounds) if data_bounds is not None else {}
    from pymc_dp.auto.recentre import find_recentring
    from pymc_dp.auto.suffstats import (
        linear_stats_model,
        stats_last_share,
        stats_predicted_error,
    )

    hierarchical = bool(find_recentring(model, model.value_vars))
    fm, why = (None, "a hierarchical or shifted block")
    if not hierarchical:
        fm, why = linear_stats_model(model, model.value_vars, model.initial_point(), bounds)
    method = choose_method("auto", hierarchical, linear_stats=fm is not None, why_not_stats=why)
    one_shot = method in ("laplace", "stats")
    split = split or (ONESHOT_SPLIT if one_shot else BudgetSplit())
    n = count_records(model)
    ip = model.initial_point()
    d = int(sum(np.size(v) for v in ip.values()))
    q0 = np.concatenate([np.ravel(ip[v.name]) for v in model.value_vars])
    _, sources = clip_plan(model, model.value_vars, ip, bounds, q0, derive_clips)
    mu = gaussian_mu_for_epsilon(epsilon, delta)
    phases = presample_phases(
        mu,
        split,
        gradient_histograms=sources.get("warm-start gradient clip") != "data_bounds",
        residual_histogram=not one_shot and sources.get("penalty-test clip") != "data_bounds",
        **({"newton_steps": ONESHOT_NEWTON_STEPS} if one_shot else {"growth": WARM_START_GROWTH}),
    )
    if method == "laplace" and sources.get("warm-start gradient clip") != "data_bounds":
        phases.append(Phase(ONESHOT_CLIP_PHASE, math.sqrt(1 / (2 * ONESHOT_CLIP_SHARE * mu)), 1))
    z_of = _oneshot_z if one_shot else _nominal_anchor_z
    laplace_err = predicted_mean_error(n, d, z_of(mu)) * worst_of(d)
    err = laplace_err
    stats = None
    if fm is not None:
        stats = stats_phases(mu, epsilon, delta)
        stats_err = stats_predicted_error(n, fm.n_covariates, stats[-1].noise_multiplier)
        if method == "stats":
            phases, err = stats[:-1], stats_err
    out = Plan(n, d, epsilon, delta, int(chains), mu, phases, err, bounds, clip_sources=sources)
    out.method = method
    chain_err = predicted_mean_error(n, d, _nominal_anchor_z(mu)) * worst_of(d)
    out.candidates = {
        "laplace": laplace_err
        if not hierarchical
        else "a hierarchical or shifted block: the posterior is far from Gaussian",
        "stats": stats_err if fm is not None else why,
        "chain": chain_err,
    }
    if method == "stats":
        out.choice_note = (
            "stats is chosen wherever it applies: on the real linear regressions of "
            "docs/auto.md laplace came out 3 to 1e11 posterior sds off (flagged) where stats "
            "stayed honest, its prediction within 1.6 times of the measured error (37-56 "
            "times optimistic on a heavy-tailed response, where the run warns)"
        )
    if method == "stats":
        out.clip_sources = {
            "statistics' centre clip (each statistic's range in the box)": "data_bounds",
            "whitened statistics' clip": "DP histogram",
        }
    if err > USABLE_ERROR:
        if method == "stats":

            def error_at(m: float) -> float:
                z = math.sqrt(1 / (2 * stats_last_share() * m))
                return stats_predicted_error(n, fm.n_covariates, z)

            d_max = 0  # (the statistics grow with the covariates' products: not a count)
        else:

            def error_at(m: float) -> float:
                return predicted_mean_error(n, d, z_of(m)) * worst_of(d)

            d_max = _largest_usable_d(n, d, z_of(mu))
        eps_needed = _epsilon_needed(delta, error_at)
        n_needed = int(math.ceil(n * (err / USABLE_ERROR) ** 2))
        out.warnings.append(
            f"at n = {n} and epsilon = {epsilon:g} expect posterior means about {err:.2g} "
            f"posterior sds off: not a usable posterior. Reaching {USABLE_ERROR} sd needs "
            f"epsilon >= {eps_needed:.3g} at this n, or n >= {n_needed} at this epsilon"
            + (f", or at most {d_max} parameters" if d_max >= 1 else "")
            + (
                " (the one-shot result's intervals include this noise: wide rather than off)"
                if one_shot
                else ""
            )
        )
    if delta > 1.0 / n:
        out.warnings.append(
            f"delta = {delta:g} is larger than 1/n = {1.0 / n:g}; choose delta well below 1/n"
        )
    if verbose:
        print(out)
    return out
