-- The table of tower-idempotency's MySqlStore (layout 1), for MySQL 8 and MariaDB 10.11. InnoDB:
-- row locks, and a commit durable in its redo log.
CREATE TABLE IF NOT EXISTS `tower_idempotency` (
    -- 8 bytes of a hash of the store's prefix, then the 32-byte store key (a hash of the door's
    -- namespace, tenant, principal and client key). No raw key is stored.
    `key`       VARBINARY(40)  NOT NULL PRIMARY KEY,
    -- When the row stops holding its key: the end of a pending claim's lease, or of a done
    -- record's retention, on the database's clock (UTC_TIMESTAMP(6)).
    expires_at  DATETIME(6)    NOT NULL,
    -- 'P': pending (a claim holds the key); 'D': done (the record is stored).
    state       CHAR(1) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The request's SHA-256 fingerprint (keyed by the engine's secret when it has one).
    fingerprint VARBINARY(32)  NOT NULL,
    -- The fencing token (16 random bytes) of the claim that holds the key, or of the complete
    -- that wrote the record: how a statement tells its own write from another's.
    token       VARBINARY(16)  NOT NULL,
    -- Done: the engine's encoded record (status, headers, body).
    record      LONGBLOB       NULL,
    -- The purge finds expired rows through it.
    INDEX expires_at (expires_at)
) ENGINE = InnoDB;
