-- How each slot's leases ended (issue 24 item 1), so that a lost lease is reported by the
-- processes that survive it, not only by the one that lost it and exits two seconds later
-- (shared/cluster/lease_history.py).
ALTER TABLE arkvory_gateway_leases
    -- Set by a holder that stops on purpose, while its reservation is still live; cleared at
    -- each acquisition. A reservation that runs out without it was lost: the holder could not
    -- renew in time (database unreachable or slow, a frozen host) or it crashed or was killed.
    ADD COLUMN released_at timestamptz,
    -- Reservations of this slot that ran out unreleased and were then taken over: the next
    -- acquisition counts its predecessor's, in the same statement.
    ADD COLUMN unreleased_ends bigint NOT NULL DEFAULT 0,
    -- Payload chunks a holder of this slot handed out after its lease's trust ended (must stay
    -- 0), recorded by that process on its way out.
    ADD COLUMN payload_after_trust_chunks bigint NOT NULL DEFAULT 0;

-- How the leases before this migration ended is unknown: none is counted.
UPDATE arkvory_gateway_leases SET released_at = renewed_at;
