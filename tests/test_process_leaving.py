"""A process that used obstore ends with the status it chose, never SIGABRT in the interpreter's
teardown (shared/process/leaving.py).

The race, made certain rather than waited for: the loop's wake-up, sent by obstore's tokio
thread, holds that thread in Python until the interpreter is finalizing (an object in
`__main__` whose finalizer lets it go); the thread then asks for the GIL, and Python < 3.14
ends it with pthread_exit, which aborts through obstore's Rust frames. The control run, with no
handler, shows that the race is real on this Python; the run through `leaving` ends with 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from .harness import ROOT

SCRIPT = textwrap.dedent("""
    import asyncio, gc, sys, threading, time

    from arkvory.shared.process import leaving

    if sys.argv[1] == "leaving":
        leaving.install()

    import obstore
    from obstore.store import MemoryStore

    finalizing = threading.Event()


    class HeldWakeUp(asyncio.SelectorEventLoop):
        def _write_to_self(self):
            super()._write_to_self()
            if threading.current_thread() is not threading.main_thread():
                finalizing.wait()  # obstore's thread stays in Python until the teardown


    # Garbage in a cycle, with the collector off: only the teardown's collection, once the
    # interpreter is finalizing, runs its finalizer.
    class LetsGoInTeardown:
        # What it calls is bound now: the teardown may have set the module's names to None.
        def __del__(self, let_go=finalizing.set, sleep=time.sleep):
            let_go()
            sleep(1.0)  # the GIL released: the thread asks for it now


    gc.disable()
    cycle = LetsGoInTeardown()
    cycle.itself = cycle
    del cycle


    async def main():
        store = MemoryStore()
        await obstore.put_async(store, "blob", b"bytes")
        result = await obstore.get_async(store, "blob")
        return bytes(await result.bytes_async())


    loop = HeldWakeUp()
    try:
        print(loop.run_until_complete(main()).decode(), flush=True)
    finally:
        loop.close()
    if sys.argv[1] == "leaving":
        leaving.exit(3)
    sys.exit(3)
""")


def run(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="Python 3.14 holds such a thread instead of ending it")
def test_without_leaving_the_teardown_aborts_the_process():
    control = run("plain")
    assert control.stdout == "bytes\n"
    # Should a release of obstore (or of its pyo3) stop aborting here, this fails on purpose:
    # leaving.py may then be unneeded, and the premise of the test below is gone.
    assert control.returncode == -signal.SIGABRT, (
        f"the control ended with {control.returncode}, not SIGABRT: {control.stderr}")


def test_through_leaving_the_process_ends_with_its_status_and_its_output():
    ended = run("leaving")
    assert (ended.returncode, ended.stdout) == (3, "bytes\n"), ended.stderr


WIRING = textwrap.dedent("""
    import gc, os, sys

    if sys.argv[1] == "with-obstore":
        import obstore  # noqa: F401

    from arkvory.shared.cli.main import main


    # A finalizer that only the interpreter's teardown runs (garbage in a cycle, no collector).
    class Teardown:
        def __del__(self, write=os.write):
            write(2, b"teardown ran\\n")


    gc.disable()
    cycle = Teardown()
    cycle.itself = cycle
    del cycle
    main(["admin", "new-key", "--id", "ci", "--scope", "read:*"])
""")


@pytest.mark.parametrize("mode", ["with-obstore", "without"])
def test_the_arkvory_command_skips_the_teardown_exactly_when_obstore_is_loaded(mode):
    ended = subprocess.run([sys.executable, "-c", WIRING, mode], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert ended.returncode == 0, ended.stderr
    assert ended.stdout.startswith("[[key]]\nid = \"ci\"")  # flushed before os._exit
    assert ("teardown ran" in ended.stderr) == (mode == "without"), ended.stderr
