//! `PostgresStore` when the server ends its connections: `pg_terminate_backend` (what a fast
//! shutdown, a switchover or an idle-session timeout does to each session) on idle connections
//! and under a storm of requests, and the server's `statement_timeout` below the store's
//! operation timeout.
//!
//! ```text
//! TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 cargo test -p tower-idempotency --all-features \
//!     --test store -- postgres_connections
//! ```
#![cfg(feature = "postgres")]
#![allow(clippy::unwrap_used)]

use super::postgres_store::fresh_table;
use crate::support::postgres_server::PostgresServer;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_idempotency::IdempotencyKey;
use tower_idempotency::Store;
use tower_idempotency::conformance::{LONG, fingerprint, random_key, record};
use tower_idempotency::engine::{Begin, Engine, Fingerprint, Recorded, Scope};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::postgres::sqlx::{self, PgPool};
use tower_idempotency::store::{Claim, StoreError, StoreErrorKind, StoreKey};

/// The server's URL, its sessions named `app`: the test ends only those.
fn app_url(server: &PostgresServer, app: &str) -> String {
    format!("{}?application_name={app}", server.url())
}

/// Ends every session named `app`, as a shutdown does, and waits until their processes are
/// gone. Returns how many it ended.
async fn terminate(admin: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 30000)) \
         FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// The process ids of the sessions named `app`.
async fn sessions(admin: &PgPool, app: &str) -> BTreeSet<i32> {
    sqlx::query_scalar("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(app)
        .fetch_all(admin)
        .await
        .unwrap()
        .into_iter()
        .collect()
}

#[tokio::test]
async fn a_connection_the_server_ended_while_idle_is_not_used_again() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let app = fresh_table("idle");
    let store = PostgresStore::connect(&app_url(server, &app), "ended-idle")
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let admin = server.pool(1).await;
    let (key, fp) = (random_key(), fingerprint("a"));
    let Claim::Claimed(token) = store.claim(&key, &fp, LONG).await.unwrap() else {
        panic!("a fresh key is claimed");
    };

    // Between two steps, the server ends every session of the store.
    assert!(terminate(&admin, &app).await >= 1);
    // The next step succeeds on its first try: the record is written, and the key replays.
    let written = store.complete(&key, &token, &fp, record("a"), LONG).await;
    assert!(written.unwrap(), "the complete after the end is applied");
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Done { .. }
    ));

    // The same for a claim, which is never sent twice when it may have been applied: the
    // server's answer shows this one was not.
    assert!(terminate(&admin, &app).await >= 1);
    let other = random_key();
    assert!(matches!(
        store.claim(&other, &fp, LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
    // Every later step finds a sound connection.
    for _ in 0..5 {
        assert!(matches!(
            store.claim(&other, &fp, LONG).await.unwrap(),
            Claim::Pending { .. }
        ));
    }
}

#[tokio::test]
async fn the_server_statement_timeout_is_below_the_operation_timeout() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    // The default settings.
    let store = PostgresStore::connect(&server.url(), "statement-timeout")
        .await
        .unwrap();
    let mut conn = store.pool().acquire().await.unwrap();
    let ms: String =
        sqlx::query_scalar("SELECT setting FROM pg_settings WHERE name = 'statement_timeout'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let server_timeout = Duration::from_millis(ms.parse().unwrap());
    assert_eq!(store.timeout(), Duration::from_secs(1));
    assert!(
        server_timeout < store.timeout() && server_timeout >= store.timeout() * 3 / 4,
        "statement_timeout {server_timeout:?}: a little below the store's {:?}",
        store.timeout()
    );
}

#[tokio::test]
async fn a_slow_statement_is_cancelled_by_the_server_and_keeps_its_connection() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("slow");
    let app = table.clone();
    // A timeout long enough that the server's cancel wins by seconds on a loaded machine.
    let store = PostgresStore::builder("slow")
        .table(&table)
        .timeout(Duration::from_secs(10))
        .connect(&app_url(server, &app))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let admin = server.pool(2).await;
    let (key, fp) = (random_key(), fingerprint("a"));
    store.claim(&random_key(), &fp, LONG).await.unwrap();
    // The steps' sessions; the pool's closed, so that only the steps' remain.
    store.pool().close().await;
    let before = sessions(&admin, &app).await;
    assert_eq!(before.len(), 1, "{before:?}");

    // Another session holds the key's row: the claim waits for its lock.
    let mut holder = admin.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {table} (expires_at, key, state, fingerprint, token) \
         VALUES (now() + interval '1 minute', $1, 'P', $2, $3)"
    )))
    .bind(&store.row_key(&key)[..])
    .bind(&fp.as_bytes()[..])
    .bind(&[7u8; 16][..])
    .execute(&mut *holder)
    .await
    .unwrap();
    let e = store.claim(&key, &fp, LONG).await.unwrap_err();
    holder.rollback().await.unwrap();

    assert_eq!(e.kind(), StoreErrorKind::Timeout, "{e:?}");
    let cancelled = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .and_then(|s| s.as_database_error())
        .and_then(|db| db.code())
        .is_some_and(|code| code == "57014");
    assert!(
        cancelled,
        "the server's query_canceled, not the store's timer: {e:?}"
    );
    // The connection stays: the next claim takes it, and no other is opened.
    assert!(matches!(
        store.claim(&key, &fp, LONG).await.unwrap(),
        Claim::Claimed(_)
    ));
    assert_eq!(sessions(&admin, &app).await, before);
}

/// What the storm's requests met, per key.
#[derive(Debug, Default)]
struct Tally {
    /// Runs of the work, per key.
    runs: BTreeMap<usize, usize>,
    /// Records acknowledged, per key.
    acknowledged: BTreeMap<usize, usize>,
    replays: usize,
    in_flight: usize,
    claims_failed: Vec<String>,
    completes_failed: Vec<String>,
    completes_refused: usize,
}

fn store_key(k: usize) -> StoreKey {
    let key = IdempotencyKey::new(&format!("k{k}")).unwrap();
    StoreKey::derive("http", &Scope::principal("storm"), &key)
}

fn request(k: usize) -> Fingerprint {
    Fingerprint::builder().field(&k.to_be_bytes()).finish()
}

/// One request for key `k`: claim, run the work, complete; as a door does.
async fn send(engine: &Engine<PostgresStore>, k: usize, tally: &Mutex<Tally>) {
    let begun = engine.begin(store_key(k), request(k)).await;
    let ticket = match begun {
        Ok(Begin::Run(ticket)) => ticket,
        Ok(Begin::Replayed(_)) => return tally.lock().unwrap().replays += 1,
        Ok(Begin::InFlight) => return tally.lock().unwrap().in_flight += 1,
        Ok(other) => panic!("key {k}: {other:?}"),
        Err(e) => return tally.lock().unwrap().claims_failed.push(format!("{e:?}")),
    };
    *tally.lock().unwrap().runs.entry(k).or_default() += 1;
    // The work takes a moment, so that repeats meet it in flight.
    tokio::time::sleep(Duration::from_millis(2)).await;
    let response = Recorded::new(201, Vec::new(), Some(format!("k{k}").into()));
    let done: Result<bool, StoreError> = engine.complete(ticket, &response).await;
    let mut tally = tally.lock().unwrap();
    match done {
        Ok(true) => *tally.acknowledged.entry(k).or_default() += 1,
        Ok(false) => tally.completes_refused += 1,
        Err(e) => tally.completes_failed.push(format!("{e:?}")),
    }
}

/// The store and the engine with their default settings; the server ends every session of
/// the store a few times while clients send each key twice at once and again later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_ended_mid_storm_lose_no_record_and_run_nothing_twice() {
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 3;
    let app = fresh_table("storm");
    // A prefix of its own: the keys of this run are its alone in the default table.
    let store = PostgresStore::connect(&app_url(server, &app), &app)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let engine = Arc::new(Engine::new(store));
    let admin = server.pool(1).await;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(AtomicBool::new(false));

    // Clients go in pairs over the same keys, each key at once by both; each sends the key
    // before last again, which replays.
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (engine, tally, stop) = (Arc::clone(&engine), Arc::clone(&tally), stop.clone());
            tokio::spawn(async move {
                let pairs = CLIENTS / 2;
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    let k = n * pairs + c / 2;
                    send(&engine, k, &tally).await;
                    if n > 0 {
                        send(&engine, k - pairs, &tally).await;
                    }
                    n += 1;
                }
                n * pairs
            })
        })
        .collect();
    let mut ended = Vec::new();
    for _ in 0..ROUNDS {
        tokio::time::sleep(Duration::from_secs(1)).await;
        ended.push(terminate(&admin, &app).await);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::SeqCst);
    let mut keys = 0;
    for c in clients {
        keys = keys.max(c.await.unwrap());
    }

    let tally = Arc::try_unwrap(tally).unwrap().into_inner().unwrap();
    let twice: Vec<_> = tally.runs.iter().filter(|(_, n)| **n > 1).collect();
    let report = format!(
        "sessions ended per round {ended:?}; {keys} keys; {} ran, {} acknowledged, keys run \
         more than once {twice:?}; {} replays, {} in flight; claims failed {:#?}; completes \
         failed {:#?}, refused {}",
        tally.runs.len(),
        tally.acknowledged.len(),
        tally.replays,
        tally.in_flight,
        tally.claims_failed,
        tally.completes_failed,
        tally.completes_refused,
    );
    assert!(ended.iter().all(|n| *n > 0), "{report}");
    // No work without a claim, and none twice: the default lease does not lapse here.
    assert!(twice.is_empty(), "{report}");
    // The server said each step it cut off was not applied: each was sent once more, and no
    // request failed.
    assert!(tally.claims_failed.is_empty(), "{report}");
    // Every complete was applied, the one after each end included.
    assert!(tally.completes_failed.is_empty(), "{report}");
    assert_eq!(tally.completes_refused, 0, "{report}");
    assert_eq!(tally.runs.len(), tally.acknowledged.len(), "{report}");
    assert!(tally.acknowledged.len() > 100, "{report}");
    // Every key that ran replays its record now, rather than run again after the lease.
    let ran: Vec<usize> = tally.runs.keys().copied().collect();
    let checks: Vec<_> = ran
        .chunks(ran.len().div_ceil(CLIENTS))
        .map(|keys| {
            let (engine, keys) = (Arc::clone(&engine), keys.to_vec());
            tokio::spawn(async move {
                for k in keys {
                    let again = engine.begin(store_key(k), request(k)).await.unwrap();
                    assert!(matches!(again, Begin::Replayed(_)), "key {k}: {again:?}");
                }
            })
        })
        .collect();
    for check in checks {
        check.await.unwrap();
    }
    eprintln!("{report}");
}
