"""Privacy events: every mechanism pymc_dp accounts for, as frozen data, and the neighbours.

An event says *what* was released (which mechanism, how many times), never how its privacy
is computed: `pymc_dp.accounting.registry` maps each event type to the function that
gives its epsilon. A new mechanism is a new event class here plus one line in the registry;
the meaning of an existing class never changes (the rule of dp-accounting's ``dp_event``).

The events of the full-data steps, composed by `PrivacyLedger`:

* `GaussianEvent` -- ``count`` releases of a Gaussian mechanism whose noise
  standard deviation is ``noise_multiplier`` times the L2 sensitivity of the released
  quantity. Gaussian events compose exactly through their privacy-loss parameter
  `GaussianEvent.mu`.
* `ApproxDPEvent` -- ``count`` releases of a generic mechanism that is only known
  to be (epsilon, delta)-DP. These compose by the optimal homogeneous composition theorem
  of Kairouz, Oh and Viswanath.

The events of the minibatch steps (accounted with dp-accounting or subsampled RDP):

* `PoissonSubsampledGaussian` -- a Gaussian mechanism on a Poisson-sampled batch;
* `WORSubsampledGaussian` -- a Gaussian mechanism on a batch drawn without
  replacement;
* `DPBarkerEvent` -- the DP Barker test (thesis Theorem 8) on a batch drawn without
  replacement.

The event of the data-sharing scheme (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2):

* `DataSharingGaussianEvent` -- ``count`` releases in each of which every one of
  ``owners`` data owners adds its own Gaussian noise to its own clipped contribution.

The Gaussian and approximate-DP events say nothing about the neighbouring relation: the
sensitivity the noise multiplier refers to must be computed for the relation the caller
reports (for replace-one neighbours a per-record value clipped to norm ``b`` has
sensitivity ``2 b``, for add/remove neighbours ``b``). The subsampled events are defined
for replace-one neighbours (`NeighbourRelation.REPLACE_ONE`), the relation of every
epsilon pymc_dp reports.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pymc_dp._validation import (
    check_count,
    check_mechanism_delta,
    check_nonnegative,
    check_positive,
    check_positive_int,
)

__all__ = [
    "ApproxDPEvent",
    "DPBarkerEvent",
    "DataSharingGaussianEvent",
    "GaussianEvent",
    "NeighbourRelation",
    "PoissonSubsampledGaussian",
    "WORSubsampledGaussian",
]


class NeighbourRelation(enum.Enum):
    """Which datasets are neighbours (the unit of privacy)."""

    #: Same size ``n``, one record differs (the papers' *substitute* relation).
    REPLACE_ONE = "replace-one"
    #: One dataset has one record more than the other.
    ADD_REMOVE = "add-remove"

    @property
    def description(self) -> str:
        """One line for reports."""
        return _NEIGHBOUR_DESCRIPTIONS[self]


_NEIGHBOUR_DESCRIPTIONS = {
    NeighbourRelation.REPLACE_ONE: (
        "replace-one (substitute): two datasets of the same size n that differ in one record"
    ),
    NeighbourRelation.ADD_REMOVE: "add/remove: one dataset has one record more than the other",
}


@dataclass(frozen=True)
class GaussianEvent:
    """``count`` self-composed releases of a Gaussian mechanism.

    Each release adds independent N(0, s^2) noise with ``s = noise_multiplier * sensitivity``
    to a query of L2 sensitivity ``sensitivity``.

    Parameters
    ----------
    noise_multiplier : float
        Noise standard deviation divided by the L2 sensitivity; finite and > 0.
    count : int, default 1
        Number of releases (self-composition); >= 0.

    Raises
    ------
    ValueError
        If ``noise_multiplier`` is not a finite number > 0 or ``count`` is not an
        integer >= 0.

    Notes
    -----
    The privacy-loss random variable of one release is N(m, 2 m) with
    ``m = 1 / (2 noise_multiplier**2)`` (Sommer et al. 2019; Räisä et al., Theorem 2.4);
    composing adds the ``m``'s, so the event as a whole has loss N(mu, 2 mu) with
    ``mu = count / (2 noise_multiplier**2)``.

    References
    ----------
    .. [1] D. M. Sommer, S. Meiser, E. Mohammadi, "Privacy loss classes: the central
       limit theorem in differential privacy", PoPETs 2019(2).
    .. [2] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
       Carlo", Theorem 2.4.
    """

    noise_multiplier: float
    count: int = 1

    def __post_init__(self) -> None:
        z = check_positive(self.noise_multiplier, "noise_multiplier")
        k = check_count(self.count, "count")
        object.__setattr__(self, "noise_multiplier", z)
        object.__setattr__(self, "count", k)

    @property
    def mu(self) -> float:
        """Privacy-loss parameter ``count / (2 noise_multiplier**2)`` (loss ~ N(mu, 2 mu))."""
        return self.count / (2.0 * self.noise_multiplier**2)


@dataclass(frozen=True)
class ApproxDPEvent:
    """``count`` self-composed releases of a generic (epsilon, delta)-DP mechanism.

    Parameters
    ----------
    epsilon : float
        Per-release epsilon; finite and >= 0.
    delta : float
        Per-release delta in [0, 1); 0 means pure epsilon-DP.
    count : int, default 1
        Number of releases; >= 0.

    Raises
    ------
    ValueError
        If a parameter is outside the range given above.

    References
    ----------
    .. [1] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential
       privacy", ICML 2015; IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.3.
    """

    epsilon: float
    delta: float
    count: int = 1

    def __post_init__(self) -> None:
        eps = check_nonnegative(self.epsilon, "epsilon")
        delta = check_mechanism_delta(self.delta, "delta")
        k = check_count(self.count, "count")
        object.__setattr__(self, "epsilon", eps)
        object.__setattr__(self, "delta", delta)
        object.__setattr__(self, "count", k)


@dataclass(frozen=True)
class PoissonSubsampledGaussian:
    """``count`` iterations of a Poisson-subsampled Gaussian mechanism (replace-one).

    Parameters
    ----------
    noise_multiplier : float
        Noise std over the per-record contribution bound ``C`` (see
        `pymc_dp.accounting.subsampled`).
    sampling_rate : float
        Probability ``q`` in (0, 1] that a record is read in an iteration.
    count : int
        Number of iterations.
    """

    noise_multiplier: float
    sampling_rate: float
    count: int

    def __post_init__(self) -> None:
        z = check_positive(self.noise_multiplier, "noise_multiplier")
        q = float(self.sampling_rate)
        if not (0.0 < q <= 1.0):
            raise ValueError(f"sampling_rate must be in (0, 1]; got {self.sampling_rate!r}")
        object.__setattr__(self, "noise_multiplier", z)
        object.__setattr__(self, "sampling_rate", q)
        object.__setattr__(self, "count", check_positive_int(self.count, "count"))


@dataclass(frozen=True)
class WORSubsampledGaussian:
    """``count`` iterations of a Gaussian mechanism on a minibatch drawn without replacement.

    Parameters
    ----------
    noise_multiplier : float
        Noise std over the replace-one L2 sensitivity of the minibatch statistic.
    n : int
        Number of records (public).
    batch_size : int
        Minibatch size ``b`` (``1 <= b <= n``).
    count : int
        Number of iterations.
    """

    noise_multiplier: float
    n: int
    batch_size: int
    count: int

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check_positive(self.noise_multiplier, "noise_multiplier")
        )
        n = check_positive_int(self.n, "n")
        b = check_positive_int(self.batch_size, "batch_size")
        if b > n:
            raise ValueError(f"batch_size must be <= n = {n}; got {self.batch_size!r}")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "count", check_positive_int(self.count, "count"))


@dataclass(frozen=True)
class DPBarkerEvent:
    """``count`` DP Barker iterations with ``batch_size`` of ``n`` records (replace-one).

    The test's noise is fixed by thesis Theorem 8, so the batch size (with ``n``) is the
    whole mechanism; accounted by `pymc_dp.accounting.barker.dp_barker_epsilon`.
    """

    n: int
    batch_size: int
    count: int

    def __post_init__(self) -> None:
        n, b, k = int(self.n), int(self.batch_size), int(self.count)
        if not (11 <= b <= n) or k < 1:
            raise ValueError(
                f"DP Barker needs 11 <= batch_size <= n (Theorem 8: order 2 < b/5) and count "
                f">= 1; got n={self.n!r}, batch_size={self.batch_size!r}, count={self.count!r}"
            )
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "batch_size", b)
        object.__setattr__(self, "count", k)


@dataclass(frozen=True)
class DataSharingGaussianEvent:
    """``count`` releases of the data-sharing scheme with ``owners`` data owners.

    In every release each owner ``k`` adds its own ``N(0, s^2)`` noise, ``s =
    noise_multiplier * sensitivity``, to its own contribution (a clipped sum over its
    records, of L2 sensitivity ``sensitivity`` when one of its records is replaced), and only
    the noisy contribution leaves it (Yildirim & Ermis 2019, Sec. 3.2.2, Algorithm 2,
    eq. (6)).

    Parameters
    ----------
    noise_multiplier : float
        Each owner's noise standard deviation divided by the L2 sensitivity; finite and > 0.
    owners : int
        Number of data owners ``K`` (>= 1).
    count : int, default 1
        Number of releases; >= 0.

    Notes
    -----
    The view of an adversary who is the curator or another owner (even all other owners
    together: they can subtract their own contributions) contains owner ``k``'s noisy
    contribution and nothing else computed from owner ``k``'s records. The sensitivity of that
    contribution is the one of the central scheme, so each owner's privacy (neighbours:
    replace one record of that owner) is that of `GaussianEvent` with the same
    ``noise_multiplier`` and ``count`` (`owner_event`; the paper's remark after Algorithm 2:
    Theorem 1 applies to each owner). The cost: the sum of the ``K`` contributions carries
    noise of variance ``K s^2``, ``K`` times that of the central scheme
    (`noise_variance_factor`).

    References
    ----------
    .. [1] S. Yildirim, B. Ermis, "Exact MCMC with differentially private moves", Statistics
       and Computing 29(5), 2019, Sec. 3.2.2, Algorithm 2.
    """

    noise_multiplier: float
    owners: int
    count: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "noise_multiplier", check_positive(self.noise_multiplier, "noise_multiplier")
        )
        object.__setattr__(self, "owners", check_positive_int(self.owners, "owners"))
        object.__setattr__(self, "count", check_count(self.count, "count"))

    def owner_event(self) -> GaussianEvent:
        """What each owner's records are exposed to: a Gaussian event of the same noise."""
        return GaussianEvent(self.noise_multiplier, self.count)

    @property
    def mu(self) -> float:
        """Each owner's privacy-loss parameter ``count / (2 noise_multiplier**2)``."""
        return self.owner_event().mu

    @property
    def noise_variance_factor(self) -> int:
        """Variance of the total noise over that of the central scheme at the same noise: K."""
        return self.owners
