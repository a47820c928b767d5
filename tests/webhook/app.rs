//! The receiving application: the four senders' endpoints on one handler that counts its
//! runs, answers as told, and can be held at a gate.

use crate::sign::{self, Delivery};
use crate::support::http::{TestServer, lock};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;
use tower_idempotency::IdempotencyKey;
use tower_idempotency::Store;
use tower_idempotency::engine::{Engine, Verdict};
use tower_idempotency::http::declare;
use tower_idempotency::webhook::{GitHub, Shopify, StandardWebhooks, Stripe, WebhookLayer};

/// What the handler did and will do.
pub(crate) struct Handler {
    /// Runs in all.
    pub(crate) total: AtomicU64,
    /// Runs per delivery id.
    runs: Mutex<HashMap<String, u64>>,
    /// Statuses to answer with on the next runs of a delivery id, before the 200, each with
    /// whether the handler declares it `Record`.
    answers: Mutex<HashMap<String, VecDeque<(u16, bool)>>>,
    /// When set, each run waits for a permit of `gate` before it answers.
    gated: AtomicBool,
    pub(crate) gate: Semaphore,
}

impl Handler {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            total: AtomicU64::new(0),
            runs: Mutex::default(),
            answers: Mutex::default(),
            gated: AtomicBool::new(false),
            gate: Semaphore::new(0),
        })
    }

    /// Runs of `id` so far.
    pub(crate) fn runs(&self, id: &str) -> u64 {
        lock(&self.runs).get(id).copied().unwrap_or(0)
    }

    pub(crate) fn total(&self) -> u64 {
        self.total.load(Ordering::SeqCst)
    }

    /// The next runs of `id` answer these statuses, in order; then 200.
    pub(crate) fn answer(&self, id: &str, statuses: &[u16]) {
        lock(&self.answers)
            .entry(id.to_owned())
            .or_default()
            .extend(statuses.iter().map(|s| (*s, false)));
    }

    /// The next run of `id` answers `status`, declared `Record`: the work was done.
    pub(crate) fn answer_declared(&self, id: &str, status: u16) {
        lock(&self.answers)
            .entry(id.to_owned())
            .or_default()
            .push_back((status, true));
    }

    /// Each run waits for a permit of [`gate`](Self::gate) from now on.
    pub(crate) fn hold_at_gate(&self) {
        self.gated.store(true, Ordering::SeqCst);
    }
}

/// The handler: the delivery id through the key extractor, the verified body through `Json`.
pub(crate) async fn receive(
    State(handler): State<Arc<Handler>>,
    key: IdempotencyKey,
    Json(event): Json<Value>,
) -> Response {
    let id = key.as_str().to_owned();
    handler.total.fetch_add(1, Ordering::SeqCst);
    let run = {
        let mut runs = lock(&handler.runs);
        let n = runs.entry(id.clone()).or_default();
        *n += 1;
        *n
    };
    if handler.gated.load(Ordering::SeqCst) {
        let permit = handler.gate.acquire().await.expect("the gate stays open");
        permit.forget();
    }
    let (status, record) = lock(&handler.answers)
        .get_mut(&id)
        .and_then(VecDeque::pop_front)
        .unwrap_or((200, false));
    let status = StatusCode::from_u16(status).expect("a status");
    let mut res = (
        status,
        Json(json!({ "id": id, "run": run, "event": event })),
    )
        .into_response();
    if record {
        declare(&mut res, Verdict::Record);
    }
    res
}

/// The four senders on their paths, with their default settings, over `engine`.
pub(crate) fn router<St: Store + Clone>(engine: Engine<St>, handler: Arc<Handler>) -> Router {
    let stripe = Stripe::new(sign::STRIPE_SECRET).expect("a secret");
    let github = GitHub::new(sign::GITHUB_SECRET).expect("a secret");
    let shopify = Shopify::new(sign::SHOPIFY_SECRET).expect("a secret");
    let standard = StandardWebhooks::new(sign::STANDARD_SECRET).expect("a secret");
    Router::new()
        .route(
            "/webhooks/stripe",
            post(receive).layer(WebhookLayer::new(stripe, engine.clone())),
        )
        .route(
            "/webhooks/github",
            post(receive).layer(WebhookLayer::new(github, engine.clone())),
        )
        .route(
            "/webhooks/shopify",
            post(receive).layer(WebhookLayer::new(shopify, engine.clone())),
        )
        .route(
            "/webhooks/standard",
            post(receive).layer(WebhookLayer::new(standard, engine)),
        )
        .with_state(handler)
}

/// An answer, as a sender sees it.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) replayed: bool,
    pub(crate) retry_after: Option<String>,
    pub(crate) code: Option<String>,
    pub(crate) body: Value,
}

impl Answer {
    /// The handler's run this answer reports.
    pub(crate) fn run(&self) -> u64 {
        self.body["run"].as_u64().unwrap_or(0)
    }
}

/// Sends `delivery` to `server` with `client`, as the sender would: JSON, its headers.
pub(crate) async fn deliver_with(
    client: &reqwest::Client,
    server: &TestServer,
    delivery: &Delivery,
) -> Answer {
    let mut req = client
        .post(server.url(delivery.path))
        .header("content-type", "application/json")
        .body(delivery.body.clone());
    for (name, value) in &delivery.headers {
        req = req.header(*name, value);
    }
    let res = req.send().await.expect("the server answers");
    let status = res.status().as_u16();
    let header = |name: &str| {
        res.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let replayed = header("idempotent-replayed").as_deref() == Some("true");
    let retry_after = header("retry-after");
    let body: Value = res.json().await.unwrap_or(Value::Null);
    let code = body["code"].as_str().map(str::to_owned);
    Answer {
        status,
        replayed,
        retry_after,
        code,
        body,
    }
}

pub(crate) async fn deliver(server: &TestServer, delivery: &Delivery) -> Answer {
    deliver_with(server.client(), server, delivery).await
}
