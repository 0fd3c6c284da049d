"""The content routes every process serves (SPEC §6) and the streaming of blob bytes behind them:
catalog lookups and their cache, download admission, the token buckets, and the routes and
transfers themselves.

May import: the basics, http/, storage/, cluster/ and auth/. Never process/ or cli/: what serving
needs of its process is the narrow protocol in serving.py, which the runtime satisfies.
"""
