"""The console's account pages over plain HTTP against a real writer (issue 25 §1, §2, §8): your
own password, the administrator's reset and the change it forces, deleting an account after a
page that says what goes, a repository's members, how long a new token lives, and who uploaded
each artifact. tests/test_console_browser.py walks the same pages in a real browser."""

from __future__ import annotations

import datetime
import re

import httpx
import pytest

from arkvory.writer.console.views import from_now

from .console_client import PASSWORD, Console, make_account, messages
from .harness import ADMIN_TOKEN

pytestmark = pytest.mark.timeout(240)

GIVEN = "a password the admin chose"
OWN = "my very own password"


@pytest.fixture
def writer(cluster):
    writer = cluster.writer(ARKVORY_SESSION_LIFETIME="2h").wait_ready()
    make_account(writer.url, "root", admin=True)
    return writer


def api(writer, token: str = ADMIN_TOKEN) -> httpx.Client:
    return httpx.Client(base_url=writer.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def login_status(writer, name: str, password: str) -> int:
    with httpx.Client(base_url=writer.url, timeout=30) as client:
        return client.post("/api/v1/login", json={"name": name, "password": password}).status_code


def test_from_now_says_how_far_off_a_time_is():
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    later = lambda **delta: (now + datetime.timedelta(**delta)).isoformat()  # noqa: E731
    assert [from_now(later(**d), now) for d in ({"hours": 2}, {"hours": 1, "minutes": 59, "seconds": 31},
                                                 {"minutes": 5}, {"seconds": 10}, {"days": 30}, {"hours": 47},
                                                 {"seconds": -1})] == [
        "in 2 h 0 min", "in 2 h 0 min", "in 5 min", "in 1 min", "in 30 days", "in 47 h 0 min", "passed"]
    assert from_now(None) == "—" and from_now("not a time") == "—"


def test_your_own_password_from_the_console(writer):
    make_account(writer.url, "alice")
    with Console(writer.url) as other:
        other.signed_in("alice")
        with Console(writer.url) as console:
            console.signed_in("alice")
            assert 'href="/console/account/password"' in console.get("/console/repositories").text
            page = console.get("/console/account/password")
            assert page.status_code == 200 and "<h1>Your password</h1>" in page.text
            differ = console.submit("/console/account/password", "/console/account/password", current_password=PASSWORD,
                                    new_password=OWN, new_password_again=OWN + "x")
            assert differ.status_code == 400 and messages(differ) == ["the two new passwords differ: nothing was changed"]
            assert OWN not in differ.text and PASSWORD not in differ.text
            wrong = console.submit("/console/account/password", "/console/account/password", current_password="not mine",
                                   new_password=OWN, new_password_again=OWN)
            assert wrong.status_code == 401 and messages(wrong) == ["the old password is wrong"]
            assert login_status(writer, "alice", PASSWORD) == 200
            changed = console.submit("/console/account/password", "/console/account/password",
                                     current_password=PASSWORD, new_password=OWN, new_password_again=OWN)
            assert changed.status_code == 303 and changed.headers["location"] == "/console/?notice=password-changed"
            # An account lands on its repositories, with the notice (the overview is the operator's).
            landed = console.get(changed.headers["location"])
            assert landed.headers["location"] == "/console/repositories?notice=password-changed"
            assert messages(console.get(landed.headers["location"]))[0].startswith("Your password was changed")
            assert console.get("/console/tokens").status_code == 200  # this session goes on
        assert other.get("/console/tokens").status_code == 303  # the other one ended
    assert login_status(writer, "alice", PASSWORD) == 401 and login_status(writer, "alice", OWN) == 200


def test_after_a_reset_the_console_shows_only_the_password_page(writer):
    make_account(writer.url, "alice")
    with Console(writer.url) as root:
        root.signed_in("root")
        accounts = root.get("/console/accounts").text
        assert 'href="/console/accounts/alice/password"' in accounts and 'href="/console/accounts/alice/delete"' in accounts
        # root's own row offers nothing that would lock root out.
        own_row = re.search(r'<tr data-account="root">.*?</tr>', accounts, re.S).group(0)
        assert "/disable" not in own_row and "/delete" not in own_row and "/password" not in own_row
        page = root.get("/console/accounts/alice/password")
        assert page.status_code == 200 and "<h1>Reset the password of <span class=\"name\">alice</span></h1>" in page.text
        assert "Its 0 session(s) end at once" in page.text
        differ = root.submit("/console/accounts/alice/password", "/console/accounts/alice/password",
                             password=GIVEN, password_again=GIVEN + "!")
        assert differ.status_code == 400 and messages(differ) == ["the two passwords differ: nothing was changed"]
        reset = root.submit("/console/accounts/alice/password", "/console/accounts/alice/password",
                            password=GIVEN, password_again=GIVEN)
        assert reset.status_code == 303 and reset.headers["location"] == "/console/accounts?notice=account-password-reset"
        assert "must set a new password" in root.get("/console/accounts").text
        assert root.get("/console/accounts/root/password").status_code == 200  # the page; the API refuses:
        own = root.submit("/console/accounts/root/password", "/console/accounts/root/password",
                          password=GIVEN, password_again=GIVEN)
        assert own.status_code == 403 and "/api/v1/account/password" in messages(own)[0]

    with Console(writer.url) as alice:
        alice.signed_in("alice", GIVEN)
        for path in ("/console/", "/console/repositories", "/console/tokens", "/console/keys"):
            sent = alice.get(path)
            assert sent.status_code == 303, path
            assert sent.headers["location"] == "/console/account/password?notice=password-change-required", path
        page = alice.get("/console/account/password?notice=password-change-required")
        assert page.status_code == 200 and "The password you were given" in page.text
        assert messages(page) == ["An administrator reset your password: set your own to go on."]
        assert 'aria-label="Console sections"' not in page.text  # no way to anywhere else
        refused = alice.submit("/console/account/password", "/console/tokens", access="read")
        assert refused.status_code == 303 and refused.headers["location"].startswith("/console/account/password")
        changed = alice.submit("/console/account/password", "/console/account/password", current_password=GIVEN,
                               new_password=OWN, new_password_again=OWN)
        assert changed.status_code == 303 and changed.headers["location"] == "/console/?notice=password-changed"
        assert alice.get("/console/tokens").status_code == 200
        assert 'aria-label="Console sections"' in alice.get("/console/repositories").text


def test_deleting_an_account_from_the_console_says_first_what_goes(writer):
    make_account(writer.url, "alice")
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        assert client.put("/api/v1/repositories/builds/members/alice", json={"level": "write"}).status_code == 200
    with Console(writer.url) as alice, Console(writer.url) as root:
        alice.signed_in("alice")
        root.signed_in("root")
        page = root.get("/console/accounts/alice/delete")
        assert page.status_code == 200 and "<h1>Delete the account <span class=\"name\">alice</span>?</h1>" in page.text
        assert re.search(r'data-holds="sessions">1 session\(s\) and 0 personal token\(s\)', page.text)
        assert re.search(r'data-holds="repositories">its permissions on 1 repositories go', page.text)
        assert root.get("/console/accounts/nobody/delete").status_code == 404
        # The page is the confirmation (confirm.py's rule): a form sent without its `confirm`
        # (an old page, a script) gets the page again, and deletes nobody.
        assert '<input type="hidden" name="confirm" value="yes">' in page.text
        asked = root.submit("/console/accounts/alice/delete", "/console/accounts/alice/delete")
        assert asked.status_code == 200 and 'id="delete-form"' in asked.text and "Delete the account" in asked.text
        assert alice.get("/console/repositories").status_code == 200  # still there, still signed in
        deleted = root.submit("/console/accounts/alice/delete", "/console/accounts/alice/delete", confirm="yes")
        assert deleted.status_code == 303 and deleted.headers["location"] == "/console/accounts?notice=account-deleted"
        assert alice.get("/console/").headers["location"] == "/console/sign-in"  # her session ended
        assert 'data-account="alice"' not in root.get("/console/accounts").text
        own = root.submit("/console/accounts/root/delete", "/console/accounts/root/delete", confirm="yes")
        assert own.status_code == 403 and messages(own) == ["an account cannot delete itself: ask another administrator"]
    with api(writer) as client:
        assert client.get("/api/v1/accounts/alice").status_code == 404


def test_a_repositorys_members_on_its_page(writer):
    for name in ("bob", "carol", "dave"):
        make_account(writer.url, name)
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        assert client.put("/api/v1/repositories/builds/members/bob", json={"level": "admin"}).status_code == 200
        assert client.put("/api/v1/repositories/builds/members/dave", json={"level": "write"}).status_code == 200
    with Console(writer.url) as bob, Console(writer.url) as dave:
        bob.signed_in("bob")
        dave.signed_in("dave")
        assert 'href="/console/repositories/builds/members"' in bob.get("/console/repositories/builds").text
        assert "/members" not in dave.get("/console/repositories/builds").text  # write does not manage members
        assert dave.get("/console/repositories/builds/members").status_code == 403
        assert bob.get("/console/repositories/builds/permissions").headers["location"] == "/console/repositories/builds/members"
        added = bob.submit("/console/repositories/builds/members", "/console/repositories/builds/members",
                           account="CAROL", level="read")
        assert added.status_code == 303 and added.headers["location"] == "/console/repositories/builds/members?notice=member-set"
        page = bob.get("/console/repositories/builds/members")
        rows = re.findall(r'<tr data-member="([^"]+)">.*?<option value="(\w+)" selected>', page.text, re.S)
        assert rows == [("bob", "admin"), ("carol", "read"), ("dave", "write")]
        changed = bob.submit("/console/repositories/builds/members", "/console/repositories/builds/members",
                             account="carol", level="write")
        assert changed.status_code == 303
        asked = bob.submit("/console/repositories/builds/members", "/console/repositories/builds/members/remove",
                           account="dave")  # asks first (confirm.py), removes nothing
        assert asked.status_code == 200 and "Remove dave from the members of builds?" in asked.text
        assert 'href="/console/repositories/builds/members/remove?account=dave"' in page.text  # its row's link
        removed = bob.submit("/console/repositories/builds/members", "/console/repositories/builds/members/remove",
                             account="dave", confirm="yes")
        assert removed.headers["location"] == "/console/repositories/builds/members?notice=member-removed"
        refused = bob.submit("/console/repositories/builds/members", "/console/repositories/builds/members",
                             account="carol", level="owner")
        assert refused.status_code == 400 and 'value="carol"' in refused.text  # the form keeps what was typed
        assert dave.get("/console/repositories/builds").status_code == 404  # dave reads it no more
    with api(writer) as client:
        members = client.get("/api/v1/repositories/builds/members").json()["items"]
    assert [(m["account"], m["level"]) for m in members] == [("bob", "admin"), ("carol", "write")]


def test_a_token_page_says_how_long_each_kind_lives(writer):
    with Console(writer.url) as root:
        root.signed_in("root")
        page = root.get("/console/tokens").text
        lifetime = re.search(r'<option value="session" selected>Until this session ends: when you sign out, or at the'
                             r" latest ([0-9-]+ [0-9:]+ UTC) \((.*?)\)</option>", page)
        assert lifetime and lifetime.group(2) in ("in 2 h 0 min", "in 1 h 59 min"), page
        assert '<option value="days">For a number of days, past this session: needs your password again</option>' in page
        tied = root.submit("/console/tokens", "/console/tokens", access="read", label="tied", lifetime="session",
                           expires_days="30", password=PASSWORD)
        assert tied.status_code == 201
        assert re.search(r"It ends with this session:\s+when you sign out, or at the latest", tied.text)
        needs = root.submit("/console/tokens", "/console/tokens", access="read", lifetime="days", expires_days="30")
        assert needs.status_code == 400 and "needs your password" in messages(needs)[0]
        lives = root.submit("/console/tokens", "/console/tokens", access="read", label="ci", lifetime="days",
                            expires_days="30", password=PASSWORD)
        assert lives.status_code == 201
        assert re.search(r"It lives until [0-9-]+ [0-9:]+ UTC \(in 30 days\), whether or not you\s+sign out", lives.text)
        assert "or when this session ends" in lives.text  # the tied one, in the list
        keys = root.submit("/console/keys", "/console/keys", scopes="read:*", lifetime="session")
        assert keys.status_code == 201 and "It ends with this session" in keys.text
        session = root.session
    with api(writer, session) as client:
        made = {t["label"]: t for t in client.get("/api/v1/tokens").json()["items"]}
    assert made["tied"]["passwordGiven"] is False and made["tied"]["endsWith"] is not None
    assert made["ci"]["passwordGiven"] is True and made["ci"]["endsWith"] is None
    expires = datetime.datetime.fromisoformat(made["ci"]["expiresAt"]) - datetime.datetime.now(datetime.UTC)
    assert abs(expires.total_seconds() - 30 * 86400) < 600


def test_the_artifact_pages_say_who_uploaded_it(writer, cluster):
    make_account(writer.url, "alice")
    with api(writer) as client:
        assert client.post("/api/v1/repositories", json={"name": "builds"}).status_code == 201
        assert client.put("/api/v1/repositories/builds/members/alice", json={"level": "write"}).status_code == 200
        by_key = client.post("/api/v1/repositories/builds/artifacts", params={"name": "k.bin"}, content=b"k").json()
    with Console(writer.url) as alice:
        alice.signed_in("alice")
        with api(writer, alice.session) as client:
            by_alice = client.post("/api/v1/repositories/builds/artifacts", params={"name": "a.bin"}, content=b"a").json()
        page = alice.get(f"/console/repositories/builds/artifacts/{by_alice['id']}").text
        assert re.search(r'<dd id="artifact-uploader">alice <span class="hint">\(account\)</span></dd>', page)
        page = alice.get(f"/console/repositories/builds/artifacts/{by_key['id']}").text
        assert re.search(r'<dd id="artifact-uploader">admin <span class="hint">\(keys-file key\)</span></dd>', page)
        listing = alice.get("/console/repositories/builds").text
        assert "<th scope=\"col\">By</th>" in listing and listing.count('(account)</span>') == 1
