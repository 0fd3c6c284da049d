"""The Arkvory client library (SPEC §10): resumable, verified downloads; uploads that are safe
to retry and re-run; retries by the table of SPEC §6.

    from shared.client import Client, RetryPolicy, DownloadResult, errors
"""

from . import errors
from .api import Client
from .download import DownloadResult
from .retries import RetryPolicy

__all__ = ["Client", "DownloadResult", "RetryPolicy", "errors"]
