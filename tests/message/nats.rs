//! The JetStream adapter against a real `nats-server -js` (one per test, on a free loopback
//! port with a temporary store): crash before ack, crash mid-handler, two durable consumers, a
//! handler slower than `ack_wait` (given, or read from the server), a failing handler's naks,
//! a reused key, a store outage.
//!
//! Times are real (the server's `ack_wait` cannot be paused): `ack_wait` is 1 s, so each test
//! takes a few seconds.
#![cfg(feature = "nats")]
#![allow(clippy::unwrap_used)]

use crate::support::http::SpyStore;
use crate::support::nats_server::{self, NatsServer};
use bytes::Bytes;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_stream::StreamExt;
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_idempotency::MemoryStore;
use tower_idempotency::Store;
use tower_idempotency::engine::Engine;
use tower_idempotency::engine::Verdict;
use tower_idempotency::message::nats::async_nats::{self, jetstream};
use tower_idempotency::message::nats::{JetStreamConsumer, Reply, keys};
use tower_idempotency::message::{Handled, MessageErrorKind, MessageIdempotencyLayer};

use jetstream::consumer::{AckPolicy, PullConsumer, pull};

const ACK_WAIT: Duration = Duration::from_secs(1);
const STREAM: &str = "ORDERS";

struct Rig {
    server: NatsServer,
    js: jetstream::Context,
}

/// A server with the stream `ORDERS` on `orders.>`, or `None` (skip) without `nats-server`.
async fn rig() -> Option<Rig> {
    if !nats_server::available() {
        return None;
    }
    let server = NatsServer::start();
    let js = jetstream::new(async_nats::connect(server.addr()).await.unwrap());
    js.create_stream(jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["orders.>".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    Some(Rig { server, js })
}

impl Rig {
    /// Creates the durable pull consumer `name` (explicit acks, `ack_wait` 1 s).
    async fn durable(&self, name: &str) {
        self.js
            .get_stream(STREAM)
            .await
            .unwrap()
            .create_consumer(pull::Config {
                durable_name: Some(name.into()),
                ack_policy: AckPolicy::Explicit,
                ack_wait: ACK_WAIT,
                ..Default::default()
            })
            .await
            .unwrap();
    }

    /// The durable consumer `name` on a connection of its own: another consumer process, as
    /// far as the server can tell.
    async fn connect(&self, name: &str) -> PullConsumer {
        let js = jetstream::new(async_nats::connect(self.server.addr()).await.unwrap());
        js.get_stream(STREAM)
            .await
            .unwrap()
            .get_consumer(name)
            .await
            .unwrap()
    }

    async fn publish(&self, subject: &str, key: Option<&str>, body: &str) {
        let mut headers = async_nats::HeaderMap::new();
        if let Some(k) = key {
            headers.insert("Idempotency-Key", k);
        }
        self.js
            .publish_with_headers(
                subject.to_owned(),
                headers,
                Bytes::copy_from_slice(body.as_bytes()),
            )
            .await
            .unwrap()
            .await
            .unwrap();
    }
}

/// The next delivery to `consumer`, waiting at most `wait`.
async fn next(consumer: &PullConsumer, wait: Duration) -> Option<jetstream::Message> {
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(wait)
        .messages()
        .await
        .unwrap();
    batch.next().await.map(Result::unwrap)
}

/// The side effects done, per message body.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, usize>>>);

impl Effects {
    fn count(&self, body: &str) -> usize {
        self.0.lock().unwrap().get(body).copied().unwrap_or(0)
    }

    /// A handler that sleeps `sleep`, then does its side effect (counts the body).
    fn handler(
        &self,
        sleep: Duration,
    ) -> impl Service<async_nats::Message, Response = (), Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static {
        let effects = self.clone();
        service_fn(move |m: async_nats::Message| {
            let effects = effects.clone();
            async move {
                tokio::time::sleep(sleep).await;
                let body = String::from_utf8(m.payload.to_vec()).unwrap();
                *effects.0.lock().unwrap().entry(body).or_default() += 1;
                Ok::<_, Infallible>(())
            }
        })
    }
}

fn layer<St: Store>(
    engine: &Engine<St>,
    consumer: &str,
) -> MessageIdempotencyLayer<St, tower_idempotency::message::HeaderOrHash> {
    MessageIdempotencyLayer::new(engine.clone(), consumer).identify(keys())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_dies_before_acking_hands_over_and_the_effect_happens_once() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    let effects = Effects::default();
    rig.publish("orders.created", None, "order-1").await;

    // Consumer A handles the message (the effect and its record happen), then dies before it
    // acknowledges: its connection is dropped with the message unacked.
    {
        let a = rig.connect("billing").await;
        let msg = next(&a, Duration::from_secs(5))
            .await
            .expect("first delivery");
        assert_eq!(msg.info().unwrap().delivered, 1);
        let (msg, _acker_never_used) = msg.split();
        let svc = ServiceBuilder::new()
            .layer(layer(&engine, "billing"))
            .service(effects.handler(Duration::ZERO));
        assert_eq!(svc.oneshot(msg).await.unwrap(), Handled::Recorded(()));
    }
    assert_eq!(effects.count("order-1"), 1);

    // Consumer B gets the redelivery once `ack_wait` has passed, and acknowledges it unrun.
    let b = rig.connect("billing").await;
    let msg = next(&b, Duration::from_secs(5))
        .await
        .expect("the redelivery");
    assert_eq!(
        msg.info().unwrap().delivered,
        2,
        "a redelivery, on another consumer"
    );
    let svc = ServiceBuilder::new()
        .layer(layer(&engine, "billing"))
        .service(effects.handler(Duration::ZERO));
    let processed = JetStreamConsumer::new(svc)
        .ack_wait(ACK_WAIT)
        .handle(msg)
        .await;
    assert_eq!(processed.outcome.unwrap(), Handled::Replayed(None));
    assert_eq!(processed.reply, Reply::Ack);
    assert_eq!(effects.count("order-1"), 1, "the side effect happened once");

    // Acknowledged: no further delivery, even after another ack_wait.
    assert!(next(&b, ACK_WAIT * 2).await.is_none(), "the ack was taken");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_dies_mid_handler_blocks_the_key_for_the_lease_then_it_runs() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let lease = Duration::from_secs(4);
    let engine = Engine::builder(MemoryStore::new()).lease(lease).build();
    let effects = Effects::default();
    rig.publish("orders.created", Some("k-7"), "order-7").await;

    // A claims the key and dies inside the handler, before its side effect (a crash: not run
    // to completion).
    let a = rig.connect("billing").await;
    let msg = next(&a, Duration::from_secs(5)).await.unwrap();
    let svc = ServiceBuilder::new()
        .layer(layer(&engine, "billing").run_to_completion(false))
        .service(effects.handler(Duration::from_secs(60)));
    let claimed = Instant::now();
    let a_task = tokio::spawn(svc.oneshot(msg.split().0));
    tokio::time::sleep(Duration::from_millis(200)).await;
    a_task.abort();
    drop(a);

    // B, with the door's and the adapter's defaults: every redelivery within the lease is in
    // flight and naked with a short delay (never acknowledged); once the lease has lapsed, the
    // message runs, once.
    let b = rig.connect("billing").await;
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(layer(&engine, "billing"))
            .service(effects.handler(Duration::ZERO)),
    );
    let mut delays = Vec::new();
    let ran = loop {
        assert!(claimed.elapsed() < lease * 4, "not run; naks {delays:?}");
        let msg = next(&b, Duration::from_secs(6))
            .await
            .expect("redelivered after each nak's delay");
        let processed = consumer.handle(msg).await;
        match processed.reply {
            Reply::Nak(Some(delay)) => {
                assert_eq!(
                    processed.outcome.unwrap_err().kind(),
                    MessageErrorKind::InFlight
                );
                delays.push(delay);
            }
            Reply::Ack => break processed.outcome.unwrap(),
            other => panic!("neither in flight nor run: {other:?}"),
        }
    };
    assert_eq!(ran, Handled::Recorded(()));
    assert!(claimed.elapsed() >= lease, "not before the lease lapsed");
    assert!(!delays.is_empty(), "a redelivery came within the lease");
    assert!(
        delays.iter().all(|d| *d <= lease / 3),
        "each delay at most a third of the lease, not the lease left: {delays:?}"
    );
    assert_eq!(effects.count("order-7"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_is_naked_with_a_growing_delay_and_a_permanent_error_terminated() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    rig.publish("orders.created", Some("k-f"), "flaky").await;
    let attempts = Arc::new(Mutex::new(0usize));
    let seen = Arc::clone(&attempts);
    let handler = service_fn(move |m: async_nats::Message| {
        let seen = Arc::clone(&seen);
        async move {
            let mut n = seen.lock().unwrap();
            *n += 1;
            match (&m.payload[..], *n) {
                (b"bad input", _) => Err("unparsable"),
                (_, 1 | 2) => Err("try again"),
                _ => Ok(()),
            }
        }
    });
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(
                layer(&engine, "billing").classify(|r: &Result<(), &str>| match r {
                    Ok(()) => Verdict::Record,
                    Err(e) if *e == "unparsable" => Verdict::Fail,
                    Err(_) => Verdict::Release,
                }),
            )
            .service(handler),
    );
    let c = rig.connect("billing").await;

    let first = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(first.reply, Reply::Nak(Some(Duration::from_secs(1))));
    assert!(
        next(&c, Duration::from_millis(600)).await.is_none(),
        "not redelivered at once"
    );
    let msg = next(&c, Duration::from_secs(5)).await.unwrap();
    assert_eq!(msg.info().unwrap().delivered, 2);
    let second = consumer.handle(msg).await;
    assert_eq!(
        second.reply,
        Reply::Nak(Some(Duration::from_secs(2))),
        "doubled on the second delivery"
    );
    let third = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(third.outcome.unwrap(), Handled::Recorded(()));
    assert_eq!(third.reply, Reply::Ack);

    // A permanent error: terminated, never redelivered.
    rig.publish("orders.created", Some("k-b"), "bad input")
        .await;
    let bad = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    let bad_error = bad.outcome.unwrap_err();
    assert_eq!(bad_error.kind(), MessageErrorKind::Work);
    assert!(!bad_error.is_retryable());
    assert_eq!(bad.reply, Reply::Term);
    assert!(
        next(&c, ACK_WAIT * 2).await.is_none(),
        "terminated: never redelivered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumers_ack_wait_is_read_from_the_server() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    let effects = Effects::default();
    rig.publish("orders.created", None, "slow-order").await;

    // No `ack_wait` given: the adapter reads the consumer's (1 s) and sends progress every
    // third of it, where assuming JetStream's default (30 s) would let the server redeliver.
    let a = rig.connect("billing").await;
    let msg = next(&a, Duration::from_secs(5)).await.unwrap();
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(layer(&engine, "billing"))
            .service(effects.handler(ACK_WAIT * 3)),
    );
    let running = tokio::spawn(async move { consumer.handle(msg).await });
    let b = rig.connect("billing").await;
    let stolen = next(&b, ACK_WAIT * 3 + Duration::from_millis(500)).await;
    assert!(
        stolen.is_none(),
        "redelivered mid-work: {:?}",
        stolen.map(|m| m.info().unwrap().delivered)
    );
    let processed = running.await.unwrap();
    assert_eq!(processed.outcome.unwrap(), Handled::Recorded(()));
    assert_eq!(effects.count("slow-order"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_durable_consumers_each_handle_a_message_once() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    rig.durable("shipping").await;
    let engine = Engine::new(MemoryStore::new());
    let (billing_effects, shipping_effects) = (Effects::default(), Effects::default());
    // A producer that retried its publish: the same key twice (no Nats-Msg-Id, so the
    // stream keeps both).
    rig.publish("orders.created", Some("order-9"), "order-9")
        .await;
    rig.publish("orders.created", Some("order-9"), "order-9")
        .await;

    for (name, effects) in [
        ("billing", &billing_effects),
        ("shipping", &shipping_effects),
    ] {
        let c = rig.connect(name).await;
        let consumer = JetStreamConsumer::new(
            ServiceBuilder::new()
                .layer(layer(&engine, name))
                .service(effects.handler(Duration::ZERO)),
        )
        .ack_wait(ACK_WAIT);
        let mut outcomes = Vec::new();
        for _ in 0..2 {
            let msg = next(&c, Duration::from_secs(5)).await.unwrap();
            let processed = consumer.handle(msg).await;
            assert_eq!(processed.reply, Reply::Ack);
            outcomes.push(processed.outcome.unwrap());
        }
        assert_eq!(
            outcomes,
            [Handled::Recorded(()), Handled::Replayed(None)],
            "{name}"
        );
    }
    assert_eq!(billing_effects.count("order-9"), 1);
    assert_eq!(
        shipping_effects.count("order-9"),
        1,
        "not skipped as billing's repeat"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_slower_than_ack_wait_is_not_redelivered_while_it_runs() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    let effects = Effects::default();
    rig.publish("orders.created", None, "slow-order").await;

    let a = rig.connect("billing").await;
    let msg = next(&a, Duration::from_secs(5)).await.unwrap();
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(layer(&engine, "billing").wait_in_flight(Duration::ZERO))
            .service(effects.handler(ACK_WAIT * 3)),
    )
    .ack_wait(ACK_WAIT);
    let running = tokio::spawn(async move { consumer.handle(msg).await });

    // Another consumer of the same durable pulls for the whole run: progress keeps the message
    // from being redelivered to it.
    let b = rig.connect("billing").await;
    let stolen = next(&b, ACK_WAIT * 3 + Duration::from_millis(500)).await;
    assert!(
        stolen.is_none(),
        "redelivered mid-work: {:?}",
        stolen.map(|m| m.info().unwrap().delivered)
    );
    let processed = running.await.unwrap();
    assert_eq!(processed.outcome.unwrap(), Handled::Recorded(()));
    assert_eq!(processed.reply, Reply::Ack);
    assert_eq!(effects.count("slow-order"), 1);
    assert!(
        next(&b, ACK_WAIT * 2).await.is_none(),
        "acknowledged once done"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_reused_by_another_message_is_terminated() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    let effects = Effects::default();
    rig.publish("orders.created", Some("k-1"), "first").await;
    rig.publish("orders.created", Some("k-1"), "second").await;

    let c = rig.connect("billing").await;
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(layer(&engine, "billing"))
            .service(effects.handler(Duration::ZERO)),
    )
    .ack_wait(ACK_WAIT);
    let first = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(first.reply, Reply::Ack);
    let second = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(
        second.outcome.unwrap_err().kind(),
        MessageErrorKind::KeyReused
    );
    assert_eq!(second.reply, Reply::Term);
    assert!(
        next(&c, ACK_WAIT * 2).await.is_none(),
        "terminated: never redelivered"
    );
    assert_eq!((effects.count("first"), effects.count("second")), (1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_outage_naks_with_backoff_and_the_redelivery_runs() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let spy = SpyStore::new();
    let engine = Engine::new(spy.clone());
    let effects = Effects::default();
    rig.publish("orders.created", Some("k-3"), "order-3").await;

    let c = rig.connect("billing").await;
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(layer(&engine, "billing"))
            .service(effects.handler(Duration::ZERO)),
    )
    .ack_wait(ACK_WAIT)
    .store_backoff(Duration::from_millis(300), Duration::from_secs(5));

    spy.fail_claims(true);
    let processed = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(
        processed.outcome.unwrap_err().kind(),
        MessageErrorKind::Store
    );
    assert_eq!(
        processed.reply,
        Reply::Nak(Some(Duration::from_millis(300)))
    );
    let processed = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(
        processed.reply,
        Reply::Nak(Some(Duration::from_millis(600))),
        "doubled on the second delivery"
    );
    assert_eq!(effects.count("order-3"), 0, "never run without a claim");

    spy.fail_claims(false);
    let msg = next(&c, Duration::from_secs(5)).await.unwrap();
    assert_eq!(msg.info().unwrap().delivered, 3);
    let processed = consumer.handle(msg).await;
    assert_eq!(processed.outcome.unwrap(), Handled::Recorded(()));
    assert_eq!(effects.count("order-3"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_classified_fail_is_terminated_and_one_classified_hold_is_naked() {
    let Some(rig) = rig().await else { return };
    rig.durable("billing").await;
    let engine = Engine::new(MemoryStore::new());
    let handler = service_fn(|m: async_nats::Message| async move {
        Ok::<_, Infallible>(String::from_utf8(m.payload.to_vec()).unwrap())
    });
    let consumer = JetStreamConsumer::new(
        ServiceBuilder::new()
            .layer(
                layer(&engine, "billing").classify(|r: &Result<String, Infallible>| match r {
                    Ok(body) if body == "gone" => Verdict::Fail,
                    Ok(body) if body == "maybe" => Verdict::Hold,
                    _ => Verdict::Record,
                }),
            )
            .service(handler),
    )
    .ack_wait(ACK_WAIT);
    let c = rig.connect("billing").await;

    rig.publish("orders.created", Some("k-gone"), "gone").await;
    let gone = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(gone.outcome.unwrap(), Handled::Failed("gone".into()));
    assert_eq!(gone.reply, Reply::Term);

    rig.publish("orders.created", Some("k-maybe"), "maybe")
        .await;
    let maybe = consumer
        .handle(next(&c, Duration::from_secs(5)).await.unwrap())
        .await;
    assert_eq!(maybe.outcome.unwrap(), Handled::Held("maybe".into()));
    assert_eq!(
        maybe.reply,
        Reply::Nak(Some(Duration::from_millis(500))),
        "naked as a repeat in flight"
    );
}
