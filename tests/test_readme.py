"""The README's quickstart runs as written and meets its target."""

from __future__ import annotations

import re
from pathlib import Path


def test_readme_quickstart_runs():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python block"
    ns: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), ns)
    idata = ns["idata"]
    assert idata.attrs["dp_epsilon"] <= 1.0
    assert idata.attrs["dp_delta"] == 1e-6
    assert idata.attrs["dp_iterations"] == 2 * 1500
