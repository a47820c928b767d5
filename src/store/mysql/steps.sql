-- The steps of tower-idempotency's MySqlStore (layout 1): one row per recorded step of a
-- request's work. Beside the records' table, named after it with `_steps`.
CREATE TABLE IF NOT EXISTS `tower_idempotency_steps` (
    -- The key of the request, as in the records' table. No foreign key: steps outlive a
    -- released claim, whose row is deleted.
    `key`        VARBINARY(40)  NOT NULL,
    -- 32 bytes the engine derives from the request's fingerprint and the step's place.
    step         VARBINARY(32)  NOT NULL,
    -- When the step stops counting, on the database's clock: its retention after the end of
    -- the lease of the claim that holds the key, or after it was recorded.
    expires_at   DATETIME(6)    NOT NULL,
    -- The engine's encoding of the step's result: its name and the codec's bytes.
    value        LONGBLOB       NOT NULL,
    -- The retention the step was recorded with, in ms, kept for renewing the claim.
    retention_ms BIGINT         NOT NULL,
    -- 16 random bytes of the statement that recorded it: how a statement tells its own record
    -- from a concurrent one's.
    writer       VARBINARY(16)  NOT NULL,
    PRIMARY KEY (`key`, step),
    -- The purge finds expired steps through it.
    INDEX expires_at (expires_at)
) ENGINE = InnoDB;
