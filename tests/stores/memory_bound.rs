//! The memory store's bounds under many distinct keys, and where it answers 429 and 503.
//!
//! - `MEMORY_BOUND_KEYS` distinct keys (default 1 000 000, about 10 s in a debug build) go
//!   through `Engine::begin` / `Engine::complete` on a store with `max_bytes` = 32 MiB: the
//!   store's counted bytes stay under it, the process RSS stays within the stated bound,
//!   completed records are dropped oldest first, and pending claims held throughout (inside
//!   their lease) are never dropped.
//! - A scope whose records are all pending is refused (429 `idempotency.scope_full`) while other
//!   scopes still claim; a scope at its cap with completed records drops its own oldest one.
//! - A shard full of pending claims refuses (`StoreFull`, 503 `idempotency.store_full`) while
//!   other shards still claim; once a claim completes, its record is dropped to make room.
//!
//! ```text
//! cargo test --test stores -- memory_bound:: --nocapture
//! ```
#![allow(clippy::unwrap_used)]

use crate::support;

use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;
use support::http::{Kind, TestServer, Work, send};
use tower_idempotency::engine::{Begin, Engine, Fingerprint, RecordedResponse, Scope, Ticket};
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::store::{StoreErrorKind, StoreKey};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore};

const MIB: usize = 1024 * 1024;
const MAX_BYTES: usize = 32 * MIB;
/// RSS growth allowed over the baseline taken before the store was built: twice `max_bytes`
/// (allocator overhead and fragmentation of the record bytes, the slab and index growth).
const RSS_BOUND: usize = 2 * MAX_BYTES;

/// The resident set of this process (`VmRSS` in `/proc/self/status`), in bytes.
fn rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A key of scope `scope` (hash bytes from a number) with id `id`.
fn key(scope: u32, id: u64) -> StoreKey {
    let mut s = [0u8; 32];
    s[..4].copy_from_slice(&scope.to_le_bytes());
    s[31] = 0x5c;
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&id.to_le_bytes());
    k[8..12].copy_from_slice(&scope.to_le_bytes());
    k[31] = 0x1d;
    StoreKey::from_parts(s, k)
}

fn fp(n: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    Fingerprint::from_bytes(b)
}

/// A 201 with a JSON content type and a 200-byte body (about 250 encoded bytes).
fn response(n: u64) -> RecordedResponse {
    let mut body = format!("{{\"order\":{n},\"pad\":\"");
    while body.len() < 198 {
        body.push('x');
    }
    body.push_str("\"}");
    RecordedResponse::new(
        201,
        vec![(
            Bytes::from_static(b"content-type"),
            Bytes::from_static(b"application/json"),
        )],
        Some(Bytes::from(body)),
    )
}

async fn run(engine: &Engine<MemoryStore>, k: StoreKey, n: u64) -> Ticket {
    match engine.begin(k, fp(n)).await.unwrap() {
        Begin::Run(t) => t,
        other => panic!("key {n} should be free: {other:?}"),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn distinct_keys_stay_within_max_bytes_and_never_drop_a_live_claim() {
    let keys: u64 = std::env::var("MEMORY_BOUND_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    const HELD: u64 = 64;
    let Some(baseline) = rss() else {
        eprintln!("skipping: /proc/self/status is not readable here");
        return;
    };
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_bytes(MAX_BYTES)
        .max_entries(10_000_000)
        .clock(clock.clone())
        .build();
    let engine = Engine::new(store);

    // Pending claims held through the whole run (their lease, 60 s on a clock that does not
    // move, never lapses), spread over the shards.
    let held: Vec<(StoreKey, Ticket)> = {
        let mut v = Vec::new();
        for h in 0..HELD {
            let k = key(u32::try_from(h).unwrap() * 7919, u64::MAX - h);
            v.push((k, run(&engine, k, u64::MAX - h).await));
        }
        v
    };

    let started = Instant::now();
    let mut peak = baseline;
    let mut max_counted = 0;
    for n in 0..keys {
        // 10 000 scopes of callers, each with its own keys.
        let k = key(u32::try_from(n % 10_000).unwrap() + 1_000_000, n);
        let t = run(&engine, k, n).await;
        assert!(engine.complete(t, &response(n)).await.unwrap());
        if n % 10_000 == 0 {
            let s = engine.store().stats();
            max_counted = max_counted.max(s.bytes);
            assert!(
                s.bytes <= MAX_BYTES,
                "counted bytes {} over max_bytes",
                s.bytes
            );
            assert_eq!(s.pending as u64, HELD, "the held claims are still there");
            peak = peak.max(rss().unwrap_or(0));
        }
    }
    let took = started.elapsed();
    peak = peak.max(rss().unwrap_or(0));
    let stats = engine.store().stats();

    // Every held claim is still pending (a duplicate is in flight), and its complete succeeds.
    for (i, (k, _)) in held.iter().enumerate() {
        let again = engine.begin(*k, fp(u64::MAX - i as u64)).await.unwrap();
        assert!(
            matches!(again, Begin::InFlight),
            "held claim {i}: {again:?}"
        );
    }
    // Oldest completed dropped first: the newest keys replay, the oldest are gone.
    for n in (keys - 1_000)..keys {
        let k = key(u32::try_from(n % 10_000).unwrap() + 1_000_000, n);
        let again = engine.begin(k, fp(n)).await.unwrap();
        assert!(
            matches!(again, Begin::Replay(ref r) if r.status == 201),
            "newest key {n}: {again:?}"
        );
    }
    let mut oldest_gone = 0;
    for n in 0..1_000 {
        let k = key(u32::try_from(n % 10_000).unwrap() + 1_000_000, n);
        if let Begin::Run(t) = engine.begin(k, fp(n)).await.unwrap() {
            oldest_gone += 1;
            engine.release(t).await.unwrap();
        }
    }
    assert_eq!(
        oldest_gone, 1_000,
        "the oldest records were the ones dropped"
    );
    for (_, t) in held {
        assert!(
            engine.complete(t, &response(0)).await.unwrap(),
            "a held claim completes"
        );
    }

    let retained = stats.entries - stats.pending;
    let growth = peak.saturating_sub(baseline);
    println!(
        "memory bound: {keys} distinct keys through Engine begin/complete in {took:.1?} \
         ({:.0} keys/s); max_bytes {} MiB; records kept {retained} + {} pending, counted bytes \
         {:.1} MiB (max seen {:.1} MiB); early drops {}; RSS baseline {:.1} MiB, peak {:.1} MiB, \
         growth {:.1} MiB (bound {} MiB); held pending claims {HELD}/{HELD} still pending",
        keys as f64 / took.as_secs_f64(),
        MAX_BYTES / MIB,
        stats.pending,
        stats.bytes as f64 / MIB as f64,
        max_counted as f64 / MIB as f64,
        stats.early_drops,
        baseline as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        growth as f64 / MIB as f64,
        RSS_BOUND / MIB,
    );
    assert!(stats.bytes <= MAX_BYTES);
    assert_eq!(stats.pending as u64, HELD);
    assert_eq!(
        stats.early_drops,
        keys - retained as u64,
        "every record not kept was dropped early (none expired: the clock did not move)"
    );
    assert!(
        growth <= RSS_BOUND,
        "RSS grew {growth} bytes, over {RSS_BOUND}"
    );
}

/// A store of one shard whose scopes hold at most 4 records, behind the HTTP layer, and an
/// engine on the same store to hold claims directly.
const NS: &str = "bound";

fn derived(user: &str, k: &str) -> StoreKey {
    StoreKey::derive(
        NS,
        &Scope::principal(user),
        &IdempotencyKey::new(k).unwrap(),
    )
}

async fn http_rig(store: MemoryStore) -> (Arc<MemoryStore>, Engine<MemoryStore>, TestServer, Work) {
    let store = Arc::new(store);
    let engine = Engine::from_arc(Arc::clone(&store));
    let work = Work::per_key();
    let layer = IdempotencyLayer::with_engine(Engine::from_arc(Arc::clone(&store))).namespace(NS);
    let server = TestServer::start(work.user_app(layer)).await;
    (store, engine, server, work)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scope_of_pending_claims_answers_429_while_other_scopes_claim() {
    let clock = ManualClock::new();
    let (store, engine, server, _work) = http_rig(
        MemoryStore::builder()
            .shards(1)
            .max_entries_per_scope(4)
            .clock(clock)
            .build(),
    )
    .await;

    // alice holds four pending claims: her scope is at its cap with nothing it may drop.
    let mut alice = Vec::new();
    for i in 0..4 {
        alice.push(run(&engine, derived("alice", &format!("held-{i}")), i).await);
    }
    let a = send(server.work("new").header("x-user", "alice")).await;
    assert_eq!(a.status, 429, "{}", a.describe());
    assert_eq!(a.code().as_deref(), Some("idempotency.scope_full"));
    assert!(a.retry_after().is_some());
    // bob, in the same shard, still claims.
    let b = send(server.work("new").header("x-user", "bob")).await;
    assert_eq!(b.kind(), Kind::Fresh, "{}", b.describe());

    // Two of alice's claims complete: at her cap, she drops her own oldest completed record.
    let first = alice.remove(0);
    assert!(engine.complete(first, &response(0)).await.unwrap());
    let second = alice.remove(0);
    assert!(engine.complete(second, &response(1)).await.unwrap());
    let drops = store.stats().early_drops;
    let a2 = send(server.work("new").header("x-user", "alice")).await;
    assert_eq!(a2.kind(), Kind::Fresh, "{}", a2.describe());
    assert_eq!(
        store.stats().early_drops,
        drops + 1,
        "one of alice's records dropped"
    );
    let stats = store.stats();
    // (Looking does not change anything here: a replay or an in-flight answer writes nothing.)
    assert!(
        matches!(
            engine
                .begin(derived("alice", "held-1"), fp(1))
                .await
                .unwrap(),
            Begin::Replay(_)
        ),
        "her newer completed record is kept"
    );
    for (i, t) in alice.iter().enumerate() {
        let again = engine.begin(*t.key(), fp(i as u64 + 2)).await.unwrap();
        assert!(
            matches!(again, Begin::InFlight),
            "alice's pending claims are kept: {again:?}"
        );
    }
    let b2 = send(server.work("new").header("x-user", "bob")).await;
    assert_eq!(
        b2.kind(),
        Kind::Replay,
        "bob's record was not touched: {}",
        b2.describe()
    );
    // Last, as it claims: held-0's record is gone (the claim finds the key free).
    assert!(
        matches!(
            engine
                .begin(derived("alice", "held-0"), fp(0))
                .await
                .unwrap(),
            Begin::Run(_)
        ),
        "alice's oldest completed record was the one dropped"
    );
    println!(
        "scope cap 4: alice all pending -> 429 scope_full, bob -> 201; alice 2 completed + 2 \
         pending -> 201 after dropping her own oldest completed; refusals {}, early drops {}",
        stats.scope_full_refusals, stats.early_drops
    );
    assert_eq!(stats.scope_full_refusals, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_full_of_pending_claims_answers_503_while_other_shards_claim() {
    // Engine level: two shards of four records; shard 0 full of pending claims.
    let store = MemoryStore::builder()
        .shards(2)
        .max_entries(8)
        .clock(ManualClock::new())
        .build();
    let engine = Engine::new(store);
    // A scope hash whose first four bytes are even picks shard 0; odd picks shard 1.
    let mut held = Vec::new();
    for i in 0..4u32 {
        held.push(run(&engine, key(i * 2, u64::from(i)), u64::from(i)).await);
    }
    let err = engine.begin(key(100, 100), fp(100)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::StoreFull, "{err}");
    let other = engine.begin(key(101, 101), fp(101)).await.unwrap();
    assert!(
        matches!(other, Begin::Run(_)),
        "shard 1 still claims: {other:?}"
    );
    // One claim completes: its record is the one dropped to make room.
    let t = held.remove(0);
    assert!(engine.complete(t, &response(0)).await.unwrap());
    assert!(matches!(
        engine.begin(key(100, 100), fp(100)).await.unwrap(),
        Begin::Run(_)
    ));
    let stats = engine.store().stats();
    assert_eq!((stats.store_full_refusals, stats.early_drops), (1, 1));
    for (i, t) in held.iter().enumerate() {
        let again = engine.begin(*t.key(), fp(i as u64 + 1)).await.unwrap();
        assert!(
            matches!(again, Begin::InFlight),
            "no pending claim was dropped: {again:?}"
        );
    }

    // Through the layer: one shard of four records, all pending → 503 store_full.
    let (store, engine, server, _work) = http_rig(
        MemoryStore::builder()
            .shards(1)
            .max_entries(4)
            .clock(ManualClock::new())
            .build(),
    )
    .await;
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(run(&engine, derived(&format!("user-{i}"), "held"), i).await);
    }
    let c = send(server.work("new").header("x-user", "carol")).await;
    assert_eq!(c.status, 503, "{}", c.describe());
    assert_eq!(c.code().as_deref(), Some("idempotency.store_full"));
    assert!(c.retry_after().is_some());
    let t = held.remove(0);
    assert!(engine.complete(t, &response(0)).await.unwrap());
    let c2 = send(server.work("new").header("x-user", "carol")).await;
    assert_eq!(c2.kind(), Kind::Fresh, "{}", c2.describe());
    let stats = store.stats();
    println!(
        "shard of 4 full of pending: StoreFull in that shard, the other shard claims; through \
         the layer 503 store_full, then 201 once a record could be dropped; refusals {}, early \
         drops {}",
        stats.store_full_refusals, stats.early_drops
    );
    assert_eq!((stats.store_full_refusals, stats.early_drops), (1, 1));
    assert_eq!(stats.pending, 3, "no pending claim was dropped");
}
