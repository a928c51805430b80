#!/usr/bin/env bash
# Set up a fresh virtual environment and run the whole test suite (lint + pytest).
#   bash dev/test.sh [PYTHON] [pytest args...]
# PYTHON defaults to python3. Exits non-zero on any failure, including "no tests ran".
set -euo pipefail
PY=${1:-python3}
shift || true
cd "$(dirname "$0")/.."
VENV=".venv-$(basename "$PY")"
"$PY" -m venv "$VENV"
# (the machine's pip config names local mirrors that may be absent: drop those warnings)
{ "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1; } |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }
"$VENV/bin/python" -c "import sys, pymc, pytensor, arviz; print('python', sys.version.split()[0], '| pymc', pymc.__version__, '| pytensor', pytensor.__version__, '| arviz', arviz.__version__)"
"$VENV/bin/python" -m ruff check .
"$VENV/bin/python" -m ruff format --check .
"$VENV/bin/python" -m pytest "$@"
