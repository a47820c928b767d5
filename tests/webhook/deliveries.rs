//! Deliveries over a memory store with the defaults: each sender end to end, forged and stale
//! deliveries, concurrent deliveries of one event, a failing handler and the sender's retry,
//! one payload under two delivery ids, two endpoints of one sender.

use crate::app::{Handler, deliver, deliver_with, router};
use crate::sign::{self, Delivery};
use crate::support::http::{SpyStore, TestServer, bounded, client, eventually};
use axum::Router;
use axum::routing::post;
use std::sync::Arc;
use std::time::Duration;
use tower_idempotency::MemoryStore;
use tower_idempotency::engine::Engine;
use tower_idempotency::webhook::{Stripe, WebhookLayer};

async fn app() -> (TestServer, Arc<Handler>, Engine<Arc<MemoryStore>>) {
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let handler = Handler::new();
    let server = TestServer::start(router(engine.clone(), Arc::clone(&handler))).await;
    (server, handler, engine)
}

/// Each sender's delivery runs the handler with the verified body; its redelivery is answered
/// from the record, marked replayed, and runs nothing.
#[tokio::test]
async fn each_sender_runs_a_delivery_once_and_replays_its_redelivery_with_the_defaults() {
    let (server, handler, _) = app().await;
    let deliveries: [(&str, Delivery); 4] = [
        (
            "evt_1NG8Du2eZvKYlo2CUI79vXWy",
            sign::stripe("evt_1NG8Du2eZvKYlo2CUI79vXWy"),
        ),
        (
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
            sign::github("72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ),
        (
            "a8b1c2d3-shopify-event",
            sign::shopify("a8b1c2d3-shopify-event"),
        ),
        (
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            sign::standard("msg_p5jXN8AQM9LWM0D4loKWxJek"),
        ),
    ];
    for (id, delivery) in &deliveries {
        let first = deliver(&server, delivery).await;
        assert_eq!(first.status, 200, "{id}: {first:?}");
        assert!(!first.replayed, "{id}");
        assert_eq!(first.body["id"], *id, "the key is the sender's delivery id");
        assert_eq!(
            first.body["event"],
            serde_json::from_str::<serde_json::Value>(&delivery.body).unwrap(),
            "{id}: the handler got the verified body through `Json`"
        );
        let again = deliver(&server, delivery).await;
        assert_eq!(again.status, 200, "{id}: {again:?}");
        assert!(again.replayed, "{id}: the redelivery is the record");
        assert_eq!(again.body, first.body, "{id}: the recorded answer");
        assert_eq!(handler.runs(id), 1, "{id} ran once");
    }
    // A redelivery is signed anew: a later timestamp, the same event.
    let later = sign::stripe_at(
        sign::STRIPE_SECRET,
        sign::now() - 60,
        &sign::stripe_body("evt_1NG8Du2eZvKYlo2CUI79vXWy"),
    );
    assert!(deliver(&server, &later).await.replayed);
    assert_eq!(handler.total(), 4);
}

/// Forged, stale and unsigned deliveries are refused with 401 and the error's code, and
/// nothing is stored: the store stays empty, and the genuine delivery of the same id runs.
#[tokio::test]
async fn forged_and_stale_deliveries_are_refused_and_store_nothing() {
    let (server, handler, engine) = app().await;
    let body = sign::stripe_body("evt_forged");
    let mut unsigned = sign::stripe("evt_forged");
    unsigned.headers.clear();
    let refused: Vec<(&str, Delivery, &str)> = vec![
        (
            "stripe forged",
            sign::stripe_at("whsec_not_the_secret", sign::now(), &body),
            "idempotency.signature_mismatch",
        ),
        (
            "stripe stale",
            sign::stripe_at(sign::STRIPE_SECRET, sign::now() - 301 - 5, &body),
            "idempotency.timestamp_outside_tolerance",
        ),
        ("stripe unsigned", unsigned, "idempotency.signature_missing"),
        (
            "github forged",
            sign::github_with("not the secret", "d-forged", r#"{"ref":"x"}"#),
            "idempotency.signature_mismatch",
        ),
        (
            "shopify forged",
            sign::shopify_with("not the secret", "e-forged"),
            "idempotency.signature_mismatch",
        ),
        (
            "standard stale",
            sign::standard_at(sign::STANDARD_SECRET, "msg_forged", sign::now() - 600, "{}"),
            "idempotency.timestamp_outside_tolerance",
        ),
        (
            "standard forged",
            sign::standard_at(
                "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                "msg_forged",
                sign::now(),
                "{}",
            ),
            "idempotency.signature_mismatch",
        ),
    ];
    for (what, delivery, code) in &refused {
        let answer = deliver(&server, delivery).await;
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert_eq!(answer.code.as_deref(), Some(*code), "{what}");
    }
    // A verified delivery without a usable id: 400, nothing stored either.
    let no_id = sign::stripe_at(sign::STRIPE_SECRET, sign::now(), r#"{"object":"event"}"#);
    let answer = deliver(&server, &no_id).await;
    assert_eq!(answer.status, 400, "{answer:?}");
    assert_eq!(answer.code.as_deref(), Some("idempotency.key_missing"));

    assert_eq!(handler.total(), 0, "nothing ran");
    assert_eq!(engine.store().stats().entries, 0, "nothing was stored");
    // The genuine deliveries of the ids the forgeries named run.
    for delivery in [
        sign::stripe("evt_forged"),
        sign::github("d-forged"),
        sign::shopify("e-forged"),
        sign::standard("msg_forged"),
    ] {
        let answer = deliver(&server, &delivery).await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert!(!answer.replayed, "{answer:?}");
        assert_eq!(answer.run(), 1);
    }
    assert_eq!(handler.total(), 4);
}

fn without(mut delivery: Delivery, header: &str) -> Delivery {
    delivery.headers.retain(|(name, _)| *name != header);
    delivery
}

/// A delivery that cannot be verified is refused as unverified, 401, whatever is missing.
/// Standard Webhooks signs its id with the body: without it, or with two, nothing can verify
/// the delivery, genuine or forged. The other senders sign the body alone and verify it first:
/// a forged delivery without an id is a forgery, a genuine one a missing id (400).
#[tokio::test]
async fn a_delivery_that_cannot_be_verified_for_want_of_its_signed_id_is_unverified() {
    let (server, handler, engine) = app().await;
    let mut twice = sign::standard("msg_noid");
    twice.headers.push(("webhook-id", "msg_other".to_owned()));
    let mut svix = sign::standard("msg_noid");
    for (name, _) in &mut svix.headers {
        *name = match *name {
            "webhook-timestamp" => "svix-timestamp",
            "webhook-signature" => "svix-signature",
            other => other,
        };
    }
    let forged = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let refused: Vec<(&str, Delivery, &str)> = vec![
        (
            "standard, genuine, no id",
            without(sign::standard("msg_noid"), "webhook-id"),
            "idempotency.signed_id_missing",
        ),
        (
            "standard, forged, no id",
            without(
                sign::standard_at(forged, "msg_noid", sign::now(), "{}"),
                "webhook-id",
            ),
            "idempotency.signed_id_missing",
        ),
        (
            "standard under Svix's names, no svix-id",
            without(svix, "webhook-id"),
            "idempotency.signed_id_missing",
        ),
        (
            "standard, id twice",
            twice,
            "idempotency.signed_id_malformed",
        ),
        (
            "github, forged, no id",
            without(
                sign::github_with("not the secret", "d-noid", "{}"),
                "x-github-delivery",
            ),
            "idempotency.signature_mismatch",
        ),
        (
            "shopify, forged, no id",
            without(
                sign::shopify_with("not the secret", "e-noid"),
                "x-shopify-event-id",
            ),
            "idempotency.signature_mismatch",
        ),
        (
            "stripe, forged, no id",
            sign::stripe_at("whsec_not_the_secret", sign::now(), r#"{"object":"event"}"#),
            "idempotency.signature_mismatch",
        ),
    ];
    for (what, delivery, code) in &refused {
        let answer = deliver(&server, delivery).await;
        assert_eq!(answer.status, 401, "{what}: {answer:?}");
        assert_eq!(answer.code.as_deref(), Some(*code), "{what}");
    }
    for (what, delivery) in [
        (
            "github",
            without(sign::github("d-noid"), "x-github-delivery"),
        ),
        (
            "shopify",
            without(sign::shopify("e-noid"), "x-shopify-event-id"),
        ),
    ] {
        let answer = deliver(&server, &delivery).await;
        assert_eq!(answer.status, 400, "{what}: {answer:?}");
        assert_eq!(
            answer.code.as_deref(),
            Some("idempotency.key_missing"),
            "{what}"
        );
    }
    assert_eq!(handler.total(), 0, "nothing ran");
    assert_eq!(engine.store().stats().entries, 0, "nothing was stored");
}

/// One event delivered from eight connections at once while its first run is held: it runs
/// once, every other delivery is told to come back later (409 with `Retry-After`) or, once
/// the run ended, gets the recorded 2xx.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_deliveries_of_one_event_run_it_once() {
    let (server, handler, _) = app().await;
    handler.hold_at_gate();
    let delivery = sign::stripe("evt_concurrent");
    let url = server.url("");
    let server = Arc::new(server);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let server = Arc::clone(&server);
            let delivery = delivery.clone();
            // A client each: a connection each.
            tokio::spawn(async move { deliver_with(&client(), &server, &delivery).await })
        })
        .collect();
    // The first run is held; the seven others are answered meanwhile.
    assert!(
        eventually(Duration::from_secs(10), || handler.total() == 1).await,
        "one run started at {url}"
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            tasks.iter().filter(|t| t.is_finished()).count() == 7
        })
        .await,
        "seven deliveries answered while the first runs"
    );
    let (done, mut held): (Vec<_>, Vec<_>) = tasks.into_iter().partition(|t| t.is_finished());
    for task in done {
        let answer = task.await.expect("a delivery");
        assert_eq!(answer.status, 409, "{answer:?}");
        assert_eq!(answer.code.as_deref(), Some("idempotency.in_flight"));
        let wait: u64 = answer.retry_after.as_deref().unwrap().parse().unwrap();
        assert!(
            (1..=20).contains(&wait),
            "{wait}: at most a third of the 60 s lease"
        );
    }
    handler.gate.add_permits(1);
    let first = bounded(Duration::from_secs(10), "the held run", held.pop().unwrap())
        .await
        .expect("a delivery");
    assert_eq!(first.status, 200, "{first:?}");
    assert!(!first.replayed);
    let again = deliver(&server, &delivery).await;
    assert!(again.replayed, "{again:?}");
    assert_eq!(handler.runs("evt_concurrent"), 1, "ran once");
}

/// A handler's 500 releases the event: the sender's retry runs it, and its 2xx is recorded.
/// A handler's 4xx is released the same way: a non-2xx tells the sender to deliver again.
#[tokio::test]
async fn a_failed_run_is_released_and_the_senders_retry_runs_it() {
    let (server, handler, _) = app().await;
    for (id, statuses) in [
        ("evt_500", vec![500, 503]),
        ("evt_4xx", vec![400, 422, 404, 429]),
    ] {
        handler.answer(id, &statuses);
        for (n, status) in statuses.iter().enumerate() {
            let answer = deliver(&server, &sign::stripe(id)).await;
            assert_eq!(answer.status, *status, "{id}: {answer:?}");
            assert!(!answer.replayed);
            assert_eq!(answer.run(), n as u64 + 1, "{id}: the retry ran");
        }
        let ok = deliver(&server, &sign::stripe(id)).await;
        assert_eq!((ok.status, ok.replayed), (200, false), "{id}: {ok:?}");
        let again = deliver(&server, &sign::stripe(id)).await;
        assert!(again.replayed, "{id}: the 2xx is recorded");
        assert_eq!(handler.runs(id), statuses.len() as u64 + 1);
    }
}

/// A handler that did the event's work and answers a 4xx declares it `Record`: the 4xx is
/// recorded and replayed, the handler not run again.
#[tokio::test]
async fn a_4xx_declared_record_is_replayed() {
    let (server, handler, _) = app().await;
    handler.answer_declared("evt_declared", 409);
    let first = deliver(&server, &sign::stripe("evt_declared")).await;
    assert_eq!((first.status, first.replayed), (409, false), "{first:?}");
    let again = deliver(&server, &sign::stripe("evt_declared")).await;
    assert_eq!((again.status, again.replayed), (409, true), "{again:?}");
    assert_eq!(handler.runs("evt_declared"), 1);
}

/// GitHub sends one payload under two delivery ids as two deliveries: both run.
#[tokio::test]
async fn github_one_payload_under_two_delivery_ids_runs_twice() {
    let (server, handler, _) = app().await;
    let body = r#"{"ref":"refs/heads/main","after":"6113728f27ae82c7b1a177c8d03f9e96e0adf246"}"#;
    let one = sign::github_with(sign::GITHUB_SECRET, "delivery-1", body);
    let two = sign::github_with(sign::GITHUB_SECRET, "delivery-2", body);
    assert!(!deliver(&server, &one).await.replayed);
    assert!(!deliver(&server, &two).await.replayed);
    assert!(deliver(&server, &two).await.replayed);
    assert_eq!(handler.total(), 2);
}

/// One sender's event delivered to two endpoints runs at each; the same endpoint name on both
/// shares the ids.
#[tokio::test]
async fn two_endpoints_of_one_sender_keep_their_ids_apart() {
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let handler = Handler::new();
    let stripe = || Stripe::new(sign::STRIPE_SECRET).unwrap();
    let app = Router::new()
        .route(
            "/webhooks/stripe",
            post(crate::app::receive).layer(WebhookLayer::new(stripe(), engine.clone())),
        )
        .route(
            "/webhooks/stripe-connect",
            post(crate::app::receive).layer(WebhookLayer::new(stripe(), engine.clone())),
        )
        .route(
            "/a",
            post(crate::app::receive)
                .layer(WebhookLayer::new(stripe(), engine.clone()).endpoint("billing")),
        )
        .route(
            "/b",
            post(crate::app::receive)
                .layer(WebhookLayer::new(stripe(), engine).endpoint("billing")),
        )
        .with_state(Arc::clone(&handler));
    let server = TestServer::start(app).await;
    let at = |path: &'static str| Delivery {
        path,
        ..sign::stripe("evt_two_endpoints")
    };
    assert!(!deliver(&server, &at("/webhooks/stripe")).await.replayed);
    assert!(
        !deliver(&server, &at("/webhooks/stripe-connect"))
            .await
            .replayed
    );
    assert!(!deliver(&server, &at("/a")).await.replayed);
    assert!(
        deliver(&server, &at("/b")).await.replayed,
        "one endpoint by name"
    );
    assert_eq!(handler.total(), 3);
}

/// A body over the limit is refused with 413 before its signature is checked; nothing stored.
#[tokio::test]
async fn a_body_over_the_limit_is_refused_before_verification() {
    let (server, handler, engine) = app().await;
    let pad = "x".repeat(1024 * 1024);
    let big = sign::stripe_at(
        sign::STRIPE_SECRET,
        sign::now(),
        &format!(r#"{{"id":"evt_big","pad":"{pad}"}}"#),
    );
    let answer = deliver(&server, &big).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    assert_eq!(answer.code.as_deref(), Some("idempotency.body_too_large"));
    assert_eq!(handler.total(), 0);
    assert_eq!(engine.store().stats().entries, 0);
}

/// A store fault never runs an event without a claim, and never loses the handler's answer:
/// a claim that fails is 503 with nothing run; a record that fails still sends the handler's
/// 200, and the event stays pending (409) rather than running again at once. A forged
/// delivery never reaches the store at all.
#[tokio::test]
async fn a_store_fault_runs_no_event_without_a_claim_and_loses_no_answer() {
    let store = SpyStore::new();
    let handler = Handler::new();
    let server = TestServer::start(router(Engine::new(store.clone()), Arc::clone(&handler))).await;

    let forged = sign::stripe_at(
        "whsec_not_the_secret",
        sign::now(),
        &sign::stripe_body("evt_x"),
    );
    assert_eq!(deliver(&server, &forged).await.status, 401);
    assert_eq!(
        store.claims(),
        0,
        "a forged delivery asked the store nothing"
    );

    store.fail_claims(true);
    let refused = deliver(&server, &sign::stripe("evt_store")).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.code.as_deref(), Some("idempotency.store_failed"));
    assert!(refused.retry_after.is_some());
    assert_eq!(handler.total(), 0, "nothing ran without a claim");

    store.fail_claims(false);
    store.fail_completes(true);
    let answered = deliver(&server, &sign::stripe("evt_store")).await;
    assert_eq!((answered.status, answered.run()), (200, 1), "{answered:?}");
    let pending = deliver(&server, &sign::stripe("evt_store")).await;
    assert_eq!(
        pending.status, 409,
        "unrecorded, the event is left to its lease: {pending:?}"
    );
    assert_eq!(handler.runs("evt_store"), 1);
}

/// A captured delivery sent again under another method, to a route that takes any method,
/// is the same event: answered from the record, not run again. A method the HTTP door would
/// pass by (an extension method such as `PROPFIND`, or `GET`) must not let a verified
/// delivery reach the handler without a claim.
#[tokio::test]
async fn a_delivery_sent_again_under_another_method_is_not_run_again() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    let github = tower_idempotency::webhook::GitHub::new(sign::GITHUB_SECRET).unwrap();
    let app = Router::new().route(
        "/webhooks/github",
        axum::routing::any(move |body: String| {
            let counted = Arc::clone(&counted);
            async move {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                format!("run {n}: {} bytes", body.len())
            }
        })
        .layer(WebhookLayer::new(github, engine)),
    );
    let server = TestServer::start(app).await;
    let delivery = sign::github("d-methods");
    let first = deliver(&server, &delivery).await;
    assert_eq!((first.status, first.replayed), (200, false), "{first:?}");
    for method in ["PROPFIND", "GET", "PUT"] {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut req = server
            .client()
            .request(method.clone(), server.url(delivery.path))
            .body(delivery.body.clone());
        for (name, value) in &delivery.headers {
            req = req.header(*name, value);
        }
        let res = req.send().await.expect("the server answers");
        assert_eq!(res.status().as_u16(), 200, "{method}");
        assert_eq!(
            res.headers()
                .get("idempotent-replayed")
                .and_then(|v| v.to_str().ok()),
            Some("true"),
            "{method}: the recorded answer"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the event ran once");
}

/// GitHub signs neither the path nor its delivery id's endpoint: a captured delivery sent
/// again to another path of the same route (a route with a parameter) verifies. Its id is kept
/// by the route's template, so it is found there and replayed, not run again.
#[tokio::test]
async fn a_delivery_sent_again_to_another_path_of_its_route_is_not_run_again() {
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let handler = Handler::new();
    let github = tower_idempotency::webhook::GitHub::new(sign::GITHUB_SECRET).unwrap();
    let app = Router::new()
        .route(
            "/webhooks/github/{hook}",
            post(crate::app::receive).layer(WebhookLayer::new(github, engine)),
        )
        .with_state(Arc::clone(&handler));
    let server = TestServer::start(app).await;
    let at = |path: &'static str| Delivery {
        path,
        ..sign::github("d-paths")
    };
    assert!(
        !deliver(&server, &at("/webhooks/github/main"))
            .await
            .replayed
    );
    let elsewhere = deliver(&server, &at("/webhooks/github/other")).await;
    assert!(elsewhere.replayed, "{elsewhere:?}");
    assert_eq!(handler.runs("d-paths"), 1);
}

/// Counts the crate's events at `INFO` and above.
#[derive(Clone, Default)]
struct Loud(Arc<std::sync::atomic::AtomicU64>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Loud {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() <= tracing::Level::INFO && meta.target().starts_with("tower_idempotency") {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

/// Anyone can send an endpoint unsigned requests: refusing them writes no line per request at
/// the levels a service logs by default (the HTTP door logs its refusals at `DEBUG` too), so a
/// flood of forgeries cannot flood the logs. They are counted as `outcome="unverified"`.
#[tokio::test(flavor = "current_thread")]
async fn forged_deliveries_write_no_log_line_each_at_info() {
    use tracing_subscriber::layer::SubscriberExt;
    let loud = Loud::default();
    let _subscriber =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(loud.clone()));
    let (server, handler, _) = app().await;
    for n in 0..50 {
        let forged = sign::github_with("not the secret", "d-flood", &format!(r#"{{"n":{n}}}"#));
        assert_eq!(deliver(&server, &forged).await.status, 401);
    }
    assert_eq!(handler.total(), 0);
    assert_eq!(
        loud.0.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no line at INFO or above for a refused delivery"
    );
}

/// A handler that panics gives the sender no answer: the event stays pending for the lease
/// (60 s by default), a redelivery meanwhile is 409, and the sender's retry after it runs the
/// event again. Paused clock: the memory store's clock is tokio's.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_handler_that_panics_leaves_its_event_to_the_lease_then_the_retry_runs_it() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use tower::ServiceExt;
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let runs = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&runs);
    let github = tower_idempotency::webhook::GitHub::new(sign::GITHUB_SECRET).unwrap();
    let app: Router = Router::new().route(
        "/webhooks/github",
        post(move || {
            let counted = Arc::clone(&counted);
            async move {
                assert!(
                    counted.fetch_add(1, Ordering::SeqCst) > 0,
                    "the first run panics"
                );
                "ok"
            }
        })
        .layer(WebhookLayer::new(github, engine)),
    );
    let delivery = sign::github("d-panic");
    let request = || {
        let mut req = http::Request::post(delivery.path);
        for (name, value) in &delivery.headers {
            req = req.header(*name, value);
        }
        req.body(axum::body::Body::from(delivery.body.clone()))
            .unwrap()
    };
    let first = tokio::spawn(app.clone().oneshot(request())).await;
    assert!(first.unwrap_err().is_panic(), "the first run panicked");
    let during = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(during.status(), 409, "pending for the lease");
    tokio::time::sleep(Duration::from_secs(59)).await;
    let still = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(still.status(), 409, "still within the lease");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let retry = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(retry.status(), 200, "the lease lapsed: the retry runs");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let again = app.oneshot(request()).await.unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A chunked body, of no declared length, over the limit: refused with 413 while read,
/// before its signature is checked, though the signature is genuine; nothing run or stored.
#[tokio::test]
async fn a_chunked_body_over_the_limit_is_refused_while_read() {
    use tower::ServiceExt;
    let engine = Engine::new(Arc::new(MemoryStore::new()));
    let handler = Handler::new();
    let app = router(engine.clone(), Arc::clone(&handler));
    let pad = "x".repeat(1024 * 1024);
    let big = sign::stripe_at(
        sign::STRIPE_SECRET,
        sign::now(),
        &format!(r#"{{"id":"evt_chunked","pad":"{pad}"}}"#),
    );
    let chunks: Vec<Result<axum::body::Bytes, std::io::Error>> = big
        .body
        .as_bytes()
        .chunks(64 * 1024)
        .map(|c| Ok(axum::body::Bytes::copy_from_slice(c)))
        .collect();
    let mut req = http::Request::post(big.path).header("content-type", "application/json");
    for (name, value) in &big.headers {
        req = req.header(*name, value);
    }
    let body = axum::body::Body::from_stream(tokio_stream::iter(chunks));
    let res = app.oneshot(req.body(body).unwrap()).await.unwrap();
    assert_eq!(res.status(), 413);
    assert_eq!(handler.total(), 0);
    assert_eq!(engine.store().stats().entries, 0);
}
