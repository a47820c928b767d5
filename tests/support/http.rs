//! Helpers for the HTTP layer tests: a real axum server on loopback, a test handler steered by
//! request headers, a store that counts (and can fail) its steps, and a client that captures
//! whole answers.
//!
//! The test handler (`work`) reads these request headers (none of them is part of the default
//! fingerprint, so a duplicate may change them freely):
//!
//! | header | effect |
//! | --- | --- |
//! | `x-principal` / `x-tenant` | the demo authentication puts a [`Principal`] into extensions |
//! | `x-delay-ms` | the handler sleeps this long before answering |
//! | `x-status` | the status it answers with (default 201) |
//! | `x-body-bytes` | answers this many `x` bytes (known length) instead of JSON |
//! | `x-stream-chunks` | answers this many 10-byte chunks with no known length |
//! | `x-fail-body-first` | the first execution's body fails after one chunk |
//!
//! Every answer carries `Location`, `Set-Cookie`, `X-Request-Id`, two `Link` lines and
//! `X-Order-Id`, so replay tests can see which headers come back.

use axum::Router;
use axum::body::Body as AxumBody;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tower_idempotency::engine::{Fingerprint, Scope};
use tower_idempotency::http::REPLAYED_HEADER;
use tower_idempotency::store::Record;
use tower_idempotency::store::{Claim, StoreError, StoreErrorKind, StoreKey, Token};
use tower_idempotency::{IdempotencyKey, MemoryStore, Principal, Store};

/// The time limit of every request a test client sends.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

// ----------------------------------------------------------------------------------------------
// The server
// ----------------------------------------------------------------------------------------------

/// An axum app served on `127.0.0.1:<random port>` by a spawned task; stopped on drop.
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

    /// The handler's `execution` number in a JSON answer.
    pub(crate) fn execution(&self) -> u64 {
        self.json()["execution"]
            .as_u64()
            .unwrap_or_else(|| panic!("no `execution` in {}", self.describe()))
    }

    /// A header as a string (`None` when absent).
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("header value is visible ASCII"))
    }

    /// Every value of a header, in order.
    pub(crate) fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }

    /// A one-line summary for assertion messages.
    pub(crate) fn describe(&self) -> String {
        format!(
            "status {} replay={} body {:?}",
            self.status,
            self.is_replay(),
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

/// Sends a request and reads the whole answer (the client's timeout bounds both).
pub(crate) async fn send(rb: reqwest::RequestBuilder) -> Answer {
    let res = rb.send().await.expect("the request reaches the server");
    let status = res.status();
    let headers = res.headers().clone();
    let body = res.bytes().await.expect("the answer body is read");
    Answer {
        status,
        headers,
        body,
    }
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

// ----------------------------------------------------------------------------------------------
// The handler
// ----------------------------------------------------------------------------------------------

/// The state of the test handler: how often it ran, and how often it was cancelled mid-way.
#[derive(Clone, Default, Debug)]
pub(crate) struct Work {
    executions: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
    cancelled: Arc<AtomicUsize>,
}

impl Work {
    /// A fresh counter set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// How many times the handler started.
    pub(crate) fn executions(&self) -> usize {
        self.executions.load(Ordering::SeqCst)
    }

    /// How many times the handler ran to its end.
    pub(crate) fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    /// How many times the handler's future was dropped before it finished.
    pub(crate) fn cancelled(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
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
    pub(crate) fn app<St: Store>(&self, layer: tower_idempotency::IdempotencyLayer<St>) -> Router {
        with_auth(self.routes().layer(layer))
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
            self.work.finished.fetch_add(1, Ordering::SeqCst);
        } else {
            self.work.cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn header_num(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

/// The test handler (see the module docs for the headers it reads).
pub(crate) async fn work(
    State(state): State<Work>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let execution = state.executions.fetch_add(1, Ordering::SeqCst) + 1;
    let mut guard = CancelGuard {
        work: state,
        done: false,
    };
    if let Some(ms) = header_num(&headers, "x-delay-ms") {
        tokio::time::sleep(Duration::from_millis(ms)).await;
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
        let json = serde_json::json!({
            "execution": execution,
            "method": method.as_str(),
            "path": uri.path(),
            "query": uri.query(),
            "body_len": body.len(),
        });
        (status, axum::Json(json)).into_response()
    };
    let h = res.headers_mut();
    h.insert(
        header::LOCATION,
        HeaderValue::from_str(&format!("/things/{execution}")).expect("location"),
    );
    h.insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&format!("session=s{execution}")).expect("cookie"),
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
    guard.done = true;
    res
}

fn principal_of(headers: &HeaderMap) -> Option<Principal> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let principal = Principal::new(get("x-principal")?);
    Some(match get("x-tenant") {
        Some(t) => principal.with_tenant(t),
        None => principal,
    })
}

/// The demo authentication: `x-principal` (and `x-tenant`) → a [`Principal`] extension.
async fn auth(mut req: Request, next: Next) -> Response {
    if let Some(principal) = principal_of(req.headers()) {
        req.extensions_mut().insert(principal);
    }
    next.run(req).await
}

/// Wraps `router` in the demo authentication (which runs before anything inside it).
pub(crate) fn with_auth(router: Router) -> Router {
    router.layer(middleware::from_fn(auth))
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

/// What a [`SpyStore`] counted, and the failures it was told to produce.
#[derive(Debug, Default)]
pub(crate) struct SpyState {
    claims: AtomicUsize,
    completes: AtomicUsize,
    releases: AtomicUsize,
    renews: AtomicUsize,
    fail_claim: AtomicBool,
    fail_complete: AtomicBool,
    last_fingerprint: std::sync::Mutex<Option<Fingerprint>>,
}

/// A [`MemoryStore`] that counts every step and can be told to fail `claim` or `complete`
/// with `StoreErrorKind::Unavailable`. Clones share the store and the counters.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpyStore {
    inner: Arc<MemoryStore>,
    state: Arc<SpyState>,
}

impl SpyStore {
    /// A spy over a fresh default [`MemoryStore`].
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A spy over `memory` (e.g. one built with small bounds).
    pub(crate) fn over(memory: MemoryStore) -> Self {
        Self {
            inner: Arc::new(memory),
            state: Arc::default(),
        }
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
        *self
            .state
            .last_fingerprint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
    /// The wrapped memory store.
    pub(crate) fn memory(&self) -> &MemoryStore {
        &self.inner
    }
}

impl Store for SpyStore {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        self.state.claims.fetch_add(1, Ordering::SeqCst);
        *self
            .state
            .last_fingerprint
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(*fingerprint);
        if self.state.fail_claim.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the test store refuses claims",
            ));
        }
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
        self.state.completes.fetch_add(1, Ordering::SeqCst);
        if self.state.fail_complete.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                "the test store refuses completes",
            ));
        }
        self.inner
            .complete(key, token, fingerprint, record, ttl)
            .await
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
        self.state.releases.fetch_add(1, Ordering::SeqCst);
        self.inner.release(key, token).await
    }

    async fn renew(
        &self,
        key: &StoreKey,
        token: &Token,
        lease: Duration,
    ) -> Result<bool, StoreError> {
        self.state.renews.fetch_add(1, Ordering::SeqCst);
        self.inner.renew(key, token, lease).await
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

/// Runs `fut` with a time limit, panicking with `what` when it takes longer.
pub(crate) async fn bounded<F: Future>(within: Duration, what: &str, fut: F) -> F::Output {
    tokio::time::timeout(within, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {within:?}"))
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
