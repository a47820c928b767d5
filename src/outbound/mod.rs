//! Send once: outbound calls that a retried job makes once.
//!
//! ```
//! use std::convert::Infallible;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_idempotency::MemoryStore;
//! use tower_idempotency::outbound::{Delivery, Identity, SendOnceLayer};
//!
//! struct Email { key: String, to: String, body: String }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let identify = |m: &Email| Identity::of(&m.key, [m.to.as_bytes(), m.body.as_bytes()]).map(Some);
//! let mailer = ServiceBuilder::new()
//!     .layer(SendOnceLayer::new(MemoryStore::new(), identify))
//!     .service(service_fn(|m: Email| async move {
//!         Ok::<_, Infallible>(format!("queued for {}", m.to)) // the provider's receipt
//!     }));
//!
//! let email = || Email { key: "welcome:42".into(), to: "ada@example.com".into(), body: "Hi".into() };
//! let first = mailer.clone().oneshot(email()).await.unwrap();
//! let again = mailer.clone().oneshot(email()).await.unwrap();
//! assert!(matches!(first, Delivery::Recorded(r) if r == "queued for ada@example.com"));
//! assert!(matches!(again, Delivery::Replayed(r) if r == "queued for ada@example.com"));
//! # }
//! ```
//!
//! A job that runs twice, or retries after a timeout, would send its email twice. It would
//! charge a card twice. [`SendOnceLayer`] wraps the outbound service: a mail transport, an
//! HTTP client. A send under a key that already went is answered with the receipt of the
//! first send, and nothing goes out again.
//!
//! It is the engine of the HTTP layer, behind a third door. An [`Identify`] reads the key
//! and fingerprint from the outgoing request. A [`Classify`] judges the send's result. A
//! [`Codec`] keeps the receipt as the record. To send many messages, loop over the sends:
//! each has its own key.
//!
//! # Outcomes
//!
//! | found under the key, or what the send did | answer | key |
//! | --- | --- | --- |
//! | a completed send of the same request | [`Delivery::Replayed`] with its receipt, nothing sent | unchanged |
//! | a send of the same request running now | [`Delivery::InFlight`], nothing sent; with [`wait_in_flight`](SendOnceLayer::wait_in_flight), what it leaves | unchanged |
//! | a held send of the same request: its delivery unknown | [`Delivery::InFlight`], nothing sent, until the hold time ends | unchanged |
//! | any send of a different request | [`KeyReused`](OutboundErrorKind::KeyReused), nothing sent | unchanged |
//! | the store failed to claim | [`Store`](OutboundErrorKind::Store), retryable, nothing sent | — |
//! | a record that is not this door's receipt | [`RecordInvalid`](OutboundErrorKind::RecordInvalid), nothing sent | unchanged |
//! | nothing: the request is sent, and it went | [`Delivery::Recorded`] | completed with the receipt |
//! | … it failed before anything could go: a connect stage failed, a definite rejection | [`Work`](OutboundErrorKind::Work), or [`Delivery::Released`] or [`Delivery::Failed`] for a provider's answer | released |
//! | … its outcome is unknown: a timeout after the request was written, a reset mid-exchange, an answer that may follow an action | [`Delivery::Held`] | held for the [hold time](SendOnceLayer::hold) |
//! | … the caller dropped the future after the send began | — | held for the hold time |
//! | … its receipt is over the engine's record limit | [`Delivery::Recorded`] | completed with the receipt's fitted form ([`Codec::encode_fitted`]), or held for the hold time |
//! | the store failed to record the receipt | [`Delivery::Recorded`], a warning logged | pending until the lease ends |
//!
//! A request without a key is sent as it is and answered [`Delivery::Untracked`]:
//! nothing de-duplicates it. [`Identify`] answers `None` for it.
//! [`require_key`](SendOnceLayer::require_key) refuses it instead
//! ([`KeyMissing`](OutboundErrorKind::KeyMissing)).
//!
//! The [`Classify`] gives each send a [`Verdict`](crate::engine::Verdict): `Record` went,
//! `Release` and `Fail` took nothing, `Hold` may have gone. Each adapter brings its own
//! classifier: [`HttpClassifier`](http::HttpClassifier), and for lettre `MailClassifier`.
//! [`DefaultClassifier`] records a response. It releases an error only when the client
//! says it never sent ([`NotSent`]). Only the client can tell "never connected" from
//! "failed after sending". An I/O error kind cannot, so none releases a key by itself.
//!
//! **The fingerprint** covers what makes two sends different. For mail: the addresses,
//! subject, body, headers, attachment names and types, and the schedule, not the attachment
//! bytes. For HTTP: the method, URI, content type and body. The same key with a different
//! request is a bug in the caller: [`KeyReused`](OutboundErrorKind::KeyReused).
//!
//! **Held keys.** A send of unknown delivery keeps its key for the
//! [hold time](SendOnceLayer::hold), ten minutes by default. The hold is the send's claim,
//! renewed for the hold time on a task of its own: a caller that gives up meanwhile does not
//! cut it short. A repeat within it is told [`Delivery::InFlight`]; one after it sends again.
//! A holder that crashes before its hold is written leaves the key to its lease, as any crash
//! does; a hold written outlives its process. Choose a hold
//! time longer than your retry schedule. Check with the provider before you send again by
//! hand. Once it says the message never arrived,
//! [`Engine::forget_even_pending`](crate::engine::Engine::forget_even_pending) frees the key.
//! Its store key is [`Engine::store_key`](crate::engine::Engine::store_key) of the door's
//! namespace, scope and key, keyed under the engine's secret when there is one. A held key is
//! a pending claim to the store: the memory store never drops it early, as it may a receipt
//! when it is full. So it counts against the scope's
//! [pending share](crate::store::memory::MemoryStoreBuilder::max_pending_per_scope), and the
//! door's keys share one scope unless [`scope`](SendOnceLayer::scope) says otherwise: past
//! the share (10 000 by default) of sends held at once, a send is refused
//! ([`Store`](OutboundErrorKind::Store), `ScopeFull`, nothing sent) until holds end.
//!
//! **Namespaces.** Each door has its own: `outbound` for the generic door, `outbound/http`
//! and `outbound/lettre` for the adapters. So one job key used for a mail and for a charge
//! is two keys. [`namespace`](SendOnceLayer::namespace) replaces the default.
//!
//! # Adapters
//!
//! - [`http`]: `Service<http::Request<B>>` clients: hyper-util, any tower HTTP client. It
//!   forwards the key to the provider as `Idempotency-Key`. Turn on the feature
//!   `hyper-util` so that a connect error of hyper-util's client releases its key.
//! - `lettre` (feature `lettre`): any lettre `AsyncTransport`, SMTP replies mapped.
//!
//! # The guarantee
//!
//! As every door's: **no duplicate sends within the limits of the store**. The limits:
//!
//! - the lease: a process that dies mid-send, or cannot renew its claim, lets another send
//!   once the lease lapses;
//! - the hold time of an unknown delivery. Without a Tokio runtime, a send whose caller gave
//!   up is held for the lease only;
//! - the retention of receipts: a repeat after the receipt expired sends again;
//! - the store's durability;
//! - a crash after the provider took the message but before its receipt was recorded. The
//!   key lapses with its lease, and a repeat sends again. Forward the key to a provider
//!   that de-duplicates too, as the HTTP adapter does, to close that window.
//!
//! [`Classify`]: crate::engine::Classify
//! [`Codec`]: crate::engine::Codec
//! [`Codec::encode_fitted`]: crate::engine::Codec::encode_fitted

mod classify;
mod delivery;
pub mod http;
mod identify;
#[cfg(feature = "lettre")]
#[cfg_attr(docsrs, doc(cfg(feature = "lettre")))]
pub mod lettre;
mod service;

pub use classify::{DefaultClassifier, NotSent};
pub use delivery::{Delivery, OutboundError, OutboundErrorKind, Unknown};
pub use identify::{Identify, Identity};
pub use service::{SendOnce, SendOnceLayer};
