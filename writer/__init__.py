"""What only the writer does, grouped by concern; app.py assembles it into the writer's program.

The basics, which every package here may import:
    idempotency.py     Idempotency-Key: held keys, recorded results, replays
    openapi.py         the OpenAPI document and the fragments routes share
    pagination.py      limit, cursor, order and filters of every list, and the page's SELECT
    request_inputs.py  what every route reads of its request: runtime, principal, JSON body, the
                       query parameters its OpenAPI operation declares (any other is 400)
    audit/             the audit trail: every change recorded with who, what, when, from where

The packages, from the bottom up. Each imports only from itself, the basics and the packages on
the lines above it; packages on one line never import each other. tests/test_layout.py holds
these rules.
    identity/     accounts, sign-in and its limits, sessions, tokens, service keys
    tasks/        persisted tasks (SPEC §7): store, budgets, dispatch, schedule, events, API
    catalog/      repositories, artifacts, packages, assets, permissions
    blobs/        digest claims and removal marks, quarantine, storage diagnostics
    uploads/      the one-shot POST, upload sessions, publishing a blob
    maintenance/  the cleanup and verify task kinds
    worker/       the worker process (`arkvory worker`), and a kind run by an admin tool
    console/      the web UI, a client of the routes above

May import: arkvory.shared (never its cli/, which assembles the writer). Never arkvory.gateway.
"""
