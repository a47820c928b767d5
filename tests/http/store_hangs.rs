//! A store of one's own that never answers cannot hang a request: the engine bounds every
//! store operation (30 s by default). A claim that hangs is answered 503 within the bound and
//! the handler never runs; a completion that hangs still returns the handler's response; a
//! step whose store hangs fails within the bound before it acts. Time is tokio's paused clock.
//! Outside a tokio runtime, which has no timer, the operations run unbounded and never panic.
//!
//! ```text
//! cargo test -p tower-idempotency --all-features --test http -- store_hangs
//! ```

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::time::Duration;
use tower::{Layer, ServiceExt, service_fn};
use tower_idempotency::engine::{Begin, Engine, Fingerprint, Raw, Scope};
use tower_idempotency::http::RequestBody;
use tower_idempotency::store::{
    Claim, Forgotten, Record, StepId, StepRecorded, StoreError, StoreKey, Token,
};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Principal, Steps, Store};

/// The engine's default bound on one store operation.
const STORE_TIMEOUT: Duration = Duration::from_secs(30);

/// A memory store whose chosen operations never answer, as a store of one's own whose server
/// went silent.
#[derive(Default)]
struct Silent {
    inner: MemoryStore,
    claim: AtomicBool,
    complete: AtomicBool,
    steps: AtomicBool,
    /// Claims answered so far.
    claims: AtomicUsize,
    /// When not zero, the claims after this many answered never answer.
    silent_after: AtomicUsize,
}

async fn unless<T>(hang: &AtomicBool, f: impl Future<Output = T>) -> T {
    if hang.load(SeqCst) {
        std::future::pending::<()>().await;
    }
    f.await
}

impl Store for Silent {
    async fn claim(
        &self,
        key: &StoreKey,
        fp: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let after = self.silent_after.load(SeqCst);
        if after != 0 && self.claims.fetch_add(1, SeqCst) >= after {
            std::future::pending::<()>().await;
        }
        unless(&self.claim, self.inner.claim(key, fp, lease)).await
    }
    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fp: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        unless(
            &self.complete,
            self.inner.complete(key, token, fp, record, retention),
        )
        .await
    }
    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.inner.release(key, token).await
    }
    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.renew(key, token, lease).await
    }
    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        self.inner.forget(key, pending).await
    }
    async fn record_step(
        &self,
        key: &StoreKey,
        step: &StepId,
        value: Bytes,
        retention: Duration,
    ) -> Result<StepRecorded, StoreError> {
        unless(
            &self.steps,
            self.inner.record_step(key, step, value, retention),
        )
        .await
    }
    async fn prepare_step(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        unless(&self.steps, self.inner.prepare_step(key, token, lease)).await
    }
    async fn steps(&self, key: &StoreKey) -> Result<Vec<(StepId, Bytes)>, StoreError> {
        unless(&self.steps, self.inner.steps(key)).await
    }
}

fn request(key: &str) -> Request<Full<Bytes>> {
    Request::post("/work")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .extension(Principal::new("alice"))
        .body(Full::new(Bytes::from_static(b"{}")))
        .expect("request")
}

/// With every default: a claim that never answers is 503 within the engine's bound, and the
/// handler never runs; a completion that never answers still returns the handler's 201.
#[tokio::test(start_paused = true)]
async fn a_store_that_never_answers_gets_503_within_the_bound_and_keeps_the_response() {
    let store = Arc::new(Silent::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let svc = IdempotencyLayer::new(Engine::from_arc(Arc::clone(&store))).layer(service_fn(
        move |_req: Request<RequestBody<Full<Bytes>>>| {
            let run = r.fetch_add(1, SeqCst) + 1;
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .status(201)
                        .body(Full::new(Bytes::from(format!("run {run}"))))
                        .expect("response"),
                )
            }
        },
    ));

    store.claim.store(true, SeqCst);
    let started = tokio::time::Instant::now();
    let res = tokio::time::timeout(STORE_TIMEOUT * 2, svc.clone().oneshot(request("k-1")))
        .await
        .expect("answered within the bound")
        .expect("infallible");
    assert_eq!(res.status(), 503);
    assert_eq!(started.elapsed(), STORE_TIMEOUT, "answered at the bound");
    assert_eq!(runs.load(SeqCst), 0, "the handler never ran");
    store.claim.store(false, SeqCst);

    store.complete.store(true, SeqCst);
    let started = tokio::time::Instant::now();
    let res = tokio::time::timeout(STORE_TIMEOUT * 2, svc.clone().oneshot(request("k-2")))
        .await
        .expect("answered within the bound")
        .expect("infallible");
    assert_eq!(res.status(), 201, "the handler's response");
    assert_eq!(started.elapsed(), STORE_TIMEOUT);
    let body = res.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"run 1");
    assert_eq!(runs.load(SeqCst), 1);
}

/// A step whose store never answers fails within the bound, before its work runs.
#[tokio::test(start_paused = true)]
async fn a_step_whose_store_never_answers_fails_within_the_bound_and_runs_nothing() {
    let store = Arc::new(Silent::default());
    let engine = Engine::from_arc(Arc::clone(&store));
    let key = StoreKey::derive(
        "jobs",
        &Scope::principal("alice"),
        &IdempotencyKey::new("k").unwrap(),
    );
    let fp = Fingerprint::builder().field(b"job").finish();
    let Begin::Run(ticket) = engine.begin(key, fp).await.unwrap() else {
        panic!("a free key")
    };
    store.steps.store(true, SeqCst);
    let steps: Steps = engine.steps(&ticket);
    let ran = AtomicBool::new(false);
    let started = tokio::time::Instant::now();
    let out = tokio::time::timeout(
        STORE_TIMEOUT * 4,
        steps.run("charge", Raw, |_key| async {
            ran.store(true, SeqCst);
            Ok::<_, std::io::Error>(String::from("charged"))
        }),
    )
    .await
    .expect("answered within the bound");
    assert!(out.is_err(), "the step failed");
    assert!(
        started.elapsed() <= STORE_TIMEOUT * 2,
        "{:?}",
        started.elapsed()
    );
    assert!(!ran.load(SeqCst), "the step's work never ran");

    store.steps.store(false, SeqCst);
    assert!(engine.release(ticket).await.unwrap());
}

/// Polls `fut` to its end on this thread, with no tokio runtime about.
fn block_on_without_runtime<F: Future>(fut: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

/// The bound needs tokio's timer, which only a runtime has. Outside one, an operation runs
/// unbounded rather than panicking: the memory store answers at once, so a caller on another
/// executor still claims, completes, replays and forgets.
#[test]
fn outside_a_tokio_runtime_store_operations_run_unbounded_instead_of_panicking() {
    let engine = Engine::new(MemoryStore::new());
    let key = StoreKey::derive(
        "jobs",
        &Scope::principal("alice"),
        &IdempotencyKey::new("k").unwrap(),
    );
    let fp = Fingerprint::builder().field(b"job").finish();
    block_on_without_runtime(async {
        let Begin::Run(ticket) = engine.begin(key, fp).await.expect("claim") else {
            panic!("a free key")
        };
        let response = tower_idempotency::engine::Recorded::new(201, vec![], None);
        assert!(engine.complete(ticket, &response).await.expect("complete"));
        assert!(matches!(
            engine.begin(key, fp).await.expect("claim"),
            Begin::Replayed(r) if r.status == 201
        ));
        assert_eq!(
            engine.forget(&key).await.expect("forget"),
            Forgotten::Record
        );
    });
}

/// Failing open, a claim that never answers runs the handler at the engine's bound, and its
/// response is passed on; nothing is recorded, so a repeat runs it again. The default, above,
/// answers 503 and runs nothing.
#[tokio::test(start_paused = true)]
async fn failing_open_a_claim_that_never_answers_runs_the_handler_at_the_bound() {
    let store = Arc::new(Silent::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let r = Arc::clone(&runs);
    let svc = IdempotencyLayer::new(Engine::from_arc(Arc::clone(&store)))
        .fail_open(true)
        .layer(service_fn(
            move |_req: Request<RequestBody<Full<Bytes>>>| {
                let run = r.fetch_add(1, SeqCst) + 1;
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from(format!("run {run}"))))
                            .expect("response"),
                    )
                }
            },
        ));

    store.claim.store(true, SeqCst);
    for run in 1..=2 {
        let started = tokio::time::Instant::now();
        let res = tokio::time::timeout(STORE_TIMEOUT * 2, svc.clone().oneshot(request("k-1")))
            .await
            .expect("answered within the bound")
            .expect("infallible");
        assert_eq!(res.status(), 201, "the handler's response");
        assert_eq!(started.elapsed(), STORE_TIMEOUT, "run at the bound");
        assert!(res.headers().get("idempotent-replayed").is_none());
        let body = res.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(
            body,
            format!("run {run}"),
            "each repeat runs: nothing recorded"
        );
    }
    assert_eq!(runs.load(SeqCst), 2);

    // The store answers again: the key was never claimed, the next request claims it.
    store.claim.store(false, SeqCst);
    let res = svc
        .clone()
        .oneshot(request("k-1"))
        .await
        .expect("infallible");
    assert_eq!(res.status(), 201);
    assert!(
        svc.oneshot(request("k-1"))
            .await
            .expect("infallible")
            .headers()["idempotent-replayed"]
            == "true"
    );
    assert_eq!(runs.load(SeqCst), 3);
}

/// Failing open and waiting in flight: a repeat whose claim found the first run in flight, and
/// whose later look at the key got no answer, never runs the work beside the first run: the
/// store had said the key is taken. It is answered 503, the handler not run again.
#[tokio::test(start_paused = true)]
async fn failing_open_a_repeat_that_found_its_key_in_flight_never_runs_beside_it() {
    let store = Arc::new(Silent::default());
    let runs = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (r, g) = (Arc::clone(&runs), Arc::clone(&gate));
    let svc = IdempotencyLayer::new(Engine::from_arc(Arc::clone(&store)))
        .fail_open(true)
        .wait_in_flight(Duration::from_secs(120))
        .layer(service_fn(
            move |_req: Request<RequestBody<Full<Bytes>>>| {
                let run = r.fetch_add(1, SeqCst) + 1;
                let g = Arc::clone(&g);
                async move {
                    // The first run goes on until released.
                    if run == 1 {
                        let _permit = g.acquire().await.expect("open");
                    }
                    Ok::<_, Infallible>(
                        Response::builder()
                            .status(201)
                            .body(Full::new(Bytes::from_static(b"made")))
                            .expect("response"),
                    )
                }
            },
        ));

    // The first claim and the repeat's first look answer; every claim after them is silent.
    store.silent_after.store(2, SeqCst);
    let first = tokio::spawn(svc.clone().oneshot(request("k-1")));
    while runs.load(SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    let res = tokio::time::timeout(STORE_TIMEOUT * 4, svc.clone().oneshot(request("k-1")))
        .await
        .expect("answered within the bound")
        .expect("infallible");
    assert_eq!(
        runs.load(SeqCst),
        1,
        "the repeat ran beside the first run ({})",
        res.status()
    );
    assert_eq!(res.status(), 503);

    gate.add_permits(1);
    let first = first.await.expect("joined").expect("infallible");
    assert_eq!(first.status(), 201);
}
