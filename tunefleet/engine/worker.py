"""Workers: lease shard after shard of one hardware class and tune each, in one process or many.

A :class:`Tuner` keeps a class's builder, runner, online cost model and trained cost model alive
from shard to shard (each takes seconds to start); :func:`drain` runs a
:class:`~tunefleet.engine.loop.TuneLoop` with it in this process — leasing and tuning until no
shard is left, or, with a model-level budget (:class:`~tunefleet.planning.rounds.Rounds`), planning
the next round and going on with the same tuner until the budget is spent — and keeps a worker
going through faults that are not a shard's; :func:`tune_with_workers` runs ``drain`` in N local
processes that share only the database. The knobs of every shard come from one
:class:`~tunefleet.engine.options.TuneOptions`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import secrets
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunefleet.engine.loop import Refill, Stop, TuneLoop, TuneSummary, Wait
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.shard import ShardKit, ShardResult, run_shard
from tunefleet.errors import NodeFaultError, TransientError, TunefleetError, WorkerStartError
from tunefleet.planning import shard_queue
from tunefleet.planning.rounds import Deadline, Rounds, RoundsState
from tunefleet.planning.shard_queue import Backoff, LeaseLostError
from tunefleet.tvm.threads import class_threads
from tunefleet.vocab import LEASED, PENDING, TRANSIENT_RETRIES

if TYPE_CHECKING:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.store import ArtifactStore
    from tunefleet.tvm.commit import CandidateHook

log = logging.getLogger(__name__)


START_FAILURES = 3
"""Failed starts of the builder or runner in a row before a worker gives up: one failed fork is
a passing shortage (memory, process table), three in a row a node that cannot tune."""


def _wait(seconds: float) -> None:
    if seconds > 0:
        time.sleep(seconds)


OWNER_TOKEN_ENV = "TUNEFLEET_OWNER_TOKEN"
"""Where a process keeps its owner token, so the processes it starts share it (see :func:`worker_owner`)."""


def owner_token() -> str:
    """A random token made once per start of the outermost tunefleet process, inherited by the
    processes it starts (through the environment)."""
    token = os.environ.get(OWNER_TOKEN_ENV)
    if not token:
        token = os.environ[OWNER_TOKEN_ENV] = secrets.token_hex(6)
    return token


def worker_owner(pid: int | None = None) -> str:
    """The lease owner of this process (or of ``pid``, one it started): ``hostname:pid:token``.

    ``hostname:pid`` alone collides between containers that share a hostname (two in a pod,
    ``hostNetwork``, a restarted container whose process is pid 1 again); the token, random per
    start of the outermost process, tells them apart, while its children share it so that
    Ctrl-C can give their leases back by owner (:func:`tunefleet.cli.interrupt.stop_on_ctrl_c`).
    """
    return f"{socket.gethostname()}:{pid if pid is not None else os.getpid()}:{owner_token()}"


class Tuner:
    """The builder, runner and cost models of one hardware class, kept alive from shard to shard.

    Refuses a class this machine cannot measure, or one set up on another CPU
    (:func:`tunefleet.hardware.claim_for_this_cpu`). With an artifact ``store``, shards warm-start
    from (and filter with) the class's current trained cost model, reloaded when a newer one is
    promoted; a model that cannot be read is logged and the shard tunes without it.
    """

    def __init__(self, db: Database, hardware: str, options: TuneOptions | None = None, *,
                 store: ArtifactStore | None = None, builder: Any = None,
                 make_builder: Callable[[int], Any] | None = None) -> None:
        from tunefleet.hardware import claim_for_this_cpu

        hw = claim_for_this_cpu(db, hardware)
        self.hardware, self.hardware_class_id, self.target = hw.name, hw.id, dict(hw.target)
        self.threads = class_threads(hw.target)
        self.options = options or TuneOptions()
        self.store = store
        self._own_builder = builder is None
        self._make_builder = make_builder
        self._builder, self._runner, self._online = builder, None, None
        self._model: TrainedModel | None = None
        self._unreadable: int | None = None
        self._warned_no_filter = False
        self._shipped_broken = False
        self._deadline: Deadline | None = None
        self._probed = False
        self._in_hand: dict[str, int] = {}
        """owner -> the shard its last call leased, until that call returns its result."""

    def deadline(self, at: float) -> Deadline:
        """A :class:`Deadline` at ``at``, one per tuner, moved to ``at`` (for callers that lease one
        shard at a time, like the Prefect ``tune_shard`` task, and pass the deadline as a time)."""
        if self._deadline is None:
            self._deadline = Deadline(at)
        self._deadline.at = at
        return self._deadline

    @property
    def online_model(self) -> Any:
        """One MetaSchedule XGBModel learning every shard this tuner measures."""
        if self._online is None:
            from tunefleet.engine.shard import new_online_model

            self._online = new_online_model(self.threads)
        return self._online

    def cost_model(self, db: Database, options: TuneOptions | None = None) -> TrainedModel | None:
        """The class's current trained cost model (cached until another is promoted), else the
        shipped one (``pretrained_cost_model``), or None.

        A model that cannot be used (its file gone, or not a cost model) is skipped until another
        is promoted; one that cannot be *read* now (a transient store error) is read again at the
        next shard: a blip is not a verdict. Without an artifact store only the shipped model can
        be read.
        """
        options = options or self.options
        if not options.wants_trained_model:
            return None
        row = db.current_cost_model(self.hardware_class_id) if self.store is not None else None
        if row is None:
            self._model = None
            return self._shipped() if options.pretrained_cost_model else None
        if row.id == self._unreadable:
            return None
        if self._model is None or self._model.cost_model_id != row.id:
            from tunefleet.learning.costmodel import load_cost_model

            try:
                self._model = load_cost_model(db, self.store, self.hardware)
            except TransientError as exc:
                log.warning("current cost model v%s of %s cannot be read now, this shard tunes without it "
                            "(the next one reads it again): %s", row.version, self.hardware, str(exc).splitlines()[0])
                self._model = None
            except TunefleetError as exc:
                log.warning("current cost model v%s of %s cannot be loaded, tuning without it: %s",
                            row.version, self.hardware, str(exc).splitlines()[0])
                self._model, self._unreadable = None, row.id  # said once, not again for every shard
        return self._model

    def _shipped(self) -> TrainedModel | None:
        """The model shipped with tunefleet for the class's vector code; a broken installation's is said
        once and not used."""
        if self._shipped_broken:
            return None
        from tunefleet.learning.pretrained import shipped_model

        try:
            return shipped_model(target=self.target)
        except TunefleetError as exc:
            log.warning("tuning %s without a cost model: %s", self.hardware, str(exc).splitlines()[0])
            self._shipped_broken = True
            return None

    @property
    def builder(self) -> Any:
        if self._builder is None:
            if self._make_builder is not None:
                self._builder = self._make_builder(self.threads)
            else:
                from tunefleet.tvm.builder import PersistentBuilder

                self._builder = PersistentBuilder(max_workers=self.threads)
        return self._builder

    @property
    def runner(self) -> Any:
        if self._runner is None:
            from tunefleet.tvm.targets import make_target
            from tunefleet.tvm.threads import use_threads

            use_threads(self.threads)  # candidates are measured on the class's cores, as the model runs

            if self.options.parallel_measure:
                from tunefleet.tvm.parallel_runner import AdaptiveParallelRunner

                self._runner = AdaptiveParallelRunner(make_target(self.target), max_degree=self.options.parallel_max_degree)
            else:
                from tunefleet.tvm.runner import make_runner

                self._runner = make_runner(make_target(self.target))
        return self._runner

    def start(self) -> None:
        """Start the builder's and runner's processes now, before a shard is leased, so that one
        that cannot start never touches a shard; raises :class:`WorkerStartError` naming the cause
        (what started is stopped: the next call starts afresh). The first start (and the first
        after :meth:`close`) also probes the node (:func:`tunefleet.tvm.probe.probe`: a small
        kernel built and run with them) and raises :class:`NodeFaultError` when it cannot."""
        from tunefleet.tvm.targets import make_target

        try:
            if hasattr(self.builder, "warmup"):
                self.builder.warmup()
            runner = self.runner  # a LocalRunner starts its worker in its constructor
            if hasattr(runner, "warmup"):
                runner.warmup(make_target(self.target).kind.name == "llvm")
        except Exception as exc:  # whatever the fork or the import raised: the message names it
            self.close()
            raise WorkerStartError(f"the builder or runner of {self.hardware} could not start: "
                                   f"{type(exc).__name__}: {exc}") from exc
        if not self._probed:
            from tunefleet.tvm.probe import probe

            reason = probe(make_target(self.target), self.builder, self.runner)
            if reason is not None:
                self.close()
                raise NodeFaultError(f"this node cannot build or run code for {self.hardware}: {reason}")
            self._probed = True

    def tune_next(self, db: Database, owner: str, options: TuneOptions | None = None, *,
                  shard_id: int | None = None, on_batch: CandidateHook | None = None,
                  deadline: Deadline | None = None, reprioritise: bool = True) -> ShardResult | None:
        """Lease the next shard (the owner's own first) and tune it; None if none is left (or the
        ``deadline`` passed: then nothing is leased; a shard whose next batch would end after it
        ends done-short at once, and its trials go back to the budget).

        ``options`` overrides the tuner's for this shard (the runner is the tuner's either way).
        ``reprioritise=False`` leaves the pending shards' priorities as planned (a budget's
        rounds: the allocator set them), else energy-aware leasing re-ranks them first."""
        options = options or self.options
        if (finished := self._finished_unacknowledged(db, owner)) is not None:
            return finished
        if deadline is not None and deadline.reason():
            return None
        if (shard_id is None and self._builder is None and self._runner is None
                and not db.shards(states=(PENDING, LEASED), hardware_class_id=db.hardware_class(self.hardware).id)):
            return None  # nothing to lease or take over: no builder and runner started for nothing (asked
            # only before they start: once running, the lease below answers the same at no extra query)
        self.start()
        # Read before leasing, like the builder and runner start: a first read (xgboost's import,
        # the model from the store) can take seconds, and a lease is held for work, not for that.
        trained = self.cost_model(db, options)
        t0 = time.perf_counter()
        if options.energy_aware and shard_id is None and reprioritise:
            from tunefleet.energy.priorities import reprioritise

            reprioritise(db, self.hardware)
        shard = shard_queue.lease(db, self.hardware, owner, lease_s=options.lease_s, shard_id=shard_id, reclaim=True,
                             max_lost_leases=options.max_lost_leases)
        leased_s = time.perf_counter() - t0
        if shard is None:
            return None
        self._in_hand[owner] = shard.id
        if options.filtering and trained is None and not self._warned_no_filter:
            self._warned_no_filter = True
            log.warning("filtering is on but %s has no current cost model%s: every candidate is measured "
                        "(retrain one with `tunefleet costmodel retrain`)", self.hardware,
                        "" if self.store is not None else " (no artifact store given)")
        kit = ShardKit(builder=self.builder, runner=self.runner, online_model=self.online_model, trained_model=trained,
                       num_threads=self.threads, on_batch=on_batch, deadline=deadline)
        result = run_shard(db, shard, owner, options, kit)
        result.lease_s = leased_s
        del self._in_hand[owner]
        return result

    def _finished_unacknowledged(self, db: Database, owner: str) -> ShardResult | None:
        """The shard ``owner``'s previous call leased and then raised on, if that call marked it
        done before failing: its commit reached the database and the acknowledgement was lost (a
        connection reset). The retry returns it, so its driver counts it, rather than leasing
        another shard and leaving this one out of its summary."""
        shard_id = self._in_hand.get(owner)
        if shard_id is None:
            return None
        shard = db.shard(shard_id)
        del self._in_hand[owner]
        last = (shard.history or [{}])[-1]
        if shard.state != shard_queue.DONE or last.get("owner") != owner:
            return None  # still leased (reclaimed next), or ended by someone else
        log.warning("shard %d was done by %s before its acknowledgement was lost; counted, not tuned again",
                    shard.id, owner)
        return ShardResult(shard.id, shard_queue.DONE, db.count_measurements(shard_id=shard.id), 0, 0, None, 0.0)

    def close(self) -> None:
        """Stop the builder (one this tuner made; a given one is left as it is) and the runner; a
        later shard starts them again (and probes the node again)."""
        self._probed = False
        if self._own_builder and self._builder is not None:
            self._builder.shutdown()
            self._builder = None
        runner, self._runner = self._runner, None
        if runner is not None:
            from tunefleet.tvm.runner import stop_runner

            stop_runner(runner)


def quarantine(tuner: Tuner, fault: NodeFaultError | None, *, on: bool) -> None:
    """Say that this node is quarantined for the tuner's class (``on``: a probe failed, ``fault``
    says why; it leases none of the class's shards), or no longer is (a probe passed again): in the
    log and as the ``tunefleet_node_quarantined`` gauge on the Pushgateway, when one is set."""
    from tunefleet.energy.metrics import publish_quarantine

    node = socket.gethostname()
    if not on:
        log.warning("node %s is no longer quarantined for %s: its probe passed", node, tuner.hardware)
    if tuner.options.metrics_pushgateway:
        publish_quarantine(tuner.options.metrics_pushgateway, tuner.hardware, node, on,
                           reason=str(fault) if fault is not None else None)


def drain(db: Database, hardware: str, options: TuneOptions | None = None, *, max_shards: int | None = None,
          store: ArtifactStore | None = None, tuner: Tuner | None = None, on_batch: CandidateHook | None = None,
          refill: Rounds | None = None, deadline: Deadline | None = None,
          backoff: Backoff | None = None) -> TuneSummary:
    """Lease and tune pending shards of one hardware class in this process until none are left.

    The steps are a :class:`~tunefleet.engine.loop.TuneLoop`'s; ``drain`` carries them out here.
    With ``store``, shards warm-start from the class's current cost model (see :class:`Tuner`);
    ``tuner`` (e.g. one with a given builder) is used and left open, else one is made and closed.

    With ``refill`` (a model-level budget), an empty queue asks it for the next round's shards and
    draining goes on with the same tuner (its builder, runner and cost models stay up) until the
    budget is spent, its deadline passes or no workload can use more trials; a round the deadline
    cut is cancelled. ``deadline`` (or the refill's) stops leasing at that time, and a shard stops
    before a batch that would end after it (done-short, not failed) — so near the deadline the
    shards of a round planned for more time end at once, and the refill plans what still fits.
    Pending shards it cannot lease yet (their workload searched by another worker, or backing off
    after a lost lease) are waited for, not left behind.

    A worker keeps going through faults that are not a shard's: a transient error (a lost database
    connection) is logged in one line and waited out with ``backoff`` — wherever the loop meets
    the database: leasing and tuning a shard (the worker then takes its own shard back with no
    attempt spent), polling the pending shards while it waits, planning a budget's next round or
    closing the rounds at the end — and the step is taken again (up to
    :data:`~tunefleet.vocab.TRANSIENT_RETRIES` in a row, then the error is raised); a lost lease
    (the shard cancelled, or expired and taken) moves on to the next shard; a builder or runner
    that cannot start is started again, and after :data:`START_FAILURES` failures in a row
    :class:`WorkerStartError` says why.
    """
    owner = worker_owner()
    own = tuner is None
    tuner = tuner or Tuner(db, hardware, options, store=store)
    loop = TuneLoop(tuner.hardware, max_shards=max_shards, rounds=refill, deadline=deadline)
    backoff = backoff or Backoff()
    transient = start_failures = 0
    quarantined = False
    summary: TuneSummary | None = None
    try:
        while summary is None:
            try:  # every step that reads or writes the database, the loop's own included
                step = loop.next_step(db)
                if isinstance(step, Stop):
                    summary = loop.finish(db)
                elif isinstance(step, Refill):
                    loop.refilled(step.rounds.refill(db))
                elif isinstance(step, Wait):
                    _wait(step.seconds)
                else:
                    loop.leased(tuner.tune_next(db, owner, options, on_batch=on_batch, deadline=step.deadline,
                                                reprioritise=not step.allocated))
                    if quarantined:
                        quarantine(tuner, None, on=False)
                    start_failures, quarantined = 0, False
            except NodeFaultError as exc:  # this node cannot build or run code for the class
                start_failures, quarantined = start_failures + 1, True
                quarantine(tuner, exc, on=True)
                if start_failures >= START_FAILURES:
                    raise NodeFaultError(f"node {socket.gethostname()} is quarantined for {tuner.hardware} and this "
                                         f"worker stopped: {start_failures} probes in a row failed (last: {exc}); its "
                                         "shards are left to other nodes") from exc
                tuner.close()
                delay = backoff.delay(start_failures)
                log.warning("node %s quarantined for %s: %s; leasing none of its shards, probing again in %.0f s",
                            socket.gethostname(), tuner.hardware, exc, delay)
                _wait(delay)
                continue
            except WorkerStartError as exc:
                start_failures += 1
                if start_failures >= START_FAILURES:
                    raise WorkerStartError(f"worker of {tuner.hardware} stopped: its builder or runner failed to "
                                           f"start {start_failures} times in a row (last: {exc})") from exc
                delay = backoff.delay(start_failures)
                log.warning("%s; starting again in %.0f s", exc, delay)
                _wait(delay)
                continue
            except LeaseLostError as exc:  # cancelled, or expired and taken: the shard is not ours
                log.warning("%s; moving on to the next shard", exc)
                continue
            except TransientError as exc:
                transient += 1
                if transient > TRANSIENT_RETRIES:
                    raise
                delay = backoff.delay(transient)
                log.warning("transient error (retry %d of %d): %s; trying again in %.0f s", transient,
                            TRANSIENT_RETRIES, str(exc).splitlines()[0], delay)
                _wait(delay)
                continue
            transient = 0
    finally:
        if own:
            tuner.close()
    return summary


def _worker_main(settings_data: dict[str, Any], hardware: str, options_data: dict[str, Any],
                 max_shards: int | None, rounds: RoundsState | None = None,
                 deadline_at: float | None = None) -> None:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.store import open_store
    from tunefleet.tvm import without_torch  # noqa: F401  # first: a worker only tunes
    from tunefleet.tvm.native_log import redirect_native_stderr

    redirect_native_stderr()  # before logging's handler takes sys.stderr: TVM's C++ lines to the log file
    settings = Settings(**settings_data)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(processName)s %(message)s")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    try:
        db = Database.from_settings(settings)
        drain(db, hardware, TuneOptions(**options_data), max_shards=max_shards, store=open_store(settings),
              refill=Rounds.resume(rounds) if rounds is not None else None,
              deadline=Deadline(deadline_at) if deadline_at is not None else None)
    except TunefleetError as exc:  # one line, as the CLI prints it, and a non-zero exit code
        log.error("%s", str(exc).splitlines()[0])
        raise SystemExit(1) from None


def tune_with_workers(settings: Settings, hardware: str, options: TuneOptions, *, workers: int = 1,
                      max_shards: int | None = None, refill: Rounds | None = None,
                      deadline: Deadline | None = None) -> list[int]:
    """Drain the queue with ``workers`` local worker processes; return their exit codes.

    Workers only share the database: a worker that dies leaves its shard leased until the lease
    expires, and another worker (or a later run) resumes it. With ``refill``, the first round is
    planned here, before the workers start (they would all find the queue empty at once), and each
    worker plans the next round when it finds the queue empty (the trials are counted in the
    database, so the budget holds over all of them, and planners take turns:
    :func:`tunefleet.planning.rounds.plan_round`); ``deadline`` stops every worker. Afterwards
    ``refill.why_over(db)`` says why the rounds ended (the workers knew; this process did not refill).
    """
    if workers < 1:
        raise TunefleetError("workers must be >= 1")
    if refill is not None:
        from tunefleet.db import Database

        db = Database.from_settings(settings)
        try:
            refill.refill(db)
        finally:
            db.close()
    ctx = multiprocessing.get_context("spawn")
    args = (settings.model_dump(), hardware, options.model_dump(), max_shards,
            refill.state if refill is not None else None, deadline.at if deadline is not None else None)
    procs = [ctx.Process(target=_worker_main, args=args, name=f"tunefleet-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [p.exitcode or 0 for p in procs]


def verify_transfer(db: Database, found: Any, tuner: Any = None) -> float | None:
    """Measure a transferred schedule (:func:`tunefleet.planning.transfer.transfer_best`) on this node and
    commit it as an ordinary measurement; the class's best mean run time afterwards."""
    from tunefleet.engine.learned import measure_traces

    wl, hw = db.workload(found.workload), db.hardware_class(found.hardware)
    own = tuner is None
    tuner = tuner or Tuner(db, hw.name)
    try:
        measure_traces(db, wl, hw, [(found.trace_json, found.args_info)], builder=tuner.builder, runner=tuner.runner)
    finally:
        if own:
            tuner.close()
    best = db.best_measurements(wl.id, hw.id, 1)
    found.verified_mean_run_s = float(best[0].mean_run_s) if best and best[0].mean_run_s is not None else None
    return found.verified_mean_run_s
