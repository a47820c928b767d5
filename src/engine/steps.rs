//! Steps: a retry finishes partly done work instead of redoing it.

use crate::engine::codec::{BoxFuture, Codec};
use crate::engine::fingerprint::Fingerprint;
use crate::engine::scope::{DerivedKey, StoreKey};
use crate::engine::secret::{Secret, TAG_LEN};
use crate::metrics::{self, Op, Started, StepResult, StoreTimer};
use crate::store::{StepId, StepRecorded, Store, StoreError, StoreErrorKind};
use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The longest step name, in bytes.
const MAX_NAME: usize = 255;
/// The version byte that opens a step's stored value.
const VERSION: u8 = 1;
const STEP_ID_DOMAIN: &[u8] = b"tower-idempotency step id v1\0";
const STEP_KEY_DOMAIN: &[u8] = b"tower-idempotency step key v1\0";
const STEP_TAG_DOMAIN: &[u8] = b"tower-idempotency step record v1\0";

/// The steps of one claimed request's work. Each side effect runs in a named step; a step that
/// completed under this request's key is answered from its record on a retry, not run again.
///
/// ```
/// use tower_idempotency::{IdempotencyKey, MemoryStore};
/// use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Scope};
/// use tower_idempotency::store::StoreKey;
/// use std::future::ready;
/// use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::new(MemoryStore::new());
/// let key = StoreKey::derive("orders", &Scope::principal("alice"), &IdempotencyKey::new("k-1").unwrap());
/// let fp = Fingerprint::builder().field(b"order 17").finish();
/// let charges = AtomicUsize::new(0);
///
/// // The first run charges, then fails at the receipt: its key is released.
/// let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else { panic!("first run") };
/// let steps = engine.steps(&ticket);
/// let charge: String = steps
///     .run("charge", Raw, |key| {
///         charges.fetch_add(1, SeqCst); // forward `key` to the payment provider
///         ready(Ok::<_, &str>(format!("ch_{}", &key.as_str()[..8])))
///     })
///     .await
///     .unwrap();
/// let receipt = steps.run("receipt", Raw, |_| ready(Err::<String, _>("mail server down"))).await;
/// assert!(receipt.is_err());
/// engine.release(ticket).await.unwrap();
///
/// // The retry runs the handler again: the charge is answered from its record.
/// let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else { panic!("released") };
/// let steps = engine.steps(&ticket);
/// let again: String = steps.run("charge", Raw, |_| ready(Ok::<_, &str>("twice!".into()))).await.unwrap();
/// assert_eq!(again, charge);
/// assert_eq!(charges.load(SeqCst), 1);
/// # }
/// ```
///
/// A step's result is recorded through a [`Codec`] when the step returns `Ok`: [`Raw`] for
/// bytes and text, [`Json`] (feature `json`) for any serde value. A step's `Err` is not
/// recorded: the step runs again on the next retry, and the handler decides what the request
/// answers.
///
/// # What is kept, and for how long
///
/// - Steps belong to one request: its key and its fingerprint. A different request under the
///   same key never reads them.
/// - A released key keeps its steps for the engine's retention, counted from the last step
///   recorded; so does a key whose lease lapsed. The next claimant of the key reads them.
/// - A completed key keeps its steps beside its record until the retention ends. A retry of a
///   completed key is answered from the record and never reads them.
/// - [`Engine::forget`](crate::engine::Engine::forget) deletes them with the record.
///
/// # The rules a run must keep
///
/// Steps are matched by place and name: the third step of the retry must be the third step of
/// the first run, under the same name. A name used twice in one run is refused with
/// [`StepErrorKind::NameReused`], and a retry whose names come in another order with
/// [`StepErrorKind::SequenceChanged`]. Neither runs the step. A step's place is taken when
/// [`run`](Self::run) is called, so steps joined concurrently keep the order of the calls.
///
/// Two claimants of one key overlap only after a lease lapsed. If both finish the same step,
/// the first record wins: the second run's step gets the first's result back, with a warning
/// and the metric `idempotency_steps_total{result="overlapped"}`. Nothing is overwritten.
///
/// # The key to forward
///
/// Each step gets a [`DerivedKey`] of its own: the same on every retry of the request, and
/// different for every step. Forward it to a provider that de-duplicates, such as a payment
/// API. Then a crash between the provider's answer and the step's record is closed there too.
///
/// # When recording fails
///
/// A step whose work succeeded but whose record could not be written still returns its
/// result, with a warning: the side effect happened, and the handler should go on. A retry
/// after the request was released runs that step again, under the same derived key. Reading
/// the recorded steps fails before any step runs: a store that cannot say what was done runs
/// nothing.
///
/// [`Raw`]: crate::engine::Raw
#[cfg_attr(feature = "json", doc = "[`Json`]: crate::engine::Json")]
#[cfg_attr(not(feature = "json"), doc = "[`Json`]: crate::engine::Codec")]
#[derive(Clone)]
pub struct Steps {
    inner: Arc<Inner>,
}

struct Inner {
    /// The claim these steps belong to: set when they are made, or when the key is claimed
    /// after a handler's arguments were taken (the `#[idempotent]` attribute).
    bound: std::sync::OnceLock<Bound>,
    recorded: tokio::sync::OnceCell<HashMap<StepId, Bytes>>,
    /// The names of this run's steps, in the order `run` was called.
    names: Mutex<Vec<Box<str>>>,
}

pub(crate) struct Bound {
    store: Arc<dyn StepStore>,
    timer: StoreTimer,
    pub(crate) key: StoreKey,
    fingerprint: Fingerprint,
    pub(crate) ttl: Duration,
    max_record_body: usize,
    secret: Option<Secret>,
}

impl fmt::Debug for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Steps")
            .field("key", &self.inner.bound.get().map(|b| b.key))
            .field("run", &self.names().len())
            .finish_non_exhaustive()
    }
}

/// What [`Steps`] needs of a store, with its type erased so that a handler's `Steps` has none.
pub(crate) trait StepStore: Send + Sync + 'static {
    fn steps<'a>(
        &'a self,
        key: &'a StoreKey,
    ) -> BoxFuture<'a, Result<Vec<(StepId, Bytes)>, StoreError>>;
    fn record_step<'a>(
        &'a self,
        key: &'a StoreKey,
        step: &'a StepId,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<StepRecorded, StoreError>>;
}

impl<S: Store> StepStore for S {
    fn steps<'a>(
        &'a self,
        key: &'a StoreKey,
    ) -> BoxFuture<'a, Result<Vec<(StepId, Bytes)>, StoreError>> {
        Box::pin(Store::steps(self, key))
    }

    fn record_step<'a>(
        &'a self,
        key: &'a StoreKey,
        step: &'a StepId,
        value: Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<StepRecorded, StoreError>> {
        Box::pin(Store::record_step(self, key, step, value, ttl))
    }
}

/// An engine with its store type erased: what the HTTP layer's request extensions keep to
/// make a claimed request's [`Steps`] when a handler asks for them.
pub(crate) trait StepSource: Send + Sync + 'static {
    /// The engine's settings for steps.
    fn step_settings(&self) -> StepSettings;
}

/// The settings of [`Steps`] taken from an engine.
pub(crate) struct StepSettings {
    pub(crate) store: Arc<dyn StepStore>,
    pub(crate) timer: StoreTimer,
    pub(crate) ttl: Duration,
    pub(crate) max_record_body: usize,
    pub(crate) secret: Option<Secret>,
}

tokio::task_local! {
    static CURRENT: Steps;
}

impl Steps {
    pub(crate) fn new(settings: StepSettings, key: StoreKey, fingerprint: Fingerprint) -> Self {
        let steps = Self::unbound();
        steps.bind(settings, key, fingerprint);
        steps
    }

    /// Steps not yet tied to a claim: a handler's argument taken before its key is claimed.
    pub(crate) fn unbound() -> Self {
        Self {
            inner: Arc::new(Inner {
                bound: std::sync::OnceLock::new(),
                recorded: tokio::sync::OnceCell::new(),
                names: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Ties these steps to the request claimed under `key`. Only the first call counts.
    pub(crate) fn bind(&self, settings: StepSettings, key: StoreKey, fingerprint: Fingerprint) {
        let _ = self.inner.bound.set(Bound {
            store: settings.store,
            timer: settings.timer,
            key,
            fingerprint,
            ttl: settings.ttl,
            max_record_body: settings.max_record_body,
            secret: settings.secret,
        });
    }

    /// The steps of the message or job whose handler is running on this task, set by the
    /// message door. `None` outside such a handler, or in a task it spawned.
    #[must_use]
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Runs `fut` with these steps as [`Steps::current`].
    pub(crate) fn scope<F: Future>(self, fut: F) -> impl Future<Output = F::Output> {
        CURRENT.scope(self, fut)
    }

    /// The store key of the request these steps belong to. `None` before its key is claimed.
    #[must_use]
    pub fn key(&self) -> Option<&StoreKey> {
        self.inner.bound.get().map(|b| &b.key)
    }

    fn names(&self) -> std::sync::MutexGuard<'_, Vec<Box<str>>> {
        self.inner
            .names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs the step `name` once for this request, or answers it from its record.
    ///
    /// `work` gets the step's [`DerivedKey`] to forward to its provider. Its `Ok` value is
    /// recorded with `codec` and returned. On a retry of the request, a step recorded before is
    /// decoded and returned, and `work` does not run. See [`Steps`] for the rules.
    ///
    /// # Errors
    /// A [`StepError`]: the work's own error (kind [`Work`](StepErrorKind::Work), not
    /// recorded), or a reason the step did not run: the store could not read the recorded
    /// steps, a name that is empty, too long, used twice or out of order, or a record that
    /// fails validation.
    pub fn run<T, E, C, F, Fut>(
        &self,
        name: &str,
        codec: C,
        work: F,
    ) -> impl Future<Output = Result<T, StepError<E>>> + Send + use<'_, T, E, C, F, Fut>
    where
        C: Codec<T>,
        F: FnOnce(DerivedKey) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
        T: Send,
        E: Send,
    {
        // The step's place is taken now, not when first polled: joined steps keep call order.
        let place = self.take_place(name);
        let name = name.to_owned();
        async move {
            let place = place?;
            let bound = self.bound(place, &name)?;
            let id = bound.step_id(place);
            if let Some(value) = self.recorded(bound).await?.get(&id) {
                return bound.replay(place, &id, &name, &codec, value.clone());
            }
            let derived = bound.derived_key(&name);
            let value = work(derived)
                .await
                .map_err(|e| StepError::new(Repr::Work(e), place, &name))?;
            bound.record(place, &id, &name, &codec, value).await
        }
    }

    /// The claim of these steps, or why a step cannot run.
    pub(crate) fn bound<E>(&self, place: u32, name: &str) -> Result<&Bound, StepError<E>> {
        self.inner
            .bound
            .get()
            .ok_or_else(|| StepError::new(Repr::NotClaimed, place, name))
    }

    /// Takes the next place for `name`, refusing a bad or repeated name.
    pub(crate) fn take_place<E>(&self, name: &str) -> Result<u32, StepError<E>> {
        let mut names = self.names();
        let place = u32::try_from(names.len()).unwrap_or(u32::MAX);
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(StepError::new(Repr::NameInvalid, place, name));
        }
        if names.iter().any(|n| &**n == name) {
            return Err(StepError::new(Repr::NameReused, place, name));
        }
        names.push(name.into());
        Ok(place)
    }

    /// The request's recorded steps, read from the store on first use.
    pub(crate) async fn recorded<E>(
        &self,
        bound: &Bound,
    ) -> Result<&HashMap<StepId, Bytes>, StepError<E>> {
        self.inner
            .recorded
            .get_or_try_init(|| async {
                let started = Started::now();
                let read = bound.store.steps(&bound.key).await;
                bound.timer.record(Op::Steps, started, &read);
                read.map(|steps| steps.into_iter().collect())
            })
            .await
            .map_err(|e| {
                let repr = if e.kind() == StoreErrorKind::Unsupported {
                    Repr::Unsupported(e)
                } else {
                    Repr::Store(e)
                };
                StepError::new(repr, u32::MAX, "")
            })
    }
}

impl Bound {
    pub(crate) fn step_id(&self, place: u32) -> StepId {
        let mut h = Sha256::new();
        h.update(STEP_ID_DOMAIN);
        h.update(self.fingerprint.as_bytes());
        h.update(place.to_be_bytes());
        StepId::from_bytes(h.finalize().into())
    }

    fn derived_key(&self, name: &str) -> DerivedKey {
        let mut h = Sha256::new();
        h.update(STEP_KEY_DOMAIN);
        h.update(self.key.id());
        h.update(self.fingerprint.as_bytes());
        h.update(name.as_bytes());
        DerivedKey::from_digest(&h.finalize())
    }

    /// The bytes stored for a step: version, name, payload, and the tag under a secret.
    fn encode(&self, id: &StepId, name: &str, payload: &[u8]) -> Bytes {
        let tag = if self.secret.is_some() { TAG_LEN } else { 0 };
        let mut out = BytesMut::with_capacity(3 + name.len() + payload.len() + tag);
        out.put_u8(VERSION);
        // At most MAX_NAME bytes: checked when the place was taken.
        out.put_u16(u16::try_from(name.len()).unwrap_or(u16::MAX));
        out.put_slice(name.as_bytes());
        out.put_slice(payload);
        if let Some(secret) = &self.secret {
            let t = secret.tag(self.key.id(), &self.fingerprint, &tagged(id, &out));
            out.put_slice(&t);
        }
        out.freeze()
    }

    /// The payload of a recorded step, checked against this run's name and the secret.
    fn read<E>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        mut value: Bytes,
    ) -> Result<Bytes, StepError<E>> {
        let invalid =
            |reason: &'static str| StepError::new(Repr::RecordInvalid(reason.into()), place, name);
        if let Some(secret) = &self.secret {
            if value.len() < TAG_LEN {
                return Err(invalid("a step record too short for its tag"));
            }
            let tag = value.split_off(value.len() - TAG_LEN);
            if !secret.verify(self.key.id(), &self.fingerprint, &tagged(id, &value), &tag) {
                return Err(invalid("a step record whose tag does not match"));
            }
        }
        if value.len() < 3 || value[0] != VERSION {
            return Err(invalid("a step record of an unknown version"));
        }
        let len = usize::from(u16::from_be_bytes([value[1], value[2]]));
        if value.len() < 3 + len {
            return Err(invalid("a step record cut short"));
        }
        let recorded = &value[3..3 + len];
        if recorded != name.as_bytes() {
            let recorded = String::from_utf8_lossy(recorded).into_owned();
            return Err(StepError::new(Repr::SequenceChanged(recorded), place, name));
        }
        let payload = value.slice(3 + len..);
        if payload.len() > self.max_record_body {
            return Err(invalid("a step record over the record limit"));
        }
        Ok(payload)
    }

    /// A recorded step's value, decoded: the step does not run.
    pub(crate) fn replay<T, E, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        value: Bytes,
    ) -> Result<T, StepError<E>> {
        let value = self.decoded(place, id, name, codec, value)?;
        metrics::step(StepResult::Replayed);
        tracing::debug!(key = ?self.key, step = %name, "idempotency step answered from its record");
        Ok(value)
    }

    /// The first record of a step that an overlapping run recorded too, decoded.
    pub(crate) fn overlapped<T, E, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        first: Bytes,
    ) -> Result<T, StepError<E>> {
        metrics::step(StepResult::Overlapped);
        tracing::warn!(key = ?self.key, step = %name, "idempotency step ran in two overlapping runs (a lease lapsed); the first record wins, its result is returned");
        self.decoded(place, id, name, codec, first)
    }

    fn decoded<T, E, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        value: Bytes,
    ) -> Result<T, StepError<E>> {
        let payload = self.read(place, id, name, value)?;
        codec
            .decode(payload)
            .map_err(|e| StepError::new(Repr::RecordInvalid(Box::new(e)), place, name))
    }

    /// The bytes to record for a step's result, or why it cannot be recorded: the codec
    /// refused it, or it is over the record limit.
    #[cfg(feature = "postgres")]
    pub(crate) fn sealed<T, C: Codec<T>>(
        &self,
        id: &StepId,
        name: &str,
        codec: &C,
        value: &T,
    ) -> Result<Bytes, StoreError> {
        match codec.encode(value) {
            Ok(p) if p.len() <= self.max_record_body => Ok(self.encode(id, name, &p)),
            Ok(_) => Err(StoreError::new(
                StoreErrorKind::Protocol,
                "the step's result is over the record limit",
            )),
            Err(e) => Err(StoreError::with_source(
                StoreErrorKind::Protocol,
                "the step's result cannot be encoded",
                e,
            )),
        }
    }

    /// Records a step's result, or gives back the first record of an overlapping run.
    async fn record<T, E, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        value: T,
    ) -> Result<T, StepError<E>> {
        let inner = self;
        let payload = match codec.encode(&value) {
            Ok(p) if p.len() <= inner.max_record_body => p,
            Ok(p) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?inner.key, step = %name, bytes = p.len(), limit = inner.max_record_body, "idempotency step result over the record limit; not recorded, a retry runs the step again");
                return Ok(value);
            }
            Err(e) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?inner.key, step = %name, error = %e, "idempotency step result cannot be encoded; not recorded, a retry runs the step again");
                return Ok(value);
            }
        };
        let stored = self.encode(id, name, &payload);
        let started = Started::now();
        let res = inner
            .store
            .record_step(&inner.key, id, stored, inner.ttl)
            .await;
        inner.timer.record(Op::RecordStep, started, &res);
        match res {
            Ok(StepRecorded::Recorded) => {
                metrics::step(StepResult::Ran);
                Ok(value)
            }
            Ok(StepRecorded::Found(first)) => self.overlapped(place, id, name, codec, first),
            Err(e) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?inner.key, step = %name, error = %e, "idempotency step ran but its record failed; a retry runs the step again");
                Ok(value)
            }
        }
    }
}

/// What a step's tag covers: its domain, its id and its stored bytes.
fn tagged(id: &StepId, value: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(STEP_TAG_DOMAIN.len() + 32 + value.len());
    content.extend_from_slice(STEP_TAG_DOMAIN);
    content.extend_from_slice(id.as_bytes());
    content.extend_from_slice(value);
    content
}

/// A step that did not return its result: the work's own error, or why it did not run.
///
/// ```
/// use tower_idempotency::MemoryStore;
/// use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, StepErrorKind};
/// use tower_idempotency::store::StoreKey;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let engine = Engine::new(MemoryStore::new());
/// let key = StoreKey::from_parts([1; 32], [2; 32]);
/// let Begin::Run(ticket) = engine.begin(key, Fingerprint::builder().finish()).await.unwrap() else { panic!() };
/// let steps = engine.steps(&ticket);
///
/// let failed = steps.run("charge", Raw, |_| async { Err::<String, _>("card declined") }).await.unwrap_err();
/// assert_eq!(failed.kind(), StepErrorKind::Work);
/// assert_eq!(failed.into_inner(), Some("card declined"));
///
/// let reused = steps.run("charge", Raw, |_| async { Ok::<String, &str>("ch_1".into()) }).await.unwrap_err();
/// assert_eq!(reused.kind(), StepErrorKind::NameReused);
/// # }
/// ```
pub struct StepError<E> {
    repr: Repr<E>,
    place: u32,
    name: Box<str>,
}

enum Repr<E> {
    Work(E),
    Store(StoreError),
    /// A step in a transaction whose record, or commit, failed: it was rolled back.
    #[cfg(feature = "postgres")]
    NotRecorded(StoreError),
    /// A step in a transaction that PostgreSQL rolled back for a concurrent one.
    #[cfg(feature = "postgres")]
    Conflict(StoreError),
    Unsupported(StoreError),
    RecordInvalid(Box<dyn StdError + Send + Sync + 'static>),
    NameInvalid,
    NameReused,
    SequenceChanged(String),
    NotClaimed,
}

/// What a [`StepError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepErrorKind {
    /// The step's work returned an error. Nothing was recorded: the step runs again on a retry.
    Work,
    /// The store could not read the recorded steps. The step did not run. Or a step run in a
    /// transaction (`transactional::step`, feature `postgres`) could not be recorded: its work
    /// was rolled back. When the commit itself failed on a lost connection, whether it
    /// happened is unknown.
    Store,
    /// The store keeps no steps: a store of your own that does not implement
    /// [`Store::record_step`] and [`Store::steps`]. The step did not run.
    Unsupported,
    /// The step's record failed validation: another version or secret wrote it, or the codec
    /// cannot read it. The step did not run.
    RecordInvalid,
    /// The name is empty or longer than 255 bytes. The step did not run.
    NameInvalid,
    /// The name was already used by a step of this run. The step did not run.
    NameReused,
    /// A retry's steps do not come in the order of the first run: this place holds a step of
    /// another name. The step did not run. Steps must keep their names and order across
    /// versions of a handler while records of the old order are kept.
    SequenceChanged,
    /// The steps belong to no claimed key: the request passed the layer unclaimed, or the
    /// steps are used before the key is claimed. The step did not run.
    NotClaimed,
    /// A step run in a transaction was rolled back by PostgreSQL for a concurrent transaction:
    /// a serialization failure (`40001`) or a deadlock (`40P01`). Nothing of it was committed.
    /// Run the request again, in a new transaction.
    Conflict,
}

impl<E> StepError<E> {
    fn new(repr: Repr<E>, place: u32, name: &str) -> Self {
        Self {
            repr,
            place,
            name: name.into(),
        }
    }

    /// The work's error, as a step's.
    #[cfg(feature = "postgres")]
    pub(crate) fn work(e: E, place: u32, name: &str) -> Self {
        Self::new(Repr::Work(e), place, name)
    }

    /// A step in a transaction that was rolled back because its record or commit failed.
    #[cfg(feature = "postgres")]
    pub(crate) fn not_recorded(e: StoreError, place: u32, name: &str) -> Self {
        Self::new(Repr::NotRecorded(e), place, name)
    }

    /// A step in a transaction that PostgreSQL rolled back for a concurrent one.
    #[cfg(feature = "postgres")]
    pub(crate) fn conflict(e: StoreError, place: u32, name: &str) -> Self {
        Self::new(Repr::Conflict(e), place, name)
    }

    /// What failed.
    #[must_use]
    pub fn kind(&self) -> StepErrorKind {
        match self.repr {
            Repr::Work(_) => StepErrorKind::Work,
            Repr::Store(_) => StepErrorKind::Store,
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(_) => StepErrorKind::Store,
            #[cfg(feature = "postgres")]
            Repr::Conflict(_) => StepErrorKind::Conflict,
            Repr::Unsupported(_) => StepErrorKind::Unsupported,
            Repr::RecordInvalid(_) => StepErrorKind::RecordInvalid,
            Repr::NameInvalid => StepErrorKind::NameInvalid,
            Repr::NameReused => StepErrorKind::NameReused,
            Repr::SequenceChanged(_) => StepErrorKind::SequenceChanged,
            Repr::NotClaimed => StepErrorKind::NotClaimed,
        }
    }

    /// Whether running the request again may succeed: a conflict, or a store failure that [is
    /// retryable](StoreError::is_retryable). The work's own error is the work's to judge, so it
    /// gives `false`, as does every mistake in the handler's steps.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match &self.repr {
            Repr::Store(e) => e.is_retryable(),
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(e) => e.is_retryable(),
            #[cfg(feature = "postgres")]
            Repr::Conflict(_) => true,
            _ => false,
        }
    }

    /// The step's name.
    #[must_use]
    pub fn step(&self) -> &str {
        &self.name
    }

    /// The work's error, for kind [`Work`](StepErrorKind::Work).
    #[must_use]
    pub fn get_ref(&self) -> Option<&E> {
        match &self.repr {
            Repr::Work(e) => Some(e),
            _ => None,
        }
    }

    /// The work's error, for kind [`Work`](StepErrorKind::Work).
    #[must_use]
    pub fn into_inner(self) -> Option<E> {
        match self.repr {
            Repr::Work(e) => Some(e),
            _ => None,
        }
    }

    /// The store's error, for kinds [`Store`](StepErrorKind::Store),
    /// [`Unsupported`](StepErrorKind::Unsupported) and [`Conflict`](StepErrorKind::Conflict).
    #[must_use]
    pub fn store_error(&self) -> Option<&StoreError> {
        match &self.repr {
            Repr::Store(e) | Repr::Unsupported(e) => Some(e),
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(e) | Repr::Conflict(e) => Some(e),
            _ => None,
        }
    }
}

impl<E: fmt::Debug> fmt::Debug for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("StepError");
        d.field("kind", &self.kind()).field("step", &self.name);
        match &self.repr {
            Repr::Work(e) => d.field("error", e),
            Repr::Store(e) | Repr::Unsupported(e) => d.field("error", e),
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(e) | Repr::Conflict(e) => d.field("error", e),
            Repr::RecordInvalid(e) => d.field("error", e),
            Repr::SequenceChanged(recorded) => d.field("recorded", recorded),
            Repr::NameInvalid | Repr::NameReused | Repr::NotClaimed => &mut d,
        };
        d.finish()
    }
}

impl<E: fmt::Display> fmt::Display for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, place) = (&self.name, self.place);
        match &self.repr {
            Repr::Work(e) => write!(f, "step `{name}` failed: {e}"),
            Repr::Store(e) => write!(f, "the recorded steps could not be read: {e}"),
            Repr::Unsupported(e) => write!(f, "steps are not kept by this store: {e}"),
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(e) => {
                write!(f, "step `{name}` was rolled back: its record failed: {e}")
            }
            #[cfg(feature = "postgres")]
            Repr::Conflict(e) => write!(
                f,
                "step `{name}` conflicted with a concurrent transaction and was rolled back: {e}"
            ),
            Repr::RecordInvalid(e) => {
                write!(f, "the record of step `{name}` failed validation: {e}")
            }
            Repr::NameInvalid => write!(
                f,
                "step names are 1 to {MAX_NAME} bytes; got one of {} bytes",
                name.len()
            ),
            Repr::NameReused => write!(f, "step name `{name}` is used twice in one run"),
            Repr::NotClaimed => write!(
                f,
                "step `{name}` has no claimed key: steps run only in a request the idempotency layer claimed"
            ),
            Repr::SequenceChanged(recorded) => write!(
                f,
                "step {} is `{name}`, but the first run recorded `{recorded}` there: the steps changed order",
                place + 1
            ),
        }
    }
}

/// The source is the work's error, the [`StoreError`], or what failed to read a record.
impl<E: StdError + 'static> StdError for StepError<E> {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.repr {
            Repr::Work(e) => Some(e),
            Repr::Store(e) | Repr::Unsupported(e) => Some(e),
            #[cfg(feature = "postgres")]
            Repr::NotRecorded(e) | Repr::Conflict(e) => Some(e),
            Repr::RecordInvalid(e) => Some(&**e),
            Repr::NameInvalid | Repr::NameReused | Repr::SequenceChanged(_) | Repr::NotClaimed => {
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::engine::codec::Raw;
    use crate::engine::{Begin, Engine};
    use crate::store::MemoryStore;
    use std::future::ready;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_parts([n; 32], [n; 32])
    }

    async fn claimed<S: Store>(engine: &Engine<S>, k: StoreKey, fp: &[u8]) -> Steps {
        let fp = Fingerprint::builder().field(fp).finish();
        let Begin::Run(ticket) = engine.begin(k, fp).await.unwrap() else {
            panic!("a free key");
        };
        let steps = engine.steps(&ticket);
        // Let the claim go: a later claimant reads the same steps.
        engine.release(ticket).await.unwrap();
        steps
    }

    fn ok(v: &str) -> impl Future<Output = Result<String, String>> + use<> {
        ready(Ok(v.to_owned()))
    }

    /// The work of a step that must not run.
    async fn never() -> Result<String, String> {
        panic!("this step must not run");
    }

    #[tokio::test]
    async fn a_retry_with_the_steps_in_another_order_is_refused() {
        let engine = Engine::new(MemoryStore::new());
        let first = claimed(&engine, key(1), b"a").await;
        first.run("reserve", Raw, |_| ok("r")).await.unwrap();
        let retry = claimed(&engine, key(1), b"a").await;
        let e = retry.run("charge", Raw, |_| ok("c")).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::SequenceChanged);
        assert!(e.to_string().contains("`reserve`"), "{e}");
    }

    #[tokio::test]
    async fn names_empty_or_too_long_are_refused_and_take_no_place() {
        let engine = Engine::new(MemoryStore::new());
        let steps = claimed(&engine, key(2), b"a").await;
        let long = "x".repeat(MAX_NAME + 1);
        for bad in ["", long.as_str()] {
            let e = steps.run(bad, Raw, |_| ok("v")).await.unwrap_err();
            assert_eq!(e.kind(), StepErrorKind::NameInvalid);
        }
        let fine = "y".repeat(MAX_NAME);
        steps.run(&fine, Raw, |_| ok("v")).await.unwrap();
        // The refused names took no place: a retry's first step is still `fine`.
        let retry = claimed(&engine, key(2), b"a").await;
        let v: String = retry.run(&fine, Raw, |_| ok("again")).await.unwrap();
        assert_eq!(v, "v");
    }

    #[tokio::test]
    async fn unbound_steps_run_nothing() {
        let steps = Steps::unbound();
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::NotClaimed);
    }

    #[tokio::test]
    async fn overlapping_runs_keep_the_first_record() {
        let engine = Engine::new(MemoryStore::new());
        let a = claimed(&engine, key(3), b"a").await;
        let b = claimed(&engine, key(3), b"a").await;
        // Both read before either records, as after a lapsed lease.
        a.recorded::<()>(a.inner.bound.get().unwrap())
            .await
            .unwrap();
        b.recorded::<()>(b.inner.bound.get().unwrap())
            .await
            .unwrap();
        let first: String = a.run("charge", Raw, |_| ok("first")).await.unwrap();
        let second: String = b.run("charge", Raw, |_| ok("second")).await.unwrap();
        assert_eq!(first, "first");
        assert_eq!(second, "first", "the second run gets the first record back");
    }

    /// A memory store whose step records fail, as a store that is down; its reads too unless
    /// `reads` is set.
    struct Down(MemoryStore, bool);

    impl Store for Down {
        fn claim(
            &self,
            key: &StoreKey,
            fp: &Fingerprint,
            lease: Duration,
        ) -> impl Future<Output = Result<crate::store::Claim, StoreError>> + Send {
            self.0.claim(key, fp, lease)
        }
        fn complete(
            &self,
            key: &StoreKey,
            token: &crate::store::Token,
            fp: &Fingerprint,
            record: crate::store::Record,
            ttl: Duration,
        ) -> impl Future<Output = Result<bool, StoreError>> + Send {
            self.0.complete(key, token, fp, record, ttl)
        }
        fn release(
            &self,
            key: &StoreKey,
            token: &crate::store::Token,
        ) -> impl Future<Output = Result<bool, StoreError>> + Send {
            self.0.release(key, token)
        }
        fn renew(
            &self,
            key: &StoreKey,
            token: &crate::store::Token,
            lease: Duration,
        ) -> impl Future<Output = Result<bool, StoreError>> + Send {
            self.0.renew(key, token, lease)
        }
        fn forget(
            &self,
            key: &StoreKey,
            pending: bool,
        ) -> impl Future<Output = Result<crate::store::Forgotten, StoreError>> + Send {
            self.0.forget(key, pending)
        }
        async fn record_step(
            &self,
            _: &StoreKey,
            _: &StepId,
            _: Bytes,
            _: Duration,
        ) -> Result<StepRecorded, StoreError> {
            Err(StoreError::new(StoreErrorKind::Unavailable, "down"))
        }
        async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
            if self.1 {
                return Store::steps(&self.0, key).await;
            }
            Err(StoreError::new(StoreErrorKind::Unavailable, "down"))
        }
    }

    #[tokio::test]
    async fn a_store_that_cannot_read_the_steps_runs_none() {
        let engine = Engine::new(Down(MemoryStore::new(), false));
        let steps = claimed(&engine, key(5), b"a").await;
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::Store);
        assert!(e.is_retryable(), "a store outage is worth a retry");
        assert!(e.store_error().is_some());
    }

    #[tokio::test]
    async fn a_step_whose_record_fails_still_returns_its_result() {
        let engine = Engine::new(Down(MemoryStore::new(), true));
        let charges = std::sync::atomic::AtomicUsize::new(0);
        let charge = || {
            charges.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            ok("ch_1")
        };
        let steps = claimed(&engine, key(6), b"a").await;
        let charged: String = steps.run("charge", Raw, |_| charge()).await.unwrap();
        assert_eq!(
            charged, "ch_1",
            "the side effect happened: its result comes back"
        );
        // Nothing was recorded: a retry runs the step again, under the same derived key.
        let retry = claimed(&engine, key(6), b"a").await;
        retry.run("charge", Raw, |_| charge()).await.unwrap();
        assert_eq!(charges.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_tampered_step_record_is_refused_under_a_secret() {
        let secret = Secret::new(vec![7u8; 32]).unwrap();
        let store = Arc::new(MemoryStore::new());
        let engine = Engine::builder(Arc::clone(&store)).secret(secret).build();
        let steps = claimed(&engine, key(4), b"a").await;
        steps.run("charge", Raw, |_| ok("ch_1")).await.unwrap();
        // Another run's record under the same step id, written without the secret's tag.
        let bound = steps.inner.bound.get().unwrap();
        let id = bound.step_id(0);
        Store::forget(&*store, &key(4), true).await.unwrap();
        let forged = Bytes::from_static(b"\x01\x00\x06chargech_2");
        Store::record_step(&*store, &key(4), &id, forged, Duration::from_secs(60))
            .await
            .unwrap();
        let retry = claimed(&engine, key(4), b"a").await;
        let e = retry.run("charge", Raw, |_| ok("x")).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::RecordInvalid, "{e}");
    }
}
