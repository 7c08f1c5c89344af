"""Hub bundles: a database's best schedules, carried to another database (and another machine).

A bundle is one Parquet file (zstd), format :data:`FORMAT` version :data:`FORMAT_VERSION`; one
row per record: the ``k`` fastest distinct schedules of a workload on a hardware class, with

* the workload itself (structural hash, name, op kind, FLOPs, TIR as JSON), so a database that
  never saw it can still use it;
* the class it was tuned on: its name, target, capabilities and the CPU it was measured on
  (model name, id, vector ISA: :func:`tunefleet.hardware.host_cpu`), and the extraction recipe;
* the record: trace, run times, mean, rank, TVM version, when it was measured.

The file's metadata says what it is (``format``, ``version``), when and from where it was made
(``created_at``, ``origin``) and the TVM version of its records. :func:`import_bundle` validates
before it loads: a file that is not a bundle, or of another format version, or of another TVM
version is refused in one line; a record of an unknown recipe or another TVM version, or one
that does not hold together (its trace's sha256, a run time) is skipped and counted. What is left
is loaded in one transaction (:meth:`tunefleet.db.hub.HubMixin.hub_import`): whole or not at all.

Imported records live under *hub classes*, one per class and CPU they were tuned on
(:func:`hub_class_name`), which no worker leases: the local class's searches start from them
(:class:`tunefleet.engine.policies.Transfer`), but a class's own best records are only ever what
was measured on it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import io
import json
import logging
import math
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, ParameterError
from tunefleet.vocab import HUB_POOL

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

FORMAT = "tunefleet-hub"
FORMAT_VERSION = 1
#: Records kept per workload and class by ``hub export``.
DEFAULT_TOP_K = 5

#: The columns of format version 1 and their Arrow types (built lazily: pyarrow is imported late).
_COLUMNS = (
    ("class_name", "string"), ("target", "string"), ("capabilities", "string"), ("cpu", "string"),
    ("layout", "string"), ("recipe", "string"),
    ("workload_hash", "string"), ("workload_name", "string"), ("op_kind", "string"), ("flops", "float64"),
    ("tir_json", "string"),
    ("rank", "int32"), ("trace_json", "string"), ("trace_sha256", "string"), ("args_info", "string"),
    ("run_secs", "list<float64>"), ("mean_run_s", "float64"), ("tvm_version", "string"), ("measured_at", "timestamp"),
)


def _schema() -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "float64": pa.float64(), "int32": pa.int32(),
             "list<float64>": pa.list_(pa.float64()), "timestamp": pa.timestamp("us")}
    return pa.schema([pa.field(name, types[kind]) for name, kind in _COLUMNS])


def tvm_version() -> str:
    import tvm

    return str(tvm.__version__)


def hub_class_name(class_name: str, cpu: dict[str, Any] | None, target: dict[str, Any]) -> str:
    """The hub class of records tuned on ``class_name`` on ``cpu`` with ``target``:
    ``hub:<class>@<cpu model, short>-<6 hex of target and CPU>`` (at most 64 characters)."""
    digest = hashlib.sha256(json.dumps([target, cpu], sort_keys=True).encode()).hexdigest()[:6]
    slug = re.sub(r"[^a-z0-9]+", "-", str((cpu or {}).get("model") or "unknown-cpu").lower()).strip("-")[:28]
    return f"hub:{class_name[:24]}@{slug}-{digest}"


# -- export ------------------------------------------------------------------------------------------
@dataclass
class ExportResult:
    """What ``hub export`` wrote."""

    output: str
    classes: list[str]
    workloads: int
    records: int
    size_bytes: int
    sha256: str

    def line(self) -> str:
        return (f"wrote {self.output}: {self.records} records of {self.workloads} workloads on "
                f"{', '.join(self.classes) or 'no class'} ({self.size_bytes / 1e6:.2f} MB)")


def export_bundle(db: Database, *, hardware: list[str] | None = None, workload_ids: dict[str, set[int]] | None = None,
                  top_k: int = DEFAULT_TOP_K) -> tuple[bytes, dict[str, Any]]:
    """A bundle of the ``top_k`` best records of every measured workload on each of ``hardware``
    (default: every class of this database but the hub classes), or of ``workload_ids[class]``;
    (its bytes, its summary)."""
    if top_k < 1:
        raise ParameterError(f"invalid --top-k: {top_k} (must be >= 1)")
    classes = [hw for hw in db.hardware_classes() if hw.node_pool != HUB_POOL
               and (hardware is None or hw.name in hardware)]
    missing = sorted(set(hardware or []) - {hw.name for hw in classes})
    if missing:
        db.hardware_class(missing[0])  # NotFoundError names the known ones
        raise ParameterError(f"hardware class {missing[0]!r} holds imported hub records; export the class they "
                             "came from, from its own database")
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"classes": []}
    for hw in classes:
        wanted = workload_ids.get(hw.name) if workload_ids is not None else None
        if workload_ids is not None and wanted is None:
            continue
        caps = dict(hw.capabilities or {})
        cpu = caps.pop("cpu", None)
        caps.pop("detected", None)  # the importing database's own classes are detected there
        records = db.hub_export_records(hw.id, top_k, wanted)
        if not records:
            continue
        common = {"class_name": hw.name, "target": json.dumps(hw.target, sort_keys=True),
                  "capabilities": json.dumps(caps, sort_keys=True), "cpu": json.dumps(cpu, sort_keys=True) if cpu else None,
                  "layout": hw.layout}
        for rec in records:
            rows.append({**common, **rec, "args_info": json.dumps(rec["args_info"]) if rec["args_info"] is not None
                         else None})
        summary["classes"].append({"class": hw.name, "cpu": (cpu or {}).get("model"), "target": hw.target,
                                   "workloads": len({r["workload_hash"] for r in records}), "records": len(records)})
    versions = sorted({r["tvm_version"] for r in rows}) or [tvm_version()]
    created = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    return _pack(rows, created_at=created, tvm=versions[-1], origin=f"tunefleet on {socket.gethostname()}",
                 summary=summary), summary


def _pack(rows: list[dict[str, Any]], *, created_at: str, tvm: str, origin: str, summary: dict[str, Any]) -> bytes:
    """A bundle's bytes: its records as zstd Parquet, with the format mark and summary in the metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = {"format": FORMAT, "version": str(FORMAT_VERSION), "created_at": created_at, "tvm": tvm,
            "origin": origin, "summary": json.dumps(summary, sort_keys=True)}
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=_schema()).replace_schema_metadata(meta), sink,
                   compression="zstd")
    return sink.getvalue()


def _write(store: ArtifactStore | None, output: str | Path, data: bytes) -> str:
    """A bundle's bytes written to ``output``: a file path, or ``s3://`` the artifact store's."""
    target = str(output)
    if target.startswith("s3://"):
        if store is None:
            raise ParameterError(f"cannot write {target}: no artifact store")
        store.put_bytes(store.key_from_uri(target), data, "application/vnd.apache.parquet")
    else:
        path = Path(target).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".part")
        tmp.write_bytes(data)
        tmp.replace(path)  # a reader never sees half a bundle
    return target


def write_bundle(db: Database, store: ArtifactStore | None, output: str | Path, *, hardware: list[str] | None = None,
                 workload_ids: dict[str, set[int]] | None = None, top_k: int = DEFAULT_TOP_K) -> ExportResult:
    """:func:`export_bundle` written to ``output``: a file path, or ``s3://`` the artifact store's."""
    data, summary = export_bundle(db, hardware=hardware, workload_ids=workload_ids, top_k=top_k)
    target = _write(store, output, data)
    return ExportResult(target, [c["class"] for c in summary["classes"]],
                        sum(c["workloads"] for c in summary["classes"]),
                        sum(c["records"] for c in summary["classes"]), len(data), hashlib.sha256(data).hexdigest())


# -- merge -------------------------------------------------------------------------------------------
@dataclass
class MergeResult:
    """What ``hub merge`` wrote."""

    output: str
    sources: list[str]
    classes: list[str]
    """Each class of the bundle as "<class> on <CPU>" (one per class, target and CPU)."""
    workloads: int
    records: int
    excluded: int
    """Records left out because their workload's name matched an ``exclude`` pattern."""
    dropped: int
    """Records left out as the same schedule twice, or beyond ``top_k`` of their workload and class."""
    size_bytes: int
    sha256: str

    def line(self) -> str:
        text = (f"wrote {self.output}: {self.records} records of {self.workloads} workloads from "
                f"{len(self.sources)} bundle(s), {len(self.classes)} class(es) ({'; '.join(self.classes)}), "
                f"{self.size_bytes / 1e6:.2f} MB")
        if self.dropped or self.excluded:
            text += f"; left out: {self.dropped} duplicate or beyond top-k, {self.excluded} excluded by name"
        return text


def merge_bundles(sources: list[tuple[str, bytes]], *, exclude: list[str] | None = None,
                  top_k: int = DEFAULT_TOP_K) -> tuple[bytes, MergeResult]:
    """One bundle of the records of several (``(name, bytes)`` each), e.g. one campaign's bundle per
    CPU: per workload, class, target and CPU, the ``top_k`` fastest distinct schedules, ranked again.

    ``exclude`` takes ``fnmatch`` patterns of workload names whose records are left out (records
    known to be wrong). Every source is checked as an import checks a file (format mark, version,
    columns); its records are carried as they are (the import checks each). Bundles of different
    TVM versions are refused. The same sources give the same bytes (the merge's ``created_at`` is
    the newest source's)."""
    import fnmatch

    from tunefleet.hardware import cpu_label

    if not sources:
        raise ParameterError("nothing to merge: name at least one bundle")
    if top_k < 1:
        raise ParameterError(f"invalid --top-k: {top_k} (must be >= 1)")
    metas: list[dict[str, str]] = []
    groups: dict[tuple[str, ...], dict[str, dict[str, Any]]] = {}
    seen = excluded = 0
    for name, data in sources:
        table, meta = _read_table(data, name)
        if metas and meta.get("tvm") != metas[0].get("tvm"):
            raise NotSupportedError(f"not supported: merging bundles of TVM {metas[0].get('tvm')} and "
                                    f"{meta.get('tvm')} ({name}): one bundle holds one TVM version's schedules")
        metas.append({**meta, "sha256": hashlib.sha256(data).hexdigest()})
        for row in table.to_pylist():
            seen += 1
            if any(fnmatch.fnmatchcase(row["workload_name"] or "", pat) for pat in exclude or []):
                excluded += 1
                continue
            key = (row["class_name"], row["target"], row["cpu"] or "", row["workload_hash"])
            mine = groups.setdefault(key, {})
            have = mine.get(row["trace_sha256"])
            if have is None or row["mean_run_s"] < have["mean_run_s"]:
                mine[row["trace_sha256"]] = row
    rows: list[dict[str, Any]] = []
    classes: dict[tuple[str, ...], dict[str, Any]] = {}
    for key in sorted(groups):
        best = sorted(groups[key].values(), key=lambda r: (r["mean_run_s"], r["trace_sha256"]))[:top_k]
        rows += [{**r, "rank": i} for i, r in enumerate(best)]
        cls = classes.setdefault(key[:3], {"class": key[0], "cpu": json.loads(key[2]) if key[2] else {},
                                           "target": json.loads(key[1]), "workloads": 0, "records": 0})
        cls["workloads"] += 1
        cls["records"] += len(best)
    if not rows:
        raise ParameterError(f"nothing to merge: all {seen} records were excluded by name" if seen
                             else "nothing to merge: the bundles hold no record")
    summary = {"classes": [{**c, "cpu": c["cpu"].get("model"), "cpu_id": c["cpu"].get("id")} for c in classes.values()],
               "merged_from": [{"sha256": m["sha256"], "created_at": m.get("created_at", ""),
                                "origin": m.get("origin", "")} for m in metas]}
    out = _pack(rows, created_at=max(m.get("created_at", "") for m in metas), tvm=metas[0].get("tvm", ""),
                origin="tunefleet hub merge of " + "; ".join(m.get("origin", "?") for m in metas), summary=summary)
    labels = [f"{c['class']} on {cpu_label(c['cpu'])}" for c in classes.values()]
    return out, MergeResult("", [n for n, _ in sources], labels, len({k[3] for k in groups}), len(rows),
                            excluded, seen - excluded - len(rows), len(out), hashlib.sha256(out).hexdigest())


def write_merged(sources: list[str | Path], output: str | Path, *, store: ArtifactStore | None = None,
                 token: str | None = None, exclude: list[str] | None = None,
                 top_k: int = DEFAULT_TOP_K) -> MergeResult:
    """:func:`merge_bundles` of bundles read from files, ``s3://`` or a registry, written to ``output``."""
    data, result = merge_bundles([(str(s), read_source(s, store, token)) for s in sources], exclude=exclude,
                                 top_k=top_k)
    return dataclasses.replace(result, output=_write(store, output, data))


# -- import ------------------------------------------------------------------------------------------
@dataclass
class ImportResult:
    """What ``hub import`` did; ``new`` is False when this bundle file was imported before."""

    source: str
    sha256: str
    new: bool
    counts: dict[str, Any]
    summary: dict[str, Any]
    created_at: dt.datetime | None
    seconds: float = 0.0
    classes: list[str] = field(default_factory=list)

    def line(self) -> str:
        c = self.counts
        skipped = {k.removeprefix("skipped_"): v for k, v in c.items() if k.startswith("skipped_") and v}
        if not self.new:
            return f"{self.source}: imported before ({c.get('records_new', 0)} records then); nothing to do"
        text = (f"imported {self.source}: {c['records_new']} new records ({c['records_present']} present) of "
                f"{c['workloads']} workloads under {len(self.classes)} hub class(es) ({', '.join(self.classes)}), "
                f"{c['workloads_new']} workloads new to this database, in {self.seconds:.1f} s")
        if skipped:
            text += "; skipped: " + ", ".join(f"{n} ({why})" for why, n in sorted(skipped.items()))
        return text


#: The response header in which a schedule registry (``tunefleet serve``) sends a bundle's SHA-256.
SHA256_HEADER = "X-Tunefleet-Sha256"


def fetch_bundle(url: str, token: str | None = None, *, timeout_s: float = 120.0) -> bytes:
    """A bundle's bytes from a schedule registry (``https://.../v1/hub/<class>.parquet``), checked
    against the SHA-256 the registry sends with it (:data:`SHA256_HEADER`): a bundle damaged on
    the way, or a response without the header, is refused."""
    import httpx

    from tunefleet.config import mask_url
    from tunefleet.errors import ConfigError, TransientError

    where = mask_url(url)
    try:
        resp = httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=timeout_s,
                         follow_redirects=True)
    except httpx.HTTPError as exc:
        raise TransientError(f"cannot fetch {where}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}") from exc
    if resp.status_code in (401, 403):
        raise ConfigError(f"the registry refused {where} ({resp.status_code}): set TUNEFLEET_REGISTRY_TOKEN to a live "
                          "token of scope read" + ("" if token else " (none is set)"))
    if resp.status_code == 404:
        raise ParameterError(f"no hub bundle at {where} (404)")
    if resp.status_code != 200:
        raise TransientError(f"cannot fetch {where}: HTTP {resp.status_code}")
    data = resp.content
    expected = resp.headers.get(SHA256_HEADER, "").strip().lower()
    if not expected:
        raise ParameterError(f"{where} sent no {SHA256_HEADER} header: refused (a bundle over HTTP is checked "
                             "against the registry's SHA-256)")
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise ParameterError(f"{where}: the bundle's SHA-256 {actual[:12]}... is not the registry's {expected[:12]}...: "
                             "refused (damaged on the way)")
    return data


def read_source(source: str | Path, store: ArtifactStore | None = None, token: str | None = None) -> bytes:
    """A bundle's bytes from a file path, an ``s3://`` URI of the artifact store, or a schedule
    registry's ``https://`` (or ``http://``) URL (:func:`fetch_bundle`, with ``token``)."""
    text = str(source)
    if text.startswith(("https://", "http://")):
        return fetch_bundle(text, token)
    if text.startswith("s3://"):
        if store is None:
            raise ParameterError(f"cannot read {text}: no artifact store")
        return store.get_bytes(store.key_from_uri(text))
    path = Path(text).expanduser()
    if not path.is_file():
        raise ParameterError(f"no hub bundle at {path}: not a file")
    return path.read_bytes()


def _read_table(data: bytes, source: str) -> tuple[Any, dict[str, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise ParameterError(f"not a hub bundle: {source}: {str(exc).splitlines()[0][:200]}") from exc
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    if meta.get("format") != FORMAT:
        raise ParameterError(f"not a hub bundle: {source}: a Parquet file without the {FORMAT!r} format mark")
    if meta.get("version") != str(FORMAT_VERSION):
        raise NotSupportedError(f"not supported: hub bundle format version {meta.get('version')!r} ({source}); "
                                f"this tunefleet reads version {FORMAT_VERSION}")
    schema = _schema()
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ParameterError(f"not a hub bundle: {source}: missing column(s) {', '.join(missing)}")
    try:
        table = table.select(schema.names).cast(schema)
    except (pa.ArrowException, ValueError) as exc:
        raise ParameterError(f"not a hub bundle: {source}: a column of the wrong type "
                             f"({str(exc).splitlines()[0][:200]})") from exc
    return table, meta


def _skip_reason(row: dict[str, Any], here_tvm: str) -> str | None:
    from tunefleet.recipes import Recipe

    if row["tvm_version"] != here_tvm:
        return "tvm_version"
    if row["recipe"]:
        try:
            Recipe.from_name(row["recipe"])
        except Exception:
            return "recipe"
    fine = (row["class_name"] and row["workload_hash"] and row["tir_json"] and row["trace_json"]
            and hashlib.sha256(row["trace_json"].encode()).hexdigest() == row["trace_sha256"]
            and row["mean_run_s"] is not None and math.isfinite(row["mean_run_s"]) and row["mean_run_s"] > 0
            and row["run_secs"] and all(math.isfinite(x) and x > 0 for x in row["run_secs"]))
    return None if fine else "invalid"


def import_bundle(db: Database, source: str | Path, *, store: ArtifactStore | None = None,
                  token: str | None = None) -> ImportResult:
    """Validate a bundle and load its records under hub classes (module docstring); idempotent.

    Raises
    ------
    tunefleet.errors.ParameterError
        Not a bundle (not Parquet, no format mark, missing or mistyped columns), or no file there.
    tunefleet.errors.NotSupportedError
        Another format version, or records of another TVM version than this one.
    """
    import time

    start = time.monotonic()
    name = str(source)
    data = read_source(source, store, token)
    sha = hashlib.sha256(data).hexdigest()
    done = db.hub_import_of(sha)
    if done is not None:
        return ImportResult(name, sha, False, dict(done.counts), dict(done.summary), done.bundle_created_at,
                            time.monotonic() - start)
    table, meta = _read_table(data, name)
    here = tvm_version()
    if meta.get("tvm") and meta["tvm"] != here:
        raise NotSupportedError(f"not supported: hub bundle {name} holds schedules of TVM {meta['tvm']}; this is TVM "
                                f"{here}, whose traces they may not replay in (export one from a database of TVM {here})")
    classes: dict[str, dict[str, Any]] = {}
    workloads: dict[str, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    skipped: dict[str, int] = {}
    for row in table.to_pylist():
        why = _skip_reason(row, here)
        if why is not None:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        target = json.loads(row["target"])
        cpu = json.loads(row["cpu"]) if row["cpu"] else None
        hub_name = hub_class_name(row["class_name"], cpu, target)
        if hub_name not in classes:
            caps = {**json.loads(row["capabilities"] or "{}"), **({"cpu": cpu} if cpu else {}),
                    "hub": {"class": row["class_name"], "bundle": sha[:12], "origin": meta.get("origin", ""),
                            "created_at": meta.get("created_at", "")}}
            classes[hub_name] = {"name": hub_name, "target": target, "capabilities": caps, "layout": row["layout"]}
        workloads.setdefault(row["workload_hash"], {
            "structural_hash": row["workload_hash"], "name": row["workload_name"], "op_kind": row["op_kind"],
            "flops": float(row["flops"] or 0.0), "tir_json": row["tir_json"]})
        records.append({"class_name": hub_name, "workload_hash": row["workload_hash"], "trace_json": row["trace_json"],
                        "trace_sha256": row["trace_sha256"],
                        "args_info": json.loads(row["args_info"]) if row["args_info"] else None,
                        "run_secs": list(row["run_secs"]), "mean_run_s": float(row["mean_run_s"]),
                        "tvm_version": row["tvm_version"], "target": row["target"],
                        "measured_at": row["measured_at"]})
        if row["measured_at"] is not None:  # the class's date: its newest record's (a merged bundle's is its newest source's)
            info = classes[hub_name]["capabilities"]["hub"]
            info["tuned_until"] = max(info.get("tuned_until") or "", row["measured_at"].isoformat())
    if table.num_rows and not records:
        raise ParameterError(f"nothing to import from {name}: all {table.num_rows} records skipped ("
                             + ", ".join(f"{n} {why}" for why, n in sorted(skipped.items())) + ")")
    created = _parse_time(meta.get("created_at"))
    summary = json.loads(meta.get("summary") or "{}")
    summary.update(origin=meta.get("origin", ""), tvm=meta.get("tvm", ""))
    counts = {"records": table.num_rows, "workloads": len(workloads),
              **{f"skipped_{why}": n for why, n in sorted(skipped.items())}}
    row, new = db.hub_import(sha256=sha, source=name, format_version=FORMAT_VERSION, tvm_version=meta.get("tvm", here),
                             bundle_created_at=created, summary=summary, classes=list(classes.values()),
                             workloads=list(workloads.values()), records=records, counts=counts)
    return ImportResult(name, sha, new, dict(row.counts), dict(row.summary), row.bundle_created_at,
                        time.monotonic() - start, sorted(classes))


# -- the default bundle ------------------------------------------------------------------------------
#: The bundle shipped with tunefleet (package data); absent from an installation that ships none.
DEFAULT_BUNDLE = Path(__file__).resolve().parent.parent / "data" / "hub" / "default.parquet"


def ensure_hub(db: Database, hub: str, store: ArtifactStore | None = None, *,
               token: str | None = None) -> ImportResult | None:
    """Import the bundle the ``hub`` setting names unless this database has it (first use).

    ``"off"``: nothing. ``"default"``: :data:`DEFAULT_BUNDLE`, if this installation ships one. A
    schedule registry's URL is fetched with ``token`` (:func:`fetch_bundle`).
    A bundle another process imports at the same moment is not an error (the import is
    idempotent; the loser's transaction finds it done).
    """
    from tunefleet.errors import ConflictError

    if hub == "off":
        return None
    if hub == "default":
        if not DEFAULT_BUNDLE.is_file():
            return None
        source: str | Path = DEFAULT_BUNDLE
    else:
        source = hub
    try:
        result = import_bundle(db, source, store=store, token=token)  # a bundle imported before is not parsed again
    except ConflictError:
        return None
    if not result.new:
        return None
    log.info("first use of this database: %s", result.line())
    return result


# -- what the hub gave a model -------------------------------------------------------------------------
@dataclass
class HubReport:
    """What a class's tuning of a model's workloads took from the hub."""

    workloads: int
    """The model's workloads on the class."""
    from_hub: int
    """Of them, those a hub class holds records of: their searches start from those records."""
    sources: list[str]
    """The hub classes, as "<class> on <CPU>, <date>"."""
    measured: int = 0
    """Hub schedules measured on this class."""
    failed: int = 0
    """Of them, those that did not build or run here."""
    slower: int = 0
    """Of them, those slower here than this class's default schedule."""

    def line(self) -> str:
        if not self.from_hub:
            return f"0 of {self.workloads} workloads start from the hub"
        text = f"{self.from_hub} of {self.workloads} workloads start from the hub (tuned as {'; '.join(self.sources)})"
        if self.measured:
            text += (f"; {self.measured} hub schedules measured here: {self.failed} did not build or run, "
                     f"{self.slower} slower than the default schedule (dropped for this class)")
        return text

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def describe_hub_class(name: str, caps: dict[str, Any]) -> str:
    """A hub class in words: the class it was tuned as, the CPU it was tuned on, the date of its
    newest record (for a hub class imported by an earlier tunefleet, the bundle's date). The CPU's
    family and model follow its name: one bundle may hold two CPUs of one name (``AMD EPYC`` is
    Zen 4 and Zen 5 alike)."""
    from tunefleet.hardware import cpu_label

    info = caps.get("hub") or {}
    cpu = cpu_label(caps.get("cpu") or {})
    date = str(info.get("tuned_until") or info.get("created_at") or "")[:10]
    return f"{info.get('class') or name} on {cpu}" + (f", {date}" if date else "")


def hub_report(db: Database, workload_ids: list[int], hardware_class_id: int) -> HubReport:
    """What the hub holds of these workloads and what this class measured of it."""
    replays = db.hub_replays(workload_ids, hardware_class_id)
    classes = {hw.name: hw for hw in db.hub_classes()}
    names = sorted({n for r in replays.values() for n in r["sources"]})
    return HubReport(len(set(workload_ids)), len(replays),
                     [describe_hub_class(n, dict(classes[n].capabilities or {})) for n in names if n in classes],
                     sum(r["measured"] for r in replays.values()), sum(r["failed"] for r in replays.values()),
                     sum(r["slower"] for r in replays.values()))


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return when.astimezone(dt.timezone.utc).replace(tzinfo=None) if when.tzinfo else when


__all__ = ["DEFAULT_BUNDLE", "DEFAULT_TOP_K", "FORMAT", "FORMAT_VERSION", "SHA256_HEADER", "ExportResult", "HubReport",
           "ImportResult", "MergeResult", "describe_hub_class", "ensure_hub", "export_bundle", "fetch_bundle", "hub_class_name",
           "hub_report", "import_bundle", "merge_bundles", "read_source", "write_bundle", "write_merged"]
