"""Routes of this package (placeholder until they land)."""

from __future__ import annotations

routes: list = []
OPENAPI_PATHS: dict = {}
