//! Batches over each store (expanded in `main.rs` through `door.rs`).

use crate::rig::{Act, Msg, door};
use crate::support::http::SpyStore;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::Store;
use tower_idempotency::outbound::{Delivery, OutboundError, OutboundErrorKind};

const LEASE: Duration = Duration::from_secs(30);

pub(crate) async fn batch_sends_fresh_requests_once_and_answers_repeats_in_place<S: Store>(
    store: SpyStore<S>,
) {
    let (mut door, provider) = door(store, LEASE, None);
    // "old" went in an earlier run of the job.
    door.clone()
        .oneshot(Msg::new("old", "o", Act::Take))
        .await
        .unwrap();
    let batch = vec![
        Msg::new("a", "A", Act::Take),
        Msg::new("old", "o", Act::Take),
        Msg::new("b", "B", Act::Take),
        Msg::new("a", "A", Act::Take), // repeated inside the batch
    ];
    let out = door.send_batch(batch).await;
    assert_eq!(out.len(), 4, "one answer per request, in order");
    assert!(
        matches!(&out[0], Ok(Delivery::Sent(r)) if r == "receipt 2: A"),
        "{:?}",
        out[0]
    );
    assert!(
        matches!(&out[1], Ok(Delivery::Replayed(r)) if r == "receipt 1: o"),
        "{:?}",
        out[1]
    );
    assert!(
        matches!(&out[2], Ok(Delivery::Sent(r)) if r == "receipt 3: B"),
        "{:?}",
        out[2]
    );
    assert!(
        matches!(&out[3], Ok(Delivery::Replayed(r)) if r == "receipt 2: A"),
        "{:?}",
        out[3]
    );
    assert_eq!(
        provider.batches(),
        1,
        "the fresh requests went in one batch call"
    );
    assert_eq!(provider.received(), 3, "old once before, a and b once now");

    // The job runs again: the whole batch is answered from the receipts.
    let again = door
        .send_batch(vec![
            Msg::new("a", "A", Act::Take),
            Msg::new("b", "B", Act::Take),
        ])
        .await;
    assert!(
        again.iter().all(|r| matches!(r, Ok(Delivery::Replayed(_)))),
        "{again:?}"
    );
    assert_eq!(
        provider.batches(),
        1,
        "no batch call for a batch of repeats"
    );
    assert_eq!(provider.received(), 3);
}

pub(crate) async fn batch_without_a_batch_path_sends_each_fresh_request<S: Store>(
    store: SpyStore<S>,
) {
    let (mut door, provider) = door(store, LEASE, None);
    let out = door
        .send_each(vec![
            Msg::new("a", "A", Act::Take),
            Msg::new("b", "B", Act::Refuse),
            Msg::new("a", "A", Act::Take),
            Msg::new("c", "C", Act::Reset),
        ])
        .await;
    assert!(out[0].as_ref().unwrap().is_sent());
    assert_eq!(
        out[1].as_ref().unwrap_err().kind(),
        OutboundErrorKind::Failed
    );
    assert!(matches!(out[2], Ok(Delivery::Replayed(_))), "{:?}", out[2]);
    assert!(out[3].as_ref().unwrap().is_unknown());
    assert_eq!(provider.batches(), 0);
    assert_eq!(
        provider.received(),
        2,
        "a once, c once (its delivery unknown), b refused"
    );

    let retry = door
        .send_each(vec![
            Msg::new("b", "B", Act::Take),
            Msg::new("c", "C", Act::Take),
        ])
        .await;
    assert!(
        retry[0].as_ref().unwrap().is_sent(),
        "b was released: {:?}",
        retry[0]
    );
    assert!(
        matches!(retry[1], Ok(Delivery::Held)),
        "c is held: {:?}",
        retry[1]
    );
    assert_eq!(provider.received(), 3);
}

pub(crate) async fn batch_repeat_with_another_request_is_key_reused<S: Store>(store: SpyStore<S>) {
    let (mut door, provider) = door(store, LEASE, None);
    let out = door
        .send_batch(vec![
            Msg::new("a", "A", Act::Take),
            Msg::new("a", "other", Act::Take),
        ])
        .await;
    assert!(out[0].as_ref().unwrap().is_sent());
    assert_eq!(
        out[1].as_ref().unwrap_err().kind(),
        OutboundErrorKind::KeyReused
    );
    assert_eq!(provider.received(), 1);
}

pub(crate) async fn batch_repeat_of_a_failed_request_is_told_it_failed<S: Store>(
    store: SpyStore<S>,
) {
    let (mut door, provider) = door(store, LEASE, None);
    let out = door
        .send_batch(vec![
            Msg::new("a", "A", Act::Refuse),
            Msg::new("a", "A", Act::Take),
            Msg::new("c", "C", Act::Reset),
            Msg::new("c", "C", Act::Take),
        ])
        .await;
    assert_eq!(
        out[0].as_ref().unwrap_err().kind(),
        OutboundErrorKind::Failed
    );
    let repeat = out[1].as_ref().unwrap_err();
    assert!(
        matches!(repeat, OutboundError::RepeatFailed { retryable: true }),
        "not in flight: nothing runs, the key is free: {repeat:?}"
    );
    assert!(repeat.is_retryable());
    assert!(matches!(out[3], Ok(Delivery::Held)), "{:?}", out[3]);
    assert_eq!(provider.received(), 1, "c once");
    let retry = door.send_batch(vec![Msg::new("a", "A", Act::Take)]).await;
    assert!(matches!(retry[0], Ok(Delivery::Sent(_))), "{:?}", retry[0]);
}

/// A paused clock, the memory store.
mod paused {
    use super::*;
    use crate::door::wait_until;

    #[tokio::test(start_paused = true)]
    async fn a_batch_keeps_its_keys_while_it_is_out() {
        let store = SpyStore::new();
        let (mut door, provider) = door(store.clone(), LEASE, None);
        let probe = door.clone();
        let batch = tokio::spawn(async move {
            door.send_batch(vec![
                Msg::new("b", "B", Act::Take),
                Msg::new("c", "C", Act::Take),
                Msg::new("a", "A", Act::Stall),
            ])
            .await
        });
        wait_until(|| provider.received() == 3).await;
        tokio::time::sleep(LEASE * 4).await; // four leases: renewed, or lost long ago
        let meanwhile = probe
            .clone()
            .oneshot(Msg::new("b", "B", Act::Take))
            .await
            .unwrap();
        assert!(matches!(meanwhile, Delivery::InFlight), "{meanwhile:?}");
        assert!(
            store.renews() >= 3 * 11,
            "each key renewed every third of the lease"
        );
        provider.open();
        let out = batch.await.unwrap();
        assert!(
            out.iter().all(|r| matches!(r, Ok(Delivery::Sent(_)))),
            "{out:?}"
        );
        assert_eq!(provider.received(), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_of_many_fresh_requests_goes_in_one_call() {
        // One renewal loop for all keys: no future nested per key to poll through.
        let (mut door, provider) = door(SpyStore::new(), LEASE, None);
        let n = 20_000;
        let batch: Vec<Msg> = (0..n)
            .map(|i| Msg::new(&format!("k{i}"), "m", Act::Take))
            .collect();
        let out = door.send_batch(batch).await;
        assert!(out.iter().all(|r| matches!(r, Ok(Delivery::Sent(_)))));
        assert_eq!((provider.received(), provider.batches()), (n, 1));
    }
}
