"""The one settings object.

Values come, in order of precedence, from keyword arguments, ``TUNEFLEET_*`` environment
variables, the optional TOML config file (``TUNEFLEET_CONFIG``, else ``$TUNEFLEET_HOME/config.toml``
when present) and the embedded defaults: a SQLite database and a local artifact directory under
``TUNEFLEET_HOME`` (default ``~/.tunefleet``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from tunefleet.budget import Budget
from tunefleet.errors import ConfigError, ParameterError
from tunefleet.vocab import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_LOST_LEASES,
    DEFAULT_MIN_AGREEMENT,
    MIN_LEASE_S,
)

ENV_PREFIX = "TUNEFLEET_"

MAX_LEASE_S = 86_400.0
"""The longest lease, a day. A lease is how long a dead worker's shard (and its workload: one lease
per workload) stays out of reach before another worker takes it over; heartbeats renew a live one
every third of it, so a longer lease buys nothing but a longer wait after a crash. A shard runs
minutes (the default lease is 120 s): a day is generous, and it keeps the expiry far inside the
date arithmetic of both backends (``inf`` never expired on SQLite and overflowed on PostgreSQL)."""

DEFAULT_DB_STATEMENT_TIMEOUT_S = 600.0
"""The longest statement on PostgreSQL, lock waits included: a query that hangs fails after 10
minutes instead of never (every tunefleet statement takes well under a minute; schema migrations,
which may rewrite large tables, are exempt)."""
DEFAULT_DB_LOCK_TIMEOUT_S = 30.0
"""The longest wait for a lock on PostgreSQL: tunefleet's transactions are short (no lock is held
across TVM work), so a wait this long means the holder is stuck; the waiter fails with a transient
:class:`~tunefleet.errors.DatabaseUnavailableError` instead of waiting forever."""
DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S = 120.0
"""How long a PostgreSQL session may sit idle inside an open transaction before the server ends it
and releases its locks (a stuck or interrupted thread's): tunefleet never idles in one for more
than a moment."""

# A database URL's scheme, as SQLAlchemy reads it: dialect[+driver]://... (parsed here without
# SQLAlchemy, which only tunefleet.db imports).
_URL_SCHEME = re.compile(r"^(?P<backend>[A-Za-z][A-Za-z0-9_]*)(\+[A-Za-z0-9_]+)?://")


# Query parameters and key=value words that carry a secret: password, sslpassword, secret_key, token...
_SECRET_KEY = r"[A-Za-z0-9_.-]*(?:password|passwd|secret|token)[A-Za-z0-9_.-]*"
_SECRET_IN_QUERY = re.compile(rf"(?i)([?&;]{_SECRET_KEY}=)[^&#]*")
_SECRET_IN_TEXT = re.compile(rf"(?i)(?<![A-Za-z0-9_.-])({_SECRET_KEY}=)('[^']*'|\"[^\"]*\"|[^\s&;,'\"]+)")
_URL_IN_TEXT = re.compile(r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_USER = re.compile(r"[^:/?#@]*:")
MASK = "***"


def mask_url(url: str) -> str:
    """``url`` with its passwords replaced by ``***``: the user-info's (``user:***@host``, as
    SQLAlchemy shows it) and every password-like query parameter (``?password=***``,
    ``&sslpassword=***``). A URL without a scheme (``user:pw@host:port``) is masked too.

    The user-info password runs from the first ``:`` to the last ``@`` of the authority, so an
    unencoded ``@`` or ``/`` in it (which SQLAlchemy accepts) is hidden as well."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    user = _USER.match(rest)
    at = rest.find("@", user.end()) if user else -1
    if user and at >= 0:
        # the authority ends at the first / ? # after its first @; the password at its last @
        ends = [i for i in (rest.find(c, at) for c in "/?#") if i >= 0]
        at = rest.rfind("@", 0, min(ends) if ends else len(rest))
        rest = f"{rest[:user.end()]}{MASK}{rest[at:]}"
    return (scheme + sep if sep else "") + _SECRET_IN_QUERY.sub(rf"\1{MASK}", rest)


def mask_secrets(text: str) -> str:
    """``text`` (an error message, a log line) with every URL masked by :func:`mask_url` and every
    ``password=...``-like word (a libpq connection string's) replaced by ``***``."""
    text = _URL_IN_TEXT.sub(lambda m: mask_url(m.group(0)), text)
    return _SECRET_IN_TEXT.sub(rf"\1{MASK}", text)


def _default_home() -> Path:
    return Path(os.environ.get("TUNEFLEET_HOME", "~/.tunefleet")).expanduser()


def _config_file() -> Path | None:
    explicit = os.environ.get("TUNEFLEET_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"invalid setting TUNEFLEET_CONFIG: no such file {path}")
        return path
    candidate = _default_home() / "config.toml"
    return candidate if candidate.is_file() else None


class TuneKnobs(BaseModel):
    """Every knob a tuning run takes, declared once: a setting (``TUNEFLEET_<NAME>``) and a field of
    the engine's options object (:class:`tunefleet.engine.options.TuneOptions`), which CLI flags and
    flow parameters of the same name override. A new knob is one field here.

    No number may be infinite or NaN (``inf`` passes every ``ge`` bound: a lease of ``inf`` seconds
    never expired on SQLite and overflowed on PostgreSQL)."""

    model_config = ConfigDict(allow_inf_nan=False)

    lease_s: float = Field(default=DEFAULT_LEASE_S, ge=MIN_LEASE_S, le=MAX_LEASE_S, description="Shard lease length "
                           "in seconds (at least 3, at most a day); heartbeats renew it every third.")
    max_lost_leases: int = Field(
        default=DEFAULT_MAX_LOST_LEASES, ge=1,
        description="Leases a shard may lose (its worker died or stopped heartbeating) before it fails; counted "
        "apart from attempts that raised an error, and retried with a backoff.")
    trials_per_iter: int = Field(default=64, ge=1, description="Candidates measured per batch.")
    search_population: int | None = Field(
        default=None, ge=16, le=4096,
        description="Schedules the evolutionary search keeps per generation; None: 4 per candidate of a round, "
        "between 64 and 512 (MetaSchedule's 512 costs more search time than a small round measures).")
    seed: int | None = Field(default=None, description="Seed of the search (None: random).")
    transfer: bool = Field(default=True, description="A workload this class never measured first measures the "
                           "best schedule of the most compatible class that builds here (and warm_start_shapes "
                           "borrows from those classes too).")
    warm_start_shapes: bool = Field(
        default=True,
        description="A workload this class never measured first measures the best schedules of the same operator at "
        "the closest other shapes measured here, then (with transfer) on the compatible classes, fitted to its "
        "shape (at most 4).")
    metrics_pushgateway: str | None = Field(
        default=None,
        description="Prometheus Pushgateway (host:port or URL) that tuning shards push their metrics to.")
    warm_start: bool = Field(
        default=True,
        description="New tuning shards start with the class's current cost model (its promoted one, else the "
        "shipped one unless pretrained_cost_model is off).")
    pretrained_cost_model: bool = Field(
        default=True,
        description="A class without a promoted cost model of its own warm-starts, filters and predicts with the one "
        "shipped with tunefleet (version 0, trained on the tuning campaign's measurements).")
    confirm_top: int = Field(
        default=0, ge=0, le=16,
        description="Before a build, re-time each workload's this many fastest recorded schedules side by side on "
        "the building node and build with the fastest re-timed one (0 or 1: build with the fastest record). Off by "
        "default: on a noisy VM the records are lucky, but choosing among the top few by re-timing them did not "
        "make the model measurably faster (docs/performance.md) and costs about a minute per build.")
    warm_start_min_agreement: float = Field(
        default=DEFAULT_MIN_AGREEMENT, ge=0, le=1,
        description="Drop the warm start in a shard once the cost model orders fewer than this share of pairs of "
        "its measured candidates right (the online model alone guides the rest); 0: never drop it.")
    # Cost-efficient tuning; all off by default, `tune --efficient` turns them on.
    preempt: bool = Field(default=False, description="Stop tuning workloads whose best latency plateaued; "
                          "their unused trials go to workloads still improving.")
    preempt_epsilon: float = Field(default=0.01, ge=0, le=1, description="A round improving the best by at "
                                   "most this fraction is stale.")
    preempt_patience: int = Field(default=3, ge=1, le=1000, description="Stale rounds in a row that make a plateau.")
    preempt_min_gain_us_per_kj: float = Field(default=0.0, ge=0, description="Stop a workload whose weighted "
                                              "model-latency gain over its last rounds falls below this (us per kJ); 0: off.")
    filter_fraction: float = Field(default=1.0, gt=0, le=1, description="Measure only this best-scored fraction of "
                                   "each round (the cost model filters); 1: measure all.")
    filter_min_agreement: float = Field(default=DEFAULT_MIN_AGREEMENT, ge=0, le=1,
                                        description="Filter in a shard only while the cost model orders at least this "
                                        "share of pairs of its measured candidates right (rounds are measured in "
                                        "full until it does); 0: filter from the first round, never stop.")
    energy_aware: bool = Field(default=False, description="Lease shards by expected model-latency gain per joule.")
    parallel_measure: bool = Field(default=False, description="Measure candidates with the adaptive parallel runner.")
    parallel_max_degree: int | None = Field(default=None, ge=1, le=256, description="Most candidates measured at "
                                            "once (default: the usable cores on CPU).")


class Settings(BaseSettings, TuneKnobs):
    """Effective tunefleet configuration (see docs/configuration.md); the tuning knobs
    are declared in :class:`TuneKnobs`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True,
                                      allow_inf_nan=False)

    # A run's budget is not a knob of the tuning engine (TuneKnobs): it is spent by the command
    # or flow that plans rounds and builds (run, the pipeline flow), so it is a setting of its own.
    budget: str = Field(default="15m", description="Default budget of `tunefleet run` and the pipeline flow: trials "
                        "over the model's workloads (2000) or the wall time of the whole run (90s, 15m, 1h30m).")

    home: Path = Field(default_factory=_default_home, description="Root of the embedded defaults.")
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default sqlite:///$TUNEFLEET_HOME/tunefleet.db. "
        "PostgreSQL: postgresql+psycopg2://user:pass@host:5432/db",
    )
    db_connect_timeout_s: float = Field(default=5.0, gt=0, le=120)
    db_statement_timeout_s: float = Field(default=DEFAULT_DB_STATEMENT_TIMEOUT_S, ge=0, le=86_400,
                                          description="Longest statement, lock waits included (PostgreSQL "
                                          "only; migrations are exempt); 0 = no limit; at most a day.")
    db_lock_timeout_s: float = Field(default=DEFAULT_DB_LOCK_TIMEOUT_S, ge=0, le=86_400,
                                     description="Longest wait for a row or table lock another session holds "
                                     "(PostgreSQL only; SQLite waits TUNEFLEET_DB_CONNECT_TIMEOUT_S); 0 = no limit.")
    db_idle_in_transaction_timeout_s: float = Field(
        default=DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S, ge=0, le=86_400,
        description="The server ends a session left idle inside a transaction this long, releasing its locks "
        "(PostgreSQL only); 0 = never.")
    db_auto_migrate: bool = Field(default=True, description="Create the schema in an empty database.")

    store: Literal["local", "s3"] = "local"
    store_path: Path | None = Field(default=None, description="Local artifact directory; default $TUNEFLEET_HOME/artifacts.")
    s3_endpoint: str = Field(default="127.0.0.1:9000", description="host:port, no scheme.")
    s3_access_key: str = ""
    s3_secret_key: SecretStr = SecretStr("")
    s3_bucket: str = "tunefleet"
    s3_prefix: str = ""
    s3_region: str | None = None
    s3_secure: bool = False
    s3_timeout_s: float = Field(default=5.0, gt=0, le=120, description="Read timeout per request (not retried).")
    s3_connect_timeout_s: float = Field(
        default=2.5, gt=0, le=60, description="Connect timeout per attempt; with the default retries a dead endpoint fails in < 10 s."
    )
    s3_retries: int = Field(default=2, ge=0, le=10)

    hub: str = Field(default="default", description="The hub bundle a database imports on first use (its records "
                     "seed the searches of workloads new to a class): 'default' (the bundle shipped with tunefleet), "
                     "'off', a bundle file, an s3:// URI of the artifact store, or a schedule registry's https:// URL "
                     "(fetched with registry_token). `run --no-hub` sets 'off'.")

    registry_max_upload_mb: float = Field(default=100.0, gt=0, le=10_000, description="The schedule registry "
                                          "(`tunefleet serve`) refuses a request body larger than this (413).")
    registry_token: SecretStr = Field(default=SecretStr(""), description="The bearer token this tunefleet sends "
                                      "to a schedule registry (`hub import https://...`).")

    gpu_arch: str = Field(default="sm_80", description="CUDA arch of the built-in gpu class.")
    hardware: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Extra hardware classes or overrides of the built-in ones (x86, arm, gpu), by name: "
        "target, node_pool, watts_per_core, idle_watts, watts_per_gpu, price_per_hour.",
    )

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @field_validator("budget", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        try:
            return str(Budget.parse(value))
        except ParameterError as exc:
            raise ValueError(str(exc).split(": ", 1)[1]) from None

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: Any) -> Any:
        return value.upper() if isinstance(value, str) else value

    @field_validator("s3_endpoint")
    @classmethod
    def _no_scheme(cls, value: str) -> str:
        if "://" in value:
            raise ValueError(f"give host:port without a scheme ({mask_url(value)!r}); use TUNEFLEET_S3_SECURE for TLS")
        if "@" in value:
            raise ValueError(f"give host:port without credentials ({mask_url(value)!r}); the key pair goes in "
                             "TUNEFLEET_S3_ACCESS_KEY and TUNEFLEET_S3_SECRET_KEY")
        return value

    @field_validator("database_url")
    @classmethod
    def _valid_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _URL_SCHEME.match(value)
        if match is None:
            raise ValueError(f"not a database URL ({mask_url(value)!r}): expected dialect[+driver]://...")
        if match["backend"] not in {"sqlite", "postgresql"}:
            raise ValueError(f"unsupported database {match['backend']!r}; use sqlite or postgresql")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = _config_file()
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)

    # -- derived values -------------------------------------------------------------------
    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'tunefleet.db'}"

    @property
    def effective_store_path(self) -> Path:
        return self.store_path or self.home / "artifacts"

    def masked(self) -> dict[str, Any]:
        """The effective configuration with secrets masked, for display."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                value = "********" if value.get_secret_value() else ""
            elif isinstance(value, Path):
                value = str(value)
            out[name] = value
        out["database_url"] = mask_url(self.effective_database_url)
        out["s3_endpoint"] = mask_url(self.s3_endpoint)
        if self.metrics_pushgateway:
            out["metrics_pushgateway"] = mask_url(self.metrics_pushgateway)
        out["store_path"] = str(self.effective_store_path)
        return out


def _format_validation_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = err.get("loc") or ("?",)
    name = ENV_PREFIX + str(loc[0]).upper()
    msg = err.get("msg", "invalid value")
    more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    if err.get("type") == "extra_forbidden":
        return f"unknown setting {name} in the config file{more}"
    return f"invalid setting {name}: {msg}{more}"


def load_settings(**overrides: Any) -> Settings:
    """Build the settings, turning validation errors into one :class:`ConfigError` line."""
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None
    except (OSError, ValueError) as exc:  # unreadable / malformed TOML file
        raise ConfigError(f"invalid config file: {exc}") from None
