//! Webhooks: Stripe, GitHub and Standard Webhooks deliveries, each event run once.
//!
//! ```text
//! STRIPE_WEBHOOK_SECRET=whsec_… GITHUB_WEBHOOK_SECRET=… STANDARD_WEBHOOK_SECRET=whsec_… \
//!     cargo run -p tower-idempotency --all-features --example webhooks
//! ```
//!
//! It serves on `127.0.0.1:$PORT` (3000 by default):
//!
//! - `POST /webhooks/stripe`, `POST /webhooks/github`, `POST /webhooks/standard`, each
//!   verified with the secret in `STRIPE_WEBHOOK_SECRET`, `GITHUB_WEBHOOK_SECRET` and
//!   `STANDARD_WEBHOOK_SECRET` (`whsec_` and base64). A secret not set is a test secret,
//!   printed at start: never deploy it.
//! - `GET /stats`: `{"executions": N}`, the handler's runs so far.
//!
//! The handler counts each run. A JSON body with a top-level `"delay_ms": N` makes it sleep N
//! ms; `"fail_once": true` makes it answer 500 the first time that event runs, so the
//! sender's retry runs it again. A redelivery of a completed event is answered from the
//! record, with `idempotent-replayed: true`; one of an event still running gets 409 with
//! `Retry-After`; a forged or stale one gets 401 and is never stored.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_idempotency::engine::Engine;
use tower_idempotency::webhook::{GitHub, StandardWebhooks, Stripe, WebhookLayer};
use tower_idempotency::{IdempotencyKey, MemoryStore};

/// What the handler did, shared by the three routes.
#[derive(Default)]
struct Counts {
    executions: AtomicU64,
    /// The events that have failed once already.
    failed: Mutex<HashSet<String>>,
}

/// One handler for every sender: the delivery id is the key the layer claimed, the body is
/// the verified raw body.
async fn receive(State(counts): State<Arc<Counts>>, key: IdempotencyKey, body: Bytes) -> Response {
    let n = counts.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let event: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if let Some(ms) = event.get("delay_ms").and_then(serde_json::Value::as_u64) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if event.get("fail_once") == Some(&json!(true)) {
        let first = counts
            .failed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(key.as_str().to_owned());
        if first {
            println!("event {}: run {n}, failing once", key.as_str());
            return (StatusCode::INTERNAL_SERVER_ERROR, "failing once").into_response();
        }
    }
    println!("event {}: run {n}", key.as_str());
    Json(json!({ "received": key.as_str(), "execution": n })).into_response()
}

async fn stats(State(counts): State<Arc<Counts>>) -> Json<serde_json::Value> {
    Json(json!({ "executions": counts.executions.load(Ordering::SeqCst) }))
}

/// The secret in `var`, or a test secret, said aloud.
fn secret(var: &str, test: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        println!("{var} not set: using the test secret {test}");
        test.to_owned()
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stripe = Stripe::new(secret("STRIPE_WEBHOOK_SECRET", "whsec_test_stripe"))?;
    let github = GitHub::new(secret("GITHUB_WEBHOOK_SECRET", "test_github"))?;
    let standard = StandardWebhooks::new(&secret(
        "STANDARD_WEBHOOK_SECRET",
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    ))?;
    // One store for the three endpoints; each sender keeps its ids for its own retention.
    let engine = Engine::new(MemoryStore::new());

    let app = Router::new()
        .route(
            "/webhooks/stripe",
            post(receive).layer(WebhookLayer::new(stripe, engine.clone())),
        )
        .route(
            "/webhooks/github",
            post(receive).layer(WebhookLayer::new(github, engine.clone())),
        )
        .route(
            "/webhooks/standard",
            post(receive).layer(WebhookLayer::new(standard, engine)),
        )
        .route("/stats", get(stats))
        .with_state(Arc::new(Counts::default()));

    let port: u16 = match std::env::var("PORT") {
        Ok(p) => p.parse()?,
        Err(_) => 3000,
    };
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
