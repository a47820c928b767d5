//! One store, the app behind the layer, a fault proxy in front of it, and a call through one
//! of the two client stacks.

use crate::support::http::{TestServer as Server, Work};
use crate::support::proxy::Proxy;
use crate::support::redis_server::{self, RedisServer};
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use std::time::{Duration, Instant};
use tower::ServiceExt;
use tower_idempotency::IdempotencyLayer;
use tower_idempotency_client::{Attempts, RetryError, RetryErrorKind, RetryPolicy, StampKeyLayer};

/// Where the server keeps its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Backend {
    Memory,
    Redis,
    /// No idempotency layer at all: a server that ignores keys (and runs every request).
    IgnoresKeys,
}

/// Which client stack calls it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stack {
    /// `StampKeyLayer` + `RetryLayer<RetryPolicy>` + `TimeoutLayer` on hyper-util's client.
    Tower,
    /// `reqwest-middleware` with `RetryMiddleware`.
    Reqwest,
}

/// The retry settings of every call: short backoff so the tests stay quick; `Retry-After`
/// is honoured as sent (the layer sends 1 s). No server is declared to honour keys.
pub(crate) fn policy() -> RetryPolicy {
    RetryPolicy::new()
        .max_attempts(4)
        .base_delay(Duration::from_millis(20))
        .max_delay(Duration::from_millis(100))
        .deadline(Duration::from_secs(10))
}

pub(crate) struct Rig {
    _redis: Option<RedisServer>,
    pub(crate) work: Work,
    pub(crate) server: Server,
    pub(crate) proxy: Proxy,
    stack: Stack,
    /// A plain client straight to the server (no proxy, no retries), for setting the scene.
    pub(crate) direct: reqwest::Client,
}

/// One logical request.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub(crate) key: Option<String>,
    pub(crate) body: String,
    pub(crate) headers: Vec<(&'static str, String)>,
    /// Whether the stack stamps a key on a request without one.
    pub(crate) stamp: bool,
    /// The limit of each attempt.
    pub(crate) attempt_timeout: Duration,
    /// Whether the policy declares the proxy's address as honouring keys.
    pub(crate) declared: bool,
    /// Where to send it instead of the proxy (a closed port, say).
    pub(crate) url: Option<String>,
}

impl Call {
    /// A POST of `body` to `/work`, stamped by the stack.
    pub(crate) fn post(body: &str) -> Self {
        Self {
            key: None,
            body: format!(r#"{{"item":"{body}"}}"#),
            headers: Vec::new(),
            stamp: true,
            attempt_timeout: Duration::from_secs(5),
            declared: true,
            url: None,
        }
    }

    /// The server is not declared to honour keys (the policy's default).
    pub(crate) fn undeclared(mut self) -> Self {
        self.declared = false;
        self
    }

    pub(crate) fn to(mut self, url: String) -> Self {
        self.url = Some(url);
        self
    }

    pub(crate) fn key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    pub(crate) fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    pub(crate) fn unstamped(mut self) -> Self {
        self.stamp = false;
        self
    }

    pub(crate) fn attempt_timeout(mut self, limit: Duration) -> Self {
        self.attempt_timeout = limit;
        self
    }
}

/// The final answer of a call, read whole.
#[derive(Debug)]
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) attempts: Option<Attempts>,
    pub(crate) elapsed: Duration,
}

impl Reply {
    pub(crate) fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The key the handler saw (the app echoes it).
    pub(crate) fn key(&self) -> String {
        self.json()["key"].as_str().unwrap_or("-").to_owned()
    }

    pub(crate) fn attempts(&self) -> Attempts {
        self.attempts
            .clone()
            .unwrap_or_else(|| panic!("no Attempts extension on {}", self.describe()))
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "{} {:?} after {:?}: {}",
            self.status,
            self.attempts,
            self.elapsed,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// The final error of a call: its text and, when the stack gave up, the `RetryError`'s
/// failure and attempts.
#[derive(Debug)]
pub(crate) struct GaveUp {
    pub(crate) text: String,
    pub(crate) retry: Option<(RetryErrorKind, Attempts)>,
}

impl GaveUp {
    fn of(text: String, retry: Option<&RetryError>) -> Self {
        Self {
            text,
            retry: retry.map(|e| (e.kind(), e.attempts().clone())),
        }
    }

    /// The `RetryError`'s failure and attempts (panics without one).
    pub(crate) fn retry(&self) -> (RetryErrorKind, Attempts) {
        self.retry
            .clone()
            .unwrap_or_else(|| panic!("not a RetryError: {}", self.text))
    }
}

impl Rig {
    /// The rig, or `None` when Redis is wanted but not installed (and not required).
    pub(crate) async fn start(backend: Backend, stack: Stack) -> Option<Self> {
        // The client's event per attempt, shown with `--nocapture` (RUST_LOG overrides).
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| "tower_idempotency_client=debug".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
        let work = Work::per_key();
        let (redis, app) = match backend {
            Backend::IgnoresKeys => (None, work.routes()),
            // A 3 s lease: a 409's Retry-After (the lease left, at most a third of the lease)
            // is then 1 s.
            Backend::Memory => (
                None,
                work.user_app(IdempotencyLayer::new(
                    tower_idempotency::engine::Engine::builder(
                        tower_idempotency::MemoryStore::new(),
                    )
                    .lease(Duration::from_secs(3))
                    .build(),
                )),
            ),
            Backend::Redis => redis_app(&work).await?,
        };
        let server = Server::start(app).await;
        let proxy = Proxy::start(server.addr().port()).await;
        Some(Self {
            _redis: redis,
            work,
            server,
            proxy,
            stack,
            direct: crate::support::http::client(),
        })
    }

    /// A POST to the server itself (no proxy, no retries) with `key` and `call`'s body.
    pub(crate) fn direct(&self, call: &Call, key: &str) -> reqwest::RequestBuilder {
        let mut req = self
            .direct
            .post(self.server.url("/work"))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(call.body.clone());
        for (n, v) in &call.headers {
            req = req.header(*n, v);
        }
        req
    }

    /// Sends `call` through the proxy with the rig's stack, declaring the proxy as honouring
    /// keys unless the call is `undeclared`.
    pub(crate) async fn call(&self, call: &Call) -> Result<Reply, GaveUp> {
        let proxy = format!("127.0.0.1:{}", self.proxy.port());
        let url = call
            .url
            .clone()
            .unwrap_or_else(|| format!("http://{proxy}/work"));
        let mut policy = policy();
        if call.declared {
            policy = policy.keys_honoured_by([proxy.parse().expect("an authority")]);
        }
        let start = Instant::now();
        let limit = Duration::from_secs(30);
        let fut = async {
            match self.stack {
                Stack::Tower => tower_call(&url, call, policy).await,
                Stack::Reqwest => reqwest_call(&url, call, policy).await,
            }
        };
        let mut reply = tokio::time::timeout(limit, fut)
            .await
            .unwrap_or_else(|_| panic!("a call took longer than {limit:?}"))?;
        reply.elapsed = start.elapsed();
        Ok(reply)
    }
}

async fn redis_app(work: &Work) -> Option<(Option<RedisServer>, axum::Router)> {
    if !redis_server::available() {
        return None;
    }
    let redis = RedisServer::start();
    let store = tower_idempotency::RedisStore::builder("client-tests")
        .connect(&redis.url())
        .await
        .expect("connect to redis-server");
    Some((
        Some(redis),
        work.user_app(IdempotencyLayer::new(
            tower_idempotency::engine::Engine::builder(store)
                .lease(Duration::from_secs(3))
                .build(),
        )),
    ))
}

async fn tower_call(url: &str, call: &Call, policy: RetryPolicy) -> Result<Reply, GaveUp> {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use tower::retry::RetryLayer;
    use tower::timeout::TimeoutLayer;

    let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let stamp = if call.stamp {
        StampKeyLayer::new()
    } else {
        StampKeyLayer::new().methods([])
    };
    let client = tower::ServiceBuilder::new()
        .layer(stamp)
        .layer(RetryLayer::new(policy))
        .layer(TimeoutLayer::new(call.attempt_timeout))
        .service(http);
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(url)
        .header("content-type", "application/json");
    if let Some(key) = &call.key {
        req = req.header("idempotency-key", key);
    }
    for (n, v) in &call.headers {
        req = req.header(*n, v);
    }
    let req = req
        .body(Full::new(Bytes::from(call.body.clone())))
        .map_err(|e| GaveUp::of(e.to_string(), None))?;
    let res = client
        .oneshot(req)
        .await
        .map_err(|e| GaveUp::of(format!("{e} | {e:?}"), e.downcast_ref::<RetryError>()))?;
    let attempts = res.extensions().get::<Attempts>().cloned();
    let (parts, body) = res.into_parts();
    let body = body
        .collect()
        .await
        .map_err(|e| GaveUp::of(format!("{e:?}"), None))?
        .to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
        attempts,
        elapsed: Duration::ZERO,
    })
}

#[cfg(feature = "reqwest")]
async fn reqwest_call(url: &str, call: &Call, policy: RetryPolicy) -> Result<Reply, GaveUp> {
    use tower_idempotency_client::RetryMiddleware;

    let inner = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(|e| GaveUp::of(e.to_string(), None))?;
    let client = reqwest_middleware::ClientBuilder::new(inner)
        .with(RetryMiddleware::new(policy).stamp(call.stamp))
        .build();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(call.body.clone())
        .timeout(call.attempt_timeout);
    if let Some(key) = &call.key {
        req = req.header("idempotency-key", key);
    }
    for (n, v) in &call.headers {
        req = req.header(*n, v);
    }
    let res = req
        .send()
        .await
        .map_err(|e| GaveUp::of(format!("{e} | {e:?}"), RetryError::of_reqwest(&e)))?;
    let attempts = res.extensions().get::<Attempts>().cloned();
    let status = res.status();
    let headers = res.headers().clone();
    let body = res
        .bytes()
        .await
        .map_err(|e| GaveUp::of(format!("{e:?}"), None))?;
    Ok(Reply {
        status,
        headers,
        body,
        attempts,
        elapsed: Duration::ZERO,
    })
}

#[cfg(not(feature = "reqwest"))]
async fn reqwest_call(_: &str, _: &Call, _: RetryPolicy) -> Result<Reply, GaveUp> {
    unreachable!("the reqwest scenarios need the `reqwest` feature")
}
