"""Keeping the memory of received bodies mapped between chunks (glibc's malloc).

uvloop and httptools hand each received piece of a request body (~64–256 KiB) to Python in a
fresh `bytes`, freed as soon as the upload has copied it into its own buffer (store.py).
glibc's defaults give such a size back to the kernel at once: above its mmap threshold each
one is an mmap/munmap, below it the free top of the heap is trimmed (`brk`) past 2 × that
threshold. Either way the next piece faults its pages in and zeroes them again: ~0.6 CPU s per
GiB received on the writer's host, a fifth of its CPU for an upload (docs/performance.md,
issue 16). Fixed thresholds keep such pieces on the heap and its free top mapped, at the price
of up to `TRIM_THRESHOLD` of freed heap kept by the process.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import platform

log = logging.getLogger("arkvory.writer")

# glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 1024 * 1024  # a body piece is at most a few hundred KiB: always from the heap
TRIM_THRESHOLD = 32 * 1024 * 1024  # freed heap kept mapped before any is given back


def keep_body_buffers() -> bool:
    """Set the thresholds in this process; False where the C library is not glibc (nothing to
    tune, or no `mallopt`)."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    if not done:
        log.warning("mallopt refused the body-buffer thresholds; uploads cost more CPU")
    return done
