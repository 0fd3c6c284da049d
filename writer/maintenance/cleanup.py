"""The `cleanup` task kind (placeholder until its implementation lands)."""

from __future__ import annotations

from typing import Any

from shared.errors import InvalidInput


def validate_params(params: Any) -> dict:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInput("params must be an object")
    return params


async def run(ctx) -> dict:
    raise NotImplementedError("cleanup is not implemented yet")
