"""Prometheus metrics of the worker process (SPEC §8, issue 8 item 9), against a registry the
caller owns (a fresh `CollectorRegistry()` per test).

The task kinds increment the cleanup and verify metrics through `ctx.metrics`; the worker
itself counts tasks by kind and outcome, their durations, and whether it is the active worker.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from arkvory.shared.cluster.supervision import observe_database

# Tasks run from minutes to hours: the default buckets (up to 10 s) would lump them together.
_DURATION_BUCKETS = (0.1, 0.5, 1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)

# The label values each labelled series starts with, at 0 (issue 24 item 2): a series that first
# appears at 1 shows no `increase()`, so the first failed task would fire no alert.
# (runner.py's outcomes, recovery.py's moves, verify's problems.)
TASK_OUTCOMES = ("completed", "failed", "budget_exceeded", "cancelled", "interrupted", "gone")
RECOVERED_TO = ("queued", "resumed", "failed", "cancelled")
DIAGNOSTIC_PROBLEMS = ("missing", "corrupt")


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, kinds: Iterable[str] = ()) -> None:
        """`kinds`: the task kinds this worker runs, whose series start at 0."""
        self.registry = registry
        # -- incremented by the task kinds (writer/maintenance) --
        self.cleanup_reclaimed_bytes = Counter(
            "arkvory_cleanup_reclaimed_bytes",
            "Bytes of unreferenced blobs the cleanup task deleted",
            registry=registry,
        )
        self.cleanup_deleted_blobs = Counter(
            "arkvory_cleanup_deleted_blobs",
            "Unreferenced blobs the cleanup task deleted",
            registry=registry,
        )
        self.cleanup_aborted_uploads = Counter(
            "arkvory_cleanup_aborted_multipart_uploads",
            "Incomplete multipart uploads of the object store that the cleanup task aborted",
            registry=registry,
        )
        self.cleanup_retention_deleted_artifacts = Counter(
            "arkvory_cleanup_retention_deleted_artifacts",
            "Artifacts the cleanup task deleted because their repository's retention rule no longer keeps them",
            registry=registry,
        )
        self.verify_hashed_bytes = Counter(
            "arkvory_verify_hashed_bytes",
            "Bytes of stored blobs the verify task re-hashed",
            registry=registry,
        )
        self.storage_diagnostics = Gauge(
            "arkvory_storage_diagnostics",
            "Stored blobs the last verify in this worker found wrong, by problem (missing, corrupt);"
            " 0 before its first",
            ["problem"],
            registry=registry,
        )
        # -- kept by the worker --
        self.tasks = Counter(
            "arkvory_worker_tasks",
            "Tasks this worker ran to an end, by kind and outcome "
            "(completed, failed, budget_exceeded, cancelled; interrupted: stopped by SIGTERM or a lost "
            "lock and left for restart recovery; gone: taken over or ended by someone else)",
            ["kind", "outcome"],
            registry=registry,
        )
        self.task_duration = Histogram(
            "arkvory_worker_task_duration_seconds",
            "Time from claiming a task to its end in this worker, by kind",
            ["kind"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.tasks_running = Gauge(
            "arkvory_worker_tasks_running", "Tasks this worker is running now", registry=registry
        )
        self.recovered = Counter(
            "arkvory_worker_recovered_tasks",
            "Unfinished tasks found on becoming active, by the status they were moved to",
            ["to"],
            registry=registry,
        )
        self.active = Gauge(
            "arkvory_worker_active",
            "1 while this worker holds the worker lock and runs tasks, 0 in standby",
            registry=registry,
        )
        self.locks_lost = Counter(
            "arkvory_worker_locks_lost",
            "Times this worker lost its lock connection while active",
            registry=registry,
        )
        observe_database(registry)  # the worker lock's loop reports there
        for kind in kinds:
            for outcome in TASK_OUTCOMES:
                self.tasks.labels(kind=kind, outcome=outcome)
            self.task_duration.labels(kind=kind)
        for to in RECOVERED_TO:
            self.recovered.labels(to=to)
        # 0 until this worker's first verify (every serving process exports the database's count).
        for problem in DIAGNOSTIC_PROBLEMS:
            self.storage_diagnostics.labels(problem=problem)
