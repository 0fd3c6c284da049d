"""Tools that speak only HTTP Basic (issue 25 §9) against a real gateway, writer and worker:
`curl -u`, `wget --user/--password` (which sends credentials only after a Basic challenge) and
`aria2c --http-user/--http-passwd` download a private artifact with a token as the password,
resume it with a Range, and are refused with a wrong token and with an account's password.
The header's parsing and the browser rule: tests/test_authorization_header.py."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from .harness import ADMIN_TOKEN, READER_TOKEN
from .tools import require_tool
from .worker_harness import start_worker

pytestmark = pytest.mark.timeout(120)

PASSWORD = "alice's long password"
BLOB = os.urandom(300_000)
CHALLENGES = ['Basic realm="arkvory", charset="UTF-8"', 'Bearer realm="arkvory"']


@pytest.fixture(scope="module")
def site(module_cluster, module_tmp_path):
    """A writer, a gateway and a worker; a private repository with an artifact; alice, who may
    read it, with a personal token."""
    cluster = module_cluster
    shared = cluster.shared_env()
    writer = cluster.writer(shared).wait_ready()
    with writer.client(ADMIN_TOKEN) as admin:
        assert admin.post("/api/v1/repositories", json={"name": "priv"}).status_code == 201
        artifact = admin.post("/api/v1/repositories/priv/artifacts", params={"name": "a.bin"}, content=BLOB).json()
        assert admin.post("/api/v1/accounts", json={"name": "alice", "password": PASSWORD}).status_code == 201
        assert admin.put("/api/v1/repositories/priv/permissions/alice", json={"level": "write"}).status_code == 200
    with writer.client(None) as anonymous:
        session = anonymous.post("/api/v1/login", json={"name": "alice", "password": PASSWORD}).json()["token"]
    with writer.client(session) as alice:
        made = alice.post("/api/v1/tokens", json={"access": "read-write", "password": PASSWORD})
        assert made.status_code == 201, made.text
    gateway = cluster.gateway(1, shared).wait_ready()
    worker = start_worker(cluster, real=True).wait_active()
    home = module_tmp_path / "home"  # no ~/.curlrc, ~/.wgetrc, ~/.netrc or aria2.conf of the machine's
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env["HOME"] = str(home)
    return {
        "processes": {"gateway": gateway, "writer": writer},
        "worker": worker,
        "path": f"/api/v1/repositories/priv/artifacts/{artifact['id']}/content",
        "pat": made.json()["token"],
        "env": env,
    }


def run(site, command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, env=site["env"], capture_output=True, text=True, timeout=60)


def curl(site, url: str, user: str, password: str, out, *extra: str) -> tuple[int, str]:
    """(exit status, HTTP status)."""
    tool = require_tool("curl", apt="curl")
    done = run(site, [tool, "-sS", "-o", str(out), "-w", "%{http_code}", "-u", f"{user}:{password}", *extra, url])
    return done.returncode, done.stdout


def wget(site, url: str, user: str, password: str, out, *extra: str) -> int:
    tool = require_tool("wget", apt="wget")
    return run(site, [tool, "-q", f"--user={user}", f"--password={password}", "-O", str(out), *extra, url]).returncode


def aria2c(site, url: str, user: str, password: str, out, *extra: str) -> int:
    tool = require_tool("aria2c", apt="aria2")
    return run(site, [
        tool, "-q", "--no-netrc", "--allow-overwrite=false", f"--http-user={user}", f"--http-passwd={password}",
        "-d", str(out.parent), "-o", out.name, *extra, url,
    ]).returncode


PROCESSES = ["gateway", "writer"]


@pytest.mark.parametrize("process", PROCESSES)
def test_curl_u(site, process, tmp_path):
    url = site["processes"][process].url + site["path"]
    out = tmp_path / "a.bin"
    for user, token in (("ci", READER_TOKEN), ("", site["pat"]), ("alice", site["pat"])):
        assert curl(site, url, user, token, out) == (0, "200")
        assert out.read_bytes() == BLOB
    assert curl(site, url, "alice", "wrong", out) == (0, "401")
    assert curl(site, url, "alice", PASSWORD, out) == (0, "401")  # an account's password is no token
    # Resumed: zeros stand for what was received before, so only a Range request gives this file.
    out.write_bytes(bytes(100_000))
    assert curl(site, url, "ci", READER_TOKEN, out, "-C", "-") == (0, "206")
    assert out.read_bytes() == bytes(100_000) + BLOB[100_000:]


@pytest.mark.parametrize("process", PROCESSES)
def test_wget_user_password_after_the_basic_challenge(site, process, tmp_path):
    url = site["processes"][process].url + site["path"]
    out = tmp_path / "a.bin"
    # No --auth-no-challenge: wget sends the credentials only after a 401 that challenges for Basic.
    for token in (READER_TOKEN, site["pat"]):
        assert wget(site, url, "alice", token, out) == 0
        assert out.read_bytes() == BLOB
    assert wget(site, url, "alice", "wrong", out) == 6  # "authentication failed"
    assert wget(site, url, "alice", PASSWORD, out) == 6
    out.write_bytes(bytes(100_000))
    assert wget(site, url, "alice", site["pat"], out, "-c") == 0
    assert out.read_bytes() == bytes(100_000) + BLOB[100_000:]


@pytest.mark.parametrize("process", PROCESSES)
def test_aria2c_http_user_passwd(site, process, tmp_path):
    url = site["processes"][process].url + site["path"]
    for number, token in enumerate((READER_TOKEN, site["pat"])):
        out = tmp_path / f"a{number}.bin"
        assert aria2c(site, url, "alice", token, out) == 0
        assert out.read_bytes() == BLOB
    # After a challenge, as wget, too.
    out = tmp_path / "challenged.bin"
    assert aria2c(site, url, "alice", site["pat"], out, "--http-auth-challenge=true") == 0
    assert out.read_bytes() == BLOB
    assert aria2c(site, url, "alice", "wrong", tmp_path / "wrong.bin") == 24  # "HTTP authorization failed"
    assert aria2c(site, url, "alice", PASSWORD, tmp_path / "password.bin") == 24
    # aria2 checks the answer's Digest against the whole file, so it resumes real bytes; its
    # log shows the Range (from the start of the piece the file ends in) and the 206.
    out, log = tmp_path / "resumed.bin", tmp_path / "aria2.log"
    out.write_bytes(BLOB[:100_000])
    assert aria2c(site, url, "alice", READER_TOKEN, out, "-c", f"--log={log}", "--log-level=debug") == 0
    assert out.read_bytes() == BLOB
    said = log.read_text(errors="replace")
    assert "Range: bytes=98304-299999" in said and "HTTP/1.1 206" in said


def test_a_netrc_file_keeps_the_token_off_the_command_line(site, tmp_path):
    """As docs/client.md shows it: ~/.netrc (mode 0600) with any login and the token as the
    password, read by curl --netrc, by wget and by aria2c without options."""
    home = tmp_path / "home"
    home.mkdir()
    netrc = home / ".netrc"
    netrc.write_text(f"machine 127.0.0.1 login ci password {site['pat']}\n")
    netrc.chmod(0o600)
    env = {**site["env"], "HOME": str(home)}
    url = site["processes"]["gateway"].url + site["path"]
    commands = [
        [require_tool("curl", apt="curl"), "-fsS", "--netrc", "-o", str(tmp_path / "curl.bin"), url],
        [require_tool("wget", apt="wget"), "-q", "-O", str(tmp_path / "wget.bin"), url],
        [require_tool("aria2c", apt="aria2"), "-q", "-d", str(tmp_path), "-o", "aria2c.bin", url],
    ]
    for command in commands:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command[0], done.stderr)
    for name in ("curl", "wget", "aria2c"):
        assert (tmp_path / f"{name}.bin").read_bytes() == BLOB, name


def test_basic_works_wherever_bearer_does(site, tmp_path):
    """An upload to the writer, and the keyed health routes of every process."""
    writer = site["processes"]["writer"]
    upload = tmp_path / "up.bin"
    upload.write_bytes(b"uploaded with curl -u")
    out = tmp_path / "answer.json"
    url = f"{writer.url}/api/v1/repositories/priv/artifacts?name=up.bin"
    assert curl(site, url, "alice", site["pat"], out, "--data-binary", f"@{upload}") == (0, "201")
    urls = [p.url for p in site["processes"].values()] + [site["worker"].url]
    for base in urls:
        for route in ("/health/ready", "/health/metrics"):
            assert curl(site, base + route, "ops", READER_TOKEN, out) == (0, "200"), base + route
            assert curl(site, base + route, "ops", "wrong", out) == (0, "401"), base + route


def test_a_401_challenges_for_basic_and_bearer_on_every_process(site):
    urls = [p.url + site["path"] for p in site["processes"].values()]
    urls += [p.url + "/health/ready" for p in site["processes"].values()]
    urls += [site["processes"]["writer"].url + "/api/v1/tokens", site["worker"].url + "/health/ready"]
    for url in urls:
        answer = httpx.get(url, timeout=10)
        assert answer.status_code == 401, url
        assert answer.headers.get_list("www-authenticate") == CHALLENGES, url


def test_the_same_refusal_for_a_password_as_for_a_wrong_token_and_no_login_limit(site):
    """No password is checked, so none is guessed: the answer says nothing about the account, and
    the account's login limit (5 wrong passwords a minute) never counts these."""
    writer = site["processes"]["writer"]
    url = writer.url + site["path"]
    answers = [
        httpx.get(url, auth=(user, password), timeout=10)
        for user, password in [("alice", PASSWORD), ("alice", "wrong"), ("nobody", PASSWORD)] * 4
    ]
    assert {a.status_code for a in answers} == {401}
    assert {a.json()["message"] for a in answers} == {"the token is not valid"}
    login = httpx.post(writer.url + "/api/v1/login", json={"name": "alice", "password": PASSWORD}, timeout=10)
    assert login.status_code == 200, login.text


def test_basic_a_browser_adds_to_another_sites_request_is_refused(site):
    gateway, writer = site["processes"]["gateway"], site["processes"]["writer"]
    auth = ("alice", site["pat"])
    fetched = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}  # <img src> on another site
    refused = httpx.get(gateway.url + site["path"], auth=auth, headers=fetched, timeout=10)
    assert refused.status_code == 403 and "another site" in refused.json()["message"]
    assert httpx.get(writer.url + site["path"], auth=auth, headers=fetched, timeout=10).status_code == 403
    # A link from elsewhere, followed by the user: the answer is the user's alone.
    link = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    assert httpx.get(gateway.url + site["path"], auth=auth, headers=link, timeout=10).content == BLOB
    followed = {**link, "Sec-Fetch-Dest": "document"}
    assert httpx.get(gateway.url + site["path"], auth=auth, headers=followed, timeout=10).content == BLOB
    # Another site's (hidden) frame navigates too, but no user asked for it: refused.
    for dest in ("iframe", "frame", "embed", "object"):
        framed = httpx.get(gateway.url + site["path"], auth=auth, headers={**link, "Sec-Fetch-Dest": dest}, timeout=10)
        assert framed.status_code == 403, dest
    # A form another site posts, from a browser too old to send Sec-Fetch-Site.
    posted = httpx.post(writer.url + "/api/v1/repositories", auth=auth, json={"name": "forged"},
                        headers={"Origin": "http://elsewhere.example"}, timeout=10)
    assert posted.status_code == 403
    # No browser adds a bearer token by itself: unchanged.
    bearer = {"Authorization": f"Bearer {site['pat']}", **fetched}
    assert httpx.get(gateway.url + site["path"], headers=bearer, timeout=10).content == BLOB


def test_no_token_or_password_in_any_log(site):
    for process in [*site["processes"].values(), site["worker"]]:
        log = process.stderr
        for secret in (site["pat"], READER_TOKEN, PASSWORD, "wrong"):
            assert secret not in log, (process.name, secret)
