"""What only the writer does: the catalog API (repositories, artifacts, packages, assets,
permissions), uploads, accounts and tokens, idempotent changes, the OpenAPI document, and the
persisted tasks (tasks/), the worker process that runs them (worker/) and storage maintenance
(maintenance/).

May import: arkvory.shared (never its cli/, which assembles the writer). Never arkvory.gateway.
"""
