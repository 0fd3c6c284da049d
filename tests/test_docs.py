"""The docs cannot drift from the code: the README stays a newcomer's page whose commands exist,
every local link and anchor resolves, docs/api.md documents exactly the routes of the OpenAPI
document and the error codes of shared/errors.py, and docs/configuration.md lists exactly the
variables the settings read, with their defaults. No server is needed: the settings, the argument
parser and the writer's OpenAPI document are built in-process."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from arkvory.shared import errors
from arkvory.shared.settings import CLIENT_VARIABLES, Settings, SettingsError

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
API = DOCS / "api.md"

MINIMAL = {"ARKVORY_DATABASE_URL": "postgresql://x@127.0.0.1/x", "ARKVORY_DATA_DIR": "/nonexistent"}
SHARED = {
    "ARKVORY_GATEWAY_SLOTS": "3",
    "ARKVORY_GATEWAY_SLOT": "0",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(3 * 1024 * 1024),
}
S3 = {"ARKVORY_STORAGE_URL": "s3://arkvory-blobs"}


# ---------------------------------------------------------------------------------------------
# Markdown helpers


def tables(text: str, header: tuple[str, ...]) -> Iterator[list[str]]:
    """The rows (cells stripped) of every table whose header row is exactly `header`."""
    inside = False
    for line in text.splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        # `\|` is a pipe inside a cell (GET\|HEAD), not a separator.
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if tuple(cells) == header:
            inside = True
        elif inside and not set(line) <= set("|-: "):
            yield [c.replace("\\|", "|") for c in cells]


def unquoted(cell: str) -> str:
    return cell.replace("`", "").strip()


# ---------------------------------------------------------------------------------------------
# docs/configuration.md against shared/settings.py


class RecordingEnviron(Mapping[str, str]):
    """An environment that remembers every name the settings look up: the names they know."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.asked: set[str] = set()

    def __getitem__(self, name: str) -> str:
        self.asked.add(name)
        return self.values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)


def names_the_settings_read() -> set[str]:
    # With shared downloads and an object store with keys every optional branch of the parser runs.
    keys = {"AWS_ACCESS_KEY_ID": "placeholder", "AWS_SECRET_ACCESS_KEY": "placeholder"}
    environ = RecordingEnviron({**MINIMAL, **SHARED, **S3, **keys})
    Settings.from_env(environ)
    return environ.asked


def settings(**extra: str) -> Settings:
    return Settings.from_env({**MINIMAL, **extra})


# Where each variable's value lands in the settings object, read with the default in force (the
# environment that makes the variable meaningful, e.g. an s3:// storage for the region). A new
# variable needs a line here: the test below fails until it has one.
DEFAULT_OF = {
    "ARKVORY_ROLE": lambda: settings().role,
    "ARKVORY_DATABASE_POOL_SIZE": lambda: settings().database_pool_size,
    "ARKVORY_HOST": lambda: settings().host,
    "ARKVORY_PORT": lambda: settings().port,
    "ARKVORY_WORKER_PORT": lambda: settings().worker_port,
    "ARKVORY_TLS_CERT_FILE": lambda: settings().tls_cert_file,
    "ARKVORY_TLS_KEY_FILE": lambda: settings().tls_key_file,
    "ARKVORY_KEYS_FILE": lambda: settings().keys_file,
    "ARKVORY_LOG_FORMAT": lambda: settings().log_format,
    "ARKVORY_LOG_LEVEL": lambda: settings().log_level,
    "ARKVORY_ACCESS_LOG": lambda: 0 if settings().access_log == "off" else settings().access_log,  # `off` reads as 0
    "ARKVORY_DRAIN_TIMEOUT_SECONDS": lambda: settings().drain_timeout_s,
    "ARKVORY_PUBLIC_METRICS": lambda: settings().public_metrics,
    "ARKVORY_PUBLIC_URL": lambda: settings().public_url,
    "ARKVORY_STORAGE_URL": lambda: settings().storage_url,
    "ARKVORY_S3_ENDPOINT_URL": lambda: settings(**S3).object_store.endpoint_url,
    "ARKVORY_S3_REGION": lambda: settings(**S3).object_store.region,
    "AWS_ACCESS_KEY_ID": lambda: settings(**S3).object_store.access_key_id,
    "AWS_SECRET_ACCESS_KEY": lambda: settings(**S3).object_store.secret_access_key,
    "AWS_SESSION_TOKEN": lambda: settings(**S3).object_store.session_token,
    "ARKVORY_CACHE_MAX_BYTES": lambda: settings(**S3).cache_max_bytes,
    "ARKVORY_MIN_FREE_BYTES": lambda: settings().min_free_bytes,
    "ARKVORY_GATEWAY_SLOTS": lambda: settings().shared,
    "ARKVORY_GATEWAY_SLOT": lambda: settings().shared,
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": lambda: settings().shared,
    "ARKVORY_SHARE_MODE": lambda: settings(**SHARED).shared.share_mode,
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": lambda: settings(
        **SHARED
    ).shared.per_principal_bytes_per_second,
    "ARKVORY_DOWNLOAD_BYTES_PER_SECOND": lambda: settings().download_bytes_per_second,
    "ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": lambda: settings().download_bytes_per_second_per_principal,
    "ARKVORY_MAX_DOWNLOADS": lambda: settings().max_downloads,
    "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": lambda: settings().max_downloads_per_principal,
    "ARKVORY_DOWNLOAD_QUEUE_SIZE": lambda: settings().download_queue_size,
    "ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS": lambda: settings().download_queue_timeout_ms,
    "ARKVORY_SEND_TIMEOUT_SECONDS": lambda: settings().send_timeout_s,
    "ARKVORY_RECEIVE_TIMEOUT_SECONDS": lambda: settings().receive_timeout_s,
    "ARKVORY_MAX_UPLOADS": lambda: settings().max_uploads,
    "ARKVORY_MAX_UPLOADS_PER_PRINCIPAL": lambda: settings().max_uploads_per_principal,
    "ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND": lambda: settings().min_upload_bytes_per_second,
    "ARKVORY_MAX_ARTIFACT_BYTES": lambda: settings().max_artifact_bytes,
    "ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL": lambda: settings().max_reserved_bytes_per_principal,
    "ARKVORY_UPLOAD_EXPIRY": lambda: settings().upload_expiry_s,
    "ARKVORY_ALLOW_SIGNUP": lambda: settings().allow_signup,
    "ARKVORY_SESSION_LIFETIME": lambda: settings().session_lifetime_s,
    "ARKVORY_MAX_TOKENS_PER_ACCOUNT": lambda: settings().max_tokens_per_account,
    "ARKVORY_MAX_SESSIONS_PER_ACCOUNT": lambda: settings().max_sessions_per_account,
    "ARKVORY_IDEMPOTENCY_RETENTION": lambda: settings().idempotency_retention_s,
    "ARKVORY_TRUSTED_PROXIES": lambda: settings().trusted_proxies,
    "ARKVORY_CLEANUP_INTERVAL": lambda: settings().cleanup_interval_s,
    "ARKVORY_VERIFY_INTERVAL": lambda: settings().verify_interval_s,
    "ARKVORY_CLEANUP_GRACE": lambda: settings().cleanup_grace_s,
    "ARKVORY_VERIFY_BYTES_PER_SECOND": lambda: settings().verify_bytes_per_second,
    "ARKVORY_TASK_RETENTION": lambda: settings().task_retention_s,
    "ARKVORY_AUDIT_RETENTION": lambda: settings().audit_retention_s,
}

# Defaults the doc states as a rule of another setting, and what that rule computes.
DERIVED_DEFAULTS = {
    "min(4, ARKVORY_MAX_DOWNLOADS)": lambda s: min(4, s.max_downloads),
    "half of ARKVORY_MAX_UPLOADS, at least 1": lambda s: max(1, s.max_uploads // 2),
    "ARKVORY_MAX_ARTIFACT_BYTES": lambda s: s.max_artifact_bytes,
}
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def documented_value(cell: str) -> object:
    """The value a default cell states: `none`, a boolean, `off`, a duration or a number
    (a trailing explanation in parentheses is for the reader), else the text itself."""
    text = unquoted(cell)
    value = re.sub(r"\s+\(.*\)$", "", text)
    if value == "none":
        return None
    if value in ("true", "false"):
        return value == "true"
    if value == "off":
        return 0
    if duration := re.fullmatch(r"([1-9][0-9]*)([smhd])", value):
        return int(duration.group(1)) * _UNITS[duration.group(2)]
    if re.fullmatch(r"[0-9]+", value):
        return int(value)
    return value


def configuration_rows() -> dict[str, str]:
    """variable -> its default cell, from every `variable | rule | default` table."""
    rows: dict[str, str] = {}
    for cells in tables(CONFIGURATION.read_text(), ("variable", "rule", "default")):
        name = unquoted(cells[0])
        assert name not in rows, f"configuration.md lists {name} twice"
        rows[name] = cells[2]
    return rows


def test_configuration_md_names_every_variable_the_settings_read_and_no_other():
    known = names_the_settings_read() | CLIENT_VARIABLES
    named = set(re.findall(r"\b(?:ARKVORY|AWS)_[A-Z0-9_]*[A-Z0-9]\b", CONFIGURATION.read_text()))
    assert not known - named, f"configuration.md does not name {sorted(known - named)}"
    assert not named - known, f"configuration.md names variables no code reads: {sorted(named - known)}"
    rows = configuration_rows()
    settings_names = names_the_settings_read()
    assert not settings_names - set(rows), f"no rule|default row for {sorted(settings_names - set(rows))}"
    assert not set(rows) - settings_names, f"rows for what the settings do not read: {sorted(set(rows) - settings_names)}"


def test_configuration_md_states_the_code_defaults():
    wrong = []
    for name, cell in configuration_rows().items():
        stated = documented_value(cell)
        if stated == "required":
            environ = {k: v for k, v in MINIMAL.items() if k != name}
            with pytest.raises(SettingsError) as refused:
                Settings.from_env(environ)
            if not any(line.startswith(f"{name}:") for line in refused.value.problems):
                wrong.append(f"{name} is documented as required but is not")
            continue
        assert name in DEFAULT_OF, f"tests/test_docs.py: DEFAULT_OF has no line for {name}"
        actual = DEFAULT_OF[name]()
        if isinstance(stated, str) and stated in DERIVED_DEFAULTS:
            stated = DERIVED_DEFAULTS[stated](settings())
        if actual == ():  # an empty list of proxies is "none"
            actual = None
        if stated != actual:
            wrong.append(f"{name}: documented {cell}, the code's default is {actual!r}")
    assert not wrong, "\n".join(wrong)


def test_the_default_check_catches_a_wrong_default():
    # The parser of the default column must not read everything as "equal": a changed number,
    # duration or `none` differs from the code.
    assert documented_value("10") != DEFAULT_OF["ARKVORY_DATABASE_POOL_SIZE"]() + 1
    assert documented_value("`12h`") == DEFAULT_OF["ARKVORY_SESSION_LIFETIME"]()
    assert documented_value("`13h`") != DEFAULT_OF["ARKVORY_SESSION_LIFETIME"]()
    assert documented_value("1073741824 (1 GiB)") == DEFAULT_OF["ARKVORY_MIN_FREE_BYTES"]()
    assert documented_value("none (AWS S3)") is None


# ---------------------------------------------------------------------------------------------
# docs/api.md against the writer's OpenAPI document and shared/errors.py

_METHOD = r"(?:GET|HEAD|POST|PUT|PATCH|DELETE)"
_ROUTE_SPAN = re.compile(rf"`({_METHOD}(?:\\?\|{_METHOD})*) (/[^`\s]*)`")


def openapi_document() -> dict:
    from arkvory.shared.auth.identity import KeyRing
    from arkvory.shared.process.runtime import Runtime
    from arkvory.writer.app import build_writer_app

    app = build_writer_app(Runtime(Settings.from_env(MINIMAL), KeyRing.empty()))
    return json.loads(app.state.openapi_json)


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)


def route_key(path: str) -> str:
    """The path without its query or optional part, every `{parameter}` alike: the doc may say
    `{id}` where the code says `{artifact_id}`."""
    path = re.split(r"[?\[]", path, maxsplit=1)[0]
    return re.sub(r"\{[^}]*\}", "{}", path)


def documented_routes(text: str) -> set[tuple[str, str]]:
    """(METHOD, path) of every `METHOD[|METHOD] /path` written in backticks outside code blocks."""
    routes = set()
    for methods, path in _ROUTE_SPAN.findall(without_fences(text)):
        for method in re.split(r"\\?\|", methods):
            routes.add((method, route_key(path)))
    return routes


def openapi_routes(document: dict) -> set[tuple[str, str]]:
    methods = {"get", "head", "post", "put", "patch", "delete"}
    return {
        (method.upper(), route_key(path))
        for path, item in document["paths"].items()
        for method in item
        if method in methods
    }


def api_errors() -> set[tuple[int, str]]:
    def subclasses(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    found = {(cls.status, cls.code) for cls in subclasses(errors.ApiError)}
    return found | {(errors.ApiError.status, errors.ApiError.code)}  # 500 internal


def test_api_md_documents_every_operation_of_the_openapi_document_and_no_other():
    documented, served = documented_routes(API.read_text()), openapi_routes(openapi_document())
    assert not served - documented, f"api.md does not document {sorted(served - documented)}"
    assert not documented - served, f"api.md documents routes that do not exist: {sorted(documented - served)}"


def test_the_route_check_sees_a_missing_and_an_invented_route():
    text = API.read_text()
    served = openapi_routes(openapi_document())
    dropped = text.replace("`POST /api/v1/tasks/{id}/cancel`", "cancel")
    assert served - documented_routes(dropped) == {("POST", "/api/v1/tasks/{}/cancel")}
    invented = text + "\n`DELETE /api/v1/tasks/{id}` removes a task.\n"
    assert documented_routes(invented) - served == {("DELETE", "/api/v1/tasks/{}")}


def test_api_md_error_table_is_the_error_tree_and_the_openapi_code_list():
    rows = list(tables(API.read_text(), ("status", "code", "when")))
    table = {(int(cells[0]), unquoted(cells[1])) for cells in rows}
    assert len(rows) == len(table), "api.md lists an error twice"
    assert table == api_errors(), (
        f"api.md's error table lacks {sorted(api_errors() - table)} and lists unknown {sorted(table - api_errors())}"
    )
    description = openapi_document()["components"]["schemas"]["Error"]["properties"]["code"]["description"]
    listed = set(re.split(r",\s*", description.strip()))
    assert listed == {code for _, code in table}, (
        f"the OpenAPI Error code list differs from api.md: {sorted(listed ^ {code for _, code in table})}"
    )


# ---------------------------------------------------------------------------------------------
# The README: short, its commands real

README_MAX_LINES = 250
CI_SCRIPT = ROOT / ".ci" / "run"


def test_the_readme_is_a_newcomers_page():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES} and move reference "
        "material to docs/"
    )


def test_the_readmes_test_command_is_what_ci_runs():
    readme = README.read_text()
    section = readme.split("## Run the tests", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", section, re.DOTALL)
    assert block, "README.md: no sh block under 'Run the tests'"
    command = block.group(1).strip()
    assert " && " in command and command.endswith(".venv/bin/python -m pytest"), command
    # .ci/run does the same steps one by one: the venv, the project with its test extra, pytest.
    ci = CI_SCRIPT.read_text()
    for step in command.split(" && "):
        step = step.replace(".venv/bin/pip install", ".venv/bin/python -m pip install -q")
        assert re.search(rf"^{re.escape(step)}$", ci, re.MULTILINE), f".ci/run does not run {step!r}"


def _subcommands(parser) -> dict:
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _long_options(parser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def arkvory_invocations(text: str) -> Iterator[list[str]]:
    """The words after `arkvory` in every shell line of a code block and every inline code span
    that starts a command: `arkvory get …`, `.venv/bin/arkvory dev …`, `/opt/arkvory/bin/arkvory …`."""
    blocks = re.findall(r"^```(?:sh|bash)?\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    spans = re.findall(r"`([^`\n]+)`", without_fences(text))
    for source in [*"\n".join(blocks).splitlines(), *spans]:
        source = re.split(r"\s#\s|\s#$", source)[0]  # a trailing comment
        for match in re.finditer(r"(?:^|[\s/;|&(])arkvory((?: +[^\s;|&)`']+)*)", source):
            before = source[: match.start()].split()
            if before and before[-1] in ("-u", "from", "import"):  # a user name, a Python import
                continue
            words = match.group(1).split()
            if words and words[0] != "import":
                yield words


def check_invocation(top, words: list[str]) -> str | None:
    """A problem with `arkvory WORDS`: an unknown command or a long option it does not take."""
    parser, path = top, ["arkvory"]
    for word in words:
        commands = _subcommands(parser)
        if not commands:
            break
        if word.startswith("-"):
            break
        choices = word.split("|")  # `token create|list|revoke`
        unknown = [c for c in choices if c not in commands]
        if unknown:
            # Upper-case words and `...` are placeholders in prose (`arkvory COMMAND --help`).
            if word.isupper() or word.endswith("…") or word.endswith("..."):
                return None
            return f"`{' '.join(path)} {word}`: no such command (known: {', '.join(sorted(commands))})"
        parser, path = commands[choices[0]], [*path, choices[0]]
    known = _long_options(parser)
    for word in words:
        option = word.strip("[]").split("=", 1)[0]
        if option.startswith("--") and option not in known:
            return f"`{' '.join(path)}` has no option {option}"
    return None


# Commands the docs already describe whose code lands from another branch of the same release:
# `admin migrate-storage` (issue 16 §6). Remove an entry once the command exists.
PENDING_COMMANDS: list[list[str]] = []  # commands documented before they land

DOCUMENTS_WITH_COMMANDS = [README, DOCS / "client.md", DOCS / "operations.md", DOCS / "configuration.md", ROOT / "deploy" / "README.md"]


def test_every_arkvory_command_in_the_docs_exists():
    from arkvory.shared.cli.main import parser

    top = parser()
    problems = []
    for document in DOCUMENTS_WITH_COMMANDS:
        seen = 0
        for words in arkvory_invocations(document.read_text()):
            seen += 1
            if words[:2] in PENDING_COMMANDS:
                continue
            if problem := check_invocation(top, words):
                problems.append(f"{document.relative_to(ROOT)}: {problem}")
        assert seen, f"{document.relative_to(ROOT)}: no arkvory command found (the scanner broke?)"
    assert not problems, "\n".join(sorted(set(problems)))


def test_the_command_check_sees_an_unknown_command_and_option():
    from arkvory.shared.cli.main import parser

    top = parser()
    assert check_invocation(top, ["dev", "--rate", "50MiB"]) is None
    assert check_invocation(top, ["token", "create|list|revoke"]) is None
    assert "no such command" in check_invocation(top, ["admin", "migrate-everything"])
    assert "no option --speed" in check_invocation(top, ["dev", "--speed", "50MiB"])


# ---------------------------------------------------------------------------------------------
# Links between the docs

LINKED_DOCUMENTS = sorted({README, *DOCS.glob("*.md"), *(ROOT / "deploy").rglob("README.md")})


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(document: Path) -> set[str]:
    found: set[str] = set()
    counts: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?)\s*$", without_fences(document.read_text()), re.MULTILINE):
        base = slug(heading)
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def broken_links(document: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", without_fences(document.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    return broken


@pytest.mark.parametrize("document", LINKED_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve(document):
    assert not broken_links(document), "\n".join(broken_links(document))


def test_the_link_check_sees_a_moved_file_and_a_renamed_heading(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## The `arkvory` CLI\n\n[ok](#the-arkvory-cli) [x](#gone) [y](b.md)\n")
    assert broken_links(tmp_path / "a.md") == ["#gone: no heading #gone in a.md", "b.md: no such file"]
