"""The documentation site works offline: no remote scripts, MathJax bundled into the site."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _hooks():
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "dev" / "mkdocs_hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_remote_script_sources_finds_every_remote_form():
    find = _hooks().remote_script_sources
    html = (
        '<script src="https://unpkg.com/mathjax@3/es5/tex-mml-chtml.js"></script>'
        "<script defer src='http://x.org/a.js'></script><SCRIPT SRC=//cdn.x/b.js></SCRIPT>"
        '<script src="../javascripts/mathjax/tex-mml-chtml.js"></script>'
        '<script>var u = "https://not-a-src.example";</script>'
        '<link href="https://fonts.example/css" rel="stylesheet">'
    )
    assert find(html) == [
        "https://unpkg.com/mathjax@3/es5/tex-mml-chtml.js",
        "http://x.org/a.js",
        "//cdn.x/b.js",
    ]


def test_mkdocs_config_loads_no_script_from_the_network():
    """mkdocs.yml names local scripts only, and the hook that bundles MathJax."""
    text = (ROOT / "mkdocs.yml").read_text()
    block = re.search(r"^extra_javascript:\n((?:  - .*\n)+)", text, re.MULTILINE)
    assert block, "mkdocs.yml has no extra_javascript list"
    scripts = [line.strip()[2:] for line in block.group(1).splitlines()]
    assert "javascripts/mathjax/tex-mml-chtml.js" in scripts
    assert not [s for s in scripts if re.match(r"(https?:)?//", s)], scripts
    assert re.search(r"^hooks:\n  - dev/mkdocs_hooks.py$", text, re.MULTILINE)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built as CI builds it (strict), into a temporary directory."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    hooks = _hooks()
    try:
        hooks.mathjax_es5_dir()  # from $PYMC_DP_MATHJAX, the cache, or npm pack
    except RuntimeError as e:
        pytest.skip(f"MathJax not available to bundle: {e}")
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_built_site_has_no_remote_script_and_bundles_mathjax(site):
    find = _hooks().remote_script_sources
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 10
    remote = {str(p.relative_to(site)): find(p.read_text()) for p in pages}
    assert not {k: v for k, v in remote.items() if v}, remote
    mj = site / "javascripts" / "mathjax"
    assert (mj / "tex-mml-chtml.js").stat().st_size > 100_000
    assert list((mj / "output" / "chtml" / "fonts" / "woff-v2").glob("*.woff"))
    assert (mj / "input" / "tex" / "extensions").is_dir()  # autoloaded TeX packages
    # a page with formulas loads the local MathJax and marks its TeX for it
    page = (site / "results" / "index.html").read_text()
    assert 'src="../javascripts/mathjax/tex-mml-chtml.js"' in page
    assert 'class="arithmatex"' in page
    # docstring math on the API page goes through the same path
    api = (site / "api" / "index.html").read_text()
    assert 'class="arithmatex"' in api
