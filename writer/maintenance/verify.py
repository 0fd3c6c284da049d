"""The `verify` task kind (SPEC §7): re-hash every stored blob at a bounded rate and record the
missing and corrupt ones as storage diagnostics (diagnostics.py).

Blobs are walked in digest order, a batch at a time (keyset pagination: one index range scan per
batch however large the store). Files are hashed in worker threads (rehash.py: small ones many
per thread hop, large ones a piece per hop) and every hop is paced by `Pacer`, so the store is
read at no more than `bytes_per_second` (ARKVORY_VERIFY_BYTES_PER_SECOND unless the task's params
say otherwise; 0 is unthrottled) and downloads keep their disk and CPU.

What a run finds:

- good: an earlier diagnostic of the blob is cleared (a re-upload put the right bytes back);
- no file: `missing`, once confirmed under a share lock of the blob's row (cleanup may be
  removing row and file right now) — unless the blob is already known `corrupt`: it is missing
  because an earlier run quarantined it;
- wrong size or bytes, or an I/O error reading it: the file is quarantined (quarantine.py: moved
  out of the store, every process told to drop its cached descriptor) and recorded `corrupt`.

Progress is reported in batches (at most every PROGRESS_EVERY_S or PROGRESS_EVERY_ITEMS blobs), a
checkpoint `{"after": digest, counts...}` is saved every CHECKPOINT_EVERY_S, and a resumed task
continues after the checkpoint's digest without hashing the finished blobs again.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import anyio.to_thread

from shared.errors import InvalidInput
from writer.tasks.context import TaskCancelled

from .diagnostics import (
    clear_diagnostic,
    diagnostic_counts,
    prune_diagnostics_without_blob,
    record_diagnostic,
)
from .quarantine import move_to_quarantine, notify_moved
from .rehash import READ_BYTES, FileCheck, Found, check_whole

log = logging.getLogger("arkvory.verify")

MAX_RATE = 2**40  # 1 TiB/s, as the download limits
UNTHROTTLED_PIECE = 16 * 1024 * 1024  # hashed per thread hop; bounds how late a cancel is seen
SMALL_BLOB = READ_BYTES  # up to this size a blob is checked whole, with others in one hop
SMALL_GROUP = 128  # small blobs per hop at most (between two looks at cancellation)
BATCH = 500
CHECKPOINT_EVERY_S = 5.0
PROGRESS_EVERY_S = 0.5
PROGRESS_EVERY_ITEMS = 256
QUERY_TIMEOUT_S = 10
POOL_WAIT_S = 10
CANCEL_CHECK_S = 0.5
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

_BATCH_SQL = """
SELECT b.sha256, b.size, d.problem
FROM arkvory_blobs b LEFT JOIN arkvory_storage_diagnostics d ON d.sha256 = b.sha256
WHERE ($1::text IS NULL OR b.sha256 > $1)
ORDER BY b.sha256
LIMIT $2
"""


def validate_params(params: Any) -> dict:
    """`{"bytes_per_second": n}` (optional; 0 = unthrottled) and nothing else."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidInput("params must be an object")
    unknown = sorted(set(params) - {"bytes_per_second"})
    if unknown:
        raise InvalidInput(f"verify: unknown parameter {unknown[0]!r}; known: bytes_per_second")
    checked = {}
    if "bytes_per_second" in params:
        rate = params["bytes_per_second"]
        if isinstance(rate, bool) or not isinstance(rate, int) or not 0 <= rate <= MAX_RATE:
            raise InvalidInput(f"verify: bytes_per_second must be an integer from 0 (unthrottled) to {MAX_RATE}")
        checked["bytes_per_second"] = rate
    return checked


class Pacer:
    """Hands out read permissions so that the bytes started by any moment t never exceed
    rate × (t - start) + one piece: each piece waits until the time its predecessors paid for
    has passed. No credit is banked while the hashing itself is slower than the rate."""

    def __init__(self, bytes_per_second: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = bytes_per_second
        self._clock = clock
        self._free_at = clock()

    @property
    def unlimited(self) -> bool:
        return self.rate == 0

    @property
    def piece_bytes(self) -> int:
        """A quarter second of the rate (at least 64 KiB), so pacing stays smooth."""
        if self.unlimited:
            return UNTHROTTLED_PIECE
        return max(64 * 1024, min(UNTHROTTLED_PIECE, self.rate // 4))

    def delay(self, nbytes: int) -> float:
        """Seconds to wait before reading `nbytes` (booked now)."""
        if self.unlimited:
            return 0.0
        now = self._clock()
        start = max(self._free_at, now)
        self._free_at = start + nbytes / self.rate
        return start - now


@dataclass
class Tally:
    checked: int = 0
    bytes: int = 0
    missing: int = 0
    corrupt: int = 0
    cleared: int = 0

    @classmethod
    def resumed(cls, state: dict[str, Any] | None) -> tuple[str | None, Tally]:
        """The digest to continue after and the counts so far, from a checkpoint (or a fresh start)."""
        if not isinstance(state, dict) or not isinstance(state.get("after"), str) or not _DIGEST.match(state["after"]):
            return None, cls()
        counts = {name: state.get(name) for name in asdict(cls())}
        return state["after"], cls(**{k: v for k, v in counts.items() if isinstance(v, int) and v >= 0})


class Verifier:
    """One run over the store (one instance per run; used from one task)."""

    def __init__(self, ctx: Any, rate: int) -> None:
        self.ctx = ctx
        self.storage = ctx.storage
        self.pool = ctx.pool
        self.pacer = Pacer(rate)
        self.buffer = memoryview(bytearray(READ_BYTES))
        metrics = getattr(ctx, "metrics", None)
        self.hashed_bytes = getattr(metrics, "verify_hashed_bytes", None)
        self.gauge = getattr(metrics, "storage_diagnostics", None)
        self.after, self.tally = Tally.resumed(getattr(ctx, "resumed_from", None))
        self._pending_items = self._pending_bytes = 0
        self._progress_at = self._checkpoint_at = time.monotonic()

    async def run(self) -> dict[str, Any]:
        if self.after is not None:
            log.info("verify %s resumes after %s (%d blobs checked before)", self.ctx.task_id, self.after, self.tally.checked)
        while True:
            async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
                rows = await conn.fetch(_BATCH_SQL, self.after, BATCH, timeout=QUERY_TIMEOUT_S)
            for group in self._groups(rows):
                if len(group) == 1 and group[0]["size"] > SMALL_BLOB:
                    found = [await self._check_large(group[0])]
                else:
                    found = await self._check_small(group)
                for row, outcome in zip(group, found):
                    await self._record(row["sha256"], row["problem"], outcome)
                    self.after = row["sha256"]
                    await self._report()
            if len(rows) < BATCH:
                break
        await self._flush_progress(message=self._summary())
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
            await prune_diagnostics_without_blob(conn)
            counts = await diagnostic_counts(conn)
        if self.gauge is not None:
            for problem, n in counts.items():
                self.gauge.labels(problem=problem).set(n)
        result = asdict(self.tally)
        log.info("verify %s finished: %s", self.ctx.task_id, result)
        return result

    def _groups(self, rows: list) -> Iterator[list]:
        """Consecutive small blobs together (one thread hop and one pacing step for up to a
        piece of bytes or SMALL_GROUP files), each large blob alone."""
        group: list = []
        group_bytes = 0
        for row in rows:
            size = row["size"]
            if size > SMALL_BLOB:
                if group:
                    yield group
                    group, group_bytes = [], 0
                yield [row]
                continue
            if group and (group_bytes + size > self.pacer.piece_bytes or len(group) >= SMALL_GROUP):
                yield group
                group, group_bytes = [], 0
            group.append(row)
            group_bytes += size
        if group:
            yield group

    # -- hashing ---------------------------------------------------------------------------------

    def _file_check(self, row) -> FileCheck:
        return FileCheck(self.storage.blob_file(row["sha256"]), row["sha256"], row["size"])

    async def _check_small(self, group: list) -> list[Found]:
        checks = [self._file_check(row) for row in group]
        await self._pace(sum(row["size"] for row in group))
        found = await anyio.to_thread.run_sync(check_whole, checks, self.buffer)
        self._count_hashed(sum(check.done for check in checks))
        return found

    async def _check_large(self, row) -> Found:
        check = self._file_check(row)
        piece = min(self.pacer.piece_bytes, check.size)
        await self._pace(piece)
        try:
            found = await anyio.to_thread.run_sync(check.open)
            while found is None:
                before = check.done
                found = await anyio.to_thread.run_sync(check.hash, piece, self.buffer)
                self._count_hashed(check.done - before)
                if found is not None:
                    break
                if time.monotonic() - self._progress_at >= PROGRESS_EVERY_S:
                    await self._flush_progress()  # a large blob shows (and budgets) its bytes as they go
                piece = min(self.pacer.piece_bytes, check.size - check.done)
                await self._pace(piece)
            return found
        finally:
            check.close()  # no thread uses it: a worker-thread call is not abandoned on cancel

    async def _pace(self, nbytes: int) -> None:
        until = time.monotonic() + self.pacer.delay(nbytes)
        while True:
            # A very low rate waits long: a cancel is still seen within CANCEL_CHECK_S.
            if self.ctx.cancel_requested():
                raise TaskCancelled("verify cancelled")
            left = until - time.monotonic()
            if left <= 0:
                return
            await anyio.sleep(min(left, CANCEL_CHECK_S))

    def _count_hashed(self, n: int) -> None:
        self.tally.bytes += n
        self._pending_bytes += n
        if self.hashed_bytes is not None:
            self.hashed_bytes.inc(n)

    # -- what was found --------------------------------------------------------------------------

    async def _record(self, sha256: str, known: str | None, found: Found) -> None:
        """Record what one blob's check found (`known`: its diagnostic so far, if any)."""
        self.tally.checked += 1
        if found.problem == "missing":
            await self._missing(sha256, known)
        elif found.problem == "corrupt":
            await self._corrupt(sha256, found)
        elif known is not None:
            async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
                if await clear_diagnostic(conn, sha256):
                    self.tally.cleared += 1
                    log.info("blob %s is good again: its %s diagnostic is cleared", sha256, known)

    async def _missing(self, sha256: str, known: str | None) -> None:
        if known == "corrupt":
            # Quarantined by an earlier run: it stays corrupt until good bytes come back.
            self.tally.corrupt += 1
            return
        path = self.storage.blob_file(sha256)
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            # Cleanup removes file and row together under the row's lock: wait for it, and
            # look again while no one can remove the row.
            still_stored = await conn.fetchval(
                "SELECT true FROM arkvory_blobs WHERE sha256 = $1 FOR SHARE", sha256, timeout=QUERY_TIMEOUT_S
            )
            if not still_stored or os.path.exists(path):
                return  # removed by cleanup, or placed again by an upload meanwhile
            await record_diagnostic(conn, sha256, "missing", f"no file at {path}", self.ctx.task_id)
        self.tally.missing += 1
        log.error("blob %s is missing from storage (%s)", sha256, path)

    async def _corrupt(self, sha256: str, found: Found) -> None:
        moved = None
        if found.stat is not None:
            moved = await anyio.to_thread.run_sync(move_to_quarantine, self.storage, sha256, found.stat)
            if moved is None:
                return  # replaced by a good file (or removed) meanwhile: the next run sees it
        detail = found.detail if moved is None else f"{found.detail}; quarantined at {moved}"
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            await record_diagnostic(conn, sha256, "corrupt", detail, self.ctx.task_id)
            await notify_moved(conn, sha256)
        self.tally.corrupt += 1
        log.error("blob %s is corrupt: %s", sha256, detail)

    # -- progress and checkpoints ----------------------------------------------------------------

    async def _report(self) -> None:
        self._pending_items += 1
        now = time.monotonic()
        if self._pending_items >= PROGRESS_EVERY_ITEMS or now - self._progress_at >= PROGRESS_EVERY_S:
            await self._flush_progress()
        if now - self._checkpoint_at >= CHECKPOINT_EVERY_S:
            # A line for the offline scrub's output and the task's events, as often as checkpoints.
            await self._flush_progress(message=self._summary())
            await self.ctx.checkpoint({"after": self.after, **asdict(self.tally)})
            self._checkpoint_at = time.monotonic()

    def _summary(self) -> str:
        t = self.tally
        return f"{t.checked} blobs checked ({t.bytes} bytes), {t.missing} missing, {t.corrupt} corrupt"

    async def _flush_progress(self, message: str | None = None) -> None:
        items, nbytes = self._pending_items, self._pending_bytes
        self._pending_items = self._pending_bytes = 0
        self._progress_at = time.monotonic()
        if items or nbytes or message:
            await self.ctx.progress(
                items=items, bytes=nbytes, message=message, data={"after": self.after, **asdict(self.tally)}
            )


async def run(ctx: Any) -> dict[str, Any]:
    rate = ctx.params.get("bytes_per_second", ctx.settings.verify_bytes_per_second)
    return await Verifier(ctx, rate).run()
