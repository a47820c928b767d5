//! The store's statements inside a caller's transaction, for the
//! [transactional door](crate::transactional): a claim whose row the transaction keeps locked
//! until it ends, and the record written under that lock.

use super::error::OpError;
use super::{CLAIM_ATTEMPTS, PostgresStore, sql};
use crate::fingerprint::Fingerprint;
use crate::record::Record;
use crate::scope::StoreKey;
use crate::store::{Claim, StoreError, Token};
use sqlx::postgres::PgConnection;
use std::time::Duration;

/// What a claim inside a transaction found.
#[derive(Debug)]
pub(crate) enum Held {
    /// The claim's answer (claimed: the transaction now holds the row).
    Found(Claim),
    /// Another transaction holds the row past the lock wait, or changed it after this
    /// transaction's snapshot: the key is in flight.
    Contended,
}

impl PostgresStore {
    /// Claims `key` on `conn`, inside its open transaction, waiting at most the store's
    /// `lock_timeout` for a row another transaction holds. The caller's own `lock_timeout` is
    /// put back before this returns, unless the transaction failed (then rolling back to
    /// before the claim puts it back).
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
        let claimed = async {
            // Reads the caller's setting, then sets the wait: the lateral reference to
            // `previous` orders the two.
            let previous: String = sqlx::query_scalar(
                "WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS value) \
                 SELECT previous.value FROM previous CROSS JOIN LATERAL \
                 set_config('lock_timeout', $1 || left(previous.value, 0), true)",
            )
            .bind(&wait)
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
            sqlx::query("SELECT set_config('lock_timeout', $1, true)")
                .bind(previous)
                .execute(&mut *conn)
                .await?;
            Ok::<_, OpError>(found)
        };
        match claimed.await {
            Ok(Some(row)) => Ok(Held::Found(row.into_claim(token)?)),
            Ok(None) => Err(super::error::protocol(
                "claim kept racing concurrent claims",
            )),
            Err(e) if e.is_contended() => Ok(Held::Contended),
            Err(e) => Err(e.into_store("PostgreSQL claim in a transaction")),
        }
    }

    /// Writes the record over the row this transaction's claim holds.
    pub(crate) async fn complete_held(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> Result<(), StoreError> {
        let key = self.row_key(key);
        let record = record.into_bytes();
        let written = sqlx::query(&self.sql.complete_held)
            .bind(&key[..])
            .bind(&token.as_bytes()[..])
            .bind(&fingerprint.as_bytes()[..])
            .bind(&record[..])
            .bind(sql::millis(ttl))
            .execute(&mut *conn)
            .await
            .map_err(|e| OpError::from(e).into_store("PostgreSQL complete in a transaction"))?;
        if written.rows_affected() == 1 {
            Ok(())
        } else {
            Err(super::error::protocol(
                "the claimed row was not found in its own transaction",
            ))
        }
    }
}
