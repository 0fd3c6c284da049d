"""How to fetch what a page shows, through the gateways (issue 25 §6): the content route's URL
on the public download base, and the `curl` and `arkvory get` lines that fetch it.

The base is ARKVORY_PUBLIC_URL, the address clients download from (the balancer's, which spreads
the content routes over the writer and the gateways; in `arkvory dev` the first gateway's): the
writer cannot guess it. Unset, it is the address this page was loaded from, and the page says so
to administrators.

No line ever holds a credential: a private repository's `curl` line sends
`Authorization: Bearer $ARKVORY_TOKEN`, a shell variable the user sets, and `arkvory get` reads
that variable (or its login profile) itself. Every value is quoted for a POSIX shell, so a name
with spaces or quotes is still one argument, and nothing in it runs.
"""

from __future__ import annotations

import dataclasses
import shlex
import urllib.parse

from starlette.requests import Request

from .session import runtime_of

TOKEN_HEADER = '-H "Authorization: Bearer $ARKVORY_TOKEN"'
FALLBACK_FILE_NAME = "download"
MAX_FILE_NAME_BYTES = 255  # a file name's limit on Linux file systems (curl -o fails past it)


@dataclasses.dataclass(frozen=True)
class Lines:
    """One download, as a URL and two commands; `configured` is false when the base is this
    page's own address (ARKVORY_PUBLIC_URL unset)."""

    url: str
    curl: str
    arkvory: str
    needs_token: bool
    configured: bool


def public_base(request: Request) -> tuple[str, bool]:
    """(the download base without a trailing slash, whether it is ARKVORY_PUBLIC_URL)."""
    configured = runtime_of(request).settings.public_url
    if configured:
        return configured, True
    return f"{request.url.scheme}://{request.url.netloc}", False


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


def _query(values: dict[str, str]) -> str:
    return urllib.parse.urlencode(values, quote_via=urllib.parse.quote)


def file_name(name: str) -> str:
    """A name for `curl -o`: the last path segment, no control characters, no leading dots
    (never `.`, `..` or a hidden file), at most 255 bytes: the name `arkvory get` saves the file
    under. That rule is shared/client/commands.safe_file_name, which the writer may not import
    (the client library is a leaf, tests/test_layout.py); tests/test_cli.py holds the two to the
    same answers."""
    last = name.replace("\\", "/").rsplit("/", 1)[-1]
    cleaned = "".join(ch for ch in last if ch.isprintable()).strip().lstrip(".").strip()
    cleaned = cleaned.encode("utf-8")[:MAX_FILE_NAME_BYTES].decode("utf-8", errors="ignore")
    return cleaned or FALLBACK_FILE_NAME


def _lines(request: Request, repository: dict, path: str, saved_as: str, target: list[str]) -> Lines:
    base, configured = public_base(request)
    url = base + path
    private = not repository["public"]
    curl = ["curl", "-fL", "-o", shlex.quote(file_name(saved_as))]
    if private:
        curl.append(TOKEN_HEADER)
    curl.append(shlex.quote(url))
    arkvory = ["arkvory", "get", "--url", shlex.quote(base), shlex.quote(repository["name"]), *target]
    return Lines(url, " ".join(curl), " ".join(arkvory), private, configured)


def artifact_lines(request: Request, repository: dict, artifact: dict) -> Lines:
    path = f"/api/v1/repositories/{_quote(repository['name'])}/artifacts/{_quote(artifact['id'])}/content"
    return _lines(request, repository, path, artifact["name"], [shlex.quote(artifact["id"])])


def package_lines(request: Request, repository: dict, package: dict) -> Lines:
    coordinates = {"group": package["group"], "name": package["name"], "version": package["version"]}
    path = f"/api/v1/repositories/{_quote(repository['name'])}/packages/content?{_query(coordinates)}"
    if "/" in package["name"] or "@" in package["version"]:
        # GROUP/NAME@VERSION cannot spell it (the CLI splits at the last '/' and '@'): the
        # version's artifact is the same bytes.
        target = [shlex.quote(package["artifactId"])]
    else:
        target = [shlex.quote(f"--package={package['group']}/{package['name']}@{package['version']}")]
    return _lines(request, repository, path, package["name"], target)


def asset_lines(request: Request, repository: dict, asset_path: str) -> Lines:
    path = f"/api/v1/repositories/{_quote(repository['name'])}/asset/content?{_query({'path': asset_path})}"
    # `--asset=PATH`: a path that starts with '-' stays the option's value.
    return _lines(request, repository, path, asset_path, [shlex.quote(f"--asset={asset_path}")])
