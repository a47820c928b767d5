//! The memory store's bounds under many distinct keys, and where it answers 429 and 503.
//!
//! - `MEMORY_BOUND_KEYS` distinct keys (default 1 000 000, about 10 s in a debug build) go
//!   through `Engine::begin` / `Engine::complete` on a store with `max_bytes` = 32 MiB: the
//!   store's counted bytes stay under it, the process RSS stays within the stated bound,
//!   completed records are dropped oldest first, and pending claims held throughout (inside
//!   their lease) are never dropped.
//! - With a fixed per-scope cap, a scope whose records are all pending is refused (429
//!   `idempotency.scope_full`) while other scopes still claim; a scope at its cap with completed
//!   records drops its own oldest one.
//! - A store full of pending claims refuses a newcomer (`StoreFull`, 503
//!   `idempotency.store_full`) in every shard; once a claim completes, its record is dropped to
//!   make room.
//! - With every default, one principal whose work never finishes holds at most a tenth of the
//!   store in pending claims, then gets 429 `idempotency.scope_full` while another gets 201.
//! - Fairness under pressure: the budgets are store-wide (one principal may fill the store with
//!   completed records, and with pending claims where the pending share is off), and a full
//!   store takes room from the scope that holds the most, never from a smaller one.
//!
//! ```text
//! cargo test --test store -- memory_bound:: --nocapture
//! ```
#![allow(clippy::unwrap_used)]

use crate::support;

use bytes::Bytes;
use std::sync::Arc;
use std::time::Instant;
use support::http::{Kind, TestServer, Work, send};
use tower_idempotency::engine::{Begin, Engine, Fingerprint, KeyState, Recorded, Scope, Ticket};
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::store::{StoreErrorKind, StoreKey};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore};

const MIB: usize = 1024 * 1024;
const MAX_BYTES: usize = 32 * MIB;
/// RSS growth allowed over the baseline taken before the store was built: twice `max_bytes`
/// (allocator overhead and fragmentation of the record bytes, the slab and index growth).
const RSS_BOUND: usize = 2 * MAX_BYTES;

/// Held by the tests that measure or use tens of megabytes, so that one's memory does not count
/// in the other's resident set.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
fn response(n: u64) -> Recorded {
    let mut body = format!("{{\"order\":{n},\"pad\":\"");
    while body.len() < 198 {
        body.push('x');
    }
    body.push_str("\"}");
    Recorded::new(
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
    let _heavy = HEAVY.lock().await;
    let Some(baseline) = rss() else {
        eprintln!("skipping: /proc/self/status is not readable here");
        return;
    };
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .max_bytes(MAX_BYTES)
        .max_entries(10_000_000)
        .clock(clock.clone())
        .build()
        .unwrap();
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

    // Every held claim is still pending (a repeat is in flight), and its complete succeeds.
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
            matches!(again, Begin::Replayed(ref r) if r.status == 201),
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
    let layer = IdempotencyLayer::new(Engine::from_arc(Arc::clone(&store))).namespace(NS);
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
            .build()
            .unwrap(),
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
            Begin::Replayed(_)
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

/// With every default: one principal whose work never finishes holds at most a tenth of the
/// store in pending claims, then gets 429 `idempotency.scope_full`; another principal still
/// gets 201.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_one_principal_of_pending_claims_gets_429_and_another_201() {
    let (store, engine, server, _work) = http_rig(MemoryStore::new()).await;
    // alice's requests whose handlers never finish: each holds its claim.
    let mut held = Vec::new();
    let refused = loop {
        let n = held.len() as u64;
        match engine
            .begin(derived("alice", &format!("held-{n}")), fp(n))
            .await
        {
            Ok(Begin::Run(t)) => held.push(t),
            Ok(other) => panic!("a fresh key: {other:?}"),
            Err(err) => break err,
        }
    };
    assert_eq!(refused.kind(), StoreErrorKind::ScopeFull, "{refused}");
    // The default share: a tenth of the default `max_entries` (100 000).
    assert_eq!(held.len(), 10_000, "alice held a tenth of the store");
    let stats = store.stats();
    assert_eq!((stats.pending, stats.early_drops), (10_000, 0));

    let a = send(server.work("one-more").header("x-user", "alice")).await;
    assert_eq!(a.status, 429, "{}", a.describe());
    assert_eq!(a.code().as_deref(), Some("idempotency.scope_full"));
    assert!(a.retry_after().is_some());
    let b = send(server.work("new").header("x-user", "bob")).await;
    assert_eq!(b.status, 201, "{}", b.describe());
    assert_eq!(b.kind(), Kind::Fresh, "{}", b.describe());

    // One of alice's requests finishes: she may claim again.
    let t = held.pop().unwrap();
    assert!(engine.complete(t, &response(0)).await.unwrap());
    let a2 = send(server.work("one-more").header("x-user", "alice")).await;
    assert_eq!(a2.kind(), Kind::Fresh, "{}", a2.describe());
    println!(
        "defaults: one principal held {} pending claims, then 429 scope_full; another got 201",
        held.len() + 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_full_of_pending_claims_answers_503_until_a_record_can_go() {
    // Engine level: eight records over two shards, all pending, all in shard 0: the budget is
    // store-wide, so one shard may hold all of it.
    let store = MemoryStore::builder()
        .shards(2)
        .max_entries(8)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let engine = Engine::new(store);
    // A scope hash whose first four bytes are even picks shard 0; odd picks shard 1.
    let mut held = Vec::new();
    for i in 0..8u32 {
        held.push(run(&engine, key(i * 2, u64::from(i)), u64::from(i)).await);
    }
    // A newcomer in either shard: nothing may be dropped, 503.
    for k in [key(100, 100), key(101, 101)] {
        let err = engine.begin(k, fp(100)).await.unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::StoreFull, "{err}");
    }
    // One claim completes: its record is the one dropped to make room, from the other shard.
    let t = held.remove(0);
    assert!(engine.complete(t, &response(0)).await.unwrap());
    assert!(matches!(
        engine.begin(key(101, 101), fp(101)).await.unwrap(),
        Begin::Run(_)
    ));
    let stats = engine.store().stats();
    assert_eq!((stats.store_full_refusals, stats.early_drops), (2, 1));
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
            .build()
            .unwrap(),
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
        "store of 8 over 2 shards, all pending in one shard: StoreFull in both; once a claim \
         completes its record makes room; through the layer 503 store_full, then 201; \
         refusals {}, early drops {}",
        stats.store_full_refusals, stats.early_drops
    );
    assert_eq!((stats.store_full_refusals, stats.early_drops), (1, 1));
    assert_eq!(stats.pending, 3, "no pending claim was dropped");
}

// ---------------------------------------------------------------------------------------------
// Fairness under pressure: room comes from the scope that holds the most
// ---------------------------------------------------------------------------------------------

/// A 201 whose body is `len` bytes.
fn large_response(len: usize) -> Recorded {
    Recorded::new(201, Vec::new(), Some(Bytes::from(vec![b'x'; len])))
}

/// Claims and completes `k` with `response`.
async fn store_one(engine: &Engine<MemoryStore>, k: StoreKey, n: u64, response: &Recorded) {
    let t = run(engine, k, n).await;
    assert!(engine.complete(t, response).await.unwrap(), "complete {n}");
}

/// Whether `k` still holds its completed record. Looking writes nothing when it does; when it
/// does not, the look claims the key (and may make room), so tests look at absent keys last.
async fn replays(engine: &Engine<MemoryStore>, k: StoreKey, n: u64) -> bool {
    matches!(engine.begin(k, fp(n)).await.unwrap(), Begin::Replayed(_))
}

#[tokio::test(flavor = "current_thread")]
async fn one_principal_writing_large_records_drops_only_its_own() {
    // The default bounds (64 MiB, 16 shards). With 16 shards, scope `s` lives in shard `s % 16`:
    // half of the other principals share the big writer's shard (scope 0, shard 0).
    let _heavy = HEAVY.lock().await;
    let engine = Engine::new(
        MemoryStore::builder()
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let others: Vec<(StoreKey, u64)> = (1..=40u32)
        .map(|s| (key(s * 8, u64::from(s)), u64::from(s)))
        .collect();
    for &(k, n) in &others {
        store_one(&engine, k, n, &response(n)).await;
    }

    // About 80 MB of ~1 MB responses from one principal: more than the whole store.
    let big = large_response(1_000_000);
    let (mut stored, mut refused) = (0u64, 0u64);
    for n in 0..80u64 {
        let t = run(&engine, key(0, 10_000 + n), 10_000 + n).await;
        match engine.complete(t, &big).await {
            Ok(true) => stored += 1,
            Ok(false) => panic!("the key was free"),
            Err(e) => {
                assert!(
                    matches!(
                        e.kind(),
                        StoreErrorKind::ScopeFull | StoreErrorKind::StoreFull
                    ),
                    "{e}"
                );
                refused += 1;
            }
        }
    }
    let stats = engine.store().stats();
    for &(k, n) in &others {
        assert!(
            replays(&engine, k, n).await,
            "principal {n}'s record was dropped for the big writer's"
        );
    }
    // The writer keeps its newest records.
    let mut kept = 0;
    while kept < 80 && replays(&engine, key(0, 10_079 - kept), 10_079 - kept).await {
        kept += 1;
    }
    println!(
        "large records: one principal wrote 80 x 1 MB ({stored} stored, {refused} refused), keeps \
         {kept} ({:.1} MiB); 40 other principals keep every record; early drops {}",
        stats.bytes as f64 / MIB as f64,
        stats.early_drops
    );
    assert_eq!(stored, 80, "the writer makes room from its own records");
    assert!(
        kept > 4,
        "the writer keeps more than a sixteenth of the store: {kept}"
    );
    assert_eq!(
        stats.early_drops,
        80 - kept,
        "every drop was one of the writer's"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_single_principal_fills_the_whole_store_before_anything_is_dropped() {
    let engine = Engine::new(
        MemoryStore::builder()
            .max_entries(1_000)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    for n in 0..1_000u64 {
        store_one(&engine, key(3, n), n, &response(n)).await;
    }
    let stats = engine.store().stats();
    assert_eq!(
        (stats.entries, stats.early_drops),
        (1_000, 0),
        "one principal may use the whole store: {stats:?}"
    );

    store_one(&engine, key(3, 1_000), 1_000, &response(1_000)).await;
    assert_eq!(engine.store().stats().early_drops, 1);
    assert!(
        replays(&engine, key(3, 1), 1).await,
        "its second oldest is kept"
    );
    assert!(
        !replays(&engine, key(3, 0), 0).await,
        "its oldest record made room"
    );
}

/// Inspection reads only: in a full store, inspecting the oldest record keeps it no longer
/// (it is still the one dropped for room), and inspecting a free key takes no room.
#[tokio::test(flavor = "current_thread")]
async fn inspecting_a_record_keeps_the_order_in_which_a_full_store_drops() {
    let engine = Engine::new(
        MemoryStore::builder()
            .max_entries(1_000)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    for n in 0..1_000u64 {
        store_one(&engine, key(3, n), n, &response(n)).await;
    }
    for _ in 0..3 {
        assert!(matches!(
            engine.inspect(&key(3, 0)).await.unwrap(),
            KeyState::Done { status: 201, .. }
        ));
        assert_eq!(engine.inspect(&key(4, 0)).await.unwrap(), KeyState::Absent);
    }
    let stats = engine.store().stats();
    assert_eq!(
        (stats.entries, stats.early_drops),
        (1_000, 0),
        "inspection added or dropped nothing: {stats:?}"
    );

    store_one(&engine, key(3, 1_000), 1_000, &response(1_000)).await;
    assert_eq!(engine.store().stats().early_drops, 1);
    assert_eq!(
        engine.inspect(&key(3, 0)).await.unwrap(),
        KeyState::Absent,
        "the oldest record, inspected, still made room"
    );
    assert!(matches!(
        engine.inspect(&key(3, 1)).await.unwrap(),
        KeyState::Done { .. }
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn room_comes_from_the_scope_that_holds_the_most() {
    let engine = Engine::new(
        MemoryStore::builder()
            .max_pending_per_scope(usize::MAX)
            .shards(1)
            .max_entries(10)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    // Scope 2 writes first (the oldest records), scope 1 fills the rest.
    for n in 0..3 {
        store_one(&engine, key(2, n), n, &response(n)).await;
    }
    for n in 10..17 {
        store_one(&engine, key(1, n), n, &response(n)).await;
    }
    // A newcomer's claim: room comes from scope 1 (7 records), never scope 2 (3).
    let newcomer = run(&engine, key(9, 100), 100).await;
    // Scope 2's own claim: scope 1 still holds more.
    let own = run(&engine, key(2, 3), 3).await;
    assert_eq!(engine.store().stats().early_drops, 2);
    for n in 0..3 {
        assert!(
            replays(&engine, key(2, n), n).await,
            "the smaller scope keeps record {n}"
        );
    }
    assert!(replays(&engine, key(1, 12), 12).await);
    engine.release(newcomer).await.unwrap();
    engine.release(own).await.unwrap();
    assert!(
        !replays(&engine, key(1, 10), 10).await,
        "the larger scope's oldest went"
    );
    assert!(!replays(&engine, key(1, 11), 11).await);
}

#[tokio::test(flavor = "current_thread")]
async fn a_scope_of_pending_claims_in_a_full_store_gets_429_and_a_newcomer_503() {
    let store = MemoryStore::builder()
        .max_pending_per_scope(usize::MAX)
        .shards(1)
        .max_entries(4)
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let engine = Engine::new(store);
    // Scope 1 holds three claims in flight; scope 2 one completed record.
    let held: Vec<Ticket> = {
        let mut v = Vec::new();
        for n in 0..3 {
            v.push(run(&engine, key(1, n), n).await);
        }
        v
    };
    store_one(&engine, key(2, 10), 10, &response(10)).await;

    // Scope 1 holds the most and only pending claims: 429, scope 2's record is not taken.
    let err = engine.begin(key(1, 3), fp(3)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::ScopeFull, "{err}");
    assert!(replays(&engine, key(2, 10), 10).await);
    // Scope 2 makes room from its own record.
    let t = run(&engine, key(2, 11), 11).await;
    // Now every record is pending: a newcomer gets 503.
    let err = engine.begin(key(3, 20), fp(20)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::StoreFull, "{err}");
    let stats = engine.store().stats();
    assert_eq!(
        (
            stats.scope_full_refusals,
            stats.store_full_refusals,
            stats.early_drops
        ),
        (1, 1, 1),
        "{stats:?}"
    );
    drop((held, t));
}

#[tokio::test(flavor = "current_thread")]
async fn a_newcomer_in_another_shard_takes_room_from_the_largest_scope() {
    let engine = Engine::new(
        MemoryStore::builder()
            .shards(16)
            .max_entries(100)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    for n in 0..100 {
        store_one(&engine, key(0, n), n, &response(n)).await;
    }
    assert_eq!(engine.store().stats().entries, 100);
    // Scope 5 lives in shard 5: the room it needs comes from scope 0 in shard 0.
    store_one(&engine, key(5, 1_000), 1_000, &response(1_000)).await;
    let stats = engine.store().stats();
    assert_eq!((stats.entries, stats.early_drops), (100, 1), "{stats:?}");
    assert!(replays(&engine, key(0, 1), 1).await);
    assert!(
        !replays(&engine, key(0, 0), 0).await,
        "scope 0's oldest went"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn budgets_are_store_wide_so_the_shard_split_makes_no_setting_impossible() {
    // 8 MiB over 16 shards: a record of the engine's largest body (1 MiB) still fits.
    let engine = Engine::new(
        MemoryStore::builder()
            .max_bytes(8 * MIB)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    store_one(&engine, key(0, 1), 1, &large_response(MIB)).await;
    assert!(replays(&engine, key(0, 1), 1).await);

    // 32 records over 16 shards: one caller's claims in flight do not crowd out a caller of
    // the same shard while the store has room; once the store is full, the caller holding the
    // claims is told 429 and a newcomer 503.
    let engine = Engine::new(
        MemoryStore::builder()
            .max_entries(32)
            .max_pending_per_scope(usize::MAX)
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    );
    let mut held = Vec::new();
    for n in 0..2 {
        held.push(run(&engine, key(0, n), n).await);
    }
    held.push(run(&engine, key(16, 100), 100).await); // scope 16: shard 0 as well
    for n in 2..31 {
        held.push(run(&engine, key(0, n), n).await);
    }
    let err = engine.begin(key(0, 31), fp(31)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::ScopeFull, "{err}");
    let err = engine.begin(key(7, 200), fp(200)).await.unwrap_err();
    assert_eq!(err.kind(), StoreErrorKind::StoreFull, "{err}");
    assert_eq!(engine.store().stats().pending, 32);
}

// ---------------------------------------------------------------------------------------------
// The early-drop warning
// ---------------------------------------------------------------------------------------------

/// The `drops` field of every warning logged.
#[derive(Clone, Default)]
struct Warnings(Arc<std::sync::Mutex<Vec<u64>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Drops(Option<u64>);
        impl tracing::field::Visit for Drops {
            fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
                if field.name() == "drops" {
                    self.0 = Some(value);
                }
            }
            fn record_debug(&mut self, _: &tracing::field::Field, _: &dyn std::fmt::Debug) {}
        }
        if *event.metadata().level() == tracing::Level::WARN {
            let mut drops = Drops(None);
            event.record(&mut drops);
            self.0
                .lock()
                .unwrap()
                .push(drops.0.expect("an early-drop warning tells its count"));
        }
    }
}

/// A store dropping a record for every new request warns once per 10 s of its clock, with the
/// count of drops since the last line; its stats count every drop.
#[tokio::test(flavor = "current_thread")]
async fn early_drops_are_warned_once_per_ten_seconds_with_their_count() {
    use tracing_subscriber::layer::SubscriberExt;
    let warnings = Warnings::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(warnings.clone()));
    let clock = ManualClock::new();
    let engine = Engine::new(
        MemoryStore::builder()
            .max_entries(100)
            .clock(clock.clone())
            .build()
            .unwrap(),
    );
    for n in 0..100u64 {
        store_one(&engine, key(3, n), n, &response(n)).await;
    }
    // 1 000 drops within one second.
    for n in 100..1_100u64 {
        clock.advance(std::time::Duration::from_millis(1));
        store_one(&engine, key(3, n), n, &response(n)).await;
    }
    assert_eq!(engine.store().stats().early_drops, 1_000);
    assert_eq!(
        *warnings.0.lock().unwrap(),
        [1],
        "one line, for the first drop"
    );

    // Ten seconds later, the next drop tells the 999 untold and itself.
    clock.advance(std::time::Duration::from_secs(10));
    store_one(&engine, key(3, 1_100), 1_100, &response(1_100)).await;
    assert_eq!(engine.store().stats().early_drops, 1_001);
    assert_eq!(*warnings.0.lock().unwrap(), [1, 1_000]);
}
