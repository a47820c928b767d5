//! Applications and clients for the fault, storm and end-to-end tests.
//!
//! - [`Work`]: an in-process axum handler behind [`IdempotencyLayer`] that counts executions
//!   per key, sleeps, waits on gates or fails on request (headers, so the fingerprint, which
//!   covers the body, stays the same for every duplicate);
//! - [`Server`]: that app served over real TCP on `127.0.0.1:0`;
//! - [`FaultStore`]: a [`Store`] wrapper whose lease renewal hangs or fails for chosen claims;
//! - [`Quickstart`]: the built quickstart example as a child process, with `REDIS_URL`;
//! - [`Answer`], [`Mix`], [`run_jobs`]: a bounded client side.

// Each test crate uses part of this.
#![allow(dead_code, unreachable_pub)]

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::json;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower_idempotency::engine::{Fingerprint, Scope};
use tower_idempotency::http::PrincipalMode;
use tower_idempotency::store::{Claim, Record, StoreError, StoreErrorKind, StoreKey, Token};
use tower_idempotency::{IdempotencyLayer, Store};

/// Every request of these tests is bounded by this (a hang is a failure, not a stuck run).
pub const REQUEST_LIMIT: Duration = Duration::from_secs(30);

/// Awaits `fut` for at most `limit`, panicking with `what` when it takes longer.
pub async fn bounded<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} took longer than {limit:?}"))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Answers
// ---------------------------------------------------------------------------------------------

/// One HTTP answer, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub retry_after: Option<String>,
    pub body: Bytes,
    pub elapsed: Duration,
}

/// What an answer was, for the invariants of a storm.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
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
    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The problem code of a rejection.
    pub fn code(&self) -> Option<String> {
        self.json()["code"].as_str().map(str::to_owned)
    }

    /// The handler's per-key (in-process app) or per-process (quickstart) execution number.
    pub fn execution(&self) -> u64 {
        self.json()["execution"].as_u64().unwrap_or(0)
    }

    pub fn kind(&self) -> Kind {
        match (self.status, self.code().as_deref()) {
            (201, _) if self.replayed => Kind::Replay,
            (201, _) => Kind::Fresh,
            (409, Some("idempotency.in_flight")) => Kind::InFlight,
            (503, Some("idempotency.store_failed")) if self.retry_after.is_some() => {
                Kind::StoreFailed
            }
            (s, c) => Kind::Other(s, c.unwrap_or("-").to_owned()),
        }
    }

    pub fn describe(&self) -> String {
        format!(
            "{} replayed={} retry-after={:?} after {:?}: {}",
            self.status,
            self.replayed,
            self.retry_after,
            self.elapsed,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// A client for loopback tests: a connection pool large enough for the storms.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(512)
        .timeout(REQUEST_LIMIT)
        .build()
        .expect("a reqwest client")
}

/// Sends a request and reads the whole answer; a transport error is an `Err`.
pub async fn try_send(req: reqwest::RequestBuilder) -> Result<Answer, String> {
    let start = Instant::now();
    let res = req.send().await.map_err(|e| format!("{e:?}"))?;
    let status = res.status().as_u16();
    let header = |n: &str| {
        res.headers()
            .get(n)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let body = res.bytes().await.map_err(|e| format!("{e:?}"))?;
    Ok(Answer {
        status,
        replayed,
        retry_after,
        body,
        elapsed: start.elapsed(),
    })
}

/// Sends a request; a transport error fails the test.
pub async fn send(req: reqwest::RequestBuilder) -> Answer {
    match try_send(req).await {
        Ok(a) => a,
        Err(e) => panic!("request failed: {e}"),
    }
}

/// Counts of each kind of answer.
#[derive(Debug, Default, Clone)]
pub struct Mix(pub BTreeMap<Kind, usize>);

impl Mix {
    pub fn of<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Self {
        let mut m = BTreeMap::new();
        for a in answers {
            *m.entry(a.kind()).or_insert(0) += 1;
        }
        Self(m)
    }

    pub fn get(&self, k: &Kind) -> usize {
        self.0.get(k).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(k, n)| match k {
                Kind::Fresh => format!("201 fresh {n}"),
                Kind::Replay => format!("201 replay {n}"),
                Kind::InFlight => format!("409 in_flight {n}"),
                Kind::StoreFailed => format!("503 store_failed {n}"),
                Kind::Other(s, c) => format!("{s} {c} {n}"),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// Runs `jobs` requests with at most `workers` in flight, in job order (worker `w` takes the
/// next job when it is free), and returns the answers by job index.
pub async fn run_jobs<F, Fut>(jobs: usize, workers: usize, f: F) -> Vec<Answer>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Answer> + Send + 'static,
{
    let f = Arc::new(f);
    let next = Arc::new(AtomicUsize::new(0));
    let slots: Arc<Mutex<Vec<Option<Answer>>>> = Arc::new(Mutex::new(vec![None; jobs]));
    let mut tasks = Vec::with_capacity(workers);
    for _ in 0..workers.max(1) {
        let (f, next, slots) = (Arc::clone(&f), Arc::clone(&next), Arc::clone(&slots));
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= jobs {
                    break;
                }
                let a = bounded(REQUEST_LIMIT, "a request", f(i)).await;
                lock(&slots)[i] = Some(a);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a request worker panicked");
    }
    let slots = std::mem::take(&mut *lock(&slots));
    slots
        .into_iter()
        .map(|a| a.expect("every job answered"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The in-process application
// ---------------------------------------------------------------------------------------------

/// The handler's side: executions per key, gates, started runs.
#[derive(Clone, Default)]
pub struct Work {
    inner: Arc<WorkInner>,
}

#[derive(Default)]
struct WorkInner {
    total: AtomicU64,
    runs: Mutex<HashMap<String, u64>>,
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("total", &self.total())
            .finish_non_exhaustive()
    }
}

impl Work {
    pub fn new() -> Self {
        Self::default()
    }

    /// `POST /work` behind `layer` (principal from `x-user`, default `alice`), `GET /stats`.
    ///
    /// Request headers steer the handler (they are not part of the fingerprint):
    /// `x-delay-ms: n` sleeps, `x-gate: name` waits until [`open`](Self::open)`(name)`,
    /// `x-status: n` answers that status instead of 201.
    pub fn app<St: Store>(&self, layer: IdempotencyLayer<St>) -> Router {
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
        Router::new()
            .route("/work", post(handler))
            .layer(layer)
            .route("/stats", get(stats))
            .with_state(self.clone())
    }

    /// Executions over every key.
    pub fn total(&self) -> u64 {
        self.inner.total.load(Ordering::SeqCst)
    }

    /// Executions of each key (keys that never ran are absent).
    pub fn runs(&self) -> HashMap<String, u64> {
        lock(&self.inner.runs).clone()
    }

    /// Executions of one key.
    pub fn runs_of(&self, key: &str) -> u64 {
        lock(&self.inner.runs).get(key).copied().unwrap_or(0)
    }

    /// Lets every handler waiting on gate `name` (now or later) go on.
    pub fn open(&self, name: &str) {
        self.gate(name).add_permits(Semaphore::MAX_PERMITS / 2);
    }

    fn gate(&self, name: &str) -> Arc<Semaphore> {
        Arc::clone(
            lock(&self.inner.gates)
                .entry(name.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(0))),
        )
    }

    /// Waits (bounded) until key `key` has run `n` times.
    pub async fn wait_runs(&self, key: &str, n: u64) {
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
}

async fn handler(State(work): State<Work>, headers: HeaderMap) -> Response {
    let h = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let key = h("idempotency-key").unwrap_or("-").to_owned();
    let execution = {
        let mut runs = lock(&work.inner.runs);
        let n = runs.entry(key.clone()).or_insert(0);
        *n += 1;
        *n
    };
    let total = work.inner.total.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(ms) = h("x-delay-ms").and_then(|v| v.parse().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if let Some(gate) = h("x-gate") {
        let gate = work.gate(gate);
        let _permit = gate.acquire().await.expect("gates are never closed");
    }
    let status = h("x-status")
        .and_then(|v| v.parse().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
        .unwrap_or(StatusCode::CREATED);
    let mut run = [0u8; 8];
    getrandom::fill(&mut run).expect("OS random source");
    let run: String = run.iter().map(|b| format!("{b:02x}")).collect();
    (
        status,
        axum::Json(json!({ "key": key, "execution": execution, "total": total, "run": run })),
    )
        .into_response()
}

async fn stats(State(work): State<Work>) -> axum::Json<serde_json::Value> {
    axum::Json(json!({ "executions": work.total() }))
}

/// An app served over real TCP on a free loopback port; stopped when dropped.
#[derive(Debug)]
pub struct Server {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Server {
    pub async fn start(router: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("serve");
        });
        Self { addr, task }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// `POST /work` with `key` and a JSON body that is the same for every duplicate.
    pub fn work(&self, client: &reqwest::Client, key: &str) -> reqwest::RequestBuilder {
        client
            .post(self.url("/work"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(format!(r#"{{"item":"book","key":"{key}"}}"#))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// A store whose renewal can be blocked
// ---------------------------------------------------------------------------------------------

/// What a blocked renewal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewFault {
    /// The renewal never answers (a store paused for this caller).
    Hang,
    /// The renewal fails with `Unavailable` every time.
    Fail,
}

/// One step seen by a [`FaultStore`], with whether its token is a blocked (first) claimant's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Claimed {
        blocked: bool,
    },
    Renew {
        blocked: bool,
    },
    Complete {
        blocked: bool,
        written: Option<bool>,
    },
    Release {
        blocked: bool,
        deleted: Option<bool>,
    },
}

/// Delegates every step to the inner store, except that the renewal of claims made while
/// [`block_next_claim`](Self::block_next_claim) was armed hangs or fails. Clones share state.
pub struct FaultStore<S> {
    inner: Arc<S>,
    state: Arc<FaultState>,
}

#[derive(Default)]
struct FaultState {
    arm: Mutex<Option<RenewFault>>,
    blocked: Mutex<HashMap<Token, RenewFault>>,
    events: Mutex<Vec<Event>>,
    keys: Mutex<Vec<StoreKey>>,
    armed_claims: AtomicBool,
}

impl<S> Clone for FaultStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
        }
    }
}

impl<S> fmt::Debug for FaultStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultStore").finish_non_exhaustive()
    }
}

impl<S: Store> FaultStore<S> {
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            state: Arc::default(),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The next successful claim's renewals will hang or fail.
    pub fn block_next_claim(&self, fault: RenewFault) {
        *lock(&self.state.arm) = Some(fault);
        self.state.armed_claims.store(true, Ordering::SeqCst);
    }

    /// Every step so far.
    pub fn events(&self) -> Vec<Event> {
        lock(&self.state.events).clone()
    }

    /// The keys claimed so far, in order.
    pub fn claimed_keys(&self) -> Vec<StoreKey> {
        lock(&self.state.keys).clone()
    }

    fn blocked(&self, token: &Token) -> Option<RenewFault> {
        lock(&self.state.blocked).get(token).copied()
    }

    fn log(&self, e: Event) {
        lock(&self.state.events).push(e);
    }
}

impl<S: Store> Store for FaultStore<S> {
    async fn claim(
        &self,
        key: &StoreKey,
        fingerprint: &Fingerprint,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let claim = self.inner.claim(key, fingerprint, lease).await?;
        if let Claim::Claimed(token) = &claim {
            let fault = if self.state.armed_claims.swap(false, Ordering::SeqCst) {
                lock(&self.state.arm).take()
            } else {
                None
            };
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
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let res = self
            .inner
            .complete(key, token, fingerprint, record, ttl)
            .await;
        self.log(Event::Complete {
            blocked: self.blocked(token).is_some(),
            written: res.as_ref().ok().copied(),
        });
        res
    }

    async fn release(&self, key: &StoreKey, token: &Token) -> Result<bool, StoreError> {
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
}

// ---------------------------------------------------------------------------------------------
// The quickstart example as a child process
// ---------------------------------------------------------------------------------------------

const BUILD_LIMIT: Duration = Duration::from_secs(15 * 60);
const START_LIMIT: Duration = Duration::from_secs(20);
const NO_FEATURE: &str = "without the `redis` feature";

/// `<target>/<profile>` of this test binary.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

fn quickstart_path() -> PathBuf {
    profile_dir()
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX))
}

fn modified(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The newest modification time of the sources the example is built from.
fn newest_source() -> Option<SystemTime> {
    fn walk(dir: &Path, newest: &mut Option<SystemTime>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, newest);
            } else if let Some(t) = modified(&p) {
                *newest = (*newest).max(Some(t));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut newest = None;
    walk(&root.join("src"), &mut newest);
    for f in [
        "examples/quickstart/main.rs",
        "examples/quickstart/Cargo.toml",
        "Cargo.toml",
    ] {
        newest = newest.max(modified(&root.join(f)));
    }
    newest
}

/// Builds the example with the `redis` feature into this test binary's target directory.
fn build_quickstart() -> Result<(), String> {
    let profile = profile_dir();
    let target = profile
        .parent()
        .ok_or_else(|| format!("no target directory above {}", profile.display()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args([
        "build",
        "-p",
        "tower-idempotency-quickstart",
        "--example",
        "quickstart",
        "--features",
        "redis",
    ])
    .env("CARGO_TARGET_DIR", target)
    .current_dir(env!("CARGO_MANIFEST_DIR"))
    .stdin(Stdio::null());
    if profile.file_name().is_some_and(|p| p == "release") {
        cmd.arg("--release");
    }
    eprintln!(
        "building the quickstart example with `--features redis` into {}",
        target.display()
    );
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run cargo build: {e}"))?;
    let deadline = Instant::now() + BUILD_LIMIT;
    loop {
        match child.try_wait() {
            Ok(Some(s)) if s.success() => return Ok(()),
            Ok(Some(s)) => return Err(format!("`cargo build --example quickstart` failed: {s}")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("building the quickstart took over {BUILD_LIMIT:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => return Err(format!("waiting for cargo: {e}")),
        }
    }
}

/// The quickstart binary, rebuilt (once per test process) when missing or older than the
/// sources; [`Quickstart::start`] rebuilds it once more if it lacks the `redis` feature.
fn quickstart_binary(rebuild: bool) -> PathBuf {
    static FRESH: OnceLock<Result<(), String>> = OnceLock::new();
    static FEATURED: OnceLock<Result<(), String>> = OnceLock::new();
    let path = quickstart_path();
    let fresh = FRESH.get_or_init(|| {
        let stale = match (modified(&path), newest_source()) {
            (Some(bin), Some(src)) => bin < src,
            (None, _) => true,
            (Some(_), None) => false,
        };
        if stale { build_quickstart() } else { Ok(()) }
    });
    if let Err(e) = fresh {
        panic!("the quickstart example is not available: {e}");
    }
    if rebuild && let Err(e) = FEATURED.get_or_init(build_quickstart) {
        panic!("the quickstart example could not be built with `redis`: {e}");
    }
    path
}

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A quickstart process using Redis (`REDIS_URL`); killed and reaped on drop.
#[derive(Debug)]
pub struct Quickstart {
    child: Child,
    pub port: u16,
    pub base: String,
    output: Arc<Mutex<String>>,
}

impl Drop for Quickstart {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Quickstart {
    /// Starts the example with `REDIS_URL=redis_url` on a free port and waits (bounded) until it
    /// accepts connections. Builds it with `--features redis` when needed.
    pub async fn start(redis_url: &str) -> Self {
        match Self::try_start(redis_url, quickstart_binary(false)).await {
            Ok(qs) => qs,
            Err(out) if out.contains(NO_FEATURE) => {
                Self::try_start(redis_url, quickstart_binary(true))
                    .await
                    .unwrap_or_else(|out| panic!("the quickstart did not start: {out}"))
            }
            Err(out) => panic!("the quickstart did not start: {out}"),
        }
    }

    async fn try_start(redis_url: &str, binary: PathBuf) -> Result<Self, String> {
        let port = free_port();
        let mut child = Command::new(&binary)
            .env("PORT", port.to_string())
            .env("REDIS_URL", redis_url)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        // Both pipes are drained into one text, so the child never blocks on a full pipe.
        let output = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("piped stdout");
        let text = Arc::clone(&output);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let mut t = lock(&text);
                t.push_str(&line);
                t.push('\n');
            }
        });
        let mut err = child.stderr.take().expect("piped stderr");
        let text = Arc::clone(&output);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                lock(&text).push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut qs = Self {
            child,
            port,
            base: format!("http://127.0.0.1:{port}"),
            output,
        };
        let deadline = Instant::now() + START_LIMIT;
        loop {
            if let Some(status) = qs.child.try_wait().expect("child status") {
                // Let the pipe readers catch up with what it said.
                tokio::time::sleep(Duration::from_millis(100)).await;
                return Err(format!("exited early ({status}): {}", qs.output()));
            }
            // Accepting, and it said it uses Redis (its first line names the store).
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
                && qs.output().contains("(redis store)")
            {
                return Ok(qs);
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no connection within {START_LIMIT:?}: {}",
                    qs.output()
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Everything the process printed so far (stdout and stderr).
    pub fn output(&self) -> String {
        lock(&self.output).clone()
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `POST /orders` as `principal` with `key` and a JSON body.
    pub fn order(
        &self,
        client: &reqwest::Client,
        principal: &str,
        key: &str,
        body: &serde_json::Value,
    ) -> reqwest::RequestBuilder {
        client
            .post(format!("{}/orders", self.base))
            .header("authorization", format!("Bearer {principal}"))
            .header("idempotency-key", key)
            .json(body)
    }

    /// The process's execution count (`GET /stats`).
    pub async fn executions(&self, client: &reqwest::Client) -> u64 {
        let a = send(client.get(format!("{}/stats", self.base))).await;
        assert_eq!(a.status, 200, "{}", a.describe());
        a.json()["executions"]
            .as_u64()
            .unwrap_or_else(|| panic!("`executions` in {}", a.describe()))
    }

    /// Asserts the process is up and printed no panic.
    pub fn assert_healthy(&mut self) {
        let out = self.output();
        assert!(self.alive(), "the quickstart exited: {out}");
        assert!(!out.contains("panicked"), "the quickstart panicked: {out}");
    }
}

/// Distinct keys in a set (for short summaries).
pub fn distinct<T: std::hash::Hash + Eq>(items: impl IntoIterator<Item = T>) -> usize {
    items.into_iter().collect::<HashSet<T>>().len()
}

// ---------------------------------------------------------------------------------------------
// A duplicate storm over two quickstart processes
// ---------------------------------------------------------------------------------------------

/// What a storm over several processes observed.
#[derive(Debug)]
pub struct StormReport {
    pub requests: usize,
    pub took: Duration,
    /// Executions per process (`/stats` after minus before).
    pub executions: Vec<u64>,
    /// Fresh answers per key (how many times each key ran and answered).
    pub fresh_per_key: BTreeMap<u64, usize>,
    pub mix: Mix,
    pub max_request: Duration,
}

impl fmt::Display for StormReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} requests in {:.2?} ({:.0} req/s), max request {:.2?}; executions per process {:?} \
             (sum {}); fresh answers per key (answers -> keys) {:?}; answers: {}",
            self.requests,
            self.took,
            self.requests as f64 / self.took.as_secs_f64(),
            self.max_request,
            self.executions,
            self.executions.iter().sum::<u64>(),
            self.fresh_per_key,
            self.mix
        )
    }
}

/// Sends `dups` duplicates of each of `keys` keys to `processes` (duplicate `d` of a key to
/// process `d % processes.len()`), at most `workers` in flight, the duplicates of a key
/// together; key `k`'s handler sleeps `delay(k)` ms. Checks that every answer is the original
/// 201, a replay with the original's body, or 409, and returns the figures for the caller's
/// assertions on executions.
pub async fn storm(
    processes: &[&Quickstart],
    keys: usize,
    dups: usize,
    workers: usize,
    delay: impl Fn(usize) -> u64,
) -> StormReport {
    let http = client();
    let mut before = Vec::new();
    for p in processes {
        before.push(p.executions(&http).await);
    }
    let bases: Vec<String> = processes.iter().map(|p| p.base.clone()).collect();
    let delays: Vec<u64> = (0..keys).map(delay).collect();
    // A run tag keeps keys apart from other runs on the same Redis.
    let mut tag = [0u8; 4];
    getrandom::fill(&mut tag).expect("OS random source");
    let tag: String = tag.iter().map(|b| format!("{b:02x}")).collect();
    let started = Instant::now();
    let answers = {
        let (http, tag) = (http.clone(), tag.clone());
        run_jobs(keys * dups, workers, move |i| {
            let (k, d) = (i / dups, i % dups);
            let base = &bases[d % bases.len()];
            let req = http
                .post(format!("{base}/orders"))
                .header("authorization", format!("Bearer user-{}", k % 10))
                .header("idempotency-key", format!("storm-{tag}-{k}"))
                .json(&json!({ "item": "book", "n": k, "delay_ms": delays[k] }));
            send(req)
        })
        .await
    };
    let took = started.elapsed();
    let mut executions = Vec::new();
    for (p, b) in processes.iter().zip(before) {
        executions.push(p.executions(&http).await - b);
    }
    let mut original: HashMap<usize, &Bytes> = HashMap::new();
    let mut fresh = vec![0usize; keys];
    for (i, a) in answers.iter().enumerate() {
        if a.kind() == Kind::Fresh {
            fresh[i / dups] += 1;
            original.insert(i / dups, &a.body);
        }
    }
    for (i, a) in answers.iter().enumerate() {
        match a.kind() {
            Kind::Fresh | Kind::InFlight => {}
            Kind::Replay => assert_eq!(
                Some(&&a.body),
                original.get(&(i / dups)),
                "a replay of key {} is its original: {}",
                i / dups,
                a.describe()
            ),
            other => panic!("unexpected answer {other:?}: {}", a.describe()),
        }
    }
    let mut fresh_per_key = BTreeMap::new();
    for n in fresh {
        *fresh_per_key.entry(n as u64).or_insert(0) += 1;
    }
    StormReport {
        requests: answers.len(),
        took,
        executions,
        fresh_per_key,
        mix: Mix::of(&answers),
        max_request: answers.iter().map(|a| a.elapsed).max().unwrap_or_default(),
    }
}
