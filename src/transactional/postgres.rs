//! The door's half in PostgreSQL: the store's statements inside the caller's transaction. A
//! claim's row stays locked by the transaction until it ends. The record is written under that
//! lock. The store's own statements, outside any caller's transaction, stay in the store.

use crate::store::postgres::sql::{self, STORE_TIMEOUT_SETTING};
use crate::store::postgres::{CLAIM_ATTEMPTS, OpError, PostgresStore, protocol};
use crate::store::{Claim, Fingerprint, Record, StoreError, StoreKey, Token};
use sqlx::postgres::PgConnection;
use std::time::Duration;

/// What a claim inside a transaction found.
#[derive(Debug)]
pub(crate) enum Held {
    /// The claim's answer, and the store's `statement_timeout` lifted for the work, if it was.
    /// When claimed, the transaction now holds the row.
    Found(Claim, Lifted),
    /// Another transaction holds the row past the lock wait: the key is in flight.
    Contended,
    /// PostgreSQL rolled the claim back for a concurrent transaction. It was a serialization
    /// failure, as the row changed after this transaction's snapshot, or a deadlock. Another
    /// transaction holds or held the key. A new transaction sees what it did.
    Conflict,
}

/// The `statement_timeout` of a connection of the store's own pool. It is lifted inside
/// `within`'s transaction, so that it does not cut the work. [`PostgresStore::restore`] puts it
/// back where the transaction goes on after `within`, as a savepoint in the caller's
/// transaction does.
#[derive(Debug)]
pub(crate) struct Lifted(Option<String>);

impl PostgresStore {
    /// Claims `key` on `conn`, inside its open transaction. It waits at most the store's
    /// `lock_timeout` for a row another transaction holds.
    ///
    /// The claim runs under the store's own timeouts: `lock_timeout`, and a `statement_timeout`
    /// above it, so the lock wait answers first. The caller's settings are put back before this
    /// returns. If the transaction failed, rolling back to before the claim puts them back. On a
    /// connection of its own pool, the store's own `statement_timeout` is lifted instead, for the
    /// work.
    pub(crate) async fn claim_held(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Held, StoreError> {
        let token = Token::generate()?;
        let key = self.row_key(key);
        let lease = sql::millis(lease);
        let wait = format!("{}ms", sql::millis(self.lock_timeout));
        let bound = format!(
            "{}ms",
            sql::millis(self.lock_timeout.saturating_add(self.timeout))
        );
        let claimed = async {
            // Reads the caller's settings, then sets the store's: the lateral references to
            // `previous` order the two. The statement's only text from outside is a constant.
            let (lock_wait, statement, stores): (String, String, bool) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lock_wait, \
                     current_setting('statement_timeout') AS statement, \
                     coalesce((SELECT setting FROM pg_settings WHERE name = 'statement_timeout') \
                         = current_setting('{STORE_TIMEOUT_SETTING}', true), false) AS stores) \
                 SELECT previous.lock_wait, previous.statement, previous.stores FROM previous \
                 CROSS JOIN LATERAL set_config('lock_timeout', $1 || left(previous.lock_wait, 0), true) \
                 CROSS JOIN LATERAL set_config('statement_timeout', $2 || left(previous.statement, 0), true) AS s"
            )))
            .bind(&wait)
            .bind(&bound)
            .fetch_one(&mut *conn)
            .await?;
            let mut found = None;
            for _ in 0..CLAIM_ATTEMPTS {
                found = self
                    .claim_once(&mut *conn, &key, fingerprint, &token, lease)
                    .await?;
                if found.is_some() {
                    break;
                }
            }
            // The store's own bound is not the work's: the work runs without it.
            let for_work = if stores { "0" } else { statement.as_str() };
            sqlx::query(
                "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
            )
            .bind(lock_wait)
            .bind(for_work)
            .execute(&mut *conn)
            .await?;
            Ok::<_, OpError>((found, Lifted(stores.then_some(statement))))
        };
        match claimed.await {
            Ok((Some(row), lifted)) => Ok(Held::Found(row.into_claim(token)?, lifted)),
            Ok((None, _)) => Err(protocol("claim kept racing concurrent claims")),
            Err(e) if e.is_lock_wait() => Ok(Held::Contended),
            Err(e) if e.is_conflict() => Ok(Held::Conflict),
            Err(e) => Err(e.into_store("PostgreSQL claim in a transaction")),
        }
    }

    /// Lifts the store's own `statement_timeout` for the rest of the transaction on `conn`, so
    /// that it does not cut the work of a step. A connection not of the store's pool keeps its
    /// settings.
    pub(crate) async fn lift(&self, conn: &mut PgConnection) -> Result<Lifted, OpError> {
        // The lateral reference reads the setting before it is changed. The statement's only
        // text from outside is a constant.
        let previous: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH previous AS MATERIALIZED (SELECT current_setting('statement_timeout') AS statement \
                 WHERE (SELECT setting FROM pg_settings WHERE name = 'statement_timeout') \
                     = current_setting('{STORE_TIMEOUT_SETTING}', true)) \
             SELECT previous.statement FROM previous \
             CROSS JOIN LATERAL set_config('statement_timeout', '0' || left(previous.statement, 0), true) AS s"
        )))
        .fetch_optional(&mut *conn)
        .await?;
        Ok(Lifted(previous))
    }

    /// Puts back the store's `statement_timeout` that [`claim_held`](Self::claim_held) or
    /// [`lift`](Self::lift) lifted, for the rest of the caller's transaction.
    pub(crate) async fn restore(
        &self,
        conn: &mut PgConnection,
        lifted: Lifted,
    ) -> Result<(), OpError> {
        if let Lifted(Some(statement)) = lifted {
            sqlx::query("SELECT set_config('statement_timeout', $1, true)")
                .bind(statement)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Writes the record over the row this transaction's claim holds, and deletes the key's
    /// steps. Returns `false` when the row was not found, which cannot be, under the
    /// transaction's own lock.
    pub(crate) async fn complete_held(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, OpError> {
        let key = self.row_key(key);
        let record = record.into_bytes();
        let written = sqlx::query(sql::statement(&self.sql.complete_held))
            .bind(&key[..])
            .bind(&token.as_bytes()[..])
            .bind(&fingerprint.as_bytes()[..])
            .bind(&record[..])
            .bind(sql::millis(retention))
            .fetch_optional(&mut *conn)
            .await?;
        Ok(written.is_some())
    }
}
