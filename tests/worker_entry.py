"""`arkvory worker` (and every other `arkvory` command) with the test kinds registered too, and
two test-only fault points a test may set in the worker's environment:

- TEST_WORKER_KILL_AT=`module:attr[.attr]:before|after:N` SIGKILLs the process on the N-th call
  of that function or method, just before it runs or just after it returned: a crash at a known
  point of a real kind's work (e.g. right after a cleanup batch committed), however slow the
  machine.
- TEST_WORKER_CALLS_LOG=`module:attr[.attr]=PATH` appends a line to PATH for every call, with
  the length of its first argument (or 1): what a kind really did, across runs and crashes.
"""

import functools
import importlib
import inspect
import os
import signal

from arkvory.shared.cli.main import main
from arkvory.writer.maintenance.kinds import KINDS
from tests import worker_kinds

KINDS.setdefault("steps", worker_kinds)
KINDS.setdefault("steps_b", worker_kinds)


def _wrap(target: str, around) -> None:
    """Replace `module:attr.path` with `around(original)`."""
    module_name, _, path = target.partition(":")
    owner = importlib.import_module(module_name)
    *parents, name = path.split(".")
    for parent in parents:
        owner = getattr(owner, parent)
    original = getattr(owner, name)
    setattr(owner, name, around(original))


def _calling(original, before, after):
    """`original` with `before(args)` and `after()` around each call, sync or async alike."""
    if inspect.iscoroutinefunction(original):
        @functools.wraps(original)
        async def wrapper(*args, **kwargs):
            before(args)
            result = await original(*args, **kwargs)
            after()
            return result
    else:
        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            before(args)
            result = original(*args, **kwargs)
            after()
            return result
    return wrapper


def _kill_at(spec: str) -> None:
    target, when, nth = spec.rsplit(":", 2)
    calls = [0]

    def before(args) -> None:
        calls[0] += 1
        if when == "before" and calls[0] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)

    def after() -> None:
        if when == "after" and calls[0] == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)

    _wrap(target, lambda original: _calling(original, before, after))


def _log_calls(spec: str) -> None:
    target, _, path = spec.partition("=")

    def before(args) -> None:
        first = args[0] if args else None
        count = len(first) if isinstance(first, (list, tuple)) else 1
        with open(path, "a") as log:
            log.write(f"{count}\n")

    _wrap(target, lambda original: _calling(original, before, lambda: None))


if os.environ.get("TEST_WORKER_KILL_AT"):
    _kill_at(os.environ["TEST_WORKER_KILL_AT"])
if os.environ.get("TEST_WORKER_CALLS_LOG"):
    _log_calls(os.environ["TEST_WORKER_CALLS_LOG"])

if __name__ == "__main__":
    main()
