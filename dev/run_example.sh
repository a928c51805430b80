#!/usr/bin/env bash
# Set up a virtual environment and run the main job: a differentially private posterior of
# a logistic regression on real (bundled) data, printed with its privacy spend.
#   bash dev/run_example.sh [PYTHON] [example args...]
set -euo pipefail
PY=${1:-python3}
shift || true
cd "$(dirname "$0")/.."
VENV=".venv-$(basename "$PY")"
"$PY" -m venv "$VENV"
{ "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[examples]" 2>&1; } |
  { grep -v "is ignored: it is neither a file nor a directory" || true; }
"$VENV/bin/python" examples/logistic_regression.py "$@"
