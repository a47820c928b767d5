//! What every door counts, through the [`metrics`](https://docs.rs/metrics) facade, with
//! feature `metrics`. Without the feature every type here is zero-sized and every function
//! empty. So the calls compile to nothing.
//!
//! A door counts each request once, with one call: [`request`]`(Door::X, Outcome::Y)`. The
//! layer may use its cached [`DoorCounters`] instead, which carry its static labels without an
//! allocation per event. It counts each claimed key's end once with [`settled`]. The engine
//! times every store operation with [`StoreTimer`]. The names and labels are documented in one
//! table, in the crate docs under `# Metrics`. Change both together.
//!
//! Never use a key, principal, path or other unbounded value as a label. Each label below
//! takes values from a fixed list, and the layer's own labels are fixed when it is built.

// Without the feature the names and label lists are unused: the functions are empty.
#![cfg_attr(not(feature = "metrics"), allow(dead_code))]

use crate::store::{StoreError, StoreErrorKind};

/// `idempotency_requests_total{door, outcome}`: keyed or key-checked requests by outcome.
pub(crate) const REQUESTS: &str = "idempotency_requests_total";
/// `idempotency_results_total{door, result}`: how each claimed key ended.
pub(crate) const RESULTS: &str = "idempotency_results_total";
/// `idempotency_store_duration_seconds{store, op, result}`: one store operation.
pub(crate) const STORE_DURATION: &str = "idempotency_store_duration_seconds";
/// `idempotency_steps_total{result}`: each step of a request's work, by what it did.
pub(crate) const STEPS: &str = "idempotency_steps_total";

/// What one step did: the `result` label of `idempotency_steps_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepResult {
    /// The step ran and its result was recorded.
    Ran,
    /// The step was answered from its record, not run.
    Replayed,
    /// The step ran, but an overlapping run had recorded it first. Its record was kept.
    Overlapped,
    /// The step ran and its result could not be recorded.
    RecordFailed,
}

impl StepResult {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::Replayed => "replayed",
            Self::Overlapped => "overlapped",
            Self::RecordFailed => "record_failed",
        }
    }
}

/// The way in: the `door` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    /// `IdempotencyLayer` on an HTTP request.
    Http,
    /// `IdempotencyLayer` on a gRPC request.
    Grpc,
    /// An `#[idempotent]` handler, from `IdempotentRoutes`.
    #[cfg_attr(not(feature = "macros"), allow(dead_code))]
    Route,
    /// The axum extractors. They count their own refusals only; the layer counts the request.
    #[cfg_attr(not(feature = "axum"), allow(dead_code))]
    Extract,
    /// The transactional door, `transactional::within`.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Within,
    /// The queue consumers' door, `message`.
    Message,
    /// The send-once door, `outbound`.
    Outbound,
    /// A sender's verified deliveries, `webhook`.
    #[cfg_attr(not(feature = "webhook"), allow(dead_code))]
    Webhook,
}

impl Door {
    const ALL: [Self; 8] = [
        Self::Http,
        Self::Grpc,
        Self::Route,
        Self::Extract,
        Self::Within,
        Self::Message,
        Self::Outbound,
        Self::Webhook,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Http => "http",
            Self::Grpc => "grpc",
            Self::Route => "route",
            Self::Extract => "extract",
            Self::Within => "within",
            Self::Message => "message",
            Self::Outbound => "outbound",
            Self::Webhook => "webhook",
        }
    }
}

/// What a door did with a request: the `outcome` label. Counted once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Claimed: the work runs ([`Begin::Run`](crate::engine::Begin::Run)).
    Ran,
    /// Answered from the record.
    Replayed,
    /// The same request holds the key and runs. HTTP answers 409.
    InFlight,
    /// The key was used for another request. HTTP answers 422.
    KeyReused,
    KeyMissing,
    KeyInvalid,
    PrincipalMissing,
    BodyTooLarge,
    BodyUnreadable,
    /// The store failed or timed out; the work did not run.
    StoreFailed,
    /// The store was down and the route fails open: the work ran without a claim, nothing
    /// recorded.
    RanUnclaimed,
    ScopeFull,
    StoreFull,
    /// A record failed validation and was not replayed.
    RecordInvalid,
    /// Passed on, not claimed: no key and none required, or claimed by an outer layer.
    Untracked,
    /// A wiring error, answered 500: no `IdempotentRoutes`, or an extractor without the layer.
    ConfigMissing,
    /// A webhook delivery whose signature or signed timestamp failed: refused, nothing claimed.
    #[cfg_attr(not(feature = "webhook"), allow(dead_code))]
    Unverified,
}

impl Outcome {
    const ALL: [Self; 17] = [
        Self::Ran,
        Self::Replayed,
        Self::InFlight,
        Self::KeyReused,
        Self::KeyMissing,
        Self::KeyInvalid,
        Self::PrincipalMissing,
        Self::BodyTooLarge,
        Self::BodyUnreadable,
        Self::StoreFailed,
        Self::RanUnclaimed,
        Self::ScopeFull,
        Self::StoreFull,
        Self::RecordInvalid,
        Self::Untracked,
        Self::ConfigMissing,
        Self::Unverified,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Ran => "ran",
            Self::Replayed => "replayed",
            Self::InFlight => "in_flight",
            Self::KeyReused => "key_reused",
            Self::KeyMissing => "key_missing",
            Self::KeyInvalid => "key_invalid",
            Self::PrincipalMissing => "principal_missing",
            Self::BodyTooLarge => "body_too_large",
            Self::BodyUnreadable => "body_unreadable",
            Self::StoreFailed => "store_failed",
            Self::RanUnclaimed => "ran_unclaimed",
            Self::ScopeFull => "scope_full",
            Self::StoreFull => "store_full",
            Self::RecordInvalid => "record_invalid",
            Self::Untracked => "untracked",
            Self::ConfigMissing => "config_missing",
            Self::Unverified => "unverified",
        }
    }

    /// The outcome of a store error met while claiming.
    pub(crate) fn of_store_error(e: &StoreError) -> Self {
        match e.kind() {
            StoreErrorKind::ScopeFull => Self::ScopeFull,
            StoreErrorKind::StoreFull => Self::StoreFull,
            _ => Self::StoreFailed,
        }
    }
}

/// How a claimed key ended: the `result` label. Counted once per `Ran` request, by
/// [`Engine::settle`](crate::engine::Engine::settle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The record was stored.
    Completed,
    /// The key was freed. A retry runs again.
    Released,
    /// Storing the record failed: the key stays pending until its lease lapses.
    CompleteFailed,
    /// Freeing the key failed: it stays pending until its lease lapses.
    ReleaseFailed,
    /// The lease had lapsed and another claimant held the key: the record was not stored, or
    /// the key not held.
    LeaseLost,
    /// The response was dropped before its body ended, as the client went away. Nothing settled.
    Abandoned,
    /// The verdict was `Hold`: the claim is renewed for the hold time, and repeats meanwhile
    /// are answered in flight. Every door may end so.
    Held,
    /// Renewing the claim for the hold failed: it stays pending until its current lease lapses.
    HoldFailed,
}

impl Settled {
    const ALL: [Self; 8] = [
        Self::Completed,
        Self::Released,
        Self::CompleteFailed,
        Self::ReleaseFailed,
        Self::LeaseLost,
        Self::Abandoned,
        Self::Held,
        Self::HoldFailed,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Released => "released",
            Self::CompleteFailed => "complete_failed",
            Self::ReleaseFailed => "release_failed",
            Self::LeaseLost => "lease_lost",
            Self::Abandoned => "abandoned",
            Self::Held => "held",
            Self::HoldFailed => "hold_failed",
        }
    }

    /// The end of `complete`'s answer.
    pub(crate) fn of_complete(res: &Result<bool, StoreError>) -> Self {
        match res {
            Ok(true) => Self::Completed,
            Ok(false) => Self::LeaseLost,
            Err(_) => Self::CompleteFailed,
        }
    }

    /// The end of `release`'s answer. A ticket that no longer held the key was released all the
    /// same: nothing of it is left.
    pub(crate) fn of_release(res: &Result<bool, StoreError>) -> Self {
        match res {
            Ok(_) => Self::Released,
            Err(_) => Self::ReleaseFailed,
        }
    }
}

/// A store operation: the `op` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Claim,
    Complete,
    Release,
    Renew,
    /// A key's recorded steps read.
    Steps,
    /// One step recorded.
    RecordStep,
}

impl Op {
    const ALL: [Self; 6] = [
        Self::Claim,
        Self::Complete,
        Self::Release,
        Self::Renew,
        Self::Steps,
        Self::RecordStep,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Claim => "claim",
            Self::Complete => "complete",
            Self::Release => "release",
            Self::Renew => "renew",
            Self::Steps => "steps",
            Self::RecordStep => "record_step",
        }
    }
}

/// A store operation's `result` label: `ok`, or the error's kind.
const STORE_RESULTS: [&str; 9] = [
    "ok",
    "unavailable",
    "timeout",
    "protocol",
    "store_full",
    "scope_full",
    "conflict",
    "not_replicated",
    "unsupported",
];

fn store_result<T>(res: &Result<T, StoreError>) -> usize {
    match res {
        Ok(_) => 0,
        Err(e) => match e.kind() {
            StoreErrorKind::Unavailable => 1,
            StoreErrorKind::Timeout => 2,
            StoreErrorKind::Protocol => 3,
            StoreErrorKind::StoreFull => 4,
            StoreErrorKind::ScopeFull => 5,
            StoreErrorKind::Conflict => 6,
            StoreErrorKind::NotReplicated => 7,
            StoreErrorKind::Unsupported => 8,
        },
    }
}

/// The label keys a door sets itself. A layer's own label may not reuse them.
pub(crate) const RESERVED_LABELS: [&str; 3] = ["door", "outcome", "result"];

#[cfg(feature = "metrics")]
mod on {
    use super::{
        Door, Op, Outcome, REQUESTS, RESULTS, STORE_DURATION, STORE_RESULTS, Settled, store_result,
    };
    use crate::store::StoreError;
    use metrics::{Key, Label, Level, Metadata};
    use std::sync::{Arc, OnceLock};
    use std::time::Instant;

    static METADATA: Metadata<'static> =
        Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

    fn increment(key: &Key) {
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }

    /// Every door's keys without labels of its own, built on first use.
    fn plain(door: Door) -> &'static Table {
        static TABLES: OnceLock<Vec<Table>> = OnceLock::new();
        &TABLES.get_or_init(|| Door::ALL.iter().map(|d| Table::new(*d, &[])).collect())
            [door as usize]
    }

    /// Counts one request of `door`, with no labels of its own.
    pub(crate) fn request(door: Door, outcome: Outcome) {
        increment(&plain(door).requests[outcome as usize]);
    }

    /// Counts how one claimed key of `door` ended.
    pub(crate) fn settled(door: Door, result: Settled) {
        increment(&plain(door).results[result as usize]);
    }

    /// Counts one step of a request's work.
    pub(crate) fn step(result: super::StepResult) {
        metrics::counter!(super::STEPS, "result" => result.as_str()).increment(1);
    }

    /// One door's metric keys with its labels, built once and retained. Their labels are shared
    /// behind an `Arc`. An event is a lookup by a cached hash. A recorder that keeps the key with
    /// `to_retained` clones an `Arc`, with no allocation.
    #[derive(Debug)]
    struct Table {
        requests: Vec<Key>,
        results: Vec<Key>,
    }

    impl Table {
        fn new(door: Door, extra: &[Label]) -> Self {
            let labels = |name: &'static str, value: &'static str| {
                let mut l = vec![
                    Label::from_static_parts("door", door.as_str()),
                    Label::from_static_parts(name, value),
                ];
                l.extend(extra.iter().cloned());
                l
            };
            Self {
                requests: Outcome::ALL
                    .iter()
                    .map(|o| Key::from_parts(REQUESTS, labels("outcome", o.as_str())).to_retained())
                    .collect(),
                results: Settled::ALL
                    .iter()
                    .map(|s| Key::from_parts(RESULTS, labels("result", s.as_str())).to_retained())
                    .collect(),
            }
        }
    }

    /// The layer's counters, with the layer's static labels. Its door for HTTP requests is
    /// `http`, or `route` for `#[idempotent]`. Its door for gRPC is `grpc`.
    #[derive(Debug, Clone)]
    pub(crate) struct DoorCounters(Arc<(Table, Table, Door, Vec<Label>)>);

    impl DoorCounters {
        pub(crate) fn new(door: Door) -> Self {
            Self::build(door, Vec::new())
        }

        fn build(door: Door, extra: Vec<Label>) -> Self {
            Self(Arc::new((
                Table::new(door, &extra),
                Table::new(Door::Grpc, &extra),
                door,
                extra,
            )))
        }

        /// The same counters for another door.
        #[cfg_attr(not(any(feature = "macros", feature = "webhook")), allow(dead_code))]
        pub(crate) fn with_door(&self, door: Door) -> Self {
            Self::build(door, self.0.3.clone())
        }

        /// The same counters with one more static label. It replaces one of the same key.
        pub(crate) fn with_label(&self, key: &'static str, value: String) -> Self {
            let mut extra = self.0.3.clone();
            extra.retain(|l| l.key() != key);
            extra.push(Label::new(key, value));
            Self::build(self.0.2, extra)
        }

        fn table(&self, grpc: bool) -> &Table {
            if grpc { &self.0.1 } else { &self.0.0 }
        }

        /// The door of its HTTP requests.
        pub(crate) fn door(&self) -> Door {
            self.0.2
        }

        pub(crate) fn request(&self, grpc: bool, outcome: Outcome) {
            increment(&self.table(grpc).requests[outcome as usize]);
        }

        pub(crate) fn settled(&self, grpc: bool, result: Settled) {
            increment(&self.table(grpc).results[result as usize]);
        }
    }

    /// Times an engine's store operations, with the store's name. The keys are built once per engine.
    #[derive(Debug, Clone)]
    pub(crate) struct Timer(Arc<Vec<Key>>);

    impl Timer {
        pub(crate) fn new(store: &'static str) -> Self {
            let keys = Op::ALL
                .iter()
                .flat_map(|op| {
                    STORE_RESULTS.iter().map(move |result| {
                        Key::from_parts(
                            STORE_DURATION,
                            vec![
                                Label::from_static_parts("store", store),
                                Label::from_static_parts("op", op.as_str()),
                                Label::from_static_parts("result", result),
                            ],
                        )
                        .to_retained()
                    })
                })
                .collect();
            Self(Arc::new(keys))
        }

        pub(crate) fn record<T>(&self, op: Op, started: Clock, res: &Result<T, StoreError>) {
            let key = &self.0[op as usize * STORE_RESULTS.len() + store_result(res)];
            let secs = started.0.elapsed().as_secs_f64();
            metrics::with_recorder(|r| r.register_histogram(key, &METADATA).record(secs));
        }
    }

    /// When a store operation started.
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Clock(Instant);

    impl Clock {
        pub(crate) fn now() -> Self {
            Self(Instant::now())
        }
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::unused_self)]
mod on {
    use super::{Door, Op, Outcome, Settled};
    use crate::store::StoreError;

    #[inline(always)]
    pub(crate) fn request(_: Door, _: Outcome) {}

    #[inline(always)]
    pub(crate) fn settled(_: Door, _: Settled) {}

    #[inline(always)]
    pub(crate) fn step(_: super::StepResult) {}

    /// Only the door, which the settle event names.
    #[derive(Debug, Clone)]
    pub(crate) struct DoorCounters(Door);

    impl DoorCounters {
        #[inline(always)]
        pub(crate) fn new(door: Door) -> Self {
            Self(door)
        }
        #[inline(always)]
        pub(crate) fn with_door(&self, door: Door) -> Self {
            Self(door)
        }
        #[inline(always)]
        pub(crate) fn with_label(&self, _: &'static str, _: String) -> Self {
            Self(self.0)
        }
        #[inline(always)]
        pub(crate) fn door(&self) -> Door {
            self.0
        }
        #[inline(always)]
        pub(crate) fn request(&self, _: bool, _: Outcome) {}
        #[inline(always)]
        pub(crate) fn settled(&self, _: bool, _: Settled) {}
    }

    #[derive(Debug, Clone)]
    pub(crate) struct Timer;

    impl Timer {
        #[inline(always)]
        pub(crate) fn new(_: &'static str) -> Self {
            Self
        }
        #[inline(always)]
        pub(crate) fn record<T>(&self, _: Op, _: Clock, _: &Result<T, StoreError>) {}
    }

    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Clock;

    impl Clock {
        #[inline(always)]
        pub(crate) fn now() -> Self {
            Self
        }
    }
}

// `request` and `settled` are the one-call API for a door without a layer (the extractors,
// `within`, and the queue and send-once doors to come).
#[allow(unused_imports)]
pub(crate) use on::{DoorCounters, settled, step};

/// Counts a request's outcome, and names it on the door's span when it runs in one.
pub(crate) fn request(door: Door, outcome: Outcome) {
    on::request(door, outcome);
    crate::trace::record_on_door("outcome", outcome.as_str());
}

/// Times an engine's store operations (with feature `metrics`) and traces each in a span of
/// its own, a child of the door's span, at the engine's span level.
#[derive(Debug, Clone)]
pub(crate) struct StoreTimer {
    timer: on::Timer,
    store: &'static str,
    level: tracing::Level,
}

impl StoreTimer {
    pub(crate) fn new(store: &'static str, level: tracing::Level) -> Self {
        Self {
            timer: on::Timer::new(store),
            store,
            level,
        }
    }

    pub(crate) fn level(&self) -> tracing::Level {
        self.level
    }

    pub(crate) fn set_level(&mut self, level: tracing::Level) {
        self.level = level;
    }

    /// Starts a store operation: its clock and its span. The span is not entered, as it lives
    /// across awaits; it closes when [`record`](Self::record) takes it, which times it.
    pub(crate) fn start(&self, op: Op) -> Started {
        Started {
            clock: on::Clock::now(),
            span: crate::trace::store_span(self.level, self.store, op.as_str()),
        }
    }

    /// Ends a store operation: its duration, and its result on its span.
    pub(crate) fn record<T>(&self, op: Op, started: Started, res: &Result<T, StoreError>) {
        if res.is_err() {
            // OpenTelemetry's `error.type`: the store error's kind, the metric's `result`.
            started
                .span
                .record("error.type", STORE_RESULTS[store_result(res)]);
        }
        self.timer.record(op, started.clock, res);
    }
}

/// A store operation under way: when it started, and its span.
#[derive(Debug)]
pub(crate) struct Started {
    clock: on::Clock,
    span: tracing::Span,
}

#[cfg(test)]
mod tests {
    use super::{Door, Op, Outcome, Settled};

    /// The key tables are indexed by discriminant: each `ALL` lists its enum in order, once.
    #[test]
    fn each_list_is_in_discriminant_order() {
        assert!(Door::ALL.iter().enumerate().all(|(i, d)| *d as usize == i));
        assert!(
            Outcome::ALL
                .iter()
                .enumerate()
                .all(|(i, o)| *o as usize == i)
        );
        assert!(
            Settled::ALL
                .iter()
                .enumerate()
                .all(|(i, s)| *s as usize == i)
        );
        assert!(Op::ALL.iter().enumerate().all(|(i, o)| *o as usize == i));
    }

    /// Label values are fixed words an operator can type in a query.
    #[test]
    fn label_values_are_snake_case_words() {
        let values = Door::ALL
            .iter()
            .map(|d| d.as_str())
            .chain(Outcome::ALL.iter().map(|o| o.as_str()))
            .chain(Settled::ALL.iter().map(|s| s.as_str()))
            .chain(Op::ALL.iter().map(|o| o.as_str()));
        for v in values {
            assert!(
                !v.is_empty() && v.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{v}"
            );
        }
    }
}
