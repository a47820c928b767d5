//! `#[idempotent]` handlers over a real TCP server: replay, per-route options merged over the
//! shared `IdempotentRoutes`, extractors and state, the principal from a middleware, and a
//! router that forgot the configuration.

#![cfg(feature = "macros")]

use crate::support::http::{Answer, SpyStore, TestServer, bounded, send, with_auth_header};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Json, Router};
use reqwest::Method;
use serde::Deserialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tower_idempotency::engine::{Engine, Raw, Scope};
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::store::clock::ManualClock;
use tower_idempotency::{
    DerivedKey, IdempotencyKey, IdempotencyLayer, IdempotentRoutes, MemoryStore, Steps, Store,
    idempotent,
};

// ---------------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------------

/// Counts handler executions; reached through an `Extension`, so stateless handlers can count.
#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn next(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

#[idempotent]
async fn create(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent]
async fn lenient(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(require_key)]
async fn strict(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(retention = "1s")]
async fn short_lived(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(lease = "1500ms", retention = "10m")]
async fn timed(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(response_mode = "status_and_headers")]
async fn status_only(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("secret {}", runs.next()))
}

#[idempotent(namespace = "a")]
async fn in_a(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("a run {}", runs.next()))
}

#[idempotent(namespace = "b")]
async fn in_b(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("b run {}", runs.next()))
}

#[idempotent(header_name = "X-Request-Key", max_request_body = 16)]
async fn custom_header(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[derive(Clone, Default)]
struct App {
    payments: Arc<AtomicUsize>,
}

#[derive(Deserialize)]
struct NewPayment {
    amount: u64,
}

/// A handler with router state and a JSON body, the usual shape.
#[idempotent(require_key, lease = "30s", retention = "1h")]
async fn create_payment(
    State(app): State<App>,
    Json(payment): Json<NewPayment>,
) -> (StatusCode, Json<serde_json::Value>) {
    let n = app.payments.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        Json(serde_json::json!({ "payment": n, "amount": payment.amount })),
    )
}

/// The crate's own extractors, run before the claim: they see the key the request is claimed
/// under (and no key when none was sent).
#[idempotent(require_key = false)]
async fn with_keys(
    key: Option<IdempotencyKey>,
    derived: Option<DerivedKey>,
    Extension(runs): Extension<Runs>,
    body: String,
) -> String {
    format!(
        "run {} key={} derived={} body={body}",
        runs.next(),
        key.as_ref().map_or("-", IdempotencyKey::as_str),
        derived.as_ref().map_or("-", DerivedKey::as_str),
    )
}

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// The shared configuration most tests use: a fresh memory store, anonymous callers allowed.
fn anonymous() -> IdempotencyLayer<MemoryStore> {
    IdempotencyLayer::default().principal(PrincipalMode::Optional)
}

/// A server of `routes` with a run counter and the shared configuration of `layer`.
async fn start<St: Store>(routes: Router, layer: IdempotencyLayer<St>) -> (TestServer, Runs) {
    let runs = Runs::default();
    let app = routes
        .layer(Extension(runs.clone()))
        .layer(Extension(IdempotentRoutes::new(layer)));
    (TestServer::start(app).await, runs)
}

/// A `POST` to `path` with no body.
fn post_to(server: &TestServer, path: &str) -> reqwest::RequestBuilder {
    server.request(Method::POST, path)
}

async fn post_key(server: &TestServer, path: &str, key: &str) -> Answer {
    send(post_to(server, path).header("idempotency-key", key)).await
}

/// Charges, then mails; the first mail fails. `Runs` counts the charges.
#[idempotent]
async fn checkout_steps(Extension(runs): Extension<Runs>, steps: Steps) -> (StatusCode, String) {
    let charge = steps
        .run("charge", Raw, |_| async {
            Ok::<_, String>(format!("charge {}", runs.next()))
        })
        .await;
    let Ok(charge) = charge else {
        return (StatusCode::INTERNAL_SERVER_ERROR, String::new());
    };
    // Only this route mails: the first attempt fails.
    static MAILS: AtomicUsize = AtomicUsize::new(0);
    let mail = steps
        .run("mail", Raw, |_| async move {
            if MAILS.fetch_add(1, Ordering::SeqCst) == 0 {
                Err(String::from("mail server down"))
            } else {
                Ok(String::from("sent"))
            }
        })
        .await;
    match mail {
        Ok(_) => (StatusCode::CREATED, charge),
        Err(_) => (StatusCode::BAD_GATEWAY, String::new()),
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn steps_of_an_attributed_handler_are_tied_to_its_claim() {
    let (server, runs) = start(
        Router::new().route("/checkout", post(checkout_steps)),
        anonymous(),
    )
    .await;
    let first = post_key(&server, "/checkout", "order-1").await;
    assert_eq!(first.status, 502, "{}", first.describe());
    assert_eq!(runs.count(), 1, "the first run charged");
    let retry = post_key(&server, "/checkout", "order-1").await;
    assert_eq!(retry.status, 201, "{}", retry.describe());
    assert_eq!(
        retry.text(),
        "charge 1",
        "the charge is answered from its record"
    );
    assert_eq!(runs.count(), 1, "the retry charged nothing more");
    server.stop().await;
}

#[tokio::test]
async fn runs_once_and_replays_the_repeat() {
    let (server, runs) = start(Router::new().route("/", post(create)), anonymous()).await;

    let first = post_key(&server, "/", "k-1").await;
    assert_eq!(
        (first.status.as_u16(), first.text(), first.is_replay()),
        (201, "run 1", false),
        "the first request runs the handler"
    );
    let again = post_key(&server, "/", "k-1").await;
    assert_eq!(
        (again.status.as_u16(), again.text(), again.is_replay()),
        (201, "run 1", true),
        "the repeat is the first answer, replayed"
    );
    assert_eq!(runs.count(), 1, "the handler ran once");

    let other = post_key(&server, "/", "k-2").await;
    assert_eq!(
        (other.text(), other.is_replay()),
        ("run 2", false),
        "another key runs again"
    );
}

#[tokio::test]
async fn required_refuses_a_request_without_a_key_where_the_shared_config_does_not() {
    let routes = Router::new()
        .route("/strict", post(strict))
        .route("/lenient", post(lenient));
    let (server, runs) = start(routes, anonymous().require_key(false)).await;

    let refused = send(post_to(&server, "/strict")).await;
    assert_eq!(
        refused.status,
        400,
        "`require_key` on the route: {}",
        refused.text()
    );
    assert!(
        refused.text().contains("idempotency.key_missing"),
        "a problem body with the machine code: {}",
        refused.text()
    );
    assert_eq!(runs.count(), 0, "the refused request did not run");

    let passed = send(post_to(&server, "/lenient")).await;
    assert_eq!(
        (passed.status.as_u16(), passed.is_replay()),
        (201, false),
        "the shared `require_key(false)` holds on a route without the option"
    );
}

#[tokio::test]
async fn per_route_retention_expires_the_record() {
    // The store's clock moves only when the test moves it: the replay is within the retention
    // however slowly the machine answers.
    let clock = ManualClock::new();
    let store = MemoryStore::builder()
        .clock(clock.clone())
        .build()
        .expect("valid bounds");
    let layer = IdempotencyLayer::new(store).principal(PrincipalMode::Optional);
    let (server, runs) = start(Router::new().route("/", post(short_lived)), layer).await;

    assert_eq!(post_key(&server, "/", "k").await.text(), "run 1");
    let replay = post_key(&server, "/", "k").await;
    assert!(replay.is_replay(), "replayed within the retention");

    clock.advance(Duration::from_millis(1200));
    let after = post_key(&server, "/", "k").await;
    assert_eq!(
        (after.text(), after.is_replay()),
        ("run 2", false),
        "retention = \"1s\": the record is gone after 1.2 s and the handler runs again"
    );
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn per_route_lease_and_retention_reach_the_store() {
    let store = SpyStore::new();
    let routes = Router::new()
        .route("/timed", post(timed))
        .route("/plain", post(create));
    let engine = Engine::builder(store.clone())
        .lease(Duration::from_secs(7))
        .retention(Duration::from_secs(70))
        .build();
    let shared = IdempotencyLayer::new(engine).principal(PrincipalMode::Optional);
    let (server, _runs) = start(routes, shared).await;

    assert_eq!(post_key(&server, "/timed", "k-t").await.status, 201);
    assert_eq!(post_key(&server, "/plain", "k-p").await.status, 201);

    assert_eq!(
        store.leases_and_retentions(),
        vec![
            ("claim", Duration::from_millis(1500)),
            ("complete", Duration::from_secs(600)),
            ("claim", Duration::from_secs(7)),
            ("complete", Duration::from_secs(70)),
        ],
        "the attributed route claims with its own lease and completes with its own retention; \
         the plain route uses the shared ones"
    );
}

#[tokio::test]
async fn status_mode_replays_an_empty_body() {
    let (server, runs) = start(Router::new().route("/", post(status_only)), anonymous()).await;

    let first = post_key(&server, "/", "k").await;
    assert_eq!(
        (first.status.as_u16(), first.text()),
        (201, "secret 1"),
        "the caller gets the handler's body"
    );
    let replay = post_key(&server, "/", "k").await;
    assert_eq!(
        (replay.status.as_u16(), replay.text(), replay.is_replay()),
        (201, "", true),
        "response_mode = \"status_and_headers\": the replay has the status and an empty body"
    );
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn route_namespaces_keep_routes_apart() {
    let routes = Router::new()
        .route("/a", post(in_a))
        .route("/b", post(in_b))
        .route("/c", post(create))
        .route("/d", post(lenient));
    let (server, runs) = start(routes, anonymous().namespace("shop")).await;

    let a = post_key(&server, "/a", "same").await;
    let b = post_key(&server, "/b", "same").await;
    assert_eq!(
        (a.status.as_u16(), a.text(), b.status.as_u16(), b.text()),
        (201, "a run 1", 201, "b run 2"),
        "one key on two routes with different namespaces: two records"
    );
    assert_eq!(runs.count(), 2);

    // Control: without a namespace of their own both routes share `shop`, and the key is taken.
    let c = post_key(&server, "/c", "shared").await;
    let d = post_key(&server, "/d", "shared").await;
    assert_eq!(
        (c.status.as_u16(), d.status.as_u16()),
        (201, 422),
        "in one namespace the key is reused with another request: {}",
        d.text()
    );
}

#[tokio::test]
async fn header_and_request_body_options_apply() {
    let (server, runs) = start(Router::new().route("/", post(custom_header)), anonymous()).await;

    let first = send(post_to(&server, "/").header("x-request-key", "k")).await;
    let again = send(post_to(&server, "/").header("x-request-key", "k")).await;
    assert_eq!(
        (first.is_replay(), again.is_replay(), runs.count()),
        (false, true, 1),
        "the key is read from `x-request-key`"
    );

    let big = send(
        post_to(&server, "/")
            .header("x-request-key", "k-big")
            .body("0123456789abcdefX"),
    )
    .await;
    assert_eq!(
        big.status,
        413,
        "max_request_body = 16 refuses 17 bytes: {}",
        big.text()
    );
}

#[tokio::test]
async fn state_and_json_extractors_work() {
    let app = App::default();
    let routes = Router::new()
        .route("/payments", post(create_payment))
        .with_state(app.clone());
    let (server, _runs) = start(routes, anonymous()).await;
    let pay = |amount: u64| {
        post_to(&server, "/payments")
            .header("idempotency-key", "pay-1")
            .json(&serde_json::json!({ "amount": amount }))
    };

    let first = send(pay(42)).await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(first.text(), r#"{"amount":42,"payment":1}"#);
    let again = send(pay(42)).await;
    assert_eq!(
        (again.text(), again.is_replay()),
        (first.text(), true),
        "the same payment is replayed"
    );
    assert_eq!(
        again.header("content-type"),
        Some("application/json"),
        "with its content type"
    );
    let changed = send(pay(43)).await;
    assert_eq!(
        changed.status,
        422,
        "the key with another body: {}",
        changed.text()
    );
    assert_eq!(app.payments.load(Ordering::SeqCst), 1, "charged once");

    let unkeyed =
        send(post_to(&server, "/payments").json(&serde_json::json!({ "amount": 1 }))).await;
    assert_eq!(unkeyed.status, 400, "`require_key`: {}", unkeyed.text());
}

#[tokio::test]
async fn a_missing_config_is_a_500_that_says_what_to_add() {
    let runs = Runs::default();
    let app = Router::new()
        .route("/", post(create))
        .layer(Extension(runs.clone()));
    let server = TestServer::start(app).await;

    let answer = post_key(&server, "/", "k").await;
    assert_eq!(answer.status, 500);
    assert_eq!(
        answer.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        answer.text().contains(
            "no IdempotentRoutes in the request extensions: add `.layer(Extension(IdempotentRoutes::new(...)))` to the router"
        ),
        "the detail says what to add: {}",
        answer.text()
    );
    // A problem document as every other the crate sends: its `type` names the case.
    let problem: serde_json::Value = serde_json::from_str(answer.text()).expect("json");
    assert_eq!(problem["code"], "idempotency.config_missing");
    assert_eq!(
        problem["type"],
        "https://docs.rs/tower-idempotency/latest/tower_idempotency/struct.IdempotentRoutes.html",
        "{problem}"
    );
    assert_eq!(runs.count(), 0, "the handler did not run");
}

#[tokio::test]
async fn the_principal_comes_from_a_middleware() {
    // Demo authentication: `x-user: <name>` becomes the request's `Principal`.
    let routes = with_auth_header(Router::new().route("/", post(create)), "x-user");
    // The shared default: a principal is required.
    let (server, runs) = start(routes, IdempotencyLayer::default()).await;
    let as_user = |user: &str| {
        post_to(&server, "/")
            .header("idempotency-key", "k")
            .header("x-user", user)
    };

    let anonymous = post_key(&server, "/", "k").await;
    assert_eq!(anonymous.status, 401, "no principal: {}", anonymous.text());

    let alice = send(as_user("alice")).await;
    let alice_again = send(as_user("alice")).await;
    let bob = send(as_user("bob")).await;
    assert_eq!(
        (
            alice.text(),
            alice_again.is_replay(),
            bob.text(),
            bob.is_replay()
        ),
        ("run 1", true, "run 2", false),
        "alice's repeat is replayed; bob's request under the same key is his own"
    );
    assert_eq!(runs.count(), 2);
}

/// The handler's extractors run before the key is claimed: a request they
/// refuse (malformed JSON → 400, no content-type → 415, a body that does not deserialize →
/// 422) is answered without a store call, so the corrected request runs under the same key.
#[tokio::test]
async fn a_request_its_extractors_refuse_is_not_claimed_and_the_corrected_one_runs() {
    let app = App::default();
    let store = SpyStore::new();
    let routes = Router::new()
        .route("/payments", post(create_payment))
        .with_state(app.clone());
    let shared = IdempotencyLayer::new(store.clone()).principal(PrincipalMode::Optional);
    let (server, _runs) = start(routes, shared).await;
    let payments = || post_to(&server, "/payments");
    let valid = r#"{"amount":42}"#;
    let cases = [
        (
            "malformed JSON",
            payments()
                .header("content-type", "application/json")
                .body(r#"{"amount":"#),
            400,
        ),
        ("no content-type", payments().body(valid), 415),
        (
            "a body that does not deserialize",
            payments()
                .header("content-type", "application/json")
                .body(r#"{"amount":"many"}"#),
            422,
        ),
    ];
    for (i, (what, bad, status)) in cases.into_iter().enumerate() {
        let key = format!("pay-{i}");
        let claims_before = store.claims();
        let refused = send(bad.header("idempotency-key", &key)).await;
        assert_eq!(refused.status, status, "{what}: {}", refused.text());
        assert!(
            !refused.text().contains("idempotency."),
            "{what}: axum's own rejection: {}",
            refused.text()
        );
        assert_eq!(
            store.claims(),
            claims_before,
            "{what}: refused before any store call"
        );
        let corrected = || {
            payments()
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .body(valid)
        };
        let ran = send(corrected()).await;
        assert_eq!(
            (ran.status.as_u16(), ran.is_replay()),
            (201, false),
            "{what}, then the corrected request under the same key runs: {}",
            ran.text()
        );
        let again = send(corrected()).await;
        assert_eq!((again.text(), again.is_replay()), (ran.text(), true));
    }
    assert_eq!(app.payments.load(Ordering::SeqCst), 3, "one charge per key");
}

/// The key extractors in an attributed handler see the key the request is claimed under
/// (they run before the claim, on the same key and scope).
#[tokio::test]
async fn the_key_extractors_see_the_key_the_request_is_claimed_under() {
    let (server, runs) = start(
        Router::new().route("/", post(with_keys)),
        anonymous().namespace("shop"),
    )
    .await;
    let derived = DerivedKey::derive(
        "shop",
        &Scope::anonymous(),
        &IdempotencyKey::new("k-x").expect("a key"),
    );
    let expected = format!("run 1 key=k-x derived={derived} body=hello");
    for replayed in [false, true] {
        let a = send(
            post_to(&server, "/")
                .header("idempotency-key", "k-x")
                .body("hello"),
        )
        .await;
        assert_eq!(
            (a.status.as_u16(), a.is_replay()),
            (200, replayed),
            "{}",
            a.text()
        );
        assert_eq!(a.text(), expected);
    }
    let unkeyed = send(post_to(&server, "/").body("hello")).await;
    assert_eq!(unkeyed.text(), "run 2 key=- derived=- body=hello");
    assert_eq!(runs.count(), 2);
}

/// The router's `IdempotencyLayer` and `#[idempotent]` on a route, over one store, with the configuration extension outside or inside the layer: the attribute sees
/// the layer's claim of the same store key and passes the request through, so the handler
/// runs once and the repeat is a replay (not a 409 recorded by the layer).
#[tokio::test]
async fn a_router_layer_and_the_attribute_over_one_store_run_the_handler_once() {
    for extension_outside in [false, true] {
        let shared = anonymous();
        let runs = Runs::default();
        let routes = Router::new()
            .route("/", post(create))
            .layer(Extension(runs.clone()));
        let config = Extension(IdempotentRoutes::new(shared.clone()));
        let app = if extension_outside {
            routes.layer(shared).layer(config)
        } else {
            routes.layer(config).layer(shared)
        };
        let server = TestServer::start(app).await;

        let first = post_key(&server, "/", "k-nested").await;
        assert_eq!(
            (first.status.as_u16(), first.text(), first.is_replay()),
            (201, "run 1", false),
            "extension outside: {extension_outside}; the handler runs"
        );
        let again = post_key(&server, "/", "k-nested").await;
        assert_eq!(
            (again.status.as_u16(), again.text(), again.is_replay()),
            (201, "run 1", true),
            "extension outside: {extension_outside}; the repeat is replayed"
        );
        assert_eq!(runs.count(), 1);
    }
}

#[idempotent(wait_in_flight = "10s")]
async fn slow_waited(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    // Counted first: the test sends the repeat once the run has begun.
    let run = runs.next();
    tokio::time::sleep(Duration::from_secs(2)).await;
    (StatusCode::CREATED, format!("run {run}"))
}

/// `wait_in_flight` per route: a repeat sent while the first run sleeps waits for it and
/// gets the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_route_wait_in_flight_replays_to_the_waiting_duplicate() {
    let routes = Router::new().route("/waited", post(slow_waited));
    let (server, runs) = start(routes, anonymous()).await;
    let first = tokio::spawn(post_key_owned(server.url("/waited"), "w-1"));
    bounded(Duration::from_secs(10), "the first run to begin", async {
        while runs.count() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let repeat = post_key(&server, "/waited", "w-1").await;
    let first = first.await.expect("the first request");
    assert_eq!(first.status.as_u16(), 201);
    assert!(repeat.is_replay(), "{}", repeat.describe());
    assert_eq!(repeat.text(), first.text());
    assert_eq!(runs.count(), 1, "the handler ran once");
}

async fn post_key_owned(url: String, key: &'static str) -> Answer {
    send(
        crate::support::http::client()
            .post(url)
            .header("idempotency-key", key),
    )
    .await
}

/// Feature `metrics`: attributed handlers count under the door `route`, per-route options or
/// not, and a router without the configuration counts `config_missing`.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn attributed_handlers_count_under_the_route_door() {
    use metrics_util::debugging::DebuggingRecorder;
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let counted = || crate::support::metrics::moved_once(&snap);
    let routes = Router::new()
        .route("/", post(create))
        .route("/strict", post(strict));
    let (server, _runs) = start(routes, anonymous().require_key(false)).await;

    assert_eq!(post_key(&server, "/", "k-1").await.status, 201);
    assert_eq!(
        counted(),
        ["door=route,outcome=ran", "door=route,result=completed"]
    );
    assert!(post_key(&server, "/", "k-1").await.is_replay());
    assert_eq!(counted(), ["door=route,outcome=replayed"]);
    assert_eq!(send(post_to(&server, "/strict")).await.status, 400);
    assert_eq!(
        counted(),
        ["door=route,outcome=key_missing"],
        "the route's own options"
    );

    let bare = TestServer::start(
        Router::new()
            .route("/", post(create))
            .layer(Extension(Runs::default())),
    )
    .await;
    assert_eq!(post_key(&bare, "/", "k").await.status, 500);
    assert_eq!(counted(), ["door=route,outcome=config_missing"]);
}

/// The steps an attributed handler keeps past its request.
static KEPT: std::sync::Mutex<Option<Steps>> = std::sync::Mutex::new(None);

/// Takes the steps twice, and keeps them past the request.
#[idempotent]
async fn steps_twice_and_kept(a: Steps, b: Steps) -> String {
    a.run("reserve", Raw, |_| async { Ok::<_, String>(String::new()) })
        .await
        .expect("the first step runs");
    let again = b
        .run("reserve", Raw, |_| async { Ok::<_, String>(String::new()) })
        .await;
    *KEPT.lock().expect("not poisoned") = Some(b);
    format!("{:?}", again.map_err(|e| e.kind()))
}

#[tokio::test]
async fn steps_of_an_attributed_handler_are_one_sequence_and_run_nothing_past_the_request() {
    let (server, _runs) = start(
        Router::new().route("/twice", post(steps_twice_and_kept)),
        anonymous(),
    )
    .await;
    let answer = post_key(&server, "/twice", "t-1").await;
    assert_eq!(answer.text(), "Err(NameReused)", "{}", answer.describe());
    let kept = KEPT.lock().unwrap().take().unwrap();
    let e = kept
        .run("charge", Raw, |_| async {
            panic!("a step past its request must not run");
            #[allow(unreachable_code)]
            Ok::<String, String>(String::new())
        })
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        tower_idempotency::engine::StepErrorKind::ClaimLost,
        "{e}"
    );
    server.stop().await;
}

#[idempotent(mark_first_runs)]
async fn marked(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

/// `mark_first_runs` per route: its first run carries `Idempotent-Replayed: false`, the
/// replay `true`; a route without the option sends the header on replays only.
#[tokio::test]
async fn per_route_mark_first_runs_marks_the_first_answer() {
    let routes = Router::new()
        .route("/marked", post(marked))
        .route("/", post(create));
    let (server, runs) = start(routes, anonymous()).await;
    let first = post_key(&server, "/marked", "m-1").await;
    assert_eq!(first.status.as_u16(), 201, "{}", first.describe());
    assert_eq!(first.header("idempotent-replayed"), Some("false"));
    let again = post_key(&server, "/marked", "m-1").await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let plain = post_key(&server, "/", "m-2").await;
    assert_eq!(plain.header("idempotent-replayed"), None, "off by default");
    assert_eq!(runs.count(), 2);
}
