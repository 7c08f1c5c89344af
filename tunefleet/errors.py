"""One error hierarchy whose messages a user can act on.

Every error tunefleet raises on purpose derives from :class:`TunefleetError`; the CLI prints
its message as one line and exits non-zero. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class TunefleetError(Exception):
    """Base class: the message is a complete, actionable sentence."""


class ConfigError(TunefleetError):
    """A setting is invalid."""


class TransientError(TunefleetError):
    """A failure that may pass when retried: a lost connection, a lease taken over.

    Prefect tasks retry these (with backoff) and nothing else; see :func:`is_transient`.
    """


class WorkerStartError(TransientError):
    """A worker's builder or runner could not start (e.g. its process pool failed to fork): no
    shard was measured and no attempt spent; starting again may work."""


class NodeFaultError(WorkerStartError):
    """This node cannot build or run a workload's default schedule for a hardware class
    (:func:`tunefleet.tvm.probe.probe`): the node is at fault, not a candidate. Nothing is stored
    as a candidate error, no attempt is spent, and the worker stops leasing the class's shards."""


class LeaseLostError(TransientError):
    """The worker no longer holds the shard's lease (expired and taken, cancelled, or done)."""


class StaleLeaseError(LeaseLostError):
    """A write fenced by a lease generation that is no longer current: nothing was stored."""


class HeartbeatStoppedError(LeaseLostError):
    """The thread renewing a shard's lease died: the lease would lapse, so the shard's work stops."""


class DatabaseError(TunefleetError):
    """The database cannot be reached or used."""


class DatabaseUnavailableError(DatabaseError, TransientError):
    """The database connection failed or was lost (server down, network cut, lock timeout)."""


class ConflictError(DatabaseError, TransientError):
    """A write collided with a concurrent one (a unique key taken meanwhile, e.g. two exports
    reserving the same dataset version): running it again resolves it."""


class SchemaOutdatedError(DatabaseError):
    """The database schema is at an older revision than this tunefleet."""


class SchemaTooNewError(DatabaseError):
    """The database schema was written by a newer tunefleet."""


class NotFoundError(TunefleetError):
    """A requested record does not exist."""


class ArtifactStoreError(TunefleetError):
    """The artifact store cannot be reached or used."""


class ArtifactNotFoundError(ArtifactStoreError, NotFoundError):
    """No artifact under that key."""


class ArtifactStoreUnavailableError(ArtifactStoreError, TransientError):
    """The artifact store could not be reached or answered with a server error."""


class NotSupportedError(TunefleetError):
    """A feature or input that tunefleet does not support (yet)."""


class ParameterError(TunefleetError):
    """A parameter of a command, flow or tuning run is invalid."""


class CorrectnessError(TunefleetError):
    """A result is wrong: e.g. a tuned build whose outputs disagree with the untuned build's."""


def is_transient(exc: BaseException) -> bool:
    """True for failures worth retrying: connection problems and lease conflicts, never bad input."""
    return isinstance(exc, TransientError)


def one_line(text: object, limit: int = 400) -> str:
    """``text`` (a message, an exception) as one line of at most ``limit`` characters: what an
    error message quotes from a library or a child process, whose own text may span lines. An
    exception with no message is named by its type."""
    line = " ".join(str(text).split()) or (type(text).__name__ if isinstance(text, BaseException) else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."
