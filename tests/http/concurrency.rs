//! Concurrency over a real TCP server: many repeats at once, a handler slower than its lease
//! (renewal), and a client that goes away while its handler runs.

use crate::support;

use std::time::Duration;
use support::http::{Answer, RequestExt, SpyStore, bounded, eventually, send, server_with};
use tokio::io::AsyncWriteExt;
use tower_idempotency::IdempotencyLayer;

const BODY: &str = r#"{"item":"book"}"#;

// ---------------------------------------------------------------------------------------------
// Concurrency, leases, dropped clients
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_duplicates_run_the_handler_exactly_once() {
    let (server, work) = server_with(IdempotencyLayer::new(SpyStore::new())).await;
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            tokio::spawn(send(
                server
                    .post("/work", BODY)
                    .principal("alice")
                    .key("hot-key")
                    .delay_ms(200),
            ))
        })
        .collect();
    let mut answers: Vec<Answer> = Vec::with_capacity(tasks.len());
    for t in tasks {
        answers.push(
            bounded(Duration::from_secs(30), "a concurrent repeat", t)
                .await
                .expect("the request task"),
        );
    }
    let fresh = answers
        .iter()
        .filter(|a| a.status == 201 && !a.is_replay())
        .count();
    let replays = answers
        .iter()
        .filter(|a| a.status == 201 && a.is_replay())
        .count();
    let in_flight = answers
        .iter()
        .filter(|a| a.status == 409 && a.json()["code"] == "idempotency.in_flight")
        .count();
    let unexpected: Vec<String> = answers
        .iter()
        .filter(|a| {
            !(a.status == 201 || (a.status == 409 && a.json()["code"] == "idempotency.in_flight"))
        })
        .map(Answer::describe)
        .collect();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    assert_eq!(fresh, 1, "exactly one answer came from a fresh run");
    assert_eq!(fresh + replays + in_flight, 100);
    assert_eq!(work.executions(), 1, "the handler ran exactly once");
    let executions: Vec<u64> = answers
        .iter()
        .filter(|a| a.status == 201)
        .map(Answer::execution)
        .collect();
    assert!(
        executions.iter().all(|e| *e == 1),
        "every 201 is execution 1: {executions:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_slower_than_the_lease_keeps_its_claim_by_renewal() {
    // The store's clock is moved by hand, by less than a lease each time and only once a
    // renewal has been seen: the key outlives its first lease by renewal alone, and a busy
    // machine cannot make it lapse early.
    let clock = tower_idempotency::store::clock::ManualClock::new();
    let store = SpyStore::over(
        tower_idempotency::MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store"),
    );
    let lease = Duration::from_millis(300);
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store.clone())
            .lease(lease)
            .build(),
    );
    let (server, work) = server_with(layer).await;
    let request = || server.post("/work", BODY).principal("alice").key("slow");
    let first = tokio::spawn(send(request().delay_ms(3_000)));
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 1).await,
        "the first request reached the handler"
    );
    for step in 1..=3 {
        let renewed = store.renews();
        assert!(
            eventually(Duration::from_secs(5), || store.renews() > renewed).await,
            "the lease is renewed while the handler runs"
        );
        clock.advance(lease * 2 / 3);
        let dup = send(request()).await;
        dup.assert_problem(409, "idempotency.in_flight");
        assert_eq!(
            work.executions(),
            1,
            "the repeat after {step} steps ({:?} on the store's clock, lease {lease:?}) did not start a second execution",
            lease * 2 / 3 * step
        );
    }
    let first = bounded(Duration::from_secs(10), "the slow request", first)
        .await
        .expect("the slow request task");
    assert_eq!(first.status, 201, "{}", first.describe());
    assert!(!first.is_replay());
    assert!(
        store.renews() >= 2,
        "the lease was renewed while the handler ran ({} renewals)",
        store.renews()
    );
    let replay = send(request()).await;
    assert!(replay.is_replay(), "{}", replay.describe());
    assert_eq!(replay.execution(), 1);
    assert_eq!(work.executions(), 1, "one execution in total");
}

/// A POST written by hand, so the test decides exactly when the connection goes away.
fn raw_post(key: &str, delay_ms: u64) -> String {
    format!(
        "POST /work HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         x-principal: alice\r\nidempotency-key: {key}\r\nx-delay-ms: {delay_ms}\r\n\
         content-length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_run_to_completion_a_dropped_client_leaves_the_key_pending_until_the_lease_lapses()
{
    // The store's clock is moved by hand: a busy machine cannot make the lease lapse early.
    let clock = tower_idempotency::store::clock::ManualClock::new();
    let store = tower_idempotency::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("a valid store");
    let layer = IdempotencyLayer::new(SpyStore::over(store)).run_to_completion(false);
    let lease = layer.engine().lease();
    let (server, work) = server_with(layer).await;

    let mut conn = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect to the test server");
    conn.write_all(raw_post("gone", 5_000).as_bytes())
        .await
        .expect("write the request");
    assert!(
        eventually(Duration::from_secs(5), || work.executions() == 1).await,
        "the request reached the handler"
    );
    drop(conn);
    assert!(
        eventually(Duration::from_secs(5), || work.cancelled() == 1).await,
        "the server dropped the handler when its client went away"
    );

    let request = || server.post("/work", BODY).principal("alice").key("gone");
    let right_after = send(request()).await;
    right_after.assert_problem(409, "idempotency.in_flight");
    clock.advance(lease - Duration::from_millis(1));
    send(request())
        .await
        .assert_problem(409, "idempotency.in_flight");

    clock.advance(Duration::from_millis(2));
    let after_lease = send(request()).await;
    assert_eq!(after_lease.status, 201, "{}", after_lease.describe());
    assert!(
        !after_lease.is_replay(),
        "the work runs again after the lease"
    );
    assert_eq!(work.executions(), 2);
}
