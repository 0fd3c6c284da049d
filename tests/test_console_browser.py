"""The console in a real browser (issue 15 §1): headless Chromium from Debian's packages, driven
by Selenium through Debian's chromedriver (no browser is downloaded), against a real writer,
two gateways and a real worker.

One walk through the console as an operator would take it: sign in, the overview with both
gateways' leases and their trust following live, create a repository, upload a file from the
browser (the file input, the progress bar), download it, dispatch a verify and watch its events
arrive to `task.completed` without reloading, create and revoke a token. On every page: every
link, button and input is reached with TAB, the browser reports no Content-Security-Policy
violation, and a `<script>` someone typed into a name never runs. A screenshot of each page is
saved under the test's tmp dir (and copied to $CONSOLE_SCREENSHOTS_DIR when that is set).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import os
import pathlib
import re
import shutil
import threading

import httpx
import pytest

from .console_client import PASSWORD, make_account
from .harness import ADMIN_TOKEN, db_fetch, free_port
from .worker_harness import start_worker

pytestmark = pytest.mark.timeout(420)

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
INSTALL = "apt-get install chromium chromium-driver"
# Without the background-networking flags Chromium dials out at start and a closed network
# refuses it; a fresh profile per test keeps runs apart.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,1400")
HOSTILE_LABEL = "<script>window.__pwned=1</script>"
HOSTILE_NAME = "<img src=x onerror=window.__pwned=1>.bin"

if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    if os.environ.get("CI"):  # .ci/run installs them: missing there is a broken CI, not a skip
        pytest.fail(f"headless Chromium and chromedriver are missing: {INSTALL}", pytrace=False)
    pytest.skip(f"headless Chromium and chromedriver are missing: {INSTALL}", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is missing: pip install -e '.[test]'")

from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.expected_conditions import staleness_of  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


class Walk:
    """The browser on one writer, with the checks every page gets."""

    def __init__(self, driver, base_url: str, shots: pathlib.Path) -> None:
        self.driver = driver
        self.base_url = base_url
        self.shots = shots
        self.taken: list[pathlib.Path] = []

    def open(self, path: str) -> None:
        self.driver.get(self.base_url + path)

    def wait(self, condition, what: str, timeout: float = 30):
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.1).until(lambda d: condition(d))
        except TimeoutException:
            raise AssertionError(f"not {what} after {timeout} s on {self.driver.current_url}") from None

    def find(self, selector: str):
        return self.driver.find_element(By.CSS_SELECTOR, selector)

    def navigates(self, act, condition, what: str) -> None:
        """`act()` (a click or a key that sends a form), then wait for the page it leads to: the
        old page gone first, since a form that lands on an address like the one before (the same
        notice twice) would otherwise look arrived while the old page is still shown."""
        old_root = self.find("html")
        act()
        self.wait(lambda d: staleness_of(old_root)(d) and condition(d), what)

    def sign_in_as_root(self) -> None:
        """The sign-in form, as root (an administrator lands on the overview)."""
        self.open("/console/sign-in")
        self.find("#sign-in-name").send_keys("root")
        self.find("#sign-in-password").send_keys(PASSWORD + Keys.ENTER)
        self.wait(lambda d: d.current_url.rstrip("/").endswith("/console"), "on the overview")

    def text(self, selector: str) -> str:
        return self.find(selector).text

    def messages(self) -> list[str]:
        return [e.text for e in self.driver.find_elements(By.CSS_SELECTOR, "p.notice, p.error")]

    def page_checks(self, name: str) -> None:
        """What every page must hold to: keyboard, no CSP violation, no injected script; then
        its screenshot."""
        self.screenshot(name)
        self.keyboard_reaches_every_control(name)
        self.no_policy_violation(name)
        assert self.driver.execute_script("return typeof window.__pwned") == "undefined", name

    def screenshot(self, name: str) -> None:
        path = self.shots / f"{len(self.taken) + 1:02d}-{name}.png"
        assert self.driver.save_screenshot(str(path)), path
        assert path.stat().st_size > 1000
        self.taken.append(path)

    def keep_screenshots(self, prefix: str = "") -> None:
        """Copy the screenshots to $CONSOLE_SCREENSHOTS_DIR when that is set."""
        keep = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
        if keep:
            pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
            for path in self.taken:
                shutil.copy2(path, pathlib.Path(keep) / (prefix + path.name))

    def no_policy_violation(self, name: str) -> None:
        problems = [entry["message"] for entry in self.driver.get_log("browser")
                    if "Content Security Policy" in entry["message"] or "Refused to" in entry["message"]
                    or entry["level"] == "SEVERE"]
        assert not problems, (name, problems)

    def keyboard_reaches_every_control(self, name: str) -> None:
        """TAB from the top of the page until focus has been on every visible link, button,
        input, select and text area (or has come round): each must be reached."""
        count = self.driver.execute_script("""
            var controls = document.querySelectorAll(
              'a[href], button, input:not([type="hidden"]), select, textarea, summary');
            var n = 0;
            controls.forEach(function (element) {
              // checkVisibility: not what a closed <details> holds either (only its summary shows).
              var visible = element.getClientRects().length > 0 && getComputedStyle(element).visibility !== 'hidden'
                && (!element.checkVisibility || element.checkVisibility());
              if (visible && !element.disabled) { element.setAttribute('data-kb', String(n)); n += 1; }
            });
            if (document.activeElement) { document.activeElement.blur(); }
            window.scrollTo(0, 0);
            return n;""")
        assert count > 0, name
        # Focus starts at the document: the first TAB goes to the first control.
        self.driver.execute_script("document.body.setAttribute('tabindex', '-1'); document.body.focus();"
                                   " document.body.removeAttribute('tabindex');")
        reached: set[str] = set()
        order: list[str] = []
        actions = ActionChains(self.driver)
        for _ in range(count * 2 + 10):
            actions.send_keys(Keys.TAB).perform()
            mark = self.driver.execute_script(
                "var e = document.activeElement; return e ? e.getAttribute('data-kb') : null")
            if mark is not None:
                if mark in reached and len(reached) == count:
                    break
                reached.add(mark)
                order.append(mark)
            if len(reached) == count:
                break
        missing = self.driver.execute_script("""
            var reached = arguments[0], missing = [];
            document.querySelectorAll('[data-kb]').forEach(function (element) {
              if (reached.indexOf(element.getAttribute('data-kb')) < 0) { missing.push(element.outerHTML.slice(0, 200)); }
            });
            return missing;""", sorted(reached))
        assert not missing, (name, f"{len(reached)} of {count} controls reached by TAB", missing)
        # Tab order follows the page's order (no positive tabindex shuffles it).
        assert [int(mark) for mark in order] == sorted(int(mark) for mark in order), (name, order)


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_console_in_a_real_browser(cluster, browser, tmp_path):
    shared = cluster.shared_env(slots=3)
    writer = cluster.writer(shared).wait_ready()
    gateways = [cluster.gateway(slot, shared).wait_ready() for slot in (1, 2)]
    start_worker(cluster, real=True).wait_active()
    make_account(writer.url, "root", admin=True)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    walk = Walk(browser, writer.url, shots)

    # -- sign in, from the keyboard ---------------------------------------------------------------
    walk.open("/console/")
    walk.wait(lambda d: "/console/sign-in" in d.current_url, "sent to the sign-in page")
    walk.page_checks("sign-in")
    walk.find("#sign-in-name").send_keys("root")
    walk.find("#sign-in-password").send_keys(PASSWORD + Keys.ENTER)
    walk.wait(lambda d: d.current_url.rstrip("/").endswith("/console"), "on the overview")
    session = browser.get_cookie("arkvory_session")
    assert session["httpOnly"] and session["sameSite"] == "Strict" and session["value"].startswith("dps_")

    # -- the overview: three leases, both gateways', trust following live -------------------------
    rows = browser.find_elements(By.CSS_SELECTOR, "#leases tbody tr")
    assert [r.get_attribute("data-process") for r in rows] == ["slot-0", "slot-1", "slot-2"]
    for gateway in gateways:
        assert f"http://127.0.0.1:{gateway.port}" in walk.text("#leases")
    for row in rows:
        assert row.find_element(By.CSS_SELECTOR, '[data-field="status"]').text == "ready"
    assert "A worker is active" in walk.text("#worker-state")
    trust = '#leases tr[data-process="slot-2"] [data-field="trustLeft"]'
    first = walk.text(trust)
    walk.wait(lambda d: walk.text(trust) != first, "the trust left of slot 2 updated in place", timeout=15)
    assert walk.text(trust).endswith(" s") and 0 < float(walk.text(trust).split()[0]) <= 8
    walk.page_checks("overview")

    # -- create a repository ----------------------------------------------------------------------
    walk.open("/console/repositories")
    walk.page_checks("repositories")
    walk.find("#repository-name").send_keys("builds")
    walk.find("#repository-name").submit()
    walk.wait(lambda d: d.current_url.endswith("/console/repositories/builds?notice=repository-created"), "on the new repository")
    assert walk.messages() == ["The repository was created."]

    # -- upload from the browser: the file input, the resumable API, the progress bar --------------
    data = os.urandom(6 * 1024 * 1024 + 123)
    source = tmp_path / "payload.bin"
    source.write_bytes(data)
    # What the bar and the status line showed, kept in sessionStorage: the page moves on to the
    # artifact as soon as the upload completes, faster than anyone could look.
    browser.execute_script("""
        function keep(name, value) {
          var seen = JSON.parse(sessionStorage.getItem(name) || '[]');
          seen.push(value);
          sessionStorage.setItem(name, JSON.stringify(seen));
        }
        var bar = document.getElementById('upload-progress');
        new MutationObserver(function () { keep('progress', bar.value); }).observe(bar, {attributes: true});
        var status = document.getElementById('upload-status');
        new MutationObserver(function () { keep('status', status.textContent); })
          .observe(status, {childList: true, characterData: true, subtree: true});""")
    walk.page_checks("repository")
    assert browser.find_element(By.ID, "upload-progress").is_displayed() is False  # shown once it starts
    walk.find("#upload-file").send_keys(str(source))
    walk.find("#upload-form button[type=submit]").click()
    walk.wait(lambda d: "/artifacts/" in d.current_url, "on the artifact page after the upload", timeout=60)
    seen_progress = browser.execute_script("return JSON.parse(sessionStorage.getItem('progress') || '[]')")
    seen_status = browser.execute_script("return JSON.parse(sessionStorage.getItem('status') || '[]')")
    assert any(text.startswith("Sending: ") for text in seen_status), seen_status
    assert seen_progress and seen_progress[-1] == 100, seen_progress
    walk.wait(lambda d: d.find_elements(By.ID, "artifact-sha256"), "on the artifact page")
    assert walk.messages() == ["The file was uploaded."]
    assert walk.text("#artifact-sha256") == hashlib.sha256(data).hexdigest()
    assert walk.text("#artifact-name") == "payload.bin"

    # -- download: a link with no key; the cookie authorizes it ------------------------------------
    link = walk.find("#download-link").get_attribute("href")
    assert link.startswith(writer.url + "/console/repositories/builds/artifacts/") and link.endswith("/download")
    assert "?" not in link and session["value"] not in link
    digest = browser.execute_async_script("""
        var done = arguments[arguments.length - 1];
        fetch(arguments[0], {credentials: 'same-origin'})
          .then(function (r) { return r.arrayBuffer(); })
          .then(function (body) { return crypto.subtle.digest('SHA-256', body); })
          .then(function (hash) {
            done(Array.from(new Uint8Array(hash)).map(function (b) { return b.toString(16).padStart(2, '0'); }).join(''));
          })
          .catch(function (error) { done('failed: ' + error); });""", link)
    assert digest == hashlib.sha256(data).hexdigest()
    cookies = {c["name"]: c["value"] for c in browser.get_cookies()}
    fetched = httpx.get(link, cookies=cookies, timeout=60)
    assert fetched.status_code == 200 and fetched.content == data
    assert httpx.get(link, timeout=30).status_code == 303  # the link alone opens nothing
    walk.page_checks("artifact")

    # -- a name that holds markup is shown as text and never runs ---------------------------------
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as api:
        hostile = api.post("/api/v1/repositories/builds/artifacts", params={"name": HOSTILE_NAME}, content=b"x").json()
    walk.open("/console/repositories/builds")
    assert HOSTILE_NAME in walk.text("#artifacts")
    walk.open(f"/console/repositories/builds/artifacts/{hostile['id']}")
    assert walk.text("#artifact-name") == HOSTILE_NAME
    assert browser.execute_script("return document.querySelectorAll('main img').length") == 0
    walk.page_checks("artifact-hostile-name")

    # -- dispatch a verify and watch its events arrive ---------------------------------------------
    walk.open("/console/tasks")
    walk.page_checks("tasks")
    assert not walk.find("#budget-max_items").is_displayed()  # behind "Advanced" (a <details>)
    walk.find("#dispatch-advanced summary").click()
    assert walk.find("#budget-max_items").is_displayed()
    walk.page_checks("tasks-advanced-open")
    walk.find("#dispatch-kind").send_keys("verify")
    walk.find("#param-rate").send_keys(str(1024 * 1024))  # ~6 s for the 6 MiB: long enough to watch
    walk.find("#dispatch-form button[type=submit]").click()
    walk.wait(lambda d: d.find_elements(By.ID, "events"), "on the task page")
    browser.execute_script("window.__samePage = true")
    # What the progress bar's words said while the task ran (they change in place).
    browser.execute_script("""
        window.__progressSaid = [];
        var said = document.getElementById('task-progress-text');
        new MutationObserver(function () { window.__progressSaid.push(said.textContent); })
          .observe(said, {childList: true, characterData: true, subtree: true});""")
    shown_at_load = len(browser.find_elements(By.CSS_SELECTOR, "#events tbody tr"))
    walk.wait(lambda d: "task.completed" in walk.text("#events"), "task.completed on the page", timeout=90)
    assert browser.execute_script("return window.__samePage") is True  # never reloaded
    events = browser.find_elements(By.CSS_SELECTOR, "#events tbody tr")
    live = [e for e in events if e.get_attribute("data-live") == "true"]
    assert len(live) >= 2 and len(events) > shown_at_load, (shown_at_load, len(events))
    types = [e.find_elements(By.TAG_NAME, "td")[0].text for e in events]
    assert types[0] == "task.queued" and types[-1] == "task.completed" and "task.progress" in types
    seqs = [int(e.get_attribute("data-seq")) for e in events]
    assert seqs == list(range(1, len(seqs) + 1))  # every event once, in order
    walk.wait(lambda d: walk.text("#task-status") == "completed", "the status read again")
    assert int(walk.find('[data-usage="bytes"]').text) >= len(data)  # budget use, read again live
    assert not walk.find("#cancel-form").is_displayed()
    # The bar: full once completed, and it counted blobs on the way, live.
    walk.wait(lambda d: walk.text("#task-progress-text") == "Completed.", "the bar completed")
    assert browser.execute_script("var b = document.getElementById('task-progress'); return b.value === b.max && b.max > 0")
    said = browser.execute_script("return window.__progressSaid")
    assert any(re.fullmatch(r"\d+ of \d+ blobs checked \(\d+ %\)", text) for text in said), said
    # Each event a sentence, the same live as the server writes them on a reload.
    live_sentences = [row.find_elements(By.TAG_NAME, "td")[2].text for row in events]
    assert all(text and not text.startswith("{") for text in live_sentences), live_sentences
    live_result = walk.text("#task-result")
    assert live_result.startswith("bytes ") and "checked 2" in live_result, live_result  # name value pairs
    walk.page_checks("task")
    browser.refresh()
    walk.wait(lambda d: d.find_elements(By.ID, "events"), "the task page again")
    reloaded = [row.find_elements(By.TAG_NAME, "td")[2].text
                for row in browser.find_elements(By.CSS_SELECTOR, "#events tbody tr")]
    assert reloaded == live_sentences and walk.text("#task-result") == live_result

    # -- a token: created (shown once), used, revoked ----------------------------------------------
    walk.open("/console/tokens")
    walk.page_checks("tokens")
    walk.find("#token-label").send_keys(HOSTILE_LABEL)
    walk.find("#token-access").send_keys("read-write")
    walk.find("#token-label").submit()
    walk.wait(lambda d: d.find_elements(By.ID, "new-secret"), "the new token shown")
    secret = walk.find("#new-secret").get_attribute("value")
    assert secret.startswith("pat_") and secret not in browser.current_url
    assert HOSTILE_LABEL in walk.text("#tokens")
    walk.page_checks("token-created")
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as api:
        assert api.get("/api/v1/tokens").status_code == 200
    walk.open("/console/tokens")
    assert not browser.find_elements(By.ID, "new-secret")  # shown once
    walk.find("#tokens tbody tr button.danger").click()
    # Asked first: the confirmation page, with the same form; nothing revoked yet.
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the revoke's confirmation page")
    assert walk.text("#confirm-heading").startswith("Revoke root's token ")
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as api:
        assert api.get("/api/v1/tokens").status_code == 200
    walk.page_checks("token-revoke-confirmation")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=token-revoked" in d.current_url, "the token revoked")
    assert walk.messages() == ["The token was revoked."]
    assert not browser.find_elements(By.CSS_SELECTOR, "#tokens")
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as api:
        assert api.get("/api/v1/tokens").status_code == 401

    # -- the administrators' other pages, from the keyboard too ------------------------------------
    for path, name in (("/console/accounts", "accounts"), ("/console/keys", "keys"),
                       ("/console/repositories/builds/members", "members"),
                       ("/console/repositories/builds/packages", "packages")):
        walk.open(path)
        walk.page_checks(name)

    # -- sign out -----------------------------------------------------------------------------------
    walk.open("/console/")
    walk.find(".sign-out button").click()
    walk.wait(lambda d: "notice=signed-out" in d.current_url, "signed out")
    walk.page_checks("signed-out")
    walk.open("/console/")
    walk.wait(lambda d: "/console/sign-in" in d.current_url, "the console closed again")

    assert len(walk.taken) >= 15 and all(path.is_file() for path in walk.taken)
    walk.keep_screenshots()


# The login CSRF of issue 22 §2, as it was reproduced: another site's page posts the attacker's
# name and password to the login (a text/plain form, and a no-cors fetch: neither needs a
# preflight), and the victim's console then said "Signed in as mallory".
ATTACK_PAGE = """<!doctype html><title>You won</title>
<form id="f" method="post" action="{writer}/api/v1/login" enctype="text/plain">
<input type="hidden" name='{{"name": "mallory", "password": "{password}", "x": "' value='"}}'>
</form>
<script>
fetch("{writer}/api/v1/login", {{method: "POST", mode: "no-cors", credentials: "include",
  headers: {{"Content-Type": "text/plain"}}, body: JSON.stringify({{name: "mallory", password: "{password}"}})}})
  .finally(function () {{ document.getElementById("f").submit(); }});
</script>
"""


@contextlib.contextmanager
def attacker_site(directory: pathlib.Path):
    """A plain web server for `directory`, on `localhost` (another site than the writer's
    127.0.0.1)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://localhost:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.soak
def test_another_sites_page_cannot_sign_the_browser_in(cluster, browser, tmp_path):
    writer = cluster.writer().wait_ready()
    make_account(writer.url, "mallory")
    site = tmp_path / "site"
    site.mkdir()
    (site / "prize.html").write_text(ATTACK_PAGE.format(writer=writer.url, password=PASSWORD))
    walk = Walk(browser, writer.url, tmp_path)
    with attacker_site(site) as attacker:
        browser.get(f"{attacker}/prize.html")
        walk.wait(lambda d: d.current_url.startswith(writer.url + "/api/v1/login"), "the form posted to the writer")
    assert "unsupported_media_type" in browser.page_source or "forbidden" in browser.page_source
    sessions = db_fetch(cluster.database_url, "SELECT count(*) AS n FROM arkvory_credentials WHERE kind = 'session'")
    assert sessions[0]["n"] == 0
    assert browser.get_cookie("arkvory_session") is None
    walk.open("/console/")
    walk.wait(lambda d: "/console/sign-in" in d.current_url, "the console asks who signs in")


# -- issue 25 §5-7: publishing, download lines, confirmations, an account's view ---------------------


def _sign_in(walk: Walk, name: str) -> None:
    walk.open("/console/sign-in")
    walk.find("#sign-in-name").send_keys(name)
    walk.find("#sign-in-password").send_keys(PASSWORD + Keys.ENTER)
    walk.wait(lambda d: "/console/sign-in" not in d.current_url, f"{name} signed in")


@pytest.mark.soak
def test_publishing_download_lines_and_confirmations_in_a_real_browser(cluster, browser, tmp_path):
    gateway_port = free_port()
    shared = cluster.shared_env(slots=2)
    public = f"http://127.0.0.1:{gateway_port}"
    writer = cluster.writer(shared, ARKVORY_PUBLIC_URL=public).wait_ready()
    gateway = cluster.gateway(1, shared, ARKVORY_PORT=str(gateway_port)).wait_ready()
    make_account(writer.url, "root", admin=True)
    make_account(writer.url, "alice")
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as api:
        assert api.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        first = api.post("/api/v1/repositories/builds/artifacts", params={"name": "app.tar"}, content=b"first build").json()
        second = api.post("/api/v1/repositories/builds/artifacts", params={"name": "app2.tar"}, content=b"second").json()
        assert api.put("/api/v1/repositories/builds/permissions/alice", json={"level": "write"}).status_code == 200
    walk = Walk(browser, writer.url, tmp_path)
    browser.execute_cdp_cmd("Browser.grantPermissions", {
        "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"], "origin": writer.url})
    _sign_in(walk, "root")

    # -- the artifact's download lines: through the gateway, no key, copied with one click --------
    artifact_path = f"/console/repositories/builds/artifacts/{first['id']}"
    walk.open(artifact_path)
    url = f"{public}/api/v1/repositories/builds/artifacts/{first['id']}/content"
    assert walk.text("#line-url") == url
    assert walk.text("#line-curl") == f'curl -fL -o app.tar -H "Authorization: Bearer $ARKVORY_TOKEN" {url}'
    assert walk.text("#line-arkvory") == f"arkvory get --url {public} builds {first['id']}"
    copy = walk.find('button.copy[data-copy="line-curl"]')
    assert copy.is_displayed()  # the script showed it
    copy.click()
    walk.wait(lambda d: walk.text("#copy-status") == "Copied: curl.", "the copy said")
    pasted = browser.execute_async_script(
        "var done = arguments[0]; navigator.clipboard.readText().then(done, function (e) { done('failed: ' + e); });")
    assert pasted == walk.text("#line-curl")
    with httpx.Client(headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        assert client.get(url).content == b"first build"  # the URL, as shown, is the gateway's
    assert gateway.port == gateway_port
    walk.page_checks("artifact-download-lines")

    # -- publish it as a package version, from its page ------------------------------------------------
    walk.find('#publish-links a[href*="/packages/new"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "publish-form"), "the publishing form")
    assert walk.find("#publish-artifact").get_attribute("value") == first["id"]
    walk.page_checks("publish-package")
    walk.find("#publish-group").send_keys("org.example")
    walk.find("#publish-name").send_keys("app")
    walk.find("#publish-version").send_keys("1.0" + Keys.ENTER)
    walk.wait(lambda d: "notice=package-published" in d.current_url, "the package page")
    assert walk.messages() == ["The package version is published."]
    assert walk.text("#line-arkvory") == f"arkvory get --url {public} builds --package=org.example/app@1.0"
    walk.page_checks("package")

    # -- point an asset at it, re-point it, point it back ---------------------------------------------
    walk.open(artifact_path)
    walk.find('#publish-links a[href*="/assets/new"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "point-form"), "the asset form")
    walk.page_checks("point-asset")
    walk.find("#point-path").send_keys("latest/app.tar" + Keys.ENTER)
    walk.wait(lambda d: "notice=asset-pointed" in d.current_url, "the asset page")
    walk.find("#repoint-artifact").send_keys(second["id"] + Keys.ENTER)
    walk.wait(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#asset-history tbody tr")) == 2, "two pointings")
    assert "app2.tar" in walk.text("#asset-artifact")
    walk.find("#asset-history tbody tr:nth-child(2) button").click()
    walk.wait(lambda d: "notice=asset-restored" in d.current_url, "pointed back")
    assert walk.messages() == ["The asset points back at that artifact now."]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#asset-history tbody tr")) == 3
    assert walk.text("#asset-artifact") == "app.tar"
    walk.page_checks("asset")

    # -- a delete asks first: cancel keeps it; confirmed, it goes -------------------------------------
    walk.find("#delete-link").click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page")
    assert walk.text("#confirm-heading") == "Delete asset latest/app.tar?"
    walk.page_checks("confirm-delete-asset")
    walk.find("#confirm-cancel").click()
    walk.wait(lambda d: d.current_url.endswith("/console/repositories/builds/assets"), "back on the assets")
    assert "latest/app.tar" in walk.text("main")
    walk.find('a[aria-label="Delete asset latest/app.tar"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page again")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=asset-deleted" in d.current_url, "the asset deleted")
    # The artifact a package version uses: asked first, then the API's refusal on its page.
    walk.open(artifact_path)
    walk.find("#delete-link").click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the artifact's confirmation page")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: walk.messages(), "the refusal")
    assert "still used by a package version" in walk.messages()[0]
    browser.get_log("browser")  # the refusal's 409 is logged as a failed load: expected here

    # -- without JavaScript: the lines are text, the confirmation the same page --------------------
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    walk.open(f"/console/repositories/builds/artifacts/{second['id']}")
    assert walk.text("#line-url").startswith(public) and not walk.find('button.copy[data-copy="line-url"]').is_displayed()
    walk.find("#delete-link").click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page without scripts")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=artifact-deleted" in d.current_url, "deleted without scripts")
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})

    # -- an account that is not an administrator lands on Repositories, and sees no process --------
    walk.find(".sign-out button").click()
    walk.wait(lambda d: "notice=signed-out" in d.current_url, "signed out")
    _sign_in(walk, "alice")
    walk.wait(lambda d: d.current_url.endswith("/console/repositories"), "alice on the repositories")
    # The download base is the gateway's address here (as in `arkvory dev`): it is public. What
    # is not: the writer's own address, and every process's PID.
    leases = db_fetch(cluster.database_url, "SELECT pid, url FROM arkvory_gateway_leases")
    assert len(leases) == 2
    for path in ("/console/repositories", "/console/repositories/builds",
                 "/console/repositories/builds/package?group=org.example&name=app&version=1.0", artifact_path):
        walk.open(path)
        source = browser.page_source
        assert writer.url not in source, path
        for lease in leases:
            assert f">{lease['pid']}<" not in source and f"pid {lease['pid']}" not in source, path
        assert "Overview" not in walk.text("header"), path
    walk.page_checks("account-artifact")
    walk.keep_screenshots("publishing-")


@pytest.mark.soak
def test_the_audit_page_in_a_real_browser(cluster, browser, tmp_path):
    """The audit page (writer/console/audit.py): the filters as a GET form sent from the
    keyboard, the table, the link to older entries; no script, no policy violation."""
    writer = cluster.writer().wait_ready()
    make_account(writer.url, "root", admin=True)
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as api:
        for n in range(52):
            assert api.post("/api/v1/repositories", json={"name": f"audited-{n}"}).status_code == 201
    walk = Walk(browser, writer.url, tmp_path)
    walk.sign_in_as_root()
    browser.find_element(By.LINK_TEXT, "Audit").click()
    walk.wait(lambda d: d.current_url.endswith("/console/audit"), "on the audit page")
    assert "account.sign-in" in walk.text("#audit")  # root's own sign-in, newest first
    walk.page_checks("audit")
    # Filter from the keyboard: who, and a family of actions; Enter sends the GET form.
    walk.find("#audit-principal").send_keys("key:admin")
    walk.find("#audit-action").send_keys("repository")  # selects "repository (all)"
    walk.find("#audit-principal").send_keys(Keys.ENTER)
    walk.wait(lambda d: "principal=key%3Aadmin" in d.current_url and "action=repository" in d.current_url,
              "the filters in the page's address")
    rows = browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr")
    assert len(rows) == 50 and all("repository.create" in r.text for r in rows)
    assert "audited-51" in rows[0].text  # newest first
    walk.page_checks("audit-filtered")
    browser.find_element(By.LINK_TEXT, "Older entries").click()
    walk.wait(lambda d: "cursor=" in d.current_url, "on the older page")
    rows = browser.find_elements(By.CSS_SELECTOR, "#audit tbody tr")
    assert [r.find_element(By.CSS_SELECTOR, "td:nth-child(7)").text for r in rows] == ["audited-1", "audited-0"]
    assert walk.find("#audit-principal").get_attribute("value") == "key:admin"  # the form keeps the filters
    walk.page_checks("audit-older")
    walk.keep_screenshots("audit-")
