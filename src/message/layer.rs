//! The layer and its service: claim the message's key, run the handler once, record or release.

use super::codec::{Discard, ResultCodec};
use super::error::MessageError;
use super::key::{HeaderOrHash, KeyStrategy, Message, MessageKey};
use crate::engine::detach::Drain;
use crate::engine::{Begin, Engine, Fingerprint, RecordedResponse, Ticket};
use crate::metrics::{Door, Outcome, Settled, request, settled};
use crate::engine::scope::{Scope, StoreKey};
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
/// A duplicate in flight is either a real concurrent duplicate (the producer sent the message
/// twice, or the broker redelivered it while a slow handler runs) or the redelivery of a
/// message whose consumer **crashed mid-handler**: its claim stays pending until the lease
/// lapses, and nothing else will ever run it. The door cannot tell the two apart, so by
/// default a duplicate in flight is never acknowledged: it waits briefly for the first
/// delivery, then is refused for a later redelivery.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::engine::Engine;
/// use tower_idempotency::message::{InProgress, MessageIdempotencyLayer};
///
/// assert_eq!(InProgress::default(), InProgress::Wait(InProgress::DEFAULT_WAIT));
/// // Handlers that take a few seconds: wait up to 5 s for the first delivery.
/// let layer = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "billing")
///     .in_progress(InProgress::Wait(Duration::from_secs(5)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InProgress {
    /// Waits up to the bound for the first delivery to finish (with
    /// [`Engine::begin_waiting`]): if it recorded its result, the duplicate is answered
    /// [`Handled::Duplicate`] with it; if it was released (it failed), the duplicate runs.
    /// Past the bound, as [`Reject`](Self::Reject). The default, with a bound of
    /// [`DEFAULT_WAIT`](Self::DEFAULT_WAIT) (1 s): a quick handler's duplicate is answered
    /// without a redelivery round trip. The wait holds the consumer's slot (and the broker's
    /// ack deadline runs, unless the adapter sends progress as the NATS one does): keep the
    /// bound well under the broker's ack wait.
    Wait(Duration),
    /// Refused at once with a retryable [`MessageError`] of kind `InFlight`: the broker
    /// redelivers it later, after the first delivery finished (then it is a completed
    /// duplicate) or failed or lapsed (then it runs). [`MessageError::retry_after`] is the
    /// lease the first delivery's claim has left, at most a third of the lease.
    Reject,
    /// **Opt-in, and it can lose a message.** Answered [`Handled::Skipped`]: acknowledged
    /// unrun. Two handlers never run at once, and a first delivery that fails is redelivered
    /// on its own; but if the first delivery's consumer crashed, the skipped duplicate was
    /// the message's only copy left and its work never happens. Use it only where the broker
    /// redelivers an unacknowledged message after the lease has lapsed, never before (its
    /// ack wait or visibility timeout longer than the engine's lease, and not kept alive
    /// while a handler runs), so that a redelivery after a crash always claims the key.
    Skip,
}

impl InProgress {
    /// The bound of the default [`Wait`](Self::Wait): 1 s.
    pub const DEFAULT_WAIT: Duration = Duration::from_secs(1);
}

impl Default for InProgress {
    fn default() -> Self {
        Self::Wait(Self::DEFAULT_WAIT)
    }
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
    /// A duplicate of a message still being handled, skipped ([`InProgress::Skip`], an
    /// opt-in).
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

/// Tells a permanent handler error (a redelivery would fail the same way: dead-letter it)
/// from a retryable one. See [`MessageIdempotencyLayer::permanent_errors`].
///
/// Any `Fn(&E) -> bool` (true: permanent) is a classifier.
pub trait ClassifyError<E>: Send + Sync + 'static {
    /// Whether `error` will come back on every redelivery.
    fn is_permanent(&self, error: &E) -> bool;
}

/// Every handler error is retryable (the default).
#[derive(Clone, Copy, Debug, Default)]
pub struct AllRetryable;

impl<E> ClassifyError<E> for AllRetryable {
    fn is_permanent(&self, _: &E) -> bool {
        false
    }
}

impl<E, F> ClassifyError<E> for F
where
    F: Fn(&E) -> bool + Send + Sync + 'static,
{
    fn is_permanent(&self, error: &E) -> bool {
        self(error)
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
pub struct MessageIdempotencyLayer<
    St,
    K = HeaderOrHash,
    C = Discard,
    F = AllSuccessful,
    P = AllRetryable,
> {
    engine: Engine<St>,
    config: Arc<Config>,
    in_flight: Drain,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
    permanent: Arc<P>,
}

impl<St, K, C, F, P> Clone for MessageIdempotencyLayer<St, K, C, F, P> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
            in_flight: self.in_flight.clone(),
            keys: Arc::clone(&self.keys),
            codec: Arc::clone(&self.codec),
            classify: Arc::clone(&self.classify),
            permanent: Arc::clone(&self.permanent),
        }
    }
}

impl<St, K, C, F, P> fmt::Debug for MessageIdempotencyLayer<St, K, C, F, P> {
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
            in_progress: InProgress::default(),
            run_to_completion: true,
        };
        config.set_namespace(DEFAULT_NAMESPACE.to_owned());
        Self {
            engine,
            config: Arc::new(config),
            in_flight: Drain::new(),
            keys: Arc::new(HeaderOrHash::new()),
            codec: Arc::new(Discard),
            classify: Arc::new(AllSuccessful),
            permanent: Arc::new(AllRetryable),
        }
    }
}

impl<St, K, C, F, P> MessageIdempotencyLayer<St, K, C, F, P> {
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

    /// What a duplicate of a message still being handled gets (default
    /// [`InProgress::Wait`] of [`InProgress::DEFAULT_WAIT`], then refused as in flight: never
    /// acknowledged while its claim is pending). See [`InProgress`].
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

    /// How long a handler whose caller went away runs on before it is cancelled (default
    /// 5 min, as the HTTP layer's [`detached_timeout`](crate::IdempotencyLayer::detached_timeout));
    /// see [`run_to_completion`](Self::run_to_completion). Any value is accepted:
    /// `Duration::MAX` never cancels. At the bound the handler is cancelled where it stands:
    /// nothing is recorded and nothing is released (it may have had effects), so its key stays
    /// pending until its lease lapses and the redelivery after that runs it again, as after a
    /// crash. Set it above the slowest handler's time.
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        self.in_flight.set_detached_timeout(timeout);
        self
    }

    /// How many handlers whose callers went away run on at once, for this layer and every
    /// service made from it (default 1024, as the HTTP layer's
    /// [`max_detached`](crate::IdempotencyLayer::max_detached)). A handler dropped while that
    /// many run is cancelled where it stands, its key pending until its lease lapses. Zero
    /// detaches nothing.
    pub fn max_detached(mut self, max: usize) -> Self {
        self.in_flight.set_max_detached(max);
        self
    }

    /// The claimed messages of this layer (and of every service made from it and its clones)
    /// whose handling has not finished, to wait on at shutdown (see [`Drain`]).
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
    pub fn in_flight(&self) -> Drain {
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
    pub fn key_strategy<K2>(self, strategy: K2) -> MessageIdempotencyLayer<St, K2, C, F, P> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: Arc::new(strategy),
            codec: self.codec,
            classify: self.classify,
            permanent: self.permanent,
        }
    }

    /// Records the handler's result with `codec`, so a completed duplicate is answered with
    /// it ([`Raw`](super::Raw) for bytes and text, [`Json`](super::Json) with feature
    /// `json`). Default [`Discard`]: nothing but the fact that it completed.
    pub fn store_results<C2>(self, codec: C2) -> MessageIdempotencyLayer<St, K, C2, F, P> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: self.keys,
            codec: Arc::new(codec),
            classify: self.classify,
            permanent: self.permanent,
        }
    }

    /// Calls a result unsuccessful when `classify` says so (`false`): the key is released and
    /// the message answered [`Handled::Failed`], so a redelivery runs again.
    pub fn classify<F2>(self, classify: F2) -> MessageIdempotencyLayer<St, K, C, F2, P> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: self.keys,
            codec: self.codec,
            classify: Arc::new(classify),
            permanent: self.permanent,
        }
    }

    /// Calls a handler error permanent when `classify` says so (`true`): the key is released
    /// and the error is one of kind `Handler` that is not retryable
    /// ([`MessageError::is_permanent`]), so adapters dead-letter the message instead of
    /// redelivering it (a body that will never parse, an order that no longer exists).
    /// Default [`AllRetryable`]: every handler error is retried.
    ///
    /// ```
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Engine;
    /// use tower_idempotency::message::{Envelope, MessageIdempotencyLayer};
    ///
    /// #[derive(Debug)]
    /// enum MailError { Unparsable, Smtp }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let handler = MessageIdempotencyLayer::new(Engine::new(MemoryStore::new()), "mailer")
    ///     .permanent_errors(|e: &MailError| matches!(e, MailError::Unparsable))
    ///     .layer(service_fn(|_: Envelope| async { Err::<(), _>(MailError::Unparsable) }));
    /// let err = handler.oneshot(Envelope::new("mail", "???")).await.unwrap_err();
    /// assert!(err.is_permanent() && !err.is_retryable());
    /// # }
    /// ```
    pub fn permanent_errors<P2>(self, classify: P2) -> MessageIdempotencyLayer<St, K, C, F, P2> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            in_flight: self.in_flight,
            keys: self.keys,
            codec: self.codec,
            classify: self.classify,
            permanent: Arc::new(classify),
        }
    }

    /// The engine.
    #[must_use]
    pub fn engine(&self) -> &Engine<St> {
        &self.engine
    }
}

impl<S, St, K, C, F, P> Layer<S> for MessageIdempotencyLayer<St, K, C, F, P> {
    type Service = MessageIdempotency<S, St, K, C, F, P>;

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
                permanent: Arc::clone(&self.permanent),
            }),
        }
    }
}

struct Shared<St, K, C, F, P> {
    engine: Engine<St>,
    config: Arc<Config>,
    in_flight: Drain,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
    permanent: Arc<P>,
}

/// The service made by [`MessageIdempotencyLayer`].
pub struct MessageIdempotency<
    S,
    St,
    K = HeaderOrHash,
    C = Discard,
    F = AllSuccessful,
    P = AllRetryable,
> {
    inner: S,
    shared: Arc<Shared<St, K, C, F, P>>,
}

impl<S: Clone, St, K, C, F, P> Clone for MessageIdempotency<S, St, K, C, F, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, St, K, C, F, P> fmt::Debug for MessageIdempotency<S, St, K, C, F, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageIdempotency")
            .field("inner", &self.inner)
            .field("engine", &self.shared.engine)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, St, K, C, F, P> MessageIdempotency<S, St, K, C, F, P> {
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
    pub fn in_flight(&self) -> Drain {
        self.shared.in_flight.clone()
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, M, St, K, C, F, P> Service<M> for MessageIdempotency<S, St, K, C, F, P>
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
    P: ClassifyError<S::Error>,
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
                    // A day is forever here, and a bound that large cannot overflow the clock.
                    let bound = bound.min(Duration::from_secs(24 * 3600));
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
                Ok(Begin::Replayed(record)) => {
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
                Ok(Begin::RecordInvalid(e)) => {
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
async fn run_claimed<S, M, St, K, C, F, P>(
    shared: Arc<Shared<St, K, C, F, P>>,
    mut inner: S,
    message: M,
    ticket: Ticket,
) -> Result<Handled<S::Response>, MessageError<S::Error>>
where
    S: Service<M>,
    St: Store,
    C: ResultCodec<S::Response>,
    F: Classify<S::Response>,
    P: ClassifyError<S::Error>,
{
    let engine = &shared.engine;
    let store_key = *ticket.key();
    let result = engine.run(&ticket, inner.call(message)).await;
    match result {
        Ok(r) if shared.classify.is_success(&r) => {
            let mut body = shared.codec.encode(&r);
            // A record must read back within the engine's limit, or every redelivery of work
            // that succeeded is refused: keep the fact that it completed, as the HTTP layer
            // keeps status and headers of a body over the limit.
            if body
                .as_ref()
                .is_some_and(|b| b.len() > engine.max_record_body())
            {
                tracing::warn!(target: "tower_idempotency::message", key = ?store_key, limit = engine.max_record_body(), "result over the record limit; recorded without it, so a duplicate is acknowledged without a result");
                body = None;
            }
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
            let permanent = shared.permanent.is_permanent(&e);
            Err(MessageError::handler_classified(e, permanent))
        }
    }
}

/// How long a duplicate in flight should wait before its redelivery: the lease the first
/// delivery's claim has left, at most a third of the lease (one store call, on this path
/// only); the cap when the store cannot tell. As HTTP's `Retry-After`: a running claim is
/// renewed every third of the lease, so its lease left (two thirds of the lease or more) says
/// nothing about when it ends, and a quick handler's duplicate must not wait a lease. A
/// stalled claim (its consumer gone) with less than the cap left is retried as it lapses.
async fn in_flight_retry_after<St: Store>(engine: &Engine<St>, key: &StoreKey) -> Duration {
    let cap = engine.lease() / 3;
    match engine.lease_left(key).await {
        Ok(Some(left)) => left.min(cap),
        Ok(None) => cap,
        Err(e) => {
            tracing::debug!(target: "tower_idempotency::message", key = ?key, error = %e, "lease left unknown; retry after a third of the lease");
            cap
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
