//! A repeat that waits for the first run instead of getting 409, and the
//! `Retry-After` of a 409 taken from the lease the first run has left. The memory store wakes
//! the waiter in process; Redis is polled (across processes: see `tests/e2e/waiting_redis.rs`).

use crate::support;

use std::time::{Duration, Instant};
use support::http::{RequestExt, SpyStore, TestServer, Work, send};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::store::Store;

const BODY: &str = r#"{"item":"book"}"#;

/// The first run (the handler sleeps `delay_ms`) and a repeat sent once it has started.
async fn first_and_duplicate(
    server: &TestServer,
    work: &Work,
    key: &str,
    delay_ms: u64,
) -> (support::http::Answer, support::http::Answer, Duration) {
    let first = tokio::spawn(send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key(key)
            .delay_ms(delay_ms),
    ));
    work.wait_runs(key, 1).await;
    let sent = Instant::now();
    let repeat = send(server.post("/work", BODY).principal("alice").key(key)).await;
    let waited = sent.elapsed();
    (first.await.expect("the first request"), repeat, waited)
}

async fn duplicate_waits_and_replays<St: Store>(store: St) {
    let layer = IdempotencyLayer::new(store).wait_in_flight(Duration::from_secs(10));
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let (first, repeat, _) = first_and_duplicate(&server, &work, "waits", 400).await;
    assert_eq!(first.status, 201);
    assert_eq!(repeat.status, 201, "{}", repeat.describe());
    assert!(
        repeat.is_replay(),
        "the repeat got the replay: {}",
        repeat.describe()
    );
    assert_eq!(repeat.execution(), first.execution());
    assert_eq!(work.executions(), 1, "no extra handler run");
}

// Once per store: `on_memory::…`, `on_redis::…`.
crate::support::stores::per_store!([on_memory: memory, on_redis: redis] {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_waiting_duplicate_gets_the_replay() {
        let Some(store) = store().await else {
            return;
        };
        duplicate_waits_and_replays(store).await;
    }
});

/// On memory the waiter is woken by the completion: one claim to find the key in flight,
/// one after the wake-up, none in between (no polling), however long the first run takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_store_wakes_the_waiter_without_polling() {
    let store = SpyStore::new();
    let layer = IdempotencyLayer::new(store.clone()).wait_in_flight(Duration::from_secs(10));
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let (_, repeat, waited) = first_and_duplicate(&server, &work, "woken", 800).await;
    assert!(repeat.is_replay(), "{}", repeat.describe());
    assert!(
        waited >= Duration::from_millis(300),
        "it waited for the first run ({waited:?})"
    );
    assert_eq!(
        store.claims(),
        3,
        "the first run's claim, the repeat's, and one more after the wake-up"
    );
}

/// A first run released (a 503) leaves the key free: the waiting repeat runs it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_runs_when_the_first_run_is_released() {
    let layer = IdempotencyLayer::default().wait_in_flight(Duration::from_secs(10));
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let first = tokio::spawn(send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("freed")
            .delay_ms(300)
            .respond(503),
    ));
    work.wait_runs("freed", 1).await;
    let repeat = send(server.post("/work", BODY).principal("alice").key("freed")).await;
    assert_eq!(first.await.expect("first").status, 503);
    assert_eq!(repeat.status, 201, "{}", repeat.describe());
    assert!(!repeat.is_replay());
    assert_eq!(work.executions(), 2);
}

/// Past the bound: 409, with a `Retry-After` from the lease left (not the 1 s constant), at
/// most a third of the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_bound_it_is_409_with_the_lease_left_as_retry_after() {
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(tower_idempotency::MemoryStore::new())
            .lease(Duration::from_secs(30))
            .build(),
    )
    .wait_in_flight(Duration::from_millis(300));
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    // The first run outlasts the bound by seconds, so a loaded machine still sees the bound end
    // the wait first.
    let (first, repeat, waited) = first_and_duplicate(&server, &work, "bounded", 5_000).await;
    repeat.assert_problem(409, "idempotency.in_flight");
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_millis(4_500),
        "the bound was honoured ({waited:?})"
    );
    let retry_after: u64 = repeat
        .retry_after()
        .expect("Retry-After on 409")
        .parse()
        .expect("seconds");
    assert_eq!(
        retry_after, 10,
        "the lease left of a 30 s lease renewed every 10 s, capped at one renewal period"
    );
    assert_eq!(first.status, 201);
    assert_eq!(work.executions(), 1, "no extra handler run");
}

/// The default (no wait): 409 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_wait_the_duplicate_gets_409_at_once() {
    let work = Work::new();
    let server = TestServer::start(work.app(IdempotencyLayer::default())).await;
    // A repeat that waited would be answered after the first run's 5 s, with its replay.
    let (_, repeat, waited) = first_and_duplicate(&server, &work, "now", 5_000).await;
    repeat.assert_problem(409, "idempotency.in_flight");
    assert!(
        waited < Duration::from_millis(4_000),
        "answered at once ({waited:?})"
    );
}

/// A first run that stopped renewing (declared ambiguous): the `Retry-After` of a 409 counts
/// down with its lease, to the moment the key is decided.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_retry_after_of_a_stalled_claim_is_the_lease_it_has_left() {
    use tower_idempotency::store::clock::ManualClock;
    let clock = ManualClock::new();
    let store = tower_idempotency::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("a valid store");
    let layer = IdempotencyLayer::new(
        tower_idempotency::engine::Engine::builder(store)
            .lease(Duration::from_secs(30))
            .build(),
    );
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let request = || {
        server
            .post("/work", BODY)
            .principal("alice")
            .key("stalled")
            .header("x-declare", "ambiguous")
    };
    assert_eq!(send(request()).await.status, 201);
    let at_once = send(request()).await;
    at_once.assert_problem(409, "idempotency.in_flight");
    assert_eq!(
        at_once.retry_after(),
        Some("10"),
        "capped at one renewal period"
    );
    clock.advance(Duration::from_millis(25_500));
    let later = send(request()).await;
    later.assert_problem(409, "idempotency.in_flight");
    assert_eq!(later.retry_after(), Some("5"), "the 4.5 s left, rounded up");
}
