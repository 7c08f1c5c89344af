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
# A C compiler and libc's headers: bench/two_speeds.py builds its core-to-core probe, and its test builds it.
command -v cc >/dev/null && [ -f /usr/include/stdio.h ] || need_apt+=(gcc libc6-dev)
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
# Two phases. Most tests wait on subprocesses and servers, so the suite runs on two pytest-xdist
# workers (one file per worker at a time); the tests marked `serial` time leases, heartbeats and
# fault loops against the clock and run afterwards, alone. A phase that selects nothing (exit 5,
# e.g. with -m "not slow") is not a failure.
WORKERS=${TUNEFLEET_TEST_WORKERS:-2}
rc=0
for phase in parallel serial; do
    if [ "$phase" = parallel ] && [ "$WORKERS" -gt 1 ]; then xdist=(-n "$WORKERS" --dist loadfile); else xdist=(); fi
    set +e
    TUNEFLEET_TEST_PHASE=$phase "$VENV/bin/python" -m pytest -ra --durations=15 "${xdist[@]}" "$@"
    prc=$?
    set -e
    if [ "$prc" = "5" ]; then
        echo "pytest ($phase phase): no tests selected (exit 5) — treated as success"
    elif [ "$prc" != "0" ] && [ "$rc" = "0" ]; then
        rc=$prc
    fi
done
exit "$rc"
