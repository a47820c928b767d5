//! Send once: an outbound webhook that a retried request delivers once.
//!
//! ```text
//! cargo run --example outbound_webhook
//! ```
//!
//! Everything runs in this process on loopback ports it picks: a webhook receiver (a partner's
//! endpoint, which counts deliveries and echoes the `Idempotency-Key` it got), and a sender:
//! hyper-util's HTTP client behind `HttpSendOnceLayer`. An inbound order request is handled
//! twice with the same key (the client retried it after a timeout); its handler sends the
//! `order.created` webhook under the inbound request's derived key each time. The partner
//! receives it once, and sees the same key a retry of ours would send.

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower::{ServiceBuilder, ServiceExt};
use tower_idempotency::engine::{Engine, Scope};
use tower_idempotency::outbound::Delivery;
use tower_idempotency::outbound::http::HttpSendOnceLayer;
use tower_idempotency::{DerivedKey, IdempotencyKey, MemoryStore};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // The partner's webhook endpoint.
    let deliveries = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&deliveries);
    let receiver = Router::new().route(
        "/hooks",
        post(move |headers: HeaderMap, body: Bytes| async move {
            let n = counter.fetch_add(1, Ordering::SeqCst) + 1;
            let key = headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            println!(
                "  partner: delivery {n}, {} bytes, key {}…",
                body.len(),
                &key[..12.min(key.len())]
            );
            (StatusCode::ACCEPTED, Json(json!({ "delivery": n })))
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hooks = format!("http://{}/hooks", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, receiver).await });

    // Our sender: one store for every outbound door; webhooks in their own namespace.
    let engine = Engine::new(MemoryStore::new());
    let webhooks = ServiceBuilder::new()
        .layer(HttpSendOnceLayer::new(engine).namespace("webhooks"))
        .service(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    // The inbound request `POST /orders` with `Idempotency-Key: 7f3c…` from alice, handled
    // twice: in an axum handler behind `IdempotencyLayer` this is the `DerivedKey` extractor.
    let inbound = DerivedKey::derive(
        "orders",
        &Scope::principal("alice"),
        &IdempotencyKey::new("7f3c9a2e-order-17")?,
    );
    for attempt in 1..=2 {
        println!("inbound attempt {attempt}: sending order.created");
        let mut event = Request::post(&hooks)
            .header("content-type", "application/json")
            .body(Bytes::from(
                json!({ "type": "order.created", "order": 17 }).to_string(),
            ))?;
        event.extensions_mut().insert(inbound.clone());
        match webhooks.clone().oneshot(event).await? {
            Delivery::Recorded(res) => println!("  sent: {} {}", res.status(), body(res.body())),
            Delivery::Replayed(res) => {
                println!(
                    "  not sent again: the receipt {} {}",
                    res.status(),
                    body(res.body())
                );
            }
            Delivery::InFlight => {
                println!("  another send is running, or its delivery is unknown: nothing sent")
            }
            Delivery::Held(_) => println!("  delivery unknown: the key is held"),
            Delivery::Released(response) | Delivery::Failed(response) => {
                println!("  rejected with {}", response.status());
            }
            _ => println!("  another outcome"),
        }
    }
    let n = deliveries.load(Ordering::SeqCst);
    println!("the partner received {n} delivery");
    assert_eq!(n, 1);
    Ok(())
}

fn body(b: &Bytes) -> Value {
    serde_json::from_slice(b).unwrap_or(Value::Null)
}
