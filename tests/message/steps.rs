//! `Steps::current()` in a message handler: a redelivery after a failure runs only the steps
//! that did not complete.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::{ServiceBuilder, ServiceExt, service_fn};
use tower_idempotency::engine::Raw;
use tower_idempotency::message::{Envelope, Handled, MessageErrorKind, MessageIdempotencyLayer};
use tower_idempotency::{MemoryStore, Steps};

#[derive(Default)]
struct Counts {
    charged: AtomicUsize,
    mail_tries: AtomicUsize,
    mailed: AtomicUsize,
}

#[tokio::test]
async fn a_redelivery_after_a_failure_runs_only_the_unfinished_steps() {
    let counts = Arc::new(Counts::default());
    let c = Arc::clone(&counts);
    let handler = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "billing"))
        .service(service_fn(move |_m: Envelope| {
            let c = Arc::clone(&c);
            async move {
                let steps = Steps::current().expect("the message door sets the steps");
                let charge: String = steps
                    .run("charge", Raw, |_| async {
                        Ok::<_, String>(format!("ch-{}", c.charged.fetch_add(1, Ordering::SeqCst)))
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                steps
                    .run("mail", Raw, |_| async {
                        if c.mail_tries.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err(String::from("mail server down"));
                        }
                        c.mailed.fetch_add(1, Ordering::SeqCst);
                        Ok(String::new())
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(charge)
            }
        }));
    let msg = Envelope::new("orders.paid", "order 17");

    let first = handler.clone().oneshot(msg.clone()).await.unwrap_err();
    assert_eq!(first.kind(), MessageErrorKind::Work, "the mail failed");
    assert_eq!(counts.charged.load(Ordering::SeqCst), 1);

    let again = handler.clone().oneshot(msg.clone()).await.unwrap();
    assert!(
        matches!(again, Handled::Recorded(ref c) if c == "ch-0"),
        "{again:?}"
    );
    assert_eq!(counts.charged.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(counts.mailed.load(Ordering::SeqCst), 1, "mailed once");
}

#[tokio::test]
async fn steps_outside_a_claimed_message_are_absent() {
    assert!(Steps::current().is_none());
    // A spawned task does not inherit them: it says so instead of running unrecorded.
    let handler = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "billing"))
        .service(service_fn(|_m: Envelope| async {
            let inside = Steps::current().is_some();
            let spawned = tokio::spawn(async { Steps::current().is_none() })
                .await
                .unwrap();
            Ok::<_, String>(inside && spawned)
        }));
    let ran = handler.oneshot(Envelope::new("t", "b")).await.unwrap();
    assert!(matches!(ran, Handled::Recorded(true)), "{ran:?}");
}

#[tokio::test]
async fn another_message_under_a_key_whose_steps_acted_is_refused_as_a_reused_key() {
    let charged = Arc::new(AtomicUsize::new(0));
    let c = Arc::clone(&charged);
    let handler = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "billing"))
        .service(service_fn(move |m: Envelope| {
            let c = Arc::clone(&c);
            async move {
                let steps = Steps::current().expect("the message door sets the steps");
                steps
                    .run("charge", Raw, |_| async {
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, String>(String::new())
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                // The first message fails after its charge, and is released for redelivery.
                if m.body.as_ref() == b"order 17" {
                    return Err(String::from("mail server down"));
                }
                Ok::<_, String>(String::from("done"))
            }
        }));
    let first = Envelope::new("orders.paid", "order 17").with_header("Idempotency-Key", "k-1");
    let e = handler.clone().oneshot(first.clone()).await.unwrap_err();
    assert_eq!(e.kind(), MessageErrorKind::Work);

    // Another body under the same key: refused as at the claim, whatever the handler returned.
    let other = Envelope::new("orders.paid", "order 18").with_header("Idempotency-Key", "k-1");
    let e = handler.clone().oneshot(other).await.unwrap_err();
    assert_eq!(e.kind(), MessageErrorKind::KeyReused, "{e}");
    assert_eq!(charged.load(Ordering::SeqCst), 1, "charged once");
}
