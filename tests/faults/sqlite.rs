//! Processes on a SQLite file killed with `kill -9`: after the HTTP layer answered 201 the
//! record is in the file for the next process; inside a transaction of
//! `transactional::sqlite::within` nothing is committed, and the retry runs once. Eight
//! processes racing one key through `within` place one order.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used)]

use crate::support::child::{
    AppProcess, ChildProcess, START_LIMIT, outcome_word, serve, setting, wait_for_file,
};
use crate::support::sqlite_file::SqliteFile;
use axum::Router;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use std::time::{SystemTime, UNIX_EPOCH};
use tower_idempotency::engine::{Engine, Fingerprint, Recorded, Scope};
use tower_idempotency::http::REPLAYED_HEADER;
use tower_idempotency::store::sqlite::SqliteStore;
use tower_idempotency::store::sqlite::sqlx::{self, SqliteConnection};
use tower_idempotency::transactional::Within;
use tower_idempotency::transactional::sqlite::within;
use tower_idempotency::{IdempotencyKey, IdempotencyLayer};

const PATH: &str = "TI_SQLITE_PATH";
const START: &str = "TI_SQLITE_START";
const PREFIX: &str = "app";

/// Each process's own tag, in its answers: a replay carries the first process's.
fn run_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{}-{nanos}", std::process::id())
}

/// The application process: the HTTP layer with its defaults over `SqliteStore` with its
/// defaults, on the file the parent names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the SQLite crash tests: started by them"]
async fn child_sqlite_app() {
    let Some(path) = setting(PATH) else { return };
    let store = SqliteStore::open(&path, PREFIX).await.unwrap();
    store.migrate().await.unwrap();
    let tag = run_tag();
    let layer =
        IdempotencyLayer::new(Engine::new(store)).principal_fn(|_| Some(Scope::principal("alice")));
    let router = Router::new()
        .route(
            "/orders",
            post(move || {
                let tag = tag.clone();
                async move { (StatusCode::CREATED, format!("order placed by {tag}")) }
            }),
        )
        .layer(layer);
    serve(router).await;
}

async fn order(app: &AppProcess, key: &str) -> (u16, bool, String) {
    let res = reqwest::Client::new()
        .post(app.url("/orders"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(r#"{"sku":"X"}"#)
        .send()
        .await
        .unwrap();
    let status = res.status().as_u16();
    let replayed = res
        .headers()
        .get(REPLAYED_HEADER)
        .is_some_and(|v| v == "true");
    (status, replayed, res.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_right_after_its_201_leaves_the_record_for_the_next_process() {
    let file = SqliteFile::new();
    let env = [(PATH, file.path().display().to_string())];
    let mut first = AppProcess::start("sqlite::child_sqlite_app", &env).await;
    let (status, replayed, body) = order(&first, "k-1").await;
    assert_eq!((status, replayed), (201, false), "{body}");
    // A crash right after the answer: no shutdown, no checkpoint, nothing flushed by the app.
    first.kill().await;

    let second = AppProcess::start("sqlite::child_sqlite_app", &env).await;
    let (status, replayed, again) = order(&second, "k-1").await;
    assert_eq!(status, 201);
    assert!(replayed, "the new process answers from the record");
    assert_eq!(
        again, body,
        "the first process's response, not a second run"
    );
    let (status, replayed, _) = order(&second, "k-2").await;
    assert_eq!((status, replayed), (201, false), "a new key runs");
}

/// The transactional child: places an order in `within` on the file, says `INSIDE` and waits
/// to be killed, its transaction open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the SQLite crash tests: started by them"]
async fn child_sqlite_within() {
    let Some(path) = setting(PATH) else { return };
    let store = SqliteStore::open(&path, PREFIX).await.unwrap();
    let pool = store.pool().clone();
    let engine = Engine::new(store);
    let (key, fp) = request(&engine);
    let mut conn = pool.acquire().await.unwrap();
    let _ = within(&engine, &mut conn, key, fp, |tx| {
        Box::pin(async move {
            sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
                .execute(&mut *tx)
                .await?;
            println!("INSIDE");
            std::future::pending::<()>().await;
            Ok::<_, sqlx::Error>(Recorded::new(201, vec![], None))
        })
    })
    .await;
}

/// The request both processes make: one key, one body.
fn request(engine: &Engine<SqliteStore>) -> (tower_idempotency::store::StoreKey, Fingerprint) {
    let key = engine.store_key(
        "orders",
        &Scope::principal("alice"),
        &IdempotencyKey::new("k-1").unwrap(),
    );
    let fp = Fingerprint::builder()
        .field(b"POST /orders")
        .field(b"{\"sku\":\"X\"}")
        .finish();
    (key, fp)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_inside_the_transaction_commits_nothing_and_the_retry_runs_once() {
    let file = SqliteFile::new();
    let store = SqliteStore::open(file.path(), PREFIX).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let env = [(PATH, file.path().display().to_string())];
    let mut child = ChildProcess::spawn("sqlite::child_sqlite_within", &env);
    child.line_after("INSIDE", START_LIMIT).await;
    child.kill().await;

    let engine = Engine::new(store);
    let pool = engine.store().pool().clone();
    let count = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM orders")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        count().await,
        0,
        "the killed transaction's order is not in the file"
    );
    let (key, fp) = request(&engine);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tower_idempotency WHERE key = ?1")
        .bind(&engine.store().row_key(&key)[..])
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0, "nor its claim");

    let mut runs = 0;
    for _ in 0..2 {
        let mut conn = pool.acquire().await.unwrap();
        let outcome = within(&engine, &mut conn, key, fp, |tx: &mut SqliteConnection| {
            runs += 1;
            Box::pin(async move {
                sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
                    .execute(&mut *tx)
                    .await?;
                Ok::<_, sqlx::Error>(Recorded::new(201, vec![], Some(Bytes::from("placed"))))
            })
        })
        .await
        .unwrap();
        assert!(
            matches!(outcome, Within::Recorded(_) | Within::Replayed(_)),
            "{outcome:?}"
        );
    }
    assert_eq!(runs, 1, "the retry ran once, the repeat after it replayed");
    assert_eq!(count().await, 1, "one order");
}

/// A racer: opens the file with the defaults, says `READY`, waits for the start file, runs
/// `within` once on the shared key (an order, held 100 ms) and prints `OUTCOME <word>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the SQLite race test: started by it"]
async fn child_sqlite_racer() {
    let (Some(path), Some(start)) = (setting(PATH), setting(START)) else {
        return;
    };
    let store = SqliteStore::open(&path, PREFIX).await.unwrap();
    let pool = store.pool().clone();
    let engine = Engine::new(store);
    let (key, fp) = request(&engine);
    let mut conn = pool.acquire().await.unwrap();
    println!("READY");
    wait_for_file(&start).await;
    let outcome = within(&engine, &mut conn, key, fp, |tx: &mut SqliteConnection| {
        Box::pin(async move {
            sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
                .execute(&mut *tx)
                .await?;
            // Hold the key a while, so the others pile up behind it.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            Ok::<_, sqlx::Error>(Recorded::new(201, vec![], Some(Bytes::from("placed"))))
        })
    })
    .await;
    match outcome {
        Ok(outcome) => println!("OUTCOME {}", outcome_word(&outcome)),
        Err(e) => println!("OUTCOME error {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_processes_racing_one_key_through_within_place_one_order() {
    const RACERS: usize = 8;
    let file = SqliteFile::new();
    let store = SqliteStore::open(file.path(), PREFIX).await.unwrap();
    store.migrate().await.unwrap();
    sqlx::query("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let start = format!("{}.start", file.path().display());
    let env = [
        (PATH, file.path().display().to_string()),
        (START, start.clone()),
    ];
    let mut racers = Vec::new();
    for _ in 0..RACERS {
        let mut racer = ChildProcess::spawn("sqlite::child_sqlite_racer", &env);
        racer.line_after("READY", START_LIMIT).await;
        racers.push(racer);
    }
    // All eight have the file open: release them together.
    std::fs::write(&start, b"go").unwrap();
    let (mut ran, mut replayed, mut in_flight) = (0, 0, 0);
    for racer in &mut racers {
        match racer.line_after("OUTCOME ", START_LIMIT).await.as_str() {
            "ran" => ran += 1,
            "replayed 201" => replayed += 1,
            "in-flight" => in_flight += 1,
            other => panic!("a racer must run, replay or be in flight, got {other:?}"),
        }
    }
    eprintln!("{RACERS} processes: {ran} ran, {replayed} replayed, {in_flight} in flight");
    assert_eq!(ran, 1, "exactly one of {RACERS} processes runs");

    let engine = Engine::new(store);
    let pool = engine.store().pool().clone();
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "one order row");
    let (key, fp) = request(&engine);
    let mut conn = pool.acquire().await.unwrap();
    let repeat = within(&engine, &mut conn, key, fp, |tx: &mut SqliteConnection| {
        Box::pin(async move {
            sqlx::query("INSERT INTO orders (sku) VALUES ('X')")
                .execute(&mut *tx)
                .await?;
            Ok::<_, sqlx::Error>(Recorded::new(201, vec![], Some(Bytes::from("again"))))
        })
    })
    .await
    .unwrap();
    match repeat {
        Within::Replayed(r) => assert_eq!(r.body.as_deref(), Some(&b"placed"[..])),
        other => panic!("a repeat after the race replays, got {other:?}"),
    }
    let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(orders, 1, "still one order row");
}
