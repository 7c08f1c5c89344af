"""Test support shipped with tunefleet: real-service fixtures and contract test suites."""
