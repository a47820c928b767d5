//! The MySQL store's cost beside the same statements sent directly to the same database in the
//! same run: a fresh request (claim + complete of a new key) and a replay (claim of a completed
//! key), through `MySqlStore::connect` and through one plain sqlx connection that sends the
//! store's own query texts, with the same connection settings. It prints the ratios.
//!
//! ```text
//! cargo bench -p tower-idempotency --features mysql,test-util --bench mysql
//! ```
//!
//! It starts its own MariaDB server (as the tests do: `scripts/test.sh` installs it), or uses
//! the one at `TOWER_IDEMPOTENCY_MYSQL_URL` when that is set.

#![allow(missing_docs, unreachable_pub, clippy::unwrap_used)]

// The tests' server support: `mariadb_server` reaches `servers` and `ports` through `super`.
#[path = "../tests/support/mariadb_server.rs"]
mod mariadb_server;
#[allow(dead_code)] // the tests use the rest
#[path = "../tests/support/ports.rs"]
mod ports;
#[allow(dead_code)]
#[path = "../tests/support/servers.rs"]
mod servers;

use mariadb_server::MariaDbServer;
use std::time::{Duration, Instant};
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, fingerprint, random_key, record};
use tower_idempotency::store::Claim;
use tower_idempotency::store::mysql::MySqlStore;
use tower_idempotency::store::mysql::sqlx::{self, Connection, MySqlConnection};

/// Requests per case and block; blocks of the store and of the direct statements alternate,
/// so that both see the same machine.
const PER_BLOCK: usize = 500;
const BLOCKS: usize = 6;
const TABLE: &str = "bench_idempotency";

fn hex(b: &[u8]) -> String {
    let mut s = String::from("X'");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s.push('\'');
    s
}

/// The store's claim, as it sends it (see `src/store/mysql/sql.rs`).
fn claim_sql(key: &[u8], fp: &[u8], token: &[u8], lease_us: i64) -> String {
    let (k, f, t) = (hex(key), hex(fp), hex(token));
    format!(
        "UPDATE `{TABLE}` SET state = 'P', fingerprint = {f}, token = {t}, record = NULL, \
            expires_at = UTC_TIMESTAMP(6) + INTERVAL {lease_us} MICROSECOND \
         WHERE `key` = {k} AND expires_at <= UTC_TIMESTAMP(6);\
         INSERT INTO `{TABLE}` (`key`, expires_at, state, fingerprint, token) \
         VALUES ({k}, UTC_TIMESTAMP(6) + INTERVAL {lease_us} MICROSECOND, 'P', {f}, {t}) \
         ON DUPLICATE KEY UPDATE `key` = `key`;\
         SELECT CAST(IF(state = 'P' AND token = {t}, 0, IF(state = 'P', 1, 2)) AS SIGNED), \
            fingerprint, record FROM `{TABLE}` \
         WHERE `key` = {k} AND (expires_at > UTC_TIMESTAMP(6) OR (state = 'P' AND token = {t}))"
    )
}

/// The store's complete, as it sends it.
fn complete_sql(key: &[u8], token: &[u8], fp: &[u8], rec: &[u8], ret_us: i64, w: &[u8]) -> String {
    let (k, f, t, w, r) = (hex(key), hex(fp), hex(token), hex(w), hex(rec));
    let st = format!("`{TABLE}_steps`");
    format!(
        "SET @ti_record = {r};\
         UPDATE `{TABLE}` SET state = 'D', fingerprint = {f}, token = {w}, record = @ti_record, \
            expires_at = UTC_TIMESTAMP(6) + INTERVAL {ret_us} MICROSECOND \
         WHERE `key` = {k} AND (expires_at <= UTC_TIMESTAMP(6) OR (state = 'P' AND token = {t}));\
         INSERT INTO `{TABLE}` (`key`, expires_at, state, fingerprint, token, record) \
         VALUES ({k}, UTC_TIMESTAMP(6) + INTERVAL {ret_us} MICROSECOND, 'D', {f}, {w}, @ti_record) \
         ON DUPLICATE KEY UPDATE `key` = `key`;\
         SET @ti_record = NULL;\
         DELETE FROM {st} WHERE `key` = {k} \
            AND EXISTS (SELECT 1 FROM `{TABLE}` WHERE `key` = {k} AND token = {w});\
         SELECT CAST(COUNT(*) AS SIGNED) FROM `{TABLE}` WHERE `key` = {k} AND token = {w}"
    )
}

fn random16() -> [u8; 16] {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).unwrap();
    b
}

fn random40() -> [u8; 40] {
    let mut b = [0u8; 40];
    getrandom::fill(&mut b).unwrap();
    b
}

async fn store_fresh(store: &MySqlStore, n: usize) -> Duration {
    let fp = fingerprint("bench");
    let started = Instant::now();
    for _ in 0..n {
        let key = random_key();
        let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
            panic!("a fresh key is claimed")
        };
        assert!(
            store
                .complete(&key, &token, &fp, record("r"), LONG)
                .await
                .unwrap()
        );
    }
    started.elapsed()
}

async fn direct_fresh(conn: &mut MySqlConnection, n: usize) -> Duration {
    let fp = fingerprint("bench");
    let rec = record("r").into_bytes();
    let started = Instant::now();
    for _ in 0..n {
        let (key, token, writer) = (random40(), random16(), random16());
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(claim_sql(
            &key,
            fp.as_bytes(),
            &token,
            60_000_000,
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert_eq!(rows.len(), 1);
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(complete_sql(
            &key,
            &token,
            fp.as_bytes(),
            &rec,
            60_000_000,
            &writer,
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert_eq!(rows.len(), 1);
    }
    started.elapsed()
}

async fn store_replay(store: &MySqlStore, keys: &[tower_idempotency::store::StoreKey]) -> Duration {
    let fp = fingerprint("bench");
    let started = Instant::now();
    for key in keys {
        let found = store.claim(key, &fp, LONG).await.unwrap();
        assert!(matches!(found, Claim::Done { .. }));
    }
    started.elapsed()
}

async fn direct_replay(conn: &mut MySqlConnection, keys: &[[u8; 40]]) -> Duration {
    let fp = fingerprint("bench");
    let started = Instant::now();
    for key in keys {
        let token = random16();
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(claim_sql(
            key,
            fp.as_bytes(),
            &token,
            60_000_000,
        )))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
        assert_eq!(rows.len(), 1);
    }
    started.elapsed()
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` passes nothing and only
    // checks that this builds.
    if std::env::args().any(|a| a == "--list") {
        println!("mysql: benchmark");
        return;
    }
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let server;
    let url = match std::env::var("TOWER_IDEMPOTENCY_MYSQL_URL") {
        Ok(url) => url,
        Err(_) => {
            assert!(mariadb_server::available(), "MariaDB is needed");
            server = MariaDbServer::start();
            server.url()
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = MySqlStore::builder("bench")
            .table(TABLE)
            .connect(&url)
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let mut conn = MySqlConnection::connect(&url).await.unwrap();
        sqlx::raw_sql("SET SESSION innodb_lock_wait_timeout = 1")
            .execute(&mut conn)
            .await
            .unwrap();
        // Completed keys for the replays, through the store; the direct replays read rows
        // the direct fresh requests wrote.
        let fp = fingerprint("bench");
        let mut keys = Vec::new();
        for _ in 0..PER_BLOCK {
            let key = random_key();
            let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
                panic!("claimed")
            };
            store
                .complete(&key, &token, &fp, record("r"), LONG)
                .await
                .unwrap();
            keys.push(key);
        }
        let mut direct_keys = Vec::new();
        for _ in 0..PER_BLOCK {
            let (key, token, writer) = (random40(), random16(), random16());
            sqlx::raw_sql(sqlx::AssertSqlSafe(claim_sql(&key, fp.as_bytes(), &token, 60_000_000)))
                .fetch_all(&mut conn)
                .await
                .unwrap();
            sqlx::raw_sql(sqlx::AssertSqlSafe(complete_sql(
                &key,
                &token,
                fp.as_bytes(),
                &record("r").into_bytes(),
                60_000_000,
                &writer,
            )))
            .fetch_all(&mut conn)
            .await
            .unwrap();
            direct_keys.push(key);
        }
        // Warm-up: connections opened, caches filled.
        store_fresh(&store, 100).await;
        direct_fresh(&mut conn, 100).await;

        let (mut sf, mut df, mut sr, mut dr) = (Duration::ZERO, Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..BLOCKS {
            sf += store_fresh(&store, PER_BLOCK).await;
            df += direct_fresh(&mut conn, PER_BLOCK).await;
            sr += store_replay(&store, &keys).await;
            dr += direct_replay(&mut conn, &direct_keys).await;
        }
        let n = u32::try_from(PER_BLOCK * BLOCKS).unwrap();
        let us = |d: Duration| d.as_secs_f64() * 1e6 / f64::from(n);
        println!("MySQL store beside its own statements sent directly ({n} requests per case, one connection, in turn):");
        println!();
        println!("| case | store µs/request | direct µs/request | store ÷ direct |");
        println!("| --- | --- | --- | --- |");
        println!(
            "| fresh (claim + complete) | {:.0} | {:.0} | {:.2}× |",
            us(sf),
            us(df),
            sf.as_secs_f64() / df.as_secs_f64()
        );
        println!(
            "| replay (claim of a done key) | {:.0} | {:.0} | {:.2}× |",
            us(sr),
            us(dr),
            sr.as_secs_f64() / dr.as_secs_f64()
        );
        let version: String = sqlx::query_scalar("SELECT VERSION()")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        println!();
        println!("server: {version}");
    });
}
