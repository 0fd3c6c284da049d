"""`arkvory login`, `arkvory token create|list|revoke` (issue 14 §4) and `arkvory key list|adopt|revoke`
(issue 22 §3): credentials without curl.

The real CLI in a subprocess against a real writer and gateway; the password comes through
standard input (what scripts do) and through a terminal (getpass, on a pty). Plus the config
file's rewriting: 0600 from the first byte, every value kept, comments kept in a backup.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import pty
import select
import stat
import subprocess
import time
import tomllib
import uuid

import pytest

from .harness import ADMIN_TOKEN, Cluster
from .test_cli import ARKVORY, arkvory, assert_exit, cli_env, json_of, unique_file

pytestmark = pytest.mark.timeout(180)

REPO = "builds"
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def stack(postgres, module_tmp_path):
    """A writer and a read gateway with a private `builds`."""
    group = Cluster(postgres.create_database(f"t_{uuid.uuid4().hex[:16]}"), module_tmp_path)
    try:
        shared = group.shared_env()
        writer = group.writer(shared).wait_ready()
        gateway = group.gateway(1, shared).wait_ready()
        with writer.client(ADMIN_TOKEN) as admin:
            assert admin.post("/api/v1/repositories", json={"name": REPO}).status_code == 201
        group.writer_process = writer
        group.urls = f"{gateway.url},{writer.url}"  # a gateway first, as a newcomer might list them
        yield group
    finally:
        group.close()


@pytest.fixture
def alice(stack) -> str:
    """A new account for each test (its tokens are its own), which may write to `builds`."""
    name = f"alice-{uuid.uuid4().hex[:8]}"
    with stack.writer_process.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/accounts", json={"name": name, "password": PASSWORD}).status_code == 201
        assert admin.put(f"/api/v1/repositories/{REPO}/permissions/{name}", json={"level": "write"}).status_code == 200
    return name


@pytest.fixture
def home(tmp_path) -> pathlib.Path:
    path = tmp_path / "home"
    path.mkdir()
    return path


def typed(env: dict[str, str], cwd: pathlib.Path, text: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI with `text` on its standard input (not a terminal: the password is its first line)."""
    return subprocess.run(
        [str(ARKVORY), *args], env=env, cwd=cwd, input=text, capture_output=True, text=True, timeout=90
    )


def config_of(home: pathlib.Path) -> pathlib.Path:
    return home / ".config" / "arkvory" / "config.toml"


def logged_in(stack, alice: str, home: pathlib.Path, tmp_path: pathlib.Path) -> str:
    run = typed(cli_env(home, stack.urls, token=None), tmp_path, PASSWORD + "\n", "login", alice)
    assert_exit(run, 0)
    return tomllib.loads(config_of(home).read_text())["profiles"]["default"]["token"]


def test_login_stores_a_token_readable_by_its_owner_only_and_put_then_works(stack, alice, home, tmp_path):
    run = typed(cli_env(home, stack.urls, token=None), tmp_path, PASSWORD + "\n", "login", alice)
    assert_exit(run, 0)
    path = config_of(home)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    profile = tomllib.loads(path.read_text())["profiles"]["default"]
    assert profile["url"] == stack.urls.split(",")
    token = profile["token"]
    assert token.startswith("pat_")
    assert token not in run.stdout + run.stderr and PASSWORD not in run.stdout + run.stderr
    assert f"logged in as {alice}" in run.stderr and "read-write" in run.stderr

    # Later commands need nothing but the config file: no ARKVORY_URL, no ARKVORY_TOKEN.
    bare = cli_env(home, None, token=None)
    source = unique_file(tmp_path, "after-login.bin", 10_000)
    put = arkvory(bare, tmp_path, "put", REPO, str(source))
    assert_exit(put, 0)
    (tmp_path / "out").mkdir()
    assert_exit(arkvory(bare, tmp_path / "out", "get", REPO, put.stdout.strip()), 0)
    assert (tmp_path / "out" / "after-login.bin").read_bytes() == source.read_bytes()

    # The session that made the token is ended: the token is alice's one new credential.
    listed = arkvory(bare, tmp_path, "token", "list", "--json")
    assert_exit(listed, 0)
    (item,) = json_of(listed)["tokens"]
    assert item["access"] == "read-write" and item["label"].startswith("arkvory login on ")
    expires = datetime.datetime.fromisoformat(item["expiresAt"])
    assert abs(expires - datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=90)) < datetime.timedelta(hours=1)


def test_a_wrong_password_exits_3_and_stores_nothing(stack, alice, home, tmp_path):
    run = typed(cli_env(home, stack.urls, token=None), tmp_path, "not the password\n", "login", alice)
    assert_exit(run, 3)
    assert "wrong account name or password" in run.stderr
    assert "ARKVORY_TOKEN" not in run.stderr  # no "set a token" hint: a login needs none
    assert not config_of(home).exists()


def test_login_makes_the_profile_it_is_given(stack, alice, home, tmp_path):
    """`login ACCOUNT --profile NAME` (or ARKVORY_PROFILE) stores its token in a new profile, on a
    machine without a config file as beside the profiles it holds: a second account on one machine."""
    env = cli_env(home, stack.urls, token=None)
    assert_exit(typed(env, tmp_path, PASSWORD + "\n", "login", alice, "--profile", "first"), 0)
    assert_exit(typed(env, tmp_path, PASSWORD + "\n", "login", alice, "--profile", "second"), 0)
    assert_exit(typed({**env, "ARKVORY_PROFILE": "third"}, tmp_path, PASSWORD + "\n", "login", alice), 0)
    profiles = tomllib.loads(config_of(home).read_text())["profiles"]
    assert sorted(profiles) == ["first", "second", "third"]
    assert len({profiles[name]["token"] for name in profiles}) == 3
    # Every other command still refuses a profile the file does not hold (a misspelt name).
    assert_exit(arkvory(cli_env(home, None, token=None), tmp_path, "ls", "--profile", "fourth", REPO), 2)
    listed = arkvory(cli_env(home, None, token=None), tmp_path, "ls", "--profile", "second", REPO)
    assert_exit(listed, 0)


def test_login_asks_for_the_password_on_a_terminal_without_echo(stack, alice, home, tmp_path):
    env = cli_env(home, stack.urls, token=None)
    pid, terminal = pty.fork()
    if pid == 0:  # the child: arkvory with the pty as its controlling terminal
        try:
            os.chdir(tmp_path)
            os.execve(str(ARKVORY), [str(ARKVORY), "login", alice, "--access", "read"], env)
        finally:
            os._exit(127)  # never back into pytest in a forked child
    seen = b""
    try:
        seen = _read_until(terminal, f"password for {alice}: ".encode())
        os.write(terminal, PASSWORD.encode() + b"\n")
        seen += _read_until(terminal, None)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0, seen
    assert PASSWORD.encode() not in seen  # not echoed
    token = tomllib.loads(config_of(home).read_text())["profiles"]["default"]["token"]
    listed = arkvory(cli_env(home, None, token=None), tmp_path, "token", "list", "--json")
    assert_exit(listed, 0)
    assert [t["access"] for t in json_of(listed)["tokens"]] == ["read"]
    # A read token is refused a put, said as a permission problem (exit 3).
    run = arkvory(cli_env(home, stack.urls, token=token), tmp_path, "put", REPO, str(unique_file(tmp_path, "r.bin", 100)))
    assert_exit(run, 3)


def _read_until(fd: int, marker: bytes | None, timeout: float = 60) -> bytes:
    """What the terminal shows until `marker` (None: until the program exits)."""
    seen, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker is not None and marker in seen:
            return seen
        ready, _, _ = select.select([fd], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the program exited and closed the terminal
            chunk = b""
        if not chunk:
            if marker is None:
                return seen
            break
        seen += chunk
    raise AssertionError(f"waited for {marker!r}, the terminal shows {seen!r}")


def test_token_create_list_revoke_and_a_revoked_token_is_refused(stack, alice, home, tmp_path):
    logged_in(stack, alice, home, tmp_path)
    env = cli_env(home, None, token=None)  # alice's login token, from the config file

    created = arkvory(env, tmp_path, "token", "create", "--access", "write", "--label", "ci", "--expires", "30d")
    assert_exit(created, 0)
    ci_token = created.stdout.strip()
    assert ci_token.startswith("pat_") and created.stdout.count(ci_token) == 1
    assert "shown only now" in created.stderr and ci_token not in created.stderr

    listed = arkvory(env, tmp_path, "token", "list")
    assert_exit(listed, 0)
    assert ci_token.split(".")[1] not in listed.stdout  # never a secret
    (ci_line,) = [line for line in listed.stdout.splitlines() if line.endswith("  ci")]
    ci_id = ci_line.split()[0]
    assert "read-write" in ci_line and uuid.UUID(ci_id)
    as_json = {t["id"]: t for t in json_of(arkvory(env, tmp_path, "token", "list", "--json"))["tokens"]}
    granted = datetime.datetime.fromisoformat(as_json[ci_id]["expiresAt"])
    assert abs(granted - datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=30)) < datetime.timedelta(hours=1)

    ci = cli_env(home, stack.urls, token=ci_token)
    assert_exit(arkvory(ci, tmp_path, "put", REPO, str(unique_file(tmp_path, "from-ci.bin", 1000))), 0)

    revoked = arkvory(env, tmp_path, "token", "revoke", ci_id)
    assert_exit(revoked, 0)
    assert f"revoked token {ci_id}" in revoked.stderr
    refused = arkvory(ci, tmp_path, "ls", REPO)
    assert_exit(refused, 3)
    assert ci_id not in {t["id"] for t in json_of(arkvory(env, tmp_path, "token", "list", "--json"))["tokens"]}


def test_a_token_outlives_its_maker_only_with_the_password(stack, alice, home, tmp_path):
    logged_in(stack, alice, home, tmp_path)  # a 90-day token
    env = cli_env(home, None, token=None)
    capped = arkvory(env, tmp_path, "token", "create", "--access", "read", "--expires", "200d")
    assert_exit(capped, 0)
    assert "expires with the credential that made it" in capped.stderr
    assert 88 <= days_left(env, tmp_path, capped.stdout.strip()) <= 90

    longer = typed(env, tmp_path, PASSWORD + "\n", "token", "create", "--access", "read", "--expires", "200d", "--password")
    assert_exit(longer, 0)
    assert "expires with the credential" not in longer.stderr
    assert 198 <= days_left(env, tmp_path, longer.stdout.strip()) <= 200


def days_left(env, cwd, token: str) -> int:
    """Whole days until the token expires, by `token list` (whose ids are in the tokens)."""
    token_id = str(uuid.UUID(token.removeprefix("pat_").split(".")[0]))
    listed = arkvory(env, cwd, "token", "list", "--json")
    assert_exit(listed, 0)
    (item,) = [t for t in json_of(listed)["tokens"] if t["id"] == token_id]
    return (datetime.datetime.fromisoformat(item["expiresAt"]) - datetime.datetime.now(datetime.timezone.utc)).days


def test_a_device_that_logged_in_before_is_not_locked_out_by_others_guesses(cluster, home, tmp_path):
    """Issue 22 §5: `login` keeps the writer's device cookie next to the token and sends it back,
    so guessers who lock the account out (from elsewhere: the writer believes the test's
    X-Forwarded-For as a balancer's) do not lock out this device."""
    import httpx

    from arkvory.writer.identity.login_limits import ACCOUNT_LIMIT

    writer = cluster.writer(ARKVORY_TRUSTED_PROXIES="127.0.0.1").wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/accounts", json={"name": "Dana", "password": PASSWORD}).status_code == 201
    env = cli_env(home, writer.url, token=None)
    assert_exit(typed(env, tmp_path, PASSWORD + "\n", "login", "Dana"), 0)
    path = config_of(home)
    first = tomllib.loads(path.read_text())["profiles"]["default"]["device_cookies"]["dana"]
    assert first.startswith("v1.") and stat.S_IMODE(path.stat().st_mode) == 0o600

    def guess(address: str, password: str = "not the password") -> int:
        with httpx.Client(base_url=writer.url, timeout=30, headers={"X-Forwarded-For": address}) as client:
            return client.post("/api/v1/login", json={"name": "dana", "password": password}).status_code

    assert [guess(f"203.0.113.{i + 1}") for i in range(ACCOUNT_LIMIT)] == [401] * ACCOUNT_LIMIT
    assert guess("203.0.113.99", PASSWORD) == 429  # dana is locked out for clients without a cookie...
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused = typed(cli_env(elsewhere, writer.url, token=None), tmp_path, PASSWORD + "\n", "login", "dana",
                    "--retries", "0")
    assert refused.returncode != 0 and "too many login attempts" in refused.stderr, refused.stderr
    # ...but this device signed in before: it signs in at once, in any spelling, and keeps a fresh cookie.
    again = typed(env, tmp_path, PASSWORD + "\n", "login", "DANA", "--retries", "0")
    assert_exit(again, 0)
    second = tomllib.loads(path.read_text())["profiles"]["default"]["device_cookies"]["dana"]
    assert second.startswith("v1.") and second != first


@pytest.mark.parametrize("args", [("token", "create", "--access", "write", "--expires", "367d"),
                                  ("token", "create", "--access", "admin"),
                                  ("token", "revoke", "not-an-id"),
                                  ("login",)])
def test_bad_token_arguments_exit_2(home, tmp_path, args):
    run = arkvory(cli_env(home, "http://127.0.0.1:1"), tmp_path, *args)
    assert_exit(run, 2)


# the config file ----------------------------------------------------------------------------------


def test_storing_a_profile_keeps_every_other_value_and_backs_up_comments(tmp_path):
    from arkvory.shared.client.cli_config_store import store_profile

    path = tmp_path / "arkvory" / "config.toml"
    path.parent.mkdir()
    original = (
        '# my servers\ndefault_profile = "prod"\n\n[profiles.prod]\nurl = "https://a.example"  # the balancer\n'
        'token = "pat_old"\n\n[profiles."odd name"]\nurl = ["http://b", "http://c"]\nretries = 3\n'
    )
    path.write_text(original)
    path.chmod(0o600)
    stored = store_profile(path, "dev", urls=("http://127.0.0.1:8081", "http://127.0.0.1:8080"), token="pat_new",
                           environ_profile=None)
    assert stored.profile == "dev" and stored.previous_token is None and stored.default_profile == "prod"
    assert stored.backup == path.with_name("config.toml.bak") and stored.backup.read_text() == original
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(stored.backup.stat().st_mode) == 0o600
    document = tomllib.loads(path.read_text())
    assert document == {
        "default_profile": "prod",
        "profiles": {
            "prod": {"url": "https://a.example", "token": "pat_old"},
            "odd name": {"url": ["http://b", "http://c"], "retries": 3},
            "dev": {"url": ["http://127.0.0.1:8081", "http://127.0.0.1:8080"], "token": "pat_new"},
        },
    }
    again = store_profile(path, None, urls=("https://a.example",), token="pat_newer", environ_profile=None)
    assert again.profile == "prod" and again.previous_token == "pat_old"  # the file's default_profile
    assert store_profile(path, None, urls=("http://x",), token="pat_x", environ_profile="dev").profile == "dev"
    assert again.backup is None  # nothing left to lose: the file is what dumps writes
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_the_toml_writer_round_trips_what_tomllib_reads():
    from arkvory.shared.client.cli_config_store import dumps

    document = tomllib.loads(
        'a = "quote \\" backslash \\\\ tab \\t del \\u007F é"\nb = 1.5\nc = -inf\nd = 2024-01-02T03:04:05Z\n'
        'e = [1, 2]\nf = true\n[g.h]\n"dotted.key" = "x"\n[i]\n'
    )
    assert tomllib.loads(dumps(document)) == document


def test_a_token_made_without_the_password_is_revoked_with_the_token_that_made_it(stack, alice, home, tmp_path):
    """Issue 22 §3: what a credential makes without the password never outlives it."""
    profile_token = logged_in(stack, alice, home, tmp_path)
    env = cli_env(home, None, token=None)
    made = arkvory(env, tmp_path, "token", "create", "--access", "read", "--expires", "30d")
    assert_exit(made, 0)
    assert "is revoked with it" in made.stderr
    child = cli_env(home, None, token=made.stdout.strip())
    assert_exit(arkvory(child, tmp_path, "ls", REPO), 0)
    profile_id = str(uuid.UUID(profile_token.removeprefix("pat_").split(".")[0]))
    assert_exit(arkvory(env, tmp_path, "token", "revoke", profile_id), 0)
    assert_exit(arkvory(child, tmp_path, "ls", REPO), 3)


def test_an_administrator_adopts_a_suspended_key_from_the_command_line(stack, home, tmp_path):
    """A managed key of a disabled account is suspended (exit 3 with it); `key adopt` makes it the
    caller's, with the password from standard input, and it works again."""
    writer = stack.writer_process
    maker, rescuer = (f"admin-{uuid.uuid4().hex[:8]}" for _ in range(2))
    with writer.client(ADMIN_TOKEN) as admin:
        for name in (maker, rescuer):
            assert admin.post("/api/v1/accounts", json={"name": name, "password": PASSWORD, "admin": True}).status_code == 201
    with writer.client(None) as client:
        session = client.post("/api/v1/login", json={"name": maker, "password": PASSWORD}).json()["token"]
    with writer.client(session) as client:
        made = client.post("/api/v1/keys", json={"scopes": [f"read:{REPO}"], "password": PASSWORD, "label": maker})
    assert made.status_code == 201, made.text
    key_id, key = made.json()["id"], cli_env(home, stack.urls, token=made.json()["token"])
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post(f"/api/v1/accounts/{maker}/disable").status_code == 200
    assert_exit(arkvory(key, tmp_path, "ls", REPO), 3)

    assert_exit(typed(cli_env(home, stack.urls, token=None), tmp_path, PASSWORD + "\n", "login", rescuer), 0)
    env = cli_env(home, None, token=None)
    listed = arkvory(env, tmp_path, "key", "list")
    assert_exit(listed, 0)
    (line,) = [line for line in listed.stdout.splitlines() if line.startswith(key_id)]
    assert "suspended" in line and maker in line
    assert_exit(arkvory(env, tmp_path, "key", "adopt", "not-a-uuid"), 2)
    adopted = typed(env, tmp_path, PASSWORD + "\n", "key", "adopt", key_id, "--password")
    assert_exit(adopted, 0)
    assert f"key {key_id} is yours now" in adopted.stderr and PASSWORD not in adopted.stdout + adopted.stderr
    assert_exit(arkvory(key, tmp_path, "ls", REPO), 0)
    assert_exit(arkvory(env, tmp_path, "key", "adopt", key_id), 6)  # not suspended any more
    assert_exit(arkvory(env, tmp_path, "key", "revoke", key_id), 0)
    assert_exit(arkvory(key, tmp_path, "ls", REPO), 3)
