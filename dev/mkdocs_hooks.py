"""MkDocs hooks: bundle MathJax into the built site, and refuse remote scripts.

The documentation must render its formulas with no network. ``pymdownx.arithmatex`` leaves
the TeX in the pages; MathJax typesets it in the browser. Instead of loading MathJax from a
CDN, this hook copies MathJax (from the npm registry's ``mathjax`` package, fetched once with
``npm pack`` and cached) into ``<site>/javascripts/mathjax/``, where ``mkdocs.yml``'s
``extra_javascript`` points. After the build it scans every HTML page and fails the build
when any ``<script src=...>`` is remote (``http://``, ``https://`` or ``//``).

Where MathJax comes from, in order:

1. ``$PYMC_DP_MATHJAX``: a directory holding MathJax's ``es5`` build (``tex-mml-chtml.js``,
   ``input/``, ``output/``, ...) or an ``npm pack`` tarball ``mathjax-<version>.tgz``;
2. the cache ``$XDG_CACHE_HOME/pymc_dp/mathjax-<version>`` (default ``~/.cache``);
3. ``npm pack mathjax@<version>`` (npm needs only the npm registry), into that cache.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

MATHJAX_VERSION = "3.2.2"
#: Parts of MathJax's es5 build the site needs: the combined TeX + MathML -> CommonHTML
#: component, the TeX extensions it autoloads, the CommonHTML fonts, the menu and the
#: accessibility extensions the menu can switch on (the speech engine ``sre`` is left out).
MATHJAX_PARTS = ("tex-mml-chtml.js", "input/tex/extensions", "output/chtml/fonts", "ui", "a11y")
#: Where the site loads MathJax from (relative to the site root; see mkdocs.yml).
SITE_SUBDIR = "javascripts/mathjax"

_SCRIPT_SRC = re.compile(r"<script\b[^>]*?\bsrc\s*=\s*[\"']?([^\"'\s>]+)", re.IGNORECASE)


def remote_script_sources(html: str) -> list[str]:
    """The ``src`` of every ``<script>`` tag of ``html`` that loads from the network.

    Parameters
    ----------
    html : str
        An HTML page.

    Returns
    -------
    list of str
        Sources starting with ``http://``, ``https://`` or ``//`` (protocol-relative).
    """
    return [
        src
        for src in _SCRIPT_SRC.findall(html)
        if src.lower().startswith(("http://", "https://", "//"))
    ]


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "pymc_dp" / f"mathjax-{MATHJAX_VERSION}"


def _extract(tgz: Path, dest: Path) -> Path:
    """Extract ``package/es5`` of an npm tarball into ``dest``; return ``dest``."""
    tmp = Path(tempfile.mkdtemp(prefix="mathjax-", dir=dest.parent))
    with tarfile.open(tgz) as tf:
        members = [m for m in tf.getmembers() if m.name.startswith("package/es5/")]
        tf.extractall(tmp, members=members, filter="data")
    if dest.exists():
        shutil.rmtree(dest)
    (tmp / "package" / "es5").rename(dest)
    shutil.rmtree(tmp, ignore_errors=True)
    return dest


def mathjax_es5_dir() -> Path:
    """A local directory with MathJax's es5 build (see the module docstring for where from).

    Returns
    -------
    pathlib.Path
        A directory containing ``tex-mml-chtml.js``.

    Raises
    ------
    RuntimeError
        When no local copy exists and ``npm pack`` is not available or fails.
    """
    env = os.environ.get("PYMC_DP_MATHJAX")
    if env:
        p = Path(env)
        if p.is_file():
            out = _cache_dir()
            out.parent.mkdir(parents=True, exist_ok=True)
            return _extract(p, out)
        if (p / "tex-mml-chtml.js").is_file():
            return p
        raise RuntimeError(
            f"PYMC_DP_MATHJAX={env} is neither MathJax's es5 directory (with "
            "tex-mml-chtml.js) nor an npm tarball of mathjax"
        )
    cache = _cache_dir()
    if (cache / "tex-mml-chtml.js").is_file():
        return cache
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            "the docs bundle MathJax (formulas render offline) and need it once from the npm "
            f"registry: install npm (Node.js), or set PYMC_DP_MATHJAX to an extracted "
            f"mathjax@{MATHJAX_VERSION} es5 directory or its npm tarball"
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(
            [npm, "pack", f"mathjax@{MATHJAX_VERSION}", "--silent", "--pack-destination", tmp],
            capture_output=True,
            text=True,
        )
        tgz = Path(tmp) / f"mathjax-{MATHJAX_VERSION}.tgz"
        if r.returncode != 0 or not tgz.is_file():
            raise RuntimeError(
                f"npm pack mathjax@{MATHJAX_VERSION} failed ({r.returncode}): {r.stderr.strip()}"
            )
        return _extract(tgz, cache)


def copy_mathjax(site_dir: str | Path) -> Path:
    """Copy the MathJax parts the site needs into ``site_dir/javascripts/mathjax``.

    Parameters
    ----------
    site_dir : str or pathlib.Path
        The built site.

    Returns
    -------
    pathlib.Path
        The copied ``tex-mml-chtml.js``.
    """
    src = mathjax_es5_dir()
    dest = Path(site_dir) / SITE_SUBDIR
    for part in MATHJAX_PARTS:
        s, d = src / part, dest / part
        d.parent.mkdir(parents=True, exist_ok=True)
        if s.is_dir():
            shutil.copytree(s, d, dirs_exist_ok=True)
        else:
            shutil.copy2(s, d)
    return dest / "tex-mml-chtml.js"


def on_post_build(config, **kwargs) -> None:
    """MkDocs hook: bundle MathJax, then fail on any remote ``<script src>``."""
    from mkdocs.exceptions import PluginError

    site = Path(config["site_dir"])
    try:
        copy_mathjax(site)
    except RuntimeError as e:
        raise PluginError(str(e)) from e
    bad = {}
    for page in site.rglob("*.html"):
        found = remote_script_sources(page.read_text(encoding="utf-8", errors="replace"))
        if found:
            bad[str(page.relative_to(site))] = found
    if bad:
        raise PluginError(
            "the built site loads scripts from the network (the docs must work offline): "
            + "; ".join(f"{k}: {v}" for k, v in sorted(bad.items()))
        )
