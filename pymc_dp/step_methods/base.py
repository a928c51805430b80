"""Shared machinery of the pymc_dp step methods.

A DP step is a thin PyMC `ArrayStepShared`: it wires a
pure kernel (`pymc_dp.kernels`) to the per-record model functions
(`pymc_dp.records`), declares its sampler stats, and records in every iteration the
privacy it spent (data-free constants), from which `pymc_dp.privacy_report` composes the
spend of a whole run. The step never does privacy math beyond calling
`pymc_dp.accounting`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pymc as pm
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence
from pymc.util import get_value_vars_from_user_vars

from pymc_dp import callscope
from pymc_dp._validation import check_positive as _check_positive
from pymc_dp._validation import check_target, check_unit_interval, resolve_noise_or_target
from pymc_dp.records import build_record_functions, count_records, deterministics_reading_data
from pymc_dp.step_methods.parts import LikelihoodSettings, PrivacySettings

__all__ = [
    "BudgetExceededError",
    "DPStep",
    "RunPlan",
    "ScaleAdaptation",
    "NONPRIVATE_SUFFIX",
    "NOISE_OR_TARGET",
    "WALK_STATS",
    "noise_or_target",
    "check_positive",
    "check_target",
    "scalar_stats",
]

#: Suffix of every sampler stat that is computed from the data without noise.
NONPRIVATE_SUFFIX = "_NONPRIVATE"


def scalar_stats(*names: str, dtype: type = np.float64) -> dict[str, tuple[type, list]]:
    """Entries of a step's ``stats_dtypes_shapes``: each of ``names`` a scalar stat of ``dtype``."""
    return {name: (dtype, []) for name in names}


#: The stats of a Metropolis-type step's accept decision and random walk: the (noisy)
#: acceptance probability, the walk's adapted scale, the norm of the proposed move and the
#: standard deviation of the added noise (post-processing of releases and public settings).
WALK_STATS = scalar_stats("accept", "scaling", "step_norm", "noise_std")


class BudgetExceededError(RuntimeError):
    """A chain was asked to run more iterations than its noise was calibrated for."""


def check_positive(name: str, value: Any, *, integer: bool = False, allow_zero: bool = False):
    """Validate a positive finite number (argument order of the original step API).

    Kept for compatibility: `pymc_dp._validation.check_positive` (``value, name``) is
    the one implementation.
    """
    return _check_positive(value, name, integer=integer, allow_zero=allow_zero, coerce=True)


class RunPlan:
    """A planned run: iterations per chain (tuning included) and number of chains.

    Parameters
    ----------
    draws, tune, chains : int
        As passed to `pymc.sample`. Warmup (``tune``) iterations read the data and are
        charged like any other iteration.
    """

    def __init__(self, draws: int, tune: int, chains: int) -> None:
        self.draws = check_positive("draws", draws, integer=True)
        self.tune = check_positive("tune", tune, integer=True, allow_zero=True)
        self.chains = check_positive("chains", chains, integer=True)

    @property
    def iterations_per_chain(self) -> int:
        return self.draws + self.tune

    @property
    def iterations(self) -> int:
        return self.chains * self.iterations_per_chain

    def __repr__(self) -> str:
        return f"RunPlan(draws={self.draws}, tune={self.tune}, chains={self.chains})"


def make_plan(draws, tune, chains, *, epsilon) -> RunPlan | None:
    """A RunPlan when a target epsilon is given; error if the plan is incomplete."""
    if epsilon is None:
        if any(v is not None for v in (draws, tune, chains)):
            return RunPlan(draws, tune if tune is not None else 0, chains or 1)
        return None
    missing = [k for k, v in (("draws", draws), ("tune", tune), ("chains", chains)) if v is None]
    if missing:
        raise ValueError(
            "a target epsilon calibrates the noise for a planned run: pass "
            f"{', '.join(missing)} (the same values you give pm.sample), or use pymc_dp.sample "
            "which passes them for you"
        )
    return RunPlan(draws, tune, chains)


#: The refusal of a step given both (or neither) a noise multiplier and a target epsilon.
NOISE_OR_TARGET = (
    "give exactly one of noise_multiplier or epsilon (with delta, draws, tune, chains): the "
    "noise is set either directly or by a target for a planned run (PrivacySettings)"
)


def noise_or_target(
    privacy: PrivacySettings,
    *,
    noise_given: bool,
    noise: Callable[[], Any],
    calibrate: Callable[[RunPlan, float, float], Any],
    message: str = NOISE_OR_TARGET,
) -> tuple[Any, RunPlan | None, float | None, float | None]:
    """A step's noise from its `PrivacySettings`: given, or calibrated for the target over
    the planned run (`pymc_dp._validation.resolve_noise_or_target`)."""
    eps = privacy.epsilon
    return resolve_noise_or_target(
        eps,
        privacy.delta,
        noise_given=noise_given,
        message=message,
        plan=lambda: make_plan(privacy.draws, privacy.tune, privacy.chains, epsilon=eps),
        noise=noise,
        calibrate=calibrate,
    )


class DPStep(ArrayStepShared):
    """Base class of the differentially private step methods.

    Subclasses set ``self._mu_per_iteration`` and ``self._releases_per_iteration`` (data-free
    constants) before calling `_setup`, implement `_dp_astep` and extend
    ``stats_dtypes_shapes``. Every iteration calls `_begin_iteration` before it reads the
    data, which enforces the calibrated plan.
    """

    name = "dp_step"
    default_blocked = True
    stats_dtypes_shapes = {
        "accepted": (np.float64, []),
        "dp_mu": (np.float64, []),
        "dp_releases": (np.int64, []),
        "dp_target_delta": (np.float64, []),
        # Data-free facts for the report: how many scalar parameters this step samples (the
        # report checks that DP steps cover every free variable) and how many chains its noise
        # was calibrated for (0: no plan), so that an overrun shows in the result.
        "dp_ndim": (np.int64, []),
        "dp_plan_chains": (np.int64, []),
        # Data-sharing (Yildirim & Ermis 2019, Algorithm 2): the number of data owners who
        # each added their own noise to every release of the iteration (0: the central
        # scheme, one noise added by the driver). Data-free.
        "dp_owners": (np.int64, []),
        # The iteration of the chain this draw is (1, 2, ... counting warmup): the report
        # checks that a result holds every iteration the step counted, so that a thinned or
        # sliced result is not reported for less than it spent. Data-free.
        "dp_iteration": (np.int64, []),
        # Iterations per chain the step was calibrated for (0: no plan): a result whose
        # chains are shorter may have lost iterations from their end. Data-free.
        "dp_plan_iterations": (np.int64, []),
        # 1 when the step used a release made before the chains (a control variate's noisy
        # gradient sum): the report refuses a result that does not carry its accounting
        # (``dp_presample_mu``). Data-free.
        "dp_needs_presample": (np.int64, []),
    }

    #: The step's deprecated privacy keywords: ``keyword -> (PrivacySettings field, release
    #: kind or None)`` (`pymc_dp.step_methods.parts.resolve_parts`).
    _privacy_keywords: dict[str, tuple[str, str | None]] = {
        "clip_bound": ("clip_bound", None),
        "noise_multiplier": ("noise_multiplier", None),
    }

    #: Whether the step uses a release made before the chains (set by the step).
    _needs_presample = False

    #: Whether the step works with records on a cluster (it releases sums only).
    remote_records = False
    #: Whether the step implements the data-sharing scheme (owners add their own noise).
    data_sharing = False

    def _setup(
        self,
        vars,
        privacy: PrivacySettings,
        likelihood: LikelihoodSettings,
        plan: RunPlan | None,
        target_delta: float | None,
        *,
        stacklevel: int = 3,
        **pymc_args: Any,
    ) -> None:
        """The one construction path of every step: check the model and the records,
        compile the per-record functions and start the PyMC step.

        ``pymc_args`` are the PyMC step arguments ``model``, ``rng``, ``initial_point``,
        ``compile_kwargs`` and ``blocked``, passed on as the constructor received them;
        ``stacklevel`` points the warnings at the user's code (3: called by the constructor).
        """
        model, rng = pymc_args["model"], pymc_args["rng"]
        initial_point, blocked = pymc_args["initial_point"], pymc_args["blocked"]
        records, nonprivate_diagnostics = likelihood.records, privacy.nonprivate_diagnostics
        data_free_potentials = likelihood.data_free_potentials
        model = pm.modelcontext(model)
        _check_records(type(self), records, nonprivate_diagnostics)
        if initial_point is None:
            initial_point = callscope.initial_point(model)
        if vars is None:
            vars = model.value_vars
        else:
            vars = get_value_vars_from_user_vars(vars, model)
        uncovered = [v.name for v in model.value_vars if v not in vars]
        if uncovered:
            warnings.warn(
                f"{type(self).__name__} samples {[v.name for v in vars]} only; the free "
                f"variables {uncovered} must be sampled by pymc_dp steps too (in a "
                "CompoundStep of pymc_dp steps that cover them all, as step=[...], this is "
                "met), otherwise PyMC assigns them a non-private sampler that reads the data "
                "without noise (pymc_dp.sample refuses such a run; pymc_dp.privacy_report "
                "with model=... checks a pm.sample result)",
                UserWarning,
                stacklevel=stacklevel,
            )
        leaky = [d.name for d in deterministics_reading_data(model)]
        if leaky:
            warnings.warn(
                f"Deterministics {leaky} depend on the data; pm.sample stores them at every "
                "draw without noise. Exclude them with var_names=[...] (pymc_dp.sample "
                "refuses to store them)",
                UserWarning,
                stacklevel=stacklevel,
            )
        count_records(model)  # refuses a model without records (structure only)
        n = records.n_records if records is not None else count_records(model)
        if target_delta is not None and target_delta > 1.0 / n:
            warnings.warn(
                f"delta={target_delta:g} is larger than 1/n = {1.0 / n:g}: a mechanism that "
                "publishes one random record in the clear satisfies (0, 1/n)-DP. Choose delta "
                "well below 1/n (the papers use 0.1/n)",
                UserWarning,
                stacklevel=stacklevel,
            )
        self.data_free_potentials = bool(data_free_potentials)
        self.plan = plan
        self.max_iterations = plan.iterations_per_chain if plan is not None else None
        self.target_delta = target_delta
        self.nonprivate_diagnostics = bool(nonprivate_diagnostics)
        if self.nonprivate_diagnostics:
            warnings.warn(
                f"{type(self).__name__}(nonprivate_diagnostics=True): sampler stats ending in "
                f"{NONPRIVATE_SUFFIX} are computed from the data WITHOUT noise and are NOT "
                "differentially private. Never publish a result sampled with this option; its "
                "privacy report says so.",
                UserWarning,
                stacklevel=stacklevel,
            )
        self._fns, shared = build_record_functions(
            model,
            vars,
            initial_point,
            tempering=likelihood.tempering,
            chunk_size=likelihood.chunk_size,
            data_free_potentials=data_free_potentials,
            compile_kwargs=pymc_args["compile_kwargs"],
            records=records,
        )
        if not self._fns.records.local:
            # the clipped counts are computed from the data without noise: they leave the
            # workers only when the user asked for non-private diagnostics
            self._fns.counts = self.nonprivate_diagnostics
        self._owners = int(getattr(self._fns.records, "n_owners", 0))
        q0 = np.concatenate([np.ravel(initial_point[v.name]) for v in vars])
        self._fns.check_start(q0)
        # With no other free variable (nothing shared) the log prior is a function of q alone
        # and the last value can be reused (`_prior_logp`).
        self._prior_memo: tuple[np.ndarray, float] | None = None
        self._prior_memo_ok = not shared
        self._iteration = 0
        self._chains_started = 0
        # Adapt during warmup; pm.sample switches this off (stop_tuning) when warmup ends.
        self.tune = True
        super().__init__(vars, shared, blocked=blocked, rng=rng)

    # -- PyMC hooks ---------------------------------------------------------------------------
    def set_rng(self, rng) -> None:
        """PyMC 5.x calls this once at the start of every chain (cores=1 and parallel alike)."""
        super().set_rng(rng)
        self._start_chain()

    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """PyMC 6.x calls this once at the start of every chain, with its length."""
        super().setup_chain(rng, tune, draws)
        self._start_chain(int(tune) + int(draws))

    def _start_chain(self, iterations: int | None = None) -> None:
        self._iteration = 0
        # One instance runs every chain in turn when pm.sample runs chains sequentially
        # (cores=1, both PyMC lines): a chain beyond the plan is refused before it reads the
        # data. Parallel workers hold copies and cannot see each other; there the report
        # flags the overrun (dp_plan_chains against the chains in the result).
        self._chains_started = getattr(self, "_chains_started", 0) + 1
        if self.plan is not None and self._chains_started > self.plan.chains:
            raise BudgetExceededError(
                f"{type(self).__name__} was calibrated for {self.max_iterations} iterations "
                f"per chain and {self.plan.chains} chain(s) ({self.plan}); this would be chain "
                f"{self._chains_started}: every chain "
                "reads the data and spends the budget again, so it stops before reading it. "
                "Calibrate for the run you make (chains=...) and use a new step instance for "
                "every run (or use pymc_dp.sample)"
            )
        if (
            iterations is not None
            and self.max_iterations is not None
            and iterations > self.max_iterations
        ):
            self._raise_budget_exceeded()
        self._prior_memo = None
        self._reset_chain_state()

    def _reset_chain_state(self) -> None:
        """Per-chain state (overridden by steps that carry state across iterations)."""

    @staticmethod
    def competence(var, has_grad):
        # Never assigned automatically: privacy is opt-in by constructing the step.
        return Competence.INCOMPATIBLE

    # -- privacy bookkeeping ------------------------------------------------------------------
    def _begin_iteration(self) -> None:
        """Enforce the calibrated plan; call before the iteration reads the data."""
        if self.max_iterations is not None and self._iteration >= self.max_iterations:
            self._raise_budget_exceeded()
        self._iteration += 1

    def _raise_budget_exceeded(self):
        raise BudgetExceededError(
            f"{type(self).__name__} was calibrated for {self.max_iterations} iterations per "
            f"chain ({self.plan}); a chain may not run longer, so it stops before reading the "
            "data again. Calibrate for the run you make: pass the same draws, tune and chains to "
            "the step and to pm.sample (or use pymc_dp.sample)."
        )

    def _privacy_stats(self) -> dict[str, Any]:
        return {
            "dp_mu": self._mu_per_iteration,
            "dp_releases": self._releases_per_iteration,
            "dp_target_delta": np.nan if self.target_delta is None else self.target_delta,
            "dp_ndim": self._fns.ndim,
            "dp_plan_chains": 0 if self.plan is None else self.plan.chains,
            "dp_owners": getattr(self, "_owners", 0),
            "dp_iteration": self._iteration,
            "dp_plan_iterations": self.max_iterations or 0,
            "dp_needs_presample": int(self._needs_presample),
        }

    def released_mu(self) -> float:
        """Privacy-loss parameter of the releases that reached the driver so far (all chains).

        Counted by the record functions as each released sum returns; used to account for a
        run that stopped part-way (`pymc_dp.records.dask_store.RecordsLostError`).
        """
        mu = self._mu_per_release()
        return float(sum(mu[kind] * k for kind, k in self._fns.released.items()))

    def released_events(self) -> list:
        """Privacy events of the releases that reached the driver so far (all chains), for
        the mechanisms not accounted by `released_mu` (the minibatch steps override it)."""
        return []

    def _releases(self) -> int:
        """Released sums that reached the driver so far (all chains, all kinds)."""
        return int(sum(self._fns.released.values()))

    def _mu_per_release(self) -> dict[str, float]:
        """``{"llr": mu, "grad": mu}`` of one release of each kind (overridden by steps)."""
        return {"llr": self._mu_per_iteration, "grad": self._mu_per_iteration}

    def astep(self, q0):
        self._begin_iteration()
        q, stats = self._dp_astep(q0)
        stats.update(self._privacy_stats())
        if not self.nonprivate_diagnostics:
            # The one place non-private stats are blanked: every *_NONPRIVATE stat a step
            # computes is NaN unless the user asked for them (nonprivate_diagnostics=True).
            for key in stats:
                if key.endswith(NONPRIVATE_SUFFIX):
                    stats[key] = np.nan
        return q, [stats]

    def _prior_logp(self, q: np.ndarray) -> float:
        """Log prior + log-Jacobian at ``q`` (data-free), reusing the last value remembered
        by `_remember_prior` when ``q`` is the same point and no other variable can change
        it; the value is the same either way."""
        memo = self._prior_memo
        if memo is not None and np.array_equal(memo[0], q):
            return memo[1]
        return self._fns.prior_logp(q)

    def _remember_prior(self, q: np.ndarray, lp: float) -> None:
        """Remember ``lp`` as the log prior at ``q`` (only when nothing else is shared)."""
        if self._prior_memo_ok:
            self._prior_memo = (np.array(q, copy=True), lp)

    def _dp_astep(self, q0):  # pragma: no cover - abstract
        raise NotImplementedError


def n_records_of(step: type, model, records, nonprivate_diagnostics: bool) -> int:
    """The number of records ``n`` a step reads (public), before anything is compiled or read.

    The model's (counted from its shapes) or, with ``records=``, that of the records (the
    model may hold a small stand-in); ``records`` is checked first (`_check_records`).
    """
    _check_records(step, records, nonprivate_diagnostics)
    n = count_records(pm.modelcontext(model))  # refuses a model without records
    return int(records.n_records) if records is not None else n


def _check_records(step: type, records, nonprivate_diagnostics: bool) -> None:
    """Refuse records a step cannot use, before anything is compiled or read."""
    if records is None:
        return
    if not hasattr(records, "store_for"):
        raise TypeError(
            f"records must be pymc_dp.distributed.DaskRecords (or None: the model's data); got "
            f"{type(records).__name__}"
        )
    if not step.remote_records:
        raise ValueError(
            f"{step.__name__} does not take records on a cluster (records=DaskRecords(...)) "
            f"yet; use one of {_remote_step_names()} with them, or in-memory records "
            "(records=None)"
        )
    if getattr(records, "owners", None) is not None:
        if not step.data_sharing:
            raise ValueError(
                f"{step.__name__} does not implement the data-sharing scheme (owners=...); use "
                "DPPenaltyMetropolis (Yildirim & Ermis 2019, Algorithm 2) or DaskRecords "
                "without owners"
            )
        if nonprivate_diagnostics:
            raise ValueError(
                "nonprivate_diagnostics=True would send each owner's clipped counts to the "
                "curator without noise; it is refused with data owners (owners=...)"
            )


def _remote_step_names() -> list[str]:
    """Names of the public step classes that take records on a cluster (for messages)."""
    import pymc_dp.step_methods as sm

    return sorted(
        name
        for name in getattr(sm, "__all__", [])
        if isinstance(getattr(sm, name, None), type)
        and issubclass(getattr(sm, name), DPStep)
        and getattr(sm, name).remote_records
    )


class ScaleAdaptation:
    """Warmup adaptation of a random-walk scale from the (DP) accept decisions.

    Robbins-Monro on the log scale toward ``target_accept``: post-processing of released
    decisions, so it costs nothing beyond the charged warmup iterations. Mixed into the
    random-walk steps; they set ``scaling`` and ``target_accept`` before calling
    `_reset_scaling`.
    """

    scaling: float
    target_accept: float

    def _set_walk(self, walk, default_target: float):
        """Take a random walk's initial ``scaling`` and warmup ``target_accept``
        (validated, before any data is read); returns its per-coordinate ``scale``."""
        self.proposal = walk
        self.scaling = check_positive("scaling", walk.scaling)
        target = default_target if walk.target_accept is None else walk.target_accept
        self.target_accept = check_unit_interval(target, "target_accept")
        return walk.scale

    def _reset_scaling(self) -> None:
        if not hasattr(self, "_initial_scaling"):
            self._initial_scaling = self.scaling
        self.scaling = self._initial_scaling
        self._tune_count = 0

    def reset_tuning(self) -> None:
        """Restart the warmup adaptation; called by `pm.sample` at the start of every chain.

        Also switches tuning back on, as PyMC's own HMC steps do (``BaseHMC.reset``): with
        ``cores=1`` PyMC sets ``tune`` only on a ``CompoundStep`` itself, not on its methods,
        so after the first chain's warmup ended (``stop_tuning``) the later chains of a
        compound run would not adapt. PyMC calls ``stop_tuning`` at iteration ``tune``
        (at once where ``tune=0``)."""
        self.tune = True
        self._reset_scaling()

    def _adapt_scaling(self, accepted: bool) -> None:
        self._tune_count += 1
        rate = 1.0 / np.sqrt(self._tune_count + 10.0)
        self.scaling = float(self.scaling * np.exp(rate * (float(accepted) - self.target_accept)))
