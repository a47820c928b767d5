//! The store conformance suite, with feature `test-util`. It has one test per behaviour of the
//! [`Store`] contract, for a store you wrote.
//!
//! ```ignore
//! // tests/conformance.rs of your crate, with `tokio` (features `macros`, `rt-multi-thread`,
//! // `time`) as a dev-dependency.
//! use std::time::Duration;
//! use tower_idempotency::conformance::Harness;
//!
//! struct MyHarness { store: MyStore }
//!
//! impl Harness for MyHarness {
//!     type S = MyStore;
//!     fn store(&self) -> &MyStore { &self.store }
//!     // The store's time: a real sleep for a store whose expiry runs on a server.
//!     async fn advance(&self, d: Duration) { tokio::time::sleep(d).await }
//! }
//!
//! tower_idempotency::store_conformance!(async { MyHarness { store: MyStore::connect().await } });
//! ```
//!
//! Implement [`Harness`] for your store: the store, and a way to move its time. Then expand
//! [`store_conformance!`](crate::store_conformance) with an expression that evaluates to a
//! future of a fresh harness. It is evaluated once per test. Your store is then held to the
//! same behaviour as the stores of this crate. The [`store`](crate::store) module docs show a
//! whole store of your own with its harness.
//!
//! Every test uses fresh random keys, each in its own random scope. So tests may share one
//! server and run in parallel, and keys spread over cluster slots. Expiry tests use a 300 ms
//! lease or retention and move time 600 ms, so a store on real time stays fast; the few that
//! must keep a claim live across several calls use a 2 s lease and move time 3 s. Everything
//! else uses a 60 s lease and retention that never lapses during a test. Each test panics
//! with a message saying what the store did wrong.
//!
//! [`random_key`], [`fingerprint`] and [`record`] make inputs for tests of your own.

// Test code: a failed expectation panics with its reason.
#![allow(clippy::unwrap_used, clippy::missing_panics_doc)]

use crate::Store;
use crate::engine::Raw;
use crate::engine::{Begin, Engine, Fingerprint, Recorded};
use crate::store::{
    Claim, Forgotten, Inspected, Record, StepId, StepRecorded, StoreError, StoreErrorKind,
    StoreKey, Token,
};
use bytes::Bytes;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// What the suite needs from a backend: the store, and a way to move its time.
pub trait Harness: Send + Sync + 'static {
    /// The store under test.
    type S: Store;

    /// The store under test.
    fn store(&self) -> &Self::S;

    /// Moves the store's time forward by at least `d`. For the memory store that is a
    /// `ManualClock` advance. For Redis it is a real sleep, since its expiry is server-side `PX`.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;

    /// Whether the store keeps the steps of requests' work: [`Store::record_step`] and
    /// [`Store::steps`]. The default is `true`. A store that keeps none says `false`, and the
    /// suite then checks that both answer [`StoreErrorKind::Unsupported`].
    fn keeps_steps(&self) -> bool {
        true
    }
}

/// Expands the conformance suite: one `#[tokio::test]` per behaviour. Each starts with
/// `let h = $make.await;`. So `$make` is an expression evaluating to a future of a fresh
/// [`Harness`].
///
/// Expand the macro once per module, as the test names are fixed. For a second configuration
/// of the same store, expand it inside a submodule.
#[macro_export]
macro_rules! store_conformance {
    ($make:expr) => {
        $crate::store_conformance!(@current_thread $make;
            claim_on_free_key_is_claimed,
            second_claim_sees_pending_with_first_fingerprint,
            claim_then_replay,
            other_fingerprint_gets_stored_fingerprint,
            lease_expiry_frees_key,
            record_expires_after_retention,
            stale_token_is_fenced,
            renew_extends_lease,
            renew_needs_the_holding_token,
            release_frees_pending_key,
            release_after_complete_keeps_record,
            complete_is_written_once,
            complete_without_holder_writes_record,
            keys_are_independent,
            engine_run_in_flight_reused_replay,
            engine_release_lets_work_run_again,
            forget_deletes_a_record_and_a_pending_claim_only_when_asked,
            lease_left_is_none_or_within_the_lease,
            a_step_is_recorded_once_and_the_first_record_wins,
            steps_outlive_a_released_claim_and_belong_to_their_key,
            steps_expire_after_their_retention,
            forget_deletes_a_keys_steps,
            completing_a_key_frees_its_steps,
            a_refused_complete_keeps_the_steps,
            steps_last_while_a_claim_holds_their_key,
            renewing_a_claim_keeps_its_steps,
            steps_outlive_a_release_and_a_lapsed_lease,
            engine_steps_resume_after_a_release,
            engine_completion_frees_the_steps,
            a_step_recorded_after_completion_is_not_kept,
            inspect_reads_absent_pending_done_and_absent_again,
            inspect_changes_nothing,
            engine_inspect_reads_a_key_as_a_repeat_would,
        );

        #[::tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_claims_have_one_winner() {
            let h = $make.await;
            $crate::conformance::concurrent_claims_have_one_winner(h).await;
        }
    };
    (@current_thread $make:expr; $($name:ident),+ $(,)?) => {
        $(
            #[::tokio::test]
            async fn $name() {
                let h = $make.await;
                $crate::conformance::$name(h).await;
            }
        )+
    };
}

#[doc(hidden)]
/// A lease or retention that never lapses during a test.
pub const LONG: Duration = Duration::from_secs(60);
#[doc(hidden)]
/// The lease or retention of expiry tests that only wait past it ([`PAST_SHORT`]): a check
/// inside a lease or retention on real time takes a seconds-wide one.
pub const SHORT: Duration = Duration::from_millis(300);
#[doc(hidden)]
/// How far expiry tests move time: comfortably past [`SHORT`].
pub const PAST_SHORT: Duration = Duration::from_millis(600);

/// A fresh random key in a fresh random scope.
pub fn random_key() -> StoreKey {
    StoreKey::from_parts(random_bytes(), random_bytes())
}

#[doc(hidden)]
/// Two fresh random keys in one fresh random scope.
pub fn random_keys_in_one_scope() -> (StoreKey, StoreKey) {
    let scope = random_bytes();
    (
        StoreKey::from_parts(scope, random_bytes()),
        StoreKey::from_parts(scope, random_bytes()),
    )
}

fn random_bytes() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).expect("the OS random source works");
    b
}

/// The fingerprint of a request named `tag`.
pub fn fingerprint(tag: &str) -> Fingerprint {
    Fingerprint::builder().field(tag.as_bytes()).finish()
}

/// An opaque record named `tag`, with bytes a text-only store would mangle.
pub fn record(tag: &str) -> Record {
    let mut b = tag.as_bytes().to_vec();
    b.extend_from_slice(&[0, 0xff, 0x80, b'\r', b'\n', b'"', b'\\', 0x7f, 0]);
    b.extend((0..=255u8).rev());
    Record::from_bytes(Bytes::from(b))
}

#[doc(hidden)]
/// A token no claim handed out.
pub fn stranger() -> Token {
    Token::generate().expect("the OS random source works")
}

#[doc(hidden)]
/// Claims `key`, which must be free, and returns the token.
pub async fn claim_free<S: Store>(
    store: &S,
    key: &StoreKey,
    fp: &Fingerprint,
    lease: Duration,
) -> Token {
    match store.claim(key, fp, lease).await {
        Ok(Claim::Claimed(token)) => token,
        other => panic!("a claim on the free key {key:?} must be Claimed, got {other:?}"),
    }
}

#[doc(hidden)]
/// Claims `key`, which the claim must find pending, and returns the holder's fingerprint.
pub async fn expect_pending<S: Store>(store: &S, key: &StoreKey, why: &str) -> Fingerprint {
    match store.claim(key, &fingerprint("probe"), LONG).await {
        Ok(Claim::Pending { fingerprint }) => fingerprint,
        other => panic!("{why}: a claim on {key:?} must find it Pending, got {other:?}"),
    }
}

#[doc(hidden)]
/// Claims `key`, which the claim must find done, and returns the fingerprint and record.
pub async fn expect_done<S: Store>(store: &S, key: &StoreKey, why: &str) -> (Fingerprint, Record) {
    match store.claim(key, &fingerprint("probe"), LONG).await {
        Ok(Claim::Done {
            fingerprint,
            record,
        }) => (fingerprint, record),
        other => panic!("{why}: a claim on {key:?} must find it Done, got {other:?}"),
    }
}

fn ok<T>(result: Result<T, StoreError>, step: &str) -> T {
    result.unwrap_or_else(|e| panic!("{step} failed: {e} ({e:?})"))
}

// ---- the behaviours -----------------------------------------------------------------------

#[doc(hidden)]
/// A claim on a free key holds it.
pub async fn claim_on_free_key_is_claimed<H: Harness>(h: H) {
    let key = random_key();
    claim_free(h.store(), &key, &fingerprint("a"), LONG).await;
}

#[doc(hidden)]
/// A second claim finds the key pending, with the first claimant's fingerprint.
pub async fn second_claim_sees_pending_with_first_fingerprint<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    claim_free(s, &key, &fingerprint("first"), LONG).await;
    match ok(s.claim(&key, &fingerprint("first"), LONG).await, "claim") {
        Claim::Pending { fingerprint: held } => assert_eq!(
            held,
            fingerprint("first"),
            "Pending must carry the holder's fingerprint"
        ),
        other => panic!("a held key must answer Pending, got {other:?}"),
    }
}

#[doc(hidden)]
/// After `complete`, a claim finds the key done with its fingerprint and exactly the record.
pub async fn claim_then_replay<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(
        ok(
            s.complete(&key, &token, &fp, record("a"), LONG).await,
            "complete"
        ),
        "the holder's complete must write the record"
    );
    for round in 0..2 {
        let (held, stored) = expect_done(s, &key, "after complete").await;
        assert_eq!(
            held, fp,
            "Done must carry the completing request's fingerprint"
        );
        assert_eq!(
            stored.as_bytes(),
            record("a").as_bytes(),
            "Done must return exactly the record's bytes (read {round})"
        );
    }
}

#[doc(hidden)]
/// A claim with another fingerprint still gets the stored fingerprint: the engine, not the
/// store, decides that the key was reused.
pub async fn other_fingerprint_gets_stored_fingerprint<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let token = claim_free(s, &key, &fingerprint("a"), LONG).await;
    match ok(s.claim(&key, &fingerprint("b"), LONG).await, "claim") {
        Claim::Pending { fingerprint: held } => {
            assert_eq!(
                held,
                fingerprint("a"),
                "Pending must carry the holder's fingerprint, not the caller's"
            );
        }
        other => panic!("a held key must answer Pending to any fingerprint, got {other:?}"),
    }
    ok(
        s.complete(&key, &token, &fingerprint("a"), record("a"), LONG)
            .await,
        "complete",
    );
    match ok(s.claim(&key, &fingerprint("b"), LONG).await, "claim") {
        Claim::Done {
            fingerprint: held,
            record: stored,
        } => {
            assert_eq!(
                held,
                fingerprint("a"),
                "Done must carry the stored fingerprint, not the caller's"
            );
            assert_eq!(stored, record("a"));
        }
        other => panic!("a done key must answer Done to any fingerprint, got {other:?}"),
    }
}

#[doc(hidden)]
/// Once a lease lapses, a new claimant claims the key under a new token.
pub async fn lease_expiry_frees_key<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    // Seconds wide: the check inside the lease runs on real time on a server.
    let first = claim_free(s, &key, &fingerprint("a"), SECONDS_LEASE).await;
    expect_pending(s, &key, "inside the lease").await;
    h.advance(PAST_SECONDS_LEASE).await;
    let second = match ok(s.claim(&key, &fingerprint("b"), LONG).await, "claim") {
        Claim::Claimed(token) => token,
        other => panic!("a key whose lease lapsed must be claimable, got {other:?}"),
    };
    assert_ne!(first, second, "each claim must get a fresh token");
    assert_eq!(
        expect_pending(s, &key, "after the new claim").await,
        fingerprint("b"),
        "the new claimant holds the key"
    );
}

#[doc(hidden)]
/// Once a record's retention ends, the key is free again.
pub async fn record_expires_after_retention<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), SECONDS_LEASE)
            .await,
        "complete"
    ));
    // Seconds wide, as above.
    expect_done(s, &key, "inside the retention").await;
    h.advance(PAST_SECONDS_LEASE).await;
    match ok(s.claim(&key, &fp, LONG).await, "claim") {
        Claim::Claimed(_) => {}
        other => panic!("a record past its retention must be gone, got {other:?}"),
    }
}

#[doc(hidden)]
/// After a lease lapsed and another claim took the key, the first token's late steps leave the
/// new holder alone, pending or done.
pub async fn stale_token_is_fenced<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let (fa, fb) = (fingerprint("a"), fingerprint("b"));
    let stale = claim_free(s, &key, &fa, SHORT).await;
    h.advance(PAST_SHORT).await;
    let holder = claim_free(s, &key, &fb, LONG).await;

    assert!(
        !ok(
            s.complete(&key, &stale, &fa, record("a"), LONG).await,
            "stale complete"
        ),
        "a stale token's complete must return false"
    );
    assert!(
        !ok(s.release(&key, &stale).await, "stale release"),
        "a stale token's release must return false"
    );
    assert!(
        !ok(s.renew(&key, &stale, LONG).await, "stale renew"),
        "a stale token's renew must return false"
    );
    assert_eq!(
        expect_pending(s, &key, "after the stale steps").await,
        fb,
        "the new holder's claim must be intact"
    );

    assert!(ok(
        s.complete(&key, &holder, &fb, record("b"), LONG).await,
        "complete"
    ));
    assert!(!ok(
        s.complete(&key, &stale, &fa, record("a"), LONG).await,
        "stale complete"
    ));
    assert!(!ok(s.release(&key, &stale).await, "stale release"));
    let (held, stored) = expect_done(s, &key, "after the stale steps on a done key").await;
    assert_eq!(
        (held, stored),
        (fb, record("b")),
        "the new holder's record must be intact"
    );
}

#[doc(hidden)]
/// Renewing with the holding token extends the lease past its original end, and the renewed
/// lease ends in turn.
pub async fn renew_extends_lease<H: Harness>(h: H) {
    // A store on a server sleeps for real: each deadline is at least 2 s from the step that
    // must land before it, so a loaded machine cannot turn the answer around.
    const LEASE: Duration = Duration::from_secs(5);
    let s = h.store();
    let key = random_key();
    let token = claim_free(s, &key, &fingerprint("a"), LEASE).await;
    h.advance(Duration::from_millis(2500)).await;
    assert!(
        ok(s.renew(&key, &token, LEASE).await, "renew"),
        "the holder's renew inside the lease must succeed"
    );
    h.advance(Duration::from_secs(3)).await; // 5.5 s: past the original lease, not the renewed one
    expect_pending(s, &key, "after the original lease, inside the renewed one").await;
    h.advance(Duration::from_millis(2500)).await; // 8 s: past the renewed lease (7.5 s)
    match ok(s.claim(&key, &fingerprint("b"), LONG).await, "claim") {
        Claim::Claimed(_) => {}
        other => panic!("a renewed lease must lapse in turn, got {other:?}"),
    }
}

#[doc(hidden)]
/// Renew succeeds only for the token that holds the key pending.
pub async fn renew_needs_the_holding_token<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(
        !ok(s.renew(&key, &stranger(), LONG).await, "renew"),
        "renew with a token that never held the key must return false"
    );
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    assert!(
        !ok(s.renew(&key, &token, LONG).await, "renew"),
        "renew of a done key must return false"
    );
    assert_eq!(
        expect_done(s, &key, "after renew on a done key").await,
        (fp, record("a"))
    );

    // A lapsed lease is not brought back.
    let key = random_key();
    let token = claim_free(s, &key, &fp, SHORT).await;
    h.advance(PAST_SHORT).await;
    assert!(
        !ok(s.renew(&key, &token, LONG).await, "renew"),
        "renew after the lease lapsed must return false"
    );
    match ok(s.claim(&key, &fp, LONG).await, "claim") {
        Claim::Claimed(_) => {}
        other => panic!("a failed renew must not bring a lapsed lease back, got {other:?}"),
    }
}

#[doc(hidden)]
/// `forget` deletes a completed record. It keeps a pending claim unless told, and deletes it
/// when told. It finds nothing under a free or expired key. A forgotten key is free to claim.
/// The forgotten claim's late record is written when nothing holds the key, and refused when
/// a retry does.
pub async fn forget_deletes_a_record_and_a_pending_claim_only_when_asked<H: Harness>(h: H) {
    let s = h.store();
    assert_eq!(
        ok(s.forget(&random_key(), true).await, "forget"),
        Forgotten::Nothing,
        "a free key has nothing to forget"
    );

    let done = random_key();
    let token = claim_free(s, &done, &fingerprint("a"), LONG).await;
    assert!(ok(
        s.complete(&done, &token, &fingerprint("a"), record("a"), LONG)
            .await,
        "complete"
    ));
    assert_eq!(
        ok(s.forget(&done, false).await, "forget"),
        Forgotten::Record
    );
    let _again = claim_free(s, &done, &fingerprint("b"), LONG).await;

    let pending = random_key();
    let first = claim_free(s, &pending, &fingerprint("p"), LONG).await;
    assert_eq!(
        ok(s.forget(&pending, false).await, "forget"),
        Forgotten::KeptPending,
        "a pending claim is kept unless asked for"
    );
    expect_pending(s, &pending, "after a forget that keeps pending claims").await;
    assert_eq!(
        ok(s.forget(&pending, true).await, "forget"),
        Forgotten::Pending
    );
    // The forgotten claim's holder finishes late: nothing holds the key, so its record is
    // written (as after a lapsed lease).
    assert!(
        ok(
            s.complete(&pending, &first, &fingerprint("p"), record("p"), LONG)
                .await,
            "a late complete after forget",
        ),
        "a late complete after forget, with nothing holding the key, is written"
    );
    match ok(s.claim(&pending, &fingerprint("p"), LONG).await, "claim") {
        Claim::Done { record: r, .. } => assert_eq!(r, record("p")),
        other => panic!("the late record must be found, got {other:?}"),
    }
    // When a retry claimed the key after the forget, the first's late complete is refused.
    let retried = random_key();
    let first = claim_free(s, &retried, &fingerprint("r"), LONG).await;
    assert_eq!(
        ok(s.forget(&retried, true).await, "forget"),
        Forgotten::Pending
    );
    let _retry = claim_free(s, &retried, &fingerprint("r"), LONG).await;
    assert!(
        !ok(
            s.complete(&retried, &first, &fingerprint("r"), record("r1"), LONG)
                .await,
            "a late complete after forget and a retry",
        ),
        "the first's late complete must leave the retry's claim alone"
    );
    expect_pending(s, &retried, "after the first's refused late complete").await;

    let expired = random_key();
    let _ = claim_free(s, &expired, &fingerprint("e"), SHORT).await;
    h.advance(PAST_SHORT).await;
    assert_eq!(
        ok(s.forget(&expired, true).await, "forget"),
        Forgotten::Nothing,
        "an expired claim is nothing"
    );
}

#[doc(hidden)]
/// `lease_left` is `None` for a free key and a completed record. For a pending claim it is
/// `None`, when the store cannot tell, or at most the lease.
pub async fn lease_left_is_none_or_within_the_lease<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    assert_eq!(ok(s.lease_left(&key).await, "lease_left"), None);
    let token = claim_free(s, &key, &fingerprint("a"), LONG).await;
    if let Some(left) = ok(s.lease_left(&key).await, "lease_left") {
        assert!(
            left <= LONG && left > Duration::ZERO,
            "{left:?} left of {LONG:?}"
        );
    }
    assert!(ok(
        s.complete(&key, &token, &fingerprint("a"), record("a"), LONG)
            .await,
        "complete"
    ));
    assert_eq!(
        ok(s.lease_left(&key).await, "lease_left"),
        None,
        "a completed record has no lease"
    );
}

#[doc(hidden)]
/// Release frees a key held pending by the token, and nothing else.
pub async fn release_frees_pending_key<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let first = claim_free(s, &key, &fingerprint("a"), LONG).await;
    assert!(
        !ok(s.release(&key, &stranger()).await, "release"),
        "release with another token must return false"
    );
    expect_pending(s, &key, "after a stranger's release").await;
    assert!(
        ok(s.release(&key, &first).await, "release"),
        "the holder's release must delete the key"
    );
    let _second = claim_free(s, &key, &fingerprint("b"), LONG).await;
    assert!(
        !ok(s.release(&key, &first).await, "release"),
        "a released token must not release the next holder"
    );
    assert_eq!(
        expect_pending(s, &key, "after the old token's release").await,
        fingerprint("b")
    );
    assert!(
        !ok(s.release(&random_key(), &first).await, "release"),
        "release of a free key must return false"
    );

    // A lapsed lease no longer holds the key, even with nobody claiming since.
    let key = random_key();
    let token = claim_free(s, &key, &fingerprint("a"), SHORT).await;
    h.advance(PAST_SHORT).await;
    assert!(
        !ok(s.release(&key, &token).await, "release"),
        "release after the lease lapsed must return false"
    );
}

#[doc(hidden)]
/// Release after complete returns false and the record stays.
pub async fn release_after_complete_keeps_record<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    assert!(
        !ok(s.release(&key, &token).await, "release"),
        "release must only delete a pending key"
    );
    assert_eq!(
        expect_done(s, &key, "after release on a done key").await,
        (fp, record("a"))
    );
}

#[doc(hidden)]
/// A done key is not overwritten by a second complete with the same token.
pub async fn complete_is_written_once<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(ok(
        s.complete(&key, &token, &fp, record("first"), LONG).await,
        "complete"
    ));
    assert!(
        !ok(
            s.complete(&key, &token, &fp, record("second"), LONG).await,
            "complete"
        ),
        "a second complete on a done key must return false"
    );
    assert_eq!(
        expect_done(s, &key, "after the second complete").await,
        (fp, record("first"))
    );
}

#[doc(hidden)]
/// `complete` writes the record when nothing holds the key: the lease lapsed and nobody claimed
/// since, or nobody ever claimed it.
pub async fn complete_without_holder_writes_record<H: Harness>(h: H) {
    let s = h.store();
    let fp = fingerprint("a");
    let key = random_key();
    let token = claim_free(s, &key, &fp, SHORT).await;
    h.advance(PAST_SHORT).await;
    assert!(
        ok(
            s.complete(&key, &token, &fp, record("a"), LONG).await,
            "complete"
        ),
        "complete after the lease lapsed, with no new holder, must write the record"
    );
    assert_eq!(
        expect_done(s, &key, "after a late complete").await,
        (fp, record("a"))
    );

    let key = random_key();
    assert!(
        ok(
            s.complete(&key, &stranger(), &fp, record("b"), LONG).await,
            "complete"
        ),
        "complete on a key nobody ever held must write the record"
    );
    assert_eq!(
        expect_done(s, &key, "after complete on a free key").await,
        (fp, record("b"))
    );

    // A lapsed lease holds nothing: any token's complete writes.
    let key = random_key();
    claim_free(s, &key, &fp, SHORT).await;
    h.advance(PAST_SHORT).await;
    assert!(
        ok(
            s.complete(&key, &stranger(), &fp, record("c"), LONG).await,
            "complete"
        ),
        "complete on a key whose lease lapsed must write the record, whatever the token"
    );
    assert_eq!(
        expect_done(s, &key, "after complete on a lapsed key").await,
        (fp, record("c"))
    );
}

#[doc(hidden)]
/// Keys of one scope and of other scopes do not interfere.
pub async fn keys_are_independent<H: Harness>(h: H) {
    let s = h.store();
    let (k1, k2) = random_keys_in_one_scope();
    let k3 = random_key();
    let t1 = claim_free(s, &k1, &fingerprint("1"), LONG).await;
    claim_free(s, &k2, &fingerprint("2"), LONG).await;
    claim_free(s, &k3, &fingerprint("3"), LONG).await;
    assert!(ok(
        s.complete(&k1, &t1, &fingerprint("1"), record("1"), LONG)
            .await,
        "complete"
    ));
    assert_eq!(
        expect_done(s, &k1, "the completed key").await,
        (fingerprint("1"), record("1"))
    );
    assert_eq!(
        expect_pending(s, &k2, "the same scope's other key").await,
        fingerprint("2")
    );
    assert_eq!(
        expect_pending(s, &k3, "another scope's key").await,
        fingerprint("3")
    );
}

#[doc(hidden)]
/// 64 tasks claim one fresh key at once: exactly one wins, the others see the winner pending.
pub async fn concurrent_claims_have_one_winner<H: Harness>(h: H) {
    const TASKS: usize = 64;
    let h = Arc::new(h);
    let key = random_key();
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS));
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let (h, barrier) = (Arc::clone(&h), Arc::clone(&barrier));
            tokio::spawn(async move {
                let fp = fingerprint(&format!("claimant {i}"));
                barrier.wait().await;
                (fp, h.store().claim(&key, &fp, LONG).await)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for task in tasks {
        let (fp, result) = task.await.expect("a claimant task panicked");
        match ok(result, "concurrent claim") {
            Claim::Claimed(_) => winners.push(fp),
            Claim::Pending { fingerprint } => seen.push(fingerprint),
            other => panic!("a concurrent claim must be Claimed or Pending, got {other:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {TASKS} concurrent claims must win"
    );
    assert!(
        seen.iter().all(|fp| *fp == winners[0]),
        "every loser must see the winner's fingerprint"
    );
}

#[doc(hidden)]
/// The engine over the store: run, in flight, key reused, replay.
pub async fn engine_run_in_flight_reused_replay<H: Harness>(h: H) {
    let engine = Engine::builder(HarnessStore(Arc::new(h)))
        .lease(LONG)
        .retention(LONG)
        .build();
    let key = random_key();
    let (fa, fb) = (fingerprint("a"), fingerprint("b"));
    let ticket = match ok(engine.begin(key, fa).await, "begin") {
        Begin::Run(ticket) => ticket,
        other => panic!("a free key must be run, got {other:?}"),
    };
    assert!(
        matches!(ok(engine.begin(key, fa).await, "begin"), Begin::InFlight),
        "the same request while the first runs is in flight"
    );
    assert!(
        matches!(ok(engine.begin(key, fb).await, "begin"), Begin::KeyReused),
        "another request under a held key is a reused key"
    );
    let response = Recorded::new(
        201,
        vec![
            (
                Bytes::from_static(b"content-type"),
                Bytes::from_static(b"application/json"),
            ),
            (
                Bytes::from_static(b"location"),
                Bytes::from_static(b"/orders/7"),
            ),
        ],
        Some(Bytes::from_static(b"{\"id\":7}")),
    );
    assert!(
        ok(engine.complete(ticket, &response).await, "complete"),
        "the ticket's complete must be written"
    );
    match ok(engine.begin(key, fa).await, "begin") {
        Begin::Replayed(replayed) => assert_eq!(
            replayed, response,
            "the replay must equal the stored response"
        ),
        other => panic!("the same request after completion must be replayed, got {other:?}"),
    }
    assert!(
        matches!(ok(engine.begin(key, fb).await, "begin"), Begin::KeyReused),
        "another request under a done key is a reused key"
    );
}

#[doc(hidden)]
/// A released ticket lets the same request run again.
pub async fn engine_release_lets_work_run_again<H: Harness>(h: H) {
    let engine = Engine::builder(HarnessStore(Arc::new(h)))
        .lease(LONG)
        .retention(LONG)
        .build();
    let key = random_key();
    let fp = fingerprint("a");
    let Begin::Run(ticket) = ok(engine.begin(key, fp).await, "begin") else {
        panic!("a free key must be run");
    };
    assert!(ok(engine.release(ticket).await, "release"));
    assert!(
        matches!(ok(engine.begin(key, fp).await, "begin"), Begin::Run(_)),
        "a released key must be run again"
    );
}

/// A fresh random step id.
fn random_step() -> StepId {
    StepId::from_bytes(random_bytes())
}

/// The key's steps, sorted, as a store may return them in any order.
async fn steps_of<S: Store>(s: &S, key: &StoreKey) -> Vec<(StepId, Bytes)> {
    let mut steps = ok(s.steps(key).await, "steps");
    steps.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    steps
}

/// For a store that keeps no steps: both calls say so. Returns whether the store keeps steps.
async fn keeps_steps<H: Harness>(h: &H) -> bool {
    if h.keeps_steps() {
        return true;
    }
    let s = h.store();
    let recorded = s
        .record_step(
            &random_key(),
            &random_step(),
            Bytes::from_static(b"x"),
            LONG,
        )
        .await;
    assert!(
        matches!(&recorded, Err(e) if e.kind() == StoreErrorKind::Unsupported),
        "a store that keeps no steps must answer record_step with Unsupported, got {recorded:?}"
    );
    let read = s.steps(&random_key()).await;
    assert!(
        matches!(&read, Err(e) if e.kind() == StoreErrorKind::Unsupported),
        "a store that keeps no steps must answer steps with Unsupported, got {read:?}"
    );
    false
}

#[doc(hidden)]
/// A step is recorded if absent: a second record of it keeps the first bytes and returns them.
pub async fn a_step_is_recorded_once_and_the_first_record_wins<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let key = random_key();
    assert!(
        steps_of(s, &key).await.is_empty(),
        "a fresh key has no steps"
    );
    let (a, b) = (random_step(), random_step());
    let first = record("first").into_bytes();
    assert_eq!(
        ok(
            s.record_step(&key, &a, first.clone(), LONG).await,
            "record_step"
        ),
        StepRecorded::Recorded,
        "a step not yet recorded is recorded"
    );
    assert_eq!(
        ok(
            s.record_step(&key, &a, Bytes::from_static(b"second"), LONG)
                .await,
            "record_step again"
        ),
        StepRecorded::Found(first.clone()),
        "a step recorded before keeps its first bytes and returns them"
    );
    assert_eq!(
        ok(
            s.record_step(&key, &b, Bytes::new(), LONG).await,
            "record_step"
        ),
        StepRecorded::Recorded,
        "another step of the key is recorded beside it, even with an empty value"
    );
    let mut want = vec![(a, first), (b, Bytes::new())];
    want.sort_by(|x, y| x.0.as_bytes().cmp(y.0.as_bytes()));
    assert_eq!(
        steps_of(s, &key).await,
        want,
        "the key's steps, byte for byte"
    );
}

#[doc(hidden)]
/// Steps are kept whatever happens to the key's claim, and another key never sees them.
pub async fn steps_outlive_a_released_claim_and_belong_to_their_key<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let (key, other) = random_keys_in_one_scope();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    let step = random_step();
    let value = Bytes::from_static(b"charged");
    ok(
        s.record_step(&key, &step, value.clone(), LONG).await,
        "record_step",
    );
    assert!(ok(s.release(&key, &token).await, "release"));
    assert_eq!(
        steps_of(s, &key).await,
        vec![(step, value.clone())],
        "a released key keeps its steps"
    );
    let _token = claim_free(s, &key, &fp, LONG).await;
    assert_eq!(
        steps_of(s, &key).await,
        vec![(step, value)],
        "the next claimant reads them"
    );
    assert!(
        steps_of(s, &other).await.is_empty(),
        "another key of the same scope has no steps"
    );
}

#[doc(hidden)]
/// Steps expire with the retention given when the last one was recorded.
pub async fn steps_expire_after_their_retention<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let key = random_key();
    let step = random_step();
    ok(
        s.record_step(&key, &step, Bytes::from_static(b"old"), SHORT)
            .await,
        "record_step",
    );
    h.advance(PAST_SHORT).await;
    assert!(
        steps_of(s, &key).await.is_empty(),
        "steps past their retention are gone"
    );
    assert_eq!(
        ok(
            s.record_step(&key, &step, Bytes::from_static(b"new"), LONG)
                .await,
            "record_step"
        ),
        StepRecorded::Recorded,
        "an expired step is recorded anew"
    );
    assert_eq!(
        steps_of(s, &key).await,
        vec![(step, Bytes::from_static(b"new"))]
    );
}

#[doc(hidden)]
/// Forgetting a key deletes its steps: the key is used anew.
pub async fn forget_deletes_a_keys_steps<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    let token = claim_free(s, &key, &fp, LONG).await;
    ok(
        s.record_step(&key, &random_step(), Bytes::from_static(b"x"), LONG)
            .await,
        "record_step",
    );
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    assert_eq!(ok(s.forget(&key, false).await, "forget"), Forgotten::Record);
    assert!(
        steps_of(s, &key).await.is_empty(),
        "a forgotten key has no steps left"
    );
}

#[doc(hidden)]
/// A written complete deletes the key's steps: its record answers every repeat, so they serve
/// nothing. The same when the complete is written after the lease lapsed with nothing holding
/// the key.
pub async fn completing_a_key_frees_its_steps<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let fp = fingerprint("a");
    let key = random_key();
    let token = claim_free(s, &key, &fp, LONG).await;
    for value in [&b"reserved"[..], b"charged"] {
        ok(
            s.record_step(&key, &random_step(), Bytes::copy_from_slice(value), LONG)
                .await,
            "record_step",
        );
    }
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    assert!(
        steps_of(s, &key).await.is_empty(),
        "a completed key keeps no steps"
    );
    assert_eq!(
        expect_done(s, &key, "after the complete").await,
        (fp, record("a")),
        "its record answers"
    );

    let key = random_key();
    let token = claim_free(s, &key, &fp, SHORT).await;
    ok(
        s.record_step(&key, &random_step(), Bytes::from_static(b"x"), LONG)
            .await,
        "record_step",
    );
    h.advance(PAST_SHORT).await;
    assert!(
        ok(
            s.complete(&key, &token, &fp, record("a"), LONG).await,
            "late complete"
        ),
        "a late complete on a free key is written"
    );
    assert!(
        steps_of(s, &key).await.is_empty(),
        "a late complete that is written frees the steps too"
    );
}

#[doc(hidden)]
/// A step recorded after its key completed (a run whose step future was dropped after its
/// work returned, or an overlapping run after a lapsed lease) is not kept: the record answers
/// every repeat, and a completed key has no steps.
pub async fn a_step_recorded_after_completion_is_not_kept<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let fp = fingerprint("a");
    let key = random_key();
    let token = claim_free(s, &key, &fp, LONG).await;
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    ok(
        s.record_step(&key, &random_step(), Bytes::from_static(b"late"), LONG)
            .await,
        "a late record_step",
    );
    assert!(
        steps_of(s, &key).await.is_empty(),
        "a completed key keeps no steps, also one recorded after the completion"
    );
    assert_eq!(
        expect_done(s, &key, "after the late step").await,
        (fp, record("a")),
        "its record still answers"
    );
}

#[doc(hidden)]
/// A complete that is refused, because another claim took the key after the lease lapsed,
/// leaves the steps: the new holder's run answers from them. Its own complete frees them.
pub async fn a_refused_complete_keeps_the_steps<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let (fa, fb) = (fingerprint("a"), fingerprint("b"));
    let key = random_key();
    let stale = claim_free(s, &key, &fa, SHORT).await;
    let step = random_step();
    let value = Bytes::from_static(b"charged");
    ok(
        s.record_step(&key, &step, value.clone(), LONG).await,
        "record_step",
    );
    h.advance(PAST_SHORT).await;
    let holder = claim_free(s, &key, &fb, LONG).await;
    assert!(
        !ok(
            s.complete(&key, &stale, &fa, record("a"), LONG).await,
            "stale complete"
        ),
        "a stale token's complete is refused"
    );
    assert_eq!(
        steps_of(s, &key).await,
        vec![(step, value)],
        "a refused complete leaves the steps"
    );
    assert!(ok(
        s.complete(&key, &holder, &fb, record("b"), LONG).await,
        "complete"
    ));
    assert!(
        steps_of(s, &key).await.is_empty(),
        "the holder's complete frees them"
    );
    assert!(
        !ok(
            s.complete(&key, &stale, &fa, record("a"), LONG).await,
            "stale complete"
        ),
        "a stale token's complete on a done key is refused"
    );
}

#[doc(hidden)]
/// While a live claim holds the key, its steps do not expire, even with a retention shorter
/// than the lease: a crash's retry, after the lease, still needs them.
pub async fn steps_last_while_a_claim_holds_their_key<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let fp = fingerprint("a");
    let key = random_key();
    let _token = claim_free(s, &key, &fp, LONG).await;
    let step = random_step();
    let value = Bytes::from_static(b"charged");
    ok(
        s.record_step(&key, &step, value.clone(), SHORT).await,
        "record_step",
    );
    h.advance(PAST_SHORT).await;
    expect_pending(s, &key, "inside the lease").await;
    assert_eq!(
        steps_of(s, &key).await,
        vec![(step, value)],
        "steps past their retention are kept while the claim holds the key"
    );
}

/// A lease long enough to outlast a few store calls on a loaded machine, and short enough to
/// lapse in a test.
const SECONDS_LEASE: Duration = Duration::from_secs(2);
/// Past [`SECONDS_LEASE`], by a margin of seconds.
const PAST_SECONDS_LEASE: Duration = Duration::from_secs(3);

#[doc(hidden)]
/// Renewing the claim, by `renew` or by `prepare_step` (the default of which is `renew`),
/// keeps the key's steps at least their retention past the new lease: a run that keeps
/// renewing may record its next step long after the last, and a crash's retry still needs
/// every one.
pub async fn renewing_a_claim_keeps_its_steps<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let fp = fingerprint("a");
    let (renewed, prepared) = (random_key(), random_key());
    let mut first = Vec::new();
    for key in [&renewed, &prepared] {
        let token = claim_free(s, key, &fp, SECONDS_LEASE).await;
        let step = random_step();
        ok(
            s.record_step(key, &step, Bytes::from_static(b"reserved"), SHORT)
                .await,
            "record_step",
        );
        first.push((token, step));
    }
    assert!(ok(s.renew(&renewed, &first[0].0, LONG).await, "renew"));
    assert!(ok(
        s.prepare_step(&prepared, &first[1].0, LONG).await,
        "prepare_step"
    ));
    h.advance(PAST_SECONDS_LEASE).await;
    for (key, (_, step)) in [&renewed, &prepared].into_iter().zip(&first) {
        expect_pending(s, key, "inside the renewed lease").await;
        let next = random_step();
        ok(
            s.record_step(key, &next, Bytes::from_static(b"charged"), SHORT)
                .await,
            "record_step",
        );
        let mut want = vec![
            (*step, Bytes::from_static(b"reserved")),
            (next, Bytes::from_static(b"charged")),
        ];
        want.sort_by(|x, y| x.0.as_bytes().cmp(y.0.as_bytes()));
        assert_eq!(
            steps_of(s, key).await,
            want,
            "a renewed claim keeps its first step past the first lease and its retention"
        );
    }
}

#[doc(hidden)]
/// A released key keeps its steps for at least their retention after the last record. A
/// lapsed lease keeps them for at least their retention after the lease's end. The next
/// claimant reads them.
pub async fn steps_outlive_a_release_and_a_lapsed_lease<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let s = h.store();
    let fp = fingerprint("a");
    let (released, lapsed) = (random_key(), random_key());
    let (a, b) = (random_step(), random_step());
    let value = Bytes::from_static(b"charged");

    let token = claim_free(s, &released, &fp, LONG).await;
    ok(
        s.record_step(&released, &a, value.clone(), Duration::from_secs(5))
            .await,
        "record_step",
    );
    assert!(ok(s.release(&released, &token).await, "release"));

    let _lapsing = claim_free(s, &lapsed, &fp, SECONDS_LEASE).await;
    ok(
        s.record_step(&lapsed, &b, value.clone(), PAST_SECONDS_LEASE)
            .await,
        "record_step",
    );
    h.advance(PAST_SECONDS_LEASE).await;

    let _retry = claim_free(s, &released, &fp, LONG).await;
    assert_eq!(
        steps_of(s, &released).await,
        vec![(a, value.clone())],
        "a released key keeps its steps for their retention"
    );
    let _retry = claim_free(s, &lapsed, &fp, LONG).await;
    assert_eq!(
        steps_of(s, &lapsed).await,
        vec![(b, value)],
        "a lapsed lease keeps its steps for their retention after the lease"
    );
}

#[doc(hidden)]
/// Through the engine: a retry after a release answers the steps that completed from their
/// records and runs the first that did not.
pub async fn engine_steps_resume_after_a_release<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let engine = Engine::builder(HarnessStore(Arc::new(h)))
        .lease(LONG)
        .retention(LONG)
        .build();
    let key = random_key();
    let fp = fingerprint("order");
    let runs = std::sync::atomic::AtomicUsize::new(0);
    let count = || {
        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    };

    let Begin::Run(ticket) = ok(engine.begin(key, fp).await, "begin") else {
        panic!("a free key must be run");
    };
    let steps = engine.steps(&ticket);
    let charge: String = steps
        .run("charge", Raw, |k| async move {
            count();
            Ok::<_, ()>(format!("ch-{k}"))
        })
        .await
        .unwrap();
    let failed = steps
        .run("receipt", Raw, |_| async { Err::<String, _>("mail down") })
        .await;
    assert!(failed.is_err(), "the receipt's error is returned");
    assert!(ok(engine.release(ticket).await, "release"));

    let Begin::Run(ticket) = ok(engine.begin(key, fp).await, "begin") else {
        panic!("a released key must be run again");
    };
    let steps = engine.steps(&ticket);
    let again: String = steps
        .run("charge", Raw, |_| async {
            count();
            Ok::<_, ()>(String::from("charged twice"))
        })
        .await
        .unwrap();
    assert_eq!(again, charge, "the charge is answered from its record");
    let receipt: String = steps
        .run("receipt", Raw, |_| async {
            Ok::<_, ()>(String::from("sent"))
        })
        .await
        .unwrap();
    assert_eq!(receipt, "sent", "the receipt runs on the retry");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the charge ran once over both runs"
    );
}

#[doc(hidden)]
/// Through the engine, with its default lease and retention: a completed request keeps its
/// record and no steps.
pub async fn engine_completion_frees_the_steps<H: Harness>(h: H) {
    if !keeps_steps(&h).await {
        return;
    }
    let h = Arc::new(h);
    let engine = Engine::new(HarnessStore(Arc::clone(&h)));
    let key = random_key();
    let fp = fingerprint("order");
    let Begin::Run(ticket) = ok(engine.begin(key, fp).await, "begin") else {
        panic!("a free key must be run");
    };
    let steps = engine.steps(&ticket);
    let charge: String = steps
        .run(
            "charge",
            Raw,
            |k| async move { Ok::<_, ()>(format!("ch-{k}")) },
        )
        .await
        .unwrap();
    assert_eq!(
        ok(h.store().steps(&key).await, "steps").len(),
        1,
        "the step is recorded under the request's key"
    );
    let response = Recorded::new(201, Vec::new(), Some(Bytes::from(charge)));
    assert!(ok(engine.complete(ticket, &response).await, "complete"));
    assert!(
        ok(h.store().steps(&key).await, "steps").is_empty(),
        "a completed request keeps no steps"
    );
    match ok(engine.begin(key, fp).await, "begin") {
        Begin::Replayed(replayed) => assert_eq!(replayed, response),
        other => panic!("a completed request is replayed, got {other:?}"),
    }
}

#[doc(hidden)]
/// `inspect` reads a free key as absent, a claim as pending with its fingerprint and the lease
/// left (at most the lease), a completed key as done with its fingerprint, exactly its record
/// and the retention left (at most the retention), and the key as absent again once it is
/// forgotten, released, or its lease or retention has run out.
pub async fn inspect_reads_absent_pending_done_and_absent_again<H: Harness>(h: H) {
    let s = h.store();
    let key = random_key();
    let fp = fingerprint("a");
    assert_eq!(
        ok(s.inspect(&key).await, "inspect"),
        Inspected::Absent,
        "a free key reads absent"
    );
    let token = claim_free(s, &key, &fp, LONG).await;
    match ok(s.inspect(&key).await, "inspect") {
        Inspected::Pending {
            fingerprint: held,
            lease_left,
        } => {
            assert_eq!(held, fp, "Pending must carry the holder's fingerprint");
            // Seconds wide: a loaded machine may take a while between claim and read.
            assert!(
                lease_left <= LONG && lease_left >= LONG / 2,
                "the lease left must be within the lease, got {lease_left:?} of {LONG:?}"
            );
        }
        other => panic!("a claimed key must read pending, got {other:?}"),
    }
    assert!(ok(
        s.complete(&key, &token, &fp, record("a"), LONG).await,
        "complete"
    ));
    match ok(s.inspect(&key).await, "inspect") {
        Inspected::Done {
            fingerprint: held,
            record: stored,
            expires_in,
        } => {
            assert_eq!(
                held, fp,
                "Done must carry the completing request's fingerprint"
            );
            assert_eq!(
                stored.as_bytes(),
                record("a").as_bytes(),
                "Done must return exactly the record's bytes"
            );
            assert!(
                expires_in <= LONG && expires_in >= LONG / 2,
                "the retention left must be within the retention, got {expires_in:?} of {LONG:?}"
            );
        }
        other => panic!("a completed key must read done, got {other:?}"),
    }
    assert_eq!(ok(s.forget(&key, false).await, "forget"), Forgotten::Record);
    assert_eq!(
        ok(s.inspect(&key).await, "inspect"),
        Inspected::Absent,
        "a forgotten key reads absent"
    );

    let released = random_key();
    let token = claim_free(s, &released, &fp, LONG).await;
    assert!(ok(s.release(&released, &token).await, "release"));
    assert_eq!(
        ok(s.inspect(&released).await, "inspect"),
        Inspected::Absent,
        "a released key reads absent"
    );

    let lapsed = random_key();
    let expired = random_key();
    claim_free(s, &lapsed, &fp, SHORT).await;
    let token = claim_free(s, &expired, &fp, LONG).await;
    assert!(ok(
        s.complete(&expired, &token, &fp, record("e"), SHORT).await,
        "complete"
    ));
    h.advance(PAST_SHORT).await;
    assert_eq!(
        ok(s.inspect(&lapsed).await, "inspect"),
        Inspected::Absent,
        "a key whose lease lapsed reads absent"
    );
    assert_eq!(
        ok(s.inspect(&expired).await, "inspect"),
        Inspected::Absent,
        "a key whose record expired reads absent"
    );
}

#[doc(hidden)]
/// `inspect` only reads: it claims no free key, renews no lease, keeps no record past its
/// retention, and leaves a claim to its holder's token.
pub async fn inspect_changes_nothing<H: Harness>(h: H) {
    let s = h.store();
    let fp = fingerprint("a");

    let free = random_key();
    for _ in 0..3 {
        ok(s.inspect(&free).await, "inspect");
    }
    claim_free(s, &free, &fp, LONG).await;

    // Inspected through its lease: the lease still lapses when it would have.
    let pending = random_key();
    let token = claim_free(s, &pending, &fp, SECONDS_LEASE).await;
    for _ in 0..3 {
        ok(s.inspect(&pending).await, "inspect");
    }
    assert!(
        ok(s.renew(&pending, &token, SECONDS_LEASE).await, "renew"),
        "an inspected claim is still its holder's"
    );
    for _ in 0..3 {
        ok(s.inspect(&pending).await, "inspect");
    }
    h.advance(PAST_SECONDS_LEASE).await;
    match ok(s.claim(&pending, &fp, LONG).await, "claim") {
        Claim::Claimed(_) => {}
        other => panic!("inspecting a claim must not renew its lease, got {other:?}"),
    }

    // Inspected through its retention: the record still expires when it would have.
    let done = random_key();
    let token = claim_free(s, &done, &fp, LONG).await;
    assert!(ok(
        s.complete(&done, &token, &fp, record("a"), SECONDS_LEASE)
            .await,
        "complete"
    ));
    for _ in 0..3 {
        ok(s.inspect(&done).await, "inspect");
    }
    assert_eq!(expect_done(s, &done, "after inspect").await.1, record("a"));
    h.advance(PAST_SECONDS_LEASE).await;
    match ok(s.claim(&done, &fp, LONG).await, "claim") {
        Claim::Claimed(_) => {}
        other => panic!("inspecting a record must not keep it past its retention, got {other:?}"),
    }
}

#[doc(hidden)]
/// [`Engine::inspect`] reads a key as a repeat would find it: absent, in flight, done with the
/// recorded status, and a record written under another secret as invalid and unauthenticated,
/// never as done.
pub async fn engine_inspect_reads_a_key_as_a_repeat_would<H: Harness>(h: H) {
    use crate::engine::{KeyState, RecordErrorKind};
    let h = Arc::new(h);
    let secret = |b: u8| crate::Secret::new([b; 32].to_vec()).unwrap();
    let engine = Engine::builder(HarnessStore(Arc::clone(&h)))
        .secret(secret(1))
        .build();
    let key = random_key();
    assert_eq!(ok(engine.inspect(&key).await, "inspect"), KeyState::Absent);
    let ticket = match ok(engine.begin(key, fingerprint("a")).await, "begin") {
        Begin::Run(ticket) => ticket,
        other => panic!("a free key must be run, got {other:?}"),
    };
    match ok(engine.inspect(&key).await, "inspect") {
        KeyState::InFlight { lease_left, .. } => assert!(
            lease_left <= engine.lease() && lease_left >= engine.lease() / 2,
            "the lease left must be within the engine's lease, got {lease_left:?}"
        ),
        other => panic!("a claimed key must read in flight, got {other:?}"),
    }
    let response = Recorded::new(201, vec![], Some(Bytes::from_static(b"{\"id\":7}")));
    assert!(ok(engine.complete(ticket, &response).await, "complete"));
    match ok(engine.inspect(&key).await, "inspect") {
        KeyState::Done {
            status, expires_in, ..
        } => {
            assert_eq!(status, 201, "done must carry the recorded status");
            assert!(
                expires_in <= engine.retention() && expires_in >= engine.retention() / 2,
                "the retention left must be within the engine's retention, got {expires_in:?}"
            );
        }
        other => panic!("a completed key must read done, got {other:?}"),
    }
    let stranger = Engine::builder(HarnessStore(Arc::clone(&h)))
        .secret(secret(2))
        .build();
    match ok(stranger.inspect(&key).await, "inspect") {
        KeyState::Invalid { error, .. } => assert_eq!(
            error.kind(),
            RecordErrorKind::Unauthenticated,
            "a record of another secret fails verification"
        ),
        other => panic!("a record of another secret must read invalid, got {other:?}"),
    }
    assert!(
        matches!(
            ok(stranger.begin(key, fingerprint("a")).await, "begin"),
            Begin::RecordInvalid(_) | Begin::KeyReused
        ),
        "a repeat under another secret is refused too"
    );
}

/// A harness's store as an owned [`Store`], for the engine (which owns its store).
struct HarnessStore<H>(Arc<H>);

impl<H> std::fmt::Debug for HarnessStore<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HarnessStore(..)")
    }
}

impl<H: Harness> Store for HarnessStore<H> {
    fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> impl Future<Output = Result<Claim, StoreError>> + Send {
        self.0.store().claim(key, fingerprint, lease)
    }

    fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.0
            .store()
            .complete(key, token, fingerprint, record, retention)
    }

    fn release(
        &self,
        key: &StoreKey,
        token: &Token,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.0.store().release(key, token)
    }

    fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.0.store().renew(key, token, lease)
    }

    fn forget(
        &self,
        key: &StoreKey,
        pending: bool,
    ) -> impl Future<Output = Result<Forgotten, StoreError>> + Send {
        self.0.store().forget(key, pending)
    }

    fn lease_left(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        self.0.store().lease_left(key)
    }

    fn inspect(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Inspected, StoreError>> + Send {
        self.0.store().inspect(key)
    }

    fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> impl Future<Output = Result<StepRecorded, StoreError>> + Send {
        self.0.store().record_step(key, step, value, retention)
    }

    fn steps(
        &self,
        key: &StoreKey,
    ) -> impl Future<Output = Result<Vec<(StepId, Bytes)>, StoreError>> + Send {
        self.0.store().steps(key)
    }

    fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        self.0.store().prepare_step(key, token, lease)
    }

    fn notifies_settled(&self) -> bool {
        self.0.store().notifies_settled()
    }

    fn wait_settled(&self, key: &StoreKey, within: Duration) -> impl Future<Output = ()> + Send {
        self.0.store().wait_settled(key, within)
    }

    fn name(&self) -> &'static str {
        self.0.store().name()
    }
}
