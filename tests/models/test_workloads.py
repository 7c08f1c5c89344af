"""The line ``extract`` logs when a model's earlier workloads on a class are unlinked."""

from __future__ import annotations

from tunefleet.db.catalog import LinkChange
from tunefleet.models.workloads import unlink_warning


def test_a_recipe_change_names_the_recipes() -> None:
    line = unlink_warning("resnet18", "x86", "nhwc+prepack", LinkChange(20, [1, 2], 7, ["native"]))
    assert line == ("model resnet18 on x86: 2 workload(s) of recipe native unlinked: recipe nhwc+prepack does not tune "
                    "them; their 7 measurement(s) stay stored, and the build's comparison of recipes still uses them")


def test_the_same_recipe_extracting_other_workloads_says_so() -> None:
    # a new tunefleet that computes an operator differently (the Winograd transforms, say)
    line = unlink_warning("resnet18", "x86", "nhwc+winograd", LinkChange(20, [1] * 8, 40, []))
    assert line.startswith("model resnet18 on x86: 8 workload(s) unlinked: this tunefleet extracts them differently "
                           "under the same recipe nhwc+winograd")
    assert "their 40 measurement(s) stay stored, unused" in line and "?" not in line
