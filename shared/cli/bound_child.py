"""A child server process that dies with ours: started from a thread that lives exactly as long
as the child, with Linux's PR_SET_PDEATHSIG, its output in a log file, in a session of its own;
stopped by signals in steps, each with its grace, SIGKILL last. The local PostgreSQL
(localpg.py) and SeaweedFS (seaweedfs.py) run this way, so a killed `arkvory dev` or test run
leaves no server behind, and each says only which signals stop it how.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import contextlib
import pathlib
import threading
from collections.abc import Callable, Sequence

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


def spawn_server(
    argv: list[str], log_path: pathlib.Path, *, death_signal: signal.Signals, name: str, **popen_kwargs
) -> subprocess.Popen:
    """A server child bound to our process (`spawn_bound_to_our_process`), its stdout and stderr
    appended to `log_path`, no stdin, and in a session of its own: a terminal's Ctrl-C reaches
    us, and we stop our children in order instead of all of them at once."""
    with open(log_path, "ab") as log:
        return spawn_bound_to_our_process(
            argv, death_signal=death_signal, name=name,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            **popen_kwargs,
        )


def end_in_steps(
    process: subprocess.Popen, steps: Sequence[tuple[signal.Signals, float]], *, kill_wait: float = 5.0
) -> None:
    """Send each step's signal and wait up to its grace for the process to exit; then SIGKILL
    and wait `kill_wait`. Returns once it is gone (at once if it was); a process that outlives
    SIGKILL raises subprocess.TimeoutExpired."""
    for sig, grace in steps:
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)  # a no-op once the process has been reaped
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
            return
    if process.poll() is None:
        process.kill()
    process.wait(timeout=kill_wait)


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
