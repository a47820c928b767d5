//! Send once: outbound calls (email, webhooks, payment APIs) that a retried job makes once.
//!
//! A job that runs twice, or retries after a timeout, would send its email or charge its card
//! twice. [`SendOnceLayer`] wraps the outbound service (a mail transport, an HTTP client) so
//! that a send under a key that already went is answered with the receipt of the first send,
//! and nothing goes out again. It is the same engine as the HTTP layer's, a third door: the
//! key and fingerprint come from the outgoing request ([`Identify`]), and the record is the
//! receipt ([`Receipt`]).
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::engine::Engine;
//! use tower_idempotency::outbound::{Delivery, Identity, SendOnceLayer};
//!
//! struct Email { key: String, to: String, body: String }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let identify = |m: &Email| Identity::of(&m.key, [m.to.as_bytes(), m.body.as_bytes()]).map(Some);
//! let mailer = ServiceBuilder::new()
//!     .layer(SendOnceLayer::new(Engine::new(MemoryStore::new()), identify))
//!     .service(service_fn(|m: Email| async move {
//!         Ok::<_, Infallible>(format!("queued for {}", m.to)) // the provider's receipt
//!     }));
//!
//! let email = || Email { key: "welcome:42".into(), to: "ada@example.com".into(), body: "Hi".into() };
//! let first = mailer.clone().oneshot(email()).await.unwrap();
//! let again = mailer.clone().oneshot(email()).await.unwrap();
//! assert!(matches!(first, Delivery::Sent(r) if r == "queued for ada@example.com"));
//! assert!(matches!(again, Delivery::Replayed(r) if r == "queued for ada@example.com"));
//! # }
//! ```
//!
//! # Outcomes
//!
//! | found under the key, or what the send did | answer | key |
//! | --- | --- | --- |
//! | a completed send of the same request | [`Delivery::Replayed`] with its receipt, nothing sent | unchanged |
//! | a send of the same request running now | [`Delivery::InFlight`], nothing sent (or, with [`wait_in_flight`](SendOnceLayer::wait_in_flight), what it leaves) | unchanged |
//! | a held send of the same request (its delivery unknown) | [`Delivery::Held`], nothing sent | unchanged |
//! | any send of a different request | [`OutboundError::KeyReused`], nothing sent | unchanged |
//! | the store failed to claim | [`OutboundError::Store`] (retryable), nothing sent | — |
//! | a record that is not this door's receipt | [`OutboundError::RecordInvalid`], nothing sent | unchanged |
//! | nothing: the request is sent, and it went | [`Delivery::Sent`] | completed with the receipt |
//! | … it failed before anything could go (the client's connect stage failed, a definite rejection) | [`OutboundError::Failed`], or [`Delivery::Rejected`] for a provider's answer | released |
//! | … its outcome is unknown (timeout after the request was written, reset mid-exchange, an answer that may follow an action) | [`Delivery::Unknown`] | held for the [hold time](SendOnceLayer::hold) |
//! | … the caller dropped the future after the send began | — | held for the hold time |
//! | … its receipt is over the engine's record limit | [`Delivery::Sent`] | completed with the receipt's fitted form ([`Receipt::to_fitted_bytes`]), or held for the hold time |
//! | the store failed to record the receipt | [`Delivery::Sent`], a warning logged | pending until the lease ends |
//!
//! A request without a key ([`Identify`] answers `None`) is sent as it is and answered
//! [`Delivery::SentWithoutKey`]: nothing de-duplicates it. [`require_key`](SendOnceLayer::require_key)
//! refuses it instead ([`OutboundError::KeyMissing`]).
//!
//! A [`Classify`] decides sent, failed or unknown; each adapter brings its own
//! ([`HttpClassifier`](http::HttpClassifier), and for SMTP `MailClassifier`), and
//! [`DefaultClassifier`] reads a response as sent and an error as failed only when the
//! client says it never sent ([`NotSent`]). Only the client can tell "never connected" from
//! "failed after sending": an I/O error kind cannot, so none releases a key by itself.
//!
//! **The fingerprint** covers what makes two sends different: for mail the addresses, subject,
//! body, headers, attachment names and types and the schedule, not the attachment bytes; for
//! HTTP the method, URI, content type and body. The same key with a different request is a
//! bug in the caller: [`OutboundError::KeyReused`].
//!
//! **Held keys.** A send of unknown delivery keeps its key for the
//! [hold time](SendOnceLayer::hold) (default [`DEFAULT_HOLD`], ten minutes), as a record that
//! says so, written on a task of its own so that a caller that gives up meanwhile does not cut
//! it short. A repeat within it is told [`Delivery::Held`]; one after it sends again. Choose a
//! hold time longer than your retry schedule, and check with the provider before you send
//! again by hand: once it says the message never arrived, [`Engine::forget`](crate::engine::Engine::forget)
//! frees the key (its store key is `StoreKey::derive` of the door's namespace, scope and key). Like a receipt, a held key is a completed record to the store: the memory
//! store may drop it early when it is full (counted and logged).
//!
//! **Namespaces.** The generic door ([`DEFAULT_NAMESPACE`]), the HTTP adapter and the mail
//! adapter each have their own, so one job key used for a mail and for a charge is two keys.
//!
//! # Batches
//!
//! [`SendOnce::send_batch`] claims every key of a batch, sends only the fresh requests through
//! the inner service's [`SendBatch`] path, and answers repeats in place, a key repeated inside
//! the batch included; [`SendOnce::send_each`] does the same over a plain service.
//!
//! # Adapters
//!
//! - [`http`]: `Service<http::Request<B>>` clients (hyper-util, any tower HTTP client):
//!   forwards the key as `Idempotency-Key` to the provider. Turn on the feature `hyper-util`
//!   so that a connect error of hyper-util's client releases its key.
//! - `mail` (feature `lettre`): any lettre `AsyncTransport`, SMTP replies mapped.
//!
//! # The guarantee
//!
//! As every door's: **no duplicate sends within the limits of the store**. The limits: the
//! lease (a process that dies mid-send, or cannot renew its claim, lets another send once the
//! lease lapses), the hold time of an unknown delivery (and, without a Tokio runtime, the
//! lease for a send whose caller gave up), the retention of receipts (a repeat
//! after the receipt expired sends again), the store's durability, and a crash after the
//! provider took the message but before its receipt was recorded (the key lapses with its
//! lease, and a repeat sends again). Forward the key to a provider that de-duplicates too
//! (the HTTP adapter does) to close that last window.

mod batch;
mod classify;
mod delivery;
pub mod http;
mod identify;
#[cfg(feature = "lettre")]
#[cfg_attr(docsrs, doc(cfg(feature = "lettre")))]
pub mod mail;
mod receipt;
mod service;

pub use batch::{BatchResults, SendBatch};
pub use classify::{Classify, DefaultClassifier, NotSent, Verdict};
pub use delivery::{Delivery, OutboundError, OutboundErrorKind, Unknown};
pub use identify::{Identify, Identity};
#[cfg(feature = "json")]
pub use receipt::Json;
pub use receipt::{Receipt, ReceiptError};
pub use service::{BoxFuture, DEFAULT_HOLD, DEFAULT_NAMESPACE, SendOnce, SendOnceLayer};
