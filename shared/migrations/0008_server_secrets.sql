-- Secrets the writer keeps for itself (issue 13). `login_device` signs the device cookies of
-- login limits (writer/identity/device_cookies.py): HMAC-SHA256 keys, never shown by any route. Made here
-- from PostgreSQL's strong random source (gen_random_uuid uses pg_strong_random: two of them are
-- 244 random bits), so that racing first logins never make two. Replacing the value (UPDATE)
-- invalidates every device cookie at once.
CREATE TABLE arkvory_server_secrets (
    name text PRIMARY KEY,
    secret bytea NOT NULL CHECK (length(secret) >= 32),
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO arkvory_server_secrets (name, secret)
VALUES ('login_device', uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()));
