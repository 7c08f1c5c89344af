"""A resumable tuning campaign: tune a corpus to convergence on this machine's CPU and export it.

Usage::

    python bench/campaign.py --hours 4 --export campaign-x86.parquet    # continue the campaign for 4 hours
    python bench/campaign.py --models corpus --corpus-families softmax --corpus-limit 1 --trials-per-workload 4
    python bench/campaign.py --hours 0 --export campaign-x86.parquet    # tune nothing: summary and export only

What it tunes (``--models``): every zoo model but resnet50 and vit-base (the zero-shot test models
of another issue, never tuned here), plus the generated corpus of ``bench/corpus.py`` (``corpus``),
plus any ONNX or ``.pt2`` file given. Each invocation continues the database of ``--home`` (its
SQLite file, or ``--database-url``):

1. the corpus's files are written into ``HOME/corpus`` (the same bytes every time);
2. every model not stored yet is ingested and every model not extracted under the class's recipe
   is extracted (the rest is looked up, not redone);
3. the workloads are tuned towards ``--trials-per-workload`` in rungs of 64, 128, 256, ... trials,
   each rung planned with ``tunefleet.planning.shard_queue.plan`` (which plans only the shortfall)
   and drained before the next: a campaign stopped after a few hours has tuned every workload a
   little rather than a few to the end. A workload is converged when it has its trials, when its
   best stopped improving (plateau preemption: at most 1% better over 3 batches of 64) or when
   its search space has no new candidate;
4. at the end — the budget of ``--hours`` spent, everything converged, or Ctrl-C — it prints what
   the database holds for the class, appends this invocation to ``HOME/campaign-sessions.json``
   and, with ``--export``, writes the hub bundle (``tunefleet.api.hub_export``); with
   ``--export-all``, a bundle of every record too (the shipped cost model's training data).

``--hours`` is checked before each model and each shard: a shard in flight (at most 64
candidates) finishes first. Ctrl-C (or SIGTERM) stops at once as ``tunefleet run`` does — the
leases are given back, the batch in flight is lost, nothing measured is — then prints the summary,
logs the session and exports. Logs (tunefleet's and TVM's) go to ``HOME/logs``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:  # corpus.py beside this file, also when imported from elsewhere
    sys.path.insert(0, str(BENCH))

HELD_OUT = ("resnet50", "vit-base")
"""Zero-shot test models of another issue: their workloads must stay unmeasured by this campaign."""
CORPUS = "corpus"
"""The ``--models`` word for the generated corpus (bench/corpus.py)."""
DEFAULT_TRIALS = 512
"""The convergence target per workload: more than twice the trials resnet18's workloads took to
plateau in this project's runs (docs/campaign.md says how many, and the hours it implies), while
plateau preemption ends the others earlier."""
RUNG = 64
"""The first rung, and the shard size: one search batch (``trials_per_iter``)."""
SESSIONS_FILE = "campaign-sessions.json"
ALL_RECORDS = 1_000_000
"""``--export-all``'s records per workload: more than any campaign measures of one."""


def default_models() -> list[str]:
    """Every zoo model but the held-out ones, then the corpus."""
    from tunefleet.models.zoo import list_zoo

    return [e.name for e in list_zoo() if e.name not in HELD_OUT] + [CORPUS]


def rungs(target: int) -> list[int]:
    """Trial targets of the passes over every workload: 64, 128, 256, ... and ``target`` last."""
    out, r = [], RUNG
    while r < target:
        out.append(r)
        r *= 2
    return [*out, target]


# -- the CPU ---------------------------------------------------------------------------------------
def cpu_model() -> str:
    """This machine's CPU: its model name with its family and model (``AMD EPYC (family 26 model
    2)``), since the name alone does not tell a VM's Zen 4 from its Zen 5."""
    from tunefleet.hardware import cpu_label, host_cpu

    return cpu_label(host_cpu())


def default_home() -> Path:
    """``~/.tunefleet-campaign/<cpu>``: one database per CPU model, since a CPU class's timings
    belong to one CPU (sessions on another CPU start their own campaign beside it). The CPU is
    its name with its family and model (:func:`tunefleet.hardware.cpu_label`): a VM's ``AMD EPYC``
    is Zen 4 one day and Zen 5 the next."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model().lower()).strip("-") or "cpu"
    return Path("~/.tunefleet-campaign").expanduser() / slug


# -- the session log -------------------------------------------------------------------------------
def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def read_sessions(home: Path) -> list[dict[str, Any]]:
    """The campaign's invocations on this home, oldest first (empty if none; a file that does not
    parse is an error naming it: it is the only record of the hours spent)."""
    path = home / SESSIONS_FILE
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
        return list(data["sessions"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"campaign: error: {path} is not a campaign session log ({exc}); move it aside") from None


def write_session(home: Path, session: dict[str, Any]) -> None:
    """Add or update ``session`` (by its ``started``) in the log, atomically."""
    sessions = [s for s in read_sessions(home) if s.get("started") != session["started"]]
    sessions.append(session)
    sessions.sort(key=lambda s: s["started"])
    path = home / SESSIONS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"sessions": sessions}, indent=1) + "\n")
    tmp.replace(path)


def session_hours(session: dict[str, Any]) -> float:
    return float(session.get("hours") or 0.0)


# -- progress --------------------------------------------------------------------------------------
def _hms(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """One live line on a terminal (rewritten in place), else a plain line at most once a minute."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream or sys.stdout
        self.live = self.stream.isatty()
        self._last = 0.0
        self._shown = False

    def show(self, text: str) -> None:
        if self.live:
            width = shutil.get_terminal_size().columns - 1  # a wrapped line could not be rewritten in place
            self.stream.write("\r\x1b[2K" + text[:width])
            self.stream.flush()
            self._shown = True
        elif time.monotonic() - self._last >= 60:
            print(text, file=self.stream, flush=True)
            self._last = time.monotonic()

    def keep(self) -> None:
        """End the live line where it is: it stays on the screen."""
        if self._shown:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = False

    def say(self, text: str) -> None:
        """A line of its own (the live line is redrawn by the next :meth:`show`)."""
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self._shown = False
        print(text, file=self.stream, flush=True)


# -- standing of the workloads ---------------------------------------------------------------------
@dataclass
class Standing:
    """Where the campaign's workloads stand on the class against a trial target."""

    workloads: int = 0
    at_target: int = 0
    plateaued: int = 0
    exhausted: int = 0
    measured: int = 0
    """Candidates committed for these workloads (errors included)."""

    @property
    def converged(self) -> int:
        return self.at_target + self.plateaued + self.exhausted


def exhausted_workloads(db: Any, hardware: str) -> set[int]:
    """Workloads whose search, in some shard, produced no new candidate: their space is spent."""
    from tunefleet.planning import shard_queue
    from tunefleet.vocab import DONE

    out = set()
    for shard in shard_queue.list_shards(db, hardware=hardware, state=DONE):
        last = (shard.history or [{}])[-1]
        if last.get("event") == "done-short" and last.get("cause") == "exhausted":
            out.add(shard.workload_id)
    return out


def standing(db: Any, hardware_class_id: int, workload_ids: set[int], target: int, exhausted: set[int]) -> Standing:
    st = Standing()
    for row in db.planning_view(hardware_class_id):
        if row.workload_id not in workload_ids:
            continue
        st.workloads += 1
        st.measured += row.measured
        if row.measured >= target:
            st.at_target += 1
        elif row.preempted:
            st.plateaued += 1
        elif row.workload_id in exhausted:
            st.exhausted += 1
    return st


# -- the campaign ----------------------------------------------------------------------------------
@dataclass
class Campaign:
    """One invocation: its settings, what it tunes, its budget, and what it did."""

    home: Path
    settings: Any
    hardware: str
    target: int
    hours: float | None
    export: Path | None
    top_k: int | None
    plateau: bool
    seed: int | None
    progress: Progress
    resume: str
    export_all: Path | None = None
    started: float = field(default_factory=time.time)
    started_at: str = field(default_factory=_now)
    ctx: Any = None
    model_ids: list[int] = field(default_factory=list)
    workload_ids: set[int] = field(default_factory=set)
    candidates_before: int = 0
    logged: bool = False  # the session log was started: its database opened
    shards: int = 0
    failed_shards: int = 0
    measured: int = 0
    stopped: str | None = None
    signalled: bool = False
    cpu: str = field(default_factory=cpu_model)

    # -- budget
    def time_left(self) -> float:
        return math.inf if self.hours is None else self.started + self.hours * 3600 - time.time()

    def out_of_time(self) -> bool:
        if self.time_left() <= 0:
            self.stopped = self.stopped or f"the wall budget of {self.hours:g} h is spent"
            return True
        return False

    # -- the session log
    def session(self, *, ended: bool) -> dict[str, Any]:
        db = self.ctx.db
        hw = db.hardware_class(self.hardware)
        after = db.count_measurements(hardware_class_id=hw.id)
        return {
            "started": self.started_at,
            "ended": _now() if ended else None,
            "hours": round((time.time() - self.started) / 3600, 4),
            "cpu": self.cpu,
            "class_cpu": ((hw.capabilities or {}).get("cpu") or {}).get("model"),
            "host": socket.gethostname(),
            "hardware": self.hardware,
            "database": database_where(self.settings),
            "trials_per_workload": self.target,
            "models": len(self.model_ids),
            "workloads": len(self.workload_ids),
            "candidates_added": after - self.candidates_before,
            "shards": self.shards,
            "failed_shards": self.failed_shards,
            "stopped": self.stopped,
        }

    def log_session(self, *, ended: bool) -> None:
        write_session(self.home, self.session(ended=ended))
        self.logged = True

    # -- 1-2: models
    def corpus_paths(self, families: str | None, limit: int | None) -> list[Path]:
        from corpus import write_corpus

        return write_corpus(self.home / "corpus", families, limit)

    def prepare_models(self, sources: list[str]) -> None:
        """Ingest what is not stored and extract what is not extracted under the class's recipe."""
        from tunefleet import api
        from tunefleet.errors import NotFoundError, TunefleetError
        from tunefleet.models.workloads import class_recipe

        db = self.ctx.db
        hw = db.hardware_class(self.hardware)
        recipe = class_recipe(hw).name
        todo: list[tuple[str, Any]] = []
        for source in sources:
            model = None
            try:
                model = self._stored(db, source)
            except NotFoundError:
                pass
            if model is not None and db.model_recipes(model.id, hw.id) == [recipe]:
                self.model_ids.append(model.id)
            else:
                todo.append((source, model))
        self.progress.say(f"models: {len(sources)} ({len(sources) - len(todo)} stored and extracted already, "
                          f"{len(todo)} to ingest or extract)")
        for i, (source, model) in enumerate(todo, 1):
            if self.out_of_time():
                self.progress.say(f"  stopped before {source}: {self.stopped}; the next run goes on from there")
                return
            t0 = time.perf_counter()
            label = Path(source).stem if os.sep in source else source
            try:
                with api.keeping_models():  # the extraction takes the ingest's parse: one child, not two
                    if model is None:
                        model = api.ingest(self.ctx, source).model
                    found = api.extract(self.ctx, model, self.hardware)
            except TunefleetError as exc:  # one bad model must not end a campaign of hundreds
                self.progress.say(f"  [{i}/{len(todo)}] {label}: skipped: {str(exc).splitlines()[0]}")
                continue
            self.model_ids.append(model.id)
            self.progress.say(f"  [{i}/{len(todo)}] {label}: {found.workloads} workloads ({found.new_workloads} new), "
                              f"{time.perf_counter() - t0:.1f}s")

    @staticmethod
    def _stored(db: Any, source: str) -> Any:
        """The stored model of a source, or NotFoundError: a zoo model by name, a file by its bytes."""
        import hashlib

        from tunefleet.errors import NotFoundError

        path = Path(source)
        if path.suffix.lower() in (".onnx", ".pt2") and path.is_file():
            return db.model(hashlib.sha256(path.read_bytes()).hexdigest())
        model = db.model(source)
        if model.source != "zoo" or (model.meta or {}).get("zoo") != source:
            raise NotFoundError(source)
        return model

    # -- 3: tuning
    def tune(self) -> None:
        from tunefleet.engine.worker import drain
        from tunefleet.planning import shard_queue
        from tunefleet.vocab import PENDING

        db = self.ctx.db
        hw = db.hardware_class(self.hardware)
        for model_id in self.model_ids:
            self.workload_ids.update(wl.id for wl, _ in db.workloads(model_id=model_id, hardware_class_id=hw.id))
        options = self.ctx.options(seed=self.seed).replace(preempt=self.plateau)
        if not self.plateau and self.workload_ids:  # never an empty list: it would reset the whole class
            db.reset_plateaus(hw.id, sorted(self.workload_ids))  # plateaus of earlier runs no longer stop them
        exhausted = exhausted_workloads(db, self.hardware)
        st = standing(db, hw.id, self.workload_ids, self.target, exhausted)
        self.progress.say(f"tuning {st.workloads} workloads to {self.target} trials each in rungs "
                          f"{', '.join(map(str, rungs(self.target)))} (plateau stop "
                          f"{'on' if self.plateau else 'off'}): {st.converged} converged already")
        tuner = None
        for rung in rungs(self.target):
            if self.stopped or self.out_of_time():
                break
            planned = 0
            for model_id in self.model_ids:
                created, _ = shard_queue.plan(db, self.hardware, target_trials=rung, shard_trials=RUNG, model=model_id)
                # A spent search space gets no more shards (each would only find nothing again).
                futile = [s.id for s in created if s.workload_id in exhausted]
                if futile:  # never an empty list: cancel_shards([]) cancels every shard
                    shard_queue.cancel(db, futile)
                planned += len(created) - len(futile)
            pending = len(shard_queue.list_shards(db, hardware=self.hardware, state=PENDING))
            if not pending:
                continue
            self.progress.say(f"rung {rung}: {planned} new shard(s), {pending} pending")
            while not self.out_of_time():
                if tuner is None:
                    tuner = self.ctx.tuner(self.hardware)  # builder and runner kept up from shard to shard
                summary = drain(db, self.hardware, options, max_shards=1, tuner=tuner)
                if summary.shards_done + summary.shards_failed == 0:
                    break  # nothing left to lease in this rung
                self.shards += summary.shards_done + summary.shards_failed
                self.failed_shards += summary.shards_failed
                self.measured += summary.measured
                exhausted = exhausted_workloads(db, self.hardware)
                st = standing(db, hw.id, self.workload_ids, self.target, exhausted)
                self.progress.show(self.line(rung, st))
                self.log_session(ended=False)  # a killed run still leaves its hours and candidates
            self.progress.keep()
        if tuner is not None:
            tuner.close()  # its builder and runner processes: the summary and the export need no CPU of theirs
        if not self.stopped:
            st = standing(db, hw.id, self.workload_ids, self.target, exhausted_workloads(db, self.hardware))
            if not st.workloads:
                self.stopped = "no workloads to tune (no model was extracted)"
            elif st.converged >= st.workloads:
                self.stopped = "done: every workload converged"
            else:
                self.stopped = (f"{st.workloads - st.converged} workload(s) short of the target with nothing left "
                                "to plan: see `tunefleet shards list --state failed` and the log")

    def line(self, rung: int, st: Standing) -> str:
        left = "" if self.hours is None else f" of {_hms(self.hours * 3600)}"
        return (f"rung {rung}: {st.converged}/{st.workloads} workloads converged | this run: {self.measured:,} "
                f"candidates, {self.shards} shards ({self.failed_shards} failed), {_hms(time.time() - self.started)}"
                f"{left} | workloads' candidates: {st.measured:,}")

    # -- 4: the end
    def summary(self) -> list[str]:
        db = self.ctx.db
        hw = db.hardware_class(self.hardware)
        sessions = [s for s in read_sessions(self.home) if s.get("hardware") == self.hardware]
        total = db.count_measurements(hardware_class_id=hw.id)
        valid = db.count_measurements(hardware_class_id=hw.id, errors=False)
        workloads = len(db.workloads(hardware_class_id=hw.id))
        st = standing(db, hw.id, self.workload_ids, self.target, exhausted_workloads(db, self.hardware))
        by_cpu: dict[str, list[float]] = {}
        for s in sessions:
            by_cpu.setdefault(str(s.get("cpu")), []).append(session_hours(s))
        class_cpu = ((hw.capabilities or {}).get("cpu") or {}).get("model")
        set_up = f" (set up on {class_cpu})" if class_cpu else ""
        runs = "; ".join(f"{cpu}: {len(h)} run(s), {sum(h):.2f} h" for cpu, h in by_cpu.items())
        return [
            (f"this run: {(time.time() - self.started) / 3600:.2f} h on {self.cpu}, "
             f"{total - self.candidates_before:,} candidates added, {self.shards} shards ({self.failed_shards} "
             f"failed); stopped: {self.stopped}"),
            (f"database, class {self.hardware}{set_up}: {workloads} workloads, {total:,} candidates ({valid:,} "
             f"measured, {total - valid:,} errors or filtered)"),
            (f"campaign's workloads: {st.converged}/{st.workloads} converged at {self.target} trials "
             f"({st.at_target} at the target, {st.plateaued} plateaued, {st.exhausted} out of candidates)"),
            (f"campaign time on this home: {sum(session_hours(s) for s in sessions):.2f} h in {len(sessions)} "
             f"run(s): {runs}"),
        ]

    def finish(self) -> int:
        """Summary, session log and export; the exit status."""
        self.log_session(ended=True)
        self.progress.say("")
        for line in self.summary():
            self.progress.say(line)
        if self.export is not None:
            export_bundle(self.ctx, self.export, self.hardware, self.top_k)
        if self.export_all is not None:  # every record: what bench/pretrain.py trains the shipped cost model on
            export_bundle(self.ctx, self.export_all, self.hardware, ALL_RECORDS)
        return 0


def database_where(settings: Any) -> str:
    """The database as a user finds it: a SQLite file's path, else the URL with its password masked."""
    from tunefleet.config import mask_url

    url = settings.effective_database_url
    return url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else mask_url(url)


def export_bundle(ctx: Any, output: Path, hardware: str, top_k: int | None) -> int:
    """Write the hub bundle of the class (``tunefleet.api.hub_export``)."""
    from tunefleet import api

    result = api.hub_export(ctx, output, hardware=[hardware], top_k=top_k)
    print(f"hub bundle: {result.line()}", flush=True)
    return 0


# -- signals ---------------------------------------------------------------------------------------
def stop_on_signals(campaign: Campaign) -> None:
    """Ctrl-C and SIGTERM stop at once, as ``tunefleet run`` does (leases given back, builder and
    runner processes stopped: a KeyboardInterrupt raised into MetaSchedule's C++ search is no clean
    stop), then the summary, the session log and the export run on a fresh connection. A second
    signal meanwhile exits at once."""

    def stop(signum: int, frame: object) -> None:
        if campaign.signalled:
            os._exit(128 + signum)
        campaign.signalled = True
        campaign.stopped = f"signal {signal.Signals(signum).name}"
        status = 128 + signum
        try:
            # tunefleet's own Ctrl-C step, without its exit: the campaign still has to export
            from tunefleet.cli.interrupt import stop_children_and_give_back

            stop_children_and_give_back(campaign.settings, campaign.resume)
            from tunefleet import api

            campaign.ctx = api.connect(campaign.settings)  # the interrupted thread's session is not reusable
            campaign.finish()
        finally:
            sys.stdout.flush()
            os._exit(status)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


# -- command line ----------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Details: docs/campaign.md",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--home", type=Path, help="tunefleet home of the campaign (default ~/.tunefleet-campaign/<cpu>)")
    p.add_argument("--database-url", help="a PostgreSQL URL instead of the home's SQLite database")
    p.add_argument("--hardware", default="x86", help="the hardware class (default x86: this CPU)")
    p.add_argument("--models", help=f"comma-separated zoo names, ONNX/.pt2 paths and '{CORPUS}' "
                   f"(default: every zoo model but {' and '.join(HELD_OUT)}, and the corpus)")
    p.add_argument("--corpus-families", help="only these corpus families (bench/corpus.py --list)")
    p.add_argument("--corpus-limit", type=int, help="at most this many corpus files per family")
    p.add_argument("--hours", type=float, help="wall budget of this invocation in hours (default: until converged)")
    p.add_argument("--trials-per-workload", type=int, default=DEFAULT_TRIALS,
                   help=f"the convergence target per workload (default {DEFAULT_TRIALS})")
    p.add_argument("--no-plateau", action="store_true",
                   help="tune every workload to the target even when its best stopped improving")
    p.add_argument("--seed", type=int, help="seed of the search (default random)")
    p.add_argument("--export", type=Path, help="write the hub bundle here at the end (and on Ctrl-C)")
    p.add_argument("--top-k", type=int, help="records per workload in the bundle (default: hub export's)")
    p.add_argument("--export-all", type=Path, help="also write every record as a bundle here at the end, the "
                   "cost model's training data (bench/data/campaign-<cpu>.parquet, read by bench/pretrain.py)")
    args = p.parse_args(argv)
    if args.trials_per_workload < 1:
        p.error("--trials-per-workload must be at least 1")
    if args.hours is not None and (args.hours < 0 or not math.isfinite(args.hours)):
        p.error("--hours must be a non-negative number")
    if args.corpus_limit is not None and args.corpus_limit < 1:
        p.error("--corpus-limit must be at least 1")
    if args.top_k is not None and args.top_k < 1:
        p.error("--top-k must be at least 1")
    names = [m.strip() for m in args.models.split(",") if m.strip()] if args.models else None
    held = [m for m in names or [] if m in HELD_OUT]
    if held:
        p.error(f"{', '.join(held)}: held out of the campaign (the zero-shot test models of another issue)")
    args.model_list = names
    if args.corpus_families is not None:
        from corpus import parse_families

        try:
            parse_families(args.corpus_families)
        except ValueError as exc:
            p.error(str(exc))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    args = parse_args(argv)
    from tunefleet import api
    from tunefleet.config import load_settings
    from tunefleet.errors import TunefleetError
    from tunefleet.tvm.native_log import native_stderr_to

    home = (args.home or default_home()).expanduser().resolve()
    (home / "logs").mkdir(parents=True, exist_ok=True)
    log_path = home / "logs" / f"campaign-{dt.datetime.now():%Y%m%d-%H%M%S}.log"
    logging.basicConfig(filename=log_path, level=logging.INFO,
                        format="%(asctime)s %(processName)s %(name)s %(message)s")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    # The campaign makes the bundle: its database never imports one (it would seed from itself).
    overrides: dict[str, Any] = {"home": home, "hub": "off"}
    if args.database_url:
        overrides["database_url"] = args.database_url
    resume = shlex.join([sys.executable, str(Path(__file__).resolve()), *(argv if argv is not None else sys.argv[1:])])
    campaign: Campaign | None = None
    try:
        settings = load_settings(**overrides)
        campaign = Campaign(home=home, settings=settings, hardware=args.hardware,
                            target=args.trials_per_workload, hours=args.hours, export=args.export, top_k=args.top_k,
                            export_all=args.export_all,
                            plateau=not args.no_plateau, seed=args.seed, progress=Progress(), resume=resume)
        print(f"campaign: home {home}, class {args.hardware}, CPU {campaign.cpu}, logs {log_path}", flush=True)
        with native_stderr_to(log_path):  # TVM's C++ warnings to the log, not across the live line
            campaign.ctx = api.connect(settings)
            hw = campaign.ctx.db.hardware_class(args.hardware)
            campaign.candidates_before = campaign.ctx.db.count_measurements(hardware_class_id=hw.id)
            campaign.log_session(ended=False)
            stop_on_signals(campaign)
            sources: list[str] = []
            for name in args.model_list or default_models():
                if name == CORPUS:
                    sources += [str(p) for p in campaign.corpus_paths(args.corpus_families, args.corpus_limit)]
                else:
                    sources.append(name)
            campaign.prepare_models(sources)
            if not campaign.stopped:
                campaign.tune()
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # what is left is the end: Ctrl-C just ends it
            return campaign.finish()
    except TunefleetError as exc:
        message = str(exc).splitlines()[0]
        print(f"campaign: error: {message}", file=sys.stderr, flush=True)
        if campaign is not None and campaign.logged:  # not when the database itself would not open
            campaign.stopped = f"error: {message}"
            campaign.log_session(ended=True)
        return 2
    finally:
        if campaign is not None and campaign.ctx is not None:
            campaign.ctx.close()


if __name__ == "__main__":
    sys.exit(main())
