//! `MySqlStore` on a real MariaDB server: the conformance suite, the tables `migrate` makes,
//! the purge beside a second purge, hashes only at rest, and one exchange per step.
//!
//! Without MariaDB installed these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does), where they fail.
#![cfg(feature = "mysql")]
#![allow(clippy::unwrap_used)]

use crate::support::mariadb_server::MariaDbServer;
use std::future::Future;
use std::time::Duration;
use tower_idempotency::conformance::{Harness, LONG, SHORT, fingerprint, random_key, record};
use tower_idempotency::store::mysql::MySqlStore;
use tower_idempotency::store::mysql::sqlx::{self, MySqlPool};
use tower_idempotency::store::{Claim, Record, StepId, StoreErrorKind};
use tower_idempotency::{ConfigErrorKind, Store};

/// A store on `table` (created when missing) of the shared server.
pub(crate) async fn store_on(server: &MariaDbServer, table: &str, ns: &str) -> MySqlStore {
    let store = MySqlStore::builder(ns)
        .table(table)
        .connect(&server.url())
        .await
        .expect("connect");
    store.migrate().await.expect("migrate");
    store
}

/// A fresh table name.
pub(crate) fn fresh_table(prefix: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).unwrap();
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{prefix}_{hex}")
}

struct MySqlHarness {
    store: MySqlStore,
}

impl Harness for MySqlHarness {
    type S = MySqlStore;

    fn store(&self) -> &MySqlStore {
        &self.store
    }

    // Expiry is the database's (`UTC_TIMESTAMP(6)`), on real time.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

fn harness() -> Option<impl Future<Output = MySqlHarness>> {
    let server = MariaDbServer::shared()?;
    Some(async move {
        MySqlHarness {
            store: store_on(server, "tower_idempotency", "conformance").await,
        }
    })
}

tower_idempotency::store_conformance!(match harness() {
    Some(make) => make,
    None => return,
});

// ---- the tables ------------------------------------------------------------------------------

async fn tables_like(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
         AND TABLE_NAME IN (?, CONCAT(?, '_steps')) AND ENGINE = 'InnoDB'",
    )
    .bind(table)
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_migrate_creates_both_innodb_tables_once_even_when_replicas_race() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("migrate");
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(
            MySqlStore::builder("migrate")
                .table(&table)
                .connect(&server.url())
                .await
                .unwrap(),
        );
    }
    let racing: Vec<_> = stores
        .iter()
        .cloned()
        .map(|s| tokio::spawn(async move { s.migrate().await }))
        .collect();
    for r in racing {
        r.await.unwrap().unwrap();
    }
    let pool = server.pool(1).await;
    assert_eq!(tables_like(&pool, &table).await, 2);
    // Again, on tables that exist: nothing changes, nothing fails.
    stores[0].migrate().await.unwrap();
    let key = random_key();
    assert!(matches!(
        stores[1]
            .claim(&key, &fingerprint("a"), LONG)
            .await
            .unwrap(),
        Claim::Claimed(_)
    ));
}

#[tokio::test]
async fn mysql_settings_that_would_break_the_sql_are_refused() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let pool = server.pool(1).await;
    for bad in ["Idem", "t; DROP TABLE x", "a.b.c", "`t`", ""] {
        let e = MySqlStore::builder("p").table(bad).build(pool.clone());
        assert_eq!(
            e.map(|_| ()).map_err(|e| e.kind()),
            Err(ConfigErrorKind::InvalidName),
            "{bad}"
        );
    }
    assert_eq!(
        MySqlStore::new(pool.clone(), "")
            .map(|_| ())
            .map_err(|e| e.kind()),
        Err(ConfigErrorKind::InvalidName)
    );
    let e = MySqlStore::builder("p")
        .table("bad name")
        .connect(&server.url())
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
}

#[tokio::test]
async fn mysql_a_table_named_by_sql_keywords_in_a_database_works_for_every_step() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    server
        .sql("CREATE DATABASE IF NOT EXISTS `select`")
        .unwrap();
    let store = store_on(server, "select.order", "keywords").await;
    let (key, fp) = (random_key(), fingerprint("a"));
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("claimed")
    };
    assert!(store.renew(&key, &token, LONG).await.unwrap());
    assert!(
        store
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
    store.purge().await.unwrap();
}

// ---- the purge ----------------------------------------------------------------------------

async fn rows_of(pool: &MySqlPool, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT COUNT(*) FROM {table}")))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_two_concurrent_purges_delete_every_expired_row_in_batches_and_keep_live_ones() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("purge");
    let store = store_on(server, &table, "purge").await;
    let pool = server.pool(2).await;
    // 2500 expired rows: three batches of at most 1000 between the two purges. Written
    // directly, already expired; and 10 live ones through the store.
    let values: Vec<String> = (0..2500u32)
        .map(|i| {
            format!(
                "(UNHEX(SHA2('{table}{i}', 256)), UTC_TIMESTAMP(6) - INTERVAL 1 SECOND, 'D', \
                 UNHEX(SHA2('fp', 256)), X'00', X'01')"
            )
        })
        .collect();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (`key`, expires_at, state, fingerprint, token, record) VALUES {}",
        values.join(",")
    )))
    .execute(&pool)
    .await
    .unwrap();
    for _ in 0..10 {
        let key = random_key();
        let Claim::Claimed(token) = store.claim(&key, &fingerprint("a"), LONG).await.unwrap()
        else {
            panic!("claimed")
        };
        assert!(
            store
                .complete(&key, &token, &fingerprint("a"), record("a"), LONG)
                .await
                .unwrap()
        );
    }
    let (a, b) = (store.clone(), store.clone());
    let (a, b) = tokio::join!(
        tokio::spawn(async move { a.purge().await }),
        tokio::spawn(async move { b.purge().await })
    );
    let (a, b) = (a.unwrap().unwrap(), b.unwrap().unwrap());
    assert_eq!(a + b, 2500, "each expired row deleted once: {a} + {b}");
    assert_eq!(rows_of(&pool, &table).await, 10, "the live rows are kept");
    assert_eq!(store.purge().await.unwrap(), 0);
}

#[tokio::test]
async fn mysql_purge_skips_a_row_claimed_again_in_an_open_transaction_and_never_deletes_it() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("purge_held");
    let store = store_on(server, &table, "purge_held").await;
    let pool = server.pool(2).await;
    let key = random_key();
    let Claim::Claimed(_) = store.claim(&key, &fingerprint("a"), SHORT).await.unwrap() else {
        panic!("claimed")
    };
    tokio::time::sleep(SHORT * 2).await;
    // A transaction takes the expired row over, and holds it uncommitted.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL 60 SECOND WHERE `key` = ?"
    )))
    .bind(&store.row_key(&key)[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    // Waiting for the row's lock would outlast the purge's 3 s operation timeout: an error.
    assert_eq!(store.purge().await.unwrap(), 0, "the held row is skipped");
    tx.commit().await.unwrap();
    assert_eq!(
        store.purge().await.unwrap(),
        0,
        "nor deleted once claimed again"
    );
    assert_eq!(rows_of(&pool, &table).await, 1);
}

// ---- what rests in the table, and failures ------------------------------------------------------

#[tokio::test]
async fn mysql_only_hashes_rest_in_the_table() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("hashes");
    let store = store_on(server, &table, "hashes").await;
    let key = random_key();
    let Claim::Claimed(token) = store.claim(&key, &fingerprint("a"), LONG).await.unwrap() else {
        panic!("claimed")
    };
    let pool = server.pool(1).await;
    let (k, token_col): (Vec<u8>, Vec<u8>) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT `key`, token FROM {table}"
    )))
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        k,
        store.row_key(&key),
        "the key column is the prefix hash and the store key"
    );
    assert_eq!(&k[8..], key.id());
    assert_eq!(
        token_col,
        token.as_bytes(),
        "the claim's token fences the row"
    );
}

#[tokio::test]
async fn mysql_an_unreachable_server_is_unavailable() {
    let port = crate::support::ports::free_port(false);
    let e = MySqlStore::connect(&format!("mysql://root@127.0.0.1:{port}/app"), "x")
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Unavailable);
}

#[tokio::test]
async fn mysql_a_claim_stuck_behind_a_held_row_times_out_and_the_store_recovers() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("stuck");
    let store = store_on(server, &table, "stuck").await;
    let pool = server.pool(2).await;
    let key = random_key();
    // A transaction holds the key's row (as the transactional door's first request does).
    let tx = hold_row(&pool, &store, &table, &key).await;
    let e = store
        .claim(&key, &fingerprint("a"), LONG)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Timeout);
    tx.rollback().await.unwrap();
    assert!(matches!(
        store.claim(&key, &fingerprint("a"), LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
}

/// Kills every connection to the `app` database: the server ends the store's sessions, as a
/// restart, a failover or `wait_timeout` would.
fn kill_sessions(server: &MariaDbServer) -> usize {
    let ids = server
        .sql("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = 'app'")
        .unwrap();
    let ids: Vec<&str> = ids.split_whitespace().collect();
    for id in &ids {
        let _ = server.sql(&format!("KILL {id}"));
    }
    ids.len()
}

#[tokio::test]
async fn mysql_sessions_the_server_ended_are_replaced_and_a_fenced_step_is_sent_again() {
    if !crate::support::mariadb_server::available() {
        return;
    }
    // A server of its own: the test ends every session on it.
    let server = MariaDbServer::start();
    let store = store_on(&server, "tower_idempotency", "ended").await;
    let fp = fingerprint("a");
    let key = random_key();
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("claimed")
    };
    assert!(kill_sessions(&server) >= 1, "the store's session was found");
    // At once: the connection is not checked (used within 1 s), the complete meets the ended
    // session, and is sent once more on a new connection.
    assert!(
        store
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));
    // Idle past the check: the ended connection is checked, replaced, and a claim succeeds.
    assert!(kill_sessions(&server) >= 1);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(matches!(
        store.claim(&random_key(), &fp, LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
}

#[tokio::test]
async fn mysql_a_server_whose_sessions_start_without_autocommit_still_shares_each_step() {
    if !crate::support::mariadb_server::available() {
        return;
    }
    // A server of its own: the setting is the server's, for every new session. Some operators
    // turn autocommit off server-wide; the store's steps are statements that must commit on
    // their own, or nothing they write reaches the other replicas.
    let server = MariaDbServer::start();
    server.sql("SET GLOBAL autocommit = 0").unwrap();
    let table = fresh_table("noautocommit");
    let (first, second) = (
        store_on(&server, &table, "replicas").await,
        store_on(&server, &table, "replicas").await,
    );
    let (key, fp) = (random_key(), fingerprint("a"));
    let Claim::Claimed(token) = first.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    assert!(
        matches!(
            second.claim(&key, &fp, LONG).await,
            Ok(Claim::Pending { .. })
        ),
        "another replica finds the claim"
    );
    assert!(
        first
            .complete(&key, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
    assert!(
        matches!(second.claim(&key, &fp, LONG).await, Ok(Claim::Done { .. })),
        "another replica finds the record"
    );
}

/// Writes the key's row in a transaction left open: the transactional door's first request,
/// still running, holds it.
async fn hold_row(
    pool: &MySqlPool,
    store: &MySqlStore,
    table: &str,
    key: &tower_idempotency::store::StoreKey,
) -> sqlx::Transaction<'static, sqlx::MySql> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (`key`, expires_at, state, fingerprint, token) \
         VALUES (?, UTC_TIMESTAMP(6) + INTERVAL 60 SECOND, 'P', UNHEX(SHA2('x', 256)), X'00')"
    )))
    .bind(&store.row_key(key)[..])
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Claims `key` until it is claimed, for up to 20 s: a claim that timed out is released in
/// the background once the server answers it.
async fn claimed_within_seconds(store: &MySqlStore, key: &tower_idempotency::store::StoreKey) {
    for _ in 0..40 {
        match store.claim(key, &fingerprint("a"), LONG).await.unwrap() {
            Claim::Claimed(_) => return,
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    panic!("the key stays pending under a claim nobody holds");
}

#[tokio::test]
async fn mysql_a_claim_that_timed_out_behind_a_held_row_leaves_the_key_free_once_the_row_is() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("orphan");
    // The builder's own example: an operation timeout under InnoDB's smallest lock wait (1 s).
    let store = MySqlStore::builder("orphan")
        .table(&table)
        .timeout(Duration::from_millis(250))
        .connect(&server.url())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let pool = server.pool(2).await;
    let key = random_key();
    let tx = hold_row(&pool, &store, &table, &key).await;
    let e = store
        .claim(&key, &fingerprint("a"), LONG)
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        StoreErrorKind::Timeout,
        "503: the work does not run"
    );
    // The first request's work fails: its transaction rolls back and the key is free. The
    // claim's statement, still waiting on the server for its lock wait of 1 s, takes it.
    tx.rollback().await.unwrap();
    // Past the server's lock wait, seconds wide.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        matches!(
            store.claim(&key, &fingerprint("a"), LONG).await.unwrap(),
            Claim::Claimed(_)
        ),
        "nobody runs the work: the retry claims the key, rather than 409 for the whole lease"
    );
}

#[tokio::test]
async fn mysql_a_claim_that_timed_out_on_a_pool_with_the_servers_lock_wait_leaves_the_key_free() {
    let Some(server) = MariaDbServer::shared() else {
        return;
    };
    let table = fresh_table("orphan_pool");
    // A pool of one's own: its sessions keep the server's lock wait (50 s), far past the
    // store's default timeout.
    let store = MySqlStore::builder("orphan_pool")
        .table(&table)
        .build(server.pool(2).await)
        .unwrap();
    store.migrate().await.unwrap();
    let pool = server.pool(2).await;
    let key = random_key();
    let tx = hold_row(&pool, &store, &table, &key).await;
    let e = store
        .claim(&key, &fingerprint("a"), LONG)
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        StoreErrorKind::Timeout,
        "503 after the default 3 s"
    );
    let waiting = server
        .sql(&format!(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
             WHERE trx_state = 'LOCK WAIT' AND trx_query LIKE '%{table}%'"
        ))
        .unwrap();
    assert_eq!(
        waiting.trim(),
        "1",
        "the claim's statement still waits on the server"
    );
    tx.rollback().await.unwrap();
    claimed_within_seconds(&store, &key).await;
}

// ---- the server's packet limit ---------------------------------------------------------------

#[tokio::test]
async fn mysql_a_record_within_the_servers_packet_limit_is_kept_and_a_larger_one_refused_clearly() {
    if !crate::support::mariadb_server::available() {
        return;
    }
    // A server of its own: `max_allowed_packet` is the server's, read by each new session.
    // 1 MiB, the least of the servers' defaults over the years, keeps the test quick.
    let server = MariaDbServer::start();
    server
        .sql("SET GLOBAL max_allowed_packet = 1048576")
        .unwrap();
    let store = store_on(&server, &fresh_table("packet"), "packet").await;
    let fp = fingerprint("a");

    // 700 KiB: under the packet limit as bytes, over it written out as hex.
    let bytes = bytes::Bytes::from((0..700 * 1024).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let key = random_key();
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    let written = store
        .complete(&key, &token, &fp, Record::from_bytes(bytes.clone()), LONG)
        .await;
    assert!(
        matches!(written, Ok(true)),
        "a 700 KiB record is kept: {written:?}"
    );
    match store.claim(&key, &fp, LONG).await.unwrap() {
        Claim::Done { record, .. } => assert_eq!(record.as_bytes(), &bytes, "replayed whole"),
        other => panic!("the repeat finds the record, not {other:?}"),
    }

    // 1.5 MiB: no packet of this server carries it. The store says why, and keeps working.
    let key = random_key();
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    let large = Record::from_bytes(bytes::Bytes::from(vec![7u8; 1536 * 1024]));
    let err = store
        .complete(&key, &token, &fp, large, LONG)
        .await
        .expect_err("a record over the packet limit is refused");
    assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("max_allowed_packet"), "{err}");
    assert!(
        matches!(
            store.claim(&key, &fp, LONG).await,
            Ok(Claim::Pending { .. })
        ),
        "nothing was written: the claim still holds the key"
    );
    // A step's result is written as hex: 600 KiB is over the limit, refused the same way.
    let step = StepId::from_bytes([1; 32]);
    let err = store
        .record_step(&key, &step, bytes.slice(..600 * 1024), LONG)
        .await
        .expect_err("a step's result over the packet limit is refused");
    assert!(err.to_string().contains("max_allowed_packet"), "{err}");
    let small = random_key();
    let Claim::Claimed(token) = store.claim(&small, &fp, LONG).await.unwrap() else {
        panic!("a free key is claimed");
    };
    assert!(
        store
            .complete(&small, &token, &fp, record("a"), LONG)
            .await
            .unwrap()
    );
}

/// The HTTP layer with every default over a store on a server whose packet limit is 1 MiB: a
/// 700 KiB response, within the engine's 1 MiB record limit, is recorded, and its repeat is
/// replayed rather than left in flight until the lease lapses and then run again.
#[tokio::test]
async fn mysql_with_the_defaults_a_large_response_under_a_small_packet_limit_is_replayed() {
    use http_body_util::{BodyExt, Full};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, ServiceExt, service_fn};
    use tower_idempotency::engine::Engine;
    use tower_idempotency::http::RequestBody;
    use tower_idempotency::{IdempotencyLayer, Principal};

    if !crate::support::mariadb_server::available() {
        return;
    }
    let server = MariaDbServer::start();
    server
        .sql("SET GLOBAL max_allowed_packet = 1048576")
        .unwrap();
    let store = MySqlStore::connect(&server.url(), "orders").await.unwrap();
    store.migrate().await.unwrap();
    let layer = IdempotencyLayer::new(Engine::new(store));
    let body = bytes::Bytes::from(vec![b'x'; 700 * 1024]);
    let runs = Arc::new(AtomicUsize::new(0));
    let ask = || {
        let (runs, body) = (Arc::clone(&runs), body.clone());
        let svc =
            layer.layer(service_fn(
                move |_req: http::Request<RequestBody<Full<bytes::Bytes>>>| {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(body)))
                    }
                },
            ));
        let req = http::Request::post("/orders")
            .header("idempotency-key", "order-1")
            .extension(Principal::new("alice"))
            .body(Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap();
        async move {
            let res = svc.oneshot(req).await.unwrap();
            let (status, replayed) = (
                res.status().as_u16(),
                res.headers().contains_key("idempotent-replayed"),
            );
            (
                status,
                replayed,
                res.into_body().collect().await.unwrap().to_bytes(),
            )
        }
    };
    let (status, replayed, first) = ask().await;
    assert_eq!((status, replayed), (200, false));
    assert_eq!(first, body, "the handler's response goes out");
    let (status, replayed, again) = ask().await;
    assert_eq!((status, replayed), (200, true), "the repeat is replayed");
    assert_eq!(again, body);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the work ran once");
}
