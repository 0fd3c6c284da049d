"""Read pins counted in memory (shared/cluster/pins.py): a digest is pinned while any transfer
holds it and LINGER_S after the last one; `take`/`give_back` (the per-download path's plain
calls) and `hold` (the context manager) count the same. Writing them: tests/test_blob_safety.py."""

from __future__ import annotations

import pytest

from arkvory.shared.cluster.pins import LINGER_S, ReadPins

pytestmark = pytest.mark.timeout(10)


def test_take_and_give_back_pin_as_hold_does_and_linger_after_the_last():
    now = [100.0]
    pins = ReadPins(slot=1, clock=lambda: now[0])
    pins.take("a")
    assert pins._changed.is_set()  # a new digest: the next write comes within the batch window
    pins._changed.clear()
    with pins.hold("a"):  # a second transfer of the same digest: nothing new to write
        assert not pins._changed.is_set() and pins._counts == {"a": 2}
    pins.give_back("a")
    assert pins._counts == {} and pins.digests == ["a"]  # released: still written for LINGER_S
    pins.take("a")  # read again while lingering: no new write needed either
    assert not pins._changed.is_set()
    pins.give_back("a")
    now[0] += LINGER_S
    assert pins.digests == []
