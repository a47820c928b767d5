//! The layer and its service: claim the message's key, run the handler once, then the verdict.

use super::error::MessageError;
use super::key::{HeaderOrHash, Identify, Message, MessageKey};
use crate::engine::detach::Drain;
use crate::engine::scope::Scope;
use crate::engine::settle::{Recording, Settle, Tally};
use crate::engine::steps::Found;
use crate::engine::{
    Begin, BoxFuture, Classify, Codec, Discard, Engine, Fingerprint, Recorded, Ticket, Verdict,
};
use crate::metrics::{Door, Outcome, request};
use crate::store::StoreKey;
use crate::store::{Forgotten, Store, StoreError};
use bytes::Bytes;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

/// The header a message record carries, so no other door's record is taken for one.
const DOOR_VALUE: &[u8] = b"message/v1";

/// What the door did with a message that it let through.
///
/// A message the handler ran for is answered for the verdict its key was settled with:
/// `Recorded`, `Released`, `Failed` or `Held`, one per [`Verdict`].
/// `Recorded`, `Replayed`, `Skipped` and `Untracked` mean "acknowledge": see
/// [`is_ack`](Self::is_ack). It serializes (serde) as `{"recorded": r}`, `{"released": r}`,
/// `{"failed": r}`, `{"held": r}`, `{"replayed": r | null}`, `"skipped"` or
/// `{"untracked": r}`, for job backends that keep a task's result.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Handled<R> {
    /// The handler ran, and its result is recorded under the key ([`Verdict::Record`]).
    Recorded(R),
    /// The handler ran, and the classifier gave [`Verdict::Release`]. The key was released,
    /// so a redelivery runs again. Do not acknowledge.
    Released(R),
    /// The handler ran, and the classifier gave [`Verdict::Fail`]. The key was released, and
    /// a redelivery would fail the same way. Dead-letter it.
    Failed(R),
    /// The handler ran, and the classifier gave [`Verdict::Hold`]: it may have had its
    /// effect. The claim is kept for the engine's lease. Do not acknowledge: a redelivery is
    /// in flight until the lease lapses, then runs again.
    Held(R),
    /// A completed repeat: the handler did not run. It holds the recorded result when the
    /// codec keeps results.
    Replayed(Option<R>),
    /// A repeat of a message still being handled, acknowledged unrun. Only with the
    /// opt-in [`skip_in_flight`](MessageIdempotencyLayer::skip_in_flight).
    Skipped,
    /// The handler ran untracked: the topic is not listed, or the message has no key.
    Untracked(R),
}

impl<R> Handled<R> {
    /// Whether the broker should be told the message is done.
    #[must_use]
    pub fn is_ack(&self) -> bool {
        matches!(
            self,
            Self::Recorded(_) | Self::Replayed(_) | Self::Skipped | Self::Untracked(_)
        )
    }

    /// Whether the handler ran for this delivery.
    #[must_use]
    pub fn ran(&self) -> bool {
        !matches!(self, Self::Replayed(_) | Self::Skipped)
    }

    /// The result: the handler's, or the recorded one.
    #[must_use]
    pub fn into_result(self) -> Option<R> {
        match self {
            Self::Recorded(r)
            | Self::Released(r)
            | Self::Failed(r)
            | Self::Held(r)
            | Self::Untracked(r) => Some(r),
            Self::Replayed(r) => r,
            Self::Skipped => None,
        }
    }
}

/// The default classifier: records an `Ok` result and releases the key on an `Err`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DefaultClassifier;

impl<R, E> Classify<Result<R, E>> for DefaultClassifier {
    fn classify(&self, outcome: &Result<R, E>) -> Verdict {
        match outcome {
            Ok(_) => Verdict::Record,
            Err(_) => Verdict::Release,
        }
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
    wait_in_flight: Duration,
    skip_in_flight: bool,
    run_to_completion: bool,
}

impl Config {
    fn set_namespace(&mut self, ns: String) {
        self.digest_namespace = format!("{ns}#digest");
        self.namespace = ns;
    }

    /// The store key of `key` for this consumer: digests in a namespace of their own.
    fn store_key(&self, secret: Option<&crate::Secret>, key: &MessageKey) -> StoreKey {
        let (k, digest) = key.parts();
        let namespace = if digest {
            &self.digest_namespace
        } else {
            &self.namespace
        };
        crate::engine::store_key(secret, namespace, &self.consumer, k)
    }
}

/// Makes a message handler run once per key. See the [module docs](super) for the outcomes.
///
/// The handler is any `Service<M>` over a [`Message`].
///
/// ```
/// use std::convert::Infallible;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let layer = MessageIdempotencyLayer::new(MemoryStore::new(), "billing");
/// let handler = ServiceBuilder::new()
///     .layer(layer)
///     .service(service_fn(|m: Envelope| async move { Ok::<_, Infallible>(m.body.len()) }));
///
/// let msg = Envelope::new("orders", "{\"sku\":\"X\"}").with_header("Idempotency-Key", "order-17");
/// let first = handler.clone().oneshot(msg.clone()).await.unwrap();
/// assert_eq!(first, Handled::Recorded(11));
/// let again = handler.oneshot(msg).await.unwrap();
/// assert_eq!(again, Handled::Replayed(None), "acknowledge; the handler did not run");
/// # }
/// ```
#[must_use]
pub struct MessageIdempotencyLayer<St, K = HeaderOrHash, C = Discard, F = DefaultClassifier> {
    engine: Engine<St>,
    config: Arc<Config>,
    drain: Drain,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
}

impl<St, K, C, F> Clone for MessageIdempotencyLayer<St, K, C, F> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            config: Arc::clone(&self.config),
            drain: self.drain.clone(),
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
    /// A layer over `engine` for the consumer named `consumer`.
    ///
    /// `engine` is an [`Engine`] or a store, which gets an engine with the defaults. Name
    /// one consumer group, durable subscription or worker pool, the same in every replica.
    /// The name is part of every key's scope. So two consumers of one topic each handle a
    /// message once, and neither is skipped as the other's repeat.
    pub fn new(engine: impl Into<Engine<St>>, consumer: impl Into<String>) -> Self {
        let mut config = Config {
            consumer: Scope::principal(consumer),
            namespace: String::new(),
            digest_namespace: String::new(),
            topics: None,
            require_key: false,
            wait_in_flight: Duration::from_secs(1),
            skip_in_flight: false,
            run_to_completion: true,
        };
        config.set_namespace("message".to_owned());
        Self {
            engine: engine.into(),
            config: Arc::new(config),
            drain: Drain::new(),
            keys: Arc::new(HeaderOrHash::new()),
            codec: Arc::new(Discard),
            classify: Arc::new(DefaultClassifier),
        }
    }
}

impl<St, K, C, F> MessageIdempotencyLayer<St, K, C, F> {
    fn config(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Acts only on messages of these topics, compared exactly. A topic is a queue or a
    /// subject. Others pass to the handler with no store call. Default: every topic.
    pub fn topics<I: IntoIterator<Item = T>, T: Into<String>>(self, topics: I) -> Self {
        let set = topics.into_iter().map(Into::into).collect();
        self.config(|c| c.topics = Some(set))
    }

    /// Refuses a message of a listed topic that has no key. The error's kind is
    /// `KeyMissing`, not retryable: the message dead-letters instead of running unprotected.
    /// Default: `false`, and such a message runs untracked. With the default [`Identify`] every
    /// message has a key unless [`HeaderOrHash::hash_body`] is off.
    pub fn require_key(self, require: bool) -> Self {
        self.config(|c| c.require_key = require)
    }

    /// How long a repeat of a message still being handled waits for the first delivery.
    /// Default: 1 s.
    ///
    /// If the first delivery records its result within the wait, the repeat is answered
    /// [`Handled::Replayed`]. If it is released, the repeat runs. Otherwise the repeat
    /// is refused with a retryable error of kind `InFlight`, and
    /// [`MessageError::retry_after`] says when to redeliver. `Duration::ZERO` refuses at
    /// once and holds no consumer slot while waiting. The wait holds the consumer's slot,
    /// and the broker's ack deadline runs unless the adapter sends progress, as the NATS
    /// one does. Keep it well under the broker's ack wait.
    ///
    /// A repeat in flight is never acknowledged: it may be the redelivery of a message
    /// whose consumer crashed mid-handler, and then it is the only copy left.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::message::MessageIdempotencyLayer;
    ///
    /// // Handlers that take a few seconds: wait up to 5 s for the first delivery.
    /// let layer = MessageIdempotencyLayer::new(MemoryStore::new(), "billing")
    ///     .wait_in_flight(Duration::from_secs(5));
    /// ```
    pub fn wait_in_flight(self, wait: Duration) -> Self {
        self.config(|c| c.wait_in_flight = wait)
    }

    /// **Opt-in, and it can lose a message.** Acknowledges a repeat in flight unrun, as
    /// [`Handled::Skipped`], without waiting. Default: `false`.
    ///
    /// Two handlers never run at once, and a first delivery that fails is redelivered on
    /// its own. But if the first delivery's consumer crashed, the skipped repeat was the
    /// message's only copy left, and its work never happens. Use it only where the broker
    /// redelivers an unacknowledged message after the lease has lapsed, never before. Its
    /// ack wait or visibility timeout must then be longer than the engine's lease, and not
    /// kept alive while a handler runs. A redelivery after a crash then always claims the
    /// key. With it on, [`wait_in_flight`](Self::wait_in_flight) is not used.
    pub fn skip_in_flight(self, skip: bool) -> Self {
        self.config(|c| c.skip_in_flight = skip)
    }

    /// Whether a claimed message's handler finishes when the door's future is dropped.
    /// Default: `true`.
    ///
    /// A future is dropped when the consumer shuts down or an outer timeout fires. The rest
    /// of the work (handler, record or release) then moves onto a task of its own. Its
    /// outcome is recorded, so the redelivery is a completed repeat. Wait for such work
    /// at shutdown with [`drain`](Self::drain). With `false` the handler is cancelled with
    /// the future, and its key stays pending until its lease lapses, as after a crash.
    pub fn run_to_completion(self, on: bool) -> Self {
        self.config(|c| c.run_to_completion = on)
    }

    /// How long a handler whose caller went away runs on before it is cancelled.
    /// Default: 5 min, as the HTTP layer's.
    ///
    /// See [`run_to_completion`](Self::run_to_completion). Any value is accepted:
    /// `Duration::MAX` never cancels. At the bound the handler is cancelled where it stands.
    /// Nothing is recorded and nothing is released, since it may have had effects. Its key
    /// stays pending until its lease lapses, and the redelivery after that runs it again, as
    /// after a crash. Set it above the slowest handler's time.
    pub fn detached_timeout(mut self, timeout: Duration) -> Self {
        self.drain.set_detached_timeout(timeout);
        self
    }

    /// How many handlers whose callers went away run on at once. Default: 1024, as the HTTP
    /// layer's.
    ///
    /// The bound is shared by this layer and every service made from it. A handler dropped
    /// while that many run is cancelled where it stands, its key pending until its lease
    /// lapses. Zero detaches nothing.
    pub fn max_detached(mut self, max: usize) -> Self {
        self.drain.set_max_detached(max);
        self
    }

    /// The claimed messages whose handling has not finished, to wait on at shutdown.
    ///
    /// It counts the messages of this layer, its clones and every service made from them.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::message::MessageIdempotencyLayer;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = MessageIdempotencyLayer::new(MemoryStore::new(), "billing");
    /// let drain = layer.drain();
    /// // ... run the consumer with the layer; once it stops taking messages:
    /// assert!(drain.wait(Duration::from_secs(30)).await, "every handler finished");
    /// # }
    /// ```
    #[must_use]
    pub fn drain(&self) -> Drain {
        self.drain.clone()
    }

    /// Forgets this consumer's record of `key`, so a redelivery of the message runs again.
    ///
    /// It acts in this layer's namespace and tenant: see [`Engine::forget`]. A pending claim
    /// is kept, as [`Forgotten::KeptPending`], since its handler may be running. Delete it
    /// too with [`forget_even_pending`](Self::forget_even_pending). For a message keyed by
    /// its digest, pass [`MessageKey::digest`] of it.
    ///
    /// ```
    /// use std::convert::Infallible;
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer, MessageKey};
    /// use tower_idempotency::store::Forgotten;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let layer = MessageIdempotencyLayer::new(MemoryStore::new(), "billing");
    /// let handler = layer.layer(service_fn(|_: Envelope| async { Ok::<_, Infallible>(()) }));
    /// let msg = Envelope::new("orders", "order 17").with_header("Idempotency-Key", "order-17");
    /// assert_eq!(handler.clone().oneshot(msg.clone()).await.unwrap(), Handled::Recorded(()));
    ///
    /// let key = MessageKey::given(b"order-17").unwrap();
    /// assert_eq!(layer.forget(&key).await.unwrap(), Forgotten::Record);
    /// assert_eq!(handler.oneshot(msg).await.unwrap(), Handled::Recorded(()), "runs again");
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(&self, key: &MessageKey) -> Result<Forgotten, StoreError>
    where
        St: Store,
    {
        self.engine
            .forget(&self.config.store_key(self.engine.secret(), key))
            .await
    }

    /// As [`forget`](Self::forget), and a pending claim is deleted too.
    ///
    /// Its handler may still be running, and a redelivery then runs beside it. See
    /// [`Engine::forget_even_pending`].
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget_even_pending(&self, key: &MessageKey) -> Result<Forgotten, StoreError>
    where
        St: Store,
    {
        self.engine
            .forget_even_pending(&self.config.store_key(self.engine.secret(), key))
            .await
    }

    /// The namespace of this consumer's keys. Default: `message`.
    ///
    /// It replaces the default. Give services that share a store and a consumer name
    /// namespaces of their own.
    pub fn namespace(self, namespace: impl Into<String>) -> Self {
        let ns = namespace.into();
        self.config(|c| c.set_namespace(ns))
    }

    /// The same consumer under a tenant, part of the scope as the consumer is.
    pub fn tenant(self, tenant: impl Into<String>) -> Self {
        let tenant = tenant.into();
        self.config(|c| c.consumer = c.consumer.clone().with_tenant(tenant))
    }

    /// Finds each message's key with `identify`. Default: [`HeaderOrHash`].
    pub fn identify<K2>(self, identify: K2) -> MessageIdempotencyLayer<St, K2, C, F> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            drain: self.drain,
            keys: Arc::new(identify),
            codec: self.codec,
            classify: self.classify,
        }
    }

    /// Records the handler's result with `codec`, so a completed repeat is answered with
    /// it. Default: [`Discard`], which records only that the message was handled.
    ///
    /// [`Raw`](crate::engine::Raw) keeps bytes and text, [`Json`](crate::engine::Json) any
    /// serde type (feature `json`). A result that does not encode, or whose bytes are over
    /// the engine's record limit, is recorded without it, with a warning.
    pub fn codec<C2>(self, codec: C2) -> MessageIdempotencyLayer<St, K, C2, F> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            drain: self.drain,
            keys: self.keys,
            codec: Arc::new(codec),
            classify: self.classify,
        }
    }

    /// Gives the [`Verdict`] on the handler's `Result`. Default: [`DefaultClassifier`], which records
    /// `Ok` and releases the key on `Err`.
    ///
    /// | verdict | on `Ok(r)` | on `Err(e)` |
    /// | --- | --- | --- |
    /// | `Record` | recorded; [`Handled::Recorded`] | recorded without a result; `Err`, kind `Work`, not retryable |
    /// | `Release` | key released; [`Handled::Released`] | key released; `Err`, kind `Work`, retryable |
    /// | `Fail` | key released; [`Handled::Failed`] | key released; `Err`, kind `Work`, not retryable |
    /// | `Hold` | key held for the lease; [`Handled::Held`] | key held for the lease; `Err`, kind `Work`, retryable after [`retry_after`](MessageError::retry_after) |
    ///
    /// `Fail` is for a message that fails the same way on every redelivery: a body that
    /// never parses, an order that no longer exists. The adapters dead-letter it. `Hold` is
    /// for a handler that may have had its effect: a redelivery is refused in flight until
    /// the lease lapses, then runs again.
    ///
    /// ```
    /// use tower::{Layer, ServiceExt, service_fn};
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Verdict;
    /// use tower_idempotency::message::{Envelope, MessageErrorKind, MessageIdempotencyLayer};
    ///
    /// #[derive(Debug)]
    /// enum MailError { Unparsable, Smtp }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let handler = MessageIdempotencyLayer::new(MemoryStore::new(), "mailer")
    ///     .classify(|r: &Result<(), MailError>| match r {
    ///         Ok(()) => Verdict::Record,
    ///         Err(MailError::Unparsable) => Verdict::Fail,
    ///         Err(MailError::Smtp) => Verdict::Release,
    ///     })
    ///     .layer(service_fn(|_: Envelope| async { Err::<(), _>(MailError::Unparsable) }));
    /// let err = handler.oneshot(Envelope::new("mail", "???")).await.unwrap_err();
    /// assert_eq!(err.kind(), MessageErrorKind::Work);
    /// assert!(!err.is_retryable(), "dead-letter it");
    /// # }
    /// ```
    pub fn classify<F2>(self, classify: F2) -> MessageIdempotencyLayer<St, K, C, F2> {
        MessageIdempotencyLayer {
            engine: self.engine,
            config: self.config,
            drain: self.drain,
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
                drain: self.drain.clone(),
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
    drain: Drain,
    keys: Arc<K>,
    codec: Arc<C>,
    classify: Arc<F>,
}

/// The service made by [`MessageIdempotencyLayer`].
pub struct MessageIdempotency<S, St, K = HeaderOrHash, C = Discard, F = DefaultClassifier> {
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

    /// The layer's claimed messages that have not finished. See
    /// [`MessageIdempotencyLayer::drain`].
    #[must_use]
    pub fn drain(&self) -> Drain {
        self.shared.drain.clone()
    }
}

impl<S, M, St, K, C, F> Service<M> for MessageIdempotency<S, St, K, C, F>
where
    M: Message + Send + 'static,
    S: Service<M> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    K: Identify<M>,
    C: Codec<S::Response>,
    F: Classify<Result<S::Response, S::Error>>,
{
    type Response = Handled<S::Response>;
    type Error = MessageError<S::Error>;
    type Future = BoxFuture<'static, Result<Handled<S::Response>, MessageError<S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner
            .poll_ready(cx)
            .map_err(|e| MessageError::handler(e, Verdict::Release, None))
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
        let key = match shared.keys.identify(&message) {
            Ok(Some(key)) => key,
            Ok(None) if config.require_key => {
                request(Door::Message, Outcome::KeyMissing);
                tracing::warn!(target: "tower_idempotency::message", topic = message.topic(), "message without an idempotency key refused");
                return Box::pin(std::future::ready(Err(MessageError::key_missing())));
            }
            Ok(None) => {
                request(Door::Message, Outcome::Untracked);
                return untracked(inner.call(message));
            }
            Err(e) => {
                request(Door::Message, Outcome::KeyInvalid);
                tracing::warn!(target: "tower_idempotency::message", topic = message.topic(), reason = %e, "message with an invalid idempotency key refused");
                return Box::pin(std::future::ready(Err(MessageError::key_invalid(e))));
            }
        };
        let store_key = config.store_key(shared.engine.secret(), &key);
        let fingerprint = fingerprint(&message);
        let span = crate::trace::door_span(shared.engine.span_level(), Door::Message.as_str());
        crate::trace::record_key(&span, &store_key);

        let fut = async move {
            let engine = &shared.engine;
            let config = &shared.config;
            let wait = config.wait_in_flight;
            let begun = if config.skip_in_flight || wait.is_zero() {
                engine.begin(store_key, fingerprint).await
            } else {
                // A day is forever here, and a bound that large cannot overflow the clock.
                let wait = wait.min(Duration::from_secs(24 * 3600));
                engine.begin_waiting(store_key, fingerprint, wait).await
            };
            let ticket = match begun {
                Err(e) => {
                    request(Door::Message, Outcome::of_store_error(&e));
                    tracing::warn!(target: "tower_idempotency::message", key = ?store_key, error = %e, "idempotency store failed on claim; the message is not handled");
                    return Err(MessageError::store(e));
                }
                Ok(Begin::Run(ticket)) => {
                    request(Door::Message, Outcome::Ran);
                    ticket
                }
                Ok(Begin::Replayed(record)) => {
                    let replayed = replay(record, &*shared.codec);
                    let outcome = match replayed {
                        Ok(_) => Outcome::Replayed,
                        Err(_) => Outcome::RecordInvalid,
                    };
                    request(Door::Message, outcome);
                    return replayed;
                }
                Ok(Begin::InFlight) => {
                    request(Door::Message, Outcome::InFlight);
                    if config.skip_in_flight {
                        return Ok(Handled::Skipped);
                    }
                    // Past the wait, or with no wait: refused for a later redelivery.
                    return Err(MessageError::in_flight(
                        engine.in_flight_retry_after(&store_key).await,
                    ));
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
            let run_to_completion = config.run_to_completion;
            let drain = shared.drain.clone();
            let work = run_claimed(shared, inner, message, ticket);
            if run_to_completion {
                // Finishes (and records) on a task of its own if this future is dropped first.
                drain.detachable(work).await
            } else {
                drain.counted(work).await
            }
        };
        Box::pin(fut.instrument(span))
    }
}

/// The claimed part of a delivery: the handler under lease renewal, then the verdict. Owns
/// everything it uses, so it can finish on a task of its own when the caller goes away.
async fn run_claimed<S, M, St, K, C, F>(
    shared: Arc<Shared<St, K, C, F>>,
    mut inner: S,
    message: M,
    ticket: Ticket,
) -> Result<Handled<S::Response>, MessageError<S::Error>>
where
    S: Service<M>,
    St: Store,
    C: Codec<S::Response>,
    F: Classify<Result<S::Response, S::Error>>,
{
    let engine = &shared.engine;
    // The handler's future runs with the delivery's steps as `Steps::current()`.
    let steps = engine.steps(&ticket);
    let result = engine.run(&ticket, steps.scope(inner.call(message))).await;
    // The steps found the key bound to another message, or a step record that fails
    // validation: refused as at the claim, whatever the handler returned. The claim is
    // released, never recorded, so the first message's steps stay for its redelivery.
    if let Some(found) = ticket.claim().found() {
        drop(result);
        let key = *ticket.key();
        engine.settle(ticket, Settle::Release, TALLY).await;
        return Err(match found {
            Found::KeyReused => {
                tracing::warn!(target: "tower_idempotency::message", key = ?key, "idempotency key's steps belong to a different message; refused");
                MessageError::key_reused()
            }
            Found::RecordInvalid => {
                tracing::error!(target: "tower_idempotency::message", key = ?key, "message step record failed validation; refused");
                MessageError::record_invalid(None)
            }
        });
    }
    // The result's verdict, then the settled verdict's answer.
    let hold = engine.lease();
    let verdict = shared.classify.classify(&result);
    let recorded;
    let settle = match verdict {
        Verdict::Record => {
            let body = encode(engine, &*shared.codec, ticket.key(), result.as_ref().ok());
            recorded = Recorded::of_door(DOOR_VALUE, body);
            Settle::Record(Recording::Response(&recorded))
        }
        Verdict::Fail => Settle::Fail,
        Verdict::Hold => Settle::Hold(hold),
        // `Release`, and any verdict added later: a redelivery runs again.
        _ => Settle::Release,
    };
    let verdict = settle.verdict();
    engine.settle(ticket, settle, TALLY).await;
    match (verdict, result) {
        (Verdict::Record, Ok(r)) => Ok(Handled::Recorded(r)),
        (Verdict::Fail, Ok(r)) => Ok(Handled::Failed(r)),
        (Verdict::Hold, Ok(r)) => Ok(Handled::Held(r)),
        (_, Ok(r)) => Ok(Handled::Released(r)),
        (Verdict::Hold, Err(e)) => Err(MessageError::handler(e, verdict, Some(hold))),
        (_, Err(e)) => Err(MessageError::handler(e, verdict, None)),
    }
}

/// Where this door counts how its keys ended.
const TALLY: Tally<'static> = Tally::Door(Door::Message);

/// The bytes of `result` to record, when the codec keeps it and it fits.
fn encode<St: Store, R, C: Codec<R>>(
    engine: &Engine<St>,
    codec: &C,
    store_key: &StoreKey,
    result: Option<&R>,
) -> Option<Bytes> {
    match result {
        Some(r) if codec.keeps_values() => match codec.encode(r) {
            // A record must read back within the engine's limit, or every redelivery of work
            // that succeeded is refused: keep the fact that it completed, as the HTTP layer
            // keeps status and headers of a body over the limit.
            Ok(b) if b.len() > engine.max_record_body() => {
                tracing::warn!(target: "tower_idempotency::message", key = ?store_key, limit = engine.max_record_body(), "result over the record limit; recorded without it, so a repeat is acknowledged without a result");
                None
            }
            Ok(b) => Some(b),
            Err(e) => {
                tracing::warn!(target: "tower_idempotency::message", key = ?store_key, error = %e, "message result does not encode; recorded without it");
                None
            }
        },
        _ => None,
    }
}

fn untracked<Fut, R, E>(fut: Fut) -> BoxFuture<'static, Result<Handled<R>, MessageError<E>>>
where
    Fut: Future<Output = Result<R, E>> + Send + 'static,
{
    Box::pin(async move {
        fut.await
            .map(Handled::Untracked)
            .map_err(|e| MessageError::handler(e, Verdict::Release, None))
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

fn replay<R, E, C: Codec<R>>(record: Recorded, codec: &C) -> Result<Handled<R>, MessageError<E>> {
    if !record.is_of_door(DOOR_VALUE) {
        tracing::error!(target: "tower_idempotency::message", "the record under this key was not written by the message door; not used");
        return Err(MessageError::record_invalid(None));
    }
    if !codec.keeps_values() {
        return Ok(Handled::Replayed(None));
    }
    Ok(Handled::Replayed(record.body.and_then(|b| {
        codec
            .decode(b)
            .inspect_err(|e| {
                tracing::warn!(target: "tower_idempotency::message", error = %e, "the recorded result does not decode with this codec; the repeat is acknowledged without it");
            })
            .ok()
    })))
}
