"""Two planners of one hardware class at once (on SQLite and PostgreSQL) never plan the same trials twice.

Planner A is paused right after it read what is spent and outstanding (a hook on its read); planner
B runs meanwhile in another thread on its own connection. Without the planning lock B plans the
same shortfall and A inserts its plan too: the budget doubles. With it, B waits for A's
transaction and then counts A's shards.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tunefleet.budget import Budget
from tunefleet.db import Database
from tunefleet.db.tables import utcnow
from tunefleet.planning import rounds as round_planning
from tunefleet.planning import shard_queue
from tunefleet.vocab import CANCELLED


@pytest.fixture
def dbs(db_url: str) -> Iterator[tuple[Database, Database]]:
    a = Database(db_url)
    a.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    m, _ = a.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    for i in range(3):
        wl, _ = a.add_workload(structural_hash=f"h{i}", name=f"w{i}", op_kind="dense", flops=1e6, tir_json="{}")
        a.link_model_workload(m.id, wl.id, 1 + i)
    b = Database(db_url)
    yield a, b
    a.close()
    b.close()


def _pause_after(db: Database, method: str, meanwhile: Callable[[], Any]) -> list[BaseException]:
    """Make ``db.method`` run ``meanwhile`` in another thread right after its read, giving that
    thread a bounded while to finish (it cannot while the lock holds; then it runs after)."""
    original = getattr(db, method)
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def other() -> None:
        try:
            meanwhile()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the test
            errors.append(exc)

    def read(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if not threads:
            t = threading.Thread(target=other)
            threads.append(t)
            t.start()
            t.join(timeout=1.5)  # without the lock the other planner is done by now
        return out

    setattr(db, method, read)
    db._paused_threads = threads  # type: ignore[attr-defined]
    return errors


def _join(db: Database) -> None:
    for t in db._paused_threads:  # type: ignore[attr-defined]
        t.join(timeout=30)
        assert not t.is_alive()


def _planned(db: Database) -> int:
    return sum(s.trials for s in db.shards() if s.state != CANCELLED)


def test_two_plans_at_once_plan_each_shortfall_once(dbs: tuple[Database, Database]) -> None:
    a, b = dbs
    errors = _pause_after(a, "planning_view", lambda: shard_queue.plan(b, "x86", target_trials=16, shard_trials=8))
    shard_queue.plan(a, "x86", target_trials=16, shard_trials=8)
    _join(a)
    assert not errors
    assert _planned(a) == 3 * 16


@pytest.mark.parametrize("spec", ["40", "10m"])
def test_two_budget_rounds_at_once_plan_one_round(dbs: tuple[Database, Database], spec: str) -> None:
    """Two workers refilling at once: a trial budget is not overspent and, with a wall-time budget
    (no trial count to check), no workload gets a second shard in the same round."""
    a, b = dbs
    since = utcnow()
    parsed = Budget.parse(spec, name="budget")
    errors = _pause_after(a, "budget_view", lambda: round_planning.plan_round(b, "x86", [1], parsed, since))
    first = round_planning.plan_round(a, "x86", [1], parsed, since)
    _join(a)
    assert not errors
    assert first.shards
    assert _planned(a) == sum(s.trials for s in first.shards)
