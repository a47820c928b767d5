//! Tampered records: bytes under a key that the layer did not write, or that changed at rest,
//! are answered 503 `idempotency.record_invalid` and never replayed; the handler never runs
//! for them. On the memory store (through `Store::complete`), on Redis (raw `SET` in the
//! store's layout), and every single-bit flip of a record with and without a `Secret`.
//!
//! Planted records with a denied header, a 500 status or corrupt bytes are also covered, one
//! each over reqwest, in `tests/http/replay.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::{http as support_http, raw_http};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use raw_http::{BODY, keyed, post};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use support_http::{LAYER_NS, Work, memory_app, secret_store_key, store_key, work_fingerprint};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::engine::{Fingerprint, Recorded};
use tower_idempotency::http::{Rejection, RejectionKind, RequestBody};
use tower_idempotency::store::{Claim, Record, StoreKey};
use tower_idempotency::{IdempotencyLayer, MemoryStore, Principal, Secret, Store};

/// A genuine record of the handler's kind of answer.
fn genuine() -> Recorded {
    Recorded::new(
        201,
        vec![
            (
                Bytes::from_static(b"content-type"),
                Bytes::from_static(b"application/json"),
            ),
            (
                Bytes::from_static(b"location"),
                Bytes::from_static(b"/things/1"),
            ),
        ],
        Some(Bytes::from_static(br#"{"execution":1,"body_len":15}"#)),
    )
}

fn encode(r: &Recorded) -> Vec<u8> {
    r.encode().unwrap().into_bytes().to_vec()
}

fn edit(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = encode(&genuine());
    f(&mut b);
    b
}

fn with_headers(status: u16, extra: &[(&'static str, &'static str)]) -> Vec<u8> {
    let mut r = genuine();
    r.status = status;
    for (n, v) in extra {
        r.headers.push((
            Bytes::from_static(n.as_bytes()),
            Bytes::from_static(v.as_bytes()),
        ));
    }
    encode(&r)
}

/// Tampered versions of [`genuine`]: each must be refused at replay (no secret needed).
fn tampered() -> Vec<(&'static str, Vec<u8>)> {
    let len = encode(&genuine()).len();
    let body_len_at = len - genuine().body.unwrap().len() - 4;
    let big = Recorded::new(201, vec![], Some(Bytes::from(vec![b'x'; (1 << 20) + 1])));
    vec![
        ("wrong version byte (2)", edit(|b| b[2] = 2)),
        ("wrong version byte (0)", edit(|b| b[2] = 0)),
        ("bad magic", edit(|b| b[0] ^= 0x01)),
        ("unknown flag bit", edit(|b| b[3] |= 0x80)),
        ("trailers flag without trailers", edit(|b| b[3] |= 0x02)),
        ("MAC flag without a tag", edit(|b| b[3] |= 0x04)),
        ("status-only flag with a body", edit(|b| b[3] &= !0x01)),
        ("status 500", with_headers(500, &[])),
        ("status 304", with_headers(304, &[])),
        (
            "status 1000",
            edit(|b| b[4..6].copy_from_slice(&1000u16.to_be_bytes())),
        ),
        (
            "set-cookie injected",
            with_headers(201, &[("set-cookie", "session=stolen")]),
        ),
        (
            "date injected",
            with_headers(201, &[("date", "Thu, 01 Jan 1970 00:00:00 GMT")]),
        ),
        (
            "header off the allow list",
            with_headers(201, &[("x-evil", "1")]),
        ),
        ("header count + 1", edit(|b| b[7] += 1)),
        (
            "LF in a header value",
            edit(|b| {
                let at = b.windows(9).position(|w| w == b"/things/1").unwrap();
                b[at] = b'\n';
            }),
        ),
        ("body length + 1", edit(|b| b[body_len_at + 3] += 1)),
        (
            "truncated by one byte",
            edit(|b| {
                b.pop();
            }),
        ),
        ("one trailing byte", edit(|b| b.push(0))),
        ("empty", Vec::new()),
        ("body over the record limit", encode(&big)),
    ]
}

/// Plants `bytes` as alice's completed record of `key` for the request `BODY`.
async fn plant<S: Store>(store: &S, key: &str, bytes: Vec<u8>, fp: &Fingerprint) {
    plant_at(store, &store_key(LAYER_NS, "alice", key), bytes, fp).await;
}

/// Plants `bytes` as the completed record under the store key `k`, for the request `BODY`.
async fn plant_at<S: Store>(store: &S, k: &StoreKey, bytes: Vec<u8>, fp: &Fingerprint) {
    support_http::plant(store, k, fp, Record::from_bytes(Bytes::from(bytes))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_records_in_the_memory_store_are_503_record_invalid_and_never_replayed() {
    let work = Work::plain();
    let (server, store) = memory_app(&work, IdempotencyLayer::new).await;
    for (i, (name, bytes)) in tampered().into_iter().enumerate() {
        let key = format!("k-tampered-{i}");
        plant(&*store, &key, bytes, &work_fingerprint(BODY)).await;
        let a = server
            .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
            .await;
        assert_eq!(
            (a.status, a.code().as_deref()),
            (503, Some("idempotency.record_invalid")),
            "{name}: {}",
            a.describe()
        );
        assert!(!a.is_replay(), "{name}: never replayed");
    }
    assert_eq!(
        work.executions(),
        0,
        "a refused record is no reason to run again"
    );
    // Control: the genuine bytes, planted the same way, replay.
    plant(
        &*store,
        "k-genuine",
        encode(&genuine()),
        &work_fingerprint(BODY),
    )
    .await;
    let a = server
        .one(&post("/work", &keyed("alice", b"k-genuine"), BODY))
        .await;
    assert!(
        a.is_replay(),
        "the genuine record replays: {}",
        a.describe()
    );
}

/// Sends alice's `BODY` request with `key` through `layer` over a handler that must not run;
/// returns (replayed, rejection kind).
async fn oneshot_replay(
    layer: IdempotencyLayer<Arc<MemoryStore>>,
    key: &str,
) -> (bool, Option<RejectionKind>) {
    let ran = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&ran);
    let svc = layer.layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            seen.store(true, Ordering::SeqCst);
            async { Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new()))) }
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert!(
        !ran.load(Ordering::SeqCst),
        "a planted record never leads to a run"
    );
    let replayed = res.headers().get("idempotent-replayed").is_some();
    let kind = res.extensions().get::<Rejection>().map(Rejection::kind);
    if replayed {
        let status = res.status().as_u16();
        assert!(
            (200..500).contains(&status),
            "a replay has a recordable status: {status}"
        );
        for name in res.headers().keys() {
            assert!(
                tower_idempotency::http::DEFAULT_ALLOWED_HEADERS.contains(name)
                    || name == "idempotent-replayed",
                "only allowed headers are replayed: {name}"
            );
        }
        let _ = res.into_body().collect().await;
    }
    (replayed, kind)
}

/// Flips every bit of `record` (one at a time), plants each result in a fresh store under
/// alice's key with fingerprint `fp`, and asks `layer_for` a store whether it replays it.
/// Returns (refused, replayed) counts.
async fn flip_every_bit(
    record: &[u8],
    at: &StoreKey,
    fp: &Fingerprint,
    layer_for: impl Fn(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (usize, usize, Vec<usize>) {
    let (mut refused, mut replayed, mut replayed_bytes) = (0, 0, Vec::new());
    for bit in 0..record.len() * 8 {
        let mut b = record.to_vec();
        b[bit / 8] ^= 1 << (bit % 8);
        let store = Arc::new(MemoryStore::new());
        plant_at(&*store, at, b, fp).await;
        match oneshot_replay(layer_for(store), "k-flip").await {
            (false, Some(RejectionKind::RecordInvalid)) => refused += 1,
            (true, None) => {
                replayed += 1;
                if replayed_bytes.last() != Some(&(bit / 8)) {
                    replayed_bytes.push(bit / 8);
                }
            }
            other => panic!("bit {bit}: unexpected answer {other:?}"),
        }
    }
    (refused, replayed, replayed_bytes)
}

#[tokio::test]
async fn with_a_secret_every_bit_flip_of_a_record_is_refused() {
    let secret = Secret::new(*b"hostile-input-test-secret-32-byt").unwrap();
    let layer_for = |s: Arc<MemoryStore>| {
        IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(s)
                .secret(secret.clone())
                .build(),
        )
    };
    // The layer's own record, sealed, and the keyed fingerprint it is stored under.
    let origin = Arc::new(MemoryStore::new());
    let svc = layer_for(Arc::clone(&origin)).layer(service_fn(
        |_req: http::Request<RequestBody<Full<Bytes>>>| async {
            let mut res = http::Response::new(Full::new(Bytes::from_static(br#"{"execution":1}"#)));
            *res.status_mut() = http::StatusCode::CREATED;
            res.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/json"),
            );
            Ok::<_, Infallible>(res)
        },
    ));
    let req = http::Request::post("/work")
        .header("content-type", "application/json")
        .header("idempotency-key", "k-flip")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(BODY)))
        .unwrap();
    assert_eq!(svc.oneshot(req).await.unwrap().status(), 201);
    let Claim::Done {
        fingerprint: keyed_fp,
        record,
    } = origin
        .claim(
            &secret_store_key(&secret, LAYER_NS, "alice", "k-flip"),
            &work_fingerprint(BODY),
            Duration::from_secs(1),
        )
        .await
        .unwrap()
    else {
        panic!("recorded");
    };
    assert_ne!(
        keyed_fp,
        work_fingerprint(BODY),
        "the stored fingerprint is keyed"
    );
    // Unchanged, it replays under the same secret.
    let control = Arc::new(MemoryStore::new());
    let at = secret_store_key(&secret, LAYER_NS, "alice", "k-flip");
    plant_at(&*control, &at, record.as_bytes().to_vec(), &keyed_fp).await;
    assert_eq!(
        oneshot_replay(layer_for(control), "k-flip").await,
        (true, None)
    );

    let (refused, replayed, _) = flip_every_bit(record.as_bytes(), &at, &keyed_fp, layer_for).await;
    eprintln!(
        "sealed record of {} bytes: {refused} bit flips refused, {replayed} replayed",
        record.len()
    );
    assert_eq!(replayed, 0, "with a secret, no flipped record is replayed");
    assert_eq!(refused, record.len() * 8);
    // RELIABILITY.md's figure: the 91-byte sealed record, 728 flips.
    assert_eq!(record.len(), 91);
}

#[tokio::test]
async fn without_a_secret_bit_flips_are_refused_or_replayed_as_valid_records_never_run() {
    let record = encode(&genuine());
    let (refused, replayed, bytes) = flip_every_bit(
        &record,
        &store_key(LAYER_NS, "alice", "k-flip"),
        &work_fingerprint(BODY),
        IdempotencyLayer::new,
    )
    .await;
    eprintln!(
        "plain record of {} bytes: {refused} bit flips refused, {replayed} replayed \
         (only flips at bytes {bytes:?} survive validation)",
        record.len()
    );
    assert_eq!(refused + replayed, record.len() * 8);
    // RELIABILITY.md's figures: the record and its flips are fixed, so are the counts. A change
    // of the record format moves them; the doc's row moves with it.
    assert_eq!(
        (record.len(), refused, replayed),
        (94, 320, 432),
        "bytes, flips refused, flips replayed"
    );
    // The envelope (magic, version, flags) is always checked; what survives is a flip inside
    // the status, a header value or the body, which only a secret can detect.
    assert!(
        bytes.iter().all(|b| *b >= 4),
        "an envelope flip was replayed: {bytes:?}"
    );
}

#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use crate::support::http::TestServer;
    use crate::support::redis_server::RedisServer;
    use tower_idempotency::store::redis::RedisStore;

    /// `'D' + fingerprint(32) + record`: the store's layout of a completed key.
    fn done_value(fp: &Fingerprint, record: &[u8]) -> Vec<u8> {
        [&b"D"[..], fp.as_bytes(), record].concat()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tampered_records_in_redis_are_503_and_never_replayed() {
        let Some(server) = RedisServer::shared() else {
            return;
        };
        let ns = &crate::support::stores::unique("hostile-redis");
        let store = RedisStore::connect(&server.url(), ns).await.unwrap();
        let work = Work::plain();
        let layer = IdempotencyLayer::new(store.clone());
        let app = TestServer::start(work.app(layer)).await;
        let fp = work_fingerprint(BODY);

        for (i, (name, bytes)) in tampered().into_iter().enumerate() {
            let key = format!("k-tampered-{i}");
            server
                .set_value(
                    &store,
                    &store_key(LAYER_NS, "alice", &key),
                    &done_value(&fp, &bytes),
                )
                .await;
            let a = app
                .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
                .await;
            assert_eq!(
                (a.status, a.code().as_deref()),
                (503, Some("idempotency.record_invalid")),
                "{name}: {}",
                a.describe()
            );
        }
        // Values that are not the store's layout at all: the claim fails, the work never runs.
        let garbage: [(&str, Vec<u8>); 5] = [
            ("empty value", Vec::new()),
            ("unknown state byte", [&b"X"[..], &[0; 48]].concat()),
            (
                "pending of the wrong length",
                [&b"P"[..], &[0; 40]].concat(),
            ),
            ("done shorter than a fingerprint", b"D0123".to_vec()),
            ("text", b"hello, I am not a record".to_vec()),
        ];
        for (i, (name, value)) in garbage.into_iter().enumerate() {
            let key = format!("k-garbage-{i}");
            server
                .set_value(&store, &store_key(LAYER_NS, "alice", &key), &value)
                .await;
            let a = app
                .one(&post("/work", &keyed("alice", key.as_bytes()), BODY))
                .await;
            assert_eq!(
                (a.status, a.code().as_deref()),
                (503, Some("idempotency.store_failed")),
                "{name}: {}",
                a.describe()
            );
        }
        assert_eq!(work.executions(), 0, "nothing ran");

        // Control: the genuine record, written the same way, replays.
        server
            .set_value(
                &store,
                &store_key(LAYER_NS, "alice", "k-genuine"),
                &done_value(&fp, &encode(&genuine())),
            )
            .await;
        let a = app
            .one(&post("/work", &keyed("alice", b"k-genuine"), BODY))
            .await;
        assert!(a.is_replay(), "{}", a.describe());
    }
}
