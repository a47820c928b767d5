//! The door itself: [`SendOnceLayer`] and the [`SendOnce`] service.

use super::classify::DefaultClassifier;
use super::delivery::{Delivery, OutboundError, Unknown};
use super::identify::{Identify, Identity};
use crate::engine::settle::{Recording, Settle, Tally};
use crate::engine::{
    Begin, BoxFuture, Classify, Codec, Engine, Raw, RecordError, Recorded, Scope, Ticket, Verdict,
};
use crate::metrics::{self, Outcome, Settled};
use crate::store::Store;
use crate::store::StoreKey;
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use std::{fmt, mem};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

/// The generic door's key namespace. Each adapter has its own.
pub(crate) const NAMESPACE: &str = "outbound";

/// How long a key of unknown delivery stays held: longer than a job's retries usually take.
const HOLD: Duration = Duration::from_secs(10 * 60);

/// The longest hold (and in-flight wait) a setter takes; longer values are cut to it.
const MAX_HOLD: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// The tag of this door's receipts (a record of another door is never replayed).
const DOOR_NAME: &[u8] = b"outbound";

/// The settings every clone of a door shares.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    namespace: Box<str>,
    scope: Scope,
    hold: Duration,
    wait: Duration,
    require_key: bool,
}

/// Everything but the inner service: what a send needs after it leaves `call`.
pub(crate) struct Door<St, I, C, K> {
    pub(crate) engine: Engine<St>,
    pub(crate) identify: I,
    pub(crate) classify: C,
    codec: K,
    settings: Arc<Settings>,
}

impl<St, I: Clone, C: Clone, K: Clone> Clone for Door<St, I, C, K> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            identify: self.identify.clone(),
            classify: self.classify.clone(),
            codec: self.codec.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<St, I, C, K> fmt::Debug for Door<St, I, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendOnce")
            .field("engine", &self.engine)
            .field("namespace", &self.settings.namespace)
            .field("scope", &self.settings.scope)
            .field("hold", &self.settings.hold)
            .finish_non_exhaustive()
    }
}

/// Wraps an outbound service so that a request sent twice under one key goes once.
///
/// Give it an [`Engine`] or a store, and an [`Identify`] that reads each request's key and
/// fingerprint. A [`Classify`] judges each send; [`DefaultClassifier`] unless set. A
/// [`Codec`] keeps the receipt; [`Raw`] unless set. The [module docs](super) list the
/// outcomes.
#[must_use]
pub struct SendOnceLayer<St, I, C = DefaultClassifier, K = Raw> {
    door: Door<St, I, C, K>,
}

impl<St, I: Clone, C: Clone, K: Clone> Clone for SendOnceLayer<St, I, C, K> {
    fn clone(&self) -> Self {
        Self {
            door: self.door.clone(),
        }
    }
}

impl<St, I, C, K> fmt::Debug for SendOnceLayer<St, I, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.door.fmt(f)
    }
}

impl<St: Store, I> SendOnceLayer<St, I> {
    /// A layer over `engine` that reads each request's key with `identify`.
    pub fn new(engine: impl Into<Engine<St>>, identify: I) -> Self {
        Self {
            door: Door {
                engine: engine.into(),
                identify,
                classify: DefaultClassifier,
                codec: Raw,
                settings: Arc::new(Settings {
                    namespace: NAMESPACE.into(),
                    scope: Scope::anonymous(),
                    hold: HOLD,
                    wait: Duration::ZERO,
                    require_key: false,
                }),
            },
        }
    }
}

impl<St: Store, I, C, K> SendOnceLayer<St, I, C, K> {
    /// Reads each request's key with `identify` instead.
    pub fn identify<I2>(self, identify: I2) -> SendOnceLayer<St, I2, C, K> {
        let Door {
            engine,
            classify,
            codec,
            settings,
            ..
        } = self.door;
        SendOnceLayer {
            door: Door {
                engine,
                identify,
                classify,
                codec,
                settings,
            },
        }
    }

    /// Judges each send with `classify`: an [`engine::Classify`](Classify) of the inner
    /// service's `Result`.
    ///
    /// | verdict | on a response | on an error | the key |
    /// | --- | --- | --- | --- |
    /// | `Record` | [`Delivery::Recorded`] | [`Delivery::Held`] | completed; held on an error |
    /// | `Release` | [`Delivery::Released`] | [`OutboundError`], retryable | released |
    /// | `Fail` | [`Delivery::Failed`] | [`OutboundError`], not retryable | released |
    /// | `Hold` | [`Delivery::Held`] | [`Delivery::Held`] | held for the hold time |
    ///
    /// An error is never a receipt: a `Record` on an error holds the key. Default:
    /// [`DefaultClassifier`].
    pub fn classify<C2>(self, classify: C2) -> SendOnceLayer<St, I, C2, K> {
        let Door {
            engine,
            identify,
            codec,
            settings,
            ..
        } = self.door;
        SendOnceLayer {
            door: Door {
                engine,
                identify,
                classify,
                codec,
                settings,
            },
        }
    }

    /// Keeps each receipt with `codec`. Default: [`Raw`], for bytes and text.
    ///
    /// Use [`Json`](crate::engine::Json) for a receipt of any serde type. The codec must
    /// keep values: with [`Discard`](crate::engine::Discard), a repeat finds no receipt and
    /// fails [`RecordInvalid`](super::OutboundErrorKind::RecordInvalid).
    pub fn codec<K2>(self, codec: K2) -> SendOnceLayer<St, I, C, K2> {
        let Door {
            engine,
            identify,
            classify,
            settings,
            ..
        } = self.door;
        SendOnceLayer {
            door: Door {
                engine,
                identify,
                classify,
                codec,
                settings,
            },
        }
    }

    /// The namespace of the keys. It replaces the default.
    ///
    /// Give each provider its own when one key may go to several: the same job's key to the
    /// mailer and to the payment API. Default: `outbound`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.settings_mut().namespace = namespace.into().into_boxed_str();
        self
    }

    /// The scope of the keys: a tenant or principal when callers must not share keys.
    /// Default: anonymous, one scope for every sender on the store.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.settings_mut().scope = scope;
        self
    }

    /// How long a key of unknown delivery stays held, from when that was known.
    ///
    /// The hold is the send's claim, renewed for the hold time: a repeat within it is
    /// answered [`Delivery::InFlight`] and sends nothing, one after it sends again. A crash
    /// before the hold is written leaves the key to its lease; a hold written outlives its
    /// process. A send whose future was dropped after
    /// it began is held too. A task renews that claim; without a Tokio runtime the lease
    /// alone holds the key.
    ///
    /// Default: 10 minutes. At least 1 ms, at most 30 days.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.settings_mut().hold = hold.clamp(Duration::from_millis(1), MAX_HOLD);
        self
    }

    /// How long a repeat waits for a running send of the same request to end.
    ///
    /// Within the bound the repeat gets what the first send left. That is its receipt
    /// ([`Delivery::Replayed`]), or a send of its own when the first released the key. Past
    /// the bound: [`Delivery::InFlight`]. A held key is its send's claim, kept for the hold
    /// time, so a repeat of one waits the whole bound too, then is answered in flight.
    /// The memory store wakes the waiter when the key settles. Other stores are asked again
    /// with backoff, 10 ms doubling to 250 ms. Keep it short: a few seconds.
    ///
    /// Default: zero, [`Delivery::InFlight`] at once. At most 30 days.
    pub fn wait_in_flight(mut self, bound: Duration) -> Self {
        self.settings_mut().wait = bound.min(MAX_HOLD);
        self
    }

    /// Whether a request without a key is refused.
    ///
    /// On, it fails [`KeyMissing`](super::OutboundErrorKind::KeyMissing) and nothing is
    /// sent. Off, it is sent as it is and answered [`Delivery::Untracked`].
    /// Default: off.
    pub fn require_key(mut self, on: bool) -> Self {
        self.settings_mut().require_key = on;
        self
    }

    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.door.settings)
    }
}

impl<S, St, I: Clone, C: Clone, K: Clone> Layer<S> for SendOnceLayer<St, I, C, K> {
    type Service = SendOnce<S, St, I, C, K>;

    fn layer(&self, inner: S) -> Self::Service {
        SendOnce {
            inner,
            door: self.door.clone(),
        }
    }
}

/// The service made by [`SendOnceLayer`]: answers a repeat from its receipt, sends the rest.
pub struct SendOnce<S, St, I, C = DefaultClassifier, K = Raw> {
    inner: S,
    door: Door<St, I, C, K>,
}

impl<S: Clone, St, I: Clone, C: Clone, K: Clone> Clone for SendOnce<S, St, I, C, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            door: self.door.clone(),
        }
    }
}

impl<S: fmt::Debug, St, I, C, K> fmt::Debug for SendOnce<S, St, I, C, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendOnce")
            .field("inner", &self.inner)
            .field("door", &self.door)
            .finish()
    }
}

impl<S, St, I, C, K> SendOnce<S, St, I, C, K> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }

    /// The engine the door claims keys with.
    pub fn engine(&self) -> &Engine<St> {
        &self.door.engine
    }
}

/// What [`Door::begin`] decided for a keyed request.
pub(crate) enum Start<R, E> {
    /// Send it; the ticket holds the key.
    Send(Ticket),
    /// Answered without sending.
    Answered(Result<Delivery<R, E>, OutboundError<E>>),
}

impl<St: Store, I, C, K> Door<St, I, C, K> {
    pub(crate) fn store_key(&self, identity: &Identity) -> StoreKey {
        self.engine.store_key(
            &self.settings.namespace,
            &self.settings.scope,
            identity.key(),
        )
    }

    /// Whether a request without a key is refused.
    pub(crate) fn requires_key(&self) -> bool {
        self.settings.require_key
    }

    /// Claims the key (waiting for a running send, when the door is told to), or answers
    /// from what holds it.
    pub(crate) async fn begin<R, E>(&self, identity: &Identity) -> Start<R, E>
    where
        K: Codec<R>,
    {
        let key = self.store_key(identity);
        crate::trace::record_key(&tracing::Span::current(), &key);
        let fingerprint = *identity.fingerprint();
        let begun = if self.settings.wait.is_zero() {
            self.engine.begin(key, fingerprint).await
        } else {
            self.engine
                .begin_waiting(key, fingerprint, self.settings.wait)
                .await
        };
        let (outcome, answer) = match begun {
            Ok(Begin::Run(ticket)) => {
                metrics::request(metrics::Door::Outbound, Outcome::Ran);
                return Start::Send(ticket);
            }
            Ok(Begin::InFlight) => (Outcome::InFlight, Ok(Delivery::InFlight)),
            Ok(Begin::KeyReused) => (Outcome::KeyReused, Err(OutboundError::key_reused())),
            Ok(Begin::Replayed(record)) => match read_record(&self.codec, record) {
                Ok(receipt) => (Outcome::Replayed, Ok(Delivery::Replayed(receipt))),
                Err(e) => (Outcome::RecordInvalid, Err(invalid(&key, e))),
            },
            Ok(Begin::RecordInvalid(e)) => (Outcome::RecordInvalid, Err(invalid(&key, e))),
            Err(e) => {
                tracing::warn!(error = %e, "outbound idempotency claim failed; nothing sent");
                (Outcome::of_store_error(&e), Err(OutboundError::store(e)))
            }
        };
        metrics::request(metrics::Door::Outbound, outcome);
        Start::Answered(answer)
    }

    /// The store operations of this door, on their own (for a task that outlives the caller).
    pub(crate) fn keys(&self) -> Keys<St> {
        Keys {
            engine: self.engine.clone(),
            hold: self.settings.hold,
        }
    }

    /// The verdict on a send's result, with the receipt to record under `Record`. An error is
    /// never a receipt: a classifier that records one is read as a hold. A `Record` without a
    /// receipt (one that cannot be recorded) is answered as sent, and its key held: the
    /// message went, a repeat must not send it again.
    pub(crate) fn judge<R, E>(
        &self,
        key: &StoreKey,
        result: &Result<R, E>,
    ) -> (Verdict, Option<Bytes>)
    where
        C: Classify<Result<R, E>>,
        K: Codec<R>,
    {
        match (self.classify.classify(result), result) {
            (Verdict::Record, Ok(response)) => (Verdict::Record, self.receipt(key, response)),
            (Verdict::Record | Verdict::Hold, _) => (Verdict::Hold, None),
            (Verdict::Fail, _) => (Verdict::Fail, None),
            // `Release`, and any verdict added later: nothing went.
            _ => (Verdict::Release, None),
        }
    }

    /// The receipt to record: whole when the engine's record limit takes it, else its fitted
    /// form, else none.
    fn receipt<R>(&self, key: &StoreKey, response: &R) -> Option<Bytes>
    where
        K: Codec<R>,
    {
        let max = self.engine.max_record_body();
        match self.codec.encode(response) {
            Ok(bytes) if bytes.len() <= max => Some(bytes),
            Ok(bytes) => match self.codec.encode_fitted(response) {
                Some(fitted) if fitted.len() <= max => {
                    tracing::warn!(key = ?key, len = bytes.len(), max, "outbound receipt over the record limit; recorded without its body");
                    Some(fitted)
                }
                _ => {
                    tracing::warn!(key = ?key, len = bytes.len(), max, "outbound receipt over the record limit; the key is held instead");
                    None
                }
            },
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "outbound receipt cannot be encoded; the key is held instead");
                None
            }
        }
    }

    /// Settles the key after the send by its verdict, and answers. The store operation runs
    /// on a task of its own (when there is a Tokio runtime), so a caller that gives up
    /// meanwhile (an outer timeout) does not cut it short.
    pub(crate) fn settle<R, E>(
        &self,
        ticket: Ticket,
        result: Result<R, E>,
    ) -> impl Future<Output = Result<Delivery<R, E>, OutboundError<E>>> + use<R, E, St, I, C, K>
    where
        C: Classify<Result<R, E>>,
        K: Codec<R>,
    {
        let (verdict, receipt) = self.judge(ticket.key(), &result);
        let finished = self.keys().finish_detached(ticket, verdict, receipt);
        let answer = answer(verdict, result, Delivery::Recorded);
        async move {
            finished.await;
            answer
        }
    }

    /// Sends a request without a key: no claim, no record.
    pub(crate) fn unkeyed<R, E>(
        &self,
        result: Result<R, E>,
    ) -> Result<Delivery<R, E>, OutboundError<E>>
    where
        C: Classify<Result<R, E>>,
    {
        metrics::request(metrics::Door::Outbound, Outcome::Untracked);
        let verdict = match (self.classify.classify(&result), &result) {
            (Verdict::Record, Err(_)) => Verdict::Hold,
            (v, _) => v,
        };
        answer(verdict, result, Delivery::Untracked)
    }
}

/// The caller's answer for the verdict a send was settled with. `recorded` names the
/// answer of a `Record`: the receipt kept, or nothing claimed for a request without a key.
fn answer<R, E>(
    verdict: Verdict,
    result: Result<R, E>,
    recorded: fn(R) -> Delivery<R, E>,
) -> Result<Delivery<R, E>, OutboundError<E>> {
    match (verdict, result) {
        (Verdict::Record, Ok(r)) => Ok(recorded(r)),
        (Verdict::Fail, Ok(r)) => Ok(Delivery::Failed(r)),
        (Verdict::Fail, Err(error)) => Err(OutboundError::failed(error, false)),
        (Verdict::Hold, Ok(r)) => Ok(Delivery::Held(Unknown::Response(r))),
        // An error is never a receipt: a `Record` of one holds.
        (Verdict::Hold | Verdict::Record, Err(e)) => Ok(Delivery::Held(Unknown::Error(e))),
        (_, Ok(r)) => Ok(Delivery::Released(r)),
        (_, Err(error)) => Err(OutboundError::failed(error, true)),
    }
}

/// A record that is not a receipt this door can read: logged, and the caller's error.
fn invalid<E>(key: &StoreKey, e: RecordError) -> OutboundError<E> {
    tracing::warn!(key = ?key, reason = e.reason(), "outbound receipt is invalid; not replayed, nothing sent");
    OutboundError::record_invalid(e)
}

/// Where a key's last operation runs.
enum Finish<St> {
    Task(tokio::task::JoinHandle<()>),
    // Boxed: the rare path (no runtime) should not size the common one.
    Inline(Box<(Keys<St>, Ticket, Verdict, Option<Bytes>)>),
}

/// Where this door counts how its keys ended.
const TALLY: Tally<'static> = Tally::Door(metrics::Door::Outbound);

/// The door's store operations after a send: what a task needs, without the door's other parts.
pub(crate) struct Keys<St> {
    engine: Engine<St>,
    hold: Duration,
}

impl<St: Store> Keys<St> {
    /// Settles the key on a task of its own when there is a Tokio runtime (so it ends even if
    /// the returned future is dropped), else in the returned future. Spawned at once: the
    /// caller may be dropped at its first wait.
    pub(crate) fn finish_detached(
        self,
        ticket: Ticket,
        verdict: Verdict,
        receipt: Option<Bytes>,
    ) -> impl Future<Output = ()> {
        let run = match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                // In the send's span: its record is a child of it, and its result named on it.
                let finish = async move { self.finish(ticket, verdict, receipt).await };
                Finish::Task(rt.spawn(finish.instrument(tracing::Span::current())))
            }
            Err(_) => Finish::Inline(Box::new((self, ticket, verdict, receipt))),
        };
        async move {
            match run {
                Finish::Task(handle) => {
                    let _ = handle.await;
                }
                Finish::Inline(inline) => {
                    let (keys, ticket, verdict, receipt) = *inline;
                    keys.finish(ticket, verdict, receipt).await;
                }
            }
        }
    }

    /// Records the receipt, holds the key for the hold time, or releases it. A hold keeps the
    /// claim: a repeat meanwhile is answered [`Delivery::InFlight`] and sends nothing. A store
    /// that fails is logged; the caller's answer stands.
    pub(crate) async fn finish(&self, ticket: Ticket, verdict: Verdict, receipt: Option<Bytes>) {
        let recorded;
        let settle = match (verdict, receipt) {
            (Verdict::Record, Some(receipt)) => {
                recorded = Recorded::of_door(DOOR_NAME, Some(receipt));
                Settle::Record(Recording::Response(&recorded))
            }
            (Verdict::Record | Verdict::Hold, _) => Settle::Hold(self.hold),
            (Verdict::Fail, _) => Settle::Fail,
            _ => Settle::Release,
        };
        self.engine.settle(ticket, settle, TALLY).await;
    }
}

/// The receipt in a record this door wrote; any other record is invalid.
pub(crate) fn read_record<R, K: Codec<R>>(codec: &K, record: Recorded) -> Result<R, RecordError> {
    let ours = record.is_of_door(DOOR_NAME);
    match record.body {
        Some(body) if ours => codec
            .decode(body)
            .map_err(|_| RecordError::new("the stored receipt does not decode")),
        _ => Err(RecordError::new("a record of another door")),
    }
}

/// Holds the key of a send whose future was dropped after the send began: the message may
/// have gone. Disarmed once the send's result is in hand (its last operation then runs on a task
/// of its own).
pub(crate) struct HoldOnDrop<St: Store> {
    armed: Option<(Keys<St>, Ticket)>,
}

impl<St: Store> HoldOnDrop<St> {
    pub(crate) fn new(keys: Keys<St>, ticket: Ticket) -> Self {
        Self {
            armed: Some((keys, ticket)),
        }
    }

    pub(crate) fn ticket(&self) -> &Ticket {
        &self.armed.as_ref().expect("armed until disarmed").1
    }

    pub(crate) fn disarm(mut self) -> Ticket {
        self.armed.take().expect("armed until disarmed").1
    }
}

impl<St: Store> Drop for HoldOnDrop<St> {
    fn drop(&mut self) {
        let Some((keys, ticket)) = self.armed.take() else {
            return;
        };
        tracing::info!(key = ?ticket.key(), "outbound send dropped after it began; its delivery is unknown, the key is held");
        // Without a runtime the lease alone holds the key.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { keys.finish(ticket, Verdict::Hold, None).await });
        } else {
            TALLY.count(Settled::Held);
        }
    }
}

impl<S, St, I, C, K, Req> Service<Req> for SendOnce<S, St, I, C, K>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    I: Identify<Req> + Clone + Send + Sync + 'static,
    C: Classify<Result<S::Response, S::Error>> + Clone,
    K: Codec<S::Response> + Clone,
    Req: Send + 'static,
{
    type Response = Delivery<S::Response, S::Error>;
    type Error = OutboundError<S::Error>;
    type Future = BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Not ready is before any claim or send: nothing went.
        self.inner
            .poll_ready(cx)
            .map_err(|error| OutboundError::failed(error, true))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let identity = self.door.identify.identify(&req);
        // The service polled ready goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        let door = self.door.clone();
        Box::pin(async move {
            let identity = match identity {
                Err(e) => return Err(OutboundError::key_invalid(e)),
                Ok(None) if door.requires_key() => return Err(OutboundError::key_missing()),
                Ok(None) => return door.unkeyed(inner.call(req).await),
                Ok(Some(identity)) => identity,
            };
            let span =
                crate::trace::door_span(door.engine.span_level(), metrics::Door::Outbound.as_str());
            let keyed = async move {
                let ticket = match door.begin(&identity).await {
                    Start::Send(ticket) => ticket,
                    Start::Answered(answer) => return answer,
                };
                let guard = HoldOnDrop::new(door.keys(), ticket);
                let result = door.engine.run(guard.ticket(), inner.call(req)).await;
                door.settle(guard.disarm(), result).await
            };
            keyed.instrument(span).await
        })
    }
}
