"""The writer keeps the memory of received body pieces on glibc's heap (writer/uploads/body_memory.py):
pieces of a few hundred KiB are not mmapped one by one, and freed ones stay mapped for the next,
instead of being faulted in and zeroed again for every piece of an upload."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only (mallinfo2, mallopt)"),
]

# In a fresh interpreter: how many blocks a 600 KiB piece mmaps, and how much freed heap top
# (mallinfo2's keepcost) stays mapped after 24 pieces of 800 KiB are freed.
PROBE = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "tuned":
    from arkvory.writer.uploads.body_memory import keep_body_buffers
    assert keep_body_buffers()
before = libc.mallinfo2().hblks
piece = b"x" * (600 * 1024)
mmapped = libc.mallinfo2().hblks - before
del piece
pieces = [b"y" * (800 * 1024) for _ in range(24)]
del pieces
print(mmapped, libc.mallinfo2().keepcost)
"""


def probe(mode: str) -> tuple[int, int]:
    run = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    mmapped, kept = run.stdout.split()
    return int(mmapped), int(kept)


def test_body_pieces_come_from_the_heap_and_stay_mapped_once_freed():
    plain_mmapped, plain_kept = probe("plain")
    tuned_mmapped, tuned_kept = probe("tuned")
    assert plain_mmapped == 1  # glibc's default: a piece of this size is an mmap of its own
    assert tuned_mmapped == 0
    assert plain_kept < 4 * 1024 * 1024
    assert tuned_kept >= 16 * 1024 * 1024
