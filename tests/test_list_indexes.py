"""Every list's SQL, as its route builds it (the `*_listing` functions, writer/pagination.py's
ListQuery), is an index scan on a big installation: each order the list offers (newest first is a
backward scan, never a sort), the cursor of a deep page (an index condition, not a filter), and each
filter by name, name prefix or digest (a range of an index). EXPLAIN on a real PostgreSQL, with the
values bound (a custom plan) and as a generic plan (which PostgreSQL may choose for a statement
prepared five times), on a database whose collation is not "C" (C.UTF-8: the planner treats it as
any linguistic one), so that the indexes of migration 0017 are the ones that serve."""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from collections.abc import Iterator
from typing import Any

import asyncpg
import pytest

from arkvory.shared import db
from arkvory.writer.blobs.diagnostics import diagnostics_listing
from arkvory.writer.catalog.artifacts import artifacts_listing
from arkvory.writer.catalog.assets import assets_listing
from arkvory.writer.catalog.packages import packages_listing
from arkvory.writer.catalog.repositories import NAME_ORDER as REPOSITORY_ORDER
from arkvory.writer.identity.accounts import accounts_listing
from arkvory.writer.identity.tokens import credentials_listing
from arkvory.writer.pagination import ListQuery
from arkvory.writer.tasks.api import tasks_listing

from .harness import db_execute

# One worker fills the big database once (~10 s); on three workers each would fill its own.
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow, pytest.mark.xdist_group("list_indexes")]

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
BIG, SMALL = uuid.UUID(int=1), uuid.UUID(int=2)
# Rows three to a timestamp, as a busy repository has them.
FILL = f"""
INSERT INTO arkvory_repositories (id, name, public)
    SELECT CASE i WHEN 1 THEN '{BIG}'::uuid WHEN 2 THEN '{SMALL}'::uuid ELSE gen_random_uuid() END, 'repo-' || i, false
    FROM generate_series(1, 3000) i;
INSERT INTO arkvory_blobs (sha256, size) SELECT lpad(to_hex(i), 64, '0'), 1 FROM generate_series(1, 60000) i;
INSERT INTO arkvory_artifacts (id, repository_id, name, sha256, size, media_type, created_at)
    SELECT gen_random_uuid(), CASE WHEN i % 10 = 0 THEN '{SMALL}'::uuid ELSE '{BIG}'::uuid END,
           'file-' || (i % 5000) || '.bin', lpad(to_hex(i), 64, '0'), 1, 'application/octet-stream',
           timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 60000) i;
INSERT INTO arkvory_packages (repository_id, group_name, name, version, artifact_id, published_at)
    SELECT '{BIG}'::uuid, 'group-' || (i % 50), 'pkg-' || (i % 400), i::text,
           (SELECT id FROM arkvory_artifacts LIMIT 1), timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 30000) i;
INSERT INTO arkvory_assets (repository_id, path, artifact_id, updated_at)
    SELECT '{BIG}'::uuid, 'releases/v' || (i % 300) || '/file-' || i, (SELECT id FROM arkvory_artifacts LIMIT 1), now()
    FROM generate_series(1, 30000) i;
INSERT INTO arkvory_accounts (id, name, password_hash, password_salt, scrypt_n, scrypt_r, scrypt_p, created_at)
    SELECT gen_random_uuid(), 'user-' || i, '\\x00', '\\x00', 1, 1, 1,
           timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 5000) i;
INSERT INTO arkvory_credentials (id, kind, digest, account_id, label, access, expires_at, created_at)
    SELECT gen_random_uuid(), CASE WHEN i % 8 = 0 THEN 'service_key' ELSE 'session' END,
           sha256(i::text::bytea), CASE WHEN i % 8 = 0 THEN NULL ELSE (SELECT id FROM arkvory_accounts LIMIT 1) END,
           'label-' || i, NULL, now() + interval '1 day',
           timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 40000) i;
INSERT INTO arkvory_tasks (id, kind, on_restart, definition_hash, status, created_at)
    SELECT gen_random_uuid(), CASE WHEN i % 2 = 0 THEN 'cleanup' ELSE 'verify' END, 'fail', repeat('0', 64),
           CASE WHEN i % 5 = 0 THEN 'failed' ELSE 'completed' END,
           timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 20000) i;
INSERT INTO arkvory_storage_diagnostics (sha256, problem, detected_at)
    SELECT lpad(to_hex(i), 64, '0'), CASE WHEN i % 2 = 0 THEN 'missing' ELSE 'corrupt' END,
           timestamptz '2026-01-01 00:00:00+00' + (i / 3) * interval '1 second'
    FROM generate_series(1, 20000) i;
"""


@pytest.fixture(scope="module")
def big(postgres) -> Iterator[str]:
    """A database of collation C.UTF-8 (not "C") with a big repository, migrated and analyzed."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    db_execute(postgres.url, f"CREATE DATABASE \"{name}\" TEMPLATE template0 LOCALE 'C.UTF-8'")
    url = postgres.url.rsplit("/", 1)[0] + "/" + name

    async def prepare() -> None:
        conn = await asyncpg.connect(url)
        try:
            await db.migrate(conn)
            await conn.execute(FILL, timeout=120)
            await conn.execute("ANALYZE", timeout=60)
        finally:
            await conn.close()

    asyncio.run(prepare())
    yield url
    db_execute(postgres.url, f'DROP DATABASE "{name}" WITH (FORCE)')


def _literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "ARRAY[" + ", ".join(_literal(v) for v in value) + "]::text[]"
    text = value.isoformat() if isinstance(value, datetime.datetime) else str(value)
    return "'" + text.replace("'", "''") + "'"


def plans(url: str, listing: ListQuery, limit: int = 100) -> dict[str, dict]:
    """The custom and the generic plan of the page `listing` asks for (EXPLAIN's JSON)."""
    sql, args = listing.statement(limit)

    async def explain() -> dict[str, dict]:
        conn = await asyncpg.connect(url)
        try:
            custom = json.loads(await conn.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args))[0]["Plan"]
            await conn.execute("SET plan_cache_mode = force_generic_plan")
            await conn.execute(f"PREPARE page AS {sql}")
            generic = json.loads(await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) EXECUTE page({', '.join(_literal(a) for a in args)})"
            ))[0]["Plan"]
            return {"custom": custom, "generic": generic}
        finally:
            await conn.close()

    return asyncio.run(explain())


def nodes(plan: dict) -> Iterator[dict]:
    """The plan's nodes, without the subplans of a row's own columns (diagnostics' artifacts)."""
    yield plan
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") not in ("SubPlan", "InitPlan"):
            yield from nodes(child)


INDEX_NODES = ("Index Scan", "Index Only Scan", "Bitmap Index Scan")


def check(url: str, listing: ListQuery, index: str, *, sort: bool = False, backward: bool = False,
          cond: tuple[str, ...] = ()) -> None:
    """Both plans read `index` (backward for newest first), with each of `cond` in its Index
    Cond, and sort nothing unless `sort`: a prefix's rows are a range of the index, which the
    planner reads in order, or reads whole and sorts when it expects them few."""
    for which, plan in plans(url, listing).items():
        shown = json.dumps(plan, indent=1)
        scans = [n for n in nodes(plan) if n["Node Type"] in INDEX_NODES and n.get("Index Name") == index]
        assert scans, f"{which} plan does not read {index}:\n{shown}"
        assert not [n for n in nodes(plan) if n["Node Type"] == "Seq Scan"], f"{which}: a sequential scan\n{shown}"
        if not sort:
            assert not [n for n in nodes(plan) if "Sort" in n["Node Type"]], f"{which} plan sorts:\n{shown}"
            assert scans[0]["Node Type"] != "Bitmap Index Scan", f"{which}: a bitmap scan is not in order\n{shown}"
            assert scans[0].get("Scan Direction") == ("Backward" if backward else "Forward"), shown
        for needed in cond:
            assert needed in scans[0].get("Index Cond", ""), f"{which}: {needed!r} not in the Index Cond:\n{shown}"


CURSOR_TIME = (datetime.datetime(2026, 1, 1, 2, tzinfo=datetime.UTC), uuid.UUID(int=7))


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_artifacts_in_either_order_deep_pages_too(big, order):
    backward = order == "newest"
    check(big, artifacts_listing(BIG, order=order), "arkvory_artifacts_listing", backward=backward)
    check(big, artifacts_listing(BIG, order=order, cursor=CURSOR_TIME), "arkvory_artifacts_listing",
          backward=backward, cond=("ROW(created_at, id)",))


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_artifacts_by_name_and_by_name_prefix(big, order):
    backward = order == "newest"
    check(big, artifacts_listing(BIG, order=order, name="file-12.bin"), "arkvory_artifacts_name", backward=backward)
    check(big, artifacts_listing(BIG, order=order, name="file-12.bin", cursor=CURSOR_TIME), "arkvory_artifacts_name",
          backward=backward, cond=("ROW(created_at, id)",))
    check(big, artifacts_listing(BIG, order=order, prefix="file-123"), "arkvory_artifacts_name", sort=True,
          cond=("name",))


def test_artifacts_by_digest(big):
    check(big, artifacts_listing(BIG, sha256="0" * 60 + "abcd"), "arkvory_artifacts_sha256", sort=True)


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_package_versions_newest_or_oldest_first(big, order):
    backward = order == "newest"
    check(big, packages_listing(BIG, order=order), "arkvory_packages_published", backward=backward)
    cursor = (CURSOR_TIME[0], "group-1", "pkg-1", "51")
    check(big, packages_listing(BIG, order=order, cursor=cursor), "arkvory_packages_published", backward=backward,
          cond=("ROW(published_at",))


def test_package_versions_by_name(big):
    check(big, packages_listing(BIG), "arkvory_packages_listing")
    check(big, packages_listing(BIG, cursor=("group-3", "pkg-7", "9")), "arkvory_packages_listing", cond=("ROW(",))
    check(big, packages_listing(BIG, group="group-3"), "arkvory_packages_listing", cond=("group_name",))
    check(big, packages_listing(BIG, group="group-3", prefix="pkg-10"), "arkvory_packages_listing",
          cond=("group_name", "name"))
    check(big, packages_listing(BIG, group="group-3", name="pkg-103"), "arkvory_packages_listing",
          cond=("group_name", "name"))
    # A name or name prefix in any group: the name's own index, its few rows sorted.
    check(big, packages_listing(BIG, prefix="pkg-10"), "arkvory_packages_name", sort=True, cond=("name",))


def test_assets_by_path_and_path_prefix(big):
    check(big, assets_listing(BIG), "arkvory_assets_listing")
    check(big, assets_listing(BIG, prefix="releases/v12/"), "arkvory_assets_listing", sort=True, cond=("path",))
    check(big, assets_listing(BIG, prefix="releases/v12/", cursor=("releases/v12/file-1000",)), "arkvory_assets_listing",
          sort=True, cond=("path",))


def test_repositories_by_name_and_prefix(big):
    listing = ListQuery("SELECT id, name, public FROM arkvory_repositories", REPOSITORY_ORDER)
    check(big, listing, "arkvory_repositories_name_bytes")
    listing = ListQuery("SELECT id, name, public FROM arkvory_repositories", REPOSITORY_ORDER)
    check(big, listing.starts_with('name COLLATE "C"', "repo-12"), "arkvory_repositories_name_bytes", sort=True,
          cond=("name",))


@pytest.mark.parametrize("order", ["name", "oldest", "newest"])
def test_accounts(big, order):
    index = "arkvory_accounts_name_folded" if order == "name" else "arkvory_accounts_created"
    check(big, accounts_listing(order=order), index, backward=order == "newest")
    check(big, accounts_listing(prefix="User-12"), "arkvory_accounts_name_folded", sort=True, cond=("lower",))


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_service_keys_and_tasks(big, order):
    backward = order == "newest"
    check(big, credentials_listing("c.kind = 'service_key'", order=order), "arkvory_credentials_service_keys",
          backward=backward)
    check(big, credentials_listing("c.kind = 'service_key'", order=order, cursor=CURSOR_TIME),
          "arkvory_credentials_service_keys", backward=backward, cond=("ROW(",))
    check(big, tasks_listing(order=order), "arkvory_tasks_listing", backward=backward)
    check(big, tasks_listing(order=order, cursor=CURSOR_TIME), "arkvory_tasks_listing", backward=backward,
          cond=("ROW(",))


def test_diagnostics(big):
    check(big, diagnostics_listing(), "arkvory_storage_diagnostics_pkey")
    check(big, diagnostics_listing(prefix="00000000000000000000000000000000000000000000000000000000000a"),
          "arkvory_storage_diagnostics_pkey", sort=True, cond=("sha256",))
    for order in ("newest", "oldest"):
        check(big, diagnostics_listing(order=order), "arkvory_storage_diagnostics_detected", backward=order == "newest")
