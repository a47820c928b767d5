//! The door on PostgreSQL: [`within`] and [`step`], re-exported as `transactional::within` and
//! `transactional::step`, and the store's statements inside the caller's transaction. A claim's
//! row stays locked by the transaction until it ends. The record is written under that lock. The
//! store's own statements, outside any caller's transaction, stay in the store.

use super::{Within, WithinError};
use crate::engine::steps::Ready;
use crate::engine::{
    Begin, BoxFuture, Codec, Engine, Fingerprint, Recorded, StepError, Steps, Ticket,
};
use crate::metrics::{self, Door, Op, Outcome, Settled, StepResult, request, settled};
use crate::store::postgres::sql::{self, STORE_TIMEOUT_SETTING};
use crate::store::postgres::{CLAIM_ATTEMPTS, OpError, PostgresStore, protocol};
use crate::store::{Claim, Record, StepRecorded, StoreError, StoreErrorKind, StoreKey, Token};
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::{Connection, Transaction};
use std::future::Future;
use std::time::Duration;
use tracing::Instrument;

/// What a claim inside a transaction found.
#[derive(Debug)]
pub(crate) enum Held {
    /// The claim's answer, and the store's `statement_timeout` lifted for the work, if it was.
    /// When claimed, the transaction now holds the row.
    Found(Claim, Lifted),
    /// Another transaction holds the row past the lock wait: the key is in flight.
    Contended,
    /// PostgreSQL rolled the claim back for a concurrent transaction. It was a serialization
    /// failure, as the row changed after this transaction's snapshot, or a deadlock. Another
    /// transaction holds or held the key. A new transaction sees what it did.
    Conflict,
}

/// The `statement_timeout` of a connection of the store's own pool. It is lifted inside
/// `within`'s transaction, so that it does not cut the work. [`PostgresStore::restore`] puts it
/// back where the transaction goes on after `within`, as a savepoint in the caller's
/// transaction does.
#[derive(Debug)]
pub(crate) struct Lifted(Option<String>);

impl PostgresStore {
    /// Claims `key` on `conn`, inside its open transaction. It waits at most the store's
    /// `lock_timeout` for a row another transaction holds.
    ///
    /// The claim runs under the store's own timeouts: `lock_timeout`, and a `statement_timeout`
    /// above it, so the lock wait answers first. The caller's settings are put back before this
    /// returns. If the transaction failed, rolling back to before the claim puts them back. On a
    /// connection of its own pool, the store's own `statement_timeout` is lifted instead, for the
    /// work.
    pub(crate) async fn claim_held(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Held, StoreError> {
        let token = Token::generate()?;
        let key = self.row_key(key);
        let lease = sql::millis(lease);
        let wait = format!("{}ms", sql::millis(self.lock_timeout));
        let bound = format!(
            "{}ms",
            sql::millis(self.lock_timeout.saturating_add(self.timeout))
        );
        let claimed = async {
            // Reads the caller's settings, then sets the store's: the lateral references to
            // `previous` order the two. The statement's only text from outside is a constant.
            let (lock_wait, statement, stores): (String, String, bool) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
                "WITH previous AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lock_wait, \
                     current_setting('statement_timeout') AS statement, \
                     coalesce((SELECT setting FROM pg_settings WHERE name = 'statement_timeout') \
                         = current_setting('{STORE_TIMEOUT_SETTING}', true), false) AS stores) \
                 SELECT previous.lock_wait, previous.statement, previous.stores FROM previous \
                 CROSS JOIN LATERAL set_config('lock_timeout', $1 || left(previous.lock_wait, 0), true) \
                 CROSS JOIN LATERAL set_config('statement_timeout', $2 || left(previous.statement, 0), true) AS s"
            )))
            .bind(&wait)
            .bind(&bound)
            .fetch_one(&mut *conn)
            .await?;
            let mut found = None;
            for _ in 0..CLAIM_ATTEMPTS {
                found = self
                    .claim_once(&mut *conn, &key, fingerprint, &token, lease)
                    .await?;
                if found.is_some() {
                    break;
                }
            }
            // The store's own bound is not the work's: the work runs without it.
            let for_work = if stores { "0" } else { statement.as_str() };
            sqlx::query(
                "SELECT set_config('lock_timeout', $1, true), set_config('statement_timeout', $2, true)",
            )
            .bind(lock_wait)
            .bind(for_work)
            .execute(&mut *conn)
            .await?;
            Ok::<_, OpError>((found, Lifted(stores.then_some(statement))))
        };
        match claimed.await {
            Ok((Some(row), lifted)) => Ok(Held::Found(row.into_claim(token)?, lifted)),
            Ok((None, _)) => Err(protocol("claim kept racing concurrent claims")),
            Err(e) if e.is_lock_wait() => Ok(Held::Contended),
            Err(e) if e.is_conflict() => Ok(Held::Conflict),
            Err(e) => Err(e.into_store("PostgreSQL claim in a transaction")),
        }
    }

    /// Lifts the store's own `statement_timeout` for the rest of the transaction on `conn`, so
    /// that it does not cut the work of a step. A connection not of the store's pool keeps its
    /// settings.
    pub(crate) async fn lift(&self, conn: &mut PgConnection) -> Result<Lifted, OpError> {
        // The lateral reference reads the setting before it is changed. The statement's only
        // text from outside is a constant.
        let previous: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "WITH previous AS MATERIALIZED (SELECT current_setting('statement_timeout') AS statement \
                 WHERE (SELECT setting FROM pg_settings WHERE name = 'statement_timeout') \
                     = current_setting('{STORE_TIMEOUT_SETTING}', true)) \
             SELECT previous.statement FROM previous \
             CROSS JOIN LATERAL set_config('statement_timeout', '0' || left(previous.statement, 0), true) AS s"
        )))
        .fetch_optional(&mut *conn)
        .await?;
        Ok(Lifted(previous))
    }

    /// Puts back the store's `statement_timeout` that [`claim_held`](Self::claim_held) or
    /// [`lift`](Self::lift) lifted, for the rest of the caller's transaction.
    pub(crate) async fn restore(
        &self,
        conn: &mut PgConnection,
        lifted: Lifted,
    ) -> Result<(), OpError> {
        if let Lifted(Some(statement)) = lifted {
            sqlx::query("SELECT set_config('statement_timeout', $1, true)")
                .bind(statement)
                .execute(&mut *conn)
                .await?;
        }
        Ok(())
    }

    /// Writes the record over the row this transaction's claim holds, and deletes the key's
    /// steps. Returns `false` when the row was not found, which cannot be, under the
    /// transaction's own lock.
    pub(crate) async fn complete_held(
        &self,
        conn: &mut PgConnection,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, OpError> {
        let key = self.row_key(key);
        let record = record.into_bytes();
        let written = sqlx::query(sql::statement(&self.sql.complete_held))
            .bind(&key[..])
            .bind(&token.as_bytes()[..])
            .bind(&fingerprint.as_bytes()[..])
            .bind(&record[..])
            .bind(sql::millis(retention))
            .fetch_optional(&mut *conn)
            .await?;
        Ok(written.is_some())
    }
}

/// Claims `key` inside a transaction on `conn`, runs `work` on that transaction, records its
/// response and commits, all or nothing. See the [module docs](super).
///
/// `conn` is a connection, such as `&mut *pool.acquire().await?`. Or it is your own
/// transaction, `&mut *tx`: sqlx's `Transaction`, or any crate's that derefs to a
/// `PgConnection`. On a transaction, `within` works in a savepoint and leaves the commit to
/// you. The `fingerprint` is the request's, as the engine keeps it. It is keyed by the
/// engine's secret when it has one. The record is written with the engine's retention and
/// sealed with its secret.
///
/// The work is written `|tx| Box::pin(async move { … })`. It is boxed so that it can borrow
/// the connection it is given, as sqlx's own `Connection::transaction` does. Its `Ok` value is
/// recorded and returned as [`Within::Recorded`]. Its `Err` rolls back the work and the claim, and
/// is returned as a [`WithinError`] of kind [`Work`](super::WithinErrorKind::Work). The key is then
/// free, and a retry runs the work again. Dropping the future rolls back as well. See the
/// module docs for the [timeouts](super#timeouts) the work runs under and the
/// [isolation levels](super#isolation-levels).
///
/// # Errors
/// A [`WithinError`]: the work's error, a step of the store that failed, or a conflict with a
/// concurrent transaction. See [`WithinErrorKind`](super::WithinErrorKind).
pub async fn within<F, E>(
    engine: &Engine<PostgresStore>,
    conn: &mut PgConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Recorded, E>>,
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
    engine: &Engine<PostgresStore>,
    conn: &mut PgConnection,
    key: StoreKey,
    fingerprint: Fingerprint,
    work: F,
) -> Result<Within, WithinError<E>>
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Recorded, E>>,
{
    let store = engine.store();
    let plain = fingerprint;
    let fingerprint = engine.keyed(plain);
    // In a transaction of its own, a claim that lost to a concurrent transaction is tried once
    // more in a new one, whose snapshot sees what the other did; in the caller's transaction
    // the snapshot is the caller's.
    let own = !conn.is_in_transaction();
    let mut tried = false;
    let (mut tx, claim, lifted) = loop {
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| WithinError::store(OpError::from(e).into_store("PostgreSQL begin")))?;
        let started = engine.timer().start(Op::Claim);
        let held = store
            .claim_held(&mut tx, &key, &fingerprint, engine.lease())
            .await;
        engine.timer().record(Op::Claim, started, &held);
        match held {
            Ok(Held::Found(claim, lifted)) => break (tx, claim, lifted),
            Ok(Held::Conflict) if own && !tried => {
                tried = true;
                let _ = rolled_back(tx, ()).await;
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
                Ok(response) => match finish(store, tx, own, lifted).await {
                    Ok(()) => (Settled::Completed, Ok(Within::Recorded(response))),
                    // Nothing was committed: the key is free.
                    Err(Ended::Conflict(e)) => (Settled::Released, Err(WithinError::conflict(e))),
                    Err(Ended::Failed(e)) => (Settled::CompleteFailed, Err(WithinError::store(e))),
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

/// Runs the step `name` of a request's work in one PostgreSQL transaction with its record, or
/// answers it from its record. See [steps in a transaction](super#steps-in-a-transaction).
///
/// `steps` are the request's, from [`Engine::steps`] on the same engine. `conn` is a
/// connection, or your own transaction (`&mut *tx`): the step then works in a savepoint and
/// leaves the commit to you. The step's place and name follow the rules of [`Steps::run`],
/// and its place is taken when `step` is called.
///
/// When the step is recorded, its value is decoded with `codec` and returned, and `work` does
/// not run. Otherwise a transaction begins on `conn`, and `work` runs on it. Its `Ok` value is
/// encoded with `codec` and recorded in that transaction, which then commits. The work is
/// written `|tx| Box::pin(async move { … })`, as for [`within`].
///
/// If an overlapping run recorded the step first, this one rolls back and returns the first's
/// value, with the metric `idempotency_steps_total{result="overlapped"}`.
///
/// # Errors
/// A [`StepError`]:
/// - [`Work`](crate::engine::StepErrorKind::Work): the work's error. Everything was rolled
///   back and nothing recorded.
/// - [`Store`](crate::engine::StepErrorKind::Store): the recorded steps could not be read, or
///   the record or the commit failed, or the value cannot be encoded within the record limit.
///   The work was rolled back, except after a lost commit, which may have happened.
/// - [`Conflict`](crate::engine::StepErrorKind::Conflict): PostgreSQL rolled the transaction
///   back for a concurrent one. Run the request again, in a new transaction.
/// - [`NotClaimed`](crate::engine::StepErrorKind::NotClaimed): `steps` were made by an engine
///   over another store than `engine`'s. Nothing ran.
/// - [`ClaimLost`](crate::engine::StepErrorKind::ClaimLost),
///   [`KeyReused`](crate::engine::StepErrorKind::KeyReused), a bad name or order, or a record
///   that fails validation, as for [`Steps::run`]. Nothing ran.
pub fn step<'a, T, E, C, F>(
    engine: &'a Engine<PostgresStore>,
    steps: &'a Steps,
    conn: &'a mut PgConnection,
    name: &str,
    codec: C,
    work: F,
) -> impl Future<Output = Result<T, StepError<E>>> + Send + 'a
where
    C: Codec<T>,
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<T, E>> + Send + 'a,
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
        // A record written under another store's key would never be read back, and the claim
        // checked would be another's: the step does not run.
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
        let own = !conn.is_in_transaction();
        let mut tx = conn
            .begin()
            .await
            .map_err(|e| failed(e.into(), "PostgreSQL begin"))?;
        let lifted = match store.lift(&mut tx).await {
            Ok(lifted) => lifted,
            Err(e) => return rolled_back(tx, Err(failed(e, "PostgreSQL settings"))).await,
        };
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
        let op = "PostgreSQL record step in a transaction";
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
            Ok(Some(StepRecorded::Recorded)) => match finish(store, tx, own, lifted).await {
                Ok(()) => {
                    metrics::step(StepResult::Ran);
                    Ok(value)
                }
                Err(Ended::Conflict(e)) => Err(failed(e.into(), "PostgreSQL commit")),
                Err(Ended::Failed(e)) => Err(StepError::not_recorded(e, place, &name)),
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

/// How the commit failed.
enum Ended {
    /// PostgreSQL rolled the transaction back for a concurrent one.
    Conflict(sqlx::Error),
    /// Any other failure. On a lost connection, whether it committed is unknown.
    Failed(StoreError),
}

/// Puts back the store's `statement_timeout` where the caller's transaction goes on, then
/// commits. On the caller's transaction, committing releases the savepoint.
async fn finish(
    store: &PostgresStore,
    mut tx: Transaction<'_, Postgres>,
    own: bool,
    lifted: Lifted,
) -> Result<(), Ended> {
    let ended = |e: OpError, op| match e.into_conflict() {
        Ok(e) => Ended::Conflict(e),
        Err(e) => Ended::Failed(e.into_store(op)),
    };
    if !own && let Err(e) = store.restore(&mut tx, lifted).await {
        let failed = ended(e, "PostgreSQL settings");
        return Err(rolled_back(tx, failed).await);
    }
    tx.commit()
        .await
        .map_err(|e| ended(OpError::from(e), "PostgreSQL commit"))
}

/// Runs the work and writes its record in the transaction. On an error the caller rolls back.
/// The error comes with how that ends the key, and the caller counts it.
async fn ran<F, E>(
    engine: &Engine<PostgresStore>,
    tx: &mut Transaction<'_, Postgres>,
    ticket: &Ticket,
    work: F,
) -> Result<Recorded, (Settled, WithinError<E>)>
where
    F: for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Recorded, E>>,
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
    let op = "PostgreSQL complete in a transaction";
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
        // The transaction lost to a concurrent one (serializable): it will not commit.
        Err(e) => match e.into_conflict() {
            Ok(e) => Err((Settled::Released, WithinError::conflict(e))),
            Err(e) => Err((
                Settled::CompleteFailed,
                WithinError::store(e.into_store(op)),
            )),
        },
    }
}

/// Rolls the transaction or savepoint back, then answers `outcome`. A rollback that fails
/// leaves the connection broken, which rolls back on the server all the same.
async fn rolled_back<T>(tx: Transaction<'_, Postgres>, outcome: T) -> T {
    if let Err(e) = tx.rollback().await {
        tracing::debug!(error = %e, "idempotency: rollback failed");
    }
    outcome
}
