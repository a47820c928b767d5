//! The statements the store sends, written once per table when the store is built, and the
//! bytes of a row's key.
//!
//! Every statement takes the time from `statement_timestamp()`: the database's clock, read
//! once per statement. `now()` would be the start of the transaction. That is stale for a claim
//! inside a transaction that began earlier.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::StoreKey;
use sha2::{Digest, Sha256};
use std::time::Duration;

const NAMESPACE_DOMAIN: &[u8] = b"tower-idempotency/postgres-ns/v1";
/// The table name in [`SCHEMA`], replaced by the store's.
const DEFAULT_TABLE_NAME: &str = "tower_idempotency";
/// Longest part of a table name: the index PostgreSQL names after it must fit in 63 bytes.
const MAX_NAME_PART: usize = 48;
/// Longest lease or retention sent, about 100 years. It is far from any overflow of `timestamptz`.
const MAX_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// The DDL for the default table, as documented.
pub(super) const SCHEMA: &str = include_str!("schema.sql");
/// The DDL for the default table's steps, as documented.
pub(super) const STEPS_SCHEMA: &str = include_str!("steps.sql");
/// The steps' table in [`STEPS_SCHEMA`], replaced by the store's.
const DEFAULT_STEPS_NAME: &str = "tower_idempotency_steps";
/// What names the steps' table after the records' table.
const STEPS_SUFFIX: &str = "_steps";

/// A row's state, as the `"char"` column and the claim's answer hold it.
pub(super) const PENDING: i8 = b'P' as i8;
pub(super) const DONE: i8 = b'D' as i8;
/// Not a stored state: the claim's answer when it took the key.
pub(super) const CLAIMED: i8 = b'C' as i8;

/// A row's key: 8 bytes of the store prefix's hash, then the 32-byte [`StoreKey::id`].
/// Run on each new connection of a pool made by `PostgresStoreBuilder::connect`: a commit
/// waits for its write-ahead log record where the server's default would not. Stronger
/// settings (`remote_write`, `remote_apply`) are kept.
pub(super) const DURABLE_COMMITS: &str = "SELECT set_config('synchronous_commit', 'on', false) \
     WHERE current_setting('synchronous_commit') = 'off'";

/// The marker a pool made by `connect` sets beside `statement_timeout`. It holds that value, in ms.
pub(crate) const STORE_TIMEOUT_SETTING: &str = "tower_idempotency.statement_timeout";

pub(crate) type KeyBytes = [u8; 40];

/// The first 8 bytes of the store prefix's domain-separated SHA-256.
pub(super) fn prefix_hash(prefix: &str) -> Result<[u8; 8], ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the PostgreSQL store's prefix must not be empty",
        ));
    }
    let mut h = Sha256::new();
    h.update(NAMESPACE_DOMAIN);
    h.update(prefix.as_bytes());
    let mut out = [0u8; 8];
    out.copy_from_slice(&h.finalize()[..8]);
    Ok(out)
}

pub(super) fn key_bytes(prefix: &[u8; 8], key: &StoreKey) -> KeyBytes {
    let mut out = [0u8; 40];
    out[..8].copy_from_slice(prefix);
    out[8..].copy_from_slice(key.id());
    out
}

/// A lease or retention as whole milliseconds: rounded up, at least 1, at most about a century.
pub(crate) fn millis(d: Duration) -> i64 {
    let ms = u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
    // At most MAX_MILLIS, far below i64::MAX.
    i64::try_from(ms.clamp(1, MAX_MILLIS)).unwrap_or(i64::MAX)
}

/// Checks a table name: `name` or `schema.name`, each part a lowercase identifier.
pub(super) fn check_table(table: &str) -> Result<(), ConfigError> {
    let part_ok = |p: &str| {
        let mut bytes = p.bytes();
        p.len() <= MAX_NAME_PART
            && bytes
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
            && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
    };
    let mut parts = table.split('.');
    let ok = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => part_ok(name),
        (Some(schema), Some(name), None) => part_ok(schema) && part_ok(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the PostgreSQL store's table must be a lowercase identifier, optionally schema-qualified",
        ))
    }
}

/// A checked table name with each part quoted, as `"app"."order"`. A part that is an SQL
/// keyword, such as `order` or `user`, is then a name like any other. The parts hold no `"`.
fn quote(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("\"{part}\""))
        .collect::<Vec<_>>()
        .join(".")
}

/// A statement of [`Statements`], to send. Its only text from outside is the table name, checked
/// by [`check_table`] and quoted; every value goes as a bind parameter.
pub(crate) fn statement(sql: &str) -> sqlx::AssertSqlSafe<&str> {
    sqlx::AssertSqlSafe(sql)
}

/// The store's statements for one table (checked by [`check_table`]).
#[derive(Debug)]
pub(crate) struct Statements {
    pub(super) table: String,
    /// `$1` key, `$2` fingerprint, `$3` token, `$4` lease (ms) → no row (raced a concurrent
    /// claim: ask again), or one row `(state, fingerprint, record)`, state `C` when claimed.
    pub(super) claim: String,
    /// `$1` key, `$2` token, `$3` fingerprint, `$4` record, `$5` retention (ms) → one row when written
    /// (the key's steps then deleted), or none.
    pub(super) complete: String,
    /// `$1` key, `$2` token → one row deleted, or none.
    pub(super) release: String,
    /// `$1` key, `$2` token, `$3` lease (ms) → one row when extended (the key's steps then kept
    /// their retention past the new lease), or none.
    pub(super) renew: String,
    /// Inside the claimant's transaction, which holds the row: `$1` key, `$2` token,
    /// `$3` fingerprint, `$4` record, `$5` retention (ms) → one row, the key's steps deleted.
    pub(crate) complete_held: String,
    /// `$1` key, `$2` whether a pending claim goes too → one row `(state, deleted)` for a live
    /// row, none when nothing live holds the key.
    pub(super) forget: String,
    /// `$1` batch size → the expired rows deleted.
    pub(super) purge: String,
    /// `$1` key, `$2` step, `$3` value, `$4` retention (ms) → no row (raced a concurrent record of
    /// the step: ask again), or one row `(value)`: NULL when recorded, else the first value.
    pub(super) record_step: String,
    /// `$1` key → rows `(step, value)` of the key's live steps.
    pub(super) steps: String,
    /// `$1` key → the live row `(state, fingerprint, record, ms left)`, if any.
    pub(super) inspect: String,
    /// `$1` batch size → the expired steps deleted.
    pub(super) purge_steps: String,
    /// The DDL of [`SCHEMA`] for this table.
    pub(super) schema: String,
    /// The DDL of [`STEPS_SCHEMA`] for this table's steps.
    pub(super) steps_schema: String,
    /// Adds the steps' retention to a steps' table made before it was kept.
    pub(super) steps_retention_column: String,
    /// The table as the statements name it: each part quoted.
    pub(super) quoted: String,
    /// The steps' table as the statements name it.
    pub(super) steps_quoted: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        let quoted = quote(table);
        let t = &quoted;
        // Its last part at most 48 + 6 bytes: still a valid name.
        let steps_quoted = quote(&format!("{table}{STEPS_SUFFIX}"));
        let st = &steps_quoted;
        let claim = format!(
            "WITH live AS (\
                SELECT state, fingerprint, record FROM {t} \
                WHERE key = $1 AND expires_at > statement_timestamp()\
            ), claimed AS (\
                INSERT INTO {t} AS r (expires_at, key, state, fingerprint, token) \
                SELECT statement_timestamp() + $4::int8 * interval '1 millisecond', $1, 'P', $2, $3 \
                WHERE NOT EXISTS (SELECT FROM live) \
                ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'P', \
                    fingerprint = excluded.fingerprint, token = excluded.token, record = NULL \
                WHERE r.expires_at <= statement_timestamp() \
                RETURNING 'C'::\"char\" AS state\
            ) \
            SELECT state, NULL::bytea AS fingerprint, NULL::bytea AS record FROM claimed \
            UNION ALL SELECT state, fingerprint, record FROM live"
        );
        // A written record answers every repeat: the key's steps go with the same statement.
        // The record's row is locked before the steps', as renew and a claim lock them, so
        // waiting for a step row another transaction holds cannot deadlock.
        let complete = format!(
            "WITH done AS (\
                INSERT INTO {t} AS r (expires_at, key, state, fingerprint, record) \
                VALUES (statement_timestamp() + $5::int8 * interval '1 millisecond', $1, 'D', $3, $4) \
                ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'D', \
                    fingerprint = excluded.fingerprint, token = NULL, record = excluded.record \
                WHERE r.expires_at <= statement_timestamp() OR (r.state = 'P' AND r.token = $2) \
                RETURNING 1\
            ), freed AS (\
                DELETE FROM {st} WHERE key = $1 AND EXISTS (SELECT FROM done)\
            ) \
            SELECT 1 FROM done"
        );
        let release = format!(
            "DELETE FROM {t} WHERE key = $1 AND state = 'P' AND token = $2 \
            AND expires_at > statement_timestamp()"
        );
        // The key's live steps are kept at least their retention past the new lease end: a
        // crash's retry comes after it. Steps another transaction holds are skipped, not waited
        // for: that transaction is recording a step of the key, which sets the expiry from the
        // lease, and the next renew reaches them.
        let renew = format!(
            "WITH renewed AS (\
                UPDATE {t} SET expires_at = statement_timestamp() + $3::int8 * interval '1 millisecond' \
                WHERE key = $1 AND state = 'P' AND token = $2 AND expires_at > statement_timestamp() \
                RETURNING expires_at\
            ), kept AS (\
                UPDATE {st} AS s SET expires_at = greatest(s.expires_at, \
                    renewed.expires_at + s.retention_ms * interval '1 millisecond') \
                FROM renewed WHERE (s.key, s.step) IN (\
                    SELECT key, step FROM {st} WHERE key = $1 \
                    AND expires_at > statement_timestamp() AND EXISTS (SELECT FROM renewed) \
                    FOR UPDATE SKIP LOCKED\
                )\
            ) \
            SELECT 1 FROM renewed"
        );
        let complete_held = format!(
            "WITH done AS (\
                UPDATE {t} SET expires_at = statement_timestamp() + $5::int8 * interval '1 millisecond', \
                    state = 'D', fingerprint = $3, token = NULL, record = $4 \
                WHERE key = $1 AND state = 'P' AND token = $2 \
                RETURNING 1\
            ), freed AS (\
                DELETE FROM {st} WHERE key = $1 AND EXISTS (SELECT FROM done)\
            ) \
            SELECT 1 FROM done"
        );
        // The main query sees the table before the delete: a deleted row is answered by
        // `del`, a kept one (pending, not asked for) by the second branch. The steps go unless
        // a pending claim is kept: its work may still need them.
        let forget = format!(
            "WITH del AS (\
                DELETE FROM {t} WHERE key = $1 AND expires_at > statement_timestamp() \
                AND (state = 'D' OR $2::bool) RETURNING state\
            ), del_steps AS (\
                DELETE FROM {st} WHERE key = $1 AND NOT EXISTS (\
                    SELECT FROM {t} WHERE key = $1 AND expires_at > statement_timestamp() \
                    AND state = 'P' AND NOT $2::bool)\
            ) \
            SELECT state, true AS deleted FROM del \
            UNION ALL SELECT state, false FROM {t} \
            WHERE key = $1 AND expires_at > statement_timestamp() AND NOT EXISTS (SELECT FROM del)"
        );
        // A live step is answered as it is. Otherwise the step is inserted, or an expired one
        // taken over, with its retention. It expires its retention after the end of the lease
        // of a pending claim on the key, else after now: a crash's retry comes after the lease.
        // The key's other live steps are kept at least as long. A step another statement
        // recorded after this one's snapshot makes the insert do nothing: no row, and the
        // caller asks again. The move skips steps another transaction holds, which is
        // recording a step of the key and sets its own expiry: waiting for it could wait on the
        // caller's own open transaction.
        // A completed key keeps no steps: its record answers every repeat, so a step recorded
        // after the completion (a late write, an overlapping run) is answered as recorded and
        // not kept.
        let record_step = format!(
            "WITH done AS (\
                SELECT FROM {t} WHERE key = $1 AND state = 'D' \
                AND expires_at > statement_timestamp()\
            ), live AS (\
                SELECT value FROM {st} \
                WHERE key = $1 AND step = $2 AND expires_at > statement_timestamp() \
                AND NOT EXISTS (SELECT FROM done)\
            ), recorded AS (\
                INSERT INTO {st} AS s (expires_at, key, step, value, retention_ms) \
                SELECT greatest(statement_timestamp(), (\
                    SELECT expires_at FROM {t} WHERE key = $1 AND state = 'P' \
                    AND expires_at > statement_timestamp()\
                )) + $4::int8 * interval '1 millisecond', $1, $2, $3, $4 \
                WHERE NOT EXISTS (SELECT FROM live) AND NOT EXISTS (SELECT FROM done) \
                ON CONFLICT (key, step) DO UPDATE SET expires_at = excluded.expires_at, \
                    value = excluded.value, retention_ms = excluded.retention_ms \
                WHERE s.expires_at <= statement_timestamp() \
                RETURNING s.expires_at\
            ), refreshed AS (\
                UPDATE {st} SET expires_at = greatest(expires_at, (SELECT expires_at FROM recorded)) \
                WHERE (key, step) IN (\
                    SELECT key, step FROM {st} WHERE key = $1 AND step <> $2 \
                    AND expires_at > statement_timestamp() AND EXISTS (SELECT FROM recorded) \
                    FOR UPDATE SKIP LOCKED\
                )\
            ) \
            SELECT NULL::bytea AS value FROM recorded UNION ALL SELECT value FROM live \
            UNION ALL SELECT NULL::bytea FROM done"
        );
        let steps = format!(
            "SELECT step, value FROM {st} WHERE key = $1 AND expires_at > statement_timestamp()"
        );
        let inspect = format!(
            "SELECT state, fingerprint, record, \
                floor(extract(epoch FROM expires_at - statement_timestamp()) * 1000)::int8 \
            FROM {t} WHERE key = $1 AND expires_at > statement_timestamp()"
        );
        // Rows a transaction holds (a claim taking over an expired row) are skipped, and the
        // expiry is checked again on the row deleted: a re-claimed row is never purged.
        let purge = format!(
            "DELETE FROM {t} WHERE key IN (\
                SELECT key FROM {t} WHERE expires_at <= statement_timestamp() \
                ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED\
            ) AND expires_at <= statement_timestamp()"
        );
        let purge_steps = format!(
            "DELETE FROM {st} WHERE (key, step) IN (\
                SELECT key, step FROM {st} WHERE expires_at <= statement_timestamp() \
                ORDER BY expires_at LIMIT $1 FOR UPDATE SKIP LOCKED\
            ) AND expires_at <= statement_timestamp()"
        );
        Self {
            table: table.to_owned(),
            claim,
            complete,
            release,
            renew,
            complete_held,
            forget,
            purge,
            record_step,
            steps,
            inspect,
            purge_steps,
            schema: SCHEMA.replace(DEFAULT_TABLE_NAME, t),
            steps_schema: STEPS_SCHEMA.replace(DEFAULT_STEPS_NAME, st),
            steps_retention_column: format!(
                "ALTER TABLE {st} ADD COLUMN IF NOT EXISTS retention_ms int8 NOT NULL DEFAULT 0"
            ),
            quoted,
            steps_quoted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["tower_idempotency", "app.idem", "_t1", &"a".repeat(48)] {
            assert_eq!(check_table(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Idem",
            "1t",
            "a.b.c",
            "a.",
            ".a",
            "t; DROP TABLE x",
            "\"t\"",
            "t-1",
            &"a".repeat(49),
        ] {
            assert_eq!(
                check_table(bad).map_err(|e| e.kind()),
                Err(ConfigErrorKind::InvalidName),
                "{bad}"
            );
        }
    }

    #[test]
    fn the_schema_names_only_the_table_quoted() {
        let s = Statements::new("app.order");
        assert!(s.schema.contains("CREATE TABLE \"app\".\"order\" ("));
        assert!(
            s.schema
                .contains("CREATE INDEX ON \"app\".\"order\" (expires_at)")
        );
        assert!(!s.schema.contains(DEFAULT_TABLE_NAME));
        assert!(
            s.steps_schema
                .contains("CREATE TABLE \"app\".\"order_steps\" (")
        );
        assert!(
            s.steps_schema
                .contains("CREATE INDEX ON \"app\".\"order_steps\" (expires_at)")
        );
        assert!(!s.steps_schema.contains(DEFAULT_TABLE_NAME));
        for statement in [
            &s.claim,
            &s.complete,
            &s.release,
            &s.renew,
            &s.forget,
            &s.purge,
        ] {
            assert!(statement.contains("\"app\".\"order\""), "{statement}");
            assert!(!statement.contains(" app.order"), "{statement}");
        }
        for statement in [&s.forget, &s.record_step, &s.steps, &s.purge_steps] {
            assert!(statement.contains("\"app\".\"order_steps\""), "{statement}");
        }
        assert_eq!(s.table, "app.order");
    }

    #[test]
    fn millis_round_up_and_stay_in_range() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::from_secs(3)), 3000);
        assert_eq!(millis(Duration::MAX), i64::try_from(MAX_MILLIS).unwrap());
    }

    #[test]
    fn prefixes_change_the_key_and_are_required() {
        let key = StoreKey::from_parts([1; 32], [2; 32]);
        let a = key_bytes(&prefix_hash("a").unwrap(), &key);
        let b = key_bytes(&prefix_hash("b").unwrap(), &key);
        assert_ne!(a, b);
        assert_eq!(&a[8..], key.id());
        assert_eq!(
            prefix_hash("").map_err(|e| e.kind()),
            Err(ConfigErrorKind::InvalidName)
        );
    }
}
