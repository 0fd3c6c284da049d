"""A child server process that dies with ours: started from a thread that lives exactly as long
as the child, with Linux's PR_SET_PDEATHSIG. The local PostgreSQL (localpg.py) and SeaweedFS
(seaweedfs.py) are started this way, so a killed `arkvory dev` or test run leaves no server behind.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def spawn_bound_to_our_process(
    argv: list[str], *, death_signal: signal.Signals, name: str, **popen_kwargs
) -> subprocess.Popen:
    """`subprocess.Popen(argv, **popen_kwargs)` whose child gets `death_signal` when we die.

    The death signal fires when the *thread* that forked the child ends, not the process. A
    caller's worker thread may retire long before the server should stop (anyio's idle after
    10 s); the thread started here (`name`) ends only when the child exits or our whole process
    dies. An error of Popen is raised here, in the caller's thread.
    """
    spawned: queue.Queue[subprocess.Popen | BaseException] = queue.Queue(maxsize=1)

    def keep() -> None:
        try:
            process = subprocess.Popen(argv, preexec_fn=die_with_parent_hook(death_signal), **popen_kwargs)
        except BaseException as exc:  # handed to the caller, who re-raises it
            spawned.put(exc)
            return
        spawned.put(process)
        process.wait()

    threading.Thread(target=keep, name=name, daemon=True).start()
    result = spawned.get(timeout=60)
    if isinstance(result, BaseException):
        raise result
    return result


def die_with_parent_hook(death_signal: signal.Signals) -> Callable[[], None] | None:
    """A `preexec_fn` that has the child get `death_signal` when its parent dies (the thread
    that forked it, strictly: see spawn_bound_to_our_process); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    # Resolved before fork: between fork and exec the child should only make the call.
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def die_with_parent() -> None:
        # Runs after a switch to another user (Popen's `user=`), which clears the death signal.
        prctl(_PR_SET_PDEATHSIG, int(death_signal))
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return die_with_parent
