//! The client's one counter, through the [`metrics`](https://docs.rs/metrics) facade (feature
//! `metrics`). Without the feature the call compiles to nothing.

/// `idempotency_client_attempts_total{decision}`: each attempt, by what followed it.
#[cfg(feature = "metrics")]
const ATTEMPTS: &str = "idempotency_client_attempts_total";

/// Counts one attempt: `retry`, or the reason the attempts stopped.
#[cfg(feature = "metrics")]
pub(crate) fn attempt(decision: &'static str) {
    metrics::counter!(ATTEMPTS, "decision" => decision).increment(1);
}

/// Counts one attempt: nothing without the feature `metrics`.
#[cfg(not(feature = "metrics"))]
#[inline(always)]
pub(crate) fn attempt(_: &'static str) {}
