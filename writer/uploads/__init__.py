"""How bytes come in (SPEC §6): the one-shot POST, resumable upload sessions, and publishing
their verified bytes as a blob and an artifact.

    routes.py          upload sessions: create, parts, complete, show, delete, expiry
    routes_openapi.py  their OpenAPI fragment
    one_shot.py        POST .../artifacts with the raw body
    publishing.py      received bytes -> staged -> published under their digest, with the artifact
    sessions.py        a session's file, its parts and hash on disk and in this process
    store.py           receiving bodies into files in batches, off the event loop
    places.py          upload places (ARKVORY_MAX_UPLOADS, and one principal's share)
    reservations.py    the disk open sessions reserve, and one principal's share
    body_memory.py     keeping received body memory mapped (glibc)

May import: arkvory.shared (never its cli/), the writer's basics, catalog/ (the artifact a
publication makes) and blobs/ (the digest claims a publication takes).
"""
