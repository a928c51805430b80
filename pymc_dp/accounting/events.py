"""Privacy events: the mechanisms a `PrivacyLedger` composes.

Two kinds of event are supported:

* `GaussianEvent` -- ``count`` releases of a Gaussian mechanism whose noise
  standard deviation is ``noise_multiplier`` times the L2 sensitivity of the released
  quantity. Gaussian events compose exactly through their privacy-loss parameter
  `GaussianEvent.mu`.
* `ApproxDPEvent` -- ``count`` releases of a generic mechanism that is only known
  to be (epsilon, delta)-DP. These compose by the optimal homogeneous composition theorem
  of Kairouz, Oh and Viswanath.

The events say nothing about the neighbouring relation: the sensitivity the noise
multiplier refers to must be computed for the relation the caller reports (for
replace-one neighbours a per-record value clipped to norm ``b`` has sensitivity ``2 b``,
for add/remove neighbours ``b``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validation import check_count, check_mechanism_delta, check_nonnegative, check_positive

__all__ = ["ApproxDPEvent", "GaussianEvent"]


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
