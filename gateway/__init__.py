"""The read-only gateway: every process's program (arkvory.shared.process.app) with writes
refused as `read_only`.

May import: arkvory.shared (never its cli/). Never arkvory.writer.
"""
