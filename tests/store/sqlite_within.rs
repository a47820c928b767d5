//! The transactional door on a real SQLite file: `transactional::sqlite::within` commits an
//! order and its record together or not at all; racers place one order; a repeat waits,
//! replays, or is told the first is in flight; a failed work or the caller's rollback frees
//! the key; `transactional::sqlite::step` records a step with its writes.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used)]

use crate::support::sqlite_file::SqliteFile;
use bytes::Bytes;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Barrier, oneshot};
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, fingerprint, random_key};
use tower_idempotency::engine::{Begin, BoxFuture, Engine, Fingerprint, Raw, Recorded};
use tower_idempotency::store::sqlite::SqliteStore;
use tower_idempotency::store::sqlite::sqlx::{self, Connection, SqliteConnection, SqlitePool};
use tower_idempotency::store::{Claim, StoreKey};
use tower_idempotency::transactional::sqlite::{step, within};
use tower_idempotency::transactional::{Within, WithinErrorKind};

/// A store with the default settings on `file`, its tables and an `orders` table made.
pub(crate) async fn store_with_orders(file: &SqliteFile) -> SqliteStore {
    let store = SqliteStore::open(file.path(), "transactional")
        .await
        .unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    store
}

pub(crate) async fn orders(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Whether the idempotency table has a row for `key`.
pub(crate) async fn has_record(store: &SqliteStore, key: &StoreKey) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT 1 FROM \"{}\" WHERE key = ?1)",
        store.table()
    )))
    .bind(&store.row_key(key)[..])
    .fetch_one(store.pool())
    .await
    .unwrap()
}

type Work = Box<
    dyn for<'c> FnOnce(&'c mut SqliteConnection) -> BoxFuture<'c, Result<Recorded, sqlx::Error>>
        + Send,
>;

/// Inserts an order and answers 201 with its id; tells `started`, then waits for `go` (when
/// given) before it returns.
fn place_order(started: Option<oneshot::Sender<()>>, go: Option<oneshot::Receiver<()>>) -> Work {
    Box::new(move |tx: &mut SqliteConnection| {
        Box::pin(async move {
            let id: i64 = sqlx::query_scalar("INSERT INTO orders (sku) VALUES ('X') RETURNING id")
                .fetch_one(&mut *tx)
                .await?;
            if let Some(started) = started {
                let _ = started.send(());
            }
            if let Some(go) = go {
                let _ = go.await;
            }
            Ok(Recorded::new(
                201,
                vec![],
                Some(Bytes::from(format!(r#"{{"id":{id}}}"#))),
            ))
        })
    })
}

async fn run(
    engine: &Engine<SqliteStore>,
    conn: &mut SqliteConnection,
    key: StoreKey,
    fp: Fingerprint,
    work: Work,
) -> Within {
    within(engine, conn, key, fp, work).await.unwrap()
}

fn ran(outcome: &Within) -> &Recorded {
    match outcome {
        Within::Recorded(r) => r,
        other => panic!("the work must run, got {other:?}"),
    }
}

#[tokio::test]
async fn with_the_defaults_the_order_and_its_record_commit_together_and_a_repeat_replays() {
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    let pool = store.pool().clone();
    let engine = Engine::new(store);
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();

    let first = run(&engine, &mut conn, key, fp, place_order(None, None)).await;
    let response = ran(&first).clone();
    assert_eq!(response.status, 201);
    assert_eq!(orders(&pool).await, 1);
    assert!(has_record(engine.store(), &key).await);

    match run(&engine, &mut conn, key, fp, place_order(None, None)).await {
        Within::Replayed(r) => assert_eq!(r, response, "the repeat gets the first's response"),
        other => panic!("a repeat must replay, got {other:?}"),
    }
    assert_eq!(orders(&pool).await, 1, "the repeat placed no order");
    // The layer's path reads the same record.
    assert!(matches!(
        engine.store().claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
    // Another request under the key is refused.
    let other = run(
        &engine,
        &mut conn,
        key,
        fingerprint("other"),
        place_order(None, None),
    )
    .await;
    assert!(matches!(other, Within::KeyReused), "{other:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_racers_on_their_own_connections_place_one_order() {
    const RACERS: usize = 8;
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    // Each racer on a connection of its own, as eight processes would be.
    let url = format!("sqlite://{}", file.path().display());
    let engine = Arc::new(Engine::new(store));
    let (key, fp) = (random_key(), fingerprint("order"));
    let barrier = Arc::new(Barrier::new(RACERS));
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (engine, barrier, url) = (Arc::clone(&engine), Arc::clone(&barrier), url.clone());
            tokio::spawn(async move {
                let mut conn = SqliteConnection::connect(&url).await.unwrap();
                barrier.wait().await;
                let work: Work = Box::new(move |tx: &mut SqliteConnection| {
                    Box::pin(async move {
                        let response = place_order(None, None)(&mut *tx).await;
                        // Hold the key a while, so the others pile up behind it.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        response
                    })
                });
                run(&engine, &mut conn, key, fp, work).await
            })
        })
        .collect();
    let (mut ran, mut replayed, mut in_flight) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            Within::Recorded(_) => ran += 1,
            Within::Replayed(r) => {
                assert_eq!(r.status, 201);
                replayed += 1;
            }
            Within::InFlight => in_flight += 1,
            other => panic!("a racer must replay or be in flight, got {other:?}"),
        }
    }
    eprintln!("{RACERS} racers: {ran} ran, {replayed} replayed, {in_flight} in flight");
    assert_eq!(ran, 1, "exactly one of {RACERS} racers runs");
    assert_eq!(orders(engine.store().pool()).await, 1, "one order row");
}

#[tokio::test]
async fn a_failed_work_rolls_back_and_frees_the_key() {
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    let pool = store.pool().clone();
    let engine = Engine::new(store);
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();
    let failed = within(&engine, &mut conn, key, fp, |tx| {
        Box::pin(async move {
            sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
                .execute(&mut *tx)
                .await
                .unwrap();
            Err::<Recorded, _>("out of stock")
        })
    })
    .await
    .unwrap_err();
    assert_eq!(failed.kind(), WithinErrorKind::Work);
    assert_eq!(failed.into_inner(), Some("out of stock"));
    assert_eq!(orders(&pool).await, 0, "the work's write was rolled back");
    assert!(!has_record(engine.store(), &key).await, "no claim left");
    ran(&run(&engine, &mut conn, key, fp, place_order(None, None)).await);
    assert_eq!(orders(&pool).await, 1);
}

#[tokio::test]
async fn rolling_back_the_callers_transaction_frees_the_key() {
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    let pool = store.pool().clone();
    let engine = Engine::new(store);
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();
    {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        ran(&run(&engine, &mut tx, key, fp, place_order(None, None)).await);
        tx.rollback().await.unwrap();
    }
    assert_eq!(orders(&pool).await, 0);
    assert!(!has_record(engine.store(), &key).await);
    ran(&run(&engine, &mut conn, key, fp, place_order(None, None)).await);
    assert_eq!(orders(&pool).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_a_duplicate_past_the_lock_wait_is_in_flight_then_replays() {
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    let pool = store.pool().clone();
    let engine = Arc::new(Engine::new(store));
    let (key, fp) = (random_key(), fingerprint("order"));
    let (started, is_started) = oneshot::channel();
    let (go, wait) = oneshot::channel();
    let first = {
        let (engine, pool) = (Arc::clone(&engine), pool.clone());
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            run(
                &engine,
                &mut conn,
                key,
                fp,
                place_order(Some(started), Some(wait)),
            )
            .await
        })
    };
    is_started.await.unwrap();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("PRAGMA busy_timeout = 4321")
        .execute(&mut *conn)
        .await
        .unwrap();
    // The first holds the write lock past the 1 s lock wait.
    let repeat = run(&engine, &mut conn, key, fp, place_order(None, None)).await;
    assert!(matches!(repeat, Within::InFlight), "{repeat:?}");
    go.send(()).unwrap();
    let first = first.await.unwrap();
    let response = ran(&first).clone();
    match run(&engine, &mut conn, key, fp, place_order(None, None)).await {
        Within::Replayed(r) => assert_eq!(r, response),
        other => panic!("the repeat after the commit replays, got {other:?}"),
    }
    assert_eq!(orders(&pool).await, 1);
    // The connection's own busy timeout is back after the claim.
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(busy, 4321);
}

#[tokio::test]
async fn a_step_and_its_writes_commit_together_and_a_retry_reads_it_back() {
    let file = SqliteFile::new();
    let store = store_with_orders(&file).await;
    let pool = store.pool().clone();
    let engine = Engine::builder(store).lease(LONG).build();
    let (key, fp) = (random_key(), fingerprint("checkout"));
    let id = {
        let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
            panic!("a free key runs");
        };
        let steps = engine.steps(&ticket);
        let mut conn = pool.acquire().await.unwrap();
        let id: String = step(&engine, &steps, &mut conn, "reserve", Raw, |tx| {
            Box::pin(async move {
                sqlx::query_scalar(
                    "INSERT INTO orders (sku) VALUES ('X') RETURNING CAST(id AS TEXT)",
                )
                .fetch_one(&mut *tx)
                .await
            })
        })
        .await
        .unwrap();
        // The process dies before the request completes: the claim is released.
        assert!(engine.release(ticket).await.unwrap());
        id
    };
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("the released key runs again");
    };
    let steps = engine.steps(&ticket);
    let mut conn = pool.acquire().await.unwrap();
    let again: String = step(&engine, &steps, &mut conn, "reserve", Raw, |_tx| {
        Box::pin(async { panic!("a recorded step does not run") as Result<String, sqlx::Error> })
    })
    .await
    .unwrap();
    assert_eq!(again, id, "the retry reads the step's result back");
    assert_eq!(orders(&pool).await, 1, "one order");
}

#[tokio::test]
async fn a_step_given_the_engine_of_another_prefix_on_the_same_table_is_refused_and_does_not_run() {
    // Two applications share one file and table under prefixes of their own. A step of the
    // first's request handed to the second's engine would record under the second's keys,
    // where the first's retry never looks: the retry would run the step again.
    let file = SqliteFile::new();
    let first = store_with_orders(&file).await;
    let pool = first.pool().clone();
    let second = SqliteStore::open(file.path(), "another-application")
        .await
        .unwrap();
    assert_eq!(first.table(), second.table());
    let (first, second) = (
        Engine::builder(first).lease(LONG).build(),
        Engine::new(second),
    );
    let Begin::Run(ticket) = first
        .begin(random_key(), fingerprint("checkout"))
        .await
        .unwrap()
    else {
        panic!("a free key runs");
    };
    let steps = first.steps(&ticket);
    let mut conn = pool.acquire().await.unwrap();
    let refused = step(&second, &steps, &mut conn, "reserve", Raw, |tx| {
        Box::pin(async move {
            sqlx::query_scalar::<_, String>(
                "INSERT INTO orders (sku) VALUES ('X') RETURNING CAST(id AS TEXT)",
            )
            .fetch_one(&mut *tx)
            .await
        })
    })
    .await
    .expect_err("the steps belong to another engine's store");
    assert_eq!(
        refused.kind(),
        tower_idempotency::engine::StepErrorKind::NotClaimed
    );
    assert_eq!(orders(&pool).await, 0, "the step's work did not run");
}
