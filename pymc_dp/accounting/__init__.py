"""Privacy accounting for pymc_dp (pure numpy/scipy; never imports pymc or pytensor).

Tight accounting for compositions of Gaussian mechanisms (Sommer et al. 2019; Räisä et
al., Theorem 2.4), the optimal homogeneous composition of (epsilon, delta)-DP mechanisms
(Kairouz, Oh & Viswanath 2017, Theorem 3.3), a ledger composing both, noise calibration
(including the analytic Gaussian mechanism of Balle & Wang 2018) and, for comparison, the
looser zCDP and RDP conversions. Subsampled Gaussian mechanisms (minibatch samplers) are
accounted with Google's dp-accounting (imported lazily, `.subsampled`).

Every number here refers to the neighbouring relation under which the sensitivities of
the events were computed: for replace-one ("substitute") neighbours a per-record value
clipped to norm ``b`` has sensitivity ``2 b``; for add/remove neighbours ``b``.

References
----------
.. [1] D. M. Sommer, S. Meiser, E. Mohammadi, "Privacy loss classes: the central limit
   theorem in differential privacy", PoPETs 2019(2).
.. [2] O. Räisä, A. Koskela, A. Honkela, "Differentially private Hamiltonian Monte
   Carlo", Theorem 2.4.
.. [3] P. Kairouz, S. Oh, P. Viswanath, "The composition theorem for differential
   privacy", IEEE Trans. Inf. Theory 63(6), 2017, Theorem 3.3.
.. [4] B. Balle, Y.-X. Wang, "Improving the Gaussian mechanism for differential privacy:
   analytical calibration and optimal denoising", ICML 2018.
.. [5] C. L. Canonne, G. Kamath, T. Steinke, "The discrete Gaussian for differential
   privacy", NeurIPS 2020.
"""

from . import events
from .approx import compose_approx_dp
from .barker import dp_barker_epsilon
from .events import *  # noqa: F403 (the privacy events)
from .gaussian import (
    analytic_gaussian_sigma,
    calibrate_noise_multiplier,
    gaussian_delta,
    gaussian_epsilon,
    gaussian_mu_for_epsilon,
    rdp_epsilon,
    zcdp_epsilon,
)
from .ledger import PrivacyLedger
from .registry import compose_epsilon, register
from .subsampled import (
    calibrate_poisson_subsampled_noise,
    calibrate_wor_subsampled_noise,
    poisson_subsampled_gaussian_epsilon,
    wor_subsampled_gaussian_epsilon,
)

__all__ = [
    *events.__all__,
    "PrivacyLedger",
    "analytic_gaussian_sigma",
    "calibrate_noise_multiplier",
    "calibrate_poisson_subsampled_noise",
    "calibrate_wor_subsampled_noise",
    "compose_approx_dp",
    "compose_epsilon",
    "dp_barker_epsilon",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu_for_epsilon",
    "poisson_subsampled_gaussian_epsilon",
    "rdp_epsilon",
    "register",
    "wor_subsampled_gaussian_epsilon",
    "zcdp_epsilon",
]
