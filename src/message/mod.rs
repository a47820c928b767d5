//! The message door: queue and broker consumers that handle a redelivered message once.
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Raw;
//! use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let handler = ServiceBuilder::new()
//!     .layer(
//!         MessageIdempotencyLayer::new(MemoryStore::new(), "invoice-mailer")
//!             .topics(["orders.created"]) // others pass with no store call
//!             .wait_in_flight(Duration::from_secs(2)) // a repeat of a running message waits for it
//!             .codec(Raw), // keep the handler's String for repeats
//!     )
//!     .service(service_fn(|m: Envelope| async move {
//!         // send the invoice for m.body ...
//!         Ok::<_, Infallible>(format!("mailed {} bytes", m.body.len()))
//!     }));
//!
//! let msg = Envelope::new("orders.created", "order 17");
//! assert_eq!(handler.clone().oneshot(msg.clone()).await.unwrap(), Handled::Recorded("mailed 8 bytes".into()));
//! let again = handler.oneshot(msg).await.unwrap();
//! assert_eq!(again, Handled::Replayed(Some("mailed 8 bytes".into())));
//! # }
//! ```
//!
//! Brokers deliver at least once. A consumer that crashes before it acknowledges gets the
//! message again, often on another consumer. [`MessageIdempotencyLayer`] wraps any message
//! handler, a tower `Service<M>` over a [`Message`]. Its side effects then happen once per
//! key, within the limits of the store: lease, retention, durability. See [the crate
//! docs](crate). It needs no broker crate. The [`nats`] adapter, feature `nats`, drives it
//! from JetStream and turns its outcomes into acks. The [`apalis`] adapter, feature
//! `apalis`, puts it in an apalis worker.
//!
//! # The key and the scope
//!
//! The [`Identify`] finds a message's key. The default, [`HeaderOrHash`], takes the
//! `Idempotency-Key` header or attribute, in any case, trimmed. Else it takes the SHA-256 of
//! the length-prefixed topic, schema version and body: see [`MessageKey::digest`].
//! Byte-identical redeliveries match, and different messages never collide. An `Identify` may
//! find no key. The message then runs untracked, or is refused with
//! [`require_key`](MessageIdempotencyLayer::require_key).
//!
//! Every key is scoped by the **consumer name** given to [`MessageIdempotencyLayer::new`].
//! Two consumer groups of one topic each handle a message once. Give every replica of one
//! group the same name, or a redelivery to another replica is not seen as a repeat.
//!
//! A key is also checked against the message it first came with: topic, schema version and
//! body. The same key on a different message is refused as `KeyReused`, on any topic. The
//! topic is part of that check, not of the scope: a key names one message for the consumer,
//! whichever topic it came on.
//!
//! # Outcomes
//!
//! | the message | the handler | answer | the broker should |
//! | --- | --- | --- | --- |
//! | topic not listed in [`topics`](MessageIdempotencyLayer::topics) | runs, no store call | `Ok(Handled::Untracked(r))` | ack |
//! | no key | runs untracked | `Ok(Handled::Untracked(r))` | ack |
//! | no key, [`require_key(true)`](MessageIdempotencyLayer::require_key) | not run | `Err`, kind `KeyMissing` | dead-letter (term) |
//! | a key that is not valid: empty, over 255 bytes, not ASCII | not run | `Err`, kind `KeyInvalid` | dead-letter |
//! | first delivery, handler `Ok(r)` | runs once | `Ok(Handled::Recorded(r))`, recorded | ack |
//! | first delivery, handler `Err(e)` | runs, key released | `Err`, kind `Work`, `e` inside | redeliver with backoff |
//! | first delivery, another [verdict](MessageIdempotencyLayer::classify) | runs | `Handled::Released`, `Failed` or `Held`; or `Err`, kind `Work` | see [`classify`](MessageIdempotencyLayer::classify) |
//! | a completed repeat | not run | `Ok(Handled::Replayed(stored))`, the stored result when the codec keeps one | ack |
//! | a repeat while the first runs, or while a crashed first delivery's claim is pending | not run; waits for the first up to [`wait_in_flight`](MessageIdempotencyLayer::wait_in_flight), 1 s | the first's outcome: `Ok(Handled::Replayed(stored))`, or it runs if the first was released or its lease lapsed | ack |
//! | the same, past the wait | not run | `Err`, kind `InFlight`, with [`retry_after`](MessageError::retry_after) | redeliver after a short delay, growing per delivery, at most `retry_after` |
//! | the same, [`skip_in_flight(true)`](MessageIdempotencyLayer::skip_in_flight), an opt-in that loses a crashed holder's message | not run | `Ok(Handled::Skipped)` | ack |
//! | the caller drops the future after the claim: consumer shutdown, an outer timeout | finishes on a task of its own, at most [`detached_timeout`](MessageIdempotencyLayer::detached_timeout) | none; recorded or released as if the caller were there | the redelivery is a completed repeat: ack |
//! | the key used before by a different message | not run | `Err`, kind `KeyReused` | dead-letter, and look at the producer |
//! | the store fails on claim | not run | `Err`, kind `Store` | redeliver with backoff |
//! | the store fails on record, after `Ok(r)` | ran | `Ok(Handled::Recorded(r))`, warning; the key stays pending until its lease lapses | ack |
//! | `Ok(r)` whose encoded result is over the engine's record limit, 1 MiB by default | ran | `Ok(Handled::Recorded(r))`, warning; recorded without the result, so a repeat is `Replayed(None)` | ack |
//! | the record under the key fails validation | not run | `Err`, kind `RecordInvalid` | dead-letter |
//!
//! [`MessageError::is_retryable`] says which errors are worth a redelivery. The [`nats`]
//! adapter sends exactly the column on the right.
//!
//! A repeat in flight is never acknowledged by default. It may be the redelivery of a
//! message whose consumer crashed mid-handler, and then it is the only copy left. The default
//! wait answers it from the first delivery's record when that comes within a second: a quick
//! handler's concurrent repeat costs no redelivery. Otherwise it is refused as in flight,
//! and the broker redelivers it until the first delivery is recorded, released, or its lease
//! lapses. Raise the wait for handlers that take seconds. `wait_in_flight(Duration::ZERO)`
//! refuses at once. [`skip_in_flight`](MessageIdempotencyLayer::skip_in_flight) acknowledges
//! the repeat unrun: see its docs for the risk.
//!
//! # Steps
//!
//! A handler with several side effects reads the delivery's [`Steps`](crate::Steps) with
//! [`Steps::current`](crate::Steps::current) and wraps each in a named step. A redelivery after
//! a failure, or after a crash let the lease lapse, answers the completed steps from their
//! records and runs the first unfinished one. `Steps::current` is set for the handler's future,
//! not for tasks it spawns.
//!
//! # Forgetting a key
//!
//! [`MessageIdempotencyLayer::forget`] deletes this consumer's record of a key. The next
//! redelivery of the message then runs again: an operator replays a message whose handling
//! must be redone. A pending claim is kept.
//! [`forget_even_pending`](MessageIdempotencyLayer::forget_even_pending) deletes it too, and a
//! redelivery then runs beside a handler that may still be running.
//!
//! # The lease and the broker's redelivery
//!
//! A delivery claims its key for the engine's lease, 60 s by default. The claim is renewed
//! every third of it while the handler runs. A consumer that **crashes mid-handler** cannot
//! release its claim. Its key stays pending until the lease lapses, and every redelivery
//! before then is a repeat in flight. It is refused with `retry_after` = the lease it has
//! left, at most a third of the lease. So:
//!
//! - The broker's redelivery span must **exceed the lease**: delay × attempts, its
//!   `max_deliver` or retry count. Otherwise the message dead-letters while a crashed holder
//!   still blocks it. The NATS adapter naks with 500 ms, doubling per delivery, never past
//!   `retry_after`. With the default 60 s lease, a crashed holder's message runs within about
//!   a second of the lease lapsing, after half a dozen redeliveries.
//! - With the opt-in `skip_in_flight(true)`, a redelivery during the lease is acknowledged and
//!   gone. If the holder crashed mid-handler, the message's work is lost.
//! - A shorter lease shortens the blocked window and costs more renewals. The broker's own
//!   ack deadline, JetStream's `ack_wait` or SQS's visibility timeout, should be shorter than
//!   the lease, or kept alive while the handler runs. The NATS adapter sends *progress*.
//! - A consumer that **crashes after recording, before acknowledging** costs nothing. The
//!   redelivery is a completed repeat, acknowledged without running.
//! - A record is kept for the engine's retention, 24 h by default. A redelivery after that
//!   runs again. Keep retention longer than the broker keeps unacknowledged messages.
//!
//! # Work that finishes when the consumer goes away
//!
//! Once a key is claimed, dropping the service's future no longer cancels the handler. A
//! consumer shutting down or a timeout layer outside the door drops it. The rest of the work
//! moves onto a task of its own, finishes, and is recorded or released as if the caller were
//! there. So the redelivery is a completed repeat and the handler runs once. While the
//! caller waits, the work is polled in place, at one allocation per claimed message.
//!
//! At shutdown, wait for it with [`MessageIdempotencyLayer::drain`]. Its `wait` is bounded.
//! With [`run_to_completion(false)`](MessageIdempotencyLayer::run_to_completion) a dropped
//! future cancels the handler, and its key stays pending until its lease lapses, as after a
//! crash. Work that runs on is bounded in time by
//! [`detached_timeout`](MessageIdempotencyLayer::detached_timeout), 5 min after its caller
//! left. It is bounded in number by [`max_detached`](MessageIdempotencyLayer::max_detached),
//! 1024 at once. Work cut by either bound is treated as with `run_to_completion(false)`. A
//! handler that panicked is never polled again.

mod error;
mod key;
mod layer;

#[cfg(feature = "nats")]
#[cfg_attr(docsrs, doc(cfg(feature = "nats")))]
pub mod nats;

#[cfg(feature = "apalis")]
#[cfg_attr(docsrs, doc(cfg(feature = "apalis")))]
pub mod apalis;

pub use crate::engine::detach::Drain;
pub use error::{MessageError, MessageErrorKind};
pub use key::{Envelope, HeaderOrHash, Identify, Message, MessageKey};
pub use layer::{DefaultClassifier, Handled, MessageIdempotency, MessageIdempotencyLayer};
