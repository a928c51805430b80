"""Step classes configured privately: ``pymc_dp.sample(step=C, epsilon=, delta=)``.

When a step class is given without its data-dependent hyperparameters (clip bounds, step
size or proposal scale, mass matrix, initial point), `pymc_dp.sample` takes them from the
automatic mode's private phases (`pymc_dp.auto.configure.auto_configure`): the private
Laplace approximation (private Fisher scoring) and a DP clip selection. Those phases are
Gaussian mechanisms charged in the privacy report (``dp_presample_mu``); the step gets the
budget left, by noise multipliers fitted so that the composition of every phase and every
chain meets the target (the same helper as the automatic mode's sampling phase).

One table, `STEP_CLASSES`, says for each class which hyperparameters trigger the
configuration (the constructor's required ones: a run that gives them all is configured by
hand, as before) and how the class is configured, or why it is refused. A refusal is
raised before any data is read and names the step that suits. Explicit ``step_kwargs``
always win over the configured values.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pymc_dp import callscope
from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto.configure import (
    SAMPLING_PHASE,
    AutoPlan,
    Phase,
    PresampleSpend,
    RunLengthWarning,
    auto_configure,
)
from pymc_dp.step_methods.parts import accepted_keywords

__all__ = [
    "ClassConfig",
    "ConfiguredStep",
    "STEP_CLASSES",
    "check_configurable",
    "configure_step_class",
    "wants_configuration",
]

#: Leapfrog steps of a configured DPHMC: every step is a gradient release, so few of them
#: leave each release less noise; with the approximation's mass matrix three steps of the
#: configured size cover about one posterior sd.
HMC_LEAPFROG = 3
#: Mean trajectory length of a configured DPHMC in posterior sds (the step of iteration
#: ``i`` is ``eta h_i``, ``h_i`` uniform in (0, 1): ``eta = 2 T / L``).
HMC_TRAJECTORY = 1.0
#: Noise sd of the penalty test the configured run length aims at, for a move of the
#: configured length (`_hmc_iterations`): the acceptance falls like ``exp(-sigma^2 / 2)``.
TEST_NOISE = 1.5
#: Fewest draws per chain a configured run chooses (R-hat needs a few dozen).
MIN_DRAWS = 50
#: Fewest iterations per chain the public prediction of a configured DPHMC run must allow
#: (`_precheck_hmc`). Measured on bench_auto's logistic3 at n = 20 000, 4 chains
#: (benchmarks/bench_step_classes.py, one seed; the prediction is about twice the run
#: length the configuration then chooses from its DP outputs): predicted 373 per chain at
#: epsilon 40 (the run chose 178; R-hat 1.38), 1314 at epsilon 100 (626; R-hat 1.114),
#: 2210 at epsilon 150 (1055; R-hat 1.027, max err 0.05 NUTS sd).
HMC_MIN_PREDICTED = 2000
#: Step size of a configured DP-SGLD / DP-SGNHT over the largest eigenvalue of the private
#: Laplace precision: on a Gaussian target the stationary variance along that direction is
#: ``1 / (1 - eta P / 4)`` = 1.14 times the posterior's (`DPSGLD`), less along the others.
SGLD_STEP = 0.5
#: Step size of a configured DP-SGNHT over the square root of that eigenvalue (its
#: unit-mass momenta move ``theta`` by ``p eta``: 0.2 posterior sd per step along the
#: stiffest direction). Each step's DP gradient noise heats the momenta by ``(sigma C
#: eta)^2``, which the thermostat must absorb: at 0.5 the logistic3 benchmark diverged; at
#: 0.1 linear3's chains mixed too slowly (R-hat 1.13-1.15 over 3 seeds, 1.03-1.10 at 0.2).
SGNHT_STEP = 0.2
#: Default draws per chain of a configured DP-SGLD / DP-SGNHT (no warmup: the chains start
#: at draws from the private approximation).
SGLD_DRAWS = 1000


@dataclass
class ConfiguredStep:
    """A step class's configuration: constructor arguments, run length, starts, phases."""

    kwargs: dict
    draws: int
    tune: int
    initvals: list[dict] | None
    plan: AutoPlan


@dataclass(frozen=True)
class ClassConfig:
    """How `pymc_dp.sample` configures one step class when its hyperparameters are missing.

    ``required``: the constructor's data-dependent hyperparameters with no default; the
    configuration runs when any of them is missing from ``step_kwargs``. ``configure``
    builds the configuration (`ConfiguredStep`), or ``refusal`` says why the class is
    refused (raised before any data is read) and which step suits.
    """

    required: tuple[str, ...]
    configure: Callable[..., ConfiguredStep] | None = None
    refusal: str | None = None
    #: keys a configured run sets itself (a value in ``step_kwargs`` is refused: the noise
    #: is fitted to the budget the private phases leave)
    reserved: tuple[str, ...] = field(default=())
    #: the configuration runs when every one of ``required`` is missing (alternatives, as
    #: DPExpFamilyPenalty's ``data_bounds`` or ``stat_clip_bound``) rather than any
    alternatives: bool = False
    #: ``(cls, model, epsilon, delta, chains, draws, tune, step_kwargs, n) -> None``:
    #: refuses, from public facts only (shapes, the budget), a run predicted not to
    #: converge (``n``: the number of records, None: counted from the model)
    precheck: Callable[..., None] | None = None


def _presample_mu(plan: AutoPlan) -> float:
    return float(sum(p.mu for p in plan.phases if p.name != SAMPLING_PHASE))


def _fit_noise(plan: AutoPlan, parts: list[tuple[float, int]]) -> float:
    """Scale the noise multipliers of the step's releases ``[(z, releases), ...]`` (their
    ratios fixed) so that their composition with the plan's phases meets the target, with
    the relative margin of `pymc_dp.auto.configure._last_noise_multiplier`. Returns the
    factor."""
    pre = [GaussianEvent(p.noise_multiplier, p.releases) for p in plan.phases]

    def eps(f: float) -> float:
        return compose_epsilon([*pre, *(GaussianEvent(z * f, k) for z, k in parts)], plan.delta)

    f = 1.0
    while eps(f) > plan.epsilon * (1 - 1e-9):
        f *= 1.0 + 1e-9
    return f


def _auto_configure(model, ctx, **options) -> AutoPlan:
    """`auto_configure` for the run in ``ctx`` (the target, run length, records)."""
    keys = ("epsilon", "delta", "chains", "draws", "tune", "rng", "records", "spend")
    chunk_size = ctx["step_kwargs"].get("chunk_size")
    return auto_configure(model, **{k: ctx[k] for k in keys}, chunk_size=chunk_size, **options)


def _warm_start(model, ctx) -> AutoPlan:
    return _auto_configure(model, ctx, warm_start_only=True)


def _configure_penalty(model, ctx) -> ConfiguredStep:
    """DPPenaltyMetropolis: the automatic mode's penalty chain (``method="chain"``): its
    independence proposal on the private Laplace approximation, first-order control variate
    and DP clip of the ratio residuals, run length by the predicted effective sample size
    unless ``draws`` is given."""
    plan = _auto_configure(model, ctx, method="chain")
    return ConfiguredStep(dict(plan.step_kwargs), plan.draws, plan.tune, plan.initvals, plan)


def _hmc_iterations(mu_test: float, llr_bound: float, move: float) -> int:
    """Iterations (all chains) at which the penalty test's noise sd ``2 z_l b_l ||move||``
    is `TEST_NOISE`, ``z_l = sqrt(k / (2 mu_test))`` (DP-HMC paper Theorem 3.5)."""
    return max(1, int(2.0 * mu_test * (TEST_NOISE / (2.0 * llr_bound * move)) ** 2))


def _precheck_hmc(cls, model, epsilon, delta, chains, draws, tune, step_kwargs, n) -> None:
    """Refuse a configured DPHMC run predicted not to converge, before any data is read.

    Public prediction (`pymc_dp.auto.plan`'s assumption: per-record Fisher information
    ``FISHER_SHARE b^2 / d`` per coordinate, so that ``b^2 sum_j sd_j^2 = d^2 /
    (FISHER_SHARE n)``): the iterations at which the penalty test's noise for a move of
    `HMC_TRAJECTORY` posterior sds is `TEST_NOISE` (`_hmc_iterations`), with the budget
    the private phases leave. Too few and the chains cannot mix: refused
    (with ``draws`` given, the run is warned about after the warm start instead). The
    threshold is `HMC_MIN_PREDICTED` per chain.
    """
    from pymc_dp.accounting import gaussian_mu_for_epsilon
    from pymc_dp.auto.configure import BudgetSplit
    from pymc_dp.auto.plan import FISHER_SHARE
    from pymc_dp.records import count_records

    if draws is not None:
        return
    n = count_records(model) if n is None else int(n)
    d = int(sum(np.size(v) for v in callscope.initial_point(model).values()))
    split = BudgetSplit()
    left = 1.0 - split.warm_start - split.histograms - split.clip_selection
    frac = float(step_kwargs.get("grad_budget_fraction", 0.5))
    c = 2.0 * (1.0 - math.cos(HMC_TRAJECTORY))

    def per_chain(mu_total: float, n_: float) -> float:
        b_move = math.sqrt(c * d * d / (FISHER_SHARE * n_))  # b ||move||
        return _hmc_iterations((1.0 - frac) * left * mu_total, b_move, 1.0) / chains

    mu = gaussian_mu_for_epsilon(epsilon, delta)
    k = per_chain(mu, n)
    if k >= HMC_MIN_PREDICTED:
        return
    n_needed = int(math.ceil(n * HMC_MIN_PREDICTED / max(k, 1e-12)))
    mu_needed = mu * HMC_MIN_PREDICTED / max(k, 1e-12)
    eps_needed = compose_epsilon([GaussianEvent(math.sqrt(1.0 / (2.0 * mu_needed)))], delta)
    raise ValueError(
        f"pymc_dp.sample(step=DPHMC) without llr_clip_bound and grad_clip_bound: at n = {n} "
        f"records, d = {d} parameters and (epsilon, delta) = ({epsilon:g}, {delta:g}) the "
        f"configured DPHMC is predicted to allow about {k:.0f} iterations per chain (it needs "
        f"about {HMC_MIN_PREDICTED} to converge) before its penalty test's noise for a move "
        f"of one posterior sd exceeds {TEST_NOISE:g} (each test reads every record's raw "
        "log-likelihood ratio; prediction from public shapes, assuming per-record Fisher "
        f"information {FISHER_SHARE} b^2 / d): its chains would not converge. Use step=None "
        "(the automatic mode, whose control variate removes most of each ratio) or "
        "step=pymc_dp.DPPenaltyMetropolis (configured privately the same way). DPHMC needs "
        f"about n >= {n_needed} at this epsilon, or epsilon >= {eps_needed:.3g} at this n; "
        "or give draws=, or llr_clip_bound and grad_clip_bound to configure it by hand"
    )


def _configure_hmc(model, ctx) -> ConfiguredStep:
    """DPHMC: both clip bounds from the DP quantile of the per-record gradient norms at the
    warm start (``|r_i| <= ||grad l_i|| ||theta' - theta||`` to first order, so the ratio
    clip ``b_l`` is inactive for the records under the quantile), the mass matrix from the
    private Laplace covariance (``M^{-1}`` its diagonal), a step size for a trajectory of
    `HMC_TRAJECTORY` posterior sds, starts drawn from the approximation, no warmup unless
    ``tune`` is given (nothing left to adapt), and, unless ``draws`` is given, the run
    length at which the penalty test's noise for a move of that length is `TEST_NOISE`
    (the test's noise grows with the square root of the iterations at a fixed budget)."""
    kw = ctx["step_kwargs"]
    plan = _warm_start(model, ctx)
    chains = ctx["chains"]
    n_leapfrog = int(kw.get("n_leapfrog", HMC_LEAPFROG))
    frac = float(kw.get("grad_budget_fraction", 0.5))
    b_g = float(kw.get("grad_clip_bound", plan.gradient_clip))
    b_l = float(kw.get("llr_clip_bound", plan.gradient_clip))
    sd = np.sqrt(np.diag(plan.laplace_cov))
    # the move of a trajectory of length T in the approximation's metric: q(T) - q(0) has
    # sd sqrt(2 (1 - cos T)) per coordinate (a harmonic oscillator)
    move = math.sqrt(2.0 * (1.0 - math.cos(HMC_TRAJECTORY))) * float(np.linalg.norm(sd))
    mu_left = plan.mu_total - _presample_mu(plan)
    if not mu_left > 0:
        raise ValueError("no budget is left for DPHMC after the private configuration")
    tune = 0 if ctx["tune"] is None else int(ctx["tune"])
    if ctx["draws"] is None:
        k = _hmc_iterations((1.0 - frac) * mu_left, b_l, move)
        draws = max(MIN_DRAWS, k // chains - tune)
    else:
        draws = int(ctx["draws"])
    iterations = chains * (draws + tune)
    z_l = math.sqrt(iterations / (2.0 * (1.0 - frac) * mu_left))
    z_g = math.sqrt(iterations * (n_leapfrog + 1) / (2.0 * frac * mu_left))
    f = _fit_noise(plan, [(z_l, iterations), (z_g, iterations * (n_leapfrog + 1))])
    z_l, z_g = z_l * f, z_g * f
    test_sd = 2.0 * z_l * b_l * move
    if ctx["draws"] is not None and test_sd > 2.0 * TEST_NOISE:
        best = _hmc_iterations((1.0 - frac) * mu_left, b_l, move) // chains
        warnings.warn(
            f"DPHMC with draws={draws} per chain ({iterations} iterations): the penalty "
            f"test's noise sd for a move of {HMC_TRAJECTORY:g} posterior sd is predicted "
            f"{test_sd:.3g} at this budget (acceptance about exp(-sd^2 / 2) = "
            f"{math.exp(-(test_sd**2) / 2):.2g}); draws=None lets the configuration choose "
            f"about {max(MIN_DRAWS, best)} per chain",
            RunLengthWarning,
            stacklevel=5,
        )
    mu_l = GaussianEvent(z_l, iterations).mu
    mu_g = GaussianEvent(z_g, iterations * (n_leapfrog + 1)).mu
    releases = iterations * (n_leapfrog + 2)
    plan.phases.append(Phase(SAMPLING_PHASE, math.sqrt(releases / (2.0 * (mu_l + mu_g))), releases))
    plan.draws, plan.tune = draws, tune
    plan.draws_requested, plan.tune_requested = ctx["draws"], ctx["tune"]
    plan.run_length_note = (
        f"{draws} draws per chain"
        + (" (as requested)" if ctx["draws"] is not None else " (chosen by the test's noise)")
        + (f" after {tune} warmup iterations" if tune else "; no warmup")
    )
    kwargs = {
        "llr_clip_bound": b_l,
        "grad_clip_bound": b_g,
        "llr_noise_multiplier": z_l,
        "grad_noise_multiplier": z_g,
        "delta": ctx["delta"],
        "n_leapfrog": n_leapfrog,
        "step_size": 2.0 * HMC_TRAJECTORY / n_leapfrog,
        "mass_matrix": 1.0 / sd**2,
        "adapt_step_size": tune > 0,
        "adapt_mass_matrix": False,
    }
    return ConfiguredStep(kwargs, draws, tune, plan.initvals, plan)


def _reduced_target(plan: AutoPlan) -> tuple[float, float]:
    """The target left to a step whose releases are accounted by another accountant than
    the Gaussian pre-sampling phases (`pymc_dp.accounting.compose_epsilon` gives each
    group of events ``delta / 2`` and adds their epsilons): ``(epsilon - eps_pre, delta /
    2)``, ``eps_pre`` the phases' epsilon at ``delta / 2``. A step calibrated for it (its
    own accountant at ``delta / 2``) makes the report's composition at most the target."""
    half = plan.delta / 2.0
    pre = [GaussianEvent(p.noise_multiplier, p.releases) for p in plan.phases]
    eps_left = plan.epsilon - compose_epsilon(pre, half)
    if not eps_left > 0:
        raise ValueError("no budget is left for the step after the private configuration")
    # the relative margin of the Gaussian fits, for the report's own floating-point sums
    return eps_left * (1.0 - 1e-9), half


def _configure_sgmcmc(model, ctx) -> ConfiguredStep:
    """DP-SGLD / DP-SGNHT (biased by design: a constant step, no accept/reject): the clip
    bound from the DP quantile of the per-record gradient norms at the warm start, the step
    size `SGLD_STEP` over the largest eigenvalue of the private Laplace precision
    (`SGNHT_STEP` over its square root for DP-SGNHT, whose unit-mass momenta move ``theta``
    by ``p eta``), the full batch (``sampling_rate=1``: in the Gaussian regime the noise of
    a subsampled release, over its rate, is no smaller, and a minibatch adds its own
    variance), starts drawn from the approximation, no warmup unless ``tune`` is given,
    `SGLD_DRAWS` draws unless ``draws`` is given, and the target the private phases leave
    (`_reduced_target`)."""
    kw = ctx["step_kwargs"]
    plan = _warm_start(model, ctx)
    eps_left, delta_left = _reduced_target(plan)
    precision = np.linalg.inv(plan.laplace_cov)
    lam = float(np.linalg.eigvalsh(0.5 * (precision + precision.T)).max())
    tune = 0 if ctx["tune"] is None else int(ctx["tune"])
    draws = SGLD_DRAWS if ctx["draws"] is None else int(ctx["draws"])
    plan.draws, plan.tune = draws, tune
    plan.draws_requested, plan.tune_requested = ctx["draws"], ctx["tune"]
    plan.run_length_note = f"{draws} draws per chain" + (
        f" after {tune} warmup iterations" if tune else "; no warmup"
    )
    # DP-SGNHT moves theta by p eta with unit-mass momenta: its step is on the sd scale
    sgnht = ctx["cls"].__name__ == "DPSGNHT"
    kwargs = {
        "clip_bound": plan.gradient_clip,
        "step_size": SGNHT_STEP / math.sqrt(lam) if sgnht else SGLD_STEP / lam,
        "epsilon": eps_left,
        "delta": delta_left,
    }
    if "batch_size" not in kw and "sampling_rate" not in kw:
        kwargs["sampling_rate"] = 1.0
    return ConfiguredStep(kwargs, draws, tune, plan.initvals, plan)


_RANDOM_WALK = (
    "{name} proposes a random walk whose every test reads each record's raw log-likelihood "
    "ratio, clipped per unit step: at a fixed budget the test's noise grows with the square "
    "root of the iterations, and a random walk (an effective draw every ~3 d accepted "
    "moves) needs more iterations than that noise allows wherever the configured DPHMC, "
    "which moves a posterior sd per iteration, is itself refused or barely converges "
    "(docs/auto.md). Use step=None (the automatic mode) or step=pymc_dp.DPPenaltyMetropolis "
    "(configured privately: an independence proposal with a control variate), or give "
    "{keys} in step_kwargs to configure {name} by hand"
)

#: The configuration of each step class (by class name; see `ClassConfig`).
STEP_CLASSES: dict[str, ClassConfig] = {
    "DPPenaltyMetropolis": ClassConfig(
        ("clip_bound",), _configure_penalty, reserved=("noise_multiplier",)
    ),
    "DPHMC": ClassConfig(
        ("llr_clip_bound", "grad_clip_bound"),
        _configure_hmc,
        reserved=("llr_noise_multiplier", "grad_noise_multiplier"),
        precheck=_precheck_hmc,
    ),
    "DPSGLD": ClassConfig(
        ("clip_bound", "step_size"), _configure_sgmcmc, reserved=("noise_multiplier",)
    ),
    "DPSGNHT": ClassConfig(
        ("clip_bound", "step_size"), _configure_sgmcmc, reserved=("noise_multiplier",)
    ),
    "DPFastMH": ClassConfig(("clip_bound",), refusal=_RANDOM_WALK),
    "DPSubsampledPenalty": ClassConfig(("batch_size", "clip_bound"), refusal=_RANDOM_WALK),
    "DPBarker": ClassConfig(
        ("tempering",),
        refusal=(
            "{name} clips each record's ratio at sqrt(b)/n, far below the ratio of any move "
            "of posterior scale (it would need b = d n): it samples a tempered posterior "
            "(thesis Theorem 8), whose temperature must be chosen by hand. Use step=None "
            "(the automatic mode) or step=pymc_dp.DPPenaltyMetropolis (configured "
            "privately), or give {keys} in step_kwargs"
        ),
    ),
    "DPExpFamilyPenalty": ClassConfig(
        ("data_bounds", "stat_clip_bound", "centre"),
        refusal=(
            "{name} configures itself privately only when asked: its statistics centred at a "
            "private centre and clipped at DP quantiles of their deviations "
            "(step_kwargs={{'centre': 'private'}}, docs/steps/expfam.md), with correlated "
            "releases, were measured within 1 NUTS sd and R-hat <= 1.1 from n = 100 000 at "
            "epsilon 10 (a linear regression with unknown sigma: R-hat 1.02; 1.107 at "
            "n = 20 000, 1.105 at epsilon 3, 1.64 at both). "
            "Use step=None (the automatic mode) or step=pymc_dp.DPPenaltyMetropolis "
            "(configured privately), or give {keys} in step_kwargs"
        ),
        alternatives=True,
    ),
}


#: Arguments of a step's constructor that `pymc_dp.sample` sets from its own.
_RUN_KEYS = ("epsilon", "delta", "draws", "tune", "chains", "model")


def _config_of(cls: type) -> ClassConfig | None:
    for c in cls.__mro__:
        if c.__name__ in STEP_CLASSES and c.__module__.startswith("pymc_dp."):
            return STEP_CLASSES[c.__name__]
    return None


def wants_configuration(cls: type, step_kwargs: Mapping[str, Any] | None) -> bool:
    """Whether `pymc_dp.sample` configures ``cls`` privately: a required hyperparameter of
    the class (`ClassConfig.required`) is missing from ``step_kwargs``. For
    DPExpFamilyPenalty (no required one) all of ``data_bounds``, ``stat_clip_bound`` and
    ``centre`` missing."""
    cfg = _config_of(cls)
    if cfg is None:
        return False
    given = set(step_kwargs or {})
    if cfg.alternatives:
        return not (given & set(cfg.required))
    return not set(cfg.required) <= given


def check_configurable(
    cls: type,
    step_kwargs: Mapping[str, Any] | None,
    sample_kwargs: Mapping[str, Any],
    *,
    model=None,
    epsilon: float | None = None,
    delta: float | None = None,
    chains: int = 4,
    draws: int | None = None,
    tune: int | None = None,
    records=None,
) -> ClassConfig:
    """Refuse, before any data is read, a class that cannot be configured privately (the
    message names the step that suits), a run its public prediction says cannot converge
    (`ClassConfig.precheck`, with ``model`` and the target), or arguments the
    configuration sets itself."""
    cfg = _config_of(cls)
    if cfg is None or cfg.configure is None:
        sep = " or " if cfg is not None and cfg.alternatives else " and "
        keys = sep.join(repr(k) for k in (cfg.required if cfg else ()))
        text = (cfg.refusal if cfg else "{name} has no private configuration").format(
            name=cls.__name__, keys=keys or "its hyperparameters"
        )
        raise ValueError(f"pymc_dp.sample(step={cls.__name__}) without {keys}: " + text)
    params = accepted_keywords(cls)
    unknown = sorted(k for k in (step_kwargs or {}) if k not in params)
    if unknown:
        raise TypeError(
            f"step_kwargs {unknown}: {cls.__name__} takes no such argument (checked before "
            "the private configuration reads any data)"
        )
    run = [k for k in _RUN_KEYS if k in (step_kwargs or {})]
    if run:
        raise ValueError(
            f"step_kwargs {run}: the budget and the run length are pymc_dp.sample's own "
            "arguments (epsilon=, delta=, draws=, tune=, chains=); give them there"
        )
    clash = [k for k in cfg.reserved if k in (step_kwargs or {})]
    if clash:
        raise ValueError(
            f"step_kwargs {clash}: {cls.__name__} is configured privately here (its "
            f"{' and '.join(cfg.required)} are not given), and its noise is fitted to the "
            "budget the private configuration leaves; leave them out, or give every one of "
            f"{list(cfg.required)} to configure the step by hand"
        )
    if cfg.precheck is not None and model is not None and epsilon is not None:
        n = None if records is None else int(records.n_records)
        cfg.precheck(cls, model, epsilon, delta, chains, draws, tune, dict(step_kwargs or {}), n)
    if "initvals" in sample_kwargs:
        raise ValueError(
            f"initvals: {cls.__name__} is configured privately here and its chains start at "
            "draws from the private warm start; leave initvals out, or configure the step by "
            f"hand (give {list(cfg.required)} in step_kwargs)"
        )
    return cfg


def configure_step_class(
    cls: type,
    model,
    *,
    epsilon: float,
    delta: float,
    draws: int | None,
    tune: int | None,
    chains: int,
    step_kwargs: Mapping[str, Any] | None,
    rng: np.random.Generator,
    spend: PresampleSpend,
    records=None,
) -> ConfiguredStep:
    """Run the private phases ``cls`` needs and return its configuration.

    The returned ``kwargs`` (explicit ``step_kwargs`` already merged over them, so they
    win) are given to the constructor with ``draws``, ``tune`` and ``chains``; ``plan``
    (its phases, the step's sampling phase included) goes to the report
    (``presample=``). ``spend`` is filled in as the releases are made.
    """
    cfg = check_configurable(cls, step_kwargs, {})
    ctx = {
        "epsilon": epsilon,
        "delta": delta,
        "draws": draws,
        "tune": tune,
        "chains": chains,
        "rng": rng,
        "spend": spend,
        "records": records,
        "step_kwargs": dict(step_kwargs or {}),
        "cls": cls,
    }
    out = cfg.configure(model, ctx)
    out.plan.method = f"{cls.__name__} configured privately (pymc_dp.auto.steps)"
    out.kwargs = {**out.kwargs, **(step_kwargs or {})}
    return out
