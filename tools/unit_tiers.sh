#!/usr/bin/env bash
# The unit tier (tests/unit, which starts nothing: no servers, no Spark) on the other
# Python versions the relay supports, each in a virtualenv of its own kept between runs
# (.venv-3.12, .venv-3.13: git-ignored), with the relay, its sink clients and its test tools (`.[test,rabbitmq,nats]`,
# not the verifier's PySpark/PyArrow: tests marked verifier_deps are left out). A version that is not installed is reported, not
# skipped silently.
#   tools/unit_tiers.sh [pytest args]        CDC_PYTHONS="3.12 3.13" by default
set -euo pipefail
cd "$(dirname "$0")/.."
status=0
for version in ${CDC_PYTHONS:-3.12 3.13}; do
  py=""
  for cand in "$HOME/.pyenv/versions/$version"*/bin/python "$(command -v "python$version" || true)"; do
    if [ -n "$cand" ] && [ -x "$cand" ]; then py=$cand; break; fi
  done
  if [ -z "$py" ]; then
    echo "unit_tiers: Python $version not found (pyenv or python$version on PATH)" >&2; status=1; continue
  fi
  venv=".venv-$version"
  stamp="$venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    echo "unit_tiers: building $venv with $py ..." >&2
    [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$venv/bin/python" -m pip install -q -e '.[test,rabbitmq,nats]'
    rm -f "$venv"/.installed-*
    touch "$stamp"
  fi
  echo "unit_tiers: Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())')" >&2
  # the sinks' C encoders for this interpreter, so that their tests run on each C API (a
  # missing C compiler is one line and the Python way; a failed compile fails the tier)
  "$venv/bin/python" tools/build_native.py sink_native >&2 || status=1
  # the verifier_deps tests need PySpark / PyArrow, which these venvs do not install
  "$venv/bin/python" -m pytest tests/unit -q -p no:cacheprovider -m "not verifier_deps" "$@" || status=1
done
exit $status
