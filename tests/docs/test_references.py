"""Docstring citations a reader can follow: every key is on docs/references.md."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = re.compile(r"\[(DPHMC|[A-Z][A-Za-z]+\d{4})\]")


def test_every_cited_key_is_on_the_references_page():
    page = (ROOT / "docs" / "references.md").read_text()
    listed = set(re.findall(r"`\[([A-Za-z0-9]+)\]`", page))
    cited = set()
    for path in (ROOT / "pymc_dp").rglob("*.py"):
        cited |= set(KEY.findall(path.read_text()))
    assert cited, "no keyed citation found"
    assert cited <= listed, f"cited but not on docs/references.md: {sorted(cited - listed)}"
    for key in listed:
        row = next(line for line in page.splitlines() if f"`[{key}]`" in line)
        assert re.search(r"arXiv:|doi:|proceedings|repository", row), key


def test_no_docstring_points_outside_the_repository():
    for path in (ROOT / "pymc_dp").rglob("*.py"):
        text = path.read_text()
        assert "shared/papers" not in text and "shared/notes" not in text, path.name
