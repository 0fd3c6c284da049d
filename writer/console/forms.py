"""Console form bodies, bounded before any work like the API's JSON bodies.

A form is `application/x-www-form-urlencoded`, at most `MAX_FORM_BYTES` and `MAX_FIELDS`
fields, valid UTF-8, each name at most once (two values could mean one thing here and another
there). The values are handed to the API as they are: the API's own checks bound and refuse
them. Only what the console itself turns into another type (a whole number for a task budget, a
yes/no box) is checked here, with the same kind of message.
"""

from __future__ import annotations

import urllib.parse

from starlette.requests import Request

from arkvory.shared.errors import InvalidInput, UnsupportedMediaType
from arkvory.shared.http.bodies import read_capped

MAX_FORM_BYTES = 64 * 1024
MAX_FIELDS = 64
MAX_NUMBER_DIGITS = 19  # any larger whole number is past every API bound (2^63)


class Form:
    def __init__(self, fields: dict[str, str]) -> None:
        self.fields = fields

    def text(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)

    def optional(self, name: str) -> str | None:
        """The field's value, or None when it is missing or left empty."""
        value = self.fields.get(name, "")
        return value if value != "" else None

    def checked(self, name: str) -> bool:
        """A checkbox: present with any value means ticked."""
        return name in self.fields

    def whole_number(self, name: str, label: str | None = None) -> int | None:
        """An optional whole number (digits only); None when left empty."""
        value = self.fields.get(name, "").strip()
        if value == "":
            return None
        if not (value.isascii() and value.isdigit() and len(value) <= MAX_NUMBER_DIGITS):
            raise InvalidInput(f"{label or name} must be a whole number (digits only)")
        return int(value)


async def read_form(request: Request, timeout_s: float) -> Form:
    content_type = (request.headers.get("content-type") or "").split(";", 1)[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise UnsupportedMediaType("a console form is sent as application/x-www-form-urlencoded")
    raw = await read_capped(request, MAX_FORM_BYTES, timeout_s)
    try:
        text = raw.decode("utf-8")
        pairs = urllib.parse.parse_qsl(
            text, keep_blank_values=True, strict_parsing=False, encoding="utf-8", errors="strict",
            max_num_fields=MAX_FIELDS,
        )
    except UnicodeDecodeError:
        raise InvalidInput("the form is not valid UTF-8") from None
    except ValueError:
        raise InvalidInput(f"a form has at most {MAX_FIELDS} fields") from None
    fields: dict[str, str] = {}
    for name, value in pairs:
        if name in fields:
            raise InvalidInput(f"the field {name!r} was sent twice")
        fields[name] = value
    return Form(fields)
