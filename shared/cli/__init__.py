"""The `arkvory` command (main.py: serve, dev, admin, and the subcommands that packages
register), the local cluster of `arkvory dev` (dev.py), the operator tools that work on the
database directly (admin.py), and the embedded PostgreSQL for `arkvory dev` and the tests
(localpg.py).

May import: everything, arkvory.writer and arkvory.gateway included: the command assembles the
program. Nothing else in arkvory.shared imports it.
"""
