//! The doors' spans, as a subscriber sees them: at the level the engine is built with, each
//! door's `idempotency` span with its fields, and under it one `idempotency.store` span per
//! store operation. At the default level, nothing at info.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tower::{Layer, ServiceBuilder, ServiceExt, service_fn};
use tower_idempotency::engine::{Engine, KeyError};
use tower_idempotency::http::Principal;
use tower_idempotency::message::{Envelope, Handled, MessageIdempotencyLayer};
use tower_idempotency::outbound::{Delivery, Identity, SendOnceLayer};
use tower_idempotency::{IdempotencyLayer, MemoryStore};
use tracing::Subscriber;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One span as the subscriber saw it: its name, level, fields (as recorded, last value
/// kept), and its parent's id.
#[derive(Debug, Clone)]
struct Seen {
    id: u64,
    name: &'static str,
    level: tracing::Level,
    parent: Option<u64>,
    fields: HashMap<String, String>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Keeps every span it is shown, in the order they open.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Seen>>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Spans {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = HashMap::new();
        attrs.record(&mut Fields(&mut fields));
        let parent = ctx
            .span(id)
            .and_then(|s| s.parent())
            .map(|p| p.id().into_u64());
        self.0.lock().unwrap().push(Seen {
            id: id.into_u64(),
            name: attrs.metadata().name(),
            level: *attrs.metadata().level(),
            parent,
            fields,
        });
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.0.lock().unwrap();
        // Ids are reused once a span closes: the last one opened with this id is the one.
        if let Some(seen) = spans.iter_mut().rev().find(|s| s.id == id.into_u64()) {
            values.record(&mut Fields(&mut seen.fields));
        }
    }
}

impl Spans {
    /// A subscriber that keeps what is enabled at info, as an exporter behind an info filter.
    fn at_info(&self) -> impl Subscriber + Send + Sync {
        tracing_subscriber::registry()
            .with(LevelFilter::INFO)
            .with(self.clone())
    }

    fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// The door's span, the one named `idempotency`, and the store spans under it.
fn door_and_store_ops(spans: &[Seen]) -> (Seen, Vec<Seen>) {
    let doors: Vec<_> = spans.iter().filter(|s| s.name == "idempotency").collect();
    assert_eq!(doors.len(), 1, "one door span per request: {spans:#?}");
    let door = doors[0].clone();
    let ops = spans
        .iter()
        .filter(|s| s.name == "idempotency.store" && s.parent == Some(door.id))
        .cloned()
        .collect();
    (door, ops)
}

fn ops(ops: &[Seen]) -> Vec<&str> {
    ops.iter()
        .map(|s| s.field("idempotency.op").unwrap())
        .collect()
}

fn info_engine() -> Engine<MemoryStore> {
    Engine::builder(MemoryStore::new())
        .span_level(tracing::Level::INFO)
        .build()
}

fn app(engine: Engine<MemoryStore>) -> Router {
    Router::new()
        .route(
            "/orders/{id}",
            post(|| async { (axum::http::StatusCode::CREATED, "made") }),
        )
        .layer(IdempotencyLayer::new(engine))
}

fn order(key: &str) -> axum::http::Request<Body> {
    let mut req = axum::http::Request::post("/orders/17")
        .header("idempotency-key", key)
        .body(Body::from("{}"))
        .unwrap();
    req.extensions_mut().insert(Principal::new("alice"));
    req
}

/// At info, a first run's span carries the door, the outcome, the key's short hash (never the
/// key or the principal), OpenTelemetry's HTTP fields with the route's template, and a store
/// span for the claim and one for the record, each naming the store and the operation.
#[tokio::test(flavor = "current_thread")]
async fn http_spans_at_info_name_the_door_outcome_key_hash_route_and_store_operations() {
    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(spans.at_info());
    let app = app(info_engine());

    let first = app.clone().oneshot(order("order-17-key")).await.unwrap();
    assert_eq!(first.status(), 201);
    let seen = spans.take();
    let (door, store) = door_and_store_ops(&seen);
    assert_eq!(door.level, tracing::Level::INFO);
    assert_eq!(door.field("door"), Some("http"));
    assert_eq!(door.field("outcome"), Some("ran"));
    assert_eq!(door.field("result"), Some("completed"));
    assert_eq!(door.field("http.request.method"), Some("POST"));
    assert_eq!(door.field("http.route"), Some("/orders/{id}"));
    assert_eq!(door.field("http.response.status_code"), Some("201"));
    let key = door.field("key").expect("the key's hash is named");
    assert!(key.starts_with("StoreKey(") && key.len() < 40, "{key}");
    for (name, value) in &door.fields {
        assert!(
            !value.contains("order-17-key") && !value.contains("alice"),
            "{name} = {value} names the key or the principal"
        );
    }
    assert_eq!(ops(&store), ["claim", "complete"], "{seen:#?}");
    for op in &store {
        assert_eq!(op.level, tracing::Level::INFO);
        assert_eq!(op.field("db.system.name"), Some("memory"));
        assert_eq!(op.field("db.operation.name"), op.field("idempotency.op"));
        assert_eq!(op.field("error.type"), None, "the operation succeeded");
    }

    // The repeat: answered from the record, with the same key's hash, after one claim.
    let again = app.oneshot(order("order-17-key")).await.unwrap();
    assert_eq!(again.status(), 201);
    let seen = spans.take();
    let (replay, store) = door_and_store_ops(&seen);
    assert_eq!(replay.field("outcome"), Some("replayed"));
    assert_eq!(replay.field("key"), Some(key));
    assert_eq!(replay.field("http.response.status_code"), Some("201"));
    assert_eq!(ops(&store), ["claim"]);
}

/// The default level is debug, as it was before the level could be chosen: a pipeline that
/// keeps info sees no new span.
#[tokio::test(flavor = "current_thread")]
async fn at_the_default_level_no_span_appears_at_info() {
    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(spans.at_info());
    let engine = Engine::new(MemoryStore::new());
    assert_eq!(engine.span_level(), tracing::Level::DEBUG);

    let res = app(engine.clone()).oneshot(order("k-1")).await.unwrap();
    assert_eq!(res.status(), 201);
    let handled = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(engine.clone(), "billing"))
        .service(service_fn(|_m: Envelope| async {
            Ok::<_, String>(String::from("one"))
        }))
        .oneshot(Envelope::new("orders.paid", "order 17"))
        .await
        .unwrap();
    assert!(
        matches!(handled, Handled::Recorded(ref r) if r == "one"),
        "{handled:?}"
    );
    let sent = send_once(engine).oneshot(500).await.unwrap();
    assert!(matches!(sent, Delivery::Recorded(_)), "{sent:?}");

    let seen = spans.take();
    assert!(
        seen.iter().all(|s| !s.name.starts_with("idempotency")),
        "{seen:#?}"
    );
}

/// A message's span at info: the door, the outcome of each delivery, and its store spans.
#[tokio::test(flavor = "current_thread")]
async fn message_spans_at_info_name_the_door_outcome_and_store_operations() {
    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(spans.at_info());
    let handler = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(info_engine(), "billing"))
        .service(service_fn(|_m: Envelope| async {
            Ok::<_, String>(String::from("seven"))
        }));
    let msg = Envelope::new("orders.paid", "order 17");

    let first = handler.clone().oneshot(msg.clone()).await.unwrap();
    assert!(
        matches!(first, Handled::Recorded(ref r) if r == "seven"),
        "{first:?}"
    );
    let seen = spans.take();
    let (door, store) = door_and_store_ops(&seen);
    assert_eq!(door.level, tracing::Level::INFO);
    assert_eq!(door.field("door"), Some("message"));
    assert_eq!(door.field("outcome"), Some("ran"));
    assert_eq!(door.field("result"), Some("completed"));
    let key = door
        .field("key")
        .expect("the key's hash is named")
        .to_owned();
    assert!(key.starts_with("StoreKey("), "{key}");
    assert_eq!(ops(&store), ["claim", "complete"], "{seen:#?}");

    let again = handler.oneshot(msg).await.unwrap();
    assert!(matches!(again, Handled::Replayed(_)), "{again:?}");
    let seen = spans.take();
    let (door, store) = door_and_store_ops(&seen);
    assert_eq!(door.field("outcome"), Some("replayed"));
    assert_eq!(door.field("key"), Some(key.as_str()));
    assert_eq!(ops(&store), ["claim"]);
}

fn send_once(
    engine: Engine<MemoryStore>,
) -> impl tower::Service<u64, Response = Delivery<String, std::io::Error>, Error = impl std::fmt::Debug>
+ Clone {
    let identify = |a: &u64| -> Result<Option<Identity>, KeyError> {
        Identity::of("charge:1", [a.to_string().as_bytes()]).map(Some)
    };
    SendOnceLayer::new(engine, identify).layer(service_fn(|amount: u64| async move {
        Ok::<_, std::io::Error>(format!("ch_{amount}"))
    }))
}

/// A send's span at info: the door, the outcome, and its store spans.
#[tokio::test(flavor = "current_thread")]
async fn outbound_spans_at_info_name_the_door_outcome_and_store_operations() {
    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(spans.at_info());
    let door = send_once(info_engine());

    let first = door.clone().oneshot(500).await.unwrap();
    assert!(
        matches!(first, Delivery::Recorded(ref r) if r == "ch_500"),
        "{first:?}"
    );
    let seen = spans.take();
    let (span, store) = door_and_store_ops(&seen);
    assert_eq!(span.level, tracing::Level::INFO);
    assert_eq!(span.field("door"), Some("outbound"));
    assert_eq!(span.field("outcome"), Some("ran"));
    assert_eq!(span.field("result"), Some("completed"));
    assert!(
        span.field("key")
            .is_some_and(|k| k.starts_with("StoreKey("))
    );
    assert_eq!(ops(&store), ["claim", "complete"], "{seen:#?}");

    let again = door.oneshot(500).await.unwrap();
    assert!(
        matches!(again, Delivery::Replayed(ref r) if r == "ch_500"),
        "{again:?}"
    );
    let seen = spans.take();
    let (span, store) = door_and_store_ops(&seen);
    assert_eq!(span.field("outcome"), Some("replayed"));
    assert_eq!(ops(&store), ["claim"]);
}

/// A request the doors only count (no key or one that does not parse, so no claim and no span
/// of their own) leaves the caller's span as it was: the door's `outcome` is never written into a span of the
/// application's that happens to have a field of that name.
#[tokio::test(flavor = "current_thread")]
async fn an_unkeyed_request_writes_nothing_into_the_callers_span() {
    use tracing::Instrument;
    let spans = Spans::default();
    let _subscriber = tracing::subscriber::set_default(spans.at_info());
    let caller = || {
        tracing::info_span!(
            "caller",
            outcome = tracing::field::Empty,
            result = tracing::field::Empty
        )
    };

    let mut req = axum::http::Request::post("/orders/17")
        .body(Body::from("{}"))
        .unwrap();
    req.extensions_mut().insert(Principal::new("alice"));
    let res = app(info_engine())
        .oneshot(req)
        .instrument(caller())
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        400,
        "a POST without a key is refused by default"
    );

    let handled = ServiceBuilder::new()
        .layer(MessageIdempotencyLayer::new(info_engine(), "billing"))
        .service(service_fn(|_m: Envelope| async {
            Ok::<_, String>(String::from("one"))
        }))
        // A key that does not parse: refused before any claim.
        .oneshot(Envelope::new("orders.paid", "order 17").with_header("idempotency-key", "\u{1}"))
        .instrument(caller())
        .await;
    assert!(handled.is_err(), "{handled:?}");

    let identify = |_: &u64| -> Result<Option<Identity>, KeyError> { Ok(None) };
    let sent = SendOnceLayer::new(info_engine(), identify)
        .layer(service_fn(|amount: u64| async move {
            Ok::<_, std::io::Error>(format!("ch_{amount}"))
        }))
        .oneshot(500)
        .instrument(caller())
        .await
        .unwrap();
    assert!(matches!(sent, Delivery::Untracked(_)), "{sent:?}");

    let seen = spans.take();
    let callers: Vec<_> = seen.iter().filter(|s| s.name == "caller").collect();
    assert_eq!(callers.len(), 3, "{seen:#?}");
    for c in callers {
        assert_eq!(
            c.field("outcome"),
            None,
            "the door wrote into the caller's span: {c:#?}"
        );
        assert_eq!(c.field("result"), None, "{c:#?}");
    }
    assert!(
        seen.iter().all(|s| s.name != "idempotency"),
        "an unkeyed request opens no door span: {seen:#?}"
    );
}
