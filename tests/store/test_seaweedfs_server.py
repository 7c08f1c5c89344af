"""The suite's S3 server itself: it takes every bucket the suite makes, whatever the disk holds."""

from __future__ import annotations

import json
import urllib.request

from tunefleet.store import S3Store
from tunefleet.testing.seaweedfs import MAX_VOLUMES, SeaweedFSServer, unique_bucket_name

#: More buckets than weed's own limit allowed on the disk of a development VM (docs/performance.md,
#: "Test suite"): each bucket holds its own volumes.
BUCKETS = 40


def test_the_volume_limit_is_fixed_and_every_new_bucket_takes_a_write(seaweedfs: SeaweedFSServer) -> None:
    url = f"http://127.0.0.1:{seaweedfs.ports['master.port']}/dir/status"
    with urllib.request.urlopen(url, timeout=10) as reply:
        topology = json.load(reply)["Topology"]
    assert topology["Max"] == MAX_VOLUMES  # not derived from the disk's free space
    for _ in range(BUCKETS):
        store = S3Store(seaweedfs.endpoint, seaweedfs.access_key, seaweedfs.secret_key,
                        unique_bucket_name("volumes"))
        store.put_bytes("one.bin", b"1")
        assert store.get_bytes("one.bin") == b"1"
