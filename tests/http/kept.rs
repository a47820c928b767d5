//! How long a record is kept, and how old a replay is (issue 18 §5): vendor-prefixed headers,
//! off by default. On the memory store and on Redis.

use crate::support;

use std::time::{Duration, SystemTime};
use support::http::{RequestExt, TestServer, Work, send};
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::store::Store;

const BODY: &str = r#"{"item":"book"}"#;
const TTL: Duration = Duration::from_secs(3600);

fn kept_until(a: &support::http::Answer) -> SystemTime {
    httpdate::parse_http_date(
        a.header("tower-idempotency-kept-until")
            .expect("kept-until"),
    )
    .expect("an HTTP-date")
}

async fn record_times<St: Store>(store: St) {
    let layer = IdempotencyLayer::with_store(store)
        .ttl(TTL)
        .record_times(true);
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    let request = || server.post("/work", BODY).principal("alice").key("timed");

    let before = SystemTime::now();
    let first = send(request()).await;
    let until = kept_until(&first);
    let expected = before + TTL;
    let off = until
        .duration_since(expected)
        .unwrap_or_else(|e| e.duration());
    assert!(
        off <= Duration::from_secs(2),
        "kept until now + ttl (off by {off:?})"
    );
    assert_eq!(
        first.header("tower-idempotency-age"),
        None,
        "a first run has no age"
    );

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let replay = send(request()).await;
    assert!(replay.is_replay());
    assert_eq!(kept_until(&replay), until, "the replay says the same");
    let age: u64 = replay
        .header("tower-idempotency-age")
        .expect("the replay's age")
        .parse()
        .expect("seconds");
    // At least the second slept; a loaded machine may add seconds.
    assert!(
        (1..=60).contains(&age),
        "the record is at least a second old ({age} s)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_times_are_sent_on_memory() {
    record_times(tower_idempotency::MemoryStore::new()).await;
}

#[cfg(feature = "redis")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_times_are_sent_on_redis() {
    use support::redis_server::{self, RedisServer};
    use tower_idempotency::store::redis::RedisStore;
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), "kept")
        .await
        .expect("connect to redis");
    record_times(store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_times_are_off_by_default() {
    let work = Work::new();
    let server = TestServer::start(work.app(IdempotencyLayer::new())).await;
    let request = || server.post("/work", BODY).principal("alice").key("plain");
    for answer in [send(request()).await, send(request()).await] {
        assert_eq!(answer.header("tower-idempotency-kept-until"), None);
        assert_eq!(answer.header("tower-idempotency-age"), None);
    }
}
