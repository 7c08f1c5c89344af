"""Energy and money of tuning: per shard, per tuning round, per candidate; useful vs wasted.

A :class:`ShardAccountant` meters one shard attempt with the best energy source of the node
(:func:`tunefleet.energy.meters.probe`: RAPL, NVML, or an estimate from CPU time, always labelled). At
each tuning round (a measured batch) it reads the meter, splits the round's joules over the
batch's candidates by their build + run seconds, and marks each candidate **useful** if, when
committed, it strictly beat the best latency measured so far for its workload on that hardware
class — every other candidate, errors included, is **wasted** (Trimmer's measure). The shard's
total energy, node time, CPU time and money (price per hour x node time) are added to the shard
row when the attempt ends; what a worker spends after its last commit before dying is lost with
it (the next attempt is metered afresh).

:func:`energy_report` adds it all up per model and hardware class. A workload shared by several
models is split between them by their call counts (weights).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tunefleet.db import Database, NewMeasurement
    from tunefleet.db.tables import HardwareClass, Workload
    from tunefleet.energy.meters import EnergyMeter
    from tunefleet.energy.metrics import FleetMetrics

log = logging.getLogger(__name__)

J_PER_KWH = 3.6e6


@dataclass
class RoundEnergy:
    """One tuning round (batch): its energy and how its candidates split."""

    joules: float
    useful: int
    wasted: int
    useful_joules: float
    wasted_joules: float
    build_errors: int
    run_errors: int


@dataclass
class ShardEnergy:
    """What one shard attempt cost."""

    joules: float
    source: str
    node_s: float
    cpu_s: float
    cost: float


class ShardAccountant:
    """Meters one shard attempt and annotates its measurements before they are committed.

    Parameters
    ----------
    db, hardware, workload_id:
        Where the shard's measurements go; the best latency so far is read from ``db``.
    meter:
        An unstarted energy meter; by default the node's best source for the class's target.
    pushgateway, shard_id:
        With a Pushgateway address, the attempt's metrics (a registry of its own) are pushed under
        the grouping key ``{shard, attempt}`` (``attempt``: the shard's lease number) when it starts, after every round and at its end,
        so concurrent shards never overwrite each other. The group is deleted when the attempt
        ends, ``linger_s`` after its last push (:func:`tunefleet.energy.metrics.retract_group_later`:
        Prometheus scrapes the final values first); an attempt that starts deletes the groups its
        shard's earlier attempts left (a killed worker never ended its own). A failed push or
        deletion is logged, never fatal: metrics must not stop tuning.
    linger_s:
        Seconds the group stays after the attempt ends (0: deleted at once, in :meth:`finish`).
    """

    def __init__(self, db: Database, hardware: HardwareClass, workload: Workload, *,
                 meter: EnergyMeter | None = None, pushgateway: str | None = None,
                 shard_id: int | None = None, lease: int = 0, linger_s: float | None = None) -> None:
        from tunefleet.energy.meters import probe

        self.hardware = hardware
        self.workload_hash = workload.structural_hash
        best = db.best_measurements(workload.id, hardware.id, 1)
        self.best_s: float | None = float(best[0].mean_run_s) if best else None
        self.meter = meter or probe(hardware.target, watts_per_core=hardware.watts_per_core,
                                    idle_watts=hardware.idle_watts, watts_per_gpu=hardware.watts_per_gpu)
        self.pushgateway = pushgateway
        self.grouping_key = {"shard": str(shard_id), "attempt": str(lease)}
        self.metrics: FleetMetrics | None = None
        self.linger_s = linger_s
        self._ended = False
        if pushgateway:
            from tunefleet.energy.metrics import GROUP_LINGER_S, FleetMetrics

            self.metrics = FleetMetrics()
            if self.linger_s is None:
                self.linger_s = GROUP_LINGER_S
        self._accounted_j = 0.0
        self.meter.start()
        if self.metrics is not None:
            self.metrics.init_series(hardware.name, self.meter.source)
            self.push()
            self._retract_earlier_attempts(shard_id, lease)

    def push(self) -> None:
        if self.metrics is None or not self.pushgateway or self._ended:
            return
        self.metrics.publish(self.pushgateway, grouping_key=self.grouping_key)  # an outage: one warning

    def _retract_earlier_attempts(self, shard_id: int | None, lease: int) -> None:
        """Delete the groups of this shard's earlier attempts (leases are numbered from 1)."""
        from tunefleet.energy.metrics import retract_group

        if shard_id is None or not self.pushgateway:
            return
        for attempt in range(1, lease):
            retract_group(self.pushgateway, grouping_key={"shard": str(shard_id), "attempt": str(attempt)})

    def _retract(self) -> None:
        """Delete this attempt's group: at once with ``linger_s`` 0, else that much later."""
        from tunefleet.energy.metrics import retract_group, retract_group_later

        if self.metrics is None or not self.pushgateway:
            return
        if self.linger_s:
            retract_group_later(self.pushgateway, grouping_key=self.grouping_key, after_s=self.linger_s)
        else:
            retract_group(self.pushgateway, grouping_key=self.grouping_key)

    @property
    def source(self) -> str:
        return self.meter.source

    def annotate(self, records: Sequence[NewMeasurement]) -> RoundEnergy:
        """Give each candidate of a round its share of the round's energy and its useful flag."""
        from tunefleet.energy.meters import apportion

        reading = self.meter.read()
        round_j = max(0.0, reading.joules - self._accounted_j)
        self._accounted_j += round_j
        weights = [(r.build_s or 0.0) + sum(r.run_secs or []) for r in records]
        shares = apportion(round_j, weights) if records else []
        out = RoundEnergy(round_j, 0, 0, 0.0, 0.0, 0, 0)
        for rec, joules in zip(records, shares, strict=True):
            mean = rec.mean_run_s
            useful = mean is not None and (self.best_s is None or mean < self.best_s)
            if useful:
                self.best_s = mean
            rec.energy_j, rec.energy_source, rec.useful = joules, reading.source, useful
            if useful:
                out.useful += 1
                out.useful_joules += joules
            else:
                out.wasted += 1
                out.wasted_joules += joules
            out.build_errors += rec.error_kind == "build"
            out.run_errors += rec.error_kind == "run"
        if self.metrics is not None and records:
            self.metrics.observe_batch(self.hardware.name, reading.source, out.useful_joules, out.wasted_joules,
                                       out.useful, out.wasted, out.build_errors, out.run_errors)
            if self.best_s is not None:
                self.metrics.set_best_latency(self.workload_hash, self.hardware.name, self.best_s)
            self.push()
        return out

    def finish(self) -> ShardEnergy:
        """The attempt's totals (energy, node and CPU time, money); the meter stops counting here.
        The last push has them; the attempt's Pushgateway group is deleted ``linger_s`` later."""
        from tunefleet.energy.meters import money

        reading = self.meter.read()
        energy = ShardEnergy(reading.joules, reading.source, reading.wall_s, reading.cpu_s,
                             money(self.hardware.price_per_hour, reading.wall_s))
        if self.metrics is not None and not self._ended:
            self.metrics.observe_shard(self.hardware.name, reading.wall_s, energy.cost)
            self.push()
            self._ended = True
            self._retract()
        return energy


def add_shard_energy(db: Database, shard_id: int, energy: ShardEnergy) -> None:
    """Add an attempt's totals to its shard (attempts of one shard are summed)."""
    db.add_shard_energy(shard_id, joules=energy.joules, source=energy.source, node_s=energy.node_s,
                        cpu_s=energy.cpu_s, cost=energy.cost)


# -- reports ----------------------------------------------------------------------------------
@dataclass
class EnergyRow:
    """Energy and money of one model on one hardware class (shared workloads split by weight)."""

    model_id: int
    model: str
    hardware: str
    joules: float
    kwh: float
    useful_joules: float
    wasted_joules: float
    wasted_pct: float | None
    cost: float
    trials: int
    """Candidates measured (built and run, errors included)."""
    errors: int
    filtered: int
    """Candidates the cost model scored out before measuring (no energy spent on them)."""
    best_latency_ms: float | None
    """Sum over the model's workloads of (best measured mean x calls): the tuned operators' time."""
    tuned_workloads: int
    workloads: int
    sources: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def energy_report(db: Database, *, model: str | int | None = None, hardware: str | None = None) -> list[EnergyRow]:
    """Per model x hardware class: joules, kWh, money, wasted %, trials, best latency, sources."""
    totals = db.energy_totals(db.hardware_class(hardware).id if hardware else None)
    hw_names, costs, links, models = totals.hardware_names, totals.shard_costs, totals.links, totals.model_names
    n_workloads = totals.workload_counts
    per_wl: dict[tuple[int, int], dict[str, Any]] = defaultdict(
        lambda: {"j": 0.0, "useful": 0.0, "wasted": 0.0, "trials": 0, "errors": 0, "filtered": 0, "best": None,
                 "sources": set()})
    for g in totals.groups:
        agg = per_wl[(g.workload_id, g.hardware_class_id)]
        agg["j"] += g.joules
        agg["useful" if g.useful else "wasted"] += g.joules
        agg["trials"] += g.count - g.filtered
        agg["errors"] += g.errors - g.filtered
        agg["filtered"] += g.filtered
        if g.best_s is not None and (agg["best"] is None or g.best_s < agg["best"]):
            agg["best"] = g.best_s
        if g.energy_source:
            agg["sources"].add(g.energy_source)
    wanted_model = db.model(model).id if model is not None else None
    total_weight: dict[int, int] = defaultdict(int)
    for _, wl, weight in links:
        total_weight[wl] += int(weight)
    by_workload: dict[int, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for (wl_id, hw_id), agg in per_wl.items():
        by_workload[wl_id].append((hw_id, agg))
    out: dict[tuple[int, int], dict[str, Any]] = {}
    for model_id, wl, weight in links:
        if wanted_model is not None and model_id != wanted_model:
            continue
        share = int(weight) / total_weight[wl] if total_weight[wl] else 0.0
        for hw_id, agg in by_workload[wl]:
            row = out.setdefault((model_id, hw_id), {"j": 0.0, "useful": 0.0, "wasted": 0.0, "cost": 0.0,
                                                     "trials": 0, "errors": 0, "filtered": 0, "latency": 0.0,
                                                     "tuned": 0, "sources": set()})
            row["j"] += agg["j"] * share
            row["useful"] += agg["useful"] * share
            row["wasted"] += agg["wasted"] * share
            row["cost"] += costs.get((wl, hw_id), 0.0) * share
            row["trials"] += agg["trials"]
            row["errors"] += agg["errors"]
            row["filtered"] += agg["filtered"]
            row["sources"] |= agg["sources"]
            if agg["best"] is not None:
                row["latency"] += agg["best"] * int(weight)
                row["tuned"] += 1
    report = []
    for (model_id, hw_id), row in sorted(out.items(), key=lambda kv: (models[kv[0][0]], hw_names[kv[0][1]])):
        report.append(EnergyRow(
            model_id=model_id, model=models[model_id], hardware=hw_names[hw_id], joules=row["j"], kwh=row["j"] / J_PER_KWH,
            useful_joules=row["useful"], wasted_joules=row["wasted"],
            wasted_pct=100.0 * row["wasted"] / row["j"] if row["j"] > 0 else None,
            cost=row["cost"], trials=row["trials"], errors=row["errors"], filtered=row["filtered"],
            best_latency_ms=row["latency"] * 1e3 if row["tuned"] else None,
            tuned_workloads=row["tuned"], workloads=int(n_workloads.get(model_id, 0)),
            sources="+".join(sorted(row["sources"])) or "-",
        ))
    return report


def shard_state_counts(db: Database) -> dict[str, dict[str, int]]:
    """``{hardware: {state: count}}`` for the shard-state gauge."""
    return db.shard_state_counts()


def publish_fleet_metrics(db: Database, metrics: FleetMetrics, rows: Sequence[EnergyRow] | None = None) -> None:
    """Set the fleet-wide gauges (per-model energy and cost, shard states) from the database."""
    for row in energy_report(db) if rows is None else rows:
        metrics.set_model_totals(row.model, row.hardware, row.useful_joules, row.wasted_joules, row.cost)
    for hardware, counts in shard_state_counts(db).items():
        metrics.set_shard_states(hardware, counts)
