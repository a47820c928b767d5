//! Steps under a crash: a checkout whose process dies after the charge is finished by the
//! next process, without a second charge.
//!
//! The checkout handler (as `examples/steps.rs` writes it) runs three steps: reserve, charge
//! and receipt. Each calls a provider over HTTP and forwards the step's derived key. The
//! providers run in the test process ([`Providers`]): they count every call, and the calls
//! that succeeded per step key. They never de-duplicate: a step run twice shows as two calls
//! under one key.
//!
//! - `kill -9` right after the charge, over Redis and over PostgreSQL: the receipt provider
//!   holds the first call, the application process (this binary run again as a child,
//!   [`child_checkout_app`]) is killed while it waits, and a second process takes the retry
//!   once the first one's lease lapsed. The lease is 2 s, and the tests are named so: the
//!   stores' expiry runs on real servers whose clocks cannot be paused, and the default 60 s
//!   lease would make each retry wait a minute. Nothing times the lease.
//! - A receipt that fails with a 5xx, over every store: the handler answers 503, the key is
//!   released, and the retry runs only the receipt.
//! - A storm over Redis: 50 orders, each sent by several clients at once to two application
//!   processes, every client retrying on 409 and 503. Half the orders' first receipt fails.
//!   Each step runs once per order, and every order ends 201.
//!
//! ```text
//! scripts/test.sh --test faults -- steps --nocapture
//! ```
#![cfg(all(feature = "redis", feature = "postgres"))]
#![allow(clippy::unwrap_used)]

use crate::support::child::{AppProcess, serve, setting};
use crate::support::http::{Answer, Kind, TestServer, bounded, client, lock, send, try_send};
use crate::support::postgres_server::{self, PostgresServer};
use crate::support::redis_server::{self, RedisServer};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower_idempotency::engine::{Engine, Raw, Scope, StepError, StepErrorKind, Steps};
use tower_idempotency::store::postgres::PostgresStore;
use tower_idempotency::store::redis::RedisStore;
use tower_idempotency::{DerivedKey, IdempotencyLayer, Store};

/// The child's setting: `redis` or `postgres`.
const STORE: &str = "TI_STEPS_STORE";
/// The child's setting: the store's URL.
const URL: &str = "TI_STEPS_URL";
/// The child's setting: the providers' base URL.
const PROVIDERS: &str = "TI_STEPS_PROVIDERS";
/// The child's setting: the engine's lease in ms (the default when absent).
const LEASE_MS: &str = "TI_STEPS_LEASE_MS";
/// The store prefix of every app.
const PREFIX: &str = "steps";
/// The lease of the crash tests: the time a retry waits for the dead process's claim.
const SHORT_LEASE: Duration = Duration::from_secs(2);
/// How long a retry loop may go on.
const RETRY_LIMIT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The providers (in the test process)
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct Order {
    id: u64,
    cents: u64,
}

/// What the providers were asked and what they did. Clones share it.
#[derive(Clone, Default)]
struct Providers(Arc<Ledger>);

#[derive(Default)]
struct Ledger {
    /// Calls received per step, answered or not.
    calls: Mutex<BTreeMap<&'static str, usize>>,
    /// Calls answered 200 per (step, key).
    done: Mutex<HashMap<(&'static str, String), usize>>,
    /// The keys each (step, order) came with.
    keys: Mutex<HashMap<(&'static str, u64), HashSet<String>>>,
    /// Receipts failed with 503.
    receipts_failed: AtomicUsize,
    /// The next receipt call is held: never answered.
    hold_next_receipt: AtomicBool,
    /// Orders whose next receipt fails with 503.
    fail_receipt_of: Mutex<HashSet<u64>>,
    /// Answers wait up to this many ms (at random).
    jitter_ms: AtomicU64,
    /// Numbers the answers: a step run twice answers something else.
    serial: AtomicUsize,
}

impl Providers {
    async fn start(&self) -> TestServer {
        let step = |name: &'static str| {
            post(
                move |State(p): State<Providers>, headers: HeaderMap, Json(order): Json<Order>| async move {
                    p.serve(name, &headers, &order).await
                },
            )
        };
        let router = Router::new()
            .route("/reserve", step("reserve"))
            .route("/charge", step("charge"))
            .route("/receipt", step("receipt"))
            .with_state(self.clone());
        TestServer::start(router).await
    }

    async fn serve(&self, step: &'static str, headers: &HeaderMap, order: &Order) -> Response {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
            .to_owned();
        let l = &self.0;
        *lock(&l.calls).entry(step).or_default() += 1;
        lock(&l.keys)
            .entry((step, order.id))
            .or_default()
            .insert(key.clone());
        let jitter = l.jitter_ms.load(Ordering::SeqCst);
        if jitter > 0 {
            tokio::time::sleep(Duration::from_millis(random_below(jitter))).await;
        }
        if step == "receipt" {
            if l.hold_next_receipt.swap(false, Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if lock(&l.fail_receipt_of).remove(&order.id) {
                l.receipts_failed.fetch_add(1, Ordering::SeqCst);
                return (StatusCode::SERVICE_UNAVAILABLE, "the mail server is down")
                    .into_response();
            }
        }
        *lock(&l.done).entry((step, key)).or_default() += 1;
        let n = l.serial.fetch_add(1, Ordering::SeqCst);
        format!("{step}_{}_{}c_{n}", order.id, order.cents).into_response()
    }

    fn calls(&self, step: &str) -> usize {
        lock(&self.0.calls).get(step).copied().unwrap_or(0)
    }

    /// Calls answered 200 for `step`, over every key.
    fn done(&self, step: &str) -> usize {
        lock(&self.0.done)
            .iter()
            .filter(|((s, _), _)| *s == step)
            .map(|(_, n)| n)
            .sum()
    }

    /// The keys `step` was called with for `order`.
    fn keys(&self, step: &'static str, order: u64) -> HashSet<String> {
        lock(&self.0.keys)
            .get(&(step, order))
            .cloned()
            .unwrap_or_default()
    }

    /// Asserts that each step of `order` was called under one key, and succeeded once there.
    fn assert_once(&self, order: u64) {
        for step in ["reserve", "charge", "receipt"] {
            let keys = self.keys(step, order);
            assert_eq!(keys.len(), 1, "order {order}, step {step}: keys {keys:?}");
            let key = keys.into_iter().next().unwrap();
            let done = lock(&self.0.done).get(&(step, key)).copied().unwrap_or(0);
            assert_eq!(done, 1, "order {order}, step {step} succeeded {done} times");
        }
    }

    fn counts(&self) -> String {
        format!(
            "reserve {} call(s); charge {} call(s), {} done; receipt {} call(s), {} sent, {} failed",
            self.calls("reserve"),
            self.calls("charge"),
            self.done("charge"),
            self.calls("receipt"),
            self.done("receipt"),
            self.0.receipts_failed.load(Ordering::SeqCst),
        )
    }
}

fn random_below(n: u64) -> u64 {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).unwrap();
    u64::from_le_bytes(b) % n.max(1)
}

// ---------------------------------------------------------------------------------------------
// The checkout application
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Shop {
    http: reqwest::Client,
    providers: String,
}

impl Shop {
    /// Calls a provider with the step's key; its answer is the step's result.
    async fn call(&self, step: &str, order: &Order, key: DerivedKey) -> Result<String, String> {
        let res = self
            .http
            .post(format!("{}/{step}", self.providers))
            .header("idempotency-key", key.as_str())
            .json(&json!({ "id": order.id, "cents": order.cents }))
            .send()
            .await
            .map_err(|e| format!("{step}: {e}"))?;
        if !res.status().is_success() {
            return Err(format!("{step}: {}", res.status()));
        }
        res.text().await.map_err(|e| format!("{step}: {e}"))
    }
}

/// The checkout handler: three steps, each forwarding its key. A provider's failure answers
/// 503 (the key is released, the client retries); any other step error 500.
async fn checkout(State(shop): State<Shop>, steps: Steps, Json(order): Json<Order>) -> Response {
    let work = async {
        let s = &shop;
        let reservation = steps
            .run("reserve", Raw, |key| s.call("reserve", &order, key))
            .await?;
        let charge: String = steps
            .run("charge", Raw, |key| s.call("charge", &order, key))
            .await?;
        let receipt: String = steps
            .run("receipt", Raw, |key| s.call("receipt", &order, key))
            .await?;
        Ok::<_, StepError<String>>(json!({
            "order": order.id,
            "reservation": reservation,
            "charge": charge,
            "receipt": receipt,
        }))
    };
    match work.await {
        Ok(body) => (StatusCode::CREATED, Json(body)).into_response(),
        Err(e) if e.kind() == StepErrorKind::Work => {
            (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
        }
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

fn checkout_app<St: Store>(engine: Engine<St>, providers: String) -> Router {
    let shop = Shop {
        http: client(),
        providers,
    };
    Router::new()
        .route("/checkout", post(checkout))
        .with_state(shop)
        .layer(IdempotencyLayer::new(engine).principal_fn(|_| Some(Scope::principal("shopper"))))
}

fn engine<St: Store>(store: St, lease: Option<Duration>) -> Engine<St> {
    let builder = Engine::builder(store);
    match lease {
        Some(lease) => builder.lease(lease),
        None => builder,
    }
    .build()
}

/// The application process: the checkout over the store the parent names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a child process of the steps crash tests: started by them"]
async fn child_checkout_app() {
    let (Some(kind), Some(url), Some(providers)) =
        (setting(STORE), setting(URL), setting(PROVIDERS))
    else {
        return;
    };
    let lease = setting(LEASE_MS)
        .and_then(|ms| ms.parse().ok())
        .map(Duration::from_millis);
    let router = match kind.as_str() {
        "redis" => {
            let store = RedisStore::connect(&url, PREFIX).await.unwrap();
            checkout_app(engine(store, lease), providers)
        }
        "postgres" => {
            let store = PostgresStore::connect(&url, PREFIX).await.unwrap();
            checkout_app(engine(store, lease), providers)
        }
        other => panic!("no store {other}"),
    };
    serve(router).await;
}

// ---------------------------------------------------------------------------------------------
// The servers
// ---------------------------------------------------------------------------------------------

enum Backend {
    Redis(RedisServer),
    Postgres(PostgresServer),
}

impl Backend {
    /// A fresh server, or `None` when it cannot be started (and servers are not required).
    async fn start(kind: &str) -> Option<Self> {
        match kind {
            "redis" => redis_server::available().then(|| Self::Redis(RedisServer::start())),
            "postgres" => {
                if !postgres_server::available() {
                    return None;
                }
                let server = PostgresServer::start();
                let store = PostgresStore::connect(&server.url(), PREFIX).await.unwrap();
                store.migrate().await.unwrap();
                Some(Self::Postgres(server))
            }
            other => panic!("no store {other}"),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Redis(_) => "redis",
            Self::Postgres(_) => "postgres",
        }
    }

    fn url(&self) -> String {
        match self {
            Self::Redis(s) => s.url(),
            Self::Postgres(s) => s.url(),
        }
    }

    fn env(&self, providers: &TestServer, lease: Option<Duration>) -> Vec<(&'static str, String)> {
        let mut env = vec![
            (STORE, self.kind().to_owned()),
            (URL, self.url()),
            (PROVIDERS, providers.url("")),
        ];
        if let Some(lease) = lease {
            env.push((LEASE_MS, lease.as_millis().to_string()));
        }
        env
    }
}

fn order_body(id: u64) -> String {
    json!({ "id": id, "cents": 1000 + id }).to_string()
}

fn checkout_request(http: &reqwest::Client, url: &str, id: u64) -> reqwest::RequestBuilder {
    http.post(url)
        .header("idempotency-key", format!("order-{id}"))
        .header("content-type", "application/json")
        .body(order_body(id))
}

// ---------------------------------------------------------------------------------------------
// kill -9 after the charge
// ---------------------------------------------------------------------------------------------

/// The order is charged, its receipt is on its way, and the process dies. The next process
/// takes the retry once the lease lapsed: no second charge, one receipt.
async fn kill_after_the_charge(kind: &str) {
    let Some(backend) = Backend::start(kind).await else {
        return;
    };
    let providers = Providers::default();
    let provider_server = providers.start().await;
    let env = backend.env(&provider_server, Some(SHORT_LEASE));
    let test = "steps::child_checkout_app";
    let mut first = AppProcess::start(test, &env).await;
    let http = client();

    providers.0.hold_next_receipt.store(true, Ordering::SeqCst);
    let url = first.url("/checkout");
    let mut pending = tokio::spawn(try_send(checkout_request(&http, &url, 1)));
    bounded(
        Duration::from_secs(10),
        "the first run reaching the receipt",
        async {
            while providers.calls("receipt") == 0 {
                if pending.is_finished() {
                    let answer = (&mut pending).await.unwrap().map(|a| a.describe());
                    panic!("the first run answered before its receipt: {answer:?}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    assert_eq!(providers.done("charge"), 1, "{}", providers.counts());

    first.kill().await;
    let killed = Instant::now();
    // The first request's connection died with the process.
    assert!(
        pending.await.unwrap().is_err(),
        "the killed process answered"
    );

    let second = AppProcess::start(test, &env).await;
    let listening = killed.elapsed();
    let url = second.url("/checkout");
    let mut in_flight = 0;
    let answer = bounded(RETRY_LIMIT, "the retry after the kill", async {
        loop {
            let a = send(checkout_request(&http, &url, 1)).await;
            if a.kind() != Kind::InFlight {
                return a;
            }
            in_flight += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let recovered = killed.elapsed();
    assert_eq!(answer.kind(), Kind::Fresh, "{}", answer.describe());

    // Once more: the record answers.
    let replay = send(checkout_request(&http, &url, 1)).await;
    assert_eq!(replay.kind(), Kind::Replay, "{}", replay.describe());
    assert_eq!(replay.body, answer.body);

    println!(
        "steps, kill -9 after the charge, over {kind} (lease {SHORT_LEASE:?}): second process \
         listening {listening:?} after the kill, 201 {recovered:?} after the kill, {in_flight} \
         answer(s) 409 in flight before it; {}",
        providers.counts()
    );
    assert_eq!(providers.calls("reserve"), 1, "{}", providers.counts());
    assert_eq!(providers.calls("charge"), 1, "{}", providers.counts());
    assert_eq!(providers.done("charge"), 1, "{}", providers.counts());
    // The held call and the retry's.
    assert_eq!(providers.calls("receipt"), 2, "{}", providers.counts());
    assert_eq!(providers.done("receipt"), 1, "{}", providers.counts());
    providers.assert_once(1);
    let body = answer.json();
    assert!(
        body["charge"].as_str().unwrap().starts_with("charge_1_"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_charge_over_redis_with_a_2_s_lease_charges_once() {
    kill_after_the_charge("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_after_the_charge_over_postgres_with_a_2_s_lease_charges_once() {
    kill_after_the_charge("postgres").await;
}

// ---------------------------------------------------------------------------------------------
// A 5xx, then the retry
// ---------------------------------------------------------------------------------------------

/// The receipt fails once: 503, the key is released, and the retry runs only the receipt.
async fn receipt_fails_then_retry(app: Router, providers: &Providers, store: &str) {
    let server = TestServer::start(app).await;
    let http = client();
    let url = server.url("/checkout");
    lock(&providers.0.fail_receipt_of).insert(7);

    let failed = send(checkout_request(&http, &url, 7)).await;
    assert_eq!(
        failed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        failed.describe()
    );
    assert!(!failed.is_replay());
    let after_failure = providers.counts();

    let retried = send(checkout_request(&http, &url, 7)).await;
    assert_eq!(retried.kind(), Kind::Fresh, "{}", retried.describe());
    let replay = send(checkout_request(&http, &url, 7)).await;
    assert_eq!(replay.kind(), Kind::Replay, "{}", replay.describe());
    assert_eq!(replay.body, retried.body);

    println!(
        "steps, a 5xx receipt then the retry, over {store}: after the 503: {after_failure}; \
         after the retry: {}",
        providers.counts()
    );
    assert_eq!(providers.calls("reserve"), 1, "{}", providers.counts());
    assert_eq!(providers.calls("charge"), 1, "{}", providers.counts());
    assert_eq!(providers.calls("receipt"), 2, "{}", providers.counts());
    assert_eq!(providers.done("receipt"), 1, "{}", providers.counts());
    assert_eq!(providers.0.receipts_failed.load(Ordering::SeqCst), 1);
    providers.assert_once(7);
}

// Once per store: `over_memory::…`, `over_redis::…`, `over_postgres::…`.
crate::support::stores::per_store!(
    [over_memory: memory, over_redis: redis, over_postgres: postgres] {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_5xx_receipt_then_the_retry_runs_only_the_receipt() {
        let Some(store) = store().await else {
            return;
        };
        let providers = Providers::default();
        let provider_server = providers.start().await;
        let app = checkout_app(engine(store, None), provider_server.url(""));
        receipt_fails_then_retry(app, &providers, STORE).await;
    }
});

// ---------------------------------------------------------------------------------------------
// A storm of retries over two processes
// ---------------------------------------------------------------------------------------------

/// Orders in the storm.
const ORDERS: u64 = 50;
/// Clients per order and per process, all at once.
const CLIENTS: usize = 3;

/// Every order sent by `CLIENTS` clients to each of two processes at once; each client retries
/// on 409 and 503 until it gets 201. Half the orders' first receipt fails (chosen at random).
/// Each step runs once per order, and every client ends with the order's one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_retries_over_two_redis_processes_runs_each_step_once() {
    let Some(backend) = Backend::start("redis").await else {
        return;
    };
    let providers = Providers::default();
    providers.0.jitter_ms.store(5, Ordering::SeqCst);
    let failing: HashSet<u64> = (0..ORDERS).filter(|_| random_below(2) == 0).collect();
    lock(&providers.0.fail_receipt_of).extend(failing.iter().copied());
    let provider_server = providers.start().await;
    let env = backend.env(&provider_server, None);
    let test = "steps::child_checkout_app";
    let apps = [
        AppProcess::start(test, &env).await,
        AppProcess::start(test, &env).await,
    ];
    let urls: Vec<String> = apps.iter().map(|a| a.url("/checkout")).collect();
    let http = client();

    let began = Instant::now();
    let mut clients = Vec::new();
    for id in 0..ORDERS {
        for (app, url) in urls.iter().enumerate() {
            for _ in 0..CLIENTS {
                let (http, url) = (http.clone(), url.clone());
                clients.push(tokio::spawn(async move {
                    let mut seen: Vec<Answer> = Vec::new();
                    let deadline = Instant::now() + RETRY_LIMIT;
                    loop {
                        let a = send(checkout_request(&http, &url, id)).await;
                        let retry = a.kind() == Kind::InFlight
                            || a.status == StatusCode::SERVICE_UNAVAILABLE;
                        seen.push(a);
                        if !retry {
                            return (id, app, seen);
                        }
                        assert!(Instant::now() < deadline, "order {id} did not end");
                        tokio::time::sleep(Duration::from_millis(10 + random_below(40))).await;
                    }
                }));
            }
        }
    }
    let mut answers: BTreeMap<String, usize> = BTreeMap::new();
    let mut bodies: HashMap<u64, HashSet<bytes::Bytes>> = HashMap::new();
    let mut fresh: HashMap<u64, usize> = HashMap::new();
    for c in clients {
        let (id, _app, seen) = c.await.expect("a client panicked");
        let last = seen.last().unwrap();
        assert_eq!(
            last.status,
            StatusCode::CREATED,
            "order {id}: {}",
            last.describe()
        );
        bodies.entry(id).or_default().insert(last.body.clone());
        for a in &seen {
            let name = match a.kind() {
                Kind::Fresh => {
                    *fresh.entry(id).or_default() += 1;
                    "201 fresh".to_owned()
                }
                Kind::Replay => "201 replay".to_owned(),
                Kind::InFlight => "409 in flight".to_owned(),
                Kind::StoreFailed => "503 store failed".to_owned(),
                Kind::Other(s, c) => format!("{s} {c}"),
            };
            *answers.entry(name).or_default() += 1;
        }
    }
    let took = began.elapsed();

    println!(
        "steps, a storm over two processes over redis: {ORDERS} orders, {} clients each, {} \
         with a failing receipt; {} requests in {took:?}: {answers:?}; {}",
        CLIENTS * 2,
        failing.len(),
        answers.values().sum::<usize>(),
        providers.counts()
    );
    for id in 0..ORDERS {
        providers.assert_once(id);
        assert_eq!(
            bodies[&id].len(),
            1,
            "order {id}: one answer for all its clients"
        );
        assert_eq!(
            fresh.get(&id),
            Some(&1),
            "order {id}: one run answered fresh"
        );
    }
    let orders = usize::try_from(ORDERS).unwrap();
    assert_eq!(providers.done("reserve"), orders);
    assert_eq!(providers.done("charge"), orders);
    assert_eq!(providers.calls("charge"), orders);
    assert_eq!(providers.done("receipt"), orders);
    assert_eq!(providers.calls("receipt"), orders + failing.len());
    assert_eq!(
        providers.0.receipts_failed.load(Ordering::SeqCst),
        failing.len()
    );
    drop(apps);
}
