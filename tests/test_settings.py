"""SPEC §2: every configuration rule, checked the way `arkvory serve` checks it.

Each bad environment must stop the process before it serves anything (or connects to the
database: the DSN below points at a closed port) with exit status 2 and one line per problem
on stderr that names the variable, says what is allowed and shows the value given. The single
and cross rules run serve's first step (`_settings_or_exit`) in this process; several problems
at once, the keys file and the hidden password run the real `arkvory serve` process.
The derived values (rates per process and per principal) are checked on `Settings.from_env`.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import subprocess

import pytest

from arkvory.shared.cli.main import _settings_or_exit
from arkvory.shared.settings import MAX_RATE, Settings, SettingsError

from .harness import run_arkvory

pytestmark = pytest.mark.timeout(120)

DSN = "postgresql://arkvory@127.0.0.1:1/none"
PREFIX = "arkvory: invalid setting "
NOWHERE = "/nonexistent/arkvory/file.pem"
SHARED = {  # a valid writer in shared mode: 3 slots, 3 MB/s in total
    "ARKVORY_GATEWAY_SLOTS": "3",
    "ARKVORY_GATEWAY_SLOT": "0",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "3000000",
}
GATEWAY = {**SHARED, "ARKVORY_ROLE": "reader", "ARKVORY_GATEWAY_SLOT": "1"}
TOTAL_FLOOR_3 = "at least 65536 x ARKVORY_GATEWAY_SLOTS (3) and at most 2^40"


def base_env(tmp_path: pathlib.Path, **overrides: str | None) -> dict[str, str]:
    """A valid environment; `None` removes a variable; `{tmp}` is replaced by tmp_path."""
    env = {k: os.environ[k] for k in ("PATH", "HOME") if k in os.environ}
    env.update(ARKVORY_DATABASE_URL=DSN, ARKVORY_DATA_DIR=str(tmp_path / "data"))
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value.replace("{tmp}", str(tmp_path))
    return env


def problem_lines(result) -> list[str]:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert lines, "expected at least one problem line on stderr"
    assert all(line.startswith(PREFIX) for line in lines), result.stderr
    return lines


def assert_problem(lines: list[str], name: str, fragment: str, value: str | None) -> None:
    """One line names `name` first, says `fragment` and (unless None) shows `value`."""
    mine = [line for line in lines if line.startswith(f"{PREFIX}{name}:")]
    assert mine, f"no line names {name}:\n" + "\n".join(lines)
    wanted = [line for line in mine if fragment in line]
    assert wanted, f"no {name} line says {fragment!r}:\n" + "\n".join(mine)
    if value is not None:
        assert any(line.endswith(f"got {value!r}") for line in wanted), (
            f"no {name} line shows the value {value!r}:\n" + "\n".join(wanted)
        )


def case(case_id, overrides, *expected, lines=1):
    """expected: (variable, allowed-fragment, shown value or None), one per expected line."""
    return pytest.param(overrides, expected, lines, id=case_id)


def range_cases(name, low, high, extra=None, why=None):
    allowed = f"expected an integer in {low}..{high}"
    extra = extra or {}
    cases = [
        case(f"{name}-not-integer", {**extra, name: "ten"}, (name, allowed, "ten")),
        case(f"{name}-negative", {**extra, name: "-1"}, (name, allowed, "-1")),
        case(f"{name}-too-low", {**extra, name: str(low - 1)}, (name, allowed, str(low - 1))),
        case(f"{name}-too-high", {**extra, name: str(high + 1)}, (name, allowed, str(high + 1))),
    ]
    if low == 0:
        cases.pop(2)  # -1 is the "too low" case already
    return cases


SINGLE_RULES = [
    # ARKVORY_ROLE
    case("role-bad-choice", {"ARKVORY_ROLE": "writer"}, ("ARKVORY_ROLE", "api, reader", "writer")),
    case("role-case-sensitive", {"ARKVORY_ROLE": "API"}, ("ARKVORY_ROLE", "api, reader", "API")),
    # ARKVORY_DATABASE_URL
    case("database-url-missing", {"ARKVORY_DATABASE_URL": None},
         ("ARKVORY_DATABASE_URL", "required", "")),
    case("database-url-blank", {"ARKVORY_DATABASE_URL": "   "},
         ("ARKVORY_DATABASE_URL", "required", "   ")),
    case("database-url-not-postgres", {"ARKVORY_DATABASE_URL": "mysql://db.example/arkvory"},
         ("ARKVORY_DATABASE_URL", "PostgreSQL URL", "mysql://db.example/arkvory")),
    case("database-url-no-host", {"ARKVORY_DATABASE_URL": "postgresql:///arkvory"},
         ("ARKVORY_DATABASE_URL", "PostgreSQL URL", "postgresql:///arkvory")),
    case("database-url-unparseable", {"ARKVORY_DATABASE_URL": "postgresql://u@[::1/db"},
         ("ARKVORY_DATABASE_URL", "PostgreSQL URL", None)),
    # ARKVORY_DATABASE_POOL_SIZE
    *range_cases("ARKVORY_DATABASE_POOL_SIZE", 1, 200),
    # ARKVORY_DATA_DIR
    case("data-dir-missing", {"ARKVORY_DATA_DIR": None}, ("ARKVORY_DATA_DIR", "required", "")),
    # ARKVORY_KEYS_FILE (contents: see test_keys_file_refused)
    case("keys-file-nonexistent", {"ARKVORY_KEYS_FILE": NOWHERE},
         ("ARKVORY_KEYS_FILE", "existing readable file", NOWHERE)),
    case("keys-file-is-directory", {"ARKVORY_KEYS_FILE": "{tmp}"},
         ("ARKVORY_KEYS_FILE", "existing readable file", None)),
    # ARKVORY_PORT (ARKVORY_HOST is free text)
    *range_cases("ARKVORY_PORT", 1, 65535),
    # ARKVORY_TLS_CERT_FILE, ARKVORY_TLS_KEY_FILE
    case("tls-cert-nonexistent",
         {"ARKVORY_TLS_CERT_FILE": NOWHERE, "ARKVORY_TLS_KEY_FILE": "{tmp}/key.pem"},
         ("ARKVORY_TLS_CERT_FILE", "existing readable file", NOWHERE)),
    case("tls-key-nonexistent",
         {"ARKVORY_TLS_CERT_FILE": "{tmp}/cert.pem", "ARKVORY_TLS_KEY_FILE": NOWHERE},
         ("ARKVORY_TLS_KEY_FILE", "existing readable file", NOWHERE)),
    case("tls-cert-without-key", {"ARKVORY_TLS_CERT_FILE": "{tmp}/cert.pem"},
         ("ARKVORY_TLS_KEY_FILE", "to be set together", "")),
    case("tls-key-without-cert", {"ARKVORY_TLS_KEY_FILE": "{tmp}/key.pem"},
         ("ARKVORY_TLS_CERT_FILE", "to be set together", "")),
    # ARKVORY_GATEWAY_SLOTS
    *range_cases("ARKVORY_GATEWAY_SLOTS", 2, 16, extra=SHARED),
    # ARKVORY_GATEWAY_SLOT
    case("slot-not-integer", {**SHARED, "ARKVORY_GATEWAY_SLOT": "first"},
         ("ARKVORY_GATEWAY_SLOT", "the writer (ARKVORY_ROLE=api) is slot 0", "first")),
    case("slot-negative-gateway", {**GATEWAY, "ARKVORY_GATEWAY_SLOT": "-1"},
         ("ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..2", "-1")),
    # ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND
    case("total-not-integer", {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "3MB"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", TOTAL_FLOOR_3, "3MB")),
    case("total-zero", {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "0"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", TOTAL_FLOOR_3, "0")),
    # ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL
    case("principal-total-not-integer",
         {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": "lots"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
          "0 (unlimited) or " + TOTAL_FLOOR_3, "lots")),
    case("principal-total-too-high",
         {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": str(MAX_RATE + 1)},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL", "at most 2^40",
          str(MAX_RATE + 1))),
    # local limits
    *range_cases("ARKVORY_DOWNLOAD_BYTES_PER_SECOND", 0, MAX_RATE),
    *range_cases("ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL", 0, MAX_RATE),
    # concurrency and queue
    *range_cases("ARKVORY_MAX_DOWNLOADS", 1, 256),
    *range_cases("ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL", 1, 16),  # 16 = default max
    *range_cases("ARKVORY_DOWNLOAD_QUEUE_SIZE", 1, 1024),
    *range_cases("ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS", 1, 120000),
    *range_cases("ARKVORY_MAX_UPLOADS", 1, 32),
    *range_cases("ARKVORY_MAX_UPLOADS_PER_PRINCIPAL", 1, 2),  # 2 = default max
    *range_cases("ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND", 0, MAX_RATE),
    *range_cases("ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL", 1, 2**50),
    # credentials one account may hold
    *range_cases("ARKVORY_MAX_TOKENS_PER_ACCOUNT", 1, 10_000),
    *range_cases("ARKVORY_MAX_SESSIONS_PER_ACCOUNT", 1, 10_000),
    # balancers whose X-Forwarded-For is believed
    case("trusted-proxies-not-an-address", {"ARKVORY_TRUSTED_PROXIES": "10.0.0.1,balancer"},
         ("ARKVORY_TRUSTED_PROXIES", "addresses or CIDRs", "10.0.0.1,balancer")),
    case("trusted-proxies-bad-prefix", {"ARKVORY_TRUSTED_PROXIES": "10.0.0.0/33"},
         ("ARKVORY_TRUSTED_PROXIES", "addresses or CIDRs", "10.0.0.0/33")),
    # ARKVORY_PUBLIC_URL: the address clients download from, shown in the console's lines
    *(
        case(f"public-url-{label}", {"ARKVORY_PUBLIC_URL": value},
             ("ARKVORY_PUBLIC_URL", "expected the http:// or https:// address clients download from", shown))
        for label, value, shown in [
            ("no-scheme", "artifacts.example.com", "artifacts.example.com"),
            ("other-scheme", "ftp://artifacts.example.com", "ftp://artifacts.example.com"),
            ("no-host", "https://", "https://"),
            ("query", "https://artifacts.example.com/?x=1", "https://artifacts.example.com/?x=1"),
            ("fragment", "https://artifacts.example.com/#top", "https://artifacts.example.com/#top"),
            ("bad-port", "https://artifacts.example.com:99999", "https://artifacts.example.com:99999"),
            ("space", "https://artifacts.example.com/a b", "https://artifacts.example.com/a b"),
            ("quote", "https://artifacts.example.com/a'b", "https://artifacts.example.com/a'b"),
            ("password-masked", "https://bob:hunter2@artifacts.example.com", "https://bob:***@artifacts.example.com"),
        ]
    ),
    # a typo never falls back to a default silently
    case("unknown-variable-typo", {"ARKVORY_MAX_DOWNLAODS": "8"},
         ("ARKVORY_MAX_DOWNLAODS", "unknown variable; did you mean ARKVORY_MAX_DOWNLOADS?", None)),
    case("unknown-variable-far-from-any", {"ARKVORY_FROBNICATE": "1"},
         ("ARKVORY_FROBNICATE", "unknown variable", None)),
    # slow or silent peers
    *range_cases("ARKVORY_SEND_TIMEOUT_SECONDS", 1, 3600),
    *range_cases("ARKVORY_RECEIVE_TIMEOUT_SECONDS", 1, 3600),
    # uploads
    *range_cases("ARKVORY_MAX_ARTIFACT_BYTES", 1, 2**50),
    *range_cases("ARKVORY_MIN_FREE_BYTES", 0, 2**50),
    # durations
    *[
        case(f"{name}-{label}", {name: value}, (name, "expected a duration such as 7d", value))
        for name in (
            "ARKVORY_TASK_RETENTION",
            "ARKVORY_IDEMPOTENCY_RETENTION",
            "ARKVORY_UPLOAD_EXPIRY",
            "ARKVORY_SESSION_LIFETIME",
        )
        for label, value in (
            ("no-unit", "7"), ("bad-unit", "2w"), ("words", "7 days"), ("zero", "0d"),
            ("negative", "-1h"), ("fraction", "1.5h"), ("upper-case", "24H"),
        )
    ],
    # booleans
    *[
        case(f"{name}-{value}", {name: value}, (name, "expected true or false", value))
        for name in ("ARKVORY_ALLOW_SIGNUP", "ARKVORY_PUBLIC_METRICS")
        for value in ("maybe", "2", "enabled")
    ],
    # logging
    case("log-format-bad", {"ARKVORY_LOG_FORMAT": "yaml"},
         ("ARKVORY_LOG_FORMAT", "json, text", "yaml")),
    case("log-level-bad", {"ARKVORY_LOG_LEVEL": "verbose"},
         ("ARKVORY_LOG_LEVEL", "debug, info, warning, error, critical", "verbose")),
    *[
        case(f"access-log-{value}", {"ARKVORY_ACCESS_LOG": value}, ("ARKVORY_ACCESS_LOG", "off, text, json", value))
        for value in ("on", "JSON", "true", "common")
    ],
]

MISSING = "expected to be set because {} is set"
CROSS_RULES = [
    # any shared variable without the others
    case("slots-alone", {"ARKVORY_GATEWAY_SLOTS": "3"},
         ("ARKVORY_GATEWAY_SLOT", MISSING.format("ARKVORY_GATEWAY_SLOTS"), None),
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
          MISSING.format("ARKVORY_GATEWAY_SLOTS"), None),
         lines=2),
    case("slot-alone", {"ARKVORY_GATEWAY_SLOT": "0"},
         ("ARKVORY_GATEWAY_SLOTS", MISSING.format("ARKVORY_GATEWAY_SLOT"), None),
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", MISSING.format("ARKVORY_GATEWAY_SLOT"), None),
         lines=2),
    case("total-alone", {"ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "3000000"},
         ("ARKVORY_GATEWAY_SLOTS",
          MISSING.format("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND"), None),
         ("ARKVORY_GATEWAY_SLOT",
          MISSING.format("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND"), None),
         lines=2),
    case("principal-total-alone",
         {"ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": "3000000"},
         *[
             (name, MISSING.format("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL"), None)
             for name in ("ARKVORY_GATEWAY_SLOTS", "ARKVORY_GATEWAY_SLOT",
                          "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND")
         ],
         lines=3),
    case("blank-slots-with-the-others", {**SHARED, "ARKVORY_GATEWAY_SLOTS": "  "},
         ("ARKVORY_GATEWAY_SLOTS", "expected to be set because ARKVORY_GATEWAY_SLOT", None)),
    case("gateway-missing-slot", {**GATEWAY, "ARKVORY_GATEWAY_SLOT": None},
         ("ARKVORY_GATEWAY_SLOT", "slot, slots and total rate go together", None)),
    # a gateway without the shared-download configuration
    case("gateway-standalone", {"ARKVORY_ROLE": "reader"},
         ("ARKVORY_GATEWAY_SLOTS",
          "a gateway (ARKVORY_ROLE=reader) requires the shared-download configuration", None)),
    # slot rules
    case("writer-slot-1", {**SHARED, "ARKVORY_GATEWAY_SLOT": "1"},
         ("ARKVORY_GATEWAY_SLOT", "the writer (ARKVORY_ROLE=api) is slot 0", "1")),
    case("gateway-slot-0", {**GATEWAY, "ARKVORY_GATEWAY_SLOT": "0"},
         ("ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..2", "0")),
    case("gateway-slot-equals-slots", {**GATEWAY, "ARKVORY_GATEWAY_SLOT": "3"},
         ("ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..2", "3")),
    case("gateway-slot-above-slots", {**GATEWAY, "ARKVORY_GATEWAY_SLOT": "7"},
         ("ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..2", "7")),
    case("gateway-slot-16-of-16",
         {**GATEWAY, "ARKVORY_GATEWAY_SLOTS": "16", "ARKVORY_GATEWAY_SLOT": "16",
          "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(65536 * 16)},
         ("ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..15", "16")),
    # total rate bounds depend on the number of slots
    case("total-below-floor", {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "196607"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", TOTAL_FLOOR_3, "196607")),
    case("total-below-floor-gateway",
         {**GATEWAY, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "65536"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", TOTAL_FLOOR_3, "65536")),
    case("total-above-1TiB",
         {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(MAX_RATE + 1)},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", "at most 2^40", str(MAX_RATE + 1))),
    case("principal-total-below-floor",
         {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": "196607"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
          "0 (unlimited) or " + TOTAL_FLOOR_3, "196607")),
    case("principal-total-1",
         {**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": "1"},
         ("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL", "0 (unlimited)", "1")),
    # per-principal downloads cannot exceed the process's downloads
    case("max-downloads-per-principal-above-max",
         {"ARKVORY_MAX_DOWNLOADS": "8", "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "9"},
         ("ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL", "1..8", "9")),
    case("max-uploads-per-principal-above-max",
         {"ARKVORY_MAX_UPLOADS": "4", "ARKVORY_MAX_UPLOADS_PER_PRINCIPAL": "5"},
         ("ARKVORY_MAX_UPLOADS_PER_PRINCIPAL", "1..4", "5")),
    case("max-downloads-per-principal-above-max-1",
         {"ARKVORY_MAX_DOWNLOADS": "1", "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL": "2"},
         ("ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL", "1..1", "2")),
]


@pytest.fixture
def files(tmp_path: pathlib.Path) -> pathlib.Path:
    (tmp_path / "cert.pem").write_text("not really a certificate\n")
    (tmp_path / "key.pem").write_text("not really a key\n")
    return tmp_path


def refused_in_process(env: dict[str, str], capsys) -> subprocess.CompletedProcess:
    """What `arkvory serve` does first with its environment (`_settings_or_exit`), here in this
    process: the same exit status and stderr lines without a Python start per rule (~130 of
    them; the real process's refusal is proven by the tests below that run it)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        _settings_or_exit(env)
    return subprocess.CompletedProcess(["arkvory", "serve"], exited.value.code, "", capsys.readouterr().err)


@pytest.mark.parametrize(("overrides", "expected", "count"), SINGLE_RULES + CROSS_RULES)
def test_serve_refuses_bad_setting(files, overrides, expected, count, capsys):
    result = refused_in_process(base_env(files, **overrides), capsys)
    lines = problem_lines(result)
    for name, fragment, value in expected:
        assert_problem(lines, name, fragment, value)
    assert len(lines) == count, "\n".join(lines)


def test_several_problems_one_line_each(tmp_path):
    env = base_env(
        tmp_path,
        ARKVORY_DATA_DIR=None,
        ARKVORY_ROLE="boss",
        ARKVORY_PORT="99999",
        ARKVORY_MAX_UPLOADS="0",
        ARKVORY_TASK_RETENTION="forever",
        ARKVORY_PUBLIC_METRICS="perhaps",
        ARKVORY_LOG_FORMAT="xml",
        ARKVORY_TLS_CERT_FILE=NOWHERE,
    )
    lines = problem_lines(run_arkvory(env, "serve"))
    expected = [
        ("ARKVORY_ROLE", "api, reader", "boss"),
        ("ARKVORY_DATA_DIR", "required", ""),
        ("ARKVORY_PORT", "1..65535", "99999"),
        ("ARKVORY_MAX_UPLOADS", "1..32", "0"),
        ("ARKVORY_TASK_RETENTION", "duration", "forever"),
        ("ARKVORY_PUBLIC_METRICS", "true or false", "perhaps"),
        ("ARKVORY_LOG_FORMAT", "json, text", "xml"),
        ("ARKVORY_TLS_CERT_FILE", "existing readable file", NOWHERE),
    ]
    for name, fragment, value in expected:
        assert_problem(lines, name, fragment, value)
    assert len(lines) == len(expected), "\n".join(lines)


def test_several_shared_problems_at_once(tmp_path):
    env = base_env(
        tmp_path,
        ARKVORY_ROLE="reader",
        ARKVORY_GATEWAY_SLOTS="4",
        ARKVORY_GATEWAY_SLOT="0",
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND="1000",
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL="1000",
    )
    lines = problem_lines(run_arkvory(env, "serve"))
    floor = "at least 65536 x ARKVORY_GATEWAY_SLOTS (4)"
    assert_problem(lines, "ARKVORY_GATEWAY_SLOT", "a gateway uses slot 1..3", "0")
    assert_problem(lines, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", floor, "1000")
    assert_problem(lines, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL", floor, "1000")
    assert len(lines) == 3, "\n".join(lines)


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        pytest.param("postgresql://u:hunter2@127.0.0.1:1/none", None, id="valid-dsn"),
        pytest.param("mysql://u:hunter2@127.0.0.1:1/none", "mysql://u:***@127.0.0.1:1/none",
                     id="bad-scheme"),
        pytest.param("postgresql://u:hunter2@[::1/none", None, id="unparseable"),
        pytest.param("pg://127.0.0.1:1/none?user=u&password=hunter2",
                     "pg://127.0.0.1:1/none?user=u&password=***", id="password-in-query"),
    ],
)
def test_database_password_never_on_stderr(tmp_path, dsn, shown):
    env = base_env(tmp_path, ARKVORY_DATABASE_URL=dsn, ARKVORY_PORT="http")
    result = run_arkvory(env, "serve")
    lines = problem_lines(result)
    assert "hunter2" not in result.stderr + result.stdout
    assert_problem(lines, "ARKVORY_PORT", "1..65535", "http")
    if dsn.startswith("postgresql://u:hunter2@127"):
        assert len(lines) == 1, "\n".join(lines)
    else:
        assert_problem(lines, "ARKVORY_DATABASE_URL", "PostgreSQL URL", shown)
        assert len(lines) == 2, "\n".join(lines)


def _entry(token="t", key_id='"ci"', scopes='["read:*"]', digest=None) -> str:
    digest = digest if digest is not None else hashlib.sha256(token.encode()).hexdigest()
    return f'[[key]]\nid = {key_id}\nsha256 = "{digest}"\nscopes = {scopes}\n'


KEYS_FILES = [
    pytest.param(b"[[key]\nid = 'broken'\n", "cannot read", id="not-toml"),
    pytest.param(b"\xff\xfe[[key]]\n", "cannot read", id="not-utf8"),
    pytest.param(_entry(digest="abc").encode(), "expected 'sha256' as 64 hex digits",
                 id="short-digest"),
    pytest.param(_entry(key_id='""').encode(), "expected a non-empty string 'id'", id="empty-id"),
    pytest.param(_entry(key_id="7").encode(), "expected a non-empty string 'id'",
                 id="id-not-string"),
    pytest.param(_entry(scopes='["root"]').encode(), "expected 'scopes' as a list",
                 id="unknown-scope"),
    pytest.param(_entry(scopes='"admin"').encode(), "expected 'scopes' as a list",
                 id="scopes-not-list"),
    pytest.param((_entry("a") + "\n" + _entry("a", key_id='"other"')).encode(),
                 "the same token digest appears twice", id="duplicate-digest"),
    pytest.param(b'key = "admin"\n', "ARKVORY_KEYS_FILE", id="key-not-array-of-tables"),
    pytest.param(b'[key]\nid = "ci"\n', "ARKVORY_KEYS_FILE", id="key-single-table"),
]


@pytest.mark.parametrize(("content", "fragment"), KEYS_FILES)
def test_keys_file_refused(tmp_path, content, fragment):
    """Checked after the settings and before any connection (cmd_serve)."""
    keys = tmp_path / "keys.toml"
    keys.write_bytes(content)
    result = run_arkvory(base_env(tmp_path, ARKVORY_KEYS_FILE=str(keys)), "serve")
    lines = problem_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{PREFIX}ARKVORY_KEYS_FILE: "), result.stderr
    assert fragment in lines[0], result.stderr
    assert str(keys) in lines[0], result.stderr


def test_settings_problems_come_before_keys_file(tmp_path):
    keys = tmp_path / "keys.toml"
    keys.write_text("not toml at all [")
    env = base_env(tmp_path, ARKVORY_KEYS_FILE=str(keys), ARKVORY_MAX_DOWNLOADS="0")
    lines = problem_lines(run_arkvory(env, "serve"))
    assert_problem(lines, "ARKVORY_MAX_DOWNLOADS", "1..256", "0")
    assert len(lines) == 1, "\n".join(lines)


# ---- Settings.from_env: accepted values and derived values -----------------------------------


def settings(**env: str) -> Settings:
    environ = {"ARKVORY_DATABASE_URL": DSN, "ARKVORY_DATA_DIR": "/srv/arkvory", **env}
    return Settings.from_env(environ)


def test_defaults():
    s = settings()
    assert (s.role, s.is_writer, s.slot, s.shared) == ("api", True, 0, None)
    assert s.database_pool_size == 10
    assert s.data_dir == pathlib.Path("/srv/arkvory")
    assert (s.keys_file, s.tls_cert_file, s.tls_key_file) == (None, None, None)
    assert (s.host, s.port) == ("127.0.0.1", 8080)
    assert (s.download_bytes_per_second, s.download_bytes_per_second_per_principal) == (0, 0)
    assert (s.max_downloads, s.max_downloads_per_principal) == (16, 4)
    assert (s.download_queue_size, s.download_queue_timeout_ms, s.max_uploads) == (64, 20000, 2)
    assert (s.task_retention_s, s.idempotency_retention_s) == (7 * 86400, 86400)
    assert (s.allow_signup, s.public_metrics) == (False, False)
    assert (s.log_format, s.log_level, s.access_log) == ("text", "info", "off")
    assert (s.max_uploads_per_principal, s.min_upload_bytes_per_second) == (1, 1024)
    assert s.max_reserved_bytes_per_principal == s.max_artifact_bytes == 64 * 1024**3
    assert s.trusted_proxies == ()
    assert (s.max_tokens_per_account, s.max_sessions_per_account) == (100, 100)


def test_per_principal_upload_limits_follow_the_totals():
    assert settings(ARKVORY_MAX_UPLOADS="8").max_uploads_per_principal == 4
    assert settings(ARKVORY_MAX_UPLOADS="1").max_uploads_per_principal == 1
    s = settings(ARKVORY_MAX_ARTIFACT_BYTES="1000")
    assert s.max_reserved_bytes_per_principal == 1000


@pytest.mark.parametrize(("value", "kept"), [
    ("https://artifacts.example.com", "https://artifacts.example.com"),
    ("https://artifacts.example.com/", "https://artifacts.example.com"),
    ("http://127.0.0.1:8081", "http://127.0.0.1:8081"),
    ("https://example.com/arkvory/", "https://example.com/arkvory"),
    ("http://[::1]:8081", "http://[::1]:8081"),
])
def test_public_url_is_kept_without_its_trailing_slash(value, kept):
    assert settings(ARKVORY_PUBLIC_URL=value).public_url == kept
    assert settings().public_url is None


def test_trusted_proxies_are_networks():
    s = settings(ARKVORY_TRUSTED_PROXIES="10.0.0.1, 192.168.0.0/16 ::1")
    assert [str(n) for n in s.trusted_proxies] == ["10.0.0.1/32", "192.168.0.0/16", "::1/128"]


def test_client_variables_are_known_to_every_process():
    s = settings(ARKVORY_URL="http://x", ARKVORY_TOKEN="t", ARKVORY_PROFILE="p")
    assert s.role == "api"


def test_standalone_is_unlimited():
    s = settings()
    assert s.shared is None
    assert s.process_bytes_per_second is None
    assert s.principal_bytes_per_second is None


def test_standalone_local_limits_apply():
    s = settings(
        ARKVORY_DOWNLOAD_BYTES_PER_SECOND="1000",
        ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL="300",
    )
    assert s.shared is None
    assert (s.process_bytes_per_second, s.principal_bytes_per_second) == (1000, 300)


def test_blank_values_mean_default():
    s = settings(ARKVORY_PORT="", ARKVORY_GATEWAY_SLOTS=" ", ARKVORY_LOG_LEVEL="")
    assert (s.port, s.shared, s.log_level) == (8080, None, "info")


def test_share_is_total_divided_by_slots():
    s = settings(**SHARED)
    assert s.shared is not None
    assert (s.shared.slots, s.shared.slot, s.shared.total_bytes_per_second) == (3, 0, 3_000_000)
    assert s.shared.share_bytes_per_second == 1_000_000
    assert s.process_bytes_per_second == 1_000_000
    odd = settings(**{**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "3000002"})
    assert odd.process_bytes_per_second == 1_000_000  # floor division


@pytest.mark.parametrize(("local", "expected"), [("0", 1_000_000), ("400000", 400_000),
                                                 ("999999", 999_999), ("1000000", 1_000_000),
                                                 ("2000000", 1_000_000)])
def test_local_limit_lowers_but_never_raises_share(local, expected):
    s = settings(**SHARED, ARKVORY_DOWNLOAD_BYTES_PER_SECOND=local)
    assert s.process_bytes_per_second == expected


def test_principal_share_unlimited_by_default():
    s = settings(**SHARED)
    assert s.shared is not None and s.shared.per_principal_bytes_per_second == 0
    assert s.principal_bytes_per_second is None
    explicit_zero = settings(**SHARED, ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL="0")
    assert explicit_zero.shared.per_principal_bytes_per_second == 0
    assert explicit_zero.principal_bytes_per_second is None
    local_only = settings(**SHARED, ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL="5000")
    assert local_only.principal_bytes_per_second == 5000


@pytest.mark.parametrize(("local", "expected"), [("0", 200_000), ("50000", 50_000),
                                                 ("200000", 200_000), ("900000", 200_000)])
def test_principal_share_lowered_but_never_raised(local, expected):
    s = settings(
        **SHARED,
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL="600000",
        ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL=local,
    )
    assert s.shared.principal_share_bytes_per_second == 200_000
    assert s.principal_bytes_per_second == expected
    assert s.process_bytes_per_second == 1_000_000  # the process share is independent


def test_rate_bounds_are_inclusive():
    floor = settings(**{**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(65536 * 3),
                        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": str(65536 * 3)})
    assert floor.process_bytes_per_second == 65536
    assert floor.principal_bytes_per_second == 65536
    top = settings(**{**SHARED, "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": str(MAX_RATE),
                      "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL": str(MAX_RATE),
                      "ARKVORY_DOWNLOAD_BYTES_PER_SECOND": str(MAX_RATE)})
    assert top.shared.total_bytes_per_second == MAX_RATE
    assert top.process_bytes_per_second == MAX_RATE // 3


@pytest.mark.parametrize(("slots", "slot"), [("2", "1"), ("3", "2"), ("16", "15"), ("16", "1")])
def test_gateway_slots_accepted(slots, slot):
    s = settings(
        ARKVORY_ROLE="reader",
        ARKVORY_GATEWAY_SLOTS=slots,
        ARKVORY_GATEWAY_SLOT=slot,
        ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND=str(65536 * int(slots)),
    )
    assert (s.is_writer, s.slot, s.shared.slots) == (False, int(slot), int(slots))


def test_max_downloads_per_principal_default_follows_max():
    assert settings(ARKVORY_MAX_DOWNLOADS="2").max_downloads_per_principal == 2
    assert settings(ARKVORY_MAX_DOWNLOADS="8").max_downloads_per_principal == 4
    equal = settings(ARKVORY_MAX_DOWNLOADS="8", ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL="8")
    assert equal.max_downloads_per_principal == 8


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("90m", 5400), ("24h", 86400),
                                               ("7d", 604800)])
def test_durations(text, seconds):
    s = settings(ARKVORY_TASK_RETENTION=text, ARKVORY_IDEMPOTENCY_RETENTION=text)
    assert s.task_retention_s == s.idempotency_retention_s == seconds


@pytest.mark.parametrize(("text", "value"), [("true", True), ("TRUE", True), ("1", True),
                                             ("yes", True), ("on", True), ("false", False),
                                             ("0", False), ("no", False), ("Off", False)])
def test_booleans(text, value):
    s = settings(ARKVORY_ALLOW_SIGNUP=text, ARKVORY_PUBLIC_METRICS=text)
    assert s.allow_signup is s.public_metrics is value


def test_log_level_case_folded():
    assert settings(ARKVORY_LOG_LEVEL="DEBUG", ARKVORY_LOG_FORMAT="json").log_level == "debug"


def test_tls_pair_and_files_accepted(files):
    s = settings(
        ARKVORY_TLS_CERT_FILE=str(files / "cert.pem"),
        ARKVORY_TLS_KEY_FILE=str(files / "key.pem"),
        ARKVORY_KEYS_FILE=str(files / "key.pem"),
    )
    assert s.tls_cert_file == files / "cert.pem"
    assert s.tls_key_file == files / "key.pem"


def test_repr_masks_password():
    s = settings(ARKVORY_DATABASE_URL="postgresql://u:hunter2@db.example:5432/arkvory")
    assert s.database_url == "postgresql://u:hunter2@db.example:5432/arkvory"
    for text in (repr(s), str(s), f"{s}", f"{s!r}"):
        assert "hunter2" not in text
        assert "postgresql://u:***@db.example:5432/arkvory" in text
    query = settings(ARKVORY_DATABASE_URL="postgresql://db.example/arkvory?password=hunter2")
    assert "hunter2" not in repr(query)


def test_settings_error_lists_every_problem():
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({"ARKVORY_PORT": "0"})
    names = [line.split(":", 1)[0] for line in caught.value.problems]
    assert names == ["ARKVORY_DATABASE_URL", "ARKVORY_DATA_DIR", "ARKVORY_PORT"]
    assert str(caught.value) == "\n".join(caught.value.problems)


def test_an_invalid_slot_count_does_not_hide_other_shared_problems():
    environ = {
        "ARKVORY_DATABASE_URL": "postgresql://arkvory@127.0.0.1:1/none",
        "ARKVORY_DATA_DIR": "/srv/arkvory",
        "ARKVORY_GATEWAY_SLOTS": "x",
        "ARKVORY_GATEWAY_SLOT": "y",
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND": "5",
    }
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(environ)
    named = [line.split(":")[0] for line in caught.value.problems]
    assert named == [
        "ARKVORY_GATEWAY_SLOTS",
        "ARKVORY_GATEWAY_SLOT",
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
    ]


@pytest.mark.parametrize("slot", [None, "1"], ids=["no slot", "a gateway's slot"])
def test_a_gateway_started_without_its_role_is_told_it_runs_as_the_writer(slot):
    """Started by hand with common.env alone (or plus its slot), a gateway is the writer by the
    default role: the line names ARKVORY_ROLE=reader, not only the slot."""
    environ = {"ARKVORY_DATABASE_URL": DSN, "ARKVORY_DATA_DIR": "/srv/arkvory", **SHARED}
    environ.pop("ARKVORY_GATEWAY_SLOT")
    if slot is not None:
        environ["ARKVORY_GATEWAY_SLOT"] = slot
    with pytest.raises(SettingsError) as caught:
        Settings.from_env(environ)
    (line,) = caught.value.problems
    assert line.startswith("ARKVORY_GATEWAY_SLOT: ")
    assert "ARKVORY_ROLE is not set" in line and "ARKVORY_ROLE=reader" in line
    # With the role given, the line is about the slot alone.
    with pytest.raises(SettingsError) as caught:
        Settings.from_env({**environ, "ARKVORY_ROLE": "api"})
    assert "ARKVORY_ROLE is not set" not in caught.value.problems[0]
