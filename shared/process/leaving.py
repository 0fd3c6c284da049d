"""How a process ends once obstore is loaded: every exit handler runs, then `os._exit`, never
the interpreter's teardown.

obstore runs each request on a tokio thread that hands the result to the event loop by calling
into Python (pyo3-async-runtimes' `set_result` -> `loop.call_soon_threadsafe`). That thread
releases the GIL while it sends the loop's wake-up byte and takes it back afterwards. If the
main thread has finished in between and the interpreter is finalizing, Python (< 3.14) ends a
thread that asks for the GIL with `pthread_exit`, and the unwinding through Rust frames aborts
the whole process: a command that did everything right, and said so, exits with SIGABRT and no
message (16 of 60 runs of a short S3 command on a CI-like host; `admin migrate-storage` failed a
CI run so). systemd would count every such stop as a crash.

So the last exit handler (registered first, by cli/main.py, before anything else can register
one) ends the process with `os._exit` and the status the command chose, once every Python
thread has been joined and every other exit handler has run: only the teardown of the
interpreter's objects is skipped, and the kernel frees what it would have. A process without
obstore, or one leaving through an uncaught exception, ends the ordinary way.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

_status: int | None = None  # what exit() was given; None: leave the ending to Python


def install() -> None:
    """Register the handler that ends the process; once, before any other exit handler."""
    atexit.register(_end_without_teardown)


def exit(status: int | None) -> NoReturn:
    """sys.exit(status), remembering the status for the last exit handler."""
    global _status
    _status = status or 0
    sys.exit(_status)


def _end_without_teardown() -> None:
    if _status is None or "obstore" not in sys.modules:
        return
    # logging registers its own exit handler when it is imported; if that came before ours,
    # it would run after us, so flush and close the handlers here (a second call is harmless).
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(_status)
