//! The door itself: [`SendOnceLayer`] and the [`SendOnce`] service.

use super::classify::{Classify, DefaultClassifier, Verdict};
use super::delivery::{Delivery, OutboundError, Unknown};
use super::identify::{Identify, Identity};
use super::receipt::{Receipt, ReceiptError};
use crate::engine::{Begin, Engine, RecordError, RecordedResponse, Scope, Ticket};
use crate::metrics::{self, Outcome, Settled};
use crate::scope::StoreKey;
use crate::store::Store;
use bytes::Bytes;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use std::{fmt, mem};
use tower_layer::Layer;
use tower_service::Service;

/// The default namespace of the door's keys (distinct from the HTTP layer's, so one store
/// serves both).
pub const DEFAULT_NAMESPACE: &str = "outbound";

/// The tag of this door's records (a record of another door is never replayed).
const DOOR_NAME: &[u8] = b"outbound";

/// A boxed, sendable future (the door's futures, as an honest first version).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The settings every clone of a door shares.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    namespace: Box<str>,
    scope: Scope,
    hold: Option<Duration>,
}

/// Everything but the inner service: what a send needs after it leaves `call`.
pub(crate) struct Door<St, I, C> {
    pub(crate) engine: Engine<St>,
    pub(crate) identify: I,
    pub(crate) classify: C,
    settings: Arc<Settings>,
}

impl<St, I: Clone, C: Clone> Clone for Door<St, I, C> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            identify: self.identify.clone(),
            classify: self.classify.clone(),
            settings: Arc::clone(&self.settings),
        }
    }
}

impl<St, I, C> fmt::Debug for Door<St, I, C> {
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
/// Built from an [`Engine`] (the store, lease and retention), an [`Identify`] (the request's
/// key and fingerprint) and a [`Classify`] (sent, failed or unknown; [`DefaultClassifier`]
/// unless given). See the [module docs](super) for the outcomes.
#[must_use]
pub struct SendOnceLayer<St, I, C = DefaultClassifier> {
    door: Door<St, I, C>,
}

impl<St, I: Clone, C: Clone> Clone for SendOnceLayer<St, I, C> {
    fn clone(&self) -> Self {
        Self {
            door: self.door.clone(),
        }
    }
}

impl<St, I, C> fmt::Debug for SendOnceLayer<St, I, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.door.fmt(f)
    }
}

impl<St: Store, I> SendOnceLayer<St, I, DefaultClassifier> {
    /// A layer over `engine` that reads each request's key with `identify`.
    pub fn new(engine: Engine<St>, identify: I) -> Self {
        Self {
            door: Door {
                engine,
                identify,
                classify: DefaultClassifier,
                settings: Arc::new(Settings {
                    namespace: DEFAULT_NAMESPACE.into(),
                    scope: Scope::anonymous(),
                    hold: None,
                }),
            },
        }
    }
}

impl<St: Store, I, C> SendOnceLayer<St, I, C> {
    /// Reads each request's key with `identify` instead.
    pub fn identify<I2>(self, identify: I2) -> SendOnceLayer<St, I2, C> {
        SendOnceLayer {
            door: Door {
                engine: self.door.engine,
                identify,
                classify: self.door.classify,
                settings: self.door.settings,
            },
        }
    }

    /// Decides sent / failed / unknown with `classify` instead.
    pub fn classify<C2>(self, classify: C2) -> SendOnceLayer<St, I, C2> {
        SendOnceLayer {
            door: Door {
                engine: self.door.engine,
                identify: self.door.identify,
                classify,
                settings: self.door.settings,
            },
        }
    }

    /// The namespace of the keys (default `"outbound"`): give each provider its own when one
    /// key may be sent to several (the same job's key to the mailer and to the payment API).
    pub fn namespace(mut self, namespace: &str) -> Self {
        self.settings_mut().namespace = namespace.into();
        self
    }

    /// The scope of the keys (default: anonymous, one scope shared by every sender on the
    /// store): a tenant or principal when keys come from callers who must not share them.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.settings_mut().scope = scope;
        self
    }

    /// How long a key whose delivery is unknown stays held, from the moment that was known
    /// (default: the engine's lease): the door renews its claim to this once, with the store's
    /// `renew`. A retry within it is answered [`Delivery::InFlight`] and sends nothing; one
    /// after it sends again. A send whose future was dropped is held for this too when it is
    /// longer than the lease (a task is spawned to renew the claim; without a Tokio runtime
    /// the lease alone holds it).
    pub fn hold(mut self, hold: Duration) -> Self {
        self.settings_mut().hold = Some(hold);
        self
    }

    fn settings_mut(&mut self) -> &mut Settings {
        Arc::make_mut(&mut self.door.settings)
    }
}

impl<S, St, I: Clone, C: Clone> Layer<S> for SendOnceLayer<St, I, C> {
    type Service = SendOnce<S, St, I, C>;

    fn layer(&self, inner: S) -> Self::Service {
        SendOnce {
            inner,
            door: self.door.clone(),
        }
    }
}

/// The service made by [`SendOnceLayer`]: answers a repeat from its receipt, sends the rest.
pub struct SendOnce<S, St, I, C = DefaultClassifier> {
    inner: S,
    pub(crate) door: Door<St, I, C>,
}

impl<S: Clone, St, I: Clone, C: Clone> Clone for SendOnce<S, St, I, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            door: self.door.clone(),
        }
    }
}

impl<S: fmt::Debug, St, I, C> fmt::Debug for SendOnce<S, St, I, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendOnce")
            .field("inner", &self.inner)
            .field("door", &self.door)
            .finish()
    }
}

impl<S, St, I, C> SendOnce<S, St, I, C> {
    /// The door's state and its inner service, for the batch path.
    pub(crate) fn parts(&mut self) -> (&Door<St, I, C>, &mut S) {
        (&self.door, &mut self.inner)
    }

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

impl<St: Store, I, C> Door<St, I, C> {
    pub(crate) fn store_key(&self, identity: &Identity) -> StoreKey {
        StoreKey::derive(
            &self.settings.namespace,
            &self.settings.scope,
            identity.key(),
        )
    }

    /// Claims the key, or answers from what holds it.
    pub(crate) async fn begin<R: Receipt, E>(&self, identity: &Identity) -> Start<R, E> {
        let key = self.store_key(identity);
        let (outcome, answer) = match self.engine.begin(key, *identity.fingerprint()).await {
            Ok(Begin::Run(ticket)) => {
                metrics::request(metrics::Door::Outbound, Outcome::Fresh);
                return Start::Send(ticket);
            }
            Ok(Begin::InFlight) => (Outcome::InFlight, Ok(Delivery::InFlight)),
            Ok(Begin::KeyReused) => (Outcome::KeyReused, Err(OutboundError::KeyReused)),
            Ok(Begin::Replay(record)) => match read_receipt(record) {
                Ok(receipt) => (Outcome::Replayed, Ok(Delivery::Replayed(receipt))),
                Err(e) => (Outcome::RecordInvalid, Err(OutboundError::RecordInvalid(e))),
            },
            Ok(Begin::Invalid(e)) => (Outcome::RecordInvalid, Err(OutboundError::RecordInvalid(e))),
            Err(e) => {
                tracing::warn!(error = %e, "outbound idempotency claim failed; nothing sent");
                (Outcome::of_store_error(&e), Err(OutboundError::Store(e)))
            }
        };
        metrics::request(metrics::Door::Outbound, outcome);
        if let Err(OutboundError::RecordInvalid(e)) = &answer {
            tracing::warn!(key = ?key, reason = e.reason(), "outbound receipt is invalid; not replayed, nothing sent");
        }
        Start::Answered(answer)
    }

    /// The hold time of a key whose delivery is unknown.
    fn hold_time(&self) -> Duration {
        self.settings.hold.unwrap_or_else(|| self.engine.lease())
    }

    /// Keeps the key of an unknown delivery for the hold time.
    pub(crate) async fn hold(&self, ticket: Ticket) {
        let key = *ticket.key();
        metrics::settled(metrics::Door::Outbound, Settled::Held);
        match self.engine.hold(ticket, self.hold_time()).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(key = ?key, "outbound key lost before it could be held; a repeat may send again")
            }
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "outbound key could not be held; it stays held until its lease ends")
            }
        }
    }

    /// Records, releases or holds the key after the send, by the classifier's verdict.
    pub(crate) async fn settle<R, E>(
        &self,
        ticket: Ticket,
        result: Result<R, E>,
    ) -> Result<Delivery<R, E>, OutboundError<E>>
    where
        R: Receipt,
        C: Classify<R, E>,
    {
        let verdict = self.classify.classify(result.as_ref());
        match (verdict, result) {
            (Verdict::Sent, Ok(response)) => {
                let receipt = response.to_bytes();
                self.complete(ticket, receipt).await;
                Ok(Delivery::Sent(response))
            }
            (Verdict::Failed { retryable }, result) => {
                let key = *ticket.key();
                let released = self.engine.release(ticket).await;
                metrics::settled(metrics::Door::Outbound, Settled::of_release(&released));
                if let Err(e) = released {
                    tracing::warn!(key = ?key, error = %e, "outbound key not released; a retry waits for its lease");
                }
                match result {
                    Ok(response) => Ok(Delivery::Rejected {
                        response,
                        retryable,
                    }),
                    Err(error) => Err(OutboundError::Failed { error, retryable }),
                }
            }
            // An error is never a receipt: a classifier that calls one sent is read as unknown.
            (Verdict::Sent | Verdict::Unknown, result) => {
                self.hold(ticket).await;
                Ok(Delivery::Unknown(match result {
                    Ok(r) => Unknown::Response(r),
                    Err(e) => Unknown::Error(e),
                }))
            }
        }
    }

    /// Records the receipt; a store that fails is logged, the receipt still returned.
    pub(crate) async fn complete(&self, ticket: Ticket, receipt: Result<Bytes, ReceiptError>) {
        let key = *ticket.key();
        let bytes = match receipt {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "outbound receipt cannot be encoded; the key is held instead");
                return self.hold(ticket).await;
            }
        };
        let record = RecordedResponse::of_door(DOOR_NAME, Some(bytes));
        let done = self.engine.complete(ticket, &record).await;
        metrics::settled(metrics::Door::Outbound, Settled::of_complete(&done));
        match done {
            Ok(true) => {}
            Ok(false) => {
                tracing::warn!(key = ?key, "outbound lease lapsed before the receipt was recorded; another send holds the key")
            }
            Err(e) => {
                tracing::warn!(key = ?key, error = %e, "outbound receipt not recorded (the message went); a repeat sends again once the lease ends")
            }
        }
    }

    /// Sends a request without a key: no claim, no record.
    pub(crate) fn unkeyed<R, E>(
        &self,
        result: Result<R, E>,
    ) -> Result<Delivery<R, E>, OutboundError<E>>
    where
        C: Classify<R, E>,
    {
        metrics::request(metrics::Door::Outbound, Outcome::Passthrough);
        match (self.classify.classify(result.as_ref()), result) {
            (Verdict::Sent, Ok(r)) => Ok(Delivery::Sent(r)),
            (Verdict::Failed { retryable }, Ok(response)) => Ok(Delivery::Rejected {
                response,
                retryable,
            }),
            (Verdict::Failed { retryable }, Err(error)) => {
                Err(OutboundError::Failed { error, retryable })
            }
            (_, Ok(r)) => Ok(Delivery::Unknown(Unknown::Response(r))),
            (_, Err(e)) => Ok(Delivery::Unknown(Unknown::Error(e))),
        }
    }
}

/// The receipt in a record this door wrote; any other record is invalid.
pub(crate) fn read_receipt<R: Receipt>(record: RecordedResponse) -> Result<R, RecordError> {
    let ours = record.is_of_door(DOOR_NAME);
    match record.body {
        Some(body) if ours => {
            R::from_bytes(body).map_err(|_| RecordError::new("the stored receipt does not decode"))
        }
        _ => Err(RecordError::new("a record of another door")),
    }
}

/// Holds the key of a send whose future was dropped after the send began: the message may
/// have gone. Disarmed once the send's result is in hand.
struct HoldOnDrop<St: Store, I, C> {
    armed: Option<(Door<St, I, C>, Ticket)>,
}

impl<St: Store, I, C> HoldOnDrop<St, I, C> {
    fn ticket(&self) -> &Ticket {
        &self.armed.as_ref().expect("armed until disarmed").1
    }

    fn disarm(mut self) -> Ticket {
        self.armed.take().expect("armed until disarmed").1
    }
}

impl<St: Store, I, C> Drop for HoldOnDrop<St, I, C> {
    fn drop(&mut self) {
        let Some((door, ticket)) = self.armed.take() else {
            return;
        };
        tracing::info!(key = ?ticket.key(), "outbound send dropped after it began; its delivery is unknown, the key is held");
        metrics::settled(metrics::Door::Outbound, Settled::Held);
        // The lease already holds the key; a longer hold needs one more store call.
        if door.hold_time() > door.engine.lease()
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let (engine, hold) = (door.engine.clone(), door.hold_time());
            rt.spawn(async move {
                let _ = engine.hold(ticket, hold).await;
            });
        }
    }
}

impl<S, St, I, C, Req> Service<Req> for SendOnce<S, St, I, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: Receipt + Send + 'static,
    S::Error: Send + 'static,
    St: Store,
    I: Identify<Req> + Clone + Send + Sync + 'static,
    C: Classify<S::Response, S::Error> + Clone + Send + Sync + 'static,
    Req: Send + 'static,
{
    type Response = Delivery<S::Response, S::Error>;
    type Error = OutboundError<S::Error>;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Not ready is before any claim or send: nothing went.
        self.inner
            .poll_ready(cx)
            .map_err(|error| OutboundError::Failed {
                error,
                retryable: true,
            })
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let identity = self.door.identify.identify(&req);
        // The service polled ready goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let mut inner = mem::replace(&mut self.inner, clone);
        let door = self.door.clone();
        Box::pin(async move {
            let identity = match identity {
                Err(e) => return Err(OutboundError::KeyInvalid(e)),
                Ok(None) => return door.unkeyed(inner.call(req).await),
                Ok(Some(identity)) => identity,
            };
            let ticket = match door.begin(&identity).await {
                Start::Send(ticket) => ticket,
                Start::Answered(answer) => return answer,
            };
            let guard = HoldOnDrop {
                armed: Some((door.clone(), ticket)),
            };
            let result = door.engine.run(guard.ticket(), inner.call(req)).await;
            door.settle(guard.disarm(), result).await
        })
    }
}
