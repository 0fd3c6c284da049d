-- Coordination state shared by the writer and the gateways (SPEC §3, §4).
CREATE TABLE arkvory_storage (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    storage_id uuid NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE arkvory_download_policy (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    slots integer NOT NULL CHECK (slots BETWEEN 2 AND 16),
    total_bytes_per_second bigint NOT NULL,
    per_principal_bytes_per_second bigint NOT NULL,
    saved_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE arkvory_gateway_leases (
    slot integer PRIMARY KEY CHECK (slot BETWEEN 0 AND 15),
    holder_id uuid NOT NULL,
    generation bigint NOT NULL,
    pid integer NOT NULL,
    host text NOT NULL,
    role text NOT NULL,
    acquired_at timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);
