//! Steps: a retry finishes partly done work instead of redoing it.

use crate::engine::codec::{BoxFuture, Codec};
use crate::engine::scope::DerivedKey;
use crate::engine::secret::{Secret, TAG_LEN};
use crate::metrics::{self, Op, StepResult, StoreTimer};
use crate::store::Fingerprint;
use crate::store::StoreKey;
use crate::store::{StepId, StepRecorded, Store, StoreError, StoreErrorKind, Token};
use bytes::{BufMut, Bytes, BytesMut};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The longest step name, in bytes.
const MAX_NAME: usize = 255;
/// The version byte that opens a step's stored value.
const VERSION: u8 = 2;
/// What a stored step holds before its name: version, the writer's fingerprint, name length.
const HEAD: usize = 1 + 32 + 2;
/// The version byte of a step sealed under an encrypting secret: version, the writer's
/// fingerprint and a nonce in the clear, then name length, name and payload encrypted, then
/// the seal's tag. Without the feature, or without a secret, such a record is refused.
const SEALED: u8 = 3;
const STEP_ID_DOMAIN: &[u8] = b"tower-idempotency step id v2\0";
const STEP_KEY_DOMAIN: &[u8] = b"tower-idempotency step key v2\0";
const STEP_TAG_DOMAIN: &[u8] = b"tower-idempotency step record v2\0";

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
/// Every handle of one claimed request is one sequence: the extractor taken twice,
/// [`Steps::current`], and [`Engine::steps`](crate::engine::Engine::steps) called again on the
/// same ticket all share their places and names.
///
/// # What is kept, and for how long
///
/// - Steps belong to one request: its key and its fingerprint. Each record carries the
///   fingerprint of the request that wrote it. Once a step of a key is recorded, another
///   request under the key (another body) runs no step: it gets
///   [`StepErrorKind::KeyReused`], and a door answers it as a reused key (HTTP 422
///   `key_reused`), releasing its claim. The first request's steps are kept for its retry.
/// - While the run's claim holds the key, its steps do not expire: each renewal keeps them
///   their retention past the new end of the lease.
/// - A released key keeps its steps for the engine's retention and lease, counted from the
///   release or the last step recorded; so does a key whose lease lapsed. The next claimant of
///   the key reads them. A retention shorter than the lease still keeps them for a lease: a
///   crash's retry comes after the lease lapsed.
/// - Completing the key deletes its steps, with the record's write: the record answers every
///   repeat, and the steps would serve nothing.
/// - [`Engine::forget`](crate::engine::Engine::forget) deletes them with the record.
/// - Under a [`Secret`](crate::Secret), each step's record is tagged; under an encrypting one
///   ([`Secret::encrypting`](crate::Secret::encrypting), feature `encrypt`), its name and value
///   are sealed, as a record's content is.
///
/// # The rules a run must keep
///
/// A step starts only while its run holds the claim. Before its work, the claim is checked
/// with the store ([`Store::prepare_step`]), which renews the lease. When the lease was lost to
/// another claimant, or the request has settled (completed, released or held; a handle moved
/// into a task that outlives its request), no step runs: [`StepErrorKind::ClaimLost`].
///
/// Steps are matched by place and name: the third step of the retry must be the third step of
/// the first run, under the same name. A name used twice in one run is refused with
/// [`StepErrorKind::NameReused`], and a retry whose names come in another order with
/// [`StepErrorKind::SequenceChanged`], also when a recorded step is called at another place.
/// Neither runs the step. A step's place is taken when [`run`](Self::run) is called, so steps
/// joined concurrently keep the order of the calls.
///
/// Two claimants of one key overlap only after a lease lapsed. If both finish the same step,
/// the first record wins: the second run's step gets the first's result back, with a warning
/// and the metric `idempotency_steps_total{result="overlapped"}`. Nothing is overwritten. If
/// the first record cannot be read back, the second run's own result is returned: its work
/// ran.
///
/// # The key to forward
///
/// Each step gets a [`DerivedKey`] of its own: derived from the request's store key and the
/// step's name, so the same on every retry of the request, and different for every step.
/// Forward it to a provider that de-duplicates, such as a payment API. Then a crash between
/// the provider's answer and the step's record is closed there too.
///
/// # When recording fails
///
/// A step whose work succeeded but whose record could not be written still returns its
/// result, with a warning: the side effect happened, and the handler should go on. A retry
/// after the request was released runs that step again, under the same derived key. A step's
/// record is written even when the caller stops waiting for the step after its work returned.
///
/// Reading the recorded steps fails before any step runs: a store that cannot say what was
/// done runs nothing. So does a store with no room for the step's record. A record that fails
/// validation (a record written under another [`Secret`](crate::Secret), or none) runs
/// nothing: [`StepErrorKind::RecordInvalid`], and the HTTP door answers 503 `record_invalid`,
/// releasing its claim.
///
/// [`Raw`]: crate::engine::Raw
#[cfg_attr(feature = "json", doc = "[`Json`]: crate::engine::Json")]
#[cfg_attr(not(feature = "json"), doc = "[`Json`]: crate::engine::Codec")]
#[derive(Clone)]
pub struct Steps {
    /// The claim these steps belong to: set when they are made, or when the key is claimed
    /// after a handler's arguments were taken (the `#[idempotent]` attribute).
    slot: Arc<OnceLock<Arc<ClaimCell>>>,
}

/// One claim as its run, its steps and its door see it: whether it still holds the key, and
/// the one sequence of steps every handle of the request shares.
pub(crate) struct ClaimCell {
    state: AtomicU8,
    /// What the steps found that binds the request's answer: another request's steps, or a
    /// step record that fails validation.
    found: AtomicU8,
    key: StoreKey,
    /// The request's fingerprint before keying: a step recorded under another key of the
    /// secret's ring is recognised by it.
    plain: Fingerprint,
    fingerprint: Fingerprint,
    token: Token,
    run: OnceLock<Run>,
}

impl fmt::Debug for ClaimCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimCell")
            .field("state", &self.state.load(Ordering::Relaxed))
            .field("found", &self.found())
            .finish_non_exhaustive()
    }
}

const LIVE: u8 = 0;
const LOST: u8 = 1;
const SETTLED: u8 = 2;

/// What a claim's steps found that the door must answer instead of the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// The recorded steps were written by another request: the key is that request's.
    KeyReused,
    /// A step record failed validation.
    RecordInvalid,
}

impl ClaimCell {
    pub(crate) fn new(
        key: StoreKey,
        plain: Fingerprint,
        fingerprint: Fingerprint,
        token: Token,
    ) -> Arc<Self> {
        Arc::new(Self {
            state: AtomicU8::new(LIVE),
            found: AtomicU8::new(0),
            key,
            plain,
            fingerprint,
            token,
            run: OnceLock::new(),
        })
    }

    /// The lease was lost to another claimant: no step starts.
    pub(crate) fn lose(&self) {
        let _ = self
            .state
            .compare_exchange(LIVE, LOST, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The request settled (completed, released, held or let go): no step starts.
    pub(crate) fn settle(&self) {
        self.state.store(SETTLED, Ordering::Release);
    }

    /// What the steps found that the door answers instead of the handler, if anything.
    pub(crate) fn found(&self) -> Option<Found> {
        match self.found.load(Ordering::Acquire) {
            1 => Some(Found::KeyReused),
            2 => Some(Found::RecordInvalid),
            _ => None,
        }
    }

    fn set_found(&self, found: Found) {
        let v = match found {
            Found::KeyReused => 1,
            Found::RecordInvalid => 2,
        };
        let _ = self
            .found
            .compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire);
    }

    /// This claim's steps, made with `settings` on first use.
    fn run(&self, settings: impl FnOnce() -> StepSettings) -> &Run {
        self.run.get_or_init(|| {
            let s = settings();
            Run {
                bound: Bound {
                    store: s.store,
                    timer: s.timer,
                    key: self.key,
                    plain: self.plain,
                    fingerprint: self.fingerprint,
                    token: self.token.clone(),
                    retention: s.retention,
                    lease: s.lease,
                    max_record_body: s.max_record_body,
                    secret: s.secret,
                    store_timeout: s.store_timeout,
                },
                recorded: tokio::sync::OnceCell::new(),
                names: Mutex::new(Vec::new()),
            }
        })
    }

    /// Whether a step may start: the claim is held, and nothing found binds the request.
    fn check<E>(&self, place: u32, name: &str) -> Result<(), StepError<E>> {
        match self.found() {
            Some(Found::KeyReused) => return Err(StepError::new(Repr::KeyReused, place, name)),
            Some(Found::RecordInvalid) => {
                return Err(StepError::new(
                    Repr::RecordInvalid("a step record of this key failed validation".into()),
                    place,
                    name,
                ));
            }
            None => {}
        }
        match self.state.load(Ordering::Acquire) {
            LIVE => Ok(()),
            LOST => Err(StepError::new(Repr::ClaimLost(Lost::Lease), place, name)),
            _ => Err(StepError::new(Repr::ClaimLost(Lost::Settled), place, name)),
        }
    }
}

/// The steps of one claim: what they need of the engine, what is recorded, and this run's
/// names in the order `run` was called.
pub(crate) struct Run {
    bound: Bound,
    recorded: tokio::sync::OnceCell<RecordedSteps>,
    names: Mutex<Vec<Box<str>>>,
}

/// The recorded steps of a key, verified and of this request.
struct RecordedSteps {
    by_id: HashMap<StepId, Bytes>,
    /// The names recorded, at whatever place.
    names: HashSet<Box<str>>,
}

pub(crate) struct Bound {
    store: Arc<dyn StepStore>,
    timer: StoreTimer,
    pub(crate) key: StoreKey,
    plain: Fingerprint,
    fingerprint: Fingerprint,
    token: Token,
    pub(crate) retention: Duration,
    lease: Duration,
    max_record_body: usize,
    secret: Option<Secret>,
    store_timeout: Duration,
}

impl fmt::Debug for Steps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let claim = self.slot.get();
        f.debug_struct("Steps")
            .field("key", &claim.map(|c| c.key))
            .field(
                "run",
                &claim
                    .and_then(|c| c.run.get())
                    .map_or(0, |r| r.names().len()),
            )
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
        retention: Duration,
    ) -> BoxFuture<'a, Result<StepRecorded, StoreError>>;
    fn prepare_step<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>>;
    /// The store itself, to tell which records it writes to.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn as_any(&self) -> &dyn std::any::Any;
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
        retention: Duration,
    ) -> BoxFuture<'a, Result<StepRecorded, StoreError>> {
        Box::pin(Store::record_step(self, key, step, value, retention))
    }

    fn prepare_step<'a>(
        &'a self,
        key: &'a StoreKey,
        token: &'a Token,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(Store::prepare_step(self, key, token, lease))
    }

    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    fn as_any(&self) -> &dyn std::any::Any {
        self
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
    /// How long a step's record is kept: the retention and a lease.
    pub(crate) retention: Duration,
    pub(crate) lease: Duration,
    pub(crate) max_record_body: usize,
    pub(crate) secret: Option<Secret>,
    /// The bound on each store operation.
    pub(crate) store_timeout: Duration,
}

tokio::task_local! {
    static CURRENT: Steps;
}

impl Steps {
    /// The steps of `claim`: every handle made of one claim is one sequence.
    pub(crate) fn of(claim: &Arc<ClaimCell>, settings: impl FnOnce() -> StepSettings) -> Self {
        claim.run(settings);
        Self {
            slot: Arc::new(OnceLock::from(Arc::clone(claim))),
        }
    }

    /// Steps not yet tied to a claim: a handler's argument taken before its key is claimed.
    #[cfg(any(feature = "axum", test))]
    pub(crate) fn unbound() -> Self {
        Self {
            slot: Arc::new(OnceLock::new()),
        }
    }

    /// Ties these steps to `claim`. Only the first call counts.
    #[cfg(feature = "macros")]
    pub(crate) fn bind(&self, claim: &Arc<ClaimCell>, settings: impl FnOnce() -> StepSettings) {
        claim.run(settings);
        let _ = self.slot.set(Arc::clone(claim));
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
        self.slot.get().map(|c| &c.key)
    }

    /// Runs the step `name` once for this request, or answers it from its record.
    ///
    /// `work` gets the step's [`DerivedKey`] to forward to its provider. Its `Ok` value is
    /// recorded with `codec` and returned. On a retry of the request, a step recorded before is
    /// decoded and returned, and `work` does not run. See [`Steps`] for the rules.
    ///
    /// # Errors
    /// A [`StepError`]: the work's own error (kind [`Work`](StepErrorKind::Work), not
    /// recorded), or a reason the step did not run: the claim is no longer this run's, the
    /// store could not read the recorded steps or has no room for the step's record, another
    /// request's steps are recorded under the key, a name that is empty, too long, used twice
    /// or out of order, or a record that fails validation.
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
            let (claim, run) = self.claim(place, &name)?;
            let bound = &run.bound;
            let id = match self.ready(claim, run, place, &name).await? {
                Ready::Recorded(id, value) => {
                    return bound.replay(place, &id, &name, &codec, value);
                }
                Ready::Run(id) => id,
            };
            let derived = bound.derived_key(&name);
            let value = work(derived)
                .await
                .map_err(|e| StepError::new(Repr::Work(e), place, &name))?;
            bound.record(place, &id, &name, &codec, value).await
        }
    }

    /// The claim of these steps and its steps, or why a step cannot run.
    pub(crate) fn claim<E>(
        &self,
        place: u32,
        name: &str,
    ) -> Result<(&ClaimCell, &Run), StepError<E>> {
        self.slot
            .get()
            .and_then(|c| Some((&**c, c.run.get()?)))
            .ok_or_else(|| StepError::new(Repr::NotClaimed, place, name))
    }

    /// Takes the next place for `name`, refusing a bad or repeated name, or steps of no claim.
    pub(crate) fn take_place<E>(&self, name: &str) -> Result<u32, StepError<E>> {
        let (_, run) = self.claim(0, name)?;
        let mut names = run.names();
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

    /// Before a step's work: the claim is held, the recorded steps are this request's, and
    /// either the step is recorded, or it is not recorded at any place and the store renewed
    /// the claim and has room for its record.
    pub(crate) async fn ready<E>(
        &self,
        claim: &ClaimCell,
        run: &Run,
        place: u32,
        name: &str,
    ) -> Result<Ready, StepError<E>> {
        let bound = &run.bound;
        claim.check(place, name)?;
        let id = bound.step_id(place);
        let recorded = self.recorded(claim, run, place, name).await?;
        if let Some(value) = recorded.by_id.get(&id) {
            return Ok(Ready::Recorded(id, value.clone()));
        }
        // Recorded at another place: the order changed, and running it would run it twice.
        if recorded.names.contains(name) {
            return Err(StepError::new(Repr::Moved, place, name));
        }
        claim.check(place, name)?;
        let started = bound.timer.start(Op::Renew);
        let prepared = crate::engine::bounded(
            bound.store_timeout,
            bound
                .store
                .prepare_step(&bound.key, &bound.token, bound.lease),
        )
        .await;
        bound.timer.record(Op::Renew, started, &prepared);
        match prepared {
            Ok(true) => claim.check(place, name).map(|()| Ready::Run(id)),
            Ok(false) => {
                claim.lose();
                tracing::warn!(key = ?bound.key, step = %name, "idempotency lease lost before a step; the step did not run");
                Err(StepError::new(Repr::ClaimLost(Lost::Lease), place, name))
            }
            Err(e) => {
                tracing::warn!(key = ?bound.key, step = %name, error = %e, "the store refused a step before it ran; the step did not run");
                Err(StepError::new(Repr::Store(e), place, name))
            }
        }
    }

    /// The request's recorded steps, read from the store and verified on first use.
    async fn recorded<'a, E>(
        &self,
        claim: &ClaimCell,
        run: &'a Run,
        place: u32,
        name: &str,
    ) -> Result<&'a RecordedSteps, StepError<E>> {
        let bound = &run.bound;
        let read = run
            .recorded
            .get_or_try_init(|| async {
                let started = bound.timer.start(Op::Steps);
                let read =
                    crate::engine::bounded(bound.store_timeout, bound.store.steps(&bound.key))
                        .await;
                bound.timer.record(Op::Steps, started, &read);
                match read {
                    Ok(read) => bound.verify_all(read),
                    Err(e) if e.kind() == StoreErrorKind::Unsupported => Err(Repr::Unsupported(e)),
                    Err(e) => Err(Repr::Store(e)),
                }
            })
            .await;
        read.map_err(|repr| {
            match &repr {
                Repr::KeyReused => {
                    claim.set_found(Found::KeyReused);
                    tracing::warn!(key = ?bound.key, step = %name, "idempotency steps of another request are recorded under this key; no step runs");
                }
                Repr::RecordInvalid(e) => {
                    claim.set_found(Found::RecordInvalid);
                    tracing::warn!(key = ?bound.key, step = %name, error = %e, "idempotency step record failed validation; no step runs");
                }
                _ => {}
            }
            StepError::new(repr, place, name)
        })
    }
}

/// What a step does, once its claim and the recorded steps are checked.
pub(crate) enum Ready {
    /// The step is recorded: its stored value, to replay.
    Recorded(StepId, Bytes),
    /// The step runs, under this id.
    Run(StepId),
}

impl Run {
    fn names(&self) -> std::sync::MutexGuard<'_, Vec<Box<str>>> {
        self.names
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The steps' settings and key.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn bound(&self) -> &Bound {
        &self.bound
    }
}

/// A step record, opened: its writer's fingerprint, its name and its payload.
struct Opened {
    fingerprint: Fingerprint,
    name: Bytes,
    payload: Bytes,
}

impl Bound {
    /// A step's id: the request's store key and the step's place. Not the fingerprint: a
    /// request with another body must find the steps recorded under its key.
    pub(crate) fn step_id(&self, place: u32) -> StepId {
        let mut h = Sha256::new();
        h.update(STEP_ID_DOMAIN);
        h.update(self.key.id());
        h.update(place.to_be_bytes());
        StepId::from_bytes(h.finalize().into())
    }

    fn derived_key(&self, name: &str) -> DerivedKey {
        let mut h = Sha256::new();
        h.update(STEP_KEY_DOMAIN);
        h.update(self.key.id());
        h.update(name.as_bytes());
        DerivedKey::from_digest(&h.finalize())
    }

    /// Whether a step record's fingerprint is this request's, under the secret's current key
    /// or another of its ring.
    fn is_own(&self, held: &Fingerprint) -> bool {
        *held == self.fingerprint
            || self
                .secret
                .as_ref()
                .is_some_and(|s| s.accepts_fingerprint(&self.plain, held))
    }

    /// The bytes stored for a step: version, this request's fingerprint, name, payload, and
    /// the tag under a secret; or, under an encrypting one, name and payload sealed.
    ///
    /// # Errors
    /// Only when sealing, with no random bytes for the nonce.
    fn encode(&self, id: &StepId, name: &str, payload: &[u8]) -> Result<Bytes, &'static str> {
        #[cfg(feature = "encrypt")]
        if let Some(secret) = self.secret.as_ref().filter(|s| s.encrypts()) {
            return self.encode_sealed(secret, id, name, payload);
        }
        let tag = if self.secret.is_some() { TAG_LEN } else { 0 };
        let mut out = BytesMut::with_capacity(HEAD + name.len() + payload.len() + tag);
        out.put_u8(VERSION);
        out.put_slice(self.fingerprint.as_bytes());
        // At most MAX_NAME bytes: checked when the place was taken.
        out.put_u16(u16::try_from(name.len()).unwrap_or(u16::MAX));
        out.put_slice(name.as_bytes());
        out.put_slice(payload);
        if let Some(secret) = &self.secret {
            let t = secret.tag(self.key.id(), &self.fingerprint, &tagged(id, &out));
            out.put_slice(&t);
        }
        Ok(out.freeze())
    }

    /// A step sealed under `secret`, bound to the store key, this request's fingerprint and the
    /// step's id.
    #[cfg(feature = "encrypt")]
    fn encode_sealed(
        &self,
        secret: &Secret,
        id: &StepId,
        name: &str,
        payload: &[u8],
    ) -> Result<Bytes, &'static str> {
        use crate::engine::secret::{NONCE_LEN, SEAL_TAG_LEN};
        let start = 1 + 32 + NONCE_LEN;
        let mut out =
            BytesMut::with_capacity(start + 2 + name.len() + payload.len() + SEAL_TAG_LEN);
        out.put_u8(SEALED);
        out.put_slice(self.fingerprint.as_bytes());
        out.put_bytes(0, NONCE_LEN);
        // At most MAX_NAME bytes: checked when the place was taken.
        out.put_u16(u16::try_from(name.len()).unwrap_or(u16::MAX));
        out.put_slice(name.as_bytes());
        out.put_slice(payload);
        let (nonce, tag) = secret
            .seal_content(
                self.key.id(),
                &self.fingerprint,
                &sealed_head(id),
                &mut out[start..],
            )
            .map_err(|e| e.reason())?;
        out[1 + 32..start].copy_from_slice(&nonce);
        out.put_slice(&tag);
        Ok(out.freeze())
    }

    /// A sealed step's name length, name and payload, decrypted under a key of the ring.
    #[cfg(feature = "encrypt")]
    fn open_sealed(
        &self,
        id: &StepId,
        fingerprint: &Fingerprint,
        value: &[u8],
    ) -> Result<Bytes, &'static str> {
        use crate::engine::secret::{NONCE_LEN, SEAL_TAG_LEN};
        let Some(secret) = &self.secret else {
            return Err("a step record is encrypted; only its secret opens it");
        };
        let start = 1 + 32 + NONCE_LEN;
        let tag_at = value
            .len()
            .checked_sub(SEAL_TAG_LEN)
            .filter(|at| *at >= start + 2)
            .ok_or("a step record cut short")?;
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&value[1 + 32..start]);
        let mut tag = [0u8; SEAL_TAG_LEN];
        tag.copy_from_slice(&value[tag_at..]);
        let mut content = BytesMut::from(&value[start..tag_at]);
        if !secret.open_content(
            self.key.id(),
            fingerprint,
            &sealed_head(id),
            &nonce,
            &mut content,
            &tag,
        ) {
            return Err("a step record that the secret cannot decrypt");
        }
        Ok(content.freeze())
    }

    /// Without the feature, no secret opens a sealed step: it is refused, never replayed.
    #[cfg(not(feature = "encrypt"))]
    #[allow(clippy::unused_self)]
    fn open_sealed(&self, _: &StepId, _: &Fingerprint, _: &[u8]) -> Result<Bytes, &'static str> {
        Err("a step record is encrypted; the `encrypt` feature opens it")
    }

    /// A stored step, its tag verified first, then its layout.
    fn open(&self, id: &StepId, mut value: Bytes) -> Result<Opened, &'static str> {
        if value.first() == Some(&SEALED) {
            if value.len() < 1 + 32 {
                return Err("a step record cut short");
            }
            let mut fp = [0u8; 32];
            fp.copy_from_slice(&value[1..33]);
            let fingerprint = Fingerprint::from_bytes(fp);
            let content = self.open_sealed(id, &fingerprint, &value)?;
            let len = usize::from(u16::from_be_bytes([content[0], content[1]]));
            if content.len() < 2 + len {
                return Err("a step record cut short");
            }
            let payload = content.slice(2 + len..);
            if payload.len() > self.max_record_body {
                return Err("a step record over the record limit");
            }
            return Ok(Opened {
                fingerprint,
                name: content.slice(2..2 + len),
                payload,
            });
        }
        let tag = if self.secret.is_some() {
            if value.len() < TAG_LEN {
                return Err("a step record too short for its tag");
            }
            Some(value.split_off(value.len() - TAG_LEN))
        } else {
            None
        };
        if value.len() < HEAD || value[0] != VERSION {
            return Err("a step record of an unknown version");
        }
        let mut fp = [0u8; 32];
        fp.copy_from_slice(&value[1..33]);
        let fingerprint = Fingerprint::from_bytes(fp);
        if let (Some(secret), Some(tag)) = (&self.secret, tag)
            && !secret.verify(self.key.id(), &fingerprint, &tagged(id, &value), &tag)
        {
            return Err("a step record whose tag does not match");
        }
        let len = usize::from(u16::from_be_bytes([value[33], value[34]]));
        if value.len() < HEAD + len {
            return Err("a step record cut short");
        }
        let payload = value.slice(HEAD + len..);
        if payload.len() > self.max_record_body {
            return Err("a step record over the record limit");
        }
        Ok(Opened {
            fingerprint,
            name: value.slice(HEAD..HEAD + len),
            payload,
        })
    }

    /// The steps read from the store, each verified, and all of this request. Every record
    /// is checked before any step runs: one that fails validation, or one of another request,
    /// binds the key.
    fn verify_all<E>(&self, read: Vec<(StepId, Bytes)>) -> Result<RecordedSteps, Repr<E>> {
        let mut names = HashSet::with_capacity(read.len());
        let mut other = false;
        for (id, value) in &read {
            let opened = self
                .open(id, value.clone())
                .map_err(|reason| Repr::RecordInvalid(reason.into()))?;
            // Compared only once the tag is verified: a forged record binds nothing.
            other |= !self.is_own(&opened.fingerprint);
            names.insert(String::from_utf8_lossy(&opened.name).into());
        }
        if other {
            return Err(Repr::KeyReused);
        }
        Ok(RecordedSteps {
            by_id: read.into_iter().collect(),
            names,
        })
    }

    /// The payload of a recorded step, checked against this run's name and the secret.
    fn read<E>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        value: Bytes,
    ) -> Result<Bytes, StepError<E>> {
        let opened = self
            .open(id, value)
            .map_err(|reason| StepError::new(Repr::RecordInvalid(reason.into()), place, name))?;
        if !self.is_own(&opened.fingerprint) {
            return Err(StepError::new(Repr::KeyReused, place, name));
        }
        if opened.name != name.as_bytes() {
            let recorded = String::from_utf8_lossy(&opened.name).into_owned();
            return Err(StepError::new(Repr::SequenceChanged(recorded), place, name));
        }
        Ok(opened.payload)
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

    /// The first record of a step that an overlapping run recorded too, decoded; or, when it
    /// cannot be read back, this run's own value: its work ran, and is never reported as not
    /// run.
    fn overlapped<T, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        first: Bytes,
        own: T,
    ) -> T {
        metrics::step(StepResult::Overlapped);
        match self.decoded::<T, std::convert::Infallible, C>(place, id, name, codec, first) {
            Ok(first) => {
                tracing::warn!(key = ?self.key, step = %name, "idempotency step ran in two overlapping runs (a lease lapsed); the first record wins, its result is returned");
                first
            }
            Err(e) => {
                tracing::warn!(key = ?self.key, step = %name, error = %e, "idempotency step ran in two overlapping runs (a lease lapsed); the first record cannot be read back, so this run's own result is returned");
                own
            }
        }
    }

    /// The first record of a step whose own run was rolled back for it (a step in a
    /// transaction): that record is the step's only result.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn taken_over<T, E, C: Codec<T>>(
        &self,
        place: u32,
        id: &StepId,
        name: &str,
        codec: &C,
        first: Bytes,
    ) -> Result<T, StepError<E>> {
        metrics::step(StepResult::Overlapped);
        tracing::warn!(key = ?self.key, step = %name, "idempotency step ran in two overlapping runs (a lease lapsed); this run's transaction was rolled back, the first record wins");
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
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn sealed<T, C: Codec<T>>(
        &self,
        id: &StepId,
        name: &str,
        codec: &C,
        value: &T,
    ) -> Result<Bytes, StoreError> {
        match codec.encode(value) {
            Ok(p) if p.len() <= self.max_record_body => self
                .encode(id, name, &p)
                .map_err(|reason| StoreError::new(StoreErrorKind::Protocol, reason)),
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

    /// Whether the steps were made by an engine over `store`: the same store, a clone of it, or
    /// a store over the same table of the same database under the same prefix.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn is_of<S: Store>(&self, store: &S) -> bool {
        if std::ptr::addr_eq(Arc::as_ptr(&self.store), std::ptr::from_ref(store)) {
            return true;
        }
        #[cfg(feature = "postgres")]
        {
            let ours = crate::store::postgres::PostgresStore::of(self.store.as_any());
            let theirs = crate::store::postgres::PostgresStore::of(store);
            if matches!((ours, theirs), (Some(a), Some(b)) if a.same_records(b)) {
                return true;
            }
        }
        #[cfg(feature = "sqlite")]
        {
            let ours = crate::store::sqlite::SqliteStore::of(self.store.as_any());
            let theirs = crate::store::sqlite::SqliteStore::of(store);
            if matches!((ours, theirs), (Some(a), Some(b)) if a.same_records(b)) {
                return true;
            }
        }
        #[cfg(feature = "mysql")]
        {
            let ours = crate::store::mysql::MySqlStore::of(self.store.as_any());
            let theirs = crate::store::mysql::MySqlStore::of(store);
            if matches!((ours, theirs), (Some(a), Some(b)) if a.same_records(b)) {
                return true;
            }
        }
        false
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
        let payload = match codec.encode(&value) {
            Ok(p) if p.len() <= self.max_record_body => p,
            Ok(p) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?self.key, step = %name, bytes = p.len(), limit = self.max_record_body, "idempotency step result over the record limit; not recorded, a retry runs the step again");
                return Ok(value);
            }
            Err(e) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?self.key, step = %name, error = %e, "idempotency step result cannot be encoded; not recorded, a retry runs the step again");
                return Ok(value);
            }
        };
        let stored = match self.encode(id, name, &payload) {
            Ok(stored) => stored,
            Err(reason) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?self.key, step = %name, error = %reason, "idempotency step result cannot be sealed; not recorded, a retry runs the step again");
                return Ok(value);
            }
        };
        // The work is done: its record is written on a task of its own, so that a caller that
        // stops waiting now does not lose it.
        let (store, timer, key, step, retention, limit) = (
            Arc::clone(&self.store),
            self.timer.clone(),
            self.key,
            *id,
            self.retention,
            self.store_timeout,
        );
        let write = async move {
            let started = timer.start(Op::RecordStep);
            let res =
                crate::engine::bounded(limit, store.record_step(&key, &step, stored, retention))
                    .await;
            timer.record(Op::RecordStep, started, &res);
            res
        };
        let res = match tokio::runtime::Handle::try_current() {
            Ok(rt) => rt.spawn(write).await.unwrap_or_else(|e| {
                Err(StoreError::with_source(
                    StoreErrorKind::Unavailable,
                    "the step's record was not written",
                    e,
                ))
            }),
            Err(_) => write.await,
        };
        match res {
            Ok(StepRecorded::Recorded) => {
                metrics::step(StepResult::Ran);
                Ok(value)
            }
            Ok(StepRecorded::Found(first)) => {
                Ok(self.overlapped(place, id, name, codec, first, value))
            }
            Err(e) => {
                metrics::step(StepResult::RecordFailed);
                tracing::warn!(key = ?self.key, step = %name, error = %e, "idempotency step ran but its record failed; a retry runs the step again");
                Ok(value)
            }
        }
    }
}

/// What a sealed step binds besides the store key and fingerprint: its layout and its id.
/// Apart from a sealed record's head ("TI" ...), so neither opens as the other.
#[cfg(feature = "encrypt")]
fn sealed_head(id: &StepId) -> [u8; 3 + 32] {
    let mut head = [0u8; 3 + 32];
    head[..3].copy_from_slice(&[b'T', b'S', SEALED]);
    head[3..].copy_from_slice(id.as_bytes());
    head
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
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    NotRecorded(StoreError),
    /// A step in a transaction that PostgreSQL rolled back for a concurrent one.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    Conflict(StoreError),
    Unsupported(StoreError),
    RecordInvalid(Box<dyn StdError + Send + Sync + 'static>),
    NameInvalid,
    NameReused,
    SequenceChanged(String),
    /// A step recorded at another place is called here.
    Moved,
    NotClaimed,
    /// Steps made by an engine over another store.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    OtherStore,
    ClaimLost(Lost),
    KeyReused,
}

/// How a run lost its claim.
#[derive(Debug, Clone, Copy)]
enum Lost {
    /// Its lease lapsed and another claimant took the key.
    Lease,
    /// Its request settled: completed, released, held or let go.
    Settled,
}

/// What a [`StepError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepErrorKind {
    /// The step's work returned an error. Nothing was recorded: the step runs again on a retry.
    Work,
    /// The store could not read the recorded steps, or could not renew the claim before the
    /// step, or has no room for the step's record ([`StoreError::kind`] `StoreFull` or
    /// `ScopeFull`). The step did not run. Or a step run in a
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
    /// The run no longer holds its key's claim: its lease was lost to another claimant, or
    /// its request has settled (completed, released or held), as for a handle moved into a
    /// task that outlives its request. The step did not run. The claimant that holds the key
    /// now runs the steps.
    ClaimLost,
    /// The steps recorded under this key belong to another request: the key was first used
    /// with another fingerprint (another body). The step did not run, and no step of this
    /// request runs. Doors answer as for a reused key: HTTP 422 `key_reused`.
    KeyReused,
}

impl StepErrorKind {
    /// The stable machine code, in the spelling of the HTTP layer's problem codes, e.g.
    /// `idempotency.work_failed`.
    #[must_use]
    pub fn code(self) -> &'static str {
        match self {
            Self::Work => "idempotency.work_failed",
            Self::Store => "idempotency.store_failed",
            Self::Unsupported => "idempotency.steps_unsupported",
            Self::RecordInvalid => "idempotency.record_invalid",
            Self::NameInvalid => "idempotency.step_name_invalid",
            Self::NameReused => "idempotency.step_name_reused",
            Self::SequenceChanged => "idempotency.step_sequence_changed",
            Self::NotClaimed => "idempotency.not_claimed",
            Self::Conflict => "idempotency.conflict",
            Self::ClaimLost => "idempotency.claim_lost",
            Self::KeyReused => "idempotency.key_reused",
        }
    }
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
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn work(e: E, place: u32, name: &str) -> Self {
        Self::new(Repr::Work(e), place, name)
    }

    /// A step in a transaction that was rolled back because its record or commit failed.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn not_recorded(e: StoreError, place: u32, name: &str) -> Self {
        Self::new(Repr::NotRecorded(e), place, name)
    }

    /// A step in a transaction given an engine over another store than its steps'.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn other_store(place: u32, name: &str) -> Self {
        Self::new(Repr::OtherStore, place, name)
    }

    /// A step in a transaction that PostgreSQL rolled back for a concurrent one.
    #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
    pub(crate) fn conflict(e: StoreError, place: u32, name: &str) -> Self {
        Self::new(Repr::Conflict(e), place, name)
    }

    /// What failed.
    #[must_use]
    pub fn kind(&self) -> StepErrorKind {
        match self.repr {
            Repr::Work(_) => StepErrorKind::Work,
            Repr::Store(_) => StepErrorKind::Store,
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::NotRecorded(_) => StepErrorKind::Store,
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::Conflict(_) => StepErrorKind::Conflict,
            Repr::Unsupported(_) => StepErrorKind::Unsupported,
            Repr::RecordInvalid(_) => StepErrorKind::RecordInvalid,
            Repr::NameInvalid => StepErrorKind::NameInvalid,
            Repr::NameReused => StepErrorKind::NameReused,
            Repr::SequenceChanged(_) | Repr::Moved => StepErrorKind::SequenceChanged,
            Repr::NotClaimed => StepErrorKind::NotClaimed,
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::OtherStore => StepErrorKind::NotClaimed,
            Repr::ClaimLost(_) => StepErrorKind::ClaimLost,
            Repr::KeyReused => StepErrorKind::KeyReused,
        }
    }

    /// The stable machine code of its [kind](Self::kind), e.g. `idempotency.work_failed`.
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.kind().code()
    }

    /// Whether running the request again may succeed: a conflict, or a store failure that [is
    /// retryable](StoreError::is_retryable). The work's own error is the work's to judge, so it
    /// gives `false`, as does every mistake in the handler's steps.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match &self.repr {
            Repr::Store(e) => e.is_retryable(),
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::NotRecorded(e) => e.is_retryable(),
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
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
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
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
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::NotRecorded(e) | Repr::Conflict(e) => d.field("error", e),
            Repr::RecordInvalid(e) => d.field("error", e),
            Repr::SequenceChanged(recorded) => d.field("recorded", recorded),
            Repr::ClaimLost(lost) => d.field("lost", lost),
            Repr::NameInvalid
            | Repr::NameReused
            | Repr::NotClaimed
            | Repr::Moved
            | Repr::KeyReused => &mut d,
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::OtherStore => &mut d,
        };
        d.finish()
    }
}

impl<E: fmt::Display> fmt::Display for StepError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, place) = (&self.name, self.place);
        match &self.repr {
            Repr::Work(e) => write!(f, "step `{name}` failed: {e}"),
            Repr::Store(e) => write!(
                f,
                "step `{name}` did not run: the store could not read the recorded steps or make room for its record: {e}"
            ),
            Repr::Unsupported(e) => write!(f, "steps are not kept by this store: {e}"),
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::NotRecorded(e) => {
                write!(f, "step `{name}` was rolled back: its record failed: {e}")
            }
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
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
            Repr::Moved => write!(
                f,
                "step {} is `{name}`, which the first run recorded at another place: the steps changed order",
                place + 1
            ),
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::OtherStore => write!(
                f,
                "step `{name}` belongs to steps made by an engine over another store: pass the engine that claimed the key"
            ),
            Repr::ClaimLost(Lost::Lease) => write!(
                f,
                "step `{name}` did not run: the lease was lost to another claimant of the key"
            ),
            Repr::ClaimLost(Lost::Settled) => write!(
                f,
                "step `{name}` did not run: its request has settled, and its steps run nothing more"
            ),
            Repr::KeyReused => write!(
                f,
                "step `{name}` did not run: the key's steps were recorded by a different request"
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
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::NotRecorded(e) | Repr::Conflict(e) => Some(e),
            Repr::RecordInvalid(e) => Some(&**e),
            Repr::NameInvalid
            | Repr::NameReused
            | Repr::SequenceChanged(_)
            | Repr::Moved
            | Repr::NotClaimed
            | Repr::ClaimLost(_)
            | Repr::KeyReused => None,
            #[cfg(any(feature = "postgres", feature = "mysql", feature = "sqlite"))]
            Repr::OtherStore => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::engine::codec::Raw;
    use crate::engine::{Begin, Engine, Ticket};
    use crate::store::MemoryStore;
    use std::future::ready;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_parts([n; 32], [n; 32])
    }

    async fn claimed<S: Store>(engine: &Engine<S>, k: StoreKey, fp: &[u8]) -> (Steps, Ticket) {
        let fp = Fingerprint::builder().field(fp).finish();
        let Begin::Run(ticket) = engine.begin(k, fp).await.unwrap() else {
            panic!("a free key");
        };
        (engine.steps(&ticket), ticket)
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
        let (first, ticket) = claimed(&engine, key(1), b"a").await;
        first.run("reserve", Raw, |_| ok("r")).await.unwrap();
        engine.release(ticket).await.unwrap();
        let (retry, _ticket) = claimed(&engine, key(1), b"a").await;
        let e = retry.run("charge", Raw, |_| ok("c")).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::SequenceChanged);
        assert!(e.to_string().contains("`reserve`"), "{e}");
    }

    #[tokio::test]
    async fn names_empty_or_too_long_are_refused_and_take_no_place() {
        let engine = Engine::new(MemoryStore::new());
        let (steps, ticket) = claimed(&engine, key(2), b"a").await;
        let long = "x".repeat(MAX_NAME + 1);
        for bad in ["", long.as_str()] {
            let e = steps.run(bad, Raw, |_| ok("v")).await.unwrap_err();
            assert_eq!(e.kind(), StepErrorKind::NameInvalid);
        }
        let fine = "y".repeat(MAX_NAME);
        steps.run(&fine, Raw, |_| ok("v")).await.unwrap();
        engine.release(ticket).await.unwrap();
        // The refused names took no place: a retry's first step is still `fine`.
        let (retry, _ticket) = claimed(&engine, key(2), b"a").await;
        let v: String = retry.run(&fine, Raw, |_| ok("again")).await.unwrap();
        assert_eq!(v, "v");
    }

    #[tokio::test]
    async fn unbound_steps_run_nothing() {
        let steps = Steps::unbound();
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::NotClaimed);
    }

    /// Runs `charge` in `first` with work that waits for `go`, while the key is taken from it
    /// and a second claimant runs the same step, recording `second`: as two runs after a
    /// lease lapsed.
    async fn overlap(
        engine: &Engine<MemoryStore>,
        k: StoreKey,
        second: Vec<u8>,
    ) -> (Result<String, StepError<String>>, Vec<u8>) {
        let (first, _t1) = claimed(engine, k, b"a").await;
        let (go, wait) = tokio::sync::oneshot::channel::<()>();
        let a = first.run("charge", Raw, |_| async move {
            wait.await.unwrap();
            Ok::<_, String>("first-run".to_owned())
        });
        let b = async {
            // `first` has checked its claim and started its work: its lease now lapses.
            tokio::task::yield_now().await;
            engine.forget_even_pending(&k).await.unwrap();
            let (steps, _t2) = claimed(engine, k, b"a").await;
            let r: Vec<u8> = steps
                .run("charge", Raw, |_| ready(Ok::<_, String>(second)))
                .await
                .unwrap();
            go.send(()).unwrap();
            r
        };
        tokio::join!(a, b)
    }

    #[tokio::test]
    async fn overlapping_runs_keep_the_first_record() {
        let engine = Engine::new(MemoryStore::new());
        let (late, early) = overlap(&engine, key(3), b"second-run".to_vec()).await;
        assert_eq!(early, b"second-run");
        assert_eq!(
            late.unwrap(),
            "second-run",
            "the later run gets the first record back"
        );
    }

    #[tokio::test]
    async fn overlapping_runs_whose_first_record_cannot_be_read_return_the_own_value() {
        let engine = Engine::new(MemoryStore::new());
        // The first record is not text: the later run's codec cannot read it back.
        let (late, _) = overlap(&engine, key(7), vec![0xff, 0xfe]).await;
        assert_eq!(
            late.expect("its work ran: never reported as not run"),
            "first-run"
        );
    }

    #[tokio::test]
    async fn steps_run_nothing_once_the_request_settled() {
        let engine = Engine::new(MemoryStore::new());
        let (steps, ticket) = claimed(&engine, key(8), b"a").await;
        steps.run("reserve", Raw, |_| ok("r")).await.unwrap();
        engine.release(ticket).await.unwrap();
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::ClaimLost, "{e}");
        // Nor after another claimant took the key: the released handle stays stopped.
        let (_retry, _ticket) = claimed(&engine, key(8), b"a").await;
        let e = steps.run("receipt", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::ClaimLost, "{e}");
    }

    #[tokio::test]
    async fn steps_of_a_lost_lease_run_nothing() {
        let engine = Engine::new(MemoryStore::new());
        let (steps, _ticket) = claimed(&engine, key(9), b"a").await;
        // The lease lapsed and another claimant holds the key.
        engine.forget_even_pending(&key(9)).await.unwrap();
        let (other, _t2) = claimed(&engine, key(9), b"a").await;
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::ClaimLost, "{e}");
        // The holder runs it.
        assert_eq!(other.run("charge", Raw, |_| ok("c")).await.unwrap(), "c");
    }

    #[tokio::test]
    async fn two_handles_of_one_claim_are_one_sequence() {
        let engine = Engine::new(MemoryStore::new());
        let (a, ticket) = claimed(&engine, key(10), b"a").await;
        let b = engine.steps(&ticket);
        a.run("reserve", Raw, |_| ok("r")).await.unwrap();
        let e = b.run("reserve", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::NameReused);
        b.run("charge", Raw, |_| ok("c")).await.unwrap();
        engine.release(ticket).await.unwrap();
        // The retry finds `reserve` then `charge`, one after the other.
        let (retry, _t) = claimed(&engine, key(10), b"a").await;
        assert_eq!(retry.run("reserve", Raw, |_| never()).await.unwrap(), "r");
        assert_eq!(retry.run("charge", Raw, |_| never()).await.unwrap(), "c");
    }

    #[tokio::test]
    async fn another_request_under_the_key_runs_no_step() {
        let engine = Engine::new(MemoryStore::new());
        let (first, ticket) = claimed(&engine, key(11), b"a").await;
        first.run("charge", Raw, |_| ok("c")).await.unwrap();
        engine.release(ticket).await.unwrap();
        let (other, ticket) = claimed(&engine, key(11), b"another body").await;
        let e = other.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::KeyReused, "{e}");
        let e = other.run("receipt", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::KeyReused, "{e}");
        assert_eq!(ticket.claim().found(), Some(Found::KeyReused));
        engine.release(ticket).await.unwrap();
        // The first request's retry still finds its step.
        let (retry, _t) = claimed(&engine, key(11), b"a").await;
        assert_eq!(retry.run("charge", Raw, |_| never()).await.unwrap(), "c");
    }

    #[tokio::test]
    async fn a_step_derived_key_is_the_same_for_another_body() {
        let engine = Engine::new(MemoryStore::new());
        let seen = Mutex::new(Vec::new());
        for fp in [b"a", b"b"] {
            let (steps, ticket) = claimed(&engine, key(12), fp).await;
            steps
                .run("charge", Raw, |k| {
                    seen.lock().unwrap().push(k);
                    ready(Err::<String, _>("declined".to_owned()))
                })
                .await
                .unwrap_err();
            engine.release(ticket).await.unwrap();
        }
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen[0], seen[1]);
    }

    #[tokio::test]
    async fn a_recorded_step_moved_to_a_failed_steps_place_is_refused() {
        let engine = Engine::new(MemoryStore::new());
        let (first, ticket) = claimed(&engine, key(13), b"a").await;
        first.run("a", Raw, |_| ok("a")).await.unwrap();
        first
            .run("b", Raw, |_| ready(Err::<String, _>("down".to_owned())))
            .await
            .unwrap_err();
        first.run("c", Raw, |_| ok("c")).await.unwrap();
        engine.release(ticket).await.unwrap();
        // The retry calls `c` where `b` failed: `c` was recorded, it must not run again.
        let (retry, _t) = claimed(&engine, key(13), b"a").await;
        retry.run("a", Raw, |_| never()).await.unwrap();
        let e = retry.run("c", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::SequenceChanged, "{e}");
    }

    #[tokio::test]
    async fn steps_outlive_a_retention_shorter_than_the_lease() {
        let clock = crate::store::clock::ManualClock::new();
        let store = MemoryStore::builder().clock(clock.clone()).build().unwrap();
        let engine = Engine::builder(store)
            .retention(Duration::from_secs(1))
            .build();
        // A crash: nothing settles the key; its retry comes once the lease lapsed.
        let (first, _crashed) = claimed(&engine, key(14), b"a").await;
        first.run("charge", Raw, |_| ok("c")).await.unwrap();
        clock.advance(engine.lease() + Duration::from_millis(500));
        let (retry, _t) = claimed(&engine, key(14), b"a").await;
        assert_eq!(retry.run("charge", Raw, |_| never()).await.unwrap(), "c");
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
            retention: Duration,
        ) -> impl Future<Output = Result<bool, StoreError>> + Send {
            self.0.complete(key, token, fp, record, retention)
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
        let (steps, _t) = claimed(&engine, key(5), b"a").await;
        let e = steps.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::Store);
        assert_eq!(e.step(), "charge", "the error names its step");
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
        let (steps, ticket) = claimed(&engine, key(6), b"a").await;
        let charged: String = steps.run("charge", Raw, |_| charge()).await.unwrap();
        assert_eq!(
            charged, "ch_1",
            "the side effect happened: its result comes back"
        );
        engine.release(ticket).await.unwrap();
        // Nothing was recorded: a retry runs the step again, under the same derived key.
        let (retry, _t) = claimed(&engine, key(6), b"a").await;
        retry.run("charge", Raw, |_| charge()).await.unwrap();
        assert_eq!(charges.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_tampered_step_record_is_refused_under_a_secret() {
        let secret = Secret::new(vec![7u8; 32]).unwrap();
        let store = Arc::new(MemoryStore::new());
        let engine = Engine::builder(Arc::clone(&store)).secret(secret).build();
        let (steps, ticket) = claimed(&engine, key(4), b"a").await;
        steps.run("charge", Raw, |_| ok("ch_1")).await.unwrap();
        // Another run's record under the same step id, written without the secret's tag.
        let id = steps.claim::<()>(0, "").unwrap().1.bound.step_id(0);
        engine.release(ticket).await.unwrap();
        Store::forget(&*store, &key(4), true).await.unwrap();
        let mut forged = vec![VERSION];
        forged.extend_from_slice(
            engine
                .keyed(Fingerprint::builder().field(b"a").finish())
                .as_bytes(),
        );
        forged.extend_from_slice(b"\x00\x06chargech_2");
        forged.extend_from_slice(&[0; TAG_LEN]);
        Store::record_step(
            &*store,
            &key(4),
            &id,
            forged.into(),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        let (retry, ticket) = claimed(&engine, key(4), b"a").await;
        let e = retry.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::RecordInvalid, "{e}");
        assert_eq!(ticket.claim().found(), Some(Found::RecordInvalid));
    }

    /// A sealed step opens only intact, at its own step id, under its key and fingerprint:
    /// each byte flipped, each shorter length, another place's id, another store key and a
    /// bound with no secret are refused, and nothing panics.
    #[cfg(feature = "encrypt")]
    #[tokio::test]
    async fn a_sealed_step_opens_only_intact_at_its_own_place() {
        let secret = Secret::new(vec![7u8; 32]).unwrap().encrypting();
        let engine = Engine::builder(MemoryStore::new())
            .secret(secret.clone())
            .build();
        let (steps, _t) = claimed(&engine, key(5), b"a").await;
        let bound = &steps.claim::<()>(0, "").unwrap().1.bound;
        let id = bound.step_id(0);
        let sealed = bound.encode(&id, "charge", b"ch_1 Jane").unwrap();
        assert_eq!(sealed[0], SEALED);
        assert!(!sealed.windows(4).any(|w| w == b"Jane" || w == b"char"));
        let opened = bound.open(&id, sealed.clone()).unwrap();
        assert_eq!(
            (&opened.name[..], &opened.payload[..]),
            (&b"charge"[..], &b"ch_1 Jane"[..])
        );

        for i in 0..sealed.len() {
            let mut b = sealed.to_vec();
            b[i] ^= 0x01;
            assert!(bound.open(&id, b.into()).is_err(), "byte {i} flipped");
        }
        for len in 0..sealed.len() {
            assert!(bound.open(&id, sealed.slice(..len)).is_err(), "{len} bytes");
        }
        assert!(
            bound.open(&bound.step_id(1), sealed.clone()).is_err(),
            "another place"
        );
        let (other, _t) = claimed(&engine, key(6), b"a").await;
        let other = &other.claim::<()>(0, "").unwrap().1.bound;
        assert!(
            other.open(&id, sealed.clone()).is_err(),
            "another store key"
        );
        let plain = Engine::new(MemoryStore::new());
        let (unkeyed, _t) = claimed(&plain, key(5), b"a").await;
        let unkeyed = &unkeyed.claim::<()>(0, "").unwrap().1.bound;
        assert!(unkeyed.open(&id, sealed).is_err(), "no secret");
    }

    #[tokio::test]
    async fn a_rotated_secret_fails_closed_on_the_recorded_steps() {
        let store = Arc::new(MemoryStore::new());
        let old = Engine::builder(Arc::clone(&store))
            .secret(Secret::new(vec![1u8; 32]).unwrap())
            .build();
        let (steps, ticket) = claimed(&old, key(15), b"a").await;
        steps.run("charge", Raw, |_| ok("c")).await.unwrap();
        old.release(ticket).await.unwrap();
        let new = Engine::builder(Arc::clone(&store))
            .secret(Secret::new(vec![2u8; 32]).unwrap())
            .build();
        let (retry, _t) = claimed(&new, key(15), b"a").await;
        let e = retry.run("charge", Raw, |_| never()).await.unwrap_err();
        assert_eq!(e.kind(), StepErrorKind::RecordInvalid, "{e}");
    }

    /// A memory store whose step records first yield, as a networked store waits for its
    /// answer.
    struct Slow(MemoryStore);

    impl Store for Slow {
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
            retention: Duration,
        ) -> impl Future<Output = Result<bool, StoreError>> + Send {
            self.0.complete(key, token, fp, record, retention)
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
            key: &StoreKey,
            step: &StepId,
            value: Bytes,
            retention: Duration,
        ) -> Result<StepRecorded, StoreError> {
            tokio::task::yield_now().await;
            Store::record_step(&self.0, key, step, value, retention).await
        }
        fn steps(
            &self,
            key: &StoreKey,
        ) -> impl Future<Output = Result<Vec<(StepId, Bytes)>, StoreError>> + Send {
            Store::steps(&self.0, key)
        }
    }

    #[tokio::test]
    async fn a_step_dropped_after_its_work_still_records_it() {
        let engine = Engine::new(Slow(MemoryStore::new()));
        let (steps, ticket) = claimed(&engine, key(16), b"a").await;
        let charged = std::sync::atomic::AtomicBool::new(false);
        {
            let mut step = std::pin::pin!(steps.run("charge", Raw, |_| {
                charged.store(true, std::sync::atomic::Ordering::SeqCst);
                ok("ch_1")
            }));
            // Polled once: the work returned, its record is on its way; then the caller leaves.
            tokio::select! {
                biased;
                _ = &mut step => panic!("the record waits for the store"),
                () = ready(()) => {}
            }
        }
        assert!(charged.load(std::sync::atomic::Ordering::SeqCst));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        engine.release(ticket).await.unwrap();
        let (retry, _t) = claimed(&engine, key(16), b"a").await;
        assert_eq!(retry.run("charge", Raw, |_| never()).await.unwrap(), "ch_1");
    }
}
