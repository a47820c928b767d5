//! Store faults between the application and Redis, through the HTTP layer with `RedisStore`
//! (its default operation timeout, 1 s; a 5 s lease): a TCP proxy (`support/proxy.rs`) adds latency, drops every
//! connection, or black-holes the traffic, and is restored at run time.
//!
//! - a claim that times out or fails answers 503 `idempotency.store_failed` with `Retry-After`
//!   and the handler does not run;
//! - a complete lost to a fault still returns the handler's 201; the key stays pending (409)
//!   until its lease lapses, then runs exactly once more;
//! - after the fault clears the same store (same `ConnectionManager`) recovers by itself;
//! - a connection that goes half-open (silent, never failing) is replaced by the store after a
//!   run of timeouts, and keyed requests succeed again within a few seconds;
//! - no request takes longer than the store timeout per store step plus the handler's own time
//!   (plus a small slack for a debug build).
//!
//! ```text
//! TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 cargo test -p tower-idempotency --all-features --test faults -- proxy:: --nocapture
//! ```
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use support::apps::Mix;
use support::http::{Answer, Kind, TestServer, Work, bounded, send};
use support::proxy::Proxy;
use support::redis_server::{self, RedisServer};
use tower_idempotency::store::redis::redis::{self, aio::ConnectionManager};
use tower_idempotency::{IdempotencyLayer, RedisStore};

/// Timeouts in a row after which the Redis store replaces its connection (its docs say 2).
const RECONNECT_AFTER_TIMEOUTS: u32 = 2;
/// The store's default operation timeout, which these tests keep: a step on a healthy
/// loopback connection ends far inside it, and a latency over it (2 s) is over it by a second.
const TIMEOUT: Duration = Duration::from_secs(1);
/// Seconds past the timeout: a complete that timed out leaves seconds of lease to observe.
const LEASE: Duration = Duration::from_secs(5);
/// A latency over the timeout by a second.
const OVER_TIMEOUT: Duration = Duration::from_secs(2);
/// Scheduling slack for a debug build on a busy machine: seconds wide, so the bound catches a
/// request that hangs, never one that was merely scheduled late.
const SLACK: Duration = Duration::from_secs(2);

struct Rig {
    _redis: RedisServer,
    proxy: Proxy,
    work: Work,
    server: TestServer,
}

/// Redis, a proxy in front of it, and the app whose `RedisStore` connects through the proxy.
async fn rig() -> Option<Rig> {
    if !redis_server::available() {
        return None;
    }
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port()).await;
    let store = RedisStore::builder("faults-proxy")
        .connect(&proxy.url())
        .await
        .unwrap();
    let work = Work::per_key();
    let server = TestServer::start(
        work.user_app(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(store)
                .lease(LEASE)
                .build(),
        )),
    )
    .await;
    // One full run first, so the claim and complete scripts are loaded in Redis (a script's
    // first call answers NOSCRIPT and is sent again with SCRIPT LOAD; a step abandoned by its
    // timeout in between never loads it, which would blur what the faults below show).
    let warm = send(server.work("warm-up")).await;
    assert_eq!(warm.kind(), Kind::Fresh, "{}", warm.describe());
    Some(Rig {
        _redis: redis,
        proxy,
        work,
        server,
    })
}

impl Rig {
    /// `n` fresh keys at once; returns the answers.
    async fn burst(&self, tag: &str, n: usize) -> Vec<Answer> {
        let tasks: Vec<_> = (0..n)
            .map(|i| tokio::spawn(send(self.server.work(&format!("{tag}-{i}")))))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    /// Sends fresh keys until one answers 201 (bounded); returns how long it took.
    async fn recover(&self, tag: &str) -> Duration {
        let start = Instant::now();
        bounded(Duration::from_secs(30), "recovery after the fault", async {
            for i in 0.. {
                let a = send(self.server.work(&format!("{tag}-{i}"))).await;
                assert_bounded(&a, 2, Duration::ZERO);
                match a.kind() {
                    Kind::Fresh => break,
                    Kind::StoreFailed => tokio::time::sleep(Duration::from_millis(20)).await,
                    other => panic!("unexpected {other:?} while recovering: {}", a.describe()),
                }
            }
        })
        .await;
        start.elapsed()
    }
}

/// A request may take the store timeout per store step, plus the handler's time, plus slack.
fn assert_bounded(a: &Answer, steps: u32, handler: Duration) {
    let limit = TIMEOUT * steps + handler + SLACK;
    assert!(
        a.elapsed <= limit,
        "a request took {:?}, over {limit:?}: {}",
        a.elapsed,
        a.describe()
    );
}

fn max_elapsed<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Duration {
    answers
        .into_iter()
        .map(|a| a.elapsed)
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_that_fail_answer_503_without_running_the_handler_and_recover() {
    let Some(rig) = rig().await else { return };
    let mut all: Vec<Answer> = Vec::new();
    let mut report = Vec::new();

    // Latency under the timeout: slower, still correct.
    rig.proxy.set_latency(Duration::from_millis(40));
    let slow = rig.burst("slow", 10).await;
    assert!(
        slow.iter().all(|a| a.kind() == Kind::Fresh),
        "{}",
        Mix::of(&slow)
    );
    report.push(format!(
        "latency 40 ms: {} (max {:.2?})",
        Mix::of(&slow),
        max_elapsed(&slow)
    ));
    all.extend(slow);
    let runs_before = rig.work.executions();

    // Latency over the timeout: every claim times out; the handler never runs.
    rig.proxy.set_latency(OVER_TIMEOUT);
    let late = rig.burst("late", 10).await;
    for a in &late {
        assert_eq!(a.kind(), Kind::StoreFailed, "{}", a.describe());
        assert_bounded(a, 1, Duration::ZERO);
    }
    assert_eq!(
        rig.work.executions(),
        runs_before,
        "no handler ran on a timed-out claim"
    );
    report.push(format!(
        "latency {OVER_TIMEOUT:?}: {} (max {:.2?})",
        Mix::of(&late),
        max_elapsed(&late)
    ));
    all.extend(late);

    // A claim that timed out may still be delivered late by the proxy and applied by Redis:
    // such a key stays pending until its lease lapses (409), then runs exactly once. Whether it
    // is delivered depends on timing (the store replaces its connection after two timeouts in
    // a row, which can drop the queued claim), so both outcomes are allowed; either way the key
    // runs exactly once.
    rig.proxy.restore();
    let started = Instant::now();
    let mut seen = Mix::default();
    bounded(
        Duration::from_secs(30),
        "the late claims' leases to lapse",
        async {
            loop {
                let a = send(rig.server.work("late-0")).await;
                *seen.0.entry(a.kind()).or_insert(0) += 1;
                match a.kind() {
                    Kind::Fresh => break,
                    Kind::InFlight => tokio::time::sleep(Duration::from_millis(50)).await,
                    other => panic!("unexpected {other:?}: {}", a.describe()),
                }
            }
        },
    )
    .await;
    let replay = send(rig.server.work("late-0")).await;
    assert_eq!(replay.kind(), Kind::Replay);
    assert_eq!(rig.work.runs_of("late-0"), 1, "exactly one run");
    report.push(format!(
        "a key whose claim timed out under latency: {seen} until it ran once, after {:.2?}",
        started.elapsed()
    ));

    // Black hole: connections stay open, nothing comes back.
    let runs_before = rig.work.executions();
    rig.proxy.black_hole();
    let hole = rig.burst("hole", 10).await;
    for a in &hole {
        assert_eq!(a.kind(), Kind::StoreFailed, "{}", a.describe());
        assert_bounded(a, 1, Duration::ZERO);
    }
    // Connections dropped while the hole lasts: the reconnections are black-holed too.
    rig.proxy.drop_all();
    let dropped = rig.burst("hole-dropped", 10).await;
    for a in &dropped {
        assert_eq!(a.kind(), Kind::StoreFailed, "{}", a.describe());
        assert_bounded(a, 1, Duration::ZERO);
    }
    assert_eq!(
        rig.work.executions(),
        runs_before,
        "no handler ran on a failed claim"
    );
    report.push(format!(
        "black hole: {} (max {:.2?}); black hole + connections dropped: {} (max {:.2?})",
        Mix::of(&hole),
        max_elapsed(&hole),
        Mix::of(&dropped),
        max_elapsed(&dropped)
    ));
    all.extend(hole);
    all.extend(dropped);

    // Restored: the same store recovers by itself.
    rig.proxy.drop_all();
    rig.proxy.restore();
    let recovered = rig.recover("after-hole").await;
    report.push(format!("recovered after the black hole in {recovered:.2?}"));

    // Connections dropped with no other fault: at most a few 503s, never a run without a claim.
    let runs = rig.work.executions();
    rig.proxy.drop_all();
    let mut after_drop = Vec::new();
    for i in 0..10 {
        let a = send(rig.server.work(&format!("drop-{i}"))).await;
        assert!(
            matches!(a.kind(), Kind::Fresh | Kind::StoreFailed),
            "{}",
            a.describe()
        );
        assert_bounded(&a, 2, Duration::ZERO);
        after_drop.push(a);
    }
    let fresh = after_drop
        .iter()
        .filter(|a| a.kind() == Kind::Fresh)
        .count();
    assert_eq!(
        rig.work.executions() - runs,
        fresh,
        "runs only for 201 answers"
    );
    assert!(fresh > 0, "the store reconnected: {}", Mix::of(&after_drop));
    report.push(format!(
        "connections dropped: {} (max {:.2?})",
        Mix::of(&after_drop),
        max_elapsed(&after_drop)
    ));
    all.extend(after_drop);

    println!("store faults (timeout {TIMEOUT:?}, lease {LEASE:?}):");
    for r in &report {
        println!("  {r}");
    }
    println!(
        "  max request time {:.2?} over {} requests",
        max_elapsed(&all),
        all.len()
    );
}

/// The handler waits on a gate that opens once the black hole is in place: the claim went
/// through, and the complete meets the fault whatever the machine's load.
async fn run_into_a_fault(rig: &Rig, key: &str) -> Answer {
    let gate = format!("{key}-gate");
    let started = Instant::now();
    let a = tokio::spawn(send(rig.server.work(key).header("x-gate", gate.as_str())));
    rig.work.wait_runs(key, 1).await;
    rig.proxy.black_hole();
    let handler = started.elapsed();
    rig.work.open(&gate);
    let a = a.await.unwrap();
    assert_eq!(
        a.kind(),
        Kind::Fresh,
        "the handler's own answer: {}",
        a.describe()
    );
    assert_eq!(a.execution(), 1);
    // claim + complete (the complete times out), plus the handler.
    assert_bounded(&a, 2, handler);
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_complete_returns_the_response_and_leaves_the_key_pending_for_one_rerun() {
    let Some(rig) = rig().await else { return };
    let key = "lost-complete";
    let first = run_into_a_fault(&rig, key).await;
    let lost_at = Instant::now();
    // The held complete is lost with the connection; then the network is back.
    rig.proxy.drop_all();
    rig.proxy.restore();

    // During the lease: 409 (or 503 while the store reconnects), never a run.
    let mut during = Vec::new();
    let rerun = bounded(
        Duration::from_secs(30),
        "the re-run after the lease",
        async {
            loop {
                let a = send(rig.server.work(key)).await;
                assert_bounded(&a, 2, Duration::ZERO);
                match a.kind() {
                    Kind::InFlight | Kind::StoreFailed => {
                        during.push(a);
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Kind::Fresh => break a,
                    other => panic!("unexpected {other:?}: {}", a.describe()),
                }
            }
        },
    )
    .await;
    let rerun_after = lost_at.elapsed();
    let during_mix = Mix::of(&during);
    assert!(
        during_mix.get(&Kind::InFlight) > 0,
        "the key stayed pending during the lease: {during_mix}"
    );
    assert_eq!(rerun.execution(), 2, "one re-run");
    assert_ne!(rerun.body, first.body);

    // Ten more repeats at once: all replays of the re-run; no third run.
    let tasks: Vec<_> = (0..10)
        .map(|_| tokio::spawn(send(rig.server.work(key))))
        .collect();
    for t in tasks {
        let a = t.await.unwrap();
        assert_eq!(a.kind(), Kind::Replay, "{}", a.describe());
        assert_eq!(a.body, rerun.body);
    }
    assert_eq!(
        rig.work.runs_of(key),
        2,
        "exactly one re-run after the lease"
    );
    let max = max_elapsed(during.iter().chain([&first, &rerun]));
    println!(
        "lost complete: first answer 201 in {:.2?} (timeout {TIMEOUT:?}); \
         then {during_mix} for {rerun_after:.2?} (lease {LEASE:?}); then exactly one re-run \
         (201), 10 repeats replayed; max request {max:.2?}",
        first.elapsed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_delayed_by_a_healed_partition_is_stored_late() {
    let Some(rig) = rig().await else { return };
    let key = "healed-complete";
    let first = run_into_a_fault(&rig, key).await;
    // The partition heals without the connection being lost: the held complete arrives late.
    rig.proxy.restore();
    let a = bounded(
        Duration::from_secs(30),
        "the late complete to land",
        async {
            loop {
                let a = send(rig.server.work(key)).await;
                match a.kind() {
                    Kind::Replay => break a,
                    Kind::InFlight | Kind::StoreFailed => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    other => panic!("unexpected {other:?}: {}", a.describe()),
                }
            }
        },
    )
    .await;
    assert_eq!(a.body, first.body, "the replay is the first run's response");
    assert_eq!(rig.work.runs_of(key), 1, "no re-run");
    println!(
        "healed partition: the complete that timed out (201 after {:.2?}) was applied late; \
         repeats replay the first run, runs 1",
        first.elapsed
    );
}

/// The bound on a store's recovery from a half-open connection.
const HALF_OPEN_RECOVERY: Duration = Duration::from_secs(15);

/// Sends fresh keys `{tag}-{n}` one after another until one answers 201, within
/// [`HALF_OPEN_RECOVERY`]. Every answer before it must be a 503 within the store timeout.
/// Returns the answers (the last is the 201) and how long recovery took.
async fn until_fresh(rig: &Rig, tag: &str) -> (Vec<Answer>, Duration) {
    let start = Instant::now();
    let mut answers = Vec::new();
    bounded(
        HALF_OPEN_RECOVERY,
        "recovery from a half-open connection",
        async {
            loop {
                let a = send(rig.server.work(&format!("{tag}-{}", answers.len()))).await;
                assert_bounded(&a, 2, Duration::ZERO);
                let kind = a.kind();
                answers.push(a);
                match kind {
                    Kind::StoreFailed => {}
                    Kind::Fresh => break,
                    other => panic!(
                        "unexpected {other:?}: {}",
                        answers[answers.len() - 1].describe()
                    ),
                }
            }
        },
    )
    .await;
    (answers, start.elapsed())
}

/// After recovery: every key that got 503 runs exactly once when retried (its claim, held by
/// the silent connection, never reached Redis), the recovered key replays, and a burst of
/// fresh keys all answer 201. Returns the number of keys retried.
async fn keyed_requests_work_again(rig: &Rig, tag: &str, answers: &[Answer]) -> usize {
    let failed = answers.len() - 1;
    for i in 0..failed {
        let key = format!("{tag}-{i}");
        let a = send(rig.server.work(&key)).await;
        assert_eq!(a.kind(), Kind::Fresh, "retry of {key}: {}", a.describe());
        assert_eq!(rig.work.runs_of(&key), 1, "{key} ran once");
    }
    let recovered = format!("{tag}-{failed}");
    let replay = send(rig.server.work(&recovered)).await;
    assert_eq!(replay.kind(), Kind::Replay, "{}", replay.describe());
    assert_eq!(replay.body, answers[failed].body);
    let burst = rig.burst(&format!("{tag}-burst"), 10).await;
    assert!(
        burst.iter().all(|a| a.kind() == Kind::Fresh),
        "{}",
        Mix::of(&burst)
    );
    failed
}

/// The connection goes silent for good but stays open (half-open: the peer or a middlebox lost
/// its state and no reset arrives), while new connections work. `ConnectionManager` reconnects
/// on connection errors, never on timeouts, and the OS would error the socket only after its
/// retransmission timeout (about 15 minutes on Linux), or never behind a proxy. The store
/// replaces the connection itself after `RECONNECT_AFTER_TIMEOUTS` timeouts in a row. Safety
/// holds meanwhile (every request answers 503 within the timeout, no handler runs for it),
/// and keyed requests succeed again within [`HALF_OPEN_RECOVERY`] over a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_connection_fails_safe_and_is_replaced() {
    let Some(rig) = rig().await else { return };
    let runs = rig.work.executions();
    let connections = rig.proxy.accepted();
    rig.proxy.freeze_existing();
    let (answers, recovered_in) = until_fresh(&rig, "half-open").await;
    let mix = Mix::of(&answers);
    let failed = mix.get(&Kind::StoreFailed);
    assert!(
        failed >= RECONNECT_AFTER_TIMEOUTS as usize,
        "the silent connection timed out before it was replaced: {mix}"
    );
    assert_eq!(
        rig.work.executions() - runs,
        1,
        "runs only for the 201 answer"
    );
    let new_connections = rig.proxy.accepted() - connections;
    assert!(new_connections >= 1, "the store opened a new connection");
    let retried = keyed_requests_work_again(&rig, "half-open", &answers).await;
    println!(
        "half-open connection (timeout {TIMEOUT:?}): {mix} (max {:.2?}); replaced after \
         {RECONNECT_AFTER_TIMEOUTS} timeouts in a row: first 201 {} ms after the \
         connection went silent (bound {HALF_OPEN_RECOVERY:?}); new connections opened: \
         {new_connections}; then the {retried} keys that got 503 ran once each when retried, \
         the recovered key replayed, 10/10 fresh keys 201",
        max_elapsed(&answers),
        recovered_in.as_millis(),
    );
}

/// As above, but the first replacement cannot be made: the store keeps the silent connection,
/// starts counting again, and the next run of timeouts makes a second attempt, which succeeds.
/// The store is built over a connection with `RedisStoreBuilder::reconnect`, whose first call
/// fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_replacement_keeps_the_connection_and_is_tried_again() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let proxy = Proxy::start(redis.port()).await;
    let redis_client = redis::Client::open(proxy.url()).unwrap();
    let conn = ConnectionManager::new(redis_client.clone()).await.unwrap();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&attempts);
    let store = RedisStore::builder("faults-proxy-reconnect")
        .reconnect(move || {
            let first = counted.fetch_add(1, Ordering::SeqCst) == 0;
            let client = redis_client.clone();
            async move {
                if first {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
                }
                ConnectionManager::new(client).await
            }
        })
        .build(conn)
        .unwrap();
    let work = Work::per_key();
    let server = TestServer::start(
        work.user_app(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(store)
                .lease(LEASE)
                .build(),
        )),
    )
    .await;
    let warm = send(server.work("warm-up")).await;
    assert_eq!(warm.kind(), Kind::Fresh, "{}", warm.describe());
    let rig = Rig {
        _redis: redis,
        proxy,
        work,
        server,
    };

    rig.proxy.freeze_existing();
    let (answers, recovered_in) = until_fresh(&rig, "replace-fails").await;
    let mix = Mix::of(&answers);
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        2,
        "one failed replacement, then one that worked: {mix}"
    );
    assert!(
        mix.get(&Kind::StoreFailed) >= 2 * RECONNECT_AFTER_TIMEOUTS as usize,
        "a run of timeouts before each attempt: {mix}"
    );
    let retried = keyed_requests_work_again(&rig, "replace-fails", &answers).await;
    println!(
        "half-open connection, first replacement failing: {mix} (max {:.2?}); recovered on the \
         second attempt, first 201 {} ms after the connection went silent; the \
         {retried} keys that got 503 ran once each when retried",
        max_elapsed(&answers),
        recovered_in.as_millis(),
    );
}
