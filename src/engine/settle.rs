//! Settling a claimed key, for every door: complete, release or hold, by one mechanism.
//!
//! A door maps its result to a [`Verdict`], settles with [`Engine::settle`], and maps the
//! settled verdict to its answer. The store operation is timed here (through the engine), the
//! end is counted once, and one event is logged with its `result`.
//!
//! A hold is the claim renewed for the hold time ([`Engine::hold`]). A repeat meanwhile finds
//! the key claimed and is answered in flight. A crash before the hold lands ends as any crash,
//! the lease lapsing; a hold that landed is in the store and outlives its process. The key's
//! steps are kept for the retry after the hold.

use super::record::Draft;
use super::{Engine, Recorded, Ticket, Verdict};
use crate::metrics::{Door, DoorCounters, Settled};
use crate::store::{Store, StoreError, StoreErrorKind, StoreKey};
use std::time::Duration;

/// How a door settles a claimed key: its verdict, with what the verdict needs.
pub(crate) enum Settle<'a> {
    /// Complete the key with this record.
    Record(Recording<'a>),
    /// Free the key: a retry runs again.
    Release,
    /// Free the key. The door tells its caller that a retry fails the same way.
    Fail,
    /// Keep the claim for this long from now: the work may have had its effect.
    Hold(Duration),
}

impl Settle<'_> {
    /// The verdict settled with.
    pub(crate) fn verdict(&self) -> Verdict {
        match self {
            Self::Record(_) => Verdict::Record,
            Self::Release => Verdict::Release,
            Self::Fail => Verdict::Fail,
            Self::Hold(_) => Verdict::Hold,
        }
    }
}

/// The record a key is completed with.
pub(crate) enum Recording<'a> {
    /// A response, encoded and sealed by the engine.
    Response(&'a Recorded),
    /// A record written straight from a response, as the HTTP layer does.
    Draft(Draft),
}

/// Where a door counts how its keys ended.
#[derive(Clone, Copy)]
pub(crate) enum Tally<'a> {
    /// A door without labels of its own.
    Door(Door),
    /// The HTTP layer's counters, with its static labels; `true` for a gRPC request.
    Layer(&'a DoorCounters, bool),
}

impl Tally<'_> {
    /// Counts one end.
    pub(crate) fn count(self, settled: Settled) {
        match self {
            Self::Door(door) => crate::metrics::settled(door, settled),
            Self::Layer(counters, grpc) => counters.settled(grpc, settled),
        }
        // The door's span names it; a span of the caller's is left as it is.
        crate::trace::record_on_door("result", settled.as_str());
    }

    fn door(self) -> &'static str {
        match self {
            Self::Door(door) => door.as_str(),
            Self::Layer(_, true) => Door::Grpc.as_str(),
            // `http`, or `route` for an `#[idempotent]` handler, as its metrics.
            Self::Layer(counters, false) => counters.door().as_str(),
        }
    }
}

impl<S: Store> Engine<S> {
    /// Settles the claim of `ticket` by the door's verdict: completes it with the record,
    /// releases it (`Release` and `Fail`), or holds it, renewing the claim for the hold time.
    /// Times the store operation, counts the end with `tally` and logs it, once.
    ///
    /// A store fault is logged and counted, never returned: the key then stays pending until
    /// its lease lapses, and the door still answers with its handler's result.
    pub(crate) async fn settle(
        &self,
        ticket: Ticket,
        settle: Settle<'_>,
        tally: Tally<'_>,
    ) -> Settled {
        let key = *ticket.key();
        let door = tally.door();
        let settled = match settle {
            Settle::Record(recording) => {
                let done = match recording {
                    Recording::Response(response) => self.complete(ticket, response).await,
                    Recording::Draft(draft) => {
                        if !draft.dropped().is_empty() {
                            tracing::warn!(door, key = ?key, left_out = ?draft.dropped(), "idempotency record could not be written whole; recorded without the parts that do not fit");
                        }
                        self.complete_draft(ticket, draft).await
                    }
                };
                let settled = Settled::of_complete(&done);
                log(door, &key, settled, done.err().as_ref(), None);
                settled
            }
            Settle::Release | Settle::Fail => {
                let released = self.release(ticket).await;
                let settled = Settled::of_release(&released);
                log(door, &key, settled, released.err().as_ref(), None);
                settled
            }
            Settle::Hold(hold) => {
                let held = self.hold(ticket, hold).await;
                let settled = match &held {
                    Ok(true) => Settled::Held,
                    Ok(false) => Settled::LeaseLost,
                    Err(_) => Settled::HoldFailed,
                };
                log(door, &key, settled, held.err().as_ref(), Some(hold));
                settled
            }
        };
        tally.count(settled);
        settled
    }

    /// How long a request that found `key` in flight should wait before it tries again: the
    /// lease the claim has left, at most a third of the lease; 1 s when nothing pending holds
    /// the key any more (its run just settled) or the store cannot tell; the third when the
    /// store fails. Costs one store call, on this path only.
    ///
    /// The lease left is when the key is decided at the latest if its run has stopped: its
    /// holder is gone, or it is held. A running claim is renewed every third of the lease, so
    /// its lease left (two thirds of the lease or more) says nothing about when it ends; the
    /// cap keeps the wait to one renewal period, so a quick run's repeat does not wait a lease.
    pub(crate) async fn in_flight_retry_after(&self, key: &StoreKey) -> Duration {
        let cap = self.lease() / 3;
        match self.lease_left(key).await {
            Ok(Some(left)) => left.min(cap),
            // The run settled between the repeat's claim and this call (or the store cannot
            // tell): the repeat may come back at once.
            Ok(None) => SETTLED_RETRY.min(cap),
            Err(e) => {
                tracing::debug!(key = ?key, error = %e, "lease left unknown; retry after a third of the lease");
                cap
            }
        }
    }
}

/// The wait of a repeat whose first run has just settled: at once, as a 409's `Retry-After`
/// can say in whole seconds.
const SETTLED_RETRY: Duration = Duration::from_secs(1);
/// The one event of a settled key.
fn log(
    door: &'static str,
    key: &StoreKey,
    settled: Settled,
    error: Option<&StoreError>,
    hold: Option<Duration>,
) {
    let result = settled.as_str();
    match (settled, error) {
        (Settled::Completed, _) => {
            tracing::debug!(door, result, key = ?key, "idempotency record stored");
        }
        (Settled::Released, _) => {
            tracing::debug!(door, result, key = ?key, "idempotency key released");
        }
        (Settled::Held, _) => {
            tracing::info!(door, result, key = ?key, hold = ?hold, "idempotency key held: its claim is kept for the hold time, repeats are answered in flight");
        }
        (Settled::LeaseLost, _) => {
            tracing::warn!(door, result, key = ?key, "idempotency lease lapsed while the work ran and another claimant holds the key; left to it");
        }
        (Settled::CompleteFailed, Some(e)) if e.kind() == StoreErrorKind::NotReplicated => {
            tracing::warn!(door, result, key = ?key, error = %e, "idempotency record stored on the primary, but fewer replicas than asked acknowledged it; repeats replay it, unless a failover loses it first");
        }
        (_, e) => {
            tracing::warn!(door, result, key = ?key, error = e.map(tracing::field::display), "idempotency key not settled; it stays pending until its lease lapses");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Recording, Settle, Tally};
    use crate::engine::{Begin, Engine, Fingerprint, Recorded, Scope, Ticket};
    use crate::metrics::{Door, Settled};
    use crate::store::clock::ManualClock;
    use crate::store::{
        Claim, Forgotten, Record, Store, StoreError, StoreErrorKind, StoreKey, Token,
    };
    use crate::{IdempotencyKey, MemoryStore};
    use std::future::Future;
    use std::time::Duration;

    const LEASE: Duration = Duration::from_secs(30);
    const TALLY: Tally<'static> = Tally::Door(Door::Message);

    /// A memory store whose settling operations fail, as a store that went down after the claim.
    struct Down(MemoryStore);

    fn down() -> StoreError {
        StoreError::new(StoreErrorKind::Unavailable, "down")
    }

    impl Store for Down {
        fn claim(
            &self,
            key: &StoreKey,
            fp: &Fingerprint,
            lease: Duration,
        ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
            self.0.claim(key, fp, lease)
        }
        async fn complete(
            &self,
            _: &StoreKey,
            _: &Token,
            _: &Fingerprint,
            _: Record,
            _: Duration,
        ) -> Result<bool, StoreError> {
            Err(down())
        }
        async fn release(&self, _: &StoreKey, _: &Token) -> Result<bool, StoreError> {
            Err(down())
        }
        async fn renew(&self, _: &StoreKey, _: &Token, _: Duration) -> Result<bool, StoreError> {
            Err(down())
        }
        fn forget(
            &self,
            key: &StoreKey,
            pending: bool,
        ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send {
            self.0.forget(key, pending)
        }
    }

    fn memory(clock: &ManualClock) -> Engine<MemoryStore> {
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store");
        Engine::builder(store).lease(LEASE).build()
    }

    fn key(name: &str) -> StoreKey {
        StoreKey::derive(
            "settle",
            &Scope::principal("p"),
            &IdempotencyKey::new(name).expect("key"),
        )
    }

    fn fp() -> Fingerprint {
        Fingerprint::builder().field(b"request").finish()
    }

    async fn run<S: Store>(engine: &Engine<S>, key: StoreKey) -> Ticket {
        match engine.begin(key, fp()).await.expect("claim") {
            Begin::Run(ticket) => ticket,
            other => panic!("expected a claim, found {other:?}"),
        }
    }

    #[tokio::test]
    async fn record_completes_and_a_repeat_replays_it() {
        let engine = memory(&ManualClock::new());
        let ticket = run(&engine, key("record")).await;
        let response = Recorded::new(201, vec![], None);
        let settle = Settle::Record(Recording::Response(&response));
        assert_eq!(
            engine.settle(ticket, settle, TALLY).await,
            Settled::Completed
        );
        assert!(
            matches!(engine.begin(key("record"), fp()).await.unwrap(), Begin::Replayed(r) if r.status == 201)
        );
    }

    #[tokio::test]
    async fn release_and_fail_free_the_key_for_a_retry() {
        let engine = memory(&ManualClock::new());
        for (name, settle) in [("release", Settle::Release), ("fail", Settle::Fail)] {
            let ticket = run(&engine, key(name)).await;
            assert_eq!(
                engine.settle(ticket, settle, TALLY).await,
                Settled::Released
            );
            assert!(
                matches!(engine.begin(key(name), fp()).await.unwrap(), Begin::Run(_)),
                "{name}: a retry runs"
            );
        }
    }

    /// A hold keeps the claim for the hold time, past the lease: repeats are in flight until
    /// it ends, with a wait of at most a third of the lease; then the key runs again.
    #[tokio::test]
    async fn hold_keeps_the_claim_for_the_hold_time_then_the_key_runs_again() {
        let clock = ManualClock::new();
        let engine = memory(&clock);
        let hold = Duration::from_secs(600);
        let ticket = run(&engine, key("hold")).await;
        assert_eq!(
            engine.settle(ticket, Settle::Hold(hold), TALLY).await,
            Settled::Held
        );
        clock.advance(LEASE * 2);
        assert!(matches!(
            engine.begin(key("hold"), fp()).await.unwrap(),
            Begin::InFlight
        ));
        assert_eq!(engine.in_flight_retry_after(&key("hold")).await, LEASE / 3);
        clock.advance(hold - LEASE * 2 - Duration::from_secs(4));
        assert_eq!(
            engine.in_flight_retry_after(&key("hold")).await,
            Duration::from_secs(4),
            "the hold's last seconds"
        );
        clock.advance(Duration::from_secs(5));
        assert!(matches!(
            engine.begin(key("hold"), fp()).await.unwrap(),
            Begin::Run(_)
        ));
    }

    /// A ticket whose lease lapsed and whose key another run claimed settles nothing: the
    /// new holder keeps the key, whatever the verdict.
    #[tokio::test]
    async fn a_lost_lease_settles_nothing_and_leaves_the_new_holder_alone() {
        let clock = ManualClock::new();
        let engine = memory(&clock);
        let response = Recorded::new(200, vec![], None);
        let verdicts = [
            (
                "record",
                Settle::Record(Recording::Response(&response)),
                Settled::LeaseLost,
            ),
            ("release", Settle::Release, Settled::Released),
            (
                "hold",
                Settle::Hold(Duration::from_secs(600)),
                Settled::LeaseLost,
            ),
        ];
        for (name, settle, settled) in verdicts {
            let first = run(&engine, key(name)).await;
            clock.advance(LEASE + Duration::from_secs(1));
            let second = run(&engine, key(name)).await;
            assert_eq!(engine.settle(first, settle, TALLY).await, settled, "{name}");
            assert!(
                matches!(
                    engine.begin(key(name), fp()).await.unwrap(),
                    Begin::InFlight
                ),
                "{name}: the second run still holds the key"
            );
            assert_eq!(
                engine
                    .settle(
                        second,
                        Settle::Record(Recording::Response(&response)),
                        TALLY
                    )
                    .await,
                Settled::Completed,
                "{name}"
            );
        }
    }

    /// A hold that comes once the lease lapsed, with nothing else holding the key, still
    /// holds it for the hold time (as a record would still land): a repeat is in flight.
    #[tokio::test]
    async fn a_hold_after_the_lease_lapsed_holds_a_key_nothing_claimed() {
        let clock = ManualClock::new();
        let engine = memory(&clock);
        let hold = Duration::from_secs(600);
        let ticket = run(&engine, key("late")).await;
        clock.advance(LEASE + Duration::from_secs(1));
        assert_eq!(
            engine.settle(ticket, Settle::Hold(hold), TALLY).await,
            Settled::Held
        );
        clock.advance(hold - Duration::from_secs(5));
        assert!(matches!(
            engine.begin(key("late"), fp()).await.unwrap(),
            Begin::InFlight
        ));
        clock.advance(Duration::from_secs(6));
        assert!(matches!(
            engine.begin(key("late"), fp()).await.unwrap(),
            Begin::Run(_)
        ));
    }

    /// A late hold keeps the key's steps for the retry after it, as a hold in time does,
    /// however much longer than the retention the hold is.
    #[tokio::test]
    async fn a_late_hold_keeps_the_steps_for_the_retry_after_it() {
        use crate::engine::Raw;
        use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store");
        let engine = Engine::builder(store)
            .lease(LEASE)
            .retention(Duration::from_secs(60))
            .build();
        let charges = AtomicUsize::new(0);
        let charge = || async {
            charges.fetch_add(1, SeqCst);
            Ok::<_, String>("ch_1".to_owned())
        };
        let ticket = run(&engine, key("steps")).await;
        let steps = engine.steps(&ticket);
        steps
            .run("charge", Raw, |_| charge())
            .await
            .expect("charged");
        clock.advance(LEASE + Duration::from_secs(1));
        let hold = Duration::from_secs(600);
        assert_eq!(
            engine.settle(ticket, Settle::Hold(hold), TALLY).await,
            Settled::Held
        );
        clock.advance(hold + Duration::from_secs(1));
        let retry = run(&engine, key("steps")).await;
        let steps = engine.steps(&retry);
        let again: String = steps
            .run("charge", Raw, |_| charge())
            .await
            .expect("answered");
        assert_eq!(again, "ch_1");
        assert_eq!(charges.load(SeqCst), 1, "the charge ran once");
    }

    /// A repeat found the key in flight, and the first run settled before the wait was
    /// asked: nothing is pending, so the repeat may come back at once (the HTTP layer's
    /// 409 said 1 s). A built-in store answers `None` for a key nothing pending holds, the
    /// same answer as a store that cannot tell.
    #[tokio::test]
    async fn a_key_settled_before_its_wait_is_asked_is_retried_at_once() {
        let engine = memory(&ManualClock::new());
        let ticket = run(&engine, key("quick")).await;
        let response = Recorded::new(201, vec![], None);
        let settle = Settle::Record(Recording::Response(&response));
        assert_eq!(
            engine.settle(ticket, settle, TALLY).await,
            Settled::Completed
        );
        let wait = engine.in_flight_retry_after(&key("quick")).await;
        assert!(wait <= Duration::from_secs(1), "{wait:?}");
    }

    /// The settle event names the door the metrics count the key under: an `#[idempotent]`
    /// route's key is logged `route`, as `idempotency_results_total` labels it.
    #[test]
    fn the_event_names_the_door_the_metrics_count() {
        use crate::metrics::DoorCounters;
        let http = DoorCounters::new(Door::Http);
        let route = http.with_door(Door::Route);
        assert_eq!(Tally::Layer(&http, false).door(), "http");
        assert_eq!(Tally::Layer(&route, false).door(), "route");
        assert_eq!(Tally::Layer(&route, true).door(), "grpc");
        assert_eq!(TALLY.door(), "message");
    }

    /// A store that fails to settle is counted and logged, never an error: the key stays
    /// pending until its lease lapses, then runs again.
    #[tokio::test]
    async fn a_store_fault_leaves_the_key_pending_until_its_lease_lapses() {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a valid store");
        let engine = Engine::builder(Down(store)).lease(LEASE).build();
        let response = Recorded::new(200, vec![], None);
        let verdicts = [
            (
                "record",
                Settle::Record(Recording::Response(&response)),
                Settled::CompleteFailed,
            ),
            ("release", Settle::Release, Settled::ReleaseFailed),
            ("fail", Settle::Fail, Settled::ReleaseFailed),
            (
                "hold",
                Settle::Hold(Duration::from_secs(600)),
                Settled::HoldFailed,
            ),
        ];
        for (name, settle, settled) in verdicts {
            let ticket = run(&engine, key(name)).await;
            assert_eq!(
                engine.settle(ticket, settle, TALLY).await,
                settled,
                "{name}"
            );
            assert!(
                matches!(
                    engine.begin(key(name), fp()).await.unwrap(),
                    Begin::InFlight
                ),
                "{name}: pending"
            );
        }
        clock.advance(LEASE + Duration::from_secs(1));
        for name in ["record", "release", "fail", "hold"] {
            assert!(
                matches!(engine.begin(key(name), fp()).await.unwrap(), Begin::Run(_)),
                "{name}: runs again once the lease lapsed"
            );
        }
    }
}
