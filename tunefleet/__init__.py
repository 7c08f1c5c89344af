"""tunefleet: tuned deep-learning tensor programs at fleet scale.

The Python API is :mod:`tunefleet.api`; its calls are here too, loaded on first use so that
``import tunefleet`` stays cheap (no TVM, torch or database until a call needs them):

>>> import tunefleet
>>> ctx = tunefleet.connect()  # doctest: +SKIP
>>> model = tunefleet.ingest(ctx, "mlp").model  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from tunefleet.version import __version__

#: The calls of :mod:`tunefleet.api` that ``tunefleet.<name>`` also names.
API = ("Context", "best", "best_for", "build", "build_exported", "connect", "extract", "hub_export", "hub_import",
       "ingest", "tune", "tune_with_workers")

__all__ = ["__version__", *API]


def __getattr__(name: str) -> Any:
    if name in API:
        from tunefleet import api

        return getattr(api, name)
    raise AttributeError(f"module 'tunefleet' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
