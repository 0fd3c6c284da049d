"""The shipped alerts and dashboard against real processes (issue 24 items 1 and 2).

- A fresh installation (writer, gateway, worker) exports, at its first scrape and before anything
  happened, a sample for every series that a rule of alerts.yml or a panel of arkvory.json selects,
  with the selector's label matchers (test_monitoring.promql_selectors says what it reads of PromQL
  and what it leaves out). Labelled counters start at 0, so `increase()` sees their first event.
- Real events fire their alerts: what the processes exported before and after (a real failed task,
  a real lost lease) becomes promtool's input series, one scrape a minute, and `promtool test rules`
  must see the alert fire. A lost lease is seen from the processes that survive it.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from .harness import Cluster, db_execute, db_fetch
from .test_monitoring import (
    ALERTS, DASHBOARD, PROMETHEUS_SERIES, alert_rules, dashboard_expressions, promql_selectors, promtool, scrape,
    value,
)
from .worker_harness import start_worker, wait_for, wait_task

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

# Labels the scrape adds (prometheus.yml), never the process: a matcher on `role` picks the
# processes a selector may be satisfied by; `job` and `instance` are always satisfiable.
TARGET_LABELS = {"job", "instance", "role"}

# Selected series no fresh process can have, and why that costs no alert its first event.
NOT_BEFORE_THE_FIRST_REQUEST = {
    # ArkvoryServerErrors: per (method, route, status), made at a route's first answer with that
    # status (hundreds of route × status pairs otherwise). A ratio of rates held 10 minutes: a
    # lone first 500 is no alert anyway, and every later one is counted.
    ("arkvory_http_requests_total", (("status", "!=", "503"), ("status", "=~", "5.."))),
    # ArkvoryAdmissionRejections' denominator: content GETs, made at the first download.
    ("arkvory_http_requests_total", (("method", "=", "GET"), ("route", "=~", ".*/content"))),
}


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def _matches(labels: dict[str, str], matchers) -> bool:
    for label, op, wanted in matchers:
        have = labels.get(label, "")
        if op == "=" and have != wanted or op == "!=" and have == wanted:
            return False
        if op in ("=~", "!~") and (re.fullmatch(wanted, have) is not None) != (op == "=~"):
            return False
    return True


def satisfied(selector, scraped: dict[str, list]) -> bool:
    """Some process whose role the selector allows exports a sample it selects."""
    name, matchers = selector
    own = [m for m in matchers if m[0] not in TARGET_LABELS]
    roles = [m for m in matchers if m[0] == "role"]
    return any(
        _matches({"role": role}, roles) and any(n == name and _matches(labels, own) for n, labels, _ in found)
        for role, found in scraped.items()
    )


@pytest.fixture
def installation(cluster: Cluster):
    """A writer (slot 0 of 2), a gateway (slot 1) and the real worker, nothing done yet."""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    return {"writer": writer, "gateway": gateway, "worker": worker}


def test_a_fresh_installation_exports_every_series_the_rules_and_the_dashboard_select(installation):
    # One scrape each, the first: nothing has happened but the start and the readiness polls.
    scraped = {role: samples(scrape(process.url)) for role, process in installation.items()}
    wanted = {}
    for name, rule in alert_rules().items():
        for selector in promql_selectors(rule["expr"]):
            wanted.setdefault(selector, set()).add(f"alert {name}")
    for expr in dashboard_expressions(json.loads(DASHBOARD.read_text())):
        for selector in promql_selectors(expr):
            wanted.setdefault(selector, set()).add(f"dashboard {expr[:60]}…")
    assert len(wanted) > 40
    missing = [
        f"{name}{{{', '.join(f'{k}{op}{v!r}' for k, op, v in matchers)}}} (for {', '.join(sorted(users))})"
        for (name, matchers), users in sorted(wanted.items())
        if name not in PROMETHEUS_SERIES
        and (name, tuple(m for m in matchers if m[0] not in TARGET_LABELS)) not in NOT_BEFORE_THE_FIRST_REQUEST
        and not satisfied((name, matchers), scraped)
    ]
    assert not missing, "no fresh process exports a sample for:\n" + "\n".join(missing)
    # The ones the issue named, at 0 for each of their known labels.
    worker, writer = scrape(installation["worker"].url), scrape(installation["writer"].url)
    for kind in ("cleanup", "verify"):
        for outcome in ("completed", "failed", "budget_exceeded", "cancelled"):
            assert value(worker, "arkvory_worker_tasks_total", kind=kind, outcome=outcome) == 0
    for to in ("queued", "resumed", "failed", "cancelled"):
        assert value(worker, "arkvory_worker_recovered_tasks_total", to=to) == 0
    for reason in ("full", "timed_out", "draining"):
        assert value(writer, "arkvory_download_admission_failures_total", reason=reason) == 0
    for reason in ("lease_lost", "client_gone", "send_timeout"):
        assert value(writer, "arkvory_transfer_aborts_total", direction="download", reason=reason) == 0
    for problem in ("missing", "corrupt"):
        assert value(writer, "arkvory_storage_diagnostics", problem=problem) == 0
        assert value(worker, "arkvory_storage_diagnostics", problem=problem) == 0
    gateway = scrape(installation["gateway"].url)
    for text in (writer, worker, gateway):
        assert value(text, "arkvory_slot_leases_lost_total", slot="0") == 0
        assert value(text, "arkvory_slot_leases_lost_total", slot="1") == 0
    # Read when each started (then every 5 s): the gateway's own acquisition, seen by the worker
    # started after it (the writer read the slots before the gateway took its own).
    assert value(worker, "arkvory_slot_lease_generation", slot="1") == 1
    assert value(gateway, "arkvory_slot_lease_generation", slot="1") == 1
    data_dir = str(installation["writer"].env["ARKVORY_DATA_DIR"])
    assert value(writer, "arkvory_disk_free_bytes", dir="data", path=data_dir) > 0


# -- real events through promtool ---------------------------------------------------------------


def as_input_series(rule_expr: str, scrapes: list[dict[str, str]]) -> list[dict[str, str]]:
    """promtool input series from scrapes taken a minute apart (`{role: text}` each, the
    labels Prometheus adds included): every sample of every metric the rule selects, `_` where
    a scrape had none (absent, or its process gone), the last scrape held for 5 minutes more."""
    names = {name for name, _ in promql_selectors(rule_expr)}
    series: dict[str, list[str]] = {}
    for minute, scraped in enumerate(scrapes):
        for role, text in scraped.items():
            for name, labels, sample in samples(text):
                if name not in names:
                    continue
                labels = {**labels, "job": "arkvory", "instance": role, "role": role}
                key = name + "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
                series.setdefault(key, ["_"] * len(scrapes))[minute] = repr(float(sample))
    return [{"series": key, "values": " ".join(values + [values[-1]] * 5)} for key, values in series.items()]


def promtool_says(tmp_path, alert: str, input_series, eval_minutes: int, expected: list[dict[str, str]]):
    """Run `promtool test rules` on the shipped rule `alert` (its annotations left out: their
    rendering is alerts_test.yml's business) with these input series; returns promtool's run."""
    rules = yaml.safe_load(ALERTS.read_text())
    for group in rules["groups"]:
        group["rules"] = [{k: v for k, v in rule.items() if k != "annotations"}
                          for rule in group["rules"] if rule.get("alert") == alert]
    rules["groups"] = [group for group in rules["groups"] if group["rules"]]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    test = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": input_series,
            "alert_rule_test": [{"eval_time": f"{eval_minutes}m", "alertname": alert,
                                 "exp_alerts": [{"exp_labels": labels} for labels in expected]}],
        }],
    }
    (tmp_path / "test.yml").write_text(yaml.safe_dump(test))
    return subprocess.run([promtool(), "test", "rules", "test.yml"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60)


def test_a_real_failed_task_fires_arkvory_task_failures(cluster, tmp_path):
    writer = cluster.writer().wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    before = {"worker": scrape(worker.url)}
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "tf"}).status_code == 201
        for n in range(2):
            made = client.post("/api/v1/repositories/tf/artifacts", params={"name": f"{n}.bin"}, content=b"x" * (n + 1))
            assert made.status_code == 201, made.text
        # Two blobs to verify, a budget of one: the task fails (budget_exceeded).
        task = client.post("/api/v1/tasks", json={"kind": "verify", "budget": {"max_items": 1}})
        assert task.status_code == 202, task.text
    failed = wait_task(cluster.database_url, task.json()["id"], ("failed", "completed"))
    assert failed["status"] == "failed" and failed["error_code"] == "budget_exceeded", failed
    after = {"worker": wait_for(
        lambda: (text := scrape(worker.url))
        and value(text, "arkvory_worker_tasks_total", kind="verify", outcome="budget_exceeded") == 1 and text,
        "the worker counting the failed task", timeout=10,
    )}
    rule = alert_rules()["ArkvoryTaskFailures"]
    run = promtool_says(tmp_path, "ArkvoryTaskFailures", as_input_series(rule["expr"], [before, after]), 2,
                        [{"severity": "warning", "kind": "verify"}])
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("loser", ["gateway", "writer"])
def test_a_real_lost_lease_fires_arkvory_lease_lost_from_the_survivors(installation, cluster, tmp_path, loser):
    """The database ends the loser's reservation before its next renewal (as a stalled database
    or a frozen host does): the renewal is refused, the process cuts its transfers and exits 75
    two seconds later, and is not restarted here. Its own counter is never scraped at 1; the
    survivors report the loss from the database."""
    slot = {"writer": 0, "gateway": 1}[loser]
    before = {role: scrape(process.url) for role, process in installation.items()}
    db_execute(cluster.database_url, "UPDATE arkvory_gateway_leases SET expires_at = now() WHERE slot = $1", slot)
    process = installation[loser]
    assert process.wait_exit(20) == 75
    assert f"slot {slot} lease LOST" in process.stderr
    survivors = {role: p for role, p in installation.items() if role != loser}
    after = {}
    for role, survivor in survivors.items():
        after[role] = wait_for(
            lambda: (text := scrape(survivor.url))
            and value(text, "arkvory_slot_leases_lost_total", slot=str(slot)) == 1 and text,
            f"the {role} reporting slot {slot}'s lost lease", timeout=15, every=0.25,
        )
    rule = alert_rules()["ArkvoryLeaseLost"]
    # One alert for the slot, however many processes reported it.
    run = promtool_says(tmp_path, "ArkvoryLeaseLost", as_input_series(rule["expr"], [before, after]), 2,
                        [{"severity": "critical", "job": "arkvory", "slot": str(slot)}])
    assert run.returncode == 0, run.stdout + run.stderr
    assert db_fetch(cluster.database_url, "SELECT released_at FROM arkvory_gateway_leases WHERE slot = $1",
                    slot)[0]["released_at"] is None


def test_a_stopped_gateway_releases_its_lease(installation, cluster):
    """SIGTERM: drained, exit 0, the lease marked released while its reservation still runs (so
    its end is no loss: tests/test_lease_history.py counts what a release changes)."""
    gateway = installation["gateway"]
    gateway.signal(signal.SIGTERM)
    assert gateway.wait_exit(20) == 0
    (row,) = db_fetch(cluster.database_url,
                      "SELECT released_at, expires_at > now() AS live FROM arkvory_gateway_leases WHERE slot = 1")
    assert row["released_at"] is not None and row["live"]
    assert value(scrape(installation["worker"].url), "arkvory_slot_leases_lost_total", slot="1") == 0


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_a_writer_cut_off_from_its_database_is_reported_lost_by_the_survivors(cluster, db_proxy, tmp_path):
    """The operator's night with the real timings: the writer's database stalls, its trust runs
    out after 8 s and it exits 75; the gateway and the worker, which still reach the database,
    report the loss once the reservation has run out (10 s after the last renewal)."""
    shared = cluster.shared_env(slots=2)
    writer = cluster.writer(shared, ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url)).wait_ready()
    gateway = cluster.gateway(1, shared).wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    survivors = {"gateway": gateway, "worker": worker}
    before = {"writer": scrape(writer.url), **{role: scrape(p.url) for role, p in survivors.items()}}
    db_proxy.stall()
    try:
        assert writer.wait_exit(30) == 75
        assert "slot 0 lease LOST: trust ran out" in writer.stderr
        after = {
            role: wait_for(
                lambda p=p: (text := scrape(p.url))
                and value(text, "arkvory_slot_leases_lost_total", slot="0") == 1 and text,
                f"the {role} reporting the writer's lost lease", timeout=30, every=0.25,
            )
            for role, p in survivors.items()
        }
    finally:
        db_proxy.resume()
    rule = alert_rules()["ArkvoryLeaseLost"]
    run = promtool_says(tmp_path, "ArkvoryLeaseLost", as_input_series(rule["expr"], [before, after]), 2,
                        [{"severity": "critical", "job": "arkvory", "slot": "0"}])
    assert run.returncode == 0, run.stdout + run.stderr
