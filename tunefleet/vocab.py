"""The words tunefleet's layers share: shard states, candidate kinds, Prefect tags, defaults.

A leaf module (it imports nothing of tunefleet), so the settings, the database layer, the
engine and the orchestration layer can all name these without importing each other.
"""

from __future__ import annotations

import re

# -- shard states (the lease state machine: tunefleet.planning.shard_queue) -----------------------------------
PENDING, LEASED, DONE, FAILED, CANCELLED = "pending", "leased", "done", "failed", "cancelled"
STATES = (PENDING, LEASED, DONE, FAILED, CANCELLED)

DEFAULT_LEASE_S = 120.0
"""Lease length of a shard; heartbeats renew it every third of it."""
MIN_LEASE_S = 3.0
"""The shortest lease: heartbeats run every third of it and at most once a second
(tunefleet.engine.heartbeat), so a shorter lease would expire between two heartbeats."""

TRANSIENT_RETRIES = 4
"""Transient errors in a row (a lost database connection) waited out before giving up: the
retries of the Prefect tasks and of a CLI worker (tunefleet.engine.worker.drain) alike."""
RETRY_BACKOFF_S = 5.0
"""The first retry's wait; each further one doubles it (5, 10, 20, 40 s: about 75 s in all)."""
RETRY_JITTER = 0.5
"""The share of each wait spread randomly around it, so that workers cut off together do not retry together."""

DEFAULT_MAX_LOST_LEASES = 20
"""Leases a shard may lose (its worker died or stopped heartbeating) before it fails: lost leases
are counted apart from attempts that raised an error, since churn is not the shard's fault."""
CRASH_AFTER_DEATHS = 2
"""A candidate in flight alone when a worker dies, after an earlier death with it in flight, is
recorded as a crash (:data:`CRASH`) instead of being measured a third time."""

# -- candidate kinds (a measurement's ``error_kind``) ---------------------------------------------
BUILD_ERROR, RUN_ERROR = "build", "run"
FILTERED = "filtered"
"""A candidate the cost model scored out before measuring: never built or run, no run time and no
energy; it counts as a spent trial of its shard."""

CRASH = "crash"
"""A candidate whose build or measurement killed its worker (see :data:`CRASH_AFTER_DEATHS`): no run
time; it counts as a spent trial and is never proposed again."""

DEFAULT_TRACE_JSON = "[[],[]]"
"""The stored trace of a workload's default (unscheduled) program: what an untuned build runs."""
DEFAULT_TRACE_SHA256 = "643d5437104296e21d906ecb15b2c96ad278f20cfc4af53b12bb6069bd853726"
"""sha256 of :data:`DEFAULT_TRACE_JSON` (a test checks it)."""


# -- workload names ------------------------------------------------------------------------------
def task_name_key(task_name: str) -> str:
    """The fused-op sequence of a task name: ``fused_conv2d1_add1_relu1`` -> ``conv2d_add_relu``.

    ``fused_`` and the numeric suffixes TVM adds to repeated ops are removed, so the workloads of
    one operator at other shapes (in one model or in several) share the key.
    """
    name = task_name.removeprefix("fused_")
    return "_".join(re.sub(r"(?<=[a-z])\d+$", "", tok) for tok in name.split("_"))


# -- cost-model audits ------------------------------------------------------------------------------
DEFAULT_MIN_AGREEMENT = 0.6
"""Pairwise agreement below which a shard stops trusting the class's trained cost model (filtering
stops, the warm start is dropped); 0.5 is a random ranking."""

# -- Prefect tags -------------------------------------------------------------------------------------
EXPORT_TAG = "tunefleet-export"
"""Exports must run one at a time (two would take the same new measurements): `tunefleet deploy`
sets a concurrency limit of 1 on this tag."""


def hardware_tag(hardware: str) -> str:
    """The tag tuning tasks of a hardware class carry (for tag-based concurrency limits)."""
    return f"tunefleet-hw:{hardware}"


# conv2d layouts a hardware class's extraction recipe may ask for (tunefleet.recipes.Recipe):
# "NHWC" and "NCHWc" (blocked channels, CPU only) convert, "native" keeps the frontend's layout.
# Unset: NHWC on CPU classes, native on GPU.
LAYOUTS = ("NHWC", "NCHWc", "native")

# -- building ---------------------------------------------------------------------------------------
UNTUNED_TIMING_S = 10.0
"""About the longest a build spends timing the untuned model after its output check: its naive
loops take seconds per call on a large model, its latency is only the speed-up's reference, and
within a budget's run the user's time pays for it (a call longer than this is not repeated: the
check's call is its figure)."""

TIMING_ROUNDS = 5
"""Rounds of the alternating timing of a build against the alternatives
(:func:`tunefleet.delivery.timing.time_alternating`; the bench's ``--rounds`` default)."""

TIMING_ROUND_S = 0.3
"""About how long each runtime is called per round of that timing, in seconds."""

CONFIRM_ROUNDS = 3
"""Alternating rounds that re-timing runs (each round: one measurement of five cold runs)."""

STAGE_LOG_KEY = "tunefleet_stage"
"""A log record's attribute (``log.info(..., extra={STAGE_LOG_KEY: "building the tuned model"})``)
that names the step a run has moved on to: ``tunefleet run``'s live line shows it."""

#: The node pool of hub classes: the classes imported hub records live under (one per class and
#: CPU they were tuned on). No worker runs in it, so they are never leased or measured.
HUB_POOL = "tunefleet-hub"
