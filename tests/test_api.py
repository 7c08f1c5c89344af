"""`tunefleet.api`: cheap to import, and its calls work on a fresh home (no tuning here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: What `import tunefleet.api` must not load: the calls import them when they need them.
HEAVY = ("tvm", "torch", "onnx", "prefect", "sqlalchemy", "xgboost", "pyarrow")


def test_import_is_light() -> None:
    code = f"import sys, tunefleet.api; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_ingest_twice_returns_the_same_model(tunefleet_home: Path) -> None:
    from tunefleet import api

    ctx = api.connect()  # the settings from the environment: the test's TUNEFLEET_HOME
    try:
        assert Path(ctx.settings.home) == tunefleet_home
        first = api.ingest(ctx, "mlp")
        again = api.ingest(ctx, "mlp")
        assert first.created and not again.created
        assert (first.model.id, first.model.sha256) == (again.model.id, again.model.sha256)
        assert [m.name for m in ctx.db.models()] == ["mlp"]
    finally:
        ctx.close()


def test_best_of_an_unknown_workload_is_not_found(tunefleet_home: Path) -> None:
    from tunefleet import api
    from tunefleet.errors import NotFoundError

    ctx = api.connect()
    try:
        with pytest.raises(NotFoundError):
            api.best(ctx, "0" * 32, "x86")
    finally:
        ctx.close()
