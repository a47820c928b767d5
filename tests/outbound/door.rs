//! Every outcome of the generic door, written once and run over each store (`main.rs`).

use crate::rig::{Act, Msg, door, door_with};
use crate::support::http::SpyStore;
use bytes::Bytes;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::engine::{Begin, Engine, Recorded, Scope};
use tower_idempotency::outbound::{Delivery, OutboundErrorKind, Unknown};
use tower_idempotency::store::StoreKey;
use tower_idempotency::{IdempotencyKey, Store};

const LEASE: Duration = Duration::from_secs(30);

pub(crate) async fn sends_once_and_replays_the_receipt<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store, LEASE, None);
    let first = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    let again = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(
        matches!(&first, Delivery::Recorded(r) if r == "receipt 1: hello"),
        "{first:?}"
    );
    assert!(
        matches!(&again, Delivery::Replayed(r) if r == "receipt 1: hello"),
        "{again:?}"
    );
    assert_eq!(
        provider.received(),
        1,
        "the job ran twice, the provider got one message"
    );
}

pub(crate) async fn a_send_in_flight_is_answered_in_flight<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store, LEASE, None);
    let first = tokio::spawn(door.clone().oneshot(Msg::new("k", "hello", Act::Stall)));
    wait_until(|| provider.received() == 1).await;
    let second = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(second, Delivery::InFlight), "{second:?}");
    provider.open();
    let first = first.await.unwrap().unwrap();
    assert!(first.is_sent(), "{first:?}");
    let third = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(third, Delivery::Replayed(_)), "{third:?}");
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn the_key_with_another_request_is_key_reused<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store, LEASE, None);
    door.clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    let err = door
        .oneshot(Msg::new("k", "goodbye", Act::Take))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::KeyReused);
    assert!(!err.is_retryable());
    assert_eq!(provider.received(), 1, "the second message was not sent");
}

pub(crate) async fn a_refused_connection_releases_the_key_and_the_retry_sends<S: Store>(
    store: SpyStore<S>,
) {
    let (door, provider) = door(store.clone(), LEASE, None);
    let err = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Refuse))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Work);
    assert!(err.is_retryable(), "a refused connection may succeed later");
    assert_eq!(store.releases(), 1, "the key was released");
    let retry = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(
        matches!(&retry, Delivery::Recorded(r) if r == "receipt 1: hello"),
        "{retry:?}"
    );
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn a_rejection_releases_the_key<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store, LEASE, None);
    let rejected = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Reject))
        .await
        .unwrap();
    assert!(
        matches!(&rejected, Delivery::Failed(response) if response == "rejected: hello"),
        "{rejected:?}"
    );
    let retry = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(retry.is_sent(), "the key was free again: {retry:?}");
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn a_reset_mid_exchange_is_unknown_and_the_retry_does_not_send<S: Store>(
    store: SpyStore<S>,
) {
    let (door, provider) = door(store.clone(), LEASE, None);
    let first = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Reset))
        .await
        .unwrap();
    assert!(
        matches!(&first, Delivery::Held(Unknown::Error(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
        "{first:?}"
    );
    assert!(first.is_unknown());
    let retry = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(
        matches!(retry, Delivery::InFlight),
        "held, not in flight: nothing runs now {retry:?}"
    );
    assert_eq!(
        provider.received(),
        1,
        "the retry sent nothing: the first may have gone"
    );
    assert_eq!(store.releases(), 0, "the key is kept");
}

pub(crate) async fn an_unknown_delivery_is_held_for_the_hold_time<S: Store>(store: SpyStore<S>) {
    // Real time on Redis: each sleep ends at least 2 s from the deadline it must miss or meet.
    let lease = Duration::from_secs(1);
    let (door, provider) = door(store, lease, Some(Duration::from_secs(5)));
    let first = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Reset))
        .await
        .unwrap();
    assert!(first.is_unknown());
    tokio::time::sleep(Duration::from_secs(3)).await; // past the lease, within the hold
    let within = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(
        matches!(within, Delivery::InFlight),
        "held past the lease: {within:?}"
    );
    tokio::time::sleep(Duration::from_secs(4)).await; // past the hold (7 s in all)
    let after = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(after.is_sent(), "the hold ended: {after:?}");
    assert_eq!(provider.received(), 2);
}

pub(crate) async fn a_send_dropped_after_it_began_keeps_its_key<S: Store>(store: SpyStore<S>) {
    // Real time on Redis: the retry comes 2 s past the lease and 2 s before the hold ends.
    let lease = Duration::from_secs(1);
    let (door, provider) = door(store.clone(), lease, Some(Duration::from_secs(5)));
    let sending = tokio::spawn(door.clone().oneshot(Msg::new("k", "hello", Act::Stall)));
    wait_until(|| provider.received() == 1).await;
    sending.abort(); // the caller gives up after the message reached the provider
    let _ = sending.await;
    assert_eq!(
        store.releases(),
        0,
        "a send that may have gone is not released"
    );
    tokio::time::sleep(Duration::from_secs(3)).await; // past the lease, within the hold
    let retry = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn a_failed_claim_fails_retryable_and_sends_nothing<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store.clone(), LEASE, None);
    store.fail_claims(true);
    let err = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::Store);
    assert_eq!(err.code(), "idempotency.store_failed");
    assert!(err.is_retryable());
    assert_eq!(provider.received(), 0, "nothing is sent without a claim");
    store.fail_claims(false);
    let retry = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(retry.is_sent());
}

pub(crate) async fn a_failed_complete_still_returns_the_receipt<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store.clone(), LEASE, None);
    store.fail_completes(true);
    let sent = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(
        matches!(&sent, Delivery::Recorded(r) if r == "receipt 1: hello"),
        "{sent:?}"
    );
    assert_eq!(store.completes(), 1);
    // The key stays pending until its lease ends: a repeat meanwhile sends nothing.
    let again = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(again, Delivery::InFlight), "{again:?}");
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn a_request_without_a_key_is_sent_every_time<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store.clone(), LEASE, None);
    let unkeyed = || Msg {
        key: None,
        body: "hello".into(),
        act: Act::Take,
    };
    let first = door.clone().oneshot(unkeyed()).await.unwrap();
    let again = door.oneshot(unkeyed()).await.unwrap();
    for d in [&first, &again] {
        assert!(
            matches!(d, Delivery::Untracked(r) if r.ends_with("hello")),
            "told apart from a recorded send: {d:?}"
        );
        assert!(d.is_sent());
    }
    assert_eq!(provider.received(), 2);
    assert_eq!(store.claims(), 0, "no key, no claim");
}

pub(crate) async fn require_key_refuses_a_request_without_a_key<S: Store>(store: SpyStore<S>) {
    let engine = Engine::builder(store.clone()).lease(LEASE).build();
    let (door, provider) = door_with(engine, |l| l.require_key(true));
    let unkeyed = Msg {
        key: None,
        body: "hello".into(),
        act: Act::Take,
    };
    let err = door.clone().oneshot(unkeyed).await.unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::KeyMissing);
    assert_eq!(err.code(), "idempotency.key_missing");
    assert_eq!(
        (provider.received(), store.claims()),
        (0, 0),
        "nothing sent"
    );
    let keyed = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(keyed, Delivery::Recorded(_)), "{keyed:?}");
    assert_eq!(provider.received(), 1, "only the keyed request went");
}

pub(crate) async fn an_invalid_key_is_refused_before_sending<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store.clone(), LEASE, None);
    let err = door
        .oneshot(Msg::new("bad key\n", "hello", Act::Take))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::KeyInvalid);
    assert_eq!((provider.received(), store.claims()), (0, 0));
}

pub(crate) async fn a_record_of_another_door_is_not_replayed<S: Store>(store: SpyStore<S>) {
    // Another door's record under the very store key the outbound door derives.
    let engine = Engine::new(store.clone());
    let key = StoreKey::derive(
        "outbound",
        &Scope::anonymous(),
        &IdempotencyKey::new("k").unwrap(),
    );
    let fp = tower_idempotency::outbound::Identity::of("k", [b"hello".as_slice()])
        .unwrap()
        .fingerprint()
        .to_owned();
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("a fresh key")
    };
    let http = Recorded::new(201, vec![], Some(Bytes::from_static(b"{}")));
    assert!(engine.complete(ticket, &http).await.unwrap());

    let (door, provider) = door(store, LEASE, None);
    let err = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), OutboundErrorKind::RecordInvalid);
    assert_eq!(provider.received(), 0);
}

/// Waits (bounded) until `f` holds.
pub(crate) async fn wait_until(f: impl Fn() -> bool) {
    for _ in 0..500 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the condition did not hold within 5 s");
}

/// Feature `metrics`: each send counted once under the door `outbound`; an unknown delivery
/// ends `held`.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn the_outbound_door_counts_each_outcome_once() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let counted = || crate::support::metrics::moved_once(&snap);
    let (door, _provider) = door(SpyStore::new(), LEASE, None);
    let send = |key: &'static str, text: &'static str, act: Act| {
        door.clone().oneshot(Msg::new(key, text, act))
    };
    assert!(send("k", "hello", Act::Take).await.unwrap().is_sent());
    assert_eq!(
        counted(),
        [
            "door=outbound,outcome=ran",
            "door=outbound,result=completed"
        ]
    );
    assert!(matches!(
        send("k", "hello", Act::Take).await,
        Ok(Delivery::Replayed(_))
    ));
    assert_eq!(counted(), ["door=outbound,outcome=replayed"]);
    assert!(send("k", "goodbye", Act::Take).await.is_err());
    assert_eq!(counted(), ["door=outbound,outcome=key_reused"]);
    assert!(send("r", "hello", Act::Refuse).await.is_err());
    assert_eq!(
        counted(),
        ["door=outbound,outcome=ran", "door=outbound,result=released"]
    );
    assert!(matches!(
        send("u", "hello", Act::Reset).await,
        Ok(Delivery::Held(_))
    ));
    assert_eq!(
        counted(),
        ["door=outbound,outcome=ran", "door=outbound,result=held"]
    );
}

pub(crate) async fn an_unreachable_host_after_sending_holds_the_key<S: Store>(store: SpyStore<S>) {
    // EHOSTUNREACH on a connection that had sent: no client stage says "never sent".
    let (door, provider) = door(store.clone(), LEASE, None);
    let first = door
        .clone()
        .oneshot(Msg::new("k", "charge", Act::Unreachable))
        .await
        .unwrap();
    assert!(
        matches!(&first, Delivery::Held(Unknown::Error(e)) if e.kind() == std::io::ErrorKind::HostUnreachable),
        "{first:?}"
    );
    let retry = door
        .oneshot(Msg::new("k", "charge", Act::Take))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::InFlight), "{retry:?}");
    assert_eq!(provider.received(), 1, "the retry did not send again");
    assert_eq!(store.releases(), 0);
}

pub(crate) async fn a_receipt_over_the_record_limit_is_held_not_refused<S: Store>(
    store: SpyStore<S>,
) {
    // "receipt 1: hello" is 16 bytes: over the engine's limit, and a `String` has no
    // smaller form.
    let engine = Engine::builder(store)
        .lease(LEASE)
        .max_record_body(8)
        .build();
    let (door, provider) = door_with(engine, |l| l);
    let first = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(first, Delivery::Recorded(_)), "{first:?}");
    for _ in 0..2 {
        let again = door
            .clone()
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .expect("not refused as an invalid record at every repeat");
        assert!(matches!(again, Delivery::InFlight), "{again:?}");
    }
    assert_eq!(provider.received(), 1);
}

/// A paused clock, the memory store.
mod paused {
    use super::*;
    use crate::rig::RigLayer;
    use crate::slow::SlowWrites;
    use tower_idempotency::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn an_unknown_delivery_is_held_ten_minutes_by_default() {
        let (door, provider) = door(SpyStore::new(), Duration::from_secs(60), None);
        let first = door
            .clone()
            .oneshot(Msg::new("k", "hello", Act::Reset))
            .await
            .unwrap();
        assert!(first.is_unknown(), "{first:?}");
        tokio::time::sleep(Duration::from_secs(9 * 60)).await; // well past the 60 s lease
        let within = door
            .clone()
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(matches!(within, Delivery::InFlight), "{within:?}");
        tokio::time::sleep(Duration::from_secs(2 * 60)).await; // past the hold
        let after = door
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(matches!(after, Delivery::Recorded(_)), "{after:?}");
        assert_eq!(provider.received(), 2);
    }

    fn waiting(layer: RigLayer<SpyStore>) -> RigLayer<SpyStore> {
        layer.wait_in_flight(Duration::from_secs(5))
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeat_may_wait_for_the_running_send() {
        let engine = Engine::builder(SpyStore::new()).lease(LEASE).build();
        let (door, provider) = door_with(engine.clone(), waiting);
        let (impatient, _) = door_with(engine, |l| l);
        let first = tokio::spawn(door.clone().oneshot(Msg::new("k", "hello", Act::Stall)));
        wait_until(|| provider.received() == 1).await;
        let now = impatient
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(matches!(now, Delivery::InFlight), "{now:?}");
        let repeat = tokio::spawn(door.clone().oneshot(Msg::new("k", "hello", Act::Take)));
        tokio::time::sleep(Duration::from_secs(1)).await;
        provider.open();
        let first = first.await.unwrap().unwrap();
        let repeat = repeat.await.unwrap().unwrap();
        assert!(matches!(first, Delivery::Recorded(_)), "{first:?}");
        assert!(
            matches!(&repeat, Delivery::Replayed(r) if r == "receipt 1: hello"),
            "the waiting repeat got the first's receipt: {repeat:?}"
        );
        assert_eq!(provider.received(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_past_its_bound_is_in_flight() {
        let engine = Engine::builder(SpyStore::new()).lease(LEASE).build();
        let (door, provider) = door_with(engine, waiting);
        let _first = tokio::spawn(door.clone().oneshot(Msg::new("k", "hello", Act::Stall)));
        wait_until(|| provider.received() == 1).await;
        let started = tokio::time::Instant::now();
        let repeat = door
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(matches!(repeat, Delivery::InFlight), "{repeat:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(5),
            "it waited its bound"
        );
    }

    /// A held key is a claim, as a running send's is: a waiting repeat cannot tell them
    /// apart, so it waits its whole bound, then is answered in flight, sending nothing.
    #[tokio::test(start_paused = true)]
    async fn a_repeat_of_a_held_key_waits_its_whole_bound() {
        let engine = Engine::builder(SpyStore::new()).lease(LEASE).build();
        let (door, provider) = door_with(engine, waiting);
        let first = door
            .clone()
            .oneshot(Msg::new("k", "hello", Act::Reset))
            .await
            .unwrap();
        assert!(first.is_unknown(), "{first:?}");
        let started = tokio::time::Instant::now();
        let repeat = door
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(matches!(repeat, Delivery::InFlight), "{repeat:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(5),
            "it waited its bound"
        );
        assert_eq!(provider.received(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_dropped_while_its_hold_is_written_stays_held() {
        // The hold's write takes 5 s; the caller's own timeout fires after 1 s of it. The hold
        // renews the send's claim, so, as any renewal, it lands within the lease (10 s).
        let store = SlowWrites::new(MemoryStore::new(), Duration::from_secs(5));
        let engine = Engine::builder(store)
            .lease(Duration::from_secs(10))
            .build();
        let (door, provider) = door_with(engine, |l| l.hold(Duration::from_secs(600)));
        let cut = tokio::time::timeout(
            Duration::from_secs(1),
            door.clone().oneshot(Msg::new("k", "hello", Act::Reset)),
        )
        .await;
        assert!(
            cut.is_err(),
            "the caller gave up while the hold was written"
        );
        tokio::time::sleep(Duration::from_secs(60)).await; // far past the 10 s lease
        let retry = door
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(
            matches!(retry, Delivery::InFlight),
            "the hold was written after the caller left: {retry:?}"
        );
        assert_eq!(provider.received(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn with_the_defaults_held_keys_fill_the_pending_share_then_sends_are_refused_until_holds_end()
     {
        let (door, provider) = door_with(Engine::new(MemoryStore::new()), |l| l);
        // An outage of the provider: each send's delivery is unknown, its key held ten
        // minutes. 10 000 sends in those minutes, 17 a second: the door's one scope holds its
        // pending share of the default memory store.
        for i in 0..10_000 {
            let held = door
                .clone()
                .oneshot(Msg::new(&format!("down-{i}"), "hello", Act::Reset))
                .await
                .unwrap();
            assert!(held.is_unknown(), "{held:?}");
        }
        // Past the share a send is refused before anything goes: never sent twice, never
        // dropped silently (the job sees the error and retries).
        let refused = door
            .clone()
            .oneshot(Msg::new("after", "hello", Act::Take))
            .await
            .expect_err("the scope's pending share is full");
        assert_eq!(refused.kind(), OutboundErrorKind::Store, "{refused:?}");
        assert_eq!(provider.received(), 10_000, "nothing was sent");
        // Once the holds end, the send goes.
        tokio::time::sleep(Duration::from_secs(10 * 60 + 1)).await;
        let next = door.oneshot(Msg::new("after", "hello", Act::Take)).await;
        assert!(matches!(next, Ok(Delivery::Recorded(_))), "{next:?}");
        assert_eq!(provider.received(), 10_001);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hold_that_lands_after_the_lease_lapsed_still_holds() {
        // The hold's write takes 15 s (a store failing over, a stalled process) and the lease
        // is 10 s: it lands once the lease has lapsed, with nothing else holding the key. A
        // record would still land then; so must the hold, or a retry sends again.
        let store = SlowWrites::new(MemoryStore::new(), Duration::from_secs(15));
        let engine = Engine::builder(store)
            .lease(Duration::from_secs(10))
            .build();
        let (door, provider) = door_with(engine, |l| l.hold(Duration::from_secs(600)));
        let first = door
            .clone()
            .oneshot(Msg::new("k", "hello", Act::Reset))
            .await
            .unwrap();
        assert!(first.is_unknown(), "{first:?}");
        tokio::time::sleep(Duration::from_secs(60)).await; // far past the 10 s lease
        let retry = door
            .oneshot(Msg::new("k", "hello", Act::Take))
            .await
            .unwrap();
        assert!(
            matches!(retry, Delivery::InFlight),
            "held for the hold time: {retry:?}"
        );
        assert_eq!(provider.received(), 1, "the retry sent nothing");
    }
}

pub(crate) async fn an_operator_frees_a_held_key_with_forget<S: Store>(store: SpyStore<S>) {
    let (door, provider) = door(store.clone(), LEASE, None);
    let first = door
        .clone()
        .oneshot(Msg::new("k", "hello", Act::Reset))
        .await
        .unwrap();
    assert!(first.is_unknown(), "{first:?}");
    // The provider says the message never arrived: the operator frees the key.
    let key = StoreKey::derive(
        "outbound",
        &Scope::anonymous(),
        &IdempotencyKey::new("k").unwrap(),
    );
    // A held key is its send's claim, kept for the hold time: deleted only when asked.
    let engine = Engine::new(store);
    let kept = engine.forget(&key).await.unwrap();
    assert_eq!(kept, tower_idempotency::store::Forgotten::KeptPending);
    let forgotten = engine.forget_even_pending(&key).await.unwrap();
    assert_eq!(forgotten, tower_idempotency::store::Forgotten::Pending);
    let retry = door
        .oneshot(Msg::new("k", "hello", Act::Take))
        .await
        .unwrap();
    assert!(matches!(retry, Delivery::Recorded(_)), "{retry:?}");
    assert_eq!(provider.received(), 2);
}

/// A receipt of a serde type, kept as JSON by the door's codec.
#[cfg(feature = "json")]
#[tokio::test]
async fn a_json_receipt_is_replayed_through_the_codec() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tower::{Layer, service_fn};
    use tower_idempotency::MemoryStore;
    use tower_idempotency::engine::{Json, KeyError};
    use tower_idempotency::outbound::{Identity, SendOnceLayer};

    #[derive(Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Charge {
        id: String,
        amount: u64,
    }

    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let provider = service_fn(move |amount: u64| {
        let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            Ok::<_, std::io::Error>(Charge {
                id: format!("ch_{n}"),
                amount,
            })
        }
    });
    let identify = |a: &u64| -> Result<Option<Identity>, KeyError> {
        Identity::of("charge:1", [a.to_string().as_bytes()]).map(Some)
    };
    let door = SendOnceLayer::new(MemoryStore::new(), identify)
        .codec(Json)
        .layer(provider);
    let first = door.clone().oneshot(500).await.unwrap();
    let again = door.oneshot(500).await.unwrap();
    let want = Charge {
        id: "ch_1".into(),
        amount: 500,
    };
    assert!(
        matches!(&first, Delivery::Recorded(c) if *c == want),
        "{first:?}"
    );
    assert!(
        matches!(&again, Delivery::Replayed(c) if *c == want),
        "{again:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}
