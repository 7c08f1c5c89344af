"""The ``tunefleet`` command line."""
