//! Operators forget a key: the record of a key sent through the layer is
//! deleted, so the customer's next request under it runs again; a pending claim only when
//! asked for explicitly. On the memory store and on Redis.

use crate::support;

use std::time::Duration;
use support::http::{RequestExt, TestServer, Work, send};
use tower_idempotency::engine::Scope;
use tower_idempotency::store::{Forgotten, Store};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer};

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
});
