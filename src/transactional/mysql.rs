//! The transactional door on MySQL and MariaDB: the work and its record committed in one InnoDB
//! transaction.
//!
//! ```no_run
//! use tower_idempotency::IdempotencyKey;
//! use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
//! use tower_idempotency::store::mysql::MySqlStore;
//! use tower_idempotency::store::mysql::sqlx::{self, MySqlPool};
//! use tower_idempotency::transactional::Within;
//! use tower_idempotency::transactional::mysql::within;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = MySqlPool::connect("mysql://app@127.0.0.1/app").await?;
//! let engine = Engine::new(MySqlStore::new(pool.clone(), "orders")?);
//! engine.store().migrate().await?;
//!
//! let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1")?);
//! let fingerprint = Fingerprint::builder().field(b"POST /orders").field(b"{\"sku\":\"X\"}").finish();
//!
//! let mut conn = pool.acquire().await?;
//! let outcome = within(&engine, &mut conn, key, fingerprint, |tx| {
//!     Box::pin(async move {
//!         let done = sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
//!             .execute(&mut *tx)
//!             .await?;
//!         let body = format!(r#"{{"id":{}}}"#, done.last_insert_id());
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
//! [`within`] and [`step`] do on MySQL 8 and MariaDB 10.11 what
//! [`transactional::within`](super::within) and [`transactional::step`](super::step) do on
//! PostgreSQL, with the same answers ([`Within`]) and errors ([`WithinError`]). When the work
//! is writes to the database that keeps the records, in InnoDB tables, the claim, the work and
//! the record are one transaction: they commit together or not at all. A crash of the process,
//! the connection or the server rolls them all back, and the key is free for the retry.
//!
//! # How it runs
//!
//! 1. A transaction begins on your connection: `BEGIN`, or a savepoint when you pass your own
//!    transaction (`&mut *tx`), which you then commit.
//! 2. The key is claimed in it: `INSERT … ON DUPLICATE KEY UPDATE` of nothing takes the row's
//!    lock (inserting the row when the key is free), an expired row is taken over, and a
//!    `SELECT … FOR UPDATE` reads what holds the key. The row lock is the lease: it lasts as
//!    long as the transaction and needs no renewal.
//! 3. The work runs on the same transaction. Its `Ok` value is the response to record.
//! 4. The record is written over the claim, and the transaction commits.
//!
//! A repeat that arrives meanwhile waits for the row lock, bounded by InnoDB's
//! `innodb_lock_wait_timeout`, which the claim sets for its own statements to the store's
//! [lock wait](crate::store::mysql::MySqlStoreBuilder::lock_timeout) (1 s by default, in whole
//! seconds) and puts back after them:
//!
//! | the first request | the repeat |
//! | --- | --- |
//! | commits within the lock wait | gets [`Within::Replayed`] of the first's record |
//! | runs longer | gets [`Within::InFlight`] once the wait ends (HTTP: 409, retry later) |
//! | rolls back (its work failed, its connection died) | claims the key and runs |
//! | committed earlier | [`Within::Replayed`] at once, or [`Within::KeyReused`] for another request (422) |
//!
//! The lock wait is `innodb_lock_wait_timeout` per session rather than `NOWAIT` or MariaDB's
//! `WAIT n`: MySQL 8 has no `WAIT n`, and `NOWAIT` would answer "in flight" to a repeat that
//! a short wait would have answered with the replay.
//!
//! MySQL has no setting that ends with the transaction, as PostgreSQL's `SET LOCAL` does: the
//! claim puts your session's `innodb_lock_wait_timeout` back with one statement more. If the
//! future of `within` is dropped while the claim waits, the transaction is rolled back but the
//! session keeps the store's lock wait until it is set again or closed.
//!
//! # Deadlocks
//!
//! Two claims of one free key may deadlock in InnoDB's locks on the index. InnoDB then rolls
//! one transaction back (error 1213). In a transaction of its own, `within` tries the claim
//! once more in a new one, which waits for the other's row and replays it or answers in
//! flight. In your transaction, InnoDB rolled all of it back: the repeat gets
//! [`Within::InFlight`], and your transaction must be rolled back. A deadlock when the record
//! is written or at the commit is a [`WithinError`] of kind
//! [`Conflict`](super::WithinErrorKind::Conflict): nothing was committed and the key is free.
//!
//! # Steps
//!
//! [`step`] runs one [step](crate::engine::Steps) of a request's work in one transaction with
//! its record, as [`transactional::step`](super::step) does on PostgreSQL: a recorded step is
//! answered from its record, otherwise its writes and its record commit together.

use super::{Within, WithinError};
use crate::engine::steps::Ready;
use crate::engine::{
    Begin, BoxFuture, Codec, Engine, Fingerprint, Recorded, StepError, Steps, Ticket,
};
use crate::metrics::{self, Door, Op, Outcome, Settled, StepResult, request, settled};
use crate::store::mysql::sql;
use crate::store::mysql::{ClaimRow, MySqlStore, OpError};
use crate::store::{Claim, Record, StepRecorded, StoreError, StoreErrorKind, StoreKey, Token};
use sqlx::mysql::{MySql, MySqlConnection};
use sqlx::{Connection, Transaction};
use std::future::Future;
use std::time::Duration;
use tracing::Instrument;

/// What a claim inside a transaction found.
enum Held {
    /// The claim's answer. When claimed, the transaction now holds the row.
    Found(Claim),
    /// Another transaction holds the row past the lock wait: the key is in flight.
    Contended,
    /// InnoDB rolled the transaction back for a deadlock.
    Conflict,
}

impl MySqlStore {
    /// Claims `key` on `conn`, inside its open transaction, waiting at most the store's lock
    /// wait for a row another transaction holds. The session's lock wait is put back after.
    async fn claim_held(
        &self,
        conn: &mut MySqlConnection,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Held, StoreError> {
        let token = Token::generate()?;
        let row_key = self.row_key(key);
        let claim = self.sql.claim_held(
            &row_key,
            fingerprint.as_bytes(),
            token.as_bytes(),
            sql::millis(lease),
        );
        let query = format!(
            "SET @ti_lock_wait = @@SESSION.innodb_lock_wait_timeout, \
                SESSION innodb_lock_wait_timeout = {};{claim}",
            sql::seconds(self.lock_timeout)
        );
        let claimed = sqlx::raw_sql(sql::statement(query))
            .fetch_all(&mut *conn)
            .await
            .map_err(OpError::from);
        let restored = sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = @ti_lock_wait")
            .execute(&mut *conn)
            .await;
        match claimed {
            Ok(rows) => {
                restored.map_err(|e| OpError::from(e).into_store("MySQL settings"))?;
                let row = rows
                    .first()
                    .ok_or_else(|| OpError::from(sqlx::Error::RowNotFound))
                    .and_then(ClaimRow::read)
                    .map_err(|e| e.into_store("MySQL claim in a transaction"))?;
                Ok(Held::Found(row.into_claim(token)?))
            }
            Err(e) if e.is_lock_wait() => Ok(Held::Contended),
            Err(e) if e.is_conflict() => Ok(Held::Conflict),
            Err(e) => Err(e.into_store("MySQL claim in a transaction")),
        }
    }

    /// Writes the record over the row this transaction's claim holds, and deletes the key's
    /// steps. Returns `false` when the row was not found, which cannot be, under the
    /// transaction's own lock.
    async fn complete_held(
        &self,
        conn: &mut MySqlConnection,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, OpError> {
        let key = self.row_key(key);
        let record = record.into_bytes();
        let writer = Token::generate()
            .map_err(|_| OpError::from(sqlx::Error::Protocol("no random bytes".into())))?;
        let (update, delete) = self.sql.complete_held();
        let written = sqlx::query(sql::statement(update))
            .bind(&fingerprint.as_bytes()[..])
            .bind(&writer.as_bytes()[..])
            .bind(&record[..])
            .bind(sql::millis(retention).saturating_mul(1000))
            .bind(&key[..])
            .bind(&token.as_bytes()[..])
            .execute(&mut *conn)
            .await?;
        sqlx::query(sql::statement(delete))
            .bind(&key[..])
            .execute(&mut *conn)
            .await?;
        Ok(written.rows_affected() == 1)
    }
}

/// Claims `key` inside a transaction on `conn`, runs `work` on that transaction, records its
/// response and commits, all or nothing. See the [module docs](self).
///
/// `conn` is a connection, such as `&mut *pool.acquire().await?`, or your own transaction,
/// `&mut *tx`: `within` then works in a savepoint and leaves the commit to you. The
/// `fingerprint` is the request's. The record is written with the engine's retention and
/// sealed with its secret.
///
/// The work is written `|tx| Box::pin(async move { … })`. Its `Ok` value is recorded and
/// returned as [`Within::Recorded`]. Its `Err` rolls back the work and the claim, and is
/// returned as a [`WithinError`] of kind [`Work`](super::WithinErrorKind::Work): the key is
/// free, and a retry runs the work again. Dropping the future rolls back as well.
///
/// # Errors
/// A [`WithinError`]: the work's error, a step of the store that failed, or a deadlock with a
/// concurrent transaction. See [`WithinErrorKind`](super::WithinErrorKind).
pub async fn within<F, E>(
    engine: &Engine<MySqlStore>,
    conn: &mut MySqlConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<Recorded, E>>,
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
    engine: &Engine<MySqlStore>,
    conn: &mut MySqlConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    let store = engine.store();
    let plain = fingerprint;
    let fingerprint = engine.keyed(plain);
    // A deadlock rolled the whole transaction back: in a transaction of its own, the claim is
    // tried once more in a new one.
    let own = !conn.is_in_transaction();
    let mut tried = false;
    let (mut tx, claim) = loop {
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| WithinError::store(OpError::from(e).into_store("MySQL begin")))?;
        let started = engine.timer().start(Op::Claim);
        let held = store
            .claim_held(&mut tx, &key, &fingerprint, engine.lease())
            .await;
        engine.timer().record(Op::Claim, started, &held);
        match held {
            Ok(Held::Found(claim)) => break (tx, claim),
            Ok(Held::Conflict) if own && !tried => {
                tried = true;
                rolled_back(tx, ()).await;
            }
            Ok(Held::Contended | Held::Conflict) => {
                request(Door::Within, Outcome::InFlight);
                return rolled_back(tx, Ok(Within::InFlight)).await;
            }
            Err(e) => {
                request(Door::Within, Outcome::of_store_error(&e));
                return rolled_back(tx, Err(WithinError::store(e))).await;
            }
        }
    };
    let (outcome, answer) = match engine.judge(key, plain, fingerprint, claim) {
        Begin::Run(ticket) => {
            request(Door::Within, Outcome::Ran);
            let (end, answer) = match ran(engine, &mut tx, &ticket, work).await {
                Ok(response) => match tx.commit().await.map_err(OpError::from) {
                    Ok(()) => (Settled::Completed, Ok(Within::Recorded(response))),
                    Err(e) => match e.into_conflict() {
                        // Nothing was committed: the key is free.
                        Ok(e) => (Settled::Released, Err(WithinError::conflict(e))),
                        Err(e) => (
                            Settled::CompleteFailed,
                            Err(WithinError::store(e.into_store("MySQL commit"))),
                        ),
                    },
                },
                Err((end, e)) => (end, rolled_back(tx, Err(e)).await),
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

/// Runs the work and writes its record in the transaction. On an error the caller rolls back.
async fn ran<F, E>(
    engine: &Engine<MySqlStore>,
    tx: &mut Transaction<'_, MySql>,
    ticket: &Ticket,
    work: F,
) -> Result<Recorded, (Settled, WithinError<E>)>
where
    F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    let response = match work(tx).await {
        Ok(response) => response,
        // The work's error rolls back the claim with it: the key is free.
        Err(e) => return Err((Settled::Released, WithinError::work(e))),
    };
    let record = match engine.seal(ticket, &response) {
        Ok(record) => record,
        Err(e) => {
            let e =
                StoreError::with_source(StoreErrorKind::Protocol, "response cannot be recorded", e);
            return Err((Settled::CompleteFailed, WithinError::store(e)));
        }
    };
    let started = engine.timer().start(Op::Complete);
    let done = engine
        .store()
        .complete_held(
            tx,
            ticket.key(),
            ticket.token(),
            ticket.fingerprint(),
            record,
            engine.retention(),
        )
        .await;
    let op = "MySQL complete in a transaction";
    let done = match done {
        Ok(true) => Ok(()),
        Ok(false) => Err(OpError::from(sqlx::Error::RowNotFound)),
        Err(e) => Err(e),
    };
    let timed = done
        .as_ref()
        .map(|_| ())
        .map_err(|e| StoreError::new(e.kind(), op));
    engine.timer().record(Op::Complete, started, &timed);
    match done {
        Ok(()) => Ok(response),
        Err(e) => match e.into_conflict() {
            Ok(e) => Err((Settled::Released, WithinError::conflict(e))),
            Err(e) => Err((
                Settled::CompleteFailed,
                WithinError::store(e.into_store(op)),
            )),
        },
    }
}

/// Runs the step `name` of a request's work in one MySQL transaction with its record, or
/// answers it from its record: [`transactional::step`](super::step) on MySQL.
///
/// `steps` are the request's, from [`Engine::steps`] on the same engine. `conn` is a
/// connection, or your own transaction (`&mut *tx`): the step then works in a savepoint and
/// leaves the commit to you.
///
/// ```no_run
/// use tower_idempotency::IdempotencyKey;
/// use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Scope};
/// use tower_idempotency::store::mysql::MySqlStore;
/// use tower_idempotency::store::mysql::sqlx::{self, MySqlPool};
/// use tower_idempotency::transactional::mysql::step;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let pool = MySqlPool::connect("mysql://app@127.0.0.1/app").await?;
/// let engine = Engine::new(MySqlStore::new(pool.clone(), "orders")?);
/// let key = engine.store_key("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1")?);
/// let fingerprint = Fingerprint::builder().field(b"POST /orders").finish();
/// let Begin::Run(ticket) = engine.begin(key, fingerprint).await? else { return Ok(()) };
/// let steps = engine.steps(&ticket);
/// let mut conn = pool.acquire().await?;
/// // The order and the step's record commit together. A retry gets the id back.
/// let id: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
///     Box::pin(async move {
///         let done = sqlx::query("INSERT INTO orders (sku) VALUES ('X')").execute(&mut *tx).await?;
///         Ok::<_, sqlx::Error>(done.last_insert_id().to_string())
///     })
/// })
/// .await?;
/// # let _ = (ticket, id); Ok(()) }
/// ```
///
/// # Errors
/// A [`StepError`], as for [`transactional::step`](super::step).
pub fn step<'a, T, E, C, F>(
    engine: &'a Engine<MySqlStore>,
    steps: &'a Steps,
    conn: &'a mut MySqlConnection,
    name: &str,
    codec: C,
    work: F,
) -> impl Future<Output = Result<T, StepError<E>>> + Send + 'a
where
    C: Codec<T>,
    F: for<'c> FnOnce(&'c mut MySqlConnection) -> BoxFuture<'c, Result<T, E>> + Send + 'a,
    T: Send + 'a,
    E: Send + 'a,
{
    let place = steps.take_place(name);
    let name = name.to_owned();
    async move {
        let place = place?;
        let (claim, run) = steps.claim(place, &name)?;
        let bound = run.bound();
        if !bound.is_of(engine.store()) {
            return Err(StepError::other_store(place, &name));
        }
        let id = match steps.ready(claim, run, place, &name).await? {
            Ready::Recorded(id, value) => return bound.replay(place, &id, &name, &codec, value),
            Ready::Run(id) => id,
        };
        let store = engine.store();
        let failed = |e: OpError, op| match e.into_conflict() {
            Ok(e) => StepError::conflict(OpError::from(e).into_store(op), place, &name),
            Err(e) => StepError::not_recorded(e.into_store(op), place, &name),
        };
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| failed(e.into(), "MySQL begin"))?;
        let value = match work(&mut tx).await {
            Ok(value) => value,
            Err(e) => return rolled_back(tx, Err(StepError::work(e, place, &name))).await,
        };
        let sealed = match bound.sealed(&id, &name, &codec, &value) {
            Ok(sealed) => sealed,
            Err(e) => return rolled_back(tx, Err(StepError::not_recorded(e, place, &name))).await,
        };
        let op = "MySQL record step in a transaction";
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
            Ok(Some(StepRecorded::Recorded)) => match tx.commit().await {
                Ok(()) => {
                    metrics::step(StepResult::Ran);
                    Ok(value)
                }
                Err(e) => Err(failed(e.into(), "MySQL commit")),
            },
            // Another run recorded the step first: its work stands, this one's goes.
            Ok(Some(StepRecorded::Found(first))) => {
                rolled_back(tx, ()).await;
                bound.taken_over(place, &id, &name, &codec, first)
            }
            Ok(None) => {
                let e = StoreError::new(
                    StoreErrorKind::Protocol,
                    "recording a step kept racing concurrent records",
                );
                rolled_back(tx, Err(StepError::not_recorded(e, place, &name))).await
            }
            Err(e) => rolled_back(tx, Err(failed(e, op))).await,
        }
    }
}

/// Rolls the transaction or savepoint back, then answers `outcome`. A rollback that fails
/// leaves the connection broken, which rolls back on the server all the same.
async fn rolled_back<T>(tx: Transaction<'_, MySql>, outcome: T) -> T {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %e, "idempotency: rollback failed");
    }
    outcome
}
