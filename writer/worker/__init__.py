"""The worker process (`arkvory worker`): runs persisted tasks (SPEC §7); and offline.py, a kind
run by an admin tool (`admin gc`, `scrub`) with the locks that prove every server is down.

May import: arkvory.shared (never its cli/), the writer's basics, tasks/ and maintenance/.
"""
