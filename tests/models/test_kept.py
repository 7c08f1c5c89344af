"""A model is loaded and extracted once inside ``keeping_models`` (a pipeline run), every time outside it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import tunefleet.models.ingest
import tunefleet.tvm.extract
from tunefleet.models.kept import (
    extracted,
    keep_loaded,
    keeping_models,
    loaded_model,
)
from tunefleet.recipes import Recipe


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[object]]:
    calls: dict[str, list[object]] = {"load": [], "extract": []}

    def load_model(db: object, store: object, model: SimpleNamespace) -> SimpleNamespace:
        calls["load"].append(model.id)
        return SimpleNamespace(mod=f"mod of {model.sha256}", params={})

    def extract_workloads(mod: object, target: object, *, params: object, recipe: Recipe) -> list[str]:
        calls["extract"].append((mod, target, recipe.name))
        return [f"{mod} for {target} under {recipe.name}"]

    monkeypatch.setattr(tunefleet.models.ingest, "load_model", load_model)
    monkeypatch.setattr(tunefleet.tvm.extract, "extract_workloads", extract_workloads)
    return calls


def _model(id_: int, sha: str) -> SimpleNamespace:
    return SimpleNamespace(id=id_, sha256=sha)


def test_outside_a_block_every_call_loads_and_extracts(counted: dict[str, list[object]]) -> None:
    m = _model(1, "aa")
    extracted(None, None, m, "llvm", Recipe())  # type: ignore[arg-type]
    extracted(None, None, m, "llvm", Recipe())  # type: ignore[arg-type]
    keep_loaded(m, SimpleNamespace(mod="ingested", params={}))  # type: ignore[arg-type]  # nothing to keep it in
    assert counted["load"] == [1, 1] and len(counted["extract"]) == 2


def test_inside_a_block_once_per_model_target_and_recipe(counted: dict[str, list[object]]) -> None:
    a, b = _model(1, "aa"), _model(2, "bb")
    with keeping_models():
        loaded, found = extracted(None, None, a, "llvm", Recipe())  # type: ignore[arg-type]
        again = extracted(None, None, a, "llvm", Recipe())  # type: ignore[arg-type]
        assert again[0] is loaded and again[1] is found
        with keeping_models():  # nested: the outer block's models
            assert extracted(None, None, a, "llvm", Recipe())[1] is found  # type: ignore[arg-type]
        extracted(None, None, a, "llvm -mcpu=haswell", Recipe())  # type: ignore[arg-type]  # another target
        extracted(None, None, a, "llvm", Recipe(layout="NHWC"))  # type: ignore[arg-type]  # another recipe
        extracted(None, None, b, "llvm", Recipe())  # type: ignore[arg-type]  # another model
        # the same id with other bytes (a re-ingested model) is loaded afresh
        extracted(None, None, _model(1, "cc"), "llvm", Recipe())  # type: ignore[arg-type]
    assert counted["load"] == [1, 2, 1]
    assert len(counted["extract"]) == 5
    loaded_model(None, None, a)  # type: ignore[arg-type]  # the block's models are gone
    assert counted["load"] == [1, 2, 1, 1]


def test_the_ingest_steps_import_is_kept(counted: dict[str, list[object]]) -> None:
    m = _model(3, "dd")
    ingested = SimpleNamespace(mod="ingested", params={})
    with keeping_models():
        keep_loaded(m, ingested)  # type: ignore[arg-type]
        keep_loaded(m, None)  # a call that imported nothing keeps what is there
        loaded, found = extracted(None, None, m, "llvm", Recipe())  # type: ignore[arg-type]
    assert loaded is ingested and counted["load"] == [] and found == ["ingested for llvm under native"]


def test_an_error_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = []

    def load_model(db: object, store: object, model: object) -> object:
        attempts.append(1)
        raise ValueError("corrupt")

    monkeypatch.setattr(tunefleet.models.ingest, "load_model", load_model)
    with keeping_models():
        for _ in range(2):
            with pytest.raises(ValueError, match="corrupt"):
                loaded_model(None, None, _model(4, "ee"))  # type: ignore[arg-type]
    assert len(attempts) == 2


def test_two_threads_asking_at_once_make_it_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    started, release, calls = threading.Event(), threading.Event(), []

    def load_model(db: object, store: object, model: SimpleNamespace) -> SimpleNamespace:
        calls.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return SimpleNamespace(mod="slow", params={})

    monkeypatch.setattr(tunefleet.models.ingest, "load_model", load_model)
    m, got = _model(5, "ff"), []
    with keeping_models():
        import contextvars

        other = threading.Thread(target=contextvars.copy_context().run, name="maker",
                                 args=(lambda: got.append(loaded_model(None, None, m)),))  # type: ignore[arg-type]
        other.start()
        assert started.wait(10)
        waiter = threading.Thread(target=contextvars.copy_context().run, name="waiter",
                                  args=(lambda: got.append(loaded_model(None, None, m)),))  # type: ignore[arg-type]
        waiter.start()
        release.set()
        other.join(10)
        waiter.join(10)
    assert calls == ["maker"] and len(got) == 2 and got[0] is got[1]


def test_a_head_start_is_taken_and_its_failure_is_made_again(monkeypatch: pytest.MonkeyPatch,
                                                             counted: dict[str, list[object]]) -> None:
    import threading

    from tunefleet.models.kept import extraction_seconds, head_start, ingested

    made = []

    def ingest(db: object, store: object, source: str, **shape: object) -> SimpleNamespace:
        made.append((source, threading.current_thread().name))
        if source == "corrupt":
            raise ValueError(f"{source}: not a model")
        return SimpleNamespace(model=_model(6, source), created=True, loaded=SimpleNamespace(mod=source, params={}))

    monkeypatch.setattr(tunefleet.models.ingest, "ingest", ingest)
    done = threading.Event()

    def begin() -> None:
        try:
            for source in ("good", "corrupt"):
                ingested(None, None, source)  # type: ignore[arg-type]
        finally:
            done.set()

    with head_start(begin):
        assert done.wait(10)
        res = ingested(None, None, "good")  # type: ignore[arg-type]  # the head start's, not made again
        assert res.model.sha256 == "good"
        # what the ingest imported is kept as the model's loaded form: no load, and the seconds noted
        loaded, found = extracted(None, None, res.model, "llvm", Recipe())  # type: ignore[arg-type]
        assert loaded is res.loaded and extraction_seconds(res.model, "llvm", Recipe()) is not None
        assert counted["load"] == [] and len(counted["extract"]) == 1
        with pytest.raises(ValueError, match="corrupt: not a model"):  # made again here, failing on its own
            ingested(None, None, "corrupt")  # type: ignore[arg-type]
    assert made == [("good", "tunefleet-head-start"), ("corrupt", "tunefleet-head-start"),
                    ("corrupt", threading.current_thread().name)]
    assert extraction_seconds(res.model, "llvm", Recipe()) is None  # outside the block nothing is kept
