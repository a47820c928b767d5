//! `SqliteStore` on a real SQLite file in a temporary directory: the conformance suite, the
//! settings `open` makes, records kept through a reopen, two pools on one file racing one key,
//! the purge beside a second purge, the write lock held past the timeout, refused settings.
#![cfg(feature = "sqlite")]
#![allow(clippy::unwrap_used)]

use crate::support::sqlite_file::SqliteFile;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use tower_idempotency::conformance::{Harness, LONG, SHORT, fingerprint, random_key, record};
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::store::sqlite::sqlx::{self, Connection, SqliteConnection};
use tower_idempotency::store::sqlite::{SqliteStore, Synchronous};
use tower_idempotency::store::{Claim, StoreErrorKind};
use tower_idempotency::{ConfigErrorKind, Store};

/// A store on a fresh file, its time on `clock`.
pub(crate) async fn store_at(file: &SqliteFile, clock: &ManualClock) -> SqliteStore {
    let store = SqliteStore::builder("conformance")
        .clock(clock.clone())
        .open(file.path())
        .await
        .expect("open");
    store.migrate().await.expect("migrate");
    store
}

struct SqliteHarness {
    store: SqliteStore,
    clock: ManualClock,
    _file: SqliteFile,
}

impl SqliteHarness {
    async fn new() -> Self {
        let file = SqliteFile::new();
        let clock = ManualClock::new();
        let store = store_at(&file, &clock).await;
        Self {
            store,
            clock,
            _file: file,
        }
    }
}

impl Harness for SqliteHarness {
    type S = SqliteStore;

    fn store(&self) -> &SqliteStore {
        &self.store
    }

    // Expiry runs on the store's clock, injected.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        self.clock.advance(d);
        std::future::ready(())
    }
}

tower_idempotency::store_conformance!(SqliteHarness::new());

/// The suite on a store with the opt-in `synchronous = NORMAL`.
mod synchronous_normal {
    use super::*;

    async fn harness() -> SqliteHarness {
        let file = SqliteFile::new();
        let clock = ManualClock::new();
        let store = SqliteStore::builder("conformance")
            .clock(clock.clone())
            .synchronous(Synchronous::Normal)
            .open(file.path())
            .await
            .expect("open");
        store.migrate().await.expect("migrate");
        SqliteHarness {
            store,
            clock,
            _file: file,
        }
    }

    tower_idempotency::store_conformance!(harness());
}

#[tokio::test]
async fn open_with_the_defaults_keeps_every_acknowledged_record_through_a_power_loss() {
    let file = SqliteFile::new();
    let store = SqliteStore::open(file.path(), "orders").await.unwrap();
    store.migrate().await.unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let journal: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(
        journal, "wal",
        "write-ahead log: readers never wait for the writer"
    );
    assert_eq!(synchronous, 2, "FULL: an fsync per commit");
    assert_eq!(
        busy, 1000,
        "the write lock is waited for up to the 1 s timeout"
    );
    assert_eq!(store.timeout(), Duration::from_secs(1));
    assert_eq!(store.table(), "tower_idempotency");
}

#[tokio::test]
async fn the_opt_in_normal_synchronous_is_set_on_the_connections() {
    let file = SqliteFile::new();
    let store = SqliteStore::builder("orders")
        .synchronous(Synchronous::Normal)
        .open(file.path())
        .await
        .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(synchronous, 1, "NORMAL");
}

#[tokio::test]
async fn a_record_is_there_when_the_file_is_opened_again() {
    let file = SqliteFile::new();
    let (key, fp) = (random_key(), fingerprint("order"));
    {
        let store = SqliteStore::open(file.path(), "orders").await.unwrap();
        store.migrate().await.unwrap();
        let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
            panic!("a free key is claimed");
        };
        assert!(
            store
                .complete(&key, &token, &fp, record("201"), LONG)
                .await
                .unwrap()
        );
        store.pool().close().await;
    }
    let store = SqliteStore::open(file.path(), "orders").await.unwrap();
    store.migrate().await.unwrap();
    match store.claim(&key, &fp, LONG).await.unwrap() {
        Claim::Done { record: r, .. } => assert_eq!(r, record("201")),
        other => panic!("the record must be kept, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_pools_on_one_file_racing_one_key_have_one_winner() {
    const RACERS: usize = 16;
    let file = SqliteFile::new();
    let a = SqliteStore::open(file.path(), "orders").await.unwrap();
    a.migrate().await.unwrap();
    let b = SqliteStore::open(file.path(), "orders").await.unwrap();
    b.migrate().await.unwrap();
    for round in 0..5 {
        let (key, fp) = (random_key(), fingerprint("order"));
        let barrier = Arc::new(Barrier::new(RACERS));
        let tasks: Vec<_> = (0..RACERS)
            .map(|i| {
                let store = if i % 2 == 0 { a.clone() } else { b.clone() };
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    store.claim(&key, &fp, LONG).await.unwrap()
                })
            })
            .collect();
        let mut claimed = 0;
        for t in tasks {
            match t.await.unwrap() {
                Claim::Claimed(_) => claimed += 1,
                Claim::Pending { fingerprint } => assert_eq!(fingerprint, fp),
                other => panic!("a racer finds the claim, got {other:?}"),
            }
        }
        assert_eq!(claimed, 1, "round {round}: one of {RACERS} claims wins");
    }
}

/// How many rows the records' table holds.
async fn rows(store: &SqliteStore) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{}\"",
        store.table()
    )))
    .fetch_one(store.pool())
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_purges_at_once_delete_each_expired_row_once_in_batches_and_keep_live_ones() {
    const EXPIRED: u64 = 2500;
    let file = SqliteFile::new();
    let clock = ManualClock::new();
    // No fsync per commit: the 2 500 claims that fill the table stay fast on any disk.
    let open = || {
        SqliteStore::builder("conformance")
            .clock(clock.clone())
            .synchronous(Synchronous::Normal)
            .open(file.path())
    };
    let store = open().await.unwrap();
    store.migrate().await.unwrap();
    // A second pool on the file, as a second process would have.
    let other = open().await.unwrap();
    for _ in 0..EXPIRED {
        let _ = store
            .claim(&random_key(), &fingerprint("x"), SHORT)
            .await
            .unwrap();
    }
    clock.advance(2 * SHORT);
    let live: Vec<_> = (0..10).map(|_| random_key()).collect();
    for key in &live {
        let _ = store.claim(key, &fingerprint("x"), LONG).await.unwrap();
    }
    let (first, second) = tokio::join!(store.purge(), other.purge());
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(first + second, EXPIRED, "each expired row deleted once");
    assert_eq!(rows(&store).await, 10, "the live rows stay");
    for key in &live {
        assert!(matches!(
            store.claim(key, &fingerprint("x"), LONG).await.unwrap(),
            Claim::Pending { .. }
        ));
    }
    assert_eq!(store.purge().await.unwrap(), 0, "nothing left to purge");
}

#[tokio::test]
async fn the_purge_never_deletes_a_row_claimed_again_after_it_expired() {
    let file = SqliteFile::new();
    let clock = ManualClock::new();
    let store = store_at(&file, &clock).await;
    let (key, fp) = (random_key(), fingerprint("x"));
    let _ = store.claim(&key, &fp, SHORT).await.unwrap();
    clock.advance(2 * SHORT);
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("an expired claim is taken over");
    };
    assert_eq!(store.purge().await.unwrap(), 0);
    assert!(
        store.renew(&key, &token, LONG).await.unwrap(),
        "the new claim holds"
    );
}

#[tokio::test]
async fn a_write_lock_held_past_the_timeout_times_out_and_the_store_recovers() {
    let file = SqliteFile::new();
    let store = SqliteStore::open(file.path(), "orders").await.unwrap();
    store.migrate().await.unwrap();
    let mut holder = SqliteConnection::connect(&format!("sqlite://{}", file.path().display()))
        .await
        .unwrap();
    let tx = holder.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let (key, fp) = (random_key(), fingerprint("x"));
    let started = Instant::now();
    let failed = store.claim(&key, &fp, LONG).await.unwrap_err();
    assert_eq!(failed.kind(), StoreErrorKind::Timeout, "{failed}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "bounded by the 1 s timeout"
    );
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
}

#[tokio::test]
async fn settings_that_would_break_the_sql_are_refused_and_create_no_file() {
    let file = SqliteFile::new();
    for table in ["", "Idem", "main.t", "t; DROP TABLE x", "\"t\""] {
        let e = SqliteStore::builder("orders")
            .table(table)
            .open(file.path())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Unavailable, "{table}");
    }
    let e = SqliteStore::open(file.path(), "").await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
    assert!(!file.path().exists(), "nothing was written");
    let pool = sqlx::SqlitePool::connect_lazy("sqlite::memory:").unwrap();
    assert_eq!(
        SqliteStore::new(pool, "").unwrap_err().kind(),
        ConfigErrorKind::InvalidName
    );
}

#[tokio::test]
async fn a_table_named_by_an_sql_keyword_works() {
    let file = SqliteFile::new();
    let store = SqliteStore::builder("orders")
        .table("order")
        .open(file.path())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let (key, fp) = (random_key(), fingerprint("x"));
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("claimed");
    };
    assert!(
        store
            .complete(&key, &token, &fp, record("r"), LONG)
            .await
            .unwrap()
    );
    assert_eq!(store.purge().await.unwrap(), 0);
    assert_eq!(rows(&store).await, 1);
}

#[tokio::test]
async fn nothing_secret_rests_in_the_file() {
    use crate::support::http::{TestServer, Work};
    use crate::support::raw_http::{keyed, post};
    use tower_idempotency::IdempotencyLayer;

    let file = SqliteFile::new();
    let store = SqliteStore::open(file.path(), "NAMESPACEMARKER-payments")
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let layer = IdempotencyLayer::new(store.clone()).namespace("LAYERNSMARKER-refunds");
    let work = Work::plain();
    let app = TestServer::start(work.app(layer)).await;
    let body = br#"{"card":"BODYMARKER-4111"}"#;
    for i in 0..4 {
        let key = format!("IDEMKEYMARKER-{i}");
        let headers = keyed("PRINCIPALMARKER-alice", key.as_bytes());
        let a = app.one(&post("/work?q=QUERYMARKER", &headers, body)).await;
        assert_eq!(a.status, 201, "{}", a.describe());
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tower_idempotency WHERE state = 'D'")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 4, "one record per request");
    // Every byte SQLite keeps: the database, its log and the log's index.
    let dir = file.path().parent().unwrap();
    let mut at_rest = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        at_rest.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(!at_rest.is_empty());
    for m in [
        &b"LAYERNSMARKER"[..],
        b"IDEMKEYMARKER",
        b"PRINCIPALMARKER",
        b"NAMESPACEMARKER",
        b"BODYMARKER",
        b"QUERYMARKER",
    ] {
        assert!(
            !at_rest.windows(m.len()).any(|w| w == m),
            "{:?} at rest",
            String::from_utf8_lossy(m)
        );
    }
}
