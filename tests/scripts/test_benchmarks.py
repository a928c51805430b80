"""The benchmark scripts run end to end at a tiny size, so they cannot rot.

Nothing here checks a time (timings are the scripts' output, not tests): each script runs as
a user runs it (a fresh ``python benchmarks/<script>.py`` process, one BLAS thread) and must
exit 0 and print every row of its table with finite, positive measurements.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
STEPS = ("DPHMC", "DPPenaltyMetropolis", "DPFastMH")


def _run(script: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=BENCH,
        timeout=600,
    )
    assert proc.returncode == 0, f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _rows(out: str, first_word: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line.split()[:1] == [first_word]]


def _ratio_of_printed(
    num: float, den: float, ratio: float, *, time_decimals: int = 4, ratio_sig: int | None = None
) -> bool:
    """Whether a printed ``ratio`` is ``num / den`` of two times printed with
    ``time_decimals`` decimals: within the interval their rounding allows (tiny runs print
    times like 0.0003 ms, whose rounding alone moves the quotient by 15 %), widened by the
    ratio's own rounding (2 decimals, or ``ratio_sig`` significant digits)."""
    h = 0.5 * 10.0**-time_decimals
    lo = max(num - h, 0.0) / (den + h)
    hi = (num + h) / max(den - h, 1e-12)
    if ratio_sig is None:
        slack = 0.005
    else:
        slack = 0.5 * 10.0 ** (math.floor(math.log10(abs(ratio))) - ratio_sig + 1)
    return lo - slack - 1e-12 <= ratio <= hi + slack + 1e-12


def _positive(text: str) -> float:
    value = float(text.replace(",", ""))
    assert math.isfinite(value) and value > 0, text
    return value


@pytest.mark.slow
def test_bench_vs_pymc_tiny():
    out = _run("bench_vs_pymc.py", "--n", "500", "--blocks", "1", "--block-seconds", "0.02")
    for model in ("logistic", "banana"):
        for step in STEPS:
            row = next(r for r in _rows(out, step) if model in r)
            # DP ms/iter, PyMC ms/iter and their ratio follow the "|" after n and d
            bar = row.index("|")
            dp, ref, ratio = (_positive(x) for x in row[bar + 1 : bar + 4])
            # ms/iter printed with 3 decimals (0.050 ms rounds by 1 %), the ratio with 3
            # significant digits
            assert _ratio_of_printed(dp, ref, ratio, time_decimals=3, ratio_sig=3), row
    assert "route GLM fast" in out and "route blocks" in out


@pytest.mark.slow
def test_bench_scaling_tiny():
    out = _run(
        "bench_scaling.py",
        *("--sizes", "300", "600", "--dims", "2", "3", "--n-for-dims", "300"),
        *("--blocks", "1", "--block-seconds", "0.02"),
    )
    assert "-- vs n (d = 10) --" in out and "-- vs d (n = 300) --" in out
    for step in STEPS:
        assert len(_rows(out, step)) == 4, out  # 2 sizes + 2 dims


@pytest.mark.slow
def test_bench_memory_tiny():
    out = _run("bench_memory.py", "--quick", "--n", "2000", "--model", "banana")
    rows = [r for s in STEPS + ("pm.HamiltonianMC", "pm.Metropolis") for r in _rows(out, s)]
    assert len(rows) == 7, out  # DPHMC, DPPenaltyMetropolis chunked and not, DPFastMH, PyMC's 2
    for r in rows:
        assert float(r[r.index("|") + 1]) >= 0  # iteration peak MB (0.0 at this size is fine)
        _positive(r[-2])  # ms/iter


@pytest.mark.slow
def test_bench_construct_tiny():
    out = _run("bench_construct.py", "--quick", "--n", "500", "--models", "banana")
    for step in STEPS:
        (row,) = _rows(out, step)
        # construct and first-iteration seconds of both sides and the two ratios (compile
        # times can round to 0.00 with a warm cache, so no positivity check)
        assert len(re.findall(r"\d+\.\d+", " ".join(row))) == 6, row


@pytest.mark.slow
def test_bench_fastmh_tiny():
    out = _run("bench_fastmh.py", "--quick", "--sizes", "2000")
    (row,) = [line for line in out.splitlines() if line.strip().startswith("2000 |")]
    speedup = re.search(r"\|\s*([\d.]+)x\s*\|", row)
    assert speedup is not None, row
    _positive(speedup.group(1))


@pytest.mark.slow
def test_bench_expfam_tiny():
    out = _run(
        "bench_expfam.py",
        *("--sizes", "300", "600", "--acc-n", "300", "--acc-draws", "60"),
        *("--iters", "20", "--blocks", "1"),
    )
    sizes = [r for r in (line.split() for line in out.splitlines()) if r[:1] in (["300"], ["600"])]
    assert len(sizes) == 2, out
    for r in sizes:
        _positive(r[2])  # ms/iter
        _positive(r[3])  # ratio to the first size
    for step in ("DPExpFamilyPenalty", "DPPenaltyMetropolis"):
        (row,) = [r for r in _rows(out, "summary") if r[1] == step]
        assert "epsilon" in row


def test_bench_models_tiny():
    models = ("hier50", "poisson", "banana")
    out = _run(
        "bench_models.py",
        *("--n", "400", "--blocks", "1", "--block-seconds", "0.01", "--models", *models),
    )
    for model in models:
        rows = [r for r in out.splitlines() if f" {model} " in r and "|" in r]
        # three functions vs numpy, the fused pass vs the two passes, DPHMC,
        # DPPenaltyMetropolis
        assert len(rows) == 6, out
        for r in rows:
            # package ms, reference ms and their ratio follow the second "|"
            pkg, ref, ratio = (_positive(x) for x in r.split("|")[1].split()[-3:])
            assert _ratio_of_printed(pkg, ref, ratio), r
        assert all("agree True" in r for r in rows if r.startswith("function"))
    assert "route sorted" in out and "route indexed" in out and "route blocks" in out


def test_bench_models_kept_value_rows_tiny():
    """--l-plus-1, --two-point-ratio and --unfused add DPHMC rows (nothing kept; the last
    gradient and the ratio in two passes), timed alongside."""
    out = _run(
        "bench_models.py",
        *("--n", "400", "--blocks", "1", "--block-seconds", "0.01", "--models", "hier50"),
        *("--steps", "DPHMC", "--l-plus-1", "--two-point-ratio", "--unfused"),
    )
    rows = [r for r in out.splitlines() if r.startswith("DPHMC ")]
    assert len(rows) == 4, out
    assert "every sum computed" in rows[0] and "log-likelihoods at both points" in rows[1]
    assert "last gradient and ratio in two passes" in rows[2]
    # a normal likelihood: the log-likelihoods are not kept by default (arithmetic only),
    # and the sorted route does not fuse the ratio pass
    assert rows[3].endswith("sum at the current point kept"), rows[3]
    for r in rows:
        pkg, ref, ratio = (_positive(x) for x in r.split("|")[1].split()[-3:])
        assert _ratio_of_printed(pkg, ref, ratio), r


def test_bench_models_floor_tiny():
    pytest.importorskip("numba", reason="the floor's loops are Numba")
    out = _run(
        "bench_models.py",
        *("--floor", "--n", "400", "--blocks", "1", "--block-seconds", "0.01"),
        *("--models", "hier50", "slopes", "banana"),
    )
    rows = [r for r in out.splitlines() if r.startswith("floor")]
    # models x (pymc_dp, Numba clipped, Numba unclipped), plus the strips for hier50 and
    # the float32-weight loop for the banana
    assert len(rows) == 3 * 3 + 2, out
    assert sum("clipped, strips" in r for r in rows) == 1 and "hier50" in rows[3], out
    f32 = [r for r in rows if "float32 weight" in r]
    assert len(f32) == 1 and "banana" in f32[0] and "packed float32 sqrt" in f32[0], out
    for r in rows:
        ms, ref, ratio = (_positive(x) for x in r.split("|")[1].split()[-3:])
        assert _ratio_of_printed(ms, ref, ratio), r
        assert "agree True" in r  # the Numba clipped loop gives the numpy clipped sum


@pytest.mark.slow
def test_bench_models_scaling_tiny():
    out = _run(
        "bench_models.py",
        *("--scaling", "--sizes", "320", "640", "--blocks", "1", "--block-seconds", "0.01"),
        *("--models", "hier50", "banana"),
    )
    rows = [r for r in out.splitlines() if r.startswith("scaling")]
    assert len(rows) == 2 * 2 * 2 * 2, out  # models x sizes x (grad, LLR) x (whole, chunked)
    for r in rows:
        chunk, ms, ns, peak = r.split("|")[1].split()[-4:]
        assert _positive(ms) and _positive(ns) and float(peak) >= 0.0
    assert "route sorted" in out and "route blocks" in out


@pytest.mark.slow
def test_bench_auto_quick():
    """The automatic-mode goal table runs end to end (small: linear regression, n = 1000; at
    n = 300 the warm start is noise-dominated and a run can leave a chain unmoved, R-hat nan)."""
    out = _run("bench_auto.py", "--quick")
    row = next(r for r in _rows(out, "linear"))
    bar = row.index("|")
    assert row[bar + 1] in ("laplace", "chain")
    rhat, med, worst = (_positive(x) for x in row[bar + 2 : bar + 5])
    assert rhat >= 1.0 - 1e-9 and 0 <= med <= worst
    assert float(row[-4]) <= 10.0  # the report's epsilon, never above the target


@pytest.mark.slow
def test_bench_step_classes_quick():
    """The step-class goal table runs end to end: DP-SGLD configured (finite numbers, the
    report's epsilon at most the target), DPHMC refused with its message."""
    out = _run("bench_step_classes.py", "--quick")
    (row,) = _rows(out, "DPSGLD")
    err, rhat = _positive(row[3]), _positive(row[4])
    assert err >= 0 and rhat >= 1.0 - 1e-9 and float(row[7]) <= 10.0
    (hmc,) = _rows(out, "DPHMC")
    assert "refused" in " ".join(hmc) and "DPHMC: pymc_dp.sample(step=DPHMC)" in out


def test_bench_distributed_tiny():
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    out = _run("bench_distributed.py", "--quick")
    for step in ("DPHMC", "DPPenaltyMetropolis", "DPSGLD"):
        row = next(r for r in _rows(out, step) if "2,000" in r)
        bar = row.index("|")
        one, dask_t, ratio = (_positive(x) for x in row[bar + 1 : bar + 4])
        assert ratio == pytest.approx(one / dask_t, rel=0.02, abs=2e-3)
        assert "predicted n = 1e9 on W = 100" in out
    assert _positive(re.search(r"round trip R .*: ([\d.]+) ms", out).group(1))
    assert _positive(re.search(r"c_B = ([\d.]+) ns/minibatch record", out).group(1))
