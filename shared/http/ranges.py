"""HTTP conditional and range rules for content responses (RFC 9110 §13, §14).

Only single byte ranges are served as 206; a multi-range request gets the full 200 body, which
RFC 9110 allows and which can never deliver wrong bytes.
"""

from __future__ import annotations

import dataclasses
import re

from arkvory.shared.errors import RangeNotSatisfiable

# ASCII digits only: `\d` would also take other scripts' digits, which `int()` accepts.
_RANGE = re.compile(r"[ \t]*bytes[ \t]*=[ \t]*([0-9]*)[ \t]*-[ \t]*([0-9]*)[ \t]*", re.IGNORECASE)
# Beyond any file size; longer numbers are not parsed at all (`int()` of thousands of
# digits is slow, and refused above 4300 digits).
_BEYOND_ANY_SIZE = 2**63
_MAX_DIGITS = 19


def _position(digits: str) -> int:
    return _BEYOND_ANY_SIZE if len(digits) > _MAX_DIGITS else int(digits)


@dataclasses.dataclass(frozen=True)
class ByteRange:
    start: int
    end: int  # inclusive

    @property
    def length(self) -> int:
        return self.end - self.start + 1


def _entity_tags(header: str) -> list[str]:
    return [tag.strip().removeprefix("W/") for tag in header.split(",") if tag.strip()]


def not_modified(if_none_match: str | None, etag: str) -> bool:
    """If-None-Match uses the weak comparison: W/"x" matches "x"."""
    if if_none_match is None:
        return False
    tags = _entity_tags(if_none_match)
    return "*" in tags or etag in tags


def requested_range(
    range_header: str | None, if_range: str | None, etag: str, size: int
) -> ByteRange | None:
    """The single range to send, or None for the whole body; raises RangeNotSatisfiable."""
    if range_header is None:
        return None
    # If-Range needs a strong match; a date or another tag means "send it all".
    if if_range is not None and if_range.strip() != etag:
        return None
    if "," in range_header:
        return None
    match = _RANGE.fullmatch(range_header)
    if match is None:
        return None  # a malformed Range header is ignored (RFC 9110 §14.2)
    first, last = match.groups()
    if first == "" and last == "":
        return None
    if first == "":
        suffix = _position(last)
        if suffix == 0 or size == 0:
            raise RangeNotSatisfiable(size)
        return ByteRange(max(0, size - suffix), size - 1)
    start = _position(first)
    end = size - 1 if last == "" else min(_position(last), size - 1)
    if last != "" and _position(last) < start:
        return None  # invalid byte-range-spec: ignore the header
    if start >= size:
        raise RangeNotSatisfiable(size)
    return ByteRange(start, end)
