#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh machine
# (Debian packages for the real servers, a virtualenv with the project and its test extras)
# and runs the full suite. Extra arguments go to pytest (e.g. -m "not slow").
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

need_apt=()
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v prometheus >/dev/null || need_apt+=(prometheus)
command -v prometheus-pushgateway >/dev/null || need_apt+=(prometheus-pushgateway)
# Node.js + npm: the Grafana dashboard JSON is type-checked against @grafana/schema with tsc.
command -v npm >/dev/null || need_apt+=(nodejs npm)
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "installing Debian packages: ${need_apt[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
VENV=${TUNEFLEET_VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# torch==2.13.0 is the CPU wheel these machines carry (see pyproject.toml's comment).
"$VENV/bin/python" -m pip install -q -e '.[test,torch]'

export TUNEFLEET_TEST=1
set +e
"$VENV/bin/python" -m pytest -ra --durations=15 "$@"
rc=$?
set -e
if [ "$rc" = "5" ]; then
    echo "pytest: no tests selected (exit 5) — treated as success"
    exit 0
fi
exit "$rc"
