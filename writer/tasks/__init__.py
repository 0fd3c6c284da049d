"""Persisted tasks (SPEC §7): their store, kinds, budgets, schedule, event stream and API."""
