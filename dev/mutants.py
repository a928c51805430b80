"""Mutation check of the kernels: do the tests catch a wrong kernel?

Each mutant is one small edit of the package that breaks exactness or privacy (drop the
penalty correction, drop the log-Jacobian, flip the kinetic-energy sign, halve a noise std,
skip a clip). For each, the script copies the working tree to a temporary directory,
applies the edit (the original text must occur exactly once), runs the tests named for it,
and reports the mutant as *killed* (some test failed) or *survived* (all passed).

Rule: every new release (a Gaussian mechanism anywhere in the package, its noise, its
sensitivity, its accounting) comes with a mutant here that mis-scales or drops it, and with a
test, in the mutant's ``tests``, that kills it: a test that measures the noise actually added
at the call site the library uses (released minus exact, standardised by multiplier x
sensitivity), and the report's epsilon against an independent composition of every release
(`tests/privacy/test_release_noise.py`). A release no mutant covers is untested.

Run on demand, not in CI (it takes several minutes)::

    bash dev/mutants.sh            # or: .venv-python3/bin/python dev/mutants.py [names...]

Exit status 1 when a mutant survives (or an edit no longer applies).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    original: str
    mutated: str
    tests: tuple[str, ...]


NOISE = "tests/privacy/test_release_noise.py"
DPHMC_NOISE = f"{NOISE}::test_dphmc_gradients_and_penalty_tests_carry_their_noise"
FASTMH_NOISE = f"{NOISE}::test_fastmh_releases_carry_noise_z_times_their_sensitivity"
SUBSAMPLED_NOISE = f"{NOISE}::test_subsampled_penalty_tests_carry_noise_z_c"
AUTO_EPSILON = f"{NOISE}::test_automatic_run_epsilon_is_the_composition_of_the_noise_it_added"

MUTANTS = (
    Mutant(
        "drop the penalty correction",
        "pymc_dp/kernels/penalty.py",
        "log_prior_ratio + log_proposal_ratio - 0.5 * sigma * sigma",
        "log_prior_ratio + log_proposal_ratio",
        (
            "tests/kernels/test_penalty_power.py::test_penalty_acceptance_matches_closed_form",
            "tests/kernels/test_penalty_power.py::test_penalty_metropolis_exact_at_large_noise",
        ),
    ),
    Mutant(
        "drop the penalty correction (subsampled penalty)",
        "pymc_dp/kernels/subsampled_penalty.py",
        "xi + log_prior_ratio - 0.5 * sigma * sigma",
        "xi + log_prior_ratio",
        (
            "tests/kernels/test_penalty_power.py::test_subsampled_penalty_full_batch_exact_at_large_noise",
        ),
    ),
    Mutant(
        "drop the penalty correction (DP-Fast MH)",
        "pymc_dp/kernels/fastmh.py",
        "log_a = ell + xi - 0.5 * sigma * sigma + log_prior_ratio",
        "log_a = ell + xi + log_prior_ratio",
        ("tests/step_methods/test_fastmh.py",),
    ),
    Mutant(
        "drop the variance correction (exponential-family penalty)",
        "pymc_dp/kernels/expfam.py",
        "- (0.5 * var if variance_correction else 0.0)",
        "- 0.0",
        (
            "tests/step_methods/test_expfam.py::test_linear_regression_unknown_sigma_is_exact_with_noise",
        ),
    ),
    Mutant(
        "drop the log-Jacobian",
        "pymc_dp/records/graphs.py",
        "prior = model.logp(vars=prior_terms, jacobian=True)",
        "prior = model.logp(vars=prior_terms, jacobian=False)",
        ("tests/records/test_build.py::test_prior_includes_log_jacobian",),
    ),
    Mutant(
        "flip the kinetic-energy sign",
        "pymc_dp/kernels/hmc.py",
        "d_kinetic = kinetic_energy(p, inv_mass) - kinetic_energy(p1, inv_mass)",
        "d_kinetic = kinetic_energy(p1, inv_mass) - kinetic_energy(p, inv_mass)",
        (
            "tests/step_methods/test_hmc.py::test_exact_normal_mean_1d",
            "tests/kernels/test_penalty_power.py::test_dphmc_exact_at_large_noise",
        ),
    ),
    Mutant(
        "halve the penalty noise std",
        "pymc_dp/kernels/penalty.py",
        "return noise_multiplier * 2.0 * clip_bound * step_norm",
        "return 0.5 * noise_multiplier * 2.0 * clip_bound * step_norm",
        (
            "tests/kernels/test_penalty_power.py::test_penalty_noise_std_is_z_times_the_sensitivity",
            f"{NOISE}::test_penalty_tests_carry_noise_z_2b_step",
        ),
    ),
    Mutant(
        "halve the gradient noise std",
        "pymc_dp/kernels/hmc.py",
        "return noise_multiplier * 2.0 * clip_bound",
        "return 0.5 * noise_multiplier * 2.0 * clip_bound",
        ("tests/step_methods/test_hmc.py", DPHMC_NOISE),
    ),
    Mutant(
        "skip the log-likelihood-ratio clip",
        "pymc_dp/records/routes.py",
        "llr_sum = pt.sum(pt.switch(nan, 0.0, pt.clip(r, -bound, bound)))",
        "llr_sum = pt.sum(pt.switch(nan, 0.0, r))",
        ("tests/records/test_build.py::test_clipped_sums_and_chunking",),
    ),
    Mutant(
        "skip the gradient clip",
        "pymc_dp/records/clipping.py",
        "inv_norm = pt.minimum(1.0, bound / pt.sqrt(pt.maximum(sq_norms, 1e-300)))",
        "inv_norm = pt.ones_like(sq_norms)",
        (
            "tests/records/test_build.py::test_clipped_sums_and_chunking",
            "tests/records/test_indexed_routes.py",
        ),
    ),
    # -- issue 31: the releases of the automatic mode and the exponential-family statistic --
    Mutant(
        "histogram noise without its sqrt(2) sensitivity",
        "pymc_dp/kernels/warmstart.py",
        "noisy = hist + rng.normal(size=hist.shape) * noise_multiplier * HISTOGRAM_SENSITIVITY",
        "noisy = hist + rng.normal(size=hist.shape) * noise_multiplier",
        (f"{NOISE}::test_warm_start_histograms_carry_noise_z_sqrt2", AUTO_EPSILON),
    ),
    Mutant(
        "halve the warm start's gradient noise (Newton)",
        "pymc_dp/kernels/warmstart.py",
        "s1, _ = clipped_moments(q, b, b_outer, m)\n"
        "            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * grad_noise_multiplier"
        " * 2.0 * b",
        "s1, _ = clipped_moments(q, b, b_outer, m)\n"
        "            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * grad_noise_multiplier"
        " * b",
        (f"{NOISE}::test_newton_gradient_sums_carry_noise_z_2b",),
    ),
    Mutant(
        "halve the warm start's gradient noise (uncentred)",
        "pymc_dp/kernels/warmstart.py",
        "s1, s2 = clipped_moments(q, b, b_outer, m)\n"
        "            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * grad_noise_multiplier"
        " * 2.0 * b",
        "s1, s2 = clipped_moments(q, b, b_outer, m)\n"
        "            s1 = np.asarray(s1, dtype=float) + rng.normal(size=d) * grad_noise_multiplier"
        " * b",
        (f"{NOISE}::test_uncentred_gradient_sums_carry_noise_z_2b",),
    ),
    Mutant(
        "outer-product noise scaled by b' for b'^2",
        "pymc_dp/kernels/warmstart.py",
        "outer_std = outer_noise_multiplier * OUTER_SENSITIVITY * b_outer * b_outer",
        "outer_std = outer_noise_multiplier * OUTER_SENSITIVITY * b_outer",
        (f"{NOISE}::test_outer_product_sums_carry_noise_z_sqrt2_b_outer_squared",),
    ),
    Mutant(
        "Bonferroni threshold replaced by 3 sds",
        "pymc_dp/kernels/warmstart.py",
        "sds = statistics.NormalDist().inv_cdf(1.0 - 1e-3 / len(noisy_hist))",
        "sds = 3.0",
        (f"{NOISE}::test_anchor_bound_lets_an_empty_bin_through_at_most_at_bonferronis_rate",),
    ),
    Mutant(
        "clip selection left out of dp_presample_mu",
        "pymc_dp/auto/configure.py",
        "pre = [p for p in self.phases if p.name != SAMPLING_PHASE]\n        out = {",
        "pre = [p for p in self.phases if p.name != SAMPLING_PHASE"
        ' and not p.name.startswith("clip selection")]\n        out = {',
        (AUTO_EPSILON,),
    ),
    Mutant(
        "halve the clip selection's noise multiplier",
        "pymc_dp/auto/configure.py",
        "noisy_histogram_quantile(hist / llr_pairs, grid, clip_quantile, z_clip, rng)",
        "noisy_histogram_quantile(hist / llr_pairs, grid, clip_quantile, z_clip / 2, rng)",
        (AUTO_EPSILON,),
    ),
    Mutant(
        "halve the control variate's noise",
        "pymc_dp/auto/configure.py",
        "rng.normal(size=d) * z_anchor * 2.0 * info.anchor_bound",
        "rng.normal(size=d) * z_anchor * info.anchor_bound",
        (AUTO_EPSILON,),
    ),
    Mutant(
        "halve the one-shot gradient release's noise",
        "pymc_dp/auto/oneshot.py",
        "rng.normal(size=shape) * noise_multiplier * 2.0 * bound",
        "rng.normal(size=shape) * noise_multiplier * bound",
        (
            "tests/auto/test_oneshot.py::test_release_adds_noise_of_z_times_2b",
            "tests/test_audit.py::test_audit_scenario[auto: one-shot gradient sum: as shipped]",
        ),
    ),
    Mutant(
        "one-shot: its two last releases not in the budget",
        "pymc_dp/auto/configure.py",
        "plan.phases.append(Phase(ONESHOT_PHASE, z, 2))",
        "plan.phases.append(Phase(ONESHOT_PHASE, z, 0))",
        ("tests/auto/test_oneshot.py::test_one_shot_spends_exactly_the_budget",),
    ),
    Mutant(
        "one-shot: the release noise left out of the covariance",
        "pymc_dp/auto/oneshot.py",
        "cov = second.cov_c + noise + doubt.T @ doubt",
        "cov = second.cov_c + doubt.T @ doubt",
        (
            "tests/auto/test_oneshot.py::test_noise_aware_laplace_is_exact_for_a_quadratic_log_likelihood",
        ),
    ),
    Mutant(
        "halve the exponential-family statistic's noise",
        "pymc_dp/kernels/expfam.py",
        "return float(noise_multiplier) * 2.0 * float(stat_clip_bound)",
        "return float(noise_multiplier) * float(stat_clip_bound)",
        (f"{NOISE}::test_exponential_family_statistic_carries_noise_z_2c",),
    ),
    Mutant(
        "halve the exponential-family release, not its correction",
        "pymc_dp/kernels/expfam.py",
        "noisy = np.asarray(stat_sum, dtype=float) + stat_noise_std * rng.normal(size=shape)",
        "noisy = np.asarray(stat_sum, dtype=float) + 0.5 * stat_noise_std * rng.normal(size=shape)",
        (f"{NOISE}::test_exponential_family_statistic_carries_noise_z_2c",),
    ),
    Mutant(
        "drop the independence proposal's Hastings term",
        "pymc_dp/step_methods/penalty.py",
        "w1 = np.linalg.solve(self._chol, q1 - self.proposal_mean) / self.scaling\n"
        "        return float(0.5 * (w1 @ w1 - w0 @ w0))",
        "w1 = np.linalg.solve(self._chol, q1 - self.proposal_mean) / self.scaling\n"
        "        return 0.0",
        (
            "tests/step_methods/test_penalty.py"
            "::test_independence_proposal_passes_its_hastings_term_to_the_test",
        ),
    ),
    Mutant(
        "halve the penalty test's noise in the kernel",
        "pymc_dp/kernels/penalty.py",
        "xi = rng.normal(size=shape) * sigma if shape else rng.normal() * sigma",
        "xi = rng.normal(size=shape) * sigma if shape else 0.5 * rng.normal() * sigma",
        (f"{NOISE}::test_penalty_tests_carry_noise_z_2b_step",),
    ),
    Mutant(
        "halve DP-HMC's leapfrog gradient noise",
        "pymc_dp/kernels/hmc.py",
        "g = g + noise_std * rng.standard_normal(d)",
        "g = g + 0.5 * noise_std * rng.standard_normal(d)",
        (DPHMC_NOISE,),
    ),
    Mutant(
        "halve DP-HMC's ratio noise",
        "pymc_dp/kernels/hmc.py",
        "sigma_l = penalty_noise_std(llr_noise_multiplier, llr_clip_bound, norm)",
        "sigma_l = penalty_noise_std(0.5 * llr_noise_multiplier, llr_clip_bound, norm)",
        (DPHMC_NOISE,),
    ),
    Mutant(
        "halve DPFastMH's minibatch noise",
        "pymc_dp/kernels/fastmh.py",
        "sigma = 0.0 if noise_free else s.z_minibatch * sens",
        "sigma = 0.0 if noise_free else 0.5 * s.z_minibatch * sens",
        (FASTMH_NOISE,),
    ),
    Mutant(
        "halve DPFastMH's full-batch noise",
        "pymc_dp/kernels/fastmh.py",
        "sigma = 0.0 if noise_free else s.z_fullbatch * sens",
        "sigma = 0.0 if noise_free else 0.5 * s.z_fullbatch * sens",
        (FASTMH_NOISE,),
    ),
    Mutant(
        "DPBarker's noise not topped up to variance 2",
        "pymc_dp/kernels/barker.py",
        "np.sqrt(np.maximum(BARKER_NOISE_VARIANCE - var, 0.0))",
        "np.sqrt(BARKER_NOISE_VARIANCE)",
        (f"{NOISE}::test_dpbarker_noise_tops_the_batch_variance_up_to_two",),
    ),
    Mutant(
        "halve DPSGLD's gradient noise",
        "pymc_dp/kernels/sgmcmc.py",
        "noise = rng.normal(size=clipped_sum.shape) * noise_std if noise_std > 0 else 0.0",
        "noise = rng.normal(size=clipped_sum.shape) * 0.5 * noise_std if noise_std > 0 else 0.0",
        (f"{NOISE}::test_dpsgld_gradient_releases_carry_noise_z_c",),
    ),
    Mutant(
        "halve the subsampled penalty test's noise",
        "pymc_dp/kernels/subsampled_penalty.py",
        "xi = rng.normal(size=lam.shape) * sigma",
        "xi = rng.normal(size=lam.shape) * 0.5 * sigma",
        (SUBSAMPLED_NOISE,),
    ),
    Mutant(
        "drop the variance term of the subsampled sensitivity",
        "pymc_dp/kernels/subsampled_penalty.py",
        "return d_lam + d_sig",
        "return d_lam",
        (SUBSAMPLED_NOISE,),
    ),
)


def _copy_tree(dest: Path) -> None:
    ignore = shutil.ignore_patterns(".git", ".venv*", "site", "__pycache__", "*.egg-info")
    shutil.copytree(ROOT, dest, ignore=ignore, dirs_exist_ok=True)


def run(mutant: Mutant | None, tests: tuple[str, ...] = ()) -> tuple[str, float, str]:
    """Apply ``mutant`` in a copy of the tree, run its tests; ('killed' | 'survived' | error).

    With ``mutant=None`` (the control) the unmutated copy runs ``tests``: they must pass, or
    a "kill" would mean nothing.
    """
    with tempfile.TemporaryDirectory(prefix="pymc_dp_mutant_") as tmp:
        tree = Path(tmp)
        _copy_tree(tree)
        if mutant is not None:
            tests = mutant.tests
            target = tree / mutant.path
            text = target.read_text()
            hits = text.count(mutant.original)
            if hits != 1:
                return f"NOT APPLIED (original text found {hits} times)", 0.0, ""
            target.write_text(text.replace(mutant.original, mutant.mutated))
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
            cwd=tree,
            env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        elapsed = time.perf_counter() - start
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        if proc.returncode == 1:
            return "killed", elapsed, last
        if proc.returncode == 0:
            return "SURVIVED", elapsed, last
        return f"ERROR (pytest exit {proc.returncode})", elapsed, last


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTANTS if not argv or any(a in m.name for a in argv)]
    bad = 0
    print(f"{'mutant':<50} {'result':<10} {'seconds':>8}  tests' last line")
    every_test = tuple(dict.fromkeys(t for m in chosen for t in m.tests))
    result, seconds, last = run(None, every_test)
    shown = "passed" if result == "SURVIVED" else result
    print(f"{'(control: no mutation, all these tests)':<50} {shown:<10} {seconds:8.1f}  {last}")
    if result != "SURVIVED":  # the unmutated tree must pass every test used below
        print("the control failed: fix the tests before reading the mutants")
        return 1
    for m in chosen:
        result, seconds, last = run(m)
        bad += result != "killed"
        print(f"{m.name:<50} {result:<10} {seconds:8.1f}  {last}", flush=True)
    print(f"{len(chosen) - bad} of {len(chosen)} mutants killed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
