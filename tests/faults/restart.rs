//! Redis restarted with data loss (`--save "" --appendonly no`, as every test server runs):
//! the documented behaviour is observed and nothing panics.
//!
//! - a completed key's record is gone: the next repeats run the work once more (one run for
//!   ten concurrent repeats), then replay that run;
//! - a request in flight across the restart completes into the empty Redis (the contract writes
//!   a record when nothing holds the key), so its repeats replay it;
//! - the same store (same `ConnectionManager`) reconnects by itself.
//!
//! ```text
//! cargo test --features redis --test faults -- restart:: --nocapture
//! ```
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::{Duration, Instant};
use support::apps::Mix;
use support::http::{Kind, TestServer, Work, bounded, send};
use support::redis_server::{self, RedisServer};
use tower_idempotency::{IdempotencyLayer, RedisStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_with_data_loss_runs_the_next_duplicate_once() {
    if !redis_server::available() {
        return;
    }
    let mut redis = RedisServer::start();
    // The default operation timeout (1 s): a healthy step ends far inside it.
    let store = RedisStore::builder("faults-restart")
        .connect(&redis.url())
        .await
        .unwrap();
    let work = Work::per_key();
    let server = TestServer::start(work.user_app(IdempotencyLayer::new(store))).await;

    // Before: one run, then replays.
    let first = send(server.work("done-before")).await;
    assert_eq!(first.kind(), Kind::Fresh);
    let again = send(server.work("done-before")).await;
    assert_eq!(again.kind(), Kind::Replay);
    assert_eq!(again.body, first.body);

    // A request whose handler runs across the restart.
    let across = tokio::spawn(send(server.work("in-flight").header("x-gate", "across")));
    work.wait_runs("in-flight", 1).await;

    let records_before = redis.command(&["DBSIZE"]);
    let began = Instant::now();
    tokio::task::block_in_place(|| redis.restart());
    let records_after = redis.command(&["DBSIZE"]);
    assert_eq!(records_after, "0", "the restarted Redis lost every record");

    // The store reconnects by itself: fresh keys succeed again.
    let mut probes = Vec::new();
    let reconnected = bounded(Duration::from_secs(10), "reconnecting", async {
        for i in 0.. {
            let a = send(server.work(&format!("probe-{i}"))).await;
            let kind = a.kind();
            probes.push(a);
            match kind {
                Kind::Fresh => break,
                Kind::StoreFailed => tokio::time::sleep(Duration::from_millis(20)).await,
                other => panic!("unexpected {other:?} while reconnecting"),
            }
        }
        began.elapsed()
    })
    .await;

    // The in-flight request completes into the empty Redis; its repeats replay it.
    work.open("across");
    let across = across.await.unwrap();
    assert_eq!(across.kind(), Kind::Fresh, "{}", across.describe());
    let replay = send(server.work("in-flight")).await;
    assert_eq!(replay.kind(), Kind::Replay, "{}", replay.describe());
    assert_eq!(replay.body, across.body);
    assert_eq!(work.runs_of("in-flight"), 1);

    // The lost record: ten concurrent repeats run the work exactly once more.
    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send(server.work("done-before").header("x-delay-ms", "100"))))
        .collect();
    let mut after = Vec::new();
    for t in tasks {
        after.push(t.await.unwrap());
    }
    let mix = Mix::of(&after);
    assert_eq!(mix.get(&Kind::Fresh), 1, "one re-run: {mix}");
    assert_eq!(
        mix.get(&Kind::Fresh) + mix.get(&Kind::InFlight) + mix.get(&Kind::Replay),
        10,
        "{mix}"
    );
    let rerun = after.iter().find(|a| a.kind() == Kind::Fresh).unwrap();
    assert_ne!(rerun.body, first.body, "the re-run is a new run");
    let later = send(server.work("done-before")).await;
    assert_eq!(later.kind(), Kind::Replay);
    assert_eq!(later.body, rerun.body, "then the re-run is replayed");
    assert_eq!(
        work.runs_of("done-before"),
        2,
        "exactly one run after the loss"
    );

    println!(
        "redis restart with data loss: records {records_before} -> {records_after}; reconnected \
         (first 201) {reconnected:.0?} after the restart began, probes {}; in-flight request \
         completed into the empty Redis and replays; lost key: 10 concurrent repeats -> \
         {mix}; runs of the lost key 2 (1 before, 1 after)",
        Mix::of(&probes)
    );
}
