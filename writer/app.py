"""The writer: the shared program plus every route that changes something."""

from __future__ import annotations

import functools

from starlette.applications import Starlette
from starlette.middleware import Middleware

from arkvory.shared.cluster.supervision import DATABASE
from arkvory.shared.http.edge import RequestGuard
from arkvory.shared.process.app import build_app
from arkvory.shared.process.runtime import Runtime

from .identity import account_lifecycle, accounts, service_keys, tokens
from .catalog import artifacts, assets, packages, permissions, repositories
from .catalog import retention
from . import openapi
from .uploads import one_shot as upload_one_shot, routes as uploads
from .uploads.body_memory import keep_body_buffers
from .console import app as console
from .console.security import CookieCsrfGuard
from .idempotency import InFlightKeys, RecordedResults
from .request_inputs import with_declared_query
from .audit import listing as audit_listing
from .audit.refusals import AuditRefusals, RefusalRecorder
from .blobs import diagnostics
from .maintenance.kinds import KINDS
from .tasks import api as tasks
from .tasks import schedule as task_schedule, stream as task_stream
from .tasks.metrics import TaskMetrics
from .tasks.schedule import Schedule
from .tasks.stream import TaskEventHub
from .uploads.places import UploadPlaces

# Every writer module with routes: its `routes` are served and its `OPENAPI_PATHS` documented.
ROUTE_MODULES = (
    repositories, packages, assets, artifacts, accounts, tokens, service_keys, permissions, upload_one_shot, uploads,
    tasks, diagnostics, audit_listing, openapi, account_lifecycle,
    retention,
)


def build_writer_app(runtime: Runtime) -> Starlette:
    if runtime.settings.object_store is not None:
        # Uploads arrive here: their body pieces stay on the heap (body_memory.py). Measured a
        # gain for uploads published to an object store only; a directory's were as fast or
        # slower with it (bench/upload.py, docs/performance.md issue 16 round 3).
        keep_body_buffers()
    document = openapi.build_document(ROUTE_MODULES)
    app = build_app(
        runtime,
        # Each route refuses a query parameter its operation in the document does not declare.
        routes=with_declared_query([route for module in ROUTE_MODULES for route in module.routes], document),
        # The console (writer/console/) is a program of its own beside the API's routes; a
        # change to the API authorized by its session cookie needs the console's CSRF token.
        # Refused changes worth an audit entry are recorded after their answer (writer/audit/refusals.py).
        middleware=[
            Middleware(RequestGuard), Middleware(CookieCsrfGuard), Middleware(AuditRefusals),
            Middleware(console.ConsoleDispatch),
        ],
    )
    app.state.upload_places = UploadPlaces(
        runtime.settings.max_uploads, runtime.settings.max_uploads_per_principal
    )
    app.state.idempotency_keys = InFlightKeys()
    app.state.idempotency_results = RecordedResults()
    app.state.audit_refusals = RefusalRecorder(runtime.registry)
    app.state.openapi_json = openapi.document_json(document)
    app.state.task_kinds = KINDS  # what the task API may dispatch (writer/tasks/kinds.py)
    _add_task_loops(app, runtime)
    console.install(app)
    return app


def _add_task_loops(app: Starlette, runtime: Runtime) -> None:
    """The writer's task machinery: the one LISTEN that feeds every event stream, the schedule
    (cleanup, verify) and the task metrics; supervised with the runtime's other loops."""
    hub = TaskEventHub(runtime.settings.database_url, lambda: runtime.draining)
    app.state.task_events = hub
    metrics = TaskMetrics(runtime.registry, hub)
    runtime.extra_loops += [
        ("task event listener", hub.run),
        ("task schedule", Schedule(runtime, KINDS).run),
        ("task metrics", functools.partial(metrics.run, lambda: runtime.pool)),
    ]
    # Their error counts exist from the start, as 0 (arkvory_database_errors_total{loop}).
    DATABASE.expect(task_stream.LOOP, task_schedule.LOOP)  # (the task metrics' loop says so itself)
