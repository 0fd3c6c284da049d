"""The one settings object every Arkvory process is built from (SPEC §2).

`Settings.from_env(environ)` reads every variable, collects *all* problems and raises one
`SettingsError` listing them, so an operator fixes a broken unit file in one round.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import pathlib
import re
import urllib.parse
from collections.abc import Mapping
from typing import Any

MiB = 1024 * 1024
MIN_SHARE_PER_SLOT = 65_536
MAX_RATE = 2**40  # 1 TiB/s
SHARE_MODES = ("static", "demand")

_SHARED_VARIABLES = (
    "ARKVORY_GATEWAY_SLOTS",
    "ARKVORY_GATEWAY_SLOT",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
    "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
)
_DURATION = re.compile(r"^([1-9][0-9]*)([smhd])$")
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
# What a base URL may hold: letters, digits, and the URL syntax a host, port and path need (an
# IPv6 host's brackets, percent-escapes); never a quote, space, query or fragment.
_BASE_URL_CHARACTERS = re.compile(r"[A-Za-z0-9._~:/%+\-\[\]]+")
_URL_VARIABLES = frozenset({"ARKVORY_DATABASE_URL", "ARKVORY_PUBLIC_URL"})  # shown masked in a problem

# Every ARKVORY_* name a process may meet in its environment: its own settings (read below), the
# client's (`arkvory get/put`, which a user may have exported in the same shell) and the `weed`
# binary of `arkvory dev --storage s3` (shared/cli/seaweedfs.py). Any other ARKVORY_* name is a
# typo, and a typo must not fall back to a default silently.
CLIENT_VARIABLES = frozenset({"ARKVORY_URL", "ARKVORY_TOKEN", "ARKVORY_PROFILE", "ARKVORY_WEED"})


# The object store's credentials (SPEC §11): the standard AWS variables, not ARKVORY_ ones. Read
# here so that a process pointed at S3 sees them in one place; never shown in a message or repr.
AWS_ACCESS_KEY_ID = "AWS_ACCESS_KEY_ID"
AWS_SECRET_ACCESS_KEY = "AWS_SECRET_ACCESS_KEY"
AWS_SESSION_TOKEN = "AWS_SESSION_TOKEN"
DEFAULT_S3_REGION = "us-east-1"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_REGION = re.compile(r"[a-z0-9-]{1,64}")


class SettingsError(Exception):
    """One or more environment variables are invalid; `problems` has one line each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True)
class SharedDownloads:
    """The shared-download policy this process was started with (SPEC §4)."""

    slots: int
    slot: int
    total_bytes_per_second: int
    per_principal_bytes_per_second: int  # 0 = unlimited
    # `static`: every process `total // slots` for ever; `demand`: shares follow the demand
    # (shared/cluster/grants.py). Saved in the policy like the rates.
    share_mode: str = "static"

    @property
    def policy(self) -> tuple[int, int, int, str]:
        """What the saved policy row must equal: slots, total, per-principal total, mode."""
        return (self.slots, self.total_bytes_per_second, self.per_principal_bytes_per_second, self.share_mode)

    @property
    def share_bytes_per_second(self) -> int:
        return self.total_bytes_per_second // self.slots

    @property
    def principal_share_bytes_per_second(self) -> int:
        return self.per_principal_bytes_per_second // self.slots


@dataclasses.dataclass(frozen=True)
class ObjectStoreSettings:
    """Where blobs live when they are on an S3-compatible object store (SPEC §11)."""

    bucket: str
    prefix: str = ""  # "" or "some/path" (no slash at either end)
    endpoint_url: str | None = None  # None: AWS
    region: str = DEFAULT_S3_REGION
    access_key_id: str | None = None  # None: the usual AWS credential chain
    secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    session_token: str | None = dataclasses.field(default=None, repr=False)

    def __repr__(self) -> str:
        secret = "***" if self.secret_access_key else None
        token = "***" if self.session_token else None
        return (
            f"ObjectStoreSettings(url={self.url!r}, endpoint_url={self.endpoint_url!r},"
            f" region={self.region!r}, access_key_id={self.access_key_id!r},"
            f" secret_access_key={secret!r}, session_token={token!r})"
        )

    @property
    def url(self) -> str:
        """`s3://BUCKET[/PREFIX]`: what the database records as the storage's location."""
        return f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")


@dataclasses.dataclass(frozen=True)
class Settings:
    role: str
    database_url: str = dataclasses.field(repr=False)
    data_dir: pathlib.Path
    database_pool_size: int = 10
    keys_file: pathlib.Path | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    tls_cert_file: pathlib.Path | None = None
    tls_key_file: pathlib.Path | None = None
    shared: SharedDownloads | None = None
    download_bytes_per_second: int = 0
    download_bytes_per_second_per_principal: int = 0
    max_downloads: int = 16
    max_downloads_per_principal: int = 4
    download_queue_size: int = 64
    download_queue_timeout_ms: int = 20_000
    max_uploads: int = 2
    max_uploads_per_principal: int = 1
    min_upload_bytes_per_second: int = 1024  # 0: no minimum rate
    max_reserved_bytes_per_principal: int = 64 * 1024**3
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    task_retention_s: int = 7 * 86400
    idempotency_retention_s: int = 86400
    audit_retention_s: int = 365 * 86400
    allow_signup: bool = False
    public_metrics: bool = False
    log_format: str = "text"
    log_level: str = "info"
    access_log: str = "off"  # off | text | json (docs/configuration.md says why off)
    drain_timeout_s: int = 30
    send_timeout_s: int = 60
    receive_timeout_s: int = 60
    max_artifact_bytes: int = 64 * 1024**3
    min_free_bytes: int = 1024**3
    upload_expiry_s: int = 86400
    session_lifetime_s: int = 12 * 3600
    max_tokens_per_account: int = 100
    max_sessions_per_account: int = 100
    cleanup_interval_s: int = 3600  # 0: the writer dispatches no cleanup on its own
    verify_interval_s: int = 0  # 0: no scheduled verify
    cleanup_grace_s: int = 3600
    verify_bytes_per_second: int = 64 * 1024 * 1024  # 0: unthrottled
    worker_port: int = 8090
    # None: blobs in the storage directory ARKVORY_DATA_DIR (`file:`); else on an object store,
    # with ARKVORY_DATA_DIR the host's local state (upload parts, the read cache).
    object_store: ObjectStoreSettings | None = None
    cache_max_bytes: int = 0  # the read cache of object-store blobs; 0 = off
    # Where clients download from (the balancer's address, in `arkvory dev` the first gateway's):
    # the writer cannot guess it, and its console shows download URLs and commands with it.
    public_url: str | None = None

    def __repr__(self) -> str:
        # The DSN may carry a password: show it masked, never raw.
        fields = ", ".join(
            f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr
        )
        return f"Settings(database_url={mask_url(self.database_url)!r}, {fields})"

    @property
    def is_writer(self) -> bool:
        return self.role == "api"

    @property
    def storage_url(self) -> str:
        """`file:` or `s3://BUCKET[/PREFIX]`: never a path or a credential."""
        return "file:" if self.object_store is None else self.object_store.url

    @property
    def slot(self) -> int:
        return self.shared.slot if self.shared else 0

    @property
    def process_bytes_per_second(self) -> int | None:
        """This process's payload rate: its share, lowered by a local limit; None = unlimited."""
        share = self.shared.share_bytes_per_second if self.shared else None
        return _lowest(share, self.download_bytes_per_second)

    @property
    def principal_bytes_per_second(self) -> int | None:
        share = None
        if self.shared and self.shared.per_principal_bytes_per_second:
            share = self.shared.principal_share_bytes_per_second
        return _lowest(share, self.download_bytes_per_second_per_principal)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Settings:
        reader = _Reader(environ)
        role = reader.choice("ARKVORY_ROLE", ("api", "reader"), "api")
        database_url = reader.database_url("ARKVORY_DATABASE_URL")
        data_dir = reader.required("ARKVORY_DATA_DIR")
        max_downloads = reader.integer("ARKVORY_MAX_DOWNLOADS", 1, 256, 16)
        max_uploads = reader.integer("ARKVORY_MAX_UPLOADS", 1, 32, 2)
        max_artifact_bytes = reader.integer(
            "ARKVORY_MAX_ARTIFACT_BYTES", 1, 2**50, 64 * 1024**3
        )
        values: dict[str, Any] = dict(
            role=role,
            database_url=database_url,
            data_dir=pathlib.Path(data_dir) if data_dir else pathlib.Path(),
            database_pool_size=reader.integer("ARKVORY_DATABASE_POOL_SIZE", 1, 200, 10),
            keys_file=reader.existing_file("ARKVORY_KEYS_FILE"),
            host=reader.text("ARKVORY_HOST", "127.0.0.1"),
            port=reader.integer("ARKVORY_PORT", 1, 65535, 8080),
            tls_cert_file=reader.existing_file("ARKVORY_TLS_CERT_FILE"),
            tls_key_file=reader.existing_file("ARKVORY_TLS_KEY_FILE"),
            shared=_shared_downloads(reader, role),
            download_bytes_per_second=reader.integer(
                "ARKVORY_DOWNLOAD_BYTES_PER_SECOND", 0, MAX_RATE, 0
            ),
            download_bytes_per_second_per_principal=reader.integer(
                "ARKVORY_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL", 0, MAX_RATE, 0
            ),
            max_downloads=max_downloads,
            max_downloads_per_principal=reader.integer(
                "ARKVORY_MAX_DOWNLOADS_PER_PRINCIPAL",
                1,
                max_downloads or 256,
                min(4, max_downloads or 4),
            ),
            download_queue_size=reader.integer("ARKVORY_DOWNLOAD_QUEUE_SIZE", 1, 1024, 64),
            download_queue_timeout_ms=reader.integer(
                "ARKVORY_DOWNLOAD_QUEUE_TIMEOUT_MS", 1, 120_000, 20_000
            ),
            max_uploads=max_uploads,
            # One principal never holds every upload place (SPEC §2): half of them by default.
            max_uploads_per_principal=reader.integer(
                "ARKVORY_MAX_UPLOADS_PER_PRINCIPAL",
                1,
                max_uploads or 32,
                max(1, (max_uploads or 2) // 2),
            ),
            # Like Apache's mod_reqtimeout MinRate: a trickling body gives its place back.
            min_upload_bytes_per_second=reader.integer(
                "ARKVORY_MIN_UPLOAD_BYTES_PER_SECOND", 0, MAX_RATE, 1024
            ),
            # Disk that one principal's open upload sessions may reserve: by default one
            # largest upload in flight, so one user cannot take the whole disk.
            max_reserved_bytes_per_principal=reader.integer(
                "ARKVORY_MAX_RESERVED_BYTES_PER_PRINCIPAL",
                1,
                2**50,
                max_artifact_bytes or 64 * 1024**3,
            ),
            trusted_proxies=reader.networks("ARKVORY_TRUSTED_PROXIES"),
            task_retention_s=reader.duration("ARKVORY_TASK_RETENTION", "7d"),
            idempotency_retention_s=reader.duration("ARKVORY_IDEMPOTENCY_RETENTION", "24h"),
            # A year: what audit standards ask to keep (PCI DSS 10.5.1: twelve months), at about
            # 0.8 KiB an entry with its indexes (docs/operations.md "Audit trail").
            audit_retention_s=reader.duration("ARKVORY_AUDIT_RETENTION", "365d"),
            allow_signup=reader.boolean("ARKVORY_ALLOW_SIGNUP", False),
            public_metrics=reader.boolean("ARKVORY_PUBLIC_METRICS", False),
            log_format=reader.choice("ARKVORY_LOG_FORMAT", ("json", "text"), "text"),
            log_level=reader.choice("ARKVORY_LOG_LEVEL", _LOG_LEVELS, "info", fold_case=True),
            access_log=reader.choice("ARKVORY_ACCESS_LOG", ("off", "text", "json"), "off"),
            drain_timeout_s=reader.integer("ARKVORY_DRAIN_TIMEOUT_SECONDS", 0, 600, 30),
            # Like nginx's send_timeout / client_body_timeout: a peer that moves no byte for
            # this long gives its place back.
            send_timeout_s=reader.integer("ARKVORY_SEND_TIMEOUT_SECONDS", 1, 3600, 60),
            receive_timeout_s=reader.integer("ARKVORY_RECEIVE_TIMEOUT_SECONDS", 1, 3600, 60),
            max_artifact_bytes=max_artifact_bytes,
            # Uploads stop short of filling the disk: this much stays free for everything else.
            min_free_bytes=reader.integer("ARKVORY_MIN_FREE_BYTES", 0, 2**50, 1024**3),
            upload_expiry_s=reader.duration("ARKVORY_UPLOAD_EXPIRY", "24h"),
            session_lifetime_s=reader.duration("ARKVORY_SESSION_LIFETIME", "12h"),
            # No account fills the credentials table (HOUSE_STYLE: every shared place has a
            # per-principal share): live personal tokens past this are refused (409) ...
            max_tokens_per_account=reader.integer("ARKVORY_MAX_TOKENS_PER_ACCOUNT", 1, 10_000, 100),
            # ... and a login past this many live sessions ends the account's oldest one.
            max_sessions_per_account=reader.integer("ARKVORY_MAX_SESSIONS_PER_ACCOUNT", 1, 10_000, 100),
            cleanup_interval_s=reader.optional_duration("ARKVORY_CLEANUP_INTERVAL", "1h"),
            verify_interval_s=reader.optional_duration("ARKVORY_VERIFY_INTERVAL", "off"),
            # A blob unreferenced for less than this is kept: an upload may be about to use it.
            cleanup_grace_s=reader.duration("ARKVORY_CLEANUP_GRACE", "1h"),
            verify_bytes_per_second=reader.integer(
                "ARKVORY_VERIFY_BYTES_PER_SECOND", 0, MAX_RATE, 64 * 1024 * 1024
            ),
            worker_port=reader.integer("ARKVORY_WORKER_PORT", 1, 65535, 8090),
            object_store=_object_store(reader),
            cache_max_bytes=reader.integer("ARKVORY_CACHE_MAX_BYTES", 0, 2**50, 0),
            public_url=reader.base_url("ARKVORY_PUBLIC_URL"),
        )
        storage_failed = "ARKVORY_STORAGE_URL" in reader.failed
        if values["cache_max_bytes"] and values["object_store"] is None and not storage_failed:
            reader.problem(
                "ARKVORY_CACHE_MAX_BYTES",
                "expected 0 (off) with ARKVORY_STORAGE_URL=file: (the read cache keeps copies of "
                "object-store blobs; a storage directory is read directly)",
            )
        cert, key = values["tls_cert_file"], values["tls_key_file"]
        tls_failed = {"ARKVORY_TLS_CERT_FILE", "ARKVORY_TLS_KEY_FILE"} & reader.failed
        if (cert is None) != (key is None) and not tls_failed:
            reader.problem(
                "ARKVORY_TLS_KEY_FILE" if key is None else "ARKVORY_TLS_CERT_FILE",
                "expected ARKVORY_TLS_CERT_FILE and ARKVORY_TLS_KEY_FILE to be set together",
            )
        reader.refuse_unknown(CLIENT_VARIABLES)
        if reader.problems:
            raise SettingsError(reader.problems)
        return cls(**values)


def _object_store(reader: _Reader) -> ObjectStoreSettings | None:
    """ARKVORY_STORAGE_URL and, for `s3://`, its endpoint, region and the AWS credentials."""
    url = reader.text("ARKVORY_STORAGE_URL", "file:")
    endpoint = reader._raw("ARKVORY_S3_ENDPOINT_URL")
    region = reader._raw("ARKVORY_S3_REGION")
    if url == "file:":
        for name, value in (("ARKVORY_S3_ENDPOINT_URL", endpoint), ("ARKVORY_S3_REGION", region)):
            if value is not None:
                reader.problem(name, "expected to be unset with ARKVORY_STORAGE_URL=file: (set "
                               "ARKVORY_STORAGE_URL=s3://BUCKET[/PREFIX] to use an object store)")
        return None
    try:
        bucket, prefix = parse_storage_url(url)
    except ValueError as exc:
        reader.problem("ARKVORY_STORAGE_URL", str(exc), show_value=False)
        return None
    if endpoint is not None:
        try:
            endpoint = check_endpoint(endpoint)
        except ValueError as exc:
            reader.problem("ARKVORY_S3_ENDPOINT_URL", str(exc), show_value=False)
    if region is not None and not _REGION.fullmatch(region):
        reader.problem("ARKVORY_S3_REGION", "expected a region name such as us-east-1")
    environ = reader.environ
    access = (environ.get(AWS_ACCESS_KEY_ID) or "").strip() or None
    secret = environ.get(AWS_SECRET_ACCESS_KEY) or None
    if (access is None) != (secret is None):
        missing, present = (
            (AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID) if secret is None else (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)
        )
        # Never the value: it is a credential.
        reader.problem(missing, f"not set, but {present} is; set both or neither", show_value=False)
    return ObjectStoreSettings(
        bucket=bucket, prefix=prefix, endpoint_url=endpoint, region=region or DEFAULT_S3_REGION,
        access_key_id=access, secret_access_key=secret,
        session_token=(environ.get(AWS_SESSION_TOKEN) or None) if access else None,
    )


# The settings of the one storage a process uses; `arkvory admin migrate-storage` names two.
STORAGE_VARIABLES = ("ARKVORY_STORAGE_URL", "ARKVORY_S3_ENDPOINT_URL", "ARKVORY_S3_REGION", "ARKVORY_CACHE_MAX_BYTES")


def object_store_for(environ: Mapping[str, str], url: str, *, name: str = "--to") -> ObjectStoreSettings | None:
    """The storage `url` names: None for `file:`; for `s3://BUCKET[/PREFIX]` its settings, with
    the endpoint, region and AWS credentials of `environ`. For `arkvory admin migrate-storage`,
    whose two sides cannot both be ARKVORY_STORAGE_URL. SettingsError listing every problem;
    a bad `url` is named as `name`."""
    if url == "file:":
        return None
    try:
        parse_storage_url(url)
    except ValueError as exc:
        raise SettingsError([f"{name}: {exc}"]) from None
    reader = _Reader({**environ, "ARKVORY_STORAGE_URL": url})
    found = _object_store(reader)
    if reader.problems:
        raise SettingsError(reader.problems)
    return found


def parse_storage_url(url: str) -> tuple[str, str]:
    """`s3://BUCKET[/PREFIX]` -> (bucket, prefix without slashes at either end); ValueError
    saying what is expected (without the variable's name)."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "s3" or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"expected file: or s3://BUCKET[/PREFIX], got {_shown_url(url)!r}")
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not _BUCKET.fullmatch(bucket) or ".." in bucket:
        raise ValueError(f"expected a bucket name of 3-63 characters a-z 0-9 . -, got {bucket!r}")
    segments = prefix.split("/") if prefix else []
    if any(s in ("", ".", "..") for s in segments) or any(ord(c) < 32 for c in prefix):
        raise ValueError(f"the prefix {prefix!r} has an empty, '.' or '..' segment")
    return bucket, prefix


def _shown_url(url: str) -> str:
    # A URL with user:password@ would show a secret: only its scheme then.
    return url if "@" not in url else url.split(":", 1)[0] + "://***"


def check_endpoint(url: str) -> str:
    """An http(s)://HOST[:PORT] endpoint without credentials, trailing slash removed; ValueError
    saying what is expected (without the value when it may hold a secret)."""
    try:
        parts = urllib.parse.urlsplit(url)
        has_credentials = parts.username is not None or parts.password is not None
    except ValueError:
        raise ValueError("expected http(s)://HOST[:PORT]") from None
    if has_credentials:
        raise ValueError(f"must not contain credentials; use {AWS_ACCESS_KEY_ID} and {AWS_SECRET_ACCESS_KEY}")
    try:
        port_ok = parts.port is None or 0 < parts.port < 65536
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok or parts.query:
        raise ValueError(f"expected http(s)://HOST[:PORT], got {url!r}")
    return url.rstrip("/")


def _shared_downloads(reader: _Reader, role: str) -> SharedDownloads | None:
    """Apply the cross-rules of SPEC §2 'Shared-download rules' in one place."""
    given = [name for name in _SHARED_VARIABLES if reader._raw(name) is not None]
    if not given:
        if reader.choice("ARKVORY_SHARE_MODE", SHARE_MODES, "static") == "demand":
            reader.problem(
                "ARKVORY_SHARE_MODE",
                "expected static (or unset) without the shared-download configuration: demand "
                "shares divide ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND among the slots",
            )
        if role == "reader":
            reader.problem(
                "ARKVORY_GATEWAY_SLOTS",
                "a gateway (ARKVORY_ROLE=reader) requires the shared-download configuration: "
                "ARKVORY_GATEWAY_SLOTS, ARKVORY_GATEWAY_SLOT and "
                "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND",
                show_value=False,
            )
        return None
    # A gateway started by hand with the common settings but not the unit's two lines runs as the
    # writer (the default role): say which variable makes it a gateway, not only that a slot is missing.
    role_hint = (
        "; ARKVORY_ROLE is not set, so this process is the writer (slot 0): a gateway needs "
        "ARKVORY_ROLE=reader and its ARKVORY_GATEWAY_SLOT (1..N), as the gateway unit sets them"
        if reader._raw("ARKVORY_ROLE") is None
        else ""
    )
    for name in _SHARED_VARIABLES[:3]:
        if reader._raw(name) is None:
            reader.problem(
                name,
                f"expected to be set because {', '.join(given)} is set "
                "(slot, slots and total rate go together)" + (role_hint if name == "ARKVORY_GATEWAY_SLOT" else ""),
                show_value=False,
            )
    slots = reader.integer("ARKVORY_GATEWAY_SLOTS", 2, 16, None)
    # Without a valid slot count, still check the others against the widest rule (16 slots),
    # so one run reports every problem.
    bound = slots or 16
    low, high = (0, 0) if role == "api" else (1, bound - 1)
    who = "the writer (ARKVORY_ROLE=api) is slot 0" + role_hint if role == "api" else (
        f"a gateway uses slot 1..{bound - 1}"
    )
    slot = reader.integer("ARKVORY_GATEWAY_SLOT", low, high, None, why=who)
    floor = MIN_SHARE_PER_SLOT * (slots or 2)
    why = (
        f"at least 65536 x ARKVORY_GATEWAY_SLOTS ({slots}) and at most 2^40"
        if slots
        else "at least 65536 x ARKVORY_GATEWAY_SLOTS and at most 2^40"
    )
    total = reader.integer("ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND", floor, MAX_RATE, None, why=why)
    per_principal = reader.integer(
        "ARKVORY_SHARED_DOWNLOAD_BYTES_PER_SECOND_PER_PRINCIPAL",
        floor,
        MAX_RATE,
        0,
        why="0 (unlimited) or " + why,
        allow_zero=True,
    )
    share_mode = reader.choice("ARKVORY_SHARE_MODE", SHARE_MODES, "static")
    if None in (slots, slot, total, per_principal):
        return None
    return SharedDownloads(slots, slot, total, per_principal, share_mode)


class _Reader:
    """Reads typed variables and records a `VAR: expected ..., got '...'` line per problem."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.problems: list[str] = []
        self.failed: set[str] = set()
        self.known: set[str] = set()  # every name looked up, for `refuse_unknown`

    def problem(self, name: str, expected: str, *, show_value: bool = True) -> None:
        self.failed.add(name)
        line = f"{name}: {expected}"
        if show_value:
            value = self.environ.get(name, "")
            if name in _URL_VARIABLES:
                value = mask_url(value)
            line += f", got {value!r}"
        self.problems.append(line)

    def _raw(self, name: str) -> str | None:
        self.known.add(name)
        value = self.environ.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def text(self, name: str, default: str) -> str:
        return self._raw(name) or default

    def required(self, name: str) -> str | None:
        value = self._raw(name)
        if value is None:
            self.problem(name, "required, expected a non-empty value")
        return value

    def database_url(self, name: str) -> str:
        value = self.required(name)
        if value is None:
            return ""
        try:
            parsed = urllib.parse.urlsplit(value)
            valid = parsed.scheme in ("postgres", "postgresql") and bool(
                parsed.hostname or parsed.query
            )
        except ValueError:
            valid = False
        if not valid:
            self.problem(name, "expected a PostgreSQL URL like postgresql://user@host:5432/db")
        return value

    def choice(
        self, name: str, allowed: tuple[str, ...], default: str, fold_case: bool = False
    ) -> str:
        value = self._raw(name)
        if value is None:
            return default
        candidate = value.lower() if fold_case else value
        if candidate not in allowed:
            self.problem(name, f"expected one of {', '.join(allowed)}")
            return default
        return candidate

    def integer(
        self,
        name: str,
        low: int,
        high: int,
        default: int | None,
        *,
        why: str | None = None,
        allow_zero: bool = False,
    ) -> int | None:
        value = self._raw(name)
        if value is None:
            return default
        expected = f"expected an integer in {low}..{high}" + (f" ({why})" if why else "")
        if why and allow_zero:
            expected = f"expected {why}"
        if not re.fullmatch(r"[0-9]{1,30}", value):
            self.problem(name, expected)
            return default
        number = int(value)
        if allow_zero and number == 0:
            return 0
        if not low <= number <= high:
            self.problem(name, expected)
            return default
        return number

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        if value.lower() in _TRUE:
            return True
        if value.lower() in _FALSE:
            return False
        self.problem(name, "expected true or false")
        return default

    def duration(self, name: str, default: str) -> int:
        value = self._raw(name) or default
        match = _DURATION.match(value)
        if match is None:
            self.problem(name, "expected a duration such as 7d, 24h, 90m or 30s")
            match = _DURATION.match(default)
        assert match is not None
        return int(match.group(1)) * _DURATION_UNITS[match.group(2)]

    def optional_duration(self, name: str, default: str) -> int:
        """A duration, or `off` for 0 (the feature is disabled)."""
        value = self._raw(name) or default
        if value.lower() == "off":
            return 0
        match = _DURATION.match(value)
        if match is None:
            self.problem(name, "expected a duration such as 7d, 24h, 90m or 30s, or off")
            value = default
            if value == "off":
                return 0
            match = _DURATION.match(value)
            assert match is not None
        return int(match.group(1)) * _DURATION_UNITS[match.group(2)]

    def networks(
        self, name: str
    ) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        """A comma- or space-separated list of addresses and CIDRs (an address is a /32 or /128)."""
        value = self._raw(name)
        if value is None:
            return ()
        networks = []
        for item in re.split(r"[,\s]+", value):
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                self.problem(name, "expected addresses or CIDRs separated by commas, e.g. 10.0.0.0/8,::1")
                return ()
        return tuple(networks)

    def refuse_unknown(self, also_known: frozenset[str]) -> None:
        """One problem per ARKVORY_* name that nothing reads, with the nearest known name."""
        known = self.known | also_known
        for name in sorted(self.environ):
            if not name.startswith("ARKVORY_") or name in known:
                continue
            nearest = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {nearest[0]}?" if nearest else ""
            self.problem(name, f"unknown variable{hint}", show_value=False)

    def base_url(self, name: str) -> str | None:
        """An http(s) address others reach this installation at, without a trailing slash: a
        scheme, a host, an optional port and path; no user, password, query or fragment (it is
        shown to users and prefixed to the API's paths)."""
        value = self._raw(name)
        if value is None:
            return None
        try:
            parts = urllib.parse.urlsplit(value)
            parts.port  # noqa: B018  (a port out of range or not a number raises here)
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme not in ("http", "https")
            or not parts.hostname
            or "@" in parts.netloc
            or not _BASE_URL_CHARACTERS.fullmatch(value)
        ):
            self.problem(
                name,
                "expected the http:// or https:// address clients download from, e.g. "
                "https://artifacts.example.com (a host, optional port and path; no user, query or fragment)",
            )
            return None
        return value.rstrip("/")

    def existing_file(self, name: str) -> pathlib.Path | None:
        value = self._raw(name)
        if value is None:
            return None
        path = pathlib.Path(value)
        if not path.is_file():
            self.problem(name, "expected a path to an existing readable file")
            return None
        return path


def _lowest(share: int | None, local_limit: int) -> int | None:
    if local_limit and share:
        return min(share, local_limit)
    return share or local_limit or None


def mask_url(url: str) -> str:
    """The URL with any password replaced by '***', for logs and messages."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<unparseable>"
    query = re.sub(r"(^|&)(password=)[^&]*", r"\1\2***", parts.query, flags=re.IGNORECASE)
    if parts.password is None and query == parts.query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        netloc = netloc.replace(":" + parts.password + "@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc, query=query))


def format_problems(error: SettingsError) -> str:
    return "\n".join(f"arkvory: invalid setting {line}" for line in error.problems)

