//! A JetStream consumer whose handler runs once per message, however often it is delivered.
//!
//! ```text
//! nats-server -js &          # the broker (Debian: apt-get install nats-server; /usr/sbin)
//! cargo run --example message_nats --features nats
//! ```
//!
//! `NATS_URL` (default `127.0.0.1:4222`) names another server. The example creates the stream
//! `EXAMPLE_ORDERS` (subjects `example.orders.>`) and the durable pull consumer `invoices`,
//! publishes four messages — order 1, order 1 again under the same `Idempotency-Key` (a
//! producer's retry), order 2 with no key, and order 2's bytes again — then handles them: the
//! invoice goes out once per order, the repeats are acknowledged without running. It prints each
//! outcome and the reply the server got, then deletes the stream and exits.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio_stream::StreamExt;
use tower::{ServiceBuilder, service_fn};
use tower_idempotency::MemoryStore;
use tower_idempotency::message::MessageIdempotencyLayer;
use tower_idempotency::message::nats::async_nats::{self, jetstream};
use tower_idempotency::message::nats::{JetStreamConsumer, keys};

const STREAM: &str = "EXAMPLE_ORDERS";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".to_owned());
    let client = async_nats::connect(&url).await.map_err(|e| {
        format!("cannot reach NATS at {url} ({e}); start it with `nats-server -js`")
    })?;
    let js = jetstream::new(client);
    let _ = js.delete_stream(STREAM).await; // a fresh start on every run
    let stream = js
        .create_stream(jetstream::stream::Config {
            name: STREAM.into(),
            subjects: vec!["example.orders.>".into()],
            ..Default::default()
        })
        .await?;
    let ack_wait = Duration::from_secs(10);
    let consumer: jetstream::consumer::PullConsumer = stream
        .create_consumer(jetstream::consumer::pull::Config {
            durable_name: Some("invoices".into()),
            ack_wait,
            ..Default::default()
        })
        .await?;

    for (key, body) in [
        (Some("order-1"), "order 1"),
        (Some("order-1"), "order 1"),
        (None, "order 2"),
        (None, "order 2"),
    ] {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(key) = key {
            headers.insert("Idempotency-Key", key);
        }
        js.publish_with_headers("example.orders.created", headers, body.into())
            .await?
            .await?;
    }

    // The handler: "sends an invoice" (counts it). The memory store is enough for one process;
    // replicas share a `RedisStore` or `PostgresStore` instead. The defaults lose nothing if a
    // consumer crashes mid-handler: a redelivery of a message still claimed waits a second,
    // then is naked with a short, growing delay until the claim is recorded or lapses.
    let invoices = Arc::new(AtomicUsize::new(0));
    let sent = Arc::clone(&invoices);
    let handler = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "invoices").identify(keys()))
        .service(service_fn(move |m: async_nats::Message| {
            let sent = Arc::clone(&sent);
            async move {
                println!(
                    "  sending the invoice for {:?}",
                    String::from_utf8_lossy(&m.payload)
                );
                sent.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(())
            }
        }));
    // The consumer's `ack_wait` is read from the server with the first delivery.
    let consumer_loop = JetStreamConsumer::new(handler);

    let mut messages = consumer
        .fetch()
        .max_messages(4)
        .expires(Duration::from_secs(5))
        .messages()
        .await?;
    while let Some(message) = messages.next().await {
        let message = message?;
        let body = String::from_utf8_lossy(&message.payload).into_owned();
        let processed = consumer_loop.handle(message).await;
        println!("{body:?}: {:?} -> {:?}", processed.outcome, processed.reply);
    }
    println!(
        "invoices sent: {} (for 4 deliveries of 2 orders)",
        invoices.load(Ordering::SeqCst)
    );
    js.delete_stream(STREAM).await?;
    Ok(())
}
