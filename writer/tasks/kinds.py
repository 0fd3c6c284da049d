"""The task kinds the worker can run, by name (SPEC §7). See writer/tasks/context.py."""

from __future__ import annotations

from types import ModuleType

from arkvory.writer.maintenance import cleanup, verify

KINDS: dict[str, ModuleType] = {"cleanup": cleanup, "verify": verify}
