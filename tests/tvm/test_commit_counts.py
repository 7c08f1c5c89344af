"""A commit counts only the rows it stored: a candidate another search committed first is a
duplicate, never counted as measured by this shard."""

from __future__ import annotations

from tunefleet.db import NewMeasurement
from tunefleet.tvm.commit import ShardProgress


def test_a_batch_counts_only_what_its_commit_stored() -> None:
    rows = [NewMeasurement(1, 1, f"t{i}", [1e-3 * (i + 1)]) for i in range(3)] + [NewMeasurement(1, 1, "e", None)]
    p = ShardProgress()
    p.count(rows, stored=2)
    assert (p.batches, p.measured, p.duplicates, p.errors) == (1, 2, 2, 1)
    p.count(rows[:1])  # no count given: every row was stored
    assert (p.measured, p.duplicates) == (3, 2)
