//! A SQLite store: records in a file, kept through a restart, for a service on one machine.
//!
//! ```
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::store::sqlite::SqliteStore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("ti-doc-module-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! # let path = dir.join("idempotency.db");
//! // A file of its own, such as "/var/lib/orders/idempotency.db".
//! let store = SqliteStore::open(&path, "orders").await?;
//! store.migrate().await?; // creates the tables when they do not exist
//! let engine = Engine::new(store.clone()); // give it to any door
//!
//! // Expired rows stay until purged: purge now and then.
//! tokio::spawn(async move {
//!     let mut every = tokio::time::interval(std::time::Duration::from_secs(60));
//!     loop {
//!         every.tick().await;
//!         if let Err(e) = store.purge().await {
//!             eprintln!("idempotency purge failed: {e}");
//!         }
//!     }
//! });
//! # let _ = engine; std::fs::remove_dir_all(&dir)?; Ok(()) }
//! ```
//!
//! [`SqliteStore`] keeps records in a table of a SQLite file. A completed record survives a
//! restart of the process, and a crash: a new process that opens the file answers the repeat
//! from it. Several processes on one machine may open the same file; they share its records.
//! It serves the HTTP layer and every other door like the other stores. It is also the store
//! of the [transactional door on SQLite](crate::transactional::sqlite), which commits the work
//! and its record in one transaction.
//!
//! # What a crash and a power loss keep
//!
//! A store made by [`SqliteStore::open`] or [`SqliteStoreBuilder::open`] puts the file in
//! write-ahead-log mode (`journal_mode=WAL`): readers never wait for the writer. A commit is
//! acknowledged, and a claim or a record answered, once SQLite has written it:
//!
//! | [`Synchronous`] | `PRAGMA synchronous` | a crash of the process | a power loss or a crash of the OS | cost |
//! | --- | --- | --- | --- | --- |
//! | [`Full`](Synchronous::Full), the default | `FULL` | keeps every acknowledged record | keeps every acknowledged record, where the disk honours `fsync` | one `fsync` of the log per write |
//! | [`Normal`](Synchronous::Normal) | `NORMAL` | keeps every acknowledged record | may lose the records written since the last checkpoint: their repeats run the work again | no `fsync` per write |
//!
//! Either way the file stays consistent: a write is there whole or not at all. A file on a
//! network file system is not supported: SQLite's locks and its log's shared memory need one
//! machine. A failover to another machine keeps what was copied to it, nothing more.
//!
//! # One writer at a time
//!
//! SQLite lets one connection write at a time, over the whole file. Each operation that
//! writes takes that lock first (`BEGIN IMMEDIATE`), so two processes claiming one key meet on
//! it: the second finds the first's claim. Writes are short: each is a few statements in
//! process, with no network between them, and a commit. A claim of a key that a live row
//! holds (a replay, or an in-flight answer) only reads, and takes no lock.
//!
//! The writes of one store and its clones queue in order, in the process, for the lock. A
//! store in another process, or opened a second time, meets them on SQLite's own wait
//! (`busy_timeout`), which polls with growing sleeps. Either wait is bounded by the store's
//! [timeout](SqliteStoreBuilder::timeout), then fails with
//! [`Timeout`](crate::store::StoreErrorKind::Timeout). Writes therefore add up: with the
//! default `FULL`, each commit waits for the disk, and the file takes as many writes a second
//! as the disk takes `fsync`s. Several processes writing one file at that rate wait on each
//! other, and the one that polls may time out. Open one store per process and share its
//! clones.
//!
//! | step | what it does, in one transaction |
//! | --- | --- |
//! | claim | reads the live row: a replay or an in-flight answer writes nothing; otherwise, under the write lock, reads again and inserts the pending row, over an expired one |
//! | complete | writes the record where the row has expired or is pending under the caller's token, then deletes the key's steps |
//! | release | deletes the row where it is pending under the caller's token and live |
//! | renew | extends the lease where the row is pending under the caller's token and live, then keeps the key's live steps their retention past the new lease |
//! | forget | deletes the live row, done or (when asked) pending, and the key's steps, unless a pending row is kept |
//! | record a step | a live step is returned as it is; otherwise it is written, expiring its retention after the lease of a pending claim, or after now; the key's other live steps are kept at least as long |
//! | read the steps | reads the key's live steps |
//!
//! See BENCHMARKS.md in the repository for what the lock and the transaction cost against the
//! same statements sent directly.
//!
//! # Time
//!
//! SQLite has no server clock. Leases and retentions run on the store's clock: the system
//! clock, as milliseconds since the Unix epoch, unless [`SqliteStoreBuilder::clock`] gives
//! another. Every process on one file must read the same time. When two processes' clocks
//! disagree by some amount, the one ahead sees every lease and record end that much early: it
//! may claim a key whose lease the other still counts as held, and run the work a second time,
//! or answer a repeat as new after a record's retention, early by that amount. Keep the clocks
//! synchronised (NTP) to far less than the lease. A clock stepped back makes rows live longer.
//!
//! # The tables
//!
//! [`SqliteStore::migrate`] creates them when they do not exist (`CREATE TABLE IF NOT
//! EXISTS`). It never alters an existing one. This is the DDL for the default table name,
//! `tower_idempotency`, the same that `migrate` runs, with the name of
//! [`SqliteStoreBuilder::table`] in its place:
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
//! **Hashes only.** A row holds no raw key, principal, tenant or namespace. Its key is 8 bytes
//! of a domain-separated SHA-256 of the store's prefix, followed by the [`StoreKey`]. The
//! fingerprint is a SHA-256 of the request, and the token 16 random bytes. The record is the
//! engine's encoding of the response, so it does hold the response. See the layer's `status`
//! response mode for bodies that must not rest in a file.
//!
//! # Expiry and the purge
//!
//! A pending row stops holding its key when its lease ends, a done row when its retention
//! ends. From then on a claim takes the row over as if it were absent. Nothing deletes the
//! row by itself. [`SqliteStore::purge`] deletes expired rows, then expired steps, in batches
//! of 1000 rows, each batch one statement under the write lock. A second purge at the same
//! time, from this process or another, waits for the lock and deletes what is left: a row is
//! deleted once. Each batch picks and deletes its rows in one statement, so a row claimed
//! again since it expired is never deleted. Steps are kept as the
//! [PostgreSQL store](crate::store::postgres) keeps them: while a claim holds their key, and
//! after a release or a lapsed lease, until their retention ends; a completed key keeps none.
//!
//! # Failures
//!
//! Every step is bounded by one operation timeout, 1 s by default, waiting for a pooled
//! connection and for the write lock included. Errors keep the sqlx error as their source and
//! map to:
//!
//! | failure | [`StoreErrorKind`] |
//! | --- | --- |
//! | the operation timeout, the pool's acquire timeout, the write lock held past the busy timeout (`SQLITE_BUSY`, `SQLITE_LOCKED`) | `Timeout` |
//! | a file that cannot be opened or written, out of disk, read-only, a missing table | `Unavailable` |
//! | a file that is not a database, or corrupt; an answer that does not decode | `Protocol` |
//!
//! A claim that fails answers 503 and the work does not run. A claim that timed out may still
//! have been applied: the store then releases it, so the key is not left pending until its
//! lease lapses. A complete that timed out may have stored the record.
//!
//! [`StoreErrorKind`]: crate::store::StoreErrorKind

use super::clock::Clock;
use super::{Claim, Forgotten, Inspected, StepId, StepRecorded, Store, StoreError, Token};
use crate::error::ConfigError;
use crate::store::{Fingerprint, Record, StoreErrorKind, StoreKey};
use bytes::Bytes;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Row};
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

mod error;
pub(crate) mod sql;

pub(crate) use self::error::{OpError, protocol};
use self::sql::{KeyBytes, Statements};

/// The `sqlx` crate this store is built on, for pools, connections and transactions of your
/// own.
pub use ::sqlx;

/// The default table.
const DEFAULT_TABLE: &str = "tower_idempotency";
/// The default bound on one store operation.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The default bound on a transactional claim's wait for the write lock.
const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// The bound on opening the file in [`SqliteStoreBuilder::open`].
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections of a pool made by [`SqliteStoreBuilder::open`]: readers run side by side, one
/// writer at a time.
const POOL_SIZE: u32 = 4;
/// Rows one purge statement deletes at most.
const PURGE_BATCH: i64 = 1000;

/// How much of the last writes a power loss may lose: SQLite's `PRAGMA synchronous` in
/// write-ahead-log mode. See [what a crash and a power loss keep](self#what-a-crash-and-a-power-loss-keep).
///
/// ```
/// use tower_idempotency::store::sqlite::{SqliteStore, Synchronous};
///
/// assert_eq!(Synchronous::default(), Synchronous::Full);
/// let faster = SqliteStore::builder("orders").synchronous(Synchronous::Normal);
/// # let _ = faster;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL`: each commit waits for an `fsync` of the log. An acknowledged record survives a
    /// crash of the process and a power loss. The default.
    #[default]
    Full,
    /// `NORMAL`: commits do not wait for the disk. An acknowledged record survives a crash of
    /// the process; a power loss or a crash of the OS may lose the records written since the
    /// last checkpoint, and their repeats run the work again. Faster: see BENCHMARKS.md.
    Normal,
}

/// The system clock as time since the Unix epoch: a start every process on a file shares.
#[derive(Debug, Clone, Copy)]
struct WallClock;

impl Clock for WallClock {
    fn now(&self) -> Duration {
        // A clock before 1970 reads as the epoch: rows then live longer, never shorter.
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
    }
}

/// An idempotency [`Store`] in a table of a SQLite file, over a sqlx [`SqlitePool`].
///
/// Made by [`SqliteStore::builder`], or by the shortcuts [`SqliteStore::open`] and
/// [`SqliteStore::new`] with the default settings. Cheap to clone: clones share the pool.
/// See the [module docs](self) for what it keeps, the tables and the purge.
#[derive(Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    prefix: [u8; 8],
    pub(crate) sql: Arc<Statements>,
    pub(crate) timeout: Duration,
    pub(crate) lock_timeout: Duration,
    clock: Arc<dyn Clock>,
    /// The store's writes in this process queue here, in order, for the file's one write
    /// lock: SQLite's own wait polls with growing sleeps, and a writer can lose the lock to
    /// newcomers for its whole timeout.
    writer: Arc<tokio::sync::Mutex<()>>,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("table", &self.sql.table)
            .field("timeout", &self.timeout)
            .field("lock_timeout", &self.lock_timeout)
            .finish_non_exhaustive()
    }
}

/// Builds a [`SqliteStore`]. It is made by [`SqliteStore::builder`], and each setter names its
/// setting. The store opens its file with [`open`](Self::open), or is built over a pool with
/// [`build`](Self::build).
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::store::sqlite::{SqliteStore, Synchronous};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let dir = std::env::temp_dir().join(format!("ti-doc-builder-{}", std::process::id()));
/// # std::fs::create_dir_all(&dir)?;
/// let store = SqliteStore::builder("orders")
///     .table("idempotency")
///     .timeout(Duration::from_millis(500))
///     .synchronous(Synchronous::Normal) // faster; a power loss may lose the last records
///     .open(dir.join("idempotency.db"))
///     .await?;
/// assert_eq!(store.table(), "idempotency");
/// assert_eq!(store.timeout(), Duration::from_millis(500));
/// # std::fs::remove_dir_all(&dir)?; Ok(()) }
/// ```
#[must_use]
#[derive(Clone)]
pub struct SqliteStoreBuilder {
    /// The prefix's hash, or why it was refused. The terminal method reports it.
    prefix: Result<[u8; 8], ConfigError>,
    table: String,
    timeout: Duration,
    lock_timeout: Duration,
    synchronous: Synchronous,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for SqliteStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStoreBuilder")
            .field("table", &self.table)
            .field("timeout", &self.timeout)
            .field("lock_timeout", &self.lock_timeout)
            .field("synchronous", &self.synchronous)
            .finish_non_exhaustive()
    }
}

impl SqliteStoreBuilder {
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
            synchronous: Synchronous::default(),
            clock: Arc::new(WallClock),
        }
    }

    /// The table the records live in: a lowercase identifier of at most 48 bytes. Default:
    /// `tower_idempotency`. Anything else is refused when the store is built, with a
    /// [`ConfigError`] of kind [`InvalidName`](crate::ConfigErrorKind::InvalidName). The
    /// store's SQL quotes it, so an SQL keyword such as `order` names its table like any other
    /// word. [`SqliteStore::migrate`] creates it.
    pub fn table(mut self, table: &str) -> Self {
        table.clone_into(&mut self.table);
        self
    }

    /// Bounds every store step to `timeout`, waiting for a pooled connection and for the
    /// write lock included. A step that takes longer fails with
    /// [`StoreErrorKind::Timeout`]. Default: 1 s. At least 1 ms. A pool made by
    /// [`open`](Self::open) sets SQLite's `busy_timeout` to it.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// How long a claim of [`transactional::sqlite::within`] waits for the write lock, which
    /// another transaction holds, before it answers "in flight". Default: 1 s. At least 1 ms.
    ///
    /// [`transactional::sqlite::within`]: crate::transactional::sqlite::within
    pub fn lock_timeout(mut self, lock_timeout: Duration) -> Self {
        self.lock_timeout = lock_timeout.max(Duration::from_millis(1));
        self
    }

    /// How much of the last writes a power loss may lose. Default: [`Synchronous::Full`],
    /// which loses nothing acknowledged. Set by [`open`](Self::open) on each connection.
    pub fn synchronous(mut self, synchronous: Synchronous) -> Self {
        self.synchronous = synchronous;
        self
    }

    /// The clock of leases and retentions. Default: the system clock, as time since the Unix
    /// epoch. Every process on one file must read the same time from its clock: see
    /// [Time](self#time). Give a [`ManualClock`](crate::store::clock::ManualClock) in tests.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// The store over an existing pool, whose settings are kept as given. Open its connections
    /// in write-ahead-log mode with `synchronous` `FULL` (or `NORMAL`, knowing what a power loss
    /// may then lose), and a `busy_timeout` of about the store's [timeout](Self::timeout), as
    /// [`open`](Self::open) does.
    ///
    /// # Errors
    /// A [`ConfigError`] when the prefix is empty or the table name is not accepted.
    pub fn build(self, pool: SqlitePool) -> Result<SqliteStore, ConfigError> {
        let prefix = self.prefix?;
        sql::check_table(&self.table)?;
        Ok(SqliteStore {
            pool,
            prefix,
            sql: Arc::new(Statements::new(&self.table)),
            timeout: self.timeout,
            lock_timeout: self.lock_timeout,
            clock: self.clock,
            writer: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// Opens the SQLite file at `path`, creating it when missing, in write-ahead-log mode,
    /// with the [`synchronous`](Self::synchronous) setting and a `busy_timeout` of the store's
    /// [timeout](Self::timeout). The pool holds up to 4 connections.
    ///
    /// # Errors
    /// `Unavailable` when a setting is refused, with a [`ConfigError`] as source. The same when
    /// the file cannot be opened or created. `Timeout` when opening takes longer than 5 s.
    pub async fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        let invalid = |e: ConfigError| {
            StoreError::with_source(StoreErrorKind::Unavailable, "invalid setting", e)
        };
        self.prefix.clone().map_err(invalid)?;
        sql::check_table(&self.table).map_err(invalid)?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match self.synchronous {
                Synchronous::Full => SqliteSynchronous::Full,
                Synchronous::Normal => SqliteSynchronous::Normal,
            })
            .busy_timeout(self.timeout);
        // One connection first, for SQLite's own answer: a pool would report only that it
        // timed out. It sets the file's log mode, once.
        let first = tokio::time::timeout(CONNECT_TIMEOUT, SqliteConnection::connect_with(&options))
            .await
            .map_err(|e| OpError::from(e).into_store("opening the SQLite file timed out"))?
            .map_err(|e| OpError::from(e).into_store("opening the SQLite file failed"))?;
        let _ = first.close().await;
        let pool = SqlitePoolOptions::new()
            .max_connections(POOL_SIZE)
            .acquire_timeout(self.timeout.max(CONNECT_TIMEOUT))
            .connect_lazy_with(options);
        self.build(pool).map_err(invalid)
    }
}

impl SqliteStore {
    /// A builder for a store keeping its records under `prefix`: set the table, the operation
    /// timeout, the durability or the clock. Then open a file, or build over a pool.
    pub fn builder(prefix: &str) -> SqliteStoreBuilder {
        SqliteStoreBuilder::new(prefix)
    }

    /// Opens the SQLite file at `path` with the default settings. A shortcut for
    /// `SqliteStore::builder(prefix).open(path)`; see [`SqliteStoreBuilder::open`].
    ///
    /// # Errors
    /// `Unavailable` when the prefix is empty, with a [`ConfigError`] as source. The same when
    /// the file cannot be opened or created. `Timeout` when opening takes longer than 5 s.
    pub async fn open(path: impl AsRef<Path>, prefix: &str) -> Result<Self, StoreError> {
        Self::builder(prefix).open(path).await
    }

    /// A store over an existing pool with the default settings, keeping records under
    /// `prefix`. A shortcut for `SqliteStore::builder(prefix).build(pool)`.
    ///
    /// ```
    /// use tower_idempotency::store::sqlite::{SqliteStore, sqlx::SqlitePool};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = SqlitePool::connect("sqlite::memory:").await?; // or "sqlite://app.db?mode=rwc"
    /// let store = SqliteStore::new(pool, "orders")?;
    /// store.migrate().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// A [`ConfigError`] when `prefix` is empty.
    pub fn new(pool: SqlitePool, prefix: &str) -> Result<Self, ConfigError> {
        Self::builder(prefix).build(pool)
    }

    /// The pool, for `migrate`, `purge`, the transactional door and your own statements.
    #[must_use]
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// The table. See [`SqliteStoreBuilder::table`].
    #[must_use]
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The operation timeout. See [`SqliteStoreBuilder::timeout`].
    #[must_use]
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The transactional claim's lock wait. See [`SqliteStoreBuilder::lock_timeout`].
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

    /// Creates the tables and their indexes when they do not exist. The DDL is in the
    /// [module docs](self#the-tables). An existing table is left as it is. Safe to call from
    /// every process at start-up: the DDL runs in one transaction under the write lock.
    ///
    /// # Errors
    /// SQLite's error: `Unavailable` for a file that cannot be written.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let run = async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            for statement in self
                .sql
                .schema
                .split_terminator(";\n")
                .chain(self.sql.steps_schema.split_terminator(";\n"))
            {
                sqlx::query(sql::statement(statement))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok::<_, OpError>(())
        };
        run.await.map_err(|e| e.into_store("SQLite migrate"))
    }

    /// Deletes the rows whose lease or retention has ended, in statements of at most 1000
    /// rows, until none is left. Then the same for expired steps. Returns how many rows it
    /// deleted, steps included.
    ///
    /// Each statement runs under the write lock, bounded by the store's operation timeout. A
    /// purge beside another, in this process or another, deletes each row once. A row claimed
    /// again is never deleted. See the [module docs](self#expiry-and-the-purge).
    ///
    /// # Errors
    /// SQLite's error. The batches before it stay deleted.
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
                .bounded("SQLite purge", async {
                    let _writer = self.writer.lock().await;
                    Ok(sqlx::query(sql::statement(purge))
                        .bind(self.now())
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

    /// The store's time, in ms: the unit of `expires_at`.
    pub(crate) fn now(&self) -> i64 {
        sql::at(self.clock.now())
    }

    /// The SQLite store behind `store`: itself, in an `Arc`, or behind the routes' type
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
    /// file. Another prefix writes under keys of its own, which this store never reads.
    pub(crate) fn same_records(&self, other: &Self) -> bool {
        let (a, b) = (self.pool.connect_options(), other.pool.connect_options());
        self.prefix == other.prefix
            && self.sql.table == other.sql.table
            && a.get_filename() == b.get_filename()
    }

    /// Runs one operation under the operation timeout.
    async fn bounded<T>(
        &self,
        op: &'static str,
        run: impl Future<Output = Result<T, OpError>>,
    ) -> Result<T, StoreError> {
        self.bounded_op(run).await.map_err(|e| e.into_store(op))
    }

    async fn bounded_op<T>(
        &self,
        run: impl Future<Output = Result<T, OpError>>,
    ) -> Result<T, OpError> {
        tokio::time::timeout(self.timeout, run).await?
    }

    /// The live row of `key`, read on `conn`, as the claim's answer; `None` when nothing live
    /// holds the key.
    pub(crate) async fn live_on(
        &self,
        conn: &mut SqliteConnection,
        key: &KeyBytes,
        now: i64,
    ) -> Result<Option<Claim>, OpError> {
        let row = sqlx::query(sql::statement(&self.sql.live))
            .bind(&key[..])
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
        Ok(row.as_ref().map(live_claim).transpose()?)
    }

    /// Claims `key` on `conn`, which holds the write lock: the live row's answer, or the key
    /// taken under `token`.
    pub(crate) async fn claim_locked(
        &self,
        conn: &mut SqliteConnection,
        key: &KeyBytes,
        fingerprint: &Fingerprint,
        token: Token,
        lease: Duration,
    ) -> Result<Claim, OpError> {
        let now = self.now();
        if let Some(found) = self.live_on(conn, key, now).await? {
            return Ok(found);
        }
        sqlx::query(sql::statement(&self.sql.take))
            .bind(&key[..])
            .bind(now)
            .bind(&fingerprint.as_bytes()[..])
            .bind(&token.as_bytes()[..])
            .bind(sql::millis(lease))
            .execute(&mut *conn)
            .await?;
        Ok(Claim::Claimed(token))
    }

    /// Records a step of the work on `conn`, which holds the write lock (a transaction begun
    /// with `BEGIN IMMEDIATE`, or a write in it).
    pub(crate) async fn record_step_on(
        &self,
        conn: &mut SqliteConnection,
        key: &StoreKey,
        step: &StepId,
        value: &[u8],
        retention: Duration,
    ) -> Result<StepRecorded, OpError> {
        let key = self.row_key(key);
        let now = self.now();
        // A completed key keeps no steps: its record answers every repeat.
        let done = sqlx::query(sql::statement(&self.sql.done))
            .bind(&key[..])
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
        if done.is_some() {
            return Ok(StepRecorded::Recorded);
        }
        let live: Option<Vec<u8>> = sqlx::query_scalar(sql::statement(&self.sql.live_step))
            .bind(&key[..])
            .bind(&step.as_bytes()[..])
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
        if let Some(first) = live {
            return Ok(StepRecorded::Found(Bytes::from(first)));
        }
        let lease_end: Option<i64> = sqlx::query_scalar(sql::statement(&self.sql.lease_end))
            .bind(&key[..])
            .bind(now)
            .fetch_optional(&mut *conn)
            .await?;
        let retention = sql::millis(retention);
        let expires = lease_end.unwrap_or(now).max(now).saturating_add(retention);
        sqlx::query(sql::statement(&self.sql.put_step))
            .bind(&key[..])
            .bind(&step.as_bytes()[..])
            .bind(expires)
            .bind(value)
            .bind(retention)
            .execute(&mut *conn)
            .await?;
        sqlx::query(sql::statement(&self.sql.refresh_steps))
            .bind(&key[..])
            .bind(&step.as_bytes()[..])
            .bind(now)
            .bind(expires)
            .execute(&mut *conn)
            .await?;
        Ok(StepRecorded::Recorded)
    }
}

/// A live row `(state, fingerprint, record)` as a claim's answer.
fn live_claim(row: &SqliteRow) -> Result<Claim, StoreError> {
    let state: String = row
        .try_get(0)
        .map_err(|_| protocol("a row without a state"))?;
    let fingerprint: Vec<u8> = row
        .try_get(1)
        .map_err(|_| protocol("a row without a fingerprint"))?;
    let fingerprint = <[u8; 32]>::try_from(fingerprint)
        .map(Fingerprint::from_bytes)
        .map_err(|_| protocol("a row without a 32-byte fingerprint"))?;
    match state.as_str() {
        "P" => Ok(Claim::Pending { fingerprint }),
        "D" => {
            let record: Option<Vec<u8>> = row
                .try_get(2)
                .map_err(|_| protocol("a done row without a record"))?;
            let record = record.ok_or_else(|| protocol("a done row without a record"))?;
            Ok(Claim::Done {
                fingerprint,
                record: Record::from_bytes(Bytes::from(record)),
            })
        }
        _ => Err(protocol("a row in an unknown state")),
    }
}

impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let token = Token::generate()?;
        let row_key = &self.row_key(key);
        let sent = token.clone();
        let claimed = self
            .bounded_op(async move {
                // A replay or an in-flight answer only reads: no write lock.
                let mut conn = self.pool.acquire().await?;
                if let Some(found) = self.live_on(&mut conn, row_key, self.now()).await? {
                    return Ok(found);
                }
                drop(conn);
                let _writer = self.writer.lock().await;
                let mut conn = self.pool.acquire().await?;
                let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
                let claim = self
                    .claim_locked(&mut tx, row_key, fingerprint, sent, lease)
                    .await?;
                tx.commit().await?;
                Ok(claim)
            })
            .await;
        match claimed {
            Ok(claim) => Ok(claim),
            Err(e) => {
                // The claim may have committed before the store gave up on it. Its work does
                // not run: the key goes back, rather than staying pending until the lease lapses.
                if e.timed_out() {
                    let released = self.release(key, &token).await;
                    tracing::debug!(?released, "released a claim that timed out");
                }
                Err(e.into_store("SQLite claim"))
            }
        }
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
        let record = record.into_bytes();
        let retention = sql::millis(retention);
        self.bounded("SQLite complete", async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let written = sqlx::query(sql::statement(&self.sql.complete))
                .bind(&key[..])
                .bind(self.now())
                .bind(&token.as_bytes()[..])
                .bind(&fingerprint.as_bytes()[..])
                .bind(&record[..])
                .bind(retention)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            // A written record answers every repeat: the key's steps go with it.
            if written {
                sqlx::query(sql::statement(&self.sql.free_steps))
                    .bind(&key[..])
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(written)
        })
        .await
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        self.bounded("SQLite release", async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let deleted = sqlx::query(sql::statement(&self.sql.release))
                .bind(&key[..])
                .bind(self.now())
                .bind(&token.as_bytes()[..])
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok(deleted.rows_affected() == 1)
        })
        .await
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        let key = self.row_key(key);
        self.bounded("SQLite forget", async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let state: Option<String> = sqlx::query_scalar(sql::statement(&self.sql.state))
                .bind(&key[..])
                .bind(self.now())
                .fetch_optional(&mut *tx)
                .await?;
            let forgotten = match state.as_deref() {
                None => Forgotten::Nothing,
                Some("D") => Forgotten::Record,
                Some("P") if pending => Forgotten::Pending,
                Some("P") => Forgotten::KeptPending,
                Some(_) => return Err(protocol("a row in an unknown state").into()),
            };
            if matches!(forgotten, Forgotten::Record | Forgotten::Pending) {
                sqlx::query(sql::statement(&self.sql.delete))
                    .bind(&key[..])
                    .execute(&mut *tx)
                    .await?;
            }
            // A pending claim that is kept keeps its steps: its work may need them.
            if !matches!(forgotten, Forgotten::KeptPending) {
                sqlx::query(sql::statement(&self.sql.free_steps))
                    .bind(&key[..])
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(forgotten)
        })
        .await
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        let key = self.row_key(key);
        let lease = sql::millis(lease);
        self.bounded("SQLite renew", async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let now = self.now();
            let renewed = sqlx::query(sql::statement(&self.sql.renew))
                .bind(&key[..])
                .bind(now)
                .bind(&token.as_bytes()[..])
                .bind(lease)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            // The key's live steps last their retention past the new lease: a crash's retry
            // comes after it.
            if renewed {
                sqlx::query(sql::statement(&self.sql.keep_steps))
                    .bind(&key[..])
                    .bind(now)
                    .bind(now.saturating_add(lease))
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await?;
            Ok(renewed)
        })
        .await
    }

    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        self.bounded("SQLite record step", async {
            let _writer = self.writer.lock().await;
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let recorded = self
                .record_step_on(&mut tx, key, step, &value, retention)
                .await?;
            tx.commit().await?;
            Ok(recorded)
        })
        .await
    }

    /// One `SELECT` on the pool, as [`steps`](Self::steps): no write lock, nothing written.
    async fn inspect(&self, key: &StoreKey) -> Result<Inspected, StoreError> {
        let key = self.row_key(key);
        let now = self.now();
        let row = self
            .bounded("SQLite inspect", async {
                Ok(sqlx::query(sql::statement(&self.sql.inspect))
                    .bind(&key[..])
                    .bind(now)
                    .fetch_optional(&self.pool)
                    .await?)
            })
            .await?;
        let Some(row) = row else {
            return Ok(Inspected::Absent);
        };
        let left: i64 = row
            .try_get(3)
            .map_err(|_| protocol("a row without an expiry"))?;
        let left = Duration::from_millis(u64::try_from(left).unwrap_or(0));
        Inspected::of(live_claim(&row)?, left)
    }

    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        let key = self.row_key(key);
        let now = self.now();
        let rows = self
            .bounded("SQLite steps", async {
                Ok(
                    sqlx::query_as::<_, (Vec<u8>, Vec<u8>)>(sql::statement(&self.sql.steps))
                        .bind(&key[..])
                        .bind(now)
                        .fetch_all(&self.pool)
                        .await?,
                )
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
