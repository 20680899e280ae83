#!/usr/bin/env bash
# The habits CI enforces: ruff (lint, then the formatter's check), mypy on the product
# packages, and import-linter's contracts (the layers, the sinks' independence, no cycles),
# all configured in pyproject.toml. Exit non-zero on any finding.
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
"$(dirname "$PY")/lint-imports" --no-cache --no-logo || status=1
exit $status
