//! The transactional door on a real PostgreSQL server: `transactional::within` commits an
//! order and its record together or not at all; repeats wait, replay, or are told the first is in flight; a crash
//! or a rollback leaves neither and frees the key.
//!
//! Without PostgreSQL installed these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use super::postgres_store::{fresh_table, store_on};
use crate::support::postgres_server::PostgresServer;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Barrier, oneshot};
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, SHORT, fingerprint, random_key};
use tower_idempotency::engine::BoxFuture;
use tower_idempotency::engine::{Engine, Fingerprint, Recorded};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::postgres::sqlx::{self, Connection, PgConnection, PgPool};
use tower_idempotency::store::{Claim, StoreKey};
use tower_idempotency::transactional::{Within, WithinErrorKind, within};

/// An engine over the shared server's default table, with this lock wait.
async fn engine(server: &PostgresServer, lock_timeout: Duration) -> Engine<PostgresStore> {
    store_on(server, "tower_idempotency", "transactional").await;
    let store = PostgresStore::builder("transactional")
        .lock_timeout(lock_timeout)
        .connect(&server.url())
        .await
        .unwrap();
    Engine::builder(store).lease(LONG).retention(LONG).build()
}

/// A fresh `orders` table.
async fn orders_table(pool: &PgPool) -> String {
    let table = fresh_table("orders");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, sku text NOT NULL)"
    )))
    .execute(pool)
    .await
    .unwrap();
    table
}

async fn orders(pool: &PgPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Whether the idempotency table has a row for `key`.
async fn has_record(pool: &PgPool, store: &PostgresStore, key: &StoreKey) -> bool {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT EXISTS (SELECT FROM {} WHERE key = $1)",
        store.table()
    )))
    .bind(&store.row_key(key)[..])
    .fetch_one(pool)
    .await
    .unwrap()
}

type Work = Box<
    dyn for<'c> FnOnce(&'c mut PgConnection) -> BoxFuture<'c, Result<Recorded, sqlx::Error>> + Send,
>;

/// Inserts an order and answers 201 with its id; first tells `started` the backend's pid, then
/// waits for `go` (when given) before it returns.
fn place_order(
    table: &str,
    started: Option<oneshot::Sender<i32>>,
    go: Option<oneshot::Receiver<()>>,
) -> Work {
    let table = table.to_owned();
    Box::new(move |tx: &mut PgConnection| {
        Box::pin(async move {
            let id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {table} (sku) VALUES ('X') RETURNING id"
            )))
            .fetch_one(&mut *tx)
            .await?;
            if let Some(started) = started {
                let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(&mut *tx)
                    .await?;
                let _ = started.send(pid);
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
    engine: &Engine<PostgresStore>,
    conn: &mut PgConnection,
    key: StoreKey,
    fp: Fingerprint,
    work: Work,
) -> Within {
    within(engine, conn, key, fp, work).await.unwrap()
}

/// Waits until the backend `pid` has ended (its transaction rolled back).
async fn backend_gone(pool: &PgPool, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)")
                .bind(pid)
                .fetch_one(pool)
                .await
                .unwrap();
        if !alive {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "backend {pid} still alive after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ran(outcome: &Within) -> &Recorded {
    match outcome {
        Within::Recorded(r) => r,
        other => panic!("the work must run, got {other:?}"),
    }
}

#[tokio::test]
async fn the_order_and_its_record_commit_together_and_a_repeat_replays() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();

    let first = run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await;
    let response = ran(&first).clone();
    assert_eq!(response.status, 201);
    assert_eq!(orders(&pool, &table).await, 1);
    assert!(has_record(&pool, engine.store(), &key).await);

    match run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await {
        Within::Replayed(r) => assert_eq!(r, response, "the repeat gets the first's response"),
        other => panic!("a repeat must replay, got {other:?}"),
    }
    assert_eq!(orders(&pool, &table).await, 1, "the repeat placed no order");
    // The layer's path reads the same record.
    assert!(matches!(
        engine.store().claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
}

#[tokio::test]
async fn a_crash_during_the_work_leaves_neither_order_nor_record() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_secs(1)).await);
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));

    let (started, pid) = oneshot::channel();
    let (_go, wait) = oneshot::channel::<()>();
    let mut conn = PgConnection::connect(&server.url()).await.unwrap();
    let crashing = {
        let (engine, table) = (Arc::clone(&engine), table.clone());
        tokio::spawn(async move {
            let work = place_order(&table, Some(started), Some(wait));
            let _ = within(&engine, &mut conn, key, fp, work).await;
        })
    };
    let pid = pid.await.unwrap();
    // The process dies with the order inserted: its connection goes with it.
    crashing.abort();
    let _ = crashing.await;
    backend_gone(&pool, pid).await;

    assert_eq!(orders(&pool, &table).await, 0, "no order");
    assert!(!has_record(&pool, engine.store(), &key).await, "no record");
    let mut conn = pool.acquire().await.unwrap();
    let retry = run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await;
    ran(&retry);
    assert_eq!(
        orders(&pool, &table).await,
        1,
        "the retry placed the order once"
    );
}

#[tokio::test]
async fn a_crash_before_the_callers_commit_leaves_neither_order_nor_record() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));

    let mut conn = PgConnection::connect(&server.url()).await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    let mut tx = conn.begin().await.unwrap();
    let outcome = run(&engine, &mut tx, key, fp, place_order(&table, None, None)).await;
    ran(&outcome);
    // The work and the record are written into the caller's transaction; the process dies
    // before it commits.
    drop(tx);
    drop(conn);
    backend_gone(&pool, pid).await;

    assert_eq!(orders(&pool, &table).await, 0, "no order");
    assert!(!has_record(&pool, engine.store(), &key).await, "no record");
    let mut conn = pool.acquire().await.unwrap();
    ran(&run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await);
    assert_eq!(orders(&pool, &table).await, 1);
}

#[tokio::test]
async fn a_hundred_concurrent_duplicates_place_one_order() {
    const TASKS: u32 = 100;
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_secs(10)).await);
    let pool = server.pool(TASKS + 2).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let barrier = Arc::new(Barrier::new(TASKS as usize));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (engine, pool, table, barrier) = (
                Arc::clone(&engine),
                pool.clone(),
                table.clone(),
                Arc::clone(&barrier),
            );
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                barrier.wait().await;
                let work: Work = {
                    let table = table.clone();
                    Box::new(move |tx: &mut PgConnection| {
                        Box::pin(async move {
                            let response = place_order(&table, None, None)(&mut *tx).await;
                            // Hold the key a while, so the others pile up behind it.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            response
                        })
                    })
                };
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
            other => panic!("a repeat must replay or be in flight, got {other:?}"),
        }
    }
    eprintln!("{TASKS} repeats: {ran} ran, {replayed} replayed, {in_flight} in flight");
    assert_eq!(ran, 1, "exactly one of {TASKS} repeats runs");
    assert!(replayed > 0, "repeats that waited get the first's response");
    assert_eq!(orders(&pool, &table).await, 1, "one order row");
}

#[tokio::test]
async fn a_failed_work_rolls_back_and_frees_the_key() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();

    let failing: Work = {
        let table = table.clone();
        Box::new(move |tx: &mut PgConnection| {
            Box::pin(async move {
                place_order(&table, None, None)(&mut *tx).await?;
                Err(sqlx::Error::Protocol("payment declined".into()))
            })
        })
    };
    match within(&engine, &mut conn, key, fp, failing).await {
        Err(e) if e.kind() == WithinErrorKind::Work => {
            assert!(!e.is_retryable() && e.store_error().is_none());
            match e.into_inner() {
                Some(sqlx::Error::Protocol(m)) => assert_eq!(m, "payment declined"),
                other => panic!("the work's error must come back, got {other:?}"),
            }
        }
        other => panic!("the work's error must come back, got {other:?}"),
    }
    assert_eq!(orders(&pool, &table).await, 0, "the order was rolled back");
    assert!(
        !has_record(&pool, engine.store(), &key).await,
        "and the claim"
    );
    ran(&run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await);
    assert_eq!(orders(&pool, &table).await, 1, "a retry runs");
}

#[tokio::test]
async fn rolling_back_the_callers_transaction_frees_the_key() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let mut conn = pool.acquire().await.unwrap();

    let mut tx = conn.begin().await.unwrap();
    ran(&run(&engine, &mut tx, key, fp, place_order(&table, None, None)).await);
    tx.rollback().await.unwrap();
    assert_eq!(orders(&pool, &table).await, 0);
    assert!(!has_record(&pool, engine.store(), &key).await);

    let mut tx = conn.begin().await.unwrap();
    ran(&run(&engine, &mut tx, key, fp, place_order(&table, None, None)).await);
    tx.commit().await.unwrap();
    assert_eq!(orders(&pool, &table).await, 1);
    assert!(has_record(&pool, engine.store(), &key).await);
}

/// Starts a first request that inserts its order and holds the key until `go` is sent.
async fn hold(
    engine: &Arc<Engine<PostgresStore>>,
    pool: &PgPool,
    table: &str,
    key: StoreKey,
    fp: Fingerprint,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<Within>) {
    let (started, pid) = oneshot::channel();
    let (go, wait) = oneshot::channel();
    let (engine, pool, table) = (Arc::clone(engine), pool.clone(), table.to_owned());
    let first = tokio::spawn(async move {
        let mut conn = pool.acquire().await.unwrap();
        run(
            &engine,
            &mut conn,
            key,
            fp,
            place_order(&table, Some(started), Some(wait)),
        )
        .await
    });
    pid.await.unwrap();
    (go, first)
}

#[tokio::test]
async fn a_duplicate_waits_for_the_first_and_replays_it() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_secs(10)).await);
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let (go, first) = hold(&engine, &pool, &table, key, fp).await;

    let repeat = {
        let (engine, pool, table) = (Arc::clone(&engine), pool.clone(), table.clone());
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!repeat.is_finished(), "the repeat waits on the first's row");
    go.send(()).unwrap();
    let first = first.await.unwrap();
    match repeat.await.unwrap() {
        Within::Replayed(r) => assert_eq!(&r, ran(&first), "the first's response"),
        other => panic!("the repeat must replay once the first commits, got {other:?}"),
    }
    assert_eq!(orders(&pool, &table).await, 1);
}

#[tokio::test]
async fn a_duplicate_past_the_lock_wait_is_in_flight_and_its_transaction_goes_on() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_millis(200)).await);
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let (go, first) = hold(&engine, &pool, &table, key, fp).await;

    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    let started = Instant::now();
    let outcome = run(&engine, &mut tx, key, fp, place_order(&table, None, None)).await;
    assert!(
        matches!(outcome, Within::InFlight),
        "past the lock wait the repeat is in flight, got {outcome:?}"
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(5),
        "waited {waited:?} for a 200 ms lock wait"
    );
    // The caller's transaction is still usable: the failed claim was rolled back to its
    // savepoint.
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(one, 1);
    tx.commit().await.unwrap();

    go.send(()).unwrap();
    ran(&first.await.unwrap());
    assert!(matches!(
        run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await,
        Within::Replayed(_)
    ));
    assert_eq!(orders(&pool, &table).await, 1);
}

#[tokio::test]
async fn another_request_under_the_key_is_key_reused() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let key = random_key();
    let mut conn = pool.acquire().await.unwrap();
    ran(&run(
        &engine,
        &mut conn,
        key,
        fingerprint("a"),
        place_order(&table, None, None),
    )
    .await);
    let other = run(
        &engine,
        &mut conn,
        key,
        fingerprint("b"),
        place_order(&table, None, None),
    )
    .await;
    assert!(matches!(other, Within::KeyReused), "got {other:?}");
    assert_eq!(
        orders(&pool, &table).await,
        1,
        "the other request did not run"
    );
}

#[tokio::test]
async fn a_repeatable_read_duplicate_that_began_before_the_commit_is_in_flight() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));

    let mut late = pool.acquire().await.unwrap();
    let mut snapshot = late.begin().await.unwrap();
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *snapshot)
        .await
        .unwrap();
    sqlx::query("SELECT 1")
        .execute(&mut *snapshot)
        .await
        .unwrap(); // takes the snapshot

    let mut conn = pool.acquire().await.unwrap();
    ran(&run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await);

    let outcome = run(
        &engine,
        &mut snapshot,
        key,
        fp,
        place_order(&table, None, None),
    )
    .await;
    assert!(
        matches!(outcome, Within::InFlight),
        "a snapshot older than the record cannot replay it: in flight, got {outcome:?}"
    );
    snapshot.rollback().await.unwrap();
    assert!(matches!(
        run(&engine, &mut late, key, fp, place_order(&table, None, None)).await,
        Within::Replayed(_)
    ));
    assert_eq!(orders(&pool, &table).await, 1);
}

#[tokio::test]
async fn the_callers_lock_timeout_is_kept_for_the_work_and_after() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_millis(200)).await;
    let pool = server.pool(2).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '42s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    // The work written in the call, as an application would.
    let outcome = within(&engine, &mut tx, random_key(), fingerprint("a"), |tx| {
        Box::pin(async move {
            let setting: String = sqlx::query_scalar("SHOW lock_timeout")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(Recorded::new(200, vec![], Some(Bytes::from(setting))))
        })
    })
    .await
    .unwrap();
    assert_eq!(
        ran(&outcome).body.as_deref(),
        Some(&b"42s"[..]),
        "the work runs with the caller's lock_timeout"
    );
    let after: String = sqlx::query_scalar("SHOW lock_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(after, "42s", "and keeps it after");
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn the_purge_leaves_a_row_that_a_running_transaction_claimed_again_alone() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("reclaim");
    let store = store_on(server, &table, "transactional").await;
    let engine = Arc::new(
        Engine::builder(store.clone())
            .lease(LONG)
            .retention(LONG)
            .build(),
    );
    let pool = server.pool(4).await;
    let orders_t = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    // A claim whose lease lapses: an expired row, eligible for the purge.
    assert!(matches!(
        store.claim(&key, &fp, SHORT).await.unwrap(),
        Claim::Claimed(_)
    ));
    tokio::time::sleep(Duration::from_millis(600)).await;

    // A transaction claims the key again (taking the expired row over) and is still running.
    let (go, first) = hold(&engine, &pool, &orders_t, key, fp).await;
    let started = Instant::now();
    assert_eq!(
        store.purge().await.unwrap(),
        0,
        "the held row is left alone"
    );
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "without waiting for it"
    );
    go.send(()).unwrap();
    ran(&first.await.unwrap());
    assert_eq!(
        store.purge().await.unwrap(),
        0,
        "the re-claimed row is live"
    );
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
    assert_eq!(orders(&pool, &orders_t).await, 1);
}

/// Feature `metrics`: each `within` counted once under the door `within`, its steps timed.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn within_counts_each_outcome_once() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    // `name{k=v,…}` → increase since the last look, for the counters that moved and the
    // number of timings.
    let seen = || -> std::collections::BTreeMap<String, u64> {
        snap.snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(ck, _, _, v)| {
                let key = ck.key();
                let mut labels: Vec<String> = key
                    .labels()
                    .map(|l| format!("{}={}", l.key(), l.value()))
                    .collect();
                labels.sort();
                let n = match v {
                    DebugValue::Counter(n) => n,
                    DebugValue::Histogram(xs) => xs.len() as u64,
                    DebugValue::Gauge(_) => 0,
                };
                (n > 0).then(|| (format!("{}{{{}}}", key.name(), labels.join(",")), n))
            })
            .collect()
    };
    let engine = engine(server, Duration::from_secs(1)).await;
    let pool = server.pool(4).await;
    let table = orders_table(&pool).await;
    let mut conn = pool.acquire().await.unwrap();
    let _ = seen();

    let (key, fp) = (random_key(), fingerprint("order"));
    ran(&run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await);
    let first = seen();
    assert_eq!(
        first.get("idempotency_requests_total{door=within,outcome=ran}"),
        Some(&1)
    );
    assert_eq!(
        first.get("idempotency_results_total{door=within,result=completed}"),
        Some(&1)
    );
    for op in ["claim", "complete"] {
        let timing =
            format!("idempotency_store_duration_seconds{{op={op},result=ok,store=postgres}}");
        assert_eq!(first.get(&timing), Some(&1), "{timing} in {first:?}");
    }

    let replay = run(&engine, &mut conn, key, fp, place_order(&table, None, None)).await;
    assert!(matches!(replay, Within::Replayed(_)));
    let second = seen();
    assert_eq!(
        second.get("idempotency_requests_total{door=within,outcome=replayed}"),
        Some(&1),
        "{second:?}"
    );

    let failing: Work = Box::new(|_| Box::pin(async { Err(sqlx::Error::RowNotFound) }));
    let failed = within(&engine, &mut conn, random_key(), fp, failing).await;
    assert!(matches!(failed, Err(e) if e.kind() == WithinErrorKind::Work));
    let third = seen();
    assert_eq!(
        third.get("idempotency_requests_total{door=within,outcome=ran}"),
        Some(&1)
    );
    assert_eq!(
        third.get("idempotency_results_total{door=within,result=released}"),
        Some(&1),
        "a failed work rolls back and frees the key: {third:?}"
    );
}

/// Backends waiting for a lock (a repeat queued behind the first's row).
async fn lock_waiters(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Waits (bounded) until at least `n` backends wait for a lock.
pub(crate) async fn until_waiting(pool: &PgPool, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while lock_waiters(pool).await < n {
        assert!(Instant::now() < deadline, "no backend waits for the lock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pool of the test's own whose transactions default to `isolation`, as a database or role
/// setting would make them.
async fn pool_at(server: &PostgresServer, isolation: &str, size: u32) -> PgPool {
    use std::str::FromStr;
    use tower_idempotency::store::postgres::sqlx::postgres::{PgConnectOptions, PgPoolOptions};
    let options = PgConnectOptions::from_str(&server.url())
        .unwrap()
        // sqlx escapes the space in the value.
        .options([("default_transaction_isolation", isolation)]);
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap()
}

/// An engine over the shared server's default table, on the pool the store connects itself
/// (its `statement_timeout` is four fifths of the store's 1 s timeout).
async fn engine_on_own_pool(
    server: &PostgresServer,
    lock_timeout: Duration,
) -> Engine<PostgresStore> {
    engine(server, lock_timeout).await
}

#[tokio::test]
async fn on_the_stores_own_pool_a_duplicate_waits_past_its_statement_timeout_and_replays() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    // The store's pool bounds its statements at 1 s; the lock wait is longer.
    let engine = Arc::new(engine_on_own_pool(server, Duration::from_secs(20)).await);
    let pool = engine.store().pool().clone();
    let watch = server.pool(2).await;
    let table = orders_table(&watch).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let (go, first) = hold(&engine, &pool, &table, key, fp).await;

    let repeat = {
        let (engine, pool, table) = (Arc::clone(&engine), pool.clone(), table.clone());
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            within(&engine, &mut conn, key, fp, place_order(&table, None, None)).await
        })
    };
    until_waiting(&watch, 1).await;
    // Longer than the pool's statement_timeout.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !repeat.is_finished(),
        "the repeat still waits: {:?}",
        repeat.await
    );
    go.send(()).unwrap();
    let first = first.await.unwrap();
    match repeat.await.unwrap() {
        Ok(Within::Replayed(r)) => assert_eq!(&r, ran(&first)),
        other => panic!("the repeat must replay once the first commits, got {other:?}"),
    }
    assert_eq!(orders(&watch, &table).await, 1);
}

#[tokio::test]
async fn on_the_stores_own_pool_with_the_defaults_a_duplicate_past_the_lock_wait_is_in_flight() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    // Lock wait 1 s, above the pool's statement_timeout: the lock wait must answer first.
    let engine = Arc::new(
        engine_on_own_pool(
            server,
            // The store's default lock wait, as its docs say.
            Duration::from_secs(1),
        )
        .await,
    );
    let pool = engine.store().pool().clone();
    let watch = server.pool(2).await;
    let table = orders_table(&watch).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let (go, first) = hold(&engine, &pool, &table, key, fp).await;

    let mut conn = pool.acquire().await.unwrap();
    let outcome = within(&engine, &mut conn, key, fp, place_order(&table, None, None)).await;
    assert!(
        matches!(outcome, Ok(Within::InFlight)),
        "past the lock wait the repeat is in flight, got {outcome:?}"
    );
    go.send(()).unwrap();
    ran(&first.await.unwrap());
    assert_eq!(orders(&watch, &table).await, 1);
}

#[tokio::test]
async fn on_the_stores_own_pool_the_work_is_not_cut_by_the_stores_statement_timeout() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine_on_own_pool(server, Duration::from_secs(1)).await;
    let mut conn = engine.store().pool().acquire().await.unwrap();
    // Longer than the store's 1 s.
    fn slow(tx: &mut PgConnection) -> BoxFuture<'_, Result<Recorded, sqlx::Error>> {
        Box::pin(async move {
            sqlx::query("SELECT pg_sleep(1.3)")
                .execute(&mut *tx)
                .await?;
            let setting: String = sqlx::query_scalar("SHOW statement_timeout")
                .fetch_one(&mut *tx)
                .await?;
            Ok(Recorded::new(200, vec![], Some(Bytes::from(setting))))
        })
    }
    let outcome = within(&engine, &mut conn, random_key(), fingerprint("slow"), slow).await;
    match outcome {
        Ok(Within::Recorded(r)) => assert_eq!(r.body.as_deref(), Some(&b"0"[..])),
        other => panic!("the slow work must run to its end, got {other:?}"),
    }
    async fn show(conn: &mut PgConnection) -> String {
        sqlx::query_scalar("SHOW statement_timeout")
            .fetch_one(conn)
            .await
            .unwrap()
    }
    // Four fifths of the store's 1 s: the server cancels a slow step before the store gives up.
    assert_eq!(
        show(&mut conn).await,
        "800ms",
        "the store's steps keep their bound"
    );

    // In the caller's transaction: lifted for the work, put back after.
    let mut tx = conn.begin().await.unwrap();
    ran(
        &within(&engine, &mut tx, random_key(), fingerprint("slow"), slow)
            .await
            .unwrap(),
    );
    assert_eq!(
        show(&mut tx).await,
        "800ms",
        "put back for the caller's transaction"
    );
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn the_callers_statement_timeout_is_kept_for_the_work_and_after() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = engine(server, Duration::from_millis(200)).await;
    let pool = server.pool(2).await;
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    sqlx::query("SET LOCAL statement_timeout = '42s'")
        .execute(&mut *tx)
        .await
        .unwrap();
    let outcome = within(&engine, &mut tx, random_key(), fingerprint("a"), |tx| {
        Box::pin(async move {
            let setting: String = sqlx::query_scalar("SHOW statement_timeout")
                .fetch_one(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(Recorded::new(200, vec![], Some(Bytes::from(setting))))
        })
    })
    .await
    .unwrap();
    assert_eq!(ran(&outcome).body.as_deref(), Some(&b"42s"[..]));
    let after: String = sqlx::query_scalar("SHOW statement_timeout")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    assert_eq!(after, "42s");
    tx.commit().await.unwrap();
}

/// Under `isolation` as the connections' default, a repeat that waited for the first's
/// row gets its replay (its claim lost to the first's commit and is tried once more, in a new
/// transaction).
async fn a_waiting_duplicate_replays_under(isolation: &str) {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_secs(20)).await);
    let pool = pool_at(server, isolation, 4).await;
    let table = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    let (go, first) = hold(&engine, &pool, &table, key, fp).await;
    let repeat = {
        let (engine, pool, table) = (Arc::clone(&engine), pool.clone(), table.clone());
        tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            within(&engine, &mut conn, key, fp, place_order(&table, None, None)).await
        })
    };
    until_waiting(&pool, 1).await;
    go.send(()).unwrap();
    let first = first.await.unwrap();
    match repeat.await.unwrap() {
        Ok(Within::Replayed(r)) => assert_eq!(&r, ran(&first)),
        other => panic!("{isolation}: the repeat must replay, got {other:?}"),
    }
    assert_eq!(orders(&pool, &table).await, 1);
}

#[tokio::test]
async fn a_waiting_duplicate_replays_under_repeatable_read() {
    a_waiting_duplicate_replays_under("repeatable read").await;
}

#[tokio::test]
async fn a_waiting_duplicate_replays_under_serializable() {
    a_waiting_duplicate_replays_under("serializable").await;
}

/// Under `isolation` as the connections' default, the layer's claim that meets a claim being
/// committed is told the key is taken, never that the store is down.
async fn the_losing_claim_is_answered_not_failed_under(isolation: &str) {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let pool = pool_at(server, isolation, 6).await;
    let table = fresh_table("iso");
    let store = PostgresStore::builder("iso")
        .table(&table)
        .timeout(Duration::from_secs(20))
        .build(pool.clone())
        .unwrap();
    store.migrate().await.unwrap();
    let engine = Arc::new(
        Engine::builder(store.clone())
            .lease(LONG)
            .retention(LONG)
            .build(),
    );
    let orders_t = orders_table(&pool).await;
    let (key, fp) = (random_key(), fingerprint("order"));
    // The first holds the row in its transaction until `go`.
    let (go, first) = hold(&engine, &pool, &orders_t, key, fp).await;
    let claim = {
        let store = store.clone();
        tokio::spawn(async move { store.claim(&key, &fp, LONG).await })
    };
    until_waiting(&pool, 1).await;
    go.send(()).unwrap();
    ran(&first.await.unwrap());
    match claim.await.unwrap() {
        Ok(Claim::Done { fingerprint, .. }) => assert_eq!(fingerprint, fp),
        other => panic!("{isolation}: the losing claim must find the record, got {other:?}"),
    }
}

#[tokio::test]
async fn the_losing_claim_is_answered_not_failed_under_repeatable_read() {
    the_losing_claim_is_answered_not_failed_under("repeatable read").await;
}

#[tokio::test]
async fn the_losing_claim_is_answered_not_failed_under_serializable() {
    the_losing_claim_is_answered_not_failed_under("serializable").await;
}

#[tokio::test]
async fn a_serialization_failure_of_the_transaction_is_a_conflict_and_frees_the_key() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let engine = Arc::new(engine(server, Duration::from_secs(20)).await);
    let pool = pool_at(server, "serializable", 4).await;
    let table = fresh_table("skew");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (name text PRIMARY KEY, on_call bool NOT NULL)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} VALUES ('a', true), ('b', true)"
    )))
    .execute(&pool)
    .await
    .unwrap();
    // Write skew: each takes one doctor off call after counting those on call; run together,
    // serializable lets only one commit.
    let off_call = |who: &'static str,
                    ready: oneshot::Sender<()>,
                    go: oneshot::Receiver<()>,
                    table: String|
     -> Work {
        Box::new(move |tx: &mut PgConnection| {
            Box::pin(async move {
                let on: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT count(*) FROM {table} WHERE on_call"
                )))
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "UPDATE {table} SET on_call = false WHERE name = $1"
                )))
                .bind(who)
                .execute(&mut *tx)
                .await?;
                let _ = ready.send(());
                let _ = go.await;
                Ok(Recorded::new(
                    200,
                    vec![],
                    Some(Bytes::from(on.to_string())),
                ))
            })
        })
    };
    let start = |who: &'static str, key: StoreKey| {
        let (ready, is_ready) = oneshot::channel();
        let (go, wait) = oneshot::channel();
        let (engine, pool, work) = (
            Arc::clone(&engine),
            pool.clone(),
            off_call(who, ready, wait, table.clone()),
        );
        let task = tokio::spawn(async move {
            let mut conn = pool.acquire().await.unwrap();
            within(&engine, &mut conn, key, fingerprint(who), work).await
        });
        (is_ready, go, task)
    };
    let (key_a, key_b) = (random_key(), random_key());
    let (ready_a, go_a, a) = start("a", key_a);
    let (ready_b, go_b, b) = start("b", key_b);
    ready_a.await.unwrap();
    ready_b.await.unwrap();
    go_a.send(()).unwrap();
    ran(&a.await.unwrap().unwrap());
    go_b.send(()).unwrap();
    match b.await.unwrap() {
        Err(e) if e.kind() == WithinErrorKind::Conflict => {
            assert!(e.is_retryable() && e.get_ref().is_none());
            let source = std::error::Error::source(&e).expect("the sqlx error");
            let sqlx = source.downcast_ref::<sqlx::Error>().expect("a sqlx error");
            let code = sqlx.as_database_error().and_then(|d| d.code()).unwrap();
            assert_eq!(code, "40001");
        }
        other => panic!("the second transaction must be a conflict, got {other:?}"),
    }
    // Nothing of it was committed: its key is free, and a retry runs.
    assert!(!has_record(&pool, engine.store(), &key_b).await);
    let mut conn = pool.acquire().await.unwrap();
    let retry = within(&engine, &mut conn, key_b, fingerprint("b"), |tx| {
        Box::pin(async move {
            sqlx::query("SELECT 1").execute(&mut *tx).await?;
            Ok::<_, sqlx::Error>(Recorded::new(200, vec![], None))
        })
    })
    .await
    .unwrap();
    ran(&retry);
}
