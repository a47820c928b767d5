//! A secret rotated as its docs say, one deploy at a time, over the memory store and a real
//! `redis-server`: records written before, during (replicas that sign with either key) and
//! after the rotation replay; a dropped key's records and a foreign key's are refused, and
//! nothing runs twice.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support::http::{RequestExt, TestServer, Work, send, server_with};
use tower_idempotency::engine::{Engine, KeyState, RecordErrorKind, Scope};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Secret, Store};

const BODY: &str = r#"{"item":"book"}"#;
const OLD: [u8; 32] = [1; 32];
const NEW: [u8; 32] = [2; 32];

/// A replica: an app with the default layer over `store`, under `secret`.
async fn replica<S: Store + Clone>(store: &S, secret: Secret) -> (TestServer, Work) {
    server_with(IdempotencyLayer::new(
        Engine::builder(store.clone()).secret(secret).build(),
    ))
    .await
}

async fn first_run(replica: &TestServer, key: &str) {
    let a = send(replica.post("/work", BODY).principal("alice").key(key)).await;
    assert_eq!(a.status, 201, "{key}: {}", a.describe());
    assert!(!a.is_replay());
}

async fn replays(replica: &TestServer, key: &str, on: &str) {
    let a = send(replica.post("/work", BODY).principal("alice").key(key)).await;
    assert!(a.is_replay(), "{key} on {on}: {}", a.describe());
}

async fn rotation_replays_what_the_ring_signed<S: Store + Clone>(store: S) {
    let before = Secret::new(OLD).unwrap();
    let step_1 = before.accepting(NEW).unwrap();
    let step_2 = before.rotated(NEW).unwrap();
    let step_3 = step_2.without_previous();

    let (r0, w0) = replica(&store, before).await;
    let (r1, w1) = replica(&store, step_1).await;
    let (r2, w2) = replica(&store, step_2).await;
    let (r3, w3) = replica(&store, step_3.clone()).await;

    // Before: written under the old key, replayed on every replica that still accepts it.
    first_run(&r0, "k-before").await;
    replays(&r1, "k-before", "step 1").await;
    replays(&r2, "k-before", "step 2").await;

    // During step 2's rollout: a replica of step 1 signs with the old key, one of step 2 with
    // the new; each replays the other's records.
    first_run(&r1, "k-old-signed").await;
    replays(&r2, "k-old-signed", "step 2").await;
    first_run(&r2, "k-new-signed").await;
    replays(&r1, "k-new-signed", "step 1").await;

    // After: written under the new key, replayed before and after the old key is dropped.
    first_run(&r2, "k-after").await;
    replays(&r2, "k-after", "step 2").await;
    replays(&r3, "k-after", "step 3").await;
    replays(&r3, "k-new-signed", "step 3").await;

    // The old key dropped: its records are refused, never run again. The repeat's fingerprint,
    // keyed under the new key only, no longer matches the record's: 422, not 503. Inspected
    // under the same ring, the record reads invalid: it no longer verifies.
    let dropped = send(r3.post("/work", BODY).principal("alice").key("k-before")).await;
    dropped.assert_problem(422, "idempotency.key_reused");
    let ops = IdempotencyLayer::new(Engine::builder(store.clone()).secret(step_3).build());
    let alice = Scope::principal("alice");
    match ops
        .inspect(&IdempotencyKey::new("k-before").unwrap(), &alice)
        .await
        .unwrap()
    {
        KeyState::Invalid { error, .. } => {
            assert_eq!(error.kind(), RecordErrorKind::Unauthenticated);
        }
        other => panic!("a dropped key's record reads invalid, got {other:?}"),
    }
    assert!(
        matches!(
            ops.inspect(&IdempotencyKey::new("k-after").unwrap(), &alice)
                .await
                .unwrap(),
            KeyState::Done { status: 201, .. }
        ),
        "a record of the ring reads done"
    );

    // A key outside the ring (same store keys, another signing key): refused both ways.
    let foreign = Secret::new(OLD).unwrap().rotated([9; 32]).unwrap();
    let (rf, wf) = replica(&store, foreign.without_previous()).await;
    first_run(&rf, "k-foreign").await;
    let refused = send(r2.post("/work", BODY).principal("alice").key("k-foreign")).await;
    refused.assert_problem(422, "idempotency.key_reused");
    let refused = send(rf.post("/work", BODY).principal("alice").key("k-after")).await;
    refused.assert_problem(422, "idempotency.key_reused");

    let runs = [&w0, &w1, &w2, &w3, &wf].map(Work::executions);
    assert_eq!(
        runs,
        [1, 1, 2, 0, 1],
        "each key's work ran once, where it was written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_rotation_replays_records_before_during_and_after() {
    rotation_replays_what_the_ring_signed(std::sync::Arc::new(MemoryStore::new())).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_rotation_replays_records_before_during_and_after() {
    use crate::support::redis_server::RedisServer;
    use tower_idempotency::store::redis::RedisStore;
    let Some(redis) = RedisServer::shared() else {
        return;
    };
    let store = RedisStore::connect(&redis.url(), "rotation").await.unwrap();
    rotation_replays_what_the_ring_signed(store).await;
}
