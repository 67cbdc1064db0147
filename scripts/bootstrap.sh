#!/usr/bin/env bash
# Creates the project's virtual environment (.venv) and installs draftsmith into it.
# Usage: scripts/bootstrap.sh [EXTRAS]   e.g. scripts/bootstrap.sh dev,serve
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
EXTRAS=${1:-dev,serve}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
PIP="$VENV/bin/python -m pip"
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # A CPU-only machine may carry a torch wheel in pip's local wheel store (--find-links):
  # take it when there is one, so a CPU box does not pull a multi-GB CUDA build.
  # Elsewhere this finds nothing and the registry's build (CUDA on GPU machines) is installed below.
  $PIP install -q --no-index --no-deps "torch>=2.4" 2>/dev/null || true
fi
$PIP install -q -e ".[${EXTRAS}]"
"$VENV/bin/python" -c "import torch, transformers; print(f'draftsmith env ready: torch {torch.__version__}, transformers {transformers.__version__}')"
