"""The content routes every process serves (SPEC §6) and the streaming of blob bytes behind them:
catalog lookups and their cache (catalog.py, catalog_cache.py), the three routes and their fast
path (content.py), the transfer of one download's bytes (transfer.py) through its admission place
(admission.py) and the token buckets (throttle.py), its body written to the connection
(payload.py).

May import: the basics, http/, storage/, cluster/ and auth/. Never process/ or cli/: what serving
needs of its process is the narrow protocol in serving.py, which the runtime satisfies.
"""
