//! A MySQL or MariaDB store, shared by every replica of a service, and the table of the
//! transactional door.
//!
//! ```no_run
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::mysql::MySqlStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = MySqlStore::connect("mysql://app@127.0.0.1/app", "orders").await?;
//! store.migrate().await?; // creates the tables when they do not exist
//! let engine = Engine::new(store.clone()); // give it to any door
//!
//! // Expired rows stay until purged: purge now and then, on one replica or all.
//! tokio::spawn(async move {
//!     let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
//!     loop {
//!         every.tick().await;
//!         if let Err(e) = store.purge().await {
//!             eprintln!("idempotency purge failed: {e}");
//!         }
//!     }
//! });
//! # let _ = engine; Ok(()) }
//! ```
//!
//! [`MySqlStore`] keeps records in an InnoDB table of your MySQL 8 or MariaDB 10.11 (or later)
//! database, where every replica finds them. It serves the HTTP layer and every other door like
//! the other stores, and is the store of the
//! [transactional door on MySQL](crate::transactional::mysql), which commits the work and its
//! record in one transaction.
//!
//! # What it keeps and what it loses
//!
//! A completed record is a committed InnoDB row, as durable as the rest of your data, on the
//! server's settings:
//!
//! - **A crash of the process or the server** keeps every acknowledged record when
//!   `innodb_flush_log_at_trx_commit = 1`, the default of both servers: a commit is
//!   acknowledged once its redo log is on disk. At `0` or `2` a crash of the server (`2`: of
//!   the machine) loses up to about a second of acknowledged records, and their work runs again
//!   on a retry. The setting is global; the store cannot set it for its own sessions.
//! - **A power loss** loses what the disk had not written despite `fsync`: nothing on a disk
//!   that honours it.
//! - **A failover** to a replica loses what the replica had not received. Asynchronous
//!   replication (the default) may lose the last commits; semi-synchronous replication
//!   (`rpl_semi_sync_*`) or Group Replication / Galera keeps them. With binary logging on,
//!   `sync_binlog = 1` keeps the log and the table in step across a crash.
//!
//! A claim's row is written the same way: after a crash or a failover that lost it, a retry
//! claims the key again and the work runs again.
//!
//! # The table
//!
//! [`MySqlStore::migrate`] creates it when it does not exist, and never alters an existing one.
//! A DBA can create it by hand instead. This is the DDL for the default table name,
//! `tower_idempotency`, the same that `migrate` runs, with the name of
//! [`MySqlStoreBuilder::table`] in its place, each part quoted:
//!
//! ```sql
#![doc = include_str!("schema.sql")]
//! ```
//!
//! The [steps](crate::engine::Steps) of a request's work live in a second table, named after
//! the first with `_steps` at the end:
//!
//! ```sql
#![doc = include_str!("steps.sql")]
//! ```
//!
//! The store needs `SELECT`, `INSERT`, `UPDATE` and `DELETE` on both, and `migrate` also
//! `CREATE`. The tables must be InnoDB: the store relies on its row locks and its durable
//! commits.
//!
//! **Hashes only.** A row holds no raw key, principal, tenant or namespace. Its key is 8 bytes
//! of a domain-separated SHA-256 of the store's prefix, followed by the [`StoreKey`], itself a
//! hash. The fingerprint is a SHA-256 of the request, the token 16 random bytes. The record is
//! the engine's encoding of the response, so it does hold the response.
//!
//! # One exchange per step
//!
//! A store made by [`connect`](MySqlStoreBuilder::connect) sends each step as one query: one
//! exchange with the server, no check of the connection, no `BEGIN`. A complete of a record
//! over 256 KiB is the one exception, two exchanges: see [the packet
//! limit](#the-servers-packet-limit). MySQL has no
//! `INSERT … RETURNING` (MariaDB's is its own), so a step is a few statements in one text
//! query (sqlx's connections allow several), each committed on its own, and the last one
//! reads what they did. Values are written into the text as hex literals and numbers, never
//! as text that could end a literal. The time is the server's `UTC_TIMESTAMP(6)`, never the
//! application's, so replicas with skewed clocks agree on what has expired.
//!
//! | step | statements |
//! | --- | --- |
//! | claim | `UPDATE` an expired row to pending under the claim's token; `INSERT … ON DUPLICATE KEY UPDATE` of nothing, which inserts an absent key and leaves a live row as it is; `SELECT` the live row: the claim's own token says it claimed |
//! | complete | (a record over 256 KiB: its bytes first, in a prepared statement of their own; see [the packet limit](#the-servers-packet-limit)) the same `UPDATE` and `INSERT` to done, only where the row has expired, is pending under the caller's token, or is absent; the row then carries 16 random bytes of this complete, which the final `SELECT` looks for; when written, `DELETE` the key's steps |
//! | release | `DELETE` where the row is pending under the caller's token and live (one prepared statement) |
//! | renew | `UPDATE` the lease where the row is pending under the caller's token and live; `UPDATE` the key's live steps to keep their retention past it; `SELECT` whether the claim holds |
//! | forget | `DELETE` the live row, done or (when asked) pending, and the key's steps, unless a pending row is kept |
//! | record a step | a live step is answered as it is; otherwise `UPDATE` an expired step or `INSERT` it, expiring its retention after the end of a pending claim's lease, or after now; the key's other live steps are kept at least as long |
//! | read the steps | `SELECT` the key's live steps (one prepared statement) |
//!
//! Two claims of one key meet on InnoDB's row lock: the `INSERT` of the second waits for the
//! first's, then finds the row. A claim whose row was released between its statements answers
//! nothing, and is sent again within the same timeout.
//!
//! **MySQL 8 and MariaDB.** The tests run on MariaDB 10.11 (Debian 12's). MySQL 8 is not run
//! here; the store keeps to SQL that both document with the same meaning: `UTC_TIMESTAMP(6)`,
//! `INTERVAL … MICROSECOND`, `ON DUPLICATE KEY UPDATE` without a row alias (MySQL 8.0.19's
//! alias is not MariaDB's) and without `VALUES()` (deprecated in MySQL 8.0.20), user variables
//! set by `SET` only (not inside expressions, deprecated in MySQL 8), `LOCK IN SHARE MODE`
//! (MySQL 8 keeps it beside `FOR SHARE`, which MariaDB 10.11 lacks), `FOR UPDATE SKIP LOCKED`
//! (MySQL 8.0.1, MariaDB 10.6), and InnoDB's `innodb_lock_wait_timeout`. Nothing MariaDB-only
//! is used: no `RETURNING`, no `WAIT n`, no `max_statement_time`.
//!
//! # Expiry and the purge
//!
//! A pending row stops holding its key when its lease ends, a done row when its retention
//! ends. From then on a claim takes the row over as if it were absent. Nothing deletes the row
//! by itself. [`MySqlStore::purge`] deletes expired rows in batches of 1000 rows: each batch
//! locks its rows with `FOR UPDATE SKIP LOCKED`, so it leaves alone a row a transaction holds
//! (a claim taking it over) and a row a second purge is deleting, then deletes them where they
//! are still expired, so a row claimed again meanwhile is never deleted. Run it now and then,
//! every minute say, from one replica or all.
//!
//! Steps are kept as on PostgreSQL: while a claim holds the key, a step expires its retention
//! after the end of the lease, and each renewal moves the key's steps on with it; a released
//! key or a lapsed lease keeps them; completing the key deletes them.
//!
//! # Failures
//!
//! Every step is bounded by one operation timeout, waiting for a connection included: 3 s by
//! default, see [`MySqlStoreBuilder::timeout`]. Errors keep the sqlx error as their source and
//! map to:
//!
//! | failure | [`StoreErrorKind`] |
//! | --- | --- |
//! | the operation timeout, the pool's acquire timeout, `innodb_lock_wait_timeout` (1205), a statement time limit, an I/O timeout | `Timeout` |
//! | connection refused or lost, the server shutting down, a missing table or privilege | `Unavailable` |
//! | an answer that does not decode | `Protocol` |
//! | a deadlock (1213) at every try | `Conflict` |
//!
//! A deadlock rolls back the statement's transaction, which applied nothing: the step is sent
//! again, at most 4 times in all, within the same timeout.
//!
//! A connection lost in the middle of a step (an I/O error, the server ending the session) is
//! closed, never given back. MySQL does not say whether the statements it ran were applied. A
//! complete, a release or a renew is sent once more, on a new connection: each is fenced by its
//! claim's token, so a second send changes nothing the first did. A claim is not: it fails,
//! answered 503, the work does not run, and the store releases the claim in case it was
//! applied, so the key is not left pending until its lease lapses.
//!
//! A complete sent again finds its first send's write by the 16 bytes that send left in the
//! row, and answers `true`.
//!
//! A claim meets a lock only where a transaction holds the key's row: the transactional door's
//! first request, still running. The store's own sessions wait for it at most half the
//! operation timeout in whole seconds (at least 1 s): by default 1 s of a 3 s timeout, so the
//! server ends the wait and answers (1205, `Timeout`) before the store gives up. A claim that
//! times out all the same (a timeout under 2 s, a pool of your own with the server's lock
//! wait) fails, and its work does not run; its statements may still take the key on the server
//! once the row's holder rolls back. The store keeps reading its answer in the background, on
//! its connection, and releases the claim if it took the key: a retry then claims it, rather
//! than getting 409 until the lease lapses. That reading is bounded by two lock waits and 5 s
//! (with a pool of your own, two of InnoDB's default 50 s); past it the claim is released all
//! the same. Any other step that timed out may still have been applied by the server; each is
//! fenced by its claim's token.
//!
//! # The server's packet limit
//!
//! The server takes no statement larger than its `max_allowed_packet`: 16 MiB by default on
//! MariaDB 10.11, 64 MiB on MySQL 8. A complete's record of up to 256 KiB is written into the
//! step's one query as hex, twice its size. A larger one is sent as it is, the bound parameter
//! of a prepared statement, in an exchange of its own before the query. So a record is kept up
//! to the packet limit less 1 KiB.
//!
//! A store made by [`connect`](MySqlStoreBuilder::connect) reads `max_allowed_packet` when it
//! connects, and refuses a larger record before sending it, with `Unavailable`: its message
//! names `max_allowed_packet`, its source gives both sizes. It is read once: a limit raised
//! later (`SET GLOBAL`) counts for a store connected after. A store built over a pool does not
//! read it: the server refuses the statement and ends the session (error 1153), and the
//! complete, sent once more on a new connection, fails alike.
//!
//! A complete that fails is the engine's as any other: the handler's response still goes out,
//! the key stays pending until its lease lapses, and a retry after that runs the work again.
//! So keep the engine's record limit ([`max_record_body`], plus the response's headers) under
//! the packet limit, or raise the limit on the server. The default record limit, 1 MiB, is well
//! under both servers' defaults. A [step](crate::engine::Steps)'s result is written as hex: it
//! must fit in half the packet limit, and a store made by `connect` refuses a larger one the
//! same way, before it is sent.
//!
//! # Bounds
//!
//! As with the other shared stores, nothing bounds what one caller writes. Each record stays
//! until its retention ends and the purge runs. Rate-limit per principal in front of the layer.
//!
//! [`StoreErrorKind`]: crate::store::StoreErrorKind
//! [`max_record_body`]: crate::engine::EngineBuilder::max_record_body

use super::{
    Claim, Forgotten, Inspected, StepId, StepRecorded, Store, StoreError, StoreErrorKind, Token,
};
use crate::store::{Fingerprint, Record, StoreKey};
use bytes::Bytes;
use sqlx::Row;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPool, MySqlRow};
use sqlx::pool::PoolConnection;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

mod builder;
mod connections;
mod error;
mod maintenance;
pub(crate) mod sql;

use self::connections::{Connections, Taken};
pub(crate) use self::error::OpError;
pub(crate) use self::error::protocol;

pub use self::builder::MySqlStoreBuilder;
/// The `sqlx` crate this store is built on, for pools, connections and transactions of your
/// own.
pub use ::sqlx;

/// The default table.
pub(crate) const DEFAULT_TABLE: &str = "tower_idempotency";
/// The default bound on one store operation: long enough that the sessions' lock wait of 1 s
/// ends a claim stuck behind a held row, with the server's answer, before it.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// InnoDB's default `innodb_lock_wait_timeout`, assumed for the sessions of a pool the store
/// was built over.
pub(crate) const SERVER_LOCK_WAIT: Duration = Duration::from_secs(50);
/// The default bound on a transactional claim's wait for a row another transaction holds.
pub(crate) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// The bound on making the first connection in [`MySqlStore::connect`].
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Rows one purge batch deletes at most.
pub(crate) const PURGE_BATCH: i64 = 1000;
/// Claims sent for one step at most: a claim is sent again only when the row it met was
/// released between its statements. The same bound holds for recording a step.
pub(crate) const CLAIM_ATTEMPTS: usize = 4;
/// Times a step is sent at most when InnoDB keeps rolling it back for a deadlock.
const CONFLICT_ATTEMPTS: usize = 4;
/// Records larger than this are sent as a bound parameter, in an exchange of their own, rather
/// than as hex in the step's text: at this size the bytes on the wire, halved, cost more than
/// the exchange.
const BIND_RECORD_FROM: usize = 256 * 1024;
/// What a prepared statement's execution adds to its one bound value, with room to spare.
const PACKET_OVERHEAD: usize = 1024;
/// How much longer than its lock waits the answer of a claim that timed out is awaited: the
/// server's own delays, on a loaded machine.
const ABANDONED_MARGIN: Duration = Duration::from_secs(5);

/// An idempotency [`Store`] in a MySQL or MariaDB table, over a sqlx [`MySqlPool`].
///
/// Made by [`MySqlStore::builder`], or by the shortcuts [`MySqlStore::connect`] and
/// [`MySqlStore::new`] with the default settings. Cheap to clone: clones share the
/// connections. See the [module docs](self) for the table, the statements and the purge.
#[derive(Clone)]
pub struct MySqlStore {
    pool: MySqlPool,
    /// The steps' own connections, in a store made by `connect`.
    steps: Option<Arc<Connections>>,
    prefix: [u8; 8],
    pub(crate) sql: Arc<sql::Statements>,
    pub(crate) timeout: Duration,
    pub(crate) lock_timeout: Duration,
    /// The `innodb_lock_wait_timeout` of the sessions the steps run on.
    session_lock_wait: Duration,
    /// The server's `max_allowed_packet`, read when connecting: no statement may be larger.
    /// Unknown for a store built over a pool.
    pub(crate) max_packet: Option<usize>,
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("table", &self.sql.table)
            .field("timeout", &self.timeout)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl MySqlStore {
    /// A builder for a store keeping its records under `prefix`: set the table, the operation
    /// timeout or the transactional lock wait. Then connect, or build over a pool.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::mysql::MySqlStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = MySqlStore::builder("orders")
    ///     .timeout(Duration::from_secs(2))
    ///     .connect("mysql://app@127.0.0.1/app")
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder(prefix: &str) -> MySqlStoreBuilder {
        MySqlStoreBuilder::new(prefix)
    }

    /// Connects to the server at `url` with the default settings. A shortcut for
    /// `MySqlStore::builder(prefix).connect(url)`; see [`MySqlStoreBuilder::connect`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty, the URL is invalid or the server cannot be
    /// reached. `Timeout` when connecting takes longer than 5 s.
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::builder(prefix).connect(url).await
    }

    /// A store over an existing pool with the default settings, keeping records under
    /// `prefix`. A shortcut for `MySqlStore::builder(prefix).build(pool)`.
    ///
    /// ```no_run
    /// use tower_idempotency::store::mysql::{MySqlStore, sqlx::MySqlPool};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = MySqlPool::connect("mysql://app@127.0.0.1/app").await?;
    /// let store = MySqlStore::new(pool, "orders")?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`](crate::ConfigError) when `prefix` is empty.
    pub fn new(pool: MySqlPool, prefix: &str) -> Result<Self, crate::ConfigError> {
        Self::builder(prefix).build(pool)
    }

    /// The pool: the one given to [`new`](Self::new) or [`build`](MySqlStoreBuilder::build),
    /// whose connections the steps take. For a store made by
    /// [`connect`](MySqlStoreBuilder::connect), a pool for `migrate`, `purge` and your own
    /// statements, beside the steps' own connections.
    #[must_use]
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }

    /// The table. See [`MySqlStoreBuilder::table`].
    #[must_use]
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The operation timeout. See [`MySqlStoreBuilder::timeout`].
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The transactional claim's lock wait. See [`MySqlStoreBuilder::lock_timeout`].
    #[must_use]
    pub fn lock_timeout(&self) -> Duration {
        self.lock_timeout
    }

    /// The `key` column of `key`'s row: 8 bytes of the prefix's hash, then
    /// [`StoreKey::id`]. For operators and tests looking at the table.
    #[must_use]
    pub fn row_key(&self, key: &StoreKey) -> [u8; 40] {
        sql::key_bytes(&self.prefix, key)
    }

    /// The MySQL store behind `store`: itself, in an `Arc`, or behind the routes' type erasure.
    pub(crate) fn of(store: &dyn std::any::Any) -> Option<&Self> {
        if let Some(s) = store.downcast_ref::<Self>() {
            return Some(s);
        }
        if let Some(s) = store.downcast_ref::<Arc<Self>>() {
            return Some(s);
        }
        #[cfg(feature = "macros")]
        if let Some(s) = store.downcast_ref::<crate::store::erased::DynStore>() {
            return Self::of(s.as_any());
        }
        None
    }

    /// Whether `other` keeps the same rows: the same prefix, in the same table of the same
    /// database. Another prefix writes under keys of its own, which this store never reads.
    pub(crate) fn same_records(&self, other: &Self) -> bool {
        let (a, b) = (self.pool.connect_options(), other.pool.connect_options());
        self.prefix == other.prefix
            && self.sql.table == other.sql.table
            && a.get_host() == b.get_host()
            && a.get_port() == b.get_port()
            && a.get_database() == b.get_database()
    }

    /// A connection for one operation: a new one when `fresh` (the store's own connections only).
    async fn take(&self, fresh: bool) -> Result<Leased<'_>, OpError> {
        match &self.steps {
            Some(own) => own.take(fresh).await.map(Leased::Own),
            None => self.pool.acquire().await.map(Leased::Pool),
        }
        .map_err(OpError::Connect)
    }

    /// Runs one operation under the operation timeout; `send(fresh)` sends it once. A deadlock
    /// applied nothing: the operation is sent again, up to [`CONFLICT_ATTEMPTS`] times in all.
    /// An operation whose connection was lost is sent once more, on a new connection, when
    /// `repeat` says that sending it twice does what once does.
    async fn bounded<T, F, Fut>(
        &self,
        op: &'static str,
        repeat: Repeat,
        send: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, OpError>>,
    {
        self.bounded_op(repeat, send)
            .await
            .map_err(|e| e.into_store(op))
    }

    async fn bounded_op<T, F, Fut>(&self, repeat: Repeat, send: F) -> Result<T, OpError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, OpError>>,
    {
        tokio::time::timeout(self.timeout, Self::tries(repeat, send)).await?
    }

    /// Sends one operation until it is answered, with no time bound: see
    /// [`bounded_op`](Self::bounded_op).
    async fn tries<T, F, Fut>(repeat: Repeat, mut send: F) -> Result<T, OpError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, OpError>>,
    {
        let (mut sent, mut fresh) = (1, false);
        loop {
            match send(fresh).await {
                Err(e) if e.is_conflict() && sent < CONFLICT_ATTEMPTS => sent += 1,
                Err(e) if !fresh && e.lost_connection() && repeat == Repeat::Safe => {
                    fresh = true;
                }
                done => return done,
            }
        }
    }

    /// Takes over a claim whose operation timeout ran out while it was sent: its statements
    /// may still run on the server, waiting for a row lock, and take the key under `token`
    /// once the row's holder lets go. Its answer is read in the background, on its connection,
    /// and a claim it took is released: its caller was answered with a timeout, and its work
    /// never runs. Reading is bounded by two of the sessions' lock waits (the claim's
    /// `UPDATE` and `INSERT` may each wait) and a margin; past that the connection is closed
    /// and the claim released all the same, as when its connection is lost. Only a row still
    /// pending under `token` is deleted, so a release never touches another claim.
    fn abandon<F>(&self, sending: Pin<Box<F>>, key: StoreKey, token: Token)
    where
        F: Future<Output = Result<Option<ClaimRow>, OpError>> + Send + 'static,
    {
        let store = self.clone();
        let bound = store
            .session_lock_wait
            .saturating_mul(2)
            .saturating_add(ABANDONED_MARGIN);
        tokio::spawn(async move {
            let held = match tokio::time::timeout(bound, sending).await {
                Ok(Ok(Some(row))) => row.state == sql::CLAIMED,
                Ok(Ok(None)) => false,
                // No answer: it may have been applied.
                Ok(Err(e)) => e.lost_connection(),
                Err(_) => true,
            };
            if held {
                let released = store.release(&key, &token).await;
                tracing::debug!(?released, "released a claim that timed out");
            }
        });
    }

    /// Sends `query`, several statements in one exchange, and collects the rows they answer.
    async fn rows(conn: &mut MySqlConnection, query: String) -> Result<Vec<MySqlRow>, sqlx::Error> {
        sqlx::raw_sql(sql::statement(query)).fetch_all(conn).await
    }

    /// One claim: `None` when the row it met was released between its statements.
    async fn claim_once(
        &self,
        conn: &mut MySqlConnection,
        key: &sql::KeyBytes,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: i64,
    ) -> Result<Option<ClaimRow>, OpError> {
        let query = self
            .sql
            .claim(key, fingerprint.as_bytes(), token.as_bytes(), lease);
        let rows = Self::rows(conn, query).await?;
        rows.first().map(ClaimRow::read).transpose()
    }

    /// Records a step of the work on `conn`, which may be inside a transaction. `None` when the
    /// step it met kept being deleted between its statements.
    pub(crate) async fn record_step_on(
        &self,
        conn: &mut MySqlConnection,
        key: &StoreKey,
        step: &StepId,
        value: &[u8],
        retention: Duration,
    ) -> Result<Option<StepRecorded>, OpError> {
        let key = self.row_key(key);
        let retention = sql::millis(retention);
        for _ in 0..CLAIM_ATTEMPTS {
            let writer = Token::generate().map_err(|_| {
                OpError::from(sqlx::Error::Protocol("no random bytes for a writer".into()))
            })?;
            let query =
                self.sql
                    .record_step(&key, step.as_bytes(), value, retention, writer.as_bytes());
            let rows = Self::rows(conn, query).await?;
            let Some(first) = rows.first() else {
                return Err(sqlx::Error::RowNotFound.into());
            };
            let (done, mine): (i64, i64) = (first.try_get(0)?, first.try_get(1)?);
            if done > 0 || mine > 0 {
                return Ok(Some(StepRecorded::Recorded));
            }
            if let Some(found) = rows.get(1) {
                let value: Vec<u8> = found.try_get(0)?;
                return Ok(Some(StepRecorded::Found(Bytes::from(value))));
            }
        }
        Ok(None)
    }
}

/// Whether an operation whose outcome is unknown may be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    /// Sent twice, it does what it does once: a read, or a write fenced by the claim's token.
    Safe,
    /// A second send would answer differently: a claim would find its own pending row.
    Unsafe,
}

/// A connection one step holds: one of the store's own, or one of the pool it was built over.
enum Leased<'a> {
    Own(Taken<'a>),
    Pool(PoolConnection<MySql>),
}

impl Leased<'_> {
    fn conn(&mut self) -> &mut MySqlConnection {
        match self {
            Self::Own(taken) => &mut taken.conn,
            Self::Pool(pooled) => pooled,
        }
    }

    /// Gives the connection back after a step that failed with `failure`, if it did. A
    /// connection the server or the network ended is closed, never given back.
    fn give_back_sql(self, failure: Option<&sqlx::Error>) {
        match self {
            Self::Own(taken) => taken.give_back(failure),
            Self::Pool(mut pooled) => {
                if !failure.is_none_or(error::keeps_connection) {
                    pooled.close_on_drop();
                }
            }
        }
    }

    fn give_back(self, failure: Option<&OpError>) {
        match failure {
            None => self.give_back_sql(None),
            Some(OpError::Sql(e) | OpError::Connect(e)) => self.give_back_sql(Some(e)),
            Some(OpError::Elapsed(_)) => drop(self),
        }
    }
}

/// A claim's answer row: `(state, fingerprint, record)`.
pub(crate) struct ClaimRow {
    state: i64,
    fingerprint: Option<Vec<u8>>,
    record: Option<Vec<u8>>,
}

impl ClaimRow {
    pub(crate) fn read(row: &MySqlRow) -> Result<Self, OpError> {
        Ok(Self {
            state: row.try_get(0)?,
            fingerprint: row.try_get(1)?,
            record: row.try_get(2)?,
        })
    }

    /// What the claim found; `token` is the one it sent.
    pub(crate) fn into_claim(self, token: Token) -> Result<Claim, StoreError> {
        let fingerprint = |fp: Option<Vec<u8>>| {
            fp.and_then(|fp| <[u8; 32]>::try_from(fp).ok())
                .map(Fingerprint::from_bytes)
                .ok_or_else(|| protocol("a row without a 32-byte fingerprint"))
        };
        match self.state {
            sql::CLAIMED => Ok(Claim::Claimed(token)),
            sql::PENDING => Ok(Claim::Pending {
                fingerprint: fingerprint(self.fingerprint)?,
            }),
            sql::DONE => Ok(Claim::Done {
                fingerprint: fingerprint(self.fingerprint)?,
                record: Record::from_bytes(Bytes::from(
                    self.record
                        .ok_or_else(|| protocol("a done row without a record"))?,
                )),
            }),
            _ => Err(protocol("a row in an unknown state")),
        }
    }
}

/// A value refused before it is sent: the server would refuse the statement and end the
/// session for it.
fn over_packet(message: &'static str, bytes: usize, max: usize) -> StoreError {
    StoreError::with_source(
        StoreErrorKind::Unavailable,
        message,
        format!("{bytes} bytes; the server's max_allowed_packet is {max} bytes"),
    )
}

/// The one number a step's last statement answers.
fn count(rows: &[MySqlRow]) -> Result<i64, OpError> {
    let row = rows.last().ok_or(sqlx::Error::RowNotFound)?;
    Ok(row.try_get(0)?)
}

impl Store for MySqlStore {
    fn name(&self) -> &'static str {
        "mysql"
    }

    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let token = Token::generate()?;
        let lease = sql::millis(lease);
        // Owned, so that a claim that times out can be read to its end in the background.
        let (store, row_key, fingerprint, sent) =
            (self.clone(), self.row_key(key), *fingerprint, token.clone());
        let mut sending = Box::pin(async move {
            let (store, row_key, fingerprint, sent) = (&store, &row_key, &fingerprint, &sent);
            Self::tries(Repeat::Unsafe, |fresh| async move {
                let mut conn = store.take(fresh).await?;
                let mut found = Ok(None);
                for _ in 0..CLAIM_ATTEMPTS {
                    found = store
                        .claim_once(conn.conn(), row_key, fingerprint, sent, lease)
                        .await;
                    if !matches!(found, Ok(None)) {
                        break;
                    }
                }
                conn.give_back(found.as_ref().err());
                found
            })
            .await
        });
        let row = match tokio::time::timeout(self.timeout, &mut sending).await {
            Ok(row) => row,
            Err(elapsed) => {
                self.abandon(sending, *key, token.clone());
                Err(elapsed.into())
            }
        };
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                // The claim may have taken the key, on a connection lost before its answer. It
                // fails, and its work does not run: the key goes back, rather than staying
                // pending until the lease lapses.
                if e.lost_connection() {
                    let released = self.release(key, &token).await;
                    tracing::debug!(?released, "released a claim whose answer was lost");
                }
                return Err(e.into_store("MySQL claim"));
            }
        };
        row.ok_or_else(|| protocol("claim kept racing concurrent claims"))?
            .into_claim(token)
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let record = &record.into_bytes();
        let retention = sql::millis(retention);
        // Sent again after a lost connection, the same bytes find the first send's write.
        let writer = &Token::generate()?;
        let statement = |record| {
            self.sql.complete(
                &key,
                token.as_bytes(),
                fingerprint.as_bytes(),
                record,
                retention,
                writer.as_bytes(),
            )
        };
        let statement = &statement;
        // A large record goes as bytes, where hex would double it, and so does one whose hex
        // the server's packet limit would refuse.
        let rest = statement(None);
        let text_len = rest.len().saturating_add(sql::hex_len(record.len()));
        let bind =
            record.len() > BIND_RECORD_FROM || self.max_packet.is_some_and(|max| text_len > max);
        if let Some(max) = self.max_packet {
            let needed = if bind {
                record.len().saturating_add(PACKET_OVERHEAD)
            } else {
                text_len
            };
            if needed > max {
                return Err(over_packet(
                    "MySQL complete: the record is larger than the server's max_allowed_packet",
                    record.len(),
                    max,
                ));
            }
        }
        let (rest, record_text) = (&rest, (!bind).then_some(&record[..]));
        let written = self
            .bounded("MySQL complete", Repeat::Safe, |fresh| async move {
                let query = match record_text {
                    Some(record) => statement(Some(record)),
                    None => rest.clone(),
                };
                let mut conn = self.take(fresh).await?;
                if bind {
                    let set = sqlx::query(sql::SET_RECORD)
                        .bind(&record[..])
                        .execute(conn.conn())
                        .await;
                    if let Err(e) = set {
                        conn.give_back_sql(Some(&e));
                        return Err(e.into());
                    }
                }
                let rows = Self::rows(conn.conn(), query).await;
                conn.give_back_sql(rows.as_ref().err());
                count(&rows?)
            })
            .await?;
        Ok(written == 1)
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let release = self.sql.release();
        let release = &release;
        let deleted = self
            .bounded("MySQL release", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let deleted = sqlx::query(sql::statement(release.clone()))
                    .bind(&key[..])
                    .bind(&token.as_bytes()[..])
                    .execute(conn.conn())
                    .await;
                conn.give_back_sql(deleted.as_ref().err());
                Ok(deleted?)
            })
            .await?;
        Ok(deleted.rows_affected() == 1)
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        let key = self.row_key(key);
        let (state, deleted) = self
            .bounded("MySQL forget", Repeat::Unsafe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let rows = Self::rows(conn.conn(), self.sql.forget(&key, pending)).await;
                conn.give_back_sql(rows.as_ref().err());
                let rows = rows?;
                let row = rows.last().ok_or(sqlx::Error::RowNotFound)?;
                Ok((row.try_get::<i64, _>(0)?, row.try_get::<Option<i64>, _>(1)?))
            })
            .await?;
        match (state, deleted.unwrap_or(0) > 0) {
            (0, _) => Ok(Forgotten::Nothing),
            (sql::DONE, true) => Ok(Forgotten::Record),
            (sql::PENDING, true) => Ok(Forgotten::Pending),
            (sql::PENDING, false) => Ok(Forgotten::KeptPending),
            // The row changed between the statements: it is gone now.
            (_, false) => Ok(Forgotten::Nothing),
            _ => Err(protocol("unexpected row state in forget")),
        }
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let lease = sql::millis(lease);
        let renewed = self
            .bounded("MySQL renew", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let rows =
                    Self::rows(conn.conn(), self.sql.renew(&key, token.as_bytes(), lease)).await;
                conn.give_back_sql(rows.as_ref().err());
                count(&rows?)
            })
            .await?;
        Ok(renewed == 1)
    }

    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        if let Some(max) = self.max_packet {
            // Written as hex, as the statement's other values.
            let rest = self.sql.record_step(
                &self.row_key(key),
                step.as_bytes(),
                &[],
                sql::millis(retention),
                &[0; 16],
            );
            if rest.len().saturating_add(value.len().saturating_mul(2)) > max {
                return Err(over_packet(
                    "MySQL record step: the step's result is larger than the server's \
                     max_allowed_packet allows",
                    value.len(),
                    max,
                ));
            }
        }
        let value = &value;
        let recorded = self
            .bounded("MySQL record step", Repeat::Unsafe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let recorded = self
                    .record_step_on(conn.conn(), key, step, value, retention)
                    .await;
                conn.give_back(recorded.as_ref().err());
                recorded
            })
            .await?;
        recorded.ok_or_else(|| protocol("recording a step kept racing concurrent records"))
    }

    /// One `SELECT`: a plain read takes no row lock, so it waits on no claim in progress.
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let key = self.row_key(key);
        let select = &self.sql.inspect();
        let found = self
            .bounded("MySQL inspect", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let row = sqlx::query(sql::statement(select.clone()))
                    .bind(&key[..])
                    .fetch_optional(conn.conn())
                    .await;
                conn.give_back_sql(row.as_ref().err());
                match row? {
                    None => Ok(None),
                    Some(r) => Ok(Some((ClaimRow::read(&r)?, r.try_get::<i64, _>(3)?))),
                }
            })
            .await?;
        let Some((row, left)) = found else {
            return Ok(Inspected::Absent);
        };
        let left = Duration::from_micros(u64::try_from(left).unwrap_or(0));
        // The row is never `CLAIMED`, the answer of a claim that took the key: no token is
        // asked for.
        Inspected::of(row.into_claim(Token::from_bytes([0; 16]))?, left)
    }

    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        let key = self.row_key(key);
        let select = self.sql.steps();
        let select = &select;
        let rows = self
            .bounded("MySQL steps", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let rows = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(sql::statement(select.clone()))
                    .bind(&key[..])
                    .fetch_all(conn.conn())
                    .await;
                conn.give_back_sql(rows.as_ref().err());
                Ok(rows?)
            })
            .await?;
        rows.into_iter()
            .map(|(step, value)| {
                let step = <[u8; 32]>::try_from(step)
                    .map_err(|_| protocol("a step without a 32-byte id"))?;
                Ok((StepId::from_bytes(step), Bytes::from(value)))
            })
            .collect()
    }
}
