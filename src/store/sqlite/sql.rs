//! The statements the store sends, written once per table when the store is built, and the
//! bytes of a row's key.
//!
//! Every statement takes the time as a parameter, `?2` or the last one: the store's clock,
//! read once per operation. SQLite has no server whose clock every process shares.

use crate::error::{ConfigError, ConfigErrorKind};
use crate::store::StoreKey;
use sha2::{Digest, Sha256};
use std::time::Duration;

const NAMESPACE_DOMAIN: &[u8] = b"tower-idempotency/sqlite-ns/v1";
/// The table name in [`SCHEMA`], replaced by the store's.
const DEFAULT_TABLE_NAME: &str = "tower_idempotency";
/// The steps' table in [`STEPS_SCHEMA`], replaced by the store's.
const DEFAULT_STEPS_NAME: &str = "tower_idempotency_steps";
/// What names the steps' table after the records' table.
const STEPS_SUFFIX: &str = "_steps";
/// Longest table name.
const MAX_NAME: usize = 48;
/// Longest lease or retention, about 100 years: far from any overflow of SQLite's integers.
const MAX_MILLIS: u64 = 100 * 365 * 24 * 60 * 60 * 1000;

/// The DDL for the default table, as documented.
pub(super) const SCHEMA: &str = include_str!("schema.sql");
/// The DDL for the default table's steps, as documented.
pub(super) const STEPS_SCHEMA: &str = include_str!("steps.sql");

/// A row's key: 8 bytes of the store prefix's hash, then the 32-byte [`StoreKey::id`].
pub(crate) type KeyBytes = [u8; 40];

/// The first 8 bytes of the store prefix's domain-separated SHA-256.
pub(super) fn prefix_hash(prefix: &str) -> Result<[u8; 8], ConfigError> {
    if prefix.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the SQLite store's prefix must not be empty",
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

/// A time on the store's clock as milliseconds, the unit of `expires_at`.
pub(crate) fn at(now: Duration) -> i64 {
    i64::try_from(now.as_millis()).unwrap_or(i64::MAX)
}

/// Checks a table name: a lowercase identifier, at most 48 bytes.
pub(super) fn check_table(table: &str) -> Result<(), ConfigError> {
    let mut bytes = table.bytes();
    let ok = table.len() <= MAX_NAME
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(
            ConfigErrorKind::InvalidName,
            "the SQLite store's table must be a lowercase identifier of at most 48 bytes",
        ))
    }
}

/// A statement of [`Statements`], to send. Its only text from outside is the table name, checked
/// by [`check_table`] and quoted; every value goes as a bind parameter.
pub(crate) fn statement(sql: &str) -> sqlx::AssertSqlSafe<&str> {
    sqlx::AssertSqlSafe(sql)
}

/// The store's statements for one table (checked by [`check_table`]). `now` is the store's
/// clock in ms.
#[derive(Debug)]
pub(crate) struct Statements {
    pub(super) table: String,
    /// `?1` key, `?2` now → the live row `(state, fingerprint, record)`, if any.
    pub(crate) live: String,
    /// `?1` key, `?2` now → the live row `(state, fingerprint, record, ms left)`, if any.
    pub(super) inspect: String,
    /// `?1` key, `?2` now, `?3` fingerprint, `?4` token, `?5` lease (ms): takes the key, where
    /// the row is absent or expired (the caller holds the write lock and found no live row).
    pub(crate) take: String,
    /// `?1` key, `?2` now, `?3` token, `?4` fingerprint, `?5` record, `?6` retention (ms) →
    /// one row changed when written: the row had expired or is pending under the token.
    pub(super) complete: String,
    /// `?1` key, `?2` now, `?3` token, `?4` fingerprint, `?5` record, `?6` retention (ms):
    /// inside the claimant's transaction, which holds the row.
    pub(crate) complete_held: String,
    /// `?1` key → the key's steps deleted.
    pub(crate) free_steps: String,
    /// `?1` key, `?2` now, `?3` token → one row deleted, or none.
    pub(super) release: String,
    /// `?1` key, `?2` now, `?3` token, `?4` lease (ms) → one row extended, or none.
    pub(super) renew: String,
    /// `?1` key, `?2` now, `?3` the new lease's end: the key's live steps kept at least
    /// their retention past it.
    pub(super) keep_steps: String,
    /// `?1` key, `?2` now → the live row's state.
    pub(super) state: String,
    /// `?1` key → the row deleted.
    pub(super) delete: String,
    /// `?1` key, `?2` now → the pending row's lease end, if live.
    pub(crate) lease_end: String,
    /// `?1` key, `?2` now → whether a live done row holds the key.
    pub(crate) done: String,
    /// `?1` key, `?2` step, `?3` now → the live step's value.
    pub(crate) live_step: String,
    /// `?1` key, `?2` step, `?3` expiry, `?4` value, `?5` retention (ms): the step, recorded
    /// over an expired one.
    pub(crate) put_step: String,
    /// `?1` key, `?2` step, `?3` now, `?4` expiry: the key's other live steps kept at least
    /// as long.
    pub(crate) refresh_steps: String,
    /// `?1` key, `?2` now → rows `(step, value)` of the key's live steps.
    pub(super) steps: String,
    /// `?1` now, `?2` batch size → the expired rows deleted.
    pub(super) purge: String,
    /// `?1` now, `?2` batch size → the expired steps deleted.
    pub(super) purge_steps: String,
    /// The DDL of [`SCHEMA`] for this table.
    pub(super) schema: String,
    /// The DDL of [`STEPS_SCHEMA`] for this table's steps.
    pub(super) steps_schema: String,
}

impl Statements {
    pub(super) fn new(table: &str) -> Self {
        let t = &format!("\"{table}\"");
        let steps_name = format!("{table}{STEPS_SUFFIX}");
        let st = &format!("\"{steps_name}\"");
        Self {
            table: table.to_owned(),
            live: format!(
                "SELECT state, fingerprint, record FROM {t} WHERE key = ?1 AND expires_at > ?2"
            ),
            inspect: format!(
                "SELECT state, fingerprint, record, expires_at - ?2 FROM {t} \
                 WHERE key = ?1 AND expires_at > ?2"
            ),
            take: format!(
                "INSERT INTO {t} (key, expires_at, state, fingerprint, token, record) \
                 VALUES (?1, ?2 + ?5, 'P', ?3, ?4, NULL) \
                 ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'P', \
                     fingerprint = excluded.fingerprint, token = excluded.token, record = NULL \
                 WHERE {t}.expires_at <= ?2"
            ),
            complete: format!(
                "INSERT INTO {t} (key, expires_at, state, fingerprint, token, record) \
                 VALUES (?1, ?2 + ?6, 'D', ?4, NULL, ?5) \
                 ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'D', \
                     fingerprint = excluded.fingerprint, token = NULL, record = excluded.record \
                 WHERE {t}.expires_at <= ?2 OR ({t}.state = 'P' AND {t}.token = ?3)"
            ),
            complete_held: format!(
                "UPDATE {t} SET expires_at = ?2 + ?6, state = 'D', fingerprint = ?4, \
                     token = NULL, record = ?5 \
                 WHERE key = ?1 AND state = 'P' AND token = ?3"
            ),
            free_steps: format!("DELETE FROM {st} WHERE key = ?1"),
            release: format!(
                "DELETE FROM {t} WHERE key = ?1 AND state = 'P' AND token = ?3 AND expires_at > ?2"
            ),
            renew: format!(
                "UPDATE {t} SET expires_at = ?2 + ?4 \
                 WHERE key = ?1 AND state = 'P' AND token = ?3 AND expires_at > ?2"
            ),
            keep_steps: format!(
                "UPDATE {st} SET expires_at = max(expires_at, ?3 + retention_ms) \
                 WHERE key = ?1 AND expires_at > ?2"
            ),
            state: format!("SELECT state FROM {t} WHERE key = ?1 AND expires_at > ?2"),
            delete: format!("DELETE FROM {t} WHERE key = ?1"),
            lease_end: format!(
                "SELECT expires_at FROM {t} WHERE key = ?1 AND state = 'P' AND expires_at > ?2"
            ),
            done: format!("SELECT 1 FROM {t} WHERE key = ?1 AND state = 'D' AND expires_at > ?2"),
            live_step: format!(
                "SELECT value FROM {st} WHERE key = ?1 AND step = ?2 AND expires_at > ?3"
            ),
            put_step: format!(
                "INSERT INTO {st} (key, step, expires_at, value, retention_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) \
                 ON CONFLICT (key, step) DO UPDATE SET expires_at = excluded.expires_at, \
                     value = excluded.value, retention_ms = excluded.retention_ms"
            ),
            refresh_steps: format!(
                "UPDATE {st} SET expires_at = max(expires_at, ?4) \
                 WHERE key = ?1 AND step <> ?2 AND expires_at > ?3"
            ),
            steps: format!("SELECT step, value FROM {st} WHERE key = ?1 AND expires_at > ?2"),
            // One statement: the rows it picks are still expired when it deletes them, since
            // no other write runs between (SQLite has one writer at a time).
            purge: format!(
                "DELETE FROM {t} WHERE key IN (\
                     SELECT key FROM {t} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)"
            ),
            purge_steps: format!(
                "DELETE FROM {st} WHERE (key, step) IN (\
                     SELECT key, step FROM {st} WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2)"
            ),
            schema: SCHEMA.replace(DEFAULT_TABLE_NAME, table),
            steps_schema: STEPS_SCHEMA.replace(DEFAULT_STEPS_NAME, &steps_name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_plain_identifiers() {
        for ok in ["tower_idempotency", "order", "_t1", &"a".repeat(48)] {
            assert_eq!(check_table(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Idem",
            "1t",
            "main.t",
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
        let s = Statements::new("order");
        assert!(s.schema.contains("CREATE TABLE IF NOT EXISTS \"order\" ("));
        assert!(
            s.schema
                .contains("\"order_expires_at\" ON \"order\" (expires_at)")
        );
        assert!(!s.schema.contains(DEFAULT_TABLE_NAME));
        assert!(
            s.steps_schema
                .contains("CREATE TABLE IF NOT EXISTS \"order_steps\" (")
        );
        assert!(!s.steps_schema.contains(DEFAULT_TABLE_NAME));
        for statement in [
            &s.live,
            &s.take,
            &s.complete,
            &s.release,
            &s.renew,
            &s.purge,
        ] {
            assert!(statement.contains("\"order\""), "{statement}");
        }
        for statement in [&s.free_steps, &s.put_step, &s.steps, &s.purge_steps] {
            assert!(statement.contains("\"order_steps\""), "{statement}");
        }
    }

    #[test]
    fn millis_round_up_and_stay_in_range() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_micros(1500)), 2);
        assert_eq!(millis(Duration::MAX), i64::try_from(MAX_MILLIS).unwrap());
        assert_eq!(at(Duration::MAX), i64::MAX);
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
