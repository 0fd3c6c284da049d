"""SPEC §4's lease rules in the default tier, on a fake clock against the real PostgreSQL: the
10 s reservation, a renewal every 2 s, trust for at most 8 s after a renewal was *sent*, a late
answer is a loss that never revives, the database never renews an expired reservation, a start
waits at most 15 s, fencing by holder id and generation. (The token buckets' rules are pinned
in tests/test_throttle.py.)

Each rule was checked by a mutation (issue 22 §15): apply one by hand, run
`pytest tests/test_core_rules.py tests/test_lease_unit.py tests/test_throttle.py -n 0 -p no:randomly`,
see the named test fail, restore. In shared/cluster/lease.py:

- trust from the answer, late answers accepted (`_renew_once`: drop the late check, set
  `_trusted_until = self.clock() + TRUST_S`) ... test_trust_counts_from_when_the_renewal_was_sent,
  test_an_answer_after_trust_ran_out_is_a_loss_that_never_revives
- only trust from the answer, in `_renew_once` or in `_acquire` ... test_trust_counts_from_...
- only the late check dropped ... test_an_answer_after_trust_ran_out_is_a_loss_that_never_revives
- `>` instead of `>=` in the late check ... test_an_answer_at_the_last_instant_of_trust_is_late
- `<=` instead of `<` in `trusted` ... test_trust_counts_from_when_the_renewal_was_sent
- `_renew_once` without its `if self.lost.is_set()` check; `trusted` or `trust_remaining`
  ignoring a loss ... test_an_abandoned_lease_stays_lost_when_a_renewal_then_succeeds (and the
  refusal tests below)
- TRUST_S = 10 ... test_trust_counts_from_when_the_renewal_was_sent
- RESERVATION_S = 12 ... test_the_database_reserves_the_slot_for_10_s
- RENEW_EVERY_S = 3; the next send counted from the answer; the first renewal counted from
  the acquisition's answer ... test_renewals_are_sent_every_2_s_counted_from_each_send
- the loop's `if not self.trusted` check dropped ... test_failing_renewals_lose_the_lease_once_trust_ran_out
- `_RENEW` without `expires_at > now()` ... test_the_database_never_renews_an_expired_reservation
- `_RENEW` without `holder_id = $2`, or without `generation = $3` ... test_renewal_is_fenced_by_...
- `_ACQUIRE` without `generation + 1` ... test_each_acquisition_takes_a_fresh_holder_and_the_next_generation
- `_ACQUIRE` without `WHERE lease.expires_at <= now()`; ACQUIRE_LIMIT_S = 20 or 10
  ... test_a_start_waits_for_a_live_reservation_but_at_most_15_s
- the "still renewing" check dropped ... test_an_old_holder_that_still_renews_makes_the_start_busy

In shared/download/throttle.py (the tests are in tests/test_throttle.py):

- a cancelled grant gives back all its tokens (`TokenBucket._give_back`: `returned = size * _NS`)
  ... test_a_cancelled_grant_gives_back_only_what_the_bucket_could_still_hold
- no give-back at all ... the same, and test_tokens_granted_to_a_waiter_cancelled_before_it_resumed_come_back
- MAX_BURST_BYTES = 2 MiB ... test_burst_is_a_tenth_of_the_rate_capped_at_one_mebibyte,
  test_a_full_bucket_hands_out_exactly_one_burst_at_once
- burst = rate // 5 ... the same, and most scheduler tests
- a process or a principal bucket of twice the burst ... test_a_full_bucket_hands_out_exactly_one_burst_at_once,
  test_ceiling_holds_for_every_interval
- the refill not capped at the burst ... test_ceiling_holds_for_every_interval and others
- a grant larger than the burst (`quantum_for` without its `min(quantum, burst…)`)
  ... test_quanta_are_10_ms_of_the_smaller_rate_within_bounds_and_bursts
- round-robin replaced by FIFO: the served principal keeps the head of the ring
  (`ring.appendleft`), or one ring entry per transfer instead of per principal, or a principal
  served until its waiters are done ... test_principals_take_turns_one_grant_each,
  test_round_robin_serves_principals_not_transfers
- `grant_now` overtaking the ring (without `self._ring`, in either of its two paths)
  ... test_a_later_smaller_request_does_not_overtake_a_waiter
- not killed, equivalent: the give-back's own cap (`_credit += returned`): what comes back never
  fills the bucket past what it would hold without the take, so it never reaches the cap.

What is not replaced: the SQL, the trust arithmetic, the renewal loop and the acquisition loop
are the lease's own, against the real database. Only waiting is: `_nap` moves the fake clock
instead of sleeping, and each answer of the database arrives `answer_delay` fake seconds after
its statement was sent (a slow network or a stalled thread, without waiting for it). The test
runs those coroutines on its own loop instead of the lease's thread, which only hosts them
(tests/test_lease_unit.py proves the thread with real time).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from arkvory.shared.cluster.lease import _RENEW, SlotLease
from arkvory.shared.errors import SlotBusy

from .fakeclock import FakeTime
from .test_lease_unit import POLICY, Counted, prepared

pytestmark = pytest.mark.timeout(60)

EXACT = 1e-9  # the fake clock counts whole nanoseconds
# SPEC §4's numbers, written out: a test that read them from lease.py would follow a mutation.
RESERVATION, RENEW_EVERY, TRUST, ACQUIRE_LIMIT = 10, 2, 8, 15


class FakeTimeLease(SlotLease):
    """The real lease, on a fake clock (see the module docstring for what is replaced)."""

    def __init__(self, database_url: str, fake: FakeTime) -> None:
        self.counted = Counted()
        super().__init__(database_url, 1, "reader", POLICY, clock=fake.clock, report=self.counted)
        self.fake = fake
        self.answer_delay = 0.0
        self.sent: list[tuple[float, str]] = []  # (fake instant, statement)
        self.naps: list[float] = []
        self.on_nap = None  # async (lease, seconds) -> None: a scenario acts while the lease waits

    @property
    def renewals_sent(self) -> list[float]:
        return [at for at, statement in self.sent if statement is _RENEW]

    async def take(self) -> None:
        await self._acquire()

    async def renew(self) -> None:
        await self._renew_once()

    async def keep_renewing(self) -> None:
        await self._renew_until_stopped()

    async def close_connection(self) -> None:
        await self._close_connection()

    async def _connection(self):
        return _AnswersLate(await super()._connection(), self)

    async def _nap(self, seconds: float) -> None:
        self.naps.append(seconds)
        if self.on_nap is not None:
            await self.on_nap(self, seconds)
        if self._renewing and not self.lost.is_set():  # a stop or a loss wakes a real nap at once
            self.fake.advance(seconds)


class _AnswersLate:
    """The lease's real connection; each answer reaches the lease `answer_delay` seconds (on
    the fake clock) after its statement was sent."""

    def __init__(self, conn: asyncpg.Connection, lease: FakeTimeLease) -> None:
        self._conn = conn
        self._lease = lease

    def is_closed(self) -> bool:
        return self._conn.is_closed()

    async def fetchval(self, statement: str, *args, **kwargs):
        return await self._answer(self._conn.fetchval(statement, *args, **kwargs), statement)

    async def fetchrow(self, statement: str, *args, **kwargs):
        return await self._answer(self._conn.fetchrow(statement, *args, **kwargs), statement)

    async def execute(self, statement: str, *args, **kwargs):
        return await self._answer(self._conn.execute(statement, *args, **kwargs), statement)

    async def _answer(self, call, statement: str):
        self._lease.sent.append((self._lease.fake.clock(), statement))
        result = await call
        self._lease.fake.advance(self._lease.answer_delay)
        return result


async def lease_row(conn: asyncpg.Connection):
    return await conn.fetchrow(
        "SELECT holder_id, generation, acquired_at, renewed_at, expires_at,"
        " expires_at > now() AS live FROM arkvory_gateway_leases WHERE slot = 1",
        timeout=5,
    )


def run(database_url: str, scenario) -> None:
    """`scenario(conn, fake)` with a prepared database and a connection to look through it."""

    async def main() -> None:
        conn = await prepared(database_url)
        try:
            await asyncio.wait_for(scenario(conn, FakeTime()), 45)
        finally:
            await conn.close()

    asyncio.run(main())


# -- reservation and trust ----------------------------------------------------------------------


def test_the_database_reserves_the_slot_for_10_s(database_url) -> None:
    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            row = await lease_row(conn)
            assert row["generation"] == lease.generation == 1 and row["holder_id"] == lease.holder_id
            assert (row["expires_at"] - row["acquired_at"]).total_seconds() == RESERVATION
            fake.advance(RENEW_EVERY)
            await lease.renew()
            renewed = await lease_row(conn)
            assert renewed["renewed_at"] > row["renewed_at"]
            assert (renewed["expires_at"] - renewed["renewed_at"]).total_seconds() == RESERVATION
            assert lease.counted.results == ["ok"]
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_trust_counts_from_when_the_renewal_was_sent(database_url) -> None:
    """An answer that takes 1.5 s leaves 6.5 s of trust, never 8 s counted from the answer
    (mutation (a) of issue 22 §15)."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        lease.answer_delay = 1.5
        try:
            await lease.take()
            acquisition_sent = lease.sent[-1][0]
            assert lease.trusted
            assert lease.trust_remaining() == pytest.approx(TRUST - 1.5, abs=EXACT)

            fake.advance(RENEW_EVERY - 1.5)
            await lease.renew()
            renewal_sent = lease.renewals_sent[-1]
            assert renewal_sent == pytest.approx(acquisition_sent + RENEW_EVERY, abs=EXACT)
            assert lease.counted.results == ["ok"]
            assert lease.trust_remaining() == pytest.approx(TRUST - 1.5, abs=EXACT)

            # Trusted until 8 s after the send, not an instant longer.
            fake.advance(TRUST - 1.5 - 0.001)
            assert lease.trusted and lease.trust_remaining() == pytest.approx(0.001, abs=EXACT)
            fake.advance(0.001)
            assert fake.clock() == pytest.approx(renewal_sent + 8, abs=EXACT)
            assert not lease.trusted and lease.trust_remaining() == 0.0
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_an_answer_after_trust_ran_out_is_a_loss_that_never_revives(database_url) -> None:
    """The database accepted the renewal, but its answer came 8.5 s after the last good send:
    the lease is lost, even though trust counted from this renewal's send would still run
    1.5 s (mutation (a) of issue 22 §15, and the late check alone)."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            fake.advance(RENEW_EVERY)
            lease.answer_delay = TRUST - RENEW_EVERY + 0.5
            await lease.renew()
            assert (await lease_row(conn))["live"]  # the database did renew it
            assert lease.counted.results == ["late"] and lease.counted.losses == 1
            assert lease.lost.is_set() and not lease.trusted and lease.trust_remaining() == 0.0
            assert "after local trust ran out" in lease.lost_reason

            # A later renewal that answers at once changes nothing.
            lease.answer_delay = 0.0
            await lease.renew()
            assert lease.lost.is_set() and not lease.trusted and lease.trust_remaining() == 0.0
            assert lease.counted.losses == 1
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_an_answer_at_the_last_instant_of_trust_is_late(database_url) -> None:
    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            fake.advance(RENEW_EVERY)
            lease.answer_delay = TRUST - RENEW_EVERY  # arrives exactly 8 s after the acquisition was sent
            await lease.renew()
            assert lease.counted.results == ["late"] and lease.lost.is_set() and not lease.trusted
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_an_abandoned_lease_stays_lost_when_a_renewal_then_succeeds(database_url) -> None:
    """Another part of the process gave up (`abandon`) while a renewal was on its way: the
    database renews, but trust and the counters stay those of a lost lease."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            fake.advance(RENEW_EVERY)
            lease.abandon("the payload gate failed")
            await lease.renew()
            assert (await lease_row(conn))["live"]
            assert lease.counted.results == [] and lease.counted.losses == 1
            assert not lease.trusted and lease.trust_remaining() == 0.0
            assert lease.lost_reason == "the payload gate failed"
        finally:
            await lease.close_connection()

    run(database_url, scenario)


# -- the renewal loop ---------------------------------------------------------------------------


def test_renewals_are_sent_every_2_s_counted_from_each_send(database_url) -> None:
    """Answers take 1.5 s: renewals still leave 2 s after the previous send (the first 2 s
    after the acquisition was sent), not 2 s after an answer."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        lease.answer_delay = 1.5

        async def stop_after_five(lease, seconds):
            assert lease.trusted  # it never waits past its trust
            if len(lease.renewals_sent) == 5:
                lease.stop_renewing()

        lease.on_nap = stop_after_five
        try:
            await lease.take()
            acquisition_sent = lease.sent[-1][0]
            await lease.keep_renewing()
            assert lease.renewals_sent == [
                pytest.approx(acquisition_sent + RENEW_EVERY * n, abs=EXACT) for n in range(1, 6)
            ]
            assert lease.counted.results == ["ok"] * 5 and not lease.lost.is_set()
            assert lease.trust_remaining() == pytest.approx(TRUST - 1.5, abs=EXACT)
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_failing_renewals_lose_the_lease_once_trust_ran_out(database_url) -> None:
    """Renewals that never answer (the row is locked: each waits out its real 1.5 s timeout)
    do not extend trust; when it runs out the lease is lost and nothing more is sent."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)

        async def bounded(lease, seconds):
            assert len(lease.renewals_sent) <= 5, "renewals went on after trust ran out"

        lease.on_nap = bounded
        locker = await asyncpg.connect(database_url)
        try:
            await lease.take()
            acquired_at = fake.clock()
            async with locker.transaction():
                await locker.execute("SELECT 1 FROM arkvory_gateway_leases WHERE slot = 1 FOR UPDATE")
                await lease.keep_renewing()
            assert lease.counted.results == ["failed"] * 3
            assert lease.renewals_sent == [
                pytest.approx(acquired_at + RENEW_EVERY * n, abs=EXACT) for n in range(1, 4)
            ]
            assert lease.lost.is_set() and not lease.trusted
            assert lease.lost_reason == "trust ran out before a renewal succeeded"
            assert fake.clock() == pytest.approx(acquired_at + TRUST, abs=EXACT)
        finally:
            await lease.close_connection()
            await locker.close()

    run(database_url, scenario)


# -- what the database decides: expiry and fencing ---------------------------------------------


def test_the_database_never_renews_an_expired_reservation(database_url) -> None:
    """The process still trusts its lease (its clock says 2 s), but the reservation ran out
    meanwhile (a frozen process, a jump of the database clock): the renewal is refused and
    the reservation stays expired for whoever takes the slot next."""

    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            await conn.execute(
                "UPDATE arkvory_gateway_leases SET expires_at = now() - interval '1 millisecond' WHERE slot = 1"
            )
            before = await lease_row(conn)
            fake.advance(RENEW_EVERY)
            assert lease.trusted
            await lease.renew()
            assert lease.counted.results == ["rejected"]
            assert lease.lost.is_set() and not lease.trusted
            assert "refused" in lease.lost_reason
            after = await lease_row(conn)
            assert not after["live"] and after["expires_at"] == before["expires_at"]
        finally:
            await lease.close_connection()

    run(database_url, scenario)


@pytest.mark.parametrize(
    "takeover",
    [
        "holder_id = gen_random_uuid()",  # the same generation under another holder
        "generation = generation + 1",  # the same holder id, another generation
    ],
)
def test_renewal_is_fenced_by_holder_id_and_by_generation(database_url, takeover: str) -> None:
    async def scenario(conn, fake):
        lease = FakeTimeLease(database_url, fake)
        try:
            await lease.take()
            await conn.execute(f"UPDATE arkvory_gateway_leases SET {takeover} WHERE slot = 1")
            before = await lease_row(conn)
            fake.advance(RENEW_EVERY)
            await lease.renew()
            assert lease.counted.results == ["rejected"] and lease.lost.is_set() and not lease.trusted
            assert (await lease_row(conn))["renewed_at"] == before["renewed_at"]
        finally:
            await lease.close_connection()

    run(database_url, scenario)


def test_each_acquisition_takes_a_fresh_holder_and_the_next_generation(database_url) -> None:
    async def scenario(conn, fake):
        old, new = FakeTimeLease(database_url, fake), FakeTimeLease(database_url, fake)
        try:
            await old.take()
            await conn.execute("UPDATE arkvory_gateway_leases SET expires_at = now() WHERE slot = 1")
            await new.take()
            assert new.holder_id != old.holder_id
            assert (old.generation, new.generation) == (1, 2)
            row = await lease_row(conn)
            assert (row["holder_id"], row["generation"]) == (new.holder_id, 2)
            # The old holder comes back: fenced off, and the new holder keeps the slot.
            await old.renew()
            assert old.counted.results == ["rejected"] and old.lost.is_set()
            await new.renew()
            assert new.counted.results == ["ok"] and new.trusted
        finally:
            await old.close_connection()
            await new.close_connection()

    run(database_url, scenario)


# -- restarting the same slot -------------------------------------------------------------------


async def _old_holder(conn, database_url: str, fake: FakeTime, remaining: float) -> uuid.UUID:
    """A holder that stopped renewing (killed), its reservation running `remaining` s more."""
    old = FakeTimeLease(database_url, fake)
    await old.take()
    await old.close_connection()
    await conn.execute(
        "UPDATE arkvory_gateway_leases SET expires_at = now() + make_interval(secs => $1) WHERE slot = 1",
        remaining,
    )
    return old.holder_id


def _database_time_passes(conn):
    """The database's side of a fake nap: the reservation comes `seconds` closer to its end
    (only `expires_at` moves: a changed `renewed_at` would be a holder still renewing)."""

    async def on_nap(lease, seconds):
        await conn.execute(
            "UPDATE arkvory_gateway_leases SET expires_at = expires_at - make_interval(secs => $1)"
            " WHERE slot = 1",
            seconds,
        )

    return on_nap


def test_a_start_waits_for_a_live_reservation_but_at_most_15_s(database_url) -> None:
    async def scenario(conn, fake):
        await _old_holder(conn, database_url, fake, 14.5)
        new = FakeTimeLease(database_url, fake)
        new.on_nap = _database_time_passes(conn)
        started, real_start = fake.clock(), time.monotonic()
        try:
            await new.take()
            waited = fake.clock() - started
            # The database clock also ran on for real meanwhile (milliseconds).
            assert 14.5 <= waited + (time.monotonic() - real_start) and waited <= ACQUIRE_LIMIT, new.naps
            assert new.generation == 2 and new.trusted

            # A reservation that would end after the 15 s: busy at once, without waiting for it.
            await conn.execute("DELETE FROM arkvory_gateway_leases")
            await _old_holder(conn, database_url, fake, 16.5)
            late = FakeTimeLease(database_url, fake)
            late.on_nap = _database_time_passes(conn)
            started = fake.clock()
            with pytest.raises(SlotBusy, match=r"busy: .* runs 1[56]\.\d s more"):
                await late.take()
            assert fake.clock() == started and late.naps == []
            await late.close_connection()
        finally:
            await new.close_connection()

    run(database_url, scenario)


def test_an_old_holder_that_still_renews_makes_the_start_busy(database_url) -> None:
    async def scenario(conn, fake):
        await _old_holder(conn, database_url, fake, RESERVATION)
        new = FakeTimeLease(database_url, fake)

        async def old_renews(lease, seconds):
            await conn.execute(
                "UPDATE arkvory_gateway_leases SET renewed_at = now(),"
                " expires_at = now() + make_interval(secs => $1) WHERE slot = 1",
                RESERVATION,
            )

        new.on_nap = old_renews
        try:
            with pytest.raises(SlotBusy, match="still renewing"):
                await new.take()
            assert len(new.naps) == 1 and new.generation is None and not new.trusted
        finally:
            await new.close_connection()

    run(database_url, scenario)

