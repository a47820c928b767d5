//! Creating the tables, and purging expired rows.

use super::error::OpError;
use super::{MySqlStore, PURGE_BATCH, Repeat, sql};
use crate::store::StoreError;
use sqlx::Connection;

impl MySqlStore {
    /// Creates the table and the steps' table beside it when they do not exist
    /// (`CREATE TABLE IF NOT EXISTS`). The DDL is in the
    /// [module docs](crate::store::mysql#the-table). An existing table is left as it is.
    ///
    /// Safe to call from every replica at start-up: MySQL serializes the creation of one table,
    /// and the second `CREATE TABLE IF NOT EXISTS` finds it. It is not bounded by the store's
    /// operation timeout.
    ///
    /// # Errors
    /// The database's error. A missing privilege is `Unavailable`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let run = async {
            let mut conn = self.pool.acquire().await?;
            for ddl in [&self.sql.schema, &self.sql.steps_schema] {
                sqlx::raw_sql(sql::statement(ddl.clone()))
                    .execute(&mut *conn)
                    .await?;
            }
            Ok::<_, OpError>(())
        };
        run.await.map_err(|e| e.into_store("MySQL migrate"))
    }

    /// Deletes the rows whose lease or retention has ended, in batches of at most 1000 rows,
    /// until none is left. Then the same for expired steps. Returns how many rows it deleted,
    /// steps included.
    ///
    /// Each batch is one transaction of two exchanges: it locks expired rows with
    /// `FOR UPDATE SKIP LOCKED`, skipping rows a transaction holds (a claim taking one over,
    /// a concurrent purge), then deletes those that are still expired. Each batch is bounded
    /// by the store's operation timeout.
    ///
    /// # Errors
    /// The database's error. The batches before it stay deleted.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        let records = self.purge_records().await?;
        let steps = self.purge_steps().await?;
        if records + steps > 0 {
            tracing::debug!(table = %self.sql.table, records, steps, "purged expired idempotency records and steps");
        }
        Ok(records + steps)
    }

    async fn purge_records(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let (locked, deleted) = self
                .bounded("MySQL purge", Repeat::Safe, |_| async {
                    let mut conn = self.pool.acquire().await?;
                    // Read committed: no gap locks on the expiry index, only the rows found.
                    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *conn)
                        .await?;
                    let mut tx = conn.begin().await?;
                    let keys: Vec<Vec<u8>> =
                        sqlx::query_scalar(sql::statement(self.sql.purge_select()))
                            .bind(PURGE_BATCH)
                            .fetch_all(&mut *tx)
                            .await?;
                    if keys.is_empty() {
                        return Ok((0, 0));
                    }
                    let deleted = sqlx::raw_sql(sql::statement(self.sql.purge_delete(&keys)))
                        .execute(&mut *tx)
                        .await?
                        .rows_affected();
                    tx.commit().await?;
                    Ok((keys.len(), deleted))
                })
                .await?;
            total += deleted;
            if i64::try_from(locked).unwrap_or(i64::MAX) < PURGE_BATCH {
                return Ok(total);
            }
        }
    }

    async fn purge_steps(&self) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let (locked, deleted) = self
                .bounded("MySQL purge", Repeat::Safe, |_| async {
                    let mut conn = self.pool.acquire().await?;
                    sqlx::raw_sql("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .execute(&mut *conn)
                        .await?;
                    let mut tx = conn.begin().await?;
                    let steps: Vec<(Vec<u8>, Vec<u8>)> =
                        sqlx::query_as(sql::statement(self.sql.purge_steps_select()))
                            .bind(PURGE_BATCH)
                            .fetch_all(&mut *tx)
                            .await?;
                    if steps.is_empty() {
                        return Ok((0, 0));
                    }
                    let deleted =
                        sqlx::raw_sql(sql::statement(self.sql.purge_steps_delete(&steps)))
                            .execute(&mut *tx)
                            .await?
                            .rows_affected();
                    tx.commit().await?;
                    Ok((steps.len(), deleted))
                })
                .await?;
            total += deleted;
            if i64::try_from(locked).unwrap_or(i64::MAX) < PURGE_BATCH {
                return Ok(total);
            }
        }
    }
}
