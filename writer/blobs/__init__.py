"""What the writer records about its stored blobs, which uploads, cleanup and verify share.

    locks.py        digest claims and removal marks: no blob is removed under an upload
    quarantine.py   moving a corrupt blob aside and telling every process
    diagnostics.py  what verify found (missing, corrupt), and its route

May import: arkvory.shared (never its cli/), the writer's basics and tasks/ (a quarantine ends
with the verify task that made it).
"""
