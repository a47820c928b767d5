-- The steps of tower-idempotency's PostgresStore (layout 1): one row per recorded step of a
-- request's work. Beside the records' table, named after it with `_steps`. A logged table.
CREATE TABLE tower_idempotency_steps (
    -- When the step stops counting, on the database's clock: its retention after the end of
    -- the lease of the claim that holds the key, or after it was recorded. Renewing the claim
    -- moves it on; completing the key deletes the key's steps.
    expires_at   timestamptz NOT NULL,
    -- The key of the request, as in the records' table. No foreign key: steps outlive a
    -- released claim, whose row is deleted.
    key          bytea       NOT NULL,
    -- 32 bytes the engine derives from the request's fingerprint and the step's place.
    step         bytea       NOT NULL,
    -- The engine's encoding of the step's result: its name and the codec's bytes.
    value        bytea       NOT NULL,
    -- The retention the step was recorded with, in ms, kept for renewing the claim. The
    -- default serves rows a replica of an older version writes while a new one rolls out.
    retention_ms int8        NOT NULL DEFAULT 0,
    PRIMARY KEY (key, step)
);
-- The purge finds expired steps through it.
CREATE INDEX ON tower_idempotency_steps (expires_at);
