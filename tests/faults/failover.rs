//! A duplicate storm over Redis Sentinel while the primary is killed (`kill -9`), the replica
//! promoted, and the old primary restarted (it rejoins as a replica); and the same storm
//! while one application process is cut off from a standalone Redis for 3 s. Two stores
//! stand for two application processes; each has four clients sending every key three times.
//!
//! Counted: executions, completed records acknowledged and then lost (a later run of the same
//! key, or no replay at the end), failed steps, and the time until fresh requests succeed
//! again. With `wait_for_replicas(1, ..)` no acknowledged record may be lost (asserted; runs
//! in CI); without it the figures are printed (`#[ignore]`d: run by hand, see each test).
#![cfg(all(feature = "redis-sentinel", feature = "test-util"))]
#![allow(clippy::unwrap_used)]

use crate::support::proxy::Proxy;
use crate::support::redis_sentinel::{self, SERVICE, SentinelSet};
use crate::support::redis_server::RedisServer;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower_idempotency::IdempotencyKey;
use tower_idempotency::conformance::fingerprint;
use tower_idempotency::engine::{Begin, Engine, RecordedResponse, Scope};
use tower_idempotency::store::redis::RedisStore;
use tower_idempotency::store::{StoreError, StoreKey};

const KEYS: usize = 300;
const CLIENTS_PER_APP: usize = 4;
const PASSES: usize = 3;
/// The `WAIT` bound: short beside the 500 ms operation timeout (see `wait_for_replicas`).
const WAIT_MS: u64 = 50;

fn response() -> RecordedResponse {
    RecordedResponse::new(201, vec![], Some(Bytes::from_static(b"{\"id\":1}")))
}

#[derive(Default)]
struct Tally {
    executions: Vec<AtomicU32>,
    acknowledged: Vec<AtomicBool>,
    /// Runs of a key whose record had been acknowledged: a lost record.
    ran_after_ack: AtomicU32,
    failed_claims: AtomicU32,
    failed_completes: AtomicU32,
    /// Milliseconds from the start of the storm to the last failed claim.
    last_failure_ms: AtomicU64,
    /// Failed steps by step and error kind.
    kinds: Mutex<BTreeMap<String, u32>>,
}

impl Tally {
    fn failed(&self, step: &str, e: &StoreError) {
        let mut kinds = self.kinds.lock().unwrap();
        *kinds.entry(format!("{step} {:?}", e.kind())).or_default() += 1;
    }
}

/// Printed (`Debug`) and partly asserted.
#[derive(Debug)]
#[allow(dead_code)]
struct Report {
    acknowledged: usize,
    executions: u32,
    keys_run_twice: usize,
    lost_records: u32,
    failed_claims: u32,
    failed_completes: u32,
    recovered_after: Duration,
    failures: BTreeMap<String, u32>,
}

/// How the replica keeps up when the primary dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replica {
    /// Replicating directly, on loopback: it is rarely behind.
    InStep,
    /// Replicating through the fault proxy, which stops forwarding (a partition) 300 ms
    /// before the kill and then drops what it held: the replica misses those writes.
    Behind,
}

async fn storm(wait_for_replicas: bool, replica: Replica) -> Report {
    let primary = RedisServer::start();
    let proxy = Proxy::start(primary.port()).await;
    let mut set = match replica {
        Replica::InStep => {
            let port = primary.port();
            SentinelSet::start_with(primary, port, 2000)
        }
        Replica::Behind => SentinelSet::start_with(primary, proxy.port(), 60_000),
    };
    let mut engines = Vec::new();
    for _ in 0..2 {
        let mut builder = RedisStore::builder("storm").timeout(Duration::from_millis(500));
        if wait_for_replicas {
            builder = builder.wait_for_replicas(1, Duration::from_millis(WAIT_MS));
        }
        let store = builder
            .connect_sentinel(set.urls(), SERVICE, None)
            .await
            .expect("connect through the sentinels");
        // A short lease: a key left pending by a failed complete is free again soon.
        engines.push(Engine::builder(store).lease(Duration::from_secs(2)).build());
    }
    let label = format!(
        "failover, wait_for_replicas {}, replica {replica:?}",
        if wait_for_replicas { "on" } else { "off" }
    );
    drive(engines, &label, async move {
        if replica == Replica::Behind {
            proxy.black_hole();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        set.primary().stop();
        proxy.drop_all();
        tokio::task::block_in_place(|| {
            set.wait_for_promotion();
            // Back, empty (no persistence): the sentinels make it a replica of the new primary.
            set.primary().restart();
        });
        (set, proxy)
    })
    .await
}

/// One application process (one store) cut off from Redis for 3 s by the fault proxy (a
/// partition TCP has not given up on), then healed; the other keeps its direct connection.
async fn partition_storm() -> Report {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port()).await;
    let mut engines = Vec::new();
    for url in [proxy.url(), server.url()] {
        let store = RedisStore::builder("storm")
            .timeout(Duration::from_millis(500))
            .connect(&url)
            .await
            .expect("connect");
        engines.push(Engine::builder(store).lease(Duration::from_secs(2)).build());
    }
    drive(engines, "partition of one app for 3 s", async move {
        proxy.black_hole();
        tokio::time::sleep(Duration::from_secs(3)).await;
        proxy.restore();
        (server, proxy)
    })
    .await
}

/// Runs the storm on `engines` (clients alternate between them), injects `fault` once a
/// third of the keys are acknowledged, and counts. What `fault` returns (the servers) lives
/// until the counting is done.
async fn drive<K>(
    engines: Vec<Engine<RedisStore>>,
    label: &str,
    fault: impl Future<Output = K>,
) -> Report {
    let scope = Scope::principal("storm");
    let keys: Arc<Vec<StoreKey>> = Arc::new(
        (0..KEYS)
            .map(|i| {
                StoreKey::derive(
                    "storm",
                    &scope,
                    &IdempotencyKey::new(&format!("k{i}")).unwrap(),
                )
            })
            .collect(),
    );
    let tally = Arc::new(Tally {
        executions: (0..KEYS).map(|_| AtomicU32::new(0)).collect(),
        acknowledged: (0..KEYS).map(|_| AtomicBool::new(false)).collect(),
        ..Tally::default()
    });
    let started = Instant::now();
    let clients: Vec<_> = (0..2 * CLIENTS_PER_APP)
        .map(|c| {
            let engine = engines[c % 2].clone();
            let (keys, tally) = (Arc::clone(&keys), Arc::clone(&tally));
            tokio::spawn(async move {
                let fp = fingerprint("storm");
                let offset = c * KEYS / (2 * CLIENTS_PER_APP);
                for n in 0..PASSES * KEYS {
                    let k = (offset + n) % KEYS;
                    match engine.begin(keys[k], fp).await {
                        Ok(Begin::Run(t)) => {
                            if tally.acknowledged[k].load(Ordering::SeqCst) {
                                tally.ran_after_ack.fetch_add(1, Ordering::SeqCst);
                            }
                            tally.executions[k].fetch_add(1, Ordering::SeqCst);
                            tokio::task::yield_now().await; // the work
                            match engine.complete(t, &response()).await {
                                Ok(true) => tally.acknowledged[k].store(true, Ordering::SeqCst),
                                Ok(false) => {}
                                Err(e) => {
                                    tally.failed("complete", &e);
                                    tally.failed_completes.fetch_add(1, Ordering::SeqCst);
                                }
                            }
                        }
                        Ok(_) => {}
                        Err(e) => {
                            tally.failed("claim", &e);
                            tally.failed_claims.fetch_add(1, Ordering::SeqCst);
                            let ms = u64::try_from(started.elapsed().as_millis()).unwrap();
                            tally.last_failure_ms.fetch_max(ms, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
            })
        })
        .collect();

    // Kill the primary once a third of the keys are acknowledged.
    let deadline = Instant::now() + Duration::from_secs(30);
    while tally
        .acknowledged
        .iter()
        .filter(|a| a.load(Ordering::SeqCst))
        .count()
        < KEYS / 3
    {
        assert!(Instant::now() < deadline, "the storm made no progress");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed = started.elapsed();
    let servers = fault.await;
    for c in clients {
        tokio::time::timeout(Duration::from_secs(120), c)
            .await
            .expect("the storm ends")
            .unwrap();
    }

    // Every acknowledged record must still answer.
    let fp = fingerprint("storm");
    let mut lost = tally.ran_after_ack.load(Ordering::SeqCst);
    let mut acknowledged = 0;
    for (k, key) in keys.iter().enumerate() {
        if !tally.acknowledged[k].load(Ordering::SeqCst) {
            continue;
        }
        acknowledged += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match engines[0].begin(*key, fp).await {
                Ok(Begin::Replayed(_)) => break,
                Ok(Begin::Run(_)) => {
                    lost += 1;
                    break;
                }
                Ok(other) => panic!("an acknowledged key answers {other:?}"),
                Err(e) => assert!(Instant::now() < deadline, "verification: {e:?}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let last_failure = Duration::from_millis(tally.last_failure_ms.load(Ordering::SeqCst));
    let report = Report {
        acknowledged,
        executions: tally
            .executions
            .iter()
            .map(|e| e.load(Ordering::SeqCst))
            .sum(),
        keys_run_twice: tally
            .executions
            .iter()
            .filter(|e| e.load(Ordering::SeqCst) > 1)
            .count(),
        lost_records: lost,
        failed_claims: tally.failed_claims.load(Ordering::SeqCst),
        failed_completes: tally.failed_completes.load(Ordering::SeqCst),
        recovered_after: last_failure.saturating_sub(killed),
        failures: tally.kinds.lock().unwrap().clone(),
    };
    eprintln!(
        "storm, {label}: {report:?} ({KEYS} keys, 2 apps x {CLIENTS_PER_APP} clients, {PASSES} \
         passes; fault at {killed:?})"
    );
    drop(servers);
    report
}

/// A partition of one application process from Redis: nothing acknowledged is lost, and the
/// figures are printed. Run with `cargo test -p tower-idempotency --all-features --test
/// faults -- --ignored partition_storm_figures --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures, printed: run by hand"]
async fn partition_storm_figures() {
    if !crate::support::redis_server::available() {
        return;
    }
    let report = partition_storm().await;
    assert_eq!(report.lost_records, 0, "{report:?}");
    assert!(report.acknowledged >= KEYS / 3, "{report:?}");
}

/// Runs in CI: with the option on, a primary killed mid-storm while its replica is 300 ms
/// behind loses no acknowledged record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_mid_storm_loses_no_acknowledged_record_with_wait_for_replicas() {
    if !redis_sentinel::available() {
        return;
    }
    let report = storm(true, Replica::Behind).await;
    assert_eq!(report.lost_records, 0, "{report:?}");
    assert!(report.acknowledged >= KEYS / 3, "{report:?}");
}

/// The same storm with the option off, and both with a replica in step: the figures,
/// printed. Run with `cargo test -p tower-idempotency --all-features --test faults --
/// --ignored failover_storm_figures --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "figures, printed: run by hand"]
async fn failover_storm_figures() {
    if !redis_sentinel::available() {
        return;
    }
    for (wait, replica) in [
        (false, Replica::Behind),
        (false, Replica::InStep),
        (true, Replica::InStep),
    ] {
        let report = storm(wait, replica).await;
        assert!(report.acknowledged >= KEYS / 3, "{report:?}");
        if wait {
            assert_eq!(report.lost_records, 0, "{report:?}");
        }
    }
}
