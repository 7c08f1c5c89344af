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
# torch==2.13.0 is the CPU wheel these machines carry (see pyproject.toml's comment).
"$VENV/bin/python" -m pip install -q -e "$repo[torch]"
exec "$VENV/bin/tunefleet" run "$@"
