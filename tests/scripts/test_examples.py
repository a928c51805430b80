"""Every example script runs at a small size (``--quick``), so the examples cannot rot."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[2] / "examples").glob("*.py")
    if not p.name.startswith("_")
)


@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_quick(path, capsys):
    pytest.importorskip("statsmodels")
    import pandas as pd

    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        # A narrow terminal, as in `bash dev/run_example.sh`: print(DataFrame) would cut the
        # summary to "[6 rows x 9 columns]" with "..." in place of columns.
        with pd.option_context("display.max_columns", 4, "display.width", 60):
            module.main(["--quick"])
    finally:
        sys.path.remove(str(path.parent))
    out = capsys.readouterr().out
    assert "epsilon, delta) = (" in out, "the example must print its privacy spend"
    assert " columns]" not in out, "a table was printed cut: print it whole (to_string)"
    if "r_hat" in out:  # an ArviZ summary: every column printed
        assert "ess_tail" in out and "mcse_mean" in out
