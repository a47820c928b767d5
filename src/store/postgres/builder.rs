//! [`PostgresStoreBuilder`]: the settings of a [`PostgresStore`], fixed when it is built.

use super::connections::{CHECK_AFTER_IDLE, Connections};
use super::error::OpError;
use super::sql::{self, DURABLE_COMMITS, STORE_TIMEOUT_SETTING, Statements};
use super::{CONNECT_TIMEOUT, DEFAULT_LOCK_TIMEOUT, DEFAULT_TABLE, DEFAULT_TIMEOUT, PostgresStore};
use crate::error::ConfigError;
use crate::store::{StoreError, StoreErrorKind};
use sqlx::Connection;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Connections of a pool made by [`PostgresStoreBuilder::connect`].
const POOL_SIZE: u32 = 10;

/// The `statement_timeout` of the store's connections: four fifths of the operation timeout. The
/// server then cancels a slow statement and answers before the store gives up on it, and the
/// connection stays usable: one the store gives up on is closed mid-exchange.
pub(super) fn server_timeout(timeout: Duration) -> Duration {
    timeout - timeout / 5
}

/// Builds a [`PostgresStore`]. It is made by [`PostgresStore::builder`], and each setter names
/// its setting. The store is built over a pool with [`build`](Self::build), or connects
/// itself with [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::postgres::PostgresStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PostgresStore::builder("orders")
///     .table("app.idempotency")
///     .timeout(Duration::from_millis(500))
///     .connect("postgres://app@127.0.0.1/app")
///     .await?;
/// assert_eq!(store.table(), "app.idempotency");
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct PostgresStoreBuilder {
    /// The prefix's hash, or why it was refused. The terminal method reports it.
    prefix: Result<[u8; 8], ConfigError>,
    table: String,
    timeout: Duration,
    lock_timeout: Duration,
}

impl PostgresStoreBuilder {
    /// A builder for a store keeping its records under `prefix`, with the default settings.
    ///
    /// The prefix names the application. Two applications sharing one table need different
    /// prefixes, or they would answer each other's requests. An empty prefix is refused when
    /// the store is built, with a [`ConfigError`] of kind
    /// [`InvalidName`](crate::ConfigErrorKind::InvalidName).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: sql::prefix_hash(prefix),
            table: DEFAULT_TABLE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
        }
    }

    /// The table the records live in: a lowercase identifier, optionally schema-qualified, such as
    /// `app.idempotency`. Default: `tower_idempotency`.
    ///
    /// Anything else is refused when the store is built, with a [`ConfigError`] of kind
    /// [`InvalidName`](crate::ConfigErrorKind::InvalidName). The store's SQL quotes each part. So
    /// an SQL keyword such as `order` or `user` names its table like any other word.
    /// [`PostgresStore::migrate`] creates it.
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// Bounds every store step to `timeout`, waiting for a pooled connection included. The steps
    /// are claim, complete, release and renew. A step that takes longer fails with
    /// [`StoreErrorKind::Timeout`]. Default: 1 s. At least 1 ms.
    ///
    /// A pool made by [`connect`](Self::connect) also sets PostgreSQL's `statement_timeout` to
    /// four fifths of it. So the server cancels a slow statement, and answers, before the store
    /// gives up on it and closes its connection. That setting is the store's own: a
    /// transaction of [`transactional::within`] on a connection of this pool runs the work without
    /// it. Keep the timeout well below the lease.
    ///
    /// [`transactional::within`]: crate::transactional::within
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a claim inside a transaction waits for a row that another transaction holds,
    /// before it answers "in flight". The claim is one of [`transactional::within`]. The other
    /// transaction is the same key's first request, still running. This is PostgreSQL's
    /// `lock_timeout`, set for that one statement. Default: 1 s. At least 1 ms.
    ///
    /// A repeat that arrives while the first request's transaction runs waits, holding its
    /// connection. It gets the stored result if the first commits within this time. The claim's
    /// `statement_timeout` is this wait plus the [timeout](Self::timeout), so the wait ends first.
    ///
    /// [`transactional::within`]: crate::transactional::within
    pub fn lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.lock_timeout = lock_timeout.max(Duration::from_millis(1));
        self
    }

    /// The store over an existing pool, whose settings are kept as given. Set `statement_timeout`
    /// on its connections a little below the store's [timeout](Self::timeout), as
    /// [`connect`](Self::connect) does, to have the server cancel a slow statement before the
    /// store gives up on it. Keep
    /// `synchronous_commit` on: with it off, a crash of the server loses the last acknowledged
    /// records (see [`connect`](Self::connect)).
    ///
    /// Each step takes a connection from the pool and gives it back. With sqlx's defaults, the
    /// pool checks a connection when it hands it out and when it takes it back: a step is three
    /// exchanges with the server. `test_before_acquire(false)` saves one.
    /// [`connect`](Self::connect) makes a store whose steps are one exchange each.
    ///
    /// # Errors
    /// A [`ConfigError`] when the prefix is empty or the table name is not accepted.
    pub fn build(self, pool: PgPool) -> Result<PostgresStore, ConfigError> {
        self.build_with(pool, None)
    }

    /// The store over `pool`, its steps on `steps` when given.
    fn build_with(
        self,
        pool: PgPool,
        steps: Option<Connections>,
    ) -> Result<PostgresStore, ConfigError> {
        let prefix = self.prefix?;
        sql::check_table(&self.table)?;
        Ok(PostgresStore {
            pool,
            steps: steps.map(Arc::new),
            prefix,
            sql: Arc::new(Statements::new(&self.table)),
            timeout: self.timeout,
            lock_timeout: self.lock_timeout,
        })
    }

    /// Connects to the PostgreSQL at `url`, such as `postgres://user:password@host:port/database`.
    /// Every connection sets `statement_timeout` to four fifths of the store's
    /// [timeout](Self::timeout) when it opens: 800 ms by default. The setting `tower_idempotency.statement_timeout` marks it as the store's, and
    /// [`within`] lifts it for its work.
    ///
    /// The steps run on up to 10 connections of the store's own. Each is opened when a step
    /// needs it and kept open. A step takes one, sends its one statement and gives it back: one
    /// exchange with the server. A connection idle for 1 s or more is checked first, with one
    /// exchange more, in case the server or the network closed it. A connection whose step
    /// failed on the wire, or timed out, or whose session the server ended, is closed. See
    /// [Failures](super#failures) for the operation sent again on a new connection.
    ///
    /// [`PostgresStore::pool`] is a sqlx pool of up to 10 more connections, opened when used:
    /// by [`migrate`](PostgresStore::migrate), [`purge`](PostgresStore::purge) and your own
    /// statements. It checks a connection idle for 1 s or more when it hands it out. sqlx
    /// checks every connection it takes back, with one exchange. For other settings, build a
    /// [`PgPool`] and use [`build`](Self::build): the steps then take its connections, as it
    /// hands them out.
    ///
    /// Where the server's `synchronous_commit` is `off`, the store's connections set it `on`.
    /// Otherwise a commit is acknowledged before it is in the write-ahead log, and a crash of
    /// the server loses the last acknowledged records: their work runs again. Stronger
    /// settings, such as `remote_apply`, are kept.
    ///
    /// [`within`]: crate::transactional::within
    ///
    /// # Errors
    /// `Unavailable` when a setting is refused, with a [`ConfigError`] as source. The same when
    /// the URL is invalid or the server cannot be reached. `Timeout` when connecting takes longer
    /// than 5 s.
    pub async fn connect(self, url: &str) -> Result<PostgresStore, StoreError> {
        let invalid = |e: ConfigError| {
            StoreError::with_source(StoreErrorKind::Unavailable, "invalid setting", e)
        };
        self.prefix.clone().map_err(invalid)?;
        sql::check_table(&self.table).map_err(invalid)?;
        let timeout = sql::millis(server_timeout(self.timeout));
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| OpError::from(e).into_store("invalid PostgreSQL URL"))?
            .options([
                ("statement_timeout", format!("{timeout}ms")),
                // Tells `within` that this `statement_timeout` is the store's, not the work's.
                (STORE_TIMEOUT_SETTING, timeout.to_string()),
            ]);
        // One connection first, for the server's own answer: a pool would retry a refused
        // connection until its acquire timeout and report only that it timed out. It is the
        // steps' first connection.
        let first = tokio::time::timeout(CONNECT_TIMEOUT, PgConnection::connect_with(&options))
            .await
            .map_err(|e| OpError::from(e).into_store("connecting to PostgreSQL timed out"))?
            .map_err(|e| OpError::from(e).into_store("connecting to PostgreSQL failed"))?;
        let mut first = first;
        sqlx::query(DURABLE_COMMITS)
            .execute(&mut first)
            .await
            .map_err(|e| {
                OpError::from(e).into_store("setting up a PostgreSQL connection failed")
            })?;
        // Checks only a connection idle long enough to have been closed unseen. sqlx checks a
        // connection it takes back in any case.
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(self.timeout.max(CONNECT_TIMEOUT))
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    sqlx::query(DURABLE_COMMITS).execute(conn).await?;
                    Ok(())
                })
            })
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= CHECK_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options.clone());
        let steps = Connections::new(options, POOL_SIZE, first);
        self.build_with(pool, Some(steps)).map_err(invalid)
    }
}
