//! Steps in a transaction on a real PostgreSQL server: `transactional::step` commits a step's
//! business rows and its record together or not at all, answers a committed step on a retry,
//! and keeps the first record when two runs of a step overlap.
//!
//! Without PostgreSQL installed these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use super::postgres_store::{fresh_table, store_on};
use super::postgres_within::until_waiting;
use crate::support::postgres_server::PostgresServer;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, fingerprint, random_key};
use tower_idempotency::engine::{Begin, BoxFuture, Engine, Raw, StepErrorKind, Steps, Ticket};
use tower_idempotency::store::StoreKey;
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::postgres::sqlx::{self, Connection, PgConnection, PgPool};
use tower_idempotency::transactional::step;

async fn engine(server: &PostgresServer) -> Engine<PostgresStore> {
    let store = store_on(server, "tower_idempotency", "steps-tx").await;
    Engine::builder(store).lease(LONG).retention(LONG).build()
}

/// A fresh `orders` table.
async fn orders_table(pool: &PgPool) -> String {
    let table = fresh_table("step_orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, sku text NOT NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    table
}

async fn order_ids(pool: &PgPool, table: &str) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id::text FROM {table} ORDER BY id"
    )))
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Inserts an order and answers its id.
fn order<'c>(table: &str, tx: &'c mut PgConnection) -> BoxFuture<'c, Result<String, sqlx::Error>> {
    let insert = format!("INSERT INTO {table} (sku) VALUES ('X') RETURNING id::text");
    Box::pin(async move {
        sqlx::query_scalar(sqlx::AssertSqlSafe(insert.as_str()))
            .fetch_one(&mut *tx)
            .await
    })
}

/// The steps of a fresh claim of `key`.
async fn claimed(engine: &Engine<PostgresStore>, key: StoreKey) -> (Steps, Ticket) {
    let Begin::Run(ticket) = engine.begin(key, fingerprint("order")).await.unwrap() else {
        panic!("the key must be free");
    };
    (engine.steps(&ticket), ticket)
}

/// An engine whose lease lapses in seconds, for two runs of one request that overlap.
async fn short_lease_engine(server: &PostgresServer) -> Engine<PostgresStore> {
    let store = store_on(server, "tower_idempotency", "steps-tx").await;
    Engine::builder(store)
        .lease(SHORT_LEASE)
        .retention(LONG)
        .build()
}

const SHORT_LEASE: Duration = Duration::from_secs(2);

/// The steps of a second claim of `key`, once the first claim's lease lapsed (a crashed or
/// stalled first run): the two runs overlap.
async fn claimed_after_the_lease(engine: &Engine<PostgresStore>, key: StoreKey) -> (Steps, Ticket) {
    tokio::time::sleep(SHORT_LEASE + Duration::from_secs(1)).await;
    claimed(engine, key).await
}

/// How many steps the store keeps for `key`.
async fn recorded(engine: &Engine<PostgresStore>, key: &StoreKey) -> usize {
    engine.store().steps(key).await.unwrap().len()
}

#[tokio::test]
async fn a_steps_business_row_and_its_record_commit_together() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server).await;
    let pool = server.pool(2).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let (steps, _ticket) = claimed(&engine, key).await;
    let mut conn = pool.acquire().await.unwrap();

    let id: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    assert_eq!(order_ids(&pool, &table).await, vec![id]);
    assert_eq!(recorded(&engine, &key).await, 1, "the step's record");
    assert!(!conn.is_in_transaction(), "its transaction was committed");
}

#[tokio::test]
async fn a_step_whose_work_fails_leaves_neither_row_nor_record() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server).await;
    let pool = server.pool(2).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let (steps, ticket) = claimed(&engine, key).await;
    let mut conn = pool.acquire().await.unwrap();

    let failed = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        let placed = order(&table, tx);
        Box::pin(async move {
            placed.await?;
            Err::<String, _>(sqlx::Error::RowNotFound)
        })
    })
    .await
    .unwrap_err();
    assert_eq!(failed.kind(), StepErrorKind::Work);
    assert!(matches!(
        failed.into_inner(),
        Some(sqlx::Error::RowNotFound)
    ));
    assert!(
        order_ids(&pool, &table).await.is_empty(),
        "the row was rolled back"
    );
    assert_eq!(recorded(&engine, &key).await, 0, "nothing recorded");

    // The retry runs the step.
    assert!(engine.release(ticket).await.unwrap());
    let (steps, _ticket) = claimed(&engine, key).await;
    let id: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    assert_eq!(order_ids(&pool, &table).await, vec![id]);
}

#[tokio::test]
async fn a_retry_answers_the_committed_step_without_running_it() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server).await;
    let pool = server.pool(2).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let runs = AtomicUsize::new(0);
    let mut conn = pool.acquire().await.unwrap();

    let (steps, ticket) = claimed(&engine, key).await;
    let first: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        order(&table, tx)
    })
    .await
    .unwrap();
    // The next step fails: the request is released, to be retried.
    let mail = steps
        .run("mail", Raw, |_| async { Err::<String, _>("mail down") })
        .await;
    assert!(mail.is_err());
    assert!(engine.release(ticket).await.unwrap());

    let (steps, ticket) = claimed(&engine, key).await;
    let again: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        order(&table, tx)
    })
    .await
    .unwrap();
    assert_eq!(again, first, "answered from the record");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
    assert_eq!(order_ids(&pool, &table).await, vec![first]);
    // The names and order of the steps are kept as in `Steps::run`.
    assert!(engine.release(ticket).await.unwrap());
    let (steps, _ticket) = claimed(&engine, key).await;
    let renamed = step(&engine, &steps, &mut conn, "charge", Raw, |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        order(&table, tx)
    })
    .await;
    assert_eq!(
        renamed.map(|_: String| ()).unwrap_err().kind(),
        StepErrorKind::SequenceChanged
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "a step out of order does not run"
    );
}

#[tokio::test]
async fn of_two_overlapping_runs_of_a_step_the_first_record_wins() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = short_lease_engine(server).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    // Two runs of the same request, as after a lapsed lease: the steps of each.
    let (late, _ticket) = claimed(&engine, key).await;
    let mut late_conn = pool.acquire().await.unwrap();
    let mut early_conn = pool.acquire().await.unwrap();

    // The late run places its order and waits; the early one records first meanwhile.
    let (placed, placed_rx) = oneshot::channel();
    let (go, go_rx) = oneshot::channel::<()>();
    let late_run = {
        let (engine, late, table) = (&engine, &late, &table);
        let late_conn = &mut late_conn;
        async move {
            step(engine, late, late_conn, "reserve", Raw, |tx| {
                let placing = order(table, tx);
                Box::pin(async move {
                    let id = placing.await?;
                    let _ = placed.send(());
                    let _ = go_rx.await;
                    Ok::<_, sqlx::Error>(id)
                })
            })
            .await
        }
    };
    let early_run = async {
        placed_rx.await.unwrap();
        let (early, _ticket) = claimed_after_the_lease(&engine, key).await;
        let id: String = step(&engine, &early, &mut early_conn, "reserve", Raw, |tx| {
            order(&table, tx)
        })
        .await
        .unwrap();
        go.send(()).unwrap();
        id
    };
    let (late_id, early_id) = tokio::join!(late_run, early_run);
    let late_id = late_id.unwrap();
    assert_eq!(
        late_id, early_id,
        "the late run gets the first record's value"
    );
    assert_eq!(
        order_ids(&pool, &table).await,
        vec![early_id],
        "the late run's order was rolled back"
    );
    assert_eq!(recorded(&engine, &key).await, 1);
}

#[tokio::test]
async fn a_run_that_meets_an_uncommitted_record_of_its_step_waits_and_takes_it() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = short_lease_engine(server).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let (first, _ticket) = claimed(&engine, key).await;

    // The first run's step is recorded in the caller's transaction, not yet committed.
    let mut caller = pool.begin().await.unwrap();
    let first_id: String = step(&engine, &first, &mut caller, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    assert!(recorded(&engine, &key).await == 0, "not committed yet");
    let (second, _ticket) = claimed_after_the_lease(&engine, key).await;

    // The second run's record waits for the first's transaction.
    let mut conn = pool.acquire().await.unwrap();
    let second_run = step(&engine, &second, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    });
    let commit = async {
        until_waiting(&pool, 1).await;
        caller.commit().await.unwrap();
    };
    let (second_id, ()) = tokio::join!(second_run, commit);
    assert_eq!(second_id.unwrap(), first_id, "the first record wins");
    assert_eq!(
        order_ids(&pool, &table).await,
        vec![first_id],
        "the second run's order was rolled back"
    );
    assert_eq!(recorded(&engine, &key).await, 1);
}

#[tokio::test]
async fn a_step_recorded_while_the_callers_transaction_holds_a_step_does_not_wait_for_it() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let (steps, _ticket) = claimed(&engine, key).await;
    let mut conn = pool.acquire().await.unwrap();
    let _: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();

    // The caller's transaction records a step, which moves the first step's expiry: it holds
    // that row until it commits.
    let mut caller = pool.begin().await.unwrap();
    let _: String = step(&engine, &steps, &mut caller, "charge", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    // A step recorded on the store's own connection meanwhile is recorded, not held up.
    let started = Instant::now();
    let mail: String = steps
        .run("mail", Raw, |_| async { Ok::<_, ()>(String::from("sent")) })
        .await
        .unwrap();
    assert_eq!(mail, "sent");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "it did not wait"
    );
    assert_eq!(
        recorded(&engine, &key).await,
        2,
        "the first and the last step; the caller's is not committed"
    );
    caller.commit().await.unwrap();
    assert_eq!(recorded(&engine, &key).await, 3);
}

#[tokio::test]
async fn under_repeatable_read_a_run_that_loses_its_step_is_a_conflict_and_rolls_back() {
    use std::str::FromStr;
    use tower_idempotency::store::postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = short_lease_engine(server).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let options = PgConnectOptions::from_str(&server.url())
        .unwrap()
        .options([("default_transaction_isolation", "repeatable read")]);
    let repeatable = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let key = random_key();
    let (first, _ticket) = claimed(&engine, key).await;

    let mut caller = pool.begin().await.unwrap();
    let first_id: String = step(&engine, &first, &mut caller, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    let (second, ticket) = claimed_after_the_lease(&engine, key).await;
    let mut conn = repeatable.acquire().await.unwrap();
    let second_run = step(&engine, &second, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    });
    let commit = async {
        until_waiting(&pool, 1).await;
        caller.commit().await.unwrap();
    };
    let (lost, ()) = tokio::join!(second_run, commit);
    let lost = lost.map(|_: String| ()).unwrap_err();
    assert_eq!(lost.kind(), StepErrorKind::Conflict, "{lost:?}");
    assert!(lost.is_retryable());
    assert!(std::error::Error::source(&lost).is_some());
    assert_eq!(
        order_ids(&pool, &table).await,
        vec![first_id.clone()],
        "the second run's order was rolled back"
    );
    // Run again, the request answers the step from the first's record.
    engine.release(ticket).await.unwrap();
    let (again, _ticket) = claimed(&engine, key).await;
    let id: String = step(&engine, &again, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    assert_eq!(id, first_id);
}

#[tokio::test]
async fn a_step_with_steps_of_another_store_is_refused_and_does_not_run() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server).await;
    let pool = server.pool(2).await;
    let table = orders_table(&pool).await;
    // The steps of a claim made by an engine over the memory store.
    let memory = Engine::new(tower_idempotency::MemoryStore::new());
    let Begin::Run(ticket) = memory
        .begin(random_key(), fingerprint("order"))
        .await
        .unwrap()
    else {
        panic!("the key must be free");
    };
    let steps = memory.steps(&ticket);
    let mut conn = pool.acquire().await.unwrap();

    let e = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap_err();
    assert_eq!(e.kind(), StepErrorKind::NotClaimed, "{e}");
    assert!(e.to_string().contains("another store"), "{e}");
    assert!(
        order_ids(&pool, &table).await.is_empty(),
        "the step did not run"
    );
}

/// The common wiring: the layer (or one engine) and the handler's engine are each built from a
/// clone of one `PostgresStore`, the same pool and table. The steps are that store's, so a step
/// in a transaction runs: a clone is not "another store".
#[tokio::test]
async fn steps_of_an_engine_over_a_clone_of_the_same_store_run_in_a_transaction() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let store = store_on(server, "tower_idempotency", "steps-tx").await;
    let layer_engine = Engine::builder(store.clone())
        .lease(LONG)
        .retention(LONG)
        .build();
    let handler_engine = Engine::builder(store).lease(LONG).retention(LONG).build();
    let pool = server.pool(2).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let (steps, _ticket) = claimed(&layer_engine, key).await;
    let mut conn = pool.acquire().await.unwrap();

    let id: String = step(&handler_engine, &steps, &mut conn, "reserve", Raw, |tx| {
        order(&table, tx)
    })
    .await
    .unwrap();
    assert_eq!(order_ids(&pool, &table).await, vec![id]);
    assert_eq!(recorded(&layer_engine, &key).await, 1, "the step's record");
}
