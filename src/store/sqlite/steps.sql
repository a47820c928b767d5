-- The steps of tower-idempotency's SqliteStore (layout 1): one row per recorded step of a
-- request's work. Beside the records' table, named after it with `_steps`.
CREATE TABLE IF NOT EXISTS "tower_idempotency_steps" (
    -- The key of the request, as in the records' table. No foreign key: steps outlive a
    -- released claim, whose row is deleted.
    key          BLOB    NOT NULL,
    -- 32 bytes the engine derives from the request's fingerprint and the step's place.
    step         BLOB    NOT NULL,
    -- When the step stops counting, in ms on the store's clock: its retention after the end
    -- of the lease of the claim that holds the key, or after it was recorded. Renewing the
    -- claim moves it on; completing the key deletes the key's steps.
    expires_at   INTEGER NOT NULL,
    -- The engine's encoding of the step's result: its name and the codec's bytes.
    value        BLOB    NOT NULL,
    -- The retention the step was recorded with, in ms, kept for renewing the claim.
    retention_ms INTEGER NOT NULL,
    PRIMARY KEY (key, step)
) STRICT, WITHOUT ROWID;
-- The purge finds expired steps through it.
CREATE INDEX IF NOT EXISTS "tower_idempotency_steps_expires_at" ON "tower_idempotency_steps" (expires_at);
