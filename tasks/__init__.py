"""Prefect tasks (importable as ``tunefleet.tasks``): thin wrappers over the tunefleet core."""
