"""Fixtures for the artifact store tests: a real S3 service and a store per backend.

The S3 backend runs against a real SeaweedFS server started once per session. If that
server cannot start, the S3 tests error out; they are never skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tunefleet.store import ArtifactStore, LocalStore, S3Store
from tunefleet.testing.seaweedfs import SeaweedFSServer, unique_bucket_name



@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> ArtifactStore:
    """An empty store of each backend: a fresh directory, or a fresh bucket under a prefix."""
    if request.param == "local":
        return LocalStore(tmp_path / "artifacts")
    server: SeaweedFSServer = request.getfixturevalue("seaweedfs")
    return S3Store(
        server.endpoint,
        server.access_key,
        server.secret_key,
        unique_bucket_name("contract"),
        prefix="tunefleet/artifacts",
    )
