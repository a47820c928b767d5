//! Steps recorded under `Secret::encrypting`: a step's value is sealed like a record's content,
//! so neither it nor the response is readable in the memory store's values, Redis's raw values
//! or PostgreSQL's rows, and it still replays; a rotation replays what the ring sealed and
//! refuses what a dropped key sealed; a step sealed and read without the secret is refused;
//! steps tagged before encryption was turned on replay. A refused step never runs its work.
//!
//! Without `redis-server` or PostgreSQL installed the server tests print a notice and pass,
//! unless `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set.
#![cfg(feature = "encrypt")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Recorded, StepErrorKind};
use tower_idempotency::store::StoreKey;
use tower_idempotency::{MemoryStore, Secret, Store};

const OLD: [u8; 32] = [1; 32];
const NEW: [u8; 32] = [2; 32];
/// In a step's value: a payment provider's answer with a cardholder's name.
const STEP_MARKER: &str = "STEPVALUEMARKER";
/// In the response's body.
const BODY_MARKER: &[u8] = b"RESPONSEBODYMARKER";

static NEXT: AtomicU64 = AtomicU64::new(1);

/// A key of its own per call.
fn fresh_key() -> StoreKey {
    let mut id = [0u8; 32];
    getrandom::fill(&mut id).unwrap();
    id[..8].copy_from_slice(&NEXT.fetch_add(1, Ordering::Relaxed).to_be_bytes());
    StoreKey::from_parts([9; 32], id)
}

fn request() -> Fingerprint {
    Fingerprint::builder().field(b"order 17").finish()
}

fn engine<S: Store + Clone>(store: &S, secret: Option<&Secret>) -> Engine<S> {
    let b = Engine::builder(store.clone());
    match secret {
        Some(s) => b.secret(s.clone()),
        None => b,
    }
    .build()
}

/// How a run ends once its step answered.
#[derive(Clone, Copy)]
enum End {
    /// Released: the steps are kept for a retry.
    Release,
    /// Completed with a response holding `BODY_MARKER`: the record replaces the steps.
    Complete,
}

/// One run of the request under `key`: its step `charge` (which counts its work in `runs`),
/// then `end`. The step's value, or its error's kind.
async fn run<S: Store + Clone>(
    store: &S,
    secret: Option<&Secret>,
    key: StoreKey,
    runs: &AtomicUsize,
    end: End,
) -> Result<String, StepErrorKind> {
    let engine = engine(store, secret);
    let Begin::Run(ticket) = engine.begin(key, request()).await.unwrap() else {
        panic!("the key is free");
    };
    let steps = engine.steps(&ticket);
    let value = steps
        .run("charge", Raw, |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, &str>(format!("ch_1 {STEP_MARKER} Jane"))
        })
        .await
        .map_err(|e| e.kind());
    match end {
        End::Release => {
            engine.release(ticket).await.unwrap();
        }
        End::Complete => {
            let response = Recorded::new(201, vec![], Some(Bytes::from_static(BODY_MARKER)));
            assert!(engine.complete(ticket, &response).await.unwrap());
        }
    }
    value
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// A step sealed under an encrypting secret replays on the retry without running, and `raw`
/// (every value the store holds) shows neither a step's value nor a response's body. The
/// same scan finds a step recorded under a secret that only tags: it reads the steps.
async fn nothing_of_a_step_rests<S, F, Fut>(store: S, raw: F)
where
    S: Store + Clone,
    F: Fn(Vec<StoreKey>) -> Fut,
    Fut: std::future::Future<Output = Vec<Vec<u8>>>,
{
    let secret = Secret::new(OLD).unwrap().encrypting();
    let runs = AtomicUsize::new(0);
    let (released, completed) = (fresh_key(), fresh_key());
    let first = run(&store, Some(&secret), released, &runs, End::Release).await;
    let retry = run(&store, Some(&secret), released, &runs, End::Release).await;
    assert_eq!(first, retry, "the step replays");
    assert!(first.unwrap().contains(STEP_MARKER));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "replayed, not run again");
    run(&store, Some(&secret), completed, &runs, End::Complete)
        .await
        .unwrap();

    let values = raw(vec![released, completed]).await;
    assert!(!values.is_empty(), "the scan reads the store");
    for v in &values {
        for m in [STEP_MARKER.as_bytes(), BODY_MARKER, b"charge"] {
            assert!(
                !contains(v, m),
                "{:?} readable at rest",
                String::from_utf8_lossy(m)
            );
        }
    }

    // Control: a secret that only tags leaves the step readable to the same scan.
    let tagged = fresh_key();
    let tagging = Secret::new(NEW).unwrap();
    run(&store, Some(&tagging), tagged, &runs, End::Release)
        .await
        .unwrap();
    assert!(
        raw(vec![released, completed, tagged])
            .await
            .iter()
            .any(|v| contains(v, STEP_MARKER.as_bytes())),
        "the scan finds a step that is not encrypted"
    );
}

/// A rotation of an encrypting secret: a step sealed under the old key replays after
/// `rotated`, and is refused after `without_previous` (503 `record_invalid` at a door), its
/// work not run again. A step read by an engine with no secret is refused too. Steps tagged
/// before encryption was turned on replay under the encrypting secret.
async fn a_step_opens_under_its_ring_only<S: Store + Clone>(store: S) {
    let runs = AtomicUsize::new(0);
    let before = Secret::new(OLD).unwrap().encrypting();
    let rotated = before.rotated(NEW).unwrap();
    let dropped = rotated.without_previous();
    let (sealed_old, tagged_before) = (fresh_key(), fresh_key());
    let first = run(&store, Some(&before), sealed_old, &runs, End::Release)
        .await
        .unwrap();
    let tagging = Secret::new(OLD).unwrap();
    let tagged = run(&store, Some(&tagging), tagged_before, &runs, End::Release)
        .await
        .unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let after = run(&store, Some(&rotated), sealed_old, &runs, End::Release).await;
    assert_eq!(after.as_ref(), Ok(&first), "replays after `rotated`");
    let turned_on = run(&store, Some(&before), tagged_before, &runs, End::Release).await;
    assert_eq!(turned_on.as_ref(), Ok(&tagged), "a tagged step replays");
    for (secret, on) in [
        (Some(&dropped), "after `without_previous`"),
        (None, "without a secret"),
    ] {
        let refused = run(&store, secret, sealed_old, &runs, End::Release).await;
        assert_eq!(refused, Err(StepErrorKind::RecordInvalid), "{on}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "no step ran again");
}

#[tokio::test]
async fn memory_an_encrypted_step_holds_nothing_readable_and_replays() {
    let store = Arc::new(MemoryStore::new());
    let reader = Arc::clone(&store);
    nothing_of_a_step_rests(store, move |keys: Vec<StoreKey>| {
        let reader = Arc::clone(&reader);
        async move {
            let mut out = Vec::new();
            for k in &keys {
                for (_, v) in reader.steps(k).await.unwrap() {
                    out.push(v.to_vec());
                }
                if let Ok(tower_idempotency::store::Claim::Done { record, .. }) = reader
                    .claim(k, &request(), std::time::Duration::from_secs(1))
                    .await
                {
                    out.push(record.into_bytes().to_vec());
                }
            }
            out
        }
    })
    .await;
}

#[tokio::test]
async fn memory_a_sealed_step_opens_under_its_ring_only() {
    a_step_opens_under_its_ring_only(Arc::new(MemoryStore::new())).await;
}

/// Every value a Redis server holds: strings as they are, each field of a hash.
#[cfg(feature = "redis")]
async fn redis_values(server: &crate::support::redis_server::RedisServer) -> Vec<Vec<u8>> {
    use tower_idempotency::store::redis::redis;
    let mut conn = server.connection().await;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE")
            .arg(&k)
            .query_async(&mut conn)
            .await
            .unwrap();
        match kind.as_str() {
            "string" => out.push(
                redis::cmd("GET")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap(),
            ),
            "hash" => {
                let fields: Vec<Vec<u8>> = redis::cmd("HGETALL")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                out.extend(fields);
            }
            other => panic!("a value of type {other}"),
        }
    }
    out
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_encrypted_step_holds_nothing_readable_in_its_raw_value() {
    use crate::support::redis_server::{RedisServer, available};
    use tower_idempotency::store::redis::RedisStore;
    if !available() {
        return;
    }
    // A server of its own, so every value in it is this test's.
    let server = Arc::new(RedisServer::start());
    let store = RedisStore::connect(&server.url(), "sealed").await.unwrap();
    nothing_of_a_step_rests(store.clone(), |_| {
        let server = Arc::clone(&server);
        async move { redis_values(&server).await }
    })
    .await;
    a_step_opens_under_its_ring_only(store).await;
}

#[cfg(all(feature = "postgres", feature = "test-util"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_encrypted_step_holds_nothing_readable_in_its_row() {
    use crate::postgres_store::{fresh_table, store_on};
    use crate::support::postgres_server::PostgresServer;
    use tower_idempotency::store::postgres::sqlx;
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("sealed_steps");
    let store = store_on(server, &table, "sealed").await;
    let pool = store.pool().clone();
    let rows = |pool: sqlx::PgPool, table: String| async move {
        let mut out: Vec<Vec<u8>> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT value FROM {table}_steps"
        )))
        .fetch_all(&pool)
        .await
        .unwrap();
        let records: Vec<Option<Vec<u8>>> =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT record FROM {table}")))
                .fetch_all(&pool)
                .await
                .unwrap();
        out.extend(records.into_iter().flatten());
        out
    };
    // A step in a transaction is recorded sealed too, and replays.
    let secret = Secret::new(OLD).unwrap().encrypting();
    let engine = engine(&store, Some(&secret));
    let key = fresh_key();
    let runs = AtomicUsize::new(0);
    for _ in 0..2 {
        let Begin::Run(ticket) = engine.begin(key, request()).await.unwrap() else {
            panic!("the key is free");
        };
        let steps = engine.steps(&ticket);
        let mut conn = pool.acquire().await.unwrap();
        let value: String = tower_idempotency::transactional::step(
            &engine,
            &steps,
            &mut conn,
            "reserve",
            Raw,
            |_tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                Box::pin(async { Ok::<_, sqlx::Error>(format!("order {STEP_MARKER}")) })
            },
        )
        .await
        .unwrap();
        assert!(value.contains(STEP_MARKER));
        engine.release(ticket).await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "replayed, not run again");
    let values = rows(pool.clone(), table.clone()).await;
    assert!(!values.is_empty(), "the step's row");
    assert!(
        !values.iter().any(|v| contains(v, STEP_MARKER.as_bytes())),
        "the step's value readable at rest"
    );

    nothing_of_a_step_rests(store.clone(), |_| rows(pool.clone(), table.clone())).await;

    a_step_opens_under_its_ring_only(store).await;
}
