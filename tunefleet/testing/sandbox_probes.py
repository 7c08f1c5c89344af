"""Misbehaving functions for :func:`tunefleet.models.sandbox.run_isolated`, as a hostile or broken
model parser would behave: run only inside a sandbox child, by tests."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def sleep(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Hang for ``payload["seconds"]``."""
    time.sleep(float(payload["seconds"]))
    return {}


def spin(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Burn CPU until stopped."""
    while True:
        pass


def allocate(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Ask for ``payload["bytes"]`` of memory at once."""
    block = bytearray(int(payload["bytes"]))
    return {"allocated": len(block)}


def crash(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Die of a segmentation fault, as a native parser with a bug does."""
    os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(10)
    return {}


def say(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Fail with a model-format error whose message is ``payload["message"]`` (untrusted text)."""
    from tunefleet.models.frontends import ModelFormatError

    raise ModelFormatError(str(payload["message"]))


def fail(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Fail with an exception that is not one of tunefleet's."""
    raise KeyError("archive_format")


def exit_silently(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """Leave without an answer."""
    os._exit(3)


def parse_reporting_environ(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A model parser (:data:`tunefleet.models.sandbox.PARSE_ENTRY`) that parses the file and names
    its inputs after the environment it ran in, ``NAME=value`` each: what it could have sent away."""
    from tunefleet.models.sandbox import parse_in_child

    answer = parse_in_child(workdir, payload)
    answer["inputs"] = [[f"{k}={v}", [1], "float32"] for k, v in sorted(os.environ.items())]
    return answer


def parse_with_negative_shape(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A parser whose answer does not hold together: a negative dimension."""
    from tunefleet.models.sandbox import parse_in_child

    answer = parse_in_child(workdir, payload)
    answer["inputs"] = [["x", [-1, 8], "float32"]]
    return answer


def parse_with_garbage_module(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """A parser whose module is not TVM's JSON of a module."""
    (workdir / "out" / "module.json").write_text('{"root": 1, "nodes": [{"type_key": "Bogus"}]}', encoding="utf-8")
    return {"format": "onnx", "inputs": [["x", [1, 8], "float32"]]}
