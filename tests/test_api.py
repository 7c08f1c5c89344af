"""`tunefleet.api`: cheap to import, and its calls work on a fresh home (no tuning here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.onnx_models import tiny_onnx
from tunefleet.budget import Budget

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


def test_import_tunefleet_is_light_and_names_the_api() -> None:
    code = (f"import sys, tunefleet; from tunefleet import api; "
            f"assert tunefleet.connect is api.connect and tunefleet.best_for is api.best_for; "
            f"assert set(tunefleet.API) <= set(dir(tunefleet)) and set(tunefleet.API) <= set(api.__all__); "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr[-2000:]


def test_best_for_a_stored_model_and_for_a_relax_module(tunefleet_home: Path) -> None:
    from tunefleet import api
    from tunefleet.db import NewMeasurement
    from tunefleet.errors import NotFoundError
    from tunefleet.models.ingest import load_model

    ctx = api.connect()
    try:
        model = api.ingest(ctx, "mlp").model
        with pytest.raises(NotFoundError, match=r"model mlp has no workloads on x86: extract it first"):
            api.best_for(ctx, model, "x86")
        api.extract(ctx, model, "x86")
        hw = ctx.db.hardware_class("x86")
        (measured, _), *_ = ctx.db.workloads(model.id, hw.id)
        ctx.db.commit_measurements([NewMeasurement(measured.id, hw.id, "{}", [2e-5, 3e-5])])
        by_model = {w.workload: w for w in api.best_for(ctx, "mlp", "x86")}
        assert len(by_model) == 3 and all(w.weight >= 1 for w in by_model.values())
        (best,) = by_model.pop(measured.structural_hash).schedules
        assert best.mean_run_s == pytest.approx(2.5e-5) and best.origin == "tuned here"
        assert all(w.schedules == [] for w in by_model.values())  # never measured: no schedule, no error
        # the same model as a user's own Relax module: the hashes are computed under the class's recipe
        loaded = load_model(ctx.db, ctx.store, model)
        by_module = {w.workload: w for w in api.best_for(ctx, loaded.mod, "x86", params=loaded.params)}
        assert set(by_module) == {*by_model, measured.structural_hash}
        assert by_module[measured.structural_hash].as_dict()["schedules"][0]["measurement_id"] == best.measurement_id
    finally:
        ctx.close()


def test_tune_refuses_a_bad_budget_in_one_line(tunefleet_home: Path) -> None:
    from tunefleet import api
    from tunefleet.errors import ParameterError
    from tunefleet.planning.rounds import Rounds

    ctx = api.connect()
    try:
        model = api.ingest(ctx, "mlp").model
        with pytest.raises(ParameterError, match=r"'200' is a number of trials; give model_ids to spend it on"):
            api.tune(ctx, "x86", budget=200)
        with pytest.raises(ParameterError, match=r"model_ids needs budget"):
            api.tune(ctx, "x86", models=[model])
        with pytest.raises(ParameterError, match=r"invalid budget: 'soon'"):
            api.tune(ctx, "x86", budget="soon", models=[model])
        with pytest.raises(ParameterError, match=r"give budget \(and models\), or rounds and deadline, not both"):
            api.tune(ctx, "x86", budget=20, models=[model], rounds=Rounds("x86", [model.id], Budget(trials=20)))
        assert api.tune(ctx, "x86", budget="1s").measured == 0  # a wall time alone: nothing planned to drain
    finally:
        ctx.close()


def test_keeping_models_parses_a_file_once_for_ingest_and_extract(tunefleet_home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tunefleet.models.sandbox as sandbox
    from tunefleet import api

    parsed: list[str] = []
    real = sandbox.parse_model

    def counting(data: bytes, filename: str, *args: object, **kwargs: object) -> object:
        parsed.append(filename)
        return real(data, filename, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sandbox, "parse_model", counting)
    path = tunefleet_home.parent / "mm.onnx"
    path.write_bytes(tiny_onnx())
    ctx = api.connect()
    try:
        with api.keeping_models():
            model = api.ingest(ctx, str(path)).model
            assert api.extract(ctx, model, "x86").workloads == 1
        assert parsed == ["mm.onnx"]  # the extraction took the ingest's parse
        api.extract(ctx, model, "x86")  # outside the block: parsed again
        assert parsed == ["mm.onnx", "mm.onnx"]
    finally:
        ctx.close()
