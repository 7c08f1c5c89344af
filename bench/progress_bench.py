"""What one reading of the live line costs: ``Database.model_progress`` on a real tuning database.

Usage::

    python bench/progress_bench.py ~/.tunefleet/tunefleet.db            # every model x class in it
    python bench/progress_bench.py DB --rounds 50 --since-hours 1

``tunefleet run`` reads it once a second while tuning, on the machine being tuned. The bench times
it on a copy of the database (SQLite; upgraded to this tunefleet's schema) and, side by side in
the same rounds, on a second copy without the ``ix_measurements_recent`` index (migration 0013),
alternating. Prints what it measured; nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text

from tunefleet.db import Database, upgrade
from tunefleet.db.tables import utcnow


def _copy(src: Path, dst: Path) -> None:
    """A consistent copy of a SQLite database, its write-ahead log included."""
    with sqlite3.connect(src) as source, sqlite3.connect(dst) as target:
        source.backup(target)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("database", type=Path, help="a tunefleet SQLite database file (it is copied, never changed)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--since-hours", type=float, default=100.0,
                    help="count the rows committed in the last N hours (the run's start; default: all of them)")
    args = ap.parse_args()
    if not args.database.is_file():
        print(f"progress_bench: no such file: {args.database}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        with_index, without = Path(tmp) / "with.db", Path(tmp) / "without.db"
        _copy(args.database, with_index)
        engine = create_engine(f"sqlite:///{with_index}")
        upgrade(engine)  # an older home's database, as `tunefleet db upgrade`
        engine.dispose()
        _copy(with_index, without)
        with sqlite3.connect(without) as conn:
            conn.execute("DROP INDEX ix_measurements_recent")
        dbs = {"with ix_measurements_recent": Database(f"sqlite:///{with_index}"),
               "without it": Database(f"sqlite:///{without}")}
        first = next(iter(dbs.values()))
        with first.session() as s:
            pairs = s.execute(text("SELECT DISTINCT model_id, hardware_class_id FROM model_workloads")).all()
            rows = s.execute(text("SELECT count(*) FROM measurements")).scalar()
        since = utcnow() - dt.timedelta(hours=args.since_hours)
        print(f"{args.database}: {rows} measurements, {len(pairs)} model x class pair(s); "
              f"{args.rounds} rounds, alternating")
        for model_id, hw in pairs:
            times: dict[str, list[float]] = {name: [] for name in dbs}
            for _ in range(args.rounds):
                for name, db in dbs.items():
                    t = time.perf_counter()
                    db.model_progress(model_id, hw, since)
                    times[name].append(time.perf_counter() - t)
            line = ", ".join(f"{name}: median {statistics.median(v) * 1e3:.1f} ms (min {min(v) * 1e3:.1f})"
                             for name, v in times.items())
            print(f"model {model_id} on class {hw}: {line}")
        for db in dbs.values():
            db.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
