#!/usr/bin/env bash
# The habits CI enforces: ruff (lint, then the formatter's check) and mypy on the
# product packages, configured in pyproject.toml. Exit non-zero on any finding.
#   tools/lint.sh              all three
#   tools/lint.sh --no-format  ruff check + mypy (until the tree is formatted once)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
status=0
"$PY" -m ruff check . || status=1
if [ "${1:-}" != "--no-format" ]; then
  "$PY" -m ruff format --check . || status=1
fi
"$PY" -m mypy || status=1
exit $status
