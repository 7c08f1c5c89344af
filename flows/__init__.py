"""Prefect flows (importable as ``tunefleet.flows``) chaining the tunefleet tasks."""
