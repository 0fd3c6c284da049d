"""The progress bar of `arkvory get`/`put`: drawn (percentage, rate) when stderr is a terminal —
the CLI runs under a real pty here — and absent when stderr is piped, with --quiet or --json."""

from __future__ import annotations

import fcntl
import io
import os
import pathlib
import pty
import select
import struct
import subprocess
import termios
import time

import pytest

from arkvory.shared.client.cli_progress import progress_bar, wants_bar

from .test_cli import ARKVORY, REPO, arkvory, assert_exit, cli_env, put, unique_file, writer  # noqa: F401

pytestmark = pytest.mark.timeout(180)

BIG = 24 << 20  # large enough that the transfer takes a few screen updates


def on_terminal(env: dict[str, str], cwd: pathlib.Path, *args: str, timeout: float = 90) -> tuple[int, str, str]:
    """Run the CLI with stderr on a pty (stdout piped); (exit code, what the terminal got, stdout)."""
    master, slave = pty.openpty()
    # A wide terminal, so that tqdm has room for the whole bar.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 200, 0, 0))
    proc = subprocess.Popen(
        [str(ARKVORY), *args], env=env, cwd=cwd,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave,
    )
    os.close(slave)  # the child's copy is the last: its exit ends the terminal (EIO on read)
    terminal = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                continue
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            terminal += data
        else:
            proc.kill()
            raise AssertionError(f"the CLI did not finish in {timeout} s: {terminal!r}")
        code = proc.wait(timeout=30)
        stdout = proc.stdout.read().decode()
    finally:
        os.close(master)
        proc.stdout.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, terminal.decode(errors="replace"), stdout


def assert_bar(terminal: str) -> None:
    assert "100%" in terminal, terminal
    assert "B/s" in terminal, terminal  # the rate
    assert "\r" in terminal, terminal  # redrawn in place


def assert_no_bar(text: str) -> None:
    assert "%|" not in text and "B/s" not in text and "\r" not in text, text


@pytest.fixture
def big_artifact(writer, tmp_path):  # noqa: F811 - the module-scoped writer of test_cli
    env = cli_env(tmp_path, writer.url)
    source = unique_file(tmp_path, "big.bin", BIG)
    return env, put(env, tmp_path, str(source))


def test_get_draws_a_bar_on_a_terminal(big_artifact, tmp_path):
    env, artifact = big_artifact
    code, terminal, stdout = on_terminal(env, tmp_path, "get", REPO, artifact["id"], "-o", "on-tty.bin")
    assert code == 0, terminal
    assert_bar(terminal)
    assert "on-tty.bin" in terminal  # the bar says what it transfers
    assert stdout == ""  # never on stdout, which may be a pipe into another program
    assert (tmp_path / "on-tty.bin").stat().st_size == BIG


def test_put_draws_a_bar_on_a_terminal(writer, tmp_path):  # noqa: F811
    env = cli_env(tmp_path, writer.url)
    source = unique_file(tmp_path, "upload-tty.bin", BIG)
    code, terminal, stdout = on_terminal(env, tmp_path, "put", REPO, str(source))
    assert code == 0, terminal
    assert_bar(terminal)
    assert stdout.strip() and "%" not in stdout  # the id alone


def test_no_bar_when_stderr_is_piped(big_artifact, tmp_path):
    env, artifact = big_artifact
    run = arkvory(env, tmp_path, "get", REPO, artifact["id"], "-o", "piped.bin")
    assert_exit(run, 0)
    assert_no_bar(run.stderr)
    assert "saved" in run.stderr  # the one message a person gets instead


@pytest.mark.parametrize("flag", ["--quiet", "--json"])
def test_no_bar_on_a_terminal_with_quiet_or_json(big_artifact, tmp_path, flag):
    env, artifact = big_artifact
    code, terminal, stdout = on_terminal(env, tmp_path, "get", flag, REPO, artifact["id"], "-o", "flagged.bin")
    assert code == 0, terminal
    assert_no_bar(terminal)
    assert terminal.strip() == ""
    assert ('"sha256"' in stdout) == (flag == "--json")


def test_the_bar_follows_a_download_that_starts_over():
    """The library reports bytes done so far; after a restart (a 200 to a Range, an ETag
    change) that number goes down and the bar must go down with it, not stay at the old count."""
    screen = io.StringIO()
    with progress_bar("file", enabled=True, stream=screen) as progress:
        progress(0, 1000)
        progress(800, 1000)
        progress(100, 1000)
    assert screen.getvalue().rstrip().endswith("]") and " 10%" in screen.getvalue().splitlines()[-1]
    with progress_bar("file", enabled=False) as progress:
        assert progress is None


def test_a_bar_only_for_a_terminal():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert wants_bar(Terminal(), quiet=False, as_json=False)
    assert not wants_bar(Terminal(), quiet=True, as_json=False)
    assert not wants_bar(Terminal(), quiet=False, as_json=True)
    assert not wants_bar(io.StringIO(), quiet=False, as_json=False)
