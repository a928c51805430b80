"""Independent draws from a released Gaussian approximation of the posterior (data-free).

The one-shot strategy of the automatic mode (`pymc_dp.auto.oneshot`) releases, before any
chain runs, a noise-aware private Laplace approximation ``N(m, S)`` of the posterior: a few
private Newton steps, the budget concentrated on the last gradient release, and a
covariance that adds the effect of the release noise on ``m`` (Bernstein & Sheldon 2018's
noise-aware inference, in its Gaussian approximation). Everything that read the data was
released and accounted before sampling (the result's ``dp_presample_*`` attributes); this
step only draws from the released Gaussian, so its iterations read no data and spend
nothing. It is a step so that ``pm.sample`` builds the result PyMC users know (chains,
seeds, transforms, Deterministics, InferenceData on PyMC 5.x and DataTree on PyMC 6.x).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.pytensorf import make_shared_replacements
from pymc.step_methods.arraystep import ArrayStepShared

from pymc_dp.step_methods.base import DPStep, RunPlan

__all__ = ["DPLaplaceDraws"]


@dataclass
class _NoRecords:
    """What the run's checks ask of a step's record functions: this step has none."""

    ndim: int
    local: bool = True
    released: dict = field(default_factory=dict)

    @property
    def records(self) -> _NoRecords:
        return self


class DPLaplaceDraws(DPStep):
    """Independent draws from a released Gaussian ``N(mean, cov)`` (no data access).

    Parameters
    ----------
    mean : array, shape (d,)
        Released mean (a DP output), in the coordinates ``y`` the approximation lives in.
    cov : array, shape (d, d)
        Its covariance (a DP output, noise-aware).
    to_q : callable, optional
        Public map from ``y`` to the model's flat value space (default: the identity).
    model : pm.Model, optional
    draws, tune, chains : int
        The run (as given to ``pm.sample``): a chain beyond it is refused.
    delta : float, optional
        Target delta of the run whose pre-sampling releases made ``mean`` and ``cov``.

    Notes
    -----
    The privacy of the result is that of the releases that made ``mean`` and ``cov``: the
    report adds them from the result's ``dp_presample_*`` attributes, which
    `pymc_dp.sample` writes. Used alone, this step's result is private only if those
    attributes are attached.
    """

    name = "dp_laplace_draws"
    stats_dtypes_shapes = {**DPStep.stats_dtypes_shapes}
    # these draws come from releases made before sampling, whose accounting the result must
    # carry (stat ``dp_needs_presample``: `pymc_dp.privacy_report` refuses without it)
    _needs_presample = True

    def __init__(
        self,
        mean: np.ndarray,
        cov: np.ndarray,
        *,
        to_q: Callable[[np.ndarray], np.ndarray] | None = None,
        model: pm.Model | None = None,
        draws: int,
        tune: int,
        chains: int,
        delta: float | None = None,
    ) -> None:
        model = pm.modelcontext(model)
        vars = model.value_vars
        ip = model.initial_point()
        d = int(sum(np.size(ip[v.name]) for v in vars))
        mean = np.asarray(mean, dtype=float)
        cov = np.asarray(cov, dtype=float)
        if mean.shape != (d,) or cov.shape != (d, d):
            raise ValueError(
                f"mean must have shape ({d},) and cov ({d}, {d}) (the model's {d} free "
                f"parameters); got {mean.shape} and {cov.shape}"
            )
        self.mean = mean
        self.chol = np.linalg.cholesky(0.5 * (cov + cov.T))
        self.to_q = to_q
        self.plan = RunPlan(draws, tune, chains)
        self.max_iterations = self.plan.iterations_per_chain
        self.target_delta = delta
        self.nonprivate_diagnostics = False
        self.data_free_potentials = False
        self._fns = _NoRecords(d)
        self._owners = 0
        self._mu_per_iteration = 0.0
        self._releases_per_iteration = 0
        self._prior_memo = None
        self._prior_memo_ok = False
        self._iteration = 0
        self._chains_started = 0
        self.tune = True
        shared = make_shared_replacements(ip, vars, model)
        ArrayStepShared.__init__(self, vars, shared, blocked=True)

    def _dp_astep(self, q0):
        y = self.mean + self.chol @ self.rng.normal(size=self.mean.size)
        q = y if self.to_q is None else self.to_q(y)
        return RaveledVars(np.asarray(q, dtype=q0.data.dtype), q0.point_map_info), {"accepted": 1.0}

    def released_mu(self) -> float:
        return 0.0
