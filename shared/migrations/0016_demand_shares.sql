-- Demand shares (issue 23, SPEC §4 "Demand mode"): the share mode in the saved policy, each slot's
-- demand and grant beside its lease row, each principal's per slot, and the one statement a
-- process runs per renewal (shared/cluster/grants.py argues why it never hands out more than the
-- total). Static mode never reads or writes any of this.
ALTER TABLE arkvory_download_policy
    ADD COLUMN share_mode text NOT NULL DEFAULT 'static' CHECK (share_mode IN ('static', 'demand'));

-- share_generation: the lease generation these columns belong to (a new holder starts from its
-- floor); share_seq: the holder's renewal number (a statement that arrives after a newer one is
-- ignored); share_held until share_held_until: a larger grant the holder may still be using.
ALTER TABLE arkvory_gateway_leases
    ADD COLUMN share_generation bigint,
    ADD COLUMN share_seq bigint NOT NULL DEFAULT 0,
    ADD COLUMN share_demand bigint NOT NULL DEFAULT 0,
    ADD COLUMN share_weight integer NOT NULL DEFAULT 0,
    ADD COLUMN share_granted bigint NOT NULL DEFAULT 0,
    ADD COLUMN share_held bigint NOT NULL DEFAULT 0,
    ADD COLUMN share_held_until timestamptz;

-- One row per principal downloading in a slot (deleted with the slot's lease row, so
-- `admin reset-download-policy` clears it too).
CREATE TABLE arkvory_principal_shares (
    principal text NOT NULL,
    slot integer NOT NULL REFERENCES arkvory_gateway_leases (slot) ON DELETE CASCADE,
    generation bigint NOT NULL,
    demand bigint NOT NULL,
    weight integer NOT NULL,
    granted bigint NOT NULL,
    held bigint NOT NULL DEFAULT 0,
    held_until timestamptz,
    PRIMARY KEY (principal, slot)
);
CREATE INDEX arkvory_principal_shares_slot ON arkvory_principal_shares (slot);

-- Weighted max-min fair division of `capacity` within each group: a key that wants less than its
-- weighted part gets what it wants, the rest is split by weight among the others. Whole bytes,
-- rounded down, so a group's parts never add up to more than `capacity`. Window functions only
-- (sorts, no join of the rows with themselves): a renewal divides every principal's total at once.
CREATE FUNCTION arkvory_water_fill(capacity bigint, groups text[], keys integer[], demands bigint[], weights integer[])
RETURNS TABLE (grp text, key integer, extra bigint)
LANGUAGE sql IMMUTABLE AS $$
    WITH ordered AS (
        -- In order of demand per weight: what the keys before each one want, and the weight
        -- of the keys from it on. (Groups compare bytewise, "C": nothing depends on their order.)
        SELECT u.grp, u.key, u.e, u.w,
               coalesce(sum(u.e) OVER (win ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before,
               sum(u.w) OVER (win ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS rest
        FROM unnest(groups, keys, demands, weights) AS u(grp, key, e, w)
        WHERE u.e > 0 AND u.w > 0
        WINDOW win AS (PARTITION BY u.grp COLLATE "C" ORDER BY u.e::float8 / u.w, u.key)
    ), level AS (
        -- The first key that wants at least its part of what is left (the keys after it do
        -- too): it and every key after it get their part of that; none, and every key gets
        -- what it wants. Whatever the order, each key before it gets at most what it wants and
        -- those from it on share what is left, so the parts never add up to more than
        -- `capacity`; the order and this test (in double precision) only make it exact.
        SELECT o.grp, o.key, o.e, o.w,
               max(capacity - o.before) FILTER (WHERE o.e::float8 * o.rest >= o.w::float8 * (capacity - o.before))
                   OVER (PARTITION BY o.grp COLLATE "C") AS left_over,
               max(o.rest) FILTER (WHERE o.e::float8 * o.rest >= o.w::float8 * (capacity - o.before))
                   OVER (PARTITION BY o.grp COLLATE "C") AS left_weight
        FROM ordered AS o
    )
    SELECT l.grp, l.key,
           CASE WHEN l.left_weight IS NULL THEN l.e
                ELSE least(l.e, div(l.w::numeric * l.left_over, l.left_weight)::bigint) END
    FROM level AS l
$$;

-- One renewal of a demand-mode slot: the lease's conditional renewal, then the slot's share of
-- the total and its principals' shares of their totals. Returns renewed = false (nothing
-- changed) when the lease is not this holder's any more or has expired, or when a newer renewal
-- of this holder came first. `p_may_use`: the highest rate the process may use until its next
-- renewal without hearing anything new (what it applies, or a grant it received and has not
-- applied yet); `p_at`: the database clock (tests give their own).
CREATE FUNCTION arkvory_renew_share(
    p_slot integer, p_holder uuid, p_generation bigint, p_seq bigint, p_reservation double precision,
    p_demand bigint, p_weight integer, p_may_use bigint,
    p_principals text[], p_demands bigint[], p_weights integer[], p_may_uses bigint[],
    p_at timestamptz DEFAULT now())
RETURNS TABLE (renewed boolean, process_granted bigint, process_target bigint,
               principal_ids text[], principal_granted bigint[], principals_short integer,
               took double precision)
LANGUAGE plpgsql AS $$
DECLARE
    v_slots integer;
    v_total bigint;
    v_pp bigint;
    v_mode text;
    v_until timestamptz := p_at + make_interval(secs => p_reservation);
    v_lease record;
    v_floor bigint;
    v_divisible bigint;
    v_granted bigint;
    v_held bigint;
    v_held_until timestamptz;
    v_target bigint;
    v_others bigint;
    v_keys integer[];
    v_demands bigint[];
    v_weights integer[];
    v_capacity bigint;
    v_low integer[];
    v_part bigint;
    v_fair_keys integer[];
    v_fair_parts bigint[];
    v_over text;
    v_pfloor bigint;
    v_pdivisible bigint;
    v_ids text[];
    v_pgranted bigint[];
    v_short integer := 0;
BEGIN
    -- Every renewal of every slot takes this row lock first: one allocation at a time, each
    -- seeing what the ones before it committed.
    SELECT p.slots, p.total_bytes_per_second, p.per_principal_bytes_per_second, p.share_mode
      INTO v_slots, v_total, v_pp, v_mode
      FROM arkvory_download_policy AS p FOR NO KEY UPDATE;
    IF NOT FOUND OR v_mode <> 'demand' THEN
        RETURN QUERY SELECT false, 0::bigint, 0::bigint, NULL::text[], NULL::bigint[], 0,
                            extract(epoch FROM clock_timestamp() - statement_timestamp())::float8;
        RETURN;
    END IF;
    UPDATE arkvory_gateway_leases AS l
       SET renewed_at = p_at, expires_at = v_until
     WHERE l.slot = p_slot AND l.holder_id = p_holder AND l.generation = p_generation
       AND l.expires_at > p_at
       AND (l.share_generation IS DISTINCT FROM p_generation OR l.share_seq < p_seq)
    RETURNING l.share_generation, l.share_granted, l.share_held, l.share_held_until INTO v_lease;
    IF NOT FOUND THEN
        RETURN QUERY SELECT false, 0::bigint, 0::bigint, NULL::text[], NULL::bigint[], 0,
                            extract(epoch FROM clock_timestamp() - statement_timestamp())::float8;
        RETURN;
    END IF;

    -- The process's own share. Each slot's floor is reserved whether it is live or not, so a
    -- process may use it from its acquisition on; only the rest is divided by demand.
    v_floor := v_total / (20 * v_slots);
    v_divisible := v_total - v_floor * v_slots;
    IF v_lease.share_generation IS DISTINCT FROM p_generation THEN
        v_granted := v_floor;  -- a new holder: it starts from its floor
        v_held := 0;
        v_held_until := NULL;
    ELSE
        v_granted := v_lease.share_granted;
        v_held := v_lease.share_held;
        v_held_until := v_lease.share_held_until;
    END IF;
    IF v_held_until IS NULL OR v_held_until <= p_at THEN
        v_held := 0;
        v_held_until := NULL;
    END IF;
    IF p_may_use <= v_granted THEN
        v_held := 0;  -- confirmed: it uses no more than its grant, and holds nothing larger
        v_held_until := NULL;
    ELSE
        v_held := greatest(v_held, p_may_use);  -- still (maybe) in use: reserved for as long as
        v_held_until := v_until;                -- the process may trust this renewal
    END IF;
    UPDATE arkvory_gateway_leases AS l
       SET share_generation = p_generation, share_seq = p_seq,
           share_demand = greatest(p_demand, 0), share_weight = greatest(p_weight, 0)
     WHERE l.slot = p_slot;

    -- The fair division: the live slots with downloads that want more than their floor share
    -- what the other slots' floors leave, by downloads, each one's floor counted in its part
    -- (max-min fair between its floor and its demand: clients spread unevenly over the
    -- processes get even rates); every other slot has its floor. A slot whose part by
    -- downloads would fall below its floor keeps its floor and the others share the rest.
    SELECT array_agg(l.slot), array_agg(least(l.share_demand, v_total)), array_agg(l.share_weight)
      INTO v_keys, v_demands, v_weights
      FROM arkvory_gateway_leases AS l
     WHERE l.expires_at > p_at AND l.share_generation = l.generation
       AND l.share_weight > 0 AND l.share_demand > v_floor;
    v_capacity := v_total - v_floor * (v_slots - coalesce(cardinality(v_keys), 0));
    v_target := v_floor;
    WHILE p_slot = ANY (v_keys) LOOP
        SELECT array_agg(f.key) FILTER (WHERE f.extra < v_floor), max(f.extra) FILTER (WHERE f.key = p_slot),
               array_agg(f.key), array_agg(f.extra)
          INTO v_low, v_part, v_fair_keys, v_fair_parts
          FROM arkvory_water_fill(v_capacity, array_fill(''::text, ARRAY[cardinality(v_keys)]),
                                  v_keys, v_demands, v_weights) AS f;
        IF v_low IS NULL THEN
            v_target := v_part;
            EXIT;
        END IF;
        SELECT array_agg(u.k), array_agg(u.d), array_agg(u.w) INTO v_keys, v_demands, v_weights
          FROM unnest(v_keys, v_demands, v_weights) AS u(k, d, w) WHERE u.k <> ALL (v_low);
        v_capacity := v_capacity - v_floor * cardinality(v_low);
    END LOOP;
    SELECT coalesce(sum(greatest(0, greatest(l.share_granted,
                    CASE WHEN l.share_held_until > p_at THEN l.share_held ELSE 0 END) - v_floor)), 0)
      INTO v_others
      FROM arkvory_gateway_leases AS l
     WHERE l.slot <> p_slot AND l.expires_at > p_at AND l.share_generation = l.generation;
    IF v_target < v_granted THEN
        -- Decreased: what the process may still use (it reported the larger of what its
        -- buckets apply and the last grant it received, lowered only by what it gave back
        -- itself) stays reserved until it confirms the new grant or can no longer trust this
        -- renewal.
        IF p_may_use > v_target THEN
            v_held := greatest(v_held, p_may_use);
            v_held_until := v_until;
        END IF;
        v_granted := v_target;
    ELSIF v_target > v_granted THEN
        -- Increased only by what no other live slot holds (granted, or held after a decrease).
        v_granted := greatest(v_granted, least(v_target, v_floor + v_divisible - v_others));
    END IF;
    UPDATE arkvory_gateway_leases AS l
       SET share_granted = v_granted, share_held = v_held, share_held_until = v_held_until
     WHERE l.slot = p_slot;
    IF v_granted < v_target THEN
        -- Short: other slots commit more than their part of this division. Tell them (each
        -- one's slot and part): a process that hears it lowers its own buckets to its part and
        -- renews at once, so the part it gives back frees in one renewal, not at its next
        -- regular one. Only ever a hint: what it frees, it frees by its own report.
        SELECT string_agg(l.slot || ':' || coalesce(f.part, v_floor), ',' ORDER BY l.slot) INTO v_over
          FROM arkvory_gateway_leases AS l
          LEFT JOIN unnest(v_fair_keys, v_fair_parts) AS f(slot, part) ON f.slot = l.slot
         WHERE l.slot <> p_slot AND l.expires_at > p_at AND l.share_generation = l.generation
           AND greatest(l.share_granted, CASE WHEN l.share_held_until > p_at THEN l.share_held ELSE 0 END)
               > coalesce(f.part, v_floor);
        IF v_over IS NOT NULL THEN
            PERFORM pg_notify('arkvory_shares_wanted', v_over);
        END IF;
    END IF;

    -- Each principal's total, divided the same way among the slots where it downloads.
    IF v_pp > 0 THEN
        v_pfloor := v_pp / (20 * v_slots);
        v_pdivisible := v_pp - v_pfloor * v_slots;
        -- A principal the process no longer reports is one it uses only its floor for.
        DELETE FROM arkvory_principal_shares AS s
         WHERE s.slot = p_slot
           AND (s.generation <> p_generation
                OR NOT EXISTS (SELECT 1 FROM unnest(p_principals) AS u(principal) WHERE u.principal = s.principal));
        -- Every reported principal's new row is computed first and written once (one new row
        -- version each): its hold (the reported may-use, confirmed or held, as for the
        -- process), its fair part among the live slots where it downloads, and its grant.
        WITH reported AS (
            SELECT u.principal, greatest(u.demand, 0) AS demand, greatest(u.weight, 0) AS weight,
                   coalesce(s.granted, v_pfloor) AS granted, u.may_use,
                   CASE WHEN s.held_until > p_at THEN s.held ELSE 0 END AS held
              FROM unnest(p_principals, p_demands, p_weights, p_may_uses) AS u(principal, demand, weight, may_use)
              LEFT JOIN arkvory_principal_shares AS s ON s.principal = u.principal AND s.slot = p_slot
        ), own AS (
            SELECT r.principal, r.demand, r.weight, r.granted, r.may_use,
                   CASE WHEN r.may_use <= r.granted THEN 0 ELSE greatest(r.held, r.may_use) END AS held
              FROM reported AS r
        ), others AS (
            -- (from each reported principal into the key's index: the table holds every
            -- slot's principals, a process reports only its own)
            SELECT s.principal, s.slot, s.demand, s.weight,
                   greatest(s.granted, CASE WHEN s.held_until > p_at THEN s.held ELSE 0 END) AS committed
              FROM unnest(p_principals) AS u(principal)
              JOIN arkvory_principal_shares AS s ON s.principal = u.principal AND s.slot <> p_slot
              JOIN arkvory_gateway_leases AS l
                ON l.slot = s.slot AND l.generation = s.generation AND l.expires_at > p_at
        ), shared AS (
            -- Principals that download through other live slots too: only theirs need dividing.
            SELECT DISTINCT x.principal FROM others AS x
        ), fair AS (
            SELECT f.grp AS principal, f.extra
              FROM (SELECT array_agg(x.principal) AS g, array_agg(x.slot) AS k, array_agg(x.e) AS d,
                           array_agg(x.w) AS w
                      FROM (SELECT o.principal, p_slot AS slot, greatest(0, least(o.demand, v_pp) - v_pfloor) AS e,
                                   o.weight AS w FROM own AS o JOIN shared ON shared.principal = o.principal
                            UNION ALL
                            SELECT x.principal, x.slot, greatest(0, least(x.demand, v_pp) - v_pfloor), x.weight
                              FROM others AS x) AS x) AS a,
                   arkvory_water_fill(v_pdivisible, a.g, a.k, a.d, a.w) AS f
             WHERE f.key = p_slot
            UNION ALL
            -- Alone in its group: it gets what it wants, up to all there is (the same division).
            SELECT o.principal, least(greatest(0, least(o.demand, v_pp) - v_pfloor), v_pdivisible)
              FROM own AS o
             WHERE o.weight > 0 AND NOT EXISTS (SELECT 1 FROM shared WHERE shared.principal = o.principal)
        ), taken AS (
            SELECT x.principal, sum(greatest(0, x.committed - v_pfloor)) AS others
              FROM others AS x GROUP BY x.principal
        ), decided AS (
            SELECT o.principal, o.demand, o.weight, o.granted, o.held, o.may_use,
                   v_pfloor + coalesce(fair.extra, 0) AS target, coalesce(taken.others, 0) AS others
              FROM own AS o
              LEFT JOIN fair ON fair.principal = o.principal
              LEFT JOIN taken ON taken.principal = o.principal
        ), final AS (
            SELECT d.principal, d.demand, d.weight, d.target,
                   CASE WHEN d.target < d.granted THEN d.target
                        WHEN d.target > d.granted THEN
                            greatest(d.granted, least(d.target, v_pfloor + v_pdivisible - d.others))
                        ELSE d.granted END AS granted,
                   -- Decreased: what the process may still use stays reserved, as for the process.
                   CASE WHEN d.target < d.granted AND d.may_use > d.target THEN greatest(d.held, d.may_use)
                        ELSE d.held END AS held
              FROM decided AS d
        ), written AS (
            INSERT INTO arkvory_principal_shares AS s
                   (principal, slot, generation, demand, weight, granted, held, held_until)
            SELECT f.principal, p_slot, p_generation, f.demand, f.weight, f.granted, f.held,
                   CASE WHEN f.held > 0 THEN v_until END
              FROM final AS f
            ON CONFLICT (principal, slot) DO UPDATE
               SET generation = excluded.generation, demand = excluded.demand, weight = excluded.weight,
                   granted = excluded.granted, held = excluded.held, held_until = excluded.held_until
             -- A row that would not change is not written again (most of them, most of the time).
             WHERE (s.generation, s.demand, s.weight, s.granted, s.held, s.held_until)
                   IS DISTINCT FROM (excluded.generation, excluded.demand, excluded.weight, excluded.granted,
                                     excluded.held, excluded.held_until)
        )
        SELECT array_agg(f.principal), array_agg(f.granted), count(*) FILTER (WHERE f.granted < f.target)
          INTO v_ids, v_pgranted, v_short
          FROM final AS f;
    END IF;
    -- took: the statement's time in the database, its wait for the policy row's lock included
    -- (what early renewals are rationed by, shared/download/demand.py).
    RETURN QUERY SELECT true, v_granted, v_target, v_ids, v_pgranted, coalesce(v_short, 0),
                        extract(epoch FROM clock_timestamp() - statement_timestamp())::float8;
END
$$;
