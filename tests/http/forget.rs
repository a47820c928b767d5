//! Operators forget a key: the record of a key sent through the layer is
//! deleted, so the customer's next request under it runs again; a pending claim only when
//! asked for explicitly. They inspect a key as the layer derives it, under its secret and per
//! principal. On the memory store and on Redis.

use crate::support;

use std::time::Duration;
use support::http::{RequestExt, TestServer, Work, send};
use tower_idempotency::engine::{Engine, KeyState, Scope};
use tower_idempotency::store::{Forgotten, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, Secret};

const BODY: &str = r#"{"item":"book"}"#;

async fn forgetting<St: Store>(store: St) {
    let layer = IdempotencyLayer::new(store);
    let ops = layer.clone();
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let alice = Scope::principal("alice");
    let request = |key: &str| server.post("/work", BODY).principal("alice").key(key);

    // A completed record: forgotten, the next request under the key runs again.
    let first = send(request("reuse-me")).await;
    assert!(send(request("reuse-me")).await.is_replay());
    let key = IdempotencyKey::new("reuse-me").expect("a key");
    let other = Scope::principal("bob");
    assert_eq!(
        ops.forget(&key, &other).await.expect("forget"),
        Forgotten::Nothing,
        "another principal's key of the same name is another key"
    );
    assert_eq!(
        ops.forget(&key, &alice).await.expect("forget"),
        Forgotten::Record
    );
    let again = send(request("reuse-me")).await;
    assert_eq!(again.status, 201);
    assert!(!again.is_replay(), "the forgotten key runs again");
    assert_ne!(again.execution(), first.execution());

    // A pending claim: kept unless asked for.
    let slow = tokio::spawn(send(request("stuck").delay_ms(1_500)));
    work.wait_runs("stuck", 1).await;
    let stuck = IdempotencyKey::new("stuck").expect("a key");
    assert_eq!(
        ops.forget(&stuck, &alice).await.expect("forget"),
        Forgotten::KeptPending
    );
    send(request("stuck"))
        .await
        .assert_problem(409, "idempotency.in_flight");
    assert_eq!(
        ops.forget_even_pending(&stuck, &alice)
            .await
            .expect("forget"),
        Forgotten::Pending
    );
    let rerun = send(request("stuck")).await;
    assert_eq!(rerun.status, 201, "{}", rerun.describe());
    assert!(
        !rerun.is_replay(),
        "a forgotten pending key runs again at once"
    );
    assert_eq!(work.runs_of("stuck"), 2);
    let _ = tokio::time::timeout(Duration::from_secs(10), slow).await;
}

/// `IdempotencyLayer::inspect` finds what a request through the layer left under its key, with
/// the layer's secret keying the store key: in flight while it runs, then done with its status,
/// for its own principal only; reading changes nothing (the repeat still replays), and a
/// forgotten key reads absent.
async fn inspecting<St: Store>(store: St) {
    let engine = Engine::builder(store)
        .secret(Secret::new([9u8; 32].to_vec()).expect("a secret"))
        .build();
    let (lease, retention) = (engine.lease(), engine.retention());
    let layer = IdempotencyLayer::new(engine);
    let ops = layer.clone();
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let alice = Scope::principal("alice");
    let request = |key: &str| server.post("/work", BODY).principal("alice").key(key);
    let key = IdempotencyKey::new("look-at-me").expect("a key");

    assert_eq!(
        ops.inspect(&key, &alice).await.expect("inspect"),
        KeyState::Absent
    );
    let slow = tokio::spawn(send(request("look-at-me").delay_ms(1_500)));
    work.wait_runs("look-at-me", 1).await;
    match ops.inspect(&key, &alice).await.expect("inspect") {
        KeyState::InFlight { lease_left, .. } => assert!(
            lease_left <= lease && lease_left >= lease / 2,
            "the lease left is within the lease: {lease_left:?} of {lease:?}"
        ),
        other => panic!("a running request reads in flight, got {other:?}"),
    }
    let first = tokio::time::timeout(Duration::from_secs(10), slow)
        .await
        .expect("the first run ends")
        .expect("joined");
    assert_eq!(first.status, 201, "{}", first.describe());
    for _ in 0..2 {
        match ops.inspect(&key, &alice).await.expect("inspect") {
            KeyState::Done {
                status, expires_in, ..
            } => {
                assert_eq!(status, 201, "the recorded status");
                // Seconds wide: the record was written moments ago.
                assert!(
                    expires_in <= retention && expires_in >= retention - Duration::from_secs(60),
                    "the record's retention left: {expires_in:?} of {retention:?}"
                );
            }
            other => panic!("a finished request reads done, got {other:?}"),
        }
    }
    assert_eq!(
        ops.inspect(&key, &Scope::principal("bob"))
            .await
            .expect("inspect"),
        KeyState::Absent,
        "another principal's key of the same name is another key"
    );
    let again = send(request("look-at-me")).await;
    assert!(
        again.is_replay(),
        "inspection changed nothing: {}",
        again.describe()
    );
    assert_eq!(again.execution(), first.execution());
    assert_eq!(work.runs_of("look-at-me"), 1);

    assert_eq!(
        ops.forget(&key, &alice).await.expect("forget"),
        Forgotten::Record
    );
    assert_eq!(
        ops.inspect(&key, &alice).await.expect("inspect"),
        KeyState::Absent
    );
}

// Once per store: `on_memory::…`, `on_redis::…`.
crate::support::stores::per_store!([on_memory: memory, on_redis: redis] {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operators_forget_keys() {
        let Some(store) = store().await else {
            return;
        };
        forgetting(store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn operators_inspect_keys_as_the_layer_derives_them() {
        let Some(store) = store().await else {
            return;
        };
        inspecting(store).await;
    }
});
