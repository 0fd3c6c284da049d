"""The task kinds by name (SPEC §7), and what the task machinery needs of one.

The kinds live with what they do (writer/maintenance/kinds.py maps these names to their
modules); the machinery here reaches them only through the map the assembly hands it
(`app.state.task_kinds`, `Schedule(..., kinds)`), so it never imports what it runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class TaskKind(Protocol):
    """A kind's module, as the API and the schedule use it (the worker uses more: context.py)."""

    def validate_params(self, params: dict[str, Any]) -> dict[str, Any]: ...


Kinds = Mapping[str, TaskKind]

KIND_NAMES = ("cleanup", "verify")
