//! Reading the crate's counters back from `metrics-util`'s debugging recorder.

use metrics_util::debugging::{DebugValue, Snapshotter};

/// The request and result counters (`idempotency_requests_total`,
/// `idempotency_results_total`) that moved by exactly one since the last snapshot, each as its
/// labels `key=value` sorted and joined by commas; the list sorted. A snapshot resets what it
/// reads, so each call sees what happened since the previous one.
pub(crate) fn moved_once(snap: &Snapshotter) -> Vec<String> {
    let mut moved: Vec<String> = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(ck, _, _, v)| {
            ck.key().name().starts_with("idempotency_re") && matches!(v, DebugValue::Counter(1))
        })
        .map(|(ck, _, _, _)| {
            let mut labels: Vec<String> = ck
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            labels.join(",")
        })
        .collect();
    moved.sort();
    moved
}
