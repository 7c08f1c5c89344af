"""Parse untrusted model files in a child process that holds no secrets.

A model file (ONNX, a ``torch.export`` ``.pt2`` archive) comes from whoever ingests it, and its
parsers (protobuf and onnx, torch's archive reader, TVM's frontends) are large native code. The
process that ingests, extracts and builds holds the database URL, the S3 keys and the Prefect API
credentials in its environment. So :func:`parse_model` hands the bytes to a fresh interpreter
(``python -m tunefleet.models.sandbox``) that

* gets an environment built from a short allowlist (:func:`scrubbed_environ`): no ``TUNEFLEET_*``
  setting, no ``PREFECT_*`` (API URL, key or auth string), no AWS/S3 keys, nothing else; its
  home, temporary directory and working directory are a private scratch directory;
* cannot read the parent's memory or environment through ``/proc``: the parent is made
  non-dumpable while a child runs (``prctl(PR_SET_DUMPABLE, 0)``), and the child drops every
  Linux capability and sets ``no_new_privs`` before it reads a byte of the file (a child of a root
  process would otherwise keep ``CAP_SYS_PTRACE``);
* runs under limits: ``timeout_s`` of wall time (then it is killed), ``memory_bytes`` of address
  space and ``timeout_s`` of CPU time (``setrlimit``), no core file;
* returns only plain data: the format, the inputs, and the Relax module as TVM's own JSON
  (``tvm.ir.save_json``), which the parent loads with ``tvm.ir.load_json`` and checks.

A failure is one :class:`~tunefleet.models.frontends.ModelFormatError` line naming the file: the
parser's own reason, the limit that stopped it, or the signal that killed it.

It also confines itself with Landlock before it reads the file (:mod:`tunefleet.models.landlock`):
no other process's ``/proc`` entries, writes only in its scratch directory, and on Linux 6.7+
no TCP connection at all. A kernel without Landlock (or its TCP rules) leaves those two open and
is said once as a warning (see ``docs/cluster.md``, "Untrusted model files"). :func:`probe`
reports what a child sees.

The child runs any function ``module:function`` of a ``tunefleet`` module the parent names
(:func:`run_isolated`): ``function(workdir, payload) -> dict``, reading its input files from
``workdir / "in"`` and writing large outputs to ``workdir / "out"``.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, TunefleetError, one_line

if TYPE_CHECKING:
    from tunefleet.models.frontends import InputInfo, LoadedModel

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_MEMORY_BYTES",
    "DEFAULT_TIMEOUT_S",
    "ParsedModel",
    "SandboxError",
    "parse_model",
    "probe",
    "run_isolated",
    "scrubbed_environ",
]

DEFAULT_TIMEOUT_S = 600.0
"""Seconds a child may take (wall and CPU) before it is stopped."""
DEFAULT_MEMORY_BYTES = 8 << 30
"""Address space a child may map (``RLIMIT_AS``): 8 GiB, several times what TVM, onnx and torch
map once imported (about 1.1 GiB) plus room for a model of a few hundred megabytes."""

#: Environment variables a child keeps (exact names): how to find Python, the libraries and the
#: locale, and how many threads to use. Nothing else of the parent's environment reaches it.
ENV_KEEP = frozenset({
    "PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE",
    "VIRTUAL_ENV", "TVM_LIBRARY_PATH", "TVM_HOME", "TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
})
ENV_KEEP_PREFIXES = ("LC_",)
#: Never kept, whatever the lists above say: names that look like credentials.
_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSW|AUTH|CREDENTIAL|SESSION|COOKIE", re.IGNORECASE)

PARSE_ENTRY = "tunefleet.models.sandbox:parse_in_child"
"""The function a child runs to parse a model file (``module:function``, see :func:`run_isolated`)."""

_ENTRY = re.compile(r"^tunefleet(\.[A-Za-z_][A-Za-z0-9_]*)+:[A-Za-z_][A-Za-z0-9_]*$")
_MAX_RESULT_BYTES = 4 << 20
_MAX_MESSAGE_CHARS = 400
_PR_GET_DUMPABLE, _PR_SET_DUMPABLE = 3, 4
_PR_CAPBSET_DROP = 24
_PR_SET_NO_NEW_PRIVS = 38
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_CAPABILITY_VERSION_3 = 0x20080522


class SandboxError(TunefleetError):
    """A child stopped without an answer: it ran out of time or memory, or a signal killed it."""


# -- the parent ----------------------------------------------------------------------------------

def scrubbed_environ(environ: Mapping[str, str] | None = None, *, home: str | os.PathLike[str]) -> dict[str, str]:
    """The environment of a child: the allowlisted names of ``environ`` (default ``os.environ``)
    whose names do not look like credentials, with ``HOME`` and the temporary directory at ``home``."""
    source = os.environ if environ is None else environ
    env = {name: value for name, value in source.items()
           if (name in ENV_KEEP or name.startswith(ENV_KEEP_PREFIXES)) and not _SECRET_NAME.search(name)}
    env.update({"HOME": str(home), "TMPDIR": str(home), "TMP": str(home), "TEMP": str(home),
                "PYTHONNOUSERSITE": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    # The child imports the tunefleet this process runs, installed or not (its working
    # directory is the scratch directory, not this one's).
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:  # pragma: no cover - every Linux has a libc
        return None


class _Undumpable:
    """Keeps this process non-dumpable while any child runs (counted: threads may parse at once),
    so that a child of the same user cannot read its memory or environment through /proc."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._before = 1

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        libc = _libc()
        if libc is None:
            yield
            return
        with self._lock:
            if self._count == 0:
                self._before = int(libc.prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0))
                libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
            self._count += 1
        try:
            yield
        finally:
            with self._lock:
                self._count -= 1
                if self._count == 0 and self._before == 1:
                    libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


_undumpable = _Undumpable()


def _one_line(text: object, limit: int = _MAX_MESSAGE_CHARS) -> str:
    """A child's message as one bounded line of printable characters (it is untrusted text)."""
    return one_line("".join(ch if ch.isprintable() else " " for ch in str(text)), limit)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return _one_line(" | ".join(line for line in text.splitlines()[-lines:] if line.strip()))


def run_isolated(entry: str, payload: Mapping[str, Any] | None = None, *, files: Mapping[str, bytes] | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S, memory_bytes: int = DEFAULT_MEMORY_BYTES,
                 what: str = "the child", confine: bool = True) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Run ``entry`` (``"tunefleet.module:function"``) in a child process that holds no secrets.

    Parameters
    ----------
    entry : str
        The function the child calls as ``function(workdir, payload)``; it returns a JSON-able dict.
    payload : mapping, optional
        JSON-able arguments.
    files : mapping of str to bytes, optional
        Input files, written to ``workdir / "in" / name`` (the child reads them there).
    timeout_s : float
        Wall-clock seconds before the child is killed; also its CPU-time limit.
    memory_bytes : int
        The child's address-space limit.
    what : str
        What the child does, for messages (e.g. the model's file name).
    confine : bool
        Confine the child with Landlock (:func:`tunefleet.models.landlock.confine`; tests turn it
        off to show what each other guard does alone).

    Returns
    -------
    tuple of (dict, dict)
        The function's result, and the files it wrote under ``workdir / "out"`` by name.

    Raises
    ------
    TunefleetError
        The function's own error with its message (one printable line): a model-format,
        missing-dependency, not-supported or configuration error as that class; any other as
        :class:`SandboxError` naming its type.
    SandboxError
        The child ran out of time or memory, or died of a signal, or answered nothing usable.
    """
    if not _ENTRY.match(entry):
        raise ValueError(f"invalid sandbox entry {entry!r}: use 'tunefleet.module:function'")
    if timeout_s <= 0 or memory_bytes <= 0:
        raise ValueError("timeout_s and memory_bytes must be > 0")
    workdir = Path(tempfile.mkdtemp(prefix="tunefleet-sandbox-"))  # mode 0700
    try:
        (workdir / "in").mkdir()
        (workdir / "out").mkdir()
        (workdir / "home").mkdir()
        for name, data in (files or {}).items():
            if "/" in name or name in {"", ".", ".."}:
                raise ValueError(f"invalid input file name {name!r}")
            (workdir / "in" / name).write_bytes(data)
        request = {"payload": dict(payload or {}), "confine": bool(confine),
                   "limits": {"memory_bytes": int(memory_bytes), "cpu_s": int(timeout_s) + 1}}
        (workdir / "request.json").write_text(json.dumps(request), encoding="utf-8")
        env = scrubbed_environ(home=workdir / "home")
        log_path = workdir / "child.log"
        started = time.monotonic()
        with _undumpable(), open(log_path, "wb") as child_log:
            proc = subprocess.Popen([sys.executable, "-m", __name__, entry, str(workdir)], env=env, cwd=workdir,
                                    stdin=subprocess.DEVNULL, stdout=child_log, stderr=subprocess.STDOUT,
                                    close_fds=True, start_new_session=True)
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise SandboxError(f"{what}: stopped after {timeout_s:g} s (the time limit of parsing)") from None
            finally:
                with contextlib.suppress(ProcessLookupError):  # anything the child left behind
                    os.killpg(proc.pid, signal.SIGKILL)
        log.debug("%s: child %s exited with %s after %.2f s", what, entry, code, time.monotonic() - started)
        result_path = workdir / "result.json"
        if code < 0:
            sig = -code
            hint = {signal.SIGKILL: " (out of memory?)", signal.SIGXCPU: " (the CPU-time limit of parsing)"}.get(sig, "")
            raise SandboxError(f"{what}: the parser was killed by {_signal_name(sig)}{hint}")
        if not result_path.is_file():
            raise SandboxError(f"{what}: the parser exited with status {code} and no answer "
                               f"({_log_tail(log_path) or 'no output'})")
        if result_path.stat().st_size > _MAX_RESULT_BYTES:
            raise SandboxError(f"{what}: the parser's answer is larger than {_MAX_RESULT_BYTES >> 20} MiB")
        try:
            answer = json.loads(result_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise SandboxError(f"{what}: the parser's answer is not JSON ({_one_line(exc)})") from None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise SandboxError(f"{what}: the parser's answer has no outcome")
        if not answer["ok"]:
            raise _error_from(answer.get("error"), what, memory_bytes)
        _say_confinement(str(answer.get("confined", "none")))
        result = answer.get("result")
        if not isinstance(result, dict):
            raise SandboxError(f"{what}: the parser's answer has no result")
        outputs = {p.name: p.read_bytes() for p in sorted((workdir / "out").iterdir()) if p.is_file()}
        return result, outputs
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


_SAID: set[str] = set()


def _applied() -> str:
    from tunefleet.models import landlock

    return landlock.APPLIED


def _say_confinement(confined: str) -> None:
    """Warn once per process where the kernel could not confine the parser fully."""
    if confined != "files and TCP" and not confined.startswith("none (turned off)") and confined not in _SAID:
        _SAID.add(confined)
        log.warning("model files are parsed in a child process confined by Landlock to: %s; without its file "
                    "rules the parser can read other processes' /proc entries, without its TCP rules it can open "
                    "connections (docs/cluster.md, \"Untrusted model files\")", confined)


def _error_from(error: object, what: str, memory_bytes: int) -> TunefleetError:
    """The exception a child reported, rebuilt from plain data: tunefleet's classes by name only."""
    from tunefleet import errors
    from tunefleet.models import frontends

    if not isinstance(error, dict):
        return SandboxError(f"{what}: the parser failed without saying why")
    name, message = str(error.get("type", "")), _one_line(error.get("message", ""))
    if name == "MemoryError":
        return SandboxError(f"{what}: parsing needs more memory than its limit ({memory_bytes / (1 << 30):g} GiB)")
    known: dict[str, type[TunefleetError]] = {
        "ModelFormatError": frontends.ModelFormatError, "MissingDependencyError": frontends.MissingDependencyError,
        "NotSupportedError": NotSupportedError, "ConfigError": errors.ConfigError, "SandboxError": SandboxError}
    cls = known.get(name)
    if cls is None:
        return SandboxError(f"{what}: the parser failed ({name}: {message})" if name else f"{what}: {message}")
    return cls(message or f"{what}: {name}")


# -- the child -----------------------------------------------------------------------------------

def _drop_privileges() -> None:
    """No capability, no way back to one (no_new_privs): what a process can do to itself unprivileged."""
    libc = _libc()
    if libc is None:
        return
    libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    for cap in range(64):  # the bounding set, where allowed (needs CAP_SETPCAP): fails quietly otherwise
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]

    empty = (Data * 2)()
    if libc.capset(ctypes.byref(Header(_CAPABILITY_VERSION_3, 0)), empty) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def _set_limits(memory_bytes: int, cpu_s: int) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 5))


def _child_main(entry: str, workdir: Path) -> int:
    """Run in the child: drop privileges, set the limits, call ``entry``, write ``result.json``."""
    result_path = workdir / "result.json"
    try:
        _drop_privileges()
        request = json.loads((workdir / "request.json").read_text(encoding="utf-8"))
        limits = request["limits"]
        _set_limits(int(limits["memory_bytes"]), int(limits["cpu_s"]))
        from tunefleet.models import landlock

        if request.get("confine", True):
            landlock.confine(workdir)  # before the entry's imports start any thread
        else:
            landlock.APPLIED = "none (turned off)"
        if not _ENTRY.match(entry):
            raise ValueError(f"invalid sandbox entry {entry!r}")
        module, _, name = entry.partition(":")
        function = getattr(importlib.import_module(module), name)
        answer: dict[str, Any] = {"ok": True, "result": function(workdir, request.get("payload") or {}),
                                  "confined": _applied()}
    except MemoryError:
        answer = {"ok": False, "error": {"type": "MemoryError", "message": ""}}
    except Exception as exc:  # noqa: BLE001 - every failure becomes plain data for the parent
        answer = {"ok": False, "error": {"type": type(exc).__name__, "message": _one_line(exc)}}
    result_path.write_text(json.dumps(answer), encoding="utf-8")
    return 0


# -- model files ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class ParsedModel:
    """What the child made of a model file: plain data.

    Attributes
    ----------
    format : str
        ``"onnx"`` or ``"pt2"``.
    input_info : list of (name, shape, dtype)
        The model's inputs, in the order of ``main``'s parameters.
    module_json : str
        The Relax module (weights bound as constants), as ``tvm.ir.save_json`` wrote it.
    """

    format: str
    input_info: list[InputInfo]
    module_json: str

    def loaded(self, name: str = "model") -> LoadedModel:
        """The module as a :class:`~tunefleet.models.frontends.LoadedModel` (no PyTorch module: none
        leaves the child), checked to be an IRModule with a ``main`` function."""
        import tvm

        from tunefleet.models.frontends import LoadedModel, ModelFormatError

        try:
            mod = tvm.ir.load_json(self.module_json)
        except Exception as exc:  # noqa: BLE001 - TVM raises its own error kinds
            raise ModelFormatError(f"{name}: the parser's module cannot be loaded ({_one_line(exc)})") from None
        if not isinstance(mod, tvm.IRModule) or "main" not in {gv.name_hint for gv in mod.get_global_vars()}:
            raise ModelFormatError(f"{name}: the parser returned no module with a main function")
        return LoadedModel(mod=mod, params=None, input_info=list(self.input_info), torch_module=None)


def _input_info(value: object, name: str) -> list[InputInfo]:
    from tunefleet.models.frontends import ModelFormatError

    out: list[InputInfo] = []
    if isinstance(value, list) and len(value) <= 10_000:
        for item in value:
            if not (isinstance(item, list) and len(item) == 3 and isinstance(item[0], str) and isinstance(item[2], str)
                    and isinstance(item[1], list)
                    and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in item[1])):
                break
            out.append((item[0], tuple(item[1]), item[2]))
        else:
            return out
    raise ModelFormatError(f"{name}: the parser returned malformed inputs")


def parse_model(data: bytes, filename: str, fmt: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                memory_bytes: int = DEFAULT_MEMORY_BYTES) -> ParsedModel:
    """Parse a model file into a Relax module in a child process that holds no secrets.

    Parameters
    ----------
    data : bytes
        The file's contents.
    filename : str
        Its name: for its extension and for messages.
    fmt : str, optional
        ``"onnx"`` or ``"pt2"``; detected from the contents when omitted.
    timeout_s, memory_bytes
        The child's limits (:func:`run_isolated`).

    Returns
    -------
    ParsedModel

    Raises
    ------
    ModelFormatError
        One line naming the file: not a model, a model TVM cannot import, or a parse that ran
        out of time or memory or crashed.
    MissingDependencyError
        The frontend's package (onnx, torch) is not installed.
    """
    from tunefleet.models.frontends import ModelFormatError

    if fmt not in (None, "onnx", "pt2"):
        raise NotSupportedError(f"not supported: model format {fmt!r}; onnx or pt2")
    try:
        result, outputs = run_isolated(PARSE_ENTRY, {"filename": filename, "format": fmt},
                                       files={"model": data}, timeout_s=timeout_s, memory_bytes=memory_bytes,
                                       what=filename)
    except SandboxError as exc:
        raise ModelFormatError(str(exc)) from None
    found = result.get("format")
    if found not in ("onnx", "pt2") or (fmt is not None and found != fmt):
        raise ModelFormatError(f"{filename}: the parser returned an unknown format")
    module = outputs.get("module.json")
    if module is None:
        raise ModelFormatError(f"{filename}: the parser returned no module")
    return ParsedModel(found, _input_info(result.get("inputs"), filename), module.decode("utf-8", errors="replace"))


def parse_in_child(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The child's side of :func:`parse_model` (runs only in the child)."""
    import tvm

    from tunefleet.models.frontends import (
        detect_format,
        load_exported_program,
        load_onnx,
    )

    filename = str(payload["filename"])
    data = (workdir / "in" / "model").read_bytes()
    fmt = payload.get("format") or detect_format(data, filename)
    loaded = load_onnx(data, filename) if fmt == "onnx" else load_exported_program(data, filename)
    (workdir / "out" / "module.json").write_text(tvm.ir.save_json(loaded.mod), encoding="utf-8")
    return {"format": fmt, "inputs": [[n, [int(d) for d in s], str(t)] for n, s, t in loaded.input_info]}


# -- what a child sees ---------------------------------------------------------------------------

def probe(*, timeout_s: float = 60.0, connect: tuple[str, int] | None = None, confine: bool = True) -> dict[str, Any]:
    """What a child sees, from inside one: its environment, user, capabilities, limits, its
    Landlock confinement, whether it can read its parent's environment (``/proc/<ppid>/environ``)
    and, with ``connect`` (host, port), whether it can open a TCP connection there."""
    result, _ = run_isolated("tunefleet.models.sandbox:probe_in_child", {"connect": list(connect) if connect else None},
                             timeout_s=timeout_s, what="sandbox probe", confine=confine)
    return result


def probe_in_child(workdir: Path, payload: Mapping[str, Any]) -> dict[str, Any]:
    """The child's side of :func:`probe`."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    try:
        Path(f"/proc/{os.getppid()}/environ").read_bytes()
        parent_environ = True
    except OSError:
        parent_environ = False
    connect = payload.get("connect")
    tcp: str | None = None
    if connect:  # [host, port] of a listening socket: can the child reach it?
        import socket

        try:
            socket.create_connection((str(connect[0]), int(connect[1])), timeout=5).close()
            tcp = "connected"
        except OSError as exc:
            tcp = f"refused: {exc}"
    return {
        "confined": _applied(),
        "tcp": tcp,
        "environ": dict(os.environ),
        "uid": os.getuid(),
        "cap_effective": int(status.get("CapEff", "0").strip(), 16),
        "no_new_privs": status.get("NoNewPrivs", "").strip() == "1",
        "rlimit_as": resource.getrlimit(resource.RLIMIT_AS)[0],
        "rlimit_cpu": resource.getrlimit(resource.RLIMIT_CPU)[0],
        "cwd": os.getcwd(),
        "parent_environ_readable": parent_environ,
    }


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m tunefleet.models.sandbox tunefleet.module:function WORKDIR (run by run_isolated)",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(_child_main(sys.argv[1], Path(sys.argv[2])))
