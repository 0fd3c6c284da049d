"""The Arkvory client library (SPEC §10): resumable, verified downloads; uploads that are safe
to retry and re-run; retries by the table of SPEC §6.

    from arkvory.shared.client import Client, RetryPolicy, DownloadResult, errors
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors
    from .api import Client
    from .download import DownloadResult
    from .retries import RetryPolicy

__all__ = ["Client", "DownloadResult", "RetryPolicy", "errors"]

# Loaded on first use (PEP 562), not with the package: shared/cli/main.py imports this package's
# `commands` to register get/put/ls/stat/rm, and `arkvory serve` must not load httpx and tenacity.
_EXPORTS = {"Client": "api", "DownloadResult": "download", "RetryPolicy": "retries", "errors": None}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name] or name}", __name__)
    value = module if _EXPORTS[name] is None else getattr(module, name)
    globals()[name] = value
    return value
