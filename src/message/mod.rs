//! The message door: queue and broker consumers that handle a redelivered message once.
//!
//! Brokers deliver at least once: a consumer that crashes before it acknowledges gets the
//! message again, often on another consumer. [`MessageIdempotencyLayer`] wraps any message
//! handler (a tower `Service<M>` over a type that implements [`Message`]) so its side effects
//! happen once per key, within the limits of the store (lease, retention, durability: see
//! [the crate docs](crate)). It needs no broker crate; the [`jetstream`]
//! adapter (feature `nats`) drives it from JetStream and turns its outcomes into acks; the
//! [`jobs`] adapter (feature `apalis`) puts it in an apalis worker.
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::message::{Envelope, Handled, InProgress, MessageIdempotencyLayer, Raw};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let handler = ServiceBuilder::new()
//!     .layer(
//!         MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "invoice-mailer")
//!             .topics(["orders.created"]) // others pass with no store call
//!             .in_progress(InProgress::Reject) // redeliver a duplicate of a running message later
//!             .store_results(Raw), // keep the handler's String for duplicates
//!     )
//!     .service(service_fn(|m: Envelope| async move {
//!         // send the invoice for m.body ...
//!         Ok::<_, Infallible>(format!("mailed {} bytes", m.body.len()))
//!     }));
//!
//! let msg = Envelope::new("orders.created", "order 17");
//! assert_eq!(handler.clone().oneshot(msg.clone()).await.unwrap(), Handled::Ran("mailed 8 bytes".into()));
//! let again = handler.oneshot(msg).await.unwrap();
//! assert_eq!(again, Handled::Duplicate(Some("mailed 8 bytes".into())));
//! # }
//! ```
//!
//! # The key and the scope
//!
//! The [`KeyStrategy`] finds a message's key. The default, [`HeaderOrHash`], takes the
//! `Idempotency-Key` header (or attribute; any case, trimmed), else the SHA-256 of the
//! length-prefixed topic, schema version and body ([`MessageKey::digest`]): byte-identical
//! redeliveries match, different messages never collide. A strategy may find no key: the
//! message then runs untracked, or is refused with [`require_key`](MessageIdempotencyLayer::require_key).
//!
//! Every key is scoped by the **consumer name** given to [`MessageIdempotencyLayer::new`]: two
//! consumer groups (two durable subscriptions) of one topic each handle a message once. Give
//! every replica of one group the same name, or a redelivery to another replica is not seen as
//! a duplicate. A key is also checked against the message it first came with (topic, schema
//! version, body): the same key on a different message is refused as `KeyReused`.
//!
//! # Outcomes
//!
//! | the message | the handler | answer | the broker should |
//! | --- | --- | --- | --- |
//! | topic not listed in [`topics`](MessageIdempotencyLayer::topics) | runs, no store call | `Ok(Handled::Untracked(r))` | ack |
//! | no key (strategy found none) | runs untracked | `Ok(Handled::Untracked(r))` | ack |
//! | no key, [`require_key(true)`](MessageIdempotencyLayer::require_key) | not run | `Err`, kind `KeyMissing` | dead-letter (term) |
//! | a key that is not valid (empty, over 255 bytes, not ASCII) | not run | `Err`, kind `KeyInvalid` | dead-letter |
//! | first delivery, handler `Ok(r)` | runs once | `Ok(Handled::Ran(r))`, recorded | ack |
//! | first delivery, `Ok(r)` that the [classifier](MessageIdempotencyLayer::classify) calls unsuccessful | runs, key released | `Ok(Handled::Failed(r))` | redeliver (nak) |
//! | first delivery, handler `Err(e)` | runs, key released | `Err`, kind `Handler` (the `e` inside) | redeliver |
//! | a completed duplicate | not run | `Ok(Handled::Duplicate(stored))`, the stored result when the codec keeps one | ack |
//! | a duplicate while the first runs, [`InProgress::Skip`] (default) | not run | `Ok(Handled::Skipped)` | ack |
//! | a duplicate while the first runs, [`InProgress::Reject`] | not run | `Err`, kind `InFlight`, [`retry_after`](MessageError::retry_after) = the lease | redeliver after the delay |
//! | the key used before by a different message | not run | `Err`, kind `KeyReused` | dead-letter, and look at the producer |
//! | the store fails on claim | not run | `Err`, kind `Store` | redeliver with backoff |
//! | the store fails on record, after `Ok(r)` | ran | `Ok(Handled::Ran(r))`, warning; the key stays pending until its lease lapses | ack |
//! | the record under the key fails validation | not run | `Err`, kind `RecordInvalid` | dead-letter |
//!
//! [`MessageError::is_retryable`] says which errors are worth a redelivery. The
//! [`jetstream`] adapter sends exactly the column on the right.
//!
//! [`InProgress::Skip`] acknowledges a duplicate of a running message: two handlers never run at
//! once, and the first delivery, if it fails, is redelivered by the broker on its own.
//! [`InProgress::Reject`] is for brokers that redeliver a message to one consumer at a time
//! anyway, or when a skipped duplicate must not be lost if the first delivery's consumer dies.
//!
//! # The lease and the broker's redelivery
//!
//! A delivery claims its key for the engine's lease (60 s by default), renewed every third of
//! it while the handler runs. A consumer that **crashes mid-handler** cannot release its
//! claim: its key stays pending until the lease lapses, and every redelivery before then is
//! a duplicate in flight (skipped, or rejected with `retry_after` = the lease). So:
//!
//! - With [`InProgress::Reject`], the broker's redelivery span (delay × attempts, its
//!   `max_deliver` or retry count) must **exceed the lease**, or the message dead-letters while
//!   a crashed holder still blocks it. With the default 60 s lease, a broker that redelivers
//!   5 times 10 s apart gives up too early: delay by `retry_after` (the NATS adapter does).
//! - With [`InProgress::Skip`], a redelivery during the lease is acknowledged and gone: if the
//!   holder crashed mid-handler, the message's work is lost. Use Skip where the broker itself
//!   never delivers a message to two consumers at once while one holds it (then every
//!   duplicate in flight is a real concurrent duplicate), and `Reject` otherwise.
//! - A shorter lease shortens the blocked window and costs more renewals; the broker's own
//!   ack deadline (JetStream's `ack_wait`, SQS's visibility timeout) should be shorter than
//!   the lease is long, or kept alive while the handler runs (the NATS adapter sends
//!   *progress*).
//! - A consumer that **crashes after recording, before acknowledging** costs nothing: the
//!   redelivery is a completed duplicate, acknowledged without running.
//! - A record is kept for the engine's retention (24 h by default): a redelivery after that
//!   runs again. Keep retention longer than the broker keeps unacknowledged messages.
//!
//! Dropping the service's future after the claim (a cancelled consumer) is a crash as far as
//! the key is concerned: the key stays pending until its lease lapses.

mod codec;
mod error;
mod key;
mod layer;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod jetstream;

#[cfg(feature = "apalis")]
#[cfg_attr(docsrs, doc(cfg(feature = "apalis")))]
pub mod jobs;

#[cfg(feature = "json")]
pub use codec::Json;
pub use codec::{Discard, Raw, ResultCodec};
pub use error::{MessageError, MessageErrorKind};
pub use key::{Envelope, HeaderOrHash, KeyStrategy, Message, MessageKey};
pub use layer::{
    AllSuccessful, Classify, DEFAULT_NAMESPACE, Handled, InProgress, MessageIdempotency,
    MessageIdempotencyLayer,
};
