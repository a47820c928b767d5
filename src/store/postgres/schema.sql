-- The table of tower-idempotency's PostgresStore (layout 1). A logged table, and not
-- partitioned: the store's docs say why.
CREATE TABLE tower_idempotency (
    -- When the row stops holding its key: the end of a pending claim's lease, or of a done
    -- record's retention, on the database's clock. First, being fixed-width: no padding.
    expires_at  timestamptz NOT NULL,
    -- 8 bytes of a hash of the store's prefix, then the 32-byte store key (a hash of the
    -- door's namespace, tenant, principal and client key). No raw key is stored.
    key         bytea       NOT NULL PRIMARY KEY,
    -- 'P': pending (a claim holds the key); 'D': done (the record is stored).
    state       "char"      NOT NULL,
    -- The request's SHA-256 fingerprint (keyed by the engine's secret when it has one).
    fingerprint bytea       NOT NULL,
    -- Pending: the claim's fencing token (16 random bytes).
    token       bytea,
    -- Done: the engine's encoded record (status, headers, body).
    record      bytea,
    CHECK (state = 'P' AND token IS NOT NULL AND record IS NULL
        OR state = 'D' AND token IS NULL AND record IS NOT NULL)
);
-- The purge finds expired rows through it.
CREATE INDEX ON tower_idempotency (expires_at);
