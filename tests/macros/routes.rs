//! `#[idempotent]` handlers over a real TCP server: replay, per-route options merged over the
//! shared `IdempotentRoutes`, extractors and state, the principal from a middleware, and a
//! router that forgot the configuration.

#![cfg(feature = "macros")]

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde::Deserialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::record::Record;
use tower_idempotency::{
    Claim, DerivedKey, Fingerprint, IdempotencyKey, IdempotencyLayer, IdempotentRoutes,
    MemoryStore, Principal, Scope, Store, StoreError, StoreKey, Token, idempotent,
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

#[idempotent(required)]
async fn strict(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(ttl = "1s")]
async fn short_lived(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(lease = "1500ms", ttl = "10m")]
async fn timed(Extension(runs): Extension<Runs>) -> (StatusCode, String) {
    (StatusCode::CREATED, format!("run {}", runs.next()))
}

#[idempotent(response = "status")]
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

#[idempotent(header = "X-Request-Key", max_request_body = 16)]
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
#[idempotent(required, lease = "30s", ttl = "1h")]
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
#[idempotent(required = false)]
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
    IdempotencyLayer::new().principal(PrincipalMode::Optional)
}

/// Serves `router` on a loopback port; the server task ends with the test's runtime.
async fn serve(router: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener.local_addr().expect("the listener's address");
    tokio::spawn(async move {
        axum::serve(listener, router)
            .await
            .expect("the test server failed");
    });
    format!("http://{addr}")
}

/// A router of `routes` with a run counter and the shared configuration of `layer`.
async fn server<St: Store>(
    routes: Router,
    layer: IdempotencyLayer<St>,
) -> (String, Runs, reqwest::Client) {
    let runs = Runs::default();
    let app = routes
        .layer(Extension(runs.clone()))
        .layer(Extension(IdempotentRoutes::new(layer)));
    (serve(app).await, runs, reqwest::Client::new())
}

struct Answer {
    status: u16,
    replayed: bool,
    content_type: Option<String>,
    body: String,
}

async fn post_with(req: reqwest::RequestBuilder) -> Answer {
    let res = req.send().await.expect("the request reaches the server");
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let content_type = header("content-type");
    let status = res.status().as_u16();
    let body = res.text().await.expect("the response body");
    Answer {
        status,
        replayed,
        content_type,
        body,
    }
}

async fn post_key(client: &reqwest::Client, url: String, key: &str) -> Answer {
    post_with(client.post(url).header("idempotency-key", key)).await
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn runs_once_and_replays_the_repeat() {
    let (url, runs, client) = server(Router::new().route("/", post(create)), anonymous()).await;

    let first = post_key(&client, format!("{url}/"), "k-1").await;
    assert_eq!(
        (first.status, first.body.as_str(), first.replayed),
        (201, "run 1", false),
        "the first request runs the handler"
    );
    let again = post_key(&client, format!("{url}/"), "k-1").await;
    assert_eq!(
        (again.status, again.body.as_str(), again.replayed),
        (201, "run 1", true),
        "the repeat is the first answer, replayed"
    );
    assert_eq!(runs.count(), 1, "the handler ran once");

    let other = post_key(&client, format!("{url}/"), "k-2").await;
    assert_eq!(
        (other.body.as_str(), other.replayed),
        ("run 2", false),
        "another key runs again"
    );
}

#[tokio::test]
async fn required_refuses_a_request_without_a_key_where_the_shared_config_does_not() {
    let routes = Router::new()
        .route("/strict", post(strict))
        .route("/lenient", post(lenient));
    let (url, runs, client) = server(routes, anonymous().required(false)).await;

    let refused = post_with(client.post(format!("{url}/strict"))).await;
    assert_eq!(
        refused.status, 400,
        "`required` on the route: {}",
        refused.body
    );
    assert!(
        refused.body.contains("idempotency.key_missing"),
        "a problem body with the machine code: {}",
        refused.body
    );
    assert_eq!(runs.count(), 0, "the refused request did not run");

    let passed = post_with(client.post(format!("{url}/lenient"))).await;
    assert_eq!(
        (passed.status, passed.replayed),
        (201, false),
        "the shared `required(false)` holds on a route without the option"
    );
}

#[tokio::test]
async fn per_route_ttl_expires_the_record() {
    let (url, runs, client) =
        server(Router::new().route("/", post(short_lived)), anonymous()).await;

    assert_eq!(
        post_key(&client, format!("{url}/"), "k").await.body,
        "run 1"
    );
    let replay = post_key(&client, format!("{url}/"), "k").await;
    assert!(replay.replayed, "replayed within the ttl");

    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = post_key(&client, format!("{url}/"), "k").await;
    assert_eq!(
        (after.body.as_str(), after.replayed),
        ("run 2", false),
        "ttl = \"1s\": the record is gone after 1.2 s and the handler runs again"
    );
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn per_route_lease_and_ttl_reach_the_store() {
    let store = RecordingStore::default();
    let seen = Arc::clone(&store.seen);
    let routes = Router::new()
        .route("/timed", post(timed))
        .route("/plain", post(create));
    let shared = IdempotencyLayer::with_store(store)
        .principal(PrincipalMode::Optional)
        .lease(Duration::from_secs(7))
        .ttl(Duration::from_secs(70));
    let (url, _runs, client) = server(routes, shared).await;

    assert_eq!(
        post_key(&client, format!("{url}/timed"), "k-t")
            .await
            .status,
        201
    );
    assert_eq!(
        post_key(&client, format!("{url}/plain"), "k-p")
            .await
            .status,
        201
    );

    let seen = seen.lock().expect("the store's log").clone();
    assert_eq!(
        seen,
        vec![
            ("claim", Duration::from_millis(1500)),
            ("complete", Duration::from_secs(600)),
            ("claim", Duration::from_secs(7)),
            ("complete", Duration::from_secs(70)),
        ],
        "the attributed route claims with its own lease and completes with its own ttl; \
         the plain route uses the shared ones"
    );
}

#[tokio::test]
async fn status_mode_replays_an_empty_body() {
    let (url, runs, client) =
        server(Router::new().route("/", post(status_only)), anonymous()).await;

    let first = post_key(&client, format!("{url}/"), "k").await;
    assert_eq!(
        (first.status, first.body.as_str()),
        (201, "secret 1"),
        "the caller gets the handler's body"
    );
    let replay = post_key(&client, format!("{url}/"), "k").await;
    assert_eq!(
        (replay.status, replay.body.as_str(), replay.replayed),
        (201, "", true),
        "response = \"status\": the replay has the status and an empty body"
    );
    assert_eq!(runs.count(), 1);
}

#[tokio::test]
async fn namespace_suffixes_keep_routes_apart() {
    let routes = Router::new()
        .route("/a", post(in_a))
        .route("/b", post(in_b))
        .route("/c", post(create))
        .route("/d", post(lenient));
    let (url, runs, client) = server(routes, anonymous().namespace("shop")).await;

    let a = post_key(&client, format!("{url}/a"), "same").await;
    let b = post_key(&client, format!("{url}/b"), "same").await;
    assert_eq!(
        (a.status, a.body.as_str(), b.status, b.body.as_str()),
        (201, "a run 1", 201, "b run 2"),
        "one key on two routes with different namespace suffixes: two records"
    );
    assert_eq!(runs.count(), 2);

    // Control: without suffixes both routes share `shop`, and the key is taken.
    let c = post_key(&client, format!("{url}/c"), "shared").await;
    let d = post_key(&client, format!("{url}/d"), "shared").await;
    assert_eq!(
        (c.status, d.status),
        (201, 422),
        "in one namespace the key is reused with another request: {}",
        d.body
    );
}

#[tokio::test]
async fn header_and_request_body_options_apply() {
    let (url, runs, client) =
        server(Router::new().route("/", post(custom_header)), anonymous()).await;

    let first = post_with(client.post(format!("{url}/")).header("x-request-key", "k")).await;
    let again = post_with(client.post(format!("{url}/")).header("x-request-key", "k")).await;
    assert_eq!(
        (first.replayed, again.replayed, runs.count()),
        (false, true, 1),
        "the key is read from `x-request-key`"
    );

    let big = post_with(
        client
            .post(format!("{url}/"))
            .header("x-request-key", "k-big")
            .body("0123456789abcdefX"),
    )
    .await;
    assert_eq!(
        big.status, 413,
        "max_request_body = 16 refuses 17 bytes: {}",
        big.body
    );
}

#[tokio::test]
async fn state_and_json_extractors_work() {
    let app = App::default();
    let routes = Router::new()
        .route("/payments", post(create_payment))
        .with_state(app.clone());
    let (url, _runs, client) = server(routes, anonymous()).await;
    let pay = |amount: u64| {
        client
            .post(format!("{url}/payments"))
            .header("idempotency-key", "pay-1")
            .json(&serde_json::json!({ "amount": amount }))
    };

    let first = post_with(pay(42)).await;
    assert_eq!(first.status, 201, "{}", first.body);
    assert_eq!(first.body, r#"{"amount":42,"payment":1}"#);
    let again = post_with(pay(42)).await;
    assert_eq!(
        (again.body.as_str(), again.replayed),
        (first.body.as_str(), true),
        "the same payment is replayed"
    );
    assert_eq!(
        again.content_type.as_deref(),
        Some("application/json"),
        "with its content type"
    );
    let changed = post_with(pay(43)).await;
    assert_eq!(
        changed.status, 422,
        "the key with another body: {}",
        changed.body
    );
    assert_eq!(app.payments.load(Ordering::SeqCst), 1, "charged once");

    let unkeyed = post_with(
        client
            .post(format!("{url}/payments"))
            .json(&serde_json::json!({ "amount": 1 })),
    )
    .await;
    assert_eq!(unkeyed.status, 400, "`required`: {}", unkeyed.body);
}

/// The handler's extractors run before the key is claimed (issue 11 item 4): a request they
/// refuse (malformed JSON → 400, no content-type → 415, a body that does not deserialize →
/// 422) is answered without a store call, so the corrected request runs under the same key.
#[tokio::test]
async fn a_request_its_extractors_refuse_is_not_claimed_and_the_corrected_one_runs() {
    let app = App::default();
    let store = RecordingStore::default();
    let seen = Arc::clone(&store.seen);
    let routes = Router::new()
        .route("/payments", post(create_payment))
        .with_state(app.clone());
    let shared = IdempotencyLayer::with_store(store).principal(PrincipalMode::Optional);
    let (url, _runs, client) = server(routes, shared).await;
    let payments = || client.post(format!("{url}/payments"));
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
        let refused = post_with(bad.header("idempotency-key", &key)).await;
        assert_eq!(refused.status, status, "{what}: {}", refused.body);
        assert!(
            !refused.body.contains("idempotency."),
            "{what}: axum's own rejection: {}",
            refused.body
        );
        assert!(
            seen.lock().expect("the store's log").is_empty(),
            "{what}: refused before any store call"
        );
        let corrected = || {
            payments()
                .header("content-type", "application/json")
                .header("idempotency-key", &key)
                .body(valid)
        };
        let ran = post_with(corrected()).await;
        assert_eq!(
            (ran.status, ran.replayed),
            (201, false),
            "{what}, then the corrected request under the same key runs: {}",
            ran.body
        );
        let again = post_with(corrected()).await;
        assert_eq!(
            (again.body.as_str(), again.replayed),
            (ran.body.as_str(), true)
        );
        seen.lock().expect("the store's log").clear();
    }
    assert_eq!(app.payments.load(Ordering::SeqCst), 3, "one charge per key");
}

#[tokio::test]
async fn the_key_extractors_see_the_key_the_request_is_claimed_under() {
    let (url, runs, client) = server(
        Router::new().route("/", post(with_keys)),
        anonymous().namespace("shop"),
    )
    .await;
    let derived = DerivedKey::derive(
        "shop",
        &Scope::anonymous(),
        &IdempotencyKey::new("k-x", 255).expect("a key"),
    );
    let expected = format!("run 1 key=k-x derived={derived} body=hello");
    for replayed in [false, true] {
        let a = post_with(
            client
                .post(format!("{url}/"))
                .header("idempotency-key", "k-x")
                .body("hello"),
        )
        .await;
        assert_eq!((a.status, a.replayed), (200, replayed), "{}", a.body);
        assert_eq!(a.body, expected);
    }
    let unkeyed = post_with(client.post(format!("{url}/")).body("hello")).await;
    assert_eq!(unkeyed.body, "run 2 key=- derived=- body=hello");
    assert_eq!(runs.count(), 2);
}

#[tokio::test]
async fn a_missing_config_is_a_500_that_says_what_to_add() {
    let runs = Runs::default();
    let app = Router::new()
        .route("/", post(create))
        .layer(Extension(runs.clone()));
    let url = serve(app).await;

    let answer = post_key(&reqwest::Client::new(), format!("{url}/"), "k").await;
    assert_eq!(answer.status, 500);
    assert_eq!(
        answer.content_type.as_deref(),
        Some("application/problem+json")
    );
    assert!(
        answer.body.contains(
            "no IdempotentRoutes in the request extensions: add `.layer(Extension(IdempotentRoutes::new(...)))` to the router"
        ),
        "the detail says what to add: {}",
        answer.body
    );
    assert_eq!(runs.count(), 0, "the handler did not run");
}

/// The router's `IdempotencyLayer` and `#[idempotent]` on a route, over one store (issue 11
/// item 3), with the configuration extension outside or inside the layer: the attribute sees
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
        let url = serve(app).await;
        let client = reqwest::Client::new();

        let first = post_key(&client, format!("{url}/"), "k-nested").await;
        assert_eq!(
            (first.status, first.body.as_str(), first.replayed),
            (201, "run 1", false),
            "extension outside: {extension_outside}; the handler runs"
        );
        let again = post_key(&client, format!("{url}/"), "k-nested").await;
        assert_eq!(
            (again.status, again.body.as_str(), again.replayed),
            (201, "run 1", true),
            "extension outside: {extension_outside}; the repeat is replayed"
        );
        assert_eq!(runs.count(), 1);
    }
}

/// Demo authentication: `x-user: <name>` becomes the request's `Principal`.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(user) = user {
        req.extensions_mut().insert(Principal::new(user));
    }
    next.run(req).await
}

#[tokio::test]
async fn the_principal_comes_from_a_middleware() {
    let routes = Router::new()
        .route("/", post(create))
        .layer(middleware::from_fn(authenticate));
    // The shared default: a principal is required.
    let (url, runs, client) = server(routes, IdempotencyLayer::new()).await;
    let as_user = |user: &str| {
        client
            .post(format!("{url}/"))
            .header("idempotency-key", "k")
            .header("x-user", user)
    };

    let anonymous = post_key(&client, format!("{url}/"), "k").await;
    assert_eq!(anonymous.status, 401, "no principal: {}", anonymous.body);

    let alice = post_with(as_user("alice")).await;
    let alice_again = post_with(as_user("alice")).await;
    let bob = post_with(as_user("bob")).await;
    assert_eq!(
        (
            alice.body.as_str(),
            alice_again.replayed,
            bob.body.as_str(),
            bob.replayed
        ),
        ("run 1", true, "run 2", false),
        "alice's repeat is replayed; bob's request under the same key is his own"
    );
    assert_eq!(runs.count(), 2);
}

// ---------------------------------------------------------------------------------------------
// A store that logs the lease of each claim and the ttl of each completion
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct RecordingStore {
    inner: MemoryStore,
    seen: Arc<Mutex<Vec<(&'static str, Duration)>>>,
}

impl RecordingStore {
    fn log(&self, step: &'static str, d: Duration) {
        self.seen.lock().expect("the store's log").push((step, d));
    }
}

impl Store for RecordingStore {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.log("claim", lease);
        self.inner.claim(key, fingerprint, lease).await
    }
    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.log("complete", ttl);
        self.inner
            .complete(key, token, fingerprint, record, ttl)
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
}
