"""Arkvory, a self-hosted artifact server, and its client library.

    from arkvory import Client, RetryPolicy, DownloadResult, errors

Installed as one package from the folders of this repository: `arkvory.shared` is what every
server process runs, `arkvory.writer` what only the writer does, `arkvory.gateway` the read-only
assembly, and `arkvory.shared.client` the client library whose public names this package hands
on. They are loaded on first use (PEP 562): a server process that imports
`arkvory.shared.settings` loads this file, but never the client's httpx, tenacity or tqdm.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from arkvory.shared.client import Client, DownloadResult, RetryPolicy, errors

__all__ = ["Client", "DownloadResult", "RetryPolicy", "errors"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module("arkvory.shared.client"), name)
    globals()[name] = value
    return value
