"""The artifact store contract, run against every backend of the ``store`` fixture."""

from __future__ import annotations

from tunefleet.testing.store_contract import StoreContract


class TestStoreContract(StoreContract):
    """LocalStore and S3Store (on a real SeaweedFS) meet the same specification."""
