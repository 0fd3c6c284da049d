"""The console's list filters in a real browser (issue 25), as tests/test_console_browser.py drives
it (headless Chromium, Debian's chromedriver): type a name prefix into a list's search box and
press Enter, choose oldest first, follow the next page with the filters kept, find an artifact by
its SHA-256; every page reached from the keyboard, without a Content-Security-Policy violation.
Screenshots as test_console_browser.py's (copied to $CONSOLE_SCREENSHOTS_DIR when that is set)."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import uuid

import httpx
import pytest

from .console_client import make_account
from .harness import ADMIN_TOKEN, db_execute
from .test_console_browser import Walk, browser  # noqa: F401  (the fixture)

from selenium.webdriver.common.by import By  # noqa: E402  (after the skip of a machine without a browser)
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def names(walk: Walk) -> list[str]:
    return [cell.text for cell in walk.driver.find_elements(By.CSS_SELECTOR, "#artifacts tbody th")]


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_finding_artifacts_in_a_real_browser(cluster, database_url, browser, tmp_path):  # noqa: F811
    writer = cluster.writer().wait_ready()
    make_account(writer.url, "root", admin=True)
    repo = f"builds-{uuid.uuid4().hex[:6]}"
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as api:
        assert api.post("/api/v1/repositories", json={"name": repo}).status_code == 201
        for number in range(53):
            api.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": f"app_{number:02}.zip"},
                     content=f"app {number}".encode())
        api.post(f"/api/v1/repositories/{repo}/artifacts", params={"name": "appx.zip"}, content=b"x")
    db_execute(database_url,
               "UPDATE arkvory_artifacts SET created_at = timestamptz '2026-01-01 00:00:00+00' + CASE"
               " WHEN name LIKE 'app\\_%' THEN substr(name, 5, 2)::int ELSE 99 END * interval '1 second'")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    walk = Walk(browser, writer.url, shots)
    walk.sign_in_as_root()

    walk.open(f"/console/repositories/{repo}")
    assert names(walk)[0] == "appx.zip"  # newest first
    walk.page_checks("artifacts")
    # A prefix with `_` in it, typed and sent with Enter: a GET, its address bookmarkable.
    walk.find("#filter-prefix").send_keys("app_" + Keys.ENTER)
    walk.wait(lambda d: "prefix=app_" in d.current_url, "on the filtered list")
    assert names(walk) == [f"app_{n:02}.zip" for n in range(52, 2, -1)]
    walk.page_checks("artifacts-filtered")
    Select(walk.find("#filter-order")).select_by_value("oldest")
    walk.find("#filter-order").submit()
    walk.wait(lambda d: "order=oldest" in d.current_url, "oldest first")
    assert names(walk)[:3] == ["app_00.zip", "app_01.zip", "app_02.zip"]
    assert walk.find("#filter-prefix").get_attribute("value") == "app_"
    walk.find('a[rel="next"]').click()
    walk.wait(lambda d: "cursor=" in d.current_url, "on the next page")
    assert "prefix=app_" in browser.current_url and "order=oldest" in browser.current_url
    assert names(walk) == ["app_50.zip", "app_51.zip", "app_52.zip"]
    walk.page_checks("artifacts-next-page")

    # By content: the SHA-256 box.
    walk.open(f"/console/repositories/{repo}")
    walk.find("#filter-sha256").send_keys(hashlib.sha256(b"app 7").hexdigest() + Keys.ENTER)
    walk.wait(lambda d: "sha256=" in d.current_url, "found by digest")
    assert names(walk) == ["app_07.zip"]
    walk.find("#filter-sha256").clear()
    walk.find("#filter-sha256").send_keys("not a digest" + Keys.ENTER)
    walk.wait(lambda d: "sha256=not" in d.current_url, "the refused digest")
    assert any("'sha256' must be a SHA-256" in message for message in walk.messages()), walk.messages()
    # A 400 page (the browser logs its status as an error): the other checks hold.
    walk.screenshot("artifacts-refused-filter")
    walk.keyboard_reaches_every_control("artifacts-refused-filter")
    logged = [entry["message"] for entry in browser.get_log("browser")]
    assert not [m for m in logged if "Content Security Policy" in m or "Refused to" in m], logged
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    keep = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if keep:
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        for path in walk.taken:
            shutil.copy2(path, pathlib.Path(keep) / f"filters-{path.name}")
