"""What in the artifact store the database points to, and the collection of the rest (``tunefleet gc``).

The database is the source of truth for what exists; the store holds only what the database
points to. Every artifact is written first, under a key no other write uses (:func:`unique_name`:
its version number and a random token), then registered in the database — table ``artifacts``,
see :class:`~tunefleet.db.tables.Artifact` — in the transaction that records its owner: a dataset
version with the marks of the measurements it took, a cost model with its metrics and promotion.
Until that commit, and for good when it never comes (a process killed in between, a commit
refused), the files are *garbage*: nothing reads them (:func:`tunefleet.learning.dataset.load` and
retraining list versions from the database, workers load the model the database calls current),
and :func:`collect` deletes them once they are older than a grace period, so that an export or a
retrain still writing is never touched. A failed export or retrain deletes its own files at once
only when the database says it registered nothing; when it cannot tell (the database is
unreachable), it leaves them to :func:`collect`.

A kind of artifact is a root folder of the store and the depth of one registered unit in it:

==============  ===============  ======================================================
kind            root             one unit (one row of ``artifacts``)
==============  ===============  ======================================================
``dataset``     ``datasets/``    ``datasets/v3-1a2b3c4d/`` (a folder: Parquet + manifest)
``cost_model``  ``costmodels/``  ``costmodels/x86/v3-1a2b3c4d.json``
==============  ===============  ======================================================

Only these roots are collected: models, workloads and anything else in the store are never
touched. A new kind (hub bundles, built libraries) adds itself to :data:`KINDS` and registers each
unit with its owner's row, in one transaction, as datasets and cost models do.

One store, one database: :func:`collect` deletes what under these roots the database it is given
does not list, so two tunefleet databases must not share a store (or an S3 prefix).
"""

from __future__ import annotations

import datetime as dt
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.store import ArtifactStore, StoredObject

log = logging.getLogger(__name__)

#: How old an unregistered file must be before :func:`collect` deletes it: longer than any export
#: or retrain takes from its first write to its commit.
DEFAULT_GRACE = dt.timedelta(days=1)


@dataclass(frozen=True)
class Kind:
    """A kind of artifact: where its units live in the store, and how many key segments name one."""

    name: str
    root: str
    """Its folder in the store, ending in ``/``."""
    depth: int
    """Key segments of one unit: ``datasets/<unit>/...`` is 2 (a folder), ``costmodels/<class>/<file>`` 3."""

    def unit(self, key: str) -> str:
        """The unit ``key`` belongs to: a folder (ending in ``/``) or the key itself."""
        parts = key.split("/")
        return "/".join(parts[: self.depth]) + "/" if len(parts) > self.depth else key


DATASET = Kind("dataset", "datasets/", 2)
COST_MODEL = Kind("cost_model", "costmodels/", 3)
#: Every kind of artifact the database registers, by name (the ``artifacts.kind`` column).
KINDS: dict[str, Kind] = {k.name: k for k in (DATASET, COST_MODEL)}


def unique_name(version: int) -> str:
    """``v<version>-<8 hex digits>``: a name no other export or retrain writes under, even one that
    reserved the same version number after a failed one gave it back."""
    return f"v{version}-{secrets.token_hex(4)}"


@dataclass
class Unit:
    """One unregistered unit of a kind: its objects, their total size, when the newest was written."""

    kind: str
    name: str
    keys: list[str] = field(default_factory=list)
    size: int = 0
    modified: dt.datetime | None = None

    def add(self, obj: StoredObject) -> None:
        self.keys.append(obj.key)
        self.size += obj.size
        self.modified = obj.modified if self.modified is None else max(self.modified, obj.modified)


@dataclass
class Collection:
    """What :func:`collect` found: units deleted (or, in a dry run, to delete) and units kept."""

    grace: dt.timedelta
    dry_run: bool
    deleted: list[Unit] = field(default_factory=list)
    """Unregistered units older than the grace period: deleted, or would be in a dry run."""
    young: list[Unit] = field(default_factory=list)
    """Unregistered units written within the grace period (maybe an export or retrain still running): kept."""
    registered: int = 0
    """Units the database points to: kept."""


def collect(
    db: Database,
    store: ArtifactStore,
    *,
    grace: dt.timedelta = DEFAULT_GRACE,
    dry_run: bool = False,
    now: dt.datetime | None = None,
    kinds: Iterable[Kind] | None = None,
) -> Collection:
    """Delete every unit under the kinds' roots that no row of ``artifacts`` lists, once it is old.

    Parameters
    ----------
    grace
        A unit is deleted only when its newest object was written longer ago than this.
    dry_run
        Find and report, delete nothing.
    now
        The time to measure ages from (default: this machine's clock, UTC).
    kinds
        The kinds to collect (default: every kind of :data:`KINDS`).

    Returns
    -------
    Collection
        What was (or would be) deleted, and what was kept.

    Raises
    ------
    ArtifactStoreError, DatabaseError
        When the store or the database fails; what was deleted until then stays deleted, and
        running it again goes on.
    """
    if grace < dt.timedelta(0):
        from tunefleet.errors import ParameterError

        raise ParameterError(f"invalid grace period: {grace} (must not be negative)")
    now = now or dt.datetime.now(dt.timezone.utc)
    cutoff = now - grace
    result = Collection(grace=grace, dry_run=dry_run)
    chosen = list(kinds) if kinds is not None else list(KINDS.values())
    # The store is listed before the database is read: a unit registered in between is seen as
    # registered. (One registered after the read was written before the listing, so it is older
    # than the grace period only when its export or retrain took longer than that to commit.)
    listed = {kind.name: list(store.list_objects(kind.root)) for kind in chosen}
    registered = [a.key for a in db.artifacts()]
    for kind in chosen:
        units: dict[str, Unit] = {}
        live: set[str] = set()
        for obj in listed[kind.name]:
            name = kind.unit(obj.key)
            units.setdefault(name, Unit(kind.name, name)).add(obj)
            if _covered(obj.key, name, registered):
                live.add(name)
        for name, unit in sorted(units.items()):
            if name in live:
                result.registered += 1
            elif unit.modified is not None and unit.modified > cutoff:
                result.young.append(unit)
            else:
                result.deleted.append(unit)
    if not dry_run:
        for unit in result.deleted:
            for key in unit.keys:
                store.delete(key)
            log.info("gc: deleted %s (%s, %d file(s), %d bytes, unregistered)", unit.name, unit.kind, len(unit.keys),
                     unit.size)
    return result


def _covered(key: str, unit: str, registered: list[str]) -> bool:
    """Whether a registered key is this object, a folder holding it, or something inside its unit."""
    return any(r == key or (r.endswith("/") and key.startswith(r)) or (unit.endswith("/") and r.startswith(unit))
               for r in registered)


__all__ = ["COST_MODEL", "DATASET", "DEFAULT_GRACE", "KINDS", "Collection", "Kind", "Unit", "collect", "unique_name"]
