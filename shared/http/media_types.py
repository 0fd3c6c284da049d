"""Media types as RFC 9110 §8.3.1 defines them, checked before one is stored.

A stored media type is sent back as `Content-Type` on every download by every process, so a
value that is not a valid header (non-ASCII, CR/LF, control characters) would break every
download of that artifact: it is refused at upload instead.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from arkvory.shared.errors import InvalidInput

MAX_MEDIA_TYPE = 255
DEFAULT_MEDIA_TYPE = "application/octet-stream"

_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
# qdtext and quoted-pair without obs-text: only ASCII is ever stored.
_QUOTED = r'"(?:[\t !#-\[\]-~]|\\[\t -~])*"'
_PARAMETER = rf"[ \t]*;[ \t]*(?:{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?"
_MEDIA_TYPE = re.compile(rf"{_TOKEN}/{_TOKEN}(?:{_PARAMETER})*")

# Encodings of an HTML form, not the type of the file inside: `curl --data-binary` sends
# the urlencoded one by default. (A multipart body is refused before this is asked:
# writer/uploads/store.py `refuse_form_upload`.)
FORM_ENCODINGS = frozenset({"multipart/form-data", "application/x-www-form-urlencoded"})


def check_media_type(value: str, what: str = "mediaType") -> str:
    if len(value) > MAX_MEDIA_TYPE or not _MEDIA_TYPE.fullmatch(value):
        raise InvalidInput(
            f"{what} must be a media type such as 'application/gzip' "
            f"(RFC 9110 syntax, ASCII, at most {MAX_MEDIA_TYPE} characters)"
        )
    return value


def essence(value: str) -> str:
    """type/subtype in lower case, without parameters."""
    return value.split(";", 1)[0].strip().lower()


def upload_media_type(parameter: str | None, content_type: str | None) -> str:
    """The media type to store: the `mediaType` parameter, else the body's Content-Type
    (unless that only names a form encoding), else application/octet-stream."""
    if parameter:
        return check_media_type(parameter)
    if content_type and essence(content_type) not in FORM_ENCODINGS:
        return check_media_type(content_type.strip(), "Content-Type")
    return DEFAULT_MEDIA_TYPE


def accepts_html(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a request's `Accept` (its ASGI headers) asks for HTML by name (`text/html`, not
    only `*/*`), as a browser's navigation does and API clients (curl, libraries: `*/*` or JSON)
    do not."""
    accept = ",".join(value.decode("latin-1") for key, value in headers if key == b"accept")
    for item in accept.split(","):
        media, _, parameters = item.partition(";")
        if media.strip().lower() != "text/html":
            continue
        for parameter in parameters.split(";"):
            name, _, value = parameter.partition("=")
            if name.strip().lower() == "q":
                try:
                    return float(value.strip()) > 0
                except ValueError:
                    return False
        return True
    return False
