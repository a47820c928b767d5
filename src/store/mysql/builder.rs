//! [`MySqlStoreBuilder`]: the settings of a [`MySqlStore`], fixed when it is built.

use super::connections::{CHECK_AFTER_IDLE, Connections};
use super::error::OpError;
use super::sql::{self, Statements};
use super::{
    CONNECT_TIMEOUT, DEFAULT_LOCK_TIMEOUT, DEFAULT_TABLE, DEFAULT_TIMEOUT, MySqlStore,
    SERVER_LOCK_WAIT,
};
use crate::error::ConfigError;
use crate::store::{StoreError, StoreErrorKind};
use sqlx::Connection;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Connections of a pool made by [`MySqlStoreBuilder::connect`], and of the steps' own.
const POOL_SIZE: u32 = 10;

/// The session settings of the store's connections: autocommit, whatever the server's
/// default, since each statement of a step commits on its own; and a lock wait of whole
/// seconds, [`session_lock_wait`]. A step meets a lock only where a transaction of the
/// transactional door holds its row.
pub(super) fn session_setup(timeout: Duration) -> String {
    format!(
        "SET SESSION autocommit = 1, SESSION innodb_lock_wait_timeout = {}",
        session_lock_wait(timeout).as_secs()
    )
}

/// The lock wait of the store's own sessions: half the operation timeout in whole seconds,
/// rounded down, at least 1 s (InnoDB's least). From a timeout of 2 s on, the server ends a
/// statement that waits for a row lock, and answers, before the step gives up on it.
pub(super) fn session_lock_wait(timeout: Duration) -> Duration {
    // `seconds` keeps whole seconds as they are, within InnoDB's bounds.
    Duration::from_secs(sql::seconds(Duration::from_secs((timeout / 2).as_secs())))
}

/// Builds a [`MySqlStore`]. It is made by [`MySqlStore::builder`], and each setter names its
/// setting. The store is built over a pool with [`build`](Self::build), or connects itself
/// with [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_idempotency::store::mysql::MySqlStore;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = MySqlStore::builder("orders")
///     .table("app.idempotency")
///     .timeout(Duration::from_secs(2))
///     .connect("mysql://app@127.0.0.1/app")
///     .await?;
/// assert_eq!(store.table(), "app.idempotency");
/// # Ok(()) }
/// ```
#[must_use]
#[derive(Debug, Clone)]
pub struct MySqlStoreBuilder {
    /// The prefix's hash, or why it was refused. The terminal method reports it.
    prefix: Result<[u8; 8], ConfigError>,
    table: String,
    timeout: Duration,
    lock_timeout: Duration,
}

impl MySqlStoreBuilder {
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

    /// The table the records live in: a lowercase identifier of at most 58 bytes, optionally
    /// database-qualified, such as `app.idempotency`. Default: `tower_idempotency`.
    ///
    /// Anything else is refused when the store is built, with a [`ConfigError`] of kind
    /// [`InvalidName`](crate::ConfigErrorKind::InvalidName). The store's SQL quotes each part,
    /// so an SQL keyword such as `order` names its table like any other word.
    /// [`MySqlStore::migrate`] creates it.
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// Bounds every store step to `timeout`, waiting for a connection included. A step that
    /// takes longer fails with [`StoreErrorKind::Timeout`]. Default: 3 s. At least 1 ms.
    ///
    /// A store made by [`connect`](Self::connect) also sets InnoDB's `innodb_lock_wait_timeout`
    /// of its connections to half this timeout in whole seconds, rounded down, and at least
    /// 1 s: 1 s by default. A claim that waits for a row another transaction holds then gets
    /// the server's lock wait error, answered as a timeout, before the store stops waiting.
    ///
    /// A claim whose timeout runs out first (a timeout under 2 s, or a pool of your own whose
    /// sessions keep the server's lock wait, 50 s by default) may still take the key on the
    /// server. It fails, its work does not run, and the store keeps reading its answer in the
    /// background: when it took the key, the store releases it, so a retry can claim the key
    /// rather than meeting a pending claim until its lease lapses. Keep the timeout well below
    /// the lease.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a claim inside a transaction waits for a row that another transaction holds,
    /// before it answers "in flight". The claim is one of
    /// [`transactional::mysql::within`]. The other transaction is the same key's first request,
    /// still running. This is InnoDB's `innodb_lock_wait_timeout`, set for the claim's
    /// statements and put back after them. InnoDB counts it in whole seconds: it is rounded up.
    /// Default: 1 s.
    ///
    /// [`transactional::mysql::within`]: crate::transactional::mysql::within
    pub fn lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.lock_timeout = lock_timeout.max(Duration::from_millis(1));
        self
    }

    /// The store over an existing pool, whose settings are kept as given. Its sessions must run
    /// with `autocommit` on, MySQL's default: each statement of a step commits on its own.
    ///
    /// Each step takes a connection from the pool and gives it back. With sqlx's defaults, the
    /// pool checks a connection when it hands it out and when it takes it back: a step is three
    /// exchanges with the server. [`connect`](Self::connect) makes a store whose steps are one
    /// exchange each.
    ///
    /// # Errors
    /// A [`ConfigError`] when the prefix is empty or the table name is not accepted.
    pub fn build(self, pool: MySqlPool) -> Result<MySqlStore, ConfigError> {
        self.build_with(pool, None)
    }

    fn build_with(
        self,
        pool: MySqlPool,
        steps: Option<Connections>,
    ) -> Result<MySqlStore, ConfigError> {
        let own = steps.is_some();
        let prefix = self.prefix?;
        sql::check_table(&self.table)?;
        Ok(MySqlStore {
            pool,
            steps: steps.map(Arc::new),
            prefix,
            sql: Arc::new(Statements::new(&self.table)),
            timeout: self.timeout,
            lock_timeout: self.lock_timeout,
            session_lock_wait: if own {
                session_lock_wait(self.timeout)
            } else {
                SERVER_LOCK_WAIT
            },
            max_packet: None,
        })
    }

    /// Connects to the MySQL or MariaDB server at `url`, such as
    /// `mysql://user:password@host:port/database`.
    ///
    /// The steps run on up to 10 connections of the store's own. Each is opened when a step
    /// needs it and kept open. A step takes one, sends its query and gives it back: one
    /// exchange with the server. A connection idle for 1 s or more is checked first, with one
    /// exchange more, in case the server or the network closed it. A connection whose step
    /// failed on the wire, or timed out, is closed; that of a claim that timed out is first
    /// read to the claim's answer (see [`timeout`](Self::timeout)), and holds its place among
    /// the 10 until then.
    ///
    /// [`MySqlStore::pool`] is a sqlx pool of up to 10 more connections, opened when used: by
    /// [`migrate`](MySqlStore::migrate), [`purge`](MySqlStore::purge) and your own statements.
    ///
    /// # Errors
    /// `Unavailable` when a setting is refused, with a [`ConfigError`] as source. The same when
    /// the URL is invalid or the server cannot be reached. `Timeout` when connecting takes longer
    /// than 5 s.
    pub async fn connect(self, url: &str) -> Result<MySqlStore, StoreError> {
        let invalid = |e: ConfigError| {
            StoreError::with_source(StoreErrorKind::Unavailable, "invalid setting", e)
        };
        self.prefix.clone().map_err(invalid)?;
        sql::check_table(&self.table).map_err(invalid)?;
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| OpError::from(e).into_store("invalid MySQL URL"))?;
        let setup = session_setup(self.timeout);
        // One connection first, for the server's own answer: a pool would retry a refused
        // connection until its acquire timeout and report only that it timed out.
        let mut first =
            tokio::time::timeout(CONNECT_TIMEOUT, MySqlConnection::connect_with(&options))
                .await
                .map_err(|e| OpError::from(e).into_store("connecting to MySQL timed out"))?
                .map_err(|e| OpError::from(e).into_store("connecting to MySQL failed"))?;
        sqlx::raw_sql(sql::statement(setup.clone()))
            .execute(&mut first)
            .await
            .map_err(|e| OpError::from(e).into_store("setting up a MySQL connection failed"))?;
        // The largest statement the server takes: a complete checks its record against it.
        let max_packet: u64 = sqlx::query_scalar("SELECT CAST(@@max_allowed_packet AS UNSIGNED)")
            .fetch_one(&mut first)
            .await
            .map_err(|e| {
                OpError::from(e).into_store("reading MySQL's max_allowed_packet failed")
            })?;
        let pool = MySqlPoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(self.timeout.max(CONNECT_TIMEOUT))
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= CHECK_AFTER_IDLE {
                        conn.ping().await?;
                    }
                    Ok(true)
                })
            })
            .connect_lazy_with(options.clone());
        let steps = Connections::new(options, setup, POOL_SIZE, first);
        let mut store = self.build_with(pool, Some(steps)).map_err(invalid)?;
        store.max_packet = Some(usize::try_from(max_packet).unwrap_or(usize::MAX));
        Ok(store)
    }
}

#[cfg(test)]
mod tests {
    use super::session_lock_wait;
    use std::time::Duration;

    #[test]
    fn the_sessions_lock_wait_is_half_the_timeout_in_whole_seconds_and_at_least_one() {
        let secs = |ms| session_lock_wait(Duration::from_millis(ms)).as_secs();
        // The default 3 s timeout: the server's 1 s lock wait answers first.
        assert_eq!(secs(3_000), 1);
        assert_eq!(secs(2_000), 1);
        assert_eq!(secs(5_000), 2);
        assert_eq!(secs(10_000), 5);
        // Under 2 s InnoDB cannot wait less than the timeout: a claim that times out is released.
        assert_eq!(secs(1_999), 1);
        assert_eq!(secs(250), 1);
    }
}
