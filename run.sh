#!/usr/bin/env bash
# One entry point that sets itself up on a fresh machine, then runs what was asked:
#   ./run.sh demo [--orders N]   embedded MariaDB + Kafka stand-in + relay + workload + verify
#   ./run.sh test [pytest args]  every kind of test (unit, integration, Spark, short fault suite)
#   ./run.sh cdc <args>          the cdc command itself (run, check, verify, repair, locate)
#   ./run.sh bench <name>        a benchmark from bench/
set -euo pipefail
CALLER=$(pwd)  # `./run.sh cdc ... --config relay.toml` reads relay.toml from here
cd "$(dirname "$0")"
ROOT=$(pwd)

need_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
    echo "run.sh: '$*' needs root; run it as root or install the package yourself" >&2; exit 2; fi
}

apt_install() {
  if [ ! -f /tmp/.cdc-apt-updated ]; then need_root apt-get update -qq && touch /tmp/.cdc-apt-updated; fi
  DEBIAN_FRONTEND=noninteractive need_root apt-get install -y -qq "$@" >/dev/null
}

setup() {
  PY=${PYTHON:-}
  if [ -z "$PY" ]; then
    for cand in python3.11 python3; do
      if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        PY=$cand; break; fi
    done
  fi
  if [ -z "$PY" ]; then echo "run.sh: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 2; fi
  if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then
    echo "run.sh: installing mariadb-server (mariadbd is missing) ..." >&2
    apt_install mariadb-server
  fi
  if [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ] && ! command -v rabbitmq-server >/dev/null; then
    echo "run.sh: installing rabbitmq-server (the RabbitMQ Streams sink's tests start one) ..." >&2
    apt_install rabbitmq-server
  fi
  if ! command -v java >/dev/null; then
    echo "run.sh: installing a Java runtime for Spark ..." >&2
    apt_install openjdk-17-jre-headless
  fi
  local stamp=".venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)"
  if [ ! -f "$stamp" ]; then
    echo "run.sh: creating .venv and installing dependencies ..." >&2
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip >/dev/null
    .venv/bin/python -m pip install -q -e '.[verify,test,debezium,rabbitmq,nats]'
    rm -f .venv/.installed-*
    touch "$stamp"
  fi
  # the json format's optional compiled proof walk (docs/output-formats.md, "The compiled walk"): built
  # again whenever cdc/json_kinds.py changes; without a C compiler one line, and the pure-Python
  # walk runs (the loader also refuses a build stamped with another digest of the source)
  local kinds=".venv/.json-kinds-$(sha1sum cdc/json_kinds.py | cut -c1-12)"
  if [ ! -f "$kinds" ] || { command -v "${CC:-gcc}" >/dev/null && ! ls cdc/_json_kinds_compiled.*.so >/dev/null 2>&1; }; then
    if .venv/bin/python tools/build_native.py json_kinds >&2; then rm -f .venv/.json-kinds-*; touch "$kinds"; fi
  fi
  # the sinks' optional C encoders (docs/sinks.md, connectors/sink_native.c): the same rule, built
  # again whenever sink_native.c changes or this interpreter's build is missing (the loader
  # refuses a stale build)
  local native=".venv/.sink-native-$(sha1sum connectors/sink_native.c | cut -c1-12)" suffix
  suffix=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  if [ ! -f "$native" ] || { command -v "${CC:-gcc}" >/dev/null && [ ! -f "connectors/_sink_native$suffix" ]; }; then
    if .venv/bin/python tools/build_native.py sink_native >&2; then rm -f .venv/.sink-native-*; touch "$native"; fi
  fi
  export PATH="$ROOT/.venv/bin:$PATH"
  export PYSPARK_PYTHON="$ROOT/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$ROOT/.venv/bin/python"
  export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"  # Spark in local mode: loopback, no hostname look-up
}

cmd=${1:-help}
[ $# -gt 0 ] && shift
case "$cmd" in
  demo) setup; exec .venv/bin/cdc demo "$@" ;;
  test) setup
    # With no arguments (CI, the README's command): the lint gate first (ruff, format, mypy),
    # then every test but the `extended` tier (tests/README.md: `./run.sh test -m extended`
    # runs it), then the unit tier on Python 3.12 and 3.13. The suite runs on two pytest-xdist
    # workers, a test file per worker at a time (`--dist loadfile`: a module's Spark session and
    # servers stay with it); each worker starts its own servers on free ports. Most of an
    # integration test is waiting on servers and processes, so a second worker uses the idle
    # core (CI was 34 minutes on one). CDC_TEST_WORKERS=1 runs it in one process.
    all=0
    if [ $# -eq 0 ]; then
      all=1; tools/lint.sh || exit 1
      set -- -m "not extended"
      if [ "${CDC_TEST_WORKERS:-2}" != 1 ]; then set -- "$@" -n "${CDC_TEST_WORKERS:-2}" --dist loadfile; fi
    fi
    rc=0; .venv/bin/python -m pytest "$@" || rc=$?
    if [ $all -eq 1 ]; then tools/unit_tiers.sh || rc=1; fi
    exit $rc ;;
  cdc) setup; cd "$CALLER"; exec "$ROOT/.venv/bin/cdc" "$@" ;;
  bench) setup; name=${1:?usage: ./run.sh bench <name> [args]}; shift; exec .venv/bin/python "bench/$name.py" "$@" ;;
  setup) setup ;;
  *) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
