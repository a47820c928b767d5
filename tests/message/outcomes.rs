//! The outcomes table of `tower_idempotency::message`, held to the same behaviour over the
//! memory store and the Redis store (the binary's one `redis-server`): one suite, expanded per
//! store.
#![allow(clippy::unwrap_used)]

use crate::support::http::SpyStore;
use bytes::Bytes;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Notify;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_idempotency::engine::{Engine, Raw, Recorded, Scope, Verdict};
use tower_idempotency::message::{
    Envelope, Handled, HeaderOrHash, MessageError, MessageErrorKind, MessageIdempotencyLayer,
    MessageKey,
};
use tower_idempotency::store::{Forgotten, StoreKey};
use tower_idempotency::{IdempotencyKey, Store};

pub(crate) const LEASE: Duration = Duration::from_secs(5);

/// A unique namespace per test, so tests on one shared Redis server never meet.
pub(crate) fn namespace() -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "queues-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The handler: counts its runs, and by the body answers `Ok(body)`, fails (`fail`), answers a
/// result the classifier calls unsuccessful (`bad`), or waits for `gate` (`slow`).
#[derive(Clone, Default)]
pub(crate) struct Work {
    pub(crate) runs: Arc<AtomicUsize>,
    pub(crate) gate: Arc<Notify>,
    pub(crate) started: Arc<Notify>,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Failed;

impl std::fmt::Display for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failed on purpose")
    }
}

impl std::error::Error for Failed {}

impl Work {
    pub(crate) fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    pub(crate) fn service(
        &self,
    ) -> impl Service<Envelope, Response = String, Error = Failed, Future: Send> + Clone + Send + 'static
    {
        let w = self.clone();
        service_fn(move |m: Envelope| {
            let w = w.clone();
            async move {
                w.runs.fetch_add(1, Ordering::SeqCst);
                let body = String::from_utf8(m.body.to_vec()).unwrap();
                match body.as_str() {
                    "fail" => Err(Failed),
                    "slow" => {
                        w.started.notify_one();
                        w.gate.notified().await;
                        Ok(body)
                    }
                    _ => Ok(body),
                }
            }
        })
    }
}

pub(crate) fn keyed(key: &str, body: &str) -> Envelope {
    Envelope::new("orders", Bytes::copy_from_slice(body.as_bytes()))
        .with_header("Idempotency-Key", Bytes::copy_from_slice(key.as_bytes()))
}

async fn call<S>(svc: &S, m: Envelope) -> Result<Handled<String>, MessageError<Failed>>
where
    S: Service<Envelope, Response = Handled<String>, Error = MessageError<Failed>> + Clone,
{
    svc.clone().oneshot(m).await
}

// The suite, once per store.
crate::support::stores::per_store!([memory: memory, redis: redis] {
    use super::*;

    async fn setup() -> Option<(SpyStore<impl Store>, Engine<SpyStore<impl Store>>)> {
        let spy = SpyStore::wrap(store().await?);
        let engine = Engine::builder(spy.clone()).lease(LEASE).build();
        Some((spy, engine))
    }

    fn layer<St: Store>(engine: &Engine<St>, ns: &str) -> MessageIdempotencyLayer<St> {
        MessageIdempotencyLayer::new(engine.clone(), "billing").namespace(ns)
    }

    #[tokio::test]
    async fn a_completed_duplicate_is_acknowledged_without_running() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap(),
            Handled::Recorded("a".into())
        );
        let again = call(&svc, keyed("k1", "a")).await.unwrap();
        assert_eq!(again, Handled::Replayed(None));
        assert!(again.is_ack());
        assert_eq!(work.runs(), 1, "the handler ran once");
    }

    #[tokio::test]
    async fn a_completed_duplicate_gets_the_stored_result() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).codec(Raw))
            .service(work.service());
        assert_eq!(
            call(&svc, keyed("k1", "result")).await.unwrap(),
            Handled::Recorded("result".into())
        );
        assert_eq!(
            call(&svc, keyed("k1", "result")).await.unwrap(),
            Handled::Replayed(Some("result".into()))
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn the_handlers_error_releases_the_key_so_the_redelivery_runs() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        let err = call(&svc, keyed("k1", "fail")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::Work);
        assert!(err.is_retryable());
        assert_eq!(err.into_inner().unwrap(), Failed);
        assert_eq!(spy.releases(), 1);
        let err = call(&svc, keyed("k1", "fail")).await.unwrap_err();
        assert_eq!(
            err.kind(),
            MessageErrorKind::Work,
            "ran again, not a repeat"
        );
        assert_eq!(work.runs(), 2);
    }

    #[tokio::test]
    async fn an_unsuccessful_result_releases_the_key() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).classify(
                |r: &Result<String, Failed>| match r {
                    Ok(body) if body == "bad" => Verdict::Release,
                    Ok(_) => Verdict::Record,
                    Err(_) => Verdict::Release,
                },
            ))
            .service(work.service());
        let first = call(&svc, keyed("k1", "bad")).await.unwrap();
        assert_eq!(first, Handled::Released("bad".into()));
        assert!(!first.is_ack(), "the broker must redeliver");
        assert_eq!(
            call(&svc, keyed("k1", "bad")).await.unwrap(),
            Handled::Released("bad".into())
        );
        assert_eq!(
            work.runs(),
            2,
            "each redelivery runs while the result is unsuccessful"
        );
    }

    #[tokio::test]
    async fn a_result_classified_fail_is_rejected_and_one_classified_hold_keeps_its_key() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .wait_in_flight(Duration::ZERO)
                    .classify(|r: &Result<String, Failed>| match r {
                        Ok(body) if body == "rejected" => Verdict::Fail,
                        Ok(body) if body == "held" => Verdict::Hold,
                        Ok(_) => Verdict::Record,
                        Err(_) => Verdict::Release,
                    }),
            )
            .service(work.service());
        let rejected = call(&svc, keyed("k1", "rejected")).await.unwrap();
        assert_eq!(rejected, Handled::Failed("rejected".into()));
        assert!(!rejected.is_ack() && rejected.ran());
        assert_eq!(
            call(&svc, keyed("k1", "rejected")).await.unwrap(),
            Handled::Failed("rejected".into()),
            "released: a redelivery runs again"
        );
        assert_eq!(work.runs(), 2);

        let held = call(&svc, keyed("k2", "held")).await.unwrap();
        assert_eq!(held, Handled::Held("held".into()));
        assert!(!held.is_ack());
        let again = call(&svc, keyed("k2", "held")).await.unwrap_err();
        assert_eq!(
            again.kind(),
            MessageErrorKind::InFlight,
            "the key stays pending"
        );
        assert_eq!(
            work.runs(),
            3,
            "a held message does not run again in its lease"
        );
    }

    #[tokio::test]
    async fn a_held_error_is_retryable_after_the_lease_and_a_recorded_one_is_replayed() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let held = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .wait_in_flight(Duration::ZERO)
                    .classify(|r: &Result<String, Failed>| match r {
                        Ok(_) => Verdict::Record,
                        Err(_) => Verdict::Hold,
                    }),
            )
            .service(work.service());
        let err = call(&held, keyed("k1", "fail")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::Work);
        assert!(err.is_retryable());
        assert_eq!(err.retry_after(), Some(LEASE));
        assert_eq!(err.into_inner(), Some(Failed));
        let again = call(&held, keyed("k1", "fail")).await.unwrap_err();
        assert_eq!(again.kind(), MessageErrorKind::InFlight);
        assert_eq!(work.runs(), 1);

        let recorded = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .codec(Raw)
                    .classify(|_: &Result<String, Failed>| Verdict::Record),
            )
            .service(work.service());
        let err = call(&recorded, keyed("k2", "fail")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::Work);
        assert!(!err.is_retryable() && err.retry_after().is_none());
        assert_eq!(
            call(&recorded, keyed("k2", "fail")).await.unwrap(),
            Handled::Replayed(None),
            "recorded as done, without a result"
        );
        assert_eq!(work.runs(), 2);
    }

    #[tokio::test]
    async fn by_default_a_duplicate_in_flight_waits_then_is_refused_never_acknowledged() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let started = std::time::Instant::now();
        // The first delivery's consumer may have crashed: its claim is pending, and this
        // repeat is the only copy left. It must not be acknowledged.
        let err = call(&svc, keyed("k1", "slow")).await.unwrap_err();
        let waited = started.elapsed();
        assert_eq!(err.kind(), MessageErrorKind::InFlight);
        assert!(err.is_retryable(), "redeliver it");
        assert!(
            waited >= Duration::from_secs(1) && waited < LEASE / 2,
            "waited the default bound first: {waited:?}"
        );
        let after = err.retry_after().unwrap();
        assert!(
            after <= LEASE / 3 && after > Duration::ZERO,
            "redeliver within a third of the lease: {after:?}"
        );
        work.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(work.runs(), 1, "never two handlers at once");
    }

    #[tokio::test]
    async fn a_quick_first_delivery_answers_its_duplicate_by_default() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).codec(Raw))
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let dup = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        tokio::time::sleep(Duration::from_millis(50)).await;
        work.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        assert_eq!(
            dup.await.unwrap().unwrap(),
            Handled::Replayed(Some("slow".into())),
            "answered from the record within the default wait"
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn a_duplicate_in_flight_is_acknowledged_unrun_with_skip_in_flight() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).skip_in_flight(true))
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let dup = call(&svc, keyed("k1", "slow")).await.unwrap();
        assert_eq!(dup, Handled::Skipped);
        assert!(dup.is_ack());
        work.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        assert_eq!(work.runs(), 1, "never two handlers at once");
    }

    #[tokio::test]
    async fn a_duplicate_in_flight_is_refused_at_once_with_no_wait() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).wait_in_flight(Duration::ZERO))
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let err = call(&svc, keyed("k1", "slow")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::InFlight);
        assert!(err.is_retryable());
        let after = err.retry_after().unwrap();
        assert!(
            after <= LEASE / 3 && after >= LEASE / 3 - Duration::from_millis(200),
            "a running first delivery's lease left (two thirds of it or more) capped at a \
             third of the lease: {after:?}"
        );
        work.gate.notify_one();
        first.await.unwrap().unwrap();
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn a_stalled_claims_duplicate_is_told_the_lease_it_has_left() {
        let Some((spy, _)) = setup().await else {
            return;
        };
        // A lease short enough that a stalled claim's lease left falls under the cap.
        let lease = Duration::from_secs(3);
        let engine = Engine::builder(spy).lease(lease).build();
        let work = Work::default();
        // Not run to completion: the dropped first delivery leaves its claim stalled, as a
        // crashed consumer would (no renewal).
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .wait_in_flight(Duration::ZERO)
                    .run_to_completion(false),
            )
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        tokio::time::sleep(Duration::from_millis(2200)).await;
        let err = call(&svc, keyed("k1", "slow")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::InFlight);
        let after = err.retry_after().unwrap();
        assert!(
            after < lease / 3 - Duration::from_millis(100),
            "the lease left when under the cap, not the whole lease: {after:?}"
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn a_waiting_duplicate_gets_the_first_deliverys_result() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .wait_in_flight(Duration::from_secs(4))
                    .codec(Raw),
            )
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let dup = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !dup.is_finished(),
            "the repeat waits for the first delivery"
        );
        work.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        let dup = dup.await.unwrap().unwrap();
        assert_eq!(dup, Handled::Replayed(Some("slow".into())));
        assert!(dup.is_ack());
        assert_eq!(work.runs(), 1, "the handler ran once");
    }

    #[tokio::test]
    async fn a_waiting_duplicate_runs_when_the_first_delivery_fails() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let runs = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Notify::new());
        let (r, g) = (Arc::clone(&runs), Arc::clone(&gate));
        // The first run waits for the gate and fails; the next succeeds.
        let handler = service_fn(move |_: Envelope| {
            let (r, g) = (Arc::clone(&r), Arc::clone(&g));
            async move {
                if r.fetch_add(1, Ordering::SeqCst) == 0 {
                    g.notified().await;
                    Err(Failed)
                } else {
                    Ok("second".to_owned())
                }
            }
        });
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).wait_in_flight(Duration::from_secs(4)))
            .service(handler);
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "x")));
        while runs.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let dup = tokio::spawn(svc.clone().oneshot(keyed("k1", "x")));
        tokio::time::sleep(Duration::from_millis(50)).await;
        gate.notify_one();
        assert_eq!(
            first.await.unwrap().unwrap_err().kind(),
            MessageErrorKind::Work
        );
        assert_eq!(dup.await.unwrap().unwrap(), Handled::Recorded("second".into()));
        assert_eq!(runs.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_waiting_duplicate_is_rejected_past_its_bound() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let bound = Duration::from_millis(300);
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).wait_in_flight(bound))
            .service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        let started = std::time::Instant::now();
        let err = call(&svc, keyed("k1", "slow")).await.unwrap_err();
        let waited = started.elapsed();
        assert_eq!(err.kind(), MessageErrorKind::InFlight);
        assert!(err.is_retryable());
        assert!(waited >= bound, "waited the bound: {waited:?}");
        assert!(waited < LEASE / 2, "not much past the bound: {waited:?}");
        let after = err.retry_after().unwrap();
        assert!(after <= LEASE && after > Duration::ZERO, "{after:?}");
        work.gate.notify_one();
        first.await.unwrap().unwrap();
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(work.runs(), 1, "the handler ran once");
    }

    #[tokio::test]
    async fn a_forgotten_key_runs_again_on_redelivery() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let door = layer(&engine, &namespace());
        let svc = ServiceBuilder::new()
            .layer(door.clone())
            .service(work.service());
        let key = MessageKey::given(b"k1").unwrap();
        assert_eq!(door.forget(&key).await.unwrap(), Forgotten::Nothing);
        call(&svc, keyed("k1", "a")).await.unwrap();
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(door.forget(&key).await.unwrap(), Forgotten::Record);
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap(),
            Handled::Recorded("a".into())
        );
        assert_eq!(work.runs(), 2, "the redelivery after forget ran");

        // A message keyed by its digest is forgotten by the digest of it.
        let digest = Envelope::new("orders", "order 9");
        call(&svc, digest.clone()).await.unwrap();
        let key = MessageKey::digest("orders", None, b"order 9");
        assert_eq!(door.forget(&key).await.unwrap(), Forgotten::Record);
        assert_eq!(
            call(&svc, digest).await.unwrap(),
            Handled::Recorded("order 9".into())
        );
    }

    #[tokio::test]
    async fn a_pending_key_is_forgotten_only_when_asked_explicitly() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let door = layer(&engine, &namespace())
            .codec(Raw)
            .wait_in_flight(Duration::ZERO);
        let svc = ServiceBuilder::new()
            .layer(door.clone())
            .service(work.service());
        let key = MessageKey::given(b"k1").unwrap();
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        assert_eq!(door.forget(&key).await.unwrap(), Forgotten::KeptPending);
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap_err().kind(),
            MessageErrorKind::InFlight
        );
        assert_eq!(
            door.forget_even_pending(&key).await.unwrap(),
            Forgotten::Pending
        );
        // The redelivery claims the key and runs beside the first delivery (what the
        // explicit variant is for); the first, its claim gone, leaves the new holder alone.
        let again = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        assert_eq!(
            work.runs(),
            2,
            "the redelivery ran after the explicit forget"
        );
        work.gate.notify_one();
        work.gate.notify_one();
        assert_eq!(first.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        assert_eq!(again.await.unwrap().unwrap(), Handled::Recorded("slow".into()));
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap(),
            Handled::Replayed(Some("slow".into()))
        );
    }

    #[tokio::test]
    async fn a_dropped_delivery_finishes_and_its_redelivery_is_a_duplicate() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let door = layer(&engine, &namespace()).codec(Raw);
        let in_flight = door.drain();
        let svc = ServiceBuilder::new().layer(door).service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        // The consumer goes away (shutdown, an outer timeout) while the handler sleeps.
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert_eq!(in_flight.len(), 1, "the handler runs on");
        work.gate.notify_one();
        assert!(in_flight.wait(Duration::from_secs(4)).await, "it finished");
        assert!(in_flight.is_empty());
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap(),
            Handled::Replayed(Some("slow".into())),
            "the outcome was recorded"
        );
        assert_eq!(work.runs(), 1, "the handler ran once");
    }

    #[tokio::test]
    async fn a_hung_handler_whose_consumer_left_is_cancelled_at_the_detached_timeout() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let door = layer(&engine, &namespace())
            .detached_timeout(Duration::from_millis(200))
            .wait_in_flight(Duration::ZERO);
        let in_flight = door.drain();
        let svc = ServiceBuilder::new().layer(door).service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        // The handler never returns (its gate stays shut): only the bound ends it.
        assert!(
            in_flight.wait(Duration::from_secs(20)).await,
            "cancelled at the detached timeout"
        );
        assert_eq!(in_flight.detached(), 0);
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap_err().kind(),
            MessageErrorKind::InFlight,
            "nothing recorded, nothing released: the key waits out its lease"
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn without_run_to_completion_a_dropped_delivery_is_cancelled() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let door = layer(&engine, &namespace())
            .run_to_completion(false)
            .wait_in_flight(Duration::ZERO);
        let in_flight = door.drain();
        let svc = ServiceBuilder::new().layer(door).service(work.service());
        let first = tokio::spawn(svc.clone().oneshot(keyed("k1", "slow")));
        work.started.notified().await;
        assert_eq!(in_flight.len(), 1, "counted while it runs");
        first.abort();
        assert!(first.await.unwrap_err().is_cancelled());
        assert!(in_flight.is_empty(), "cancelled with its future");
        assert_eq!(
            call(&svc, keyed("k1", "slow")).await.unwrap_err().kind(),
            MessageErrorKind::InFlight,
            "the key stays pending until its lease lapses"
        );
    }

    #[tokio::test]
    async fn a_key_reused_by_another_message_is_refused() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        call(&svc, keyed("k1", "a")).await.unwrap();
        let err = call(&svc, keyed("k1", "b")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::KeyReused);
        assert!(!err.is_retryable());
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn a_key_is_scoped_by_the_consumer_not_the_topic() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        call(&svc, keyed("k1", "a")).await.unwrap();
        // The same key and body on another topic is another message under a used key.
        let other_topic = Envelope::new("refunds", "a").with_header("Idempotency-Key", "k1");
        let err = call(&svc, other_topic).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::KeyReused);
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn a_permanent_handler_error_releases_the_key_and_is_not_retryable() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).classify(
                |r: &Result<String, Failed>| match r {
                    Ok(_) => Verdict::Record,
                    Err(_) => Verdict::Fail,
                },
            ))
            .service(work.service());
        let err = call(&svc, keyed("k1", "fail")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::Work);
        assert!(!err.is_retryable(), "{err:?}");
        assert_eq!(err.get_ref(), Some(&Failed));
        // Released, as any handler error: a replay of the message runs it again.
        assert!(
            !call(&svc, keyed("k1", "fail"))
                .await
                .unwrap_err()
                .is_retryable()
        );
        assert_eq!(work.runs(), 2, "the key was released");

        // The default: every handler error is retryable.
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        let err = call(&svc, keyed("k1", "fail")).await.unwrap_err();
        assert!(err.is_retryable());
    }

    #[tokio::test]
    async fn a_result_over_the_record_limit_is_recorded_without_it() {
        let Some((spy, _)) = setup().await else {
            return;
        };
        let engine = Engine::builder(spy).lease(LEASE).max_record_body(8).build();
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).codec(Raw))
            .service(work.service());
        let long = "a result of more than eight bytes";
        assert_eq!(
            call(&svc, keyed("k1", long)).await.unwrap(),
            Handled::Recorded(long.into())
        );
        // Work that succeeded: its redelivery is a completed repeat, acknowledged.
        assert_eq!(
            call(&svc, keyed("k1", long)).await.unwrap(),
            Handled::Replayed(None)
        );
        assert_eq!(
            call(&svc, keyed("k2", "short")).await.unwrap(),
            Handled::Recorded("short".into())
        );
        assert_eq!(
            call(&svc, keyed("k2", "short")).await.unwrap(),
            Handled::Replayed(Some("short".into())),
            "a result that fits is kept"
        );
        assert_eq!(work.runs(), 2);
    }

    #[tokio::test]
    async fn a_store_failure_on_claim_is_retryable_and_runs_nothing() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        spy.fail_claims(true);
        let err = call(&svc, keyed("k1", "a")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::Store);
        assert!(err.is_retryable());
        assert!(
            std::error::Error::source(&err).is_some(),
            "the store's error is the source"
        );
        assert_eq!(work.runs(), 0, "never run without a claim");
        spy.fail_claims(false);
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap(),
            Handled::Recorded("a".into())
        );
    }

    #[tokio::test]
    async fn a_store_failure_on_record_still_acknowledges_and_holds_the_key() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()).wait_in_flight(Duration::ZERO))
            .service(work.service());
        spy.fail_completes(true);
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap(),
            Handled::Recorded("a".into())
        );
        spy.fail_completes(false);
        assert_eq!(
            call(&svc, keyed("k1", "a")).await.unwrap_err().kind(),
            MessageErrorKind::InFlight,
            "pending until the lease lapses: not run again, not acknowledged"
        );
        assert_eq!(work.runs(), 1);
    }

    #[tokio::test]
    async fn two_consumers_each_handle_a_message_once() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let ns = namespace();
        let work = Work::default();
        let billing = ServiceBuilder::new()
            .layer(layer(&engine, &ns))
            .service(work.service());
        let shipping = ServiceBuilder::new()
            .layer(MessageIdempotencyLayer::new(engine.clone(), "shipping").namespace(&ns))
            .service(work.service());
        for _ in 0..3 {
            assert!(call(&billing, keyed("k1", "a")).await.unwrap().is_ack());
            assert!(call(&shipping, keyed("k1", "a")).await.unwrap().is_ack());
        }
        assert_eq!(
            work.runs(),
            2,
            "once per consumer, neither skipped as the other's repeat"
        );
    }

    #[tokio::test]
    async fn an_unlisted_topic_passes_with_no_store_call() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .topics(["payments"])
                    .require_key(true),
            )
            .service(work.service());
        for _ in 0..2 {
            let out = call(&svc, Envelope::new("orders", "a")).await.unwrap();
            assert_eq!(out, Handled::Untracked("a".into()));
        }
        assert_eq!(spy.claims(), 0);
        assert_eq!(work.runs(), 2);
        let listed = Envelope::new("payments", "a").with_header("Idempotency-Key", "k1");
        assert_eq!(
            call(&svc, listed.clone()).await.unwrap(),
            Handled::Recorded("a".into())
        );
        assert_eq!(call(&svc, listed).await.unwrap(), Handled::Replayed(None));
    }

    #[tokio::test]
    async fn a_listed_message_without_a_key_is_refused_when_keys_are_required() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace())
                    .identify(HeaderOrHash::new().hash_body(false))
                    .require_key(true),
            )
            .service(work.service());
        let err = call(&svc, Envelope::new("orders", "a")).await.unwrap_err();
        assert_eq!(err.kind(), MessageErrorKind::KeyMissing);
        assert!(!err.is_retryable(), "dead-letter, never run unprotected");
        assert_eq!((work.runs(), spy.claims()), (0, 0));
    }

    #[tokio::test]
    async fn a_message_without_a_key_runs_untracked_when_keys_are_optional() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(
                layer(&engine, &namespace()).identify(HeaderOrHash::new().hash_body(false)),
            )
            .service(work.service());
        for _ in 0..2 {
            assert_eq!(
                call(&svc, Envelope::new("orders", "a")).await.unwrap(),
                Handled::Untracked("a".into())
            );
        }
        assert_eq!((work.runs(), spy.claims()), (2, 0));
    }

    #[tokio::test]
    async fn an_invalid_key_is_refused() {
        let Some((spy, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        for bad in ["  ", "ключ", &"x".repeat(256)] {
            let err = call(&svc, keyed(bad, "a")).await.unwrap_err();
            assert_eq!(err.kind(), MessageErrorKind::KeyInvalid, "{bad:?}");
            assert!(!err.is_retryable());
        }
        assert_eq!((work.runs(), spy.claims()), (0, 0));
    }

    #[tokio::test]
    async fn without_a_key_header_identical_redeliveries_match_by_digest() {
        let Some((_, engine)) = setup().await else {
            return;
        };
        let work = Work::default();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, &namespace()))
            .service(work.service());
        let m = Envelope::new("orders", "order 17");
        assert_eq!(
            call(&svc, m.clone()).await.unwrap(),
            Handled::Recorded("order 17".into())
        );
        assert_eq!(call(&svc, m).await.unwrap(), Handled::Replayed(None));
        let other = Envelope::new("orders", "order 18");
        assert_eq!(
            call(&svc, other).await.unwrap(),
            Handled::Recorded("order 18".into())
        );
        let new_schema = Envelope::new("orders", "order 17").with_schema_version("2");
        assert_eq!(
            call(&svc, new_schema).await.unwrap(),
            Handled::Recorded("order 17".into())
        );
        assert_eq!(work.runs(), 3);
    }
});

/// The record check, once (it needs the store's raw access, the memory store's is enough):
/// a record written under the door's key by something other than the door is refused.
#[tokio::test]
async fn a_record_not_written_by_the_message_door_is_refused() {
    let spy = SpyStore::new();
    let engine = Engine::builder(spy.clone()).lease(LEASE).build();
    let ns = namespace();
    let key = StoreKey::derive(
        &ns,
        &Scope::principal("billing"),
        &IdempotencyKey::new("k1").unwrap(),
    );
    let work = Work::default();
    let svc = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(engine.clone(), "billing").namespace(&ns))
        .service(work.service());
    // Claim under the door's key with the door's fingerprint: the spy saw it on the first
    // delivery, which we make fail (released), then complete an HTTP-shaped record over it.
    call(&svc, keyed("k1", "fail")).await.unwrap_err();
    let fp = spy.last_fingerprint().expect("the door claimed");
    let tower_idempotency::engine::Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("the key was released");
    };
    engine
        .complete(
            ticket,
            &Recorded::new(201, vec![], Some(Bytes::from_static(b"{}"))),
        )
        .await
        .unwrap();
    let err = call(&svc, keyed("k1", "fail")).await.unwrap_err();
    assert_eq!(err.kind(), MessageErrorKind::RecordInvalid);
    assert!(!err.is_retryable());
    assert_eq!(work.runs(), 1, "not run again, not acknowledged as done");
}

/// Feature `metrics`: each message counted once under the door `message`.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_message_door_counts_each_outcome_once() {
    use metrics_util::debugging::DebuggingRecorder;
    use tower_idempotency::MemoryStore;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let counted = || crate::support::metrics::moved_once(&snap);
    let engine = Engine::builder(MemoryStore::new()).lease(LEASE).build();
    let work = Work::default();
    let svc = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(engine, "billing").namespace(namespace()))
        .service(work.service());

    assert_eq!(
        call(&svc, keyed("k1", "a")).await.unwrap(),
        Handled::Recorded("a".into())
    );
    assert_eq!(
        counted(),
        ["door=message,outcome=ran", "door=message,result=completed"]
    );
    assert_eq!(
        call(&svc, keyed("k1", "a")).await.unwrap(),
        Handled::Replayed(None)
    );
    assert_eq!(counted(), ["door=message,outcome=replayed"]);
    assert!(call(&svc, keyed("k1", "b")).await.is_err());
    assert_eq!(counted(), ["door=message,outcome=key_reused"]);
    assert!(call(&svc, keyed("k2", "fail")).await.is_err());
    assert_eq!(
        counted(),
        ["door=message,outcome=ran", "door=message,result=released"]
    );
}
