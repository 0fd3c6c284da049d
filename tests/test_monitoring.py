"""Monitoring (issue 15 §2): the shipped Prometheus configuration, alerts and Grafana dashboard
hold together, and the metrics they read are what live processes export.

- promtool accepts the scrape config, lints the rules, and `alerts_test.yml` fires and silences
  every alert; each alert has its annotations, a firing and a quiet test, and a runbook section.
- A live writer, gateway and worker export every metric name the rules and the dashboard use,
  and `promtool check metrics` finds nothing wrong in their output.
- The metrics added for the alerts say the truth: live leases against the policy's slots, the
  worker lock and the worker's own state, the health status (ready, draining, unavailable), the
  read pins' write age and the database errors by loop, the free space (issue 24 item 3).
- Every label value the code counts is one its series starts with at 0 (issue 24 item 2).

The same files against a fresh installation and real events: tests/test_monitoring_live.py.

Tests that need promtool skip, naming the package, where it is missing (.ci/run installs it).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Callable

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from arkvory.shared.cluster.supervision import observe_database
from arkvory.shared.metrics import HEALTH_STATUSES
from arkvory.shared.http.protocol import HeadStats, HttpProtocol
from arkvory.shared.cluster.supervision import DatabaseReachability

from .harness import ADMIN_TOKEN, ROOT, ArkvoryProcess, Cluster
from .worker_harness import WorkerProc, start_worker, wait_for
from .tools import require_tool

pytestmark = pytest.mark.timeout(120)

PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
ALERTS = PROMETHEUS_DIR / "alerts.yml"
ALERT_TESTS = PROMETHEUS_DIR / "alerts_test.yml"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "arkvory.json"
OPERATIONS = ROOT / "docs" / "operations.md"
SEVERITIES = {"critical", "warning"}
# Series Prometheus makes itself for every target; no process exports them.
PROMETHEUS_SERIES = {"up"}
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def promtool() -> str:
    return require_tool("promtool", apt="prometheus")


def run_promtool(*args: str, stdin: str | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [promtool(), *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd
    )


def alert_rules() -> dict[str, dict]:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def dashboard_expressions(dashboard: dict) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]


# -- PromQL selectors ----------------------------------------------------------------------------

GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$job": ".*", "$role": ".*", "$instance": ".*"}
_PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan",
}
_SELECTOR = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<grouping>\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\))
      | (?P<range>\[[^\]]*\])
      | (?<![\w.:])(?P<name>[A-Za-z_:][\w:]*)
        (?P<matchers>\s*\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})?
        (?P<call>\s*(?:(?:by|without)\s*\([^)]*\)\s*)?\()?""",  # a function, an aggregation
    re.X,
)
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


def promql_selectors(expr: str) -> list[tuple[str, tuple[tuple[str, str, str], ...]]]:
    """The series selectors of a PromQL expression: (metric name, sorted (label, op, value)
    matchers). A regex reading, honest about its reach: it skips strings, ranges, grouping lists,
    function calls and keywords, and takes every other identifier as a metric name with the
    matchers in braces right after it. It does not resolve `{__name__=...}` selectors, recording
    rules or what a function does to its argument (the shipped files use none of these)."""
    for variable, replacement in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, replacement)
    found = []
    for match in _SELECTOR.finditer(expr):
        name = match.group("name")
        if not name or match.group("call") or name.lower() in _PROMQL_WORDS:
            continue
        matchers = tuple(sorted(_MATCHER.findall(match.group("matchers") or "")))
        found.append((name, matchers))
    return found


def promql_metric_names(expr: str) -> set[str]:
    """The metric names an expression selects."""
    return {name for name, _ in promql_selectors(expr)}


def test_the_selector_reader_finds_names_and_matchers():
    expr = (
        'sum by (job, instance) (rate(arkvory_a_total{status=~"5..", route="/x/{id}"}[5m]))'
        ' / ignoring (scope) (arkvory_b{scope="process", job=~"$job"} > 0) or vector(0)'
        ' + histogram_quantile(0.99, sum by (le) (rate(arkvory_c_bucket[$__rate_interval])))'
        " and on () arkvory_d offset 5m > bool 1e3 < on (job) group_left () 2 * arkvory_e"
    )
    assert promql_selectors(expr) == [
        ("arkvory_a_total", (("route", "=", "/x/{id}"), ("status", "=~", "5.."))),
        ("arkvory_b", (("job", "=~", ".*"), ("scope", "=", "process"))),
        ("arkvory_c_bucket", ()),
        ("arkvory_d", ()),
        ("arkvory_e", ()),
    ]


# -- the shipped files and promtool ---------------------------------------------------------------


def test_the_scrape_config_passes_promtool_with_its_token_file_and_rules(tmp_path):
    config = yaml.safe_load(SCRAPE_CONFIG.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "arkvory"  # ArkvoryProcessDown selects up{job="arkvory"}
    assert job["metrics_path"] == "/health/metrics"
    assert job["authorization"]["credentials_file"]
    roles = {group["labels"]["role"] for group in job["static_configs"]}
    assert roles == {"writer", "gateway", "worker"}

    syntax = run_promtool("check", "config", "--syntax-only", str(SCRAPE_CONFIG))
    assert syntax.returncode == 0, syntax.stdout + syntax.stderr
    # The full check also reads the token file and the rule files: give it a token file.
    token = tmp_path / "arkvory.token"
    token.write_text("arkvory_key_example\n")
    job["authorization"]["credentials_file"] = str(token)
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    shutil.copy(ALERTS, tmp_path / "alerts.yml")
    full = run_promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert full.returncode == 0, full.stdout + full.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in full.stdout


def test_the_alert_rules_pass_promtools_lint():
    checked = run_promtool("check", "rules", "--lint=all", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in checked.stdout


def test_every_alert_fires_and_stays_quiet_in_promtools_rule_tests():
    tested = run_promtool("test", "rules", ALERT_TESTS.name, cwd=PROMETHEUS_DIR)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _github_anchor(heading: str) -> str:
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_has_its_labels_annotations_tests_and_runbook_section():
    rules = alert_rules()
    assert len(rules) >= 15
    tests = yaml.safe_load(ALERT_TESTS.read_text())["tests"]
    assert yaml.safe_load(ALERT_TESTS.read_text())["rule_files"] == ["alerts.yml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in tests:
        for check in test["alert_rule_test"]:
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    operations = OPERATIONS.read_text()
    # The monitoring part is self-contained: its sections lie between its `##` heading and the next.
    part = operations.split("\n## Monitoring and alerts\n", 1)[1].split("\n## ", 1)[0]
    anchors = {_github_anchor(line[4:]) for line in part.splitlines() if line.startswith("### ")}
    problems = []
    for name, rule in rules.items():
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity must be one of {sorted(SEVERITIES)}")
        annotations = rule.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not str(annotations.get(key, "")).strip():
                problems.append(f"{name}: no {key}")
        url = annotations.get("runbook_url", "")
        if url != f"docs/operations.md#{name.lower()}":
            problems.append(f"{name}: runbook_url {url!r} is not its section of docs/operations.md")
        if name.lower() not in anchors:
            problems.append(f"{name}: docs/operations.md has no '### {name}' under 'Monitoring and alerts'")
        if name not in firing:
            problems.append(f"{name}: no test in alerts_test.yml fires it")
        if name not in quiet:
            problems.append(f"{name}: no test in alerts_test.yml where it stays quiet")
    stale = (firing | quiet) - rules.keys()
    if stale:
        problems.append(f"alerts_test.yml tests alerts that do not exist: {sorted(stale)}")
    assert not problems, "\n".join(problems)


def test_the_dashboards_expressions_are_valid_promql(tmp_path):
    """promtool parses them as recording rules, with Grafana's variables filled in."""
    dashboard = json.loads(DASHBOARD.read_text())
    substitutions = {"$__rate_interval": "5m", "$job": ".*", "$role": ".*", "$instance": ".*"}
    rules = []
    for n, expr in enumerate(dashboard_expressions(dashboard)):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"an unknown variable in {expr!r}"
        rules.append({"record": f"dashboard:expression_{n}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = run_promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


# -- a live writer, gateway and worker ------------------------------------------------------------


def scrape(url: str) -> str:
    answer = httpx.get(f"{url}/health/metrics", headers=AUTH, timeout=10)
    assert answer.status_code == 200, answer.text
    return answer.text


def exported_names(text: str) -> set[str]:
    """Every sample name a family in `text` can have, samples present or not yet (a labelled
    counter has none until its first increment)."""
    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
        "info": ("_info",),
        "stateset": ("",),
        "unknown": ("",),
    }
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names


def value(text: str, name: str, **labels: str) -> float | None:
    """The sample `name{labels}` of a scrape, or None."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


def wait_for_value(url: str, name: str, wanted: Callable[[float | None], bool], what: str,
                   timeout: float = 20.0, **labels: str) -> str:
    """Scrape until `wanted(value)`; returns that scrape."""
    last: list[float | None] = [None]

    def check():
        text = scrape(url)
        last[0] = value(text, name, **labels)
        return text if wanted(last[0]) else None

    try:
        return wait_for(check, what, timeout, every=0.25)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {name}{labels or ''} is {last[0]}") from None


class LiveInstallation:
    def __init__(self, cluster: Cluster, writer: ArkvoryProcess, gateway: ArkvoryProcess, worker: WorkerProc):
        self.cluster = cluster
        self.writer = writer
        self.gateway = gateway
        self.worker = worker
        self.shared = cluster.shared_env(slots=3)


@pytest.fixture(scope="module")
def live(postgres, module_tmp_path):
    """A writer (slot 0 of 3), a gateway (slot 1) and the real worker, once for this module."""
    database_url = postgres.create_database(f"t_{uuid.uuid4().hex[:16]}")
    cluster = Cluster(database_url, module_tmp_path)
    try:
        shared = cluster.shared_env(slots=3)
        writer = cluster.writer(shared).wait_ready()
        gateway = cluster.gateway(1, shared).wait_ready()
        worker = start_worker(cluster, real=True).wait_active()
        installation = LiveInstallation(cluster, writer, gateway, worker)
        # The writer reads the installation from the database every 5 s.
        wait_for_value(writer.url, "arkvory_gateway_leases_live", lambda v: v == 2, "2 live leases")
        wait_for_value(writer.url, "arkvory_worker_lock_held", lambda v: v == 1, "the worker lock held")
        yield installation
    finally:
        cluster.close()


def test_live_processes_export_every_metric_the_alerts_and_dashboard_read(live):
    for process in (live.writer, live.gateway):
        with process.client() as client:
            assert client.get("/health/ready").status_code == 200
            assert client.get("/api/v1/repositories/none/artifacts/x/content").status_code in (400, 404)
    # Every loop reports to the database view within a round (2 s).
    wait_for_value(live.gateway.url, "arkvory_database_errors_total", lambda v: v == 0,
                   "the lease loop's error count", loop="slot lease")
    outputs = [scrape(process.url) for process in (live.writer, live.gateway, live.worker)]
    exported = set().union(*(exported_names(text) for text in outputs))

    used_by_rules = {name: promql_metric_names(rule["expr"]) for name, rule in alert_rules().items()}
    dashboard = json.loads(DASHBOARD.read_text())
    used_by_dashboard = {expr: promql_metric_names(expr) for expr in dashboard_expressions(dashboard)}
    missing = [
        f"{where}: {sorted(names - exported - PROMETHEUS_SERIES)}"
        for where, names in {**used_by_rules, **used_by_dashboard}.items()
        if names - exported - PROMETHEUS_SERIES
    ]
    assert not missing, "not exported by any live process:\n" + "\n".join(missing)
    assert all(used_by_rules.values()) and all(used_by_dashboard.values())


def test_promtool_finds_nothing_wrong_in_the_live_metrics(live):
    promtool()
    for process in (live.writer, live.gateway):
        with process.client() as client:  # a few series of each kind: requests, durations
            assert client.get("/health/ready").status_code == 200
    for process in (live.writer, live.gateway, live.worker):
        checked = run_promtool("check", "metrics", stdin=scrape(process.url))
        assert checked.returncode == 0 and not (checked.stdout + checked.stderr).strip(), (
            f"{process.name}: {checked.stdout}{checked.stderr}"
        )


def test_the_dashboard_is_valid_and_every_panel_reads_exported_metrics(live):
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {variable["name"]: variable for variable in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    datasource = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

    exported = set().union(*(exported_names(scrape(p.url)) for p in (live.writer, live.gateway, live.worker)))
    panels = dashboard["panels"]
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    problems = []
    graphs = [panel for panel in panels if panel["type"] != "row"]
    for panel in graphs:
        title = panel.get("title") or f"panel {panel['id']}"
        grid = panel["gridPos"]
        if not (0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0):
            problems.append(f"{title}: gridPos {grid} outside the 24 columns")
        if panel.get("datasource") != datasource:
            problems.append(f"{title}: datasource {panel.get('datasource')} is not the variable")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{title}: no query")
        if len({t["refId"] for t in targets}) != len(targets):
            problems.append(f"{title}: refIds repeat")
        for target in targets:
            if target.get("datasource") != datasource:
                problems.append(f"{title}: a query's datasource is not the variable")
            names = promql_metric_names(target["expr"])
            if not names:
                problems.append(f"{title}: {target['expr']!r} reads no metric")
            if names - exported:
                problems.append(f"{title}: {sorted(names - exported)} not exported")
    assert not problems, "\n".join(problems)
    # What issue 15 asks the dashboard to show.
    shown = set().union(*(promql_metric_names(expr) for expr in dashboard_expressions(dashboard)))
    for name in (
        "arkvory_download_granted_bytes_total", "arkvory_download_share_bytes_per_second",
        "arkvory_download_payload_bytes_total", "arkvory_downloads_active", "arkvory_downloads_waiting",
        "arkvory_lease_trust_remaining_seconds", "arkvory_http_requests_total",
        "arkvory_http_request_duration_seconds_bucket", "arkvory_tasks", "arkvory_storage_diagnostics",
        "arkvory_worker_active",
    ):
        assert name in shown, name


# -- the metrics added for the alerts -------------------------------------------------------------


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
@pytest.mark.slow  # waits out real lease and pin timings
def test_live_leases_equal_the_running_processes_and_the_policy_slots(live):
    writer, gateway = scrape(live.writer.url), scrape(live.gateway.url)
    assert value(writer, "arkvory_download_policy_slots") == 3
    assert value(gateway, "arkvory_download_policy_slots") == 3
    assert value(writer, "arkvory_gateway_leases_live") == 2  # writer + gateway 1 of 3 slots
    assert value(gateway, "arkvory_gateway_leases_live") is None  # the writer's view only

    second = live.cluster.gateway(2, live.shared).wait_ready()
    try:
        wait_for_value(live.writer.url, "arkvory_gateway_leases_live", lambda v: v == 3,
                       "3 live leases with every slot running")
    finally:
        second.kill()
    # Killed: its reservation runs out within 10 s (database clock), then the next refresh.
    wait_for_value(live.writer.url, "arkvory_gateway_leases_live", lambda v: v == 2,
                   "2 live leases once the killed gateway's reservation expired", timeout=25)


def test_health_status_is_one_for_ready_and_zero_for_the_others(live):
    for process in (live.writer, live.gateway):
        text = scrape(process.url)
        assert {s: value(text, "arkvory_health_status", status=s) for s in HEALTH_STATUSES} == {
            "ready": 1, "degraded": 0, "draining": 0, "unavailable": 0
        }
    assert value(scrape(live.worker.url), "arkvory_health_status") is None


def test_health_status_says_draining_while_a_stopping_process_finishes_a_download(cluster):
    # Standalone, limited locally to 256 KiB/s: 1 MiB takes about 4 s.
    writer = cluster.writer(ARKVORY_DOWNLOAD_BYTES_PER_SECOND=str(256 * 1024)).wait_ready()
    assert value(scrape(writer.url), "arkvory_download_policy_slots") == 0  # standalone
    data = bytes(range(256)) * 4096
    with writer.client() as client:
        assert client.post("/api/v1/repositories", json={"name": "drain"}).status_code == 201
        created = client.post("/api/v1/repositories/drain/artifacts", params={"name": "b.bin"}, content=data)
        assert created.status_code == 201, created.text
    path = f"/api/v1/repositories/drain/artifacts/{created.json()['id']}/content"
    received: dict[str, object] = {}

    def download() -> None:
        with writer.client(timeout=30) as client:
            answer = client.get(path)
            received["status"], received["size"] = answer.status_code, len(answer.content)

    thread = threading.Thread(target=download)
    thread.start()
    try:
        wait_for_value(writer.url, "arkvory_downloads_active", lambda v: v == 1, "the download running")
        writer.signal(signal.SIGTERM)
        text = wait_for_value(writer.url, "arkvory_health_status", lambda v: v == 1, "draining",
                              timeout=5, status="draining")
        assert value(text, "arkvory_health_status", status="ready") == 0
    finally:
        thread.join(30)
    assert received == {"status": 200, "size": len(data)}
    assert writer.wait_exit(20) == 0


def test_worker_active_is_one_on_the_active_worker_and_zero_on_a_standby(cluster):
    writer = cluster.writer().wait_ready()
    first = start_worker(cluster, "worker1", real=True).wait_active()
    second = start_worker(cluster, "worker2", real=True).wait_status("standby")
    assert value(scrape(first.url), "arkvory_worker_active") == 1
    assert value(scrape(second.url), "arkvory_worker_active") == 0
    wait_for_value(writer.url, "arkvory_worker_lock_held", lambda v: v == 1, "the lock held")

    first.kill()  # its lock connection closes with it: the standby takes over
    second.wait_active(15)
    assert value(scrape(second.url), "arkvory_worker_active") == 1
    wait_for_value(writer.url, "arkvory_worker_lock_held", lambda v: v == 1, "the lock held again")

    second.signal(signal.SIGTERM)
    assert second.wait_exit(20) == 0
    wait_for_value(writer.url, "arkvory_worker_lock_held", lambda v: v == 0,
                   "the writer seeing no worker holds the lock", timeout=15)


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
@pytest.mark.slow  # waits out real lease and pin timings
def test_read_pins_age_database_errors_and_unavailable_follow_a_stalled_database(cluster, db_proxy):
    """A standalone writer (no lease to lose, so it stays up) cut off from its database."""
    writer = cluster.writer(ARKVORY_DATABASE_URL=db_proxy.url_for(cluster.database_url)).wait_ready()
    healthy = wait_for_value(writer.url, "arkvory_database_errors_total", lambda v: v == 0,
                             "the pins loop reporting", loop="read pins")
    assert 0 <= value(healthy, "arkvory_read_pins_write_age_seconds") < 3  # written every 2 s
    db_proxy.stall()
    try:
        stalled_at = time.monotonic()
        # Past 8 s without a pin write no payload may flow: the process says unavailable.
        text = wait_for_value(writer.url, "arkvory_health_status", lambda v: v == 1, "unavailable",
                              timeout=15, status="unavailable")
        assert time.monotonic() - stalled_at >= 7.5
        assert value(text, "arkvory_read_pins_write_age_seconds") > 8
        assert value(text, "arkvory_database_errors_total", loop="read pins") >= 1
    finally:
        db_proxy.resume()
    text = wait_for_value(writer.url, "arkvory_health_status", lambda v: v == 1, "ready again",
                          timeout=15, status="ready")
    assert value(text, "arkvory_read_pins_write_age_seconds") < 3


def test_database_errors_count_each_loops_failed_attempts():
    reachability = DatabaseReachability(logging.getLogger("test.monitoring.database"))
    registry = CollectorRegistry()
    observe_database(registry, reachability)
    reachability.succeeded("read pins")
    reachability.failed("slot lease", TimeoutError())
    reachability.failed("slot lease", OSError("connection refused"))
    reachability.succeeded("slot lease")
    text = generate_latest(registry).decode()
    assert value(text, "arkvory_database_errors_total", loop="slot lease") == 2
    assert value(text, "arkvory_database_errors_total", loop="read pins") == 0
    assert reachability.reachable


def test_a_chunk_the_gate_admits_after_the_lease_ended_is_counted_each_time_and_logged_once(caplog):
    """The audit reads the lease's deadline before the gate decides: only a gate that admits
    what the lease had already ended is counted (a closed gate refuses, nothing to count)."""
    stats = HeadStats()
    faulty = types.SimpleNamespace(stats=stats, may_send_payload=lambda: False, payload_gate=lambda: True)
    with caplog.at_level(logging.CRITICAL, logger="arkvory.protocol"):
        assert HttpProtocol.admit_payload(faulty) is True
        assert HttpProtocol.admit_payload(faulty) is True
    assert stats.late_payload_chunks == 2
    assert [r.levelno for r in caplog.records] == [logging.CRITICAL]
    assert "ArkvoryPayloadAfterTrust" in caplog.records[0].getMessage()
    closed = types.SimpleNamespace(stats=HeadStats(), may_send_payload=lambda: False, payload_gate=lambda: False)
    assert HttpProtocol.admit_payload(closed) is False
    assert closed.stats.late_payload_chunks == 0
    trusted = types.SimpleNamespace(stats=HeadStats(), may_send_payload=lambda: True, payload_gate=lambda: True)
    assert HttpProtocol.admit_payload(trusted) is True
    assert trusted.stats.late_payload_chunks == 0


def test_the_audit_takes_the_lease_s_seconds_of_trust_left_as_its_verdict():
    """protocol_for hands the lease's own `trust_remaining` to the audit: 0.0 (trust over) is
    an untrusted lease, any time left a trusted one."""
    over = types.SimpleNamespace(stats=HeadStats(), may_send_payload=lambda: 0.0, payload_gate=lambda: True)
    assert HttpProtocol.admit_payload(over) is True
    assert over.stats.late_payload_chunks == 1
    left = types.SimpleNamespace(stats=HeadStats(), may_send_payload=lambda: 0.001, payload_gate=lambda: True)
    assert HttpProtocol.admit_payload(left) is True
    assert left.stats.late_payload_chunks == 0


def test_request_counts_export_what_prometheus_client_s_own_metrics_would():
    """RequestCounts keeps plain per-route records; its exposition is prometheus_client's
    Counter and Histogram for the same observations (without their `_created` series)."""
    from prometheus_client import Counter, Histogram

    from arkvory.shared.metrics import RequestCounts

    observations = [
        ("GET", "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content", 200, 0.0004),
        ("GET", "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content", 200, 0.005),
        ("GET", "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content", 404, 0.3),
        ("HEAD", "/api/v1/repositories/{repo}/artifacts/{artifact_id}/content", 200, 12.0),
        ("GET", "unmatched", 404, 0.0001),
        ("POST", "/api/v1/repositories", 201, 0.07),
    ]
    ours = CollectorRegistry()
    counts = RequestCounts()
    ours.register(counts)
    theirs = CollectorRegistry()
    requests = Counter("arkvory_http_requests", "HTTP requests by method, route template and status",
                       ["method", "route", "status"], registry=theirs)
    durations = Histogram("arkvory_http_request_duration_seconds",
                          "Time to answer an HTTP request (until the last body byte was handed over)",
                          ["method", "route"], registry=theirs)
    for method, route, status, seconds in observations:
        counts.observe(method, route, status, seconds)
        requests.labels(method, route, str(status)).inc()
        durations.labels(method, route).observe(seconds)

    def lines(registry) -> set[str]:
        return {line for line in generate_latest(registry).decode().splitlines() if "_created" not in line}

    assert lines(ours) == lines(theirs)


# -- labelled series start at 0, free space (issue 24 items 2 and 3) -----------------------------


def _literals(pattern: str, *paths: str) -> set[str]:
    found = set()
    for path in paths:
        for file in sorted(ROOT.glob(path)):
            found.update(re.findall(pattern, file.read_text()))
    return found


def test_every_label_value_the_code_counts_is_one_its_series_starts_with():
    """The labelled counters start at 0 for the values listed in shared/metrics.py and
    writer/worker/metrics.py; a value counted anywhere else would first appear at 1, and its
    first event would show no increase(). Read from the source with regular expressions over the
    literal values at the places that count (a value computed elsewhere is not seen here)."""
    from arkvory.shared import metrics
    from arkvory.writer.worker import metrics as worker_metrics

    downloads = set(metrics.TRANSFER_ABORT_REASONS["download"])
    uploads = set(metrics.TRANSFER_ABORT_REASONS["upload"])
    counted = {
        "download aborts": (
            _literals(r'transfer_aborts\.labels\(direction="download", reason="(\w+)"\)', "shared/**/*.py", "writer/**/*.py")
            | _literals(r'abort_all\("(\w+)"\)', "shared/**/*.py")
            | _literals(r'_stop_serving\([^\n]*, "(\w+)"\)', "shared/process/runtime.py"),
            downloads,
        ),
        "upload aborts": (
            _literals(r'transfer_aborts\.labels\(direction="upload", reason="(\w+)"\)', "shared/**/*.py", "writer/**/*.py")
            | _literals(r'\n    reason = "(\w+)"', "shared/http/bodies.py"),
            uploads,
        ),
        "admission failures": (_literals(r'AdmissionRejected\("(\w+)"\)', "shared/**/*.py"),
                               set(metrics.ADMISSION_FAILURE_REASONS)),
        "lease renewals": (_literals(r'\.renewal\("(\w+)"\)', "shared/cluster/lease.py"),
                           set(metrics.LEASE_RENEWAL_RESULTS)),
        "storage reads": (_literals(r'_counted\("(\w+)"\)', "shared/**/*.py"), set(metrics.STORAGE_READ_RESULTS)),
        "task outcomes": (_literals(r'(?:return|outcome =) "(\w+)"', "writer/worker/runner.py"),
                          set(worker_metrics.TASK_OUTCOMES)),
        # recovery.py counts a task moved back to running as "resumed".
        "recovered tasks": ({"resumed" if to == "running" else to
                             for to in _literals(r'return "(\w+)", "task\.', "writer/worker/recovery.py")},
                            set(worker_metrics.RECOVERED_TO)),
    }
    problems = [f"{what}: {sorted(found - known)} counted but not started at 0" for what, (found, known) in counted.items()
                if found - known]
    assert not problems, "\n".join(problems)
    empty = [what for what, (found, _) in counted.items() if not found]
    assert not empty, f"the patterns found nothing for {empty}: they no longer match the code"


def test_free_space_is_statvfs_once_per_filesystem(tmp_path):
    from arkvory.shared.storage.directory import Storage
    from arkvory.shared.storage.free_space import FreeSpace

    data = tmp_path / "data"
    (data / "tmp").mkdir(parents=True)
    (data / "uploads").mkdir()
    elsewhere = pathlib.Path(tempfile.mkdtemp(dir="/dev/shm")) if os.path.isdir("/dev/shm") else None
    try:
        apart = elsewhere is not None and os.stat(elsewhere).st_dev != os.stat(data).st_dev
        directories = [("data", data), ("tmp", data / "tmp"), ("uploads", data / "uploads"), ("gone", tmp_path / "gone")]
        if apart:
            directories.append(("cache", elsewhere))
        registry = CollectorRegistry()
        registry.register(FreeSpace(directories, 5 * 1024**3))
        before = os.statvfs(data)
        text = generate_latest(registry).decode()
        after = os.statvfs(data)
        free = {(s.labels["dir"], s.labels["path"]): s.value
                for f in text_string_to_metric_families(text) for s in f.samples if s.name == "arkvory_disk_free_bytes"}
        # One series per filesystem, named after its first directory; a missing one left out.
        assert set(free) == {("data", str(data))} | ({("cache", str(elsewhere))} if apart else set())
        low, high = sorted(s.f_bavail * s.f_frsize for s in (before, after))
        assert low <= free[("data", str(data))] <= high  # others write to this disk meanwhile
        assert value(text, "arkvory_disk_size_bytes", dir="data") == before.f_blocks * before.f_frsize
        assert value(text, "arkvory_disk_min_free_bytes") == 5 * 1024**3
    finally:
        if elsewhere is not None:
            elsewhere.rmdir()
    # Which directories a process writes: the writer its uploads, a gateway (no read cache) none.
    assert [name for name, _ in FreeSpace.of(Storage(data), True, 0).directories] == ["data", "tmp", "uploads"]
    assert FreeSpace.of(Storage(data), False, 0).directories == []
