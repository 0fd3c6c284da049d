"""The HTTP edge every process shares, on public interfaces only (httptools' parser callbacks,
asyncio's Protocol and Transport, ASGI 3):
    server.py       listens (plain TCP or TLS), keeps the `date` header, stops in order
    protocol.py     one connection: bounded request heads, keep-alive, pipelining, lingering close
    exchange.py     one request and its response as the ASGI app sees them
    handle.py       the connection handle that writes payload past `send` (sendfile, splice)
    refusals.py     the edge's own answers (400, 431, 500), JSON with a request id
and above them request ids and error answers and the request guard (edge.py), which also
refuses Basic credentials a browser added to another site's request (basic_from_browsers.py),
request bodies bounded in size, depth and time (bodies.py), byte ranges and conditional
requests (ranges.py), media types (media_types.py), the client's believed address
(client_address.py) and the query parameters a route declares (query.py).

May import: the basics (settings, errors, logs, metrics, db). Not storage/ or cluster/, which
stand beside it, nor anything above.
"""
