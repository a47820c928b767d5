//! A PostgreSQL store, shared by every replica of a service, and the table of the
//! transactional door.
//!
//! ```no_run
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::postgres::PostgresStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PostgresStore::connect("postgres://app@127.0.0.1/app", "orders").await?;
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
//! [`PostgresStore`] keeps records in a table of your database, where every replica finds
//! them. They are as durable as the rest of your data: a completed record survives a crash and
//! a failover like any committed row. A commit is acknowledged once it is in the write-ahead
//! log: a pool made by [`PostgresStore::connect`] keeps `synchronous_commit` on, even where the
//! server's default is off. It serves the HTTP layer and every other door like the other
//! stores. It is also the store of the [transactional door](crate::transactional), which
//! commits the work and its record in one transaction.
//!
//! # Which store
//!
//! | store | a completed record survives | a crash between the work and its record | for |
//! | --- | --- | --- | --- |
//! | [`MemoryStore`](super::MemoryStore) | while the process lives | leaves the work done, no record: a retry after the lease runs it again | one replica, or tests |
//! | `RedisStore` (feature `redis`) | while Redis keeps it (no eviction, no failover losing writes) | same | many replicas, work anywhere |
//! | [`PostgresStore`] | as long as your database keeps committed rows (a failover to an asynchronous standby may lose the last commits) | same | many replicas, records as durable as your data |
//! | [`PostgresStore`] through [`transactional::within`](crate::transactional::within) | same, and what a failover loses it loses with the work | cannot happen: the work and the record commit together or not at all | work that is writes to the same database |
//!
//! [`transactional::step`](crate::transactional::step) does the same for one
//! [step](crate::engine::Steps) of a request's work: the step's writes and its record commit
//! together.
//!
//! # The table
//!
//! [`PostgresStore::migrate`] creates it when it does not exist. It never alters an existing
//! one. A DBA can create it by hand instead. This is the DDL for the default table name,
//! `tower_idempotency`, the same that `migrate` runs. `migrate` puts the name of
//! [`PostgresStoreBuilder::table`] in its place, each part quoted:
//!
//! ```sql
#![doc = include_str!("schema.sql")]
//! ```
//!
//! The [steps](crate::engine::Steps) of a request's work live in a second table. It is named
//! after the first, with `_steps` at the end: `tower_idempotency_steps` by default,
//! `app.idempotency_steps` for `app.idempotency`. `migrate` creates it too, also beside a
//! table made before steps existed, and adds the `retention_ms` column to a steps' table made
//! before it was kept. Its DDL:
//!
//! ```sql
#![doc = include_str!("steps.sql")]
//! ```
//!
//! The store needs `SELECT`, `INSERT`, `UPDATE` and `DELETE` on both. `migrate` also needs
//! `CREATE` on the schema.
//!
//! **Hashes only.** A row holds no raw key, principal, tenant or namespace. Its key is 8 bytes
//! of a domain-separated SHA-256 of the store's prefix, followed by the [`StoreKey`]. That is
//! itself a hash of the door's namespace, the tenant, the principal and the client key. The
//! fingerprint is a SHA-256 of the request, and the token 16 random bytes. The record is the
//! engine's encoding of the response, so it does hold the response. See the layer's `status`
//! response mode for bodies that must not rest in a database. A step's row holds the same key,
//! a 32-byte hash for the step, and the step's name and result.
//!
//! **A logged table.** The table must be an ordinary, logged table, never `UNLOGGED`. An
//! unlogged table skips the write-ahead log. So PostgreSQL truncates it after a crash and
//! never replicates it to a standby. Every record would vanish with a crash or a failover.
//! Every repeat after it would run its work again. Durability is the reason to keep
//! records in PostgreSQL at all.
//!
//! **Not partitioned by expiry.** Partitioning by `expires_at` would make dropping old
//! partitions the purge. But a primary key on a partitioned table must contain the partition
//! column, and a row's expiry changes at every step: claim, renew, complete. The key would no
//! longer be unique across partitions. A claim's `ON CONFLICT (key)` makes two concurrent
//! claims of one key meet, and it would only see rows in its own partition. The expiry index
//! and a batched purge keep the table small instead.
//!
//! # One statement per step
//!
//! Needs PostgreSQL 12 or newer. Each step is one SQL statement, atomic on the server. It is
//! prepared once per connection. A store made by [`connect`](PostgresStoreBuilder::connect)
//! sends it in one exchange with the server: no check of the connection, no `SET`, no
//! `BEGIN`. The time is the database's `statement_timestamp()`, never
//! the application's. So replicas with skewed clocks agree on what has expired:
//!
//! | step | statement |
//! | --- | --- |
//! | claim | a live row is returned as it is (a replay or an in-flight answer reads and writes nothing); otherwise `INSERT … ON CONFLICT (key) DO UPDATE … WHERE` the row found has expired |
//! | complete | `INSERT … ON CONFLICT (key) DO UPDATE` to done, only where the row has expired or is pending under the caller's token; when written, `DELETE` the key's steps |
//! | release | `DELETE` where the row is pending under the caller's token and live |
//! | renew | `UPDATE expires_at` where the row is pending under the caller's token and live; then the key's live steps keep their retention past the new lease |
//! | forget | `DELETE` the live row, done or (when asked) pending, and the key's steps, unless a pending row is kept |
//! | record a step | a live step is returned as it is; otherwise `INSERT … ON CONFLICT (key, step) DO UPDATE … WHERE` the step found has expired, expiring its retention after the lease of a pending claim, or after now; the key's other live steps are kept at least as long |
//! | read the steps | `SELECT` the key's live steps |
//!
//! A claim may meet a row its snapshot could not see, when another claim of the same key
//! committed in the meantime. It has then neither inserted nor read anything. It sends the
//! statement once more, with a fresh snapshot, within the same timeout. Only concurrent claims
//! of one key cost that second round trip. Recording a step does the same when it meets a
//! concurrent record of that step: the first record wins.
//!
//! # Expiry and the purge
//!
//! A pending row stops holding its key when its lease ends. A done row stops when its
//! retention ends. From then on a claim takes the row over as if it were absent. Nothing
//! deletes the row by itself. [`PostgresStore::purge`] deletes expired rows in batches of 1000
//! rows, each batch one short statement. Run it now and then, every minute say, from one
//! replica or all.
//!
//! What is kept of a key's steps, and for how long:
//!
//! - **While a claim holds the key**, its steps expire no sooner than their retention after
//!   the end of the lease. Recording a step sets it so, and keeps the key's other live steps
//!   at least as long; each renewal (the engine's, every third of the lease, and the one
//!   before each step) moves them on with the lease, never back. A retention shorter than the
//!   lease, or a long gap between two steps, cannot lose a step that the retry after a crash
//!   needs. The retention is kept in the row, `retention_ms`, for that.
//! - **A released key, or a lapsed lease**, keeps its steps as they were: at least their
//!   retention after the last step recorded and after the lease's end. The next claimant
//!   reads them.
//! - **A completed key** keeps no steps: the complete that writes the record deletes them in
//!   the same statement, and a transactional complete in the same transaction, since the
//!   record answers every repeat. A complete that is refused (another claim holds the key)
//!   leaves them to that claim.
//!
//! A step that has expired stays expired, and a new record of it takes its place. The purge
//! deletes expired steps the same way, after the expired rows.
//!
//! The purge is safe against a concurrent re-claim. It locks the rows it is about to delete
//! with `FOR UPDATE SKIP LOCKED`. So it leaves alone a row that a transaction holds, such as a
//! claim taking over the expired row, committed or not yet. It also checks the expiry again on
//! the row it deletes, in the same statement. So a row claimed again after the purge first
//! looked at it is never deleted.
//!
//! # Failures
//!
//! Every step is bounded by one operation timeout, waiting for a pooled connection included.
//! It is 1 s by default: see [`PostgresStoreBuilder::timeout`]. Errors keep the sqlx error as
//! their source and map to:
//!
//! | failure | [`StoreErrorKind`] |
//! | --- | --- |
//! | the operation timeout, the pool's acquire timeout, `statement_timeout`, `lock_timeout`, an I/O timeout | `Timeout` |
//! | connection refused or lost, the server shutting down, out of disk or connections, a missing table or privilege | `Unavailable` |
//! | an answer that does not decode, a row that breaks the layout | `Protocol` |
//! | a serialization failure (`40001`) or a deadlock (`40P01`) at every try | `Conflict` |
//!
//! The database's default isolation may be `REPEATABLE READ` or `SERIALIZABLE`. Then a step
//! that meets a concurrent transaction's write to its row is rolled back by PostgreSQL, as a
//! serialization failure. It applied nothing, and each step is a transaction of its own. So
//! the store sends it again, with a fresh snapshot, within the same timeout, at most 4 times.
//! A claim that lost to another claim of its key then finds that claim: in flight, or done.
//!
//! The server ends a session for `pg_terminate_backend`, a shutdown, a switchover or an idle
//! timeout. The store closes a connection whose session ended, or that failed on the wire, and
//! never gives it back. In a store made by [`connect`](PostgresStoreBuilder::connect), its idle
//! connections are then checked before their next operation, since what ended one session may have
//! ended them all. An operation cut off this way is sent once more, on a
//! new connection, within the same timeout, when it cannot have been applied twice over:
//!
//! - the server answered that it ended the session (`57P01` `admin_shutdown`, `57P03`, `57P05`
//!   `idle_session_timeout`). It does so between two statements, or within one, rolling it
//!   back, never between a commit and its answer: the operation was not applied. Any operation is sent
//!   again.
//! - the connection was lost with no such answer (an I/O error, a crash of the server): the
//!   operation may have been applied. A complete, a release or a renew is sent again: each is fenced
//!   by its claim's token, so a second send changes nothing the first did. A claim is not: sent
//!   again, it would find its own pending row. It fails, answered 503, and the work does not
//!   run; the store then releases the claim, in case it was applied, so the key is not left
//!   pending until its lease lapses.
//!
//! A claim that fails answers 503 and the work does not run. A step that timed out may still
//! have been applied by the server. A claim may leave the key pending until its lease lapses.
//! A retry gets 409 until then. A complete may have stored the record; a complete sent again
//! after a lost connection answers `false` when the first send stored it.
//!
//! A store made by [`connect`](PostgresStoreBuilder::connect) sets the server's
//! `statement_timeout` to four fifths of the operation timeout. So the server cancels a slow
//! operation, such as one waiting for a lock, and answers `Timeout` while the store still waits,
//! and the connection stays open for the next operation. An operation the store gives up on first is
//! closed mid-exchange, and the next operation opens a new connection.
//!
//! # Bounds
//!
//! As with Redis, nothing bounds what one caller writes. Each record stays until its retention
//! ends and the purge runs. Rate-limit per principal in front of the layer. Size the table for
//! the callers' rates times the retention times a record's size. A response of 89 encoded
//! bytes takes about 430 bytes of row and indexes, growing with the response. See
//! `storage_per_record` in `tests/store/postgres_store.rs`.
//!
//! [`StoreErrorKind`]: crate::store::StoreErrorKind

use super::{Claim, Forgotten, Inspected, StepId, StepRecorded, Store, StoreError, Token};
use crate::store::Fingerprint;
use crate::store::Record;
use crate::store::StoreKey;
use bytes::Bytes;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgPool, PgRow, Postgres};
use sqlx::{Executor, Row};
use std::fmt;
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
use self::sql::{KeyBytes, Statements};

pub use self::builder::PostgresStoreBuilder;
/// The `sqlx` crate this store is built on, for pools, connections and transactions of your
/// own.
pub use ::sqlx;

/// The default table.
pub(crate) const DEFAULT_TABLE: &str = "tower_idempotency";

/// The default bound on one store operation.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The default bound on a transactional claim's wait for a row another transaction holds.
pub(crate) const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(1);

/// The bound on making the first connection in [`PostgresStore::connect`].
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Rows one purge statement deletes at most.
pub(crate) const PURGE_BATCH: i64 = 1000;

/// Claims sent for one step at most. A claim is sent again only when it raced another claim of
/// the same key. The same bound holds for recording a step of the work.
pub(crate) const CLAIM_ATTEMPTS: usize = 4;

/// Times a step is sent at most when PostgreSQL keeps rolling it back for concurrent
/// transactions. Each try is its own transaction, with a fresh snapshot.
const CONFLICT_ATTEMPTS: usize = 4;

/// An idempotency [`Store`] in a PostgreSQL table, over a sqlx [`PgPool`].
///
/// Made by [`PostgresStore::builder`], or by the shortcuts [`PostgresStore::connect`] and
/// [`PostgresStore::new`] with the default settings. Cheap to clone: clones share the pool.
/// See the [module docs](self) for the table, the statements and the purge.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    /// The steps' own connections, in a store made by `connect`. Otherwise the steps take
    /// connections from `pool`.
    steps: Option<Arc<Connections>>,
    prefix: [u8; 8],
    pub(crate) sql: Arc<Statements>,
    pub(crate) timeout: Duration,
    pub(crate) lock_timeout: Duration,
}

impl PostgresStore {
    /// The PostgreSQL store behind `store`: itself, in an `Arc`, or behind the routes' type
    /// erasure.
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
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.sql.table)
            .field("timeout", &self.timeout)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A builder for a store keeping its records under `prefix`: set the table, the
    /// operation timeout or the transactional lock wait. Then connect, or build over a pool.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_idempotency::store::postgres::PostgresStore;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = PostgresStore::builder("orders")
    ///     .timeout(Duration::from_millis(250))
    ///     .connect("postgres://app@127.0.0.1/app")
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn builder(prefix: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(prefix)
    }

    /// Connects to the PostgreSQL at `url` with the default settings. A shortcut for
    /// `PostgresStore::builder(prefix).connect(url)`; see [`PostgresStoreBuilder::connect`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty, with a [`ConfigError`] as source. The same when the
    /// URL is invalid or the server cannot be reached. `Timeout` when connecting takes longer than
    /// 5 s.
    ///
    /// [`ConfigError`]: crate::ConfigError
    pub async fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        Self::builder(prefix).connect(url).await
    }

    /// A store over an existing pool with the default settings, keeping records under
    /// `prefix`. A shortcut for `PostgresStore::builder(prefix).build(pool)`.
    ///
    /// ```no_run
    /// use tower_idempotency::store::postgres::{PostgresStore, sqlx::PgPool};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = PgPool::connect("postgres://app@127.0.0.1/app").await?;
    /// let store = PostgresStore::new(pool, "orders")?;
    /// # let _ = store; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`](crate::ConfigError) when `prefix` is empty.
    pub fn new(pool: PgPool, prefix: &str) -> Result<Self, crate::ConfigError> {
        Self::builder(prefix).build(pool)
    }

    /// The pool: the one given to [`new`](Self::new) or [`build`](PostgresStoreBuilder::build),
    /// whose connections the steps take. For a store made by
    /// [`connect`](PostgresStoreBuilder::connect), a pool for `migrate`, `purge` and your own
    /// statements, beside the steps' own connections.
    #[must_use]
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The table. See [`PostgresStoreBuilder::table`].
    #[must_use]
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The operation timeout. See [`PostgresStoreBuilder::timeout`].
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The transactional claim's lock wait. See [`PostgresStoreBuilder::lock_timeout`].
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

    /// A connection for one operation: a new one when `fresh` (the store's own connections only).
    async fn take(&self, fresh: bool) -> Result<Leased<'_>, OpError> {
        match &self.steps {
            Some(own) => own.take(fresh).await.map(Leased::Own),
            None => self.pool.acquire().await.map(Leased::Pool),
        }
        .map_err(OpError::Connect)
    }

    /// Runs one operation under the operation timeout; `send(fresh)` sends it once. PostgreSQL may
    /// roll an operation back for a concurrent transaction: a serialization failure or a deadlock. Such
    /// an operation applied nothing. It is sent again, up to [`CONFLICT_ATTEMPTS`] times in all, within
    /// the same timeout.
    ///
    /// An operation whose connection was lost is sent once more, on a new connection, when it was not
    /// applied, or when `repeat` says that sending it twice does what once does.
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

    /// [`bounded`](Self::bounded), its failure kept as an [`OpError`].
    async fn bounded_op<T, F, Fut>(&self, repeat: Repeat, mut send: F) -> Result<T, OpError>
    where
        F: FnMut(bool) -> Fut,
        Fut: Future<Output = Result<T, OpError>>,
    {
        let tries = async {
            let (mut sent, mut fresh) = (1, false);
            loop {
                match send(fresh).await {
                    Err(e) if e.is_conflict() && sent < CONFLICT_ATTEMPTS => sent += 1,
                    Err(e)
                        if !fresh
                            && e.lost_connection()
                            && (e.unapplied() || repeat == Repeat::Safe) =>
                    {
                        fresh = true;
                    }
                    done => return done,
                }
            }
        };
        tokio::time::timeout(self.timeout, tries).await?
    }

    /// One claim statement: `None` when it raced a claim its snapshot could not see.
    pub(crate) async fn claim_once<'e, E>(
        &self,
        executor: E,
        key: &KeyBytes,
        fingerprint: &Fingerprint,
        token: &Token,
        lease: i64,
    ) -> Result<Option<ClaimRow>, OpError>
    where
        E: Executor<'e, Database = Postgres>,
    {
        let row = sqlx::query(sql::statement(&self.sql.claim))
            .bind(&key[..])
            .bind(&fingerprint.as_bytes()[..])
            .bind(&token.as_bytes()[..])
            .bind(lease)
            .fetch_optional(executor)
            .await?;
        row.as_ref().map(ClaimRow::read).transpose()
    }

    /// Records a step of the work on `conn`, which may be inside a transaction. The statement
    /// is sent again when it raced a record of the same step its snapshot could not see.
    /// `None` when it kept racing.
    pub(crate) async fn record_step_on(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        step: &StepId,
        value: &[u8],
        retention: Duration,
    ) -> Result<Option<StepRecorded>, OpError> {
        let key = self.row_key(key);
        let retention = sql::millis(retention);
        for _ in 0..CLAIM_ATTEMPTS {
            let row = sqlx::query(sql::statement(&self.sql.record_step))
                .bind(&key[..])
                .bind(&step.as_bytes()[..])
                .bind(value)
                .bind(retention)
                .fetch_optional(&mut *conn)
                .await?;
            if let Some(row) = row {
                return Ok(Some(match row.try_get::<Option<Vec<u8>>, _>(0)? {
                    None => StepRecorded::Recorded,
                    Some(first) => StepRecorded::Found(Bytes::from(first)),
                }));
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
    Pool(PoolConnection<Postgres>),
}

impl Leased<'_> {
    fn conn(&mut self) -> &mut PgConnection {
        match self {
            Self::Own(taken) => &mut taken.conn,
            Self::Pool(pooled) => pooled,
        }
    }

    /// Gives the connection back after a step that failed with `failure`, if it did. A pool's
    /// connection goes back to its pool, which decides.
    /// A connection the server or the network ended is closed, never given back.
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
    state: i8,
    fingerprint: Option<Vec<u8>>,
    record: Option<Vec<u8>>,
}

impl ClaimRow {
    fn read(row: &PgRow) -> Result<Self, OpError> {
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

impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let token = Token::generate()?;
        let (row_key, sent) = (self.row_key(key), &token);
        let lease = sql::millis(lease);
        let row = self
            .bounded_op(Repeat::Unsafe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let mut found = Ok(None);
                for _ in 0..CLAIM_ATTEMPTS {
                    found = self
                        .claim_once(conn.conn(), &row_key, fingerprint, sent, lease)
                        .await;
                    if !matches!(found, Ok(None)) {
                        break;
                    }
                }
                conn.give_back(found.as_ref().err());
                found
            })
            .await;
        let row = match row {
            Ok(row) => row,
            Err(e) => {
                // The claim may have taken the key, on a connection lost before its answer. It
                // fails, and its work does not run: the key goes back, rather than staying
                // pending until the lease lapses.
                if e.lost_connection() && !e.unapplied() {
                    let released = self.release(key, &token).await;
                    tracing::debug!(?released, "released a claim whose answer was lost");
                }
                return Err(e.into_store("PostgreSQL claim"));
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
        let done = self
            .bounded("PostgreSQL complete", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let done = sqlx::query(sql::statement(&self.sql.complete))
                    .bind(&key[..])
                    .bind(&token.as_bytes()[..])
                    .bind(&fingerprint.as_bytes()[..])
                    .bind(&record[..])
                    .bind(sql::millis(retention))
                    .fetch_optional(conn.conn())
                    .await;
                conn.give_back_sql(done.as_ref().err());
                Ok(done?)
            })
            .await?;
        Ok(done.is_some())
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let deleted = self
            .bounded("PostgreSQL release", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let deleted = sqlx::query(sql::statement(&self.sql.release))
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
        let found = self
            .bounded("PostgreSQL forget", Repeat::Unsafe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let row = sqlx::query(sql::statement(&self.sql.forget))
                    .bind(&key[..])
                    .bind(pending)
                    .fetch_optional(conn.conn())
                    .await;
                conn.give_back_sql(row.as_ref().err());
                match row? {
                    None => Ok(None),
                    Some(r) => Ok(Some((r.try_get::<i8, _>(0)?, r.try_get::<bool, _>(1)?))),
                }
            })
            .await?;
        match found {
            None => Ok(Forgotten::Nothing),
            Some((sql::DONE, _)) => Ok(Forgotten::Record),
            Some((sql::PENDING, true)) => Ok(Forgotten::Pending),
            Some((sql::PENDING, false)) => Ok(Forgotten::KeptPending),
            Some(_) => Err(protocol("unexpected row state in forget")),
        }
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let renewed = self
            .bounded("PostgreSQL renew", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let renewed = sqlx::query(sql::statement(&self.sql.renew))
                    .bind(&key[..])
                    .bind(&token.as_bytes()[..])
                    .bind(sql::millis(lease))
                    .fetch_optional(conn.conn())
                    .await;
                conn.give_back_sql(renewed.as_ref().err());
                Ok(renewed?)
            })
            .await?;
        Ok(renewed.is_some())
    }

    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        let value = &value;
        let recorded = self
            .bounded(
                "PostgreSQL record step",
                Repeat::Unsafe,
                |fresh| async move {
                    let mut conn = self.take(fresh).await?;
                    let recorded = self
                        .record_step_on(conn.conn(), key, step, value, retention)
                        .await;
                    conn.give_back(recorded.as_ref().err());
                    recorded
                },
            )
            .await?;
        recorded.ok_or_else(|| protocol("recording a step kept racing concurrent records"))
    }

    /// One `SELECT`: a plain read takes no row lock, so it waits on no claim in progress.
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let key = self.row_key(key);
        let found = self
            .bounded("PostgreSQL inspect", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let row = sqlx::query(sql::statement(&self.sql.inspect))
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
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
        // The row is never `C`, the answer of a claim that took the key: no token is asked for.
        Inspected::of(row.into_claim(Token::from_bytes([0; 16]))?, left)
    }

    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        let key = self.row_key(key);
        let rows = self
            .bounded("PostgreSQL steps", Repeat::Safe, |fresh| async move {
                let mut conn = self.take(fresh).await?;
                let rows = sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(sql::statement(&self.sql.steps))
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
