"""The resources one process works with: settings, database, artifact store, tuners.

The CLI builds one :class:`Context` per command; Prefect tasks share one per process (and per
settings) through :func:`shared_context`, so consecutive tasks of a flow run reuse the database
connection pool and the tuner's builder and runner processes instead of starting them again.
"""

from __future__ import annotations

import atexit
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import Tuner
    from tunefleet.store import ArtifactStore


class Context:
    """Lazily opened database and store (hardware classes seeded and the hub bundle imported
    once), and one tuner per class."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._db: Database | None = None
        self._store: ArtifactStore | None = None
        self._tuners: dict[str, Tuner] = {}
        self._lock = threading.Lock()

    @property
    def db(self) -> Database:
        with self._lock:
            if self._db is None:
                from tunefleet.db import Database
                from tunefleet.hardware import ensure_hardware_classes

                db = Database.from_settings(self.settings)
                ensure_hardware_classes(db, self.settings)
                if self.settings.hub != "off":
                    from tunefleet.learning.hub import ensure_hub

                    # The fleet's schedules on first use (the shipped bundle, or the one set).
                    ensure_hub(db, self.settings.hub, self._store_unlocked()
                               if self.settings.hub.startswith("s3://") else None,
                               token=self.settings.registry_token.get_secret_value() or None)
                self._db = db
            return self._db

    @property
    def store(self) -> ArtifactStore:
        with self._lock:
            return self._store_unlocked()

    def _store_unlocked(self) -> ArtifactStore:
        if self._store is None:
            from tunefleet.store import open_store

            self._store = open_store(self.settings)
        return self._store

    def options(self, **overrides: object) -> TuneOptions:
        """The settings' tuning options with ``overrides`` (None leaves a setting), validated."""
        from tunefleet.engine.options import TuneOptions

        return TuneOptions.from_settings(self.settings, **overrides)

    def tuner(self, hardware: str) -> Tuner:
        """The tuner of a hardware class, created on first use and kept until :meth:`close`."""
        from tunefleet.engine.worker import Tuner

        db = self.db
        with self._lock:
            tuner = self._tuners.get(hardware)
            if tuner is None:
                tuner = self._tuners[hardware] = Tuner(db, hardware, self.options(), store=self._store_unlocked())
            return tuner

    def close(self) -> None:
        with self._lock:
            tuners, self._tuners = list(self._tuners.values()), {}
            db, self._db = self._db, None
        for tuner in tuners:
            tuner.close()
        if db is not None:
            db.close()


_SHARED: dict[str, Context] = {}
_SHARED_LOCK = threading.Lock()


def shared_context(settings: Settings | None = None) -> Context:
    """The process-wide context for these settings (loaded from the environment by default)."""
    from tunefleet.config import load_settings

    settings = settings or load_settings()
    key = settings.model_dump_json()
    with _SHARED_LOCK:
        ctx = _SHARED.get(key)
        if ctx is None:
            if not _SHARED:
                atexit.register(close_shared_contexts)
            ctx = _SHARED[key] = Context(settings)
        return ctx


def close_shared_contexts() -> None:
    """Stop every shared context's tuner processes and close its connections (also at exit)."""
    with _SHARED_LOCK:
        contexts = list(_SHARED.values())
        _SHARED.clear()
    for ctx in contexts:
        ctx.close()


