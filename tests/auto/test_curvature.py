"""The one-shot strategy's curvature (issue 26): the warm start's last released curvatures
averaged (`pymc_dp.auto.curvature`), their noise against Monte Carlo."""

from __future__ import annotations

import numpy as np

from pymc_dp.auto.curvature import averaged_curvature, hub_rows, transformed_entry_var
from pymc_dp.kernels.warmstart import LaplaceInfo, _Curvature, _sym_noise


def test_transformed_entry_var_matches_monte_carlo():
    """The per-entry variance of ``T E T^T`` (``E`` the warm start's symmetric release noise,
    unit sd) against 20 000 draws; each entry is Gaussian, so its sample variance has a
    relative sd of ``sqrt(2 / k)``: 5 of those per entry."""
    rng = np.random.default_rng(3)
    d = 4
    t = np.eye(d) + 0.4 * rng.normal(size=(d, d))
    k = 20_000
    draws = np.array([t @ _sym_noise(d, 1.0, rng) @ t.T for _ in range(k)])
    got = draws.var(axis=0)
    want = transformed_entry_var(t)
    assert np.all(np.abs(got - want) < 5.0 * want * np.sqrt(2.0 / k)), (got - want) / want
    # the identity leaves the noise as it is
    assert np.allclose(transformed_entry_var(np.eye(d)), 1.0)


def _releases(rng, f_y, bases, stds, p_hess, data, centred=None):
    """A LaplaceInfo whose curvatures are releases of the same ``f_y`` (coordinates ``y``)
    in the whitened coordinates ``bases[k]``, noise sd ``stds[k]``."""
    d = f_y.shape[0]
    info = LaplaceInfo(mean=np.zeros(d), cov=np.eye(d))
    centred = [True] * len(bases) if centred is None else centred
    for k, (b, s, c) in enumerate(zip(bases, stds, centred, strict=True)):
        b_inv = np.linalg.inv(b)
        s2 = b_inv @ f_y @ b_inv.T + _sym_noise(d, s, rng)
        curv = _Curvature(s2, s, data, b, p_hess)
        info.curvatures.append((np.full(d, float(k)), curv, c))
        info.precision, info.cov, info.damping = curv.prec, curv.cov, curv.damping
        info.curvature_entry_std, info.curvature_basis = curv.entry_std, curv.basis
    return info


def test_averaged_curvature_has_the_noise_of_all_the_releases():
    """Four releases of one curvature in four whitenings (noise sds 0.05-0.08): the
    averaged curvature's error, in the last whitening, has the inverse-variance combination's
    variance entry by entry (`transformed_entry_var`), not the last release's (1 000
    replicates; the sample variance's relative sd ``sqrt(2 / k)``, 5 of those), and is
    centred on the truth (5 Monte Carlo sds). The likelihood-free coordinate is untouched."""
    rng = np.random.default_rng(5)
    d = 4
    data = np.array([True, True, True, False])
    # a curvature whose off-diagonal entries are far past the threshold (about 3 noise sds)
    f = np.zeros((d, d))
    f[:3, :3] = [[4.0, 1.5, -1.0], [1.5, 3.0, 1.2], [-1.0, 1.2, 2.5]]
    p_hess = 0.01 * np.eye(d)
    last = np.eye(d)
    last[:3, :3] += 0.05 * np.tril(rng.normal(size=(3, 3)))
    bases = []
    for _ in range(3):
        b = last.copy()
        b[:3, :3] = b[:3, :3] @ (np.eye(3) + 0.1 * np.triu(rng.normal(size=(3, 3))))
        bases.append(b)
    bases.append(last)
    stds = np.array([0.08, 0.07, 0.06, 0.05])
    # predicted variance of the average, entry by entry, in the last whitening
    b_inv = np.linalg.inv(last)
    prec_sum = sum(
        1.0 / (s**2 * transformed_entry_var((b_inv @ b)[:3, :3]))
        for b, s in zip(bases, stds, strict=True)
    )
    want = 1.0 / prec_sum
    k = 1_000
    errs, singles = [], []
    for _ in range(k):
        info = _releases(rng, f, bases, stds, p_hess, data)
        singles.append(b_inv @ (info.precision - p_hess) @ b_inv.T - b_inv @ f @ b_inv.T)
        assert averaged_curvature(info, 4) == 4
        errs.append(b_inv @ (info.precision - p_hess) @ b_inv.T - b_inv @ f @ b_inv.T)
    errs, singles = np.array(errs)[:, :3, :3], np.array(singles)[:, :3, :3]
    got = errs.var(axis=0)
    assert np.all(np.abs(got - want) < 5.0 * want * np.sqrt(2.0 / k)), (got - want) / want
    assert np.all(np.abs(errs.mean(axis=0)) < 5.0 * np.sqrt(want / k))
    # the last release alone is noisier: its variance is stds[-1] ** 2 in every entry
    assert np.all(singles.var(axis=0) > 1.5 * want)
    assert np.allclose(info.precision[3], p_hess[3])
    assert np.allclose(info.precision[:, 3], p_hess[3])


def test_averaged_curvature_counts_a_reused_release_once():
    """Where the warm start went back from a rejected Newton step it reused that iterate's
    release (the same iterate twice in a row): it is one release, averaged once; with a
    single release, nothing changes."""
    rng = np.random.default_rng(7)
    d = 2
    data = np.ones(d, dtype=bool)
    f = np.array([[2.0, 0.5], [0.5, 1.0]])
    bases = [np.eye(d)] * 4
    info = _releases(rng, f, bases, [0.05] * 4, np.eye(d) * 0.01, data)
    q, curv, _ = info.curvatures[2]
    info.curvatures[3] = (q, curv.uncentred(np.zeros(d), 100), False)
    assert averaged_curvature(info, 4) == 3
    info = _releases(rng, f, bases[:1], [0.05], np.eye(d) * 0.01, data)
    before = info.precision.copy()
    assert averaged_curvature(info, 4) == 1
    assert np.array_equal(info.precision, before)


def test_hub_rows_under_noise_alone_pass_at_most_the_family_wise_rate():
    """Pure noise (symmetric, unit sds, 11 rows): a hub is found in at most 1 % of the
    releases (2 000 replicates; binomial tolerance, 5 sds)."""
    rng = np.random.default_rng(13)
    k, reps = 11, 2_000
    found = sum(bool(hub_rows(_sym_noise(k, 1.0, rng)).any()) for _ in range(reps))
    assert found <= reps * 0.01 + 5.0 * np.sqrt(reps * 0.01 * 0.99), found


def test_hub_rows_find_a_row_of_small_shared_entries_and_not_its_partners():
    """A slope against ten group intercepts: row 0's entries 3 noise sds each, every other
    off-diagonal entry noise. Row 0 is found in every replicate (500); another row in at
    most 2 % (its one entry against row 0 leaves its statistic with row 0)."""
    rng = np.random.default_rng(17)
    k, reps = 11, 500
    mean = np.zeros((k, k))
    mean[0, 1:] = mean[1:, 0] = 3.0
    others = 0
    for _ in range(reps):
        hub = hub_rows(mean + _sym_noise(k, 1.0, rng))
        assert hub[0]
        others += bool(hub[1:].any())
    assert others <= 0.02 * reps, others


def test_averaged_curvature_keeps_a_hub_row_the_entry_threshold_drops():
    """Two releases (noise sds 0.07, the average's 0.05) of a whitened curvature ``I`` plus
    a hub row of 0.15 (below the entry threshold, about 3.8 sds, 0.19): with the hub test
    the averaged curvature keeps row 0 and its error there is the noise's (RMS within 5
    Monte Carlo sds of 0.05, 300 replicates), without it the row is mostly zeroed (noise
    lifts some entries past the threshold)."""
    rng = np.random.default_rng(19)
    d = 11
    data = np.ones(d, dtype=bool)
    f = np.eye(d)
    f[0, 1:] = f[1:, 0] = 0.15
    f[0, 0] = 2.0
    p_hess = 1e-3 * np.eye(d)
    errs = {True: [], False: []}
    for _ in range(300):
        for hubs in (True, False):
            info = _releases(rng, f, [np.eye(d)] * 2, [0.07, 0.07], p_hess, data)
            averaged_curvature(info, 4, hubs=hubs)
            errs[hubs].append((info.precision - p_hess - f)[0, 1:])
    with_hubs, without = np.array(errs[True]), np.array(errs[False])
    rms = float(np.sqrt(np.mean(with_hubs**2)))
    want = 0.07 / np.sqrt(2.0)
    assert abs(rms - want) < 5.0 * want / np.sqrt(2.0 * with_hubs.size), rms
    # most of the row zeroed: its error is the entries themselves
    assert np.mean(without == -0.15) > 0.5
    assert float(np.sqrt(np.mean(without**2))) > 2.0 * want


def test_the_one_shot_strategy_steps_with_the_averaged_curvature():
    """``auto_configure`` with the one-shot strategy averages the warm start's last four
    curvatures (post-processing: the one-shot phases are its clip histogram, its tail's
    excess and its two gradient releases, nothing added)."""
    import pymc as pm

    from pymc_dp.auto import auto_configure

    x = np.random.default_rng(0).normal(1.0, 1.0, 500)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("x", mu, 1.0, observed=x)
    cfg = auto_configure(
        model, epsilon=2.0, delta=1e-5, chains=2, draws=None, tune=None,
        rng=np.random.default_rng(0), method="laplace",
    )  # fmt: skip
    assert cfg.method == "laplace"
    assert cfg.curvature_releases == 4
    assert [p.name.split(":")[0] for p in cfg.phases].count("one-shot") == 3
