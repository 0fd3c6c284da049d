"""The retention section of a repository's console page (issue 25 item 10) in headless Chromium,
with tests/test_console_browser.py's browser and checks on every page (every control reached
with TAB, no Content-Security-Policy violation, no injected script runs): preview typed limits,
save the rule (disabled), enable it, watch a cleanup delete what the preview listed, disable and
delete it, all with the keyboard and the mouse and no script of ours. The screenshots go to
$CONSOLE_SCREENSHOTS_DIR when that is set.
"""

from __future__ import annotations

import uuid

import pytest

from .console_client import make_account
from .harness import ADMIN_TOKEN, db_execute
from .test_console_browser import Walk, browser  # noqa: F401  (the fixture)
from .worker_harness import start_worker, wait_task

pytestmark = pytest.mark.timeout(300)


@pytest.mark.soak  # a real browser and a worker: .ci/run runs it (pytest -m soak)
def test_the_retention_section_in_a_real_browser(cluster, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    writer = cluster.writer().wait_ready()
    make_account(writer.url, "root", admin=True)
    with writer.client(ADMIN_TOKEN) as api:
        assert api.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        made = [api.post("/api/v1/repositories/builds/artifacts", params={"name": f"build-{n}.tar"},
                         content=b"x" * (n + 1)).json() for n in range(6)]
        hostile = api.post("/api/v1/repositories/builds/artifacts",
                           params={"name": "<img src=x onerror=window.__pwned=1>"}, content=b"h").json()
    ages = {a["id"]: hours for a, hours in zip([hostile, *made], [100, 6, 5, 4, 3, 2, 1])}
    for artifact_id, hours in ages.items():
        db_execute(cluster.database_url, "UPDATE arkvory_artifacts SET created_at = now() - make_interval(hours => $2)"
                   " WHERE id = $1::uuid", artifact_id, hours)
    shots = tmp_path / "screenshots"
    shots.mkdir()
    walk = Walk(browser, writer.url, shots)
    walk.sign_in_as_root()

    # The tab, then the section without a rule.
    walk.open("/console/repositories/builds")
    browser.find_element(By.LINK_TEXT, "Retention").click()
    walk.wait(lambda d: d.current_url.endswith("/console/repositories/builds/retention"), "on the retention section")
    assert walk.text("#retention-rule").startswith("No rule")
    walk.page_checks("retention-none")

    # Preview typed limits: nothing is saved.
    walk.find("#preview-keep-newest").send_keys("3")
    walk.find("#preview-keep-newest").send_keys(Keys.ENTER)
    walk.wait(lambda d: d.find_elements(By.ID, "retention-preview"), "the preview of typed limits")
    listed = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#retention-preview tbody th")]
    assert listed == ["<img src=x onerror=window.__pwned=1>", "build-0.tar", "build-1.tar", "build-2.tar"]
    assert "not saved" in walk.text("#retention-previewed")
    walk.page_checks("retention-typed-preview")

    # Save: disabled, since the box is not ticked for you.
    walk.find("#retention-keep-newest").clear()
    walk.find("#retention-keep-newest").send_keys("3")
    walk.find("#retention-keep-younger").send_keys("150m")
    assert not walk.find("#retention-enabled").is_selected()
    walk.find("#retention-form button[type=submit]").click()
    walk.wait(lambda d: "notice=retention-saved" in d.current_url, "the rule saved")
    assert walk.messages() == ["The retention rule was saved."]
    assert walk.text("#retention-state").startswith("Disabled")
    listed = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#retention-preview tbody th")]
    assert listed == ["<img src=x onerror=window.__pwned=1>", "build-0.tar", "build-1.tar", "build-2.tar"]
    walk.page_checks("retention-disabled")

    # Enable it, from the keyboard: tick the box with the space bar and send the form.
    walk.find("#retention-keep-younger").clear()
    walk.find("#retention-keep-younger").send_keys("150m")
    walk.find("#retention-enabled").send_keys(Keys.SPACE)
    assert walk.find("#retention-enabled").is_selected()
    walk.navigates(lambda: walk.find("#retention-keep-younger").send_keys(Keys.ENTER),
                   lambda d: "notice=retention-saved" in d.current_url, "the rule saved again")
    assert walk.text("#retention-state").startswith("Enabled")
    walk.page_checks("retention-enabled")

    # A cleanup deletes exactly what the preview listed.
    start_worker(cluster, real=True).wait_active()
    with writer.client(ADMIN_TOKEN) as api:
        task = api.post("/api/v1/tasks", json={"kind": "cleanup"}).json()
        done = wait_task(cluster.database_url, uuid.UUID(task["id"]), ("completed", "failed"), timeout=60)
        assert done["status"] == "completed" and done["result"]["steps"]["retention"]["deleted"] == 4, done
        left = [a["name"] for a in api.get("/api/v1/repositories/builds/artifacts").json()["items"]]
    assert left == ["build-3.tar", "build-4.tar", "build-5.tar"]
    walk.open("/console/repositories/builds/retention")
    assert walk.text("#retention-nothing").startswith("Nothing")
    assert "4 artifact(s)" in walk.text("#retention-rule")

    # Disable, then delete: each asks first (confirm.py).
    walk.find("#retention-disable-form button").click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page")
    assert walk.text("#confirm-heading") == "Disable the retention rule of builds?"
    walk.page_checks("retention-confirm-disable")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=retention-disabled" in d.current_url, "the rule disabled")
    assert walk.text("#retention-state").startswith("Disabled")
    walk.page_checks("retention-disabled-again")
    walk.find("#retention-delete-form button").click()
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=retention-deleted" in d.current_url, "the rule deleted")
    assert walk.text("#retention-rule").startswith("No rule")
    assert browser.execute_script("return typeof window.__pwned") == "undefined"
    walk.keep_screenshots("retention-")
