"""Prometheus metrics for tuning: energy (useful vs wasted), money, trials, errors, shards.

Nothing is registered at import time: every :class:`FleetMetrics` owns its own
:class:`~prometheus_client.CollectorRegistry`, so tests, workers and the accounting step never
share (or collide in) a process-global registry.

Two ways out, as the architecture's "metrics" row says:

* a long-lived process (embedded mode, a coordinator) calls :meth:`FleetMetrics.serve` and
  Prometheus scrapes its ``/metrics``;
* a short-lived shard job calls :meth:`FleetMetrics.push` when it finishes (and, if it likes,
  after each batch) to a Prometheus Pushgateway, with a grouping key naming the shard, e.g.
  ``{"shard": "123", "hardware": "x86"}``. The push is a PUT: it replaces that group only, so
  concurrent shards never overwrite each other and the final values stay until the group is
  deleted (below), after Prometheus has scraped them.

A Pushgateway outage never fails a flow or a tuning step: they call :meth:`FleetMetrics.publish`,
which retries a failed push briefly, then says once per outage, as a warning with the reason, that
metrics are not pushed, skips pushes to that gateway for :data:`PUSH_COOLDOWN_S` (so a gateway
that swallows packets does not cost a timeout per batch), and says when pushes work again.
:meth:`FleetMetrics.push` is the single attempt, raising :class:`PushgatewayError`.

A Pushgateway never forgets a group. A shard's group is therefore deleted when the shard ends
(:func:`retract_group_later`, called by :class:`tunefleet.energy.accounting.ShardAccountant`), but
only after :data:`GROUP_LINGER_S`, so that Prometheus scrapes the values the shard pushed last (its
cost and duration are counted only then). The deletions wait in one background thread; those still
waiting when the process exits are done as it ends, at once (a command never waits for them). A deletion
follows the publish policy: never raises, one warning per outage (:func:`retract_group`);
:func:`delete_group` is the single attempt, raising :class:`PushgatewayError`.

Semantics
---------
* A measured candidate is **useful** when it strictly beat the best latency measured so far for
  its workload on that hardware class; everything else, errors included, is **wasted**
  (Trimmer's definition). ``wasted_trials`` therefore *includes* the errored candidates; the
  error counters break those down by stage.
* Energy ``source`` says where joules came from: ``rapl``, ``nvml``, ``estimate`` (CPU time x the
  hardware class's power figure) or a composite such as ``nvml+estimate`` (GPU measured, host
  estimated).
* Cost is in the hardware class's price units (``price_per_hour`` x node hours).

Dashboards (``dashboards/``) must aggregate: with one Pushgateway group per shard, every shard's
counters are separate series (the ``shard`` label survives because Prometheus scrapes the
Pushgateway with ``honor_labels: true``), so panels use ``sum by (hardware, ...)``. Counters of a
retried shard pushed under the same grouping key restart from zero; Prometheus sees that as a
counter reset and ``increase()`` still counts both attempts.
"""

from __future__ import annotations

import atexit
import heapq
import itertools
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    delete_from_gateway,
    generate_latest,
    push_to_gateway,
    start_http_server,
)

from tunefleet.config import mask_secrets, mask_url
from tunefleet.errors import TransientError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    "ENERGY_SOURCES",
    "ERROR_STAGES",
    "KINDS",
    "METRIC_NAMES",
    "SHARD_DURATION_BUCKETS",
    "SHARD_STATES",
    "FleetMetrics",
    "PushgatewayError",
    "publish_quarantine",
]

#: Values of the ``kind`` label.
KINDS: Final = ("useful", "wasted")
#: Values of the ``stage`` label of ``tunefleet_measure_errors_total``.
ERROR_STAGES: Final = ("build", "run")
#: Values of the ``state`` label of ``tunefleet_shards`` (the shard state machine).
SHARD_STATES: Final = ("pending", "leased", "done", "failed", "cancelled")
#: Atomic energy sources; a ``source`` label is one of these or several joined by ``+``.
ENERGY_SOURCES: Final = ("rapl", "nvml", "estimate")
#: Shard durations from 1 s to 2 h (upper bounds in seconds; +Inf is added).
SHARD_DURATION_BUCKETS: Final = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 900.0, 1800.0, 3600.0, 5400.0, 7200.0)
#: Every metric family this module defines, as it appears in the exposition (counters with ``_total``).
METRIC_NAMES: Final = (
    "tunefleet_energy_joules_total",
    "tunefleet_cost_total",
    "tunefleet_trials_total",
    "tunefleet_measure_errors_total",
    "tunefleet_shard_duration_seconds",
    "tunefleet_best_latency_seconds",
    "tunefleet_shards",
    "tunefleet_model_energy_joules",
    "tunefleet_model_cost",
    "tunefleet_measure_parallelism",
    "tunefleet_node_quarantined",
    "tunefleet_last_push_timestamp_seconds",
)

_SOURCE_RE = re.compile(r"^(?:%s)(?:\+(?:%s))*$" % (("|".join(ENERGY_SOURCES),) * 2))
_WORKLOAD_RE = re.compile(r"^[0-9a-f]{16,}$")
#: Default seconds a push may take before it fails.
PUSH_TIMEOUT_S: Final = 5.0
#: Attempts of one :meth:`FleetMetrics.publish` (the retries are for a gateway restarting).
PUSH_ATTEMPTS: Final = 3
#: Seconds before the first retry of a failed push; each further retry waits twice as long.
PUSH_RETRY_S: Final = 0.5
#: Seconds after a publish gave up during which pushes to that gateway are skipped.
PUSH_COOLDOWN_S: Final = 30.0
#: Seconds a finished shard's group stays on the Pushgateway before it is deleted: longer than the
#: interval at which Prometheus scrapes the gateway (1 min by Prometheus' default, 30 s in
#: kube-prometheus-stack), so that the values the shard pushed last are scraped at least once.
GROUP_LINGER_S: Final = 90.0

log = logging.getLogger(__name__)


class _Outages:
    """Gateways whose last publish gave up, by masked address: when, and whether it was said.

    Process-wide, so that a warning about one outage is logged once however many
    :class:`FleetMetrics` (one per shard) push to that gateway."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}

    def skipping(self, gateway: str, now: float) -> bool:
        with self._lock:
            since = self._since.get(gateway)
            return since is not None and now - since < PUSH_COOLDOWN_S

    def failed(self, gateway: str, now: float) -> bool:
        """Note a publish that gave up; whether the outage is new (to be said)."""
        with self._lock:
            new = gateway not in self._since
            self._since[gateway] = now
            return new

    def recovered(self, gateway: str) -> bool:
        """Note a push that worked; whether an outage ended with it."""
        with self._lock:
            return self._since.pop(gateway, None) is not None

    def down(self, gateway: str) -> bool:
        """Whether the last publish to the gateway gave up (and none worked since)."""
        with self._lock:
            return gateway in self._since

    def clear(self) -> None:
        with self._lock:
            self._since.clear()


_OUTAGES = _Outages()


def _without_credentials(gateway: str) -> tuple[str, Callable[..., Callable[[], None]]]:
    """The gateway address without user-info, and the push handler: HTTP basic authentication
    with the user-info's (percent-decoded) name and password when the URL carries one."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    from prometheus_client.exposition import basic_auth_handler, default_handler

    if "://" not in gateway or "@" not in gateway:
        return gateway, default_handler
    parts = urlsplit(gateway)
    user, password = unquote(parts.username or ""), unquote(parts.password or "")
    plain = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))

    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        return basic_auth_handler(url, method, timeout, headers, data, username=user, password=password)

    return plain, handler


class PushgatewayError(TransientError):
    """Metrics could not be pushed to the Pushgateway (unreachable, timed out, or refused)."""


def _retryable(exc: PushgatewayError) -> bool:
    """Whether a failed push may work when tried again: no answer, or a server error (5xx); a
    refusal (4xx: wrong path, credentials) will not."""
    from urllib.error import HTTPError

    cause = exc.__cause__
    return not (isinstance(cause, HTTPError) and 400 <= cause.code < 500)


def _nonempty(value: str, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string; got {value!r}")
    return value


def _nonneg(value: float, what: str) -> float:
    if value < 0:
        raise ValueError(f"{what} must be >= 0; got {value!r}")
    return float(value)


def _check_source(source: str) -> str:
    if not isinstance(source, str) or not _SOURCE_RE.match(source):
        raise ValueError(f"source must be rapl, nvml, estimate or a '+'-joined mix of them; got {source!r}")
    return source


def workload_label(structural_hash: str) -> str:
    """The ``workload`` label value: the first 16 hex digits of a workload's structural hash."""
    text = structural_hash.lower()
    if not _WORKLOAD_RE.match(text):
        raise ValueError(f"workload must be a hex structural hash of at least 16 digits; got {structural_hash!r}")
    return text[:16]


def _with_outage_policy(gateway: str, attempt: Callable[[], None], *, skipped: str, gave_up: str, back: str,
                        attempts: int, sleep: Callable[[float], None]) -> bool:
    """Run one Pushgateway request (``attempt``, raising :class:`PushgatewayError`) the way a flow
    or a tuning step must: never raises; retries briefly what may pass; one warning per outage and
    gateway, then skips the gateway for :data:`PUSH_COOLDOWN_S`; says when it answers again.
    Whether the request went through."""
    where = mask_url(gateway)
    if _OUTAGES.skipping(where, time.monotonic()):
        log.debug("%s the Pushgateway at %s: it failed less than %g s ago", skipped, where, PUSH_COOLDOWN_S)
        return False
    delay = PUSH_RETRY_S
    for number in range(1, max(1, attempts) + 1):
        try:
            attempt()
        except PushgatewayError as exc:
            if number < attempts and _retryable(exc):
                log.debug("%s; trying again in %g s", exc, delay)
                sleep(delay)
                delay *= 2
                continue
            if _OUTAGES.failed(where, time.monotonic()):
                log.warning("%s; %s (tuning goes on)", exc, gave_up)
            else:
                log.debug("%s", exc)
            return False
        if _OUTAGES.recovered(where):
            log.info("%s the Pushgateway at %s again", back, where)
        return True
    return False  # pragma: no cover - the loop returns


def _check_group(job: str, grouping_key: Mapping[str, str]) -> None:
    if not grouping_key:
        raise ValueError("a Pushgateway group needs a non-empty grouping_key (e.g. {'shard': '123'}) so that groups "
                         "do not overwrite each other")
    if "job" in grouping_key:
        raise ValueError("grouping_key must not contain 'job'; pass job= instead")
    _nonempty(job, "job")


def delete_group(gateway: str, job: str = "tunefleet", *, grouping_key: Mapping[str, str],
                 timeout: float = PUSH_TIMEOUT_S) -> None:
    """Delete one group from a Pushgateway (HTTP DELETE of the group's URL): every metric pushed
    under ``job`` and ``grouping_key`` is gone from its ``/metrics`` afterwards. Deleting a group
    that does not exist is no error (the Pushgateway answers 202 all the same).

    Parameters
    ----------
    gateway, job, grouping_key, timeout
        As for :meth:`FleetMetrics.push`.

    Raises
    ------
    PushgatewayError
        With a one-line message naming the gateway and the group, when it cannot be reached,
        times out, or refuses the request.
    """
    _check_group(job, grouping_key)
    try:
        address, handler = _without_credentials(gateway)
        delete_from_gateway(address, job=job, grouping_key=dict(grouping_key), timeout=timeout, handler=handler)
    except OSError as exc:
        raise PushgatewayError(
            f"cannot delete the metrics group (job {job!r}, group {dict(grouping_key)}) from the Pushgateway at "
            f"{mask_url(gateway)}: {_why(exc)}"
        ) from exc


def _why(exc: OSError) -> str:
    """What a failed request to the Pushgateway says, on one line and with no secret in it."""
    reason = getattr(exc, "reason", None) or exc
    return mask_secrets(" ".join(str(reason).split())) or type(exc).__name__


def retract_group(gateway: str, job: str = "tunefleet", *, grouping_key: Mapping[str, str],
                  timeout: float = PUSH_TIMEOUT_S, attempts: int = PUSH_ATTEMPTS,
                  sleep: Callable[[float], None] = time.sleep) -> bool:
    """:func:`delete_group` under the policy of :meth:`FleetMetrics.publish`: never raises for a
    failed deletion (one warning per outage, shared with the pushes to that gateway); whether the
    group was deleted. A wrong ``grouping_key`` still raises ``ValueError``."""
    _check_group(job, grouping_key)
    return _with_outage_policy(
        gateway, lambda: delete_group(gateway, job, grouping_key=grouping_key, timeout=timeout),
        skipped="metrics group not deleted from", gave_up="the group stays on it", back="a group deleted from",
        attempts=attempts, sleep=sleep)


class _Retractions:
    """Group deletions that wait until they are due, done by one daemon thread; whatever is still
    waiting when the interpreter exits is done then, at once, except for a gateway that is down:
    nothing would reach it."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: list[tuple[float, int, str, Callable[[], object]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._at_exit = False

    def schedule(self, after_s: float, where: str, action: Callable[[], object]) -> None:
        with self._cond:
            heapq.heappush(self._due, (time.monotonic() + max(0.0, after_s), next(self._order), where, action))
            if not self._at_exit:
                atexit.register(self.flush)
                self._at_exit = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tunefleet-pushgateway-retractions",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._due)

    def _next(self, *, wait: bool) -> tuple[float, str, Callable[[], object]] | None:
        with self._cond:
            while self._due:
                when = self._due[0][0]
                now = time.monotonic()
                if when <= now or not wait:
                    when, _, where, action = heapq.heappop(self._due)
                    return when, where, action
                self._cond.wait(when - now)
            return None

    def _run(self) -> None:
        while (item := self._next(wait=True)) is not None:
            item[2]()  # retract_group: never raises

    def flush(self) -> None:
        """Do every pending deletion now, in this thread (at exit): a process never waits for a
        linger to pass before it ends (a command would look hung for up to a minute and a half),
        so a group deleted here may miss Prometheus' last scrape of it."""
        first = True
        while (item := self._next(wait=False)) is not None:
            _, where, action = item
            if _OUTAGES.down(where):
                log.debug("a metrics group is left on the Pushgateway at %s: it is down", where)
                continue
            if first:
                log.info("deleting finished shards' metrics groups from the Pushgateway at %s before exiting "
                         "(Prometheus may not have scraped their last values)", where)
                first = False
            action()


_RETRACTIONS = _Retractions()


def retract_group_later(gateway: str, job: str = "tunefleet", *, grouping_key: Mapping[str, str],
                        after_s: float = GROUP_LINGER_S, timeout: float = PUSH_TIMEOUT_S) -> None:
    """:func:`retract_group` in ``after_s`` seconds, in the background (never raises; returns at once).

    A process that exits first deletes the group as it ends, without waiting (unless the gateway
    is down); a process that is killed leaves it (the shard's next attempt deletes the groups of the
    attempts before it)."""
    _check_group(job, grouping_key)
    key = dict(grouping_key)
    _RETRACTIONS.schedule(after_s, mask_url(gateway),
                          lambda: retract_group(gateway, job, grouping_key=key, timeout=timeout))


class FleetMetrics:
    """The tuning metrics of one process, in a registry of its own.

    Parameters
    ----------
    registry
        Where to register the metrics; a fresh :class:`CollectorRegistry` when omitted. Passing a
        registry that already holds these metrics raises ``ValueError`` (duplicate timeseries).
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry: CollectorRegistry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.energy_joules = Counter(
            "tunefleet_energy_joules", "Energy spent measuring candidates, by hardware class, energy source and "
            "kind (useful: the candidate beat the best latency so far; wasted: it did not, or failed).",
            ["hardware", "source", "kind"], registry=r)
        self.cost = Counter(
            "tunefleet_cost", "Money spent on tuning nodes in the hardware class's price units "
            "(price per hour x node hours).", ["hardware"], registry=r)
        self.trials = Counter(
            "tunefleet_trials", "Candidates measured, by hardware class and kind (useful or wasted; errors are wasted).",
            ["hardware", "kind"], registry=r)
        self.measure_errors = Counter(
            "tunefleet_measure_errors", "Candidates that failed to build or run.", ["hardware", "stage"], registry=r)
        self.shard_duration = Histogram(
            "tunefleet_shard_duration_seconds", "Wall-clock time of one tuning shard from lease to result.",
            ["hardware"], buckets=SHARD_DURATION_BUCKETS, registry=r)
        self.best_latency = Gauge(
            "tunefleet_best_latency_seconds", "Best mean run time measured so far for a workload on a hardware class.",
            ["workload", "hardware"], registry=r)
        self.shards = Gauge(
            "tunefleet_shards", "Shards per state (pending, leased, done, failed, cancelled).",
            ["hardware", "state"], registry=r)
        self.model_energy_joules = Gauge(
            "tunefleet_model_energy_joules", "Tuning energy attributed to a model (workloads shared by models are "
            "apportioned by weight), by hardware class and kind.", ["model", "hardware", "kind"], registry=r)
        self.model_cost = Gauge(
            "tunefleet_model_cost", "Tuning cost attributed to a model in the hardware class's price units "
            "(workloads shared by models are apportioned by weight).", ["model", "hardware"], registry=r)
        self.measure_parallelism = Gauge(
            "tunefleet_measure_parallelism", "Candidates measured at once by the adaptive parallel runner on a "
            "hardware class (1: serial measurement only).", ["hardware"], registry=r)
        self.node_quarantined = Gauge(
            "tunefleet_node_quarantined", "1 while a node is quarantined for a hardware class (its probe, a default "
            "schedule built and run, fails: it leases none of the class's shards), 0 once the probe passes again.",
            ["hardware", "node"], registry=r)
        self.last_push = Gauge(
            "tunefleet_last_push_timestamp_seconds", "Unix time of the last push of these metrics to a Pushgateway.",
            registry=r)
        self._last_push_at = 0.0

    # -- observations ---------------------------------------------------------------------------

    def init_series(self, hardware: str, source: str) -> None:
        """Create every counter and histogram series of ``hardware`` (and ``source``) at zero.

        Call it when a shard starts and push once: ``increase()`` and ``rate()`` ignore the first
        sample of a series, so a per-shard series that first appears already holding its final
        value (a cost counted only when the shard ends) would never show up on a dashboard.
        """
        _nonempty(hardware, "hardware")
        _check_source(source)
        for kind in KINDS:
            self.energy_joules.labels(hardware, source, kind)
            self.trials.labels(hardware, kind)
        for stage in ERROR_STAGES:
            self.measure_errors.labels(hardware, stage)
        self.cost.labels(hardware)
        self.shard_duration.labels(hardware)

    def observe_batch(
        self,
        hardware: str,
        source: str,
        useful_joules: float,
        wasted_joules: float,
        useful_trials: int,
        wasted_trials: int,
        build_errors: int = 0,
        run_errors: int = 0,
    ) -> None:
        """Count one measured batch of candidates.

        ``wasted_trials`` includes the errored candidates, so ``build_errors + run_errors`` may
        not exceed it. Zero amounts still create the series, so dashboards see both kinds.
        """
        _nonempty(hardware, "hardware")
        _check_source(source)
        values = {"useful_joules": useful_joules, "wasted_joules": wasted_joules, "useful_trials": useful_trials,
                  "wasted_trials": wasted_trials, "build_errors": build_errors, "run_errors": run_errors}
        for name, value in values.items():
            _nonneg(value, name)
        if build_errors + run_errors > wasted_trials:
            raise ValueError(f"errors count as wasted trials: build_errors + run_errors ({build_errors + run_errors}) "
                             f"> wasted_trials ({wasted_trials})")
        self.energy_joules.labels(hardware, source, "useful").inc(useful_joules)
        self.energy_joules.labels(hardware, source, "wasted").inc(wasted_joules)
        self.trials.labels(hardware, "useful").inc(useful_trials)
        self.trials.labels(hardware, "wasted").inc(wasted_trials)
        self.measure_errors.labels(hardware, "build").inc(build_errors)
        self.measure_errors.labels(hardware, "run").inc(run_errors)

    def observe_shard(self, hardware: str, duration_s: float, cost: float) -> None:
        """Record a finished shard: its wall-clock duration and what its node time cost."""
        _nonempty(hardware, "hardware")
        self.shard_duration.labels(hardware).observe(_nonneg(duration_s, "duration_s"))
        self.cost.labels(hardware).inc(_nonneg(cost, "cost"))

    def set_best_latency(self, workload: str, hardware: str, seconds: float) -> None:
        """Set the best latency so far of ``workload`` (structural hash; its first 16 hex digits are kept)."""
        if not seconds > 0:
            raise ValueError(f"best latency must be > 0 seconds; got {seconds!r}")
        self.best_latency.labels(workload_label(workload), _nonempty(hardware, "hardware")).set(seconds)

    def set_shard_states(self, hardware: str, counts: Mapping[str, int]) -> None:
        """Set the number of shards in every state for ``hardware``; states missing from ``counts`` get 0.

        Shard counts come from the database, so one process (the coordinator, or the accounting
        step) should set and export them; dashboards sum over every series that carries them.
        """
        _nonempty(hardware, "hardware")
        unknown = set(counts) - set(SHARD_STATES)
        if unknown:
            raise ValueError(f"unknown shard state(s) {', '.join(sorted(unknown))}; states are {', '.join(SHARD_STATES)}")
        for state in SHARD_STATES:
            self.shards.labels(hardware, state).set(_nonneg(counts.get(state, 0), f"count of {state} shards"))

    def set_model_totals(self, model: str, hardware: str, useful_joules: float, wasted_joules: float, cost: float) -> None:
        """Set a model's accumulated tuning energy and cost on one hardware class (from the database)."""
        _nonempty(model, "model")
        _nonempty(hardware, "hardware")
        self.model_energy_joules.labels(model, hardware, "useful").set(_nonneg(useful_joules, "useful_joules"))
        self.model_energy_joules.labels(model, hardware, "wasted").set(_nonneg(wasted_joules, "wasted_joules"))
        self.model_cost.labels(model, hardware).set(_nonneg(cost, "cost"))

    def set_measure_parallelism(self, hardware: str, degree: int) -> None:
        """Set the degree of parallelism the measurement runner uses now on ``hardware`` (>= 1).

        Meant as the ``on_degree`` callback of
        :class:`tunefleet.tvm.parallel_runner.AdaptiveParallelRunner`
        (``on_degree=functools.partial(metrics.set_measure_parallelism, hardware)``).
        """
        _nonempty(hardware, "hardware")
        if isinstance(degree, bool) or int(degree) != degree or degree < 1:
            raise ValueError(f"measure parallelism must be an integer >= 1; got {degree!r}")
        self.measure_parallelism.labels(hardware).set(int(degree))

    # -- getting the numbers out ----------------------------------------------------------------

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)

    def push(
        self,
        gateway: str,
        job: str = "tunefleet",
        *,
        grouping_key: Mapping[str, str],
        timeout: float = PUSH_TIMEOUT_S,
    ) -> None:
        """Replace this process's group on a Pushgateway with the current values (HTTP PUT).

        Parameters
        ----------
        gateway
            ``host:port`` or a URL (``http://host:port``); a URL's user-info
            (``https://user:password@host:9091``) is sent as HTTP basic authentication.
        job
            The ``job`` label of the group.
        grouping_key
            Labels naming the group, e.g. ``{"shard": "123", "hardware": "x86"}``: one group per
            shard keeps concurrent shards apart. Must not be empty (an empty key makes every
            process of the job overwrite the others). The Pushgateway silently *replaces* a
            metric label of the same name with the key's value, so a key label that is also a
            metric label (``hardware``) must match every series that carries it: only put
            ``hardware`` in the key when the process observes one class (checked here).
        timeout
            Seconds before the attempt fails.

        Raises
        ------
        PushgatewayError
            (a :class:`~tunefleet.errors.TransientError`) with a one-line message naming the
            gateway, when it cannot be reached, times out, or refuses the push.
        """
        if not grouping_key:
            raise ValueError("push needs a non-empty grouping_key (e.g. {'shard': '123'}) so that groups do not overwrite each other")
        if "job" in grouping_key:
            raise ValueError("grouping_key must not contain 'job'; pass job= instead")
        self._check_grouping_key(grouping_key)
        previous, self._last_push_at = self._last_push_at, time.time()
        self.last_push.set(self._last_push_at)
        try:
            address, handler = _without_credentials(gateway)
            push_to_gateway(address, job=job, registry=self.registry, grouping_key=dict(grouping_key), timeout=timeout,
                            handler=handler)
        except OSError as exc:  # URLError, timeouts, refused connections, non-2xx answers
            self._last_push_at = previous  # a failed push is no push
            self.last_push.set(previous)
            raise PushgatewayError(
                f"cannot push metrics to the Pushgateway at {mask_url(gateway)} (job {job!r}, group {dict(grouping_key)}): "
                f"{_why(exc)}"
            ) from exc

    def publish(
        self,
        gateway: str,
        job: str = "tunefleet",
        *,
        grouping_key: Mapping[str, str],
        timeout: float = PUSH_TIMEOUT_S,
        attempts: int = PUSH_ATTEMPTS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> bool:
        """:meth:`push`, for a flow or a tuning step that must go on whatever the Pushgateway does:
        never raises for a failed push; whether the metrics were pushed.

        A failed push (gateway down, restarting, timing out, answering 5xx) is tried again after
        :data:`PUSH_RETRY_S`, then twice that, up to ``attempts`` in all; a refusal (4xx: a wrong
        address or credentials) is not. Once a publish gives up, a warning names the gateway and
        the reason — once per outage and process — and pushes to that gateway are skipped for
        :data:`PUSH_COOLDOWN_S`; the next one that works says so. A wrong ``grouping_key`` is a
        bug and still raises ``ValueError``.

        Parameters
        ----------
        gateway, job, grouping_key, timeout
            As for :meth:`push`.
        attempts
            Pushes tried at most.
        sleep
            Waits between attempts (tests pass a hook).
        """
        return _with_outage_policy(
            gateway, lambda: self.push(gateway, job, grouping_key=grouping_key, timeout=timeout),
            skipped="metrics not pushed to", gave_up="metrics are not pushed to it until it answers again",
            back="metrics pushed to", attempts=attempts, sleep=sleep)

    def _check_grouping_key(self, grouping_key: Mapping[str, str]) -> None:
        for family in self.registry.collect():
            for sample in family.samples:
                for key, value in grouping_key.items():
                    if key in sample.labels and sample.labels[key] != str(value):
                        raise ValueError(
                            f"grouping_key {key}={value!r} would relabel {sample.name}{{{key}={sample.labels[key]!r}}} "
                            f"(the Pushgateway overwrites metric labels with the grouping key); drop {key!r} from the key")

    def serve(self, port: int, addr: str = "127.0.0.1") -> WSGIServer:
        """Serve ``/metrics`` from this registry on ``addr:port`` in a daemon thread.

        Returns the server: ``server.server_port`` is the port bound (useful with ``port=0``);
        stop it with ``server.shutdown(); server.server_close()``.
        """
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server


def publish_quarantine(gateway: str, hardware: str, node: str, on: bool, *, reason: str | None = None) -> bool:
    """Push ``tunefleet_node_quarantined{hardware, node}`` (1 while ``on``) to the Pushgateway, in
    the node's and class's own group; never raises (:meth:`FleetMetrics.publish`). ``reason`` is
    logged at debug level only: a label would make one series per message."""
    metrics = FleetMetrics()
    metrics.node_quarantined.labels(hardware=hardware, node=node).set(1 if on else 0)
    if reason:
        log.debug("node %s quarantined for %s: %s", node, hardware, reason)
    return metrics.publish(gateway, grouping_key={"hardware": hardware, "node": node})
