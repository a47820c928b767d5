//! The statements the store sends, and the bytes of a row's key.
//!
//! Each step of the store is a few statements sent as one text query: one exchange with the
//! server. A text query carries no bind parameters, so its values are written into it, each
//! in a form that cannot end the literal: bytes as hex literals (`X'…'`), numbers as decimal
//! digits, the table name checked by [`check_table`] and quoted. Nothing else from outside
//! enters the text.
//!
//! Every statement takes the time from `UTC_TIMESTAMP(6)`: the database's clock, read once per
//! statement, in UTC whatever the session's time zone. Every statement here is accepted by
//! MySQL 8 and MariaDB 10.11 alike: no `RETURNING`, no row alias in `ON DUPLICATE KEY UPDATE`,
//! no `WAIT n`.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::StoreKey;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::time::Duration;

const NAMESPACE_DOMAIN: &[u8] = b"tower-idempotency/mysql-ns/v1";
/// The table name in [`SCHEMA`], replaced by the store's.
const DEFAULT_TABLE_NAME: &str = "`tower_idempotency`";
/// The steps' table in [`STEPS_SCHEMA`], replaced by the store's.
const DEFAULT_STEPS_NAME: &str = "`tower_idempotency_steps`";
/// What names the steps' table after the records' table.
const STEPS_SUFFIX: &str = "_steps";
/// Longest part of a table name: MySQL's identifiers hold 64 characters, and the steps' table
/// adds 6.
const MAX_NAME_PART: usize = 58;
/// Longest lease or retention sent, about 100 years. `DATETIME` reaches the year 9999.
const MAX_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;
/// The database's clock.
const NOW: &str = "UTC_TIMESTAMP(6)";

/// The DDL for the default table, as documented.
pub(super) const SCHEMA: &str = include_str!("schema.sql");
/// The DDL for the default table's steps, as documented.
pub(super) const STEPS_SCHEMA: &str = include_str!("steps.sql");

/// A claim's answer: the key was taken by this claim.
pub(super) const CLAIMED: i64 = 0;
/// A claim's answer: a live pending row holds the key.
pub(super) const PENDING: i64 = 1;
/// A claim's answer: a live done row holds the key.
pub(super) const DONE: i64 = 2;

/// A row's key: 8 bytes of the store prefix's hash, then the 32-byte [`StoreKey::id`].
pub(crate) type KeyBytes = [u8; 40];

/// The first 8 bytes of the store prefix's domain-separated SHA-256.
pub(super) fn prefix_hash(prefix: &str) -> Result<[u8; 8], ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the MySQL store's prefix must not be empty",
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
    i64::try_from(ms.clamp(1, MAX_MILLIS)).unwrap_or(i64::MAX)
}

/// InnoDB's longest lock wait, in seconds.
const MAX_LOCK_WAIT: u64 = 1_073_741_824;

/// A duration as whole seconds, rounded up, at least 1 and at most InnoDB's longest lock wait:
/// InnoDB's lock wait is in seconds.
pub(crate) fn seconds(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000_000))
        .unwrap_or(u64::MAX)
        .clamp(1, MAX_LOCK_WAIT)
}

/// Checks a table name: `name` or `database.name`, each part a lowercase identifier.
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
        (Some(db), Some(name), None) => part_ok(db) && part_ok(name),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the MySQL store's table must be a lowercase identifier, optionally database-qualified",
        ))
    }
}

/// A checked table name with each part quoted, as `` `app`.`order` ``. The parts hold no `` ` ``.
fn quote(table: &str) -> String {
    table
        .split('.')
        .map(|part| format!("`{part}`"))
        .collect::<Vec<_>>()
        .join(".")
}

/// `bytes` as an SQL hex literal, `X'…'`: any bytes, and nothing that can end it early.
pub(super) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2 + 3);
    out.push_str("X'");
    out.push_str(&crate::hex::encode(bytes));
    out.push('\'');
    out
}

/// Sets the record a [`Statements::complete`] without one reads: a prepared statement, whose
/// bound parameter carries the record's bytes as they are, where a hex literal doubles them.
pub(super) const SET_RECORD: &str = "SET @ti_record = ?";

/// The bytes a statement of `record_len` record bytes takes beside them when it is sent as
/// the text of a complete: `SET @ti_record = X'…';` and the hex digits.
pub(super) fn hex_len(record_len: usize) -> usize {
    "SET @ti_record = X'';".len() + record_len.saturating_mul(2)
}

/// A statement to send. Its only text from outside is the table name, checked and quoted, and
/// values written by [`hex`] or as numbers.
pub(crate) fn statement(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

/// The store's statements for one table (checked by [`check_table`]).
#[derive(Debug)]
pub(crate) struct Statements {
    pub(super) table: String,
    /// The table as the statements name it: each part quoted.
    pub(super) t: String,
    /// The steps' table as the statements name it.
    pub(super) st: String,
    /// The DDL of [`SCHEMA`] for this table.
    pub(super) schema: String,
    /// The DDL of [`STEPS_SCHEMA`] for this table's steps.
    pub(super) steps_schema: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        let t = quote(table);
        let st = quote(&format!("{table}{STEPS_SUFFIX}"));
        Self {
            table: table.to_owned(),
            schema: SCHEMA.replace(DEFAULT_TABLE_NAME, &t),
            steps_schema: STEPS_SCHEMA.replace(DEFAULT_STEPS_NAME, &st),
            t,
            st,
        }
    }

    /// Takes the key when no live row holds it, then answers one row `(state, fingerprint,
    /// record)`: [`CLAIMED`] with no fingerprint when this claim holds it. No row when the row
    /// it met was released meanwhile: ask again.
    ///
    /// An expired row is taken over first, then an absent key is inserted (a live row is left
    /// as it is: `ON DUPLICATE KEY UPDATE` of nothing). Each statement commits on its own, and
    /// InnoDB's row lock makes two claims of one key meet: one takes it, the other finds it.
    pub(super) fn claim(&self, key: &KeyBytes, fp: &[u8], token: &[u8], lease_ms: i64) -> String {
        let (t, k, f, tk) = (&self.t, hex(key), hex(fp), hex(token));
        let lease = lease_ms.saturating_mul(1000);
        format!(
            "UPDATE {t} SET state = 'P', fingerprint = {f}, token = {tk}, record = NULL, \
                expires_at = {NOW} + INTERVAL {lease} MICROSECOND \
             WHERE `key` = {k} AND expires_at <= {NOW};\
             INSERT INTO {t} (`key`, expires_at, state, fingerprint, token) \
             VALUES ({k}, {NOW} + INTERVAL {lease} MICROSECOND, 'P', {f}, {tk}) \
             ON DUPLICATE KEY UPDATE `key` = `key`;\
             SELECT CAST(IF(state = 'P' AND token = {tk}, {CLAIMED}, IF(state = 'P', {PENDING}, {DONE})) AS SIGNED), \
                fingerprint, record FROM {t} \
             WHERE `key` = {k} AND (expires_at > {NOW} OR (state = 'P' AND token = {tk}))"
        )
    }

    /// Inside the caller's transaction: inserts the key, or locks the row that holds it,
    /// waiting for a transaction that holds it; takes it over if it expired; then answers as
    /// [`claim`](Self::claim), under the lock. The row stays locked until the transaction ends.
    pub(crate) fn claim_held(
        &self,
        key: &KeyBytes,
        fp: &[u8],
        token: &[u8],
        lease_ms: i64,
    ) -> String {
        let (t, k, f, tk) = (&self.t, hex(key), hex(fp), hex(token));
        let lease = lease_ms.saturating_mul(1000);
        format!(
            "INSERT INTO {t} (`key`, expires_at, state, fingerprint, token) \
             VALUES ({k}, {NOW} + INTERVAL {lease} MICROSECOND, 'P', {f}, {tk}) \
             ON DUPLICATE KEY UPDATE `key` = `key`;\
             UPDATE {t} SET state = 'P', fingerprint = {f}, token = {tk}, record = NULL, \
                expires_at = {NOW} + INTERVAL {lease} MICROSECOND \
             WHERE `key` = {k} AND expires_at <= {NOW};\
             SELECT CAST(IF(state = 'P' AND token = {tk}, {CLAIMED}, IF(state = 'P', {PENDING}, {DONE})) AS SIGNED), \
                fingerprint, record FROM {t} WHERE `key` = {k} FOR UPDATE"
        )
    }

    /// Writes the record where the row has expired, is pending under `token`, or is absent; and
    /// when written, deletes the key's steps. Answers one row: 1 when written, else 0.
    ///
    /// A written row carries `writer`, 16 bytes of this call's own: that is how the answer
    /// tells this write from an earlier one. The record is sent once, in a session variable
    /// both statements read, and cleared after: set by the statement itself from `record`, or,
    /// when `record` is `None`, by [`SET_RECORD`] sent just before on the same connection.
    pub(super) fn complete(
        &self,
        key: &KeyBytes,
        token: &[u8],
        fp: &[u8],
        record: Option<&[u8]>,
        retention_ms: i64,
        writer: &[u8],
    ) -> String {
        let (t, st, k, f, tk, w) = (
            &self.t,
            &self.st,
            hex(key),
            hex(fp),
            hex(token),
            hex(writer),
        );
        let retention = retention_ms.saturating_mul(1000);
        let mut sql = String::with_capacity(record.map_or(0, <[u8]>::len) * 2 + 1024);
        if let Some(record) = record {
            sql.push_str("SET @ti_record = ");
            sql.push_str(&hex(record));
            sql.push(';');
        }
        let _ = write!(
            sql,
            "UPDATE {t} SET state = 'D', fingerprint = {f}, token = {w}, record = @ti_record, \
                expires_at = {NOW} + INTERVAL {retention} MICROSECOND \
             WHERE `key` = {k} AND (expires_at <= {NOW} OR (state = 'P' AND token = {tk}));\
             INSERT INTO {t} (`key`, expires_at, state, fingerprint, token, record) \
             VALUES ({k}, {NOW} + INTERVAL {retention} MICROSECOND, 'D', {f}, {w}, @ti_record) \
             ON DUPLICATE KEY UPDATE `key` = `key`;\
             SET @ti_record = NULL;\
             DELETE FROM {st} WHERE `key` = {k} \
                AND EXISTS (SELECT 1 FROM {t} WHERE `key` = {k} AND token = {w});\
             SELECT CAST(COUNT(*) AS SIGNED) FROM {t} WHERE `key` = {k} AND token = {w}"
        );
        sql
    }

    /// Inside the claimant's transaction, which holds the row: writes the record over it and
    /// deletes the key's steps. Bind parameters: key, token, fingerprint, record, retention (µs),
    /// writer; the steps' delete takes the key.
    pub(crate) fn complete_held(&self) -> (String, String) {
        let (t, st) = (&self.t, &self.st);
        (
            format!(
                "UPDATE {t} SET state = 'D', fingerprint = ?, token = ?, record = ?, \
                    expires_at = {NOW} + INTERVAL ? MICROSECOND \
                 WHERE `key` = ? AND state = 'P' AND token = ?"
            ),
            format!("DELETE FROM {st} WHERE `key` = ?"),
        )
    }

    /// Deletes the row where it is pending under `token` and live. Bind parameters: key, token.
    pub(super) fn release(&self) -> String {
        let t = &self.t;
        format!(
            "DELETE FROM {t} WHERE `key` = ? AND state = 'P' AND token = ? AND expires_at > {NOW}"
        )
    }

    /// Extends the lease where the row is pending under `token` and live, and keeps the key's
    /// live steps their retention past the new end. Answers one row: 1 when extended, else 0.
    pub(super) fn renew(&self, key: &KeyBytes, token: &[u8], lease_ms: i64) -> String {
        let (t, st, k, tk) = (&self.t, &self.st, hex(key), hex(token));
        let lease = lease_ms.saturating_mul(1000);
        format!(
            "UPDATE {t} SET expires_at = {NOW} + INTERVAL {lease} MICROSECOND \
             WHERE `key` = {k} AND state = 'P' AND token = {tk} AND expires_at > {NOW};\
             UPDATE {st} AS s JOIN {t} AS r ON r.`key` = s.`key` \
             SET s.expires_at = GREATEST(s.expires_at, \
                r.expires_at + INTERVAL s.retention_ms * 1000 MICROSECOND) \
             WHERE s.`key` = {k} AND s.expires_at > {NOW} \
                AND r.`key` = {k} AND r.state = 'P' AND r.token = {tk} AND r.expires_at > {NOW};\
             SELECT CAST(COUNT(*) AS SIGNED) FROM {t} \
             WHERE `key` = {k} AND state = 'P' AND token = {tk} AND expires_at > {NOW}"
        )
    }

    /// Deletes the live row, done or (when `pending`) pending, and the key's steps unless a
    /// pending row is kept. Answers one row `(state, deleted)`: state 0 when nothing live held
    /// the key, [`PENDING`] or [`DONE`].
    pub(super) fn forget(&self, key: &KeyBytes, pending: bool) -> String {
        let (t, st, k) = (&self.t, &self.st, hex(key));
        let pending = u8::from(pending);
        format!(
            "SET @ti_state = (SELECT IF(state = 'D', {DONE}, {PENDING}) FROM {t} \
                WHERE `key` = {k} AND expires_at > {NOW});\
             DELETE FROM {t} WHERE `key` = {k} AND expires_at > {NOW} \
                AND (state = 'D' OR {pending} = 1);\
             SET @ti_deleted = ROW_COUNT();\
             DELETE FROM {st} WHERE `key` = {k} AND NOT EXISTS (\
                SELECT 1 FROM {t} WHERE `key` = {k} AND state = 'P' AND expires_at > {NOW});\
             SELECT CAST(COALESCE(@ti_state, 0) AS SIGNED), CAST(@ti_deleted AS SIGNED)"
        )
    }

    /// Records a step: a live step is answered as it is; otherwise the step is inserted, or an
    /// expired one taken over, expiring its retention after the end of the lease of a pending
    /// claim on the key, else after now; the key's other live steps are kept at least as long.
    /// A completed key keeps no steps: a step recorded after it is answered as recorded.
    ///
    /// Answers one row `(done, mine)`, then, unless done, one row `(value)` of the live step,
    /// read with a lock so that it is the latest committed even inside a transaction. `mine` is
    /// 1 when this statement wrote it (its `writer` bytes), 0 when another record was first.
    pub(crate) fn record_step(
        &self,
        key: &KeyBytes,
        step: &[u8],
        value: &[u8],
        retention_ms: i64,
        writer: &[u8],
    ) -> String {
        let (t, st, k, s, w) = (&self.t, &self.st, hex(key), hex(step), hex(writer));
        let retention = retention_ms.saturating_mul(1000);
        let mut sql = String::with_capacity(value.len() * 2 + 2048);
        sql.push_str("SET @ti_value = ");
        sql.push_str(&hex(value));
        let _ = write!(
            sql,
            ", @ti_done = (SELECT COUNT(*) FROM {t} WHERE `key` = {k} AND state = 'D' \
                AND expires_at > {NOW}), \
             @ti_expires = GREATEST({NOW}, COALESCE((SELECT expires_at FROM {t} WHERE `key` = {k} \
                AND state = 'P' AND expires_at > {NOW}), {NOW})) + INTERVAL {retention} MICROSECOND;\
             UPDATE {st} SET value = @ti_value, retention_ms = {retention_ms}, writer = {w}, \
                expires_at = @ti_expires \
             WHERE `key` = {k} AND step = {s} AND expires_at <= {NOW} AND @ti_done = 0;\
             INSERT INTO {st} (`key`, step, expires_at, value, retention_ms, writer) \
             SELECT {k}, {s}, @ti_expires, @ti_value, {retention_ms}, {w} FROM DUAL WHERE @ti_done = 0 \
             ON DUPLICATE KEY UPDATE `key` = `key`;\
             SET @ti_value = NULL, @ti_mine = (SELECT COUNT(*) FROM {st} WHERE `key` = {k} \
                AND step = {s} AND writer = {w});\
             UPDATE {st} SET expires_at = GREATEST(expires_at, @ti_expires) \
             WHERE `key` = {k} AND step <> {s} AND expires_at > {NOW} AND @ti_mine = 1;\
             SELECT CAST(@ti_done AS SIGNED), CAST(@ti_mine AS SIGNED);\
             SELECT value FROM {st} WHERE `key` = {k} AND step = {s} AND expires_at > {NOW} \
                AND @ti_done = 0 LOCK IN SHARE MODE"
        );
        sql
    }

    /// The key's live steps `(step, value)`. Bind parameter: key.
    pub(super) fn steps(&self) -> String {
        let st = &self.st;
        format!("SELECT step, value FROM {st} WHERE `key` = ? AND expires_at > {NOW}")
    }

    /// The key's live row `(state, fingerprint, record, microseconds left)`, if any, as a
    /// claim answers it: [`PENDING`] or [`DONE`]. Bind parameter: key.
    pub(super) fn inspect(&self) -> String {
        let t = &self.t;
        format!(
            "SELECT CAST(IF(state = 'P', {PENDING}, {DONE}) AS SIGNED), fingerprint, record, \
                CAST(TIMESTAMPDIFF(MICROSECOND, {NOW}, expires_at) AS SIGNED) \
             FROM {t} WHERE `key` = ? AND expires_at > {NOW}"
        )
    }

    /// Locks up to `?` expired rows, skipping rows another transaction holds.
    pub(super) fn purge_select(&self) -> String {
        let t = &self.t;
        format!(
            "SELECT `key` FROM {t} WHERE expires_at <= {NOW} \
             ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
        )
    }

    /// Deletes the rows of `keys` that are still expired.
    pub(super) fn purge_delete(&self, keys: &[Vec<u8>]) -> String {
        let t = &self.t;
        let list = keys.iter().map(|k| hex(k)).collect::<Vec<_>>().join(",");
        format!("DELETE FROM {t} WHERE `key` IN ({list}) AND expires_at <= {NOW}")
    }

    /// Locks up to `?` expired steps, skipping steps another transaction holds.
    pub(super) fn purge_steps_select(&self) -> String {
        let st = &self.st;
        format!(
            "SELECT `key`, step FROM {st} WHERE expires_at <= {NOW} \
             ORDER BY expires_at LIMIT ? FOR UPDATE SKIP LOCKED"
        )
    }

    /// Deletes the steps of `steps` that are still expired.
    pub(super) fn purge_steps_delete(&self, steps: &[(Vec<u8>, Vec<u8>)]) -> String {
        let st = &self.st;
        let list = steps
            .iter()
            .map(|(k, s)| format!("({},{})", hex(k), hex(s)))
            .collect::<Vec<_>>()
            .join(",");
        format!("DELETE FROM {st} WHERE (`key`, step) IN ({list}) AND expires_at <= {NOW}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["tower_idempotency", "app.idem", "_t1", &"a".repeat(58)] {
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
            "`t`",
            "t-1",
            &"a".repeat(59),
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
        assert!(
            s.schema
                .contains("CREATE TABLE IF NOT EXISTS `app`.`order` (")
        );
        assert!(
            s.steps_schema
                .contains("CREATE TABLE IF NOT EXISTS `app`.`order_steps` (")
        );
        assert!(!s.schema.contains("tower_idempotency`"));
        assert!(!s.steps_schema.contains("tower_idempotency_steps`"));
        let key = [7u8; 40];
        for statement in [
            s.claim(&key, &[1; 32], &[2; 16], 5),
            s.complete(&key, &[2; 16], &[1; 32], Some(b"r"), 5, &[3; 16]),
            s.renew(&key, &[2; 16], 5),
            s.forget(&key, true),
            s.release(),
        ] {
            assert!(statement.contains("`app`.`order`"), "{statement}");
            assert!(!statement.contains(" app.order"), "{statement}");
        }
    }

    #[test]
    fn values_are_hex_literals_that_cannot_end_early() {
        assert_eq!(hex(b"'\\\0x"), "X'275c0078'");
        assert_eq!(hex(b""), "X''");
    }

    #[test]
    fn millis_round_up_and_stay_in_range() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::MAX), i64::try_from(MAX_MILLIS).unwrap());
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(1001)), 2);
        assert_eq!(seconds(Duration::MAX), MAX_LOCK_WAIT);
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
