"""The console's account pages in a real browser (issue 25 §1, §2, §8), with the checks every page
gets in tests/test_console_browser.py (every control reached with TAB, no Content-Security-Policy
violation, no injected script): an administrator resets a password and deletes an account, the
account whose password was reset sees only its password page until it sets its own, a
repository's members are changed and removed (the removal after its confirmation page), and a token
is made for a number of days with the password given again, the page saying how long it lives."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import httpx
import pytest

from .console_client import PASSWORD, make_account
from .harness import ADMIN_TOKEN
from .test_console_browser import Walk, browser  # noqa: F401  (the browser fixture)

from selenium.webdriver.common.by import By  # noqa: E402  (after test_console_browser's skip)
from selenium.webdriver.common.keys import Keys  # noqa: E402

pytestmark = pytest.mark.timeout(420)

GIVEN = "a password the admin chose"
OWN = "my very own password"


def sign_in(walk: Walk, name: str, password: str) -> None:
    walk.open("/console/sign-in")
    walk.find("#sign-in-name").send_keys(name)
    walk.find("#sign-in-password").send_keys(password + Keys.ENTER)
    walk.wait(lambda d: "/console/sign-in" not in d.current_url, f"{name} signed in")


def sign_out(walk: Walk) -> None:
    walk.find(".sign-out button").click()
    walk.wait(lambda d: "notice=signed-out" in d.current_url, "signed out")


@pytest.mark.soak  # 10 s or more of real time: .ci/run runs it (pytest -m soak)
def test_the_account_pages_in_a_real_browser(cluster, browser, tmp_path):  # noqa: F811
    writer = cluster.writer().wait_ready()
    for name, admin in (("root", True), ("alice", False), ("bob", False)):
        make_account(writer.url, name, admin=admin)
    with httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as api:
        assert api.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        for name, level in (("alice", "write"), ("bob", "read")):
            assert api.put(f"/api/v1/repositories/builds/members/{name}", json={"level": level}).status_code == 200
    shots = tmp_path / "screenshots"
    shots.mkdir()
    walk = Walk(browser, writer.url, shots)
    sign_in(walk, "root", PASSWORD)

    # -- members: the tab, a level changed in its row, a removal after its confirmation page ------------
    walk.open("/console/repositories/builds")
    walk.find('a[href="/console/repositories/builds/members"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "members"), "on the members tab")
    walk.page_checks("members")
    bob = '#members tr[data-member="bob"]'
    walk.find(f"{bob} select").send_keys("write")
    walk.find(f"{bob} form button").click()
    walk.wait(lambda d: "notice=member-set" in d.current_url, "the level set")
    assert walk.find(f"{bob} select option:checked").text == "write"
    walk.find(f'{bob} a[aria-label="Remove bob from builds"]').click()  # its confirmation page (confirm.py)
    walk.wait(lambda d: d.find_elements(By.ID, "confirm-form"), "the confirmation page")
    assert walk.text("#confirm-heading") == "Remove bob from the members of builds?"
    walk.page_checks("members-remove-confirm")
    walk.find("#confirm-form button.danger").click()
    walk.wait(lambda d: "notice=member-removed" in d.current_url, "bob removed")
    assert [r.get_attribute("data-member") for r in browser.find_elements(By.CSS_SELECTOR, "#members tbody tr")] == ["alice"]

    # -- a reset, from the accounts page ------------------------------------------------------------------
    walk.open("/console/accounts")
    walk.page_checks("accounts")
    walk.find('a[aria-label="Reset the password of alice"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "reset-form"), "on the reset page")
    walk.page_checks("account-reset")
    walk.find("#reset-password").send_keys(GIVEN)
    walk.find("#reset-password-again").send_keys(GIVEN)
    walk.find("#reset-form button.danger").click()
    walk.wait(lambda d: "notice=account-password-reset" in d.current_url, "the password reset")

    # -- a deletion, after the page that says what goes ----------------------------------------------------
    walk.find('a[aria-label="Delete bob"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "delete-form"), "on the delete page")
    assert "its permissions on 0 repositories go" in walk.text("#delete-effects")
    walk.page_checks("account-delete")
    walk.find("#delete-form button.danger").click()
    walk.wait(lambda d: "notice=account-deleted" in d.current_url, "bob deleted")
    assert not browser.find_elements(By.CSS_SELECTOR, 'tr[data-account="bob"]')

    # -- a token that outlives the session: the page says how long each kind lives -------------------------
    walk.open("/console/tokens")
    chosen = walk.find("#token-lifetime option:checked").text
    assert re.fullmatch(r"Until this session ends: when you sign out, or at the latest .* \(in 1[12] h \d+ min\)", chosen)
    walk.page_checks("tokens-lifetime")
    walk.find("#token-label").send_keys("ci")
    walk.find("#token-lifetime").send_keys("For a number")
    walk.find("#token-days").send_keys("30")
    walk.find("#token-password").send_keys(PASSWORD)
    walk.find("#token-password").submit()
    walk.wait(lambda d: d.find_elements(By.ID, "new-secret"), "the new token shown")
    assert re.search(r"It lives until .* \(in 30 days\), whether or not you sign out", walk.text("#secret-lifetime"))
    walk.page_checks("token-lives")
    sign_out(walk)

    # -- alice, after the reset: only her password page, until she sets her own ----------------------------
    sign_in(walk, "alice", GIVEN)
    walk.wait(lambda d: "/console/account/password" in d.current_url, "sent to the password page")
    assert walk.messages() == ["An administrator reset your password: set your own to go on."]
    assert not browser.find_elements(By.CSS_SELECTOR, 'nav[aria-label="Console sections"]')
    walk.page_checks("password-forced")
    walk.open("/console/repositories/builds")
    walk.wait(lambda d: "/console/account/password" in d.current_url, "sent back to the password page")
    walk.find("#current-password").send_keys(GIVEN)
    walk.find("#new-password").send_keys(OWN)
    walk.find("#new-password-again").send_keys(OWN + Keys.ENTER)
    walk.wait(lambda d: "notice=password-changed" in d.current_url, "her password changed")
    walk.open("/console/repositories/builds")
    walk.wait(lambda d: d.find_elements(By.ID, "upload-form"), "the repository, with her write permission")

    # -- her own password page, reached from her name ------------------------------------------------------
    walk.find('a[href="/console/account/password"]').click()
    walk.wait(lambda d: d.find_elements(By.ID, "password-form"), "on her password page")
    walk.page_checks("password")
    assert len(walk.taken) >= 9
    keep = os.environ.get("CONSOLE_SCREENSHOTS_DIR")
    if keep:
        pathlib.Path(keep).mkdir(parents=True, exist_ok=True)
        for path in walk.taken:
            shutil.copy2(path, pathlib.Path(keep) / f"accounts-{path.name}")
