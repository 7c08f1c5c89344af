"""Cost models under faults (issue 34, items 1 and 5), on SQLite and PostgreSQL, with a local
directory and a real S3 server (SeaweedFS, cut off through a TCP proxy).

Item 1 — the store and the database agree: a retrain whose registering commit went through but
whose acknowledgement was lost never deletes the file of the model the database registered (and
maybe promoted), nor the registration itself.

Item 5 — a blip is not a verdict: a store error while reading the current model, during a retrain
or in a worker, is transient: the retrain fails with one line instead of promoting the new model
as if the current one were unusable, and a worker reads the model again at its next shard instead
of marking it unreadable for good. A model that really is unreadable is still replaced (retrain)
or skipped (worker).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest

from tests.costmodel.test_costmodel import synthetic
from tests.faults.outages import cut_off_database
from tunefleet.db import Database
from tunefleet.errors import ArtifactStoreUnavailableError, DatabaseUnavailableError, TransientError
from tunefleet.learning import costmodel
from tunefleet.store import ArtifactStore, LocalStore, S3Store
from tunefleet.testing.seaweedfs import SeaweedFSServer, unique_bucket_name
from tunefleet.testing.tcp_proxy import TcpProxy
from tunefleet.tvm.targets import host_cpu_target


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return synthetic()



class Blips:
    """A store whose reads of chosen keys can be made to fail once: a real outage on S3 (the
    proxy is cut off for that one read), a simulated one on the local directory (it has none)."""

    def __init__(self, store: ArtifactStore, proxy: TcpProxy | None) -> None:
        self.store, self.proxy = store, proxy
        self.keys: set[str] = set()
        self.fired: list[str] = []
        self.reads: list[str] = []
        self._get = store.get_bytes
        store.get_bytes = self._get_bytes  # type: ignore[method-assign]

    def once(self, key: str) -> None:
        self.keys.add(key)

    def _get_bytes(self, key: str) -> bytes:
        self.reads.append(key)
        if key not in self.keys:
            return self._get(key)
        self.keys.discard(key)
        self.fired.append(key)
        if self.proxy is None:
            raise ArtifactStoreUnavailableError(f"cannot reach the store: connection reset while reading {key!r}")
        self.proxy.pause()
        try:
            return self._get(key)
        finally:
            self.proxy.resume()


@pytest.fixture(params=["local", "s3"])
def blips(request: pytest.FixtureRequest, tmp_path) -> Iterator[Blips]:  # type: ignore[no-untyped-def]
    if request.param == "local":
        yield Blips(LocalStore(tmp_path / "artifacts"), None)
        return
    server: SeaweedFSServer = request.getfixturevalue("seaweedfs")
    with TcpProxy("127.0.0.1", int(server.endpoint.rsplit(":", 1)[1])) as proxy:
        store = S3Store(f"127.0.0.1:{proxy.port}", server.access_key, server.secret_key,
                        unique_bucket_name("blips"), prefix="tunefleet", retries=1)
        yield Blips(store, proxy)


def _db(db_url: str) -> Database:
    db = Database(db_url)
    db.upsert_hardware_class("x86", host_cpu_target(2), "x86")
    return db


def _key(store: ArtifactStore, uri: str) -> str:
    return store.key_from_uri(uri)


# -- item 1: a lost acknowledgement ------------------------------------------------------------------
@pytest.mark.parametrize("reachable", [False, True], ids=["db-down-at-cleanup", "db-back-at-cleanup"])
def test_a_lost_acknowledgement_never_leaves_a_promoted_model_without_its_file(
        db_url: str, blips: Blips, table: pa.Table, reachable: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    store = blips.store
    direct = _db(db_url)
    hw = direct.hardware_class("x86").id
    first = costmodel.retrain(direct, store, "x86", table=table, holdout_fraction=0.3)
    assert first.promoted
    monkeypatch.setattr(costmodel, "_decide", lambda new, current, floor: (True, "the rule says promote"))
    with cut_off_database(db_url) as (db, outage):
        db.finish_cost_model = outage.lose_ack(db.finish_cost_model, then_down=not reachable)  # type: ignore[method-assign]
        if reachable:  # the database answers again by the clean-up: it says the model is registered
            second = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, seed=1)
            assert second.promoted and second.version == 2
        else:
            with pytest.raises(DatabaseUnavailableError) as err:
                costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, seed=1)
            assert "\n" not in str(err.value)
            outage.up()
        assert outage.lost_acks == 1

    current = direct.current_cost_model(hw)
    assert current is not None and current.version == 2, "the promotion the database committed is kept"
    loaded = costmodel.load_cost_model(direct, store, "x86")  # its file is there
    assert loaded is not None and loaded.version == 2
    assert [cm.version for cm, _ in direct.cost_models()] == [1, 2]
    direct.close()


# -- item 5: a blip while a retrain reads the current model ---------------------------------------
def test_a_store_blip_on_the_current_model_fails_the_retrain_instead_of_promoting(
        db_url: str, blips: Blips, table: pa.Table) -> None:
    store = blips.store
    db = _db(db_url)
    hw = db.hardware_class("x86").id
    first = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert first.promoted
    before = sorted(store.list("costmodels/"))

    blips.once(_key(store, first.artifact_uri))
    with pytest.raises(TransientError) as err:
        costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, seed=1)
    assert blips.fired == [_key(store, first.artifact_uri)]
    message = str(err.value)
    assert "\n" not in message and "current cost model v1 of x86" in message and "nothing was promoted" in message
    assert db.current_cost_model(hw).id == first.cost_model_id  # type: ignore[union-attr]
    assert [cm.version for cm, _ in db.cost_models()] == [1], "the failed retrain registered nothing"
    assert sorted(store.list("costmodels/")) == before, "and left no file behind"

    # The blip is over: the same retrain compares with the current model, and it is not better.
    again = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert not again.promoted and "does not beat current v1" in again.reason
    # A current model that really cannot be read is still replaced.
    store.put_bytes(_key(store, first.artifact_uri), b"not a model")
    fresh = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert fresh.promoted and "unusable" in fresh.reason
    db.close()


# -- item 5: a blip while a worker reads the current model ----------------------------------------
def test_a_worker_reads_the_current_model_again_after_a_blip(db_url: str, blips: Blips, table: pa.Table) -> None:
    from tunefleet.engine.worker import Tuner

    store = blips.store
    db = _db(db_url)
    first = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert first.promoted
    key = _key(store, first.artifact_uri)
    tuner = Tuner(db, "x86", store=store)

    blips.once(key)
    assert tuner.cost_model(db) is None, "this shard tunes without it"
    assert blips.fired == [key]
    model = tuner.cost_model(db)
    assert model is not None and model.version == 1, "the next shard reads it again"
    np.testing.assert_array_equal(model.predict(table.slice(0, 20)), first.model.predict(table.slice(0, 20)))
    reads = len(blips.reads)
    assert tuner.cost_model(db) is model and len(blips.reads) == reads, "then it is cached"

    # A model that really cannot be read is skipped, and not read again for every shard.
    second = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, seed=1)
    costmodel.promote_version(db, "x86", second.version)
    store.put_bytes(_key(store, second.artifact_uri), b"not a model")
    assert tuner.cost_model(db) is None
    reads = len(blips.reads)
    assert tuner.cost_model(db) is None and len(blips.reads) == reads
    db.close()
