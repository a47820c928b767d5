-- The table of tower-idempotency's SqliteStore (layout 1).
CREATE TABLE IF NOT EXISTS "tower_idempotency" (
    -- 8 bytes of a hash of the store's prefix, then the 32-byte store key (a hash of the
    -- door's namespace, tenant, principal and client key). No raw key is stored.
    key         BLOB    NOT NULL PRIMARY KEY,
    -- When the row stops holding its key, in ms on the store's clock (the Unix epoch by
    -- default): the end of a pending claim's lease, or of a done record's retention.
    expires_at  INTEGER NOT NULL,
    -- 'P': pending (a claim holds the key); 'D': done (the record is stored).
    state       TEXT    NOT NULL,
    -- The request's SHA-256 fingerprint (keyed by the engine's secret when it has one).
    fingerprint BLOB    NOT NULL,
    -- Pending: the claim's fencing token (16 random bytes).
    token       BLOB,
    -- Done: the engine's encoded record (status, headers, body).
    record      BLOB,
    CHECK (state = 'P' AND token IS NOT NULL AND record IS NULL
        OR state = 'D' AND token IS NULL AND record IS NOT NULL)
) STRICT, WITHOUT ROWID;
-- The purge finds expired rows through it.
CREATE INDEX IF NOT EXISTS "tower_idempotency_expires_at" ON "tower_idempotency" (expires_at);
