"""The schedule registry: the fleet's schedules over HTTP (``tunefleet serve``).

:mod:`~tunefleet.registry.app` is the FastAPI application; like the CLI, it is a thin layer over
:mod:`tunefleet.api`. Its bearer tokens live in the database (:mod:`tunefleet.db.tokens`).
"""
