//! Work that finishes when the client goes away: once a key is claimed, the
//! handler runs to its end and its outcome is recorded whether or not the client still
//! listens; the retry is answered from the record. On the memory store and on Redis.

use crate::support;

use std::time::Duration;
use support::http::{RequestExt, Work, send, server_with};
use tokio::io::AsyncWriteExt;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency::store::Store;

const BODY: &str = r#"{"item":"book"}"#;

/// A POST written by hand, so the test decides exactly when the connection goes away.
fn raw_post(key: &str, delay_ms: u64) -> String {
    format!(
        "POST /work HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
         x-principal: alice\r\nidempotency-key: {key}\r\nx-delay-ms: {delay_ms}\r\n\
         content-length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
}

/// Sends the request of `key` on a connection of its own, waits until the handler has
/// started, and closes the connection while the handler sleeps.
async fn leave_mid_handler(addr: std::net::SocketAddr, work: &Work, key: &str) {
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the test server");
    conn.write_all(raw_post(key, 400).as_bytes())
        .await
        .expect("write the request");
    work.wait_runs(key, 1).await;
    drop(conn);
}

/// The client leaves while the handler sleeps: the handler finishes, the record is written,
/// the retry replays it, and the handler ran once.
async fn finishes_and_replays<St: Store>(layer: IdempotencyLayer<St>) {
    let in_flight = layer.drain();
    let (server, work) = server_with(layer).await;
    leave_mid_handler(server.addr(), &work, "gone").await;
    assert!(
        in_flight.wait(Duration::from_secs(10)).await,
        "the abandoned work finished within the bound ({} still running)",
        in_flight.len()
    );
    assert_eq!(work.finished(), 1, "the handler ran to its end");
    assert_eq!(work.cancelled(), 0, "the handler was not cut short");

    let retry = send(server.post("/work", BODY).principal("alice").key("gone")).await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert!(
        retry.is_replay(),
        "the retry is answered from the record: {}",
        retry.describe()
    );
    assert_eq!(retry.execution(), 1, "the replay is the first run's answer");
    assert_eq!(work.executions(), 1, "the handler ran once");
}

// Once per store: `on_memory::…`, `on_redis::…`.
crate::support::stores::per_store!([on_memory: memory, on_redis: redis] {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn client_going_away_mid_handler_still_records() {
        let Some(store) = store().await else {
            return;
        };
        finishes_and_replays(IdempotencyLayer::new(store)).await;
    }
});

/// A released outcome is released after the client left too: the retry runs again at once
/// (no 409 until the lease lapses).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_outcome_is_released_after_the_client_left() {
    let layer = IdempotencyLayer::default();
    let in_flight = layer.drain();
    let (server, work) = server_with(layer).await;
    let mut conn = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect to the test server");
    let raw = raw_post("gone-503", 300).replace("x-delay-ms", "x-status: 503\r\nx-delay-ms");
    conn.write_all(raw.as_bytes())
        .await
        .expect("write the request");
    work.wait_runs("gone-503", 1).await;
    drop(conn);
    assert!(
        in_flight.wait(Duration::from_secs(10)).await,
        "the work finished"
    );

    let retry = send(
        server
            .post("/work", BODY)
            .principal("alice")
            .key("gone-503"),
    )
    .await;
    assert_eq!(
        retry.status,
        201,
        "the retry runs at once: {}",
        retry.describe()
    );
    assert!(!retry.is_replay());
    assert_eq!(work.executions(), 2);
}

/// The shutdown wait is bounded: work longer than the bound is reported unfinished, and goes
/// on (it is not cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_wait_is_bounded() {
    let layer = IdempotencyLayer::default();
    let in_flight = layer.drain();
    let (server, work) = server_with(layer).await;
    let mut conn = tokio::net::TcpStream::connect(server.addr())
        .await
        .expect("connect to the test server");
    // Seconds longer than the short wait below, so a loaded machine still sees it unfinished.
    conn.write_all(raw_post("slow", 4_000).as_bytes())
        .await
        .expect("write the request");
    work.wait_runs("slow", 1).await;
    drop(conn);
    assert!(
        !in_flight.wait(Duration::from_millis(100)).await,
        "a bound shorter than the work ends the wait first"
    );
    assert_eq!(in_flight.len(), 1, "one claimed request still running");
    assert!(
        in_flight.wait(Duration::from_secs(10)).await,
        "then it finishes"
    );
    assert_eq!(work.finished(), 1);
    assert!(in_flight.is_empty());
}
