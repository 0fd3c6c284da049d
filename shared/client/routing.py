"""What the client has learned about each base URL: which serve the writer's routes, which are
read gateways, which ever answered, and how often each refused a connection.

SPEC §6 splits the API in two: the content routes, served by every process, and everything
else, served by the writer only (a balancer sends those there). A client given several URLs
(`ARKVORY_URL=gateway,writer`) is not told which is which, so shared/client/transport.py learns
it from the answers and records it here, once per URL for the life of a Client:

- a URL that answered a writer-only request with 2xx serves the writer's routes;
- a URL that answered `405 read_only`, or whose 404 the transport found to mean "no such route
  here" (see transport.py), is a read gateway: writer-only requests skip it from then on;
- a URL that has never answered and refuses connections is most likely a wrong address, not an
  outage: the transport gives up on it after REFUSED_ROUNDS tries instead of backing off for
  minutes. A URL that answered once and then refuses is restarting: that is retried in full.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Literal

# What a refused connection means: "outage" (an address that answered before, or a list of which
# one does: retry by the policy), "give_up" (no address given answers), "try_next" (another URL
# has been refused fewer times: try it at once), "pause" (each was tried this round: a short wait).
Refusal = Literal["outage", "give_up", "try_next", "pause"]

# Each URL is tried this many times (the first and once more) while every one refuses.
REFUSED_ROUNDS = 2


class BaseUrls:
    """The base URLs in the order given, the one the next request goes to, and what is known."""

    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = list(urls)
        self._current = 0
        self.read_only: set[str] = set()
        self.serving_writer: set[str] = set()
        self._answered: set[str] = set()
        self._refusals: collections.Counter[str] = collections.Counter()

    @property
    def current(self) -> str:
        return self.urls[self._current]

    def rotate(self) -> None:
        self._current = (self._current + 1) % len(self.urls)

    def for_writer(self) -> str | None:
        """Make the current URL the first one from here on not known to be a read gateway, and
        return it; None when every URL is one."""
        for step in range(len(self.urls)):
            index = (self._current + step) % len(self.urls)
            if self.urls[index] not in self.read_only:
                self._current = index
                return self.urls[index]
        return None

    def candidates(self, writer_only: bool) -> list[str]:
        """The URLs a request of this kind may go to."""
        return [u for u in self.urls if not (writer_only and u in self.read_only)]

    def answered(self, url: str) -> None:
        self._answered.add(url)

    def refused(self, url: str, writer_only: bool) -> Refusal:
        """Count a refused connection to `url` and say what to do about it (see Refusal).

        Only URLs that never answered count: once every URL this request may use has refused
        REFUSED_ROUNDS times and none of them ever answered, none is going to answer soon."""
        candidates = self.candidates(writer_only)
        if url in self._answered or any(u in self._answered for u in candidates):
            return "outage"
        self._refusals[url] += 1
        if all(self._refusals[u] >= REFUSED_ROUNDS for u in candidates):
            return "give_up"
        if any(self._refusals[u] < self._refusals[url] for u in candidates):
            return "try_next"
        return "pause"
