"""Whether the database replicates synchronously (SPEC §11): what a failover would keep.

The lease reservations live in the database. A standby promoted after *asynchronous*
replication may lack the last renewals, so its reservations end before the trust their holders
still count on, and a slot could be granted twice for a few seconds. Every process reads the
primary's view of its standbys at start and says once if they are all asynchronous; the writer
and the gateways read it again on each ping of their control connection for their readiness
(`database`), and `arkvory admin status` shows it.

What a role may see: any role sees one row of `pg_stat_replication` per WAL sender (its pid and
application_name), but its `state` and `sync_state` only with `pg_read_all_stats` (in
`pg_monitor`) or as a superuser; `synchronous_standby_names` and `synchronous_commit` anyone may
read. Without the privilege, standbys with no `synchronous_standby_names` are known to be
asynchronous; with it set, the answer is `unknown`, with the GRANT that would tell.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import asyncpg

log = logging.getLogger("arkvory.replication")

QUERY_TIMEOUT_S = 2.0
# What Arkvory's own commits wait for (synchronous_commit): `local` and `off` do not wait for
# any standby, whatever synchronous_standby_names says.
_COMMITS_WAIT_FOR_STANDBY = ("on", "remote_write", "remote_apply")
_SYNCHRONOUS_STATES = ("sync", "quorum")

_READ = """
SELECT current_setting('synchronous_standby_names') AS names,
       current_setting('synchronous_commit') AS commit_level,
       current_user AS role,
       coalesce(array_agg(r.sync_state) FILTER (WHERE r.pid IS NOT NULL
                                                AND r.state IS DISTINCT FROM 'backup'), '{}') AS states
FROM (SELECT 1) AS one LEFT JOIN pg_stat_replication AS r ON true
"""


@dataclasses.dataclass(frozen=True)
class Replication:
    """The primary's standbys, as far as this role can tell.

    `replication`: "synchronous" (every commit of ours is on a standby before it is
    acknowledged), "asynchronous" (there are standbys, and a commit may be acknowledged before
    any has it), "none" (no standby streams from this server) or "unknown" (this role may not
    see, or the database did not answer). `problem`: one line for the operator, or None."""

    replication: str
    standbys: int | None = None
    synchronous_standbys: int | None = None
    problem: str | None = None

    @property
    def synchronous_standby(self) -> bool | None:
        if self.replication == "unknown":
            return None
        return self.replication == "synchronous"

    def as_json(self) -> dict[str, Any]:
        """The readiness document's and `admin status --json`'s `database` object."""
        return {
            "synchronousStandby": self.synchronous_standby,
            "replication": self.replication,
            "standbys": self.standbys,
            "synchronousStandbys": self.synchronous_standbys,
            "problem": self.problem,
        }

    def __str__(self) -> str:
        """For a log line."""
        text = f"{self.replication}, {self.standbys} standby(s), {self.synchronous_standbys} synchronous"
        return f"{text} ({self.problem})" if self.problem else text


UNKNOWN = Replication("unknown", problem="the database did not answer")


async def read_replication(conn: asyncpg.Connection, timeout: float = QUERY_TIMEOUT_S) -> Replication:
    """The primary's standbys, seen through `conn` (any role; see the module docstring)."""
    row = await conn.fetchrow(_READ, timeout=timeout)
    return judge(row["names"], row["commit_level"], list(row["states"]), row["role"])


def judge(names: str, commit_level: str, states: list[str | None], role: str) -> Replication:
    """`states`: pg_stat_replication's sync_state of each streaming WAL sender (None where this
    role may not see it)."""
    standbys = len(states)
    if not names.strip() and standbys == 0:
        return Replication("none", 0, 0)
    if standbys == 0:
        return Replication(
            "none", 0, 0,
            problem=f"synchronous_standby_names is '{names}' but no standby is connected:"
            " every commit waits until one is",
        )
    if not names.strip():
        return Replication("asynchronous", standbys, 0, problem="synchronous_standby_names is empty")
    if any(state is None for state in states):
        return Replication(
            "unknown", standbys,
            problem=f"role {role} may not see the standbys' sync_state:"
            f" GRANT pg_read_all_stats TO {_quoted(role)} (or pg_monitor)",
        )
    synchronous = sum(state in _SYNCHRONOUS_STATES for state in states)
    if synchronous == 0:
        return Replication(
            "asynchronous", standbys, 0, problem="no standby is in sync (sync_state async or potential)"
        )
    if commit_level not in _COMMITS_WAIT_FOR_STANDBY:
        return Replication(
            "asynchronous", standbys, synchronous,
            problem=f"synchronous_commit is '{commit_level}' for role {role}: its commits do not"
            " wait for the synchronous standby",
        )
    return Replication("synchronous", standbys, synchronous)


def _quoted(role: str) -> str:
    return role if role.isidentifier() and role.islower() else '"' + role.replace('"', '""') + '"'


def warn_if_asynchronous(state: Replication) -> None:
    """The one line at start: a warning when a failover could lose renewals."""
    if state.replication == "asynchronous":
        log.warning(
            "the database has %d standby(s) and none replicates synchronously (%s): a failover to"
            " one may lose the last lease renewals and grant a slot twice for a few seconds; make"
            " one synchronous (docs/operations.md, 'PostgreSQL, highly available')",
            state.standbys,
            state.problem,
        )
    elif state.replication == "unknown" and state.standbys:
        log.info("cannot tell whether the database's standbys are synchronous: %s", state.problem)


class ReplicationWatch:
    """The latest reading, for readiness; refreshed by the control connection's pings. The first
    reading warns as `warn_if_asynchronous` says; later, a change into or out of synchronous
    replication is logged once, as it happens."""

    def __init__(self) -> None:
        self.current = UNKNOWN
        self._read_once = False

    async def at_start(self, conn: asyncpg.Connection) -> None:
        """Read it before serving; a database that does not answer this is no reason to refuse
        the start (the first ping that reads it warns instead)."""
        try:
            await self.refresh(conn, QUERY_TIMEOUT_S)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.debug("could not read the database's replication: %s: %s", exc.__class__.__name__, exc)

    async def refresh(self, conn: asyncpg.Connection, timeout: float) -> None:
        """Also a control-connection ping hook (which logs its failures)."""
        state = await read_replication(conn, timeout)
        before, self.current = self.current.replication, state
        if not self._read_once:
            self._read_once = True
            warn_if_asynchronous(state)
        elif before == "synchronous" and state.replication != "synchronous":
            log.warning("the database no longer replicates synchronously: %s", state)
        elif before != "synchronous" and state.replication == "synchronous":
            log.info("the database replicates synchronously: %s", state)
