"""A fake systemd notify socket for the tests: a Unix datagram socket that records what a
process sends to `$NOTIFY_SOCKET`, with the time each message arrived."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Message:
    at: float  # time.monotonic() on arrival
    fields: dict[str, str]

    def __contains__(self, key: str) -> bool:
        return key in self.fields


class NotifySocket:
    """Binds an abstract socket (`@...`, as systemd's own) or, given `path`, a filesystem one.

    `on_message(message)` runs in the receiving thread as each datagram arrives, before the
    next is read: checks that must happen *at that moment* go there."""

    def __init__(self, path: str | None = None, on_message: Callable[[Message], None] | None = None) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if path is None:
            name = f"arkvory-test-notify-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.sock.bind(path)
            self.address = path
        self.sock.settimeout(0.2)
        self.messages: list[Message] = []
        self.on_message = on_message
        self.problems: list[BaseException] = []
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._receive, name="notify-socket", daemon=True)
        self._thread.start()

    def env(self, watchdog_s: float | None = None) -> dict[str, str]:
        env = {"NOTIFY_SOCKET": self.address}
        if watchdog_s is not None:
            env["WATCHDOG_USEC"] = str(int(watchdog_s * 1_000_000))
        return env

    def _receive(self) -> None:
        while not self._closed:
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            message = Message(time.monotonic(), fields)
            if self.on_message is not None:
                try:
                    self.on_message(message)
                except BaseException as exc:  # reported by the test, not lost in this thread
                    self.problems.append(exc)
            with self._changed:
                self.messages.append(message)
                self._changed.notify_all()

    def wait_for(self, key: str, timeout: float = 30.0, after: float = 0.0) -> Message:
        """The first message with `key` that arrived after `after` (monotonic)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for message in self.messages:
                    if key in message and message.at > after:
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {key} within {timeout} s; got {self.summary()}")
                self._changed.wait(left)

    def with_key(self, key: str) -> list[Message]:
        with self._changed:
            return [m for m in self.messages if key in m]

    def summary(self) -> list[str]:
        with self._changed:
            return [" ".join(sorted(m.fields)) for m in self.messages][-20:]

    def close(self) -> None:
        self._closed = True
        self._thread.join(timeout=2)
        self.sock.close()
        if self.address.startswith("/"):
            try:
                os.unlink(self.address)
            except FileNotFoundError:
                pass
