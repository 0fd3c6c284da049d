"""What every Arkvory server process runs: the writer, the read gateways and the task worker.

The basics, which every package here may import:
    settings.py    the one Settings object, built from the environment
    errors.py      the error tree, each error with its HTTP status and code
    logs.py        logging set-up
    metrics.py     the process's Prometheus metrics
    db.py          the request pool, dedicated connections, the migrations/ and their runner

The packages, from the bottom up. Each imports only from itself, the basics and the packages
on the lines above it; http, storage and cluster stand side by side and never import each other.
tests/test_layout.py holds these rules.
    http/          the HTTP edge: our server and protocol (on httptools' parser), request ids
                   and error answers, bodies, ranges, media types, the client's address
    storage/       where blobs live: the storage directory or an object store (with its local read
                   cache), reused blob descriptors, upload files
    cluster/       coordination between processes through the database: the slot lease, the
                   download policy, the control connection, read pins, supervised loops
    auth/          who is asking: keys-file tokens and database credentials
    download/      the content routes: lookup, admission, the token buckets, streaming the bytes
    process/       one running process: the runtime (the composition root that assembles the
                   parts above), the Starlette program, the server, the health routes
    cli/           the `arkvory` command (serve, dev, admin) and the embedded PostgreSQL: the one
                   place in arkvory.shared that may import arkvory.writer and arkvory.gateway

client/ is the public client library (`from arkvory import Client`): it imports nothing of the
server, and of the server only the command line imports it.
"""
