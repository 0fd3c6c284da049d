"""`arkvory password` and `arkvory account list|show|reset-password|delete` (issue 25 §1): the
real CLI in a subprocess against a real writer and gateway, passwords through standard input and
through a terminal, never through an argument; and `arkvory login` after an administrator's reset."""

from __future__ import annotations

import os
import tomllib
import uuid

import pytest

from .harness import ADMIN_TOKEN
from .test_cli import ARKVORY, arkvory, assert_exit, cli_env, json_of
from .test_cli_credentials import PASSWORD, _read_until, config_of, home, logged_in, stack, typed  # noqa: F401

pytestmark = pytest.mark.timeout(180)

GIVEN = "a password the admin chose"
OWN = "my very own password"


def new_account(stack, admin: bool = False) -> str:
    name = f"acct-{uuid.uuid4().hex[:8]}"
    with stack.writer_process.client(ADMIN_TOKEN) as client:
        assert client.post("/api/v1/accounts", json={"name": name, "password": PASSWORD, "admin": admin}).status_code == 201
    return name


def login_status(stack, name: str, password: str) -> int:
    with stack.writer_process.client(None) as client:
        return client.post("/api/v1/login", json={"name": name, "password": password}).status_code


def test_password_from_standard_input_keeps_the_profiles_token(stack, home, tmp_path):
    name = new_account(stack)
    token = logged_in(stack, name, home, tmp_path)
    env = cli_env(home, stack.urls, token=None)
    wrong = typed(env, tmp_path, f"not it\n{OWN}\n", "password", name)
    assert_exit(wrong, 3)
    assert "wrong account name or password" in wrong.stderr
    run = typed(env, tmp_path, f"{PASSWORD}\n{OWN}\n", "password", name)
    assert_exit(run, 0)
    assert f"the password of {name} is changed" in run.stderr and OWN not in run.stderr + run.stdout
    assert login_status(stack, name, PASSWORD) == 401 and login_status(stack, name, OWN) == 200
    # The token `login` stored was made with the password: it stays.
    assert tomllib.loads(config_of(home).read_text())["profiles"]["default"]["token"] == token
    assert_exit(arkvory(cli_env(home, None, token=None), tmp_path, "token", "list"), 0)
    same = typed(env, tmp_path, f"{OWN}\n{OWN}\n", "password", name)
    assert_exit(same, 2)
    assert "must differ from the old one" in same.stderr


def test_password_on_a_terminal_asks_the_new_one_twice(stack, home, tmp_path):
    name = new_account(stack)
    env = cli_env(home, stack.urls, token=None)

    def on_a_terminal(answers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
        import pty

        pid, terminal = pty.fork()
        if pid == 0:
            try:
                os.chdir(tmp_path)
                os.execve(str(ARKVORY), [str(ARKVORY), "password", name], env)
            finally:
                os._exit(127)
        seen = b""
        try:
            for prompt, answer in answers:
                seen += _read_until(terminal, prompt)
                os.write(terminal, answer + b"\n")
            seen += _read_until(terminal, None)
        finally:
            _, status = os.waitpid(pid, 0)
            os.close(terminal)
        return os.waitstatus_to_exitcode(status), seen

    prompts = [f"current password for {name}: ".encode(), b"new password: ", b"new password again: "]
    status, seen = on_a_terminal(list(zip(prompts, [PASSWORD.encode(), OWN.encode(), b"a typo"])))
    assert status == 2 and b"the two new passwords differ" in seen, seen
    assert login_status(stack, name, PASSWORD) == 200
    status, seen = on_a_terminal(list(zip(prompts, [PASSWORD.encode(), OWN.encode(), OWN.encode()])))
    assert status == 0, seen
    assert OWN.encode() not in seen and PASSWORD.encode() not in seen  # never echoed
    assert login_status(stack, name, OWN) == 200


def test_after_a_reset_login_stores_nothing_until_the_password_is_set(stack, home, tmp_path):
    name = new_account(stack)
    admin_home = tmp_path / "admin"
    admin_home.mkdir()
    admin_env = cli_env(admin_home, stack.urls, token=ADMIN_TOKEN)
    reset = typed(admin_env, tmp_path, f"{GIVEN}\n", "account", "reset-password", name, "--json")
    assert_exit(reset, 0)
    assert json_of(reset)["mustChangePassword"] is True and json_of(reset)["sessionsEnded"] == 0
    assert f"`arkvory password {name}`" in typed(admin_env, tmp_path, f"{GIVEN}\n", "account", "reset-password", name).stderr
    env = cli_env(home, stack.urls, token=None)
    refused = typed(env, tmp_path, f"{GIVEN}\n", "login", name)
    assert_exit(refused, 3)
    assert f"set your own with `arkvory password {name}`" in refused.stderr
    assert not config_of(home).exists()
    changed = typed(env, tmp_path, f"{GIVEN}\n{OWN}\n", "password", name)
    assert_exit(changed, 0)
    assert "log in again" in changed.stderr
    assert_exit(typed(env, tmp_path, f"{OWN}\n", "login", name), 0)
    listed = arkvory(admin_env, tmp_path, "account", "list", "--json")
    assert_exit(listed, 0)
    assert {a["name"]: a["mustChangePassword"] for a in json_of(listed)["accounts"]}[name] is False
    short = typed(admin_env, tmp_path, "short\n", "account", "reset-password", name)
    assert_exit(short, 2)


def test_account_show_and_delete(stack, home, tmp_path):
    name = new_account(stack)
    token = logged_in(stack, name, home, tmp_path)
    admin_env = cli_env(tmp_path, stack.urls, token=ADMIN_TOKEN)
    shown = arkvory(admin_env, tmp_path, "account", "show", name)
    assert_exit(shown, 0)
    assert "holds     0 session(s), 1 personal token(s), 0 managed key(s) it made, a permission on 0 repositories" in shown.stdout
    deleted = arkvory(admin_env, tmp_path, "account", "delete", name, "--json")
    assert_exit(deleted, 0)
    assert json_of(deleted)["ended"]["tokens"] == 1
    assert_exit(arkvory(cli_env(home, None, token=None), tmp_path, "token", "list"), 3)  # its token is gone
    assert_exit(arkvory(admin_env, tmp_path, "account", "delete", name), 4)
    # An administrator account cannot delete itself (exit 3, a refusal of who asks).
    root = new_account(stack, admin=True)
    root_home = tmp_path / "root"
    root_home.mkdir()
    logged_in(stack, root, root_home, tmp_path)
    own = arkvory(cli_env(root_home, None, token=None), tmp_path, "account", "delete", root)
    assert_exit(own, 3)
    assert "cannot delete itself" in own.stderr
