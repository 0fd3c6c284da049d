"""One running Arkvory process: runtime.py is the composition root (it starts and owns the
database pool, the control connection, the lease, pins, caches, storage and the buckets, and
wires them together), app.py the Starlette program every process runs, server.py the process
through start-up, listening (shared/http/server.py), drain and stop, health.py the health routes, systemd.py what the process
tells systemd (READY, STATUS, STOPPING and the watchdog pings from the serving loop), leaving.py how the
process ends once obstore is loaded (every exit handler, then os._exit: no teardown for obstore's
threads to abort in).

May import: the basics and every package below it (http/, storage/, cluster/, auth/, download/).
Never cli/, arkvory.writer or arkvory.gateway: they assemble a process from these parts.
"""
