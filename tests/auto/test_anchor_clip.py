"""The one-shot strategy's last clip bound where its fresh histogram says nothing.

A histogram none of whose bins passes its threshold has, as its quantile, the public grid's
smallest bound: every record's gradient clipped to about 0 and the last two releases pure
noise. The warm start keeps its last bound there (`pymc_dp.kernels.warmstart.
EMPTY_HISTOGRAM_KEEPS_BOUND`, helper 230, sixteenth session); so does the anchor's bound
(`pymc_dp.auto.configure._anchor_clip_bound`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from pymc_dp.accounting import gaussian_mu_for_epsilon
from pymc_dp.auto import configure
from pymc_dp.kernels.warmstart import HISTOGRAM_SENSITIVITY, bonferroni_sds


class _Records:
    """Exact counts of ``n`` records whose whitened gradient norms are ``norms``."""

    def __init__(self, norms):
        self.norms = np.asarray(norms, dtype=float)
        self.n_records = self.norms.size

    def grad_norm_counts(self, q, grid, transform=None):
        return np.array([np.count_nonzero(self.norms > g) for g in grid])


class _Spend:
    def release(self, name):
        pass


def _bound(epsilon: float, norms, last_bound: float, seed: int) -> tuple[float, bool]:
    fns = _Records(norms)
    plan = SimpleNamespace(mu_total=gaussian_mu_for_epsilon(epsilon, 1e-6), phases=[])
    info = SimpleNamespace(clip_bounds=[0.5, last_bound])
    free = np.zeros(2, dtype=bool)
    rng = np.random.default_rng(seed)
    b = configure._anchor_clip_bound(plan, fns, np.zeros(2), None, info, free, rng, _Spend())
    # whether the released histogram was empty (its noise replayed with the same seed)
    z = plan.phases[0].noise_multiplier
    grid = configure.whitened_grid(fns.n_records, 2, configure.CLIP_GRID_BINS)
    noise = np.random.default_rng(seed).normal(size=grid.size + 1) * z * HISTOGRAM_SENSITIVITY
    counts = configure.histogram_from_counts(fns.n_records, fns.grad_norm_counts(None, grid))
    std = z * HISTOGRAM_SENSITIVITY
    empty = not np.any(counts + noise >= bonferroni_sds(grid.size + 1, 1e-3) * std)
    return b, empty


def test_an_empty_anchor_histogram_keeps_the_warm_starts_last_bound():
    """12 records at epsilon 0.5: the histogram's noise sd is many records, no bin passes;
    the bound is the warm start's last (0.8), not the grid's smallest (every record clipped)."""
    norms = np.full(12, 0.7)
    grid_min = float(configure.whitened_grid(12, 2, configure.CLIP_GRID_BINS)[0])
    for seed in range(5):
        b, empty = _bound(0.5, norms, 0.8, seed)
        assert empty
        assert b == 0.8 and b > 100 * grid_min


def test_a_histogram_with_records_in_it_is_read_as_before():
    """20 000 records at epsilon 10: bins pass, the quantile of the histogram is used (above
    the records' norm 0.7, not the warm start's 50)."""
    norms = np.full(20_000, 0.7)
    for seed in range(3):
        b, empty = _bound(10.0, norms, 50.0, seed)
        assert not empty
        assert 0.7 <= b < 5.0
