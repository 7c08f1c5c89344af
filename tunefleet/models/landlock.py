"""Landlock: what an unprivileged process can forbid itself (Linux 5.13+; TCP rules 6.7+).

The sandbox's child (:mod:`tunefleet.models.sandbox`) parses untrusted model files. Without
privileges it cannot leave its network or hide other processes, but Landlock lets any process
(with ``no_new_privs``) restrict itself and its future threads and children for good:

* **files**: read and execute anywhere but ``/proc``; of ``/proc``, only its own entries
  (``/proc/self``: the parent's and every other process's environment and memory stay closed)
  and a few system-wide read-only files the libraries read; write only in its scratch directory
  and to ``/dev/null``;
* **TCP** (Landlock ABI 4, Linux 6.7): no connect and no bind at all — no route to the Prefect
  API, the database, S3, a Pushgateway or a cloud metadata endpoint.

:func:`confine` says what it could apply; a kernel without Landlock (or without its TCP rules)
is reported, not hidden. The system calls have the same numbers on x86-64 and arm64.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

__all__ = ["APPLIED", "confine"]

APPLIED = "none (not confined)"
"""What :func:`confine` applied in this process, in its words."""

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_REMOVE_DIR, _REMOVE_FILE, _MAKE_CHAR, _MAKE_DIR, _MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
_MAKE_SOCK, _MAKE_FIFO, _MAKE_BLOCK, _MAKE_SYM = 1 << 9, 1 << 10, 1 << 11, 1 << 12
_REFER, _TRUNCATE = 1 << 13, 1 << 14  # ABI 2, ABI 3
_BIND_TCP, _CONNECT_TCP = 1 << 0, 1 << 1  # ABI 4

_READ = _EXECUTE | _READ_FILE | _READ_DIR
_FILE_ONLY = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE  # what a rule on a file (not a folder) may allow

#: Of /proc, besides the process's own entries: what Python, numpy, torch, onnx and TVM read.
_PROC_FILES = ("cpuinfo", "meminfo", "stat", "filesystems", "sys")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (or not on Linux)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    version = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def confine(scratch: Path) -> str:
    """:func:`_confine`, remembered in :data:`APPLIED`."""
    global APPLIED
    APPLIED = _confine(scratch)
    return APPLIED


def _confine(scratch: Path) -> str:
    """Restrict this process (call it before any thread starts: a rule binds the calling thread
    and what it starts later) as the module docstring says; what was applied, in words:
    ``"files and TCP"``, ``"files only (...)"`` or ``"none (...)"``. Needs ``no_new_privs``."""
    abi = abi_version()
    if abi < 1:
        return "none (this kernel has no Landlock)"
    libc = ctypes.CDLL(None, use_errno=True)
    write = _WRITE_FILE | _REMOVE_DIR | _REMOVE_FILE | _MAKE_CHAR | _MAKE_DIR | _MAKE_REG | _MAKE_SOCK | \
        _MAKE_FIFO | _MAKE_BLOCK | _MAKE_SYM | (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    handled_fs = _READ | write
    handled_net = (_BIND_TCP | _CONNECT_TCP) if abi >= 4 else 0
    attr = _RulesetAttr(handled_fs, handled_net)
    size = ctypes.sizeof(_RulesetAttr) if abi >= 4 else ctypes.sizeof(ctypes.c_uint64)
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        return f"none (landlock_create_ruleset: {os.strerror(ctypes.get_errno())})"
    try:
        def allow(path: str, access: int) -> None:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                return  # not on this system: nothing to allow
            try:
                if not os.path.isdir(path):
                    access &= _FILE_ONLY
                rule = _PathBeneathAttr(access & handled_fs, fd)
                if libc.syscall(_ADD_RULE, ruleset, ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                                ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
            finally:
                os.close(fd)

        for entry in os.listdir("/"):
            if entry != "proc":
                allow(f"/{entry}", _READ)
        allow("/proc/self", _READ)  # resolves to this process's own /proc/<pid>
        for name in _PROC_FILES:
            allow(f"/proc/{name}", _READ)
        allow("/dev/null", _READ_FILE | _WRITE_FILE | (_TRUNCATE if abi >= 3 else 0))
        allow(str(scratch), _READ | write)
        if libc.syscall(_RESTRICT_SELF, ruleset, ctypes.c_uint32(0)) != 0:
            return f"none (landlock_restrict_self: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return "files and TCP" if handled_net else f"files only (Landlock ABI {abi}: TCP rules need 4, Linux 6.7)"
