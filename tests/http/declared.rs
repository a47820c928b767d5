//! The outcome a handler declares: a `Verdict` in the response's
//! extensions wins over the classification by status. On the memory store and on Redis.

use crate::support;

use std::time::{Duration, Instant};
use support::http::{RequestExt, TestServer, Work, send};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::engine::{Engine, Verdict};
use tower_idempotency::store::Store;
use tower_idempotency::store::clock::ManualClock;

const BODY: &str = r#"{"item":"book"}"#;
/// How the lease of a held key lapses in a test.
enum Lapse {
    /// The memory store's clock, moved by hand (the default lease).
    Manual(ManualClock),
    /// Real time (Redis keeps its own): a lease short enough to wait out, long enough for a
    /// retry well inside it on a loaded machine.
    Real(Duration),
}

fn request(server: &TestServer, key: &str, status: u16, declare: &str) -> reqwest::RequestBuilder {
    server
        .post("/work", BODY)
        .principal("alice")
        .key(key)
        .respond(status)
        .header("x-declare", declare)
}

/// Every declaration, through the layer over `store`.
async fn declarations_are_followed<St: Store>(store: St, lapse: Lapse) {
    // A hook that would release everything: a declared answer is recorded all the same.
    let engine = match &lapse {
        Lapse::Real(lease) => Engine::builder(store).lease(*lease).build(),
        Lapse::Manual(_) => Engine::new(store),
    };
    let layer =
        IdempotencyLayer::new(engine).classify(|_: &http::response::Parts| Verdict::Release);
    let lease = layer.engine().lease();
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;

    // Declared: a 500 after an effect that cannot be undone is recorded and replayed.
    let first = send(request(&server, "charged", 500, "record")).await;
    assert_eq!(first.status, 500, "{}", first.describe());
    assert!(!first.is_replay());
    let retry = send(request(&server, "charged", 500, "record")).await;
    assert_eq!(retry.status, 500, "{}", retry.describe());
    assert!(
        retry.is_replay(),
        "a declared 500 is replayed: {}",
        retry.describe()
    );
    assert_eq!(
        retry.execution(),
        first.execution(),
        "the first run's answer"
    );
    assert_eq!(work.runs_of("charged"), 1, "the handler ran once");

    // Not started: a 201 is released; the retry runs again.
    let first = send(request(&server, "dry-run", 201, "not-started")).await;
    assert_eq!(first.status, 201);
    let retry = send(request(&server, "dry-run", 201, "not-started")).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert!(
        !retry.is_replay(),
        "a declared not-started answer is never replayed"
    );
    assert_eq!(work.runs_of("dry-run"), 2);

    // Ambiguous: the key stays pending until its lease lapses, then the work runs again.
    let first = send(request(&server, "unsure", 201, "ambiguous")).await;
    let answered = Instant::now();
    assert_eq!(first.status, 201);
    let retry = send(request(&server, "unsure", 201, "ambiguous")).await;
    if let Lapse::Real(_) = lapse {
        assert!(
            answered.elapsed() < lease / 2,
            "the retry ran well within the lease ({:?}); the machine is too slow for this test",
            answered.elapsed()
        );
    }
    retry.assert_problem(409, "idempotency.in_flight");
    assert_eq!(
        work.runs_of("unsure"),
        1,
        "neither replayed nor run at once"
    );
    match &lapse {
        Lapse::Manual(clock) => clock.advance(lease + Duration::from_millis(1)),
        Lapse::Real(_) => {
            tokio::time::sleep_until((answered + lease + Duration::from_millis(300)).into()).await;
        }
    }
    let later = send(request(&server, "unsure", 201, "")).await;
    assert_eq!(later.status, 201, "{}", later.describe());
    assert!(!later.is_replay(), "after the lease the work runs again");
    assert_eq!(work.runs_of("unsure"), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_outcomes_are_followed_on_memory() {
    let clock = ManualClock::new();
    let store = tower_idempotency::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("a valid store");
    declarations_are_followed(store, Lapse::Manual(clock)).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_outcomes_are_followed_on_redis() {
    // The memory store's expiry follows its clock; Redis's, real time.
    let Some(store) = support::stores::redis("declared").await else {
        return;
    };
    declarations_are_followed(store, Lapse::Real(Duration::from_secs(3))).await;
}

/// Without a marker, a 500 is released as ever (defaults unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_500_is_still_released() {
    let work = Work::new();
    let server = TestServer::start(work.app(IdempotencyLayer::default())).await;
    send(request(&server, "plain-500", 500, "")).await;
    let retry = send(request(&server, "plain-500", 500, "")).await;
    assert!(!retry.is_replay());
    assert_eq!(work.runs_of("plain-500"), 2);
}

/// A declared 304 is not a final answer a replay can give: released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_304_is_released() {
    let work = Work::new();
    let server = TestServer::start(work.app(IdempotencyLayer::default())).await;
    send(request(&server, "nm", 304, "record")).await;
    send(request(&server, "nm", 304, "record")).await;
    assert_eq!(work.runs_of("nm"), 2);
}

/// The classification hook answers with any verdict: `Hold` keeps the key pending until its
/// lease lapses, `Fail` releases it as `Release` does, `Record` records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_verdict_of_the_hook_is_followed() {
    let clock = ManualClock::new();
    let store = tower_idempotency::MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("a valid store");
    let layer = IdempotencyLayer::new(store).classify(|res: &http::response::Parts| {
        match res.status.as_u16() {
            202 => Verdict::Hold,
            409 => Verdict::Fail,
            _ => Verdict::Record,
        }
    });
    let lease = layer.engine().lease();
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;

    let first = send(request(&server, "recorded", 201, "")).await;
    assert_eq!(first.status, 201, "{}", first.describe());
    let retry = send(request(&server, "recorded", 201, "")).await;
    assert!(
        retry.is_replay(),
        "`Record` is replayed: {}",
        retry.describe()
    );
    assert_eq!(work.runs_of("recorded"), 1);

    let first = send(request(&server, "failed", 409, "")).await;
    assert_eq!(first.status, 409, "{}", first.describe());
    let retry = send(request(&server, "failed", 409, "")).await;
    assert!(!retry.is_replay(), "`Fail` releases: {}", retry.describe());
    assert_eq!(work.runs_of("failed"), 2, "the retry ran again");

    let first = send(request(&server, "held", 202, "")).await;
    assert_eq!(first.status, 202, "{}", first.describe());
    let retry = send(request(&server, "held", 202, "")).await;
    retry.assert_problem(409, "idempotency.in_flight");
    assert_eq!(
        work.runs_of("held"),
        1,
        "`Hold`: neither replayed nor run at once"
    );
    clock.advance(lease + Duration::from_millis(1));
    let later = send(request(&server, "held", 202, "")).await;
    assert_eq!(later.status, 202, "{}", later.describe());
    assert!(!later.is_replay(), "after the lease the work runs again");
    assert_eq!(work.runs_of("held"), 2);
    server.stop().await;
}
