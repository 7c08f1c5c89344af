"""The fault-injection suite: two CLI workers tune small shards on PostgreSQL while faults land.

A seeded schedule (printed, so a failure can be replayed with ``TUNEFLEET_FAULT_SEED``) injects,
while the workers run: kill -9 of a worker (its replacement starts at once), connection drops
of the database through a TCP proxy, an S3 outage in the middle of a dataset export and of a
cost-model retrain (both started by the loop, both cut off after their first write), a node
fault (a third worker whose C++ compiler stops working while it tunes), an export killed between
its upload and its commit (``os._exit`` in a child process, no clean-up), an S3 blip while a
retrain reads the current cost model, and a hung tuning thread (a worker's measuring process
stopped with SIGSTOP for a few leases, then let go). The loop runs until every shard ended.
Then: every shard is done (done-short only where its search space ran out, recorded as such);
nothing was measured twice (no commit refused a row as a duplicate, no (workload, trace) stored
twice); no measurement the test saw committed is missing; no candidate error came from the broken
compiler; every measured candidate is in exactly one dataset version; and the blipped retrain
promoted nothing.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tunefleet.db import Database
from tunefleet.db.tables import utcnow
from tunefleet.errors import TransientError
from tunefleet.planning import shard_queue
from tunefleet.testing.compiler import BROKEN_MESSAGE, Compiler
from tunefleet.testing.postgres import PostgresServer
from tunefleet.testing.seaweedfs import SeaweedFSServer, unique_bucket_name
from tunefleet.testing.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: a fault loop with leases of seconds

WORKERS = 2
LEASE_S = 3
HANG_MIN_S = 2 * LEASE_S + 1  # a hung worker's runner stays stopped at least this long
HANG_MAX_S = 6 * LEASE_S  # and at most this long
# The whole loop takes about two minutes on 2 quiet cores of the fastest VM and about four on the
# slowest (a run of 240.3 s failed a 240 s limit there): a hung loop is caught by its stall, a slow
# machine only by the cap. Neither counts the time when every open shard waits out a lost lease's
# backoff (5 s, 10 s, 20 s ...): on a loaded CI machine one shard lost six leases in a row (kills
# and a tuning thread slower than the 3 s lease) and its 40 s and 80 s waits read as a stall.
RUN_LIMIT_S = 420
NODE_LEASE_S = 60  # how long the node-fault worker may take to start and lease (slow VMs, loaded)
STALL_LIMIT_S = 120  # no measurement committed, no shard closed and none leased for this long: stuck



@dataclass
class Faults:
    """What the loop injected and what it saw survive."""

    seed: int
    kills: int = 0
    drops: int = 0
    connections_cut: int = 0
    export_outages: int = 0
    retrain_outages: int = 0
    node_faults: int = 0
    exports_killed: int = 0
    retrain_blips: int = 0
    hangs: int = 0
    transient_seen: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"fault seed {self.seed}: {self.kills} kill -9, {self.drops} database connection drops "
                f"({self.connections_cut} connections cut), S3 outages during {self.export_outages} export(s) "
                f"and {self.retrain_outages} retrain(s), {self.node_faults} node fault(s), {self.exports_killed} "
                f"export(s) killed before their commit, {self.retrain_blips} S3 blip(s) on the current cost model, "
                f"{self.hangs} hung tuning thread(s)")


class Fleet:
    """Worker processes running ``tunefleet tune`` against the proxied database."""

    def __init__(self, env: dict[str, str], log_dir: Path, seed: int) -> None:
        self.env, self.log_dir, self.seed = env, log_dir, seed
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.last_start = 0.0
        self.hung: subprocess.Popen[bytes] | None = None
        self.hung_s = 0.0

    def start(self, **env: str) -> subprocess.Popen[bytes]:
        self.started += 1
        self.last_start = time.monotonic()
        log = open(self.log_dir / f"worker-{self.started}.log", "wb")  # noqa: SIM115 - kept open by the child
        proc = subprocess.Popen(
            [sys.executable, "-m", "tunefleet.cli.app", "tune", "--hardware", "x86", "--lease-s", str(LEASE_S),
             "--trials-per-iter", "4", "--seed", str(self.seed + self.started)],
            env={**self.env, **env}, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def hang_one(self, rng: random.Random, db: Database, spare: subprocess.Popen[bytes] | None = None) -> bool:
        """Stop the measuring process (MetaSchedule's runner worker) of a worker that holds a lease:
        its tuning thread waits on a run that does not return, while its heartbeat thread lives.
        Let go once the worker's log says its heartbeat stopped renewing, or after ``HANG_MAX_S``
        (the assertion then fails), but never before ``HANG_MIN_S``: a worker stopped while it
        searched or built meets the stopped runner only later. False if no worker could be
        stopped, or the stopped one ended meanwhile (try again later)."""
        holders = self.lease_holders(db)
        alive = [p for p in self.alive() if p is not spare and p.pid in holders]
        for proc in rng.sample(alive, len(alive)):
            try:
                runners = [c for c in psutil.Process(proc.pid).children(recursive=True)
                           if "tvm.exec.popen_worker" in " ".join(c.cmdline())]
            except psutil.Error:
                continue
            if not runners:
                continue
            stuck_before = self.log_of(proc).count("looks stuck")
            started = time.monotonic()
            for r in runners:
                r.suspend()
            while time.monotonic() - started < HANG_MAX_S and proc.poll() is None:
                time.sleep(0.5)
                if time.monotonic() - started >= HANG_MIN_S and self.log_of(proc).count("looks stuck") > stuck_before:
                    break
            for r in runners:
                with contextlib.suppress(psutil.Error):
                    r.resume()
            self.hung, self.hung_s = proc, time.monotonic() - started
            return proc.poll() is None
        return False

    @staticmethod
    def lease_holders(db: Database) -> set[int]:
        """The pids that hold a lease (an owner is ``host:pid:token``, ``worker_owner``)."""
        return {_owner_pid(s.lease_owner) for s in shard_queue.list_shards(db)
                if s.state == "leased" and s.lease_owner}

    def wait_for_lease(self, proc: subprocess.Popen[bytes], db: Database, timeout_s: float) -> bool:
        """Whether ``proc`` holds a lease within ``timeout_s`` (False as soon as it exits)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and proc.poll() is None:
            if proc.pid in self.lease_holders(db):
                return True
            time.sleep(0.2)
        return False

    def stop_one(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)

    def kill_one(self, rng: random.Random, spare: subprocess.Popen[bytes] | None = None) -> bool:
        alive = [p for p in self.alive() if p is not spare]
        if not alive:
            return False
        victim = rng.choice(alive)
        os.killpg(victim.pid, signal.SIGKILL)  # the worker and its builder/runner processes
        victim.wait(30)
        return True

    def stop(self) -> None:
        for p in self.alive():
            self.stop_one(p)

    def logs(self, full: bool = False) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[None if full else -3000:]}"
                         for p in sorted(self.log_dir.glob("worker-*.log")))

    def log_of(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.log_dir / f"worker-{self.procs.index(proc) + 1}.log").read_text(errors="replace")


def _owner_pid(owner: str) -> int:
    """The pid in a lease owner (``host:pid:token``, ``worker_owner``)."""
    return int(owner.split(":")[1])


def _histories_of(proc: subprocess.Popen[bytes] | None, shards: list[Any]) -> dict[int, list[Any]]:
    """The history of every shard ``proc`` ever leased (a diagnostic for a failed assertion)."""
    if proc is None:
        return {}
    return {s.id: s.history for s in shards
            if any(h.get("owner") and _owner_pid(h["owner"]) == proc.pid for h in s.history)}


class _CutOnWrite:
    """The store, with S3 cut off (through its proxy) just before the first object written through
    ``put_bytes``: an export has written its Parquet parts by then and a retrain its training."""

    def __init__(self, store: Any, proxy: TcpProxy) -> None:
        self.store, self.proxy = store, proxy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def put_bytes(self, *args: Any, **kwargs: Any) -> Any:
        self.proxy.pause()
        return self.store.put_bytes(*args, **kwargs)


class _CutOnRead:
    """The store, with S3 cut off for the one read of ``key`` (the current cost model's file)."""

    def __init__(self, store: Any, proxy: TcpProxy, key: str) -> None:
        self.store, self.proxy, self.key = store, proxy, key

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def get_bytes(self, key: str) -> bytes:
        if key == self.key:
            self.key = ""
            self.proxy.pause()
        return self.store.get_bytes(key)


#: A child process exporting a dataset with the worker's settings (the environment) that dies
#: like kill -9 (no clean-up) after it uploaded its files, before the database commit.
_KILLED_EXPORT = r"""
import os
from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.learning import dataset
from tunefleet.store import open_store

settings = load_settings()
db = Database.from_settings(settings)
db.update_dataset = lambda *args, **kwargs: os._exit(137)
dataset.export(db, open_store(settings), hardware="x86")
os._exit(3)  # nothing new to export (a retrain just exported it all): nothing to kill
"""

def _outage_during(store: Any, proxy: TcpProxy, work: Any, cut: Any = None) -> str:
    """Run ``work(store)`` with S3 cut off mid-way (on the first write, or as ``cut`` wraps the
    store); the transient error it ended with ("" if none)."""
    try:
        work(cut(store) if cut is not None else _CutOnWrite(store, proxy))
        return ""
    except TransientError as exc:
        return str(exc).splitlines()[0]
    finally:
        proxy.resume()


# The loop's own limits fail it with the fleet's logs first: its 420 s of active time, plus the
# backoffs it waits out (a shard's sixth and seventh losses in a row: 80 s and 160 s), plus setup.
@pytest.mark.timeout(RUN_LIMIT_S + 600)
def test_fleet_survives_injected_faults(pg_server: PostgresServer, seaweedfs: SeaweedFSServer, tmp_path: Path) -> None:
    from tunefleet.config import load_settings
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.learning import costmodel, dataset
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract
    from tunefleet.store import open_store

    seed = int(os.environ.get("TUNEFLEET_FAULT_SEED", "0")) or random.SystemRandom().randrange(1, 10**6)
    rng = random.Random(seed)
    faults = Faults(seed)
    print(f"\nfault schedule seed {seed} (replay with TUNEFLEET_FAULT_SEED={seed})")

    name = pg_server.create_database()
    direct_url = pg_server.url(name)
    with TcpProxy("127.0.0.1", pg_server.port) as pg_proxy, TcpProxy(
            "127.0.0.1", int(seaweedfs.endpoint.rsplit(":", 1)[1])) as s3_proxy:
        env = {
            **os.environ,
            "TUNEFLEET_HOME": str(tmp_path / "home"),
            "TUNEFLEET_DATABASE_URL": direct_url.replace(f":{pg_server.port}/", f":{pg_proxy.port}/"),
            "TUNEFLEET_DB_CONNECT_TIMEOUT_S": "2",
            "TUNEFLEET_STORE": "s3",
            "TUNEFLEET_S3_ENDPOINT": f"127.0.0.1:{s3_proxy.port}",
            "TUNEFLEET_S3_ACCESS_KEY": seaweedfs.access_key,
            "TUNEFLEET_S3_SECRET_KEY": seaweedfs.secret_key,
            "TUNEFLEET_S3_BUCKET": unique_bucket_name("faults"),
            "TUNEFLEET_S3_TIMEOUT_S": "2",
            "TUNEFLEET_S3_RETRIES": "0",
            "TUNEFLEET_LOG_LEVEL": "INFO",
        }
        settings = load_settings(home=tmp_path / "home", database_url=direct_url, store="s3",
                                 s3_endpoint=env["TUNEFLEET_S3_ENDPOINT"], s3_access_key=seaweedfs.access_key,
                                 s3_secret_key=seaweedfs.secret_key, s3_bucket=env["TUNEFLEET_S3_BUCKET"],
                                 s3_timeout_s=2.0, s3_retries=0)
        db = Database.from_settings(settings)  # the test's own connection, not through the proxy
        seed_hardware_classes(db, settings)
        store = open_store(settings)
        model = ingest(db, store, "mlp").model
        extract(db, store, model, "x86")
        # Shards are planned as the loop goes, 8 trials (a shard) per workload at a time, while faults
        # are left to inject: the loop lasts as long as its schedule, whatever the machine's speed.
        target = 16
        planned, _ = shard_queue.plan(db, "x86", target_trials=target, shard_trials=8, model=model.id)
        assert len(planned) == 6

        fleet = Fleet(env, tmp_path, seed)
        seen: dict[int, str] = {}  # every measurement the test saw committed
        schedule = ["kill", "kill", "kill", "drop", "drop", "drop", "node", "export-kill", "hang"]
        rng.shuffle(schedule)
        at = sorted(rng.sample(range(len(schedule) + 1), 3))  # the export first, the retrains later
        schedule.insert(at[0], "export")
        schedule.insert(at[1] + 1, "retrain")
        schedule.insert(at[2] + 2, "retrain-blip")
        compiler = Compiler(tmp_path)  # the node-fault worker's C++ compiler: working until it breaks
        node_worker: subprocess.Popen[bytes] | None = None
        node_broken = False  # its compiler broke and it has not been quarantined yet
        hw_id = db.hardware_class("x86").id
        print("schedule:", ", ".join(schedule))
        started = time.monotonic()
        # (measurements, open shards, leases granted) and when they last moved; time every open shard
        # spends waiting out a lost lease's backoff is the queue's design, not a stall or slowness
        last_progress, progressed_at, last_poll, backoff_s = (-1, -1, -1), started, started, 0.0
        next_fault = started + rng.uniform(3, 5)
        try:
            for _ in range(WORKERS):
                fleet.start()
            while True:
                polled_at = time.monotonic()
                shards = shard_queue.list_shards(db)
                open_shards = [s for s in shards if s.state in ("pending", "leased")]
                if node_broken and node_worker is not None:
                    if "quarantined for x86" in fleet.log_of(node_worker):
                        node_broken = False
                    elif node_worker.poll() is not None:
                        # It ended without building after the break (seed 292735: its lease lapsed
                        # while a round's search outlasted the 3 s lease on a loaded machine, and it
                        # found nothing leasable after): it never met its broken compiler. Again.
                        print(f"  t={time.monotonic() - started:5.1f}s the worker whose compiler broke ended "
                              "before it built anything: a node fault again")
                        compiler.repair()
                        node_worker, node_broken = None, False
                        schedule.insert(0, "node")
                if (schedule or node_broken) and len(open_shards) < 4:
                    target += 8
                    open_shards += shard_queue.plan(db, "x86", target_trials=target, shard_trials=8, model=model.id)[0]
                polled = db.measurements()
                progress = (len(polled), len(open_shards), sum(s.lease_generation for s in shards))
                if progress != last_progress:
                    last_progress, progressed_at = progress, polled_at
                seen.update({m.id: m.trace_sha256 for m in polled})
                if not open_shards:
                    break
                now = utcnow()  # the database's clock is this host's: one instant for every shard
                if all(s.state == "pending" and s.not_before is not None and s.not_before > now for s in open_shards):
                    waited = polled_at - max(progressed_at, last_poll)
                    backoff_s += waited
                    progressed_at += waited
                last_poll = polled_at
                assert polled_at - progressed_at < STALL_LIMIT_S, (
                    f"no progress for {STALL_LIMIT_S} s, shards still open: {open_shards}\n{fleet.logs()}")
                assert polled_at - started - backoff_s < RUN_LIMIT_S, (
                    f"shards still open after {RUN_LIMIT_S} s ({backoff_s:.0f} s more waiting out lost leases' "
                    f"backoffs): {open_shards}\n{fleet.logs()}")
                # A worker that found nothing leasable (shards leased, or waiting out a lost lease's
                # backoff) exits: keep two, starting at most one every few seconds.
                if len(fleet.alive()) < WORKERS and time.monotonic() - fleet.last_start > 3:
                    fleet.start()
                if schedule and time.monotonic() >= next_fault:
                    kind = schedule.pop(0)
                    if kind == "kill" and fleet.kill_one(rng, spare=node_worker):
                        faults.kills += 1
                        print(f"  t={time.monotonic() - started:5.1f}s kill -9 a worker")
                    elif kind == "drop":
                        pg_proxy.pause()
                        time.sleep(rng.uniform(0.5, 3.0))
                        pg_proxy.resume()
                        faults.drops += 1
                        print(f"  t={time.monotonic() - started:5.1f}s database connections dropped")
                    elif kind in ("export", "retrain", "retrain-blip", "export-kill") and not polled:
                        schedule.insert(0, kind)  # nothing to export yet: try again at the next fault time
                    elif kind in ("retrain", "retrain-blip") and \
                            len({m.workload_id for m in polled if m.mean_run_s is not None}) < 2:
                        # A cost model holds whole workloads out: it needs two measured ones (seed 161903
                        # retrained with one and failed on that, not on the outage). Try again later.
                        schedule.insert(0, kind)
                    elif kind == "export":
                        err = _outage_during(store, s3_proxy, lambda st: dataset.export(db, st, hardware="x86"))
                        faults.export_outages += bool(err)
                        faults.transient_seen.append(err)
                        print(f"  t={time.monotonic() - started:5.1f}s S3 outage during an export: {err or 'got through'}")
                    elif kind == "retrain":
                        dataset.export(db, store, hardware="x86")
                        err = _outage_during(store, s3_proxy, lambda st: costmodel.retrain(db, st, "x86"))
                        faults.retrain_outages += bool(err)
                        faults.transient_seen.append(err)
                        print(f"  t={time.monotonic() - started:5.1f}s S3 outage during a retrain: {err or 'got through'}")
                    elif kind == "retrain-blip":
                        dataset.export(db, store, hardware="x86")
                        if db.current_cost_model(hw_id) is None:  # the cut retrain promoted nothing
                            costmodel.retrain(db, store, "x86")
                        current = db.current_cost_model(hw_id)
                        if current is None:  # not promoted (too few rows yet): try again later
                            schedule.insert(0, kind)
                        else:
                            key = store.key_from_uri(current.artifact_uri)
                            err = _outage_during(store, s3_proxy, lambda st: costmodel.retrain(db, st, "x86"),
                                                 cut=lambda st, key=key: _CutOnRead(st, s3_proxy, key))
                            after = db.current_cost_model(hw_id)
                            faults.retrain_blips += bool(err) and after is not None and after.id == current.id
                            faults.transient_seen.append(err)
                            print(f"  t={time.monotonic() - started:5.1f}s S3 blip while a retrain read the current "
                                  f"model: {err or 'got through'}")
                    elif kind == "export-kill":
                        child = subprocess.run([sys.executable, "-c", _KILLED_EXPORT], check=False, env=env, capture_output=True,
                                               text=True, timeout=120)
                        if child.returncode == 3:
                            schedule.insert(0, kind)  # nothing new to export yet: try again later
                        else:
                            faults.exports_killed += child.returncode == 137
                            print(f"  t={time.monotonic() - started:5.1f}s an export killed before its commit "
                                  f"(exit {child.returncode})")
                            if child.returncode != 137:
                                print(child.stderr)
                    elif kind == "node":
                        # Its compiler breaks once it holds a lease: broken before, the worker's probe
                        # refuses to lease at all (seed 763661 broke it after a fixed 2 s, before a
                        # slow start reached its first lease: nothing was quarantined).
                        node_worker = fleet.start(CXX=str(compiler.path))
                        if fleet.wait_for_lease(node_worker, db, NODE_LEASE_S):
                            compiler.break_it()
                            node_broken = True
                            print(f"  t={time.monotonic() - started:5.1f}s the compiler of a third worker broke")
                        else:  # nothing leasable for it now: stop it, try again at the next fault time
                            fleet.stop_one(node_worker)
                            node_worker = None
                            schedule.insert(0, kind)
                    elif kind == "hang":
                        if fleet.hang_one(rng, db, spare=node_worker):
                            faults.hangs += 1
                            print(f"  t={time.monotonic() - started:5.1f}s a worker's measuring process stopped for "
                                  f"{fleet.hung_s:.0f} s")
                        else:
                            schedule.insert(0, kind)  # no worker holding a lease with a runner: try again later
                    next_fault = time.monotonic() + rng.uniform(1.5, 3)
                time.sleep(0.5)
        finally:
            fleet.stop()
            faults.connections_cut = pg_proxy.connections_cut

        if node_worker is not None and "quarantined for x86" in fleet.log_of(node_worker):
            faults.node_faults = 1
        print(faults.line())
        assert not schedule, f"the shards ended before these faults were injected: {schedule}"
        assert (faults.kills, faults.drops, faults.export_outages, faults.retrain_outages) == (3, 3, 1, 1), \
            faults.transient_seen
        assert (faults.exports_killed, faults.retrain_blips, faults.hangs) == (1, 1, 1), faults.transient_seen
        assert faults.node_faults == 1, (
            f"the worker whose compiler broke was not quarantined; its shards' histories: "
            f"{_histories_of(node_worker, shard_queue.list_shards(db))}\n{fleet.logs()}")
        assert fleet.hung is not None and "looks stuck" in fleet.log_of(fleet.hung), \
            f"the hung worker's heartbeat never stopped renewing\n{fleet.logs()}"
        final = shard_queue.list_shards(db)
        bad = [(s.id, s.state, s.error) for s in final
               if s.state != "done" or (s.history[-1]["event"] == "done-short" and s.history[-1].get("cause") != "exhausted")]
        assert not bad, f"shards not done: {bad}\n{fleet.logs()}"
        rows = db.measurements()
        stored = {m.id: m.trace_sha256 for m in rows}
        assert not [m.id for m in rows if BROKEN_MESSAGE in (m.error_msg or "")], \
            "a node fault was stored as candidate errors"
        assert seen.items() <= stored.items(), "a committed measurement was lost"
        twice = [k for k, n in Counter((m.workload_id, m.trace_sha256) for m in rows).items() if n > 1]
        assert not twice
        refused = [(s.id, e) for s in final for e in s.history or [] if e.get("duplicates")]
        assert not refused, f"commits refused candidates committed before (by a sibling shard?): {refused}"
        dataset.export(db, store, hardware="x86")  # the S3 outages lost nothing: one more export takes the rest
        assert db.unexported_measurements(db.hardware_class("x86").id) == []
        marks = {m: outcome for d in db.datasets() for m, outcome in db.dataset_marks(d.id).items()}
        exported = dataset.load(db, store).column("measurement_id").to_pylist()
        assert len(exported) == len(set(exported)), "a measurement is in two dataset versions"
        assert set(exported) == {m for m, outcome in marks.items() if outcome == "row"}
        assert set(marks) == set(stored), "every measured candidate is in a dataset version or listed as skipped"
        lost = sum(s.lost_leases for s in final)
        print(f"survived: {len(final)} shards done, {lost} lost lease(s) ({backoff_s:.0f} s waiting out backoffs), "
              f"{len(stored)} measurements stored, "
              f"{sum(1 for m in rows if m.error_kind == 'crash')} crash record(s), "
              f"{len(db.datasets())} dataset version(s); lost: 0 committed rows, 0 measured twice, 0 unexported")
        db.close()
