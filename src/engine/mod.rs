//! The state machine every door uses: claim → run (renewing the lease) → complete or release.
//!
//! ```
//! use std::time::Duration;
//! use tower_idempotency::{IdempotencyKey, MemoryStore};
//! use tower_idempotency::engine::{Begin, Engine, Fingerprint, Recorded, Scope};
//! use tower_idempotency::store::StoreKey;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let engine = Engine::builder(MemoryStore::new()).lease(Duration::from_secs(30)).build();
//! let key = StoreKey::derive("jobs", &Scope::principal("worker"), &IdempotencyKey::new("job-1").unwrap());
//! let fp = Fingerprint::builder().field(b"payload").finish();
//!
//! let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else { panic!("first run") };
//! let status = engine.run(&ticket, async { 200 }).await;
//! engine.complete(ticket, &Recorded::new(status, vec![], None)).await.unwrap();
//!
//! assert!(matches!(engine.begin(key, fp).await.unwrap(), Begin::Replayed(r) if r.status == 200));
//! # }
//! ```
//!
//! The engine compares fingerprints and decodes records, so every store behaves alike. It knows
//! nothing of HTTP: a door turns its request into a [`StoreKey`] and a [`Fingerprint`], asks
//! [`Engine::begin`] what to do, and reports the result with [`Engine::complete`] or
//! [`Engine::release`].

pub(crate) mod codec;
pub(crate) mod detach;
pub(crate) mod inspect;
pub(crate) mod key;
pub(crate) mod record;
pub(crate) mod scope;
pub(crate) mod secret;
pub(crate) mod settle;
pub(crate) mod steps;
pub(crate) mod verdict;

#[cfg(feature = "json")]
pub use crate::engine::codec::Json;
pub use crate::engine::codec::{BoxFuture, Codec, CodecError, CodecErrorKind, Discard, Raw};
pub use crate::engine::detach::Drain;
pub use crate::engine::inspect::KeyState;
pub use crate::engine::verdict::{Classify, Verdict};

pub use crate::engine::key::{KeyError, KeyErrorKind};
pub use crate::engine::record::{Field, RecordError, RecordErrorKind, RecordTimes, Recorded};
pub use crate::engine::scope::Scope;
pub use crate::engine::steps::{StepError, StepErrorKind, Steps};
pub use crate::store::fingerprint::{Fingerprint, FingerprintBuilder};

use crate::engine::key::IdempotencyKey;
use crate::engine::secret::Secret;
use crate::metrics::{Op, StoreTimer};
use crate::store::Record;
use crate::store::StoreKey;
use crate::store::{
    Claim, DEFAULT_MAX_RECORD_BODY, Forgotten, Store, StoreError, StoreErrorKind, Token,
};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

/// The default lease: how long a claim holds a key before another claimant may take it.
pub(crate) const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default retention of a completed record.
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// The default bound on one store operation. Longer than the built-in stores' own bounds at
/// their defaults (1 s per operation, 5 s to connect, and their retries), so it never fires
/// before them: it is for a store of one's own that never answers.
pub(crate) const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(30);
/// The level of the spans every door opens, as before it could be chosen.
pub(crate) const DEFAULT_SPAN_LEVEL: tracing::Level = tracing::Level::DEBUG;

/// [`Engine::store_key`] with the engine's secret.
pub(crate) fn store_key(
    secret: Option<&Secret>,
    namespace: &str,
    scope: &Scope,
    key: &IdempotencyKey,
) -> StoreKey {
    let plain = StoreKey::derive(namespace, scope, key);
    match secret {
        Some(s) => s.key_store_key(&plain),
        None => plain,
    }
}

/// Runs one store operation within `limit`. Past it, the operation is dropped and answered
/// [`StoreErrorKind::Timeout`], as a store fault: a store that never answers cannot hang a
/// request. The bound is tokio's timer: outside a tokio runtime (another executor) the
/// operation runs unbounded, as the store's own bounds allow, rather than panicking.
pub(crate) async fn bounded<T>(
    limit: Duration,
    op: impl Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    if tokio::runtime::Handle::try_current().is_err() {
        return op.await;
    }
    tokio::time::timeout(limit, op).await.unwrap_or_else(|_| {
        Err(StoreError::new(
            StoreErrorKind::Timeout,
            "the store did not answer within the engine's store timeout",
        ))
    })
}

/// The longest lease, retention or wait the engine counts: about a century, as the stores keep
/// at most. A longer one, up to `Duration::MAX`, counts as this. So no value can overflow a
/// clock.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 60 * 60);

/// Logs a renewal's outcome. Returns `true` when the lease is lost for good: stop renewing.
fn renewal_lost(res: Result<bool, StoreError>, key: &StoreKey) -> bool {
    match res {
        Ok(true) => false,
        Ok(false) => {
            tracing::warn!(key = ?key, "idempotency lease lost while the work ran; a repeat may run");
            true
        }
        Err(e) => {
            tracing::warn!(key = ?key, error = %e, "idempotency lease renewal failed; retrying");
            false
        }
    }
}

type RenewFuture<'a> = Pin<Box<dyn Future<Output = Result<bool, StoreError>> + Send + 'a>>;

pin_project_lite::pin_project! {
    /// [`Engine::run`]: the work, and beside it the renewal of its lease every third of the
    /// lease. One renewal runs at a time, and none once the lease is known lost.
    struct Run<'a, S, F> {
        #[pin]
        work: F,
        // Made when the work first waits: work done in its first poll reads no clock and
        // sets no timer.
        #[pin]
        sleep: Option<tokio::time::Sleep>,
        renewing: Option<RenewFuture<'a>>,
        lost: bool,
        engine: &'a Engine<S>,
        ticket: &'a Ticket,
    }
}

impl<S: Store, F: Future> Future for Run<'_, S, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        let mut this = self.project();
        if let Poll::Ready(out) = this.work.poll(cx) {
            return Poll::Ready(out);
        }
        let (engine, ticket) = (*this.engine, *this.ticket);
        if let Some(fut) = this.renewing.as_mut()
            && let Poll::Ready(res) = fut.as_mut().poll(cx)
        {
            *this.renewing = None;
            *this.lost = renewal_lost(res, &ticket.key);
            if *this.lost {
                ticket.claim.lose();
            }
        }
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep(engine.lease / 3)));
        }
        let Some(mut sleep) = this.sleep.as_pin_mut() else {
            return Poll::Pending;
        };
        if !*this.lost && this.renewing.is_none() && sleep.as_mut().poll(cx).is_ready() {
            sleep
                .as_mut()
                .reset(tokio::time::Instant::now() + engine.lease / 3);
            let _ = sleep.as_mut().poll(cx);
            let mut fut: RenewFuture<'_> = Box::pin(async move {
                let started = engine.timer.start(Op::Renew);
                let renewed = bounded(
                    engine.store_timeout,
                    engine.store.renew(&ticket.key, &ticket.token, engine.lease),
                )
                .await;
                engine.timer.record(Op::Renew, started, &renewed);
                renewed
            });
            match fut.as_mut().poll(cx) {
                Poll::Ready(res) => {
                    *this.lost = renewal_lost(res, &ticket.key);
                    if *this.lost {
                        ticket.claim.lose();
                    }
                }
                Poll::Pending => *this.renewing = Some(fut),
            }
        }
        Poll::Pending
    }
}

/// The idempotency engine over a store. Cheap to clone: the store is shared.
///
/// Every door is made from one. A door's `new(engine, ..)` takes an `Engine`, or a store that
/// becomes [`Engine::new`] of it:
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::{MemoryStore, Store};
/// use tower_idempotency::engine::Engine;
///
/// // What every door's `new` does with its first argument.
/// fn door<S: Store>(engine: impl Into<Engine<S>>) -> Engine<S> {
///     engine.into()
/// }
///
/// let defaults = door(MemoryStore::new());
/// assert_eq!(defaults.lease(), Duration::from_secs(60));
/// let tuned = door(Engine::builder(MemoryStore::new()).lease(Duration::from_secs(5)).build());
/// assert_eq!(tuned.lease(), Duration::from_secs(5));
/// ```
pub struct Engine<S> {
    store: Arc<S>,
    lease: Duration,
    retention: Duration,
    max_record_body: usize,
    secret: Option<Secret>,
    /// The bound on each store operation.
    store_timeout: Duration,
    /// Times each store operation, with feature `metrics`. It is zero-sized without it.
    timer: StoreTimer,
}

impl<S> Clone for Engine<S> {
    fn clone(&self) -> Self {
        Self {
            store: Arc::clone(&self.store),
            lease: self.lease,
            retention: self.retention,
            max_record_body: self.max_record_body,
            secret: self.secret.clone(),
            store_timeout: self.store_timeout,
            timer: self.timer.clone(),
        }
    }
}

impl<S> Engine<S> {
    /// These settings over a store made from this one: lease, retention, record limit and secret.
    /// The macro door wraps the store to erase its type.
    #[cfg(feature = "macros")]
    pub(crate) fn map_store<T>(&self, f: impl FnOnce(&Arc<S>) -> T) -> Engine<T> {
        Engine {
            store: Arc::new(f(&self.store)),
            timer: self.timer.clone(),
            lease: self.lease,
            retention: self.retention,
            max_record_body: self.max_record_body,
            secret: self.secret.clone(),
            store_timeout: self.store_timeout,
        }
    }
}

impl<S> fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("lease", &self.lease)
            .field("retention", &self.retention)
            .field("max_record_body", &self.max_record_body)
            .field("authenticated", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

/// What to do with a request, as decided by [`Engine::begin`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Begin {
    /// The key is claimed: run the work, then complete or release the ticket.
    Run(Ticket),
    /// The same request holds the key and has not finished. HTTP answers 409.
    InFlight,
    /// The key is held or done by a different request. HTTP answers 422.
    KeyReused,
    /// The same request finished: answer with its record.
    Replayed(Recorded),
    /// A record was found but failed validation. Never replay it. HTTP answers 503.
    RecordInvalid(RecordError),
}

/// Proof of a claim: the key, the request's fingerprint and the fencing token.
///
/// The claim's [`Steps`] run only while the ticket is held: once it is completed, released,
/// held or dropped, they run nothing.
#[derive(Debug)]
pub struct Ticket {
    key: StoreKey,
    fingerprint: Fingerprint,
    token: Token,
    /// Shared with the claim's steps: whether the claim is still this run's.
    claim: Arc<steps::ClaimCell>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.claim.settle();
    }
}

impl Ticket {
    /// The claimed store key.
    #[must_use]
    pub fn key(&self) -> &StoreKey {
        &self.key
    }

    /// The fencing token.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn token(&self) -> &Token {
        &self.token
    }

    /// The request's fingerprint, as the store keeps it.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The claim as its steps see it.
    pub(crate) fn claim(&self) -> &Arc<steps::ClaimCell> {
        &self.claim
    }
}

impl<S: Store> steps::StepSource for Engine<S> {
    fn step_settings(&self) -> steps::StepSettings {
        let store: Arc<dyn steps::StepStore> = Arc::clone(&self.store) as Arc<S>;
        steps::StepSettings {
            store,
            timer: self.timer.clone(),
            // A retention shorter than the lease must not expire steps before a crash's retry,
            // which comes after the lease lapsed.
            retention: self.retention.saturating_add(self.lease).min(LONGEST),
            lease: self.lease,
            max_record_body: self.max_record_body,
            secret: self.secret.clone(),
            store_timeout: self.store_timeout,
        }
    }
}

impl<S: Store> From<S> for Engine<S> {
    /// [`Engine::new`]: every door's `new` takes a store or an engine.
    fn from(store: S) -> Self {
        Self::new(store)
    }
}

impl<S: Store> Engine<S> {
    /// An engine with the default settings: a 60 s lease, 24 h retention and a 1 MiB record
    /// body limit.
    #[must_use]
    pub fn new(store: S) -> Self {
        Self::from_arc(Arc::new(store))
    }

    /// An engine over a store that is already shared.
    #[must_use]
    pub fn from_arc(store: Arc<S>) -> Self {
        Self {
            timer: StoreTimer::new(store.name(), DEFAULT_SPAN_LEVEL),
            store,
            lease: DEFAULT_LEASE,
            retention: DEFAULT_RETENTION,
            max_record_body: DEFAULT_MAX_RECORD_BODY,
            secret: None,
            store_timeout: DEFAULT_STORE_TIMEOUT,
        }
    }

    /// An engine with settings of its own: `Engine::builder(store).lease(..).retention(..).build()`.
    /// The defaults are written on each setter of [`EngineBuilder`].
    pub fn builder(store: S) -> EngineBuilder<S> {
        EngineBuilder {
            engine: Self::new(store),
        }
    }

    pub(crate) fn set_lease(&mut self, lease: Duration) {
        self.lease = lease.clamp(Duration::from_millis(3), LONGEST);
    }

    pub(crate) fn set_retention(&mut self, retention: Duration) {
        self.retention = retention.clamp(Duration::from_millis(1), LONGEST);
    }

    pub(crate) fn set_max_record_body(&mut self, bytes: usize) {
        self.max_record_body = bytes;
    }

    pub(crate) fn set_secret(&mut self, secret: Secret) {
        self.secret = Some(secret);
    }

    /// The lease.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The retention of completed records.
    #[must_use]
    pub fn retention(&self) -> Duration {
        self.retention
    }

    /// The longest the engine waits for one store operation. See
    /// [`EngineBuilder::store_timeout`].
    #[must_use]
    pub fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    /// The level of the spans its doors open. See [`EngineBuilder::span_level`].
    #[must_use]
    pub fn span_level(&self) -> tracing::Level {
        self.timer.level()
    }

    /// The record body limit.
    #[must_use]
    pub fn max_record_body(&self) -> usize {
        self.max_record_body
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Claims the key, or says what the record found means for a request with `fingerprint`.
    ///
    /// # Errors
    /// The store's error. The work must not run.
    // Not an `async fn`: its future would hold the key and fingerprint twice (argument and
    // local), and every keyed HTTP request's future holds this one.
    pub fn begin(
        &self,
        key: StoreKey,
        fingerprint: Fingerprint,
    ) -> impl Future<Output = Result<Begin, StoreError>> + use<'_, S> {
        let keyed = self.keyed(fingerprint);
        async move {
            let started = self.timer.start(Op::Claim);
            let claim = bounded(
                self.store_timeout,
                self.store.claim(&key, &keyed, self.lease),
            )
            .await;
            self.timer.record(Op::Claim, started, &claim);
            Ok(self.judge(key, fingerprint, keyed, claim?))
        }
    }

    /// The timer of this engine's store operations, for a door that runs operations of its own.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn timer(&self) -> &StoreTimer {
        &self.timer
    }

    /// As [`begin`](Self::begin), but a request that finds the same request in flight waits
    /// up to `bound` for it to finish. Then it gets what the first run left: its record to
    /// replay, or the key to run if the first run was released. Past the bound it gets
    /// [`Begin::InFlight`], as from `begin`.
    ///
    /// A store that is told when a key settles, such as the memory store, wakes the waiter at
    /// once. Any other is asked again with backoff: 10 ms, doubling up to 250 ms, each ask one
    /// claim round trip. The wait also ends when the first run's lease lapses. This request then
    /// claims the key, as any request after the lease would. Any bound is accepted:
    /// `Duration::MAX` waits until the first run settles or its lease lapses.
    ///
    /// # Errors
    /// The store's error. The work must not run.
    pub async fn begin_waiting(
        &self,
        key: StoreKey,
        fingerprint: Fingerprint,
        bound: Duration,
    ) -> Result<Begin, StoreError> {
        self.begin_waiting_seen(key, fingerprint, bound, &mut false)
            .await
    }

    /// As [`begin_waiting`](Self::begin_waiting); `in_flight` is set once the store answered
    /// that the key is in flight, so a door that fails open knows a later failure is no
    /// outage of a free key.
    pub(crate) async fn begin_waiting_seen(
        &self,
        key: StoreKey,
        fingerprint: Fingerprint,
        bound: Duration,
        in_flight: &mut bool,
    ) -> Result<Begin, StoreError> {
        const FIRST_POLL: Duration = Duration::from_millis(10);
        const MAX_POLL: Duration = Duration::from_millis(250);
        let deadline = tokio::time::Instant::now() + bound.min(LONGEST);
        let mut poll = FIRST_POLL;
        loop {
            let begin = self.begin(key, fingerprint).await?;
            let now = tokio::time::Instant::now();
            if !matches!(begin, Begin::InFlight) || now >= deadline {
                return Ok(begin);
            }
            *in_flight = true;
            let left = deadline - now;
            let within = if self.store.notifies_settled() {
                left
            } else {
                poll.min(left)
            };
            // A wait is no answer to bound, but a store's wait must not outlast it either.
            let _ = tokio::time::timeout(
                within.saturating_add(self.store_timeout),
                self.store.wait_settled(&key, within),
            )
            .await;
            poll = (poll * 2).min(MAX_POLL);
        }
    }

    /// Deletes the completed record under `key`, so the key can be used again. This is for
    /// support staff who must let a customer reuse a key. A pending claim is kept and reported
    /// as [`Forgotten::KeptPending`]: its work may be running. Derive the key as the door does;
    /// the HTTP layer has [`IdempotencyLayer::forget`](crate::http::IdempotencyLayer::forget).
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyKey, MemoryStore};
    /// use tower_idempotency::engine::{Begin, Engine, Fingerprint, Recorded, Scope};
    /// use tower_idempotency::store::{Forgotten, StoreKey};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let engine = Engine::new(MemoryStore::new());
    /// let key = StoreKey::derive("jobs", &Scope::principal("worker"), &IdempotencyKey::new("job-1").unwrap());
    /// let fp = Fingerprint::builder().field(b"payload").finish();
    /// let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else { panic!("first run") };
    /// engine.complete(ticket, &Recorded::new(200, vec![], None)).await.unwrap();
    ///
    /// assert_eq!(engine.forget(&key).await.unwrap(), Forgotten::Record);
    /// assert!(matches!(engine.begin(key, fp).await.unwrap(), Begin::Run(_)), "the key runs again");
    /// # }
    /// ```
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget(&self, key: &StoreKey) -> Result<Forgotten, StoreError> {
        let found = bounded(self.store_timeout, self.store.forget(key, false)).await?;
        tracing::info!(key = ?key, found = ?found, "idempotency key forgotten by an operator");
        Ok(found)
    }

    /// As [`forget`](Self::forget), and a pending claim is deleted too. This is said
    /// explicitly: its work may still be running, and a retry then runs the work again beside
    /// it. The first run's record still lands if nothing has claimed the key again by the time
    /// it completes. A completion is refused only while another claim holds the key.
    ///
    /// # Errors
    /// The store's error.
    pub async fn forget_even_pending(&self, key: &StoreKey) -> Result<Forgotten, StoreError> {
        let found = bounded(self.store_timeout, self.store.forget(key, true)).await?;
        tracing::warn!(key = ?key, found = ?found, "idempotency key forgotten by an operator, pending claims included");
        Ok(found)
    }

    /// The [`Steps`] of the request claimed by `ticket`: its side effects, each recorded as it
    /// succeeds, so that a retry finishes partly done work instead of redoing it. See [`Steps`].
    /// Called again with the same ticket, it gives the same sequence. The steps run only while
    /// the ticket holds the claim.
    #[must_use]
    pub fn steps(&self, ticket: &Ticket) -> Steps {
        Steps::of(&ticket.claim, || steps::StepSource::step_settings(self))
    }

    /// How long the pending claim on `key` has left, if the store can tell.
    ///
    /// # Errors
    /// The store's error.
    pub async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        bounded(self.store_timeout, self.store.lease_left(key)).await
    }

    /// The store key of `key` for a caller of `scope` in `namespace`, as every door derives it:
    /// [`StoreKey::derive`], keyed under the secret when there is one (see
    /// [`Secret::rotated`]). Derive keys through this when using the engine directly with a
    /// secret, so they match the doors'.
    ///
    /// ```
    /// use tower_idempotency::{IdempotencyKey, MemoryStore, Secret};
    /// use tower_idempotency::engine::{Engine, Scope};
    /// use tower_idempotency::store::StoreKey;
    ///
    /// let key = IdempotencyKey::new("job-1").unwrap();
    /// let plain = StoreKey::derive("jobs", &Scope::principal("worker"), &key);
    /// assert_eq!(Engine::new(MemoryStore::new()).store_key("jobs", &Scope::principal("worker"), &key), plain);
    ///
    /// let secret = Secret::new([7u8; 32].to_vec()).unwrap();
    /// let engine = Engine::builder(MemoryStore::new()).secret(secret).build();
    /// assert_ne!(engine.store_key("jobs", &Scope::principal("worker"), &key), plain);
    /// ```
    #[must_use]
    pub fn store_key(&self, namespace: &str, scope: &Scope, key: &IdempotencyKey) -> StoreKey {
        store_key(self.secret.as_ref(), namespace, scope, key)
    }

    /// The secret, for a door that derives store keys where the engine is not at hand.
    pub(crate) fn secret(&self) -> Option<&Secret> {
        self.secret.as_ref()
    }

    /// The request's fingerprint as the store keeps it: keyed by the secret, when there is one.
    pub(crate) fn keyed(&self, fingerprint: Fingerprint) -> Fingerprint {
        match &self.secret {
            Some(s) => s.key_fingerprint(&fingerprint),
            None => fingerprint,
        }
    }

    /// Whether `held`, a fingerprint the store keeps, is this request's: its `keyed` form, or
    /// its form under another key of the secret's ring (written before or during a rotation).
    pub(crate) fn is_own(
        &self,
        plain: &Fingerprint,
        keyed: &Fingerprint,
        held: &Fingerprint,
    ) -> bool {
        held == keyed
            || self
                .secret
                .as_ref()
                .is_some_and(|s| s.accepts_fingerprint(plain, held))
    }

    /// What a claim's answer means for a request with the `plain` fingerprint, `keyed` as the
    /// store keeps it.
    pub(crate) fn judge(
        &self,
        key: StoreKey,
        plain: Fingerprint,
        keyed: Fingerprint,
        claim: Claim,
    ) -> Begin {
        match claim {
            Claim::Claimed(token) => Begin::Run(Ticket {
                claim: steps::ClaimCell::new(key, plain, keyed, token.clone()),
                key,
                fingerprint: keyed,
                token,
            }),
            Claim::Pending { fingerprint: held } if self.is_own(&plain, &keyed, &held) => {
                Begin::InFlight
            }
            Claim::Done {
                fingerprint: held,
                record,
            } if self.is_own(&plain, &keyed, &held) => {
                // Verified under the fingerprint it was written with: the ring's key may be
                // another than the one this replica signs with.
                let decoded = match &self.secret {
                    Some(s) => record.decode_verified(self.max_record_body, s, key.id(), &held),
                    None => record.decode(self.max_record_body),
                };
                match decoded {
                    Ok(r) => Begin::Replayed(r),
                    Err(e) => Begin::RecordInvalid(e),
                }
            }
            Claim::Pending { .. } | Claim::Done { .. } => Begin::KeyReused,
        }
    }

    /// The record of `response` under `ticket`: encoded, and sealed when there is a secret. A
    /// response the layout cannot hold whole is encoded without the parts that do not fit, and
    /// logged. It is an error only when even that fails, for a status outside 100–999.
    pub(crate) fn seal(&self, ticket: &Ticket, response: &Recorded) -> Result<Record, RecordError> {
        let record = match response.encode() {
            Ok(record) => record,
            Err(e) => {
                let (fitted, dropped) = response.fitted();
                let record = fitted.encode()?;
                tracing::warn!(key = ?ticket.key, reason = e.reason(), left_out = ?dropped, "idempotency record could not be encoded whole; recorded without the parts that do not fit");
                record
            }
        };
        match &self.secret {
            Some(s) => record.seal(s, ticket.key.id(), &ticket.fingerprint),
            None => Ok(record),
        }
    }

    /// Runs `work` while renewing the ticket's lease every third of the lease. So work slower than
    /// the lease keeps its claim. Renewal stops when the work finishes or this future is dropped.
    /// The key then stays pending until its lease lapses.
    // A future of its own, not an `async fn`: an `async fn` keeps its `work` argument and the
    // pinned copy of it both in its state, which made a claimed HTTP request's future twice the
    // size of the handler's and every move of it a copy of ~6 KB.
    pub fn run<'a, F: Future>(
        &'a self,
        ticket: &'a Ticket,
        work: F,
    ) -> impl Future<Output = F::Output> + use<'a, F, S> {
        Run {
            work,
            sleep: None,
            renewing: None,
            lost: false,
            engine: self,
            ticket,
        }
    }

    /// Records the result under the ticket for the retention period.
    ///
    /// Some responses the record layout cannot hold whole: a header or trailer value over 64 KiB,
    /// more than 65 535 fields, or a body over 4 GiB. Such a response is recorded without the
    /// parts that do not fit, and a warning names them. The work is done, and a retry must be
    /// answered from the record rather than run it again.
    ///
    /// Returns `Ok(false)` when the ticket's lease had lapsed and another claimant holds the key.
    /// The new holder is left alone.
    ///
    /// # Errors
    /// The store's error, or a `Protocol` error when the response cannot be encoded even
    /// without those parts. Only a status outside 100–999 does that. Either way the key stays
    /// pending until its lease lapses. Nothing is released, since the work may have happened.
    pub async fn complete(&self, ticket: Ticket, response: &Recorded) -> Result<bool, StoreError> {
        ticket.claim.settle();
        let record = self.seal(&ticket, response).map_err(|e| {
            StoreError::with_source(StoreErrorKind::Protocol, "response cannot be recorded", e)
        })?;
        self.store_record(ticket, record).await
    }

    /// [`Engine::complete`] for a record written straight from a response, as the HTTP layer does.
    /// It is tagged when there is a secret, then stored. What the layout could not hold was left
    /// out of the draft. The caller logs it.
    pub(crate) async fn complete_draft(
        &self,
        ticket: Ticket,
        draft: crate::engine::record::Draft,
    ) -> Result<bool, StoreError> {
        ticket.claim.settle();
        let record = draft
            .finish(self.secret.as_ref(), ticket.key.id(), &ticket.fingerprint)
            .map_err(|e| {
                StoreError::with_source(StoreErrorKind::Protocol, "response cannot be recorded", e)
            })?;
        self.store_record(ticket, record).await
    }

    /// The bytes a record gains when it is stored: its tag, when there is a secret. None when
    /// it encrypts: the sealed record is written anew.
    pub(crate) fn tag_len(&self) -> usize {
        if self.secret.as_ref().is_some_and(|s| !s.encrypts()) {
            crate::engine::secret::TAG_LEN
        } else {
            0
        }
    }

    async fn store_record(&self, ticket: Ticket, record: Record) -> Result<bool, StoreError> {
        let started = self.timer.start(Op::Complete);
        let done = bounded(
            self.store_timeout,
            self.store.complete(
                &ticket.key,
                &ticket.token,
                &ticket.fingerprint,
                record,
                self.retention,
            ),
        )
        .await;
        self.timer.record(Op::Complete, started, &done);
        done
    }

    /// Keeps the key pending for `hold` from now, under the ticket, instead of completing or
    /// releasing it: the claim is renewed for the hold time. This is how every door holds a
    /// key, for work whose outcome is unknown, such as a message that may have been sent. A
    /// retry is then answered "in flight" until the hold ends, rather than doing it again, and
    /// the key's steps are kept for the retry after it. A hold that comes once the lease has
    /// lapsed still holds the key when nothing else claimed it meanwhile, as a record still
    /// lands then ([`complete`](Self::complete)). Returns `Ok(false)` when another claimant
    /// holds the key, or it was completed.
    ///
    /// # Errors
    /// The store's error. The key then stays pending until its current lease lapses.
    pub async fn hold(&self, ticket: Ticket, hold: Duration) -> Result<bool, StoreError> {
        ticket.claim.settle();
        let started = self.timer.start(Op::Renew);
        let held = bounded(
            self.store_timeout,
            self.store.renew(&ticket.key, &ticket.token, hold),
        )
        .await;
        self.timer.record(Op::Renew, started, &held);
        if !matches!(held, Ok(false)) {
            return held;
        }
        // The lease lapsed before the hold: the work may still have had its effect, so the
        // key is claimed again for the hold time. A repeat that claimed it in the gap keeps it.
        let started = self.timer.start(Op::Claim);
        let claim = bounded(
            self.store_timeout,
            self.store.claim(&ticket.key, &ticket.fingerprint, hold),
        )
        .await;
        self.timer.record(Op::Claim, started, &claim);
        let Claim::Claimed(token) = claim? else {
            return Ok(false);
        };
        // Renewed under the new claim, so the key's steps are kept past the hold, as a hold
        // in time keeps them. The key is held either way.
        let renewed = bounded(
            self.store_timeout,
            self.store.renew(&ticket.key, &token, hold),
        )
        .await;
        if let Err(e) = renewed {
            tracing::debug!(key = ?ticket.key, error = %e, "late hold: the key's steps not kept past it");
        }
        Ok(true)
    }

    /// Frees the key so a retry runs the work again. Returns `Ok(false)` when the ticket no
    /// longer held it.
    ///
    /// # Errors
    /// The store's error. The key then stays pending until its lease lapses.
    pub async fn release(&self, ticket: Ticket) -> Result<bool, StoreError> {
        ticket.claim.settle();
        let started = self.timer.start(Op::Release);
        let released = bounded(
            self.store_timeout,
            self.store.release(&ticket.key, &ticket.token),
        )
        .await;
        self.timer.record(Op::Release, started, &released);
        released
    }
}

/// Builds an [`Engine`] with settings other than the defaults. Made by [`Engine::builder`].
///
/// The lease, the retention, the record limit and the secret are set here only. Every door
/// takes the engine built.
///
/// ```
/// use std::time::Duration;
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::engine::Engine;
///
/// let engine = Engine::builder(MemoryStore::new())
///     .lease(Duration::from_secs(30))
///     .retention(Duration::from_secs(3600))
///     .build();
/// assert_eq!(engine.lease(), Duration::from_secs(30));
/// ```
#[must_use]
#[derive(Debug)]
pub struct EngineBuilder<S> {
    engine: Engine<S>,
}

impl<S: Store> EngineBuilder<S> {
    /// How long a claim holds a key. It is renewed while the work runs, every third of the
    /// lease. At least 3 ms. A longer one than about a century counts as that. Default: 60 s.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.engine.set_lease(lease);
        self
    }

    /// How long a completed record is kept. At least 1 ms. A longer one than about a century
    /// counts as that. Default: 24 h.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.engine.set_retention(retention);
        self
    }

    /// The largest body a record may hold. Longer records fail validation when read back.
    /// Default: 1 MiB.
    pub fn max_record_body(mut self, bytes: usize) -> Self {
        self.engine.set_max_record_body(bytes);
        self
    }

    /// Authenticates records and keys fingerprints with `secret`. See [`Secret`].
    /// Default: off.
    pub fn secret(mut self, secret: Secret) -> Self {
        self.engine.set_secret(secret);
        self
    }

    /// The longest the engine waits for one store operation: a claim, a completion, a
    /// release, a renewal, a step's check, record or lookup, a `forget`. Past it, the operation
    /// is dropped and fails with [`StoreErrorKind::Timeout`], answered as any store fault: 503
    /// before the work runs, and after it the handler's response still goes out. So a store of
    /// one's own that never answers cannot hang a request. At least 1 ms. Default: 30 s,
    /// longer than the built-in stores' own bounds at their defaults (1 s per operation, 5 s
    /// to connect), so it never fires before theirs; raise it with theirs. The bound is tokio's
    /// timer: outside a tokio runtime the operations run unbounded.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Engine;
    ///
    /// let engine = Engine::builder(MemoryStore::new())
    ///     .store_timeout(Duration::from_secs(5))
    ///     .build();
    /// assert_eq!(engine.store_timeout(), Duration::from_secs(5));
    /// ```
    pub fn store_timeout(mut self, limit: Duration) -> Self {
        self.engine.store_timeout = limit.clamp(Duration::from_millis(1), LONGEST);
        self
    }

    /// The level of the spans every door over this engine opens: one named `idempotency` per
    /// request, and one named `idempotency.store` per store operation under it. Their fields
    /// are listed in the crate docs, under "Tracing". Set `Level::INFO` for a pipeline that
    /// keeps info spans, such as an OpenTelemetry exporter behind an info filter.
    /// Default: `Level::DEBUG`.
    ///
    /// ```
    /// use tower_idempotency::MemoryStore;
    /// use tower_idempotency::engine::Engine;
    ///
    /// let engine = Engine::builder(MemoryStore::new())
    ///     .span_level(tracing::Level::INFO)
    ///     .build();
    /// assert_eq!(engine.span_level(), tracing::Level::INFO);
    /// ```
    pub fn span_level(mut self, level: tracing::Level) -> Self {
        self.engine.timer.set_level(level);
        self
    }

    /// The engine.
    pub fn build(self) -> Engine<S> {
        self.engine
    }
}
