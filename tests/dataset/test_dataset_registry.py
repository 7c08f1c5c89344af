"""The store and the database agree on the dataset versions (issue 34, item 1).

The database says which versions exist: an export writes its files under a prefix no other write
uses, then registers the version — its files, its manifest and the marks of the measurements it
took — in one transaction. :func:`~tunefleet.learning.dataset.load` and retraining list versions
from the database, never from the store; files nothing registered are garbage that
``tunefleet gc`` removes after a grace period. Faults at the two moments that matter, on SQLite
and PostgreSQL, with a local directory and a real S3 server (SeaweedFS):

- the export is killed (``kill -9``: no clean-up runs) between writing its files and the commit:
  its complete-looking manifest stays in the store, and must neither be read nor make a
  measurement count twice;
- the commit's acknowledgement is lost (the commit succeeded, then the connection died, and the
  database stays unreachable during the clean-up): the registered version's files must stay.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.dataset.test_dataset import BOGUS_TRACE, _first_batch, _setup
from tests.faults.outages import cut_off_database
from tunefleet.db import Database
from tunefleet.errors import DatabaseUnavailableError
from tunefleet.learning import dataset
from tunefleet.store import ArtifactStore, LocalStore, S3Store
from tunefleet.testing.seaweedfs import SeaweedFSServer, unique_bucket_name

#: Builds the store a child process exports to, from the spec the test gives it.
_CHILD = r"""
import json, os, sys
from tunefleet.db import Database
from tunefleet.learning import dataset
from tunefleet.store import LocalStore, S3Store

spec = json.loads(sys.argv[1])
db = Database(spec["db"])
if "root" in spec:
    store = LocalStore(spec["root"])
else:
    store = S3Store(spec["endpoint"], spec["access_key"], spec["secret_key"], spec["bucket"], prefix=spec["prefix"])


def killed(*args, **kwargs):
    os._exit(137)  # kill -9 after the files are written, before the database commit: no clean-up runs


db.update_dataset = killed
dataset.export(db, store)
"""


@pytest.fixture(params=["local", "s3"])
def store_spec(request: pytest.FixtureRequest, tmp_path) -> Iterator[tuple[ArtifactStore, dict[str, Any]]]:  # type: ignore[no-untyped-def]
    """An artifact store on every backend (a local directory, a real S3 server) and how to open it again."""
    if request.param == "local":
        spec: dict[str, Any] = {"root": str(tmp_path / "artifacts")}
        yield LocalStore(spec["root"]), spec
        return
    server: SeaweedFSServer = request.getfixturevalue("seaweedfs")
    spec = {"endpoint": server.endpoint, "access_key": server.access_key, "secret_key": server.secret_key,
            "bucket": unique_bucket_name("registry"), "prefix": "tunefleet"}
    yield S3Store(spec["endpoint"], spec["access_key"], spec["secret_key"], spec["bucket"], prefix=spec["prefix"]), spec


def _measured(db: Database, workloads: list[Any]) -> set[int]:
    """The mlp traces measured on x86; the ids an export writes as rows (the bogus trace is skipped)."""
    ids = _setup(db, workloads)
    db.commit_measurements(_first_batch(ids, workloads))
    return {m.id for m in db.measurements() if m.trace_json != BOGUS_TRACE}


def test_an_export_killed_before_its_commit_is_never_read_and_is_collected(
        db_url: str, store_spec: tuple[ArtifactStore, dict[str, Any]], mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.learning import artifacts

    store, spec = store_spec
    db = Database(db_url)
    rows = _measured(db, mlp_workloads)
    child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps({**spec, "db": db_url})],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 137, child.stderr[-3000:]
    orphans = list(store.list("datasets/"))
    assert any(k.endswith("/manifest.json") for k in orphans), "the killed export wrote its files and manifest"
    assert {m.id for m in db.unexported_measurements()} >= rows, "its rows stay unmarked"

    v = dataset.export(db, store)  # the next export takes them
    assert v is not None and v.complete
    table = dataset.load(db, store)
    exported = table["measurement_id"].to_pylist()
    assert len(exported) == len(set(exported)), "a measurement is read twice: retraining would see it twice"
    assert set(exported) == rows
    assert [x.version for x in dataset.list_versions(db, include_incomplete=False)] == [v.version]

    # The killed export's files are garbage: kept during the grace period, then collected.
    now = dt.datetime.now(dt.timezone.utc)
    kept = artifacts.collect(db, store, grace=dt.timedelta(days=1))
    assert kept.deleted == [] and set(orphans) <= set(store.list("datasets/"))
    later = now + dt.timedelta(days=2)
    dry = artifacts.collect(db, store, grace=dt.timedelta(days=1), dry_run=True, now=later)
    assert sorted(k for unit in dry.deleted for k in unit.keys) == sorted(orphans)
    assert set(orphans) <= set(store.list("datasets/")), "a dry run deletes nothing"
    done = artifacts.collect(db, store, grace=dt.timedelta(days=1), now=later)
    assert [u.name for u in done.deleted] == [u.name for u in dry.deleted]
    assert not set(orphans) & set(store.list("datasets/"))
    assert dataset.load(db, store)["measurement_id"].to_pylist() == exported, "the registered version is untouched"
    db.close()


@pytest.mark.parametrize("reachable", [False, True], ids=["db-down-at-cleanup", "db-back-at-cleanup"])
def test_a_lost_commit_acknowledgement_keeps_the_registered_files(
        db_url: str, store_spec: tuple[ArtifactStore, dict[str, Any]], mlp_workloads, reachable: bool) -> None:  # type: ignore[no-untyped-def]
    store, _ = store_spec
    direct = Database(db_url)
    rows = _measured(direct, mlp_workloads)
    with cut_off_database(db_url) as (db, outage):
        db.update_dataset = outage.lose_ack(db.update_dataset, then_down=not reachable)  # type: ignore[method-assign]
        if reachable:  # the database answers again by the clean-up: it says the version is registered
            version = dataset.export(db, store)
            assert version is not None and version.version == 1 and version.complete
        else:
            with pytest.raises(DatabaseUnavailableError) as err:
                dataset.export(db, store)
            assert "\n" not in str(err.value)
            outage.up()
        assert outage.lost_acks == 1

    # The commit went through: v1 is registered, its files are where its manifest says.
    (v1,) = dataset.list_versions(direct)
    assert v1.complete and v1.version == 1
    exported = dataset.load(direct, store)["measurement_id"].to_pylist()
    assert sorted(exported) == sorted(rows), "the rows the database says v1 took are in no readable dataset"
    assert direct.unexported_measurements() == [] and dataset.export(direct, store) is None
    direct.close()
