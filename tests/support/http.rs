//! Helpers for the tests over HTTP: a real axum server on loopback, one test handler steered by
//! request headers, a store wrapper that counts (and can fail or block) its steps, and a client
//! that captures whole answers.
//!
//! The test handler (`work`) reads these request headers (none of them is part of the default
//! fingerprint, so a repeat may change them freely):
//!
//! | header | effect |
//! | --- | --- |
//! | `x-principal` / `x-tenant` | the demo authentication puts a [`Principal`] into extensions |
//! | `x-user` | the principal of [`Work::user_app`] (`alice` when absent) |
//! | `x-delay-ms` | the handler sleeps this long before answering |
//! | `x-gate` | the handler waits until [`Work::open`] opens the gate of this name |
//! | `x-status` | the status it answers with (default 201) |
//! | `x-body-bytes` | answers this many `x` bytes (known length) instead of JSON |
//! | `x-stream-chunks` | answers this many 10-byte chunks with no known length |
//! | `x-fail-body-first` | the first execution's body fails after one chunk |
//! | `x-declare` | `not-started`, `record` or `ambiguous`: the answer carries the `Verdict` `Release`, `Record` or `Hold` |
//! | `x-mode: panic` | the handler panics while [`Work::panic_next`] has panics left |
//! | `x-mode: cookies` | the answer carries 100 more `Set-Cookie` lines `sid<i>=<x-marker>-<i>` |
//! | `x-mode: obs-text` | the answer carries [`OBS_TEXT`] as `Content-Disposition` and `X-Raw` |
//! | `x-marker` | the value of the `session` cookie (`s<execution>` when absent) |
//!
//! Every answer carries `Location`, `Set-Cookie`, `X-Request-Id`, two `Link` lines and
//! `X-Order-Id`, so replay tests can see which headers come back. Its JSON body depends on how
//! the [`Work`] was made: [`Work::new`] echoes the request, [`Work::plain`] keeps only its
//! length, [`Work::per_key`] numbers executions per idempotency key (the storms and faults).

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, oneshot};
use tokio::task::JoinHandle;
use tower_idempotency::engine::Verdict;
use tower_idempotency::engine::{Fingerprint, Scope};
use tower_idempotency::http::{PrincipalMode, REPLAYED_HEADER, declare};
use tower_idempotency::store::Record;
use tower_idempotency::store::{Claim, Forgotten, StoreError, StoreErrorKind, StoreKey, Token};
use tower_idempotency::{IdempotencyKey, IdempotencyLayer, MemoryStore, Principal, Store};

/// The time limit of every request a test client sends.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

/// The layer's namespace when none is set.
pub(crate) const LAYER_NS: &str = "http";

/// A `Content-Disposition` value with obs-text bytes (0x80–0xff): not UTF-8 (`x-mode: obs-text`).
pub(crate) const OBS_TEXT: &[u8] = b"attachment; filename=\"r\xe9sum\xe9-\x80\xff.txt\"";

/// Locks `m`, poisoned or not (a panicking test thread must not hide what it counted).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ----------------------------------------------------------------------------------------------
// The server
// ----------------------------------------------------------------------------------------------

/// An axum app served on `127.0.0.1:<random port>` by a spawned task; stopped on drop.
#[derive(Debug)]
pub(crate) struct TestServer {
    addr: SocketAddr,
    client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl TestServer {
    /// Serves `router` with `axum::serve` on a fresh loopback port.
    pub(crate) async fn start(router: Router) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port for the test server");
        let addr = listener
            .local_addr()
            .expect("local address of the listener");
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .expect("the test server failed");
        });
        Self {
            addr,
            client: client(),
            shutdown: Some(tx),
            task,
        }
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port><path>`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The shared client (a connection pool over loopback).
    pub(crate) fn client(&self) -> &reqwest::Client {
        &self.client
    }

    /// A POST to `path` with the JSON body `body`.
    pub(crate) fn post(&self, path: &str, body: &str) -> reqwest::RequestBuilder {
        self.client
            .post(self.url(path))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.to_owned())
    }

    /// A request of `method` to `path` without a body.
    pub(crate) fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path))
    }

    /// `POST /work` with the idempotency key `key` and a JSON body that is the same for every
    /// repeat of the key (and differs between keys).
    pub(crate) fn work(&self, key: &str) -> reqwest::RequestBuilder {
        self.post("/work", &format!(r#"{{"item":"book","key":"{key}"}}"#))
            .header("idempotency-key", key)
    }

    /// Stops the server: a graceful shutdown signal, then an abort if it takes over 5 s.
    pub(crate) async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .is_err()
        {
            self.task.abort();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.task.abort();
    }
}

/// A client for loopback tests: no proxy, no redirects followed, every request bounded by
/// [`REQUEST_TIMEOUT`].
pub(crate) fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("build the reqwest client")
}

/// [`Work::app`] of a fresh [`Work`] behind `layer`, on a [`TestServer`].
pub(crate) async fn server_with<St: Store>(layer: IdempotencyLayer<St>) -> (TestServer, Work) {
    let work = Work::new();
    let server = TestServer::start(work.app(layer)).await;
    (server, work)
}

/// [`Work::app`] of `work` behind the layer `layer` builds over a fresh memory store, on a
/// [`TestServer`]; returns the server and the store.
pub(crate) async fn memory_app(
    work: &Work,
    layer: impl FnOnce(Arc<MemoryStore>) -> IdempotencyLayer<Arc<MemoryStore>>,
) -> (TestServer, Arc<MemoryStore>) {
    let store = Arc::new(MemoryStore::new());
    let server = TestServer::start(work.app(layer(Arc::clone(&store)))).await;
    (server, store)
}

// ----------------------------------------------------------------------------------------------
// Requests and answers
// ----------------------------------------------------------------------------------------------

/// Test-only request settings on top of reqwest's builder.
pub(crate) trait RequestExt {
    /// The demo principal (`x-principal`).
    fn principal(self, name: &str) -> Self;
    /// The idempotency key (a valid one; invalid values go through `.header(...)`).
    fn key(self, key: &str) -> Self;
    /// The handler sleeps `ms` before answering.
    fn delay_ms(self, ms: u64) -> Self;
    /// The handler answers with this status.
    fn respond(self, status: u16) -> Self;
}

impl RequestExt for reqwest::RequestBuilder {
    fn principal(self, name: &str) -> Self {
        self.header("x-principal", name)
    }
    fn key(self, key: &str) -> Self {
        self.header("idempotency-key", key)
    }
    fn delay_ms(self, ms: u64) -> Self {
        self.header("x-delay-ms", ms.to_string())
    }
    fn respond(self, status: u16) -> Self {
        self.header("x-status", status.to_string())
    }
}

/// A whole answer: status, headers and body.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    /// From sending the request to the last byte of the answer.
    pub(crate) elapsed: Duration,
}

/// What an answer was, for the invariants of storms and faults.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    /// 201 from a run of the handler.
    Fresh,
    /// 201 replayed from the record (`Idempotent-Replayed: true`).
    Replay,
    /// 409 `idempotency.in_flight`.
    InFlight,
    /// 503 `idempotency.store_failed` with `Retry-After`.
    StoreFailed,
    /// Anything else: status and problem code.
    Other(u16, String),
}

impl Answer {
    /// Whether the layer replayed a record (`Idempotent-Replayed: true`).
    pub(crate) fn is_replay(&self) -> bool {
        self.headers
            .get(REPLAYED_HEADER)
            .is_some_and(|v| v.as_bytes() == b"true")
    }

    /// The body as JSON.
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "the answer body is not JSON ({e}): status {}, body {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The body as text.
    pub(crate) fn text(&self) -> &str {
        std::str::from_utf8(&self.body)
            .unwrap_or_else(|e| panic!("the answer body is not UTF-8 ({e}): {}", self.describe()))
    }

    /// The handler's `execution` number in a JSON answer.
    pub(crate) fn execution(&self) -> u64 {
        self.json()["execution"]
            .as_u64()
            .unwrap_or_else(|| panic!("no `execution` in {}", self.describe()))
    }

    /// The `code` of a JSON body (a rejection's machine code); `None` when there is none or the
    /// body is not JSON.
    pub(crate) fn code(&self) -> Option<String> {
        let json: serde_json::Value = serde_json::from_slice(&self.body).ok()?;
        json["code"].as_str().map(str::to_owned)
    }

    /// A header as a string (`None` when absent).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("header value is visible ASCII"))
    }

    /// The `Retry-After` header.
    pub(crate) fn retry_after(&self) -> Option<&str> {
        self.header("retry-after")
    }

    /// Every value of a header, in order.
    pub(crate) fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// What this answer was.
    pub(crate) fn kind(&self) -> Kind {
        match (self.status.as_u16(), self.code().as_deref()) {
            (201, _) if self.is_replay() => Kind::Replay,
            (201, _) => Kind::Fresh,
            (409, Some("idempotency.in_flight")) => Kind::InFlight,
            (503, Some("idempotency.store_failed")) if self.retry_after().is_some() => {
                Kind::StoreFailed
            }
            (s, c) => Kind::Other(s, c.unwrap_or("-").to_owned()),
        }
    }

    /// A one-line summary for assertion messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "status {} replay={} retry-after={:?} after {:?}: body {:?}",
            self.status,
            self.is_replay(),
            self.retry_after(),
            self.elapsed,
            String::from_utf8_lossy(&self.body)
        )
    }

    /// Asserts a problem+json rejection with `status` and the machine code `code`.
    #[track_caller]
    pub(crate) fn assert_problem(&self, status: u16, code: &str) {
        assert_eq!(
            self.status.as_u16(),
            status,
            "expected a {status} `{code}` rejection, got {}",
            self.describe()
        );
        assert_eq!(
            self.header("content-type"),
            Some("application/problem+json"),
            "a rejection is problem+json: {}",
            self.describe()
        );
        let json = self.json();
        assert_eq!(
            json["code"].as_str(),
            Some(code),
            "wrong machine code in {}",
            self.describe()
        );
        assert_eq!(
            json["status"].as_u64(),
            Some(u64::from(status)),
            "the JSON `status` is the HTTP status: {}",
            self.describe()
        );
        assert!(!self.is_replay(), "a rejection is never a replay");
    }
}

/// Sends a request and reads the whole answer; a transport error is an `Err` (the client's
/// timeout bounds both).
pub(crate) async fn try_send(rb: reqwest::RequestBuilder) -> Result<Answer, String> {
    let start = Instant::now();
    let res = rb.send().await.map_err(|e| format!("{e:?}"))?;
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.bytes().await.map_err(|e| format!("{e:?}"))?;
    Ok(Answer {
        status,
        headers,
        body,
        elapsed: start.elapsed(),
    })
}

/// Sends a request and reads the whole answer; a transport error fails the test.
pub(crate) async fn send(rb: reqwest::RequestBuilder) -> Answer {
    try_send(rb)
        .await
        .unwrap_or_else(|e| panic!("the request reaches the server and its answer is read: {e}"))
}

/// Polls `cond` every 10 ms until it holds or `within` passes; returns whether it held.
pub(crate) async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `fut` with a time limit, panicking with `what` when it takes longer.
pub(crate) async fn bounded<F: Future>(within: Duration, what: &str, fut: F) -> F::Output {
    tokio::time::timeout(within, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {within:?}"))
}

// ----------------------------------------------------------------------------------------------
// The handler
// ----------------------------------------------------------------------------------------------

/// What the handler's JSON answer holds, and how it numbers executions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Flavour {
    /// `{"execution", "method", "path", "query", "body_len"}`, executions numbered per [`Work`].
    #[default]
    Echo,
    /// `{"execution", "body_len"}`, numbered per [`Work`]: nothing of the request but its length.
    Plain,
    /// `{"key", "execution", "total", "run"}`: `execution` numbered per idempotency key, `total`
    /// over every key, `run` a random tag of this run.
    PerKey,
}

/// The state of the test handler: how often it ran (in all and per key), how often it was
/// cancelled mid-way, its gates and the panics it owes. Clones share the state.
#[derive(Clone, Default, Debug)]
pub(crate) struct Work {
    state: Arc<WorkState>,
    flavour: Flavour,
}

#[derive(Default, Debug)]
struct WorkState {
    executions: AtomicUsize,
    finished: AtomicUsize,
    cancelled: AtomicUsize,
    panics_left: AtomicUsize,
    runs: Mutex<HashMap<String, u64>>,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl Work {
    /// A fresh counter set; the handler echoes the request:
    /// `{"execution", "method", "path", "query", "body_len"}`, executions numbered 1, 2, … over
    /// every request.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Like [`new`](Self::new), but the JSON answer is `{"execution", "body_len"}` only, so a
    /// record at rest holds nothing of the request (its query, say) but its length.
    pub(crate) fn plain() -> Self {
        Self {
            flavour: Flavour::Plain,
            ..Self::default()
        }
    }

    /// The handler of storms and faults: `{"key", "execution", "total", "run"}`, `execution`
    /// numbered per idempotency key, `total` over every key, `run` a random tag of the run.
    pub(crate) fn per_key() -> Self {
        Self {
            flavour: Flavour::PerKey,
            ..Self::default()
        }
    }

    /// How many times the handler started.
    pub(crate) fn executions(&self) -> usize {
        self.state.executions.load(Ordering::SeqCst)
    }

    /// How many times the handler ran to its end.
    pub(crate) fn finished(&self) -> usize {
        self.state.finished.load(Ordering::SeqCst)
    }

    /// How many times the handler's future was dropped before it finished.
    pub(crate) fn cancelled(&self) -> usize {
        self.state.cancelled.load(Ordering::SeqCst)
    }

    /// How many times the handler started for each idempotency key (`-` for none; keys that
    /// never ran are absent).
    pub(crate) fn runs(&self) -> HashMap<String, u64> {
        lock(&self.state.runs).clone()
    }

    /// How many times the handler started for the idempotency key `key`.
    pub(crate) fn runs_of(&self, key: &str) -> u64 {
        lock(&self.state.runs).get(key).copied().unwrap_or(0)
    }

    /// Waits (bounded) until the handler has started `n` times for `key`.
    pub(crate) async fn wait_runs(&self, key: &str, n: u64) {
        bounded(
            Duration::from_secs(10),
            "waiting for a handler run",
            async {
                while self.runs_of(key) < n {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            },
        )
        .await;
    }

    /// Lets every handler waiting on the gate `name` (`x-gate`), now or later, go on.
    pub(crate) fn open(&self, name: &str) {
        self.gate(name).add_permits(Semaphore::MAX_PERMITS / 2);
    }

    fn gate(&self, name: &str) -> Arc<Semaphore> {
        Arc::clone(
            lock(&self.state.gates)
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(0))),
        )
    }

    /// Makes the next `n` executions in `x-mode: panic` panic.
    pub(crate) fn panic_next(&self, n: usize) {
        self.state.panics_left.store(n, Ordering::SeqCst);
    }

    /// `POST /work`, `POST /other`, and `GET`/`PUT /work`, all served by [`work`], with no
    /// idempotency layer (callers add it the way they test).
    pub(crate) fn routes(&self) -> Router {
        Router::new()
            .route("/work", post(work).get(work).put(work))
            .route("/other", post(work))
            .with_state(self.clone())
    }

    /// [`routes`](Self::routes) behind `layer`, behind the demo authentication.
    pub(crate) fn app<St: Store>(&self, layer: IdempotencyLayer<St>) -> Router {
        with_auth(self.routes().layer(layer))
    }

    /// [`routes`](Self::routes) behind `layer`, whose principal is the `x-user` header (`alice`
    /// when absent; [`PrincipalMode::Required`]), and `GET /stats` (`{"executions": n}`) beside
    /// the layer.
    pub(crate) fn user_app<St: Store>(&self, layer: IdempotencyLayer<St>) -> Router {
        let layer = layer
            .principal(PrincipalMode::Required)
            .principal_fn(|parts| {
                let user = parts
                    .headers
                    .get("x-user")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("alice");
                Some(Scope::principal(user))
            });
        self.routes()
            .layer(layer)
            .route("/stats", get(stats).with_state(self.clone()))
    }
}

/// Counts a cancellation when dropped before `finish`.
struct CancelGuard {
    work: Work,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if self.done {
            self.work.state.finished.fetch_add(1, Ordering::SeqCst);
        } else {
            self.work.state.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn header_num(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// 16 random hex digits.
fn random_tag() -> String {
    let mut run = [0u8; 8];
    getrandom::fill(&mut run).expect("OS random source");
    run.iter().map(|b| format!("{b:02x}")).collect()
}

/// The test handler (see the module docs for the headers it reads).
pub(crate) async fn work(
    State(state): State<Work>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let total = state.state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .to_owned();
    let of_key = {
        let mut runs = lock(&state.state.runs);
        let n = runs.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let execution = match state.flavour {
        Flavour::PerKey => of_key,
        Flavour::Echo | Flavour::Plain => total as u64,
    };
    let mut guard = CancelGuard {
        work: state.clone(),
        done: false,
    };
    let mode = headers.get("x-mode").map(HeaderValue::as_bytes);
    if mode == Some(b"panic")
        && state
            .state
            .panics_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    {
        panic!("the handler panics on purpose (execution {execution})");
    }
    if let Some(ms) = header_num(&headers, "x-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(gate) = headers.get("x-gate").and_then(|v| v.to_str().ok()) {
        let gate = state.gate(gate);
        let _permit = gate.acquire().await.expect("gates are never closed");
    }
    let status = header_num(&headers, "x-status")
        .and_then(|s| u16::try_from(s).ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut res = if let Some(n) = header_num(&headers, "x-body-bytes") {
        let n = usize::try_from(n).expect("body size fits usize");
        (status, vec![b'x'; n]).into_response()
    } else if let Some(n) = header_num(&headers, "x-stream-chunks") {
        let chunks = (0..n).map(|_| Bytes::from_static(b"0123456789"));
        (status, AxumBody::new(Chunks::new(chunks))).into_response()
    } else if headers.contains_key("x-fail-body-first") && execution == 1 {
        (status, AxumBody::new(FailingBody::new())).into_response()
    } else {
        let json = match state.flavour {
            Flavour::Echo => serde_json::json!({
                "execution": execution,
                "method": method.as_str(),
                "path": uri.path(),
                "query": uri.query(),
                "body_len": body.len(),
            }),
            Flavour::Plain => serde_json::json!({ "execution": execution, "body_len": body.len() }),
            Flavour::PerKey => serde_json::json!({
                "key": key,
                "execution": execution,
                "total": total,
                "run": random_tag(),
            }),
        };
        (status, axum::Json(json)).into_response()
    };
    let marker = headers
        .get("x-marker")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let h = res.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/things/{execution}")).expect("location"),
    );
    let session = marker.clone().unwrap_or_else(|| format!("s{execution}"));
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!("session={session}")).expect("cookie"),
    );
    h.insert(
        "x-request-id",
        HeaderValue::from_str(&format!("req-{execution}")).expect("request id"),
    );
    h.insert(
        "x-order-id",
        HeaderValue::from_str(&format!("order-{execution}")).expect("order id"),
    );
    h.append(header::LINK, HeaderValue::from_static("<a>; rel=\"first\""));
    h.append(
        header::LINK,
        HeaderValue::from_static("<b>; rel=\"second\""),
    );
    match headers.get("x-declare").map(HeaderValue::as_bytes) {
        Some(b"not-started") => declare(&mut res, Verdict::Release),
        Some(b"record") => declare(&mut res, Verdict::Record),
        Some(b"ambiguous") => declare(&mut res, Verdict::Hold),
        _ => {}
    }
    let h = res.headers_mut();
    match mode {
        Some(b"cookies") => {
            let m = marker.as_deref().unwrap_or("cookie");
            for i in 0..100 {
                h.append(
                    header::SET_COOKIE,
                    HeaderValue::from_str(&format!("sid{i}={m}-{i}; Path=/")).expect("cookie"),
                );
            }
        }
        Some(b"obs-text") => {
            let v = HeaderValue::from_bytes(OBS_TEXT).expect("obs-text is a valid field value");
            h.insert(header::CONTENT_DISPOSITION, v.clone());
            h.insert("x-raw", v);
        }
        _ => {}
    }
    guard.done = true;
    res
}

async fn stats(State(work): State<Work>) -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({ "executions": work.executions() }))
}

fn principal_of(headers: &HeaderMap, principal_header: &str) -> Option<Principal> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let principal = Principal::new(get(principal_header)?);
    Some(match get("x-tenant") {
        Some(t) => principal.with_tenant(t),
        None => principal,
    })
}

/// The demo authentication: the header named by the state (and `x-tenant`) → a [`Principal`]
/// extension.
async fn auth(
    State(principal_header): State<&'static str>,
    mut req: Request,
    next: Next,
) -> Response {
    if let Some(principal) = principal_of(req.headers(), principal_header) {
        req.extensions_mut().insert(principal);
    }
    next.run(req).await
}

/// Wraps `router` in the demo authentication (which runs before anything inside it):
/// `x-principal` (and `x-tenant`) → a [`Principal`] extension.
pub(crate) fn with_auth(router: Router) -> Router {
    with_auth_header(router, "x-principal")
}

/// Like [`with_auth`], with the principal read from the header `principal_header`.
pub(crate) fn with_auth_header(router: Router, principal_header: &'static str) -> Router {
    router.layer(middleware::from_fn_with_state(principal_header, auth))
}

// ----------------------------------------------------------------------------------------------
// Bodies
// ----------------------------------------------------------------------------------------------

/// A body of chunks with no known length (sent chunked over HTTP/1.1).
#[derive(Debug)]
pub(crate) struct Chunks {
    chunks: VecDeque<Bytes>,
}

impl Chunks {
    /// A body made of `chunks`, in order.
    pub(crate) fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Self {
            chunks: chunks.into_iter().collect(),
        }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.chunks.pop_front().map(|c| Ok(Frame::data(c))))
    }

    fn size_hint(&self) -> SizeHint {
        // No exact length on purpose: hyper sends it with `Transfer-Encoding: chunked`.
        SizeHint::default()
    }
}

/// A body that yields one chunk, then fails.
#[derive(Debug, Default)]
pub(crate) struct FailingBody {
    sent: bool,
    failed: bool,
}

impl FailingBody {
    /// A fresh failing body.
    pub(crate) fn new() -> Self {
        Self::default()
    }
}

impl Body for FailingBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if !self.sent {
            self.sent = true;
            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"partial")))));
        }
        if !self.failed {
            self.failed = true;
            return Poll::Ready(Some(Err(std::io::Error::other(
                "the response body failed on purpose",
            ))));
        }
        Poll::Ready(None)
    }
}

// ----------------------------------------------------------------------------------------------
// Stores
// ----------------------------------------------------------------------------------------------

/// What a blocked renewal does (see [`SpyStore::block_next_claim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RenewFault {
    /// The renewal never answers (a store paused for this caller).
    Hang,
    /// The renewal fails with `Unavailable` every time.
    Fail,
}

/// One step seen by a [`SpyStore`], with whether its token is a blocked claimant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    /// A claim that claimed the key (not a pending or done key, not an error).
    Claimed { blocked: bool },
    /// A renewal.
    Renew { blocked: bool },
    /// A complete, with what it returned (`None`: an error).
    Complete {
        blocked: bool,
        written: Option<bool>,
    },
    /// A release, with what it returned (`None`: an error).
    Release {
        blocked: bool,
        deleted: Option<bool>,
    },
}

/// What a [`SpyStore`] counted and logged, and the failures it was told to produce.
#[derive(Default)]
struct SpyState {
    claims: AtomicUsize,
    completes: AtomicUsize,
    releases: AtomicUsize,
    renews: AtomicUsize,
    fail_claim: AtomicBool,
    fail_complete: AtomicBool,
    last_fingerprint: Mutex<Option<Fingerprint>>,
    leases_and_retentions: Mutex<Vec<(&'static str, Duration)>>,
    arm: Mutex<Option<RenewFault>>,
    blocked: Mutex<HashMap<Token, RenewFault>>,
    events: Mutex<Vec<Event>>,
    keys: Mutex<Vec<StoreKey>>,
}

/// A store wrapper (over a [`MemoryStore`] unless told otherwise) that counts and logs every
/// step, can be told to fail `claim` or `complete` with `StoreErrorKind::Unavailable`, and
/// makes the renewals of a chosen claim hang or fail. Clones share the store and the state.
pub(crate) struct SpyStore<S = MemoryStore> {
    inner: Arc<S>,
    state: Arc<SpyState>,
}

impl<S> Clone for SpyStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
        }
    }
}

impl<S> fmt::Debug for SpyStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpyStore")
            .field("claims", &self.claims())
            .field("completes", &self.completes())
            .field("releases", &self.releases())
            .field("renews", &self.renews())
            .finish_non_exhaustive()
    }
}

impl Default for SpyStore {
    fn default() -> Self {
        Self::over(MemoryStore::default())
    }
}

impl SpyStore {
    /// A spy over a fresh default [`MemoryStore`].
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A spy over `memory` (e.g. one built with small bounds).
    pub(crate) fn over(memory: MemoryStore) -> Self {
        Self::wrap(memory)
    }

    /// The wrapped memory store.
    pub(crate) fn memory(&self) -> &MemoryStore {
        &self.inner
    }
}

impl<S> SpyStore<S> {
    /// A spy over any store.
    pub(crate) fn wrap(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            state: Arc::default(),
        }
    }

    /// The wrapped store.
    pub(crate) fn inner(&self) -> &S {
        &self.inner
    }

    /// The number of `claim` calls so far.
    pub(crate) fn claims(&self) -> usize {
        self.state.claims.load(Ordering::SeqCst)
    }
    /// The number of `complete` calls so far.
    pub(crate) fn completes(&self) -> usize {
        self.state.completes.load(Ordering::SeqCst)
    }
    /// The number of `release` calls so far.
    pub(crate) fn releases(&self) -> usize {
        self.state.releases.load(Ordering::SeqCst)
    }
    /// The number of `renew` calls so far.
    pub(crate) fn renews(&self) -> usize {
        self.state.renews.load(Ordering::SeqCst)
    }
    /// Makes every `claim` fail (or succeed again).
    pub(crate) fn fail_claims(&self, fail: bool) {
        self.state.fail_claim.store(fail, Ordering::SeqCst);
    }
    /// Makes every `complete` fail (or succeed again).
    pub(crate) fn fail_completes(&self, fail: bool) {
        self.state.fail_complete.store(fail, Ordering::SeqCst);
    }
    /// The fingerprint of the last claim, as the store saw it (keyed when the layer has a
    /// secret).
    pub(crate) fn last_fingerprint(&self) -> Option<Fingerprint> {
        *lock(&self.state.last_fingerprint)
    }
    /// The lease of every `claim` and the retention of every `complete`, in call order:
    /// `("claim", lease)` and `("complete", retention)`.
    pub(crate) fn leases_and_retentions(&self) -> Vec<(&'static str, Duration)> {
        lock(&self.state.leases_and_retentions).clone()
    }
    /// The renewals of the next claim that claims a key will hang or fail ([`Event`]s of its
    /// token are `blocked`).
    pub(crate) fn block_next_claim(&self, fault: RenewFault) {
        *lock(&self.state.arm) = Some(fault);
    }
    /// Every claimed key, renewal, complete and release so far.
    pub(crate) fn events(&self) -> Vec<Event> {
        lock(&self.state.events).clone()
    }
    /// The keys claimed so far, in order.
    pub(crate) fn claimed_keys(&self) -> Vec<StoreKey> {
        lock(&self.state.keys).clone()
    }

    fn blocked(&self, token: &Token) -> Option<RenewFault> {
        lock(&self.state.blocked).get(token).copied()
    }

    fn log(&self, e: Event) {
        lock(&self.state.events).push(e);
    }
}

impl<S: Store> Store for SpyStore<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.state.claims.fetch_add(1, Ordering::SeqCst);
        *lock(&self.state.last_fingerprint) = Some(*fingerprint);
        lock(&self.state.leases_and_retentions).push(("claim", lease));
        if self.state.fail_claim.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the test store refuses claims",
            ));
        }
        let claim = self.inner.claim(key, fingerprint, lease).await?;
        if let Claim::Claimed(token) = &claim {
            let fault = lock(&self.state.arm).take();
            if let Some(f) = fault {
                lock(&self.state.blocked).insert(token.clone(), f);
            }
            lock(&self.state.keys).push(*key);
            self.log(Event::Claimed {
                blocked: fault.is_some(),
            });
        }
        Ok(claim)
    }

    async fn complete(
        &self,
        key: &StoreKey,
        token: &Token,
        fingerprint: &Fingerprint,
        record: Record,
        retention: Duration,
    ) -> Result<bool, StoreError> {
        self.state.completes.fetch_add(1, Ordering::SeqCst);
        lock(&self.state.leases_and_retentions).push(("complete", retention));
        let res = if self.state.fail_complete.load(Ordering::SeqCst) {
            Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the test store refuses completes",
            ))
        } else {
            self.inner
                .complete(key, token, fingerprint, record, retention)
                .await
        };
        self.log(Event::Complete {
            blocked: self.blocked(token).is_some(),
            written: res.as_ref().ok().copied(),
        });
        res
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.state.releases.fetch_add(1, Ordering::SeqCst);
        let res = self.inner.release(key, token).await;
        self.log(Event::Release {
            blocked: self.blocked(token).is_some(),
            deleted: res.as_ref().ok().copied(),
        });
        res
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.state.renews.fetch_add(1, Ordering::SeqCst);
        let fault = self.blocked(token);
        self.log(Event::Renew {
            blocked: fault.is_some(),
        });
        match fault {
            Some(RenewFault::Hang) => std::future::pending().await,
            Some(RenewFault::Fail) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "renewal blocked by the test",
            )),
            None => self.inner.renew(key, token, lease).await,
        }
    }

    async fn forget(&self, key: &StoreKey, pending: bool) -> Result<Forgotten, StoreError> {
        self.inner.forget(key, pending).await
    }

    async fn lease_left(&self, key: &StoreKey) -> Result<Option<Duration>, StoreError> {
        self.inner.lease_left(key).await
    }

    fn notifies_settled(&self) -> bool {
        self.inner.notifies_settled()
    }

    async fn wait_settled(&self, key: &StoreKey, within: Duration) {
        self.inner.wait_settled(key, within).await;
    }
}

/// The store key the layer derives for `principal` and `key` under `namespace`.
pub(crate) fn store_key(namespace: &str, principal: &str, key: &str) -> StoreKey {
    StoreKey::derive(
        namespace,
        &Scope::principal(principal),
        &IdempotencyKey::new(key).expect("a valid test key"),
    )
}

/// The store key a layer whose engine has `secret` derives for `principal` and `key`.
pub(crate) fn secret_store_key(
    secret: &tower_idempotency::Secret,
    namespace: &str,
    principal: &str,
    key: &str,
) -> StoreKey {
    tower_idempotency::engine::Engine::builder(tower_idempotency::MemoryStore::new())
        .secret(secret.clone())
        .build()
        .store_key(
            namespace,
            &Scope::principal(principal),
            &IdempotencyKey::new(key).expect("a valid test key"),
        )
}

/// The default fingerprint of a request: method, path, raw query, content-type, body.
pub(crate) fn default_fingerprint(
    method: &str,
    path: &str,
    query: &str,
    content_type: &str,
    body: &[u8],
) -> Fingerprint {
    Fingerprint::builder()
        .field(method.as_bytes())
        .field(path.as_bytes())
        .field(query.as_bytes())
        .field(content_type.as_bytes())
        .field(body)
        .finish()
}

/// The default fingerprint of `POST /work` with the JSON body `body` and no query.
pub(crate) fn work_fingerprint(body: &[u8]) -> Fingerprint {
    default_fingerprint("POST", "/work", "", "application/json", body)
}

/// Writes `record` straight into `store` as the completed record of `key` (claim, then
/// complete), as a record written by someone else, or by another version, would be.
pub(crate) async fn plant<S: Store>(store: &S, key: &StoreKey, fp: &Fingerprint, record: Record) {
    let claim = store
        .claim(key, fp, Duration::from_secs(60))
        .await
        .expect("claim the key to plant a record");
    let Claim::Claimed(token) = claim else {
        panic!("the key to plant a record under was not free: {claim:?}");
    };
    let written = store
        .complete(key, &token, fp, record, Duration::from_secs(3600))
        .await
        .expect("complete the planted record");
    assert!(written, "the planted record was written");
}
