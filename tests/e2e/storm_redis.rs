//! Duplicate storm on the Redis store: two quickstart processes (the built example, with
//! `REDIS_URL`) sharing one `redis-server`, the repeats of each key split over both, the
//! handler sleeping a random 0–20 ms. Every key must run exactly once over both processes, and
//! every answer must be the original 201, a replay of it, or a 409.
//!
//! Size: `STORM_KEYS` (default 500) × `STORM_DUPLICATES` (default 20), a few seconds in a
//! debug build. The full size, 1 000 × 50 (50 000 requests), takes 25–40 s in a debug
//! build on two cores, too long for every test run; run it with
//!
//! ```text
//! STORM_KEYS=1000 STORM_DUPLICATES=50 cargo test --features redis --test e2e -- storm_redis:: --nocapture
//! ```
//!
//! Without `redis-server` on `PATH` the test prints a notice and passes, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support;

use support::apps::{env_or, random_delay_ms, storm};
use support::http::Kind;
use support::quickstart::Quickstart;
use support::redis_server::{self, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_storm_over_two_processes_runs_every_key_exactly_once() {
    if !redis_server::available() {
        return;
    }
    let keys = env_or("STORM_KEYS", 500);
    let dups = env_or("STORM_DUPLICATES", 20);
    let redis = RedisServer::start();
    let a = Quickstart::start(&redis.url()).await;
    let b = Quickstart::start(&redis.url()).await;

    let workers = (dups * 4).clamp(2, 256);
    let report = storm(&[&a, &b], keys, dups, workers, |_| random_delay_ms()).await;
    println!(
        "redis storm, two processes, {keys} keys x {dups} repeats, {workers} in flight: {report}"
    );

    assert_eq!(
        report.executions.iter().sum::<u64>(),
        keys as u64,
        "each key ran once over both processes"
    );
    assert_eq!(
        report.fresh_per_key.get(&1).copied(),
        Some(keys),
        "each key answered fresh exactly once: {:?}",
        report.fresh_per_key
    );
    assert_eq!(report.mix.get(&Kind::Fresh), keys);
    assert_eq!(
        report.mix.get(&Kind::Fresh)
            + report.mix.get(&Kind::Replay)
            + report.mix.get(&Kind::InFlight),
        keys * dups
    );
}
