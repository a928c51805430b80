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

from pymc_dp import callscope
from pymc_dp.kernels.warmstart import conditional_prior_draw
from pymc_dp.step_methods.base import DPStep, RunPlan

__all__ = ["DPLaplaceDraws", "DPPosteriorDraws", "FreeBlock", "PriorBlock"]

#: Metropolis steps per draw of `FreeBlock`, from a draw of the Gaussian's own conditional
#: (its proposal at Roberts et al.'s scale). Measured on a 6-group hierarchy's loc and log
#: scale given the group effects (the Gaussian's mean of the scale 0.79 of the exact
#: conditional's, by quadrature): 12 steps left the draws' mean of the scale 4.4 Monte Carlo
#: sds from the exact one, 30 steps 1.1.
FREE_BLOCK_STEPS = 30


@dataclass
class FreeBlock:
    """The coordinates of ``y`` the likelihood does not read, drawn from their exact
    conditional prior given the others (data-free; `conditional_prior_draw`).

    A recentred hierarchy ``a = loc + scale * z`` (`pymc_dp.auto.recentre`) is approximated
    in ``y = (loc, log scale, a, ...)``; the data determine ``a`` (a Gaussian approximation
    holds there) but ``(loc, log scale)`` given ``a`` is their conditional prior, skewed
    where the groups are few (log scale's conditional is a scaled inverse chi-square's
    log). A Gaussian in every coordinate put the mean of ``tau`` and of the ``z`` off the
    posterior's even at the exact mode: measured (the exact mode and the one-shot
    covariance, 8 000 draws, against NUTS) 0.50 NUTS sds on an 8-group hierarchy (n =
    5 000), 0.34 on `bench_auto`'s 20-group one; with the free block drawn from its
    conditional, 0.13 on the former.

    Parameters
    ----------
    free : array of bool (d,)
        The coordinates the likelihood does not read (public, from the graph).
    log_prior : callable
        The log prior density of ``y`` (data-free).
    cov : array (d, d)
        The Gaussian approximation's covariance: the proposal is its conditional covariance
        of the free block given the rest, scaled by ``2.38 / sqrt(k)`` ([Roberts1997]).
    steps : int
        Metropolis steps per draw.
    """

    free: np.ndarray
    log_prior: Callable[[np.ndarray], float]
    cov: np.ndarray
    steps: int = FREE_BLOCK_STEPS

    def __post_init__(self) -> None:
        self.free = np.asarray(self.free, dtype=bool)
        cov = np.asarray(self.cov, dtype=float)
        precision = np.linalg.inv(0.5 * (cov + cov.T))
        idx = np.flatnonzero(self.free)
        cond = np.linalg.inv(precision[np.ix_(idx, idx)])  # Cov(free | rest)
        scale = 2.38 / np.sqrt(max(idx.size, 1))
        self.proposal_chol = scale * np.linalg.cholesky(0.5 * (cond + cond.T))

    def draw(self, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``y`` with its free block drawn from the conditional prior given the rest."""
        return conditional_prior_draw(
            y, self.free, self.log_prior, self.proposal_chol, self.steps, rng
        )


@dataclass
class PriorBlock:
    """Coordinates of ``y`` drawn from their prior, independently of the others (data-free).

    The one-shot strategy's prior-wide coordinates (`pymc_dp.auto.oneshot.prior_cap`,
    `pymc_dp.auto.oneshot.lost_coordinates`: the release could not tell the data from the
    noise there) are drawn from the prior itself: each draw takes one row of ``pool``,
    data-free forward draws of the prior in ``y`` (`pymc_dp.auto.configure.prior_in_y`, a
    fixed public seed), for those coordinates jointly. On the model's scale their draws are
    then exactly as spread as the prior. A Gaussian in ``y`` cannot be: a log scale's
    Gaussian several prior sds wide in ``log phi`` draws ``phi`` far wider than its prior
    (measured: a Gamma GLM on 4 596 real records at epsilon 3, ``phi ~ HalfNormal(1)``, sd
    52.6 against the prior's 0.60). The other coordinates keep their Gaussian marginal.

    Parameters
    ----------
    free : array of bool (d,)
        The coordinates drawn from the prior (a function of DP outputs).
    pool : array (k, m)
        ``k`` prior draws of those ``m`` coordinates in ``y`` (data-free).
    """

    free: np.ndarray
    pool: np.ndarray

    def __post_init__(self) -> None:
        self.free = np.asarray(self.free, dtype=bool)
        self.pool = np.atleast_2d(np.asarray(self.pool, dtype=float))
        if self.pool.shape[1] != int(self.free.sum()) or self.pool.shape[0] < 1:
            raise ValueError(
                f"pool must have shape (k, {int(self.free.sum())}) (one column per coordinate "
                f"drawn from the prior); got {self.pool.shape}"
            )

    def draw(self, y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``y`` with the block replaced by a prior draw (one row of the pool, uniformly)."""
        out = np.array(y, dtype=float)
        out[self.free] = self.pool[int(rng.integers(self.pool.shape[0]))]
        return out


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
    free_block : FreeBlock or PriorBlock, optional
        Coordinates the likelihood does not read, drawn from their exact conditional prior
        given the Gaussian draw of the others (data-free; `FreeBlock`): the draws are then
        the Gaussian's marginal of the others times that conditional. Or coordinates drawn
        from their prior, independently of the others (`PriorBlock`: the one-shot result's
        prior-wide coordinates).

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
        free_block: FreeBlock | PriorBlock | None = None,
    ) -> None:
        model = pm.modelcontext(model)
        vars = model.value_vars
        ip = callscope.initial_point(model)
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
        if free_block is not None and free_block.free.shape != (d,):
            raise ValueError(
                f"free_block.free must have shape ({d},) (the model's {d} free parameters); "
                f"got {free_block.free.shape}"
            )
        self.free_block = free_block
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
        if self.free_block is not None:
            y = self.free_block.draw(y, self.rng)
        q = y if self.to_q is None else self.to_q(y)
        return RaveledVars(np.asarray(q, dtype=q0.data.dtype), q0.point_map_info), {"accepted": 1.0}

    def released_mu(self) -> float:
        return 0.0


class DPPosteriorDraws(DPLaplaceDraws):
    """Draws resampled from released posterior draws (no data access).

    ``pool`` holds draws of a noise-aware posterior in the model's flat value space, each a
    DP output (post-processing of releases made before sampling: the per-group statistics
    strategy's NUTS run, `pymc_dp.auto.groupstats`). Every iteration returns one of them
    chosen uniformly at random (with replacement), so the chains are independent draws from
    the pool's empirical distribution. The privacy notes of `DPLaplaceDraws` apply.
    """

    name = "dp_posterior_draws"

    def __init__(
        self,
        pool: np.ndarray,
        *,
        model: pm.Model | None = None,
        draws: int,
        tune: int,
        chains: int,
        delta: float | None = None,
    ) -> None:
        pool = np.atleast_2d(np.asarray(pool, dtype=float))
        cov = np.cov(pool.T).reshape(pool.shape[1], pool.shape[1])
        cov = cov + 1e-12 * np.eye(pool.shape[1]) * max(1.0, float(np.max(np.diag(cov))))
        super().__init__(
            pool.mean(axis=0), cov, model=model, draws=draws, tune=tune, chains=chains,
            delta=delta,
        )  # fmt: skip
        self.pool = pool

    def _dp_astep(self, q0):
        q = self.pool[int(self.rng.integers(self.pool.shape[0]))]
        return RaveledVars(np.asarray(q, dtype=q0.data.dtype), q0.point_map_info), {"accepted": 1.0}
