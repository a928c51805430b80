#!/usr/bin/env bash
# Mutation check of the kernels (on demand, not in CI): bash dev/mutants.sh [PYTHON] [names...]
# Uses the venv that dev/test.sh made for PYTHON (default python3); see dev/mutants.py.
set -euo pipefail
PY=${1:-python3}
shift || true
cd "$(dirname "$0")/.."
VENV=".venv-$(basename "$PY")"
[ -x "$VENV/bin/python" ] || bash dev/test.sh "$PY" --co -q >/dev/null
exec "$VENV/bin/python" dev/mutants.py "$@"
