"""The data-sharing docs state exactly which curator the scheme protects against.

Failed on main at 99d13ac (issue 29, item 5): the docs promised protection from a curator
the owners do not trust, while the curator's Dask client holds futures to every owner's raw
partitions and to the exact per-partition sums.
"""

from __future__ import annotations

import re
from pathlib import Path

import pymc_dp.distributed

ROOT = Path(__file__).resolve().parents[2]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_scaling_out_says_which_curator_the_scheme_protects_against():
    text = _flat((ROOT / "docs" / "scaling-out.md").read_text())
    assert "Which curator this protects against" in text
    assert re.search(r"does \*\*not\*\* protect against a curator who uses the Dask client", text)
    assert "client.gather" in text and "noise-free per-partition sums" in text
    assert "who do not trust the curator" not in text


def test_the_module_docstring_says_it_too():
    doc = _flat(pymc_dp.distributed.__doc__)
    assert "a curator who uses the Dask client" in doc
