"""Every dashboard panel returns data from a real (tiny) tuning run: Pushgateway -> Prometheus."""

from __future__ import annotations

import time

import pytest

from tunefleet.planning import shard_queue
from tunefleet.energy.accounting import energy_report
from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.hardware import seed_hardware_classes
from tunefleet.models.ingest import ingest
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain
from tunefleet.models.workloads import extract
from tunefleet.store import open_store

from .conftest import PrometheusServer, PushgatewayServer, assert_all_panels_return_data

pytestmark = pytest.mark.slow


def _value(prom: PrometheusServer, promql: str) -> float:
    result = prom.query(promql)
    assert result, f"no data for {promql}"
    return float(result[0]["value"][1])


def test_every_panel_returns_data_from_a_real_tuning_run(prometheus: PrometheusServer, pushgateway: PushgatewayServer,
                                                          tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.context import close_shared_contexts
    from tunefleet.tasks import steps

    home = tmp_path / "home"
    settings = load_settings(home=home, metrics_pushgateway=pushgateway.address)
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = open_store(settings)
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    shard_queue.plan(db, "x86", target_trials=6, model=model.id)
    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=2, metrics_pushgateway=pushgateway.address))
    assert summary.shards_done == 3 and summary.measured >= 6

    # the account step pushes the fleet gauges (per-model totals, shard states)
    monkeypatch.setenv("TUNEFLEET_HOME", str(home))
    monkeypatch.setenv("TUNEFLEET_METRICS_PUSHGATEWAY", pushgateway.address)
    rows = steps.account.fn()
    close_shared_contexts()
    time.sleep(4)  # a few 1 s scrapes after the last push

    assert assert_all_panels_return_data(prometheus.url, rate_interval="30s", range="10m") >= 20
    # The dashboards show this run's figures: what the database says, labelled with the source.
    assert _value(prometheus, "sum(tunefleet_trials_total)") == summary.measured
    report = energy_report(db)
    assert [(r.model, r.sources) for r in report] == [("mlp", "estimate")] == [(rows[0]["model"], rows[0]["sources"])]
    joules = _value(prometheus, 'sum(tunefleet_energy_joules_total{source="estimate"})')
    assert joules == pytest.approx(report[0].joules, rel=1e-6) and joules > 0
    assert _value(prometheus, 'sum(tunefleet_shards{state="done"})') == 3
    db.close()
