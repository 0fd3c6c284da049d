"""The HTTP edge every process shares: our uvicorn protocol (protocol.py: bounded request heads,
the connection handle that streams payload), request ids, error answers and the request guard
(edge.py), request bodies bounded in size, depth and time (bodies.py), byte ranges and
conditional requests (ranges.py), media types (media_types.py) and the client's believed address
(client_address.py).

May import: the basics (settings, errors, logs, metrics, db). Not storage/ or cluster/, which
stand beside it, nor anything above.
"""
