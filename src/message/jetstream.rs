//! The message door on [async-nats](https://docs.rs/async-nats) JetStream consumers.
//!
//! [`JetStreamConsumer`] takes each `jetstream::Message` a pull or push consumer yields, runs
//! it through a handler wrapped in [`MessageIdempotencyLayer`](super::MessageIdempotencyLayer)
//! (the handler sees the core `async_nats::Message`), and answers the server:
//!
//! | outcome (see the [outcomes table](super#outcomes)) | reply |
//! | --- | --- |
//! | ran, untracked, completed duplicate, skipped duplicate | `Ack` |
//! | handler `Err`, or a result classified unsuccessful (key released) | `Nak`, redelivered at once |
//! | a duplicate in flight ([`InProgress::Reject`](super::InProgress::Reject)) | `Nak` with a delay of the lease |
//! | the store failed on claim | `Nak` with backoff: 1 s, doubling per delivery, at most 60 s |
//! | the key reused by a different message | `Term`, and a warning |
//! | no key where one is required, an invalid key, an invalid record | `Term`, and a warning |
//!
//! While the handler runs, `Progress` (`+WPI`) is sent every third of the consumer's
//! `ack_wait`, so the server does not redeliver the message to another consumer mid-work; the
//! engine renews the key's lease on its own schedule (a third of the lease) meanwhile.
//! Set [`ack_wait`](JetStreamConsumer::ack_wait) to the consumer's (`ack_wait` in its config,
//! 30 s by default).
//!
//! **Keys** ([`keys`]): `Idempotency-Key`, else `Nats-Msg-Id` (the header JetStream itself
//! de-duplicates publishes by, within the stream's duplicate window), else the digest of the
//! subject and payload. The consumer name given to the layer should be the durable consumer's
//! name: two durable consumers of one stream each handle a message once.
//!
//! ```no_run
//! use std::convert::Infallible;
//! use tokio_stream::StreamExt;
//! use tower::{ServiceBuilder, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::message::jetstream::{JetStreamConsumer, async_nats, keys};
//! use async_nats::jetstream::{self, consumer::pull};
//! use tower_idempotency::message::{InProgress, MessageIdempotencyLayer};
//!
//! # #[tokio::main] async fn main() -> Result<(), async_nats::Error> {
//! let js = jetstream::new(async_nats::connect("127.0.0.1:4222").await?);
//! let stream = js.get_stream("ORDERS").await?;
//! let consumer: pull::Stream = stream
//!     .get_consumer::<pull::Config>("invoices")
//!     .await?
//!     .messages()
//!     .await?;
//!
//! let handler = ServiceBuilder::new()
//!     .layer(
//!         MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "invoices")
//!             .key_strategy(keys())
//!             .in_progress(InProgress::Reject),
//!     )
//!     .service(service_fn(|m: async_nats::Message| async move {
//!         // send the invoice for m.payload ...
//!         Ok::<_, Infallible>(())
//!     }));
//! let consumer_loop = JetStreamConsumer::new(handler);
//!
//! let mut messages = consumer;
//! while let Some(message) = messages.next().await {
//!     let processed = consumer_loop.handle(message?).await;
//!     println!("{:?}", processed.reply);
//! }
//! # Ok(()) }
//! ```

use super::error::{MessageError, MessageErrorKind};
use super::key::{HeaderOrHash, Message};
use super::layer::Handled;
pub use async_nats;
use async_nats::jetstream::AckKind;
use std::borrow::Cow;
use std::fmt;
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

/// The key strategy for JetStream: `Idempotency-Key`, else `Nats-Msg-Id`, else the digest of
/// subject and payload.
pub fn keys() -> HeaderOrHash {
    HeaderOrHash::new().or_header(AsRef::<str>::as_ref(&async_nats::header::NATS_MESSAGE_ID))
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
    /// The reply could not be sent (the connection is gone): the server redelivers after
    /// `ack_wait`, and the redelivery is answered from the record.
    pub reply_error: Option<async_nats::Error>,
}

/// Drives a layered handler from JetStream messages and acknowledges each one by its outcome.
/// See the [module docs](self).
#[derive(Clone)]
#[must_use]
pub struct JetStreamConsumer<S> {
    service: S,
    ack_wait: Duration,
    backoff: Duration,
    max_backoff: Duration,
}

impl<S: fmt::Debug> fmt::Debug for JetStreamConsumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JetStreamConsumer")
            .field("service", &self.service)
            .field("ack_wait", &self.ack_wait)
            .field("backoff", &self.backoff)
            .field("max_backoff", &self.max_backoff)
            .finish()
    }
}

impl<S> JetStreamConsumer<S> {
    /// Drives `service`: a handler of `async_nats::Message` wrapped in
    /// [`MessageIdempotencyLayer`](super::MessageIdempotencyLayer).
    pub fn new(service: S) -> Self {
        Self {
            service,
            ack_wait: Duration::from_secs(30),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
        }
    }

    /// The consumer's `ack_wait` (default 30 s, JetStream's default): progress is sent every
    /// third of it while the handler runs.
    pub fn ack_wait(mut self, ack_wait: Duration) -> Self {
        self.ack_wait = ack_wait.max(Duration::from_millis(3));
        self
    }

    /// The delay of a redelivery after a store failure: `first` on the first delivery,
    /// doubling with each delivery, at most `max` (default 1 s and 60 s).
    pub fn store_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.backoff = first;
        self.max_backoff = max.max(first);
        self
    }

    /// The service.
    pub fn get_ref(&self) -> &S {
        &self.service
    }

    fn backoff_for(&self, delivered: i64) -> Duration {
        let doublings = u32::try_from(delivered.saturating_sub(1).clamp(0, 16)).unwrap_or(16);
        self.backoff
            .saturating_mul(1u32 << doublings)
            .min(self.max_backoff)
    }
}

impl<S, R, E> JetStreamConsumer<S>
where
    S: Service<async_nats::Message, Response = Handled<R>, Error = MessageError<E>> + Clone,
    E: fmt::Display,
{
    /// Handles one delivery: runs it through the service (sending progress while it runs),
    /// then acks, naks or terms it by the outcome.
    pub async fn handle(&self, message: async_nats::jetstream::Message) -> Processed<R, E> {
        let delivered = message.info().map_or(1, |i| i.delivered);
        let (message, acker) = message.split();
        let mut service = self.service.clone();
        let every = self.ack_wait / 3;
        let work = async {
            std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
            service.call(message).await
        };
        let mut work = std::pin::pin!(work);
        let mut progress = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        let outcome = loop {
            tokio::select! {
                out = &mut work => break out,
                _ = progress.tick() => {
                    if let Err(e) = acker.ack_with(AckKind::Progress).await {
                        tracing::warn!(target: "tower_idempotency::message", error = %e, "could not send progress; the server may redeliver mid-work");
                    }
                }
            }
        };
        let reply = match &outcome {
            Ok(h) if h.is_ack() => Reply::Ack,
            Ok(_) => Reply::Nak(None),
            Err(e) => match e.kind() {
                MessageErrorKind::Handler => Reply::Nak(None),
                MessageErrorKind::InFlight => Reply::Nak(e.retry_after()),
                MessageErrorKind::Store => Reply::Nak(Some(self.backoff_for(delivered))),
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
    use crate::message::{KeyStrategy, MessageKey};

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
        let k = |h: &[(&str, &str)]| keys().key(&message(h)).unwrap();
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
}
