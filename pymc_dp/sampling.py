"""``pymc_dp.sample``: a private posterior in one call.

Target (epsilon, delta) -> noise calibrated for the whole run (all chains, warmup included)
-> ``pm.sample`` -> privacy report attached -> raw-data groups removed. Before anything is
sampled, the run is refused if it would publish data outside the privacy mechanism.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import pymc as pm
import scipy.stats

from pymc_dp.accounting import GaussianEvent, compose_epsilon
from pymc_dp.auto.oneshot import (
    CLIP_BIAS_WARN,
    CURVATURE_WIDENING_WARN,
    TRUST_PRIOR_SDS,
    zeroed_in_doubt,
)
from pymc_dp.callscope import call_scope
from pymc_dp.diagnostics import (
    PRIOR_CLOSE,
    ConvergenceWarning,
    PriorDominatedWarning,
    check_convergence,
    close_to_prior,
)
from pymc_dp.records import (
    ModelNotSupportedError,
    check_model_supported,
    deterministics_reading_data,
)
from pymc_dp.report import RAW_DATA_GROUPS, privacy_report
from pymc_dp.step_methods.base import DPStep, _check_records, check_positive, check_target
from pymc_dp.step_methods.laplace import DPLaplaceDraws, DPPosteriorDraws
from pymc_dp.step_methods.parts import accepted_keywords, to_keywords
from pymc_dp.step_methods.penalty import DPPenaltyMetropolis

__all__ = ["NoiseDominatedWarning", "OneShotWarning", "sample", "check_run_is_private"]


class OneShotWarning(ConvergenceWarning):
    """The one-shot strategy's result is in doubt (its warm start had not converged)."""


class NoiseDominatedWarning(UserWarning):
    """The privacy noise dominates a noise-aware result: its intervals are wide (they
    include the noise), not off."""


def _flatten_steps(step) -> list:
    if isinstance(step, pm.step_methods.CompoundStep):
        return [s for m in step.methods for s in _flatten_steps(m)]
    if isinstance(step, list | tuple):
        return [s for m in step for s in _flatten_steps(m)]
    return [step]


def _check_outputs_are_private(
    model: pm.Model, var_names: Sequence[str] | None, idata_kwargs: dict | None
) -> None:
    """The data-free part of `check_run_is_private`: what ``pm.sample`` would store."""
    if idata_kwargs and idata_kwargs.get("log_likelihood"):
        raise ModelNotSupportedError(
            "idata_kwargs={'log_likelihood': True} stores per-record log-likelihoods computed "
            "from the data without noise; remove it"
        )
    for det in deterministics_reading_data(model):
        if var_names is None or det.name in var_names:
            raise ModelNotSupportedError(
                f"Deterministic {det.name!r} depends on the data and would be stored at every "
                "draw without noise; exclude it with var_names=[...] (list the variables to "
                "keep) or remove it from the model" + _made_by_pymc(model, det.name)
            )


def _made_by_pymc(model: pm.Model, name: str) -> str:
    """Where PyMC itself added the Deterministic ``name`` (data-free): how not to add it.

    ``pm.OrderedLogistic`` and ``pm.OrderedProbit`` store their category probabilities as
    ``"<name>_probs"`` unless given ``compute_p=False``; a user who never wrote that
    Deterministic cannot find it in the model's code (found on a real-data sweep: an ordinal
    regression of happiness on 17 137 records, refused with no hint of where it came from).
    """
    base = name.removesuffix("_probs")
    rv = model.named_vars.get(base) if base != name else None
    if rv is None or rv not in model.observed_RVs:
        return ""
    return (
        f"; PyMC added it for the ordinal likelihood {base!r} (pm.OrderedLogistic or "
        f"pm.OrderedProbit store their category probabilities unless given compute_p=False): "
        f"pass compute_p=False to {base!r}"
    )


def check_run_is_private(
    model: pm.Model,
    steps: Sequence,
    *,
    var_names: Sequence[str] | None = None,
    idata_kwargs: dict | None = None,
) -> None:
    """Refuse a run that would publish data outside the privacy mechanism.

    Raises
    ------
    ModelNotSupportedError
        A step that is not a pymc_dp step; free variables no DP step covers (PyMC would give
        them a non-private sampler); a stored Deterministic that depends on the data;
        ``idata_kwargs={"log_likelihood": True}``; observed data with missing values.
    """
    steps = _flatten_steps(steps)
    for s in steps:
        if not isinstance(s, DPStep):
            raise ModelNotSupportedError(
                f"step {type(s).__name__} is not a pymc_dp step: it would read the data "
                "without a privacy mechanism. Use only pymc_dp step methods"
            )
    covered = {v.name for s in steps for v in s.vars}
    missing = [v.name for v in model.value_vars if v.name not in covered]
    if missing:
        raise ModelNotSupportedError(
            f"free variables {missing} are not sampled by any pymc_dp step; PyMC would assign "
            "them a non-private sampler. Pass vars=... so the DP steps cover every free variable"
        )
    # Potentials were checked by each step that declared them data-free (a step that did not
    # would have refused the model); the rest of the model check needs no declaration.
    declared = bool(steps) and all(getattr(s, "data_free_potentials", False) for s in steps)
    check_model_supported(model, [], data_free_potentials=declared)
    _check_outputs_are_private(model, var_names, idata_kwargs)


def sample(
    draws: int | None = None,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    step=None,
    tune: int | None = None,
    chains: int = 4,
    data_bounds: dict | None = None,
    random_seed=None,
    step_kwargs: dict[str, Any] | None = None,
    auto_kwargs: dict[str, Any] | None = None,
    keep_data: bool = False,
    model: pm.Model | None = None,
    var_names: Sequence[str] | None = None,
    idata_kwargs: dict | None = None,
    records=None,
    **sample_kwargs: Any,
):
    """Sample a differentially private posterior and attach its privacy report.

    Parameters
    ----------
    draws : int, optional
        Draws per chain the result holds, as in `pymc.sample` (default 1000 with a step;
        chosen by the predicted effective sample size in automatic mode and, for a step
        class configured privately, by its configuration: see ``step``). In automatic mode,
        a number of draws predicted unusable (each penalty test's noise too large for any
        proposal to be accepted, or too few iterations for an effective sample size of 100)
        is warned about (`pymc_dp.auto.configure.RunLengthWarning`, with the predicted
        acceptance and ESS and the planner's own length) before the chains run.
    epsilon : float
        Target epsilon of the whole run (required unless ``step`` is an instance).
    delta : float
        Target delta of the whole run (required unless ``step`` is an instance).
    step : pymc_dp step class, step instance, list of step instances, or None
        ``None`` (default): automatic mode (`pymc_dp.auto`): a private Laplace
        approximation (private Fisher scoring), DP clip selection and a
        DPPenaltyMetropolis with an independence proposal and a first-order control
        variate, every phase inside the budget and in the report. A class (e.g.
        ``pymc_dp.DPHMC``) with its required hyperparameters in ``step_kwargs`` (its clip
        bounds, ...) is constructed with ``epsilon``, ``delta``, ``draws``, ``tune``,
        ``chains`` and ``step_kwargs``: its noise is calibrated so that the whole run meets
        the target. A class *without* them is configured privately
        (`pymc_dp.auto.steps`): the automatic mode's private Laplace approximation and a DP
        clip selection give the clip bounds, the step size or mass matrix and the chains'
        starts, those phases are charged in the report, and the step gets the budget they
        leave (the composition of every phase and every chain meets the target); values
        given in ``step_kwargs`` win. Configured this way: ``DPPenaltyMetropolis`` (the
        automatic mode's penalty chain), ``DPHMC`` (clip bounds from a DP quantile of the
        per-record gradient norms, mass matrix from the private covariance, run length from
        the test's noise unless ``draws`` is given; refused, before any data is read, where
        its public prediction says the chains cannot converge), ``DPSGLD`` and ``DPSGNHT``
        (biased by design). ``DPFastMH``, ``DPSubsampledPenalty``, ``DPBarker`` and
        ``DPExpFamilyPenalty`` without their hyperparameters are refused before any data is
        read, with a message naming the step that suits. An instance is used as it is (its
        own calibration).
    tune : int, optional
        Warmup iterations per chain, as in `pymc.sample` (default 1000 with a step; 0 for a
        step class configured privately, whose chains start at draws from the private
        warm start with its step size and mass matrix).
        Warmup iterations are charged. In automatic mode the independence proposal is a
        calibrated private approximation with nothing to adapt: no warmup is run whatever
        ``tune`` is, its budget goes to the draws, and the result's attributes
        ``dp_draws_requested``, ``dp_tune_requested`` (-1: not given), ``dp_draws_run``,
        ``dp_tune_run`` and ``dp_auto_run_length`` say what was asked and done (with
        ``auto_kwargs={"allow_random_walk": True}`` a chosen random walk adapts its scale
        over ``tune`` iterations).
    chains : int
        Number of chains, as in `pymc.sample`; the budget covers all of them.
    data_bounds : dict, optional
        Public bounds ``{name: (low, high)}`` of observed variables and ``pm.Data``
        containers, declared from domain knowledge (never from the data). Checked against
        the model's names (and, in automatic mode, its graph) before any data is read; see
        `pymc_dp.auto.check_data_bounds`. Given to a step class that takes them itself
        (DPExpFamilyPenalty) unless ``step_kwargs`` has its own. With
        ``auto_kwargs={"derive_clips": True}`` the
        automatic mode derives its gradient clip bounds from them instead of spending budget
        on DP histograms (`pymc_dp.auto.bounds.clip_plan`; off by default, see
        docs/auto.md for the measurement). In automatic mode, bounds on the response and on
        every covariate of a linear regression choose the sufficient-statistics strategy
        (``dp_method`` ``"stats"``, `pymc_dp.auto.suffstats`); a bound on the response of a
        normal model of group means (``y ~ Normal(m[g], sigma)``, e.g. a normal hierarchy)
        chooses the per-group statistics (``"groupstats"``, `pymc_dp.auto.groupstats`).
    random_seed : int, optional
        Seed of the whole run (the automatic phases and `pymc.sample`).
    step_kwargs : dict, optional
        Further arguments of the step class (e.g. ``clip_bound`` of DPPenaltyMetropolis,
        ``llr_clip_bound`` and ``grad_clip_bound`` of DPHMC).
    auto_kwargs : dict, optional
        Options of `pymc_dp.auto.auto_configure` (``split``, ``clip_quantile``, ...);
        ``{"method": "stats" | "groupstats" | "laplace" | "chain"}`` forces a strategy
        (docs/auto.md).
    keep_data : bool
        Keep the raw-data groups (``observed_data``, ``constant_data``) in the result. They
        are NOT private; off by default.
    model : pm.Model, optional
    var_names : sequence of str, optional
        Passed to `pymc.sample`.
    idata_kwargs : dict, optional
        Passed to `pymc.sample`.
    records : pymc_dp.distributed.DaskRecords, optional
        The records on a Dask cluster, used in place of the model's data (which may be a small
        stand-in of the same dtype); given to the step class, or (``step=None``) used by every
        phase of the automatic mode (without data owners). The chains then run one after
        the other in this process (``cores=1``), the cluster does the parallel work. If a
        partition is lost and cannot be recomputed, the run stops with
        `pymc_dp.distributed.RecordsLostError`.
    **sample_kwargs
        Passed to `pymc.sample` (``cores``, ``progressbar``, ...).

    Returns
    -------
    arviz.InferenceData (PyMC 5.x) or xarray.DataTree (PyMC 6.x)
        With ``dp_*`` attributes; read them with `pymc_dp.privacy_report`. They include the
        convergence diagnostics of the DP draws (`pymc_dp.diagnostics`): ``dp_max_rhat``,
        ``dp_min_ess_bulk``, ``dp_acceptance`` (per chain), ``dp_converged`` (1 or 0) and
        ``dp_convergence`` (one line); when the chains did not converge (R-hat > 1.1, bulk
        ESS < 100 or a chain accepting under 1 % of proposals) a
        `pymc_dp.ConvergenceWarning` says so with the numbers and what would help, and the
        report's first line repeats it.

    Raises
    ------
    Exception
        An error that stops the run after a release (records lost, the budget exceeded, an
        exception in a worker, in a callback or in `pymc.sample`), whatever its type,
        carries the spend so far: its ``releases``, ``epsilon`` and ``delta`` attributes
        (and a note) account for every release made, the automatic mode's pre-sampling
        phases included. Chains run in worker processes (``cores > 1``) are not counted
        from the driver: ``epsilon`` is then the run's target, an upper bound
        (``epsilon_is_bound``).
    """
    model = pm.modelcontext(model)
    # the model's initial point and the model guard once for the whole call, whatever the
    # step (each `model.initial_point()` compiles a function; the guard walks the graph):
    # a step class's run checked the model in `_check_class_run`, again in the step's
    # constructor and again before `pm.sample` (`check_run_is_private`). The body stays in
    # this function: the warnings' ``stacklevel`` counts the frames to the user's call
    with call_scope(model):
        if step is None and (inspect.isclass(draws) or isinstance(draws, DPStep | list | tuple)):
            raise TypeError(
                "pymc_dp.sample's first parameter is draws, as in pm.sample; pass the step method "
                "as a keyword: pymc_dp.sample(draws, step=..., epsilon=..., delta=...)"
            )
        _check_sample_kwargs(sample_kwargs)
        if draws is not None:
            draws = check_positive("draws", draws, integer=True)
        if tune is not None:
            tune = check_positive("tune", tune, integer=True, allow_zero=True)
        chains = check_positive("chains", chains, integer=True)
        if data_bounds is not None:
            from pymc_dp.auto import check_data_bounds

            data_bounds = check_data_bounds(model, data_bounds)
        if records is not None:
            _check_cores(sample_kwargs)
        run = _Request(
            model=model,
            draws=draws,
            tune=tune,
            chains=chains,
            epsilon=epsilon,
            delta=delta,
            random_seed=random_seed,
            step_kwargs=step_kwargs,
            keep_data=keep_data,
            var_names=var_names,
            idata_kwargs=idata_kwargs,
            sample_kwargs=sample_kwargs,
            records=records,
        )
        if step is None:
            if records is not None:
                _check_records(DPPenaltyMetropolis, records, False)
                if getattr(records, "owners", None) is not None:
                    raise ValueError(
                        "the automatic mode (step=None) does not implement the data-sharing scheme "
                        "(its warm start and clip selection use the central scheme); give "
                        "DaskRecords without owners=, or step=pymc_dp.DPPenaltyMetropolis"
                    )
            return _sample_auto(run, {**(auto_kwargs or {}), "data_bounds": data_bounds})
        if auto_kwargs:
            raise ValueError("auto_kwargs configure the automatic mode (step=None) only")
        if inspect.isclass(step) and issubclass(step, DPStep) and step_kwargs:
            # the settings objects spelled as the keywords the class checks are made with
            run.step_kwargs = to_keywords(step, step_kwargs)
        if (
            inspect.isclass(step)
            and data_bounds is not None
            and "data_bounds" in accepted_keywords(step)
            and "data_bounds" not in (run.step_kwargs or {})
        ):
            # a class that takes the public bounds itself (DPExpFamilyPenalty) gets them
            run.step_kwargs = {**(run.step_kwargs or {}), "data_bounds": data_bounds}
        if inspect.isclass(step) and issubclass(step, DPStep):
            from pymc_dp.auto.steps import check_configurable, wants_configuration

            if wants_configuration(step, run.step_kwargs):
                # refused here, before anything is read, when the class cannot be configured
                run.epsilon, run.delta = _require_target(epsilon, delta, step.__name__)
                check_configurable(
                    step,
                    run.step_kwargs,
                    sample_kwargs,
                    model=model,
                    epsilon=run.epsilon,
                    delta=run.delta,
                    chains=chains,
                    draws=draws,
                    tune=tune,
                    records=records,
                )
                return _sample_configured(run, step)
        run.draws = 1000 if draws is None else draws
        run.tune = 1000 if tune is None else tune
        if inspect.isclass(step):
            if not issubclass(step, DPStep):
                raise ModelNotSupportedError(f"{step.__name__} is not a pymc_dp step class")
            run.epsilon, run.delta = _require_target(epsilon, delta, step.__name__)
            # Everything that needs no data is checked before the step compiles: the model, and
            # what pm.sample would store.
            _check_class_run(run, step)
            kwargs = dict(run.step_kwargs or {})
            if records is not None:
                kwargs["records"] = records
            with warnings.catch_warnings():
                # checked just above (refused, or excluded by var_names): do not warn again
                warnings.filterwarnings("ignore", message="Deterministics .* depend on the data")
                step = step(
                    model=model,
                    epsilon=run.epsilon,
                    delta=run.delta,
                    draws=run.draws,
                    tune=run.tune,
                    chains=chains,
                    **kwargs,
                )
        elif records is not None:
            raise ValueError(
                "records= is given to the step class (pymc_dp.sample(step=pymc_dp.DPHMC, "
                "records=...)); a step instance carries its own records (give them to its "
                "constructor)"
            )
        elif epsilon is not None or step_kwargs:
            raise ValueError(
                "epsilon/delta/step_kwargs calibrate a step class; a step instance carries its own "
                "calibration: pass the class (e.g. step=pymc_dp.DPHMC) to calibrate here"
            )
        return _run(run, step)


@dataclasses.dataclass
class _Request:
    """The run `sample` was asked for, its arguments checked: handed whole to the path that
    makes it (the automatic mode, a step class configured privately, a calibrated step) and
    to `_run`, with the plan's ``draws``, ``tune`` and seed where the pre-sampling phases
    chose them."""

    model: pm.Model
    draws: int | None
    tune: int | None
    chains: int
    epsilon: float | None
    delta: float | None
    random_seed: Any
    step_kwargs: dict[str, Any] | None
    keep_data: bool
    var_names: Sequence[str] | None
    idata_kwargs: dict | None
    sample_kwargs: dict[str, Any]
    records: Any = None


def _check_class_run(run: _Request, cls: type) -> None:
    """What a step class's run is checked for before any data is read: the model (with the
    potentials the step kwargs declare data-free), what pm.sample would store, the records."""
    kwargs = run.step_kwargs or {}
    data_free_potentials = bool(kwargs.get("data_free_potentials", False))
    check_model_supported(run.model, [], data_free_potentials=data_free_potentials)
    _check_outputs_are_private(run.model, run.var_names, run.idata_kwargs)
    if run.records is not None:
        _check_records(cls, run.records, bool(kwargs.get("nonprivate_diagnostics")))


def _presample_seeds(random_seed) -> tuple[np.random.Generator, int | None]:
    """The pre-sampling mechanisms' generator and `pymc.sample`'s seed: two seeds spawned
    from ``random_seed`` (pm.sample's is None without one)."""
    seeds = np.random.SeedSequence(random_seed).spawn(2)
    seed = int(seeds[1].generate_state(1)[0]) if random_seed is not None else None
    return np.random.default_rng(seeds[0]), seed


@contextlib.contextmanager
def _charged(delta, presample):
    """An error in the block carries the spend of the pre-sampling releases made so far
    (``presample``, read when the error is raised), `_account_partial_run`."""
    try:
        yield
    except BaseException as err:
        _account_partial_run(err, [], delta, presample=presample)
        raise


def _require_target(epsilon, delta, what: str) -> tuple[float, float]:
    """The run's (epsilon, delta), validated; both are required to calibrate ``what``."""
    if epsilon is None or delta is None:
        missing = [k for k, v in (("epsilon", epsilon), ("delta", delta)) if v is None]
        raise ValueError(
            f"pymc_dp.sample needs epsilon= and delta= (the privacy budget of the whole "
            f"run) to calibrate {what}; missing: {', '.join(missing)}. For "
            "example epsilon=1.0, delta=0.1 / n"
        )
    return check_target(epsilon, delta)


def _run(run: _Request, step, presample=None):
    """Check the run, ``pm.sample`` it, attach the report (with the pre-sampling phases)."""
    model, draws, tune, chains, delta = run.model, run.draws, run.tune, run.chains, run.delta
    var_names, idata_kwargs, sample_kwargs = run.var_names, run.idata_kwargs, run.sample_kwargs
    steps = _flatten_steps(step)
    check_run_is_private(model, steps, var_names=var_names, idata_kwargs=idata_kwargs)
    for s in steps:
        if s.plan is not None and (
            s.plan.chains < chains or s.plan.iterations_per_chain < draws + tune
        ):
            raise ValueError(
                f"{type(s).__name__} was calibrated for {s.plan}, smaller than this run "
                f"(draws={draws}, tune={tune}, chains={chains}); calibrate for the run you make"
            )
    if any(not s._fns.records.local for s in steps):
        _check_cores(sample_kwargs)
        sample_kwargs["cores"] = 1
    step_arg = step if not isinstance(step, list | tuple) else list(step)
    try:
        idata = pm.sample(
            draws=draws,
            tune=tune,
            chains=chains,
            step=step_arg,
            model=model,
            var_names=var_names,
            idata_kwargs=idata_kwargs,
            random_seed=run.random_seed,
            **sample_kwargs,
        )
    except BaseException as err:  # every error after a release carries the spend so far
        spent = None if presample is None else presample.spent_before_sampling()
        target = presample.epsilon if presample is not None else None
        if target is None and len(steps) == 1:
            target = getattr(steps[0], "epsilon", None)
        _account_partial_run(
            err,
            steps,
            delta,
            presample=spent,
            parallel=_parallel(sample_kwargs, chains),
            target=target,
        )
        raise
    if not run.keep_data:
        _drop_groups(idata, RAW_DATA_GROUPS)
    attrs = {} if presample is None else presample.to_attrs()
    # loud when the chains did not converge (post-processing of the DP draws); the report's
    # first line repeats it
    attrs.update(_convergence_attrs(idata, auto=presample is not None))
    if attrs.get("dp_oneshot_converged") == 0:
        # independent draws always mix; the one-shot strategy's own check failed
        attrs["dp_converged"] = 0
        attrs["dp_convergence"] = (
            "NOT CONVERGED (the one-shot approximation's Newton steps were cut by their "
            "trust region, a few prior sds; its intervals were widened)"
            if attrs.get("dp_oneshot_trust_cut")
            else "NOT CONVERGED (the one-shot approximation's first Newton step went on the "
            "way the warm start was going, beyond its noise: "
            f"{attrs['dp_oneshot_drift_z']:.3g} sds; the warm start was still crawling "
            "towards the mode; its intervals were widened by the warm start's whole path)"
            if attrs.get("dp_oneshot_crawling")
            else "NOT CONVERGED (the one-shot approximation's last two Newton steps disagree "
            f"beyond their noise: chi-square {attrs['dp_oneshot_step_chi2']:.4g}; its "
            "intervals were widened)"
        )
    if attrs.get("dp_converged") != 0 and zeroed_in_doubt(
        attrs.get("dp_oneshot_zeroed_widening", 0.0),
        attrs.get("dp_oneshot_zeroed_step_widening", 0.0),
    ):
        # the released curvature's zeroed entries could hide a shortfall of its Newton
        # steps that its intervals do not cover (`pymc_dp.auto.oneshot.zeroed_damping`,
        # `pymc_dp.auto.oneshot.zeroed_step_widening`)
        attrs["dp_converged"] = 0
        attrs["dp_convergence"] = (
            "IN DOUBT (the one-shot approximation's released curvature had off-diagonal "
            "entries below their noise threshold set to 0; their possible values would make "
            f"its intervals up to {attrs['dp_oneshot_zeroed_widening']:.3g} times as wide, "
            "and their error over its Newton steps, which still moved far, widens them "
            f"{attrs['dp_oneshot_zeroed_step_widening']:.3g} times: they may be too narrow "
            "or off)"
        )
    if attrs.get("dp_groupstats_converged") == 0:
        # the resampled draws always mix; the noise-aware posterior's own NUTS run did not
        attrs["dp_converged"] = 0
        attrs["dp_convergence"] = (
            "NOT CONVERGED (the noise-aware posterior's NUTS run: R-hat "
            f"{attrs['dp_groupstats_rhat']:.4g}, {attrs['dp_groupstats_divergences']} "
            "divergences)"
        )
    if attrs.get("dp_oneshot_fallback"):
        attrs["dp_converged"] = 0
        attrs["dp_convergence"] = f"NOT USABLE ({attrs['dp_oneshot_fallback']})"
    attrs["dp_prior_close"] = _prior_close(idata, model, stacklevel=4 if presample else 3)
    idata.attrs.update(attrs)
    idata["posterior"].attrs.update(attrs)
    privacy_report(idata, delta, model=model)
    return idata


def _prior_close(idata, model, *, stacklevel: int) -> str:
    """The parameters whose result is about as spread as their prior, in words (the
    ``dp_prior_close`` attribute; post-processing of the DP draws and of data-free prior
    draws, `pymc_dp.diagnostics.close_to_prior`), with a `PriorDominatedWarning` when any."""
    close = close_to_prior(idata, model)
    if not close:
        return ""
    counts: dict[str, int] = {}
    for name in close:
        counts[name.split("[")[0]] = counts.get(name.split("[")[0], 0) + 1
    posterior = idata["posterior"]
    named = ", ".join(
        base
        if posterior[base].ndim == 2
        else f"{base} ({k} of its {int(np.prod(posterior[base].shape[2:]))} entries)"
        for base, k in counts.items()
    )
    warnings.warn(
        f"the result is about as spread as the prior for {named} (at least {PRIOR_CLOSE:g} of "
        "the prior's 16-84 % range): the data, seen through the privacy noise, told little "
        "about them, and their draws are mostly the prior (attribute dp_prior_close). A larger "
        "epsilon or more records would help; where the prior alone should decide them, this "
        "is expected",
        PriorDominatedWarning,
        stacklevel=stacklevel + 1,
    )
    return named


def _convergence_attrs(idata, *, auto: bool) -> dict:
    """R-hat, bulk ESS and acceptance of the run as attributes; a warning when unconverged."""
    hint = (
        "a larger epsilon or more records; with draws given, draws=None lets the planner "
        "choose the run length"
        if auto
        else "more draws, a larger epsilon, or the automatic mode (pymc_dp.sample with "
        "step=None), which configures its step privately"
    )
    # the warning points at the caller of pymc_dp.sample
    return check_convergence(idata, hint=hint, stacklevel=6 if auto else 5).to_attrs()


def _sample_auto(run: _Request, auto_kwargs: dict[str, Any]):
    """``step=None``: the private auto-configuration, then the configured penalty run."""
    from pymc_dp.auto import auto_configure
    from pymc_dp.auto.configure import PresampleSpend

    model, draws, tune, chains, records = run.model, run.draws, run.tune, run.chains, run.records
    sample_kwargs = run.sample_kwargs
    epsilon, delta = _require_target(run.epsilon, run.delta, "the automatic configuration")
    if run.step_kwargs:
        raise ValueError("step_kwargs go with a step class; use auto_kwargs with step=None")
    if "initvals" in sample_kwargs:
        raise ValueError("the automatic mode chooses initvals (from its private warm start)")
    _refuse_potentials(model, "the automatic mode (step=None)")
    check_model_supported(model, [], data_free_potentials=False)
    _check_outputs_are_private(model, run.var_names, run.idata_kwargs)
    rng, seed = _presample_seeds(run.random_seed)
    spend = PresampleSpend()
    with _charged(delta, spend):  # stopped part-way: charged for the releases made
        plan = auto_configure(
            model,
            epsilon=epsilon,
            delta=delta,
            chains=chains,
            draws=draws,
            tune=tune,
            rng=rng,
            records=records,
            spend=spend,
            **auto_kwargs,
        )
    if plan.method == "groupstats":
        # every release was made before sampling: the chains resample the noise-aware
        # posterior's NUTS draws and read no data (one process is enough)
        step = DPPosteriorDraws(
            plan.posterior_draws,
            model=model,
            draws=plan.draws,
            tune=plan.tune,
            chains=chains,
            delta=delta,
        )
        sample_kwargs = {"cores": 1, **sample_kwargs}
        if plan.predicted_error > 1.0:
            warnings.warn(
                f"the release noise may dominate this posterior: the plan expects the "
                f"posterior means about {plan.predicted_error:.2g} posterior sds off (the "
                "intervals include the noise: wide, not off); a larger epsilon or more "
                "records would help",
                NoiseDominatedWarning,
                stacklevel=3,
            )
        if not plan.to_attrs()["dp_groupstats_converged"]:
            warnings.warn(
                "the NUTS run of the noise-aware posterior of the released per-group "
                f"statistics has not converged (R-hat {plan.posterior_rhat:.3g}, "
                f"{plan.posterior_divergences} divergences): the resampled draws mix by "
                "construction but may not represent it",
                ConvergenceWarning,
                stacklevel=3,
            )
    elif plan.method in ("laplace", "stats"):
        # the one-shot strategy released everything before sampling: independent draws from
        # its noise-aware Gaussian read no data (one process is enough)
        step = DPLaplaceDraws(
            plan.draws_mean,
            plan.draws_cov,
            to_q=plan.to_q,
            model=model,
            draws=plan.draws,
            tune=plan.tune,
            chains=chains,
            delta=delta,
            # the prior-wide coordinates drawn from the prior, or the free block from its
            # conditional prior (never both: `pymc_dp.auto.configure._one_shot`)
            free_block=plan.prior_block if plan.prior_block is not None else plan.free_block,
        )
        sample_kwargs = {"cores": 1, **sample_kwargs}
        check = plan.oneshot
        if plan.method == "stats" and plan.predicted_error > 1.0:
            widening = (
                f"its sds are up to {np.sqrt(1.0 + plan.predicted_error**2):.3g} times those "
                "the released statistics would give without noise"
                if np.isfinite(plan.predicted_error)
                else "the released statistics alone do not determine it (close to the prior)"
            )
            warnings.warn(
                f"the release noise dominates this posterior: {widening} (the intervals "
                "include the noise: wide, not off); a larger epsilon or more records would help",
                NoiseDominatedWarning,
                stacklevel=3,
            )
        in_doubt = check is not None and zeroed_in_doubt(
            check.zeroed_widening, check.zeroed_step_widening
        )
        if check is not None and check.curvature_widening > CURVATURE_WIDENING_WARN:
            warnings.warn(
                "the release noise dominates this result's curvature: its intervals are up to "
                f"{check.curvature_widening:.3g} times as wide as the released curvature alone "
                + (
                    "gives (they include its noise; but see the OneShotWarning: they may "
                    "still be off)"
                    if in_doubt
                    else "gives (they include its noise: wide, not off)"
                )
                + "; a larger epsilon or more records would help",
                NoiseDominatedWarning,
                stacklevel=3,
            )
        if in_doubt:
            # DP outputs (`pymc_dp.auto.oneshot.zeroed_damping`, `.zeroed_step_widening`)
            warnings.warn(
                "the released curvature's off-diagonal entries below their noise threshold "
                "were set to 0; their possible true values would make its intervals up to "
                f"{check.zeroed_widening:.3g} times as wide (attribute "
                "dp_oneshot_zeroed_widening), and their error over the Newton steps, which "
                f"still moved far, widens them {check.zeroed_step_widening:.3g} times "
                "(attribute dp_oneshot_zeroed_step_widening): the curvature may overstate the "
                "posterior's along a direction the Newton steps then fall short in, by more "
                "than the intervals say (they may be too narrow or off); a larger epsilon or "
                "more records would help",
                OneShotWarning,
                stacklevel=3,
            )
        if check is not None and check.clip_bias > CLIP_BIAS_WARN:
            # DP outputs (`pymc_dp.auto.oneshot.clip_tail`)
            declared = plan.clip_sources.get("warm-start gradient clip") == "data_bounds"
            warnings.warn(
                "the per-record gradients have a tail beyond the clip bound of the last "
                "releases (their released excess beyond it"
                + (
                    ", the bound the declared data_bounds give: some records lie outside "
                    "data_bounds"
                    if declared
                    else ""
                )
                + (
                    "): the bound was moved to "
                    f"{check.clip_scale:g} times the "
                    + ("declared bounds'" if declared else "histogram's")
                    if check.clip_scale != 1.0
                    # where the least variance is at the bound, and the chain's one-shot
                    # fallback, whose first end (the control variate's release) was clipped
                    # there already (`configure._one_shot`)
                    else "): the bound was kept"
                )
                + " and the intervals include the "
                "possible bias of the gradients still clipped, up to "
                f"{check.clip_bias:.3g} posterior sds (wide, not off; attributes "
                "dp_oneshot_clip_scale, dp_oneshot_clip_bias); a larger epsilon or more "
                "records would help",
                NoiseDominatedWarning,
                stacklevel=3,
            )
        if plan.oneshot_fallback:
            warnings.warn(
                f"NOT USABLE: {plan.oneshot_fallback}. A larger epsilon, more records, or "
                "auto_kwargs={'method': 'chain'} would help",
                OneShotWarning,
                stacklevel=3,
            )
        elif plan.prior_wide:
            warnings.warn(
                "the data could not be told from the noise for "
                f"{', '.join(plan.prior_wide)}: the one-shot result came out wider than "
                "the prior there (in expectation a posterior is no wider than its prior) or "
                "lost far out in it, so those parameters' draws are prior-wide: a log scale "
                "or other transformed parameter drawn from its prior (data-free draws, "
                "independent of the others), a parameter on its own scale from an interval "
                "holding the prior's mean +- 4 prior sds and the result's (attribute "
                "dp_oneshot_prior_wide); a larger epsilon or more records would help",
                NoiseDominatedWarning,
                stacklevel=3,
            )
        if check is not None and not check.converged:
            cut = (
                "a Newton step would have moved a parameter by more than "
                f"{TRUST_PRIOR_SDS:g} prior sds and was cut (the rest widens the intervals); "
                if check.cut
                else ""
            )
            if check.crawling:
                cut += (
                    "its first Newton step went on the way the warm start's last iterates "
                    f"went, {check.drift:.3g} noise sds beyond their noise (the warm start was "
                    "still crawling towards the mode, where the two steps cannot locate it; "
                    "the intervals were widened by the warm start's whole path); "
                )
            warnings.warn(
                "the one-shot private Laplace approximation had not converged: "
                f"{cut}its last two "
                f"Newton steps disagree by {check.step_chi2:.4g} on the chi-square scale of "
                "their release noise (at most "
                f"{scipy.stats.chi2.ppf(0.99, plan.d):.3g} where the warm start has "
                f"converged; the second step was {check.contraction:.2g} of the first). Its "
                "intervals were widened along the last step; a larger epsilon, more records, "
                "or auto_kwargs={'method': 'chain'} would help",
                OneShotWarning,
                stacklevel=3,
            )
    else:
        # the penalty run reads the records in the chunks of the configuration (the
        # partitions of records on a cluster)
        chunks = (
            {} if records is not None else {"chunk_size": (auto_kwargs or {}).get("chunk_size")}
        )
        step = DPPenaltyMetropolis(
            model=model,
            draws=plan.draws,
            tune=plan.tune,
            chains=chains,
            records=records,
            **chunks,
            **plan.step_kwargs,
        )
        sample_kwargs = {"initvals": plan.initvals, **sample_kwargs}
    planned = dataclasses.replace(
        run, draws=plan.draws, tune=plan.tune, delta=delta, random_seed=seed
    )
    planned.sample_kwargs = sample_kwargs
    return _run(planned, step, presample=plan)


def _sample_configured(run: _Request, cls: type):
    """A step class without its hyperparameters: configured by the automatic mode's private
    phases (`pymc_dp.auto.steps`), charged in the report, the step on the budget left."""
    from pymc_dp.auto.configure import PresampleSpend
    from pymc_dp.auto.steps import configure_step_class

    model, chains, records = run.model, run.chains, run.records
    epsilon, delta = _require_target(run.epsilon, run.delta, cls.__name__)
    _refuse_potentials(
        model, f"{cls.__name__} without its hyperparameters (configured by the automatic mode)"
    )
    _check_class_run(run, cls)
    if records is not None and getattr(records, "owners", None) is not None:
        raise ValueError(
            f"{cls.__name__} without its hyperparameters is configured by the automatic "
            "mode's private phases, which use the central scheme; give DaskRecords "
            "without owners=, or the step's hyperparameters in step_kwargs"
        )
    rng, seed = _presample_seeds(run.random_seed)
    spend = PresampleSpend()
    with _charged(delta, spend):  # stopped part-way: charged for the releases made
        config = configure_step_class(
            cls,
            model,
            epsilon=epsilon,
            delta=delta,
            draws=run.draws,
            tune=run.tune,
            chains=chains,
            step_kwargs=run.step_kwargs,
            rng=rng,
            spend=spend,
            records=records,
        )
    kwargs = dict(config.kwargs)
    if records is not None:
        kwargs["records"] = records
    # after the private phases: an error is charged for them
    with _charged(delta, config.plan.spent_before_sampling()), warnings.catch_warnings():
        # checked just above (refused, or excluded by var_names): do not warn again
        warnings.filterwarnings("ignore", message="Deterministics .* depend on the data")
        step = cls(model=model, draws=config.draws, tune=config.tune, chains=chains, **kwargs)
    # a step calibrated for a reduced target (another accountant than the phases': delta / 2,
    # `pymc_dp.auto.steps._reduced_target`) records the run's delta, at which the report
    # composes every phase with the chains
    step.target_delta = delta
    planned = dataclasses.replace(
        run, draws=config.draws, tune=config.tune, delta=delta, random_seed=seed
    )
    if config.initvals:
        planned.sample_kwargs = {"initvals": config.initvals, **run.sample_kwargs}
    return _run(planned, step, presample=config.plan)


def _refuse_potentials(model: pm.Model, what: str) -> None:
    """The automatic mode's private phases take no ``pm.Potential`` (declared data-free or
    not): say so before any data is read, with the runs that do take one.

    Found on the issue-26 sweep: a ridge Potential beside a logistic likelihood was refused
    in automatic mode with "pass data_free_potentials=True", which neither ``pymc_dp.sample``
    nor ``auto_kwargs`` accepts, and a step class configured privately refused it again
    with the declaration in ``step_kwargs``.
    """
    if not model.potentials:
        return
    names = ", ".join(repr(p.name) for p in model.potentials)
    raise ModelNotSupportedError(
        f"the model has pm.Potential terms ({names}); {what} does not take Potentials (its "
        "private phases cannot tell whether one reads the data). If every Potential is a "
        "function of the parameters only, write the term as a prior, or give a step class its "
        "hyperparameters and declare them: pymc_dp.sample(step=pymc_dp.DPHMC, step_kwargs="
        "{'data_free_potentials': True, 'grad_clip_bound': ..., 'llr_clip_bound': ...}, ...). "
        "If a Potential is a likelihood (it reads the data), write it as an observed variable "
        "instead (e.g. pm.Censored for censored data, pm.CustomDist with a logp)"
    )


def _check_sample_kwargs(sample_kwargs: dict) -> None:
    """Refuse, before any data is read, the ``pm.sample`` arguments a DP run cannot take.

    ``nuts_sampler`` other than ``"pymc"`` hands the model to an external NUTS; ``pm.sample``
    refuses it with any other step ("Model can not be sampled with NUTS alone"), but only
    after the automatic mode has spent the whole budget on its pre-sampling releases (found
    on the issue-26 sweep: 36 releases, epsilon 3 spent, then PyMC's error).
    ``return_inferencedata=False`` would return a MultiTrace, which has no place for the
    privacy report and keeps no record of the raw-data groups to remove.
    ``return_inferencedata=True``, a habit of PyMC users (``pm.sample``'s default, and what
    ``pymc_dp.sample`` returns anyway), is accepted and removed from ``sample_kwargs`` (in
    place): the fifth real-data sweep of issue 26 found it refused with the False case's
    TypeError.
    """
    if sample_kwargs.get("return_inferencedata") is True:
        del sample_kwargs["return_inferencedata"]
    if "return_inferencedata" in sample_kwargs:
        raise TypeError(
            "pymc_dp.sample always returns an InferenceData (PyMC 5.x) or DataTree (PyMC 6.x): "
            "its privacy report is written into the result's attributes; remove "
            "return_inferencedata"
        )
    if "discard_tuned_samples_private" in sample_kwargs:
        raise TypeError("pymc_dp.sample got an unexpected argument 'discard_tuned_samples_private'")
    sampler = sample_kwargs.get("nuts_sampler", "pymc")
    if sampler != "pymc":
        raise ValueError(
            f"nuts_sampler={sampler!r} runs an external NUTS sampler, which reads the data "
            "without a privacy mechanism; pymc_dp's steps run in PyMC's own sampler: remove "
            "nuts_sampler (refused here before any data is read; pm.sample would refuse it "
            "only after the automatic mode had spent the budget)"
        )


def _check_cores(sample_kwargs: dict) -> None:
    """Records on a cluster: the chains run in this process, one after the other."""
    if sample_kwargs.get("cores", 1) not in (1, None):
        raise ValueError(
            f"cores={sample_kwargs['cores']!r}: with records on a Dask cluster the chains run "
            "one after the other in this process (cores=1); the cluster does the parallel work"
        )


def _parallel(sample_kwargs: dict, chains: int) -> bool:
    """Whether ``pm.sample`` runs the chains in worker processes (as PyMC decides)."""
    cores = sample_kwargs.get("cores")
    if cores is None:
        cores = min(4, os.cpu_count() or 1)
    return chains > 1 and int(cores) > 1


def _account_partial_run(
    err: BaseException,
    steps: list,
    delta: float | None,
    *,
    presample=None,
    parallel: bool = False,
    target: float | None = None,
) -> None:
    """Attach to ``err`` the releases made before the run stopped and their privacy spend.

    Every error that stops a run after a release (records lost, the budget exceeded, an
    exception in a worker or in ``pm.sample``) gets ``releases``, ``epsilon`` and ``delta``
    attributes and a note: the pre-sampling phases (``presample``, a
    `pymc_dp.auto.configure.PresampleSpend`) and every step's releases that reached the
    driver. Chains run in worker processes (``parallel``) are not seen from here: their
    spend is bounded by the run's calibration, so ``epsilon`` is the run's ``target`` (an
    upper bound; ``epsilon_is_bound`` is True), or None when it is not known. An error
    raised before any release gets ``releases = 0`` and no note.
    """
    pre_mu = 0.0 if presample is None else presample.mu
    pre_releases = 0 if presample is None else presample.releases
    mu = pre_mu + sum(s.released_mu() for s in steps)
    events = [ev for s in steps for ev in s.released_events()]
    releases = pre_releases + int(sum(sum(s._fns.released.values()) for s in steps))
    if mu > 0:  # the Gaussian releases, as one Gaussian mechanism of the composed mu
        events.append(GaussianEvent(float(np.sqrt(0.5 / mu))))
    if delta is None:
        targets = [s.target_delta for s in steps if s.target_delta is not None]
        delta = min(targets) if targets else None
    epsilon = None
    bound = False
    if parallel and steps:
        if target is not None:
            epsilon, bound = float(target), True
    elif delta is not None:
        epsilon = compose_epsilon(events, delta) if events else 0.0
    try:
        err.releases = releases
        err.epsilon = epsilon
        err.delta = None if delta is None else float(delta)
        err.epsilon_is_bound = bound
    except AttributeError:  # an exception type that takes no attributes: the note only
        pass
    if parallel and steps:
        spent = ": the spend is unknown (at most the steps' calibration)"
        if epsilon is not None and delta is not None:
            spent = f": (epsilon, delta) spent is at most the target ({epsilon:.4g}, {delta:.3g})"
        note = (
            f"the run stopped after {pre_releases} pre-sampling releases; its chains ran in "
            "worker processes, whose releases this process does not count" + spent
        )
    elif releases == 0:
        return
    else:
        note = f"{releases} released sums reached the driver before the run stopped" + (
            f": (epsilon, delta) = ({epsilon:.4g}, {delta:.3g})" if epsilon is not None else ""
        )
    err.add_note(note)


def _drop_groups(idata, names) -> None:
    for g in names:
        if hasattr(idata, "groups") and callable(idata.groups):  # arviz.InferenceData
            if g in idata.groups():
                delattr(idata, g)
                idata._groups = [x for x in idata._groups if x != g]
        elif g in getattr(idata, "children", {}):  # xarray.DataTree
            del idata[g]
