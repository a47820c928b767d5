//! Duplicate storm on the memory store, in process over real TCP: many keys, each sent many
//! times at once, a handler that sleeps a random 0–20 ms. Every key must run exactly once, and
//! every answer must be the original 201, a replay of it, or a 409.
//!
//! Size: `STORM_KEYS` (default 1000) × `STORM_DUPLICATES` (default 50).
//!
//! ```text
//! cargo test --test e2e -- storm_memory:: --nocapture
//! ```
#![allow(clippy::unwrap_used)]

use crate::support;

use std::collections::HashMap;
use std::time::{Duration, Instant};
use support::apps::{Mix, env_or, random_delay_ms, run_jobs};
use support::http::{Kind, TestServer, Work, client, send};
use tower_idempotency::IdempotencyLayer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_storm_runs_every_key_exactly_once() {
    let keys = env_or("STORM_KEYS", 1000);
    let dups = env_or("STORM_DUPLICATES", 50);
    // Enough workers that the repeats of a few keys are all in flight together.
    let workers = (dups * 4).clamp(1, 256);

    let work = Work::per_key();
    let server = TestServer::start(work.user_app(IdempotencyLayer::default())).await;
    let http = client();
    // A random delay in 0..=20 ms, drawn once per key (every repeat of a key sleeps alike).
    let delays: Vec<u64> = (0..keys).map(|_| random_delay_ms()).collect();

    let started = Instant::now();
    let answers = {
        let (http, base) = (http.clone(), server.url("/work"));
        let delays = delays.clone();
        run_jobs(keys * dups, workers, move |i| {
            let k = i / dups;
            let req = http
                .post(&base)
                .header("idempotency-key", format!("storm-{k}"))
                // One principal per ten keys: many scopes, as many callers would be.
                .header("x-user", format!("user-{}", k / 10))
                .header("x-delay-ms", delays[k].to_string())
                .header("content-type", "application/json")
                .body(format!(r#"{{"item":"book","n":{k}}}"#));
            send(req)
        })
        .await
    };
    let took = started.elapsed();

    // Executions per key: exactly one each.
    let runs = work.runs();
    let mut histogram: HashMap<u64, usize> = HashMap::new();
    for k in 0..keys {
        *histogram
            .entry(runs.get(&format!("storm-{k}")).copied().unwrap_or(0))
            .or_insert(0) += 1;
    }
    let mix = Mix::of(&answers);
    let max_ms = answers.iter().map(|a| a.elapsed).max().unwrap_or_default();
    println!(
        "memory storm: {keys} keys x {dups} repeats = {} requests, {workers} in flight, \
         {took:.2?} ({:.0} req/s), max request {max_ms:.2?}",
        answers.len(),
        answers.len() as f64 / took.as_secs_f64()
    );
    println!("  executions per key (executions -> keys): {histogram:?}");
    println!("  answers: {mix}");

    assert_eq!(
        histogram.get(&1).copied(),
        Some(keys),
        "every key ran exactly once: {histogram:?}"
    );
    assert_eq!(work.executions(), keys);

    // Every answer is the original, a replay of it, or 409.
    let mut original: HashMap<usize, &[u8]> = HashMap::new();
    for (i, a) in answers.iter().enumerate() {
        if a.kind() == Kind::Fresh {
            assert!(
                original.insert(i / dups, &a.body).is_none(),
                "key {} answered fresh twice",
                i / dups
            );
        }
    }
    assert_eq!(original.len(), keys, "each key has one fresh answer");
    for (i, a) in answers.iter().enumerate() {
        match a.kind() {
            Kind::Fresh | Kind::InFlight => {}
            Kind::Replay => assert_eq!(
                &a.body[..],
                original[&(i / dups)],
                "a replay of key {} is its original",
                i / dups
            ),
            other => panic!("unexpected answer {other:?}: {}", a.describe()),
        }
    }
    assert_eq!(mix.get(&Kind::Fresh), keys);
    assert_eq!(
        mix.get(&Kind::Fresh) + mix.get(&Kind::Replay) + mix.get(&Kind::InFlight),
        keys * dups
    );
    assert!(took < Duration::from_secs(120), "the storm stays bounded");
}
