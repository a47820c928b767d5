//! Transactional: the work and its record committed in one PostgreSQL transaction; in one
//! MySQL or MariaDB transaction with [`mysql`] (feature `mysql`); in one SQLite transaction
//! with [`sqlite`] (feature `sqlite`).
//!
//! ```no_run
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
//! use tower_idempotency::store::postgres::PostgresStore;
//! use tower_idempotency::store::postgres::sqlx::{self, PgPool};
//! use tower_idempotency::transactional::{Within, within};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPool::connect("postgres://app@127.0.0.1/app").await?;
//! let engine = Engine::new(PostgresStore::new(pool.clone(), "orders")?);
//! engine.store().migrate().await?;
//!
//! let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1")?);
//! let fingerprint = Fingerprint::builder().field(b"POST /orders").field(b"{\"sku\":\"X\"}").finish();
//!
//! let mut conn = pool.acquire().await?;
//! let outcome = within(&engine, &mut conn, key, fingerprint, |tx| {
//!     Box::pin(async move {
//!         let id: i64 = sqlx::query_scalar("INSERT INTO orders (sku) VALUES ('X') RETURNING id")
//!             .fetch_one(&mut *tx)
//!             .await?;
//!         let body = format!(r#"{{"id":{id}}}"#);
//!         Ok::<_, sqlx::Error>(Recorded::new(201, vec![], Some(body.into())))
//!     })
//! })
//! .await?;
//! match outcome {
//!     Within::Recorded(response) | Within::Replayed(response) => println!("{}", response.status),
//!     Within::InFlight => println!("409: the first request is still running"),
//!     Within::KeyReused => println!("422: this key was used for another request"),
//!     other => println!("503: {other:?}"),
//! }
//! # Ok(()) }
//! ```
//!
//! The HTTP layer records a response *after* the handler's work has committed. A crash between
//! the two leaves the work done and no record. The key stays pending until its lease lapses,
//! and a retry after that runs the work again. When the work is writes to the PostgreSQL
//! database that keeps the records, [`within`] closes that window. The claim, the work and the
//! record are one transaction: they commit together or not at all.
//!
//! # How it runs
//!
//! 1. A transaction begins on your connection. On a connection outside a transaction, it is a
//!    transaction of its own. When you pass your own transaction (`&mut *tx`), it is a
//!    savepoint inside it. Then nothing is durable until *you* commit, and your rollback takes
//!    the claim, the work and the record with it.
//! 2. The key is claimed in it: a pending row is inserted, or an expired one taken over. The
//!    row lock this takes is the lease. It lasts exactly as long as the transaction and needs
//!    no renewal. A crash of the process, the connection or the server rolls it back.
//! 3. The work runs on the same transaction. Its `Ok` value is the response to record.
//! 4. The record is written over the claim, and the transaction commits.
//!
//! A repeat that arrives meanwhile meets the row lock:
//!
//! | the first request | the repeat |
//! | --- | --- |
//! | commits within the lock wait ([`PostgresStoreBuilder::lock_timeout`], 1 s by default) | gets [`Within::Replayed`] of the first's record |
//! | runs longer | gets [`Within::InFlight`] once the wait ends (HTTP: 409, retry later) |
//! | rolls back (its work failed, its connection died) | claims the key and runs |
//! | committed earlier | [`Within::Replayed`] at once, or [`Within::KeyReused`] for another request (422) |
//!
//! # Timeouts
//!
//! The claim runs under the store's own bounds. One is the lock wait. The other is a
//! `statement_timeout` of the lock wait plus the store's
//! [timeout](crate::store::postgres::PostgresStoreBuilder::timeout). So the wait always ends
//! first and answers "in flight".
//!
//! The work runs under your connection's settings, put back after the claim. A connection of
//! the store's own pool ([`PostgresStore::connect`]) has the store's timeout as its
//! `statement_timeout`. That bound is lifted for the work, so a slow work is not cut at 1 s.
//! For a bound of your own, run `SET LOCAL statement_timeout` in the work.
//!
//! # Isolation levels
//!
//! Under `REPEATABLE READ` or `SERIALIZABLE`, set per transaction or as the database's
//! `default_transaction_isolation`, a claim can meet the first request's commit. PostgreSQL
//! then rolls it back with a serialization failure (`40001`): another transaction holds or
//! held the key.
//!
//! - In a transaction of its own, `within` tries the claim once more, in a new transaction.
//!   Its snapshot sees the first's record, so the repeat gets the replay, as under
//!   `READ COMMITTED`.
//! - In your transaction, the snapshot is yours. The repeat gets [`Within::InFlight`]; a
//!   retry in a new transaction gets the replay.
//!
//! A deadlock on the claim (`40P01`) is answered the same way.
//!
//! A serialization failure or a deadlock of the transaction itself is yours. In the work's
//! statements it comes back as an error of kind [`WithinErrorKind::Work`], with the work's
//! error. When the record is written or at the commit, it is of kind
//! [`WithinErrorKind::Conflict`]. Either way nothing was committed and the key is free: run
//! the request again, in a new transaction.
//!
//! # When to use it, and when the layer is enough
//!
//! Use `within` when the work is writes to the PostgreSQL database the records live in:
//! create the order, debit the balance. Then no crash can leave the work without its record,
//! or a record without its work. It costs the handler an explicit call. A repeat holds a
//! database connection while it waits for the first.
//!
//! The [`IdempotencyLayer`](crate::IdempotencyLayer), over any store, is enough in two cases:
//! the work is elsewhere (another database, a queue, a remote API), or a re-run after a crash
//! inside the lease window is acceptable. It needs no change to handlers. Side effects outside
//! the transaction, such as an email or a call to a payment provider, are at-least-once either
//! way. Forward a [`DerivedKey`](crate::DerivedKey) to a provider that de-duplicates.
//!
//! The key, scope and fingerprint are the caller's, as in every door. Derive the [`StoreKey`]
//! from the client's key and the *authenticated* principal with [`Engine::store_key`], which
//! keys it under the engine's secret when there is one, as every other door does. Derive the
//! fingerprint from the request. The `transactional` example in the repository does it for an
//! axum handler with the layer's `Idempotency-Key` semantics: replay, 409, 422.
//!
//! # Steps in a transaction
//!
//! [`Steps`] record each side effect of a request as it succeeds, so that a retry runs only
//! what is left. A step run by [`Steps::run`] records its result after the work. A crash
//! between the two runs the step again on a retry. When a step's work is writes to the
//! database of the records, [`step`] closes that window for the step. Its writes and its
//! record are one transaction.
//!
//! ```no_run
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Scope};
//! use tower_idempotency::store::postgres::PostgresStore;
//! use tower_idempotency::store::postgres::sqlx::{self, PgPool};
//! use tower_idempotency::transactional::step;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = PgPool::connect("postgres://app@127.0.0.1/app").await?;
//! let engine = Engine::new(PostgresStore::new(pool.clone(), "orders")?);
//! engine.store().migrate().await?;
//!
//! let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1")?);
//! let fingerprint = Fingerprint::builder().field(b"POST /orders").field(b"{\"sku\":\"X\"}").finish();
//! let Begin::Run(ticket) = engine.begin(key, fingerprint).await? else { return Ok(()) };
//! let steps = engine.steps(&ticket);
//!
//! // The order and the step's record commit together. A retry gets the id back.
//! let mut conn = pool.acquire().await?;
//! let id: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
//!     Box::pin(async move {
//!         sqlx::query_scalar("INSERT INTO orders (sku) VALUES ('X') RETURNING id::text")
//!             .fetch_one(&mut *tx)
//!             .await
//!     })
//! })
//! .await?;
//!
//! // A side effect outside the database is an ordinary step.
//! steps
//!     .run("receipt", Raw, |key| async move {
//!         // send the receipt of order `id`, under `key`
//!         Ok::<_, std::io::Error>(format!("sent for {id} as {key}"))
//!     })
//!     .await?;
//! # let _ = ticket; Ok(()) }
//! ```
//!
//! A step that was recorded is answered from its record. Its work does not run. Otherwise a
//! transaction begins on your connection, or a savepoint in your transaction. The work runs on
//! it. Its result is recorded in it, and it commits. An error of the work rolls back both, and
//! the step runs again on a retry.
//!
//! Two runs of a request overlap only after a lease lapsed. If both run the same step, the
//! second to record it waits for the first's transaction. When the first commits, the second
//! rolls back its own writes and returns the first's result. Under `REPEATABLE READ` or
//! `SERIALIZABLE`, PostgreSQL may roll the second back instead. It then fails with
//! [`StepErrorKind::Conflict`](crate::engine::StepErrorKind::Conflict): run the request again.
//!
//! On a connection of the store's own pool, the store's `statement_timeout` is lifted for the
//! step, as for `within`. Besides the work, a step sends four statements: the begin, the
//! settings, the record and the commit. The first step of a request also reads its recorded
//! steps, once.
//!
//! [`PostgresStoreBuilder::lock_timeout`]: crate::store::postgres::PostgresStoreBuilder::lock_timeout
//! [`PostgresStore::connect`]: crate::store::postgres::PostgresStore::connect
//! [`StoreKey`]: crate::store::StoreKey
//! [`Engine::store_key`]: crate::engine::Engine::store_key
//! [`Steps`]: crate::engine::Steps
//! [`Steps::run`]: crate::engine::Steps::run

#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub use self::postgres::{step, within};
use crate::engine::{RecordError, Recorded};
use crate::store::StoreError;
use std::error::Error as StdError;
use std::fmt;

/// What [`within`] did.
#[derive(Debug)]
#[non_exhaustive]
pub enum Within {
    /// The work ran, and its response was recorded in the same transaction
    /// ([`Verdict::Record`](crate::engine::Verdict::Record)). It is committed. On your
    /// transaction, it is written into it, and you commit it.
    Recorded(Recorded),
    /// The same request completed before: its recorded response. The work did not run.
    Replayed(Recorded),
    /// The same request holds the key and did not commit within the lock wait. HTTP answers 409,
    /// retryable. The work did not run.
    InFlight,
    /// The key is held or was completed by a different request. HTTP answers 422. The work did
    /// not run.
    KeyReused,
    /// The stored record failed validation and is not replayed. HTTP answers 503. The work did
    /// not run.
    RecordInvalid(RecordError),
}

/// Why [`within`] failed.
///
/// Except for a failed commit of kind [`Store`](WithinErrorKind::Store), everything `within`
/// did was rolled back and the key is free. The work's own error comes back with
/// [`into_inner`](Self::into_inner).
///
/// ```no_run
/// use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
/// use tower_idempotency::store::postgres::{PostgresStore, sqlx};
/// use tower_idempotency::transactional::{WithinErrorKind, within};
/// use tower_idempotency::IdempotencyKey;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let pool = sqlx::PgPool::connect("postgres://app@127.0.0.1/app").await?;
/// # let engine = Engine::new(PostgresStore::new(pool.clone(), "orders")?);
/// # let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1")?);
/// # let fingerprint = Fingerprint::builder().field(b"POST /orders").finish();
/// let mut conn = pool.acquire().await?;
/// let failed = within(&engine, &mut conn, key, fingerprint, |_tx| {
///     Box::pin(async { Err::<Recorded, _>("out of stock") })
/// })
/// .await
/// .unwrap_err();
/// assert_eq!(failed.kind(), WithinErrorKind::Work);
/// assert!(!failed.is_retryable());
/// assert_eq!(failed.into_inner(), Some("out of stock"));
/// # Ok(()) }
/// ```
pub struct WithinError<E> {
    repr: Repr<E>,
}

#[derive(Debug)]
enum Repr<E> {
    Work(E),
    Store(StoreError),
    Conflict(sqlx::Error),
}

/// What a [`WithinError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WithinErrorKind {
    /// The work returned an error. The work and the claim were rolled back.
    Work,
    /// A step of the store failed: the claim, the record or the commit. When the commit
    /// itself failed on a lost connection, whether it happened is unknown. A retry under the
    /// same key then either replays or runs.
    Store,
    /// PostgreSQL rolled the transaction back for a concurrent one, when the record was written
    /// or at the commit. This is a serialization failure, SQLSTATE `40001`, under `REPEATABLE
    /// READ` or `SERIALIZABLE`. Or it is a deadlock, `40P01`. Nothing was committed and the key is
    /// free: run the request again, in a new transaction. On your own transaction, roll it back
    /// first. The same failure in the work's own statements is of kind [`Work`](Self::Work), with
    /// the work's error. On MySQL and MariaDB (`transactional::mysql`) it is an InnoDB
    /// deadlock, error 1213.
    Conflict,
}

impl WithinErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::Store => "idempotency.store_failed",
            Self::Conflict => "idempotency.conflict",
        }
    }
}

impl<E> WithinError<E> {
    fn work(e: E) -> Self {
        Self {
            repr: Repr::Work(e),
        }
    }

    fn store(e: StoreError) -> Self {
        Self {
            repr: Repr::Store(e),
        }
    }

    fn conflict(e: sqlx::Error) -> Self {
        Self {
            repr: Repr::Conflict(e),
        }
    }

    /// What failed.
    #[must_use]
    pub fn kind(&self) -> WithinErrorKind {
        match self.repr {
            Repr::Work(_) => WithinErrorKind::Work,
            Repr::Store(_) => WithinErrorKind::Store,
            Repr::Conflict(_) => WithinErrorKind::Conflict,
        }
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// Whether running the request again, in a new transaction, may succeed. It is `true` for a
    /// conflict, or a store failure that [is retryable](StoreError::is_retryable). The work's own
    /// error is the work's to judge, so it gives `false`.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match &self.repr {
            Repr::Work(_) => false,
            Repr::Store(e) => e.is_retryable(),
            Repr::Conflict(_) => true,
        }
    }

    /// The work's error, for kind [`Work`](WithinErrorKind::Work).
    #[must_use]
    pub fn get_ref(&self) -> Option<&E> {
        match &self.repr {
            Repr::Work(e) => Some(e),
            _ => None,
        }
    }

    /// The work's error, for kind [`Work`](WithinErrorKind::Work).
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self.repr {
            Repr::Work(e) => Some(e),
            _ => None,
        }
    }

    /// The store's error, for kind [`Store`](WithinErrorKind::Store).
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.repr {
            Repr::Store(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for WithinError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.repr, f)
    }
}

impl<E: fmt::Display> fmt::Display for WithinError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.repr {
            Repr::Work(e) => write!(f, "the transactional work failed: {e}"),
            Repr::Store(e) => fmt::Display::fmt(e, f),
            Repr::Conflict(e) => write!(
                f,
                "the transaction conflicted with a concurrent one and was rolled back: {e}"
            ),
        }
    }
}

/// The source is the work's error, the [`StoreError`], or the `sqlx::Error` of a conflict.
impl<E: StdError + 'static> StdError for WithinError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.repr {
            Repr::Work(e) => Some(e),
            Repr::Store(e) => Some(e),
            Repr::Conflict(e) => Some(e),
        }
    }
}
