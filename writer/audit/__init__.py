"""The audit trail (issue 25 item 11): who changed what, when, from which address, with which
credential, and how it ended; kept for ARKVORY_AUDIT_RETENTION, never holding a secret.

A basic of the writer (writer/__init__.py): idempotency.py records every change it runs here,
in the change's own transaction, and the change routes that do not go through it (sign-in and
sign-out, accounts, credentials made, upload completion, task dispatch) record theirs the same
way; so does an admin tool that changes the database, as itself.

    trail.py      an entry and its INSERT; who acted (a principal, or an admin tool) and from where
    actions.py    the writer's change routes, the action each records, its target and details
    summary.py    a change's parameters as an entry keeps them: bounded, without a secret
    refusals.py   refused changes worth an entry (failed sign-ins, permission refusals), bounded
    filters.py    the list's filters, read from a query
    listing.py    GET /api/v1/audit (administrators), its OpenAPI fragment
    retention.py  pruning the entries past ARKVORY_AUDIT_RETENTION (the worker's cleanup)

May import: arkvory.shared (never its cli/) and the writer's other basics except idempotency.py
(which imports this package).
"""
