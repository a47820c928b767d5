//! The transactional door on SQLite: the work and its record committed in one SQLite
//! transaction, with feature `sqlite`.
//!
//! ```
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
//! use tower_idempotency::store::sqlite::SqliteStore;
//! use tower_idempotency::store::sqlite::sqlx;
//! use tower_idempotency::transactional::Within;
//! use tower_idempotency::transactional::sqlite::within;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = std::env::temp_dir().join(format!("ti-doc-within-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! let store = SqliteStore::open(dir.join("app.db"), "orders").await?;
//! store.migrate().await?;
//! let pool = store.pool().clone(); // the application's tables live in the same file
//! sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
//!     .execute(&pool)
//!     .await?;
//! let engine = Engine::new(store);
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
//!     Within::InFlight => println!("409: retry later"),
//!     Within::KeyReused => println!("422: this key was used for another request"),
//!     other => println!("503: {other:?}"),
//! }
//! # drop(conn); std::fs::remove_dir_all(&dir)?; Ok(()) }
//! ```
//!
//! [`within`] here is the [transactional door](super) of PostgreSQL on a SQLite file, with the
//! same outcomes ([`Within`]) and errors ([`WithinError`]): the claim, the work and the record
//! commit together or not at all. A crash of the process inside the transaction leaves nothing
//! of it in the file: SQLite rolls it back when the file is next opened, and a retry runs the
//! work once.
//!
//! # How it runs
//!
//! 1. On a connection outside a transaction, a transaction begins with `BEGIN IMMEDIATE`: it
//!    takes the file's write lock at once, waiting for it up to the store's
//!    [lock wait](crate::store::sqlite::SqliteStoreBuilder::lock_timeout), 1 s by default
//!    (SQLite's `busy_timeout`, set for that wait and put back after the claim). On your own
//!    transaction (`&mut *tx`) it is a savepoint inside it; begin yours with
//!    `conn.begin_with("BEGIN IMMEDIATE")` so that it holds the write lock from its start.
//! 2. The key is claimed in it. The write lock is the lease: it lasts exactly as long as the
//!    transaction.
//! 3. The work runs on the same transaction. Its `Ok` value is the response to record.
//! 4. The record is written over the claim, and the transaction commits.
//!
//! SQLite's write lock covers the whole file, not one row. While a transaction of `within`
//! runs its work, every other write to the file waits for it: the store's own steps, other
//! keys' transactions, the application's writes. Keep the work short. A repeat that arrives
//! meanwhile waits for the lock:
//!
//! | the first request | the repeat |
//! | --- | --- |
//! | commits within the lock wait | gets [`Within::Replayed`] of the first's record |
//! | runs longer | gets [`Within::InFlight`] once the wait ends (HTTP: 409, retry later) |
//! | rolls back (its work failed, its process died) | claims the key and runs |
//! | committed earlier | [`Within::Replayed`] at once, or [`Within::KeyReused`] for another request (422) |
//!
//! Any transaction that holds the write lock past the wait gets the same answer, as SQLite
//! cannot tell whose it is: [`Within::InFlight`], nothing ran, retry later.
//!
//! A busy error (`SQLITE_BUSY`) of your own transaction when the record is written or at the
//! commit, where your transaction began without the write lock, is of kind
//! [`WithinErrorKind::Conflict`](super::WithinErrorKind::Conflict): nothing of `within` was
//! committed and the key is free; roll your transaction back and run the request again.
//!
//! # Steps in a transaction
//!
//! [`step`] runs one [step](crate::engine::Steps) of a request's work with its record in one
//! transaction, as [`transactional::step`](super::step) does on PostgreSQL. The step waits for
//! the write lock up to your connection's own `busy_timeout`.

use super::{Within, WithinError};
use crate::engine::steps::Ready;
use crate::engine::{Begin, BoxFuture, Codec, Engine, Fingerprint, Recorded, StepError, Steps};
use crate::metrics::{self, Door, Op, Outcome, Settled, Started, StepResult, request, settled};
use crate::store::sqlite::{OpError, SqliteStore, sql};
use crate::store::{Claim, StepRecorded, StoreError, StoreErrorKind, StoreKey, Token};
use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::{Connection, Transaction};
use std::future::Future;
use tracing::Instrument;

/// How the claim in the transaction ended.
enum Held {
    Found(Claim),
    /// The write lock stayed taken past the lock wait.
    Contended,
}

/// Claims `key` inside a SQLite transaction on `conn`, runs `work` on that transaction,
/// records its response and commits, all or nothing. See the [module docs](self).
///
/// `conn` is a connection, such as `&mut *store.pool().acquire().await?`, or your own
/// transaction, `&mut *tx`, where `within` works in a savepoint and leaves the commit to you.
/// The fingerprint is keyed by the engine's secret when it has one; the record is written with
/// the engine's retention and sealed with its secret. The work is written
/// `|tx| Box::pin(async move { … })`. Its `Ok` value is recorded and returned as
/// [`Within::Recorded`]. Its `Err` rolls back the work and the claim, and is returned as a
/// [`WithinError`] of kind [`Work`](super::WithinErrorKind::Work): the key is free. Dropping
/// the future rolls back as well.
///
/// # Errors
/// A [`WithinError`]: the work's error, a step of the store that failed, or a conflict of
/// your own transaction. See [`WithinErrorKind`](super::WithinErrorKind).
pub async fn within<F, E>(
    engine: &Engine<SqliteStore>,
    conn: &mut SqliteConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    // The door's span, over the claim, the work and the record.
    let span = crate::trace::door_span(engine.span_level(), Door::Within.as_str());
    crate::trace::record_key(&span, &key);
    within_in_span(engine, conn, key, fingerprint, work)
        .instrument(span)
        .await
}

/// [`within`] in the door's span.
async fn within_in_span<F, E>(
    engine: &Engine<SqliteStore>,
    conn: &mut SqliteConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    let store = engine.store();
    let own = !conn.is_in_transaction();
    // Taken by the claim once the transaction has begun; else timed here, as a failed claim.
    let mut started = Some(engine.timer().start(Op::Claim));
    let failed = |e: OpError| WithinError::store(e.into_store("SQLite claim in a transaction"));
    // The lock wait is SQLite's busy timeout, for the begin and the claim only.
    let previous = match busy_timeout(conn).await {
        Ok(previous) => previous,
        Err(e) => return Err(failed(e)),
    };
    if let Err(e) = set_busy_timeout(conn, sql::millis(store.lock_timeout)).await {
        return Err(failed(e));
    }
    // The transaction, and its borrow of `conn`, end within this block: a failed begin puts
    // the busy timeout back on `conn`.
    let begun = async {
        let begun = if own {
            conn.begin_with("BEGIN IMMEDIATE").await
        } else {
            conn.begin().await
        };
        match begun {
            Ok(tx) => {
                let started = started
                    .take()
                    .unwrap_or_else(|| engine.timer().start(Op::Claim));
                Ok(held(engine, tx, key, fingerprint, previous, started, work).await)
            }
            Err(e) => Err(OpError::from(e)),
        }
    };
    let e = match begun.await {
        Ok(answer) => return answer,
        Err(e) => e,
    };
    let _ = set_busy_timeout(conn, previous).await;
    let held = if e.is_busy() {
        Ok(Held::Contended)
    } else {
        Err(e.into_store("SQLite begin"))
    };
    let started = started.unwrap_or_else(|| engine.timer().start(Op::Claim));
    engine.timer().record(Op::Claim, started, &held);
    match held {
        Ok(_) => {
            request(Door::Within, Outcome::InFlight);
            Ok(Within::InFlight)
        }
        Err(e) => {
            request(Door::Within, Outcome::of_store_error(&e));
            Err(WithinError::store(e))
        }
    }
}

/// [`within`] once its transaction has begun, holding the write lock: the claim, the work,
/// the record and the commit.
async fn held<F, E>(
    engine: &Engine<SqliteStore>,
    mut tx: Transaction<'_, Sqlite>,
    key: StoreKey,
    plain: Fingerprint,
    previous: i64,
    started: Started,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    let store = engine.store();
    let fingerprint = engine.keyed(plain);
    let held = claim_held(store, &mut tx, &key, &fingerprint, engine.lease()).await;
    let held = match (held, set_busy_timeout(&mut tx, previous).await) {
        (Ok(held), Ok(())) => Ok(held),
        (Err(e), _) | (Ok(_), Err(e)) => Err(e.into_store("SQLite claim in a transaction")),
    };
    engine.timer().record(Op::Claim, started, &held);
    let claim = match held {
        Ok(Held::Found(claim)) => claim,
        Ok(Held::Contended) => {
            request(Door::Within, Outcome::InFlight);
            return rolled_back(tx, Ok(Within::InFlight)).await;
        }
        Err(e) => {
            request(Door::Within, Outcome::of_store_error(&e));
            return rolled_back(tx, Err(WithinError::store(e))).await;
        }
    };
    let (outcome, answer) = match engine.judge(key, plain, fingerprint, claim) {
        Begin::Run(ticket) => {
            request(Door::Within, Outcome::Ran);
            let response = match work(&mut tx).await {
                Ok(response) => response,
                Err(e) => {
                    settled(Door::Within, Settled::Released);
                    return rolled_back(tx, Err(WithinError::work(e))).await;
                }
            };
            let record = match engine.seal(&ticket, &response) {
                Ok(record) => record,
                Err(e) => {
                    settled(Door::Within, Settled::CompleteFailed);
                    let e = StoreError::with_source(
                        StoreErrorKind::Protocol,
                        "response cannot be recorded",
                        e,
                    );
                    return rolled_back(tx, Err(WithinError::store(e))).await;
                }
            };
            let op = "SQLite complete in a transaction";
            let started = engine.timer().start(Op::Complete);
            let done = store
                .complete_held(
                    &mut tx,
                    ticket.key(),
                    ticket.token(),
                    ticket.fingerprint(),
                    record.into_bytes().as_ref(),
                    engine.retention(),
                )
                .await;
            let timed = done
                .as_ref()
                .map(|_| ())
                .map_err(|e| StoreError::new(e.kind(), op));
            engine.timer().record(Op::Complete, started, &timed);
            let (end, answer) = match done {
                Ok(true) => match tx.commit().await.map_err(OpError::from) {
                    Ok(()) => (Settled::Completed, Ok(Within::Recorded(response))),
                    Err(e) => ended(e, "SQLite commit"),
                },
                Ok(false) => {
                    let e = StoreError::new(StoreErrorKind::Protocol, "the claim's row was lost");
                    let answer = rolled_back(tx, Err(WithinError::store(e))).await;
                    (Settled::CompleteFailed, answer)
                }
                Err(e) => {
                    let failed = ended(e, op);
                    (failed.0, rolled_back(tx, failed.1).await)
                }
            };
            settled(Door::Within, end);
            return answer;
        }
        Begin::Replayed(response) => (Outcome::Replayed, Within::Replayed(response)),
        Begin::InFlight => (Outcome::InFlight, Within::InFlight),
        Begin::KeyReused => (Outcome::KeyReused, Within::KeyReused),
        Begin::RecordInvalid(e) => (Outcome::RecordInvalid, Within::RecordInvalid(e)),
    };
    request(Door::Within, outcome);
    rolled_back(tx, Ok(answer)).await
}

/// A failed record or commit: a busy error is the caller's transaction losing the write lock
/// to another (nothing committed, the key free); anything else is the store's.
fn ended<E>(e: OpError, op: &'static str) -> (Settled, Result<Within, WithinError<E>>) {
    match e {
        OpError::Sql(e) if OpError::is_busy_sql(&e) => {
            (Settled::Released, Err(WithinError::conflict(e)))
        }
        e => (
            Settled::CompleteFailed,
            Err(WithinError::store(e.into_store(op))),
        ),
    }
}

/// Claims the key on `tx`, under the lock wait.
async fn claim_held(
    store: &SqliteStore,
    tx: &mut SqliteConnection,
    key: &StoreKey,
    fingerprint: &Fingerprint,
    lease: std::time::Duration,
) -> Result<Held, OpError> {
    let token = Token::generate()?;
    let row_key = store.row_key(key);
    let bound = store.lock_timeout.saturating_add(store.timeout);
    let claimed = tokio::time::timeout(
        bound,
        store.claim_locked(tx, &row_key, fingerprint, token, lease),
    )
    .await;
    match claimed {
        Ok(Ok(claim)) => Ok(Held::Found(claim)),
        Ok(Err(e)) if e.is_busy() => Ok(Held::Contended),
        Ok(Err(e)) => Err(e),
        Err(elapsed) => Err(elapsed.into()),
    }
}

async fn busy_timeout(conn: &mut SqliteConnection) -> Result<i64, OpError> {
    Ok(sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await?)
}

async fn set_busy_timeout(conn: &mut SqliteConnection, ms: i64) -> Result<(), OpError> {
    // An integer: PRAGMA takes no bind parameter.
    sqlx::query(sqlx::AssertSqlSafe(format!("PRAGMA busy_timeout = {ms}")))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Runs the step `name` of a request's work in one SQLite transaction with its record, or
/// answers it from its record. See [steps in a transaction](self#steps-in-a-transaction) and
/// [`transactional::step`](super::step), whose rules it follows.
///
/// `steps` are the request's, from [`Engine::steps`] on the same engine. `conn` is a
/// connection, where the step begins with `BEGIN IMMEDIATE`, or your own transaction
/// (`&mut *tx`), where it works in a savepoint and leaves the commit to you. When the step is
/// recorded, its value is decoded with `codec` and returned, and `work` does not run.
/// Otherwise `work` runs in the transaction, its `Ok` value is encoded with `codec` and
/// recorded in it, and it commits.
///
/// # Errors
/// A [`StepError`], as for [`transactional::step`](super::step). A busy error of the
/// transaction (`SQLITE_BUSY`: the write lock stayed taken) is of kind
/// [`Conflict`](crate::engine::StepErrorKind::Conflict): nothing was recorded, run the request
/// again.
pub fn step<'a, T, E, C, F>(
    engine: &'a Engine<SqliteStore>,
    steps: &'a Steps,
    conn: &'a mut SqliteConnection,
    name: &str,
    codec: C,
    work: F,
) -> impl Future<Output = Result<T, StepError<E>>> + Send + 'a
where
    C: Codec<T>,
    F: for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<T, E>> + Send + 'a,
    T: Send + 'a,
    E: Send + 'a,
{
    // The place is taken now, as `Steps::run` takes it: joined steps keep call order.
    let place = steps.take_place(name);
    let name = name.to_owned();
    async move {
        let place = place?;
        let (claim, run) = steps.claim(place, &name)?;
        let bound = run.bound();
        // A record written under another store's key would never be read back.
        if !bound.is_of(engine.store()) {
            return Err(StepError::other_store(place, &name));
        }
        let id = match steps.ready(claim, run, place, &name).await? {
            Ready::Recorded(id, value) => return bound.replay(place, &id, &name, &codec, value),
            Ready::Run(id) => id,
        };
        let store = engine.store();
        let failed = |e: OpError, op| match e {
            OpError::Sql(e) if OpError::is_busy_sql(&e) => StepError::conflict(
                StoreError::with_source(StoreErrorKind::Conflict, op, e),
                place,
                &name,
            ),
            e => StepError::not_recorded(e.into_store(op), place, &name),
        };
        let own = !conn.is_in_transaction();
        let begun = if own {
            conn.begin_with("BEGIN IMMEDIATE").await
        } else {
            conn.begin().await
        };
        let mut tx = begun.map_err(|e| failed(e.into(), "SQLite begin"))?;
        let value = match work(&mut tx).await {
            Ok(value) => value,
            // The work's error rolls back what it wrote: nothing is recorded.
            Err(e) => return rolled_back(tx, Err(StepError::work(e, place, &name))).await,
        };
        let sealed = match bound.sealed(&id, &name, &codec, &value) {
            Ok(sealed) => sealed,
            // Committing the work without its record would run it again on a retry.
            Err(e) => return rolled_back(tx, Err(StepError::not_recorded(e, place, &name))).await,
        };
        let op = "SQLite record step in a transaction";
        let started = engine.timer().start(Op::RecordStep);
        let recorded = store
            .record_step_on(&mut tx, &bound.key, &id, &sealed, bound.retention)
            .await;
        let timed = recorded
            .as_ref()
            .map(|_| ())
            .map_err(|e| StoreError::new(e.kind(), op));
        engine.timer().record(Op::RecordStep, started, &timed);
        match recorded {
            Ok(StepRecorded::Recorded) => match tx.commit().await {
                Ok(()) => {
                    metrics::step(StepResult::Ran);
                    Ok(value)
                }
                Err(e) => Err(failed(e.into(), "SQLite commit")),
            },
            // Another run recorded the step first: its work stands, this one's goes.
            Ok(StepRecorded::Found(first)) => {
                rolled_back(tx, ()).await;
                bound.taken_over(place, &id, &name, &codec, first)
            }
            Err(e) => rolled_back(tx, Err(failed(e, op))).await,
        }
    }
}

/// Rolls the transaction or savepoint back, then answers `outcome`.
async fn rolled_back<T>(tx: Transaction<'_, Sqlite>, outcome: T) -> T {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %e, "idempotency: rollback failed");
    }
    outcome
}

impl SqliteStore {
    /// Writes the record over the claim that `tx`, the claimant's transaction, holds; the
    /// key's steps go with it. Whether it was written.
    async fn complete_held(
        &self,
        tx: &mut SqliteConnection,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: &[u8],
        retention: std::time::Duration,
    ) -> Result<bool, OpError> {
        let key = self.row_key(key);
        let written = sqlx::query(sql::statement(&self.sql.complete_held))
            .bind(&key[..])
            .bind(self.now())
            .bind(&token.as_bytes()[..])
            .bind(&fingerprint.as_bytes()[..])
            .bind(record)
            .bind(sql::millis(retention))
            .execute(&mut *tx)
            .await?
            .rows_affected()
            == 1;
        if written {
            sqlx::query(sql::statement(&self.sql.free_steps))
                .bind(&key[..])
                .execute(&mut *tx)
                .await?;
        }
        Ok(written)
    }
}
