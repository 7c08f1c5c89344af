"""PostgreSQL bulk path: COPY a batch into a temporary table, then one idempotent INSERT.

Parsing one multi-row INSERT of ~2.5 KB traces costs the server more than COPY's text
format (``bench/db_bench.py``; docs/performance.md has the figures). Duplicate keys are
still skipped by ``ON CONFLICT DO NOTHING`` and only inserted ids come back.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from tunefleet.db.tables import Measurement, utcnow

_JSON_COLUMNS = {"args_info", "run_secs"}


def _text_value(value: Any) -> str:
    if value is None:
        return "\\N"
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    return text.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_insert_measurements(dbapi_conn: Any, rows: Sequence[dict[str, Any]]) -> int:
    """Insert ``rows`` (dicts of measurement columns by attribute name, as an ORM insert takes them)
    on a psycopg2 connection; return inserted count."""
    keys = list(rows[0].keys())
    columns = [Measurement.__mapper__.columns[k].name for k in keys] + ["created_at"]  # ``repeat`` is "attempt"
    now = utcnow().isoformat(sep=" ")
    buf = io.StringIO()
    for row in rows:
        values = [
            _text_value(json.dumps(row[k]) if k in _JSON_COLUMNS and row[k] is not None else row[k])
            for k in keys
        ]
        values.append(now)
        buf.write("\t".join(values))
        buf.write("\n")
    buf.seek(0)
    cols = ", ".join(columns)
    with dbapi_conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE IF NOT EXISTS tf_measurements_in ON COMMIT DELETE ROWS AS "
            "SELECT * FROM measurements WITH NO DATA"
        )
        cur.copy_expert(f"COPY tf_measurements_in ({cols}) FROM STDIN", buf)
        cur.execute(
            f"INSERT INTO measurements ({cols}) SELECT {cols} FROM tf_measurements_in "
            "ON CONFLICT ON CONSTRAINT uq_measurements_candidate DO NOTHING RETURNING id"
        )
        inserted = len(cur.fetchall())
        cur.execute("TRUNCATE tf_measurements_in")
    return inserted
