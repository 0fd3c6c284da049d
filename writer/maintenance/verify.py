"""The `verify` task kind (SPEC §7): re-hash every stored blob at a bounded rate and record the
missing and corrupt ones as storage diagnostics (diagnostics.py).

Blobs are walked in digest order, a batch at a time (keyset pagination: one index range scan per
batch however large the store). Files are hashed in worker threads (rehash.py: small ones many
per thread hop, large ones a piece per hop) and every hop is paced by `Pacer`, so the store is
read at no more than `bytes_per_second` (ARKVORY_VERIFY_BYTES_PER_SECOND unless the task's params
say otherwise; 0 is unthrottled) and downloads keep their disk and CPU.

What a run finds:

- good: an earlier diagnostic of the blob is cleared (a re-upload put the right bytes back);
- no file: `missing`, recorded under the digest's exclusive claim if the blob still has its row
  (cleanup deletes the row when it decides to remove a blob), then looked for once more and
  withdrawn if it is there again (an upload put it back) — unless the blob is already known
  `corrupt`: it is missing because an earlier run quarantined it;
- wrong size or bytes, or an I/O error reading it: the file is quarantined (quarantine.py: moved
  out of the store, every process told to drop its cached descriptor) and recorded `corrupt`.

On an object store the same holds, with a streaming GET instead of a file (rehash_objects.py):
a missing object is `missing`; a corrupt one is copied to `PREFIX/quarantine/sha256/` and removed
from its key as a removal marked under the digest's exclusive claim (writer/blobs/locks.py: no upload
publishes the digest while the mark is pending, and no transaction is open while the store
works), then recorded `corrupt` and the mark settled. A store that fails mid-run fails the
task: that is no finding about the blobs (the next run settles the mark it left).

Budgets: a blob is the step. Before one is read, it must fit what is left of the task's budget
(one item, its recorded size in bytes, its cost units: 1 to open it and 1 per MiB started, and
one transition for its progress call); the blobs checked in one thread hop are only as many as
fit; the first blob that does not fit fails the task with `budget_exceeded` without being read
(writer/tasks/budgets.py). So `max_items` N checks exactly N blobs and `max_bytes` never lets
more than that be read, across a crash too: each hop's cost is reserved (on record) before it
is read. Progress is reported per blob (the
worker coalesces the events), a checkpoint `{"after": digest, counts...}` is saved every
CHECKPOINT_EVERY_S, and a resumed task continues after the checkpoint's digest without hashing
the finished blobs again.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import anyio
import anyio.to_thread

from arkvory.shared.errors import InvalidInput
from arkvory.writer.tasks.budgets import cost_units
from arkvory.writer.tasks.context import TaskCancelled

from ..blobs.locks import NONE_PENDING, claim_for_diagnosis, mark_removals, pending_removals, settle_removals
from ..blobs.diagnostics import (
    clear_diagnostic,
    diagnostic_counts,
    prune_diagnostics_without_blob,
    record_diagnostic,
)
from ..blobs.quarantine import move_to_quarantine, notify_moved
from .rehash import READ_BYTES, FileCheck, Found, check_whole
from .rehash_objects import ObjectCheck

log = logging.getLogger("arkvory.verify")

MAX_RATE = 2**40  # 1 TiB/s, as the download limits
UNTHROTTLED_PIECE = 16 * 1024 * 1024  # hashed per thread hop; bounds how late a cancel is seen
SMALL_BLOB = READ_BYTES  # up to this size a blob is checked whole, with others in one hop
SMALL_GROUP = 128  # small blobs per hop at most (between two looks at cancellation)
BATCH = 500
CHECKPOINT_EVERY_S = 5.0
PROGRESS_EVERY_S = 0.5  # inside a large blob: its bytes so far, this often
QUERY_TIMEOUT_S = 10
POOL_WAIT_S = 10
CANCEL_CHECK_S = 0.5
_DIGEST = re.compile(r"^[0-9a-f]{64}$")

_STORED_AND_NOT_BEING_REMOVED = (
    f"SELECT EXISTS (SELECT 1 FROM arkvory_blobs WHERE sha256 = $1) AND {NONE_PENDING.format(d='$1')}"
)
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
        # Blobs are local files (the directory) or objects read by range GETs (an object store).
        self.objects = getattr(self.storage, "kind", "file") != "file"
        self.pool = ctx.pool
        self.pacer = Pacer(rate)
        self.buffer = memoryview(bytearray(READ_BYTES))
        metrics = getattr(ctx, "metrics", None)
        self.hashed_bytes = getattr(metrics, "verify_hashed_bytes", None)
        self.gauge = getattr(metrics, "storage_diagnostics", None)
        self.after, self.tally = Tally.resumed(getattr(ctx, "resumed_from", None))
        self._progress_at = self._checkpoint_at = time.monotonic()

    async def run(self) -> dict[str, Any]:
        if self.after is not None:
            log.info("verify %s resumes after %s (%d blobs checked before)", self.ctx.task_id, self.after, self.tally.checked)
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
            # A quarantine an earlier run marked and did not see through (it crashed, or the
            # store failed): that object is looked at again below; uploads may go on.
            await settle_removals(conn, await pending_removals(conn, ("quarantine",)))
        while True:
            async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
                rows = await conn.fetch(_BATCH_SQL, self.after, BATCH, timeout=QUERY_TIMEOUT_S)
            start = 0
            while start < len(rows):
                group = self._next_group(rows, start)
                start += len(group)
                # Read outside any transaction: the group's cost is on record before it is read,
                # so a crash while reading gives no budget back (writer/worker/context.py).
                async with self.ctx.reserving(
                    items=len(group), bytes=sum(row["size"] for row in group),
                    cost_units=sum(blob_cost(row["size"]) for row in group), transitions=len(group),
                ):
                    if len(group) == 1 and group[0]["size"] > SMALL_BLOB:
                        found = [await self._check_large(group[0])]
                    else:
                        found = await self._check_small(group)
                    for row, (outcome, nbytes) in zip(group, found):
                        await self._record(row["sha256"], row["problem"], outcome)
                        self.after = row["sha256"]
                        await self._report(nbytes, blob_cost(row["size"]))
            if len(rows) < BATCH:
                break
        if self.ctx.budget_left().get("transitions", 1) >= 1:  # a summary is no reason to fail
            await self.ctx.progress(message=self._summary(), data=self._state())
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
            await prune_diagnostics_without_blob(conn)
            counts = await diagnostic_counts(conn)
        if self.gauge is not None:
            for problem, n in counts.items():
                self.gauge.labels(problem=problem).set(n)
        result = asdict(self.tally)
        log.info("verify %s finished: %s", self.ctx.task_id, result)
        return result

    def _next_group(self, rows: list, start: int) -> list:
        """The blobs from `rows[start]` to check in one thread hop: consecutive small ones (up
        to a piece of bytes or SMALL_GROUP files), or one large one; never more than what is
        left of the budget (a blob costs one item, its size in bytes, `blob_cost` cost units and
        one transition). When not even `rows[start]` fits, the task fails here, before reading it."""
        left = self.ctx.budget_left()
        items_left = min(left.get("items", BATCH), left.get("transitions", BATCH))
        bytes_left = left.get("bytes", -1)  # -1: unlimited
        cost_left = left.get("cost_units", -1)
        group: list = []
        group_bytes = group_cost = 0
        for row in rows[start : start + min(SMALL_GROUP, items_left)]:
            size, cost = row["size"], blob_cost(row["size"])
            if bytes_left >= 0 and group_bytes + size > bytes_left:
                break
            if cost_left >= 0 and group_cost + cost > cost_left:
                break
            if size > SMALL_BLOB:
                if not group:
                    group.append(row)
                break
            if group and group_bytes + size > self.pacer.piece_bytes:
                break
            group.append(row)
            group_bytes += size
            group_cost += cost
        if not group:
            size = rows[start]["size"]
            self.ctx.require_budget(items=1, bytes=size, cost_units=blob_cost(size), transitions=1)  # raises
            raise AssertionError("budget_left and require_budget disagree")
        return group

    # -- hashing ---------------------------------------------------------------------------------

    def _file_check(self, row) -> FileCheck:
        return FileCheck(self.storage.blob_file(row["sha256"]), row["sha256"], row["size"])

    def _object_check(self, row) -> ObjectCheck:
        chunk = min(READ_BYTES, self.pacer.piece_bytes)
        return ObjectCheck(self.storage, row["sha256"], row["size"], chunk_size=chunk)

    async def _check_small(self, group: list) -> list[tuple[Found, int]]:
        """What each blob's check found, and the bytes read for it."""
        await self._pace(sum(row["size"] for row in group))
        if self.objects:
            results = []
            for row in group:
                check = self._object_check(row)
                found = await check.whole()
                self._count_hashed(check.done)
                results.append((found, check.done))
            return results
        checks = [self._file_check(row) for row in group]
        found = await anyio.to_thread.run_sync(check_whole, checks, self.buffer)
        self._count_hashed(sum(check.done for check in checks))
        return [(outcome, check.done) for outcome, check in zip(found, checks)]

    async def _check_large(self, row) -> tuple[Found, int]:
        """What the blob's check found, and the bytes read for it not yet reported."""
        check: FileCheck | ObjectCheck = self._object_check(row) if self.objects else self._file_check(row)
        piece = min(self.pacer.piece_bytes, check.size)
        unreported = 0
        await self._pace(piece)
        try:
            found = await self._open(check)
            while found is None:
                before = check.done
                found = await self._hash(check, piece)
                self._count_hashed(check.done - before)
                unreported += check.done - before
                if found is not None:
                    break
                if time.monotonic() - self._progress_at >= PROGRESS_EVERY_S and self._spare_transitions():
                    # A large blob shows its bytes as they go (all within the budget: the
                    # whole blob fit before it was started).
                    await self.ctx.progress(bytes=unreported, data=self._state())
                    self._progress_at = time.monotonic()
                    unreported = 0
                piece = min(self.pacer.piece_bytes, check.size - check.done)
                await self._pace(piece)
            return found, unreported
        finally:
            if isinstance(check, ObjectCheck):
                await check.close()
            else:
                check.close()  # no thread uses it: a worker-thread call is not abandoned on cancel

    async def _open(self, check: FileCheck | ObjectCheck) -> Found | None:
        if isinstance(check, ObjectCheck):
            return await check.open()
        return await anyio.to_thread.run_sync(check.open)

    async def _hash(self, check: FileCheck | ObjectCheck, piece: int) -> Found | None:
        if isinstance(check, ObjectCheck):
            return await check.hash(piece)
        return await anyio.to_thread.run_sync(check.hash, piece, self.buffer)

    def _spare_transitions(self) -> bool:
        """True when one more progress call leaves a transition for the blob's own report."""
        return self.ctx.budget_left().get("transitions", 2) >= 2

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
        path = f"{self.storage.location}/{sha256}" if self.objects else self.storage.blob_file(sha256)
        what = f"no object for {sha256} in {self.storage.location}" if self.objects else f"no file at {path}"
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            # Under the claim no upload publishes the digest (and clears its diagnostic) between
            # our look at the row and our record; cleanup deletes the row when it decides to
            # remove the blob, so a blob being removed is no finding.
            await claim_for_diagnosis(conn, sha256)
            if not await conn.fetchval("SELECT true FROM arkvory_blobs WHERE sha256 = $1", sha256, timeout=QUERY_TIMEOUT_S):
                return
            await record_diagnostic(conn, sha256, "missing", what, self.ctx.task_id)
        # Looked for once more, outside any transaction (the storage is never asked inside
        # one): an upload that put the bytes back and committed before our record could not
        # clear it, so we withdraw it; one that commits after our record clears it itself.
        if await self._blob_exists(sha256, path):
            async with self.pool.acquire(timeout=POOL_WAIT_S) as conn:
                await clear_diagnostic(conn, sha256)
            return
        self.tally.missing += 1
        log.error("blob %s is missing from storage (%s)", sha256, path)

    async def _blob_exists(self, sha256: str, path: str) -> bool:
        if self.objects:
            return await self.storage.stat(sha256) is not None
        return os.path.exists(path)

    async def _corrupt(self, sha256: str, found: Found) -> None:
        if self.objects:
            await self._corrupt_object(sha256, found)
            return
        moved = None
        if found.stat is not None:
            moved = await anyio.to_thread.run_sync(move_to_quarantine, self.storage, sha256, found.stat)
            if moved is None:
                return  # replaced by a good file (or removed) meanwhile: the next run sees it
        detail = found.detail if moved is None else f"{found.detail}; quarantined at {moved}"
        path = self.storage.blob_file(sha256)
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            # An upload that placed good bytes since the move has cleared the diagnostic
            # already (or will, after us: it waits for this claim before placing).
            await claim_for_diagnosis(conn, sha256)
            if moved is not None and os.path.exists(path):
                await notify_moved(conn, sha256)
                return
            await record_diagnostic(conn, sha256, "corrupt", detail, self.ctx.task_id)
            await notify_moved(conn, sha256)
        self.tally.corrupt += 1
        log.error("blob %s is corrupt: %s", sha256, detail)

    async def _corrupt_object(self, sha256: str, found: Found) -> None:
        """Move the object to quarantine as a removal (writer/blobs/locks.py): marked under the digest's
        exclusive claim, moved with no transaction open, then recorded and settled. While the
        mark is pending no upload publishes the digest; one that staged good bytes before it
        stages them again after, and clears the diagnostic then."""
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            await claim_for_diagnosis(conn, sha256)
            if not await conn.fetchval(_STORED_AND_NOT_BEING_REMOVED, sha256, timeout=QUERY_TIMEOUT_S):
                return  # cleanup is removing it: no finding
            removals = await mark_removals(conn, [sha256], "quarantine", self.ctx.task_id)
        # A store that fails here fails the task; the mark stays until a later run settles it.
        moved = await self.storage.quarantine(sha256, found.version)
        replaced = moved is None and await self.storage.stat(sha256) is not None
        async with self.pool.acquire(timeout=POOL_WAIT_S) as conn, conn.transaction():
            await claim_for_diagnosis(conn, sha256)
            await settle_removals(conn, removals)
            if replaced:
                return  # an upload staged other bytes meanwhile: the next run looks at them
            detail = found.detail if moved is None else f"{found.detail}; quarantined at {self.storage.location}/{moved}"
            await record_diagnostic(conn, sha256, "corrupt", detail, self.ctx.task_id)
            await notify_moved(conn, sha256)
        self.tally.corrupt += 1
        log.error("blob %s is corrupt: %s", sha256, detail)

    # -- progress and checkpoints ----------------------------------------------------------------

    async def _report(self, nbytes: int, cost: int) -> None:
        """One blob is done (`nbytes` of it not reported yet, `cost` its cost units): count it,
        and checkpoint with a summary line (for the offline scrub's output and the task's
        events) every CHECKPOINT_EVERY_S."""
        now = time.monotonic()
        due = now - self._checkpoint_at >= CHECKPOINT_EVERY_S and self._spare_transitions()
        await self.ctx.progress(
            items=1, bytes=nbytes, cost_units=cost, message=self._summary() if due else None, data=self._state()
        )
        self._progress_at = now
        if due:
            await self.ctx.checkpoint(self._state())
            self._checkpoint_at = time.monotonic()

    def _state(self) -> dict[str, Any]:
        t = self.tally  # built by hand: asdict() per blob costs as much as hashing a small one
        return {
            "after": self.after, "checked": t.checked, "bytes": t.bytes,
            "missing": t.missing, "corrupt": t.corrupt, "cleared": t.cleared,
        }

    def _summary(self) -> str:
        t = self.tally
        return f"{t.checked} blobs checked ({t.bytes} bytes), {t.missing} missing, {t.corrupt} corrupt"


def blob_cost(size: int) -> int:
    """A blob's cost units (writer/tasks/budgets.py): opening its file, and each MiB read."""
    return cost_units(files=1, read_bytes=size)


async def run(ctx: Any) -> dict[str, Any]:
    rate = ctx.params.get("bytes_per_second", ctx.settings.verify_bytes_per_second)
    return await Verifier(ctx, rate).run()
