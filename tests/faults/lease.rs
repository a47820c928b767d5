//! Lease expiry and fencing, through the HTTP layer, on both stores.
//!
//! A first request (A) claims a key and its handler outlives the lease while its renewal is
//! blocked (the store wrapper makes A's `renew` hang or fail). A second request (B) with the
//! same key claims it after the lease and runs: the documented at-least-once case. Then A's
//! late `complete` (or `release`) must not overwrite or delete B's record (or B's pending
//! claim): the replay after both finish is B's response, and A's caller still gets A's own.
//!
//! The memory store runs on a manual clock (the lease lapses when the test says); Redis expires
//! the pending key by itself (`PX`), on real time, with a lease of 3 s.
//!
//! ```text
//! TOWER_IDEMPOTENCY_REQUIRE_SERVERS=1 cargo test -p tower-idempotency --all-features --test faults -- lease:: --nocapture
//! ```
#![allow(clippy::unwrap_used)]

use crate::support;

use std::time::Duration;
use support::http::{Answer, Event, Kind, RenewFault, SpyStore, TestServer, Work, bounded, send};
use tower_idempotency::store::StoreKey;
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::{IdempotencyLayer, MemoryStore, Store};

/// How a scenario ends for the first holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Late {
    /// A's handler answers 201 after B completed: A's late complete must be refused.
    CompleteAfterSecondDone,
    /// A's handler answers 503 after B completed: A's late release must not delete B's record.
    ReleaseAfterSecondDone,
    /// A's handler answers 201 while B still runs: A's late complete must leave B's claim.
    CompleteWhileSecondPending,
}

/// Waits (bounded) until the store has seen a blocked renewal, i.e. A's lease renewal was
/// attempted and is hanging or failing.
async fn wait_blocked_renewal<S: Store>(store: &SpyStore<S>) {
    bounded(Duration::from_secs(10), "A's blocked renewal", async {
        while !store.events().contains(&Event::Renew { blocked: true }) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// Runs one scenario; `lapse` returns once A's lease has lapsed in the store.
async fn scenario<S: Store + Sync>(
    inner: S,
    lease: Duration,
    fault: RenewFault,
    late: Late,
    lapse: impl AsyncFn(StoreKey),
) -> String {
    let store = SpyStore::wrap(inner);
    let work = Work::per_key();
    let server = TestServer::start(
        work.user_app(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(store.clone())
                .lease(lease)
                .build(),
        )),
    )
    .await;
    let key = format!("fence-{late:?}-{fault:?}");

    // A claims and runs; its renewal is blocked; it waits on gate "a".
    store.block_next_claim(fault);
    let mut a = server.work(&key).header("x-gate", "a");
    if late == Late::ReleaseAfterSecondDone {
        a = a.header("x-status", "503");
    }
    let a = tokio::spawn(send(a));
    work.wait_runs(&key, 1).await;
    wait_blocked_renewal(&store).await;
    let claimed = store.claimed_keys()[0];
    lapse(claimed).await;

    // B claims after the lease and runs (at-least-once, as documented).
    let b = if late == Late::CompleteWhileSecondPending {
        let b = tokio::spawn(send(server.work(&key).header("x-gate", "b")));
        work.wait_runs(&key, 2).await;
        b
    } else {
        let b = send(server.work(&key)).await;
        assert_eq!(b.kind(), Kind::Fresh, "B ran: {}", b.describe());
        tokio::spawn(async move { b })
    };
    assert_eq!(work.runs_of(&key), 2, "B ran after A's lease lapsed");

    // A finishes late: its caller gets its own handler's answer.
    work.open("a");
    let a: Answer = bounded(Duration::from_secs(10), "A", a).await.unwrap();
    let expected_a = if late == Late::ReleaseAfterSecondDone {
        503
    } else {
        201
    };
    assert_eq!(a.status, expected_a, "A's own answer: {}", a.describe());
    assert!(!a.is_replay());
    assert_eq!(a.execution(), 1, "A's caller sees A's run");

    // A's late step was refused by the fence.
    let a_step = store
        .events()
        .into_iter()
        .find(|e| {
            matches!(
                e,
                Event::Complete { blocked: true, .. } | Event::Release { blocked: true, .. }
            )
        })
        .expect("A's late complete or release");
    match late {
        Late::ReleaseAfterSecondDone => assert_eq!(
            a_step,
            Event::Release {
                blocked: true,
                deleted: Some(false)
            },
            "A's late release deleted nothing"
        ),
        _ => assert_eq!(
            a_step,
            Event::Complete {
                blocked: true,
                written: Some(false)
            },
            "A's late complete wrote nothing"
        ),
    }

    if late == Late::CompleteWhileSecondPending {
        // B still holds the key: a repeat is in flight, not a replay of A.
        let d = send(server.work(&key)).await;
        assert_eq!(
            d.kind(),
            Kind::InFlight,
            "B still holds the key: {}",
            d.describe()
        );
        work.open("b");
    }
    let b: Answer = bounded(Duration::from_secs(10), "B", b).await.unwrap();
    assert_eq!(b.kind(), Kind::Fresh, "B's answer: {}", b.describe());
    assert_eq!(b.execution(), 2);

    // The record is B's: the replay after both finished is B's response.
    let c = send(server.work(&key)).await;
    assert_eq!(c.kind(), Kind::Replay, "a replay: {}", c.describe());
    assert_eq!(c.body, b.body, "the replay is B's response, not A's");
    assert_ne!(c.body, a.body);
    assert_eq!(work.runs_of(&key), 2, "no third run");
    let b_completed = store.events().contains(&Event::Complete {
        blocked: false,
        written: Some(true),
    });
    assert!(b_completed, "B's complete was written");
    format!(
        "{late:?} ({fault:?} renewal): runs 2 (A then B), A answered {} with its own run, A's \
         late step {a_step:?}, replay = B's record",
        a.status
    )
}

const MEMORY_LEASE: Duration = Duration::from_millis(300);

fn memory() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("valid bounds");
    (store, clock)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_late_complete_does_not_overwrite_the_second_holder() {
    let (store, clock) = memory();
    let r = scenario(
        store,
        MEMORY_LEASE,
        RenewFault::Hang,
        Late::CompleteAfterSecondDone,
        async |_| {
            clock.advance(MEMORY_LEASE * 2);
        },
    )
    .await;
    println!("memory: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_late_release_does_not_delete_the_second_holder() {
    let (store, clock) = memory();
    let r = scenario(
        store,
        MEMORY_LEASE,
        RenewFault::Fail,
        Late::ReleaseAfterSecondDone,
        async |_| {
            clock.advance(MEMORY_LEASE * 2);
        },
    )
    .await;
    println!("memory: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_late_complete_leaves_the_second_holders_claim() {
    let (store, clock) = memory();
    let r = scenario(
        store,
        MEMORY_LEASE,
        RenewFault::Hang,
        Late::CompleteWhileSecondPending,
        async |_| {
            clock.advance(MEMORY_LEASE * 2);
        },
    )
    .await;
    println!("memory: {r}");
}

#[cfg(feature = "redis")]
mod redis {
    use super::support::redis_server::{self, RedisServer};
    use super::*;
    use tower_idempotency::RedisStore;

    // Real time: B renews every second and loses its claim only after 3 s without one, so a
    // stalled machine cannot hand A's late complete a free key.
    const LEASE: Duration = Duration::from_secs(3);

    async fn run(fault: RenewFault, late: Late) {
        if !redis_server::available() {
            return;
        }
        let server = RedisServer::start();
        let store = RedisStore::connect(&server.url(), "faults-lease")
            .await
            .unwrap();
        let handle = store.clone();
        let r = scenario(store, LEASE, fault, late, async |key| {
            // Redis expires the pending key itself when the lease ends.
            let redis_key = redis_server::redis_key(handle.key_prefix(), &key);
            bounded(
                Duration::from_secs(10),
                "the lease to lapse in Redis",
                async {
                    while server.command(&["EXISTS", &redis_key]) != "0" {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                },
            )
            .await;
        })
        .await;
        println!("redis: {r}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_late_complete_does_not_overwrite_the_second_holder() {
        run(RenewFault::Hang, Late::CompleteAfterSecondDone).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_late_release_does_not_delete_the_second_holder() {
        run(RenewFault::Fail, Late::ReleaseAfterSecondDone).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_late_complete_leaves_the_second_holders_claim() {
        run(RenewFault::Hang, Late::CompleteWhileSecondPending).await;
    }
}
