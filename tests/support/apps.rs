//! Load for the storm, fault and end-to-end tests, over the app of [`super::http`]
//! ([`Work::per_key`] behind [`Work::user_app`]) or quickstart processes ([`Quickstart`]):
//!
//! - [`Mix`]: counts of each [`Kind`] of answer;
//! - [`run_jobs`]: many requests with a bounded number in flight;
//! - [`storm`]: repeats of many keys over several quickstart processes;
//! - [`env_or`], [`random_delay_ms`]: the sizes and handler delays of a storm.
//!
//! [`Work::per_key`]: super::http::Work::per_key
//! [`Work::user_app`]: super::http::Work::user_app

use super::http::{Answer, Kind, bounded, client, lock, send};
use super::quickstart::Quickstart;
use bytes::Bytes;
use serde_json::json;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Every request of these tests is bounded by this (a hang is a failure, not a stuck run).
pub(crate) const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// The environment variable `name` as a number, or `default`.
pub(crate) fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A random handler delay in 0..=20 ms.
pub(crate) fn random_delay_ms() -> u64 {
    let mut b = [0u8; 1];
    getrandom::fill(&mut b).expect("OS random source");
    u64::from(b[0] % 21)
}

// ---------------------------------------------------------------------------------------------
// Answers of many requests
// ---------------------------------------------------------------------------------------------

/// Counts of each kind of answer.
#[derive(Debug, Default, Clone)]
pub(crate) struct Mix(pub(crate) BTreeMap<Kind, usize>);

impl Mix {
    pub(crate) fn of<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Self {
        let mut m = BTreeMap::new();
        for a in answers {
            *m.entry(a.kind()).or_insert(0) += 1;
        }
        Self(m)
    }

    pub(crate) fn get(&self, k: &Kind) -> usize {
        self.0.get(k).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self) -> usize {
        self.0.values().sum()
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, n)| match k {
                Kind::Fresh => format!("201 fresh {n}"),
                Kind::Replay => format!("201 replay {n}"),
                Kind::InFlight => format!("409 in_flight {n}"),
                Kind::StoreFailed => format!("503 store_failed {n}"),
                Kind::Other(s, c) => format!("{s} {c} {n}"),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// Runs `jobs` requests with at most `workers` in flight, in job order (worker `w` takes the
/// next job when it is free), and returns the answers by job index.
pub(crate) async fn run_jobs<F, Fut>(jobs: usize, workers: usize, f: F) -> Vec<Answer>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let slots: Arc<Mutex<Vec<Option<Answer>>>> = Arc::new(Mutex::new(vec![None; jobs]));
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let (f, next, slots) = (Arc::clone(&f), Arc::clone(&next), Arc::clone(&slots));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    break;
                }
                let a = bounded(REQUEST_LIMIT, "a request", f(i)).await;
                lock(&slots)[i] = Some(a);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a request worker panicked");
    }
    let slots = std::mem::take(&mut *lock(&slots));
    slots
        .into_iter()
        .map(|a| a.expect("every job answered"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A duplicate storm over two quickstart processes
// ---------------------------------------------------------------------------------------------

/// What a storm over several processes observed.
#[derive(Debug)]
pub(crate) struct StormReport {
    pub(crate) requests: usize,
    pub(crate) took: Duration,
    /// Executions per process (`/stats` after minus before).
    pub(crate) executions: Vec<u64>,
    /// Fresh answers per key (how many times each key ran and answered).
    pub(crate) fresh_per_key: BTreeMap<u64, usize>,
    pub(crate) mix: Mix,
    pub(crate) max_request: Duration,
}

impl fmt::Display for StormReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests in {:.2?} ({:.0} req/s), max request {:.2?}; executions per process {:?} \
             (sum {}); fresh answers per key (answers -> keys) {:?}; answers: {}",
            self.requests,
            self.took,
            self.requests as f64 / self.took.as_secs_f64(),
            self.max_request,
            self.executions,
            self.executions.iter().sum::<u64>(),
            self.fresh_per_key,
            self.mix
        )
    }
}

/// Sends `dups` repeats of each of `keys` keys to `processes` (repeat `d` of a key to
/// process `d % processes.len()`), at most `workers` in flight, the repeats of a key
/// together; key `k`'s handler sleeps `delay(k)` ms. Checks that every answer is the original
/// 201, a replay with the original's body, or 409, and returns the figures for the caller's
/// assertions on executions.
pub(crate) async fn storm(
    processes: &[&Quickstart],
    keys: usize,
    dups: usize,
    workers: usize,
    delay: impl Fn(usize) -> u64,
) -> StormReport {
    let http = client();
    let mut before = Vec::new();
    for p in processes {
        before.push(p.executions().await);
    }
    let bases: Vec<String> = processes.iter().map(|p| p.base.clone()).collect();
    let delays: Vec<u64> = (0..keys).map(delay).collect();
    // A run tag keeps keys apart from other runs on the same Redis.
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).expect("OS random source");
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let started = Instant::now();
    let answers = {
        let (http, tag) = (http.clone(), tag.clone());
        run_jobs(keys * dups, workers, move |i| {
            let (k, d) = (i / dups, i % dups);
            let base = &bases[d % bases.len()];
            let req = http
                .post(format!("{base}/orders"))
                .header("authorization", format!("Bearer user-{}", k % 10))
                .header("idempotency-key", format!("storm-{tag}-{k}"))
                .json(&json!({ "item": "book", "n": k, "delay_ms": delays[k] }));
            send(req)
        })
        .await
    };
    let took = started.elapsed();
    let mut executions = Vec::new();
    for (p, b) in processes.iter().zip(before) {
        executions.push(p.executions().await - b);
    }
    let mut original: HashMap<usize, &Bytes> = HashMap::new();
    let mut fresh = vec![0usize; keys];
    for (i, a) in answers.iter().enumerate() {
        if a.kind() == Kind::Fresh {
            fresh[i / dups] += 1;
            original.insert(i / dups, &a.body);
        }
    }
    for (i, a) in answers.iter().enumerate() {
        match a.kind() {
            Kind::Fresh | Kind::InFlight => {}
            Kind::Replay => assert_eq!(
                Some(&&a.body),
                original.get(&(i / dups)),
                "a replay of key {} is its original: {}",
                i / dups,
                a.describe()
            ),
            other => panic!("unexpected answer {other:?}: {}", a.describe()),
        }
    }
    let mut fresh_per_key = BTreeMap::new();
    for n in fresh {
        *fresh_per_key.entry(n as u64).or_insert(0) += 1;
    }
    StormReport {
        requests: answers.len(),
        took,
        executions,
        fresh_per_key,
        mix: Mix::of(&answers),
        max_request: answers.iter().map(|a| a.elapsed).max().unwrap_or_default(),
    }
}
