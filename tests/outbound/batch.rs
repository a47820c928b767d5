//! Batches over each store (expanded in `main.rs` through `door.rs`).

use crate::rig::{Act, Msg, door};
use crate::support::http::SpyStore;
use std::time::Duration;
use tower::ServiceExt;
use tower_idempotency::Store;
use tower_idempotency::outbound::{Delivery, OutboundErrorKind};

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
        matches!(retry[1], Ok(Delivery::InFlight)),
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
