"""The read-only gateway: every process's program (arkvory.shared.process.app) with writes
refused as `read_only` (app.py), and a page for a browser that looks for the console here
(console_hint.py).

May import: arkvory.shared (never its cli/). Never arkvory.writer.
"""
