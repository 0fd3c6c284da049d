"""The Arkvory client library (SPEC §10)."""
