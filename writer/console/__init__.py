"""The console (SPEC §6, issue 15 §1): the writer's server-rendered web UI at /console/.

Jinja2 templates (templates/) and a little hand-written script (static/: the upload progress,
a task's live events, the overview's live trust, the download lines' copy buttons) ship as
package data; there is no build step. Every page works without its script except those parts.

The console is a client of the writer's own API, called in-process (internal.py) with the
signed-in session as the bearer: the same routes check the same permissions, bounds and
idempotency keys, and their refusals are shown as messages. It reads the database directly
only for what the API does not serve (the leases, the policy, the worker's sessions, where an
artifact is used, the names in an asset's history, the label a confirmation page names a token
or key by, the blobs a verify counts against), after the API's own permission check.

    app.py         the console's Starlette program and the dispatch that sends /console/ to it
    security.py    CSRF tokens (forms and the script's API calls), the headers of every page,
                   and the guard that refuses a cookie-authorized API change without its token
    internal.py    the writer's API called in-process for one console request
    session.py     who is signed in, sign-in and sign-out, rendering and redirects
    forms.py       bounded form bodies
    overview.py    leases, policy, each process's readiness, the worker, storage diagnostics
    catalog.py     repositories, artifacts, packages, assets, downloads
    publish.py     publishing a package version, pointing an asset; their pages and its history
    downloads.py   the download URL through the gateways (ARKVORY_PUBLIC_URL) and its command lines
    confirm.py     the confirmation page before every delete, revoke, disable and cancel
    members.py     a repository's members: who may read, write or administer it
    retention.py   a repository's retention rule: the rule, its preview, save, disable, delete
    uploads.py     the upload form without its script (a multipart body, streamed)
    tasks.py       tasks: list, dispatch, cancel, a task and its events
    task_progress.py  a task's progress bar and its events as sentences
    accounts.py    accounts, personal tokens and service keys
    list_filters.py  each list page's filters and order (a GET form), handed to the API's list
    account_lifecycle.py  an administrator's password reset and account deletion pages
    password.py    your own password (the only page after an administrator's reset)
    audit.py       the audit trail, with the API's filters in a GET form
    views.py       how pages show sizes, rates and times; a repository's path; each form's idempotency key;
                   the query a pager's link keeps

May import: arkvory.shared (never its cli/) and every other package of arkvory.writer (never its
app.py, which assembles it). Never arkvory.gateway.
"""
