//! `RedisStore::builder(..).wait_for_replicas(n, timeout)` on a real primary and replica: a
//! complete returns once the replica holds the record, and fails with `NotReplicated` when
//! fewer replicas acknowledge in time; the HTTP layer still answers with the handler's
//! response. An `#[ignore]`d timing prints the cost of the option per complete.
#![cfg(feature = "redis")]
#![allow(clippy::unwrap_used)]

use crate::support::redis_server::{self, RedisServer, redis_key};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::conformance::{fingerprint, random_key, record};
use tower_idempotency::engine::{Begin, Engine, Recorded};
use tower_idempotency::http::RequestBody;
use tower_idempotency::store::redis::{RedisStore, redis};
use tower_idempotency::store::{Claim, StepId, StepRecorded, StoreErrorKind};
use tower_idempotency::{IdempotencyLayer, Principal, Store};

/// How long a complete waits for the replica's acknowledgement where the replica is attached:
/// seconds wide, as a busy machine may take longer than a fraction of one. Where the replica is
/// stopped, each complete takes this long to fail. A `WAIT` is bounded by a third of the
/// store's operation timeout, so these stores' is three times this.
const REPLICA_ACK: Duration = Duration::from_secs(3);

/// A primary and a replica in sync with it.
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start();
    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    wait_until("the replica in sync", || {
        replica
            .command(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    // The primary's side too: `ROLE` lists a replica once its sync is done, and the store counts
    // the replicas in sync from it.
    wait_until("the primary to count its replica online", || {
        primary
            .command(&["INFO", "replication"])
            .contains("state=online")
    });
    (primary, replica)
}

fn wait_until(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "waited 30 s for {what}");
        sleep(Duration::from_millis(50));
    }
}

fn response() -> Recorded {
    Recorded::new(201, vec![], Some(Bytes::from_static(b"{\"id\":1}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_waits_for_the_replica_and_fails_without_it() {
    if !redis_server::available() {
        return;
    }
    let (primary, mut replica) = primary_and_replica();
    let store = RedisStore::builder("replicas")
        .timeout(REPLICA_ACK * 3)
        .wait_for_replicas(1, REPLICA_ACK)
        .connect(&primary.url())
        .await
        .expect("connect");
    assert!(
        store.pipelining(),
        "connect pipelines: the pair goes through the outbox"
    );
    assert_eq!(store.wait_for_replicas(), Some((1, REPLICA_ACK)));
    let engine = Engine::new(store.clone());
    let fp = fingerprint("a");

    // With the replica attached: acknowledged, and the replica already holds the record.
    let key = random_key();
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("a fresh key runs")
    };
    assert!(engine.complete(ticket, &response()).await.unwrap());
    let name = redis_key(store.key_prefix(), &key);
    assert_eq!(
        replica.command(&["EXISTS", &name]),
        "1",
        "an acknowledged record is on the replica when complete returns"
    );

    // Replica gone: the write lands on the primary, but the complete fails with its own kind.
    replica.stop();
    let key = random_key();
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("a fresh key runs")
    };
    let err = engine
        .complete(ticket, &response())
        .await
        .expect_err("no replica acknowledges");
    assert_eq!(err.kind(), StoreErrorKind::NotReplicated, "{err:?}");
    assert!(err.is_retryable());
    assert_eq!(
        primary.command(&["EXISTS", &redis_key(store.key_prefix(), &key)]),
        "1",
        "the record is on the primary all the same"
    );
    assert!(
        matches!(engine.begin(key, fp).await.unwrap(), Begin::Replayed(r) if r == response()),
        "and the primary answers from it"
    );
}

/// A recorded step waits for the replica as a complete does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_step_waits_for_the_replica_and_fails_without_it() {
    if !redis_server::available() {
        return;
    }
    let (primary, mut replica) = primary_and_replica();
    let store = RedisStore::builder("replicas-steps")
        .timeout(REPLICA_ACK * 3)
        .wait_for_replicas(1, REPLICA_ACK)
        .connect(&primary.url())
        .await
        .expect("connect");
    let minute = Duration::from_secs(60);
    let key = random_key();
    let step = StepId::from_bytes([5; 32]);
    assert_eq!(
        store
            .record_step(&key, &step, Bytes::from_static(b"charged"), minute)
            .await
            .unwrap(),
        StepRecorded::Recorded
    );
    let name = format!("{}:s", redis_key(store.key_prefix(), &key));
    // The hash holds the steps and their retention.
    assert_eq!(
        replica.command(&["HLEN", &name]),
        "2",
        "an acknowledged step is on the replica when record_step returns"
    );

    replica.stop();
    let err = store
        .record_step(&key, &StepId::from_bytes([6; 32]), Bytes::new(), minute)
        .await
        .expect_err("no replica acknowledges");
    assert_eq!(err.kind(), StoreErrorKind::NotReplicated, "{err:?}");
    assert_eq!(
        primary.command(&["HLEN", &name]),
        "3",
        "the step is on the primary all the same"
    );
    assert_eq!(
        store
            .record_step(&key, &step, Bytes::from_static(b"again"), minute)
            .await
            .unwrap(),
        StepRecorded::Found(Bytes::from_static(b"charged")),
        "a step found wrote nothing: nothing to replicate"
    );
}

/// Without pipelining the write and `WAIT` go as a pipeline of their own; asking for more
/// replicas than there are fails each complete, and a complete that wrote nothing (its lease
/// was lost) waits for nothing.
#[tokio::test]
async fn more_replicas_than_attached_fail_and_a_lost_lease_waits_for_nothing() {
    if !redis_server::available() {
        return;
    }
    let (primary, _replica) = primary_and_replica();
    let conn = redis::Client::open(primary.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store = RedisStore::builder("replicas-direct")
        .wait_for_replicas(2, Duration::from_millis(100))
        .build(conn)
        .unwrap();
    assert!(!store.pipelining());
    let fp = fingerprint("a");
    // Twice: the first complete meets NOSCRIPT and loads the script, the second is the pair.
    for _ in 0..2 {
        let key = random_key();
        let Claim::Claimed(token) = store
            .claim(&key, &fp, Duration::from_secs(5))
            .await
            .unwrap()
        else {
            panic!("claims")
        };
        let err = store
            .complete(&key, &token, &fp, record("r"), Duration::from_secs(60))
            .await
            .expect_err("one replica is not two");
        assert_eq!(err.kind(), StoreErrorKind::NotReplicated, "{err:?}");
    }

    let key = random_key();
    let Claim::Claimed(lapsed) = store
        .claim(&key, &fp, Duration::from_millis(20))
        .await
        .unwrap()
    else {
        panic!("claims")
    };
    tokio::time::sleep(Duration::from_millis(60)).await;
    let Claim::Claimed(_holder) = store
        .claim(&key, &fp, Duration::from_secs(5))
        .await
        .unwrap()
    else {
        panic!("the lapsed key is claimed again")
    };
    assert!(
        !store
            .complete(&key, &lapsed, &fp, record("r"), Duration::from_secs(60))
            .await
            .unwrap(),
        "nothing written, nothing to replicate: Ok(false), not NotReplicated"
    );
}

/// The calls of `command` the server counted (`INFO commandstats`).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let stats = server.command(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Completes of concurrent requests that meet in one pipeline share one `WAIT` at its end,
/// and each is acknowledged.
#[tokio::test]
async fn concurrent_completes_share_one_wait() {
    if !redis_server::available() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let store = RedisStore::builder("replicas-shared")
        .timeout(REPLICA_ACK * 3)
        .wait_for_replicas(1, REPLICA_ACK)
        .connect(&primary.url())
        .await
        .expect("connect");
    let engine = Engine::new(store.clone());
    let fp = fingerprint("a");
    // Warm up: the complete script is loaded.
    let Begin::Run(t) = engine.begin(random_key(), fp).await.unwrap() else {
        panic!("runs")
    };
    assert!(engine.complete(t, &response()).await.unwrap());

    const N: usize = 16;
    let before = calls(&primary, "wait");
    let keys: Vec<_> = (0..N).map(|_| random_key()).collect();
    // Tasks on this one thread: they queue their steps in the same runtime rounds.
    let runs: Vec<_> = keys
        .iter()
        .map(|key| {
            let (engine, key) = (engine.clone(), *key);
            tokio::spawn(async move {
                let Begin::Run(t) = engine.begin(key, fingerprint("a")).await.unwrap() else {
                    panic!("runs")
                };
                engine.complete(t, &response()).await.unwrap()
            })
        })
        .collect();
    for run in runs {
        assert!(run.await.unwrap(), "every complete acknowledged");
    }
    let waits = calls(&primary, "wait") - before;
    assert!(
        (1..N as u64).contains(&waits),
        "{N} completes in one runtime round share WAITs: {waits} sent"
    );
    for key in &keys {
        assert_eq!(
            replica.command(&["EXISTS", &redis_key(store.key_prefix(), key)]),
            "1",
            "each acknowledged record is on the replica"
        );
    }
}

/// Through the HTTP layer: the complete fails, the caller still gets the handler's response,
/// and the handler ran once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layer_returns_the_response_when_the_complete_is_not_replicated() {
    if !redis_server::available() {
        return;
    }
    let (primary, _replica) = primary_and_replica();
    let store = RedisStore::builder("replicas-layer")
        .wait_for_replicas(2, Duration::from_millis(100))
        .connect(&primary.url())
        .await
        .expect("connect");
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let svc = IdempotencyLayer::new(store).layer(service_fn(
        move |_req: http::Request<RequestBody<Full<Bytes>>>| {
            counter.fetch_add(1, Ordering::SeqCst);
            async {
                let mut res = http::Response::new(Full::new(Bytes::from_static(b"{\"id\":7}")));
                *res.status_mut() = http::StatusCode::CREATED;
                Ok::<_, Infallible>(res)
            }
        },
    ));
    let req = http::Request::post("/orders")
        .header("content-type", "application/json")
        .header("idempotency-key", "not-replicated-1")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), 201);
    assert!(res.headers().get("idempotent-replayed").is_none());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"{\"id\":7}", "the handler's own response");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The cost of the option: µs per first run (claim and complete) with it off and on, one
/// caller at a time and 32 at once, on loopback. Printed, not asserted. Run with
/// `cargo test -p tower-idempotency --all-features --test store -- --ignored
/// wait_for_replicas_cost --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing, printed: run by hand"]
async fn wait_for_replicas_cost() {
    if !redis_server::available() {
        return;
    }
    let (primary, _replica) = primary_and_replica();
    const N: u32 = 4_000;
    for callers in [1u32, 32] {
        for (label, wait) in [("off", 0), ("on (1 replica)", 1)] {
            let store = RedisStore::builder("replicas-cost")
                .wait_for_replicas(wait, Duration::from_millis(500))
                .connect(&primary.url())
                .await
                .expect("connect");
            let engine = Engine::new(store);
            // The first round warms up (scripts loaded, connection made).
            for round in 0..2 {
                let started = Instant::now();
                let tasks: Vec<_> = (0..callers)
                    .map(|_| {
                        let engine = engine.clone();
                        tokio::spawn(async move {
                            let fp = fingerprint("a");
                            for _ in 0..N / callers {
                                let Begin::Run(t) = engine.begin(random_key(), fp).await.unwrap()
                                else {
                                    panic!("runs")
                                };
                                assert!(engine.complete(t, &response()).await.unwrap());
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.unwrap();
                }
                let us = started.elapsed().as_secs_f64() * 1e6 / f64::from(N);
                if round == 1 {
                    println!(
                        "wait_for_replicas {label}, {callers} callers: {us:.1} µs per first run \
                         (claim + complete), wall time / runs"
                    );
                }
            }
        }
    }
}

/// Sends `signal` (`STOP`, `CONT`) to the process `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{signal} {pid}");
}

/// A replica that stops answering (paused) keeps every `WAIT` waiting its whole bound. While
/// completes wait, claims on the same store still answer: a wait for replicas holds only the
/// writes that wait, never the connection every operation uses. The store's defaults but the
/// option: a 1 s operation timeout, so `WAIT` holds up to 750 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_answer_while_completes_wait_for_a_silent_replica() {
    if !redis_server::available() {
        return;
    }
    let (primary, replica) = primary_and_replica();
    let store = RedisStore::builder("replicas-silent")
        .wait_for_replicas(1, Duration::from_secs(10))
        .connect(&primary.url())
        .await
        .expect("connect");
    let engine = Engine::new(store);
    let fp = fingerprint("a");
    signal(replica.pid(), "STOP");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let completing: Vec<_> = (0..4)
        .map(|_| {
            let (engine, stop) = (engine.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut not_replicated = 0;
                while !stop.load(Ordering::SeqCst) {
                    let Ok(Begin::Run(t)) = engine.begin(random_key(), fp).await else {
                        continue;
                    };
                    if let Err(e) = engine.complete(t, &response()).await {
                        // `NotReplicated` once the `WAIT` ran out; on a loaded machine a
                        // complete queued behind another batch's wait may run out of its own
                        // time first. Either way it was not acknowledged, and never `Unavailable`.
                        assert!(
                            matches!(
                                e.kind(),
                                StoreErrorKind::NotReplicated | StoreErrorKind::Timeout
                            ),
                            "{e:?}"
                        );
                        not_replicated += 1;
                    }
                }
                not_replicated
            })
        })
        .collect();
    // Let the completes start waiting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut failed = Vec::new();
    for _ in 0..20 {
        match engine.begin(random_key(), fp).await {
            Ok(Begin::Run(t)) => {
                engine.release(t).await.expect("release");
            }
            Ok(other) => panic!("a fresh key runs: {other:?}"),
            Err(e) => failed.push(e.kind()),
        }
    }
    stop.store(true, Ordering::SeqCst);
    let mut not_replicated = 0;
    for c in completing {
        not_replicated += c.await.unwrap();
    }
    signal(replica.pid(), "CONT");
    assert!(
        not_replicated > 0,
        "the completes waited for the silent replica and failed"
    );
    assert_eq!(failed, [], "every claim answered while completes waited");
}

/// With fewer replicas in sync than asked, a complete sends no `WAIT` that could only run out:
/// it writes the record and fails `NotReplicated` at once. Once a replica is in sync again,
/// completes wait for it and are acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_replica_in_sync_a_complete_says_not_replicated_without_waiting() {
    if !redis_server::available() {
        return;
    }
    let primary = RedisServer::start();
    let store = RedisStore::builder("replicas-none")
        .wait_for_replicas(1, Duration::from_secs(10))
        .connect(&primary.url())
        .await
        .expect("connect");
    let engine = Engine::new(store.clone());
    let fp = fingerprint("a");
    let waits = calls(&primary, "wait");
    for _ in 0..5 {
        let key = random_key();
        let Begin::Run(t) = engine.begin(key, fp).await.unwrap() else {
            panic!("a fresh key runs")
        };
        let err = engine
            .complete(t, &response())
            .await
            .expect_err("no replica");
        assert_eq!(err.kind(), StoreErrorKind::NotReplicated, "{err:?}");
        assert!(
            matches!(engine.begin(key, fp).await.unwrap(), Begin::Replayed(r) if r == response()),
            "the record is on the primary and replays"
        );
    }
    assert_eq!(
        calls(&primary, "wait"),
        waits,
        "no WAIT sent while no replica is in sync"
    );

    let replica =
        RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    wait_until("the replica in sync", || {
        replica
            .command(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let key = random_key();
        let Begin::Run(t) = engine.begin(key, fp).await.unwrap() else {
            panic!("a fresh key runs")
        };
        match engine.complete(t, &response()).await {
            Ok(written) => {
                assert!(written);
                assert_eq!(
                    replica.command(&["EXISTS", &redis_key(store.key_prefix(), &key)]),
                    "1",
                    "an acknowledged record is on the replica"
                );
                break;
            }
            // The batch that first sees the replica in sync sends no `WAIT` yet.
            Err(e) if e.kind() == StoreErrorKind::NotReplicated => {
                assert!(Instant::now() < deadline, "never acknowledged again");
            }
            Err(e) => panic!("{e:?}"),
        }
    }
}
