#!/usr/bin/env bash
# Build the documentation site strictly (any warning fails): bash dev/docs.sh [PYTHON]
# MathJax is bundled into the site by dev/mkdocs_hooks.py (fetched once with `npm pack` from
# the npm registry and cached, or from $PYMC_DP_MATHJAX); the build fails on remote scripts.
set -euo pipefail
PY=${1:-python3}
cd "$(dirname "$0")/.."
VENV=".venv-$(basename "$PY")"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
{ "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[docs]" 2>&1; } |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }
NO_MKDOCS_2_WARNING=1 "$VENV/bin/python" -m mkdocs build --strict -d "${SITE_DIR:-site}"
