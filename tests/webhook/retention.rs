//! Each sender's retention by default: a redelivery just before it is answered from the
//! record, one just after runs again. The memory store's clock is moved by hand.

use crate::app::{Handler, deliver, router};
use crate::sign::{self, Delivery};
use crate::support::http::TestServer;
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency::engine::Engine;
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::webhook::{Sender, Stripe, WebhookLayer};

const HOUR: Duration = Duration::from_secs(60 * 60);

/// A sender's delivery of an id, signed now.
type Signed = fn(&str) -> Delivery;

#[tokio::test]
async fn each_sender_keeps_its_ids_for_its_retry_horizon_by_default() {
    let cases: [(&str, Duration, Signed); 4] = [
        ("stripe", 72 * HOUR, sign::stripe),
        ("github", 72 * HOUR, sign::github),
        ("standard", 72 * HOUR, sign::standard),
        ("shopify", 48 * HOUR, sign::shopify),
    ];
    for (sender, horizon, delivery) in cases {
        let clock = ManualClock::new();
        let store = MemoryStore::builder()
            .clock(clock.clone())
            .build()
            .expect("a store");
        let handler = Handler::new();
        let engine = Engine::new(Arc::new(store));
        let server = TestServer::start(router(engine, Arc::clone(&handler))).await;
        let id = format!("{sender}-event-1");
        let delivery = delivery(&id);
        assert!(!deliver(&server, &delivery).await.replayed, "{sender}");
        clock.advance(horizon - Duration::from_secs(1));
        let before = deliver(&server, &delivery).await;
        assert!(
            before.replayed,
            "{sender}: kept until its horizon: {before:?}"
        );
        clock.advance(Duration::from_secs(2));
        let after = deliver(&server, &delivery).await;
        assert_eq!(
            (after.status, after.replayed),
            (200, false),
            "{sender}: {after:?}"
        );
        assert_eq!(
            handler.runs(&id),
            2,
            "{sender}: runs again after its retention"
        );
    }
}

/// The layer's retention is the sender's over the engine's; `retention` sets another.
#[test]
fn the_retention_is_the_senders_unless_set() {
    let stripe = Stripe::new(sign::STRIPE_SECRET).unwrap();
    let engine = Engine::builder(MemoryStore::new()).retention(HOUR).build();
    let layer = WebhookLayer::new(stripe.clone(), engine);
    assert_eq!(layer.engine().retention(), stripe.retention());
    assert_eq!(layer.engine().retention(), 72 * HOUR);
    let layer = layer.retention(7 * 24 * HOUR);
    assert_eq!(layer.engine().retention(), 7 * 24 * HOUR);
}
