//! Records encrypted at rest under `Secret::encrypting`: nothing of the response is readable in
//! the memory store's bytes, Redis's raw values or PostgreSQL's rows, and it still replays; a
//! rotation keeps replaying what the ring sealed; a dropped key's record, a record moved to
//! another key and a flipped byte are refused, and nothing runs twice.
//!
//! Without `redis-server` or PostgreSQL installed the server tests print a notice and pass,
//! unless `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set.
#![cfg(feature = "encrypt")]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::http::{LAYER_NS, plant, secret_store_key, work_fingerprint};
use crate::support::raw_http::BODY;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::engine::{Engine, Fingerprint};
use tower_idempotency::http::{Rejection, RejectionKind, RequestBody};
use tower_idempotency::store::{Claim, Record, StoreKey};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal, Secret, Store};

const OLD: [u8; 32] = [1; 32];
const NEW: [u8; 32] = [2; 32];
/// In the response body, a header and the status line's reason: none may be read at rest.
const MARKER: &[u8] = b"CARDHOLDERMARKER";
const RESPONSE: &[u8] = br#"{"card":"CARDHOLDERMARKER-4111","name":"CARDHOLDERMARKER Jane"}"#;

/// What one request got: status, replayed, the rejection's kind, the body.
#[derive(Debug)]
struct Answer {
    status: u16,
    replayed: bool,
    rejection: Option<RejectionKind>,
    body: Bytes,
}

/// Sends alice's `BODY` request with `key` through the default layer over `store` under
/// `secret`, to a handler that answers 201 with `RESPONSE` and counts its runs in `runs`.
async fn ask<S: Store + Clone>(
    store: &S,
    secret: &Secret,
    key: &str,
    runs: &Arc<AtomicUsize>,
) -> Answer {
    let layer = IdempotencyLayer::new(
        Engine::builder(store.clone())
            .secret(secret.clone())
            .build(),
    );
    let runs = Arc::clone(runs);
    let svc = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            runs.fetch_add(1, Ordering::SeqCst);
            async {
                let res = http::Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .header("location", "/cards/CARDHOLDERMARKER")
                    .body(Full::new(Bytes::from_static(RESPONSE)))
                    .unwrap();
                Ok::<_, Infallible>(res)
            }
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    let status = res.status().as_u16();
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let rejection = res.extensions().get::<Rejection>().map(Rejection::kind);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        replayed,
        rejection,
        body,
    }
}

fn at(secret: &Secret, key: &str) -> StoreKey {
    secret_store_key(secret, LAYER_NS, "alice", key)
}

/// The record and the fingerprint the store holds under `key`, as the store answers a claim.
async fn held<S: Store>(store: &S, secret: &Secret, key: &str) -> (Fingerprint, Record) {
    let claim = store
        .claim(
            &at(secret, key),
            &work_fingerprint(BODY),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let Claim::Done {
        fingerprint,
        record,
    } = claim
    else {
        panic!("{key} is recorded: {claim:?}");
    };
    (fingerprint, record)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Keys written so far, with the secret that wrote each: what the memory store's reader claims.
type Written = Vec<(Secret, &'static str)>;

/// The first run is recorded sealed and replays; `raw` reads every value the store holds, and
/// none of them holds the response. Under a secret that only tags, the same scan finds it.
async fn nothing_of_the_response_rests<S, F, Fut>(store: S, raw: F)
where
    S: Store + Clone,
    F: Fn(Written) -> Fut,
    Fut: std::future::Future<Output = Vec<Vec<u8>>>,
{
    let secret = Secret::new(OLD).unwrap().encrypting();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = ask(&store, &secret, "k-sealed", &runs).await;
    assert_eq!((first.status, first.replayed), (201, false), "{first:?}");
    let again = ask(&store, &secret, "k-sealed", &runs).await;
    assert!(again.replayed, "{again:?}");
    assert_eq!((again.status, &again.body[..]), (201, RESPONSE));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "replayed, not run again");

    let values = raw(vec![(secret.clone(), "k-sealed")]).await;
    assert!(!values.is_empty(), "the scan reads the store");
    for v in &values {
        for m in [MARKER, b"/cards/", b"location", b"application/json"] {
            assert!(
                !contains(v, m),
                "{:?} readable at rest",
                String::from_utf8_lossy(m)
            );
        }
    }

    // Control: a secret that only tags leaves the response readable to the same scan.
    let tagging = Secret::new(NEW).unwrap();
    let plain = ask(&store, &tagging, "k-tagged", &runs).await;
    assert_eq!(plain.status, 201, "{plain:?}");
    assert!(
        raw(vec![(secret, "k-sealed"), (tagging, "k-tagged")])
            .await
            .iter()
            .any(|v| contains(v, MARKER)),
        "the scan finds a response that is not encrypted"
    );
}

#[tokio::test]
async fn memory_an_encrypted_record_holds_nothing_readable_and_replays() {
    let store = Arc::new(MemoryStore::new());
    let reader = Arc::clone(&store);
    nothing_of_the_response_rests(store, move |written: Written| {
        let reader = Arc::clone(&reader);
        async move {
            let mut out = Vec::new();
            for (s, k) in &written {
                out.push(held(&*reader, s, k).await.1.into_bytes().to_vec());
            }
            out
        }
    })
    .await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_encrypted_record_holds_nothing_readable_in_its_raw_value() {
    use crate::support::redis_server::{RedisServer, available};
    use tower_idempotency::store::redis::{RedisStore, redis};
    if !available() {
        return;
    }
    // A server of its own, so every value in it is this test's.
    let server = Arc::new(RedisServer::start());
    let store = RedisStore::connect(&server.url(), "sealed").await.unwrap();
    nothing_of_the_response_rests(store, |_| {
        let server = Arc::clone(&server);
        async move {
            let mut conn = server.connection().await;
            let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
                .arg("*")
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut out = Vec::new();
            for k in keys {
                let v: Vec<u8> = redis::cmd("GET")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                out.push(v);
            }
            out
        }
    })
    .await;
}

#[cfg(all(feature = "postgres", feature = "test-util"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_an_encrypted_record_holds_nothing_readable_in_its_row() {
    use crate::postgres_store::{fresh_table, store_on};
    use crate::support::postgres_server::PostgresServer;
    use tower_idempotency::store::postgres::sqlx;
    let Some(server) = PostgresServer::shared() else {
        return;
    };
    let table = fresh_table("sealed");
    let store = store_on(server, &table, "sealed").await;
    let pool = store.pool().clone();
    nothing_of_the_response_rests(store, |_| {
        let (pool, table) = (pool.clone(), table.clone());
        async move {
            let rows: Vec<(Option<Vec<u8>>,)> =
                sqlx::query_as(sqlx::AssertSqlSafe(format!("SELECT record FROM {table}")))
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            rows.into_iter().filter_map(|(r,)| r).collect()
        }
    })
    .await;
}

/// A rotation of an encrypting secret, step by step: what the old key sealed replays while the
/// ring holds it, what the new key sealed replays after the old is dropped, and the dropped
/// key's record is refused, never run again.
#[tokio::test]
async fn memory_a_rotated_encrypting_secret_opens_what_its_ring_sealed() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let before = Secret::new(OLD).unwrap().encrypting();
    let step_1 = before.accepting(NEW).unwrap();
    let step_2 = before.rotated(NEW).unwrap();
    let step_3 = step_2.without_previous();
    assert!([&step_1, &step_2, &step_3].iter().all(|s| s.encrypts()));

    assert_eq!(ask(&store, &before, "k-old", &runs).await.status, 201);
    assert_eq!(ask(&store, &step_2, "k-new", &runs).await.status, 201);
    for (s, k, on) in [
        (&step_1, "k-old", "step 1"),
        (&step_2, "k-old", "step 2"),
        (&step_1, "k-new", "step 1"),
        (&step_3, "k-new", "step 3"),
    ] {
        let a = ask(&store, s, k, &runs).await;
        assert!(a.replayed, "{k} on {on}: {a:?}");
        assert_eq!(&a.body[..], RESPONSE, "{k} on {on}");
    }
    // The old key dropped: its record is refused (its fingerprint is no longer the request's).
    let dropped = ask(&store, &step_3, "k-old", &runs).await;
    assert_eq!(
        (dropped.status, dropped.rejection),
        (422, Some(RejectionKind::KeyReused)),
        "{dropped:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each key's work ran once");
}

/// A sealed record moved to another key, or with any byte flipped, cannot be opened: it is
/// refused 503 `record_invalid`, never replayed, never run.
#[tokio::test]
async fn memory_a_record_the_ring_cannot_open_is_503_record_invalid() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let secret = Secret::new(OLD).unwrap().encrypting();
    assert_eq!(ask(&store, &secret, "k-a", &runs).await.status, 201);
    assert_eq!(ask(&store, &secret, "k-b", &runs).await.status, 201);
    let (fp, record) = held(&*store, &secret, "k-a").await;

    // Moved to another key: bound to its own, so it does not open there.
    let moved = Arc::new(MemoryStore::new());
    plant(&*moved, &at(&secret, "k-b"), &fp, record.clone()).await;
    let a = ask(&moved, &secret, "k-b", &runs).await;
    assert_eq!(
        (a.status, a.rejection, a.replayed),
        (503, Some(RejectionKind::RecordInvalid), false),
        "{a:?}"
    );
    // Left where it was, it replays (the control).
    let home = Arc::new(MemoryStore::new());
    plant(&*home, &at(&secret, "k-a"), &fp, record.clone()).await;
    assert!(ask(&home, &secret, "k-a", &runs).await.replayed);

    // Every byte flipped in turn: none opens.
    let bytes = record.as_bytes();
    for i in 0..bytes.len() {
        let mut b = bytes.to_vec();
        b[i] ^= 0x01;
        let one = Arc::new(MemoryStore::new());
        plant(
            &*one,
            &at(&secret, "k-a"),
            &fp,
            Record::from_bytes(b.into()),
        )
        .await;
        let a = ask(&one, &secret, "k-a", &runs).await;
        assert_eq!(
            (a.status, a.rejection),
            (503, Some(RejectionKind::RecordInvalid)),
            "byte {i} flipped: {a:?}"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "a refused record runs nothing"
    );
}

/// Turning encryption on or off needs no steps: a replica that encrypts replays the records a
/// replica that only tags wrote under the same ring, and the other way round.
#[tokio::test]
async fn memory_encryption_turned_on_or_off_still_replays_the_other_records() {
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let tagging = Secret::new(OLD).unwrap();
    let encrypting = tagging.encrypting();
    assert_eq!(ask(&store, &tagging, "k-tagged", &runs).await.status, 201);
    assert_eq!(
        ask(&store, &encrypting, "k-sealed", &runs).await.status,
        201
    );
    let a = ask(&store, &encrypting, "k-tagged", &runs).await;
    assert!(a.replayed && &a.body[..] == RESPONSE, "{a:?}");
    let a = ask(&store, &tagging, "k-sealed", &runs).await;
    assert!(a.replayed && &a.body[..] == RESPONSE, "{a:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The secret removed (an engine with none): the store keys are no longer keyed, so the sealed
/// record is not found and a retry runs its work again, as after any new secret; read at its
/// own store key, the record is refused as unauthenticated, never replayed.
#[tokio::test]
async fn memory_an_engine_without_the_secret_never_finds_or_opens_an_encrypted_record() {
    use tower_idempotency::engine::{KeyState, RecordErrorKind};
    let store = Arc::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let secret = Secret::new(OLD).unwrap().encrypting();
    assert_eq!(ask(&store, &secret, "k-off", &runs).await.status, 201);

    let bare = Engine::new(Arc::clone(&store));
    match bare.inspect(&at(&secret, "k-off")).await.unwrap() {
        KeyState::Invalid { error, .. } => {
            assert_eq!(error.kind(), RecordErrorKind::Unauthenticated);
        }
        other => panic!("a sealed record read without its secret is invalid, got {other:?}"),
    }
    let counted = Arc::clone(&runs);
    let svc = IdempotencyLayer::new(bare).layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-off")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 200);
    assert!(res.headers().get("idempotent-replayed").is_none());
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "without the secret the store key moves: the retry runs again"
    );
}
