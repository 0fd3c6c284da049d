"""What the client commands print: one JSON document on stdout with `--json`, short human lines
otherwise, and the exit codes by cause that scripts branch on.

Results go to stdout (so `id=$(arkvory put ...)` works), messages and errors to stderr, and an
error is always one line: never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, TextIO

EXIT_OK = 0
EXIT_UNEXPECTED = 1
EXIT_USAGE = 2
EXIT_AUTH = 3
EXIT_NOT_FOUND = 4
EXIT_INTEGRITY = 5
EXIT_CONFLICT = 6
EXIT_NETWORK = 7
EXIT_LOCAL_IO = 8
EXIT_INTERRUPTED = 130

# The table of `arkvory --help`, each command's help and the README. The numbers are a contract:
# scripts branch on them, so one cause never moves to another number.
EXIT_CODES_HELP = """\
exit codes of get, put, ls, stat, rm, login, password, token, key and account:
  0  ok
  1  any other failure: a refusal not listed here (413 too large, 507 server storage
     full, ...) or an unexpected error
  2  usage: bad arguments, options or config file, or only read gateways given
     for a command that needs the writer
  3  authentication or permission: no token, a bad token, or a token without the right
  4  not found: no such repository, artifact, asset or package version
  5  integrity: the bytes do not match their SHA-256
  6  conflict: the server refused a change that clashes with its state
  7  network or busy: no server answered well after all retries, or the address
     refuses connections
  8  local I/O: a local file could not be read or written
"""

# The JSON `code` of an error that did not come from the server's own code.
_DEFAULT_CODES = {
    EXIT_UNEXPECTED: "internal",
    EXIT_USAGE: "usage",
    EXIT_AUTH: "unauthorized",
    EXIT_NOT_FOUND: "not_found",
    EXIT_INTEGRITY: "digest_mismatch",
    EXIT_CONFLICT: "conflict",
    EXIT_NETWORK: "network",
    EXIT_LOCAL_IO: "local_io",
    EXIT_INTERRUPTED: "interrupted",
}


@dataclass(frozen=True)
class Failure:
    """Why a command failed, in the shape both outputs need."""

    exit_code: int
    message: str
    code: str | None = None
    request_id: str | None = None

    @property
    def json_code(self) -> str:
        return self.code or _DEFAULT_CODES.get(self.exit_code, "error")


class Output:
    """Where a command's result and messages go; built once from the parsed options."""

    def __init__(
        self, *, as_json: bool = False, quiet: bool = False,
        stdout: TextIO | None = None, stderr: TextIO | None = None,
    ) -> None:
        self.as_json = as_json
        self.quiet = quiet
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr

    def result(self, data: Any, human: str | None = None) -> None:
        """The command's one result: `data` as JSON, or the `human` text (nothing if None)."""
        try:
            if self.as_json:
                self.stdout.write(json.dumps(data, sort_keys=True) + "\n")
            elif human:
                self.stdout.write(human if human.endswith("\n") else human + "\n")
            self.stdout.flush()
        except BrokenPipeError:
            # The reader left (`arkvory ls | head -1`): the work is done, and the interpreter's
            # own flush at exit must not fail again on the closed pipe.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stdout.fileno())
            os.close(devnull)

    def note(self, message: str) -> None:
        """A line for a person watching (what was saved, what was deleted); silent for machines."""
        if not (self.as_json or self.quiet):
            print(f"arkvory: {message}", file=self.stderr, flush=True)

    def show_retries(self) -> None:
        """Let the library's retry notes (logged at INFO) reach a person watching: a transfer that
        stalls on a busy or cut server says why instead of hanging silently. Not for machines."""
        if self.as_json or self.quiet:
            return
        import logging

        handler = logging.StreamHandler(self.stderr)
        handler.setFormatter(logging.Formatter("arkvory: %(message)s"))
        logger = logging.getLogger("arkvory.client")
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False

    def failure(self, failure: Failure) -> int:
        """Report `failure` and return its exit code; with --json the error is the result."""
        if self.as_json:
            error = {"code": failure.json_code, "message": failure.message, "exit_code": failure.exit_code}
            if failure.request_id:
                error["request_id"] = failure.request_id
            self.stdout.write(json.dumps({"error": error}, sort_keys=True) + "\n")
            self.stdout.flush()
        # Even with --json a person reading the terminal sees why; stdout stays pure JSON.
        line = failure.message.replace("\n", " ").strip()
        if failure.request_id and failure.request_id not in line:
            line += f" (request {failure.request_id})"
        print(f"arkvory: {line}", file=self.stderr, flush=True)
        return failure.exit_code


def failure_from(exc: BaseException) -> Failure:
    """The exit code and message of anything a command raised: the library's errors (and the
    commands' own usage errors) carry their exit code; a bare OSError is local I/O; anything else
    is a bug, said in one line."""
    exit_code = getattr(exc, "exit_code", None)
    if isinstance(exit_code, int) and not isinstance(exit_code, bool):
        return Failure(
            exit_code=exit_code,
            message=str(exc) or type(exc).__name__,
            code=getattr(exc, "code", None),
            request_id=getattr(exc, "request_id", None),
        )
    if isinstance(exc, KeyboardInterrupt):
        return Failure(EXIT_INTERRUPTED, "interrupted")
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return Failure(EXIT_LOCAL_IO, f"{exc.strerror or exc}{where}")
    return Failure(EXIT_UNEXPECTED, f"unexpected error: {type(exc).__name__}: {exc}")


def human_size(size: int | None) -> str:
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def text_table(rows: list[tuple[str, ...]]) -> str:
    """Rows (the first one the header) in aligned columns; the last column, free text such as a
    label, is not padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join([*(cell.ljust(width) for cell, width in zip(row, widths)), row[-1]]).rstrip() for row in rows
    )
