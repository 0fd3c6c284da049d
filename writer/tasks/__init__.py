"""Persisted tasks (SPEC §7): their store, budgets, definition, dispatch, schedule, event stream,
metrics and API. The kinds are named here (kinds.py) but never imported: the assembly hands them in.

May import: arkvory.shared (never its cli/) and the writer's basics.
"""
