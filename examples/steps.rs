//! Steps: a retried checkout finishes the work its first try left half done.
//!
//! ```text
//! cargo run -p tower-idempotency --example steps
//! ```
//!
//! The checkout handler reserves stock, charges a card and sends a receipt, each in a named
//! step. The first request charges the card, then the mail server fails: the handler answers
//! 503, so the key is released and the client retries. The retry runs the handler again:
//! reserve and charge are answered from their records, only the receipt runs.

use axum::body::{Body, to_bytes};
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tower::ServiceExt;
use tower_idempotency::engine::{Raw, Scope, StepError, Steps};
use tower_idempotency::{DerivedKey, IdempotencyLayer, MemoryStore};

/// The providers: each counts what it did.
#[derive(Default)]
struct Providers {
    reserved: AtomicUsize,
    charged: AtomicUsize,
    receipts: AtomicUsize,
    /// The mail server is down for the next receipt.
    mail_down: AtomicBool,
}

impl Providers {
    async fn reserve(&self, order: &Order) -> Result<String, String> {
        self.reserved.fetch_add(1, Ordering::SeqCst);
        Ok(format!("rsv_{}", order.id))
    }

    /// A payment API that de-duplicates by the key it is given: forward the step's key.
    async fn charge(&self, order: &Order, key: DerivedKey) -> Result<String, String> {
        self.charged.fetch_add(1, Ordering::SeqCst);
        println!(
            "  payments: charged {} cents, key {}…",
            order.cents,
            &key.as_str()[..12]
        );
        Ok(format!("ch_{}", &key.as_str()[..8]))
    }

    async fn send_receipt(&self, charge: &str) -> Result<(), String> {
        if self.mail_down.swap(false, Ordering::SeqCst) {
            return Err("the mail server is down".into());
        }
        self.receipts.fetch_add(1, Ordering::SeqCst);
        println!("  mail: receipt for {charge} sent");
        Ok(())
    }
}

#[derive(Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

async fn checkout(
    State(providers): State<Arc<Providers>>,
    steps: Steps,
    Json(order): Json<Order>,
) -> Response {
    let work = async {
        let p = &providers;
        let reservation = steps.run("reserve", Raw, |_| p.reserve(&order)).await?;
        let charge: String = steps
            .run("charge", Raw, |key| p.charge(&order, key))
            .await?;
        steps
            .run("receipt", Raw, |_| p.send_receipt(&charge))
            .await?;
        Ok::<_, StepError<String>>(json!({ "reservation": reservation, "charge": charge }))
    };
    match work.await {
        Ok(body) => (StatusCode::CREATED, Json(body)).into_response(),
        // A 5xx releases the key: the client's retry runs the handler again.
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

#[tokio::main]
async fn main() {
    let providers = Arc::new(Providers::default());
    let app = Router::new()
        .route("/checkout", post(checkout))
        .with_state(Arc::clone(&providers))
        // Your authentication names the caller; every request is alice's here.
        .layer(
            IdempotencyLayer::new(MemoryStore::new())
                .principal_fn(|_| Some(Scope::principal("alice"))),
        );

    providers.mail_down.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for attempt in 1..=2 {
        println!("attempt {attempt}:");
        let req = Request::post("/checkout")
            .header("idempotency-key", "order-17-checkout")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"id": 17, "cents": 4200}"#))
            .expect("a valid request");
        let res = app.clone().oneshot(req).await.expect("infallible");
        let status = res.status();
        let body = to_bytes(res.into_body(), 64 * 1024)
            .await
            .expect("the body");
        println!("  answered {status}: {}", String::from_utf8_lossy(&body));
        answers.push(status);
    }
    assert_eq!(
        answers,
        [StatusCode::SERVICE_UNAVAILABLE, StatusCode::CREATED]
    );

    let reserved = providers.reserved.load(Ordering::SeqCst);
    let charged = providers.charged.load(Ordering::SeqCst);
    let receipts = providers.receipts.load(Ordering::SeqCst);
    println!("reserved {reserved}, charged {charged}, receipts sent {receipts}");
    assert_eq!((reserved, charged, receipts), (1, 1, 1));
}
