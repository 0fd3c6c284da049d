"""The `arkvory` command (main.py: serve, dev, admin, and the subcommands that other modules
register), the local cluster of `arkvory dev` (dev.py), the operator tools that work on the
database directly (admin.py, and `admin init`, the writer's first start without a server) or run a task kind with every server stopped (offline.py: admin gc
and scrub), the move of every blob to another storage (migrate_storage.py: admin
migrate-storage), and the local PostgreSQL for `arkvory dev` and the tests: localpg.py runs a server
from the binaries that postgres_binaries.py finds (and seaweedfs.py the object store; both as
children that die with us, bound_child.py).

May import: everything, arkvory.writer and arkvory.gateway included: the command assembles the
program. Nothing else in arkvory imports it.
"""

# `arkvory dev`'s state directory, a default of several commands' options. Here rather than in
# dev.py so that building the command line imports no dev.py (asyncio, subprocess, urllib:
# ~130 M instructions, a fifth of an `arkvory get`'s start; bench/README.md, issue 14 §3).
DEFAULT_DEV_DIR = ".arkvory-dev"
