#!/usr/bin/env bash
# The README's main-job command: installs tunefleet into a virtualenv beside this clone (once) and
# runs `tunefleet run` on the embedded defaults (SQLite and an artifact directory under
# ~/.tunefleet, Prefect's ephemeral mode, this machine's CPU). Extra arguments go to `tunefleet run`
# (e.g. --model mlp). It works from any directory: nothing here depends on the working directory.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
VENV=${TUNEFLEET_VENV:-$repo/.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
# Install once (an editable install follows the clone's code); TUNEFLEET_REINSTALL=1 installs again,
# e.g. after a pull that changed the dependencies. torch==2.13.0 is the CPU wheel these machines
# carry (see pyproject.toml's comment). The console script itself is checked: an install from
# before a move of its entry point imports fine but has a script that points at nothing.
if [ "${TUNEFLEET_REINSTALL:-0}" = "1" ] || ! "$VENV/bin/tunefleet" --version >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install -q -e "$repo[torch]"
fi
exec "$VENV/bin/tunefleet" run "$@"
