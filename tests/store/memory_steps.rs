//! The memory store's steps: kept in the store's one budget under its one fairness rule, freed
//! when their key completes, checked for room before the work runs, and kept as long as a retry
//! needs them. Every store here has the default bounds; time is a paused tokio clock or the
//! store's injected clock.
//!
//! ```text
//! cargo test -p tower-idempotency --all-features --test store -- memory_steps
//! ```
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;
use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Recorded};
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::store::memory::MemoryStats;
use tower_idempotency::store::{
    Claim, Forgotten, Record, StepId, StepRecorded, StoreError, StoreErrorKind, StoreKey, Token,
};
use tower_idempotency::{MemoryStore, Store};

const MIB: usize = 1024 * 1024;
/// The default bounds, as the module docs state them.
const MAX_BYTES: usize = 64 * MIB;
const MAX_ENTRIES: usize = 100_000;
/// The engine's default lease and retention.
const LEASE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 60 * 60);

fn key(scope: u32, id: u64) -> StoreKey {
    let mut s = [0u8; 32];
    s[..4].copy_from_slice(&scope.to_le_bytes());
    s[31] = 0x57;
    let mut k = [0u8; 32];
    k[..8].copy_from_slice(&id.to_le_bytes());
    k[8..12].copy_from_slice(&scope.to_le_bytes());
    k[31] = 0x5e;
    StoreKey::from_parts(s, k)
}

fn fp(n: u64) -> Fingerprint {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&n.to_le_bytes());
    Fingerprint::from_bytes(b)
}

fn step(n: u32) -> StepId {
    let mut b = [0u8; 32];
    b[..4].copy_from_slice(&n.to_le_bytes());
    StepId::from_bytes(b)
}

async fn claimed(s: &impl Store, k: &StoreKey) -> Token {
    match s.claim(k, &fp(1), LEASE).await.unwrap() {
        Claim::Claimed(t) => t,
        other => panic!("expected a claim, got {other:?}"),
    }
}

/// Both bounds hold for records and steps together.
fn within_bounds(stats: &MemoryStats) {
    assert!(
        stats.bytes + stats.step_bytes <= MAX_BYTES,
        "records' {} bytes and steps' {} bytes exceed max_bytes together",
        stats.bytes,
        stats.step_bytes
    );
    assert!(
        stats.entries + stats.steps <= MAX_ENTRIES,
        "{} records and {} steps exceed max_entries together",
        stats.entries,
        stats.steps
    );
}

/// A memory store that counts the step operations it refused.
struct Counted {
    inner: MemoryStore,
    refused: AtomicUsize,
}

impl Counted {
    fn count<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(e) = &r {
            eprintln!("refused: {e}");
            self.refused.fetch_add(1, SeqCst);
        }
        r
    }
}

impl Store for Counted {
    async fn claim(
        &self,
        key: &StoreKey,
        fp: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.inner.claim(key, fp, lease).await
    }
    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fp: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.complete(key, token, fp, record, retention).await
    }
    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.inner.release(key, token).await
    }
    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        self.inner.forget(key, pending).await
    }
    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        self.count(self.inner.record_step(key, step, value, retention).await)
    }
    async fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.count(self.inner.prepare_step(key, token, lease).await)
    }
    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        self.inner.steps(key).await
    }
}

/// A day of ordinary traffic through the engine, with the default engine and store settings:
/// 36 requests a minute (about 1.5 steps a second), each claimed, running two or three steps,
/// and completed. One in ten answers a 5xx after its steps: it is released and retried a
/// second later, and the retry answers every step from its record. The clock moves a minute at
/// a time.
#[tokio::test(start_paused = true)]
async fn a_day_of_traffic_with_the_defaults_records_every_step_and_frees_them() {
    const PER_MINUTE: u64 = 36;
    let engine = Engine::new(Counted {
        inner: MemoryStore::new(),
        refused: AtomicUsize::new(0),
    });
    let ran = Arc::new(AtomicU64::new(0));
    let (mut steps_total, mut retried, mut retried_late) = (0u64, 0u64, 0u64);
    let minutes = DAY.as_secs() / 60;
    for minute in 0..minutes {
        let mut failed = Vec::new();
        for i in 0..PER_MINUTE {
            let n = minute * PER_MINUTE + i;
            let k = key(u32::try_from(n % 8).unwrap(), n);
            let f = fp(n);
            let count = 2 + n % 2;
            let Begin::Run(ticket) = engine.begin(k, f).await.unwrap() else {
                panic!("a fresh key runs");
            };
            let steps = engine.steps(&ticket);
            for s in 0..count {
                let ran = ran.clone();
                let got: String = steps
                    .run(&format!("step-{s}"), Raw, |derived| async move {
                        ran.fetch_add(1, SeqCst);
                        Ok::<_, ()>(format!("{derived}:{s}:{n:0>160}"))
                    })
                    .await
                    .unwrap();
                assert!(got.ends_with(&format!("{n:0>160}")));
            }
            steps_total += count;
            if n % 10 == 3 {
                // The handler answered 5xx after its steps: the key is released for a retry.
                assert!(engine.release(ticket).await.unwrap());
                failed.push((k, f, count));
            } else {
                let body = Some(Bytes::from(format!("{{\"order\":{n}}}")));
                assert!(
                    engine
                        .complete(ticket, &Recorded::new(201, vec![], body))
                        .await
                        .unwrap()
                );
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        for (k, f, count) in failed {
            let before = ran.load(SeqCst);
            let Begin::Run(ticket) = engine.begin(k, f).await.unwrap() else {
                panic!("a released key runs again");
            };
            let steps = engine.steps(&ticket);
            for s in 0..count {
                let _: String = steps
                    .run(&format!("step-{s}"), Raw, |_| async {
                        Ok::<_, ()>(String::from("ran twice"))
                    })
                    .await
                    .unwrap();
            }
            assert_eq!(
                ran.load(SeqCst),
                before,
                "minute {minute}: a retry after a 5xx answers its steps from their records"
            );
            assert!(
                engine
                    .complete(ticket, &Recorded::new(201, vec![], None))
                    .await
                    .unwrap()
            );
            retried += 1;
            if minute >= minutes - 60 {
                retried_late += 1;
            }
        }
        let stats = engine.store().inner.stats();
        within_bounds(&stats);
        assert_eq!(
            (stats.steps, stats.step_bytes),
            (0, 0),
            "minute {minute}: every key has completed, so no step is held"
        );
        assert_eq!(
            engine.store().refused.load(SeqCst),
            0,
            "minute {minute}: no step was refused"
        );
        tokio::time::advance(Duration::from_secs(59)).await;
    }
    let stats = engine.store().inner.stats();
    assert_eq!(
        ran.load(SeqCst),
        steps_total,
        "each step ran once over the day"
    );
    assert_eq!(
        steps_total, 129_600,
        "more steps than max_entries within one retention"
    );
    assert_eq!((retried, retried_late), (5_184, 216));
    assert_eq!(
        stats.early_drops, 0,
        "no record was dropped early at this rate"
    );
    assert_eq!(
        stats.entries, 51_840,
        "one completed record per request, nothing else"
    );
}

/// A completed key's steps are freed when its record is written: the record answers every
/// repeat.
#[tokio::test(start_paused = true)]
async fn complete_frees_the_keys_steps() {
    let s = MemoryStore::new();
    let k = key(1, 1);
    let t = claimed(&s, &k).await;
    for n in 0..3 {
        assert!(s.prepare_step(&k, &t, LEASE).await.unwrap());
        let v = Bytes::from(vec![7; 1000]);
        s.record_step(&k, &step(n), v, DAY + LEASE).await.unwrap();
    }
    let held = s.stats();
    assert_eq!(held.steps, 3);
    assert_eq!(held.step_bytes, 3 * (1000 + 96));
    let record = Record::from_bytes(Bytes::from_static(b"the response"));
    assert!(s.complete(&k, &t, &fp(1), record, DAY).await.unwrap());
    let after = s.stats();
    assert_eq!((after.steps, after.step_bytes), (0, 0));
    assert_eq!(after.entries, 1);
    assert_eq!(after.bytes, 160 + 12, "the record alone is counted");
    assert!(s.steps(&k).await.unwrap().is_empty());
}

/// Before a step's work runs, its room is checked: a scope whose pending claim's steps (never
/// dropped) fill its pending share, a tenth of the store by default, is refused the next step
/// before it acts, while another scope's pending claim still records steps. The lease of the
/// step's own claim is renewed, and a token that does not hold the key gets `false`.
#[tokio::test(start_paused = true)]
async fn prepare_step_renews_the_claim_and_refuses_a_step_with_no_room_before_it_acts() {
    let s = MemoryStore::new();
    let other = key(2, 1);
    let other_token = claimed(&s, &other).await;
    let k = key(1, 1);
    let t = claimed(&s, &k).await;

    tokio::time::advance(Duration::from_secs(50)).await;
    assert!(s.prepare_step(&k, &t, LEASE).await.unwrap());
    assert!(s.renew(&other, &other_token, LEASE).await.unwrap());
    assert!(
        !s.prepare_step(&k, &other_token, LEASE).await.unwrap(),
        "another claim's token does not hold the key"
    );
    tokio::time::advance(Duration::from_secs(50)).await;
    assert_eq!(
        s.lease_left(&k).await.unwrap(),
        Some(Duration::from_secs(10)),
        "the lease was renewed for 60 s from the prepare"
    );
    assert!(s.renew(&other, &other_token, LEASE).await.unwrap());

    // The scope fills its pending share with its pending claim's steps, smaller ones once a
    // large one no longer fits, until not even a step's fixed overhead has room.
    let mut size = MIB;
    let mut n = 0u32;
    loop {
        match s.prepare_step(&k, &t, LEASE).await {
            Ok(true) => {}
            Ok(false) => panic!("the claim holds the key"),
            Err(e) => {
                assert_eq!(e.kind(), StoreErrorKind::ScopeFull, "{e}");
                break;
            }
        }
        let value = Bytes::from(vec![7u8; size]);
        match s.record_step(&k, &step(n), value, DAY + LEASE).await {
            Ok(recorded) => {
                assert_eq!(recorded, StepRecorded::Recorded);
                n += 1;
            }
            Err(e) => {
                assert_eq!(e.kind(), StoreErrorKind::ScopeFull, "{e}");
                assert!(size > 0, "a prepared step of no value has room");
                size /= 2;
            }
        }
        within_bounds(&s.stats());
    }
    let full = s.stats();
    // Of 6.4 MiB (a tenth of 64 MiB), the claim's entry counts 160 bytes and each step 96
    // more than its value: 6 steps of 1 MiB, then halves.
    let share = MAX_BYTES / 10;
    let held = full.step_bytes + 160;
    assert!(n >= 6, "{n} steps fit the share");
    assert!(
        held <= share && held > share - 96 - 160,
        "the scope holds its share, {held} of {share} bytes"
    );
    // The other scope is not refused: most of the store is free.
    assert!(s.prepare_step(&other, &other_token, LEASE).await.unwrap());
    s.record_step(&other, &step(0), Bytes::from(vec![1u8; MIB]), DAY + LEASE)
        .await
        .unwrap();
    assert_eq!(
        s.steps(&k).await.unwrap().len(),
        usize::try_from(n).unwrap()
    );
    assert_eq!(
        s.stats().early_drops,
        0,
        "a pending claim's steps are never dropped"
    );
}

/// One scope filling the store with the steps of its released keys does not make another
/// scope's claims or steps be refused: room comes from the heaviest scope, its oldest first.
/// The bounds hold for records and steps together at every instant.
#[tokio::test(start_paused = true)]
async fn one_scopes_steps_leave_room_for_another_scopes_claims_and_steps() {
    let s = MemoryStore::new();
    let value = Bytes::from(vec![1u8; 64 * 1024]);
    let heavy = 1_100u64;
    for n in 0..heavy {
        let k = key(1, n);
        let t = claimed(&s, &k).await;
        assert!(s.prepare_step(&k, &t, LEASE).await.unwrap(), "key {n}");
        let recorded = s
            .record_step(&k, &step(0), value.clone(), DAY + LEASE)
            .await;
        assert_eq!(recorded.unwrap(), StepRecorded::Recorded, "key {n}");
        assert!(s.release(&k, &t).await.unwrap());
        within_bounds(&s.stats());
    }
    let full = s.stats();
    assert!(
        full.step_bytes + full.bytes > MAX_BYTES - 128 * 1024,
        "the store is full"
    );
    let dropped = full.early_drops;
    assert!(dropped > 0, "the scope made room from its own oldest steps");

    for n in 0..50 {
        let k = key(2, n);
        let t = claimed(&s, &k).await;
        assert!(s.prepare_step(&k, &t, LEASE).await.unwrap());
        let recorded = s
            .record_step(&k, &step(0), value.clone(), DAY + LEASE)
            .await;
        assert_eq!(recorded.unwrap(), StepRecorded::Recorded);
        let record = Record::from_bytes(value.clone());
        assert!(s.complete(&k, &t, &fp(1), record, DAY).await.unwrap());
        within_bounds(&s.stats());
    }
    let stats = s.stats();
    assert_eq!(stats.store_full_refusals + stats.scope_full_refusals, 0);
    assert!(stats.early_drops > dropped, "the heavy scope gave the room");
    for n in 0..50 {
        assert!(
            matches!(
                s.claim(&key(2, n), &fp(1), LEASE).await.unwrap(),
                Claim::Done { .. }
            ),
            "the light scope's records are kept"
        );
    }
    assert_eq!(
        s.steps(&key(1, heavy - 1)).await.unwrap().len(),
        1,
        "the heavy scope's newest steps are kept"
    );
}

/// Records and steps share one byte budget: a probe of records and steps of several scopes
/// never holds more than `max_bytes` of the two together.
#[tokio::test(start_paused = true)]
async fn records_and_steps_share_one_byte_bound() {
    let s = MemoryStore::new();
    let value = Bytes::from(vec![3u8; 300 * 1024]);
    for n in 0..600u64 {
        let scope = u32::try_from(n % 4).unwrap();
        let k = key(scope, n);
        let t = claimed(&s, &k).await;
        if n % 2 == 0 {
            let record = Record::from_bytes(value.clone());
            assert!(s.complete(&k, &t, &fp(1), record, DAY).await.unwrap());
        } else {
            assert!(s.prepare_step(&k, &t, LEASE).await.unwrap());
            s.record_step(&k, &step(0), value.clone(), DAY + LEASE)
                .await
                .unwrap();
            assert!(s.release(&k, &t).await.unwrap());
        }
        within_bounds(&s.stats());
    }
    let stats = s.stats();
    assert!(stats.bytes > 16 * MIB && stats.step_bytes > 16 * MIB);
}

fn manual() -> (MemoryStore, ManualClock) {
    let clock = ManualClock::new();
    let s = MemoryStore::builder().clock(clock.clone()).build().unwrap();
    (s, clock)
}

/// While a pending claim holds its key, its steps do not expire: not with a retention shorter
/// than the lease, nor after a long gap between steps. Once its lease lapses they are kept for
/// their retention after it.
#[tokio::test]
async fn a_pending_claims_steps_outlive_a_short_retention_and_its_lapse() {
    let (s, clock) = manual();
    let k = key(1, 1);
    let t = claimed(&s, &k).await;
    let v = Bytes::from_static(b"charged");
    s.record_step(&k, &step(0), v.clone(), Duration::from_secs(10))
        .await
        .unwrap();
    clock.advance(Duration::from_secs(50));
    assert_eq!(
        s.steps(&k).await.unwrap(),
        vec![(step(0), v.clone())],
        "kept while the claim is pending"
    );
    clock.advance(Duration::from_secs(19)); // 69 s: the lease lapsed at 60 s
    assert_eq!(
        s.steps(&k).await.unwrap(),
        vec![(step(0), v.clone())],
        "kept for their retention after the lapse"
    );
    assert!(!s.renew(&k, &t, LEASE).await.unwrap(), "the lease lapsed");
    let again = claimed(&s, &k).await;
    assert_eq!(
        s.steps(&k).await.unwrap(),
        vec![(step(0), v)],
        "the next claimant reads them"
    );
    assert!(s.release(&k, &again).await.unwrap());
    clock.advance(Duration::from_secs(11));
    assert!(s.steps(&k).await.unwrap().is_empty(), "then they expire");
    assert_eq!(s.stats().steps, 0);
}

/// A released key keeps its steps for their retention from the release, not from the step.
#[tokio::test]
async fn a_released_keys_steps_are_kept_for_their_retention_after_the_release() {
    let (s, clock) = manual();
    let k = key(1, 1);
    let t = claimed(&s, &k).await;
    let v = Bytes::from_static(b"reserved");
    let retention = Duration::from_secs(100);
    s.record_step(&k, &step(0), v.clone(), retention)
        .await
        .unwrap();
    clock.advance(Duration::from_secs(50));
    assert!(s.renew(&k, &t, LEASE).await.unwrap());
    clock.advance(Duration::from_secs(40));
    assert!(s.release(&k, &t).await.unwrap());
    clock.advance(Duration::from_secs(99)); // 189 s: 89 s past the step's own retention
    assert_eq!(s.steps(&k).await.unwrap(), vec![(step(0), v)]);
    clock.advance(Duration::from_secs(2));
    assert!(s.steps(&k).await.unwrap().is_empty());
}
