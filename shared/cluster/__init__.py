"""Coordination between the processes of one installation, through their shared database: the
slot lease (lease.py) and the saved download policy (policy.py), the control connection that
holds the writer or maintenance lock and LISTENs (control.py), read pins that keep cleanup off
blobs being served (pins.py), the registry of transfers a lost lease cuts (transfers.py), caches
that a NOTIFY keeps honest (notified_cache.py), the supervision of these background loops
and of the database's reachability (supervision.py), and whether the database's standbys are
synchronous, so that a failover keeps every lease renewal (replication.py).

May import: the basics (settings, errors, logs, metrics, db). Not http/ or storage/, which stand
beside it, nor anything above: what listens on the control connection is registered with it by
the composition root (process/runtime.py), never imported here.
"""
