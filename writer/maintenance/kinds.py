"""The task kinds the worker runs, by name (SPEC §7): the map the assembly hands to the task
machinery (writer/app.py's API and schedule, the worker, the offline tools), which names them
(writer/tasks/kinds.py) but never imports them. See writer/tasks/context.py for what a kind is."""

from __future__ import annotations

from arkvory.writer.tasks.kinds import Kinds

from . import cleanup, verify

# The same names, in the same order, as KIND_NAMES (tests/test_layout.py holds them equal).
KINDS: Kinds = {"cleanup": cleanup, "verify": verify}
