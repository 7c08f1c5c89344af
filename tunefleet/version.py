"""The version of tunefleet: written here alone (pyproject reads it; tests/test_version.py checks
every image tag against it). A module of its own, so that importing it imports nothing else."""

__version__ = "0.1.0"
