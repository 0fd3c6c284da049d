-- Restart recovery and budgets that hold across runs (issue 13).
ALTER TABLE arkvory_tasks
    -- Runs a task may start before restart recovery stops running it again (`attempts_exhausted`).
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 3 CHECK (max_attempts BETWEEN 1 AND 10),
    -- The usage as of `checkpoint`, written by the same statement: a resumed run continues
    -- from both, so the work it does again after the checkpoint is not counted twice.
    ADD COLUMN checkpoint_usage jsonb,
    -- The transaction that dispatched the task. Restart recovery fails a `queued` task only if
    -- this transaction had committed when the activation began (the activation's snapshot),
    -- not one whose transaction began before the activation and committed after it.
    ADD COLUMN dispatch_xact xid8 NOT NULL DEFAULT pg_current_xact_id();
