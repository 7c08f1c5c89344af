"""``tunefleet gc``: the store holds only what the database points to (issue 34, item 1).

Files no row of ``artifacts`` lists — an export or retrain killed before its commit, or one whose
commit failed — are deleted once older than a grace period, and nothing else is: not a registered
dataset folder or cost model, not a unit a running export may still be writing, not what lives
outside the kinds' roots (models). On SQLite and PostgreSQL, with a local directory and a real S3
server (SeaweedFS); the clock is moved by passing ``now``, never by sleeping.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from tunefleet.cli.app import main
from tunefleet.db import Database
from tunefleet.learning import artifacts
from tunefleet.store import ArtifactStore, LocalStore, S3Store, StoredObject
from tunefleet.testing.seaweedfs import SeaweedFSServer, unique_bucket_name
from tunefleet.tvm.targets import host_cpu_target

DAY = dt.timedelta(days=1)

REGISTERED = {
    "datasets/v1-aaaaaaaa/": ["datasets/v1-aaaaaaaa/hardware=x86/part-0.parquet", "datasets/v1-aaaaaaaa/manifest.json"],
    "costmodels/x86/v1-bbbbbbbb.json": ["costmodels/x86/v1-bbbbbbbb.json"],
}
GARBAGE = {  # a killed export's folder, a retrain that never committed
    "datasets/v2-cccccccc/": ["datasets/v2-cccccccc/hardware=x86/part-0.parquet", "datasets/v2-cccccccc/manifest.json"],
    "costmodels/x86/v2-dddddddd.json": ["costmodels/x86/v2-dddddddd.json"],
}
ELSEWHERE = ["models/ab/ab12.onnx", "datasets.txt"]  # outside every kind's root: never touched



@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path) -> ArtifactStore:  # type: ignore[no-untyped-def]
    if request.param == "local":
        return LocalStore(tmp_path / "artifacts")
    server: SeaweedFSServer = request.getfixturevalue("seaweedfs")
    return S3Store(server.endpoint, server.access_key, server.secret_key, unique_bucket_name("gc"), prefix="tf")


def _fill(db: Database, store: ArtifactStore) -> None:
    """The registered units (written, then registered with their owners), the garbage, the rest."""
    hw = db.upsert_hardware_class("x86", host_cpu_target(2), "x86").id
    for key in [k for keys in (*REGISTERED.values(), *GARBAGE.values()) for k in keys] + ELSEWHERE:
        store.put_bytes(key, key.encode())
    reserved = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
    db.update_dataset(reserved.id, uri=store.uri("datasets/v1-aaaaaaaa/manifest.json"),
                      manifest={"state": "complete", "schema_version": 1}, row_count=0,
                      artifact_key="datasets/v1-aaaaaaaa/")
    cm = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
    assert db.finish_cost_model(cm.id, artifact_uri=store.uri("costmodels/x86/v1-bbbbbbbb.json"), metrics={},
                                promote=True, expected_current=None, artifact_key="costmodels/x86/v1-bbbbbbbb.json")


def test_stores_list_objects_with_sizes_and_write_times(store: ArtifactStore) -> None:
    before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)  # S3's times have whole seconds
    store.put_bytes("a/one.bin", b"1")
    store.put_bytes("a/b/two.bin", b"22")
    store.put_bytes("b.bin", b"333")
    after = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
    listed = list(store.list_objects("a/"))
    assert [o.key for o in listed] == list(store.list("a/")) == ["a/b/two.bin", "a/one.bin"]
    assert [o.size for o in listed] == [2, 1]
    assert all(before <= o.modified <= after and o.modified.tzinfo is not None for o in listed)
    assert [o.key for o in store.list_objects()] == list(store.list())


def test_gc_deletes_only_what_nothing_points_to_after_the_grace_period(db_url: str, store: ArtifactStore) -> None:
    db = Database(db_url)
    _fill(db, store)
    everything = sorted(store.list())

    fresh = artifacts.collect(db, store)  # the default grace period: a day
    assert fresh.grace == DAY and fresh.deleted == [] and fresh.registered == 2
    assert sorted(u.name for u in fresh.young) == sorted(GARBAGE), "maybe still being written: kept"
    assert sorted(store.list()) == everything

    later = dt.datetime.now(dt.timezone.utc) + 2 * DAY
    dry = artifacts.collect(db, store, dry_run=True, now=later)
    assert {u.name: sorted(u.keys) for u in dry.deleted} == {k: sorted(v) for k, v in GARBAGE.items()}
    assert {u.kind for u in dry.deleted} == {"dataset", "cost_model"} and dry.young == []
    assert all(u.size > 0 and u.modified is not None for u in dry.deleted)
    assert sorted(store.list()) == everything, "a dry run deletes nothing"

    done = artifacts.collect(db, store, now=later)
    assert sorted(u.name for u in done.deleted) == sorted(GARBAGE) and done.registered == 2
    kept = sorted(k for keys in REGISTERED.values() for k in keys) + sorted(ELSEWHERE)
    assert sorted(store.list()) == sorted(kept)
    assert artifacts.collect(db, store, now=later).deleted == [], "nothing left to collect"

    # An owner removed from the database takes its registration along: its files become garbage.
    db.delete_dataset(db.datasets()[0].id)
    gone = artifacts.collect(db, store, now=later)
    assert [u.name for u in gone.deleted] == ["datasets/v1-aaaaaaaa/"]
    assert not [k for k in store.list() if k.startswith("datasets/v1-")]
    db.close()


class _ListedStore:
    """A store whose listing is given (to set write times a day apart without waiting a day)."""

    def __init__(self, objects: list[StoredObject]) -> None:
        self.objects = objects
        self.deleted: list[str] = []

    def list_objects(self, prefix: str = "") -> Iterator[StoredObject]:
        return iter([o for o in self.objects if o.key.startswith(prefix)])

    def delete(self, key: str) -> None:
        self.deleted.append(key)


def test_a_unit_is_as_young_as_its_newest_file(db_url: str) -> None:
    """An export that wrote one class's file two days ago and another's a minute ago is still
    running: none of its files goes. Registered old-layout folders (before revision 0009) count."""
    db = Database(db_url)
    db.update_dataset(db.add_dataset(uri="", manifest={}, row_count=0).id, uri="u", manifest={}, row_count=0,
                      artifact_key="datasets/v1/")
    now = dt.datetime.now(dt.timezone.utc)
    old, new = now - 2 * DAY, now - dt.timedelta(minutes=1)
    store: Any = _ListedStore([
        StoredObject("datasets/v1/hardware=x86/part-0.parquet", 10, old),  # registered (the old layout)
        StoredObject("datasets/v10-eeeeeeee/hardware=arm/part-0.parquet", 10, old),
        StoredObject("datasets/v10-eeeeeeee/hardware=x86/part-0.parquet", 10, new),
        StoredObject("datasets/v11-ffffffff/manifest.json", 10, old),
        StoredObject("costmodels/x86/v1.json.bak", 10, old),  # not the registered key it starts like
    ])
    found = artifacts.collect(db, store)
    assert [u.name for u in found.young] == ["datasets/v10-eeeeeeee/"]
    assert sorted(u.name for u in found.deleted) == ["costmodels/x86/v1.json.bak", "datasets/v11-ffffffff/"]
    assert sorted(store.deleted) == ["costmodels/x86/v1.json.bak", "datasets/v11-ffffffff/manifest.json"]
    assert found.registered == 1
    db.close()


def test_gc_command(tunefleet_home, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.config import load_settings

    settings = load_settings()
    db = Database.from_settings(settings)
    store = LocalStore(settings.effective_store_path)
    _fill(db, store)
    capsys.readouterr()

    assert main(["gc"]) == 0  # a day's grace: everything is younger
    out = capsys.readouterr().out
    assert "gc: 0 unregistered artifact(s) deleted (0 B), 2 kept (written within the grace period of 1d), " \
           "2 registered" in out

    assert main(["gc", "--grace", "0", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split(" (")[0] for line in lines[:-1]) == sorted(f"would delete {k}" for k in GARBAGE)
    assert "datasets/v2-cccccccc/ (dataset: 2 file(s), " in lines[0] + lines[1]
    assert lines[-1].startswith("gc: 2 unregistered artifact(s) to delete (")
    assert all(store.exists(k) for keys in GARBAGE.values() for k in keys)

    assert main(["gc", "--grace", "0s"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert sorted(line.split(" (")[0] for line in lines[:-1]) == sorted(f"deleted {k}" for k in GARBAGE)
    assert not any(store.exists(k) for keys in GARBAGE.values() for k in keys)
    assert all(store.exists(k) for keys in REGISTERED.values() for k in keys)

    assert main(["gc", "--grace", "soon"]) == 2
    err = capsys.readouterr().err
    assert "invalid --grace: 'soon'" in err and len(err.strip().splitlines()) == 1
    db.close()
