//! End to end over Redis: two quickstart processes (the built example, with
//! `REDIS_URL`) sharing one `redis-server`.
//!
//! - concurrent repeats of 200 keys, sent to both processes at once, run each key once;
//! - Redis killed while requests are in flight: 503 `idempotency.store_failed` with
//!   `Retry-After`, no panic, no run without a claim; Redis started again on the same port:
//!   keyed requests succeed again within a few seconds in the same processes.
//!
//! Without `redis-server` on `PATH` these tests print a notice and pass, unless
//! `TOWER_IDEMPOTENCY_REQUIRE_SERVERS` is set (as `scripts/test.sh` does).
//!
//! ```text
//! cargo test --features redis --test e2e -- redis:: --nocapture
//! ```
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support;

use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::apps::{Mix, storm};
use support::http::{Answer, Kind, client, try_send};
use support::quickstart::Quickstart;
use support::redis_server::{self, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_run_each_of_200_keys_once() {
    if !redis_server::available() {
        return;
    }
    let redis = RedisServer::start();
    let a = Quickstart::start(&redis.url()).await;
    let b = Quickstart::start(&redis.url()).await;

    // Each key 5 times to each process, all 10 in flight together; the handler sleeps 50 ms.
    let report = storm(&[&a, &b], 200, 10, 100, |_| 50).await;
    println!("two processes, 200 keys x (5 + 5): {report}");

    assert_eq!(
        report.executions.iter().sum::<u64>(),
        200,
        "each key ran once over both processes"
    );
    assert_eq!(
        report.fresh_per_key.get(&1).copied(),
        Some(200),
        "each key answered fresh exactly once"
    );
    assert!(
        report.executions.iter().all(|&e| e > 0),
        "both processes ran keys"
    );
    // Whether a storm repeat lands after its key completed depends on timing; a retry sent
    // to the other process after the first answer must be a replay, every time.
    let http = client();
    for k in 0..10 {
        let key = format!("cross-{}-{k}", std::process::id());
        let send = |base: &str| {
            http.post(format!("{base}/orders"))
                .header("authorization", "Bearer cross")
                .header("idempotency-key", key.clone())
                .json(&json!({ "item": "book" }))
        };
        let first = try_send(send(&a.base)).await.unwrap();
        let retry = try_send(send(&b.base)).await.unwrap();
        assert_eq!(first.kind(), Kind::Fresh, "{}", first.describe());
        assert_eq!(
            retry.kind(),
            Kind::Replay,
            "the other process replays: {}",
            retry.describe()
        );
        assert_eq!(retry.body, first.body, "the replay is the original");
    }
}

/// One answer of the outage load, with the process that gave it and when it was sent.
struct Sent {
    process: usize,
    at: Instant,
    answer: Answer,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_answers_503_and_recovers_in_the_same_processes() {
    if !redis_server::available() {
        return;
    }
    let mut redis = RedisServer::start();
    let mut processes = [
        Quickstart::start(&redis.url()).await,
        Quickstart::start(&redis.url()).await,
    ];
    let http = client();
    let mut before = Vec::new();
    for p in &processes {
        before.push(p.executions().await);
    }

    // Load: fresh keys, a 150 ms handler, 8 in flight per process, until told to stop.
    const DELAY_MS: u64 = 150;
    let stop = Arc::new(AtomicBool::new(false));
    let log: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let mut workers = Vec::new();
    for w in 0..16usize {
        let (stop, log, http) = (Arc::clone(&stop), Arc::clone(&log), http.clone());
        let process = w % 2;
        let base = processes[process].base.clone();
        workers.push(tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let at = Instant::now();
                let req = http
                    .post(format!("{base}/orders"))
                    .header("authorization", "Bearer outage")
                    .header("idempotency-key", format!("outage-{w}-{n}"))
                    .json(&json!({ "item": "book", "delay_ms": DELAY_MS }));
                let answer = try_send(req)
                    .await
                    .unwrap_or_else(|e| panic!("the process dropped a request: {e}"));
                let failed = answer.kind() == Kind::StoreFailed;
                log.lock().unwrap().push(Sent {
                    process,
                    at,
                    answer,
                });
                if failed {
                    // A client honouring Retry-After would wait a second; this one only
                    // paces itself so the outage is not a busy loop.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(700)).await;
    let kill_began = Instant::now();
    tokio::task::block_in_place(|| redis.stop());
    let killed = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let restart_began = Instant::now();
    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();

    // Recovery: the first fresh 201 of each process sent after the restart.
    let deadline = restarted + Duration::from_secs(15);
    let recovered = loop {
        let firsts: Vec<Option<Duration>> = (0..2)
            .map(|p| {
                log.lock()
                    .unwrap()
                    .iter()
                    .filter(|s| s.process == p && s.at >= restarted)
                    .filter(|s| s.answer.kind() == Kind::Fresh)
                    .map(|s| s.at + s.answer.elapsed - restarted)
                    .min()
            })
            .collect();
        if firsts.iter().all(Option::is_some) {
            break firsts.into_iter().map(Option::unwrap).collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "keyed requests did not succeed again within 15 s of the restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // A little more load after recovery, then stop.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.expect("a load worker panicked");
    }

    let log = std::mem::take(&mut *log.lock().unwrap());
    let answers: Vec<&Answer> = log.iter().map(|s| &s.answer).collect();
    let mix = Mix::of(answers.iter().copied());
    // Sent and answered while Redis was down.
    let during: Vec<&Sent> = log
        .iter()
        .filter(|s| s.at >= killed && s.at + s.answer.elapsed < restart_began)
        .collect();
    let during_mix = Mix::of(during.iter().map(|s| &s.answer));
    // Sent while Redis was down, answered after it was back (a claim may wait for the
    // reconnection, bounded by the store timeout, and then succeed).
    let across = Mix::of(
        log.iter()
            .filter(|s| s.at >= killed && s.at < restart_began)
            .filter(|s| s.at + s.answer.elapsed >= restart_began)
            .map(|s| &s.answer),
    );
    // In flight at the kill: sent before it, answered after it.
    let in_flight: Vec<&Sent> = log
        .iter()
        .filter(|s| s.at < kill_began && s.at + s.answer.elapsed > killed)
        .collect();
    let in_flight_mix = Mix::of(in_flight.iter().map(|s| &s.answer));
    let max_request = answers.iter().map(|a| a.elapsed).max().unwrap_or_default();
    let mut failed_times: Vec<Duration> = log
        .iter()
        .filter(|s| s.answer.kind() == Kind::StoreFailed)
        .map(|s| s.answer.elapsed)
        .collect();
    failed_times.sort();
    let failed_range = match (failed_times.first(), failed_times.last()) {
        (Some(lo), Some(hi)) => format!(
            "{lo:.0?}..{hi:.0?} (median {:.0?})",
            failed_times[failed_times.len() / 2]
        ),
        _ => "-".to_owned(),
    };
    // The first 201 after the restart, counting requests that waited across it.
    let first_success = log
        .iter()
        .filter(|s| s.answer.kind() == Kind::Fresh && s.at + s.answer.elapsed > restarted)
        .filter(|s| s.at >= killed)
        .map(|s| s.at + s.answer.elapsed - restarted)
        .min();
    // `OUTAGE_TIMELINE=1`: every request, sent at (ms from the kill) and how long it took.
    if std::env::var_os("OUTAGE_TIMELINE").is_some() {
        let mut lines: Vec<(f64, String)> = log
            .iter()
            .map(|s| {
                let off = if s.at >= killed {
                    (s.at - killed).as_secs_f64()
                } else {
                    -(killed - s.at).as_secs_f64()
                } * 1000.0;
                let line = format!(
                    "process {} sent {off:>7.0} ms, took {:>5.0?}: {:?}",
                    s.process,
                    s.answer.elapsed,
                    s.answer.kind()
                );
                (off, line)
            })
            .collect();
        lines.sort_by(|a, b| a.0.total_cmp(&b.0));
        for (_, l) in lines {
            println!("{l}");
        }
    }
    let mut executions = Vec::new();
    for (p, b) in processes.iter().zip(&before) {
        executions.push(p.executions().await - b);
    }
    println!(
        "redis outage: {} requests; answers {mix}; sent and answered during the outage: \
         {during_mix}; sent during the outage, answered after the restart: {across}; in \
         flight at the kill: {in_flight_mix}; executions per process {executions:?}; restart \
         took {:.2?}; first 201 after the restart: {:.2?} (requests that waited across it), per \
         process for requests sent after it {recovered:.2?}; 503 answer times {failed_range}; \
         max request {max_request:.2?}",
        log.len(),
        restarted - restart_began,
        first_success.unwrap_or_default(),
    );

    for s in &log {
        assert!(
            matches!(s.answer.kind(), Kind::Fresh | Kind::StoreFailed),
            "only 201 or 503 store_failed with Retry-After: {}",
            s.answer.describe()
        );
    }
    assert!(
        during_mix.get(&Kind::StoreFailed) > 0,
        "requests sent while Redis was down got 503: {during_mix}"
    );
    assert_eq!(
        during_mix.get(&Kind::Fresh),
        0,
        "nothing ran without a claim while Redis was down: {during_mix}"
    );
    assert_eq!(
        executions.iter().sum::<u64>(),
        mix.get(&Kind::Fresh) as u64,
        "executions happened only for 201 answers (never a run without a claim)"
    );
    for p in &mut processes {
        p.assert_healthy();
    }
    for r in recovered.iter().chain(&first_success) {
        assert!(*r < Duration::from_secs(10), "recovered in {r:?}");
    }
    // Bounded: store timeout (1 s) per step (claim, complete) plus the handler, plus slack.
    assert!(
        max_request < Duration::from_millis(2 * 1000 + DELAY_MS + 1500),
        "no request hung: max {max_request:?}"
    );
}
