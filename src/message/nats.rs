//! The message door on [async-nats](https://docs.rs/async-nats) JetStream consumers.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use tokio_stream::StreamExt;
//! use tower::{ServiceBuilder, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::message::MessageIdempotencyLayer;
//! use tower_idempotency::message::nats::{JetStreamConsumer, async_nats, keys};
//! use async_nats::jetstream::{self, consumer::pull};
//!
//! # #[tokio::main] async fn main() -> Result<(), async_nats::Error> {
//! let js = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! let stream = js.get_stream("ORDERS").await?;
//! let mut messages: pull::Stream = stream
//!     .get_consumer::<pull::Config>("invoices")
//!     .await?
//!     .messages()
//!     .await?;
//!
//! let handler = ServiceBuilder::new()
//!     .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "invoices").identify(keys()))
//!     .service(service_fn(|m: async_nats::Message| async move {
//!         // send the invoice for m.payload ...
//!         Ok::<_, Infallible>(())
//!     }));
//! let consumer = JetStreamConsumer::new(handler);
//!
//! while let Some(message) = messages.next().await {
//!     let message = match message {
//!         Ok(message) => message,
//!         // A missed heartbeat or a failed pull, as while the server restarts: go on.
//!         Err(e) => {
//!             eprintln!("pull: {e}");
//!             continue;
//!         }
//!     };
//!     let processed = consumer.handle(message).await;
//!     println!("{:?}", processed.reply);
//! }
//! # Ok(()) }
//! ```
//!
//! [`JetStreamConsumer`] takes each `jetstream::Message` a pull or push consumer yields. It
//! runs it through a handler wrapped in
//! [`MessageIdempotencyLayer`](super::MessageIdempotencyLayer); the handler sees the core
//! `async_nats::Message`. Then it answers the server:
//!
//! | outcome (see the [outcomes table](super#outcomes)) | reply |
//! | --- | --- |
//! | ran, untracked, replayed, skipped (opt-in) | `Ack` |
//! | handler `Err` whose key was released, or `Handled::Released` | `Nak` with backoff: 1 s, doubling per delivery, at most 60 s ([`failure_backoff`](JetStreamConsumer::failure_backoff)) |
//! | a handler `Err` that is not retryable, or `Handled::Failed` | `Term`, and a warning |
//! | a key held: `Handled::Held`, or a handler `Err` with a `retry_after` | `Nak` as for a repeat in flight |
//! | a repeat in flight, past [`wait_in_flight`](super::MessageIdempotencyLayer::wait_in_flight) | `Nak` with backoff: 500 ms, doubling per delivery, at most 20 s and never past [`retry_after`](super::MessageError::retry_after) ([`in_flight_backoff`](JetStreamConsumer::in_flight_backoff)) |
//! | the store failed on claim | `Nak` with backoff: 1 s, doubling per delivery, at most 60 s ([`store_backoff`](JetStreamConsumer::store_backoff)) |
//! | the key reused by a different message | `Term`, and a warning |
//! | no key where one is required, an invalid key, an invalid record | `Term`, and a warning |
//!
//! Every `Nak` carries a delay. nats-server redelivers a plain `Nak` at once: the consumer's
//! `backoff` applies to `ack_wait` expiries only. A failing handler would loop hot until
//! `max_deliver`, which is unlimited by default.
//!
//! **A consumer that crashes mid-handler loses nothing** with these defaults. The server
//! redelivers its message after `ack_wait`, 30 s by default, while its claim is pending for
//! the engine's lease, 60 s by default. The redelivery waits a second for the claim. It is
//! then naked with a short delay that grows with each delivery, and runs once the lease has
//! lapsed. Keep `max_deliver` unlimited, or its span of redeliveries longer than the lease.
//!
//! **A server restart loses nothing** either. Killed with SIGKILL and started again on its
//! file store, the server keeps every publish it acknowledged. It hands each write to the
//! operating system, which keeps it when the process dies. The client reconnects by itself:
//! async-nats retries without limit by default. The pull stream then asks for messages
//! again. Handlers running meanwhile finish and write their records. Acks sent around the
//! crash can be lost, so the server redelivers those messages after `ack_wait`. Each
//! redelivery is answered from its record and acked; nothing runs twice.
//!
//! So keep the loop going on an `Err` from the stream, as the example does. The stream
//! reports a missed heartbeat or a failed pull, and carries on; a deleted consumer ends it.
//! A loop that ends on its first error stops at the first outage that misses a heartbeat.
//!
//! A machine crash or a power cut is another matter. The server syncs its files to disk
//! every 2 minutes by default, so it can lose the publishes of those minutes. Set
//! `sync_interval: always` in its `jetstream` block to lose none (nats-server 2.10 or later;
//! 2.9 has no such option). It costs a sync per write.
//!
//! While the handler runs, `Progress` (`+WPI`) is sent every third of the consumer's
//! `ack_wait`. So the server does not redeliver the message to another consumer mid-work.
//! The engine renews the key's lease on its own schedule meanwhile. The consumer's
//! `ack_wait`, or its `backoff` when shorter, is read from the server with the first delivery
//! of each consumer: one `CONSUMER.INFO` request, kept. Set
//! [`ack_wait`](JetStreamConsumer::ack_wait) to skip the request.
//!
//! **Keys**, from [`keys`]: `Idempotency-Key`, else `Nats-Msg-Id`, else the digest of the
//! subject and payload. JetStream itself de-duplicates publishes by `Nats-Msg-Id`, within the
//! stream's duplicate window. An id that is not a valid key, over 255 bytes or not ASCII, is
//! hashed into one. The consumer name given to the layer should be the durable consumer's
//! name: two durable consumers of one stream each handle a message once.
//!
//! # Many messages at once
//!
//! [`handle`](JetStreamConsumer::handle) takes `&self`: one consumer, shared, handles many
//! messages at once. Spawn each on a `JoinSet` and bound how many run. The door keeps a
//! redelivery that arrives while its first delivery runs from running twice.
//!
//! ```no_run
//! # use std::convert::Infallible;
//! use std::sync::Arc;
//! use tokio::task::JoinSet;
//! use tokio_stream::StreamExt;
//! # use tower::{ServiceBuilder, service_fn};
//! # use tower_idempotency::MemoryStore;
//! # use tower_idempotency::message::MessageIdempotencyLayer;
//! use tower_idempotency::message::nats::{JetStreamConsumer, async_nats, keys};
//! use async_nats::jetstream::{self, consumer::pull};
//!
//! const AT_ONCE: usize = 32;
//!
//! # #[tokio::main] async fn main() -> Result<(), async_nats::Error> {
//! # let js = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! # let stream = js.get_stream("ORDERS").await?;
//! # let handler = ServiceBuilder::new()
//! #     .layer(MessageIdempotencyLayer::new(MemoryStore::new(), "invoices").identify(keys()))
//! #     .service(service_fn(|m: async_nats::Message| async move { Ok::<_, Infallible>(()) }));
//! // `stream` and `handler` as in the first example. Pull no more than can run: a message
//! // pulled but waiting for its turn gets no progress.
//! let mut messages: pull::Stream = stream
//!     .get_consumer::<pull::Config>("invoices")
//!     .await?
//!     .stream()
//!     .max_messages_per_batch(AT_ONCE)
//!     .messages()
//!     .await?;
//! let consumer = Arc::new(JetStreamConsumer::new(handler));
//! let mut running = JoinSet::new();
//!
//! while let Some(message) = messages.next().await {
//!     let message = match message {
//!         Ok(message) => message,
//!         Err(e) => {
//!             eprintln!("pull: {e}");
//!             continue;
//!         }
//!     };
//!     // A handler that panicked sent no reply: the server redelivers its message.
//!     while running.len() >= AT_ONCE {
//!         if let Some(Err(e)) = running.join_next().await {
//!             eprintln!("handler task: {e}");
//!         }
//!     }
//!     let consumer = Arc::clone(&consumer);
//!     running.spawn(async move { consumer.handle(message).await.reply });
//! }
//! # Ok(()) }
//! ```

use super::error::{MessageError, MessageErrorKind};
use super::key::{HeaderOrHash, Message};
use super::layer::Handled;
pub use async_nats;
use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer;
use async_nats::jetstream::message::Acker;
use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tower_service::Service;

impl Message for async_nats::Message {
    fn topic(&self) -> &str {
        self.subject.as_str()
    }

    fn header(&self, name: &str) -> Option<&[u8]> {
        // NATS header names keep their case; the door compares them without it.
        let headers = self.headers.as_ref()?;
        headers
            .iter()
            .find(|(n, _)| AsRef::<str>::as_ref(*n).eq_ignore_ascii_case(name))
            .and_then(|(_, values)| values.first())
            .map(AsRef::<[u8]>::as_ref)
    }

    fn body(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.payload)
    }
}

/// The [`Identify`](super::Identify) for JetStream: `Idempotency-Key`, else `Nats-Msg-Id`, else the digest of
/// subject and payload. An id that is not a valid key is hashed: see
/// [`HeaderOrHash::or_id_header`].
pub fn keys() -> HeaderOrHash {
    HeaderOrHash::new().or_id_header(AsRef::<str>::as_ref(&async_nats::header::NATS_MESSAGE_ID))
}

/// What [`JetStreamConsumer::handle`] answered the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reply {
    /// `+ACK`: done.
    Ack,
    /// `-NAK`, with the delay asked for: redeliver.
    Nak(Option<Duration>),
    /// `+TERM`: never redeliver.
    Term,
}

/// A message handled: what the door did, and what the server was told.
#[derive(Debug)]
#[non_exhaustive]
pub struct Processed<R, E> {
    /// What the door did (see the [outcomes table](super#outcomes)).
    pub outcome: Result<Handled<R>, MessageError<E>>,
    /// What the server was told.
    pub reply: Reply,
    /// The reply could not be sent, as when the connection is gone. The server redelivers
    /// after `ack_wait`, and the redelivery is answered from the record.
    pub reply_error: Option<async_nats::Error>,
}

/// JetStream's default `ack_wait`, taken when the consumer's cannot be read.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// How long the first delivery of a consumer waits for its `CONSUMER.INFO` answer.
const INFO_TIMEOUT: Duration = Duration::from_secs(2);

/// A delay that starts at `first` on the first delivery and doubles with each, up to `max`.
#[derive(Clone, Copy, Debug)]
struct Backoff {
    first: Duration,
    max: Duration,
}

impl Backoff {
    fn new(first: Duration, max: Duration) -> Self {
        Self {
            first,
            max: max.max(first),
        }
    }

    fn at(self, delivered: i64) -> Duration {
        let doublings = u32::try_from(delivered.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
        self.first.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// Drives a layered handler from JetStream messages, and acknowledges each one by its
/// outcome. See the [module docs](self).
#[derive(Clone)]
#[must_use]
pub struct JetStreamConsumer<S> {
    service: S,
    /// Set by the user; `None`: read from the server.
    ack_wait: Option<Duration>,
    /// The `ack_wait` read per stream and consumer name.
    read: Arc<Mutex<Vec<(String, String, Duration)>>>,
    failure: Backoff,
    in_flight: Backoff,
    store: Backoff,
}

impl<S: fmt::Debug> fmt::Debug for JetStreamConsumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamConsumer")
            .field("service", &self.service)
            .field("ack_wait", &self.ack_wait)
            .field("failure_backoff", &self.failure)
            .field("in_flight_backoff", &self.in_flight)
            .field("store_backoff", &self.store)
            .finish_non_exhaustive()
    }
}

impl<S> JetStreamConsumer<S> {
    /// Drives `service`, a handler of `async_nats::Message` wrapped in
    /// [`MessageIdempotencyLayer`](super::MessageIdempotencyLayer).
    pub fn new(service: S) -> Self {
        Self {
            service,
            ack_wait: None,
            read: Arc::default(),
            failure: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            in_flight: Backoff::new(Duration::from_millis(500), Duration::from_secs(20)),
            store: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
        }
    }

    /// The consumer's `ack_wait`, instead of reading it from the server. Default: read with
    /// the first delivery of each consumer, or 30 s when that fails.
    ///
    /// Progress is sent every third of it while the handler runs. Values under 3 ms count as
    /// 3 ms.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = Some(ack_wait.max(Duration::from_millis(3)));
        self
    }

    /// The delay of a redelivery after a handler's error or [`Handled::Released`]. Default: 1 s,
    /// at most 60 s.
    ///
    /// It is `first` on the first delivery and doubles with each delivery, up to `max`. A
    /// handler's error that is not retryable is terminated instead.
    pub fn failure_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.failure = Backoff::new(first, max);
        self
    }

    /// The delay of a redelivery of a repeat in flight, or of a held key. Default: 500 ms,
    /// at most 20 s.
    ///
    /// It is `first` on the first delivery and doubles with each delivery, up to `max`. It
    /// is never past the error's [`retry_after`](super::MessageError::retry_after). A quick
    /// handler's repeat is decided within a second or two, and a crashed holder's message
    /// runs soon after its lease lapses.
    pub fn in_flight_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.in_flight = Backoff::new(first, max);
        self
    }

    /// The delay of a redelivery after a store failure. Default: 1 s, at most 60 s.
    ///
    /// It is `first` on the first delivery and doubles with each delivery, up to `max`.
    pub fn store_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.store = Backoff::new(first, max);
        self
    }

    /// The service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    /// The `ack_wait` of the consumer that delivered `message`: as set, else read once per
    /// consumer from the server (the shortest of `ack_wait` and `backoff`).
    async fn ack_wait_of(&self, message: &async_nats::jetstream::Message) -> Duration {
        if let Some(set) = self.ack_wait {
            return set;
        }
        let Ok(info) = message.info() else {
            return DEFAULT_ACK_WAIT;
        };
        let known = |read: &[(String, String, Duration)]| {
            read.iter()
                .find(|(s, c, _)| s == info.stream && c == info.consumer)
                .map(|(_, _, d)| *d)
        };
        if let Some(d) = known(&self.read.lock().unwrap_or_else(PoisonError::into_inner)) {
            return d;
        }
        let asked = tokio::time::timeout(
            INFO_TIMEOUT,
            message
                .context
                .get_consumer_from_stream::<consumer::Config, _, _>(info.consumer, info.stream),
        )
        .await;
        match asked {
            Ok(Ok(consumer)) => {
                let config = &consumer.cached_info().config;
                let shortest = config.backoff.iter().copied().min();
                let d = shortest
                    .map_or(config.ack_wait, |b| b.min(config.ack_wait))
                    .max(Duration::from_millis(3));
                let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
                if known(&read).is_none() {
                    read.push((info.stream.to_owned(), info.consumer.to_owned(), d));
                }
                d
            }
            Ok(Err(e)) => {
                tracing::warn!(target: "tower_idempotency::message", error = %e, consumer = info.consumer, "could not read the consumer's ack_wait; progress assumes 30 s (set JetStreamConsumer::ack_wait)");
                DEFAULT_ACK_WAIT
            }
            Err(_) => {
                tracing::warn!(target: "tower_idempotency::message", consumer = info.consumer, "the consumer's ack_wait was not read within 2 s; progress assumes 30 s (set JetStreamConsumer::ack_wait)");
                DEFAULT_ACK_WAIT
            }
        }
    }
}

/// Sends progress every `every`, for as long as it is polled. Awaited beside the handler, not
/// inside its poll: a slow publish holds up neither the work nor its lease renewal.
async fn send_progress(acker: &Acker, every: Duration) -> Infallible {
    // An hour is as good as never, and cannot overflow the clock.
    let every = every.min(Duration::from_secs(3600));
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = acker.ack_with(AckKind::Progress).await {
            tracing::warn!(target: "tower_idempotency::message", error = %e, "could not send progress; the server may redeliver mid-work");
        }
    }
}

impl<S, R, E> JetStreamConsumer<S>
where
    S: Service<async_nats::Message, Response = Handled<R>, Error = MessageError<E>> + Clone,
    E: fmt::Display,
{
    /// Handles one delivery: runs it through the service, sending progress while it runs.
    /// Then it acks, naks or terms it by the outcome.
    pub async fn handle(&self, message: async_nats::jetstream::Message) -> Processed<R, E> {
        let delivered = message.info().map_or(1, |i| i.delivered);
        let ack_wait = self.ack_wait_of(&message).await;
        let (message, acker) = message.split();
        let mut service = self.service.clone();
        let work = async {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(message).await
        };
        let outcome = tokio::select! {
            out = work => out,
            never = send_progress(&acker, ack_wait / 3) => match never {},
        };
        let reply = match &outcome {
            Ok(h) if h.is_ack() => Reply::Ack,
            Ok(Handled::Held(_)) => Reply::Nak(Some(self.in_flight.at(delivered))),
            Ok(Handled::Released(_)) => Reply::Nak(Some(self.failure.at(delivered))),
            Ok(_) => {
                tracing::warn!(target: "tower_idempotency::message", "message terminated: the handler's result fails the same way every time");
                Reply::Term
            }
            Err(e) => match e.kind() {
                MessageErrorKind::InFlight | MessageErrorKind::Work
                    if e.retry_after().is_some() =>
                {
                    let grown = self.in_flight.at(delivered);
                    Reply::Nak(Some(
                        e.retry_after().map_or(grown, |after| grown.min(after)),
                    ))
                }
                MessageErrorKind::Work if e.is_retryable() => {
                    Reply::Nak(Some(self.failure.at(delivered)))
                }
                MessageErrorKind::Store => Reply::Nak(Some(self.store.at(delivered))),
                _ => {
                    tracing::warn!(target: "tower_idempotency::message", kind = ?e.kind(), error = %e, "message terminated: it will not be redelivered");
                    Reply::Term
                }
            },
        };
        let kind = match reply {
            Reply::Ack => AckKind::Ack,
            Reply::Nak(delay) => AckKind::Nak(delay),
            Reply::Term => AckKind::Term,
        };
        let reply_error = acker.ack_with(kind).await.err();
        if let Some(e) = &reply_error {
            tracing::warn!(target: "tower_idempotency::message", error = %e, ?reply, "could not reply to the server; it redelivers after ack_wait");
        }
        Processed {
            outcome,
            reply,
            reply_error,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Identify, MessageKey};

    fn message(headers: &[(&str, &str)]) -> async_nats::Message {
        let mut map = async_nats::HeaderMap::new();
        for (n, v) in headers {
            map.insert(*n, *v);
        }
        async_nats::Message {
            subject: "orders.created".into(),
            reply: None,
            payload: bytes::Bytes::from_static(b"order 1"),
            headers: Some(map),
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn the_key_is_the_idempotency_key_then_the_nats_msg_id_then_the_digest() {
        let k = |h: &[(&str, &str)]| keys().identify(&message(h)).unwrap();
        let given = |v: &str| Some(MessageKey::given(v.as_bytes()).unwrap());
        assert_eq!(
            k(&[("idempotency-KEY", " a "), ("Nats-Msg-Id", "b")]),
            given("a")
        );
        assert_eq!(k(&[("Nats-Msg-Id", "b")]), given("b"));
        assert_eq!(
            k(&[]),
            Some(MessageKey::digest("orders.created", None, b"order 1"))
        );
    }

    #[test]
    fn a_nats_msg_id_that_is_not_a_key_is_hashed_not_refused() {
        let k = |h: &[(&str, &str)]| keys().identify(&message(h));
        let long = "m".repeat(300);
        assert_eq!(
            k(&[("Nats-Msg-Id", &long)]).unwrap(),
            Some(MessageKey::hashed(long.as_bytes()))
        );
        assert_eq!(
            k(&[("Nats-Msg-Id", "zamówienie-7")]).unwrap(),
            Some(MessageKey::hashed("zamówienie-7".as_bytes()))
        );
        assert_ne!(
            k(&[("Nats-Msg-Id", "zamówienie-7")]).unwrap(),
            k(&[("Nats-Msg-Id", "zamówienie-8")]).unwrap()
        );
        assert_eq!(
            k(&[("Nats-Msg-Id", "  ")]).unwrap(),
            Some(MessageKey::digest("orders.created", None, b"order 1")),
            "an empty id is no id"
        );
        // The producer's own Idempotency-Key is still held to the key rules.
        assert!(k(&[("Idempotency-Key", &long)]).is_err());
    }

    #[test]
    fn backoff_doubles_per_delivery_up_to_its_max_and_never_overflows() {
        let b = Backoff::new(Duration::from_millis(500), Duration::from_secs(20));
        let at: Vec<_> = (0..8).map(|d| b.at(d)).collect();
        assert_eq!(
            at[0],
            Duration::from_millis(500),
            "a missing count is the first"
        );
        assert_eq!(at[1], Duration::from_millis(500));
        assert_eq!(at[2], Duration::from_secs(1));
        assert_eq!(at[6], Duration::from_secs(16));
        assert_eq!(at[7], Duration::from_secs(20));
        let huge = Backoff::new(Duration::MAX, Duration::ZERO);
        assert_eq!(huge.at(i64::MAX), Duration::MAX);
    }
}
