"""Proposals and the control variate of the Metropolis-type steps, as objects.

In the manner of PyMC's ``proposal_dist`` (``NormalProposal``, ...) and BlackJAX's
``random_walk`` / ``independent`` proposal functions, a step takes its proposal as one
object instead of a handful of keywords:

- `RandomWalk`: ``theta' = theta + s S xi`` (per-coordinate scales ``S``) or
  ``theta + s L xi`` (``L L^T`` a public covariance), the global scale ``s`` adapted in
  warmup toward a target acceptance rate from the DP accept decisions;
- `CoordinateWalk`, `GuidedWalk`: one coordinate at a time (the guided walk flips its
  direction after a rejection; Gustafson 1998, Yildirim & Ermis 2019);
- `Independent`: ``theta' ~ N(m, s^2 Sigma)`` (e.g. a private Laplace approximation), with
  optional local random-walk moves (a mixture of kernels, Tierney 1994) and data-free moves
  of the coordinates no record's log-likelihood reads (Metropolis-within-Gibbs).

`ControlVariate` is the first-order control variate of the penalty test (Bardenet et al.
2017, Sec. 6), and `Coordinates` the coordinates ``y = T(theta)`` the proposal works in (the
identity, or the recentred and shifted blocks of a hierarchical model). All of them are
data-free settings: choose them from public knowledge or from DP outputs (post-processing),
never from the data. Dimensions are checked by the step
(before it reads any data). The proposals draw their moves (``propose(rng, q, scaling)``,
the step passing its generator and its adapted scale), with the generator calls the steps
made before they did.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = [
    "ControlVariate",
    "Coordinates",
    "CoordinateWalk",
    "GuidedWalk",
    "Independent",
    "RandomWalk",
    "TunaMHTest",
]


class _Draws:
    """What the proposals share to draw: the global scale of a draw and the Cholesky
    factor of ``cov`` (computed once; the step has validated ``cov`` before)."""

    def _scaling(self, scaling: float | None) -> float:
        return self.scaling if scaling is None else scaling

    @cached_property
    def _factor(self) -> np.ndarray:
        return np.linalg.cholesky(np.asarray(self.cov, dtype=float))


@dataclass(frozen=True, eq=False)
class RandomWalk(_Draws):
    r"""Gaussian random walk over the full vector.

    Parameters
    ----------
    scale : float or array
        Per-coordinate proposal std ``S`` (transformed space).
    cov : array, optional
        Proposal covariance ``(d, d)``, positive definite: the walk proposes
        $\theta + s L \xi$ with $L L^T$ = ``cov`` (``scale`` must then stay 1).
    scaling : float
        Initial global scale ``s``, adapted in warmup toward ``target_accept`` from the
        released accept decisions only (post-processing).
    target_accept : float, optional
        Target acceptance rate of the warmup adaptation (the step's default when None:
        0.234 for a full-vector walk).
    max_step : float, optional
        `DPFastMH` only: the walk's step is radially shrunk to length at most ``A`` =
        ``max_step`` (default ``2 s ||S||``).
    free_moves : int
        `DPPenaltyMetropolis` with coordinates whose ``likelihood_free`` mask marks some
        coordinates: data-free random-walk moves of those after each test (see
        `Independent`). Needs ``cov``.
    """

    scale: Any = 1.0
    cov: Any = None
    scaling: float = 1.0
    target_accept: float | None = None
    max_step: float | None = None
    free_moves: int = 0

    kind = "gaussian"

    def propose(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float | None = None
    ) -> np.ndarray:
        r"""Draw $\theta' = \theta + s S \xi$ (or $\theta + s L \xi$ with ``cov``),
        $\xi \sim N(0, I)$: one ``rng.normal(size=d)`` call (BlackJAX's random-walk
        proposal, a function of the state and the generator).

        Parameters
        ----------
        rng : numpy.random.Generator
        q : array
            The current point ``(d,)``.
        scaling : float, optional
            The global scale ``s`` (a step passes its warmup-adapted one); default this
            walk's ``scaling``.

        Returns
        -------
        array
            The proposed point, ``q + move(rng, d, scaling)`` (data-free).
        """
        return q + self.move(rng, q.size, scaling)

    def move(self, rng: np.random.Generator, d: int, scaling: float | None = None) -> np.ndarray:
        """The increment ``s S xi`` (or ``s L xi``) that `propose` adds, of a ``d``-vector:
        `DPFastMH` truncates it to length ``max_step`` before adding it."""
        s = self._scaling(scaling)
        if self.cov is not None:
            return s * (self._factor @ rng.normal(size=d))
        return s * _per_coordinate(self.scale, d) * rng.normal(size=d)


@dataclass(frozen=True, eq=False)
class CoordinateWalk(_Draws):
    """A Gaussian random walk of one coordinate at a time (chosen uniformly).

    Parameters
    ----------
    scale : float or array
        Per-coordinate proposal std ``S``.
    scaling : float
        Initial global scale, adapted in warmup (see `RandomWalk`).
    target_accept : float, optional
        Target acceptance rate of the adaptation (default 0.44 for one coordinate).
    """

    scale: Any = 1.0
    scaling: float = 1.0
    target_accept: float | None = None

    kind = "coordinate"

    def propose(
        self,
        rng: np.random.Generator,
        q: np.ndarray,
        scaling: float | None = None,
        direction: np.ndarray | None = None,
    ) -> tuple[np.ndarray, int]:
        """Draw a coordinate ``j`` uniformly and move it by ``s S_j xi``, ``xi ~ N(0, 1)``
        (``rng.integers(d)``, then ``rng.normal()``).

        Parameters
        ----------
        rng : numpy.random.Generator
        q : array
            The current point ``(d,)``, of which one coordinate moves.
        scaling : float, optional
            The global scale ``s`` (a step passes its adapted one); default this walk's.
        direction : array, optional
            The guided walk's remembered directions (`GuidedWalk`, ``+-1`` per coordinate,
            kept by the step): the move is then ``direction[j] |s S_j xi|``. None: symmetric.

        Returns
        -------
        (array, int)
            The proposed point and the coordinate ``j`` moved (data-free).
        """
        s = self._scaling(scaling)
        j = int(rng.integers(q.size))
        step = s * _per_coordinate(self.scale, q.size)[j] * rng.normal()
        if direction is not None:
            step = direction[j] * abs(step)
        q1 = q.copy()
        q1[j] += step
        return q1, j


@dataclass(frozen=True, eq=False)
class GuidedWalk(CoordinateWalk):
    """The guided random walk: one coordinate at a time, moving in a remembered direction
    that is flipped after a rejection (Gustafson 1998; Yildirim & Ermis 2019, Sec. 3).

    Parameters as `CoordinateWalk`.
    """

    kind = "guided"


@dataclass(frozen=True, eq=False)
class Independent(_Draws):
    r"""An independence proposal $\theta' \sim N(m, s^2 \Sigma)$.

    The Hastings ratio $\log q(\theta)/q(\theta')$ enters the test (Yildirim & Ermis 2019,
    Sec. 3). Its scale is not adapted in warmup: an independence proposal is calibrated, and
    shrinking it toward a target acceptance rate freezes the chain.

    Parameters
    ----------
    mean : array
        ``m`` ``(d,)`` (in the step's coordinates).
    cov : array
        ``Sigma`` ``(d, d)``, positive definite.
    scaling : float
        ``s`` (fixed).
    local_moves : float
        The probability that an iteration proposes a random-walk move
        ``theta + (2.38 / sqrt(d)) L xi`` (``L L^T`` = ``cov``) instead, chosen independently
        of the state (a mixture of two kernels with the same target, Tierney 1994). Default 0.
    free_moves : int
        With coordinates whose ``likelihood_free`` mask marks the coordinates no record's
        log-likelihood reads (`pymc_dp.auto.recentre.Recentring`): after each test,
        ``free_moves`` random-walk Metropolis moves of those coordinates alone with the exact
        acceptance ratio of their density (no record read: no noise, no privacy cost;
        Metropolis-within-Gibbs, Tierney 1994), and the independence proposal moves the other
        coordinates only, drawn from its Gaussian conditioned on the free ones. The moves'
        covariance is the conditional one of ``cov`` times ``2.38^2 / d_free``. Default 0.
    """

    mean: Any
    cov: Any
    scaling: float = 1.0
    local_moves: float = 0.0
    free_moves: int = 0

    kind = "independent"

    def propose(
        self, rng: np.random.Generator, q: np.ndarray, scaling: float | None = None
    ) -> np.ndarray:
        """Draw ``theta' = m + s L xi``, ``xi ~ N(0, I)``, whatever ``q`` (its size only):
        one ``rng.normal(size=d)`` call, as `RandomWalk.propose` (``scaling`` default this
        proposal's ``s``). The step chooses the local and free moves, which depend on its
        state. Data-free."""
        m = np.asarray(self.mean, dtype=float)
        return m + self._scaling(scaling) * (self._factor @ rng.normal(size=q.size))


@dataclass(frozen=True, eq=False)
class ControlVariate:
    r"""A first-order control variate of the penalty test.

    The test uses $\sum_i \mathrm{clip}(r_i - c_i\cdot\Delta) + \tilde G\cdot\Delta$, with
    $c_i$ the per-record gradient at ``anchor`` clipped to ``grad_bound`` (in ``basis``
    coordinates, below) and $\tilde G$ = ``grad_sum``, which must be a *released* (noisy,
    accounted) value of $\sum_i c_i$ (e.g. from the automatic warm start). The clipped
    residuals have the same sensitivity as the ratios but are second order in the step
    (Bardenet et al. 2017, Sec. 6, Taylor proxies). The chain then targets the posterior
    tilted by the noise of ``grad_sum``. The step records that it used such a release (stat
    ``dp_needs_presample``): `pymc_dp.privacy_report` refuses a result that does not carry
    that release's account (``dp_presample_mu``).

    Parameters
    ----------
    anchor : array
        ``(d,)``, in the model's coordinates.
    grad_sum : array
        ``(d,)``: the released sum of the clipped gradients.
    grad_bound : float
        The clip bound of the per-record gradients.
    basis : array, optional
        ``L`` ``(d, d)``, invertible, public (e.g. a whitening from DP outputs): the gradients
        are ``c_i = clip(L^{-1} g_i)`` and the step ``L^T dtheta``; ``grad_sum`` must be the
        released sum of those ``c_i``. Default the identity.
    """

    anchor: Any
    grad_sum: Any
    grad_bound: float
    basis: Any = None

    def as_tuple(self) -> tuple[Any, Any, float]:
        """``(anchor, grad_sum, grad_bound)``."""
        return self.anchor, self.grad_sum, self.grad_bound


def _per_coordinate(scale: Any, d: int) -> np.ndarray:
    """A walk's per-coordinate scales ``S`` as a ``(d,)`` vector (the step has validated
    them: finite, > 0)."""
    return np.broadcast_to(np.ravel(np.asarray(scale, dtype=float)), (d,))


#: The methods a `Coordinates` transform provides.
_TRANSFORM_METHODS = ("forward_with_log_det", "inverse", "log_det_jacobian", "gradient_map")


@dataclass(frozen=True, eq=False)
class Coordinates:
    r"""The coordinates $y = T(\theta)$ a step's proposal works in (`DPPenaltyMetropolis`).

    ``Coordinates()`` is the identity (the default). ``Coordinates(transform)`` holds a
    data-free bijection, e.g. `pymc_dp.auto.recentre.Recentring`, the recentred and shifted
    blocks of a hierarchical model that the automatic mode finds in the model's graph
    (Papaspiliopoulos, Roberts & Skold 2007). The step proposes $y'$ from $y = T(\theta)$
    (a walk's $y + \dots$, or `Independent`'s $N(m, s^2 \Sigma)$ with $m$, $\Sigma$ in
    $y$), moves to $\theta' = T^{-1}(y')$, and adds
    $\log|\det J(\theta)| - \log|\det J(\theta')|$ to the Hastings ratio (the proposal's
    density in $\theta$, a change of variables), so the chain still targets the posterior of
    $\theta$. The transform reads no data: it costs no privacy.

    Parameters
    ----------
    transform : object, optional
        The bijection, with methods ``forward_with_log_det(theta) -> (y, log|det J|)``,
        ``inverse(y)``, ``log_det_jacobian(theta)`` and ``gradient_map(theta)`` (the map
        ``J^{-T}`` of gradients in ``theta`` to gradients in ``y``: a `ControlVariate`'s
        linearisation is then in ``y``), and optionally ``likelihood_free``, a boolean mask
        ``(d,)`` of the coordinates of ``y`` no record's log-likelihood reads (those that a
        proposal's ``free_moves`` move). None (default): the identity.

    Raises
    ------
    TypeError
        If ``transform`` lacks one of the methods above.
    """

    transform: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.transform, Coordinates):
            object.__setattr__(self, "transform", self.transform.transform)
        if self.transform is None:
            return
        missing = [m for m in _TRANSFORM_METHODS if not callable(getattr(self.transform, m, None))]
        if missing:
            raise TypeError(
                f"coordinates: the transform needs the methods {list(_TRANSFORM_METHODS)} "
                f"(e.g. pymc_dp.auto.recentre.Recentring); {type(self.transform).__name__} "
                f"lacks {missing}"
            )

    @property
    def identity(self) -> bool:
        """Whether these are the model's own coordinates (no transform)."""
        return self.transform is None

    @property
    def likelihood_free(self) -> np.ndarray | None:
        """The transform's mask of likelihood-free coordinates of ``y``, or None."""
        return getattr(self.transform, "likelihood_free", None)

    def forward_with_log_det(self, theta: np.ndarray) -> tuple[np.ndarray, float]:
        """``(T(theta), log |det dT/dtheta|)``."""
        if self.transform is None:
            return theta, 0.0
        return self.transform.forward_with_log_det(theta)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """``T^{-1}(y)``."""
        return y if self.transform is None else self.transform.inverse(y)

    def log_det_jacobian(self, theta: np.ndarray) -> float:
        """``log |det dT/dtheta|`` at ``theta``."""
        return 0.0 if self.transform is None else self.transform.log_det_jacobian(theta)

    def gradient_map(self, theta: np.ndarray) -> np.ndarray | None:
        """``J^{-T}`` at ``theta`` (gradients in ``theta`` to gradients in ``y``); None for
        the identity."""
        return None if self.transform is None else self.transform.gradient_map(theta)


@dataclass(frozen=True, eq=False)
class TunaMHTest:
    r"""`DPFastMH`'s minibatch acceptance test (TunaMH, Zhang et al. 2020; DP-Fast MH,
    Zhang et al. 2023, Algorithm 2).

    Parameters
    ----------
    lam : float, optional
        $\lambda$: the expected minibatch size is $\lambda + CM$ (default
        ``max(10, (C A)^2)``, ``A`` the walk's ``max_step``).
    max_batch : int, optional
        ``K``: a branch draw at or above ``K`` takes the full-batch branch (default from
        the expected batch size).
    branching : {"independent", "paper"}
        How the branch is chosen (see `DPFastMH`).
    privacy_for_free : bool
        Reproduce the paper's rule of adding no noise when the branch's sensitivity is small
        (charged honestly: a large delta; see `DPFastMH`). Off by default.
    """

    lam: float | None = None
    max_batch: int | None = None
    branching: str = "independent"
    privacy_for_free: bool = False


#: The older keywords of a random walk (deprecated): folded into the walk object.
WALK_KEYWORDS = ("proposal_scale", "scaling", "target_accept")
#: The random walks by kind (the older ``proposal=`` strings).
WALKS = {"gaussian": RandomWalk, "coordinate": CoordinateWalk, "guided": GuidedWalk}


def walk_from_keywords(
    step: str, proposal: Any, old: dict[str, Any], kinds: tuple[str, ...] = ("gaussian",)
) -> RandomWalk | CoordinateWalk:
    """A step's random walk: the object given, or the one the older keywords describe (a
    kind string ``proposal=`` among ``kinds`` with ``proposal_scale``, ``scaling``,
    ``target_accept``; deprecated). Refuses a walk the step does not take, and keywords
    given beside an object, before any data is read."""
    if proposal is None or isinstance(proposal, str):
        kind = kinds[0] if proposal is None else proposal
        if kind not in kinds:
            raise ValueError(f"proposal must be one of {kinds}; got {proposal!r}")
        return WALKS[kind](
            scale=old.get("proposal_scale", 1.0),
            scaling=old.get("scaling", 1.0),
            target_accept=old.get("target_accept"),
        )
    allowed = tuple(WALKS[k] for k in kinds)
    if type(proposal) not in allowed:
        names = ", ".join(f"pymc_dp.{c.__name__}" for c in allowed)
        raise TypeError(f"{step} takes a proposal among {names}; got {proposal!r}")
    given = [k for k in WALK_KEYWORDS if k in old]
    if given:
        raise TypeError(f"{given}: give them in the proposal object, not as keywords")
    if isinstance(proposal, RandomWalk) and (
        proposal.cov is not None or proposal.max_step is not None or proposal.free_moves
    ):
        raise ValueError(f"{step}'s RandomWalk takes scale, scaling and target_accept only")
    return proposal


def walk_parts(keywords: dict[str, Any], kinds: tuple[str, ...] = ("gaussian",)) -> dict:
    """The parts of a call written with a walk's older keywords (`parts.from_keywords`)."""
    old = {k: keywords[k] for k in WALK_KEYWORDS if k in keywords}
    rest = {k: v for k, v in keywords.items() if k not in old and k != "proposal"}
    return {**rest, "proposal": walk_from_keywords("", keywords.get("proposal"), old, kinds)}
