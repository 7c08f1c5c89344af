"""A bad node is not a bad candidate (issue 34, item 2), on SQLite and PostgreSQL.

The node fault is real: the runner links every built module with the C++ compiler that ``CXX``
names (TVM's ``load_module`` of a ``.tar``), here a script that runs the system's compiler until a
test breaks it ("the compiler made unavailable for one worker"). A candidate fault is a batch
whose every candidate failed while the workload's default schedule builds and runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import on_backend
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import START_FAILURES, Backoff, drain
from tunefleet.errors import NodeFaultError
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.testing.compiler import Compiler
from tunefleet.vocab import BUILD_ERROR, DONE, PENDING

pytestmark = pytest.mark.serial  # probes and backoffs against leases of seconds

NO_WAIT = Backoff(factor=0)


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Compiler:
    """The compiler of the processes this test starts (``CXX``; ``CC`` unset)."""
    cxx = Compiler(tmp_path)
    monkeypatch.setenv("CXX", str(cxx.path))
    monkeypatch.delenv("CC", raising=False)
    return cxx


def _one_shard(db: Any, store: Any, trials: int) -> Any:
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    shard, *others = shard_queue.plan(db, "x86", target_trials=trials, shard_trials=trials, model=model.id)[0]
    shard_queue.cancel(db, [s.id for s in others])
    return shard


@pytest.mark.slow
@on_backend("postgresql")
def test_a_node_that_cannot_link_is_quarantined_and_its_shard_goes_back_unspent(
        engine, compiler: Compiler, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    _, db, store = engine
    shard = _one_shard(db, store, trials=12)
    batches: list[tuple[int | None, int]] = []

    def on_batch(shard_id: int | None, rows: list[Any]) -> None:
        batches.append((shard_id, len(rows)))
        compiler.break_it()  # after the first batch: every later candidate fails to link

    options = TuneOptions(seed=0, trials_per_iter=4, warm_start_shapes=False)
    with pytest.raises(NodeFaultError) as err:
        drain(db, "x86", options, on_batch=on_batch, backoff=NO_WAIT)
    message = str(err.value)
    assert "\n" not in message and "quarantined for x86" in message and "compiler not installed" in message
    assert f"{START_FAILURES} probes in a row" in message
    ((batch_shard, committed),) = batches
    assert batch_shard == shard.id

    after = db.shard(shard.id)
    assert (after.state, after.leases) == (PENDING, 0), after.history  # given back: no attempt spent
    given = [e for e in after.history if e["event"] == "given-back"]
    assert len(given) == 1 and "default schedule" in given[0]["reason"], after.history
    rows = [m for m in db.measurements() if m.shard_id == shard.id]
    assert len(rows) == committed and all(m.error_kind is None for m in rows)  # the failed batch: nothing stored
    assert any("quarantined for x86" in r.getMessage() for r in caplog.records)

    compiler.repair()  # the node fixed: a new worker probes, leases and finishes the shard
    summary = drain(db, "x86", options, backoff=NO_WAIT)
    after = db.shard(shard.id)
    assert (summary.shards_done, after.state) == (1, DONE)
    rows = [m for m in db.measurements() if m.shard_id == shard.id]
    assert len(rows) == 12 and all(m.error_kind is None for m in rows)


@on_backend("sqlite")  # the probe fails before any database write: one backend (contract suite: both)
def test_a_worker_on_a_node_that_cannot_link_never_leases(engine, compiler: Compiler) -> None:  # type: ignore[no-untyped-def]
    """The probe before the first lease (a small kernel, built and run): nothing is touched."""
    _, db, _ = engine
    hw = db.hardware_class("x86")
    wl, _ = db.add_workload(structural_hash="00cd", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    compiler.break_it()
    with pytest.raises(NodeFaultError) as err:
        drain(db, "x86", TuneOptions(seed=0), backoff=NO_WAIT)
    assert "cannot build or run code for x86: run failed: " in str(err.value)
    after = db.shard(shard.id)
    assert (after.state, after.leases, [e["event"] for e in after.history]) == (PENDING, 0, ["planned"])


def test_a_batch_that_fails_on_a_healthy_node_is_stored_as_candidate_errors(engine) -> None:  # type: ignore[no-untyped-def]
    """The commit path's rule, with the real probe: the default schedule builds and runs here, so
    a batch whose every candidate failed is the candidates' fault and its errors are stored; a
    probe that fails stores nothing."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.builder import PersistentBuilder
    from tunefleet.tvm.commit import CandidateCommitter, CommitCallback
    from tunefleet.tvm.probe import probe
    from tunefleet.tvm.runner import make_runner
    from tunefleet.tvm.targets import make_target

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    wl = db.workloads(model.id)[0][0]
    mod, target = tvm.ir.load_json(wl.tir_json), make_target(hw.target)
    sch = tvm.s_tir.Schedule(mod)
    cands = [ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(mod["main"]))]
    failed = [ms.builder.BuilderResult(None, "LLVM ERROR: a schedule the compiler rejects")]
    no_run = [ms.runner.RunnerResult(None, None)]

    builder, runner = PersistentBuilder(max_workers=1), make_runner(target)
    try:
        healthy = CommitCallback(CandidateCommitter(db, wl.id, hw.id),
                                 node_check=lambda: probe(target, builder, runner, mod))
        healthy._apply(cands, failed, no_run)
    finally:
        builder.shutdown()
    (row,) = db.measurements()
    assert (row.error_kind, row.workload_id) == (BUILD_ERROR, wl.id)

    broken = CommitCallback(CandidateCommitter(db, wl.id, hw.id), node_check=lambda: "run failed: no compiler")
    with pytest.raises(NodeFaultError, match="no compiler"):
        broken._apply(cands, failed, no_run)
    assert len(db.measurements()) == 1  # nothing more stored


@on_backend("postgresql")  # the metric is pushed before any database write
def test_a_quarantine_is_a_metric_on_the_pushgateway(engine, compiler: Compiler) -> None:  # type: ignore[no-untyped-def]
    import socket
    import urllib.request

    from tunefleet.testing.prometheus import PushgatewayServer

    _, db, _ = engine
    wl, _ = db.add_workload(structural_hash="00ad", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    db.add_shards(db.hardware_class("x86").id, [(wl.id, 4, 1.0)])  # a worker with nothing to lease probes nothing
    server = PushgatewayServer()
    server.start()
    try:
        compiler.break_it()
        with pytest.raises(NodeFaultError):
            drain(db, "x86", TuneOptions(seed=0, metrics_pushgateway=server.address), backoff=NO_WAIT)
        text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
    finally:
        server.stop()
    line = next(x for x in text.splitlines() if x.startswith("tunefleet_node_quarantined{"))
    assert 'hardware="x86"' in line and f'node="{socket.gethostname()}"' in line and line.endswith(" 1")


@on_backend("sqlite")
def test_a_quarantined_worker_whose_probe_passes_again_goes_on(engine, compiler: Compiler,  # type: ignore[no-untyped-def]
                                                               caplog: pytest.LogCaptureFixture) -> None:
    _, db, store = engine
    shard = _one_shard(db, store, trials=4)
    compiler.break_it()

    class Repaired(Backoff):
        """The node is fixed while the quarantined worker waits to probe again."""

        def delay(self, n: int) -> float:
            compiler.repair()
            return 0.0

    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=4, warm_start_shapes=False), backoff=Repaired())
    assert (summary.shards_done, db.shard(shard.id).state) == (1, DONE)
    said = [r.getMessage() for r in caplog.records]
    assert any("quarantined for x86" in m for m in said) and any("no longer quarantined for x86" in m for m in said)
