//! A process killed mid-send, with the HTTP adapter's defaults (`HttpSendOnceLayer::new` over
//! `RedisStore::connect`, the engine's 60 s lease).
//!
//! The sender is this test binary run again as a child ([`sending_process`]): it sends a
//! charge through the door to a provider in the test process that counts each request and
//! never answers. Once the provider has the request, the child gets SIGKILL: the request went
//! out, and no receipt was recorded. The test process then retries with the same key, over a
//! connection of its own to the same Redis. The module docs promise: the dead sender's claim
//! holds the key until its lease lapses, a retry meanwhile is told so and sends nothing; once
//! the lease lapsed the retry sends again, forwarding the same key so that a provider that
//! de-duplicates can close that window; its receipt then replays.
//!
//! A real server's clock cannot be paused. The test reads the claim's remaining time from
//! Redis, then ends it there (`PEXPIRE`) instead of waiting the minute out.
//!
//! ```text
//! TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 cargo test -p tower-idempotency --all-features \
//!     --test outbound -- crash:: --nocapture
//! ```
#![cfg(all(feature = "redis", feature = "hyper-util"))]

use crate::http_calls::{Behave, Stub, charge, send};
use crate::support::child::{ChildProcess, START_LIMIT, setting};
use crate::support::redis_server::{self, RedisServer};
use std::time::{Duration, Instant};
use tower_idempotency::RedisStore;
use tower_idempotency::outbound::Delivery;
use tower_idempotency::outbound::http::HttpSendOnceLayer;

/// The child's settings: the store's URL and the provider's.
const CHILD_REDIS: &str = "OUTBOUND_CRASH_REDIS";
const CHILD_PROVIDER: &str = "OUTBOUND_CRASH_PROVIDER";
const CHILD_TEST: &str = "crash::sending_process";
const PREFIX: &str = "outbound-crash";
const KEY: &str = "charge-crash-1";
const BODY: &str = "{\"amount\":5}";
/// The engine's default lease.
const DEFAULT_LEASE: Duration = Duration::from_secs(60);

/// The sender, in a process of its own: one charge through the door with its defaults. The
/// provider never answers it; the parent kills this process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of a_sender_killed_mid_send_holds_the_key_for_its_lease_then_sends_once_more"]
async fn sending_process() {
    let (Some(redis), Some(provider)) = (setting(CHILD_REDIS), setting(CHILD_PROVIDER)) else {
        return;
    };
    let store = RedisStore::connect(&redis, PREFIX).await.unwrap();
    let layer = HttpSendOnceLayer::new(store);
    println!("SENDING");
    let delivery = send(&layer, charge(&provider, Some(KEY), BODY)).await;
    // Never reached while the provider holds the answer.
    println!("RETURNED {delivery:?}");
}

async fn wait_for(what: &str, limit: Duration, done: impl Fn() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_killed_mid_send_holds_the_key_for_its_lease_then_sends_once_more() {
    if !redis_server::available() {
        return;
    }
    let server = RedisServer::start();
    let provider = Stub::start(Behave::Stall).await;

    let mut child = ChildProcess::spawn(
        CHILD_TEST,
        &[
            (CHILD_REDIS, server.url()),
            (CHILD_PROVIDER, provider.url()),
        ],
    );
    child.line_after("SENDING", START_LIMIT).await;
    // The request went out whole: the provider read it. Then the crash, before any answer.
    wait_for("the provider has the request", START_LIMIT, || {
        provider.received() == 1
    })
    .await;
    let killed = Instant::now();
    child.kill().await;

    // Another process's door over the same Redis, with its defaults.
    let layer = HttpSendOnceLayer::new(RedisStore::connect(&server.url(), PREFIX).await.unwrap());
    provider.behave(Behave::Answer(201));
    let retry = send(&layer, charge(&provider.url(), Some(KEY), BODY))
        .await
        .unwrap();
    assert!(
        matches!(retry, Delivery::InFlight),
        "the dead sender's claim holds the key: {retry:?}"
    );
    assert_eq!(provider.received(), 1, "the retry sent nothing");

    // The claim is the only key the store holds, and it lapses with the default lease: held,
    // neither released by the crash nor kept for good. Seconds-wide: the kill came about when
    // the claim was made, and the child renewed it at most once.
    assert_eq!(server.command(&["DBSIZE"]), "1", "one key: the claim");
    let claim = server.command(&["RANDOMKEY"]);
    let left = Duration::from_millis(server.command(&["PTTL", &claim]).parse().unwrap());
    assert!(
        left <= DEFAULT_LEASE && left + killed.elapsed() + Duration::from_secs(25) > DEFAULT_LEASE,
        "the claim lapses within the default lease: {left:?} left"
    );

    // The lease lapses (moved forward on the server).
    server.command(&["PEXPIRE", &claim, "1"]);
    wait_for("the lapsed claim is gone", Duration::from_secs(10), || {
        server.command(&["DBSIZE"]) == "0"
    })
    .await;
    let after = send(&layer, charge(&provider.url(), Some(KEY), BODY))
        .await
        .unwrap();
    assert!(
        after.is_sent(),
        "once the lease lapsed, the retry sends: {after:?}"
    );
    assert_eq!(provider.received(), 2);
    assert_eq!(
        provider.keys(),
        vec![Some(KEY.to_owned()), Some(KEY.to_owned())],
        "both sends carried the key, for the provider to de-duplicate"
    );
    let again = send(&layer, charge(&provider.url(), Some(KEY), BODY))
        .await
        .unwrap();
    assert!(
        matches!(again, Delivery::Replayed(_)),
        "the receipt replays: {again:?}"
    );
    assert_eq!(provider.received(), 2, "nothing sent a third time");
}
