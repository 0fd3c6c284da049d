"""Payload token buckets (SPEC §4): every chunk of a download passes the process bucket and its
principal's bucket; principals that have to wait are served round-robin by one dispatcher.

Bucket state is kept in integer byte-nanoseconds, so the guarantee "bytes granted (taken from a
bucket) in any interval ≤ rate × elapsed + burst" holds exactly, without floating-point slack.

Grants are sized from the rate (issue 6 §6, which overrides SPEC §4's fixed 64 KiB quanta): about
10 ms of the smaller configured rate, between 64 KiB and 1 MiB, never above a bucket's burst. A
fast share then moves 1 MiB per grant, so the Python work per GiB stays small on any CPU, while a
slow one keeps fine-grained turns; fairness is unchanged (one grant per turn, round-robin).
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger("arkvory.throttle")

MIN_QUANTUM_BYTES = 64 * 1024  # the smallest most-one-grant-hands-out (unless a burst is smaller)
MAX_QUANTUM_BYTES = 1024 * 1024
QUANTUM_NS = 10_000_000  # a quantum is about this much time at the smaller configured rate
MAX_BURST_BYTES = 1024 * 1024

_NS = 1_000_000_000
_SWEEP_EVERY_NS = _NS  # how often idle principal buckets are looked for and dropped
# The dispatcher never sleeps less than this: event loops keep timers in milliseconds (uvloop
# rounds 0.3 ms down to 0, which would make a dispatcher waiting for 0.3 ms of refill spin).
# A longer sleep loses nothing: the next wake-up grants everything refilled meanwhile.
_MIN_SLEEP_NS = 1_000_000

# Where a principal with waiters sits in the scheduler.
_IDLE, _RING, _HEAP = 0, 1, 2


def burst_for(rate: int) -> int:
    """Bucket size for `rate` bytes/s: a tenth of a second of traffic, at most 1 MiB."""
    _check_rate("rate", rate)
    return max(1, min(rate // 10, MAX_BURST_BYTES))


def quantum_for(process_rate: int | None, per_principal_rate: int | None) -> int:
    """The most one grant hands out: ~10 ms of the smaller rate, within [64 KiB, 1 MiB], and
    never more than either bucket's burst (a grant must fit in a full bucket)."""
    rates = [rate for rate in (process_rate, per_principal_rate) if rate is not None]
    if not rates:
        return MAX_QUANTUM_BYTES  # unmetered: grant() does not cut at all
    slowest = min(rates)
    quantum = min(max(slowest * QUANTUM_NS // _NS, MIN_QUANTUM_BYTES), MAX_QUANTUM_BYTES)
    return min(quantum, *(burst_for(rate) for rate in rates))


def _check_rate(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number of bytes per second ≥ 1, got {value!r}")


def _ns(seconds: float) -> int:
    # Rounding (not truncation) keeps a clock that counts whole nanoseconds exact; both are
    # monotonic, which is all the bucket arithmetic needs.
    return int(seconds * 1e9 + 0.5)


class TokenBucket:
    """`rate` bytes/s up to `burst` bytes; starts full. Time comes from the injected `clock`."""

    __slots__ = ("_rate", "_burst", "_clock", "_cap", "_credit", "_stamp", "_rate_set_at")

    def __init__(self, rate: int, burst: int, clock: Callable[[], float]) -> None:
        _check_rate("rate", rate)
        if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
            raise ValueError(f"burst must be a whole number of bytes ≥ 1, got {burst!r}")
        self._rate = rate
        self._burst = burst
        self._clock = clock
        self._cap = burst * _NS
        self._credit = self._cap  # byte-nanoseconds
        self._stamp = _ns(clock())
        self._rate_set_at = 0  # when `set_rate` last changed the rate (ns)

    @property
    def rate(self) -> int:
        return self._rate

    @property
    def burst(self) -> int:
        return self._burst

    def available(self) -> int:
        """Whole bytes that could be taken now."""
        self._refill(_ns(self._clock()))
        return self._credit // _NS

    def try_take(self, size: int) -> bool:
        """Take `size` bytes if they are there now; never waits."""
        self._check_size(size)
        self._refill(_ns(self._clock()))
        if not self._can(size):
            return False
        self._take(size)
        return True

    def delay(self, size: int) -> float:
        """Seconds until `size` bytes will be there (0.0 if they are now)."""
        self._check_size(size)
        self._refill(_ns(self._clock()))
        return self._ready_in(size) / _NS

    def set_rate(self, rate: int, now: int) -> None:
        """Refill at the old rate up to `now` (ns), then go on at `rate`. The burst stays: a
        change never adds credit, and what is there is at most the burst (demand mode,
        shared/cluster/grants.py §5)."""
        _check_rate("rate", rate)
        self._refill(now)
        if rate != self._rate:
            self._rate = rate
            self._rate_set_at = now

    def _check_size(self, size: int) -> None:
        if not 1 <= size <= self._burst:
            raise ValueError(f"size must be between 1 and the burst ({self._burst}), got {size!r}")

    # The scheduler calls the methods below with one clock reading per decision; every take is
    # preceded by a refill to the same instant (taking from a stale credit could hand out refill
    # that the cap would have thrown away).

    def _refill(self, now: int) -> None:
        elapsed = now - self._stamp
        if elapsed > 0:
            credit = self._credit + elapsed * self._rate
            self._credit = credit if credit < self._cap else self._cap
            self._stamp = now

    def _can(self, size: int) -> bool:
        return self._credit >= size * _NS

    def _ready_in(self, size: int) -> int:
        """Nanoseconds until `size` bytes are available; 0 if they are now."""
        deficit = size * _NS - self._credit
        return -(-deficit // self._rate) if deficit > 0 else 0

    def _take(self, size: int) -> None:
        self._credit -= size * _NS

    def _take_if_there(self, size: int, now: int) -> bool:
        """`_refill`, `_can` and `_take` in one call instead of four (grant_now's, when the
        process bucket is the only one: once per MiB of an unthrottled stream)."""
        credit = self._credit
        elapsed = now - self._stamp
        if elapsed > 0:
            credit += elapsed * self._rate
            if credit > self._cap:
                credit = self._cap
            self._stamp = now
        needed = size * _NS
        if credit < needed:
            self._credit = credit
            return False
        self._credit = credit - needed
        return True

    def _give_back(self, size: int, taken_at: int, now: int) -> None:
        """Return tokens taken at `taken_at` for a caller that never used them.

        Returning all of them could beat the guarantee: while they were out, the bucket may have
        refilled to the cap and thrown refill away that it would otherwise have kept. At most
        rate × (now − taken_at) can have been thrown away, so giving back the rest leaves the
        bucket no fuller than if the take had never happened.
        """
        self._refill(now)
        if taken_at < self._rate_set_at:
            return  # the rate changed meanwhile: what was thrown away is not known, keep none
        returned = size * _NS - self._rate * max(0, now - taken_at)
        if returned > 0:
            credit = self._credit + returned
            self._credit = credit if credit < self._cap else self._cap

    def _is_full(self, now: int) -> bool:
        self._refill(now)
        return self._credit == self._cap


class _Waiter:
    __slots__ = ("future", "size")

    def __init__(self, future: asyncio.Future[int], size: int) -> None:
        self.future = future  # resolves to the instant (ns) the tokens were taken
        self.size = size


class _Principal:
    __slots__ = ("bucket", "waiters", "queued", "granted")

    def __init__(self, bucket: TokenBucket | None) -> None:
        self.bucket = bucket
        self.waiters: deque[_Waiter] = deque()
        self.queued = _IDLE
        # Bytes granted to this principal while it is tracked (counted here instead of in the
        # scheduler's total, not in addition to it: `granted_bytes` adds them up when read).
        self.granted = 0


class BandwidthScheduler:
    """Hands out payload bytes under a process rate and a per-principal rate (`None` = unlimited).

    A caller that finds nobody queued ahead of it for the tokens it needs takes them without
    yielding. Everyone else waits in their principal's FIFO. Principals whose own bucket is short
    wait in a heap keyed by the instant it will hold enough; principals whose own bucket is ready
    wait in a ring for the process bucket and are served strictly round-robin, one grant per turn.
    One dispatcher task (started when the first caller has to wait, gone when nobody waits) sleeps
    exactly until the next grant is possible (but at least 1 ms, see `_MIN_SLEEP_NS`), and is
    woken early only when a newcomer could be served more than that much sooner.
    """

    def __init__(
        self,
        process_rate: int | None,
        per_principal_rate: int | None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    ) -> None:
        if process_rate is not None:
            _check_rate("process_rate", process_rate)
        if per_principal_rate is not None:
            _check_rate("per_principal_rate", per_principal_rate)
        self._clock = clock
        self._sleep = sleep
        self._process_rate = process_rate
        self._per_principal_rate = per_principal_rate
        self._per_principal_burst = burst_for(per_principal_rate) if per_principal_rate else None
        self._process = (
            TokenBucket(process_rate, burst_for(process_rate), clock) if process_rate else None
        )
        self._unlimited = process_rate is None and per_principal_rate is None
        self._quantum = quantum_for(process_rate, per_principal_rate)

        self._principals: dict[str, _Principal] = {}
        self._ring: deque[_Principal] = deque()  # own bucket ready, waiting for the process bucket
        self._heap: list[tuple[int, int, _Principal]] = []  # (ready at ns, tie-breaker, principal)
        self._sequence = 0
        self._waiting = 0
        self._next_sweep = 0

        self._dispatcher: asyncio.Task[None] | None = None
        self._sleeping_until: int | None = None  # the dispatcher's wake-up time while it sleeps
        self._woken = False  # the dispatcher's sleep is being cut short on purpose
        self._closed: BaseException | None = None

        self._granted_bytes = 0
        self._wait_ns = 0
        # Demand mode: principals with a rate of their own; their buckets are kept (not swept).
        self._principal_rates: dict[str, int] = {}

    # -- what health and metrics read ------------------------------------------------------

    @property
    def unlimited(self) -> bool:
        """No rate at all (a standalone writer without local limits): callers may skip grant()."""
        return self._unlimited

    @property
    def bytes_per_second(self) -> int | None:
        return self._process_rate

    @property
    def per_principal_bytes_per_second(self) -> int | None:
        return self._per_principal_rate

    @property
    def burst_bytes(self) -> int | None:
        """Size of the process bucket; `None` when the process rate is unlimited."""
        return self._process.burst if self._process is not None else None

    @property
    def quantum_bytes(self) -> int:
        return self._quantum

    @property
    def granted_bytes(self) -> int:
        """Bytes granted since the start (read by health, metrics and demand mode's tick: the
        sum over the tracked principals is made here, never per chunk)."""
        return self._granted_bytes + sum(principal.granted for principal in self._principals.values())

    def principal_usage(self, principal_ids) -> dict[str, tuple[int, bool]]:
        """For each of `principal_ids` still tracked: the bytes granted to it while tracked, and
        whether its own bucket holds less than one grant now (it waits for its own rate, not
        the process's). Demand mode's tick reads this a few times a second."""
        now = _ns(self._clock())
        quantum = self._quantum
        usage = {}
        principals = self._principals
        for principal_id in principal_ids:
            principal = principals.get(principal_id)
            if principal is None:
                continue
            bucket = principal.bucket
            short = False
            if bucket is not None:
                bucket._refill(now)
                short = bucket._ready_in(min(quantum, bucket._burst)) > 0
            usage[principal_id] = (principal.granted, short)
        return usage

    @property
    def wait_seconds(self) -> float:
        """Total time callers spent waiting for tokens (including waits that ended in an error)."""
        return self._wait_ns / _NS

    @property
    def waiting(self) -> int:
        return self._waiting

    @property
    def tracked_principals(self) -> int:
        return len(self._principals)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # -- granting --------------------------------------------------------------------------

    def grant_now(self, principal_id: str, want: int) -> int:
        """`grant` when it need not wait: the n bytes it would return, taken now; 0 when the
        caller has to wait (nobody may be overtaken, or a bucket is short): then `await grant`,
        which queues it. A plain call where a coroutine per chunk, small downloads included,
        costs more than the check (issue 14 §3)."""
        if self._closed is not None:
            raise self._closed.with_traceback(None)
        if want < 1:
            raise ValueError(f"want must be at least 1 byte, got {want!r}")
        if self._unlimited:
            self._granted_bytes += want
            return want
        size = want if want < self._quantum else self._quantum

        now = int(self._clock() * 1e9 + 0.5)  # _ns(), inline: this runs per chunk
        if now >= self._next_sweep:
            self._sweep(now)
        process = self._process
        if self._per_principal_rate is None:
            # Only the process bucket (not unlimited, so it exists): the common shared mode.
            if self._ring or not process._take_if_there(size, now):
                return 0  # others wait for it (nobody is overtaken), or too few tokens now
            self._granted_bytes += size
            return size
        principal = self._principals.get(principal_id)
        if principal is None:
            bucket = TokenBucket(self._per_principal_rate, self._per_principal_burst, self._clock)
            principal = self._principals[principal_id] = _Principal(bucket)

        # Fast path: nobody is queued ahead of us for the tokens we need.
        if not principal.waiters and (process is None or not self._ring):
            bucket = principal.bucket
            if bucket is not None:
                bucket._refill(now)
                ready = bucket._can(size)
            else:
                ready = True
            if ready and process is not None:
                process._refill(now)
                ready = process._can(size)
            if ready:
                if bucket is not None:
                    bucket._take(size)
                if process is not None:
                    process._take(size)
                principal.granted += size
                return size

        return 0

    def grant_now_up_to(self, principal_id: str, want: int) -> int:
        """As many bytes as `grant_now` hands out without waiting, quantum after quantum, up to
        `want` in all; 0 when none (or `want` < 1). Each quantum is a grant of its own through
        both buckets, so the guarantee holds; a zero-copy send then moves them in one system
        call instead of one Python turn per quantum (issue 26)."""
        total = 0
        while total < want:
            size = self.grant_now(principal_id, want - total)
            if not size:
                break
            total += size
        return total

    async def grant(self, principal_id: str, want: int) -> int:
        """Wait for and return n bytes, 1 ≤ n ≤ min(want, quantum), that passed both buckets.

        Without any rate there is no bucket and no quantum: all of `want` is granted at once, so
        an unthrottled transfer can move large chunks.
        """
        granted = self.grant_now(principal_id, want)
        if granted:
            return granted
        size = want if want < self._quantum else self._quantum
        principal = self._principals.get(principal_id)
        if principal is None:  # with a per-principal rate, grant_now made it (with its bucket)
            principal = self._principals[principal_id] = _Principal(None)
        return await self._wait(principal, size, _ns(self._clock()))

    async def _wait(self, principal: _Principal, size: int, now: int) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, size)
        principal.waiters.append(waiter)
        self._waiting += 1
        if principal.queued == _IDLE:
            self._enqueue(principal, size, now)
        try:
            await future  # resolves to the instant the dispatcher took our tokens
        except BaseException:
            end = _ns(self._clock())
            self._wait_ns += end - now
            if not future.done() or future.cancelled():
                self._forget(principal, waiter)
            elif future.exception() is None:
                # Granted, then cancelled before we could send: the tokens go back.
                self._give_back(principal, size, future.result(), end)
            raise
        self._wait_ns += _ns(self._clock()) - now
        if self._closed is not None:
            raise self._closed.with_traceback(None)
        principal.granted += size
        return size

    def _enqueue(self, principal: _Principal, size: int, now: int) -> None:
        """Put a principal that just got its first waiter in the ring or the heap."""
        process_idle = not self._ring
        bucket = principal.bucket
        own_wait = 0
        if bucket is not None:
            bucket._refill(now)
            own_wait = bucket._ready_in(size)
        if own_wait:
            ready_at = now + own_wait
            self._sequence += 1
            heapq.heappush(self._heap, (ready_at, self._sequence, principal))
            principal.queued = _HEAP
        else:
            self._ring.append(principal)
            principal.queued = _RING
            ready_at = now
            if self._process is not None:
                self._process._refill(now)
                ready_at += self._process._ready_in(size)
        # With others already waiting for the process bucket the dispatcher's wake-up is set by
        # the head of the ring, which goes first; otherwise it may be asleep for a later instant.
        self._wake_dispatcher(ready_at if process_idle else None)

    def _wake_dispatcher(self, ready_at: int | None) -> None:
        task = self._dispatcher
        if task is None:
            self._dispatcher = asyncio.get_running_loop().create_task(
                self._dispatch(), name="arkvory-bandwidth-dispatcher"
            )
        elif (
            ready_at is not None
            and self._sleeping_until is not None
            and ready_at + _MIN_SLEEP_NS < self._sleeping_until
            and not self._woken
        ):
            # Cut the sleep short; `_dispatch` tells this apart from a real cancellation.
            self._woken = True
            task.cancel()

    def _forget(self, principal: _Principal, waiter: _Waiter) -> None:
        """A waiter left before it was served (cancelled): drop it, its tokens were never taken."""
        try:
            principal.waiters.remove(waiter)
        except ValueError:
            return  # the dispatcher or close() already dropped it
        self._waiting -= 1
        # An emptied principal stays in the ring or heap; the dispatcher drops it when it gets
        # there, which is cheaper than searching for it now.

    def _give_back(self, principal: _Principal, size: int, granted_at: int, now: int) -> None:
        if self._process is not None:
            self._process._give_back(size, granted_at, now)
        if principal.bucket is not None:
            principal.bucket._give_back(size, granted_at, now)

    def _sweep(self, now: int) -> None:
        """Drop principals that wait for nothing and whose bucket is full: a new full bucket is
        the same state, so nothing is lost and memory stays bounded by the active principals."""
        self._next_sweep = now + _SWEEP_EVERY_NS
        idle = [
            principal_id
            for principal_id, principal in self._principals.items()
            if principal.queued == _IDLE
            and not principal.waiters
            and (principal.bucket is None or principal.bucket._is_full(now))
            and principal_id not in self._principal_rates
        ]
        for principal_id in idle:
            self._granted_bytes += self._principals.pop(principal_id).granted

    # -- demand mode: new rates from a grant -------------------------------------------------

    def set_rates(
        self, process_rate: int | None, principal_rates: dict[str, int], principal_default: int | None
    ) -> None:
        """Apply a grant in place (demand mode, on the serving loop): the process bucket's rate,
        each principal's own rate (`principal_rates`), `principal_default` for every other.
        Bursts and the quantum stay as built (shared/cluster/grants.py §5). Only when there
        were buckets of that kind to begin with; a rate never appears from None."""
        now = _ns(self._clock())
        process = self._process
        if process is not None and process_rate is not None:
            process.set_rate(process_rate, now)
            self._process_rate = process_rate
        if self._per_principal_rate is not None and principal_default is not None:
            self._per_principal_rate = principal_default
            self._principal_rates = dict(principal_rates)
            for principal_id, rate in principal_rates.items():
                if principal_id not in self._principals:  # kept from now on, starting full
                    self._principals[principal_id] = _Principal(
                        TokenBucket(rate, self._per_principal_burst, self._clock)
                    )
            for principal_id, principal in self._principals.items():
                if principal.bucket is not None:
                    principal.bucket.set_rate(principal_rates.get(principal_id, principal_default), now)
        # Waiting times were computed at the old rates: every waiter is looked at again now.
        while self._heap:
            principal = heapq.heappop(self._heap)[2]
            principal.queued = _RING
            self._ring.append(principal)
        if self._dispatcher is not None:
            self._wake_dispatcher(now)

    # -- the dispatcher --------------------------------------------------------------------

    async def _dispatch(self) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            while True:
                now = _ns(self._clock())
                delay = self._serve(now)
                if delay is None:
                    return
                delay = max(delay, _MIN_SLEEP_NS)
                self._sleeping_until = now + delay
                try:
                    await self._sleep(delay / _NS)
                except asyncio.CancelledError:
                    if not self._woken:
                        raise
                    self._woken = False
                    if task.uncancel() > 0:
                        raise  # a real cancellation arrived as well
                finally:
                    self._sleeping_until = None
        except Exception as exc:
            # A bug here would leave every waiter hanging; fail them loudly instead.
            log.exception("bandwidth dispatcher failed")
            self.close(RuntimeError(f"bandwidth dispatcher failed: {exc!r}"))
        finally:
            if self._dispatcher is task:
                self._dispatcher = None

    def _serve(self, now: int) -> int | None:
        """Grant everything that can be granted at `now`; return nanoseconds until the next grant
        may be possible, or None when nobody waits."""
        ring, heap, process = self._ring, self._heap, self._process
        while heap and heap[0][0] <= now:
            principal = heapq.heappop(heap)[2]
            if principal.waiters:
                ring.append(principal)
                principal.queued = _RING
            else:
                principal.queued = _IDLE
        if process is not None:
            process._refill(now)
        while ring:
            principal = ring[0]
            waiters = principal.waiters
            while waiters and waiters[0].future.done():  # cancelled; its task has not run yet
                waiters.popleft()
                self._waiting -= 1
            if not waiters:
                ring.popleft()
                principal.queued = _IDLE
                continue
            waiter = waiters[0]
            size = waiter.size
            bucket = principal.bucket
            if bucket is not None:
                bucket._refill(now)
                own_wait = bucket._ready_in(size)
                if own_wait:
                    ring.popleft()
                    self._sequence += 1
                    heapq.heappush(heap, (now + own_wait, self._sequence, principal))
                    principal.queued = _HEAP
                    continue
            if process is not None:
                process_wait = process._ready_in(size)
                if process_wait:
                    # Strict turn order for the shared bucket: nobody behind the head may
                    # overtake it, so only the head's deficit and heap arrivals matter.
                    if heap:
                        return min(process_wait, heap[0][0] - now)
                    return process_wait
                process._take(size)
            if bucket is not None:
                bucket._take(size)
            ring.popleft()
            waiters.popleft()
            self._waiting -= 1
            waiter.future.set_result(now)
            if waiters:
                ring.append(principal)  # one grant per turn
            else:
                principal.queued = _IDLE
        return heap[0][0] - now if heap else None

    # -- lease lost --------------------------------------------------------------------------

    def close(self, reason_exc: BaseException) -> None:
        """Stop handing out bytes for good: current waiters and every later grant raise
        `reason_exc`. Only the first reason counts."""
        if not isinstance(reason_exc, BaseException):
            raise TypeError(f"reason_exc must be an exception instance, got {reason_exc!r}")
        if self._closed is not None:
            return
        self._closed = reason_exc
        for principal in self._principals.values():
            for waiter in principal.waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(reason_exc)
            principal.waiters.clear()
            principal.queued = _IDLE
        self._ring.clear()
        self._heap.clear()
        self._waiting = 0
        task, self._dispatcher = self._dispatcher, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
