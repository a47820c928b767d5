//! The layer and its service: claim the message's key, run the handler once, record or release.

use super::codec::{Discard, ResultCodec};
use super::error::MessageError;
use super::key::{HeaderOrHash, KeyStrategy, Message, MessageKey};
use crate::detach::InFlightWork;
use crate::engine::{Begin, Engine, Fingerprint, RecordedResponse, Ticket};
use crate::metrics::{Door, Outcome, Settled, request, settled};
use crate::scope::{Scope, StoreKey};
use crate::store::{Forgotten, Store, StoreError};
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;

/// The default namespace of message keys, apart from the HTTP layer's.
pub const DEFAULT_NAMESPACE: &str = "tower-idempotency/message";

/// The header a message record carries, so no other door's record is taken for one.
const DOOR_VALUE: &[u8] = b"message/v1";

/// What a duplicate of a message that is still being handled gets.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::engine::Engine;
/// use tower_idempotency::message::{InProgress, MessageIdempotencyLayer};
///
/// // Wait up to 2 s for the first delivery; then refuse for a later redelivery.
/// let layer = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "billing")
///     .in_progress(InProgress::Wait(Duration::from_secs(2)));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum InProgress {
    /// Answered [`Handled::Skipped`]: acknowledge it. Two handlers never run at once; if the
    /// first delivery then fails, its own redelivery runs the message again (the broker
    /// redelivers the first, not the skipped duplicate). The default.
    #[default]
    Skip,
    /// Refused with a retryable [`MessageError`] of kind `InFlight`: the broker redelivers it
    /// later, after the first delivery finished (then it is a completed duplicate) or failed
    /// (then it runs). [`MessageError::retry_after`] is the lease the first delivery's claim
    /// has left.
    Reject,
    /// Waits up to the bound for the first delivery to finish (with
    /// [`Engine::begin_waiting`]): if it recorded its result, the duplicate is answered
    /// [`Handled::Duplicate`] with it; if it was released (it failed), the duplicate runs.
    /// Past the bound, as [`Reject`](Self::Reject). The wait holds the consumer's slot (and
    /// the broker's ack deadline runs): keep the bound well under the broker's ack wait.
    Wait(Duration),
}

/// What the door did with a message that it let through. Every variant but `Failed` means
/// "acknowledge".
///
/// It serializes (serde) as `{"ran": r}`, `{"failed": r}`, `{"duplicate": r | null}`,
/// `"skipped"` or `{"untracked": r}`, for job backends that keep a task's result.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Handled<R> {
    /// The handler ran and succeeded; its result is recorded under the key.
    Ran(R),
    /// The handler ran, and the classifier called its result unsuccessful: the key was
    /// released, so a redelivery runs again. Do not acknowledge.
    Failed(R),
    /// A completed duplicate: the handler did not run. The recorded result, when the codec
    /// keeps results.
    Duplicate(Option<R>),
    /// A duplicate of a message still being handled, skipped ([`InProgress::Skip`]).
    Skipped,
    /// The handler ran untracked: the topic is not listed, or the message has no key.
    Untracked(R),
}

impl<R> Handled<R> {
    /// Whether the broker should be told the message is done (all but `Failed`).
    #[must_use]
    pub fn is_ack(&self) -> bool {
        !matches!(self, Self::Failed(_))
    }

    /// Whether the handler ran for this delivery.
    #[must_use]
    pub fn ran(&self) -> bool {
        matches!(self, Self::Ran(_) | Self::Failed(_) | Self::Untracked(_))
    }

    /// The result: the handler's, or the recorded one.
    #[must_use]
    pub fn into_result(self) -> Option<R> {
        match self {
            Self::Ran(r) | Self::Failed(r) | Self::Untracked(r) => Some(r),
            Self::Duplicate(r) => r,
            Self::Skipped => None,
        }
    }
}

/// Tells a successful result from an unsuccessful one. An unsuccessful result releases the
/// key (the message is answered [`Handled::Failed`]) instead of recording it.
///
/// Any `Fn(&R) -> bool` (true: success) is a classifier.
pub trait Classify<R>: Send + Sync + 'static {
    /// Whether `result` is the message's final, successful result.
    fn is_success(&self, result: &R) -> bool;
}

/// Every `Ok` result is a success (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct AllSuccessful;

impl<R> Classify<R> for AllSuccessful {
    fn is_success(&self, _: &R) -> bool {
        true
    }
}

impl<R, F> Classify<R> for F
where
    F: Fn(&R) -> bool + Send + Sync + 'static,
{
    fn is_success(&self, result: &R) -> bool {
        self(result)
    }
}

#[derive(Clone, Debug)]
struct Config {
    consumer: Scope,
    namespace: String,
    /// The namespace of digest keys, derived once from `namespace`.
    digest_namespace: String,
    topics: Option<HashSet<String>>,
    require_key: bool,
    in_progress: InProgress,
    run_to_completion: bool,
}

impl Config {
    fn set_namespace(&mut self, ns: String) {
        self.digest_namespace = format!("{ns}#digest");
        self.namespace = ns;
    }

    /// The store key of `key` for this consumer: digests in a namespace of their own.
    fn store_key(&self, key: &MessageKey) -> StoreKey {
        let (k, digest) = key.parts();
        let namespace = if digest {
            &self.digest_namespace
        } else {
            &self.namespace
        };
        StoreKey::derive(namespace, &self.consumer, k)
    }
}

/// Makes a message handler (any `Service<M>`) run once per key; see the [module
/// docs](super) for the outcomes.
///
/// ```
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::engine::Engine;
/// use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "billing");
/// let handler = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|m: Envelope| async move { Ok::<_, Infallible>(m.body.len()) }));
///
/// let msg = Envelope::new("orders", "{\"sku\":\"X\"}").with_header("Idempotency-Key", "order-17");
/// let first = handler.clone().oneshot(msg.clone()).await.unwrap();
/// assert_eq!(first, Handled::Ran(11));
/// let again = handler.oneshot(msg).await.unwrap();
/// assert_eq!(again, Handled::Duplicate(None), "acknowledge; the handler did not run");
/// # }
/// ```
#[must_use]
pub struct MessageIdempotencyLayer<St, K = HeaderOrHash, C = Discard, F = AllSuccessful> {
    engine: Engine<St>,
    config: Arc<Config>,
    in_flight: InFlightWork,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
}

impl<St, K, C, F> Clone for MessageIdempotencyLayer<St, K, C, F> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
            in_flight: self.in_flight.clone(),
            keys: Arc::clone(&self.keys),
            codec: Arc::clone(&self.codec),
            classify: Arc::clone(&self.classify),
        }
    }
}

impl<St, K, C, F> fmt::Debug for MessageIdempotencyLayer<St, K, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageIdempotencyLayer")
            .field("engine", &self.engine)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<St: Store> MessageIdempotencyLayer<St> {
    /// A layer over `engine` for the consumer named `consumer`: one name per consumer group,
    /// durable subscription or worker pool, the same in every replica of it. The name is part
    /// of every key's scope, so two consumers of one topic each handle a message once, and
    /// neither is skipped as the other's duplicate.
    pub fn new(engine: Engine<St>, consumer: impl Into<String>) -> Self {
        let mut config = Config {
            consumer: Scope::principal(consumer),
            namespace: String::new(),
            digest_namespace: String::new(),
            topics: None,
            require_key: false,
            in_progress: InProgress::Skip,
            run_to_completion: true,
        };
        config.set_namespace(DEFAULT_NAMESPACE.to_owned());
        Self {
            engine,
            config: Arc::new(config),
            in_flight: InFlightWork::new(),
            keys: Arc::new(HeaderOrHash::new()),
            codec: Arc::new(Discard),
            classify: Arc::new(AllSuccessful),
        }
    }
}

impl<St, K, C, F> MessageIdempotencyLayer<St, K, C, F> {
    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Acts only on messages of these topics (queues, subjects; compared exactly). Others
    /// pass to the handler with no store call. Default: every topic.
    pub fn topics<I: IntoIterator<Item = T>, T: Into<String>>(self, topics: I) -> Self {
        let set = topics.into_iter().map(Into::into).collect();
        self.config(|c| c.topics = Some(set))
    }

    /// Refuses a message of a listed topic that has no key, with an error of kind
    /// `KeyMissing` (not retryable: it dead-letters instead of running unprotected). Off by
    /// default: such a message runs untracked. With the default strategy every message has a
    /// key unless [`HeaderOrHash::hash_body`] is off.
    pub fn require_key(self, required: bool) -> Self {
        self.config(|c| c.require_key = required)
    }

    /// What a duplicate of a message still being handled gets (default [`InProgress::Skip`]).
    pub fn in_progress(self, policy: InProgress) -> Self {
        self.config(|c| c.in_progress = policy)
    }

    /// Whether a claimed message's handler finishes when the door's future is dropped (the
    /// consumer shuts down, an outer timeout fires): default `true`. The rest of the work
    /// (handler, record or release) then moves onto a task of its own and its outcome is
    /// recorded, so the redelivery is a completed duplicate instead of waiting for the lease
    /// to lapse and running again. Wait for such work at shutdown with
    /// [`in_flight`](Self::in_flight). With `false` the handler is cancelled with the future
    /// and its key stays pending until its lease lapses, as after a crash.
    pub fn run_to_completion(self, on: bool) -> Self {
        self.config(|c| c.run_to_completion = on)
    }

    /// The claimed messages of this layer (and of every service made from it and its clones)
    /// whose handling has not finished, to wait on at shutdown (see [`InFlightWork`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Engine;
    /// use tower_idempotency::message::MessageIdempotencyLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "billing");
    /// let in_flight = layer.in_flight();
    /// // ... run the consumer with the layer; once it stops taking messages:
    /// assert!(in_flight.wait(Duration::from_secs(30)).await, "every handler finished");
    /// # }
    /// ```
    #[must_use]
    pub fn in_flight(&self) -> InFlightWork {
        self.in_flight.clone()
    }

    /// Forgets this consumer's record of `key` (in this layer's namespace and tenant), so a
    /// redelivery of the message runs again: see [`Engine::forget`]. A pending claim is kept
    /// ([`Forgotten::KeptPending`]): its handler may be running; delete it too with
    /// [`forget_even_pending`](Self::forget_even_pending). For a message keyed by its digest,
    /// pass [`MessageKey::digest`] of it.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Engine;
    /// use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer, MessageKey};
    /// use tower_idempotency::store::Forgotten;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "billing");
    /// let handler = layer.layer(service_fn(|_: Envelope| async { Ok::<_, Infallible>(()) }));
    /// let msg = Envelope::new("orders", "order 17").with_header("Idempotency-Key", "order-17");
    /// assert_eq!(handler.clone().oneshot(msg.clone()).await.unwrap(), Handled::Ran(()));
    ///
    /// let key = MessageKey::given(b"order-17").unwrap();
    /// assert_eq!(layer.forget(&key).await.unwrap(), Forgotten::Record);
    /// assert_eq!(handler.oneshot(msg).await.unwrap(), Handled::Ran(()), "runs again");
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(&self, key: &MessageKey) -> Result<Forgotten, StoreError>
    where
        St: Store,
    {
        self.engine.forget(&self.config.store_key(key)).await
    }

    /// As [`forget`](Self::forget), and a pending claim is deleted too: its handler may still
    /// be running, and a redelivery then runs it again beside it (see
    /// [`Engine::forget_even_pending`]).
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget_even_pending(&self, key: &MessageKey) -> Result<Forgotten, StoreError>
    where
        St: Store,
    {
        self.engine
            .forget_even_pending(&self.config.store_key(key))
            .await
    }

    /// The namespace of this consumer's keys (default [`DEFAULT_NAMESPACE`]): give services
    /// that share a store and a consumer name namespaces of their own.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let ns = namespace.into();
        self.config(|c| c.set_namespace(ns))
    }

    /// The same consumer under a tenant (part of the scope, as the consumer is).
    pub fn tenant(self, tenant: impl Into<String>) -> Self {
        let tenant = tenant.into();
        self.config(|c| c.consumer = c.consumer.clone().with_tenant(tenant))
    }

    /// Finds keys with `strategy` instead of [`HeaderOrHash`].
    pub fn key_strategy<K2>(self, strategy: K2) -> MessageIdempotencyLayer<St, K2, C, F> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: Arc::new(strategy),
            codec: self.codec,
            classify: self.classify,
        }
    }

    /// Records the handler's result with `codec`, so a completed duplicate is answered with
    /// it ([`Raw`](super::Raw) for bytes and text, [`Json`](super::Json) with feature
    /// `json`). Default [`Discard`]: nothing but the fact that it completed.
    pub fn store_results<C2>(self, codec: C2) -> MessageIdempotencyLayer<St, K, C2, F> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: self.keys,
            codec: Arc::new(codec),
            classify: self.classify,
        }
    }

    /// Calls a result unsuccessful when `classify` says so (`false`): the key is released and
    /// the message answered [`Handled::Failed`], so a redelivery runs again.
    pub fn classify<F2>(self, classify: F2) -> MessageIdempotencyLayer<St, K, C, F2> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: self.keys,
            codec: self.codec,
            classify: Arc::new(classify),
        }
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Engine<St> {
        &self.engine
    }
}

impl<S, St, K, C, F> Layer<S> for MessageIdempotencyLayer<St, K, C, F> {
    type Service = MessageIdempotency<S, St, K, C, F>;

    fn layer(&self, inner: S) -> Self::Service {
        MessageIdempotency {
            inner,
            shared: Arc::new(Shared {
                engine: self.engine.clone(),
                config: Arc::clone(&self.config),
                in_flight: self.in_flight.clone(),
                keys: Arc::clone(&self.keys),
                codec: Arc::clone(&self.codec),
                classify: Arc::clone(&self.classify),
            }),
        }
    }
}

struct Shared<St, K, C, F> {
    engine: Engine<St>,
    config: Arc<Config>,
    in_flight: InFlightWork,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
}

/// The service made by [`MessageIdempotencyLayer`].
pub struct MessageIdempotency<S, St, K = HeaderOrHash, C = Discard, F = AllSuccessful> {
    inner: S,
    shared: Arc<Shared<St, K, C, F>>,
}

impl<S: Clone, St, K, C, F> Clone for MessageIdempotency<S, St, K, C, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St, K, C, F> fmt::Debug for MessageIdempotency<S, St, K, C, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageIdempotency")
            .field("inner", &self.inner)
            .field("engine", &self.shared.engine)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, St, K, C, F> MessageIdempotency<S, St, K, C, F> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The engine.
    pub fn engine(&self) -> &Engine<St> {
        &self.shared.engine
    }

    /// The layer's claimed messages that have not finished (see
    /// [`MessageIdempotencyLayer::in_flight`]).
    #[must_use]
    pub fn in_flight(&self) -> InFlightWork {
        self.shared.in_flight.clone()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, M, St, K, C, F> Service<M> for MessageIdempotency<S, St, K, C, F>
where
    M: Message + Send + 'static,
    S: Service<M> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    K: KeyStrategy<M>,
    C: ResultCodec<S::Response>,
    F: Classify<S::Response>,
{
    type Response = Handled<S::Response>;
    type Error = MessageError<S::Error>;
    type Future = BoxFuture<Result<Handled<S::Response>, MessageError<S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(MessageError::handler)
    }

    fn call(&mut self, message: M) -> Self::Future {
        // Keep the service that was polled ready; the clone waits for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let shared = Arc::clone(&self.shared);
        let config = &shared.config;

        let listed = config
            .topics
            .as_ref()
            .is_none_or(|t| t.contains(message.topic()));
        if !listed {
            return untracked(inner.call(message));
        }
        let key = match shared.keys.key(&message) {
            Ok(Some(key)) => key,
            Ok(None) if config.require_key => {
                request(Door::Message, Outcome::KeyMissing);
                tracing::warn!(target: "tower_idempotency::message", topic = message.topic(), "message without an idempotency key refused");
                return Box::pin(std::future::ready(Err(MessageError::key_missing())));
            }
            Ok(None) => {
                request(Door::Message, Outcome::Passthrough);
                return untracked(inner.call(message));
            }
            Err(e) => {
                request(Door::Message, Outcome::KeyInvalid);
                tracing::warn!(target: "tower_idempotency::message", topic = message.topic(), reason = %e, "message with an invalid idempotency key refused");
                return Box::pin(std::future::ready(Err(MessageError::key_invalid(e))));
            }
        };
        let store_key = config.store_key(&key);
        let fingerprint = fingerprint(&message);

        Box::pin(async move {
            let engine = &shared.engine;
            let begun = match shared.config.in_progress {
                InProgress::Wait(bound) => {
                    engine.begin_waiting(store_key, fingerprint, bound).await
                }
                InProgress::Skip | InProgress::Reject => engine.begin(store_key, fingerprint).await,
            };
            let ticket = match begun {
                Err(e) => {
                    request(Door::Message, Outcome::of_store_error(&e));
                    tracing::warn!(target: "tower_idempotency::message", key = ?store_key, error = %e, "idempotency store failed on claim; the message is not handled");
                    return Err(MessageError::store(e));
                }
                Ok(Begin::Run(ticket)) => {
                    request(Door::Message, Outcome::Fresh);
                    ticket
                }
                Ok(Begin::Replay(record)) => {
                    let duplicate = replay(record, &*shared.codec);
                    let outcome = match duplicate {
                        Ok(_) => Outcome::Replayed,
                        Err(_) => Outcome::RecordInvalid,
                    };
                    request(Door::Message, outcome);
                    return duplicate;
                }
                Ok(Begin::InFlight) => {
                    request(Door::Message, Outcome::InFlight);
                    return match shared.config.in_progress {
                        InProgress::Skip => Ok(Handled::Skipped),
                        // Past the wait's bound: refused as Reject refuses.
                        InProgress::Reject | InProgress::Wait(_) => Err(MessageError::in_flight(
                            in_flight_retry_after(engine, &store_key).await,
                        )),
                    };
                }
                Ok(Begin::KeyReused) => {
                    request(Door::Message, Outcome::KeyReused);
                    tracing::warn!(target: "tower_idempotency::message", key = ?store_key, "idempotency key reused by a different message; refused");
                    return Err(MessageError::key_reused());
                }
                Ok(Begin::Invalid(e)) => {
                    request(Door::Message, Outcome::RecordInvalid);
                    tracing::error!(target: "tower_idempotency::message", key = ?store_key, reason = e.reason(), "message record failed validation; not used");
                    return Err(MessageError::record_invalid(Some(e)));
                }
            };
            let run_to_completion = shared.config.run_to_completion;
            let in_flight = shared.in_flight.clone();
            let work = run_claimed(shared, inner, message, ticket);
            if run_to_completion {
                // Finishes (and records) on a task of its own if this future is dropped first.
                in_flight.detachable(work).await
            } else {
                in_flight.counted(work).await
            }
        })
    }
}

/// The claimed part of a delivery: the handler under lease renewal, then the record or
/// release. Owns everything it uses, so it can finish on a task of its own when the caller
/// goes away.
async fn run_claimed<S, M, St, K, C, F>(
    shared: Arc<Shared<St, K, C, F>>,
    mut inner: S,
    message: M,
    ticket: Ticket,
) -> Result<Handled<S::Response>, MessageError<S::Error>>
where
    S: Service<M>,
    St: Store,
    C: ResultCodec<S::Response>,
    F: Classify<S::Response>,
{
    let engine = &shared.engine;
    let store_key = *ticket.key();
    let result = engine.run(&ticket, inner.call(message)).await;
    match result {
        Ok(r) if shared.classify.is_success(&r) => {
            let body = shared.codec.encode(&r);
            let record = RecordedResponse::of_door(DOOR_VALUE, body);
            let done = engine.complete(ticket, &record).await;
            settled(Door::Message, Settled::of_complete(&done));
            match done {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(target: "tower_idempotency::message", key = ?store_key, "the lease lapsed while the handler ran; another delivery may have run it too");
                }
                Err(e) => {
                    tracing::warn!(target: "tower_idempotency::message", key = ?store_key, error = %e, "message handled but not recorded; the key stays pending until its lease lapses");
                }
            }
            Ok(Handled::Ran(r))
        }
        Ok(r) => {
            release(engine, ticket).await;
            Ok(Handled::Failed(r))
        }
        Err(e) => {
            release(engine, ticket).await;
            Err(MessageError::handler(e))
        }
    }
}

/// How long a duplicate in flight should wait before its redelivery: the lease the first
/// delivery's claim has left (one store call, on this path only), the whole lease when the
/// store cannot tell. Not capped as HTTP's `Retry-After` is: a broker counts redeliveries
/// (`max_deliver`), so one redelivery when the key can be decided beats several early ones.
/// A stalled claim (its consumer gone) is retried the moment it lapses; a running one
/// (renewed every third of the lease) after two thirds of the lease or more.
async fn in_flight_retry_after<St: Store>(engine: &Engine<St>, key: &StoreKey) -> Duration {
    match engine.lease_left(key).await {
        Ok(Some(left)) => left,
        Ok(None) => engine.lease(),
        Err(e) => {
            tracing::debug!(target: "tower_idempotency::message", key = ?key, error = %e, "lease left unknown; retry after the whole lease");
            engine.lease()
        }
    }
}

fn untracked<Fut, R, E>(fut: Fut) -> BoxFuture<Result<Handled<R>, MessageError<E>>>
where
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    Box::pin(async move {
        fut.await
            .map(Handled::Untracked)
            .map_err(MessageError::handler)
    })
}

/// The topic, schema version and body: a redelivery matches, another message under the same
/// key does not.
fn fingerprint<M: Message>(message: &M) -> Fingerprint {
    let b = Fingerprint::builder()
        .field(b"message/v1")
        .field(message.topic().as_bytes());
    let b = match message.schema_version() {
        Some(v) => b.field(b"\x01").field(v.as_bytes()),
        None => b.field(b"\x00"),
    };
    b.field(&message.body()).finish()
}

async fn release<St: Store>(engine: &Engine<St>, ticket: Ticket) {
    let key = *ticket.key();
    let released = engine.release(ticket).await;
    settled(Door::Message, Settled::of_release(&released));
    if let Err(e) = released {
        tracing::warn!(target: "tower_idempotency::message", key = ?key, error = %e, "key not released; a redelivery waits until its lease lapses");
    }
}

fn replay<R, E, C: ResultCodec<R>>(
    record: RecordedResponse,
    codec: &C,
) -> Result<Handled<R>, MessageError<E>> {
    if !record.is_of_door(DOOR_VALUE) {
        tracing::error!(target: "tower_idempotency::message", "the record under this key was not written by the message door; not used");
        return Err(MessageError::record_invalid(None));
    }
    Ok(Handled::Duplicate(record.body.and_then(|b| {
        let len = b.len();
        let r = codec.decode(b);
        if r.is_none() && len > 0 {
            tracing::warn!(target: "tower_idempotency::message", "the recorded result does not decode with this codec; the duplicate is acknowledged without it");
        }
        r
    })))
}
