//! Feature `metrics`: the webhook door counts as the other doors, under `door=webhook`, with
//! the same outcome and result words.
#![cfg(feature = "metrics")]

use crate::app::{Handler, deliver, router};
use crate::sign;
use crate::support::http::TestServer;
use crate::support::metrics::moved_once;
use metrics_util::debugging::DebuggingRecorder;
use std::sync::Arc;
use tower_idempotency::MemoryStore;
use tower_idempotency::engine::Engine;

#[tokio::test]
async fn a_webhook_delivery_is_counted_under_its_own_door() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let handler = Handler::new();
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let server = TestServer::start(router(engine, Arc::clone(&handler))).await;

    deliver(&server, &sign::stripe("evt_counted")).await;
    assert_eq!(
        moved_once(&snap),
        ["door=webhook,outcome=ran", "door=webhook,result=completed"]
    );
    assert!(
        deliver(&server, &sign::stripe("evt_counted"))
            .await
            .replayed
    );
    assert_eq!(moved_once(&snap), ["door=webhook,outcome=replayed"]);

    handler.answer("evt_failed", &[500]);
    deliver(&server, &sign::stripe("evt_failed")).await;
    assert_eq!(
        moved_once(&snap),
        ["door=webhook,outcome=ran", "door=webhook,result=released"]
    );

    let forged = sign::github_with("not the secret", "d-1", "{}");
    assert_eq!(deliver(&server, &forged).await.status, 401);
    assert_eq!(moved_once(&snap), ["door=webhook,outcome=unverified"]);

    let no_id = sign::stripe_at(sign::STRIPE_SECRET, sign::now(), "{}");
    assert_eq!(deliver(&server, &no_id).await.status, 400);
    assert_eq!(moved_once(&snap), ["door=webhook,outcome=key_missing"]);

    // Standard Webhooks signs its id: a delivery without one cannot be verified.
    let mut no_signed_id = sign::standard("msg_counted");
    no_signed_id
        .headers
        .retain(|(name, _)| *name != "webhook-id");
    assert_eq!(deliver(&server, &no_signed_id).await.status, 401);
    assert_eq!(moved_once(&snap), ["door=webhook,outcome=unverified"]);
}
