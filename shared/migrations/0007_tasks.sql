-- Tasks, their event logs and the storage diagnostics the verify task records (SPEC §7, issue 8).
--
-- A task's status and its event are always written in one transaction: `last_event` on the
-- task row is bumped by the same UPDATE that changes the status, and the event row takes that
-- number, so the row lock makes the numbers 1, 2, 3... gapless even under concurrent writers.
CREATE TABLE arkvory_tasks (
    id uuid PRIMARY KEY,
    kind text NOT NULL,
    params jsonb NOT NULL DEFAULT '{}',
    on_restart text NOT NULL CHECK (on_restart IN ('fail', 'retry', 'resume')),
    definition_version text,
    definition_hash text NOT NULL CHECK (definition_hash ~ '^[0-9a-f]{64}$'),
    -- Dispatch keys are global across kinds (SPEC §7): one key, one task.
    idempotency_key text UNIQUE,
    budget jsonb NOT NULL DEFAULT '{}',  -- limits: max_items, max_bytes, ...
    usage jsonb NOT NULL DEFAULT '{}',  -- items, bytes, transitions, cost_units, state_bytes
    status text NOT NULL CHECK (
        status IN ('queued', 'loading', 'running', 'cancelling', 'completed', 'failed', 'cancelled')
    ),
    checkpoint jsonb,  -- the state a `resume` task continues from
    result jsonb,
    error_code text,
    error_message text,
    created_by text,  -- the principal that dispatched it (or 'schedule')
    attempts integer NOT NULL DEFAULT 0,
    worker text,  -- the holder id of the worker that claimed it
    heartbeat_at timestamptz,
    last_event integer NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX arkvory_tasks_queued ON arkvory_tasks (created_at) WHERE status = 'queued';
CREATE INDEX arkvory_tasks_unfinished ON arkvory_tasks (status)
    WHERE status IN ('queued', 'loading', 'running', 'cancelling');
CREATE INDEX arkvory_tasks_finished ON arkvory_tasks (finished_at) WHERE finished_at IS NOT NULL;
CREATE INDEX arkvory_tasks_listing ON arkvory_tasks (created_at, id);

CREATE TABLE arkvory_task_events (
    task_id uuid NOT NULL REFERENCES arkvory_tasks (id) ON DELETE CASCADE,
    seq integer NOT NULL CHECK (seq > 0),
    type text NOT NULL,
    data jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (task_id, seq)
);

-- Every event wakes whoever LISTENs: the worker (a queued or cancelling task) and the
-- event streams that follow a task live. The payload is small and fixed in shape.
CREATE FUNCTION arkvory_task_event_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('arkvory_tasks', NEW.task_id::text || ' ' || NEW.seq || ' ' || NEW.type);
    RETURN NULL;
END;
$$;
CREATE TRIGGER arkvory_task_events_notify AFTER INSERT ON arkvory_task_events
    FOR EACH ROW EXECUTE FUNCTION arkvory_task_event_notify();

-- What the verify task found wrong with a stored blob; cleared when a later check finds it good.
CREATE TABLE arkvory_storage_diagnostics (
    sha256 text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    problem text NOT NULL CHECK (problem IN ('missing', 'corrupt')),
    detail text NOT NULL DEFAULT '',
    task_id uuid,
    detected_at timestamptz NOT NULL DEFAULT now()
);
