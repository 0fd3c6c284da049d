"""The transfer progress bar of `arkvory get`/`put`: bytes, rate and ETA (tqdm) on stderr, drawn
only for a person at a terminal; scripts, pipes, `--quiet` and `--json` get no bar at all.

tqdm is imported only when a bar is drawn, so `arkvory serve` and piped runs never load it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

Progress = Callable[[int, "int | None"], None]


def wants_bar(stream: TextIO, *, quiet: bool, as_json: bool) -> bool:
    if quiet or as_json:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream: no terminal to draw on
        return False


@contextmanager
def progress_bar(description: str, *, enabled: bool, stream: TextIO | None = None) -> Iterator[Progress | None]:
    """A `progress(done_bytes, total_or_None)` callback for the library, or None when disabled.

    The library reports the bytes done so far (not increments); when a download starts over
    (a 200 to a Range, an ETag change) `done` goes back down, and the bar follows it.
    """
    if not enabled:
        yield None
        return
    from tqdm import tqdm

    bar = tqdm(
        desc=description,
        total=None,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=stream or sys.stderr,
        dynamic_ncols=True,
        miniters=1,
        mininterval=0.2,
        leave=True,
    )

    def progress(done: int, total: int | None) -> None:
        if total is not None and bar.total != total:
            bar.total = total
            bar.refresh()
        if done < bar.n:
            bar.reset(total=bar.total)
        if done > bar.n:
            bar.update(done - bar.n)

    try:
        yield progress
    finally:
        bar.close()
