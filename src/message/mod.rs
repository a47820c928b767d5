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
//! use std::time::Duration;
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
//!             .in_progress(InProgress::Wait(Duration::from_secs(2))) // a duplicate of a running message waits for it
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
//! version, body): the same key on a different message is refused as `KeyReused`, on any
//! topic (the topic is part of that check, not of the scope: a key names one message for the
//! consumer, whichever topic it came on).
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
//! | first delivery, handler `Err(e)` | runs, key released | `Err`, kind `Handler` (the `e` inside) | redeliver with backoff |
//! | first delivery, handler `Err(e)` that [`permanent_errors`](MessageIdempotencyLayer::permanent_errors) calls permanent | runs, key released | `Err`, kind `Handler`, [`is_permanent`](MessageError::is_permanent) | dead-letter (term) |
//! | a completed duplicate | not run | `Ok(Handled::Duplicate(stored))`, the stored result when the codec keeps one | ack |
//! | a duplicate while the first runs (or while a crashed first delivery's claim is pending), [`InProgress::Wait(bound)`](InProgress::Wait) (default, 1 s) | not run; waits for the first | the first's outcome: `Ok(Handled::Duplicate(stored))`, or it runs if the first was released or its lease lapsed; past the bound as `Reject` | ack (or as `Reject`) |
//! | the same, [`InProgress::Reject`] | not run | `Err`, kind `InFlight`, [`retry_after`](MessageError::retry_after) = the lease the first run's claim has left, at most a third of the lease | redeliver after a short delay, growing per delivery, at most `retry_after` |
//! | the same, [`InProgress::Skip`] (opt-in: loses a crashed holder's message) | not run | `Ok(Handled::Skipped)` | ack |
//! | the caller drops the future after the claim (consumer shutdown, an outer timeout) | finishes on a task of its own ([`run_to_completion`](MessageIdempotencyLayer::run_to_completion), default), at most [`detached_timeout`](MessageIdempotencyLayer::detached_timeout) | none (no one listens); recorded or released as if it did | the redelivery is a completed duplicate: ack |
//! | the key used before by a different message | not run | `Err`, kind `KeyReused` | dead-letter, and look at the producer |
//! | the store fails on claim | not run | `Err`, kind `Store` | redeliver with backoff |
//! | the store fails on record, after `Ok(r)` | ran | `Ok(Handled::Ran(r))`, warning; the key stays pending until its lease lapses | ack |
//! | `Ok(r)` whose encoded result is over the engine's record limit (`max_record_body`, 1 MiB) | ran | `Ok(Handled::Ran(r))`, warning; recorded without the result, so a duplicate is `Duplicate(None)` | ack |
//! | the record under the key fails validation | not run | `Err`, kind `RecordInvalid` | dead-letter |
//!
//! [`MessageError::is_retryable`] says which errors are worth a redelivery. The
//! [`jetstream`] adapter sends exactly the column on the right.
//!
//! A duplicate in flight is never acknowledged by default: it may be the redelivery of a
//! message whose consumer crashed mid-handler, and then it is the only copy left. The default
//! [`InProgress::Wait`] answers it from the first delivery's record when that comes within a
//! second (a quick handler's concurrent duplicate costs no redelivery round trip), and refuses
//! it as in flight otherwise, so the broker redelivers it until the first delivery is
//! recorded, released, or its lease lapses. Raise the bound for handlers that take seconds;
//! [`InProgress::Reject`] refuses at once (no slot held while waiting).
//! [`InProgress::Skip`] acknowledges the duplicate unrun: it loses the message of a consumer
//! that crashed mid-handler, so it is an opt-in for brokers whose redelivery after a crash
//! never comes before the lease has lapsed (see its docs).
//!
//! # Forgetting a key
//!
//! [`MessageIdempotencyLayer::forget`] deletes this consumer's record of a key, so the next
//! redelivery of the message runs again (an operator replaying a message whose handling must
//! be redone). A pending claim is kept; [`forget_even_pending`](MessageIdempotencyLayer::forget_even_pending)
//! deletes it too, and a redelivery then runs beside a handler that may still be running.
//!
//! # The lease and the broker's redelivery
//!
//! A delivery claims its key for the engine's lease (60 s by default), renewed every third of
//! it while the handler runs. A consumer that **crashes mid-handler** cannot release its
//! claim: its key stays pending until the lease lapses, and every redelivery before then is
//! a duplicate in flight (refused with `retry_after` = the lease it has left, at most a third
//! of the lease). So:
//!
//! - The broker's redelivery span (delay × attempts, its `max_deliver` or retry count) must
//!   **exceed the lease**, or the message dead-letters while a crashed holder still blocks it.
//!   The NATS adapter naks with 500 ms doubling per delivery, never past `retry_after`: with
//!   the default 60 s lease, a crashed holder's message runs within about a second of the
//!   lease lapsing, after half a dozen redeliveries.
//! - With the opt-in [`InProgress::Skip`], a redelivery during the lease is acknowledged and
//!   gone: if the holder crashed mid-handler, the message's work is lost.
//! - A shorter lease shortens the blocked window and costs more renewals; the broker's own
//!   ack deadline (JetStream's `ack_wait`, SQS's visibility timeout) should be shorter than
//!   the lease is long, or kept alive while the handler runs (the NATS adapter sends
//!   *progress*).
//! - A consumer that **crashes after recording, before acknowledging** costs nothing: the
//!   redelivery is a completed duplicate, acknowledged without running.
//! - A record is kept for the engine's retention (24 h by default): a redelivery after that
//!   runs again. Keep retention longer than the broker keeps unacknowledged messages.
//!
//! # Work that finishes when the consumer goes away
//!
//! Once a key is claimed, dropping the service's future (a consumer shutting down, a timeout
//! layer outside the door) no longer cancels the handler: the rest of the work moves onto a
//! task of its own, finishes, and is recorded or released as if the caller were there, so the
//! redelivery is a completed duplicate and the handler runs once. While the caller waits, the
//! work is polled in place (one allocation per claimed message). At shutdown, wait for it with
//! [`MessageIdempotencyLayer::in_flight`] ([`Drain::wait`], bounded); with
//! [`run_to_completion(false)`](MessageIdempotencyLayer::run_to_completion) a dropped future
//! cancels the handler and its key stays pending until its lease lapses, as after a crash.
//! Work that runs on is bounded: in time by
//! [`detached_timeout`](MessageIdempotencyLayer::detached_timeout) (5 min after its caller
//! left) and in number by [`max_detached`](MessageIdempotencyLayer::max_detached) (1024 at
//! once); work cut by either bound is treated as with `run_to_completion(false)`. A handler
//! that panicked is never polled again.

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

pub use crate::engine::detach::Drain;
#[cfg(feature = "json")]
pub use codec::Json;
pub use codec::{Discard, Raw, ResultCodec};
pub use error::{MessageError, MessageErrorKind};
pub use key::{Envelope, HeaderOrHash, KeyStrategy, Message, MessageKey};
pub use layer::{
    AllRetryable, AllSuccessful, Classify, ClassifyError, DEFAULT_NAMESPACE, Handled, InProgress,
    MessageIdempotency, MessageIdempotencyLayer,
};
