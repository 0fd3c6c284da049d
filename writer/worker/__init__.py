"""The worker process (`arkvory worker`): runs persisted tasks (SPEC §7)."""
