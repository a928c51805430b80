"""PyMC 6.x progress bar with pymc_dp steps: no column cut ("Remaini…") at usual widths.

PyMC 6 lays its progress table out by column ratios over the console width; every column a
step adds (`_progressbar_config`) takes width from the others. pymc_dp's steps add none, so
their table is whole from 83 columns (PyMC's own Metropolis needs 107, NUTS 132). Below
that, e.g. a non-terminal's default of 80 columns, PyMC cuts its last column: widen the
terminal or set ``COLUMNS`` (see docs/getting-started.md).
"""

from __future__ import annotations

import io
import warnings

import pytest
from conftest import normal_mean_model

import pymc_dp

progress = pytest.importorskip("pymc.progress_bar.progress", reason="PyMC 6.x progress bar")
rich_console = pytest.importorskip("rich.console")


def _table(step, width: int) -> str:
    m = progress.MCMCProgressBarManager(
        step_method=step, chains=1, draws=100, tune=50, progressbar=True
    )
    prog = m._backend._progress
    fields = {k: v[0] for k, v in m.progress_stats.items()}
    prog.add_task("x", total=150, sampling_speed=0.0, speed_unit="draws/s", failing=False,
                  **fields)  # fmt: skip
    con = rich_console.Console(file=io.StringIO(), width=width)
    con.print(prog.make_tasks_table(prog.tasks))
    return con.file.getvalue()


def _steps():
    model, *_ = normal_mean_model(n=30, d=2)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield pymc_dp.DPPenaltyMetropolis(clip_bound=3.0, noise_multiplier=2.0)
        yield pymc_dp.DPHMC(llr_clip_bound=3.0, grad_clip_bound=3.0, llr_noise_multiplier=2.0,
                            grad_noise_multiplier=2.0)  # fmt: skip
        yield pymc_dp.DPSGLD(clip_bound=3.0, step_size=1e-3, batch_size=10, noise_multiplier=1.0)
        yield pymc_dp.DPSGNHT(clip_bound=3.0, step_size=1e-3, batch_size=10,
                              noise_multiplier=1.0)  # fmt: skip


@pytest.mark.parametrize("width", [83, 100, 120])
def test_progress_table_of_pymc_dp_steps_is_whole(width):
    for step in _steps():
        cols, stats = step._progressbar_config(1)
        assert cols == [] and stats == {}, type(step).__name__  # no column of their own
        text = _table(step, width)
        assert "Remaining" in text and "…" not in text, (type(step).__name__, text)
