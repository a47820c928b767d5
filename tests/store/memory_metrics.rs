//! Feature `metrics`: the memory stores' gauges and early-drop counter, read back from
//! `metrics-util`'s debugging recorder. Two stores in one process add up; neither overwrites
//! the other's figures.
#![cfg(feature = "metrics")]
#![allow(clippy::unwrap_used)]

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use std::collections::BTreeMap;
use tower_idempotency::conformance::{LONG, fingerprint, random_key, record};
use tower_idempotency::store::{Claim, MemoryStore, Store};

/// Every memory metric by name, as it stands: the recorder's snapshot hands each value over
/// once (and starts again from zero), so the figures are summed over the snapshots seen.
struct Seen(Snapshotter, BTreeMap<String, f64>);

impl Seen {
    fn now(&mut self) -> &BTreeMap<String, f64> {
        for (ck, _, _, v) in self.0.snapshot().into_vec() {
            let name = ck.key().name();
            if !name.starts_with("idempotency_memory_") {
                continue;
            }
            let v = match v {
                DebugValue::Gauge(g) => g.into_inner(),
                #[allow(clippy::cast_precision_loss)]
                DebugValue::Counter(n) => n as f64,
                DebugValue::Histogram(_) => f64::NAN,
            };
            *self.1.entry(name.to_owned()).or_default() += v;
        }
        &self.1
    }
}

/// Claims and completes a fresh key.
async fn complete_one(store: &MemoryStore) {
    let key = random_key();
    let Claim::Claimed(token) = store.claim(&key, &fingerprint("a"), LONG).await.unwrap() else {
        panic!("a fresh key is claimed");
    };
    assert!(
        store
            .complete(&key, &token, &fingerprint("a"), record("a"), LONG)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn two_memory_stores_add_up_and_the_drop_counter_never_goes_back() {
    let recorder = DebuggingRecorder::new();
    let mut metrics = Seen(recorder.snapshotter(), BTreeMap::new());
    let _local = metrics::set_default_local_recorder(&recorder);

    // A holds one record at a time: its second record drops the first early.
    let a = MemoryStore::builder().max_entries(1).build().unwrap();
    let b = MemoryStore::new();
    complete_one(&a).await;
    complete_one(&a).await;
    for _ in 0..3 {
        complete_one(&b).await;
    }
    let (sa, sb) = (a.stats(), b.stats());
    assert_eq!((sa.entries, sa.early_drops), (1, 1), "{sa:?}");
    assert_eq!((sb.entries, sb.early_drops), (3, 0), "{sb:?}");

    a.report_metrics();
    b.report_metrics();
    let seen = metrics.now().clone();
    assert_eq!(
        seen["idempotency_memory_entries"], 4.0,
        "both stores: {seen:?}"
    );
    assert_eq!(seen["idempotency_memory_pending"], 0.0);
    #[allow(clippy::cast_precision_loss)]
    let bytes = (sa.bytes + sb.bytes) as f64;
    assert_eq!(seen["idempotency_memory_bytes"], bytes);
    assert_eq!(
        seen["idempotency_memory_early_drops_total"], 1.0,
        "B's report keeps A's drop: {seen:?}"
    );

    // B drops a record early too: the counter counts both.
    let c = MemoryStore::builder().max_entries(1).build().unwrap();
    complete_one(&c).await;
    complete_one(&c).await;
    a.report_metrics();
    c.report_metrics();
    a.report_metrics();
    let seen = metrics.now().clone();
    assert_eq!(
        seen["idempotency_memory_early_drops_total"], 2.0,
        "{seen:?}"
    );
    assert_eq!(seen["idempotency_memory_entries"], 5.0, "{seen:?}");

    // A store that goes takes its figures with it; its drops stay counted.
    drop(c);
    let seen = metrics.now().clone();
    assert_eq!(seen["idempotency_memory_entries"], 4.0, "{seen:?}");
    assert_eq!(
        seen["idempotency_memory_early_drops_total"], 2.0,
        "{seen:?}"
    );
}
