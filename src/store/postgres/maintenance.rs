//! Creating the tables, and purging expired rows.

use super::error::OpError;
use super::{PURGE_BATCH, PostgresStore, Repeat, sql};
use crate::store::StoreError;
use sqlx::postgres::PgConnection;

/// The advisory lock `migrate` takes, so that replicas starting together create the table
/// once. It is an arbitrary constant: "tower-id" in ASCII.
const MIGRATE_LOCK: i64 = 0x746f_7765_722d_6964;

impl PostgresStore {
    /// Creates the table and its index when the table does not exist, and the same for the
    /// table of steps beside it. The DDL is in the
    /// [module docs](crate::store::postgres#the-table). An existing table is left as it is,
    /// whatever it holds. So a store whose table predates steps gets its steps' table on the
    /// next `migrate`. One change is made to an existing steps' table: one made before the
    /// steps' retention was kept gets its `retention_ms` column
    /// (`ALTER TABLE … ADD COLUMN IF NOT EXISTS retention_ms int8 NOT NULL DEFAULT 0`), once.
    ///
    /// Safe to call from every replica at start-up. It runs in one transaction under an
    /// advisory lock. When the tables exist as they should it takes no lock on them. So it
    /// never queues behind, or in front of, the requests of running replicas. Adding the
    /// column is the exception: it changes no row, but it waits for the steps' table's
    /// running statements and holds up the next ones until it commits. It is not bounded by
    /// the store's operation timeout.
    ///
    /// # Errors
    /// The database's error. A missing privilege is `Unavailable`.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let op = "PostgreSQL migrate";
        let run = async {
            let mut tx = self.pool.begin().await?;
            // The pool's statement timeout is for the store's steps, not for DDL.
            sqlx::query("SET LOCAL statement_timeout = 0")
                .execute(&mut *tx)
                .await?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(MIGRATE_LOCK)
                .execute(&mut *tx)
                .await?;
            let (records, steps): (bool, bool) =
                sqlx::query_as("SELECT to_regclass($1) IS NOT NULL, to_regclass($2) IS NOT NULL")
                    .bind(&self.sql.quoted)
                    .bind(&self.sql.steps_quoted)
                    .fetch_one(&mut *tx)
                    .await?;
            if !records {
                for statement in self.sql.schema.split_terminator(";\n") {
                    sqlx::query(sql::statement(statement))
                        .execute(&mut *tx)
                        .await?;
                }
                tracing::info!(table = %self.sql.table, "created the idempotency table");
            }
            if !steps {
                for statement in self.sql.steps_schema.split_terminator(";\n") {
                    sqlx::query(sql::statement(statement))
                        .execute(&mut *tx)
                        .await?;
                }
                tracing::info!(table = %self.sql.table, "created the idempotency steps table");
            } else if !self.steps_keep_retention(&mut tx).await? {
                // Checked first: `ALTER TABLE` locks the table even when the column exists.
                sqlx::query(sql::statement(&self.sql.steps_retention_column))
                    .execute(&mut *tx)
                    .await?;
                tracing::info!(table = %self.sql.table, "added the steps' retention to the idempotency steps table");
            }
            tx.commit().await?;
            Ok::<_, OpError>(())
        };
        run.await.map_err(|e| e.into_store(op))
    }

    /// Whether the steps' table has the column of the steps' retention.
    async fn steps_keep_retention(&self, conn: &mut PgConnection) -> Result<bool, OpError> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = to_regclass($1) \
             AND attname = 'retention_ms' AND NOT attisdropped)",
        )
        .bind(&self.sql.steps_quoted)
        .fetch_one(conn)
        .await?)
    }

    /// Deletes the rows whose lease or retention has ended, in statements of at most
    /// 1000 rows, until none is left. Then the same for expired steps. Returns how many rows it
    /// deleted, steps included.
    ///
    /// Rows a transaction holds are skipped. A row claimed again while the purge runs is never
    /// deleted: see the [module docs](crate::store::postgres#expiry-and-the-purge). Each
    /// statement is bounded by the store's operation timeout.
    ///
    /// # Errors
    /// The database's error. The batches before it stay deleted.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        let records = self.purge_with(&self.sql.purge).await?;
        let steps = self.purge_with(&self.sql.purge_steps).await?;
        if records + steps > 0 {
            tracing::debug!(table = %self.sql.table, records, steps, "purged expired idempotency records and steps");
        }
        Ok(records + steps)
    }

    /// Sends `purge`, a batch of at most 1000 rows, until a batch deletes fewer.
    async fn purge_with(&self, purge: &str) -> Result<u64, StoreError> {
        let mut total = 0;
        loop {
            let deleted = self
                .bounded("PostgreSQL purge", Repeat::Safe, |_| async {
                    Ok(sqlx::query(sql::statement(purge))
                        .bind(PURGE_BATCH)
                        .execute(&self.pool)
                        .await?
                        .rows_affected())
                })
                .await?;
            total += deleted;
            if deleted < PURGE_BATCH.unsigned_abs() {
                return Ok(total);
            }
        }
    }
}
