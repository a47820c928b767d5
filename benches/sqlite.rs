//! The SQLite store's cost: N claims then completes of fresh keys, and N claims of completed
//! keys (replays), through `SqliteStore`, beside the same SQL statements sent through sqlx
//! directly, on the same kind of file with the same settings, in the same run. Both
//! `synchronous` settings, and fresh claims from 1 and 4 writers at once (SQLite writes one
//! at a time). The store and the direct statements alternate in rounds. Prints a table of
//! rates and ratios.
//!
//! ```text
//! cargo bench -p tower-idempotency --features sqlite --bench sqlite
//! ```

#![allow(missing_docs, clippy::unwrap_used)]

use bytes::Bytes;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tower_idempotency::Store;
use tower_idempotency::store::sqlite::sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tower_idempotency::store::sqlite::sqlx::{self, Connection, Row};
use tower_idempotency::store::sqlite::{SqliteStore, Synchronous};
use tower_idempotency::store::{Claim, Fingerprint, Record, StoreKey};

/// Requests per case.
const N: u32 = 2000;
/// Each case alternates the store and the direct statements in this many rounds of N ÷ ROUNDS
/// requests, so that a slow spell of the disk or the machine falls on both.
const ROUNDS: u32 = 8;
const LEASE: Duration = Duration::from_secs(60);
/// The store's default table: the direct statements use the same.
const T: &str = "tower_idempotency";

fn key(run: u32, i: u32) -> StoreKey {
    let mut id = [0u8; 32];
    id[..4].copy_from_slice(&run.to_be_bytes());
    id[4..8].copy_from_slice(&i.to_be_bytes());
    StoreKey::from_parts([7; 32], id)
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("ti-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("bench.db")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A pool with the settings `SqliteStoreBuilder::open` makes.
async fn direct_pool(path: &Path, sync: SqliteSynchronous) -> SqlitePool {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(sync)
        .busy_timeout(Duration::from_secs(1));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap()
}

/// The key ranges of the rounds of one case.
fn rounds() -> impl Iterator<Item = Range<u32>> {
    (0..ROUNDS).map(|r| r * N / ROUNDS..(r + 1) * N / ROUNDS)
}

/// Requests per second of `n` requests in `elapsed`.
fn rate(n: u32, elapsed: Duration) -> f64 {
    f64::from(n) / elapsed.as_secs_f64()
}

async fn store_fresh(store: &SqliteStore, run: u32, keys: Range<u32>, writers: u32) -> Duration {
    let fp = Fingerprint::from_bytes([1; 32]);
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, keys) = (store.clone(), keys.clone());
            tokio::spawn(async move {
                for i in keys.skip(w as usize).step_by(writers as usize) {
                    let k = key(run, i);
                    let Claim::Claimed(token) = store.claim(&k, &fp, LEASE).await.unwrap() else {
                        panic!("a fresh key is claimed");
                    };
                    let record = Record::from_bytes(Bytes::from_static(b"201 {\"id\":1}"));
                    assert!(
                        store
                            .complete(&k, &token, &fp, record, LEASE)
                            .await
                            .unwrap()
                    );
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

async fn store_replay(store: &SqliteStore, run: u32, keys: Range<u32>) -> Duration {
    let fp = Fingerprint::from_bytes([1; 32]);
    let started = Instant::now();
    for i in keys {
        let found = store.claim(&key(run, i), &fp, LEASE).await.unwrap();
        assert!(matches!(found, Claim::Done { .. }));
    }
    started.elapsed()
}

/// The store's statements for a fresh request, sent directly: a read of the live row, then
/// the claim and the complete, each in a transaction that takes the write lock first.
async fn direct_fresh(pool: &SqlitePool, run: u32, keys: Range<u32>, writers: u32) -> Duration {
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (pool, keys) = (pool.clone(), keys.clone());
            tokio::spawn(async move {
                let live = format!(
                    "SELECT state, fingerprint, record FROM \"{T}\" WHERE key = ?1 AND expires_at > ?2"
                );
                let take = format!(
                    "INSERT INTO \"{T}\" (key, expires_at, state, fingerprint, token, record) \
                     VALUES (?1, ?2 + ?5, 'P', ?3, ?4, NULL) \
                     ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'P', \
                     fingerprint = excluded.fingerprint, token = excluded.token, record = NULL \
                     WHERE \"{T}\".expires_at <= ?2"
                );
                let complete = format!(
                    "INSERT INTO \"{T}\" (key, expires_at, state, fingerprint, token, record) \
                     VALUES (?1, ?2 + ?6, 'D', ?4, NULL, ?5) \
                     ON CONFLICT (key) DO UPDATE SET expires_at = excluded.expires_at, state = 'D', \
                     fingerprint = excluded.fingerprint, token = NULL, record = excluded.record \
                     WHERE \"{T}\".expires_at <= ?2 OR (\"{T}\".state = 'P' AND \"{T}\".token = ?3)"
                );
                let free = format!("DELETE FROM \"{T}_steps\" WHERE key = ?1");
                for i in keys.skip(w as usize).step_by(writers as usize) {
                    let mut k = vec![9u8; 8];
                    k.extend_from_slice(key(run, i).id());
                    let mut conn = pool.acquire().await.unwrap();
                    let found = sqlx::query(sqlx::AssertSqlSafe(live.as_str()))
                        .bind(&k[..])
                        .bind(now_ms())
                        .fetch_optional(&mut *conn)
                        .await
                        .unwrap();
                    assert!(found.is_none());
                    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
                    let found = sqlx::query(sqlx::AssertSqlSafe(live.as_str()))
                        .bind(&k[..])
                        .bind(now_ms())
                        .fetch_optional(&mut *tx)
                        .await
                        .unwrap();
                    assert!(found.is_none());
                    sqlx::query(sqlx::AssertSqlSafe(take.as_str()))
                        .bind(&k[..])
                        .bind(now_ms())
                        .bind(&[1u8; 32][..])
                        .bind(&[2u8; 16][..])
                        .bind(60_000_i64)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
                    let written = sqlx::query(sqlx::AssertSqlSafe(complete.as_str()))
                        .bind(&k[..])
                        .bind(now_ms())
                        .bind(&[2u8; 16][..])
                        .bind(&[1u8; 32][..])
                        .bind(&b"201 {\"id\":1}"[..])
                        .bind(60_000_i64)
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    assert_eq!(written.rows_affected(), 1);
                    sqlx::query(sqlx::AssertSqlSafe(free.as_str()))
                        .bind(&k[..])
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    started.elapsed()
}

/// A replay's statement sent directly: the read of the live row.
async fn direct_replay(pool: &SqlitePool, run: u32, keys: Range<u32>) -> Duration {
    let live = format!(
        "SELECT state, fingerprint, record FROM \"{T}\" WHERE key = ?1 AND expires_at > ?2"
    );
    let started = Instant::now();
    for i in keys {
        let mut k = vec![9u8; 8];
        k.extend_from_slice(key(run, i).id());
        let row = sqlx::query(sqlx::AssertSqlSafe(live.as_str()))
            .bind(&k[..])
            .bind(now_ms())
            .fetch_one(pool)
            .await
            .unwrap();
        let _: String = row.get(0);
    }
    started.elapsed()
}

fn main() {
    // `cargo bench` passes `--bench`; a test run of the benches (`cargo test --benches`)
    // does not, and only checks that it builds.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // `-- --list` names the one benchmark, as libtest and criterion list theirs.
    if std::env::args().any(|a| a == "--list") {
        println!("sqlite: benchmark");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        println!(
            "N = {N} requests per case, in {ROUNDS} rounds alternating store and direct; \
             rates in requests/s; ratio = store ÷ direct"
        );
        println!();
        println!("| synchronous | case | writers | store req/s | direct req/s | store ÷ direct |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        for (name, mode, sync) in [
            ("FULL (default)", Synchronous::Full, SqliteSynchronous::Full),
            ("NORMAL", Synchronous::Normal, SqliteSynchronous::Normal),
        ] {
            let (sdir, ddir) = (Dir::new("store"), Dir::new("direct"));
            let store = SqliteStore::builder("bench")
                .synchronous(mode)
                .open(sdir.file())
                .await
                .unwrap();
            store.migrate().await.unwrap();
            // The same tables, made by a store on the direct file, then left alone.
            let maker = SqliteStore::open(ddir.file(), "bench").await.unwrap();
            maker.migrate().await.unwrap();
            maker.pool().close().await;
            let direct = direct_pool(&ddir.file(), sync).await;
            for (run, writers) in [(1, 1), (2, 4)] {
                let (mut s, mut d) = (Duration::ZERO, Duration::ZERO);
                for keys in rounds() {
                    s += store_fresh(&store, run, keys.clone(), writers).await;
                    d += direct_fresh(&direct, run, keys, writers).await;
                }
                println!(
                    "| {name} | fresh: claim + complete | {writers} | {:.0} | {:.0} | {:.2} |",
                    rate(N, s),
                    rate(N, d),
                    rate(N, s) / rate(N, d)
                );
            }
            let (mut s, mut d) = (Duration::ZERO, Duration::ZERO);
            for keys in rounds() {
                s += store_replay(&store, 1, keys.clone()).await;
                d += direct_replay(&direct, 1, keys).await;
            }
            println!(
                "| {name} | replay: claim of a completed key | 1 | {:.0} | {:.0} | {:.2} |",
                rate(N, s),
                rate(N, d),
                rate(N, s) / rate(N, d)
            );
        }
    });
}
